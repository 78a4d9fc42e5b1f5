//! Folding the usage log into spans ([`crate::db::Db::fold_usage`]): on a timer
//! ([`FOLD_EVERY`]), so the log stays short and `/metrics` lags the database by about that much,
//! and before every usage report and `/metrics` computation, so a report counts every change
//! committed before it was asked. Any replica may fold, at any time, as often as it likes: the
//! database folds each event once.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use super::driver::{Failed, Report, Task, TaskName};
use crate::app::App;
use crate::config::Config;
use crate::error::Error;
use crate::metrics::inc;

/// How often each replica folds the log. A second of 2,000 launch + terminate cycles is about
/// 7,000 events, folded in 30-50 ms on SQLite (BENCHMARKS.md); every 250 ms was no better.
pub const FOLD_EVERY: Duration = Duration::from_secs(1);

impl App {
    /// Folds every usage event logged so far; returns how many.
    pub async fn fold_usage(&self) -> Result<u64, Error> {
        match self.db.fold_usage().await {
            Ok(folded) => {
                self.metrics.usage_events_folded.fetch_add(folded, Ordering::Relaxed);
                Ok(folded)
            }
            Err(e) => {
                inc(&self.metrics.usage_fold_failures);
                Err(e.into())
            }
        }
    }
}

#[derive(Debug)]
pub(crate) struct UsageFold;

#[async_trait]
impl Task for UsageFold {
    fn name(&self) -> TaskName {
        TaskName::UsageFold
    }
    fn describe(&self) -> &'static str {
        "Folds the usage log into the spans usage reports read."
    }
    fn period(&self, _: &Config) -> Duration {
        FOLD_EVERY
    }
    fn at_start(&self) -> bool {
        false
    }
    async fn activate(&self, app: &Arc<App>) -> Result<Report, Failed> {
        let folded = app.fold_usage().await?;
        Ok(Report::default().with("events_folded", folded))
    }
}
