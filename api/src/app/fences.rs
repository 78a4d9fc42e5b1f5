//! Fencing: what a termination or detach does when the VM's host agent cannot be reached.
//!
//! Waiting for a dead host would leave the tenant's termination hanging and its cGPUs booked for
//! as long as the host stays down. Releasing the bookings at once would let another tenant's VM
//! share a GPU that the old VM may still reach, through routes its host keeps. So the VM ends (or
//! its cGPUs leave it) at once, and their bookings move to a *fence*: not placeable, charged to no
//! project, visible to admins. A fence is released when the host's agent confirms a route table
//! computed after the routes were withdrawn (the fence's generation), or when an admin declares
//! the host dead (`POST /v1/hosts/{name}/forget`): its routes then count as gone, and the host
//! must register again to take part. A fence lasts at most `hosts.fence_timeout_secs` (a day by
//! default): an agent that never confirms (hostile, or cut off that long) cannot hold other hosts'
//! GPUs for ever; admins get an alert on its host when that bound releases a fence. Re-homed cGPUs leave their old GPU through a fence too.

use std::sync::Arc;
use std::time::Duration;

use gpgpums::{CgpuAssignment, HostId, HostState, Pool, VmId};

use super::App;
use crate::config::HostsBackend;
use crate::db::{self, now_ms, Fenced};
use crate::error::Error;
use crate::model::{FenceId, FenceRecord, HostRecord, VmRecord};

/// Moves the VM's cGPUs that `which` names into a new fence on `host`, in the database and the
/// pool (inside the caller's pool transaction); returns them. The caller deletes the cGPUs' rows
/// (or moves them) and charges the project nothing more for them.
pub(crate) async fn fence_cgpus(
    pool: &mut Pool,
    tx: &mut db::PoolChange,
    vm: &VmRecord,
    host: &HostId,
    which: Fenced,
) -> Result<Vec<CgpuAssignment>, Error> {
    let Some((fence, indexes)) = open_fence(tx, FenceId::new_random(), vm.id, host, which).await?
    else {
        return Ok(Vec::new());
    };
    tracing::warn!(vm = %vm.id, %host, %fence, cgpus = indexes.len(), "cGPUs fenced");
    pool.fence(&vm.id, &indexes, fence.holder())
        .map_err(|e| Error::internal(format!("the pool is out of step with the database: {e}")))
}

/// Writes fence `id` on `host` holding copies of the VM's bookings that `which` names; returns
/// it and their indexes (`None`: there were none). The pool's side is the caller's.
pub(crate) async fn open_fence(
    tx: &mut db::PoolChange,
    id: FenceId,
    vm: VmId,
    host: &HostId,
    which: Fenced,
) -> Result<Option<(FenceId, Vec<u32>)>, Error> {
    // A generation taken now is above every table computed while the routes were on: a table the
    // agent confirms at or past it was computed without them.
    let Some(record) = tx.next_routes_generations(std::slice::from_ref(host)).await?.pop() else {
        return Ok(None);
    };
    let fence = FenceRecord {
        id,
        vm,
        host: host.clone(),
        generation: record.routes_generation,
        reason: match which {
            Fenced::Index(_) => {
                format!("re-homed; waiting for host {host} to route to the new GPU")
            }
            _ => format!("the agent of host {host} could not confirm the routes withdrawn"),
        },
        created_ms: now_ms(),
        cgpus: Vec::new(),
    };
    let indexes = tx.insert_fence(&fence, which).await?;
    if indexes.is_empty() {
        tx.delete_fences(&[fence.id]).await?;
        return Ok(None);
    }
    Ok(Some((fence.id, indexes)))
}

impl App {
    /// Withdraws routes from `host` (a termination's or a detach's): pushes its table, which no
    /// longer has them. Returns where the cGPUs must be fenced: `host` when its agent is known
    /// down (not waited for) or did not confirm the table; `None` when it did, when the host has
    /// no agent, or when it was forgotten (its routes count as gone). Storage errors are errors.
    pub(crate) async fn withdraw_routes(&self, host: &HostId) -> Result<Option<HostId>, Error> {
        // A host that is up (the usual case) is known from the host directory, with no read.
        let up = self
            .directory_host(host)
            .and_then(|(kind, state)| (state != HostState::Unavailable).then(|| kind.has_agent()));
        match up {
            Some(false) => return Ok(None),
            Some(true) => return self.push_or_fence(host).await,
            None => {}
        }
        let record = { self.db.host(host).await? };
        let Some(record) = record else { return Ok(None) };
        if !record.kind.has_agent() || record.forgotten {
            return Ok(None);
        }
        if self.config.hosts.backend == HostsBackend::Agent
            && record.state == HostState::Unavailable
        {
            return Ok(Some(host.clone()));
        }
        self.push_or_fence(host).await
    }

    /// Pushes the host's table: `None` once its agent confirmed it, `host` (fence there) when the
    /// agent did not.
    async fn push_or_fence(&self, host: &HostId) -> Result<Option<HostId>, Error> {
        match self.push_routes(host).await {
            Ok(()) => Ok(None),
            Err(e @ Error::Unavailable { dependency: "host agent", .. }) => {
                tracing::warn!(%host, error = %crate::error::ErrorChain(&e), "routes not confirmed withdrawn; fencing");
                Ok(Some(host.clone()))
            }
            Err(e) => Err(e),
        }
    }

    /// Every fence, for admins.
    pub async fn fences(&self) -> Result<Vec<FenceRecord>, Error> {
        Ok(self.db.fences().await?)
    }

    /// Whether the host's agent is alive as far as gsaasd knows: in-process agents always are;
    /// a real one while it heartbeats.
    fn agent_is_live(&self, host: &HostRecord) -> bool {
        if !host.kind.has_agent() || host.forgotten {
            return false;
        }
        match self.config.hosts.backend {
            HostsBackend::InProcess => true,
            HostsBackend::Agent => {
                let timeout = Duration::from_secs(self.config.hosts.heartbeat_timeout_secs);
                host.state != HostState::Unavailable
                    && now_ms() - host.last_seen_ms < timeout.as_millis() as i64
            }
        }
    }

    /// Declares the host dead (see the module docs): it takes no new cGPUs, its routes count as
    /// gone (its fences are released), and nothing is pushed to it until its agent registers
    /// again. A host whose agent is alive is refused unless `force`.
    pub async fn forget_host(
        self: &Arc<Self>,
        name: &HostId,
        force: bool,
    ) -> Result<HostRecord, Error> {
        let host = { self.db.host(name).await? }
            .ok_or_else(|| Error::NotFound { kind: "host", id: name.to_string() })?;
        if !force && self.agent_is_live(&host) {
            return Err(Error::Conflict(format!(
                "the agent of host {name} is alive (it reported {} s ago): forget a host only \
                 when it is dead, or with force=true",
                (now_ms() - host.last_seen_ms).max(0) / 1000
            )));
        }
        let forgotten = name.clone();
        self.with_pool(move |pool, tx| {
            Box::pin(async move {
                tx.forget_host(&forgotten).await?;
                pool.set_host_state(&forgotten, HostState::Unavailable)?;
                Ok(())
            })
        })
        .await?;
        tracing::warn!(host = %name, force, "host forgotten: its routes count as gone");
        self.release_fences().await?;
        self.db
            .host(name)
            .await?
            .ok_or_else(|| Error::NotFound { kind: "host", id: name.to_string() })
    }
}
