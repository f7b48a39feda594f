//! ACK Extended Transport Header (AETH) and its syndrome.

use super::{be24, put_be24};

header_view!(
    /// ACK Extended Transport Header (AETH). It follows the BTH in ACKNOWLEDGE, ATOMIC
    /// ACKNOWLEDGE and READ RESPONSE FIRST/LAST/ONLY packets.
    ///
    /// Shape: 4 bytes: `syndrome` u8 at 0, `msn` u24 big-endian at 1..4.
    /// Errors: `Truncated` if fewer than 4 bytes. Panics: never after `check_len`.
    /// Source: IBTA Vol 1 ch. 9 (AETH); rxe `rxe_hdr.h` `struct rxe_aeth`.
    Aeth,
    4
);

impl<T: AsRef<[u8]>> Aeth<T> {
    /// Raw syndrome byte.
    pub fn syndrome(&self) -> u8 {
        self.buffer.as_ref()[0]
    }
    /// Message sequence number (24 bits).
    pub fn msn(&self) -> u32 {
        be24(&self.buffer.as_ref()[1..4])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Aeth<T> {
    /// Sets the syndrome byte.
    pub fn set_syndrome(&mut self, v: u8) {
        self.buffer.as_mut()[0] = v;
    }
    /// Sets the MSN (low 24 bits).
    pub fn set_msn(&mut self, v: u32) {
        put_be24(&mut self.buffer.as_mut()[1..4], v);
    }
}

/// Owned AETH; see [`Aeth`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AethRepr {
    /// Raw syndrome byte; decode with [`AethSyndrome::from_byte`].
    pub syndrome: u8,
    /// Message sequence number (24 bits).
    pub msn: u32,
}

impl AethRepr {
    /// Parses a checked view; never fails (a reserved syndrome is kept as a value).
    pub fn parse<T: AsRef<[u8]>>(h: &Aeth<T>) -> AethRepr {
        AethRepr {
            syndrome: h.syndrome(),
            msn: h.msn(),
        }
    }
    /// 4.
    pub const fn buffer_len(&self) -> usize {
        4
    }
    /// Writes the header.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, h: &mut Aeth<T>) {
        h.set_syndrome(self.syndrome);
        h.set_msn(self.msn);
    }
}

/// NAK codes (AETH syndrome type 0b11, low 5 bits).
/// Source: IBTA Vol 1 ch. 9 (AETH syndrome encoding); rxe `rxe_hdr.h` `enum aeth_syndrome`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NakCode {
    /// 0: PSN sequence error; the AETH's PSN is the expected one.
    PsnSeqErr,
    /// 1: invalid request.
    InvalidRequest,
    /// 2: remote access error (rkey, bounds, access rights).
    RemoteAccessErr,
    /// 3: remote operational error.
    RemoteOpErr,
    /// 4: invalid RD request.
    InvalidRdRequest,
    /// Any other (reserved) code.
    Reserved(u8),
}

impl NakCode {
    /// The 5-bit code.
    pub const fn code(self) -> u8 {
        match self {
            NakCode::PsnSeqErr => 0,
            NakCode::InvalidRequest => 1,
            NakCode::RemoteAccessErr => 2,
            NakCode::RemoteOpErr => 3,
            NakCode::InvalidRdRequest => 4,
            NakCode::Reserved(c) => c & 0x1f,
        }
    }
    /// From the 5-bit code.
    pub const fn from_code(c: u8) -> NakCode {
        match c & 0x1f {
            0 => NakCode::PsnSeqErr,
            1 => NakCode::InvalidRequest,
            2 => NakCode::RemoteAccessErr,
            3 => NakCode::RemoteOpErr,
            4 => NakCode::InvalidRdRequest,
            c => NakCode::Reserved(c),
        }
    }
}

/// Decoded AETH syndrome.
///
/// Shape: bit 7 reserved (0), bits 6–5 type (00 ACK, 01 RNR NAK, 10 reserved, 11 NAK),
/// bits 4–0 credit count (ACK), RNR timer code (RNR NAK) or NAK code.
/// Source: IBTA Vol 1 ch. 9 (AETH syndrome); rxe sends `Ack { credit: 31 }` on every ACK.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AethSyndrome {
    /// Positive acknowledgement with a credit code (31 = not flow controlled).
    Ack {
        /// Credit code 0..=31.
        credit: u8,
    },
    /// Receiver not ready; retry after the time that `timer` encodes (see
    /// [`RNR_TIMER_TABLE_US`]).
    RnrNak {
        /// RNR timer code 0..=31.
        timer: u8,
    },
    /// Negative acknowledgement.
    Nak(NakCode),
    /// Bit 7 set or type 0b10: not a valid syndrome.
    Reserved(u8),
}

impl AethSyndrome {
    /// The ACK that rxe sends: credit code 31, "invalid / not flow controlled" (0x1f).
    pub const ACK_UNLIMITED: AethSyndrome = AethSyndrome::Ack { credit: 0x1f };

    /// Decodes a syndrome byte.
    pub const fn from_byte(b: u8) -> AethSyndrome {
        if b & 0x80 != 0 {
            return AethSyndrome::Reserved(b);
        }
        match (b >> 5) & 0x3 {
            0 => AethSyndrome::Ack { credit: b & 0x1f },
            1 => AethSyndrome::RnrNak { timer: b & 0x1f },
            3 => AethSyndrome::Nak(NakCode::from_code(b)),
            _ => AethSyndrome::Reserved(b),
        }
    }

