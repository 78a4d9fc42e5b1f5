//! The queue: which waiting launches and attaches start now, and what to take back from
//! best-effort VMs so that a more important one can.
//!
//! Like the pool, the planner is pure: the same pool, ledger and queue give the same plan. It books
//! what starts on the pool and the quota ledger it is given (the caller commits them with its
//! writes, or drops them), and it only *proposes* preemptions: the caller withdraws the victims'
//! routes first and releases their cGPUs after, so a GPU never serves two VMs that both think it is
//! theirs. Until then the capacity is "being reclaimed", and the planner keeps it for whoever it
//! was taken for.
//!
//! Order: higher priority first; within a priority, a request that has been passed over too often
//! (see below) first, then the project that uses the smallest part of its quota (its dominant share,
//! as in DRF: the largest of use/limit over its limited resources; a project with no limit at all,
//! of the pool's GPU memory and GPUs), then arrival.
//!
//! Backfill: a request that fits may start while one ahead of it (the head: the first that does
//! not fit) waits. Each start of another project's request passes the head once (a project's own
//! starts never do: it cannot turn its own head into a barrier); once passed
//! [`Rules::max_passes`] times the head becomes a barrier, and nothing behind it starts until it
//! does, so under a steady stream of small requests a large one gets the capacity that frees. A
//! barrier holds for at most [`Rules::max_hold_ms`]: a project whose barrier has held that long
//! (its capacity did not free, as when it waits on VMs that never end) stops holding, and every
//! request of it must be passed `max_passes` times by other projects' starts again before it holds
//! again; so does a project whose barrier started. A request that could not fit even on an empty
//! pool is never the head: it holds nobody back; nor is one that could not fit were every other
//! project's VMs gone ([`Pool::could_fit_beside`]): its own project's VMs keep it out, so holding others
//! back would not help it. So no project keeps another's request that fits waiting for longer
//! than `max_hold_ms` at a time, nor at all behind a request only its own VMs stand in the way of.
//!
//! Preemption by shrinking: when a request cannot start, the planner may take cGPUs from running
//! VMs that are preemptible and of strictly lower priority, never from others. It frees room one
//! GPU at a time, each time on the GPU where one more of the request's cGPUs fits at the cost of
//! the fewest cGPUs taken (ties: the first found, looking at victims in VM id order), until the
//! request fits, its project's quota included; if it never does, nothing is taken (an exclusive
//! request's memory is known only where it lands: taking cGPUs for one its quota then refuses
//! would shrink VMs for nothing, and again at every round). A `local` request frees room on one host only.
//! One preemption per plan: the next plan sees what is being reclaimed. What is taken back is kept
//! for the request it was taken for: that request becomes the head, a barrier, until it starts
//! (or for `max_hold_ms` at most), so a request ahead of it that could not take back capacity
//! itself does not take it instead.
//!
//! Reclaiming loans: a request within its project's quota (its guarantee) that cannot start may
//! take back cGPUs that other members of its project's cohort hold past their own quotas
//! ([`Books::loans`], [`crate::quota::cohort`]), whatever their priority: the youngest loans first,
//! and of each borrower never more than it holds past its quota (a loan whose borrower is back
//! within its quota is its own now). This is looked at before preemption by priority, and frees
//! room the same way, by shrinking: the VMs keep their other cGPUs.
//!
//! Loans come last: with cohorts, a request that would run past its project's quota on loan
//! ([`would_borrow`]) is looked at after every request within its quota, whatever their
//! priorities (Kueue's order), its barrier holds back only requests that would borrow too, and it
//! preempts nobody (a loan is idle capacity; shrinking another project's VM for one would take
//! what that project's quota guarantees, and a VM shrunk so takes the loan back, for ever). So a
//! borrower that cannot start never keeps a request within its guarantee waiting: on the openb
//! trace its barrier once held best-effort requests within their quotas for minutes.

use std::borrow::Cow;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};

use crate::booking::{book_within_model_limits, Refusal};
use crate::error::Error;
use crate::ids::{CohortName, GpuId, HostId, ProjectId, TicketId, VmId};
use crate::model::{CgpuAssignment, Locality, Mode, Placement, Request, VmHost};
use crate::pool::{Pool, Room};
pub use crate::quota::Loan;
use crate::quota::{QuotaLedger, Shares, Usage};
use crate::topology::NetworkConstraint;
use crate::traits::GpuConstraints;

/// What a waiting request asks for.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Ask {
    /// A new VM's cGPUs.
    Launch,
    /// More cGPUs for a running VM, on `on_host` when given (a `local` VM's host).
    Attach { on_host: Option<HostId> },
}

/// A request in the queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Waiting {
    pub ticket: TicketId,
    pub vm: VmId,
    pub project: ProjectId,
    pub ask: Ask,
    pub request: Request,
    pub policy: String,
    pub priority: i32,
    /// How many requests of other projects have started while it waited at the head.
    pub passed: u32,
    /// Since when it holds others back as a barrier, if it does.
    pub holding_since_ms: Option<i64>,
    /// Whether it may run past its project's quota on what the project's cohort lends.
    pub borrow: bool,
}

/// How the planner serves the queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rules {
    /// Let requests that fit start ahead of a head that does not.
    pub backfill: bool,
    /// How many starts may pass the head before it becomes a barrier.
    pub max_passes: u32,
    /// How long a project's barrier holds others back at most (with backfill).
    pub max_hold_ms: i64,
    /// Take cGPUs from preemptible VMs of lower priority.
    pub preemption: bool,
}

impl Rules {
    /// Whether a hold that began at `holding_since_ms` has run its course by `now_ms` (with
    /// backfill; without, the head holds until it starts).
    pub fn hold_lapsed(&self, holding_since_ms: Option<i64>, now_ms: i64) -> bool {
        self.backfill
            && holding_since_ms
                .is_some_and(|since| since.saturating_add(self.max_hold_ms) <= now_ms)
    }

