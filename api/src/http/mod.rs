//! The REST API: thin handlers over the application layer.
//!
//! Handlers parse, authenticate, call one application method and shape the answer; they hold no
//! logic and retry nothing. Bodies are parsed here (not by axum's `Json`) so that every malformed
//! request gets a problem document naming the field (`ncgpus: invalid value: integer -1 ...`).

mod cohorts;
mod elastic;
mod failures;
mod healthcheck;
mod lists;
mod openapi;
mod quotas;
pub mod requests;
mod sessions;
mod tasks;
mod usage;
mod versions;
pub mod views;

pub use openapi::openapi_document;

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, FromRequest, Path, Query, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post, put};
use axum::{Json, Router};
use gpgpums::{GpuId, HostId, VmId};
use serde::de::DeserializeOwned;
use serde::Deserialize;

use crate::app::vms::{Extras, LaunchInput, VmDetails};
use crate::app::App;
use crate::auth::{Caller, Role};
use crate::error::{Error, FieldError, Problem};
use crate::model::VmState;
use crate::policy::{actions, Target};
use views::*;

/// Largest request body accepted.
pub const MAX_BODY: usize = 256 * 1024;

type AppState = Arc<App>;

/// A JSON body, parsed with the path of whatever field is wrong.
#[derive(Debug)]
pub struct Body<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for Body<T> {
    type Rejection = Error;

    async fn from_request(req: Request, state: &S) -> Result<Self, Error> {
        Unparsed::<T>::from_request(req, state).await?.parse().map(Body)
    }
}

/// A JSON body that may be wrong in some fields: the type errors, and the body parsed without the
/// fields at fault when the rest parses. A handler checks the rest's values too, so that one answer
/// names every field to fix, whether its type or its value is wrong.
#[derive(Debug)]
pub enum Partial<T> {
    Whole(T),
    Wrong { errors: Vec<FieldError>, rest: Option<T> },
}

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for Partial<T> {
    type Rejection = Error;

    async fn from_request(req: Request, state: &S) -> Result<Self, Error> {
        let bytes = Unparsed::<T>::from_request(req, state).await?;
        let (rest, errors) = parse_partial(bytes.json()?)?;
        match (rest, errors.is_empty()) {
            (Some(whole), true) => Ok(Partial::Whole(whole)),
            (rest, _) => Ok(Partial::Wrong { errors, rest }),
        }
    }
}

impl<T> Partial<T> {
    /// The whole body, or every problem: its type errors, and those `check` finds in the rest's
    /// other fields (problems of fields already at fault are not repeated).
    pub fn or_problems(self, check: impl FnOnce(T) -> Vec<FieldError>) -> Result<T, Error> {
        let (mut errors, rest) = match self {
            Partial::Whole(whole) => return Ok(whole),
            Partial::Wrong { errors, rest } => (errors, rest),
        };
        if let Some(rest) = rest {
            let at_fault = |field: &str| {
                errors.iter().any(|e: &FieldError| {
                    field == e.field
                        || field
                            .strip_prefix(e.field.as_str())
                            .is_some_and(|tail| tail.starts_with('.') || tail.starts_with('['))
                })
            };
            let more: Vec<FieldError> =
                check(rest).into_iter().filter(|e| !at_fault(&e.field)).collect();
            errors.extend(more);
        }
        errors.truncate(MAX_FIELD_ERRORS);
        Err(Error::Invalid(errors))
    }
}

/// A JSON body read but not parsed yet: for routes that check who calls before they say what is
/// wrong with a body (a caller who may not use the route learns nothing of its fields).
#[derive(Debug)]
pub struct Unparsed<T>(Bytes, std::marker::PhantomData<T>);

impl<T: DeserializeOwned> Unparsed<T> {
    /// The body as a `T`, or every field of it that is wrong (see [`Body`]).
    pub fn parse(self) -> Result<T, Error> {
        match parse_partial(self.json()?)? {
            (Some(parsed), errors) if errors.is_empty() => Ok(parsed),
            (_, errors) => Err(Error::Invalid(errors)),
        }
    }

    fn json(&self) -> Result<serde_json::Value, Error> {
        serde_json::from_slice(&self.0).map_err(|e| Error::Malformed {
            field: "body".into(),
            reason: format!("not valid JSON: {e}"),
        })
    }
}