    /// Encodes to the syndrome byte.
    pub const fn to_byte(self) -> u8 {
        match self {
            AethSyndrome::Ack { credit } => credit & 0x1f,
            AethSyndrome::RnrNak { timer } => 0x20 | (timer & 0x1f),
            AethSyndrome::Nak(code) => 0x60 | code.code(),
            AethSyndrome::Reserved(b) => b,
        }
    }
}

impl core::fmt::Display for NakCode {
    /// What the code means, as `softroce decode` and the trace events print it, e.g.
    /// "remote access error".
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            NakCode::PsnSeqErr => f.write_str("PSN sequence error"),
            NakCode::InvalidRequest => f.write_str("invalid request"),
            NakCode::RemoteAccessErr => f.write_str("remote access error"),
            NakCode::RemoteOpErr => f.write_str("remote operational error"),
            NakCode::InvalidRdRequest => f.write_str("invalid RD request"),
            NakCode::Reserved(c) => write!(f, "reserved code {c}"),
        }
    }
}

impl core::fmt::Display for AethSyndrome {
    /// The syndrome's meaning: "ACK credit=31", "RNR NAK timer=12", "NAK remote access
    /// error", "reserved syndrome 0x40".
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            AethSyndrome::Ack { credit } => write!(f, "ACK credit={credit}"),
            AethSyndrome::RnrNak { timer } => write!(f, "RNR NAK timer={timer}"),
            AethSyndrome::Nak(code) => write!(f, "NAK {code}"),
            AethSyndrome::Reserved(b) => write!(f, "reserved syndrome {b:#04x}"),
        }
    }
}

/// RNR NAK timer codes → minimum wait in µs (index = the 5-bit code; code 0 is the longest).
/// Source: IBTA Vol 1 ch. 9 (RNR NAK timer field encoding); rxe `rxe_comp.c` `rnrnak_usec`;
/// also `spec/rnr_timer.toml`.
pub const RNR_TIMER_TABLE_US: [u32; 32] = [
    655_360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1_280, 1_920, 2_560, 3_840,
    5_120, 7_680, 10_240, 15_360, 20_480, 30_720, 40_960, 61_440, 81_920, 122_880, 163_840,
    245_760, 327_680, 491_520,
];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::Error;

    #[test]
    fn syndromes_print_their_meaning() {
        let text = |b: u8| AethSyndrome::from_byte(b).to_string();
        assert_eq!(text(0x1f), "ACK credit=31");
        assert_eq!(text(0x2c), "RNR NAK timer=12");
        assert_eq!(text(0x60), "NAK PSN sequence error");
        assert_eq!(text(0x61), "NAK invalid request");
        assert_eq!(text(0x62), "NAK remote access error");
        assert_eq!(text(0x63), "NAK remote operational error");
        assert_eq!(text(0x64), "NAK invalid RD request");
        assert_eq!(text(0x7f), "NAK reserved code 31");
        assert_eq!(text(0x40), "reserved syndrome 0x40");
    }

    // AETH of the NAK in tests/captures/54-nak-write-rkey.pcap: remote access error, MSN 0.
    const NAK: [u8; 4] = [0x62, 0x00, 0x00, 0x00];
    // AETH of the first ACK in tests/captures/13-write-bw.pcap: credit 31, MSN 1.
    const ACK: [u8; 4] = [0x1f, 0x00, 0x00, 0x01];

    #[test]
    fn deconstruct() {
        let h = Aeth::new_checked(&ACK[..]).unwrap();
        assert_eq!((h.syndrome(), h.msn()), (0x1f, 1));
        assert_eq!(
            AethSyndrome::from_byte(h.syndrome()),
            AethSyndrome::ACK_UNLIMITED
        );
        let n = Aeth::new_checked(&NAK[..]).unwrap();
        assert_eq!(
            AethSyndrome::from_byte(n.syndrome()),
            AethSyndrome::Nak(NakCode::RemoteAccessErr)
        );
    }
    #[test]
    fn construct() {
        let mut buf = [0xffu8; 4];
        let mut h = Aeth::new_unchecked(&mut buf[..]);
        h.set_syndrome(0x1f);
        h.set_msn(1);
        assert_eq!(buf, ACK);
    }
    #[test]
    fn parse() {
        let r = AethRepr::parse(&Aeth::new_checked(&NAK[..]).unwrap());
        assert_eq!(
            r,
            AethRepr {
                syndrome: 0x62,
                msn: 0
            }
        );
    }
    #[test]
    fn emit() {
        let mut buf = [0u8; 4];
        AethRepr {
            syndrome: 0x1f,
            msn: 1,
        }
        .emit(&mut Aeth::new_unchecked(&mut buf[..]));
        assert_eq!(buf, ACK);
    }
    #[test]
    fn truncated() {
        for n in 0..4 {
            assert_eq!(Aeth::new_checked(&ACK[..n]).err(), Some(Error::Truncated));
        }
    }
    #[test]
    fn syndrome_round_trip_all_bytes() {
        for b in 0..=255u8 {
            assert_eq!(AethSyndrome::from_byte(b).to_byte(), b);
        }
        assert_eq!(AethSyndrome::RnrNak { timer: 20 }.to_byte(), 0x34);
    }
}
