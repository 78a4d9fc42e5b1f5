//! Human output: aligned tables and key-value blocks from the API's answers, read into the API's
//! own types (`gsaas-api-types`).
//!
//! `-f json` prints the answer exactly as the service sent it; these printers show the same
//! answer, so the two outputs never disagree. A field the caller may not see (admins-only ones)
//! is absent, and shown as such.

use std::fmt::Display;
use std::fmt::Write;

use gsaas_api_types::{
    BackgroundTaskList, BackgroundTaskView, CohortList, CohortView, EvacuationView, FenceList,
    GpuTaintView, GpuView, HostList, HostView, ModelQuotaLimits, ModelQuotaUsage, PoolView,
    QueueView, QuotaList, QuotaView, TaskOutcome, UsageReport, UsageTotals, VmList, VmView,
    LAUNCH_STAGES,
};

/// Left-aligned columns, two spaces apart.
pub fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let line = |out: &mut String, cells: Vec<&str>| {
        let text: Vec<String> =
            cells.iter().zip(&widths).map(|(c, w)| format!("{c:<w$}")).collect();
        let _ = writeln!(out, "{}", text.join("  ").trim_end());
    };
    line(&mut out, headers.to_vec());
    for row in rows {
        line(&mut out, row.iter().map(String::as_str).collect());
    }
    out
}

/// The value, or `-` when there is none.
fn or_dash(value: Option<impl Display>) -> String {
    value.map_or_else(|| "-".into(), |v| v.to_string())
}

pub fn vm(vm: &VmView) -> String {
    let mut out = String::new();
    let gpus = &vm.gpus;
    let mut fields =
        vec![("id", vm.id.clone()), ("name", vm.name.clone()), ("state", vm.state.clone())];
    if let Some(error) = &vm.error {
        fields.push(("error", error.clone()));
    }
    if let Some(position) = vm.queue_position {
        fields.push(("queue position", position.to_string()));
    }
    fields.extend([
        ("project", vm.project.clone()),
        ("image / flavor", format!("{} / {}", vm.image, vm.flavor)),
        (
            "launched with",
            format!(
                "{} {} (memory {}, locality {}, policy {})",
                gpus.ncgpus,
                gpus.mode.as_str(),
                gpus.gpu_memory_mib.map_or("whole GPU".into(), |m| format!("{m} MiB")),
                gpus.locality.as_str(),
                gpus.policy,
            ),
        ),
        ("server", or_dash(vm.server_id.as_ref())),
        ("fixed IP", or_dash(vm.fixed_ip.as_ref())),
    ]);
    if let Some(host) = &vm.host {
        fields.push(("host", host.clone()));
    }
    for (key, value) in fields {
        let _ = writeln!(out, "{key:<15} {value}");
    }
    if !vm.cgpus.is_empty() {
        let admin = vm.cgpus[0].gpu.is_some();
        let any_borrowed = vm.cgpus.iter().any(|c| c.borrowed);
        let mut headers = vec!["cGPU", "state", "masked endpoint", "memory MiB", "mode"];
        if any_borrowed {
            headers.push("borrowed");
        }
        if admin {
            headers.extend(["GPU", "GPU server"]);
        }
        let rows: Vec<Vec<String>> = vm
            .cgpus
            .iter()
            .map(|c| {
                let mut row = vec![
                    c.index.to_string(),
                    c.state.as_str().into(),
                    c.masked_endpoint.clone(),
                    c.memory_mib.to_string(),
                    c.mode.clone(),
                ];
                if any_borrowed {
                    row.push(if c.borrowed { "yes" } else { "no" }.to_owned());
                }
                if admin {
                    let server = c.gpu_server.as_ref().or(c.rcuda_endpoint.as_ref());
                    row.extend([or_dash(c.gpu.as_ref()), or_dash(server)]);
                }
                row
            })
            .collect();
        out.push('\n');
        out.push_str(&table(&headers, &rows));
    }
    if !vm.queued_attaches.is_empty() {
        let rows: Vec<Vec<String>> = vm
            .queued_attaches
            .iter()
            .map(|q| {
                vec![
                    q.position.to_string(),
                    q.kind.clone(),
                    q.ncgpus.to_string(),
                    q.mode.as_str().into(),
                    or_dash(q.gpu_memory_mib),
                ]
            })
            .collect();
        out.push('\n');
        out.push_str(&table(&["queued", "kind", "cGPUs", "mode", "memory MiB"], &rows));
    }
    if !vm.events.is_empty() {
        let rows: Vec<Vec<String>> = vm
            .events
            .iter()
            .map(|e| vec![utc(e.at_ms), e.kind.clone(), e.detail.clone()])
            .collect();
        out.push('\n');
        out.push_str(&table(&["event at (UTC)", "kind", "detail"], &rows));
    }
    let rows: Vec<Vec<String>> = LAUNCH_STAGES
        .iter()
        .chain(&["total"])
        .filter_map(|stage| {
            vm.timings.of(stage).map(|s| vec![(*stage).to_owned(), format!("{s:.4}")])
        })
        .collect();
    if !rows.is_empty() {
        out.push('\n');
        out.push_str(&table(&["stage", "seconds"], &rows));
    }
    out
}

