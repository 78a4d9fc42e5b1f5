//! A fleet of several GPU models (issue [3/6]): requests by model, trait and version through the
//! API on both stores, refusals that name the constraint and book nothing, attaches that follow
//! the VM's constraints, and the pool and /metrics showing what each GPU is; quotas per model;
//! partitions of GPUs (MIG instances).

use crate::{on_both_stores, support};

use gpgpums::HostKind;
use gsaasd::config::{InventoryGpu, InventoryHost};
use serde_json::{json, Value};
use support::{Store, TestService};

fn gpus(model: &str, cc: &str, traits: &[&str], count: u32) -> InventoryGpu {
    InventoryGpu {
        compute_capability: Some(cc.parse().unwrap()),
        cuda_version: Some("12.4".parse().unwrap()),
        traits: traits.iter().map(|t| (*t).to_owned()).collect(),
        ..InventoryGpu::of(model, 16384, count)
    }
}

/// g1: 2 T4 and 2 A100 with NVLink; g2: 2 H100; and a compute-rgpu host.
async fn fleet(store: Store) -> TestService {
    TestService::start_with(store, |config| {
        let host = support::inventory_host;
        config.inventory = vec![
            host(
                "g1",
                HostKind::ComputeGpu,
                vec![gpus("T4", "7.5", &[], 2), gpus("A100", "8.0", &["CUSTOM_NVLINK"], 2)],
            ),
            host("g2", HostKind::ComputeGpu, vec![gpus("H100", "9.0", &["CUSTOM_RACK_R2"], 2)]),
            host("r1", HostKind::ComputeRgpu, vec![]),
        ];
    })
    .await
}

fn launch(ncgpus: u32, extra: Value) -> Value {
    support::shared_launch_with(ncgpus, 4096, extra)
}

async fn allocated(t: &TestService) -> u64 {
    let (_, pool) = t.get(&t.admin(), "/v1/pool").await;
    pool["totals"]["allocated_mib"].as_u64().unwrap()
}

async fn requests_by_model_and_trait_land_on_those_gpus_and_attaches_follow(store: Store) {
    let t = fleet(store).await;
    let member = t.member();
    let body = launch(2, json!({"gpu_model": "A100", "distinct_gpus": true}));
    let a100 = t.launch(&member, &body).await;
    let vm = t.wait_state(&member, &a100, "ready").await;
    assert_eq!(vm["gpus"]["gpu_model"], json!(["A100"]), "the view shows what was asked: {vm}");
    assert_eq!(t.gpu_models_of(&a100).await, ["A100", "A100"]);
    // An attach follows the VM's own constraints: both A100s hold it already, distinct GPUs
    // asked, so no room, though T4s and H100s are idle.
    let attach =
        json!({"ncgpus": 1, "gpu_memory_mib": 4096, "mode": "shared", "distinct_gpus": true});
    let (status, problem) = t.post(&member, &format!("/v1/vms/{a100}/cgpus"), &attach).await;
    assert_eq!(status, 507, "{problem}");
    // Compute capability 8.0 or more, NVLink avoided: an H100.
    let body =
        launch(1, json!({"min_compute_capability": "8.0", "traits": {"avoid": ["CUSTOM_NVLINK"]}}));
    let newer = t.launch(&member, &body).await;
    t.wait_state(&member, &newer, "ready").await;
    assert_eq!(t.gpu_models_of(&newer).await, ["H100"]);
    // Required by a trait the compute capability gives, from a list of models.
    let body = launch(
        1,
        json!({"gpu_model": ["T4", "H100"], "traits": {"required": ["HW_GPU_CUDA_COMPUTE_CAPABILITY_V7_5"]}}),
    );
    let t4 = t.launch(&member, &body).await;
    t.wait_state(&member, &t4, "ready").await;
    assert_eq!(t.gpu_models_of(&t4).await, ["T4"]);
    // The pool says what each GPU is; /metrics sums by model.
    let (_, pool) = t.get(&t.admin(), "/v1/pool").await;
    let h100 = pool["hosts"].as_array().unwrap().iter().find(|h| h["name"] == "g2").unwrap();
    let gpu = &h100["gpus"][0];
    assert_eq!(gpu["compute_capability"], "9.0", "{gpu}");
    assert_eq!(gpu["cuda_version"], "12.4", "{gpu}");
    let traits = gpu["traits"].as_array().unwrap();
    for name in ["CUSTOM_RACK_R2", "HW_GPU_CUDA_COMPUTE_CAPABILITY_V9_0", "HW_GPU_CUDA_SDK_V12_4"] {
        assert!(traits.contains(&json!(name)), "{name} in {gpu}");
    }
    let text = t.http.get(t.url("/metrics")).bearer_auth(t.admin()).send().await.unwrap();
    let text = text.text().await.unwrap();
    for line in [
        "gsaas_model_gpus{model=\"A100\"} 2",
        "gsaas_model_allocated_mib{model=\"A100\"} 8192",
        "gsaas_model_cgpus{model=\"H100\"} 1",
        "gsaas_model_idle_gpus{model=\"T4\"} 1",
    ] {
        assert!(text.contains(line), "no {line:?} in /metrics");
    }
}

async fn constraints_no_gpu_meets_are_refused_naming_them_and_book_nothing(store: Store) {
    let t = fleet(store).await;
    let member = t.member();
    let cases = [
        (json!({"gpu_model": "V100"}), "gpu_model", "V100"),
        (
            json!({"gpu_model": ["T4"], "min_compute_capability": "8.0"}),
            "min_compute_capability",
            "8.0",
        ),
        (
            json!({"traits": {"required": ["CUSTOM_NVLINK", "CUSTOM_RACK_R2"]}}),
            "traits.required",
            "CUSTOM_RACK_R2",
        ),
        (json!({"traits": {"required": ["nvlink"]}}), "traits.required", "nvlink"),
        (
            json!({"traits": {"required": ["CUSTOM_A"], "forbidden": ["CUSTOM_A"]}}),
            "traits.required",
            "CUSTOM_A",
        ),
        (json!({"traits": {"preferred": ["CUSTOM_lower"]}}), "traits.preferred", "CUSTOM_lower"),
        (json!({"min_cuda_version": "13.0"}), "min_cuda_version", "13.0"),
    ];
    for (extra, field, names) in cases {
        let (status, problem) = t.post(&member, "/v1/vms", &launch(1, extra.clone())).await;
        assert_eq!(status, 422, "{extra}: {problem}");
        let text = problem.to_string();
        assert!(text.contains(field) && text.contains(names), "{extra}: {problem}");
        // Never queued either: waiting would not bring such a GPU.
        let mut queued = launch(1, extra.clone());
        queued["queue"] = json!(true);
        let (status, problem) = t.post(&member, "/v1/vms", &queued).await;
        assert_eq!(status, 422, "{extra} with queue: {problem}");
    }
    // Malformed and hostile values: refused before anything is looked at.
    let many: Vec<String> = (0..65).map(|i| format!("CUSTOM_T{i}")).collect();
    for extra in [
        json!({"min_compute_capability": "eight"}),
        json!({"min_compute_capability": 8}),
        json!({"gpu_model": {"name": "A100"}}),
        json!({"traits": {"required": many}}),
        json!({"traits": {"wanted": ["CUSTOM_A"]}}),
        json!({"traits": {"required": ["X".repeat(100_000)]}}),
        json!({"gpu_model": vec!["A100"; 100]}),
    ] {
        let (status, problem) = t.post(&member, "/v1/vms", &launch(1, extra.clone())).await;
        assert!(status == 400 || status == 422, "{extra}: {status} {problem}");
    }
    // More H100s than there are: 507, never queued.
    let mut body = launch(3, json!({"gpu_model": "H100", "mode": "exclusive"}));
    body.as_object_mut().unwrap().remove("gpu_memory_mib");
    body["queue"] = json!(true);
    let (status, problem) = t.post(&member, "/v1/vms", &body).await;
    assert_eq!(status, 507, "{problem}");
    let (_, vms) = t.get(&member, "/v1/vms").await;
    assert_eq!(vms["vms"].as_array().map(Vec::len), Some(0), "{vms}");
    assert_eq!(allocated(&t).await, 0);
}

