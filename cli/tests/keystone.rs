//! `gsaas` with OpenStack credentials, against a fake Keystone and a fake Keystone-mode gsaasd on one
//! axum server at 127.0.0.1:0.
//!
//! The fake Keystone answers `POST /identity/v3/auth/tokens` as Keystone does: 201 with the upstream
//! sample `auth-password-project-scoped-response.json` and the token in `X-Subject-Token` for the
//! right password, 401 with Keystone's error document otherwise. The fake gsaasd's `GET /v1/vms`
//! accepts only tokens that fake Keystone issued, in `X-Auth-Token`. Every `gsaas` runs with a cleared
//! environment, so the host's own `OS_*` variables and clouds.yaml never leak in.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Arc, Mutex};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};

const PASSWORD: &str = "devstacker";
const SAMPLE: &str = include_str!(
    "../../api/tests/fixtures/openstack/keystone/auth-password-project-scoped-response.json"
);
const UPSTREAM_REQUEST: &str = include_str!(
    "../../api/tests/fixtures/openstack/keystone/auth_requests_project-name-password.json"
);

#[derive(Default)]
struct Seen {
    /// Bodies of `POST /v3/auth/tokens`.
    auth_bodies: Vec<Value>,
    /// Tokens Keystone issued.
    issued: Vec<String>,
    /// (`X-Auth-Token`, `Authorization`) of each gsaasd request.
    gsaasd: Vec<(Option<String>, Option<String>)>,
}

type Shared = Arc<Mutex<Seen>>;

async fn keystone_auth(State(seen): State<Shared>, Json(body): Json<Value>) -> Response {
    let mut seen = seen.lock().unwrap();
    let ok = body["auth"]["identity"]["password"]["user"]["password"] == PASSWORD;
    seen.auth_bodies.push(body);
    if !ok {
        let error = json!({"error": {"code": 401, "title": "Unauthorized",
            "message": "The request you have made requires authentication."}});
        return (StatusCode::UNAUTHORIZED, Json(error)).into_response();
    }
    let token = format!("gAAAAAB-keystone-token-{}", seen.issued.len());
    seen.issued.push(token.clone());
    let body: Value = serde_json::from_str(SAMPLE).unwrap();
    (StatusCode::CREATED, [("x-subject-token", token)], Json(body)).into_response()
}

async fn gsaasd_vms(State(seen): State<Shared>, headers: HeaderMap) -> Response {
    let header = |name| headers.get(name).and_then(|v| v.to_str().ok()).map(str::to_owned);
    let mut seen = seen.lock().unwrap();
    let (token, authorization) = (header("x-auth-token"), header("authorization"));
    seen.gsaasd.push((token.clone(), authorization));
    let known = token.is_some_and(|t| seen.issued.contains(&t) || t == "os-token-from-env");
    if known {
        Json(json!({"vms": []})).into_response()
    } else {
        let problem = json!({"status": 401, "detail": "unknown Keystone token"});
        (StatusCode::UNAUTHORIZED, Json(problem)).into_response()
    }
}

struct Fake {
    _runtime: tokio::runtime::Runtime,
    addr: SocketAddr,
    seen: Shared,
    dir: PathBuf,
}

