//! Counters for `/metrics`, in the Prometheus text format.
//!
//! Plain atomics: the service counts a handful of events, and the exposition is written by hand so
//! no metrics framework enters the dependency tree. Gauges (pool use, VMs by state) are read from the
//! pool and the database when scraped.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Debug, Default)]
pub struct Metrics {
    pub launches_accepted: AtomicU64,
    pub launches_refused: AtomicU64,
    pub launches_ready: AtomicU64,
    pub launches_failed: AtomicU64,
    pub terminations: AtomicU64,
    pub route_pushes: AtomicU64,
    pub route_push_failures: AtomicU64,
    pub reconciler_runs: AtomicU64,
    pub reconciler_errors: AtomicU64,
}

pub fn inc(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

impl Metrics {
    /// Writes the counters in the Prometheus text format.
    pub fn render(&self, out: &mut String) {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let _ = writeln!(out, "# HELP gsaas_launches_total Launch requests by outcome.");
        let _ = writeln!(out, "# TYPE gsaas_launches_total counter");
        for (outcome, c) in [
            ("accepted", &self.launches_accepted),
            ("refused", &self.launches_refused),
            ("ready", &self.launches_ready),
            ("failed", &self.launches_failed),
        ] {
            let _ = writeln!(out, "gsaas_launches_total{{outcome=\"{outcome}\"}} {}", get(c));
        }
        for (name, help, c) in [
            ("gsaas_terminations_total", "Termination requests accepted.", &self.terminations),
            ("gsaas_route_pushes_total", "Route tables pushed to host agents.", &self.route_pushes),
            (
                "gsaas_route_push_failures_total",
                "Route table pushes that failed.",
                &self.route_push_failures,
            ),
            ("gsaas_reconciler_runs_total", "Reconciler passes.", &self.reconciler_runs),
            (
                "gsaas_reconciler_errors_total",
                "Reconciler passes that hit an error.",
                &self.reconciler_errors,
            ),
        ] {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} counter");
            let _ = writeln!(out, "{name} {}", get(c));
        }
    }
}

/// Per-GPU gauges from the pool, in the Prometheus text format.
pub fn render_pool(pool: &gpgpums::Pool) -> String {
    let mut out = String::new();
    for (name, help) in [
        ("gsaas_gpu_memory_mib", "GPU memory by GPU."),
        ("gsaas_gpu_allocated_mib", "GPU memory booked by cGPUs, by GPU."),
        ("gsaas_gpu_cgpus", "cGPUs by GPU."),
    ] {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} gauge");
    }
    for g in pool.gpu_usage() {
        let labels = format!("gpu=\"{}\",host=\"{}\"", g.id, g.host);
        let _ = writeln!(out, "gsaas_gpu_memory_mib{{{labels}}} {}", g.memory_mib);
        let _ = writeln!(out, "gsaas_gpu_allocated_mib{{{labels}}} {}", g.allocated_mib);
        let _ = writeln!(out, "gsaas_gpu_cgpus{{{labels}}} {}", g.cgpus);
    }
    out
}
