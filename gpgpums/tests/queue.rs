//! The queue planner: order (priority, fair share, arrival), backfill that cannot starve the head,
//! and preemption by shrinking, by example and as properties over random pools and queues.

mod common;

use std::collections::{BTreeMap, HashMap};

use common::{add_gpu_host, add_model_host, gpu, host, partition_spec};
use gpgpums::queue::{plan, Ask, Books, Plan, Rules, Waiting};
use gpgpums::{
    GpuConstraints, Locality, ModelLimits, Pool, ProjectId, Quota, QuotaLedger, Request, Resource,
    TicketId, VmId,
};
use proptest::prelude::*;
use uuid::Uuid;

fn vm(n: u64) -> VmId {
    VmId::from_uuid(Uuid::from_u128(u128::from(n) + 1))
}

fn project(name: &str) -> ProjectId {
    ProjectId::new(name).unwrap()
}

fn launch(ticket: u64, project_name: &str, priority: i32, request: Request) -> Waiting {
    Waiting {
        ticket: TicketId(ticket),
        vm: vm(1000 + ticket),
        project: project(project_name),
        ask: Ask::Launch,
        request,
        policy: "first-fit".into(),
        priority,
        passed: 0,
        holding_since_ms: None,
        borrow: false,
    }
}

/// The pool, the ledger and what the planner reads beside them.
struct World {
    pool: Pool,
    quotas: QuotaLedger,
    vms: HashMap<ProjectId, u64>,
    preemptible: BTreeMap<VmId, i32>,
    reclaiming: Vec<(VmId, u32)>,
    /// The time of the next round.
    now_ms: i64,
}

impl World {
    fn new(sizes: &[u64]) -> World {
        let mut pool = Pool::new();
        add_gpu_host(&mut pool, "cg0", sizes);
        World::of(pool)
    }

    /// The world of `pool`, nothing else booked.
    fn of(pool: Pool) -> World {
        World {
            pool,
            quotas: QuotaLedger::new(Quota::default()),
            vms: HashMap::new(),
            preemptible: BTreeMap::new(),
            reclaiming: Vec::new(),
            now_ms: 0,
        }
    }

    /// Runs `w` now (it must fit), preemptible at its priority when asked.
    fn run(&mut self, w: &Waiting, preemptible: bool) {
        let planned = self.plan(std::slice::from_ref(w), &Rules::default());
        assert_eq!(planned.started.len(), 1, "{w:?} must fit: {planned:?}");
        if preemptible {
            self.preemptible.insert(w.vm, w.priority);
        }
    }

    fn plan(&mut self, queue: &[Waiting], rules: &Rules) -> Plan {
        let mut books = Books {
            pool: &mut self.pool,
            quotas: &mut self.quotas,
            vms_in_use: &mut self.vms,
            preemptible: &self.preemptible,
            reclaiming: &self.reclaiming,
            loans: &[],
            now_ms: self.now_ms,
        };
        plan(&mut books, queue, rules)
    }

    fn release(&mut self, vm: &VmId) {
        self.pool.release(vm);
        if let Some(project) = self.quotas.project_of(vm).cloned() {
            *self.vms.get_mut(&project).unwrap() -= 1;
        }
        self.quotas.release(vm);
        self.preemptible.remove(vm);
    }

    /// Releases what a plan's preemption takes, as the service does once routes are withdrawn.
    fn reclaim(&mut self, plan: &Plan) {
        for shrink in &plan.preemption.as_ref().expect("a preemption").victims {
            for cgpu in &shrink.cgpus {
                let held = self.pool.holding([cgpu]);
                self.pool.detach(&shrink.vm, cgpu.index).unwrap();
                self.quotas.refund(&shrink.vm, &held);
            }
        }
        self.reclaiming.clear();
    }
}

/// The plan's head and how often it was passed.
fn head(plan: &Plan) -> Option<(TicketId, u32)> {
    plan.head.as_ref().map(|h| (h.ticket, h.passed))
}

fn tickets(plan: &Plan) -> Vec<u64> {
    plan.started.iter().map(|s| s.ticket.0).collect()
}

#[test]
fn priority_comes_first_then_the_smaller_share_of_quota_then_arrival() {
    let mut world = World::new(&[8192; 4]);
    world.quotas.set_limits(project("big"), Some(Quota { cgpus: Some(8), ..Quota::default() }));
    world.quotas.set_limits(project("small"), Some(Quota { cgpus: Some(2), ..Quota::default() }));
    // "small" already uses half its quota; "big" an eighth, a quarter once ticket 5 starts.
    world.run(&launch(1, "small", 0, Request::exclusive(1)), false);
    world.run(&launch(2, "big", 0, Request::exclusive(1)), false);
    let queue = [
        launch(3, "small", 0, Request::exclusive(1)),
        launch(4, "big", 0, Request::exclusive(1)),
        launch(5, "big", 5, Request::exclusive(1)),
    ];
    let planned = world.plan(&queue, &Rules::default());
    // Priority 5 first; then "big" (1/4 < 1/2); then nothing fits for "small".
    assert_eq!(tickets(&planned), [5, 4]);
    assert_eq!(head(&planned), Some((TicketId(3), 0)));
    world.pool.audit().unwrap();
}

/// Without quotas, projects are ordered by their share of the pool: one using more waits behind
/// one using less, whatever came first (with every share 0 it was arrival order).
#[test]
fn without_quotas_a_project_using_more_of_the_pool_waits_behind_one_using_less() {
    let mut world = World::new(&[8192; 5]);
    for t in 1..=3 {
        world.run(&launch(t, "heavy", 0, Request::exclusive(1)), false);
    }
    world.run(&launch(4, "light", 0, Request::exclusive(1)), false);
    let queue = [
        launch(5, "heavy", 0, Request::exclusive(1)),
        launch(6, "light", 0, Request::exclusive(1)),
    ];
    let planned = world.plan(&queue, &Rules::default());
    assert_eq!(tickets(&planned), [6], "{planned:?}");
    // Shared cGPUs count by memory: a quarter of a GPU is less than a whole one.
    let mut world = World::new(&[8192; 3]);
    world.run(&launch(1, "whole", 0, Request::exclusive(1)), false);
    world.run(&launch(2, "quarter", 0, Request::shared(1, 2048)), false);
    let queue = [
        launch(3, "whole", 0, Request::exclusive(1)),
        launch(4, "quarter", 0, Request::exclusive(1)),
    ];
    assert_eq!(tickets(&world.plan(&queue, &Rules::default())), [4]);
}

