//! Usage metering: every life of a VM and its cGPUs (launch, attach, detach, re-home,
//! termination) leaves spans the reports add up exactly at the period's edges; tenants see only
//! their own project's; the CSV is safe to open; purges and restarts keep it; `/metrics` counts
//! each second once, also with two replicas on one database; a cGPU's time counts as borrowed
//! while its loan mark is set, each second once. On both stores.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::{on_both_stores, support};

use gsaasd::auth::Role;
use gsaasd::db::now_ms;
use serde_json::{json, Value};
use sqlx::Row;
use support::{fields_at_fault, rfc3339, shared_launch, shared_launch_with, Store, TestService};

on_both_stores!(usage_follows_every_life_of_a_vm_and_adds_up_exactly_at_the_edges);

/// A span as stored: (vm, idx, gpu, model, mode, memory, start, end).
type Span = (String, i64, String, String, String, i64, i64, Option<i64>);

async fn cgpu_spans(t: &TestService, project: &str) -> Vec<Span> {
    t.service().app.fold_usage().await.unwrap();
    let mut conn = t.service().app.db.conn().await.unwrap();
    let rows = sqlx::query(
        "SELECT vm, idx, gpu, model, mode, memory_mib, start_ms, end_ms FROM cgpu_usage \
         WHERE project = $1 ORDER BY start_ms, idx",
    )
    .bind(project)
    .fetch_all(&mut *conn)
    .await
    .unwrap();
    rows.iter()
        .map(|r| {
            (
                r.get(0),
                r.get(1),
                r.get(2),
                r.get(3),
                r.get(4),
                r.get(5),
                r.get(6),
                r.get::<Option<i64>, _>(7),
            )
        })
        .collect()
}

async fn vm_spans(t: &TestService, project: &str) -> Vec<(String, i64, Option<i64>)> {
    t.service().app.fold_usage().await.unwrap();
    let mut conn = t.service().app.db.conn().await.unwrap();
    let rows = sqlx::query(
        "SELECT vm, start_ms, end_ms FROM vm_usage WHERE project = $1 ORDER BY start_ms",
    )
    .bind(project)
    .fetch_all(&mut *conn)
    .await
    .unwrap();
    rows.iter().map(|r| (r.get(0), r.get(1), r.get(2))).collect()
}

/// A span's milliseconds inside `[start, end)`, a span still counting ending at `now`.
fn clipped(span_start: i64, span_end: Option<i64>, start: i64, end: i64, now: i64) -> i64 {
    (span_end.unwrap_or(now).min(end) - span_start.max(start)).max(0)
}

fn ms(seconds: &Value) -> i64 {
    (seconds.as_f64().unwrap() * 1000.0).round() as i64
}

/// The GPUs of the VM's cGPUs, as an admin sees them.
async fn gpus_of(t: &TestService, id: &str) -> Vec<String> {
    t.admin_cgpus(id).await.iter().map(|c| c["gpu"].as_str().unwrap().to_owned()).collect()
}

async fn settled(t: &TestService, id: &str, n: usize) {
    let member = t.member();
    t.wait_vm(&member, id, |vm| {
        let cgpus = vm["cgpus"].as_array().unwrap();
        cgpus.len() == n && cgpus.iter().all(|c| c["state"] == "live")
    })
    .await;
}

async fn text(t: &TestService, token: &str, path: &str, accept: &str) -> (u16, String, String) {
    let r = reqwest::Client::new()
        .get(t.url(path))
        .bearer_auth(token)
        .header("accept", accept)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let kind = r.headers().get("content-type").map(|v| v.to_str().unwrap().to_owned());
    (status, kind.unwrap_or_default(), r.text().await.unwrap())
}

/// `gsaas_cgpu_seconds_total` by (project, model, mode), from `/metrics`.
async fn counters(t: &TestService) -> BTreeMap<(String, String, String), f64> {
    let (status, _, text) = text(t, &t.admin(), "/metrics", "text/plain").await;
    assert_eq!(status, 200);
    let mut counters = BTreeMap::new();
    for line in text.lines().filter(|l| l.starts_with("gsaas_cgpu_seconds_total{")) {
        let (labels, value) = line.rsplit_once(' ').unwrap();
        let label = |name: &str| {
            let from = labels.find(&format!("{name}=\"")).unwrap() + name.len() + 2;
            labels[from..].split('"').next().unwrap().to_owned()
        };
        counters.insert((label("project"), label("model"), label("mode")), value.parse().unwrap());
    }
    counters
}

