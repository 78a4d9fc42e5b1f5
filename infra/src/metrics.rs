//! Prometheus text-format building blocks, shared by `gsaasd` and the agent.
//!
//! A handful of counters and fixed-bucket histograms over atomics, written out by hand in the
//! Prometheus text format rather than by the `prometheus-client` crate, whose OpenMetrics text
//! `promtool check metrics` refuses (the measurement is in gsaasd's `metrics` module docs).

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

/// A histogram with fixed upper bounds in seconds.
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    /// Count per bucket (not cumulative), plus one for +Inf.
    buckets: Vec<AtomicU64>,
    count: AtomicU64,
    sum_nanos: AtomicU64,
}

/// From 10 µs to 10 minutes: decisions take microseconds, VM boots minutes.
const SECONDS: &[f64] = &[
    0.00001, 0.0001, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 600.0,
];

impl Histogram {
    pub fn seconds() -> Histogram {
        Histogram {
            bounds: SECONDS,
            buckets: (0..=SECONDS.len()).map(|_| AtomicU64::new(0)).collect(),
            count: AtomicU64::new(0),
            sum_nanos: AtomicU64::new(0),
        }
    }

    pub fn observe(&self, seconds: f64) {
        let bucket = self.bounds.iter().position(|&b| seconds <= b).unwrap_or(self.bounds.len());
        self.buckets[bucket].fetch_add(1, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_nanos.fetch_add((seconds.max(0.0) * 1e9) as u64, Ordering::Relaxed);
    }

    /// Writes the `_bucket`, `_sum` and `_count` series of `name` with extra `labels` (`k="v",...`).
    pub fn render(&self, out: &mut String, name: &str, labels: &str) {
        let sep = if labels.is_empty() { "" } else { "," };
        let mut cumulative = 0;
        for (i, bound) in self.bounds.iter().enumerate() {
            cumulative += self.buckets[i].load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"{bound}\"}} {cumulative}");
        }
        cumulative += self.buckets[self.bounds.len()].load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {cumulative}");
        let braces = if labels.is_empty() { String::new() } else { format!("{{{labels}}}") };
        let sum = self.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9;
        let _ = writeln!(out, "{name}_sum{braces} {sum}");
        let _ = writeln!(out, "{name}_count{braces} {}", self.count.load(Ordering::Relaxed));
    }
}

/// Writes the `# HELP` and `# TYPE` lines of a metric.
pub fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

pub fn inc(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histograms_are_cumulative() {
        let h = Histogram::seconds();
        h.observe(0.00005);
        h.observe(0.002);
        h.observe(1000.0);
        let mut out = String::new();
        h.render(&mut out, "x", "");
        assert!(out.contains("x_bucket{le=\"0.0001\"} 1\n"), "{out}");
        assert!(out.contains("x_bucket{le=\"0.005\"} 2\n"), "{out}");
        assert!(out.contains("x_bucket{le=\"600\"} 2\n"), "{out}");
        assert!(out.contains("x_bucket{le=\"+Inf\"} 3\n"), "{out}");
        assert!(out.contains("x_count 3\n"), "{out}");
    }
}
