//! `first-fit`: the first GPU in pool order that fits (the paper's GSaaS default).
//!
//! Order: pool order alone. It packs the first GPUs (two 4 GiB cGPUs share the first 8 GiB GPU), which
//! saves GPUs at the cost of earlier oversubscription (dissertation, MonteCarloMultiGPU).

use std::cmp::Ordering;

use super::sparse_max_tree::SparseMaxTree;
use super::{by_slot, Candidate, CandidateIndex, Policy};

#[derive(Debug, Clone, Copy, Default)]
pub struct FirstFit;

impl Policy for FirstFit {
    fn name(&self) -> String {
        "first-fit".into()
    }

    fn compare(&self, a: &Candidate, b: &Candidate) -> Ordering {
        by_slot(a, b)
    }

    fn new_index(&self, slots: u32) -> Box<dyn CandidateIndex> {
        Box::new(FirstFitIndex(SparseMaxTree::new(slots)))
    }

    fn ranks_by_host_load(&self) -> bool {
        false
    }
}

/// Free memory by slot; the answer is the leftmost slot with enough.
#[derive(Debug)]
struct FirstFitIndex(SparseMaxTree);

impl CandidateIndex for FirstFitIndex {
    fn insert(&mut self, candidate: &Candidate) {
        self.0.set(candidate.slot, candidate.free_mib);
    }

    fn remove(&mut self, candidate: &Candidate) {
        self.0.set(candidate.slot, 0);
    }

    fn best(&self, need_mib: u64) -> Option<u32> {
        self.0.leftmost_at_least(need_mib)
    }
}
