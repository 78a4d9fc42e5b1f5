//! Usage reports: what projects used of VMs and cGPUs in a period (`GET /v1/usage`,
//! `GET /v1/usage/{project}`), in the spirit of Nova's `os-simple-tenant-usage`.
//!
//! Times are seconds with millisecond precision, each lifetime clipped to the period: a cGPU
//! that counted from before the period's start to after its end adds exactly the period's length.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// A period's usage, by project.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct UsageReport {
    /// The period's start, included (RFC 3339, UTC).
    pub start: String,
    /// The period's end, excluded (RFC 3339, UTC).
    pub end: String,
    pub start_ms: i64,
    pub end_ms: i64,
    /// Projects that used anything in the period, by id.
    pub projects: Vec<ProjectUsage>,
    /// Use over time, with `step`: per GPU model for one project, per project (the most using
    /// ones) for every project's report.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub series: Option<UsageSeries>,
}

/// What a project (or one of its VMs) used in the period.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
pub struct UsageTotals {
    /// Seconds VMs counted (while `creating` or `ready`).
    pub vm_seconds: f64,
    /// Seconds of cGPUs (while `live` on a VM that counts).
    pub cgpu_seconds: f64,
    /// GPU memory booked times seconds (an exclusive cGPU books its whole GPU's).
    pub gpu_memory_mib_seconds: f64,
    /// Seconds of cGPUs that held a whole GPU (mode `exclusive`).
    pub exclusive_gpu_seconds: f64,
    /// The part of `cgpu_seconds` on loan from the project's cohort: while the cGPU said
    /// `borrowed` (from its admission past the project's quota until the loan became the
    /// project's own). 0 from a gsaasd before cohorts.
    #[serde(default)]
    pub borrowed_cgpu_seconds: f64,
    /// The part of `gpu_memory_mib_seconds` on loan.
    #[serde(default)]
    pub borrowed_gpu_memory_mib_seconds: f64,
    /// The cGPU time by GPU model and mode.
    pub by_model: Vec<ModelUsage>,
}

/// cGPU time on one GPU model in one mode.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ModelUsage {
    pub model: String,
    /// `shared` or `exclusive`.
    pub mode: String,
    pub cgpu_seconds: f64,
    pub gpu_memory_mib_seconds: f64,
    /// The part of `cgpu_seconds` on loan from the project's cohort.
    #[serde(default)]
    pub borrowed_cgpu_seconds: f64,
    /// The part of `gpu_memory_mib_seconds` on loan.
    #[serde(default)]
    pub borrowed_gpu_memory_mib_seconds: f64,
}

/// A project's usage in the period.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ProjectUsage {
    pub project: String,
    #[serde(flatten)]
    pub usage: UsageTotals,
    /// Each VM's usage (`GET /v1/usage/{project}` only), purged VMs included.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vms: Option<Vec<VmUsage>>,
}

/// A VM's usage in the period.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct VmUsage {
    pub id: String,
    pub name: String,
    /// When it first counted in the period's lifetimes (may be before the period).
    pub started_ms: Option<i64>,
    /// When it stopped counting; `null` while it still counts.
    pub ended_ms: Option<i64>,
    #[serde(flatten)]
    pub usage: UsageTotals,
}

/// cGPU-seconds over time, a point per step from the period's start (the last step may be cut
/// short by the period's end).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct UsageSeries {
    pub step_seconds: u64,
    /// What a line is: `model` or `project`.
    pub by: String,
    pub lines: Vec<UsageLine>,
}

/// One model's or project's cGPU-seconds in each step.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct UsageLine {
    pub label: String,
    pub cgpu_seconds: Vec<f64>,
}
