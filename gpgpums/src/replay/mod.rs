//! Placement quality on a production trace: the replay of the FGD paper's experiment (Weng et al.,
//! "Beware of Fragmentation: Scheduling GPU-Sharing Workloads with Fragmentation Gradient
//! Descent", USENIX ATC 2023) on Alibaba's GPU-sharing trace ([`trace`]), for any policy.
//!
//! The experiment, per seed: the pods in a shuffled order, then pods drawn with replacement from
//! the trace appended until the GPU they ask reaches `inflation` (1.3) times the cluster's GPUs;
//! the nodes in a shuffled order (which breaks ties); one pod at a time, nothing released, no
//! queue: a pod that fits nowhere is dropped. The measure is the GPU allocation ratio (GPU
//! allocated over the cluster's GPUs) read when the GPU asked so far (placed or not) reaches 100%
//! and 130% of the cluster's: the mean over the pods whose arrival, in percent, rounds to it.
//!
//! Seeds drive [`SplitMix64`], not the Go generator of the published simulator, so a seed's
//! figures differ from that seed's published ones; the means over seeds are what compare.

pub mod cluster;
pub mod fragmentation;
pub mod paper;
pub mod pool;
pub mod strand;
pub mod trace;

use crate::seeded::SplitMix64;
use cluster::Cluster;
use trace::{TraceNode, TracePod};

/// Where a policy puts a pod: a node and the GPUs of it the pod takes (by index; none for a pod
/// that asks no GPU).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Choice {
    pub node: usize,
    pub gpus: Vec<usize>,
}

/// What a policy decides on: a pod, the cluster now, the nodes the pod fits on (in node order;
/// never empty), and the seed's node order (`rank`, lower first: what breaks ties).
#[derive(Debug, Clone, Copy)]
pub struct Decision<'a> {
    pub cluster: &'a Cluster,
    pub pod: &'a TracePod,
    pub feasible: &'a [usize],
    pub rank: &'a [u32],
}

/// A placement policy as the replay runs it.
pub trait Placer {
    fn name(&self) -> String;

    /// Where the pod goes among the nodes it fits on; `None` refuses it.
    fn choose(&mut self, decision: &Decision<'_>, rng: &mut SplitMix64) -> Option<Choice>;

    /// Told of every placement made, after the cluster took it.
    fn placed(&mut self, _cluster: &Cluster, _pod: &TracePod, _choice: &Choice) {}
}

/// One seed's workload: the pods in arrival order (indexes into the trace's pods), and the
/// node order that breaks ties.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Workload {
    pub arrivals: Vec<usize>,
    pub rank: Vec<u32>,
}

/// Most pods one workload may have, draws included.
pub const MAX_ARRIVALS: usize = 10_000_000;

/// The published workload for `seed`: the pods (in name order) shuffled, then pods drawn with
/// replacement appended while the GPU asked stays within `inflation` times `capacity_milli`,
/// then the node order.
///
/// As the published simulator does, the stop test adds a drawn pod's share of *one* GPU, while
/// the total grows by all its GPUs: a multi-GPU pod can take the total past the target.
pub fn workload(
    pods: &[TracePod],
    nodes: usize,
    capacity_milli: u64,
    inflation: f64,
    seed: u64,
) -> Workload {
    let mut rng = SplitMix64::new(seed);
    let mut by_name: Vec<usize> = (0..pods.len()).collect();
    by_name.sort_by(|&a, &b| pods[a].name.cmp(&pods[b].name));
    let mut arrivals = by_name.clone();
    shuffle(&mut arrivals, &mut rng);
    let target = inflation * capacity_milli as f64;
    let mut asked: u64 = pods.iter().map(TracePod::gpu_request).sum();
    // A trace whose pods ask no GPU would draw for ever; a huge inflation is cut at a bound.
    let asks_gpu = pods.iter().any(|p| p.gpu_milli > 0);
    while asks_gpu && arrivals.len() < MAX_ARRIVALS {
        let drawn = by_name[rng.below(by_name.len() as u64) as usize];
        let pod = &pods[drawn];
        if (asked + u64::from(pod.gpu_milli)) as f64 > target {
            break;
        }
        asked += pod.gpu_request();
        arrivals.push(drawn);
    }
    let mut order: Vec<usize> = (0..nodes).collect();
    shuffle(&mut order, &mut rng);
    let mut rank = vec![0u32; nodes];
    for (position, &node) in order.iter().enumerate() {
        rank[node] = position as u32;
    }
    Workload { arrivals, rank }
}

