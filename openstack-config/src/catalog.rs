//! Keystone's service catalog: where a service's endpoint is for an interface and a region, as
//! keystoneauth's `get_endpoint` finds it. gsaasd finds Nova, Neutron and Glance here; `gsaas`
//! finds gsaasd.

use serde::Deserialize;

/// One service of a token's catalog.
#[derive(Debug, Clone, Deserialize)]
pub struct CatalogEntry {
    #[serde(rename = "type")]
    pub service_type: String,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub endpoints: Vec<CatalogEndpoint>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct CatalogEndpoint {
    pub interface: String,
    pub url: String,
    #[serde(default)]
    pub region_id: Option<String>,
    #[serde(default)]
    pub region: Option<String>,
}

impl CatalogEndpoint {
    fn region(&self) -> Option<&str> {
        self.region_id.as_deref().or(self.region.as_deref())
    }
}

/// Why the catalog names no endpoint: no such service, or none for the interface and region
/// (with the ones it has, so the user knows what to ask for instead).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NoEndpoint {
    #[error("the service catalog has no {service_type} service")]
    NoService { service_type: String },
    #[error(
        "the service catalog's {service_type} service has no {interface} endpoint{} (it has: {})",
        region.as_ref().map(|r| format!(" in region {r}")).unwrap_or_default(),
        available.join(", ")
    )]
    NoMatch {
        service_type: String,
        interface: String,
        region: Option<String>,
        /// `interface in region` of each endpoint there is.
        available: Vec<String>,
    },
}

/// The URL (no trailing slash) of `service_type`'s endpoint for `interface` (`public`,
/// `internal`, `admin`; `publicURL` and the like are read as those) in `region` (any, if none):
/// the first such endpoint of the catalog.
pub fn endpoint(
    catalog: &[CatalogEntry],
    service_type: &str,
    interface: &str,
    region: Option<&str>,
) -> Result<String, NoEndpoint> {
    let interface = interface.trim_end_matches("URL");
    let mut services = catalog.iter().filter(|e| e.service_type == service_type).peekable();
    if services.peek().is_none() {
        return Err(NoEndpoint::NoService { service_type: service_type.to_owned() });
    }
    let endpoints: Vec<&CatalogEndpoint> = services.flat_map(|e| &e.endpoints).collect();
    endpoints
        .iter()
        .find(|e| e.interface == interface && region.is_none_or(|r| e.region() == Some(r)))
        .map(|e| e.url.trim_end_matches('/').to_owned())
        .ok_or_else(|| NoEndpoint::NoMatch {
            service_type: service_type.to_owned(),
            interface: interface.to_owned(),
            region: region.map(str::to_owned),
            available: endpoints
                .iter()
                .map(|e| format!("{} in {}", e.interface, e.region().unwrap_or("no region")))
                .collect(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn catalog() -> Vec<CatalogEntry> {
        serde_json::from_value(serde_json::json!([
            {"type": "compute", "endpoints": [
                {"interface": "public", "url": "http://nova/", "region_id": "R1"}]},
            {"type": "gpu-scheduling", "name": "gsaas", "endpoints": [
                {"interface": "internal", "url": "http://gsaas-int:8780", "region_id": "R1"},
                {"interface": "public", "url": "https://gsaas-r1/", "region_id": "R1"},
                {"interface": "public", "url": "https://gsaas-r2", "region": "R2"}]}
        ]))
        .unwrap()
    }

    #[test]
    fn the_interface_and_region_pick_the_endpoint() {
        let c = catalog();
        let find = |i, r| endpoint(&c, "gpu-scheduling", i, r);
        assert_eq!(find("public", None).unwrap(), "https://gsaas-r1");
        assert_eq!(find("publicURL", Some("R2")).unwrap(), "https://gsaas-r2");
        assert_eq!(find("internal", Some("R1")).unwrap(), "http://gsaas-int:8780");
        assert_eq!(endpoint(&c, "compute", "public", None).unwrap(), "http://nova");
    }

    #[test]
    fn what_is_missing_is_said_with_what_there_is() {
        let c = catalog();
        let e = endpoint(&c, "accelerator", "public", None).unwrap_err();
        assert_eq!(e.to_string(), "the service catalog has no accelerator service");
        let e = endpoint(&c, "gpu-scheduling", "internal", Some("R2")).unwrap_err();
        assert_eq!(
            e.to_string(),
            "the service catalog's gpu-scheduling service has no internal endpoint in region R2 \
             (it has: internal in R1, public in R1, public in R2)"
        );
    }
}
