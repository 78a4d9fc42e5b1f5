//! `GET`, `PUT` and `DELETE /v1/quotas/{project}`: a project's quota limits and use (see
//! [`crate::app::quotas`]).

use axum::extract::{Path, State};
use axum::Json;
use gpgpums::Quota;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::{AppState, Unparsed};
use crate::app::quotas::QuotaStatus;
use crate::auth::Caller;
use crate::error::{Error, Problem};

/// Limits per resource; `null` (or absent) is no limit.
#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct QuotaLimits {
    /// cGPUs held at once.
    #[serde(default)]
    pub cgpus: Option<u64>,
    /// GPU memory booked at once, MiB (an exclusive cGPU books its whole GPU).
    #[serde(default)]
    pub memory_mib: Option<u64>,
    /// Whole GPUs held exclusively at once.
    #[serde(default)]
    pub exclusive_gpus: Option<u64>,
    /// VMs being created or ready.
    #[serde(default)]
    pub vms: Option<u64>,
    /// The highest `priority` the project's launches may ask for (0 to the service's
    /// `queue.max_priority`). Unlike the others, `null` (or absent) in a `PUT` is the service's
    /// default (`quotas.max_priority`, 0 unless configured); a view always shows the number.
    #[serde(default)]
    pub max_priority: Option<u32>,
}

impl From<QuotaLimits> for Quota {
    fn from(l: QuotaLimits) -> Quota {
        Quota {
            cgpus: l.cgpus,
            memory_mib: l.memory_mib,
            exclusive_gpus: l.exclusive_gpus,
            vms: l.vms,
            max_priority: l.max_priority,
        }
    }
}

impl From<Quota> for QuotaLimits {
    fn from(q: Quota) -> QuotaLimits {
        QuotaLimits {
            cgpus: q.cgpus,
            memory_mib: q.memory_mib,
            exclusive_gpus: q.exclusive_gpus,
            vms: q.vms,
            max_priority: q.max_priority,
        }
    }
}

/// What a project uses of each resource.
#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
pub struct QuotaUsage {
    pub cgpus: u64,
    pub memory_mib: u64,
    pub exclusive_gpus: u64,
    pub vms: u64,
}

/// A project's quota: its limits and what it uses.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct QuotaView {
    pub project: String,
    pub limits: QuotaLimits,
    /// `true`: the project's own limits; `false`: the service's defaults.
    pub own_limits: bool,
    pub usage: QuotaUsage,
}

impl From<QuotaStatus> for QuotaView {
    fn from(s: QuotaStatus) -> QuotaView {
        let u = s.usage;
        QuotaView {
            project: s.project.to_string(),
            limits: s.limits.into(),
            own_limits: s.own,
            usage: QuotaUsage {
                cgpus: u.cgpus,
                memory_mib: u.memory_mib,
                exclusive_gpus: u.exclusive_gpus,
                vms: u.vms,
            },
        }
    }
}

/// Quotas as a list.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct QuotaList {
    pub quotas: Vec<QuotaView>,
}

/// The caller's project's quota (tenants), or every project's with limits of its own or cGPUs
/// held (admins).
#[utoipa::path(get, path = "/v1/quotas", tag = "quotas",
    responses((status = 200, body = QuotaList)),
    security(("bearer" = [])))]
pub(super) async fn list_quotas(
    State(app): State<AppState>,
    caller: Caller,
) -> Result<Json<QuotaList>, Error> {
    let quotas = app.quotas(&caller).await?;
    Ok(Json(QuotaList { quotas: quotas.into_iter().map(QuotaView::from).collect() }))
}

/// A project's quota limits and use (admins: any project; tenants: their own).
#[utoipa::path(get, path = "/v1/quotas/{project}", tag = "quotas",
    params(("project" = String, Path, description = "The project's id")),
    responses((status = 200, body = QuotaView),
        (status = 404, description = "No such project, or not the caller's", body = Problem)),
    security(("bearer" = [])))]
pub(super) async fn get_quota(
    State(app): State<AppState>,
    caller: Caller,
    Path(project): Path<String>,
) -> Result<Json<QuotaView>, Error> {
    Ok(Json(app.quota(&caller, &project).await?.into()))
}

/// Set a project's own quota limits (admins). What it holds stays; lower limits refuse more.
#[utoipa::path(put, path = "/v1/quotas/{project}", tag = "quotas",
    request_body = QuotaLimits,
    params(("project" = String, Path, description = "The project's id")),
    responses((status = 200, body = QuotaView),
        (status = 422, description = "A limit out of range", body = Problem)),
    security(("bearer" = [])))]
pub(super) async fn put_quota(
    State(app): State<AppState>,
    caller: Caller,
    Path(project): Path<String>,
    limits: Unparsed<QuotaLimits>,
) -> Result<Json<QuotaView>, Error> {
    caller.require_admin()?;
    let limits = limits.parse()?;
    Ok(Json(app.set_quota(&caller, &project, Some(limits.into())).await?.into()))
}

/// Give a project the default quota limits again (admins).
#[utoipa::path(delete, path = "/v1/quotas/{project}", tag = "quotas",
    params(("project" = String, Path, description = "The project's id")),
    responses((status = 200, body = QuotaView)),
    security(("bearer" = [])))]
pub(super) async fn delete_quota(
    State(app): State<AppState>,
    caller: Caller,
    Path(project): Path<String>,
) -> Result<Json<QuotaView>, Error> {
    Ok(Json(app.set_quota(&caller, &project, None).await?.into()))
}
