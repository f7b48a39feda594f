//! Invalidate Extended Transport Header (IETH).

use super::be32;

header_view!(
    /// Invalidate Extended Transport Header (IETH): the R_Key that SEND ... WITH_INVALIDATE
    /// asks the responder to invalidate.
    ///
    /// Shape: 4 bytes, `rkey` u32 big-endian. Errors: `Truncated` if fewer than 4 bytes.
    /// Panics: never after `check_len`. Source: IBTA Vol 1 ch. 9 (IETH); rxe `struct rxe_ieth`.
    Ieth,
    4
);

impl<T: AsRef<[u8]>> Ieth<T> {
    /// R_Key to invalidate.
    pub fn rkey(&self) -> u32 {
        be32(&self.buffer.as_ref()[0..4])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Ieth<T> {
    /// Sets the R_Key.
    pub fn set_rkey(&mut self, v: u32) {
        self.buffer.as_mut()[0..4].copy_from_slice(&v.to_be_bytes());
    }
}

/// Owned IETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IethRepr {
    /// R_Key to invalidate.
    pub rkey: u32,
}

impl IethRepr {
    /// Parses a checked view; never fails.
    pub fn parse<T: AsRef<[u8]>>(h: &Ieth<T>) -> IethRepr {
        IethRepr { rkey: h.rkey() }
    }
    /// 4.
    pub const fn buffer_len(&self) -> usize {
        4
    }
    /// Writes the header.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, h: &mut Ieth<T>) {
        h.set_rkey(self.rkey);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::Error;

    const BYTES: [u8; 4] = [0x00, 0x00, 0x12, 0x34];

    #[test]
    fn round_trip_and_truncated() {
        let r = IethRepr::parse(&Ieth::new_checked(&BYTES[..]).unwrap());
        assert_eq!(r.rkey, 0x1234);
        let mut buf = [0u8; 4];
        r.emit(&mut Ieth::new_unchecked(&mut buf[..]));
        assert_eq!(buf, BYTES);
        for n in 0..4 {
            assert_eq!(Ieth::new_checked(&BYTES[..n]).err(), Some(Error::Truncated));
        }
    }
}
