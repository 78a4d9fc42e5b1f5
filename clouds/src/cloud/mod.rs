//! The cloud gsaasd creates VMs in, behind one small trait.
//!
//! The launch saga only needs five things from a cloud: check that a VM request can be met, create a
//! server (idempotently: a retried step must not create a second one), find a server created before a
//! crash, follow it to ACTIVE and then to "deployed" (its network is up), and delete it. `sim` is the
//! embedded default, a simulated Nova with Nova's state machine; `nova` (the real OpenStack API) comes
//! with the OpenStack backend.
//!
//! Errors say what the caller can do about them: `Invalid` names the request field the cloud refused
//! (400/422), `Quota` is the tenant's limit, `Unavailable` means the cloud could not be reached or
//! failed (503, the saga unwinds), `NotFound` is what undo steps treat as success.

use std::net::Ipv4Addr;
use std::time::Duration;

use async_trait::async_trait;
use gpgpums::{HostId, VmId};
use serde::{Deserialize, Serialize};

pub mod nova;
pub mod sim;
pub mod sim_netns;
pub mod sim_network;

/// Where the cloud may run a server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostConstraint {
    /// Exactly this host (Nova's `host`, locality `local`).
    Pinned(HostId),
    /// Any of these hosts, the cloud picks (remote: the compute-rGPU hosts; any: hosts with an
    /// agent). Shared, not copied per launch: a cloud has thousands.
    AnyOf(std::sync::Arc<[HostId]>),
    /// One of exactly these hosts and no other (those a request's network constraint leaves):
    /// the cloud picks among them, or, for a tenant's server, which may not name a host, the
    /// availability zone of one of them.
    OnlyOf(std::sync::Arc<[HostId]>),
}

/// A tenant's own credential, with which the cloud authorizes what is done in the tenant's name:
/// its Keystone token and project.
#[derive(Clone, PartialEq, Eq)]
pub struct TenantToken {
    pub token: String,
    /// The tenant's user (the trustor of a [`Delegation`]).
    pub user_id: String,
    pub project_id: String,
}

/// What lets the service act as a tenant later, without its token: a Keystone trust's id, which
/// only gsaasd's service user can use (see [`crate::openstack::trusts`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delegation(pub String);

impl std::fmt::Debug for TenantToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TenantToken").field("project_id", &self.project_id).finish_non_exhaustive()
    }
}

/// What a check found the request's names to be (Nova: the flavor's, image's and networks' ids).
/// gsaasd stores it with the launch (its saga's parameters), and every creation of the launch's
/// server passes it back (see [`ServerSpec::checked`]) rather than looking everything up again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checked {
    pub flavor: String,
    pub image: String,
    /// Nova's `networks` of `POST /servers` (a list of `{"uuid": ...}`, or `"auto"` / `"none"`).
    pub networks: serde_json::Value,
    /// The CPU and memory the flavor gives the VM, where the cloud says: what a `local` VM
    /// takes of its GPU host.
    pub flavor_resources: Option<gpgpums::Resources>,
}

/// Everything needed to create one server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerSpec {
    /// GSaaS's id of the VM; the cloud records it (Nova metadata) so the server can be found again.
    pub vm: VmId,
    pub request: VmRequest,
    /// The complete cloud-init user_data (the rCUDA environment merged with the user's own).
    pub user_data: Vec<u8>,
    pub host: HostConstraint,
    /// The tenant the server is created for, in its own project and with its own rights; `None`:
    /// as gsaasd's service user (the simulated cloud, and tests of the cloud itself).
    pub tenant: Option<TenantToken>,
    /// What the launch's check resolved the request to, stored with the launch: the cloud uses
    /// these ids as they are (Nova still authorizes each on creation, as the tenant). `None`: a
    /// launch stored before checks were kept, which the cloud resolves again.
    pub checked: Option<Checked>,
    /// Whether this is the launch's first creation attempt, made by the process that wrote the
    /// launch (or placed it from the queue) a moment before: no server can exist for the VM yet,
    /// so the cloud skips its search for one. A retry or a resumed saga looks first.
    pub first_attempt: bool,
}

/// Nova's server states that matter here.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", content = "fault", rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ServerStatus {
    Build,
    Active,
    /// Nova's fault message.
    Error(String),
}

/// A server as the cloud reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerInfo {
    pub id: ServerId,
    pub vm: VmId,
    pub status: ServerStatus,
    /// The hypervisor host (`OS-EXT-SRV-ATTR:host`), once scheduled.
    pub host: Option<HostId>,
    /// The VM's fixed IPv4 address, once its port is bound.
    pub fixed_ip: Option<Ipv4Addr>,
    /// The VM's tap interface on its host (`tap` + the port id's first 11 characters).
    pub tap: Option<String>,
}

