//! `GET`, `PUT` and `DELETE /v1/quotas/{project}`: a project's quota limits and use (see
//! [`crate::app::quotas`]).

use axum::extract::{Path, State};
use axum::Json;
pub use gsaas_api_types::{QuotaLimits, QuotaList, QuotaUsage, QuotaView};

use super::{AppState, Unparsed};
use crate::app::quotas::QuotaStatus;
use crate::auth::Caller;
use crate::error::{Error, Problem};
use crate::policy::{actions, Target};

impl From<QuotaStatus> for QuotaView {
    fn from(s: QuotaStatus) -> QuotaView {
        let u = s.usage;
        QuotaView {
            cohort: s.cohort.map(|c| c.to_string()),
            borrowed: s.borrowed.into(),
            project: s.project.to_string(),
            limits: s.limits.into(),
            own_limits: s.own,
            usage: QuotaUsage {
                cgpus: u.cgpus,
                memory_mib: u.memory_mib,
                exclusive_gpus: u.exclusive_gpus,
                vms: u.vms,
                models: s.model_usage.into_iter().map(|(model, u)| (model, u.into())).collect(),
            },
        }
    }
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
    app.policy.authorize(actions::QUOTA_SET, &caller, Target::Service)?;
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