    /// Whether a request of `priority` that does not wait in the queue (`borrowing`: it would
    /// run past its project's quota on loan, see [`would_borrow`]) must leave the free GPUs to
    /// the queue's `head`, which other projects' requests have passed `passed` times (its stored
    /// count and this batch's starts). Starting ahead of the head passes it (backfill); once it
    /// has been passed [`Rules::max_passes`] times (for at most `max_hold_ms` from then), or
    /// while capacity is being reclaimed for it, nothing that comes after it in the queue's order
    /// starts ahead of it: of its priority or lower, and, if it is within its quota, nothing
    /// that would borrow (see the module docs). So requests that skip the queue cannot starve
    /// it, and it cannot hold them longer than the planner would.
    pub fn head_holds(
        &self,
        head: &HeadState,
        passed: u32,
        priority: i32,
        borrowing: bool,
        now_ms: i64,
    ) -> bool {
        let lapsed = self.hold_lapsed(head.holding_since_ms, now_ms);
        let barrier = passed >= self.max_passes && !lapsed;
        let ahead = (!head.borrowing, head.priority) >= (!borrowing, priority);
        ahead && (head.awaiting_reclaim || !self.backfill || barrier)
    }
}

/// The queue's head as requests that do not wait meet it (see [`Rules::head_holds`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeadState {
    pub priority: i32,
    /// Since when it holds others back as a barrier, if it does.
    pub holding_since_ms: Option<i64>,
    /// Capacity is being taken back from preemptible VMs for it.
    pub awaiting_reclaim: bool,
    /// It would run past its project's quota on loan (see [`would_borrow`]).
    pub borrowing: bool,
}

impl Default for Rules {
    fn default() -> Self {
        Rules { backfill: true, max_passes: 16, max_hold_ms: 600_000, preemption: true }
    }
}

/// What the planner books on and reads: the caller's pool and ledger, and facts it keeps elsewhere.
#[derive(Debug)]
pub struct Books<'a> {
    pub pool: &'a mut Pool,
    pub quotas: &'a mut QuotaLedger,
    /// The VMs each project has that count against its `vms` limit; a launch that starts adds one.
    pub vms_in_use: &'a mut HashMap<ProjectId, u64>,
    /// Running VMs that may be shrunk, with their priority.
    pub preemptible: &'a BTreeMap<VmId, i32>,
    /// cGPUs being taken back: routes withdrawn, still booked until the caller releases them.
    pub reclaiming: &'a [(VmId, u32)],
    /// cGPUs on loan from their projects' cohorts (see the module docs), in any order.
    pub loans: &'a [Loan],
    /// The time of the round, in milliseconds (barriers' holds are measured against it).
    pub now_ms: i64,
}

/// A request that starts: its cGPUs are booked on the pool and charged to its project.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Started {
    pub ticket: TicketId,
    pub vm: VmId,
    pub cgpus: Vec<CgpuAssignment>,
    /// For a launch, where the VM must run.
    pub vm_host: Option<VmHost>,
    /// The canonical name of the policy that decided.
    pub policy: String,
    /// Which of `cgpus` are on loan from its project's cohort (see [`crate::quota::Admission`]).
    pub borrowed: Vec<bool>,
}

/// cGPUs to take from one VM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shrink {
    pub vm: VmId,
    /// Where the VM runs (its placement's host), so that what it gets back goes there too.
    pub vm_host: VmHost,
    pub cgpus: Vec<CgpuAssignment>,
    /// A local VM's CPU and memory: booked again if it loses every cGPU and gets one back.
    pub vm_resources: Option<crate::model::Resources>,
}

impl Shrink {
    /// The attaches that give the VM back what it loses, one per kind of cGPU taken, with the host
    /// they must go on, each asking what the VM asked of its GPUs (`constraints`) and of the
    /// network (`network`, around the host the VM runs on, which the caller knows).
    pub fn give_back(
        &self,
        constraints: &GpuConstraints,
        network: &NetworkConstraint,
    ) -> Vec<(Request, Option<HostId>)> {
        let mut kinds: BTreeMap<(bool, u64, Option<u8>), u32> = BTreeMap::new();
        for cgpu in &self.cgpus {
            let exclusive = cgpu.mode == Mode::Exclusive;
            let mib = if exclusive { 0 } else { cgpu.memory_mib };
            *kinds.entry((exclusive, mib, cgpu.compute_percent)).or_default() += 1;
        }
        let (locality, on_host) = match &self.vm_host {
            VmHost::Pinned(host) => (Locality::Local, Some(host.clone())),
            VmHost::AnyRgpuHost => (Locality::Remote, None),
            VmHost::AnyAgentHost => (Locality::Any, None),
        };
        kinds
            .into_iter()
            .map(|((exclusive, mib, compute_percent), n)| {
                let request =
                    if exclusive { Request::exclusive(n) } else { Request::shared(n, mib) };
                let request =
                    Request { compute_percent: compute_percent.map(u32::from), ..request };
                let request = request
                    .with_locality(locality)
                    .with_constraints(constraints.clone())
                    .with_network(network.clone());
                let request = Request { vm_resources: self.vm_resources, ..request };
                (request, on_host.clone())
            })
            .collect()
    }
}

/// cGPUs to take back for a waiting request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Preemption {
    pub ticket: TicketId,
    /// The priority of the request they are taken for.
    pub priority: i32,
    pub victims: Vec<Shrink>,
    /// Loans taken back for a request within its project's guarantee, rather than cGPUs of
    /// preemptible VMs of lower priority.
    pub reclaims_loans: bool,
}

/// What one planning round decided.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// In the order they were decided.
    pub started: Vec<Started>,
    /// Requests that can never start as written (the pool changed under them), with why.
    pub refused: Vec<(TicketId, Error)>,
    pub preemption: Option<Preemption>,
    /// The first request that could not start (and could on an empty pool).
    pub head: Option<Head>,
    /// The head fits once what is being reclaimed is released: the planner kept it for the head.
    pub awaiting_reclaim: bool,
    /// Projects whose requests' passes and holds end (before [`Plan::head`]'s are recorded): their
    /// barrier held for `max_hold_ms`, or started.
    pub reset: BTreeSet<ProjectId>,
}

