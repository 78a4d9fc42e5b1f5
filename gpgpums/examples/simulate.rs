//! Replays a synthetic trace through the real planner ([`gpgpums::queue::plan`] on a
//! [`gpgpums::Pool`]) in virtual time, for every policy with and without backfill and preemption,
//! and prints a table to choose a policy by (dissertation chapter 4 compares policies the same way).
//!
//! The trace: Poisson arrivals; each VM asks 1-4 shared cGPUs whose memory is one of the
//! dissertation's Table 4.1 applications; it runs for an exponentially distributed time. A share of
//! the VMs are best effort (preemptible, priority 0), the rest priority 1. Projects have memory
//! quotas, so fair share matters. A shrunk VM keeps its end time (it runs on with fewer cGPUs) and
//! waits for its cGPUs back with its own priority.
//!
//! `cargo run --release -p gpgpums --example simulate -- [--requests N] [--load L] [--seed S]`
//!
//! With `--openb PODS.csv` it replays a trace in the openb format instead (Alibaba's, as in
//! `gpgpums/data/openb/`, on the GPU nodes of `openb_node_list_gpu_node.csv` beside it): each pod
//! arrives at its `creation_time` and runs until its `deletion_time`, through the same queue
//! (best effort for QoS `BE`, priority 1 otherwise; 8 projects in turn, each with a quarter of
//! the GPUs as quota), every policy with the queue's default rules (backfill, preemption). As
//! recorded the trace never holds more than 66 of its 6,212 GPUs at once (its pods arrive over
//! 149 days, most of them in the last 30, and half run under 10 minutes): `--squeeze K` divides
//! every gap between arrivals by K (run times and order kept), and `--cluster-share F` replays
//! on that share of the nodes (drawn by `--seed`), to load it. It
//! prints GPU utilisation, the mean and p95 wait, the share of pods never served and FGD's
//! fragmentation, and with `--plot FILE.svg` draws the GPUs allocated while the pods arrive.
//!
//! With `--cohorts F` it compares quotas as walls with a cohort (issue [5/5]) on the synthetic
//! trace (or, with `--openb`, on the openb pods, their projects drawn the same way): every project's quota is an eighth of the GPU memory (its guarantee), F of the requests
//! come from half the projects, and either each project stays within its quota, or all eight are
//! one cohort and every request borrows (the lenders' requests within their quotas take loans
//! back). It prints GPU utilisation, the wait of guaranteed requests (started within their
//! project's quota), the share of cGPU-hours on loan, reclaims per hour and the cGPU-seconds
//! VMs went without what was reclaimed, per policy.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap};
use std::fmt::Write as _;
use std::path::Path;
use std::time::Instant;

#[path = "../benches/common/mod.rs"]
mod common;
mod svg;
mod trace;

use gpgpums::queue::{plan, Ask, Books, Loan, Plan, Rules, Waiting};
use gpgpums::replay::pool::{pool_of, request_of};
use gpgpums::replay::trace::{parse_nodes, parse_pods, GPU_MILLI};
use gpgpums::seeded::SplitMix64;
use gpgpums::{
    CgpuAssignment, CohortName, CohortTerms, GpuConstraints, GpuId, NetworkConstraint, Pool,
    ProjectId, Quota, QuotaLedger, Request, TicketId, VmId,
};
use trace::{args_or_exit, Args, APPS, POLICIES};

const HOSTS: u32 = 64;
const GPUS_PER_HOST: u32 = 4;
const GPU_MIB: u64 = 8192;
const PROJECTS: u64 = 8;
const MEAN_RUN_S: f64 = 600.0;
const BEST_EFFORT_SHARE: f64 = 0.3;
const QUEUE_TIMEOUT_MS: u64 = 3_600_000;
/// Bounded slowdown's floor on run time (seconds), so that tiny jobs do not dominate.
const SLOWDOWN_TAU_S: f64 = 10.0;

/// The simulation's draws: [`SplitMix64`] and exponential gaps.
struct Rng(SplitMix64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0.below(n)
    }

    /// Uniform in (0, 1].
    fn unit(&mut self) -> f64 {
        self.0.unit()
    }

    fn exp(&mut self, mean: f64) -> f64 {
        -self.unit().ln() * mean
    }
}

struct Job {
    arrive_ms: u64,
    run_ms: u64,
    project: ProjectId,
    request: Request,
    best_effort: bool,
}

