//! Cohorts in the queue planner: requests that borrow start past their quotas on what their
//! cohort lends, marked as loans; a member within its quota takes back the youngest loans by
//! shrinking, never a borrower's cGPUs within its own quota; and, as properties over random pools
//! and queues, no borrowing limit is ever passed, nobody borrows while the cohort has lent more
//! than it has, and a reclaim takes only loans of the requester's cohort.

mod common;

use std::collections::{BTreeMap, HashMap};

use common::{add_gpu_host, add_model_host};
use gpgpums::queue::{plan, Ask, Books, Loan, Plan, Rules, Waiting};
use gpgpums::{
    CohortName, CohortTerms, ModelLimits, Pool, ProjectId, Quota, QuotaLedger, Request, TicketId,
    Usage, VmId,
};
use proptest::prelude::*;
use uuid::Uuid;

fn project(name: &str) -> ProjectId {
    ProjectId::new(name).unwrap()
}

fn launch(ticket: u64, who: &str, ncgpus: u32, borrow: bool) -> Waiting {
    Waiting {
        ticket: TicketId(ticket),
        vm: VmId::from_uuid(Uuid::from_u128(u128::from(ticket) + 1)),
        project: project(who),
        ask: Ask::Launch,
        // One cGPU fills a GPU of 8 GiB.
        request: Request::shared(ncgpus, 8192),
        policy: "first-fit".into(),
        priority: 0,
        passed: 0,
        holding_since_ms: None,
        borrow,
    }
}

/// A pool of `gpus` GPUs of 8 GiB, the ledger, and the loans, as the service keeps them.
struct World {
    pool: Pool,
    quotas: QuotaLedger,
    vms: HashMap<ProjectId, u64>,
    loans: Vec<Loan>,
    now_ms: i64,
}

impl World {
    fn new(gpus: usize) -> World {
        let mut pool = Pool::new();
        add_gpu_host(&mut pool, "cg0", &vec![8192; gpus]);
        World::of(pool)
    }

    /// As [`World::new`], with GPUs of these models.
    fn with_models(gpus: &[(&str, u64)]) -> World {
        let mut pool = Pool::new();
        add_model_host(&mut pool, "cg0", gpus);
        World::of(pool)
    }

    fn of(pool: Pool) -> World {
        World {
            pool,
            quotas: QuotaLedger::new(Quota::default()),
            vms: HashMap::new(),
            loans: Vec::new(),
            now_ms: 0,
        }
    }

    /// `quotas` by project (cGPUs), all in cohort `lab` on `terms`.
    fn cohort(&mut self, quotas: &[(&str, u64, CohortTerms)]) {
        let mut members = BTreeMap::new();
        for (who, cgpus, terms) in quotas {
            let quota = Quota { cgpus: Some(*cgpus), ..Quota::default() };
            self.quotas.set_limits(project(who), Some(quota));
            members.insert(project(who), terms.clone());
        }
        self.quotas.set_cohort(CohortName::new("lab").unwrap(), Some(members));
    }

    /// One round, recording what starts (its loans at this round's time) and releasing what it
    /// takes back at once, as the service does once routes are withdrawn.
    fn round(&mut self, queue: &[Waiting]) -> Plan {
        self.now_ms += 10;
        let planned = {
            let mut books = Books {
                pool: &mut self.pool,
                quotas: &mut self.quotas,
                vms_in_use: &mut self.vms,
                preemptible: &BTreeMap::new(),
                reclaiming: &[],
                loans: &self.loans,
                now_ms: self.now_ms,
            };
            plan(&mut books, queue, &Rules::default())
        };
        for s in &planned.started {
            for (cgpu, &borrowed) in s.cgpus.iter().zip(&s.borrowed) {
                if borrowed {
                    self.loans.push(Loan { vm: s.vm, index: cgpu.index, since_ms: self.now_ms });
                }
            }
        }
        if let Some(preemption) = &planned.preemption {
            for shrink in &preemption.victims {
                for cgpu in &shrink.cgpus {
                    let held = self.pool.holding([cgpu]);
                    self.pool.detach(&shrink.vm, cgpu.index).unwrap();
                    self.quotas.refund(&shrink.vm, &held);
                    self.loans.retain(|l| (l.vm, l.index) != (shrink.vm, cgpu.index));
                }
            }
        }
        planned
    }

