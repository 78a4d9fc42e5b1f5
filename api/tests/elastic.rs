//! cGPUs attached to and detached from running VMs: the dissertation's progressive attach through
//! the API, bad requests that change nothing, Idempotency-Keys, one change at a time per VM,
//! terminations that take over, an agent that refuses the new routes, and a crash in the middle
//! of each, resumed on SQLite and PostgreSQL.

use crate::{on_both_stores, support};

use std::net::SocketAddrV4;
use std::time::{Duration, Instant};

use rodvr_contract::protocol::VmPort;
use serde_json::{json, Value};
use support::agents::{agent_cloud, agent_cloud_with, remote_launch, Behaviour, TestAgent};
use support::{rcuda_address, shared_launch, Store, TestService};

on_both_stores!(
    a_crash_during_an_attach_or_a_detach_is_resumed,
    a_vm_changes_one_thing_at_a_time_and_a_termination_takes_over,
    an_attach_the_agent_refuses_is_undone_and_the_vm_stays_ready,
    a_vm_detached_to_no_cgpu_reads_an_empty_environment,
);

fn attach_body(ncgpus: u32, mib: u64) -> Value {
    json!({"ncgpus": ncgpus, "gpu_memory_mib": mib, "mode": "shared"})
}

fn states(vm: &Value) -> Vec<String> {
    vm["cgpus"].as_array().unwrap().iter().map(|c| c["state"].as_str().unwrap().into()).collect()
}

fn indexes(vm: &Value) -> Vec<u64> {
    vm["cgpus"].as_array().unwrap().iter().map(|c| c["index"].as_u64().unwrap()).collect()
}

/// Waits until the VM's cGPUs are `n`, all live (its attach or detach has ended).
async fn settled_with(t: &TestService, token: &str, id: &str, n: usize) -> Value {
    t.wait_vm(token, id, |vm| states(vm).len() == n && states(vm).iter().all(|s| s == "live")).await
}

async fn allocated(t: &TestService) -> u64 {
    let (_, pool) = t.get(&t.admin(), "/v1/pool").await;
    pool["totals"]["allocated_mib"].as_u64().unwrap()
}