/// Milliseconds since the Unix epoch as `YYYY-MM-DD hh:mm:ss` in UTC (proleptic Gregorian).
fn utc(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let (days, day_secs) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Days to a civil date, counting eras of 400 years from 0000-03-01.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let mp = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    let (h, m, s) = (day_secs / 3600, day_secs % 3600 / 60, day_secs % 60);
    format!("{year:04}-{month:02}-{day:02} {h:02}:{m:02}:{s:02}")
}

pub fn vm_list(list: &VmList) -> String {
    let rows: Vec<Vec<String>> = list
        .vms
        .iter()
        .map(|vm| {
            vec![
                vm.id.clone(),
                vm.name.clone(),
                vm.state.clone(),
                vm.cgpus.len().to_string(),
                or_dash(vm.fixed_ip.as_ref()),
            ]
        })
        .collect();
    if rows.is_empty() {
        return "no VMs\n".into();
    }
    table(&["id", "name", "state", "cGPUs", "fixed IP"], &rows)
}

/// `export` lines, shell-quoted, for `eval "$(gsaas env ID)"`.
pub fn env(vm: &VmView) -> String {
    let mut out = String::new();
    // A server that predates layers answers rCUDA's alone.
    let env = if vm.gpu_env.is_empty() { &vm.rcuda_env } else { &vm.gpu_env };
    for (key, value) in env {
        let value = value.replace('\'', r"'\''");
        let _ = writeln!(out, "export {key}='{value}'");
    }
    out
}

pub fn queue(queue: &QueueView) -> String {
    let lengths: Vec<String> =
        queue.lengths.iter().map(|l| format!("{} at priority {}", l.waiting, l.priority)).collect();
    if lengths.is_empty() {
        return "nothing waits\n".into();
    }
    let mut out = format!("waiting: {}\n", lengths.join(", "));
    let rows: Vec<Vec<String>> = queue
        .requests
        .iter()
        .map(|r| {
            let w = &r.waiting;
            let memory = w.gpu_memory_mib.map(|m| format!(", {m} MiB")).unwrap_or_default();
            vec![
                w.position.to_string(),
                r.vm.clone(),
                r.vm_name.clone(),
                r.project.clone(),
                w.kind.clone(),
                format!("{} {}{memory}", w.ncgpus, w.mode.as_str()),
                r.priority.to_string(),
                utc(w.enqueued_ms),
            ]
        })
        .collect();
    if !rows.is_empty() {
        out.push('\n');
        let headers =
            ["position", "VM", "name", "project", "kind", "cGPUs", "priority", "since (UTC)"];
        out.push_str(&table(&headers, &rows));
    }
    out
}