fn trace(args: &Args) -> Vec<Job> {
    let mut rng = Rng(SplitMix64::new(args.seed));
    let mean_ncgpus = 2.5;
    let mean_mib = APPS.iter().map(|(_, mib)| *mib as f64).sum::<f64>() / APPS.len() as f64;
    let capacity = f64::from(HOSTS * GPUS_PER_HOST) * GPU_MIB as f64;
    // Offered load = arrival rate x mean run time x mean memory / capacity.
    let rate_per_s = args.load * capacity / (MEAN_RUN_S * mean_ncgpus * mean_mib);
    let mut now = 0.0;
    (0..args.requests)
        .map(|_| {
            now += rng.exp(1.0 / rate_per_s);
            let ncgpus = 1 + rng.below(4) as u32;
            let (_, mib) = APPS[rng.below(APPS.len() as u64) as usize];
            let run_ms = (rng.exp(MEAN_RUN_S) * 1000.0) as u64 + 1;
            // Uniform, or (comparing cohorts) `busy` of the requests from the first half.
            let project = match args.cohorts {
                None => rng.below(PROJECTS),
                Some(busy) => skewed_project(&mut rng, busy),
            };
            Job {
                arrive_ms: (now * 1000.0) as u64,
                run_ms,
                project: ProjectId::new(format!("project-{project}")).unwrap(),
                request: Request::shared(ncgpus, mib),
                best_effort: rng.unit() < BEST_EFFORT_SHARE,
            }
        })
        .collect()
}

/// A project drawn so that `busy` of the draws are from the first half of the projects.
fn skewed_project(rng: &mut Rng, busy: f64) -> u64 {
    let half = PROJECTS / 2;
    if rng.unit() <= busy {
        rng.below(half)
    } else {
        half + rng.below(half)
    }
}

/// What a run replays: the jobs on a pool of GPUs all of `gpu_mib`.
struct Setup {
    jobs: Vec<Job>,
    gpus: u64,
    gpu_mib: u64,
    /// Free memory below which a GPU's free memory counts as stranded (the synthetic trace: its
    /// largest application); `None`: not measured.
    stranded_below_mib: Option<u64>,
    pool: Box<dyn Fn() -> Pool>,
    /// The first and last arrival, and the width of one point of the allocation over time.
    window_ms: (u64, u64),
    bucket_ms: u64,
}

fn synthetic(args: &Args) -> Setup {
    let jobs = trace(args);
    let window_ms =
        (jobs.first().map_or(0, |j| j.arrive_ms), jobs.last().map_or(0, |j| j.arrive_ms));
    Setup {
        jobs,
        window_ms,
        bucket_ms: 6 * 3_600_000,
        gpus: u64::from(HOSTS * GPUS_PER_HOST),
        gpu_mib: GPU_MIB,
        stranded_below_mib: APPS.iter().map(|(_, mib)| *mib).max(),
        pool: Box::new(|| {
            let mut pool = Pool::new();
            for h in 0..HOSTS {
                common::add_gpu_host(&mut pool, h, &[GPU_MIB; GPUS_PER_HOST as usize]);
            }
            pool
        }),
    }
}

/// The pods of an openb trace at their own times, on the GPU nodes listed beside it: a GPU is
/// 1000 "MiB" (thousandths), a pod one VM ([`request_of`]); pods that ask no GPU are left out.
fn openb(pods_path: &Path, args: &Args) -> Result<Setup, String> {
    let squeeze = args.squeeze;
    let read = |p: &Path| std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()));
    let nodes_path = pods_path.with_file_name("openb_node_list_gpu_node.csv");
    let mut nodes =
        parse_nodes(&read(&nodes_path)?).map_err(|e| format!("{}: {e}", nodes_path.display()))?;
    // A share of the nodes, drawn by the seed (Fisher-Yates, then the first of them).
    let mut rng = SplitMix64::new(args.seed);
    for i in (1..nodes.len()).rev() {
        nodes.swap(i, rng.below(i as u64 + 1) as usize);
    }
    nodes.truncate(((nodes.len() as f64 * args.cluster_share).ceil() as usize).max(1));
    let pods =
        parse_pods(&read(pods_path)?).map_err(|e| format!("{}: {e}", pods_path.display()))?;
    let mut jobs = Vec::new();
    // In turn, or (comparing cohorts) skewed as the synthetic trace is.
    let mut skew = Rng(SplitMix64::new(args.seed ^ 0x636f_686f_7274));
    for (i, pod) in pods.iter().enumerate() {
        let (Some(request), Some(created), Some(deleted)) =
            (request_of(pod), pod.creation_time, pod.deletion_time)
        else {
            continue;
        };
        jobs.push(Job {
            arrive_ms: created.saturating_mul(1000),
            run_ms: deleted.saturating_sub(created).saturating_mul(1000).max(1),
            project: ProjectId::new(format!(
                "project-{}",
                args.cohorts.map_or(i as u64 % PROJECTS, |busy| skewed_project(&mut skew, busy))
            ))
            .unwrap(),
            request,
            best_effort: pod.qos.as_deref() == Some("BE"),
        });
    }
    let gpus: u64 = nodes.iter().map(|n| u64::from(n.gpus)).sum();
    let first = jobs.iter().map(|j| j.arrive_ms).min().unwrap_or(0);
    for job in &mut jobs {
        job.arrive_ms = first + ((job.arrive_ms - first) as f64 / squeeze) as u64;
    }
    // Measured between the 5th and the 95th percentile of the arrivals: the trace's first pods
    // arrive months before the rest.
    let mut arrivals: Vec<u64> = jobs.iter().map(|j| j.arrive_ms).collect();
    arrivals.sort_unstable();
    let at = |q: f64| arrivals.get((arrivals.len() as f64 * q) as usize).copied().unwrap_or(first);
    let window_ms = (at(0.05), at(0.95));
    let rank: Vec<u32> = (0..nodes.len() as u32).collect();
    pool_of(&nodes, &rank).map_err(|e| e.to_string())?;
    let setup = Setup {
        window_ms,
        bucket_ms: ((window_ms.1 - window_ms.0) / 200).max(60_000),
        jobs,
        gpus,
        gpu_mib: u64::from(GPU_MILLI),
        stranded_below_mib: None,
        pool: Box::new(move || pool_of(&nodes, &rank).expect("built once before").0),
    };
    Ok(setup)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    /// A VM ends (sorted first at equal times: capacity frees before arrivals look).
    End(usize),
    Arrive(usize),
}

