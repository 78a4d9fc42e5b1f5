//! Moving bookings: fencing a VM's cGPUs, and re-homing a cGPU onto another GPU.
//!
//! A cGPU's booking must outlive the VM's use of it whenever its route may still be live on a
//! host whose agent cannot be reached: releasing it then would let another tenant's VM share a
//! GPU that the old VM still reaches. So bookings can move to a *holder*, a pool entry that is
//! not a VM (a fence): the capacity stays taken, nothing new lands on it, and the caller releases
//! the holder with [`Pool::release`] once the routes are known gone.
//!
//! Re-homing is the same move plus a new placement: the cGPU keeps its index (so its masked
//! endpoint) and gets a GPU other than the one it leaves (and, off a partition, other than its
//! parent's partitions), chosen by the same policies and indexes as every placement; the old booking goes to a holder until the VM's host no longer routes to it.

use std::collections::HashSet;

use super::Pool;
use crate::error::{Error, Shortfall};
use crate::ids::{HostId, VmId};
use crate::model::{CgpuAssignment, Locality, Mode, Placement, Request, VmHost};
use crate::topology::NetworkConstraint;
use crate::traits::GpuConstraints;

/// Where a re-homed cGPU may go.
#[derive(Debug, Clone)]
pub struct Rehome<'a> {
    /// On this host only (a `local` VM's host).
    pub on_host: Option<&'a HostId>,
    /// Off every other GPU the VM holds (a VM launched with `distinct_gpus`).
    pub distinct_gpus: bool,
    /// Onto a GPU its VM's request admits, ranked as it ranks them.
    pub constraints: &'a GpuConstraints,
    /// Where the network constraint of its VM's request allows around the VM's host.
    pub near: Option<(&'a HostId, &'a NetworkConstraint)>,
}

/// Anywhere, onto any GPU.
impl Default for Rehome<'_> {
    fn default() -> Self {
        static ANY_GPU: GpuConstraints = GpuConstraints::NONE;
        Rehome { on_host: None, distinct_gpus: false, constraints: &ANY_GPU, near: None }
    }
}

impl Pool {
    /// Moves the VM's cGPUs `indexes` to `holder` without releasing their capacity (see the module
    /// docs); the VM keeps its other cGPUs. A holder that exists is extended. All or nothing: an
    /// index the VM does not hold, or one the holder already holds, changes nothing.
    pub fn fence(
        &mut self,
        vm: &VmId,
        indexes: &[u32],
        holder: VmId,
    ) -> Result<Vec<CgpuAssignment>, Error> {
        let placement =
            self.vms.get(vm).ok_or_else(|| Error::Conflict(format!("VM {vm} holds no cGPUs")))?;
        let mut moved = Vec::with_capacity(indexes.len());
        for &index in indexes {
            let cgpu = placement
                .cgpus
                .iter()
                .find(|c| c.index == index)
                .ok_or_else(|| Error::Conflict(format!("VM {vm} holds no cGPU {index}")))?;
            moved.push(cgpu.clone());
        }
        self.check_holder(holder, &moved)?;
        for cgpu in &moved {
            self.take_from(vm, cgpu.index).expect("checked above");
        }
        self.give_to(holder, &moved, None);
        self.changes += 1;
        Ok(moved)
    }

