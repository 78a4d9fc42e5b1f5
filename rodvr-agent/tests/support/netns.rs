//! Network namespaces for kernel tests: created with `ip`, deleted by a drop guard, entered by
//! threads (a thread's sockets stay in the namespace it was in when they were created).

use std::fs::File;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};

use nix::sched::{setns, CloneFlags};

/// Panics with a clear message unless this runs as root with `ip` and `nft` available.
pub fn require_root_tools() {
    let uid = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(1).unwrap_or("").to_owned())
        })
        .unwrap_or_default();
    assert_eq!(uid, "0", "this test builds network namespaces and must run as root (CI does)");
    for tool in [["ip", "-V"], ["nft", "--version"]] {
        let ok = Command::new(tool[0]).arg(tool[1]).output().is_ok_and(|o| o.status.success());
        assert!(ok, "`{}` is missing: apt-get install -y nftables iproute2", tool[0]);
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

static NEXT: AtomicU32 = AtomicU32::new(0);

/// A network namespace that is deleted (with its interfaces) when dropped.
#[derive(Debug)]
pub struct Netns {
    pub name: String,
}

impl Netns {
    /// A new namespace named after the process id, a counter and `tag`, with `lo` up.
    pub fn new(tag: &str) -> Self {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let name = format!("rodvr-{}-{n}-{tag}", std::process::id());
        ip(&["netns", "add", &name]);
        let ns = Self { name };
        ns.ip(&["link", "set", "lo", "up"]);
        ns
    }

    /// `ip -n NS ARGS`.
    pub fn ip(&self, args: &[&str]) -> Output {
        let mut full = vec!["-n", self.name.as_str()];
        full.extend_from_slice(args);
        ip(&full)
    }

    /// Runs a command inside the namespace and panics on failure.
    pub fn exec(&self, args: &[&str]) -> Output {
        let mut full = vec!["netns", "exec", self.name.as_str()];
        full.extend_from_slice(args);
        ip(&full)
    }

    /// The command prefix that runs a program inside the namespace.
    pub fn command_prefix(&self) -> Vec<String> {
        ["ip", "netns", "exec", self.name.as_str()].map(String::from).to_vec()
    }

    /// Runs `f` on a thread that has entered the namespace.
    pub fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        let path = format!("/run/netns/{}", self.name);
        std::thread::scope(|s| {
            s.spawn(|| {
                let file = File::open(&path).unwrap_or_else(|e| panic!("open {path}: {e}"));
                setns(&file, CloneFlags::CLONE_NEWNET)
                    .unwrap_or_else(|e| panic!("setns {path}: {e}"));
                f()
            })
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p))
        })
    }

    pub fn enable_forwarding(&self) {
        self.exec(&["sysctl", "-qw", "net.ipv4.ip_forward=1"]);
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.name]).output();
    }
}

/// A veth pair `a_if` (in `a`, `a_cidr`) <-> `b_if` (in `b`, `b_cidr`), both up.
pub fn veth(a: &Netns, a_if: &str, a_cidr: &str, b: &Netns, b_if: &str, b_cidr: &str) {
    a.ip(&["link", "add", a_if, "type", "veth", "peer", "name", b_if, "netns", &b.name]);
    a.ip(&["addr", "add", a_cidr, "dev", a_if]);
    b.ip(&["addr", "add", b_cidr, "dev", b_if]);
    a.ip(&["link", "set", a_if, "up"]);
    b.ip(&["link", "set", b_if, "up"]);
}
