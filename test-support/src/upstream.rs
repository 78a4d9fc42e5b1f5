//! The upstream OpenStack samples of `api/tests/fixtures/openstack` (Apache-2.0 data), as the fake
//! services of the contract and Keystone-mode tests serve them.

use std::path::Path;
use std::time::SystemTime;

use gsaasd::openstack::time::format_rfc3339;
use serde_json::{json, Value};

pub fn fixture(path: &str) -> String {
    let full =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../api/tests/fixtures/openstack").join(path);
    std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("{}: {e}", full.display()))
}

pub fn fixture_json(path: &str) -> Value {
    serde_json::from_str(&fixture(path)).unwrap()
}

/// The upstream project-scoped token, its catalog pointing at `base`, expiring at `expires`.
pub fn token_body(base: &str, expires: SystemTime) -> Value {
    let text = fixture("keystone/auth-password-project-scoped-response.json")
        .replace("http://23.253.248.171:8774", &format!("{base}/nova"))
        .replace("http://23.253.248.171:9696", &format!("{base}/neutron"))
        .replace("http://23.253.248.171:9292", &format!("{base}/glance"));
    let mut body: Value = serde_json::from_str(&text).unwrap();
    body["token"]["expires_at"] = json!(format_rfc3339(expires));
    body
}
