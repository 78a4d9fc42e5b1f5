//! The agent's HTTP API in process, over the in-memory firewall: auth, validation, generation
//! rules, read-back, and restoring from the state file.

use gsaas_test_support as support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use gpgpums::ids::HostId;
use gsaas_infra::httpd::{self, HttpLimits};
use rodvr_contract::auth::{TokenSigner, TokenVerifier};
use rodvr_contract::client::AgentClient;
use rodvr_contract::fixtures::route;
use rodvr_contract::protocol::{ApplyOutcome, HostKind, RouteTable};
use rodvr_core::agent::{Agent, HostFacts};
use rodvr_core::firewall::{Dataplane, MemoryFirewall};
use rodvr_core::fixtures::params;
use rodvr_core::state::Ledger;
use support::{key_pair, TempDir};

fn new_agent(state: &TempDir) -> Arc<Agent<MemoryFirewall>> {
    let ledger = Ledger::load(state.path().join("routes.json")).unwrap();
    let facts = HostFacts {
        host: HostId::new("crg0").unwrap(),
        kind: HostKind::ComputeRgpu,
        agent_url: "http://agent".into(),
        gpus: vec![],
        topology: Default::default(),
        gpu_address: None,
        local_vms: None,
    };
    Arc::new(Agent::new(ledger, Dataplane::new(MemoryFirewall::new(), params()), facts))
}

fn crg0() -> HostId {
    HostId::new("crg0").unwrap()
}

/// A client for the agent of host crg0, signing with the controller key `private`.
fn client_for(addr: SocketAddr, private: &str) -> AgentClient {
    let signer = TokenSigner::from_private_pem(private.as_bytes(), "gsaasd").unwrap();
    AgentClient::new(format!("http://{addr}"), crg0(), signer)
}

async fn serve(agent: Arc<Agent<MemoryFirewall>>, public_pem: &str) -> SocketAddr {
    serve_with(agent, public_pem, HttpLimits::default()).await
}

async fn serve_with(
    agent: Arc<Agent<MemoryFirewall>>,
    public_pem: &str,
    limits: HttpLimits,
) -> SocketAddr {
    serve_tls(agent, public_pem, limits, None).await
}

async fn serve_tls(
    agent: Arc<Agent<MemoryFirewall>>,
    public_pem: &str,
    limits: HttpLimits,
    tls: Option<httpd::TlsFiles>,
) -> SocketAddr {
    let tls = tls.map(|files| files.acceptor().unwrap());
    let verifier = TokenVerifier::from_public_pem(public_pem.as_bytes(), crg0()).unwrap();
    let verifier = Arc::new(verifier);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = rodvr_agent::server::router(agent, verifier, limits.body_timeout());
    let forever = std::future::pending();
    tokio::spawn(async move { httpd::serve(listener, app, limits, tls, forever).await.unwrap() });
    addr
}

/// A route of VM `vm`, on tap `tap<vm>`.
fn table(generation: u64) -> RouteTable {
    RouteTable {
        generation,
        routes: vec![
            route(1, "tap1", "10.0.0.2", "100.127.0.1:9000", "10.1.0.2:8308"),
            route(2, "tap2", "10.0.0.3", "100.127.0.1:9000", "10.1.0.2:8309"),
        ],
        metadata: None,
        vms_without_cgpus: vec![],
        lost: vec![],
        servers: vec![],
    }
}