#[test]
fn a_request_over_its_quota_waits_without_blocking_others() {
    let mut world = World::new(&[8192; 2]);
    world.quotas.set_limits(project("capped"), Some(Quota { vms: Some(0), ..Quota::default() }));
    let queue = [
        launch(1, "capped", 0, Request::exclusive(1)),
        launch(2, "free", 0, Request::exclusive(1)),
    ];
    let planned = world.plan(&queue, &Rules::default());
    assert_eq!(tickets(&planned), [2]);
    assert_eq!(head(&planned), None);
}

#[test]
fn backfill_lets_small_requests_pass_the_head_a_bounded_number_of_times() {
    let rules = Rules { max_passes: 3, ..Rules::default() };
    let mut world = World::new(&[8192; 4]);
    // Another project's VM keeps the head waiting (its own would hold nobody back).
    world.run(&launch(1, "r", 0, Request::exclusive(1)), false);
    let mut big = launch(2, "p", 0, Request::exclusive(4));
    let smalls: Vec<Waiting> = (3..8).map(|t| launch(t, "q", 0, Request::exclusive(1))).collect();
    let queue: Vec<Waiting> = std::iter::once(big.clone()).chain(smalls.clone()).collect();
    // Without backfill nothing passes the head.
    let mut strict = World::new(&[8192; 4]);
    strict.run(&launch(1, "r", 0, Request::exclusive(1)), false);
    let planned = strict.plan(&queue, &Rules { backfill: false, ..rules });
    assert!(planned.started.is_empty());
    // With it, the three free GPUs go to small requests; the head is passed three times.
    let planned = world.plan(&queue, &rules);
    assert_eq!(tickets(&planned), [3, 4, 5]);
    assert_eq!(head(&planned), Some((TicketId(2), 3)));
    assert_eq!(planned.head.as_ref().unwrap().holding_since_ms, Some(world.now_ms));
    // Passed as often as allowed, the head is a barrier: a GPU freed now waits for it.
    big.passed = 3;
    world.release(&vm(1000 + 3));
    let planned = world.plan(&[big, smalls[3].clone()], &rules);
    assert!(planned.started.is_empty(), "{planned:?}");
    assert_eq!(head(&planned), Some((TicketId(2), 3)));
}

/// Under a steady stream of small requests (one arrives with each release), a large request at the
/// head starts within a bounded number of releases: `max_passes` plus what was running.
#[test]
fn the_head_is_placed_within_a_bounded_number_of_releases_under_a_stream_of_small_requests() {
    let max_passes = 5;
    let rules = Rules { max_passes, ..Rules::default() };
    let gpus = 8;
    let mut world = World::new(&[8192; 8]);
    let mut running = fill_with_small_vms(&mut world, gpus);
    let mut queue = vec![launch(0, "big", 0, Request::exclusive(gpus as u32))];
    let mut next = 100;
    let mut releases = 0;
    let started_big = loop {
        // A small request arrives...
        queue.push(launch(next, "small", 0, Request::exclusive(1)));
        next += 1;
        let planned = world.plan(&queue, &rules);
        for started in &planned.started {
            running.push_back(started.vm);
        }
        planned.record_passes(&mut queue);
        let started: Vec<TicketId> = planned.started.iter().map(|s| s.ticket).collect();
        queue.retain(|w| !started.contains(&w.ticket));
        if started.contains(&TicketId(0)) {
            break releases;
        }
        // ...and the oldest small VM ends.
        if let Some(oldest) = running.pop_front() {
            world.release(&oldest);
            releases += 1;
        }
        assert!(releases < 1000, "the large request starved");
    };
    assert!(
        started_big <= max_passes as usize + gpus,
        "the head waited {started_big} releases, more than {max_passes} passes + {gpus} running"
    );
    // Without the bound (passes unlimited), the same stream starves it.
    let mut world = World::new(&[8192; 8]);
    let mut running = fill_with_small_vms(&mut world, gpus);
    let mut queue = vec![launch(0, "big", 0, Request::exclusive(gpus as u32))];
    for t in 100..300 {
        queue.push(launch(t, "small", 0, Request::exclusive(1)));
        let planned = world.plan(&queue, &Rules { max_passes: u32::MAX, ..rules });
        assert!(!planned.started.iter().any(|s| s.ticket == TicketId(0)));
        running.extend(planned.started.iter().map(|s| s.vm));
        let started: Vec<TicketId> = planned.started.iter().map(|s| s.ticket).collect();
        queue.retain(|w| !started.contains(&w.ticket));
        if let Some(oldest) = running.pop_front() {
            world.release(&oldest);
        }
    }
}

fn fill_with_small_vms(world: &mut World, n: usize) -> std::collections::VecDeque<VmId> {
    (0..n as u64)
        .map(|t| {
            let w = launch(50 + t, "small", 0, Request::exclusive(1));
            world.run(&w, false);
            w.vm
        })
        .collect()
}

#[test]
fn preemption_shrinks_the_lower_priority_preemptible_vm_that_gives_up_the_fewest_cgpus() {
    let mut world = World::new(&[8192; 2]);
    // GPU 0: four 2 GiB cGPUs of one best-effort VM. GPU 1: one 8 GiB cGPU of another.
    let four = launch(1, "be", 0, Request::shared(4, 2048).with_locality(Locality::Local));
    world.run(&four, true);
    world.run(&launch(2, "be", 0, Request::shared(1, 8192)), true);
    assert_eq!(world.pool.placement(&vm(1001)).unwrap().cgpus[0].gpu, gpu("cg0", 0));
    let urgent = launch(3, "prod", 10, Request::shared(1, 8192));
    let planned = world.plan(std::slice::from_ref(&urgent), &Rules::default());
    assert!(planned.started.is_empty());
    let preemption = planned.preemption.expect("a preemption");
    assert_eq!(preemption.ticket, TicketId(3));
    assert_eq!(preemption.victims.len(), 1);
    assert_eq!(preemption.victims[0].vm, vm(1002));
    assert_eq!(preemption.victims[0].cgpus.len(), 1);
    // The plan only proposes: nothing was taken yet.
    assert_eq!(world.pool.placement(&vm(1002)).unwrap().cgpus.len(), 1);
    world.pool.audit().unwrap();
    // While the routes are withdrawn, the capacity is kept for the request it was taken for.
    world.reclaiming = vec![(vm(1002), 0)];
    let small = launch(4, "prod", 0, Request::shared(1, 1024));
    let planned = world.plan(&[urgent.clone(), small], &Rules::default());
    assert!(planned.awaiting_reclaim && planned.started.is_empty() && planned.preemption.is_none());
    // Once released, it starts; the shrunk VM's give-back waits with its own priority.
    world.reclaim(&planned_preemption(&preemption));
    let give_back =
        preemption.victims[0].give_back(&GpuConstraints::NONE, &gpgpums::NetworkConstraint::NONE);
    assert_eq!(give_back, vec![(Request::shared(1, 8192), None)]);
    let planned = world.plan(&[urgent], &Rules::default());
    assert_eq!(tickets(&planned), [3]);
    assert_eq!(planned.started[0].cgpus[0].gpu, gpu("cg0", 1));
}