async fn usage_follows_every_life_of_a_vm_and_adds_up_exactly_at_the_edges(store: Store) {
    let mut t = TestService::start(store).await;
    let (member, admin) = (t.member(), t.admin());
    let beta = t.token("beta", Role::Member);
    let before = now_ms();

    // A VM of two cGPUs on two GPUs (named as a spreadsheet formula), grown by one, shrunk by its first,
    // its second re-homed to another GPU, then terminated; and beta's VM beside it.
    let name = "=HYPERLINK(\"http://evil\")";
    let a = t
        .launch(
            &member,
            &shared_launch_with(2, 1024, json!({"name": name, "policy": "least-load-fit"})),
        )
        .await;
    t.wait_state(&member, &a, "ready").await;
    let attach = json!({"ncgpus": 1, "gpu_memory_mib": 2048, "mode": "shared"});
    let (status, vm) = t.post(&member, &format!("/v1/vms/{a}/cgpus"), &attach).await;
    assert_eq!(status, 202, "{vm}");
    settled(&t, &a, 3).await;
    let (status, vm) = t.delete(&member, &format!("/v1/vms/{a}/cgpus/0")).await;
    assert_eq!(status, 202, "{vm}");
    settled(&t, &a, 2).await;
    let leaving = gpus_of(&t, &a).await[0].clone();
    let (status, done) = t.post(&admin, &format!("/v1/gpus/{leaving}/evacuate"), &json!({})).await;
    assert_eq!((status, &done["moved"]), (200, &json!(1)), "{done}");
    assert_ne!(gpus_of(&t, &a).await[0], leaving);
    let b = t.launch(&beta, &shared_launch(1, 1024)).await;
    t.wait_state(&beta, &b, "ready").await;
    let (status, _) = t.delete(&member, &format!("/v1/vms/{a}")).await;
    assert_eq!(status, 202);
    t.wait_state(&member, &a, "deleted").await;
    let after = now_ms();

    // The spans: index 0 until its detach, index 1 on two GPUs (the re-home ends one span and
    // starts the next at once), index 2 from its attach; all ended with the VM, within the test.
    let spans = cgpu_spans(&t, "alpha").await;
    let lives: Vec<(i64, &str, i64)> =
        spans.iter().map(|s| (s.1, s.2.as_str(), s.5)).collect::<Vec<_>>();
    assert_eq!(spans.len(), 4, "{spans:?}");
    assert!(spans.iter().all(|s| s.0 == a && s.4 == "shared"), "{spans:?}");
    assert!(spans.iter().all(|s| s.6 >= before && s.7.is_some_and(|e| e <= after && e >= s.6)));
    let by_index = |i: i64| spans.iter().filter(|s| s.1 == i).collect::<Vec<_>>();
    assert_eq!(by_index(0).len(), 1, "{lives:?}");
    assert_eq!(by_index(2).len(), 1, "{lives:?}");
    assert_eq!(by_index(2)[0].5, 2048, "the attach's memory");
    let moves = by_index(1);
    assert_eq!(moves.len(), 2, "{lives:?}");
    assert_eq!(moves[0].2, leaving);
    assert_ne!(moves[1].2, leaving);
    assert_eq!(Some(moves[1].6), moves[0].7, "no gap at the re-home: {moves:?}");
    assert!(by_index(0)[0].7 < by_index(2)[0].7, "the detach ended first");
    let vms = vm_spans(&t, "alpha").await;
    assert_eq!(vms.len(), 1, "{vms:?}");
    // No cGPU counts before its VM (PostgreSQL logs a launch's cGPUs ahead of its VM).
    assert!(spans.iter().all(|s| s.6 >= vms[0].1), "{spans:?} {vms:?}");

    // A period that cuts spans: from the middle of index 1's first span to the middle of index
    // 2's, exact to the millisecond.
    let start = (moves[0].6 + moves[0].7.unwrap()) / 2;
    let end = (by_index(2)[0].6 + by_index(2)[0].7.unwrap()) / 2;
    assert!(start < end, "{start} {end}");
    let expected: i64 = spans.iter().map(|s| clipped(s.6, s.7, start, end, now_ms())).sum();
    let expected_memory: i64 =
        spans.iter().map(|s| clipped(s.6, s.7, start, end, now_ms()) * s.5).sum();
    let expected_vm: i64 = vms.iter().map(|v| clipped(v.1, v.2, start, end, now_ms())).sum();
    let query = format!("start={}&end={}", rfc3339(start), rfc3339(end));
    let (status, report) = t.get(&member, &format!("/v1/usage/alpha?{query}")).await;
    assert_eq!(status, 200, "{report}");
    assert_eq!((report["start_ms"].as_i64(), report["end_ms"].as_i64()), (Some(start), Some(end)));
    let alpha = &report["projects"][0];
    assert_eq!(alpha["project"], "alpha");
    assert_eq!(ms(&alpha["cgpu_seconds"]), expected, "{report}");
    assert_eq!(ms(&alpha["vm_seconds"]), expected_vm, "{report}");
    let memory = alpha["gpu_memory_mib_seconds"].as_f64().unwrap();
    assert!((memory - expected_memory as f64 / 1000.0).abs() <= 1.0, "{memory} {expected_memory}");
    assert_eq!(alpha["exclusive_gpu_seconds"], 0.0);
    let lines = alpha["vms"].as_array().unwrap();
    assert_eq!(lines.len(), 1, "{report}");
    assert_eq!(
        (lines[0]["id"].as_str(), lines[0]["name"].as_str()),
        (Some(a.as_str()), Some(name))
    );
    assert_eq!(ms(&lines[0]["cgpu_seconds"]), expected);
    let models: i64 =
        alpha["by_model"].as_array().unwrap().iter().map(|m| ms(&m["cgpu_seconds"])).sum();
    assert_eq!(models, expected, "the models add up");

    // Tenants see their own project only; admins every project's.
    let whole = format!("start={}&end={}", rfc3339(before - 1000), rfc3339(after));
    let (status, _) = t.get(&beta, &format!("/v1/usage/alpha?{whole}")).await;
    assert_eq!(status, 404, "beta read alpha's usage");
    let projects = |report: &Value| -> Vec<String> {
        let list = report["projects"].as_array().unwrap();
        list.iter().map(|p| p["project"].as_str().unwrap().to_owned()).collect()
    };
    let (_, own) = t.get(&beta, &format!("/v1/usage?{whole}")).await;
    assert_eq!(projects(&own), ["beta"], "{own}");
    let (_, own) = t.get(&member, &format!("/v1/usage?{whole}")).await;
    assert_eq!(projects(&own), ["alpha"], "{own}");
    let (status, all) = t.get(&admin, &format!("/v1/usage?{whole}&step=60")).await;
    assert_eq!(status, 200, "{all}");
    assert_eq!(projects(&all), ["alpha", "beta"], "{all}");
    assert!(all["projects"][0].get("vms").is_none(), "VM lines only per project");
    let series = &all["series"];
    assert_eq!(
        (series["by"].as_str(), series["step_seconds"].as_u64()),
        (Some("project"), Some(60))
    );
    let plotted: i64 = series["lines"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|l| l["label"] == "alpha")
        .flat_map(|l| l["cgpu_seconds"].as_array().unwrap().iter().map(ms).collect::<Vec<_>>())
        .sum();
    assert!((plotted - ms(&all["projects"][0]["cgpu_seconds"])).abs() <= 2, "{all}");

    // CSV, by Accept or format: a row per quantity; the VM's name cannot run as a formula.
    for (path, accept) in [
        (format!("/v1/usage/alpha?{query}"), "text/csv"),
        (format!("/v1/usage/alpha?{query}&format=csv"), "*/*"),
    ] {
        let (status, kind, csv) = text(&t, &member, &path, accept).await;
        assert_eq!((status, kind.as_str()), (200, "text/csv; charset=utf-8"), "{csv}");
        let mut rows = csv.lines();
        assert_eq!(
            rows.next(),
            Some("period_start,period_end,project,vm,vm_name,resource,model,mode,quantity,unit")
        );
        let cgpu: Vec<&str> = rows.filter(|r| r.contains(",cgpu,")).collect();
        assert!(!cgpu.is_empty(), "{csv}");
        assert!(
            cgpu[0].contains(&format!(",alpha,{a},\"'=HYPERLINK(\"\"http://evil\"\")\",cgpu,")),
            "{csv}"
        );
    }

    // Bad periods name their field and are refused.
    for (bad, field) in [
        ("start=yesterday", "start"),
        ("start=2026-11-02&end=2026-11-01", "start"),
        ("end=2026-13-01", "end"),
        ("step=1", "step"),
        ("start=2000-01-01&step=60", "step"),
        ("format=xml", "query"),
        ("project=beta", "query"),
    ] {
        let (status, problem) = t.get(&member, &format!("/v1/usage/alpha?{bad}")).await;
        assert_eq!(status, 422, "{bad}: {problem}");
        assert_eq!(fields_at_fault(&problem), [field], "{bad}: {problem}");
    }

    // `/metrics` counts every cGPU-second of alpha's (all ended), to the millisecond.
    let total: BTreeMap<String, i64> = spans.iter().fold(BTreeMap::new(), |mut m, s| {
        *m.entry(s.3.clone()).or_default() += s.7.unwrap() - s.6;
        m
    });
    let shown = counters(&t).await;
    for (model, ms) in &total {
        let key = ("alpha".to_owned(), model.clone(), "shared".to_owned());
        assert_eq!(shown.get(&key).map(|s| (s * 1000.0).round() as i64), Some(*ms), "{shown:?}");
    }
    assert!(shown.keys().any(|k| k.0 == "beta"), "beta's running cGPU counts: {shown:?}");

    // A purge forgets the VM, not its usage; nor does a restart.
    let (ok, out, err) = t.gsaasd(&["db", "purge", "--older-than", "0s"]);
    assert!(ok, "{out} {err}");
    let (status, _) = t.get(&member, &format!("/v1/vms/{a}")).await;
    assert_eq!(status, 404, "purged");
    let (_, again) = t.get(&member, &format!("/v1/usage/alpha?{query}")).await;
    assert_eq!(again, report, "the purge changed the report");
    t.restart().await;
    let (_, again) = t.get(&member, &format!("/v1/usage/alpha?{query}")).await;
    assert_eq!(again, report, "the restart changed the report");
    let shown_again = counters(&t).await;
    for (key, value) in shown.iter().filter(|(k, _)| k.0 == "alpha") {
        assert_eq!(shown_again.get(key), Some(value), "alpha's ended usage is as it was");
    }
}

