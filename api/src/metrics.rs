//! Metrics for `/metrics`, in the Prometheus text format (0.0.4).
//!
//! Plain atomics and fixed-bucket histograms (shared with the agents, `gsaas_infra::metrics`),
//! and an exposition written here rather than by the `prometheus-client` crate, for a measured
//! reason: that crate writes only OpenMetrics text, whose counter families are named without
//! `_total` (`# TYPE gsaas_launches counter` over `gsaas_launches_total` samples) and end with
//! `# EOF`, and `promtool check metrics` (Prometheus 2.42, Debian 12), which reads the Prometheus
//! text format, refuses exactly that shape: a counter and histogram in that form exit 3 with
//! "gsaas_launches_total no help text". This exposition passes it (api/tests/metrics.rs runs
//! promtool on it), and every Prometheus reads it.
//!
//! Gauges (pool use, VMs by state) are read from the pool and the database, so they cannot
//! drift; that takes the pool's lock and a count over the VMs, so the [`GaugeCache`] does it at
//! most once per `metrics.gauge_refresh_ms`, however many scrape.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use gsaas_infra::metrics::{header, inc, Histogram};

use gsaas_api_types::LAUNCH_STAGES;

use crate::model::{AlertKind, Timings};

#[derive(Debug)]
pub struct Metrics {
    pub launches_accepted: AtomicU64,
    pub launches_refused: AtomicU64,
    pub launches_ready: AtomicU64,
    pub launches_failed: AtomicU64,
    pub terminations: AtomicU64,
    pub terminations_done: AtomicU64,
    pub route_pushes: AtomicU64,
    pub route_push_failures: AtomicU64,
    /// Per Equation 5.1 stage of launches that became ready, in [`Timings::names`] order.
    pub stage_seconds: [Histogram; LAUNCH_STAGES.len() + 1],
    /// Time GPGPUMS took to place a request's cGPUs.
    pub decision_seconds: Histogram,
    /// How long queued launches waited before they started.
    pub queue_wait_seconds: Histogram,
    /// Attaches and detaches of cGPUs on running VMs, by outcome, and their latencies.
    pub elastic: ElasticMetrics,
    /// Host alerts recorded, in [`AlertKind::ALL`] order.
    host_alerts: [AtomicU64; AlertKind::ALL.len()],
    /// Notifications the broker confirmed, and passes that stopped on a broker failure.
    pub notifications_published: AtomicU64,
    pub notification_failures: AtomicU64,
    /// Usage events this process folded into spans, and folds that failed.
    pub usage_events_folded: AtomicU64,
    pub usage_fold_failures: AtomicU64,
}

/// One counter per outcome of attaches and of detaches, and a latency histogram of each.
#[derive(Debug)]
pub struct ElasticMetrics {
    pub attaches_accepted: AtomicU64,
    pub attaches_refused: AtomicU64,
    /// Accepted into the queue, to start when capacity frees.
    pub attaches_queued: AtomicU64,
    pub attaches_done: AtomicU64,
    pub attaches_failed: AtomicU64,
    pub detaches_accepted: AtomicU64,
    pub detaches_refused: AtomicU64,
    pub detaches_done: AtomicU64,
    /// From the request's write to the new routes applied.
    pub attach_seconds: Histogram,
    /// From the request's write to the booking released (its route withdrawn before).
    pub detach_seconds: Histogram,
}

impl Default for ElasticMetrics {
    fn default() -> Self {
        ElasticMetrics {
            attaches_accepted: AtomicU64::new(0),
            attaches_refused: AtomicU64::new(0),
            attaches_queued: AtomicU64::new(0),
            attaches_done: AtomicU64::new(0),
            attaches_failed: AtomicU64::new(0),
            detaches_accepted: AtomicU64::new(0),
            detaches_refused: AtomicU64::new(0),
            detaches_done: AtomicU64::new(0),
            attach_seconds: Histogram::seconds(),
            detach_seconds: Histogram::seconds(),
        }
    }
}