/// An exclusive request's memory is known only where it lands: a request that fits once VMs
/// are shrunk but whose quota then refuses the GPU's memory takes nothing from anyone. (The
/// openb replay through the simulator once shrank the same best-effort VMs for such a request at
/// every round, their give-backs took the room back, and the queue never settled.)
#[test]
fn nothing_is_taken_for_a_request_its_quota_would_refuse_once_placed() {
    let mut world = World::new(&[8192, 8192]);
    world.run(&launch(1, "be", 0, Request::shared(2, 4096).with_distinct_gpus()), true);
    // "prod" may hold 6 GiB: a whole 8 GiB GPU is past it, though nothing says so before a GPU
    // is chosen (the request asks no memory).
    let limits = Quota { memory_mib: Some(6144), ..Quota::default() };
    world.quotas.set_limits(project("prod"), Some(limits));
    let urgent = launch(2, "prod", 5, Request::exclusive(1));
    let planned = world.plan(std::slice::from_ref(&urgent), &Rules::default());
    assert!(planned.started.is_empty(), "{planned:?}");
    assert_eq!(planned.preemption, None, "shrank a VM for a request its quota refuses");
    // Within its quota it takes what it needs.
    let limits = Quota { memory_mib: Some(8192), ..Quota::default() };
    world.quotas.set_limits(project("prod"), Some(limits));
    let planned = world.plan(&[urgent], &Rules::default());
    assert_eq!(planned.preemption.expect("a preemption").victims[0].vm, vm(1001));
}

fn planned_preemption(preemption: &gpgpums::queue::Preemption) -> Plan {
    Plan { preemption: Some(preemption.clone()), ..Plan::default() }
}

#[test]
fn nothing_is_taken_from_vms_that_are_not_preemptible_or_not_of_lower_priority() {
    let mut world = World::new(&[8192]);
    world.run(&launch(1, "a", 5, Request::exclusive(1)), false);
    let planned = world.plan(&[launch(2, "b", 10, Request::exclusive(1))], &Rules::default());
    assert_eq!(planned.preemption, None);
    let mut world = World::new(&[8192]);
    world.run(&launch(1, "a", 5, Request::exclusive(1)), true);
    for priority in [0, 5] {
        let planned =
            world.plan(&[launch(2, "b", priority, Request::exclusive(1))], &Rules::default());
        assert_eq!(planned.preemption, None, "priority {priority}");
    }
    let planned = world.plan(&[launch(2, "b", 6, Request::exclusive(1))], &Rules::default());
    assert_eq!(planned.preemption.unwrap().victims[0].vm, vm(1001));
    let off = Rules { preemption: false, ..Rules::default() };
    assert_eq!(world.plan(&[launch(2, "b", 6, Request::exclusive(1))], &off).preemption, None);
}

#[test]
fn a_local_request_frees_room_on_one_host() {
    let mut pool = Pool::new();
    add_gpu_host(&mut pool, "cg0", &[8192; 2]);
    add_gpu_host(&mut pool, "cg1", &[8192; 2]);
    let mut world = World { pool, ..World::new(&[]) };
    for t in 1..=4 {
        world.run(&launch(t, "be", 0, Request::exclusive(1)), true);
    }
    let local = launch(9, "prod", 1, Request::exclusive(2).with_locality(Locality::Local));
    let planned = world.plan(&[local], &Rules::default());
    let victims = planned.preemption.unwrap().victims;
    let hosts: Vec<_> = victims.iter().map(|v| v.cgpus[0].host.clone()).collect();
    assert_eq!(hosts, [host("cg0"), host("cg0")]);
}

#[test]
fn a_projects_own_starts_never_pass_its_head() {
    let rules = Rules { max_passes: 2, ..Rules::default() };
    let mut world = World::new(&[8192; 4]);
    world.run(&launch(1, "z", 0, Request::exclusive(1)), false);
    let big = launch(2, "a", 0, Request::exclusive(4));
    let own: Vec<Waiting> = (3..6).map(|t| launch(t, "a", 0, Request::exclusive(1))).collect();
    let queue: Vec<Waiting> = std::iter::once(big).chain(own).collect();
    let planned = world.plan(&queue, &rules);
    // Its own small requests take the free GPUs; the head is passed by none of them.
    assert_eq!(tickets(&planned), [3, 4, 5]);
    assert_eq!(head(&planned), Some((TicketId(2), 0)));
    assert_eq!(planned.head.unwrap().holding_since_ms, None);
}

/// A head that could not start were every other project's VMs gone (its own project's hold
/// what it lacks) holds nobody back: it is not the head, however often it was passed, and what
/// fits behind it starts; once its own VM ends it is the head again.
#[test]
fn a_request_its_own_project_keeps_out_holds_nobody_back() {
    let rules = Rules { max_passes: 2, ..Rules::default() };
    let mut world = World::new(&[8192; 4]);
    world.run(&launch(1, "a", 0, Request::shared(1, 1024)), false);
    let mut big = launch(2, "a", 0, Request::exclusive(4));
    big.passed = 2;
    big.holding_since_ms = Some(world.now_ms);
    let smalls: Vec<Waiting> = (3..6).map(|t| launch(t, "b", 0, Request::exclusive(1))).collect();
    let queue: Vec<Waiting> = std::iter::once(big.clone()).chain(smalls).collect();
    let planned = world.plan(&queue, &rules);
    assert_eq!(tickets(&planned), [3, 4, 5]);
    assert_eq!(head(&planned), None, "{planned:?}");
    // Another project's VM in its way instead: it is the head, and holds.
    let mut world = World::new(&[8192; 4]);
    world.run(&launch(1, "c", 0, Request::shared(1, 1024)), false);
    let planned = world.plan(&queue, &rules);
    assert!(planned.started.is_empty(), "{planned:?}");
    assert_eq!(head(&planned), Some((TicketId(2), 2)));
    // Its own VM gone, it starts.
    let mut world = World::new(&[8192; 4]);
    world.run(&launch(1, "a", 0, Request::shared(1, 1024)), false);
    world.release(&vm(1001));
    assert_eq!(tickets(&world.plan(&[big], &rules)), [2]);
}

