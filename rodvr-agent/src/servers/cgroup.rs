//! Each server's cgroup: the agent finds every process of a server through it (a server's
//! children included, whatever they do), ends them all at once (`cgroup.kill`), and limits them
//! (`pids.max`, host `memory.max`, `cpu.weight`).
//!
//! The cgroup is always one of the unified (v2) hierarchy, which every current kernel mounts:
//! membership and `cgroup.kill` need nothing else. A limit is set there when the hierarchy has its
//! controller; on a hybrid host (systemd's older layout: the controllers bound to v1
//! hierarchies, the unified one mounted without them) the server also gets a cgroup of the same
//! name in each v1 hierarchy that has the controller, and the limit is set there. A host with
//! neither cannot limit that resource: the agent refuses to start rather than run servers
//! unlimited.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The resources a server is limited in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resource {
    Pids,
    Memory,
    Cpu,
}

impl Resource {
    const ALL: [Resource; 3] = [Resource::Pids, Resource::Memory, Resource::Cpu];

    fn name(self) -> &'static str {
        match self {
            Resource::Pids => "pids",
            Resource::Memory => "memory",
            Resource::Cpu => "cpu",
        }
    }
}

/// A server's limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub pids_max: u32,
    pub memory_max_bytes: u64,
    /// 1-10000, 100 the default weight.
    pub cpu_weight: u32,
}

impl Limits {
    /// The file and value that set `resource` in a v2 cgroup.
    fn v2(&self, resource: Resource) -> Vec<(&'static str, String)> {
        match resource {
            Resource::Pids => vec![("pids.max", self.pids_max.to_string())],
            Resource::Memory => vec![
                ("memory.max", self.memory_max_bytes.to_string()),
                ("memory.swap.max", "0".into()),
            ],
            Resource::Cpu => vec![("cpu.weight", self.cpu_weight.to_string())],
        }
    }

    /// The same in a v1 cgroup (`cpu.shares`: 1024 for the default weight).
    fn v1(&self, resource: Resource) -> Vec<(&'static str, String)> {
        match resource {
            Resource::Pids => vec![("pids.max", self.pids_max.to_string())],
            Resource::Memory => vec![("memory.limit_in_bytes", self.memory_max_bytes.to_string())],
            Resource::Cpu => {
                let shares = (u64::from(self.cpu_weight) * 1024 / 100).max(2);
                vec![("cpu.shares", shares.to_string())]
            }
        }
    }
}

/// Where the servers' cgroups live on this host.
#[derive(Debug, Clone)]
pub struct Cgroups {
    /// The parent of every server's v2 cgroup.
    parent: PathBuf,
    /// The resources limited in the v2 cgroups.
    v2_limits: Vec<Resource>,
    /// The others: the parent of the servers' cgroups in the v1 hierarchy that has each.
    v1_limits: Vec<(Resource, PathBuf)>,
}

/// One server's cgroup (and its v1 twins).
#[derive(Debug, Clone)]
pub struct ServerCgroup {
    v2: PathBuf,
    v1: Vec<(Resource, PathBuf)>,
}

/// The mount points of the v1 hierarchies, by the controller each has.
type V1Mounts = Vec<(Resource, PathBuf)>;

/// What the mount table says: the unified hierarchy's mount point, and the v1 hierarchies by
/// controller.
fn mounts() -> io::Result<(Option<PathBuf>, V1Mounts)> {
    let table = fs::read_to_string("/proc/self/mountinfo")?;
    let (mut unified, mut v1) = (None, Vec::new());
    for line in table.lines() {
        // `ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPER`
        let Some((left, right)) = line.split_once(" - ") else { continue };
        let mount_point = left.split(' ').nth(4).map(unescape);
        let mut fields = right.split(' ');
        let (fstype, super_options) = (fields.next(), fields.nth(1).unwrap_or(""));
        match (fstype, mount_point) {
            (Some("cgroup2"), Some(point)) if unified.is_none() => unified = Some(point),
            (Some("cgroup"), Some(point)) => {
                for resource in Resource::ALL {
                    if super_options.split(',').any(|o| o == resource.name()) {
                        v1.push((resource, point.clone()));
                    }
                }
            }
            _ => {}
        }
    }
    Ok((unified, v1))
}

/// Where the unified (v2) hierarchy is mounted, if it is.
pub fn unified_root() -> Option<PathBuf> {
    mounts().ok()?.0
}

