//! The real agent binary on the real kernel, in network namespaces this test creates:
//!
//! ```text
//!  vm1 (10.231.1.2) --- tap1 \                        / GPU host (10.232.0.2)
//!                              compute-rGPU host (ch)    stand-in rCUDA servers :8308 (gpu0)
//!  vm2 (10.231.2.2) --- tap2 /    gpu0 10.232.0.1 ---   and :8309 (gpu1)
//! ```
//!
//! The GPU host has a route back to the VM subnets and a decoy server on a masked endpoint that
//! plain routing reaches, so everything the agent blocks would otherwise work (the test checks
//! that first). Needs root, `ip` and `nft` (CI runs it as root);
//! without them it fails with a message saying so.

use gsaas_test_support as support;

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use axum::Json;
use gpgpums::ids::HostId;
use rodvr_contract::auth::TokenSigner;
use rodvr_contract::client::AgentClient;
use rodvr_contract::fixtures::route;
use rodvr_contract::protocol::{HostKind, HostReport, Route, RouteTable, VmPort};
use serde_json::Value;
use support::netns::{connect, greet_and_echo, require_root_tools, still_open, veth, Netns};
use support::{key_pair, TempDir};

const COMPUTE_GPU_SIDE: &str = "10.232.0.1";

struct Topology {
    vm1: Netns,
    vm2: Netns,
    ch: Netns,
    gh: Netns,
}

fn topology() -> Topology {
    let t = Topology {
        vm1: Netns::new("vm1"),
        vm2: Netns::new("vm2"),
        ch: Netns::new("ch"),
        gh: Netns::new("gh"),
    };
    veth(&t.vm1, "eth0", "10.231.1.2/24", &t.ch, "tap1", "10.231.1.1/24");
    veth(&t.vm2, "eth0", "10.231.2.2/24", &t.ch, "tap2", "10.231.2.1/24");
    veth(&t.gh, "eth0", "10.232.0.2/24", &t.ch, "gpu0", "10.232.0.1/24");
    t.vm1.ip(&["route", "add", "default", "via", "10.231.1.1"]);
    t.vm2.ip(&["route", "add", "default", "via", "10.231.2.1"]);
    t.gh.ip(&["route", "add", "10.231.0.0/16", "via", COMPUTE_GPU_SIDE]);
    // A decoy that answers on a masked endpoint, reachable by plain routing: only the agent's
    // filter stops a VM without that route from getting there.
    t.gh.ip(&["addr", "add", "100.127.0.1/32", "dev", "lo"]);
    t.ch.ip(&["route", "add", "100.127.0.0/16", "via", "10.232.0.2"]);
    t.ch.enable_forwarding();
    t
}

/// A TCP server in `ns` that greets every connection with `"{name} {peer ip}\n"`, then echoes
/// what it receives.
fn stand_in_rcuda(ns: &Netns, addr: &str, name: &'static str) {
    let listener = ns.run(|| TcpListener::bind(addr).unwrap());
    std::thread::spawn(move || {
        for conn in listener.incoming().map_while(Result::ok) {
            std::thread::spawn(move || greet_and_echo(conn, name));
        }
    });
}

/// Connects from `ns` to `addr`; the open connection and the server's greeting, if any.
fn open(ns: &Netns, addr: &str) -> Option<(BufReader<TcpStream>, String)> {
    connect(&ns.name, addr)
}

/// The greeting of the server a new connection from `ns` to `addr` reaches, if any.
fn ask(ns: &Netns, addr: &str) -> Option<String> {
    open(ns, addr).map(|(_, greeting)| greeting)
}

/// The agent process; killed on drop.
struct AgentProcess {
    child: Child,
    url: String,
}

impl AgentProcess {
    fn start(ns: &Netns, config: &Path) -> Self {
        let mut command = Command::new("ip");
        command.args(["netns", "exec", &ns.name, env!("CARGO_BIN_EXE_rodvr-agent")]);
        Self::start_command(command, config)
    }

    /// [`AgentProcess::start`] entering the network namespace only (`nsenter`): the host's
    /// `/sys`, and so its cgroups, stay in view (`ip netns exec` mounts a `/sys` of its own),
    /// as an agent that runs its GPUs' servers needs.
    fn start_entering(ns: &Netns, config: &Path) -> Self {
        Self::start_command(ns.command(env!("CARGO_BIN_EXE_rodvr-agent")), config)
    }

    fn start_command(mut command: Command, config: &Path) -> Self {
        let mut child = command
            .arg("--config")
            .arg(config)
            .stdout(Stdio::piped())
            .spawn()
            .expect("start rodvr-agent");
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let mut agent = Self { child, url: String::new() };
        let line = rx.recv_timeout(Duration::from_secs(20)).expect("agent did not start in 20 s");
        let addr = line.strip_prefix("rodvr-agent listening on ").expect(&line);
        agent.url = format!("http://{addr}");
        agent
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Runs `f` with a client on a runtime whose sockets live in `ns`.
fn with_client<T: Send>(
    ns: &Netns,
    client: &AgentClient,
    f: impl AsyncFnOnce(&AgentClient) -> T + Send,
) -> T {
    ns.run(|| {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(f(client))
    })
}

/// PUTs `table` without a token and returns the status.
fn unsigned_put(ns: &Netns, url: &str, table: &RouteTable) -> u16 {
    ns.run(|| {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let put = reqwest::Client::new().put(format!("{url}/v1/routes")).json(table).send();
        rt.block_on(put).unwrap().status().as_u16()
    })
}

/// A controller endpoint (`PUT /v1/hosts/{host}`) listening in `ns`; every registration it
/// receives arrives on the returned channel with its Authorization header.
fn test_controller(ns: &Netns) -> (SocketAddr, mpsc::Receiver<(Option<String>, HostReport)>) {
    let listener = ns.run(|| TcpListener::bind("127.0.0.1:0").unwrap());
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async move {
            listener.set_nonblocking(true).unwrap();
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            let put = move |headers: axum::http::HeaderMap, Json(report): Json<HostReport>| {
                let auth =
                    headers.get("authorization").and_then(|v| v.to_str().ok()).map(String::from);
                let _ = tx.send((auth, report));
                async { axum::http::StatusCode::NO_CONTENT }
            };
            let app = support::agents::as_controller(
                axum::Router::new().route("/v1/hosts/{host}", axum::routing::put(put)),
            );
            axum::serve(listener, app).await.unwrap();
        });
    });
    (addr, rx)
}

