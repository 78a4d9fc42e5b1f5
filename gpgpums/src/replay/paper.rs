//! The published experiment's own policies, as its simulator defines them
//! (hkust-adsl/kubernetes-scheduler-simulator, `pkg/simulator/plugin/`), to calibrate the replay
//! against the FGD paper's rows before GSaaS's policies are set beside them.
//!
//! Each scores every node a pod fits on with an integer, the highest wins, and a tie goes to the
//! node that comes first in the seed's node order (the simulator prefixes node names with a
//! random permutation and breaks ties by name). A pod that fits one node only goes there unscored.
//!
//! - **Random**: a node drawn uniformly among those that fit; a fractional pod's GPU drawn
//!   uniformly among the node's GPUs it fits on.
//! - **BestFit**: `(1 - (0.5 (cpu_left - cpu) / 128 cores + 0.5 (gpu_left - gpu) / 8 GPUs)) x 100`,
//!   truncated, after placing: the node left with the least CPU and GPU; a fractional pod takes
//!   the GPU with the least free that fits it.
//! - **FGD** (fragmentation gradient descent): the node and GPU whose placement grows the node's
//!   GPU fragmentation least, fragmentation measured against the trace's typical pods
//!   ([`super::fragmentation`]): `sigmoid((F_before - F_after) / 1000) x 100`, truncated.
//!
//! A pod asking no more than its CPU is scored as asking 100 millicores (Kubernetes' "non-zero"
//! request); whole and multi-GPU pods take the lowest-indexed free GPUs.

use super::cluster::{lowest_gpus, Cluster, Mode, Node};
use super::fragmentation::{Fragmentation, TypicalPods};
use super::trace::TracePod;
use super::{Choice, Decision, Placer};
use crate::seeded::SplitMix64;

/// The largest node the BestFit score is normalised by: 128 cores, 8 GPUs.
const MAX_SPEC_CPU: f64 = 128_000.0;
const MAX_SPEC_GPU: f64 = 8_000.0;
/// Kubernetes' stand-in request for a pod that asks no CPU.
const NONZERO_CPU: u64 = 100;

pub(super) fn scored_cpu(pod: &TracePod) -> u64 {
    if pod.cpu_milli == 0 {
        NONZERO_CPU
    } else {
        pod.cpu_milli
    }
}

/// The node with the highest score, ties to the earliest in `rank` (the seed's node order);
/// the only one when one fits. `score` answers a node's score and the GPUs it would take.
pub(super) fn best_node<S>(
    feasible: &[usize],
    rank: &[u32],
    mut score: S,
) -> Option<(usize, Option<Vec<usize>>)>
where
    S: FnMut(usize) -> (i64, Option<Vec<usize>>),
{
    if let [only] = feasible {
        return Some((*only, None));
    }
    let mut best: Option<(i64, u32, usize, Option<Vec<usize>>)> = None;
    for &node in feasible {
        let (s, gpus) = score(node);
        let better = match &best {
            None => true,
            Some((bs, br, _, _)) => s > *bs || (s == *bs && rank[node] < *br),
        };
        if better {
            best = Some((s, rank[node], node, gpus));
        }
    }
    best.map(|(_, _, node, gpus)| (node, gpus))
}

/// The paper's Random.
#[derive(Debug, Default)]
pub struct PaperRandom;

impl Placer for PaperRandom {
    fn name(&self) -> String {
        "paper-random".into()
    }

    fn choose(&mut self, decision: &Decision<'_>, rng: &mut SplitMix64) -> Option<Choice> {
        let Decision { cluster, pod, feasible, .. } = *decision;
        if feasible.is_empty() {
            return None;
        }
        let node = if feasible.len() == 1 {
            feasible[0]
        } else {
            feasible[rng.below(feasible.len() as u64) as usize]
        };
        let n = &cluster.nodes[node];
        let gpus = if pod.is_fractional() {
            // One draw per fitting GPU, in index order (reservoir sampling).
            let mut chosen = None;
            let mut seen = 0;
            for (i, &left) in n.gpu_left.iter().enumerate() {
                if left >= pod.gpu_milli {
                    seen += 1;
                    if rng.below(seen) == 0 {
                        chosen = Some(i);
                    }
                }
            }
            vec![chosen.expect("the node fits the pod")]
        } else {
            lowest_gpus(n, pod)
        };
        Some(Choice { node, gpus })
    }
}

/// The fractional pod's GPU with the least free that fits it (lowest index on a tie).
fn tightest_gpu(node: &Node, milli: u32) -> usize {
    node.gpu_left
        .iter()
        .enumerate()
        .filter(|(_, &left)| left >= milli)
        .min_by_key(|(i, &left)| (left, *i))
        .map(|(i, _)| i)
        .expect("the node fits the pod")
}

/// The paper's BestFit.
#[derive(Debug, Default)]
pub struct PaperBestFit;

