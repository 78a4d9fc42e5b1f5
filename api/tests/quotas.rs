//! Project quotas: admins set them, tenants read their own, launches and attaches past a limit get
//! 403 `quota_exceeded` naming the resource, the limit, the use and the request, and change
//! nothing; on both stores. Two replicas racing on one PostgreSQL cannot pass a limit together.

use crate::{on_both_stores, support};

use gsaasd::auth::Role;
use serde_json::{json, Value};
use support::{shared_launch, Store, TestService};

on_both_stores!(limits_are_enforced_on_launches_and_attaches_and_refusals_change_nothing);

fn quota_of(problem: &Value) -> (String, u64, u64, u64) {
    let q = &problem["quota"];
    (
        q["resource"].as_str().unwrap_or_default().to_owned(),
        q["limit"].as_u64().unwrap_or(u64::MAX),
        q["in_use"].as_u64().unwrap_or(u64::MAX),
        q["requested"].as_u64().unwrap_or(u64::MAX),
    )
}

/// The refusal's status and code, and that it names what it should.
fn assert_quota_exceeded(status: u16, problem: &Value, expected: (&str, u64, u64, u64)) {
    assert_eq!((status, problem["code"].as_str()), (403, Some("quota_exceeded")), "{problem}");
    let (resource, limit, in_use, requested) = quota_of(problem);
    assert_eq!((resource.as_str(), limit, in_use, requested), expected, "{problem}");
    let detail = problem["detail"].as_str().unwrap_or_default();
    assert!(detail.contains(expected.0) && detail.contains("alpha"), "{detail}");
}

async fn allocated(t: &TestService) -> u64 {
    let (_, pool) = t.get(&t.admin(), "/v1/pool").await;
    pool["totals"]["allocated_mib"].as_u64().unwrap()
}

async fn vm_count(t: &TestService, token: &str) -> usize {
    let (_, list) = t.get(token, "/v1/vms").await;
    list["vms"].as_array().unwrap().len()
}

