//! How fragmented the pool is, as FGD measures it: the free GPU capacity that no cGPU of the mix
//! the pool holds could use (a GPU's free memory counts for each kind of cGPU it is too small
//! for, weighted by how common the kind is), in GPUs' worth. The operator's gauge
//! (`gsaas_gpu_fragmented_gpus` on `/metrics`, the dashboard's pool card) and the simulator's
//! report; `frag-gradient` places to keep it low.
//!
//! A pass over the GPUs, read when asked (a scrape, a report): 100k GPUs take well under a
//! millisecond, and no decision pays for it.

use super::Pool;
use crate::model::HostState;

/// The pool's fragmentation now.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Fragmentation {
    /// Free capacity, in GPUs, that no cGPU of the mix could use (expected over the mix).
    pub fragmented_gpus: f64,
    /// Free capacity of the GPUs that take new cGPUs, in GPUs.
    pub free_gpus: f64,
    /// cGPUs in the mix it was measured against (0: no mix yet, and nothing is a fragment).
    pub mix_cgpus: u64,
}

impl Pool {
    /// The fragmentation of the GPUs that take new cGPUs (untainted, healthy, on schedulable
    /// hosts; a partitioned GPU through its partitions).
    pub fn fragmentation(&self) -> Fragmentation {
        let weighed = self.mix.weighed();
        let mut measured = Fragmentation { mix_cgpus: self.mix.total(), ..Default::default() };
        for gpu in &self.gpus {
            let total = gpu.spec.memory_mib;
            if total == 0
                || !self.serves(gpu)
                || self.hosts[gpu.host as usize].state != HostState::Schedulable
            {
                continue;
            }
            let free = gpu.free_mib();
            measured.free_gpus += free as f64 / total as f64;
            if weighed > 0 {
                let fragment = self.mix.fragment(free, total) as f64;
                measured.fragmented_gpus += fragment / (100.0 * total as f64 * weighed as f64);
            }
        }
        measured
    }
}
