//! A seeded generator (SplitMix64) for what simulates a cloud around the planner: the policy
//! simulator, the simulated cloud's chaos faults, randomized tests. The planner itself never draws;
//! a seed replays a simulation exactly.

/// SplitMix64 (Steele, Lea and Flood): small, fast, and fully determined by its seed.
/// The default is seed 0.
#[derive(Debug, Clone, Default)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Below `n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// Uniform in (0, 1].
    pub fn unit(&mut self) -> f64 {
        ((self.next_u64() >> 11) + 1) as f64 / (1u64 << 53) as f64
    }

    /// True with `per_mille` thousandths' chance.
    pub fn per_mille(&mut self, per_mille: u32) -> bool {
        per_mille > 0 && self.below(1000) < u64::from(per_mille)
    }
}

#[cfg(test)]
mod tests {
    use super::SplitMix64;

    #[test]
    fn a_seed_replays_and_draws_stay_in_range() {
        let draws = |seed| {
            let mut rng = SplitMix64::new(seed);
            (0..100).map(|_| rng.below(7)).collect::<Vec<_>>()
        };
        assert_eq!(draws(42), draws(42));
        assert_ne!(draws(42), draws(43));
        assert!(draws(1).iter().all(|d| *d < 7));
        let mut rng = SplitMix64::new(9);
        assert!((0..1000).all(|_| !rng.per_mille(0)));
        assert!((0..1000).all(|_| rng.per_mille(1000)));
        let hits = (0..10_000).filter(|_| rng.per_mille(100)).count();
        assert!((800..1200).contains(&hits), "{hits} of 10,000 at 10%");
        assert!((0..1000).all(|_| (0.0..=1.0).contains(&rng.unit()) && rng.unit() > 0.0));
    }
}
