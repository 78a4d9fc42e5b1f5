//! **Pool mode**: the trace replayed through GSaaS's own [`Pool`] and its policies, as the
//! service would place it: every node a GPU host, every GPU 1000 "MiB" (a thousandth of a GPU
//! each), a fractional pod one shared cGPU of its share, a whole-GPU pod `num_gpu` exclusive
//! cGPUs that may be on any hosts (GSaaS reaches them over the network, so a pod's GPUs need not
//! share a node), `gpu_spec` the models it may take. CPU and memory do not bind (the VM runs on
//! compute hosts apart, as in remote mode). Hosts register in the seed's node order, so pool
//! order breaks ties as the node order does in the other modes.

use super::trace::{TraceNode, TracePod, GPU_MILLI};
use super::{Course, Workload};
use crate::error::Error;
use crate::ids::{GpuId, HostId, VmId};
use crate::model::{GpuSpec, HostKind, RcudaEndpoint, Request};
use crate::pool::Pool;
use crate::traits::GpuConstraints;

/// The pool of `nodes`, registered in `rank` order.
pub fn pool_of(nodes: &[TraceNode], rank: &[u32]) -> Result<Pool, Error> {
    let mut order: Vec<usize> = (0..nodes.len()).collect();
    order.sort_by_key(|&n| rank[n]);
    let mut pool = Pool::new();
    for (position, &n) in order.iter().enumerate() {
        let host = HostId::new(format!("node-{position}"))
            .map_err(|e| Error::invalid("nodes", format!("node {}: {e}", nodes[n].name)))?;
        pool.add_host(host.clone(), HostKind::ComputeGpu)?;
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
    Ok(pool)
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
) -> Result<Course, Error> {
    let mut pool = pool_of(nodes, &work.rank)?;
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
        match request_of(pod) {
            None => course.placed += 1,
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
