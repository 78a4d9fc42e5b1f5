//! A `local` VM's CPU and memory on its GPU host, and the GPU that running out of them strands.
//!
//! A local VM runs on the host of its GPUs, so that host's CPU and memory bind as its GPUs do:
//! a host whose cores the VMs have used up keeps free GPUs that no local VM can be given. Where
//! a host's [`Resources`] offered to GSaaS's VMs are known (its agent reports them) the pool
//! books each local VM's there and puts none where it would not fit.
//!
//! A host's **stranded GPU** is the free GPU (in thousandths) that its free CPU cannot feed at
//! the cores per thousandth of a GPU that the local VMs booked ask on average:
//! `max(0, free GPU - free CPU / ratio)`. A policy that weighs it ([`crate::policy::Policy::weighs_stranding`],
//! `frag-gradient`) looks at the first [`LOOKAHEAD`] hosts with room in its own order and takes
//! the one whose placement strands least, in whole steps of [`STRAND_STEP_MILLI`] (then its own
//! order); a placement that strands less than a step is taken at once, which keeps most
//! decisions to one host. On the production trace this is what `frag-strand` adds to FGD where
//! CPU binds: frag-gradient through the pool with every pod local goes from 94.64% to 95.93% at
//! 130% (docs/operator/placement.md, "Placement quality on a production trace").

use super::Pool;
use crate::error::Error;
use crate::ids::{HostId, VmId};
use std::cmp::Ordering;

use crate::model::{Mode, Placement, Request, Resources, VmHost};
use crate::policy::{Candidate, Query};

/// How many hosts, in the policy's order, a stranding-aware local placement compares.
pub const LOOKAHEAD: usize = 8;

/// Thousandths of a GPU stranded that count as one step; less counts as none.
pub const STRAND_STEP_MILLI: u64 = 40;

/// How many hosts without room for a local VM its placement takes from the policy's index
/// before it looks only at hosts with room (a scan of their GPUs): a fleet whose hosts are out
/// of CPU but not of GPUs costs a pass, not a hidden host each.
pub const ROOMLESS_HOSTS_BEFORE_SCAN: u32 = 8;

/// The CPU the local VMs booked ask, against the GPU they hold: the ratio stranding reads.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct StrandMix {
    cpu_milli: u128,
    gpu_milli: u128,
}

impl StrandMix {
    fn count(&mut self, cpu_milli: u64, gpu_milli: u64, up: bool) {
        if up {
            self.cpu_milli += u128::from(cpu_milli);
            self.gpu_milli += u128::from(gpu_milli);
        } else {
            self.cpu_milli = self.cpu_milli.saturating_sub(u128::from(cpu_milli));
            self.gpu_milli = self.gpu_milli.saturating_sub(u128::from(gpu_milli));
        }
    }

    /// GPU (thousandths) left over once `cpu_free` feeds what it can at the mix's ratio.
    fn stranded(&self, gpu_free: u64, cpu_free: u64) -> u64 {
        if self.cpu_milli == 0 || self.gpu_milli == 0 {
            return 0;
        }
        // gpu_free - cpu_free x gpu / cpu, without leaving integers.
        let fed = u128::from(cpu_free) * self.gpu_milli / self.cpu_milli;
        u64::try_from(u128::from(gpu_free).saturating_sub(fed)).unwrap_or(u64::MAX)
    }
}

impl Pool {
    /// Sets what `host` offers the local VMs GSaaS pins there (`None`: unknown, and only its
    /// GPUs bind). Less than its VMs hold already is kept: the host takes no new local VM until
    /// enough leave.
    pub fn set_host_resources(
        &mut self,
        host: &HostId,
        offers: Option<Resources>,
    ) -> Result<(), Error> {
        let h = *self
            .host_by_id
            .get(host)
            .ok_or_else(|| Error::inventory("host", format!("host {host} is not registered")))?;
        if let Some((field, reason)) = offers.and_then(|o| o.problem()) {
            return Err(Error::invalid(field, reason));
        }
        let entry = &mut self.hosts[h as usize];
        if entry.offers != offers {
            entry.offers = offers;
            self.makeups = None;
            self.changes += 1;
        }
        Ok(())
    }

    /// What `host` offers local VMs (if known) and what they hold there.
    pub fn host_resources(&self, host: &HostId) -> Option<(Option<Resources>, Resources)> {
        let h = *self.host_by_id.get(host)?;
        let entry = &self.hosts[h as usize];
        Some((entry.offers, entry.taken))
    }

