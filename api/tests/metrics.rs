//! `/metrics` parses as the Prometheus text format and carries what the dashboards chart: pool use
//! per GPU and host, VMs by state, launches by outcome, the Equation 5.1 stage histograms and policy
//! decision times.

mod support;

use support::{shared_launch, Store, TestService};

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

    let text = t.http.get(t.url("/metrics")).send().await.unwrap().text().await.unwrap();
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
    for stage in gsaasd::metrics::STAGES {
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
    let agent_text = rodvr_agent::metrics::AgentMetrics::default().render(0, None);
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
}
