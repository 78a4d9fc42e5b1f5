//! Signing users in with Keystone on behalf of the dashboard: the browser talks to gsaasd only
//! (no access to Keystone needed, no CORS), as Horizon and Skyline sign in for theirs.
//!
//! A password sign-in asks Keystone for a token scoped to the named project (or, naming none,
//! Keystone's choice: the user's default project); an application credential's token has the
//! credential's own scope. Switching project exchanges the token for one scoped to another project
//! of the user's (the `token` method); the user's projects are `GET /v3/auth/projects`. Signing out
//! revokes the token (`DELETE /v3/auth/tokens`, the user's own token on both sides), as Keystone
//! lets a user revoke its own.

use reqwest::StatusCode;
use serde::Deserialize;
use serde_json::{json, Value};

use super::keystone::{refusal, Keystone, KeystoneError, AUTH_TOKEN, SUBJECT_TOKEN};

/// What a user signs in with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Credential {
    Password {
        user: String,
        user_domain: String,
        password: String,
        /// The project (name in `project_domain`, or id); `None`: the user's default project.
        project: Option<ProjectRef>,
    },
    ApplicationCredential {
        id: String,
        secret: String,
    },
    /// A token of the user's, exchanged for one scoped to the project (switching project).
    Token {
        token: String,
        project: ProjectRef,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProjectRef {
    Id(String),
    Name { name: String, domain: String },
}

impl ProjectRef {
    fn scope(&self) -> Value {
        match self {
            ProjectRef::Id(id) => json!({ "project": { "id": id } }),
            ProjectRef::Name { name, domain } => {
                json!({ "project": { "name": name, "domain": domain_ref(domain) } })
            }
        }
    }
}

/// A domain named as Keystone's `default` id or by name (`Default`).
fn domain_ref(domain: &str) -> Value {
    if domain == "default" {
        json!({ "id": domain })
    } else {
        json!({ "name": domain })
    }
}

/// One of the user's projects.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Project {
    pub id: String,
    pub name: String,
    #[serde(default)]
    pub domain_id: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Projects {
    projects: Vec<Project>,
}

impl Keystone {
    /// A new token for `credential`. `Rejected` carries Keystone's refusal (a wrong password, a
    /// project the user has no role in).
    pub async fn sign_in(&self, credential: &Credential) -> Result<String, KeystoneError> {
        let body = match credential {
            Credential::Password { user, user_domain, password, project } => {
                let mut auth = json!({ "identity": { "methods": ["password"], "password": {
                    "user": { "name": user, "domain": domain_ref(user_domain), "password": password }
                } } });
                if let Some(project) = project {
                    auth["scope"] = project.scope();
                }
                json!({ "auth": auth })
            }
            Credential::ApplicationCredential { id, secret } => {
                json!({ "auth": { "identity": { "methods": ["application_credential"],
                    "application_credential": { "id": id, "secret": secret } } } })
            }
            Credential::Token { token, project } => json!({ "auth": {
                "identity": { "methods": ["token"], "token": { "id": token } },
                "scope": project.scope(),
            } }),
        };
        self.issue(&body).await.map(|(token, _)| token)
    }

    /// The projects the token's user may scope to.
    pub async fn projects_of(&self, token: &str) -> Result<Vec<Project>, KeystoneError> {
        let url = format!("{}/auth/projects", self.settings().identity_v3());
        let request = self.http().get(&url).header(AUTH_TOKEN, token);
        let (status, _, body) = self.send(request, &url).await?;
        if status != StatusCode::OK {
            return Err(refusal(status, &body));
        }
        let mut projects: Projects =
            serde_json::from_slice(&body).map_err(|e| KeystoneError::Protocol {
                reason: "the project list does not parse".into(),
                source: Some(e),
            })?;
        projects.projects.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(projects.projects)
    }

    /// Revokes `token` as its own user does. One Keystone no longer knows is no error.
    pub async fn revoke(&self, token: &str) -> Result<(), KeystoneError> {
        let url = format!("{}/auth/tokens", self.settings().identity_v3());
        let request =
            self.http().delete(&url).header(AUTH_TOKEN, token).header(SUBJECT_TOKEN, token);
        let (status, _, body) = self.send(request, &url).await?;
        match status {
            StatusCode::NO_CONTENT | StatusCode::OK | StatusCode::NOT_FOUND => Ok(()),
            // Its own token already invalid: nothing left to revoke.
            StatusCode::UNAUTHORIZED => Ok(()),
            _ => Err(refusal(status, &body)),
        }
    }
}
