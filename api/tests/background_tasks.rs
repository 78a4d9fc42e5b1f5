//! Background tasks (issue [3/5] part 3): every task run by one driver, each one's last
//! activation shown to admins and on `/metrics`, activated on demand, and hidden from tenants.

use crate::{on_both_stores, support};

use std::time::{Duration, Instant};

use gsaasd::cloud::sim::SimFault;
use serde_json::{json, Value};
use support::{Store, TestService};

on_both_stores!(
    every_task_runs_and_reports_to_admins,
    a_failing_task_says_so_and_recovers,
    tenants_cannot_see_or_run_tasks,
);

/// The tasks a gsaasd without a notification broker runs, in the order it lists them.
const TASKS: [&str; 14] = [
    "host_liveness",
    "pool_refresh",
    "route_tables",
    "cloud_drift",
    "rehome",
    "fences",
    "usage_rollup",
    "delegations",
    "saga_resumption",
    "queue_rounds",
    "revocations",
    "usage_fold",
    "policy_reload",
    "loan_marks",
];

async fn tasks(t: &TestService) -> Vec<Value> {
    let (status, list) = t.get(&t.admin(), "/v1/background-tasks").await;
    assert_eq!(status, 200, "{list}");
    list["tasks"].as_array().unwrap().clone()
}

fn task<'a>(tasks: &'a [Value], name: &str) -> &'a Value {
    tasks.iter().find(|t| t["name"] == name).unwrap_or_else(|| panic!("no task {name}"))
}

async fn metrics(t: &TestService) -> String {
    let response = t.http.get(t.url("/metrics")).bearer_auth(t.admin()).send().await.unwrap();
    assert_eq!(response.status().as_u16(), 200);
    response.text().await.unwrap()
}

fn sample(metrics: &str, family: &str, task: &str) -> Option<f64> {
    let prefix = format!("{family}{{task=\"{task}\"}} ");
    metrics.lines().find_map(|l| l.strip_prefix(&prefix)).map(|v| v.parse().unwrap())
}

/// Waits (bounded) until every task has run once: the first pass runs each reconciler task at
/// start, the others start on their own timers.
async fn all_ran(t: &TestService) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let listed = tasks(t).await;
        if listed.iter().all(|t| t["activations"].as_u64().unwrap() > 0) {
            return listed;
        }
        assert!(Instant::now() < deadline, "some task never ran: {listed:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn every_task_runs_and_reports_to_admins(store: Store) {
    let t = TestService::start(store).await;
    let listed = all_ran(&t).await;
    let names: Vec<&str> = listed.iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(names, TASKS, "no broker: no notifications task");
    for task in &listed {
        assert!(task["period_ms"].as_u64().unwrap() > 0, "{task}");
        assert!(!task["description"].as_str().unwrap().is_empty(), "{task}");
        assert!(task["last_started_ms"].as_i64().is_some(), "{task}");
    }

    // A launch leaves a table to push; an activation on demand pushes it and says so.
    let member = t.member();
    let id = t.launch(&member, &support::shared_launch(1, 1024)).await;
    t.wait_state(&member, &id, "ready").await;
    let before = task(&tasks(&t).await, "queue_rounds")["activations"].as_u64().unwrap();
    let (status, ran) =
        t.post(&t.admin(), "/v1/background-tasks/queue_rounds/activate", &json!({})).await;
    assert_eq!(status, 200, "{ran}");
    assert!(ran["activations"].as_u64().unwrap() > before, "{ran}");
    assert_eq!(ran["last_outcome"], "ok", "{ran}");
    assert_eq!(ran["last_report"]["waiting"], 0, "{ran}");
    assert!(ran["last_duration_ms"].as_u64().is_some(), "{ran}");

    // /metrics has each task's activations, failures, duration and last success.
    let text = metrics(&t).await;
    for name in TASKS {
        let activations = sample(&text, "gsaas_background_task_activations_total", name);
        assert!(activations.unwrap_or(0.0) >= 1.0, "{name}: {activations:?}");
        assert_eq!(sample(&text, "gsaas_background_task_failures_total", name), Some(0.0));
        assert!(sample(&text, "gsaas_background_task_last_duration_seconds", name).is_some());
        let success = sample(&text, "gsaas_background_task_last_success_timestamp_seconds", name);
        assert!(success.unwrap() > 1.7e9, "{name}: {success:?}");
    }
    // The reconciler's sum: at least the first pass.
    let passes = text.lines().find_map(|l| l.strip_prefix("gsaas_reconciler_runs_total "));
    assert!(passes.unwrap().parse::<u64>().unwrap() >= 1, "{passes:?}");
    let (status, ready) = t.get("", "/readyz").await;
    assert_eq!(status, 200, "{ready}");
    assert!(ready["reconciler"]["passes"].as_u64().unwrap() >= 1, "{ready}");
}

