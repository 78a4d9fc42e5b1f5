//! A hostile tenant against other projects, through the queue: a request that can never fit, a
//! head made into a barrier that waits on VMs that never end.

use std::time::Duration;

use gsaasd::auth::Role;
use serde_json::{json, Value};

use crate::on_both_stores;
use crate::support::{Store, TestService};

on_both_stores!(
    a_head_its_own_projects_vms_keep_out_holds_nobody_back,
    a_request_that_can_never_fit_is_refused_not_queued,
    a_requests_own_faults_are_422_while_the_queue_holds,
    one_project_cannot_hold_other_projects_launches_past_the_bound,
);

fn exclusive(ncgpus: u32, queue: bool) -> Value {
    json!({
        "name": "siege", "image": "cirros-0.6.2", "flavor": "m1.small",
        "ncgpus": ncgpus, "mode": "exclusive", "queue": queue
    })
}

fn shared(queue: bool) -> Value {
    json!({
        "name": "siege", "image": "cirros-0.6.2", "flavor": "m1.small",
        "ncgpus": 1, "gpu_memory_mib": 1024, "mode": "shared", "queue": queue
    })
}

/// Five exclusive cGPUs on the testbed's four GPUs can never start: with `queue: true` it is
/// refused at once (507, saying so), never queued, and holds nobody back, with the default
/// settings (no quotas, everyone at priority 0).
async fn a_request_that_can_never_fit_is_refused_not_queued(store: Store) {
    let t = TestService::start(store).await;
    let attacker = t.token("mallory", Role::Member);
    for _ in 0..20 {
        let (status, problem) = t.post(&attacker, "/v1/vms", &exclusive(5, true)).await;
        assert_eq!(status, 507, "{problem}");
        assert!(problem["detail"].as_str().unwrap().contains("never fit"), "{problem}");
    }
    let (_, queue) = t.get(&t.admin(), "/v1/queue").await;
    assert_eq!(queue["requests"].as_array().map(Vec::len), Some(0), "{queue}");
    // Nor can it be attached into the queue.
    let id = t.launch(&attacker, &shared(false)).await;
    t.wait_state(&attacker, &id, "ready").await;
    let body = json!({"ncgpus": 5, "mode": "exclusive", "queue": true});
    let (status, problem) = t.post(&attacker, &format!("/v1/vms/{id}/cgpus"), &body).await;
    assert_eq!(status, 507, "{problem}");
    // Every other project launches as before.
    let victim = t.token("alice", Role::Member);
    let id = t.launch(&victim, &exclusive(2, false)).await;
    t.wait_state(&victim, &id, "ready").await;
}

/// A service (`queue.max_passes` 2, holds of `max_hold_secs`, no queue rounds but those a test
/// runs) where `mallory`'s request for four exclusive cGPUs waits in the queue on a VM that
/// never ends, `anchor`'s (an accomplice's project, or mallory's own), and a round has seen it;
/// with that head.
async fn a_queue_head_waiting_on_a_vm_that_never_ends(
    store: Store,
    max_hold_secs: u64,
    anchor: &str,
) -> (TestService, Value) {
    let t = TestService::start_with(store, |c| {
        c.queue.max_passes = 2;
        c.queue.max_hold_secs = max_hold_secs;
        c.queue.serve_interval_secs = 3600;
    })
    .await;
    let mallory = t.token("mallory", Role::Member);
    let owner = t.token(anchor, Role::Member);
    let anchor = t.launch(&owner, &shared(false)).await;
    t.wait_state(&owner, &anchor, "ready").await;
    let (status, head) = t.post(&mallory, "/v1/vms", &exclusive(4, true)).await;
    assert_eq!((status, head["state"].as_str()), (202, Some("queued")), "{head}");
    t.service().app.serve_queue_once().await.expect("a round");
    (t, head)
}

