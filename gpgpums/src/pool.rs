//! The GPU pool: inventory, what every VM holds, and the placement of new cGPUs.
//!
//! The pool is a pure state machine: no I/O, no clock, no randomness. The same inventory and the same
//! sequence of calls give the same placements, which is what lets the REST service replay it from its
//! database and lets tests compare implementations.
//!
//! A request for N cGPUs is decided one cGPU at a time, each decision seeing the previous ones (first fit
//! puts two 4 GiB cGPUs on one 8 GiB GPU, as in the paper). If any cGPU cannot be placed, the ones already
//! placed are released and nothing has changed: placement is all-or-nothing.
//!
//! Speed comes from per-policy indexes ([`crate::policy::CandidateIndex`]) kept up to date on every
//! change, built the first time a policy is used. Each policy has two: one over GPUs that can take a
//! shared cGPU and one over idle GPUs, which are the GPUs an exclusive cGPU may take. Inventory changes
//! (rare) renumber the pool order and rebuild the indexes on the next placement. [`Selector::Scan`] and
//! [`Selector::SortEachRequest`] decide by the policy's definition instead: the first is the reference
//! the tests compare against, the second the paper's per-request sort, the benchmark's baseline.
//!
//! Requests may constrain which GPUs they take (models, traits, versions: [`GpuConstraints`]). The
//! pool groups its GPUs by [`GpuKind`] (a fleet has a few kinds), so a request's constraints come
//! down to a set of kinds, ranked in tiers by its soft constraints. A policy keeps, beside its
//! indexes over every GPU, indexes over the GPUs of each kind ([`Subset`]s of one kind, built the
//! first time a request needs that kind and kept current from then on like the others), so a
//! tier of k kinds is decided by asking each kind's index for its best and taking the policy's
//! best of those: O(k log n), whatever the constraints, never a pass over the GPUs. A set of kinds
//! used enough gets an index of its own (O(log n) again), once the queries it cost past one per
//! decision add up to what building it costs (a pass over its kinds' GPUs): so a tenant who cycles
//! through constraint sets pays for each build with as much work of its own first, and cannot make
//! other requests rebuild theirs at every decision. At most [`MAX_SUBSETS`] sets are kept per
//! policy, the least recently used dropped first; the kinds' own indexes are always kept.
//!
//! A GPU may be partitioned (MIG instances, [`crate::model::Partition`]): each partition is a GPU
//! of its own, with its own kind and memory. Eligibility carries the tie: a partitioned GPU takes
//! no cGPU whole, and a partition takes none while its parent is tainted, unhealthy or still holds
//! cGPUs booked whole from before it was partitioned. A change of the parent's taint, health or
//! whole bookings re-indexes its partitions too (a GPU has at most a few), so decisions stay as
//! they are: the indexes only ever hold GPUs that may take a cGPU now. Reports and limits count a
//! partitioned GPU through its partitions.
//!
//! Hosts sit in the network (their topology, the round trips their agents measured), and a
//! request may ask for one group, a round-trip limit or the nearest GPUs: `pool/network.rs` places those
//! group by group, over the same indexes, and says where the VM may then run.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use crate::error::{Error, Shortfall};
use crate::ids::{GpuId, HostId, VmId};
use crate::model::{
    profile_name_problem, CgpuAssignment, GpuSpec, GpuUsage, HostKind, HostState, HostUsage,
    Locality, Mode, Placement, Request, Resources, UsageTotals, VmHost,
};
use crate::policy::{Candidate, CandidateIndex, Mix, Policy, PolicyRegistry, Query};
use crate::quota::{Holding, Usage};
use crate::traits::{GpuAttributes, GpuConstraints, GpuKind};

mod fragmentation;
mod network;
mod rehome;
mod stranding;

pub use fragmentation::Fragmentation;

pub use rehome::Rehome;
pub use stranding::{LOOKAHEAD, ROOMLESS_HOSTS_BEFORE_SCAN, STRAND_STEP_MILLI};

/// The most cGPUs one VM may ask for.
pub const MAX_CGPUS_PER_VM: u32 = 4096;
/// The most memory one GPU may have, and so one cGPU may ask for: 16 TiB.
pub const MAX_GPU_MEMORY_MIB: u64 = 16 << 20;
/// The most sets of GPU kinds a policy keeps indexes over (see the module docs).
pub const MAX_SUBSETS: usize = 64;
/// The most distinct constraints whose filters are kept (per policy, and for admission alone);
/// past it the cache starts over.
const MAX_CACHED_FILTERS: usize = 1024;

/// How the pool finds the policy's choice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Selector {
    /// Maintained indexes: O(log n) per cGPU.
    #[default]
    Indexed,
    /// A linear scan for the least candidate by the policy's order: O(n) per cGPU. The reference.
    Scan,
    /// Sort every candidate by the policy's order, then take the first that fits: O(n log n) per cGPU,
    /// as the paper's Algorithm 1 does.
    SortEachRequest,
}

#[derive(Debug)]
struct HostEntry {
    id: HostId,
    kind: HostKind,
    state: HostState,
    /// Slots of its GPUs, ascending.
    slots: Vec<u32>,
    vms: u32,
    /// What it offers local VMs (see `pool/stranding.rs`); `None`: unknown, only GPUs bind.
    offers: Option<Resources>,
    /// What the local VMs pinned to it take.
    taken: Resources,
}

#[derive(Debug)]
struct GpuEntry {
    spec: GpuSpec,
    host: u32,
    /// Its kind (see [`Pool::kinds`]).
    kind: u32,
    /// Why the GPU takes no new cGPUs (it keeps those it has); `None`: it takes them.
    taint: Option<String>,
    /// Why the GPU's host reports it unhealthy.
    health: Option<String>,
    used_mib: u64,
    exclusive: bool,
    cgpus: u32,
    jobs: u32,
    /// Who holds its cGPUs: a VM (or fence) once per cGPU, in no order. Reports read it; decisions
    /// do not.
    holders: Vec<VmId>,
    /// The slot of the GPU it is a partition of.
    parent: Option<u32>,
    /// The slots of its partitions, ascending: with any, it takes no cGPU whole.
    partitions: Vec<u32>,
    /// The compute shares of its cGPUs, in percent of its SMs, added up, and how many cGPUs
    /// have one (see [`Pool::compute_hidden`]).
    compute_percent: u32,
    compute_cgpus: u32,
}

impl GpuEntry {
    fn usage(&self) -> GpuUsage {
        GpuUsage {
            id: self.spec.id.clone(),
            host: self.spec.host.clone(),
            index: self.spec.index,
            model: self.spec.model.clone(),
            memory_mib: self.spec.memory_mib,
            allocated_mib: self.used_mib,
            exclusive: self.exclusive,
            cgpus: self.cgpus,
            jobs: self.jobs,
            rcuda: self.spec.rcuda,
            attributes: self.spec.attributes.clone(),
            taint: self.taint.clone(),
            health: self.health.clone(),
            partition: self.spec.partition.clone(),
            partitions: self.partitions.len() as u32,
        }
    }

    /// It has partitions, so serves through them only (see [`crate::model::Partition`]).
    fn is_partitioned(&self) -> bool {
        !self.partitions.is_empty()
    }

    /// Untainted and healthy.
    fn takes_new(&self) -> bool {
        self.taint.is_none() && self.health.is_none()
    }

    fn free_mib(&self) -> u64 {
        self.spec.memory_mib - self.used_mib
    }

    fn can_take_shared(&self) -> bool {
        !self.exclusive && self.free_mib() > 0
    }

    fn is_idle(&self) -> bool {
        self.cgpus == 0
    }

    fn takes(&self, mode: Mode) -> bool {
        match mode {
            Mode::Shared => self.can_take_shared(),
            Mode::Exclusive => self.is_idle(),
        }
    }
}

/// A policy and, with [`Selector::Indexed`], its two indexes, and those over subsets of the GPUs.
#[derive(Debug)]
struct Views {
    policy: Arc<dyn Policy>,
    indexes: Option<[Box<dyn CandidateIndex>; 2]>,
    /// Indexes over the GPUs of some kinds only (see the module docs); `None`: a free place.
    subsets: Vec<Option<Subset>>,
    subset_by_kinds: HashMap<Vec<u32>, usize>,
    /// For each set of several kinds decided by merging its kinds' indexes: the index queries
    /// that cost beyond one per decision, until it has an index of its own.
    merge_work: HashMap<Vec<u32>, u64>,
    /// For each kind, the subsets that hold its GPUs.
    subsets_of_kind: Vec<Vec<usize>>,
    /// The filters of the constraints decided under this policy (a fleet's kinds can be many:
    /// working a filter out costs a pass over them).
    filters: HashMap<GpuConstraints, Arc<Filter>>,
}

impl Views {
    fn new(policy: Arc<dyn Policy>, indexes: Option<[Box<dyn CandidateIndex>; 2]>) -> Self {
        Views {
            policy,
            indexes,
            subsets: Vec::new(),
            subset_by_kinds: HashMap::new(),
            merge_work: HashMap::new(),
            subsets_of_kind: Vec::new(),
            filters: HashMap::new(),
        }
    }

    fn drop_subsets(&mut self) {
        self.subsets.clear();
        self.subset_by_kinds.clear();
        self.merge_work.clear();
        self.subsets_of_kind.clear();
        self.filters.clear();
    }
}

/// A policy's two indexes over the GPUs of a set of kinds.
#[derive(Debug)]
struct Subset {
    kinds: Vec<u32>,
    indexes: [Box<dyn CandidateIndex>; 2],
    /// When a decision last asked for it, in [`Pool::decisions`] (a kind's own index is kept
    /// whatever its age).
    last_used: u64,
}

impl Subset {
    /// A kind's own index, never dropped.
    fn is_one_kind(&self) -> bool {
        self.kinds.len() == 1
    }
}

/// What the indexes over subsets of the GPUs have cost since the pool was made (see the module
/// docs), in index operations.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SubsetStats {
    /// Subsets built (a kind's own, or a set's).
    pub builds: u64,
    /// GPUs put in subsets as they were built.
    pub built_gpus: u64,
    /// Index queries of decisions on merged tiers (a query per kind per decision).
    pub merged_queries: u64,
}

/// One rank of a request's admitted kinds, as decisions read it.
#[derive(Debug, Clone)]
enum Tier {
    /// The subset over exactly its kinds.
    Subset(usize),
    /// Its kinds' own subsets, merged at each decision (the policy's best of their bests).
    Merged { kinds: Vec<u32>, subsets: Vec<usize> },
}

/// A kind of GPU the pool holds, and how many of its GPUs are registered.
#[derive(Debug)]
struct KindEntry {
    kind: GpuKind,
    /// Its GPUs but those partitioned (which serve through their partitions): a kind whose GPUs
    /// are all partitioned is none a request may ask for.
    gpus: u32,
}

/// How one request sees the pool's GPUs (see [`Pool::filter`]).
#[derive(Debug, Clone, Default)]
struct Filter {
    /// Per kind, its rank when the request admits it (higher goes first); empty: every GPU
    /// admitted, all of one rank.
    ranks: Vec<Option<i32>>,
    /// With [`Selector::Indexed`] and `ranks` set: the admitted kinds' indexes, one tier per
    /// rank, highest first.
    tiers: Vec<Tier>,
}

impl Filter {
    fn is_everything(&self) -> bool {
        self.ranks.is_empty()
    }

    /// The rank of a GPU of `kind`, or `None` when the request does not admit it.
    fn rank(&self, kind: u32) -> Option<i32> {
        if self.ranks.is_empty() {
            return Some(0);
        }
        self.ranks[kind as usize]
    }
}

/// Which of a policy's two indexes serves `mode`: [shared, exclusive].
fn index_for(mode: Mode) -> usize {
    match mode {
        Mode::Shared => 0,
        Mode::Exclusive => 1,
    }
}

