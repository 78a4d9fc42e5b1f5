//! **Pool mode**: the trace replayed through GSaaS's own [`Pool`] and its policies, as the
//! service would place it: every node a GPU host, every GPU 1000 "MiB" (a thousandth of a GPU
//! each), a fractional pod one shared cGPU of its share, a whole-GPU pod `num_gpu` exclusive
//! cGPUs, `gpu_spec` the models it may take. Hosts register in the seed's node order, so pool
//! order breaks ties as the node order does in the other modes.
//!
//! Two ways, as [`PoolMode`] says: `pool` puts a pod's GPUs on any hosts (GSaaS reaches them
//! over the network) and CPU and memory do not bind (the VM runs on compute hosts apart, as in
//! remote mode); `pool-local` is the published experiment through the pool: every pod a
//! `local` VM with its CPU and memory, each node offering its own (`pool/stranding.rs`). A pod
//! that asks no GPU is no GSaaS VM: the cloud places it, here on the host where it strands the
//! least GPU ([`Pool::strand_growth_without_gpus`], then node order), which takes it out of what
//! that host offers GSaaS.

use super::trace::{TraceNode, TracePod, GPU_MILLI};
use super::{Course, Workload};
use crate::error::Error;
use crate::ids::{GpuId, HostId, VmId};
use crate::model::{GpuSpec, HostKind, Locality, RcudaEndpoint, Request, Resources};
use crate::pool::Pool;
use crate::traits::GpuConstraints;

/// How the pool replays the trace (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolMode {
    /// GPUs anywhere; CPU and memory do not bind.
    Anywhere,
    /// Each pod a `local` VM: its GPUs, CPU and memory on one node.
    Local,
}

/// The pool of `nodes`, registered in `rank` order; the host of node `n` is `hosts[n]`.
pub fn pool_of(nodes: &[TraceNode], rank: &[u32]) -> Result<(Pool, Vec<HostId>), Error> {
    let mut order: Vec<usize> = (0..nodes.len()).collect();
    order.sort_by_key(|&n| rank[n]);
    let mut pool = Pool::new();
    let mut hosts = vec![None; nodes.len()];
    for (position, &n) in order.iter().enumerate() {
        let host = HostId::new(format!("node-{position}"))
            .map_err(|e| Error::invalid("nodes", format!("node {}: {e}", nodes[n].name)))?;
        pool.add_host(host.clone(), HostKind::ComputeGpu)?;
        hosts[n] = Some(host.clone());
        for index in 0..nodes[n].gpus {
            pool.add_gpu(GpuSpec {
                id: GpuId::on_host(&host, index),
                host: host.clone(),
                index,
                model: nodes[n].model.clone(),
                memory_mib: u64::from(GPU_MILLI),
                rcuda: RcudaEndpoint {
                    address: std::net::Ipv4Addr::LOCALHOST.into(),
                    port: 8308,
                    gpu_number: index,
                },
                attributes: Default::default(),
                partition: None,
            })?;
        }
    }
    Ok((pool, hosts.into_iter().map(|h| h.expect("every node registered")).collect()))
}

/// The request a pod makes of the pool; `None` for a pod that asks no GPU.
pub fn request_of(pod: &TracePod) -> Option<Request> {
    if pod.num_gpu == 0 || pod.gpu_milli == 0 {
        return None;
    }
    let request = if pod.gpu_milli >= GPU_MILLI {
        Request::exclusive(pod.num_gpu)
    } else {
        let shared = Request::shared(pod.num_gpu, u64::from(pod.gpu_milli));
        if pod.num_gpu > 1 {
            shared.with_distinct_gpus()
        } else {
            shared
        }
    };
    let models = pod.gpu_spec.clone();
    Some(request.with_constraints(GpuConstraints { models, ..Default::default() }))
}

/// Replays `work` of `pods` on `nodes` through a [`Pool`] deciding by `policy` (a GSaaS
/// policy's name). A pod that fits nowhere is dropped; nothing is released.
pub fn replay_pool(
    nodes: &[TraceNode],
    pods: &[TracePod],
    work: &Workload,
    policy: &str,
    mode: PoolMode,
) -> Result<Course, Error> {
    let (mut pool, hosts) = pool_of(nodes, &work.rank)?;
    // What each node offers the pods placed there, in node (pool) order.
    let mut offers: Vec<(HostId, Resources)> = Vec::new();
    if mode == PoolMode::Local {
        let mut order: Vec<usize> = (0..nodes.len()).collect();
        order.sort_by_key(|&n| work.rank[n]);
        for n in order {
            let offer = Resources::new(nodes[n].cpu_milli, nodes[n].memory_mib);
            pool.set_host_resources(&hosts[n], Some(offer))?;
            offers.push((hosts[n].clone(), offer));
        }
    }
    pool.prepare(policy)?;
    let capacity_milli = nodes.iter().map(|n| u64::from(n.gpus) * u64::from(GPU_MILLI)).sum();
    let mut course = Course {
        capacity_milli,
        points: Vec::with_capacity(work.arrivals.len()),
        ..Course::default()
    };
    let (mut asked, mut used) = (0u64, 0u64);
    for (i, &p) in work.arrivals.iter().enumerate() {
        let pod = &pods[p];
        asked += pod.gpu_request();
        // A pod pinned to models the cluster lacks fits nowhere, as in the other modes.
        let known = |m: &String| pool.models().binary_search(m).is_ok();
        let request = request_of(pod).map(|r| match mode {
            PoolMode::Anywhere => r,
            PoolMode::Local => r
                .with_locality(Locality::Local)
                .with_vm_resources(Resources::new(pod.cpu_milli, pod.memory_mib)),
        });
        match request {
            None if mode == PoolMode::Anywhere => course.placed += 1,
            None => match place_without_gpus(&mut pool, &mut offers, pod)? {
                true => course.placed += 1,
                false => course.dropped += 1,
            },
            Some(_) if !pod.gpu_spec.is_empty() && !pod.gpu_spec.iter().any(known) => {
                course.dropped += 1
            }
            Some(request) => {
                let vm = VmId::from_uuid(uuid::Uuid::from_u128(i as u128 + 1));
                match pool.place(vm, &request, policy) {
                    Ok(placement) => {
                        used += placement.cgpus.iter().map(|c| c.memory_mib).sum::<u64>();
                        course.placed += 1;
                    }
                    Err(Error::InsufficientCapacity(_)) => course.dropped += 1,
                    Err(other) => return Err(other),
                }
            }
        }
        course.points.push((asked, used));
    }
    Ok(course)
}

/// Places a pod that asks no GPU where it strands the least GPU (then node order), taking it
/// out of what that host offers; `false` when no host has room.
fn place_without_gpus(
    pool: &mut Pool,
    offers: &mut [(HostId, Resources)],
    pod: &TracePod,
) -> Result<bool, Error> {
    let need = Resources::new(pod.cpu_milli, pod.memory_mib);
    let best = offers
        .iter()
        .enumerate()
        .filter_map(|(at, (host, _))| Some((pool.strand_growth_without_gpus(host, &need)?, at)))
        .min();
    let Some((_, at)) = best else { return Ok(false) };
    let (host, offer) = &mut offers[at];
    offer.cpu_milli -= need.cpu_milli;
    offer.memory_mib -= need.memory_mib;
    pool.set_host_resources(host, Some(*offer))?;
    Ok(true)
}
