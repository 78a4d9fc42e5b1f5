//! Re-homing cGPUs: moving them to other GPUs without the VM noticing.
//!
//! A cGPU's masked endpoint does not depend on its GPU, so a cGPU can move: its booking moves to
//! a GPU the planner chooses (the same policies, quotas untouched: the VM holds as many cGPUs as
//! before), its row keeps its index and so its masked address and port, and the VM's host agent
//! re-targets the route. New connections reach the new GPU; connections open to the old one are
//! cut by the agent (a CUDA context on the old GPU is lost: the application must reconnect). The
//! old booking is fenced (see [`crate::app::fences`]) until the agent confirms the new table, so no
//! other VM gets the old GPU while this one may still reach it.
//!
//! Admins evacuate a GPU (with its partitions) or a host (all or nothing: 507 when anything has
//! nowhere to go). With `hosts.auto_rehome`, the reconciler moves the cGPUs of GPUs that failed (unhealthy, or on a
//! host that is down); a cGPU that fits nowhere becomes `lost` (no route, still booked) and is
//! tried again each pass, or goes live where it is once its GPU works again.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use gpgpums::{GpuId, HostId, Locality, Rehome, VmId};

use crate::app::fences::open_fence;
use crate::app::App;
use crate::db::{self, now_ms, Fenced};
use crate::db::{VmWrite, Written};
use crate::error::Error;
use crate::model::{CgpuRecord, CgpuState, FenceId, GpuRecord, SagaStep, VmRecord};
use std::time::Duration;

use async_trait::async_trait;

use super::driver::{Failed, Report, Task, TaskName};
use crate::config::Config;

/// What to move cGPUs off.
#[derive(Debug, Clone)]
pub enum Evacuate {
    Gpu(GpuId),
    Host(HostId),
}

/// What a re-homing did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rehomed {
    /// cGPUs moved to another GPU.
    pub moved: u32,
    /// cGPUs that fit nowhere and are now `lost` (the reconciler's passes only).
    pub lost: u32,
    /// Lost cGPUs live again on their GPU, which works again (the reconciler's passes only).
    pub recovered: u32,
    /// The VMs whose cGPUs moved or were lost.
    pub vms: BTreeSet<VmId>,
}

/// How a cGPU that cannot move is treated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NoRoom {
    /// Nothing is moved at all: an admin's evacuation, answered 507.
    Refuse,
    /// It becomes `lost`: the reconciler's re-homing of failed GPUs.
    Lose,
}

impl App {
    /// Moves every cGPU off a GPU or a host's GPUs (admins): all or nothing.
    pub async fn evacuate(self: &Arc<Self>, what: Evacuate) -> Result<Rehomed, Error> {
        let gpus: Vec<GpuId> = {
            let all = self.db.gpus().await?;
            match &what {
                Evacuate::Gpu(id) => {
                    if !all.iter().any(|g| &g.id == id) {
                        return Err(Error::NotFound { kind: "GPU", id: id.to_string() });
                    }
                    // A partitioned GPU's cGPUs are on its partitions.
                    let of_it = |g: &GpuRecord| {
                        &g.id == id || g.partition.as_ref().is_some_and(|p| &p.parent == id)
                    };
                    all.into_iter().filter(of_it).map(|g| g.id).collect()
                }
                Evacuate::Host(name) => {
                    if self.db.host(name).await?.is_none() {
                        return Err(Error::NotFound { kind: "host", id: name.to_string() });
                    }
                    all.into_iter().filter(|g| &g.host == name).map(|g| g.id).collect()
                }
            }
        };
        let reason = match &what {
            Evacuate::Gpu(_) => "an admin evacuated its GPU",
            Evacuate::Host(_) => "an admin evacuated its GPU's host",
        };
        self.rehome(gpus, reason, NoRoom::Refuse).await
    }

