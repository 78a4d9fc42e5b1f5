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

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use serde_json::{json, Value};

use crate::client::{exit, Failure};

/// Keystone v3 password credentials, project-scoped.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Password {
    pub auth_url: String,
    pub username: Option<String>,
    pub user_id: Option<String>,
    pub password: String,
    pub project_name: Option<String>,
    pub project_id: Option<String>,
    pub user_domain_name: Option<String>,
    pub user_domain_id: Option<String>,
    pub project_domain_name: Option<String>,
    pub project_domain_id: Option<String>,
    /// Where the settings came from, for error messages.
    pub origin: String,
}

impl std::fmt::Debug for Password {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Password")
            .field("auth_url", &self.auth_url)
            .field("username", &self.username)
            .field("user_id", &self.user_id)
            .field("password", &"<redacted>")
            .field("project_name", &self.project_name)
            .field("project_id", &self.project_id)
            .field("origin", &self.origin)
            .finish_non_exhaustive()
    }
}

/// OpenStack credentials found in the environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Credentials {
    /// `OS_TOKEN`: already a Keystone token.
    Token(String),
    /// Password credentials to exchange for a token.
    Password(Box<Password>),
}

#[derive(Debug, Deserialize)]
struct CloudsFile {
    #[serde(default)]
    clouds: BTreeMap<String, CloudEntry>,
}

#[derive(Debug, Default, Deserialize)]
struct CloudEntry {
    #[serde(default)]
    auth: AuthEntry,
    auth_type: Option<String>,
    identity_api_version: Option<serde_norway::Value>,
}

#[derive(Debug, Default, Deserialize)]
struct AuthEntry {
    auth_url: Option<String>,
    username: Option<String>,
    user_id: Option<String>,
    password: Option<String>,
    project_name: Option<String>,
    project_id: Option<String>,
    user_domain_name: Option<String>,
    user_domain_id: Option<String>,
    project_domain_name: Option<String>,
    project_domain_id: Option<String>,
    token: Option<String>,
}

/// Where openstacksdk looks for clouds.yaml, in order.
pub fn clouds_yaml_candidates(env: &dyn Fn(&str) -> Option<String>) -> Vec<PathBuf> {
    let mut paths = Vec::new();
    if let Some(file) = env("OS_CLIENT_CONFIG_FILE") {
        paths.push(PathBuf::from(file));
    }
    paths.push(PathBuf::from("clouds.yaml"));
    if let Some(xdg) = env("XDG_CONFIG_HOME") {
        paths.push(Path::new(&xdg).join("openstack/clouds.yaml"));
    } else if let Some(home) = env("HOME") {
        paths.push(Path::new(&home).join(".config/openstack/clouds.yaml"));
    }
    paths.push(PathBuf::from("/etc/openstack/clouds.yaml"));
    paths
}

