//! What the workspace's tests and benches share, in one crate instead of files included by path.
//!
//! - A real gsaasd for a test (this module): its own data directory and database (SQLite, or a
//!   fresh database on a throwaway PostgreSQL 15: [`postgres`]), port 0, the simulated cloud at zero
//!   delay and in-process agents unless a test says otherwise; [`on_both_stores!`] runs a test on
//!   both stores.
//! - Agents a test controls ([`agents`]: real agent cores over HTTP, or hostile ones), the real
//!   dev OpenStack ([`openstack`]) and upstream API samples ([`upstream`]).
//! - The kernel and the network: namespaces and veths ([`netns`]), certificates ([`certs`]),
//!   clients that stall ([`slow`]), key pairs and temporary directories.

pub mod agents;
pub mod browser;
pub mod certs;
pub mod netns;
pub mod openstack;
pub mod postgres;
pub mod rabbitmq;
pub mod servers;
pub mod slow;
pub mod upstream;

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ed25519_dalek::pkcs8::{spki::der::pem::LineEnding, EncodePrivateKey, EncodePublicKey};
use gsaasd::auth::Role;
use gsaasd::cloud::sim::SimCloud;
use gsaasd::config::Config;
use gsaasd::service::{self, Service};
use serde_json::Value;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Store {
    Sqlite,
    Postgres,
}

/// Generates one test per storage backend from `async fn name(store: Store)`.
#[macro_export]
macro_rules! on_both_stores {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqlite() {
                super::$name($crate::Store::Sqlite).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() {
                super::$name($crate::Store::Postgres).await
            }
        }
    )*};
}

#[derive(Debug)]
pub struct TestService {
    pub service: Option<Service>,
    pub config: Config,
    pub dir: PathBuf,
    pub http: reqwest::Client,
}