/// Time-weighted sums of what the GPUs hold.
#[derive(Default)]
struct Gauges {
    gpu_mib: u64,
    stranded_below_mib: u64,
    last_ms: u64,
    allocated_mib: u64,
    busy_gpus: u64,
    stranded_mib: u64,
    used: HashMap<GpuId, (u64, u32)>,
    mib_ms: f64,
    busy_ms: f64,
    stranded_ms: f64,
    free_ms: f64,
    /// FGD's fragmentation ([`Pool::fragmentation`]) and the free GPUs, in GPU-ms.
    fragmented_ms: f64,
    free_gpu_ms: f64,
    /// Memory allocated, in MiB-ms, per `bucket_ms` of time.
    series: Vec<f64>,
    bucket_ms: u64,
}

impl Gauges {
    /// Counts the time since the last event at what the pool held through it.
    fn advance(&mut self, now: u64, capacity_mib: u64, pool: &Pool) {
        let dt = (now - self.last_ms) as f64;
        if dt > 0.0 {
            let measured = pool.fragmentation();
            self.fragmented_ms += measured.fragmented_gpus * dt;
            self.free_gpu_ms += measured.free_gpus * dt;
        }
        let mut from = self.last_ms;
        while from < now {
            let bucket = (from / self.bucket_ms) as usize;
            let to = now.min((bucket as u64 + 1) * self.bucket_ms);
            if self.series.len() <= bucket {
                self.series.resize(bucket + 1, 0.0);
            }
            self.series[bucket] += self.allocated_mib as f64 * (to - from) as f64;
            from = to;
        }
        self.mib_ms += self.allocated_mib as f64 * dt;
        self.busy_ms += self.busy_gpus as f64 * dt;
        self.stranded_ms += self.stranded_mib as f64 * dt;
        self.free_ms += (capacity_mib - self.allocated_mib) as f64 * dt;
        self.last_ms = now;
    }

    /// Books or releases `cgpu`. Free memory too small for the largest application is stranded.
    fn change(&mut self, cgpu: &CgpuAssignment, booked: bool) {
        let (stranded, gpu_mib) = (self.stranded_below_mib, self.gpu_mib);
        let stranded_of = |used_mib: u64| {
            let free = gpu_mib - used_mib;
            if free < stranded {
                free
            } else {
                0
            }
        };
        let entry = self.used.entry(cgpu.gpu.clone()).or_default();
        self.stranded_mib -= stranded_of(entry.0);
        self.busy_gpus -= u64::from(entry.1 > 0);
        if booked {
            entry.0 += cgpu.memory_mib;
            entry.1 += 1;
            self.allocated_mib += cgpu.memory_mib;
        } else {
            entry.0 -= cgpu.memory_mib;
            entry.1 -= 1;
            self.allocated_mib -= cgpu.memory_mib;
        }
        self.stranded_mib += stranded_of(entry.0);
        self.busy_gpus += u64::from(entry.1 > 0);
    }
}