/// The host's ruleset without the agent's table (handles included, so any change shows).
fn foreign_ruleset(ns: &Netns) -> Vec<Value> {
    let out = ns.exec(&["nft", "-j", "list", "ruleset"]);
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    doc["nftables"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|o| o.get("metainfo").is_none())
        .filter(|o| {
            let obj = o.as_object().unwrap().values().next().unwrap();
            let table = obj.get("table").or_else(|| obj.get("name")).and_then(Value::as_str);
            !((obj["family"] == "ip" || obj["family"] == "ip6") && table == Some("rodvr"))
        })
        .cloned()
        .collect()
}

/// Like [`ask`], from source address `src` (one `ns` holds).
fn ask_from(ns: &Netns, src: &str, addr: &str) -> Option<String> {
    let (src, addr): (std::net::IpAddr, SocketAddr) = (src.parse().unwrap(), addr.parse().unwrap());
    ns.run(|| {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            use tokio::io::AsyncBufReadExt;
            let socket = tokio::net::TcpSocket::new_v4().ok()?;
            socket.bind(SocketAddr::new(src, 0)).ok()?;
            let connect = tokio::time::timeout(Duration::from_secs(1), socket.connect(addr));
            let conn = connect.await.ok()?.ok()?;
            let mut line = String::new();
            let mut reader = tokio::io::BufReader::new(conn);
            let read = tokio::time::timeout(Duration::from_secs(2), reader.read_line(&mut line));
            read.await.ok()?.ok()?;
            Some(line.trim().to_owned())
        })
    })
}

/// Writes an agent config for `host` in `dir` (controller key pair from `seed`, the masked range and
/// GPU interface every test uses, then `extra` TOML); returns its path and the controller's private key.
fn write_agent_config(dir: &TempDir, host: &str, seed: u8, extra: &str) -> (PathBuf, String) {
    write_agent_config_on(dir, host, seed, "127.0.0.1:0", extra)
}

/// [`write_agent_config`], the agent listening on `listen`.
fn write_agent_config_on(
    dir: &TempDir,
    host: &str,
    seed: u8,
    listen: &str,
    extra: &str,
) -> (PathBuf, String) {
    let (private, public) = key_pair(seed);
    std::fs::write(dir.path().join("controller.pub.pem"), public).unwrap();
    let config = dir.path().join("agent.toml");
    std::fs::write(
        &config,
        format!(
            r#"host = "{host}"
listen = "{listen}"
state_file = "{dir}/routes.json"
controller_public_key = "{dir}/controller.pub.pem"
masked_range = "100.127.0.0/16"
gpu_interface = "gpu0"
{extra}"#,
            dir = dir.path().display()
        ),
    )
    .unwrap();
    (config, private)
}

#[test]
fn masked_routes_on_the_real_kernel() {
    require_root_tools();
    let t = topology();
    let dir = TempDir::new("netns");
    stand_in_rcuda(&t.gh, "10.232.0.2:8308", "gpu0");
    stand_in_rcuda(&t.gh, "10.232.0.2:8309", "gpu1");
    stand_in_rcuda(&t.gh, "100.127.0.1:9000", "decoy");

    // Without the agent, VM2 reaches the GPU host directly: the test can tell blocked from broken.
    assert_eq!(ask(&t.vm2, "10.232.0.2:8308").as_deref(), Some("gpu0 10.231.2.2"));
    assert_eq!(ask(&t.vm2, "100.127.0.1:9000").as_deref(), Some("decoy 10.231.2.2"));

    // A host firewall table the agent must never touch.
    t.ch.exec(&["nft", "add", "table", "inet", "hostfw"]);
    t.ch.exec(&[
        "nft",
        "add chain inet hostfw input { type filter hook input priority 10; policy accept; }",
    ]);
    t.ch.exec(&["nft", "add", "rule", "inet", "hostfw", "input", "tcp", "dport", "22", "accept"]);
    let host_rules = foreign_ruleset(&t.ch);

    let (config, private) = write_agent_config(&dir, "crg0", 21, "");
    let mut agent = AgentProcess::start(&t.ch, &config);
    let signer = TokenSigner::from_private_pem(private.as_bytes(), "gsaasd").unwrap();
    let crg0 = HostId::new("crg0").unwrap();
    let client = AgentClient::new(&agent.url, crg0.clone(), signer.clone());

    let vm1_route = route(1, "tap1", "10.231.1.2", "100.127.0.1:9000", "10.232.0.2:8308");
    let vm2_route = route(2, "tap2", "10.231.2.2", "100.127.0.1:9001", "10.232.0.2:8309");
    let gen1 = RouteTable {
        generation: 1,
        routes: vec![vm1_route.clone(), vm2_route.clone()],
        metadata: None,
        vms_without_cgpus: vec![],
        lost: vec![],
        servers: vec![],
    };
    with_client(&t.ch, &client, async |c| c.put_routes(&gen1).await.unwrap());

    // VM1 reaches its cGPU through the masked endpoint; the server sees the compute host.
    let expect_gpu0 = format!("gpu0 {COMPUTE_GPU_SIDE}");
    assert_eq!(ask(&t.vm1, "100.127.0.1:9000"), Some(expect_gpu0.clone()));
    // VM2 reaches its own cGPU, but neither VM1's nor the GPU host.
    assert_eq!(ask(&t.vm2, "100.127.0.1:9001"), Some(format!("gpu1 {COMPUTE_GPU_SIDE}")));
    assert_eq!(ask(&t.vm2, "100.127.0.1:9000"), None, "VM2 reached VM1's cGPU");
    assert_eq!(ask(&t.vm2, "10.232.0.2:8308"), None, "VM2 reached the GPU host directly");
    assert_eq!(ask(&t.vm1, "10.232.0.2:8309"), None, "VM1 reached the GPU host directly");

    // Unsigned requests change nothing.
    let empty = RouteTable {
        generation: 9,
        routes: vec![],
        metadata: None,
        vms_without_cgpus: vec![],
        lost: vec![],
        servers: vec![],
    };
    assert_eq!(unsigned_put(&t.ch, &agent.url, &empty), 401);
    let back = with_client(&t.ch, &client, async |c| c.routes().await.unwrap());
    assert_eq!((back.applied_generation, back.desired), (Some(1), Some(gen1)));
    assert_eq!(ask(&t.vm1, "100.127.0.1:9000"), Some(expect_gpu0.clone()));

    // Removing the route cuts VM1 off, including a connection it already has open; VM2 is
    // unaffected.
    let (mut open_conn, _) = open(&t.vm1, "100.127.0.1:9000").unwrap();
    assert!(still_open(&mut open_conn));
    let gen2 = RouteTable {
        generation: 2,
        routes: vec![vm2_route.clone()],
        metadata: None,
        vms_without_cgpus: vec![],
        lost: vec![],
        servers: vec![],
    };
    with_client(&t.ch, &client, async |c| c.put_routes(&gen2).await.unwrap());
    assert_eq!(ask(&t.vm1, "100.127.0.1:9000"), None, "VM1 still reaches a removed route");
    assert!(!still_open(&mut open_conn), "VM1's open connection survived the route's removal");
    assert_eq!(ask(&t.vm2, "100.127.0.1:9001"), Some(format!("gpu1 {COMPUTE_GPU_SIDE}")));

    let gen3 = RouteTable {
        generation: 3,
        routes: vec![vm2_route, vm1_route],
        metadata: None,
        vms_without_cgpus: vec![],
        lost: vec![],
        servers: vec![],
    };
    with_client(&t.ch, &client, async |c| c.put_routes(&gen3).await.unwrap());
    assert_eq!(ask(&t.vm1, "100.127.0.1:9000"), Some(expect_gpu0.clone()));

    // Kill the agent and lose the kernel table (as a reboot would): VM1's cGPU is gone (plain
    // routing now leads to the decoy) until the restarted agent re-applies its state file, with
    // no controller involved.
    agent.kill();
    t.ch.exec(&["nft", "delete", "table", "ip", "rodvr"]);
    assert_eq!(ask(&t.vm1, "100.127.0.1:9000"), Some("decoy 10.231.1.2".into()));
    let agent = AgentProcess::start(&t.ch, &config);
    assert_eq!(ask(&t.vm1, "100.127.0.1:9000"), Some(expect_gpu0));
    let client = AgentClient::new(&agent.url, crg0, signer);
    let back = with_client(&t.ch, &client, async |c| c.routes().await.unwrap());
    assert_eq!(back.applied_generation, Some(3));

    assert_eq!(foreign_ruleset(&t.ch), host_rules, "the agent changed a table that is not its own");
}

