//! `least-load-fit`: the fitting GPU with the most free memory (the paper's Algorithm 1, corrected).
//!
//! The paper tests `avail_mem + req_mem <= total_mem`, which rejects an idle GPU for any request; the
//! intent, and what this does, is `used + req <= total`. Also known as worst fit (section 4.3) and as
//! HAMi's "spread". Order: most free memory first; ties go to pool order.

use std::cmp::{Ordering, Reverse};
use std::collections::BTreeSet;

use super::{by_slot, Candidate, CandidateIndex, Policy};

#[derive(Debug, Clone, Copy, Default)]
pub struct LeastLoadFit;

impl Policy for LeastLoadFit {
    fn name(&self) -> String {
        "least-load-fit".into()
    }

    fn compare(&self, a: &Candidate, b: &Candidate) -> Ordering {
        b.free_mib.cmp(&a.free_mib).then_with(|| by_slot(a, b))
    }

    fn new_index(&self, _slots: u32) -> Box<dyn CandidateIndex> {
        Box::<LeastLoadIndex>::default()
    }

    fn ranks_by_host_load(&self) -> bool {
        false
    }
}

/// Candidates by (most free, slot): the first one is the choice if anything fits.
#[derive(Debug, Default)]
struct LeastLoadIndex(BTreeSet<(Reverse<u64>, u32)>);

impl CandidateIndex for LeastLoadIndex {
    fn insert(&mut self, candidate: &Candidate) {
        self.0.insert((Reverse(candidate.free_mib), candidate.slot));
    }

    fn remove(&mut self, candidate: &Candidate) {
        self.0.remove(&(Reverse(candidate.free_mib), candidate.slot));
    }

    fn best(&self, need_mib: u64) -> Option<u32> {
        self.0.first().filter(|(Reverse(free), _)| *free >= need_mib).map(|&(_, slot)| slot)
    }
}