/// Facts about the inventory that validation needs, recomputed after inventory changes.
#[derive(Debug, Clone, Copy, Default)]
struct Limits {
    max_gpu_mib: u64,
    max_gpus_per_host: u32,
    max_host_mib: u64,
    rgpu_host_registered: bool,
    schedulable_rgpu_host: bool,
    schedulable_agent_host: bool,
}

/// GPUs by kind and memory (MiB): `((kind, memory), how many)`, ascending.
type GpusByKindMib = Vec<((u32, u64), u64)>;

/// What a kind of schedulable compute-gpu host has that takes new cGPUs: its GPUs' kinds and
/// memory sizes, each with how many GPUs of that kind and size, and how many hosts are made up so.
/// A fleet has few.
#[derive(Debug, Clone)]
struct HostMakeup {
    gpus_by_kind_mib: GpusByKindMib,
    /// What such a host offers local VMs, when known.
    offers: Option<Resources>,
    hosts: u64,
}

impl HostMakeup {
    /// How many cGPUs of `request`'s kind one such host could hold were its GPUs empty, on GPUs
    /// the request's `filter` admits.
    fn room(&self, request: &Request, filter: &Filter) -> u64 {
        if let (Some(offers), Some(need)) = (self.offers, request.vm_resources) {
            if !offers.has_room(&Resources::default(), &need) {
                return 0;
            }
        }
        self.gpus_by_kind_mib
            .iter()
            .filter(|&&((kind, _), _)| filter.rank(kind).is_some())
            .map(|&((_, mib), gpus)| gpus * empty_gpu_room(mib, request))
            .sum()
    }
}

/// How many cGPUs of `request`'s kind an empty GPU of `memory_mib` could hold.
fn empty_gpu_room(memory_mib: u64, request: &Request) -> u64 {
    if request.gpu_memory_mib.is_some_and(|mib| mib > memory_mib) {
        return 0;
    }
    if request.mode == Mode::Exclusive || request.distinct_gpus {
        return 1;
    }
    let by_memory = match request.gpu_memory_mib {
        Some(mib) if mib > 0 => memory_mib / mib,
        _ => 0,
    };
    match request.compute_percent {
        Some(percent) if percent > 0 => by_memory.min(100 / u64::from(percent)),
        _ => by_memory,
    }
}

/// The GPU pool. See the module docs.
#[derive(Debug)]
pub struct Pool {
    registry: PolicyRegistry,
    selector: Selector,
    hosts: Vec<HostEntry>,
    /// Where each host sits in the network, by the same index as `hosts`.
    places: Vec<network::HostPlace>,
    host_by_id: HashMap<HostId, u32>,
    /// In pool order: host registration order, then GPU index.
    gpus: Vec<GpuEntry>,
    gpu_by_id: HashMap<GpuId, u32>,
    /// The kinds of GPU registered, in order of first registration (ids never change).
    kinds: Vec<KindEntry>,
    kind_by_key: HashMap<GpuKind, u32>,
    /// The models of the kinds with GPUs, each once, in name order (see [`Self::models`]).
    models: Vec<String>,
    /// The kind of the GPU whose kind was last worked out, with its model and attributes (see
    /// [`Self::kind_of`]).
    last_kind: Option<(u32, String, GpuAttributes)>,
    /// Counts decisions that used subsets, to find the least recently used.
    decisions: u64,
    subset_stats: SubsetStats,
    /// [`Self::admission`]'s answers, by constraints.
    admissions: HashMap<GpuConstraints, Arc<Filter>>,
    /// The filter of no constraint.
    everything: Arc<Filter>,
    vms: HashMap<VmId, Placement>,
    views: Vec<Views>,
    view_by_name: HashMap<String, usize>,
    /// The inventory changed since the indexes were built: rebuild before the next decision.
    views_stale: bool,
    limits: Option<Limits>,
    /// The make-ups of the hosts' GPUs that take new cGPUs (see [`Pool::could_ever_fit`]),
    /// computed on first use since the inventory last changed.
    makeups: Option<Vec<HostMakeup>>,
    /// Slots hidden from decisions for the current placement (distinct GPUs, hosts tried for `local`).
    masked: Vec<bool>,
    /// Counts successful changes, so a caller can tell whether a failed operation touched the pool.
    changes: u64,
    /// Counts changes of the hosts (registrations, states), for callers that mirror them.
    host_changes: u64,
    /// The hosts' groups at each level, worked out on first use since the topology changed.
    groups: std::sync::OnceLock<Arc<network::Groups>>,
    /// Who measured each host's round trip (see `pool/network.rs`), worked out on first use.
    measured_by: std::sync::OnceLock<Arc<network::MeasuredBy>>,
    /// The GPUs holding cGPUs with compute shares, and the MPS GPUs holding shared cGPUs
    /// without: the few a placement may have to hide (see [`Pool::compute_hidden`]).
    compute_gpus: BTreeSet<GpuId>,
    plain_on_mps: BTreeSet<GpuId>,
    /// The cGPUs booked, by percent of their GPU: what `frag-gradient` weighs.
    mix: Mix,
    /// The CPU against the GPU of the local VMs booked: what stranding weighs.
    strand_mix: stranding::StrandMix,
    /// The local VMs whose CPU and memory are booked on their hosts.
    local_vms: HashMap<VmId, stranding::LocalVm>,
}

impl Default for Pool {
    fn default() -> Self {
        Self::new()
    }
}

impl Pool {
    /// An empty pool with the built-in policies, deciding through indexes.
    pub fn new() -> Self {
        Self::with(PolicyRegistry::builtin(), Selector::Indexed)
    }

    pub fn with(registry: PolicyRegistry, selector: Selector) -> Self {
        Pool {
            registry,
            selector,
            hosts: Vec::new(),
            places: Vec::new(),
            host_by_id: HashMap::new(),
            gpus: Vec::new(),
            gpu_by_id: HashMap::new(),
            kinds: Vec::new(),
            models: Vec::new(),
            last_kind: None,
            kind_by_key: HashMap::new(),
            decisions: 0,
            subset_stats: SubsetStats::default(),
            admissions: HashMap::new(),
            everything: Arc::new(Filter::default()),
            vms: HashMap::new(),
            views: Vec::new(),
            view_by_name: HashMap::new(),
            views_stale: false,
            limits: None,
            makeups: None,
            masked: Vec::new(),
            changes: 0,
            host_changes: 0,
            groups: std::sync::OnceLock::new(),
            measured_by: std::sync::OnceLock::new(),
            compute_gpus: BTreeSet::new(),
            plain_on_mps: BTreeSet::new(),
            mix: Mix::default(),
            strand_mix: stranding::StrandMix::default(),
            local_vms: HashMap::new(),
        }
    }

    /// What the indexes over subsets of the GPUs have cost so far (see the module docs).
    pub fn subset_stats(&self) -> SubsetStats {
        self.subset_stats
    }

    /// How many changes (bookings, releases, inventory) the pool has taken. A failed call leaves it as
    /// it was, like everything else.
    pub fn changes(&self) -> u64 {
        self.changes
    }

    /// How many changes of the hosts (registrations, states) the pool has taken.
    pub fn host_changes(&self) -> u64 {
        self.host_changes
    }

    /// Every host with its kind and state, in registration order.
    pub fn hosts(&self) -> impl Iterator<Item = (&HostId, HostKind, HostState)> {
        self.hosts.iter().map(|h| (&h.id, h.kind, h.state))
    }

    pub fn registry(&self) -> &PolicyRegistry {
        &self.registry
    }

    // ---- inventory ----

    /// Registers a host at the end of the pool order. Registering it again with the same kind is a no-op.
    pub fn add_host(&mut self, id: HostId, kind: HostKind) -> Result<(), Error> {
        if let Some(&h) = self.host_by_id.get(&id) {
            let existing = self.hosts[h as usize].kind;
            if existing == kind {
                return Ok(());
            }
            return Err(Error::Conflict(format!("host {id} is already registered as {existing}")));
        }
        let seq = u32::try_from(self.hosts.len()).expect("fewer than 2^32 hosts");
        self.host_by_id.insert(id.clone(), seq);
        self.hosts.push(HostEntry {
            id,
            kind,
            state: HostState::Schedulable,
            slots: vec![],
            vms: 0,
            offers: None,
            taken: Resources::default(),
        });
        self.places.push(network::HostPlace::default());
        self.groups.take();
        self.inventory_changed();
        self.changes += 1;
        self.host_changes += 1;
        Ok(())
    }

    /// Registers a GPU on a compute-gpu host. Registering the same GPU again is a no-op.
    pub fn add_gpu(&mut self, spec: GpuSpec) -> Result<(), Error> {
        if let Some(&slot) = self.gpu_by_id.get(&spec.id) {
            if self.gpus[slot as usize].spec == spec {
                return Ok(());
            }
            return Err(Error::Conflict(format!(
                "GPU {} is already registered with other properties",
                spec.id
            )));
        }
        let &host = self.host_by_id.get(&spec.host).ok_or_else(|| {
            Error::inventory(
                "host",
                format!("GPU {}: host {} is not registered", spec.id, spec.host),
            )
        })?;
        let entry = &self.hosts[host as usize];
        if entry.kind != HostKind::ComputeGpu {
            return Err(Error::inventory(
                "host",
                format!(
                    "GPU {}: host {} is {}, only compute-gpu hosts hold GPUs",
                    spec.id, spec.host, entry.kind
                ),
            ));
        }
        if entry.slots.iter().any(|&s| self.gpus[s as usize].spec.index == spec.index) {
            return Err(Error::inventory(
                "index",
                format!(
                    "GPU {}: host {} already has a GPU with index {}",
                    spec.id, spec.host, spec.index
                ),
            ));
        }
        if spec.memory_mib == 0 {
            return Err(Error::inventory(
                "memory_mib",
                format!("GPU {}: must be at least 1 MiB", spec.id),
            ));
        }
        if let Some((field, reason)) = spec.attributes.problems().into_iter().next() {
            return Err(Error::inventory(field, format!("GPU {}: {reason}", spec.id)));
        }
        let parent = self.partition_parent(&spec)?;
        if let Some(parent) = parent {
            let parent = &self.gpus[parent as usize];
            if !parent.is_partitioned() {
                // Its first partition: it counts through them from now on.
                self.count_kind(parent.kind, false);
            }
        }
        let kind = self.kind_of(&spec);
        let key = (host, spec.index);
        let at = self.gpus.partition_point(|g| (g.host, g.spec.index) < key);
        let gpu = GpuEntry {
            spec,
            host,
            kind,
            taint: None,
            health: None,
            used_mib: 0,
            exclusive: false,
            cgpus: 0,
            jobs: 0,
            holders: Vec::new(),
            parent,
            partitions: Vec::new(),
            compute_percent: 0,
            compute_cgpus: 0,
        };
        self.changes += 1;
        if at < self.gpus.len() {
            // Lands inside the pool order: every later slot moves.
            self.gpus.insert(at, gpu);
            self.renumber();
            return Ok(());
        }
        let slot = u32::try_from(at).expect("fewer than 2^32 GPUs");
        self.gpu_by_id.insert(gpu.spec.id.clone(), slot);
        self.hosts[host as usize].slots.push(slot);
        self.gpus.push(gpu);
        self.masked.push(false);
        self.inventory_changed();
        if let Some(parent) = parent {
            // Partitioned now: the parent takes no cGPU whole.
            self.reindexing(&[parent], |pool| pool.gpus[parent as usize].partitions.push(slot));
        }
        if !self.views_stale {
            for view in 0..self.views.len() {
                self.index_into(view, slot);
            }
        }
        Ok(())
    }