/// Re-homing (issue [4/5]): a route whose target changes keeps its masked endpoint; new
/// connections reach the new GPU, and a connection open to the old one ends (conntrack would
/// otherwise keep it going there), cut or not, while another VM's connection is untouched.
#[test]
fn a_retargeted_route_cuts_open_connections_and_new_ones_reach_the_new_gpu() {
    require_root_tools();
    let t = topology();
    let dir = TempDir::new("netns-retarget");
    stand_in_rcuda(&t.gh, "10.232.0.2:8308", "gpu0");
    stand_in_rcuda(&t.gh, "10.232.0.2:8309", "gpu1");
    let (config, private) = write_agent_config(&dir, "crg0", 27, "");
    let agent = AgentProcess::start(&t.ch, &config);
    let signer = TokenSigner::from_private_pem(private.as_bytes(), "gsaasd").unwrap();
    let client = AgentClient::new(&agent.url, HostId::new("crg0").unwrap(), signer);
    let table = |generation, vm1_target: &str| RouteTable {
        generation,
        routes: vec![
            route(1, "tap1", "10.231.1.2", "100.127.0.1:9000", vm1_target),
            route(2, "tap2", "10.231.2.2", "100.127.0.1:9000", "10.232.0.2:8308"),
        ],
        metadata: None,
        vms_without_cgpus: vec![],
        lost: vec![],
        servers: vec![],
    };
    with_client(&t.ch, &client, async |c| {
        c.put_routes(&table(1, "10.232.0.2:8308")).await.unwrap()
    });
    let (mut vm1_conn, greeting) = open(&t.vm1, "100.127.0.1:9000").unwrap();
    assert_eq!(greeting, format!("gpu0 {COMPUTE_GPU_SIDE}"));
    let (mut vm2_conn, _) = open(&t.vm2, "100.127.0.1:9000").unwrap();
    assert!(still_open(&mut vm1_conn) && still_open(&mut vm2_conn));

    with_client(&t.ch, &client, async |c| {
        c.put_routes(&table(2, "10.232.0.2:8309")).await.unwrap()
    });
    assert!(!still_open(&mut vm1_conn), "VM1's connection to its old GPU survived the re-target");
    assert_eq!(ask(&t.vm1, "100.127.0.1:9000"), Some(format!("gpu1 {COMPUTE_GPU_SIDE}")));
    assert!(still_open(&mut vm2_conn), "another VM's connection was cut");
    let state = with_client(&t.ch, &client, async |c| c.routes().await.unwrap());
    assert_eq!(state.applied_generation, Some(2));
    drop(agent);

    // The cut fails (no conntrack to run): the table is applied all the same, since the filters
    // reset a re-targeted route's old connection at its next packet; nothing waits for the cut.
    let (broken, _) = write_agent_config(&dir, "crg0", 27, "conntrack_command = [\"false\"]");
    let agent = AgentProcess::start(&t.ch, &broken);
    let client = AgentClient::new(&agent.url, HostId::new("crg0").unwrap(), client_signer(27));
    let (mut vm1_conn, greeting) = open(&t.vm1, "100.127.0.1:9000").unwrap();
    assert_eq!(greeting, format!("gpu1 {COMPUTE_GPU_SIDE}"));
    assert!(still_open(&mut vm1_conn));
    with_client(&t.ch, &client, async |c| {
        c.put_routes(&table(3, "10.232.0.2:8308")).await.unwrap()
    });
    let state = with_client(&t.ch, &client, async |c| c.routes().await.unwrap());
    assert_eq!(state.applied_generation, Some(3), "a failed cut holds nothing back");
    assert!(
        !still_open(&mut vm1_conn),
        "with no cut, VM1's connection went on to its old GPU after the re-target"
    );
    assert_eq!(ask(&t.vm1, "100.127.0.1:9000"), Some(format!("gpu0 {COMPUTE_GPU_SIDE}")));
    assert!(still_open(&mut vm2_conn), "another VM's connection was cut");
}

/// gsaasd's signer for the controller key pair of `seed` (as [`write_agent_config`] writes).
fn client_signer(seed: u8) -> TokenSigner {
    let (private, _) = key_pair(seed);
    TokenSigner::from_private_pem(private.as_bytes(), "gsaasd").unwrap()
}