impl<S: Send + Sync, T> FromRequest<S> for Unparsed<T> {
    type Rejection = Error;

    async fn from_request(req: Request, state: &S) -> Result<Self, Error> {
        let bytes = Bytes::from_request(req, state).await.map_err(|rejection| {
            if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
                Error::TooLarge(format!("request body is larger than {} KiB", MAX_BODY / 1024))
            } else {
                Error::Malformed { field: "body".into(), reason: "cannot be read".into() }
            }
        })?;
        Ok(Unparsed(bytes, std::marker::PhantomData))
    }
}

/// The most field errors one problem document lists.
const MAX_FIELD_ERRORS: usize = 32;

/// `value` (an object) as a `T`, and every field of it that is wrong: after each error, the top-level
/// field at fault is set aside and the rest parsed again. The `T` is what the rest made, if it made
/// one.
fn parse_partial<T: DeserializeOwned>(
    value: serde_json::Value,
) -> Result<(Option<T>, Vec<FieldError>), Error> {
    // serde would take a struct from an array of its fields, too.
    if !value.is_object() {
        return Err(Error::invalid("body", "must be a JSON object"));
    }
    let mut value = integral_numbers(value);
    let mut errors: Vec<FieldError> = Vec::new();
    loop {
        let e = match serde_path_to_error::deserialize::<_, T>(&value) {
            Ok(parsed) => return Ok((Some(parsed), errors)),
            Err(e) => e,
        };
        let top = match e.path().iter().next() {
            Some(serde_path_to_error::Segment::Map { key }) => Some(key.clone()),
            _ => None,
        };
        let path = e.path().to_string();
        let message = strip_position(&e.into_inner().to_string());
        let named = |prefix: &str| {
            message.strip_prefix(prefix).and_then(|rest| rest.split('`').next()).map(str::to_owned)
        };
        let (field, key) = if let Some(missing) = named("missing field `") {
            let field = if path == "." { missing.clone() } else { format!("{path}.{missing}") };
            (field, None)
        } else if let Some(unknown) = named("unknown field `") {
            let field = if path == "." { unknown.clone() } else { path.clone() };
            (field, top.or(Some(unknown)))
        } else {
            (if path == "." { "body".to_owned() } else { path }, top)
        };
        if errors.iter().any(|seen| seen.field == field) {
            break;
        }
        errors.push(FieldError { field, detail: message });
        let removed = match (key, value.as_object_mut()) {
            (Some(key), Some(object)) => object.remove(&key).is_some(),
            _ => false,
        };
        if !removed || errors.len() >= MAX_FIELD_ERRORS {
            break;
        }
    }
    Ok((None, errors))
}

/// JSON Schema counts `5.0` as an integer: integral numbers written with a fraction or an exponent
/// become integers, so integer fields take them.
fn integral_numbers(value: serde_json::Value) -> serde_json::Value {
    use serde_json::Value;
    match value {
        Value::Number(n) if n.is_f64() => {
            let f = n.as_f64().unwrap_or(f64::NAN);
            // Within ±2^53, every integer is exact as an f64.
            if f.fract() == 0.0 && f.abs() <= 9_007_199_254_740_992.0 {
                Value::from(f as i64)
            } else {
                Value::Number(n)
            }
        }
        Value::Array(items) => Value::Array(items.into_iter().map(integral_numbers).collect()),
        Value::Object(fields) => {
            Value::Object(fields.into_iter().map(|(k, v)| (k, integral_numbers(v))).collect())
        }
        other => other,
    }
}

/// serde_json appends " at line 1 column 42"; the field path says more.
fn strip_position(message: &str) -> String {
    match message.rfind(" at line ") {
        Some(i) => message[..i].to_owned(),
        None => message.to_owned(),
    }
}

/// Query parameters as a handler takes them: parsed by axum, checked when the handler decides
/// (after the caller's rights, so a refused caller learns nothing from its query).
type QueryResult<T> = Result<Query<T>, axum::extract::rejection::QueryRejection>;

/// The parsed parameters, or a problem document naming what is wrong with them.
fn query<T>(query: QueryResult<T>) -> Result<T, Error> {
    query.map(|Query(q)| q).map_err(|e| Error::invalid("query", e.body_text()))
}

