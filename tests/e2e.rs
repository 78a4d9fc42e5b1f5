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
//! The test can tell "blocked" from "broken": before any agent runs, a probe namespace behind the
//! compute-rGPU host reaches the GPU host directly, and the address-reusing namespace reaches its
//! host, so every `None` below is the agents' doing. gsaasd's default policy is set to
//! `least-load-fit` so the two cGPUs land on different GPUs and a crossed route would show.
//!
//! Needs root, `ip`, `nft` and `nsenter` (scripts/test.sh installs them; CI runs as root). Names
//! carry the process id, addresses live only inside the test's namespaces, everything is removed
//! by drop guards even when an assertion fails, and every wait is bounded.

mod support;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::json;
use support::{
    ask, binaries, namespaces, read, require_root_tools, run_prefix, veth, wait_for, Api, Netns,
    Process, StandIn, SweepNamespaces, TempDir,
};

const CONTROLLER: &str = "10.240.0.1";
const RGPU_HOST: &str = "compute0-rgpu";
const GPU_HOST: &str = "compute-gpu";
const RGPU_GPU_SIDE: &str = "10.232.0.1";
const GPU_SERVER: &str = "10.232.0.2";
const VM_GATEWAY: &str = "10.77.0.1";

/// Runs `gsaasd ARGS -c CONFIG` (no network needed) and returns its stdout, trimmed.
fn gsaasd_cli(gsaasd: &Path, config: &Path, args: &[&str]) -> String {
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

#[test]
fn two_shared_cgpus_reached_from_the_vm_through_masked_endpoints_until_terminated() {
    require_root_tools();
    let (gsaasd, agent) = binaries();
    let dir = TempDir::new("e2e");
    let vm_prefix = format!("{}vm-", run_prefix());

    // Hosts and networks. Dropped last (declared first): after every process is gone.
    let mgmt = Netns::new("mgmt");
    let ctl = Netns::new("ctl");
    let crg = Netns::new("crg");
    let cg = Netns::new("cg");
    let probe = Netns::new("probe");
    let _vms = SweepNamespaces { prefix: vm_prefix.clone() };
    mgmt.ip(&["link", "add", "br0", "type", "bridge"]);
    mgmt.ip(&["link", "set", "br0", "up"]);
    for (ns, port, cidr) in [
        (&ctl, "p-ctl", format!("{CONTROLLER}/24")),
        (&crg, "p-crg", "10.240.0.11/24".to_owned()),
        (&cg, "p-cg", "10.240.0.12/24".to_owned()),
    ] {
        veth(ns, "mgmt0", &cidr, &mgmt, port, "");
        mgmt.ip(&["link", "set", port, "master", "br0"]);
    }
    veth(&crg, "gpu0", &format!("{RGPU_GPU_SIDE}/24"), &cg, "gpu0", &format!("{GPU_SERVER}/24"));
    crg.enable_forwarding();
    // The GPU host routes back to VMs, so only the agent's filter keeps them out.
    cg.ip(&["route", "add", "10.77.0.0/24", "via", RGPU_GPU_SIDE]);
    cg.ip(&["route", "add", "10.79.0.0/24", "via", RGPU_GPU_SIDE]);
    veth(&probe, "eth0", "10.79.0.2/24", &crg, "probe0", "10.79.0.1/24");
    probe.ip(&["route", "add", "default", "via", "10.79.0.1"]);

    let gpu_servers = [("gpu0", 8308), ("gpu1", 8309)];
    let _stand_ins: Vec<StandIn> = gpu_servers
        .iter()
        .map(|(name, port)| StandIn::start(&cg, &format!("{GPU_SERVER}:{port}"), name))
        .collect();
    // Any address of the host, the VMs' gateway included (once a tap carries it).
    let _host_service = StandIn::start(&crg, "0.0.0.0:7000", "crg");
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
namespaces = {{ "{RGPU_HOST}" = "{crg}", "{GPU_HOST}" = "{cg}" }}
vm_namespace_prefix = "{vm_prefix}"

[hosts]
backend = "agent"
agent_urls = {{ "{RGPU_HOST}" = "http://10.240.0.11:7450", "{GPU_HOST}" = "http://10.240.0.12:7450" }}
"#,
            crg = crg.name,
            cg = cg.name,
        ),
    )
    .expect("write gsaasd.toml");
    let public_key = gsaasd_cli(&gsaasd, &config, &["public-key"]);
    std::fs::write(dir.path().join("controller.pub.pem"), format!("{public_key}\n"))
        .expect("write the public key");
    let token = |args: &[&str]| gsaasd_cli(&gsaasd, &config, &[&["token", "issue"], args].concat());
    let admin = token(&["--role", "admin", "--project", "ops"]);
    let member = token(&["--role", "member", "--project", "e2e"]);

    // The agents' configurations: the compute-GPU host lists its two GPUs (no NVML here).
    let agent_config = |ns: &Netns, host: &str, address: &str, gpus: &str| {
        let path = dir.path().join(format!("{host}.toml"));
        let agent_token = token(&["--role", "agent", "--host", host]);
        std::fs::write(
            &path,
            format!(
                r#"host = "{host}"
listen = "{address}:7450"
state_file = "{d}/{host}.routes.json"
controller_public_key = "{d}/controller.pub.pem"
masked_range = "100.127.0.0/16"
gpu_interface = "gpu0"
retry_interval_secs = 1

[controller]
url = "http://{CONTROLLER}:8700"
token = "{agent_token}"
heartbeat_interval_secs = 1
{gpus}"#
            ),
        )
        .expect("write an agent config");
        let mut command = ns.command(&agent);
        command.arg("--config").arg(&path);
        command
    };
    let gpu_inventory = format!(
        r#"
[rcuda]
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
    let rgpu_agent = agent_config(&crg, RGPU_HOST, "10.240.0.11", "");
    let gpu_agent = agent_config(&cg, GPU_HOST, "10.240.0.12", &gpu_inventory);

    // Start everything; processes are dropped (killed) first.
    let mut serve = ctl.command(&gsaasd);
    serve.arg("serve").arg("-c").arg(&config).env("RUST_LOG", "info,sqlx=warn");
    let gsaasd_process = Process::start("gsaasd", serve, dir.path().join("gsaasd.log"));
    assert_eq!(gsaasd_process.first_line, format!("gsaasd serving on http://{CONTROLLER}:8700"));
    let _agents = [
        Process::start(RGPU_HOST, rgpu_agent, dir.path().join("rgpu-agent.log")),
        Process::start(GPU_HOST, gpu_agent, dir.path().join("gpu-agent.log")),
    ];
    let api = Api { ns: ctl.name.clone(), base: format!("http://{CONTROLLER}:8700") };

    // Both agents register over the management network.
    wait_for("both hosts to register and be schedulable", Duration::from_secs(15), || {
        let hosts = api.get("/v1/hosts", &admin);
        let ready = |name: &str| {
            hosts["hosts"].as_array()?.iter().find(|h| h["name"] == name).map(|h| {
                h["state"] == "schedulable"
                    && h["agent_url"].as_str().is_some_and(|u| u.starts_with("http://10.240.0."))
            })
        };
        (ready(RGPU_HOST) == Some(true) && ready(GPU_HOST) == Some(true)).then_some(())
    });

    // Launch 2 shared cGPUs on a remote (compute-rGPU) host, and wait for ready.
    let request = json!({"image": "cirros-0.6.2", "flavor": "m1.small", "ncgpus": 2,
        "gpu_memory_mib": 2048, "mode": "shared", "locality": "remote"});
    let (status, vm) = api.call("POST", "/v1/vms", &member, Some(&request));
    assert_eq!(status, 202, "launch: {vm}");
    let id = vm["id"].as_str().expect("the VM's id").to_owned();
    let vm_path = format!("/v1/vms/{id}");
    let vm = wait_for("the VM to be ready", Duration::from_secs(20), || {
        let vm = api.get(&vm_path, &member);
        assert_ne!(vm["state"], "error", "the launch failed: {vm}");
        (vm["state"] == "ready").then_some(vm)
    });
    let admin_view = api.get(&vm_path, &admin);
    assert_eq!(admin_view["host"], RGPU_HOST, "{admin_view}");
    let server_id = vm["server_id"].as_str().expect("a server id");
    let fixed_ip = vm["fixed_ip"].as_str().expect("a fixed IP");
    let vm_ns = format!("{vm_prefix}{server_id}");
    assert!(namespaces().contains(&vm_ns), "the VM's namespace {vm_ns} does not exist");
    let vm_tap = taps(&crg);
    assert_eq!(vm_tap.len(), 1, "the VM's host should have one tap: {vm_tap:?}");

    // The VM's cGPUs, as its cloud-init sets them.
    let user_data = read(&dir.path().join("user_data").join(format!("{id}.user_data")));
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
        let (server, _) = gpu_servers
            .iter()
            .find(|(_, port)| rcuda_endpoints[*j as usize] == format!("{GPU_SERVER}:{port}"))
            .unwrap_or_else(|| panic!("cGPU {j} is on no stand-in: {admin_view}"));
        assert_eq!(
            ask(&vm_ns, masked),
            Some(format!("{server} {RGPU_GPU_SIDE}")),
            "cGPU {j} at {masked} should reach {server}"
        );
    }
    for (_, port) in gpu_servers {
        let direct = format!("{GPU_SERVER}:{port}");
        assert_eq!(ask(&vm_ns, &direct), None, "the VM reached the GPU host at {direct}");
        assert_eq!(ask(&probe.name, &direct), None, "the probe reached {direct} past the agent");
    }

    // Terminate: the VM, its namespace and tap, and its routes are gone.
    let (status, body) = api.call("DELETE", &vm_path, &member, None);
    assert_eq!(status, 202, "terminate: {body}");
    wait_for("the VM to be deleted", Duration::from_secs(20), || {
        let vm = api.get(&vm_path, &member);
        (vm["state"] == "deleted").then_some(())
    });
    assert!(!namespaces().contains(&vm_ns), "the VM's namespace {vm_ns} is still there");
    assert!(!Path::new("/run/netns").join(&vm_ns).exists());
    assert_eq!(taps(&crg), Vec::<String>::new(), "the VM's tap is still on its host");

    // A namespace that takes over the VM's port (its tap's name and its address, so that a stale
    // route keyed on either would match), wired the same way, reaches its host but not the cGPUs
    // the VM had.
    let reuse = Netns::new("reuse");
    let tap = vm_tap[0].as_str();
    veth(&reuse, "eth0", &format!("{fixed_ip}/32"), &crg, tap, &format!("{VM_GATEWAY}/32"));
    crg.ip(&["route", "add", &format!("{fixed_ip}/32"), "dev", tap]);
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
