//! Contract tests of the Keystone/Nova/Neutron/Glance client against OpenStack's published API
//! samples (`tests/fixtures/openstack/`, Apache-2.0, copied verbatim from upstream).
//!
//! An axum server on 127.0.0.1:0 plays Keystone, Nova, Neutron and Glance: it answers with the
//! upstream bodies (the catalog rewritten to point at itself, expiry moved into the future) and
//! records every request, so each test checks both directions: the client parses real answers,
//! and the requests it builds have the shape (method, path, headers, JSON body) of the upstream
//! request samples. Timing-dependent cases use short real timeouts, always bounded.

mod config;
mod keystone;
mod nova;

use crate::support::upstream;

use std::collections::BTreeSet;
use std::error::Error as _;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Router;
use base64::Engine as _;
use gpgpums::{HostId, VmId};
use gsaasd::cloud::nova::{vm_tag, NovaCloud, NovaConfig, VM_ID_METADATA};
use gsaasd::cloud::{
    Checked, Cloud, CloudError, HostConstraint, ServerId, ServerSpec, ServerStatus, TenantToken,
    VmRequest,
};
use gsaasd::openstack::keystone::{AdminScope, ValidatorSettings};
use gsaasd::openstack::time::format_rfc3339;
use gsaasd::openstack::{
    AuthSettings, HttpOptions, Keystone, OpenStackConfigError, TokenValidator, ValidationError,
};
use serde_json::{json, Value};
use tokio::net::TcpListener;
use upstream::{fixture, fixture_json, token_body};

const PROJECT: &str = "a6944d763bf64ee6a275f1263fae0352";
/// A tenant's project, other than the service user's.
const TENANT_PROJECT: &str = "7e9a0000000000000000000000000001";
const NOVA: &str = "/nova/v2.1/a6944d763bf64ee6a275f1263fae0352";
const IMAGE_ID: &str = "70a599e0-31e7-49b7-b260-868f441e862b";
const SERVER_ID: &str = "0e12087a-7c87-476a-8f84-7398e991cecc";
const NETWORK_ID: &str = "3cb9bc59-5699-4588-a4b1-b87f96708bc6";
const BOUND: Duration = Duration::from_secs(10);

#[derive(Debug, Clone)]
struct Req {
    method: Method,
    /// Path and query.
    path: String,
    headers: HeaderMap,
    body: Vec<u8>,
}

impl Req {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap()
    }

    fn is(&self, method: &Method, path: &str) -> bool {
        self.method == method && self.path == path
    }
}

#[derive(Debug)]
struct Reply {
    status: u16,
    headers: Vec<(&'static str, String)>,
    body: String,
    delay: Option<Duration>,
}

fn reply(status: u16, body: impl Into<String>) -> Reply {
    Reply { status, headers: vec![], body: body.into(), delay: None }
}

fn nova_error(status: u16, key: &str, message: &str) -> Reply {
    reply(status, json!({ key: { "code": status, "message": message } }).to_string())
}

type Handler = dyn Fn(&Req, &str) -> Reply + Send + Sync;

#[derive(Clone)]
struct MockState {
    handler: Arc<Handler>,
    log: Arc<Mutex<Vec<Req>>>,
    base: String,
}

/// A fake OpenStack on 127.0.0.1:0 that records what it is asked.
struct Mock {
    base: String,
    log: Arc<Mutex<Vec<Req>>>,
}

async fn serve(
    State(state): State<MockState>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let path = uri.path_and_query().map(|p| p.to_string()).unwrap_or_default();
    let req = Req { method, path, headers, body: body.to_vec() };
    state.log.lock().unwrap().push(req.clone());
    let reply = (state.handler)(&req, &state.base);
    if let Some(delay) = reply.delay {
        tokio::time::sleep(delay).await;
    }
    let mut headers = HeaderMap::new();
    headers.insert("content-type", HeaderValue::from_static("application/json"));
    for (name, value) in reply.headers {
        headers.insert(HeaderName::from_static(name), HeaderValue::from_str(&value).unwrap());
    }
    (StatusCode::from_u16(reply.status).unwrap(), headers, reply.body).into_response()
}

impl Mock {
    async fn start(handler: impl Fn(&Req, &str) -> Reply + Send + Sync + 'static) -> Mock {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let log = Arc::new(Mutex::new(Vec::new()));
        let state = MockState { handler: Arc::new(handler), log: log.clone(), base: base.clone() };
        let app = Router::new().fallback(serve).with_state(state);
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Mock { base, log }
    }

    fn requests(&self) -> Vec<Req> {
        self.log.lock().unwrap().clone()
    }

