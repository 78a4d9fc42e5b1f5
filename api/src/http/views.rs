//! The stored records as the REST API shows them, and requests as the application layer takes
//! them: conversions between `gsaasd`'s records and the API's types (`gsaas-api-types`, which
//! the CLI shares), apart so either side can change shape.
//!
//! Tenants never see where their GPUs are: the GPU, host and rCUDA fields are filled for admins only.

use std::collections::{BTreeMap, HashSet};

use gpgpums::Request;
pub use gsaas_api_types::*;

use crate::app::elastic::AttachInput;
use crate::app::queue::QueueEntry;
use crate::app::vms::{gpu_env, VmDetails};
use crate::cloud::VmRequest;
use crate::db::{HostAlert, QueueRow, Queued, VmEvent};
use crate::model::{host_state_str, mode_str, HostRecord, LaunchSpec};

/// The launch as stored, the policy asked for, and whether it may wait in the queue.
pub fn launch_spec(request: LaunchRequest) -> (LaunchSpec, Option<String>, bool) {
    let gpus = Request {
        ncgpus: request.ncgpus,
        gpu_memory_mib: request.gpu_memory_mib,
        mode: request.mode.into(),
        locality: request.locality.into(),
        distinct_gpus: request.distinct_gpus,
        constraints: gpgpums::GpuConstraints {
            // Absent: the service's default, set by the application before placing.
            remoting: request.remoting.map(Into::into),
            models: request.gpu_model.map(GpuModels::into_vec).unwrap_or_default(),
            required: request.traits.required,
            forbidden: request.traits.forbidden,
            preferred: request.traits.preferred,
            avoid: request.traits.avoid,
            min_compute_capability: request.min_compute_capability,
            min_cuda_version: request.min_cuda_version,
            compute_share: false,
        },
        network: request.network.into(),
        compute_percent: request.compute_percent,
        // The flavor's, set by the application for a local VM: never the tenant's word.
        vm_resources: None,
    };
    let vm = VmRequest {
        name: request.name.unwrap_or_default(),
        // Absent: the service's default, set by the application (empty until then).
        image: request.image.unwrap_or_default(),
        flavor: request.flavor.unwrap_or_default(),
        networks: request.networks,
    };
    let spec = LaunchSpec {
        vm,
        user_data: request.user_data,
        gpus,
        priority: request.priority,
        preemptible: request.preemptible,
        give_back: request.give_back,
        borrow: request.borrow,
        resolved: None,
    };
    (spec, request.policy, request.queue)
}

/// The attach as the application layer takes it.
pub fn attach_input(request: AttachRequest) -> AttachInput {
    AttachInput {
        ncgpus: request.ncgpus,
        gpu_memory_mib: request.gpu_memory_mib,
        mode: request.mode.into(),
        distinct_gpus: request.distinct_gpus,
        policy: request.policy,
        queue: request.queue,
        compute_percent: request.compute_percent,
        borrow: request.borrow,
    }
}