#[tokio::test]
async fn only_the_controller_changes_anything() {
    let state = TempDir::new("api-auth");
    let (private, public) = key_pair(11);
    let (impostor, _) = key_pair(12);
    let agent = new_agent(&state);
    let addr = serve(agent.clone(), &public).await;
    let http = reqwest::Client::new();
    let url = format!("http://{addr}/v1/routes");

    let forged = TokenSigner::from_private_pem(impostor.as_bytes(), "x").unwrap();
    let signer = TokenSigner::from_private_pem(private.as_bytes(), "gsaasd").unwrap();
    let minute = Duration::from_secs(60);
    let wrong_audience = signer.sign_for("gsaasd", &crg0(), minute);
    // A genuine controller token, but made out to another host's agent: what a compromised host
    // (or an address gsaasd was misled to) would replay here.
    let other_host = signer.sign(&HostId::new("crg1").unwrap(), minute);
    let forged = forged.sign(&crg0(), minute);
    for auth in [None, Some(forged), Some(wrong_audience), Some(other_host)] {
        let mut req = http.put(&url).json(&table(1));
        if let Some(token) = &auth {
            req = req.bearer_auth(token);
        }
        assert_eq!(req.send().await.unwrap().status(), 401, "token {auth:?}");
        let mut req = http.get(format!("http://{addr}/v1/routes"));
        if let Some(token) = &auth {
            req = req.bearer_auth(token);
        }
        assert_eq!(req.send().await.unwrap().status(), 401, "read-back with token {auth:?}");
        let resp = http.get(format!("http://{addr}/v1/health")).send().await.unwrap();
        assert_eq!(resp.status(), 401);
    }
    assert_eq!(agent.with_firewall(|fw| fw.transactions()), 0);
    assert!(agent.state().desired.is_none());
    assert!(!state.path().join("routes.json").exists());

    let client = AgentClient::new(format!("http://{addr}"), crg0(), signer);
    assert_eq!(client.put_routes(&table(1)).await.unwrap().outcome, ApplyOutcome::Applied);
    assert_eq!(client.health().await.unwrap().applied_generation, Some(1));
}

/// The skew policy (rodvr-contract's `version`): a controller may be this agent's protocol or
/// one above it; one further ahead (this agent two versions behind) or behind it (an agent
/// upgraded before gsaasd, as a gsaasd of before the header, protocol 1, is) is refused with 409
/// saying which side to upgrade, and nothing is applied; every answer says the agent's protocol.
#[tokio::test]
async fn controllers_outside_the_skew_policy_are_refused_before_anything_is_applied() {
    use rodvr_contract::version::{HEADER, PROTOCOL};
    let state = TempDir::new("api-skew");
    let (private, public) = key_pair(13);
    let agent = new_agent(&state);
    let addr = serve(agent.clone(), &public).await;
    let signer = TokenSigner::from_private_pem(private.as_bytes(), "gsaasd").unwrap();
    let http = reqwest::Client::new();
    let token = signer.sign(&crg0(), Duration::from_secs(60));
    let put = |protocol: Option<String>| {
        let mut req =
            http.put(format!("http://{addr}/v1/routes")).bearer_auth(&token).json(&table(1));
        if let Some(p) = protocol {
            req = req.header(HEADER, p);
        }
        req.send()
    };
    for (protocol, says) in [
        (PROTOCOL + 2, "upgrade the agent"),
        (PROTOCOL - 1, "upgrade gsaasd first"),
        (u32::MAX, "upgrade the agent"),
    ] {
        let answer = put(Some(protocol.to_string())).await.unwrap();
        assert_eq!(answer.status(), 409, "controller protocol {protocol}");
        assert_eq!(answer.headers()[HEADER], PROTOCOL.to_string().as_str());
        let body: serde_json::Value = answer.json().await.unwrap();
        assert!(body["error"].as_str().unwrap().contains(says), "{protocol}: {body}");
    }
    for unversioned in [Some("two".to_owned()), None] {
        let answer = put(unversioned.clone()).await.unwrap();
        assert_eq!(answer.status(), 409, "{unversioned:?}");
    }
    assert_eq!(agent.with_firewall(|fw| fw.transactions()), 0, "nothing applied");
    // Its own protocol, and one version ahead: taken.
    assert_eq!(put(Some(PROTOCOL.to_string())).await.unwrap().status(), 200);
    let ahead = put(Some((PROTOCOL + 1).to_string())).await.unwrap();
    assert_eq!(ahead.status(), 200);
}