/// Whether the caller sees where the VM's cGPUs are (`gpu:vm:show:location`; by default admins
/// only: tenants never learn where their GPUs are).
fn sees_location(app: &App, caller: &Caller, details: &VmDetails) -> bool {
    app.policy.allows(actions::VM_SHOW_LOCATION, caller, Target::Project(&details.vm.project))
}

fn vm_id(raw: &str) -> Result<VmId, Error> {
    raw.parse().map_err(|_| Error::vm_not_found(&raw))
}

fn host_id(raw: &str) -> Result<HostId, Error> {
    HostId::new(raw).map_err(|_| Error::NotFound { kind: "host", id: raw.to_owned() })
}

pub fn router(app: Arc<App>) -> Router {
    Router::new()
        .route("/v1/vms", post(launch_vm).get(lists::list_vms))
        .route("/v1/queue", get(get_queue))
        .route("/v1/vms/{id}", get(get_vm).delete(terminate_vm))
        .route("/v1/vms/{id}/cgpus", post(elastic::attach_cgpus))
        .route("/v1/vms/{id}/cgpus/{index}", delete(elastic::detach_cgpu))
        .route("/v1/quotas", get(quotas::list_quotas))
        .route(
            "/v1/quotas/{project}",
            get(quotas::get_quota).put(quotas::put_quota).delete(quotas::delete_quota),
        )
        .route("/v1/cohorts", get(cohorts::list_cohorts))
        .route(
            "/v1/cohorts/{name}",
            get(cohorts::get_cohort).put(cohorts::put_cohort).delete(cohorts::delete_cohort),
        )
        .route("/v1/usage", get(usage::usage))
        .route("/v1/usage/{project}", get(usage::project_usage))
        .route("/v1/pool", get(lists::get_pool))
        .route("/v1/hosts", get(list_hosts))
        .route("/v1/hosts/{name}", put(register_host))
        .route("/v1/hosts/{name}/token", post(renew_agent_token))
        .route("/v1/hosts/{name}/rtt-targets", get(rtt_targets))
        .route("/v1/hosts/{name}/drain", post(drain_host))
        .route("/v1/hosts/{name}/undrain", post(undrain_host))
        .route("/v1/hosts/{name}/forget", post(failures::forget_host))
        .route("/v1/hosts/{name}/evacuate", post(failures::evacuate_host))
        .route("/v1/fences", get(failures::list_fences))
        .route("/v1/gpus/{id}/evacuate", post(failures::evacuate_gpu))
        .route("/v1/gpus/{id}/taint", post(taint_gpu))
        .route("/v1/gpus/{id}/untaint", post(untaint_gpu))
        .route("/v1/background-tasks", get(tasks::list_tasks))
        .route("/v1/background-tasks/{name}/activate", post(tasks::activate_task))
        .route("/", get(versions::root))
        .route("/v1/", get(versions::version_v1))
        .route("/v1", get(versions::version_v1))
        .route("/v1/auth", get(sessions::auth_methods))
        .route("/v1/auth/tokens", post(sessions::sign_in).delete(sessions::sign_out))
        .route("/v1/auth/projects", get(sessions::projects))
        .route("/healthz", get(healthz))
        .route("/healthcheck", get(healthcheck::healthcheck).head(healthcheck::healthcheck))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/openapi.json", get(openapi_json))
        .merge(crate::dashboard::routes())
        .fallback(|| async { Error::NotFound { kind: "resource", id: String::new() } })
        .layer(middleware::from_fn_with_state(app.config.http.body_timeout(), read_body))
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .layer(middleware::from_fn(agent_protocol))
        .layer(middleware::from_fn(requests::trace_requests))
        .layer(middleware::from_fn_with_state(app.db.requests().clone(), count_requests))
        .with_state(app)
}

/// The agents' routes (`/v1/hosts/...`): a request in a protocol outside the skew policy is
/// refused (409, saying which side to upgrade) before anything reads it, and every answer says
/// gsaasd's protocol (see [`rodvr_contract::version`]). Admins' tools send no header, and are
/// taken; so are agents of before the header, which report nothing a newer gsaasd would misread
/// (no servers of their own).
async fn agent_protocol(request: Request, next: Next) -> Response {
    use rodvr_contract::version;
    if !request.uri().path().starts_with("/v1/hosts/") {
        return next.run(request).await;
    }
    let header = request.headers().get(version::HEADER).map(|v| v.to_str().unwrap_or("?"));
    let checked = match header {
        None => Ok(version::UNVERSIONED),
        Some(_) => version::check_agent(header),
    };
    let mut response = match checked {
        Ok(_) => next.run(request).await,
        Err(skew) => Error::Conflict(skew.to_string()).into_response(),
    };
    response.headers_mut().insert(version::HEADER, HeaderValue::from(version::PROTOCOL));
    response
}

