//! GPU fragmentation as the FGD paper measures it (Weng et al., USENIX ATC 2023): the part of a
//! node's free GPU capacity that the workload's typical pods could not use, weighted by how often
//! each kind of pod comes.
//!
//! For each typical pod (its CPU, its share of a GPU, how many GPUs, which models; with its
//! weight w): if it asks no GPU, all the node's free GPU counts (w x free); if the node's model is
//! not one it may use, all counts; if the node has enough GPUs with its share free and its CPU
//! free, only the free GPU left on GPUs too small for it counts (the rest is usable); otherwise
//! all counts. A node's fragmentation is the sum over the typical pods.

use std::collections::HashMap;

use super::trace::TracePod;

/// A kind of pod and how often it comes.
#[derive(Debug, Clone, PartialEq)]
pub struct TypicalPod {
    pub cpu_milli: u64,
    pub gpu_milli: u32,
    pub num_gpu: u32,
    pub models: Vec<String>,
    /// Its share of the typical pods (they sum to 1).
    pub weight: f64,
}

/// The kinds of pod that make up the bulk of a workload.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TypicalPods(pub Vec<TypicalPod>);

/// The share of a workload its typical pods cover (the paper's 95%).
pub const TYPICAL_COVERAGE: f64 = 0.95;

impl TypicalPods {
    /// The most frequent kinds of `pods` (by CPU, GPU share, GPU count and models; a pod asking
    /// no CPU counted as 100 millicores) until they cover `coverage` of them, the one that
    /// crosses it included; ties in frequency go to the larger kind. Weights are renormalised
    /// over the kinds kept.
    pub fn of(pods: &[TracePod], coverage: f64) -> Self {
        type Kind = (u64, u32, u32, String);
        let mut counts: HashMap<Kind, u64> = HashMap::new();
        for pod in pods {
            let cpu = if pod.cpu_milli == 0 { 100 } else { pod.cpu_milli };
            let kind = (cpu, pod.gpu_milli, pod.num_gpu, pod.gpu_spec.join("|"));
            *counts.entry(kind).or_default() += 1;
        }
        let mut kinds: Vec<(Kind, u64)> = counts.into_iter().collect();
        kinds.sort_by(|(a, ca), (b, cb)| cb.cmp(ca).then_with(|| b.cmp(a)));
        let total = pods.len() as f64;
        let wanted = coverage * total;
        let mut kept = Vec::new();
        let mut covered = 0.0;
        for (kind, count) in kinds {
            if covered >= wanted {
                break;
            }
            covered += count as f64;
            kept.push((kind, count as f64 / total));
        }
        let share = covered / total;
        TypicalPods(
            kept.into_iter()
                .map(|((cpu_milli, gpu_milli, num_gpu, spec), f)| TypicalPod {
                    cpu_milli,
                    gpu_milli,
                    num_gpu,
                    models: spec.split('|').filter(|m| !m.is_empty()).map(str::to_owned).collect(),
                    weight: f / share,
                })
                .collect(),
        )
    }
}

/// A node's fragmentation against typical pods, remembered by node state (nodes repeat the same
/// few states, and a placement is scored against every node).
#[derive(Debug)]
pub struct Fragmentation {
    typical: TypicalPods,
    memo: HashMap<(i64, u128, u16), f64>,
}

/// Most remembered states before the memory is cleared.
const MEMO_LIMIT: usize = 1 << 20;

impl Fragmentation {
    pub fn new(typical: TypicalPods) -> Self {
        Fragmentation { typical, memo: HashMap::new() }
    }

    pub fn typical(&self) -> &TypicalPods {
        &self.typical
    }

    /// The fragmentation (in thousandths of a GPU) of a node of model `model` (`model_id` its
    /// index) with `cpu_left` millicores and `gpu_left` free on its GPUs.
    pub fn of(&mut self, cpu_left: i64, gpu_left: &[u32], model_id: u16, model: &str) -> f64 {
        // Up to 8 GPUs, sorted, 10 bits each (a GPU is 1000 thousandths), make the key.
        if gpu_left.len() > 8 {
            return measure(&self.typical, cpu_left, gpu_left, model);
        }
        let mut sorted = [0u32; 8];
        sorted[..gpu_left.len()].copy_from_slice(gpu_left);
        sorted[..gpu_left.len()].sort_unstable();
        let packed = sorted[..gpu_left.len()]
            .iter()
            .fold(gpu_left.len() as u128, |key, &m| (key << 11) | u128::from(m.min(2047)));
        let key = (cpu_left, packed, model_id);
        if let Some(&f) = self.memo.get(&key) {
            return f;
        }
        if self.memo.len() >= MEMO_LIMIT {
            self.memo.clear();
        }
        let f = measure(&self.typical, cpu_left, gpu_left, model);
        self.memo.insert(key, f);
        f
    }
}

/// The measure itself (see the module's doc), summed in the paper's order: the buckets "lacks
/// CPU and GPU", "lacks GPU", "lacks CPU", "no GPU asked" (fits or not) and "model not
/// allowed", each over the typical pods in order.
pub fn measure(typical: &TypicalPods, cpu_left: i64, gpu_left: &[u32], model: &str) -> f64 {
    let free: u64 = gpu_left.iter().map(|&m| u64::from(m)).sum();
    let free = free as f64;
    // lack both, lack GPU, usable (not counted), lack CPU, no GPU & CPU fits, no GPU & lacks
    // CPU, model not allowed.
    let mut buckets = [0.0f64; 7];
    for pod in &typical.0 {
        let cpu_fits = cpu_left >= pod.cpu_milli as i64;
        if pod.gpu_milli == 0 {
            buckets[if cpu_fits { 4 } else { 5 }] += pod.weight * free;
            continue;
        }
        if !pod.models.is_empty() && !pod.models.iter().any(|m| m == model) {
            buckets[6] += pod.weight * free;
            continue;
        }
        let fitting = gpu_left.iter().filter(|&&m| m >= pod.gpu_milli).count();
        if fitting >= pod.num_gpu as usize {
            if cpu_fits {
                let too_small: u64 =
                    gpu_left.iter().filter(|&&m| m < pod.gpu_milli).map(|&m| u64::from(m)).sum();
                buckets[1] += pod.weight * too_small as f64;
                buckets[2] += pod.weight * (free - too_small as f64);
            } else {
                buckets[3] += pod.weight * free;
            }
        } else {
            buckets[if cpu_fits { 1 } else { 0 }] += pod.weight * free;
        }
    }
    [0, 1, 3, 4, 5, 6].iter().map(|&i| buckets[i]).sum()
}