/// What an agent says its GPUs are: checked like the rest of its report, stored, and changed in
/// place when it changes (a driver upgrade), the GPU keeping its cGPUs. Real agents over HTTP.
async fn agents_report_what_their_gpus_are_and_a_change_keeps_their_cgpus(store: Store) {
    let (t, _vm_host, gpu_host) = support::agents::agent_cloud(store, 0).await;
    let token = t.agent_token("cg-1");
    let report = |traits: Value, cuda: &str| {
        let mut report = support::host_report("cg-1", "compute-gpu", &gpu_host.url, 2);
        for gpu in report["gpus"].as_array_mut().unwrap() {
            gpu["traits"] = traits.clone();
            gpu["compute_capability"] = json!("8.9");
            gpu["cuda_version"] = json!(cuda);
        }
        report
    };
    // Hostile or malformed: refused, nothing registered.
    let many: Vec<String> = (0..65).map(|i| format!("CUSTOM_T{i}")).collect();
    for (traits, cuda) in [
        (json!(["nvlink"]), "12.4"),
        (json!(many), "12.4"),
        (json!(["CUSTOM_NVLINK"]), "twelve"),
        (json!("CUSTOM_NVLINK"), "12.4"),
    ] {
        let (status, problem) = t.report_host(&token, "cg-1", &report(traits.clone(), cuda)).await;
        assert!(status == 400 || status == 422, "{traits} {cuda}: {status} {problem}");
    }
    let (_, pool) = t.get(&t.admin(), "/v1/pool").await;
    assert_eq!(pool["totals"]["gpus"], 0, "{pool}");
    let (status, host) =
        t.report_host(&token, "cg-1", &report(json!(["CUSTOM_NVLINK"]), "12.4")).await;
    assert_eq!(status, 200, "{host}");
    let mut body = support::agents::remote_launch(1);
    body["traits"] = json!({"required": ["CUSTOM_NVLINK", "HW_GPU_CUDA_SDK_V12_4"]});
    let id = t.launch(&t.member(), &body).await;
    t.wait_state(&t.member(), &id, "ready").await;
    // The driver is upgraded: the GPUs keep their cGPU, and requests see the new version.
    let (status, _) =
        t.report_host(&token, "cg-1", &report(json!(["CUSTOM_NVLINK"]), "12.8")).await;
    assert_eq!(status, 200);
    let (_, pool) = t.get(&t.admin(), "/v1/pool").await;
    let host = pool["hosts"].as_array().unwrap().iter().find(|h| h["name"] == "cg-1").unwrap();
    let gpus = host["gpus"].as_array().unwrap();
    assert!(gpus.iter().all(|g| g["cuda_version"] == "12.8" && g["health"].is_null()), "{pool}");
    assert_eq!(pool["totals"]["cgpus"], 1, "{pool}");
    let vm = t.wait_state(&t.member(), &id, "ready").await;
    assert_eq!(vm["cgpus"].as_array().map(Vec::len), Some(1), "{vm}");
    let (status, problem) = t.post(&t.member(), "/v1/vms", &body).await;
    assert_eq!(status, 422, "no GPU has SDK 12.4 any more: {problem}");
    let mut newer = support::agents::remote_launch(1);
    newer["min_cuda_version"] = json!("12.8");
    assert_eq!(t.post(&t.member(), "/v1/vms", &newer).await.0, 202);
}

/// g1: an A100 of 80 GiB in two `3g.40gb` partitions, and a T4; a compute-rgpu host.
async fn partitioned_fleet(store: Store) -> TestService {
    TestService::start_with(store, |config| {
        let mut a100 = gpus("A100", "8.0", &["CUSTOM_NVLINK"], 1);
        a100.memory_mib = 81920;
        a100.partitions = vec![gsaasd::config::InventoryPartition {
            profile: "3g.40gb".into(),
            memory_mib: 40960,
            count: 2,
            model: None,
            traits: ["CUSTOM_MIG".to_owned()].into(),
        }];
        config.inventory = vec![
            InventoryHost {
                name: "g1".parse().unwrap(),
                kind: HostKind::ComputeGpu,
                gpus: vec![a100, gpus("T4", "7.5", &[], 1)],
                gpu_network_address: None,
                remoting: Default::default(),
                server_base_port: None,
                topology: [("rack".to_owned(), "r1".to_owned())].into(),
            },
            InventoryHost {
                name: "r1".parse().unwrap(),
                kind: HostKind::ComputeRgpu,
                gpus: vec![],
                gpu_network_address: None,
                remoting: Default::default(),
                server_base_port: None,
                topology: Default::default(),
            },
        ];
    })
    .await
}

