//! `frag-gradient`: the GPU whose placement least increases the pool's fragmentation, measured
//! against the mix of cGPUs the pool runs (FGD, Weng et al., USENIX ATC'23, over GSaaS's GPUs).
//!
//! A GPU's free memory is a *fragment* for a kind of cGPU when that kind cannot fit in it: a
//! GPU with 30% free is a fragment for every kind asking more than 30%, and a partly used GPU for
//! every exclusive cGPU. The pool's fragmentation is the free memory that is a fragment,
//! weighted by how common each kind is in the [`Mix`] (the cGPUs booked now, by percent of their
//! GPU; the [`TYPES`] most common kinds). The policy takes the GPU where the request's cGPU
//! increases it least (the gradient), then the least free memory (best fit), then pool order.
//! FGD scores whole nodes because a pod's GPUs are local to one node; a GSaaS cGPU is reached
//! over the network, so each GPU is a node of its own and the score is the GPU's.
//!
//! Exact and incremental: for a request of `s` MiB, a kind asking `D` MiB adds `-s` to a GPU's
//! score while its free `f < D`, `f - s` while `D <= f < D + s`, and nothing past; so the score
//! only grows with `f` between the points `D` and `D + s`. The index keeps the candidates by
//! (GPU memory, free, slot), and a decision looks at the least-free candidate of each band
//! between those points, for each GPU size: O(sizes x kinds x log n), no pass over the GPUs.
//! Without a mix (an empty pool) every score is 0 and the order is best fit's.

use std::cmp::Ordering;
use std::collections::BTreeSet;
use std::sync::OnceLock;

use super::{by_slot, Candidate, CandidateIndex, Policy, Query};

/// How many of the mix's most common kinds the score weighs.
pub const TYPES: usize = 8;

/// The cGPUs the pool holds, counted by the percent of their GPU each asks (exclusive: 100).
///
/// Every booking and release counts here, so counting is an increment; the most common kinds
/// are worked out when a decision or a report first asks after a change.
#[derive(Debug, Clone)]
pub struct Mix {
    counts: [u64; 101],
    /// The [`TYPES`] most common kinds (percent, count), most common first; ties to the smaller.
    top: OnceLock<Vec<(u64, u64)>>,
}

impl Default for Mix {
    fn default() -> Self {
        Mix { counts: [0; 101], top: OnceLock::new() }
    }
}

impl Mix {
    /// The percent of a GPU of `total_mib` that a cGPU of `memory_mib` takes, rounded up.
    pub fn percent_of(memory_mib: u64, total_mib: u64) -> u64 {
        if total_mib == 0 {
            return 100;
        }
        (memory_mib.saturating_mul(100).div_ceil(total_mib)).clamp(1, 100)
    }

    /// Counts a cGPU in (`up`) or out of the mix.
    pub fn count(&mut self, percent: u64, up: bool) {
        let at = percent.clamp(1, 100) as usize;
        if up {
            self.counts[at] += 1;
        } else {
            self.counts[at] = self.counts[at].saturating_sub(1);
        }
        if self.top.get().is_some() {
            self.top = OnceLock::new();
        }
    }

    /// The kinds the score weighs: (percent of a GPU, cGPUs of that kind).
    pub fn kinds(&self) -> &[(u64, u64)] {
        self.top.get_or_init(|| {
            let mut top: Vec<(u64, u64)> = Vec::with_capacity(TYPES + 1);
            for (percent, &count) in self.counts.iter().enumerate() {
                if count == 0 {
                    continue;
                }
                let percent = percent as u64;
                let at = top.partition_point(|&(p, c)| c > count || (c == count && p < percent));
                if at < TYPES {
                    top.insert(at, (percent, count));
                    top.truncate(TYPES);
                }
            }
            top
        })
    }

