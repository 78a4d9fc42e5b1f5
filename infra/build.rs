//! The commit the daemons are built from, for `--version`: `GSAAS_BUILD_COMMIT` when set (a build
//! outside git, such as from a source archive), else `git rev-parse` of this checkout, else
//! `unknown`. Cargo reruns this when the checked-out commit changes.
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

fn main() {
    println!("cargo:rerun-if-env-changed=GSAAS_BUILD_COMMIT");
    let commit = match std::env::var("GSAAS_BUILD_COMMIT") {
        Ok(commit) if !commit.trim().is_empty() => commit.trim().to_owned(),
        _ => {
            // HEAD, and the branch it names, change with each commit or checkout.
            for path in
                ["HEAD"].into_iter().map(str::to_owned).chain(git(&["symbolic-ref", "-q", "HEAD"]))
            {
                if let Some(file) = git(&["rev-parse", "--git-path", &path]) {
                    println!("cargo:rerun-if-changed={file}");
                }
            }
            git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".to_owned())
        }
    };
    println!("cargo:rustc-env=GSAAS_BUILD_COMMIT={commit}");
}