/// A mount point as mountinfo escapes it (`\040` for a space).
fn unescape(field: &str) -> PathBuf {
    let mut out = String::new();
    let mut rest = field;
    while let Some(at) = rest.find('\\') {
        out.push_str(&rest[..at]);
        let code = rest.get(at + 1..at + 4).and_then(|c| u8::from_str_radix(c, 8).ok());
        match code {
            Some(byte) => {
                out.push(char::from(byte));
                rest = &rest[at + 4..];
            }
            None => {
                out.push('\\');
                rest = &rest[at + 1..];
            }
        }
    }
    out.push_str(rest);
    PathBuf::from(out)
}

fn write(path: &Path, value: &str) -> io::Result<()> {
    fs::write(path, value).map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))
}

impl Cgroups {
    /// Finds the hierarchies, creates the servers' parent (`configured`, or `gsaas-servers` at
    /// the root of the unified hierarchy) and enables what it can there. Fails when a resource
    /// can be limited nowhere.
    pub fn prepare(configured: Option<&Path>) -> Result<Self, String> {
        let (unified, v1) = mounts().map_err(|e| format!("cannot read the mount table: {e}"))?;
        let parent = match (configured, &unified) {
            (Some(path), _) => path.to_owned(),
            (None, Some(root)) => root.join("gsaas-servers"),
            (None, None) => {
                return Err("no cgroup v2 hierarchy is mounted: the servers need one".into())
            }
        };
        fs::create_dir_all(&parent).map_err(|e| format!("{}: {e}", parent.display()))?;
        if !parent.join("cgroup.kill").exists() && !parent.join("cgroup.procs").exists() {
            return Err(format!("{} is not a cgroup v2 directory", parent.display()));
        }
        // A controller is usable in the servers' cgroups once enabled in the parent's
        // `cgroup.subtree_control`, which needs it enabled one level up first.
        let available = |dir: &Path| fs::read_to_string(dir.join("cgroup.controllers"));
        let mut v2_limits = Vec::new();
        for resource in Resource::ALL {
            let name = resource.name();
            let mut enabled = false;
            if available(&parent).is_ok_and(|c| c.split_whitespace().any(|n| n == name))
                || parent.parent().is_some_and(|up| {
                    write(&up.join("cgroup.subtree_control"), &format!("+{name}")).is_ok()
                })
            {
                enabled =
                    write(&parent.join("cgroup.subtree_control"), &format!("+{name}")).is_ok();
            }
            if enabled {
                v2_limits.push(resource);
            }
        }
        // The v1 twins are named after the unified parent, so two agents (or tests) with
        // different parents never touch each other's servers.
        let leaf = parent.file_name().map_or("gsaas-servers".into(), |n| n.to_os_string());
        let mut v1_limits = Vec::new();
        for resource in Resource::ALL.into_iter().filter(|r| !v2_limits.contains(r)) {
            let Some((_, mount)) = v1.iter().find(|(r, _)| *r == resource) else {
                return Err(format!(
                    "cannot limit the servers' {}: neither the unified cgroup hierarchy nor a v1 \
                     one has the controller",
                    resource.name()
                ));
            };
            let dir = mount.join(&leaf);
            fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            v1_limits.push((resource, dir));
        }
        Ok(Self { parent, v2_limits, v1_limits })
    }

    /// Creates `name`'s cgroups with `limits` (an existing one is reused: the limits are set
    /// again).
    pub fn create(&self, name: &str, limits: Limits) -> io::Result<ServerCgroup> {
        let group = self.open(name);
        fs::create_dir_all(&group.v2)?;
        for resource in &self.v2_limits {
            for (file, value) in limits.v2(*resource) {
                // `memory.swap.max` is absent without swap accounting: nothing to limit there.
                if file == "memory.swap.max" && !group.v2.join(file).exists() {
                    continue;
                }
                write(&group.v2.join(file), &value)?;
            }
        }
        for (resource, dir) in &group.v1 {
            fs::create_dir_all(dir)?;
            for (file, value) in limits.v1(*resource) {
                write(&dir.join(file), &value)?;
            }
        }
        Ok(group)
    }

