//! What tests of the servers an agent runs per cGPU (`[gpu_servers] managed`) share: a cgroup
//! parent of their own under the unified hierarchy, the stand-in server, and the end of every
//! server a test left (servers outlive their agent on purpose, so a killed agent leaves them).

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// A test's parent cgroup for its servers (and the v1 twins of a hybrid host). Dropped, it kills
/// every process left in it and removes the cgroups.
#[derive(Debug)]
pub struct ServerCgroups {
    pub path: PathBuf,
}

impl ServerCgroups {
    /// `gsaas-test-<tag>-<pid>` at the root of the unified hierarchy.
    pub fn new(tag: &str) -> Self {
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let unified = mountinfo
            .lines()
            .find_map(|l| {
                let (left, right) = l.split_once(" - ")?;
                right.starts_with("cgroup2 ").then(|| left.split(' ').nth(4).map(PathBuf::from))?
            })
            .expect("a cgroup v2 hierarchy is mounted");
        Self { path: unified.join(format!("gsaas-test-{tag}-{}", std::process::id())) }
    }

    /// Each server's cgroup name and the host PIDs of its processes.
    pub fn servers(&self) -> BTreeMap<String, Vec<u32>> {
        let Ok(children) = std::fs::read_dir(&self.path) else { return BTreeMap::new() };
        children
            .flatten()
            .filter(|c| c.path().is_dir())
            .map(|c| {
                let procs =
                    std::fs::read_to_string(c.path().join("cgroup.procs")).unwrap_or_default();
                let pids = procs.lines().filter_map(|l| l.parse().ok()).collect();
                (c.file_name().to_string_lossy().into_owned(), pids)
            })
            .collect()
    }

    /// The v1 cgroups named after it (on a hybrid host).
    pub fn v1_twins(&self) -> Vec<PathBuf> {
        let leaf = self.path.file_name().map(|n| n.to_os_string()).unwrap_or_default();
        ["pids", "memory", "cpu"]
            .iter()
            .map(|c| Path::new("/sys/fs/cgroup").join(c).join(&leaf))
            .filter(|p| p.exists())
            .collect()
    }
}

impl Drop for ServerCgroups {
    fn drop(&mut self) {
        for dir in std::iter::once(self.path.clone()).chain(self.v1_twins()) {
            if let Ok(children) = std::fs::read_dir(&dir) {
                for child in children.flatten().filter(|c| c.path().is_dir()) {
                    let _ = std::fs::write(child.path().join("cgroup.kill"), "1");
                    for _ in 0..200 {
                        if std::fs::remove_dir(child.path()).is_ok() {
                            break;
                        }
                        std::thread::sleep(Duration::from_millis(10));
                    }
                }
            }
            let _ = std::fs::remove_dir(&dir);
        }
    }
}

/// Copies the stand-in server (`rodvr-agent/tests/standin_server.py`) into `dir`, readable by
/// the unprivileged user the servers run as (`dir` becomes 0711: traversable, not listable).
pub fn standin_server(dir: &Path) -> PathBuf {
    let standin = dir.join("standin");
    std::fs::create_dir_all(&standin).expect("the stand-in's directory");
    let script = standin.join("standin_server.py");
    let source =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../rodvr-agent/tests/standin_server.py");
    std::fs::copy(&source, &script).expect("copy the stand-in server");
    for (path, mode) in [(dir, 0o711), (standin.as_path(), 0o755), (script.as_path(), 0o644)] {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
            .expect("open the stand-in to its user");
    }
    script
}

/// The memory interposer and the stand-in driver (`gpu-share/`), built (`make`, once per test
/// process) and copied into `dir/gpu-share` for the servers' user: (the interposer, the directory
/// that holds the stand-in `libcuda.so.1`).
pub fn share_libraries(dir: &Path) -> (PathBuf, PathBuf) {
    static BUILT: std::sync::Once = std::sync::Once::new();
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("../gpu-share");
    BUILT.call_once(|| {
        let made = std::process::Command::new("make")
            .arg("-s")
            .arg("-C")
            .arg(&source)
            .status()
            .expect("make (build-essential) runs");
        assert!(made.success(), "gpu-share/ does not build");
    });
    let libs = dir.join("gpu-share");
    std::fs::create_dir_all(&libs).expect("the libraries' directory");
    let interposer = libs.join("libgsaas-share.so");
    std::fs::copy(source.join("build/libgsaas-share.so"), &interposer).expect("the interposer");
    std::fs::copy(source.join("build/standin/libcuda.so.1"), libs.join("libcuda.so.1"))
        .expect("the stand-in driver");
    for (path, mode) in [(dir, 0o711), (libs.as_path(), 0o755)] {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
            .expect("open the libraries to the servers' user");
    }
    for lib in ["libgsaas-share.so", "libcuda.so.1"] {
        std::fs::set_permissions(libs.join(lib), std::fs::Permissions::from_mode(0o755))
            .expect("open the libraries to the servers' user");
    }
    (interposer, libs)
}