    fn end(&mut self, vm: VmId) {
        self.pool.release(&vm);
        if let Some(p) = self.quotas.project_of(&vm).cloned() {
            *self.vms.get_mut(&p).unwrap() -= 1;
        }
        self.quotas.release(&vm);
        self.loans.retain(|l| l.vm != vm);
    }
}

fn terms(borrow: Option<u64>, lend: Option<u64>) -> CohortTerms {
    CohortTerms {
        borrowing_limit: ModelLimits { cgpus: borrow, ..ModelLimits::default() },
        lending_limit: ModelLimits { cgpus: lend, ..ModelLimits::default() },
        borrow_by_default: false,
        borrowing_limit_by_model: BTreeMap::new(),
    }
}

/// The victims of a plan's take-back: (VM, cGPU indexes).
fn victims(plan: &Plan) -> Vec<(VmId, Vec<u32>)> {
    let preemption = plan.preemption.as_ref().expect("a take-back");
    preemption.victims.iter().map(|s| (s.vm, s.cgpus.iter().map(|c| c.index).collect())).collect()
}

#[test]
fn a_lender_within_its_quota_takes_back_the_youngest_loans_and_nothing_else() {
    let mut world = World::new(4);
    let members = [("alpha", 1, terms(None, None)), ("beta", 3, terms(None, None))];
    world.cohort(&[members[0].clone(), members[1].clone(), ("gamma", 2, terms(None, None))]);
    // Alpha: one cGPU of its own, then two loans at two times; beta one of its own.
    let own = launch(1, "alpha", 1, false);
    let (first_loan, second_loan) = (launch(2, "alpha", 1, true), launch(3, "alpha", 1, true));
    for w in [&own, &first_loan, &second_loan] {
        let planned = world.round(std::slice::from_ref(w));
        assert_eq!(planned.started.len(), 1, "{planned:?}");
    }
    assert_eq!(world.loans.len(), 2);
    let planned = world.round(&[launch(4, "beta", 1, false)]);
    assert_eq!(planned.started[0].borrowed, [false]);
    // The pool is full. Past its quota, beta takes nothing back, even asking to borrow.
    let planned = world.round(&[launch(5, "beta", 3, true)]);
    assert!(planned.started.is_empty() && planned.preemption.is_none(), "{planned:?}");
    // Within it: the youngest loan goes, by shrinking; alpha's own cGPU and older loan stay.
    let planned = world.round(&[launch(6, "beta", 1, false)]);
    let preemption = planned.preemption.as_ref().expect("a reclaim");
    assert!(preemption.reclaims_loans);
    assert_eq!(victims(&planned), [(second_loan.vm, vec![0])]);
    let planned = world.round(&[launch(6, "beta", 1, false)]);
    assert_eq!(planned.started.len(), 1, "the reclaimed GPU serves beta: {planned:?}");
    // Alpha's own VM ends (beta takes its GPU): alpha's last loan is within its quota now, its
    // own, and stays when gamma needs a GPU within its quota.
    world.end(own.vm);
    assert_eq!(world.round(&[launch(7, "beta", 1, false)]).started.len(), 1);
    assert_eq!(world.quotas.borrowed(&project("alpha")), Usage::default());
    let planned = world.round(&[launch(8, "gamma", 1, false)]);
    assert!(planned.started.is_empty() && planned.preemption.is_none(), "{planned:?}");
}

