//! The REST API end to end against a real gsaasd (simulated cloud, in-process agents), on SQLite and
//! on PostgreSQL: launch to ready, views per role, termination, isolation between projects, auth,
//! every kind of bad input, idempotent retries.

use crate::{on_both_stores, support};

use std::time::Duration;

use gsaasd::auth::Role;
use serde_json::{json, Value};
use support::{shared_launch, Store, TestService};

on_both_stores!(
    launch_becomes_ready_with_masked_cgpus_and_terminate_releases,
    tenants_see_their_project_only_and_no_gpu_locations,
    bad_input_names_the_field_and_changes_nothing,
    authentication_failures_are_401_with_a_reason,
    a_retried_launch_with_the_same_key_creates_one_vm,
    capacity_runs_out_with_507_and_comes_back_after_terminate,
    drained_hosts_take_no_new_cgpus,
    long_polls_answer_once_the_vm_settles,
    a_long_poll_shows_events_recorded_while_it_waited,
    each_role_gets_its_own_view_and_every_change_shows_at_once,
    concurrent_launches_and_terminations_each_get_their_own_outcome,
);

async fn pool_totals(t: &TestService) -> Value {
    let (status, pool) = t.get(&t.member(), "/v1/pool").await;
    assert_eq!(status, 200, "{pool}");
    pool["totals"].clone()
}

async fn launch_becomes_ready_with_masked_cgpus_and_terminate_releases(store: Store) {
    let t = TestService::start(store).await;
    let token = t.member();
    let id = t.launch(&token, &shared_launch(2, 4096)).await;
    let vm = t.wait_state(&token, &id, "ready").await;
    assert_eq!(vm["cgpus"].as_array().unwrap().len(), 2);
    assert_eq!(vm["cgpus"][0]["masked_endpoint"], "100.127.0.1:8308");
    assert_eq!(vm["cgpus"][1]["masked_endpoint"], "100.127.0.1:8309");
    assert_eq!(vm["rcuda_env"]["RCUDA_DEVICE_COUNT"], "2");
    assert_eq!(vm["rcuda_env"]["RCUDA_DEVICE_1"], "100.127.0.1@8309:0");
    for stage in gsaasd::model::Timings::names() {
        assert!(vm["timings"][stage].as_f64().is_some(), "stage {stage} missing: {vm}");
    }
    assert!(vm["server_id"].is_string() && vm["fixed_ip"].is_string());

    // The VM's cloud-init carries the same environment.
    let service = t.service();
    let sim = service.sim.as_ref().unwrap();
    let server = gsaasd::cloud::ServerId(vm["server_id"].as_str().unwrap().into());
    let user_data = String::from_utf8(sim.user_data(&server).unwrap()).unwrap();
    assert!(user_data.contains("RCUDA_DEVICE_1=100.127.0.1@8309:0"), "{user_data}");

    // The host's agent routes the VM's masked endpoints to the real rCUDA servers.
    let hosts = service.app.hosts().await.unwrap();
    let vm_host = hosts.iter().find(|h| h.applied_generation > 0).expect("a host got routes");
    assert_eq!(vm_host.applied_generation, vm_host.routes_generation);

    assert_eq!(pool_totals(&t).await["allocated_mib"], 8192);
    let (status, gone) = t.delete(&token, &format!("/v1/vms/{id}")).await;
    assert_eq!(status, 202, "{gone}");
    t.wait_state(&token, &id, "deleted").await;
    assert_eq!(pool_totals(&t).await["allocated_mib"], 0);
    assert!(sim.servers().is_empty(), "the server was deleted");
    // Terminating again is fine and changes nothing.
    let (status, again) = t.delete(&token, &format!("/v1/vms/{id}")).await;
    assert_eq!((status, again["state"].as_str()), (202, Some("deleted")));
    let (_, list) = t.get(&token, "/v1/vms").await;
    assert!(list["vms"].as_array().unwrap().is_empty(), "deleted VMs are not listed: {list}");
}

