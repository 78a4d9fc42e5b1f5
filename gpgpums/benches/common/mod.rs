//! What the benchmarks and the simulator share: a fixed random stream, and hosts of GPUs.
#![allow(dead_code)]

use std::net::{IpAddr, Ipv4Addr};

use gpgpums::{GpuId, GpuSpec, HostId, HostKind, Pool, RcudaEndpoint};

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
    let host = HostId::new(format!("cg{h}")).unwrap();
    pool.add_host(host.clone(), HostKind::ComputeGpu).unwrap();
    let address = IpAddr::V4(Ipv4Addr::new(10, (h >> 16) as u8, (h >> 8) as u8, h as u8));
    sizes
        .iter()
        .enumerate()
        .map(|(index, &memory_mib)| {
            let index = index as u32;
            let spec = GpuSpec {
                id: GpuId::on_host(&host, index),
                host: host.clone(),
                index,
                model: "bench".into(),
                memory_mib,
                rcuda: RcudaEndpoint { address, port: 8308 + index as u16, gpu_number: index },
            };
            pool.add_gpu(spec.clone()).unwrap();
            spec
        })
        .collect()
}
