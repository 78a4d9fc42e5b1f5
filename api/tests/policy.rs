//! Policy files (`[auth] policy_file`, oslo.policy's YAML): an operator changes who may do what,
//! refusals say which rule refused, and a file gsaasd cannot read right stops it at start with
//! the line at fault. (Keystone roles such as `reader`: `keystone_auth.rs`, and the real
//! Keystone: `openstack.rs`.)

use crate::support::{self, Store, TestService};
use gsaasd::auth::Role;
use serde_json::json;

fn write_policy(t: &std::path::Path, text: &str) -> std::path::PathBuf {
    std::fs::create_dir_all(t).unwrap();
    let path = t.join("policy.yaml");
    std::fs::write(&path, text).unwrap();
    path
}

/// Tenants may launch but not terminate (an operator's cleanup duty), and admins of the `ops`
/// project may no longer drain; everything else keeps its default.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operators_policy_file_changes_who_may_do_what() {
    let (mut config, dir) = support::test_config(Store::Sqlite);
    let policy = write_policy(
        &dir.join("etc"),
        "# Only operators end VMs.\n\
         \"gpu:vm:delete\": \"rule:context_is_admin\"\n\
         \"gpu:host:drain\": \"rule:context_is_admin and not project_id:ops\"\n",
    );
    config.auth.policy_file = Some(policy);
    let t = TestService::start_config(config, dir).await;
    let member = t.member();
    let other = t.token("beta", Role::Member);
    let id = t.launch(&member, &support::shared_launch(1, 1024)).await;

    // The member sees its VM but may not end it: 403 naming the rule, and the VM stays.
    let (status, problem) = t.delete(&member, &format!("/v1/vms/{id}")).await;
    assert_eq!((status, problem["code"].as_str()), (403, Some("policy_not_allowed")), "{problem}");
    assert!(problem["detail"].as_str().unwrap().contains("gpu:vm:delete"), "{problem}");
    let (status, vm) = t.get(&member, &format!("/v1/vms/{id}")).await;
    assert_eq!(status, 200, "{vm}");
    assert_ne!(vm["state"], "deleting", "{vm}");
    // Another project's member learns nothing: 404, as before.
    assert_eq!(t.delete(&other, &format!("/v1/vms/{id}")).await.0, 404);
    assert_eq!(t.get(&other, &format!("/v1/vms/{id}")).await.0, 404);

    // An admin of `ops` may not drain; one of another project may.
    let (_, hosts) = t.get(&t.admin(), "/v1/hosts").await;
    let host = hosts["hosts"][0]["name"].as_str().unwrap().to_owned();
    let drain = format!("/v1/hosts/{host}/drain");
    let (status, problem) = t.post(&t.admin(), &drain, &json!({})).await;
    assert_eq!(status, 403, "{problem}");
    assert!(problem["detail"].as_str().unwrap().contains("gpu:host:drain"), "{problem}");
    let infra = t.token("infra", Role::Admin);
    let (status, body) = t.post(&infra, &drain, &json!({})).await;
    assert_eq!(status, 200, "{body}");
    // A tenant still does not learn the route exists.
    assert_eq!(t.post(&member, &drain, &json!({})).await.0, 404);
    // The rules the file does not name keep their defaults: the ops admin undrains, and ends the VM.
    let (status, body) = t.post(&t.admin(), &format!("/v1/hosts/{host}/undrain"), &json!({})).await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = t.delete(&t.admin(), &format!("/v1/vms/{id}")).await;
    assert!((200..300).contains(&status), "{status} {body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_file_gsaasd_cannot_follow_stops_it_at_start_with_the_line() {
    for (text, says) in [
        (
            "\"gpu:vm:list\": \"@\"\n\"gpu:vm:lst\": \"@\"\n",
            "line 2: unknown rule name \"gpu:vm:lst\"",
        ),
        ("\n\"gpu:vm:create\": \"role:member and (project_id:%(project_id)s\"\n", "line 2"),
        ("\"gpu:vm:create\": \"rule:members\"\n", "names rule:members, which no rule defines"),
    ] {
        let (mut config, dir) = support::test_config(Store::Sqlite);
        config.auth.policy_file = Some(write_policy(&dir.join("etc"), text));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let error = match gsaasd::service::start_on(config, listener).await {
            Ok(_) => panic!("gsaasd started with {text:?}"),
            Err(e) => format!("{}", gsaasd::error::ErrorChain(&e)),
        };
        assert!(error.contains(says) && error.contains("policy.yaml"), "{text:?}: {error}");
        let _ = std::fs::remove_dir_all(dir);
    }
    // A file that is not there is not silently the defaults.
    let (mut config, dir) = support::test_config(Store::Sqlite);
    config.auth.policy_file = Some(dir.join("missing.yaml"));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let Err(error) = gsaasd::service::start_on(config, listener).await else {
        panic!("gsaasd started without its policy file")
    };
    assert!(format!("{}", gsaasd::error::ErrorChain(&error)).contains("missing.yaml"));
}

/// `gsaasd policy dump` prints every rule commented out; uncommented, it is a valid policy file
/// (`gsaasd policy check`) that changes nothing.
#[test]
fn the_dumped_defaults_are_a_policy_file_that_changes_nothing() {
    let run = |args: &[&str]| {
        let out = std::process::Command::new(support::gsaasd_binary()).args(args).output().unwrap();
        let text = |b: Vec<u8>| String::from_utf8(b).unwrap();
        (out.status.success(), text(out.stdout), text(out.stderr))
    };
    let (ok, dumped, _) = run(&["policy", "dump"]);
    assert!(ok);
    for rule in ["gpu:vm:create", "gpu:host:drain", "gpu:gpu:taint", "context_is_admin"] {
        assert!(dumped.contains(&format!("#\"{rule}\": ")), "{rule} missing from:\n{dumped}");
    }
    assert!(dumped.contains("# POST    /v1/vms\n"), "{dumped}");
    let uncommented: String = dumped
        .lines()
        .map(|l| l.strip_prefix("#\"").map_or(l.to_owned(), |r| format!("\"{r}")))
        .map(|l| l + "\n")
        .collect();
    let dir = std::env::temp_dir().join(format!("gsaas-policy-dump-{}", std::process::id()));
    let file = write_policy(&dir, &uncommented);
    let (ok, out, err) = run(&["policy", "check", "--file", file.to_str().unwrap()]);
    assert!(ok, "{out}{err}");
    assert!(gsaasd::policy::Policy::load(Some(&file)).is_ok());
    std::fs::write(&file, "\"gpu:vm:create\": \"role:member and\"\n").unwrap();
    let (ok, _, err) = run(&["policy", "check", "--file", file.to_str().unwrap()]);
    assert!(!ok && err.contains("line 1"), "{err}");
    let _ = std::fs::remove_dir_all(dir);
}