    /// Removes an unused GPU (a failed or withdrawn device).
    pub fn remove_gpu(&mut self, id: &GpuId) -> Result<GpuSpec, Error> {
        let &slot = self
            .gpu_by_id
            .get(id)
            .ok_or_else(|| Error::inventory("gpu", format!("GPU {id} is not registered")))?;
        let gpu = &self.gpus[slot as usize];
        if gpu.cgpus > 0 {
            return Err(Error::Conflict(format!("GPU {id} still backs {} cGPU(s)", gpu.cgpus)));
        }
        if gpu.is_partitioned() {
            return Err(Error::Conflict(format!(
                "GPU {id} has {} partition(s): they leave the pool first",
                gpu.partitions.len()
            )));
        }
        if let Some(parent) = gpu.parent {
            let parent = &self.gpus[parent as usize];
            if parent.partitions.len() == 1 {
                // Its last partition: whole again.
                self.count_kind(parent.kind, true);
            }
        }
        let removed = self.gpus.remove(slot as usize);
        self.count_kind(removed.kind, false);
        self.forget_filters();
        self.changes += 1;
        self.renumber();
        Ok(removed.spec)
    }

    /// The slot of the GPU that `spec` is a partition of, checked: registered, on the same host,
    /// whole itself, and with room for it (a partition no bigger than its parent, its parent's
    /// partitions together no bigger either). `None` for a whole GPU.
    fn partition_parent(&self, spec: &GpuSpec) -> Result<Option<u32>, Error> {
        let Some(partition) = &spec.partition else { return Ok(None) };
        let id = &spec.id;
        if let Some(problem) = profile_name_problem(&partition.profile) {
            return Err(Error::inventory("partition.profile", format!("GPU {id}: {problem}")));
        }
        let bad = |reason: String| Err(Error::inventory("partition.parent", reason));
        let Some(&slot) = self.gpu_by_id.get(&partition.parent) else {
            return bad(format!("GPU {id}: its parent GPU {} is not registered", partition.parent));
        };
        let parent = &self.gpus[slot as usize];
        if parent.spec.host != spec.host {
            return bad(format!(
                "GPU {id}: its parent GPU {} is on host {}, not {}",
                partition.parent, parent.spec.host, spec.host
            ));
        }
        if parent.spec.partition.is_some() {
            return bad(format!(
                "GPU {id}: its parent GPU {} is a partition itself",
                partition.parent
            ));
        }
        let taken: u64 =
            parent.partitions.iter().map(|&p| self.gpus[p as usize].spec.memory_mib).sum();
        let whole = parent.spec.memory_mib;
        if spec.memory_mib > whole - taken.min(whole) {
            let reason = if spec.memory_mib > whole {
                format!(
                    "GPU {id}: a partition of {} MiB is bigger than its parent GPU {} ({whole} MiB)",
                    spec.memory_mib, partition.parent
                )
            } else {
                format!(
                    "GPU {id}: with its {} MiB, the partitions of GPU {} would have {} MiB of its \
                     {whole}",
                    spec.memory_mib,
                    partition.parent,
                    taken + spec.memory_mib
                )
            };
            return Err(Error::inventory("memory_mib", reason));
        }
        Ok(Some(slot))
    }

    /// The kind of the GPU `spec` describes, registered as one more of it.
    fn kind_of(&mut self, spec: &GpuSpec) -> u32 {
        // A host's GPUs come one after another and are mostly alike: the last kind first, by
        // what makes it (not the UUID), before working out a key (a loaded pool adds 100,000).
        if let Some((kind, model, last)) = &self.last_kind {
            let a = &spec.attributes;
            if *model == spec.model
                && last.compute_capability == a.compute_capability
                && last.cuda_version == a.cuda_version
                && last.traits == a.traits
                && last.remoting == a.remoting
                && last.mps == a.mps
            {
                let kind = *kind;
                self.count_kind(kind, true);
                return kind;
            }
        }
        let key = GpuKind::of(&spec.model, &spec.attributes);
        let kind = match self.kind_by_key.get(&key) {
            Some(&kind) => kind,
            None => {
                let kind = u32::try_from(self.kinds.len()).expect("fewer than 2^32 kinds");
                self.kinds.push(KindEntry { kind: key.clone(), gpus: 0 });
                self.kind_by_key.insert(key, kind);
                self.forget_filters();
                kind
            }
        };
        self.count_kind(kind, true);
        let attributes = GpuAttributes { uuid: None, ..spec.attributes.clone() };
        self.last_kind = Some((kind, spec.model.clone(), attributes));
        kind
    }

    /// One GPU more (`up`) or fewer of `kind`; the models and the filters worked out follow
    /// when it gains its first or loses its last.
    fn count_kind(&mut self, kind: u32, up: bool) {
        let gpus = &mut self.kinds[kind as usize].gpus;
        *gpus = if up { *gpus + 1 } else { *gpus - 1 };
        if *gpus == u32::from(up) {
            self.forget_filters();
            let mut models: Vec<String> =
                self.kinds.iter().filter(|k| k.gpus > 0).map(|k| k.kind.model.clone()).collect();
            models.sort_unstable();
            models.dedup();
            self.models = models;
        }
    }

    fn renumber(&mut self) {
        self.gpu_by_id.clear();
        for host in &mut self.hosts {
            host.slots.clear();
        }
        for (slot, gpu) in self.gpus.iter().enumerate() {
            let slot = u32::try_from(slot).expect("fewer than 2^32 GPUs");
            self.gpu_by_id.insert(gpu.spec.id.clone(), slot);
            self.hosts[gpu.host as usize].slots.push(slot);
        }
        for gpu in &mut self.gpus {
            gpu.partitions.clear();
        }
        for slot in 0..self.gpus.len() {
            let parent = self.gpus[slot].spec.partition.as_ref().map(|p| self.gpu_by_id[&p.parent]);
            self.gpus[slot].parent = parent;
            if let Some(parent) = parent {
                self.gpus[parent as usize].partitions.push(slot as u32);
            }
        }
        self.masked = vec![false; self.gpus.len()];
        self.views_stale = true;
        self.inventory_changed();
    }

    /// Drains, undrains or marks a host unavailable. Its cGPUs stay; it only stops taking new ones.
    pub fn set_host_state(&mut self, id: &HostId, state: HostState) -> Result<(), Error> {
        let &host = self
            .host_by_id
            .get(id)
            .ok_or_else(|| Error::inventory("host", format!("host {id} is not registered")))?;
        self.reindexing_host(host as usize, |pool| pool.hosts[host as usize].state = state);
        self.inventory_changed();
        self.changes += 1;
        self.host_changes += 1;
        Ok(())
    }

    /// Taints a GPU with a reason, or untaints it (`None`): a tainted GPU keeps its cGPUs but
    /// takes no new ones.
    pub fn set_gpu_taint(&mut self, id: &GpuId, taint: Option<String>) -> Result<(), Error> {
        let &slot = self
            .gpu_by_id
            .get(id)
            .ok_or_else(|| Error::inventory("gpu", format!("GPU {id} is not registered")))?;
        self.reindexing_with_partitions(slot, |pool| pool.gpus[slot as usize].taint = taint);
        // The limits do not depend on taints; the make-ups do.
        self.makeups = None;
        self.changes += 1;
        Ok(())
    }

    /// Marks a GPU unhealthy with why its host says so, or healthy (`None`): like a taint, an
    /// unhealthy GPU keeps its cGPUs but takes no new ones.
    pub fn set_gpu_health(&mut self, id: &GpuId, health: Option<String>) -> Result<(), Error> {
        let &slot = self
            .gpu_by_id
            .get(id)
            .ok_or_else(|| Error::inventory("gpu", format!("GPU {id} is not registered")))?;
        self.reindexing_with_partitions(slot, |pool| pool.gpus[slot as usize].health = health);
        self.makeups = None;
        self.changes += 1;
        Ok(())
    }

    /// Records what the GPU now is (a driver upgrade, an operator's new traits): it keeps the
    /// cGPUs it backs, and new ones see its new kind.
    pub fn set_gpu_attributes(
        &mut self,
        id: &GpuId,
        attributes: GpuAttributes,
    ) -> Result<(), Error> {
        let &slot = self
            .gpu_by_id
            .get(id)
            .ok_or_else(|| Error::inventory("gpu", format!("GPU {id} is not registered")))?;
        if let Some((field, reason)) = attributes.problems().into_iter().next() {
            return Err(Error::inventory(field, format!("GPU {id}: {reason}")));
        }
        let mut spec = self.gpus[slot as usize].spec.clone();
        spec.attributes = attributes;
        let old = self.gpus[slot as usize].kind;
        let partitioned = self.gpus[slot as usize].is_partitioned();
        let kind = self.kind_of(&spec);
        self.reindexing(&[slot], |pool| {
            let gpu = &mut pool.gpus[slot as usize];
            gpu.spec = spec;
            gpu.kind = kind;
        });
        self.file_compute(slot);
        // A partitioned GPU counts in no kind (see `KindEntry::gpus`).
        self.count_kind(if partitioned { kind } else { old }, false);
        self.forget_filters();
        self.makeups = None;
        self.changes += 1;
        Ok(())
    }

    // ---- reports ----

    pub fn host_state(&self, id: &HostId) -> Option<HostState> {
        self.host_by_id.get(id).map(|&h| self.hosts[h as usize].state)
    }

    /// Every GPU, in pool order.
    pub fn gpu_usage(&self) -> Vec<GpuUsage> {
        self.gpus.iter().map(GpuEntry::usage).collect()
    }

    /// Every host, in registration order.
    pub fn host_usage(&self) -> Vec<HostUsage> {
        self.hosts.iter().map(|h| self.usage_of(h)).collect()
    }

    /// The whole pool's sums, without a report per GPU.
    pub fn totals(&self) -> UsageTotals {
        let mut totals = UsageTotals::default();
        for gpu in &self.gpus {
            totals.allocated_mib += gpu.used_mib;
            totals.cgpus += u64::from(gpu.cgpus);
            if gpu.is_partitioned() {
                // Counted through its partitions.
                continue;
            }
            totals.gpus += 1;
            totals.memory_mib += gpu.spec.memory_mib;
            if gpu.cgpus == 0 && self.hosts[gpu.host as usize].state == HostState::Schedulable {
                totals.idle_gpus += 1;
            }
        }
        totals
    }

    /// A page of hosts: up to `limit` after the host `after` (from the first without it), in
    /// registration order, each with its GPUs in index order. `None`: `after` is not in the pool.
    /// Costs what the page holds, whatever the pool's size.
    pub fn host_page(
        &self,
        after: Option<&HostId>,
        limit: usize,
    ) -> Option<Vec<(HostUsage, Vec<GpuUsage>)>> {
        let start = match after {
            Some(id) => *self.host_by_id.get(id)? as usize + 1,
            None => 0,
        };
        Some(
            self.hosts
                .iter()
                .skip(start)
                .take(limit)
                .map(|h| {
                    let gpus = h.slots.iter().map(|&s| self.gpus[s as usize].usage()).collect();
                    (self.usage_of(h), gpus)
                })
                .collect(),
        )
    }

    /// Who holds the GPU's cGPUs: each VM (or fence) with how many it holds there, in id order.
    /// Empty for a GPU that is not in the pool.
    pub fn holders(&self, gpu: &GpuId) -> Vec<(VmId, u32)> {
        let Some(&slot) = self.gpu_by_id.get(gpu) else { return Vec::new() };
        let mut holders: Vec<(VmId, u32)> = Vec::new();
        let mut ids = self.gpus[slot as usize].holders.clone();
        ids.sort_unstable();
        for id in ids {
            match holders.last_mut() {
                Some((last, n)) if *last == id => *n += 1,
                _ => holders.push((id, 1)),
            }
        }
        holders
    }

    fn usage_of(&self, h: &HostEntry) -> HostUsage {
        let gpus = h.slots.iter().map(|&s| &self.gpus[s as usize]);
        // A partitioned GPU counts through its partitions.
        let whole = gpus.clone().filter(|g| !g.is_partitioned());
        HostUsage {
            id: h.id.clone(),
            kind: h.kind,
            state: h.state,
            gpus: whole.clone().count() as u32,
            memory_mib: whole.map(|g| g.spec.memory_mib).sum(),
            allocated_mib: gpus.map(|g| g.used_mib).sum(),
            vms: h.vms,
        }
    }

