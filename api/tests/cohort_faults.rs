//! Cohorts under faults and hostile tenants (issue [5/5], part 5): a gsaasd that dies while a
//! loan is taken back, or given back, is finished by the next one without booking a GPU twice; a
//! tenant cannot borrow past its borrowing limit by attaching, by queueing, by its limits per GPU
//! model, on partitions (MIG), or from outside a cohort; and no tenant makes the queue take back
//! what it may not: guaranteed cGPUs, loans for an outsider or for a request that borrows itself.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::{on_both_stores, support};

use gpgpums::HostKind;
use gsaasd::auth::Role;
use gsaasd::config::{InventoryGpu, InventoryPartition};
use serde_json::{json, Value};
use support::agents::{agent_cloud_with, remote_launch, Behaviour, TestAgent};
use support::{shared_launch_with, Store, TestService};

on_both_stores!(
    a_crash_mid_reclaim_is_resumed,
    attaching_cannot_borrow_past_the_borrowing_limit,
    the_queue_never_starts_a_request_past_the_borrowing_limit,
    limits_per_gpu_model_stay_walls_for_borrowers,
    borrowing_on_partitions_passes_no_limit,
    borrowing_outside_a_cohort_is_plain_over_quota,
    only_a_member_within_its_quota_takes_back_loans_and_only_loans,
    capacity_taken_back_for_a_member_goes_to_it_not_to_an_outsider_queued_first,
    an_exclusive_request_past_its_memory_quota_takes_back_no_loan,
    a_borrower_never_skips_ahead_of_a_member_waiting_within_its_quota,
    tenants_learn_nothing_of_cohorts_and_change_none,
);

/// A launch of `ncgpus` whole GPUs, with `extra` fields.
fn exclusive(ncgpus: u32, extra: Value) -> Value {
    let mut body = shared_launch_with(ncgpus, 0, extra);
    body["mode"] = json!("exclusive");
    body["gpu_memory_mib"] = Value::Null;
    body
}

/// [`exclusive`], the VM on the compute-rGPU host of an agent cloud (its routes pushed there).
fn exclusive_remote(ncgpus: u32, extra: Value) -> Value {
    let mut body = remote_launch(ncgpus);
    body["mode"] = json!("exclusive");
    body.as_object_mut().unwrap().remove("gpu_memory_mib");
    let Value::Object(extra) = extra else { panic!("{extra} is no object") };
    for (key, value) in extra {
        body[key] = value;
    }
    body
}

/// Which of the VM's cGPUs (by position) are borrowed.
fn borrowed(vm: &Value) -> Vec<bool> {
    let cgpus = vm["cgpus"].as_array().expect("cgpus");
    cgpus.iter().map(|c| c["borrowed"].as_bool().expect("borrowed is a bool")).collect()
}

fn states(vm: &Value) -> Vec<String> {
    vm["cgpus"].as_array().unwrap().iter().map(|c| c["state"].as_str().unwrap().into()).collect()
}

fn event_kinds(vm: &Value) -> Vec<String> {
    let events = vm["events"].as_array().cloned().unwrap_or_default();
    events.iter().map(|e| e["kind"].as_str().unwrap_or_default().to_owned()).collect()
}

/// The attaches (asked for, or give-backs) waiting beside the VM (left out of its view when none).
fn queued_attaches(vm: &Value) -> usize {
    vm.get("queued_attaches").map_or(0, |q| q.as_array().expect("an array").len())
}

fn count_of(kinds: &[String], kind: &str) -> usize {
    kinds.iter().filter(|k| *k == kind).count()
}

/// The refusal's (limit, in use, requested, cohort).
fn refusal(problem: &Value) -> (u64, u64, u64, Option<&str>) {
    let q = &problem["quota"];
    let n = |k: &str| q[k].as_u64().unwrap_or(u64::MAX);
    (n("limit"), n("in_use"), n("requested"), q["cohort"].as_str())
}

async fn get_vm(t: &TestService, token: &str, id: &str) -> Value {
    let (status, vm) = t.get(token, &format!("/v1/vms/{id}")).await;
    assert_eq!(status, 200, "{vm}");
    vm
}

async fn state_of(t: &TestService, token: &str, id: &str) -> String {
    get_vm(t, token, id).await["state"].as_str().unwrap().to_owned()
}

/// Waits until the VM has `n` cGPUs, all live.
async fn wait_live(t: &TestService, token: &str, vm: &str, n: usize) -> Value {
    t.wait_vm(token, vm, |v| states(v).len() == n && states(v).iter().all(|s| s == "live")).await
}

/// Runs `n` queue rounds now (a round that loses a race with another is simply the next's).
async fn rounds(t: &TestService, n: usize) {
    for _ in 0..n {
        let _ = t.service().app.serve_queue_once().await;
    }
}

