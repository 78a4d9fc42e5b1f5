//! `/healthcheck` as oslo.middleware's healthcheck answers it, so OpenStack's load balancers and
//! monitoring (which probe every service there) need nothing of their own for gsaasd: `GET` 200
//! `OK`, or 503 with the reason; `HEAD` 204 (or 503) with no body; with `Accept:
//! application/json`, `{"detailed": false, "reasons": [...]}`. Healthy means the database
//! answers, as `/readyz` has it; like oslo's, it is not detailed (nothing of hosts or GPUs), so
//! it needs no token.

use axum::extract::State;
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;
use utoipa::ToSchema;

use super::AppState;

/// The JSON form of the answer (oslo.middleware's, not detailed).
#[derive(Debug, Serialize, ToSchema)]
pub struct HealthcheckAnswer {
    pub detailed: bool,
    pub reasons: Vec<String>,
}

/// What gsaasd answers `method` on `/healthcheck` when the database is `healthy`, in JSON when
/// the caller accepts it.
fn answer(method: &Method, healthy: bool, json: bool) -> Response {
    let (status, reason) = if healthy {
        (StatusCode::OK, "OK")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "the database does not answer")
    };
    if method == Method::HEAD {
        let status = if healthy { StatusCode::NO_CONTENT } else { status };
        return status.into_response();
    }
    if json {
        let body = HealthcheckAnswer { detailed: false, reasons: vec![reason.to_owned()] };
        return (status, Json(body)).into_response();
    }
    (status, [(header::CONTENT_TYPE, "text/plain; charset=UTF-8")], reason).into_response()
}

/// Oslo's health check (see the module docs).
#[utoipa::path(get, path = "/healthcheck", tag = "service",
    responses(
        (status = 200, description = "Healthy: `OK`, or the JSON form with `Accept: application/json`",
            content((String = "text/plain"), (HealthcheckAnswer = "application/json"))),
        (status = 503, description = "The database does not answer: the reason",
            content((String = "text/plain"), (HealthcheckAnswer = "application/json")))))]
pub async fn healthcheck(
    State(app): State<AppState>,
    method: Method,
    headers: HeaderMap,
) -> Response {
    let json = headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.split(',').any(|t| t.trim().starts_with("application/json")));
    answer(&method, app.db.ping().await.is_ok(), json)
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn body(response: Response) -> (u16, String) {
        let status = response.status().as_u16();
        let bytes = axum::body::to_bytes(response.into_body(), 1024).await.unwrap();
        (status, String::from_utf8(bytes.to_vec()).unwrap())
    }

    #[tokio::test]
    async fn answers_as_oslo_middleware_does() {
        assert_eq!(body(answer(&Method::GET, true, false)).await, (200, "OK".into()));
        assert_eq!(body(answer(&Method::HEAD, true, false)).await, (204, String::new()));
        assert_eq!(
            body(answer(&Method::GET, true, true)).await,
            (200, r#"{"detailed":false,"reasons":["OK"]}"#.into())
        );
        assert_eq!(
            body(answer(&Method::GET, false, false)).await,
            (503, "the database does not answer".into())
        );
        assert_eq!(
            body(answer(&Method::GET, false, true)).await,
            (503, r#"{"detailed":false,"reasons":["the database does not answer"]}"#.into())
        );
        assert_eq!(body(answer(&Method::HEAD, false, false)).await, (503, String::new()));
    }
}
