//! Background tasks (admins): each task of the gsaasd that answers, how often it runs and how its
//! last activation went, and running one now (see [`crate::app::background::driver`]).

use axum::extract::{Path, State};
use axum::Json;
pub use gsaas_api_types::{BackgroundTaskList, BackgroundTaskView, TaskOutcome};

use super::AppState;
use crate::auth::Caller;
use crate::error::{Error, Problem};
use crate::policy::{actions, Target};

/// List the background tasks of the replica that answers (admins).
#[utoipa::path(get, path = "/v1/background-tasks", tag = "service",
    responses((status = 200, body = BackgroundTaskList), (status = 404, description = "Not the caller's to see: anyone but an admin is answered as if it did not exist", body = Problem)),
    security(("bearer" = [])))]
pub(super) async fn list_tasks(
    State(app): State<AppState>,
    caller: Caller,
) -> Result<Json<BackgroundTaskList>, Error> {
    app.policy.authorize(actions::TASK_LIST, &caller, Target::Service)?;
    Ok(Json(BackgroundTaskList { tasks: app.background_tasks() }))
}

/// Run a background task now, on the replica that answers, and wait for it (admins).
///
/// Answers with the task as it stands after the activation (`last_outcome`, `last_error`).
#[utoipa::path(post, path = "/v1/background-tasks/{name}/activate", tag = "service",
    params(("name" = String, Path, description = "The task's name (`route_tables`, ...)")),
    responses((status = 200, body = BackgroundTaskView), (status = 404, description = "No such task on this replica, or not the caller's to see", body = Problem)),
    security(("bearer" = [])))]
pub(super) async fn activate_task(
    State(app): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
) -> Result<Json<BackgroundTaskView>, Error> {
    app.policy.authorize(actions::TASK_ACTIVATE, &caller, Target::Service)?;
    let not_found = || Error::NotFound { kind: "background task", id: name.clone() };
    if name.len() > 64 {
        return Err(not_found());
    }
    app.activate_background_task(&name).await.map(Json).ok_or_else(not_found)
}