/// A head that has held for `max_hold_ms` without its capacity freeing stops holding: what fits
/// starts, and its project's requests must be passed `max_passes` times again before one holds.
#[test]
fn a_barrier_holds_for_at_most_max_hold_then_lets_others_start() {
    let rules = Rules { max_passes: 2, max_hold_ms: 60_000, ..Rules::default() };
    let mut world = World::new(&[8192; 4]);
    world.run(&launch(1, "z", 0, Request::exclusive(1)), false);
    let mut big = launch(2, "a", 0, Request::exclusive(4));
    let mut other = launch(3, "a", 0, Request::exclusive(4));
    (big.passed, other.passed) = (2, 2);
    let small = launch(4, "b", 0, Request::exclusive(1));

    // Armed: it holds, from now.
    world.now_ms = 1_000;
    let mut queue = vec![big, other.clone(), small];
    let planned = world.plan(&queue, &rules);
    assert!(planned.started.is_empty(), "{planned:?}");
    assert_eq!(planned.head.as_ref().unwrap().holding_since_ms, Some(1_000));
    planned.record_passes(&mut queue);
    // Still within the bound.
    world.now_ms = 60_999;
    let planned = world.plan(&queue, &rules);
    assert!(planned.started.is_empty(), "{planned:?}");
    planned.record_passes(&mut queue);
    // Past it: the small request starts, and no request of "a" holds, the armed one included.
    world.now_ms = 61_000;
    let planned = world.plan(&queue, &rules);
    assert_eq!(tickets(&planned), [4]);
    assert_eq!(planned.reset.iter().map(|p| p.as_str()).collect::<Vec<_>>(), ["a"]);
    planned.record_passes(&mut queue);
    assert!(queue.iter().all(|w| w.holding_since_ms.is_none()), "{queue:?}");
    assert_eq!(queue.iter().find(|w| w.ticket == other.ticket).unwrap().passed, 0);
    assert_eq!(head(&planned), Some((TicketId(2), 1)), "passed once more, by the small one");
}

/// A request that could not fit even on an empty pool (five GPUs of four) is no head: it holds
/// nobody back, however often it was passed.
#[test]
fn a_request_that_could_never_fit_is_never_the_head() {
    let rules = Rules { max_passes: 1, ..Rules::default() };
    let mut world = World::new(&[8192; 4]);
    let mut impossible = launch(1, "a", 0, Request::exclusive(5));
    impossible.passed = 9;
    let queue = [impossible, launch(2, "b", 0, Request::exclusive(1))];
    let planned = world.plan(&queue, &rules);
    assert_eq!(tickets(&planned), [2]);
    assert_eq!(head(&planned), None);
    let fits = world.pool.could_ever_fit(&Request::exclusive(4), None);
    assert!(fits && !world.pool.could_ever_fit(&Request::exclusive(5), None));
}

// ---- properties ----

#[derive(Debug, Clone)]
struct Case {
    sizes: Vec<u64>,
    running: Vec<(Request, u8, i32, bool)>,
    limits: Vec<Option<u64>>,
    /// Each project's limit on cGPUs of model "A" (the pool's even GPUs; "B" the odd ones).
    model_limits: Vec<Option<u64>>,
    queue: Vec<(Request, u8, i32, u32)>,
    rules: Rules,
}

fn request() -> impl Strategy<Value = Request> {
    prop_oneof![
        (1u32..4).prop_map(Request::exclusive),
        (1u32..5, prop::sample::select(vec![151u64, 876, 1599, 2104, 3319, 4096]))
            .prop_map(|(n, mib)| Request::shared(n, mib)),
        (1u32..3).prop_map(|n| Request::exclusive(n).with_locality(Locality::Local)),
    ]
}

/// A request for any model, for model "A" or for "B".
fn of_any_model() -> impl Strategy<Value = Request> {
    (request(), 0u8..3).prop_map(|(request, model)| match model {
        0 => request,
        1 => of_models(request, &["A"]),
        _ => of_models(request, &["B"]),
    })
}

fn case() -> impl Strategy<Value = Case> {
    (
        prop::collection::vec(prop::sample::select(vec![4096u64, 8192, 16384]), 1..6),
        prop::collection::vec((of_any_model(), 0u8..3, 0i32..3, any::<bool>()), 0..8),
        prop::collection::vec(prop::option::of(2u64..10), 3),
        prop::collection::vec(prop::option::of(0u64..4), 3),
        prop::collection::vec((of_any_model(), 0u8..3, 0i32..4, 0u32..4), 1..12),
        (any::<bool>(), 1u32..4, any::<bool>()),
    )
        .prop_map(
            |(sizes, running, limits, model_limits, queue, (backfill, max_passes, preemption))| {
                Case {
                    sizes,
                    running,
                    limits,
                    model_limits,
                    queue,
                    rules: Rules { backfill, max_passes, preemption, ..Rules::default() },
                }
            },
        )
}

