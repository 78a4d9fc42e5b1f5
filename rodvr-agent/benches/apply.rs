//! `cargo bench -p rodvr-agent` (as root): how fast the agent programs the kernel, compared with
//! the naive per-cGPU way (one `nft add rule` process per route, the configuration behind the
//! dissertation's 0.31 s per cGPU), and what a masked route costs in TCP bulk throughput.
//! Everything runs in network namespaces the bench creates and deletes.

use gsaas_test_support as support;

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener, TcpStream};
use std::process::Command;
use std::time::{Duration, Instant};

use rodvr_agent::nft::NftFirewall;
use rodvr_core::firewall::{Dataplane, Firewall};
use rodvr_core::fixtures::params;
use rodvr_core::render::{RouteKey, RouteMap, Transaction};
use support::netns::{require_root_tools, veth, Netns};

/// Route `i`: VM 10.(64 + i / 65536).(i / 256 % 256).(i % 256) on tap `tap<i>` ->
/// 100.127.0.1:9000 -> a GPU port.
fn key(i: u32) -> RouteKey {
    let vm = Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 64, 0, 0)) + i);
    RouteKey {
        tap: format!("tap{i}"),
        ip: vm,
        masked: SocketAddrV4::new(Ipv4Addr::new(100, 127, 0, 1), 9000),
    }
}

fn target(i: u32, salt: u16) -> SocketAddrV4 {
    SocketAddrV4::new(Ipv4Addr::new(10, 232, 0, 2), 8308 + (i % 8) as u16 + salt)
}

