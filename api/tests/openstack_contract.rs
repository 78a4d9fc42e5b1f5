//! Contract tests of the Keystone/Nova/Neutron/Glance client against OpenStack's published API
//! samples (`tests/fixtures/openstack/`, Apache-2.0, copied verbatim from upstream).
//!
//! An axum server on 127.0.0.1:0 plays Keystone, Nova, Neutron and Glance: it answers with the
//! upstream bodies (the catalog rewritten to point at itself, expiry moved into the future) and
//! records every request, so each test checks both directions: the client parses real answers,
//! and the requests it builds have the shape (method, path, headers, JSON body) of the upstream
//! request samples. Timing-dependent cases use short real timeouts, always bounded.

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
use gsaasd::auth::Role;
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
    NovaConfig { poll_interval_ms: 10, request_timeout_ms: 2_000, ..NovaConfig::default() }
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

#[tokio::test]
async fn auth_request_catalog_and_token_reuse() {
    let mock = Mock::start(standard).await;
    let cloud = nova(&mock);
    cloud.check(&request(), None).await.unwrap();
    cloud.check(&request(), None).await.unwrap();
    assert_eq!(mock.auths(), 1, "the token is reused");
    let requests = mock.requests();
    let auth = &requests[0];
    assert_eq!(auth.json(), fixture_json("keystone/auth_requests_project-name-password.json"));
    assert_eq!(auth.header("x-auth-token"), None);
    // The compute endpoint is the catalog's public `compute` (v2.1), not `compute_legacy`.
    let calls: Vec<_> = requests[1..].iter().map(|r| format!("{} {}", r.method, r.path)).collect();
    let flavor = format!("GET {NOVA}/flavors/1");
    let image = format!("GET /glance/v2/images/{IMAGE_ID}");
    assert_eq!(calls, [flavor.clone(), image.clone(), flavor, image]);
    for req in &requests[1..] {
        assert_compute_headers(req, "service-token");
    }
}

#[tokio::test]
async fn a_401_drops_the_token_and_retries_once_with_a_new_one() {
    let auths = Arc::new(AtomicUsize::new(0));
    let reject = Arc::new(AtomicBool::new(false));
    let (a, r) = (auths.clone(), reject.clone());
    let mock = Mock::start(move |req, base| {
        if req.is(&Method::POST, "/identity/v3/auth/tokens") {
            let n = a.fetch_add(1, Ordering::SeqCst) + 1;
            return auth_reply(base, &format!("tok-{n}"), in_an_hour());
        }
        if req.path.starts_with("/nova/") && r.swap(false, Ordering::SeqCst) {
            return nova_error(401, "error", "The request you have made requires authentication.");
        }
        standard(req, base)
    })
    .await;
    let cloud = nova(&mock);
    cloud.check(&request(), None).await.unwrap();
    reject.store(true, Ordering::SeqCst);
    cloud.check(&request(), None).await.unwrap();
    assert_eq!(auths.load(Ordering::SeqCst), 2);
    let flavor_gets: Vec<_> = mock
        .requests()
        .into_iter()
        .filter(|r| r.path.ends_with("/flavors/1"))
        .map(|r| r.header("x-auth-token").unwrap().to_owned())
        .collect();
    assert_eq!(flavor_gets, ["tok-1", "tok-1", "tok-2"]);

    // A service that refuses even a fresh token is unavailable, not an endless loop.
    let mock = Mock::start(|req, base| {
        if req.path.starts_with("/nova/") {
            return nova_error(401, "error", "The request you have made requires authentication.");
        }
        standard(req, base)
    })
    .await;
    let err = nova(&mock).check(&request(), None).await.unwrap_err();
    assert!(matches!(err, CloudError::Unavailable { .. }), "{err:?}");
    assert_eq!(mock.auths(), 2);
}

#[tokio::test]
async fn a_token_close_to_its_expiry_is_renewed() {
    let mock = Mock::start(|req, base| {
        if req.is(&Method::POST, "/identity/v3/auth/tokens") {
            // Inside the default 120 s margin: never reused.
            return auth_reply(base, "short", SystemTime::now() + Duration::from_secs(30));
        }
        standard(req, base)
    })
    .await;
    let cloud = nova(&mock);
    cloud.check(&request(), None).await.unwrap();
    assert_eq!(mock.auths(), 2, "one per call");
}