/// Partitions (MIG instances) through the API: each a GPU of its own with its model, profile
/// and parent in the pool view, the partitioned GPU never booked whole (no model of the
/// fleet's), the parent's taint covering its partitions, an evacuation of the parent moving
/// its partitions' cGPUs off it (never onto a sibling), and /metrics counting partitions.
async fn partitions_are_gpus_of_their_own_and_their_parent_covers_them(store: Store) {
    let t = partitioned_fleet(store).await;
    let (admin, member) = (t.admin(), t.member());
    let (_, pool) = t.get(&admin, "/v1/pool").await;
    let gpus = pool["hosts"][0]["gpus"].as_array().unwrap().clone();
    let gpu = |id: &str| gpus.iter().find(|g| g["id"] == id).unwrap_or_else(|| panic!("{id}"));
    assert_eq!(gpu("g1:gpu0")["partitions"], 2, "{pool}");
    assert!(gpu("g1:gpu1").get("partitions").is_none(), "left out when none: {pool}");
    for id in ["g1:gpu100", "g1:gpu101"] {
        assert_eq!(gpu(id)["partition"], json!({"parent": "g1:gpu0", "profile": "3g.40gb"}));
        assert_eq!(gpu(id)["model"], "A100 MIG 3g.40gb");
        let traits = gpu(id)["traits"].as_array().unwrap();
        assert!(traits.contains(&json!("CUSTOM_MIG")) && traits.contains(&json!("CUSTOM_NVLINK")));
    }
    assert_eq!(pool["totals"]["gpus"], 3, "the A100 counts through its partitions: {pool}");
    let (_, hosts) = t.get(&admin, "/v1/hosts").await;
    assert_eq!(hosts["hosts"][0]["topology"], json!({"rack": "r1"}), "the inventory's: {hosts}");
    assert_eq!(pool["totals"]["memory_mib"], 2 * 40960 + 16384);

    // A whole A100 is no model of the fleet's: refused at once, naming the models there are.
    let (status, problem) =
        t.post(&member, "/v1/vms", &launch(1, json!({"gpu_model": "A100"}))).await;
    assert_eq!((status, problem["field"].as_str()), (422, Some("gpu_model")), "{problem}");
    assert!(problem["detail"].as_str().unwrap().contains("A100 MIG 3g.40gb"), "{problem}");
    let by_trait = launch(1, json!({"traits": {"required": ["CUSTOM_MIG"]}}));
    let on_part = t.launch(&member, &by_trait).await;
    t.wait_state(&member, &on_part, "ready").await;
    assert_eq!(t.gpu_models_of(&on_part).await, ["A100 MIG 3g.40gb"]);

    // The parent's taint covers its partitions: nothing new lands on them.
    let taint = json!({"reason": "firmware update"});
    let (status, _) = t.post(&admin, "/v1/gpus/g1:gpu0/taint", &taint).await;
    assert_eq!(status, 200);
    let (status, problem) = t.post(&member, "/v1/vms", &by_trait).await;
    assert_eq!(status, 507, "{problem}");
    let (status, _) = t.post(&admin, "/v1/gpus/g1:gpu0/untaint", &json!({})).await;
    assert_eq!(status, 200);

    // Evacuating the parent moves its partitions' cGPUs off the physical GPU: the sibling
    // partition is free but no home, and the VM asked for MIG only, so nothing moves (507).
    let before = cgpu_gpus(&t, &on_part).await;
    let (status, problem) = t.post(&admin, "/v1/gpus/g1:gpu0/evacuate", &json!({})).await;
    assert_eq!(status, 507, "{problem}");
    assert_eq!(cgpu_gpus(&t, &on_part).await, before);
    // One that may go anywhere moves to the T4.
    let anywhere = t.launch(&member, &launch(1, json!({"gpu_model": "T4"}))).await;
    t.wait_state(&member, &anywhere, "ready").await;
    let (status, _) = t.delete(&member, &format!("/v1/vms/{on_part}")).await;
    assert_eq!(status, 202);
    t.wait_state(&member, &on_part, "deleted").await;
    let free =
        t.launch(&member, &launch(1, json!({"traits": {"preferred": ["CUSTOM_MIG"]}}))).await;
    t.wait_state(&member, &free, "ready").await;
    assert_eq!(t.gpu_models_of(&free).await, ["A100 MIG 3g.40gb"]);
    let (status, done) = t.post(&admin, "/v1/gpus/g1:gpu0/evacuate", &json!({})).await;
    assert_eq!((status, &done["moved"]), (200, &json!(1)), "{done}");
    assert_eq!(t.gpu_models_of(&free).await, ["T4"]);

    let text = t.http.get(t.url("/metrics")).bearer_auth(&admin).send().await.unwrap();
    let text = text.text().await.unwrap();
    assert!(text.contains("gsaas_model_gpus{model=\"A100 MIG 3g.40gb\"} 2"), "{text}");
    assert!(
        !text.contains("gsaas_model_gpus{model=\"A100\"}"),
        "a partitioned GPU is no GPU of its own model"
    );
}

/// The GPUs each cGPU of the VM is on, as an admin sees them.
async fn cgpu_gpus(t: &TestService, id: &str) -> Vec<String> {
    let (_, vm) = t.get(&t.admin(), &format!("/v1/vms/{id}")).await;
    vm["cgpus"].as_array().unwrap().iter().map(|c| c["gpu"].as_str().unwrap().to_owned()).collect()
}

/// Agents report partitions beside their parents: hostile ones (bigger than the parent, over
/// its memory together, naming a parent the report lacks or one listed after them) are refused
/// naming the entry and register nothing; a good one registers the partitions.
async fn agents_reports_of_partitions_are_checked_against_their_parents(store: Store) {
    let (t, _vm_host, gpu_host) = support::agents::agent_cloud(store, 0).await;
    let token = t.agent_token("cg-1");
    let report = |sizes: &[u64]| {
        let mut report =
            support::host_report("cg-1", "compute-gpu", &gpu_host.url, 1 + sizes.len());
        let gpus = report["gpus"].as_array_mut().unwrap();
        gpus[0]["memory_mib"] = json!(81920);
        for (i, size) in sizes.iter().enumerate() {
            gpus[1 + i]["memory_mib"] = json!(size);
            gpus[1 + i]["model"] = json!("A100 MIG 3g.40gb");
            gpus[1 + i]["partition"] = json!({"parent": "cg-1:GPU-0", "profile": "3g.40gb"});
        }
        report
    };
    let orphan = {
        let mut r = report(&[40960]);
        r["gpus"][1]["partition"]["parent"] = json!("cg-1:GPU-7");
        r
    };
    let before_parent = {
        let mut r = report(&[40960]);
        r["gpus"][0]["index"] = json!(5);
        r
    };
    for (body, entry) in [
        (report(&[81921]), "gpus[1].memory_mib"),
        (report(&[40960, 40961]), "gpus[2].memory_mib"),
        (orphan, "gpus[1].partition.parent"),
        (before_parent, "gpus[1].index"),
    ] {
        let (status, problem) = t.report_host(&token, "cg-1", &body).await;
        assert_eq!((status, problem["field"].as_str()), (422, Some(entry)), "{problem}");
    }
    let (_, pool) = t.get(&t.admin(), "/v1/pool").await;
    assert_eq!(pool["totals"]["gpus"], 0, "{pool}");
    let (status, host) = t.report_host(&token, "cg-1", &report(&[40960, 40960])).await;
    assert_eq!(status, 200, "{host}");
    let (_, pool) = t.get(&t.admin(), "/v1/pool").await;
    assert_eq!(pool["totals"]["gpus"], 2, "{pool}");
    let id = t.launch(&t.member(), &support::agents::remote_launch(2)).await;
    t.wait_state(&t.member(), &id, "ready").await;
    assert_eq!(cgpu_gpus(&t, &id).await.len(), 2);
    assert!(cgpu_gpus(&t, &id).await.iter().all(|g| g != "cg-1:GPU-0"), "the parent booked whole");
}

