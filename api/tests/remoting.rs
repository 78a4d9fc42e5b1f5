//! A pool that mixes remote-GPU layers (issue [4/6]): each VM's cGPUs speak the layer it asked
//! for or the service's default, for life (attach and re-homing keep to it); its environment is
//! its layer's; what a layer cannot do is refused and books nothing.

use crate::{on_both_stores, support};

use gpgpums::{HostKind, Remoting};
use gsaasd::config::{InventoryGpu, InventoryHost};
use serde_json::{json, Value};
use support::{Store, TestService};

/// "rc": 2 GPUs behind rCUDA; "lu": 2 behind LUPINE; "r1": no GPU.
async fn mixed(store: Store) -> TestService {
    TestService::start_with(store, |config| {
        let host = |name: &str, kind, gpus, remoting| InventoryHost {
            name: name.parse().unwrap(),
            kind,
            gpus,
            gpu_network_address: None,
            remoting,
            server_base_port: None,
            topology: Default::default(),
        };
        let two = || vec![InventoryGpu::of("A100", 16384, 2)];
        config.inventory = vec![
            host("rc", HostKind::ComputeGpu, two(), Remoting::Rcuda),
            host("lu", HostKind::ComputeGpu, two(), Remoting::Lupine),
            host("r1", HostKind::ComputeRgpu, vec![], Remoting::Rcuda),
        ];
    })
    .await
}

fn launch(ncgpus: u32, extra: Value) -> Value {
    support::shared_launch_with(ncgpus, 16384, extra)
}

/// The hosts of the VM's cGPUs, as an admin sees them.
async fn hosts_of(t: &TestService, id: &str) -> Vec<String> {
    let (_, vm) = t.get(&t.admin(), &format!("/v1/vms/{id}")).await;
    let cgpus = vm["cgpus"].as_array().unwrap();
    cgpus.iter().map(|c| c["host"].as_str().unwrap().to_owned()).collect()
}

