//! Background tasks as admins see them: each task of one gsaasd, how often it runs, and how its
//! last activation went.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// A background task of the gsaasd that answered (each replica runs its own).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct BackgroundTaskView {
    /// `route_tables`, `queue_rounds`, ...
    pub name: String,
    pub description: String,
    /// Between two activations when nothing triggers one.
    pub period_ms: u64,
    /// Whether an activation is running now.
    pub running: bool,
    pub activations: u64,
    pub failures: u64,
    /// When the last activation started (ms since the epoch).
    pub last_started_ms: Option<i64>,
    /// How long the last activation that ended took.
    pub last_duration_ms: Option<u64>,
    pub last_outcome: Option<TaskOutcome>,
    /// The last activation's error, when it failed.
    pub last_error: Option<String>,
    /// What the last activation did, in counts (`tables_pushed: 3`).
    pub last_report: BTreeMap<String, u64>,
}

/// How an activation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum TaskOutcome {
    Ok,
    Error,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct BackgroundTaskList {
    pub tasks: Vec<BackgroundTaskView>,
}