async fn tenants_see_their_project_only_and_no_gpu_locations(store: Store) {
    let t = TestService::start(store).await;
    let alpha = t.member();
    let beta = t.token("beta", Role::Member);
    let admin = t.admin();
    let id = t.launch(&alpha, &shared_launch(1, 1024)).await;
    let vm = t.wait_state(&alpha, &id, "ready").await;
    assert!(vm.get("host").is_none(), "tenant sees the VM's host: {vm}");
    for field in ["gpu", "host", "rcuda_endpoint"] {
        assert!(vm["cgpus"][0].get(field).is_none(), "tenant sees cgpu {field}: {vm}");
    }
    let (status, _) = t.get(&beta, &format!("/v1/vms/{id}")).await;
    assert_eq!(status, 404, "another project's VM must not exist for beta");
    let (status, _) = t.delete(&beta, &format!("/v1/vms/{id}")).await;
    assert_eq!(status, 404);
    let (_, list) = t.get(&beta, "/v1/vms").await;
    assert!(list["vms"].as_array().unwrap().is_empty());
    let (_, pool) = t.get(&beta, "/v1/pool").await;
    assert!(pool.get("hosts").is_none(), "tenants see totals only: {pool}");
    let (status, _) = t.get(&alpha, "/v1/hosts").await;
    assert_eq!(status, 404, "hosts are for admins");
    let (status, _) = t.post(&alpha, "/v1/hosts/compute-gpu/drain", &json!({})).await;
    assert_eq!(status, 404);

    let (_, vm) = t.get(&admin, &format!("/v1/vms/{id}")).await;
    assert_eq!(vm["cgpus"][0]["rcuda_endpoint"], "10.78.0.1:8308", "{vm}");
    assert!(vm["host"].is_string());
    let (_, list) = t.get(&admin, "/v1/vms?project=alpha").await;
    assert_eq!(list["vms"].as_array().unwrap().len(), 1);
    let (_, list) = t.get(&admin, "/v1/vms?project=beta").await;
    assert!(list["vms"].as_array().unwrap().is_empty());
    let (_, pool) = t.get(&admin, "/v1/pool").await;
    let gpu0 = &pool["hosts"][0]["gpus"][0];
    assert_eq!(gpu0["vms"][&id], 1, "{pool}");
    let (status, hosts) = t.get(&admin, "/v1/hosts").await;
    assert_eq!(status, 200);
    assert_eq!(hosts["hosts"].as_array().unwrap().len(), 4);

    // An agent's credentials open nothing but its host's registration.
    let agent =
        t.service().app.keys.issue("compute-gpu", None, Role::Agent, Duration::from_secs(60));
    for path in ["/v1/vms", "/v1/pool", "/v1/hosts"] {
        let (status, body) = t.get(&agent, path).await;
        assert_eq!(status, 404, "{path}: {body}");
    }
}