#[tokio::test]
async fn bad_tables_and_stale_generations_change_nothing() {
    let state = TempDir::new("api-gen");
    let (private, public) = key_pair(13);
    let agent = new_agent(&state);
    let addr = serve(agent.clone(), &public).await;
    let signer = TokenSigner::from_private_pem(private.as_bytes(), "gsaasd").unwrap();
    let client = client_for(addr, &private);

    assert_eq!(client.put_routes(&table(5)).await.unwrap().outcome, ApplyOutcome::Applied);
    assert_eq!(client.put_routes(&table(5)).await.unwrap().outcome, ApplyOutcome::Unchanged);

    let mut dup = table(6);
    dup.routes.push(route(1, "tap1", "10.0.0.2", "100.127.0.1:9000", "10.1.0.2:8310"));
    let err = client.put_routes(&dup).await.unwrap_err();
    assert_eq!(err.status(), Some(422));
    assert!(err.to_string().contains("routes[2].masked"), "{err}");

    let mut outside = table(6);
    outside.routes[1].masked = "192.0.2.1:9000".parse().unwrap();
    let err = client.put_routes(&outside).await.unwrap_err();
    assert!(err.to_string().contains("routes[1].masked"), "{err}");

    let raw = r#"{"generation": 6, "routes": [{"vm": "00000000-0000-0000-0000-000000000001",
        "vm_ip": "10.0.0.2", "masked": "100.127.0.1:9000", "target": "10.1.0.2:65536"}]}"#;
    let resp = reqwest::Client::new()
        .put(format!("http://{addr}/v1/routes"))
        .bearer_auth(signer.sign(&crg0(), Duration::from_secs(60)))
        .header(rodvr_contract::version::HEADER, rodvr_contract::version::PROTOCOL)
        .header("content-type", "application/json")
        .body(raw)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
    assert!(resp.text().await.unwrap().contains("routes[0].target"));

    let mut different = table(5);
    different.routes.pop();
    assert_eq!(client.put_routes(&different).await.unwrap_err().status(), Some(409));
    assert_eq!(client.put_routes(&table(4)).await.unwrap_err().status(), Some(409));

    let back = client.routes().await.unwrap();
    assert_eq!(back.desired, Some(table(5)));
    assert_eq!(back.applied_generation, Some(5));
    assert_eq!(agent.with_firewall(|fw| fw.table().unwrap().routes.len()), 2);

    // A change of one route is one element transaction, not a table rebuild.
    let mut next = table(7);
    next.routes[1].target = "10.1.0.2:8311".parse().unwrap();
    let before = agent.with_firewall(|fw| fw.transactions());
    client.put_routes(&next).await.unwrap();
    let masked = "100.127.0.1:9000".parse().unwrap();
    let src = "10.0.0.3".parse().unwrap();
    assert_eq!(
        agent.with_firewall(|fw| (fw.transactions(), fw.resolve(src, "tap2", masked))),
        (before + 1, Some("10.1.0.2:8311".parse().unwrap()))
    );
    assert_eq!(client.host().await.unwrap().kind, HostKind::ComputeRgpu);
}

#[tokio::test]
async fn a_restarted_agent_restores_its_table_from_the_state_file() {
    let state = TempDir::new("api-restart");
    let (private, public) = key_pair(14);
    let first = new_agent(&state);
    let addr = serve(first, &public).await;
    let client = client_for(addr, &private);
    client.put_routes(&table(3)).await.unwrap();

    let second = new_agent(&state);
    assert!(second.needs_apply());
    second.reapply().unwrap();
    assert!(!second.needs_apply());
    let masked = "100.127.0.1:9000".parse().unwrap();
    assert_eq!(
        second.with_firewall(|fw| fw.resolve("10.0.0.2".parse().unwrap(), "tap1", masked)),
        Some("10.1.0.2:8308".parse().unwrap())
    );
    assert_eq!(second.state().applied_generation, Some(3));
}