impl Plan {
    /// Records in `queue` what the round decided of passes and holds (as a caller stores them):
    /// [`Plan::reset`], then [`Plan::head`].
    pub fn record_passes(&self, queue: &mut [Waiting]) {
        for w in queue.iter_mut().filter(|w| self.reset.contains(&w.project)) {
            (w.passed, w.holding_since_ms) = (0, None);
        }
        if let Some(head) = &self.head {
            if let Some(w) = queue.iter_mut().find(|w| w.ticket == head.ticket) {
                (w.passed, w.holding_since_ms) = (head.passed, head.holding_since_ms);
            }
        }
    }
}

/// The head of the queue after a round.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Head {
    pub ticket: TicketId,
    pub project: ProjectId,
    /// How often other projects' starts passed it, in all.
    pub passed: u32,
    /// Since when it holds others back as a barrier; `None`: it does not.
    pub holding_since_ms: Option<i64>,
    /// It would run past its project's quota on loan: it holds back only requests that would too.
    pub borrowing: bool,
}

/// Whether a request asking `request` for `project` (`launch`: a new VM; `borrow`: it may run on
/// loan), with `vms_in_use` VMs of its project, would run past the project's quota on loan: its
/// project is in a cohort and its quota might not hold what it asks (an exclusive request's
/// memory, known only where it lands, counted as on the pool's largest GPUs). Such requests come
/// after every request within its quota (see the module docs).
pub fn would_borrow(
    quotas: &QuotaLedger,
    pool: &mut Pool,
    project: &ProjectId,
    request: &Request,
    launch: bool,
    vms_in_use: u64,
    borrow: bool,
) -> bool {
    if !borrow || quotas.cohort_of(project).is_none() {
        return false;
    }
    let mut asked = Usage::asked(request);
    if request.mode == Mode::Exclusive {
        let on_largest = u64::from(request.ncgpus) * pool.largest_gpu_mib();
        asked.memory_mib = asked.memory_mib.max(on_largest);
    }
    let asked = if launch { Usage::vm_with(asked) } else { asked };
    quotas.check(project, asked, vms_in_use).is_err()
}

/// Plans one round over `queue` (in any order; the planner orders it). See the module docs.
pub fn plan(books: &mut Books<'_>, queue: &[Waiting], rules: &Rules) -> Plan {
    let mut round = Round {
        books,
        rules,
        plan: Plan::default(),
        failed_shapes: HashMap::new(),
        failed_preemptions: HashSet::new(),
        own_blocked: HashMap::new(),
        interned: Interned::default(),
        lowest_preemptible: None,
        borrowing: HashSet::new(),
        stop: false,
    };
    round.lowest_preemptible = round.books.preemptible.values().min().copied();
    // Barriers that held for max_hold_ms: their projects hold nobody back any more.
    let now = round.books.now_ms;
    round.plan.reset = queue
        .iter()
        .filter(|w| rules.hold_lapsed(w.holding_since_ms, now))
        .map(|w| w.project.clone())
        .collect();
    let reset: Vec<Waiting>;
    let queue = if round.plan.reset.is_empty() {
        queue
    } else {
        reset = queue
            .iter()
            .map(|w| match round.plan.reset.contains(&w.project) {
                true => Waiting { passed: 0, holding_since_ms: None, ..w.clone() },
                false => w.clone(),
            })
            .collect();
        &reset
    };

    // With cohorts, requests that would borrow come after every request within its quota, and
    // may not preempt. In a cohort that lends nothing now, none can start on loan this round
    // (the quota holds them), so none is looked at.
    let quotas = &*round.books.quotas;
    let lending: HashSet<&CohortName> = quotas
        .cohorts()
        .filter(|(name, _)| quotas.balance(name).lendable != Usage::default())
        .map(|(name, _)| name)
        .collect();
    if !lending.is_empty() {
        let lending: HashSet<CohortName> = lending.into_iter().cloned().collect();
        let may_borrow = |w: &&Waiting| {
            let cohort = round.books.quotas.cohort_of(&w.project);
            w.borrow && cohort.is_some_and(|(name, _)| lending.contains(name))
        };
        let candidates: Vec<&Waiting> = queue.iter().filter(may_borrow).collect();
        let borrowing: HashSet<TicketId> =
            candidates.into_iter().filter(|w| round.would_borrow(w)).map(|w| w.ticket).collect();
        round.borrowing = borrowing;
    }
    let mut levels: BTreeMap<(bool, Reverse<i32>), Vec<&Waiting>> = BTreeMap::new();
    for waiting in queue {
        let borrowing = round.borrowing.contains(&waiting.ticket);
        levels.entry((borrowing, Reverse(waiting.priority))).or_default().push(waiting);
    }
    for (_, mut level) in levels {
        level.sort_by_key(|w| w.ticket);
        let starving = |w: &Waiting| round.rules.backfill && round.rules.max_passes <= w.passed;
        let mut first: VecDeque<&Waiting> = level.iter().copied().filter(|w| starving(w)).collect();
        let mut by_project: BTreeMap<&ProjectId, Lane> = BTreeMap::new();
        for w in level.iter().copied().filter(|w| !starving(w)) {
            let lane = by_project.entry(&w.project).or_insert_with(|| Lane {
                project: &w.project,
                waiting: VecDeque::new(),
                shares: round.shares(&w.project),
                turn: None,
            });
            lane.waiting.push_back(w);
        }
        let mut turns: BTreeSet<(u64, TicketId, &ProjectId)> = BTreeSet::new();
        for lane in by_project.values_mut() {
            lane.next_turn(&mut turns);
        }
        while !round.stop {
            let waiting = if let Some(w) = first.pop_front() {
                w
            } else if let Some((_, _, project)) = turns.pop_first() {
                let lane = by_project.get_mut(project).expect("a turn has its project");
                lane.turn = None;
                lane.waiting.pop_front().expect("a turn has a request")
            } else {
                break;
            };
            let started = round.plan.started.len();
            round.consider(waiting);
            if let Some(lane) = by_project.get_mut(&waiting.project) {
                if round.plan.started.len() > started {
                    // What it holds changed: its next request's turn moves with its share.
                    lane.shares = round.shares(&waiting.project);
                    if let Some((share, ticket)) = lane.turn.take() {
                        turns.remove(&(share, ticket, lane.project));
                    }
                }
                lane.next_turn(&mut turns);
            }
        }
        if round.stop {
            break;
        }
    }
    round.plan
}

