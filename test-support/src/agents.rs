//! Host agents for tests with `[hosts] backend = "agent"`: a real agent core over the in-memory
//! firewall behind its real HTTP API, which a test can turn hostile, and which counts the requests
//! it gets (so a test can tell that gsaasd never called it).

use std::net::SocketAddrV4;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use gpgpums::HostId;
use gsaas_infra::httpd::{self, HttpLimits, TlsFiles};
use rodvr_contract::auth::TokenVerifier;
use rodvr_contract::protocol::{AppliedState, ErrorBody, GpuEnv, HostKind, RouteTable};
use rodvr_core::agent::{Agent, HostFacts};
use rodvr_core::firewall::{Dataplane, MemoryFirewall};
use rodvr_core::state::Ledger;
use rodvr_core::vm_env::EnvError;

/// How a [`TestAgent`] answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Behaviour {
    /// As the real agent does.
    Honest,
    /// Refuses every table with a route to this rCUDA endpoint, naming that route's target.
    RefuseTarget(SocketAddrV4),
    /// Claims to hold this generation: every push is "older" (409), and read-back says so.
    ClaimGeneration(u64),
    /// Holds every push unanswered until the behaviour changes, then answers as it then says.
    Stall,
    /// Its host is down: every request fails with 503, and nothing changes.
    Down,
    /// Hung: it takes every connection and answers no request (as a stopped process whose
    /// socket the kernel still serves) until the behaviour changes.
    Hung,
}

#[derive(Debug)]
struct Shared {
    agent: Agent<MemoryFirewall>,
    behaviour: Mutex<Behaviour>,
    requests: AtomicUsize,
    /// Pushes received (before any stall).
    stalled: AtomicUsize,
}

/// An agent serving on 127.0.0.1 for one host; stops with the test's runtime.
#[derive(Debug, Clone)]
pub struct TestAgent {
    pub url: String,
    shared: Arc<Shared>,
}

impl TestAgent {
    /// Starts the agent of `host`, which trusts tokens of gsaasd's public key for `host` only.
    pub async fn start(host: &str, kind: HostKind, gsaasd_public_pem: &str) -> TestAgent {
        Self::start_tls(host, kind, gsaasd_public_pem, None).await
    }

    /// [`TestAgent::start`], serving over TLS with `tls` (its URL is then https).
    pub async fn start_tls(
        host: &str,
        kind: HostKind,
        gsaasd_public_pem: &str,
        tls: Option<TlsFiles>,
    ) -> TestAgent {
        Self::start_with(host, kind, gsaasd_public_pem, tls, None, false).await
    }

    /// The agent of GPU host `host` that runs a server per cGPU of its `gpus` GPUs (ids
    /// `{host}:GPU-{i}`, as [`crate::host_report`] names them), simulated: each new cGPU takes
    /// the lowest free port from 20000 and accepts at once.
    pub async fn start_managed(host: &str, gsaasd_public_pem: &str, gpus: usize) -> TestAgent {
        Self::start_with(host, HostKind::ComputeGpu, gsaasd_public_pem, None, Some(gpus), false)
            .await
    }

    /// [`Self::start_managed`] on a host that runs MPS: its GPUs take compute shares.
    pub async fn start_managed_mps(host: &str, gsaasd_public_pem: &str, gpus: usize) -> TestAgent {
        Self::start_with(host, HostKind::ComputeGpu, gsaasd_public_pem, None, Some(gpus), true)
            .await
    }