/// A parent GPU that fails fails its partitions: the reconciler re-homes their cGPUs (here
/// nowhere can take one, so it is lost, never moved to a sibling), and brings it back once the
/// parent works again, though the partition itself never reported a fault.
async fn a_failing_parent_takes_its_partitions_cgpus_with_it_and_brings_them_back(store: Store) {
    let (t, vm_host, gpu_host) =
        support::agents::agent_cloud_with(store, 0, |c| c.hosts.auto_rehome = true).await;
    let token = t.agent_token("cg-1");
    let mut report = support::host_report("cg-1", "compute-gpu", &gpu_host.url, 4);
    {
        let gpus = report["gpus"].as_array_mut().unwrap();
        gpus[0]["memory_mib"] = json!(81920);
        for gpu in &mut gpus[1..3] {
            gpu["memory_mib"] = json!(40960);
            gpu["model"] = json!("A100 MIG 3g.40gb");
            gpu["partition"] = json!({"parent": "cg-1:GPU-0", "profile": "3g.40gb"});
        }
    }
    assert_eq!(t.report_host(&token, "cg-1", &report).await.0, 200);
    let member = t.member();
    let mut body = support::agents::remote_launch(1);
    body["gpu_model"] = json!("A100 MIG 3g.40gb");
    let id = t.launch(&member, &body).await;
    t.wait_state(&member, &id, "ready").await;
    let on = cgpu_gpus(&t, &id).await;
    assert_eq!(on, ["cg-1:GPU-1"]);
    let states = |vm: &Value| -> Vec<String> {
        let cgpus = vm["cgpus"].as_array().unwrap();
        cgpus.iter().map(|c| c["state"].as_str().unwrap().to_owned()).collect()
    };

    let mut sick = report.clone();
    sick["gpus"][0]["unhealthy"] = json!("XID 79");
    assert_eq!(t.report_host(&token, "cg-1", &sick).await.0, 200);
    t.service().app.reconcile_once().await;
    let vm = t.wait_state(&member, &id, "ready").await;
    assert_eq!(states(&vm), ["lost"], "{vm}");
    assert_eq!(cgpu_gpus(&t, &id).await, on, "not moved to the sibling partition");
    let (status, _) = t.post(&member, "/v1/vms", &body).await;
    assert_eq!(status, 507, "the sibling takes nothing new either");

    assert_eq!(t.report_host(&token, "cg-1", &report).await.0, 200);
    t.service().app.reconcile_once().await;
    let vm = t.wait_state(&member, &id, "ready").await;
    assert_eq!(states(&vm), ["live"], "{vm}");
    drop(vm_host);
}

/// A host's MIG layout changes while a partition backs a cGPU: every report still counts (the
/// heartbeat, the GPUs that fit); the new partitions that do not fit beside the one in use join
/// once it is released; and a parent whose own record changes takes its partitions with it and
/// comes back with them.
async fn a_host_repartitioned_while_in_use_keeps_reporting_and_its_new_partitions_join(
    store: Store,
) {
    let (t, _vm_host, gpu_host) = support::agents::agent_cloud(store, 0).await;
    let token = t.agent_token("cg-1");
    // GPU-0: an A100 of 80 GiB; `parts` partitions of `mib` each at indexes `first..`.
    let layout = |model: &str, first: usize, parts: usize, mib: u64| {
        let mut report = support::host_report("cg-1", "compute-gpu", &gpu_host.url, first + parts);
        let gpus = report["gpus"].as_array_mut().unwrap();
        gpus[0]["memory_mib"] = json!(81920);
        gpus[0]["model"] = json!(model);
        for gpu in &mut gpus[first..] {
            gpu["memory_mib"] = json!(mib);
            gpu["model"] = json!("A100 MIG 1g.10gb");
            gpu["partition"] = json!({"parent": "cg-1:GPU-0", "profile": "1g.10gb"});
        }
        // Indexes 1..first are no GPUs at all.
        gpus.drain(1..first);
        report
    };
    let partitions = |pool: &Value| -> usize {
        let host = pool["hosts"].as_array().unwrap().iter().find(|h| h["name"] == "cg-1");
        let gpus = host.unwrap()["gpus"].as_array().unwrap();
        gpus.iter().filter(|g| g.get("partition").is_some()).count()
    };
    let two = layout("A100", 1, 2, 40960);
    assert_eq!(t.report_host(&token, "cg-1", &two).await.0, 200);
    let id = t.launch(&t.member(), &support::agents::remote_launch(1)).await;
    t.wait_state(&t.member(), &id, "ready").await;
    assert_eq!(cgpu_gpus(&t, &id).await, ["cg-1:GPU-1"]);

    // Seven 1g.10gb instances at indexes 3..10: GPU-1 stays (in use) with its 40 GiB, so four
    // fit beside it; the report counts all the same.
    let seven = layout("A100", 3, 7, 10240);
    let (status, host) = t.report_host(&token, "cg-1", &seven).await;
    assert_eq!(status, 200, "{host}");
    let (_, pool) = t.get(&t.admin(), "/v1/pool").await;
    assert_eq!(partitions(&pool), 5, "{pool}");
    let (status, _) = t.delete(&t.member(), &format!("/v1/vms/{id}")).await;
    assert_eq!(status, 202);
    t.wait_state(&t.member(), &id, "deleted").await;
    assert_eq!(t.report_host(&token, "cg-1", &seven).await.0, 200);
    let (_, pool) = t.get(&t.admin(), "/v1/pool").await;
    assert_eq!(partitions(&pool), 7, "{pool}");

    // The parent's record changes (its model), its partitions' do not: all leave and come back.
    let renamed = layout("A100-SXM4", 3, 7, 10240);
    let (status, host) = t.report_host(&token, "cg-1", &renamed).await;
    assert_eq!(status, 200, "{host}");
    let (_, pool) = t.get(&t.admin(), "/v1/pool").await;
    let gpus = pool["hosts"][0]["gpus"].as_array().unwrap();
    assert_eq!((gpus[0]["model"].as_str(), &gpus[0]["partitions"]), (Some("A100-SXM4"), &json!(7)));
    assert_eq!(pool["totals"]["gpus"], 7, "{pool}");
}

/// Hosts carry where they sit in the network (the inventory's, or their agent's report):
/// admins see it in the host list, a changed one is recorded at the next report, a hostile one is
/// refused naming the level and changes nothing, and tenants see no host at all.
async fn hosts_carry_their_topology_for_admins_only(store: Store) {
    let (t, _vm_host, gpu_host) = support::agents::agent_cloud(store, 0).await;
    let token = t.agent_token("cg-1");
    let topology_of = |hosts: &Value, name: &str| -> Value {
        let list = hosts["hosts"].as_array().unwrap();
        list.iter().find(|h| h["name"] == name).map(|h| h["topology"].clone()).unwrap_or_default()
    };
    let mut report = support::host_report("cg-1", "compute-gpu", &gpu_host.url, 1);
    report["topology"] = json!({"zone": "z1", "rack": "r12"});
    assert_eq!(t.report_host(&token, "cg-1", &report).await.0, 200);
    let (_, hosts) = t.get(&t.admin(), "/v1/hosts").await;
    assert_eq!(topology_of(&hosts, "cg-1"), json!({"rack": "r12", "zone": "z1"}), "{hosts}");
    // Moved to another rack: recorded at its next report (a heartbeat with the same GPUs).
    report["topology"]["rack"] = json!("r7");
    assert_eq!(t.report_host(&token, "cg-1", &report).await.0, 200);
    let (_, hosts) = t.get(&t.admin(), "/v1/hosts").await;
    assert_eq!(topology_of(&hosts, "cg-1")["rack"], "r7", "{hosts}");
    // Hostile names: refused naming the level, nothing recorded.
    let many: serde_json::Map<String, Value> =
        (0..9).map(|i| (format!("l{i}"), json!("g"))).collect();
    for (topology, field) in [
        (json!({"rack": "r7; DROP TABLE hosts"}), "topology.rack"),
        (json!({"rack": "\u{202e}r7"}), "topology.rack"),
        (json!({"Rack": "r7"}), "topology"),
        (json!(many), "topology"),
    ] {
        let mut hostile = report.clone();
        hostile["topology"] = topology.clone();
        let (status, problem) = t.report_host(&token, "cg-1", &hostile).await;
        assert_eq!(
            (status, problem["field"].as_str()),
            (422, Some(field)),
            "{topology}: {problem}"
        );
    }
    let (_, hosts) = t.get(&t.admin(), "/v1/hosts").await;
    assert_eq!(topology_of(&hosts, "cg-1")["rack"], "r7", "{hosts}");
    // Tenants learn nothing of where hosts are.
    let (status, _) = t.get(&t.member(), "/v1/hosts").await;
    assert_ne!(status, 200);
}

