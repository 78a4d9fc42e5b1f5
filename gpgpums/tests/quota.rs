//! Properties of the quota ledger over random sequences of charges, refunds, releases and limit
//! changes: a charge is refused or leaves every resource it asked for within its limit, in all
//! and on each GPU model it holds; a refusal changes nothing; and each project's usage, in all
//! and per model, is always the sum of what its VMs hold (VMs are counted by the caller: here, the
//! VMs charged and not released).

use std::collections::{BTreeMap, HashMap};

use gpgpums::{Holding, ModelLimits, ProjectId, Quota, QuotaLedger, Resource, Usage, VmId};
use proptest::prelude::*;
use uuid::Uuid;

#[derive(Debug, Clone)]
enum Op {
    Charge { vm: u8, holding: Holding },
    Refund { vm: u8, holding: Holding },
    Release { vm: u8 },
    SetLimits { project: u8, quota: Option<Quota> },
}

fn usage() -> impl Strategy<Value = Usage> {
    (0u64..4, 0u64..5000, 0u64..2, 0u64..2).prop_map(|(cgpus, memory_mib, exclusive_gpus, vms)| {
        Usage { cgpus, memory_mib, exclusive_gpus, vms }
    })
}

const MODELS: [&str; 2] = ["A100", "T4"];

/// What cGPUs on up to both models hold (a VM more, sometimes).
fn holding() -> impl Strategy<Value = Holding> {
    (prop::collection::btree_map(0usize..2, usage(), 0..3), 0u64..2).prop_map(|(models, vms)| {
        let models: Vec<(String, Usage)> = models
            .into_iter()
            .map(|(m, u)| (MODELS[m].to_owned(), Usage { vms: 0, ..u }))
            .filter(|(_, u)| *u != Usage::default())
            .collect();
        let usage = models.iter().fold(Usage { vms, ..Usage::default() }, |a, (_, u)| add(a, *u));
        Holding { usage, models }
    })
}

fn model_limits() -> impl Strategy<Value = BTreeMap<String, ModelLimits>> {
    prop::collection::btree_map(
        0usize..2,
        (limit(8), limit(12_000), limit(3)).prop_map(|(cgpus, memory_mib, exclusive_gpus)| {
            ModelLimits { cgpus, memory_mib, exclusive_gpus }
        }),
        0..3,
    )
    .prop_map(|limits| limits.into_iter().map(|(m, l)| (MODELS[m].to_owned(), l)).collect())
}

fn limit(max: u64) -> impl Strategy<Value = Option<u64>> {
    prop_oneof![Just(None), (0..max).prop_map(Some)]
}

fn quota() -> impl Strategy<Value = Quota> {
    (limit(12), limit(20_000), limit(4), limit(6), model_limits()).prop_map(
        |(cgpus, memory_mib, exclusive_gpus, vms, models)| Quota {
            cgpus,
            memory_mib,
            exclusive_gpus,
            vms,
            max_priority: None,
            models,
        },
    )
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u8..12, holding()).prop_map(|(vm, holding)| Op::Charge { vm, holding }),
        1 => (0u8..12, holding()).prop_map(|(vm, holding)| Op::Refund { vm, holding }),
        1 => (0u8..12).prop_map(|vm| Op::Release { vm }),
        1 => (0u8..3, prop::option::of(quota())).prop_map(|(project, quota)| Op::SetLimits { project, quota }),
    ]
}

fn project(n: u8) -> ProjectId {
    ProjectId::new(format!("project-{n}")).unwrap()
}

/// VM `n` belongs to project `n % 3`.
fn vm(n: u8) -> (VmId, ProjectId) {
    (VmId::from_uuid(Uuid::from_u128(u128::from(n) + 1)), project(n % 3))
}

