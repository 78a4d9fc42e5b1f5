//! Who a request acts as, once authenticated: a subject, a role and maybe a project. Apart from
//! `auth` (how tokens prove it), so that what checks a caller's rights (Keystone's token
//! validation among them) need not depend on how gsaasd's own tokens work.

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

/// An authenticated caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub subject: String,
    pub project: Option<String>,
    pub role: Role,
}

impl Caller {
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

    /// Whose VMs the caller sees: every project's (`None`, admins) or its own.
    pub fn visible_project(&self) -> Result<Option<&str>, Error> {
        match (self.role, &self.project) {
            (Role::Admin, _) => Ok(None),
            (Role::Member, Some(project)) => Ok(Some(project)),
            _ => Err(Error::NotFound { kind: "resource", id: String::new() }),
        }
    }

    pub fn require_admin(&self) -> Result<(), Error> {
        if self.is_admin() {
            Ok(())
        } else {
            Err(Error::NotFound { kind: "resource", id: String::new() })
        }
    }
}