/// How projects' quotas are set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Quotas {
    /// A quarter of the GPU memory each (8 projects: twice the pool).
    Overcommitted,
    /// An eighth each, walls.
    Walls,
    /// An eighth each, all in one cohort, every request borrowing.
    Cohort,
}

/// What the cohort comparison measures beside the rest.
#[derive(Default)]
struct Loans {
    /// Launches within their project's quota when they arrived (guaranteed), and the waits of
    /// those that started.
    guaranteed: std::collections::HashSet<VmId>,
    guaranteed_waits: Vec<f64>,
    /// GPU memory held past the projects' quotas (the ledger's count), now and in MiB-ms.
    borrowed_mib: u64,
    borrowed_mib_ms: f64,
    /// Take-backs of loans (a VM shrunk), and the cGPU-ms VMs went without what was taken.
    reclaims: u64,
    lost_ms: f64,
    /// When each taken-back cGPU of a VM was taken, until it is given back or the VM ends.
    taken: HashMap<VmId, Vec<u64>>,
    list: Vec<Loan>,
    last_ms: u64,
}

impl Loans {
    /// Counts the time since the last event at what was borrowed through it, and takes what is
    /// borrowed now from `quotas`.
    fn advance(&mut self, now: u64, quotas: &QuotaLedger) {
        self.borrowed_mib_ms += self.borrowed_mib as f64 * (now - self.last_ms) as f64;
        self.last_ms = now;
        self.borrowed_mib = (0..PROJECTS)
            .map(|p| quotas.borrowed(&ProjectId::new(format!("project-{p}")).unwrap()).memory_mib)
            .sum();
    }

    /// `vm` gave back or lost `cgpus`: none of them is on loan any more.
    fn drop_cgpus(&mut self, vm: VmId, cgpus: &[u32]) {
        self.list.retain(|l| l.vm != vm || !cgpus.contains(&l.index));
    }
}

struct Outcome {
    gpu_util: f64,
    mem_util: f64,
    wait_mean_s: f64,
    wait_p50_s: f64,
    wait_p95_s: f64,
    wait_p99_s: f64,
    slowdown: f64,
    stranded: f64,
    fragmented: f64,
    refused: u64,
    preempted: u64,
    elapsed_s: f64,
    /// Memory allocated per [`Setup::bucket_ms`], as a share of the pool's.
    series: Vec<f64>,
    loans: Loans,
    /// The simulated time, in hours.
    hours: f64,
}