    fn count(&self, method: &Method, path_prefix: &str) -> usize {
        self.requests()
            .iter()
            .filter(|r| r.method == method && r.path.starts_with(path_prefix))
            .count()
    }

    fn auths(&self) -> usize {
        self.count(&Method::POST, "/identity/v3/auth/tokens")
    }
}

fn auth_reply(base: &str, token: &str, expires: SystemTime) -> Reply {
    let mut reply = reply(201, token_body(base, expires).to_string());
    reply.headers.push(("x-subject-token", token.to_owned()));
    reply
}

fn in_an_hour() -> SystemTime {
    SystemTime::now() + Duration::from_secs(3600)
}

/// The upstream admin view of a server (2.73), as `status`, with our VM id in its metadata.
fn server_body(vm: VmId, status: &str, host: Option<&str>, fault: Option<&str>) -> Value {
    let mut body = fixture_json("nova/servers_v2.73_server-get-resp.json");
    let server = &mut body["server"];
    server["status"] = json!(status);
    server["metadata"][VM_ID_METADATA] = json!(vm.to_string());
    server["OS-EXT-SRV-ATTR:host"] = json!(host);
    if let Some(message) = fault {
        server["fault"] =
            json!({ "code": 500, "created": "2019-04-23T15:19:11Z", "message": message });
    }
    body
}

/// Answers for a healthy cloud: auth, flavor 1, the sample image, no server for any VM yet, the
/// upstream ports (rewritten to belong to the asked-for device).
fn standard(req: &Req, base: &str) -> Reply {
    let get = Method::GET;
    if req.is(&Method::POST, "/identity/v3/auth/tokens") {
        return auth_reply(base, "service-token", in_an_hour());
    }
    if req.is(&get, &format!("{NOVA}/flavors/1")) {
        return reply(200, fixture("nova/flavors_flavor-get-resp.json"));
    }
    if req.is(&get, &format!("/glance/v2/images/{IMAGE_ID}")) {
        return reply(
            200,
            json!({ "id": IMAGE_ID, "name": "cirros", "status": "active" }).to_string(),
        );
    }
    if req.method == get && req.path.starts_with(&format!("{NOVA}/servers/detail?")) {
        return reply(200, r#"{"servers": []}"#);
    }
    if req.method == get && req.path.starts_with("/neutron/v2.0/ports?device_id=") {
        let device = req.path.rsplit('=').next().unwrap();
        let mut ports = fixture_json("neutron/ports_ports-list-response.json");
        for port in ports["ports"].as_array_mut().unwrap() {
            port["device_id"] = json!(device);
        }
        return reply(200, ports.to_string());
    }
    nova_error(404, "itemNotFound", &format!("no route for {} {}", req.method, req.path))
}

fn settings(base: &str) -> AuthSettings {
    let mut settings = AuthSettings {
        auth_url: format!("{base}/identity/v3"),
        user_id: Some("ee4dfb6e5540447cb3741905149d9b6e".into()),
        password: "devstacker".into(),
        project_name: Some("admin".into()),
        project_domain_id: Some("default".into()),
        region_name: Some("RegionOne".into()),
        ..AuthSettings::default()
    };
    settings.check().unwrap();
    settings
}

fn config() -> NovaConfig {
    // Each test counts the requests it causes: no check is answered from an earlier one.
    NovaConfig {
        poll_interval_ms: 10,
        request_timeout_ms: 2_000,
        lookup_cache_secs: 0,
        ..NovaConfig::default()
    }
}

fn nova(mock: &Mock) -> NovaCloud {
    NovaCloud::new(settings(&mock.base), config()).unwrap()
}

fn request() -> VmRequest {
    VmRequest {
        name: "new-server-test".into(),
        image: IMAGE_ID.into(),
        flavor: "1".into(),
        networks: vec![],
    }
}

fn spec(vm: VmId, host: HostConstraint) -> ServerSpec {
    ServerSpec {
        vm,
        request: request(),
        user_data: b"#cloud-config\nwrite_files: []\n".to_vec(),
        host,
        tenant: None,
        checked: None,
        first_attempt: false,
    }
}

fn pinned(name: &str) -> HostConstraint {
    HostConstraint::Pinned(HostId::new(name).unwrap())
}

fn assert_compute_headers(req: &Req, token: &str) {
    assert_eq!(req.header("x-auth-token"), Some(token), "{} {}", req.method, req.path);
    if req.path.starts_with("/nova/") {
        assert_eq!(
            req.header("openstack-api-version"),
            Some("compute 2.74"),
            "{} {}",
            req.method,
            req.path
        );
    }
}