    pub fn placement(&self, vm: &VmId) -> Option<&Placement> {
        self.vms.get(vm)
    }

    pub fn placements(&self) -> impl Iterator<Item = &Placement> {
        self.vms.values()
    }

    /// The models of the GPUs in the pool, each once, in name order.
    pub fn models(&self) -> &[String] {
        &self.models
    }

    /// The model of a GPU in the pool.
    pub fn model_of(&self, gpu: &GpuId) -> Option<&str> {
        let slot = *self.gpu_by_id.get(gpu)?;
        Some(&self.gpus[slot as usize].spec.model)
    }

    /// What `cgpus` hold, in all and per model of their GPUs (a GPU no longer in the pool counts
    /// in the totals only).
    pub fn holding<'a>(&self, cgpus: impl IntoIterator<Item = &'a CgpuAssignment>) -> Holding {
        let mut holding = Holding::default();
        for cgpu in cgpus {
            match self.model_of(&cgpu.gpu) {
                Some(model) => holding.add(model, cgpu),
                None => holding.usage = Usage::of_cgpus([cgpu]).plus(holding.usage),
            }
        }
        holding
    }

    /// What one GPU holds and whether it takes new cGPUs (untainted, on a schedulable host, and
    /// admitted by `constraints`), for the queue's preemption planning. `None`: no such GPU.
    pub(crate) fn room(&self, gpu: &GpuId, constraints: &GpuConstraints) -> Option<Room> {
        let slot = *self.gpu_by_id.get(gpu)?;
        let entry = &self.gpus[slot as usize];
        let host = &self.hosts[entry.host as usize];
        let admitted =
            constraints.is_empty() || constraints.admits(&self.kinds[entry.kind as usize].kind);
        Some(Room {
            slot,
            host: host.id.clone(),
            takes_new: admitted && self.eligible(slot),
            memory_mib: entry.spec.memory_mib,
            free_mib: entry.free_mib(),
            exclusive: entry.exclusive,
            cgpus: entry.cgpus,
            compute_percent: entry.compute_percent,
            compute_cgpus: entry.compute_cgpus,
        })
    }

    /// Whether `request` could be placed were every booking gone: on today's GPUs that take new
    /// cGPUs (untainted, healthy, on schedulable hosts), with its locality and distinct-GPU rules,
    /// `on_host` when given (an attach to a `local` VM). A request that fails this waits for
    /// nothing that any release could bring, so a queue should not take it. Costs one pass over
    /// the GPUs after each inventory change, then one over the hosts' make-ups (a fleet has few).
    pub fn could_ever_fit(&mut self, request: &Request, on_host: Option<&HostId>) -> bool {
        let n = u64::from(request.ncgpus);
        let filter = self.admission(&request.gpu_constraints());
        if let Some(host) = on_host {
            let Some(&h) = self.host_by_id.get(host) else { return false };
            let host = &self.hosts[h as usize];
            let gpus = host.slots.iter().map(|&s| &self.gpus[s as usize]);
            let room: u64 = gpus
                .filter(|gpu| self.serves(gpu) && filter.rank(gpu.kind).is_some())
                .map(|gpu| empty_gpu_room(gpu.spec.memory_mib, request))
                .sum();
            let vm_fits = match (host.offers, request.vm_resources) {
                (Some(offers), Some(need)) => offers.has_room(&Resources::default(), &need),
                _ => true,
            };
            return host.state == HostState::Schedulable && room >= n && vm_fits;
        }
        if request.locality != Locality::Local && request.network.is_hard() {
            return self.could_ever_fit_network(request, &filter);
        }
        let limits = self.limits();
        let (total, one_host) = self.empty_room(request, &filter);
        match request.locality {
            Locality::Local => one_host >= n,
            Locality::Any => limits.schedulable_agent_host && total >= n,
            Locality::Remote => limits.schedulable_rgpu_host && total >= n,
        }
    }

    /// [`Self::could_ever_fit`] for cGPUs added to a running VM (which needs no host to run on):
    /// on `on_host`, the VM's host, for a `local` VM; where its network constraint allows around
    /// it for others; anywhere otherwise.
    pub fn could_ever_attach(&mut self, request: &Request, on_host: Option<&HostId>) -> bool {
        match on_host {
            Some(_) if request.locality == Locality::Local => self.could_ever_fit(request, on_host),
            Some(host) if request.network.is_hard() => {
                let filter = self.admission(&request.gpu_constraints());
                self.could_ever_attach_near(request, &filter, host)
            }
            _ => {
                let filter = self.admission(&request.gpu_constraints());
                self.empty_room(request, &filter).0 >= u64::from(request.ncgpus)
            }
        }
    }

    /// How many cGPUs of `request`'s kind the schedulable compute-gpu hosts could hold were they
    /// empty: in all, and on the one that could hold the most.
    fn empty_room(&mut self, request: &Request, filter: &Filter) -> (u64, u64) {
        self.makeups().iter().fold((0, 0), |(total, best), m| {
            let room = m.room(request, filter);
            (total.saturating_add(room.saturating_mul(m.hosts)), best.max(room))
        })
    }

    /// The make-ups of the schedulable compute-gpu hosts (see [`HostMakeup`]).
    fn makeups(&mut self) -> &[HostMakeup] {
        if self.makeups.is_none() {
            let mut by_makeup: HashMap<(GpusByKindMib, Option<Resources>), u64> = HashMap::new();
            for host in &self.hosts {
                if host.state != HostState::Schedulable || host.kind != HostKind::ComputeGpu {
                    continue;
                }
                let mut by_kind_mib: BTreeMap<(u32, u64), u64> = BTreeMap::new();
                let gpus = host.slots.iter().map(|&s| &self.gpus[s as usize]);
                for gpu in gpus.filter(|gpu| self.serves(gpu)) {
                    *by_kind_mib.entry((gpu.kind, gpu.spec.memory_mib)).or_default() += 1;
                }
                let makeup = (by_kind_mib.into_iter().collect(), host.offers);
                *by_makeup.entry(makeup).or_default() += 1;
            }
            let mut makeups: Vec<HostMakeup> = by_makeup
                .into_iter()
                .map(|((gpus_by_kind_mib, offers), hosts)| HostMakeup {
                    gpus_by_kind_mib,
                    offers,
                    hosts,
                })
                .collect();
            makeups.sort_by(|a, b| {
                let key = |m: &HostMakeup| {
                    (m.gpus_by_kind_mib.clone(), m.offers.map(|o| (o.cpu_milli, o.memory_mib)))
                };
                key(a).cmp(&key(b))
            });
            self.makeups = Some(makeups);
        }
        self.makeups.as_deref().expect("computed above")
    }

    /// Forgets what was derived from the inventory (limits, capacities) after it changed.
    fn inventory_changed(&mut self) {
        self.limits = None;
        self.makeups = None;
    }

    // ---- placement ----

    /// Builds now what the next decision under `policy` would build first (the policy's indexes
    /// over every GPU, the pool's limits): a service that has just loaded the pool calls it, so
    /// its first launch does not pay for it (some 20 ms at 100,000 GPUs).
    pub fn prepare(&mut self, policy: &str) -> Result<(), Error> {
        self.views_for(policy)?;
        if self.views_stale {
            self.rebuild_views();
        }
        self.limits();
        Ok(())
    }

    /// Places every cGPU of `request` for `vm` under `policy`, or changes nothing.
    pub fn place(&mut self, vm: VmId, request: &Request, policy: &str) -> Result<Placement, Error> {
        if self.vms.contains_key(&vm) {
            return Err(Error::Conflict(format!("VM {vm} already holds cGPUs")));
        }
        let view = self.views_for(policy)?;
        let limits = self.limits();
        validate(request, &limits)?;
        let shortfall = |placeable, no_vm_host| {
            Error::InsufficientCapacity(Shortfall::of(request, placeable, no_vm_host))
        };
        let has_vm_host = match request.locality {
            Locality::Any => limits.schedulable_agent_host,
            Locality::Remote => limits.schedulable_rgpu_host,
            Locality::Local => true,
        };
        if !has_vm_host {
            return Err(shortfall(0, true));
        }
        if self.views_stale {
            self.rebuild_views();
        }
        if !request.network.is_empty() {
            self.check_levels(&request.network)?;
        }
        let filter = self.filter(view, &request.gpu_constraints(), request.ncgpus)?;
        let outcome = match request.locality {
            Locality::Local => self.place_local(request, view, &filter),
            Locality::Any | Locality::Remote if request.network.is_empty() => {
                self.place_on(request, view, &filter, None, &[])
            }
            Locality::Any | Locality::Remote => self
                .place_network(request, view, &filter)
                .map(|cgpus| (cgpus, vm_host_of(request.locality))),
        };
        let (cgpus, vm_host) = match outcome {
            Ok(done) => done,
            Err(placeable) if !self.could_ever_fit(request, None) => {
                return Err(Error::InsufficientCapacity(Shortfall::never_fits(request, placeable)))
            }
            Err(placeable) => return Err(shortfall(placeable, false)),
        };
        let vm_resources = match vm_host {
            VmHost::Pinned(_) => request.vm_resources,
            _ => None,
        };
        let policy = self.views[view].policy.name();
        let placement = Placement { vm, policy, vm_host, cgpus, vm_resources };
        self.hold(vm, &placement.cgpus);
        self.book_vm_resources(&placement);
        self.vms.insert(vm, placement.clone());
        self.changes += 1;
        Ok(placement)
    }

    /// Locality `local`: hosts are tried in the order of their best GPU under the policy; the first that
    /// takes all cGPUs (and has room for the VM, see `pool/stranding.rs`) wins. A host that cannot is
    /// hidden and the next one tried. A policy that weighs stranding compares the next
    /// [`LOOKAHEAD`] hosts with room by the GPU the VM would strand, least first.
    fn place_local(
        &mut self,
        request: &Request,
        view: usize,
        filter: &Filter,
    ) -> Result<(Vec<CgpuAssignment>, VmHost), u32> {
        let lookahead =
            match request.vm_resources.is_some() && self.views[view].policy.weighs_stranding() {
                true => LOOKAHEAD,
                false => 1,
            };
        let mut tried: Vec<u32> = Vec::new();
        // Hosts with room, hidden while compared: (steps stranded, order found, host).
        let mut pending: Vec<(u64, usize, u32)> = Vec::new();
        let mut found = 0;
        let mut misses = 0;
        // Found by a pass over the hosts with room, the next last.
        let mut scanned: Vec<u32> = Vec::new();
        let mut best_partial = 0;
        let outcome = loop {
            while pending.len() < lookahead && pending.last().is_none_or(|p| p.0 > 0) {
                // After a few hosts without room for the VM, only those with room are looked
                // at: the next hosts' best GPUs, in the policy's order, found in one pass.
                let first = match misses < ROOMLESS_HOSTS_BEFORE_SCAN {
                    true => self.select(view, request, filter, None),
                    false => {
                        if scanned.is_empty() {
                            let wanted = lookahead - pending.len();
                            scanned = self.best_hosts_with_room(view, request, filter, wanted);
                            scanned.reverse();
                        }
                        scanned.pop()
                    }
                };
                let Some(first) = first else { break };
                let host = self.gpus[first as usize].host;
                let slots = self.hosts[host as usize].slots.clone();
                self.set_masked(&slots, true);
                tried.push(host);
                if !self.host_has_room(host, request.vm_resources.as_ref()) {
                    misses += 1;
                } else {
                    let steps = match lookahead {
                        1 => 0,
                        _ => self.strand_steps(host, request, first),
                    };
                    pending.push((steps, found, host));
                    found += 1;
                }
            }
            let Some(at) = (0..pending.len()).min_by_key(|&i| (pending[i].0, pending[i].1)) else {
                break Err(best_partial);
            };
            let (_, _, host) = pending.remove(at);
            let slots = self.hosts[host as usize].slots.clone();
            self.set_masked(&slots, false);
            match self.place_on(request, view, filter, Some(&slots), &[]) {
                Ok((cgpus, _)) => {
                    break Ok((cgpus, VmHost::Pinned(self.hosts[host as usize].id.clone())))
                }
                Err(placed) => {
                    best_partial = best_partial.max(placed);
                    self.set_masked(&slots, true);
                }
            }
        };
        for host in tried {
            let slots = self.hosts[host as usize].slots.clone();
            self.set_masked(&slots, false);
        }
        outcome
    }

    /// Places the request's cGPUs one by one, among all GPUs (through the selector) or `within` one
    /// host's slots (by a scan: a host's GPUs are few). `held` are the slots of the cGPUs the VM
    /// already holds (an attach): `distinct_gpus` keeps off them, and they count as the VM's GPUs
    /// and hosts. On failure undoes its own work and returns how many cGPUs it had placed.
    fn place_on(
        &mut self,
        request: &Request,
        view: usize,
        filter: &Filter,
        within: Option<&[u32]>,
        held: &[u32],
    ) -> Result<(Vec<CgpuAssignment>, VmHost), u32> {
        let mut chosen: Vec<u32> = Vec::with_capacity(request.ncgpus as usize);
        let mut gpus_used: HashSet<u32> = held.iter().copied().collect();
        let mut hosts_used: HashSet<u32> =
            held.iter().map(|&s| self.gpus[s as usize].host).collect();
        let mut failed = false;
        let mut hidden: Vec<u32> = self.compute_hidden(request);
        if request.distinct_gpus {
            hidden.extend(gpus_used.iter().copied());
        }
        // Those a caller hid stay hidden after.
        if !hidden.is_empty() {
            hidden.retain(|&s| !self.masked[s as usize]);
            hidden.sort_unstable();
            hidden.dedup();
            self.set_masked(&hidden, true);
        }
        // Compute shares taken on each slot by this request so far.
        let mut taking: HashMap<u32, u32> = HashMap::new();
        for _ in 0..request.ncgpus {
            let Some(slot) = self.select(view, request, filter, within) else {
                failed = true;
                break;
            };
            if let Some(percent) = request.compute_percent {
                let taken = taking.entry(slot).or_default();
                *taken += percent;
                if self.gpus[slot as usize].compute_percent + *taken + percent > 100 {
                    self.set_masked(&[slot], true);
                    hidden.push(slot);
                }
            }
            let new_gpu = gpus_used.insert(slot);
            let new_host = hosts_used.insert(self.gpus[slot as usize].host);
            self.take(
                slot,
                request_memory(request, &self.gpus[slot as usize]),
                request.mode,
                new_gpu,
                new_host,
            );
            if request.distinct_gpus {
                self.set_masked(&[slot], true);
                hidden.push(slot);
            }
            chosen.push(slot);
        }
        if !hidden.is_empty() {
            self.set_masked(&hidden, false);
        }
        if failed {
            let booked: Vec<(u32, u64, Mode)> = chosen
                .iter()
                .map(|&s| (s, request_memory(request, &self.gpus[s as usize]), request.mode))
                .collect();
            self.untake_all(&booked, held);
            return Err(chosen.len() as u32);
        }
        let cgpus = chosen
            .iter()
            .enumerate()
            .map(|(j, &slot)| {
                let gpu = &self.gpus[slot as usize];
                CgpuAssignment {
                    index: j as u32,
                    gpu: gpu.spec.id.clone(),
                    host: gpu.spec.host.clone(),
                    memory_mib: request_memory(request, gpu),
                    mode: request.mode,
                    // Validated: 1 to 100.
                    compute_percent: request.compute_percent.map(|p| p.min(100) as u8),
                    rcuda: gpu.spec.rcuda,
                }
            })
            .collect();
        Ok((cgpus, vm_host_of(request.locality)))
    }

    /// Undoes `take` for `booked` cGPUs of one VM, given as (slot, memory, mode); the VM keeps the
    /// cGPUs on the `kept` slots.
    fn untake_all(&mut self, booked: &[(u32, u64, Mode)], kept: &[u32]) {
        let mut left_on_gpu: HashMap<u32, u32> = HashMap::new();
        let mut left_on_host: HashMap<u32, u32> = HashMap::new();
        for slot in booked.iter().map(|&(slot, _, _)| slot).chain(kept.iter().copied()) {
            *left_on_gpu.entry(slot).or_default() += 1;
            *left_on_host.entry(self.gpus[slot as usize].host).or_default() += 1;
        }
        for &(slot, memory, mode) in booked.iter().rev() {
            let on_gpu = left_on_gpu.get_mut(&slot).expect("counted above");
            *on_gpu -= 1;
            let last_on_gpu = *on_gpu == 0;
            let on_host =
                left_on_host.get_mut(&self.gpus[slot as usize].host).expect("counted above");
            *on_host -= 1;
            let last_on_host = *on_host == 0;
            self.untake(slot, memory, mode, last_on_gpu, last_on_host);
        }
    }

    /// Releases every cGPU of `vm`, restoring the capacity exactly. Returns what was released; a VM that
    /// holds nothing (already released, or never placed) gives `None`.
    pub fn release(&mut self, vm: &VmId) -> Option<Placement> {
        let placement = self.vms.remove(vm)?;
        let booked: Vec<(u32, u64, Mode)> = placement
            .cgpus
            .iter()
            .map(|c| (self.gpu_by_id[&c.gpu], c.memory_mib, c.mode))
            .collect();
        self.untake_all(&booked, &[]);
        self.unhold(*vm, &placement.cgpus);
        if placement.vm_resources.is_some() {
            self.unbook_vm_resources(vm);
        }
        self.changes += 1;
        Some(placement)
    }

    /// Adds `request.ncgpus` cGPUs to the VM under `policy` (the paper's progressive attach), or
    /// changes nothing. A VM that holds no cGPUs (all detached) gets a new placement. `on_host`
    /// is the VM's host when it has one: the new cGPUs go on it for a `local` VM, where the
    /// request's network constraint allows around it for others, anywhere otherwise. They take the lowest indexes the VM does not use,
    /// so a live cGPU never changes its index, and come last in the VM's list (attach order).
    pub fn attach(
        &mut self,
        vm: VmId,
        request: &Request,
        policy: &str,
        on_host: Option<&HostId>,
    ) -> Result<Vec<CgpuAssignment>, Error> {
        let view = self.views_for(policy)?;
        let limits = self.limits();
        validate(&Request { locality: Locality::Any, ..request.clone() }, &limits)?;
        let held: Vec<u32> = self
            .vms
            .get(&vm)
            .map(|p| p.cgpus.iter().map(|c| self.gpu_by_id[&c.gpu]).collect())
            .unwrap_or_default();
        let total = held.len() as u64 + u64::from(request.ncgpus);
        if total > u64::from(MAX_CGPUS_PER_VM) {
            return Err(Error::invalid(
                "ncgpus",
                format!(
                    "the VM holds {} cGPUs: {} more would be {total}, more than the \
                     {MAX_CGPUS_PER_VM} a VM may have",
                    held.len(),
                    request.ncgpus
                ),
            ));
        }
        let layer = request.constraints.remoting;
        if let Some(problem) = layer.and_then(|r| r.attach_problem(held.len(), request.ncgpus)) {
            return Err(Error::invalid("ncgpus", problem));
        }
        let shortfall =
            |placeable| Error::InsufficientCapacity(Shortfall::of(request, placeable, false));
        let tiers: Vec<Option<Vec<u32>>> = match on_host {
            Some(host) if request.locality == Locality::Local => {
                let Some(&h) = self.host_by_id.get(host) else { return Err(shortfall(0)) };
                let slots = &self.hosts[h as usize].slots;
                let mps = |&s: &u32| self.kinds[self.gpus[s as usize].kind as usize].kind.mps;
                if request.compute_percent.is_some() && !slots.iter().any(mps) {
                    return Err(Error::invalid(
                        "compute_percent",
                        "the VM's GPU host does not run MPS, which a compute share needs; \
                         leave compute_percent out to time-slice",
                    ));
                }
                vec![Some(slots.clone())]
            }
            Some(host) if !request.network.is_empty() => {
                self.check_levels(&request.network)?;
                self.near_tiers(&request.network, host)
            }
            _ => vec![None],
        };
        if self.views_stale {
            self.rebuild_views();
        }
        let filter = self.filter(view, &request.gpu_constraints(), request.ncgpus)?;
        let mut placed = Err(0);
        for within in &tiers {
            placed = self.place_on(request, view, &filter, within.as_deref(), &held);
            if placed.is_ok() {
                break;
            }
        }
        let (mut cgpus, _) = match placed {
            Ok(placed) => placed,
            Err(placeable) if !self.could_ever_attach(request, on_host) => {
                return Err(Error::InsufficientCapacity(Shortfall::never_fits(request, placeable)))
            }
            Err(placeable) => return Err(shortfall(placeable)),
        };
        let policy = self.views[view].policy.name();
        let placement = self.vms.entry(vm).or_insert_with(|| Placement {
            vm,
            policy,
            vm_host: match on_host {
                Some(host) if request.locality == Locality::Local => VmHost::Pinned(host.clone()),
                _ => vm_host_of(request.locality),
            },
            cgpus: Vec::new(),
            vm_resources: None,
        });
        let used: HashSet<u32> = placement.cgpus.iter().map(|c| c.index).collect();
        let mut free = (0..).filter(|i| !used.contains(i));
        for cgpu in &mut cgpus {
            cgpu.index = free.next().expect("indexes are unbounded");
        }
        placement.cgpus.extend(cgpus.iter().cloned());
        self.hold(vm, &cgpus);
        self.changes += 1;
        Ok(cgpus)
    }

    /// Releases the VM's cGPU `index`, restoring its capacity exactly; the VM keeps the others. A
    /// VM left with none holds no placement. `None`: the VM holds no such cGPU.
    pub fn detach(&mut self, vm: &VmId, index: u32) -> Option<CgpuAssignment> {
        let cgpu = self.take_from(vm, index)?;
        self.changes += 1;
        Some(cgpu)
    }

    /// Records a placement decided earlier (loaded from storage), checking that it still fits. Recording
    /// the same placement again is a no-op; all-or-nothing like [`Pool::place`].
    pub fn restore(&mut self, placement: Placement) -> Result<(), Error> {
        if let Some(existing) = self.vms.get(&placement.vm) {
            if *existing == placement {
                return Ok(());
            }
            return Err(Error::Conflict(format!("VM {} already holds other cGPUs", placement.vm)));
        }
        let mut slots = Vec::with_capacity(placement.cgpus.len());
        for cgpu in &placement.cgpus {
            let slot = *self.gpu_by_id.get(&cgpu.gpu).ok_or_else(|| {
                Error::Conflict(format!("VM {}: GPU {} is not in the pool", placement.vm, cgpu.gpu))
            })?;
            if self.gpus[slot as usize].spec.host != cgpu.host {
                return Err(Error::Conflict(format!(
                    "VM {}: GPU {} is on host {}, not {}",
                    placement.vm, cgpu.gpu, self.gpus[slot as usize].spec.host, cgpu.host
                )));
            }
            slots.push(slot);
        }
        let mut gpus_used = HashSet::new();
        let mut hosts_used = HashSet::new();
        let mut booked: Vec<(u32, u64, Mode)> = Vec::with_capacity(slots.len());
        let mut computing: HashMap<u32, u32> = HashMap::new();
        for (cgpu, &slot) in placement.cgpus.iter().zip(&slots) {
            let gpu = &self.gpus[slot as usize];
            // Shares booked on the GPU with this placement's so far (none: no map entry).
            let computes = match cgpu.compute_percent {
                Some(percent) => {
                    let computes = computing.entry(slot).or_insert(gpu.compute_percent);
                    *computes += u32::from(percent);
                    *computes
                }
                None => 0,
            };
            let fits = match cgpu.mode {
                Mode::Exclusive => {
                    gpu.is_idle()
                        && cgpu.memory_mib == gpu.spec.memory_mib
                        && cgpu.compute_percent.is_none()
                }
                Mode::Shared => {
                    !gpu.exclusive && cgpu.memory_mib <= gpu.free_mib() && computes <= 100
                }
            } && !self.booked_with_relatives(gpu);
            if !fits || cgpu.memory_mib == 0 {
                self.untake_all(&booked, &[]);
                return Err(Error::Conflict(format!(
                    "VM {}: cGPU {} ({} MiB, {}) does not fit on GPU {}",
                    placement.vm, cgpu.index, cgpu.memory_mib, cgpu.mode, cgpu.gpu
                )));
            }
            let new_gpu = gpus_used.insert(slot);
            let new_host = hosts_used.insert(gpu.host);
            self.take(slot, cgpu.memory_mib, cgpu.mode, new_gpu, new_host);
            booked.push((slot, cgpu.memory_mib, cgpu.mode));
        }
        self.hold_on(placement.vm, &placement.cgpus, &slots);
        // What the host offers may have shrunk since: the VM runs there, so it is booked anyway.
        self.book_vm_resources(&placement);
        self.vms.insert(placement.vm, placement);
        self.changes += 1;
        Ok(())
    }

    // ---- decisions ----

    fn views_for(&mut self, name: &str) -> Result<usize, Error> {
        if let Some(&view) = self.view_by_name.get(name) {
            return Ok(view);
        }
        let policy = self.registry.resolve(name)?;
        let canonical = policy.name();
        let view = match self.view_by_name.get(&canonical) {
            Some(&view) => view,
            None => {
                let indexes = (self.selector == Selector::Indexed).then(|| {
                    let slots = self.gpus.len() as u32;
                    [policy.new_index(slots), policy.new_index(slots)]
                });
                self.views.push(Views::new(policy, indexes));
                let view = self.views.len() - 1;
                if !self.views_stale {
                    for slot in 0..self.gpus.len() as u32 {
                        self.index_into(view, slot);
                    }
                }
                self.view_by_name.insert(canonical, view);
                view
            }
        };
        self.view_by_name.insert(name.to_owned(), view);
        Ok(view)
    }

    fn rebuild_views(&mut self) {
        let slots = self.gpus.len() as u32;
        for views in &mut self.views {
            if let Some(indexes) = &mut views.indexes {
                *indexes = [views.policy.new_index(slots), views.policy.new_index(slots)];
            }
            views.drop_subsets();
        }
        self.views_stale = false;
        for view in 0..self.views.len() {
            for slot in 0..slots {
                self.index_into(view, slot);
            }
        }
    }

    fn candidate(&self, slot: u32) -> Candidate {
        let gpu = &self.gpus[slot as usize];
        let host = &self.hosts[gpu.host as usize];
        Candidate {
            slot,
            free_mib: gpu.free_mib(),
            total_mib: gpu.spec.memory_mib,
            cgpus: gpu.cgpus,
            jobs: gpu.jobs,
            host_vms: host.vms,
            host_seq: gpu.host,
        }
    }

    /// Whether the slot may take new cGPUs at all: it is untainted and healthy, its host schedulable and the
    /// slot not hidden.
    /// A partition also needs its parent untainted, healthy and holding no cGPU whole; a
    /// partitioned GPU takes none whole.
    fn eligible(&self, slot: u32) -> bool {
        let gpu = &self.gpus[slot as usize];
        self.serves(gpu)
            && self.hosts[gpu.host as usize].state == HostState::Schedulable
            && !self.masked[slot as usize]
            && gpu.parent.is_none_or(|p| self.gpus[p as usize].cgpus == 0)
    }

    /// Whether the GPU takes new cGPUs as far as it and its parent go, whatever is booked:
    /// untainted, healthy, not partitioned, and its parent (if a partition) untainted and healthy.
    fn serves(&self, gpu: &GpuEntry) -> bool {
        gpu.takes_new()
            && !gpu.is_partitioned()
            && gpu.parent.is_none_or(|p| self.gpus[p as usize].takes_new())
    }

    /// Whether a cGPU on `gpu` would be booked beside one on its parent or on one of its
    /// partitions.
    fn booked_with_relatives(&self, gpu: &GpuEntry) -> bool {
        gpu.parent.is_some_and(|p| self.gpus[p as usize].cgpus > 0)
            || gpu.partitions.iter().any(|&p| self.gpus[p as usize].cgpus > 0)
    }

    fn index_into(&mut self, view: usize, slot: u32) {
        self.update_indexes(view, slot, true);
    }

    fn unindex_from(&mut self, view: usize, slot: u32) {
        self.update_indexes(view, slot, false);
    }

    /// Adds the slot's candidate to (or removes it from) the view's indexes it belongs in: the shared
    /// one when it can take a shared cGPU, the exclusive one when it is idle.
    /// So are the subsets' indexes that hold its kind.
    fn update_indexes(&mut self, view: usize, slot: u32, insert: bool) {
        if !self.eligible(slot) {
            return;
        }
        let candidate = self.candidate(slot);
        let gpu = &self.gpus[slot as usize];
        let belongs = [gpu.can_take_shared(), gpu.is_idle()];
        let views = &mut self.views[view];
        if let Some(indexes) = &mut views.indexes {
            update_pair(indexes, &candidate, belongs, insert);
        }
        if let Some(subsets) = views.subsets_of_kind.get(gpu.kind as usize) {
            for &at in subsets {
                let subset = views.subsets[at].as_mut().expect("listed subsets are live");
                update_pair(&mut subset.indexes, &candidate, belongs, insert);
            }
        }
    }

    /// Forgets every filter worked out (the kinds or their counts changed).
    fn forget_filters(&mut self) {
        self.admissions.clear();
        for views in &mut self.views {
            views.filters.clear();
        }
    }

    /// Which kinds `constraints` admit and their ranks (no subsets: see [`Self::filter`]).
    fn admission(&mut self, constraints: &GpuConstraints) -> Arc<Filter> {
        if constraints.is_empty() {
            return self.everything.clone();
        }
        if let Some(filter) = self.admissions.get(constraints) {
            return filter.clone();
        }
        let filter = Arc::new(self.admitted_kinds(constraints));
        if self.admissions.len() >= MAX_CACHED_FILTERS {
            self.admissions.clear();
        }
        self.admissions.insert(constraints.clone(), filter.clone());
        filter
    }

    /// [`Self::admission`] worked out: a pass over the kinds.
    fn admitted_kinds(&self, constraints: &GpuConstraints) -> Filter {
        let ranks = self
            .kinds
            .iter()
            .map(|k| constraints.admits(&k.kind).then(|| constraints.rank(&k.kind)))
            .collect();
        Filter { ranks, tiers: Vec::new() }
    }

    /// How a request with `constraints` sees the pool under `view`: the kinds it admits, ranked,
    /// with the indexes that serve them (a kind's own built now when missing; a set of kinds'
    /// own once its merges have cost as much, see the module docs). `cgpus`: how many decisions
    /// the request will make with it. Refuses constraints that no registered GPU meets, naming the
    /// first such. Kept per policy until the kinds change.
    fn filter(
        &mut self,
        view: usize,
        constraints: &GpuConstraints,
        cgpus: u32,
    ) -> Result<Arc<Filter>, Error> {
        if constraints.is_empty() {
            return Ok(self.everything.clone());
        }
        if let Some(filter) = self.views[view].filters.get(constraints).cloned() {
            if !self.merges_outgrown(view, &filter, cgpus) {
                // Its subsets were used now, for the least-recently-used count.
                self.decisions += 1;
                let views = &mut self.views[view];
                for tier in &filter.tiers {
                    if let Tier::Subset(at) = tier {
                        let subset = views.subsets[*at].as_mut().expect("a kept filter's are live");
                        subset.last_used = self.decisions;
                    }
                }
                return Ok(filter);
            }
        }
        let filter = Arc::new(self.work_out_filter(view, constraints, cgpus)?);
        let filters = &mut self.views[view].filters;
        if filters.len() >= MAX_CACHED_FILTERS {
            filters.clear();
        }
        filters.insert(constraints.clone(), filter.clone());
        Ok(filter)
    }

    /// Counts the work `cgpus` decisions will cost `filter`'s merged tiers beyond one query each;
    /// whether a tier has now cost what an index of its own would, or has one since (another
    /// filter's decisions built it): then the filter is worked out again, and uses it.
    fn merges_outgrown(&mut self, view: usize, filter: &Filter, cgpus: u32) -> bool {
        let mut outgrown = false;
        for tier in &filter.tiers {
            if let Tier::Merged { kinds, .. } = tier {
                if self.views[view].subset_by_kinds.contains_key(kinds) {
                    return true;
                }
                let work = self.merge_work(view, kinds, cgpus);
                outgrown |= work >= self.build_cost(kinds);
            }
        }
        outgrown
    }

    /// Adds the extra queries of `cgpus` merged decisions over `kinds`; the total so far.
    fn merge_work(&mut self, view: usize, kinds: &[u32], cgpus: u32) -> u64 {
        let extra = (kinds.len() as u64 - 1) * u64::from(cgpus.max(1));
        self.subset_stats.merged_queries += extra + u64::from(cgpus.max(1));
        let work = &mut self.views[view].merge_work;
        if work.len() >= MAX_CACHED_FILTERS && !work.contains_key(kinds) {
            // Bounded: an attacker's sets start over, and so do everyone's (they only build later).
            work.clear();
        }
        let total = work.entry(kinds.to_vec()).or_default();
        *total += extra;
        *total
    }

    /// What building the index of `kinds` costs, in index operations: its GPUs, and a floor.
    fn build_cost(&self, kinds: &[u32]) -> u64 {
        8 + kinds.iter().map(|&k| u64::from(self.kinds[k as usize].gpus)).sum::<u64>()
    }

    /// [`Self::filter`] worked out: a pass over the kinds, and the indexes found or built.
    fn work_out_filter(
        &mut self,
        view: usize,
        constraints: &GpuConstraints,
        cgpus: u32,
    ) -> Result<Filter, Error> {
        let mut filter = self.admitted_kinds(constraints);
        if filter.is_everything() {
            return Ok(filter);
        }
        let admitted = |(k, rank): (&KindEntry, &Option<i32>)| k.gpus > 0 && rank.is_some();
        if !self.kinds.iter().zip(&filter.ranks).any(admitted) {
            return Err(self.unmet(constraints));
        }
        let mut ranks: Vec<i32> = filter.ranks.iter().flatten().copied().collect();
        ranks.sort_unstable_by(|a, b| b.cmp(a));
        ranks.dedup();
        if ranks.len() == 1 && filter.ranks.iter().all(Option::is_some) {
            // Every kind admitted, all alike: no constraint at all, in effect.
            return Ok(Filter::default());
        }
        if self.selector != Selector::Indexed {
            return Ok(filter);
        }
        self.decisions += 1;
        for rank in ranks {
            // Kinds without GPUs have nothing to index.
            let kinds: Vec<u32> = (0..)
                .zip(&filter.ranks)
                .filter(|&(kind, r)| *r == Some(rank) && self.kinds[kind as usize].gpus > 0)
                .map(|(kind, _)| kind)
                .collect();
            if kinds.is_empty() {
                continue;
            }
            let tier = if kinds.len() == 1 {
                Tier::Subset(self.kind_subsets(view, &kinds)[0])
            } else if let Some(&at) = self.views[view].subset_by_kinds.get(&kinds) {
                self.views[view].subsets[at].as_mut().expect("mapped subsets are live").last_used =
                    self.decisions;
                Tier::Subset(at)
            } else if self.merge_work(view, &kinds, cgpus) >= self.build_cost(&kinds) {
                self.views[view].merge_work.remove(&kinds);
                Tier::Subset(self.subset(view, kinds))
            } else {
                let subsets = self.kind_subsets(view, &kinds);
                Tier::Merged { kinds, subsets }
            };
            filter.tiers.push(tier);
        }
        Ok(filter)
    }

    /// The subsets of one kind each of `kinds` (sorted), those missing built now in one pass over
    /// the GPUs.
    fn kind_subsets(&mut self, view: usize, kinds: &[u32]) -> Vec<usize> {
        let missing: Vec<u32> = kinds
            .iter()
            .copied()
            .filter(|&k| !self.views[view].subset_by_kinds.contains_key(&vec![k]))
            .collect();
        if !missing.is_empty() {
            self.build_subsets(view, missing.iter().map(|&k| vec![k]).collect());
        }
        let views = &self.views[view];
        kinds.iter().map(|&k| views.subset_by_kinds[&vec![k]]).collect()
    }

    /// The subset of `view` over the GPUs of `kinds` (sorted, several), built now; drops the
    /// least recently used set when [`MAX_SUBSETS`] are live, unless this decision uses them all.
    fn subset(&mut self, view: usize, kinds: Vec<u32>) -> usize {
        let now = self.decisions;
        let views = &mut self.views[view];
        let live = views.subsets.iter().flatten().filter(|s| !s.is_one_kind()).count();
        if live >= MAX_SUBSETS {
            let oldest = (views.subsets.iter().enumerate())
                .filter_map(|(at, s)| s.as_ref().map(|s| (s, at)))
                .filter(|(s, _)| !s.is_one_kind() && s.last_used < now)
                .map(|(s, at)| (s.last_used, at))
                .min();
            if let Some((_, at)) = oldest {
                let gone = views.subsets[at].take().expect("found live");
                views.subset_by_kinds.remove(&gone.kinds);
                for &kind in &gone.kinds {
                    views.subsets_of_kind[kind as usize].retain(|&s| s != at);
                }
                // Kept filters may name it.
                views.filters.clear();
            }
        }
        self.build_subsets(view, vec![kinds])[0]
    }

    /// Makes a subset over each of `sets` (sorted kinds) and fills them in one pass over the GPUs.
    fn build_subsets(&mut self, view: usize, sets: Vec<Vec<u32>>) -> Vec<usize> {
        let now = self.decisions;
        let kind_count = self.kinds.len();
        let slots = self.gpus.len() as u32;
        let views = &mut self.views[view];
        views.subsets_of_kind.resize_with(kind_count, Vec::new);
        let mut made = Vec::with_capacity(sets.len());
        for kinds in sets {
            let policy = &views.policy;
            let subset = Subset {
                kinds: kinds.clone(),
                indexes: [policy.new_index(slots), policy.new_index(slots)],
                last_used: now,
            };
            let at = match views.subsets.iter().position(Option::is_none) {
                Some(at) => {
                    views.subsets[at] = Some(subset);
                    at
                }
                None => {
                    views.subsets.push(Some(subset));
                    views.subsets.len() - 1
                }
            };
            for &kind in &kinds {
                views.subsets_of_kind[kind as usize].push(at);
            }
            views.subset_by_kinds.insert(kinds, at);
            made.push(at);
        }
        self.subset_stats.builds += made.len() as u64;
        if self.indexes_live() {
            // Per kind, the new subsets its GPUs go in.
            let mut into: Vec<Vec<usize>> = vec![Vec::new(); kind_count];
            for &at in &made {
                let subset = self.views[view].subsets[at].as_ref().expect("made above");
                for &kind in &subset.kinds {
                    into[kind as usize].push(at);
                }
            }
            for slot in 0..slots {
                let gpu = &self.gpus[slot as usize];
                let into = &into[gpu.kind as usize];
                if into.is_empty() || !self.eligible(slot) {
                    continue;
                }
                self.subset_stats.built_gpus += into.len() as u64;
                let belongs = [gpu.can_take_shared(), gpu.is_idle()];
                let candidate = self.candidate(slot);
                for &at in into {
                    let subset = self.views[view].subsets[at].as_mut().expect("made above");
                    update_pair(&mut subset.indexes, &candidate, belongs, true);
                }
            }
        }
        made
    }

    /// The refusal of constraints that no registered GPU meets: the first hard constraint (in
    /// [`GpuConstraints::hard_checks`] order) that, with those before it, leaves none.
    fn unmet(&self, constraints: &GpuConstraints) -> Error {
        let mut left: Vec<&GpuKind> =
            self.kinds.iter().filter(|k| k.gpus > 0).map(|k| &k.kind).collect();
        if left.is_empty() {
            return Error::invalid("gpu_model", "the pool has no GPU");
        }
        let checks = constraints.hard_checks(left[0]).count();
        for check in 0..checks {
            let field = constraints.hard_checks(left[0]).nth(check).expect("counted").0;
            let before = left.clone();
            left.retain(|kind| constraints.hard_checks(kind).nth(check).is_some_and(|c| c.1));
            if !left.is_empty() {
                continue;
            }
            let models = |kinds: &[&GpuKind]| {
                let mut models: Vec<&str> = kinds.iter().map(|k| k.model.as_str()).collect();
                models.sort_unstable();
                models.dedup();
                models.truncate(16);
                models.join(", ")
            };
            let among = if check == 0 { String::new() } else { format!(" of {}", models(&before)) };
            let reason = match field {
                "remoting" => {
                    format!("no GPU in the pool speaks {}", constraints.remoting.expect("checked"))
                }
                "gpu_model" => format!(
                    "no GPU in the pool is a {}; its models: {}",
                    constraints.models.join(" or "),
                    models(&before)
                ),
                "min_compute_capability" => format!(
                    "no GPU{among} has compute capability {} or higher",
                    constraints.min_compute_capability.expect("checked")
                ),
                "min_cuda_version" => format!(
                    "no GPU{among} has a driver for CUDA {} or higher",
                    constraints.min_cuda_version.expect("checked")
                ),
                "traits.required" => {
                    format!("no GPU{among} has every trait of {}", constraints.required.join(", "))
                }
                "traits.forbidden" => format!(
                    "every GPU{among} that meets the other constraints has a trait of {}",
                    constraints.forbidden.join(", ")
                ),
                _ => format!(
                    "no GPU{among} that meets the other constraints is on a host that runs MPS, \
                     which a compute share needs; leave compute_percent out to time-slice"
                ),
            };
            return Error::invalid(field, reason);
        }
        Error::invalid("gpu_model", "no GPU in the pool meets these constraints")
    }

    /// Runs `change`, which may alter anything the slots' candidates depend on, keeping indexes right.
    fn reindexing(&mut self, slots: &[u32], change: impl FnOnce(&mut Self)) {
        self.reindexing_views(slots, false, change);
    }

    /// [`Self::reindexing`], in the views whose policy ranks by host load only when
    /// `host_load_only` (`change` alters nothing else).
    fn reindexing_views(
        &mut self,
        slots: &[u32],
        host_load_only: bool,
        change: impl FnOnce(&mut Self),
    ) {
        let live = self.indexes_live();
        let touched = |pool: &Self, view: usize| {
            !host_load_only || pool.views[view].policy.ranks_by_host_load()
        };
        if live {
            for view in 0..self.views.len() {
                if !touched(self, view) {
                    continue;
                }
                for &slot in slots {
                    self.unindex_from(view, slot);
                }
            }
        }
        change(self);
        if live {
            for view in 0..self.views.len() {
                if !touched(self, view) {
                    continue;
                }
                for &slot in slots {
                    self.index_into(view, slot);
                }
            }
        }
    }

    /// [`Self::reindexing`] over every slot of `host`.
    fn reindexing_host(&mut self, host: usize, change: impl FnOnce(&mut Self)) {
        if self.indexes_live() {
            let slots = self.hosts[host].slots.clone();
            self.reindexing(&slots, change);
        } else {
            change(self);
        }
    }

    /// Changes the host's count of VMs (`change`), re-indexing its GPUs only for the policies
    /// that rank by it: the others' indexes hold nothing that depends on it.
    fn changing_host_load(&mut self, host: usize, change: impl FnOnce(&mut Self)) {
        let ranked = self.views.iter().any(|v| v.policy.ranks_by_host_load());
        if self.indexes_live() && ranked {
            let slots = self.hosts[host].slots.clone();
            self.reindexing_views(&slots, true, change);
        } else {
            change(self);
        }
    }

    /// Whether indexes exist and are kept current (not while stale: the next decision rebuilds them).
    fn indexes_live(&self) -> bool {
        !self.views_stale && self.selector == Selector::Indexed && !self.views.is_empty()
    }

    fn set_masked(&mut self, slots: &[u32], masked: bool) {
        self.reindexing(slots, |pool| {
            for &slot in slots {
                pool.masked[slot as usize] = masked;
            }
        });
    }

    /// Records `vm` as the holder of `cgpus` on their GPUs, with their compute shares.
    fn hold(&mut self, vm: VmId, cgpus: &[CgpuAssignment]) {
        let slots: Vec<u32> = cgpus.iter().map(|cgpu| self.gpu_by_id[&cgpu.gpu]).collect();
        self.hold_on(vm, cgpus, &slots);
    }

    /// [`Self::hold`] with the cGPUs' slots known.
    fn hold_on(&mut self, vm: VmId, cgpus: &[CgpuAssignment], slots: &[u32]) {
        for (cgpu, &slot) in cgpus.iter().zip(slots) {
            let gpu = &mut self.gpus[slot as usize];
            gpu.holders.push(vm);
            if let Some(percent) = cgpu.compute_percent {
                gpu.compute_percent += u32::from(percent);
                gpu.compute_cgpus += 1;
            }
            self.file_compute(slot);
        }
    }

    /// Undoes [`Pool::hold`], after the cGPUs' bookings were undone.
    fn unhold(&mut self, vm: VmId, cgpus: &[CgpuAssignment]) {
        for cgpu in cgpus {
            let slot = self.gpu_by_id[&cgpu.gpu];
            let gpu = &mut self.gpus[slot as usize];
            if let Some(at) = gpu.holders.iter().position(|h| *h == vm) {
                gpu.holders.swap_remove(at);
            }
            if let Some(percent) = cgpu.compute_percent {
                gpu.compute_percent -= u32::from(percent);
                gpu.compute_cgpus -= 1;
            }
            self.file_compute(slot);
        }
    }

    /// Puts `slot`'s GPU in the sets [`Self::compute_hidden`] reads, or takes it out, after its
    /// bookings or kind changed.
    fn file_compute(&mut self, slot: u32) {
        let gpu = &self.gpus[slot as usize];
        let plain = !gpu.exclusive && gpu.cgpus > gpu.compute_cgpus;
        let mps = self.kinds[gpu.kind as usize].kind.mps;
        let file = |set: &mut BTreeSet<GpuId>, member: bool| {
            if member != set.contains(&gpu.spec.id) {
                if member {
                    set.insert(gpu.spec.id.clone());
                } else {
                    set.remove(&gpu.spec.id);
                }
            }
        };
        file(&mut self.compute_gpus, gpu.compute_cgpus > 0);
        file(&mut self.plain_on_mps, plain && mps);
    }

    /// The GPUs a cGPU of `request` may not take for the compute shares on them: a cGPU with a
    /// share takes no GPU whose shares would pass 100 percent, nor an MPS GPU with cGPUs
    /// without (they would use its SMs unbounded); a shared cGPU without a share takes no GPU
    /// with shares. Empty, at no cost, while no GPU holds a share.
    fn compute_hidden(&self, request: &Request) -> Vec<u32> {
        let slot = |id: &GpuId| self.gpu_by_id[id];
        match (request.compute_percent, request.mode) {
            (Some(percent), Mode::Shared) => {
                let room = 100 - percent.min(100);
                let full = self
                    .compute_gpus
                    .iter()
                    .map(slot)
                    .filter(|&s| self.gpus[s as usize].compute_percent > room);
                full.chain(self.plain_on_mps.iter().map(slot)).collect()
            }
            (None, Mode::Shared) => self.compute_gpus.iter().map(slot).collect(),
            _ => Vec::new(),
        }
    }

    /// [`Self::reindexing`] for a change of `slot`'s taint, health or bookings, which changes
    /// its partitions' eligibility too.
    fn reindexing_with_partitions(&mut self, slot: u32, change: impl FnOnce(&mut Self)) {
        let partitions = &self.gpus[slot as usize].partitions;
        if partitions.is_empty() {
            self.reindexing(&[slot], change);
        } else {
            let slots: Vec<u32> = std::iter::once(slot).chain(partitions.iter().copied()).collect();
            self.reindexing(&slots, change);
        }
    }

    /// Books one cGPU on `slot`. `new_gpu`/`new_host`: the VM had no cGPU on this GPU/host before.
    fn take(&mut self, slot: u32, memory: u64, mode: Mode, new_gpu: bool, new_host: bool) {
        self.reindexing_with_partitions(slot, |pool| {
            let gpu = &mut pool.gpus[slot as usize];
            gpu.used_mib += memory;
            gpu.cgpus += 1;
            gpu.exclusive = mode == Mode::Exclusive;
            gpu.jobs += u32::from(new_gpu);
        });
        self.mix.count(Mix::percent_of(memory, self.gpus[slot as usize].spec.memory_mib), true);
        if new_host {
            let host = self.gpus[slot as usize].host as usize;
            self.changing_host_load(host, |pool| pool.hosts[host].vms += 1);
        }
    }

    fn untake(
        &mut self,
        slot: u32,
        memory: u64,
        mode: Mode,
        last_on_gpu: bool,
        last_on_host: bool,
    ) {
        self.reindexing_with_partitions(slot, |pool| {
            let gpu = &mut pool.gpus[slot as usize];
            gpu.used_mib -= memory;
            gpu.cgpus -= 1;
            if mode == Mode::Exclusive {
                gpu.exclusive = false;
            }
            gpu.jobs -= u32::from(last_on_gpu);
        });
        self.mix.count(Mix::percent_of(memory, self.gpus[slot as usize].spec.memory_mib), false);
        if last_on_host {
            let host = self.gpus[slot as usize].host as usize;
            self.changing_host_load(host, |pool| pool.hosts[host].vms -= 1);
        }
    }

    /// The policy's choice for the next cGPU, among all GPUs or among `within`.
    /// The policy's choice for the next cGPU, among all GPUs or among `within`, of the kinds
    /// `filter` admits: the highest rank first, the policy's order among equals.
    fn select(
        &self,
        view: usize,
        request: &Request,
        filter: &Filter,
        within: Option<&[u32]>,
    ) -> Option<u32> {
        let need = request_need(request);
        let mode = request.mode;
        let query = Query { need_mib: need, exclusive: mode == Mode::Exclusive, mix: &self.mix };
        if let Some(slots) = within {
            return self.scan(view, mode, need, filter, slots.iter().copied());
        }
        let all = 0..self.gpus.len() as u32;
        match self.selector {
            Selector::Indexed => {
                let views = &self.views[view];
                if filter.is_everything() {
                    let indexes = views.indexes.as_ref().expect("indexed views have indexes");
                    return indexes[index_for(mode)].best_for(&query);
                }
                let best = |at: usize| {
                    let subset = views.subsets[at].as_ref().expect("a filter's subsets are live");
                    subset.indexes[index_for(mode)].best_for(&query)
                };
                filter.tiers.iter().find_map(|tier| match tier {
                    Tier::Subset(at) => best(*at),
                    Tier::Merged { subsets, .. } => subsets
                        .iter()
                        .filter_map(|&at| best(at))
                        .map(|slot| self.candidate(slot))
                        .min_by(|a, b| views.policy.compare_for(&query, a, b))
                        .map(|c| c.slot),
                })
            }
            Selector::Scan => self.scan(view, mode, need, filter, all),
            Selector::SortEachRequest => {
                let policy = &self.views[view].policy;
                let mut candidates: Vec<(i32, Candidate)> = all
                    .filter(|&s| self.eligible(s) && self.gpus[s as usize].takes(mode))
                    .filter_map(|s| {
                        Some((filter.rank(self.gpus[s as usize].kind)?, self.candidate(s)))
                    })
                    .collect();
                candidates.sort_by(|(ra, a), (rb, b)| {
                    rb.cmp(ra).then_with(|| policy.compare_for(&query, a, b))
                });
                candidates.iter().find(|(_, c)| c.free_mib >= need).map(|(_, c)| c.slot)
            }
        }
    }

    fn scan(
        &self,
        view: usize,
        mode: Mode,
        need: u64,
        filter: &Filter,
        slots: impl Iterator<Item = u32>,
    ) -> Option<u32> {
        let policy = &self.views[view].policy;
        let query = Query { need_mib: need, exclusive: mode == Mode::Exclusive, mix: &self.mix };
        slots
            .filter(|&s| {
                self.eligible(s)
                    && self.gpus[s as usize].takes(mode)
                    && self.gpus[s as usize].free_mib() >= need
            })
            .filter_map(|s| Some((filter.rank(self.gpus[s as usize].kind)?, self.candidate(s))))
            .min_by(|(ra, a), (rb, b)| rb.cmp(ra).then_with(|| policy.compare_for(&query, a, b)))
            .map(|(_, c)| c.slot)
    }

    fn limits(&mut self) -> Limits {
        if let Some(limits) = self.limits {
            return limits;
        }
        let mut limits = Limits::default();
        for host in &self.hosts {
            let schedulable = host.state == HostState::Schedulable;
            limits.rgpu_host_registered |= host.kind == HostKind::ComputeRgpu;
            limits.schedulable_rgpu_host |= schedulable && host.kind == HostKind::ComputeRgpu;
            limits.schedulable_agent_host |= schedulable && host.kind.has_agent();
            // A partitioned GPU counts through its partitions.
            let gpus = host.slots.iter().map(|&s| &self.gpus[s as usize]);
            let gpus = gpus.filter(|g| !g.is_partitioned());
            limits.max_gpus_per_host = limits.max_gpus_per_host.max(gpus.clone().count() as u32);
            let memory: u64 = gpus.map(|g| g.spec.memory_mib).sum();
            limits.max_host_mib = limits.max_host_mib.max(memory);
        }
        let whole = self.gpus.iter().filter(|g| !g.is_partitioned());
        limits.max_gpu_mib = whole.map(|g| g.spec.memory_mib).max().unwrap_or(0);
        self.limits = Some(limits);
        limits
    }

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