#[test]
fn a_local_vm_reaches_the_local_rcuda_server_only_through_its_route() {
    require_root_tools();
    // A compute-GPU host (gh) with its own rCUDA servers and a VM (vm3) placed on it.
    let gh = Netns::new("cgpu");
    let vm3 = Netns::new("vm3");
    let other = Netns::new("peer");
    veth(&vm3, "eth0", "10.233.3.2/24", &gh, "tap3", "10.233.3.1/24");
    veth(&other, "eth0", "10.232.0.9/24", &gh, "gpu0", "10.232.0.2/24");
    vm3.ip(&["route", "add", "default", "via", "10.233.3.1"]);
    gh.enable_forwarding();
    stand_in_rcuda(&gh, "10.232.0.2:8308", "gpu0");
    stand_in_rcuda(&gh, "10.232.0.2:8309", "gpu1");
    assert_eq!(ask(&vm3, "10.232.0.2:8309").as_deref(), Some("gpu1 10.233.3.2"));
    // The rCUDA daemons also answer over IPv6, on every address of the host (as [::] would).
    vm3.addr6("eth0", "fd00:233:3::2/64");
    gh.addr6("tap3", "fd00:233:3::1/64");
    gh.addr6("gpu0", "fd00:232::2/64");
    other.addr6("eth0", "fd00:232::9/64");
    stand_in_rcuda(&gh, "[fd00:233:3::1]:8309", "gpu1-v6");
    stand_in_rcuda(&gh, "[fd00:232::2]:8309", "gpu1-v6-gpunet");
    for ns in [&vm3, &gh, &other] {
        ns.wait_ipv6_ready();
    }
    assert_eq!(ask(&vm3, "[fd00:233:3::1]:8309").as_deref(), Some("gpu1-v6 fd00:233:3::2"));

    let (controller, registrations) = test_controller(&gh);
    let dir = TempDir::new("netns-local");
    let extra = format!(
        r#"[controller]
url = "http://{controller}"
token = "agent-token-cg0"
heartbeat_interval_secs = 1
[rcuda]
address = "10.232.0.2"
base_port = 8308
[[gpus]]
index = 0
model = "stand-in"
memory_mib = 1024
[[gpus]]
index = 1
model = "stand-in"
memory_mib = 1024
"#
    );
    let (config, private) = write_agent_config(&dir, "cg0", 22, &extra);
    let agent = AgentProcess::start(&gh, &config);
    // The agent registers at once, with its own token and its GPU inventory.
    let (auth, report) =
        registrations.recv_timeout(Duration::from_secs(10)).expect("no registration");
    assert_eq!(auth.as_deref(), Some("Bearer agent-token-cg0"));
    assert_eq!((report.host.as_str(), report.kind), ("cg0", HostKind::ComputeGpu));
    assert_eq!(report.agent_url, agent.url);
    assert_eq!(report.gpus.len(), 2);
    let client = AgentClient::new(
        &agent.url,
        HostId::new("cg0").unwrap(),
        TokenSigner::from_private_pem(private.as_bytes(), "gsaasd").unwrap(),
    );
    let host = with_client(&gh, &client, async |c| c.host().await.unwrap());
    let ports: Vec<u16> = host.gpus.iter().map(|g| g.rcuda.port).collect();
    assert_eq!(ports, [8308, 8309]);

    let table = RouteTable {
        generation: 1,
        routes: vec![route(3, "tap3", "10.233.3.2", "100.127.0.7:9000", "10.232.0.2:8308")],
        metadata: None,
        vms_without_cgpus: vec![],
        lost: vec![],
        servers: vec![],
    };
    with_client(&gh, &client, async |c| c.put_routes(&table).await.unwrap());
    assert_eq!(ask(&vm3, "100.127.0.7:9000").as_deref(), Some("gpu0 10.233.3.2"));
    // Heartbeats keep coming and report what is applied.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let reported = std::iter::from_fn(|| {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        registrations.recv_timeout(left).ok()
    })
    .any(|(_, report)| report.applied_generation == Some(1));
    assert!(reported, "no heartbeat reported generation 1 within 10 s");
    assert_eq!(ask(&vm3, "10.232.0.2:8309"), None, "the local VM reached an rCUDA server directly");
    assert_eq!(ask(&vm3, "10.232.0.2:8308"), None, "the local VM reached its server unmasked");
    assert_eq!(ask(&vm3, "[fd00:233:3::1]:8309"), None, "the local VM reached rCUDA over IPv6");
    // Compute-rGPU hosts on the GPU network still reach the local servers.
    assert_eq!(ask(&other, "10.232.0.2:8309").as_deref(), Some("gpu1 10.232.0.9"));
    let over_v6 = ask(&other, "[fd00:232::2]:8309");
    assert_eq!(over_v6.as_deref(), Some("gpu1-v6-gpunet fd00:232::9"));
}

/// A VM that takes another VM's address (and gets the replies: an overlapping tenant network, or
/// a host route an attacker steered) still sends from its own tap: it matches none of the other
/// VM's routes, and reaches nothing.
#[test]
fn a_vm_with_another_vms_address_reaches_none_of_its_cgpus() {
    require_root_tools();
    let t = topology();
    stand_in_rcuda(&t.gh, "10.232.0.2:8308", "gpu0");
    let dir = TempDir::new("netns-spoof");
    let (config, private) = write_agent_config(&dir, "crg2", 24, "");
    let agent = AgentProcess::start(&t.ch, &config);
    let signer = TokenSigner::from_private_pem(private.as_bytes(), "gsaasd").unwrap();
    let client = AgentClient::new(&agent.url, HostId::new("crg2").unwrap(), signer);
    let vm1 = |tap: &str| route(1, tap, "10.231.1.2", "100.127.0.1:9000", "10.232.0.2:8308");
    let table = RouteTable {
        generation: 1,
        routes: vec![vm1("tap1")],
        metadata: None,
        vms_without_cgpus: vec![],
        lost: vec![],
        servers: vec![],
    };
    with_client(&t.ch, &client, async |c| c.put_routes(&table).await.unwrap());
    let expect = Some(format!("gpu0 {COMPUTE_GPU_SIDE}"));
    assert_eq!(ask(&t.vm1, "100.127.0.1:9000"), expect);

    // VM2 sends from VM1's address, and the host sends that address's replies to VM2's tap.
    t.vm2.ip(&["addr", "add", "10.231.1.2/32", "dev", "eth0"]);
    t.ch.ip(&["route", "add", "10.231.1.2/32", "dev", "tap2"]);
    for interface in ["all", "default", "tap1", "tap2"] {
        t.ch.sysctl(&format!("net/ipv4/conf/{interface}/rp_filter"), "0");
    }
    assert_eq!(ask_from(&t.vm2, "10.231.1.2", "100.127.0.1:9000"), None, "VM2 reached VM1's cGPU");
    assert_eq!(ask_from(&t.vm2, "10.231.1.2", "10.232.0.2:8308"), None);

    // The spoofed packets do flow where a route names VM2's tap: only the binding stopped them.
    let table = RouteTable {
        generation: 2,
        routes: vec![vm1("tap2")],
        metadata: None,
        vms_without_cgpus: vec![],
        lost: vec![],
        servers: vec![],
    };
    with_client(&t.ch, &client, async |c| c.put_routes(&table).await.unwrap());
    assert_eq!(ask_from(&t.vm2, "10.231.1.2", "100.127.0.1:9000"), expect);
}