/// Builds the world of `case`: its running VMs start where they fit.
fn build(case: &Case) -> (World, Vec<Waiting>) {
    let mut world = World::new(&[]);
    let gpus: Vec<(&str, u64)> =
        case.sizes.iter().enumerate().map(|(i, &mib)| (["A", "B"][i % 2], mib)).collect();
    add_model_host(&mut world.pool, "cg0", &gpus);
    for (p, (limit, on_a)) in case.limits.iter().zip(&case.model_limits).enumerate() {
        let a =
            on_a.map(|n| ("A".to_owned(), ModelLimits { cgpus: Some(n), ..Default::default() }));
        let quota = Quota { cgpus: *limit, models: a.into_iter().collect(), ..Quota::default() };
        world.quotas.set_limits(project(&format!("p{p}")), Some(quota));
    }
    for (i, (request, p, priority, preemptible)) in case.running.iter().enumerate() {
        let w = launch(i as u64, &format!("p{p}"), *priority, request.clone());
        let planned = world.plan(std::slice::from_ref(&w), &Rules::default());
        if !planned.started.is_empty() && *preemptible {
            world.preemptible.insert(w.vm, *priority);
        }
    }
    let queue = case
        .queue
        .iter()
        .enumerate()
        .map(|(i, (request, p, priority, passed))| Waiting {
            passed: *passed,
            ..launch(100 + i as u64, &format!("p{p}"), *priority, request.clone())
        })
        .collect();
    (world, queue)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn plans_keep_every_promise(case in case()) {
        let (mut world, queue) = build(&case);
        let before = world.pool.gpu_usage();
        let planned = world.plan(&queue, &case.rules);
        // Deterministic: the same world and queue give the same plan.
        let (mut again, _) = build(&case);
        prop_assert_eq!(&again.plan(&queue, &case.rules), &planned);

        // No GPU is over-allocated.
        prop_assert!(world.pool.audit().is_ok(), "{:?}", world.pool.audit());
        // No quota is exceeded by what started, in all or on model "A"; no cGPU lands on a
        // model its request rules out.
        for started in &planned.started {
            let w = queue.iter().find(|w| w.ticket == started.ticket).unwrap();
            let (quota, _) = world.quotas.limits(&w.project);
            let usage = world.quotas.usage(&w.project);
            let limit = quota.get(Resource::Cgpus).unwrap_or(u64::MAX);
            prop_assert!(usage.cgpus <= limit, "{} holds {} cGPUs, limit {}", w.project, usage.cgpus, limit);
            let on_a = world.quotas.model_usage(&w.project).find(|(m, _)| *m == "A").map_or(0, |(_, u)| u.cgpus);
            let limit = quota.models.get("A").and_then(|l| l.cgpus).unwrap_or(u64::MAX);
            prop_assert!(on_a <= limit, "{} holds {} cGPUs of A, limit {}", w.project, on_a, limit);
            for cgpu in &started.cgpus {
                let model = world.pool.model_of(&cgpu.gpu).unwrap().to_owned();
                let models = &w.request.constraints.models;
                prop_assert!(models.is_empty() || models.contains(&model), "{model} for {models:?}");
            }
        }
        // The plan books what started and nothing else (preemption trials leave no trace).
        let mut undone = World { pool: std::mem::take(&mut world.pool), ..World::new(&[]) };
        for started in &planned.started {
            undone.pool.release(&started.vm);
        }
        prop_assert_eq!(undone.pool.gpu_usage(), before);
        world.pool = undone.pool;

        // A preemption shrinks only preemptible VMs of strictly lower priority, and frees enough.
        if let Some(preemption) = &planned.preemption {
            let w = queue.iter().find(|w| w.ticket == preemption.ticket).unwrap();
            for shrink in &preemption.victims {
                for cgpu in &shrink.cgpus {
                    let model = world.pool.model_of(&cgpu.gpu).unwrap().to_owned();
                    let models = &w.request.constraints.models;
                    prop_assert!(models.is_empty() || models.contains(&model), "took {model} for {models:?}");
                }
                let priority = world.preemptible.get(&shrink.vm);
                prop_assert!(priority.is_some_and(|&p| p < w.priority), "shrunk {:?}", shrink.vm);
                prop_assert!(!shrink.cgpus.is_empty());
            }
            for started in &planned.started {
                world.release(&started.vm);
            }
            world.reclaim(&planned);
            let alone = world.plan(std::slice::from_ref(w), &Rules { preemption: false, ..case.rules });
            let quota_bound = alone.started.is_empty() && alone.head.is_none();
            prop_assert!(quota_bound || alone.started.len() == 1, "the preemption did not free enough: {alone:?}");
        }

        // The head is not starved: once passed `max_passes` times, nothing behind it starts.
        if let Some((ticket, passed)) = head(&planned) {
            let w = queue.iter().find(|w| w.ticket == ticket).unwrap();
            if case.rules.backfill {
                prop_assert!(passed <= case.rules.max_passes.max(w.passed));
            } else {
                prop_assert_eq!(passed, w.passed);
            }
        }
    }
}

/// What one project does to the queue between two rounds.
#[derive(Debug, Clone)]
enum Move {
    Enqueue(Box<Request>),
    Cancel(usize),
    EndVm(usize),
    Nothing,
}

#[derive(Debug, Clone)]
struct Siege {
    sizes: Vec<u64>,
    /// Project "a"'s VMs (those that fit) and its waiting requests, with their passes and since
    /// when they hold (ms before the first round).
    running: Vec<Request>,
    waiting: Vec<(Request, u32, Option<i64>)>,
    /// Project "b"'s request, which fits when it arrives.
    victim: Request,
    moves: Vec<Move>,
    max_passes: u32,
}

fn siege() -> impl Strategy<Value = Siege> {
    let mv = prop_oneof![
        request().prop_map(|r| Move::Enqueue(Box::new(r))),
        (0usize..8).prop_map(Move::Cancel),
        (0usize..8).prop_map(Move::EndVm),
        Just(Move::Nothing),
    ];
    (
        prop::collection::vec(prop::sample::select(vec![4096u64, 8192]), 1..6),
        prop::collection::vec(request(), 0..6),
        prop::collection::vec((request(), 0u32..6, prop::option::of(0i64..HOLD_MS * 2)), 0..5),
        prop_oneof![Just(Request::exclusive(1)), Just(Request::shared(1, 1024))],
        prop::collection::vec(mv, ROUNDS),
        1u32..4,
    )
        .prop_map(|(sizes, running, waiting, victim, moves, max_passes)| Siege {
            sizes,
            running,
            waiting: waiting.into_iter().map(|(r, p, ago)| (r, p, ago.map(|a| -a))).collect(),
            victim,
            moves,
            max_passes,
        })
}

