//! Network namespaces for kernel tests: created with `ip`, deleted by a drop guard, entered by
//! threads (a thread's sockets stay in the namespace it was in when they were created).
//!
//! Shared by rodvr-agent's tests and benches and by the workspace's end-to-end and chaos tests. Programs that must see namespaces created after they start (gsaasd's
//! simulated cloud adds the VMs' namespaces) enter theirs with [`Netns::command`] (`nsenter
//! --net=`): `ip netns exec`, as [`Netns::exec`] uses, also gives the program a private mount
//! namespace in which later `/run/netns` mounts are invisible.

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use nix::sched::{setns, CloneFlags};

/// Panics with a clear message unless this runs as root with `ip`, `nft`, `nsenter` and
/// `conntrack`.
pub fn require_root_tools() {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let uid = status
        .lines()
        .find(|l| l.starts_with("Uid:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .unwrap_or("");
    assert_eq!(uid, "0", "this test builds network namespaces and must run as root (CI does)");
    for (tool, arg, package) in [
        ("ip", "-V", "iproute2"),
        ("nft", "--version", "nftables"),
        ("nsenter", "-V", "util-linux"),
        ("conntrack", "--version", "conntrack"),
    ] {
        let ok = Command::new(tool).arg(arg).output().is_ok_and(|o| o.status.success());
        assert!(ok, "`{tool}` is missing: apt-get install -y {package} (scripts/test.sh does)");
    }
}

fn check(what: &str, out: std::io::Result<Output>) -> Output {
    let out = out.unwrap_or_else(|e| panic!("{what}: cannot run: {e}"));
    assert!(
        out.status.success(),
        "{what} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Runs `ip ARGS` and panics on failure.
pub fn ip(args: &[&str]) -> Output {
    check(&format!("ip {}", args.join(" ")), Command::new("ip").args(args).output())
}

/// The namespaces that exist (`ip netns list`), by name.
pub fn namespaces() -> Vec<String> {
    let out = ip(&["netns", "list"]);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .collect()
}

/// The prefix of every namespace this process creates (or has a program it runs create).
pub fn run_prefix() -> String {
    format!("gsaas-test-{}-", std::process::id())
}

static NEXT: AtomicU32 = AtomicU32::new(0);

/// A network namespace that is deleted (with its interfaces) when dropped.
#[derive(Debug)]
pub struct Netns {
    pub name: String,
}

impl Netns {
    /// `<run prefix><counter>-<tag>`, with `lo` up.
    pub fn new(tag: &str) -> Self {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let name = format!("{}{n}-{tag}", run_prefix());
        ip(&["netns", "add", &name]);
        let ns = Self { name };
        ns.ip(&["link", "set", "lo", "up"]);
        ns
    }

    pub fn path(&self) -> PathBuf {
        Path::new("/run/netns").join(&self.name)
    }

    /// `ip -n NS ARGS`.
    pub fn ip(&self, args: &[&str]) -> Output {
        let mut full = vec!["-n", self.name.as_str()];
        full.extend_from_slice(args);
        ip(&full)
    }

    /// Runs a command inside the namespace (`ip netns exec`) and panics on failure.
    pub fn exec(&self, args: &[&str]) -> Output {
        let mut full = vec!["netns", "exec", self.name.as_str()];
        full.extend_from_slice(args);
        ip(&full)
    }

    /// The command prefix that runs a program inside the namespace (`ip netns exec`).
    pub fn command_prefix(&self) -> Vec<String> {
        ["ip", "netns", "exec", self.name.as_str()].map(String::from).to_vec()
    }

    /// A command that runs `program` inside the namespace, network only (see the module docs).
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut command = Command::new("nsenter");
        command.arg(format!("--net={}", self.path().display())).arg("--").arg(program);
        command
    }

    /// Routes between the namespace's interfaces (written from inside it: `/proc/sys/net` is per
    /// network namespace, and this needs no `sysctl` program).
    pub fn enable_forwarding(&self) {
        self.sysctl("net/ipv4/ip_forward", "1");
        self.sysctl("net/ipv6/conf/all/forwarding", "1");
    }

    /// Writes `value` to `/proc/sys/<key>` inside the namespace.
    pub fn sysctl(&self, key: &str, value: &str) {
        let path = format!("/proc/sys/{key}");
        self.run(|| std::fs::write(&path, value))
            .unwrap_or_else(|e| panic!("write {path} in {}: {e}", self.name));
    }

    /// Adds an IPv6 address to `interface`, usable at once (no duplicate address detection).
    pub fn addr6(&self, interface: &str, cidr: &str) {
        self.ip(&["-6", "addr", "add", cidr, "dev", interface, "nodad"]);
    }

    /// Waits (at most 10 s) until no IPv6 address here is tentative: until its interfaces'
    /// link-local addresses pass duplicate address detection, neighbour discovery (and so IPv6
    /// traffic through this namespace) can stall for a second.
    pub fn wait_ipv6_ready(&self) {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let out = self.ip(&["-6", "addr", "show", "tentative"]);
            if out.stdout.is_empty() {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{}: addresses stay tentative",
                self.name
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Runs `f` on a thread that has entered the namespace.
    pub fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        enter_and_run(&self.name, f)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.name]).output();
    }
}

/// Runs `f` on a thread that has entered the namespace `name` (one this test may not own, such as
/// a VM's).
pub fn enter_and_run<T: Send>(name: &str, f: impl FnOnce() -> T + Send) -> T {
    let path = Path::new("/run/netns").join(name);
    std::thread::scope(|s| {
        s.spawn(|| {
            let file = File::open(&path).unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
            setns(&file, CloneFlags::CLONE_NEWNET)
                .unwrap_or_else(|e| panic!("setns {}: {e}", path.display()));
            f()
        })
        .join()
        .unwrap_or_else(|p| std::panic::resume_unwind(p))
    })
}

/// A veth pair `a_if` (in `a`, `a_cidr`) <-> `b_if` (in `b`, `b_cidr`), both up; an empty cidr
/// leaves that end without an address.
pub fn veth(a: &Netns, a_if: &str, a_cidr: &str, b: &Netns, b_if: &str, b_cidr: &str) {
    a.ip(&["link", "add", a_if, "type", "veth", "peer", "name", b_if, "netns", &b.name]);
    for (ns, interface, cidr) in [(a, a_if, a_cidr), (b, b_if, b_cidr)] {
        if !cidr.is_empty() {
            ns.ip(&["addr", "add", cidr, "dev", interface]);
        }
        ns.ip(&["link", "set", interface, "up"]);
    }
}

/// What a stand-in rCUDA server does with a connection: greets it with `"{name} {peer ip}\n"` (so
/// the client learns which server it reached, and from which address the server saw it), then
/// echoes what it receives until the client closes (so an open connection can be probed).
pub fn greet_and_echo(mut conn: TcpStream, name: &str) {
    let peer = conn.peer_addr().map(|a| a.ip().to_string()).unwrap_or_default();
    let _ = writeln!(conn, "{name} {peer}");
    let mut buf = [0u8; 512];
    while let Ok(n @ 1..) = conn.read(&mut buf) {
        if conn.write_all(&buf[..n]).is_err() {
            break;
        }
    }
}

/// Connects from the namespace `ns` to `addr`: the open connection and the server's greeting, or
/// `None` if no connection could be made and greeted within a second or two.
pub fn connect(ns: &str, addr: &str) -> Option<(BufReader<TcpStream>, String)> {
    let addr: SocketAddr = addr.parse().unwrap_or_else(|e| panic!("address {addr:?}: {e}"));
    enter_and_run(ns, || {
        let conn = TcpStream::connect_timeout(&addr, Duration::from_secs(1)).ok()?;
        conn.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
        let mut conn = BufReader::new(conn);
        let mut line = String::new();
        conn.read_line(&mut line).ok().filter(|n| *n > 0)?;
        Some((conn, line.trim().to_owned()))
    })
}

/// Whether `conn` still carries data both ways (an echo comes back within 2 s).
pub fn still_open(conn: &mut BufReader<TcpStream>) -> bool {
    if conn.get_mut().write_all(b"ping\n").is_err() {
        return false;
    }
    let mut line = String::new();
    matches!(conn.read_line(&mut line), Ok(n) if n > 0) && line == "ping\n"
}
