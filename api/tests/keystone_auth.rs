//! The real gsaasd in `auth.mode = "keystone"` with `cloud.backend = "nova"`, pointed (through a
//! clouds.yaml) at a fake Keystone + Nova + Glance on 127.0.0.1:0 built from the upstream samples of
//! `tests/fixtures/openstack/` (the approach of `openstack_contract.rs`).
//!
//! The fake Keystone answers the service user's password auth with the upstream project-scoped token,
//! its catalog rewritten to point at the fake server, and validates tenants' tokens
//! (`GET /v3/auth/tokens`): `tenant-a` (member of project A, the sample's project), `tenant-b`
//! (member of project B), `tenant-admin` (the sample's admin role); anything else is 404, as
//! Keystone answers for an unknown token. Tenants send their token as `X-Auth-Token`. The fake Nova
//! keeps the servers it is asked to create (ACTIVE at once, on the asked-for host, the upstream
//! server and port samples), so a launch goes all the way to `ready` and a termination to `deleted`.

use crate::support::upstream;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Router;
use gsaasd::cloud::nova::{vm_tag, NovaConfig, VM_ID_METADATA};
use gsaasd::config::{AuthConfig, AuthMode, CloudConfig, Config};
use serde_json::{json, Value};
use upstream::{fixture, token_body};

const PROJECT_A: &str = "a6944d763bf64ee6a275f1263fae0352";
const PROJECT_B: &str = "b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0";
const NOVA: &str = "/nova/v2.1/a6944d763bf64ee6a275f1263fae0352";
const IMAGE_ID: &str = "70a599e0-31e7-49b7-b260-868f441e862b";
const BOUND: Duration = Duration::from_secs(10);

/// (method, path and query, X-Subject-Token) of one request.
type Logged = (Method, String, Option<String>);

#[derive(Clone)]
pub(crate) struct Fake {
    base: String,
    /// Every request.
    pub(crate) log: Arc<Mutex<Vec<Logged>>>,
    /// Nova's servers: id to (gsaas VM id of its metadata, the host it was asked to run on).
    servers: Arc<Mutex<BTreeMap<String, (String, String)>>>,
    /// The token of every `POST /servers`.
    creators: Arc<Mutex<Vec<String>>>,
    /// Tokens revoked with `DELETE /v3/auth/tokens`.
    pub(crate) revoked: Arc<Mutex<Vec<String>>>,
    /// While set, revocations fail (503), as Keystone's do while it is down.
    pub(crate) revocations_fail: Arc<AtomicBool>,
}

/// The upstream admin view of a server (2.73), ACTIVE on `host`, with `vm` in its metadata.
fn server_body(id: &str, vm: &str, host: &str) -> Value {
    let mut body: Value =
        serde_json::from_str(&fixture("nova/servers_v2.73_server-get-resp.json")).unwrap();
    let server = &mut body["server"];
    server["id"] = json!(id);
    server["metadata"][VM_ID_METADATA] = json!(vm);
    server["OS-EXT-SRV-ATTR:host"] = json!(host);
    body
}

