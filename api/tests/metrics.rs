//! `/metrics` parses as the Prometheus text format, passes `promtool check metrics`, and carries
//! what the dashboards chart: pool use per GPU and host, VMs by state, launches by outcome, the
//! Equation 5.1 stage histograms and policy decision times.

use crate::support;

use support::{shared_launch, shared_launch_with, Store, TestService};

fn scrape(text: &str) -> prometheus_parse::Scrape {
    prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_owned())))
        .expect("valid Prometheus text")
}

fn value(scrape: &prometheus_parse::Scrape, name: &str, label: Option<(&str, &str)>) -> f64 {
    let sample = scrape
        .samples
        .iter()
        .find(|s| s.metric == name && label.is_none_or(|(k, v)| s.labels.get(k) == Some(v)))
        .unwrap_or_else(|| panic!("no sample {name} {label:?}"));
    match sample.value {
        prometheus_parse::Value::Counter(v)
        | prometheus_parse::Value::Gauge(v)
        | prometheus_parse::Value::Untyped(v) => v,
        prometheus_parse::Value::Histogram(ref buckets) => buckets.last().map_or(0.0, |b| b.count),
        ref other => panic!("{name}: unexpected {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_parse_and_follow_what_happens() {
    let t = TestService::start(Store::Sqlite).await;
    let token = t.member();
    let id = t.launch(&token, &shared_launch(2, 2048)).await;
    t.wait_state(&token, &id, "ready").await;
    let refused = t.post(&token, "/v1/vms", &shared_launch(99, 2048)).await.0;
    assert_eq!(refused, 507);

    let text = t.http.get(t.url("/metrics")).bearer_auth(t.admin()).send().await;
    let text = text.unwrap().text().await.unwrap();
    let scrape = scrape(&text);
    assert_eq!(value(&scrape, "gsaas_launches_total", Some(("outcome", "accepted"))), 1.0);
    assert_eq!(value(&scrape, "gsaas_launches_total", Some(("outcome", "ready"))), 1.0);
    assert_eq!(value(&scrape, "gsaas_launches_total", Some(("outcome", "refused"))), 1.0);
    assert_eq!(value(&scrape, "gsaas_vms", Some(("state", "ready"))), 1.0);
    assert_eq!(
        value(&scrape, "gsaas_gpu_allocated_mib", Some(("gpu", "compute-gpu:gpu0"))),
        4096.0
    );
    assert_eq!(value(&scrape, "gsaas_host_vms", Some(("host", "compute-gpu"))), 1.0);
    assert_eq!(value(&scrape, "gsaas_host_cgpus", Some(("host", "compute-gpu"))), 2.0);
    assert_eq!(value(&scrape, "gsaas_terminations_total", Some(("outcome", "accepted"))), 0.0);
    assert_eq!(value(&scrape, "gsaas_host_schedulable", Some(("host", "compute0-rgpu"))), 1.0);
    // Two quarter-ish cGPUs on one GPU leave it room for two more: nothing is a fragment, and
    // the free capacity is every GPU's free share.
    let free: f64 = scrape
        .samples
        .iter()
        .filter(|s| s.metric == "gsaas_gpu_memory_mib")
        .map(|s| {
            let gpu = s.labels.get("gpu").unwrap();
            let total = value(&scrape, "gsaas_gpu_memory_mib", Some(("gpu", gpu)));
            (total - value(&scrape, "gsaas_gpu_allocated_mib", Some(("gpu", gpu)))) / total
        })
        .sum();
    assert!((value(&scrape, "gsaas_gpu_free_gpus", None) - free).abs() < 1e-3, "{text}");
    assert_eq!(value(&scrape, "gsaas_gpu_fragmented_gpus", None), 0.0, "{text}");
    for stage in gsaasd::model::Timings::names() {
        let count = scrape
            .samples
            .iter()
            .filter(|s| {
                s.metric == "gsaas_launch_stage_seconds_count"
                    && s.labels.get("stage") == Some(stage)
            })
            .count();
        assert_eq!(count, 1, "stage {stage}: {text}");
    }
    assert!(text.contains("gsaas_policy_decision_seconds_count 1\n"), "{text}");
    assert!(text.contains("gsaas_route_pushes_total 1\n"), "{text}");

    // Every metric the Grafana dashboard charts is exported, by gsaasd or by the agents.
    let agent_text = rodvr_core::metrics::AgentMetrics::default().render(0, None);
    let dashboard = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../deploy/grafana/gsaas.json"
    ))
    .unwrap();
    let dashboard: serde_json::Value = serde_json::from_str(&dashboard).unwrap();
    let mut charted = 0;
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"].as_str().unwrap();
            let names: Vec<&str> = expr
                .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .filter(|w| w.starts_with("gsaas_") || w.starts_with("rodvr_"))
                .collect();
            for name in names {
                let base = name
                    .trim_end_matches("_bucket")
                    .trim_end_matches("_sum")
                    .trim_end_matches("_count");
                let exported = if name.starts_with("rodvr_") { &agent_text } else { &text };
                assert!(
                    exported.contains(&format!("# TYPE {base} ")),
                    "dashboard charts {name}, which is not exported"
                );
                charted += 1;
            }
        }
    }
    assert!(charted >= 8, "the dashboard charts too little: {charted}");

    // Prometheus's own checker and linter accept both expositions, and would say if not.
    promtool_accepts(&text).unwrap();
    promtool_accepts(&agent_text).unwrap();
    let unlinted = "# HELP gsaas_bad Bad.\n# TYPE gsaas_bad counter\ngsaas_bad 1\n";
    let complaint = promtool_accepts(unlinted).unwrap_err();
    assert!(complaint.contains("_total"), "{complaint}");
}

