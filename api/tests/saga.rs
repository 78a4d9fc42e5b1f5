//! The launch saga: every step's failure unwinds cleanly (VM in `error` with the reason, no server
//! left, every cGPU released, no route left), termination mid-launch, and a crash at any step resumed
//! by the next gsaasd, on SQLite and PostgreSQL.

use crate::{on_both_stores, support};

use std::time::{Duration, Instant};

use gsaasd::cloud::sim::SimFault;
use serde_json::Value;
use support::{shared_launch, Store, TestService};

on_both_stores!(
    cloud_failure_at_creation_unwinds,
    vm_going_to_error_unwinds_with_novas_fault,
    network_never_coming_up_unwinds,
    failed_undo_steps_are_retried_until_done,
    termination_during_launch_unwinds_to_deleted,
    a_crash_at_any_step_is_resumed_after_restart,
    terminations_right_after_ready_are_never_lost,
    a_launch_stores_what_its_check_resolved_and_no_tenant_may_say_it,
);

/// A DELETE that arrives as the launch saga finishes must not be dropped (the saga was still listed
/// as running, so the request did not start it, and it then exited): with no reconciler pass to
/// rescue it in these tests, a lost termination leaves the VM in `deleting` and the wait fails.
async fn terminations_right_after_ready_are_never_lost(store: Store) {
    let t = TestService::start(store).await;
    let token = t.member();
    for _ in 0..10 {
        let id = t.launch(&token, &shared_launch(1, 1024)).await;
        t.wait_vm(&token, &id, |vm| vm["state"] == "ready").await;
        t.delete(&token, &format!("/v1/vms/{id}")).await;
        t.wait_state(&token, &id, "deleted").await;
    }
    let (_, pool) = t.get(&token, "/v1/pool").await;
    assert_eq!(pool["totals"]["allocated_mib"], 0, "{pool}");
}

/// Nothing of `id` is left: no server, no cGPUs, no routes on any host.
async fn assert_nothing_left(t: &TestService, id: &str) {
    let (_, pool) = t.get(&t.member(), "/v1/pool").await;
    assert_eq!(pool["totals"]["allocated_mib"], 0, "cGPUs left: {pool}");
    assert_eq!(pool["totals"]["cgpus"], 0);
    let sim = t.service().sim.as_ref().unwrap();
    assert!(sim.servers().is_empty(), "server left: {:?}", sim.servers());
    let vm: gpgpums::VmId = id.parse().unwrap();
    let details = t
        .service()
        .app
        .visible_vm(&admin_caller(), vm, gsaasd::policy::actions::VM_SHOW)
        .await
        .unwrap();
    assert!(details.cgpus.is_empty());
    assert!(!details.vm.routes_on);
    for host in t.service().app.hosts().await.unwrap() {
        assert_eq!(
            host.applied_generation, host.routes_generation,
            "host {} not converged",
            host.name
        );
    }
}

fn admin_caller() -> gsaasd::auth::Caller {
    gsaasd::auth::Caller::new("ops", Some("ops".into()), gsaasd::auth::Role::Admin)
}

async fn launch_expecting_error(t: &TestService, reason: &str) -> Value {
    let token = t.member();
    let id = t.launch(&token, &shared_launch(2, 2048)).await;
    let vm = t
        .wait_vm(&token, &id, |vm| {
            vm["state"] == "error" && vm["cgpus"].as_array().unwrap().is_empty()
        })
        .await;
    assert!(vm["error"].as_str().unwrap().contains(reason), "{vm}");
    assert_nothing_left(t, &id).await;
    vm
}

async fn cloud_failure_at_creation_unwinds(store: Store) {
    let t = TestService::start(store).await;
    t.service().sim.as_ref().unwrap().inject(SimFault::CreateUnavailable);
    launch_expecting_error(&t, "create").await;
}

async fn vm_going_to_error_unwinds_with_novas_fault(store: Store) {
    let t = TestService::start(store).await;
    t.service()
        .sim
        .as_ref()
        .unwrap()
        .inject(SimFault::ActivationFails("No valid host was found".into()));
    launch_expecting_error(&t, "No valid host was found").await;
}

