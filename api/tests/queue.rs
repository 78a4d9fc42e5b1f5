//! The queue: a launch with `"queue": true` that does not fit waits as `queued` (202, with its
//! position) instead of failing with 507; it starts when capacity frees, in priority order, ends
//! with `queue_timeout` when it waits too long, and is cancelled by a termination. Attaches wait
//! the same way beside a running VM, and so do the cGPUs a preemption took, to be given back. On
//! both stores; two replicas serving one queue on PostgreSQL never place a launch twice.

use crate::{on_both_stores, support};

use std::time::Duration;

use gsaasd::auth::Role;
use gsaasd::config::Config;
use serde_json::{json, Value};
use support::{join_all, Store, TestService};

on_both_stores!(
    queued_launches_wait_in_priority_order_start_when_capacity_frees_and_can_be_cancelled,
    a_launch_that_waits_too_long_ends_with_queue_timeout,
    a_higher_priority_launch_takes_cgpus_from_a_preemptible_vm_and_its_owner_sees_why,
    a_queued_attach_waits_beside_its_running_vm_and_starts_when_capacity_frees,
    a_queued_attach_that_waits_too_long_is_cancelled_and_the_vm_keeps_what_it_has,
    a_shrunk_vm_gets_its_cgpus_back_when_capacity_returns_unless_it_opted_out,
    a_project_cannot_fill_the_queue,
    launches_that_skip_the_queue_cannot_starve_its_head,
    only_a_recent_preemption_holds_the_queue_for_its_head
);

/// Tenants may ask for any priority (the default ceiling is 0; see the first test).
fn any_priority(config: &mut Config) {
    config.quotas.max_priority = 100;
}

/// The testbed's four GPUs: two to a ready best-effort (preemptible) VM of `member`'s, two to a
/// ready protected VM of `other`'s.
async fn best_effort_and_protected(t: &TestService, member: &str, other: &str) -> (String, String) {
    let mut best_effort = exclusive(2, false, 0);
    best_effort["preemptible"] = json!(true);
    let best_effort = t.launch(member, &best_effort).await;
    let protected = t.launch(other, &exclusive(2, false, 0)).await;
    t.wait_state(member, &best_effort, "ready").await;
    t.wait_state(other, &protected, "ready").await;
    (best_effort, protected)
}

fn exclusive(ncgpus: u32, queue: bool, priority: i32) -> Value {
    json!({
        "name": "queued", "image": "cirros-0.6.2", "flavor": "m1.small",
        "ncgpus": ncgpus, "mode": "exclusive", "queue": queue, "priority": priority
    })
}

async fn position(t: &TestService, token: &str, id: &str) -> Value {
    let (status, vm) = t.get(token, &format!("/v1/vms/{id}")).await;
    assert_eq!(status, 200, "{vm}");
    vm["queue_position"].clone()
}

