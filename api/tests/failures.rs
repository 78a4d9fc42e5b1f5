//! When things break (issue [4/5]): terminations and detaches that do not wait for a dead host
//! (fencing), forgetting a host, GPU health, evacuations and automatic re-homing.
//!
//! The hosts have real agents over HTTP ([`support::agents`]); a test turns one `Down` (every
//! request answered 503, as a host that is gone) and back.

use crate::{on_both_stores, support};

use serde_json::{json, Value};
use support::agents::{agent_cloud, agent_cloud_with, remote_launch, Behaviour, TestAgent};
use support::{host_report, Store, TestService};

on_both_stores!(
    a_termination_whose_host_is_down_completes_and_fences_its_cgpus,
    a_forgotten_host_releases_its_fences_and_comes_back_by_registering,
    a_detach_whose_host_is_down_completes_and_fences_the_cgpu,
    unhealthy_gpus_take_no_new_cgpus_and_show_in_the_pool_and_metrics,
    an_evacuation_moves_cgpus_behind_the_same_masked_endpoints_or_nothing,
    auto_rehome_moves_failed_gpus_cgpus_and_loses_what_fits_nowhere,
    an_agent_that_switches_its_gpus_layer_cannot_change_a_vms_layer,
);

fn exclusive_remote(ncgpus: u32) -> Value {
    let mut request = remote_launch(ncgpus);
    request["mode"] = json!("exclusive");
    request.as_object_mut().unwrap().remove("gpu_memory_mib");
    request
}

async fn fences(t: &TestService) -> Vec<Value> {
    let (status, body) = t.get(&t.admin(), "/v1/fences").await;
    assert_eq!(status, 200, "{body}");
    body["fences"].as_array().unwrap().clone()
}

async fn pool_gpus(t: &TestService) -> Vec<Value> {
    let (_, pool) = t.get(&t.admin(), "/v1/pool").await;
    pool["hosts"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|h| h["gpus"].as_array().unwrap().clone())
        .collect()
}

async fn quota_cgpus(t: &TestService) -> u64 {
    let (_, quota) = t.get(&t.member(), "/v1/quotas/alpha").await;
    quota["usage"]["cgpus"].as_u64().unwrap()
}

