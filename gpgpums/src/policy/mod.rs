//! GPU selection policies as plugins (GPGPUMS is plugin based, dissertation section 5.2.1.2).
//!
//! A policy is defined by one thing: a strict total order over the GPUs that can take a cGPU
//! ([`Policy::compare`]); the policy picks the least GPU in that order. Every order ends with the pool
//! order (slot), so there are no ties and every decision is deterministic.
//!
//! That definition is what the reference scan uses. For speed each policy also supplies an index
//! ([`CandidateIndex`]) that answers "the least GPU with at least `need` MiB free" in O(log n) without
//! scanning; the property tests check that index and definition agree on random pools.
//!
//! Layers wrap a policy (`fewer-jobs-node+best-fit`): the registry composes them by name, so
//! adding a policy or a layer is one `register` call and touches no other policy.

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use crate::error::Error;

mod best_fit;
mod fewer_jobs_gpu;
mod fewer_jobs_node;
mod first_fit;
mod frag_gradient;
mod least_load_fit;
mod sparse_max_tree;

pub use best_fit::BestFit;
pub use fewer_jobs_gpu::FewerJobsGpu;
pub use fewer_jobs_node::FewerJobsNode;
pub use first_fit::FirstFit;
pub use frag_gradient::{FragGradient, Mix};
pub use least_load_fit::LeastLoadFit;

/// What a policy may look at when it ranks a GPU. A snapshot: indexes get a fresh one on every change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Candidate {
    /// Position in pool order (host registration order, then GPU index); unique.
    pub slot: u32,
    /// Memory still free on the GPU (its whole memory when idle).
    pub free_mib: u64,
    pub total_mib: u64,
    /// cGPUs on the GPU.
    pub cgpus: u32,
    /// Distinct VMs on the GPU.
    pub jobs: u32,
    /// Distinct VMs with cGPUs on the GPU's host.
    pub host_vms: u32,
    /// The host's position in registration order.
    pub host_seq: u32,
}

/// What a decision is for: the memory one cGPU needs, whether it takes its GPU whole, and the
/// mix of cGPUs the pool holds. Most policies rank GPUs the same for every request; those that
/// do not (`frag-gradient`) read it.
#[derive(Debug, Clone, Copy)]
pub struct Query<'a> {
    pub need_mib: u64,
    pub exclusive: bool,
    pub mix: &'a Mix,
}

/// A GPU selection policy.
pub trait Policy: Send + Sync + fmt::Debug {
    /// The canonical name, as requests spell it (`first-fit`, `fewer-jobs-node+best-fit`).
    fn name(&self) -> String;

    /// `Less` when `a` is preferred over `b`. Must be a strict total order: equal only for the same slot.
    fn compare(&self, a: &Candidate, b: &Candidate) -> Ordering;

    /// [`Policy::compare`] for one decision; the same unless the policy's order depends on the
    /// request or the mix.
    fn compare_for(&self, query: &Query, a: &Candidate, b: &Candidate) -> Ordering {
        let _ = query;
        self.compare(a, b)
    }

    /// An empty index for slots in `0..slots` that agrees with [`Policy::compare`].
    fn new_index(&self, slots: u32) -> Box<dyn CandidateIndex>;

    /// Whether its order, and so its index, looks at the host's load
    /// ([`Candidate::host_vms`]). Those indexes see every change of a host's VMs, a re-index of
    /// all the host's GPUs; the others are spared it. A policy that does not say is taken to.
    fn ranks_by_host_load(&self) -> bool {
        true
    }

    /// Whether a `local` VM's host is chosen, among the first few in this order, by the GPU
    /// its CPU would strand there (see `pool/stranding.rs`).
    fn weighs_stranding(&self) -> bool {
        false
    }
}

/// A set of candidates that finds the policy's choice among those with enough free memory.
///
/// The pool removes a candidate with exactly the values it inserted it with, before any of them change.
pub trait CandidateIndex: Send + Sync + fmt::Debug {
    fn insert(&mut self, candidate: &Candidate);
    fn remove(&mut self, candidate: &Candidate);
    /// The slot of the least candidate (in the policy's order) with `free_mib >= need_mib`.
    fn best(&self, need_mib: u64) -> Option<u32>;

    /// The least candidate for `query` in [`Policy::compare_for`]'s order with
    /// `free_mib >= query.need_mib`; [`CandidateIndex::best`] unless the order depends on it.
    fn best_for(&self, query: &Query) -> Option<u32> {
        self.best(query.need_mib)
    }
}

/// Builds a layered policy around an inner one.
pub type LayerFn = Arc<dyn Fn(Arc<dyn Policy>) -> Arc<dyn Policy> + Send + Sync>;

struct Layer {
    wrap: LayerFn,
    /// The inner policy used when the layer is named alone.
    default_inner: String,
}