#[tokio::test]
async fn check_finds_flavors_by_name_and_refuses_unknown_parts() {
    let mock = Mock::start(|req, base| {
        let get = Method::GET;
        if req.is(&get, &format!("{NOVA}/flavors/m1.tiny"))
            || req.is(&get, &format!("{NOVA}/flavors/m1.huge"))
        {
            return nova_error(404, "itemNotFound", "Flavor m1.tiny could not be found.");
        }
        if req.is(&get, &format!("{NOVA}/flavors/detail")) {
            let flavor = fixture_json("nova/flavors_flavor-get-resp.json")["flavor"].clone();
            return reply(200, json!({ "flavors": [flavor] }).to_string());
        }
        if req.is(&get, "/glance/v2/images?name=cirros") {
            let image = json!({ "id": IMAGE_ID, "name": "cirros", "status": "active" });
            return reply(200, json!({ "images": [image.clone(), image] }).to_string());
        }
        if req.is(&get, "/glance/v2/images?name=queued") {
            let image = json!({ "id": IMAGE_ID, "name": "queued", "status": "queued" });
            return reply(200, json!({ "images": [image] }).to_string());
        }
        if req.is(&get, "/neutron/v2.0/networks?name=private") {
            let net = json!({ "id": NETWORK_ID, "name": "private" });
            return reply(200, json!({ "networks": [net] }).to_string());
        }
        if req.is(&get, "/neutron/v2.0/networks?name=nowhere") {
            return reply(200, r#"{"networks": []}"#);
        }
        standard(req, base)
    })
    .await;
    let cloud = nova(&mock);
    let mut by_name = request();
    by_name.flavor = "m1.tiny".into();
    by_name.networks = vec!["private".into()];
    let checked = cloud.check(&by_name, None).await.unwrap();
    let flavor = fixture_json("nova/flavors_flavor-get-resp.json")["flavor"]["id"].clone();
    assert_eq!(json!(checked.flavor), flavor, "the flavor's id, found by its name");
    let shape = Some(gpgpums::Resources::new(1000, 512));
    assert_eq!(checked.flavor_resources, shape, "the fixture's 1 vCPU and 512 MiB");
    assert_eq!(checked.image, IMAGE_ID);
    assert_eq!(checked.networks, json!([{ "uuid": NETWORK_ID }]));

    let field = |r: Result<Checked, CloudError>| match r {
        Err(CloudError::Invalid { field, .. }) => field,
        other => panic!("expected Invalid, got {other:?}"),
    };
    let mut bad = request();
    bad.flavor = "m1.huge".into();
    assert_eq!(field(cloud.check(&bad, None).await), "flavor");
    let mut bad = request();
    bad.image = "cirros".into();
    assert_eq!(field(cloud.check(&bad, None).await), "image", "two images of that name");
    bad.image = "queued".into();
    assert_eq!(field(cloud.check(&bad, None).await), "image", "not active");
    bad.image = "0e12087a-0000-476a-8f84-7398e991cecc".into();
    assert_eq!(field(cloud.check(&bad, None).await), "image", "no such id");
    let mut bad = request();
    bad.networks = vec!["nowhere".into()];
    assert_eq!(field(cloud.check(&bad, None).await), "networks");
    // Images are checked in Glance: the compute images API is gone from 2.36 on.
    assert_eq!(mock.count(&Method::GET, &format!("{NOVA}/images")), 0);
}

/// A cloud whose Nova creates servers, answering with the upstream sample.
async fn nova_that_creates() -> Mock {
    Mock::start(|req, base| {
        if req.is(&Method::POST, &format!("{NOVA}/servers")) {
            return reply(202, fixture("nova/servers_v2.74_server-create-resp.json"));
        }
        standard(req, base)
    })
    .await
}

#[tokio::test]
async fn create_sends_the_upstream_request_shape() {
    let mock = nova_that_creates().await;
    let cloud = nova(&mock);
    let vm = VmId::new_random();
    let spec = spec(vm, pinned("openstack-node-01"));
    let id = cloud.create_server(&spec).await.unwrap();
    assert_eq!(id, ServerId("84e2b49d-39a9-4d32-9100-e62161c236db".into()));

    let requests = mock.requests();
    let find = requests.iter().find(|r| r.path.contains("/servers/detail")).unwrap();
    // As the service user, across every project.
    assert_eq!(find.path, format!("{NOVA}/servers/detail?all_tenants=1&tags={}", vm_tag(vm)));
    let post =
        requests.iter().find(|r| r.method == Method::POST && r.path.ends_with("/servers")).unwrap();
    assert_compute_headers(post, "service-token");
    assert_eq!(post.header("content-type"), Some("application/json"));
    let body = post.json();
    let ours = body["server"].as_object().unwrap();
    let sample = fixture_json("nova/servers_v2.74_server-create-req-with-only-host.json");
    let sample = sample["server"].as_object().unwrap();
    // Every field we send is one the upstream sample sends (tags: 2.52+), with the same JSON type.
    for (key, value) in ours {
        if key == "tags" {
            assert_eq!(value, &json!([vm_tag(vm)]));
            continue;
        }
        let theirs = sample.get(key).unwrap_or_else(|| panic!("{key} is not in the sample"));
        assert_eq!(
            std::mem::discriminant(value),
            std::mem::discriminant(theirs),
            "{key}: {value} vs {theirs}"
        );
    }
    assert_eq!(ours["name"], "new-server-test");
    assert_eq!(ours["imageRef"], sample["imageRef"]);
    assert_eq!(ours["flavorRef"], "1");
    assert_eq!(ours["host"], sample["host"]);
    assert_eq!(ours["networks"], "auto");
    assert_eq!(ours["metadata"], json!({ VM_ID_METADATA: vm.to_string() }));
    let user_data = base64::engine::general_purpose::STANDARD
        .decode(ours["user_data"].as_str().unwrap())
        .unwrap();
    assert_eq!(user_data, spec.user_data);
}

/// A launch's first creation follows its check at once: no search for an earlier server, no
/// second lookup of the flavor, image and networks; the one POST carries the check's ids.
#[tokio::test]
async fn a_launchs_first_creation_is_one_post_with_the_checks_ids() {
    let mock = nova_that_creates().await;
    let cloud = nova(&mock);
    let checked = Checked {
        flavor: "flavor-id-from-the-check".into(),
        image: IMAGE_ID.into(),
        networks: json!([{ "uuid": NETWORK_ID }]),
        flavor_resources: None,
    };
    let first = ServerSpec {
        checked: Some(checked.clone()),
        ..spec(VmId::new_random(), pinned("openstack-node-01"))
    };
    cloud.create_server(&first).await.unwrap();
    let sent: Vec<(Method, String)> = mock
        .requests()
        .into_iter()
        .filter(|r| !r.path.starts_with("/identity"))
        .map(|r| (r.method, r.path))
        .collect();
    assert_eq!(sent, vec![(Method::POST, format!("{NOVA}/servers"))], "only the creation");
    let post = &mock
        .requests()
        .into_iter()
        .find(|r| r.method == Method::POST && r.path.ends_with("/servers"))
        .unwrap();
    let server = post.json()["server"].clone();
    assert_eq!(server["flavorRef"], "flavor-id-from-the-check");
    assert_eq!(server["imageRef"], IMAGE_ID);
    assert_eq!(server["networks"], json!([{ "uuid": NETWORK_ID }]));

    // A retry (no `checked`) looks for the server a lost answer may have created.
    cloud.create_server(&spec(VmId::new_random(), pinned("openstack-node-01"))).await.unwrap();
    assert!(mock.requests().iter().any(|r| r.path.contains("/servers/detail?")));
}

/// Created for a tenant, the server is the tenant's: every request of the creation carries the
/// tenant's token (in the tenant's project's endpoint), none names a host, and the VM's server is
/// looked for among the tenant's servers only.
#[tokio::test]
async fn a_tenants_server_is_created_with_the_tenants_token_in_zones() {
    let mock = Mock::start(|req, base| {
        if req.is(&Method::POST, &format!("/nova/v2.1/{TENANT_PROJECT}/servers")) {
            return reply(202, fixture("nova/servers_v2.74_server-create-resp.json"));
        }
        if req.path.starts_with(&format!("/nova/v2.1/{TENANT_PROJECT}/")) {
            let req = Req { path: req.path.replace(TENANT_PROJECT, PROJECT), ..req.clone() };
            return standard(&req, base);
        }
        standard(req, base)
    })
    .await;
    let zoned = NovaConfig {
        availability_zone: Some("gsaas-rgpu".into()),
        local_availability_zone: Some("gsaas-{host}".into()),
        ..config()
    };
    let cloud = NovaCloud::new(settings(&mock.base), zoned).unwrap();
    let tenant = TenantToken {
        token: "tenant-token".into(),
        user_id: "tenant-user".into(),
        project_id: TENANT_PROJECT.into(),
    };
    let as_tenant =
        |host| ServerSpec { tenant: Some(tenant.clone()), ..spec(VmId::new_random(), host) };
    let hosts = vec![HostId::new("compute0-rgpu").unwrap()];
    for (host, zone) in [
        (pinned("gpu-host-1"), "gsaas-gpu-host-1"),
        (HostConstraint::AnyOf(hosts.clone().into()), "gsaas-rgpu"),
    ] {
        cloud.create_server(&as_tenant(host)).await.unwrap();
        let requests = mock.requests();
        let post = requests
            .iter()
            .rev()
            .find(|r| r.method == Method::POST && r.path.ends_with("/servers"))
            .unwrap();
        assert_eq!(post.path, format!("/nova/v2.1/{TENANT_PROJECT}/servers"));
        assert_compute_headers(post, "tenant-token");
        let body = post.json();
        assert_eq!(body["server"]["availability_zone"], zone, "{body}");
        assert!(body["server"].get("host").is_none(), "a tenant named a host: {body}");
    }
    let requests = mock.requests();
    for r in requests.iter().filter(|r| {
        r.path.contains("/servers") || r.path.contains("/images") || r.path.contains("/flavors")
    }) {
        assert_eq!(r.header("x-auth-token"), Some("tenant-token"), "{} {}", r.method, r.path);
        assert!(!r.path.contains("all_tenants"), "{}", r.path);
    }
    // Without the zones, a tenant's local or remote VM has nowhere to go.
    let plain = NovaCloud::new(settings(&mock.base), config()).unwrap();
    let err = plain.create_server(&as_tenant(pinned("gpu-host-1"))).await.unwrap_err();
    assert!(matches!(&err, CloudError::Invalid { field: "locality", .. }), "{err:?}");
}

#[tokio::test]
async fn remote_servers_go_to_the_configured_zone_or_one_listed_host() {
    let mock = nova_that_creates().await;
    let hosts: Vec<HostId> =
        ["compute0-rgpu", "compute1-rgpu"].iter().map(|h| HostId::new(*h).unwrap()).collect();
    let zoned = NovaConfig { availability_zone: Some("rgpu".into()), ..config() };
    let cloud = NovaCloud::new(settings(&mock.base), zoned).unwrap();
    cloud
        .create_server(&spec(VmId::new_random(), HostConstraint::AnyOf(hosts.clone().into())))
        .await
        .unwrap();
    let plain = NovaCloud::new(settings(&mock.base), config()).unwrap();
    let vm = VmId::new_random();
    plain.create_server(&spec(vm, HostConstraint::AnyOf(hosts.clone().into()))).await.unwrap();
    plain.create_server(&spec(vm, HostConstraint::AnyOf(hosts.clone().into()))).await.unwrap();
    let posts: Vec<Value> = mock
        .requests()
        .iter()
        .filter(|r| r.method == Method::POST && r.path.ends_with("/servers"))
        .map(|r| r.json()["server"].clone())
        .collect();
    assert_eq!(posts[0]["availability_zone"], "rgpu");
    assert!(posts[0].get("host").is_none());
    let host = posts[1]["host"].as_str().unwrap();
    assert!(hosts.iter().any(|h| h.as_str() == host), "{host}");
    assert_eq!(posts[2]["host"], posts[1]["host"], "the same VM gets the same host on a retry");
    let err =
        plain.create_server(&spec(vm, HostConstraint::AnyOf(Vec::new().into()))).await.unwrap_err();
    assert!(matches!(err, CloudError::Invalid { field: "host", .. }), "{err:?}");
}

#[tokio::test]
async fn create_finds_the_server_of_a_vm_instead_of_creating_another() {
    let vm = VmId::new_random();
    let other = VmId::new_random();
    let mock = Mock::start(move |req, base| {
        if req.method == Method::GET && req.path.contains("/servers/detail?") {
            // Nova's tag filter matched; the metadata decides (a foreign server is skipped).
            let foreign = server_body(other, "ACTIVE", Some("compute"), None)["server"].clone();
            let mut ours = server_body(vm, "BUILD", None, None)["server"].clone();
            ours["id"] = json!("ours-1");
            return reply(200, json!({ "servers": [foreign, ours] }).to_string());
        }
        standard(req, base)
    })
    .await;
    let cloud = nova(&mock);
    assert_eq!(cloud.find_server(vm).await.unwrap(), Some(ServerId("ours-1".into())));
    let id = cloud.create_server(&spec(vm, pinned("compute"))).await.unwrap();
    assert_eq!(id, ServerId("ours-1".into()));
    assert_eq!(mock.count(&Method::POST, NOVA), 0, "no second server");
    assert_eq!(cloud.find_server(VmId::new_random()).await.unwrap(), None);
}

/// Nova answers GET /servers/{id} with each body of `states` in turn, then the last forever.
fn sequence(states: Vec<Value>) -> impl Fn(&Req, &str) -> Reply + Send + Sync + 'static {
    let next = AtomicUsize::new(0);
    move |req, base| {
        if req.is(&Method::GET, &format!("{NOVA}/servers/{SERVER_ID}")) {
            let i = next.fetch_add(1, Ordering::SeqCst).min(states.len() - 1);
            return reply(200, states[i].to_string());
        }
        standard(req, base)
    }
}