/// Two replicas on one PostgreSQL: a VM launched on one and terminated through the other leaves
/// one span per cGPU, both folding the usage log at once fold each event once, and both rolling
/// usage up at once add each span to the totals once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_never_count_a_second_twice() {
    let (a, b) = TestService::two_replicas().await;
    let member = a.member();
    let mut vms = Vec::new();
    for _ in 0..3 {
        let id = a.launch(&member, &shared_launch(2, 512)).await;
        a.wait_state(&member, &id, "ready").await;
        vms.push(id);
    }
    for id in &vms {
        let (status, _) = b.delete(&member, &format!("/v1/vms/{id}")).await;
        assert_eq!(status, 202);
    }
    for id in &vms {
        b.wait_state(&member, id, "deleted").await;
    }
    // Both fold the log at once (each also folds every second): each event is folded once.
    for _ in 0..5 {
        let (x, y) = tokio::join!(a.service().app.fold_usage(), b.service().app.fold_usage());
        x.unwrap();
        y.unwrap();
    }
    let spans = cgpu_spans(&a, "alpha").await;
    assert_eq!(spans.len(), 6, "{spans:?}");
    let (da, db) = (&a.service().app.db, &b.service().app.db);
    for _ in 0..5 {
        let (x, y) = tokio::join!(da.roll_up_usage(), db.roll_up_usage());
        x.unwrap();
        y.unwrap();
    }
    let used: i64 = spans.iter().map(|s| s.7.unwrap() - s.6).sum();
    let mut conn = da.conn().await.unwrap();
    let totals: i64 = sqlx::query("SELECT CAST(SUM(cgpu_ms) AS BIGINT) FROM usage_totals")
        .fetch_one(&mut *conn)
        .await
        .unwrap()
        .get(0);
    assert_eq!(totals, used, "each ended span added once");
    drop(conn);
    assert_eq!(counters(&a).await, counters(&b).await, "both replicas show the cloud's totals");
}