    /// Every cGPU counted.
    pub fn total(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// The cGPUs of the kinds the score weighs.
    pub fn weighed(&self) -> u64 {
        self.kinds().iter().map(|&(_, count)| count).sum()
    }

    /// How much of a GPU of `total_mib` with `free_mib` free is a fragment, in hundredths of a
    /// MiB weighted by the kinds' counts (divide by the mix's total for FGD's expectation).
    pub fn fragment(&self, free_mib: u64, total_mib: u64) -> u128 {
        let free = u128::from(free_mib) * 100;
        self.kinds()
            .iter()
            .filter(|&&(percent, _)| free < u128::from(percent) * u128::from(total_mib))
            .map(|&(_, count)| free * u128::from(count))
            .sum()
    }

    /// The change of [`Mix::fragment`] when `need_mib` of the GPU's `free_mib` is booked.
    fn gradient(&self, free_mib: u64, total_mib: u64, need_mib: u64) -> i128 {
        let after = self.fragment(free_mib.saturating_sub(need_mib), total_mib);
        after as i128 - self.fragment(free_mib, total_mib) as i128
    }
}

#[derive(Debug, Clone, Copy, Default)]
pub struct FragGradient;

/// A candidate with its gradient for one query, worked out once.
#[derive(Debug, Clone, Copy)]
struct Scored {
    gradient: i128,
    total_mib: u64,
    free_mib: u64,
    slot: u32,
}

impl Scored {
    fn of(query: &Query, total_mib: u64, free_mib: u64, slot: u32) -> Scored {
        let gradient = match query.exclusive {
            true => 0,
            false => query.mix.gradient(free_mib, total_mib, query.need_mib),
        };
        Scored { gradient, total_mib, free_mib, slot }
    }

    /// The smaller gradient per GPU first, then best fit's order.
    fn cmp(&self, other: &Scored) -> Ordering {
        // Per GPU: a/ta against b/tb, crossed (totals are never 0 in a pool, at most 2^40 MiB).
        let a = self.gradient * i128::from(other.total_mib.max(1));
        let b = other.gradient * i128::from(self.total_mib.max(1));
        a.cmp(&b)
            .then_with(|| self.free_mib.cmp(&other.free_mib))
            .then_with(|| self.slot.cmp(&other.slot))
    }

    /// `self` if it comes before `best` (or there is none), else `best`.
    fn better_than(self, best: Option<Scored>) -> Option<Scored> {
        match best {
            Some(best) if best.cmp(&self) != Ordering::Greater => Some(best),
            _ => Some(self),
        }
    }
}

/// The order of two candidates for `query`: the smaller gradient per GPU, then best fit's.
fn order(query: &Query, a: &Candidate, b: &Candidate) -> Ordering {
    let scored = |c: &Candidate| Scored::of(query, c.total_mib, c.free_mib, c.slot);
    scored(a).cmp(&scored(b))
}

impl Policy for FragGradient {
    fn name(&self) -> String {
        "frag-gradient".into()
    }

    /// Without a request the gradient is 0: best fit's order.
    fn compare(&self, a: &Candidate, b: &Candidate) -> Ordering {
        a.free_mib.cmp(&b.free_mib).then_with(|| by_slot(a, b))
    }

    fn compare_for(&self, query: &Query, a: &Candidate, b: &Candidate) -> Ordering {
        order(query, a, b)
    }

    fn new_index(&self, _slots: u32) -> Box<dyn CandidateIndex> {
        Box::<FragGradientIndex>::default()
    }

    fn ranks_by_host_load(&self) -> bool {
        false
    }

    fn weighs_stranding(&self) -> bool {
        true
    }
}

/// Candidates by (GPU memory, free, slot).
#[derive(Debug, Default)]
struct FragGradientIndex(BTreeSet<(u64, u64, u32)>);

impl FragGradientIndex {
    /// The least-free candidate of the GPU size `total` with at least `free` free.
    fn first_from(&self, total: u64, free: u64) -> Option<(u64, u64, u32)> {
        self.0.range((total, free, 0)..).next().copied().filter(|&(t, _, _)| t == total)
    }

