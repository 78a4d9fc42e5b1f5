//! An operator's policy file as an attacker finds it: a stale copy of a rule further down (YAML
//! keeps the last copy, so `"gpu:vm:show": "@"` would open every VM to every tenant), and a file
//! edited while gsaasd runs. A rule written twice is refused with both lines; a running gsaasd
//! reads the file again when it changes and on SIGHUP, and keeps the rules in force while the
//! file has a problem, saying so to admins.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::support::{self, openstack::eventually, Store, TestService};
use gsaasd::auth::Role;
use serde_json::{json, Value};

const STALE_COPY: &str = "\"gpu:vm:show\": \"rule:admin_or_project_member\"\n\
                          \"gpu:vm:delete\": \"rule:context_is_admin\"\n\
                          # an old experiment, forgotten\n\
                          'gpu:vm:show': \"@\"\n";

fn write(path: &std::path::Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

/// `gsaasd policy check` and a start refuse the file, naming both lines of the rule.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rule_written_twice_is_refused_naming_both_lines() {
    let (mut config, dir) = support::test_config(Store::Sqlite);
    let file = dir.join("etc/policy.yaml");
    write(&file, STALE_COPY);
    let out = Command::new(support::gsaasd_binary())
        .args(["policy", "check", "--file"])
        .arg(&file)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "policy check passed a rule written twice: {err}");
    assert!(err.contains("\"gpu:vm:show\" is written twice, on lines 1 and 4"), "{err}");
    config.auth.policy_file = Some(file);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let Err(error) = gsaasd::service::start_on(config, listener).await else {
        panic!("gsaasd started with a rule written twice")
    };
    let error = format!("{}", gsaasd::error::ErrorChain(&error));
    assert!(error.contains("on lines 1 and 4"), "{error}");
    let _ = std::fs::remove_dir_all(dir);
}

async fn policy_task(t: &TestService) -> Value {
    let (status, view) =
        t.post(&t.admin(), "/v1/background-tasks/policy_reload/activate", &json!({})).await;
    assert_eq!(status, 200, "{view}");
    view
}

/// Edited while gsaasd runs: the stale copy changes nothing (another project still gets 404)
/// and admins see why; a valid edit takes effect, by the timer as by an activation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_gsaasd_keeps_its_rules_while_the_file_is_bad_and_takes_good_edits() {
    let (mut config, dir) = support::test_config(Store::Sqlite);
    let file = dir.join("etc/policy.yaml");
    write(&file, "\"gpu:vm:delete\": \"rule:context_is_admin\"\n");
    config.auth.policy_file = Some(file.clone());
    config.auth.policy_reload_secs = 1;
    let t = TestService::start_config(config, dir).await;
    let member = t.member();
    let beta = t.token("beta", Role::Member);
    let id = t.launch(&member, &support::shared_launch(1, 1024)).await;
    let vm = format!("/v1/vms/{id}");
    assert_eq!(t.delete(&member, &vm).await.0, 403);

    write(&file, STALE_COPY);
    let view = policy_task(&t).await;
    assert_eq!(view["last_outcome"], "error", "{view}");
    let error = view["last_error"].as_str().unwrap();
    assert!(error.contains("on lines 1 and 4") && error.contains("stay"), "{view}");
    assert_eq!(t.get(&beta, &vm).await.0, 404, "the stale copy opened another project's VM");
    assert_eq!(t.delete(&member, &vm).await.0, 403, "the rules in force changed");
    // Still so on the timer's next look, and counted each time.
    let failures = view["failures"].as_u64().unwrap();
    let later = eventually("the timer looks at the file again", || async {
        let (_, list) = t.get(&t.admin(), "/v1/background-tasks").await;
        let task = list["tasks"].as_array()?.iter().find(|t| t["name"] == "policy_reload")?.clone();
        (task["failures"].as_u64()? > failures).then_some(task)
    })
    .await;
    assert_eq!(later["last_outcome"], "error", "{later}");

    // A valid edit is read by the timer: members may end their VMs again.
    write(&file, "# the defaults\n");
    eventually("the edit is in force", || async {
        let (status, _) = t.get(&member, "/v1/vms").await;
        assert_eq!(status, 200);
        let (_, list) = t.get(&t.admin(), "/v1/background-tasks").await;
        let task = list["tasks"].as_array()?.iter().find(|t| t["name"] == "policy_reload")?.clone();
        (task["last_outcome"] == "ok").then_some(())
    })
    .await;
    let (status, body) = t.delete(&member, &vm).await;
    assert!((200..300).contains(&status), "{status} {body}");
    assert_eq!(t.get(&beta, &vm).await.0, 404);
}

/// With no timer (`policy_reload_secs = 0`), SIGHUP reads the file again, on the real binary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reads_the_policy_file_again() {
    let dir = support::temp_dir();
    let file = dir.join("policy.yaml");
    write(&file, "\"gpu:pool:show\": \"!\"\n");
    let config = dir.join("gsaasd.toml");
    let data = dir.join("data");
    write(
        &config,
        &format!(
            "listen = \"127.0.0.1:0\"\ndata_dir = {:?}\n[auth]\npolicy_file = {:?}\npolicy_reload_secs = 0\n",
            data.display().to_string(),
            file.display().to_string()
        ),
    );
    let issue = Command::new(support::gsaasd_binary())
        .args(["token", "issue", "--init", "--project", "alpha", "-c"])
        .arg(&config)
        .output()
        .unwrap();
    assert!(issue.status.success(), "{}", String::from_utf8_lossy(&issue.stderr));
    let token = String::from_utf8(issue.stdout).unwrap().trim().to_owned();
    let mut child = Command::new(support::gsaasd_binary())
        .args(["serve", "-c"])
        .arg(&config)
        .env_remove("GSAAS_DATABASE_URL")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (url_tx, url_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some(url) = line.strip_prefix("gsaasd serving on ") {
                let _ = url_tx.send(url.to_owned());
            }
        }
    });
    let served = url_rx.recv_timeout(Duration::from_secs(30));
    let child = support::Process(child);
    let pid = child.id();
    {
        let url = served.expect("gsaasd serves");
        let http = reqwest::Client::new();
        let pool = || http.get(format!("{url}/v1/pool")).bearer_auth(&token).send();
        assert_eq!(pool().await.unwrap().status().as_u16(), 403);
        write(&file, "# the defaults\n");
        assert_eq!(pool().await.unwrap().status().as_u16(), 403, "read without a SIGHUP");
        let hup = Command::new("kill").args(["-HUP", &pid.to_string()]).status().unwrap();
        assert!(hup.success());
        eventually("SIGHUP applies the file", || async {
            (pool().await.ok()?.status().as_u16() == 200).then_some(())
        })
        .await;
    }
    drop(child);
    let _ = std::fs::remove_dir_all(dir);
}