impl ElasticMetrics {
    fn render(&self, out: &mut String) {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        for (name, help, outcomes) in [
            (
                "gsaas_cgpu_attaches_total",
                "Attaches of cGPUs to running VMs, by outcome.",
                [
                    ("accepted", &self.attaches_accepted),
                    ("refused", &self.attaches_refused),
                    ("queued", &self.attaches_queued),
                    ("attached", &self.attaches_done),
                    ("failed", &self.attaches_failed),
                ]
                .as_slice(),
            ),
            (
                "gsaas_cgpu_detaches_total",
                "Detaches of cGPUs from running VMs, by outcome.",
                [
                    ("accepted", &self.detaches_accepted),
                    ("refused", &self.detaches_refused),
                    ("detached", &self.detaches_done),
                ]
                .as_slice(),
            ),
        ] {
            header(out, name, "counter", help);
            for (outcome, c) in outcomes {
                let _ = writeln!(out, "{name}{{outcome=\"{outcome}\"}} {}", get(c));
            }
        }
        for (name, help, histogram) in [
            (
                "gsaas_cgpu_attach_seconds",
                "Seconds from an attach request to its routes applied.",
                &self.attach_seconds,
            ),
            (
                "gsaas_cgpu_detach_seconds",
                "Seconds from a detach request to its booking released, its route withdrawn.",
                &self.detach_seconds,
            ),
        ] {
            header(out, name, "histogram", help);
            histogram.render(out, name, "");
        }
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            launches_accepted: AtomicU64::new(0),
            launches_refused: AtomicU64::new(0),
            launches_ready: AtomicU64::new(0),
            launches_failed: AtomicU64::new(0),
            terminations: AtomicU64::new(0),
            terminations_done: AtomicU64::new(0),
            route_pushes: AtomicU64::new(0),
            route_push_failures: AtomicU64::new(0),
            stage_seconds: std::array::from_fn(|_| Histogram::seconds()),
            decision_seconds: Histogram::seconds(),
            queue_wait_seconds: Histogram::seconds(),
            elastic: ElasticMetrics::default(),
            host_alerts: std::array::from_fn(|_| AtomicU64::new(0)),
            notifications_published: AtomicU64::new(0),
            notification_failures: AtomicU64::new(0),
            usage_events_folded: AtomicU64::new(0),
            usage_fold_failures: AtomicU64::new(0),
        }
    }
}

impl Metrics {
    pub fn count_host_alert(&self, kind: AlertKind) {
        let i = AlertKind::ALL.iter().position(|&k| k == kind).expect("every kind is listed");
        inc(&self.host_alerts[i]);
    }

    /// Records the stage timings of a launch that became ready.
    pub fn observe_launch(&self, timings: &Timings) {
        for (histogram, stage) in self.stage_seconds.iter().zip(Timings::names()) {
            if let Some(seconds) = timings.of(stage) {
                histogram.observe(seconds);
            }
        }
    }