/// Serves the queue (and, `reconcile`, resumes sagas) until `done` holds for the VM (bounded:
/// 30 s).
async fn serve_until(
    t: &TestService,
    token: &str,
    id: &str,
    reconcile: bool,
    done: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let app = t.service().app.clone();
        if reconcile {
            app.reconcile_once().await;
        }
        let _ = app.serve_queue_once().await;
        let vm = get_vm(t, token, id).await;
        if done(&vm) {
            return vm;
        }
        assert!(Instant::now() < deadline, "VM {id} never got there: {vm}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn put_quota(t: &TestService, project: &str, limits: Value) {
    let (status, body) = t.put(&t.admin(), &format!("/v1/quotas/{project}"), &limits).await;
    assert_eq!(status, 200, "{project}: {body}");
}

async fn put_cohort(t: &TestService, name: &str, members: Value) -> Value {
    let (status, body) = t.put(&t.admin(), &format!("/v1/cohorts/{name}"), &members).await;
    assert_eq!(status, 200, "{name}: {body}");
    body
}

async fn quota(t: &TestService, project: &str) -> Value {
    let (status, quota) = t.get(&t.admin(), &format!("/v1/quotas/{project}")).await;
    assert_eq!(status, 200, "{quota}");
    quota
}

async fn pool_cgpus(t: &TestService) -> u64 {
    let (_, pool) = t.get(&t.admin(), "/v1/pool").await;
    pool["totals"]["cgpus"].as_u64().unwrap()
}

async fn terminate(t: &TestService, token: &str, id: &str) {
    let (status, body) = t.delete(token, &format!("/v1/vms/{id}")).await;
    assert_eq!(status, 202, "{body}");
    t.wait_state(token, id, "deleted").await;
}

/// The pool's bookings, (GPU, VM) → cGPUs, are exactly what the VMs' admin views hold: no cGPU
/// is booked twice, or for a VM that does not hold it; no exclusive GPU has two VMs; none is
/// fenced.
async fn assert_books_match(t: &TestService, vms: &[&str]) {
    let admin = t.admin();
    let (status, pool) = t.get(&admin, "/v1/pool").await;
    assert_eq!(status, 200, "{pool}");
    let mut booked: BTreeMap<(String, String), u64> = BTreeMap::new();
    for host in pool["hosts"].as_array().unwrap() {
        for gpu in host["gpus"].as_array().unwrap() {
            let holders = gpu["vms"].as_object().unwrap();
            assert_eq!(gpu["fenced"], 0, "{gpu}");
            if gpu["exclusive"] == true {
                assert!(holders.len() <= 1, "an exclusive GPU with two VMs: {gpu}");
            }
            for (vm, n) in holders {
                let key = (gpu["id"].as_str().unwrap().to_owned(), vm.clone());
                booked.insert(key, n.as_u64().unwrap());
            }
        }
    }
    let mut held: BTreeMap<(String, String), u64> = BTreeMap::new();
    for vm in vms {
        for cgpu in t.admin_cgpus(vm).await {
            let key = (cgpu["gpu"].as_str().unwrap().to_owned(), (*vm).to_owned());
            *held.entry(key).or_default() += 1;
        }
    }
    assert_eq!(booked, held, "the pool's bookings against the VMs'");
}

/// Every route the agent holds goes to a GPU of its own (exclusive cGPUs: no GPU serves two).
fn assert_routes_distinct(agent: &TestAgent, n: usize) {
    let routes = agent.routes();
    let targets: std::collections::BTreeSet<_> = routes.iter().map(|(_, t)| *t).collect();
    assert_eq!((routes.len(), targets.len()), (n, n), "{routes:?}");
}

/// Waits until the agent has received a push beyond `seen`.
async fn wait_push(agent: &TestAgent, seen: usize) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while agent.pushes() <= seen {
        assert!(Instant::now() < deadline, "no push arrived");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// gsaasd dies while the agent holds the push that withdraws a loan's route (the reclaim's
/// shrink), and again while it holds the push that gives the loan back; each time the next
/// gsaasd finishes the change: the lender's VM gets the GPU taken back, the borrower keeps its
/// guaranteed cGPUs and gets its loan back later, on loan again, and at every step the pool books
/// exactly what the VMs hold and the agent routes each GPU to one VM.
async fn a_crash_mid_reclaim_is_resumed(store: Store) {
    let (mut t, vm_host, gpu_host) =
        agent_cloud_with(store, 3, |c| c.launch.saga_lease_secs = 1).await;
    let (alpha, beta) = (t.member(), t.token("beta", Role::Member));
    put_quota(&t, "alpha", json!({"exclusive_gpus": 2})).await;
    put_quota(&t, "beta", json!({"exclusive_gpus": 2})).await;
    put_cohort(&t, "lab", json!({"members": {"alpha": {}, "beta": {}}})).await;
    // Alpha takes the three GPUs, its third on loan.
    let loaned = t.launch(&alpha, &exclusive_remote(3, json!({"borrow": true}))).await;
    let ready = t.wait_state(&alpha, &loaned, "ready").await;
    assert_eq!(borrowed(&ready), [false, false, true], "{ready}");
    let guaranteed: Vec<String> =
        t.admin_cgpus(&loaned).await.iter().map(|c| c["gpu"].as_str().unwrap().into()).collect();
    assert_routes_distinct(&vm_host, 3);

    // Beta, within its quota, waits for a GPU: the round takes alpha's loan back, and the agent
    // holds the push that withdraws its route.
    vm_host.set(Behaviour::Stall);
    let seen = vm_host.pushes();
    let (status, queued) =
        t.post(&beta, "/v1/vms", &exclusive_remote(1, json!({"queue": true}))).await;
    assert_eq!((status, queued["state"].as_str()), (202, Some("queued")), "{queued}");
    let served = queued["id"].as_str().unwrap().to_owned();
    rounds(&t, 1).await;
    wait_push(&vm_host, seen).await;
    let mid = get_vm(&t, &t.admin(), &loaned).await;
    assert_eq!(states(&mid), ["live", "live", "detaching"], "{mid}");
    assert_eq!(state_of(&t, &beta, &served).await, "queued", "the GPU is not free yet");
    assert_books_match(&t, &[&loaned, &served]).await;

    t.restart().await;
    vm_host.set(Behaviour::Honest);
    let vm = serve_until(&t, &beta, &served, true, |vm| vm["state"] == "ready").await;
    assert_eq!(borrowed(&vm), [false], "the lender's own: {vm}");
    let shrunk = wait_live(&t, &alpha, &loaned, 2).await;
    assert_eq!(borrowed(&shrunk), [false, false], "{shrunk}");
    let kinds = event_kinds(&shrunk);
    assert_eq!(count_of(&kinds, "loan_reclaimed"), 1, "taken back once: {shrunk}");
    assert_eq!(queued_attaches(&shrunk), 1, "{shrunk}");
    let kept: Vec<String> =
        t.admin_cgpus(&loaned).await.iter().map(|c| c["gpu"].as_str().unwrap().into()).collect();
    assert_eq!(kept, guaranteed[..2], "alpha keeps its guaranteed GPUs");
    let beta_gpu = t.admin_cgpus(&served).await[0]["gpu"].as_str().unwrap().to_owned();
    assert_eq!(beta_gpu, guaranteed[2], "beta got the GPU taken back");
    let (alpha_quota, beta_quota) = (quota(&t, "alpha").await, quota(&t, "beta").await);
    assert_eq!(alpha_quota["usage"]["exclusive_gpus"], 2, "{alpha_quota}");
    assert_eq!(alpha_quota["borrowed"]["exclusive_gpus"], 0, "{alpha_quota}");
    assert_eq!(beta_quota["usage"]["exclusive_gpus"], 1, "{beta_quota}");
    assert_books_match(&t, &[&loaned, &served]).await;
    assert_eq!(pool_cgpus(&t).await, 3);
    assert_routes_distinct(&vm_host, 3);

    // A fourth GPU joins: the loan is given back, and gsaasd dies while the agent holds that
    // push too.
    vm_host.set(Behaviour::Stall);
    let seen = vm_host.pushes();
    let report = support::host_report("cg-1", "compute-gpu", &gpu_host.url, 4);
    let (status, body) = t.report_host(&t.agent_token("cg-1"), "cg-1", &report).await;
    assert_eq!(status, 200, "{body}");
    rounds(&t, 1).await;
    wait_push(&vm_host, seen).await;
    let mid = t.wait_vm(&alpha, &loaned, |vm| states(vm).iter().any(|s| s == "attaching")).await;
    assert_eq!(states(&mid), ["live", "live", "attaching"], "{mid}");
    t.restart().await;
    vm_host.set(Behaviour::Honest);
    let back = serve_until(&t, &alpha, &loaned, true, |vm| {
        states(vm).len() == 3 && states(vm).iter().all(|s| s == "live")
    })
    .await;
    assert_eq!(borrowed(&back), [false, false, true], "given back on loan: {back}");
    let kinds = event_kinds(&back);
    assert_eq!(
        (count_of(&kinds, "loan_reclaimed"), count_of(&kinds, "given_back")),
        (1, 1),
        "{back}"
    );
    assert_eq!(queued_attaches(&back), 0, "{back}");
    let alpha_quota = quota(&t, "alpha").await;
    assert_eq!(alpha_quota["usage"]["exclusive_gpus"], 3, "{alpha_quota}");
    assert_eq!(alpha_quota["borrowed"]["exclusive_gpus"], 1, "{alpha_quota}");
    assert_eq!(state_of(&t, &beta, &served).await, "ready");
    assert_books_match(&t, &[&loaned, &served]).await;
    assert_eq!(pool_cgpus(&t).await, 4);
    assert_routes_distinct(&vm_host, 4);
}

/// Attaches with `borrow: true` stop at the borrowing limit: one that would pass it is refused
/// whole (nothing booked), as is one that does not ask to borrow; two VMs racing for the last
/// cGPU the limit allows get one between them.
async fn attaching_cannot_borrow_past_the_borrowing_limit(store: Store) {
    let t = TestService::start(store).await;
    let alpha = t.member();
    put_quota(&t, "alpha", json!({"cgpus": 2})).await;
    put_quota(&t, "beta", json!({"cgpus": 8})).await;
    let lab = json!({"members": {"alpha": {"borrowing_limit": {"cgpus": 1}}, "beta": {}}});
    put_cohort(&t, "lab", lab).await;
    let vms = [
        t.launch(&alpha, &shared_launch_with(1, 1024, json!({}))).await,
        t.launch(&alpha, &shared_launch_with(1, 1024, json!({}))).await,
    ];
    for vm in &vms {
        t.wait_state(&alpha, vm, "ready").await;
    }
    let attach = |n: u32, borrow: Value| json!({"ncgpus": n, "gpu_memory_mib": 1024, "mode": "shared", "borrow": borrow});
    let path = |vm: &str| format!("/v1/vms/{vm}/cgpus");
    let before = get_vm(&t, &alpha, &vms[0]).await;
    // Two past the quota where one may be borrowed: refused whole.
    let (status, problem) = t.post(&alpha, &path(&vms[0]), &attach(2, json!(true))).await;
    assert_eq!((status, refusal(&problem)), (403, (3, 2, 2, Some("lab"))), "{problem}");
    // Not asking to borrow: the plain quota.
    for borrow in [json!(false), Value::Null] {
        let (status, problem) = t.post(&alpha, &path(&vms[0]), &attach(1, borrow)).await;
        assert_eq!((status, refusal(&problem)), (403, (2, 2, 1, None)), "{problem}");
    }
    assert_eq!(get_vm(&t, &alpha, &vms[0]).await, before, "a refusal changed the VM");
    assert_eq!(pool_cgpus(&t).await, 2);

    // The last cGPU the limit allows, raced for on both VMs: one gets it.
    let racing = (0..8).map(|i| {
        let (t, alpha, vm) = (&t, alpha.clone(), vms[i % 2].clone());
        async move { t.post(&alpha, &format!("/v1/vms/{vm}/cgpus"), &attach(1, json!(true))).await }
    });
    let results = support::join_all(racing).await;
    let statuses: Vec<u16> = results.iter().map(|(s, _)| *s).collect();
    assert_eq!(statuses.iter().filter(|s| **s == 202).count(), 1, "{results:?}");
    for (status, problem) in results.iter().filter(|(s, _)| *s != 202) {
        match status {
            403 => assert_eq!(refusal(problem), (3, 3, 1, Some("lab")), "{problem}"),
            409 => {} // The VM that got it was busy attaching.
            _ => panic!("{status}: {problem}"),
        }
    }
    let mut loans = 0;
    for (vm, n) in [(&vms[0], 1), (&vms[1], 1)] {
        let vm = t
            .wait_vm(&alpha, vm, |v| states(v).len() >= n && states(v).iter().all(|s| s == "live"))
            .await;
        loans += borrowed(&vm).iter().filter(|b| **b).count();
    }
    assert_eq!(loans, 1);
    assert_eq!(quota(&t, "alpha").await["borrowed"]["cgpus"], 1);
    assert_eq!(pool_cgpus(&t).await, 3);
    // Nothing more, by attach or by launch.
    for vm in &vms {
        let (status, problem) = t.post(&alpha, &path(vm), &attach(1, json!(true))).await;
        assert!(matches!(status, 403 | 409), "{status}: {problem}");
    }
    let (status, problem) =
        t.post(&alpha, "/v1/vms", &shared_launch_with(1, 1024, json!({"borrow": true}))).await;
    assert_eq!((status, refusal(&problem)), (403, (3, 3, 1, Some("lab"))), "{problem}");
    assert_eq!(pool_cgpus(&t).await, 3);
}

/// Requests admitted to the queue one by one, each within the borrowing limit on its own: when
/// capacity frees, only as many start as the limit allows together, launches and attaches alike,
/// round after round; terms that lend less keep the rest waiting; lending enough starts it.
async fn the_queue_never_starts_a_request_past_the_borrowing_limit(store: Store) {
    let t = TestService::start_with(store, |c| c.queue.serve_interval_secs = 3600).await;
    let (alpha, gamma) = (t.member(), t.token("gamma", Role::Member));
    put_quota(&t, "alpha", json!({"exclusive_gpus": 1})).await;
    put_quota(&t, "beta", json!({"exclusive_gpus": 4})).await;
    let terms = |borrow: u64, lend: Option<u64>| {
        json!({"members": {
            "alpha": {"borrowing_limit": {"exclusive_gpus": borrow}},
            "beta": {"lending_limit": {"exclusive_gpus": lend}},
        }})
    };
    put_cohort(&t, "lab", terms(1, None)).await;
    let own = t.launch(&alpha, &exclusive(1, json!({}))).await;
    t.wait_state(&alpha, &own, "ready").await;
    // Gamma, outside the cohort, takes the other three GPUs.
    let filler = t.launch(&gamma, &exclusive(3, json!({}))).await;
    t.wait_state(&gamma, &filler, "ready").await;

    // Each within the limit on its own (one past the quota); together three.
    let queued = json!({"queue": true, "borrow": true});
    let first = t.launch(&alpha, &exclusive(1, queued.clone())).await;
    let attach = json!({"ncgpus": 1, "mode": "exclusive", "queue": true, "borrow": true});
    let (status, vm) = t.post(&alpha, &format!("/v1/vms/{own}/cgpus"), &attach).await;
    assert_eq!(status, 202, "{vm}");
    assert_eq!(queued_attaches(&vm), 1, "{vm}");
    let second = t.launch(&alpha, &exclusive(1, queued.clone())).await;
    // Two past the quota at once: refused, not queued.
    let (status, problem) = t.post(&alpha, "/v1/vms", &exclusive(2, queued.clone())).await;
    assert_eq!((status, refusal(&problem)), (403, (2, 1, 2, Some("lab"))), "{problem}");
    for id in [&first, &second] {
        assert_eq!(state_of(&t, &alpha, id).await, "queued");
    }

    // Capacity frees: exactly one of the three starts, on loan.
    terminate(&t, &gamma, &filler).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    let started = loop {
        rounds(&t, 1).await;
        let mut started = 0;
        for id in [&first, &second] {
            started += usize::from(state_of(&t, &alpha, id).await == "ready");
        }
        let own_vm = get_vm(&t, &alpha, &own).await;
        started += usize::from(states(&own_vm).len() == 2);
        if started > 0 {
            break started;
        }
        assert!(Instant::now() < deadline, "nothing started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(started, 1);
    rounds(&t, 3).await;
    let alpha_quota = quota(&t, "alpha").await;
    assert_eq!(alpha_quota["usage"]["exclusive_gpus"], 2, "{alpha_quota}");
    assert_eq!(alpha_quota["borrowed"]["exclusive_gpus"], 1, "{alpha_quota}");
    let waiting = |vm: &Value| vm["state"] == "queued" || queued_attaches(vm) > 0;
    let mut still = 0;
    for id in [&first, &second, &own] {
        still += usize::from(waiting(&get_vm(&t, &alpha, id).await));
    }
    assert_eq!(still, 2, "the two others wait");
    assert_eq!(pool_cgpus(&t).await, 2);

    // A higher borrowing limit with nothing lent: still waiting.
    put_cohort(&t, "lab", terms(3, Some(0))).await;
    rounds(&t, 2).await;
    assert_eq!(quota(&t, "alpha").await["usage"]["exclusive_gpus"], 2);
    assert_eq!(pool_cgpus(&t).await, 2);
    // Lent: both start, on loan.
    put_cohort(&t, "lab", terms(3, None)).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while quota(&t, "alpha").await["usage"]["exclusive_gpus"] != 4 {
        assert!(Instant::now() < deadline, "{}", quota(&t, "alpha").await);
        rounds(&t, 1).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(quota(&t, "alpha").await["borrowed"]["exclusive_gpus"], 3);
}

/// g1: 2 T4 and 2 A100; g2: 2 H100; a compute-rGPU host (as api/tests/fleet.rs's fleet).
async fn fleet(store: Store) -> TestService {
    let gpus = |model: &str, count: u32| InventoryGpu {
        compute_capability: Some("8.0".parse().unwrap()),
        cuda_version: Some("12.4".parse().unwrap()),
        ..InventoryGpu::of(model, 16384, count)
    };
    TestService::start_with(store, |config| {
        config.queue.serve_interval_secs = 3600;
        config.inventory = vec![
            support::inventory_host(
                "g1",
                HostKind::ComputeGpu,
                vec![gpus("T4", 2), gpus("A100", 2)],
            ),
            support::inventory_host("g2", HostKind::ComputeGpu, vec![gpus("H100", 2)]),
            support::inventory_host("r1", HostKind::ComputeRgpu, vec![]),
        ];
    })
    .await
}

/// A project's limit per GPU model holds whatever it borrows (by default here): a launch, an
/// attach or a queued launch past it is refused or waits, while the same request on other
/// models borrows; raising the model's limit lets the waiting one start.
async fn limits_per_gpu_model_stay_walls_for_borrowers(store: Store) {
    let t = fleet(store).await;
    let (alpha, gamma) = (t.member(), t.token("gamma", Role::Member));
    put_quota(&t, "alpha", json!({"cgpus": 1, "models": {"A100": {"cgpus": 1}}})).await;
    put_quota(&t, "beta", json!({"cgpus": 8})).await;
    let lab = json!({"members": {"alpha": {"borrow_by_default": true}, "beta": {}}});
    put_cohort(&t, "lab", lab).await;
    let a100 = |extra: Value| {
        let mut body = shared_launch_with(1, 4096, json!({"gpu_model": "A100"}));
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        body
    };
    // Gamma holds both A100s; alpha queues two launches on them, each within the model's limit.
    let filler = t.launch(&gamma, &exclusive(2, json!({"gpu_model": "A100"}))).await;
    t.wait_state(&gamma, &filler, "ready").await;
    let queued = [
        t.launch(&alpha, &a100(json!({"queue": true}))).await,
        t.launch(&alpha, &a100(json!({"queue": true, "borrow": true}))).await,
    ];
    terminate(&t, &gamma, &filler).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        rounds(&t, 1).await;
        if state_of(&t, &alpha, &queued[0]).await == "ready" {
            break;
        }
        assert!(Instant::now() < deadline, "the first never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    rounds(&t, 3).await;
    assert_eq!(state_of(&t, &alpha, &queued[1]).await, "queued", "one A100 is alpha's limit");
    let usage = quota(&t, "alpha").await;
    assert_eq!(usage["usage"]["models"]["A100"]["cgpus"], 1, "{usage}");

    // At the model's limit: refused naming the model, by launch and by attach, borrow or not.
    let pool_before = pool_cgpus(&t).await;
    for borrow in [json!(true), Value::Null] {
        let (status, problem) = t.post(&alpha, "/v1/vms", &a100(json!({"borrow": borrow}))).await;
        assert_eq!((status, problem["quota"]["model"].as_str()), (403, Some("A100")), "{problem}");
        let body = json!({"ncgpus": 1, "gpu_memory_mib": 4096, "borrow": borrow});
        let (status, problem) =
            t.post(&alpha, &format!("/v1/vms/{}/cgpus", queued[0]), &body).await;
        assert_eq!((status, problem["quota"]["model"].as_str()), (403, Some("A100")), "{problem}");
    }
    assert_eq!(pool_cgpus(&t).await, pool_before);
    // Naming no model: it borrows, on the other models only.
    let elsewhere = t.launch(&alpha, &shared_launch_with(2, 4096, json!({}))).await;
    let vm = t.wait_state(&alpha, &elsewhere, "ready").await;
    assert_eq!(borrowed(&vm), [true, true], "{vm}");
    let models = t.gpu_models_of(&elsewhere).await;
    assert!(!models.contains(&"A100".to_owned()), "{models:?}");

    // Raising the model's limit lets the queued one start, on loan.
    put_quota(&t, "alpha", json!({"cgpus": 1, "models": {"A100": {"cgpus": 2}}})).await;
    let vm = serve_until(&t, &alpha, &queued[1], false, |vm| vm["state"] == "ready").await;
    assert_eq!(borrowed(&vm), [true], "{vm}");
}

/// g1: an A100 of 80 GiB in two `3g.40gb` partitions, and a T4 of 16 GiB; a compute-rGPU host
/// (as api/tests/fleet.rs's partitioned fleet).
async fn partitioned_fleet(store: Store) -> TestService {
    TestService::start_with(store, |config| {
        config.queue.serve_interval_secs = 3600;
        let mut a100 = InventoryGpu::of("A100", 81920, 1);
        a100.partitions = vec![InventoryPartition {
            profile: "3g.40gb".into(),
            memory_mib: 40960,
            count: 2,
            model: None,
            traits: ["CUSTOM_MIG".to_owned()].into(),
        }];
        config.inventory = vec![
            support::inventory_host(
                "g1",
                HostKind::ComputeGpu,
                vec![a100, InventoryGpu::of("T4", 16384, 1)],
            ),
            support::inventory_host("r1", HostKind::ComputeRgpu, vec![]),
        ];
    })
    .await
}

const MIG: &str = "A100 MIG 3g.40gb";

/// A partition is a GPU of its own model and memory: an exclusive one counts its partition's
/// memory, its model's limit stays a wall, and a borrower's exclusive launches (whose memory is
/// known only where they land) stop at its borrowing limit on memory, at once or from the queue.
async fn borrowing_on_partitions_passes_no_limit(store: Store) {
    let t = partitioned_fleet(store).await;
    let (alpha, gamma) = (t.member(), t.token("gamma", Role::Member));
    let limits = |mig: u64| json!({"memory_mib": 40960, "models": {MIG: {"cgpus": mig}}});
    put_quota(&t, "alpha", limits(1)).await;
    put_quota(&t, "beta", json!({"memory_mib": 200000})).await;
    let terms = |borrow: u64| json!({"members": {"alpha": {"borrowing_limit": {"memory_mib": borrow}}, "beta": {}}});
    put_cohort(&t, "lab", terms(16384)).await;
    let on_mig = |extra: Value| {
        let mut body = exclusive(1, json!({"gpu_model": MIG}));
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        body
    };
    let whole = t.launch(&alpha, &on_mig(json!({}))).await;
    assert_eq!(borrowed(&t.wait_state(&alpha, &whole, "ready").await), [false]);
    let usage = quota(&t, "alpha").await;
    assert_eq!(
        (&usage["usage"]["memory_mib"], &usage["usage"]["exclusive_gpus"]),
        (&json!(40960), &json!(1)),
        "an exclusive partition counts its own memory: {usage}"
    );
    // The other partition, whole: the model's limit, borrow or not.
    let (status, problem) = t.post(&alpha, "/v1/vms", &on_mig(json!({"borrow": true}))).await;
    assert_eq!((status, problem["quota"]["model"].as_str()), (403, Some(MIG)), "{problem}");
    // Without the model's limit: 40,960 MiB past the quota, 16,384 may be borrowed.
    put_quota(&t, "alpha", limits(2)).await;
    let (status, problem) = t.post(&alpha, "/v1/vms", &on_mig(json!({"borrow": true}))).await;
    assert_eq!(
        (status, problem["quota"]["resource"].as_str(), refusal(&problem)),
        (403, Some("memory_mib"), (40960 + 16384, 40960, 40960, Some("lab"))),
        "{problem}"
    );
    // Exclusive on the T4 (16,384 past, the whole limit) would fit; an exclusive T4 plus a MiB
    // would not: the shared MiB first, then the T4 is refused where it lands.
    let mib = shared_launch_with(1, 1024, json!({"gpu_model": MIG, "borrow": true}));
    let small = t.launch(&alpha, &mib).await;
    assert_eq!(borrowed(&t.wait_state(&alpha, &small, "ready").await), [true]);
    let t4 = exclusive(1, json!({"gpu_model": "T4", "borrow": true}));
    let (status, problem) = t.post(&alpha, "/v1/vms", &t4).await;
    assert_eq!(
        (status, refusal(&problem)),
        (403, (40960 + 16384, 40960 + 1024, 16384, Some("lab"))),
        "{problem}"
    );
    assert_eq!(pool_cgpus(&t).await, 2, "the refusals booked nothing");

    // From the queue: admitted while the T4 is taken (its memory unknown), it never starts past
    // the limit once the T4 frees.
    let filler = t.launch(&gamma, &exclusive(1, json!({"gpu_model": "T4"}))).await;
    t.wait_state(&gamma, &filler, "ready").await;
    let mut queued = t4.clone();
    queued["queue"] = json!(true);
    let waiting = t.launch(&alpha, &queued).await;
    assert_eq!(state_of(&t, &alpha, &waiting).await, "queued");
    terminate(&t, &gamma, &filler).await;
    rounds(&t, 3).await;
    assert_eq!(state_of(&t, &alpha, &waiting).await, "queued");
    assert_eq!(quota(&t, "alpha").await["usage"]["memory_mib"], 40960 + 1024);
    // Lending enough starts it.
    put_cohort(&t, "lab", terms(16384 + 1024)).await;
    let vm = serve_until(&t, &alpha, &waiting, false, |vm| vm["state"] == "ready").await;
    assert_eq!(borrowed(&vm), [true], "{vm}");
}

/// A project in no cohort that asks to borrow gets the plain quota's refusal, naming no cohort,
/// by launch, attach or queue, whatever others lend; taken out of its cohort while a borrowing
/// launch waits, that launch does not start; put back, it does.
async fn borrowing_outside_a_cohort_is_plain_over_quota(store: Store) {
    let t = TestService::start_with(store, |c| c.queue.serve_interval_secs = 3600).await;
    let (alpha, gamma) = (t.member(), t.token("gamma", Role::Member));
    put_quota(&t, "alpha", json!({"exclusive_gpus": 1})).await;
    put_quota(&t, "beta", json!({"exclusive_gpus": 3})).await;
    put_quota(&t, "carol", json!({"exclusive_gpus": 3})).await;
    let without = json!({"members": {"beta": {}, "carol": {"borrow_by_default": true}}});
    put_cohort(&t, "lab", without.clone()).await;

    let plain = |problem: &Value, expected: (u64, u64, u64)| {
        let (limit, in_use, requested, cohort) = refusal(problem);
        assert_eq!((limit, in_use, requested, cohort), (expected.0, expected.1, expected.2, None));
        assert!(problem["quota"].get("cohort").is_none_or(Value::is_null), "{problem}");
        assert!(!problem["detail"].as_str().unwrap().contains("cohort"), "{problem}");
    };
    let (status, problem) = t.post(&alpha, "/v1/vms", &exclusive(2, json!({"borrow": true}))).await;
    assert_eq!(status, 403, "{problem}");
    plain(&problem, (1, 0, 2));
    let own = t.launch(&alpha, &exclusive(1, json!({"borrow": true}))).await;
    assert_eq!(borrowed(&t.wait_state(&alpha, &own, "ready").await), [false]);
    let attach = json!({"ncgpus": 1, "mode": "exclusive", "borrow": true, "queue": true});
    let (status, problem) = t.post(&alpha, &format!("/v1/vms/{own}/cgpus"), &attach).await;
    assert_eq!(status, 403, "{problem}");
    plain(&problem, (1, 1, 1));
    let queued = json!({"borrow": true, "queue": true});
    let (status, problem) = t.post(&alpha, "/v1/vms", &exclusive(1, queued.clone())).await;
    assert_eq!(status, 403, "{problem}");
    plain(&problem, (1, 1, 1));
    for bad in [json!("yes"), json!(1), json!({})] {
        let (status, problem) =
            t.post(&alpha, "/v1/vms", &exclusive(1, json!({"borrow": bad}))).await;
        assert!(matches!(status, 400 | 422), "{bad}: {status} {problem}");
    }
    let (_, list) = t.get(&alpha, "/v1/vms").await;
    assert_eq!(list["vms"].as_array().unwrap().len(), 1, "nothing was queued: {list}");
    let alpha_quota = quota(&t, "alpha").await;
    assert_eq!(
        (&alpha_quota["cohort"], &alpha_quota["borrowed"]["exclusive_gpus"]),
        (&Value::Null, &json!(0)),
        "{alpha_quota}"
    );

    // In the cohort, alpha queues a borrowing launch; taken out, it waits; put back, it starts.
    let with = json!({"members": {"alpha": {}, "beta": {}, "carol": {"borrow_by_default": true}}});
    put_cohort(&t, "lab", with.clone()).await;
    let filler = t.launch(&gamma, &exclusive(3, json!({}))).await;
    t.wait_state(&gamma, &filler, "ready").await;
    let waiting = t.launch(&alpha, &exclusive(1, queued)).await;
    assert_eq!(state_of(&t, &alpha, &waiting).await, "queued");
    put_cohort(&t, "lab", without).await;
    terminate(&t, &gamma, &filler).await;
    rounds(&t, 3).await;
    assert_eq!(state_of(&t, &alpha, &waiting).await, "queued", "alpha borrows from no cohort");
    assert_eq!(quota(&t, "alpha").await["usage"]["exclusive_gpus"], 1);
    put_cohort(&t, "lab", with).await;
    let vm = serve_until(&t, &alpha, &waiting, false, |vm| vm["state"] == "ready").await;
    assert_eq!(borrowed(&vm), [true], "{vm}");
}

/// Who may make the queue take loans back, and which: with the pool full, an outsider, a member
/// of another cohort and a member whose request borrows itself all wait and shrink nobody; a loan
/// whose borrower is back within its quota (still marked: the marks task has not run) is its
/// own; a member within its quota takes back a loan still past its borrower's quota, one only,
/// and after that nothing more, though the last borrower's cGPUs still fill the pool.
async fn only_a_member_within_its_quota_takes_back_loans_and_only_loans(store: Store) {
    let t = TestService::start_with(store, |c| c.queue.serve_interval_secs = 3600).await;
    let alpha = t.member();
    let [beta, carol, delta, gamma] =
        ["beta", "carol", "delta", "gamma"].map(|p| t.token(p, Role::Member));
    for (project, gpus) in [("alpha", 1), ("beta", 1), ("carol", 2), ("delta", 2), ("eve", 2)] {
        put_quota(&t, project, json!({"exclusive_gpus": gpus})).await;
    }
    let lab = json!({"members": {"alpha": {"borrow_by_default": true}, "beta": {}, "carol": {}}});
    put_cohort(&t, "lab", lab).await;
    put_cohort(&t, "other", json!({"members": {"delta": {}, "eve": {}}})).await;

    // Alpha: one own, one on loan; beta: two, one on loan. Then alpha's own ends: its loan is
    // its own now, though still marked; gamma takes the GPU that freed.
    let alpha_own = t.launch(&alpha, &exclusive(1, json!({}))).await;
    t.wait_state(&alpha, &alpha_own, "ready").await;
    let alpha_loan = t.launch(&alpha, &exclusive(1, json!({}))).await;
    assert_eq!(borrowed(&t.wait_state(&alpha, &alpha_loan, "ready").await), [true]);
    let beta_vm = t.launch(&beta, &exclusive(2, json!({"borrow": true}))).await;
    assert_eq!(borrowed(&t.wait_state(&beta, &beta_vm, "ready").await), [false, true]);
    terminate(&t, &alpha, &alpha_own).await;
    let gamma_vm = t.launch(&gamma, &exclusive(1, json!({}))).await;
    t.wait_state(&gamma, &gamma_vm, "ready").await;
    let marked = get_vm(&t, &alpha, &alpha_loan).await;
    assert_eq!(borrowed(&marked), [true], "still marked: {marked}");
    assert_eq!(quota(&t, "alpha").await["borrowed"]["exclusive_gpus"], 0);

    // The pool is full. An outsider, another cohort's member within its quota, and beta asking to
    // borrow more (admitted: carol lends) wait, and take nothing back.
    let queue = json!({"queue": true});
    let from_gamma = t.launch(&gamma, &exclusive(1, queue.clone())).await;
    let from_delta = t.launch(&delta, &exclusive(1, queue.clone())).await;
    let from_beta = t.launch(&beta, &exclusive(1, json!({"queue": true, "borrow": true}))).await;
    rounds(&t, 3).await;
    for (token, id) in [(&gamma, &from_gamma), (&delta, &from_delta), (&beta, &from_beta)] {
        assert_eq!(state_of(&t, token, id).await, "queued");
    }
    for (token, id, n) in [(&alpha, &alpha_loan, 1), (&beta, &beta_vm, 2)] {
        let vm = get_vm(&t, token, id).await;
        assert_eq!(states(&vm).len(), n, "{vm}");
        assert_eq!(count_of(&event_kinds(&vm), "loan_reclaimed"), 0, "{vm}");
    }
    assert_books_match(&t, &[&alpha_loan, &beta_vm, &gamma_vm]).await;

    // With those gone, carol (within its quota) takes back beta's loan, not alpha's own.
    for (token, id) in [(&gamma, &from_gamma), (&delta, &from_delta), (&beta, &from_beta)] {
        terminate(&t, token, id).await;
    }
    let from_carol = t.launch(&carol, &exclusive(1, queue.clone())).await;
    let vm = serve_until(&t, &carol, &from_carol, false, |vm| vm["state"] == "ready").await;
    assert_eq!(borrowed(&vm), [false], "{vm}");
    let shrunk = wait_live(&t, &beta, &beta_vm, 1).await;
    assert_eq!(borrowed(&shrunk), [false], "{shrunk}");
    assert_eq!(count_of(&event_kinds(&shrunk), "loan_reclaimed"), 1, "{shrunk}");
    let untouched = get_vm(&t, &alpha, &alpha_loan).await;
    let reclaimed = count_of(&event_kinds(&untouched), "loan_reclaimed");
    assert_eq!((states(&untouched).len(), reclaimed), (1, 0), "{untouched}");

    // Carol again, within its quota: nobody holds past its quota now; nothing is taken.
    let again = t.launch(&carol, &exclusive(1, queue)).await;
    rounds(&t, 3).await;
    assert_eq!(state_of(&t, &carol, &again).await, "queued");
    assert_eq!(states(&get_vm(&t, &alpha, &alpha_loan).await).len(), 1);
    let beta_now = get_vm(&t, &beta, &beta_vm).await;
    assert_eq!(states(&beta_now), ["live"], "{beta_now}");
    assert_books_match(&t, &[&alpha_loan, &beta_vm, &gamma_vm, &from_carol]).await;
}

/// An outsider that queued first, holding nothing, does not get the GPU a cohort member's
/// request took back from a borrower: the reclaim was for the member (the queue keeps what it
/// reclaims for the request it reclaimed it for).
async fn capacity_taken_back_for_a_member_goes_to_it_not_to_an_outsider_queued_first(store: Store) {
    let t = TestService::start_with(store, |c| c.queue.serve_interval_secs = 3600).await;
    let (alpha, carol, gamma) =
        (t.member(), t.token("carol", Role::Member), t.token("gamma", Role::Member));
    put_quota(&t, "alpha", json!({"exclusive_gpus": 1})).await;
    put_quota(&t, "carol", json!({"exclusive_gpus": 3})).await;
    put_cohort(&t, "lab", json!({"members": {"alpha": {"borrow_by_default": true}, "carol": {}}}))
        .await;
    let loaned = t.launch(&alpha, &exclusive(3, json!({}))).await;
    assert_eq!(borrowed(&t.wait_state(&alpha, &loaned, "ready").await), [false, true, true]);
    let carol_vm = t.launch(&carol, &exclusive(1, json!({}))).await;
    t.wait_state(&carol, &carol_vm, "ready").await;

    let outsider = t.launch(&gamma, &exclusive(1, json!({"queue": true}))).await;
    let member = t.launch(&carol, &exclusive(1, json!({"queue": true}))).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        rounds(&t, 1).await;
        let states = [state_of(&t, &gamma, &outsider).await, state_of(&t, &carol, &member).await];
        if states.iter().any(|s| s == "ready") {
            break;
        }
        assert!(Instant::now() < deadline, "nothing started: {states:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    rounds(&t, 2).await;
    let (outsider_state, member_state) =
        (state_of(&t, &gamma, &outsider).await, state_of(&t, &carol, &member).await);
    let shrunk = get_vm(&t, &alpha, &loaned).await;
    assert_eq!(
        (outsider_state.as_str(), member_state.as_str(), states(&shrunk).len()),
        ("queued", "ready", 2),
        "the GPU taken back from alpha went to the request it was taken for: {shrunk}"
    );
    assert_books_match(&t, &[&loaned, &carol_vm, &member, &outsider]).await;
}

/// A member's request within its quota waits at the head of the queue (strict order: no
/// backfill). A launch that would borrow, of a higher priority, does not take the free GPU past
/// it, as the planner would not: it queues behind. A launch within its own quota, of that
/// priority, still starts (priorities order what is within quotas, as before).
async fn a_borrower_never_skips_ahead_of_a_member_waiting_within_its_quota(store: Store) {
    let t = TestService::start_with(store, |c| {
        c.queue.serve_interval_secs = 3600;
        c.queue.backfill = false;
    })
    .await;
    let (alpha, beta, gamma) =
        (t.member(), t.token("beta", Role::Member), t.token("gamma", Role::Member));
    put_quota(&t, "alpha", json!({"exclusive_gpus": 1, "max_priority": 5})).await;
    put_quota(&t, "beta", json!({"exclusive_gpus": 4})).await;
    put_quota(&t, "gamma", json!({"exclusive_gpus": 3, "max_priority": 5})).await;
    put_cohort(&t, "lab", json!({"members": {"alpha": {}, "beta": {}}})).await;
    // Alpha holds its one GPU, gamma (outside the cohort) two: one of the four is free.
    let own = t.launch(&alpha, &exclusive(1, json!({}))).await;
    let outsider = t.launch(&gamma, &exclusive(1, json!({}))).await;
    for (token, id) in [(&alpha, &own), (&gamma, &outsider)] {
        t.wait_state(token, id, "ready").await;
    }
    let filler = t.launch(&gamma, &exclusive(1, json!({}))).await;
    t.wait_state(&gamma, &filler, "ready").await;
    // Beta asks for two within its quota: it waits, the queue's head.
    let member = t.launch(&beta, &exclusive(2, json!({"queue": true}))).await;
    assert_eq!(state_of(&t, &beta, &member).await, "queued");
    rounds(&t, 1).await;
    // Alpha's borrower, priority 5, queues behind it rather than taking the free GPU.
    let borrower = t
        .launch(&alpha, &exclusive(1, json!({"borrow": true, "priority": 5, "queue": true})))
        .await;
    assert_eq!(state_of(&t, &alpha, &borrower).await, "queued");
    let (status, refused) =
        t.post(&alpha, "/v1/vms", &exclusive(1, json!({"borrow": true, "priority": 5}))).await;
    assert_eq!(status, 507, "without queueing it is refused for capacity: {refused}");
    rounds(&t, 2).await;
    assert_eq!(state_of(&t, &alpha, &borrower).await, "queued");
    assert_eq!(quota(&t, "alpha").await["borrowed"]["exclusive_gpus"].as_u64(), Some(0));
    // Gamma, past no quota of its own and of priority 5, goes ahead of beta's priority 0.
    gamma_starts_within_its_quota(&t, &gamma).await;
    assert_eq!(state_of(&t, &beta, &member).await, "queued");
    // Gamma's VMs end: beta starts first, then alpha's loan on what is left.
    for id in [&outsider, &filler] {
        terminate(&t, &gamma, id).await;
    }
    serve_until(&t, &beta, &member, false, |vm| vm["state"] == "ready").await;
    let vm = serve_until(&t, &alpha, &borrower, false, |vm| vm["state"] == "ready").await;
    assert_eq!(borrowed(&vm), [true]);
}

/// Gamma's launch of priority 5 within its quota starts at once (the free GPU is its).
async fn gamma_starts_within_its_quota(t: &TestService, gamma: &str) {
    let id = t.launch(gamma, &exclusive(1, json!({"priority": 5}))).await;
    let (status, body) = t.get(gamma, &format!("/v1/vms/{id}")).await;
    assert_eq!(status, 200, "{body}");
    assert_ne!(body["state"], "queued", "{body}");
    t.wait_state(gamma, &id, "ready").await;
    terminate(t, gamma, &id).await;
}

/// A member whose quota limits GPU memory, holding all of it, asks for an exclusive GPU with
/// `borrow: true`: its request is past its quota (the GPU's memory is known where it lands), so
/// it may borrow but not take back another member's loan, and it waits; a member within its quota
/// takes the loan back.
async fn an_exclusive_request_past_its_memory_quota_takes_back_no_loan(store: Store) {
    let t = TestService::start_with(store, |c| c.queue.serve_interval_secs = 3600).await;
    let (alpha, carol, dave, gamma) = (
        t.member(),
        t.token("carol", Role::Member),
        t.token("dave", Role::Member),
        t.token("gamma", Role::Member),
    );
    put_quota(&t, "alpha", json!({"exclusive_gpus": 1})).await;
    put_quota(&t, "carol", json!({"exclusive_gpus": 2, "memory_mib": 16384})).await;
    put_quota(&t, "dave", json!({"memory_mib": 8192})).await;
    let lab = json!({"members": {"alpha": {"borrow_by_default": true}, "carol": {}, "dave": {}}});
    put_cohort(&t, "lab", lab).await;
    let loaned = t.launch(&alpha, &exclusive(2, json!({}))).await;
    assert_eq!(borrowed(&t.wait_state(&alpha, &loaned, "ready").await), [false, true]);
    let dave_vm = t.launch(&dave, &exclusive(1, json!({}))).await;
    t.wait_state(&dave, &dave_vm, "ready").await;
    assert_eq!(quota(&t, "dave").await["usage"]["memory_mib"], 8192, "dave is at its quota");
    let filler = t.launch(&gamma, &exclusive(1, json!({}))).await;
    t.wait_state(&gamma, &filler, "ready").await;

    // Dave's request would borrow 8,192 MiB (carol lends 16,384): admitted to the queue.
    let past = t.launch(&dave, &exclusive(1, json!({"queue": true, "borrow": true}))).await;
    rounds(&t, 3).await;
    let vm = get_vm(&t, &alpha, &loaned).await;
    assert_eq!(
        (states(&vm).len(), count_of(&event_kinds(&vm), "loan_reclaimed")),
        (2, 0),
        "a request past its own quota took a loan back: {vm}"
    );
    assert_eq!(state_of(&t, &dave, &past).await, "queued");
    assert_books_match(&t, &[&loaned, &dave_vm, &filler]).await;

    // Carol, within its quota, does take it back.
    terminate(&t, &dave, &past).await;
    let within = t.launch(&carol, &exclusive(1, json!({"queue": true}))).await;
    serve_until(&t, &carol, &within, false, |vm| vm["state"] == "ready").await;
    let shrunk = wait_live(&t, &alpha, &loaned, 1).await;
    assert_eq!(count_of(&event_kinds(&shrunk), "loan_reclaimed"), 1, "{shrunk}");
}

/// Tenants (and agents) can neither read nor change cohorts, and cannot tell a cohort that
/// exists from one that does not; a member's own views name its cohort only, never the others.
async fn tenants_learn_nothing_of_cohorts_and_change_none(store: Store) {
    let t = TestService::start(store).await;
    let (admin, alpha, beta) = (t.admin(), t.member(), t.token("beta", Role::Member));
    put_quota(&t, "alpha", json!({"cgpus": 1})).await;
    put_quota(&t, "beta", json!({"cgpus": 4})).await;
    let lab = json!({"members": {
        "alpha": {"borrowing_limit": {"cgpus": 1}},
        "beta": {"lending_limit": {"cgpus": 1}},
    }});
    let set = put_cohort(&t, "lab", lab).await;
    let agent = t.agent_token("compute-gpu");
    for token in [&alpha, &beta, &agent] {
        let (exists, _) = t.get(token, "/v1/cohorts/lab").await;
        let (missing, _) = t.get(token, "/v1/cohorts/nothing").await;
        assert!(matches!(exists, 401 | 403 | 404), "{exists}");
        assert_eq!(exists, missing, "a cohort that exists answers as one that does not");
        let (exists, _) = t.delete(token, "/v1/cohorts/lab").await;
        let (missing, _) = t.delete(token, "/v1/cohorts/nothing").await;
        assert!(matches!(exists, 401 | 403 | 404), "{exists}");
        assert_eq!(exists, missing);
        // A member granting itself more, alone or with the others.
        for members in [
            json!({"members": {"alpha": {"borrowing_limit": {"cgpus": 100}}}}),
            json!({"members": {"alpha": {}, "beta": {}}}),
        ] {
            let (status, body) = t.put(token, "/v1/cohorts/lab", &members).await;
            assert!(matches!(status, 401 | 403 | 404), "{status}: {body}");
            let (status, body) = t.put(token, "/v1/cohorts/mine", &members).await;
            assert!(matches!(status, 401 | 403 | 404), "{status}: {body}");
        }
    }
    let (_, now) = t.get(&admin, "/v1/cohorts/lab").await;
    assert_eq!(now, set, "the cohort changed");
    let (_, list) = t.get(&admin, "/v1/cohorts").await;
    assert_eq!(list["cohorts"].as_array().unwrap().len(), 1, "{list}");

    // Alpha's own views name its cohort, not its members or what they lend.
    let (_, own) = t.get(&alpha, "/v1/quotas/alpha").await;
    assert_eq!(own["cohort"], "lab", "{own}");
    let (_, listed) = t.get(&alpha, "/v1/quotas").await;
    let vm = t.launch(&alpha, &shared_launch_with(2, 1024, json!({"borrow": true}))).await;
    let (status, problem) =
        t.post(&alpha, "/v1/vms", &shared_launch_with(1, 1024, json!({"borrow": true}))).await;
    assert_eq!((status, refusal(&problem).3), (403, Some("lab")), "{problem}");
    let ready = t.wait_state(&alpha, &vm, "ready").await;
    for view in [&own, &listed, &problem, &ready] {
        assert!(!view.to_string().contains("beta"), "{view}");
    }
    let (status, _) = t.get(&beta, "/v1/quotas/alpha").await;
    assert_eq!(status, 404, "beta reads alpha's quota");
}