async fn serve(
    State(fake): State<Fake>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let path = uri.path_and_query().map(|p| p.to_string()).unwrap_or_default();
    let header = |name| headers.get(name).and_then(|v| v.to_str().ok()).map(str::to_owned);
    let subject = header("x-subject-token");
    fake.log.lock().unwrap().push((method.clone(), path.clone(), subject.clone()));
    let ok = |body: Value| (StatusCode::OK, axum::Json(body)).into_response();
    let not_found = |what: &str| {
        let body = json!({ "itemNotFound": { "code": 404, "message": what } });
        (StatusCode::NOT_FOUND, axum::Json(body)).into_response()
    };
    match (method, path.as_str()) {
        (Method::POST, "/identity/v3/auth/tokens") => {
            let request: Value = serde_json::from_slice(&body).unwrap_or_default();
            let identity = &request["auth"]["identity"];
            let user = &identity["password"]["user"];
            let refused = || {
                let error = json!({ "error": { "code": 401, "title": "Unauthorized",
                    "message": "The request you have made requires authentication." } });
                (StatusCode::UNAUTHORIZED, axum::Json(error)).into_response()
            };
            let issued = |token: &'static str| {
                let body = axum::Json(token_body(&fake.base, in_an_hour()));
                (StatusCode::CREATED, [("x-subject-token", token)], body).into_response()
            };
            // Users signing in through gsaasd: `alice` with password `right` gets
            // `alice-unscoped`, which project `demo` scopes to `tenant-a`.
            if user["name"] == "alice" {
                let unscoped = request["auth"]["scope"] == "unscoped";
                return if user["password"] == "right" && unscoped {
                    issued("alice-unscoped")
                } else {
                    refused()
                };
            }
            if identity["methods"] == json!(["token"]) {
                let from = identity["token"]["id"].as_str().unwrap_or_default();
                let revoked = fake.revoked.lock().unwrap().iter().any(|t| t == from);
                let project = &request["auth"]["scope"]["project"]["name"];
                return if from == "alice-unscoped" && !revoked && project == "demo" {
                    issued("tenant-a")
                } else {
                    refused()
                };
            }
            (
                StatusCode::CREATED,
                [("x-subject-token", "service-token")],
                axum::Json(token_body(&fake.base, in_an_hour())),
            )
                .into_response()
        }
        (Method::DELETE, "/identity/v3/auth/tokens") => {
            let own = header("x-auth-token");
            if own.is_none() || own != subject {
                return (StatusCode::FORBIDDEN, "a user revokes its own token here")
                    .into_response();
            }
            if fake.revocations_fail.load(Ordering::SeqCst) {
                return (StatusCode::SERVICE_UNAVAILABLE, "Keystone is down").into_response();
            }
            fake.revoked.lock().unwrap().push(subject.unwrap_or_default());
            StatusCode::NO_CONTENT.into_response()
        }
        (Method::GET, p) if p.starts_with("/identity/v3/auth/tokens") => {
            // Keystone requires the service's own token to validate someone else's.
            if header("x-auth-token").as_deref() != Some("service-token") {
                return (StatusCode::UNAUTHORIZED, "service token expected").into_response();
            }
            if subject.as_ref().is_some_and(|s| fake.revoked.lock().unwrap().contains(s)) {
                return not_found("Could not find token.");
            }
            let mut body = token_body(&fake.base, in_an_hour());
            let member = json!([{ "id": "9fe2ff9ee4384b1894a90878d3e92bab", "name": "member" }]);
            // `alice-unscoped` heads a chain: `tenant-a` was had from it (Keystone's audit ids:
            // the token's own, then its chain's first token's).
            body["token"]["audit_ids"] = match subject.as_deref() {
                Some("alice-unscoped") => json!(["alice-root"]),
                Some("tenant-a") => json!(["tenant-a-own", "alice-root"]),
                Some(other) => json!([format!("{other}-own")]),
                None => json!([]),
            };
            match subject.as_deref() {
                Some("tenant-admin") => {}
                Some("alice-unscoped") => {
                    body["token"].as_object_mut().unwrap().remove("project");
                    body["token"]["roles"] = json!([]);
                }
                // An admin of project B only (a tenant who administers its own project).
                Some("b-admin") => {
                    body["token"]["project"]["id"] = json!(PROJECT_B);
                    body["token"]["project"]["name"] = json!("project-b");
                }
                // An operator's system-scoped token: no project.
                Some("system-admin") => {
                    body["token"].as_object_mut().unwrap().remove("project");
                    body["token"]["system"] = json!({ "all": true });
                }
                Some("tenant-a") => body["token"]["roles"] = member,
                // Project A's reader: may look, as its operator's policy file says.
                Some("reader-a") => {
                    body["token"]["roles"] = json!([{ "id": "r", "name": "reader" }]);
                }
                Some("tenant-b") => {
                    body["token"]["roles"] = member;
                    body["token"]["project"]["id"] = json!(PROJECT_B);
                    body["token"]["project"]["name"] = json!("project-b");
                }
                _ => return not_found("Could not find token."),
            }
            body["token"].as_object_mut().unwrap().remove("catalog");
            ok(body)
        }
        (Method::GET, p) if p == format!("{NOVA}/flavors/1") => {
            ok(serde_json::from_str(&fixture("nova/flavors_flavor-get-resp.json")).unwrap())
        }
        (Method::GET, p) if p == format!("/glance/v2/images/{IMAGE_ID}") => {
            ok(json!({ "id": IMAGE_ID, "name": "cirros", "status": "active" }))
        }
        (Method::GET, p) if p.starts_with(&format!("{NOVA}/servers/detail?tags=")) => {
            let servers = fake.servers.lock().unwrap();
            let tagged: Vec<Value> = servers
                .iter()
                .filter(|(_, (vm, _))| p.ends_with(&vm_tag(vm.parse().unwrap())))
                .map(|(id, (vm, host))| server_body(id, vm, host)["server"].clone())
                .collect();
            ok(json!({ "servers": tagged }))
        }
        (Method::POST, p) if p == format!("{NOVA}/servers") => {
            let request: Value = serde_json::from_slice(&body).unwrap();
            let server = &request["server"];
            let vm = server["metadata"][VM_ID_METADATA].as_str().unwrap().to_owned();
            // A tenant names no host (Nova's policy): Nova picks one, here the first rGPU host.
            assert!(server.get("host").is_none(), "a tenant's request named a host: {server}");
            let host = "compute0-rgpu".to_owned();
            // Created as the tenant, with the tenant's own token.
            let token = header("x-auth-token");
            fake.creators.lock().unwrap().push(token.unwrap_or_default());
            let mut servers = fake.servers.lock().unwrap();
            let id = format!("5e000000-0000-4000-8000-{:012}", servers.len() + 1);
            servers.insert(id.clone(), (vm, host));
            (StatusCode::ACCEPTED, axum::Json(json!({ "server": { "id": id } }))).into_response()
        }
        (method, p) if p.starts_with(&format!("{NOVA}/servers/")) => {
            let id = p.rsplit('/').next().unwrap();
            let mut servers = fake.servers.lock().unwrap();
            match (method, servers.get(id).cloned()) {
                (Method::GET, Some((vm, host))) => ok(server_body(id, &vm, &host)),
                (Method::DELETE, Some(_)) => {
                    servers.remove(id);
                    StatusCode::NO_CONTENT.into_response()
                }
                _ => not_found(&format!("server {id}")),
            }
        }
        (Method::GET, p) if p.starts_with("/neutron/v2.0/ports?device_id=") => {
            let device = p.rsplit('=').next().unwrap();
            let mut ports: Value =
                serde_json::from_str(&fixture("neutron/ports_ports-list-response.json")).unwrap();
            for port in ports["ports"].as_array_mut().unwrap() {
                port["device_id"] = json!(device);
            }
            ok(ports)
        }
        (method, path) => not_found(&format!("no route for {method} {path}")),
    }
}