/// In-process hosts, which measure nothing, get round trips from their topology (50 µs in one
/// rack, 150 µs one level out), so `network.max_rtt_us` places on them; and on the embedded
/// default, whose testbed is one switch.
async fn in_process_hosts_have_round_trips_from_their_topology(store: Store) {
    let t = racks(store).await;
    let (_, hosts) = t.get(&t.admin(), "/v1/hosts").await;
    let v2 = hosts["hosts"].as_array().unwrap().iter().find(|h| h["name"] == "v2").unwrap();
    assert_eq!(v2["rtt_us"], json!({"g1": 150, "g2": 50}), "{hosts}");
    let member = t.member();
    let near = |us: u32| {
        json!({ "image": "cirros-0.6.2", "flavor": "m1.small", "ncgpus": 1, "gpu_memory_mib": 1024,
            "mode": "shared", "locality": "remote", "network": {"max_rtt_us": us} })
    };
    let id = t.launch(&member, &near(100)).await;
    let vm = t.wait_state(&member, &id, "ready").await;
    assert_eq!(vm["gpus"]["network"], json!({"max_rtt_us": 100}), "{vm}");
    let (status, problem) = t.post(&member, "/v1/vms", &near(40)).await;
    assert_eq!(status, 507, "nothing is that near: {problem}");

    let t = TestService::start(store).await;
    let member = t.member();
    let id = t.launch(&member, &near(60)).await;
    t.wait_state(&member, &id, "ready").await;
}

/// A GPU server has a name that fits every layer, `gpu_server`, in the pool's and an admin's VM
/// views; the old `rcuda_endpoint` stays beside it, marked deprecated in the API document. An
/// agent may report its GPUs' servers as `gpu_server` or (deprecated) `rcuda`, not both.
async fn gpu_servers_have_a_layer_neutral_name_and_the_rcuda_names_are_deprecated(store: Store) {
    let document: Value = serde_json::from_str(include_str!("../../openapi/gsaas.json")).unwrap();
    let schemas = &document["components"]["schemas"];
    for (schema, old) in
        [("GpuView", "rcuda_endpoint"), ("CgpuView", "rcuda_endpoint"), ("GpuReportBody", "rcuda")]
    {
        let properties = &schemas[schema]["properties"];
        assert_eq!(properties[old]["deprecated"], true, "{schema}.{old}");
        assert!(properties["gpu_server"].is_object(), "{schema} has no gpu_server");
        assert!(properties["gpu_server"]["deprecated"].is_null(), "{schema}.gpu_server");
    }

    let (t, _vm_host, gpu_host) = support::agents::agent_cloud(store, 0).await;
    let token = t.agent_token("cg-1");
    let mut report = support::host_report("cg-1", "compute-gpu", &gpu_host.url, 1);
    let server = report["gpus"][0]["rcuda"].clone();
    let mut both = report.clone();
    both["gpus"][0]["gpu_server"] = server.clone();
    let (status, problem) = t.report_host(&token, "cg-1", &both).await;
    assert!((400..500).contains(&status), "both names at once: {status} {problem}");
    report["gpus"][0].as_object_mut().unwrap().remove("rcuda");
    report["gpus"][0]["gpu_server"] = server;
    let (status, body) = t.report_host(&token, "cg-1", &report).await;
    assert_eq!(status, 200, "{body}");
    let (_, pool) = t.get(&t.admin(), "/v1/pool").await;
    let host = pool["hosts"].as_array().unwrap().iter().find(|h| h["name"] == "cg-1").unwrap();
    let gpu = &host["gpus"][0];
    let address = support::rcuda_address("cg-1");
    assert_eq!(gpu["gpu_server"], format!("{address}:8308"), "{gpu}");
    assert_eq!(gpu["rcuda_endpoint"], gpu["gpu_server"], "{gpu}");

    let t = TestService::start(store).await;
    let member = t.member();
    let id = t.launch(&member, &support::shared_launch(1, 1024)).await;
    t.wait_state(&member, &id, "ready").await;
    let (_, vm) = t.get(&t.admin(), &format!("/v1/vms/{id}")).await;
    let cgpu = &vm["cgpus"][0];
    assert!(cgpu["gpu_server"].as_str().is_some_and(|s| s.contains(':')), "{vm}");
    assert_eq!(cgpu["rcuda_endpoint"], cgpu["gpu_server"], "{vm}");
    let (_, vm) = t.get(&member, &format!("/v1/vms/{id}")).await;
    for hidden in ["gpu_server", "rcuda_endpoint"] {
        assert!(vm["cgpus"][0].get(hidden).is_none(), "a tenant sees {hidden}: {vm}");
    }
}

/// g1 in rack r1, where no VM may run; g2 in rack r2 with the compute-rgpu host v2; v3 alone in
/// rack r3. One zone. Each GPU host has two GPUs of 16 GiB.
async fn racks(store: Store) -> TestService {
    racks_with(store, |_| {}).await
}

async fn racks_with(store: Store, tweak: impl FnOnce(&mut gsaasd::config::Config)) -> TestService {
    TestService::start_with(store, |config| {
        let host = |name: &str, kind, gpus, rack: &str| InventoryHost {
            name: name.parse().unwrap(),
            kind,
            gpus,
            gpu_network_address: None,
            remoting: Default::default(),
            server_base_port: None,
            topology: [("rack".to_owned(), rack.to_owned()), ("zone".to_owned(), "z1".to_owned())]
                .into(),
        };
        config.inventory = vec![
            host("g1", HostKind::ComputeGpu, vec![gpus("A100", "8.0", &[], 2)], "r1"),
            host("g2", HostKind::ComputeGpu, vec![gpus("A100", "8.0", &[], 2)], "r2"),
            host("v2", HostKind::ComputeRgpu, vec![], "r2"),
            host("v3", HostKind::ComputeRgpu, vec![], "r3"),
        ];
        tweak(config);
    })
    .await
}

