//! Signing in: how a client learns which sign-ins gsaasd offers, and Keystone sign-in through
//! gsaasd (Keystone mode), as the dashboard does it.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Which sign-ins this gsaasd offers.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct AuthMethods {
    /// `keystone` (`auth.mode = "keystone"`: Keystone tokens and sign-in, and gsaasd's own
    /// tokens) or `jwt` (gsaasd's own tokens only).
    pub mode: String,
    /// What `POST /v1/auth/tokens` takes: `password`, `application_credential`; empty in `jwt`
    /// mode.
    pub methods: Vec<String>,
    /// The domain of a user or project named without one.
    pub default_domain: String,
}

/// A Keystone sign-in: a password or an application credential; or neither, to exchange the
/// caller's Keystone token (`X-Auth-Token`) for one scoped to `project` (switching project).
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SignInRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password: Option<PasswordSignIn>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub application_credential: Option<ApplicationCredentialSignIn>,
    /// The project to scope to (with a password: none means the user's default project; an
    /// application credential has its own and takes none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project: Option<ProjectParam>,
}

/// (Its `Debug` shows no password.)
#[derive(Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PasswordSignIn {
    /// The user's name.
    pub user: String,
    /// The user's domain (name, or the id `default`); absent: the default domain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
    pub password: String,
}

/// (Its `Debug` shows no secret.)
#[derive(Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ApplicationCredentialSignIn {
    pub id: String,
    pub secret: String,
}

impl std::fmt::Debug for PasswordSignIn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PasswordSignIn")
            .field("user", &self.user)
            .field("domain", &self.domain)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for ApplicationCredentialSignIn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApplicationCredentialSignIn").field("id", &self.id).finish_non_exhaustive()
    }
}

/// A project: its id, or its name in a domain.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ProjectParam {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The project's domain (name, or the id `default`); absent: the default domain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
}

/// A signed-in session: the Keystone token (keep it in memory; send it as `X-Auth-Token`) and
/// who it is.
#[derive(Clone, Serialize, Deserialize, ToSchema)]
pub struct SessionView {
    pub token: String,
    /// A password sign-in's unscoped token, the session's root: switch projects with it
    /// (`POST /v1/auth/tokens` with `project`, it in `X-Auth-Token`), and revoke it at sign-out
    /// (which ends every token had from it). Keep it in memory too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unscoped_token: Option<String>,
    /// RFC 3339.
    pub expires_at: String,
    pub user: NamedView,
    pub project: NamedView,
    /// Keystone's roles in the project.
    pub roles: Vec<String>,
    /// Whether gsaasd counts the session an admin's.
    pub admin: bool,
}

impl std::fmt::Debug for SessionView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionView")
            .field("user", &self.user)
            .field("project", &self.project)
            .field("admin", &self.admin)
            .finish_non_exhaustive()
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct NamedView {
    pub id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// The projects the signed-in user may switch to.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ProjectList {
    pub projects: Vec<NamedView>,
}