    /// The reconciler's part: re-homes the cGPUs of failed GPUs (with `hosts.auto_rehome`), and
    /// brings lost cGPUs back where their GPU works again.
    pub(crate) async fn rehome_failed(self: &Arc<Self>) -> Result<Rehomed, Error> {
        let (failed, lost_back) = {
            let failed = if self.config.hosts.auto_rehome {
                self.db.failed_gpus_in_use().await?
            } else {
                Vec::new()
            };
            (failed, self.db.has_recoverable_lost_cgpus().await?)
        };
        let mut done = Rehomed::default();
        if lost_back {
            let recovered = self.db.recover_lost_cgpus().await?;
            done.recovered = recovered.len() as u32;
            let vms: BTreeSet<VmId> = recovered.iter().map(|(vm, _)| *vm).collect();
            self.record_events(
                vms.iter().copied(),
                "recovered",
                "a lost cGPU is live again on its GPU, which works again",
            )
            .await?;
            self.push_vms_routes(&vms).await;
            done.vms.extend(vms);
        }
        if !failed.is_empty() {
            let moved = self.rehome(failed, "its GPU failed", NoRoom::Lose).await?;
            done.moved = moved.moved;
            done.lost = moved.lost;
            done.vms.extend(moved.vms);
        }
        Ok(done)
    }