/// Waits (bounded: 10 s) until `agent` routes `n` endpoints: a pass the test did not start (one a
/// report triggered) may still be pushing.
async fn wait_routes(agent: &TestAgent, n: usize) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while routes(agent).len() != n {
        assert!(
            std::time::Instant::now() < deadline,
            "routes never became {n}: {:?}",
            routes(agent)
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}

/// The masked endpoints the agent routes, with their targets.
fn routes(agent: &TestAgent) -> Vec<(String, String)> {
    agent.routes().iter().map(|(m, t)| (m.to_string(), t.to_string())).collect()
}

async fn a_termination_whose_host_is_down_completes_and_fences_its_cgpus(store: Store) {
    let (t, vm_host, _) = agent_cloud(store, 2).await;
    let member = t.member();
    let id = t.launch(&member, &exclusive_remote(2)).await;
    t.wait_state(&member, &id, "ready").await;
    assert_eq!(routes(&vm_host).len(), 2);
    assert_eq!(quota_cgpus(&t).await, 2);

    // The VM's host dies: the termination still completes for the tenant.
    vm_host.set(Behaviour::Down);
    let (status, _) = t.delete(&member, &format!("/v1/vms/{id}")).await;
    assert_eq!(status, 202);
    let vm = t.wait_state(&member, &id, "deleted").await;
    assert!(vm["cgpus"].as_array().unwrap().is_empty(), "{vm}");
    assert_eq!(quota_cgpus(&t).await, 0, "the quota stops counting them");
    // Its cGPUs are fenced, not free: the host may still route to them.
    let fenced = fences(&t).await;
    assert_eq!(fenced.len(), 1, "{fenced:?}");
    assert_eq!(fenced[0]["vm"], id.as_str());
    assert_eq!(fenced[0]["host"], "crg-a");
    assert_eq!(fenced[0]["gpus"].as_array().unwrap().len(), 2);
    let gpus = pool_gpus(&t).await;
    assert!(gpus.iter().all(|g| g["fenced"] == 1 && g["vms"] == json!({})), "{gpus:?}");
    let (status, problem) = t.post(&member, "/v1/vms", &exclusive_remote(1)).await;
    assert_eq!(status, 507, "fenced GPUs are not placeable: {problem}");
    // Tenants see nothing of it.
    let (status, _) = t.get(&member, "/v1/fences").await;
    assert_eq!(status, 404);
    // The agent comes back: the next pass pushes its table, which no longer routes the VM, and
    // only then are the GPUs free.
    t.service().app.reconcile_once().await;
    assert_eq!(fences(&t).await.len(), 1);
    vm_host.set(Behaviour::Honest);
    t.service().app.reconcile_once().await;
    assert!(routes(&vm_host).is_empty(), "the routes are gone");
    assert!(fences(&t).await.is_empty());
    let id = t.launch(&member, &exclusive_remote(2)).await;
    t.wait_state(&member, &id, "ready").await;
}

async fn a_forgotten_host_releases_its_fences_and_comes_back_by_registering(store: Store) {
    let (t, vm_host, gpu_host) = agent_cloud(store, 1).await;
    let member = t.member();
    let id = t.launch(&member, &remote_launch(1)).await;
    t.wait_state(&member, &id, "ready").await;
    vm_host.set(Behaviour::Down);
    t.delete(&member, &format!("/v1/vms/{id}")).await;
    t.wait_state(&member, &id, "deleted").await;
    assert_eq!(fences(&t).await.len(), 1);

    // Its agent heartbeated moments ago: forgetting it needs force.
    let (status, problem) = t.post(&t.admin(), "/v1/hosts/crg-a/forget", &json!({})).await;
    assert_eq!(status, 409, "{problem}");
    assert!(problem["detail"].as_str().unwrap().contains("force"), "{problem}");
    assert_eq!(fences(&t).await.len(), 1, "a refused forget changes nothing");
    let (status, _) = t.post(&member, "/v1/hosts/crg-a/forget?force=true", &json!({})).await;
    assert_eq!(status, 404, "tenants cannot forget hosts");
    let (status, _) = t.post(&t.admin(), "/v1/hosts/nowhere/forget?force=true", &json!({})).await;
    assert_eq!(status, 404);
    let (status, problem) =
        t.post(&t.admin(), "/v1/hosts/crg-a/forget?force=maybe", &json!({})).await;
    assert_eq!(status, 422, "{problem}");

    let (status, host) = t.post(&t.admin(), "/v1/hosts/crg-a/forget?force=true", &json!({})).await;
    assert_eq!(status, 200, "{host}");
    assert_eq!(
        (host["forgotten"].as_bool(), host["state"].as_str()),
        (Some(true), Some("unavailable"))
    );
    assert!(fences(&t).await.is_empty(), "its routes count as gone");
    // Nothing is pushed to a forgotten host.
    let pushes = vm_host.pushes();
    t.service().app.reconcile_once().await;
    assert_eq!(vm_host.pushes(), pushes);
    // It comes back by registering; its table is pushed at once.
    vm_host.set(Behaviour::Honest);
    let report = host_report("crg-a", "compute-rgpu", &vm_host.url, 0);
    let (status, host) = t.report_host(&t.agent_token("crg-a"), "crg-a", &report).await;
    assert_eq!(status, 200, "{host}");
    assert_eq!(
        (host["forgotten"].as_bool(), host["state"].as_str()),
        (Some(false), Some("schedulable"))
    );
    let id = t.launch(&member, &remote_launch(1)).await;
    t.wait_state(&member, &id, "ready").await;

    // A drained host that is forgotten comes back drained, as the operator left it.
    t.post(&t.admin(), "/v1/hosts/cg-1/drain", &json!({})).await;
    let (status, _) = t.post(&t.admin(), "/v1/hosts/cg-1/forget?force=true", &json!({})).await;
    assert_eq!(status, 200);
    let report = host_report("cg-1", "compute-gpu", &gpu_host.url, 1);
    let (status, host) = t.report_host(&t.agent_token("cg-1"), "cg-1", &report).await;
    assert_eq!((status, host["state"].as_str()), (200, Some("drained")), "{host}");
}

async fn a_detach_whose_host_is_down_completes_and_fences_the_cgpu(store: Store) {
    let (t, vm_host, _) = agent_cloud(store, 2).await;
    let member = t.member();
    let id = t.launch(&member, &exclusive_remote(2)).await;
    t.wait_state(&member, &id, "ready").await;
    vm_host.set(Behaviour::Down);
    let (status, vm) = t.delete(&member, &format!("/v1/vms/{id}/cgpus/1")).await;
    assert_eq!(status, 202, "{vm}");
    let vm = t.wait_vm(&member, &id, |vm| vm["cgpus"].as_array().unwrap().len() == 1).await;
    assert_eq!(vm["state"], "ready", "{vm}");
    assert_eq!(quota_cgpus(&t).await, 1);
    let fenced = fences(&t).await;
    assert_eq!(fenced.len(), 1, "{fenced:?}");
    assert_eq!(fenced[0]["gpus"].as_array().unwrap().len(), 1);
    vm_host.set(Behaviour::Honest);
    t.service().app.reconcile_once().await;
    assert!(fences(&t).await.is_empty());
    assert_eq!(routes(&vm_host).len(), 1);
}

fn with_health(mut report: Value, gpu: usize, unhealthy: Option<&str>) -> Value {
    report["gpus"][gpu]["unhealthy"] = json!(unhealthy);
    report
}

async fn unhealthy_gpus_take_no_new_cgpus_and_show_in_the_pool_and_metrics(store: Store) {
    let (t, _, gpu_agent) = agent_cloud(store, 2).await;
    let member = t.member();
    let token = t.agent_token("cg-1");
    let report = host_report("cg-1", "compute-gpu", &gpu_agent.url, 2);
    let sick = with_health(report.clone(), 0, Some("critical XID error 79"));
    let (status, body) = t.report_host(&token, "cg-1", &sick).await;
    assert_eq!(status, 200, "{body}");
    let gpus = pool_gpus(&t).await;
    assert_eq!(gpus[0]["health"], "critical XID error 79", "{gpus:?}");
    assert!(gpus[1]["health"].is_null());
    let (_, metrics) = t.get(&t.admin(), "/metrics").await;
    let metrics = metrics.as_str().unwrap().to_owned();
    assert!(metrics.contains("gsaas_gpu_healthy{gpu=\"cg-1:GPU-0\",host=\"cg-1\"} 0"), "{metrics}");
    assert!(metrics.contains("gsaas_gpu_healthy{gpu=\"cg-1:GPU-1\",host=\"cg-1\"} 1"));
    // Only the healthy GPU takes cGPUs.
    let id = t.launch(&member, &exclusive_remote(1)).await;
    let vm = t.wait_state(&member, &id, "ready").await;
    let (_, admin_vm) = t.get(&t.admin(), &format!("/v1/vms/{}", vm["id"].as_str().unwrap())).await;
    assert_eq!(admin_vm["cgpus"][0]["gpu"], "cg-1:GPU-1");
    let (status, _) = t.post(&member, "/v1/vms", &exclusive_remote(1)).await;
    assert_eq!(status, 507);
    // Healthy again: it takes cGPUs again.
    assert_eq!(t.report_host(&token, "cg-1", &report).await.0, 200);
    assert!(pool_gpus(&t).await[0]["health"].is_null());
    let id = t.launch(&member, &exclusive_remote(1)).await;
    t.wait_state(&member, &id, "ready").await;
    // A hostile report changes nothing.
    let hostile = with_health(report.clone(), 0, Some("XID\u{1b}[31m"));
    let (status, problem) = t.report_host(&token, "cg-1", &hostile).await;
    assert_eq!((status, problem["field"].as_str()), (422, Some("gpus[0].unhealthy")), "{problem}");
    let huge = with_health(report.clone(), 1, Some(&"x".repeat(10_000)));
    assert_eq!(t.report_host(&token, "cg-1", &huge).await.0, 422);
    assert!(pool_gpus(&t).await.iter().all(|g| g["health"].is_null()));
    // A GPU in use that its host stops reporting is unhealthy, not dropped.
    let mut gone = report.clone();
    gone["gpus"].as_array_mut().unwrap().truncate(1);
    assert_eq!(t.report_host(&token, "cg-1", &gone).await.0, 200);
    let gpus = pool_gpus(&t).await;
    assert_eq!(gpus.len(), 2, "{gpus:?}");
    assert_eq!(gpus[1]["health"], "gone from its host's report");
}

/// The VM's cGPUs as an admin sees them: (index, masked endpoint, GPU).
async fn cgpus_of(t: &TestService, id: &str) -> Vec<(u64, String, String)> {
    let text = |c: &Value, k: &str| c[k].as_str().unwrap().to_owned();
    t.admin_cgpus(id)
        .await
        .iter()
        .map(|c| (c["index"].as_u64().unwrap(), text(c, "masked_endpoint"), text(c, "gpu")))
        .collect()
}

async fn an_evacuation_moves_cgpus_behind_the_same_masked_endpoints_or_nothing(store: Store) {
    let (t, vm_host, _) = agent_cloud(store, 3).await;
    let member = t.member();
    let id = t.launch(&member, &exclusive_remote(2)).await;
    let before = t.wait_state(&member, &id, "ready").await;
    let cgpus = cgpus_of(&t, &id).await;
    let leaving = cgpus[1].2.clone();
    let routes_before = routes(&vm_host);

    let (status, _) = t.post(&member, &format!("/v1/gpus/{leaving}/evacuate"), &json!({})).await;
    assert_eq!(status, 404, "tenants cannot evacuate");
    let (status, _) = t.post(&t.admin(), "/v1/gpus/cg-1:GPU-9/evacuate", &json!({})).await;
    assert_eq!(status, 404);
    let (status, _) =
        t.post(&t.admin(), "/v1/gpus/cg-1:GPU-9/taint", &json!({"reason": "x"})).await;
    assert_eq!(status, 404, "tainting an unknown GPU");
    let (status, _) = t.post(&t.admin(), "/v1/hosts/nowhere/evacuate", &json!({})).await;
    assert_eq!(status, 404);

    let (status, done) =
        t.post(&t.admin(), &format!("/v1/gpus/{leaving}/evacuate"), &json!({})).await;
    assert_eq!(status, 200, "{done}");
    assert_eq!(done["moved"], 1);
    assert_eq!(done["vms"], json!([id]));
    let moved = cgpus_of(&t, &id).await;
    assert_eq!(moved[0], cgpus[0], "the other cGPU stays");
    assert_eq!(
        (moved[1].0, &moved[1].1),
        (cgpus[1].0, &cgpus[1].1),
        "same index and masked endpoint"
    );
    assert_ne!(moved[1].2, leaving);
    // The VM's environment is unchanged; its host's agent re-targeted the route and cut the old
    // connections.
    let after = t.wait_state(&member, &id, "ready").await;
    assert_eq!(after["rcuda_env"], before["rcuda_env"]);
    assert!(after["events"].as_array().unwrap().iter().any(|e| e["kind"] == "rehomed"), "{after}");
    let routes_after = routes(&vm_host);
    assert_eq!(routes_after.len(), 2);
    assert_eq!(
        routes_after.iter().map(|r| &r.0).collect::<Vec<_>>(),
        routes_before.iter().map(|r| &r.0).collect::<Vec<_>>()
    );
    assert_ne!(routes_after, routes_before);
    let cut = vm_host.cuts();
    assert_eq!(cut.len(), 1, "{cut:?}");
    assert_eq!(cut[0].0.to_string(), cgpus[1].1);
    // The old GPU's booking waits in a fence until the agent confirmed; then it is free.
    t.service().app.reconcile_once().await;
    assert!(fences(&t).await.is_empty());
    assert!(pool_gpus(&t).await.iter().any(|g| g["id"] == leaving.as_str() && g["cgpus"] == 0));

    // Evacuating a GPU whose cGPU fits nowhere else moves nothing: 507.
    let other = t.launch(&member, &exclusive_remote(1)).await;
    t.wait_state(&member, &other, "ready").await;
    let cgpus = cgpus_of(&t, &id).await;
    let (_, pool_before) = t.get(&t.admin(), "/v1/pool").await;
    let (status, problem) =
        t.post(&t.admin(), &format!("/v1/gpus/{}/evacuate", cgpus[0].2), &json!({})).await;
    assert_eq!(status, 507, "{problem}");
    let (status, _) = t.post(&t.admin(), "/v1/hosts/cg-1/evacuate", &json!({})).await;
    assert_eq!(status, 507);
    assert_eq!(cgpus_of(&t, &id).await, cgpus);
    assert_eq!(t.get(&t.admin(), "/v1/pool").await.1, pool_before);
    assert!(fences(&t).await.is_empty());
}

async fn auto_rehome_moves_failed_gpus_cgpus_and_loses_what_fits_nowhere(store: Store) {
    let (t, vm_host, gpu_agent) = agent_cloud_with(store, 3, |c| c.hosts.auto_rehome = true).await;
    let member = t.member();
    let app = &t.service().app;
    let id = t.launch(&member, &exclusive_remote(2)).await;
    t.wait_state(&member, &id, "ready").await;
    let cgpus = cgpus_of(&t, &id).await;
    let token = t.agent_token("cg-1");
    let report = host_report("cg-1", "compute-gpu", &gpu_agent.url, 3);
    let failing: usize = cgpus[0].2.strip_prefix("cg-1:GPU-").unwrap().parse().unwrap();

    // Its first GPU fails: a pass (the one the report triggers, or this one) moves that cGPU to
    // the free GPU.
    let sick = with_health(report.clone(), failing, Some("2 uncorrectable ECC errors"));
    assert_eq!(t.report_host(&token, "cg-1", &sick).await.0, 200);
    let status = app.reconcile_once().await;
    assert!(status.last_error.is_none(), "{status:?}");
    let moved = cgpus_of(&t, &id).await;
    assert_eq!(moved[0].1, cgpus[0].1, "same masked endpoint");
    assert_ne!(moved[0].2, cgpus[0].2);
    wait_routes(&vm_host, 2).await;

    // Then another GPU fails, and no healthy GPU is left for its cGPU: it is lost, not dropped.
    let second: usize = moved[1].2.strip_prefix("cg-1:GPU-").unwrap().parse().unwrap();
    let worse = with_health(sick.clone(), second, Some("fallen off the bus"));
    assert_eq!(t.report_host(&token, "cg-1", &worse).await.0, 200);
    app.reconcile_once().await;
    let vm = t.wait_state(&member, &id, "ready").await;
    let states: Vec<&str> =
        vm["cgpus"].as_array().unwrap().iter().map(|c| c["state"].as_str().unwrap()).collect();
    assert_eq!(states, ["live", "lost"], "{vm}");
    assert!(vm["events"].as_array().unwrap().iter().any(|e| e["kind"] == "lost"), "{vm}");
    wait_routes(&vm_host, 1).await; // a lost cGPU has no route
                                    // Its environment says so, in the view and live from the VM's host: device 0 is cGPU 0, and
                                    // cGPU 1 is missing (not silently dropped, moving later devices down).
    let env = &vm["gpu_env"];
    assert_eq!(
        (&env["RCUDA_DEVICE_COUNT"], &env["GSAAS_CGPUS"], &env["GSAAS_CGPUS_MISSING"]),
        (&json!("1"), &json!("0"), &json!("1")),
        "{vm}"
    );
    let table = vm_host.table().unwrap();
    let live = vm_host.environment(table.routes[0].vm_ip).unwrap();
    assert_eq!((live.devices.len(), live.devices[0].cgpu, live.missing.clone()), (1, 0, vec![1]));
    assert_eq!(quota_cgpus(&t).await, 2, "the VM still holds it");
    // The next pass tries again and loses nothing more.
    assert_eq!(app.reconcile_once().await.cgpus_lost, 0);
    // The GPU works again: the cGPU is live there again.
    assert_eq!(t.report_host(&token, "cg-1", &sick).await.0, 200);
    app.reconcile_once().await;
    let vm = t.wait_state(&member, &id, "ready").await;
    assert!(vm["cgpus"].as_array().unwrap().iter().all(|c| c["state"] == "live"), "{vm}");
    wait_routes(&vm_host, 2).await;
    let back = vm_host.environment(table.routes[0].vm_ip).unwrap();
    assert!(back.missing.is_empty() && back.devices.len() == 2, "{back:?}");

    // Lost again, the tenant gives it up: a lost cGPU detaches like a live one.
    assert_eq!(t.report_host(&token, "cg-1", &worse).await.0, 200);
    app.reconcile_once().await;
    let vm = t.wait_state(&member, &id, "ready").await;
    let lost = vm["cgpus"].as_array().unwrap().iter().find(|c| c["state"] == "lost").cloned();
    let index = lost.expect("a lost cGPU")["index"].as_u64().unwrap();
    let (status, body) = t.delete(&member, &format!("/v1/vms/{id}/cgpus/{index}")).await;
    assert_eq!(status, 202, "{body}");
    t.wait_vm(&member, &id, |vm| vm["cgpus"].as_array().unwrap().len() == 1).await;
    assert_eq!(quota_cgpus(&t).await, 1, "the quota stops counting it");
}

/// A hostile (or reconfigured) agent reports its GPUs' servers as LUPINE while an rCUDA VM uses
/// them: those GPUs are other devices now, so the old ones leave service (gone from the report,
/// their cGPUs re-homed or lost, never switched), the new ones wait for their endpoints, and no
/// VM's cGPU ever speaks another layer than its VM.
async fn an_agent_that_switches_its_gpus_layer_cannot_change_a_vms_layer(store: Store) {
    let (t, _, gpu_agent) = agent_cloud_with(store, 2, |c| c.hosts.auto_rehome = true).await;
    let member = t.member();
    let app = &t.service().app;
    let id = t.launch(&member, &exclusive_remote(1)).await;
    t.wait_state(&member, &id, "ready").await;
    let before = cgpus_of(&t, &id).await;
    let token = t.agent_token("cg-1");
    let mut switched = host_report("cg-1", "compute-gpu", &gpu_agent.url, 2);
    for gpu in switched["gpus"].as_array_mut().unwrap() {
        gpu["remoting"] = json!("lupine");
    }
    let (status, body) = t.report_host(&token, "cg-1", &switched).await;
    assert_eq!(status, 200, "{body}");
    app.reconcile_once().await;
    let vm = t.wait_state(&member, &id, "ready").await;
    assert_eq!(vm["gpus"]["remoting"], "rcuda", "{vm}");
    assert!(vm["gpu_env"].get("LUPINE_SERVER").is_none(), "{vm}");
    // Its cGPU stayed on its rCUDA GPU, which now serves nothing new; it is lost (nothing of
    // rCUDA is left to take it), not moved onto a LUPINE server.
    let after = cgpus_of(&t, &id).await;
    assert_eq!(after[0].2, before[0].2, "{vm}");
    assert_eq!(vm["cgpus"][0]["state"], "lost", "{vm}");
    let gpus = pool_gpus(&t).await;
    let held = gpus.iter().find(|g| g["id"] == before[0].2.as_str()).unwrap();
    assert_eq!(held["remoting"], "rcuda", "{held}");
    assert!(held["health"].is_string(), "out of service: {held}");
    // The free GPU left and came back as LUPINE: a LUPINE launch gets it, an rCUDA one finds
    // nothing (the only rCUDA GPU left is out of service).
    let mut body = exclusive_remote(1);
    body["remoting"] = json!("lupine");
    let lupine = t.launch(&member, &body).await;
    t.wait_state(&member, &lupine, "ready").await;
    let on = cgpus_of(&t, &lupine).await;
    assert_ne!(on[0].2, before[0].2);
    let gpus = pool_gpus(&t).await;
    let taken = gpus.iter().find(|g| g["id"] == on[0].2.as_str()).unwrap();
    assert_eq!(taken["remoting"], "lupine", "{taken}");
    let (status, problem) = t.post(&member, "/v1/vms", &exclusive_remote(1)).await;
    assert!(status == 507 || status == 422, "{status} {problem}");
}

/// Takes `pool_state`'s row lock, which every pool transaction takes first, in a transaction of
/// `holder`'s that the caller ends.
async fn hold_pool_state(holder: &mut sqlx::PgConnection) {
    sqlx::query("BEGIN").execute(&mut *holder).await.unwrap();
    sqlx::query("SELECT generation FROM pool_state WHERE id = 1 FOR UPDATE")
        .execute(&mut *holder)
        .await
        .unwrap();
}

/// The backend (its process id) that waits on `pool_state`'s row lock, as `observer` sees it
/// (outside a transaction: within one, PostgreSQL shows the activity as it was at its start).
async fn backend_waiting_on_pool_state(observer: &mut sqlx::PgConnection) -> i32 {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let waiting: Option<i32> = sqlx::query_scalar(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() \
             AND wait_event_type = 'Lock' AND query LIKE '%UPDATE pool_state%'",
        )
        .fetch_optional(&mut *observer)
        .await
        .unwrap();
        if let Some(pid) = waiting {
            return pid;
        }
        assert!(std::time::Instant::now() < deadline, "no pool transaction waits on the lock");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

/// PostgreSQL: pool transactions keep the connection they last committed on (`app::pool`). When
/// that connection dies while idle (an administrator ends its backend, the server restarts), the
/// next launch takes another one instead of failing. The test finds the kept connection's
/// backend by holding the lock every pool transaction takes first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_launch_takes_another_connection_when_the_kept_one_died_idle() {
    use sqlx::Connection;
    let t = TestService::start(Store::Postgres).await;
    let member = t.member();
    let body = support::shared_launch(1, 1024);
    let first = t.launch(&member, &body).await;
    t.wait_state(&member, &first, "ready").await;

    let url = t.config.database_url();
    let mut holder = sqlx::PgConnection::connect(&url).await.unwrap();
    let mut observer = sqlx::PgConnection::connect(&url).await.unwrap();
    hold_pool_state(&mut holder).await;
    let ((status, second), writer) = tokio::join!(t.post(&member, "/v1/vms", &body), async {
        let pid = backend_waiting_on_pool_state(&mut observer).await;
        sqlx::query("COMMIT").execute(&mut holder).await.unwrap();
        pid
    });
    assert_eq!(status, 202, "{second}");

    let ended: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1, 10000)")
        .bind(writer)
        .fetch_one(&mut observer)
        .await
        .unwrap();
    assert!(ended, "backend {writer} did not end");
    let (status, third) = t.post(&member, "/v1/vms", &body).await;
    assert_eq!(status, 202, "{third}");
    for vm in [&second, &third] {
        t.wait_state(&member, vm["id"].as_str().unwrap(), "ready").await;
    }

    // Ended in the middle of a launch's transaction, the kept connection and then the one the
    // launch takes instead: 503 (the database is down for it, not a bug), nothing booked, and
    // the next launch books as if it never happened.
    hold_pool_state(&mut holder).await;
    let ((status, problem), ()) = tokio::join!(t.post(&member, "/v1/vms", &body), async {
        let mut ended = Vec::new();
        while ended.len() < 2 {
            let pid = backend_waiting_on_pool_state(&mut observer).await;
            if !ended.contains(&pid) {
                sqlx::query("SELECT pg_terminate_backend($1, 10000)")
                    .bind(pid)
                    .execute(&mut observer)
                    .await
                    .unwrap();
                ended.push(pid);
            }
        }
        sqlx::query("COMMIT").execute(&mut holder).await.unwrap();
    });
    assert_eq!(
        (status, problem["code"].as_str()),
        (503, Some("dependency_unavailable")),
        "{problem}"
    );
    let (status, fourth) = t.post(&member, "/v1/vms", &body).await;
    assert_eq!(status, 202, "{fourth}");
    let (_, list) = t.get(&member, "/v1/vms").await;
    assert_eq!(list["vms"].as_array().unwrap().len(), 4, "{list}");
    let (_, quota) = t.get(&member, "/v1/quotas/alpha").await;
    assert_eq!(quota["usage"]["cgpus"], 4, "{quota}");
}

