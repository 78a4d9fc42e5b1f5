//! Keystone sign-in for the dashboard (`auth.mode = "keystone"`): gsaasd asks Keystone for the
//! user's token, so the browser needs no access to Keystone (see `openstack::sign_in`).
//!
//! Every sign-in costs Keystone a request or two, and anyone may try one: each client address
//! has the budget of Keystone requests that unknown tokens draw from too
//! (`auth.keystone_validations_per_minute`), so gsaasd never lets a client spray passwords at
//! Keystone faster than that. Fields are checked before Keystone is asked. A password or secret
//! is sent to Keystone and nowhere else: never stored, logged or answered. A refusal says which
//! of the password and the project was wrong (a second, unscoped try tells them apart), and the
//! token of that try is revoked at once.

use std::net::IpAddr;
use std::time::SystemTime;

use super::fields::FieldChecks;
use super::App;
use crate::error::Error;
use crate::openstack::keystone::KeystoneError;
use crate::openstack::sign_in::{Credential, Project, ProjectRef};
use crate::openstack::{TenantIdentity, TokenValidator, ValidationError};

/// Keystone's limits on names and ids (255) and on passwords (4096, its default
/// `max_password_length`).
const MAX_NAME: usize = 255;
const MAX_SECRET: usize = 4096;

/// What a sign-in asks for, as the request gave it.
#[derive(Debug, Clone)]
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

#[derive(Debug, Clone, Default)]
pub struct ProjectAsked {
    pub id: Option<String>,
    pub name: Option<String>,
    pub domain: Option<String>,
}

/// A signed-in user: its token, and what Keystone says of it.
#[derive(Debug, Clone)]
pub struct Session {
    pub token: String,
    pub identity: TenantIdentity,
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

/// The credential `sign_in` asks Keystone for, or every problem of its fields.
fn credential(sign_in: &SignIn) -> Result<Credential, Error> {
    let mut checks = FieldChecks::new();
    let credential = match sign_in {
        SignIn::Password { user, domain, password, project } => {
            checks.text("password.user", user, MAX_NAME);
            let user_domain = domain.clone().unwrap_or_else(|| DEFAULT_DOMAIN.to_owned());
            checks.text("password.domain", &user_domain, MAX_NAME);
            secret(&mut checks, "password.password", password);
            let project = project.as_ref().and_then(|p| project_ref(p, "project", &mut checks));
            Credential::Password {
                user: user.clone(),
                user_domain,
                password: password.clone(),
                project,
            }
        }
        SignIn::ApplicationCredential { id, secret: value } => {
            checks.text("application_credential.id", id, MAX_NAME);
            secret(&mut checks, "application_credential.secret", value);
            Credential::ApplicationCredential { id: id.clone(), secret: value.clone() }
        }
        SignIn::Switch { token, project } => match project_ref(project, "project", &mut checks) {
            Some(project) => Credential::Token { token: token.clone(), project },
            None => return Err(checks.finish().expect_err("a problem was recorded")),
        },
    };
    checks.finish()?;
    Ok(credential)
}

fn keystone_down(e: KeystoneError) -> Error {
    Error::unavailable("keystone", e)
}

impl App {
    fn keystone_sign_in(&self) -> Result<&TokenValidator, Error> {
        self.keystone.as_deref().ok_or_else(|| Error::NotFound {
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
        let credential = credential(&sign_in)?;
        Self::spend(validator, client)?;
        let keystone = validator.keystone();
        let token = match keystone.sign_in(&credential).await {
            Ok(token) => token,
            Err(KeystoneError::Rejected { message, .. }) => {
                return Err(self.refusal(validator, client, &credential, &message).await);
            }
            Err(e) => return Err(keystone_down(e)),
        };
        match validator.validate(&token, None).await {
            Ok(identity) => Ok(Session { token, identity }),
            Err(ValidationError::Unscoped) => {
                let _ = keystone.revoke(&token).await;
                Err(Error::invalid(
                    "project",
                    "is required: the user has no default project; name one of its projects",
                ))
            }
            Err(ValidationError::Keystone(e)) => Err(keystone_down(e)),
            Err(e) => Err(Error::Unauthenticated(format!("Keystone's new token: {e}"))),
        }
    }

    /// Why Keystone refused `credential`, as the user can act on it: for a password with a
    /// project, one unscoped try says whether the password or the project was wrong.
    async fn refusal(
        &self,
        validator: &TokenValidator,
        client: Option<IpAddr>,
        credential: &Credential,
        message: &str,
    ) -> Error {
        let keystone = validator.keystone();
        match credential {
            Credential::Password { user, user_domain, password, project: Some(project) } => {
                if Self::spend(validator, client).is_err() {
                    return Error::Unauthenticated(format!(
                        "Keystone refused the sign-in: {message}"
                    ));
                }
                let unscoped = Credential::Password {
                    user: user.clone(),
                    user_domain: user_domain.clone(),
                    password: password.clone(),
                    project: None,
                };
                match keystone.sign_in(&unscoped).await {
                    Ok(token) => {
                        let _ = keystone.revoke(&token).await;
                        let named = match project {
                            ProjectRef::Id(id) => format!("project {id}"),
                            ProjectRef::Name { name, domain } => {
                                format!("project {name} (domain {domain})")
                            }
                        };
                        Error::Forbidden(format!(
                            "the user has no role in {named}, or there is no such project"
                        ))
                    }
                    Err(_) => Error::Unauthenticated(format!(
                        "Keystone refused the user name, domain or password: {message}"
                    )),
                }
            }
            Credential::Token { .. } => Error::Forbidden(format!(
                "Keystone refused to switch to that project (the user has no role in it, or \
                 there is no such project): {message}"
            )),
            _ => Error::Unauthenticated(format!("Keystone refused the sign-in: {message}")),
        }
    }

    /// The projects the token's user may switch to.
    pub async fn projects_of(
        &self,
        client: Option<IpAddr>,
        token: &str,
    ) -> Result<Vec<Project>, Error> {
        let validator = self.keystone_sign_in()?;
        Self::spend(validator, client)?;
        match validator.keystone().projects_of(token).await {
            Ok(projects) => Ok(projects),
            Err(KeystoneError::Rejected { .. }) => {
                Err(Error::Unauthenticated("the Keystone token is invalid or expired".into()))
            }
            Err(e) => Err(keystone_down(e)),
        }
    }

    /// Signs out: revokes the token at Keystone, and forgets it here at once (other replicas
    /// within `auth.keystone_cache_secs`).
    pub async fn sign_out(&self, token: &str) -> Result<(), Error> {
        let validator = self.keystone_sign_in()?;
        validator.forget(token);
        validator.keystone().revoke(token).await.map_err(keystone_down)
    }
}
