//! Tokens as an attacker and an operator see them: revoked tokens are refused (by every replica),
//! agents renew their own token and nothing else, and `gsaasd token` refuses what would produce a
//! useless or wrapped token.

use std::process::Command;
use std::time::Duration;

use crate::on_both_stores;
use crate::support::{test_config, Store, TestService};
use gsaasd::auth::Role;
use serde_json::json;

on_both_stores!(
    revoked_tokens_are_refused_and_agents_renew_only_their_own,
    a_revoked_line_stays_revoked_after_the_token_given_expires,
);

async fn renew(t: &TestService, host: &str, token: &str) -> (u16, serde_json::Value) {
    t.post(token, &format!("/v1/hosts/{host}/token"), &json!({})).await
}

async fn revoked_tokens_are_refused_and_agents_renew_only_their_own(store: Store) {
    let t = TestService::start(store).await;
    let app = &t.service().app;
    let agent = app.keys.issue("compute-gpu", None, Role::Agent, Duration::from_secs(600));
    let (status, body) = renew(&t, "compute-gpu", &agent).await;
    assert_eq!(status, 200, "{body}");
    let renewed = body["token"].as_str().unwrap().to_owned();
    assert_ne!(renewed, agent);
    assert_eq!(renew(&t, "compute-gpu", &renewed).await.0, 200, "a renewal renews");
    // Only an agent, for its own host.
    for (host, token) in
        [("compute0-rgpu", &agent), ("compute-gpu", &t.member()), ("compute-gpu", &t.admin())]
    {
        assert_eq!(renew(&t, host, token).await.0, 404, "{host}");
    }

    // Revoking the agent's first token ends its whole line, on this replica at its next reload.
    let member = t.member();
    let (ok, out, err) = t.gsaasd(&["token", "revoke", "--token", &agent]);
    assert!(ok, "{err}");
    assert!(out.starts_with("revoked "), "{out}");
    app.refresh_revocations().await.unwrap();
    for token in [&agent, &renewed] {
        let (status, problem) = renew(&t, "compute-gpu", token).await;
        assert_eq!(status, 401, "{problem}");
        assert!(problem["detail"].as_str().unwrap().contains("revoked"), "{problem}");
    }
    assert_eq!(t.get(&member, "/v1/vms").await.0, 200, "other tokens are unaffected");
    // By id, as an operator finds it in a token's `jti`.
    let id = app.keys.token_id(&member).unwrap().line;
    let (ok, _, err) = t.gsaasd(&["token", "revoke", "--jti", &id]);
    assert!(ok, "{err}");
    app.refresh_revocations().await.unwrap();
    assert_eq!(t.get(&member, "/v1/vms").await.0, 401);
    assert_eq!(t.get(&t.member(), "/v1/vms").await.0, 200, "a new token works");

    // Lifetimes that would wrap, or no key: refused with the reason, nothing printed.
    for ttl in ["18446744073709551615", "0", "99999999999"] {
        let (ok, out, err) = t.gsaasd(&["token", "issue", "--project", "p", "--ttl", ttl]);
        assert!(!ok && out.is_empty(), "--ttl {ttl}: {out}");
        assert!(err.contains("--ttl"), "{err}");
    }
    let (ok, out, _) = t.gsaasd(&["token", "issue", "--project", "p", "--ttl", "60"]);
    assert!(ok);
    assert_eq!(t.get(&out, "/v1/vms").await.0, 200);
}

#[tokio::test]
async fn token_issue_without_a_key_refuses_unless_initializing() {
    let dir = std::env::temp_dir().join(format!("gsaasd-nokey-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("gsaasd.toml");
    std::fs::write(&config, format!("data_dir = {:?}\n", dir.join("data").display().to_string()))
        .unwrap();
    let issue = |extra: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_gsaasd"))
            .args(["token", "issue", "--project", "p"])
            .args(extra)
            .arg("-c")
            .arg(&config)
            .output()
            .unwrap()
    };
    let out = issue(&[]);
    assert!(!out.status.success() && out.stdout.is_empty());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no signing key") && err.contains("--init"), "{err}");
    assert!(!dir.join("data/signing-key.pem").exists(), "a key was created anyway");
    let out = issue(&["--init"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(dir.join("data/signing-key.pem").exists());
    assert!(issue(&[]).status.success(), "the key exists now");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_revocation_reaches_every_replica() {
    let (config, dir) = test_config(Store::Postgres);
    let a = TestService::start_config(config.clone(), dir).await;
    let mut second = config.clone();
    second.data_dir = a.dir.join("replica-b");
    second.auth.signing_key = Some(config.signing_key_path());
    second.auth.revocation_refresh_secs = 1;
    let b = TestService::start_config(second, a.dir.join("b-scratch")).await;
    let member = a.member();
    for replica in [&a, &b] {
        assert_eq!(replica.get(&member, "/v1/vms").await.0, 200);
    }
    let id = a.service().app.keys.token_id(&member).unwrap();
    gsaasd::app::tokens::revoke(&a.service().app.db, &id).await.unwrap();
    // Each replica reloads the revoked ids on its timer: replica B's runs every second; A's is
    // triggered.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while b.get(&member, "/v1/vms").await.0 != 401 {
        assert!(std::time::Instant::now() < deadline, "replica B never refused the token");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    a.service().app.refresh_revocations().await.unwrap();
    assert_eq!(a.get(&member, "/v1/vms").await.0, 401);
}

/// Revoking an agent's line with its first token (even one at its expiry already) ends every
/// renewal of it for as long as any could be valid, not only until the token given expires:
/// purges after that expiry keep the line's row.
async fn a_revoked_line_stays_revoked_after_the_token_given_expires(store: Store) {
    let t = TestService::start(store).await;
    let app = &t.service().app;
    let mut renewed = Vec::new();
    for life in [Duration::from_secs(60), Duration::ZERO] {
        let first = app.keys.issue("compute-gpu", None, Role::Agent, life);
        let (status, body) = renew(&t, "compute-gpu", &first).await;
        assert_eq!(status, 200, "{body}");
        renewed.push(body["token"].as_str().unwrap().to_owned());
        let (ok, out, err) = t.gsaasd(&["token", "revoke", "--token", &first]);
        assert!(ok, "{err}");
        assert!(out.starts_with("revoked "), "{out}");
    }
    // The reload an hour later, past both first tokens' expiry, purges what can no longer be
    // valid: the lines' rows stay.
    let an_hour_later = gsaasd::db::now_ms() + 3_600_000;
    let revoked = {
        let mut conn = app.db.conn().await.unwrap();
        gsaasd::db::revoked_tokens(&mut conn, an_hour_later).await.unwrap()
    };
    app.keys.set_revoked(revoked);
    for token in &renewed {
        let (status, problem) = renew(&t, "compute-gpu", token).await;
        assert_eq!(status, 401, "{problem}");
        assert!(problem["detail"].as_str().unwrap().contains("revoked"), "{problem}");
    }
}
