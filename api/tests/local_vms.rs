//! A local VM's CPU and memory on its GPU host (issue [2/5]): the host's agent reports what it
//! offers local VMs, a local launch books its flavor's vCPUs and RAM there and goes nowhere they
//! do not fit, a restart books them again, and neither a hostile agent nor a tenant can change
//! what is booked.

use serde_json::json;

use crate::support::{self, on_both_stores, Store};

fn local_launch(flavor: &str) -> serde_json::Value {
    json!({"name": "local-vm", "image": "cirros-0.6.2", "flavor": flavor, "ncgpus": 1,
           "gpu_memory_mib": 1024, "mode": "shared", "locality": "local"})
}

async fn a_local_vm_takes_its_flavors_cpu_on_its_gpu_host_and_a_restart_keeps_it(store: Store) {
    let (mut t, _vm_host, gpu_host) = support::agents::agent_cloud(store, 2).await;
    let member = t.member();
    let token = t.agent_token("cg-1");
    let mut report = support::host_report("cg-1", "compute-gpu", &gpu_host.url, 2);
    // 6 vCPUs and 16 GiB for local VMs: one m1.large (4 vCPUs, 8 GiB) and two m1.small.
    report["local_vms"] = json!({"cpu_milli": 6000, "memory_mib": 16384});
    assert_eq!(t.report_host(&token, "cg-1", &report).await.0, 200);

    let large = t.launch(&member, &local_launch("m1.large")).await;
    t.wait_state(&member, &large, "ready").await;
    // A second m1.large would take 8 of 6 vCPUs: refused, though the GPUs have room.
    let (status, problem) = t.post(&member, "/v1/vms", &local_launch("m1.large")).await;
    assert_eq!(status, 507, "{problem}");
    let small = t.launch(&member, &local_launch("m1.small")).await;
    t.wait_state(&member, &small, "ready").await;
    // Admins see the offer and what is taken of it.
    let (_, hosts) = t.get(&t.admin(), "/v1/hosts").await;
    let cg1 = hosts["hosts"].as_array().unwrap().iter().find(|h| h["name"] == "cg-1").unwrap();
    assert_eq!(
        cg1["local_vms"],
        json!({"offers": {"cpu_milli": 6000, "memory_mib": 16384},
               "taken": {"cpu_milli": 5000, "memory_mib": 10240}}),
        "{cg1}"
    );

    // After a restart the two are booked again: a third m1.small still fits (6 of 6), a
    // fourth does not.
    t.restart().await;
    let member = t.member();
    let third = t.launch(&member, &local_launch("m1.small")).await;
    t.wait_state(&member, &third, "ready").await;
    let (status, problem) = t.post(&member, "/v1/vms", &local_launch("m1.small")).await;
    assert_eq!(status, 507, "6 of 6 vCPUs are taken: {problem}");

    // Deleting the large one gives its 4 vCPUs back.
    let (status, body) = t.delete(&member, &format!("/v1/vms/{large}")).await;
    assert!((200..300).contains(&status), "{status}: {body}");
    t.wait_state(&member, &large, "deleted").await;
    let fourth = t.launch(&member, &local_launch("m1.small")).await;
    t.wait_state(&member, &fourth, "ready").await;
}

async fn hostile_offers_and_tenants_are_refused_and_change_nothing(store: Store) {
    let (t, vm_host, gpu_host) = support::agents::agent_cloud(store, 2).await;
    let member = t.member();
    let token = t.agent_token("cg-1");
    let mut report = support::host_report("cg-1", "compute-gpu", &gpu_host.url, 2);
    report["local_vms"] = json!({"cpu_milli": 2000, "memory_mib": 4096});
    assert_eq!(t.report_host(&token, "cg-1", &report).await.0, 200);
    for (offers, field) in [
        (json!({"cpu_milli": u64::MAX, "memory_mib": 1}), "local_vms.cpu_milli"),
        (json!({"cpu_milli": 1000, "memory_mib": 1u64 << 40}), "local_vms.memory_mib"),
    ] {
        let mut hostile = report.clone();
        hostile["local_vms"] = offers.clone();
        let (status, problem) = t.report_host(&token, "cg-1", &hostile).await;
        assert_eq!((status, problem["field"].as_str()), (422, Some(field)), "{offers}: {problem}");
    }
    // Strings, negatives and halves are no offer at all.
    for offers in
        [json!({"cpu_milli": "lots", "memory_mib": 1}), json!({"cpu_milli": -1}), json!(7)]
    {
        let mut hostile = report.clone();
        hostile["local_vms"] = offers.clone();
        let (status, problem) = t.report_host(&token, "cg-1", &hostile).await;
        assert!(status == 400 || status == 422, "{offers}: {status} {problem}");
    }
    // A host without GPUs runs no local VM.
    let rgpu_token = t.agent_token("crg-a");
    let mut rgpu = support::host_report("crg-a", "compute-rgpu", &vm_host.url, 0);
    rgpu["local_vms"] = json!({"cpu_milli": 1000, "memory_mib": 1024});
    let (status, problem) = t.report_host(&rgpu_token, "crg-a", &rgpu).await;
    assert_eq!((status, problem["field"].as_str()), (422, Some("local_vms")), "{problem}");

    // The offer stands: 2 vCPUs. A tenant cannot claim a smaller VM than its flavor.
    let mut claimed = local_launch("m1.large");
    claimed["vm_resources"] = json!({"cpu_milli": 1, "memory_mib": 1});
    let (status, problem) = t.post(&member, "/v1/vms", &claimed).await;
    assert!(status == 400 || status == 422, "{status}: {problem}");
    let (status, problem) = t.post(&member, "/v1/vms", &local_launch("m1.large")).await;
    assert_eq!(status, 507, "4 vCPUs of 2: {problem}");
    let medium = t.launch(&member, &local_launch("m1.medium")).await;
    t.wait_state(&member, &medium, "ready").await;
}

on_both_stores!(
    a_local_vm_takes_its_flavors_cpu_on_its_gpu_host_and_a_restart_keeps_it,
    hostile_offers_and_tenants_are_refused_and_change_nothing
);
