//! Re-planning the queue when one VM ends, at cloud scale: 100k GPUs (12,500 hosts of 8 GPUs of
//! 16 GiB) filled with VMs of Table 4.1 applications, and 10,000 requests waiting. Each sample ends
//! one random VM and runs [`gpgpums::queue::plan`] over the whole queue; the time covers both. The
//! sample is then undone (what started is released, the VM put back), so every sample sees the same
//! state. Run: `cargo bench -p gpgpums --bench queue`.
//!
//! Three loads: every running VM is protected (nothing to preempt); 30% are best effort, the
//! queue's requests outrank them, and the planner searches for cGPUs to take; or a fleet of 8
//! models (a host's GPUs are all of one), where every project has limits on 2 models and 40% of
//! the requests (running and waiting) name one model or two; or cohorts: every project's quota is
//! an eighth of the pool's memory, all 8 projects lend to each other, those past their quota hold
//! their latest cGPUs on loan, and half the waiting requests borrow (the planner checks each
//! against the cohort, and a request within its quota looks for loans to take back); or the same
//! with quotas of a tenth (`CohortsLentOut`): every project is past its quota, nothing is left to
//! lend or to take back, and every request is checked against the cohort and refused.
//! `GSAAS_QUEUE_LOADS=models` (or a comma-separated list) runs only those.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use gpgpums::queue::{plan, Ask, Books, Loan, Rules, Waiting};
use gpgpums::{
    CohortName, CohortTerms, GpuAttributes, GpuConstraints, ModelLimits, Placement, Pool,
    ProjectId, Quota, QuotaLedger, Request, TicketId, Usage, VmId,
};
use uuid::Uuid;

mod common;

use common::{add_gpu_host_of, Rng};

const GPUS: u32 = 100_000;
const GPUS_PER_HOST: u32 = 8;
const GPU_MIB: u64 = 16_384;
const QUEUED: usize = 10_000;
const PROJECTS: usize = 8;
const SAMPLES: usize = 300;
const APP_MIB: [u64; 6] = [1599, 876, 151, 3319, 2104, 145];
const MODELS: [&str; 8] = ["T4", "A10", "L4", "L40S", "A30", "A100", "H100", "H200"];

/// What runs and waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Load {
    Protected,
    BestEffort,
    Models,
    Cohorts,
    CohortsLentOut,
}

/// The trace's draws.
trait Draws {
    fn request(&mut self, load: Load) -> Request;
    fn project(&mut self) -> ProjectId;
}

impl Draws for Rng {
    fn request(&mut self, load: Load) -> Request {
        let request = Request::shared(1 + self.below(4) as u32, APP_MIB[self.below(APP_MIB.len())]);
        if load != Load::Models || self.below(10) >= 4 {
            return request;
        }
        let mut models = vec![MODELS[self.below(MODELS.len())].to_owned()];
        if self.below(4) == 0 {
            models.push(MODELS[self.below(MODELS.len())].to_owned());
        }
        models.sort();
        models.dedup();
        request.with_constraints(GpuConstraints { models, ..GpuConstraints::default() })
    }

    fn project(&mut self) -> ProjectId {
        ProjectId::new(format!("project-{}", self.below(PROJECTS))).unwrap()
    }
}

struct Bed {
    pool: Pool,
    quotas: QuotaLedger,
    vms_in_use: HashMap<ProjectId, u64>,
    preemptible: BTreeMap<VmId, i32>,
    running: Vec<(Placement, ProjectId)>,
    queue: Vec<Waiting>,
    loans: Vec<Loan>,
}

fn vm(n: u64) -> VmId {
    VmId::from_uuid(Uuid::from_u128(u128::from(n) + 1))
}