impl Fake {
    fn start(name: &str) -> Fake {
        let dir =
            std::env::temp_dir().join(format!("gsaas-keystone-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("cwd")).unwrap();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let seen = Shared::default();
        let app = Router::new()
            .route("/identity/v3/auth/tokens", post(keystone_auth))
            .route("/v1/vms", get(gsaasd_vms))
            .with_state(seen.clone());
        let listener =
            runtime.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).expect("binds");
        let addr = listener.local_addr().unwrap();
        runtime.spawn(async move { axum::serve(listener, app).await });
        Fake { _runtime: runtime, addr, seen, dir }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn auth_url(&self) -> String {
        format!("http://{}/identity", self.addr)
    }

    /// `gsaas list -f json` with only `env` (plus GSAAS_URL and HOME), run in an empty directory.
    fn gsaas(&self, env: &[(&str, &str)]) -> Output {
        self.gsaas_in(&self.dir.join("cwd"), env)
    }

    fn gsaas_in(&self, cwd: &Path, env: &[(&str, &str)]) -> Output {
        let url = self.url();
        self.run(
            cwd,
            &[("GSAAS_URL", url.as_str())]
                .into_iter()
                .chain(env.iter().copied())
                .collect::<Vec<_>>(),
        )
    }

    /// `gsaas list -f json` with only `env` (and HOME): no URL, so gsaasd is looked up in the
    /// catalog.
    fn run(&self, cwd: &Path, env: &[(&str, &str)]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_gsaas"))
            .args(["-f", "json", "list"])
            .env_clear()
            .env("HOME", &self.dir)
            .envs(env.iter().copied())
            .current_dir(cwd)
            .output()
            .expect("gsaas runs")
    }

    fn seen(&self) -> std::sync::MutexGuard<'_, Seen> {
        self.seen.lock().unwrap()
    }
}

impl Drop for Fake {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn listed(output: &Output) -> Value {
    assert!(output.status.success(), "{}", stderr(output));
    serde_json::from_slice(&output.stdout).unwrap()
}

fn fails(output: &Output, code: i32, says: &[&str]) {
    let message = stderr(output);
    assert_eq!(output.status.code(), Some(code), "{message}");
    assert_eq!(message.trim_end().lines().count(), 1, "one line: {message}");
    for s in says {
        assert!(message.contains(s), "{s:?} not in {message}");
    }
}

#[test]
fn plain_os_variables_get_a_scoped_token_sent_as_x_auth_token() {
    let fake = Fake::start("plain");
    let output = fake.gsaas(&[
        ("OS_AUTH_URL", &fake.auth_url()),
        ("OS_USERNAME", "alice"),
        ("OS_PASSWORD", PASSWORD),
        ("OS_PROJECT_NAME", "demo"),
        ("OS_USER_DOMAIN_NAME", "Default"),
        ("OS_PROJECT_DOMAIN_ID", "default"),
    ]);
    assert_eq!(listed(&output), json!({"vms": []}));
    let seen = fake.seen();
    assert_eq!(
        seen.auth_bodies,
        vec![json!({"auth": {
            "identity": {"methods": ["password"], "password": {"user": {
                "name": "alice", "domain": {"name": "Default"}, "password": PASSWORD}}},
            "scope": {"project": {"name": "demo", "domain": {"id": "default"}}},
        }})]
    );
    assert_eq!(seen.gsaasd, vec![(Some(seen.issued[0].clone()), None)]);
}

/// Without a URL, gsaas looks for gsaasd in the catalog and says plainly when it is not there
/// (the sample catalog has no `gpu-scheduling` service), or when OS_TOKEN comes without
/// OS_AUTH_URL to ask for its catalog. (Found in a real catalog: `api/tests/openstack.rs`.)
#[test]
fn without_a_url_gsaasd_is_looked_up_in_the_catalog() {
    let fake = Fake::start("catalog");
    let cwd = fake.dir.join("cwd");
    let auth_url = fake.auth_url();
    let password = [
        ("OS_AUTH_URL", auth_url.as_str()),
        ("OS_USERNAME", "alice"),
        ("OS_PASSWORD", PASSWORD),
        ("OS_PROJECT_NAME", "demo"),
    ];
    fails(&fake.run(&cwd, &password), 2, &["has no gpu-scheduling service", "--url"]);
    fails(&fake.run(&cwd, &[("OS_TOKEN", "os-token-from-env")]), 2, &["OS_AUTH_URL", "--url"]);
    let mut bad_interface = password.to_vec();
    bad_interface.push(("OS_INTERFACE", "sideways"));
    fails(&fake.run(&cwd, &bad_interface), 2, &["sideways"]);
    // gsaasd was never called.
    assert!(fake.seen().gsaasd.is_empty());
}

#[test]
fn os_cloud_reads_clouds_yaml_in_openstacksdks_order() {
    let fake = Fake::start("cloud");
    // The upstream request's credentials, as a clouds.yaml entry.
    let yaml = format!(
        "clouds:\n  devstack:\n    auth:\n      auth_url: {}\n      user_id: ee4dfb6e5540447cb3741905149d9b6e\n      \
         password: {PASSWORD}\n      project_name: admin\n      project_domain_id: default\n    \
         identity_api_version: 3\n  other:\n    auth:\n      auth_url: http://127.0.0.1:9\n",
        fake.auth_url()
    );
    let upstream: Value = serde_json::from_str(UPSTREAM_REQUEST).unwrap();

    // ~/.config/openstack/clouds.yaml.
    let home_yaml = fake.dir.join(".config/openstack/clouds.yaml");
    std::fs::create_dir_all(home_yaml.parent().unwrap()).unwrap();
    std::fs::write(&home_yaml, &yaml).unwrap();
    assert_eq!(listed(&fake.gsaas(&[("OS_CLOUD", "devstack")])), json!({"vms": []}));
    assert_eq!(fake.seen().auth_bodies.last(), Some(&upstream));

    // ./clouds.yaml comes before it: here one whose password Keystone refuses.
    let cwd = fake.dir.join("project");
    std::fs::create_dir_all(&cwd).unwrap();
    std::fs::write(cwd.join("clouds.yaml"), yaml.replace(PASSWORD, "wrong")).unwrap();
    fails(
        &fake.gsaas_in(&cwd, &[("OS_CLOUD", "devstack")]),
        5,
        &["Keystone refused", "clouds.yaml"],
    );
    // ... and an OS_* variable overrides the file's field.
    let output = fake.gsaas_in(&cwd, &[("OS_CLOUD", "devstack"), ("OS_PASSWORD", PASSWORD)]);
    assert_eq!(listed(&output), json!({"vms": []}));

    // OS_CLIENT_CONFIG_FILE comes first of all.
    let explicit = fake.dir.join("explicit.yaml");
    std::fs::write(&explicit, yaml.replace("devstack:", "explicit:")).unwrap();
    let output = fake.gsaas_in(
        &cwd,
        &[("OS_CLOUD", "explicit"), ("OS_CLIENT_CONFIG_FILE", explicit.to_str().unwrap())],
    );
    assert_eq!(listed(&output), json!({"vms": []}));

    let seen = fake.seen();
    assert_eq!(seen.auth_bodies.len(), 4);
    assert_eq!(seen.issued.len(), 3);
    let tokens: Vec<_> =
        seen.gsaasd.iter().map(|(t, a)| (t.clone().unwrap(), a.is_none())).collect();
    assert_eq!(tokens, seen.issued.iter().map(|t| (t.clone(), true)).collect::<Vec<_>>());
}

#[test]
fn os_token_is_sent_and_a_gsaas_token_wins() {
    let fake = Fake::start("token");
    let output =
        fake.gsaas(&[("OS_TOKEN", "os-token-from-env"), ("OS_AUTH_URL", "http://127.0.0.1:9")]);
    assert_eq!(listed(&output), json!({"vms": []}));
    // GSAAS_TOKEN comes first: sent as a bearer token, Keystone not asked.
    let output = fake.gsaas(&[
        ("GSAAS_TOKEN", "a-gsaasd-jwt"),
        ("OS_AUTH_URL", &fake.auth_url()),
        ("OS_USERNAME", "alice"),
        ("OS_PASSWORD", PASSWORD),
        ("OS_PROJECT_ID", "a6944d763bf64ee6a275f1263fae0352"),
    ]);
    fails(&output, 5, &["authentication failed"]);
    let seen = fake.seen();
    assert!(seen.auth_bodies.is_empty());
    assert_eq!(
        seen.gsaasd,
        vec![(Some("os-token-from-env".into()), None), (None, Some("Bearer a-gsaasd-jwt".into()))]
    );
}

#[test]
fn refused_unreachable_and_incomplete_credentials_have_their_exit_codes() {
    let fake = Fake::start("errors");
    let auth_url = fake.auth_url();
    let full = |password| {
        vec![
            ("OS_AUTH_URL", auth_url.clone()),
            ("OS_USERNAME", "alice".to_owned()),
            ("OS_PASSWORD", password),
            ("OS_PROJECT_NAME", "demo".to_owned()),
        ]
    };
    let run = |env: &[(&str, String)]| {
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        fake.gsaas(&env)
    };
    // 401 from Keystone.
    fails(
        &run(&full("wrong".into())),
        5,
        &["Keystone refused", "HTTP 401", "requires authentication"],
    );
    // Keystone unreachable (nothing listens on port 9 of the loopback).
    let mut env = full(PASSWORD.into());
    env[0].1 = "http://127.0.0.1:9/v3".into();
    fails(&run(&env), 6, &["cannot reach Keystone at http://127.0.0.1:9/v3/auth/tokens"]);
    // Missing fields, named.
    for (drop, named) in [
        ("OS_PASSWORD", "OS_PASSWORD"),
        ("OS_USERNAME", "OS_USERNAME"),
        ("OS_PROJECT_NAME", "OS_PROJECT_NAME"),
    ] {
        let env: Vec<_> = full(PASSWORD.into()).into_iter().filter(|(k, _)| *k != drop).collect();
        fails(&run(&env), 2, &["incomplete OpenStack credentials", named]);
    }
    // A clouds.yaml without a password, and a cloud no clouds.yaml has: the path is named.
    let yaml = fake.dir.join("clouds.yaml");
    std::fs::write(&yaml, format!("clouds:\n  nopass:\n    auth:\n      auth_url: {auth_url}\n      username: alice\n      project_name: demo\n")).unwrap();
    let path = yaml.to_str().unwrap().to_owned();
    let cloud =
        |name: &str| vec![("OS_CLOUD", name.to_owned()), ("OS_CLIENT_CONFIG_FILE", path.clone())];
    fails(&run(&cloud("nopass")), 2, &["password", &path]);
    fails(&run(&cloud("absent")), 2, &["no cloud named \"absent\"", &path]);
    let home_yaml = fake.dir.join(".config/openstack/clouds.yaml");
    fails(&run(&[("OS_CLOUD", "x".into())]), 2, &["no clouds.yaml", home_yaml.to_str().unwrap()]);
    // Nothing at all: the no-token message names both ways.
    fails(&run(&[]), 5, &["GSAAS_TOKEN", "OS_CLOUD"]);
    // Only the 401 attempt reached Keystone; gsaasd was never called.
    let seen = fake.seen();
    assert_eq!(seen.auth_bodies.len(), 1);
    assert!(seen.gsaasd.is_empty());
}

#[test]
fn help_documents_openstack_credentials() {
    let output = Command::new(env!("CARGO_BIN_EXE_gsaas")).arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&output.stdout);
    for s in ["OS_CLOUD", "clouds.yaml", "OS_AUTH_URL", "X-Auth-Token", "Keystone"] {
        assert!(help.contains(s), "{s} not in {help}");
    }
}
