//! The reconciler: the tasks that converge whatever drifted, each on its own loop (see
//! [`super::driver`]), and their sum as one pass.
//!
//! None takes input or is told what changed; each looks at everything:
//! - [`super::host_liveness`]: hosts whose agents stopped heartbeating become unavailable for
//!   new cGPUs (and whether any host runs its GPUs' servers is read again);
//! - [`super::pool_refresh`]: this process's pool catches up with the database (a start loads it
//!   in its first pass);
//! - [`super::route_tables`]: every host whose agent does not hold the latest table gets it again;
//! - [`super::drift`]: VMs whose servers were deleted or moved outside GSaaS are terminated, or
//!   their routes follow them;
//! - [`super::rehome`]: with `hosts.auto_rehome`, the cGPUs of failed GPUs move to healthy ones,
//!   and lost cGPUs whose GPU works again go live;
//! - [`super::fences`]: fences whose host's agent confirmed their routes gone are released;
//! - [`super::usage_rollup`]: ended cGPU lifetimes are added to the usage totals;
//! - [`super::delegations`]: Keystone trusts that outlived their launch are deleted;
//! - [`super::saga_resumption`]: sagas with work left and no live owner (a crashed gsaasd) are
//!   resumed.
//!
//! A process's first pass runs them once each, in that order, before their loops start; later
//! each runs on `hosts.reconcile_interval_secs` and on trigger. The next activation is the retry.
//! [`App::reconcile_once`] runs a pass now (tests, benches); `/readyz` shows the tasks' sum.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

pub use gsaas_api_types::ReconcilerStatus;

use super::driver::{Report, TaskName};
use crate::app::App;
use crate::config::Config;
use crate::metrics::header;

/// The reconciler's tasks, in a pass's order.
pub const PASS: [TaskName; 9] = [
    TaskName::HostLiveness,
    TaskName::PoolRefresh,
    TaskName::RouteTables,
    TaskName::CloudDrift,
    TaskName::Rehome,
    TaskName::Fences,
    TaskName::UsageRollup,
    TaskName::Delegations,
    TaskName::SagaResumption,
];

/// How often each of the reconciler's tasks runs untriggered.
pub(crate) fn period(config: &Config) -> Duration {
    Duration::from_secs(config.hosts.reconcile_interval_secs.max(1))
}

impl App {
    /// Asks each of the reconciler's tasks for an activation as soon as possible.
    pub fn trigger_reconcile(&self) {
        PASS.into_iter().for_each(|task| self.tasks.trigger(task));
    }

    /// Runs each of the reconciler's tasks once, in order, and returns the pass's sum.
    /// Its counts are this pass's own, whatever the tasks' loops did meanwhile.
    pub async fn reconcile_once(self: &Arc<Self>) -> ReconcilerStatus {
        let (mut first_error, mut reports) = (None, Vec::new());
        for task in PASS {
            match self.tasks.activate(self, task).await {
                Some(Ok(report)) => reports.push(report),
                Some(Err(failed)) => {
                    first_error.get_or_insert(failed.error.to_string());
                    reports.push(failed.report);
                }
                None => {}
            }
        }
        ReconcilerStatus { last_error: first_error, ..summed(self.reconciler_status(), &reports) }
    }

    /// The reconciler's passes and its tasks' failures, as `/metrics` has long shown them.
    pub(crate) fn render_reconciler(&self, out: &mut String) {
        let failures: u64 =
            PASS.into_iter().filter_map(|t| self.tasks.last(t)).map(|t| t.failures).sum();
        for (name, help, value) in [
            (
                "gsaas_reconciler_runs_total",
                "Reconciler passes (each of its tasks activated once).",
                self.reconciler_status().passes,
            ),
            (
                "gsaas_reconciler_errors_total",
                "Failed activations of the reconciler's tasks.",
                failures,
            ),
        ] {
            header(out, name, "counter", help);
            let _ = writeln!(out, "{name} {value}");
        }
    }

    /// The reconciler's tasks summed: the passes all of them completed, when the oldest last
    /// activation started, the first error among their last activations and their last counts.
    pub fn reconciler_status(&self) -> ReconcilerStatus {
        let tasks: Vec<_> = PASS.into_iter().filter_map(|t| self.tasks.last(t)).collect();
        let status = ReconcilerStatus {
            passes: tasks.iter().map(|t| t.activations).min().unwrap_or(0),
            last_pass_ms: tasks.iter().map(|t| t.last_started_ms).min().flatten(),
            last_error: tasks.iter().find_map(|t| t.last_error.clone()),
            ..ReconcilerStatus::default()
        };
        let reports: Vec<Report> = tasks.into_iter().map(|t| t.report).collect();
        summed(status, &reports)
    }
}

/// `status` with the counts of `reports` (the reconciler's tasks', one each).
fn summed(status: ReconcilerStatus, reports: &[Report]) -> ReconcilerStatus {
    let count = |what: &str| reports.iter().map(|r| r.get(what)).sum::<u64>();
    let small = |what: &str| u32::try_from(count(what)).unwrap_or(u32::MAX);
    let many = |what: &str| usize::try_from(count(what)).unwrap_or(usize::MAX);
    ReconcilerStatus {
        hosts_marked_unavailable: many("hosts_marked_unavailable"),
        tables_pushed: many("tables_pushed"),
        fences_released: many("fences_released"),
        delegations_ended: many("delegations_ended"),
        servers_deleted: small("servers_deleted"),
        servers_moved: small("servers_moved"),
        cgpus_rehomed: small("cgpus_rehomed"),
        cgpus_lost: small("cgpus_lost"),
        cgpus_recovered: small("cgpus_recovered"),
        sagas_resumed: many("sagas_resumed"),
        usage_rolled_up: count("usage_rolled_up"),
        ..status
    }
}