pub(crate) struct Setup {
    pub(crate) service: gsaasd::service::Service,
    pub(crate) fake: Fake,
    pub(crate) http: reqwest::Client,
    _dir: TempDir,
}

struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

async fn setup(name: &str) -> Setup {
    setup_with(name, |_| {}).await
}

pub(crate) async fn setup_with(name: &str, tweak: impl FnOnce(&mut AuthConfig)) -> Setup {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let fake = Fake {
        base: base.clone(),
        log: Arc::default(),
        servers: Arc::default(),
        creators: Arc::default(),
        revoked: Arc::default(),
        revocations_fail: Arc::default(),
    };
    let app = Router::new().fallback(serve).with_state(fake.clone());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    let dir =
        std::env::temp_dir().join(format!("gsaas-keystone-auth-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let clouds_yaml = dir.join("clouds.yaml");
    std::fs::write(
        &clouds_yaml,
        format!(
            "clouds:\n  gsaas:\n    region_name: RegionOne\n    auth:\n      auth_url: {base}/identity/v3\n      \
             user_id: ee4dfb6e5540447cb3741905149d9b6e\n      password: devstacker\n      \
             project_name: admin\n      project_domain_id: default\n"
        ),
    )
    .unwrap();
    let mut config = Config { data_dir: dir.join("data"), ..Default::default() };
    config.listen = "127.0.0.1:0".parse().unwrap();
    config.auth = AuthConfig { mode: AuthMode::Keystone, ..AuthConfig::default() };
    // The operators' project: the samples' `admin`.
    config.auth.keystone_admin_scope.project = Some("admin".into());
    tweak(&mut config.auth);
    config.cloud = CloudConfig::Nova {
        nova: NovaConfig {
            cloud: Some("gsaas".into()),
            clouds_yaml: Some(clouds_yaml),
            poll_interval_ms: 10,
            request_timeout_ms: 2_000,
            ..NovaConfig::default()
        },
    };
    let service = tokio::time::timeout(BOUND, gsaasd::service::start(config))
        .await
        .expect("gsaasd starts in time")
        .expect("gsaasd starts");
    let http = reqwest::Client::builder().timeout(BOUND).build().unwrap();
    Setup { service, fake, http, _dir: TempDir(dir) }
}

impl Setup {
    pub(crate) async fn call(
        &self,
        method: Method,
        path: &str,
        token: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        let mut request = self
            .http
            .request(method, format!("{}{path}", self.service.url()))
            .header("X-Auth-Token", token);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.expect("gsaasd answers");
        let status = response.status().as_u16();
        let text = response.text().await.unwrap();
        (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
    }

    pub(crate) async fn get(&self, path: &str, token: &str) -> (u16, Value) {
        self.call(Method::GET, path, token, None).await
    }

    /// Polls the VM until its state is one of `states` (bounded).
    async fn until(&self, id: &str, token: &str, states: &[&str]) -> Value {
        let deadline = tokio::time::Instant::now() + BOUND;
        loop {
            let (status, vm) = self.get(&format!("/v1/vms/{id}"), token).await;
            assert_eq!(status, 200, "{vm}");
            if states.iter().any(|s| vm["state"] == *s) {
                return vm;
            }
            assert!(tokio::time::Instant::now() < deadline, "still {}: {vm}", vm["state"]);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn validations_of(&self, token: &str) -> usize {
        self.fake
            .log
            .lock()
            .unwrap()
            .iter()
            .filter(|(m, p, s)| {
                m == Method::GET
                    && p.starts_with("/identity/v3/auth/tokens")
                    && s.as_deref() == Some(token)
            })
            .count()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_keystone_tokens_launch_list_and_are_kept_to_their_project() {
    let s = setup("tenants").await;
    // Project A's member lists its (no) VMs; the token is validated with Keystone once, then cached.
    let (status, body) = s.get("/v1/vms", "tenant-a").await;
    assert_eq!((status, &body), (200, &json!({ "vms": [] })), "{body}");
    assert_eq!(s.get("/v1/vms", "tenant-a").await.0, 200);
    assert_eq!(s.validations_of("tenant-a"), 1);
    let (status, pool) = s.get("/v1/pool", "tenant-a").await;
    assert_eq!(status, 200, "{pool}");
    assert!(pool["totals"].is_object(), "{pool}");

    // A member is not an admin; the admin role of Keystone maps to a GSaaS admin.
    assert_eq!(s.get("/v1/hosts", "tenant-a").await.0, 404);
    let (status, hosts) = s.get("/v1/hosts", "tenant-admin").await;
    assert_eq!(status, 200, "{hosts}");
    assert_eq!(hosts["hosts"].as_array().unwrap().len(), 4, "{hosts}");

    // An unknown token is refused, and so is no token.
    let (status, body) = s.get("/v1/vms", "gAAAAA-not-a-token").await;
    assert_eq!(status, 401, "{body}");
    let response = s.http.get(format!("{}/v1/vms", s.service.url())).send().await.unwrap();
    assert_eq!(response.status().as_u16(), 401);

    // Project A launches a VM and follows it to ready; project B can neither see nor end it.
    let launch = json!({ "image": IMAGE_ID, "flavor": "1", "ncgpus": 1 });
    let (status, vm) = s.call(Method::POST, "/v1/vms", "tenant-a", Some(launch)).await;
    assert!(status == 201 || status == 202, "{status} {vm}");
    let id = vm["id"].as_str().expect("the launch has an id").to_owned();
    assert_eq!(vm["project"], PROJECT_A, "{vm}");
    let vm = s.until(&id, "tenant-a", &["ready", "error"]).await;
    assert_eq!(vm["state"], "ready", "{vm}");
    assert_eq!(s.fake.servers.lock().unwrap().len(), 1);
    assert_eq!(*s.fake.creators.lock().unwrap(), ["tenant-a"], "created as the tenant");
    let (status, body) = s.get(&format!("/v1/vms/{id}"), "tenant-b").await;
    assert_eq!(status, 404, "{body}");
    let (status, listed) = s.get("/v1/vms", "tenant-b").await;
    assert_eq!((status, &listed), (200, &json!({ "vms": [] })));
    let (status, listed) = s.get("/v1/vms", "tenant-a").await;
    assert_eq!(status, 200);
    assert_eq!(listed["vms"][0]["id"], id.as_str(), "{listed}");
    assert_eq!(s.call(Method::DELETE, &format!("/v1/vms/{id}"), "tenant-b", None).await.0, 404);
    // The admin sees it among all projects' VMs, on its host.
    let (status, all) = s.get(&format!("/v1/vms?project={PROJECT_A}"), "tenant-admin").await;
    assert_eq!((status, all["vms"][0]["id"].as_str()), (200, Some(id.as_str())), "{all}");

    // Project A terminates it: Nova's server is deleted.
    let (status, body) = s.call(Method::DELETE, &format!("/v1/vms/{id}"), "tenant-a", None).await;
    assert!((200..300).contains(&status), "{status} {body}");
    let vm = s.until(&id, "tenant-a", &["deleted", "error"]).await;
    assert_eq!(vm["state"], "deleted", "{vm}");
    assert!(s.fake.servers.lock().unwrap().is_empty());

    s.service.abort();
}

/// An admin role makes a GSaaS admin only in the configured scope; a tenant administering its own
/// project is a member; a system-scoped operator sees everything but launches nowhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keystone_admins_are_admins_only_in_the_admin_scope() {
    let s = setup("admin-scope").await;
    assert_eq!(s.get("/v1/hosts", "tenant-admin").await.0, 200, "the admin project");
    assert_eq!(s.get("/v1/hosts", "b-admin").await.0, 404, "admin of another project");
    let (status, vms) = s.get("/v1/vms", "b-admin").await;
    assert_eq!((status, &vms), (200, &json!({ "vms": [] })), "a member of project B");
    assert_eq!(s.get("/v1/hosts", "system-admin").await.0, 200, "system scope");
    assert_eq!(s.get("/v1/vms", "system-admin").await.0, 200);
    let launch = json!({ "image": IMAGE_ID, "flavor": "1", "ncgpus": 1 });
    let (status, problem) = s.call(Method::POST, "/v1/vms", "system-admin", Some(launch)).await;
    assert_eq!((status, problem["field"].as_str()), (422, Some("token")), "{problem}");
    s.service.abort();

    // Only system scope counts (the default): the admin project's admins are its members.
    let s = setup_with("system-only", |auth| auth.keystone_admin_scope.project = None).await;
    assert_eq!(s.get("/v1/hosts", "tenant-admin").await.0, 404);
    assert_eq!(s.get("/v1/hosts", "system-admin").await.0, 200);
    s.service.abort();
}

/// An operator's policy file: Keystone's `reader` role lists but does not launch; the admins of
/// the admin project (named in the file) may not drain, system-scoped operators may.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_file_gives_keystone_roles_their_rights() {
    let file = std::env::temp_dir().join(format!("gsaas-policy-{}.yaml", std::process::id()));
    std::fs::write(
        &file,
        "\"gpu:vm:create\": \"role:member and project_id:%(project_id)s\"\n\
         \"gpu:vm:list\": \"(role:reader or role:member) and project_id:%(project_id)s or rule:context_is_admin\"\n\
         \"gpu:vm:show\": \"rule:gpu:vm:list\"\n\
         \"gpu:host:drain\": \"rule:context_is_admin and not project_name:admin\"\n",
    )
    .unwrap();
    let path = file.clone();
    let s = setup_with("policy", move |auth| auth.policy_file = Some(path)).await;
    let launch = json!({ "image": IMAGE_ID, "flavor": "1", "ncgpus": 1 });
    let (status, problem) = s.call(Method::POST, "/v1/vms", "reader-a", Some(launch.clone())).await;
    assert_eq!((status, problem["code"].as_str()), (403, Some("policy_not_allowed")), "{problem}");
    assert!(s.fake.servers.lock().unwrap().is_empty(), "a refused launch reached Nova");
    let (status, vm) = s.call(Method::POST, "/v1/vms", "tenant-a", Some(launch)).await;
    assert_eq!(status, 202, "{vm}");
    let id = vm["id"].as_str().unwrap();
    let (status, listed) = s.get("/v1/vms", "reader-a").await;
    assert_eq!((status, listed["vms"][0]["id"].as_str()), (200, Some(id)), "{listed}");
    assert_eq!(s.get(&format!("/v1/vms/{id}"), "reader-a").await.0, 200);
    // Project B's member neither lists nor sees project A's.
    let (status, listed) = s.get("/v1/vms", "tenant-b").await;
    assert_eq!((status, &listed), (200, &json!({ "vms": [] })));
    assert_eq!(s.get(&format!("/v1/vms/{id}"), "tenant-b").await.0, 404);

    let (_, hosts) = s.get("/v1/hosts", "system-admin").await;
    let drain = format!("/v1/hosts/{}/drain", hosts["hosts"][0]["name"].as_str().unwrap());
    let (status, problem) = s.call(Method::POST, &drain, "tenant-admin", None).await;
    assert_eq!(status, 403, "{problem}");
    assert_eq!(s.call(Method::POST, &drain, "system-admin", None).await.0, 200);
    assert_eq!(s.call(Method::POST, &drain, "tenant-a", None).await.0, 404);
    s.service.abort();
    let _ = std::fs::remove_file(file);
}

/// Keystone sign-in through gsaasd, as an attacker tries it: hostile fields never reach Keystone,
/// a password spray from one address is cut at its budget of Keystone requests, a refusal repeats
/// no secret, and a signed-out token stops working at once (revoked at Keystone, forgotten here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keystone_sign_in_through_gsaasd_resists_sprays_and_signs_out_for_good() {
    let s = setup_with("sign-in", |auth| auth.keystone_validations_per_minute = 6).await;
    let sign_in = |user: &str, password: &str| json!({ "password": { "user": user, "password": password }, "project": { "name": "demo" } });
    let posts = |s: &Setup| {
        let log = s.fake.log.lock().unwrap();
        log.iter().filter(|(m, p, _)| m == Method::POST && p == "/identity/v3/auth/tokens").count()
    };
    let before = posts(&s);
    // Hostile values: refused with every field named, before Keystone hears of them.
    let hostile = json!({ "password": { "user": "a\u{202e}b", "password": "x".repeat(5000) },
        "project": { "id": "p", "name": "both" } });
    let (status, problem) = s.call(Method::POST, "/v1/auth/tokens", "", Some(hostile)).await;
    assert_eq!(status, 422, "{problem}");
    let fields = crate::support::fields_at_fault(&problem);
    assert_eq!(fields, ["password.user", "password.password", "project"], "{problem}");
    assert_eq!(posts(&s), before, "hostile fields reached Keystone");

    // A secret where a field of another type belongs is not repeated.
    for hostile in [json!({ "password": "hunter2" }), json!({ "application_credential": "s3cr3t" })]
    {
        let (status, problem) = s.call(Method::POST, "/v1/auth/tokens", "", Some(hostile)).await;
        assert_eq!(status, 422, "{problem}");
        for secret in ["hunter2", "s3cr3t"] {
            assert!(!problem.to_string().contains(secret), "{problem}");
        }
    }
    // A wrong password: 401, Keystone's reason, never the password; one attempt at Keystone
    // (its lockout counts them), although a project was named.
    let (status, problem) =
        s.call(Method::POST, "/v1/auth/tokens", "", Some(sign_in("alice", "hunter2"))).await;
    assert_eq!(status, 401, "{problem}");
    assert!(!problem.to_string().contains("hunter2"), "{problem}");
    assert!(problem["detail"].as_str().unwrap().contains("password"), "{problem}");
    assert_eq!(posts(&s) - before, 1, "a wrong password was tried more than once");
    // The right password and a project without a role: told apart, the first token revoked.
    let (status, problem) = s
        .call(Method::POST, "/v1/auth/tokens", "", Some(json!({
            "password": { "user": "alice", "password": "right" }, "project": { "name": "other" } })))
        .await;
    assert_eq!(status, 401, "{problem}");
    assert!(problem["detail"].as_str().unwrap().contains("no role in project other"), "{problem}");
    assert_eq!(*s.fake.revoked.lock().unwrap(), ["alice-unscoped"]);
    s.fake.revoked.lock().unwrap().clear();
    // The right one: a session with the token, the user and the project; no caching of it.
    let response = s
        .http
        .post(format!("{}/v1/auth/tokens", s.service.url()))
        .json(&sign_in("alice", "right"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 201);
    assert_eq!(response.headers()["cache-control"], "no-store");
    let session: Value = response.json().await.unwrap();
    assert_eq!(session["token"], "tenant-a", "{session}");
    assert_eq!(session["project"]["id"], PROJECT_A, "{session}");
    assert_eq!(session["admin"], false, "{session}");
    assert_eq!(session["unscoped_token"], "alice-unscoped", "{session}");
    assert!(s.fake.revoked.lock().unwrap().is_empty(), "the session's root lives on");
    // Signing out revokes the token at Keystone and it stops working here at once, although it
    // was cached.
    assert_eq!(s.get("/v1/vms", "tenant-a").await.0, 200);
    let (status, body) = s.call(Method::DELETE, "/v1/auth/tokens", "tenant-a", None).await;
    assert_eq!(status, 204, "{body}");
    assert_eq!(*s.fake.revoked.lock().unwrap(), ["tenant-a"]);
    assert_eq!(s.get("/v1/vms", "tenant-a").await.0, 401);
    // A spray from one address: cut at its budget (6 a minute, the requests above included).
    let mut statuses = Vec::new();
    for i in 0..20 {
        let body = sign_in("alice", &format!("guess-{i}"));
        statuses.push(s.call(Method::POST, "/v1/auth/tokens", "", Some(body)).await.0);
    }
    assert!(statuses.iter().filter(|s| **s == 429).count() >= 18, "{statuses:?}");
    assert!(posts(&s) - before <= 7, "Keystone heard {} sign-ins", posts(&s) - before);
    // gsaasd's own tokens never go to Keystone.
    let deletes = |s: &Setup| {
        let log = s.fake.log.lock().unwrap();
        log.iter()
            .filter(|(m, p, _)| m == Method::DELETE && p == "/identity/v3/auth/tokens")
            .count()
    };
    let jwt = s.service.app.keys.issue("alice", Some("demo"), gsaasd::auth::Role::Member, BOUND);
    let (status, problem) = s.call(Method::DELETE, "/v1/auth/tokens", &jwt, None).await;
    assert_eq!(status, 422, "{problem}");
    // With the budget spent, a sign-out still ends its session (attacks::neighbours); a token
    // Keystone does not know is already ended, and nothing is revoked.
    let (status, _) = s.call(Method::DELETE, "/v1/auth/tokens", "gAAAA-anything", None).await;
    assert_eq!(status, 204, "a sign-out is never refused for the budget");
    // The unscoped token of the sign-in that failed at its project, and the sign-out's.
    assert_eq!(deletes(&s), 2);

    s.service.abort();
}

/// Refused tokens cost Keystone one validation each, and a client sending many unknown ones is
/// told to slow down before Keystone is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_tokens_do_not_flood_keystone() {
    let s = setup_with("flood", |auth| auth.keystone_validations_per_minute = 10).await;
    assert_eq!(s.get("/v1/vms", "tenant-a").await.0, 200);
    for _ in 0..50 {
        assert_eq!(s.get("/v1/vms", "gAAAAA-bad").await.0, 401);
    }
    assert_eq!(s.validations_of("gAAAAA-bad"), 1);
    let mut statuses = Vec::new();
    for i in 0..30 {
        let (status, problem) = s.get("/v1/vms", &format!("gAAAAA-bad-{i}")).await;
        if status == 429 {
            assert_eq!(problem["code"], "rate_limited", "{problem}");
        }
        statuses.push(status);
    }
    assert_eq!(statuses.iter().filter(|s| **s == 401).count(), 8, "{statuses:?}");
    assert_eq!(statuses.iter().filter(|s| **s == 429).count(), 22, "{statuses:?}");
    // A token Keystone already vouched for is not held back.
    assert_eq!(s.get("/v1/vms", "tenant-a").await.0, 200);
    s.service.abort();
}

fn in_an_hour() -> SystemTime {
    SystemTime::now() + Duration::from_secs(3600)
}