#[tokio::test]
async fn wait_active_follows_build_to_active_with_host_ip_and_tap() {
    let vm = VmId::new_random();
    let mock = Mock::start(sequence(vec![
        server_body(vm, "BUILD", None, None),
        server_body(vm, "BUILD", None, None),
        server_body(vm, "ACTIVE", Some("compute"), None),
    ]))
    .await;
    let cloud = nova(&mock);
    let id = ServerId(SERVER_ID.into());
    let info = cloud.wait_active(&id, BOUND).await.unwrap();
    assert_eq!(info.status, ServerStatus::Active);
    assert_eq!(info.vm, vm);
    assert_eq!(info.host, Some(HostId::new("compute").unwrap()));
    // The first upstream port: fixed IP 172.24.4.2, id d80b1a3b-4fc1-... -> tapd80b1a3b-4f.
    assert_eq!(info.fixed_ip, Some("172.24.4.2".parse().unwrap()));
    assert_eq!(info.tap.as_deref(), Some("tapd80b1a3b-4f"));
    assert_eq!(mock.count(&Method::GET, &format!("{NOVA}/servers/{SERVER_ID}")), 3);
    let ports = mock.requests().into_iter().find(|r| r.path.contains("/ports")).unwrap();
    assert_eq!(ports.path, format!("/neutron/v2.0/ports?device_id={SERVER_ID}"));
    assert_eq!(ports.header("x-auth-token"), Some("service-token"));
    assert_eq!(ports.header("openstack-api-version"), None, "only Nova takes a microversion");
    // `server` reads the same.
    assert_eq!(cloud.server(&id).await.unwrap(), info);
}

