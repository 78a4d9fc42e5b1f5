//! Properties of the quota ledger over random sequences of charges, refunds, releases and limit
//! changes: a charge is refused or leaves every resource it asked for within its limit; a refusal
//! changes nothing; and each project's usage is always the sum of what its VMs hold (VMs are counted
//! by the caller: here, the VMs charged and not released).

use std::collections::HashMap;

use gpgpums::{ProjectId, Quota, QuotaLedger, Resource, Usage, VmId};
use proptest::prelude::*;
use uuid::Uuid;

#[derive(Debug, Clone)]
enum Op {
    Charge { vm: u8, usage: Usage },
    Refund { vm: u8, usage: Usage },
    Release { vm: u8 },
    SetLimits { project: u8, quota: Option<Quota> },
}

fn usage() -> impl Strategy<Value = Usage> {
    (0u64..4, 0u64..5000, 0u64..2, 0u64..2).prop_map(|(cgpus, memory_mib, exclusive_gpus, vms)| {
        Usage { cgpus, memory_mib, exclusive_gpus, vms }
    })
}

fn limit(max: u64) -> impl Strategy<Value = Option<u64>> {
    prop_oneof![Just(None), (0..max).prop_map(Some)]
}

fn quota() -> impl Strategy<Value = Quota> {
    (limit(12), limit(20_000), limit(4), limit(6)).prop_map(
        |(cgpus, memory_mib, exclusive_gpus, vms)| Quota {
            cgpus,
            memory_mib,
            exclusive_gpus,
            vms,
            max_priority: None,
        },
    )
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u8..12, usage()).prop_map(|(vm, usage)| Op::Charge { vm, usage }),
        1 => (0u8..12, usage()).prop_map(|(vm, usage)| Op::Refund { vm, usage }),
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
        let mut held: HashMap<VmId, Usage> = HashMap::new();
        for op in ops {
            match op {
                Op::Charge { vm: n, usage } => {
                    let (id, project) = vm(n);
                    let vms = held.keys().filter(|v| (0..12).any(|m| vm(m) == (**v, project.clone()))).count() as u64;
                    let before = Usage { vms, ..ledger.usage(&project) };
                    let (limits, _) = ledger.limits(&project);
                    match ledger.charge(id, &project, usage, vms) {
                        Ok(()) => {
                            let after = Usage { vms: vms + usage.vms, ..ledger.usage(&project) };
                            for resource in Resource::ALL {
                                if usage.get(resource) > 0 {
                                    if let Some(limit) = limits.get(resource) {
                                        prop_assert!(after.get(resource) <= limit, "{resource}: {after:?} over {limits:?}");
                                    }
                                }
                            }
                            let entry = held.entry(id).or_default();
                            *entry = add(*entry, usage);
                        }
                        Err(e) => {
                            prop_assert_eq!(Usage { vms, ..ledger.usage(&project) }, before);
                            prop_assert_eq!(Some(e.limit), limits.get(e.resource));
                            prop_assert_eq!((e.in_use, e.requested), (before.get(e.resource), usage.get(e.resource)));
                            prop_assert!(e.in_use + e.requested > e.limit);
                        }
                    }
                }
                Op::Refund { vm: n, usage } => {
                    let (id, _) = vm(n);
                    ledger.refund(&id, usage);
                    if let Some(h) = held.get_mut(&id) {
                        *h = sub(*h, usage);
                    }
                }
                Op::Release { vm: n } => {
                    let (id, _) = vm(n);
                    prop_assert_eq!(ledger.release(&id), held.remove(&id).map(|u| Usage { vms: 0, ..u }));
                }
                Op::SetLimits { project: n, quota } => ledger.set_limits(project(n), quota),
            }
            for p in 0..3 {
                let sum = held
                    .iter()
                    .filter(|(id, _)| (0..12).any(|n| vm(n).0 == **id && n % 3 == p))
                    .fold(Usage::default(), |a, (_, u)| add(a, *u));
                prop_assert_eq!(ledger.usage(&project(p)), Usage { vms: 0, ..sum });
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