/// `GET path` over HTTP/1.0 from `ns` (from `src` when given): the status and body, if anything
/// answered.
fn http_get(ns: &Netns, src: Option<&str>, addr: &str, path: &str) -> Option<(u16, String)> {
    let (addr, src): (SocketAddr, Option<std::net::IpAddr>) =
        (addr.parse().unwrap(), src.map(|s| s.parse().unwrap()));
    ns.run(|| {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let socket = tokio::net::TcpSocket::new_v4().ok()?;
            if let Some(src) = src {
                socket.bind(SocketAddr::new(src, 0)).ok()?;
            }
            let connect = tokio::time::timeout(Duration::from_secs(1), socket.connect(addr));
            let mut conn = connect.await.ok()?.ok()?;
            let request = format!("GET {path} HTTP/1.0\r\nHost: metadata\r\n\r\n");
            conn.write_all(request.as_bytes()).await.ok()?;
            let mut response = String::new();
            let read =
                tokio::time::timeout(Duration::from_secs(2), conn.read_to_string(&mut response));
            read.await.ok()?.ok()?;
            let (head, body) = response.split_once("\r\n\r\n")?;
            let status = head.split(' ').nth(1)?.parse().ok()?;
            Some((status, body.to_owned()))
        })
    })
}

/// Each VM reads its own live rCUDA environment at the masked metadata endpoint, in the table's
/// order, and nothing reaches the agent's metadata listener but through that route.
#[test]
fn each_vm_reads_only_its_own_environment_at_the_metadata_endpoint() {
    require_root_tools();
    let t = topology();
    let dir = TempDir::new("netns-metadata");
    let listen = "metadata_listen = \"10.231.1.1:8775\"\n";
    let (config, private) = write_agent_config(&dir, "crg3", 25, listen);
    let agent = AgentProcess::start(&t.ch, &config);
    let signer = TokenSigner::from_private_pem(private.as_bytes(), "gsaasd").unwrap();
    let client = AgentClient::new(&agent.url, HostId::new("crg3").unwrap(), signer);
    let metadata = "100.127.0.1:80";
    let vm1_a = route(1, "tap1", "10.231.1.2", "100.127.0.1:9001", "10.232.0.2:8309");
    let vm1_b = Route {
        gpu_number: 2,
        ..route(1, "tap1", "10.231.1.2", "100.127.0.1:9000", "10.232.0.2:8308")
    };
    let vm2 = route(2, "tap2", "10.231.2.2", "100.127.0.1:9000", "10.232.0.2:8308");
    let table = |generation, routes| RouteTable {
        generation,
        routes,
        metadata: Some(metadata.parse().unwrap()),
        vms_without_cgpus: vec![],
        lost: vec![],
        servers: vec![],
    };
    let gen1 = table(1, vec![vm1_a, vm2.clone(), vm1_b.clone()]);
    with_client(&t.ch, &client, async |c| c.put_routes(&gen1).await.unwrap());

    let env = |ns: &Netns, src: Option<&str>, path: &str| http_get(ns, src, metadata, path);
    let vm1_env = "export RCUDA_DEVICE_COUNT=2\nexport RCUDA_DEVICE_0=100.127.0.1@9001:0\n\
                   export RCUDA_DEVICE_1=100.127.0.1@9000:2\n";
    assert_eq!(env(&t.vm1, None, "/rcuda.env"), Some((200, vm1_env.into())));
    let vm2_env = "export RCUDA_DEVICE_COUNT=1\nexport RCUDA_DEVICE_0=100.127.0.1@9000:0\n";
    assert_eq!(env(&t.vm2, None, "/rcuda.env"), Some((200, vm2_env.into())));
    let (status, json) = env(&t.vm2, None, "/rcuda.json").unwrap();
    let json: Value = serde_json::from_str(&json).unwrap();
    assert_eq!((status, &json["RCUDA_DEVICE_0"]), (200, &Value::from("100.127.0.1@9000:0")));

    // The listener itself is closed to VMs (and the listener does answer: from the host).
    assert_eq!(http_get(&t.vm1, None, "10.231.1.1:8775", "/rcuda.env"), None);
    assert_eq!(http_get(&t.vm2, None, "10.231.1.1:8775", "/rcuda.env"), None);
    assert_eq!(http_get(&t.ch, None, "10.231.1.1:8775", "/rcuda.env").map(|r| r.0), Some(404));

    // VM2 taking VM1's address reaches no metadata of VM1's.
    t.vm2.ip(&["addr", "add", "10.231.1.2/32", "dev", "eth0"]);
    t.ch.ip(&["route", "add", "10.231.1.2/32", "dev", "tap2"]);
    for interface in ["all", "default", "tap1", "tap2"] {
        t.ch.sysctl(&format!("net/ipv4/conf/{interface}/rp_filter"), "0");
    }
    assert_eq!(env(&t.vm2, Some("10.231.1.2"), "/rcuda.env"), None, "VM2 read VM1's environment");
    t.ch.ip(&["route", "del", "10.231.1.2/32", "dev", "tap2"]);

    // A detach: VM1's environment follows the table.
    let gen2 = table(2, vec![vm2.clone(), vm1_b.clone()]);
    with_client(&t.ch, &client, async |c| c.put_routes(&gen2).await.unwrap());
    let vm1_env = "export RCUDA_DEVICE_COUNT=1\nexport RCUDA_DEVICE_0=100.127.0.1@9000:2\n";
    assert_eq!(env(&t.vm1, None, "/rcuda.env"), Some((200, vm1_env.into())));

    // Detached down to no cGPU, VM1 still reads its environment: no device.
    let idle = VmPort {
        vm: vm1_b.vm,
        vm_ip: vm1_b.vm_ip,
        vm_tap: vm1_b.vm_tap,
        remoting: Default::default(),
    };
    let gen3 = RouteTable { vms_without_cgpus: vec![idle], ..table(3, vec![vm2]) };
    with_client(&t.ch, &client, async |c| c.put_routes(&gen3).await.unwrap());
    let vm1_env = "export RCUDA_DEVICE_COUNT=0\n";
    assert_eq!(env(&t.vm1, None, "/rcuda.env"), Some((200, vm1_env.into())));
    assert_eq!(env(&t.vm2, None, "/rcuda.env"), Some((200, vm2_env.into())));
}

