//! Base Transport Header (BTH).

use super::{BTH_LEN, Error, Opcode, Psn, Result, be16, be24, put_be24};

mod field {
    use core::ops::Range;
    pub const OPCODE: usize = 0;
    pub const FLAGS: usize = 1; // SE:7, M:6, PadCnt:5-4, TVer:3-0
    pub const PKEY: Range<usize> = 2..4;
    pub const FECN_BECN: usize = 4; // FECN:7, BECN:6, reserved:5-0
    pub const DEST_QPN: Range<usize> = 5..8;
    pub const ACK_REQ: usize = 8; // AckReq:7, reserved:6-0
    pub const PSN: Range<usize> = 9..12;
}

/// Base Transport Header (BTH): the first header of every RoCEv2 packet.
///
/// Shape: 12 bytes, big-endian: `opcode` u8 at 0; byte 1 = SE (bit 7), MigReq (bit 6),
/// PadCnt (bits 5–4), TVer (bits 3–0); `pkey` u16 at 2..4; byte 4 = FECN (bit 7), BECN (bit 6),
/// reserved; `dest_qpn` u24 at 5..8; byte 8 = AckReq (bit 7), reserved; `psn` u24 at 9..12.
/// Errors: [`Error::Truncated`] if fewer than 12 bytes.
/// Panics: never after `check_len`.
/// Source: IBTA Vol 1 ch. 9 (base transport header); rxe `rxe_hdr.h` `struct rxe_bth`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bth<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Bth<T> {
    /// Wraps a buffer without checking its length (for emission into a sized buffer).
    pub const fn new_unchecked(buffer: T) -> Bth<T> {
        Bth { buffer }
    }

    /// Wraps received bytes, checking that a whole BTH is present.
    pub fn new_checked(buffer: T) -> Result<Bth<T>> {
        let b = Self::new_unchecked(buffer);
        b.check_len()?;
        Ok(b)
    }

    /// [`Error::Truncated`] unless at least 12 bytes are present.
    pub fn check_len(&self) -> Result<()> {
        if self.buffer.as_ref().len() < BTH_LEN {
            Err(Error::Truncated)
        } else {
            Ok(())
        }
    }

    /// The wrapped buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// OpCode.
    pub fn opcode(&self) -> Opcode {
        Opcode(self.buffer.as_ref()[field::OPCODE])
    }
    /// Solicited event.
    pub fn se(&self) -> bool {
        self.buffer.as_ref()[field::FLAGS] & 0x80 != 0
    }
    /// Migration request.
    pub fn mig_req(&self) -> bool {
        self.buffer.as_ref()[field::FLAGS] & 0x40 != 0
    }
    /// Pad count, 0..=3 bytes.
    pub fn pad_count(&self) -> u8 {
        (self.buffer.as_ref()[field::FLAGS] >> 4) & 0x3
    }
    /// Transport header version (0 for IBTA 1.x).
    pub fn tver(&self) -> u8 {
        self.buffer.as_ref()[field::FLAGS] & 0x0f
    }
    /// Partition key.
    pub fn pkey(&self) -> u16 {
        be16(&self.buffer.as_ref()[field::PKEY])
    }
    /// Forward explicit congestion notification.
    pub fn fecn(&self) -> bool {
        self.buffer.as_ref()[field::FECN_BECN] & 0x80 != 0
    }
    /// Backward explicit congestion notification.
    pub fn becn(&self) -> bool {
        self.buffer.as_ref()[field::FECN_BECN] & 0x40 != 0
    }
    /// Destination QP number (24 bits).
    pub fn dest_qpn(&self) -> u32 {
        be24(&self.buffer.as_ref()[field::DEST_QPN])
    }
    /// Acknowledge request.
    pub fn ack_req(&self) -> bool {
        self.buffer.as_ref()[field::ACK_REQ] & 0x80 != 0
    }
    /// Packet sequence number.
    pub fn psn(&self) -> Psn {
        Psn::new(be24(&self.buffer.as_ref()[field::PSN]))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Bth<T> {
    /// Sets the opcode.
    pub fn set_opcode(&mut self, v: Opcode) {
        self.buffer.as_mut()[field::OPCODE] = v.0;
    }
    /// Sets byte 1 from its four fields (`pad_count` and `tver` are masked to their widths).
    pub fn set_flags(&mut self, se: bool, mig_req: bool, pad_count: u8, tver: u8) {
        self.buffer.as_mut()[field::FLAGS] = (u8::from(se) << 7)
            | (u8::from(mig_req) << 6)
            | ((pad_count & 0x3) << 4)
            | (tver & 0x0f);
    }
    /// Sets the partition key.
    pub fn set_pkey(&mut self, v: u16) {
        self.buffer.as_mut()[field::PKEY].copy_from_slice(&v.to_be_bytes());
    }
    /// Sets FECN and BECN; the reserved bits become 0.
    pub fn set_fecn_becn(&mut self, fecn: bool, becn: bool) {
        self.buffer.as_mut()[field::FECN_BECN] = (u8::from(fecn) << 7) | (u8::from(becn) << 6);
    }
    /// Sets the destination QPN (low 24 bits).
    pub fn set_dest_qpn(&mut self, v: u32) {
        put_be24(&mut self.buffer.as_mut()[field::DEST_QPN], v);
    }
    /// Sets AckReq; the reserved bits become 0.
    pub fn set_ack_req(&mut self, v: bool) {
        self.buffer.as_mut()[field::ACK_REQ] = u8::from(v) << 7;
    }
    /// Sets the PSN.
    pub fn set_psn(&mut self, v: Psn) {
        put_be24(&mut self.buffer.as_mut()[field::PSN], v.value());
    }
}

/// Owned, parsed BTH. Field names follow IBTA; see [`Bth`] for the layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BthRepr {
    /// OpCode.
    pub opcode: Opcode,
    /// Solicited event.
    pub se: bool,
    /// Migration request (rxe sends 0, ConnectX may send 1; receivers ignore it).
    pub mig_req: bool,
    /// Pad count (0..=3).
    pub pad_count: u8,
    /// Transport header version; a received value other than 0 is rejected by `parse`.
    pub tver: u8,
    /// Partition key.
    pub pkey: u16,
    /// FECN.
    pub fecn: bool,
    /// BECN.
    pub becn: bool,
    /// Destination QPN (24 bits).
    pub dest_qpn: u32,
    /// AckReq.
    pub ack_req: bool,
    /// PSN.
    pub psn: Psn,
}