/// The VM as `admin` or its tenant sees it (see the module's docs).
pub fn vm_record_view(details: &VmDetails, admin: bool) -> VmView {
    let vm = &details.vm;
    let env = gpu_env(vm, &details.cgpus);
    let variables = env.variables();
    let gpus = &vm.spec.gpus;
    VmView {
        id: vm.id.to_string(),
        name: vm.name.clone(),
        project: vm.project.clone(),
        state: vm.state.as_str().into(),
        error: vm.error.clone(),
        error_code: vm.error.as_deref().and_then(error_code),
        queue_position: None,
        queued_attaches: Vec::new(),
        priority: vm.spec.priority,
        preemptible: vm.spec.preemptible,
        give_back: vm.spec.give_back,
        events: Vec::new(),
        image: vm.spec.vm.image.clone(),
        flavor: vm.spec.vm.flavor.clone(),
        server_id: vm.server_id.as_ref().map(|s| s.0.clone()),
        host: vm.host.as_ref().filter(|_| admin).map(|h| h.to_string()),
        fixed_ip: vm.fixed_ip.map(|ip| ip.to_string()),
        gpus: GpuRequestView {
            ncgpus: gpus.ncgpus,
            gpu_memory_mib: gpus.gpu_memory_mib,
            mode: gpus.mode.into(),
            locality: gpus.locality.into(),
            distinct_gpus: gpus.distinct_gpus,
            compute_percent: gpus.compute_percent,
            remoting: vm.spec.remoting().into(),
            gpu_model: gpus.constraints.models.clone(),
            traits: TraitsParam {
                required: gpus.constraints.required.clone(),
                forbidden: gpus.constraints.forbidden.clone(),
                preferred: gpus.constraints.preferred.clone(),
                avoid: gpus.constraints.avoid.clone(),
            },
            min_compute_capability: gpus.constraints.min_compute_capability,
            min_cuda_version: gpus.constraints.min_cuda_version,
            network: (&gpus.network).into(),
            policy: vm.policy.clone(),
        },
        cgpus: details
            .cgpus
            .iter()
            .map(|c| CgpuView {
                index: c.index,
                state: c.state,
                masked_endpoint: format!("{}:{}", c.masked_address, c.masked_port),
                memory_mib: c.memory_mib,
                mode: mode_str(c.mode).into(),
                compute_percent: c.compute_percent,
                borrowed: c.borrowed_ms.is_some(),
                gpu: admin.then(|| c.gpu.to_string()),
                host: admin.then(|| c.host.to_string()),
                gpu_server: admin.then(|| format!("{}:{}", c.rcuda_address, c.rcuda_port)),
                rcuda_endpoint: admin.then(|| format!("{}:{}", c.rcuda_address, c.rcuda_port)),
            })
            .collect(),
        // The layer's variables come first: an rCUDA VM's are its `rcuda_env` too.
        rcuda_env: match env.remoting {
            gpgpums::Remoting::Rcuda => {
                variables.iter().filter(|(name, _)| name.starts_with("RCUDA_")).cloned().collect()
            }
            _ => BTreeMap::new(),
        },
        gpu_env: variables.into_iter().collect(),
        timings: vm.timings.clone(),
        created_ms: vm.created_ms,
        updated_ms: vm.updated_ms,
    }
}

/// With what the VM waits for in the queue and its events.
pub fn with_queue_and_events(
    mut view: VmView,
    entries: &[QueueEntry],
    events: Vec<VmEvent>,
) -> VmView {
    view.queue_position = entries.iter().map(|e| e.position).min();
    view.queued_attaches = entries.iter().filter_map(waiting_attach).collect();
    view.events = events
        .into_iter()
        .map(|e| VmEventView { at_ms: e.at_ms, kind: e.kind, detail: e.detail })
        .collect();
    view
}

/// The queue's lengths and the requests of `rows`.
pub fn queue_view(rows: &[QueueRow], lengths: &[(i64, i64)]) -> QueueView {
    QueueView {
        lengths: lengths
            .iter()
            .rev()
            .map(|&(priority, waiting)| QueueLengthView {
                priority: priority as i32,
                waiting: waiting.max(0) as u64,
            })
            .collect(),
        requests: rows
            .iter()
            .map(|row| QueuedRequestView {
                vm: row.vm.to_string(),
                vm_name: row.vm_name.clone(),
                project: row.project.clone(),
                priority: row.priority,
                waiting: waiting_view(
                    row.position,
                    &row.queued,
                    &row.request,
                    row.enqueued_ms,
                    row.deadline_ms,
                ),
            })
            .collect(),
    }
}

fn waiting_view(
    position: u64,
    queued: &Queued,
    request: &Request,
    enqueued_ms: i64,
    deadline_ms: Option<i64>,
) -> WaitingView {
    WaitingView {
        position,
        kind: queued.kind().into(),
        ncgpus: request.ncgpus,
        gpu_memory_mib: request.gpu_memory_mib,
        mode: request.mode.into(),
        enqueued_ms,
        deadline_ms,
    }
}

/// A VM's queued attach (`None` for its launch).
fn waiting_attach(entry: &QueueEntry) -> Option<WaitingView> {
    let Queued::Attach { attach, .. } = &entry.queued else { return None };
    Some(waiting_view(
        entry.position,
        &entry.queued,
        &attach.request,
        entry.enqueued_ms,
        entry.deadline_ms,
    ))
}

/// The code a VM's error starts with, when it is one clients can act on.
fn error_code(error: &str) -> Option<String> {
    let code = crate::app::background::queue_rounds::QUEUE_TIMEOUT;
    error.strip_prefix(code).filter(|rest| rest.starts_with(':')).map(|_| code.to_owned())
}

/// The pool's totals, which everyone may see.
pub fn pool_totals(pool: &gpgpums::Pool) -> PoolView {
    let t = pool.totals();
    let totals = PoolTotals {
        gpus: t.gpus,
        memory_mib: t.memory_mib,
        allocated_mib: t.allocated_mib,
        cgpus: t.cgpus,
        idle_gpus: t.idle_gpus,
    };
    PoolView { totals, hosts: None, next: None, fragmentation: None }
}