impl PaperBestFit {
    fn score(cluster: &Cluster, node: usize, pod: &TracePod) -> i64 {
        let n = &cluster.nodes[node];
        let mut score = 0.0;
        if cluster.mode == Mode::Local {
            score += (n.cpu_left as f64 - scored_cpu(pod) as f64) / MAX_SPEC_CPU * 0.5;
        }
        score += (n.gpu_left_total() as f64 - pod.gpu_request() as f64) / MAX_SPEC_GPU * 0.5;
        ((1.0 - score) * 100.0) as i64
    }
}

impl Placer for PaperBestFit {
    fn name(&self) -> String {
        "paper-best-fit".into()
    }

    fn choose(&mut self, decision: &Decision<'_>, _rng: &mut SplitMix64) -> Option<Choice> {
        let Decision { cluster, pod, feasible, rank } = *decision;
        let (node, _) = best_node(feasible, rank, |n| (Self::score(cluster, n, pod), None))?;
        let n = &cluster.nodes[node];
        let gpus = if pod.is_fractional() {
            vec![tightest_gpu(n, pod.gpu_milli)]
        } else {
            lowest_gpus(n, pod)
        };
        Some(Choice { node, gpus })
    }
}

/// The paper's FGD, with its fragmentation measure over the trace's typical pods.
#[derive(Debug)]
pub struct PaperFgd {
    fragmentation: Fragmentation,
}

impl PaperFgd {
    pub fn new(typical: TypicalPods) -> Self {
        PaperFgd { fragmentation: Fragmentation::new(typical) }
    }

    fn cpu_left(cluster: &Cluster, node: &Node) -> i64 {
        match cluster.mode {
            Mode::Local => node.cpu_left as i64,
            // Only GPUs bind: every typical pod's CPU fits.
            Mode::Remote => i64::MAX / 2,
        }
    }

    /// The node's score for `pod`, and for a fractional pod the GPU it takes.
    pub(super) fn score(
        &mut self,
        cluster: &Cluster,
        node: usize,
        pod: &TracePod,
    ) -> (i64, Option<usize>) {
        let n = &cluster.nodes[node];
        let model = cluster.model_of(node);
        let cpu = Self::cpu_left(cluster, n);
        let cpu_after = match cluster.mode {
            Mode::Local => cpu - scored_cpu(pod) as i64,
            Mode::Remote => cpu,
        };
        let before = self.fragmentation.of(cpu, &n.gpu_left, n.model, model);
        let gain = |after: f64| {
            let x = (before - after) / 1000.0;
            (1.0 / (1.0 + (-x).exp()) * 100.0) as i64
        };
        if pod.is_fractional() {
            let mut best: Option<(i64, usize)> = None;
            let mut after_gpus = n.gpu_left.clone();
            for (i, &left) in n.gpu_left.iter().enumerate() {
                if left < pod.gpu_milli {
                    continue;
                }
                after_gpus[i] = left - pod.gpu_milli;
                let s = gain(self.fragmentation.of(cpu_after, &after_gpus, n.model, model));
                after_gpus[i] = left;
                if best.is_none_or(|(bs, _)| s > bs) {
                    best = Some((s, i));
                }
            }
            let (s, gpu) = best.expect("the node fits the pod");
            (s, Some(gpu))
        } else {
            // The score takes the GPUs with the least free that fit, the placement the
            // lowest-indexed (as the simulator does).
            let mut after_gpus = n.gpu_left.clone();
            if pod.gpu_milli > 0 {
                let mut order: Vec<usize> = (0..after_gpus.len()).collect();
                order.sort_by_key(|&i| after_gpus[i]);
                let mut need = pod.num_gpu;
                for i in order {
                    if need == 0 {
                        break;
                    }
                    if after_gpus[i] >= pod.gpu_milli {
                        after_gpus[i] -= pod.gpu_milli;
                        need -= 1;
                    }
                }
            }
            (gain(self.fragmentation.of(cpu_after, &after_gpus, n.model, model)), None)
        }
    }
}

impl PaperFgd {
    /// The GPUs `pod` takes on `node`: FGD's choice for a share (`scored` when the node was
    /// scored; a node alone in fitting was not), the lowest-indexed free ones otherwise.
    pub(super) fn gpus_on(
        &mut self,
        cluster: &Cluster,
        node: usize,
        pod: &TracePod,
        scored: Option<Vec<usize>>,
    ) -> Vec<usize> {
        if !pod.is_fractional() {
            return lowest_gpus(&cluster.nodes[node], pod);
        }
        scored.unwrap_or_else(|| vec![self.score(cluster, node, pod).1.expect("fractional")])
    }
}

impl Placer for PaperFgd {
    fn name(&self) -> String {
        "paper-fgd".into()
    }

    fn choose(&mut self, decision: &Decision<'_>, _rng: &mut SplitMix64) -> Option<Choice> {
        let Decision { cluster, pod, feasible, rank } = *decision;
        let (node, gpu) = best_node(feasible, rank, |n| {
            let (s, gpu) = self.score(cluster, n, pod);
            (s, gpu.map(|g| vec![g]))
        })?;
        let gpus = self.gpus_on(cluster, node, pod, gpu);
        Some(Choice { node, gpus })
    }
}
