//! A policy written outside the crate plugs in by name, composes with the fewer-jobs-node layer, and
//! changes nothing for the built-in policies.

mod common;

use std::cmp::{Ordering, Reverse};
use std::collections::BTreeMap;
use std::sync::Arc;

use common::{add_gpu_host, gpu};
use gpgpums::policy::{Candidate, CandidateIndex, Policy};
use gpgpums::{PolicyRegistry, Pool, Request, Selector, VmId};

/// The last GPU in pool order that fits.
#[derive(Debug)]
struct LastFit;

impl Policy for LastFit {
    fn name(&self) -> String {
        "last-fit".into()
    }

    fn compare(&self, a: &Candidate, b: &Candidate) -> Ordering {
        b.slot.cmp(&a.slot)
    }

    fn new_index(&self, _slots: u32) -> Box<dyn CandidateIndex> {
        Box::<LastFitIndex>::default()
    }
}

/// Deliberately simple: scans from the last slot down.
#[derive(Debug, Default)]
struct LastFitIndex(BTreeMap<Reverse<u32>, u64>);

impl CandidateIndex for LastFitIndex {
    fn insert(&mut self, candidate: &Candidate) {
        self.0.insert(Reverse(candidate.slot), candidate.free_mib);
    }

    fn remove(&mut self, candidate: &Candidate) {
        self.0.remove(&Reverse(candidate.slot));
    }

    fn best(&self, need_mib: u64) -> Option<u32> {
        self.0.iter().find(|(_, &free)| free >= need_mib).map(|(&Reverse(slot), _)| slot)
    }
}

fn pool(selector: Selector) -> Pool {
    let mut registry = PolicyRegistry::builtin();
    registry.register(Arc::new(LastFit));
    let mut pool = Pool::with(registry, selector);
    add_gpu_host(&mut pool, "a", &[8192, 8192]);
    add_gpu_host(&mut pool, "b", &[8192, 8192]);
    pool
}

#[test]
fn a_registered_policy_is_used_by_name_and_layers_over() {
    for selector in [Selector::Indexed, Selector::Scan] {
        let mut pool = pool(selector);
        assert!(pool.registry().known_names().contains(&"fewer-jobs-node+last-fit".to_string()));
        let placement =
            pool.place(VmId::new_random(), &Request::shared(1, 4096), "last-fit").unwrap();
        assert_eq!(placement.cgpus[0].gpu, gpu("b", 1));
        // Host b has a VM now, so the layer moves to host a, where last fit takes a:1.
        let placement = pool
            .place(VmId::new_random(), &Request::shared(1, 4096), "fewer-jobs-node+last-fit")
            .unwrap();
        assert_eq!(placement.cgpus[0].gpu, gpu("a", 1));
        assert_eq!(placement.policy, "fewer-jobs-node+last-fit");
        // The built-in policies are untouched.
        let placement =
            pool.place(VmId::new_random(), &Request::shared(1, 4096), "first-fit").unwrap();
        assert_eq!(placement.cgpus[0].gpu, gpu("a", 0));
        pool.audit().unwrap();
    }
}