    async fn start_with(
        host: &str,
        kind: HostKind,
        gsaasd_public_pem: &str,
        tls: Option<TlsFiles>,
        managed_gpus: Option<usize>,
        mps: bool,
    ) -> TestAgent {
        let host = HostId::new(host).unwrap();
        let mut params = rodvr_core::fixtures::params();
        if managed_gpus.is_some() {
            // Its servers' address and ports (those of its simulated servers): it routes its own
            // VMs to them itself.
            params.local_servers = Some(rodvr_core::render::LocalServers {
                address: crate::rcuda_address(host.as_str()),
                first_port: 20000,
                last_port: 20999,
            });
        }
        let gpus = (0..managed_gpus.unwrap_or(0))
            .map(|i| rodvr_contract::protocol::GpuReport {
                id: gpgpums::GpuId::new(format!("{host}:GPU-{i}")).unwrap(),
                index: i as u32,
                model: "Tesla K20m".into(),
                memory_mib: 4800,
                rcuda: rodvr_contract::protocol::RcudaEndpoint {
                    address: crate::rcuda_address(host.as_str()),
                    port: 8308 + i as u16,
                    gpu_number: 0,
                },
                unhealthy: None,
                attributes: gpgpums::GpuAttributes { managed: true, mps, ..Default::default() },
                partition: None,
            })
            .collect();
        let facts = HostFacts {
            host: host.clone(),
            kind,
            agent_url: String::new(),
            gpus,
            topology: Default::default(),
            gpu_address: None,
            local_vms: None,
        };
        let mut agent =
            Agent::new(Ledger::in_memory(), Dataplane::new(MemoryFirewall::new(), params), facts);
        if managed_gpus.is_some() {
            let servers = rodvr_core::servers::SimulatedServers::new(20000..=20999);
            let servers = if mps { servers.with_mps() } else { servers };
            agent = agent.with_servers(Arc::new(servers));
        }
        let shared = Arc::new(Shared {
            agent,
            behaviour: Mutex::new(Behaviour::Honest),
            requests: AtomicUsize::new(0),
            stalled: AtomicUsize::new(0),
        });
        let verifier =
            Arc::new(TokenVerifier::from_public_pem(gsaasd_public_pem.as_bytes(), host).unwrap());
        let app = axum::Router::new()
            .route("/v1/routes", axum::routing::get(get_routes).put(put_routes))
            .layer(axum::middleware::from_fn_with_state(verifier, require_token))
            .layer(axum::middleware::from_fn_with_state(shared.clone(), count))
            .layer(axum::middleware::map_response(|mut response: Response| async move {
                // As the real agent: every answer says its protocol.
                use rodvr_contract::version::{HEADER, PROTOCOL};
                response.headers_mut().insert(HEADER, PROTOCOL.into());
                response
            }))
            .with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let scheme = if tls.is_some() { "https" } else { "http" };
        let url = format!("{scheme}://{}", listener.local_addr().unwrap());
        let tls = tls.map(|files| files.acceptor().unwrap());
        let (limits, forever) = (HttpLimits::default(), std::future::pending());
        tokio::spawn(
            async move { httpd::serve(listener, app, limits, tls, forever).await.unwrap() },
        );
        TestAgent { url, shared }
    }

    pub fn set(&self, behaviour: Behaviour) {
        *self.shared.behaviour.lock().unwrap() = behaviour;
    }

    /// Requests received, authenticated or not.
    pub fn requests(&self) -> usize {
        self.shared.requests.load(Ordering::SeqCst)
    }

    /// Route tables pushed to it, counted on arrival (a stalled push counts).
    pub fn pushes(&self) -> usize {
        self.shared.stalled.load(Ordering::SeqCst)
    }

    /// The routes of the table it applied: (masked endpoint, rCUDA target).
    pub fn routes(&self) -> Vec<(SocketAddrV4, SocketAddrV4)> {
        let state = self.shared.agent.state();
        state
            .desired
            .map(|t| t.routes.iter().map(|r| (r.masked, r.target)).collect())
            .unwrap_or_default()
    }

    /// The connections its firewall was asked to cut: (masked endpoint, old rCUDA target).
    pub fn cuts(&self) -> Vec<(SocketAddrV4, SocketAddrV4)> {
        self.shared
            .agent
            .with_firewall(|fw| fw.cuts().iter().map(|(k, old)| (k.masked, *old)).collect())
    }

    /// The servers it runs (an agent of [`TestAgent::start_managed`]).
    pub fn servers(&self) -> Vec<rodvr_contract::protocol::ServerStatus> {
        self.shared.agent.host_report().managed.map(|m| m.servers).unwrap_or_default()
    }

