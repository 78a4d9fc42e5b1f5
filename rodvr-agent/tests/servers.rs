//! The agent's supervisor of cGPU servers (`servers`), against stand-in servers
//! (`standin_server.py`) on this host's real kernel: processes, PID namespaces, cgroups, ports.
//! Each test is what a hostile or broken server would do, or a way a cGPU leaves. Needs root
//! (CI runs it as root).

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, TcpStream};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gpgpums::ids::{GpuId, VmId};
use gsaas_test_support::servers::{standin_server, ServerCgroups};
use gsaas_test_support::TempDir;
use rodvr_agent::servers::cgroup::Limits;
use rodvr_agent::servers::{share, ProcessSupervisor, Settings};
use rodvr_contract::protocol::{GpuReport, RcudaEndpoint, ServerSpec, ServerState, ServerStatus};
use rodvr_core::servers::Supervisor;
use serde_json::Value;

/// One test's supervisor setting: its own run directory, cgroup parent and ports.
struct Setup {
    cgroups: ServerCgroups,
    dir: TempDir,
    script: PathBuf,
    first_port: u16,
}

impl Setup {
    fn new(tag: &str, first_port: u16) -> Self {
        assert!(
            nix::unistd::Uid::effective().is_root(),
            "the servers' tests start processes as another user, in cgroups: run as root (CI does)"
        );
        let dir = TempDir::new(&format!("servers-{tag}"));
        let script = standin_server(dir.path());
        Self { cgroups: ServerCgroups::new(tag), dir, script, first_port }
    }

    fn settings(&self, mode: &str) -> Settings {
        let nobody = nix::unistd::User::from_name("nobody").unwrap().unwrap();
        Settings {
            address: Ipv4Addr::LOCALHOST,
            command: vec!["/usr/bin/python3".into(), self.script.display().to_string()],
            ports: self.first_port..=self.first_port + 9,
            uid: nobody.uid.as_raw(),
            gid: nobody.gid.as_raw(),
            interposer: None,
            port_variable: Some("LUPINE_PORT"),
            env: BTreeMap::from([("STANDIN_MODE".to_owned(), mode.to_owned())]),
            run_dir: self.dir.path().join("run"),
            cgroup: Some(self.cgroups.path.clone()),
            limits: Limits { pids_max: 32, memory_max_bytes: 256 << 20, cpu_weight: 50 },
            ready_timeout: Duration::from_secs(5),
            start_timeout: Duration::from_secs(3),
            memory_slack_bytes: 64 << 20,
            mps: None,
            spares: 0,
            unshare: "/usr/bin/unshare".into(),
            setpriv: "/usr/bin/setpriv".into(),
        }
    }

    fn start(&self, mode: &str, keep: &[ServerSpec]) -> Arc<ProcessSupervisor> {
        ProcessSupervisor::start(self.settings(mode), &gpus(), keep).expect("the supervisor starts")
    }

    /// What the server of `name` printed about itself (its last start).
    fn told(&self, vm: u128, index: u32) -> Value {
        let name = format!("s-{}-{index}", uuid::Uuid::from_u128(vm).simple());
        let log = std::fs::read_to_string(self.dir.path().join("run").join(format!("{name}.log")))
            .unwrap_or_default();
        let line = log.lines().rev().find_map(|l| l.strip_prefix("standin ")).expect(&log);
        serde_json::from_str(line).unwrap()
    }
}

fn gpus() -> Vec<GpuReport> {
    (0..2)
        .map(|index| GpuReport {
            id: GpuId::new(format!("g0:gpu{index}")).unwrap(),
            index,
            model: "H200".into(),
            memory_mib: 143_771,
            rcuda: RcudaEndpoint { address: Ipv4Addr::LOCALHOST, port: 14833, gpu_number: 0 },
            unhealthy: None,
            attributes: gpgpums::GpuAttributes {
                uuid: Some(format!("GPU-0000000{index}-aaaa-bbbb-cccc-dddddddddddd")),
                ..Default::default()
            },
            partition: None,
        })
        .collect()
}

fn spec(vm: u128, index: u32, gpu: u32, memory_mib: Option<u64>) -> ServerSpec {
    ServerSpec {
        vm: VmId::from_uuid(uuid::Uuid::from_u128(vm)),
        index,
        gpu: GpuId::new(format!("g0:gpu{gpu}")).unwrap(),
        memory_mib,
        clients: vec![],
        compute_percent: None,
    }
}

