//! Immediate data extended header (ImmDt).

use super::be32;

header_view!(
    /// Immediate data (ImmDt): 32 opaque bits carried by SEND/WRITE ... WITH_IMMEDIATE.
    ///
    /// Shape: 4 bytes. Units: none; verbs' `imm_data` is already in network order, so
    /// [`ImmDtRepr::imm_data`] holds the four wire bytes read as a big-endian u32 and the verbs
    /// layer passes it through unchanged (as rxe does both ways).
    /// Errors: `Truncated` if fewer than 4 bytes. Panics: never after `check_len`.
    /// Source: IBTA Vol 1 ch. 9 (ImmDt); rxe `rxe_hdr.h` `struct rxe_immdt`.
    ImmDt,
    4
);

impl<T: AsRef<[u8]>> ImmDt<T> {
    /// The immediate value (wire bytes as big-endian u32).
    pub fn imm(&self) -> u32 {
        be32(&self.buffer.as_ref()[0..4])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> ImmDt<T> {
    /// Sets the immediate value.
    pub fn set_imm(&mut self, v: u32) {
        self.buffer.as_mut()[0..4].copy_from_slice(&v.to_be_bytes());
    }
}

/// Owned ImmDt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImmDtRepr {
    /// Immediate data (wire bytes as big-endian u32).
    pub imm_data: u32,
}

impl ImmDtRepr {
    /// Parses a checked view; never fails.
    pub fn parse<T: AsRef<[u8]>>(h: &ImmDt<T>) -> ImmDtRepr {
        ImmDtRepr { imm_data: h.imm() }
    }
    /// 4.
    pub const fn buffer_len(&self) -> usize {
        4
    }
    /// Writes the header.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, h: &mut ImmDt<T>) {
        h.set_imm(self.imm_data);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::Error;

    // ImmDt of the first packet of tests/captures/51-rc-write-imm.pcap (pyverbs, 0xc0ffee11).
    const BYTES: [u8; 4] = [0xc0, 0xff, 0xee, 0x11];

    #[test]
    fn deconstruct() {
        assert_eq!(ImmDt::new_checked(&BYTES[..]).unwrap().imm(), 0xc0ff_ee11);
    }
    #[test]
    fn construct() {
        let mut buf = [0u8; 4];
        ImmDt::new_unchecked(&mut buf[..]).set_imm(0xc0ff_ee11);
        assert_eq!(buf, BYTES);
    }
    #[test]
    fn parse() {
        let r = ImmDtRepr::parse(&ImmDt::new_checked(&BYTES[..]).unwrap());
        assert_eq!(r.imm_data, 0xc0ff_ee11);
    }
    #[test]
    fn emit() {
        let mut buf = [0u8; 4];
        ImmDtRepr {
            imm_data: 0xc0ff_ee11,
        }
        .emit(&mut ImmDt::new_unchecked(&mut buf[..]));
        assert_eq!(buf, BYTES);
    }
    #[test]
    fn truncated() {
        for n in 0..4 {
            assert_eq!(
                ImmDt::new_checked(&BYTES[..n]).err(),
                Some(Error::Truncated)
            );
        }
    }
}