fn routes(n: u32) -> RouteMap {
    (0..n).map(|i| (key(i), target(i, 0))).collect()
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

fn nft(args: &[&str]) {
    let out = Command::new("nft").args(args).output().expect("run nft");
    assert!(out.status.success(), "nft {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

fn bench_apply(ns: &Netns) -> Duration {
    ns.run(|| {
        let mut fw = NftFirewall::default();
        println!("\n## Applying the agent's table (one nft transaction), median of 5");
        println!("| routes | full table replace |");
        println!("|---:|---:|");
        let mut at_1000 = Duration::ZERO;
        for n in [1u32, 100, 1_000, 10_000] {
            let tx = Transaction::Replace { params: params(), routes: routes(n) };
            let samples: Vec<Duration> = (0..5)
                .map(|_| {
                    let t = Instant::now();
                    fw.apply(&tx).unwrap();
                    t.elapsed()
                })
                .collect();
            let m = median(samples);
            if n == 1_000 {
                at_1000 = m;
            }
            println!("| {n} | {} |", ms(m));
        }

        println!("\n## One route changed (element transaction through Dataplane::converge), median of 21");
        println!("A re-target is applied (and answered) once its transaction is in; the filters reset the");
        println!("route's old connections at their next packet, and its conntrack entries are cut after the");
        println!("answer (Dataplane::tidy_connections: one netlink dump and a delete per connection).");
        println!("| routes installed | add one | remove one | retarget one (delete + add) | its cut, after the answer |");
        println!("|---:|---:|---:|---:|---:|");
        for n in [100u32, 10_000] {
            let mut dp = Dataplane::new(NftFirewall::default(), params());
            let base = routes(n);
            dp.replace(base.clone()).unwrap();
            dp.tidy_connections().unwrap();
            let mut time = |change: &dyn Fn(&mut RouteMap, u32)| -> (Duration, Duration) {
                let (applied, tidied): (Vec<Duration>, Vec<Duration>) = (0..21u32)
                    .map(|round| {
                        let mut next = base.clone();
                        change(&mut next, round);
                        let t = Instant::now();
                        dp.converge(next).unwrap();
                        let applied = t.elapsed();
                        let t = Instant::now();
                        dp.tidy_connections().unwrap();
                        let tidied = t.elapsed();
                        dp.converge(base.clone()).unwrap();
                        dp.tidy_connections().unwrap();
                        (applied, tidied)
                    })
                    .unzip();
                (median(applied), median(tidied))
            };
            let (add, _) = time(&|m, round| {
                m.insert(key(n + round), target(round, 0));
            });
            let (remove, _) = time(&|m, round| {
                m.remove(&key(round * 37 % n));
            });
            let (retarget, cut) = time(&|m, round| {
                let i = round * 37 % n;
                m.insert(key(i), target(i, 100));
            });
            println!("| {n} | {} | {} | {} | {} |", ms(add), ms(remove), ms(retarget), ms(cut));
        }
        let tx = Transaction::Replace { params: params(), routes: routes(10_000) };
        let t = Instant::now();
        let doc = tx.to_nft_string();
        println!("\n(Rendering the 10,000-route document alone: {}, {} bytes.)", ms(t.elapsed()), doc.len());
        nft(&["delete", "table", "ip", "rodvr"]);
        at_1000
    })
}

fn bench_naive(ns: &Netns, ours_at_1000: Duration) {
    ns.run(|| {
        println!("\n## Naive: one `nft add rule` process per route (per-cGPU configuration)");
        println!("| routes | total | per route |");
        println!("|---:|---:|---:|");
        nft(&["add", "table", "ip", "naive"]);
        nft(&["add chain ip naive prerouting { type nat hook prerouting priority dstnat; policy accept; }"]);
        for n in [1u32, 100, 1_000] {
            nft(&["flush", "chain", "ip", "naive", "prerouting"]);
            let t = Instant::now();
            for i in 0..n {
                let (k, v) = (key(i), target(i, 0));
                let rule = format!(
                    "add rule ip naive prerouting iifname {} ip saddr {} ip daddr {} tcp dport {} \
                     dnat to {v}",
                    k.tap,
                    k.ip,
                    k.masked.ip(),
                    k.masked.port()
                );
                nft(&[rule.as_str()]);
            }
            let total = t.elapsed();
            println!("| {n} | {} | {} |", ms(total), ms(total / n));
            if n == 1_000 {
                let ratio = total.as_secs_f64() / ours_at_1000.as_secs_f64();
                println!("\nAt 1,000 routes the agent's transaction is {ratio:.0}x faster than the naive way.");
            }
        }
        nft(&["delete", "table", "ip", "naive"]);
    })
}

const BULK_BYTES: u64 = 2 << 30;

/// Sends `BULK_BYTES` from `client` to `server_addr` (reached at `connect_to`); returns Gbit/s.
fn bulk(client: &Netns, server: &Netns, listen: &str, connect_to: &str) -> f64 {
    let listener = server.run(|| TcpListener::bind(listen).unwrap());
    let receiver = std::thread::spawn(move || {
        let (mut conn, _) = listener.accept().unwrap();
        let mut buf = vec![0u8; 1 << 18];
        let mut total = 0u64;
        loop {
            let n = conn.read(&mut buf).unwrap();
            if n == 0 {
                break total;
            }
            total += n as u64;
        }
    });
    let addr: std::net::SocketAddr = connect_to.parse().unwrap();
    let elapsed = client.run(|| {
        let mut conn = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).unwrap();
        let buf = vec![0x5au8; 1 << 18];
        let t = Instant::now();
        let mut sent = 0u64;
        while sent < BULK_BYTES {
            conn.write_all(&buf).unwrap();
            sent += buf.len() as u64;
        }
        conn.shutdown(std::net::Shutdown::Write).unwrap();
        drop(conn);
        t.elapsed()
    });
    let received = receiver.join().unwrap();
    assert_eq!(received, BULK_BYTES);
    received as f64 * 8.0 / elapsed.as_secs_f64() / 1e9
}

fn bench_throughput() {
    let vm = Netns::new("bvm");
    let ch = Netns::new("bch");
    let gh = Netns::new("bgh");
    veth(&vm, "eth0", "10.231.1.2/24", &ch, "tap1", "10.231.1.1/24");
    veth(&gh, "eth0", "10.232.0.2/24", &ch, "gpu0", "10.232.0.1/24");
    vm.ip(&["route", "add", "default", "via", "10.231.1.1"]);
    gh.ip(&["route", "add", "10.231.0.0/16", "via", "10.232.0.1"]);
    ch.enable_forwarding();

    let mut routes = RouteMap::new();
    let masked = SocketAddrV4::new(Ipv4Addr::new(100, 127, 0, 1), 9000);
    routes.insert(
        RouteKey { tap: "tap1".into(), ip: Ipv4Addr::new(10, 231, 1, 2), masked },
        "10.232.0.2:5201".parse().unwrap(),
    );
    // OpenStack compute hosts track connections anyway (security groups); this stands in for that.
    let host_conntrack = |on: bool| {
        ch.run(|| {
            let _ = Command::new("nft").args(["delete", "table", "inet", "hostfw"]).output();
            if on {
                nft(&["add table inet hostfw"]);
                nft(&["add chain inet hostfw sg_forward { type filter hook forward priority 10; policy accept; }"]);
                nft(&["add rule inet hostfw sg_forward ct state established,related accept"]);
            }
        })
    };
    let agent_table = |on: bool| {
        ch.run(|| {
            let _ = Command::new("nft").args(["delete", "table", "ip", "rodvr"]).output();
            let _ = Command::new("nft").args(["delete", "table", "ip6", "rodvr"]).output();
            if on {
                let tx = Transaction::Replace { params: params(), routes: routes.clone() };
                NftFirewall::default().apply(&tx).unwrap();
            }
        })
    };
    // Rounds of one run per path, in a rotating order; each round also gives masked / tracked
    // from runs seconds apart, so the ratio's median shrugs off the load of a shared machine.
    const ROUNDS: usize = 11;
    let (mut raw, mut tracked, mut masked_runs) = (Vec::new(), Vec::new(), Vec::new());
    let mut ratios = Vec::new();
    for round in 0..ROUNDS {
        let mut this = [0.0f64; 3];
        for k in 0..3 {
            let path = (round + k) % 3;
            agent_table(path == 2);
            host_conntrack(path != 0);
            let to = if path == 2 { "100.127.0.1:9000" } else { "10.232.0.2:5201" };
            this[path] = bulk(&vm, &gh, "10.232.0.2:5201", to);
        }
        raw.push(this[0]);
        tracked.push(this[1]);
        masked_runs.push(this[2]);
        ratios.push(this[2] / this[1]);
    }
    agent_table(false);
    host_conntrack(false);
    let best = |v: &[f64]| v.iter().copied().fold(0.0, f64::max);
    let mid = |v: &[f64]| {
        let mut v = v.to_vec();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    println!(
        "\n## TCP bulk throughput, VM -> GPU host, {} GiB per run, {ROUNDS} rounds of the 3 paths in rotating order",
        BULK_BYTES >> 30
    );
    println!("| path | best Gbit/s | median Gbit/s | runs |");
    println!("|---|---:|---:|---|");
    for (path, runs) in [
        ("direct, compute host without conntrack", &raw),
        ("direct, compute host with conntrack (as with security groups)", &tracked),
        ("masked route (route map + DNAT + masquerade, host conntrack on)", &masked_runs),
    ] {
        println!("| {path} | {:.2} | {:.2} | {runs:.2?} |", best(runs), mid(runs));
    }
    let pct = |a: f64, b: f64| 100.0 * a / b;
    println!(
        "\nMasked / direct (tracked): {:.1}% median of the per-round ratios (rounds: {:.1?}); \
         {:.1}% best, {:.1}% median of the runs; (untracked): {:.1}% best, {:.1}% median",
        100.0 * mid(&ratios),
        ratios.iter().map(|r| 100.0 * r).collect::<Vec<_>>(),
        pct(best(&masked_runs), best(&tracked)),
        pct(mid(&masked_runs), mid(&tracked)),
        pct(best(&masked_runs), best(&raw)),
        pct(mid(&masked_runs), mid(&raw)),
    );
}

/// Cutting the connections of re-targeted routes: one `conntrack -D` process per connection
/// (the agent's way at 934189c) against one netlink dump and a delete per match (now), in
/// alternate rounds on one machine. Nothing is tracked: what is left is the cost of the dump.
fn bench_cut(ns: &Netns) {
    ns.run(|| {
        println!("\n## Cutting re-targeted routes' connections, median of 9 alternate rounds");
        println!(
            "| routes re-targeted at once | `conntrack -D` processes (934189c) | netlink (now) |"
        );
        println!("|---:|---:|---:|");
        let mut program = NftFirewall::default().with_conntrack(&["conntrack".to_owned()]);
        let mut netlink = NftFirewall::default();
        for n in [1u32, 10, 50] {
            let cut: Vec<(RouteKey, SocketAddrV4)> =
                (0..n).map(|i| (key(i), target(i, 0))).collect();
            let (mut by_program, mut by_netlink) = (Vec::new(), Vec::new());
            for round in 0..9 {
                let time = |fw: &mut NftFirewall| {
                    let t = Instant::now();
                    fw.cut(&cut).unwrap();
                    t.elapsed()
                };
                if round % 2 == 0 {
                    by_program.push(time(&mut program));
                    by_netlink.push(time(&mut netlink));
                } else {
                    by_netlink.push(time(&mut netlink));
                    by_program.push(time(&mut program));
                }
            }
            println!("| {n} | {} | {} |", ms(median(by_program)), ms(median(by_netlink)));
        }
    })
}

fn main() {
    // `cargo bench` passes `--bench`; other harness flags are ignored, but a word that is no
    // flag picks sections: `cargo bench -p rodvr-agent --bench apply -- cut`.
    require_root_tools();
    let picked: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with('-')).collect();
    let runs = |section: &str| picked.is_empty() || picked.iter().any(|p| p == section);
    let ns = Netns::new("bench");
    if runs("apply") {
        let ours = bench_apply(&ns);
        bench_naive(&ns, ours);
    }
    if runs("cut") {
        bench_cut(&ns);
    }
    drop(ns);
    if runs("throughput") {
        bench_throughput();
    }
}