/// One project's waiting requests of a priority level, in arrival order, and its place in the
/// turns: its next request's share and ticket, while it has one there.
struct Lane<'w> {
    project: &'w ProjectId,
    waiting: VecDeque<&'w Waiting>,
    shares: Shares,
    turn: Option<(u64, TicketId)>,
}

impl<'w> Lane<'w> {
    /// Puts its next request in `turns`, unless one is there already.
    fn next_turn(&mut self, turns: &mut BTreeSet<(u64, TicketId, &'w ProjectId)>) {
        if let (None, Some(next)) = (self.turn, self.waiting.front()) {
            let turn = (self.shares.of(&next.request.constraints.models), next.ticket);
            turns.insert((turn.0, turn.1, self.project));
            self.turn = Some(turn);
        }
    }
}

/// Why a request did not start.
enum Held {
    Capacity,
    /// It could not fit even on an empty pool (the pool changed since it was queued).
    Never,
    Quota,
    Refused(Error),
}

/// What makes one request harder than another of the same shape: more cGPUs.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Shape {
    ask: Ask,
    /// The request's constraints, network constraint and policy, by their number in the round
    /// ([`Interned`]).
    constraints: u32,
    network: u32,
    mode: Mode,
    locality: Locality,
    distinct_gpus: bool,
    gpu_memory_mib: Option<u64>,
    compute_percent: Option<u32>,
    /// A local VM's CPU and memory: a flavor that found no host says nothing of a smaller one.
    vm_resources: Option<crate::model::Resources>,
    policy: u32,
}

/// Numbers for the constraints and policies of a round's requests, so that a shape is a few
/// words to hash and compare, not the strings it stands for.
#[derive(Default)]
struct Interned {
    constraints: HashMap<GpuConstraints, u32>,
    networks: HashMap<NetworkConstraint, u32>,
    /// A registry has a handful: a look along them beats hashing.
    policies: Vec<String>,
}

impl Interned {
    /// 0 for no constraint (most requests), without hashing.
    fn constraints(&mut self, constraints: &GpuConstraints) -> u32 {
        intern(&mut self.constraints, constraints, constraints.is_empty())
    }

    /// 0 for none (most requests), without hashing.
    fn network(&mut self, network: &NetworkConstraint) -> u32 {
        intern(&mut self.networks, network, network.is_empty())
    }

    fn policy(&mut self, policy: &str) -> u32 {
        let id = match self.policies.iter().position(|p| p == policy) {
            Some(id) => id,
            None => {
                self.policies.push(policy.to_owned());
                self.policies.len() - 1
            }
        };
        id as u32
    }

    /// The shape of `w` asking `request` (its own, or on the models its limits leave it); `None`
    /// where a failure says nothing about other requests (an attach that avoids its VM's GPUs).
    fn shape(&mut self, w: &Waiting, request: &Request) -> Option<Shape> {
        if request.distinct_gpus && w.ask != Ask::Launch {
            return None;
        }
        Some(Shape {
            ask: w.ask.clone(),
            constraints: self.constraints(&request.constraints),
            network: self.network(&request.network),
            mode: request.mode,
            locality: request.locality,
            distinct_gpus: request.distinct_gpus,
            gpu_memory_mib: request.gpu_memory_mib,
            compute_percent: request.compute_percent,
            vm_resources: request.vm_resources,
            policy: self.policy(&w.policy),
        })
    }
}

/// `key`'s number in `numbers` (1 and up, given in order of first sight); 0 when `empty`.
fn intern<K: std::hash::Hash + Eq + Clone>(
    numbers: &mut HashMap<K, u32>,
    key: &K,
    empty: bool,
) -> u32 {
    if empty {
        return 0;
    }
    let next = numbers.len() as u32 + 1;
    match numbers.get(key) {
        Some(&id) => id,
        None => *numbers.entry(key.clone()).or_insert(next),
    }
}

struct Round<'b, 'a> {
    books: &'b mut Books<'a>,
    rules: &'b Rules,
    plan: Plan,
    /// The fewest cGPUs of each shape that did not fit this round: as many or more will not either
    /// (the round only books, so capacity only shrinks).
    failed_shapes: HashMap<Shape, u32>,
    failed_preemptions: HashSet<(Shape, u32, i32)>,
    /// The fewest cGPUs of each project's shape that its own VMs alone keep from fitting this
    /// round (its own holdings only grow in a round, so as many or more stay blocked).
    own_blocked: HashMap<(ProjectId, Shape), u32>,
    interned: Interned,
    lowest_preemptible: Option<i32>,
    /// Requests that would run past their projects' quotas on loan, as the round began.
    borrowing: HashSet<TicketId>,
    stop: bool,
}

impl Round<'_, '_> {
    /// The project's dominant shares ([`QuotaLedger::shares`]).
    fn shares(&mut self, project: &ProjectId) -> Shares {
        let vms = self.books.vms_in_use.get(project).copied().unwrap_or(0);
        let pool = self.books.pool.size();
        self.books.quotas.shares(project, vms, &pool)
    }