/// The policies a pool can use, by name.
pub struct PolicyRegistry {
    policies: BTreeMap<String, Arc<dyn Policy>>,
    layers: BTreeMap<String, Layer>,
}

impl fmt::Debug for PolicyRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PolicyRegistry")
            .field("policies", &self.policies.keys().collect::<Vec<_>>())
            .field("layers", &self.layers.keys().collect::<Vec<_>>())
            .finish()
    }
}

/// The service's default policy, as in the paper's GSaaS prototype.
pub const DEFAULT_POLICY: &str = "first-fit";

impl Default for PolicyRegistry {
    fn default() -> Self {
        Self::builtin()
    }
}

impl PolicyRegistry {
    pub fn empty() -> Self {
        PolicyRegistry { policies: BTreeMap::new(), layers: BTreeMap::new() }
    }

    /// The built-in policies and the `fewer-jobs-node` layer.
    pub fn builtin() -> Self {
        let mut registry = Self::empty();
        registry.register(Arc::new(FirstFit));
        registry.register(Arc::new(LeastLoadFit));
        registry.register(Arc::new(BestFit));
        registry.register(Arc::new(FewerJobsGpu));
        registry.register(Arc::new(FragGradient));
        registry.register_layer(
            fewer_jobs_node::NAME,
            LeastLoadFit.name(),
            Arc::new(|inner| Arc::new(FewerJobsNode::new(inner)) as Arc<dyn Policy>),
        );
        registry
    }

    /// Adds (or replaces) a policy under its own name.
    pub fn register(&mut self, policy: Arc<dyn Policy>) {
        self.policies.insert(policy.name(), policy);
    }

    /// Adds (or replaces) a layer, usable as `NAME+policy`, or alone as `NAME` over `default_inner`.
    pub fn register_layer(&mut self, name: &str, default_inner: String, wrap: LayerFn) {
        self.layers.insert(name.to_owned(), Layer { wrap, default_inner });
    }

    /// Resolves `name`: `policy`, `layer` (over its default policy) or `layer+policy`. A layer
    /// wraps a policy, never another layer (`fewer-jobs-node+fewer-jobs-node` means nothing).
    pub fn resolve(&self, name: &str) -> Result<Arc<dyn Policy>, Error> {
        self.resolve_inner(name).ok_or_else(|| {
            Error::invalid(
                "policy",
                format!("unknown policy {name:?}; known: {}", self.known_names().join(", ")),
            )
        })
    }

    fn resolve_inner(&self, name: &str) -> Option<Arc<dyn Policy>> {
        if let Some(policy) = self.policies.get(name) {
            return Some(policy.clone());
        }
        let (head, rest) = match name.split_once('+') {
            Some((head, rest)) => (head, Some(rest)),
            None => (name, None),
        };
        let layer = self.layers.get(head)?;
        let inner = self.policies.get(rest.unwrap_or(&layer.default_inner))?;
        Some((layer.wrap)(inner.clone()))
    }

    /// Every policy, and every layer over every policy, by name.
    pub fn known_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.policies.keys().cloned().collect();
        for layer in self.layers.keys() {
            names.push(layer.clone());
            names.extend(self.policies.keys().map(|p| format!("{layer}+{p}")));
        }
        names
    }
}

/// `Less` when `a` comes first in pool order. Every policy's order ends with this.
pub(crate) fn by_slot(a: &Candidate, b: &Candidate) -> Ordering {
    a.slot.cmp(&b.slot)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registry_resolves_plain_layered_and_bare_layer_names() {
        let registry = PolicyRegistry::builtin();
        for name in ["first-fit", "least-load-fit", "best-fit", "fewer-jobs-gpu", "frag-gradient"] {
            assert_eq!(registry.resolve(name).unwrap().name(), name);
        }
        assert_eq!(
            registry.resolve("fewer-jobs-node+best-fit").unwrap().name(),
            "fewer-jobs-node+best-fit"
        );
        assert_eq!(
            registry.resolve("fewer-jobs-node").unwrap().name(),
            "fewer-jobs-node+least-load-fit"
        );
        let err = registry.resolve("worst-fit").unwrap_err();
        let Error::InvalidRequest { field, reason } = err else { panic!("{err:?}") };
        assert_eq!(field, "policy");
        assert!(reason.contains("\"worst-fit\"") && reason.contains("fewer-jobs-node+first-fit"));
        assert!(registry.resolve("fewer-jobs-node+nope").is_err());
        for nested in
            ["fewer-jobs-node+fewer-jobs-node", "fewer-jobs-node+fewer-jobs-node+best-fit"]
        {
            assert!(registry.resolve(nested).is_err(), "{nested}");
        }
        assert!(registry.resolve("").is_err());
    }
}