    /// Its host's report as its agent would send it, as JSON.
    pub fn report(&self) -> serde_json::Value {
        serde_json::to_value(self.shared.agent.host_report()).unwrap()
    }

    /// The table it holds.
    pub fn table(&self) -> Option<RouteTable> {
        self.shared.agent.state().desired
    }

    /// What its metadata server answers the VM at `ip`.
    pub fn environment(&self, ip: std::net::Ipv4Addr) -> Result<GpuEnv, EnvError> {
        self.shared.agent.environment(ip)
    }
}

/// A cloud whose hosts have real agents (over HTTP): compute-rGPU host `crg-a`, and compute-GPU
/// host `cg-1` with `gpus` GPUs of 4,800 MiB; returns gsaasd and the two agents.
/// A test's stand-in for gsaasd, as an agent sees it: every answer says this build's protocol
/// (`RODVR-Protocol`), which agents check (rodvr-contract's `version`).
pub fn as_controller(app: axum::Router) -> axum::Router {
    use rodvr_contract::version::{HEADER, PROTOCOL};
    app.layer(axum::middleware::map_response(|mut response: Response| async move {
        response.headers_mut().insert(HEADER, PROTOCOL.into());
        response
    }))
}

pub async fn agent_cloud(
    store: crate::Store,
    gpus: usize,
) -> (crate::TestService, TestAgent, TestAgent) {
    agent_cloud_with(store, gpus, |_| {}).await
}

/// [`agent_cloud`], with gsaasd's config changed by `tweak`.
pub async fn agent_cloud_with(
    store: crate::Store,
    gpus: usize,
    tweak: impl FnOnce(&mut gsaasd::config::Config),
) -> (crate::TestService, TestAgent, TestAgent) {
    let (mut config, dir) = crate::test_config(store);
    tweak(&mut config);
    config.hosts.backend = gsaasd::config::HostsBackend::Agent;
    let keys = gsaasd::auth::Keys::load_or_create(&config.signing_key_path()).unwrap();
    let vm_host = TestAgent::start("crg-a", HostKind::ComputeRgpu, keys.public_pem()).await;
    let gpu_host = TestAgent::start("cg-1", HostKind::ComputeGpu, keys.public_pem()).await;
    config.hosts.agent_urls.insert("crg-a".parse().unwrap(), vm_host.url.clone());
    config.hosts.agent_urls.insert("cg-1".parse().unwrap(), gpu_host.url.clone());
    let t = crate::TestService::start_config(config, dir).await;
    for (host, kind, agent, n) in
        [("cg-1", "compute-gpu", &gpu_host, gpus), ("crg-a", "compute-rgpu", &vm_host, 0)]
    {
        let token = t.agent_token(host);
        let report = crate::host_report(host, kind, &agent.url, n);
        let (status, body) = t.report_host(&token, host, &report).await;
        assert_eq!(status, 200, "{body}");
    }
    (t, vm_host, gpu_host)
}

/// [`agent_cloud`] whose GPU host `cg-1` runs its GPUs' servers ([`TestAgent::start_managed`]).
pub async fn managed_agent_cloud(
    store: crate::Store,
    gpus: usize,
) -> (crate::TestService, TestAgent, TestAgent) {
    managed_agent_cloud_with(store, gpus, false).await
}