    /// Writes the counters and histograms in the Prometheus text format.
    pub fn render(&self, out: &mut String) {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        header(out, "gsaas_launches_total", "counter", "Launch requests by outcome.");
        for (outcome, c) in [
            ("accepted", &self.launches_accepted),
            ("refused", &self.launches_refused),
            ("ready", &self.launches_ready),
            ("failed", &self.launches_failed),
        ] {
            let _ = writeln!(out, "gsaas_launches_total{{outcome=\"{outcome}\"}} {}", get(c));
        }
        header(out, "gsaas_terminations_total", "counter", "Terminations by outcome.");
        for (outcome, c) in [("accepted", &self.terminations), ("deleted", &self.terminations_done)]
        {
            let _ = writeln!(out, "gsaas_terminations_total{{outcome=\"{outcome}\"}} {}", get(c));
        }
        for (name, help, c) in [
            ("gsaas_route_pushes_total", "Route tables pushed to host agents.", &self.route_pushes),
            (
                "gsaas_route_push_failures_total",
                "Route table pushes that failed.",
                &self.route_push_failures,
            ),
            (
                "gsaas_notifications_published_total",
                "Notifications this process published that the broker confirmed.",
                &self.notifications_published,
            ),
            (
                "gsaas_notification_failures_total",
                "Publishing passes of this process that stopped on a broker failure.",
                &self.notification_failures,
            ),
            (
                "gsaas_usage_events_folded_total",
                "Usage events this process folded into the usage spans.",
                &self.usage_events_folded,
            ),
            (
                "gsaas_usage_fold_failures_total",
                "Folds of the usage log by this process that failed.",
                &self.usage_fold_failures,
            ),
        ] {
            header(out, name, "counter", help);
            let _ = writeln!(out, "{name} {}", get(c));
        }
        header(
            out,
            "gsaas_launch_stage_seconds",
            "histogram",
            "Seconds per stage (dissertation Equation 5.1) of launches that became ready.",
        );
        for (stage, histogram) in Timings::names().zip(&self.stage_seconds) {
            histogram.render(out, "gsaas_launch_stage_seconds", &format!("stage=\"{stage}\""));
        }
        header(
            out,
            "gsaas_policy_decision_seconds",
            "histogram",
            "Seconds GPGPUMS took to place a request.",
        );
        self.decision_seconds.render(out, "gsaas_policy_decision_seconds", "");
        header(
            out,
            "gsaas_queue_wait_seconds",
            "histogram",
            "Seconds queued launches waited before they started.",
        );
        self.queue_wait_seconds.render(out, "gsaas_queue_wait_seconds", "");
        self.elastic.render(out);
        header(
            out,
            "gsaas_host_alerts_total",
            "counter",
            "Host alerts (an agent's refused claim or refusal, fences it never confirmed), by kind.",
        );
        for (kind, c) in AlertKind::ALL.iter().zip(&self.host_alerts) {
            let _ =
                writeln!(out, "gsaas_host_alerts_total{{kind=\"{}\"}} {}", kind.as_str(), get(c));
        }
    }
}

/// Per-GPU and per-host gauges from the pool, in the Prometheus text format.
pub fn render_pool(pool: &gpgpums::Pool) -> String {
    let mut out = String::new();
    for (name, help) in [
        ("gsaas_gpu_memory_mib", "GPU memory, by GPU."),
        ("gsaas_gpu_allocated_mib", "GPU memory booked by cGPUs, by GPU."),
        ("gsaas_gpu_cgpus", "cGPUs, by GPU."),
        ("gsaas_gpu_healthy", "1 when the GPU's host reports it healthy."),
        ("gsaas_gpu_tainted", "1 when an admin (or a refused route) tainted the GPU."),
    ] {
        header(&mut out, name, "gauge", help);
    }
    let gpus = pool.gpu_usage();
    for g in &gpus {
        let labels = format!("gpu=\"{}\",host=\"{}\"", g.id, g.host);
        let _ = writeln!(out, "gsaas_gpu_memory_mib{{{labels}}} {}", g.memory_mib);
        let _ = writeln!(out, "gsaas_gpu_allocated_mib{{{labels}}} {}", g.allocated_mib);
        let _ = writeln!(out, "gsaas_gpu_cgpus{{{labels}}} {}", g.cgpus);
        let _ = writeln!(out, "gsaas_gpu_healthy{{{labels}}} {}", u8::from(g.health.is_none()));
        let _ = writeln!(out, "gsaas_gpu_tainted{{{labels}}} {}", u8::from(g.taint.is_some()));
    }
    render_models(&mut out, &gpus);
    for (name, help) in [
        ("gsaas_host_memory_mib", "GPU memory, by host."),
        ("gsaas_host_allocated_mib", "GPU memory booked by cGPUs, by host."),
        ("gsaas_host_vms", "VMs with cGPUs on the host's GPUs."),
        ("gsaas_host_cgpus", "cGPUs on the host's GPUs."),
        ("gsaas_host_schedulable", "1 when the host takes new cGPUs."),
    ] {
        header(&mut out, name, "gauge", help);
    }
    let mut host_cgpus: HashMap<&gpgpums::HostId, u32> = HashMap::new();
    for g in &gpus {
        *host_cgpus.entry(&g.host).or_default() += g.cgpus;
    }
    for h in pool.host_usage() {
        let labels = format!("host=\"{}\",kind=\"{}\"", h.id, h.kind);
        let schedulable = u8::from(h.state == gpgpums::HostState::Schedulable);
        let _ = writeln!(out, "gsaas_host_memory_mib{{{labels}}} {}", h.memory_mib);
        let _ = writeln!(out, "gsaas_host_allocated_mib{{{labels}}} {}", h.allocated_mib);
        let _ = writeln!(out, "gsaas_host_vms{{{labels}}} {}", h.vms);
        let cgpus = host_cgpus.get(&h.id).copied().unwrap_or(0);
        let _ = writeln!(out, "gsaas_host_cgpus{{{labels}}} {cgpus}");
        let _ = writeln!(out, "gsaas_host_schedulable{{{labels}}} {schedulable}");
    }
    render_fragmentation(&mut out, pool.fragmentation());
    out
}

