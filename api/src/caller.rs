//! Who a request acts as, once authenticated: a subject, a role and maybe a project. Apart from
//! `auth` (how tokens prove it), so that what checks a caller's rights (Keystone's token
//! validation among them) need not depend on how gsaasd's own tokens work.

use gsaas_clouds::openstack::TenantIdentity;
use serde::{Deserialize, Serialize};

use crate::error::Error;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// A tenant: acts on its project's VMs.
    Member,
    /// An operator: sees and acts on everything.
    Admin,
    /// A host's RODVR agent: registers its host and heartbeats, nothing else.
    Agent,
    /// A metrics scraper (Prometheus): reads `/metrics`, nothing else.
    Metrics,
}

impl Role {
    pub fn name(self) -> &'static str {
        match self {
            Role::Member => "member",
            Role::Admin => "admin",
            Role::Agent => "agent",
            Role::Metrics => "metrics",
        }
    }
}

/// An authenticated caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub subject: String,
    pub project: Option<String>,
    /// What gsaasd makes of the caller (for Keystone tokens: `member`, or `admin` where
    /// `[auth] keystone_admin_*` say).
    pub role: Role,
    /// What the policy file's rules may read besides (`policy`).
    pub scope: Scope,
}

/// The caller's roles and scope as its token states them: Keystone's, or for gsaasd's own
/// tokens their one role.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Scope {
    pub roles: Vec<String>,
    pub project_name: Option<String>,
    pub project_domain_id: Option<String>,
    /// A Keystone token scoped to the whole system.
    pub system: bool,
    /// gsaasd itself (drift's terminations): no policy applies to it, and no token makes one.
    pub(crate) internal: bool,
}

impl Caller {
    /// A caller of gsaasd's own tokens: its role is its one role.
    pub fn new(subject: impl Into<String>, project: Option<String>, role: Role) -> Caller {
        let scope = Scope { roles: vec![role.name().to_owned()], ..Scope::default() };
        Caller { subject: subject.into(), project, role, scope }
    }

    /// A caller Keystone authenticated: the Keystone user, bound to its project, with the roles
    /// and scope its token states for the policy file's rules.
    pub fn keystone(identity: &TenantIdentity) -> Caller {
        let info = &identity.info;
        let role = if identity.admin { Role::Admin } else { Role::Member };
        let mut caller = Caller::new(info.user_id.clone(), identity.project_id.clone(), role);
        caller.scope = Scope {
            roles: info.roles.clone(),
            project_name: info.project_name.clone(),
            project_domain_id: info.project_domain.as_ref().map(|(id, _)| id.clone()),
            system: info.system,
            ..Scope::default()
        };
        caller
    }

    /// gsaasd acting on its own (see [`Scope::internal`]).
    pub(crate) fn internal() -> Caller {
        let mut caller = Caller::new("gsaasd", None, Role::Admin);
        caller.scope.internal = true;
        caller
    }

    pub fn is_admin(&self) -> bool {
        self.role == Role::Admin
    }

    /// The caller's project, for what happens in one (a launch); agents have none and are
    /// refused, and so is an admin whose token is scoped to no project (Keystone's system scope).
    pub fn tenant_project(&self) -> Result<&str, Error> {
        match (self.role, &self.project) {
            (Role::Member | Role::Admin, Some(project)) => Ok(project),
            (Role::Admin, None) => Err(Error::invalid(
                "token",
                "is scoped to no project: use a project-scoped token to act in a project",
            )),
            _ => Err(Error::NotFound { kind: "resource", id: String::new() }),
        }
    }
}