/// One VM that opens connection after connection to the metadata endpoint and never asks
/// anything (1,100 of them, more than the agent serves at once) holds only its own share of the
/// listener: its neighbour still reads its environment.
#[test]
fn one_vm_cannot_starve_its_neighbours_environment() {
    require_root_tools();
    let t = topology();
    let dir = TempDir::new("netns-metadata-flood");
    let listen = "metadata_listen = \"10.231.1.1:8775\"\n";
    let (config, private) = write_agent_config(&dir, "crg3", 26, listen);
    let agent = AgentProcess::start(&t.ch, &config);
    let signer = TokenSigner::from_private_pem(private.as_bytes(), "gsaasd").unwrap();
    let client = AgentClient::new(&agent.url, HostId::new("crg3").unwrap(), signer);
    let metadata = "100.127.0.1:80";
    let table = RouteTable {
        generation: 1,
        routes: vec![
            route(1, "tap1", "10.231.1.2", "100.127.0.1:9000", "10.232.0.2:8308"),
            route(2, "tap2", "10.231.2.2", "100.127.0.1:9000", "10.232.0.2:8309"),
        ],
        metadata: Some(metadata.parse().unwrap()),
        vms_without_cgpus: vec![],
        lost: vec![],
        servers: vec![],
    };
    with_client(&t.ch, &client, async |c| c.put_routes(&table).await.unwrap());

    let addr: SocketAddr = metadata.parse().unwrap();
    let flood: Vec<TcpStream> = t.vm1.run(|| {
        (0..1100)
            .filter_map(|_| TcpStream::connect_timeout(&addr, Duration::from_millis(500)).ok())
            .collect()
    });
    assert!(flood.len() > 1024, "the flood opened only {} connections", flood.len());
    let vm2_env = "export RCUDA_DEVICE_COUNT=1\nexport RCUDA_DEVICE_0=100.127.0.1@9000:0\n";
    assert_eq!(
        http_get(&t.vm2, None, metadata, "/rcuda.env"),
        Some((200, vm2_env.into())),
        "VM1's idle connections starved VM2's environment"
    );
    drop(flood);
}

/// The agent's own API (and its `/metrics`) answers on the management address's interface only:
/// a VM that sends to that address through its gateway gets nothing, while the management side
/// is served.
#[test]
fn a_vm_cannot_reach_its_hosts_agent() {
    require_root_tools();
    let t = topology();
    let ctl = Netns::new("ctl");
    veth(&ctl, "eth0", "10.240.0.2/24", &t.ch, "mgmt0", "10.240.0.1/24");
    let dir = TempDir::new("netns-agent-api");
    let (config, private) = write_agent_config_on(&dir, "crg3", 27, "10.240.0.1:7450", "");
    let agent = AgentProcess::start(&t.ch, &config);
    let signer = TokenSigner::from_private_pem(private.as_bytes(), "gsaasd").unwrap();
    let client = AgentClient::new(&agent.url, HostId::new("crg3").unwrap(), signer);
    let table = RouteTable {
        generation: 1,
        routes: vec![route(1, "tap1", "10.231.1.2", "100.127.0.1:9000", "10.232.0.2:8308")],
        metadata: None,
        vms_without_cgpus: vec![],
        lost: vec![],
        servers: vec![],
    };
    with_client(&t.ch, &client, async |c| c.put_routes(&table).await.unwrap());
    let from_management = http_get(&ctl, None, "10.240.0.1:7450", "/metrics");
    assert_eq!(from_management.map(|r| r.0), Some(200), "the management side is not served");
    assert_eq!(http_get(&t.vm1, None, "10.240.0.1:7450", "/metrics"), None, "a VM read /metrics");
    assert_eq!(http_get(&t.vm1, None, "10.231.1.1:7450", "/metrics"), None);
    assert_eq!(http_get(&t.vm2, None, "10.240.0.1:7450", "/v1/health"), None);
}

/// Masked endpoints are IPv4; over IPv6 a VM reaches nothing on the GPU network.
#[test]
fn a_vm_reaches_nothing_on_the_gpu_network_over_ipv6() {
    require_root_tools();
    let t = topology();
    t.gh.addr6("eth0", "fd00:232::2/64");
    t.ch.addr6("gpu0", "fd00:232::1/64");
    t.vm2.addr6("eth0", "fd00:231:2::2/64");
    t.ch.addr6("tap2", "fd00:231:2::1/64");
    t.vm2.ip(&["-6", "route", "add", "default", "via", "fd00:231:2::1"]);
    t.gh.ip(&["-6", "route", "add", "fd00:231::/32", "via", "fd00:232::1"]);
    stand_in_rcuda(&t.gh, "[fd00:232::2]:8308", "gpu0-v6");
    for ns in [&t.vm2, &t.ch, &t.gh] {
        ns.wait_ipv6_ready();
    }
    assert_eq!(
        ask(&t.vm2, "[fd00:232::2]:8308").as_deref(),
        Some("gpu0-v6 fd00:231:2::2"),
        "the test topology is broken: no IPv6 path to the GPU host"
    );
    let dir = TempDir::new("netns-v6");
    let (config, _) = write_agent_config(&dir, "crg3", 25, "");
    let _agent = AgentProcess::start(&t.ch, &config);
    assert_eq!(ask(&t.vm2, "[fd00:232::2]:8308"), None, "a VM reached the GPU network over IPv6");
}

fn routes_to(n: u32, target: &str) -> rodvr_core::render::RouteMap {
    use rodvr_core::render::RouteKey;
    (0..n)
        .map(|i| {
            let ip = std::net::Ipv4Addr::from(u32::from(std::net::Ipv4Addr::new(10, 64, 0, 0)) + i);
            let key = RouteKey {
                tap: format!("tap{i}"),
                ip,
                masked: "100.127.0.1:9000".parse().unwrap(),
            };
            (key, target.parse().unwrap())
        })
        .collect()
}

/// The number of elements in one of the agent's maps.
fn map_len(ns: &Netns, map: &str) -> usize {
    let out = ns.exec(&["nft", "-j", "list", "map", "ip", "rodvr", map]);
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    let map = doc["nftables"].as_array().unwrap().iter().find_map(|o| o.get("map")).unwrap();
    map.get("elem").and_then(Value::as_array).map_or(0, Vec::len)
}

