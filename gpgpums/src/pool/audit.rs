//! The pool's bookkeeping checked against what the VMs hold: for tests and audits.

use super::*;

impl Pool {
    /// Checks the pool's bookkeeping against what the VMs hold. For tests and audits.
    pub fn audit(&self) -> Result<(), String> {
        let mut used = vec![0u64; self.gpus.len()];
        let mut cgpus = vec![0u32; self.gpus.len()];
        let mut exclusive = vec![false; self.gpus.len()];
        let mut jobs = vec![0u32; self.gpus.len()];
        let mut host_vms = vec![0u32; self.hosts.len()];
        let mut holders: Vec<Vec<VmId>> = vec![Vec::new(); self.gpus.len()];
        let mut computes = vec![(0u32, 0u32); self.gpus.len()];
        for placement in self.vms.values() {
            let mut gpus = HashSet::new();
            let mut hosts = HashSet::new();
            for cgpu in &placement.cgpus {
                let slot =
                    *self.gpu_by_id.get(&cgpu.gpu).ok_or("placement on unknown GPU")? as usize;
                used[slot] += cgpu.memory_mib;
                cgpus[slot] += 1;
                if let Some(percent) = cgpu.compute_percent {
                    computes[slot].0 += u32::from(percent);
                    computes[slot].1 += 1;
                }
                holders[slot].push(placement.vm);
                exclusive[slot] |= cgpu.mode == Mode::Exclusive;
                if gpus.insert(slot) {
                    jobs[slot] += 1;
                }
                if hosts.insert(self.gpus[slot].host) {
                    host_vms[self.gpus[slot].host as usize] += 1;
                }
            }
        }
        for (slot, gpu) in self.gpus.iter().enumerate() {
            let id = &gpu.spec.id;
            if gpu.used_mib != used[slot] || gpu.cgpus != cgpus[slot] || gpu.jobs != jobs[slot] {
                return Err(format!("GPU {id}: bookkeeping differs from the VMs' placements"));
            }
            if (gpu.compute_percent, gpu.compute_cgpus) != computes[slot] {
                return Err(format!("GPU {id}: compute shares differ from the VMs' placements"));
            }
            if gpu.compute_percent > 100 {
                return Err(format!("GPU {id}: compute shares add up to {}%", gpu.compute_percent));
            }
            let plain = !gpu.exclusive && gpu.cgpus > gpu.compute_cgpus;
            if self.compute_gpus.contains(id) != (gpu.compute_cgpus > 0)
                || self.plain_on_mps.contains(id)
                    != (plain && self.kinds[gpu.kind as usize].kind.mps)
            {
                return Err(format!("GPU {id}: filed wrong for compute shares"));
            }
            let mut recorded = gpu.holders.clone();
            recorded.sort_unstable();
            holders[slot].sort_unstable();
            if recorded != holders[slot] {
                return Err(format!("GPU {id}: holders differ from the VMs' placements"));
            }
            if gpu.used_mib > gpu.spec.memory_mib {
                return Err(format!(
                    "GPU {id}: {} MiB allocated of {}",
                    gpu.used_mib, gpu.spec.memory_mib
                ));
            }
            if let Some(parent) = gpu.parent {
                let parent = &self.gpus[parent as usize];
                if !parent.partitions.contains(&(slot as u32)) {
                    return Err(format!("GPU {id}: its parent does not list it"));
                }
                if parent.cgpus > 0 && gpu.cgpus > 0 {
                    return Err(format!(
                        "GPU {id}: booked beside its parent GPU {}",
                        parent.spec.id
                    ));
                }
            }
            if gpu.exclusive != exclusive[slot]
                || (gpu.exclusive && (gpu.cgpus != 1 || gpu.used_mib != gpu.spec.memory_mib))
            {
                return Err(format!("GPU {id}: exclusive GPU shared or partly booked"));
            }
        }
        for (h, host) in self.hosts.iter().enumerate() {
            if host.vms != host_vms[h] {
                return Err(format!(
                    "host {}: {} VMs booked, {} placed",
                    host.id, host.vms, host_vms[h]
                ));
            }
        }
        if self.masked.iter().any(|&m| m) {
            return Err("slots left hidden after a placement".into());
        }
        let mut of_kind = vec![0u32; self.kinds.len()];
        for gpu in self.gpus.iter().filter(|g| !g.is_partitioned()) {
            of_kind[gpu.kind as usize] += 1;
        }
        if self.kinds.iter().map(|k| k.gpus).ne(of_kind) {
            return Err("kinds count other GPUs than the pool holds".into());
        }
        self.audit_vm_resources()
    }
}
