//! OpenStack credentials in OpenStack's own terms: a cloud of `clouds.yaml` (`OS_CLOUD`) and the
//! `OS_*` variables, as `openstack` and openstacksdk read them.
//!
//! Both gsaasd (its service user) and the `gsaas` CLI (a tenant) take credentials the way operators
//! and tenants already keep them, so the reading lives here once. The order is openstacksdk's: the
//! named cloud of clouds.yaml first (searched in [`clouds_yaml_candidates`]), then any `OS_*`
//! variable overrides its field; empty variables count as unset. The environment is passed in as a
//! lookup function, so tests (which run in parallel) never touch the process's variables. Errors
//! name where a value came from: the clouds.yaml path and cloud, or the environment. Nothing here
//! talks to Keystone: callers build their request from [`AuthSettings::password_auth_body`].

pub mod catalog;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::{json, Value};

/// Looks up an environment variable.
pub type Env<'a> = &'a dyn Fn(&str) -> Option<String>;

/// An environment of exactly `vars`, for tests and for callers that gathered the variables
/// elsewhere.
pub fn fixed_env(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let vars: BTreeMap<String, String> =
        vars.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
    move |name| vars.get(name).cloned()
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read clouds.yaml {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid clouds.yaml {path}")]
    Parse {
        path: PathBuf,
        #[source]
        source: serde_norway::Error,
    },
    #[error("clouds.yaml {path} has no cloud named {cloud:?}")]
    NoSuchCloud { path: PathBuf, cloud: String },
    #[error("no clouds.yaml for cloud {cloud:?} (looked at {looked})")]
    NoCloudsYaml { cloud: String, looked: String },
    #[error("incomplete OpenStack credentials in {origin}: {field} is missing")]
    Missing { origin: String, field: &'static str },
    #[error("{origin}: {reason}")]
    Invalid { origin: String, reason: String },
}

/// Keystone v3 password credentials, project-scoped, and which endpoints to use.
#[derive(Clone, PartialEq, Eq, Default)]
pub struct AuthSettings {
    /// Keystone's URL, with or without the `/v3` suffix.
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
    /// Catalog region; `None` takes the first endpoint of the wanted interface.
    pub region_name: Option<String>,
    /// Catalog interface: `public`, `internal` or `admin`.
    pub interface: String,
    /// CA bundle (PEM) that https endpoints' certificates must chain to, besides the system's.
    pub cacert: Option<PathBuf>,
    /// A Keystone token given instead of a password (a cloud with `auth_type: token`).
    pub token: Option<String>,
    /// Where the settings came from, for error messages.
    pub origin: String,
}

impl std::fmt::Debug for AuthSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthSettings")
            .field("auth_url", &self.auth_url)
            .field("username", &self.username)
            .field("user_id", &self.user_id)
            .field("password", &"<redacted>")
            .field("project_name", &self.project_name)
            .field("project_id", &self.project_id)
            .field("region_name", &self.region_name)
            .field("interface", &self.interface)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("origin", &self.origin)
            .finish_non_exhaustive()
    }
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
    region_name: Option<String>,
    interface: Option<String>,
    cacert: Option<PathBuf>,
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

/// Where openstacksdk looks for clouds.yaml, in order: `OS_CLIENT_CONFIG_FILE`, the current
/// directory, `$XDG_CONFIG_HOME/openstack` (or `~/.config/openstack`), `/etc/openstack`.
pub fn clouds_yaml_candidates(env: Env<'_>) -> Vec<PathBuf> {
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

fn keystone_v3_only(origin: &str, version: &str) -> Result<(), ConfigError> {
    if version.starts_with('3') {
        return Ok(());
    }
    Err(ConfigError::Invalid {
        origin: origin.to_owned(),
        reason: format!("identity_api_version {version}: only Keystone v3 is supported"),
    })
}

impl AuthSettings {
    /// The cloud `cloud` of the clouds.yaml at `path`, unchecked.
    pub fn from_clouds_yaml(path: &Path, cloud: &str) -> Result<AuthSettings, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| ConfigError::Read { path: path.to_owned(), source })?;
        let mut file: CloudsFile = serde_norway::from_str(&text)
            .map_err(|source| ConfigError::Parse { path: path.to_owned(), source })?;
        let entry = file.clouds.remove(cloud).ok_or_else(|| ConfigError::NoSuchCloud {
            path: path.to_owned(),
            cloud: cloud.to_owned(),
        })?;
        let origin = format!("clouds.yaml {} (cloud {cloud})", path.display());
        if let Some(version) = &entry.identity_api_version {
            let version = match version {
                serde_norway::Value::String(s) => s.clone(),
                serde_norway::Value::Number(n) => n.to_string(),
                other => format!("{other:?}"),
            };
            keystone_v3_only(&origin, &version)?;
        }
        let auth = entry.auth;
        let token_auth = entry.auth_type.as_deref().is_some_and(|t| t.contains("token"));
        Ok(AuthSettings {
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
            region_name: entry.region_name,
            interface: entry.interface.unwrap_or_default(),
            cacert: entry.cacert,
            token: auth.token.filter(|_| token_auth),
            origin,
        })
    }

    /// `cloud` (or `OS_CLOUD`) from `clouds_yaml` (or the first clouds.yaml of
    /// [`clouds_yaml_candidates`] that exists), then the `OS_*` variables of `env` on top; with no
    /// cloud named, the `OS_*` variables alone. Password settings are [`checked`](Self::check); a
    /// token cloud (`token` set) needs no password and is left to the caller.
    pub fn load(
        cloud: Option<&str>,
        clouds_yaml: Option<&Path>,
        env: Env<'_>,
    ) -> Result<AuthSettings, ConfigError> {
        let env = |name: &str| env(name).filter(|v| !v.trim().is_empty());
        let cloud = cloud.map(str::to_owned).or_else(|| env("OS_CLOUD"));
        let mut settings = match cloud {
            Some(cloud) => {
                let path = match clouds_yaml {
                    Some(path) => path.to_owned(),
                    None => {
                        let candidates = clouds_yaml_candidates(&env);
                        match candidates.iter().find(|p| p.is_file()) {
                            Some(path) => path.clone(),
                            None => {
                                let looked = candidates
                                    .iter()
                                    .map(|p| p.display().to_string())
                                    .collect::<Vec<_>>()
                                    .join(", ");
                                return Err(ConfigError::NoCloudsYaml { cloud, looked });
                            }
                        }
                    }
                };
                let mut settings = Self::from_clouds_yaml(&path, &cloud)?;
                settings.origin.push_str(" and the OS_* variables");
                settings
            }
            None => AuthSettings { origin: "the OS_* variables".to_owned(), ..Default::default() },
        };
        let strings: [(&mut String, &str); 3] = [
            (&mut settings.auth_url, "OS_AUTH_URL"),
            (&mut settings.password, "OS_PASSWORD"),
            (&mut settings.interface, "OS_INTERFACE"),
        ];
        for (field, name) in strings {
            if let Some(value) = env(name) {
                *field = value;
            }
        }
        let options: [(&mut Option<String>, &str); 9] = [
            (&mut settings.username, "OS_USERNAME"),
            (&mut settings.user_id, "OS_USER_ID"),
            (&mut settings.project_name, "OS_PROJECT_NAME"),
            (&mut settings.project_id, "OS_PROJECT_ID"),
            (&mut settings.user_domain_name, "OS_USER_DOMAIN_NAME"),
            (&mut settings.user_domain_id, "OS_USER_DOMAIN_ID"),
            (&mut settings.project_domain_name, "OS_PROJECT_DOMAIN_NAME"),
            (&mut settings.project_domain_id, "OS_PROJECT_DOMAIN_ID"),
            (&mut settings.region_name, "OS_REGION_NAME"),
        ];
        for (field, name) in options {
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
        if let Some(cacert) = env("OS_CACERT") {
            settings.cacert = Some(PathBuf::from(cacert));
        }
        if let Some(version) = env("OS_IDENTITY_API_VERSION") {
            keystone_v3_only("OS_IDENTITY_API_VERSION", &version)?;
        }
        if settings.token.is_none() {
            settings.check()?;
        }
        Ok(settings)
    }

    /// Fills defaults (interface `public`) and refuses incomplete or unusable password settings.
    pub fn check(&mut self) -> Result<(), ConfigError> {
        let missing = |field| ConfigError::Missing { origin: self.origin.clone(), field };
        let invalid = |reason: String| ConfigError::Invalid { origin: self.origin.clone(), reason };
        if self.interface.is_empty() {
            self.interface = "public".to_owned();
        }
        let interface = self.interface.trim_end_matches("URL").to_owned();
        if !matches!(interface.as_str(), "public" | "internal" | "admin") {
            return Err(invalid(format!(
                "interface {:?}: expected public, internal or admin",
                self.interface
            )));
        }
        if self.auth_url.is_empty() {
            return Err(missing("auth_url (OS_AUTH_URL)"));
        }
        if !(self.auth_url.starts_with("http://") || self.auth_url.starts_with("https://")) {
            return Err(invalid(format!(
                "auth_url {:?} is not an http:// or https:// URL",
                self.auth_url
            )));
        }
        if let Some(cacert) = &self.cacert {
            if !cacert.is_file() {
                return Err(invalid(format!("cacert {} is not a readable file", cacert.display())));
            }
        }
        if self.username.is_none() && self.user_id.is_none() {
            return Err(missing("username (OS_USERNAME) or user_id (OS_USER_ID)"));
        }
        if self.password.is_empty() {
            return Err(missing("password (OS_PASSWORD)"));
        }
        if self.project_name.is_none() && self.project_id.is_none() {
            return Err(missing("project_name (OS_PROJECT_NAME) or project_id (OS_PROJECT_ID)"));
        }
        self.interface = interface;
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

    /// The body of `POST /v3/auth/tokens`: password method, project scope. Names need a domain;
    /// with none configured, Keystone's `default` domain id is used, as openstacksdk does.
    pub fn password_auth_body(&self) -> Value {
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
}

#[cfg(test)]
mod tests {
    use super::*;

    use fixed_env as env_of;

    fn temp_yaml(name: &str, text: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("openstack-config-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("clouds.yaml");
        std::fs::write(&path, text).unwrap();
        path
    }

    #[test]
    fn variables_override_the_cloud_and_empty_ones_do_not() {
        let path = temp_yaml(
            "override",
            "clouds:\n  c:\n    region_name: R1\n    auth:\n      auth_url: http://k:5000\n      \
             username: alice\n      password: pw\n      project_name: demo\n",
        );
        let file = path.display().to_string();
        let env = env_of(&[
            ("OS_CLOUD", "c"),
            ("OS_CLIENT_CONFIG_FILE", &file),
            ("OS_PROJECT_NAME", "other"),
            ("OS_PASSWORD", " "),
        ]);
        let s = AuthSettings::load(None, None, &env).unwrap();
        assert_eq!(
            (s.project_name.as_deref(), s.password.as_str(), s.region_name.as_deref()),
            (Some("other"), "pw", Some("R1"))
        );
        assert_eq!((s.interface.as_str(), s.identity_v3()), ("public", "http://k:5000/v3".into()));
        assert!(s.origin.contains(&file), "{}", s.origin);
    }

    #[test]
    fn token_clouds_keep_their_token_and_v2_is_refused() {
        let path = temp_yaml(
            "token",
            "clouds:\n  t:\n    auth_type: v3token\n    auth:\n      auth_url: http://k\n      \
             token: gAAAA\n  old:\n    identity_api_version: 2\n",
        );
        let s = AuthSettings::from_clouds_yaml(&path, "t").unwrap();
        assert_eq!(s.token.as_deref(), Some("gAAAA"));
        let e = AuthSettings::from_clouds_yaml(&path, "old").unwrap_err();
        assert!(e.to_string().contains("only Keystone v3"), "{e}");
        let e = AuthSettings::from_clouds_yaml(&path, "absent").unwrap_err();
        assert!(e.to_string().contains(&path.display().to_string()), "{e}");
    }

    #[test]
    fn missing_and_unusable_fields_are_named_with_their_variables() {
        let env = env_of(&[("OS_AUTH_URL", "http://k:5000"), ("OS_USERNAME", "u")]);
        let e = AuthSettings::load(None, None, &env).unwrap_err();
        assert!(e.to_string().contains("OS_PASSWORD"), "{e}");
        let env = env_of(&[("OS_AUTH_URL", "ftp://k"), ("OS_USERNAME", "u"), ("OS_PASSWORD", "p")]);
        let e = AuthSettings::load(None, None, &env).unwrap_err();
        assert!(e.to_string().contains("ftp://k"), "{e}");
        let env = env_of(&[
            ("OS_AUTH_URL", "https://k"),
            ("OS_USERNAME", "u"),
            ("OS_PASSWORD", "p"),
            ("OS_PROJECT_NAME", "demo"),
            ("OS_CACERT", "/nonexistent/ca.pem"),
        ]);
        let e = AuthSettings::load(None, None, &env).unwrap_err();
        assert!(e.to_string().contains("/nonexistent/ca.pem"), "{e}");
        let env = env_of(&[("OS_CLOUD", "x"), ("HOME", "/nonexistent")]);
        let e = AuthSettings::load(None, None, &env).unwrap_err();
        assert!(e.to_string().contains("/nonexistent/.config/openstack/clouds.yaml"), "{e}");
    }
}