async fn network_never_coming_up_unwinds(store: Store) {
    let t = TestService::start_with(store, |c| c.launch.deploy_timeout_secs = 1).await;
    t.service().sim.as_ref().unwrap().inject(SimFault::DeployTimeout);
    launch_expecting_error(&t, "deployment").await;
}

async fn failed_undo_steps_are_retried_until_done(store: Store) {
    let t = TestService::start(store).await;
    let token = t.member();
    let id = t.launch(&token, &shared_launch(1, 1024)).await;
    t.wait_state(&token, &id, "ready").await;
    let sim = t.service().sim.as_ref().unwrap();
    sim.inject(SimFault::DeleteUnavailable);
    sim.inject(SimFault::DeleteUnavailable);
    t.delete(&token, &format!("/v1/vms/{id}")).await;
    t.wait_state(&token, &id, "deleted").await;
    assert_nothing_left(&t, &id).await;
}

async fn termination_during_launch_unwinds_to_deleted(store: Store) {
    let t = TestService::start_with(store, |c| {
        let sim = c.cloud.sim_mut().unwrap();
        sim.activation_delay_ms = 60_000;
    })
    .await;
    let token = t.member();
    let id = t.launch(&token, &shared_launch(1, 1024)).await;
    wait_for_server(&t).await;
    let (status, vm) = t.delete(&token, &format!("/v1/vms/{id}")).await;
    assert_eq!((status, vm["state"].as_str()), (202, Some("deleting")));
    // The saga is woken from its 60 s wait; nothing waits for the timeout.
    let started = Instant::now();
    t.wait_state(&token, &id, "deleted").await;
    assert!(started.elapsed() < Duration::from_secs(30));
    assert_nothing_left(&t, &id).await;
}