async fn bad_input_names_the_field_and_changes_nothing(store: Store) {
    let t = TestService::start(store).await;
    let token = t.member();
    let ok = shared_launch(1, 1024);
    let with = |key: &str, value: Value| {
        let mut body = ok.clone();
        body[key] = value;
        body
    };
    let without = |key: &str| {
        let mut body = ok.clone();
        body.as_object_mut().unwrap().remove(key);
        body
    };
    let cases: Vec<(Value, u16, &str)> = vec![
        (with("ncgpus", json!(0)), 422, "ncgpus"),
        (with("ncgpus", json!(-2)), 422, "ncgpus"),
        (with("ncgpus", json!(1_000_000)), 422, "ncgpus"),
        (with("ncgpus", json!("two")), 422, "ncgpus"),
        (without("ncgpus"), 422, "ncgpus"),
        (with("ncgpus", json!(2.5)), 422, "ncgpus"),
        (without("gpu_memory_mib"), 422, "gpu_memory_mib"),
        (with("gpu_memory_mib", json!(0)), 422, "gpu_memory_mib"),
        (with("gpu_memory_mib", json!(8193)), 422, "gpu_memory_mib"),
        (with("mode", json!("sharded")), 422, "mode"),
        (with("locality", json!("nearby")), 422, "locality"),
        (with("policy", json!("worst-fit")), 422, "policy"),
        (with("image", json!("windows-95")), 422, "image"),
        (with("flavor", json!("m1.huge")), 422, "flavor"),
        // (An empty image is the service's default: the simulated cloud's first.)
        (with("image", json!("  ")), 422, "image"),
        (with("networks", json!(["nowhere"])), 422, "networks"),
        (with("name", json!("a\u{7}b")), 422, "name"),
        (with("surprise", json!(1)), 422, "surprise"),
        (with("user_data", json!("x".repeat(70_000))), 422, "user_data"),
        (with("user_data", json!("not a cloud-init format")), 422, "user_data"),
    ];
    let before = pool_totals(&t).await;
    for (body, status, field) in cases {
        let (got, problem) = t.post(&token, "/v1/vms", &body).await;
        assert_eq!(got, status, "{body}: {problem}");
        let detail = problem["detail"].as_str().unwrap_or_default();
        let named = problem["field"].as_str().unwrap_or_default();
        assert!(named == field || detail.contains(field), "expected field {field}: {problem}");
        assert!(problem["code"].is_string(), "{problem}");
    }
    // Malformed JSON, and a body larger than the limit.
    let r = t
        .http
        .post(t.url("/v1/vms"))
        .bearer_auth(&token)
        .body("{\"ncgpus\":")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    assert_eq!(r.headers()["content-type"], "application/problem+json");
    let huge = format!("{{\"image\":\"{}\"}}", "x".repeat(300 * 1024));
    let r = t.http.post(t.url("/v1/vms")).bearer_auth(&token).body(huge).send().await.unwrap();
    assert_eq!(r.status(), 413);
    // Unknown VM ids.
    for id in ["not-a-uuid", "00000000-0000-0000-0000-000000000000"] {
        let (status, _) = t.get(&token, &format!("/v1/vms/{id}")).await;
        assert_eq!(status, 404);
        let (status, _) = t.delete(&token, &format!("/v1/vms/{id}")).await;
        assert_eq!(status, 404);
    }
    // Every invalid field at once: wrong types and unknown fields, then the values themselves.
    let body = json!({"image": 7, "flavor": "m1.small", "ncgpus": "two", "colour": "red"});
    let (status, problem) = t.post(&token, "/v1/vms", &body).await;
    assert_eq!(status, 422, "{problem}");
    let mut fields = support::fields_at_fault(&problem);
    fields.sort();
    assert_eq!(fields, ["colour", "image", "ncgpus"], "{problem}");
    // A type error does not hide the other fields' values: each is named once.
    let mut body = shared_launch(0, 0);
    body["mode"] = json!("weird");
    body["networks"] = json!(["net", 5]);
    body["name"] = json!("a\u{202e}b");
    let (status, problem) = t.post(&token, "/v1/vms", &body).await;
    assert_eq!(status, 422, "{problem}");
    let mut fields = support::fields_at_fault(&problem);
    fields.sort();
    assert_eq!(fields, ["gpu_memory_mib", "mode", "name", "ncgpus", "networks[1]"], "{problem}");
    let mut body = shared_launch(0, 0);
    body["image"] = json!(" ");
    body["networks"] = json!(["net", "a\u{1}b"]);
    body["priority"] = json!(-1);
    let (status, problem) = t.post(&token, "/v1/vms", &body).await;
    assert_eq!(status, 422, "{problem}");
    assert_eq!(
        support::fields_at_fault(&problem),
        ["image", "networks[1]", "ncgpus", "gpu_memory_mib", "priority"],
        "{problem}"
    );
    assert_eq!(problem["field"], "image", "{problem}");
    // JSON Schema's integers: 2.0 is one.
    let mut body = shared_launch(1, 1024);
    body["ncgpus"] = json!(1.0);
    body["image"] = json!("windows-95");
    let (status, problem) = t.post(&token, "/v1/vms", &body).await;
    assert_eq!(
        (status, support::fields_at_fault(&problem)),
        (422, vec!["image".to_owned()]),
        "{problem}"
    );
    // A struct's fields as an array are not its object.
    let (status, problem) = t.post(&token, "/v1/vms", &json!(["cirros", "m1.small", 1])).await;
    assert_eq!(
        (status, support::fields_at_fault(&problem)),
        (422, vec!["body".to_owned()]),
        "{problem}"
    );

    assert_eq!(pool_totals(&t).await, before);
    let (_, list) = t.get(&token, "/v1/vms").await;
    assert!(list["vms"].as_array().unwrap().is_empty(), "refused launches left VMs: {list}");
}

