//! Version discovery, as OpenStack services answer it at their root: `GET /` with `Accept:
//! application/json` lists the API's versions (Nova's form: `id`, `status`, `links`), and
//! `GET /v1/` describes v1. A browser's `GET /` (HTML) gets the dashboard, as before. The
//! software's own version and commit are not told to anonymous callers (`gsaasd --version`
//! says them to the operator).

use axum::http::{header, HeaderMap};
use axum::response::{IntoResponse, Response};
use axum::Json;
use gsaas_api_types::{ApiVersion, ApiVersionDocument, ApiVersions, Link};

/// The API's one version.
fn v1() -> ApiVersion {
    ApiVersion {
        id: "v1".to_owned(),
        status: "CURRENT".to_owned(),
        links: vec![Link { rel: "self".to_owned(), href: "/v1/".to_owned() }],
    }
}

/// Whether the caller asks for JSON rather than a page.
fn wants_json(headers: &HeaderMap) -> bool {
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()).unwrap_or_default();
    accept.contains("application/json") && !accept.contains("text/html")
}

/// The API's versions (with `Accept: application/json`), or the dashboard.
#[utoipa::path(get, path = "/", tag = "service",
    responses((status = 200,
        description = "The API's versions with `Accept: application/json`; else the dashboard (HTML)",
        content((ApiVersions = "application/json"), (String = "text/html; charset=utf-8")))))]
pub(super) async fn root(headers: HeaderMap) -> Response {
    if wants_json(&headers) {
        Json(ApiVersions { versions: vec![v1()] }).into_response()
    } else {
        crate::dashboard::index()
    }
}

/// The v1 API.
#[utoipa::path(get, path = "/v1/", tag = "service",
    responses((status = 200, body = ApiVersionDocument)))]
pub(super) async fn version_v1() -> Json<ApiVersionDocument> {
    Json(ApiVersionDocument { version: v1() })
}
