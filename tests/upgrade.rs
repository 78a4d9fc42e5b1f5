//! The upgrade test (issue [6/6]): a rolling upgrade from the previous version (the commit in
//! `tests/previous-version`, built by `scripts/build-previous.sh`) to this one, on the real
//! OpenStack of `scripts/openstack-dev.sh`, while a tenant keeps working and its VMs keep talking
//! to their GPUs.
//!
//! ```text
//!  root namespace: Keystone, Nova, Neutron (stand-in), Glance, Placement and a PostgreSQL 15,
//!                  each on 127.0.0.1, relayed into the controller's own 127.0.0.1
//!  management network 10.240.0.0/24 (bridge br0):
//!   controller (.1): gsaasd replicas :8701 and :8702 on one PostgreSQL database, behind a
//!                    virtual IP :8700 (a relay: what a load balancer is in a real cloud)
//!   rgpu-host-1 (.11): rodvr-agent; the VMs (namespaces on their Neutron taps, 10.201.0.0/16)
//!   gpu-host-1 (.12): rodvr-agent; two stand-in rCUDA servers on the GPU network (10.232.0.2)
//! ```
//!
//! Both Nova hosts are the dev cloud's; a VM is the namespace the test plugs on the tap Neutron
//! named for its port, as a hypervisor would. Two replicas must share one cloud, which the
//! in-process simulated one cannot be, and the previous version must speak to it too: so Nova.
//!
//! What it does: the previous version's two replicas and two agents run three VMs of two cGPUs
//! whose VMs hold an open connection to each cGPU's masked endpoint; a tenant launches, attaches,
//! detaches and terminates other VMs through the virtual IP all along. Each replica in turn is
//! drained from the virtual IP, stopped (SIGINT: it finishes what it serves) and started again as
//! this version on the same database (the first to start migrates it, so the old replica beside
//! it runs on the expanded schema: the mixed period); then each agent is stopped (SIGTERM) and
//! started as this version. What must hold throughout and after:
//! - no open connection through a masked endpoint is cut;
//! - no request is answered 5xx, and every request is answered;
//! - launches are refused (anything but 202) for no longer than [`LONGEST_REFUSAL`];
//! - the long-lived VMs keep their cGPUs (same GPUs, same endpoints), every GPU's booked memory is
//!   exactly its cGPUs', and a VM launched after the upgrade reaches its cGPUs.
//! - the usage the previous version started recording for its VMs ends with their termination
//!   after the upgrade, and nothing counts on once every VM is terminated.
//!
//! It prints what it did and the longest refusal. Needs root, `ip`, `nft`, `nsenter`,
//! `conntrack`, PostgreSQL 15, the dev cloud (`GSAAS_OPENSTACK_CLOUDS`) and cargo (for the
//! previous version); `scripts/test.sh` provides them all.

mod support;

use std::collections::BTreeMap;
use std::io::BufReader;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gsaas_test_support::openstack::{self, Admin};
use gsaasd::cloud::sim_netns;
use gsaasd::cloud::sim_network::VmPort;
use serde_json::{json, Value};
use support::{
    agent_toml, binaries, connect, gsaasd_cli, require_root_tools, run_prefix, still_open, veth,
    wait_for, Api, Netns, Process, Relay, StandIn, SweepNamespaces, TempDir,
};

const CONTROLLER: &str = "10.240.0.1";
const VIP: &str = "10.240.0.1:8700";
const REPLICAS: [&str; 2] = ["10.240.0.1:8701", "10.240.0.1:8702"];
/// (Nova's host name, its management address): the VMs' host, then the GPU host.
const RGPU_HOST: (&str, &str) = (openstack::RGPU_HOST, "10.240.0.11");
const GPU_HOST: (&str, &str) = (openstack::GPU_HOST, "10.240.0.12");
const RGPU_GPU_SIDE: &str = "10.232.0.1";
const GPU_SERVER: &str = "10.232.0.2";
const GPU_SERVERS: [(&str, u16); 2] = [("gpu0", 8308), ("gpu1", 8309)];
/// The Neutron stand-in's subnet, and the gateway every VM tap carries.
const VM_SUBNET: &str = "10.201.0.0/16";
const VM_GATEWAY: &str = "10.201.0.1";
/// The longest a tenant's launches may be refused during the upgrade.
const LONGEST_REFUSAL: Duration = Duration::from_secs(5);
/// How long the mixed period (one replica of each version) runs under load.
const MIXED_PERIOD: Duration = Duration::from_secs(6);
/// At most this many of the load's VMs exist at once.
const LOAD_VMS: usize = 3;

