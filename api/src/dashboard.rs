//! The web dashboard: plain HTML, CSS and JavaScript embedded in the binary and served at `/` and
//! `/dashboard`.
//!
//! It is a client of the same-origin REST API and nothing more: it signs in with a pasted gsaasd
//! token (kept in the tab's `sessionStorage`, sent as `Authorization: Bearer`) or, in Keystone
//! mode, with an OpenStack account through gsaasd (`/v1/auth/tokens`: the tokens stay in the
//! page's memory, go out as `X-Auth-Token`, and are revoked at sign-out), shows the pool (admins: per host
//! and GPU, a memory bar per GPU with a segment per VM; tenants: totals only, as the API gives
//! them), the VMs with their state, cGPUs and Equation 5.1 stage timings, a launch form covering
//! every field of `LaunchRequest` (a problem's `field` is shown beside that field), attach (a
//! dialog with every field of `AttachRequest`) and detach (per cGPU) on ready VMs, terminate,
//! and, for admins, drain and undrain. The queue has a card of its own (the caller's waiting
//! launches and attaches in the order they are served, and how many wait at each priority), and
//! each VM shows its place in it, the attaches it waits for and its events (cGPUs taken back,
//! given back, attached from the queue). It refreshes itself every two seconds.
//!
//! Nothing is fetched from elsewhere, at build time or at run time: every asset is `include_str!`ed
//! here and served with its content type and a strict Content-Security-Policy (same-origin
//! scripts, styles, images and API calls only; no inline code, no framing).

use axum::http::{header, HeaderName, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

/// The policy every dashboard response carries.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
     style-src 'self'; img-src 'self' data:; connect-src 'self'; font-src 'self'; \
     base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

const INDEX_HTML: &str = include_str!("../assets/dashboard/index.html");
const APP_JS: &str = include_str!("../assets/dashboard/app.js");
const APP_CSS: &str = include_str!("../assets/dashboard/app.css");
const ICON_SVG: &str = include_str!("../assets/dashboard/icon.svg");

/// The dashboard's routes, to merge into the API's router.
pub fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route("/dashboard", get(|| async { asset("text/html; charset=utf-8", INDEX_HTML) }))
        .route("/dashboard/", get(|| async { asset("text/html; charset=utf-8", INDEX_HTML) }))
        .route(
            "/dashboard/app.js",
            get(|| async { asset("text/javascript; charset=utf-8", APP_JS) }),
        )
        .route("/dashboard/app.css", get(|| async { asset("text/css; charset=utf-8", APP_CSS) }))
        .route("/dashboard/icon.svg", get(|| async { asset("image/svg+xml", ICON_SVG) }))
}

/// The dashboard's page (also what `/` answers a browser).
pub fn index() -> Response {
    asset("text/html; charset=utf-8", INDEX_HTML)
}

/// An embedded asset with its type and the security headers. `no-cache` makes browsers revalidate,
/// so an upgraded gsaasd never runs against a stale script.
fn asset(content_type: &'static str, body: &'static str) -> Response {
    let headers = [
        (header::CONTENT_TYPE, HeaderValue::from_static(content_type)),
        (header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CONTENT_SECURITY_POLICY)),
        (header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff")),
        (header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY")),
        (header::REFERRER_POLICY, HeaderValue::from_static("no-referrer")),
        (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
        (
            HeaderName::from_static("cross-origin-opener-policy"),
            HeaderValue::from_static("same-origin"),
        ),
    ];
    (headers, body).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_loads_only_its_own_assets() {
        for (name, text) in [("index.html", INDEX_HTML), ("app.js", APP_JS), ("app.css", APP_CSS)] {
            for remote in ["http://", "https://", "//cdn", "@import"] {
                assert!(!text.contains(remote), "{name} refers to {remote}");
            }
        }
        assert!(INDEX_HTML.contains(r#"<script src="/dashboard/app.js" defer></script>"#));
        assert!(INDEX_HTML.contains(r#"href="/dashboard/app.css""#));
        assert!(!INDEX_HTML.contains("<script>"), "no inline script: the CSP forbids it");
        assert!(!INDEX_HTML.contains("style="), "no inline style: the CSP forbids it");
    }
}
