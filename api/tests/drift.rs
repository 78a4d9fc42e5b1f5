//! Cloud drift (issue [4/5]): servers deleted or moved behind GSaaS's back, on the simulated
//! cloud (the real Nova's are in `openstack.rs`).

use crate::{on_both_stores, support};

use gsaasd::auth::{Caller, Role};
use gsaasd::cloud::ServerId;
use serde_json::{json, Value};
use support::{shared_launch, Store, TestService};

on_both_stores!(
    a_server_deleted_outside_gsaas_ends_its_vm_and_frees_its_cgpus,
    a_vm_moved_to_another_host_takes_its_routes_along,
    a_server_the_cloud_forgot_while_gsaasd_was_down_ends_its_vm,
);

async fn admin_vm(t: &TestService, id: &str) -> Value {
    t.get(&t.admin(), &format!("/v1/vms/{id}")).await.1
}

async fn allocated(t: &TestService) -> u64 {
    t.get(&t.member(), "/v1/pool").await.1["totals"]["allocated_mib"].as_u64().unwrap()
}

async fn a_server_deleted_outside_gsaas_ends_its_vm_and_frees_its_cgpus(store: Store) {
    let t = TestService::start(store).await;
    let member = t.member();
    let id = t.launch(&member, &shared_launch(2, 1024)).await;
    t.wait_state(&member, &id, "ready").await;
    let keep = t.launch(&member, &shared_launch(1, 1024)).await;
    t.wait_state(&member, &keep, "ready").await;
    assert_eq!(allocated(&t).await, 3 * 1024);
    let server = ServerId(admin_vm(&t, &id).await["server_id"].as_str().unwrap().to_owned());
    let sim = t.service().sim.clone().expect("the simulated cloud");
    let app = &t.service().app;

    // A failed look at the cloud changes nothing; the next one finds the deletion.
    sim.inject(gsaasd::cloud::sim::SimFault::ListingUnavailable);
    sim.delete_outside(&server).unwrap();
    let status = app.reconcile_once().await;
    assert!(status.last_error.as_deref().is_some_and(|e| e.contains("cloud")), "{status:?}");
    assert_eq!(t.get(&member, &format!("/v1/vms/{id}")).await.1["state"], "ready");
    let status = app.reconcile_once().await;
    assert_eq!(status.servers_deleted, 1, "{status:?}");
    let vm = t.wait_state(&member, &id, "deleted").await;
    assert!(vm["error"].as_str().unwrap().contains("deleted outside GSaaS"), "{vm}");
    assert_eq!(allocated(&t).await, 1024, "its cGPUs are free; the other VM's stay");
    assert_eq!(t.get(&member, &format!("/v1/vms/{keep}")).await.1["state"], "ready");
    // Seen again in the next window, it is not ended twice.
    assert_eq!(app.reconcile_once().await.servers_deleted, 0);
}

/// Deleted and archived while no gsaasd looked, the server is in no listing, not even as deleted:
/// the first pass after the start, which lists every server, ends its VM by its absence.
async fn a_server_the_cloud_forgot_while_gsaasd_was_down_ends_its_vm(store: Store) {
    let mut t = TestService::start(store).await;
    let member = t.member();
    let gone = t.launch(&member, &shared_launch(2, 1024)).await;
    t.wait_state(&member, &gone, "ready").await;
    let keep = t.launch(&member, &shared_launch(1, 1024)).await;
    t.wait_state(&member, &keep, "ready").await;
    let server = ServerId(admin_vm(&t, &gone).await["server_id"].as_str().unwrap().to_owned());

    let sim = t.crash().expect("the simulated cloud");
    sim.delete_outside(&server).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while sim.servers().iter().any(|s| s.id == server) {
        assert!(std::time::Instant::now() < deadline, "the server is never removed");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    sim.archive_deleted();
    t.start_again(Some(sim)).await;

    let vm = t.wait_state(&member, &gone, "deleted").await;
    assert!(vm["error"].as_str().unwrap().contains("deleted outside GSaaS"), "{vm}");
    assert_eq!(allocated(&t).await, 1024, "its cGPUs are free; the other VM's stay");
    assert_eq!(t.get(&member, &format!("/v1/vms/{keep}")).await.1["state"], "ready");
    let status = t.service().app.reconcile_once().await;
    assert_eq!(status.servers_deleted, 0, "ended once: {status:?}");
}

async fn a_vm_moved_to_another_host_takes_its_routes_along(store: Store) {
    let t = TestService::start(store).await;
    let member = t.member();
    let mut request = shared_launch(1, 1024);
    request["locality"] = json!("remote");
    let id = t.launch(&member, &request).await;
    let before = t.wait_state(&member, &id, "ready").await;
    let vm = admin_vm(&t, &id).await;
    let from: gpgpums::HostId = vm["host"].as_str().unwrap().parse().unwrap();
    let server = ServerId(vm["server_id"].as_str().unwrap().to_owned());
    let sim = t.service().sim.clone().expect("the simulated cloud");
    let to = sim.hosts().into_iter().find(|h| *h != from && h.as_str().contains("rgpu")).unwrap();
    let app = &t.service().app;

    sim.migrate(&server, &to).unwrap();
    let status = app.reconcile_once().await;
    assert_eq!(status.servers_moved, 1, "{status:?}");
    let vm = admin_vm(&t, &id).await;
    assert_eq!(vm["host"], to.as_str());
    let after = t.get(&member, &format!("/v1/vms/{id}")).await.1;
    assert_eq!(after["rcuda_env"], before["rcuda_env"], "nothing changes inside the VM");
    assert!(after["events"].as_array().unwrap().iter().any(|e| e["kind"] == "moved"), "{after}");
    assert!(!after.to_string().contains(to.as_str()), "tenants learn no host: {after}");

    // The new host's agent routes the VM's cGPU; the old host's no longer does.
    let agents = app.in_process_agents().expect("in-process agents");
    let hosts = app.hosts().await.unwrap();
    let record = |name: &gpgpums::HostId| hosts.iter().find(|h| &h.name == name).unwrap().clone();
    let masked = vm["cgpus"][0]["masked_endpoint"].as_str().unwrap().parse().unwrap();
    let source = vm["fixed_ip"].as_str().unwrap().parse().unwrap();
    let admin = Caller::new("ops", Some("ops".into()), Role::Admin);
    let tap = app
        .visible_vm(&admin, id.parse().unwrap(), gsaasd::policy::actions::VM_SHOW)
        .await
        .unwrap()
        .vm
        .tap
        .unwrap();
    let target = vm["cgpus"][0]["rcuda_endpoint"].as_str().unwrap().to_owned();
    let routed = |host: &gpgpums::HostId| {
        agents.resolve(&record(host), source, &tap, masked).map(|t| t.to_string())
    };
    assert_eq!(routed(&to), Some(target));
    assert_eq!(routed(&from), None);
    assert_eq!(app.reconcile_once().await.servers_moved, 0, "followed once");
    // It still terminates cleanly from its new host.
    t.delete(&member, &format!("/v1/vms/{id}")).await;
    t.wait_state(&member, &id, "deleted").await;
    assert_eq!(routed(&to), None);
}