/// A fresh directory of its own under the system's temporary directory.
pub fn temp_dir() -> PathBuf {
    static N: AtomicU32 = AtomicU32::new(0);
    let dir = std::env::temp_dir().join(format!(
        "gsaasd-test-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

pub fn test_config(store: Store) -> (Config, PathBuf) {
    let dir = temp_dir();
    let mut config = Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        data_dir: dir.join("data"),
        database_url: match store {
            Store::Sqlite => None,
            Store::Postgres => Some(postgres::fresh_database().into()),
        },
        ..Config::default()
    };
    config.hosts.reconcile_interval_secs = 3600;
    // Tests and benches are one address (127.0.0.1) acting as many clients: it may hold all the
    // connections the server serves (the attacker suite sets its own share).
    config.http.max_connections_per_client = config.http.max_connections;
    // Scrapes see every change at once (the gauge cache has its own test).
    config.metrics.gauge_refresh_ms = 0;
    (config, dir)
}

/// A migrated database of a test's own, without a server; its directory goes when it is dropped.
#[derive(Debug)]
pub struct FreshDb {
    db: gsaasd::db::Db,
    dir: PathBuf,
}

impl FreshDb {
    pub async fn open(store: Store) -> FreshDb {
        let (config, dir) = test_config(store);
        let db = gsaasd::db::Db::connect(&config.database_url()).await.expect("test database");
        FreshDb { db, dir }
    }
}

impl std::ops::Deref for FreshDb {
    type Target = gsaasd::db::Db;
    fn deref(&self) -> &gsaasd::db::Db {
        &self.db
    }
}

impl Drop for FreshDb {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl TestService {
    pub async fn start(store: Store) -> TestService {
        Self::start_with(store, |_| {}).await
    }

    pub async fn start_with(store: Store, tweak: impl FnOnce(&mut Config)) -> TestService {
        let (mut config, dir) = test_config(store);
        tweak(&mut config);
        Self::start_config(config, dir).await
    }

    pub async fn start_config(config: Config, dir: PathBuf) -> TestService {
        Self::start_config_with_sim(config, dir, None).await
    }

    /// Starts with an existing simulated cloud (a second replica in front of the same "Nova").
    pub async fn start_config_with_sim(
        config: Config,
        dir: PathBuf,
        sim: Option<Arc<SimCloud>>,
    ) -> TestService {
        log_warnings();
        let listener = tokio::net::TcpListener::bind(config.listen).await.unwrap();
        let service =
            service::start_with_sim(config.clone(), listener, sim).await.expect("gsaasd starts");
        TestService { service: Some(service), config, dir, http: reqwest::Client::new() }
    }

    /// Two replicas on one fresh PostgreSQL database, with one signing key and one simulated
    /// cloud behind both (as one Nova would be); each has its own data directory.
    pub async fn two_replicas() -> (TestService, TestService) {
        let (config, dir) = test_config(Store::Postgres);
        let a = TestService::start_config(config.clone(), dir).await;
        let mut second = config.clone();
        second.data_dir = a.dir.join("replica-b");
        second.auth.signing_key = Some(config.signing_key_path());
        let b = TestService::start_config_with_sim(
            second,
            a.dir.join("b-scratch"),
            a.service().sim.clone(),
        )
        .await;
        (a, b)
    }

    /// Runs the gsaasd binary with `args` and `-c` a config file for this service's data and
    /// database: whether it succeeded, its output and its errors, trimmed.
    pub fn gsaasd(&self, args: &[&str]) -> (bool, String, String) {
        let config = self.dir.join("cli.toml");
        let mut text = format!("data_dir = {:?}\n", self.config.data_dir.display().to_string());
        if let Some(url) = &self.config.database_url {
            text.push_str(&format!("database_url = {:?}\n", url.expose()));
        }
        std::fs::write(&config, text).unwrap();
        let out = std::process::Command::new(gsaasd_binary())
            .args(args)
            .arg("-c")
            .arg(&config)
            .env_remove("GSAAS_DATABASE_URL")
            .output()
            .unwrap();
        let text = |b: Vec<u8>| String::from_utf8(b).unwrap().trim().to_owned();
        (out.status.success(), text(out.stdout), text(out.stderr))
    }

    pub fn service(&self) -> &Service {
        self.service.as_ref().expect("running")
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.service().url())
    }

    pub fn token(&self, project: &str, role: Role) -> String {
        self.service().app.keys.issue(project, Some(project), role, Duration::from_secs(3600))
    }

    pub fn member(&self) -> String {
        self.token("alpha", Role::Member)
    }

    pub fn admin(&self) -> String {
        self.token("ops", Role::Admin)
    }

    pub async fn get(&self, token: &str, path: &str) -> (u16, Value) {
        let r = self.http.get(self.url(path)).bearer_auth(token).send().await.unwrap();
        status_json(r).await
    }

    pub async fn post(&self, token: &str, path: &str, body: &Value) -> (u16, Value) {
        let r = self.http.post(self.url(path)).bearer_auth(token).json(body).send().await.unwrap();
        status_json(r).await
    }

    pub async fn put(&self, token: &str, path: &str, body: &Value) -> (u16, Value) {
        let r = self.http.put(self.url(path)).bearer_auth(token).json(body).send().await.unwrap();
        status_json(r).await
    }

    /// A token for the agent of `host`, as gsaasd would issue it.
    pub fn agent_token(&self, host: &str) -> String {
        self.service().app.keys.issue(host, None, Role::Agent, Duration::from_secs(600))
    }

    /// Sends `report` as the agent of `host` does.
    pub async fn report_host(&self, token: &str, host: &str, report: &Value) -> (u16, Value) {
        self.put(token, &format!("/v1/hosts/{host}"), report).await
    }

    pub async fn delete(&self, token: &str, path: &str) -> (u16, Value) {
        let r = self.http.delete(self.url(path)).bearer_auth(token).send().await.unwrap();
        status_json(r).await
    }

    /// Launches and returns the VM's id (asserting 202).
    pub async fn launch(&self, token: &str, body: &Value) -> String {
        let (status, vm) = self.post(token, "/v1/vms", body).await;
        assert_eq!(status, 202, "{vm}");
        vm["id"].as_str().unwrap().to_owned()
    }

    /// Polls the VM until `done` holds (bounded: 20 s).
    pub async fn wait_vm(&self, token: &str, id: &str, done: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let (status, vm) = self.get(token, &format!("/v1/vms/{id}")).await;
            assert_eq!(status, 200, "{vm}");
            if done(&vm) {
                return vm;
            }
            assert!(Instant::now() < deadline, "VM {id} never got there: {vm}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Attaches one shared cGPU of `mib` to the VM (asserting 202) and waits until it has
    /// `total` cGPUs, every one live.
    pub async fn attach_one_and_wait(&self, token: &str, id: &str, mib: u64, total: usize) {
        let attach = serde_json::json!({"ncgpus": 1, "gpu_memory_mib": mib, "mode": "shared"});
        let (status, vm) = self.post(token, &format!("/v1/vms/{id}/cgpus"), &attach).await;
        assert_eq!(status, 202, "{vm}");
        self.wait_vm(token, id, |vm| {
            let cgpus = vm["cgpus"].as_array().unwrap();
            cgpus.len() == total && cgpus.iter().all(|c| c["state"] == "live")
        })
        .await;
    }

    /// Detaches the VM's cGPU `index` (asserting 202) and waits until it has `left` cGPUs.
    pub async fn detach_and_wait(&self, token: &str, id: &str, index: u32, left: usize) {
        let (status, body) = self.delete(token, &format!("/v1/vms/{id}/cgpus/{index}")).await;
        assert_eq!(status, 202, "{body}");
        self.wait_vm(token, id, |vm| vm["cgpus"].as_array().unwrap().len() == left).await;
    }

    /// Terminates the VM (asserting 202) and waits until it is deleted.
    pub async fn terminate_and_wait(&self, token: &str, id: &str) {
        let (status, body) = self.delete(token, &format!("/v1/vms/{id}")).await;
        assert_eq!(status, 202, "{body}");
        self.wait_state(token, id, "deleted").await;
    }

    /// A preemption as the queue makes one: `owner`'s best-effort VM of two exclusive,
    /// preemptible cGPUs, then `other`'s protected VM of two and urgent VM of one (priority 9),
    /// which takes one of the first VM's cGPUs back. Needs `quotas.max_priority` of 9 or more and
    /// the default pool of four GPUs. Returns the three VMs once the first is down to one cGPU.
    pub async fn preempt_one_cgpu(&self, owner: &str, other: &str) -> Preemption {
        let exclusive = |n: u32, priority: i32, preemptible: bool| {
            serde_json::json!({"name": "q", "image": "cirros-0.6.2", "flavor": "m1.small",
                "ncgpus": n, "mode": "exclusive", "queue": true, "priority": priority,
                "preemptible": preemptible})
        };
        let best_effort = self.launch(owner, &exclusive(2, 0, true)).await;
        self.wait_state(owner, &best_effort, "ready").await;
        let protected = self.launch(other, &exclusive(2, 0, false)).await;
        self.wait_state(other, &protected, "ready").await;
        let urgent = self.launch(other, &exclusive(1, 9, false)).await;
        self.wait_state(other, &urgent, "ready").await;
        self.wait_vm(owner, &best_effort, |vm| vm["cgpus"].as_array().unwrap().len() == 1).await;
        Preemption { best_effort, protected, urgent }
    }

    /// The VM's cGPUs as an admin sees them (with their GPUs).
    pub async fn admin_cgpus(&self, id: &str) -> Vec<Value> {
        let (status, vm) = self.get(&self.admin(), &format!("/v1/vms/{id}")).await;
        assert_eq!(status, 200, "{vm}");
        vm["cgpus"].as_array().cloned().unwrap_or_default()
    }

    /// The GPU models of the VM's cGPUs, as an admin sees them, in index order.
    pub async fn gpu_models_of(&self, id: &str) -> Vec<String> {
        let (_, pool) = self.get(&self.admin(), "/v1/pool").await;
        let hosts = pool["hosts"].as_array().cloned().unwrap_or_default();
        let model_of = |gpu: &str| -> String {
            let all = hosts.iter().flat_map(|h| h["gpus"].as_array().cloned().unwrap_or_default());
            let found =
                all.filter(|g| g["id"] == gpu).find_map(|g| g["model"].as_str().map(str::to_owned));
            found.unwrap_or_else(|| panic!("no GPU {gpu} in {pool}"))
        };
        let cgpus = self.admin_cgpus(id).await;
        cgpus.iter().map(|c| model_of(c["gpu"].as_str().expect("a cGPU's GPU"))).collect()
    }

    pub async fn wait_state(&self, token: &str, id: &str, state: &str) -> Value {
        self.wait_vm(token, id, |vm| vm["state"] == state).await
    }

    /// Stops the service abruptly (no graceful anything), as a crash would. Returns the
    /// simulated cloud, which lives on, as Nova would.
    pub fn crash(&mut self) -> Option<Arc<SimCloud>> {
        let service = self.service.take()?;
        let sim = service.sim.clone();
        service.abort();
        sim
    }

    /// Crashes gsaasd and starts it again on the same storage and the same simulated cloud.
    pub async fn restart(&mut self) {
        let sim = self.crash();
        self.start_again(sim).await;
    }

    /// Starts gsaasd again after a [`Self::crash`], on the same storage and `sim`.
    pub async fn start_again(&mut self, sim: Option<Arc<SimCloud>>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let service = service::start_with_sim(self.config.clone(), listener, sim)
            .await
            .expect("gsaasd restarts");
        self.service = Some(service);
    }
}

impl Drop for TestService {
    fn drop(&mut self) {
        self.crash();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

pub async fn status_json(response: reqwest::Response) -> (u16, Value) {
    let status = response.status().as_u16();
    let text = response.text().await.unwrap();
    let value = if text.is_empty() {
        Value::Null
    } else {
        serde_json::from_str(&text).unwrap_or(Value::String(text))
    };
    (status, value)
}

/// The address of `host`'s rCUDA servers in [`host_report`]: one of its own in 10.78.0.0/16
/// (an rCUDA server belongs to one host), the same every time.
pub fn rcuda_address(host: &str) -> std::net::Ipv4Addr {
    // FNV-1a: distinct for the few hosts a test names.
    let hash =
        host.bytes().fold(0x811c_9dc5_u32, |h, b| (h ^ u32::from(b)).wrapping_mul(0x0100_0193));
    let [_, _, c, d] = hash.to_be_bytes();
    std::net::Ipv4Addr::new(10, 78, c.max(1), d.clamp(1, 254))
}

/// A host's report as its agent sends it: GPU `i` (4,800 MiB) at [`rcuda_address`]:8308+i.
pub fn host_report(host: &str, kind: &str, agent_url: &str, gpus: usize) -> Value {
    let address = rcuda_address(host).to_string();
    serde_json::json!({
        "host": host, "kind": kind, "agent_url": agent_url,
        "gpus": (0..gpus).map(|i| serde_json::json!({
            "id": format!("{host}:GPU-{i}"), "index": i, "model": "Tesla K20m", "memory_mib": 4800,
            "rcuda": {"address": address, "port": 8308 + i, "gpu_number": 0}
        })).collect::<Vec<_>>(),
        "applied_generation": null
    })
}

/// An inventory host of `kind` with `gpus`, nothing else set.
pub fn inventory_host(
    name: &str,
    kind: gpgpums::HostKind,
    gpus: Vec<gsaasd::config::InventoryGpu>,
) -> gsaasd::config::InventoryHost {
    gsaasd::config::InventoryHost {
        name: name.parse().expect("a host name"),
        kind,
        gpus,
        gpu_network_address: None,
        remoting: Default::default(),
        server_base_port: None,
        topology: Default::default(),
    }
}

pub fn shared_launch(ncgpus: u32, mib: u64) -> Value {
    serde_json::json!({
        "name": "test-vm", "image": "cirros-0.6.2", "flavor": "m1.small",
        "ncgpus": ncgpus, "gpu_memory_mib": mib, "mode": "shared"
    })
}

/// The VMs of [`TestService::preempt_one_cgpu`], by id.
#[derive(Debug)]
pub struct Preemption {
    /// The owner's VM, which lost one of its two cGPUs.
    pub best_effort: String,
    /// The other project's VM of two cGPUs, which no preemption may touch.
    pub protected: String,
    /// The other project's VM of one cGPU, which took the best-effort VM's.
    pub urgent: String,
}

/// The GPUs and hosts that an admin's view of a VM's cGPUs ([`TestService::admin_cgpus`]) names:
/// what no tenant's view, notification or meter may show.
pub fn cgpu_locations(cgpus: &[Value]) -> Vec<String> {
    cgpus
        .iter()
        .flat_map(|c| {
            [
                c["gpu"].as_str().expect("an admin sees each cGPU's GPU"),
                c["host"].as_str().unwrap_or(""),
            ]
        })
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

/// [`shared_launch`] with the fields of `extra` (a JSON object) set or replaced.
pub fn shared_launch_with(ncgpus: u32, mib: u64, extra: Value) -> Value {
    let mut body = shared_launch(ncgpus, mib);
    let Value::Object(extra) = extra else { panic!("{extra} is no object") };
    for (key, value) in extra {
        body[key] = value;
    }
    body
}

/// A time (milliseconds since the Unix epoch) as the API takes it: RFC 3339, UTC.
pub fn rfc3339(ms: i64) -> String {
    gsaasd::openstack::time::format_ms(ms)
}

/// The ids of the launches answered 202, from `(status, body)` pairs.
pub fn accepted_ids(results: &[(u16, Value)]) -> Vec<String> {
    results
        .iter()
        .filter(|(status, _)| *status == 202)
        .map(|(_, vm)| vm["id"].as_str().expect("a launched VM's id").to_owned())
        .collect()
}

/// Runs futures concurrently and collects their outputs in order.
pub async fn join_all<F, T>(futures: impl Iterator<Item = F>) -> Vec<T>
where
    F: std::future::Future<Output = T> + Send,
    T: Send,
{
    let mut set = Vec::new();
    for f in futures {
        set.push(Box::pin(f));
    }
    let mut outputs: Vec<Option<T>> = (0..set.len()).map(|_| None).collect();
    let mut pending: Vec<usize> = (0..set.len()).collect();
    std::future::poll_fn(|cx| {
        pending.retain(|&i| match set[i].as_mut().poll(cx) {
            std::task::Poll::Ready(value) => {
                outputs[i] = Some(value);
                false
            }
            std::task::Poll::Pending => true,
        });
        if pending.is_empty() {
            std::task::Poll::Ready(())
        } else {
            std::task::Poll::Pending
        }
    })
    .await;
    outputs.into_iter().map(|o| o.expect("every future finished")).collect()
}

/// The commit this checkout is at, as the daemons' build script reads it (`--version`): 12 hex
/// digits, or `unknown` outside git.
pub fn checkout_commit() -> String {
    let out = std::process::Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output();
    match out {
        Ok(out) if out.status.success() => String::from_utf8_lossy(&out.stdout).trim().to_owned(),
        _ => "unknown".to_owned(),
    }
}

/// The fields a problem document's `errors` names, in its order.
pub fn fields_at_fault(problem: &Value) -> Vec<String> {
    let errors = problem["errors"].as_array().cloned().unwrap_or_default();
    errors.iter().map(|e| e["field"].as_str().unwrap_or_default().to_owned()).collect()
}

/// The `gsaasd` binary cargo built beside the running test (`target/<profile>/gsaasd`; a test
/// binary runs from `target/<profile>/deps/`).
pub fn gsaasd_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let bin = exe.parent().and_then(|deps| deps.parent()).map(|dir| dir.join("gsaasd"));
    match bin {
        Some(bin) if bin.exists() => bin,
        _ => panic!("no gsaasd binary beside {}: cargo build -p gsaasd", exe.display()),
    }
}

/// An Ed25519 key pair derived from `seed`: (private PKCS#8 PEM, public PEM).
pub fn key_pair(seed: u8) -> (String, String) {
    let key = ed25519_dalek::SigningKey::from_bytes(&[seed; 32]);
    let private = key.to_pkcs8_pem(LineEnding::LF).unwrap().to_string();
    let public = key.verifying_key().to_public_key_pem(LineEnding::LF).unwrap();
    (private, public)
}

static NEXT: AtomicU32 = AtomicU32::new(0);

/// A fresh directory for one test, removed on drop.
#[derive(Debug)]
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> Self {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("rodvr-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }

    pub fn path(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A child process, killed and reaped when dropped: a test that fails (panics) does not leave it
/// running.
#[derive(Debug)]
pub struct Process(pub std::process::Child);

impl Process {
    pub fn id(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Sends gsaasd's warnings and errors to the test's output, which the harness shows for a test
/// that fails: a failure in CI then carries its cause (a saga's internal error is logged, not
/// told to the tenant). `RUST_LOG` overrides the level.
fn log_warnings() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_test_writer().try_init();
}
