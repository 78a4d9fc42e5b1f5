//! What the end-to-end test needs around the real binaries: network namespaces and veths (from
//! `gsaas-test-support`), processes run inside a namespace (killed
//! by drop guards), stand-in rCUDA servers, TCP probes and HTTP calls made from inside a namespace,
//! and the binaries themselves.
//!
//! Processes enter their namespace with `nsenter --net=` ([`Netns::command`]): gsaasd's simulated
//! cloud creates the VMs' namespaces after it starts. The test's own sockets are made by threads
//! that entered a namespace (`setns`), since a socket belongs to the namespace its creator was in.
//!
//! Every wait is bounded and every failure message says what was being done.

// Shared by the e2e and chaos tests: each uses part of it.
#![allow(dead_code, unused_imports)]

pub use gsaas_test_support::netns::{
    connect, enter_and_run, greet_and_echo, namespaces, require_root_tools, run_prefix, still_open,
    veth, Netns,
};

use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

/// Deletes, when dropped, every namespace whose name starts with `prefix`: the VMs gsaasd's
/// simulated cloud created, should the test stop before gsaasd deleted them.
#[derive(Debug)]
pub struct SweepNamespaces {
    pub prefix: String,
}

impl Drop for SweepNamespaces {
    fn drop(&mut self) {
        let Ok(out) = Command::new("ip").args(["netns", "list"]).output() else { return };
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            if let Some(name) =
                line.split_whitespace().next().filter(|n| n.starts_with(&self.prefix))
            {
                let _ = Command::new("ip").args(["netns", "del", name]).output();
            }
        }
    }
}

/// A child process, killed and reaped when dropped. Its stderr goes to `log`, printed if the test
/// is failing so that the reason is at hand.
#[derive(Debug)]
pub struct Process {
    pub name: String,
    child: Child,
    log: PathBuf,
    pub first_line: String,
}

impl Process {
    /// Starts `command` and waits (bounded) for the first line on its stdout.
    pub fn start(name: &str, mut command: Command, log: PathBuf) -> Self {
        let stderr = File::create(&log).unwrap_or_else(|e| panic!("create {}: {e}", log.display()));
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {name}: {e}"));
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let mut process = Self { name: name.to_owned(), child, log, first_line: String::new() };
        match rx.recv_timeout(Duration::from_secs(20)) {
            Ok(line) => process.first_line = line,
            Err(_) => {
                panic!("{name} printed nothing within 20 s; its log:\n{}", process.log_text())
            }
        }
        process
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Stops the process where it is (SIGSTOP: it neither runs nor exits, as a hung host), or
    /// lets it go on (SIGCONT).
    pub fn pause(&self, paused: bool) {
        let signal = if paused { "-STOP" } else { "-CONT" };
        let status = Command::new("kill").arg(signal).arg(self.child.id().to_string()).status();
        assert!(status.is_ok_and(|s| s.success()), "kill {signal} {}", self.name);
    }
}

impl Process {
    /// Sends `signal` (`INT`, `TERM`) and waits, at most `limit`, for the process to exit; panics
    /// with its log if it does not. Returns its exit status.
    pub fn stop_with(&mut self, signal: &str, limit: Duration) -> std::process::ExitStatus {
        let sent = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.child.id().to_string())
            .status();
        assert!(sent.is_ok_and(|s| s.success()), "kill -{signal} {}", self.name);
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().expect("wait for a child") {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "{} did not exit within {limit:?} of SIG{signal}; its log:\n{}",
                self.name,
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("----- {} log -----\n{}", self.name, self.log_text());
        }
    }
}

