//! Keystone sign-in for the dashboard (`auth.mode = "keystone"`): gsaasd asks Keystone for the
//! user's token, so the browser needs no access to Keystone (see `openstack::sign_in`).
//!
//! Every sign-in costs Keystone a few requests, and anyone may try one: each client address
//! has the budget of Keystone requests that unknown tokens draw from too
//! (`auth.keystone_validations_per_minute`), so gsaasd never lets a client spray passwords at
//! Keystone faster than that. Fields are checked before Keystone is asked. A password or secret
//! is sent to Keystone and nowhere else: never stored, logged or answered. A password is tried
//! once (Keystone's lockout counts attempts), for an unscoped token, which is then exchanged for
//! the project's: a refusal says which of the two was wrong, and a session that fails at the
//! project revokes its unscoped token at once.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::SystemTime;

use super::fields::FieldChecks;
use super::App;
use crate::error::Error;
use crate::openstack::keystone::KeystoneError;
use crate::openstack::sign_in::{Credential, Issued, Project, ProjectRef};
use crate::openstack::{TenantIdentity, TokenValidator, ValidationError};

/// Keystone's limits on names and ids (255) and on passwords (4096, its default
/// `max_password_length`).
const MAX_NAME: usize = 255;
const MAX_SECRET: usize = 4096;

/// What a sign-in asks for, as the request gave it. (Its `Debug` shows no secret.)
#[derive(Clone)]
pub enum SignIn {
    Password {
        user: String,
        domain: Option<String>,
        password: String,
        project: Option<ProjectAsked>,
    },
    ApplicationCredential {
        id: String,
        secret: String,
    },
    /// Switch the caller's token to another of its user's projects.
    Switch {
        token: String,
        project: ProjectAsked,
    },
}

impl std::fmt::Debug for SignIn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SignIn::Password { user, domain, project, .. } => f
                .debug_struct("Password")
                .field("user", user)
                .field("domain", domain)
                .field("project", project)
                .finish_non_exhaustive(),
            SignIn::ApplicationCredential { id, .. } => {
                f.debug_struct("ApplicationCredential").field("id", id).finish_non_exhaustive()
            }
            SignIn::Switch { project, .. } => {
                f.debug_struct("Switch").field("project", project).finish_non_exhaustive()
            }
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct ProjectAsked {
    pub id: Option<String>,
    pub name: Option<String>,
    pub domain: Option<String>,
}

/// A signed-in user: its token, and what Keystone says of it.
#[derive(Clone)]
pub struct Session {
    pub token: String,
    /// A password sign-in's unscoped token, the session's root: what switching project
    /// exchanges, and whose revocation ends every token of the session.
    pub unscoped: Option<String>,
    pub identity: TenantIdentity,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session").field("identity", &self.identity).finish_non_exhaustive()
    }
}

impl Session {
    pub fn expires_at(&self) -> SystemTime {
        self.identity.info.expires_at
    }
}

/// The Keystone domain a user or project named without one is in.
pub const DEFAULT_DOMAIN: &str = "Default";

fn project_ref(asked: &ProjectAsked, field: &str, checks: &mut FieldChecks) -> Option<ProjectRef> {
    match (&asked.id, &asked.name) {
        (Some(id), None) => {
            checks.text(&format!("{field}.id"), id, MAX_NAME);
            Some(ProjectRef::Id(id.clone()))
        }
        (None, Some(name)) => {
            checks.text(&format!("{field}.name"), name, MAX_NAME);
            let domain = asked.domain.clone().unwrap_or_else(|| DEFAULT_DOMAIN.to_owned());
            checks.text(&format!("{field}.domain"), &domain, MAX_NAME);
            Some(ProjectRef::Name { name: name.clone(), domain })
        }
        _ => {
            checks.fail(field, "name the project by its id or by its name, one of them");
            None
        }
    }
}

/// A password or a secret: not empty, not longer than Keystone takes.
fn secret(checks: &mut FieldChecks, field: &str, value: &str) {
    if value.is_empty() {
        checks.fail(field, "must not be empty");
    } else if value.len() > MAX_SECRET {
        checks.fail(field, format!("must be at most {MAX_SECRET} bytes"));
    }
}

