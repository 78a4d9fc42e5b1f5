//! Lists that grow with the cloud: VMs and the pool's hosts, in pages.
//!
//! Paging is by marker, as OpenStack's APIs page: a page ends with a `next` link that continues
//! after the page's last item, so a page costs the same at any depth and nothing is skipped or
//! shown twice when items come and go between pages (offsets would). The order is fixed: VMs
//! newest first, hosts in registration order.

use std::collections::HashSet;

use axum::extract::State;
use axum::Json;
use gpgpums::{HostId, VmId};
use serde::Deserialize;

use super::views::*;
use super::{query, sees_location, AppState, QueryResult};
use crate::app::fields::FieldChecks;
use crate::app::vms::MAX_NAME;
use crate::auth::Caller;
use crate::db::VmFilter;
use crate::error::Error;
use crate::model::VmState;
use crate::policy::{actions, Target};

/// The most VMs a page holds, and how many it holds unless asked for fewer (as Nova's
/// `max_limit`).
pub const MAX_VM_PAGE: u32 = 1000;
/// The most hosts a page of the pool holds.
pub const MAX_HOST_PAGE: u32 = 1000;
/// How many hosts a page of the pool holds unless asked otherwise.
pub const DEFAULT_HOST_PAGE: u32 = 100;

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub(super) struct VmListQuery {
    /// Admins only: this project's VMs.
    project: Option<String>,
    /// The most VMs in the page (at most 1000, the default).
    limit: Option<u32>,
    /// The id of the previous page's last VM: this page continues after it (the `next` link
    /// carries it).
    marker: Option<String>,
    /// Only VMs in this state.
    state: Option<VmState>,
    /// Only VMs of this name.
    name: Option<String>,
    /// Deleted VMs too; they are left out otherwise (unless `state` is `deleted`).
    deleted: Option<bool>,
}

/// Whether `limit` is a page size from 1 to `max`.
fn check_limit(checks: &mut FieldChecks, limit: Option<u32>, max: u32) {
    if limit.is_some_and(|n| !(1..=max).contains(&n)) {
        checks.fail("limit", format!("must be from 1 to {max}"));
    }
}

/// The marker `raw` as `parse` reads it; a marker it cannot read is a field error (`what` it
/// must be).
fn parse_marker<T>(
    checks: &mut FieldChecks,
    raw: Option<&str>,
    what: &str,
    parse: impl FnOnce(&str) -> Option<T>,
) -> Option<T> {
    let parsed = parse(raw?);
    if parsed.is_none() {
        checks.fail("marker", format!("must be {what}"));
    }
    parsed
}

/// `path` with `params` (those that are set) as its query, each value percent-encoded.
fn link(path: &str, params: &[(&str, Option<String>)]) -> String {
    let query: Vec<String> = params
        .iter()
        .filter_map(|(name, value)| {
            let value = value.as_ref()?;
            Some(format!("{name}={}", percent_encoding::utf8_percent_encode(value, QUERY_VALUE)))
        })
        .collect();
    format!("{path}?{}", query.join("&"))
}

/// What a query value keeps unencoded: RFC 3986's unreserved characters.
const QUERY_VALUE: &percent_encoding::AsciiSet =
    &percent_encoding::NON_ALPHANUMERIC.remove(b'-').remove(b'.').remove(b'_').remove(b'~');

/// List your project's VMs (admins: every project's, or one's), newest first, a page at a time.
///
/// Deleted VMs are left out unless asked for. A page holds at most `limit` VMs; `next`, when
/// present, is the link to the page after it.
#[utoipa::path(get, path = "/v1/vms", tag = "vms", params(VmListQuery),
    responses((status = 200, body = VmList)),
    security(("bearer" = [])))]