async fn each_vm_speaks_its_layer_and_sees_its_layers_environment(store: Store) {
    let t = mixed(store).await;
    let member = t.member();
    let lupine = t.launch(&member, &launch(2, json!({"remoting": "lupine"}))).await;
    let vm = t.wait_state(&member, &lupine, "ready").await;
    assert_eq!(vm["gpus"]["remoting"], "lupine", "{vm}");
    assert_eq!(hosts_of(&t, &lupine).await, ["lu", "lu"]);
    let env = &vm["gpu_env"];
    let masked: Vec<&str> = vm["cgpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["masked_endpoint"].as_str().unwrap())
        .collect();
    assert_eq!(env["LUPINE_SERVER"], masked.join(","), "{vm}");
    assert_eq!(env["LUPINE_DISABLE_LOCAL"], "1");
    assert_eq!(
        (env["GSAAS_CGPUS"].as_str(), env["GSAAS_CGPUS_MISSING"].as_str()),
        (Some("0,1"), Some(""))
    );
    assert!(vm["rcuda_env"].as_object().unwrap().is_empty(), "no rCUDA variables: {vm}");
    // Admins see the servers: LUPINE's port.
    let (_, admin_view) = t.get(&t.admin(), &format!("/v1/vms/{lupine}")).await;
    assert!(admin_view["cgpus"][0]["rcuda_endpoint"].as_str().unwrap().ends_with(":14833"));

    // No layer named: the default, rCUDA, on the rCUDA host though LUPINE's host is full.
    let rcuda = t.launch(&member, &launch(1, json!({}))).await;
    let vm = t.wait_state(&member, &rcuda, "ready").await;
    assert_eq!(vm["gpus"]["remoting"], "rcuda");
    assert_eq!(vm["gpu_env"]["RCUDA_DEVICE_COUNT"], "1");
    assert_eq!(vm["rcuda_env"]["RCUDA_DEVICE_COUNT"], "1");
    assert!(vm["gpu_env"].get("LUPINE_SERVER").is_none());

    // An attach keeps to the VM's layer: LUPINE's GPUs are full, an rCUDA GPU is free: 507.
    let attach = json!({"ncgpus": 1, "gpu_memory_mib": 16384, "mode": "shared"});
    let (status, problem) = t.post(&member, &format!("/v1/vms/{lupine}/cgpus"), &attach).await;
    assert_eq!(status, 507, "{problem}");
    assert_eq!(hosts_of(&t, &lupine).await, ["lu", "lu"]);
    // Re-homing too: evacuating a LUPINE GPU finds no LUPINE GPU free, though one of rCUDA is.
    let (_, pool) = t.get(&t.admin(), "/v1/pool").await;
    let lu = pool["hosts"].as_array().unwrap().iter().find(|h| h["name"] == "lu").unwrap();
    assert_eq!(lu["gpus"][0]["remoting"], "lupine", "{lu}");
    let gpu = lu["gpus"][0]["id"].as_str().unwrap();
    let (status, problem) =
        t.post(&t.admin(), &format!("/v1/gpus/{gpu}/evacuate"), &json!({})).await;
    assert_eq!(status, 507, "{problem}");
    assert_eq!(hosts_of(&t, &lupine).await, ["lu", "lu"]);
}

async fn what_a_layer_cannot_do_is_refused_and_books_nothing(store: Store) {
    let t = mixed(store).await;
    let member = t.member();
    let (_, before) = t.get(&t.admin(), "/v1/pool").await;
    // LUPINE's client reaches 16 servers at most.
    let (status, problem) =
        t.post(&member, "/v1/vms", &launch(17, json!({"remoting": "lupine"}))).await;
    assert_eq!((status, problem["field"].as_str()), (422, Some("ncgpus")), "{problem}");
    assert!(problem.to_string().contains("lupine"), "{problem}");
    // A layer nobody knows.
    let (status, problem) =
        t.post(&member, "/v1/vms", &launch(1, json!({"remoting": "scuda"}))).await;
    assert_eq!(status, 422, "{problem}");
    assert!(problem.to_string().contains("remoting"), "{problem}");
    let (_, after) = t.get(&t.admin(), "/v1/pool").await;
    assert_eq!(before["totals"], after["totals"]);
    // Nor by attaching, even to wait in the queue: 2 held and 15 more are 17.
    let lupine = t.launch(&member, &launch(2, json!({"remoting": "lupine"}))).await;
    t.wait_state(&member, &lupine, "ready").await;
    let attach = json!({"ncgpus": 15, "gpu_memory_mib": 16384, "mode": "shared", "queue": true});
    let (status, problem) = t.post(&member, &format!("/v1/vms/{lupine}/cgpus"), &attach).await;
    assert_eq!((status, problem["field"].as_str()), (422, Some("ncgpus")), "{problem}");
    assert!(problem.to_string().contains("holds 2 cGPUs"), "{problem}");
    let (_, vm) = t.get(&member, &format!("/v1/vms/{lupine}")).await;
    assert!(vm.get("queued_attaches").is_none(), "nothing waits: {vm}");
}

async fn a_layer_no_gpu_speaks_is_refused_naming_remoting(store: Store) {
    let t = TestService::start_with(store, |_| {}).await;
    let member = t.member();
    let mut body = launch(1, json!({"remoting": "lupine"}));
    body["gpu_memory_mib"] = json!(4096);
    let (status, problem) = t.post(&member, "/v1/vms", &body).await;
    assert_eq!((status, problem["field"].as_str()), (422, Some("remoting")), "{problem}");
    assert!(problem.to_string().contains("speaks lupine"), "{problem}");
}

on_both_stores!(
    each_vm_speaks_its_layer_and_sees_its_layers_environment,
    what_a_layer_cannot_do_is_refused_and_books_nothing,
    a_layer_no_gpu_speaks_is_refused_naming_remoting,
);