/// [`managed_agent_cloud`], the GPU host running MPS when `mps`.
pub async fn managed_agent_cloud_with(
    store: crate::Store,
    gpus: usize,
    mps: bool,
) -> (crate::TestService, TestAgent, TestAgent) {
    let (mut config, dir) = crate::test_config(store);
    config.hosts.backend = gsaasd::config::HostsBackend::Agent;
    let keys = gsaasd::auth::Keys::load_or_create(&config.signing_key_path()).unwrap();
    let vm_host = TestAgent::start("crg-a", HostKind::ComputeRgpu, keys.public_pem()).await;
    let gpu_host = match mps {
        true => TestAgent::start_managed_mps("cg-1", keys.public_pem(), gpus).await,
        false => TestAgent::start_managed("cg-1", keys.public_pem(), gpus).await,
    };
    config.hosts.agent_urls.insert("crg-a".parse().unwrap(), vm_host.url.clone());
    config.hosts.agent_urls.insert("cg-1".parse().unwrap(), gpu_host.url.clone());
    let t = crate::TestService::start_config(config, dir).await;
    let token = t.agent_token("cg-1");
    let (status, body) = t.report_host(&token, "cg-1", &gpu_host.report()).await;
    assert_eq!(status, 200, "{body}");
    let token = t.agent_token("crg-a");
    let mut report = crate::host_report("crg-a", "compute-rgpu", &vm_host.url, 0);
    // Where its VMs' traffic to GPU servers comes from: the only client the servers take.
    report["gpu_address"] = serde_json::json!(crate::rcuda_address("crg-a"));
    let (status, body) = t.report_host(&token, "crg-a", &report).await;
    assert_eq!(status, 200, "{body}");
    (t, vm_host, gpu_host)
}

/// A launch of `ncgpus` shared 1,024 MiB cGPUs, first fit, the VM on a compute-rGPU host.
pub fn remote_launch(ncgpus: u32) -> serde_json::Value {
    let mut request = crate::shared_launch(ncgpus, 1024);
    request["locality"] = serde_json::json!("remote");
    request["policy"] = serde_json::json!("first-fit");
    request
}

async fn count(State(shared): State<Arc<Shared>>, request: Request, next: Next) -> Response {
    shared.requests.fetch_add(1, Ordering::SeqCst);
    while *shared.behaviour.lock().unwrap() == Behaviour::Hung {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    if *shared.behaviour.lock().unwrap() == Behaviour::Down {
        return refuse(StatusCode::SERVICE_UNAVAILABLE, "the host is down", None);
    }
    next.run(request).await
}

async fn require_token(
    State(verifier): State<Arc<TokenVerifier>>,
    request: Request,
    next: Next,
) -> Response {
    let token = request
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    match token {
        Some(token) if verifier.verify(token) => next.run(request).await,
        _ => refuse(StatusCode::UNAUTHORIZED, "missing or invalid controller token", None),
    }
}

fn refuse(status: StatusCode, error: &str, entry: Option<String>) -> Response {
    (status, Json(ErrorBody { error: error.into(), entry })).into_response()
}

async fn get_routes(State(shared): State<Arc<Shared>>) -> Json<AppliedState> {
    let mut state = shared.agent.state();
    if let Behaviour::ClaimGeneration(generation) = *shared.behaviour.lock().unwrap() {
        state.applied_generation = Some(generation);
    }
    Json(state)
}

async fn put_routes(State(shared): State<Arc<Shared>>, body: Bytes) -> Response {
    let table: RouteTable = serde_json::from_slice(&body).unwrap();
    shared.stalled.fetch_add(1, Ordering::SeqCst);
    let behaviour = loop {
        let behaviour = *shared.behaviour.lock().unwrap();
        if behaviour != Behaviour::Stall {
            break behaviour;
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    };
    match behaviour {
        Behaviour::Honest | Behaviour::Stall | Behaviour::Down | Behaviour::Hung => {}
        Behaviour::RefuseTarget(target) => {
            if let Some(i) = table.routes.iter().position(|r| r.target == target) {
                let entry = format!("routes[{i}].target");
                let error =
                    format!("invalid route table: {entry}: {target} is inside the masked range");
                return refuse(StatusCode::UNPROCESSABLE_ENTITY, &error, Some(entry));
            }
        }
        Behaviour::ClaimGeneration(generation) => {
            let error = format!(
                "generation {} is older than the current generation {generation}",
                table.generation
            );
            return refuse(StatusCode::CONFLICT, &error, None);
        }
    }
    match shared.agent.put_table(table) {
        Ok(status) => {
            // In memory, the cuts that follow a real agent's answer take no time.
            shared.agent.tidy_connections().expect("the memory firewall cuts");
            Json(status).into_response()
        }
        Err(e) => refuse(StatusCode::UNPROCESSABLE_ENTITY, &e.to_string(), None),
    }
}
