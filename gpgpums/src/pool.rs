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
use crate::quota::{Holding, PoolSize, Usage};
use crate::traits::{GpuAttributes, GpuConstraints, GpuKind};

mod audit;
mod decisions;
mod fragmentation;
mod inventory;
mod network;
mod placement;
mod rehome;
mod reports;
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
    /// The most any such host offers local VMs, CPU and memory apart (`None`: one's is unknown):
    /// a request past it never fits; one within it may still not, when no one host has both.
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
    /// Its GPUs' memory and number, computed on first use since the inventory last changed.
    size: Option<PoolSize>,
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
            size: None,
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