/// What a sign-in asks Keystone for, its fields checked.
enum Asked {
    /// Authenticate, then (a password's unscoped token) scope to the project, or the user's
    /// default project.
    Authenticate(Credential, Option<ProjectRef>),
    /// Exchange a token of the user's for one scoped to the project.
    Switch(String, ProjectRef),
}

/// What `sign_in` asks Keystone for, or every problem of its fields.
fn asked(sign_in: &SignIn) -> Result<Asked, Error> {
    let mut checks = FieldChecks::new();
    let asked = match sign_in {
        SignIn::Password { user, domain, password, project } => {
            checks.text("password.user", user, MAX_NAME);
            let user_domain = domain.clone().unwrap_or_else(|| DEFAULT_DOMAIN.to_owned());
            checks.text("password.domain", &user_domain, MAX_NAME);
            secret(&mut checks, "password.password", password);
            let project = project.as_ref().and_then(|p| project_ref(p, "project", &mut checks));
            let credential = Credential::Password {
                user: user.clone(),
                user_domain,
                password: password.clone(),
            };
            Asked::Authenticate(credential, project)
        }
        SignIn::ApplicationCredential { id, secret: value } => {
            checks.text("application_credential.id", id, MAX_NAME);
            secret(&mut checks, "application_credential.secret", value);
            let credential =
                Credential::ApplicationCredential { id: id.clone(), secret: value.clone() };
            Asked::Authenticate(credential, None)
        }
        SignIn::Switch { token, project } => match project_ref(project, "project", &mut checks) {
            Some(project) => Asked::Switch(token.clone(), project),
            None => return Err(checks.finish().expect_err("a problem was recorded")),
        },
    };
    checks.finish()?;
    Ok(asked)
}

fn keystone_down(e: KeystoneError) -> Error {
    Error::unavailable("keystone", e)
}

/// Keystone's refusal as the user can act on it: of a credential (user name, domain, password,
/// application credential), or of the project asked for (no role there, no such project, or the
/// token used to switch has expired).
fn refused(e: KeystoneError, project: Option<&ProjectRef>) -> Error {
    let KeystoneError::Rejected { message, .. } = e else { return keystone_down(e) };
    match project {
        None => Error::Unauthenticated(format!(
            "Keystone refused the user name, domain, password or application credential: \
             {message}"
        )),
        Some(project) => {
            let named = match project {
                ProjectRef::Id(id) => format!("project {id}"),
                ProjectRef::Name { name, domain } => format!("project {name} (domain {domain})"),
            };
            Error::Unauthenticated(format!(
                "the user has no role in {named}, or there is no such project (or the session \
                 expired)"
            ))
        }
    }
}

/// gsaasd's own tokens are not Keystone's: they are not sent to Keystone (which would learn
/// them) and are revoked by an operator (`gsaasd token revoke`).
fn refuse_gsaasd_token(app: &App, token: &str) -> Result<(), Error> {
    if crate::auth::looks_like_jwt(token) || app.keys.verify(token).is_ok() {
        return Err(Error::invalid(
            "X-Auth-Token",
            "is a gsaasd token, not a Keystone one: an operator revokes it (gsaasd token revoke)",
        ));
    }
    Ok(())
}

impl App {
    fn keystone_sign_in(&self) -> Result<&Arc<TokenValidator>, Error> {
        self.keystone.as_ref().ok_or_else(|| Error::NotFound {
            kind: "Keystone sign-in (auth.mode is not keystone)",
            id: String::new(),
        })
    }

    /// One Keystone request of `client`'s budget, or 429.
    fn spend(validator: &TokenValidator, client: Option<IpAddr>) -> Result<(), Error> {
        match client {
            Some(client) if !validator.take_budget(client) => Err(Error::TooManyRequests(
                "too many sign-ins from this address; retry in a minute".into(),
            )),
            _ => Ok(()),
        }
    }