on_both_stores!(the_fold_does_what_its_specification_says_on_random_batches);

/// The fold's reads and writes against its plan (`plan_fold`): rounds of random batches (any
/// order of starts and ends, on a few VMs and cGPUs, times that sometimes go back) are written to
/// the log by hand, folded, and the stored spans compared with the plan's, and the totals with
/// the spans.
async fn the_fold_does_what_its_specification_says_on_random_batches(store: Store) {
    use gsaasd::db::{plan_fold, CgpuSpanStart, EventKind, UsageEvent};
    let db = support::FreshDb::open(store).await;
    // Spans as stored: cGPUs (vm, idx, gpu, start, end, borrowed), VMs (vm, name, start, end).
    type CgpuRow = (String, i64, String, i64, Option<i64>, i64);
    type VmRow = (String, String, i64, Option<i64>);
    let (mut cgpus, mut vms): (Vec<CgpuRow>, Vec<VmRow>) = (Vec::new(), Vec::new());
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = |n: u64| {
        seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        (seed >> 33) % n
    };
    let mut clock = 1_000_i64;
    for round in 0..40 {
        let size = next(40);
        let mut events = Vec::new();
        for seq in 0..size as i64 {
            clock += next(5) as i64 - 1; // now and then back by a millisecond
            let vm = format!("vm{}", next(3));
            let what = match next(4) {
                0 => EventKind::CgpuEnded { idx: next(3) as i64 },
                1 => EventKind::CgpuStarted(CgpuSpanStart {
                    idx: next(3) as i64,
                    project: "p".into(),
                    gpu: format!("gpu{}", next(4)),
                    model: "A100".into(),
                    mode: "shared".into(),
                    memory_mib: 512,
                    borrowed: next(3) == 0,
                }),
                2 => EventKind::VmEnded,
                _ => EventKind::VmStarted { project: "p".into(), name: format!("r{round}") },
            };
            events.push(UsageEvent { seq, at_ms: clock, vm, what });
        }
        let mut conn = db.conn().await.unwrap();
        for e in &events {
            let (op, idx, name, start) = match &e.what {
                EventKind::CgpuEnded { idx } => (1, Some(*idx), None, None),
                EventKind::CgpuStarted(start) => (2, Some(start.idx), None, Some(start)),
                EventKind::VmEnded => (3, None, None, None),
                EventKind::VmStarted { name, .. } => (4, None, Some(name.clone()), None),
            };
            sqlx::query(
                "INSERT INTO usage_events (op, at_ms, vm, idx, project, name, gpu, model, mode, \
                 memory_mib, borrowed) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
            )
            .bind(op)
            .bind(e.at_ms)
            .bind(&e.vm)
            .bind(idx)
            .bind(if op == 2 || op == 4 { Some("p") } else { None })
            .bind(name)
            .bind(start.map(|s| s.gpu.clone()))
            .bind(start.map(|s| s.model.clone()))
            .bind(start.map(|s| s.mode.clone()))
            .bind(start.map(|s| s.memory_mib))
            .bind(start.map(|s| i64::from(s.borrowed)))
            .execute(&mut *conn)
            .await
            .unwrap();
        }
        drop(conn);

        // What the specification says: written spans end first (cGPUs', then VMs'), then the
        // batch's spans are added.
        let plan = plan_fold(&events);
        for (vm, idx, at) in &plan.cgpu_ends {
            for span in cgpus.iter_mut().filter(|s| &s.0 == vm && s.1 == *idx && s.4.is_none()) {
                span.4 = Some((*at).max(span.3));
            }
        }
        for (vm, at) in &plan.vm_ends {
            for span in cgpus.iter_mut().filter(|s| &s.0 == vm && s.4.is_none()) {
                span.4 = Some((*at).max(span.3));
            }
            for span in vms.iter_mut().filter(|s| &s.0 == vm && s.3.is_none()) {
                span.3 = Some((*at).max(span.2));
            }
        }
        cgpus.extend(plan.cgpu_spans.iter().map(|s| {
            let borrowed = i64::from(s.of.borrowed);
            (s.vm.clone(), s.of.idx, s.of.gpu.clone(), s.start_ms, s.end_ms, borrowed)
        }));
        vms.extend(
            plan.vm_spans.iter().map(|s| (s.vm.clone(), s.of.1.clone(), s.start_ms, s.end_ms)),
        );

        assert_eq!(db.fold_usage().await.unwrap(), size, "round {round}: every event, once");
        let mut conn = db.conn().await.unwrap();
        let rows = sqlx::query("SELECT vm, idx, gpu, start_ms, end_ms, borrowed FROM cgpu_usage")
            .fetch_all(&mut *conn)
            .await
            .unwrap();
        let mut stored: Vec<CgpuRow> = rows
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4), r.get(5)))
            .collect();
        let rows = sqlx::query("SELECT vm, name, start_ms, end_ms FROM vm_usage")
            .fetch_all(&mut *conn)
            .await
            .unwrap();
        let mut stored_vms: Vec<VmRow> =
            rows.iter().map(|r| (r.get(0), r.get(1), r.get(2), r.get(3))).collect();
        let (mut want, mut want_vms) = (cgpus.clone(), vms.clone());
        for list in [&mut stored, &mut want] {
            list.sort();
        }
        for list in [&mut stored_vms, &mut want_vms] {
            list.sort();
        }
        assert_eq!(stored, want, "round {round}: cGPU spans, after {events:?}");
        assert_eq!(stored_vms, want_vms, "round {round}: VM spans, after {events:?}");

        // Every ended span is in the totals once: those ended within a fold by the fold, the
        // others by a roll-up (every third round here) or, until then, as not yet rolled up.
        drop(conn);
        if round % 3 == 2 {
            db.roll_up_usage().await.unwrap();
        }
        let mut conn = db.conn().await.unwrap();
        let ended: i64 = want.iter().filter_map(|s| s.4.map(|end| end - s.3)).sum();
        let totals: i64 = sqlx::query(
            "SELECT CAST(COALESCE((SELECT SUM(cgpu_ms) FROM usage_totals), 0) + COALESCE((SELECT \
             SUM(end_ms - start_ms) FROM cgpu_usage WHERE rolled = 0 AND end_ms IS NOT NULL), 0) \
             AS BIGINT)",
        )
        .fetch_one(&mut *conn)
        .await
        .unwrap()
        .get(0);
        assert_eq!(totals, ended, "round {round}: the totals count each ended span once");
    }
}