    /// Moves the VM's cGPU `index` to a GPU other than its own, under `policy` and `to`, keeping
    /// its index, onto a GPU with the same number at its rCUDA server; its old booking goes to
    /// `holder` (`None`: released). Returns the new assignment; changes nothing when no GPU takes
    /// it.
    pub fn rehome(
        &mut self,
        vm: &VmId,
        index: u32,
        policy: &str,
        to: &Rehome<'_>,
        holder: Option<VmId>,
    ) -> Result<CgpuAssignment, Error> {
        let view = self.views_for(policy)?;
        let placement =
            self.vms.get(vm).ok_or_else(|| Error::Conflict(format!("VM {vm} holds no cGPUs")))?;
        let old = placement
            .cgpus
            .iter()
            .find(|c| c.index == index)
            .cloned()
            .ok_or_else(|| Error::Conflict(format!("VM {vm} holds no cGPU {index}")))?;
        let old_slot = self.gpu_by_id[&old.gpu];
        let mut kept: Vec<u32> = placement
            .cgpus
            .iter()
            .filter(|c| c.index != index)
            .map(|c| self.gpu_by_id[&c.gpu])
            .collect();
        if let Some(holder) = holder {
            self.check_holder(holder, std::slice::from_ref(&old))?;
        }
        let request = Request {
            ncgpus: 1,
            gpu_memory_mib: (old.mode == Mode::Shared).then_some(old.memory_mib),
            mode: old.mode,
            locality: if to.on_host.is_some() { Locality::Local } else { Locality::Any },
            distinct_gpus: to.distinct_gpus,
            constraints: to.constraints.clone(),
            network: NetworkConstraint::NONE,
            compute_percent: old.compute_percent.map(u32::from),
            vm_resources: None,
        };
        let shortfall = || Error::InsufficientCapacity(Shortfall::of(&request, 0, false));
        let tiers: Vec<Option<Vec<u32>>> = match (to.on_host, to.near) {
            (Some(host), _) => {
                let &h = self.host_by_id.get(host).ok_or_else(shortfall)?;
                vec![Some(self.hosts[h as usize].slots.clone())]
            }
            (None, Some((vm_host, network))) => self.near_tiers(network, vm_host),
            (None, None) => vec![None],
        };
        if self.views_stale {
            self.rebuild_views();
        }
        // Constraints no GPU meets any more (its kind withdrawn): no GPU takes it.
        let filter = self
            .filter(view, &request.gpu_constraints(), request.ncgpus)
            .map_err(|_| shortfall())?;
        // The VM still holds the old slot while the new one is taken (it counts among its GPUs and
        // hosts), and must not get it back.
        let mut held = kept.clone();
        held.push(old_slot);
        // The VM addresses its cGPU as `masked:gpu_number` (its environment does not change),
        // so the new GPU must have the old one's number at its rCUDA server.
        let mut hidden: Vec<u32> = (0..self.gpus.len() as u32)
            .filter(|&s| self.gpus[s as usize].spec.rcuda.gpu_number != old.rcuda.gpu_number)
            .collect();
        hidden.push(old_slot);
        // Off the physical GPU: a partition's siblings share what moves it (its parent's
        // failure, an admin's evacuation of its parent).
        if let Some(parent) = self.gpus[old_slot as usize].parent {
            hidden.extend(&self.gpus[parent as usize].partitions);
        }
        hidden.sort_unstable();
        hidden.dedup();
        self.set_masked(&hidden, true);
        let mut placed = Err(0);
        for within in &tiers {
            placed = self.place_on(&request, view, &filter, within.as_deref(), &held);
            if placed.is_ok() {
                break;
            }
        }
        self.set_masked(&hidden, false);
        let (mut cgpus, _) = placed.map_err(|_| shortfall())?;
        let mut new = cgpus.pop().expect("one cGPU placed");
        new.index = index;
        // The new booking is taken; now the old one leaves the VM.
        kept.push(self.gpu_by_id[&new.gpu]);
        self.untake_all(&[(old_slot, old.memory_mib, old.mode)], &kept);
        let placement = self.vms.get_mut(vm).expect("checked above");
        let at = placement.cgpus.iter().position(|c| c.index == index).expect("found above");
        placement.cgpus[at] = new.clone();
        let policy = placement.policy.clone();
        self.unhold(*vm, std::slice::from_ref(&old));
        self.hold(*vm, std::slice::from_ref(&new));
        if let Some(holder) = holder {
            self.give_to(holder, std::slice::from_ref(&old), Some(policy));
        }
        self.changes += 1;
        Ok(new)
    }

    /// Whether `holder` can take `cgpus`: it holds none of their indexes.
    fn check_holder(&self, holder: VmId, cgpus: &[CgpuAssignment]) -> Result<(), Error> {
        if let Some(held) = self.vms.get(&holder) {
            if let Some(c) = cgpus.iter().find(|c| held.cgpus.iter().any(|h| h.index == c.index)) {
                return Err(Error::Conflict(format!("{holder} already holds cGPU {}", c.index)));
            }
        }
        Ok(())
    }

    /// Removes the VM's cGPU `index` and gives its capacity back (a VM left with none holds no
    /// placement); `None`: the VM holds no such cGPU. Counts no change: the caller does.
    pub(super) fn take_from(&mut self, vm: &VmId, index: u32) -> Option<CgpuAssignment> {
        let placement = self.vms.get_mut(vm)?;
        let at = placement.cgpus.iter().position(|c| c.index == index)?;
        let cgpu = placement.cgpus.remove(at);
        let kept: Vec<u32> = placement.cgpus.iter().map(|c| self.gpu_by_id[&c.gpu]).collect();
        if placement.cgpus.is_empty() {
            // A VM with no cGPU left is no longer the pool's: nor is its host's CPU and memory.
            if self.vms.remove(vm).is_some_and(|p| p.vm_resources.is_some()) {
                self.unbook_vm_resources(vm);
            }
        }
        let slot = self.gpu_by_id[&cgpu.gpu];
        self.untake_all(&[(slot, cgpu.memory_mib, cgpu.mode)], &kept);
        self.unhold(*vm, std::slice::from_ref(&cgpu));
        Some(cgpu)
    }

    /// Books `cgpus` (whose capacity was just given back) for `holder`, created if needed.
    fn give_to(&mut self, holder: VmId, cgpus: &[CgpuAssignment], policy: Option<String>) {
        let mut gpus: HashSet<u32> = HashSet::new();
        let mut hosts: HashSet<u32> = HashSet::new();
        if let Some(held) = self.vms.get(&holder) {
            for c in &held.cgpus {
                let slot = self.gpu_by_id[&c.gpu];
                gpus.insert(slot);
                hosts.insert(self.gpus[slot as usize].host);
            }
        }
        for cgpu in cgpus {
            let slot = self.gpu_by_id[&cgpu.gpu];
            let new_gpu = gpus.insert(slot);
            let new_host = hosts.insert(self.gpus[slot as usize].host);
            self.take(slot, cgpu.memory_mib, cgpu.mode, new_gpu, new_host);
        }
        self.vms
            .entry(holder)
            .or_insert_with(|| Placement {
                vm: holder,
                policy: policy.unwrap_or_default(),
                vm_host: VmHost::AnyAgentHost,
                cgpus: Vec::new(),
                vm_resources: None,
            })
            .cgpus
            .extend(cgpus.iter().cloned());
        self.hold(holder, cgpus);
    }
}
