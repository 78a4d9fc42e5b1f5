//! Keystone trusts: how a launch that waits in the queue is created as its tenant later.
//!
//! A server is created with the tenant's own Keystone token, which gsaasd keeps in memory only
//! and only until then. A queued launch may start an hour later, on another replica, after that
//! token expired. So at the launch the tenant delegates to gsaasd's service user, with its own
//! token, a trust: only the configured roles, only in its project, impersonating it (the server
//! is the tenant's, as if it had created it), and ending at the launch's queue deadline. What
//! gsaasd stores is the trust's id, which no one but the service user (with its own password)
//! can use. When the launch starts, the service user redeems the trust for a token scoped to the
//! tenant's project, creates the server with it, and deletes the trust with that same token (as
//! its trustor may). Heat and Magnum act for their tenants the same way.

use std::time::SystemTime;

use reqwest::StatusCode;
use serde::Deserialize;
use serde_json::json;

use super::keystone::{refusal, Keystone, KeystoneError, AUTH_TOKEN};
use super::time::format_rfc3339;

/// What a trust lets the service user act as: the tenant's user in its project.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrustToken {
    pub token: String,
    pub user_id: String,
    pub project_id: String,
}

#[derive(Debug, Deserialize)]
struct TrustEnvelope {
    trust: IdOnly,
}

#[derive(Debug, Deserialize)]
struct IdOnly {
    id: String,
}

#[derive(Debug, Deserialize)]
struct ScopedEnvelope {
    token: ScopedToken,
}

#[derive(Debug, Deserialize)]
struct ScopedToken {
    user: IdOnly,
    project: Option<IdOnly>,
}

fn protocol(reason: impl Into<String>, source: Option<serde_json::Error>) -> KeystoneError {
    KeystoneError::Protocol { reason: reason.into(), source }
}

impl Keystone {
    /// Creates, with the tenant's `token`, a trust from `user_id` to gsaasd's service user that
    /// delegates `roles` in `project_id`, impersonating, until `expires_at` (`None`: until
    /// deleted). Returns its id.
    pub async fn create_trust(
        &self,
        token: &str,
        user_id: &str,
        project_id: &str,
        roles: &[String],
        expires_at: Option<SystemTime>,
    ) -> Result<String, KeystoneError> {
        let trustee = self.token().await?.user_id;
        let roles: Vec<_> = roles.iter().map(|name| json!({ "name": name })).collect();
        let body = json!({ "trust": {
            "trustor_user_id": user_id,
            "trustee_user_id": trustee,
            "project_id": project_id,
            "roles": roles,
            "impersonation": true,
            "expires_at": expires_at.map(format_rfc3339),
        }});
        let url = format!("{}/OS-TRUST/trusts", self.settings().identity_v3());
        let request = self.http().post(&url).header(AUTH_TOKEN, token).json(&body);
        let (status, _, body) = self.send(request, &url).await?;
        if status != StatusCode::CREATED {
            return Err(refusal(status, &body));
        }
        let envelope: TrustEnvelope = serde_json::from_slice(&body)
            .map_err(|e| protocol("the trust does not parse", Some(e)))?;
        Ok(envelope.trust.id)
    }

    /// A token of the trust's trustor in its project, for the service user (its password, the
    /// trust's scope). `Rejected` once the trust expired or was deleted.
    pub async fn trust_token(&self, trust_id: &str) -> Result<TrustToken, KeystoneError> {
        let mut body = self.settings().password_auth_body();
        body["auth"]["scope"] = json!({ "OS-TRUST:trust": { "id": trust_id } });
        let (token, body) = self.issue(&body).await?;
        let envelope: ScopedEnvelope = serde_json::from_slice(&body)
            .map_err(|e| protocol("the trust-scoped token does not parse", Some(e)))?;
        let project = envelope
            .token
            .project
            .ok_or_else(|| protocol("a trust-scoped token without a project", None))?;
        Ok(TrustToken { token, user_id: envelope.token.user.id, project_id: project.id })
    }

    /// Deletes the trust with `token` (its trustor's, or one it scoped). One already gone is no
    /// error.
    pub async fn delete_trust(&self, token: &str, trust_id: &str) -> Result<(), KeystoneError> {
        let url = format!("{}/OS-TRUST/trusts/{trust_id}", self.settings().identity_v3());
        let request = self.http().delete(&url).header(AUTH_TOKEN, token);
        let (status, _, body) = self.send(request, &url).await?;
        match status {
            StatusCode::NO_CONTENT | StatusCode::OK | StatusCode::NOT_FOUND => Ok(()),
            _ => Err(refusal(status, &body)),
        }
    }
}