on_both_stores!(reports_in_a_flood_during_launches_bill_each_life_once);

/// A tenant asking for its usage report in a flood (each report folds the usage log) while
/// another launches and terminates VMs: every report is answered, and each life of the other's
/// VMs is billed once, ended at its termination.
async fn reports_in_a_flood_during_launches_bill_each_life_once(store: Store) {
    let t = TestService::start(store).await;
    let (alpha, beta) = (t.member(), t.token("beta", Role::Member));
    let flood = async {
        let mut answered = BTreeMap::<u16, usize>::new();
        for _ in 0..150 {
            let (status, _) = t.get(&beta, "/v1/usage").await;
            *answered.entry(status).or_default() += 1;
        }
        answered
    };
    let lives = async {
        let mut ids = Vec::new();
        for _ in 0..6 {
            let id = t.launch(&alpha, &shared_launch(2, 256)).await;
            t.wait_state(&alpha, &id, "ready").await;
            let (status, _) = t.delete(&alpha, &format!("/v1/vms/{id}")).await;
            assert_eq!(status, 202);
            t.wait_state(&alpha, &id, "deleted").await;
            ids.push(id);
        }
        ids
    };
    let (answered, ids) = tokio::join!(flood, lives);
    assert_eq!(answered.keys().copied().collect::<Vec<_>>(), [200], "{answered:?}");

    let spans = cgpu_spans(&t, "alpha").await;
    let vms = vm_spans(&t, "alpha").await;
    for id in &ids {
        let mine: Vec<&Span> = spans.iter().filter(|s| &s.0 == id).collect();
        assert_eq!(mine.len(), 2, "one span per cGPU of {id}: {mine:?}");
        let life: Vec<_> = vms.iter().filter(|v| &v.0 == id).collect();
        assert_eq!(life.len(), 1, "one span for VM {id}: {life:?}");
        let ended = life[0].2.expect("the VM's span ended");
        for span in mine {
            let end = span.7.expect("the cGPU's span ended");
            assert!(span.6 <= end && end <= ended, "{span:?} within {life:?}");
        }
    }
    let (status, report) = t.get(&beta, "/v1/usage/beta").await;
    assert_eq!(status, 200);
    assert_eq!(report["projects"][0]["project"], "beta", "{report}");
    assert_eq!(report["projects"][0]["cgpu_seconds"], 0.0, "{report}");
}