#[test]
fn the_nft_firewall_reports_each_failed_transaction_and_goes_on() {
    use rodvr_agent::nft::{NftFirewall, SESSION_MAX_DOC};
    use rodvr_core::firewall::{Firewall, FirewallError};
    use rodvr_core::render::{target_ids, Transaction};
    require_root_tools();
    let ns = Netns::new("fw");
    let params = rodvr_core::fixtures::params();
    let mut fw = NftFirewall::new(
        &ns.command_prefix().into_iter().chain(["nft".into()]).collect::<Vec<_>>(),
    );
    // A full table too big for the session goes through `nft -j -f -`.
    let big = routes_to(2_000, "10.232.0.2:8308");
    let replace = Transaction::Replace { params: params.clone(), routes: big.clone() };
    assert!(replace.to_nft_string().len() > SESSION_MAX_DOC);
    fw.apply(&replace).unwrap();
    assert_eq!(map_len(&ns, "routes"), 2_000);

    // Small changes go through the session, one transaction each.
    let mut fewer = big.clone();
    fewer.pop_first();
    let remove = Transaction::diff(&big, &target_ids(&big), &fewer).unwrap();
    assert!(remove.to_nft_string().len() <= SESSION_MAX_DOC);
    fw.apply(&remove).unwrap();
    assert_eq!(map_len(&ns, "routes"), 1_999);
    // The same removal again deletes a missing element: the kernel refuses it, the error comes
    // back for this change, nothing of it applied, and the session takes the next change.
    let err = fw.apply(&remove).unwrap_err();
    assert!(matches!(&err, FirewallError::Rejected(msg) if msg.contains("Error")), "{err:?}");
    assert_eq!(map_len(&ns, "routes"), 1_999);
    let mut retargeted = fewer.clone();
    let (first, _) = fewer.first_key_value().unwrap();
    retargeted.insert(first.clone(), "10.232.0.2:8309".parse().unwrap());
    let update = Transaction::diff(&fewer, &target_ids(&big), &retargeted).unwrap();
    fw.apply(&update).unwrap();
    assert_eq!(map_len(&ns, "routes"), 1_999);
    assert_eq!(map_len(&ns, "targets"), 2);
    // An update against a table that is gone fails too.
    ns.exec(&["nft", "delete", "table", "ip", "rodvr"]);
    assert!(fw.apply(&update).is_err());
    // A small full table goes through the session as well.
    fw.apply(&Transaction::Replace { params, routes: routes_to(3, "10.232.0.2:8308") }).unwrap();
    assert_eq!(map_len(&ns, "routes"), 3);
}

#[test]
fn marks_set_by_other_rulesets_survive_a_masked_route_and_its_retarget() {
    require_root_tools();
    let t = topology();
    stand_in_rcuda(&t.gh, "10.232.0.2:8308", "gpu0");
    stand_in_rcuda(&t.gh, "10.232.0.2:8309", "gpu1");
    let dir = TempDir::new("netns-marks");
    // Cuts do nothing here: only the filters end a re-targeted route's open connections.
    let (config, private) = write_agent_config(&dir, "crg1", 23, "conntrack_command = [\"true\"]");
    let agent = AgentProcess::start(&t.ch, &config);
    let client = AgentClient::new(
        &agent.url,
        HostId::new("crg1").unwrap(),
        TokenSigner::from_private_pem(private.as_bytes(), "gsaasd").unwrap(),
    );
    let table = |generation, target: &str| RouteTable {
        generation,
        routes: vec![
            route(1, "tap1", "10.231.1.2", "100.127.0.1:9000", target),
            route(2, "tap2", "10.231.2.2", "100.127.0.1:9000", target),
        ],
        metadata: None,
        vms_without_cgpus: vec![],
        lost: vec![],
        servers: vec![],
    };
    with_client(&t.ch, &client, async |c| {
        c.put_routes(&table(1, "10.232.0.2:8308")).await.unwrap()
    });

    // Another ruleset marks packets (vm1) or connections (vm2) before DNAT, and
    // counts, after the agent's NAT, the connection openings that still carry its marks.
    let nft = |rule: &str| t.ch.exec(&["nft", rule]);
    nft("add table ip other");
    nft("add chain ip other marking { type filter hook prerouting priority -150; policy accept; }");
    nft("add rule ip other marking iifname \"tap1\" meta mark set 0x42");
    nft("add rule ip other marking iifname \"tap2\" ct state new ct mark set 0x7");
    nft("add chain ip other observe { type filter hook forward priority -10; policy accept; }");
    nft("add rule ip other observe tcp flags syn / syn,ack meta mark 0x42 ct mark 0 counter");
    nft("add rule ip other observe tcp flags syn / syn,ack meta mark 0 ct mark 0x7 counter");
    // After the agent's filters, every packet of theirs still carries its marks.
    nft("add chain ip other after { type filter hook forward priority 10; policy accept; }");
    nft("add rule ip other after iifname \"tap1\" meta mark != 0x42 counter");
    nft("add rule ip other after iifname \"tap1\" ct mark != 0 counter");
    nft("add rule ip other after iifname \"tap2\" meta mark != 0 counter");
    nft("add rule ip other after iifname \"tap2\" ct mark != 0x7 counter");
    let expect = format!("gpu0 {COMPUTE_GPU_SIDE}");
    // vm1's packets are marked, so the conntrack mark carries the lookup; vm2's connections
    // are marked, so the packet mark does.
    assert_eq!(ask(&t.vm1, "100.127.0.1:9000"), Some(expect.clone()));
    assert_eq!(ask(&t.vm2, "100.127.0.1:9000"), Some(expect));
    assert_eq!(counters(&t.ch, "observe"), [1, 1], "a mark was changed by the agent's NAT");

    // A re-target: each VM's open connection is reset at its next packet by the filters, whichever
    // mark carried its route's target there, and no mark is left changed.
    let (mut vm1_conn, _) = open(&t.vm1, "100.127.0.1:9000").unwrap();
    let (mut vm2_conn, _) = open(&t.vm2, "100.127.0.1:9000").unwrap();
    assert!(still_open(&mut vm1_conn) && still_open(&mut vm2_conn));
    with_client(&t.ch, &client, async |c| {
        c.put_routes(&table(2, "10.232.0.2:8309")).await.unwrap()
    });
    assert!(!still_open(&mut vm1_conn), "VM1's connection (packets marked) outlived its re-target");
    assert!(!still_open(&mut vm2_conn), "VM2's connection (marked) outlived its re-target");
    let expect = format!("gpu1 {COMPUTE_GPU_SIDE}");
    assert_eq!(ask(&t.vm1, "100.127.0.1:9000"), Some(expect.clone()));
    assert_eq!(ask(&t.vm2, "100.127.0.1:9000"), Some(expect));
    assert_eq!(counters(&t.ch, "after"), [0, 0, 0, 0], "the agent's filters left a mark changed");
}

/// The packet counts of the rules of `chain` in `table ip other`, in order.
fn counters(ns: &Netns, chain: &str) -> Vec<u64> {
    let out = ns.exec(&["nft", "-j", "list", "chain", "ip", "other", chain]);
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    doc["nftables"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|o| o.get("rule"))
        .map(|r| {
            let counter = r["expr"].as_array().unwrap().iter().find_map(|e| e.get("counter"));
            counter.unwrap()["packets"].as_u64().unwrap()
        })
        .collect()
}