fn run(setup: &Setup, policy: &str, rules: Rules, mode: Quotas) -> Outcome {
    let started_at = Instant::now();
    let jobs = &setup.jobs;
    let mut pool = (setup.pool)();
    let gpus = setup.gpus;
    let capacity_mib = gpus * setup.gpu_mib;
    let share = if mode == Quotas::Overcommitted { 4 } else { PROJECTS };
    let mut quotas =
        QuotaLedger::new(Quota { memory_mib: Some(capacity_mib / share), ..Quota::default() });
    let borrow = mode == Quotas::Cohort;
    if borrow {
        let members = (0..PROJECTS)
            .map(|p| (ProjectId::new(format!("project-{p}")).unwrap(), CohortTerms::default()));
        quotas.set_cohort(CohortName::new("all").unwrap(), Some(members.collect()));
    }
    let mut loans = Loans::default();
    let mut vms_in_use: HashMap<ProjectId, u64> = HashMap::new();
    let mut preemptible: BTreeMap<VmId, i32> = BTreeMap::new();
    let mut queue: Vec<Waiting> = Vec::new();
    let mut events: BinaryHeap<Reverse<(u64, Event)>> =
        jobs.iter().enumerate().map(|(i, j)| Reverse((j.arrive_ms, Event::Arrive(i)))).collect();
    let vm_of = |i: usize| VmId::from_uuid(uuid_of(i));
    let mut gauges = Gauges {
        gpu_mib: setup.gpu_mib,
        stranded_below_mib: setup.stranded_below_mib.unwrap_or(0),
        bucket_ms: setup.bucket_ms,
        ..Gauges::default()
    };
    let mut waits: Vec<f64> = Vec::with_capacity(jobs.len());
    let mut slowdowns = 0.0;
    let (mut refused, mut preempted) = (0u64, 0u64);
    let mut next_ticket = 0u64;
    let mut running: HashMap<VmId, usize> = HashMap::new();

    while let Some(Reverse((now, event))) = events.pop() {
        gauges.advance(now, capacity_mib, &pool);
        loans.advance(now, &quotas);
        match event {
            Event::Arrive(i) => {
                let job = &jobs[i];
                let vms = vms_in_use.get(&job.project).copied().unwrap_or(0);
                // An exclusive request holds its GPUs' whole memory, known once placed: all
                // GPUs are of one size here, so it is known now.
                let mut asked = gpgpums::Usage::asked(&job.request);
                if job.request.mode == gpgpums::Mode::Exclusive {
                    asked.memory_mib = u64::from(job.request.ncgpus) * setup.gpu_mib;
                }
                let asked = gpgpums::Usage::vm_with(asked);
                if quotas.check(&job.project, asked, vms).is_ok() {
                    loans.guaranteed.insert(vm_of(i));
                }
                queue.push(Waiting {
                    ticket: TicketId(next_ticket),
                    vm: vm_of(i),
                    project: job.project.clone(),
                    ask: Ask::Launch,
                    request: job.request.clone(),
                    policy: policy.to_string(),
                    priority: if job.best_effort { 0 } else { 1 },
                    passed: 0,
                    holding_since_ms: None,
                    borrow,
                });
                next_ticket += 1;
            }
            Event::End(i) => {
                let vm = vm_of(i);
                if let Some(placement) = pool.release(&vm) {
                    for cgpu in &placement.cgpus {
                        gauges.change(cgpu, false);
                    }
                    let indexes: Vec<u32> = placement.cgpus.iter().map(|c| c.index).collect();
                    loans.drop_cgpus(vm, &indexes);
                }
                for taken in loans.taken.remove(&vm).unwrap_or_default() {
                    loans.lost_ms += (now - taken) as f64;
                }
                quotas.release(&vm);
                *vms_in_use.get_mut(&jobs[i].project).expect("counted") -= 1;
                preemptible.remove(&vm);
                running.remove(&vm);
                queue.retain(|w| w.vm != vm);
            }
        }
        // Requests that waited too long leave.
        let before = queue.len();
        queue.retain(|w| {
            let launch = w.ask == Ask::Launch;
            !launch || now - jobs[index_of(w.vm)].arrive_ms <= QUEUE_TIMEOUT_MS
        });
        refused += (before - queue.len()) as u64;

        let mut rounds = 0u32;
        loop {
            // Each round starts, refuses or preempts something; one that never settles is a bug
            // of the planner's (it once shrank VMs for a request its quota then refused).
            rounds += 1;
            assert!(
                rounds < 100_000,
                "the planner did not settle at {now} ms ({} waiting)",
                queue.len()
            );
            let planned: Plan = {
                let mut books = Books {
                    pool: &mut pool,
                    quotas: &mut quotas,
                    vms_in_use: &mut vms_in_use,
                    preemptible: &preemptible,
                    reclaiming: &[],
                    loans: &loans.list,
                    now_ms: now as i64,
                };
                plan(&mut books, &queue, &rules)
            };
            if planned.started.is_empty()
                && planned.refused.is_empty()
                && planned.preemption.is_none()
            {
                planned.record_passes(&mut queue);
                break;
            }
            for started in &planned.started {
                for (cgpu, &borrowed) in started.cgpus.iter().zip(&started.borrowed) {
                    gauges.change(cgpu, true);
                    if borrowed {
                        let loan = Loan { vm: started.vm, index: cgpu.index, since_ms: now as i64 };
                        loans.list.push(loan);
                    }
                }
                let w = queue.iter().find(|w| w.ticket == started.ticket).expect("queued");
                if w.ask != Ask::Launch {
                    // What was taken back comes back: the oldest taking ends first.
                    if let Some(taken) = loans.taken.get_mut(&w.vm) {
                        for _ in 0..started.cgpus.len().min(taken.len()) {
                            loans.lost_ms += (now - taken.remove(0)) as f64;
                        }
                    }
                }
                if w.ask == Ask::Launch {
                    let i = index_of(w.vm);
                    let job = &jobs[i];
                    let wait_ms = now - job.arrive_ms;
                    waits.push(wait_ms as f64 / 1000.0);
                    if loans.guaranteed.remove(&w.vm) {
                        loans.guaranteed_waits.push(wait_ms as f64 / 1000.0);
                    }
                    let run_s = job.run_ms as f64 / 1000.0;
                    slowdowns +=
                        ((wait_ms as f64 / 1000.0 + run_s) / run_s.max(SLOWDOWN_TAU_S)).max(1.0);
                    events.push(Reverse((now + job.run_ms, Event::End(i))));
                    running.insert(w.vm, i);
                    if job.best_effort {
                        preemptible.insert(w.vm, 0);
                    }
                }
            }
            let mut done: std::collections::HashSet<TicketId> =
                planned.started.iter().map(|s| s.ticket).collect();
            refused += planned.refused.len() as u64;
            done.extend(planned.refused.iter().map(|(t, _)| *t));
            queue.retain(|w| !done.contains(&w.ticket));
            planned.record_passes(&mut queue);
            // The simulated agents withdraw routes at once: what is taken is released now, and
            // the shrunk VM waits for it back.
            if let Some(preemption) = planned.preemption {
                let reclaims_loans = preemption.reclaims_loans;
                for shrink in preemption.victims {
                    preempted += 1;
                    for cgpu in &shrink.cgpus {
                        let held = pool.holding([cgpu]);
                        if let Some(taken) = pool.detach(&shrink.vm, cgpu.index) {
                            gauges.change(&taken, false);
                            quotas.refund(&shrink.vm, &held);
                        }
                    }
                    let indexes: Vec<u32> = shrink.cgpus.iter().map(|c| c.index).collect();
                    loans.drop_cgpus(shrink.vm, &indexes);
                    if reclaims_loans {
                        loans.reclaims += 1;
                        let taken = loans.taken.entry(shrink.vm).or_default();
                        taken.extend(std::iter::repeat_n(now, indexes.len()));
                    }
                    let project = jobs[index_of(shrink.vm)].project.clone();
                    for (request, on_host) in
                        shrink.give_back(&GpuConstraints::NONE, &NetworkConstraint::NONE)
                    {
                        queue.push(Waiting {
                            ticket: TicketId(next_ticket),
                            vm: shrink.vm,
                            project: project.clone(),
                            ask: Ask::Attach { on_host },
                            request,
                            policy: policy.to_string(),
                            priority: 0,
                            passed: 0,
                            holding_since_ms: None,
                            borrow: borrow || reclaims_loans,
                        });
                        next_ticket += 1;
                    }
                }
            }
        }
    }
    let end = gauges.last_ms.max(1) as f64;
    waits.sort_by(f64::total_cmp);
    let pct = |p: f64| {
        if waits.is_empty() {
            0.0
        } else {
            waits[((waits.len() - 1) as f64 * p).round() as usize]
        }
    };
    let bucket_mib_ms = setup.bucket_ms as f64 * capacity_mib as f64;
    Outcome {
        gpu_util: gauges.busy_ms / (end * gpus as f64),
        mem_util: gauges.mib_ms / (end * capacity_mib as f64),
        wait_mean_s: waits.iter().sum::<f64>() / waits.len().max(1) as f64,
        wait_p50_s: pct(0.50),
        wait_p95_s: pct(0.95),
        wait_p99_s: pct(0.99),
        slowdown: slowdowns / waits.len().max(1) as f64,
        stranded: gauges.stranded_ms / gauges.free_ms.max(1.0),
        fragmented: gauges.fragmented_ms / gauges.free_gpu_ms.max(1.0),
        refused,
        preempted,
        elapsed_s: started_at.elapsed().as_secs_f64(),
        series: gauges.series.iter().map(|mib_ms| mib_ms / bucket_mib_ms).collect(),
        hours: end / 3_600_000.0,
        loans,
    }
}