/// Counts the request in flight while it is served: background work yields to it.
async fn count_requests(
    State(requests): State<Arc<crate::lanes::Requests>>,
    request: Request,
    next: Next,
) -> Response {
    requests.serve(next.run(request)).await
}

/// Reads the whole body (at most [`MAX_BODY`]) within `http.body_timeout_secs`.
async fn read_body(State(timeout): State<Duration>, request: Request, next: Next) -> Response {
    use gsaas_infra::httpd::{read_body_within, BodyError};
    match read_body_within(request, MAX_BODY, timeout).await {
        Ok(request) => next.run(request).await,
        Err(e) => {
            let error = match e {
                BodyError::TimedOut(_) => Error::RequestTimeout(e.to_string()),
                BodyError::TooLarge(_) => {
                    Error::TooLarge(format!("request body is larger than {} KiB", MAX_BODY / 1024))
                }
                BodyError::Failed(_) => {
                    Error::Malformed { field: "body".into(), reason: "cannot be read".into() }
                }
            };
            let mut response = error.into_response();
            response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
            response
        }
    }
}

fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, Error> {
    headers
        .get("idempotency-key")
        .map(|value| {
            value
                .to_str()
                .map(str::to_owned)
                .map_err(|_| Error::invalid("Idempotency-Key", "must be text"))
        })
        .transpose()
}

fn location(id: &str) -> String {
    format!("/v1/vms/{id}")
}

/// Launch a cGPU-enabled VM.
///
/// Checks the request, reserves every cGPU atomically and answers 202 with the VM in `creating`; the
/// VM becomes `ready` (or `error`, with the reason) when created, running and routed. With
/// `"queue": true`, a launch the GPUs cannot take now is answered 202 in `queued`, with its
/// `queue_position`; it starts when capacity frees, or ends in `error` with `error_code`
/// `queue_timeout`. Terminating a queued VM cancels it. A retry with
/// the same `Idempotency-Key` returns the same VM.
#[utoipa::path(post, path = "/v1/vms", tag = "vms",
    request_body = LaunchRequest,
    params(("Idempotency-Key" = Option<String>, Header, description = "Makes retries safe: one VM per key and project")),
    responses(
        (status = 202, description = "Accepted; the VM is being created", body = VmView,
            headers(("Location" = String, description = "The VM's URL"))),
        (status = 403, description = "Over the project's quota (`quota_exceeded`); nothing changed", body = Problem),
        (status = 507, description = "Not enough GPU capacity", body = Problem),
        (status = 429, description = "With `queue`: the project already has `queue.max_waiting_per_project` requests waiting", body = Problem),
    ),
    security(("bearer" = [])))]
async fn launch_vm(
    State(app): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    request: Partial<LaunchRequest>,
) -> Result<Response, Error> {
    let request = request.or_problems(|rest| {
        let (spec, policy, _) = launch_spec(rest);
        app.launch_problems(spec, policy.as_deref())
    })?;
    let idempotency_key = idempotency_key(&headers)?;
    let (spec, policy, queue) = launch_spec(request);
    let tenant = crate::auth::tenant_token(&headers, &caller, &app);
    let (details, created) =
        app.launch(&caller, LaunchInput { spec, policy, idempotency_key, tenant, queue }).await?;
    let view = if created && details.vm.state != VmState::Queued {
        // Just reserved, as the reservation wrote it: a VM that did not wait has no queue entry,
        // and its events (preemptions, moves, attaches) all come later.
        vm_record_view(&details, sees_location(&app, &caller, &details))
    } else {
        vm_view(&app, &details, sees_location(&app, &caller, &details)).await?
    };
    let location = location(&view.id);
    Ok((StatusCode::ACCEPTED, [(header::LOCATION, location)], Json(view)).into_response())
}

/// The queue: what waits for GPU capacity, in the order it will be served.
///
/// Requests of the caller's project (admins: of every project), each with its place in the whole
/// queue, and how many requests wait at each priority in all.
#[utoipa::path(get, path = "/v1/queue", tag = "vms",
    responses((status = 200, body = QueueView)),
    security(("bearer" = [])))]
