//! The engine's one pseudo-random generator: [`SplitMix64`], small and seeded.
//!
//! Layer: a leaf every layer may use (`wire` and `transport` included): it has no global
//! state, reads no clock and opens nothing, so a seed replays exactly (the sans-IO rule: an
//! initial PSN, an MR key byte, a CM comm ID or a simulated fault all come from a seed in a
//! config). A frontend that wants a seed differing between runs takes one from
//! [`crate::net::clock::seed_from_clock_and_pid`]. Never panics, never allocates.

/// splitmix64 (Steele, Lea and Flood, "Fast splittable pseudorandom number generators",
/// OOPSLA 2014; the constants of Vigna's `splitmix64.c`): a 64-bit state advanced by the
/// golden-ratio increment and a mixed output. Not cryptographic.
///
/// Shape: the state is the seed as given; each [`next_u64`](Self::next_u64) adds
/// `0x9e37_79b9_7f4a_7c15` to it and returns the state through the splitmix64 finalizer.
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator whose state is `seed` (any value, 0 included).
    pub const fn new(seed: u64) -> SplitMix64 {
        SplitMix64(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`n` 0 counts as 1), by modulo: the bias is below 2^-40 for the
    /// small `n` it is used with.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// True with probability `p` (53 random bits against `p`).
    pub fn chance(&mut self, p: f64) -> bool {
        ((self.next_u64() >> 11) as f64 / (1u64 << 53) as f64) < p
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The first outputs of Vigna's reference `splitmix64.c` from seed 1234567.
    #[test]
    fn splitmix64_matches_the_reference_sequence() {
        let mut r = SplitMix64::new(1_234_567);
        let got: Vec<u64> = (0..5).map(|_| r.next_u64()).collect();
        assert_eq!(
            got,
            [
                6_457_827_717_110_365_317,
                3_203_168_211_198_807_973,
                9_817_491_932_198_370_423,
                4_593_380_528_125_082_431,
                16_408_922_859_458_223_821,
            ]
        );
    }

    #[test]
    fn below_stays_below_and_chance_is_bounded() {
        let mut r = SplitMix64::new(7);
        assert!((0..1000).all(|_| r.below(10) < 10));
        assert_eq!(r.below(0), 0);
        assert!((0..100).all(|_| !r.chance(0.0)));
        assert!((0..100).all(|_| r.chance(1.0)));
    }
}