fn uuid_of(i: usize) -> uuid::Uuid {
    uuid::Uuid::from_u128(i as u128 + 1)
}

fn index_of(vm: VmId) -> usize {
    vm.as_uuid().as_u128() as usize - 1
}

fn main() {
    let args = args_or_exit(Args::new(100_000, 0.95, 42), true);
    if let Some(pods) = &args.openb {
        let replayed = match args.cohorts {
            Some(busy) => openb(pods, &args).map(|setup| {
                let what = format!(
                    "{} GPU pods of {}, the gaps between arrivals {}x shorter, {} GPUs ({:.0}% of \
                     the trace's nodes)",
                    setup.jobs.len(),
                    pods.display(),
                    args.squeeze,
                    setup.gpus,
                    args.cluster_share * 100.0
                );
                compare_cohorts(&setup, &args, busy, &what)
            }),
            None => replay_openb(pods, &args),
        };
        if let Err(e) = replayed {
            eprintln!("simulate: {e}");
            std::process::exit(2);
        }
        return;
    }
    if args.plot.is_some() {
        eprintln!("simulate: --plot draws an --openb replay");
        std::process::exit(2);
    }
    let setup = synthetic(&args);
    if let Some(busy) = args.cohorts {
        let what = format!(
            "{} requests, offered load {:.2}, {} GPUs of {} MiB",
            args.requests, args.load, setup.gpus, setup.gpu_mib
        );
        compare_cohorts(&setup, &args, busy, &what);
        return;
    }
    let jobs = &setup.jobs;
    println!(
        "{} requests, offered load {:.2}, {} GPUs of {} MiB on {} hosts, {}% best effort, seed {}\n",
        args.requests,
        args.load,
        HOSTS * GPUS_PER_HOST,
        GPU_MIB,
        HOSTS,
        (BEST_EFFORT_SHARE * 100.0) as u32,
        args.seed
    );
    println!(
        "| policy | backfill | preemption | GPU util | memory util | wait p50 (s) | wait p99 (s) | bounded slowdown | stranded free memory | fragmented free GPUs (FGD) | refused | preempted | requests/min |"
    );
    println!("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut total_requests = 0usize;
    let mut total_s = 0.0;
    for policy in POLICIES {
        for (backfill, preemption) in [(false, false), (true, false), (false, true), (true, true)] {
            let rules = Rules { backfill, preemption, ..Rules::default() };
            let o = run(&setup, policy, rules, Quotas::Overcommitted);
            total_requests += jobs.len();
            total_s += o.elapsed_s;
            let yes = |b: bool| if b { "yes" } else { "no" };
            println!(
                "| {policy} | {} | {} | {:.1}% | {:.1}% | {:.1} | {:.1} | {:.2} | {:.1}% | {:.1}% | {} | {} | {:.2}M |",
                yes(backfill),
                yes(preemption),
                o.gpu_util * 100.0,
                o.mem_util * 100.0,
                o.wait_p50_s,
                o.wait_p99_s,
                o.slowdown,
                o.stranded * 100.0,
                o.fragmented * 100.0,
                o.refused,
                o.preempted,
                jobs.len() as f64 / o.elapsed_s * 60.0 / 1e6,
            );
        }
    }
    println!(
        "\nreplayed {total_requests} requests in {total_s:.1} s: {:.2}M requests per minute",
        total_requests as f64 / total_s * 60.0 / 1e6
    );
}

/// Quotas as walls against one cohort, every policy with the queue's default rules.
fn compare_cohorts(setup: &Setup, args: &Args, busy: f64, what: &str) {
    let capacity = (setup.gpus * setup.gpu_mib) as f64;
    println!(
        "{what}, {:.0}% of the requests from half the projects, each project's quota an eighth of \
         the memory, seed {}; backfill and preemption on\n",
        busy * 100.0,
        args.seed
    );
    println!(
        "| policy | quotas | GPU util | memory util | guaranteed requests | their wait mean (s) | p95 (s) | memory-hours on loan | reclaims per hour | cGPU-s lost to reclaims | refused |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut hours = 0.0;
    for policy in POLICIES {
        for mode in [Quotas::Walls, Quotas::Cohort] {
            let o = run(setup, policy, Rules::default(), mode);
            hours = o.hours;
            let mut waits = o.loans.guaranteed_waits.clone();
            waits.sort_by(f64::total_cmp);
            let mean = waits.iter().sum::<f64>() / waits.len().max(1) as f64;
            let p95 = waits.get(((waits.len().max(1) - 1) as f64 * 0.95).round() as usize);
            let name = if mode == Quotas::Walls { "walls" } else { "cohort" };
            println!(
                "| {policy} | {name} | {:.1}% | {:.1}% | {} | {mean:.1} | {:.1} | {:.1}% | {:.2} | {:.0} | {} |",
                o.gpu_util * 100.0,
                o.mem_util * 100.0,
                waits.len(),
                p95.copied().unwrap_or(0.0),
                o.loans.borrowed_mib_ms / (o.mem_util * o.hours * 3.6e6 * capacity).max(1.0) * 100.0,
                o.loans.reclaims as f64 / o.hours.max(1e-9),
                o.loans.lost_ms / 1000.0,
                o.refused,
            );
        }
    }
    println!(
        "\n{hours:.1} simulated hours; a guaranteed request fitted its project's quota when it \
         arrived; memory-hours on loan: of those allocated, past the projects' quotas"
    );
}

/// The openb trace at its own times, every policy with the queue's default rules.
fn replay_openb(pods: &Path, args: &Args) -> Result<(), String> {
    let (squeeze, plot_to) = (args.squeeze, args.plot.as_deref());
    let setup = openb(pods, args)?;
    let best_effort = setup.jobs.iter().filter(|j| j.best_effort).count();
    let times = if squeeze == 1.0 {
        "at their own times".to_owned()
    } else {
        format!("the gaps between arrivals {squeeze}x shorter, run times as recorded")
    };
    println!(
        "{} GPU pods of {}, {times}, {} best effort; {} GPUs ({:.0}% of the trace's nodes, seed {}); backfill and preemption on\n",
        setup.jobs.len(),
        pods.display(),
        best_effort,
        setup.gpus,
        args.cluster_share * 100.0,
        args.seed
    );
    println!(
        "| policy | GPU allocated while pods arrive | wait mean (s) | wait p95 (s) | never served | fragmented free GPUs (FGD) | preempted | s |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    let (from, to) = (
        (setup.window_ms.0 / setup.bucket_ms) as usize,
        (setup.window_ms.1 / setup.bucket_ms) as usize,
    );
    let mut outcomes = Vec::new();
    for policy in POLICIES {
        let o = run(&setup, policy, Rules::default(), Quotas::Overcommitted);
        let arriving = o.series.get(from..=to.min(o.series.len().saturating_sub(1))).unwrap_or(&[]);
        let allocated = arriving.iter().sum::<f64>() / arriving.len().max(1) as f64;
        println!(
            "| {policy} | {:.1}% | {:.1} | {:.1} | {:.2}% | {:.1}% | {} | {:.1} |",
            allocated * 100.0,
            o.wait_mean_s,
            o.wait_p95_s,
            o.refused as f64 / setup.jobs.len().max(1) as f64 * 100.0,
            o.fragmented * 100.0,
            o.preempted,
            o.elapsed_s,
        );
        outcomes.push((policy, o));
    }
    if let Some(path) = plot_to {
        let name = pods.file_stem().map_or_else(String::new, |s| s.to_string_lossy().into_owned());
        let squeezed =
            if squeeze == 1.0 { String::new() } else { format!(", gaps {squeeze}x shorter") };
        let title = format!("{name}{squeezed}, {} GPUs", setup.gpus);
        plot(path, &title, &setup, &outcomes)?;
        eprintln!("plot: {}", path.display());
    }
    Ok(())
}

/// The GPUs allocated while the pods arrive, and as long again after, a line per policy.
fn plot(
    path: &Path,
    title: &str,
    setup: &Setup,
    outcomes: &[(&str, Outcome)],
) -> Result<(), String> {
    const W: f64 = 780.0;
    const H: f64 = 400.0;
    const LEFT: f64 = 60.0;
    const RIGHT: f64 = 170.0;
    const TOP: f64 = 30.0;
    const BOTTOM: f64 = 50.0;
    let first = (setup.window_ms.0 / setup.bucket_ms) as usize;
    let end = first + 2 * ((setup.window_ms.1 - setup.window_ms.0) / setup.bucket_ms) as usize + 1;
    let span = (end - first) as f64;
    let per_hour = 3_600_000.0 / setup.bucket_ms as f64;
    let x = |b: usize| LEFT + (b - first) as f64 / span * (W - LEFT - RIGHT);
    let y = |share: f64| H - BOTTOM - share.clamp(0.0, 1.0) * (H - BOTTOM - TOP);
    let mut svg = svg::open(W, H, LEFT, &format!("GPU allocated through the queue: {title}"));
    for tick in (0..=100).step_by(20) {
        let py = y(f64::from(tick) / 100.0);
        let _ = writeln!(
            svg,
            r##"<line x1="{LEFT}" y1="{py}" x2="{}" y2="{py}" stroke="#ddd"/><text x="{}" y="{}" text-anchor="end">{tick}%</text>"##,
            W - RIGHT,
            LEFT - 6.0,
            py + 4.0
        );
    }
    let hours = span / per_hour;
    let step = ((hours / 8.0).ceil() as usize).max(1);
    for hour in (0..=hours as usize).step_by(step) {
        let px = x(first + (hour as f64 * per_hour) as usize);
        let _ = writeln!(
            svg,
            r#"<text x="{px}" y="{}" text-anchor="middle">{hour}</text>"#,
            H - BOTTOM + 16.0
        );
    }
    let _ = writeln!(
        svg,
        r##"<line x1="{0}" y1="{TOP}" x2="{0}" y2="{1}" stroke="#999" stroke-dasharray="4 3"/>"##,
        x(first + ((setup.window_ms.1 - setup.window_ms.0) / setup.bucket_ms) as usize),
        H - BOTTOM
    );
    let _ = writeln!(
        svg,
        r#"<text x="{}" y="{}" text-anchor="middle">hours from the first arrival (dashed: the last)</text>"#,
        (LEFT + W - RIGHT) / 2.0,
        H - 12.0
    );
    for (i, (policy, o)) in outcomes.iter().enumerate() {
        let colour = svg::COLOURS[i % svg::COLOURS.len()];
        let points: Vec<String> = o
            .series
            .iter()
            .enumerate()
            .skip(first)
            .take(end - first)
            .map(|(b, &share)| format!("{:.1},{:.1}", x(b), y(share)))
            .collect();
        svg::line(&mut svg, colour, 1.2, "", &points);
        svg::legend(&mut svg, W - RIGHT + 15.0, TOP + 20.0 + i as f64 * 18.0, colour, "", policy);
    }
    svg::save(svg, path)
}