#[tokio::test]
async fn the_agent_registers_with_its_own_token() {
    use axum::extract::{Path, State};
    use axum::http::HeaderMap;
    use rodvr_contract::client::ControllerClient;
    use rodvr_contract::protocol::HostReport;

    type Seen = tokio::sync::mpsc::UnboundedSender<(String, Option<String>, HostReport)>;
    async fn put_host(
        State(seen): State<Seen>,
        Path(host): Path<String>,
        headers: HeaderMap,
        axum::Json(report): axum::Json<HostReport>,
    ) -> axum::http::StatusCode {
        let auth = headers.get("authorization").and_then(|v| v.to_str().ok()).map(String::from);
        seen.send((host, auth, report)).unwrap();
        axum::http::StatusCode::NO_CONTENT
    }
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let app = support::agents::as_controller(
        axum::Router::new().route("/v1/hosts/{host}", axum::routing::put(put_host)).with_state(tx),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    let state = TempDir::new("api-register");
    let report = new_agent(&state).host_report();
    let client = ControllerClient::new(format!("http://{addr}/"), "agent-secret");
    client.register(&report).await.unwrap();
    let (host, auth, got) = rx.recv().await.unwrap();
    assert_eq!(host, "crg0");
    assert_eq!(auth.as_deref(), Some("Bearer agent-secret"));
    assert_eq!(got, report);

    // An unreachable controller is a transport error (no status) that the heartbeat loop logs.
    let err = ControllerClient::new("http://127.0.0.1:1", "x").register(&got).await.unwrap_err();
    assert_eq!(err.status(), None, "{err}");
}

#[tokio::test]
async fn metrics_parse_and_count_applies_and_refusals_without_a_token() {
    let state = TempDir::new("api-metrics");
    let (private, public) = key_pair(21);
    let agent = new_agent(&state);
    let addr = serve(agent.clone(), &public).await;
    let client = client_for(addr, &private);
    client.put_routes(&table(3)).await.unwrap();
    assert!(client.put_routes(&table(2)).await.is_err(), "an older generation is refused");

    let response = reqwest::get(format!("http://{addr}/metrics")).await.unwrap();
    assert_eq!(response.status(), 200, "Prometheus scrapes without the controller's key");
    let text = response.text().await.unwrap();
    let scrape = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_owned())))
        .expect("valid exposition");
    let value = |name: &str, label: Option<(&str, &str)>| -> f64 {
        let sample = scrape
            .samples
            .iter()
            .find(|s| s.metric == name && label.is_none_or(|(k, v)| s.labels.get(k) == Some(v)))
            .unwrap_or_else(|| panic!("no {name} in {text}"));
        match sample.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => v,
            ref other => panic!("{name}: {other:?}"),
        }
    };
    assert_eq!(value("rodvr_applied_routes", None), 2.0);
    assert_eq!(value("rodvr_applied_generation", None), 3.0);
    assert_eq!(value("rodvr_applies_total", Some(("outcome", "ok"))), 1.0);
    assert_eq!(value("rodvr_applies_total", Some(("outcome", "failed"))), 0.0);
    assert_eq!(value("rodvr_tables_refused_total", None), 1.0);
    assert!(text.contains("rodvr_apply_seconds_count{kind=\"update\"} 1\n"), "{text}");
    // The token still guards everything else.
    assert_eq!(reqwest::get(format!("http://{addr}/v1/routes")).await.unwrap().status(), 401);
}

/// A JWT-shaped token with these claims; the agent reads only `iat` and `exp` of its own token.
fn jwt(iat: u64, exp: u64) -> String {
    use base64::Engine;
    let b64 = |v: serde_json::Value| {
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string())
    };
    let header = b64(serde_json::json!({"alg": "EdDSA", "typ": "JWT"}));
    let claims = b64(serde_json::json!({"sub": "crg0", "iat": iat, "exp": exp}));
    format!("{header}.{claims}.c2ln")
}