/// One GPU's state as [`Pool::room`] reports it.
#[derive(Debug, Clone)]
pub(crate) struct Room {
    /// Its place in the pool order.
    pub slot: u32,
    pub host: HostId,
    pub takes_new: bool,
    pub memory_mib: u64,
    pub free_mib: u64,
    pub exclusive: bool,
    pub cgpus: u32,
    /// The compute shares of its cGPUs, percent, and how many cGPUs have one.
    pub compute_percent: u32,
    pub compute_cgpus: u32,
}

/// Adds `candidate` to (or removes it from) the indexes of a pair it `belongs` in: [shared,
/// exclusive].
fn update_pair(
    indexes: &mut [Box<dyn CandidateIndex>; 2],
    candidate: &Candidate,
    belongs: [bool; 2],
    insert: bool,
) {
    for (index, belongs) in indexes.iter_mut().zip(belongs) {
        match (belongs, insert) {
            (false, _) => {}
            (true, true) => index.insert(candidate),
            (true, false) => index.remove(candidate),
        }
    }
}

/// Memory a cGPU books on `gpu`: its share when shared, the whole GPU when exclusive.
fn request_memory(request: &Request, gpu: &GpuEntry) -> u64 {
    match request.mode {
        Mode::Shared => request.gpu_memory_mib.expect("validated: shared requests have memory"),
        Mode::Exclusive => gpu.spec.memory_mib,
    }
}