#[test]
fn a_reclaim_that_cannot_free_enough_takes_nothing() {
    let mut world = World::new(3);
    world.cohort(&[("alpha", 1, terms(None, None)), ("beta", 3, terms(None, None))]);
    world.round(&[launch(1, "alpha", 2, true)]);
    world.round(&[launch(2, "beta", 1, false)]);
    // Beta needs 2 more; alpha holds only 1 past its quota.
    let planned = world.round(&[launch(3, "beta", 2, false)]);
    assert!(planned.preemption.is_none() && planned.started.is_empty(), "{planned:?}");
}

#[test]
fn queued_requests_borrow_only_within_the_lenders_limits() {
    let mut world = World::new(8);
    world.cohort(&[("alpha", 1, terms(Some(2), None)), ("beta", 4, terms(None, Some(1)))]);
    // Alpha may borrow 2, beta lends 1: alpha runs 2 in all.
    let planned = world.round(&[launch(1, "alpha", 3, true), launch(2, "alpha", 2, true)]);
    assert_eq!(planned.started.iter().map(|s| s.ticket.0).collect::<Vec<_>>(), [2]);
    assert_eq!(planned.started[0].borrowed, [false, true]);
    // Not asking: nothing past the quota.
    let planned = world.round(&[launch(3, "alpha", 1, false)]);
    assert!(planned.started.is_empty());
}

#[test]
fn borrowers_share_idle_capacity_by_their_quotas() {
    let mut world = World::new(12);
    let members = [("a", 1, terms(None, None)), ("b", 3, terms(None, None))];
    world.cohort(&[members[0].clone(), members[1].clone(), ("idle", 8, terms(None, None))]);
    // Both ask for far more than there is, one cGPU at a time, in turns.
    let queue: Vec<Waiting> =
        (0..40).map(|t| launch(t + 1, if t % 2 == 0 { "a" } else { "b" }, 1, true)).collect();
    let planned = world.round(&queue);
    let of = |who: &str| {
        let started = planned
            .started
            .iter()
            .filter(|s| queue[s.ticket.0 as usize - 1].project == project(who));
        started.count()
    };
    // Every GPU taken, three for b to one for a: the same share of each quota (300%).
    assert_eq!((of("a"), of("b")), (3, 9), "{planned:?}");
    let lab = CohortName::new("lab").unwrap();
    assert_eq!(world.quotas.balance(&lab).borrowed.cgpus, 8);
}

#[test]
fn a_borrowing_limit_by_model_keeps_queued_loans_off_that_model() {
    let gpus = [("H200", 8192), ("H200", 8192), ("L4", 8192), ("L4", 8192), ("L4", 8192)];
    let mut world = World::with_models(&gpus);
    let mut alpha = terms(None, None);
    let none = ModelLimits { cgpus: Some(0), ..ModelLimits::default() };
    alpha.borrowing_limit_by_model.insert("H200".to_owned(), none);
    world.cohort(&[("alpha", 1, alpha), ("beta", 4, terms(None, None))]);
    // First-fit would take the H200s first; alpha's own cGPU may be one, its loans may not.
    let planned = world.round(&[launch(1, "alpha", 3, true)]);
    let started = planned.started.first().expect("started");
    assert_eq!(started.borrowed, [false, true, true]);
    let models: Vec<String> =
        started.cgpus.iter().map(|c| world.pool.model_of(&c.gpu).unwrap().to_owned()).collect();
    assert_eq!(models, ["L4", "L4", "L4"], "{planned:?}");
    // Only H200s are left: alpha borrows no more, beta still gets its own.
    let planned = world.round(&[launch(2, "alpha", 1, true)]);
    assert!(planned.started.is_empty(), "{planned:?}");
    assert_eq!(world.round(&[launch(3, "beta", 2, false)]).started.len(), 1);
}