#[tokio::test]
async fn the_agent_renews_its_token_at_half_life_and_keeps_the_renewal() {
    use axum::extract::{Path, State};
    use axum::http::HeaderMap;
    use std::io::BufRead;
    use std::time::{SystemTime, UNIX_EPOCH};

    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs();
    let (old, fresh) = (jwt(now - 200, now + 100), jwt(now, now + 86_400));
    // A controller that records who registers with which token, and renews any token to `fresh`.
    type Seen = tokio::sync::mpsc::UnboundedSender<(&'static str, String)>;
    fn bearer(headers: &HeaderMap) -> String {
        let auth = headers.get("authorization").and_then(|v| v.to_str().ok()).unwrap_or("");
        auth.trim_start_matches("Bearer ").to_owned()
    }
    async fn put_host(State((seen, _)): State<(Seen, String)>, headers: HeaderMap) -> &'static str {
        seen.send(("register", bearer(&headers))).unwrap();
        "{}"
    }
    async fn renew(
        State((seen, fresh)): State<(Seen, String)>,
        Path(host): Path<String>,
        headers: HeaderMap,
    ) -> axum::Json<serde_json::Value> {
        assert_eq!(host, "crg0");
        seen.send(("renew", bearer(&headers))).unwrap();
        axum::Json(serde_json::json!({ "token": fresh }))
    }
    let (tx, mut seen) = tokio::sync::mpsc::unbounded_channel();
    let app = support::agents::as_controller(
        axum::Router::new()
            .route("/v1/hosts/{host}", axum::routing::put(put_host))
            .route("/v1/hosts/{host}/token", axum::routing::post(renew))
            .with_state((tx, fresh.clone())),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let controller = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    let dir = TempDir::new("api-renew");
    let (_, public) = key_pair(31);
    std::fs::write(dir.path().join("controller.pub.pem"), public).unwrap();
    let config = dir.path().join("agent.toml");
    std::fs::write(
        &config,
        format!(
            r#"host = "crg0"
listen = "127.0.0.1:0"
state_file = "{d}/routes.json"
controller_public_key = "{d}/controller.pub.pem"
masked_range = "100.127.0.0/16"
gpu_interface = "gpu0"
nft_command = ["true"]
[controller]
url = "http://{controller}"
token = "{old}"
heartbeat_interval_secs = 1
"#,
            d = dir.path().display()
        ),
    )
    .unwrap();
    let start = || {
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_rodvr-agent"))
            .arg("--config")
            .arg(&config)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        assert!(line.starts_with("rodvr-agent listening on"), "{line}");
        KillOnDrop(child)
    };
    struct KillOnDrop(std::process::Child);
    impl Drop for KillOnDrop {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let recv = async |seen: &mut tokio::sync::mpsc::UnboundedReceiver<(&'static str, String)>| {
        tokio::time::timeout(Duration::from_secs(10), seen.recv()).await.unwrap().unwrap()
    };

    // Past half of its life, the token is renewed before the first heartbeat, and every
    // heartbeat after presents the renewal.
    let agent = start();
    assert_eq!(recv(&mut seen).await, ("renew", old.clone()));
    assert_eq!(recv(&mut seen).await, ("register", fresh.clone()));
    assert_eq!(recv(&mut seen).await, ("register", fresh.clone()));
    let kept = dir.path().join("controller-token");
    assert_eq!(std::fs::read_to_string(&kept).unwrap(), fresh);
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&kept).unwrap().permissions().mode() & 0o777, 0o600);
    drop(agent);

    // Restarted with the old token still in its config, it uses the renewal it kept.
    while seen.try_recv().is_ok() {}
    let _agent = start();
    assert_eq!(recv(&mut seen).await, ("register", fresh));
}

#[tokio::test]
async fn clients_that_stall_are_cut_off_and_the_agent_keeps_serving() {
    let state = TempDir::new("api-slow");
    let (private, public) = key_pair(41);
    let limits = HttpLimits {
        header_timeout_secs: 1,
        body_timeout_secs: 1,
        max_connections: 8,
        max_connections_per_client: 8,
        ..HttpLimits::default()
    };
    let addr = serve_with(new_agent(&state), &public, limits).await;
    let signer = TokenSigner::from_private_pem(private.as_bytes(), "gsaasd").unwrap();
    let token = signer.sign(&crg0(), Duration::from_secs(600));
    // Headers that never end, and (with a valid token) a body that never comes: five times as
    // many as the agent serves at once.
    let headers =
        support::slow::stall(addr, b"GET /v1/routes HTTP/1.1\r\nHost: agent\r\n", 30).await;
    let body = format!(
        "PUT /v1/routes HTTP/1.1\r\nHost: agent\r\nAuthorization: Bearer {token}\r\n\
         Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{{\"generation\""
    );
    let bodies = support::slow::stall(addr, body.as_bytes(), 10).await;
    let limit = Duration::from_secs(30);
    assert_eq!(support::slow::still_open_after(headers, limit).await, 0, "stalled headers");
    assert_eq!(support::slow::still_open_after(bodies, limit).await, 0, "stalled bodies");
    let client = client_for(addr, &private);
    assert_eq!(client.put_routes(&table(1)).await.unwrap().outcome, ApplyOutcome::Applied);
}