    /// `w`'s request on the models its project's limits leave it
    /// ([`QuotaLedger::within_model_limits`]); `None`: none is left, it waits on its quota.
    fn narrowed<'w>(&self, w: &'w Waiting) -> Option<Cow<'w, Request>> {
        let pool = &*self.books.pool;
        self.books.quotas.within_model_limits(&w.project, &w.request, pool.models()).ok()
    }

    fn consider(&mut self, w: &Waiting) {
        // Capacity and preemption are about the GPUs the request may still use.
        let Some(request) = self.narrowed(w) else { return };
        let shape = self.interned.shape(w, &request);
        let known_to_fail = shape
            .as_ref()
            .and_then(|s| self.failed_shapes.get(s))
            .is_some_and(|&n| n <= w.request.ncgpus);
        // A project whose barrier started earlier in this round has its passes reset.
        let (passed, holding_since_ms) = match self.plan.reset.contains(&w.project) {
            true => (0, None),
            false => (w.passed, w.holding_since_ms),
        };
        let barrier = self.rules.backfill && passed >= self.rules.max_passes;
        let outcome = if known_to_fail { Err(Held::Capacity) } else { self.start(w) };
        match outcome {
            Ok(started) => {
                self.plan.started.push(started);
                if barrier {
                    // A barrier that got its capacity: its project earns its next one anew.
                    self.plan.reset.insert(w.project.clone());
                }
                let (max_passes, now) = (self.rules.max_passes, self.books.now_ms);
                if let Some(head) = &mut self.plan.head {
                    if head.project != w.project {
                        head.passed += 1;
                        if head.passed >= max_passes {
                            head.holding_since_ms.get_or_insert(now);
                            self.stop = true;
                        }
                    }
                }
            }
            Err(Held::Quota | Held::Never) => {}
            Err(Held::Refused(e)) => self.plan.refused.push((w.ticket, e)),
            Err(Held::Capacity) => {
                if let Some(shape) = &shape {
                    let n = self.failed_shapes.entry(shape.clone()).or_insert(u32::MAX);
                    *n = (*n).min(w.request.ncgpus);
                }
                // A request its own project's VMs keep out, whatever other projects' end, is not
                // the head: holding them back would not help it.
                let is_head = self.plan.head.is_none()
                    && !self.blocked_by_own_project(w, &request, shape.as_ref());
                if is_head {
                    self.plan.head = Some(Head {
                        ticket: w.ticket,
                        project: w.project.clone(),
                        passed,
                        holding_since_ms,
                        borrowing: self.borrowing.contains(&w.ticket),
                    });
                    if !self.books.reclaiming.is_empty() && self.fits_after_reclaim(w, &request) {
                        self.plan.awaiting_reclaim = true;
                        self.stop = true;
                        return;
                    }
                }
                if self.may_reclaim(w) {
                    let loans = self.loans_for(w);
                    if let Some(preemption) = self.take_back(w, &request, loans.into_iter(), true) {
                        self.keep_for(w, preemption, holding_since_ms);
                        return;
                    }
                }
                if self.may_preempt(w, shape.as_ref()) {
                    // Lazily: the search stops at the first GPU where one cGPU makes room.
                    let preemptible = self.books.preemptible;
                    let victims = preemptible
                        .iter()
                        .filter(|&(&vm, &priority)| priority < w.priority && vm != w.vm)
                        .map(|(&vm, _)| (vm, None));
                    if let Some(preemption) = self.take_back(w, &request, victims, false) {
                        self.keep_for(w, preemption, holding_since_ms);
                        return;
                    }
                    if let Some(shape) = shape {
                        self.failed_preemptions.insert((shape, w.request.ncgpus, w.priority));
                    }
                }
                if is_head && (!self.rules.backfill || barrier) {
                    if let Some(head) = self.plan.head.as_mut().filter(|_| barrier) {
                        head.holding_since_ms.get_or_insert(self.books.now_ms);
                    }
                    self.stop = true;
                }
            }
        }
    }

    /// Plans `preemption` for `w`, and keeps what it frees for `w`: `w` is the head from now on,
    /// a barrier (as if passed [`Rules::max_passes`] times, for at most `max_hold_ms`), so that
    /// in the next rounds it is looked at first in its priority and nothing of its priority or
    /// lower starts ahead of it, queued or not, until it starts. (Otherwise a request ahead of it
    /// in the queue, which could not take back capacity itself, would take what was taken back
    /// for `w`, and `w` would take back more.)
    fn keep_for(&mut self, w: &Waiting, preemption: Preemption, holding_since_ms: Option<i64>) {
        self.plan.preemption = Some(preemption);
        self.stop = true;
        if !self.rules.backfill {
            // Nothing passes the head: `w`, the first that does not fit, is it already.
            return;
        }
        let passed = match self.plan.head.as_ref().filter(|head| head.ticket == w.ticket) {
            Some(head) => head.passed,
            None => w.passed,
        };
        self.plan.head = Some(Head {
            ticket: w.ticket,
            project: w.project.clone(),
            passed: passed.max(self.rules.max_passes),
            holding_since_ms: Some(holding_since_ms.unwrap_or(self.books.now_ms)),
            borrowing: self.borrowing.contains(&w.ticket),
        });
    }

    /// Whether `w` could not start even were every other project's VMs gone
    /// ([`Pool::could_fit_beside`] its own project's). Changes nothing.
    fn blocked_by_own_project(
        &mut self,
        w: &Waiting,
        request: &Request,
        shape: Option<&Shape>,
    ) -> bool {
        let quotas = &*self.books.quotas;
        // What the project holds on the models the request may use (all, when it names none).
        let models = &request.constraints.models;
        let usage = if models.is_empty() {
            quotas.usage(&w.project)
        } else {
            let on = quotas.model_usage(&w.project).filter(|(m, _)| models.iter().any(|n| n == m));
            on.fold(Usage::default(), |sum, (_, usage)| sum.plus(usage))
        };
        if usage.cgpus == 0 {
            return false;
        }
        let key = shape.map(|shape| (w.project.clone(), shape.clone()));
        if let Some(&n) = key.as_ref().and_then(|key| self.own_blocked.get(key)) {
            if n <= w.request.ncgpus {
                return true;
            }
        }
        let (pool, quotas) = (&mut *self.books.pool, &*self.books.quotas);
        let own = || quotas.vms_of(&w.project).copied().collect();
        let blocked = !pool.could_fit_beside(request, &usage, own, self.books.reclaiming);
        if let (true, Some(key)) = (blocked, key) {
            let n = self.own_blocked.entry(key).or_insert(u32::MAX);
            *n = (*n).min(w.request.ncgpus);
        }
        blocked
    }

    fn may_preempt(&self, w: &Waiting, shape: Option<&Shape>) -> bool {
        self.rules.preemption
            && self.plan.preemption.is_none()
            && !self.borrowing.contains(&w.ticket)
            && self.lowest_preemptible.is_some_and(|lowest| lowest < w.priority)
            && shape.is_none_or(|shape| {
                !self.failed_preemptions.contains(&(shape.clone(), w.request.ncgpus, w.priority))
            })
    }

    /// Starts `w` if its project's quota and the pool allow, booking both; otherwise changes nothing.
    fn start(&mut self, w: &Waiting) -> Result<Started, Held> {
        let launch = w.ask == Ask::Launch;
        let vms = self.books.vms_in_use.get(&w.project).copied().unwrap_or(0);
        let with_vm = |usage| if launch { Usage::vm_with(usage) } else { usage };
        let asked = with_vm(Usage::asked(&w.request));
        if self.books.quotas.check_as(&w.project, asked, vms, w.borrow).is_err() {
            return Err(Held::Quota);
        }
        let (quotas, pool) = (&*self.books.quotas, &mut *self.books.pool);
        let placed = match &w.ask {
            Ask::Launch => book_within_model_limits(
                quotas,
                &w.project,
                &w.request,
                pool,
                |pool, request| pool.could_ever_fit(request, None),
                |pool, request| {
                    pool.place(w.vm, request, &w.policy).map(|p| {
                        let Placement { policy, vm_host, cgpus, .. } = p;
                        (cgpus, Some(vm_host), policy)
                    })
                },
            ),
            Ask::Attach { on_host } => book_within_model_limits(
                quotas,
                &w.project,
                &w.request,
                pool,
                |pool, request| pool.could_ever_attach(request, on_host.as_ref()),
                |pool, request| {
                    pool.attach(w.vm, request, &w.policy, on_host.as_ref()).map(|cgpus| {
                        let policy = pool.placement(&w.vm).map(|p| p.policy.clone());
                        (cgpus, None, policy.unwrap_or_else(|| w.policy.clone()))
                    })
                },
            ),
        };
        let (cgpus, vm_host, policy) = match placed {
            Ok(placed) => placed,
            Err(Refusal::Quota(_)) => return Err(Held::Quota),
            Err(Refusal::Pool(Error::InsufficientCapacity(shortfall))) if shortfall.never_fits => {
                return Err(Held::Never)
            }
            Err(Refusal::Pool(Error::InsufficientCapacity(_))) => return Err(Held::Capacity),
            Err(Refusal::Pool(e)) => return Err(Held::Refused(e)),
        };
        let holding = self.books.pool.holding(&cgpus);
        let holding = if launch { holding.vm_with() } else { holding };
        let each: Vec<Usage> = cgpus.iter().map(|c| Usage::of_cgpus([c])).collect();
        let borrowed = self.books.quotas.split_borrowed(&w.project, &each);
        let charged = self.books.quotas.charge_as(w.vm, &w.project, &holding, vms, w.borrow);
        if charged.is_err() {
            unbook(self.books.pool, w, &cgpus);
            return Err(Held::Quota);
        }
        if launch {
            *self.books.vms_in_use.entry(w.project.clone()).or_default() += 1;
        }
        Ok(Started { ticket: w.ticket, vm: w.vm, cgpus, vm_host, policy, borrowed })
    }

    /// Whether `w` would fit if what is being reclaimed were released. Changes nothing.
    fn fits_after_reclaim(&mut self, w: &Waiting, request: &Request) -> bool {
        let reclaiming = self.books.reclaiming.to_vec();
        let pool = &mut *self.books.pool;
        let originals = detach_all(pool, &reclaiming);
        let fits = fits(pool, self.books.quotas, self.books.vms_in_use, w, request);
        put_back(pool, originals);
        fits
    }

    /// [`would_borrow`] of `w`.
    fn would_borrow(&mut self, w: &Waiting) -> bool {
        let vms = self.books.vms_in_use.get(&w.project).copied().unwrap_or(0);
        let (quotas, pool) = (&*self.books.quotas, &mut *self.books.pool);
        would_borrow(quotas, pool, &w.project, &w.request, w.ask == Ask::Launch, vms, w.borrow)
    }

    /// Whether `w` may take back loans: its project is in a cohort whose other members hold
    /// some, and it asks for no more than its own quota allows without borrowing.
    fn may_reclaim(&self, w: &Waiting) -> bool {
        let quotas = &*self.books.quotas;
        if self.plan.preemption.is_some()
            || self.books.loans.is_empty()
            || quotas.cohort_of(&w.project).is_none()
        {
            return false;
        }
        let vms = self.books.vms_in_use.get(&w.project).copied().unwrap_or(0);
        let asked = Usage::asked(&w.request);
        let asked = if w.ask == Ask::Launch { Usage::vm_with(asked) } else { asked };
        quotas.check(&w.project, asked, vms).is_ok()
    }

    /// The loans `w` may take back, one candidate each, the youngest first: of each other member
    /// of its cohort, those still past its quota ([`QuotaLedger::split_loans`]).
    fn loans_for(&self, w: &Waiting) -> Vec<(VmId, Option<HashSet<u32>>)> {
        let (quotas, pool) = (&*self.books.quotas, &*self.books.pool);
        let Some((cohort, _)) = quotas.cohort_of(&w.project) else { return Vec::new() };
        let others = self.books.loans.iter().filter(|loan| {
            loan.vm != w.vm
                && quotas.project_of(&loan.vm).is_some_and(|project| {
                    project != &w.project
                        && quotas.cohort_of(project).is_some_and(|(c, _)| c == cohort)
                })
        });
        let (on_loan, _) = quotas.split_loans(others.map(|loan| (loan, loan_holds(pool, loan))));
        on_loan.into_iter().map(|loan| (loan.vm, Some(HashSet::from([loan.index])))).collect()
    }

    /// Finds cGPUs of `candidates` (VMs, each with the cGPUs that may be taken; `None`: any)
    /// whose release lets `w` fit. Changes nothing.
    ///
    /// Victims are looked at VM by VM (in the candidates' order) and indexed by GPU as they come:
    /// a GPU where taking one cGPU makes room is as cheap as any, so the search stops at the
    /// first; only when there is none are all victims looked at for the cheapest.
    fn take_back(
        &mut self,
        w: &Waiting,
        request: &Request,
        mut candidates: impl Iterator<Item = (VmId, Option<HashSet<u32>>)>,
        reclaims_loans: bool,
    ) -> Option<Preemption> {
        let pool = &mut *self.books.pool;
        let reclaiming: HashSet<(VmId, u32)> = self.books.reclaiming.iter().copied().collect();
        // Victim cGPUs seen so far, by GPU slot.
        let mut on_gpu: BTreeMap<u32, Vec<(VmId, CgpuAssignment)>> = BTreeMap::new();
        // A `local` VM's host; others' attaches look for victims anywhere (their network
        // constraint is checked by the placement that decides whether they fit).
        let mut on_host = match &w.ask {
            Ask::Attach { on_host } if request.locality == Locality::Local => on_host.clone(),
            Ask::Attach { .. } | Ask::Launch => None,
        };
        let one_host = request.locality == Locality::Local;
        let mut originals: BTreeMap<VmId, Placement> = BTreeMap::new();
        let mut taken: Vec<(VmId, CgpuAssignment)> = Vec::new();
        let cost_at = |pool: &Pool,
                       on_host: &Option<HostId>,
                       victims: &[(VmId, CgpuAssignment)]|
         -> Option<(Vec<usize>, HostId)> {
            let gpu = &victims.first()?.1.gpu;
            // A GPU partitioned under whole bookings from before: all of them must go, and then
            // one of its partitions takes the request.
            if let Some((host, cgpus, fits)) = pool.partitioned_room(gpu, request) {
                let here = on_host.as_ref().is_none_or(|h| *h == host);
                let all = victims.len() as u32 == cgpus;
                return (here && fits && all).then(|| ((0..victims.len()).collect(), host));
            }
            let room = pool.room(gpu, &request.gpu_constraints())?;
            if on_host.as_ref().is_some_and(|h| *h != room.host) {
                return None;
            }
            cheapest_room(&room, victims, request).map(|picked| (picked, room.host))
        };
        let (quotas, vms_in_use) = (&*self.books.quotas, &*self.books.vms_in_use);
        // Loans are taken back only for what the request's own quota holds, where it lands: an
        // exclusive request's memory is known only there, and a request that would borrow itself
        // takes back no other member's loan.
        let borrow = w.borrow && !reclaims_loans;
        let fitted = loop {
            if let Some(cgpus) = fitting(pool, quotas, vms_in_use, w, request, borrow) {
                break Some(cgpus);
            }
            // (cost, slot, picked victims, host)
            let mut best: Option<(usize, u32, Vec<usize>, HostId)> = None;
            type Best = Option<(usize, u32, Vec<usize>, HostId)>;
            let consider =
                |best: &mut Best, slot: u32, victims: &[(VmId, CgpuAssignment)], pool: &Pool| {
                    if let Some((picked, host)) = cost_at(pool, &on_host, victims) {
                        if best.as_ref().is_none_or(|(cost, ..)| picked.len() < *cost) {
                            *best = Some((picked.len(), slot, picked, host));
                        }
                    }
                };
            for (&slot, victims) in &on_gpu {
                consider(&mut best, slot, victims, pool);
            }
            while best.as_ref().is_none_or(|(cost, ..)| *cost > 1) {
                let Some((vm, allowed)) = candidates.next() else { break };
                let Some(placement) = pool.placement(&vm) else { continue };
                let mut touched = Vec::new();
                for cgpu in &placement.cgpus {
                    let allowed = allowed.as_ref().is_none_or(|a| a.contains(&cgpu.index));
                    if !allowed || reclaiming.contains(&(vm, cgpu.index)) {
                        continue;
                    }
                    if let Some(room) = pool.room(&cgpu.gpu, &GpuConstraints::NONE) {
                        on_gpu.entry(room.slot).or_default().push((vm, cgpu.clone()));
                        touched.push(room.slot);
                    }
                }
                touched.sort_unstable();
                touched.dedup();
                for slot in touched {
                    consider(&mut best, slot, &on_gpu[&slot], pool);
                }
            }
            let Some((_, slot, picked, host)) = best else { break None };
            if one_host {
                on_host = Some(host);
            }
            let victims = on_gpu.get_mut(&slot).expect("picked from it");
            let mut picked_cgpus: Vec<(VmId, CgpuAssignment)> =
                picked.iter().map(|&i| victims[i].clone()).collect();
            let picked: HashSet<usize> = picked.into_iter().collect();
            let mut i = 0;
            victims.retain(|_| {
                i += 1;
                !picked.contains(&(i - 1))
            });
            for (vm, cgpu) in &picked_cgpus {
                if let Some(placement) = pool.placement(vm) {
                    originals.entry(*vm).or_insert_with(|| placement.clone());
                }
                pool.detach(vm, cgpu.index);
            }
            taken.append(&mut picked_cgpus);
        };
        if let Some(cgpus) = &fitted {
            // Only what frees a GPU the request then takes: a victim elsewhere (in a rack its
            // network constraint rules out, say) was taken on the way and would free it nothing.
            // The GPUs it takes keep their state without the others, so it still fits.
            // (A partition's parent counts as taken too: its whole bookings kept it unused.)
            let used: HashSet<&GpuId> = cgpus
                .iter()
                .flat_map(|cgpu| std::iter::once(&cgpu.gpu).chain(pool.parent_of(&cgpu.gpu)))
                .collect();
            taken.retain(|(_, cgpu)| used.contains(&cgpu.gpu));
        }
        let vm_hosts: BTreeMap<VmId, (VmHost, Option<crate::model::Resources>)> =
            originals.iter().map(|(vm, p)| (*vm, (p.vm_host.clone(), p.vm_resources))).collect();
        put_back(pool, originals);
        // Nothing fitted: nothing is taken.
        fitted?;
        let mut victims: BTreeMap<VmId, Vec<CgpuAssignment>> = BTreeMap::new();
        for (vm, cgpu) in taken {
            victims.entry(vm).or_default().push(cgpu);
        }
        Some(Preemption {
            ticket: w.ticket,
            priority: w.priority,
            reclaims_loans,
            victims: victims
                .into_iter()
                .map(|(vm, cgpus)| {
                    let (vm_host, vm_resources) = vm_hosts[&vm].clone();
                    Shrink { vm, vm_host, cgpus, vm_resources }
                })
                .collect(),
        })
    }
}

