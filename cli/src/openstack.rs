//! OpenStack credentials for a gsaasd that uses Keystone (`[auth] mode = "keystone"`).
//!
//! When no gsaasd token is given, `gsaas` takes what the `openstack` client would: `OS_TOKEN`
//! directly, or the cloud `OS_CLOUD` of clouds.yaml (searched in openstacksdk's order:
//! `OS_CLIENT_CONFIG_FILE`, `./clouds.yaml`, `~/.config/openstack/clouds.yaml`,
//! `/etc/openstack/clouds.yaml`) with any `OS_*` variable on top, or the `OS_*` variables alone.
//! Password credentials are exchanged for a project-scoped token by Keystone v3 password auth
//! (`POST {auth_url}/v3/auth/tokens`, token in `X-Subject-Token`), done once, lazily, on the first
//! request; the token goes to gsaasd as `X-Auth-Token`.
//!
//! Failures are one line: incomplete or invalid credentials exit 2 (naming the missing field and the
//! clouds.yaml path), Keystone refusing them exits 5, Keystone unreachable or failing exits 6.
//! The environment is a lookup function so unit tests never touch the process's variables.

use std::time::Duration;

use openstack_config::catalog::CatalogEntry;
use openstack_config::{AuthSettings, ConfigError};
use serde_json::Value;

use crate::failure::{exit, unreachable, Failure};

/// OpenStack credentials found in the environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Credentials {
    /// `OS_TOKEN`, or a cloud with `auth_type: token`: already a Keystone token.
    Token(String, Where),
    /// Password credentials to exchange for a token.
    Password(Box<AuthSettings>),
}

/// Where a token's catalog comes from and which of its endpoints to take, for a token given as
/// is (a password login's token brings its catalog).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Where {
    /// Keystone's v3 URL (`OS_AUTH_URL`, or the cloud's `auth_url`).
    pub identity_v3: Option<String>,
    pub interface: Option<String>,
    pub region: Option<String>,
    /// The CA bundle that Keystone's certificate chains to (`OS_CACERT`, the cloud's `cacert`).
    pub cacert: Option<std::path::PathBuf>,
}

/// The service type GSaaS is registered under in the Keystone catalog (docs/operator/openstack.md:
/// "Registering GSaaS in the catalog").
pub const SERVICE_TYPE: &str = "gpu-scheduling";

/// The OpenStack credentials of `env`, or `None` when it names none (no `OS_TOKEN`, `OS_CLOUD`
/// or `OS_AUTH_URL`).
pub fn credentials(env: &dyn Fn(&str) -> Option<String>) -> Result<Option<Credentials>, Failure> {
    let env = |name: &str| env(name).filter(|v| !v.trim().is_empty());
    if let Some(token) = env("OS_TOKEN") {
        let identity_v3 = env("OS_AUTH_URL").map(|url| {
            let url = url.trim().trim_end_matches('/');
            if url.ends_with("/v3") {
                url.to_owned()
            } else {
                format!("{url}/v3")
            }
        });
        let place = Where {
            identity_v3,
            interface: env("OS_INTERFACE"),
            region: env("OS_REGION_NAME"),
            cacert: env("OS_CACERT").map(std::path::PathBuf::from),
        };
        return Ok(Some(Credentials::Token(token.trim().to_owned(), place)));
    }
    if env("OS_CLOUD").is_none() && env("OS_AUTH_URL").is_none() {
        return Ok(None);
    }
    let mut settings = AuthSettings::load(None, None, &env).map_err(|e| usage(&e))?;
    Ok(Some(match settings.token.take() {
        Some(token) => {
            let place = Where {
                identity_v3: Some(settings.identity_v3()),
                interface: Some(settings.interface.clone()).filter(|i| !i.is_empty()),
                region: settings.region_name.clone(),
                cacert: settings.cacert.clone(),
            };
            Credentials::Token(token, place)
        }
        None => Credentials::Password(Box::new(settings)),
    }))
}

/// A credentials problem as a one-line usage failure, with its cause.
fn usage(e: &ConfigError) -> Failure {
    let cause = std::error::Error::source(e).map(|s| format!(": {}", one_line(&s)));
    Failure::usage(format!("{e}{}", cause.unwrap_or_default()))
}

fn one_line(e: &dyn std::fmt::Display) -> String {
    e.to_string().split_whitespace().collect::<Vec<_>>().join(" ")
}

/// An HTTP client for Keystone, trusting `cacert` too if given.
fn keystone_client(cacert: Option<&std::path::Path>) -> Result<reqwest::blocking::Client, Failure> {
    let mut builder = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(30))
        .connect_timeout(Duration::from_secs(5));
    if let Some(path) = cacert {
        let unusable = |e: &dyn std::fmt::Display| {
            Failure::usage(format!("cannot use the CA bundle {}: {}", path.display(), one_line(e)))
        };
        let pem = std::fs::read(path).map_err(|e| unusable(&e))?;
        for certificate in reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| unusable(&e))? {
            builder = builder.add_root_certificate(certificate);
        }
    }
    Ok(builder.build().expect("an HTTP client builds"))
}

/// A Keystone token and the catalog it came with.
#[derive(Debug, Clone)]
pub struct Issued {
    pub token: String,
    pub catalog: Vec<CatalogEntry>,
}

