//! Project quotas through the API: a project's limits and what it uses, and operators setting
//! them (the decisions are [`gpgpums::quota`]'s, made where bookings are: [`super::bookings`]).
//!
//! Limits change in a pool transaction, like bookings: the generation moves, so every replica
//! reloads its ledger before its next booking and no replica books against old limits.

use gpgpums::{ProjectId, Quota, QuotaLedger, Usage};

use super::App;
use crate::auth::Caller;
use crate::config::check_quota;
use crate::db::now_ms;
use crate::error::Error;
use crate::policy::{actions, Action, LivePolicy, Target};

/// A project's limits and use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuotaStatus {
    pub project: ProjectId,
    pub limits: Quota,
    /// Whether the limits are the project's own rather than the defaults.
    pub own: bool,
    pub usage: Usage,
    /// What it holds of each GPU model, in name order.
    pub model_usage: Vec<(String, Usage)>,
    /// The cohort it is in, if any.
    pub cohort: Option<gpgpums::CohortName>,
    /// What it holds past its limits, borrowed from its cohort.
    pub borrowed: Usage,
}

/// The project a caller names, if the policy lets it `action` on the project (quota or usage
/// show: by default admins any, a tenant its own).
pub(super) fn visible_project(
    policy: &LivePolicy,
    caller: &Caller,
    project: &str,
    action: Action,
) -> Result<ProjectId, Error> {
    let not_found = || Error::NotFound { kind: "project", id: project.to_owned() };
    match policy.authorize(action, caller, Target::Project(project)) {
        Ok(()) => ProjectId::new(project).map_err(|_| not_found()),
        Err(Error::NotFound { .. }) => Err(not_found()),
        Err(e) => Err(e),
    }
}

/// The project's limits and what it holds as the ledger knows them (VMs are counted apart).
fn status(quotas: &QuotaLedger, project: ProjectId) -> QuotaStatus {
    let (limits, own) = quotas.limits(&project);
    let usage = quotas.usage(&project);
    let model_usage = quotas.model_usage(&project).map(|(m, u)| (m.to_owned(), u)).collect();
    let cohort = quotas.cohort_of(&project).map(|(name, _)| name.clone());
    let borrowed = quotas.borrowed(&project);
    QuotaStatus { project, limits, own, usage, model_usage, cohort, borrowed }
}

impl App {
    /// The project's limits and what it uses (its VMs being created or ready, and their cGPUs).
    pub async fn quota(&self, caller: &Caller, project: &str) -> Result<QuotaStatus, Error> {
        let project = visible_project(&self.policy, caller, project, actions::QUOTA_SHOW)?;
        let mut status = self.read_pool_and_quotas(|_, quotas| status(quotas, project)).await?;
        let vms = self.db.counted_vms(Some(&[&status.project])).await?;
        status.usage.vms = vms.get(&status.project).copied().unwrap_or(0);
        Ok(status)
    }

    /// The quotas a caller may see: a tenant's own project's; for admins, every project that has
    /// limits of its own or holds cGPUs.
    pub async fn quotas(&self, caller: &Caller) -> Result<Vec<QuotaStatus>, Error> {
        let own = self
            .policy
            .list_scope(caller, actions::QUOTA_SHOW, actions::QUOTA_LIST_ALL)?
            .map(str::to_owned);
        let mut statuses: Vec<QuotaStatus> = self
            .read_pool_and_quotas(|_, quotas| {
                let projects: Vec<ProjectId> = match &own {
                    Some(own) => ProjectId::new(own).into_iter().collect(),
                    None => quotas.projects().cloned().collect(),
                };
                projects.into_iter().map(|project| status(quotas, project)).collect()
            })
            .await?;
        let projects: Vec<&ProjectId> = statuses.iter().map(|s| &s.project).collect();
        let vms = self.db.counted_vms(Some(&projects)).await?;
        for status in &mut statuses {
            status.usage.vms = vms.get(&status.project).copied().unwrap_or(0);
        }
        Ok(statuses)
    }

    /// Sets the project's own limits, or (`None`) gives it the defaults again (admins). What the
    /// project holds stays; a limit below it only refuses more.
    pub async fn set_quota(
        &self,
        caller: &Caller,
        project: &str,
        quota: Option<Quota>,
    ) -> Result<QuotaStatus, Error> {
        self.policy.authorize(actions::QUOTA_SET, caller, Target::Service)?;
        let project =
            ProjectId::new(project).map_err(|e| Error::invalid("project", e.to_string()))?;
        if let Some(quota) = &quota {
            check_quota(quota, "").map_err(|(field, reason)| Error::invalid(field, reason))?;
            let highest = self.config.queue.max_priority;
            if quota.max_priority.is_some_and(|p| i64::from(p) > i64::from(highest)) {
                return Err(Error::invalid(
                    "max_priority",
                    format!("must be between 0 and queue.max_priority ({highest})"),
                ));
            }
        }
        let mut pool_tx = self.pool_tx().await?;
        let (_, quotas, tx) = pool_tx.parts_with_quotas();
        tx.set_quota(&project, quota.as_ref(), now_ms()).await?;
        quotas.set_limits(project.clone(), quota);
        pool_tx.commit().await?;
        // Raised limits may let queued launches start.
        self.trigger_queue();
        self.quota(caller, project.as_str()).await
    }
}