/// A request's own faults come before capacity and the queue: while a queue head holds the free
/// GPUs, a launch naming no known placement policy (or with its other fields wrong too) is a 422
/// naming each field, not a 507 for capacity it would never have been placed with; and nothing
/// more is queued.
async fn a_requests_own_faults_are_422_while_the_queue_holds(store: Store) {
    let (t, _) = a_queue_head_waiting_on_a_vm_that_never_ends(store, 600, "dave").await;
    let (other, tenant) = (t.token("carol", Role::Member), t.token("alice", Role::Member));
    for _ in 0..2 {
        let (status, vm) = t.post(&other, "/v1/vms", &shared(false)).await;
        assert_eq!(status, 202, "{vm}");
    }
    let (status, problem) = t.post(&tenant, "/v1/vms", &shared(false)).await;
    assert_eq!(status, 507, "the head holds: {problem}");
    for queue in [false, true] {
        let mut body = shared(queue);
        body["policy"] = json!("worst-fit");
        let (status, problem) = t.post(&tenant, "/v1/vms", &body).await;
        assert_eq!(status, 422, "{problem}");
        assert_eq!(crate::support::fields_at_fault(&problem), ["policy"], "{problem}");
        // With a type error beside it, one answer names both.
        body["priority"] = json!("high");
        let (status, problem) = t.post(&tenant, "/v1/vms", &body).await;
        assert_eq!(status, 422, "{problem}");
        let mut fields = crate::support::fields_at_fault(&problem);
        fields.sort();
        assert_eq!(fields, ["policy", "priority"], "{problem}");
    }
    let (_, queue) = t.get(&t.admin(), "/v1/queue").await;
    assert_eq!(queue["requests"].as_array().map(Vec::len), Some(1), "{queue}");
    // Known policies, layered ones too, pass their checks and meet the hold.
    for policy in ["best-fit", "fewer-jobs-node+best-fit"] {
        let mut body = shared(false);
        body["policy"] = json!(policy);
        let (status, problem) = t.post(&tenant, "/v1/vms", &body).await;
        assert_eq!(status, 507, "{policy}: {problem}");
    }
}

/// A tenant queues a request that fits the pool but waits on an accomplice's VM, which never
/// ends. Its own launches never pass its head; other projects' starts do, and after
/// `queue.max_passes` of them the head holds the free GPUs: but for `queue.max_hold_secs` at
/// most, after which other projects launch again where the GPUs are free.
async fn one_project_cannot_hold_other_projects_launches_past_the_bound(store: Store) {
    let (t, head) = a_queue_head_waiting_on_a_vm_that_never_ends(store, 1, "dave").await;
    let app = t.service().app.clone();
    let attacker = t.token("mallory", Role::Member);
    let (other, victim) = (t.token("carol", Role::Member), t.token("alice", Role::Member));
    // Its own launches start, and do not make its head a barrier.
    for _ in 0..3 {
        let (status, vm) = t.post(&attacker, "/v1/vms", &shared(false)).await;
        assert_eq!(status, 202, "{vm}");
    }
    // Two of another project's pass it: now it holds.
    for _ in 0..2 {
        let (status, vm) = t.post(&other, "/v1/vms", &shared(false)).await;
        assert_eq!(status, 202, "{vm}");
    }
    let (status, problem) = t.post(&victim, "/v1/vms", &shared(false)).await;
    assert_eq!(status, 507, "{problem}");
    assert!(problem["detail"].as_str().unwrap().contains("held for requests waiting"));
    // For a second at most.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let (status, vm) = t.post(&victim, "/v1/vms", &shared(false)).await;
    assert_eq!(status, 202, "held past queue.max_hold_secs: {vm}");
    // A round records the hold's end: the head must be passed twice again before it holds.
    app.serve_queue_once().await.expect("a round");
    let (status, vm) = t.post(&victim, "/v1/vms", &shared(false)).await;
    assert_eq!(status, 202, "{vm}");
    let (_, head) = t.get(&attacker, &format!("/v1/vms/{}", head["id"].as_str().unwrap())).await;
    assert_eq!(head["state"], "queued", "{head}");
}