    /// Whether host `h` has room for `need` (always, where it offers nothing known).
    pub(super) fn host_has_room(&self, h: u32, need: Option<&Resources>) -> bool {
        let host = &self.hosts[h as usize];
        match (host.offers, need) {
            (Some(offers), Some(need)) => offers.has_room(&host.taken, need),
            _ => true,
        }
    }

    /// The best GPU (by the policy, for `request`) of each of the `wanted` first hosts with room
    /// for its VM, in the order the policy's index would give them one host at a time: one pass.
    pub(super) fn best_hosts_with_room(
        &self,
        view: usize,
        request: &Request,
        filter: &super::Filter,
        wanted: usize,
    ) -> Vec<u32> {
        let (mode, need) = (request.mode, super::request_need(request));
        let policy = &self.views[view].policy;
        let query = Query { need_mib: need, exclusive: mode == Mode::Exclusive, mix: &self.mix };
        // As `scan` orders: the higher rank first, then the policy's order.
        let before = |(ra, a): &(i32, Candidate), (rb, b): &(i32, Candidate)| {
            rb.cmp(ra).then_with(|| policy.compare_for(&query, a, b)) == Ordering::Less
        };
        let mut best: Vec<(i32, Candidate)> = Vec::with_capacity(wanted + 1);
        for h in 0..self.hosts.len() as u32 {
            if !self.host_has_room(h, request.vm_resources.as_ref()) {
                continue;
            }
            let slots = self.hosts[h as usize].slots.iter().copied();
            let Some(slot) = self.scan(view, mode, need, filter, slots) else { continue };
            let Some(rank) = filter.rank(self.gpus[slot as usize].kind) else { continue };
            let found = (rank, self.candidate(slot));
            let at = best.partition_point(|b| before(b, &found));
            if at < wanted {
                best.insert(at, found);
                best.truncate(wanted);
            }
        }
        best.into_iter().map(|(_, c)| c.slot).collect()
    }

    /// The GPU (thousandths) still free on host `h`'s GPUs that take new cGPUs.
    fn host_free_gpu_milli(&self, h: u32) -> u64 {
        self.hosts[h as usize]
            .slots
            .iter()
            .map(|&s| &self.gpus[s as usize])
            .filter(|gpu| self.serves(gpu) && gpu.spec.memory_mib > 0 && !gpu.exclusive)
            .map(|gpu| gpu.free_mib().saturating_mul(1000) / gpu.spec.memory_mib)
            .sum()
    }

    /// How much more GPU (thousandths) host `h` would strand once a VM taking `need` and
    /// `gpu_milli` of its GPU lands there.
    fn strand_growth(&self, h: u32, need: &Resources, gpu_milli: u64) -> u64 {
        let host = &self.hosts[h as usize];
        let Some(offers) = host.offers else { return 0 };
        let cpu_free = offers.cpu_milli.saturating_sub(host.taken.cpu_milli);
        let gpu_free = self.host_free_gpu_milli(h);
        let before = self.strand_mix.stranded(gpu_free, cpu_free);
        let after = self
            .strand_mix
            .stranded(gpu_free.saturating_sub(gpu_milli), cpu_free.saturating_sub(need.cpu_milli));
        after.saturating_sub(before)
    }

    /// [`Self::strand_growth`] in steps (see [`STRAND_STEP_MILLI`]).
    pub(super) fn strand_steps(&self, h: u32, request: &Request, first_slot: u32) -> u64 {
        let Some(need) = request.vm_resources else { return 0 };
        let gpu = &self.gpus[first_slot as usize];
        let per_cgpu = match request.mode {
            Mode::Exclusive => 1000,
            Mode::Shared => {
                request.gpu_memory_mib.unwrap_or(0).saturating_mul(1000)
                    / gpu.spec.memory_mib.max(1)
            }
        };
        let gpu_milli = per_cgpu.saturating_mul(u64::from(request.ncgpus));
        self.strand_growth(h, &need, gpu_milli) / STRAND_STEP_MILLI
    }

    /// How much GPU (thousandths) a VM taking `need` and no GPU would strand on `host`; `None`
    /// where it has no room or the host is unknown. For the trace replay's GPU-less pods, which
    /// a cloud places apart from GSaaS.
    pub fn strand_growth_without_gpus(&self, host: &HostId, need: &Resources) -> Option<u64> {
        let h = *self.host_by_id.get(host)?;
        self.host_has_room(h, Some(need)).then(|| self.strand_growth(h, need, 0))
    }

