//! A throwaway PostgreSQL 15 for tests: one server per test binary, one fresh database per test.
//!
//! The server runs as user `postgres` in a temporary directory on a free loopback port, started
//! through `setpriv --pdeathsig KILL` from a thread that lives as long as the test binary, so it dies
//! with the binary whatever happens (panics, aborts, a killed CI job) and no port is fixed.
//! `GSAAS_TEST_PG_OPTIONS` (`name=value` settings, separated by spaces) adds server settings for
//! a diagnostic run, such as `shared_preload_libraries=pg_stat_statements` for a bench.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

const BIN: &str = "/usr/lib/postgresql/15/bin";

struct Server {
    port: u16,
}

static SERVER: OnceLock<Result<Server, String>> = OnceLock::new();
static NEXT_DB: AtomicU32 = AtomicU32::new(0);

fn run(cmd: &mut Command) -> Result<(), String> {
    let out = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{cmd:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(())
}

fn as_postgres(program: &str) -> Command {
    let mut cmd = Command::new("setpriv");
    cmd.args(["--reuid=postgres", "--regid=postgres", "--init-groups", "--"])
        .arg(format!("{BIN}/{program}"));
    cmd
}

fn remove_stale_dirs() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if let Some(pid) = name.strip_prefix("gsaas-pg-").and_then(|p| p.parse::<u32>().ok()) {
            if !Path::new(&format!("/proc/{pid}")).exists() {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    }
}

fn start() -> Result<Server, String> {
    if !Path::new(BIN).join("postgres").exists() {
        return Err(format!(
            "PostgreSQL 15 is not installed ({BIN}/postgres missing); scripts/test.sh installs it"
        ));
    }
    remove_stale_dirs();
    let dir = std::env::temp_dir().join(format!("gsaas-pg-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    run(Command::new("chown").arg("postgres:postgres").arg(&dir))?;
    let data = dir.join("data");
    run(as_postgres("initdb")
        .args(["-A", "trust", "-U", "postgres", "--no-sync", "-E", "UTF8", "-D"])
        .arg(&data)
        .stdout(Stdio::null()))?;
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| e.to_string())?
        .port();
    let log = std::fs::File::create(dir.join("postgres.log")).map_err(|e| e.to_string())?;
    let data_dir: PathBuf = data;
    let socket_dir = dir.clone();
    let (started, ready) = std::sync::mpsc::channel();
    // The server's parent is this thread, which never ends: pdeathsig fires when the binary exits.
    std::thread::spawn(move || {
        let child = Command::new("setpriv")
            .args([
                "--reuid=postgres",
                "--regid=postgres",
                "--init-groups",
                "--pdeathsig",
                "KILL",
                "--",
            ])
            .arg(format!("{BIN}/postgres"))
            .arg("-D")
            .arg(&data_dir)
            .args(["-p", &port.to_string(), "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off"])
            .args([
                "-c",
                "synchronous_commit=off",
                "-c",
                "full_page_writes=off",
                "-c",
                "max_connections=300",
            ])
            .args(extra_settings().iter().flat_map(|setting| ["-c", setting.as_str()]))
            .arg("-k")
            .arg(&socket_dir)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn();
        let ok = child.is_ok();
        let _ = started.send(child.map(|_| ()).map_err(|e| e.to_string()));
        if ok {
            loop {
                std::thread::park();
            }
        }
    });
    ready.recv().map_err(|e| e.to_string())??;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let ready = Command::new(format!("{BIN}/pg_isready"))
            .args(["-h", "127.0.0.1", "-p", &port.to_string(), "-U", "postgres"])
            .stdout(Stdio::null())
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        if ready {
            return Ok(Server { port });
        }
        if Instant::now() > deadline {
            let log = std::fs::read_to_string(dir.join("postgres.log")).unwrap_or_default();
            return Err(format!("PostgreSQL did not start within 30 s: {log}"));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The settings `GSAAS_TEST_PG_OPTIONS` adds to the server's.
fn extra_settings() -> Vec<String> {
    std::env::var("GSAAS_TEST_PG_OPTIONS")
        .unwrap_or_default()
        .split_whitespace()
        .map(str::to_owned)
        .collect()
}

/// A URL to a new, empty database on the shared test server.
pub fn fresh_database() -> String {
    let server = SERVER.get_or_init(start).as_ref().unwrap_or_else(|e| panic!("{e}"));
    let name = format!("t{}_{}", std::process::id(), NEXT_DB.fetch_add(1, Ordering::Relaxed));
    let url = |database: &str| format!("postgres://postgres@127.0.0.1:{}/{database}", server.port);
    query(&url("postgres"), &format!("CREATE DATABASE {name}"));
    url(&name)
}

/// The rows `sql` returns on the database at `url` (one [`fresh_database`] gave), each its
/// columns joined by `|`: for tests that look under a running gsaasd.
pub fn query(url: &str, sql: &str) -> Vec<String> {
    let out = Command::new(format!("{BIN}/psql"))
        .args(["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-d", url, "-c", sql])
        .output()
        .expect("psql runs");
    assert!(out.status.success(), "{sql}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).lines().map(str::to_owned).collect()
}