/// A cGPU moved off its GPU keeps its VM's network constraint: not while the VM is still
/// launching (its host not yet known: the move is refused until it settles), and after, onto a
/// GPU of its VM's rack although another rack's GPUs come first.
async fn a_moved_cgpu_keeps_its_vms_network_constraint_even_while_it_launches(store: Store) {
    let t = racks_with(store, |config| {
        config.cloud.sim_mut().unwrap().activation_delay_ms = 1_500;
    })
    .await;
    let (admin, member) = (t.admin(), t.member());
    let body = launch(1, json!({"locality": "remote", "network": {"same": "rack"}}));
    let id = t.launch(&member, &body).await;
    let gpu_of = |vm: &Value| vm["cgpus"][0]["gpu"].as_str().unwrap_or_default().to_owned();
    let (_, vm) = t.get(&admin, &format!("/v1/vms/{id}")).await;
    assert_ne!(vm["state"], "ready", "still launching: {vm}");
    let first = gpu_of(&vm);
    assert!(first.starts_with("g2:"), "{vm}");
    let (status, problem) = t.post(&admin, &format!("/v1/gpus/{first}/evacuate"), &json!({})).await;
    assert_eq!(status, 409, "moved while its VM launches: {problem}");
    let (_, vm) = t.get(&admin, &format!("/v1/vms/{id}")).await;
    assert_eq!(gpu_of(&vm), first, "{vm}");
    t.wait_state(&member, &id, "ready").await;
    let (status, body) = t.post(&admin, &format!("/v1/gpus/{first}/evacuate"), &json!({})).await;
    assert_eq!(status, 200, "{body}");
    let (_, vm) = t.get(&admin, &format!("/v1/vms/{id}")).await;
    let moved = gpu_of(&vm);
    assert!(moved.starts_with("g2:") && moved != first, "out of its rack: {vm}");
}

/// A launch asking for one rack gets its GPUs and its VM there, attaches follow the VM's host,
/// a rack that could never hold the request is refused at once (even with `queue`), a preferred
/// rack gives way, bad network requests are refused naming the field and book nothing, and
/// tenants see what they asked, never where it went.
async fn network_constraints_keep_the_vm_and_its_gpus_in_one_group(store: Store) {
    let t = racks(store).await;
    let (admin, member) = (t.admin(), t.member());
    let remote =
        |n: u32, network: Value| launch(n, json!({"locality": "remote", "network": network}));
    for (network, field) in [
        (json!({"same": "row"}), "network.same"),
        (json!({"strength": "preferred"}), "network.strength"),
        (json!({"max_rtt_us": 0}), "network.max_rtt_us"),
        (json!({"same": "Rack 1"}), "network.same"),
    ] {
        let (status, problem) = t.post(&member, "/v1/vms", &remote(1, network.clone())).await;
        assert_eq!((status, problem["field"].as_str()), (422, Some(field)), "{network}: {problem}");
    }
    let (status, problem) = t.post(&member, "/v1/vms", &remote(1, json!({"sam": "rack"}))).await;
    assert!((400..500).contains(&status), "{problem}");
    assert_eq!(allocated(&t).await, 0, "nothing booked");
    // Rack r1's GPUs come first, but no VM may run there: rack r2.
    let id = t.launch(&member, &remote(1, json!({"same": "rack"}))).await;
    let vm = t.wait_state(&member, &id, "ready").await;
    assert_eq!(vm["gpus"]["network"], json!({"same": "rack"}), "{vm}");
    assert!(vm.get("host").is_none() && vm["cgpus"][0].get("host").is_none(), "{vm}");
    let (_, seen) = t.get(&admin, &format!("/v1/vms/{id}")).await;
    assert_eq!(
        (seen["host"].as_str(), seen["cgpus"][0]["host"].as_str()),
        (Some("v2"), Some("g2"))
    );
    // An attach follows the VM's host: rack r2 again.
    let attach = json!({"ncgpus": 1, "gpu_memory_mib": 4096, "mode": "shared"});
    let (status, body) = t.post(&member, &format!("/v1/vms/{id}/cgpus"), &attach).await;
    assert_eq!(status, 202, "{body}");
    t.wait_vm(&member, &id, |vm| {
        vm["cgpus"]
            .as_array()
            .is_some_and(|c| c.len() == 2 && c.iter().all(|c| c["state"] == "live"))
    })
    .await;
    let (_, seen) = t.get(&admin, &format!("/v1/vms/{id}")).await;
    assert!(seen["cgpus"].as_array().unwrap().iter().all(|c| c["host"] == "g2"), "{seen}");
    // Nine 4 GiB cGPUs: rack r2 holds eight at most, so never: refused now, even to the queue.
    let never =
        launch(9, json!({"locality": "remote", "network": {"same": "rack"}, "queue": true}));
    let (status, problem) = t.post(&member, "/v1/vms", &never).await;
    assert_eq!(status, 507, "{problem}");
    assert_eq!(allocated(&t).await, 2 * 4096);
    // Preferred: it gives way, and the VM runs on any compute-rgpu host.
    let preferred = remote(9, json!({"same": "rack", "strength": "preferred"}));
    let id = t.launch(&member, &preferred).await;
    t.wait_state(&member, &id, "ready").await;
    assert_eq!(allocated(&t).await, 11 * 4096);
}

