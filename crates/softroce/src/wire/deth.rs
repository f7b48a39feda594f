//! Datagram Extended Transport Header (DETH).

use super::{be24, be32, put_be24};

header_view!(
    /// Datagram Extended Transport Header (DETH): follows the BTH in every UD packet.
    ///
    /// Shape: 8 bytes, big-endian: `qkey` u32 at 0..4, reserved u8 at 4, `src_qpn` u24 at 5..8.
    /// Errors: `Truncated` if fewer than 8 bytes. Panics: never after `check_len`.
    /// Source: IBTA Vol 1 ch. 9 (DETH); rxe `rxe_hdr.h` `struct rxe_deth`.
    Deth,
    8
);

impl<T: AsRef<[u8]>> Deth<T> {
    /// Queue key.
    pub fn qkey(&self) -> u32 {
        be32(&self.buffer.as_ref()[0..4])
    }
    /// Source QP number.
    pub fn src_qpn(&self) -> u32 {
        be24(&self.buffer.as_ref()[5..8])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Deth<T> {
    /// Sets the Q_Key.
    pub fn set_qkey(&mut self, v: u32) {
        self.buffer.as_mut()[0..4].copy_from_slice(&v.to_be_bytes());
    }
    /// Sets the source QPN; the reserved byte becomes 0.
    pub fn set_src_qpn(&mut self, v: u32) {
        self.buffer.as_mut()[4] = 0;
        put_be24(&mut self.buffer.as_mut()[5..8], v);
    }
}

/// Owned DETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DethRepr {
    /// Queue key.
    pub qkey: u32,
    /// Source QP number (24 bits).
    pub src_qpn: u32,
}

impl DethRepr {
    /// Parses a checked view; never fails.
    pub fn parse<T: AsRef<[u8]>>(h: &Deth<T>) -> DethRepr {
        DethRepr {
            qkey: h.qkey(),
            src_qpn: h.src_qpn(),
        }
    }
    /// 8.
    pub const fn buffer_len(&self) -> usize {
        8
    }
    /// Writes the header.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, h: &mut Deth<T>) {
        h.set_qkey(self.qkey);
        h.set_src_qpn(self.src_qpn);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::Error;

    // DETH of tests/captures/53-ud-send-imm.pcap: Q_Key 0x11111111, source QP 0x2f.
    const BYTES: [u8; 8] = [0x11, 0x11, 0x11, 0x11, 0x00, 0x00, 0x00, 0x2f];

    #[test]
    fn round_trip_and_truncated() {
        let h = Deth::new_checked(&BYTES[..]).unwrap();
        assert_eq!((h.qkey(), h.src_qpn()), (0x1111_1111, 0x2f));
        let r = DethRepr::parse(&h);
        let mut buf = [0xffu8; 8];
        r.emit(&mut Deth::new_unchecked(&mut buf[..]));
        assert_eq!(buf, BYTES);
        for n in 0..8 {
            assert_eq!(Deth::new_checked(&BYTES[..n]).err(), Some(Error::Truncated));
        }
    }
}