pub(super) async fn list_vms(
    State(app): State<AppState>,
    caller: Caller,
    params: QueryResult<VmListQuery>,
) -> Result<Json<VmList>, Error> {
    let q = query(params)?;
    let mut checks = FieldChecks::new();
    check_limit(&mut checks, q.limit, MAX_VM_PAGE);
    let marker = parse_marker(&mut checks, q.marker.as_deref(), "a VM id", |m| m.parse().ok());
    if let Some(name) = &q.name {
        // Names may be empty (a launch without one).
        if !name.is_empty() {
            checks.text("name", name, MAX_NAME);
        }
    }
    checks.finish()?;
    let limit = q.limit.unwrap_or(MAX_VM_PAGE);
    let filter = VmFilter {
        project: q.project.as_deref(),
        state: q.state,
        name: q.name.as_deref(),
        include_deleted: q.deleted.unwrap_or(false),
    };
    let mut page = app.list_vms(&caller, filter, marker, limit as usize).await?;
    let next = match page.vms.last() {
        Some(last) if page.more => Some(link(
            "/v1/vms",
            &[
                ("project", q.project.clone()),
                ("limit", q.limit.map(|n| n.to_string())),
                ("marker", Some(last.vm.id.to_string())),
                ("state", q.state.map(|s| s.as_str().to_owned())),
                ("name", q.name.clone()),
                ("deleted", q.deleted.map(|d| d.to_string())),
            ],
        )),
        _ => None,
    };
    let vms = page
        .vms
        .iter()
        .map(|d| {
            let id = d.vm.id;
            let entries = page.extras.entries.get(&id).map_or(&[][..], Vec::as_slice);
            let events = page.extras.events.remove(&id).unwrap_or_default();
            with_queue_and_events(
                vm_record_view(d, sees_location(&app, &caller, d)),
                entries,
                events,
            )
        })
        .collect();
    Ok(Json(VmList { vms, next }))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub(super) struct PoolQuery {
    /// Admins: the most hosts in the page (at most 1000; default 100).
    limit: Option<u32>,
    /// Admins: the name of the previous page's last host: this page continues after it (the
    /// `next` link carries it).
    marker: Option<String>,
}

/// GPU pool capacity and use (admins: per host and GPU, with rCUDA endpoints and holders, a page
/// of hosts at a time, in registration order).
#[utoipa::path(get, path = "/v1/pool", tag = "pool", params(PoolQuery),
    responses((status = 200, body = PoolView)),
    security(("bearer" = [])))]
pub(super) async fn get_pool(
    State(app): State<AppState>,
    caller: Caller,
    params: QueryResult<PoolQuery>,
) -> Result<Json<PoolView>, Error> {
    app.policy.authorize(actions::POOL_SHOW, &caller, Target::own(&caller))?;
    let q = query(params)?;
    let mut checks = FieldChecks::new();
    check_limit(&mut checks, q.limit, MAX_HOST_PAGE);
    let marker =
        parse_marker(&mut checks, q.marker.as_deref(), "a host name", |m| HostId::new(m).ok());
    checks.finish()?;
    if !app.policy.allows(actions::POOL_SHOW_HOSTS, &caller, Target::own(&caller)) {
        return app.read_pool(pool_totals).await.map(Json);
    }
    let limit = q.limit.unwrap_or(DEFAULT_HOST_PAGE);
    let fences: HashSet<VmId> = app.fences().await?.iter().map(|f| f.id.holder()).collect();
    let page =
        app.read_pool(|pool| pool_page(pool, marker.as_ref(), limit as usize, &fences)).await?;
    let Some((mut view, more)) = page else {
        let marker = q.marker.unwrap_or_default();
        return Err(Error::invalid("marker", format!("no host {marker} to continue after")));
    };
    let last = view.hosts.as_ref().and_then(|hosts| hosts.last()).map(|h| h.name.clone());
    if let (true, Some(last)) = (more, last) {
        view.next = Some(link(
            "/v1/pool",
            &[("limit", q.limit.map(|n| n.to_string())), ("marker", Some(last))],
        ));
    }
    Ok(Json(view))
}