impl Request {
    /// Everything wrong with the request on its own, before any pool is asked: every field at
    /// once, in field order.
    pub fn problems(&self) -> Vec<(&'static str, String)> {
        let mut problems = Vec::new();
        let n = self.ncgpus;
        if n == 0 {
            problems.push(("ncgpus", "must be at least 1".to_owned()));
        } else if n > MAX_CGPUS_PER_VM {
            problems.push((
                "ncgpus",
                format!("{n} is more than the {MAX_CGPUS_PER_VM} cGPUs a VM may have"),
            ));
        }
        match (self.mode, self.gpu_memory_mib) {
            (_, Some(0)) => problems.push(("gpu_memory_mib", "must be at least 1 MiB".to_owned())),
            (_, Some(mib)) if mib > MAX_GPU_MEMORY_MIB => problems.push((
                "gpu_memory_mib",
                format!("{mib} MiB is more than a GPU may have ({MAX_GPU_MEMORY_MIB} MiB)"),
            )),
            (Mode::Shared, None) => {
                problems.push(("gpu_memory_mib", "is required in shared mode".to_owned()));
            }
            _ => {}
        }
        match (self.compute_percent, self.mode) {
            (Some(percent), _) if percent == 0 || percent > 100 => problems.push((
                "compute_percent",
                format!("{percent} is not a percentage of a GPU's SMs: 1 to 100"),
            )),
            (Some(_), Mode::Exclusive) => problems.push((
                "compute_percent",
                "only a shared cGPU takes a compute share: an exclusive one has its whole GPU"
                    .to_owned(),
            )),
            _ => {}
        }
        if let Some(problem) =
            self.constraints.remoting.and_then(|r| r.ncgpus_problem(u64::from(n)))
        {
            problems.push(("ncgpus", problem));
        }
        if self.vm_resources.is_some() && self.locality != Locality::Local {
            problems.push((
                "vm_resources",
                "only a local VM takes CPU and memory of its GPUs' host".to_owned(),
            ));
        }
        if let Some((_, reason)) = self.vm_resources.and_then(|r| r.problem()) {
            problems.push(("vm_resources", reason));
        }
        problems.extend(self.constraints.problems());
        problems.extend(self.network.problems());
        problems
    }
}

