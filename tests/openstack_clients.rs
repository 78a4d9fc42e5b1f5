//! OpenStack's own ways in to GSaaS, against the real cloud of `scripts/openstack-dev.sh` (where
//! `scripts/openstack-dev/provision.py` registers gsaasd in the catalog as `gpu-scheduling`): the
//! `gsaas` CLI finding gsaasd in the Keystone catalog from `OS_CLOUD` alone.
//!
//! Each test serves its gsaasd (Keystone mode, the Nova backend) where the catalog says gsaasd is,
//! holding the catalog's address for itself (`CatalogLease`: one such test at a time, in every
//! test binary).

mod support;

use std::path::Path;
use std::process::{Command, Output};

use gsaas_test_support::openstack::{clouds_yaml, dev_cloud_setting, Gsaasd, Login, FLAVOR, IMAGE};
use serde_json::Value;

/// Runs `gsaas ARGS` with a clean environment: only `env`, the dev cloud's clouds.yaml and an
/// empty home (no config file), so only the catalog can say where gsaasd is.
fn gsaas(home: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    std::fs::create_dir_all(home).unwrap();
    Command::new(support::gsaas_binary())
        .args(args)
        .env_clear()
        .env("HOME", home)
        .env("OS_CLIENT_CONFIG_FILE", clouds_yaml())
        .envs(env.iter().copied())
        .output()
        .expect("gsaas runs")
}

fn json_of(output: &Output) -> Value {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "gsaas failed: {stderr}");
    serde_json::from_slice(&output.stdout).unwrap_or_else(|e| panic!("{e}: {stderr}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gsaas_finds_gsaasd_in_the_keystone_catalog() {
    let _gsaasd = Gsaasd::start_in_catalog(2, |_| {}).await;
    let home = std::env::temp_dir().join(format!("gsaas-catalog-{}", std::process::id()));
    let alpha = [("OS_CLOUD", "alpha")];
    let run = |args: Vec<&str>, env: &[(&str, &str)]| {
        let home = home.clone();
        let args: Vec<String> = args.into_iter().map(str::to_owned).collect();
        let env: Vec<(String, String)> =
            env.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        tokio::task::spawn_blocking(move || {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let env: Vec<(&str, &str)> =
                env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            gsaas(&home, &args, &env)
        })
    };

    // OS_CLOUD alone: the public endpoint; a VM launched and terminated through it.
    let listed = json_of(&run(vec!["-f", "json", "list"], &alpha).await.unwrap());
    assert_eq!(listed["vms"], serde_json::json!([]), "{listed}");
    let launch = vec![
        "-f", "json", "launch", "--ncgpus", "1", "--image", IMAGE, "--flavor", FLAVOR, "--wait",
    ];
    let vm = json_of(&run(launch, &alpha).await.unwrap());
    assert_eq!(vm["state"], "ready", "{vm}");
    let id = vm["id"].as_str().unwrap().to_owned();
    // The internal endpoint, and a token given as is (OS_TOKEN, its catalog asked of Keystone).
    let internal = vec!["-f", "json", "--os-interface", "internal", "list"];
    let listed = json_of(&run(internal, &alpha).await.unwrap());
    assert_eq!(listed["vms"][0]["id"], id.as_str(), "{listed}");
    let login = Login::new(&reqwest::Client::new(), "alpha").await;
    let keystone = dev_cloud_setting("KEYSTONE_URL");
    let token = [("OS_TOKEN", login.token.as_str()), ("OS_AUTH_URL", keystone.as_str())];
    let listed = json_of(&run(vec!["-f", "json", "list"], &token).await.unwrap());
    assert_eq!(listed["vms"][0]["id"], id.as_str(), "{listed}");

    // A region the catalog does not have: said plainly, with what it has.
    let nowhere = run(vec!["--os-region-name", "Atlantis", "list"], &alpha).await.unwrap();
    let stderr = String::from_utf8_lossy(&nowhere.stderr);
    assert_eq!(nowhere.status.code(), Some(2), "{stderr}");
    for says in ["no public endpoint in region Atlantis", "public in RegionOne", "--url"] {
        assert!(stderr.contains(says), "{says:?} not in {stderr}");
    }

    let ended = run(vec!["-f", "json", "terminate", &id, "--wait"], &alpha).await.unwrap();
    assert_eq!(json_of(&ended)["state"], "deleted");
    let _ = std::fs::remove_dir_all(home);
}