on_both_stores!(
    borrowed_time_is_the_loans_own_and_stops_when_its_mark_is_taken_off,
    a_loan_mark_change_ends_a_span_and_starts_the_next_at_one_instant
);

/// A cGPU span with its loan mark: (vm, idx, memory, start, end, borrowed), by index and start.
type LoanSpan = (String, i64, i64, i64, Option<i64>, bool);

async fn loan_spans(t: &TestService, project: &str) -> Vec<LoanSpan> {
    t.service().app.fold_usage().await.unwrap();
    let mut conn = t.service().app.db.conn().await.unwrap();
    let rows = sqlx::query(
        "SELECT vm, idx, memory_mib, start_ms, end_ms, borrowed FROM cgpu_usage \
         WHERE project = $1 ORDER BY idx, start_ms",
    )
    .bind(project)
    .fetch_all(&mut *conn)
    .await
    .unwrap();
    rows.iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4), r.get::<i64, _>(5) == 1))
        .collect()
}

/// Which of the VM's cGPUs (by index) say `borrowed`.
fn marks(vm: &Value) -> Vec<bool> {
    let cgpus = vm["cgpus"].as_array().expect("cgpus");
    cgpus.iter().map(|c| c["borrowed"].as_bool().expect("borrowed is a bool")).collect()
}

/// `start=..&end=..` of a period (no end: to now).
fn period(start: i64, end: Option<i64>) -> String {
    match end {
        Some(end) => format!("start={}&end={}", rfc3339(start), rfc3339(end)),
        None => format!("start={}", rfc3339(start)),
    }
}