/// A tenant queues four exclusive cGPUs on the four-GPU testbed while its own VM holds one of
/// them: only its own VM keeps the request out, so holding other projects back would not help it.
/// However many of their launches start (more than `queue.max_passes`, for longer than
/// `max_hold_secs`), none is held for it; when its own VM ends, its request starts.
async fn a_head_its_own_projects_vms_keep_out_holds_nobody_back(store: Store) {
    let (t, head) = a_queue_head_waiting_on_a_vm_that_never_ends(store, 600, "mallory").await;
    let app = t.service().app.clone();
    let (mallory, carol) = (t.token("mallory", Role::Member), t.token("carol", Role::Member));
    for round in 0..6 {
        let (status, vm) = t.post(&carol, "/v1/vms", &shared(false)).await;
        assert_eq!(status, 202, "launch {round} held for mallory's head: {vm}");
        let id = vm["id"].as_str().unwrap().to_owned();
        t.wait_state(&carol, &id, "ready").await;
        let (status, body) = t.delete(&carol, &format!("/v1/vms/{id}")).await;
        assert_eq!(status, 202, "{body}");
        t.wait_state(&carol, &id, "deleted").await;
        app.serve_queue_once().await.expect("a round");
    }
    let head_id = head["id"].as_str().unwrap();
    let (_, queued) = t.get(&mallory, &format!("/v1/vms/{head_id}")).await;
    assert_eq!(queued["state"], "queued", "{queued}");
    // Its own VM ends: the request starts.
    let (_, own) = t.get(&mallory, "/v1/vms").await;
    let anchor = own["vms"]
        .as_array()
        .unwrap()
        .iter()
        .find(|vm| vm["id"] != head_id)
        .map(|vm| vm["id"].as_str().unwrap().to_owned())
        .expect("mallory's anchor");
    let (status, body) = t.delete(&mallory, &format!("/v1/vms/{anchor}")).await;
    assert_eq!(status, 202, "{body}");
    t.wait_state(&mallory, &anchor, "deleted").await;
    app.serve_queue_once().await.expect("a round");
    t.wait_state(&mallory, head_id, "ready").await;
}

/// A time that is not ASCII is a 422 naming its parameter, not a panic that closes the connection
/// unanswered (`/v1/usage?start=...%C3%A91:00` did, from any member): characters of two, three
/// and four bytes where a time's zone, digits or separators go, in each time parameter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn times_that_are_not_ascii_are_refused_naming_their_parameter() {
    let t = TestService::start(Store::Sqlite).await;
    let member = t.member();
    for time in [
        "2026-11-01T00:00:00%C3%A91:00",
        "2026-11-01T00:00:00%2B0%C3%A900",
        "2026-11-01T00:00:00%E2%82%AC:00",
        "2026-11-01T00:00:00%F0%9D%9F%99:0",
        "2026-11-0%C3%A9",
        "2026-11-01T0%C3%A9:00:00Z",
    ] {
        for field in ["start", "end"] {
            for path in ["/v1/usage", "/v1/usage/alpha"] {
                let (status, problem) = t.get(&member, &format!("{path}?{field}={time}")).await;
                assert_eq!(status, 422, "{path}?{field}={time}: {problem}");
                assert_eq!(
                    crate::support::fields_at_fault(&problem),
                    [field],
                    "{path}?{field}={time}: {problem}"
                );
            }
        }
    }
}