async fn get_queue(State(app): State<AppState>, caller: Caller) -> Result<Json<QueueView>, Error> {
    let (rows, lengths) = app.queue_of(&caller).await?;
    Ok(Json(queue_view(&rows, &lengths)))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
struct GetVmQuery {
    /// Long-poll: answer once the VM has settled (`ready`, `error` or `deleted`) or after this
    /// many seconds (at most 60), whichever comes first. Without it the answer is immediate.
    wait: Option<f64>,
}

/// Show a VM: state, cGPUs, rCUDA environment, stage timings.
#[utoipa::path(get, path = "/v1/vms/{id}", tag = "vms",
    params(("id" = String, Path, description = "The VM's id"), GetVmQuery),
    responses((status = 200, body = VmView)),
    security(("bearer" = [])))]
async fn get_vm(
    State(app): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    params: QueryResult<GetVmQuery>,
) -> Result<Response, Error> {
    let query = query(params)?;
    let id = vm_id(&id)?;
    let details = match query.wait {
        None => app.visible_vm(&caller, id, actions::VM_SHOW).await?,
        Some(wait) => {
            let max = crate::app::watch::MAX_WAIT.as_secs_f64();
            if !(0.0..=max).contains(&wait) {
                return Err(Error::invalid(
                    "wait",
                    format!("must be a number of seconds from 0 to {max}"),
                ));
            }
            app.visible_vm_settled(&caller, id, Duration::from_secs_f64(wait)).await?
        }
    };
    let admin = sees_location(&app, &caller, &details);
    if details.extras != Extras::Unknown {
        // The VM's view alone: the one rendered for its versions serves, if kept.
        let body = app.rendered_view(&details, admin, || {
            serde_json::to_vec(&vm_record_view(&details, admin)).expect("a view serializes").into()
        });
        return Ok(([(header::CONTENT_TYPE, "application/json")], body).into_response());
    }
    Ok(Json(vm_view(&app, &details, admin).await?).into_response())
}

/// The VM as the API shows it, with its place in the queue while it is queued.
async fn vm_view(app: &AppState, details: &VmDetails, admin: bool) -> Result<VmView, Error> {
    let view = vm_record_view(details, admin);
    if details.extras != Extras::Unknown {
        return Ok(view);
    }
    let extras = app.view_extras(details.vm.id).await?;
    Ok(with_queue_and_events(view, &extras.entries, extras.events))
}

/// Terminate a VM: withdraw its routes, delete it, release its cGPUs. Idempotent.
#[utoipa::path(delete, path = "/v1/vms/{id}", tag = "vms",
    params(("id" = String, Path, description = "The VM's id")),
    responses((status = 202, description = "Terminating (or already terminated)", body = VmView)),
    security(("bearer" = [])))]
async fn terminate_vm(
    State(app): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<(StatusCode, Json<VmView>), Error> {
    let details = app.terminate(&caller, vm_id(&id)?).await?;
    Ok((
        StatusCode::ACCEPTED,
        Json(vm_record_view(&details, sees_location(&app, &caller, &details))),
    ))
}

/// List hosts (admins).
#[utoipa::path(get, path = "/v1/hosts", tag = "hosts",
    responses((status = 200, body = HostList), (status = 404, description = "Not the caller's to see: anyone but an admin is answered as if it did not exist", body = Problem)),
    security(("bearer" = [])))]
async fn list_hosts(State(app): State<AppState>, caller: Caller) -> Result<Json<HostList>, Error> {
    app.policy.authorize(actions::HOST_LIST, &caller, Target::Service)?;
    let (hosts, mut alerts) = app.hosts_with_alerts().await?;
    let mut taken = app.local_vms_taken().await?;
    let hosts = hosts
        .iter()
        .map(|h| {
            let view = host_view_with_alerts(h, alerts.remove(&h.name).unwrap_or_default());
            let taken = taken.remove(&h.name).unwrap_or_default();
            HostView { local_vms: local_vms_view(h.local_vms, taken), ..view }
        })
        .collect();
    Ok(Json(HostList { hosts }))
}

