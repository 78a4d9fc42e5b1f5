//! The servers a host's agent runs, one per cGPU of its GPUs (`[gpu_servers] managed`).
//!
//! Such a host's table lists its GPUs' cGPUs ([`crate::db::served_cgpus_on`]); its agent starts
//! a server for each and answers, once each accepts, the port it listens on. gsaasd records
//! those ports ([`crate::db::Db::record_servers`]) and routes each cGPU to its own: a cGPU whose
//! server does not accept has no route (its VM lists it as missing), never a route to a port
//! where nothing of it listens. So a launch or an attach pushes the GPU hosts' tables first,
//! then the VM's host's; a release pushes the GPU hosts' after, which stops the servers.
//! Heartbeats keep the rest true: a server restarted on another port, or one that stopped
//! accepting, moves its route (the VM's host's table is pushed again), and an agent that runs
//! other servers than its table lists gets its table again.

use std::collections::{BTreeSet, HashSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use gpgpums::{HostId, VmId};
use rodvr_contract::protocol::{ManagedServers, ServerStatus};

use super::App;
use crate::db;
use crate::error::Error;
use crate::model::HostRecord;

impl App {
    /// Whether some host runs its GPUs' servers, as this process has seen (registrations, and
    /// the reconciler's passes, which read it from the database for the other replicas').
    pub(crate) fn managed_seen(&self) -> bool {
        self.managed_seen.load(Ordering::Relaxed)
    }

    /// Reads whether any GPU's host runs its servers (the reconciler, at each pass).
    pub(crate) async fn refresh_managed_seen(&self) -> Result<(), Error> {
        let any = self.db.any_managed_gpu().await?;
        self.managed_seen.store(any, Ordering::Relaxed);
        Ok(())
    }

    /// Records `host`'s servers (an answer to its table, or its report): the hosts whose tables
    /// route to servers that moved, to push next. A server its agent ended for holding more GPU
    /// memory than its share is an event on its VM (naming neither host nor GPU) and an alert on
    /// the host.
    pub(crate) async fn note_servers(
        &self,
        host: &HostId,
        statuses: &[ServerStatus],
    ) -> Result<BTreeSet<HostId>, Error> {
        self.managed_seen.store(true, Ordering::Relaxed);
        let reported: Vec<db::ReportedServer> = statuses
            .iter()
            .map(|s| db::ReportedServer {
                vm: s.vm,
                index: s.index,
                gpu: s.gpu.clone(),
                port: s.live_port(),
                over_share_ends: s.over_share_ends,
                routed_here: s.routed_here,
            })
            .collect();
        let changed = self.db.record_servers(host, &reported).await?;
        for (vm, index) in &changed.over_share {
            let detail = format!(
                "cGPU {index} held more GPU memory than its share: its server was ended and \
                 started again"
            );
            let event = db::VmEvent { at_ms: db::now_ms(), kind: "gpu_memory".into(), detail };
            self.db.record_events([*vm], &event).await?;
            let detail = format!(
                "the server of cGPU {index} of VM {vm} held more GPU memory than its share; the \
                 agent ended it"
            );
            self.alert_host(host, crate::model::AlertKind::ServerOverShare, detail).await;
        }
        if changed.moved.is_empty() {
            return Ok(BTreeSet::new());
        }
        tracing::debug!(%host, vms = changed.moved.len(), "cGPU servers moved; their VMs' routes follow");
        Ok(self.db.hosts_of_vms(&changed.moved).await?)
    }

    /// A heartbeat's servers: their ports recorded (and the routes of those that moved pushed,
    /// in the background), and the host's table pushed again when its agent runs other servers
    /// than the table lists.
    pub(crate) async fn servers_reported(
        self: &Arc<Self>,
        host: &HostRecord,
        managed: &ManagedServers,
    ) -> Result<(), Error> {
        let follow = self.note_servers(&host.name, &managed.servers).await?;
        let expected = {
            self.db
                .served_cgpus_on(std::slice::from_ref(&host.name))
                .await?
                .remove(&host.name)
                .unwrap_or_default()
        };
        let expected: HashSet<(VmId, u32, &gpgpums::GpuId)> =
            expected.iter().map(|s| (s.vm, s.index, &s.gpu)).collect();
        let running: HashSet<(VmId, u32, &gpgpums::GpuId)> =
            managed.servers.iter().map(|s| (s.vm, s.index, &s.gpu)).collect();
        let mut pushes: Vec<HostId> = follow.into_iter().collect();
        if expected != running && !pushes.contains(&host.name) {
            tracing::info!(host = %host.name, expected = expected.len(), running = running.len(), "the host runs other servers than its table lists; pushing it again");
            pushes.insert(0, host.name.clone());
        }
        if !pushes.is_empty() {
            let app = self.clone();
            tokio::spawn(async move { app.push_or_leave(pushes, "a server change").await });
        }
        Ok(())
    }

    /// Pushes the tables of the hosts that run `vm`'s servers (so that they accept), then the
    /// table of its own `host`, which routes to them.
    pub(crate) async fn push_servers_and_routes(
        &self,
        vm: VmId,
        host: &HostId,
    ) -> Result<(), Error> {
        if self.managed_seen() {
            let gpu_hosts = { self.db.managed_gpu_hosts_of(vm).await? };
            for gpu_host in gpu_hosts.iter().filter(|h| *h != host) {
                // Its answer records the servers' ports; the VM's host follows below.
                self.push_routes(gpu_host).await?;
            }
        }
        self.push_routes(host).await
    }

    /// The hosts that run `vm`'s servers, before its cGPUs are released: after the release, their
    /// tables are pushed ([`Self::stop_servers`]) so that the servers end.
    pub(crate) async fn server_hosts_of(&self, vm: VmId) -> Result<Vec<HostId>, Error> {
        if !self.managed_seen() {
            return Ok(Vec::new());
        }
        Ok(self.db.managed_gpu_hosts_of(vm).await?)
    }

    /// Pushes the tables of `hosts` in the background: the servers of released cGPUs end.
    pub(crate) fn stop_servers(self: &Arc<Self>, hosts: Vec<HostId>) {
        if hosts.is_empty() {
            return;
        }
        let app = self.clone();
        tokio::spawn(async move { app.push_or_leave(hosts, "a release").await });
    }
}