pub fn pool(pool: &PoolView) -> String {
    let t = &pool.totals;
    let mut out = format!(
        "GPUs {} ({} idle), memory {} of {} MiB booked, {} cGPUs\n",
        t.gpus, t.idle_gpus, t.allocated_mib, t.memory_mib, t.cgpus
    );
    if let Some(hosts) = &pool.hosts {
        let rows: Vec<Vec<String>> = hosts
            .iter()
            .flat_map(|h| {
                if h.gpus.is_empty() {
                    let mut row = vec![h.name.clone(), h.state.clone()];
                    row.extend(std::iter::repeat_n("-".to_owned(), 6));
                    return vec![row];
                }
                h.gpus
                    .iter()
                    .map(|g| {
                        vec![
                            h.name.clone(),
                            h.state.clone(),
                            match &g.partition {
                                Some(p) => format!("{} ({} of {})", g.id, p.profile, p.parent),
                                None => g.id.clone(),
                            },
                            match g.compute_capability {
                                Some(cc) => format!("{} ({cc})", g.model),
                                None => g.model.clone(),
                            },
                            format!("{}/{}", g.allocated_mib, g.memory_mib),
                            g.cgpus.to_string(),
                            if g.gpu_server.is_empty() {
                                g.rcuda_endpoint.clone()
                            } else {
                                g.gpu_server.clone()
                            },
                            gpu_condition(g),
                        ]
                    })
                    .collect()
            })
            .collect();
        out.push('\n');
        out.push_str(&table(
            &["host", "state", "GPU", "model", "MiB booked", "cGPUs", "GPU server", "condition"],
            &rows,
        ));
    }
    out
}

/// A GPU's health, taint and fenced bookings, in a few words (`ok` when none applies).
fn gpu_condition(g: &GpuView) -> String {
    let mut parts = Vec::new();
    if let Some(health) = &g.health {
        parts.push(format!("unhealthy: {health}"));
    }
    if let Some(taint) = &g.taint {
        parts.push(format!("tainted: {taint}"));
    }
    if g.fenced > 0 {
        parts.push(format!("{} fenced", g.fenced));
    }
    if g.partitions > 0 {
        parts.push(format!("in {} partition(s), not booked whole", g.partitions));
    }
    if parts.is_empty() {
        "ok".into()
    } else {
        parts.join("; ")
    }
}

/// What an evacuation moved.
pub fn evacuation(done: &EvacuationView) -> String {
    format!(
        "moved {} cGPU(s) of {} VM(s); their masked endpoints are unchanged\n",
        done.moved,
        done.vms.len()
    )
}

/// A GPU's taint after a taint or untaint.
pub fn taint(view: &GpuTaintView) -> String {
    match &view.taint {
        Some(taint) => format!("{} tainted: {taint}\n", view.id),
        None => format!("{} untainted\n", view.id),
    }
}

/// The fences: bookings kept while a host may still route to them.
pub fn fences(list: &FenceList) -> String {
    let rows: Vec<Vec<String>> = list
        .fences
        .iter()
        .map(|f| {
            vec![
                f.id.clone(),
                f.vm.clone(),
                f.host.clone(),
                f.generation.to_string(),
                f.gpus.join(", "),
                f.reason.clone(),
            ]
        })
        .collect();
    table(&["fence", "VM", "host", "until generation", "GPUs", "why"], &rows)
}

/// The background tasks of the replica that answered.
pub fn tasks(list: &BackgroundTaskList) -> String {
    let rows: Vec<Vec<String>> = list.tasks.iter().map(task_row).collect();
    table(&["task", "every", "runs", "failed", "last took", "last", "what it did"], &rows)
}

/// One task, after an activation.
pub fn task(view: &BackgroundTaskView) -> String {
    tasks(&BackgroundTaskList { tasks: vec![view.clone()] })
}

