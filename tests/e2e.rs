//! GSaaS end to end on the real kernel: the real `gsaasd` and two real `rodvr-agent`s, each in a
//! network namespace this test creates, and VMs that are namespaces too (gsaasd's simulated cloud
//! with `[cloud.sim.vm_network] kind = "netns"`):
//!
//! ```text
//!            management network: bridge br0 in its own namespace, 10.240.0.0/24
//!     +-------------------------+---------------------------+
//!  controller (.1)        compute0-rgpu (.11)           compute-gpu (.12)
//!  gsaasd :8700           rodvr-agent :7450             rodvr-agent :7450
//!                         gpu0 10.232.0.1 ------------- gpu0 10.232.0.2
//!                         tap* (one per VM)             stand-in rCUDA servers
//!                           |                           :8308 (gpu0), :8309 (gpu1)
//!                         VM namespace 10.77.0.N/32
//!                         metadata listener 10.78.0.1:8775 (on lo)
//! ```
//!
//! A tenant launches a VM with 2 shared cGPUs, `locality = "remote"`, so the VM lands on the only
//! compute-rGPU host; the VM learns its cGPUs from the rCUDA environment in its user_data (read
//! from the cloud's record, as cloud-init would), and from inside the VM each masked endpoint must
//! reach the stand-in server of exactly the GPU gsaasd gave that cGPU, seen from the compute host
//! (masqueraded), while the GPU host itself stays out of reach. After terminate, the VM's namespace
//! and tap are gone, and a namespace that takes over the VM's port (tap name and address: agents
//! match routes on the two together) gets nothing at the masked endpoints: the routes were
//! removed from the kernel, not just from gsaasd's database.
//!
//! A second test grows and shrinks a running VM (attach, detach) beside another VM: inside the VM,
//! cloud-init's own `gsaas-env` reads the live environment from the host's agent through the
//! masked metadata endpoint, and the data path follows each change.
//!
//! The tests can tell "blocked" from "broken": before any agent runs, a probe namespace behind the
//! compute-rGPU host reaches the GPU host directly, and the address-reusing namespace reaches its
//! host, so every `None` below is the agents' doing. gsaasd's default policy is set to
//! `least-load-fit` so the two cGPUs land on different GPUs and a crossed route would show.
//!
//! Needs root, `ip`, `nft` and `nsenter` (scripts/test.sh installs them; CI runs as root). Names
//! carry the process id, addresses live only inside the test's namespaces, everything is removed
//! by drop guards even when an assertion fails, and every wait is bounded.

mod support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use gsaas_test_support::servers::standin_server;
use serde_json::{json, Value};
use support::{
    agent_toml, ask, binaries, connect, gsaasd_cli, namespaces, read, require_root_tools,
    run_prefix, still_open, veth, wait_for, Api, Netns, Process, StandIn, SweepNamespaces, TempDir,
};

const CONTROLLER: &str = "10.240.0.1";
const RGPU_HOST: &str = "compute0-rgpu";
const GPU_HOST: &str = "compute-gpu";
const RGPU_GPU_SIDE: &str = "10.232.0.1";
const GPU_SERVER: &str = "10.232.0.2";
const VM_GATEWAY: &str = "10.77.0.1";

/// The rCUDA devices in a VM's user_data: `RCUDA_DEVICE_<j>=<ip>@<port>:<gpu>` -> `j -> (ip:port,
/// gpu)`, and `RCUDA_DEVICE_COUNT`, checking that every occurrence of a variable (profile script
/// and /etc/environment) agrees.
fn rcuda_devices(user_data: &str) -> (BTreeMap<u32, (String, u32)>, Option<u32>) {
    let mut devices = BTreeMap::new();
    let mut count = None;
    for (at, _) in user_data.match_indices("RCUDA_DEVICE_") {
        let rest = &user_data[at + "RCUDA_DEVICE_".len()..];
        // The profile script shell-quotes the value, /etc/environment does not.
        let value = |rest: &str| -> String {
            let rest = rest.strip_prefix('\'').unwrap_or(rest);
            rest.chars().take_while(|c| c.is_ascii_digit() || ".@:".contains(*c)).collect()
        };
        if let Some(rest) = rest.strip_prefix("COUNT=") {
            // gsaas-env's check of what the agent answers names the variable in a pattern.
            if !rest.starts_with('[') {
                count = Some(value(rest).parse().expect("RCUDA_DEVICE_COUNT is a number"));
            }
            continue;
        }
        let Some((j, rest)) = rest.split_once('=') else { continue };
        let Ok(j) = j.parse::<u32>() else { continue };
        let value = value(rest);
        let (address, gpu) = value.split_once(':').unwrap_or_else(|| panic!("bad device {value}"));
        let (ip, port) = address.split_once('@').unwrap_or_else(|| panic!("bad device {value}"));
        let device = (format!("{ip}:{port}"), gpu.parse().expect("a GPU number"));
        let previous = devices.insert(j, device.clone());
        assert!(previous.is_none() || previous == Some(device), "RCUDA_DEVICE_{j} disagrees");
    }
    (devices, count)
}

/// A launch of `ncgpus` shared cGPUs of 2 GiB on a remote host: the only compute-rGPU host.
fn remote_launch(ncgpus: u32) -> Value {
    json!({"image": "cirros-0.6.2", "flavor": "m1.small", "ncgpus": ncgpus,
        "gpu_memory_mib": 2048, "mode": "shared", "locality": "remote"})
}

/// What a login shell in the VM sees of the rCUDA environment. The files the VM's cloud-init
/// writes (from the `#cloud-config` document in its user_data) go to `dir` rather than `/etc` and
/// `/usr/local/bin`, and a shell in the VM's namespace sources the profile script, which runs
/// `gsaas-env`, which asks the host's agent at the masked metadata endpoint.
fn login_env(vm_ns: &str, user_data: &str, dir: &Path) -> BTreeMap<String, String> {
    login_env_of(vm_ns, user_data, dir, &["RCUDA_"])
}

