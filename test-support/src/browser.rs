//! Real browsers for the web tests: Debian's headless Chromium driven by playwright-core from
//! `api/tests/dashboard/` (its `package.json`; `npm ci` there when it is not installed yet), and
//! the scripts there run with node. Without node 18+ or Chromium the tests fail; they never skip.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;

/// The whole browser run, Chromium's start included.
const BROWSER_RUN: Duration = Duration::from_secs(240);
const NPM_CI: Duration = Duration::from_secs(300);

/// Where a test's screenshots go: `GSAAS_DASHBOARD_SCREENSHOTS` (from the workspace root) to
/// refresh `docs/`, else `<scratch>/screenshots`.
pub fn screenshot_dir(scratch: &Path) -> PathBuf {
    match std::env::var_os("GSAAS_DASHBOARD_SCREENSHOTS") {
        Some(dir) => Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(dir),
        None => scratch.join("screenshots"),
    }
}

/// The browser scripts and their node_modules: `api/tests/dashboard/`.
pub fn script_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../api/tests/dashboard")
}

/// Fails loudly when the browser toolchain is missing; returns the browser's path.
pub fn require_node_and_chromium() -> PathBuf {
    let version =
        std::process::Command::new("node").arg("--version").output().unwrap_or_else(|e| {
            panic!("the dashboard test needs node 18 or later (apt-get install -y nodejs npm): {e}")
        });
    let version = String::from_utf8_lossy(&version.stdout).trim().to_owned();
    let major: u32 = version
        .trim_start_matches('v')
        .split('.')
        .next()
        .and_then(|m| m.parse().ok())
        .unwrap_or_else(|| panic!("cannot read node's version from {version:?}"));
    assert!(
        major >= 18,
        "the dashboard test needs node 18 or later (playwright-core), not {version}"
    );
    let chromium = std::env::var_os("CHROMIUM")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/chromium"));
    assert!(
        chromium.exists(),
        "the dashboard test needs Chromium at {} (apt-get install -y chromium; scripts/test.sh does)",
        chromium.display()
    );
    chromium
}

/// `npm ci` in the script's directory when playwright-core is not there yet.
pub async fn install_playwright_core() {
    let dir = script_dir();
    if dir.join("node_modules/playwright-core/package.json").exists() {
        return;
    }
    let child = tokio::process::Command::new("npm")
        .args(["ci", "--no-audit", "--no-fund"])
        .current_dir(&dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("npm runs (apt-get install -y npm)");
    let output = tokio::time::timeout(NPM_CI, child.wait_with_output())
        .await
        .expect("npm ci finishes in time")
        .unwrap();
    assert!(
        output.status.success(),
        "npm ci in {} failed:\n{}{}",
        dir.display(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Runs a browser script of `api/tests/dashboard/` with `env` (bounded); fails with its output
/// unless it succeeds; returns what its `RESULT` line reports.
pub async fn run_script(script: &str, env: &[(&str, &str)]) -> Value {
    let child = tokio::process::Command::new("node")
        .arg(script_dir().join(script))
        .current_dir(script_dir())
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("node starts");
    let output = tokio::time::timeout(BROWSER_RUN, child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("the browser run took longer than {BROWSER_RUN:?}"))
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the browser run ({script}) failed ({}):\n{stdout}{stderr}",
        output.status
    );
    eprintln!("{stdout}{stderr}");
    stdout
        .lines()
        .find_map(|line| line.strip_prefix("RESULT "))
        .map(|json| serde_json::from_str(json).unwrap())
        .expect("the script reports what it did")
}
