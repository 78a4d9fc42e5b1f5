//! `fewer-jobs-node`: a layer that prefers hosts with fewer VMs, over any GPU policy (section 4.3).
//!
//! Order: fewest VMs on the GPU's host, then the inner policy's order. A host's VMs are the distinct VMs
//! with cGPUs on its GPUs, the VM being placed included once it has a cGPU there, so one VM's cGPUs
//! spread over hosts too. Alone, `fewer-jobs-node` wraps `least-load-fit`.
//!
//! Index: one inner index per host-VM count, searched from the lowest count; the first group with a
//! fitting GPU answers. A decision costs O(k log n), k being the number of distinct host-VM counts.

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::sync::Arc;

use super::{Candidate, CandidateIndex, Policy, Query};

pub(crate) const NAME: &str = "fewer-jobs-node";

#[derive(Debug, Clone)]
pub struct FewerJobsNode {
    inner: Arc<dyn Policy>,
}

impl FewerJobsNode {
    pub fn new(inner: Arc<dyn Policy>) -> Self {
        FewerJobsNode { inner }
    }
}

impl Policy for FewerJobsNode {
    fn name(&self) -> String {
        format!("{NAME}+{}", self.inner.name())
    }

    fn compare(&self, a: &Candidate, b: &Candidate) -> Ordering {
        a.host_vms.cmp(&b.host_vms).then_with(|| self.inner.compare(a, b))
    }

    fn compare_for(&self, query: &Query, a: &Candidate, b: &Candidate) -> Ordering {
        a.host_vms.cmp(&b.host_vms).then_with(|| self.inner.compare_for(query, a, b))
    }

    fn new_index(&self, slots: u32) -> Box<dyn CandidateIndex> {
        Box::new(FewerJobsNodeIndex { inner: self.inner.clone(), slots, groups: BTreeMap::new() })
    }
}

#[derive(Debug)]
struct Group {
    members: usize,
    index: Box<dyn CandidateIndex>,
}

#[derive(Debug)]
struct FewerJobsNodeIndex {
    inner: Arc<dyn Policy>,
    slots: u32,
    groups: BTreeMap<u32, Group>,
}

impl CandidateIndex for FewerJobsNodeIndex {
    fn insert(&mut self, candidate: &Candidate) {
        let group = self
            .groups
            .entry(candidate.host_vms)
            .or_insert_with(|| Group { members: 0, index: self.inner.new_index(self.slots) });
        group.members += 1;
        group.index.insert(candidate);
    }

    fn remove(&mut self, candidate: &Candidate) {
        if let Some(group) = self.groups.get_mut(&candidate.host_vms) {
            group.index.remove(candidate);
            group.members -= 1;
            if group.members == 0 {
                self.groups.remove(&candidate.host_vms);
            }
        }
    }

    fn best(&self, need_mib: u64) -> Option<u32> {
        self.groups.values().find_map(|group| group.index.best(need_mib))
    }

    fn best_for(&self, query: &Query) -> Option<u32> {
        self.groups.values().find_map(|group| group.index.best_for(query))
    }
}