/// Alpha (quota: one whole GPU, in a cohort, borrowing by default) launches two whole GPUs, the
/// second on loan: the report's borrowed time is the loan's, to the millisecond, in the project's,
/// the VM's and the model's lines and the CSV. Its quota raised, the loan is its own and
/// `loan_marks` takes the mark off: its span ends there and the next starts at the same instant,
/// so borrowed time stops growing while cGPU time goes on, and a period across the change counts
/// each second once.
async fn borrowed_time_is_the_loans_own_and_stops_when_its_mark_is_taken_off(store: Store) {
    let t = TestService::start(store).await;
    let (admin, alpha) = (t.admin(), t.member());
    for (project, gpus) in [("alpha", 1), ("beta", 3)] {
        let limits = json!({"exclusive_gpus": gpus});
        assert_eq!(t.put(&admin, &format!("/v1/quotas/{project}"), &limits).await.0, 200);
    }
    let lab = json!({"members": {"alpha": {"borrow_by_default": true}, "beta": {}}});
    assert_eq!(t.put(&admin, "/v1/cohorts/lab", &lab).await.0, 200);
    let before = now_ms();
    let mut whole_gpus = shared_launch_with(2, 0, json!({}));
    whole_gpus["mode"] = json!("exclusive");
    whole_gpus["gpu_memory_mib"] = Value::Null;
    let vm = t.launch(&alpha, &whole_gpus).await;
    let ready = t.wait_state(&alpha, &vm, "ready").await;
    assert_eq!(marks(&ready), [false, true], "{ready}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let lent_until = now_ms();

    // One span per cGPU, the loan's marked.
    let spans = loan_spans(&t, "alpha").await;
    let shape: Vec<(i64, Option<i64>, bool)> = spans.iter().map(|s| (s.1, s.4, s.5)).collect();
    assert_eq!(shape, [(0, None, false), (1, None, true)], "{spans:?}");
    let (loan_start, memory) = (spans[1].3, spans[1].2);
    let from = spans[0].3.max(loan_start);
    assert!(from < lent_until, "{spans:?}");

    // A period while both counted: all the time of two cGPUs, borrowed the loan's only.
    let length = lent_until - from;
    let query = period(from, Some(lent_until));
    let (status, report) = t.get(&alpha, &format!("/v1/usage/alpha?{query}")).await;
    assert_eq!(status, 200, "{report}");
    let line = &report["projects"][0];
    assert_eq!(ms(&line["cgpu_seconds"]), 2 * length, "{report}");
    assert_eq!(ms(&line["borrowed_cgpu_seconds"]), length, "{report}");
    let borrowed_memory = line["borrowed_gpu_memory_mib_seconds"].as_f64().unwrap();
    let expected_memory = (length * memory) as f64 / 1000.0;
    assert!((borrowed_memory - expected_memory).abs() <= 1.0, "{borrowed_memory} {report}");
    let whole_memory = line["gpu_memory_mib_seconds"].as_f64().unwrap();
    assert!((whole_memory - 2.0 * expected_memory).abs() <= 1.0, "{whole_memory} {report}");
    let vms = line["vms"].as_array().unwrap();
    assert_eq!((vms.len(), ms(&vms[0]["borrowed_cgpu_seconds"])), (1, length), "{report}");
    let models = line["by_model"].as_array().unwrap();
    assert_eq!(models.len(), 1, "{report}");
    assert_eq!(models[0]["mode"], "exclusive");
    assert_eq!(ms(&models[0]["borrowed_cgpu_seconds"]), length, "{report}");
    let (_, all) = t.get(&admin, &format!("/v1/usage?{query}")).await;
    let listed = all["projects"].as_array().unwrap().iter().find(|p| p["project"] == "alpha");
    assert_eq!(listed.map(|p| ms(&p["borrowed_cgpu_seconds"])), Some(length), "{all}");
    let (status, _, csv) =
        text(&t, &alpha, &format!("/v1/usage/alpha?{query}&format=csv"), "*/*").await;
    assert_eq!(status, 200, "{csv}");
    let row =
        csv.lines().find(|r| r.contains(",borrowed_cgpu,")).unwrap_or_else(|| panic!("{csv}"));
    let quantity: f64 = row.split(',').nth(8).unwrap().parse().unwrap();
    assert_eq!((quantity * 1000.0).round() as i64, length, "{csv}");

    // The loan becomes alpha's own: its mark comes off.
    let limits = json!({"exclusive_gpus": 2});
    assert_eq!(t.put(&admin, "/v1/quotas/alpha", &limits).await.0, 200);
    let (status, ran) =
        t.post(&admin, "/v1/background-tasks/loan_marks/activate", &json!({})).await;
    assert_eq!(status, 200, "{ran}");
    let (_, now_vm) = t.get(&alpha, &format!("/v1/vms/{vm}")).await;
    assert_eq!(marks(&now_vm), [false, false], "{now_vm}");

    // The loan's span ended at the change and its next, its own, started at the same instant;
    // the other cGPU's span goes on.
    let spans = loan_spans(&t, "alpha").await;
    let shape: Vec<(i64, bool, bool)> = spans.iter().map(|s| (s.1, s.4.is_some(), s.5)).collect();
    assert_eq!(shape, [(0, false, false), (1, true, true), (1, false, false)], "{spans:?}");
    let settled = spans[1].4.unwrap();
    assert_eq!((spans[1].3, spans[2].3), (loan_start, settled), "no gap, no overlap: {spans:?}");
    assert!(settled >= lent_until, "{spans:?}");

    // To now: borrowed time stands still, cGPU time grows (two cGPUs counting).
    let since = period(before - 1000, None);
    let (_, first) = t.get(&alpha, &format!("/v1/usage/alpha?{since}")).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (_, second) = t.get(&alpha, &format!("/v1/usage/alpha?{since}")).await;
    let (first, second) = (&first["projects"][0], &second["projects"][0]);
    let loaned = settled - loan_start;
    assert_eq!(ms(&first["borrowed_cgpu_seconds"]), loaned, "{first}");
    assert_eq!(ms(&second["borrowed_cgpu_seconds"]), loaned, "{second}");
    let grown = ms(&second["cgpu_seconds"]) - ms(&first["cgpu_seconds"]);
    assert!(grown >= 2 * 300, "cGPU time grew by {grown} ms in 300 ms: {first} {second}");

    // A closed period across the change: every span's part, once; borrowed the loan's part.
    let end = now_ms();
    let (_, closed) =
        t.get(&alpha, &format!("/v1/usage/alpha?{}", period(before - 1000, Some(end)))).await;
    let line = &closed["projects"][0];
    let expected: i64 = spans.iter().map(|s| clipped(s.3, s.4, before - 1000, end, end)).sum();
    assert_eq!(ms(&line["cgpu_seconds"]), expected, "{closed}");
    assert_eq!(ms(&line["borrowed_cgpu_seconds"]), loaned, "{closed}");
    assert_eq!(
        expected,
        (end - spans[0].3) + (end - loan_start),
        "the loan's two spans are its whole life: {spans:?}"
    );
}

/// The triggers: a counting cGPU whose loan mark is set or taken off logs an end and a start at
/// one instant, the start carrying the new mark; a mark changed on a cGPU that does not count
/// (not live, or its VM not counting), or changed from one loan time to another, logs nothing;
/// a change of state and mark in one statement logs one start, with the new mark. Folded, each
/// change splits the span there.
async fn a_loan_mark_change_ends_a_span_and_starts_the_next_at_one_instant(store: Store) {
    let db = support::FreshDb::open(store).await;
    let mut conn = db.conn().await.unwrap();
    sqlx::raw_sql(
        "INSERT INTO hosts (name, seq, kind, state, last_seen_ms) VALUES \
           ('h', 1, 'compute-gpu', 'schedulable', 0); \
         INSERT INTO gpus (id, host, idx, model, memory_mib, rcuda_address, rcuda_port, \
           rcuda_gpu_number) VALUES ('h:0', 'h', 0, 'K20m', 4800, '10.78.0.1', 8308, 0); \
         INSERT INTO vms (id, project, owner, name, request, policy, state, step, timings, \
           created_ms, updated_ms) VALUES \
           ('v', 'p', 'o', 'n', '{}', 'first-fit', 'ready', 'done', '{}', 0, 0), \
           ('w', 'p', 'o', 'n', '{}', 'first-fit', 'deleting', 'done', '{}', 0, 0); \
         INSERT INTO cgpus (vm, idx, gpu, memory_mib, mode, masked_address, masked_port, seq, \
           state, borrowed_ms) VALUES \
           ('v', 0, 'h:0', 512, 'shared', '100.127.0.1', 9000, 0, 'live', 5), \
           ('v', 1, 'h:0', 512, 'shared', '100.127.0.1', 9001, 0, 'live', NULL), \
           ('v', 2, 'h:0', 512, 'shared', '100.127.0.1', 9002, 1, 'attaching', 5), \
           ('w', 0, 'h:0', 512, 'shared', '100.127.0.1', 9003, 0, 'live', 5);",
    )
    .execute(&mut *conn)
    .await
    .unwrap();
    drop(conn);
    assert_eq!(db.fold_usage().await.unwrap(), 3, "v's start, its live cGPUs' starts");
    let mut conn = db.conn().await.unwrap();
    for change in [
        "UPDATE cgpus SET borrowed_ms = 7 WHERE vm = 'v' AND idx = 0", // still on loan
        "UPDATE cgpus SET borrowed_ms = NULL WHERE vm = 'w'",          // w does not count
        "UPDATE cgpus SET borrowed_ms = NULL WHERE vm = 'v'",          // 0 own; 1, 2: nothing
        "UPDATE cgpus SET state = 'live', borrowed_ms = 9 WHERE vm = 'v' AND idx = 2",
        "UPDATE cgpus SET borrowed_ms = 11 WHERE vm = 'v' AND idx = 1", // 1 on loan
    ] {
        sqlx::query(change).execute(&mut *conn).await.unwrap();
    }
    let rows = sqlx::query("SELECT op, at_ms, vm, idx, borrowed FROM usage_events ORDER BY seq")
        .fetch_all(&mut *conn)
        .await
        .unwrap();
    let events: Vec<(i64, i64, String, i64, Option<i64>)> =
        rows.iter().map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4))).collect();
    let logged: Vec<(i64, &str, i64, Option<i64>)> =
        events.iter().map(|e| (e.0, e.2.as_str(), e.3, e.4)).collect();
    assert_eq!(
        logged,
        [
            (1, "v", 0, None),
            (2, "v", 0, Some(0)),
            (2, "v", 2, Some(1)),
            (1, "v", 1, None),
            (2, "v", 1, Some(1))
        ],
        "{events:?}"
    );
    assert_eq!(events[0].1, events[1].1, "an end and its start at one instant: {events:?}");
    assert_eq!(events[3].1, events[4].1, "an end and its start at one instant: {events:?}");
    drop(conn);

    assert_eq!(db.fold_usage().await.unwrap(), 5);
    let mut conn = db.conn().await.unwrap();
    let rows = sqlx::query(
        "SELECT idx, start_ms, end_ms, borrowed FROM cgpu_usage WHERE vm = 'v' \
         ORDER BY idx, start_ms",
    )
    .fetch_all(&mut *conn)
    .await
    .unwrap();
    let spans: Vec<(i64, i64, Option<i64>, i64)> =
        rows.iter().map(|r| (r.get(0), r.get(1), r.get(2), r.get(3))).collect();
    let shape: Vec<(i64, bool, i64)> = spans.iter().map(|s| (s.0, s.2.is_some(), s.3)).collect();
    assert_eq!(
        shape,
        [(0, true, 1), (0, false, 0), (1, true, 0), (1, false, 1), (2, false, 1)],
        "{spans:?}"
    );
    assert_eq!(spans[0].2, Some(spans[1].1), "0's spans meet: {spans:?}");
    assert_eq!(spans[2].2, Some(spans[3].1), "1's spans meet: {spans:?}");
    assert_eq!(spans[1].1, events[0].1, "split when the mark came off: {spans:?}");
}