async fn authentication_failures_are_401_with_a_reason(store: Store) {
    let t = TestService::start(store).await;
    // gsaasd's own tokens only: no Keystone sign-in to offer, and none to try.
    let (status, methods) = t.get("", "/v1/auth").await;
    assert_eq!((status, methods["mode"].as_str()), (200, Some("jwt")), "{methods}");
    assert_eq!(methods["methods"], serde_json::json!([]));
    let body = serde_json::json!({"password": {"user": "u", "password": "p"}});
    let (status, problem) = t.post("", "/v1/auth/tokens", &body).await;
    assert_eq!(status, 404, "{problem}");
    let other_key = {
        use ed25519_dalek::pkcs8::{spki::der::pem::LineEnding, EncodePrivateKey};
        let key = ed25519_dalek::SigningKey::from_bytes(&[9; 32]);
        gsaasd::auth::Keys::from_private_pem(&key.to_pkcs8_pem(LineEnding::LF).unwrap()).unwrap()
    };
    let forged = other_key.issue("alpha", Some("alpha"), Role::Admin, Duration::from_secs(60));
    let cases: Vec<(Option<(&str, String)>, &str)> = vec![
        (None, "missing token"),
        (Some(("authorization", "Basic abc".into())), "Bearer"),
        (Some(("authorization", "Bearer not.a.jwt".into())), "malformed"),
        (Some(("authorization", format!("Bearer {forged}"))), "signature"),
        (Some(("x-auth-token", "garbage".into())), "malformed"),
    ];
    for (header, reason) in cases {
        let mut request = t.http.get(t.url("/v1/vms"));
        if let Some((name, value)) = &header {
            request = request.header(*name, value);
        }
        let (status, problem) = support::status_json(request.send().await.unwrap()).await;
        assert_eq!(status, 401, "{header:?}: {problem}");
        assert!(problem["detail"].as_str().unwrap().contains(reason), "{header:?}: {problem}");
    }
    // X-Auth-Token works like a bearer token, as OpenStack clients send it.
    let r = t.http.get(t.url("/v1/vms")).header("x-auth-token", t.member()).send().await.unwrap();
    assert_eq!(r.status(), 200);
    // Unauthenticated endpoints; /metrics names GPUs and hosts, so it is not one.
    for path in ["/healthz", "/readyz", "/healthcheck", "/openapi.json"] {
        let r = t.http.get(t.url(path)).send().await.unwrap();
        assert_eq!(r.status(), 200, "{path}");
    }
    // /healthcheck as oslo.middleware answers it: OK, HEAD 204, JSON when asked for.
    let r = t.http.get(t.url("/healthcheck")).send().await.unwrap();
    assert_eq!(r.text().await.unwrap(), "OK");
    let r = t.http.head(t.url("/healthcheck")).send().await.unwrap();
    assert_eq!(r.status(), 204);
    let r = t.http.get(t.url("/healthcheck")).header("accept", "application/json").send();
    let answer: Value = r.await.unwrap().json().await.unwrap();
    assert_eq!(answer, serde_json::json!({"detailed": false, "reasons": ["OK"]}));
    assert_eq!(t.http.get(t.url("/metrics")).send().await.unwrap().status(), 401);
}

async fn a_retried_launch_with_the_same_key_creates_one_vm(store: Store) {
    let t = TestService::start(store).await;
    let token = t.member();
    let body = shared_launch(1, 2048);
    let send = |key: &'static str, body: Value| {
        let request = t
            .http
            .post(t.url("/v1/vms"))
            .bearer_auth(&token)
            .header("idempotency-key", key)
            .json(&body);
        async move { support::status_json(request.send().await.unwrap()).await }
    };
    let (s1, first) = send("retry-1", body.clone()).await;
    let (s2, second) = send("retry-1", body.clone()).await;
    assert_eq!((s1, s2), (202, 202));
    assert_eq!(first["id"], second["id"]);
    let (status, problem) = send("retry-1", shared_launch(2, 2048)).await;
    assert_eq!(status, 422, "same key, different request: {problem}");
    assert_eq!(problem["field"], "Idempotency-Key");
    // Concurrent retries still make one VM.
    let (a, b, c) = tokio::join!(
        send("retry-2", body.clone()),
        send("retry-2", body.clone()),
        send("retry-2", body.clone())
    );
    let results = [a, b, c];
    let ids: std::collections::HashSet<_> =
        results.iter().map(|(s, v)| (*s, v["id"].clone())).collect();
    assert_eq!(ids.len(), 1, "{results:?}");
    let (_, list) = t.get(&token, "/v1/vms").await;
    assert_eq!(list["vms"].as_array().unwrap().len(), 2);
}

