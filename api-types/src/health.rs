//! Liveness and readiness, with what the reconciler's last pass did.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Health {
    pub status: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Readiness {
    pub status: String,
    pub database: String,
    pub reconciler: ReconcilerStatus,
}

/// What the last pass did.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
pub struct ReconcilerStatus {
    pub passes: u64,
    pub last_pass_ms: Option<i64>,
    /// The first error of the last pass, if any.
    pub last_error: Option<String>,
    pub hosts_marked_unavailable: usize,
    pub tables_pushed: usize,
    pub fences_released: usize,
    /// Keystone trusts of launches that no longer need them, deleted by the last pass after an
    /// earlier deletion failed.
    pub delegations_ended: usize,
    /// VMs whose servers the last pass found deleted or moved outside GSaaS.
    pub servers_deleted: u32,
    pub servers_moved: u32,
    /// cGPUs the last pass re-homed, left lost, and brought back.
    pub cgpus_rehomed: u32,
    pub cgpus_lost: u32,
    pub cgpus_recovered: u32,
    pub sagas_resumed: usize,
    /// Ended cGPU lifetimes the last pass added to the usage totals (`/metrics`' counters).
    #[serde(default)]
    pub usage_rolled_up: u64,
}

/// The API's versions, at the service's root (as OpenStack services list theirs).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ApiVersions {
    pub versions: Vec<ApiVersion>,
}

/// One version of the API.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ApiVersionDocument {
    pub version: ApiVersion,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ApiVersion {
    /// `v1`.
    pub id: String,
    /// `CURRENT`, `SUPPORTED` or `DEPRECATED`.
    pub status: String,
    pub links: Vec<Link>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Link {
    pub rel: String,
    pub href: String,
}