fn launch_body(ncgpus: u32) -> Value {
    json!({"image": openstack::IMAGE, "flavor": openstack::FLAVOR, "ncgpus": ncgpus,
           "gpu_memory_mib": 1024, "mode": "shared"})
}

/// The previous version's binaries directory, built once per commit.
fn previous_version() -> PathBuf {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace");
    let out = Command::new(workspace.join("scripts/build-previous.sh"))
        .current_dir(workspace)
        .output()
        .expect("run scripts/build-previous.sh");
    assert!(
        out.status.success(),
        "building the previous version failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(String::from_utf8(out.stdout).expect("a path").trim())
}

fn version_of(binary: &Path) -> String {
    let out = Command::new(binary).arg("--version").output().expect("--version runs");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// One request the tenant's load made: when, what, and the status (`None`: no answer at all).
#[derive(Debug, Clone)]
struct Request {
    at: Instant,
    op: &'static str,
    status: Option<u16>,
}

/// The tenant's load through the virtual IP until `stop`, one request every 100 ms or so: a
/// launch of a one-cGPU VM every half second, terminating the oldest beyond [`LOAD_VMS`]; and
/// between them, on two other VMs, an attach while a VM has fewer than three cGPUs, else a detach
/// (once the VM has settled: a VM busy with a change answers 409).
fn run_load(api: &Api, token: &str, stop: &AtomicBool, log: &Mutex<Vec<Request>>) {
    let record = |op: &'static str, status: Option<u16>| {
        log.lock().expect("the load's log").push(Request { at: Instant::now(), op, status });
    };
    let launch = |ncgpus: u32| {
        let answer = api.try_call("POST", "/v1/vms", token, Some(&launch_body(ncgpus)));
        record("launch", answer.as_ref().map(|a| a.0));
        match answer {
            Some((202, vm)) => Some(vm["id"].as_str().expect("an id").to_owned()),
            _ => None,
        }
    };
    let elastic: Vec<String> = (0..2).filter_map(|_| launch(1)).collect();
    let mut short: std::collections::VecDeque<String> = Default::default();
    let mut tick = 0usize;
    while !stop.load(Ordering::Relaxed) {
        tick += 1;
        match tick % 5 {
            0 => {
                short.extend(launch(1));
                if short.len() > LOAD_VMS {
                    let id = short.pop_front().expect("a VM");
                    let answer = api.try_call("DELETE", &format!("/v1/vms/{id}"), token, None);
                    record("terminate", answer.map(|a| a.0));
                }
            }
            2 | 4 if !elastic.is_empty() => {
                let id = &elastic[tick / 5 % elastic.len()];
                let answer = api.try_call("GET", &format!("/v1/vms/{id}"), token, None);
                record("show", answer.as_ref().map(|a| a.0));
                let Some((200, vm)) = answer else { continue };
                let cgpus = vm["cgpus"].as_array().cloned().unwrap_or_default();
                if vm["state"] != "ready" || cgpus.iter().any(|c| c["state"] != "live") {
                    continue;
                }
                if cgpus.len() < 3 {
                    let body = json!({"ncgpus": 1, "gpu_memory_mib": 1024, "mode": "shared"});
                    let path = format!("/v1/vms/{id}/cgpus");
                    record("attach", api.try_call("POST", &path, token, Some(&body)).map(|a| a.0));
                } else {
                    let index = cgpus.iter().filter_map(|c| c["index"].as_u64()).max();
                    let path = format!("/v1/vms/{id}/cgpus/{}", index.expect("a cGPU"));
                    record("detach", api.try_call("DELETE", &path, token, None).map(|a| a.0));
                }
            }
            _ => {}
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The longest stretch from a refused launch to the next accepted one.
fn longest_refusal(log: &[Request], end: Instant) -> Duration {
    let mut longest = Duration::ZERO;
    let mut refused_since: Option<Instant> = None;
    for request in log.iter().filter(|r| r.op == "launch") {
        match request.status {
            Some(202) => {
                if let Some(since) = refused_since.take() {
                    longest = longest.max(request.at - since);
                }
            }
            _ => {
                refused_since.get_or_insert(request.at);
            }
        }
    }
    if let Some(since) = refused_since {
        longest = longest.max(end - since);
    }
    longest
}

/// A VM the test plugged in: its namespace, and one open connection per cGPU (masked endpoint,
/// the GPU it is on, the connection).
struct PluggedVm {
    id: String,
    connections: Vec<(String, String, BufReader<TcpStream>)>,
}

struct Testbed {
    dir: TempDir,
    ctl: Netns,
    crg: Netns,
    _cg: Netns,
    _mgmt: Netns,
    _stand_ins: Vec<StandIn>,
    _cloud_relays: Vec<Relay>,
    vip: Relay,
    vm_prefix: String,
    _vms: SweepNamespaces,
    runtime: tokio::runtime::Runtime,
    admin_os: Admin,
    api: Api,
    admin: String,
    member: String,
}

impl Testbed {
    fn start(gsaasd: &Path, database: &str) -> Testbed {
        let dir = TempDir::new("upgrade");
        let vm_prefix = format!("{}upgrade-vm-", run_prefix());
        let mgmt = Netns::new("mgmt");
        let ctl = Netns::new("ctl");
        let crg = Netns::new("crg");
        let cg = Netns::new("cg");
        let vms = SweepNamespaces { prefix: vm_prefix.clone() };
        for bridge in ["br0", "gbr0"] {
            mgmt.ip(&["link", "add", bridge, "type", "bridge"]);
            mgmt.ip(&["link", "set", bridge, "up"]);
        }
        for (ns, port, address) in
            [(&ctl, "p-ctl", CONTROLLER), (&crg, "p-crg", RGPU_HOST.1), (&cg, "p-cg", GPU_HOST.1)]
        {
            veth(ns, "mgmt0", &format!("{address}/24"), &mgmt, port, "");
            mgmt.ip(&["link", "set", port, "master", "br0"]);
        }
        for (ns, port, address) in [(&crg, "g-crg", RGPU_GPU_SIDE), (&cg, "g-cg", GPU_SERVER)] {
            veth(ns, "gpu0", &format!("{address}/24"), &mgmt, port, "");
            mgmt.ip(&["link", "set", port, "master", "gbr0"]);
        }
        crg.enable_forwarding();
        // The GPU host routes back to the VMs, so only the agents' rules keep them apart.
        cg.ip(&["route", "add", VM_SUBNET, "via", RGPU_GPU_SIDE]);
        let stand_ins = GPU_SERVERS
            .iter()
            .map(|(name, port)| StandIn::start(&cg, &format!("{GPU_SERVER}:{port}"), name))
            .collect();

        // The cloud's services and the database, at the same 127.0.0.1 ports inside the
        // controller's namespace (the catalog's URLs name them).
        let port_of_database =
            database.rsplit_once(':').and_then(|(_, rest)| rest.split('/').next()).expect("a port");
        let mut ports: Vec<String> =
            ["P_KEYSTONE", "P_NOVA", "P_NEUTRON", "P_GLANCE", "P_PLACEMENT"]
                .iter()
                .map(|name| openstack::dev_cloud_setting(name))
                .collect();
        ports.push(port_of_database.to_owned());
        let cloud_relays = ports
            .iter()
            .map(|port| {
                let addr = format!("127.0.0.1:{port}");
                Relay::start(Some(&ctl), &addr, &[(None, &addr)])
            })
            .collect();
        let vip =
            Relay::start(Some(&ctl), VIP, &[(Some(&ctl), REPLICAS[0]), (Some(&ctl), REPLICAS[1])]);

        let runtime =
            tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
        let admin_os = runtime.block_on(Admin::new());

        // One configuration per replica (its address and data directory); the key, the database
        // and the cloud are shared. The previous version reads it as this one does.
        let d = dir.path().display();
        let clouds = openstack::clouds_yaml();
        for (i, listen) in REPLICAS.iter().enumerate() {
            let config = format!(
                r#"listen = "{listen}"
data_dir = "{d}/replica-{i}"
database_url = "{database}"
default_policy = "least-load-fit"

[auth]
mode = "keystone"
signing_key = "{d}/signing-key.pem"

[auth.keystone_admin_scope]
project = "admin"

[launch]
active_timeout_secs = 60
deploy_timeout_secs = 60
agent_timeout_ms = 5000

[cloud]
backend = "nova"

[cloud.nova]
cloud = "{service}"
clouds_yaml = "{clouds}"
default_network = "none"
local_availability_zone = "gsaas-{{host}}"
availability_zone = "gsaas-{rgpu}"

[hosts]
backend = "agent"
agent_urls = {{ "{rgpu}" = "http://{rgpu_address}:7450", "{gpu}" = "http://{gpu_address}:7450" }}
"#,
                service = openstack::SERVICE_CLOUD,
                clouds = clouds.display(),
                rgpu = RGPU_HOST.0,
                rgpu_address = RGPU_HOST.1,
                gpu = GPU_HOST.0,
                gpu_address = GPU_HOST.1,
            );
            std::fs::write(dir.path().join(format!("replica-{i}.toml")), config)
                .expect("write a replica's config");
        }
        let config = dir.path().join("replica-0.toml");
        let public_key = gsaasd_cli(gsaasd, &config, &["public-key"]);
        std::fs::write(dir.path().join("controller.pub.pem"), format!("{public_key}\n"))
            .expect("write the public key");
        // The operator and the tenant sign in to Keystone; only the agents hold gsaasd tokens.
        let admin = admin_os.login.token.clone();
        let member = runtime.block_on(openstack::Login::new(&admin_os.http, "alpha")).token;
        let api = Api { ns: ctl.name.clone(), base: format!("http://{VIP}") };
        Testbed {
            dir,
            ctl,
            crg,
            _cg: cg,
            _mgmt: mgmt,
            _stand_ins: stand_ins,
            _cloud_relays: cloud_relays,
            vip,
            vm_prefix,
            _vms: vms,
            runtime,
            admin_os,
            api,
            admin,
            member,
        }
    }

    /// Starts replica `i` with `gsaasd` and waits until it is ready (`/readyz`).
    fn start_replica(&self, gsaasd: &Path, i: usize, version: &str) -> Process {
        let config = self.dir.path().join(format!("replica-{i}.toml"));
        let mut serve = self.ctl.command(gsaasd);
        serve.arg("serve").arg("-c").arg(&config).env("RUST_LOG", "info,sqlx=warn");
        let log = self.dir.path().join(format!("replica-{i}-{version}.log"));
        let process = Process::start(&format!("replica {i} ({version})"), serve, log);
        assert_eq!(process.first_line, format!("gsaasd serving on http://{}", REPLICAS[i]));
        let direct = Api { ns: self.ctl.name.clone(), base: format!("http://{}", REPLICAS[i]) };
        wait_for("the replica to be ready", Duration::from_secs(30), || {
            matches!(direct.try_call("GET", "/readyz", "", None), Some((200, _))).then_some(())
        });
        process
    }

    /// Starts the agent of `host` with `agent` (the GPU host lists its GPUs).
    fn start_agent(&self, agent: &Path, host: (&str, &str), version: &str) -> Process {
        let config = self.dir.path().join(format!("{}.toml", host.0));
        if !config.exists() {
            let gsaasd_config = self.dir.path().join("replica-0.toml");
            let (gsaasd, _) = binaries();
            let token = gsaasd_cli(
                &gsaasd,
                &gsaasd_config,
                &["token", "issue", "--role", "agent", "--host", host.0],
            );
            let extra = if host == GPU_HOST {
                format!(
                    "[rcuda]\naddress = \"{GPU_SERVER}\"\nbase_port = 8308\n\n\
                     [[gpus]]\nindex = 0\nmodel = \"stand-in\"\nmemory_mib = 16384\n\n\
                     [[gpus]]\nindex = 1\nmodel = \"stand-in\"\nmemory_mib = 16384\n"
                )
            } else {
                String::new()
            };
            let controller = format!("http://{VIP}");
            let text = agent_toml(host.0, host.1, self.dir.path(), &controller, &token, &extra);
            std::fs::write(&config, text).expect("write an agent's config");
        }
        let ns = if host == GPU_HOST { &self._cg } else { &self.crg };
        let mut command = ns.command(agent);
        command.arg("--config").arg(&config);
        let log = self.dir.path().join(format!("{}-{version}.log", host.0));
        Process::start(&format!("agent {} ({version})", host.0), command, log)
    }

    fn wait_hosts_schedulable(&self) {
        wait_for("both hosts to be schedulable", Duration::from_secs(30), || {
            let hosts = self.api.get("/v1/hosts", &self.admin);
            let ready = |name: &str| {
                hosts["hosts"].as_array().and_then(|all| {
                    all.iter().find(|h| h["name"] == name).map(|h| h["state"] == "schedulable")
                })
            };
            (ready(RGPU_HOST.0) == Some(true) && ready(GPU_HOST.0) == Some(true)).then_some(())
        });
    }

    fn vm(&self, id: &str) -> Value {
        self.api.get(&format!("/v1/vms/{id}"), &self.admin)
    }

    fn wait_ready(&self, id: &str) -> Value {
        wait_for(&format!("VM {id} to be ready"), Duration::from_secs(90), || {
            let vm = self.vm(id);
            assert_ne!(vm["state"], "error", "the VM failed: {vm}");
            let cgpus = vm["cgpus"].as_array().cloned().unwrap_or_default();
            (vm["state"] == "ready" && cgpus.iter().all(|c| c["state"] == "live")).then_some(vm)
        })
    }

    /// (masked endpoint, GPU) of each of the VM's live cGPUs, by index.
    fn cgpus(&self, vm: &Value) -> Vec<(String, String)> {
        let mut cgpus: Vec<&Value> = vm["cgpus"].as_array().expect("cgpus").iter().collect();
        cgpus.sort_by_key(|c| c["index"].as_u64());
        cgpus
            .iter()
            .filter(|c| c["state"] == "live")
            .map(|c| {
                let masked = c["masked_endpoint"].as_str().expect("a masked endpoint");
                (masked.to_owned(), c["gpu"].as_str().expect("admins see the GPU").to_owned())
            })
            .collect()
    }

    /// Plugs the VM's namespace on the tap Neutron named for its port, as the hypervisor would
    /// (and as gsaasd's simulated cloud does: `sim_netns::plug_vm`), and opens a connection to
    /// each of its cGPUs from inside it.
    fn plug(&self, id: &str) -> PluggedVm {
        let vm = self.wait_ready(id);
        let servers = self.runtime.block_on(self.admin_os.servers_of_vm(id));
        let server = servers.first().unwrap_or_else(|| panic!("VM {id} has no server in Nova"));
        assert_eq!(server["OS-EXT-SRV-ATTR:host"], RGPU_HOST.0, "{server}");
        let server_id = server["id"].as_str().expect("a server id");
        let ports = self.runtime.block_on(self.admin_os.ports(server_id));
        let port = ports.first().unwrap_or_else(|| panic!("server {server_id} has no port"));
        let port_id = port["id"].as_str().expect("a port id");
        let fixed_ip = port["fixed_ips"][0]["ip_address"].as_str().expect("a fixed IP");
        let tap = format!("tap{}", &port_id[..11]);
        let vm_ns = format!("{}{id}", self.vm_prefix);
        let port = VmPort { fixed_ip: fixed_ip.parse().expect("an IPv4 address"), tap };
        let gateway = VM_GATEWAY.parse().expect("an IPv4 address");
        self.runtime
            .block_on(sim_netns::plug_vm(&vm_ns, &self.crg.name, gateway, &port))
            .unwrap_or_else(|e| panic!("plug VM {id}: {e}"));
        let connections = self
            .cgpus(&vm)
            .into_iter()
            .map(|(masked, gpu)| {
                let (conn, greeting) = wait_for(
                    &format!("VM {id} to reach its cGPU at {masked}"),
                    Duration::from_secs(10),
                    || connect(&vm_ns, &masked),
                );
                assert!(
                    greeting.ends_with(&format!(" {RGPU_GPU_SIDE}")),
                    "VM {id} reached {greeting:?} at {masked}"
                );
                (masked, gpu, conn)
            })
            .collect();
        PluggedVm { id: id.to_owned(), connections }
    }

    /// Panics unless every plugged VM's connections still carry data and its cGPUs are the same.
    fn check_plugged(&self, vms: &mut [PluggedVm], when: &str) {
        for vm in vms.iter_mut() {
            let now = self.cgpus(&self.vm(&vm.id));
            let before: Vec<(String, String)> =
                vm.connections.iter().map(|(m, g, _)| (m.clone(), g.clone())).collect();
            assert_eq!(now, before, "{when}: VM {}'s cGPUs changed", vm.id);
            for (masked, _, conn) in &mut vm.connections {
                assert!(still_open(conn), "{when}: VM {}'s connection to {masked} was cut", vm.id);
            }
        }
    }

    /// Every GPU's booked memory is exactly the memory of the cGPUs on it.
    fn check_bookings(&self) {
        let listing = self.api.get("/v1/vms?limit=100", &self.member);
        let mut expected: BTreeMap<String, u64> = BTreeMap::new();
        for vm in listing["vms"].as_array().expect("vms") {
            let vm = self.vm(vm["id"].as_str().expect("an id"));
            for cgpu in vm["cgpus"].as_array().cloned().unwrap_or_default() {
                if let Some(gpu) = cgpu["gpu"].as_str() {
                    *expected.entry(gpu.to_owned()).or_default() +=
                        cgpu["memory_mib"].as_u64().expect("memory");
                }
            }
        }
        let pool = self.api.get("/v1/pool", &self.admin);
        let mut booked: BTreeMap<String, u64> = BTreeMap::new();
        for host in pool["hosts"].as_array().expect("hosts") {
            for gpu in host["gpus"].as_array().cloned().unwrap_or_default() {
                let allocated = gpu["allocated_mib"].as_u64().expect("allocated_mib");
                if allocated > 0 {
                    booked.insert(gpu["id"].as_str().expect("a GPU id").to_owned(), allocated);
                }
            }
        }
        assert_eq!(booked, expected, "the pool's bookings are not the VMs' cGPUs");
    }
}

#[test]
fn a_rolling_upgrade_from_the_previous_version_cuts_no_connection_and_refuses_no_tenant_for_long() {
    require_root_tools();
    let previous = previous_version();
    let (old_gsaasd, old_agent) = (previous.join("gsaasd"), previous.join("rodvr-agent"));
    let (new_gsaasd, new_agent) = binaries();
    let (from, to) = (version_of(&old_gsaasd), version_of(&new_gsaasd));
    assert_ne!(from, to, "the previous version is this one");
    let database = gsaas_test_support::postgres::fresh_database();
    let t = Testbed::start(&old_gsaasd, &database);
    let started = Instant::now();
    let mut steps: Vec<String> = Vec::new();

    // The previous version: two replicas, two agents, three VMs with open connections.
    let mut replicas = vec![
        t.start_replica(&old_gsaasd, 0, "previous"),
        t.start_replica(&old_gsaasd, 1, "previous"),
    ];
    let mut agents = vec![
        t.start_agent(&old_agent, RGPU_HOST, "previous"),
        t.start_agent(&old_agent, GPU_HOST, "previous"),
    ];
    t.wait_hosts_schedulable();
    let ids: Vec<String> = (0..3)
        .map(|_| {
            let (status, vm) = t.api.call("POST", "/v1/vms", &t.member, Some(&launch_body(2)));
            assert_eq!(status, 202, "launch: {vm}");
            vm["id"].as_str().expect("an id").to_owned()
        })
        .collect();
    let mut plugged: Vec<PluggedVm> = ids.iter().map(|id| t.plug(id)).collect();
    steps.push(format!("previous version up: 3 VMs, {} open connections", 6));

    // The tenant's load, through the virtual IP, from here to the end.
    let stop = Arc::new(AtomicBool::new(false));
    let log = Arc::new(Mutex::new(Vec::<Request>::new()));
    let load = {
        let (stop, log) = (stop.clone(), log.clone());
        let api = Api { ns: t.api.ns.clone(), base: t.api.base.clone() };
        let member = t.member.clone();
        std::thread::spawn(move || run_load(&api, &member, &stop, &log))
    };
    std::thread::sleep(Duration::from_secs(2));

    // The replicas, one at a time: drained, stopped, started as this version.
    for (i, replica) in replicas.iter_mut().enumerate() {
        let t0 = Instant::now();
        t.vip.set_enabled(REPLICAS[i], false);
        std::thread::sleep(Duration::from_millis(300));
        let status = replica.stop_with("INT", Duration::from_secs(30));
        assert!(status.success(), "replica {i} (previous) exited with {status}");
        *replica = t.start_replica(&new_gsaasd, i, "new");
        t.vip.set_enabled(REPLICAS[i], true);
        steps.push(format!("replica {i} replaced in {} ms", t0.elapsed().as_millis()));
        t.check_plugged(&mut plugged, &format!("after replica {i}"));
        if i == 0 {
            std::thread::sleep(MIXED_PERIOD);
            t.check_plugged(&mut plugged, "after the mixed period");
            steps.push(format!("mixed period (one replica of each version) {MIXED_PERIOD:?}"));
        }
    }
    // Then the agents.
    for (agent, host) in agents.iter_mut().zip([RGPU_HOST, GPU_HOST]) {
        let t0 = Instant::now();
        let status = agent.stop_with("TERM", Duration::from_secs(20));
        assert!(status.success(), "agent {} (previous) exited with {status}", host.0);
        *agent = t.start_agent(&new_agent, host, "new");
        t.wait_hosts_schedulable();
        steps.push(format!("agent {} replaced in {} ms", host.0, t0.elapsed().as_millis()));
        t.check_plugged(&mut plugged, &format!("after agent {}", host.0));
    }
    // The load goes on until it has done each of its operations at least once (a slow machine
    // makes VMs ready later).
    wait_for("the load to launch, attach, detach and terminate", Duration::from_secs(90), || {
        let log = log.lock().expect("the load's log");
        let done = |op: &str| log.iter().any(|r| r.op == op && r.status == Some(202));
        ["launch", "attach", "detach", "terminate"].iter().all(|op| done(op)).then_some(())
    });
    stop.store(true, Ordering::Relaxed);
    load.join().expect("the load thread");
    let end = Instant::now();
    let log = log.lock().expect("the load's log").clone();

    // Every request answered, none 5xx, launches refused briefly at most.
    let unanswered: Vec<&Request> = log.iter().filter(|r| r.status.is_none()).collect();
    let failed: Vec<&Request> = log.iter().filter(|r| r.status.is_some_and(|s| s >= 500)).collect();
    assert!(unanswered.is_empty(), "requests without an answer: {unanswered:?}");
    assert!(failed.is_empty(), "requests answered 5xx: {failed:?}");
    let refusal = longest_refusal(&log, end);
    // Per operation: how many were made, and how many answered each status.
    let mut counts: BTreeMap<&str, BTreeMap<u16, usize>> = BTreeMap::new();
    for request in &log {
        let status = request.status.expect("answered");
        *counts.entry(request.op).or_default().entry(status).or_default() += 1;
    }

    // Everything settles; the bookings are the VMs' cGPUs; a new VM reaches its GPUs.
    let listing = t.api.get("/v1/vms?limit=100", &t.member);
    for vm in listing["vms"].as_array().expect("vms") {
        let id = vm["id"].as_str().expect("an id");
        wait_for(&format!("VM {id} to settle"), Duration::from_secs(90), || {
            let vm = t.vm(id);
            let cgpus = vm["cgpus"].as_array().cloned().unwrap_or_default();
            // A launch that failed (a replica restarted under it) shows `error` before its undo
            // (routes, server, then its cGPUs and their bookings) has run: it has settled once
            // its cGPUs are released.
            let settled = match vm["state"].as_str().unwrap_or("") {
                "ready" => cgpus.iter().all(|c| c["state"] == "live"),
                "error" | "deleted" => cgpus.is_empty(),
                _ => false,
            };
            settled.then_some(())
        });
    }
    // A fence the agents' restarts opened holds its GPUs until a reconciler pass releases it.
    wait_for("the fences to be released", Duration::from_secs(60), || {
        let fences = t.api.get("/v1/fences", &t.admin);
        fences["fences"].as_array().is_none_or(|f| f.is_empty()).then_some(())
    });
    t.check_bookings();
    t.check_plugged(&mut plugged, "after the upgrade");
    let (status, vm) = t.api.call("POST", "/v1/vms", &t.member, Some(&launch_body(2)));
    assert_eq!(status, 202, "a launch after the upgrade: {vm}");
    let fresh = t.plug(vm["id"].as_str().expect("an id"));

    let mut report = vec![format!("{from} -> {to} in {:.1} s", started.elapsed().as_secs_f64())];
    report.extend(steps.iter().map(|step| format!("  {step}")));
    let summary: Vec<String> = counts
        .iter()
        .map(|(op, statuses)| {
            let each: Vec<String> = statuses.iter().map(|(s, n)| format!("{n}x{s}")).collect();
            format!("{op} {}", each.join(" "))
        })
        .collect();
    report.push(format!(
        "  the tenant's requests (count x status): {}; none unanswered, none 5xx",
        summary.join(", ")
    ));
    report.push(format!(
        "  longest launch refusal: {} ms; 6 connections stayed open; a VM launched after the \
         upgrade reaches its {} cGPUs",
        refusal.as_millis(),
        fresh.connections.len()
    ));
    // Straight to stderr, as the chaos test does: the harness captures print!, and the report
    // belongs in CI's log.
    let text: String = report.iter().map(|line| format!("upgrade: {line}\n")).collect();
    let _ = std::io::Write::write_all(&mut std::io::stderr(), text.as_bytes());
    assert!(
        refusal <= LONGEST_REFUSAL,
        "launches were refused for {refusal:?} (at most {LONGEST_REFUSAL:?})"
    );

    // Nothing left in Nova.
    for vm in t.api.get("/v1/vms?limit=100", &t.member)["vms"].as_array().expect("vms") {
        let id = vm["id"].as_str().expect("an id");
        let (status, body) = t.api.call("DELETE", &format!("/v1/vms/{id}"), &t.member, None);
        assert!(status == 202 || status == 404, "terminate {id}: {status} {body}");
    }
    for vm in ids.iter().chain(std::iter::once(&fresh.id)) {
        wait_for(&format!("VM {vm} to be deleted"), Duration::from_secs(90), || {
            let (status, body) = t.api.call("GET", &format!("/v1/vms/{vm}"), &t.admin, None);
            (status == 404 || body["state"] == "deleted").then_some(())
        });
    }
    // Usage across the upgrade: the VMs launched on the previous version (whose usage spans its
    // triggers opened) were ended through this version's usage log, once, and nothing counts on.
    let own = t.api.get("/v1/usage", &t.member);
    let project = own["projects"][0]["project"].as_str().expect("the tenant's project");
    let usage = t.api.get(&format!("/v1/usage/{project}?start=2020-01-01T00:00:00Z"), &t.member);
    let lines = usage["projects"][0]["vms"].as_array().cloned().expect("the project's VMs");
    for vm in &lines {
        assert!(vm["ended_ms"].is_i64(), "a VM still counts after its termination: {vm}");
    }
    let mut leads = Vec::new();
    for id in &ids {
        let line = lines.iter().find(|vm| vm["id"] == id.as_str()).expect("an old VM's usage");
        let ms = |field: &str| (line[field].as_f64().expect(field) * 1000.0).round() as i64;
        // The spans, as the previous version's triggers began them and this version's fold
        // ended them: once, every cGPU's with its VM's, and the report adds them up exactly.
        let spans = |table: &str| -> Vec<(i64, i64)> {
            let sql = format!("SELECT start_ms, end_ms FROM {table} WHERE vm = '{id}'");
            let rows = gsaas_test_support::postgres::query(&database, &sql);
            rows.iter()
                .map(|row| {
                    let (start, end) = row.split_once('|').expect("two columns");
                    (start.parse().expect("a start"), end.parse().expect("an end"))
                })
                .collect()
        };
        let (vm, cgpus) = (spans("vm_usage"), spans("cgpu_usage"));
        assert_eq!(vm.len(), 1, "VM {id}'s spans: {vm:?}");
        assert_eq!(cgpus.len(), 2, "VM {id}'s cGPU spans: {cgpus:?}");
        assert!(cgpus.iter().all(|c| c.1 == vm[0].1), "{vm:?} {cgpus:?}");
        let total = |spans: &[(i64, i64)]| spans.iter().map(|(s, e)| e - s).sum::<i64>();
        assert!(total(&vm) > 0 && total(&cgpus) > 0, "{vm:?} {cgpus:?}");
        assert_eq!((ms("vm_seconds"), ms("cgpu_seconds")), (total(&vm), total(&cgpus)), "{line}");
        // The previous version's launch fired its cGPUs' triggers before its VM's, each reading
        // the clock: their spans may start a few milliseconds earlier (this version's fold
        // starts them together), never later than the launch's statement.
        for c in &cgpus {
            assert!((0..=1000).contains(&(vm[0].0 - c.0)), "{vm:?} {cgpus:?}");
            leads.push(vm[0].0 - c.0);
        }
    }
    let line = format!(
        "upgrade:   usage: the old VMs' spans ended with them, reported exactly; their cGPUs' \
         began {leads:?} ms before them\n"
    );
    let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
    // This version stops gracefully on SIGTERM too (what Kubernetes sends), the agents as before.
    for mut process in replicas.into_iter().chain(agents) {
        let status = process.stop_with("TERM", Duration::from_secs(30));
        assert!(status.success(), "{} exited with {status} on SIGTERM", process.name);
    }
}