/// [`login_env`]'s variables whose names start with one of `prefixes`.
fn login_env_of(
    vm_ns: &str,
    user_data: &str,
    dir: &Path,
    prefixes: &[&str],
) -> BTreeMap<String, String> {
    use std::os::unix::fs::PermissionsExt;
    let config = user_data
        .split_once("#cloud-config\n")
        .and_then(|(_, rest)| rest.lines().next())
        .unwrap_or_else(|| panic!("no #cloud-config in the user_data:\n{user_data}"));
    let config: Value = serde_json::from_str(config).expect("the cloud-config is JSON");
    let files = config["write_files"].as_array().expect("write_files");
    std::fs::create_dir_all(dir).expect("create the VM's file directory");
    let moved: Vec<(String, PathBuf)> = files
        .iter()
        .map(|f| {
            let path = f["path"].as_str().expect("a path").to_owned();
            let name = path.trim_start_matches('/').replace('/', "_");
            (path, dir.join(name))
        })
        .collect();
    let relocate = |text: &str| {
        moved.iter().fold(text.to_owned(), |text, (from, to)| {
            text.replace(from, to.to_str().expect("a UTF-8 path"))
        })
    };
    let mut profile = None;
    for (file, (path, to)) in files.iter().zip(&moved) {
        std::fs::write(to, relocate(file["content"].as_str().expect("content")))
            .unwrap_or_else(|e| panic!("write {}: {e}", to.display()));
        let mode = u32::from_str_radix(file["permissions"].as_str().expect("permissions"), 8)
            .expect("octal permissions");
        std::fs::set_permissions(to, std::fs::Permissions::from_mode(mode)).expect("chmod");
        if path.starts_with("/etc/profile.d/") {
            profile = Some(to.clone());
        }
    }
    let profile = profile.expect("cloud-init writes a profile script");
    let out = Command::new("ip")
        .args(["netns", "exec", vm_ns, "sh", "-c", r#". "$1" && env"#, "sh"])
        .arg(&profile)
        .env_clear()
        .env("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
        .output()
        .expect("run a shell in the VM's namespace");
    assert!(
        out.status.success(),
        "the login shell failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|line| prefixes.iter().any(|prefix| line.starts_with(prefix)))
        .filter_map(|line| line.split_once('='))
        .map(|(name, value)| (name.to_owned(), value.to_owned()))
        .collect()
}

/// The rCUDA variables of a VM whose devices are these masked endpoints (`ip:port`, each GPU
/// device 0 of its rCUDA server), in order.
fn rcuda_variables(masked: &[&str]) -> BTreeMap<String, String> {
    let mut variables =
        BTreeMap::from([("RCUDA_DEVICE_COUNT".to_owned(), masked.len().to_string())]);
    for (j, endpoint) in masked.iter().enumerate() {
        variables.insert(format!("RCUDA_DEVICE_{j}"), format!("{}:0", endpoint.replace(':', "@")));
    }
    variables
}

/// The names of the `tap*` interfaces in `ns`.
fn taps(ns: &Netns) -> Vec<String> {
    let out = ns.ip(&["-o", "link", "show"]);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split(": ").nth(1))
        .map(|name| name.split('@').next().unwrap_or(name).to_owned())
        .filter(|name| name.starts_with("tap"))
        .collect()
}

/// One test's hosts, networks, processes and credentials. Fields drop in order: the processes
/// first, the namespaces they ran in after them, the directory last.
struct Testbed {
    agents: Vec<Process>,
    /// Ends whatever the GPU host's agent left of its servers (a managed testbed).
    _servers: Option<gsaas_test_support::servers::ServerCgroups>,
    /// The GPU host agent's command line, to start it again (a managed testbed).
    gpu_agent: (PathBuf, PathBuf),
    _gsaasd: Process,
    _stand_ins: Vec<StandIn>,
    _host_service: StandIn,
    api: Api,
    admin: String,
    member: String,
    vm_prefix: String,
    _vms: SweepNamespaces,
    probe: Netns,
    _cg: Netns,
    _cl: Option<Netns>,
    crg: Netns,
    _ctl: Netns,
    _mgmt: Netns,
    dir: TempDir,
}

/// The stand-in rCUDA servers of the compute-GPU host: (name, port) of each GPU.
const GPU_SERVERS: [(&str, u16); 2] = [("gpu0", 8308), ("gpu1", 8309)];

/// The LUPINE GPU host of a mixed pool ([`Testbed::start_mixed`]): its name, its address on the
/// GPU network, and its stand-in LUPINE servers, (name, port) of each GPU.
const LUPINE_HOST: &str = "compute-gpu-lupine";
const LUPINE_SERVER: &str = "10.232.0.3";
const LUPINE_SERVERS: [(&str, u16); 2] = [("lupine0", 14833), ("lupine1", 14834)];

/// Where VMs ask for their environment (gsaasd's default masked metadata endpoint).
const MASKED_METADATA: &str = "100.127.0.1:80";

/// The compute-rGPU host's own address where its agent serves the VMs' rCUDA environments.
const METADATA_LISTEN: &str = "10.78.0.1:8775";

impl Testbed {
    /// Builds the topology above, starts gsaasd and both agents, and waits until both hosts are
    /// schedulable. `tag` keeps this test's directory and VM namespaces apart from other tests'.
    fn start(tag: &str) -> Testbed {
        Testbed::start_with(tag, false, false)
    }

    /// [`Testbed::start`] whose GPU host's agent runs one server per cGPU itself
    /// (`[gpu_servers] managed`): stand-ins of `rodvr-agent/tests/standin_server.py`, as user
    /// `nobody`, in cgroups under [`Testbed::servers_cgroup`].
    fn start_managed(tag: &str) -> Testbed {
        Testbed::start_with(tag, false, true)
    }

    /// [`Testbed::start`] with a third host on the GPU network, a compute-GPU host whose two
    /// GPUs are served by LUPINE (stand-ins at [`LUPINE_SERVER`]), so the pool mixes layers.
    fn start_mixed(tag: &str) -> Testbed {
        Testbed::start_with(tag, true, false)
    }

    fn start_with(tag: &str, lupine: bool, managed: bool) -> Testbed {
        require_root_tools();
        let (gsaasd, agent) = binaries();
        let dir = TempDir::new(tag);
        let vm_prefix = format!("{}{tag}-vm-", run_prefix());

        let mgmt = Netns::new("mgmt");
        let ctl = Netns::new("ctl");
        let crg = Netns::new("crg");
        let cg = Netns::new("cg");
        let probe = Netns::new("probe");
        let cl = lupine.then(|| Netns::new("cl"));
        let vms = SweepNamespaces { prefix: vm_prefix.clone() };
        // The management network and the GPU network: a bridge each.
        for bridge in ["br0", "gbr0"] {
            mgmt.ip(&["link", "add", bridge, "type", "bridge"]);
            mgmt.ip(&["link", "set", bridge, "up"]);
        }
        let mut on_mgmt = vec![
            (&ctl, "p-ctl", format!("{CONTROLLER}/24")),
            (&crg, "p-crg", "10.240.0.11/24".to_owned()),
            (&cg, "p-cg", "10.240.0.12/24".to_owned()),
        ];
        let mut on_gpu_network = vec![(&crg, "g-crg", RGPU_GPU_SIDE), (&cg, "g-cg", GPU_SERVER)];
        if let Some(cl) = &cl {
            on_mgmt.push((cl, "p-cl", "10.240.0.13/24".to_owned()));
            on_gpu_network.push((cl, "g-cl", LUPINE_SERVER));
        }
        for (ns, port, cidr) in on_mgmt {
            veth(ns, "mgmt0", &cidr, &mgmt, port, "");
            mgmt.ip(&["link", "set", port, "master", "br0"]);
        }
        for (ns, port, address) in on_gpu_network {
            veth(ns, "gpu0", &format!("{address}/24"), &mgmt, port, "");
            mgmt.ip(&["link", "set", port, "master", "gbr0"]);
        }
        crg.enable_forwarding();
        // The GPU hosts route back to VMs, so only the agent's filter keeps them out.
        for gpu_host in std::iter::once(&cg).chain(&cl) {
            gpu_host.ip(&["route", "add", "10.77.0.0/24", "via", RGPU_GPU_SIDE]);
            gpu_host.ip(&["route", "add", "10.79.0.0/24", "via", RGPU_GPU_SIDE]);
        }
        veth(&probe, "eth0", "10.79.0.2/24", &crg, "probe0", "10.79.0.1/24");
        probe.ip(&["route", "add", "default", "via", "10.79.0.1"]);
        // A host-local address for the agent's metadata listener, as a dummy interface would hold.
        let metadata_ip = METADATA_LISTEN.split(':').next().unwrap_or_default();
        crg.ip(&["addr", "add", &format!("{metadata_ip}/32"), "dev", "lo"]);

        let mut stand_ins: Vec<StandIn> = GPU_SERVERS
            .iter()
            .map(|(name, port)| StandIn::start(&cg, &format!("{GPU_SERVER}:{port}"), name))
            .collect();
        if let Some(cl) = &cl {
            stand_ins.extend(
                LUPINE_SERVERS.iter().map(|(name, port)| {
                    StandIn::start(cl, &format!("{LUPINE_SERVER}:{port}"), name)
                }),
            );
        }
        // Any address of the host, the VMs' gateway included (once a tap carries it).
        let host_service = StandIn::start(&crg, "0.0.0.0:7000", "crg");
        // Without agents, a VM-like namespace behind the compute-rGPU host reaches the GPU host.
        assert_eq!(
            ask(&probe.name, &format!("{GPU_SERVER}:8308")).as_deref(),
            Some("gpu0 10.79.0.2"),
            "the test topology is broken: the probe cannot reach the GPU host at all"
        );

        // gsaasd's configuration, key and tokens.
        let d = dir.path().display();
        let config = dir.path().join("gsaasd.toml");
        std::fs::write(
            &config,
            format!(
                r#"listen = "{CONTROLLER}:8700"
data_dir = "{d}/gsaasd"
default_policy = "least-load-fit"

[launch]
active_timeout_secs = 20
deploy_timeout_secs = 20
agent_timeout_ms = 5000

[cloud]
backend = "sim"

[cloud.sim]
fixed_ip_range = "10.77.0.0/24"
record_dir = "{d}/user_data"

[cloud.sim.vm_network]
kind = "netns"
namespaces = {{ "{RGPU_HOST}" = "{crg}", "{GPU_HOST}" = "{cg}"{lupine_ns} }}
vm_namespace_prefix = "{vm_prefix}"

[hosts]
backend = "agent"
agent_urls = {{ "{RGPU_HOST}" = "http://10.240.0.11:7450", "{GPU_HOST}" = "http://10.240.0.12:7450"{lupine_url} }}
{hosts_extra}
"#,
                crg = crg.name,
                cg = cg.name,
                lupine_ns = cl
                    .as_ref()
                    .map(|cl| format!(", \"{LUPINE_HOST}\" = \"{}\"", cl.name))
                    .unwrap_or_default(),
                // The mixed pool's test hangs a GPU host: noticed in seconds, its cGPUs re-homed
                // or lost at once.
                hosts_extra = if lupine {
                    "heartbeat_timeout_secs = 3\nreconcile_interval_secs = 1\nauto_rehome = true"
                } else {
                    ""
                },
                lupine_url = if lupine {
                    format!(", \"{LUPINE_HOST}\" = \"http://10.240.0.13:7450\"")
                } else {
                    String::new()
                },
            ),
        )
        .expect("write gsaasd.toml");
        let public_key = gsaasd_cli(&gsaasd, &config, &["public-key"]);
        std::fs::write(dir.path().join("controller.pub.pem"), format!("{public_key}\n"))
            .expect("write the public key");
        let token =
            |args: &[&str]| gsaasd_cli(&gsaasd, &config, &[&["token", "issue"], args].concat());
        let admin = token(&["--role", "admin", "--project", "ops"]);
        let member = token(&["--role", "member", "--project", "e2e"]);

        // The agents' configurations: the compute-GPU host lists its two GPUs (no NVML here).
        let agent_config = |ns: &Netns, host: &str, address: &str, extra: &str| {
            let path = dir.path().join(format!("{host}.toml"));
            let agent_token = token(&["--role", "agent", "--host", host]);
            let controller = format!("http://{CONTROLLER}:8700");
            std::fs::write(
                &path,
                agent_toml(host, address, dir.path(), &controller, &agent_token, extra),
            )
            .expect("write an agent config");
            let mut command = ns.command(&agent);
            command.arg("--config").arg(&path);
            command
        };
        let gpu_inventory = format!(
            r#"[rcuda]
address = "{GPU_SERVER}"
base_port = 8308

[[gpus]]
index = 0
model = "stand-in"
memory_mib = 8192

[[gpus]]
index = 1
model = "stand-in"
memory_mib = 8192
"#
        );
        // The LUPINE host names its layer; its servers' port is LUPINE's own (14833 + index).
        let lupine_inventory = format!(
            r#"[gpu_servers]
address = "{LUPINE_SERVER}"
remoting = "lupine"

[[gpus]]
index = 0
model = "stand-in"
memory_mib = 8192

[[gpus]]
index = 1
model = "stand-in"
memory_mib = 8192
"#
        );
        // Managed: the agent runs a stand-in per cGPU, as `nobody` (so the script and the
        // directories above it must be readable by that user).
        let servers = managed.then(|| {
            (gsaas_test_support::servers::ServerCgroups::new(tag), standin_server(dir.path()))
        });
        let gpu_inventory = match &servers {
            None => gpu_inventory,
            Some((cgroups, script)) => format!(
                r#"[gpu_servers]
address = "{GPU_SERVER}"
base_port = 8308
managed = true
command = ["/usr/bin/python3", "{script}"]
ports = "20000-20099"
user = "nobody"
run_dir = "{d}/servers"
cgroup = "{cgroup}"

[[gpus]]
index = 0
model = "stand-in"
memory_mib = 8192
uuid = "GPU-e2e-0"

[[gpus]]
index = 1
model = "stand-in"
memory_mib = 8192
uuid = "GPU-e2e-1"
"#,
                script = script.display(),
                cgroup = cgroups.path.display(),
            ),
        };
        let metadata = format!("metadata_listen = \"{METADATA_LISTEN}\"\n");
        let rgpu_agent = agent_config(&crg, RGPU_HOST, "10.240.0.11", &metadata);
        let gpu_agent = agent_config(&cg, GPU_HOST, "10.240.0.12", &gpu_inventory);
        let gpu_agent_command = (agent.clone(), dir.path().join(format!("{GPU_HOST}.toml")));
        let lupine_agent =
            cl.as_ref().map(|cl| agent_config(cl, LUPINE_HOST, "10.240.0.13", &lupine_inventory));

        let mut serve = ctl.command(&gsaasd);
        serve.arg("serve").arg("-c").arg(&config).env("RUST_LOG", "info,sqlx=warn");
        let gsaasd_process = Process::start("gsaasd", serve, dir.path().join("gsaasd.log"));
        assert_eq!(
            gsaasd_process.first_line,
            format!("gsaasd serving on http://{CONTROLLER}:8700")
        );
        let mut agents = vec![
            Process::start(RGPU_HOST, rgpu_agent, dir.path().join("rgpu-agent.log")),
            Process::start(GPU_HOST, gpu_agent, dir.path().join("gpu-agent.log")),
        ];
        if let Some(command) = lupine_agent {
            agents.push(Process::start(LUPINE_HOST, command, dir.path().join("lupine-agent.log")));
        }
        let api = Api { ns: ctl.name.clone(), base: format!("http://{CONTROLLER}:8700") };

        // The agents register over the management network.
        wait_for("the hosts to register and be schedulable", Duration::from_secs(15), || {
            let hosts = api.get("/v1/hosts", &admin);
            let ready = |name: &str| {
                hosts["hosts"].as_array()?.iter().find(|h| h["name"] == name).map(|h| {
                    h["state"] == "schedulable"
                        && h["agent_url"]
                            .as_str()
                            .is_some_and(|u| u.starts_with("http://10.240.0."))
                })
            };
            let lupine_ready = !lupine || ready(LUPINE_HOST) == Some(true);
            (ready(RGPU_HOST) == Some(true) && ready(GPU_HOST) == Some(true) && lupine_ready)
                .then_some(())
        });
        Testbed {
            agents,
            _servers: servers.map(|(cgroups, _)| cgroups),
            gpu_agent: gpu_agent_command,
            _gsaasd: gsaasd_process,
            _stand_ins: stand_ins,
            _host_service: host_service,
            api,
            admin,
            member,
            vm_prefix,
            _vms: vms,
            probe,
            _cg: cg,
            _cl: cl,
            crg,
            _ctl: ctl,
            _mgmt: mgmt,
            dir,
        }
    }

    /// Launches `request` as the member and waits until the VM is ready: (its id, the member's view).
    fn launch_ready(&self, request: &Value) -> (String, Value) {
        let (status, vm) = self.api.call("POST", "/v1/vms", &self.member, Some(request));
        assert_eq!(status, 202, "launch: {vm}");
        let id = vm["id"].as_str().expect("the VM's id").to_owned();
        let vm = self.wait_vm(&id, "the VM to be ready", |vm| vm["state"] == "ready");
        (id, vm)
    }

    /// Polls the member's view of VM `id` until `done`; a VM in `error` fails the test.
    fn wait_vm(&self, id: &str, what: &str, done: impl Fn(&Value) -> bool) -> Value {
        let path = format!("/v1/vms/{id}");
        wait_for(what, Duration::from_secs(20), || {
            let vm = self.api.get(&path, &self.member);
            assert_ne!(vm["state"], "error", "{what}: the VM failed: {vm}");
            done(&vm).then_some(vm)
        })
    }

    /// The user_data the cloud recorded for VM `id` (what cloud-init would read).
    fn user_data(&self, id: &str) -> String {
        read(&self.dir.path().join("user_data").join(format!("{id}.user_data")))
    }

    /// Starts the GPU host's agent again (after a test killed it).
    fn restart_gpu_agent(&mut self) {
        let (binary, config) = &self.gpu_agent;
        let mut command = self._cg.command(binary);
        command.arg("--config").arg(config);
        let log = self.dir.path().join("gpu-agent-again.log");
        self.agents.push(Process::start(GPU_HOST, command, log));
    }

    /// The VM's namespace, from the member's view of it.
    fn vm_namespace(&self, vm: &Value) -> String {
        format!("{}{}", self.vm_prefix, vm["server_id"].as_str().expect("a server id"))
    }
}

#[test]
fn two_shared_cgpus_reached_from_the_vm_through_masked_endpoints_until_terminated() {
    let t = Testbed::start("e2e-launch");

    // The compute-rGPU host's agent measures its round trip to the GPU host's rCUDA endpoint
    // (over the GPU network) and reports it.
    let rtt = wait_for("a measured round trip to the GPU host", Duration::from_secs(15), || {
        let hosts = t.api.get("/v1/hosts", &t.admin);
        let host = hosts["hosts"].as_array()?.iter().find(|h| h["name"] == RGPU_HOST)?.clone();
        host["rtt_us"][GPU_HOST].as_u64()
    });
    assert!((1..1_000_000).contains(&rtt), "{rtt} us between two namespaces");
    // Each agent asked which hosts to measure only once its heartbeat had registered it, and
    // was answered (before, gsaasd answers 404 and the agent logged it).
    for agent in &t.agents {
        let log = agent.log_text();
        let asked = "asking the controller which GPU hosts to measure";
        assert!(!log.contains(asked), "{} logged a failed ask:\n{log}", agent.name);
    }

    // Launch 2 shared cGPUs on a remote (compute-rGPU) host within a round trip that the
    // measurement allows, and wait for ready.
    let mut request = remote_launch(2);
    request["network"] = json!({"max_rtt_us": 1_000_000});
    let (id, vm) = t.launch_ready(&request);
    let vm_path = format!("/v1/vms/{id}");
    let admin_view = t.api.get(&vm_path, &t.admin);
    assert_eq!(admin_view["host"], RGPU_HOST, "{admin_view}");
    let fixed_ip = vm["fixed_ip"].as_str().expect("a fixed IP");
    let vm_ns = t.vm_namespace(&vm);
    assert!(namespaces().contains(&vm_ns), "the VM's namespace {vm_ns} does not exist");
    let vm_tap = taps(&t.crg);
    assert_eq!(vm_tap.len(), 1, "the VM's host should have one tap: {vm_tap:?}");

    // The VM's cGPUs, as its cloud-init sets them.
    let user_data = t.user_data(&id);
    let (devices, count) = rcuda_devices(&user_data);
    assert_eq!(count, Some(2), "RCUDA_DEVICE_COUNT in the user_data:\n{user_data}");
    assert_eq!(devices.keys().copied().collect::<Vec<_>>(), [0, 1], "{user_data}");
    let cgpus = admin_view["cgpus"].as_array().expect("cgpus");
    assert_eq!(cgpus.len(), 2, "{admin_view}");
    let rcuda_endpoints: Vec<&str> =
        cgpus.iter().map(|c| c["rcuda_endpoint"].as_str().expect("admins see it")).collect();
    assert_ne!(rcuda_endpoints[0], rcuda_endpoints[1], "least-load-fit spreads: {admin_view}");

    // From inside the VM, each masked endpoint reaches its own GPU's server, seen from the
    // compute host; the GPU host itself is out of reach.
    for (j, (masked, gpu_number)) in &devices {
        let cgpu = &cgpus[*j as usize];
        assert_eq!(cgpu["masked_endpoint"].as_str(), Some(masked.as_str()), "{admin_view}");
        assert_eq!(*gpu_number, 0, "each GPU has its own rCUDA daemon, as device 0");
        let (server, _) = GPU_SERVERS
            .iter()
            .find(|(_, port)| rcuda_endpoints[*j as usize] == format!("{GPU_SERVER}:{port}"))
            .unwrap_or_else(|| panic!("cGPU {j} is on no stand-in: {admin_view}"));
        assert_eq!(
            ask(&vm_ns, masked),
            Some(format!("{server} {RGPU_GPU_SIDE}")),
            "cGPU {j} at {masked} should reach {server}"
        );
    }
    for (_, port) in GPU_SERVERS {
        let direct = format!("{GPU_SERVER}:{port}");
        assert_eq!(ask(&vm_ns, &direct), None, "the VM reached the GPU host at {direct}");
        assert_eq!(ask(&t.probe.name, &direct), None, "the probe reached {direct} past the agent");
    }

    // Terminate: the VM, its namespace and tap, and its routes are gone.
    let (status, body) = t.api.call("DELETE", &vm_path, &t.member, None);
    assert_eq!(status, 202, "terminate: {body}");
    t.wait_vm(&id, "the VM to be deleted", |vm| vm["state"] == "deleted");
    assert!(!namespaces().contains(&vm_ns), "the VM's namespace {vm_ns} is still there");
    assert!(!Path::new("/run/netns").join(&vm_ns).exists());
    assert_eq!(taps(&t.crg), Vec::<String>::new(), "the VM's tap is still on its host");

    // A namespace that takes over the VM's port (its tap's name and its address, so that a stale
    // route keyed on either would match), wired the same way, reaches its host but not the cGPUs
    // the VM had.
    let reuse = Netns::new("reuse");
    let tap = vm_tap[0].as_str();
    veth(&reuse, "eth0", &format!("{fixed_ip}/32"), &t.crg, tap, &format!("{VM_GATEWAY}/32"));
    t.crg.ip(&["route", "add", &format!("{fixed_ip}/32"), "dev", tap]);
    reuse.ip(&["route", "add", VM_GATEWAY, "dev", "eth0"]);
    reuse.ip(&["route", "add", "default", "via", VM_GATEWAY]);
    assert_eq!(
        ask(&reuse.name, &format!("{VM_GATEWAY}:7000")),
        Some(format!("crg {fixed_ip}")),
        "the address-reusing namespace's wiring is broken"
    );
    for masked in devices.values().map(|(masked, _)| masked) {
        assert_eq!(ask(&reuse.name, masked), None, "{masked} still answers after terminate");
    }
}

/// The dissertation's progressive attach, on the real kernel: a running VM gains a cGPU, reads
/// its new environment from its host's agent (cloud-init's own `gsaas-env`), and reaches the new
/// device; another VM on the host reads only its own environment and cannot reach the first VM's
/// new endpoint; a detach kills the endpoint and cuts its open connection while the other cGPU's
/// connection and endpoint carry on, renumbered as device 0; and a VM detached down to no cGPU
/// reads an empty environment, not its boot-time one.
#[test]
fn cgpus_attached_to_and_detached_from_a_running_vm_come_and_go_inside_it() {
    let t = Testbed::start("e2e-elastic");
    let (a, vm_a) = t.launch_ready(&remote_launch(1));
    let (b, vm_b) = t.launch_ready(&remote_launch(1));
    let (a_ns, b_ns) = (t.vm_namespace(&vm_a), t.vm_namespace(&vm_b));
    let login = |ns: &str, id: &str| login_env(ns, &t.user_data(id), &t.dir.path().join(id));
    // (masked endpoint, the stand-in it must reach) of each of a VM's cGPUs, by index.
    let cgpus = |id: &str| -> Vec<(u64, String, String)> {
        let vm = t.api.get(&format!("/v1/vms/{id}"), &t.admin);
        let cgpus = vm["cgpus"].as_array().expect("cgpus").iter();
        cgpus
            .map(|c| {
                let rcuda = c["rcuda_endpoint"].as_str().expect("admins see it");
                let (server, _) = GPU_SERVERS
                    .iter()
                    .find(|(_, port)| rcuda == format!("{GPU_SERVER}:{port}"))
                    .unwrap_or_else(|| panic!("a cGPU on no stand-in: {vm}"));
                let masked = c["masked_endpoint"].as_str().expect("a masked endpoint");
                (c["index"].as_u64().expect("an index"), masked.to_owned(), (*server).to_owned())
            })
            .collect()
    };
    let greeting = |server: &str| Some(format!("{server} {RGPU_GPU_SIDE}"));
    let settled = |id: &str, n: usize, what: &str| {
        t.wait_vm(id, what, |vm| {
            let cgpus = vm["cgpus"].as_array().map(Vec::as_slice).unwrap_or_default();
            cgpus.len() == n && cgpus.iter().all(|c| c["state"] == "live")
        })
    };

    let a0 = cgpus(&a).remove(0);
    let b0 = cgpus(&b).remove(0);
    assert_eq!(login(&a_ns, &a), rcuda_variables(&[&a0.1]));

    // Attach: the VM sees two devices live (its boot-time values still say one) and reaches the
    // new one.
    let attach = json!({"ncgpus": 1, "gpu_memory_mib": 2048, "mode": "shared"});
    let (status, body) =
        t.api.call("POST", &format!("/v1/vms/{a}/cgpus"), &t.member, Some(&attach));
    assert_eq!(status, 202, "attach: {body}");
    settled(&a, 2, "the attach to end");
    let a1 = cgpus(&a).remove(1);
    assert_eq!(a1.0, 1, "the new cGPU's index");
    assert_eq!(rcuda_devices(&t.user_data(&a)).1, Some(1), "the boot-time values changed");
    assert_eq!(login(&a_ns, &a), rcuda_variables(&[&a0.1, &a1.1]));
    let (mut conn0, hello0) = connect(&a_ns, &a0.1).expect("VM A reaches its cGPU 0");
    let (mut conn1, hello1) = connect(&a_ns, &a1.1).expect("VM A reaches its new cGPU 1");
    assert_eq!((Some(hello0), Some(hello1)), (greeting(&a0.2), greeting(&a1.2)));

    // The other VM: its own environment, and nothing at the first VM's new endpoint.
    assert_eq!(login(&b_ns, &b), rcuda_variables(&[&b0.1]));
    assert_eq!(ask(&b_ns, &b0.1), greeting(&b0.2));
    assert_eq!(ask(&b_ns, &a1.1), None, "VM B reached VM A's new cGPU at {}", a1.1);

    // Detach cGPU 0: its endpoint dies and its open connection is cut; cGPU 1 keeps its endpoint
    // and its connection, and is device 0 now.
    let (status, body) = t.api.call("DELETE", &format!("/v1/vms/{a}/cgpus/0"), &t.member, None);
    assert_eq!(status, 202, "detach: {body}");
    settled(&a, 1, "the detach of cGPU 0 to end");
    assert!(!still_open(&mut conn0), "the connection to the detached cGPU 0 survived");
    assert!(still_open(&mut conn1), "the connection to cGPU 1 was cut by cGPU 0's detach");
    assert_eq!(ask(&a_ns, &a0.1), None, "cGPU 0's endpoint {} still answers", a0.1);
    assert_eq!(login(&a_ns, &a), rcuda_variables(&[&a1.1]));

    // Detach the last: the VM runs on without GPUs, and its environment says so.
    let (status, body) = t.api.call("DELETE", &format!("/v1/vms/{a}/cgpus/1"), &t.member, None);
    assert_eq!(status, 202, "detach: {body}");
    let vm = settled(&a, 0, "the detach of cGPU 1 to end");
    assert_eq!(vm["state"], "ready", "{vm}");
    assert!(!still_open(&mut conn1), "the connection to the detached cGPU 1 survived");
    assert_eq!(login(&a_ns, &a), rcuda_variables(&[]));
    // The other VM is untouched throughout.
    assert_eq!(login(&b_ns, &b), rcuda_variables(&[&b0.1]));
    assert_eq!(ask(&b_ns, &b0.1), greeting(&b0.2));
}

/// A pool that mixes layers, on the real kernel: an rCUDA VM and a LUPINE VM on one host, each
/// with one cGPU at the same masked endpoint (cGPU 0), each reaching only a server of its own
/// layer (the rCUDA VM an rCUDA stand-in, the LUPINE VM a LUPINE stand-in), each reading its own
/// layer's environment live from the host's agent; neither reaches any GPU host directly, and
/// LUPINE's servers, which authenticate nobody, are reached only through a VM's own route.
#[test]
fn a_pool_that_mixes_rcuda_and_lupine_serves_each_vm_in_its_layer() {
    let t = Testbed::start_mixed("e2e-mixed");
    let (rc, vm_rc) = t.launch_ready(&remote_launch(1));
    // Exclusive: one LUPINE GPU each, so a GPU that fails has no other to move to.
    let mut lupine_request = remote_launch(2);
    lupine_request["remoting"] = json!("lupine");
    lupine_request["mode"] = json!("exclusive");
    lupine_request.as_object_mut().expect("an object").remove("gpu_memory_mib");
    let (lu, vm_lu) = t.launch_ready(&lupine_request);
    assert_eq!(
        (vm_rc["gpus"]["remoting"].as_str(), vm_lu["gpus"]["remoting"].as_str()),
        (Some("rcuda"), Some("lupine"))
    );
    let (rc_ns, lu_ns) = (t.vm_namespace(&vm_rc), t.vm_namespace(&vm_lu));
    let server_of = |id: &str| -> Vec<(String, String)> {
        let vm = t.api.get(&format!("/v1/vms/{id}"), &t.admin);
        let cgpus = vm["cgpus"].as_array().expect("cgpus").iter();
        cgpus
            .map(|c| {
                let server = c["rcuda_endpoint"].as_str().expect("admins see it");
                let all = GPU_SERVERS
                    .iter()
                    .map(|(name, port)| (*name, format!("{GPU_SERVER}:{port}")))
                    .chain(
                        LUPINE_SERVERS
                            .iter()
                            .map(|(name, port)| (*name, format!("{LUPINE_SERVER}:{port}"))),
                    );
                let (name, _) = all
                    .into_iter()
                    .find(|(_, endpoint)| endpoint == server)
                    .unwrap_or_else(|| panic!("a cGPU on no stand-in: {vm}"));
                (c["masked_endpoint"].as_str().expect("masked").to_owned(), name.to_owned())
            })
            .collect()
    };
    let rc_cgpus = server_of(&rc);
    let lu_cgpus = server_of(&lu);
    assert!(rc_cgpus[0].1.starts_with("gpu"), "the rCUDA VM's cGPU is on {rc_cgpus:?}");
    assert!(lu_cgpus.iter().all(|(_, s)| s.starts_with("lupine")), "{lu_cgpus:?}");
    assert_eq!(rc_cgpus[0].0, lu_cgpus[0].0, "both VMs' cGPU 0 answer at one masked endpoint");

    // Each VM reaches its own server at that endpoint, seen from the compute host.
    for (ns, cgpus) in [(&rc_ns, &rc_cgpus), (&lu_ns, &lu_cgpus)] {
        for (masked, server) in cgpus {
            assert_eq!(
                ask(ns, masked),
                Some(format!("{server} {RGPU_GPU_SIDE}")),
                "{ns} at {masked}"
            );
        }
    }
    // No GPU host, of either layer, is reachable directly from a VM or from behind the host.
    let direct = GPU_SERVERS
        .iter()
        .map(|(_, port)| format!("{GPU_SERVER}:{port}"))
        .chain(LUPINE_SERVERS.iter().map(|(_, port)| format!("{LUPINE_SERVER}:{port}")));
    for endpoint in direct {
        for ns in [&rc_ns, &lu_ns, &t.probe.name] {
            assert_eq!(ask(ns, &endpoint), None, "{ns} reached {endpoint} past the agent");
        }
    }

    // Each VM's login shell: its layer's variables, live from the agent, naming its own devices.
    let login = |ns: &str, id: &str| {
        login_env_of(ns, &t.user_data(id), &t.dir.path().join(id), &["RCUDA_", "LUPINE_", "GSAAS_"])
    };
    let mut rcuda = rcuda_variables(&[&rc_cgpus[0].0]);
    rcuda.insert("GSAAS_CGPUS".into(), "0".into());
    rcuda.insert("GSAAS_CGPUS_MISSING".into(), String::new());
    assert_eq!(login(&rc_ns, &rc), rcuda);
    let servers: Vec<&str> = lu_cgpus.iter().map(|(masked, _)| masked.as_str()).collect();
    let lupine = BTreeMap::from([
        ("LUPINE_SERVER".to_owned(), servers.join(",")),
        ("LUPINE_DISABLE_LOCAL".to_owned(), "1".to_owned()),
        ("GSAAS_CGPUS".to_owned(), "0,1".to_owned()),
        ("GSAAS_CGPUS_MISSING".to_owned(), String::new()),
    ]);
    assert_eq!(login(&lu_ns, &lu), lupine);
    // The view says the same; the path of earlier releases answers an rCUDA VM's rCUDA
    // variables as before, and refuses a LUPINE VM (they would be nonsense to its client).
    let view = t.api.get(&format!("/v1/vms/{lu}"), &t.member)["gpu_env"].clone();
    assert_eq!(view["LUPINE_SERVER"], servers.join(","), "{view}");
    let status_in = |ns: &str, path: &str| {
        let out = Command::new("ip")
            .args(["netns", "exec", ns, "curl", "-s", "-o", "/dev/null", "-w", "%{http_code}"])
            .args(["--max-time", "5", &format!("http://{MASKED_METADATA}{path}")])
            .output()
            .expect("run curl in the VM's namespace");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert_eq!(status_in(&rc_ns, "/rcuda.env"), "200");
    assert_eq!(status_in(&lu_ns, "/rcuda.env"), "404");
    assert_eq!(status_in(&lu_ns, "/gpu.json"), "200");

    // The LUPINE host hangs: its GPUs fail, and the LUPINE VM's cGPUs, with no other LUPINE GPU
    // to go to, are lost. Its environment says so, live inside the VM: no server listed (so
    // LUPINE's client cannot number a dead one as a live device), both cGPUs missing; their
    // endpoints reach nothing. The rCUDA VM is untouched.
    let lupine_agent = t.agents.iter().find(|a| a.name == LUPINE_HOST).expect("the LUPINE agent");
    lupine_agent.pause(true);
    let lost = |vm: &Value| {
        let cgpus = vm["cgpus"].as_array().map(Vec::as_slice).unwrap_or_default();
        cgpus.len() == 2 && cgpus.iter().all(|c| c["state"] == "lost")
    };
    t.wait_vm(&lu, "the LUPINE VM's cGPUs to be lost", lost);
    let missing = BTreeMap::from([
        ("LUPINE_SERVER".to_owned(), String::new()),
        ("LUPINE_DISABLE_LOCAL".to_owned(), "1".to_owned()),
        ("GSAAS_CGPUS".to_owned(), String::new()),
        ("GSAAS_CGPUS_MISSING".to_owned(), "0,1".to_owned()),
    ]);
    wait_for("the VM's live environment to say so", Duration::from_secs(10), || {
        (login(&lu_ns, &lu) == missing).then_some(())
    });
    for (masked, _) in &lu_cgpus {
        assert_eq!(ask(&lu_ns, masked), None, "a lost cGPU's endpoint {masked} still answers");
    }
    assert_eq!(login(&rc_ns, &rc), rcuda);
    assert_eq!(ask(&rc_ns, &rc_cgpus[0].0), Some(format!("{} {RGPU_GPU_SIDE}", rc_cgpus[0].1)));

    // It comes back: the cGPUs are live where they were, at the same endpoints, and listed again.
    lupine_agent.pause(false);
    t.wait_vm(&lu, "the LUPINE VM's cGPUs to be live again", |vm| {
        let cgpus = vm["cgpus"].as_array().map(Vec::as_slice).unwrap_or_default();
        cgpus.len() == 2 && cgpus.iter().all(|c| c["state"] == "live")
    });
    wait_for("the VM's live environment to list them again", Duration::from_secs(10), || {
        (login(&lu_ns, &lu) == lupine).then_some(())
    });
    for (masked, server) in &lu_cgpus {
        assert_eq!(ask(&lu_ns, masked), Some(format!("{server} {RGPU_GPU_SIDE}")));
    }
}

/// The user a process runs as (its real UID), from `/proc`.
fn uid_of(pid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|l| l.strip_prefix("Uid:")?.split_whitespace().next()?.parse().ok())
}

/// Issue [1/5] on the real kernel: the GPU host's agent runs one server per cGPU itself. A VM's
/// two cGPUs each reach a server of their own (one per GPU, seeing that GPU alone), as user
/// `nobody`, each in a cgroup of its own; neither the VM nor anything else past the VM's host
/// reaches the servers directly; the agent killed with `kill -9` and started again adopts the
/// running servers (the same processes serve on); and the termination ends them, leaving no
/// process and no open port.
#[test]
fn managed_servers_serve_each_cgpu_alone_and_outlive_a_killed_agent() {
    let mut t = Testbed::start_managed("e2e-managed");
    let (id, vm) = t.launch_ready(&remote_launch(2));
    let vm_ns = t.vm_namespace(&vm);
    let (devices, count) = rcuda_devices(&t.user_data(&id));
    assert_eq!(count, Some(2));
    let greet = |t: &Testbed| {
        let mut greetings: Vec<String> = devices
            .values()
            .map(|(masked, _)| {
                ask(&vm_ns, masked).unwrap_or_else(|| panic!("{masked} answers nothing"))
            })
            .collect();
        greetings.sort();
        let _ = t;
        greetings
    };
    // Least-load-fit spreads them: each reaches its own GPU's server, seen from the VM's host.
    assert_eq!(
        greet(&t),
        [format!("GPU-e2e-0 {RGPU_GPU_SIDE}"), format!("GPU-e2e-1 {RGPU_GPU_SIDE}")]
    );
    let servers = t._servers.as_ref().expect("a managed testbed").servers();
    assert_eq!(servers.len(), 2, "{servers:?}");
    let nobody = 65534;
    for (name, pids) in &servers {
        // `unshare`, which holds the server's PID namespace and waits for it, stays root (it
        // runs nothing of the server's); every process of the server itself is `nobody`'s.
        let comm = |pid: &u32| read(Path::new(&format!("/proc/{pid}/comm"))).trim().to_owned();
        let (holders, server): (Vec<&u32>, Vec<&u32>) =
            pids.iter().partition(|pid| comm(pid) == "unshare");
        assert_eq!(holders.len(), 1, "server {name}: {pids:?}");
        assert!(!server.is_empty(), "server {name} has no process");
        for pid in server {
            assert_eq!(uid_of(*pid), Some(nobody), "server {name}'s process {pid} ({})", comm(pid));
        }
    }
    // Nothing past the VM's host reaches a server directly, nor the VM itself.
    for port in [20000, 20001] {
        let direct = format!("{GPU_SERVER}:{port}");
        assert_eq!(ask(&vm_ns, &direct), None, "the VM reached {direct}");
        assert_eq!(ask(&t.probe.name, &direct), None, "the probe reached {direct}");
    }

    // The agent killed (SIGKILL) and started again: the same processes serve on.
    let killed = t.agents.iter().position(|a| a.name == GPU_HOST).expect("the GPU host's agent");
    drop(t.agents.remove(killed));
    t.restart_gpu_agent();
    let adopted = t._servers.as_ref().expect("a managed testbed").servers();
    assert_eq!(adopted, servers, "the servers were not adopted as they ran");
    assert_eq!(greet(&t).len(), 2);
    // And it registers, its servers still listed as they were.
    wait_for("the GPU host's agent to report its servers", Duration::from_secs(15), || {
        let hosts = t.api.get("/v1/hosts", &t.admin);
        let host = hosts["hosts"].as_array()?.iter().find(|h| h["name"] == GPU_HOST)?.clone();
        (host["state"] == "schedulable").then_some(())
    });

    // The termination ends them: no process, no cgroup, no open port.
    let (status, body) = t.api.call("DELETE", &format!("/v1/vms/{id}"), &t.member, None);
    assert_eq!(status, 202, "terminate: {body}");
    t.wait_vm(&id, "the VM to be deleted", |vm| vm["state"] == "deleted");
    wait_for("the servers to end", Duration::from_secs(15), || {
        t._servers.as_ref().expect("a managed testbed").servers().is_empty().then_some(())
    });
    for pid in servers.values().flatten() {
        // Gone, or a zombie its new parent has not reaped yet (the killed agent's child).
        let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let state = state.rsplit_once(") ").and_then(|(_, rest)| rest.split(' ').next());
        assert!(matches!(state, None | Some("Z" | "X")), "process {pid} of an ended server runs");
    }
    for port in [20000, 20001] {
        let local = format!("{GPU_SERVER}:{port}");
        assert_eq!(ask(&t._cg.name, &local), None, "{local} still answers on the GPU host");
    }
}
