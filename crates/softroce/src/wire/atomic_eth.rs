//! Atomic Extended Transport Header (AtomicETH).

use super::{be32, be64};

header_view!(
    /// Atomic Extended Transport Header (AtomicETH): follows the BTH in COMPARE_SWAP and
    /// FETCH_ADD requests.
    ///
    /// Shape: 28 bytes, big-endian, 64-bit fields at 4-byte offsets: `va` u64 at 0..8, `rkey`
    /// u32 at 8..12, `swap_add` u64 at 12..20, `compare` u64 at 20..28. FETCH_ADD carries the
    /// addend in `swap_add` and 0 in `compare`.
    /// Errors: `Truncated` if fewer than 28 bytes. Panics: never after `check_len`.
    /// Source: IBTA Vol 1 ch. 9 (AtomicETH); rxe `rxe_hdr.h` `struct rxe_atmeth`.
    AtomicEth,
    28
);

impl<T: AsRef<[u8]>> AtomicEth<T> {
    /// Virtual address of the 8-byte target.
    pub fn va(&self) -> u64 {
        be64(&self.buffer.as_ref()[0..8])
    }
    /// Remote key.
    pub fn rkey(&self) -> u32 {
        be32(&self.buffer.as_ref()[8..12])
    }
    /// Swap value (CMP_SWAP) or addend (FETCH_ADD).
    pub fn swap_add(&self) -> u64 {
        be64(&self.buffer.as_ref()[12..20])
    }
    /// Compare value (CMP_SWAP).
    pub fn compare(&self) -> u64 {
        be64(&self.buffer.as_ref()[20..28])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> AtomicEth<T> {
    /// Sets the virtual address.
    pub fn set_va(&mut self, v: u64) {
        self.buffer.as_mut()[0..8].copy_from_slice(&v.to_be_bytes());
    }
    /// Sets the remote key.
    pub fn set_rkey(&mut self, v: u32) {
        self.buffer.as_mut()[8..12].copy_from_slice(&v.to_be_bytes());
    }
    /// Sets swap / add.
    pub fn set_swap_add(&mut self, v: u64) {
        self.buffer.as_mut()[12..20].copy_from_slice(&v.to_be_bytes());
    }
    /// Sets compare.
    pub fn set_compare(&mut self, v: u64) {
        self.buffer.as_mut()[20..28].copy_from_slice(&v.to_be_bytes());
    }
}

/// Owned AtomicETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AtomicEthRepr {
    /// Virtual address (must be 8-byte aligned at the responder).
    pub va: u64,
    /// Remote key.
    pub rkey: u32,
    /// Swap value or addend.
    pub swap_add: u64,
    /// Compare value.
    pub compare: u64,
}

impl AtomicEthRepr {
    /// Parses a checked view; never fails.
    pub fn parse<T: AsRef<[u8]>>(h: &AtomicEth<T>) -> AtomicEthRepr {
        AtomicEthRepr {
            va: h.va(),
            rkey: h.rkey(),
            swap_add: h.swap_add(),
            compare: h.compare(),
        }
    }
    /// 28.
    pub const fn buffer_len(&self) -> usize {
        28
    }
    /// Writes the header.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, h: &mut AtomicEth<T>) {
        h.set_va(self.va);
        h.set_rkey(self.rkey);
        h.set_swap_add(self.swap_add);
        h.set_compare(self.compare);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::Error;

    // AtomicETH of the first FETCH_ADD in tests/captures/18-atomic-fadd.pcap.
    const BYTES: [u8; 28] = [
        0x00, 0x00, 0x56, 0x06, 0x93, 0xc6, 0x80, 0x00, 0x00, 0x00, 0x0f, 0x6f, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    ];

    #[test]
    fn round_trip_and_truncated() {
        let h = AtomicEth::new_checked(&BYTES[..]).unwrap();
        let r = AtomicEthRepr::parse(&h);
        assert_eq!(
            r,
            AtomicEthRepr {
                va: 0x5606_93c6_8000,
                rkey: 0x0f6f,
                swap_add: 1,
                compare: 0
            }
        );
        let mut buf = [0xffu8; 28];
        r.emit(&mut AtomicEth::new_unchecked(&mut buf[..]));
        assert_eq!(buf, BYTES);
        for n in 0..28 {
            assert_eq!(
                AtomicEth::new_checked(&BYTES[..n]).err(),
                Some(Error::Truncated)
            );
        }
    }
}