#[tokio::test]
async fn without_ports_the_fixed_ip_comes_from_novas_addresses() {
    let vm = VmId::new_random();
    let states = vec![server_body(vm, "ACTIVE", Some("compute"), None)];
    let servers = sequence(states);
    let mock = Mock::start(move |req, base| {
        if req.path.starts_with("/neutron/v2.0/ports") {
            return reply(200, r#"{"ports": []}"#);
        }
        servers(req, base)
    })
    .await;
    let info = nova(&mock).server(&ServerId(SERVER_ID.into())).await.unwrap();
    assert_eq!(info.fixed_ip, Some("192.168.1.30".parse().unwrap()));
    assert_eq!(info.tap, None);
}

#[tokio::test]
async fn error_carries_novas_fault_message() {
    let vm = VmId::new_random();
    let fault = "No valid host was found. There are not enough hosts available.";
    let mock = Mock::start(sequence(vec![
        server_body(vm, "BUILD", None, None),
        server_body(vm, "ERROR", None, Some(fault)),
    ]))
    .await;
    let err = nova(&mock).wait_active(&ServerId(SERVER_ID.into()), BOUND).await.unwrap_err();
    match err {
        CloudError::ServerFailed(message) => assert_eq!(message, fault),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn an_active_server_without_the_host_attribute_asks_for_the_admin_role() {
    let vm = VmId::new_random();
    let mut body = server_body(vm, "ACTIVE", None, None);
    body["server"].as_object_mut().unwrap().remove("OS-EXT-SRV-ATTR:host");
    let mock = Mock::start(sequence(vec![body])).await;
    let err = nova(&mock).wait_active(&ServerId(SERVER_ID.into()), BOUND).await.unwrap_err();
    assert!(matches!(err, CloudError::Unavailable { .. }), "{err:?}");
    assert!(err.to_string().contains("admin role"), "{err}");
}

#[tokio::test]
async fn wait_active_is_bounded() {
    let vm = VmId::new_random();
    let mock = Mock::start(sequence(vec![server_body(vm, "BUILD", None, None)])).await;
    let timeout = Duration::from_millis(200);
    let err = nova(&mock).wait_active(&ServerId(SERVER_ID.into()), timeout).await.unwrap_err();
    assert!(matches!(err, CloudError::Timeout(t) if t == timeout), "{err:?}");
}

#[tokio::test]
async fn deployed_once_the_port_is_active() {
    let vm = VmId::new_random();
    let servers = sequence(vec![server_body(vm, "ACTIVE", Some("compute"), None)]);
    let lookups = Arc::new(AtomicUsize::new(0));
    let l = lookups.clone();
    let mock = Mock::start(move |req, base| {
        if req.path.starts_with("/neutron/v2.0/ports") {
            let mut ports = fixture_json("neutron/ports_ports-list-response.json");
            if l.fetch_add(1, Ordering::SeqCst) < 2 {
                ports["ports"][0]["status"] = json!("DOWN");
            }
            return reply(200, ports.to_string());
        }
        servers(req, base)
    })
    .await;
    nova(&mock).wait_deployed(&ServerId(SERVER_ID.into()), BOUND).await.unwrap();
    assert_eq!(lookups.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn delete_waits_for_404() {
    let vm = VmId::new_random();
    let gets = AtomicUsize::new(0);
    let mock = Mock::start(move |req, base| {
        let path = format!("{NOVA}/servers/{SERVER_ID}");
        if req.is(&Method::DELETE, &path) {
            return reply(204, "");
        }
        if req.is(&Method::GET, &path) {
            if gets.fetch_add(1, Ordering::SeqCst) < 2 {
                return reply(200, server_body(vm, "ACTIVE", Some("compute"), None).to_string());
            }
            return nova_error(404, "itemNotFound", "Instance could not be found.");
        }
        standard(req, base)
    })
    .await;
    let cloud = nova(&mock);
    cloud.delete_server(&ServerId(SERVER_ID.into()), BOUND).await.unwrap();
    assert_eq!(mock.count(&Method::DELETE, NOVA), 1);
    assert_eq!(mock.count(&Method::GET, &format!("{NOVA}/servers/{SERVER_ID}")), 3);
    let delete = mock.requests().into_iter().find(|r| r.method == Method::DELETE).unwrap();
    assert_compute_headers(&delete, "service-token");
    // A server that is already gone: DELETE answers 404, which is success.
    cloud.delete_server(&ServerId("gone".into()), BOUND).await.unwrap();
    let err = cloud.server(&ServerId("gone".into())).await.unwrap_err();
    assert!(matches!(err, CloudError::NotFound(_)), "{err:?}");
}

/// What `create_server` returns when Nova answers the POST with `answer`.
async fn create_against(answer: fn() -> Reply) -> CloudError {
    let mock = Mock::start(move |req, base| {
        if req.is(&Method::POST, &format!("{NOVA}/servers")) {
            return answer();
        }
        standard(req, base)
    })
    .await;
    nova(&mock).create_server(&spec(VmId::new_random(), pinned("nosuchhost"))).await.unwrap_err()
}

#[tokio::test]
async fn nova_errors_map_to_the_services_errors() {
    let err = create_against(|| {
        nova_error(400, "badRequest", "Compute host nosuchhost could not be found.")
    })
    .await;
    assert!(
        matches!(&err, CloudError::Invalid { field: "host", reason } if reason == "Compute host nosuchhost could not be found."),
        "{err:?}"
    );
    let err = create_against(|| nova_error(400, "badRequest", "Invalid flavorRef provided.")).await;
    assert!(matches!(err, CloudError::Invalid { field: "flavor", .. }), "{err:?}");
    let err = create_against(|| {
        nova_error(
            403,
            "forbidden",
            "Quota exceeded for instances: Requested 1, but already used 10 of 10 instances",
        )
    })
    .await;
    assert!(matches!(&err, CloudError::Quota(m) if m.contains("10 of 10")), "{err:?}");
    for status in [500, 503] {
        let err = match status {
            500 => {
                create_against(|| nova_error(500, "computeFault", "Unexpected API Error.")).await
            }
            _ => create_against(|| reply(503, "Service Unavailable")).await,
        };
        assert!(matches!(err, CloudError::Unavailable { .. }), "{status}: {err:?}");
        assert!(err.to_string().contains(&status.to_string()), "{err}");
    }
}

#[tokio::test]
async fn unreachable_keystone_is_unavailable_with_its_cause() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    drop(listener);
    let cloud = NovaCloud::new(settings(&base), config()).unwrap();
    let err = cloud.check(&request(), None).await.unwrap_err();
    assert!(matches!(err, CloudError::Unavailable { .. }), "{err:?}");
    let keystone = err.source().expect("the Keystone error");
    assert!(keystone.to_string().contains("cannot reach"), "{keystone}");
    assert!(keystone.source().is_some(), "the connection error is kept");

    let mock = Mock::start(|req, _| {
        if req.path.starts_with("/identity/") {
            return reply(503, "<html>Service Unavailable</html>");
        }
        reply(500, "")
    })
    .await;
    let err = nova(&mock).check(&request(), None).await.unwrap_err();
    assert!(matches!(err, CloudError::Unavailable { .. }), "{err:?}");
    assert!(err.source().unwrap().to_string().contains("503"), "{err:?}");
}

#[tokio::test]
async fn a_slow_nova_times_out() {
    let mock = Mock::start(|req, base| {
        if req.path.starts_with("/nova/") {
            let mut slow = standard(req, base);
            slow.delay = Some(Duration::from_secs(5));
            return slow;
        }
        standard(req, base)
    })
    .await;
    let config = NovaConfig { request_timeout_ms: 300, ..config() };
    let cloud = NovaCloud::new(settings(&mock.base), config).unwrap();
    let started = std::time::Instant::now();
    let err = cloud.check(&request(), None).await.unwrap_err();
    assert!(matches!(err, CloudError::Timeout(t) if t == Duration::from_millis(300)), "{err:?}");
    assert!(started.elapsed() < Duration::from_secs(3));
}

#[tokio::test]
async fn too_large_user_data_is_refused_before_any_request() {
    let mock = Mock::start(standard).await;
    let cloud = nova(&mock);
    let mut spec = spec(VmId::new_random(), pinned("compute"));
    // 49,152 bytes are 65,536 base64-encoded: one over Nova's limit.
    spec.user_data = vec![b'x'; 49_152];
    let err = cloud.create_server(&spec).await.unwrap_err();
    assert!(matches!(err, CloudError::Invalid { field: "user_data", .. }), "{err:?}");
    assert!(mock.requests().is_empty());
    spec.user_data.truncate(49_149);
    let mock = nova_that_creates().await;
    nova(&mock).create_server(&spec).await.unwrap();
}

/// Keystone validating tenants' tokens: `tenant-admin` (the upstream admin token), `tenant-member`
/// (expiring in `member_ttl`), anything else 404.
async fn keystone_for_tenants(member_ttl: Duration) -> Mock {
    let member_expires = format_rfc3339(SystemTime::now() + member_ttl);
    Mock::start(move |req, base| {
        if req.is(&Method::GET, "/identity/v3/auth/tokens?nocatalog") {
            assert_eq!(req.header("x-auth-token"), Some("service-token"));
            let mut body = token_body(base, in_an_hour());
            match req.header("x-subject-token") {
                Some("tenant-admin") => {}
                Some(t) if t.starts_with("tenant-member") => {
                    body["token"]["roles"] =
                        json!([{ "id": "9fe2ff9ee4384b1894a90878d3e92bab", "name": "member" }]);
                    body["token"]["expires_at"] = json!(member_expires);
                }
                Some("tenant-unscoped") => {
                    body["token"].as_object_mut().unwrap().remove("project");
                }
                _ => return nova_error(404, "error", "Could not find token."),
            }
            return reply(200, body.to_string());
        }
        standard(req, base)
    })
    .await
}

fn validator(mock: &Mock, capacity: usize) -> TokenValidator {
    validator_aged(mock, capacity, Duration::from_secs(300))
}

fn validator_aged(mock: &Mock, capacity: usize, max_age: Duration) -> TokenValidator {
    validator_with(mock, |s| {
        s.capacity = capacity;
        s.max_age = max_age;
    })
}

/// A validator whose admin project is the samples' `admin` project.
fn validator_with(mock: &Mock, tweak: impl FnOnce(&mut ValidatorSettings)) -> TokenValidator {
    let keystone = Keystone::new(settings(&mock.base), HttpOptions::default()).unwrap();
    let mut settings = ValidatorSettings {
        admin: AdminScope {
            roles: vec!["admin".into()],
            system: true,
            project: Some("admin".into()),
            project_domain: "Default".into(),
        },
        capacity: 16,
        max_age: Duration::from_secs(300),
        refusal_ttl: Duration::from_secs(30),
        per_client_per_minute: 60,
    };
    tweak(&mut settings);
    TokenValidator::new(Arc::new(keystone), settings)
}

fn validations(mock: &Mock) -> usize {
    mock.count(&Method::GET, "/identity/v3/auth/tokens")
}

#[tokio::test]
async fn tenant_tokens_are_validated_mapped_and_cached() {
    let mock = keystone_for_tenants(Duration::from_secs(3600)).await;
    let validator = validator(&mock, 16);
    let admin = validator.validate("tenant-admin", None).await.unwrap();
    assert_eq!(admin.role, Role::Admin);
    assert_eq!(admin.project_id.as_deref(), Some(PROJECT));
    assert_eq!(admin.info.user_id, "ee4dfb6e5540447cb3741905149d9b6e");
    let caller = admin.caller();
    assert_eq!(caller.project.as_deref(), Some(PROJECT));
    assert!(caller.is_admin());
    let member = validator.validate("tenant-member", None).await.unwrap();
    assert_eq!(member.role, Role::Member);
    assert_eq!(validations(&mock), 2);
    assert_eq!(validator.validate("tenant-admin", None).await.unwrap(), admin);
    assert_eq!(validator.validate("tenant-member", None).await.unwrap(), member);
    assert_eq!(validations(&mock), 2, "cached answers do not call Keystone");
    assert!(matches!(validator.validate("forged", None).await, Err(ValidationError::Invalid)));
    assert!(matches!(
        validator.validate("tenant-unscoped", None).await,
        Err(ValidationError::Unscoped)
    ));
    assert_eq!(mock.auths(), 1, "one service token for all validations");
}

#[tokio::test]
async fn an_admin_role_outside_the_admin_scope_makes_a_member() {
    let mock = keystone_for_tenants(Duration::from_secs(3600)).await;
    // The samples' admin token is scoped to project `admin`: with only system scope counting, its
    // admin role makes a member of that project.
    let validator = validator_with(&mock, |s| s.admin.project = None);
    let admin = validator.validate("tenant-admin", None).await.unwrap();
    assert_eq!((admin.role, admin.project_id.as_deref()), (Role::Member, Some(PROJECT)));
    let validator = validator_with(&mock, |s| s.admin.project_domain = "elsewhere".into());
    let admin = validator.validate("tenant-admin", None).await.unwrap();
    assert_eq!(admin.role, Role::Member, "a project of that name in another domain");
    let validator = validator_with(&mock, |s| s.admin.project = Some(PROJECT.into()));
    assert_eq!(validator.validate("tenant-admin", None).await.unwrap().role, Role::Admin);
}

#[tokio::test]
async fn refused_tokens_are_remembered_and_each_client_asks_so_often() {
    let mock = keystone_for_tenants(Duration::from_secs(3600)).await;
    let validator = validator_with(&mock, |s| s.per_client_per_minute = 10);
    let client = Some("192.0.2.7".parse().unwrap());
    // One bad token sent 50 times costs Keystone one validation.
    for _ in 0..50 {
        let err = validator.validate("forged", client).await.unwrap_err();
        assert!(matches!(err, ValidationError::Invalid), "{err:?}");
    }
    assert_eq!(validations(&mock), 1);
    // 50 different bad tokens from one client: a minute's budget reaches Keystone, then 429.
    let mut limited = 0;
    for i in 0..50 {
        match validator.validate(&format!("forged-{i}"), client).await {
            Err(ValidationError::RateLimited) => limited += 1,
            Err(ValidationError::Invalid) => {}
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(validations(&mock), 10, "the first token and 9 more");
    assert_eq!(limited, 41);
    // Another client, and tokens already cached, are not held back.
    let other = Some("192.0.2.8".parse().unwrap());
    assert_eq!(validator.validate("tenant-member", other).await.unwrap().role, Role::Member);
}

#[tokio::test]
async fn cached_tokens_expire_and_the_cache_is_bounded() {
    let mock = keystone_for_tenants(Duration::from_millis(1500)).await;
    let validator = validator(&mock, 2);
    validator.validate("tenant-member", None).await.unwrap();
    validator.validate("tenant-member", None).await.unwrap();
    assert_eq!(validations(&mock), 1);
    tokio::time::sleep(Duration::from_millis(1600)).await;
    // Keystone's answer now says the token has expired: invalid, and asked again.
    assert!(matches!(
        validator.validate("tenant-member", None).await,
        Err(ValidationError::Invalid)
    ));
    assert_eq!(validations(&mock), 2);

    let mock = keystone_for_tenants(Duration::from_secs(3600)).await;
    let validator = self::validator(&mock, 2);
    for token in ["tenant-member-1", "tenant-member-2", "tenant-admin"] {
        validator.validate(token, None).await.unwrap();
    }
    assert_eq!(validator.cached(), 2);

    // A long-lived token is asked about again after the cache's maximum age (revocation).
    let validator = validator_aged(&mock, 4, Duration::from_millis(200));
    let before = validations(&mock);
    validator.validate("tenant-admin", None).await.unwrap();
    validator.validate("tenant-admin", None).await.unwrap();
    assert_eq!(validations(&mock), before + 1);
    tokio::time::sleep(Duration::from_millis(300)).await;
    validator.validate("tenant-admin", None).await.unwrap();
    assert_eq!(validations(&mock), before + 2);
}

#[tokio::test]
async fn keystone_failures_while_validating_are_not_invalid_tokens() {
    let mock = Mock::start(|req, base| {
        if req.method == Method::GET && req.path.starts_with("/identity/") {
            return reply(500, "");
        }
        standard(req, base)
    })
    .await;
    let err = validator(&mock, 4).validate("tenant-admin", None).await.unwrap_err();
    assert!(matches!(err, ValidationError::Keystone(_)), "{err:?}");
    assert!(err.source().unwrap().to_string().contains("500"), "{err:?}");
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("gsaas-os-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

const CLOUDS_YAML: &str = "
clouds:
  gsaas:
    auth:
      auth_url: http://127.0.0.1:35000/v3
      username: admin
      password: adminpw
      project_name: admin
      user_domain_name: Default
      project_domain_name: Default
    region_name: RegionOne
    interface: internal
    identity_api_version: 3
";

#[test]
fn clouds_yaml_and_os_variables() {
    let dir = temp_dir("clouds");
    let path = dir.join("clouds.yaml");
    std::fs::write(&path, CLOUDS_YAML).unwrap();
    let no_env = |_: &str| -> Option<String> { None };
    let settings = AuthSettings::load(Some("gsaas"), Some(&path), &no_env).unwrap();
    assert_eq!(settings.identity_v3(), "http://127.0.0.1:35000/v3");
    assert_eq!(settings.username.as_deref(), Some("admin"));
    assert_eq!(settings.interface, "internal");
    assert_eq!(settings.region_name.as_deref(), Some("RegionOne"));
    assert_eq!(
        settings.password_auth_body()["auth"]["identity"]["password"]["user"],
        json!({ "name": "admin", "domain": { "name": "Default" }, "password": "adminpw" })
    );
    assert!(!format!("{settings:?}").contains("adminpw"), "Debug hides the password");

    // OS_CLOUD names the cloud, OS_CLIENT_CONFIG_FILE the file; OS_* override its fields.
    let file = path.display().to_string();
    let env = move |name: &str| match name {
        "OS_CLOUD" => Some("gsaas".to_owned()),
        "OS_CLIENT_CONFIG_FILE" => Some(file.clone()),
        "OS_REGION_NAME" => Some("RegionTwo".to_owned()),
        _ => None,
    };
    let settings = AuthSettings::load(None, None, &env).unwrap();
    assert_eq!(settings.region_name.as_deref(), Some("RegionTwo"));

    // Only OS_* variables.
    let env = |name: &str| {
        let value = match name {
            "OS_AUTH_URL" => "http://keystone:5000",
            "OS_USERNAME" => "gsaas",
            "OS_PASSWORD" => "secret",
            "OS_PROJECT_ID" => PROJECT,
            "OS_USER_DOMAIN_ID" => "default",
            _ => return None,
        };
        Some(value.to_owned())
    };
    let settings = AuthSettings::load(None, None, &env).unwrap();
    assert_eq!(settings.identity_v3(), "http://keystone:5000/v3");
    assert_eq!(settings.interface, "public");
    assert_eq!(
        settings.password_auth_body()["auth"]["scope"],
        json!({ "project": { "id": PROJECT } })
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn openstack_config_errors_name_their_origin() {
    let dir = temp_dir("errors");
    let path = dir.join("clouds.yaml");
    let no_env = |_: &str| -> Option<String> { None };
    std::fs::write(&path, "clouds: [not, a, map").unwrap();
    let err = AuthSettings::load(Some("gsaas"), Some(&path), &no_env).unwrap_err();
    assert!(matches!(err, OpenStackConfigError::Parse { .. }), "{err:?}");
    assert!(err.to_string().contains(&path.display().to_string()), "{err}");

    std::fs::write(&path, CLOUDS_YAML).unwrap();
    let err = AuthSettings::load(Some("other"), Some(&path), &no_env).unwrap_err();
    assert!(matches!(err, OpenStackConfigError::NoSuchCloud { .. }), "{err:?}");
    assert!(err.to_string().contains("clouds.yaml") && err.to_string().contains("other"), "{err}");

    let https = CLOUDS_YAML.replace("http://", "https://");
    std::fs::write(&path, &https).unwrap();
    AuthSettings::load(Some("gsaas"), Some(&path), &no_env).unwrap();
    let with_cacert =
        |line: &str| https.replace("    auth:\n", &format!("    {line}\n    auth:\n"));
    std::fs::write(&path, with_cacert("cacert: /nonexistent/ca.pem")).unwrap();
    let err = AuthSettings::load(Some("gsaas"), Some(&path), &no_env).unwrap_err();
    assert!(err.to_string().contains(&path.display().to_string()), "{err}");
    assert!(err.to_string().contains("/nonexistent/ca.pem"), "{err}");

    std::fs::write(&path, CLOUDS_YAML.replace("      password: adminpw\n", "")).unwrap();
    let err = AuthSettings::load(Some("gsaas"), Some(&path), &no_env).unwrap_err();
    assert!(
        matches!(err, OpenStackConfigError::Missing { field, .. } if field.starts_with("password")),
        "{err:?}"
    );

    let missing = dir.join("missing.yaml");
    let err = AuthSettings::load(Some("gsaas"), Some(&missing), &no_env).unwrap_err();
    assert!(err.to_string().contains("missing.yaml"), "{err}");
    assert!(err.source().is_some());

    let err = AuthSettings::load(None, None, &no_env).unwrap_err();
    assert!(
        matches!(err, OpenStackConfigError::Missing { field, .. } if field.starts_with("auth_url")),
        "{err:?}"
    );
    std::fs::remove_dir_all(&dir).unwrap();

    let err = NovaCloud::new(
        settings("http://127.0.0.1:1"),
        NovaConfig { microversion: "2.60".into(), ..NovaConfig::default() },
    )
    .unwrap_err();
    assert!(err.to_string().contains("2.60"), "{err}");
}

#[test]
fn the_keystone_sample_headers_carry_the_token() {
    // The upstream HTTP sample: 201 and the token in X-Subject-Token, which is what the mock sends.
    let sample = fixture("keystone/auth-password-user-name-unscoped-response-HTTP.txt");
    assert!(sample.starts_with("HTTP/1.1 201 Created"));
    let headers: BTreeSet<&str> =
        sample.lines().filter_map(|l| l.split_once(':').map(|(name, _)| name)).collect();
    assert!(headers.contains("X-Subject-Token"));
}

/// A Keystone stand-in over TLS (Python's `http.server` with `ssl`), with a throwaway
/// self-signed certificate for 127.0.0.1 made by `openssl`: every POST gets the upstream token
/// body with its catalog pointing back at it.
struct TlsKeystone {
    child: std::process::Child,
    dir: PathBuf,
    base: String,
    cert: PathBuf,
}

const TLS_KEYSTONE: &str = r#"
import http.server, ssl, sys
cert, key, body_path = sys.argv[1:4]
template = open(body_path).read()
class Handler(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        body = template.replace("BASE", "https://127.0.0.1:%d" % self.server.server_port).encode()
        self.send_response(201)
        self.send_header("X-Subject-Token", "token-over-tls")
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
context.load_cert_chain(cert, key)
server.socket = context.wrap_socket(server.socket, server_side=True)
print(server.server_port, flush=True)
server.serve_forever()
"#;

impl TlsKeystone {
    fn start() -> TlsKeystone {
        use std::io::BufRead as _;
        use std::process::{Command, Stdio};
        let dir = std::env::temp_dir().join(format!(
            "gsaas-tls-{}-{}",
            std::process::id(),
            VmId::new_random()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
        let made = Command::new("openssl")
            .args(["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"])
            .args(["-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"])
            .arg("-keyout")
            .arg(&key)
            .arg("-out")
            .arg(&cert)
            .output()
            .expect("openssl runs (Debian's openssl package)");
        assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
        let body = dir.join("token.json");
        std::fs::write(&body, token_body("BASE", in_an_hour()).to_string()).unwrap();
        let mut child = Command::new("python3")
            .arg("-c")
            .arg(TLS_KEYSTONE)
            .args([&cert, &key, &body])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("python3 runs");
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        let port: u16 =
            line.trim().parse().unwrap_or_else(|_| panic!("no port from the server: {line:?}"));
        TlsKeystone { child, dir, base: format!("https://127.0.0.1:{port}"), cert }
    }
}

impl Drop for TlsKeystone {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[tokio::test]
async fn keystone_over_https_is_trusted_through_cacert_only() {
    let keystone = TlsKeystone::start();
    let mut trusting = settings(&keystone.base);
    trusting.auth_url = format!("{}/identity/v3", keystone.base);
    trusting.cacert = Some(keystone.cert.clone());
    let session = Keystone::new(trusting.clone(), HttpOptions::default()).unwrap();
    let token = session.token().await.expect("a token over TLS with the CA trusted");
    assert_eq!(token.token, "token-over-tls");

    // The same server without its CA in cacert: the certificate is refused, and said so.
    let untrusting = Keystone::new(settings(&keystone.base), HttpOptions::default()).unwrap();
    let err = untrusting.token().await.unwrap_err();
    let chain = gsaasd::error::ErrorChain(&err).to_string();
    assert!(chain.contains(&keystone.base), "{chain}");
    assert!(chain.to_lowercase().contains("certificate"), "{chain}");

    // A cacert that holds no certificate is refused before any request, naming the file.
    let not_pem = keystone.dir.join("not-a-ca.pem");
    std::fs::write(&not_pem, "hello").unwrap();
    let err = Keystone::new(
        AuthSettings { cacert: Some(not_pem.clone()), ..trusting },
        HttpOptions::default(),
    )
    .unwrap_err();
    assert!(err.to_string().contains(&not_pem.display().to_string()), "{err}");
}