#[test]
fn what_is_taken_back_for_a_member_goes_to_it_not_to_a_request_ahead_of_it() {
    let mut world = World::new(3);
    world.cohort(&[("alpha", 1, terms(None, None)), ("carol", 2, terms(None, None))]);
    world.quotas.set_limits(project("gamma"), Some(Quota { cgpus: Some(1), ..Quota::default() }));
    // Alpha holds every GPU, two on loan; gamma (outside the cohort) queues first, carol after.
    assert_eq!(world.round(&[launch(1, "alpha", 3, true)]).started.len(), 1);
    let mut queue = vec![launch(2, "gamma", 1, false), launch(3, "carol", 1, false)];
    let planned = world.round(&queue);
    let preemption = planned.preemption.as_ref().expect("carol takes back a loan");
    assert_eq!((preemption.ticket, preemption.reclaims_loans), (TicketId(3), true));
    planned.record_passes(&mut queue);
    // Released: the GPU is carol's, gamma still waits, and nothing more is taken back.
    let planned = world.round(&queue);
    let started: Vec<u64> = planned.started.iter().map(|s| s.ticket.0).collect();
    assert_eq!(started, [3], "{planned:?}");
    assert!(planned.preemption.is_none(), "{planned:?}");
    planned.record_passes(&mut queue);
    queue.retain(|w| w.ticket != TicketId(3));
    let planned = world.round(&queue);
    assert!(planned.started.is_empty() && planned.preemption.is_none(), "{planned:?}");
    assert_eq!(world.quotas.borrowed(&project("alpha")).cgpus, 1);
}

#[test]
fn requests_within_their_quotas_go_before_those_that_would_borrow_whatever_their_priority() {
    let mut world = World::new(4);
    world.cohort(&[("alpha", 1, terms(None, None)), ("beta", 2, terms(None, None))]);
    assert_eq!(world.round(&[launch(1, "alpha", 2, true)]).started.len(), 1);
    // Two GPUs free: alpha's borrower (priority 5, queued first) and beta's two within its quota
    // (priority 0). Beta's start first; alpha's waits on the cohort, not on its priority.
    let borrower = Waiting { priority: 5, ..launch(2, "alpha", 1, true) };
    let queue = [borrower, launch(3, "beta", 1, false), launch(4, "beta", 1, false)];
    let planned = world.round(&queue);
    let started: Vec<u64> = planned.started.iter().map(|s| s.ticket.0).collect();
    assert_eq!(started, [3, 4], "{planned:?}");
}

#[test]
fn a_borrowers_barrier_never_holds_back_a_request_within_its_quota() {
    let mut world = World::new(4);
    world.cohort(&[("alpha", 1, terms(None, None)), ("beta", 4, terms(None, None))]);
    assert_eq!(world.round(&[launch(1, "alpha", 2, true)]).started.len(), 1);
    // Alpha's request for 2 more does not fit once beta's starts: the head, passed often enough
    // to be a barrier for its priority and lower. Beta's, of a lower priority, starts anyway.
    let rules = Rules::default();
    let barrier = Waiting {
        priority: 1,
        passed: rules.max_passes,
        holding_since_ms: Some(world.now_ms),
        ..launch(2, "alpha", 2, true)
    };
    let planned = world.round(&[barrier, launch(3, "beta", 1, false)]);
    let started: Vec<u64> = planned.started.iter().map(|s| s.ticket.0).collect();
    assert_eq!(started, [3], "{planned:?}");
    let head = planned.head.expect("alpha's request is the head");
    assert_eq!((head.ticket, head.borrowing), (TicketId(2), true));
    // Beta's next, within its quota, takes back alpha's loan and holds back what would borrow,
    // whatever its priority.
    let borrower = Waiting { priority: 9, ..launch(4, "alpha", 1, true) };
    let planned = world.round(&[borrower, launch(5, "beta", 2, false)]);
    assert!(planned.started.is_empty(), "{planned:?}");
    assert!(planned.preemption.as_ref().is_some_and(|p| p.reclaims_loans), "{planned:?}");
    let head = planned.head.expect("beta's request is the head");
    assert_eq!((head.ticket, head.borrowing), (TicketId(5), false));
}

