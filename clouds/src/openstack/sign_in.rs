//! Signing users in with Keystone on behalf of the dashboard: the browser talks to gsaasd only
//! (no access to Keystone needed, no CORS), as Horizon and Skyline sign in for theirs.
//!
//! A password sign-in gets an unscoped token (the password is tried once: Keystone's lockout counts
//! attempts), then exchanges it for one scoped to the project named, or to the user's default
//! project (the `token` method), as Horizon does; the unscoped token stays the session's root, from
//! which the user switches projects (`GET /v3/auth/projects` lists them). An application
//! credential's token has the credential's own scope. Signing out revokes the tokens
//! (`DELETE /v3/auth/tokens`, the user's own token on both sides); revoking the root revokes every
//! token had from it.

use reqwest::StatusCode;
use serde::Deserialize;
use serde_json::{json, Value};

use super::keystone::{refusal, Keystone, KeystoneError, AUTH_TOKEN, SUBJECT_TOKEN};

/// What a user signs in with. (Its `Debug` shows no secret.)
#[derive(Clone, PartialEq, Eq)]
pub enum Credential {
    Password { user: String, user_domain: String, password: String },
    ApplicationCredential { id: String, secret: String },
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Credential::Password { user, user_domain, .. } => f
                .debug_struct("Password")
                .field("user", user)
                .field("user_domain", user_domain)
                .finish_non_exhaustive(),
            Credential::ApplicationCredential { id, .. } => {
                f.debug_struct("ApplicationCredential").field("id", id).finish_non_exhaustive()
            }
        }
    }
}

/// A token Keystone issued, and its user.
#[derive(Clone, PartialEq, Eq)]
pub struct Issued {
    pub token: String,
    pub user_id: String,
}

impl std::fmt::Debug for Issued {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Issued").field("user_id", &self.user_id).finish_non_exhaustive()
    }
}

#[derive(Debug, Deserialize)]
struct IssuedBody {
    token: IssuedToken,
}

#[derive(Debug, Deserialize)]
struct IssuedToken {
    user: IdOnly,
}

#[derive(Debug, Deserialize)]
struct IdOnly {
    id: String,
}

#[derive(Debug, Deserialize)]
struct UserBody {
    user: User,
}

#[derive(Debug, Deserialize)]
struct User {
    #[serde(default)]
    default_project_id: Option<String>,
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

fn protocol(reason: &str, source: serde_json::Error) -> KeystoneError {
    KeystoneError::Protocol { reason: reason.to_owned(), source: Some(source) }
}

impl Keystone {
    /// Authenticates the user: a password gets an unscoped token (explicitly, even for a user
    /// with a default project: the root of the session, from which each project's token is
    /// had and whose revocation ends them all); an application credential, a token of its own
    /// scope. `Rejected` carries Keystone's refusal.
    pub async fn authenticate_user(
        &self,
        credential: &Credential,
    ) -> Result<Issued, KeystoneError> {
        let body = match credential {
            Credential::Password { user, user_domain, password } => json!({ "auth": {
                "identity": { "methods": ["password"], "password": {
                    "user": { "name": user, "domain": domain_ref(user_domain), "password": password }
                } },
                "scope": "unscoped",
            } }),
            Credential::ApplicationCredential { id, secret } => {
                json!({ "auth": { "identity": { "methods": ["application_credential"],
                    "application_credential": { "id": id, "secret": secret } } } })
            }
        };
        let (token, body) = self.issue(&body).await?;
        let issued: IssuedBody = serde_json::from_slice(&body)
            .map_err(|e| protocol("the new token does not parse", e))?;
        Ok(Issued { token, user_id: issued.token.user.id })
    }

    /// A token of `token`'s user scoped to `project` (the `token` method).
    pub async fn rescope(
        &self,
        token: &str,
        project: &ProjectRef,
    ) -> Result<String, KeystoneError> {
        let body = json!({ "auth": {
            "identity": { "methods": ["token"], "token": { "id": token } },
            "scope": project.scope(),
        } });
        self.issue(&body).await.map(|(token, _)| token)
    }

    /// The user's default project, if it has one (a user may read its own record).
    pub async fn default_project(
        &self,
        token: &str,
        user_id: &str,
    ) -> Result<Option<String>, KeystoneError> {
        let url = format!("{}/users/{user_id}", self.settings().identity_v3());
        let request = self.http().get(&url).header(AUTH_TOKEN, token);
        let (status, _, body) = self.send(request, &url).await?;
        if status != StatusCode::OK {
            return Err(refusal(status, &body));
        }
        let user: UserBody =
            serde_json::from_slice(&body).map_err(|e| protocol("the user does not parse", e))?;
        Ok(user.user.default_project_id)
    }

    /// The projects the token's user may scope to.
    pub async fn projects_of(&self, token: &str) -> Result<Vec<Project>, KeystoneError> {
        let url = format!("{}/auth/projects", self.settings().identity_v3());
        let request = self.http().get(&url).header(AUTH_TOKEN, token);
        let (status, _, body) = self.send(request, &url).await?;
        if status != StatusCode::OK {
            return Err(refusal(status, &body));
        }
        let mut projects: Projects = serde_json::from_slice(&body)
            .map_err(|e| protocol("the project list does not parse", e))?;
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
