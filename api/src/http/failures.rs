//! When things break (admins): forgetting a dead host, evacuating GPUs and hosts, and the fences
//! that hold bookings meanwhile (see [`crate::app::fences`] and [`crate::app::background::rehome`]).

use axum::extract::{Path, State};
use axum::Json;
pub use gsaas_api_types::{EvacuationView, FenceList, FenceView};
use serde::Deserialize;

use super::views::HostView;
use super::{gpu_id, host_id, query, AppState, QueryResult};
use crate::app::background::rehome::{Evacuate, Rehomed};
use crate::auth::Caller;
use crate::error::{Error, Problem};
use crate::model::FenceRecord;
use crate::policy::{actions, Target};

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub(super) struct ForgetQuery {
    /// Forget the host even though its agent still heartbeats.
    #[serde(default)]
    force: bool,
}

/// Declare a host dead (admins).
///
/// Its routes count as gone: the fences holding cGPUs whose routes were there are released, it
/// takes no new cGPUs, and nothing is pushed to it until its agent registers again. Refused with
/// 409 while its agent heartbeats, unless `force=true`.
#[utoipa::path(post, path = "/v1/hosts/{name}/forget", tag = "hosts",
    params(("name" = String, Path, description = "The host's name"), ForgetQuery),
    responses((status = 200, body = HostView), (status = 409, description = "Its agent is alive and `force` is not set", body = Problem)),
    security(("bearer" = [])))]
pub(super) async fn forget_host(
    State(app): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
    params: QueryResult<ForgetQuery>,
) -> Result<Json<HostView>, Error> {
    app.policy.authorize(actions::HOST_FORGET, &caller, Target::Service)?;
    let query = query(params)?;
    let host = app.forget_host(&host_id(&name)?, query.force).await?;
    Ok(Json(super::views::host_view(&host)))
}

impl From<Rehomed> for EvacuationView {
    fn from(done: Rehomed) -> Self {
        EvacuationView {
            moved: done.moved,
            vms: done.vms.iter().map(ToString::to_string).collect(),
        }
    }
}

/// Move every cGPU off a GPU (admins).
///
/// Each cGPU goes to another GPU the placement policy chooses, keeping its index and masked
/// endpoint: the VM's environment does not change, new connections reach the new GPU, and
/// connections open to the old GPU are cut (a CUDA context there is lost). The VM gets a
/// `rehomed` event. All or nothing: 507 when any cGPU has nowhere to go, 409 when a VM with a
/// cGPU there is changing (launching, attaching, detaching, terminating). Taint the GPU first to
/// keep new cGPUs off it.
#[utoipa::path(post, path = "/v1/gpus/{id}/evacuate", tag = "gpus",
    params(("id" = String, Path, description = "The GPU's id")),
    responses((status = 200, body = EvacuationView),
        (status = 409, description = "A VM with a cGPU there is changing; nothing moved", body = Problem),
        (status = 507, description = "Some cGPU fits on no other GPU; nothing moved", body = Problem)),
    security(("bearer" = [])))]
pub(super) async fn evacuate_gpu(
    State(app): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<EvacuationView>, Error> {
    app.policy.authorize(actions::GPU_EVACUATE, &caller, Target::Service)?;
    Ok(Json(app.evacuate(Evacuate::Gpu(gpu_id(&id)?)).await?.into()))
}

/// Move every cGPU off a host's GPUs (admins): see `POST /v1/gpus/{id}/evacuate`. Drain the host
/// first to keep new cGPUs off it.
#[utoipa::path(post, path = "/v1/hosts/{name}/evacuate", tag = "hosts",
    params(("name" = String, Path, description = "The host's name")),
    responses((status = 200, body = EvacuationView),
        (status = 409, description = "A VM with a cGPU there is changing; nothing moved", body = Problem),
        (status = 507, description = "Some cGPU fits on no other GPU; nothing moved", body = Problem)),
    security(("bearer" = [])))]
pub(super) async fn evacuate_host(
    State(app): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
) -> Result<Json<EvacuationView>, Error> {
    app.policy.authorize(actions::HOST_EVACUATE, &caller, Target::Service)?;
    Ok(Json(app.evacuate(Evacuate::Host(host_id(&name)?)).await?.into()))
}

/// A fence as admins see it.
pub(crate) fn fence_view(f: &FenceRecord) -> FenceView {
    {
        FenceView {
            id: f.id.to_string(),
            vm: f.vm.to_string(),
            host: f.host.to_string(),
            generation: f.generation,
            reason: f.reason.clone(),
            created_ms: f.created_ms,
            gpus: f.cgpus.iter().map(|c| c.gpu.to_string()).collect(),
        }
    }
}

/// List the fences (admins).
#[utoipa::path(get, path = "/v1/fences", tag = "hosts",
    responses((status = 200, body = FenceList), (status = 404, description = "Not the caller's to see: anyone but an admin is answered as if it did not exist", body = Problem)),
    security(("bearer" = [])))]
pub(super) async fn list_fences(
    State(app): State<AppState>,
    caller: Caller,
) -> Result<Json<FenceList>, Error> {
    app.policy.authorize(actions::FENCE_LIST, &caller, Target::Service)?;
    let fences = app.fences().await?;
    Ok(Json(FenceList { fences: fences.iter().map(fence_view).collect() }))
}
