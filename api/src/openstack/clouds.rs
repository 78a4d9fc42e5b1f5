//! Service credentials in OpenStack's own terms: a cloud of `clouds.yaml` (`OS_CLOUD`) and the
//! `OS_*` variables, as `openstack` and openstacksdk read them.
//!
//! Operators already have these files and variables for their service users; gsaasd reads the same
//! ones rather than inventing its own names. The order is openstacksdk's: the named cloud of
//! `clouds.yaml` first, then any `OS_*` variable overrides its field. The environment is passed in
//! as a lookup function, so tests (which run in parallel) never touch the process's variables.
//! Errors name where the value came from: the clouds.yaml path, or the environment.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

#[derive(Debug, thiserror::Error)]
pub enum OpenStackConfigError {
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
    #[error("{origin}: {field} is missing")]
    Missing { origin: String, field: &'static str },
    #[error("{origin}: {reason}")]
    Invalid { origin: String, reason: String },
}

/// Keystone v3 password credentials of gsaasd's service user, and which endpoints to use.
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
    /// CA bundle for https endpoints (see [`AuthSettings::check`]).
    pub cacert: Option<PathBuf>,
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
}

/// Where openstacksdk looks for clouds.yaml, in order: `OS_CLIENT_CONFIG_FILE`, the current
/// directory, `$XDG_CONFIG_HOME/openstack` (or `~/.config/openstack`), `/etc/openstack`.
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

impl AuthSettings {
    /// The cloud `cloud` of the clouds.yaml at `path`.
    pub fn from_clouds_yaml(
        path: &Path,
        cloud: &str,
    ) -> Result<AuthSettings, OpenStackConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| OpenStackConfigError::Read { path: path.to_owned(), source })?;
        let mut file: CloudsFile = serde_norway::from_str(&text)
            .map_err(|source| OpenStackConfigError::Parse { path: path.to_owned(), source })?;
        let entry = file.clouds.remove(cloud).ok_or_else(|| OpenStackConfigError::NoSuchCloud {
            path: path.to_owned(),
            cloud: cloud.to_owned(),
        })?;
        let origin = format!("clouds.yaml {} (cloud {cloud})", path.display());
        if let Some(version) = &entry.identity_api_version {
            let v = match version {
                serde_norway::Value::String(s) => s.clone(),
                serde_norway::Value::Number(n) => n.to_string(),
                other => format!("{other:?}"),
            };
            if !v.starts_with('3') {
                return Err(OpenStackConfigError::Invalid {
                    origin,
                    reason: format!("identity_api_version {v}: only Keystone v3 is supported"),
                });
            }
        }
        let auth = entry.auth;
        let settings = AuthSettings {
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
        };
        Ok(settings)
    }

    /// The settings gsaasd starts with: `cloud` (or `OS_CLOUD`) from `clouds_yaml` (or the first
    /// clouds.yaml of [`clouds_yaml_candidates`] that exists), then the `OS_*` variables of `env`
    /// on top; with no cloud named, the `OS_*` variables alone. The result is [`checked`](Self::check).
    pub fn load(
        cloud: Option<&str>,
        clouds_yaml: Option<&Path>,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<AuthSettings, OpenStackConfigError> {
        let cloud = cloud.map(str::to_owned).or_else(|| env("OS_CLOUD"));
        let (mut settings, origin) = match cloud {
            Some(cloud) => {
                let path = match clouds_yaml {
                    Some(path) => path.to_owned(),
                    None => {
                        let candidates = clouds_yaml_candidates(env);
                        match candidates.iter().find(|p| p.is_file()) {
                            Some(path) => path.clone(),
                            None => {
                                let looked = candidates
                                    .iter()
                                    .map(|p| p.display().to_string())
                                    .collect::<Vec<_>>()
                                    .join(", ");
                                return Err(OpenStackConfigError::NoCloudsYaml { cloud, looked });
                            }
                        }
                    }
                };
                let settings = Self::from_clouds_yaml(&path, &cloud)?;
                (
                    settings,
                    format!("clouds.yaml {} (cloud {cloud}) and OS_* variables", path.display()),
                )
            }
            None => (AuthSettings::default(), "the OS_* variables".to_owned()),
        };
        let set = |field: &mut String, name| {
            if let Some(v) = env(name) {
                *field = v;
            }
        };
        set(&mut settings.auth_url, "OS_AUTH_URL");
        set(&mut settings.password, "OS_PASSWORD");
        set(&mut settings.interface, "OS_INTERFACE");
        let set_opt = |field: &mut Option<String>, name| {
            if let Some(v) = env(name) {
                *field = Some(v);
            }
        };
        set_opt(&mut settings.username, "OS_USERNAME");
        set_opt(&mut settings.user_id, "OS_USER_ID");
        set_opt(&mut settings.project_name, "OS_PROJECT_NAME");
        set_opt(&mut settings.project_id, "OS_PROJECT_ID");
        set_opt(&mut settings.user_domain_name, "OS_USER_DOMAIN_NAME");
        set_opt(&mut settings.user_domain_id, "OS_USER_DOMAIN_ID");
        set_opt(&mut settings.project_domain_name, "OS_PROJECT_DOMAIN_NAME");
        set_opt(&mut settings.project_domain_id, "OS_PROJECT_DOMAIN_ID");
        set_opt(&mut settings.region_name, "OS_REGION_NAME");
        if let Some(v) = env("OS_CACERT") {
            settings.cacert = Some(PathBuf::from(v));
        }
        settings.check(&origin)?;
        Ok(settings)
    }

    /// Fills defaults (interface `public`) and refuses incomplete or unusable settings.
    ///
    /// This build speaks plain HTTP only: reqwest's TLS would bring in aws-lc-sys, which the project
    /// does not accept, so an `https` URL or a `cacert` is refused here rather than failing later.
    pub fn check(&mut self, origin: &str) -> Result<(), OpenStackConfigError> {
        let missing = |field| OpenStackConfigError::Missing { origin: origin.to_owned(), field };
        let invalid =
            |reason: String| OpenStackConfigError::Invalid { origin: origin.to_owned(), reason };
        if self.interface.is_empty() {
            self.interface = "public".to_owned();
        }
        self.interface = self.interface.trim_end_matches("URL").to_owned();
        if !matches!(self.interface.as_str(), "public" | "internal" | "admin") {
            return Err(invalid(format!(
                "interface {:?}: expected public, internal or admin",
                self.interface
            )));
        }
        if self.auth_url.is_empty() {
            return Err(missing("auth_url"));
        }
        if self.auth_url.starts_with("https://") || self.cacert.is_some() {
            return Err(invalid(format!(
                "auth_url {} / cacert: this gsaasd speaks plain http only (no TLS in the build); \
                 put Keystone and Nova behind http endpoints or a local TLS proxy",
                self.auth_url
            )));
        }
        if !self.auth_url.starts_with("http://") {
            return Err(invalid(format!("auth_url {:?} is not an http:// URL", self.auth_url)));
        }
        if self.username.is_none() && self.user_id.is_none() {
            return Err(missing("username"));
        }
        if self.password.is_empty() {
            return Err(missing("password"));
        }
        if self.project_name.is_none() && self.project_id.is_none() {
            return Err(missing("project_name"));
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

    /// The body of `POST /v3/auth/tokens`: password method, project scope. Names need a domain;
    /// with none configured, Keystone's `default` domain id is used, as openstacksdk does.
    pub fn password_auth_body(&self) -> serde_json::Value {
        use serde_json::json;
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
