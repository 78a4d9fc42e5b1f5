//! Pool builders shared by the integration tests.
#![allow(dead_code)]

use std::net::{IpAddr, Ipv4Addr};

use gpgpums::{GpuId, GpuSpec, HostId, HostKind, Pool, RcudaEndpoint};

pub fn host(name: &str) -> HostId {
    HostId::new(name).unwrap()
}

/// Adds a compute-gpu host with GPUs of the given sizes (MiB), indexed from 0, one rCUDA daemon each.
pub fn add_gpu_host(pool: &mut Pool, name: &str, sizes: &[u64]) {
    let id = host(name);
    pool.add_host(id.clone(), HostKind::ComputeGpu).unwrap();
    for (index, &memory_mib) in sizes.iter().enumerate() {
        pool.add_gpu(gpu_spec(&id, index as u32, memory_mib)).unwrap();
    }
}

pub fn gpu_spec(host: &HostId, index: u32, memory_mib: u64) -> GpuSpec {
    GpuSpec {
        id: GpuId::on_host(host, index),
        host: host.clone(),
        index,
        model: "Quadro M4000".into(),
        memory_mib,
        rcuda: RcudaEndpoint {
            address: IpAddr::V4(Ipv4Addr::new(10, 78, 0, 2)),
            port: 8308 + index as u16,
            gpu_number: 0,
        },
        attributes: Default::default(),
        partition: None,
    }
}

/// A partition `profile` of `memory_mib` of the GPU `parent` on `host`, at `index`, its model
/// named after its parent's and its profile.
pub fn partition_spec(
    host: &HostId,
    index: u32,
    parent: u32,
    parent_model: &str,
    profile: &str,
    memory_mib: u64,
) -> GpuSpec {
    GpuSpec {
        model: format!("{parent_model} MIG {profile}"),
        partition: Some(gpgpums::Partition {
            parent: GpuId::on_host(host, parent),
            profile: profile.into(),
        }),
        ..gpu_spec(host, index, memory_mib)
    }
}

/// The dissertation's testbed: one compute-GPU host with 4 GPUs of 8 GiB, three compute-rGPU hosts.
pub fn paper_testbed(pool: &mut Pool) {
    add_gpu_host(pool, "compute-gpu", &[8192; 4]);
    for i in 0..3 {
        pool.add_host(host(&format!("compute{i}-rgpu")), HostKind::ComputeRgpu).unwrap();
    }
}

pub fn gpu(host_name: &str, index: u32) -> GpuId {
    GpuId::on_host(&host(host_name), index)
}

/// Adds a compute-gpu host with GPUs of the given models and sizes (MiB), indexed from 0.
pub fn add_model_host(pool: &mut Pool, name: &str, gpus: &[(&str, u64)]) {
    let id = host(name);
    pool.add_host(id.clone(), HostKind::ComputeGpu).unwrap();
    for (index, &(model, memory_mib)) in gpus.iter().enumerate() {
        let spec = GpuSpec { model: model.into(), ..gpu_spec(&id, index as u32, memory_mib) };
        pool.add_gpu(spec).unwrap();
    }
}
