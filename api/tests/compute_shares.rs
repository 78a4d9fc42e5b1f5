//! Compute shares (issue [1/5], part 4): a shared cGPU may ask for a percent of its GPU's SMs.
//! On a managed GPU host that runs MPS, gsaasd places it where the shares stay at or under 100
//! per GPU and hands the share to the host's agent with the cGPU's server; where no GPU the
//! request may take runs MPS, it is refused with a 422 naming `compute_percent`, never booked
//! without its share. What a hostile tenant tries: past 100 on one GPU, odd values, a share for
//! an exclusive cGPU, a share through an attach.

use crate::on_both_stores;
use crate::support::agents::{managed_agent_cloud_with, remote_launch};
use crate::support::Store;
use serde_json::{json, Value};

on_both_stores!(
    shares_go_with_their_servers_and_never_pass_100_percent_of_a_gpu,
    a_share_where_no_gpu_runs_mps_is_refused_naming_the_field,
);

fn share_launch(percent: u32) -> Value {
    let mut request = remote_launch(1);
    request["compute_percent"] = json!(percent);
    request
}

async fn shares_go_with_their_servers_and_never_pass_100_percent_of_a_gpu(store: Store) {
    let (mut t, _vm_host, gpu_host) = managed_agent_cloud_with(store, 1, true).await;
    let member = t.member();
    let first = t.launch(&member, &share_launch(60)).await;
    let vm = t.wait_state(&member, &first, "ready").await;
    assert_eq!(vm["gpus"]["compute_percent"], 60, "{vm}");
    assert_eq!(vm["cgpus"][0]["compute_percent"], 60, "{vm}");
    // The GPU host's agent is told the share with the cGPU's server.
    let served = gpu_host.table().unwrap().servers;
    assert_eq!(served.iter().map(|s| s.compute_percent).collect::<Vec<_>>(), [Some(60)]);
    // 60 + 50 would pass 100: no capacity (the GPU has memory for it).
    let (status, body) = t.post(&member, "/v1/vms", &share_launch(50)).await;
    assert_eq!(status, 507, "{body}");
    // 60 + 40 is the GPU whole.
    let second = t.launch(&member, &share_launch(40)).await;
    t.wait_state(&member, &second, "ready").await;
    // A cGPU without a share would use the SMs unbounded beside them: it waits too.
    let (status, body) = t.post(&member, "/v1/vms", &remote_launch(1)).await;
    assert_eq!(status, 507, "{body}");
    // So does an attach that asks for 1 percent more.
    let path = format!("/v1/vms/{second}/cgpus");
    let attach =
        json!({"ncgpus": 1, "gpu_memory_mib": 512, "mode": "shared", "compute_percent": 1});
    let (status, body) = t.post(&member, &path, &attach).await;
    assert_eq!(status, 507, "{body}");
    // A restarted gsaasd counts the stored shares as the one before did.
    t.restart().await;
    let (status, body) = t.post(&member, "/v1/vms", &share_launch(1)).await;
    assert_eq!(status, 507, "{body}");
    // The first VM ends: its 60 percent are free again, and its server ends with it.
    t.terminate_and_wait(&member, &first).await;
    let third = t.launch(&member, &share_launch(60)).await;
    let vm = t.wait_state(&member, &third, "ready").await;
    assert_eq!(vm["cgpus"][0]["compute_percent"], 60);
    let mut shares: Vec<Option<u8>> =
        gpu_host.table().unwrap().servers.iter().map(|s| s.compute_percent).collect();
    shares.sort();
    assert_eq!(shares, [Some(40), Some(60)]);
}

async fn a_share_where_no_gpu_runs_mps_is_refused_naming_the_field(store: Store) {
    let (t, _vm_host, gpu_host) = managed_agent_cloud_with(store, 2, false).await;
    let member = t.member();
    let refused = |field: &'static str| {
        move |(status, body): (u16, Value)| {
            assert_eq!(status, 422, "{body}");
            let detail = body["detail"].as_str().unwrap_or_default().to_owned();
            assert!(detail.contains(field), "{body}");
            detail
        }
    };
    // The GPUs are there, but none can hold a share: said, not ignored, not queued.
    let mut queued = share_launch(30);
    queued["queue"] = json!(true);
    for body in [share_launch(30), queued] {
        let detail = refused("compute_percent")(t.post(&member, "/v1/vms", &body).await);
        assert!(detail.contains("MPS"), "{detail}");
    }
    // Values that are no share at all, and a share of a whole GPU.
    for bad in [json!(0), json!(101), json!(-5), json!(1u64 << 40), json!("half")] {
        let mut body = remote_launch(1);
        body["compute_percent"] = bad;
        refused("compute_percent")(t.post(&member, "/v1/vms", &body).await);
    }
    let mut exclusive = share_launch(50);
    exclusive["mode"] = json!("exclusive");
    exclusive.as_object_mut().unwrap().remove("gpu_memory_mib");
    refused("compute_percent")(t.post(&member, "/v1/vms", &exclusive).await);
    // Nothing was booked or started by any of it.
    let (_, list) = t.get(&member, "/v1/vms").await;
    assert_eq!(list["vms"].as_array().unwrap().len(), 0, "{list}");
    assert!(gpu_host.table().is_none_or(|table| table.servers.is_empty()));
    // A VM without a share runs; an attach that asks for one is refused the same way.
    let id = t.launch(&member, &remote_launch(1)).await;
    t.wait_state(&member, &id, "ready").await;
    let attach =
        json!({"ncgpus": 1, "gpu_memory_mib": 512, "mode": "shared", "compute_percent": 20});
    refused("compute_percent")(t.post(&member, &format!("/v1/vms/{id}/cgpus"), &attach).await);
    let vm = t.wait_state(&member, &id, "ready").await;
    assert_eq!(vm["cgpus"].as_array().unwrap().len(), 1, "{vm}");
}