/// The OpenStack credentials of `env`, or `None` when it names none (no `OS_TOKEN`, `OS_CLOUD`
/// or `OS_AUTH_URL`).
pub fn credentials(env: &dyn Fn(&str) -> Option<String>) -> Result<Option<Credentials>, Failure> {
    let env = |name: &str| env(name).filter(|v| !v.trim().is_empty());
    if let Some(token) = env("OS_TOKEN") {
        return Ok(Some(Credentials::Token(token.trim().to_owned())));
    }
    let cloud = env("OS_CLOUD");
    if cloud.is_none() && env("OS_AUTH_URL").is_none() {
        return Ok(None);
    }
    let mut settings = Password::default();
    let mut origin = "the OS_* variables".to_owned();
    if let Some(cloud) = cloud {
        let candidates = clouds_yaml_candidates(&env);
        let Some(path) = candidates.iter().find(|p| p.is_file()) else {
            let looked =
                candidates.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ");
            return Err(Failure::usage(format!(
                "OS_CLOUD={cloud}: no clouds.yaml found (looked at {looked})"
            )));
        };
        let entry = read_cloud(path, &cloud)?;
        origin = format!("cloud {cloud} of clouds.yaml {}", path.display());
        if let Some(version) = &entry.identity_api_version {
            let v = match version {
                serde_norway::Value::String(s) => s.clone(),
                serde_norway::Value::Number(n) => n.to_string(),
                other => format!("{other:?}"),
            };
            if !v.starts_with('3') {
                return Err(Failure::usage(format!(
                    "{origin}: identity_api_version {v}: only Keystone v3 is supported"
                )));
            }
        }
        let auth = entry.auth;
        let token_auth = entry.auth_type.as_deref().is_some_and(|t| t.contains("token"));
        if let Some(token) = auth.token.filter(|_| token_auth) {
            return Ok(Some(Credentials::Token(token)));
        }
        settings = Password {
            auth_url: auth.auth_url.unwrap_or_default(),
            username: auth.username,
            user_id: auth.user_id,
            password: auth.password.unwrap_or_default(),
            project_name: auth.project_name,
            project_id: auth.project_id,
            user_domain_name: auth.user_domain_name,
            user_domain_id: auth.user_domain_id,
            project_domain_name: auth.project_domain_name,
            project_domain_id: auth.project_domain_id,
            origin: String::new(),
        };
    }
    let overrides: [(&mut Option<String>, &str); 8] = [
        (&mut settings.username, "OS_USERNAME"),
        (&mut settings.user_id, "OS_USER_ID"),
        (&mut settings.project_name, "OS_PROJECT_NAME"),
        (&mut settings.project_id, "OS_PROJECT_ID"),
        (&mut settings.user_domain_name, "OS_USER_DOMAIN_NAME"),
        (&mut settings.user_domain_id, "OS_USER_DOMAIN_ID"),
        (&mut settings.project_domain_name, "OS_PROJECT_DOMAIN_NAME"),
        (&mut settings.project_domain_id, "OS_PROJECT_DOMAIN_ID"),
    ];
    for (field, name) in overrides {
        if let Some(value) = env(name) {
            *field = Some(value);
        }
    }
    // OS_TENANT_NAME/OS_TENANT_ID: the Keystone v2 names, still set by old openrc files.
    if settings.project_name.is_none() {
        settings.project_name = env("OS_TENANT_NAME");
    }
    if settings.project_id.is_none() {
        settings.project_id = env("OS_TENANT_ID");
    }
    if let Some(url) = env("OS_AUTH_URL") {
        settings.auth_url = url;
    }
    if let Some(password) = env("OS_PASSWORD") {
        settings.password = password;
    }
    if let Some(version) = env("OS_IDENTITY_API_VERSION").filter(|v| !v.starts_with('3')) {
        return Err(Failure::usage(format!(
            "OS_IDENTITY_API_VERSION={version}: only Keystone v3 is supported"
        )));
    }
    settings.origin = origin;
    settings.check()?;
    Ok(Some(Credentials::Password(Box::new(settings))))
}

fn read_cloud(path: &Path, cloud: &str) -> Result<CloudEntry, Failure> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Failure::usage(format!("cannot read clouds.yaml {}: {e}", path.display())))?;
    let mut file: CloudsFile = serde_norway::from_str(&text).map_err(|e| {
        Failure::usage(format!("invalid clouds.yaml {}: {}", path.display(), one_line(&e)))
    })?;
    file.clouds.remove(cloud).ok_or_else(|| {
        Failure::usage(format!("clouds.yaml {} has no cloud named {cloud:?}", path.display()))
    })
}

fn one_line(e: &dyn std::fmt::Display) -> String {
    e.to_string().split_whitespace().collect::<Vec<_>>().join(" ")
}