async fn capacity_runs_out_with_507_and_comes_back_after_terminate(store: Store) {
    let t = TestService::start(store).await;
    let token = t.member();
    let mut ids = Vec::new();
    for _ in 0..4 {
        ids.push(
            t.launch(&token, &json!({"image": "cirros-0.6.2", "flavor": "m1.small", "ncgpus": 1}))
                .await,
        );
    }
    let (status, problem) = t
        .post(
            &token,
            "/v1/vms",
            &json!({"image": "cirros-0.6.2", "flavor": "m1.small", "ncgpus": 1}),
        )
        .await;
    assert_eq!(status, 507, "{problem}");
    assert_eq!(problem["code"], "insufficient_gpu_capacity");
    t.wait_state(&token, &ids[0], "ready").await;
    t.delete(&token, &format!("/v1/vms/{}", ids[0])).await;
    t.wait_state(&token, &ids[0], "deleted").await;
    t.launch(&token, &json!({"image": "cirros-0.6.2", "flavor": "m1.small", "ncgpus": 1})).await;
}

async fn drained_hosts_take_no_new_cgpus(store: Store) {
    let t = TestService::start(store).await;
    let admin = t.admin();
    let (status, host) = t.post(&admin, "/v1/hosts/compute-gpu/drain", &json!({})).await;
    assert_eq!((status, host["state"].as_str()), (200, Some("drained")), "{host}");
    let (status, _) = t.post(&t.member(), "/v1/vms", &shared_launch(1, 1024)).await;
    assert_eq!(status, 507);
    let (status, host) = t.post(&admin, "/v1/hosts/compute-gpu/undrain", &json!({})).await;
    assert_eq!((status, host["state"].as_str()), (200, Some("schedulable")));
    t.launch(&t.member(), &shared_launch(1, 1024)).await;
    let (status, _) = t.post(&admin, "/v1/hosts/nowhere/drain", &json!({})).await;
    assert_eq!(status, 404);
}

/// The VM as `GET /v1/vms/{id}` shows it to `token`, asserted equal to the same VM in the list
/// (which renders every VM afresh): a view kept from an earlier read is the one a read renders.
/// The list is read between two reads of the VM, and compared when the VM did not change
/// meanwhile.
async fn shown(t: &TestService, token: &str, id: &str) -> Value {
    let path = format!("/v1/vms/{id}");
    for _ in 0..100 {
        let (status, before) = t.get(token, &path).await;
        assert_eq!(status, 200, "{before}");
        let (status, list) = t.get(token, "/v1/vms?project=alpha").await;
        assert_eq!(status, 200, "{list}");
        let (_, after) = t.get(token, &path).await;
        if before == after {
            let listed = list["vms"].as_array().unwrap().iter().find(|v| v["id"] == id);
            assert_eq!(Some(&before), listed, "the VM's own view against the list's");
            return before;
        }
    }
    panic!("VM {id} never held still for three reads");
}