/// PostgreSQL: a pool transaction sends BEGIN and the generation's bump as one message
/// (`db::begin_pool_write`). A connection left in a failed or open transaction must not serve
/// again as it is: handed back to the pool, every later request that drew it would fail
/// ("current transaction is aborted") or run inside it. Both ways: the bump fails after the
/// BEGIN (sqlx never learns of the transaction: the connection is closed), and a later statement
/// of the launch fails (the transaction is rolled back before the connection's next use).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_pool_transaction_leaves_no_connection_in_it() {
    use sqlx::Connection;
    let t = TestService::start(Store::Postgres).await;
    let member = t.member();
    let body = support::shared_launch(1, 1024);
    let first = t.launch(&member, &body).await;
    t.wait_state(&member, &first, "ready").await;

    let mut admin = sqlx::PgConnection::connect(&t.config.database_url()).await.unwrap();
    sqlx::query(
        "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS \
         $$ BEGIN RAISE EXCEPTION 'refused' USING ERRCODE = '53400'; END $$",
    )
    .execute(&mut admin)
    .await
    .unwrap();
    let mut launched = vec![first];
    for (table, event) in [("pool_state", "UPDATE"), ("vms", "INSERT")] {
        sqlx::query(&format!(
            "CREATE TRIGGER refuse BEFORE {event} ON {table} FOR EACH ROW EXECUTE FUNCTION refuse()"
        ))
        .execute(&mut admin)
        .await
        .unwrap();
        let (status, problem) = t.post(&member, "/v1/vms", &body).await;
        assert_eq!(
            (status, problem["code"].as_str()),
            (503, Some("dependency_unavailable")),
            "{table}: {problem}"
        );
        sqlx::query(&format!("DROP TRIGGER refuse ON {table}")).execute(&mut admin).await.unwrap();

        // Every connection of the pool (16) serves again, the pool transactions' and the reads'
        // (the testbed has room for 21 of these VMs).
        for i in 0..20 {
            if i % 2 == 0 {
                let (status, vm) = t.post(&member, "/v1/vms", &body).await;
                assert_eq!(status, 202, "{table}: {vm}");
                launched.push(vm["id"].as_str().unwrap().to_owned());
            }
            let (status, list) = t.get(&member, "/v1/vms?limit=1").await;
            assert_eq!(status, 200, "{table}: {list}");
        }
        // None is left in a transaction; one a saga is in the middle of (between two of its
        // statements) ends within moments, a connection left in one never does.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let in_transaction: Vec<(String, String)> = sqlx::query_as(
                "SELECT application_name, query FROM pg_stat_activity \
                 WHERE datname = current_database() AND state LIKE 'idle in transaction%'",
            )
            .fetch_all(&mut admin)
            .await
            .unwrap();
            if in_transaction.is_empty() {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "{table}: {in_transaction:?}");
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }
    let (_, list) = t.get(&member, "/v1/vms?limit=100").await;
    assert_eq!(list["vms"].as_array().unwrap().len(), launched.len(), "{list}");
    let (_, quota) = t.get(&member, "/v1/quotas/alpha").await;
    assert_eq!(quota["usage"]["cgpus"], launched.len(), "{quota}");
}
