//! The agent's HTTP API (axum), and the one place an [`AgentError`] becomes an HTTP status
//! ([`ApiError`]).
//!
//! Every endpoint, health included, requires a controller token: the agent has nothing to say to
//! anyone else, except `/metrics`, which tells only counts and timings, for Prometheus. Handlers do no retries; applying runs on the blocking pool because `nft` is a
//! child process. Request bodies are parsed with `serde_path_to_error` so a malformed table is
//! answered with the path of the bad entry (`routes[2].masked`).

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};

use gsaas_infra::httpd::{read_body_within, BodyError};
use rodvr_contract::auth::TokenVerifier;
use rodvr_contract::protocol::{
    AppliedState, ApplyStatus, ErrorBody, Health, HostReport, RouteTable,
};
use rodvr_contract::version;
use rodvr_core::agent::{Agent, AgentError};
use rodvr_core::firewall::Firewall;

/// Large enough for tens of thousands of routes.
const MAX_BODY_BYTES: usize = 64 << 20;

/// What follows a table's answer, in the background: the servers start again what the table
/// used up (see [`Agent::replenish_servers`]), and the conntrack entries of connections the last
/// tables re-targeted are cut (see [`Agent::tidy_connections`]; one that fails is retried on the
/// retry timer).
pub fn after_answer<F: Firewall + 'static>(agent: Arc<Agent<F>>) {
    let replenishing = agent.clone();
    tokio::task::spawn_blocking(move || replenishing.replenish_servers());
    if !agent.connections_to_tidy() {
        return;
    }
    tokio::task::spawn_blocking(move || {
        if let Err(e) = agent.tidy_connections() {
            log_error("cutting re-targeted connections", &e);
        }
    });
}

/// Writes `err` and its whole source chain to stderr.
pub fn log_error(context: &str, err: &dyn std::error::Error) {
    let mut line = format!("rodvr-agent: {context}: {err}");
    let mut source = err.source();
    while let Some(s) = source {
        line.push_str(&format!(": {s}"));
        source = s.source();
    }
    eprintln!("{line}");
}

/// An [`AgentError`] as the API answers it.
#[derive(Debug)]
pub struct ApiError(pub AgentError);

impl From<AgentError> for ApiError {
    fn from(error: AgentError) -> Self {
        Self(error)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let error = &self.0;
        let (status, message) = match error {
            AgentError::Unauthorized => (StatusCode::UNAUTHORIZED, error.to_string()),
            AgentError::Malformed(_) => (StatusCode::BAD_REQUEST, error.to_string()),
            AgentError::Invalid(entry) => {
                (StatusCode::UNPROCESSABLE_ENTITY, format!("{error}: {entry}"))
            }
            AgentError::Conflict(why) => (StatusCode::CONFLICT, format!("{error}: {why}")),
            AgentError::Persist(_) => (StatusCode::INTERNAL_SERVER_ERROR, error.to_string()),
            AgentError::Apply(_) => (StatusCode::SERVICE_UNAVAILABLE, error.to_string()),
        };
        if status.is_server_error() {
            log_error("request failed", error);
        }
        let entry = match error {
            AgentError::Invalid(invalid) => Some(invalid.entry.clone()),
            _ => None,
        };
        (status, Json(ErrorBody { error: message, entry })).into_response()
    }
}

/// The agent's API. `body_timeout`: how long a request's body may take to arrive (read only
/// after its token was checked).
pub fn router<F: Firewall + 'static>(
    agent: Arc<Agent<F>>,
    verifier: Arc<TokenVerifier>,
    body_timeout: Duration,
) -> Router {
    Router::new()
        .route("/v1/health", get(health::<F>))
        .route("/v1/routes", get(get_routes::<F>).put(put_routes::<F>))
        .route("/v1/host", get(host::<F>))
        .layer(middleware::from_fn_with_state(body_timeout, read_body))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(middleware::from_fn(check_protocol))
        .layer(middleware::from_fn_with_state(verifier, require_controller))
        // Added after the token layer: Prometheus scrapes without the controller's key.
        .route("/metrics", get(metrics::<F>))
        .with_state(agent)
}