/// A VM's view is kept per version and role (`app::rendered`): each role still gets its own, and
/// every change shows at the next read, a change of its cGPUs alone included.
async fn each_role_gets_its_own_view_and_every_change_shows_at_once(store: Store) {
    let t = TestService::start(store).await;
    let alpha = t.member();
    let admin = t.admin();
    let beta = t.token("beta", Role::Member);
    let id = t.launch(&alpha, &shared_launch(2, 1024)).await;
    t.wait_state(&alpha, &id, "ready").await;
    let path = format!("/v1/vms/{id}");
    // Roles in turn, each twice: a view kept for one role never answers another.
    for _ in 0..2 {
        let vm = shown(&t, &admin, &id).await;
        assert!(vm["host"].is_string(), "{vm}");
        assert!(vm["cgpus"][0]["rcuda_endpoint"].is_string(), "{vm}");
        let vm = shown(&t, &alpha, &id).await;
        assert!(vm.get("host").is_none(), "tenant sees the VM's host: {vm}");
        assert!(vm["cgpus"][0].get("rcuda_endpoint").is_none(), "{vm}");
        let (status, _) = t.get(&beta, &path).await;
        assert_eq!(status, 404, "another project's VM must not exist for beta");
    }
    let states = |vm: &Value| -> Vec<String> {
        let cgpus = vm["cgpus"].as_array().unwrap();
        cgpus.iter().map(|c| c["state"].as_str().unwrap().to_owned()).collect()
    };
    let attach = json!({"ncgpus": 1, "gpu_memory_mib": 1024, "mode": "shared"});
    let (status, answer) = t.post(&alpha, &format!("{path}/cgpus"), &attach).await;
    assert_eq!(status, 202, "{answer}");
    assert_eq!(states(&shown(&t, &alpha, &id).await).len(), 3, "the attach shows at once");
    let vm = t.wait_vm(&alpha, &id, |vm| states(vm).iter().all(|s| s == "live")).await;
    assert_eq!(states(&vm).len(), 3, "{vm}");
    assert_eq!(shown(&t, &admin, &id).await["cgpus"].as_array().unwrap().len(), 3);
    let (status, answer) = t.delete(&alpha, &format!("{path}/cgpus/0")).await;
    assert_eq!(status, 202, "{answer}");
    let vm = shown(&t, &alpha, &id).await;
    let first = &vm["cgpus"][0];
    assert!(first["index"] != 0 || first["state"] != "live", "the detach shows at once: {vm}");
    let vm = t.wait_vm(&alpha, &id, |vm| states(vm).len() == 2).await;
    assert_eq!(shown(&t, &alpha, &id).await, vm);
    let (status, answer) = t.delete(&alpha, &path).await;
    assert_eq!(status, 202, "{answer}");
    // (Deleted VMs are not listed: this one is compared with nothing.)
    let (_, vm) = t.get(&alpha, &path).await;
    assert_ne!(vm["state"], "ready", "the termination shows at once: {vm}");
    t.wait_state(&alpha, &id, "deleted").await;
}

/// `GET /v1/vms/{id}?wait=` answers once the VM is `ready`, `error` or `deleted`, or when the wait
/// runs out; bad waits are refused; another project's VM stays unseen.
async fn long_polls_answer_once_the_vm_settles(store: Store) {
    let t = TestService::start_with(store, |c| {
        c.cloud.sim_mut().unwrap().activation_delay_ms = 1500;
    })
    .await;
    let token = t.member();
    let id = t.launch(&token, &shared_launch(1, 1024)).await;
    let path = format!("/v1/vms/{id}");

    let (status, vm) = t.get(&token, &format!("{path}?wait=0")).await;
    assert_eq!((status, vm["state"].as_str()), (200, Some("creating")), "{vm}");
    let (status, vm) = t.get(&token, &format!("{path}?wait=0.05")).await;
    assert_eq!((status, vm["state"].as_str()), (200, Some("creating")), "the wait ran out: {vm}");
    let (status, vm) = t.get(&token, &format!("{path}?wait=30")).await;
    assert_eq!((status, vm["state"].as_str()), (200, Some("ready")), "{vm}");
    // The answer a waiter gets from the write it was woken by is the VM as stored.
    assert_eq!(t.get(&token, &path).await.1, vm);
    assert_eq!(vm["cgpus"].as_array().map(Vec::len), Some(1), "{vm}");

    for bad in ["-1", "60.5", "abc", "NaN", "inf"] {
        let (status, problem) = t.get(&token, &format!("{path}?wait={bad}")).await;
        assert_eq!(status, 422, "wait={bad}: {problem}");
        let named = format!("{} {}", problem["field"], problem["detail"]);
        assert!(named.contains("wait") || named.contains("query"), "wait={bad}: {problem}");
    }
    let (status, problem) = t.get(&token, &format!("{path}?wait=1&surprise=1")).await;
    assert_eq!(status, 422, "{problem}");

    let other = t.token("beta", Role::Member);
    let (status, problem) = t.get(&other, &format!("{path}?wait=30")).await;
    assert_eq!(status, 404, "{problem}");

    let (status, _) = t.delete(&token, &path).await;
    assert_eq!(status, 202);
    let (status, vm) = t.get(&token, &format!("{path}?wait=30")).await;
    assert_eq!((status, vm["state"].as_str()), (200, Some("deleted")), "{vm}");
    assert_eq!(t.get(&token, &path).await.1, vm);
}