/// The totals and a page of hosts, for admins: up to `limit` hosts after `after`; `fences`
/// are the pool's holders that are fences, not VMs. Also says whether more hosts follow.
/// `None`: `after` is not a host of the pool.
pub fn pool_page(
    pool: &gpgpums::Pool,
    after: Option<&gpgpums::HostId>,
    limit: usize,
    fences: &HashSet<gpgpums::VmId>,
) -> Option<(PoolView, bool)> {
    let mut page = pool.host_page(after, limit.saturating_add(1))?;
    let more = page.len() > limit;
    page.truncate(limit);
    let hosts = page
        .into_iter()
        .map(|(h, gpus)| PoolHostView {
            name: h.id.to_string(),
            kind: h.kind.as_str().into(),
            state: host_state_str(h.state).into(),
            vms: h.vms,
            gpus: gpus
                .into_iter()
                .map(|g| {
                    let mut vms = BTreeMap::new();
                    let mut fenced = 0;
                    for (holder, n) in pool.holders(&g.id) {
                        if fences.contains(&holder) {
                            fenced += n;
                        } else {
                            vms.insert(holder.to_string(), n);
                        }
                    }
                    GpuView {
                        id: g.id.to_string(),
                        index: g.index,
                        gpu_server: format!("{}:{}", g.rcuda.address, g.rcuda.port),
                        rcuda_endpoint: format!("{}:{}", g.rcuda.address, g.rcuda.port),
                        remoting: g.attributes.remoting.into(),
                        model: g.model,
                        memory_mib: g.memory_mib,
                        allocated_mib: g.allocated_mib,
                        exclusive: g.exclusive,
                        cgpus: g.cgpus,
                        jobs: g.jobs,
                        vms,
                        taint: g.taint,
                        health: g.health,
                        fenced,
                        compute_capability: g.attributes.compute_capability,
                        cuda_version: g.attributes.cuda_version,
                        traits: g.attributes.all_traits().into_iter().collect(),
                        uuid: g.attributes.uuid,
                        partition: g.partition.map(|p| PartitionView {
                            parent: p.parent.to_string(),
                            profile: p.profile,
                        }),
                        partitions: g.partitions,
                    }
                })
                .collect(),
        })
        .collect();
    let measured = pool.fragmentation();
    let fragmentation = FragmentationView {
        fragmented_gpus: measured.fragmented_gpus,
        free_gpus: measured.free_gpus,
        mix_cgpus: measured.mix_cgpus,
    };
    let view =
        PoolView { hosts: Some(hosts), fragmentation: Some(fragmentation), ..pool_totals(pool) };
    Some((view, more))
}

/// The host as admins list it, with its alerts.
pub fn host_view_with_alerts(h: &HostRecord, alerts: Vec<HostAlert>) -> HostView {
    let alerts = alerts
        .into_iter()
        .map(|a| HostAlertView { at_ms: a.at_ms, kind: a.kind, detail: a.detail })
        .collect();
    HostView { alerts: Some(alerts), ..host_view(h) }
}

/// [`HostView::local_vms`] of a host offering `offers` whose local VMs take `taken`.
pub fn local_vms_view(
    offers: Option<gpgpums::Resources>,
    taken: gpgpums::Resources,
) -> Option<LocalVmsView> {
    let body =
        |r: gpgpums::Resources| ResourcesBody { cpu_milli: r.cpu_milli, memory_mib: r.memory_mib };
    (offers.is_some() || taken != gpgpums::Resources::default())
        .then(|| LocalVmsView { offers: offers.map(body), taken: body(taken) })
}

/// A host as admins see it (without its alerts).
pub(crate) fn host_view(h: &HostRecord) -> HostView {
    {
        HostView {
            name: h.name.to_string(),
            kind: h.kind.as_str().into(),
            state: host_state_str(h.state).into(),
            agent_url: h.agent_url.clone(),
            last_seen_ms: h.last_seen_ms,
            routes_generation: h.routes_generation,
            applied_generation: h.applied_generation,
            forgotten: h.forgotten,
            topology: h.topology.clone(),
            rtt_us: h.rtt_us.iter().map(|(host, us)| (host.to_string(), *us)).collect(),
            alerts: None,
            // What local VMs take is the pool's: the host list fills it in.
            local_vms: None,
        }
    }
}