/// Register a host or heartbeat (its agent, or an admin), with its GPU inventory.
#[utoipa::path(put, path = "/v1/hosts/{name}", tag = "hosts",
    params(("name" = String, Path, description = "The host's name")),
    request_body = HostReportBody,
    responses((status = 200, body = HostView),
        (status = 409, body = Problem)),
    security(("bearer" = [])))]
async fn register_host(
    State(app): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
    report: Unparsed<rodvr_contract::protocol::HostReport>,
) -> Result<Json<HostView>, Error> {
    let allowed = match caller.role {
        Role::Admin => true,
        Role::Agent => caller.subject == name,
        Role::Member | Role::Metrics => false,
    };
    if !allowed {
        return Err(Error::NotFound { kind: "host", id: name });
    }
    let report = report.parse()?;
    if report.host.as_str() != name {
        return Err(Error::invalid(
            "host",
            format!("{} does not match the path's host {name}", report.host),
        ));
    }
    Ok(Json(host_view(&app.register_report(&report).await?)))
}

/// Renew an agent's token: a host's agent trades its valid token for a fresh one, in the same
/// line (revoking the line's first id revokes both).
#[utoipa::path(post, path = "/v1/hosts/{name}/token", tag = "hosts",
    params(("name" = String, Path, description = "The host's name")),
    responses((status = 200, body = AgentToken)),
    security(("bearer" = [])))]
async fn renew_agent_token(
    State(app): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> Result<Json<AgentToken>, Error> {
    if caller.role != Role::Agent || caller.subject != name {
        return Err(Error::NotFound { kind: "host", id: name });
    }
    let token = app.renew_agent_token(crate::auth::bearer_token(&headers)?)?;
    Ok(Json(AgentToken { token }))
}

/// The GPU hosts whose round trips a host's agent measures (its agent, or an admin): the
/// nearest by topology first, at most 64, each with the rCUDA endpoint to connect to.
#[utoipa::path(get, path = "/v1/hosts/{name}/rtt-targets", tag = "hosts",
    params(("name" = String, Path, description = "The host's name")),
    responses((status = 200, body = RttTargetsBody),
        (status = 404, description = "No such host, or not the caller's to see", body = Problem)),
    security(("bearer" = [])))]
async fn rtt_targets(
    State(app): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
) -> Result<Json<RttTargetsBody>, Error> {
    let allowed = match caller.role {
        Role::Admin => true,
        Role::Agent => caller.subject == name,
        Role::Member | Role::Metrics => false,
    };
    let host = HostId::new(&name).ok().filter(|_| allowed);
    let Some(host) = host else { return Err(Error::NotFound { kind: "host", id: name }) };
    let targets = app.rtt_targets(&host).await?;
    Ok(Json(RttTargetsBody {
        targets: targets
            .into_iter()
            .map(|t| RttTargetBody {
                host: t.host.to_string(),
                address: t.address.to_string(),
                port: t.port,
            })
            .collect(),
    }))
}

/// Drain a host: no new cGPUs there (admins).
#[utoipa::path(post, path = "/v1/hosts/{name}/drain", tag = "hosts",
    params(("name" = String, Path, description = "The host's name")),
    responses((status = 200, body = HostView)),
    security(("bearer" = [])))]
async fn drain_host(
    State(app): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
) -> Result<Json<HostView>, Error> {
    app.policy.authorize(actions::HOST_DRAIN, &caller, Target::Service)?;
    Ok(Json(host_view(&app.set_drained(&host_id(&name)?, true).await?)))
}

/// Undrain a host (admins).
#[utoipa::path(post, path = "/v1/hosts/{name}/undrain", tag = "hosts",
    params(("name" = String, Path, description = "The host's name")),
    responses((status = 200, body = HostView)),
    security(("bearer" = [])))]
async fn undrain_host(
    State(app): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
) -> Result<Json<HostView>, Error> {
    app.policy.authorize(actions::HOST_UNDRAIN, &caller, Target::Service)?;
    Ok(Json(host_view(&app.set_drained(&host_id(&name)?, false).await?)))
}

fn gpu_id(raw: &str) -> Result<GpuId, Error> {
    GpuId::new(raw).map_err(|_| Error::NotFound { kind: "GPU", id: raw.to_owned() })
}

/// Taint a GPU: it keeps its cGPUs and takes no new ones (admins).
#[utoipa::path(post, path = "/v1/gpus/{id}/taint", tag = "gpus",
    params(("id" = String, Path, description = "The GPU's id")),
    request_body = TaintRequest,
    responses((status = 200, body = GpuTaintView)),
    security(("bearer" = [])))]
