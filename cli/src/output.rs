//! Human output: aligned tables and key-value blocks from the API's JSON.
//!
//! Each printer takes the API's JSON as it is (the same value `-f json` prints), so the two outputs
//! never disagree; a field the caller may not see (admins-only ones) is simply absent.

use std::fmt::Write;

use serde_json::Value;

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

fn text(value: &Value) -> String {
    match value {
        Value::Null => "-".into(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

pub fn vm(vm: &Value) -> String {
    let mut out = String::new();
    let gpus = &vm["gpus"];
    let mut fields =
        vec![("id", text(&vm["id"])), ("name", text(&vm["name"])), ("state", text(&vm["state"]))];
    if !vm["error"].is_null() {
        fields.push(("error", text(&vm["error"])));
    }
    if let Some(position) = vm["queue_position"].as_u64() {
        fields.push(("queue position", position.to_string()));
    }
    fields.extend([
        ("project", text(&vm["project"])),
        ("image / flavor", format!("{} / {}", text(&vm["image"]), text(&vm["flavor"]))),
        (
            "launched with",
            format!(
                "{} {} (memory {}, locality {}, policy {})",
                text(&gpus["ncgpus"]),
                text(&gpus["mode"]),
                gpus["gpu_memory_mib"].as_u64().map_or("whole GPU".into(), |m| format!("{m} MiB")),
                text(&gpus["locality"]),
                text(&gpus["policy"]),
            ),
        ),
        ("server", text(&vm["server_id"])),
        ("fixed IP", text(&vm["fixed_ip"])),
    ]);
    if vm.get("host").is_some() {
        fields.push(("host", text(&vm["host"])));
    }
    for (key, value) in fields {
        let _ = writeln!(out, "{key:<15} {value}");
    }
    let cgpus = vm["cgpus"].as_array().cloned().unwrap_or_default();
    if !cgpus.is_empty() {
        let admin = cgpus[0].get("gpu").is_some();
        let mut headers = vec!["cGPU", "state", "masked endpoint", "memory MiB", "mode"];
        if admin {
            headers.extend(["GPU", "rCUDA endpoint"]);
        }
        let rows: Vec<Vec<String>> = cgpus
            .iter()
            .map(|c| {
                let mut row = vec![
                    text(&c["index"]),
                    text(&c["state"]),
                    text(&c["masked_endpoint"]),
                    text(&c["memory_mib"]),
                    text(&c["mode"]),
                ];
                if admin {
                    row.extend([text(&c["gpu"]), text(&c["rcuda_endpoint"])]);
                }
                row
            })
            .collect();
        out.push('\n');
        out.push_str(&table(&headers, &rows));
    }
    let queued = vm["queued_attaches"].as_array().cloned().unwrap_or_default();
    if !queued.is_empty() {
        let rows: Vec<Vec<String>> = queued
            .iter()
            .map(|q| {
                vec![
                    text(&q["position"]),
                    text(&q["kind"]),
                    text(&q["ncgpus"]),
                    text(&q["mode"]),
                    text(&q["gpu_memory_mib"]),
                ]
            })
            .collect();
        out.push('\n');
        out.push_str(&table(&["queued", "kind", "cGPUs", "mode", "memory MiB"], &rows));
    }
    let events = vm["events"].as_array().cloned().unwrap_or_default();
    if !events.is_empty() {
        let rows: Vec<Vec<String>> = events
            .iter()
            .map(|e| {
                let at = e["at_ms"].as_i64().map_or("-".into(), utc);
                vec![at, text(&e["kind"]), text(&e["detail"])]
            })
            .collect();
        out.push('\n');
        out.push_str(&table(&["event at (UTC)", "kind", "detail"], &rows));
    }
    let timings = vm["timings"].as_object().cloned().unwrap_or_default();
    if !timings.is_empty() {
        let order = [
            "check",
            "gpu_selection",
            "vm_creation",
            "vm_activation",
            "vm_deployment",
            "rodvr_configuration",
            "total",
        ];
        let rows: Vec<Vec<String>> = order
            .iter()
            .filter_map(|k| {
                timings
                    .get(*k)
                    .and_then(Value::as_f64)
                    .map(|s| vec![(*k).to_owned(), format!("{s:.4}")])
            })
            .collect();
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

pub fn vm_list(list: &Value) -> String {
    let rows: Vec<Vec<String>> = list["vms"]
        .as_array()
        .map(|vms| {
            vms.iter()
                .map(|vm| {
                    vec![
                        text(&vm["id"]),
                        text(&vm["name"]),
                        text(&vm["state"]),
                        vm["cgpus"].as_array().map_or(0, Vec::len).to_string(),
                        text(&vm["fixed_ip"]),
                    ]
                })
                .collect()
        })
        .unwrap_or_default();
    if rows.is_empty() {
        return "no VMs\n".into();
    }
    table(&["id", "name", "state", "cGPUs", "fixed IP"], &rows)
}

/// `export` lines, shell-quoted, for `eval "$(gsaas env ID)"`.
pub fn env(vm: &Value) -> String {
    let mut out = String::new();
    if let Some(vars) = vm["rcuda_env"].as_object() {
        for (key, value) in vars {
            let value = value.as_str().unwrap_or_default().replace('\'', r"'\''");
            let _ = writeln!(out, "export {key}='{value}'");
        }
    }
    out
}

pub fn queue(queue: &Value) -> String {
    let lengths: Vec<String> = queue["lengths"]
        .as_array()
        .map(|lengths| {
            lengths
                .iter()
                .map(|l| format!("{} at priority {}", text(&l["waiting"]), text(&l["priority"])))
                .collect()
        })
        .unwrap_or_default();
    if lengths.is_empty() {
        return "nothing waits\n".into();
    }
    let mut out = format!("waiting: {}\n", lengths.join(", "));
    let rows: Vec<Vec<String>> = queue["requests"]
        .as_array()
        .map(|requests| {
            requests
                .iter()
                .map(|r| {
                    let memory = r["gpu_memory_mib"].as_u64().map(|m| format!(", {m} MiB"));
                    vec![
                        text(&r["position"]),
                        text(&r["vm"]),
                        text(&r["vm_name"]),
                        text(&r["project"]),
                        text(&r["kind"]),
                        format!(
                            "{} {}{}",
                            text(&r["ncgpus"]),
                            text(&r["mode"]),
                            memory.unwrap_or_default()
                        ),
                        text(&r["priority"]),
                        r["enqueued_ms"].as_i64().map_or("-".into(), utc),
                    ]
                })
                .collect()
        })
        .unwrap_or_default();
    if !rows.is_empty() {
        out.push('\n');
        let headers =
            ["position", "VM", "name", "project", "kind", "cGPUs", "priority", "since (UTC)"];
        out.push_str(&table(&headers, &rows));
    }
    out
}

pub fn pool(pool: &Value) -> String {
    let t = &pool["totals"];
    let mut out = format!(
        "GPUs {} ({} idle), memory {} of {} MiB booked, {} cGPUs\n",
        text(&t["gpus"]),
        text(&t["idle_gpus"]),
        text(&t["allocated_mib"]),
        text(&t["memory_mib"]),
        text(&t["cgpus"])
    );
    if let Some(hosts) = pool["hosts"].as_array() {
        let rows: Vec<Vec<String>> = hosts
            .iter()
            .flat_map(|h| {
                let gpus = h["gpus"].as_array().cloned().unwrap_or_default();
                if gpus.is_empty() {
                    return vec![vec![
                        text(&h["name"]),
                        text(&h["state"]),
                        "-".into(),
                        "-".into(),
                        "-".into(),
                        "-".into(),
                        "-".into(),
                    ]];
                }
                gpus.iter()
                    .map(|g| {
                        vec![
                            text(&h["name"]),
                            text(&h["state"]),
                            text(&g["id"]),
                            format!("{}/{}", text(&g["allocated_mib"]), text(&g["memory_mib"])),
                            text(&g["cgpus"]),
                            text(&g["rcuda_endpoint"]),
                            gpu_condition(g),
                        ]
                    })
                    .collect()
            })
            .collect();
        out.push('\n');
        out.push_str(&table(
            &["host", "state", "GPU", "MiB booked", "cGPUs", "rCUDA endpoint", "condition"],
            &rows,
        ));
    }
    out
}

/// A GPU's health, taint and fenced bookings, in a few words (`ok` when none applies).
fn gpu_condition(g: &Value) -> String {
    let mut parts = Vec::new();
    if let Some(health) = g["health"].as_str() {
        parts.push(format!("unhealthy: {health}"));
    }
    if let Some(taint) = g["taint"].as_str() {
        parts.push(format!("tainted: {taint}"));
    }
    if let Some(n @ 1..) = g["fenced"].as_u64() {
        parts.push(format!("{n} fenced"));
    }
    if parts.is_empty() {
        "ok".into()
    } else {
        parts.join("; ")
    }
}

/// What an evacuation moved.
pub fn evacuation(done: &Value) -> String {
    let vms = done["vms"].as_array().map_or(0, Vec::len);
    format!(
        "moved {} cGPU(s) of {vms} VM(s); their masked endpoints are unchanged\n",
        text(&done["moved"])
    )
}

/// A GPU's taint after a taint or untaint.
pub fn taint(view: &Value) -> String {
    match view["taint"].as_str() {
        Some(taint) => format!("{} tainted: {taint}\n", text(&view["id"])),
        None => format!("{} untainted\n", text(&view["id"])),
    }
}

/// The fences: bookings kept while a host may still route to them.
pub fn fences(list: &Value) -> String {
    let rows: Vec<Vec<String>> = list["fences"]
        .as_array()
        .map(|fs| {
            fs.iter()
                .map(|f| {
                    let gpus: Vec<String> = f["gpus"]
                        .as_array()
                        .map(|g| g.iter().map(text).collect())
                        .unwrap_or_default();
                    vec![
                        text(&f["id"]),
                        text(&f["vm"]),
                        text(&f["host"]),
                        text(&f["generation"]),
                        gpus.join(", "),
                        text(&f["reason"]),
                    ]
                })
                .collect()
        })
        .unwrap_or_default();
    table(&["fence", "VM", "host", "until generation", "GPUs", "why"], &rows)
}

pub fn hosts(hosts: &Value) -> String {
    let rows: Vec<Vec<String>> =
        hosts["hosts"].as_array().map(|hs| hs.iter().map(host_row).collect()).unwrap_or_default();
    table(&["host", "kind", "state", "agent", "routes applied"], &rows)
}

fn host_row(h: &Value) -> Vec<String> {
    let state = match h["forgotten"].as_bool() {
        Some(true) => format!("{} (forgotten)", text(&h["state"])),
        _ => text(&h["state"]),
    };
    vec![
        text(&h["name"]),
        text(&h["kind"]),
        state,
        text(&h["agent_url"]),
        format!("{}/{}", text(&h["applied_generation"]), text(&h["routes_generation"])),
    ]
}

pub fn host(host: &Value) -> String {
    table(&["host", "kind", "state", "agent", "routes applied"], &[host_row(host)])
}

const QUOTA_RESOURCES: [&str; 4] = ["cgpus", "memory_mib", "exclusive_gpus", "vms"];

/// `used / limit` of one resource (`none`: no limit).
fn quota_use(quota: &Value, resource: &str) -> String {
    let used = quota["usage"][resource].as_u64().unwrap_or(0);
    match quota["limits"][resource].as_u64() {
        Some(limit) => format!("{used} / {limit}"),
        None => format!("{used} / none"),
    }
}

pub fn quota(quota: &Value) -> String {
    let whose = if quota["own_limits"] == true { "its own limits" } else { "the default limits" };
    let rows: Vec<Vec<String>> =
        QUOTA_RESOURCES.iter().map(|r| vec![(*r).to_owned(), quota_use(quota, r)]).collect();
    format!(
        "project {} ({whose})\n{}highest priority: {}\n",
        quota["project"].as_str().unwrap_or("?"),
        table(&["resource", "used / limit"], &rows),
        quota["limits"]["max_priority"]
    )
}

pub fn quota_list(list: &Value) -> String {
    let rows: Vec<Vec<String>> = list["quotas"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .map(|q| {
            let mut row = vec![q["project"].as_str().unwrap_or("?").to_owned()];
            row.extend(QUOTA_RESOURCES.iter().map(|r| quota_use(q, r)));
            row.push(if q["own_limits"] == true { "own" } else { "default" }.to_owned());
            row
        })
        .collect();
    table(&["project", "cgpus", "memory_mib", "exclusive_gpus", "vms", "limits"], &rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align_and_env_quotes() {
        let t = table(&["a", "bb"], &[vec!["xxx".into(), "y".into()]]);
        assert_eq!(t, "a    bb\nxxx  y\n");
        let vm =
            serde_json::json!({"rcuda_env": {"RCUDA_DEVICE_0": "100.127.0.1@8308:0", "X": "it's"}});
        assert_eq!(env(&vm), "export RCUDA_DEVICE_0='100.127.0.1@8308:0'\nexport X='it'\\''s'\n");
    }

    #[test]
    fn event_times_are_utc_dates() {
        assert_eq!(utc(0), "1970-01-01 00:00:00");
        assert_eq!(utc(951_782_400_000), "2000-02-29 00:00:00");
        assert_eq!(utc(1_795_608_000_999), "2026-11-25 12:00:00");
        assert_eq!(utc(-1_000), "1969-12-31 23:59:59");
    }
}