#[test]
fn a_request_that_would_borrow_preempts_nobody() {
    let mut world = World::new(2);
    world.cohort(&[("alpha", 1, terms(None, None)), ("beta", 2, terms(None, None))]);
    world.quotas.set_limits(project("gamma"), Some(Quota { cgpus: Some(1), ..Quota::default() }));
    // Alpha holds a GPU within its quota, beta's best-effort VM the other, within its own.
    assert_eq!(world.round(&[launch(1, "alpha", 1, false)]).started.len(), 1);
    let best_effort = launch(2, "beta", 1, false);
    assert_eq!(world.round(std::slice::from_ref(&best_effort)).started.len(), 1);
    let preemptible = BTreeMap::from([(best_effort.vm, 0)]);
    let mut plan_with = |queue: &[Waiting]| {
        let mut books = Books {
            pool: &mut world.pool,
            quotas: &mut world.quotas,
            vms_in_use: &mut world.vms,
            preemptible: &preemptible,
            reclaiming: &[],
            loans: &world.loans,
            now_ms: world.now_ms,
        };
        plan(&mut books, queue, &Rules::default())
    };
    // Alpha would borrow: it does not shrink beta's VM, of a lower priority though it is.
    let planned = plan_with(&[Waiting { priority: 1, ..launch(3, "alpha", 1, true) }]);
    assert!(planned.started.is_empty() && planned.preemption.is_none(), "{planned:?}");
    // Gamma, within its quota, of the same priority, does.
    let planned = plan_with(&[Waiting { priority: 1, ..launch(4, "gamma", 1, false) }]);
    let preemption = planned.preemption.as_ref().expect("gamma preempts");
    assert!(!preemption.reclaims_loans);
    assert_eq!(victims(&planned), [(best_effort.vm, vec![0])]);
}

#[test]
fn an_exclusive_request_counts_as_borrowing_unless_its_quota_holds_it_on_the_largest_gpus() {
    use gpgpums::queue::would_borrow;
    // GPUs of 8 and 16 GiB; alpha's quota 20 GiB of GPU memory, 8 GiB used.
    let mut world = World::with_models(&[("T4", 8192), ("H100", 16384)]);
    world.cohort(&[("alpha", 1000, terms(None, None)), ("beta", 1000, terms(None, None))]);
    let quota = Quota { memory_mib: Some(20_480), ..Quota::default() };
    world.quotas.set_limits(project("alpha"), Some(quota));
    assert_eq!(world.round(&[launch(1, "alpha", 1, false)]).started.len(), 1);
    let (quotas, pool) = (&world.quotas, &mut world.pool);
    let alpha = project("alpha");
    // One whole GPU: 16 GiB at most, within what is left (12 GiB)? No: it might borrow.
    let exclusive = Request::exclusive(1);
    assert!(would_borrow(quotas, pool, &alpha, &exclusive, false, 1, true));
    // A shared cGPU of 8 GiB is within it; nothing borrows without asking, nor outside a cohort.
    assert!(!would_borrow(quotas, pool, &alpha, &Request::shared(1, 8192), false, 1, true));
    assert!(!would_borrow(quotas, pool, &alpha, &exclusive, false, 1, false));
    assert!(!would_borrow(quotas, pool, &project("gamma"), &exclusive, false, 0, true));
}

/// One step of a random history.
#[derive(Debug, Clone)]
enum Step {
    /// A request of project `who` for `ncgpus`, borrowing or not.
    Ask { who: usize, ncgpus: u32, borrow: bool },
    /// The `n`th running VM (modulo how many run) ends.
    End { n: usize },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => (0..3usize, 1..4u32, any::<bool>())
            .prop_map(|(who, ncgpus, borrow)| Step::Ask { who, ncgpus, borrow }),
        1 => (0..64usize).prop_map(|n| Step::End { n }),
    ]
}