/// Agents learn which GPU hosts to measure (theirs alone to ask), report round trips, and a
/// launch with a round-trip limit runs only where they are short enough: unmeasured is far.
/// Hostile reports (to the host itself, out of range, too many) are refused and change
/// nothing; small moves are not recorded (no pool change per heartbeat), big ones are, and a
/// report without round trips (an agent that has not measured yet) keeps them.
async fn round_trips_agents_measure_limit_where_a_vm_may_run(store: Store) {
    // Every move that matters is recorded at once here (rtts_to_record's own test holds the
    // interval between recordings).
    let (t, vm_host, _gpu_host) = support::agents::agent_cloud_with(store, 2, |config| {
        config.hosts.rtt_record_interval_secs = 0;
    })
    .await;
    let (admin, member) = (t.admin(), t.member());
    let token = t.agent_token("crg-a");
    let (status, targets) = t.get(&token, "/v1/hosts/crg-a/rtt-targets").await;
    assert_eq!(status, 200, "{targets}");
    assert_eq!(targets["targets"].as_array().unwrap().len(), 1, "{targets}");
    assert_eq!(
        (targets["targets"][0]["host"].as_str(), targets["targets"][0]["port"].as_u64()),
        (Some("cg-1"), Some(8308))
    );
    for (who, host) in
        [(t.agent_token("cg-1"), "crg-a"), (member.clone(), "crg-a"), (token.clone(), "nowhere")]
    {
        let (status, _) = t.get(&who, &format!("/v1/hosts/{host}/rtt-targets")).await;
        assert_eq!(status, 404, "{host}");
    }
    let near = |us: u32| {
        let mut body = support::agents::remote_launch(1);
        body["network"] = json!({"max_rtt_us": us});
        body
    };
    // Nothing measured yet: no host is near any GPU, now or ever.
    let (status, problem) = t.post(&member, "/v1/vms", &near(500)).await;
    assert_eq!(status, 507, "{problem}");
    let mut report = support::host_report("crg-a", "compute-rgpu", &vm_host.url, 0);
    let rtt_of = |hosts: &Value| {
        hosts["hosts"].as_array().unwrap().iter().find(|h| h["name"] == "crg-a").unwrap()["rtt_us"]
            .clone()
    };
    report["rtt_us"] = json!({"cg-1": 180, "ghost": 40});
    assert_eq!(t.report_host(&token, "crg-a", &report).await.0, 200);
    let (_, hosts) = t.get(&admin, "/v1/hosts").await;
    assert_eq!(rtt_of(&hosts), json!({"cg-1": 180, "ghost": 40}), "{hosts}");
    let id = t.launch(&member, &near(500)).await;
    let vm = t.wait_state(&member, &id, "ready").await;
    assert_eq!(vm["gpus"]["network"], json!({"max_rtt_us": 500}));
    let (status, problem) = t.post(&member, "/v1/vms", &near(100)).await;
    assert_eq!(status, 507, "{problem}");
    // Hostile reports: refused naming the entry, nothing recorded.
    let many: serde_json::Map<String, Value> =
        (0..65).map(|i| (format!("h{i}"), json!(1))).collect();
    for (rtt_us, entry) in [
        (json!({"crg-a": 5}), "rtt_us.crg-a"),
        (json!({"cg-1": 0}), "rtt_us.cg-1"),
        (json!({"cg-1": 10_000_001}), "rtt_us.cg-1"),
        (json!(many), "rtt_us"),
    ] {
        let mut hostile = report.clone();
        hostile["rtt_us"] = rtt_us.clone();
        let (status, problem) = t.report_host(&token, "crg-a", &hostile).await;
        assert_eq!((status, problem["field"].as_str()), (422, Some(entry)), "{rtt_us}: {problem}");
    }
    // Another host's agent cannot report for crg-a.
    let (status, _) = t.report_host(&t.agent_token("cg-1"), "crg-a", &report).await;
    assert_eq!(status, 404);
    // A small move is noise; a big one is recorded and placement follows it.
    report["rtt_us"] = json!({"cg-1": 200, "ghost": 40});
    assert_eq!(t.report_host(&token, "crg-a", &report).await.0, 200);
    let (_, hosts) = t.get(&admin, "/v1/hosts").await;
    assert_eq!(rtt_of(&hosts)["cg-1"], 180, "{hosts}");
    report["rtt_us"] = json!({"cg-1": 60, "ghost": 40});
    assert_eq!(t.report_host(&token, "crg-a", &report).await.0, 200);
    let (_, hosts) = t.get(&admin, "/v1/hosts").await;
    assert_eq!(rtt_of(&hosts)["cg-1"], 60, "{hosts}");
    report.as_object_mut().unwrap().remove("rtt_us");
    assert_eq!(t.report_host(&token, "crg-a", &report).await.0, 200);
    let id = t.launch(&member, &near(100)).await;
    t.wait_state(&member, &id, "ready").await;
}

on_both_stores!(
    round_trips_agents_measure_limit_where_a_vm_may_run,
    in_process_hosts_have_round_trips_from_their_topology,
    gpu_servers_have_a_layer_neutral_name_and_the_rcuda_names_are_deprecated,
    a_moved_cgpu_keeps_its_vms_network_constraint_even_while_it_launches,
    network_constraints_keep_the_vm_and_its_gpus_in_one_group,
    hosts_carry_their_topology_for_admins_only,
    a_host_repartitioned_while_in_use_keeps_reporting_and_its_new_partitions_join,
    a_failing_parent_takes_its_partitions_cgpus_with_it_and_brings_them_back,
    partitions_are_gpus_of_their_own_and_their_parent_covers_them,
    agents_reports_of_partitions_are_checked_against_their_parents,
    per_model_limits_steer_launches_refuse_naming_the_model_and_show_use,
    requests_by_model_and_trait_land_on_those_gpus_and_attaches_follow,
    constraints_no_gpu_meets_are_refused_naming_them_and_book_nothing,
    agents_report_what_their_gpus_are_and_a_change_keeps_their_cgpus,
    a_borrowing_limit_by_model_keeps_loans_off_that_model
);

/// Limits per GPU model: a launch that names no model goes to the models the project has room
/// on, one for a model at its limit is refused naming the model (403) and books nothing, other
/// projects are not held, and the views, /metrics and a restart keep what was set and used.
async fn per_model_limits_steer_launches_refuse_naming_the_model_and_show_use(store: Store) {
    let mut t = fleet(store).await;
    let (admin, member) = (t.admin(), t.member());
    let limits = json!({"models": {"H100": {"cgpus": 1}, "A100": {"memory_mib": 8192}}});
    let (status, quota) = t.put(&admin, "/v1/quotas/alpha", &limits).await;
    assert_eq!(status, 200, "{quota}");
    assert_eq!(
        quota["limits"]["models"],
        json!({
            "A100": {"cgpus": null, "memory_mib": 8192, "exclusive_gpus": null},
            "H100": {"cgpus": 1, "memory_mib": null, "exclusive_gpus": null}
        })
    );
    // Bad limits per model are refused naming the field, and change nothing.
    let many_models: serde_json::Map<String, Value> =
        (0..65).map(|i| (format!("M{i}"), json!({"cgpus": 1}))).collect();
    for (body, field) in [
        (json!({"models": {"": {"cgpus": 1}}}), "models"),
        (json!({"models": {"H100": {"gpus": 1}}}), "models"),
        (json!({"models": {"H100": {"cgpus": 1u64 << 60}}}), "models.H100.cgpus"),
        (json!({"models": many_models}), "models"),
    ] {
        let (status, problem) = t.put(&admin, "/v1/quotas/alpha", &body).await;
        assert_eq!(status, 422, "{body}: {problem}");
        let named = problem["field"].as_str().unwrap_or_default();
        assert!(named.starts_with(field), "{body}: {problem}");
    }
    let (_, quota) = t.get(&member, "/v1/quotas/alpha").await;
    assert_eq!(quota["limits"]["models"]["H100"]["cgpus"], 1, "{quota}");

    let h100 = t.launch(&member, &launch(1, json!({"gpu_model": "H100"}))).await;
    t.wait_state(&member, &h100, "ready").await;
    let before = allocated(&t).await;
    let (status, problem) =
        t.post(&member, "/v1/vms", &launch(1, json!({"gpu_model": "H100"}))).await;
    assert_eq!((status, problem["code"].as_str()), (403, Some("quota_exceeded")), "{problem}");
    assert_eq!(
        problem["quota"],
        json!({"resource": "cgpus", "model": "H100", "limit": 1, "in_use": 1, "requested": 1})
    );
    assert!(problem["detail"].as_str().unwrap().contains("of GPU model H100"), "{problem}");
    // Waiting would not help: it is refused, not queued.
    let queued = launch(1, json!({"gpu_model": "H100", "queue": true}));
    assert_eq!(t.post(&member, "/v1/vms", &queued).await.0, 403);
    assert_eq!(allocated(&t).await, before, "a refusal booked something");

    // Naming no model, and preferring the H100s' rack: the H100s are out, and a model whose
    // room left cannot take the whole request (A100's memory, for the second launch when the
    // first took A100s) is out too.
    let mut models = Vec::new();
    for _ in 0..2 {
        let body = json!({"distinct_gpus": true, "traits": {"preferred": ["CUSTOM_RACK_R2"]}});
        let any = t.launch(&member, &launch(2, body)).await;
        t.wait_state(&member, &any, "ready").await;
        models.extend(t.gpu_models_of(&any).await);
    }
    assert!(!models.contains(&"H100".to_owned()), "{models:?}");
    assert!(models.iter().filter(|m| *m == "A100").count() <= 2, "{models:?}");
    // An attach to the H100 VM follows its model, at its limit: refused the same way.
    let attach = json!({"ncgpus": 1, "gpu_memory_mib": 4096});
    let (status, problem) = t.post(&member, &format!("/v1/vms/{h100}/cgpus"), &attach).await;
    assert_eq!((status, problem["quota"]["model"].as_str()), (403, Some("H100")), "{problem}");

    // Another project is not held by alpha's limits.
    let beta = t.token("beta", gsaasd::auth::Role::Member);
    let theirs = t.launch(&beta, &launch(1, json!({"gpu_model": "H100"}))).await;
    t.wait_state(&beta, &theirs, "ready").await;

    // The use per model, in the quota view and /metrics, and after a restart (which reads the
    // limits back from the database and the use from the bookings).
    let usage_of = |quota: &Value, model: &str| quota["usage"]["models"][model]["cgpus"].as_u64();
    let (_, quota) = t.get(&member, "/v1/quotas/alpha").await;
    assert_eq!(usage_of(&quota, "H100"), Some(1), "{quota}");
    let placed = |m: &str| models.iter().filter(|x| *x == m).count() as u64;
    for model in ["A100", "T4"] {
        assert_eq!(usage_of(&quota, model).unwrap_or(0), placed(model), "{model}: {quota}");
    }
    assert_eq!(quota["usage"]["cgpus"], 5, "{quota}");
    let text = t.http.get(t.url("/metrics")).bearer_auth(&admin).send().await.unwrap();
    let text = text.text().await.unwrap();
    for line in [
        "gsaas_quota_model_limit{project=\"alpha\",model=\"H100\",resource=\"cgpus\"} 1",
        "gsaas_quota_model_usage{project=\"alpha\",model=\"H100\",resource=\"cgpus\"} 1",
        "gsaas_quota_model_limit{project=\"alpha\",model=\"A100\",resource=\"memory_mib\"} 8192",
    ] {
        assert!(text.contains(line), "no {line:?} in /metrics");
    }
    t.restart().await;
    let (_, after) = t.get(&member, "/v1/quotas/alpha").await;
    assert_eq!((&after["limits"], &after["usage"]), (&quota["limits"], &quota["usage"]));
    let (status, _) = t.post(&member, "/v1/vms", &launch(1, json!({"gpu_model": "H100"}))).await;
    assert_eq!(status, 403, "the limit per model was lost in the restart");
    // Ending the H100 VM gives its model back.
    assert_eq!(t.delete(&member, &format!("/v1/vms/{h100}")).await.0, 202);
    t.wait_state(&member, &h100, "deleted").await;
    let again = t.launch(&member, &launch(1, json!({"gpu_model": "H100"}))).await;
    t.wait_state(&member, &again, "ready").await;
}