    /// `name`'s cgroups, whether or not they exist.
    pub fn open(&self, name: &str) -> ServerCgroup {
        ServerCgroup {
            v2: self.parent.join(name),
            v1: self.v1_limits.iter().map(|(r, dir)| (*r, dir.join(name))).collect(),
        }
    }

    /// The names of the servers' cgroups that exist now (in the unified hierarchy, or only in a
    /// v1 one after a crash between the two).
    pub fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = std::iter::once(&self.parent)
            .chain(self.v1_limits.iter().map(|(_, dir)| dir))
            .filter_map(|dir| fs::read_dir(dir).ok())
            .flatten()
            .flatten()
            .filter(|entry| entry.file_type().is_ok_and(|t| t.is_dir()))
            .filter_map(|entry| entry.file_name().into_string().ok())
            .collect();
        names.sort_unstable();
        names.dedup();
        names
    }
}

impl ServerCgroup {
    /// Sets its CPU weight (`cpu.weight`, or `cpu.shares` where the cpu controller is a v1
    /// one), as `limits` says it.
    pub fn set_cpu_weight(&self, limits: Limits) -> io::Result<()> {
        if let Some((_, dir)) = self.v1.iter().find(|(r, _)| *r == Resource::Cpu) {
            for (file, value) in limits.v1(Resource::Cpu) {
                write(&dir.join(file), &value)?;
            }
            return Ok(());
        }
        let file = self.v2.join("cpu.weight");
        if file.exists() {
            for (file, value) in limits.v2(Resource::Cpu) {
                write(&self.v2.join(file), &value)?;
            }
        }
        Ok(())
    }

    /// The `cgroup.procs` files a process writes itself into to join every one of them.
    pub fn procs_files(&self) -> Vec<PathBuf> {
        std::iter::once(&self.v2)
            .chain(self.v1.iter().map(|(_, dir)| dir))
            .map(|dir| dir.join("cgroup.procs"))
            .collect()
    }

    /// The processes in it now.
    pub fn pids(&self) -> Vec<u32> {
        fs::read_to_string(self.v2.join("cgroup.procs"))
            .map(|text| text.lines().filter_map(|l| l.trim().parse().ok()).collect())
            .unwrap_or_default()
    }

    /// Whether any process is in it.
    pub fn populated(&self) -> bool {
        match fs::read_to_string(self.v2.join("cgroup.events")) {
            Ok(events) => events.lines().any(|l| l.trim() == "populated 1"),
            Err(_) => !self.pids().is_empty(),
        }
    }

    /// Kills every process in it (children, and children that left their parent, too), waits
    /// up to `wait` for them to be gone, and removes the cgroups. `Err` names what is left.
    pub fn kill_and_remove(&self, wait: Duration) -> Result<(), String> {
        let deadline = Instant::now() + wait;
        while self.v2.exists() {
            if !self.populated() {
                break;
            }
            if write(&self.v2.join("cgroup.kill"), "1").is_err() {
                // A kernel before 5.14: signal each process instead (a fork between the read and
                // the signals is caught on the next round).
                for pid in self.pids() {
                    let _ = std::process::Command::new("kill")
                        .args(["-KILL", &pid.to_string()])
                        .status();
                }
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "{} still holds processes {:?}",
                    self.v2.display(),
                    self.pids()
                ));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        for dir in self.v1.iter().map(|(_, dir)| dir).chain(std::iter::once(&self.v2)) {
            if dir.exists() {
                fs::remove_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_points_are_unescaped() {
        assert_eq!(unescape("/sys/fs/cgroup"), PathBuf::from("/sys/fs/cgroup"));
        assert_eq!(unescape("/a\\040b"), PathBuf::from("/a b"));
        assert_eq!(unescape("/odd\\x"), PathBuf::from("/odd\\x"));
    }

    #[test]
    fn limits_say_the_same_in_both_hierarchies() {
        let limits = Limits { pids_max: 64, memory_max_bytes: 1 << 30, cpu_weight: 50 };
        assert_eq!(limits.v2(Resource::Cpu), [("cpu.weight", "50".to_owned())]);
        assert_eq!(limits.v1(Resource::Cpu), [("cpu.shares", "512".to_owned())]);
        assert_eq!(limits.v1(Resource::Memory)[0].1, (1u64 << 30).to_string());
        let least = Limits { cpu_weight: 1, ..limits };
        assert_eq!(least.v1(Resource::Cpu), [("cpu.shares", "10".to_owned())]);
    }
}
