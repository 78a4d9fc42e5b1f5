//! Background work: one task per file, each a type implementing [`driver::Task`], all run by
//! [`driver::Driver`] on a timer and on trigger. Each is idempotent (it takes no input and looks
//! at everything, so running it twice or on several replicas at once is harmless) and reports
//! what it did (`GET /v1/background-tasks`, `/metrics`).
//!
//! - [`reconciler`]: the tasks that converge whatever drifted, and their sum as one pass:
//!   [`host_liveness`], [`pool_refresh`], [`route_tables`], [`drift`] (VMs whose servers were
//!   deleted or moved outside GSaaS), [`rehome`] (cGPUs moved off failed GPUs, and on an admin's
//!   request off evacuated ones), [`fences`], [`usage_rollup`], [`delegations`],
//!   [`saga_resumption`].
//! - [`queue_rounds`]: the queue's rounds, which start what waits when capacity frees.
//! - [`revocations`]: revoked token ids reloaded on every replica.
//! - [`usage_fold`]: the usage log folded into the spans reports read.
//! - [`policy_reload`]: the policy file read again when it changes, and on SIGHUP.
//! - [`loan_marks`]: the loan mark taken off cGPUs whose project is back within its quota.
//! - [`notifications`]: the notifications' outbox published to RabbitMQ (one replica at a time).

pub mod delegations;
pub mod drift;
pub mod driver;
pub mod fences;
pub mod host_liveness;
pub mod loan_marks;
pub mod notifications;
pub mod policy_reload;
pub mod pool_refresh;
pub mod queue_rounds;
pub mod reconciler;
pub mod rehome;
pub mod revocations;
pub mod route_tables;
pub mod saga_resumption;
pub mod usage_fold;
pub mod usage_rollup;

use driver::Task;

/// Every task this process runs: the reconciler's in a pass's order, then the others; the
/// notifications' only with a broker to publish to.
pub(crate) fn tasks(with_broker: bool) -> Vec<Box<dyn Task>> {
    let mut tasks: Vec<Box<dyn Task>> = vec![
        Box::new(host_liveness::HostLiveness),
        Box::new(pool_refresh::PoolRefresh),
        Box::new(route_tables::RouteTables),
        Box::new(drift::CloudDrift),
        Box::new(rehome::RehomeFailed),
        Box::new(fences::Fences),
        Box::new(usage_rollup::UsageRollup),
        Box::new(delegations::Delegations),
        Box::new(saga_resumption::SagaResumption),
        Box::new(queue_rounds::QueueRounds),
        Box::new(revocations::Revocations),
        Box::new(usage_fold::UsageFold),
        Box::new(policy_reload::PolicyReload),
        Box::new(loan_marks::LoanMarks),
    ];
    if with_broker {
        tasks.push(Box::new(notifications::Notifications));
    }
    tasks
}