    async fn rehome(
        self: &Arc<Self>,
        gpus: Vec<GpuId>,
        reason: &'static str,
        no_room: NoRoom,
    ) -> Result<Rehomed, Error> {
        let mut pool_tx = self.pool_tx().await?;
        let (pool, tx) = pool_tx.parts();
        let cgpus = tx.cgpus_on_gpus(&gpus).await?;
        let mut by_vm: BTreeMap<VmId, Vec<CgpuRecord>> = BTreeMap::new();
        for cgpu in cgpus {
            by_vm.entry(cgpu.vm).or_default().push(cgpu);
        }
        let mut done = Rehomed::default();
        let now = now_ms();
        for (id, cgpus) in by_vm {
            let Some(vm) = tx.vm(id).await? else { continue };
            // Only a settled VM: a saga step in flight (a launch, an attach, a termination) may
            // push or learn the VM's host meanwhile. Its write below, conditional on the version
            // read here, also makes such a step that starts now read the VM again.
            let settled = vm.step == SagaStep::Done;
            let mut write =
                [VmWrite { vm: VmRecord { updated_ms: now, ..vm.clone() }, claim: None }];
            if !settled || tx.update_vms(&mut write).await?.first() == Some(&Written::Stale) {
                if no_room == NoRoom::Refuse {
                    return Err(Error::Conflict(format!(
                        "VM {id} on this GPU is changing ({}): retry the evacuation once it \
                         settles",
                        vm.step.as_str()
                    )));
                }
                continue;
            }
            let mut moved = Vec::new();
            let mut lost = Vec::new();
            for cgpu in &cgpus {
                let to = Rehome {
                    on_host: (vm.spec.gpus.locality == Locality::Local)
                        .then_some(vm.host.as_ref().unwrap_or(&cgpu.host)),
                    distinct_gpus: vm.spec.gpus.distinct_gpus,
                    constraints: &vm.spec.gpus.constraints,
                    near: vm
                        .host
                        .as_ref()
                        .filter(|_| !vm.spec.gpus.network.is_empty())
                        .map(|host| (host, &vm.spec.gpus.network)),
                };
                // Routes may be live where the VM runs: the old booking waits there in a fence,
                // written only once the cGPU has somewhere to go.
                let fence = vm.host.as_ref().map(|host| (FenceId::new_random(), host));
                let holder = fence.as_ref().map(|(fence, _)| fence.holder());
                match pool.rehome(&id, cgpu.index, &vm.policy, &to, holder) {
                    Ok(new) => {
                        if let Some((fence, host)) = fence {
                            let which = Fenced::Index(cgpu.index);
                            if open_fence(tx, fence, id, host, which).await?.is_none() {
                                // The VM's host is not registered: no routes wait there.
                                pool.release(&fence.holder());
                            }
                        }
                        tx.move_cgpu(id, cgpu.index, &new.gpu).await?;
                        moved.push(cgpu.index);
                    }
                    Err(gpgpums::Error::InsufficientCapacity(shortfall)) => {
                        if no_room == NoRoom::Refuse {
                            return Err(Error::InsufficientCapacity(shortfall));
                        }
                        if cgpu.state != CgpuState::Lost {
                            let state = cgpu.state;
                            tx.set_cgpu_states(id, Some(cgpu.index), state, CgpuState::Lost)
                                .await?;
                            lost.push(cgpu.index);
                        }
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            if !moved.is_empty() || !lost.is_empty() {
                done.vms.insert(id);
            }
            done.moved += moved.len() as u32;
            done.lost += lost.len() as u32;
            for (kind, indexes, detail) in [
                ("rehomed", &moved, format!("moved to another GPU ({reason}); their masked addresses are unchanged, and connections open to the old GPU were cut")),
                ("lost", &lost, format!("lost ({reason}) and no other GPU can take them now; they have no route until one can or until their GPU works again")),
            ] {
                if !indexes.is_empty() {
                    let list: Vec<String> = indexes.iter().map(u32::to_string).collect();
                    let detail = format!("cGPU(s) {}: {detail}", list.join(", "));
                    let event = db::VmEvent { at_ms: now, kind: kind.into(), detail };
                    tx.insert_event(id, &event).await?;
                }
            }
        }
        if done.moved + done.lost == 0 {
            // Nothing moved (nowhere to go, again): nothing is committed, so other replicas keep
            // their pools.
            return Ok(done);
        }
        pool_tx.commit().await?;
        tracing::warn!(
            moved = done.moved,
            lost = done.lost,
            vms = done.vms.len(),
            reason,
            "cGPUs re-homed"
        );
        self.push_vms_routes(&done.vms).await;
        // Fences on hosts that confirm at once are released now rather than next pass.
        self.trigger_reconcile();
        Ok(done)
    }

    /// Pushes the tables of the hosts the VMs run on (see [`App::push_or_leave`]).
    async fn push_vms_routes(&self, vms: &BTreeSet<VmId>) {
        let hosts: BTreeSet<HostId> = {
            let mut hosts = BTreeSet::new();
            for id in vms {
                if let Ok(Some(vm)) = self.db.vm(*id).await {
                    hosts.extend(vm.host);
                }
            }
            hosts
        };
        self.push_or_leave(hosts, "re-homing").await;
    }

    /// Gives each VM an event of `kind`, in one transaction.
    pub(super) async fn record_events(
        &self,
        vms: impl IntoIterator<Item = VmId>,
        kind: &str,
        detail: &str,
    ) -> Result<(), Error> {
        let event = db::VmEvent { at_ms: now_ms(), kind: kind.into(), detail: detail.into() };
        Ok(self.db.record_events(vms, &event).await?)
    }
}

/// The reconciler's part of re-homing ([`App::rehome_failed`]).
#[derive(Debug)]
pub(crate) struct RehomeFailed;

#[async_trait]
impl Task for RehomeFailed {
    fn name(&self) -> TaskName {
        TaskName::Rehome
    }
    fn describe(&self) -> &'static str {
        "Moves the cGPUs of failed GPUs to healthy ones; brings lost cGPUs back where their GPU works."
    }
    fn period(&self, config: &Config) -> Duration {
        super::reconciler::period(config)
    }
    fn at_start(&self) -> bool {
        false
    }
    async fn activate(&self, app: &Arc<App>) -> Result<Report, Failed> {
        let done = app.rehome_failed().await?;
        let report = Report::default().with("cgpus_rehomed", done.moved);
        Ok(report.with("cgpus_lost", done.lost).with("cgpus_recovered", done.recovered))
    }
}