async fn require_controller(
    State(verifier): State<Arc<TokenVerifier>>,
    request: Request,
    next: Next,
) -> Result<Response, ApiError> {
    let token = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    match token {
        Some(token) if verifier.verify(token) => Ok(next.run(request).await),
        _ => Err(AgentError::Unauthorized.into()),
    }
}

/// Refuses a controller outside the skew policy (409, saying which side to upgrade) before its
/// request does anything, and says this agent's protocol in the answer (see
/// [`rodvr_contract::version`]).
async fn check_protocol(request: Request, next: Next) -> Response {
    let header = request.headers().get(version::HEADER).map(|v| v.to_str().unwrap_or("?"));
    let checked = version::check_controller(header);
    let mut response = match checked {
        Ok(_) => next.run(request).await,
        Err(skew) => {
            let body = Json(ErrorBody { error: skew.to_string(), entry: None });
            (StatusCode::CONFLICT, body).into_response()
        }
    };
    response.headers_mut().insert(version::HEADER, version::PROTOCOL.into());
    response
}

/// Reads the whole body within the deadline (see [`gsaas_infra::httpd`]).
async fn read_body(State(timeout): State<Duration>, request: Request, next: Next) -> Response {
    match read_body_within(request, MAX_BODY_BYTES, timeout).await {
        Ok(request) => next.run(request).await,
        Err(e) => {
            let status = match e {
                BodyError::TimedOut(_) => StatusCode::REQUEST_TIMEOUT,
                BodyError::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
                BodyError::Failed(_) => StatusCode::BAD_REQUEST,
            };
            let body = Json(ErrorBody { error: e.to_string(), entry: None });
            (status, [(header::CONNECTION, "close")], body).into_response()
        }
    }
}

async fn metrics<F: Firewall + 'static>(State(agent): State<Arc<Agent<F>>>) -> Response {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], agent.metrics()).into_response()
}

async fn health<F: Firewall + 'static>(State(agent): State<Arc<Agent<F>>>) -> Json<Health> {
    Json(agent.health())
}

async fn host<F: Firewall + 'static>(State(agent): State<Arc<Agent<F>>>) -> Json<HostReport> {
    Json(agent.host_report())
}

async fn get_routes<F: Firewall + 'static>(
    State(agent): State<Arc<Agent<F>>>,
) -> Json<AppliedState> {
    Json(agent.state())
}

async fn put_routes<F: Firewall + 'static>(
    State(agent): State<Arc<Agent<F>>>,
    body: Bytes,
) -> Result<Json<ApplyStatus>, ApiError> {
    let table = parse_table(&body)?;
    let applying = agent.clone();
    match tokio::task::spawn_blocking(move || applying.put_table(table)).await {
        Ok(result) => {
            let status = result.map_err(ApiError)?;
            // The filters already hold re-targeted connections to their routes; their conntrack
            // entries go after the answer, with the spares the table used.
            after_answer(agent);
            Ok(Json(status))
        }
        Err(join) => std::panic::resume_unwind(join.into_panic()),
    }
}

fn parse_table(body: &[u8]) -> Result<RouteTable, AgentError> {
    let de = &mut serde_json::Deserializer::from_slice(body);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        // serde_json's message ends with "at line L column C"; the path says more.
        let reason = inner.to_string();
        let reason = reason.split(" at line ").next().unwrap_or(&reason).to_owned();
        AgentError::Malformed(if path == "." { reason } else { format!("{path}: {reason}") })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn malformed_bodies_name_the_entry() {
        let body = br#"{"generation": 1, "routes": [{"vm": "00000000-0000-0000-0000-000000000001",
            "vm_ip": "10.0.0.2", "masked": "100.127.0.1:70000", "target": "10.1.0.2:8308"}]}"#;
        let err = parse_table(body).unwrap_err().to_string();
        assert!(err.contains("routes[0].masked"), "{err}");
        let err = parse_table(br#"{"generation": 1, "routes": [{"vm": "x"}]}"#).unwrap_err();
        assert!(err.to_string().contains("routes[0].vm"), "{err}");
    }
}