async fn queued_launches_wait_in_priority_order_start_when_capacity_frees_and_can_be_cancelled(
    store: Store,
) {
    let t = TestService::start(store).await;
    let (admin, member) = (t.admin(), t.member());
    // The testbed's four GPUs, all taken.
    let big = t.launch(&member, &exclusive(4, false, 0)).await;
    t.wait_state(&member, &big, "ready").await;

    // Without the queue: 507, as before. With it: 202, queued, first in line.
    let (status, problem) = t.post(&member, "/v1/vms", &exclusive(1, false, 0)).await;
    assert_eq!((status, problem["code"].as_str()), (507, Some("insufficient_gpu_capacity")));
    let (status, first) = t.post(&member, "/v1/vms", &exclusive(1, true, 0)).await;
    assert_eq!(status, 202, "{first}");
    assert_eq!(
        (first["state"].as_str(), first["queue_position"].as_u64()),
        (Some("queued"), Some(1))
    );
    assert_eq!(first["cgpus"], json!([]));
    let first = first["id"].as_str().unwrap().to_owned();
    let second = t.launch(&member, &exclusive(1, true, 0)).await;
    // Priorities above 0 are the admins' to give (the project's quota's max_priority): asked for
    // without, 403 naming the field, and nothing is queued.
    let (status, problem) = t.post(&member, "/v1/vms", &exclusive(1, true, 7)).await;
    assert_eq!((status, problem["code"].as_str()), (403, Some("quota_exceeded")), "{problem}");
    assert_eq!(problem["field"], "priority", "{problem}");
    assert!(problem["detail"].as_str().unwrap().contains("max_priority, 0"), "{problem}");
    let (_, queue) = t.get(&admin, "/v1/queue").await;
    assert_eq!(queue["lengths"], json!([{"priority": 0, "waiting": 2}]), "{queue}");
    let (status, quota) = t.put(&admin, "/v1/quotas/alpha", &json!({"max_priority": 7})).await;
    assert_eq!((status, &quota["limits"]["max_priority"]), (200, &json!(7)), "{quota}");
    let (status, problem) = t.post(&member, "/v1/vms", &exclusive(1, true, 8)).await;
    assert_eq!((status, problem["field"].as_str()), (403, Some("priority")), "{problem}");
    // Next to its GPUs (locality local): its host is known only once it is placed.
    let mut local = exclusive(1, true, 7);
    local["locality"] = json!("local");
    let urgent = t.launch(&member, &local).await;
    assert_eq!(position(&t, &member, &urgent).await, 1);
    assert_eq!(position(&t, &member, &first).await, 2);
    assert_eq!(position(&t, &member, &second).await, 3);

    // Bad priorities are refused, naming the field; other tenants see nothing of the queue.
    for priority in [-1, 101] {
        let (status, problem) = t.post(&member, "/v1/vms", &exclusive(1, true, priority)).await;
        assert!(matches!(status, 400 | 422), "{problem}");
        assert_eq!(problem["field"], "priority", "{problem}");
    }
    let other = t.token("beta", Role::Member);
    let (status, _) = t.get(&other, &format!("/v1/vms/{urgent}")).await;
    assert_eq!(status, 404);

    // The queue as a whole, in the order it is served; the list shows each VM's place too.
    let (status, queue) = t.get(&member, "/v1/queue").await;
    assert_eq!(status, 200, "{queue}");
    let order: Vec<(&str, u64, &str)> = queue["requests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["vm"].as_str().unwrap(),
                r["position"].as_u64().unwrap(),
                r["kind"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        order,
        [(&urgent[..], 1, "launch"), (&first[..], 2, "launch"), (&second[..], 3, "launch")]
    );
    assert_eq!(queue["requests"][0]["ncgpus"], 1, "{queue}");
    let lengths = json!([{"priority": 7, "waiting": 1}, {"priority": 0, "waiting": 2}]);
    assert_eq!(queue["lengths"], lengths, "{queue}");
    let (_, list) = t.get(&member, "/v1/vms").await;
    let listed = list["vms"].as_array().unwrap().iter().find(|vm| vm["id"] == second[..]);
    assert_eq!(listed.unwrap()["queue_position"], 3, "{list}");
    // Another tenant sees how long the queue is, but none of it.
    let (_, theirs) = t.get(&other, "/v1/queue").await;
    assert_eq!((theirs["requests"].clone(), theirs["lengths"].clone()), (json!([]), lengths));

    // Terminating a queued VM cancels it.
    let (status, cancelled) = t.delete(&member, &format!("/v1/vms/{second}")).await;
    assert_eq!((status, cancelled["state"].as_str()), (202, Some("deleted")), "{cancelled}");
    assert_eq!(position(&t, &member, &second).await, Value::Null);
    let (_, metrics) = scrape(&t, &admin).await;
    assert!(metrics.contains("gsaas_queue_length{priority=\"7\"} 1"), "{metrics}");
    assert!(metrics.contains("gsaas_vms{state=\"queued\"} 2"), "{metrics}");

    // Capacity frees: the queued launches start, highest priority first, and become ready.
    let (status, _) = t.delete(&member, &format!("/v1/vms/{big}")).await;
    assert_eq!(status, 202);
    let urgent_vm = t.wait_state(&member, &urgent, "ready").await;
    let first_vm = t.wait_state(&member, &first, "ready").await;
    assert_eq!(urgent_vm["cgpus"].as_array().unwrap().len(), 1);
    assert_eq!(first_vm["queue_position"], Value::Null);
    let (_, second_vm) = t.get(&member, &format!("/v1/vms/{second}")).await;
    assert_eq!(second_vm["state"], "deleted", "a cancelled launch started: {second_vm}");
    let (_, metrics) = scrape(&t, &admin).await;
    assert!(metrics.contains("gsaas_queue_wait_seconds_count 2"), "{metrics}");
    assert!(!metrics.contains("gsaas_queue_length{"), "{metrics}");
    let (_, pool) = t.get(&admin, "/v1/pool").await;
    assert_eq!(pool["totals"]["cgpus"], 2, "{pool}");
}

async fn scrape(t: &TestService, admin: &str) -> (u16, String) {
    let r = t.http.get(t.url("/metrics")).bearer_auth(admin).send().await.unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

async fn a_launch_that_waits_too_long_ends_with_queue_timeout(store: Store) {
    let t = TestService::start_with(store, |config| {
        any_priority(config);
        config.queue.queue_timeout_secs = 1;
        config.queue.serve_interval_secs = 1;
    })
    .await;
    let member = t.member();
    let big = t.launch(&member, &exclusive(4, false, 0)).await;
    t.wait_state(&member, &big, "ready").await;
    let waiting = t.launch(&member, &exclusive(1, true, 0)).await;
    let vm = t.wait_state(&member, &waiting, "error").await;
    assert_eq!(vm["error_code"], "queue_timeout", "{vm}");
    assert!(vm["error"].as_str().unwrap().contains("queue_timeout_secs"), "{vm}");
    assert_eq!(vm["cgpus"], json!([]));
    // It holds nothing and leaves the queue: freed capacity goes to nobody.
    let (status, _) = t.delete(&member, &format!("/v1/vms/{big}")).await;
    assert_eq!(status, 202);
    t.wait_state(&member, &big, "deleted").await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (_, vm) = t.get(&member, &format!("/v1/vms/{waiting}")).await;
    assert_eq!(vm["state"], "error", "{vm}");
}

/// Two replicas on one PostgreSQL, launches queued through both: when capacity frees, both serve
/// the queue, and every GPU goes to one launch only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_serve_one_queue_without_placing_anything_twice() {
    let (a, b) = TestService::two_replicas().await;
    let member = a.member();
    let big = a.launch(&member, &exclusive(4, false, 0)).await;
    a.wait_state(&member, &big, "ready").await;
    let launches = join_all((0..8).map(|i| {
        let (t, member) = (if i % 2 == 0 { &a } else { &b }, member.clone());
        async move { t.launch(&member, &exclusive(1, true, 0)).await }
    }))
    .await;
    let (status, _) = b.delete(&member, &format!("/v1/vms/{big}")).await;
    assert_eq!(status, 202);
    a.wait_state(&member, &big, "deleted").await;
    // Four start, on four distinct GPUs; four still wait.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let mut ready = 0;
        let mut queued = 0;
        for id in &launches {
            let (_, vm) = a.get(&member, &format!("/v1/vms/{id}")).await;
            match vm["state"].as_str() {
                Some("ready") => ready += 1,
                Some("queued") => queued += 1,
                _ => {}
            }
        }
        if ready == 4 && queued == 4 {
            break;
        }
        assert!(ready <= 4, "more launches started than there are GPUs");
        assert!(std::time::Instant::now() < deadline, "{ready} ready, {queued} queued");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (_, pool) = b.get(&a.admin(), "/v1/pool").await;
    assert_eq!(
        (pool["totals"]["cgpus"].as_u64(), pool["totals"]["idle_gpus"].as_u64()),
        (Some(4), Some(0)),
        "{pool}"
    );
    // One server each: the replica whose round started a launch took its saga (the one that
    // accepted it holds none while it waits), so no launch ran twice.
    let servers = a.service().sim.as_ref().expect("the simulated cloud").servers();
    assert_eq!(servers.len(), 4, "{servers:?}");
}

async fn a_higher_priority_launch_takes_cgpus_from_a_preemptible_vm_and_its_owner_sees_why(
    store: Store,
) {
    let t = TestService::start_with(store, any_priority).await;
    let (admin, member) = (t.admin(), t.member());
    let other = t.token("beta", Role::Member);
    let (best_effort, protected) = best_effort_and_protected(&t, &member, &other).await;

    // Equal priority takes nothing: it waits.
    let equal = t.launch(&other, &exclusive(1, true, 0)).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(position(&t, &other, &equal).await, 1);
    let (_, vm) = t.get(&member, &format!("/v1/vms/{best_effort}")).await;
    assert_eq!(vm["cgpus"].as_array().unwrap().len(), 2, "{vm}");

    // Higher priority takes one cGPU from the preemptible VM, never from the protected one.
    let urgent = t.launch(&other, &exclusive(1, true, 9)).await;
    t.wait_state(&other, &urgent, "ready").await;
    let shrunk = t
        .wait_vm(&member, &best_effort, |vm| vm["cgpus"].as_array().is_some_and(|c| c.len() == 1))
        .await;
    assert_eq!(shrunk["state"], "ready", "{shrunk}");
    assert_eq!(shrunk["rcuda_env"]["RCUDA_DEVICE_COUNT"], "1", "{shrunk}");
    let events = shrunk["events"].as_array().expect("events");
    assert_eq!(events.len(), 1, "{shrunk}");
    assert_eq!(events[0]["kind"], "preempted");
    assert!(events[0]["at_ms"].as_i64().unwrap() > 0);
    assert!(events[0]["detail"].as_str().unwrap().contains("higher priority"), "{shrunk}");
    let (_, kept) = t.get(&other, &format!("/v1/vms/{protected}")).await;
    assert_eq!(kept["cgpus"].as_array().unwrap().len(), 2, "{kept}");
    assert!(kept.get("events").is_none(), "{kept}");
    // The equal-priority launch still waits; the pool holds exactly what the VMs hold.
    assert_eq!(position(&t, &other, &equal).await, 1);
    let (_, pool) = t.get(&admin, "/v1/pool").await;
    assert_eq!(pool["totals"]["cgpus"], 4, "{pool}");
}

fn attach(ncgpus: u32, queue: bool) -> Value {
    json!({ "ncgpus": ncgpus, "mode": "exclusive", "queue": queue })
}

async fn get_vm(t: &TestService, token: &str, id: &str) -> Value {
    let (status, vm) = t.get(token, &format!("/v1/vms/{id}")).await;
    assert_eq!(status, 200, "{vm}");
    vm
}

fn cgpu_count(vm: &Value) -> usize {
    vm["cgpus"].as_array().map_or(0, Vec::len)
}

fn event_kinds(vm: &Value) -> Vec<String> {
    let events = vm["events"].as_array().cloned().unwrap_or_default();
    events.iter().map(|e| e["kind"].as_str().unwrap_or_default().to_owned()).collect()
}

async fn a_queued_attach_waits_beside_its_running_vm_and_starts_when_capacity_frees(store: Store) {
    let t = TestService::start_with(store, any_priority).await;
    let (admin, member) = (t.admin(), t.member());
    let big = t.launch(&member, &exclusive(2, false, 0)).await;
    let small = t.launch(&member, &exclusive(1, false, 0)).await;
    let doomed = t.launch(&member, &exclusive(1, false, 0)).await;
    for id in [&big, &small, &doomed] {
        t.wait_state(&member, id, "ready").await;
    }
    let cgpus = |id: &str| format!("/v1/vms/{id}/cgpus");

    // Without the queue: 507, nothing changes. With it: 202, the VM runs on as it is.
    let (status, problem) = t.post(&member, &cgpus(&small), &attach(1, false)).await;
    assert_eq!((status, problem["code"].as_str()), (507, Some("insufficient_gpu_capacity")));
    let keyed = |body: &Value| {
        t.http
            .post(t.url(&cgpus(&small)))
            .bearer_auth(&member)
            .header("Idempotency-Key", "grow-small")
            .json(body)
            .send()
    };
    let (status, vm) = support::status_json(keyed(&attach(1, true)).await.unwrap()).await;
    assert_eq!(status, 202, "{vm}");
    assert_eq!((vm["state"].as_str(), cgpu_count(&vm)), (Some("ready"), 1), "{vm}");
    assert_eq!(vm["queue_position"], 1, "{vm}");
    let queued = vm["queued_attaches"].as_array().expect("queued attaches");
    assert_eq!(queued.len(), 1, "{vm}");
    assert_eq!(
        (queued[0]["kind"].as_str(), queued[0]["ncgpus"].as_u64()),
        (Some("attach"), Some(1))
    );
    assert!(
        queued[0]["deadline_ms"].as_i64().unwrap() > queued[0]["enqueued_ms"].as_i64().unwrap()
    );
    // A retry with the same key queues nothing more.
    let (status, again) = support::status_json(keyed(&attach(1, true)).await.unwrap()).await;
    assert_eq!(status, 202, "{again}");
    assert_eq!(again["queued_attaches"].as_array().map(Vec::len), Some(1), "{again}");
    // Another tenant can neither see nor grow the VM.
    let other = t.token("beta", Role::Member);
    let (status, _) = t.post(&other, &cgpus(&small), &attach(1, true)).await;
    assert_eq!(status, 404);

    // A VM terminated while its attach waits takes the attach with it (checked at the end).
    let (status, _) = t.post(&member, &cgpus(&doomed), &attach(1, true)).await;
    assert_eq!(status, 202);
    let (_, metrics) = scrape(&t, &admin).await;
    assert!(metrics.contains("gsaas_queue_length{priority=\"0\"} 2"), "{metrics}");
    assert!(metrics.contains("gsaas_cgpu_attaches_total{outcome=\"queued\"} 2"), "{metrics}");
    let (status, _) = t.delete(&member, &format!("/v1/vms/{doomed}")).await;
    assert_eq!(status, 202);
    // At once, not at a later round or the VM's release: a terminated VM's attach neither counts
    // against its project's waiting requests nor holds others back as the queue's head.
    let (_, metrics) = scrape(&t, &admin).await;
    assert!(metrics.contains("gsaas_queue_length{priority=\"0\"} 1"), "{metrics}");
    t.wait_state(&member, &doomed, "deleted").await;

    // The freed GPU went to the waiting attach: it is routed, and the owner sees how it came;
    // nothing waits any more.
    let grown = t
        .wait_vm(&member, &small, |vm| {
            vm["cgpus"]
                .as_array()
                .is_some_and(|c| c.len() == 2 && c.iter().all(|c| c["state"] == "live"))
        })
        .await;
    assert_eq!(grown["rcuda_env"]["RCUDA_DEVICE_COUNT"], "2", "{grown}");
    assert!(grown.get("queued_attaches").is_none() && grown["queue_position"].is_null(), "{grown}");
    assert_eq!(event_kinds(&grown), ["attached"], "{grown}");
    let (_, pool) = t.get(&admin, "/v1/pool").await;
    assert_eq!(pool["totals"]["cgpus"], 4, "{pool}");
    let (_, metrics) = scrape(&t, &admin).await;
    assert!(!metrics.contains("gsaas_queue_length{"), "{metrics}");
}

async fn a_queued_attach_that_waits_too_long_is_cancelled_and_the_vm_keeps_what_it_has(
    store: Store,
) {
    let t = TestService::start_with(store, |config| {
        any_priority(config);
        config.queue.queue_timeout_secs = 1;
        config.queue.serve_interval_secs = 1;
    })
    .await;
    let member = t.member();
    let vm = t.launch(&member, &exclusive(4, false, 0)).await;
    t.wait_state(&member, &vm, "ready").await;
    let (status, _) = t.post(&member, &format!("/v1/vms/{vm}/cgpus"), &attach(1, true)).await;
    assert_eq!(status, 202);
    let ended = t.wait_vm(&member, &vm, |vm| !event_kinds(vm).is_empty()).await;
    assert_eq!(event_kinds(&ended), ["queue_timeout"], "{ended}");
    assert!(ended["events"][0]["detail"].as_str().unwrap().contains("queue_timeout_secs"));
    assert_eq!((ended["state"].as_str(), cgpu_count(&ended)), (Some("ready"), 4), "{ended}");
    assert!(ended.get("queued_attaches").is_none(), "{ended}");
}

async fn a_shrunk_vm_gets_its_cgpus_back_when_capacity_returns_unless_it_opted_out(store: Store) {
    let t = TestService::start_with(store, any_priority).await;
    let (admin, member) = (t.admin(), t.member());
    let other = t.token("beta", Role::Member);
    let (giving, _protected) = best_effort_and_protected(&t, &member, &other).await;

    // A launch of higher priority takes one cGPU; what was taken waits to come back, as long as
    // any queued request may wait.
    let urgent = t.launch(&other, &exclusive(1, true, 9)).await;
    t.wait_state(&other, &urgent, "ready").await;
    let shrunk = t
        .wait_vm(&member, &giving, |vm| cgpu_count(vm) == 1 && vm.get("queued_attaches").is_some())
        .await;
    let queued = &shrunk["queued_attaches"][0];
    assert_eq!((queued["kind"].as_str(), queued["ncgpus"].as_u64()), (Some("give_back"), Some(1)));
    let waits = queued["deadline_ms"].as_i64().unwrap() - queued["enqueued_ms"].as_i64().unwrap();
    assert_eq!(waits, 3_600_000, "{shrunk}");
    assert!(shrunk["events"][0]["detail"].as_str().unwrap().contains("given back when"));

    // Capacity returns: the cGPU comes back, routed, and the owner sees both events.
    let (status, _) = t.delete(&other, &format!("/v1/vms/{urgent}")).await;
    assert_eq!(status, 202);
    let back = t
        .wait_vm(&member, &giving, |vm| {
            cgpu_count(vm) == 2
                && vm["cgpus"].as_array().unwrap().iter().all(|c| c["state"] == "live")
        })
        .await;
    assert_eq!(event_kinds(&back), ["preempted", "given_back"], "{back}");
    let (_, list) = t.get(&member, "/v1/vms").await;
    let listed = list["vms"].as_array().unwrap().iter().find(|vm| vm["id"] == giving[..]);
    assert_eq!(event_kinds(listed.unwrap()), ["preempted", "given_back"], "{list}");
    assert_eq!(back["rcuda_env"]["RCUDA_DEVICE_COUNT"], "2", "{back}");
    assert!(back.get("queued_attaches").is_none(), "{back}");

    // A VM that opted out keeps what is left of it, and nothing waits for it.
    let (status, _) = t.delete(&member, &format!("/v1/vms/{giving}")).await;
    assert_eq!(status, 202);
    t.wait_state(&member, &giving, "deleted").await;
    let mut no_give_back = exclusive(2, false, 0);
    no_give_back["preemptible"] = json!(true);
    no_give_back["give_back"] = json!(false);
    let keeping = t.launch(&member, &no_give_back).await;
    let vm = t.wait_state(&member, &keeping, "ready").await;
    assert_eq!((vm["preemptible"].as_bool(), vm["give_back"].as_bool()), (Some(true), Some(false)));
    let urgent = t.launch(&other, &exclusive(1, true, 9)).await;
    t.wait_state(&other, &urgent, "ready").await;
    let shrunk = t
        .wait_vm(&member, &keeping, |vm| cgpu_count(vm) == 1 && vm["cgpus"][0]["state"] == "live")
        .await;
    assert!(shrunk["events"][0]["detail"].as_str().unwrap().contains("not given back"));
    let (status, _) = t.delete(&other, &format!("/v1/vms/{urgent}")).await;
    assert_eq!(status, 202);
    t.wait_state(&other, &urgent, "deleted").await;
    let round = t.service().app.serve_queue_once().await.expect("a round");
    assert_eq!(round.waiting, 0, "{round:?}");
    let kept = get_vm(&t, &member, &keeping).await;
    assert_eq!((cgpu_count(&kept), event_kinds(&kept).len()), (1, 1), "{kept}");
    let (_, pool) = t.get(&admin, "/v1/pool").await;
    assert_eq!(pool["totals"]["cgpus"], 3, "{pool}");
}

async fn a_project_cannot_fill_the_queue(store: Store) {
    let t = TestService::start_with(store, |config| {
        any_priority(config);
        config.queue.max_waiting_per_project = 2;
    })
    .await;
    let member = t.member();
    let vm = t.launch(&member, &exclusive(4, false, 0)).await;
    t.wait_state(&member, &vm, "ready").await;
    t.launch(&member, &exclusive(1, true, 0)).await;
    let (status, _) = t.post(&member, &format!("/v1/vms/{vm}/cgpus"), &attach(1, true)).await;
    assert_eq!(status, 202);
    let (status, problem) = t.post(&member, "/v1/vms", &exclusive(1, true, 0)).await;
    assert_eq!(status, 429, "{problem}");
    assert!(problem["detail"].as_str().unwrap().contains("max_waiting_per_project"), "{problem}");
    let (status, problem) = t.post(&member, &format!("/v1/vms/{vm}/cgpus"), &attach(1, true)).await;
    assert_eq!(status, 429, "{problem}");
    // Other projects still queue.
    let other = t.token("beta", Role::Member);
    let (status, vm) = t.post(&other, "/v1/vms", &exclusive(1, true, 0)).await;
    assert_eq!((status, vm["state"].as_str()), (202, Some("queued")), "{vm}");
}

/// Launches of other projects that do not wait in the queue pass its head like backfill does, a
/// bounded number of times; then they are held (507, or queued with `queue: true`) until it
/// starts (for at most `queue.max_hold_secs`), unless they are of higher priority.
async fn launches_that_skip_the_queue_cannot_starve_its_head(store: Store) {
    let t = TestService::start_with(store, |config| {
        any_priority(config);
        config.queue.max_passes = 2;
        config.queue.serve_interval_secs = 3600;
    })
    .await;
    let member = t.member();
    let other = t.token("beta", Role::Member);
    let third = t.token("gamma", Role::Member);
    let app = t.service().app.clone();
    // Another project's VM is what the head waits on (one its own VMs keep out holds nobody).
    let big = t.launch(&third, &exclusive(3, false, 0)).await;
    t.wait_state(&third, &big, "ready").await;
    // Two GPUs wanted, one free: the head.
    let head = t.launch(&member, &exclusive(2, true, 0)).await;
    app.serve_queue_once().await.expect("a round");
    // Two small launches pass it, each taking the free GPU and giving it back.
    for _ in 0..2 {
        let (status, small) = launch_and_end(&t, &other).await;
        assert_eq!(status, 202, "{small}");
        app.serve_queue_once().await.expect("a round");
    }
    // The third is held: the free GPU is the head's to wait for.
    let (status, problem) = t.post(&other, "/v1/vms", &exclusive(1, false, 0)).await;
    assert_eq!((status, problem["code"].as_str()), (507, Some("insufficient_gpu_capacity")));
    assert!(problem["detail"].as_str().unwrap().contains("held for requests waiting"), "{problem}");
    let (status, behind) = t.post(&other, "/v1/vms", &exclusive(1, true, 0)).await;
    assert_eq!((status, behind["state"].as_str()), (202, Some("queued")), "{behind}");
    assert_eq!(behind["queue_position"], 2, "{behind}");
    // A request of higher priority goes first.
    let urgent = t.launch(&member, &exclusive(1, false, 3)).await;
    t.wait_state(&member, &urgent, "ready").await;
    // Capacity frees: the head starts first.
    for (owner, id) in [(&third, &big), (&member, &urgent)] {
        let (status, _) = t.delete(owner, &format!("/v1/vms/{id}")).await;
        assert_eq!(status, 202);
    }
    t.wait_state(&member, &head, "ready").await;
    let behind = behind["id"].as_str().unwrap();
    t.wait_state(&other, behind, "ready").await;
}

/// Launches one exclusive cGPU without the queue; if accepted, waits until it is ready, then
/// terminates it and waits until it is deleted. The launch's status and answer.
async fn launch_and_end(t: &TestService, member: &str) -> (u16, Value) {
    let (status, vm) = t.post(member, "/v1/vms", &exclusive(1, false, 0)).await;
    if status == 202 {
        let id = vm["id"].as_str().unwrap();
        t.wait_state(member, id, "ready").await;
        let (status, _) = t.delete(member, &format!("/v1/vms/{id}")).await;
        assert_eq!(status, 202);
        t.wait_state(member, id, "deleted").await;
    }
    (status, vm)
}

/// While the cGPUs a preemption takes are detached, the head of the queue waits for them and
/// holds others back; a detach that is stuck (its host down) holds it only for
/// `queue.reclaim_wait_secs`, and an owner's own detach never does.
async fn only_a_recent_preemption_holds_the_queue_for_its_head(store: Store) {
    let t = TestService::start_with(store, |config| {
        any_priority(config);
        config.queue.serve_interval_secs = 3600;
        config.queue.reclaim_wait_secs = 60;
    })
    .await;
    let member = t.member();
    let app = t.service().app.clone();
    let big = t.launch(&member, &exclusive(2, false, 0)).await;
    let small = t.launch(&member, &exclusive(1, false, 0)).await;
    t.wait_state(&member, &big, "ready").await;
    t.wait_state(&member, &small, "ready").await;
    // Two GPUs wanted, one free: the head; `small`'s GPU is stuck detaching (set here, as a
    // host that does not answer would leave it).
    let head = t.launch(&member, &exclusive(2, true, 0)).await;
    let stuck = |reclaimed_ms: Option<i64>| {
        let app = app.clone();
        let small = small.clone();
        async move {
            let mut conn = app.db.conn().await.unwrap();
            sqlx::query("UPDATE cgpus SET state = 'detaching', reclaimed_ms = $1 WHERE vm = $2")
                .bind(reclaimed_ms)
                .bind(&small)
                .execute(&mut *conn)
                .await
                .unwrap();
        }
    };
    let now = gsaasd::db::now_ms();
    for (reclaimed_ms, holds) in
        [(None, false), (Some(now - 61_000), false), (Some(now), true), (None, false)]
    {
        stuck(reclaimed_ms).await;
        app.serve_queue_once().await.expect("a round");
        let (status, problem) = launch_and_end(&t, &member).await;
        if holds {
            assert_eq!(status, 507, "{reclaimed_ms:?}: {problem}");
            assert!(problem["detail"].as_str().unwrap().contains("held for requests waiting"));
        } else {
            assert_eq!(status, 202, "{reclaimed_ms:?}: {problem}");
        }
    }
    let (_, vm) = t.get(&member, &format!("/v1/vms/{head}")).await;
    assert_eq!(vm["state"], "queued", "{vm}");
}