impl Password {
    /// Refuses incomplete or unusable settings, naming what is missing and where it was looked for.
    fn check(&self) -> Result<(), Failure> {
        let missing = |what: &str| {
            Failure::usage(format!("incomplete OpenStack credentials in {}: {what}", self.origin))
        };
        if self.auth_url.is_empty() {
            return Err(missing("auth_url (OS_AUTH_URL) is missing"));
        }
        if !self.auth_url.starts_with("http://") {
            return Err(Failure::usage(format!(
                "{}: auth_url {:?} is not an http:// URL (this gsaas speaks plain http only; \
                 use a local TLS proxy for https)",
                self.origin, self.auth_url
            )));
        }
        if self.username.is_none() && self.user_id.is_none() {
            return Err(missing("username (OS_USERNAME) or user_id (OS_USER_ID) is missing"));
        }
        if self.password.is_empty() {
            return Err(missing("password (OS_PASSWORD) is missing"));
        }
        if self.project_name.is_none() && self.project_id.is_none() {
            return Err(missing(
                "project_name (OS_PROJECT_NAME) or project_id (OS_PROJECT_ID) is missing",
            ));
        }
        Ok(())
    }

    /// Keystone's v3 base URL (`.../v3`, no trailing slash).
    pub fn identity_v3(&self) -> String {
        let base = self.auth_url.trim_end_matches('/');
        if base.ends_with("/v3") {
            base.to_owned()
        } else {
            format!("{base}/v3")
        }
    }

    /// The body of `POST /v3/auth/tokens`: password method, project scope. A name without a domain
    /// is in Keystone's `default` domain, as openstacksdk assumes.
    pub fn auth_body(&self) -> Value {
        let domain = |id: &Option<String>, name: &Option<String>| match (id, name) {
            (Some(id), _) => json!({ "id": id }),
            (None, Some(name)) => json!({ "name": name }),
            (None, None) => json!({ "id": "default" }),
        };
        let user = match &self.user_id {
            Some(id) => json!({ "id": id, "password": self.password }),
            None => json!({
                "name": self.username,
                "domain": domain(&self.user_domain_id, &self.user_domain_name),
                "password": self.password,
            }),
        };
        let project = match &self.project_id {
            Some(id) => json!({ "id": id }),
            None => json!({
                "domain": domain(&self.project_domain_id, &self.project_domain_name),
                "name": self.project_name,
            }),
        };
        json!({
            "auth": {
                "identity": { "methods": ["password"], "password": { "user": user } },
                "scope": { "project": project },
            }
        })
    }

    /// A project-scoped token from Keystone.
    pub fn issue_token(&self) -> Result<String, Failure> {
        let url = format!("{}/auth/tokens", self.identity_v3());
        let http = reqwest::blocking::Client::builder()
            .timeout(Duration::from_secs(30))
            .connect_timeout(Duration::from_secs(5))
            .build()
            .expect("an HTTP client builds");
        let response = http.post(&url).json(&self.auth_body()).send().map_err(|e| {
            let why = if e.is_connect() {
                "connection refused or no route"
            } else if e.is_timeout() {
                "timed out"
            } else {
                "the request failed"
            };
            Failure {
                message: format!("cannot reach Keystone at {url}: {why}"),
                code: exit::UNAVAILABLE,
            }
        })?;
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
            200..=299 => token.filter(|t| !t.is_empty()).ok_or_else(|| Failure {
                message: format!("Keystone at {url} answered without an X-Subject-Token"),
                code: exit::UNAVAILABLE,
            }),
            500.. => Err(Failure {
                message: format!("Keystone at {url} failed: HTTP {status}{detail}"),
                code: exit::UNAVAILABLE,
            }),
            _ => Err(Failure {
                message: format!(
                    "Keystone refused the credentials of {} (HTTP {status}{detail})",
                    self.origin
                ),
                code: exit::AUTH,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env_of(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let vars: BTreeMap<String, String> =
            vars.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        move |name| vars.get(name).cloned()
    }

    #[test]
    fn nothing_set_means_no_openstack_credentials() {
        assert_eq!(credentials(&env_of(&[("HOME", "/nonexistent")])).unwrap(), None);
    }

    #[test]
    fn os_token_is_used_as_is() {
        let env = env_of(&[("OS_TOKEN", "gAAAA "), ("OS_AUTH_URL", "http://k:5000")]);
        assert_eq!(credentials(&env).unwrap(), Some(Credentials::Token("gAAAA".into())));
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
        assert_eq!(p.auth_body(), upstream);
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
