//! The checked-in OpenAPI document (`openapi/gsaas.json`) is the one the code generates.

#[test]
fn the_checked_in_openapi_document_is_current() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../openapi/gsaas.json");
    let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
    let generated = gsaasd::http::openapi_document();
    assert!(
        checked_in == generated,
        "{} is out of date; regenerate it with\n    cargo run -q -p gsaasd -- openapi > openapi/gsaas.json",
        path.display()
    );
    let doc: serde_json::Value = serde_json::from_str(&generated).unwrap();
    for path in [
        "/v1/vms",
        "/v1/vms/{id}",
        "/v1/pool",
        "/v1/hosts",
        "/v1/hosts/{name}",
        "/healthz",
        "/metrics",
    ] {
        assert!(doc["paths"].get(path).is_some(), "{path} undocumented");
    }
}