/// What the loaned cGPU holds on `pool`; `None`: it is booked no more.
pub fn loan_holds(pool: &Pool, loan: &Loan) -> Option<Usage> {
    let placement = pool.placement(&loan.vm)?;
    let cgpu = placement.cgpus.iter().find(|c| c.index == loan.index)?;
    Some(Usage::of_cgpus([cgpu]))
}

/// The fewest of `victims` (on the GPU `room` describes) whose release makes room there for one
/// more cGPU of `request`, as indexes into `victims`; `None` if they cannot.
fn cheapest_room(
    room: &Room,
    victims: &[(VmId, CgpuAssignment)],
    request: &Request,
) -> Option<Vec<usize>> {
    if !room.takes_new || victims.is_empty() {
        return None;
    }
    match request.mode {
        Mode::Exclusive => {
            let big_enough = request.gpu_memory_mib.is_none_or(|mib| room.memory_mib >= mib);
            (big_enough && victims.len() as u32 == room.cgpus).then(|| (0..victims.len()).collect())
        }
        Mode::Shared => {
            let mib = request.gpu_memory_mib?;
            if room.memory_mib < mib {
                return None;
            }
            if room.exclusive {
                return (victims.len() == 1 && room.cgpus == 1).then(|| vec![0]);
            }
            // Compute shares never meet cGPUs without one on a GPU (see `Pool::compute_hidden`):
            // those of the other kind must all go, and what is left of the shares must make room.
            let share = |i: usize| victims[i].1.compute_percent.map(u32::from);
            let other_kind = |i: usize| share(i).is_some() != request.compute_percent.is_some();
            let others_here = match request.compute_percent {
                Some(_) => room.cgpus - room.compute_cgpus,
                None => room.compute_cgpus,
            };
            let mut picked: Vec<usize> = (0..victims.len()).filter(|&i| other_kind(i)).collect();
            if picked.len() as u32 != others_here {
                return None;
            }
            let mut need_mib = mib.saturating_sub(room.free_mib);
            let mut need_percent = request
                .compute_percent
                .map_or(0, |p| (room.compute_percent + p).saturating_sub(100));
            for &i in &picked {
                need_mib = need_mib.saturating_sub(victims[i].1.memory_mib);
            }
            if need_mib == 0 && need_percent == 0 {
                // Room already, or once the other kind is gone; none at all: placement failed
                // for another reason, which no victim here changes.
                return (!picked.is_empty()).then_some(picked);
            }
            let mut order: Vec<usize> = (0..victims.len()).filter(|&i| !other_kind(i)).collect();
            order.sort_by_key(|&i| {
                let percent = share(i).unwrap_or(0);
                (
                    Reverse(victims[i].1.memory_mib),
                    Reverse(percent),
                    victims[i].0,
                    victims[i].1.index,
                )
            });
            for i in order {
                need_mib = need_mib.saturating_sub(victims[i].1.memory_mib);
                need_percent = need_percent.saturating_sub(share(i).unwrap_or(0));
                picked.push(i);
                if need_mib == 0 && need_percent == 0 {
                    return Some(picked);
                }
            }
            None
        }
    }
}

