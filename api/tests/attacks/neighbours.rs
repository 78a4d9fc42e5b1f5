//! A neighbour: a client behind the same address as its victims (one NAT, one proxy, one IPv6
//! /64), or one with many addresses. Keystone's per-client budget must stop its sprays without
//! letting it keep a victim signed in, spray from a whole /64, or lock newcomers out by filling
//! the budget table.

use std::net::IpAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use axum::http::Method;
use gsaasd::openstack::keystone::{AdminScope, ValidatorSettings};
use gsaasd::openstack::{AuthSettings, HttpOptions, Keystone, TokenValidator};
use serde_json::json;

use crate::keystone_auth::{setup_with, Setup};

fn sign_in(password: &str) -> serde_json::Value {
    json!({ "password": { "user": "alice", "password": password }, "project": { "name": "demo" } })
}

/// Signs alice in: her scoped token (`tenant-a`) and its unscoped root.
async fn alice_signs_in(s: &Setup) -> (String, String) {
    let (status, session) =
        s.call(Method::POST, "/v1/auth/tokens", "", Some(sign_in("right"))).await;
    assert_eq!(status, 201, "{session}");
    let token = session["token"].as_str().unwrap().to_owned();
    let root = session["unscoped_token"].as_str().unwrap().to_owned();
    (token, root)
}

fn revoked(s: &Setup) -> Vec<String> {
    let mut revoked = s.fake.revoked.lock().unwrap().clone();
    revoked.sort();
    revoked
}

/// A neighbour spends the address's budget with wrong passwords; alice, behind the same
/// address, still signs out: her token stops working at once and Keystone revokes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_neighbour_who_spent_the_budget_cannot_keep_a_user_signed_in() {
    let s = setup_with("neighbour-budget", |auth| auth.keystone_validations_per_minute = 4).await;
    let (token, _root) = alice_signs_in(&s).await;
    assert_eq!(s.get("/v1/vms", &token).await.0, 200);
    let mut statuses = Vec::new();
    for i in 0..10 {
        let body = sign_in(&format!("guess-{i}"));
        statuses.push(s.call(Method::POST, "/v1/auth/tokens", "", Some(body)).await.0);
    }
    assert!(statuses.contains(&429), "the neighbour spent the budget: {statuses:?}");

    let (status, body) = s.call(Method::DELETE, "/v1/auth/tokens", &token, None).await;
    assert_eq!(status, 204, "sign-out refused: {body}");
    assert_eq!(revoked(&s), vec![token.clone()]);
    assert_eq!(s.get("/v1/vms", &token).await.0, 401, "the token still works here");
    s.service.abort();
}

/// Signing out with the session's unscoped root alone ends the scoped token had from it too:
/// here at once (it was cached), and at Keystone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signing_out_with_the_root_ends_every_token_had_from_it() {
    let s = setup_with("neighbour-root", |_| {}).await;
    let (token, root) = alice_signs_in(&s).await;
    assert_eq!(s.get("/v1/vms", &token).await.0, 200);
    let (status, body) = s.call(Method::DELETE, "/v1/auth/tokens", &root, None).await;
    assert_eq!(status, 204, "{body}");
    let mut both = vec![root.clone(), token.clone()];
    both.sort();
    assert_eq!(revoked(&s), both);
    assert_eq!(s.get("/v1/vms", &token).await.0, 401, "the scoped token outlived its root");
    // Again: already ended, nothing more asked of Keystone.
    assert_eq!(s.call(Method::DELETE, "/v1/auth/tokens", &root, None).await.0, 204);
    assert_eq!(revoked(&s), both);
    s.service.abort();
}

/// A sign-out Keystone could not complete is an error (503), never a silent success; the tokens
/// stop working here at once all the same, and signing out again revokes what is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sign_out_keystone_missed_says_so_and_a_retry_finishes_it() {
    let s = setup_with("neighbour-retry", |_| {}).await;
    let (token, root) = alice_signs_in(&s).await;
    assert_eq!(s.get("/v1/vms", &token).await.0, 200);
    s.fake.revocations_fail.store(true, Ordering::SeqCst);
    let (status, problem) = s.call(Method::DELETE, "/v1/auth/tokens", &root, None).await;
    assert_eq!(status, 503, "{problem}");
    assert_eq!(s.get("/v1/vms", &token).await.0, 401, "forgotten here at once");
    assert!(revoked(&s).is_empty());
    s.fake.revocations_fail.store(false, Ordering::SeqCst);
    let (status, problem) = s.call(Method::DELETE, "/v1/auth/tokens", &root, None).await;
    assert_eq!(status, 204, "{problem}");
    let mut both = vec![root, token];
    both.sort();
    assert_eq!(revoked(&s), both, "the retry revoked the whole session");
    s.service.abort();
}

/// Sign-outs of tokens nobody holds cost Keystone one question each, however often repeated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_sign_outs_costs_keystone_one_question_per_token() {
    let s = setup_with("neighbour-flood", |_| {}).await;
    for _ in 0..30 {
        assert_eq!(s.call(Method::DELETE, "/v1/auth/tokens", "gAAAA-nobodys", None).await.0, 204);
    }
    let asked = s
        .fake
        .log
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, p, subject)| {
            p.starts_with("/identity/v3/auth/tokens") && subject.as_deref() == Some("gAAAA-nobodys")
        })
        .count();
    assert_eq!(asked, 1);
    assert!(revoked(&s).is_empty());
    s.service.abort();
}

/// A validator whose Keystone is never asked: budgets only.
fn validator(per_minute: u32) -> TokenValidator {
    let settings = AuthSettings {
        auth_url: "http://127.0.0.1:9/identity/v3".into(),
        user_id: Some("gsaas".into()),
        password: "unused".into(),
        project_name: Some("service".into()),
        project_domain_id: Some("default".into()),
        ..AuthSettings::default()
    };
    let keystone = Keystone::new(settings, HttpOptions::default()).unwrap();
    TokenValidator::new(
        Arc::new(keystone),
        ValidatorSettings {
            admin: AdminScope {
                roles: vec!["admin".into()],
                system: true,
                project: None,
                project_domain: "default".into(),
            },
            capacity: 16,
            max_age: Duration::from_secs(300),
            refusal_ttl: Duration::from_secs(30),
            per_client_per_minute: per_minute,
        },
    )
}

/// One host's IPv6 /64 is one client: spraying from a thousand of its addresses gets one
/// minute's budget, not a thousand.
#[test]
fn a_sprayer_with_a_whole_ipv6_64_gets_one_budget() {
    let validator = validator(10);
    let granted = (0u32..1_000)
        .filter(|i| {
            let address: IpAddr =
                format!("2001:db8:7:7:{:x}:{:x}::1", i >> 8, i & 0xff).parse().unwrap();
            validator.take_budget(address)
        })
        .count();
    assert_eq!(granted, 10);
    assert!(validator.take_budget("2001:db8:7:8::1".parse().unwrap()), "another /64");
}

/// 20,000 addresses, each spending its budget, cannot lock out a client that comes after them:
/// the table makes room for it instead of refusing it.
#[test]
fn a_flood_of_addresses_cannot_lock_newcomers_out() {
    let validator = validator(1);
    for i in 0u32..20_000 {
        let address = IpAddr::from(std::net::Ipv4Addr::from(0x0a00_0000 + i));
        assert!(validator.take_budget(address), "address {i} of the flood");
        assert!(!validator.take_budget(address));
    }
    assert!(validator.take_budget("192.0.2.1".parse().unwrap()), "a newcomer was refused");
}
