//! `GET /v1/cohorts`, and `GET`, `PUT` and `DELETE /v1/cohorts/{name}`: projects that lend each
//! other their unused quota (see [`crate::app::cohorts`]).

use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
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
            version: s.version,
        }
    }
}

/// The view with its version as its `ETag`.
fn tagged(status: CohortStatus) -> ([(header::HeaderName, HeaderValue); 1], Json<CohortView>) {
    let etag =
        HeaderValue::from_str(&format!("\"{}\"", status.version)).expect("a version is hex digits");
    ([(header::ETAG, etag)], Json(status.into()))
}

/// The versions `If-Match` names (quoted, comma-separated; `*`: any); `None` without one. One
/// that is not so: 400.
fn if_match(headers: &HeaderMap) -> Result<Option<Vec<String>>, Error> {
    let Some(value) = headers.get(header::IF_MATCH) else { return Ok(None) };
    let malformed = || Error::Malformed {
        field: "If-Match".into(),
        reason: "expected \"*\" or quoted versions, as the cohort's ETag gives them".into(),
    };
    let text = value.to_str().map_err(|_| malformed())?.trim();
    if text.is_empty() {
        // An empty field is no condition (RFC 9110 makes a list of none no list).
        return Ok(None);
    }
    if text == "*" {
        return Ok(Some(vec!["*".into()]));
    }
    let tags = text.split(',').map(|tag| {
        let tag = tag.trim().strip_prefix("W/").unwrap_or(tag.trim());
        let inner = tag.strip_prefix('"').and_then(|t| t.strip_suffix('"'));
        inner.filter(|t| !t.contains('"')).map(str::to_owned).ok_or_else(malformed)
    });
    let tags = tags.collect::<Result<Vec<String>, Error>>()?;
    Ok(Some(tags))
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
    responses((status = 200, body = CohortView,
            headers(("ETag" = String, description = "The cohort's version, for If-Match"))),
        (status = 404, description = "No such cohort", body = Problem)),
    security(("bearer" = [])))]
pub(super) async fn get_cohort(
    State(app): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
) -> Result<impl axum::response::IntoResponse, Error> {
    Ok(tagged(app.cohort(&caller, &name).await?))
}

/// Put projects in a cohort on their terms, replacing its members (admins). A project in another
/// cohort: 409. With `If-Match` (the version a `GET` gave), only if nobody changed it since: 409
/// `version_conflict` otherwise.
#[utoipa::path(put, path = "/v1/cohorts/{name}", tag = "quotas",
    request_body = CohortRequest,
    params(("name" = String, Path, description = "The cohort's name"),
        ("If-Match" = Option<String>, Header, description = "Change it only if it is at this version (its ETag; * for any)")),
    responses((status = 200, body = CohortView,
            headers(("ETag" = String, description = "The cohort's new version"))),
        (status = 400, description = "If-Match is not a quoted version", body = Problem),
        (status = 409, description = "A member is in another cohort, or (`version_conflict`) the cohort changed since the version If-Match names", body = Problem),
        (status = 422, description = "A project id or a limit out of range", body = Problem)),
    security(("bearer" = [])))]
pub(super) async fn put_cohort(
    State(app): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
    headers: HeaderMap,
    request: Unparsed<CohortRequest>,
) -> Result<impl axum::response::IntoResponse, Error> {
    app.policy.authorize(actions::COHORT_SET, &caller, Target::Service)?;
    let request = request.parse()?;
    let expected = if_match(&headers)?;
    let members = request.members.into_iter().map(|(p, t)| (p, t.into())).collect();
    let status = app.set_cohort(&caller, &name, Some(members), expected.as_deref()).await?;
    let status = status.ok_or_else(|| Error::internal("a cohort set has no members"))?;
    Ok(tagged(status))
}

/// End a cohort (admins): its members keep their own quotas; what they borrowed stays held.
#[utoipa::path(delete, path = "/v1/cohorts/{name}", tag = "quotas",
    params(("name" = String, Path, description = "The cohort's name"),
        ("If-Match" = Option<String>, Header, description = "End it only if it is at this version (its ETag)")),
    responses((status = 204, description = "Ended"),
        (status = 400, description = "If-Match is not a quoted version", body = Problem),
        (status = 404, description = "No such cohort", body = Problem),
        (status = 409, description = "`version_conflict`: the cohort changed since the version If-Match names", body = Problem)),
    security(("bearer" = [])))]
pub(super) async fn delete_cohort(
    State(app): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> Result<StatusCode, Error> {
    app.policy.authorize(actions::COHORT_SET, &caller, Target::Service)?;
    let expected = if_match(&headers)?;
    app.set_cohort(&caller, &name, None, expected.as_deref()).await?;
    Ok(StatusCode::NO_CONTENT)
}