/// How fragmented the pool is, as FGD measures it (`gpgpums::pool::fragmentation`): the free
/// capacity, in GPUs, that no cGPU of the mix the pool holds could use, beside all that is free.
fn render_fragmentation(out: &mut String, measured: gpgpums::Fragmentation) {
    for (name, help, value) in [
        (
            "gsaas_gpu_fragmented_gpus",
            "Free GPU capacity, in GPUs, too small for the cGPUs the pool holds (FGD's \
             fragmentation, weighted by how common each kind of cGPU is).",
            measured.fragmented_gpus,
        ),
        (
            "gsaas_gpu_free_gpus",
            "Free GPU capacity, in GPUs, of the GPUs that take new cGPUs.",
            measured.free_gpus,
        ),
    ] {
        header(out, name, "gauge", help);
        let _ = writeln!(out, "{name} {value:.4}");
    }
}

/// The pool by GPU model: what a fleet of several generations is asked for and has left. A
/// partition (a MIG instance) is a GPU of its model (`A100 MIG 3g.40gb`).
fn render_models(out: &mut String, gpus: &[gpgpums::GpuUsage]) {
    #[derive(Default)]
    struct Sums {
        gpus: u64,
        memory: u64,
        allocated: u64,
        cgpus: u64,
        idle: u64,
    }
    let mut by_model: BTreeMap<&str, Sums> = Default::default();
    // A partitioned GPU counts through its partitions (each of its model), as in the totals.
    for g in gpus.iter().filter(|g| g.partitions == 0) {
        let sums = by_model.entry(g.model.as_str()).or_default();
        sums.gpus += 1;
        sums.memory += g.memory_mib;
        sums.allocated += g.allocated_mib;
        sums.cgpus += u64::from(g.cgpus);
        sums.idle += u64::from(g.cgpus == 0 && g.taint.is_none() && g.health.is_none());
    }
    type Series = (&'static str, &'static str, fn(&Sums) -> u64);
    let series: [Series; 5] = [
        ("gsaas_model_gpus", "GPUs, by model.", |s| s.gpus),
        ("gsaas_model_memory_mib", "GPU memory, by model.", |s| s.memory),
        ("gsaas_model_allocated_mib", "GPU memory booked by cGPUs, by model.", |s| s.allocated),
        ("gsaas_model_cgpus", "cGPUs, by model.", |s| s.cgpus),
        (
            "gsaas_model_idle_gpus",
            "GPUs without cGPUs that take new ones (healthy, untainted), by model.",
            |s| s.idle,
        ),
    ];
    for (name, help, value) in series {
        header(out, name, "gauge", help);
        for (model, sums) in &by_model {
            let _ = writeln!(out, "{name}{{model=\"{}\"}} {}", label_value(model), value(sums));
        }
    }
}

