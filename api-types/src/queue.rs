//! The queue: what waits for GPU capacity.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::vms::WaitingView;

/// `GET /v1/queue`: what waits for GPU capacity.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct QueueView {
    /// How many requests wait at each priority, in the whole queue (highest first).
    pub lengths: Vec<QueueLengthView>,
    /// The caller's project's requests (an admin's: every project's), in queue order.
    pub requests: Vec<QueuedRequestView>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct QueueLengthView {
    pub priority: i32,
    pub waiting: u64,
}

/// A request waiting in the queue, for one of the caller's VMs (admins: any).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct QueuedRequestView {
    /// The VM it is for.
    pub vm: String,
    pub vm_name: String,
    pub project: String,
    pub priority: i32,
    #[serde(flatten)]
    pub waiting: WaitingView,
}