/// A TCP server in a namespace, as an rCUDA daemon of one GPU stands in: each connection is
/// greeted and echoed ([`greet_and_echo`]). Stops accepting when dropped.
#[derive(Debug)]
pub struct StandIn {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl StandIn {
    pub fn start(ns: &Netns, addr: &str, name: &str) -> Self {
        let listener = ns
            .run(|| TcpListener::bind(addr))
            .unwrap_or_else(|e| panic!("bind the stand-in {name} on {addr} in {}: {e}", ns.name));
        listener.set_nonblocking(true).expect("non-blocking listener");
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let name = name.to_owned();
        let thread = std::thread::spawn(move || {
            while !stopped.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((conn, _)) => {
                        let _ = conn.set_nonblocking(false);
                        let name = name.clone();
                        std::thread::spawn(move || greet_and_echo(conn, &name));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        });
        Self { stop, thread: Some(thread) }
    }
}

impl Drop for StandIn {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// From inside the namespace `ns`, the greeting of whatever answers a TCP connection to `addr`, or
/// `None` if nothing does within a second.
pub fn ask(ns: &str, addr: &str) -> Option<String> {
    connect(ns, addr).map(|(_, greeting)| greeting)
}

/// Polls `f` every 50 ms until it returns `Some`, for at most `limit`; panics with `what` then.
pub fn wait_for<T>(what: &str, limit: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(value) = f() {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out after {limit:?} waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// An HTTP client whose connections are made from inside a namespace.
#[derive(Debug)]
pub struct Api {
    pub ns: String,
    pub base: String,
}

impl Api {
    /// `METHOD base+path` with a bearer token and an optional JSON body: (status, JSON body or
    /// `Null`). Panics when the request fails.
    pub fn call(
        &self,
        method: &str,
        path: &str,
        token: &str,
        body: Option<&Value>,
    ) -> (u16, Value) {
        self.try_call(method, path, token, body)
            .unwrap_or_else(|| panic!("{method} {}{path}: no answer", self.base))
    }

    /// [`Api::call`], `None` when the request fails (the service is down, as the chaos test
    /// expects at times).
    pub fn try_call(
        &self,
        method: &str,
        path: &str,
        token: &str,
        body: Option<&Value>,
    ) -> Option<(u16, Value)> {
        let url = format!("{}{path}", self.base);
        let method = reqwest::Method::from_bytes(method.as_bytes()).expect("an HTTP method");
        enter_and_run(&self.ns, || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime");
            runtime.block_on(async {
                let client = reqwest::Client::builder()
                    .timeout(Duration::from_secs(10))
                    .build()
                    .expect("an HTTP client");
                let mut request = client.request(method, &url).bearer_auth(token);
                if let Some(body) = body {
                    request = request.json(body);
                }
                let response = request.send().await.ok()?;
                let status = response.status().as_u16();
                let text = response.text().await.ok()?;
                Some((status, serde_json::from_str(&text).unwrap_or(Value::Null)))
            })
        })
    }

    pub fn get(&self, path: &str, token: &str) -> Value {
        let (status, body) = self.call("GET", path, token, None);
        assert_eq!(status, 200, "GET {path}: {body}");
        body
    }
}

/// The `gsaasd` and `rodvr-agent` binaries, up to date, from this test's target directory.
///
/// A test cannot name another package's binaries (`CARGO_BIN_EXE_*` is per package), so they are
/// found next to this test's executable (`<target dir>[/<triple>]/<profile>/deps/e2e-*`).
/// `cargo test --workspace` builds every member's binaries before it runs any test, but `cargo test
/// -p gsaas-e2e` builds none, and a binary left from an older build would be tested silently. So
/// the test first runs `cargo build --workspace --tests` (cargo releases its build lock before it
/// runs tests): that selects the same packages and dev-dependency features as `cargo test
/// --workspace`, so there it is a no-op of under a second that re-links the same binaries.
/// `cargo build -p gsaasd -p rodvr-agent` would resolve features without the dev-dependencies and
/// recompile gsaasd (about 40 s) on every fresh machine; it is the fallback when another member's
/// test target does not compile.
pub fn binaries() -> (PathBuf, PathBuf) {
    static BUILT: AtomicU32 = AtomicU32::new(0);
    let exe = std::env::current_exe().expect("the test's own path");
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("the test runs from <target dir>/<profile>/deps")
        .to_owned();
    let profile_name = profile_dir.file_name().and_then(|n| n.to_str()).expect("a profile dir");
    let mut target_dir = profile_dir.parent().expect("a target dir").to_owned();
    let mut target = None;
    if !target_dir.join("CACHEDIR.TAG").exists() {
        // `--target TRIPLE` builds into <target dir>/<triple>/<profile>.
        target = target_dir.file_name().and_then(|n| n.to_str()).map(str::to_owned);
        target_dir = target_dir.parent().expect("a target dir").to_owned();
    }
    if BUILT.fetch_add(1, Ordering::SeqCst) == 0 {
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| env!("CARGO").into());
        let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace");
        let build = |selection: &[&str]| {
            let mut build = Command::new(&cargo);
            build.current_dir(workspace).args(["build", "--quiet"]).args(selection);
            match profile_name {
                "debug" => {}
                "release" => {
                    build.arg("--release");
                }
                custom => {
                    build.args(["--profile", custom]);
                }
            }
            build.arg("--target-dir").arg(&target_dir);
            if let Some(target) = &target {
                build.args(["--target", target]);
            }
            build.output().unwrap_or_else(|e| panic!("cannot run cargo: {e}"))
        };
        let workspace_build = build(&["--workspace", "--tests"]);
        if !workspace_build.status.success() {
            // Another member's test target does not build (cargo test says so on its own): build
            // just the two binaries, slower but just as fresh.
            let bins = build(&["--bins", "-p", "gsaasd", "-p", "rodvr-agent", "-p", "gsaas"]);
            assert!(
                bins.status.success(),
                "cannot build gsaasd, rodvr-agent and gsaas: {}",
                String::from_utf8_lossy(&bins.stderr)
            );
        }
    }
    (profile_dir.join("gsaasd"), profile_dir.join("rodvr-agent"))
}

/// The `gsaas` CLI, built as [`binaries`] builds the daemons.
pub fn gsaas_binary() -> PathBuf {
    let (gsaasd, _) = binaries();
    gsaasd.with_file_name("gsaas")
}

/// Runs `gsaasd ARGS -c CONFIG` (no network needed) and returns its stdout, trimmed.
pub fn gsaasd_cli(gsaasd: &Path, config: &Path, args: &[&str]) -> String {
    let out = Command::new(gsaasd).args(args).arg("-c").arg(config).output();
    let out = out.unwrap_or_else(|e| panic!("gsaasd {}: {e}", args.join(" ")));
    assert!(
        out.status.success(),
        "gsaasd {} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8 output").trim().to_owned()
}

/// An agent's config for `host`, serving at `address`:7450, its state and gsaasd's public key
/// in `dir`, heartbeating (and measuring its round trips to GPU hosts) every second to gsaasd
/// at `controller` with `token`, then `extra`.
pub fn agent_toml(
    host: &str,
    address: &str,
    dir: &Path,
    controller: &str,
    token: &str,
    extra: &str,
) -> String {
    let d = dir.display();
    format!(
        r#"host = "{host}"
listen = "{address}:7450"
state_file = "{d}/{host}.routes.json"
controller_public_key = "{d}/controller.pub.pem"
masked_range = "100.127.0.0/16"
gpu_interface = "gpu0"
retry_interval_secs = 1
{extra}
[controller]
url = "{controller}"
token = "{token}"
heartbeat_interval_secs = 1
rtt_interval_secs = 1
rtt_timeout_ms = 500
"#
    )
}

/// A fresh directory for one test, removed on drop.
#[derive(Debug)]
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("{}{tag}", run_prefix()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
        Self(dir)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Reads what a file holds, panicking with its path.
pub fn read(path: &Path) -> String {
    let mut text = String::new();
    File::open(path)
        .and_then(|mut f| f.read_to_string(&mut text))
        .unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    text
}

/// A TCP relay, as a load balancer's virtual IP or a port forward is: it listens on `listen` inside
/// one namespace (the one its creator's thread is in when `listen_ns` is `None`) and hands each
/// connection to the next enabled backend, in turn, that accepts it; a backend is an address
/// reached from inside a namespace (again `None`: the creator's). A backend that refuses is
/// skipped; with none left the client's connection is closed. Disabling a backend (to drain it)
/// leaves its open connections alone. Stops accepting when dropped.
#[derive(Debug)]
pub struct Relay {
    backends: Arc<Mutex<Vec<RelayBackend>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

#[derive(Debug, Clone)]
struct RelayBackend {
    ns: Option<String>,
    addr: SocketAddr,
    enabled: bool,
}

impl Relay {
    pub fn start(
        listen_ns: Option<&Netns>,
        listen: &str,
        backends: &[(Option<&Netns>, &str)],
    ) -> Relay {
        let bind = || TcpListener::bind(listen);
        let listener = match listen_ns {
            Some(ns) => ns.run(bind),
            None => bind(),
        }
        .unwrap_or_else(|e| panic!("relay: bind {listen}: {e}"));
        listener.set_nonblocking(true).expect("non-blocking listener");
        let backends: Vec<RelayBackend> = backends
            .iter()
            .map(|(ns, addr)| RelayBackend {
                ns: ns.map(|n| n.name.clone()),
                addr: addr.parse().unwrap_or_else(|e| panic!("relay backend {addr:?}: {e}")),
                enabled: true,
            })
            .collect();
        let backends = Arc::new(Mutex::new(backends));
        let stop = Arc::new(AtomicBool::new(false));
        let (table, stopped) = (backends.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            let mut next = 0usize;
            while !stopped.load(Ordering::Relaxed) {
                let Ok((client, _)) = listener.accept() else {
                    std::thread::sleep(Duration::from_millis(5));
                    continue;
                };
                let _ = client.set_nonblocking(false);
                let candidates: Vec<RelayBackend> = {
                    let all = table.lock().expect("relay backends");
                    let n = all.len().max(1);
                    next = (next + 1) % n;
                    (0..all.len())
                        .map(|i| all[(next + i) % n].clone())
                        .filter(|b| b.enabled)
                        .collect()
                };
                std::thread::spawn(move || {
                    let upstream = candidates.iter().find_map(|b| {
                        let dial =
                            || TcpStream::connect_timeout(&b.addr, Duration::from_secs(1)).ok();
                        match &b.ns {
                            Some(ns) => enter_and_run(ns, dial),
                            None => dial(),
                        }
                    });
                    match upstream {
                        Some(upstream) => pipe(client, upstream),
                        None => drop(client),
                    }
                });
            }
        });
        Relay { backends, stop, thread: Some(thread) }
    }

    /// Sends new connections to `addr` again (`true`), or no longer (`false`).
    pub fn set_enabled(&self, addr: &str, enabled: bool) {
        let addr: SocketAddr = addr.parse().expect("a socket address");
        let mut all = self.backends.lock().expect("relay backends");
        let backend = all.iter_mut().find(|b| b.addr == addr).expect("a backend of this relay");
        backend.enabled = enabled;
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Copies bytes both ways until each side has closed its half.
fn pipe(a: TcpStream, b: TcpStream) {
    let (Ok(a2), Ok(b2)) = (a.try_clone(), b.try_clone()) else { return };
    let one_way = |mut from: TcpStream, mut to: TcpStream| {
        let _ = std::io::copy(&mut from, &mut to);
        let _ = to.shutdown(Shutdown::Write);
    };
    let back = std::thread::spawn(move || one_way(b2, a2));
    one_way(a, b);
    let _ = back.join();
}