    /// Signs a user in with Keystone: its new token, validated (and so cached) as any caller's.
    pub async fn sign_in(&self, client: Option<IpAddr>, sign_in: SignIn) -> Result<Session, Error> {
        let validator = self.keystone_sign_in()?;
        let asked = asked(&sign_in)?;
        let keystone = validator.keystone();
        let (token, unscoped) = match asked {
            Asked::Switch(token, project) => {
                refuse_gsaasd_token(self, &token)?;
                Self::spend(validator, client)?;
                let scoped = keystone.rescope(&token, &project).await;
                (scoped.map_err(|e| refused(e, Some(&project)))?, None)
            }
            Asked::Authenticate(credential @ Credential::ApplicationCredential { .. }, _) => {
                Self::spend(validator, client)?;
                let issued = keystone.authenticate_user(&credential).await;
                (issued.map_err(|e| refused(e, None))?.token, None)
            }
            Asked::Authenticate(credential, project) => {
                Self::spend(validator, client)?;
                let root = keystone.authenticate_user(&credential).await;
                let root = root.map_err(|e| refused(e, None))?;
                match self.scope_root(validator, client, &root, project).await {
                    Ok(scoped) => (scoped, Some(root.token)),
                    Err(e) => {
                        let _ = keystone.revoke(&root.token).await;
                        return Err(e);
                    }
                }
            }
        };
        match validator.validate(&token, None).await {
            Ok(identity) => Ok(Session { token, unscoped, identity }),
            Err(ValidationError::Keystone(e)) => Err(keystone_down(e)),
            Err(e) => Err(Error::Unauthenticated(format!("Keystone's new token: {e}"))),
        }
    }

    /// A token scoped to `project`, or to the user's default project (else its first), had from
    /// the session's unscoped root.
    async fn scope_root(
        &self,
        validator: &TokenValidator,
        client: Option<IpAddr>,
        root: &Issued,
        project: Option<ProjectRef>,
    ) -> Result<String, Error> {
        let keystone = validator.keystone();
        let project = match project {
            Some(project) => project,
            None => {
                Self::spend(validator, client)?;
                let default = keystone.default_project(&root.token, &root.user_id).await;
                match default.map_err(keystone_down)? {
                    Some(id) => ProjectRef::Id(id),
                    None => {
                        Self::spend(validator, client)?;
                        let projects = keystone.projects_of(&root.token).await;
                        let first = projects.map_err(keystone_down)?.into_iter().next();
                        let first = first.ok_or_else(|| {
                            Error::invalid("project", "the user has no project to sign in to")
                        })?;
                        ProjectRef::Id(first.id)
                    }
                }
            }
        };
        Self::spend(validator, client)?;
        keystone.rescope(&root.token, &project).await.map_err(|e| refused(e, Some(&project)))
    }

    /// The projects the token's user may switch to.
    pub async fn projects_of(
        &self,
        client: Option<IpAddr>,
        token: &str,
    ) -> Result<Vec<Project>, Error> {
        let validator = self.keystone_sign_in()?;
        refuse_gsaasd_token(self, token)?;
        Self::spend(validator, client)?;
        match validator.keystone().projects_of(token).await {
            Ok(projects) => Ok(projects),
            Err(KeystoneError::Rejected { .. }) => {
                Err(Error::Unauthenticated("the Keystone token is invalid or expired".into()))
            }
            Err(e) => Err(keystone_down(e)),
        }
    }

    /// Signs out: ends the token's session (`TokenValidator::end_session`): it and every token
    /// of its chain cached here stop working here at once (other replicas within
    /// `auth.keystone_cache_secs`) and are revoked at Keystone. Never refused for the client's
    /// budget: a neighbour behind the same address must not keep a user signed in. The
    /// revocation is its own task: a client that hangs up does not stop it halfway.
    pub async fn sign_out(&self, token: &str) -> Result<(), Error> {
        let validator = Arc::clone(self.keystone_sign_in()?);
        refuse_gsaasd_token(self, token)?;
        let token = token.to_owned();
        let revoking = tokio::spawn(async move { validator.end_session(&token).await });
        match revoking.await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(ValidationError::Keystone(e))) => Err(keystone_down(e)),
            Ok(Err(e)) => Err(Error::internal(e)),
            Err(e) => Err(Error::internal(e)),
        }
    }
}
