//! `best-fit`: the fitting GPU with the least free memory (packs; HAMi's "binpack").
//!
//! Order: least free memory first; ties go to pool order. It fills partly used GPUs before touching
//! idle ones, which keeps whole GPUs free for exclusive requests.

use std::cmp::Ordering;
use std::collections::BTreeSet;

use super::{by_slot, Candidate, CandidateIndex, Policy};

#[derive(Debug, Clone, Copy, Default)]
pub struct BestFit;

impl Policy for BestFit {
    fn name(&self) -> String {
        "best-fit".into()
    }

    fn compare(&self, a: &Candidate, b: &Candidate) -> Ordering {
        a.free_mib.cmp(&b.free_mib).then_with(|| by_slot(a, b))
    }

    fn new_index(&self, _slots: u32) -> Box<dyn CandidateIndex> {
        Box::<BestFitIndex>::default()
    }

    fn ranks_by_host_load(&self) -> bool {
        false
    }
}

/// Candidates by (free, slot): the first at or after `(need, 0)` is the choice.
#[derive(Debug, Default)]
struct BestFitIndex(BTreeSet<(u64, u32)>);

impl CandidateIndex for BestFitIndex {
    fn insert(&mut self, candidate: &Candidate) {
        self.0.insert((candidate.free_mib, candidate.slot));
    }

    fn remove(&mut self, candidate: &Candidate) {
        self.0.remove(&(candidate.free_mib, candidate.slot));
    }

    fn best(&self, need_mib: u64) -> Option<u32> {
        self.0.range((need_mib, 0)..).next().map(|&(_, slot)| slot)
    }
}