/// `text` as a Prometheus label value: backslash, double quote and line feed escaped.
fn label_value(text: &str) -> String {
    text.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// cGPU bookings held by fences, by GPU (see `app::fences`).
pub fn render_fenced(fenced: &BTreeMap<gpgpums::GpuId, u32>) -> String {
    let mut out = String::new();
    let help = "cGPU bookings fences hold on the GPU (routes not yet confirmed gone).";
    header(&mut out, "gsaas_gpu_fenced_cgpus", "gauge", help);
    for (gpu, n) in fenced {
        let _ = writeln!(out, "gsaas_gpu_fenced_cgpus{{gpu=\"{gpu}\"}} {n}");
    }
    out
}

/// Notifications waiting in the outbox (the database's: every replica's).
pub fn render_notifications_waiting(waiting: i64) -> String {
    let mut out = String::new();
    let help = "Notifications written and not yet confirmed by the broker.";
    header(&mut out, "gsaas_notifications_waiting", "gauge", help);
    let _ = writeln!(out, "gsaas_notifications_waiting {waiting}");
    out
}

/// VMs by state, from the database's counts.
pub fn render_vm_states(counts: &[(String, i64)]) -> String {
    let mut out = String::new();
    header(&mut out, "gsaas_vms", "gauge", "VMs by state.");
    for state in ["queued", "creating", "ready", "error", "deleting", "deleted"] {
        let count = counts.iter().find(|(s, _)| s == state).map_or(0, |(_, c)| *c);
        let _ = writeln!(out, "gsaas_vms{{state=\"{state}\"}} {count}");
    }
    out
}

/// Launches waiting in the queue, by priority.
pub fn render_queue(lengths: &[(i64, i64)]) -> String {
    let mut out = String::new();
    header(&mut out, "gsaas_queue_length", "gauge", "Launches waiting for capacity, by priority.");
    for (priority, count) in lengths {
        let _ = writeln!(out, "gsaas_queue_length{{priority=\"{priority}\"}} {count}");
    }
    out
}

/// Each project's quota limits and use, by resource: `gsaas_quota_limit` (none for a resource
/// without a limit) and `gsaas_quota_usage`, for every project that has limits of its own, holds
/// cGPUs, or has VMs (`vms`: those being created or ready, by project); and per GPU model,
/// `gsaas_quota_model_limit` for each model limited and `gsaas_quota_model_usage` for each held or
/// limited.
pub fn render_quotas(
    quotas: &gpgpums::QuotaLedger,
    vms: &HashMap<gpgpums::ProjectId, u64>,
) -> String {
    let mut out = String::new();
    header(&mut out, "gsaas_quota_limit", "gauge", "Quota limits, by project and resource.");
    header(&mut out, "gsaas_quota_usage", "gauge", "Quota use, by project and resource.");
    let (model_limit, model_usage) = ("gsaas_quota_model_limit", "gsaas_quota_model_usage");
    header(&mut out, model_limit, "gauge", "Quota limits per GPU model, by project and resource.");
    header(&mut out, model_usage, "gauge", "Quota use per GPU model, by project and resource.");
    let mut projects: Vec<&gpgpums::ProjectId> = quotas.projects().chain(vms.keys()).collect();
    projects.sort();
    projects.dedup();
    for project in projects {
        let (limits, _) = quotas.limits(project);
        let usage =
            gpgpums::Usage { vms: vms.get(project).copied().unwrap_or(0), ..quotas.usage(project) };
        for resource in gpgpums::Resource::ALL {
            let labels = format!("project=\"{project}\",resource=\"{resource}\"");
            if let Some(limit) = limits.get(resource) {
                let _ = writeln!(out, "gsaas_quota_limit{{{labels}}} {limit}");
            }
            let _ = writeln!(out, "gsaas_quota_usage{{{labels}}} {}", usage.get(resource));
        }
        let held: BTreeMap<&str, gpgpums::Usage> = quotas.model_usage(project).collect();
        let mut models: Vec<&str> = held.keys().copied().collect();
        models.extend(limits.models.keys().map(String::as_str));
        models.sort_unstable();
        models.dedup();
        for model in models {
            let limits = limits.models.get(model).copied().unwrap_or_default();
            let usage = held.get(model).copied().unwrap_or_default();
            let model = label_value(model);
            for resource in
                gpgpums::Resource::ALL.into_iter().filter(|r| *r != gpgpums::Resource::Vms)
            {
                let labels =
                    format!("project=\"{project}\",model=\"{model}\",resource=\"{resource}\"");
                if let Some(limit) = limits.get(resource) {
                    let _ = writeln!(out, "{model_limit}{{{labels}}} {limit}");
                }
                let _ = writeln!(out, "{model_usage}{{{labels}}} {}", usage.get(resource));
            }
        }
    }
    out
}

/// The usage counters (`gsaas_cgpu_seconds_total`, `gsaas_gpu_memory_mib_seconds_total`, by
/// project, model and mode): every cGPU's time since usage was recorded, read from the database
/// (`db::usage_totals`), so every replica shows the cloud's totals, and a restart or failover
/// loses nothing. A rating system takes them from one replica, or `max` over replicas: summing
/// replicas would count each second once per replica.
///
/// Read twice, a total may come out a few milliseconds lower (a span still counting was read up
/// to this replica's clock, then ended by the database's): each counter is shown as the highest
/// value this process has shown, so it never goes back, which Prometheus would take for a reset.
#[derive(Debug, Default)]
pub struct UsageCounters {
    /// The values shown last: cGPU-seconds and memory MiB-seconds.
    shown: std::sync::Mutex<HashMap<UsageLabels, (f64, f64)>>,
}

/// A usage counter's labels: project, GPU model, mode.
pub type UsageLabels = (String, String, String);

impl UsageCounters {
    /// The counters for `totals` ((project, model, mode), cGPU-ms, memory MiB-ms).
    pub fn render(&self, totals: &[(UsageLabels, i64, f64)]) -> String {
        let mut out = String::new();
        let (cgpu, memory) = ("gsaas_cgpu_seconds_total", "gsaas_gpu_memory_mib_seconds_total");
        header(&mut out, cgpu, "counter", "cGPU-seconds used, by project, GPU model and mode.");
        let help = "GPU memory booked times seconds (MiB*s), by project, GPU model and mode.";
        let mut memory_lines = String::new();
        header(&mut memory_lines, memory, "counter", help);
        let mut shown = self.shown.lock().unwrap_or_else(|e| e.into_inner());
        for (key, cgpu_ms, memory_mib_ms) in totals {
            let seen = shown.entry(key.clone()).or_insert((0.0, 0.0));
            seen.0 = seen.0.max(*cgpu_ms as f64 / 1000.0);
            seen.1 = seen.1.max((memory_mib_ms / 1000.0).floor());
            let (project, model, mode) = key;
            let labels = format!(
                "project=\"{}\",model=\"{}\",mode=\"{}\"",
                label_value(project),
                label_value(model),
                label_value(mode)
            );
            let _ = writeln!(out, "{cgpu}{{{labels}}} {}", seen.0);
            let _ = writeln!(memory_lines, "{memory}{{{labels}}} {}", seen.1);
        }
        out.push_str(&memory_lines);
        out
    }
}

/// The last gauges computed, and when. See the module docs.
#[derive(Debug, Default)]
pub struct GaugeCache {
    last: tokio::sync::Mutex<Option<(Instant, Arc<str>)>>,
}

impl GaugeCache {
    /// The gauges, computed by `compute` unless the last ones are younger than `max_age`.
    /// Scrapers that arrive while they are computed wait for that one computation.
    pub async fn get<E, F: Future<Output = Result<String, E>>>(
        &self,
        max_age: Duration,
        compute: impl FnOnce() -> F,
    ) -> Result<Arc<str>, E> {
        let mut last = self.last.lock().await;
        if let Some((at, gauges)) = last.as_ref() {
            if at.elapsed() < max_age {
                return Ok(gauges.clone());
            }
        }
        let gauges: Arc<str> = compute().await?.into();
        *last = Some((Instant::now(), gauges.clone()));
        Ok(gauges)
    }
}