fn limit() -> impl Strategy<Value = Option<u64>> {
    prop_oneof![Just(None), (0..4u64).prop_map(Some)]
}

const PROJECTS: [&str; 3] = ["p0", "p1", "p2"];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn loans_keep_every_limit_and_reclaims_take_only_loans(
        gpus in 2..10usize,
        quotas in proptest::collection::vec(0..5u64, 3),
        limits in proptest::collection::vec((limit(), limit()), 3),
        steps in proptest::collection::vec(step(), 1..40),
    ) {
        let mut world = World::new(gpus);
        let members: Vec<(&str, u64, CohortTerms)> = PROJECTS
            .iter()
            .zip(&quotas)
            .zip(&limits)
            .map(|((who, q), (b, l))| (*who, *q, terms(*b, *l)))
            .collect();
        world.cohort(&members);
        let lab = CohortName::new("lab").unwrap();
        let mut running: Vec<VmId> = Vec::new();
        let mut ticket = 0;
        for step in steps {
            match step {
                Step::Ask { who, ncgpus, borrow } => {
                    ticket += 1;
                    let w = launch(ticket, PROJECTS[who], ncgpus, borrow);
                    let over_before: Vec<Usage> =
                        PROJECTS.iter().map(|p| world.quotas.borrowed(&project(p))).collect();
                    let used_before = world.quotas.usage(&project(PROJECTS[who])).cgpus;
                    let loans_before = world.loans.clone();
                    let planned = world.round(std::slice::from_ref(&w));
                    for s in &planned.started {
                        running.push(s.vm);
                        if s.borrowed.contains(&true) {
                            prop_assert!(borrow, "a loan nobody asked for");
                            // What the members borrow never passes what the others lend.
                            let after = world.quotas.balance(&lab);
                            prop_assert!(after.borrowed.cgpus <= after.lendable.cgpus, "{after:?}");
                        }
                    }
                    // No borrowing limit is passed.
                    for (i, p) in PROJECTS.iter().enumerate() {
                        let over = world.quotas.borrowed(&project(p)).cgpus;
                        if let Some(most) = limits[i].0 {
                            prop_assert!(over <= most, "{p}: {over} past its quota, limit {most}");
                        }
                    }
                    if let Some(preemption) = &planned.preemption {
                        prop_assert!(preemption.reclaims_loans, "no preemptible VM, yet a preemption");
                        // The requester asked within its own quota.
                        prop_assert!(used_before + u64::from(ncgpus) <= quotas[who]);
                        // Only loans of others, never more of one than it held past its quota.
                        let mut taken: HashMap<ProjectId, u64> = HashMap::new();
                        for shrink in &preemption.victims {
                            let owner = world.quotas.project_of(&shrink.vm).cloned();
                            let owner = owner.expect("a victim is charged to a project");
                            prop_assert_ne!(&owner, &project(PROJECTS[who]), "took its own");
                            for cgpu in &shrink.cgpus {
                                let loan = (shrink.vm, cgpu.index);
                                prop_assert!(
                                    loans_before.iter().any(|l| (l.vm, l.index) == loan),
                                    "took a cGPU that is no loan"
                                );
                                *taken.entry(owner.clone()).or_default() += 1;
                            }
                        }
                        for (p, n) in taken {
                            let i = PROJECTS.iter().position(|q| project(q) == p).unwrap();
                            prop_assert!(n <= over_before[i].cgpus, "took {n} of {p}");
                        }
                    }
                }
                Step::End { n } => {
                    if !running.is_empty() {
                        let vm = running.remove(n % running.len());
                        world.end(vm);
                    }
                }
            }
            world.pool.audit().unwrap();
            world.quotas.audit_cohorts().map_err(TestCaseError::fail)?;
        }
    }
}
