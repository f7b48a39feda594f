//! Packet sequence numbers: 24-bit, compared modulo 2^24.

/// A packet sequence number (PSN): 24 bits, wrapping.
///
/// Order is modular, like TCP sequence numbers: `a < b` when `b` is less than 2^23 ahead of
/// `a`. The order is not total, so `Psn` implements `PartialOrd` but never `Ord`.
/// Units: one PSN per request packet; a READ of N bytes uses max(1, ⌈N/PMTU⌉) PSNs.
/// Source: IBTA Vol 1 ch. 9 (packet sequence numbers); rxe `rxe_verbs.h` `psn_compare`, which
/// shifts the 24-bit difference into the top of an i32.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Psn(u32);

impl Psn {
    /// Mask of the 24 PSN bits.
    pub const MASK: u32 = 0x00ff_ffff;

    /// A PSN from the low 24 bits of `v` (higher bits are discarded).
    pub const fn new(v: u32) -> Psn {
        Psn(v & Self::MASK)
    }

    /// The 24-bit value.
    pub const fn value(self) -> u32 {
        self.0
    }

    /// `self + n` modulo 2^24.
    #[must_use]
    pub const fn add(self, n: u32) -> Psn {
        Psn(self.0.wrapping_add(n) & Self::MASK)
    }

    /// `self - n` modulo 2^24.
    #[must_use]
    pub const fn sub(self, n: u32) -> Psn {
        Psn(self.0.wrapping_sub(n) & Self::MASK)
    }

    /// The signed distance from `other` to `self` in PSNs, in −2^23 ..= 2^23 − 1
    /// (positive when `self` is after `other`). Source: rxe `psn_compare`.
    pub const fn diff(self, other: Psn) -> i32 {
        ((self.0.wrapping_sub(other.0)) << 8) as i32 >> 8
    }

    /// Forward distance from `other` to `self` modulo 2^24 (0 ..= 2^24 − 1).
    pub const fn distance_from(self, other: Psn) -> u32 {
        self.0.wrapping_sub(other.0) & Self::MASK
    }
}

impl PartialOrd for Psn {
    /// `None` for two PSNs exactly 2^23 apart: each is 2^23 ahead of the other, so neither is
    /// before the other (rxe's `psn_compare` calls both "before", which no order can).
    fn partial_cmp(&self, other: &Psn) -> Option<core::cmp::Ordering> {
        match self.diff(*other) {
            -0x80_0000 => None,
            d => Some(d.cmp(&0)),
        }
    }
}

impl core::fmt::Display for Psn {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{:#08x}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wraps_at_24_bits() {
        assert_eq!(Psn::new(0x00ff_ffff).add(1), Psn::new(0));
        assert_eq!(Psn::new(0).sub(1), Psn::new(0x00ff_ffff));
        assert_eq!(Psn::new(0x0100_0005), Psn::new(5));
    }

    #[test]
    fn order_across_wrap() {
        let a = Psn::new(0x00ff_fff0);
        let b = a.add(0x20);
        assert!(a < b);
        assert!(b > a);
        assert_eq!(b.diff(a), 0x20);
        assert_eq!(a.diff(b), -0x20);
        assert_eq!(b.distance_from(a), 0x20);
    }

    #[test]
    fn half_window_boundary() {
        let a = Psn::new(0);
        assert!(a.add(0x7f_ffff) > a);
        assert!(a.add(0x80_0001) < a);
        // Exactly half way round: unordered both ways; `diff` still says -2^23 like rxe.
        let h = a.add(0x80_0000);
        assert_eq!(h.partial_cmp(&a), None);
        assert!(!h.lt(&a) && !a.lt(&h));
        assert_eq!(h.diff(a), -0x80_0000);
    }
}