/// Where a VM placed anywhere runs: a compute-rgpu host (`remote`) or any host with an agent.
fn vm_host_of(locality: Locality) -> VmHost {
    match locality {
        Locality::Remote => VmHost::AnyRgpuHost,
        _ => VmHost::AnyAgentHost,
    }
}

/// Free memory a GPU needs to take one cGPU of `request` (idle GPUs have all their memory free).
fn request_need(request: &Request) -> u64 {
    request.gpu_memory_mib.unwrap_or(1)
}

fn validate(request: &Request, limits: &Limits) -> Result<(), Error> {
    if let Some((field, reason)) = request.problems().into_iter().next() {
        return Err(Error::invalid(field, reason));
    }
    let n = request.ncgpus;
    if let Some(mib) = request.gpu_memory_mib {
        if limits.max_gpu_mib > 0 && mib > limits.max_gpu_mib {
            return Err(Error::invalid(
                "gpu_memory_mib",
                format!("{mib} MiB is more than the largest GPU has ({} MiB)", limits.max_gpu_mib),
            ));
        }
    }
    match request.locality {
        Locality::Local if limits.max_gpus_per_host > 0 => {
            let one_per_gpu = request.mode == Mode::Exclusive || request.distinct_gpus;
            if one_per_gpu && n > limits.max_gpus_per_host {
                return Err(Error::invalid(
                    "ncgpus",
                    format!(
                        "{n} cGPUs on one GPU each cannot be local: no host has more than {} GPUs",
                        limits.max_gpus_per_host
                    ),
                ));
            }
            let mib = request.gpu_memory_mib.unwrap_or(0);
            if request.mode == Mode::Shared && u64::from(n) * mib > limits.max_host_mib {
                return Err(Error::invalid(
                    "ncgpus",
                    format!(
                        "{n} cGPUs of {mib} MiB cannot be local: no host has more than {} MiB of GPU memory",
                        limits.max_host_mib
                    ),
                ));
            }
        }
        Locality::Remote if !limits.rgpu_host_registered => {
            return Err(Error::invalid(
                "locality",
                "remote needs a compute-rgpu host, and none is registered",
            ));
        }
        _ => {}
    }
    Ok(())
}