impl BthRepr {
    /// A BTH with every flag as rxe sends a plain packet: SE, MigReq, FECN, BECN and AckReq
    /// clear, pad count 0, TVer 0, P_Key 0xFFFF ([`DEFAULT_PKEY`](super::DEFAULT_PKEY)).
    /// Callers set the flags a packet needs on the result. Source: rxe `init_req_packet`,
    /// `prepare_ack_packet` (docs/wire-facts.md §2.3).
    pub const fn new(opcode: Opcode, dest_qpn: u32, psn: Psn) -> BthRepr {
        BthRepr {
            opcode,
            se: false,
            mig_req: false,
            pad_count: 0,
            tver: 0,
            pkey: super::DEFAULT_PKEY,
            fecn: false,
            becn: false,
            dest_qpn,
            ack_req: false,
            psn,
        }
    }

    /// Parses a checked view. Errors: [`Error::BadTver`] when TVer ≠ 0 (rxe `hdr_check`).
    pub fn parse<T: AsRef<[u8]>>(bth: &Bth<T>) -> Result<BthRepr> {
        if bth.tver() != 0 {
            return Err(Error::BadTver(bth.tver()));
        }
        Ok(BthRepr {
            opcode: bth.opcode(),
            se: bth.se(),
            mig_req: bth.mig_req(),
            pad_count: bth.pad_count(),
            tver: bth.tver(),
            pkey: bth.pkey(),
            fecn: bth.fecn(),
            becn: bth.becn(),
            dest_qpn: bth.dest_qpn(),
            ack_req: bth.ack_req(),
            psn: bth.psn(),
        })
    }

    /// 12.
    pub const fn buffer_len(&self) -> usize {
        BTH_LEN
    }

    /// Writes the header into the first 12 bytes of `bth`.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, bth: &mut Bth<T>) {
        bth.set_opcode(self.opcode);
        bth.set_flags(self.se, self.mig_req, self.pad_count, self.tver);
        bth.set_pkey(self.pkey);
        bth.set_fecn_becn(self.fecn, self.becn);
        bth.set_dest_qpn(self.dest_qpn);
        bth.set_ack_req(self.ack_req);
        bth.set_psn(self.psn);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // First packet of tests/captures/13-write-bw.pcap (ib_write_bw, kernel rxe 6.1):
    // RC RDMA WRITE ONLY to QP 0x1a, AckReq, PSN 0x3999af.
    const BYTES: [u8; 12] = [
        0x0a, 0x00, 0xff, 0xff, 0x00, 0x00, 0x00, 0x1a, 0x80, 0x39, 0x99, 0xaf,
    ];

    fn repr() -> BthRepr {
        BthRepr {
            opcode: Opcode::RC_RDMA_WRITE_ONLY,
            se: false,
            mig_req: false,
            pad_count: 0,
            tver: 0,
            pkey: 0xffff,
            fecn: false,
            becn: false,
            dest_qpn: 0x1a,
            ack_req: true,
            psn: Psn::new(0x39_99af),
        }
    }

    #[test]
    fn deconstruct() {
        let b = Bth::new_checked(&BYTES[..]).unwrap();
        assert_eq!(b.opcode(), Opcode::RC_RDMA_WRITE_ONLY);
        assert!(!b.se() && !b.mig_req() && !b.fecn() && !b.becn());
        assert_eq!((b.pad_count(), b.tver(), b.pkey()), (0, 0, 0xffff));
        assert_eq!(b.dest_qpn(), 0x1a);
        assert!(b.ack_req());
        assert_eq!(b.psn(), Psn::new(0x39_99af));
    }

    #[test]
    fn construct() {
        let mut buf = [0xa5u8; 12];
        let mut b = Bth::new_unchecked(&mut buf[..]);
        b.set_opcode(Opcode::RC_RDMA_WRITE_ONLY);
        b.set_flags(false, false, 0, 0);
        b.set_pkey(0xffff);
        b.set_fecn_becn(false, false);
        b.set_dest_qpn(0x1a);
        b.set_ack_req(true);
        b.set_psn(Psn::new(0x39_99af));
        assert_eq!(buf, BYTES);
    }

    #[test]
    fn parse() {
        let b = Bth::new_checked(&BYTES[..]).unwrap();
        assert_eq!(BthRepr::parse(&b), Ok(repr()));
    }

    #[test]
    fn emit() {
        let mut buf = [0u8; 12];
        repr().emit(&mut Bth::new_unchecked(&mut buf[..]));
        assert_eq!(buf, BYTES);
    }

    #[test]
    fn truncated() {
        for n in 0..BTH_LEN {
            assert_eq!(Bth::new_checked(&BYTES[..n]).err(), Some(Error::Truncated));
        }
    }

    #[test]
    fn bad_tver() {
        let mut bytes = BYTES;
        bytes[1] = 0x01;
        let b = Bth::new_checked(&bytes[..]).unwrap();
        assert_eq!(BthRepr::parse(&b), Err(Error::BadTver(1)));
    }
}