const HOLD_MS: i64 = 60_000;
const ROUND_MS: i64 = 5_000;
const ROUNDS: usize = 40;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// No sequence of one project's requests (any shapes, cancels, its VMs ending, at the same
    /// priority, from any state of passes and holds) keeps another project's request that fits
    /// waiting behind a barrier for longer than `max_hold_ms`: in every round where the victim's
    /// request is not started although it still fits once the round's starts are booked, a
    /// barrier of the attacker holds it, and such rounds span at most `max_hold_ms`.
    #[test]
    fn no_project_holds_another_projects_fitting_request_past_the_bound(case in siege()) {
        let rules = Rules { max_passes: case.max_passes, max_hold_ms: HOLD_MS, preemption: false, ..Rules::default() };
        let mut world = World::new(&case.sizes);
        let mut running: Vec<VmId> = Vec::new();
        for (i, request) in case.running.iter().enumerate() {
            let w = launch(i as u64, "a", 0, request.clone());
            if !world.plan(std::slice::from_ref(&w), &rules).started.is_empty() {
                running.push(w.vm);
            }
        }
        let mut queue: Vec<Waiting> = case
            .waiting
            .iter()
            .enumerate()
            .map(|(i, (request, passed, since))| Waiting {
                passed: *passed,
                holding_since_ms: *since,
                borrow: false,
                ..launch(100 + i as u64, "a", 0, request.clone())
            })
            .collect();
        let victim = launch(500, "b", 0, case.victim.clone());
        // It arrives fitting (else it would not wait behind anyone).
        let fits = world.pool.place(victim.vm, &victim.request, &victim.policy).is_ok();
        world.pool.release(&victim.vm);
        prop_assume!(fits);
        queue.push(victim.clone());

        let mut next = 600;
        let mut held_rounds = Vec::new();
        for (round, mv) in case.moves.iter().enumerate() {
            world.now_ms = round as i64 * ROUND_MS;
            match mv {
                Move::Enqueue(request) => {
                    queue.push(launch(next, "a", 0, (**request).clone()));
                    next += 1;
                }
                Move::Cancel(i) => {
                    let theirs: Vec<TicketId> = queue.iter().filter(|w| w.project.as_str() == "a").map(|w| w.ticket).collect();
                    if let Some(ticket) = theirs.get(i % theirs.len().max(1)) {
                        queue.retain(|w| w.ticket != *ticket);
                    }
                }
                Move::EndVm(i) => {
                    if !running.is_empty() {
                        let vm = running.remove(i % running.len());
                        world.release(&vm);
                    }
                }
                Move::Nothing => {}
            }
            let planned = world.plan(&queue, &rules);
            if planned.started.iter().any(|s| s.ticket == victim.ticket) {
                return Ok(());
            }
            let still_fits = world.pool.place(victim.vm, &victim.request, &victim.policy).is_ok();
            world.pool.release(&victim.vm);
            if still_fits {
                let head = planned.head.clone();
                prop_assert!(head.as_ref().is_some_and(|h| h.project.as_str() == "a"), "held by no barrier of a's: {planned:?}");
                let since = head.and_then(|h| h.holding_since_ms);
                prop_assert!(since.is_some_and(|since| world.now_ms < since + HOLD_MS), "held past the bound: {planned:?}");
                held_rounds.push(world.now_ms);
            }
            let started: Vec<TicketId> = planned.started.iter().map(|s| s.ticket).collect();
            running.extend(planned.started.iter().map(|s| s.vm));
            planned.record_passes(&mut queue);
            queue.retain(|w| !started.contains(&w.ticket));
        }
        if let (Some(first), Some(last)) = (held_rounds.first(), held_rounds.last()) {
            prop_assert!(last - first < HOLD_MS, "held from {first} to {last} ms");
        }
    }
}

#[test]
fn the_head_holds_requests_that_skip_the_queue_only_as_its_rules_say() {
    use gpgpums::queue::HeadState;
    let rules = Rules { backfill: true, max_passes: 2, max_hold_ms: 1_000, preemption: true };
    let head = HeadState {
        priority: 5,
        holding_since_ms: None,
        awaiting_reclaim: false,
        borrowing: false,
    };
    // Backfill: passed fewer than max_passes times, requests of any priority go ahead.
    assert!(!rules.head_holds(&head, 1, 5, false, 0));
    // Passed max_passes times: a barrier for its priority and lower, not for higher ones.
    assert!(rules.head_holds(&head, 2, 5, false, 0));
    assert!(rules.head_holds(&head, 2, 0, false, 0));
    assert!(!rules.head_holds(&head, 2, 6, false, 0));
    // A barrier that has held for max_hold_ms has lapsed.
    let holding = HeadState { holding_since_ms: Some(100), ..head };
    assert!(rules.head_holds(&holding, 2, 5, false, 1_099));
    assert!(!rules.head_holds(&holding, 2, 5, false, 1_100));
    // While capacity is reclaimed for it, or without backfill, it always holds its priority.
    let reclaiming = HeadState { awaiting_reclaim: true, ..holding };
    assert!(rules.head_holds(&reclaiming, 0, 5, false, 1_100));
    let strict = Rules { backfill: false, ..rules };
    assert!(strict.head_holds(&head, 0, 5, false, 0));
    assert!(!strict.head_holds(&head, 0, 6, false, 0));
    // With cohorts: a head within its quota holds back what would borrow, of any priority; one
    // that would borrow holds back nothing within its quota, of any priority.
    assert!(rules.head_holds(&head, 2, 9, true, 0));
    let borrowing = HeadState { borrowing: true, ..head };
    assert!(!rules.head_holds(&borrowing, 2, 0, false, 0));
    assert!(rules.head_holds(&borrowing, 2, 5, true, 0));
    assert!(!rules.head_holds(&borrowing, 2, 6, true, 0));
}

/// A world of one host: two H100s (GPUs 0 and 1), then two T4s (GPUs 2 and 3).
fn mixed_world() -> World {
    let mut world = World::new(&[]);
    world.pool = Pool::new();
    add_model_host(
        &mut world.pool,
        "mixed",
        &[("H100", 81920), ("H100", 81920), ("T4", 16384), ("T4", 16384)],
    );
    world
}

fn of_models(request: Request, models: &[&str]) -> Request {
    let models = models.iter().map(|m| (*m).to_owned()).collect();
    request.with_constraints(GpuConstraints { models, ..GpuConstraints::default() })
}

fn models_of(world: &World, vm: &VmId) -> Vec<String> {
    let placement = world.pool.placement(vm).expect("placed");
    placement.cgpus.iter().map(|c| world.pool.model_of(&c.gpu).unwrap().to_owned()).collect()
}

/// A request for one model that cannot start says nothing of requests of the same shape for any
/// model: they start behind it.
#[test]
fn a_request_for_a_full_model_does_not_hold_back_requests_for_any_model() {
    let mut world = mixed_world();
    for n in [1, 2] {
        world.run(&launch(n, "x", 0, of_models(Request::exclusive(1), &["H100"])), false);
    }
    let queue = [
        launch(3, "a", 0, of_models(Request::exclusive(1), &["H100"])),
        launch(4, "b", 0, Request::exclusive(1)),
    ];
    let planned = world.plan(&queue, &Rules::default());
    assert_eq!(tickets(&planned), [4]);
    assert_eq!(models_of(&world, &queue[1].vm), ["T4"]);
    assert_eq!(head(&planned), Some((TicketId(3), 1)));
}

