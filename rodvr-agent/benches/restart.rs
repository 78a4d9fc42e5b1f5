//! `cargo bench -p rodvr-agent --bench restart` (as root): an agent restart or a host reboot
//! with 10,000 routes, from the agent's start to its routes live again, with no controller.
//!
//! A real `rodvr-agent` in a network namespace takes a 10,000-route table (one route is a test
//! VM's, in a namespace of its own, to a stand-in rCUDA server), is killed, and its kernel table
//! deleted (a reboot loses it). Each round then starts the agent again and measures, from the
//! spawn: the VM's first connection through its masked endpoint that reaches the server (routes
//! live), and the agent's "listening" line (it listens only after re-applying its state file).

use gsaas_test_support as support;

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use gpgpums::ids::{HostId, VmId};
use rodvr_contract::auth::TokenSigner;
use rodvr_contract::client::AgentClient;
use rodvr_contract::protocol::{Route, RouteTable};
use support::netns::{connect, greet_and_echo, require_root_tools, veth, Netns};
use support::{key_pair, TempDir};

const ROUTES: u32 = 10_000;
const ROUNDS: usize = 7;
const MASKED: &str = "100.127.0.1:9000";

fn route(i: u32) -> Route {
    // Route 0 is the test VM's; the others are VMs on taps that do not exist.
    let (tap, ip) = if i == 0 {
        ("tap1".to_owned(), "10.231.1.2".parse().unwrap())
    } else {
        (
            format!("vtap{i}"),
            std::net::Ipv4Addr::from(u32::from(std::net::Ipv4Addr::new(10, 64, 0, 0)) + i),
        )
    };
    Route {
        vm: VmId::from_uuid(uuid::Uuid::from_u128(u128::from(i) + 1)),
        vm_ip: ip,
        vm_tap: tap,
        masked: MASKED.parse().unwrap(),
        target: format!("10.232.0.2:{}", 8308 + i % 8).parse().unwrap(),
        gpu_number: 0,
        index: Some(0),
        remoting: Default::default(),
    }
}

struct Agent {
    child: Child,
    listening: mpsc::Receiver<String>,
}

impl Agent {
    fn spawn(ns: &Netns, config: &std::path::Path) -> Agent {
        let mut child = Command::new("ip")
            .args(["netns", "exec", &ns.name, env!("CARGO_BIN_EXE_rodvr-agent"), "--config"])
            .arg(config)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start rodvr-agent");
        let stdout = child.stdout.take().unwrap();
        let (tx, listening) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        Agent { child, listening }
    }

    fn url(&self) -> String {
        let line = self.listening.recv_timeout(Duration::from_secs(30)).expect("agent started");
        format!("http://{}", line.strip_prefix("rodvr-agent listening on ").expect(&line))
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn ms(d: Duration) -> String {
    format!("{:.0} ms", d.as_secs_f64() * 1e3)
}

fn main() {
    require_root_tools();
    let vm = Netns::new("rvm");
    let ch = Netns::new("rch");
    let gh = Netns::new("rgh");
    veth(&vm, "eth0", "10.231.1.2/24", &ch, "tap1", "10.231.1.1/24");
    veth(&gh, "eth0", "10.232.0.2/24", &ch, "gpu0", "10.232.0.1/24");
    vm.ip(&["route", "add", "default", "via", "10.231.1.1"]);
    gh.ip(&["route", "add", "10.231.0.0/16", "via", "10.232.0.1"]);
    ch.enable_forwarding();
    let listener = gh.run(|| TcpListener::bind("10.232.0.2:8308").unwrap());
    std::thread::spawn(move || {
        for conn in listener.incoming().map_while(Result::ok) {
            std::thread::spawn(move || greet_and_echo(conn, "gpu0"));
        }
    });

    let dir = TempDir::new("restart-bench");
    let (private, public) = key_pair(41);
    std::fs::write(dir.path().join("controller.pub.pem"), public).unwrap();
    let config = dir.path().join("agent.toml");
    std::fs::write(
        &config,
        format!(
            "host = \"crg0\"\nlisten = \"127.0.0.1:0\"\nstate_file = \"{d}/routes.json\"\n\
             controller_public_key = \"{d}/controller.pub.pem\"\nmasked_range = \"100.127.0.0/16\"\n\
             gpu_interface = \"gpu0\"\n",
            d = dir.path().display()
        ),
    )
    .unwrap();

    // The table, pushed once as gsaasd would.
    let agent = Agent::spawn(&ch, &config);
    let url = agent.url();
    let signer = TokenSigner::from_private_pem(private.as_bytes(), "gsaasd").unwrap();
    let client = AgentClient::new(&url, HostId::new("crg0").unwrap(), signer);
    let table = RouteTable {
        generation: 1,
        routes: (0..ROUTES).map(route).collect(),
        metadata: None,
        vms_without_cgpus: vec![],
        lost: vec![],
        servers: vec![],
    };
    ch.run(|| {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        if let Err(e) = rt.block_on(client.put_routes(&table)) {
            panic!("the table applies: {e} {e:?}");
        }
    });
    assert!(connect(&vm.name, MASKED).is_some(), "the VM reaches its cGPU");
    drop(agent);

    println!(
        "\n## Agent restart with {ROUTES} routes: from start to routes live ({ROUNDS} rounds)"
    );
    println!("| round | routes live (the VM's first connection) | agent listening |");
    println!("|---:|---:|---:|");
    let mut live = Vec::new();
    for round in 0..ROUNDS {
        // A reboot: the kernel table is gone. (An agent restart alone keeps it: routes never stop.)
        ch.exec(&["nft", "delete", "table", "ip", "rodvr"]);
        ch.exec(&["nft", "delete", "table", "ip6", "rodvr"]);
        assert!(connect(&vm.name, MASKED).is_none(), "no route once the table is gone");
        let started = Instant::now();
        let agent = Agent::spawn(&ch, &config);
        let (tx, first) = mpsc::channel();
        let probe = vm.name.clone();
        // Probe from the VM until a connection is accepted (each attempt waits at most 20 ms: a
        // SYN dropped while there is no route is retried, not waited on).
        std::thread::spawn(move || loop {
            let addr: SocketAddr = MASKED.parse().unwrap();
            let reached = support::netns::enter_and_run(&probe, || {
                std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(20)).ok()
            });
            if reached.is_some() {
                let _ = tx.send(Instant::now());
                break;
            }
        });
        let listening =
            agent.listening.recv_timeout(Duration::from_secs(30)).map(|_| started.elapsed());
        let reached = first
            .recv_timeout(Duration::from_secs(30))
            .expect("routes live")
            .duration_since(started);
        let listening = listening.expect("the agent listens");
        live.push(reached);
        println!("| {round} | {} | {} |", ms(reached), ms(listening));
        assert!(connect(&vm.name, MASKED).is_some_and(|(_, greeting)| greeting.starts_with("gpu0")));
        drop(agent);
    }
    println!("\nMedian from start to routes live: {} (target <= 1 s).", ms(median(live)));
}
