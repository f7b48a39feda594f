//! RDMA Extended Transport Header (RETH).

use super::{be32, be64};

header_view!(
    /// RDMA Extended Transport Header (RETH). It follows the BTH in RDMA WRITE FIRST/ONLY and
    /// RDMA READ REQUEST packets (and FLUSH, ATOMIC WRITE).
    ///
    /// Shape: 16 bytes, big-endian: `va` u64 at 0..8, `rkey` u32 at 8..12, `dma_len` u32 at
    /// 12..16. Units: `va` is an address inside the responder's MR; `dma_len` is the length in
    /// bytes of the whole message, not of this packet's payload.
    /// Errors: `Truncated` if fewer than 16 bytes. Panics: never after `check_len`.
    /// Source: IBTA Vol 1 ch. 9 (RETH); rxe `rxe_hdr.h` `struct rxe_reth`.
    Reth,
    16
);

impl<T: AsRef<[u8]>> Reth<T> {
    /// Virtual address.
    pub fn va(&self) -> u64 {
        be64(&self.buffer.as_ref()[0..8])
    }
    /// Remote key.
    pub fn rkey(&self) -> u32 {
        be32(&self.buffer.as_ref()[8..12])
    }
    /// DMA length of the whole message in bytes.
    pub fn dma_len(&self) -> u32 {
        be32(&self.buffer.as_ref()[12..16])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Reth<T> {
    /// Sets the virtual address.
    pub fn set_va(&mut self, v: u64) {
        self.buffer.as_mut()[0..8].copy_from_slice(&v.to_be_bytes());
    }
    /// Sets the remote key.
    pub fn set_rkey(&mut self, v: u32) {
        self.buffer.as_mut()[8..12].copy_from_slice(&v.to_be_bytes());
    }
    /// Sets the DMA length.
    pub fn set_dma_len(&mut self, v: u32) {
        self.buffer.as_mut()[12..16].copy_from_slice(&v.to_be_bytes());
    }
}

/// Owned RETH; see [`Reth`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RethRepr {
    /// Virtual address in the responder's MR.
    pub va: u64,
    /// Remote key of that MR.
    pub rkey: u32,
    /// Message length in bytes.
    pub dma_len: u32,
}

impl RethRepr {
    /// Parses a checked view; never fails.
    pub fn parse<T: AsRef<[u8]>>(h: &Reth<T>) -> RethRepr {
        RethRepr {
            va: h.va(),
            rkey: h.rkey(),
            dma_len: h.dma_len(),
        }
    }
    /// 16.
    pub const fn buffer_len(&self) -> usize {
        16
    }
    /// Writes the header.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, h: &mut Reth<T>) {
        h.set_va(self.va);
        h.set_rkey(self.rkey);
        h.set_dma_len(self.dma_len);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::Error;

    // RETH of the first packet of tests/captures/13-write-bw.pcap.
    const BYTES: [u8; 16] = [
        0x00, 0x00, 0x56, 0x38, 0xbb, 0xa8, 0xe0, 0x00, 0x00, 0x00, 0x0a, 0x05, 0x00, 0x00, 0x00,
        0x40,
    ];
    const REPR: RethRepr = RethRepr {
        va: 0x5638_bba8_e000,
        rkey: 0x0a05,
        dma_len: 64,
    };

    #[test]
    fn deconstruct() {
        let h = Reth::new_checked(&BYTES[..]).unwrap();
        assert_eq!(
            (h.va(), h.rkey(), h.dma_len()),
            (0x5638_bba8_e000, 0x0a05, 64)
        );
    }
    #[test]
    fn construct() {
        let mut buf = [0xffu8; 16];
        let mut h = Reth::new_unchecked(&mut buf[..]);
        h.set_va(0x5638_bba8_e000);
        h.set_rkey(0x0a05);
        h.set_dma_len(64);
        assert_eq!(buf, BYTES);
    }
    #[test]
    fn parse() {
        assert_eq!(
            RethRepr::parse(&Reth::new_checked(&BYTES[..]).unwrap()),
            REPR
        );
    }
    #[test]
    fn emit() {
        let mut buf = [0u8; 16];
        REPR.emit(&mut Reth::new_unchecked(&mut buf[..]));
        assert_eq!(buf, BYTES);
    }
    #[test]
    fn truncated() {
        for n in 0..16 {
            assert_eq!(Reth::new_checked(&BYTES[..n]).err(), Some(Error::Truncated));
        }
    }
}