/// Fisher-Yates.
fn shuffle<T>(items: &mut [T], rng: &mut SplitMix64) {
    for i in (1..items.len()).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        items.swap(i, j);
    }
}

/// One replay's course: after each pod, the GPU asked so far and the GPU allocated (thousandths).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Course {
    pub capacity_milli: u64,
    pub points: Vec<(u64, u64)>,
    /// Pods placed and pods dropped.
    pub placed: usize,
    pub dropped: usize,
}

impl Course {
    /// The allocation ratio (percent) at `percent` of the capacity asked, as the paper reads it:
    /// the mean, over the pods after which the asked percentage rounds to `percent`, of the
    /// allocated percentage rounded to 2 places (within one point either side when no pod lands
    /// on it); `None` when the course never got there.
    pub fn allocation_at(&self, percent: u32) -> Option<f64> {
        let cap = self.capacity_milli as f64;
        let pct = |milli: u64| milli as f64 / cap * 100.0;
        let at = |lo: f64, hi: f64| -> Vec<f64> {
            self.points
                .iter()
                .filter(|(asked, _)| {
                    let p = pct(*asked).round_ties_even();
                    p >= lo && p <= hi
                })
                .map(|(_, used)| (pct(*used) * 100.0).round_ties_even() / 100.0)
                .collect()
        };
        let p = f64::from(percent);
        let mut values = at(p, p);
        if values.is_empty() {
            values = at(p - 1.0, p + 1.0);
        }
        (!values.is_empty()).then(|| values.iter().sum::<f64>() / values.len() as f64)
    }

    /// The allocation ratio at each whole percent asked from 1 to `to` (where reached).
    pub fn curve(&self, to: u32) -> Vec<(u32, f64)> {
        let cap = self.capacity_milli as f64;
        let mut sums = vec![(0.0f64, 0u32); to as usize + 1];
        for &(asked, used) in &self.points {
            let p = (asked as f64 / cap * 100.0).round_ties_even();
            if p >= 1.0 && p <= f64::from(to) {
                let slot = &mut sums[p as usize];
                slot.0 += used as f64 / cap * 100.0;
                slot.1 += 1;
            }
        }
        sums.iter()
            .enumerate()
            .filter(|(_, (_, n))| *n > 0)
            .map(|(p, (sum, n))| (p as u32, sum / f64::from(*n)))
            .collect()
    }
}

/// Replays `workload` of `pods` on `nodes` with `placer`.
pub fn replay(
    nodes: &[TraceNode],
    pods: &[TracePod],
    work: &Workload,
    mode: cluster::Mode,
    placer: &mut dyn Placer,
    seed: u64,
) -> Course {
    let mut cluster = Cluster::new(nodes, mode);
    // The policy's own draws, apart from the workload's.
    let mut rng = SplitMix64::new(seed ^ 0x005E_ED0F_D1CE);
    let mut course = Course {
        capacity_milli: cluster.capacity_milli,
        points: Vec::with_capacity(work.arrivals.len()),
        ..Course::default()
    };
    let mut asked = 0u64;
    for &i in &work.arrivals {
        let pod = &pods[i];
        asked += pod.gpu_request();
        if !cluster.needs_node(pod) {
            course.placed += 1;
            course.points.push((asked, cluster.used_milli));
            continue;
        }
        let feasible = cluster.feasible(pod);
        let choice = if feasible.is_empty() {
            None
        } else {
            let decision =
                Decision { cluster: &cluster, pod, feasible: &feasible, rank: &work.rank };
            placer.choose(&decision, &mut rng)
        };
        match choice {
            Some(choice) => {
                cluster.place(choice.node, pod, &choice.gpus);
                placer.placed(&cluster, pod, &choice);
                course.placed += 1;
            }
            None => course.dropped += 1,
        }
        course.points.push((asked, cluster.used_milli));
    }
    course
}

/// Mean and sample standard deviation.
pub fn mean_sd(values: &[f64]) -> (f64, f64) {
    let n = values.len() as f64;
    if values.is_empty() {
        return (f64::NAN, f64::NAN);
    }
    let mean = values.iter().sum::<f64>() / n;
    if values.len() < 2 {
        return (mean, 0.0);
    }
    let var = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.0);
    (mean, var.sqrt())
}

#[cfg(test)]
mod tests;
