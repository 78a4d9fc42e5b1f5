//! `frag-strand`: FGD that also counts the GPU a placement strands behind CPU.
//!
//! Where each node's CPU binds (local mode), FGD misses a waste: a node whose CPU the pods have
//! used up keeps free GPUs that no GPU pod can use, and FGD scores a placement against one
//! typical pod at a time, so it barely sees a CPU-only pod, or a pod heavy on CPU, leave a node's
//! GPUs without the cores to feed them. On the default trace at 130%, FGD allocates 0.56 points
//! less where CPU and memory bind than where only GPUs do.
//!
//! So a node's **stranded GPU** is the free GPU its free CPU cannot feed at the workload's ratio:
//! `max(0, free GPU - free CPU / k)`, `k` the cores per thousandth of a GPU that the typical pods
//! allowed on the node's model ask (weighted by how often each comes). A placement's score is
//! FGD's (its fragmentation growth on FGD's integer sigmoid scale, on which a point is about 40
//! thousandths of a GPU near zero) less a point per 40 thousandths of a GPU it strands; ties go
//! to the node order, as FGD's. Inside the node the GPU is FGD's choice (a node's stranding does
//! not depend on which of its GPUs a share takes).
//!
//! With only GPUs binding (remote mode) nothing is stranded and this is FGD.

use super::cluster::{Cluster, Mode};
use super::fragmentation::TypicalPods;
use super::paper::{best_node, scored_cpu, PaperFgd};
use super::trace::TracePod;
use super::{Choice, Decision, Placer};
use crate::seeded::SplitMix64;

/// Thousandths of a GPU stranded that cost one point of FGD's score.
const MILLI_PER_POINT: f64 = 40.0;

/// FGD with stranded GPU counted (see the module's doc).
#[derive(Debug)]
pub struct FragStrand {
    fgd: PaperFgd,
    typical: TypicalPods,
    /// Cores (thousandths) per thousandth of a GPU that the typical pods ask, by model index.
    cores_per_milli: Vec<f64>,
}

impl FragStrand {
    pub fn new(typical: TypicalPods) -> Self {
        FragStrand { fgd: PaperFgd::new(typical.clone()), typical, cores_per_milli: Vec::new() }
    }

    /// The typical pods' cores per thousandth of a GPU on `model` (0 when none may use it).
    fn ratio(typical: &TypicalPods, model: &str) -> f64 {
        let (mut cpu, mut gpu) = (0.0, 0.0);
        for pod in typical.0.iter().filter(|p| p.gpu_milli > 0) {
            if !pod.models.is_empty() && !pod.models.iter().any(|m| m == model) {
                continue;
            }
            cpu += pod.weight * pod.cpu_milli as f64;
            gpu += pod.weight * f64::from(pod.gpu_milli) * f64::from(pod.num_gpu);
        }
        if gpu > 0.0 {
            cpu / gpu
        } else {
            0.0
        }
    }

    /// Free GPU (thousandths) that `cpu_left` cannot feed at `ratio`.
    fn stranded(gpu_left: f64, cpu_left: f64, ratio: f64) -> f64 {
        if ratio <= 0.0 {
            return 0.0;
        }
        (gpu_left - cpu_left / ratio).max(0.0)
    }

    /// Points of score `pod` loses on `node` for the GPU it strands there.
    fn penalty(&mut self, cluster: &Cluster, node: usize, pod: &TracePod) -> i64 {
        if cluster.mode == Mode::Remote {
            return 0;
        }
        if self.cores_per_milli.len() != cluster.models.len() {
            self.cores_per_milli =
                cluster.models.iter().map(|m| Self::ratio(&self.typical, m)).collect();
        }
        let n = &cluster.nodes[node];
        let ratio = self.cores_per_milli[n.model as usize];
        let gpu_before = n.gpu_left_total() as f64;
        let gpu_after = gpu_before - pod.gpu_request() as f64;
        let cpu_before = n.cpu_left as f64;
        let cpu_after = cpu_before - scored_cpu(pod) as f64;
        let growth = Self::stranded(gpu_after, cpu_after, ratio)
            - Self::stranded(gpu_before, cpu_before, ratio);
        (growth / MILLI_PER_POINT).ceil() as i64
    }
}

impl Placer for FragStrand {
    fn name(&self) -> String {
        "frag-strand".into()
    }

    fn choose(&mut self, decision: &Decision<'_>, _rng: &mut SplitMix64) -> Option<Choice> {
        let Decision { cluster, pod, feasible, rank } = *decision;
        let (node, gpu) = best_node(feasible, rank, |n| {
            let (score, gpu) = self.fgd.score(cluster, n, pod);
            (score - self.penalty(cluster, n, pod), gpu.map(|g| vec![g]))
        })?;
        let gpus = self.fgd.gpus_on(cluster, node, pod, gpu);
        Some(Choice { node, gpus })
    }
}
