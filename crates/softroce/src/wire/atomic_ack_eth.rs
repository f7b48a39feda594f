//! Atomic ACK Extended Transport Header (AtomicAckETH).

use super::be64;

header_view!(
    /// Atomic ACK Extended Transport Header: the original remote value, after the AETH of an
    /// ATOMIC ACKNOWLEDGE.
    ///
    /// Shape: 8 bytes, `orig_remote_data` u64 big-endian. Errors: `Truncated` if fewer than 8
    /// bytes. Panics: never after `check_len`.
    /// Source: IBTA Vol 1 ch. 9 (AtomicAckETH); rxe `rxe_hdr.h` `struct rxe_atmack`.
    AtomicAckEth,
    8
);

impl<T: AsRef<[u8]>> AtomicAckEth<T> {
    /// Original value at the target before the atomic.
    pub fn orig_remote_data(&self) -> u64 {
        be64(&self.buffer.as_ref()[0..8])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> AtomicAckEth<T> {
    /// Sets the original value.
    pub fn set_orig_remote_data(&mut self, v: u64) {
        self.buffer.as_mut()[0..8].copy_from_slice(&v.to_be_bytes());
    }
}

/// Owned AtomicAckETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AtomicAckEthRepr {
    /// Original remote value.
    pub orig_remote_data: u64,
}

impl AtomicAckEthRepr {
    /// Parses a checked view; never fails.
    pub fn parse<T: AsRef<[u8]>>(h: &AtomicAckEth<T>) -> AtomicAckEthRepr {
        AtomicAckEthRepr {
            orig_remote_data: h.orig_remote_data(),
        }
    }
    /// 8.
    pub const fn buffer_len(&self) -> usize {
        8
    }
    /// Writes the header.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, h: &mut AtomicAckEth<T>) {
        h.set_orig_remote_data(self.orig_remote_data);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::Error;

    // AtomicAckETH of the first ATOMIC ACKNOWLEDGE in tests/captures/18-atomic-fadd.pcap.
    const BYTES: [u8; 8] = [0x0d, 0x51, 0x16, 0x30, 0xdc, 0x16, 0xc6, 0xd9];

    #[test]
    fn round_trip_and_truncated() {
        let r = AtomicAckEthRepr::parse(&AtomicAckEth::new_checked(&BYTES[..]).unwrap());
        assert_eq!(r.orig_remote_data, 0x0d51_1630_dc16_c6d9);
        let mut buf = [0u8; 8];
        r.emit(&mut AtomicAckEth::new_unchecked(&mut buf[..]));
        assert_eq!(buf, BYTES);
        for n in 0..8 {
            assert_eq!(
                AtomicAckEth::new_checked(&BYTES[..n]).err(),
                Some(Error::Truncated)
            );
        }
    }
}