async fn taint_gpu(
    State(app): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    request: Unparsed<TaintRequest>,
) -> Result<Json<GpuTaintView>, Error> {
    app.policy.authorize(actions::GPU_TAINT, &caller, Target::Service)?;
    let request = request.parse()?;
    let gpu = gpu_id(&id)?;
    let reason = request.reason.trim();
    crate::app::fields::check_text("reason", reason, crate::app::gpus::MAX_TAINT_LEN)?;
    let taint = format!("{}: {reason}", caller.subject);
    app.set_gpu_taint(&gpu, Some(taint.clone())).await?;
    Ok(Json(GpuTaintView { id, taint: Some(taint) }))
}

/// Untaint a GPU: it takes new cGPUs again (admins).
#[utoipa::path(post, path = "/v1/gpus/{id}/untaint", tag = "gpus",
    params(("id" = String, Path, description = "The GPU's id")),
    responses((status = 200, body = GpuTaintView)),
    security(("bearer" = [])))]
async fn untaint_gpu(
    State(app): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<GpuTaintView>, Error> {
    app.policy.authorize(actions::GPU_UNTAINT, &caller, Target::Service)?;
    app.set_gpu_taint(&gpu_id(&id)?, None).await?;
    Ok(Json(GpuTaintView { id, taint: None }))
}

/// Liveness: the process serves requests.
#[utoipa::path(get, path = "/healthz", tag = "service", responses((status = 200, body = Health)))]
async fn healthz() -> Json<Health> {
    Json(Health { status: "ok".into() })
}

/// Readiness: the database answers; includes the reconciler's last pass.
#[utoipa::path(get, path = "/readyz", tag = "service",
    responses((status = 200, body = Readiness), (status = 503, body = Readiness)))]
async fn readyz(State(app): State<AppState>) -> (StatusCode, Json<Readiness>) {
    let database = app.db.ping().await;
    let status = if database.is_ok() { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    // Anyone may ask (probes carry no token): the reconciler's error is said to have happened,
    // not what it was (it may name hosts); the log has it.
    let mut reconciler = app.reconciler_status();
    if reconciler.last_error.is_some() {
        reconciler.last_error = Some("the last pass hit an error; gsaasd's log says which".into());
    }
    (
        status,
        Json(Readiness {
            status: if database.is_ok() { "ready" } else { "not ready" }.into(),
            database: if database.is_ok() { "ok" } else { "unavailable" }.into(),
            reconciler,
        }),
    )
}

/// Metrics in the Prometheus text format (admins and `metrics` tokens; per GPU and host, so never
/// tenants).
#[utoipa::path(get, path = "/metrics", tag = "service",
    responses((status = 200, body = String, content_type = "text/plain"),
        (status = 404, description = "Not the caller's to see: anyone but a metrics scraper or an admin is answered as if it did not exist", body = Problem)),
    security(("bearer" = [])))]
async fn metrics(State(app): State<AppState>, caller: Caller) -> Result<Response, Error> {
    if !matches!(caller.role, Role::Admin | Role::Metrics) {
        return Err(Error::NotFound { kind: "resource", id: String::new() });
    }
    metrics_text(&app).await
}

async fn metrics_text(app: &App) -> Result<Response, Error> {
    let text = app.render_metrics().await?;
    Ok(([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response())
}

/// `/metrics` alone, without a token: for `metrics.listen`, an address of its own.
pub fn metrics_router(app: Arc<App>) -> Router {
    Router::new()
        .route(
            "/metrics",
            get(|State(app): State<AppState>| async move { metrics_text(&app).await }),
        )
        .fallback(|| async { Error::NotFound { kind: "resource", id: String::new() } })
        .with_state(app)
}

/// This API's OpenAPI document.
#[utoipa::path(get, path = "/openapi.json", tag = "service", responses((status = 200, description = "OpenAPI 3.1 document")))]
async fn openapi_json() -> Response {
    // Built once: anyone may ask for it, as often as they like.
    static DOCUMENT: std::sync::OnceLock<Bytes> = std::sync::OnceLock::new();
    let document = DOCUMENT.get_or_init(|| Bytes::from(openapi_document())).clone();
    ([(header::CONTENT_TYPE, "application/json")], document).into_response()
}