/// Dissertation 5.2.2: "we have progressively attached to the VM more cGPUs (with 4 GB of
/// memory) ... The VM can own up to 8 cGPUs", on its testbed of 4 GPUs of 8 GiB.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dissertations_vm_grows_from_one_to_eight_cgpus_and_back() {
    let t = TestService::start(Store::Sqlite).await;
    let (member, admin) = (t.member(), t.admin());
    let mut launch = shared_launch(1, 4096);
    launch["policy"] = json!("least-load-fit");
    let id = t.launch(&member, &launch).await;
    let first = t.wait_state(&member, &id, "ready").await;
    let endpoint0 = first["cgpus"][0]["masked_endpoint"].clone();
    let path = format!("/v1/vms/{id}/cgpus");
    for n in 2..=8usize {
        let (status, vm) = t.post(&member, &path, &attach_body(1, 4096)).await;
        assert_eq!(status, 202, "{vm}");
        assert_eq!(states(&vm).last().unwrap(), "attaching", "{vm}");
        let vm = settled_with(&t, &member, &id, n).await;
        assert_eq!(vm["rcuda_env"]["RCUDA_DEVICE_COUNT"], n.to_string(), "{vm}");
        assert_eq!(vm["cgpus"][0]["masked_endpoint"], endpoint0);
        assert!(vm["cgpus"][0].get("gpu").is_none(), "a tenant sees no GPU: {vm}");
    }
    let (_, vm) = t.get(&admin, &format!("/v1/vms/{id}")).await;
    let gpus: Vec<&str> =
        vm["cgpus"].as_array().unwrap().iter().map(|c| c["gpu"].as_str().unwrap()).collect();
    let first_four: std::collections::HashSet<_> = gpus[..4].iter().collect();
    assert_eq!(first_four.len(), 4, "least-load-fit spreads the first four: {gpus:?}");
    let second_four: std::collections::HashSet<_> = gpus[4..].iter().collect();
    assert_eq!(first_four, second_four, "then the GPUs take second tenants: {gpus:?}");
    assert_eq!(allocated(&t).await, 8 * 4096);

    // The 9th: no room, nothing changes.
    let (status, problem) = t.post(&member, &path, &attach_body(1, 4096)).await;
    assert_eq!(status, 507, "{problem}");
    let (_, after) = t.get(&member, &format!("/v1/vms/{id}")).await;
    assert_eq!(after["cgpus"], settled_with(&t, &member, &id, 8).await["cgpus"]);
    assert_eq!(after["updated_ms"], vm["updated_ms"], "the VM was not written");
    assert_eq!(allocated(&t).await, 8 * 4096);

    // Shrink back to one; a middle cGPU first, so the others keep their endpoints.
    let endpoints = |vm: &Value| -> Vec<(u64, Value)> {
        vm["cgpus"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| (c["index"].as_u64().unwrap(), c["masked_endpoint"].clone()))
            .collect()
    };
    let before = endpoints(&after);
    let (status, vm) = t.delete(&member, &format!("{path}/3")).await;
    assert_eq!(status, 202, "{vm}");
    let vm = settled_with(&t, &member, &id, 7).await;
    let expected: Vec<_> = before.iter().filter(|(i, _)| *i != 3).cloned().collect();
    assert_eq!(endpoints(&vm), expected);
    assert_eq!(vm["rcuda_env"]["RCUDA_DEVICE_COUNT"], "7");
    // The live ones are numbered contiguously in attach order: device 3 is now index 4.
    let (address, port) = expected[3].1.as_str().unwrap().split_once(':').unwrap();
    let device3 = vm["rcuda_env"]["RCUDA_DEVICE_3"].as_str().unwrap();
    assert!(device3.starts_with(&format!("{address}@{port}:")), "{device3} for {:?}", expected[3]);
    for (n, index) in [7, 6, 5, 4, 2, 1].into_iter().enumerate() {
        let (status, vm) = t.delete(&member, &format!("{path}/{index}")).await;
        assert_eq!(status, 202, "{vm}");
        settled_with(&t, &member, &id, 6 - n).await;
    }
    let vm = settled_with(&t, &member, &id, 1).await;
    assert_eq!(indexes(&vm), vec![0]);
    assert_eq!(allocated(&t).await, 4096);

    let text = t.http.get(t.url("/metrics")).bearer_auth(&admin).send().await.unwrap();
    let text = text.text().await.unwrap();
    for line in [
        "gsaas_cgpu_attaches_total{outcome=\"attached\"} 7",
        "gsaas_cgpu_attaches_total{outcome=\"refused\"} 1",
        "gsaas_cgpu_detaches_total{outcome=\"detached\"} 7",
        "gsaas_cgpu_attach_seconds_count 7",
    ] {
        assert!(text.contains(line), "no {line:?} in /metrics");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_attaches_and_detaches_are_refused_and_change_nothing() {
    let t = TestService::start_with(Store::Sqlite, |c| {
        c.cloud.sim_mut().unwrap().deletion_delay_ms = 60_000;
    })
    .await;
    let member = t.member();
    let id = t.launch(&member, &shared_launch(2, 1024)).await;
    let vm = t.wait_state(&member, &id, "ready").await;
    let path = format!("/v1/vms/{id}/cgpus");
    let before_pool = allocated(&t).await;

    let other = t.token("another-project", gsaasd::auth::Role::Member);
    let (status, _) = t.post(&other, &path, &attach_body(1, 1024)).await;
    assert_eq!(status, 404);
    let (status, _) = t.delete(&other, &format!("{path}/0")).await;
    assert_eq!(status, 404);

    for (body, field) in [
        (attach_body(0, 1024), "ncgpus"),
        (attach_body(4096, 1), "ncgpus"),
        (json!({"ncgpus": 1, "mode": "shared"}), "gpu_memory_mib"),
        (
            json!({"ncgpus": 1, "gpu_memory_mib": 1024, "mode": "shared", "locality": "local"}),
            "locality",
        ),
        (
            json!({"ncgpus": 1, "gpu_memory_mib": 1024, "mode": "shared", "policy": "nope"}),
            "policy",
        ),
        (json!({"ncgpus": -1}), "ncgpus"),
    ] {
        let (status, problem) = t.post(&member, &path, &body).await;
        assert_eq!((status, problem["field"].as_str()), (422, Some(field)), "{body}: {problem}");
    }
    for index in ["5", "abc", "4294967296", "-1"] {
        let (status, problem) = t.delete(&member, &format!("{path}/{index}")).await;
        assert_eq!(status, 404, "{index}: {problem}");
    }
    let (_, unchanged) = t.get(&member, &format!("/v1/vms/{id}")).await;
    assert_eq!(unchanged, vm);
    assert_eq!(allocated(&t).await, before_pool);

    // Not ready yet: 409 naming the state.
    let t2 = TestService::start_with(Store::Sqlite, |c| {
        c.cloud.sim_mut().unwrap().activation_delay_ms = 60_000;
    })
    .await;
    let member2 = t2.member();
    let creating = t2.launch(&member2, &shared_launch(1, 1024)).await;
    let (status, problem) =
        t2.post(&member2, &format!("/v1/vms/{creating}/cgpus"), &attach_body(1, 1024)).await;
    assert_eq!(status, 409, "{problem}");
    assert!(problem["detail"].as_str().unwrap().contains("creating"), "{problem}");

    // Being terminated: 409, for attach and detach alike.
    let (status, _) = t.delete(&member, &format!("/v1/vms/{id}")).await;
    assert_eq!(status, 202);
    let deleting = t.wait_state(&member, &id, "deleting").await;
    let (status, problem) = t.post(&member, &path, &attach_body(1, 1024)).await;
    assert_eq!(status, 409, "{problem}");
    assert!(problem["detail"].as_str().unwrap().contains("deleting"), "{problem}");
    let (status, problem) = t.delete(&member, &format!("{path}/0")).await;
    assert_eq!(status, 409, "{problem}");
    let (_, still) = t.get(&member, &format!("/v1/vms/{id}")).await;
    assert_eq!(still["cgpus"], deleting["cgpus"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idempotency_key_makes_a_retried_attach_attach_once() {
    let t = TestService::start(Store::Sqlite).await;
    let member = t.member();
    let id = t.launch(&member, &shared_launch(1, 1024)).await;
    t.wait_state(&member, &id, "ready").await;
    let attach = |body: Value| {
        t.http
            .post(t.url(&format!("/v1/vms/{id}/cgpus")))
            .bearer_auth(&member)
            .header("Idempotency-Key", "grow-1")
            .json(&body)
            .send()
    };
    let first = support::status_json(attach(attach_body(2, 1024)).await.unwrap()).await;
    assert_eq!(first.0, 202, "{}", first.1);
    settled_with(&t, &member, &id, 3).await;
    let again = support::status_json(attach(attach_body(2, 1024)).await.unwrap()).await;
    assert_eq!(again.0, 202, "{}", again.1);
    assert_eq!(states(&again.1).len(), 3, "the retry attached nothing more: {}", again.1);
    let other = support::status_json(attach(attach_body(1, 1024)).await.unwrap()).await;
    assert_eq!((other.0, other.1["field"].as_str()), (422, Some("Idempotency-Key")), "{}", other.1);
    assert_eq!(allocated(&t).await, 3 * 1024);
}

/// A stalled agent holds the attach's push; meanwhile the VM takes no other change, and a
/// termination takes over, releasing every cGPU whatever its state.
async fn a_vm_changes_one_thing_at_a_time_and_a_termination_takes_over(store: Store) {
    let (t, vm_host, _) = agent_cloud(store, 2).await;
    let member = t.member();
    let id = t.launch(&member, &remote_launch(1)).await;
    t.wait_state(&member, &id, "ready").await;
    let path = format!("/v1/vms/{id}/cgpus");
    vm_host.set(Behaviour::Stall);
    let (status, vm) = t.post(&member, &path, &attach_body(1, 1024)).await;
    assert_eq!(status, 202, "{vm}");
    let (status, problem) = t.post(&member, &path, &attach_body(1, 1024)).await;
    assert_eq!(status, 409, "{problem}");
    let (status, problem) = t.delete(&member, &format!("{path}/0")).await;
    assert_eq!(status, 409, "{problem}");
    assert_eq!(allocated(&t).await, 2048);

    let (status, _) = t.delete(&member, &format!("/v1/vms/{id}")).await;
    assert_eq!(status, 202);
    vm_host.set(Behaviour::Honest);
    t.wait_state(&member, &id, "deleted").await;
    assert_eq!(allocated(&t).await, 0);
    assert!(vm_host.routes().is_empty(), "{:?}", vm_host.routes());
}

async fn an_attach_the_agent_refuses_is_undone_and_the_vm_stays_ready(store: Store) {
    let (t, vm_host, _) = agent_cloud(store, 2).await;
    let member = t.member();
    let id = t.launch(&member, &remote_launch(1)).await;
    t.wait_state(&member, &id, "ready").await;
    // First fit would share GPU-0; distinct GPUs take GPU-1, whose routes the agent refuses.
    let refused = SocketAddrV4::new(rcuda_address("cg-1"), 8309);
    vm_host.set(Behaviour::RefuseTarget(refused));
    let mut body = attach_body(1, 1024);
    body["distinct_gpus"] = json!(true);
    let (status, vm) = t.post(&member, &format!("/v1/vms/{id}/cgpus"), &body).await;
    assert_eq!(status, 202, "{vm}");
    let vm = settled_with(&t, &member, &id, 1).await;
    assert_eq!(vm["state"], "ready", "{vm}");
    let error = vm["error"].as_str().unwrap_or_default();
    assert!(error.contains("attaching cGPUs failed"), "{vm}");
    for secret in ["crg-a", "cg-1", &refused.ip().to_string(), "8309"] {
        assert!(!error.contains(secret), "{secret} in {error:?}");
    }
    assert_eq!(allocated(&t).await, 1024);
    assert_eq!(vm_host.routes().len(), 1);
    // The next change clears the error.
    vm_host.set(Behaviour::Honest);
    let (status, _) = t.post(&member, &format!("/v1/vms/{id}/cgpus"), &attach_body(1, 1024)).await;
    assert_eq!(status, 202);
    let vm = settled_with(&t, &member, &id, 2).await;
    assert!(vm["error"].is_null(), "{vm}");
}

/// A VM detached down to no cGPU keeps running, and its host's agent still answers it: with no
/// device, rather than not at all (which would leave the VM its boot-time devices).
async fn a_vm_detached_to_no_cgpu_reads_an_empty_environment(store: Store) {
    let (t, vm_host, _) = agent_cloud(store, 2).await;
    let member = t.member();
    let id = t.launch(&member, &remote_launch(1)).await;
    t.wait_state(&member, &id, "ready").await;
    let route = vm_host.table().unwrap().routes[0].clone();
    let env = vm_host.environment(route.vm_ip).unwrap();
    assert_eq!(env.devices.len(), 1);

    let (status, vm) = t.delete(&member, &format!("/v1/vms/{id}/cgpus/0")).await;
    assert_eq!(status, 202, "{vm}");
    let vm = settled_with(&t, &member, &id, 0).await;
    assert_eq!(vm["state"], "ready", "{vm}");
    assert_eq!(allocated(&t).await, 0);
    let table = vm_host.table().unwrap();
    assert!(table.routes.is_empty(), "{table:?}");
    let port = VmPort {
        vm: route.vm,
        vm_ip: route.vm_ip,
        vm_tap: route.vm_tap.clone(),
        remoting: Default::default(),
    };
    assert_eq!(table.vms_without_cgpus, vec![port]);
    let env = vm_host.environment(route.vm_ip).unwrap();
    assert_eq!(
        env.export_lines(),
        "export RCUDA_DEVICE_COUNT=0\nexport GSAAS_CGPUS=\nexport GSAAS_CGPUS_MISSING=\n"
    );

    // Growing again lists it among the routed VMs only.
    let (status, _) = t.post(&member, &format!("/v1/vms/{id}/cgpus"), &attach_body(1, 1024)).await;
    assert_eq!(status, 202);
    settled_with(&t, &member, &id, 1).await;
    let table = vm_host.table().unwrap();
    assert_eq!((table.routes.len(), table.vms_without_cgpus.len()), (1, 0), "{table:?}");
    assert_eq!(vm_host.environment(route.vm_ip).unwrap().devices.len(), 1);
}

/// Waits until the agent has received a push beyond `seen`.
async fn wait_push(agent: &TestAgent, seen: usize) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while agent.pushes() <= seen {
        assert!(Instant::now() < deadline, "no push arrived");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// gsaasd dies while the agent holds the push of an attach, then of a detach; the next gsaasd
/// finishes each.
async fn a_crash_during_an_attach_or_a_detach_is_resumed(store: Store) {
    let (mut t, vm_host, _) = agent_cloud_with(store, 2, |c| c.launch.saga_lease_secs = 1).await;
    let member = t.member();
    let id = t.launch(&member, &remote_launch(1)).await;
    t.wait_state(&member, &id, "ready").await;
    let path = format!("/v1/vms/{id}/cgpus");

    let resume = |t: &TestService| {
        let app = t.service().app.clone();
        async move { app.reconcile_once().await }
    };
    for (stage, n, mib) in [("attach", 2usize, 2048u64), ("detach", 1, 1024)] {
        vm_host.set(Behaviour::Stall);
        let seen = vm_host.pushes();
        let (status, vm) = match stage {
            "attach" => t.post(&member, &path, &attach_body(1, 1024)).await,
            _ => t.delete(&member, &format!("{path}/1")).await,
        };
        assert_eq!(status, 202, "{stage}: {vm}");
        wait_push(&vm_host, seen).await;
        t.restart().await;
        vm_host.set(Behaviour::Honest);
        let deadline = Instant::now() + Duration::from_secs(20);
        let vm = loop {
            resume(&t).await;
            let (_, vm) = t.get(&member, &format!("/v1/vms/{id}")).await;
            if states(&vm).len() == n && states(&vm).iter().all(|s| s == "live") {
                break vm;
            }
            assert!(Instant::now() < deadline, "{stage}: never resumed: {vm}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        assert_eq!(vm["state"], "ready", "{stage}: {vm}");
        assert_eq!(allocated(&t).await, mib, "{stage}");
        assert_eq!(vm_host.routes().len(), n, "{stage}: {:?}", vm_host.routes());
    }
}