/// `promtool check metrics` (Debian's prometheus package) on `text`: `Err` with what it says when
/// it finds a problem, format or lint.
fn promtool_accepts(text: &str) -> Result<(), String> {
    use std::io::Write;
    let mut child = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("promtool runs (scripts/test.sh installs Debian's prometheus package)");
    child.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    let said =
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    if out.status.success() && said.trim().is_empty() {
        Ok(())
    } else {
        Err(said)
    }
}

/// What a tenant would learn from `/metrics` before and after its launch: which GPU and host its
/// VM got. So only admins and metrics tokens read it on the API's address; `metrics.listen`
/// serves it, without a token, on an address of its own and nothing else there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_are_not_for_tenants() {
    let t = TestService::start_with(Store::Sqlite, |c| {
        c.metrics.listen = Some("127.0.0.1:0".parse().unwrap());
    })
    .await;
    let get = |path: &str, token: Option<String>| {
        let mut request = t.http.get(t.url(path));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        async move { request.send().await.unwrap().status().as_u16() }
    };
    let metrics_token = t.service().app.keys.issue(
        "prometheus",
        None,
        gsaasd::auth::Role::Metrics,
        std::time::Duration::from_secs(600),
    );
    assert_eq!(get("/metrics", None).await, 401);
    assert_eq!(get("/metrics", Some(t.member())).await, 404);
    assert_eq!(get("/metrics", Some(t.admin())).await, 200);
    assert_eq!(get("/metrics", Some(metrics_token.clone())).await, 200);
    // A metrics token reads nothing else.
    for path in ["/v1/vms", "/v1/pool", "/v1/hosts"] {
        assert_eq!(get(path, Some(metrics_token.clone())).await, 404, "{path}");
    }
    let own = t.service().metrics_addr.expect("the metrics listener");
    let response = t.http.get(format!("http://{own}/metrics")).send().await.unwrap();
    assert_eq!(response.status(), 200);
    scrape(&response.text().await.unwrap());
    let other = t.http.get(format!("http://{own}/v1/pool")).send().await.unwrap();
    assert_eq!(other.status(), 404, "the metrics listener serves /metrics alone");
}

/// `frag-gradient` is a policy of the service like any other, and the admins' pool view counts
/// the free memory no cGPU of the pool's mix fits in; a tenant sees totals only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frag_gradient_places_and_the_pool_view_counts_the_fragments_for_admins_only() {
    let t = TestService::start(Store::Sqlite).await;
    let (member, admin) = (t.member(), t.admin());
    let (_, pool) = t.get(&admin, "/v1/pool").await;
    assert_eq!(pool["fragmentation"]["fragmented_gpus"], 0.0, "{pool}");
    assert_eq!(pool["fragmentation"]["mix_cgpus"], 0, "{pool}");
    let gpu_mib = pool["hosts"][0]["gpus"][0]["memory_mib"].as_u64().unwrap();
    // Two cGPUs of 60% of a GPU: the first by best fit, the second by frag-gradient, which
    // cannot go beside it and takes an idle GPU. Each GPU keeps 40%, which fits neither.
    let big = gpu_mib * 6 / 10;
    let mut gpus = Vec::new();
    for policy in ["best-fit", "frag-gradient"] {
        let body = shared_launch_with(1, big, serde_json::json!({"policy": policy}));
        let id = t.launch(&member, &body).await;
        let vm = t.wait_state(&member, &id, "ready").await;
        assert_eq!(vm["gpus"]["policy"], policy, "{vm}");
        let (_, vm) = t.get(&admin, &format!("/v1/vms/{id}")).await;
        gpus.push(vm["cgpus"][0]["gpu"].clone());
    }
    assert_ne!(gpus[0], gpus[1], "{gpus:?}");
    let (_, pool) = t.get(&admin, "/v1/pool").await;
    let fragmented = pool["fragmentation"]["fragmented_gpus"].as_f64().unwrap();
    let left = (gpu_mib - big) as f64 / gpu_mib as f64;
    assert!((fragmented - 2.0 * left).abs() < 1e-9, "{fragmented} {pool}");
    assert_eq!(pool["fragmentation"]["mix_cgpus"], 2);
    let (status, seen) = t.get(&member, "/v1/pool").await;
    assert_eq!(status, 200);
    assert!(seen.get("fragmentation").is_none(), "a tenant sees totals only: {seen}");
}

/// Scrapers share one computation of the gauges per refresh period: a launch between two scrapes
/// within it shows in the counters at once, in the gauges only after the period.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gauges_are_computed_once_per_refresh_period() {
    let t =
        TestService::start_with(Store::Sqlite, |c| c.metrics.gauge_refresh_ms = 3_600_000).await;
    let token = t.member();
    let app = &t.service().app;
    let before = scrape(&app.render_metrics().await.unwrap());
    let id = t.launch(&token, &shared_launch(1, 1024)).await;
    t.wait_state(&token, &id, "ready").await;
    let scrapes = support::join_all((0..16).map(|_| app.render_metrics())).await;
    for text in scrapes {
        let after = scrape(&text.unwrap());
        assert_eq!(value(&after, "gsaas_launches_total", Some(("outcome", "ready"))), 1.0);
        assert_eq!(value(&after, "gsaas_vms", Some(("state", "ready"))), 0.0, "cached");
        let gpu = Some(("gpu", "compute-gpu:gpu0"));
        assert_eq!(
            value(&after, "gsaas_gpu_allocated_mib", gpu),
            value(&before, "gsaas_gpu_allocated_mib", gpu)
        );
    }
}
