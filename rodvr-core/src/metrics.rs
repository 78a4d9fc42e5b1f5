//! The agent's own numbers at `GET /metrics`: applied routes and generation, apply outcomes and
//! latency, refused tables (exposition helpers from `gsaas_infra::metrics`).

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

use gsaas_infra::metrics::{header, Histogram};

/// The agent's own numbers.
#[derive(Debug)]
pub struct AgentMetrics {
    pub applies_ok: AtomicU64,
    pub applies_failed: AtomicU64,
    pub tables_refused: AtomicU64,
    pub apply_seconds_full: Histogram,
    pub apply_seconds_update: Histogram,
}

impl Default for AgentMetrics {
    fn default() -> Self {
        AgentMetrics {
            applies_ok: AtomicU64::new(0),
            applies_failed: AtomicU64::new(0),
            tables_refused: AtomicU64::new(0),
            apply_seconds_full: Histogram::seconds(),
            apply_seconds_update: Histogram::seconds(),
        }
    }
}

impl AgentMetrics {
    /// The exposition, with the current table's facts.
    pub fn render(&self, applied_routes: usize, applied_generation: Option<u64>) -> String {
        let mut out = String::new();
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        header(
            &mut out,
            "rodvr_applied_routes",
            "gauge",
            "Routes in the table applied to the host firewall.",
        );
        let _ = writeln!(out, "rodvr_applied_routes {applied_routes}");
        header(
            &mut out,
            "rodvr_applied_generation",
            "gauge",
            "Generation of the applied table (0: none).",
        );
        let _ = writeln!(out, "rodvr_applied_generation {}", applied_generation.unwrap_or(0));
        header(
            &mut out,
            "rodvr_applies_total",
            "counter",
            "Route table applies to the firewall, by outcome.",
        );
        let _ = writeln!(out, "rodvr_applies_total{{outcome=\"ok\"}} {}", get(&self.applies_ok));
        let _ = writeln!(
            out,
            "rodvr_applies_total{{outcome=\"failed\"}} {}",
            get(&self.applies_failed)
        );
        header(
            &mut out,
            "rodvr_tables_refused_total",
            "counter",
            "Tables refused: invalid, or a generation conflict.",
        );
        let _ = writeln!(out, "rodvr_tables_refused_total {}", get(&self.tables_refused));
        header(
            &mut out,
            "rodvr_apply_seconds",
            "histogram",
            "Seconds to apply a table: full rebuild or element update.",
        );
        self.apply_seconds_full.render(&mut out, "rodvr_apply_seconds", "kind=\"full\"");
        self.apply_seconds_update.render(&mut out, "rodvr_apply_seconds", "kind=\"update\"");
        out
    }
}
