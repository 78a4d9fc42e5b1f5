//! `fewer-jobs-gpu`: the fitting GPU with the fewest cGPUs (section 4.3); ties go to least-load-fit.
//!
//! Order: fewest cGPUs, then most free memory, then pool order.
//!
//! Index: candidates sorted by that order. Within one cGPU count the first entry has the most free
//! memory, so if it does not fit nothing of that count does and the search jumps to the next count.
//! A decision costs O(k log n), k being the number of distinct cGPU counts in use, which is bounded by
//! how many cGPUs fit on one GPU, not by the pool size.

use std::cmp::{Ordering, Reverse};
use std::collections::BTreeSet;

use super::least_load_fit::LeastLoadFit;
use super::{Candidate, CandidateIndex, Policy};

#[derive(Debug, Clone, Copy, Default)]
pub struct FewerJobsGpu;

impl Policy for FewerJobsGpu {
    fn name(&self) -> String {
        "fewer-jobs-gpu".into()
    }

    fn compare(&self, a: &Candidate, b: &Candidate) -> Ordering {
        a.cgpus.cmp(&b.cgpus).then_with(|| LeastLoadFit.compare(a, b))
    }

    fn new_index(&self, _slots: u32) -> Box<dyn CandidateIndex> {
        Box::<FewerJobsGpuIndex>::default()
    }

    fn ranks_by_host_load(&self) -> bool {
        false
    }
}

#[derive(Debug, Default)]
struct FewerJobsGpuIndex(BTreeSet<(u32, Reverse<u64>, u32)>);

impl CandidateIndex for FewerJobsGpuIndex {
    fn insert(&mut self, candidate: &Candidate) {
        self.0.insert((candidate.cgpus, Reverse(candidate.free_mib), candidate.slot));
    }

    fn remove(&mut self, candidate: &Candidate) {
        self.0.remove(&(candidate.cgpus, Reverse(candidate.free_mib), candidate.slot));
    }

    fn best(&self, need_mib: u64) -> Option<u32> {
        let mut cgpus = 0u32;
        loop {
            let &(count, Reverse(free), slot) =
                self.0.range((cgpus, Reverse(u64::MAX), 0)..).next()?;
            if free >= need_mib {
                return Some(slot);
            }
            cgpus = count.checked_add(1)?;
        }
    }
}