/// Whether `w` asking `request` would fit on the pool now, and its project's quota take what it
/// would hold there (an exclusive cGPU's memory is known only once its GPU is). Changes nothing.
fn fits(
    pool: &mut Pool,
    quotas: &QuotaLedger,
    vms_in_use: &HashMap<ProjectId, u64>,
    w: &Waiting,
    request: &Request,
) -> bool {
    fitting(pool, quotas, vms_in_use, w, request, w.borrow).is_some()
}

/// The cGPUs `w` would get now, if the pool and its project's quota allow (past its limits only
/// when `borrow`). Changes nothing.
fn fitting(
    pool: &mut Pool,
    quotas: &QuotaLedger,
    vms_in_use: &HashMap<ProjectId, u64>,
    w: &Waiting,
    request: &Request,
    borrow: bool,
) -> Option<Vec<CgpuAssignment>> {
    let cgpus = placed(pool, w, request)?;
    let holding = pool.holding(&cgpus);
    let holding = if w.ask == Ask::Launch { holding.vm_with() } else { holding };
    let vms = vms_in_use.get(&w.project).copied().unwrap_or(0);
    quotas.admits(&w.project, &holding, vms, borrow).then_some(cgpus)
}

/// The cGPUs `w` would get on the pool as it is now, or `None`. Changes nothing.
fn placed(pool: &mut Pool, w: &Waiting, request: &Request) -> Option<Vec<CgpuAssignment>> {
    let placed = match &w.ask {
        Ask::Launch => pool.place(w.vm, request, &w.policy).map(|p| p.cgpus),
        Ask::Attach { on_host } => pool.attach(w.vm, request, &w.policy, on_host.as_ref()),
    };
    let cgpus = placed.ok()?;
    unbook(pool, w, &cgpus);
    Some(cgpus)
}

/// Undoes the booking of `w`'s `cgpus`.
fn unbook(pool: &mut Pool, w: &Waiting, cgpus: &[CgpuAssignment]) {
    match w.ask {
        Ask::Launch => {
            pool.release(&w.vm);
        }
        Ask::Attach { .. } => {
            for cgpu in cgpus {
                pool.detach(&w.vm, cgpu.index);
            }
        }
    }
}

/// Detaches `cgpus` from the pool, returning the placements they were part of.
fn detach_all(pool: &mut Pool, cgpus: &[(VmId, u32)]) -> BTreeMap<VmId, Placement> {
    let mut originals = BTreeMap::new();
    for (vm, index) in cgpus {
        if let Some(placement) = pool.placement(vm) {
            originals.entry(*vm).or_insert_with(|| placement.clone());
        }
        pool.detach(vm, *index);
    }
    originals
}

/// Puts the VMs' placements back as they were before [`detach_all`] or a preemption trial.
fn put_back(pool: &mut Pool, originals: BTreeMap<VmId, Placement>) {
    for (vm, placement) in originals {
        pool.release(&vm);
        pool.restore(placement).expect("a placement held a moment ago fits again");
    }
}