async fn a_failing_task_says_so_and_recovers(store: Store) {
    let t = TestService::start(store).await;
    let sim = t.service().sim.clone().expect("the simulated cloud");
    let admin = t.admin();
    // After the first pass (which would take the fault), and before the next (an hour away).
    all_ran(&t).await;
    sim.inject(SimFault::ListingUnavailable);
    let (status, failed) =
        t.post(&admin, "/v1/background-tasks/cloud_drift/activate", &json!({})).await;
    assert_eq!(status, 200, "{failed}");
    assert_eq!(failed["last_outcome"], "error", "{failed}");
    assert_eq!(failed["failures"], 1, "{failed}");
    let error = failed["last_error"].as_str().unwrap();
    assert!(error.contains("cloud"), "{error}");
    let text = metrics(&t).await;
    assert_eq!(sample(&text, "gsaas_background_task_failures_total", "cloud_drift"), Some(1.0));
    // The reconciler's sum carries it too, unnamed for anyone without a token.
    let (_, ready) = t.get("", "/readyz").await;
    assert!(ready["reconciler"]["last_error"].is_string(), "{ready}");

    // The fault fired once: the next activation is clean, and so is the sum.
    let (status, ok) =
        t.post(&admin, "/v1/background-tasks/cloud_drift/activate", &json!({})).await;
    assert_eq!(status, 200, "{ok}");
    assert_eq!(ok["last_outcome"], "ok", "{ok}");
    assert!(ok["last_error"].is_null(), "{ok}");
    assert_eq!(ok["failures"], 1, "failures are counted, not forgotten: {ok}");
    let status = t.service().app.reconcile_once().await;
    assert!(status.last_error.is_none(), "{status:?}");
}

async fn tenants_cannot_see_or_run_tasks(store: Store) {
    let t = TestService::start(store).await;
    let member = t.member();
    // A tenant, a host's agent and a metrics scraper alike.
    let agent = t.agent_token("gpu-host-1");
    let scraper = t.token("metrics", gsaasd::auth::Role::Metrics);
    for token in [&member, &agent, &scraper] {
        let (status, body) = t.get(token, "/v1/background-tasks").await;
        assert_eq!(status, 404, "{body}");
        let (status, body) =
            t.post(token, "/v1/background-tasks/route_tables/activate", &json!({})).await;
        assert_eq!(status, 404, "{body}");
    }
    let (status, _) = t.get("", "/v1/background-tasks").await;
    assert_eq!(status, 401);
    // Admins: a task no replica runs, and hostile names, are not found; nothing ran.
    let admin = t.admin();
    let before: u64 =
        tasks(&t).await.iter().map(|t| t["activations"].as_u64().unwrap()).sum::<u64>();
    let long = "a".repeat(10_000);
    for name in ["notifications", "nothing", "ROUTE_TABLES", "route_tables%00", long.as_str()] {
        let (status, body) =
            t.post(&admin, &format!("/v1/background-tasks/{name}/activate"), &json!({})).await;
        assert!(status == 404 || status == 414, "{name}: {status} {body}");
    }
    let after: u64 = tasks(&t).await.iter().map(|t| t["activations"].as_u64().unwrap()).sum();
    // Timers may have run meanwhile, but none of the refused names ran a task named so.
    assert!(after >= before);
    assert!(tasks(&t).await.iter().all(|t| t["name"] != "nothing"));
}
