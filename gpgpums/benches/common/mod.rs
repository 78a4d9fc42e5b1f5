//! What the benchmarks and the simulator share: a fixed random stream, and hosts of GPUs.
#![allow(dead_code)]

use std::net::{IpAddr, Ipv4Addr};

use gpgpums::{GpuAttributes, GpuId, GpuSpec, HostId, HostKind, Pool, RcudaEndpoint};

/// xorshift64*: a fixed, dependency-free stream, so every run builds the same state.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Registers compute-gpu host `cg<h>` with one GPU of each of `sizes` (MiB), one rCUDA daemon
/// each; returns their specs.
pub fn add_gpu_host(pool: &mut Pool, h: u32, sizes: &[u64]) -> Vec<GpuSpec> {
    let gpus: Vec<(u64, String, GpuAttributes)> =
        sizes.iter().map(|&mib| (mib, "bench".to_owned(), GpuAttributes::default())).collect();
    add_gpu_host_of(pool, h, &gpus)
}

/// [`add_gpu_host`] with each GPU's memory (MiB), model and attributes.
pub fn add_gpu_host_of(
    pool: &mut Pool,
    h: u32,
    gpus: &[(u64, String, GpuAttributes)],
) -> Vec<GpuSpec> {
    let host = HostId::new(format!("cg{h}")).unwrap();
    pool.add_host(host.clone(), HostKind::ComputeGpu).unwrap();
    let address = IpAddr::V4(Ipv4Addr::new(10, (h >> 16) as u8, (h >> 8) as u8, h as u8));
    gpus.iter()
        .enumerate()
        .map(|(index, (memory_mib, model, attributes))| {
            let index = index as u32;
            let spec = GpuSpec {
                id: GpuId::on_host(&host, index),
                host: host.clone(),
                index,
                model: model.clone(),
                memory_mib: *memory_mib,
                rcuda: RcudaEndpoint { address, port: 8308 + index as u16, gpu_number: index },
                attributes: attributes.clone(),
                partition: None,
            };
            pool.add_gpu(spec.clone()).unwrap();
            spec
        })
        .collect()
}
