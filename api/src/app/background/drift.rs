//! Cloud drift: VMs deleted or moved behind GSaaS's back.
//!
//! Users and operators act on servers directly: `openstack server delete`, a live migration, an
//! evacuation, a resize. Each reconciler pass asks the cloud which servers changed since the
//! last pass (Nova's `changes-since`, deleted ones included, with each server's host), and:
//! - a VM whose server is gone is terminated like any other (routes withdrawn, cGPUs released or
//!   fenced), with the reason as its error;
//! - a ready VM whose server runs on another host now gets its routes there, and they leave the
//!   old host: its masked endpoints are the same wherever it runs, so its cGPUs follow it without
//!   anything changing inside the VM (GPU passthrough, by contrast, blocks live migration).
//!
//! The window overlaps the previous pass by [`OVERLAP`] against clock skew between gsaasd and the
//! cloud; a change seen twice is handled once (the VM no longer differs). A process's first pass
//! lists every server instead: a server deleted while no gsaasd looked may be gone from the
//! cloud's records altogether (Nova archives deleted rows), so a ready VM whose server that full
//! listing lacks is ended too (only one that was ready before the listing began).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use gpgpums::HostId;

use crate::app::App;
use crate::auth::Caller;
use crate::cloud::ServerSeen;
use crate::db::{self, now_ms, VmWrite, Written};
use crate::error::Error;
use crate::model::{SagaStep, VmState};

use async_trait::async_trait;

use super::driver::{Failed, Report, Task, TaskName};
use crate::config::Config;

/// How far each look back reaches before the previous pass's start.
pub const OVERLAP: Duration = Duration::from_secs(60);

/// Why gsaasd ended a VM whose server was deleted outside GSaaS.
pub const SERVER_DELETED: &str = "its server was deleted outside GSaaS";

/// A listing of every server, begun at `began_ms`.
#[derive(Debug, Clone, Copy)]
struct Listing {
    began_ms: i64,
}

impl Listing {
    /// Whether a VM whose server this listing lacks was gone before it began: a VM ready since
    /// before the listing (one that became ready later may have a server the listing missed).
    fn lacks(&self, vm: &db::VmServer) -> bool {
        vm.ready && vm.updated_ms < self.began_ms
    }
}

/// What a pass found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Drift {
    /// VMs whose server was deleted outside GSaaS, now being terminated.
    pub deleted: u32,
    /// VMs whose server moved to another host, and whose routes followed.
    pub moved: u32,
}

impl App {
    /// One look at the cloud; see the module docs.
    pub(crate) async fn follow_cloud(self: &Arc<Self>) -> Result<Drift, Error> {
        let started = SystemTime::now();
        let started_ms = now_ms();
        let since = *self.cloud_seen.lock().expect("cloud seen");
        let seen = self
            .cloud
            .changed_servers(since.map(|t| t - OVERLAP))
            .await
            .map_err(|e| Error::unavailable("cloud", e))?;
        let full = since.is_none().then_some(Listing { began_ms: started_ms });
        let drift = self.apply_drift(seen, full).await?;
        *self.cloud_seen.lock().expect("cloud seen") = Some(started);
        Ok(drift)
    }

    /// Follows what `seen` says of each VM's server. With `full`, `seen` lists every server: one
    /// read of every VM with a server (rather than a lookup per server), and the ready VMs whose
    /// servers it lacks are ended too.
    async fn apply_drift(
        self: &Arc<Self>,
        seen: Vec<ServerSeen>,
        full: Option<Listing>,
    ) -> Result<Drift, Error> {
        let mut drift = Drift::default();
        if seen.is_empty() && full.is_none() {
            return Ok(drift);
        }
        let vms = {
            if full.is_some() {
                self.db.vms_with_servers().await?
            } else {
                let ids: Vec<_> = seen.iter().map(|s| s.id.clone()).collect();
                self.db.vms_on_servers(&ids).await?
            }
        };
        let seen: HashMap<_, _> = seen.iter().map(|s| (&s.id, s)).collect();
        let gsaasd = Caller::internal();
        for vm in vms {
            let Some(server) = seen.get(&vm.server) else {
                if full.is_some_and(|listing| listing.lacks(&vm)) {
                    tracing::warn!(vm = %vm.vm, "the cloud lists no server for the VM; terminating it");
                    self.terminate_because(&gsaasd, vm.vm, Some(SERVER_DELETED)).await?;
                    drift.deleted += 1;
                }
                continue;
            };
            if server.gone {
                tracing::warn!(vm = %vm.vm, server = %server.id, "server deleted outside GSaaS; terminating its VM");
                self.terminate_because(&gsaasd, vm.vm, Some(SERVER_DELETED)).await?;
                drift.deleted += 1;
                continue;
            }
            let Some(host) = &server.host else { continue };
            // A VM still launching learns its host from the saga; one changing cGPUs is followed
            // at the next pass, once settled.
            let elsewhere = vm.host.as_ref().is_some_and(|old| old != host);
            if !(vm.settled && elsewhere) {
                continue;
            }
            let record = self.db.vm(vm.vm).await?;
            let Some(record) = record else { continue };
            let settled = record.state == VmState::Ready && record.step == SagaStep::Done;
            let elsewhere = record.host.as_ref().is_some_and(|old| old != host);
            if settled && elsewhere && self.follow_move(record, host.clone()).await? {
                drift.moved += 1;
            }
        }
        Ok(drift)
    }

    /// Moves the VM's routes to `host`, where its server runs now. False: the VM changed
    /// meanwhile (the next pass looks again).
    async fn follow_move(&self, vm: crate::model::VmRecord, host: HostId) -> Result<bool, Error> {
        let old = vm.host.clone();
        tracing::warn!(vm = %vm.id, from = ?old, to = %host, "server moved outside GSaaS; its routes follow");
        let mut moved = vm;
        moved.host = Some(host.clone());
        moved.updated_ms = now_ms();
        let (written, outcome) = self.write_vm(VmWrite { vm: moved, claim: None }).await?;
        if outcome == Written::Stale {
            return Ok(false);
        }
        self.watchers.changed(&written);
        let detail = "the VM moved to another compute host (a live migration or an evacuation); \
                      its cGPUs followed it, at the same masked endpoints";
        self.record_events([written.id], "moved", detail).await?;
        // The new host first: the VM runs there now.
        self.push_or_leave(std::iter::once(host).chain(old), "a move").await;
        Ok(true)
    }
}

#[derive(Debug)]
pub(crate) struct CloudDrift;

#[async_trait]
impl Task for CloudDrift {
    fn name(&self) -> TaskName {
        TaskName::CloudDrift
    }
    fn describe(&self) -> &'static str {
        "Follows servers deleted or moved outside GSaaS: ends their VMs, or moves their routes."
    }
    fn period(&self, config: &Config) -> Duration {
        super::reconciler::period(config)
    }
    fn at_start(&self) -> bool {
        false
    }
    async fn activate(&self, app: &Arc<App>) -> Result<Report, Failed> {
        let drift = app.follow_cloud().await?;
        let report = Report::default().with("servers_deleted", drift.deleted);
        Ok(report.with("servers_moved", drift.moved))
    }
}