fn task_row(t: &BackgroundTaskView) -> Vec<String> {
    let last = match (t.running, t.last_outcome, &t.last_error) {
        (true, _, _) => "running".to_owned(),
        (false, Some(TaskOutcome::Error), Some(error)) => format!("error: {error}"),
        (false, Some(TaskOutcome::Error), None) => "error".to_owned(),
        (false, Some(TaskOutcome::Ok), _) => "ok".to_owned(),
        (false, None, _) => "not yet".to_owned(),
    };
    let report: Vec<String> = t.last_report.iter().map(|(what, n)| format!("{what} {n}")).collect();
    vec![
        t.name.clone(),
        format!("{} s", t.period_ms as f64 / 1000.0),
        t.activations.to_string(),
        t.failures.to_string(),
        t.last_duration_ms.map_or("-".to_owned(), |ms| format!("{ms} ms")),
        last,
        report.join(", "),
    ]
}

pub fn hosts(hosts: &HostList) -> String {
    let rows: Vec<Vec<String>> = hosts.hosts.iter().map(host_row).collect();
    table(&["host", "kind", "state", "agent", "routes applied", "topology"], &rows)
}

fn host_row(h: &HostView) -> Vec<String> {
    let state = if h.forgotten { format!("{} (forgotten)", h.state) } else { h.state.clone() };
    vec![
        h.name.clone(),
        h.kind.clone(),
        state,
        or_dash(h.agent_url.as_ref()),
        format!("{}/{}", h.applied_generation, h.routes_generation),
        match h.topology.is_empty() {
            true => "-".to_owned(),
            false => {
                let levels = h.topology.iter().map(|(level, group)| format!("{level}={group}"));
                levels.collect::<Vec<_>>().join(",")
            }
        },
    ]
}

pub fn host(host: &HostView) -> String {
    table(&["host", "kind", "state", "agent", "routes applied", "topology"], &[host_row(host)])
}

