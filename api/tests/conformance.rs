//! The API conforms to its checked-in OpenAPI document, as schemathesis (PyPI) sees it: every
//! check but `use_after_free` (see below) and every phase (examples, coverage, fuzzing, stateful) against a live gsaasd, once
//! with a member's token and once with an admin's, at least 1,000 cases each. Any failure fails
//! the test, with schemathesis's report (each failure with its `curl` to reproduce it).
//!
//! schemathesis runs from its own virtual environment, created on first use from the pinned
//! `conformance/requirements.txt` in `$GSAAS_SCHEMATHESIS_HOME` (default
//! `/var/tmp/gsaas-schemathesis`); it needs Debian's `python3-venv` (scripts/test.sh installs
//! it). Without Python the test fails, it does not skip. `GSAAS_SCHEMATHESIS_SEED` picks another
//! seed than the fixed one.

use crate::{on_both_stores, support};

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use gsaasd::auth::Role;
use support::{Store, TestService};

/// Cases per operation and phase; with 27 operations this is several thousand in all.
const MAX_EXAMPLES: &str = "60";
const MIN_CASES: u64 = 1_000;
const DEFAULT_SEED: &str = "20261125";
const INSTALL: Duration = Duration::from_secs(600);
const RUN: Duration = Duration::from_secs(600);

fn here() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/conformance")
}

fn home() -> PathBuf {
    std::env::var_os("GSAAS_SCHEMATHESIS_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/tmp/gsaas-schemathesis"))
}

/// Runs `program` in a scratch directory (schemathesis keeps a cache where it runs).
async fn run(program: &Path, args: &[&str], limit: Duration) -> std::process::Output {
    let scratch = home().join("scratch");
    std::fs::create_dir_all(&scratch).unwrap();
    let child = tokio::process::Command::new(program)
        .args(args)
        .current_dir(&scratch)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("{} does not run: {e}", program.display()));
    tokio::time::timeout(limit, child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("{} took more than {limit:?}", program.display()))
        .unwrap()
}

fn must_succeed(what: &str, output: &std::process::Output) {
    assert!(
        output.status.success(),
        "{what} failed ({}):\n{}{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// The venv's `schemathesis`, installed once per run (the tests of both stores share it).
async fn schemathesis() -> PathBuf {
    static INSTALLED: tokio::sync::OnceCell<PathBuf> = tokio::sync::OnceCell::const_new();
    INSTALLED.get_or_init(install_schemathesis).await.clone()
}

/// Installs schemathesis from the pinned requirements, unless they are installed already.
async fn install_schemathesis() -> PathBuf {
    let requirements = std::fs::read_to_string(here().join("requirements.txt")).unwrap();
    let venv = home().join("venv");
    let stamp = venv.join("gsaas-requirements.txt");
    let bin = venv.join("bin/schemathesis");
    if bin.exists() && std::fs::read_to_string(&stamp).ok().as_deref() == Some(&requirements) {
        return bin;
    }
    let _ = std::fs::remove_dir_all(&venv);
    std::fs::create_dir_all(home()).unwrap();
    let venv_arg = venv.to_str().unwrap();
    let python = Path::new("/usr/bin/python3");
    assert!(python.exists(), "the conformance test needs Debian's python3 and python3-venv");
    let made = run(python, &["-m", "venv", venv_arg], INSTALL).await;
    must_succeed("python3 -m venv (apt-get install -y python3-venv)", &made);
    let requirements_path = here().join("requirements.txt");
    let pip = venv.join("bin/pip");
    let installed = run(
        &pip,
        &[
            "install",
            "-q",
            "--disable-pip-version-check",
            "--no-deps",
            "-r",
            requirements_path.to_str().unwrap(),
        ],
        INSTALL,
    )
    .await;
    must_succeed("pip install schemathesis", &installed);
    std::fs::write(&stamp, &requirements).unwrap();
    bin
}

/// The number of cases schemathesis reports it generated (`N generated, ...`).
fn cases(report: &str) -> u64 {
    report
        .lines()
        .find_map(|line| line.trim().split_once(" generated,").and_then(|(n, _)| n.parse().ok()))
        .unwrap_or_else(|| panic!("schemathesis reported no case count:\n{report}"))
}

async fn conforms(store: Store) {
    let schemathesis = schemathesis().await;
    // The service's own limits as wide as the document's, so that what the schema allows
    // (priorities up to its maximum) is not refused by configuration.
    let t = TestService::start_with(store, |config| {
        config.queue.max_priority = gsaasd::config::MAX_QUEUE_PRIORITY;
    })
    .await;
    let spec = Path::new(env!("CARGO_MANIFEST_DIR")).join("../openapi/gsaas.json");
    let settings = here().join("schemathesis.toml");
    let seed = std::env::var("GSAAS_SCHEMATHESIS_SEED").unwrap_or_else(|_| DEFAULT_SEED.into());
    let base = t.service().url();
    for (who, token) in [("member", t.member()), ("admin", t.token("ops", Role::Admin))] {
        let auth = format!("Authorization: Bearer {token}");
        let output = run(
            &schemathesis,
            &[
                "--config-file",
                settings.to_str().unwrap(),
                "run",
                spec.to_str().unwrap(),
                "--url",
                &base,
                "--header",
                &auth,
                "--checks",
                "all",
                // What a DELETE ends stays readable by design, so a GET after it is 200, not
                // 404: a terminated VM, by its project and admins, in state `deleted` until
                // `gsaasd db purge` removes it (as Nova shows deleted servers); a project's
                // quota, reset to the defaults. (Reached since a launch that names no image or
                // flavor gets the simulated cloud's.) Every other check runs.
                "--exclude-checks",
                "use_after_free",
                "--phases",
                "examples,coverage,fuzzing,stateful",
                "--max-examples",
                MAX_EXAMPLES,
                "--seed",
                &seed,
                "--generation-database",
                "none",
                "--no-color",
            ],
            RUN,
        )
        .await;
        let report = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success(),
            "schemathesis found failures as {who} ({store:?}, seed {seed}):\n{report}{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let n = cases(&report);
        assert!(n >= MIN_CASES, "as {who}, only {n} cases ran (at least {MIN_CASES}):\n{report}");
    }
}

on_both_stores!(conforms);
