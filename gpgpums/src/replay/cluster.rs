//! The replayed cluster: what each node has left, and whether a pod fits on it.
//!
//! **Local mode** (the published experiment): a pod's CPU and memory are taken from the node
//! that holds its GPUs, and are hard limits there. **Remote mode** (GSaaS's model, the
//! dissertation's): a VM's CPU and memory live on compute hosts apart from the GPU hosts, so only
//! GPUs bind; a pod without GPUs takes nothing here.

use super::trace::{TraceNode, TracePod, GPU_MILLI};

/// Where a pod's CPU and memory are taken from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    /// From the node that holds its GPUs (the published experiment).
    #[default]
    Local,
    /// From compute hosts apart from the GPU nodes: only GPUs bind.
    Remote,
}

impl Mode {
    pub fn parse(text: &str) -> Option<Mode> {
        match text {
            "local" => Some(Mode::Local),
            "remote" => Some(Mode::Remote),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Mode::Local => "local",
            Mode::Remote => "remote",
        }
    }
}

/// Pods one node may hold (the published simulator's limit; it never binds on the traces).
pub const MAX_PODS_PER_NODE: u32 = 1001;

/// What one node has left.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    pub cpu_left: u64,
    pub memory_left: u64,
    /// Thousandths of each GPU still free, by GPU index.
    pub gpu_left: Vec<u32>,
    /// Index into [`Cluster::models`].
    pub model: u16,
    pub pods: u32,
}

impl Node {
    /// Thousandths of a GPU free on the node in all.
    pub fn gpu_left_total(&self) -> u64 {
        self.gpu_left.iter().map(|&m| u64::from(m)).sum()
    }

    /// GPUs with at least `milli` free.
    pub fn gpus_with(&self, milli: u32) -> usize {
        self.gpu_left.iter().filter(|&&m| m >= milli).count()
    }
}

/// The nodes of a replay and what they have left.
#[derive(Debug, Clone)]
pub struct Cluster {
    pub mode: Mode,
    pub nodes: Vec<Node>,
    /// The GPU models, by index.
    pub models: Vec<String>,
    /// Thousandths of a GPU in the whole cluster.
    pub capacity_milli: u64,
    /// Thousandths of a GPU allocated now.
    pub used_milli: u64,
}

impl Cluster {
    /// Every node of `nodes` whole and free, in their order.
    pub fn new(nodes: &[TraceNode], mode: Mode) -> Self {
        let mut models: Vec<String> = Vec::new();
        let mut cluster_nodes = Vec::with_capacity(nodes.len());
        for node in nodes {
            let model = match models.iter().position(|m| *m == node.model) {
                Some(i) => i,
                None => {
                    models.push(node.model.clone());
                    models.len() - 1
                }
            };
            cluster_nodes.push(Node {
                cpu_left: node.cpu_milli,
                memory_left: node.memory_mib,
                gpu_left: vec![GPU_MILLI; node.gpus as usize],
                model: model as u16,
                pods: 0,
            });
        }
        let capacity_milli = nodes.iter().map(|n| u64::from(n.gpus) * u64::from(GPU_MILLI)).sum();
        Cluster { mode, nodes: cluster_nodes, models, capacity_milli, used_milli: 0 }
    }

    pub fn model_of(&self, node: usize) -> &str {
        &self.models[self.nodes[node].model as usize]
    }

    /// Whether `pod` fits on `node` now.
    pub fn fits(&self, node: usize, pod: &TracePod) -> bool {
        let n = &self.nodes[node];
        if self.mode == Mode::Local
            && (n.cpu_left < pod.cpu_milli
                || n.memory_left < pod.memory_mib
                || n.pods >= MAX_PODS_PER_NODE)
        {
            return false;
        }
        if pod.gpu_milli == 0 {
            return true;
        }
        pod.allows(self.model_of(node)) && n.gpus_with(pod.gpu_milli) >= pod.num_gpu as usize
    }

    /// The nodes `pod` fits on now, in node order.
    pub fn feasible(&self, pod: &TracePod) -> Vec<usize> {
        (0..self.nodes.len()).filter(|&n| self.fits(n, pod)).collect()
    }

    /// Whether a pod takes anything of this cluster (in remote mode a pod with no GPU does not).
    pub fn needs_node(&self, pod: &TracePod) -> bool {
        self.mode == Mode::Local || pod.gpu_milli > 0
    }

    /// Places `pod` on `node`, its share of each GPU of `gpus` taken.
    ///
    /// Panics when it does not fit there: a policy chose wrong.
    pub fn place(&mut self, node: usize, pod: &TracePod, gpus: &[usize]) {
        assert!(self.fits(node, pod), "a policy placed a pod where it does not fit");
        let milli = pod.gpu_milli;
        assert_eq!(gpus.len(), if milli == 0 { 0 } else { pod.num_gpu as usize });
        let mode = self.mode;
        let n = &mut self.nodes[node];
        for &gpu in gpus {
            assert!(n.gpu_left[gpu] >= milli, "a policy chose a GPU with too little free");
            n.gpu_left[gpu] -= milli;
        }
        if mode == Mode::Local {
            n.cpu_left -= pod.cpu_milli;
            n.memory_left -= pod.memory_mib;
            n.pods += 1;
        }
        self.used_milli += u64::from(milli) * gpus.len() as u64;
    }
}

/// The GPUs a whole-GPU or multi-GPU pod takes on a node: the lowest-indexed that have its share
/// free (wholly free ones for whole GPUs), as the published simulator takes them.
pub fn lowest_gpus(node: &Node, pod: &TracePod) -> Vec<usize> {
    if pod.gpu_milli == 0 {
        return Vec::new();
    }
    node.gpu_left
        .iter()
        .enumerate()
        .filter(|(_, &left)| left >= pod.gpu_milli)
        .map(|(i, _)| i)
        .take(pod.num_gpu as usize)
        .collect()
}