/// Waits until the simulated cloud has created a server (the saga is past its creation step).
async fn wait_for_server(t: &TestService) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while t.service().sim.as_ref().unwrap().servers().is_empty() {
        assert!(Instant::now() < deadline, "the cloud never got a server");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The launch saga's parameters are stored with the launch: its request and what the cloud's
/// check resolved it to, which every creation of its server takes as it is (a creation resumed
/// after a crash too: `a_crash_at_any_step_is_resumed_after_restart`). Only the check writes
/// them: a tenant's request that names them is refused, and nothing is stored of it.
async fn a_launch_stores_what_its_check_resolved_and_no_tenant_may_say_it(store: Store) {
    let t = TestService::start(store).await;
    let token = t.member();
    let id = t.launch(&token, &shared_launch(1, 1024)).await;
    let vm = t.service().app.db.vm(id.parse().unwrap()).await.unwrap().expect("the VM");
    let resolved = vm.spec.resolved.expect("the check's findings, stored with the launch");
    // The simulated cloud knows its flavors and images by name.
    assert_eq!((resolved.flavor.as_str(), resolved.image.as_str()), ("m1.small", "cirros-0.6.2"));
    let (_, view) = t.get(&token, &format!("/v1/vms/{id}")).await;
    assert!(!view.to_string().contains("resolved"), "not the tenant's to see: {view}");

    let (_, before) = t.get(&token, "/v1/vms").await;
    let forged = support::shared_launch_with(
        1,
        1024,
        serde_json::json!({ "resolved": {
            "flavor": "someone-elses-flavor", "image": "someone-elses-image", "networks": "auto"
        } }),
    );
    let (status, problem) = t.post(&token, "/v1/vms", &forged).await;
    assert!(status == 400 || status == 422, "{status} {problem}");
    assert!(problem["detail"].as_str().unwrap_or_default().contains("resolved"), "{problem}");
    let (_, after) = t.get(&token, "/v1/vms").await;
    let ids = |list: &Value| -> Vec<String> {
        list["vms"].as_array().unwrap().iter().map(|vm| vm["id"].to_string()).collect()
    };
    assert_eq!(ids(&before), ids(&after), "a refused launch stores nothing");
}

/// Crashes gsaasd while the saga waits in each step, restarts it, and checks the launch completes.
/// The cloud-init is built where the cGPUs are placed and handed to the saga; a saga resumed
/// before the server exists builds it again from what is stored, so the two must be the same
/// bytes.
async fn a_crash_at_any_step_is_resumed_after_restart(store: Store) {
    // Activation: the server exists (the saga records it with the host, once it is active).
    for (stage, ready_to_crash) in [
        ("creation", (|vm: &Value| vm["state"] == "creating") as fn(&Value) -> bool),
        ("activation", |_: &Value| true),
        ("deployment", |vm: &Value| vm["fixed_ip"].is_string()),
    ] {
        let mut t = TestService::start_with(store, |c| {
            c.launch.saga_lease_secs = 1;
            let sim = c.cloud.sim_mut().unwrap();
            match stage {
                "creation" => sim.creation_delay_ms = 300,
                "activation" => sim.activation_delay_ms = 300,
                _ => sim.deployment_delay_ms = 300,
            }
        })
        .await;
        let token = t.member();
        let id = t.launch(&token, &shared_launch(2, 1024)).await;
        if stage == "activation" {
            wait_for_server(&t).await;
        }
        t.wait_vm(&token, &id, ready_to_crash).await;
        t.restart().await;
        // The dead gsaasd's claim runs out after 1 s; then a reconciler pass resumes the saga.
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            t.service().app.reconcile_once().await;
            let (_, vm) = t.get(&token, &format!("/v1/vms/{id}")).await;
            if vm["state"] == "ready" {
                let sim = t.service().sim.clone().unwrap();
                let servers = sim.servers();
                assert_eq!(servers.len(), 1, "{stage}: one server, not two");
                let app = &t.service().app;
                let vm_id = id.parse().unwrap();
                let stored = app.db.vm(vm_id).await.unwrap().expect("the VM");
                let cgpus = app.db.cgpus_of(vm_id).await.unwrap();
                let built = gsaasd::app::vms::vm_user_data(&app.config, &stored, &cgpus).unwrap();
                let sent = sim.user_data(&servers[0].id).expect("its user_data");
                assert!(String::from_utf8_lossy(&sent).contains("RCUDA_DEVICE_COUNT=2"), "{stage}");
                assert!(sent == built, "{stage}: the cloud-init sent is what the stored VM gives");
                break;
            }
            assert!(Instant::now() < deadline, "{stage}: never resumed: {vm}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let (_, pool) = t.get(&token, "/v1/pool").await;
        assert_eq!(pool["totals"]["allocated_mib"], 2048, "{stage}: {pool}");
        t.delete(&token, &format!("/v1/vms/{id}")).await;
        t.wait_state(&token, &id, "deleted").await;
        assert_nothing_left(&t, &id).await;
    }
}

/// PostgreSQL: background work has connections of its own (`gsaasd::lanes`): the sagas write
/// through at most `BACKGROUND_CONNECTIONS` of them, named apart from the requests' in
/// `pg_stat_activity`, and never through a request's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sagas_write_through_the_background_lanes_own_connections() {
    use sqlx::Connection;
    let t = TestService::start(Store::Postgres).await;
    let member = t.member();
    let body = shared_launch(1, 1024);
    let mut launched = Vec::new();
    for _ in 0..6 {
        launched.push(t.launch(&member, &body).await);
    }
    for id in &launched {
        t.wait_state(&member, id, "ready").await;
    }
    let mut observer = sqlx::PgConnection::connect(&t.config.database_url()).await.unwrap();
    let sessions: Vec<(String, String)> = sqlx::query_as(
        "SELECT application_name, query FROM pg_stat_activity WHERE datname = current_database() \
         AND backend_type = 'client backend' AND pid <> pg_backend_pid()",
    )
    .fetch_all(&mut observer)
    .await
    .unwrap();
    let lane = |name: &str| sessions.iter().filter(|(n, _)| n == name).collect::<Vec<_>>();
    let (requests, background) = (lane("gsaasd"), lane("gsaasd-background"));
    assert_eq!(requests.len() + background.len(), sessions.len(), "{sessions:?}");
    assert!(!requests.is_empty(), "{sessions:?}");
    assert!(
        (1..=gsaasd::lanes::BACKGROUND_CONNECTIONS as usize).contains(&background.len()),
        "{sessions:?}"
    );
    // The saga's last writes (a VM ready, a host's applied generation) were the background's.
    for (_, query) in &requests {
        assert!(!query.contains("applied_generation"), "a request's connection: {query}");
    }
}