async fn limits_are_enforced_on_launches_and_attaches_and_refusals_change_nothing(store: Store) {
    let t = TestService::start(store).await;
    let (admin, member) = (t.admin(), t.member());
    let other = t.token("beta", Role::Member);

    // Defaults (none configured): no limits, nothing used.
    let (status, quota) = t.get(&member, "/v1/quotas/alpha").await;
    assert_eq!(status, 200, "{quota}");
    assert_eq!(
        (quota["own_limits"].as_bool(), &quota["limits"]["cgpus"]),
        (Some(false), &Value::Null)
    );

    // Only admins set limits; tenants see only their own project's.
    let limits = json!({"cgpus": 3, "vms": 2, "memory_mib": null});
    for (token, path) in [(&member, "/v1/quotas/alpha"), (&other, "/v1/quotas/alpha")] {
        let (status, _) = t.put(token, path, &limits).await;
        assert_eq!(status, 404, "a tenant set a quota");
    }
    let (status, _) = t.get(&other, "/v1/quotas/alpha").await;
    assert_eq!(status, 404, "another tenant read alpha's quota");
    let (status, quota) = t.put(&admin, "/v1/quotas/alpha", &limits).await;
    assert_eq!(status, 200, "{quota}");
    assert_eq!(quota["own_limits"], true);
    assert_eq!(
        quota["limits"],
        json!({
            "cgpus": 3, "memory_mib": null, "exclusive_gpus": null, "vms": 2, "max_priority": 0,
            "models": {}
        })
    );

    // Bad limits are refused, naming the field, and change nothing.
    for (body, field) in [
        (json!({"cgpus": -1}), "cgpus"),
        (json!({"cgpus": 1u64 << 60}), "cgpus"),
        (json!({"gpus": 1}), "gpus"),
        // Above the service's queue.max_priority (100).
        (json!({"max_priority": 101}), "max_priority"),
        (json!({"max_priority": -1}), "max_priority"),
    ] {
        let (status, problem) = t.put(&admin, "/v1/quotas/alpha", &body).await;
        assert!(matches!(status, 400 | 422), "{body}: {status} {problem}");
        assert!(problem["field"].as_str().unwrap_or_default().starts_with(field), "{problem}");
    }
    let (status, problem) = t.put(&admin, "/v1/quotas/bad%20name", &limits).await;
    assert_eq!((status, problem["field"].as_str()), (422, Some("project")), "{problem}");
    let (_, quota) = t.get(&member, "/v1/quotas/alpha").await;
    assert_eq!(quota["limits"]["cgpus"], 3);

    // Launches: 2 cGPUs fit; 2 more do not (cGPUs), and nothing changes; 1 more does.
    let first = t.launch(&member, &shared_launch(2, 1024)).await;
    let (status, problem) = t.post(&member, "/v1/vms", &shared_launch(2, 1024)).await;
    assert_quota_exceeded(status, &problem, ("cgpus", 3, 2, 2));
    assert_eq!((vm_count(&t, &member).await, allocated(&t).await), (1, 2048));
    t.launch(&member, &shared_launch(1, 1024)).await;
    // Another project is not limited by alpha's quota.
    t.launch(&other, &shared_launch(4, 512)).await;
    // VMs: with room for cGPUs, a third VM is past the VM limit.
    let (status, _) = t.put(&admin, "/v1/quotas/alpha", &json!({"cgpus": 4, "vms": 2})).await;
    assert_eq!(status, 200);
    let (status, problem) = t.post(&member, "/v1/vms", &shared_launch(1, 1024)).await;
    assert_quota_exceeded(status, &problem, ("vms", 2, 2, 1));

    // Attaches count: one more cGPU fits (4), the next does not.
    t.wait_state(&member, &first, "ready").await;
    t.attach_one_and_wait(&member, &first, 1024, 3).await;
    let attach = json!({"ncgpus": 1, "gpu_memory_mib": 1024, "mode": "shared"});
    let path = format!("/v1/vms/{first}/cgpus");
    let before = allocated(&t).await;
    let (status, problem) = t.post(&member, &path, &attach).await;
    assert_quota_exceeded(status, &problem, ("cgpus", 4, 4, 1));
    assert_eq!(allocated(&t).await, before);
    // Memory counts what is booked.
    let (status, _) = t.put(&admin, "/v1/quotas/alpha", &json!({"memory_mib": 4096})).await;
    assert_eq!(status, 200);
    let (status, problem) = t
        .post(&member, &path, &json!({"ncgpus": 1, "gpu_memory_mib": 2048, "mode": "shared"}))
        .await;
    assert_quota_exceeded(status, &problem, ("memory_mib", 4096, 4096, 2048));

    // Use, as the tenant reads it; the list shows a tenant its own project only, admins all.
    let (_, quota) = t.get(&member, "/v1/quotas/alpha").await;
    assert_eq!(
        quota["usage"],
        json!({
            "cgpus": 4, "memory_mib": 4096, "exclusive_gpus": 0, "vms": 2,
            "models": {"NVIDIA Quadro M4000": {"cgpus": 4, "memory_mib": 4096, "exclusive_gpus": 0}}
        }),
        "{quota}"
    );
    let projects = |list: &Value| -> Vec<String> {
        let quotas = list["quotas"].as_array().unwrap();
        quotas.iter().map(|q| q["project"].as_str().unwrap().to_owned()).collect()
    };
    let (_, list) = t.get(&member, "/v1/quotas").await;
    assert_eq!(
        (projects(&list), &list["quotas"][0]["usage"]),
        (vec!["alpha".to_owned()], &quota["usage"])
    );
    let (_, list) = t.get(&admin, "/v1/quotas").await;
    assert_eq!(projects(&list), ["alpha", "beta"]);
    // And in the metrics, per project and resource (no limit: no limit sample).
    let metrics = t.http.get(t.url("/metrics")).bearer_auth(&admin).send().await.unwrap();
    let metrics = metrics.text().await.unwrap();
    for line in [
        "gsaas_quota_limit{project=\"alpha\",resource=\"memory_mib\"} 4096",
        "gsaas_quota_usage{project=\"alpha\",resource=\"cgpus\"} 4",
        "gsaas_quota_usage{project=\"alpha\",resource=\"vms\"} 2",
        "gsaas_quota_usage{project=\"beta\",resource=\"memory_mib\"} 2048",
    ] {
        assert!(metrics.lines().any(|l| l == line), "no {line} in:\n{metrics}");
    }
    assert!(!metrics.contains("gsaas_quota_limit{project=\"beta\""), "{metrics}");
    // A terminated VM frees its share; the defaults come back with DELETE.
    let (status, _) = t.delete(&member, &format!("/v1/vms/{first}")).await;
    assert_eq!(status, 202);
    t.wait_state(&member, &first, "deleted").await;
    let (_, quota) = t.get(&member, "/v1/quotas/alpha").await;
    assert_eq!(quota["usage"]["cgpus"], 1, "{quota}");
    assert_eq!(quota["usage"]["vms"], 1, "{quota}");
    let (status, quota) = t.delete(&admin, "/v1/quotas/alpha").await;
    assert_eq!((status, quota["own_limits"].as_bool()), (200, Some(false)), "{quota}");
    let (status, _) = t.delete(&member, "/v1/quotas/alpha").await;
    assert_eq!(status, 404);
}

/// Two replicas on one PostgreSQL, launching at once for one project: exactly the limit's worth
/// is accepted, whichever replica each launch reaches.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_replicas_racing_cannot_pass_a_quota_together() {
    let (a, b) = TestService::two_replicas().await;
    let (status, _) = a.put(&a.admin(), "/v1/quotas/alpha", &json!({"cgpus": 10})).await;
    assert_eq!(status, 200);
    // Each replica books from its own ledger: b has not read the limit yet, and must.
    let token = a.member();
    let launches = (0..24).map(|i| {
        let replica = if i % 2 == 0 { &a } else { &b };
        let token = token.clone();
        async move { replica.post(&token, "/v1/vms", &shared_launch(1, 256)).await }
    });
    let results = support::join_all(launches).await;
    let statuses: Vec<u16> = results.iter().map(|(s, _)| *s).collect();
    let accepted = support::accepted_ids(&results);
    assert_eq!(accepted.len(), 10, "{statuses:?}");
    assert!(
        results
            .iter()
            .filter(|(s, _)| *s != 202)
            .all(|(s, p)| *s == 403 && p["code"] == "quota_exceeded"),
        "{statuses:?}"
    );
    for replica in [&a, &b] {
        let (_, quota) = replica.get(&token, "/v1/quotas/alpha").await;
        assert_eq!(quota["usage"]["cgpus"], 10, "{quota}");
    }
}
