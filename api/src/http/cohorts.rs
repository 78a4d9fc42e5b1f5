//! `GET /v1/cohorts`, and `GET`, `PUT` and `DELETE /v1/cohorts/{name}`: projects that lend each
//! other their unused quota (see [`crate::app::cohorts`]).

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
pub use gsaas_api_types::{CohortList, CohortMemberView, CohortRequest, CohortView};

use super::{AppState, Unparsed};
use crate::app::cohorts::CohortStatus;
use crate::auth::Caller;
use crate::error::{Error, Problem};
use crate::policy::{actions, Target};

impl From<CohortStatus> for CohortView {
    fn from(s: CohortStatus) -> CohortView {
        CohortView {
            name: s.name.to_string(),
            members: s
                .members
                .into_iter()
                .map(|(project, terms, borrowed, lendable)| {
                    let member = CohortMemberView {
                        terms: terms.into(),
                        borrowed: borrowed.into(),
                        lendable: lendable.into(),
                    };
                    (project.to_string(), member)
                })
                .collect(),
            lendable: s.lendable.into(),
            borrowed: s.borrowed.into(),
        }
    }
}

/// Every cohort, its members' terms and what they lend and borrow (admins).
#[utoipa::path(get, path = "/v1/cohorts", tag = "quotas",
    responses((status = 200, body = CohortList), (status = 404, description = "Not the caller's to see: anyone but an admin is answered as if it did not exist", body = Problem)),
    security(("bearer" = [])))]
pub(super) async fn list_cohorts(
    State(app): State<AppState>,
    caller: Caller,
) -> Result<Json<CohortList>, Error> {
    let cohorts = app.cohorts(&caller).await?;
    Ok(Json(CohortList { cohorts: cohorts.into_iter().map(CohortView::from).collect() }))
}

/// One cohort (admins).
#[utoipa::path(get, path = "/v1/cohorts/{name}", tag = "quotas",
    params(("name" = String, Path, description = "The cohort's name")),
    responses((status = 200, body = CohortView),
        (status = 404, description = "No such cohort", body = Problem)),
    security(("bearer" = [])))]
pub(super) async fn get_cohort(
    State(app): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
) -> Result<Json<CohortView>, Error> {
    Ok(Json(app.cohort(&caller, &name).await?.into()))
}

/// Put projects in a cohort on their terms, replacing its members (admins). A project in another
/// cohort: 409.
#[utoipa::path(put, path = "/v1/cohorts/{name}", tag = "quotas",
    request_body = CohortRequest,
    params(("name" = String, Path, description = "The cohort's name")),
    responses((status = 200, body = CohortView),
        (status = 409, description = "A member is in another cohort", body = Problem),
        (status = 422, description = "A project id or a limit out of range", body = Problem)),
    security(("bearer" = [])))]
pub(super) async fn put_cohort(
    State(app): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
    request: Unparsed<CohortRequest>,
) -> Result<Json<CohortView>, Error> {
    app.policy.authorize(actions::COHORT_SET, &caller, Target::Service)?;
    let request = request.parse()?;
    let members = request.members.into_iter().map(|(p, t)| (p, t.into())).collect();
    let status = app.set_cohort(&caller, &name, Some(members)).await?;
    let status = status.ok_or_else(|| Error::internal("a cohort set has no members"))?;
    Ok(Json(status.into()))
}

/// End a cohort (admins): its members keep their own quotas; what they borrowed stays held.
#[utoipa::path(delete, path = "/v1/cohorts/{name}", tag = "quotas",
    params(("name" = String, Path, description = "The cohort's name")),
    responses((status = 204, description = "Ended"),
        (status = 404, description = "No such cohort", body = Problem)),
    security(("bearer" = [])))]
pub(super) async fn delete_cohort(
    State(app): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
) -> Result<StatusCode, Error> {
    app.set_cohort(&caller, &name, None).await?;
    Ok(StatusCode::NO_CONTENT)
}