/// A request for one rack that no rack can take now (but one could, later) does not hold back
/// the same request without the network constraint, which the GPUs of two racks can take.
#[test]
fn a_request_for_one_rack_does_not_hold_back_the_same_request_for_anywhere() {
    let mut world = World::new(&[]);
    world.pool = Pool::new();
    for (name, rack, gpus) in [("cg0", "r0", 2), ("cg1", "r1", 1)] {
        add_gpu_host(&mut world.pool, name, &vec![8192; gpus]);
        world
            .pool
            .add_host(
                gpgpums::HostId::new(format!("vm-{rack}")).unwrap(),
                gpgpums::HostKind::ComputeRgpu,
            )
            .unwrap();
        for host in [name.to_owned(), format!("vm-{rack}")] {
            let topology = [("rack".to_owned(), rack.to_owned())].into();
            world.pool.set_host_topology(&gpgpums::HostId::new(host).unwrap(), topology).unwrap();
        }
    }
    // One of rack r0's two GPUs is taken: each rack has one free, so two in one rack must wait.
    world.run(&launch(9, "c", 0, Request::exclusive(1)), false);
    let two = Request::exclusive(2).with_locality(Locality::Remote);
    let one_rack = gpgpums::NetworkConstraint { same: Some("rack".into()), ..Default::default() };
    let queue = [launch(1, "a", 1, two.clone().with_network(one_rack)), launch(2, "b", 0, two)];
    let planned = world.plan(&queue, &Rules::default());
    assert_eq!(tickets(&planned), [2], "{planned:?}");
}

/// Preemption for a request of one model takes cGPUs only from GPUs of that model, and what a
/// shrunk VM gets back asks what it asked.
#[test]
fn preemption_takes_only_from_gpus_the_request_may_use() {
    let mut world = mixed_world();
    // Low-priority VMs fill every GPU; the T4s' come first in VM order.
    for (n, model) in [(1, "T4"), (2, "T4"), (3, "H100"), (4, "H100")] {
        world.run(&launch(n, "low", 0, of_models(Request::exclusive(1), &[model])), true);
    }
    let urgent = launch(5, "high", 10, of_models(Request::exclusive(1), &["H100"]));
    let planned = world.plan(std::slice::from_ref(&urgent), &Rules::default());
    let preemption = planned.preemption.clone().expect("a preemption");
    let victims: Vec<VmId> = preemption.victims.iter().map(|s| s.vm).collect();
    assert_eq!(victims, [vm(1003)], "{preemption:?}");
    let constraints = of_models(Request::exclusive(1), &["H100"]).constraints;
    let give_back =
        preemption.victims[0].give_back(&constraints, &gpgpums::NetworkConstraint::NONE);
    assert!(give_back.iter().all(|(r, _)| r.constraints == constraints), "{give_back:?}");
    world.reclaim(&planned);
    assert_eq!(tickets(&world.plan(std::slice::from_ref(&urgent), &Rules::default())), [5]);
    assert_eq!(models_of(&world, &urgent.vm), ["H100"]);
}

/// Preemption for a request that needs its GPUs in one rack takes victims only where it then
/// runs: not in a rack it cannot use, where the search passed first.
#[test]
fn preemption_for_one_rack_takes_nothing_in_a_rack_it_cannot_use() {
    let mut world = World::new(&[]);
    world.pool = Pool::new();
    for (name, rack) in [("cg0", "r0"), ("cg1", "r1")] {
        add_gpu_host(&mut world.pool, name, &[8192, 8192]);
        let vm_host = gpgpums::HostId::new(format!("vm-{rack}")).unwrap();
        world.pool.add_host(vm_host, gpgpums::HostKind::ComputeRgpu).unwrap();
        for host in [name.to_owned(), format!("vm-{rack}")] {
            let topology = [("rack".to_owned(), rack.to_owned())].into();
            world.pool.set_host_topology(&gpgpums::HostId::new(host).unwrap(), topology).unwrap();
        }
    }
    // Rack r0: one GPU preemptible, one held at a high priority; rack r1: both preemptible.
    world.run(&launch(1, "low", 0, Request::exclusive(1)), true);
    world.run(&launch(2, "high", 20, Request::exclusive(1)), false);
    world.run(&launch(3, "low", 0, Request::exclusive(1)), true);
    world.run(&launch(4, "low", 0, Request::exclusive(1)), true);
    let rack_of = |world: &World, vm: &VmId| {
        world.pool.placement(vm).unwrap().cgpus[0].host.as_str().to_owned()
    };
    assert_eq!(rack_of(&world, &vm(1001)), "cg0", "the first victim found is in rack r0");
    let one_rack = gpgpums::NetworkConstraint { same: Some("rack".into()), ..Default::default() };
    let two = Request::exclusive(2).with_locality(Locality::Remote).with_network(one_rack);
    let urgent = launch(5, "urgent", 10, two);
    let planned = world.plan(std::slice::from_ref(&urgent), &Rules::default());
    let preemption = planned.preemption.clone().expect("a preemption");
    let mut victims: Vec<VmId> = preemption.victims.iter().map(|s| s.vm).collect();
    victims.sort();
    assert_eq!(victims, [vm(1003), vm(1004)], "{preemption:?}");
    world.reclaim(&planned);
    assert_eq!(tickets(&world.plan(std::slice::from_ref(&urgent), &Rules::default())), [5]);
    assert!(world.pool.placement(&vm(1001)).is_some(), "rack r0's VM was shrunk for nothing");
}

/// A GPU partitioned while a preemptible VM held it whole: that booking keeps its partitions
/// unused, and preemption for a request one partition takes frees it.
#[test]
fn preemption_frees_a_partitioned_gpus_whole_booking_from_before() {
    let mut world = World::new(&[8192]);
    world.run(&launch(1, "low", 0, Request::exclusive(1)), true);
    let h = host("cg0");
    world.pool.add_gpu(partition_spec(&h, 1, 0, "T4", "1g.4gb", 4096)).unwrap();
    let urgent = launch(2, "high", 10, Request::shared(1, 1024));
    let planned = world.plan(std::slice::from_ref(&urgent), &Rules::default());
    let preemption = planned.preemption.clone().expect("a preemption");
    let victims: Vec<VmId> = preemption.victims.iter().map(|s| s.vm).collect();
    assert_eq!(victims, [vm(1001)], "{preemption:?}");
    world.reclaim(&planned);
    assert_eq!(tickets(&world.plan(std::slice::from_ref(&urgent), &Rules::default())), [2]);
    let placement = world.pool.placement(&vm(1002)).unwrap();
    assert_eq!(placement.cgpus[0].gpu, gpu("cg0", 1), "on the partition");
}

fn model_limit(model: &str, cgpus: u64) -> Quota {
    let limits = ModelLimits { cgpus: Some(cgpus), ..ModelLimits::default() };
    Quota { models: [(model.to_owned(), limits)].into(), ..Quota::default() }
}