fn accepts(port: u16) -> bool {
    TcpStream::connect_timeout(&(Ipv4Addr::LOCALHOST, port).into(), Duration::from_millis(200))
        .is_ok()
}

/// Ticks `supervisor` until `done` holds of its statuses (at most `within`).
fn tick_until(
    supervisor: &ProcessSupervisor,
    within: Duration,
    done: impl Fn(&[ServerStatus]) -> bool,
) -> Vec<ServerStatus> {
    let deadline = Instant::now() + within;
    loop {
        supervisor.tick();
        let statuses = supervisor.statuses();
        if done(&statuses) {
            return statuses;
        }
        assert!(Instant::now() < deadline, "not reached within {within:?}: {statuses:#?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn alive(pid: u32) -> bool {
    rodvr_agent::servers::process::start_time(pid).is_some()
}

/// The host PIDs of the processes in a server's cgroup.
fn cgroup_pids(setup: &Setup, vm: u128, index: u32) -> Vec<u32> {
    let name = format!("s-{}-{index}", uuid::Uuid::from_u128(vm).simple());
    std::fs::read_to_string(setup.cgroups.path.join(name).join("cgroup.procs"))
        .map(|t| t.lines().filter_map(|l| l.parse().ok()).collect())
        .unwrap_or_default()
}

#[test]
fn each_cgpu_gets_a_server_of_its_own_alone_unprivileged_and_ready_before_it_is_answered() {
    let setup = Setup::new("start", 21100);
    let supervisor = setup.start("serve", &[]);
    let specs = [spec(1, 0, 0, Some(1024)), spec(1, 1, 1, None)];
    let statuses = supervisor.converge(&specs);
    assert_eq!(statuses.len(), 2);
    for (status, spec) in statuses.iter().zip(&specs) {
        assert_eq!(
            (status.vm, status.index, status.state),
            (spec.vm, spec.index, ServerState::Ready),
            "{status:?}"
        );
        let port = status.live_port().expect("ready with a port");
        assert!((21100..=21109).contains(&port), "{port}");
        assert!(accepts(port), "answered ready before it accepted");
    }
    assert_ne!(statuses[0].port, statuses[1].port);
    let nobody = nix::unistd::User::from_name("nobody").unwrap().unwrap();
    for (index, gpu) in [(0u32, 0u32), (1, 1)] {
        let told = setup.told(1, index);
        assert_eq!(told["uid"], nobody.uid.as_raw(), "{told}");
        assert_eq!(told["groups"].as_array().unwrap().len(), 0, "{told}");
        assert_eq!(told["pid"], 1, "PID 1 of a namespace of its own: {told}");
        assert_eq!(told["visible_pids"], serde_json::json!([1]), "it sees no other process");
        let env = told["env"].as_object().unwrap();
        assert_eq!(
            env["CUDA_VISIBLE_DEVICES"],
            format!("GPU-0000000{gpu}-aaaa-bbbb-cccc-dddddddddddd")
        );
        let port = statuses[index as usize].port.unwrap().to_string();
        assert_eq!(
            (&env["GSAAS_SERVER_PORT"], &env["LUPINE_PORT"]),
            (&port.clone().into(), &port.into())
        );
        // Nothing of the agent's environment, and its share state its only descriptor besides
        // the standard streams.
        assert!(!env.contains_key("CARGO_MANIFEST_DIR"), "{env:?}");
        let share_fd: i64 = env["GSAAS_SHARE_FD"].as_str().unwrap().parse().unwrap();
        assert_eq!(told["fds"], serde_json::json!([0, 1, 2, share_fd]), "{told}");
    }
    // Its share: 1 GiB for the shared cGPU, the whole GPU for the exclusive one.
    let share_of = |index: u32| {
        let name = format!("s-{}-{index}", uuid::Uuid::from_u128(1).simple());
        share::ShareState::open(&setup.dir.path().join("run").join(format!("{name}.share")))
            .unwrap()
            .limit_bytes()
            .unwrap()
    };
    assert_eq!((share_of(0), share_of(1)), (1 << 30, share::UNLIMITED));
    // Limited in its cgroups: at most 32 processes, wherever the host has the controller.
    let pids = cgroup_pids(&setup, 1, 0);
    assert!(!pids.is_empty());
    let name = format!("s-{}-0", uuid::Uuid::from_u128(1).simple());
    let limited = std::iter::once(setup.cgroups.path.clone())
        .chain(setup.cgroups.v1_twins())
        .map(|d| d.join(&name))
        .map(|d| d.join("pids.max"))
        .find(|f| f.exists())
        .expect("a pids limit somewhere");
    assert_eq!(std::fs::read_to_string(limited).unwrap().trim(), "32");
    // The report lists both.
    assert_eq!(supervisor.statuses().len(), 2);
    supervisor.converge(&[]);
}

#[test]
fn a_server_that_dies_is_started_again_on_its_port_with_its_environment() {
    let setup = Setup::new("restart", 21120);
    let supervisor = setup.start("serve", &[]);
    let first = supervisor.converge(&[spec(2, 0, 0, Some(512))]).remove(0);
    let port = first.live_port().unwrap();
    for pid in cgroup_pids(&setup, 2, 0) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    let statuses = tick_until(&supervisor, Duration::from_secs(10), |s| {
        s[0].restarts == 1 && s[0].state == ServerState::Ready
    });
    assert_eq!(statuses[0].port, Some(port), "its port was free: it keeps it");
    assert!(statuses[0].pid != first.pid);
    assert!(accepts(port));
    supervisor.converge(&[]);
}

#[test]
fn a_server_cannot_keep_its_port_through_a_child_when_it_ends() {
    let setup = Setup::new("hold", 21140);
    let supervisor = setup.start("hold_and_exit", &[]);
    let first = supervisor.converge(&[spec(3, 0, 0, Some(512))]).remove(0);
    assert_eq!(first.state, ServerState::Ready);
    let port = first.port.unwrap();
    // It exits after forking a child that holds the listening socket: the child goes with it
    // (its namespace's first process ended), the port is free, and the restart takes it again.
    let statuses = tick_until(&supervisor, Duration::from_secs(10), |s| s[0].restarts >= 1);
    assert_eq!(statuses[0].port, Some(port), "{statuses:?}");
    supervisor.converge(&[]);
    assert!(!accepts(port), "a process of the server still holds its port");
}

#[test]
fn a_crash_loop_backs_off_and_is_reported() {
    let setup = Setup::new("crash", 21160);
    let supervisor = setup.start("crash", &[]);
    let started = Instant::now();
    let first = supervisor.converge(&[spec(4, 0, 0, Some(512))]).remove(0);
    assert_ne!(first.state, ServerState::Ready);
    // Within 3 s a server that dies at once is started at most 4 times (0.5 s, 1 s, 2 s).
    let statuses = tick_until(&supervisor, Duration::from_secs(10), |_| {
        started.elapsed() > Duration::from_secs(3)
    });
    assert!((1..=3).contains(&statuses[0].restarts), "{statuses:?}");
    assert_eq!(statuses[0].state, ServerState::Backoff, "{statuses:?}");
    assert!(statuses[0].reason.as_deref().unwrap_or_default().contains("exited"), "{statuses:?}");
    supervisor.converge(&[]);
}

#[test]
fn a_server_that_never_accepts_is_not_ready_and_is_ended_at_its_start_timeout() {
    let setup = Setup::new("never", 21180);
    let mut settings = setup.settings("never");
    settings.ready_timeout = Duration::from_millis(300);
    let supervisor = ProcessSupervisor::start(settings, &gpus(), &[]).unwrap();
    let first = supervisor.converge(&[spec(5, 0, 0, Some(512))]).remove(0);
    assert_eq!((first.state, first.live_port()), (ServerState::Starting, None));
    let statuses =
        tick_until(&supervisor, Duration::from_secs(10), |s| s[0].state == ServerState::Backoff);
    assert!(statuses[0].reason.as_deref().unwrap().contains("did not accept"), "{statuses:?}");
    supervisor.converge(&[]);
}

#[test]
fn servers_end_with_their_cgpus_and_leave_nothing() {
    let setup = Setup::new("leave", 21200);
    let supervisor = setup.start("serve", &[]);
    let statuses = supervisor.converge(&[spec(6, 0, 0, Some(512)), spec(7, 0, 0, Some(512))]);
    let gone_port = statuses[0].port.unwrap();
    let gone_pids = cgroup_pids(&setup, 6, 0);
    let left = supervisor.converge(&[spec(7, 0, 0, Some(512))]);
    assert_eq!((left.len(), left[0].port), (1, statuses[1].port), "the other keeps its port");
    assert!(gone_pids.iter().all(|pid| !alive(*pid)), "a process of the ended server runs");
    assert!(!accepts(gone_port));
    let name = format!("s-{}-0", uuid::Uuid::from_u128(6).simple());
    assert!(!setup.cgroups.path.join(&name).exists(), "its cgroup is left");
    assert!(!setup.dir.path().join("run").join(format!("{name}.share")).exists());
    // Its clients change (its VM placed on a host after its server started): the same server.
    let mut placed = spec(7, 0, 0, Some(512));
    placed.clients = vec!["10.78.0.5".parse().unwrap()];
    let kept = supervisor.converge(&[placed]);
    assert_eq!(kept[0].pid, left[0].pid, "a server was started again for its clients");
    // The same cGPU moved to another GPU: a new server.
    let moved = supervisor.converge(&[spec(7, 0, 1, Some(512))]);
    assert_eq!(moved[0].state, ServerState::Ready);
    assert_ne!(moved[0].pid, left[0].pid);
    supervisor.converge(&[]);
    assert!(cgroup_pids(&setup, 7, 0).is_empty());
}

#[test]
fn a_new_agent_adopts_the_servers_its_table_still_lists_and_ends_every_other() {
    let setup = Setup::new("adopt", 21220);
    let specs = [spec(8, 0, 0, Some(512)), spec(8, 1, 0, Some(512)), spec(9, 0, 1, None)];
    let before = {
        let first = setup.start("serve", &[]);
        first.converge(&specs)
        // Dropped as a killed agent would be: nothing ends its servers.
    };
    let pids: Vec<Vec<u32>> =
        [(8, 0), (8, 1), (9, 0)].iter().map(|(vm, i)| cgroup_pids(&setup, *vm, *i)).collect();
    assert!(pids.iter().flatten().all(|pid| alive(*pid)));
    // A server the old agent started but never recorded (killed in between).
    let stray = setup.cgroups.path.join("s-stray-0");
    std::fs::create_dir(&stray).unwrap();
    let mut sleeper = std::process::Command::new("sleep").arg("600").spawn().unwrap();
    std::fs::write(stray.join("cgroup.procs"), sleeper.id().to_string()).unwrap();
    // The new agent's table lists two of the three.
    let keep = [specs[0].clone(), specs[2].clone()];
    let second = setup.start("serve", &keep);
    let adopted = second.statuses();
    assert_eq!(adopted.len(), 2, "{adopted:?}");
    assert_eq!(
        adopted.iter().map(|s| (s.key(), s.pid, s.state)).collect::<Vec<_>>(),
        [
            (before[0].key(), before[0].pid, ServerState::Ready),
            (before[2].key(), before[2].pid, ServerState::Ready)
        ]
    );
    assert!(pids[1].iter().all(|pid| !alive(*pid)), "the unlisted server still runs");
    assert!(!accepts(before[1].port.unwrap()));
    assert!(
        sleeper.try_wait().unwrap().is_some() || {
            std::thread::sleep(Duration::from_millis(200));
            sleeper.try_wait().unwrap().is_some()
        },
        "the stray process runs"
    );
    assert!(!stray.exists());
    // Converging to the same table keeps the adopted processes.
    let again = second.converge(&keep);
    assert_eq!(again.iter().map(|s| s.pid).collect::<Vec<_>>(), [before[0].pid, before[2].pid]);
    second.converge(&[]);
}

#[test]
fn with_no_free_port_a_server_fails_and_is_tried_again() {
    let setup = Setup::new("ports", 21240);
    let mut settings = setup.settings("serve");
    settings.ports = 21240..=21240;
    let supervisor = ProcessSupervisor::start(settings, &gpus(), &[]).unwrap();
    let blocker = std::net::TcpListener::bind((Ipv4Addr::UNSPECIFIED, 21240)).unwrap();
    let first = supervisor.converge(&[spec(10, 0, 0, Some(512))]).remove(0);
    assert_eq!(first.state, ServerState::Failed);
    assert!(first.reason.as_deref().unwrap().contains("no free port"), "{first:?}");
    drop(blocker);
    tick_until(&supervisor, Duration::from_secs(10), |s| s[0].state == ServerState::Ready);
    supervisor.converge(&[]);
}

/// A server is held to its cGPU's share by the interposer the agent preloads, through the share
/// state it inherits (as `nobody`, in its own namespace): a tenant's allocations pass up to
/// 1,024 MiB and not one MiB further, and an IPC handle is refused; the agent reads both refusals
/// in the share state.
#[test]
fn a_server_is_held_to_its_share_through_the_state_it_inherits() {
    let setup = Setup::new("share", 21260);
    let (interposer, libs) = gsaas_test_support::servers::share_libraries(setup.dir.path());
    let mut settings = setup.settings("allocate");
    settings.interposer = Some(interposer);
    settings.env.insert("STANDIN_ALLOC_MIB".into(), "512,512,1".into());
    settings.env.insert("LD_LIBRARY_PATH".into(), libs.display().to_string());
    let supervisor = ProcessSupervisor::start(settings, &gpus(), &[]).unwrap();
    let status = supervisor.converge(&[spec(11, 0, 0, Some(1024))]).remove(0);
    assert_eq!(status.state, ServerState::Ready, "{status:?}");
    let name = format!("s-{}-0", uuid::Uuid::from_u128(11).simple());
    let log =
        std::fs::read_to_string(setup.dir.path().join("run").join(format!("{name}.log"))).unwrap();
    let said: Vec<&str> = log.lines().filter(|l| !l.starts_with("standin ")).collect();
    // 2: CUDA_ERROR_OUT_OF_MEMORY; 801: CUDA_ERROR_NOT_SUPPORTED.
    assert_eq!(said, ["init 0", "alloc 512 0", "alloc 512 0", "alloc 1 2", "ipc 801"], "{log}");
    let state =
        share::ShareState::open(&setup.dir.path().join("run").join(format!("{name}.share")))
            .unwrap();
    let counters = state.counters().unwrap();
    assert_eq!((counters.refused_allocations, counters.refused_sharing), (1, 1));
    assert_eq!(counters.peak_bytes, 1 << 30);
    supervisor.converge(&[]);
}

/// The second layer: a server of a shared cGPU that holds more GPU memory than its share and the
/// slack, as the driver counts it over all its processes (whatever path it took past the
/// interposer), is ended and started again; its memory is reported meanwhile. An exclusive
/// cGPU's server is never ended for its memory.
#[test]
fn a_server_past_its_share_as_the_driver_counts_it_is_ended() {
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicU64, Ordering};
    let setup = Setup::new("watch", 21280);
    // What the driver says each process holds: each of the shared server's processes holds
    // `held` MiB, every process of the exclusive one 100 GiB.
    let held = Arc::new(AtomicU64::new(300));
    let cgroups = setup.cgroups.path.clone();
    let name = |vm: u128| format!("s-{}-0", uuid::Uuid::from_u128(vm).simple());
    let (shared, exclusive) = (name(12), name(13));
    let reading = held.clone();
    let memory: rodvr_agent::servers::MemoryReader = Box::new(move || {
        let pids = |server: &str| -> Vec<u32> {
            std::fs::read_to_string(cgroups.join(server).join("cgroup.procs"))
                .map(|t| t.lines().filter_map(|l| l.parse().ok()).collect())
                .unwrap_or_default()
        };
        let mut per_pid: HashMap<u32, u64> = HashMap::new();
        // One process of each server holds it all (the server; its holder holds nothing).
        if let Some(pid) = pids(&shared).last() {
            per_pid.insert(*pid, reading.load(Ordering::SeqCst) << 20);
        }
        if let Some(pid) = pids(&exclusive).last() {
            per_pid.insert(*pid, 100 << 30);
        }
        Some(per_pid)
    });
    let supervisor =
        ProcessSupervisor::start_watching(setup.settings("serve"), &gpus(), &[], Some(memory))
            .unwrap();
    let specs = [spec(12, 0, 0, Some(1024)), spec(13, 0, 1, None)];
    supervisor.converge(&specs);
    // Within its share and the slack (1,024 + 64 MiB): reported, kept.
    held.store(1080, Ordering::SeqCst);
    let statuses =
        tick_until(&supervisor, Duration::from_secs(5), |s| s[0].gpu_memory_mib == Some(1080));
    assert_eq!(statuses[0].state, ServerState::Ready, "{statuses:?}");
    assert_eq!(statuses[1].gpu_memory_mib, Some(100 << 10), "the exclusive one reported too");
    // Past it: ended, why said; the exclusive one, at 100 GiB, stays.
    held.store(1100, Ordering::SeqCst);
    let statuses =
        tick_until(&supervisor, Duration::from_secs(5), |s| s[0].state != ServerState::Ready);
    assert_eq!(statuses[0].state, ServerState::Backoff, "{statuses:?}");
    let why = statuses[0].reason.clone().unwrap();
    assert!(why.contains("1100 MiB") && why.contains("share of 1024 MiB"), "{why}");
    assert_eq!(statuses[1].state, ServerState::Ready);
    assert_eq!(supervisor.over_share.load(Ordering::SeqCst), 1);
    assert_eq!((statuses[0].over_share_ends, statuses[1].over_share_ends), (1, 0));
    // Started again (its memory gone with its processes), back under its share.
    held.store(10, Ordering::SeqCst);
    tick_until(&supervisor, Duration::from_secs(10), |s| {
        s[0].state == ServerState::Ready && s[0].restarts == 1
    });
    supervisor.converge(&[]);
}

#[test]
fn a_compute_share_is_set_only_under_mps_and_a_host_without_it_refuses_to_serve_one() {
    let setup = Setup::new("mps", 21300);
    let shared = ServerSpec { compute_percent: Some(30), ..spec(14, 0, 0, Some(2048)) };
    // No MPS here: the share cannot be held, so the server is never started (a tenant must not
    // get the whole GPU's SMs because a table asked a host that cannot say no otherwise).
    let plain = setup.start("serve", &[]);
    assert!(!plain.mps());
    let refused = plain.converge(std::slice::from_ref(&shared)).remove(0);
    assert_eq!(refused.state, ServerState::Failed, "{refused:?}");
    assert_eq!(refused.live_port(), None);
    assert!(refused.reason.as_deref().unwrap().contains("MPS"), "{refused:?}");
    assert!(cgroup_pids(&setup, 14, 0).is_empty(), "nothing started");
    drop(plain);
    // Under MPS: the server is MPS's client with its share of the SMs and of the memory; a
    // cGPU without a share gets no percentage, and none of it is the tenant's to set.
    let pipes = setup.dir.path().join("mps-pipes");
    let settings = Settings { mps: Some(pipes.clone()), ..setup.settings("serve") };
    let supervisor = ProcessSupervisor::start(settings, &gpus(), &[]).unwrap();
    assert!(supervisor.mps());
    let unshared = spec(15, 0, 1, Some(1024));
    let statuses = supervisor.converge(&[shared.clone(), unshared]);
    assert!(statuses.iter().all(|s| s.state == ServerState::Ready), "{statuses:?}");
    let env = |vm: u128| setup.told(vm, 0)["env"].clone();
    assert_eq!(env(14)["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], "30");
    assert_eq!(env(14)["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"], "0=2048M");
    assert_eq!(env(14)["CUDA_MPS_PIPE_DIRECTORY"], pipes.display().to_string());
    assert!(env(15).get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE").is_none(), "{}", env(15));
    assert_eq!(env(15)["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"], "0=1024M");
    // Another share is another server: the old one ends, a new one starts with 60.
    let first_pid = statuses[0].pid;
    let wider = ServerSpec { compute_percent: Some(60), ..shared };
    let statuses = supervisor.converge(&[wider]);
    assert_eq!(statuses[0].state, ServerState::Ready, "{statuses:?}");
    assert_ne!(statuses[0].pid, first_pid);
    assert_eq!(env(14)["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], "60");
    supervisor.converge(&[]);
}

#[test]
fn a_warm_spare_serves_a_new_cgpu_at_once_with_its_share_set_at_the_handover() {
    let setup = Setup::new("spare", 21320);
    let settings = Settings { spares: 1, ..setup.settings("serve") };
    let supervisor = ProcessSupervisor::start(settings.clone(), &gpus(), &[]).unwrap();
    // A spare per GPU, started by the ticks, serving nobody: not a cGPU's, limit 0.
    let ready =
        |s: &[ServerStatus]| s.len() == 2 && s.iter().all(|s| s.state == ServerState::Ready);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !ready(&supervisor.spares()) {
        assert!(Instant::now() < deadline, "no spares: {:?}", supervisor.spares());
        supervisor.tick();
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(supervisor.statuses().is_empty(), "spares are nobody's cGPUs");
    let spares = supervisor.spares();
    let spare_of_gpu0 = spares.iter().find(|s| s.gpu.as_str() == "g0:gpu0").unwrap().clone();
    let shares = || -> Vec<u64> {
        let mut limits: Vec<u64> = std::fs::read_dir(setup.dir.path().join("run"))
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().ends_with(".share"))
            .map(|e| share::ShareState::open(&e.path()).unwrap().limit_bytes().unwrap())
            .collect();
        limits.sort();
        limits
    };
    assert_eq!(shares(), [0, 0], "a spare can allocate nothing");
    // A spare has the lowest CPU weight (starting one takes no CPU time from live servers);
    // its handover gives it the configured one.
    let spare_pid = spare_of_gpu0.pid.unwrap();
    let lowest = Limits { cpu_weight: 1, ..settings.limits };
    assert_eq!(cpu_weight(&setup.cgroups, spare_pid), cpu_weight_file(lowest));
    // A cGPU on GPU 0 takes its spare: the same process, ready at once, its share set.
    let started = Instant::now();
    let status = supervisor.converge(&[spec(16, 0, 0, Some(1024))]).remove(0);
    assert_eq!(cpu_weight(&setup.cgroups, spare_pid), cpu_weight_file(settings.limits));
    let took = started.elapsed();
    assert_eq!(status.state, ServerState::Ready, "{status:?}");
    assert_eq!((status.pid, status.port), (spare_of_gpu0.pid, spare_of_gpu0.port));
    assert!(took < Duration::from_secs(1), "{took:?}");
    assert!(accepts(status.live_port().unwrap()));
    // Behind it, after the table's answer, a new spare for GPU 0 (another process, another
    // port), started outside the supervisor's locks; GPU 1's stays. The servers' thread and an
    // answer replenishing at once start one spare, not two.
    assert_eq!(supervisor.spares().len(), 1);
    let together = std::sync::Barrier::new(2);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            together.wait();
            supervisor.tick();
        });
        together.wait();
        supervisor.replenish();
    });
    let spares = supervisor.spares();
    assert_eq!(spares.len(), 2, "{spares:?}");
    let new_spare = spares.iter().find(|s| s.gpu.as_str() == "g0:gpu0").unwrap();
    assert_ne!(new_spare.pid, status.pid);
    assert_ne!(new_spare.port, status.port);
    assert!(shares().contains(&(1024 << 20)), "{:?}", shares());
    // A restarted agent adopts the server made of a spare, and kills the spares (unrecorded).
    let keep = [spec(16, 0, 0, Some(1024))];
    drop(supervisor);
    let again = ProcessSupervisor::start(settings, &gpus(), &keep).unwrap();
    let adopted = again.statuses();
    assert_eq!(adopted.len(), 1, "{adopted:?}");
    assert_eq!(adopted[0].pid, status.pid, "the cGPU's server outlives the agent");
    let others: Vec<u32> = spares.iter().filter_map(|s| s.pid).collect();
    let deadline = Instant::now() + Duration::from_secs(5);
    while others.iter().any(|pid| alive(*pid)) {
        assert!(Instant::now() < deadline, "a spare outlived its agent");
        std::thread::sleep(Duration::from_millis(20));
    }
    again.converge(&[]);
}

/// The CPU weight of the server cgroup holding `pid`, as its file says: `cpu.shares` where the
/// cpu controller is a v1 one (a hybrid host), else `cpu.weight`.
fn cpu_weight(cgroups: &ServerCgroups, pid: u32) -> String {
    let (name, _) = cgroups
        .servers()
        .into_iter()
        .find(|(_, pids)| pids.contains(&pid))
        .expect("the server's cgroup");
    let v1 = cgroups.v1_twins().into_iter().find(|p| p.starts_with("/sys/fs/cgroup/cpu"));
    match v1 {
        Some(dir) => std::fs::read_to_string(dir.join(&name).join("cpu.shares")).unwrap(),
        None => std::fs::read_to_string(cgroups.path.join(&name).join("cpu.weight")).unwrap(),
    }
    .trim()
    .to_owned()
}

/// What [`cpu_weight`] reads for `limits` on this host.
fn cpu_weight_file(limits: Limits) -> String {
    let v1 = std::path::Path::new("/sys/fs/cgroup/cpu/cpu.shares").exists();
    if v1 {
        (u64::from(limits.cpu_weight) * 1024 / 100).max(2).to_string()
    } else {
        limits.cpu_weight.to_string()
    }
}
