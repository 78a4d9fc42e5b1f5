//! Two gsaasd replicas on one PostgreSQL never over-allocate a GPU: concurrent launches spread over
//! both fill the pool exactly, every launch past capacity gets 507, and terminations free capacity
//! that either replica can then use.

use crate::support;

use std::collections::HashMap;

use serde_json::json;
use support::TestService;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_replicas_on_one_postgres_never_over_allocate() {
    let (a, b) = TestService::two_replicas().await;
    let token = a.member();

    // The testbed has 4 GPUs of 8 GiB: 32 cGPUs of 1 GiB fit, not one more.
    let body = json!({"image": "cirros-0.6.2", "flavor": "m1.small", "ncgpus": 1,
                      "gpu_memory_mib": 1024, "mode": "shared"});
    let launches = (0..48).map(|i| {
        let replica = if i % 2 == 0 { &a } else { &b };
        let body = body.clone();
        let token = token.clone();
        async move { replica.post(&token, "/v1/vms", &body).await }
    });
    let results = support::join_all(launches).await;
    let accepted = support::accepted_ids(&results);
    let refused = results.iter().filter(|(s, _)| *s == 507).count();
    let statuses: Vec<u16> = results.iter().map(|(s, _)| *s).collect();
    assert_eq!(accepted.len(), 32, "{statuses:?}");
    assert_eq!(refused, 16, "{statuses:?}");

    // Every accepted launch completes.
    for id in &accepted {
        a.wait_state(&token, id, "ready").await;
    }
    // What the database holds, seen through either replica's admin view, fits every GPU.
    for replica in [&a, &b] {
        let (_, pool) = replica.get(&replica.admin(), "/v1/pool").await;
        let mut per_gpu: HashMap<String, u64> = HashMap::new();
        for host in pool["hosts"].as_array().unwrap() {
            for gpu in host["gpus"].as_array().unwrap() {
                assert!(
                    gpu["allocated_mib"].as_u64().unwrap() <= gpu["memory_mib"].as_u64().unwrap(),
                    "{gpu}"
                );
                per_gpu.insert(
                    gpu["id"].as_str().unwrap().into(),
                    gpu["allocated_mib"].as_u64().unwrap(),
                );
            }
        }
        assert_eq!(per_gpu.values().sum::<u64>(), 32 * 1024, "{pool}");
    }

    // Terminations through one replica free capacity the other can use.
    for id in &accepted[..4] {
        a.wait_state(&token, id, "ready").await;
        a.delete(&token, &format!("/v1/vms/{id}")).await;
        a.wait_state(&token, id, "deleted").await;
    }
    for _ in 0..4 {
        b.launch(&token, &body).await;
    }
    let (status, _) = b.post(&token, "/v1/vms", &body).await;
    assert_eq!(status, 507);
}