/// A server as the cloud's admin sees it now, for following VMs moved or deleted behind GSaaS's
/// back (see `app::drift`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerSeen {
    pub id: ServerId,
    /// The hypervisor host it runs on, once scheduled.
    pub host: Option<HostId>,
    /// Deleted, or being deleted.
    pub gone: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum CloudError {
    /// The cloud refused a field of the VM request (unknown flavor, image, network or host).
    #[error("{field}: {reason}")]
    Invalid { field: &'static str, reason: String },
    /// The tenant's quota does not allow the VM.
    #[error("quota exceeded: {0}")]
    Quota(String),
    #[error("{0} not found")]
    NotFound(String),
    /// The cloud could not be reached, timed out or failed; retrying later may work.
    #[error("cloud unavailable: {reason}")]
    Unavailable {
        reason: String,
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
    /// The server went to ERROR; carries Nova's fault message.
    #[error("server failed: {0}")]
    ServerFailed(String),
    /// The server did not reach the awaited state in time.
    #[error("timed out after {0:?} waiting for the server")]
    Timeout(Duration),
}

impl CloudError {
    pub fn unavailable(reason: impl Into<String>) -> Self {
        CloudError::Unavailable { reason: reason.into(), source: None }
    }
}

/// A cloud that runs VMs. See the module docs.
#[async_trait]
pub trait Cloud: Send + Sync + std::fmt::Debug {
    /// Checks that the cloud can run the VM part of a request (flavor, image and networks exist,
    /// and `tenant`, when given, may use them), and what it found them to be.
    async fn check(
        &self,
        request: &VmRequest,
        tenant: Option<&TenantToken>,
    ) -> Result<Checked, CloudError>;

    /// Whether servers must be created as their tenant ([`ServerSpec::tenant`]): a real cloud's
    /// projects own their servers and authorize their images and networks.
    fn needs_tenant_token(&self) -> bool {
        false
    }

    /// Lets the service act as `tenant` until `until` (`None`: until revoked), for a launch that
    /// waits in the queue. Called only when [`Self::needs_tenant_token`].
    async fn delegate(
        &self,
        _tenant: &TenantToken,
        _until: Option<std::time::SystemTime>,
    ) -> Result<Delegation, CloudError> {
        Err(CloudError::unavailable("this cloud does not act for tenants"))
    }

    /// The tenant's credential, from its delegation.
    async fn redeem(&self, _delegation: &Delegation) -> Result<TenantToken, CloudError> {
        Err(CloudError::unavailable("this cloud does not act for tenants"))
    }

    /// Ends the delegation, with the tenant's credential (its own, or the redeemed one). One
    /// already ended is no error.
    async fn revoke(
        &self,
        _delegation: &Delegation,
        _tenant: &TenantToken,
    ) -> Result<(), CloudError> {
        Ok(())
    }

    /// Whether a server may carry user_data of `bytes` bytes, and why not: the cloud's own
    /// limit (Nova's: 65,535 bytes once base64-encoded), checked before anything is booked.
    fn check_user_data_len(&self, bytes: usize) -> Result<(), String> {
        let _ = bytes;
        Ok(())
    }

    /// Creates the server, or returns the one already created for `spec.vm`.
    async fn create_server(&self, spec: &ServerSpec) -> Result<ServerId, CloudError>;

    /// The server created for `vm`, if any (to recover a creation interrupted by a crash).
    async fn find_server(&self, vm: VmId) -> Result<Option<ServerId>, CloudError>;

    /// The server's current state; `NotFound` once it is deleted.
    async fn server(&self, id: &ServerId) -> Result<ServerInfo, CloudError>;

    /// Waits until the server is ACTIVE with its host known (`ServerFailed` on ERROR), at most `timeout`.
    async fn wait_active(&self, id: &ServerId, timeout: Duration)
        -> Result<ServerInfo, CloudError>;

    /// Waits until the ACTIVE server's network is up inside the VM (the paper's "VM deployment").
    async fn wait_deployed(&self, id: &ServerId, timeout: Duration) -> Result<(), CloudError>;

    /// Deletes the server and waits until it is gone. A server that does not exist is not an error.
    async fn delete_server(&self, id: &ServerId, timeout: Duration) -> Result<(), CloudError>;

    /// Every server of every project that changed since `since` (all of them when `None`),
    /// deleted ones included (Nova's `changes-since`).
    async fn changed_servers(
        &self,
        since: Option<std::time::SystemTime>,
    ) -> Result<Vec<ServerSeen>, CloudError>;
}

/// The cloud's id for a server (Nova's server UUID).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ServerId(pub String);

impl std::fmt::Display for ServerId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// The VM part of a launch request, as the cloud sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VmRequest {
    pub name: String,
    pub image: String,
    pub flavor: String,
    /// Network names or ids; empty means the cloud's default.
    #[serde(default)]
    pub networks: Vec<String>,
}