fn bed(load: Load) -> Bed {
    let mut rng = Rng(0x5EED_0000 + load as u64);
    let mut pool = Pool::new();
    for h in 0..GPUS / GPUS_PER_HOST {
        let model = if load == Load::Models { MODELS[h as usize % MODELS.len()] } else { "bench" };
        let gpus =
            vec![(GPU_MIB, model.to_owned(), GpuAttributes::default()); GPUS_PER_HOST as usize];
        add_gpu_host_of(&mut pool, h, &gpus);
    }
    let capacity = u64::from(GPUS) * GPU_MIB;
    let mut quotas = QuotaLedger::new(Quota { memory_mib: Some(capacity / 4), ..Quota::default() });
    if load == Load::Models {
        // Each project may hold at most a third of each of two models' memory.
        let per_model = capacity / MODELS.len() as u64 / 3;
        let limit = ModelLimits { memory_mib: Some(per_model), ..ModelLimits::default() };
        for p in 0..PROJECTS {
            let models = [MODELS[p % MODELS.len()], MODELS[(p + 3) % MODELS.len()]];
            let quota = Quota {
                memory_mib: Some(capacity / 4),
                models: models.iter().map(|m| ((*m).to_owned(), limit)).collect(),
                ..Quota::default()
            };
            quotas.set_limits(ProjectId::new(format!("project-{p}")).unwrap(), Some(quota));
        }
    }
    let in_cohort = matches!(load, Load::Cohorts | Load::CohortsLentOut);
    if in_cohort {
        let share = if load == Load::Cohorts { PROJECTS as u64 } else { 10 };
        let guarantee = Quota { memory_mib: Some(capacity / share), ..Quota::default() };
        let mut members = BTreeMap::new();
        for p in 0..PROJECTS {
            let project = ProjectId::new(format!("project-{p}")).unwrap();
            quotas.set_limits(project.clone(), Some(guarantee.clone()));
            members.insert(project, CohortTerms::default());
        }
        quotas.set_cohort(CohortName::new("bench").unwrap(), Some(members));
    }
    let mut loans = Vec::new();
    let mut vms_in_use: HashMap<ProjectId, u64> = HashMap::new();
    let mut preemptible = BTreeMap::new();
    let mut running = Vec::new();
    let mut n = 0;
    let mut misses = 0;
    while misses < 200 {
        n += 1;
        let request = rng.request(load);
        match pool.place(vm(n), &request, "first-fit") {
            Ok(placement) => {
                misses = 0;
                let project = rng.project();
                let each: Vec<Usage> =
                    placement.cgpus.iter().map(|c| Usage::of_cgpus([c])).collect();
                for (cgpu, borrowed) in
                    placement.cgpus.iter().zip(quotas.split_borrowed(&project, &each))
                {
                    if borrowed {
                        loans.push(Loan { vm: vm(n), index: cgpu.index, since_ms: n as i64 });
                    }
                }
                quotas.restore(vm(n), &project, &pool.holding(&placement.cgpus).vm_with());
                *vms_in_use.entry(project.clone()).or_default() += 1;
                if load == Load::BestEffort && rng.below(10) < 3 {
                    preemptible.insert(vm(n), 0);
                }
                running.push((placement, project));
            }
            Err(_) => misses += 1,
        }
    }
    let queue = (0..QUEUED as u64)
        .map(|t| Waiting {
            ticket: TicketId(t),
            vm: vm(10_000_000 + t),
            project: rng.project(),
            ask: Ask::Launch,
            request: rng.request(load),
            policy: "first-fit".into(),
            priority: 1,
            passed: 0,
            holding_since_ms: None,
            borrow: in_cohort && t % 2 == 0,
        })
        .collect();
    Bed { pool, quotas, vms_in_use, preemptible, running, queue, loans }
}

/// Ends one running VM and re-plans; returns how long that took and undoes it.
fn sample(bed: &mut Bed, rng: &mut Rng, rules: &Rules) -> (Duration, usize) {
    let at = rng.below(bed.running.len());
    let (placement, project) = bed.running[at].clone();
    let started = Instant::now();
    let held = bed.pool.holding(&placement.cgpus);
    bed.pool.release(&placement.vm);
    bed.quotas.release(&placement.vm);
    *bed.vms_in_use.get_mut(&project).unwrap() -= 1;
    let planned = {
        let mut books = Books {
            pool: &mut bed.pool,
            quotas: &mut bed.quotas,
            vms_in_use: &mut bed.vms_in_use,
            preemptible: &bed.preemptible,
            reclaiming: &[],
            loans: &bed.loans,
            now_ms: 0,
        };
        plan(&mut books, &bed.queue, rules)
    };
    let took = started.elapsed();
    for s in &planned.started {
        bed.pool.release(&s.vm);
        bed.quotas.release(&s.vm);
        let w = bed.queue.iter().find(|w| w.ticket == s.ticket).unwrap();
        *bed.vms_in_use.get_mut(&w.project).unwrap() -= 1;
    }
    bed.pool.restore(placement.clone()).expect("the VM fits where it was");
    bed.quotas.restore(placement.vm, &project, &held);
    *bed.vms_in_use.get_mut(&project).unwrap() += 1;
    (took, planned.started.len() + usize::from(planned.preemption.is_some()))
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize].as_secs_f64() * 1e3
}

fn main() {
    // `cargo bench` passes `--bench`; filters are not supported.
    println!("| load | running VMs | preemptible | queued | p50 (ms) | p99 (ms) | max (ms) | decisions per sample |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    // GSAAS_QUEUE_LOADS (e.g. "models" or "protected,besteffort") runs only those loads.
    let only = std::env::var("GSAAS_QUEUE_LOADS").unwrap_or_default().to_lowercase();
    let loads =
        [Load::Protected, Load::BestEffort, Load::Models, Load::Cohorts, Load::CohortsLentOut];
    let chosen = |load: &Load| {
        only.is_empty() || only.split(',').any(|l| l == format!("{load:?}").to_lowercase())
    };
    for load in loads.into_iter().filter(chosen) {
        let mut bed = bed(load);
        let rules = Rules::default();
        let mut rng = Rng(7);
        // One round first, so that the queue holds only what does not fit (as it would).
        sample(&mut bed, &mut rng, &rules);
        let mut times = Vec::with_capacity(SAMPLES);
        let mut decisions = 0;
        for _ in 0..SAMPLES {
            let (took, decided) = sample(&mut bed, &mut rng, &rules);
            times.push(took);
            decisions += decided;
        }
        bed.pool.audit().expect("bookkeeping intact after the benchmark");
        times.sort();
        println!(
            "| {load:?} | {} | {} | {} | {:.3} | {:.3} | {:.3} | {:.1} |",
            bed.running.len(),
            bed.preemptible.len(),
            bed.queue.len(),
            percentile(&times, 0.5),
            percentile(&times, 0.99),
            times.last().unwrap().as_secs_f64() * 1e3,
            decisions as f64 / SAMPLES as f64
        );
    }
}
