//! `POST /v1/vms/{id}/cgpus` and `DELETE /v1/vms/{id}/cgpus/{index}`: cGPUs that come and go on a
//! running VM (see [`crate::app::elastic`]).

use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;

use super::views::{attach_input, vm_record_view, AttachRequest, VmView};
use super::{idempotency_key, location, sees_location, vm_id, vm_view, AppState, Body};
use crate::auth::Caller;
use crate::error::{Error, Problem};

/// Attach cGPUs to a ready VM.
///
/// Books every new cGPU atomically (they follow the VM's locality: a `local` VM's stay on its
/// host) and answers 202 with the VM, the new cGPUs `attaching`; they go `live` once routed, and
/// the VM's rCUDA environment lists them after the others. With `queue: true`, an attach that
/// does not fit now waits in the queue instead: 202 with the VM as it is, the attach in its
/// `queued_attaches` and `queue_position`; when it starts, times out or is refused, the VM gets
/// an event saying so. A retry with the same `Idempotency-Key` answers the VM as it is.
#[utoipa::path(post, path = "/v1/vms/{id}/cgpus", tag = "vms",
    request_body = AttachRequest,
    params(("id" = String, Path, description = "The VM's id"),
        ("Idempotency-Key" = Option<String>, Header, description = "Makes retries safe: one attach per key and project")),
    responses(
        (status = 202, description = "Accepted; the new cGPUs are being routed", body = VmView),
        (status = 404, description = "No such VM", body = Problem),
        (status = 409, description = "The VM is not ready, or its cGPUs are changing", body = Problem),
        (status = 403, description = "Over the project's quota (`quota_exceeded`); nothing changed", body = Problem),
        (status = 507, description = "Not enough GPU capacity and `queue` not set; nothing changed", body = Problem),
        (status = 429, description = "With `queue`: the project already has `queue.max_waiting_per_project` requests waiting", body = Problem),
    ),
    security(("bearer" = [])))]
pub(super) async fn attach_cgpus(
    State(app): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    headers: HeaderMap,
    Body(request): Body<AttachRequest>,
) -> Result<Response, Error> {
    let key = idempotency_key(&headers)?;
    let details = app.attach(&caller, vm_id(&id)?, attach_input(request), key).await?;
    let view = vm_view(&app, &details, sees_location(&app, &caller, &details)).await?;
    let location = location(&view.id);
    Ok((StatusCode::ACCEPTED, [(header::LOCATION, location)], Json(view)).into_response())
}

/// Detach one cGPU from a ready VM.
///
/// Withdraws the cGPU's route first (open connections to it are cut), then releases its booking;
/// the VM's other cGPUs keep their masked endpoints. A VM may go down to no cGPUs. Answers 202
/// with the VM, the cGPU `detaching`.
#[utoipa::path(delete, path = "/v1/vms/{id}/cgpus/{index}", tag = "vms",
    params(("id" = String, Path, description = "The VM's id"),
        ("index" = u32, Path, description = "The cGPU's index")),
    responses(
        (status = 202, description = "Accepted; the cGPU is being detached", body = VmView),
        (status = 404, description = "No such VM, or no such cGPU on it", body = Problem),
        (status = 409, description = "The VM is not ready, or its cGPUs are changing", body = Problem),
    ),
    security(("bearer" = [])))]
pub(super) async fn detach_cgpu(
    State(app): State<AppState>,
    caller: Caller,
    Path((id, index)): Path<(String, String)>,
) -> Result<(StatusCode, Json<VmView>), Error> {
    let id = vm_id(&id)?;
    let index: u32 =
        index.parse().map_err(|_| Error::NotFound { kind: "cGPU", id: index.clone() })?;
    let details = app.detach(&caller, id, index).await?;
    Ok((
        StatusCode::ACCEPTED,
        Json(vm_record_view(&details, sees_location(&app, &caller, &details))),
    ))
}