/// A project-scoped token from Keystone for `settings` (checked password credentials), with its
/// catalog.
pub fn issue_token(settings: &AuthSettings) -> Result<Issued, Failure> {
    let url = format!("{}/auth/tokens", settings.identity_v3());
    let http = keystone_client(settings.cacert.as_deref())?;
    let response = http
        .post(&url)
        .json(&settings.password_auth_body())
        .send()
        .map_err(|e| unreachable(&format!("Keystone at {url}"), &e))?;
    let status = response.status().as_u16();
    let token = response
        .headers()
        .get("x-subject-token")
        .and_then(|v| v.to_str().ok())
        .map(|v| v.trim().to_owned());
    let body: Value =
        serde_json::from_str(&response.text().unwrap_or_default()).unwrap_or(Value::Null);
    let detail = body["error"]["message"]
        .as_str()
        .map(|m| format!(": {}", one_line(&m)))
        .unwrap_or_default();
    match status {
        200..=299 => {
            let token = token.filter(|t| !t.is_empty()).ok_or_else(|| Failure {
                message: format!("Keystone at {url} answered without an X-Subject-Token"),
                code: exit::UNAVAILABLE,
            })?;
            let catalog =
                serde_json::from_value(body["token"]["catalog"].clone()).unwrap_or_default();
            Ok(Issued { token, catalog })
        }
        500.. => Err(Failure {
            message: format!("Keystone at {url} failed: HTTP {status}{detail}"),
            code: exit::UNAVAILABLE,
        }),
        _ => Err(Failure {
            message: format!(
                "Keystone refused the credentials of {} (HTTP {status}{detail})",
                settings.origin
            ),
            code: exit::AUTH,
        }),
    }
}

/// The catalog of a token given as is: `GET /v3/auth/catalog`.
pub fn catalog_of(token: &str, place: &Where) -> Result<Vec<CatalogEntry>, Failure> {
    let Some(identity) = &place.identity_v3 else {
        return Err(Failure::usage(
            "no gsaasd URL: pass --url (or GSAAS_URL), or set OS_AUTH_URL so that gsaas finds \
             gsaasd in OS_TOKEN's service catalog",
        ));
    };
    let url = format!("{identity}/auth/catalog");
    let response = keystone_client(place.cacert.as_deref())?
        .get(&url)
        .header("X-Auth-Token", token)
        .send()
        .map_err(|e| unreachable(&format!("Keystone at {url}"), &e))?;
    let status = response.status().as_u16();
    let body: Value =
        serde_json::from_str(&response.text().unwrap_or_default()).unwrap_or(Value::Null);
    match status {
        200..=299 => serde_json::from_value(body["catalog"].clone()).map_err(|e| Failure {
            message: format!("Keystone at {url} answered a catalog gsaas cannot read: {e}"),
            code: exit::UNAVAILABLE,
        }),
        401 | 403 | 404 => Err(Failure {
            message: format!("Keystone refused OS_TOKEN (HTTP {status}): it is invalid or expired"),
            code: exit::AUTH,
        }),
        _ => Err(Failure {
            message: format!("Keystone at {url} failed: HTTP {status}"),
            code: exit::UNAVAILABLE,
        }),
    }
}

/// gsaasd's URL in `catalog`, for `interface` (default public) and `region` (default any).
pub fn gsaasd_url(
    catalog: &[CatalogEntry],
    interface: Option<&str>,
    region: Option<&str>,
) -> Result<String, Failure> {
    let interface = interface.unwrap_or("public");
    if !matches!(interface.trim_end_matches("URL"), "public" | "internal" | "admin") {
        return Err(Failure::usage(format!(
            "--os-interface {interface:?}: expected public, internal or admin"
        )));
    }
    openstack_config::catalog::endpoint(catalog, SERVICE_TYPE, interface, region).map_err(|e| {
        Failure::usage(format!(
            "cannot find gsaasd: {e}; is GSaaS registered in Keystone (docs/operator/openstack.md: \
             \"Registering GSaaS in the catalog\"), or pass --url"
        ))
    })
}

#[cfg(test)]
mod tests {
    use openstack_config::fixed_env as env_of;

    use super::*;

    #[test]
    fn nothing_set_means_no_openstack_credentials() {
        assert_eq!(credentials(&env_of(&[("HOME", "/nonexistent")])).unwrap(), None);
    }

    #[test]
    fn os_token_is_used_as_is() {
        let env = env_of(&[("OS_TOKEN", "gAAAA "), ("OS_AUTH_URL", "http://k:5000")]);
        let place = Where { identity_v3: Some("http://k:5000/v3".into()), ..Where::default() };
        assert_eq!(credentials(&env).unwrap(), Some(Credentials::Token("gAAAA".into(), place)));
    }

    #[test]
    fn the_body_has_keystones_shape() {
        let env = env_of(&[
            ("OS_AUTH_URL", "http://keystone:5000/v3/"),
            ("OS_USER_ID", "ee4dfb6e5540447cb3741905149d9b6e"),
            ("OS_PASSWORD", "devstacker"),
            ("OS_PROJECT_NAME", "admin"),
        ]);
        let Some(Credentials::Password(p)) = credentials(&env).unwrap() else { panic!() };
        assert_eq!(p.identity_v3(), "http://keystone:5000/v3");
        let upstream: Value = serde_json::from_str(include_str!(
            "../../api/tests/fixtures/openstack/keystone/auth_requests_project-name-password.json"
        ))
        .unwrap();
        assert_eq!(p.password_auth_body(), upstream);
    }

    #[test]
    fn missing_fields_are_named() {
        let env = env_of(&[("OS_AUTH_URL", "http://k:5000"), ("OS_USERNAME", "u")]);
        let e = credentials(&env).unwrap_err();
        assert_eq!(e.code, exit::USAGE);
        assert!(e.message.contains("OS_PASSWORD"), "{}", e.message);
        let env = env_of(&[("OS_CLOUD", "x"), ("HOME", "/nonexistent")]);
        let e = credentials(&env).unwrap_err();
        assert!(e.message.contains("/nonexistent/.config/openstack/clouds.yaml"), "{}", e.message);
    }
}