/// A project at its limit on one model has its requests placed on the others (first-fit would
/// take the H100s first), a request for that model alone waits without holding anyone back, and
/// another project's request for it starts.
#[test]
fn a_limit_on_one_model_steers_requests_to_the_others_and_holds_only_that_model() {
    let mut world = mixed_world();
    world.quotas.set_limits(project("a"), Some(model_limit("H100", 1)));
    world.run(&launch(1, "a", 0, Request::exclusive(1)), false);
    assert_eq!(models_of(&world, &vm(1001)), ["H100"]);
    let queue = [
        launch(2, "a", 0, of_models(Request::exclusive(1), &["H100"])),
        launch(3, "a", 0, Request::exclusive(1)),
        launch(4, "b", 0, of_models(Request::exclusive(1), &["H100"])),
    ];
    let planned = world.plan(&queue, &Rules::default());
    // "b" first: "a" holds its whole share of H100s.
    assert_eq!(tickets(&planned), [4, 3]);
    assert_eq!(models_of(&world, &vm(1003)), ["T4"]);
    assert_eq!(head(&planned), None, "a request over its quota is never the head");
    let held: Vec<(String, u64)> =
        world.quotas.model_usage(&project("a")).map(|(m, u)| (m.to_owned(), u.cgpus)).collect();
    assert_eq!(held, [("H100".to_owned(), 1), ("T4".to_owned(), 1)]);
    // Once its H100 is released, its request for one starts.
    world.release(&vm(1001));
    assert_eq!(tickets(&world.plan(&queue[..1], &Rules::default())), [2]);
    world.pool.audit().unwrap();
}

/// Fair share per model: a project that holds much of one model's share is not behind for
/// another model's GPU.
#[test]
fn fair_share_counts_the_models_a_request_may_use() {
    let mut world = mixed_world();
    let limits = |h100, t4| {
        let limit = |n| ModelLimits { cgpus: Some(n), ..ModelLimits::default() };
        Quota {
            models: [("H100".into(), limit(h100)), ("T4".into(), limit(t4))].into(),
            ..Quota::default()
        }
    };
    world.quotas.set_limits(project("a"), Some(limits(4, 2)));
    world.quotas.set_limits(project("b"), Some(limits(4, 2)));
    // "a" holds all its T4s (share 1); "b" one H100 (share 1/4).
    for n in [1, 2] {
        world.run(&launch(n, "a", 0, of_models(Request::exclusive(1), &["T4"])), false);
    }
    world.run(&launch(3, "b", 0, of_models(Request::exclusive(1), &["H100"])), false);
    // One H100 left; "b" asked first, but for H100s "a" holds the smaller share.
    let queue = [
        launch(4, "b", 0, of_models(Request::exclusive(1), &["H100"])),
        launch(5, "a", 0, of_models(Request::exclusive(1), &["H100"])),
    ];
    let planned = world.plan(&queue, &Rules::default());
    assert_eq!(tickets(&planned), [5]);
}

/// A request that starts moves its project's next request behind projects that now hold a
/// smaller share, within the same round.
#[test]
fn a_start_moves_its_projects_next_request_behind_smaller_shares() {
    let mut world = World::new(&[8192; 4]);
    for p in ["a", "b"] {
        world.quotas.set_limits(project(p), Some(Quota { cgpus: Some(4), ..Quota::default() }));
    }
    let queue = [
        launch(1, "a", 0, Request::exclusive(1)),
        launch(2, "a", 0, Request::exclusive(1)),
        launch(3, "b", 0, Request::exclusive(1)),
    ];
    let planned = world.plan(&queue, &Rules::default());
    assert_eq!(tickets(&planned), [1, 3, 2]);
}

#[test]
fn preemption_frees_compute_shares_and_gives_them_back_with_their_share() {
    let mut pool = Pool::new();
    let id = gpgpums::HostId::new("mps0").unwrap();
    pool.add_host(id.clone(), gpgpums::HostKind::ComputeGpu).unwrap();
    let mut spec = common::gpu_spec(&id, 0, 81920);
    spec.attributes = gpgpums::GpuAttributes { managed: true, mps: true, ..Default::default() };
    pool.add_gpu(spec).unwrap();
    let mut world = World::of(pool);
    // Plenty of memory, every SM given: 50 + 30 + 20 percent, the last two best-effort.
    let share = |percent| Request::shared(1, 1024).with_compute_percent(percent);
    world.run(&launch(1, "prod", 5, share(50)), false);
    world.run(&launch(2, "be", 0, share(30)), true);
    world.run(&launch(3, "be", 0, share(20)), true);
    // 40 percent more: the 30 and the 20 must both go (memory alone would take none).
    let urgent = launch(4, "prod", 10, share(40));
    let planned = world.plan(std::slice::from_ref(&urgent), &Rules::default());
    let preemption = planned.preemption.expect("a preemption");
    let mut taken: Vec<VmId> = preemption.victims.iter().map(|s| s.vm).collect();
    taken.sort();
    assert_eq!(taken, [vm(1002), vm(1003)]);
    // Given back as they were: with their shares.
    let given: Vec<Option<u32>> = preemption
        .victims
        .iter()
        .flat_map(|s| s.give_back(&GpuConstraints::NONE, &gpgpums::NetworkConstraint::NONE))
        .map(|(request, _)| request.compute_percent)
        .collect();
    assert!(given.contains(&Some(30)) && given.contains(&Some(20)), "{given:?}");
    world.reclaim(&planned_preemption(&preemption));
    let planned = world.plan(&[urgent], &Rules::default());
    assert_eq!(tickets(&planned), [4]);
    world.pool.audit().unwrap();
}

/// A local launch whose flavor finds no host with the cores says nothing of a smaller flavor with
/// the same GPUs: the smaller one starts in the same round (backfill), not skipped as "known to
/// fail".
#[test]
fn a_big_flavor_that_finds_no_cores_does_not_hold_back_a_small_one() {
    let mut world = World::new(&[8192; 2]);
    world.pool.set_host_resources(&host("cg0"), Some(gpgpums::Resources::new(4000, 8192))).unwrap();
    let local = |cpu_milli: u64| {
        Request::shared(1, 1024)
            .with_locality(Locality::Local)
            .with_vm_resources(gpgpums::Resources::new(cpu_milli, 1024))
    };
    let queue = [launch(1, "a", 0, local(8000)), launch(2, "a", 0, local(2000))];
    let planned = world.plan(&queue, &Rules::default());
    assert_eq!(tickets(&planned), [2], "{planned:?}");
}