/// A long-poll that read its VM with neither queue entries nor events is answered from the write
/// that settled the VM, without reading them again, unless something was added meanwhile
/// (`extras_version`, migration 0020): an event recorded while it waits, during the launch and
/// during the termination, is in its answer. Fails when the write's answer ignores them.
async fn a_long_poll_shows_events_recorded_while_it_waited(store: Store) {
    use gsaasd::db::VmEvent;
    let t = TestService::start_with(store, |c| {
        let sim = c.cloud.sim_mut().unwrap();
        sim.activation_delay_ms = 1500;
        sim.deletion_delay_ms = 1500;
        // One read per wait unless woken: nothing else finds the events.
        c.launch.long_poll_reread_ms = 60_000;
    })
    .await;
    let token = t.member();
    let id = t.launch(&token, &shared_launch(1, 1024)).await;
    let path = format!("/v1/vms/{id}");
    let waiting = format!("{path}?wait=30");
    let vm_id: gpgpums::VmId = id.parse().unwrap();
    let record = |detail: &'static str| {
        let db = t.service().app.db.clone();
        async move {
            // The waiter reads its VM within milliseconds; the cloud takes 1.5 s.
            tokio::time::sleep(Duration::from_millis(300)).await;
            let event = VmEvent {
                at_ms: gsaasd::db::now_ms(),
                kind: "moved".into(),
                detail: detail.into(),
            };
            db.record_events([vm_id], &event).await.unwrap();
        }
    };
    let details = |vm: &Value| -> Vec<String> {
        let events = vm["events"].as_array().cloned().unwrap_or_default();
        events.iter().map(|e| e["detail"].as_str().unwrap_or_default().to_owned()).collect()
    };

    let (_, vm) = t.get(&token, &path).await;
    assert_eq!((vm["state"].as_str(), details(&vm).len()), (Some("creating"), 0), "{vm}");
    let ((status, vm), ()) = tokio::join!(t.get(&token, &waiting), record("during the launch"));
    assert_eq!((status, vm["state"].as_str()), (200, Some("ready")), "{vm}");
    assert_eq!(details(&vm), ["during the launch"], "{vm}");
    assert_eq!(t.get(&token, &path).await.1, vm);

    let (status, _) = t.delete(&token, &path).await;
    assert_eq!(status, 202);
    let ((status, vm), ()) =
        tokio::join!(t.get(&token, &waiting), record("during the termination"));
    assert_eq!((status, vm["state"].as_str()), (200, Some("deleted")), "{vm}");
    assert_eq!(details(&vm), ["during the launch", "during the termination"], "{vm}");
    assert_eq!(t.get(&token, &path).await.1, vm);
}

/// Launches and terminations that arrive together are written together (group commit), but each
/// gets its own outcome: of 12 concurrent exclusive launches on the testbed's 4 GPUs exactly 4 are
/// accepted and 8 refused with 507, and terminating the 4 at once releases every cGPU.
async fn concurrent_launches_and_terminations_each_get_their_own_outcome(store: Store) {
    let t = TestService::start(store).await;
    let token = t.member();
    let body = json!({"image": "cirros-0.6.2", "flavor": "m1.small", "ncgpus": 1});
    let launches = (0..12).map(|_| t.post(&token, "/v1/vms", &body));
    let results = support::join_all(launches).await;
    let accepted = support::accepted_ids(&results);
    let refused = results.iter().filter(|(status, problem)| {
        *status == 507 && problem["code"] == "insufficient_gpu_capacity"
    });
    assert_eq!((accepted.len(), refused.count()), (4, 8), "{results:?}");
    for id in &accepted {
        t.wait_state(&token, id, "ready").await;
    }
    let paths: Vec<String> = accepted.iter().map(|id| format!("/v1/vms/{id}")).collect();
    let ready: Vec<Value> = support::join_all(paths.iter().map(|path| t.get(&token, path)))
        .await
        .into_iter()
        .map(|(_, vm)| vm)
        .collect();
    let gpus: std::collections::HashSet<_> =
        ready.iter().map(|vm| vm["cgpus"][0]["masked_endpoint"].clone()).collect();
    assert_eq!(gpus.len(), 1, "every VM sees its one cGPU at the same masked endpoint: {ready:?}");
    assert_eq!(pool_totals(&t).await["allocated_mib"], 4 * 8192);

    let terminations = paths.iter().map(|path| t.delete(&token, path));
    for (status, vm) in support::join_all(terminations).await {
        assert_eq!(status, 202, "{vm}");
    }
    for id in &accepted {
        t.wait_state(&token, id, "deleted").await;
    }
    assert_eq!(pool_totals(&t).await["allocated_mib"], 0);
    assert!(t.service().sim.as_ref().unwrap().servers().is_empty());
}
