//! The policy file read again while gsaasd runs (`LivePolicy`): on a timer
//! (`auth.policy_reload_secs`) and on SIGHUP. A file with a problem keeps the rules in force;
//! each activation that finds it so fails with the problem, so admins see it in
//! `GET /v1/background-tasks` and `/metrics` counts it, and it is logged when first found.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use super::driver::{Failed, Report, Task, TaskName};
use crate::app::App;
use crate::config::Config;
use crate::error::{Error, ErrorChain};
use crate::policy::Reload;

/// The period when `auth.policy_reload_secs` is 0: SIGHUP only, in effect.
const SIGHUP_ONLY: Duration = Duration::from_secs(365 * 24 * 3600);

impl App {
    /// Reads the policy file again now (what SIGHUP does).
    pub fn trigger_policy_reload(&self) {
        self.tasks.trigger(TaskName::PolicyReload);
    }
}

#[derive(Debug)]
pub(crate) struct PolicyReload;

#[async_trait]
impl Task for PolicyReload {
    fn name(&self) -> TaskName {
        TaskName::PolicyReload
    }
    fn describe(&self) -> &'static str {
        "Reads the policy file again when it changed (and on SIGHUP); a file with a problem \
         keeps the rules in force."
    }
    fn period(&self, config: &Config) -> Duration {
        match config.auth.policy_reload_secs {
            0 => SIGHUP_ONLY,
            secs => Duration::from_secs(secs),
        }
    }
    async fn activate(&self, app: &Arc<App>) -> Result<Report, Failed> {
        match app.policy.reload() {
            Ok(Reload::Unchanged) => Ok(Report::default().with("reloaded", 0)),
            Ok(Reload::Applied) => {
                let file = app.policy.path().map(|p| p.display().to_string()).unwrap_or_default();
                tracing::info!(file, "policy file read again: its rules are in force");
                Ok(Report::default().with("reloaded", 1))
            }
            Err(kept) => {
                let problem = ErrorChain(&kept.problem).to_string();
                if kept.new {
                    tracing::error!(problem, "policy file not applied: the rules in force stay");
                }
                let error = Error::Malformed {
                    field: "auth.policy_file".into(),
                    reason: format!("{problem}; the rules in force stay as they were"),
                };
                Err(Failed { report: Report::default().with("reloaded", 0), error })
            }
        }
    }
}