/// A GPU host whose agent runs its GPUs' servers itself (`[gpu_servers] managed`): a table's
/// servers start (the answer gives each one's port once it accepts), a local VM reaches its
/// cGPU's server through its route, and neither that server's port nor any other of the
/// servers' range directly (a managed server is as closed to VMs as an operator's).
#[test]
fn a_local_vm_reaches_a_managed_server_only_through_its_route() {
    require_root_tools();
    let gh = Netns::new("mgpu");
    let vm3 = Netns::new("mvm3");
    let other = Netns::new("mpeer");
    veth(&vm3, "eth0", "10.233.3.2/24", &gh, "tap3", "10.233.3.1/24");
    veth(&other, "eth0", "10.232.0.9/24", &gh, "gpu0", "10.232.0.2/24");
    vm3.ip(&["route", "add", "default", "via", "10.233.3.1"]);
    gh.enable_forwarding();
    // Another process on a port of the servers' range: without the agent, the VM reaches it.
    stand_in_rcuda(&gh, "10.232.0.2:20105", "squatter");
    assert_eq!(ask(&vm3, "10.232.0.2:20105").as_deref(), Some("squatter 10.233.3.2"));

    let dir = TempDir::new("netns-managed");
    let cgroups = support::servers::ServerCgroups::new("netns-managed");
    let script = support::servers::standin_server(dir.path());
    let extra = format!(
        r#"[gpu_servers]
address = "10.232.0.2"
remoting = "lupine"
managed = true
command = ["/usr/bin/python3", "{script}"]
ports = "20100-20109"
user = "nobody"
run_dir = "{run}"
cgroup = "{cgroup}"
[[gpus]]
index = 0
model = "stand-in"
memory_mib = 8192
uuid = "GPU-netns-0"
"#,
        script = script.display(),
        run = dir.path().join("servers").display(),
        cgroup = cgroups.path.display(),
    );
    let (config, private) = write_agent_config(&dir, "mg0", 23, &extra);
    let agent = AgentProcess::start_entering(&gh, &config);
    let client = AgentClient::new(
        &agent.url,
        HostId::new("mg0").unwrap(),
        TokenSigner::from_private_pem(private.as_bytes(), "gsaasd").unwrap(),
    );
    let vm = gpgpums::VmId::from_uuid(uuid::Uuid::from_u128(3));
    let server = |clients: &[&str]| rodvr_contract::protocol::ServerSpec {
        vm,
        index: 0,
        gpu: gpgpums::GpuId::new("mg0:gpu0").unwrap(),
        memory_mib: Some(1024),
        clients: clients.iter().map(|c| c.parse().unwrap()).collect(),
        compute_percent: None,
    };
    let table = |generation: u64, routes: Vec<Route>| RouteTable {
        generation,
        routes,
        metadata: None,
        vms_without_cgpus: vec![],
        lost: vec![],
        servers: vec![server(&[])],
    };
    // The server first: the answer says where it accepts.
    let applied =
        with_client(&gh, &client, async |c| c.put_routes(&table(1, vec![])).await.unwrap());
    let port = applied.servers[0].live_port().expect("the server accepts before the answer");
    assert!((20100..=20104).contains(&port), "{port}");
    // Then the VM's route to it.
    let to_server = Route {
        index: Some(0),
        remoting: gpgpums::Remoting::Lupine,
        ..route(3, "tap3", "10.233.3.2", "100.127.0.7:9000", &format!("10.232.0.2:{port}"))
    };
    with_client(&gh, &client, async |c| c.put_routes(&table(2, vec![to_server])).await.unwrap());
    assert_eq!(ask(&vm3, "100.127.0.7:9000").as_deref(), Some("GPU-netns-0 10.233.3.2"));
    // Not directly: neither its server's port nor another of the range.
    for direct in [format!("10.232.0.2:{port}"), "10.232.0.2:20105".to_owned()] {
        assert_eq!(ask(&vm3, &direct), None, "the VM reached {direct} past its route");
    }
    // From the GPU network, only its clients, on its port only: none yet (a VM of this host).
    assert_eq!(ask(&other, &format!("10.232.0.2:{port}")), None, "a host not its client");
    let mut remote = table(3, vec![]);
    remote.servers = vec![server(&["10.232.0.9"])];
    with_client(&gh, &client, async |c| c.put_routes(&remote).await.unwrap());
    assert_eq!(
        ask(&other, &format!("10.232.0.2:{port}")).as_deref(),
        Some("GPU-netns-0 10.232.0.9"),
        "its VM's host reaches it"
    );
    assert_eq!(ask(&other, "10.232.0.2:20105"), None, "another port of the range");
    // The host's report lists it.
    let host = with_client(&gh, &client, async |c| c.host().await.unwrap());
    let reported = host.managed.expect("a managed host says so").servers;
    assert_eq!(
        reported.iter().map(|s| (s.vm, s.live_port())).collect::<Vec<_>>(),
        [(vm, Some(port))]
    );
    assert!(host.gpus.iter().all(|g| g.attributes.managed));
    // A VM of this host whose cGPU's server comes with the same table: the agent routes it
    // itself (`here`) once its server accepts, in that table, and says so in the answer.
    let mut own = table(4, vec![]);
    own.vms_without_cgpus = vec![VmPort {
        vm,
        vm_ip: "10.233.3.2".parse().unwrap(),
        vm_tap: "tap3".into(),
        remoting: gpgpums::Remoting::Lupine,
    }];
    let here = rodvr_contract::protocol::ServedHere {
        masked: "100.127.0.7:9001".parse().unwrap(),
        gpu_number: 0,
    };
    own.lost = vec![rodvr_contract::protocol::LostCgpu { vm, index: 0, here: Some(here) }];
    let applied = with_client(&gh, &client, async |c| c.put_routes(&own).await.unwrap());
    assert!(applied.servers[0].routed_here, "{:?}", applied.servers);
    assert_eq!(ask(&vm3, "100.127.0.7:9001").as_deref(), Some("GPU-netns-0 10.233.3.2"));
    assert_eq!(ask(&vm3, "100.127.0.7:9000"), None, "the route of the older table is gone");
    // One that names no server of its table is refused, naming it, and changes nothing.
    let mut stray = own;
    stray.generation = 5;
    stray.servers.clear();
    let refused = with_client(&gh, &client, async |c| c.put_routes(&stray).await).unwrap_err();
    assert!(refused.to_string().contains("lost[0].here"), "{refused}");
    assert_eq!(ask(&vm3, "100.127.0.7:9001").as_deref(), Some("GPU-netns-0 10.233.3.2"));
    // A table without it ends it.
    let mut last = table(6, vec![]);
    last.servers.clear();
    with_client(&gh, &client, async |c| c.put_routes(&last).await.unwrap());
    assert!(cgroups.servers().is_empty(), "{:?}", cgroups.servers());
    drop(agent);
}
