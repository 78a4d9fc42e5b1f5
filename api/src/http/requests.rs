//! Every request gets an id, and one log line when it is answered.
//!
//! The id is gsaasd's own (a client's `X-Request-Id` is not trusted: a client could make its
//! requests' log lines look like another's). It is answered in the `X-Request-Id` header and in
//! every problem document, and the lines logged while the request is served carry it, so an
//! operator goes from a tenant's error report to the logs of that request. The log line names
//! the route's template (`/v1/vms/{id}`), never the path or the query: ids and names in them are
//! tenants' data.

use std::time::Instant;

use axum::extract::{MatchedPath, Request};
use axum::http::HeaderValue;
use axum::middleware::Next;
use axum::response::Response;
use tracing::Instrument;

/// The response header that carries the request's id.
pub const REQUEST_ID_HEADER: &str = "x-request-id";

pub use crate::error::current_request_id;
use crate::error::REQUEST_ID;

/// Names the request, serves it inside its span and logs its answer: method, route, status and
/// latency.
pub async fn trace_requests(request: Request, next: Next) -> Response {
    let id = uuid::Uuid::new_v4().to_string();
    let method = request.method().clone();
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_owned(), |p| p.as_str().to_owned());
    let span = tracing::info_span!("request", request_id = %id, method = %method, route = %route);
    let started = Instant::now();
    let mut response = REQUEST_ID.scope(id.clone(), next.run(request)).instrument(span).await;
    let latency_ms = started.elapsed().as_secs_f64() * 1000.0;
    tracing::info!(
        request_id = %id,
        method = %method,
        route = %route,
        status = response.status().as_u16(),
        latency_ms,
        "request"
    );
    let value = HeaderValue::from_str(&id).expect("a UUID is a header value");
    response.headers_mut().insert(REQUEST_ID_HEADER, value);
    response
}