/// Cohort terms per GPU model (issue [5/5]): alpha may borrow past its quota of one cGPU, but
/// none of it on H100s: its own cGPU may be one, its loans are placed elsewhere, and a loan that
/// could only be on an H100 is refused naming the model; bad terms per model change nothing.
async fn a_borrowing_limit_by_model_keeps_loans_off_that_model(store: Store) {
    let t = fleet(store).await;
    let (admin, alpha) = (t.admin(), t.member());
    for (project, cgpus) in [("alpha", 1), ("beta", 8)] {
        let (status, _) =
            t.put(&admin, &format!("/v1/quotas/{project}"), &json!({"cgpus": cgpus})).await;
        assert_eq!(status, 200);
    }
    let terms = |by_model: Value| {
        json!({"members": {
            "alpha": {"borrow_by_default": true, "borrowing_limit_by_model": by_model},
            "beta": {}
        }})
    };
    let many_models: serde_json::Map<String, Value> =
        (0..65).map(|i| (format!("M{i}"), json!({"cgpus": 1}))).collect();
    for (by_model, field) in [
        (json!({"": {"cgpus": 1}}), "members.alpha.borrowing_limit_by_model"),
        (json!({"H100": {"gpus": 1}}), "members"),
        (
            json!({"H100": {"cgpus": 1u64 << 60}}),
            "members.alpha.borrowing_limit_by_model.H100.cgpus",
        ),
        (Value::Object(many_models), "members.alpha.borrowing_limit_by_model"),
    ] {
        let (status, problem) = t.put(&admin, "/v1/cohorts/lab", &terms(by_model.clone())).await;
        assert_eq!(status, 422, "{by_model}: {problem}");
        let named = problem["field"].as_str().unwrap_or_default();
        assert!(named.starts_with(field), "{by_model}: {problem}");
    }
    assert_eq!(t.get(&admin, "/v1/cohorts/lab").await.0, 404, "a refusal made the cohort");
    let (status, cohort) =
        t.put(&admin, "/v1/cohorts/lab", &terms(json!({"H100": {"cgpus": 0}}))).await;
    assert_eq!(status, 200, "{cohort}");
    let alpha_terms = &cohort["members"]["alpha"]["terms"];
    assert_eq!(alpha_terms["borrowing_limit_by_model"]["H100"]["cgpus"], 0, "{cohort}");

    // Its own cGPU may be an H100.
    let own = t.launch(&alpha, &launch(1, json!({"gpu_model": "H100"}))).await;
    let ready = t.wait_state(&alpha, &own, "ready").await;
    assert_eq!(ready["cgpus"][0]["borrowed"], false, "{ready}");
    // A loan that could only be on an H100 is refused, naming the model; so is an attach.
    let (status, problem) =
        t.post(&alpha, "/v1/vms", &launch(1, json!({"gpu_model": "H100"}))).await;
    assert_eq!(status, 403, "{problem}");
    assert_eq!(
        problem["quota"],
        json!({"resource": "cgpus", "model": "H100", "limit": 0, "in_use": 0, "requested": 1,
               "cohort": "lab", "on_loan": true})
    );
    assert!(problem["detail"].as_str().unwrap().contains("on loan of GPU model H100"), "{problem}");
    let attach = json!({"ncgpus": 1, "gpu_memory_mib": 4096});
    let (status, problem) = t.post(&alpha, &format!("/v1/vms/{own}/cgpus"), &attach).await;
    assert_eq!((status, problem["quota"]["on_loan"].as_bool()), (403, Some(true)), "{problem}");
    // Preferring the H100s' rack, the loans still go elsewhere, and are marked.
    let body = json!({"distinct_gpus": true, "traits": {"preferred": ["CUSTOM_RACK_R2"]}});
    let loaned = t.launch(&alpha, &launch(2, body)).await;
    let ready = t.wait_state(&alpha, &loaned, "ready").await;
    let marks: Vec<&Value> =
        ready["cgpus"].as_array().unwrap().iter().map(|c| &c["borrowed"]).collect();
    assert_eq!(marks, [true, true], "{ready}");
    let models = t.gpu_models_of(&loaned).await;
    assert!(!models.contains(&"H100".to_owned()), "{models:?}");
}