    /// The best candidate of one GPU size: the least-free of each band where the score is
    /// monotone (see the module docs).
    fn best_of_size(&self, query: &Query, total: u64) -> Option<Scored> {
        let need = query.need_mib;
        let mut starts: Vec<u64> = vec![need];
        if !query.exclusive {
            for &(percent, _) in query.mix.kinds() {
                // The least free f with 100 f >= percent x total (+ 100 need).
                let kind = (percent * total).div_ceil(100);
                starts.extend([kind, kind.saturating_add(need)].into_iter().filter(|&f| f > need));
            }
        }
        starts.sort_unstable();
        starts.dedup();
        let mut best: Option<Scored> = None;
        let mut last = None;
        for start in starts {
            let Some(found) = self.first_from(total, start) else { break };
            if last == Some(found) {
                continue;
            }
            last = Some(found);
            let (total_mib, free_mib, slot) = found;
            best = Scored::of(query, total_mib, free_mib, slot).better_than(best);
        }
        best
    }
}

impl CandidateIndex for FragGradientIndex {
    fn insert(&mut self, candidate: &Candidate) {
        self.0.insert((candidate.total_mib, candidate.free_mib, candidate.slot));
    }

    fn remove(&mut self, candidate: &Candidate) {
        self.0.remove(&(candidate.total_mib, candidate.free_mib, candidate.slot));
    }

    fn best(&self, need_mib: u64) -> Option<u32> {
        self.best_for(&Query { need_mib, exclusive: false, mix: &Mix::default() })
    }

    fn best_for(&self, query: &Query) -> Option<u32> {
        let mut best: Option<Scored> = None;
        let mut size = self.0.range((query.need_mib, 0, 0)..).next().map(|&(t, _, _)| t);
        while let Some(total) = size {
            if let Some(found) = self.best_of_size(query, total) {
                best = found.better_than(best);
            }
            size = self.0.range((total + 1, 0, 0)..).next().map(|&(t, _, _)| t);
        }
        best.map(|scored| scored.slot)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn candidate(slot: u32, free_mib: u64, total_mib: u64) -> Candidate {
        Candidate { slot, free_mib, total_mib, cgpus: 0, jobs: 0, host_vms: 0, host_seq: 0 }
    }

    #[test]
    fn the_mix_keeps_the_most_common_kinds_and_forgets_what_leaves() {
        let mut mix = Mix::default();
        for percent in [50, 50, 25, 100, 100, 100] {
            mix.count(percent, true);
        }
        assert_eq!(mix.kinds(), &[(100, 3), (50, 2), (25, 1)]);
        for percent in 1..=20 {
            mix.count(percent, true);
        }
        assert_eq!(mix.kinds().len(), TYPES);
        assert_eq!(mix.kinds()[..3], [(100, 3), (50, 2), (1, 1)]);
        mix.count(100, false);
        mix.count(100, false);
        mix.count(100, false);
        assert_eq!(mix.kinds()[0], (50, 2));
        assert_eq!(mix.total(), 23);
        assert_eq!(Mix::percent_of(1, 80_000), 1);
        assert_eq!(Mix::percent_of(40_001, 80_000), 51);
        assert_eq!(Mix::percent_of(90_000, 80_000), 100);
    }

    #[test]
    fn a_share_goes_where_it_leaves_the_fewest_fragments() {
        // Half-GPU cGPUs are common: a quarter share on the GPU with 50% free would leave 25%
        // that no half fits (a new fragment), so it goes to the GPU already down to 30% free,
        // which is a fragment for halves already and shrinks.
        let mut mix = Mix::default();
        for _ in 0..10 {
            mix.count(50, true);
        }
        let query = Query { need_mib: 2500, exclusive: false, mix: &mix };
        let mut index = FragGradientIndex::default();
        let gpus = [candidate(0, 5000, 10_000), candidate(1, 3000, 10_000)];
        for gpu in &gpus {
            index.insert(gpu);
        }
        assert_eq!(index.best_for(&query), Some(1));
        assert_eq!(FragGradient.compare_for(&query, &gpus[1], &gpus[0]), Ordering::Less);
        // An idle GPU: a quarter leaves 75%, still room for a half, no fragment; the 30% GPU
        // still shrinks one, and wins.
        index.insert(&candidate(2, 10_000, 10_000));
        assert_eq!(index.best_for(&query), Some(1));
        index.remove(&gpus[1]);
        assert_eq!(index.best_for(&query), Some(2), "the idle GPU rather than cut a half");
    }
}
