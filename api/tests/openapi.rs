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

/// Each parameter is where the handler reads it: a path parameter is in its path's template,
/// and every parameter a path's template names is a path parameter.
#[test]
fn parameters_are_documented_where_they_are_read() {
    let doc: serde_json::Value = serde_json::from_str(&gsaasd::http::openapi_document()).unwrap();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, operation) in item.as_object().unwrap() {
            let params = operation["parameters"].as_array().cloned().unwrap_or_default();
            for p in &params {
                let name = p["name"].as_str().unwrap();
                let templated = path.contains(&format!("{{{name}}}"));
                assert_eq!(p["in"] == "path", templated, "{method} {path}: parameter {name}");
            }
            let templated = path.matches('{').count();
            let in_path = params.iter().filter(|p| p["in"] == "path").count();
            assert_eq!(templated, in_path, "{method} {path}: path parameters");
        }
    }
}