    /// Books the CPU and memory of a placement on its pinned host (a `local` VM that gave them).
    pub(super) fn book_vm_resources(&mut self, placement: &Placement) {
        let (Some(need), VmHost::Pinned(host)) = (placement.vm_resources, &placement.vm_host)
        else {
            return;
        };
        let Some(&h) = self.host_by_id.get(host) else { return };
        let gpu_milli: u64 = placement
            .cgpus
            .iter()
            .filter_map(|c| {
                let total = self.gpus[*self.gpu_by_id.get(&c.gpu)? as usize].spec.memory_mib;
                Some(c.memory_mib.saturating_mul(1000) / total.max(1))
            })
            .sum();
        let taken = &mut self.hosts[h as usize].taken;
        taken.cpu_milli = taken.cpu_milli.saturating_add(need.cpu_milli);
        taken.memory_mib = taken.memory_mib.saturating_add(need.memory_mib);
        self.strand_mix.count(need.cpu_milli, gpu_milli, true);
        self.local_vms.insert(placement.vm, LocalVm { host: h, resources: need, gpu_milli });
    }

    /// Gives back what [`Self::book_vm_resources`] booked for `vm`, exactly.
    pub(super) fn unbook_vm_resources(&mut self, vm: &VmId) {
        let Some(LocalVm { host, resources, gpu_milli }) = self.local_vms.remove(vm) else {
            return;
        };
        let taken = &mut self.hosts[host as usize].taken;
        taken.cpu_milli = taken.cpu_milli.saturating_sub(resources.cpu_milli);
        taken.memory_mib = taken.memory_mib.saturating_sub(resources.memory_mib);
        self.strand_mix.count(resources.cpu_milli, gpu_milli, false);
    }

    /// Checks the hosts' bookings against the local VMs', for [`Pool::audit`].
    pub(super) fn audit_vm_resources(&self) -> Result<(), String> {
        let mut taken = vec![Resources::default(); self.hosts.len()];
        for (vm, local) in &self.local_vms {
            let placement = self.vms.get(vm).ok_or("resources booked for a VM with no cGPUs")?;
            let pinned = match &placement.vm_host {
                VmHost::Pinned(host) => self.host_by_id.get(host) == Some(&local.host),
                _ => false,
            };
            if !pinned || placement.vm_resources != Some(local.resources) {
                return Err(format!("VM {vm}: resources booked apart from its placement"));
            }
            let t = &mut taken[local.host as usize];
            t.cpu_milli = t.cpu_milli.saturating_add(local.resources.cpu_milli);
            t.memory_mib = t.memory_mib.saturating_add(local.resources.memory_mib);
        }
        for placement in self.vms.values() {
            let pinned = matches!(placement.vm_host, VmHost::Pinned(_));
            if pinned
                && placement.vm_resources.is_some()
                && !self.local_vms.contains_key(&placement.vm)
            {
                return Err(format!("VM {}: its CPU and memory are not booked", placement.vm));
            }
        }
        for (h, host) in self.hosts.iter().enumerate() {
            if host.taken != taken[h] {
                return Err(format!(
                    "host {}: {:?} taken, its VMs hold {:?}",
                    host.id, host.taken, taken[h]
                ));
            }
        }
        Ok(())
    }
}

/// What a local VM booked on its host.
#[derive(Debug, Clone, Copy)]
pub(super) struct LocalVm {
    host: u32,
    resources: Resources,
    /// The GPU (thousandths) it held when booked, counted in the stranding mix.
    gpu_milli: u64,
}

#[cfg(test)]
mod tests {
    use super::StrandMix;

    #[test]
    fn a_host_strands_the_gpu_its_free_cores_cannot_feed() {
        let mut mix = StrandMix::default();
        assert_eq!(mix.stranded(1000, 0), 0, "no mix: nothing is stranded");
        // 8 cores per GPU: 8000 thousandths of a core per 1000 of a GPU.
        mix.count(8000, 1000, true);
        assert_eq!(mix.stranded(2000, 16_000), 0);
        assert_eq!(mix.stranded(2000, 8000), 1000);
        assert_eq!(mix.stranded(2000, 0), 2000);
        mix.count(8000, 1000, false);
        assert_eq!(mix.stranded(2000, 0), 0);
    }
}