#[tokio::test]
async fn over_tls_the_agent_and_the_controller_trust_only_the_configured_ca() {
    use support::certs::Ca;
    let state = TempDir::new("api-tls");
    let (private, public) = key_pair(51);
    let ca = Ca::new("gsaas test CA");
    let (ca_path, cert, key) = ca.write(state.path(), "agent", &["127.0.0.1", "localhost"]);
    let agent = new_agent(&state);
    let tls = Some(httpd::TlsFiles { cert, key });
    let addr = serve_tls(agent.clone(), &public, HttpLimits::default(), tls).await;
    let signer = TokenSigner::from_private_pem(private.as_bytes(), "gsaasd").unwrap();
    let client = |ca: &std::path::Path| {
        let http = httpd::http_client(Some(ca)).unwrap();
        AgentClient::with_http(http, format!("https://{addr}"), crg0(), signer.clone())
    };
    assert_eq!(
        client(&ca_path).put_routes(&table(1)).await.unwrap().outcome,
        ApplyOutcome::Applied
    );

    // A controller that trusts another CA does not talk to this agent; an agent whose certificate
    // another CA signed (an impostor at the agent's address) gets no token from the controller.
    let other = Ca::new("another CA");
    let (other_ca, other_cert, other_key) =
        other.write(state.path(), "impostor", &["127.0.0.1", "localhost"]);
    let err = client(&other_ca).put_routes(&table(2)).await.unwrap_err();
    assert_eq!(err.status(), None, "a TLS failure, not an answer: {err}");
    let impostor = new_agent(&TempDir::new("api-tls-impostor"));
    let tls = Some(httpd::TlsFiles { cert: other_cert, key: other_key });
    let impostor_addr = serve_tls(impostor.clone(), &public, HttpLimits::default(), tls).await;
    let http = httpd::http_client(Some(&ca_path)).unwrap();
    let to_impostor =
        AgentClient::with_http(http, format!("https://{impostor_addr}"), crg0(), signer.clone());
    assert_eq!(to_impostor.routes().await.unwrap_err().status(), None);
    assert_eq!(impostor.with_firewall(|fw| fw.transactions()), 0);
    // Plain HTTP to the TLS port gets no answer.
    let plain = AgentClient::new(format!("http://{addr}"), crg0(), signer.clone());
    assert_eq!(plain.routes().await.unwrap_err().status(), None);
    assert_eq!(agent.state().desired, Some(table(1)));

    // A CA bundle that is missing or holds no certificate is refused, naming the file.
    let missing = state.path().join("missing.pem");
    assert!(httpd::http_client(Some(&missing)).unwrap_err().to_string().contains("missing.pem"));
    let empty = state.path().join("empty.pem");
    std::fs::write(&empty, "no certificate here").unwrap();
    assert!(httpd::http_client(Some(&empty)).unwrap_err().to_string().contains("empty.pem"));
}

/// `rodvr-agent --version` names the version and the commit it was built from (this checkout's,
/// or `unknown` outside git); a wrong argument names `--version` among the usages.
#[test]
fn version_names_the_commit() {
    let run = |arg: &str| {
        std::process::Command::new(env!("CARGO_BIN_EXE_rodvr-agent")).arg(arg).output().unwrap()
    };
    let commit = support::checkout_commit();
    let out = run("--version");
    assert!(out.status.success());
    let want = format!("rodvr-agent {} (commit {commit})", env!("CARGO_PKG_VERSION"));
    assert_eq!(String::from_utf8(out.stdout).unwrap().trim(), want);
    let out = run("--bogus");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("rodvr-agent --version"));
}