proptest! {
    #[test]
    fn no_charge_takes_a_project_past_a_limit(default in quota(), ops in prop::collection::vec(op(), 1..120)) {
        let mut ledger = QuotaLedger::new(default);
        // What each VM holds, in all and per model.
        let mut held: HashMap<VmId, (Usage, BTreeMap<String, Usage>)> = HashMap::new();
        let models_of = |ledger: &QuotaLedger, project: &ProjectId| -> BTreeMap<String, Usage> {
            ledger.model_usage(project).map(|(m, u)| (m.to_owned(), u)).collect()
        };
        for op in ops {
            match op {
                Op::Charge { vm: n, holding } => {
                    let (id, project) = vm(n);
                    let usage = holding.usage;
                    let vms = held.keys().filter(|v| (0..12).any(|m| vm(m) == (**v, project.clone()))).count() as u64;
                    let before = Usage { vms, ..ledger.usage(&project) };
                    let models_before = models_of(&ledger, &project);
                    let (limits, _) = ledger.limits(&project);
                    match ledger.charge(id, &project, &holding, vms) {
                        Ok(()) => {
                            let after = Usage { vms: vms + usage.vms, ..ledger.usage(&project) };
                            let models_after = models_of(&ledger, &project);
                            for resource in Resource::ALL {
                                if usage.get(resource) > 0 {
                                    if let Some(limit) = limits.get(resource) {
                                        prop_assert!(after.get(resource) <= limit, "{resource}: {after:?} over {limits:?}");
                                    }
                                }
                                for (model, asked) in &holding.models {
                                    let limit = limits.models.get(model).and_then(|l| l.get(resource));
                                    if let (true, Some(limit)) = (asked.get(resource) > 0, limit) {
                                        let now = models_after[model].get(resource);
                                        prop_assert!(now <= limit, "{model} {resource}: {now} over {limit}");
                                    }
                                }
                            }
                            let entry = held.entry(id).or_default();
                            entry.0 = add(entry.0, usage);
                            for (model, u) in &holding.models {
                                let m = entry.1.entry(model.clone()).or_default();
                                *m = add(*m, *u);
                            }
                        }
                        Err(e) => {
                            prop_assert_eq!(Usage { vms, ..ledger.usage(&project) }, before);
                            prop_assert_eq!(models_of(&ledger, &project), models_before.clone());
                            let (limit, in_use, requested) = match &e.model {
                                None => (limits.get(e.resource), before.get(e.resource), usage.get(e.resource)),
                                Some(model) => {
                                    let asked = holding.models.iter().find(|(m, _)| m == model).expect("a model charged").1;
                                    let held = models_before.get(model).copied().unwrap_or_default();
                                    (limits.models[model].get(e.resource), held.get(e.resource), asked.get(e.resource))
                                }
                            };
                            prop_assert_eq!(Some(e.limit), limit);
                            prop_assert_eq!((e.in_use, e.requested), (in_use, requested));
                            prop_assert!(e.in_use + e.requested > e.limit);
                        }
                    }
                }
                Op::Refund { vm: n, holding } => {
                    let (id, _) = vm(n);
                    ledger.refund(&id, &holding);
                    if let Some((total, models)) = held.get_mut(&id) {
                        *total = sub(*total, holding.usage);
                        for (model, u) in &holding.models {
                            if let Some(m) = models.get_mut(model) {
                                *m = sub(*m, *u);
                            }
                        }
                        models.retain(|_, u| *u != Usage::default());
                    }
                }
                Op::Release { vm: n } => {
                    let (id, _) = vm(n);
                    prop_assert_eq!(ledger.release(&id), held.remove(&id).map(|u| Usage { vms: 0, ..u.0 }));
                }
                Op::SetLimits { project: n, quota } => ledger.set_limits(project(n), quota),
            }
            for p in 0..3 {
                let mine = held.iter().filter(|(id, _)| (0..12).any(|n| vm(n).0 == **id && n % 3 == p));
                let sum = mine.clone().fold(Usage::default(), |a, (_, u)| add(a, u.0));
                prop_assert_eq!(ledger.usage(&project(p)), Usage { vms: 0, ..sum });
                let mut models: BTreeMap<String, Usage> = BTreeMap::new();
                for (_, (_, by_model)) in mine {
                    for (model, u) in by_model {
                        let m = models.entry(model.clone()).or_default();
                        *m = add(*m, *u);
                    }
                }
                prop_assert_eq!(models_of(&ledger, &project(p)), models);
            }
        }
    }
}

fn add(a: Usage, b: Usage) -> Usage {
    Usage {
        cgpus: a.cgpus + b.cgpus,
        memory_mib: a.memory_mib + b.memory_mib,
        exclusive_gpus: a.exclusive_gpus + b.exclusive_gpus,
        vms: a.vms + b.vms,
    }
}

fn sub(a: Usage, b: Usage) -> Usage {
    Usage {
        cgpus: a.cgpus.saturating_sub(b.cgpus),
        memory_mib: a.memory_mib.saturating_sub(b.memory_mib),
        exclusive_gpus: a.exclusive_gpus.saturating_sub(b.exclusive_gpus),
        vms: a.vms.saturating_sub(b.vms),
    }
}