/// Each resource with `used / limit` (`none`: no limit).
fn quota_uses(quota: &QuotaView) -> [(&'static str, String); 4] {
    let (u, l) = (&quota.usage, &quota.limits);
    let of = |used: u64, limit: Option<u64>| match limit {
        Some(limit) => format!("{used} / {limit}"),
        None => format!("{used} / none"),
    };
    [
        ("cgpus", of(u.cgpus, l.cgpus)),
        ("memory_mib", of(u.memory_mib, l.memory_mib)),
        ("exclusive_gpus", of(u.exclusive_gpus, l.exclusive_gpus)),
        ("vms", of(u.vms, l.vms)),
    ]
}

pub fn quota(quota: &QuotaView) -> String {
    let whose = if quota.own_limits { "its own limits" } else { "the default limits" };
    let rows: Vec<Vec<String>> =
        quota_uses(quota).into_iter().map(|(r, uses)| vec![r.to_owned(), uses]).collect();
    let mut out = format!(
        "project {} ({whose})\n{}highest priority: {}\n",
        quota.project,
        table(&["resource", "used / limit"], &rows),
        or_dash(quota.limits.max_priority)
    );
    if let Some(cohort) = &quota.cohort {
        let _ = writeln!(
            out,
            "cohort: {cohort}; borrowed past the limits: {} (cGPUs / memory MiB / exclusive GPUs)",
            lent(&quota.borrowed)
        );
    }
    // Per GPU model: those limited or held.
    let mut models: Vec<&String> =
        quota.limits.models.keys().chain(quota.usage.models.keys()).collect();
    models.sort();
    models.dedup();
    if !models.is_empty() {
        let rows: Vec<Vec<String>> = models
            .into_iter()
            .map(|model| {
                let limits = quota.limits.models.get(model).copied().unwrap_or_default();
                let used = quota.usage.models.get(model);
                let of = |used: Option<u64>, limit: Option<u64>| {
                    let limit = limit.map_or_else(|| "none".to_owned(), |l| l.to_string());
                    format!("{} / {limit}", used.unwrap_or(0))
                };
                vec![
                    model.clone(),
                    of(used.map(|u| u.cgpus), limits.cgpus),
                    of(used.map(|u| u.memory_mib), limits.memory_mib),
                    of(used.map(|u| u.exclusive_gpus), limits.exclusive_gpus),
                ]
            })
            .collect();
        out.push_str(&table(&["model", "cgpus", "memory_mib", "exclusive_gpus"], &rows));
    }
    out
}

pub fn quota_list(list: &QuotaList) -> String {
    let rows: Vec<Vec<String>> = list
        .quotas
        .iter()
        .map(|q| {
            let mut row = vec![q.project.clone()];
            row.extend(quota_uses(q).into_iter().map(|(_, uses)| uses));
            row.push(if q.own_limits { "own" } else { "default" }.to_owned());
            row
        })
        .collect();
    table(&["project", "cgpus", "memory_mib", "exclusive_gpus", "vms", "limits"], &rows)
}

/// The lent resources as `cGPUs / MiB / exclusive GPUs`.
fn lent(u: &ModelQuotaUsage) -> String {
    format!("{} / {} / {}", u.cgpus, u.memory_mib, u.exclusive_gpus)
}

/// Limits on the lent resources as `cGPUs / MiB / exclusive GPUs` (`none`: no limit).
fn lent_limits(l: &ModelQuotaLimits) -> String {
    let one = |n: Option<u64>| n.map_or_else(|| "none".to_owned(), |n| n.to_string());
    format!("{} / {} / {}", one(l.cgpus), one(l.memory_mib), one(l.exclusive_gpus))
}

/// A cohort: a row per member (cGPUs / MiB / exclusive GPUs in each cell), then its totals.
pub fn cohort(cohort: &CohortView) -> String {
    let rows: Vec<Vec<String>> = cohort
        .members
        .iter()
        .map(|(project, m)| {
            vec![
                project.clone(),
                lent(&m.borrowed),
                lent(&m.lendable),
                lent_limits(&m.terms.borrowing_limit),
                lent_limits(&m.terms.lending_limit),
                if m.terms.borrow_by_default { "yes" } else { "no" }.to_owned(),
            ]
        })
        .collect();
    let headers = [
        "project",
        "borrowed",
        "lendable",
        "borrowing limit",
        "lending limit",
        "borrows by default",
    ];
    let by_model: String = cohort
        .members
        .iter()
        .flat_map(|(project, m)| {
            m.terms.borrowing_limit_by_model.iter().map(move |(model, limits)| {
                format!("{project} borrows at most {} of GPU model {model}\n", lent_limits(limits))
            })
        })
        .collect();
    format!(
        "cohort {} (cGPUs / memory MiB / exclusive GPUs)\n{}{by_model}borrowed in all: {}; lendable in all: {}\n",
        cohort.name,
        table(&headers, &rows),
        lent(&cohort.borrowed),
        lent(&cohort.lendable)
    )
}

pub fn cohort_list(list: &CohortList) -> String {
    let rows: Vec<Vec<String>> = list
        .cohorts
        .iter()
        .map(|c| {
            vec![c.name.clone(), c.members.len().to_string(), lent(&c.borrowed), lent(&c.lendable)]
        })
        .collect();
    table(&["cohort", "members", "borrowed", "lendable"], &rows)
}

/// Hours, from seconds, as usage tables show them.
fn hours(seconds: f64) -> String {
    format!("{:.2}", seconds / 3600.0)
}

/// A usage report: a row per project (or, for one project, its totals, its models and its VMs),
/// in hours; `borrowed_cgpu_hours` is the part of `cgpu_hours` on loan from the project's cohort.
pub fn usage(report: &UsageReport) -> String {
    let mut out = format!("usage from {} to {}\n", report.start, report.end);
    let totals = |u: &UsageTotals| {
        vec![
            hours(u.vm_seconds),
            hours(u.cgpu_seconds),
            format!("{:.2}", u.gpu_memory_mib_seconds / 3600.0 / 1024.0),
            hours(u.exclusive_gpu_seconds),
            hours(u.borrowed_cgpu_seconds),
        ]
    };
    let heads = [
        "vm_hours",
        "cgpu_hours",
        "gpu_memory_gib_hours",
        "exclusive_gpu_hours",
        "borrowed_cgpu_hours",
    ];
    let with = |first: &[&'static str]| -> Vec<&'static str> {
        first.iter().chain(heads.iter()).copied().collect()
    };
    let rows: Vec<Vec<String>> = report
        .projects
        .iter()
        .map(|p| {
            let mut row = vec![p.project.clone()];
            row.extend(totals(&p.usage));
            row
        })
        .collect();
    out.push_str(&table(&with(&["project"]), &rows));
    for project in &report.projects {
        let Some(vms) = &project.vms else { continue };
        let models: Vec<Vec<String>> = project
            .usage
            .by_model
            .iter()
            .map(|m| {
                vec![
                    m.model.clone(),
                    m.mode.clone(),
                    hours(m.cgpu_seconds),
                    format!("{:.2}", m.gpu_memory_mib_seconds / 3600.0 / 1024.0),
                    hours(m.borrowed_cgpu_seconds),
                ]
            })
            .collect();
        if !models.is_empty() {
            out.push('\n');
            let heads =
                ["model", "mode", "cgpu_hours", "gpu_memory_gib_hours", "borrowed_cgpu_hours"];
            out.push_str(&table(&heads, &models));
        }
        let rows: Vec<Vec<String>> = vms
            .iter()
            .map(|vm| {
                let mut row = vec![vm.id.clone(), vm.name.clone()];
                row.extend(totals(&vm.usage));
                row
            })
            .collect();
        if !rows.is_empty() {
            out.push('\n');
            out.push_str(&table(&with(&["vm", "name"]), &rows));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align_and_env_quotes() {
        let t = table(&["a", "bb"], &[vec!["xxx".into(), "y".into()]]);
        assert_eq!(t, "a    bb\nxxx  y\n");
        let mut vm: VmView = serde_json::from_value(serde_json::json!({
            "id": "x", "name": "x", "project": "p", "state": "ready", "priority": 0,
            "preemptible": false, "give_back": true, "image": "i", "flavor": "f",
            "server_id": null, "fixed_ip": null, "rcuda_env": {},
            "gpus": {"ncgpus": 1, "gpu_memory_mib": null, "mode": "exclusive", "locality": "any",
                "distinct_gpus": false, "policy": "p"},
            "cgpus": [], "timings": {}, "created_ms": 0, "updated_ms": 0
        }))
        .unwrap();
        vm.rcuda_env.insert("RCUDA_DEVICE_0".into(), "100.127.0.1@8308:0".into());
        vm.rcuda_env.insert("X".into(), "it's".into());
        assert_eq!(env(&vm), "export RCUDA_DEVICE_0='100.127.0.1@8308:0'\nexport X='it'\\''s'\n");
    }

    #[test]
    fn the_pool_shows_partitions_and_their_parents() {
        let gpu = |id: &str, extra: serde_json::Value| {
            let mut gpu = serde_json::json!({
                "id": id, "index": 0, "model": "A100 MIG 3g.40gb", "memory_mib": 40960,
                "allocated_mib": 0, "exclusive": false, "cgpus": 0, "jobs": 0,
                "gpu_server": "10.0.0.1:8308", "rcuda_endpoint": "10.0.0.1:8308", "vms": {},
                "taint": null, "health": null,
                "fenced": 0
            });
            gpu.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
            gpu
        };
        let view: PoolView = serde_json::from_value(serde_json::json!({
            "totals": {"gpus": 1, "memory_mib": 40960, "allocated_mib": 0, "cgpus": 0,
                "idle_gpus": 1},
            "hosts": [{"name": "g1", "kind": "compute-gpu", "state": "schedulable", "vms": 0,
                "gpus": [
                    gpu("g1:gpu0", serde_json::json!({"model": "A100", "partitions": 1})),
                    gpu("g1:gpu1", serde_json::json!(
                        {"partition": {"parent": "g1:gpu0", "profile": "3g.40gb"}})),
                ]}]
        }))
        .unwrap();
        let text = pool(&view);
        assert!(text.contains("in 1 partition(s), not booked whole"), "{text}");
        assert!(text.contains("g1:gpu1 (3g.40gb of g1:gpu0)"), "{text}");
    }

    #[test]
    fn usage_tables_show_the_borrowed_cgpu_hours() {
        let totals = serde_json::json!({
            "vm_seconds": 7200.0, "cgpu_seconds": 14400.0, "gpu_memory_mib_seconds": 0.0,
            "exclusive_gpu_seconds": 14400.0, "borrowed_cgpu_seconds": 5400.0,
            "borrowed_gpu_memory_mib_seconds": 0.0,
            "by_model": [{"model": "A100", "mode": "exclusive", "cgpu_seconds": 14400.0,
                "gpu_memory_mib_seconds": 0.0, "borrowed_cgpu_seconds": 5400.0,
                "borrowed_gpu_memory_mib_seconds": 0.0}]
        });
        let mut project = totals.clone();
        project["project"] = "alpha".into();
        let mut vm = totals;
        vm.as_object_mut().unwrap().extend(
            serde_json::json!({"id": "v1", "name": "train", "started_ms": 0, "ended_ms": null})
                .as_object()
                .unwrap()
                .clone(),
        );
        project["vms"] = serde_json::json!([vm]);
        let report: UsageReport = serde_json::from_value(serde_json::json!({
            "start": "2026-11-01T00:00:00Z", "end": "2026-11-02T00:00:00Z", "start_ms": 0,
            "end_ms": 86_400_000, "projects": [project]
        }))
        .unwrap();
        let text = usage(&report);
        let lines: Vec<&str> = text.lines().collect();
        // The project's, the model's and the VM's tables each end with the borrowed hours.
        let heads: Vec<&&str> =
            lines.iter().filter(|l| l.ends_with("borrowed_cgpu_hours")).collect();
        assert_eq!(heads.len(), 3, "{text}");
        for row in ["alpha ", "A100 ", "v1 "] {
            let line = lines.iter().find(|l| l.starts_with(row)).unwrap();
            assert!(line.ends_with("  1.50"), "{row}: {text}");
        }
        // A report of a gsaasd before cohorts has no borrowed time: none is shown.
        let older: UsageReport = serde_json::from_value(serde_json::json!({
            "start": "s", "end": "e", "start_ms": 0, "end_ms": 1, "projects": [{
                "project": "alpha", "vm_seconds": 0.0, "cgpu_seconds": 3600.0,
                "gpu_memory_mib_seconds": 0.0, "exclusive_gpu_seconds": 0.0, "by_model": []}]
        }))
        .unwrap();
        assert_eq!(older.projects[0].usage.borrowed_cgpu_seconds, 0.0);
        assert!(usage(&older).lines().any(|l| l.starts_with("alpha ") && l.ends_with("  0.00")));
    }

    #[test]
    fn event_times_are_utc_dates() {
        assert_eq!(utc(0), "1970-01-01 00:00:00");
        assert_eq!(utc(951_782_400_000), "2000-02-29 00:00:00");
        assert_eq!(utc(1_795_608_000_999), "2026-11-25 12:00:00");
        assert_eq!(utc(-1_000), "1969-12-31 23:59:59");
    }
}