/// Every GET of the API document, each path parameter and each query parameter given text of
/// several-byte characters (alone, after ASCII, inside a time, a number or a marker), as a member
/// and as an admin: each gets an answer, never a closed connection, and never a 5xx.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_parameter_answers_text_that_is_not_ascii() {
    let t = TestService::start(Store::Sqlite).await;
    let document: Value =
        serde_json::from_str(include_str!("../../../openapi/gsaas.json")).unwrap();
    let values = [
        "é",
        "1é",
        "€:00",
        "𝟙",
        "\u{202e}admin",
        "2026-11-01T00:00:00é1:00",
        "2026-11-01T00:00:00+0é00",
        "00000000-0000-7000-8000-00000000000é",
    ];
    let (member, admin) = (t.member(), t.admin());
    let mut asked = 0;
    for (template, operations) in document["paths"].as_object().unwrap() {
        let Some(get) = operations.get("get") else { continue };
        let parameters: Vec<(&str, &str)> = get["parameters"]
            .as_array()
            .map(|ps| {
                ps.iter()
                    .map(|p| (p["in"].as_str().unwrap(), p["name"].as_str().unwrap()))
                    .collect()
            })
            .unwrap_or_default();
        for value in values {
            let encoded: String = value.bytes().map(|b| format!("%{b:02X}")).collect();
            let mut path = template.clone();
            for (_, name) in parameters.iter().filter(|(place, _)| *place == "path") {
                path = path.replace(&format!("{{{name}}}"), &encoded);
            }
            let queries: Vec<Option<&str>> = std::iter::once(None)
                .chain(parameters.iter().filter(|(p, _)| *p == "query").map(|(_, n)| Some(*n)))
                .collect();
            for query in queries {
                for token in [&member, &admin] {
                    let url = match query {
                        Some(name) => t.url(&format!("{path}?{name}={encoded}")),
                        None => t.url(&path),
                    };
                    let response =
                        t.http.get(url).bearer_auth(token).send().await.unwrap_or_else(|e| {
                            panic!("{path} {query:?}={value:?}: no answer: {e}")
                        });
                    let status = response.status().as_u16();
                    assert!(status < 500, "{path} {query:?}={value:?}: {status}");
                    asked += 1;
                }
            }
        }
    }
    assert!(asked > 300, "only {asked} requests: did the document's paths change?");
}

/// A tenant who may not use an admin's (or an agent's) route learns nothing of it, not even the
/// fields its body takes: 404 before any body is read, whatever it sends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_a_tenant_may_not_use_say_nothing_of_their_bodies() {
    let t = TestService::start(Store::Sqlite).await;
    let member = t.member();
    for body in [json!({}), json!({"bogus": 1}), json!([1]), json!({"cgpus": "many"})] {
        for (method, path) in [
            ("PUT", "/v1/quotas/alpha"),
            ("POST", "/v1/gpus/compute-gpu:0/taint"),
            ("PUT", "/v1/hosts/compute-gpu"),
        ] {
            let url = t.url(path);
            let request = match method {
                "PUT" => t.http.put(url),
                _ => t.http.post(url),
            };
            let response = request.bearer_auth(&member).json(&body).send().await.unwrap();
            let (status, problem) = crate::support::status_json(response).await;
            assert_eq!(status, 404, "{method} {path} {body}: {problem}");
            assert!(problem.get("errors").is_none() && problem.get("field").is_none(), "{problem}");
        }
    }
}

/// Names (of VMs, images, flavors, networks) cannot hide what they say: bidirectional
/// overrides, zero-width and other invisible characters are refused like control characters;
/// a policy layer cannot wrap itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_cannot_hide_what_they_say_and_policies_do_not_nest() {
    let t = TestService::start(Store::Sqlite).await;
    let member = t.member();
    for (field, value) in [
        ("name", "invoice\u{202E}fdp.exe"),
        ("name", "a\u{200B}dmin"),
        ("image", "cirros\u{2066}-0.6.2"),
        ("flavor", "\u{FEFF}m1.small"),
    ] {
        let mut body = shared(false);
        body[field] = json!(value);
        let (status, problem) = t.post(&member, "/v1/vms", &body).await;
        assert_eq!(status, 422, "{value:?}: {problem}");
        assert_eq!(problem["errors"][0]["field"], field, "{problem}");
    }
    for policy in ["fewer-jobs-node+fewer-jobs-node", "fewer-jobs-node+fewer-jobs-node+best-fit"] {
        let mut body = shared(false);
        body["policy"] = json!(policy);
        let (status, problem) = t.post(&member, "/v1/vms", &body).await;
        assert_eq!(status, 422, "{policy}: {problem}");
    }
}
