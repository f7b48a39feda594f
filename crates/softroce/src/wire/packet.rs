//! A whole RoCEv2 packet (UDP payload): BTH, extension headers by opcode, payload, pad, ICRC.

use super::{
    Aeth, AethRepr, AtomicAckEth, AtomicAckEthRepr, AtomicEth, AtomicEthRepr, Bth, BthRepr, Deth,
    DethRepr, Error, ExtHeaders, ICRC_LEN, IcrcIp, Ieth, IethRepr, ImmDt, ImmDtRepr, OpcodeInfo,
    Result, Reth, RethRepr, be32, icrc_of_body, icrc_of_datagram, pad_count,
};

/// Everything in a RoCEv2 packet except the payload bytes: the BTH and the extension headers
/// its opcode calls for, plus the payload length.
///
/// Shape: see [`ExtHeaders::ORDER`] for the order of the headers after the BTH.
/// Source: IBTA Vol 1 ch. 9 (packet format per opcode); rxe `rxe_opcode.c`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PacketRepr {
    /// Base transport header. On emit, `pad_count` is recomputed from `payload_len`.
    pub bth: BthRepr,
    /// DETH (UD).
    pub deth: Option<DethRepr>,
    /// FETH (FLUSH): raw 32-bit word.
    pub feth: Option<u32>,
    /// RETH (WRITE FIRST/ONLY, READ request, FLUSH, ATOMIC WRITE).
    pub reth: Option<RethRepr>,
    /// AtomicETH (CMP_SWAP, FETCH_ADD).
    pub atomic_eth: Option<AtomicEthRepr>,
    /// AETH (ACK, READ response FIRST/LAST/ONLY, ATOMIC ACKNOWLEDGE).
    pub aeth: Option<AethRepr>,
    /// AtomicAckETH (ATOMIC ACKNOWLEDGE).
    pub atomic_ack_eth: Option<AtomicAckEthRepr>,
    /// ImmDt (… WITH_IMMEDIATE).
    pub immdt: Option<ImmDtRepr>,
    /// IETH (SEND … WITH_INVALIDATE).
    pub ieth: Option<IethRepr>,
    /// Payload length in bytes (pad and ICRC excluded).
    pub payload_len: usize,
}

impl PacketRepr {
    /// A repr with only a BTH; set the extension headers the opcode needs before emitting.
    pub fn new(bth: BthRepr) -> PacketRepr {
        PacketRepr {
            bth,
            deth: None,
            feth: None,
            reth: None,
            atomic_eth: None,
            aeth: None,
            atomic_ack_eth: None,
            immdt: None,
            ieth: None,
            payload_len: 0,
        }
    }

    /// The set of extension headers present.
    pub fn headers(&self) -> ExtHeaders {
        let mut h = ExtHeaders::default();
        let pairs = [
            (self.deth.is_some(), ExtHeaders::DETH),
            (self.feth.is_some(), ExtHeaders::FETH),
            (self.reth.is_some(), ExtHeaders::RETH),
            (self.atomic_eth.is_some(), ExtHeaders::ATOMIC_ETH),
            (self.aeth.is_some(), ExtHeaders::AETH),
            (self.atomic_ack_eth.is_some(), ExtHeaders::ATOMIC_ACK_ETH),
            (self.immdt.is_some(), ExtHeaders::IMMDT),
            (self.ieth.is_some(), ExtHeaders::IETH),
        ];
        for (present, flag) in pairs {
            if present {
                h = h | flag;
            }
        }
        h
    }

    /// BTH plus extension headers, in bytes.
    pub fn header_len(&self) -> usize {
        self.headers().header_len()
    }

    /// Whole UDP payload length in bytes: headers + payload + pad + ICRC.
    pub fn buffer_len(&self) -> usize {
        self.header_len() + self.payload_len + usize::from(pad_count(self.payload_len)) + ICRC_LEN
    }

    /// Writes the BTH and extension headers into `buf[..header_len()]`, with the pad count
    /// computed from `payload_len`. The payload goes at `buf[header_len()..]`; then call
    /// [`PacketRepr::finish`].
    ///
    /// Panics: if `buf` is shorter than `header_len()` (a programmer error: we size our own
    /// buffers).
    pub fn emit_headers(&self, buf: &mut [u8]) {
        let hdrs = self.headers();
        let mut bth = self.bth;
        bth.pad_count = pad_count(self.payload_len);
        bth.emit(&mut Bth::new_unchecked(&mut buf[..12]));
        let at = |flag| hdrs.offset_of(flag).unwrap_or(0);
        if let Some(r) = self.deth {
            let o = at(ExtHeaders::DETH);
            r.emit(&mut Deth::new_unchecked(&mut buf[o..o + 8]));
        }
        if let Some(v) = self.feth {
            let o = at(ExtHeaders::FETH);
            buf[o..o + 4].copy_from_slice(&v.to_be_bytes());
        }
        if let Some(r) = self.reth {
            let o = at(ExtHeaders::RETH);
            r.emit(&mut Reth::new_unchecked(&mut buf[o..o + 16]));
        }
        if let Some(r) = self.atomic_eth {
            let o = at(ExtHeaders::ATOMIC_ETH);
            r.emit(&mut AtomicEth::new_unchecked(&mut buf[o..o + 28]));
        }
        if let Some(r) = self.aeth {
            let o = at(ExtHeaders::AETH);
            r.emit(&mut Aeth::new_unchecked(&mut buf[o..o + 4]));
        }
        if let Some(r) = self.atomic_ack_eth {
            let o = at(ExtHeaders::ATOMIC_ACK_ETH);
            r.emit(&mut AtomicAckEth::new_unchecked(&mut buf[o..o + 8]));
        }
        if let Some(r) = self.immdt {
            let o = at(ExtHeaders::IMMDT);
            r.emit(&mut ImmDt::new_unchecked(&mut buf[o..o + 4]));
        }
        if let Some(r) = self.ieth {
            let o = at(ExtHeaders::IETH);
            r.emit(&mut Ieth::new_unchecked(&mut buf[o..o + 4]));
        }
    }

    /// Writes the zero pad bytes and the ICRC for flow `ip` into `buf[..buffer_len()]`, whose
    /// headers and payload are already in place.
    ///
    /// Panics: if `buf` is shorter than `buffer_len()` (a programmer error).
    pub fn finish(&self, buf: &mut [u8], ip: &IcrcIp) {
        let end = self.buffer_len();
        let pad_at = self.header_len() + self.payload_len;
        for b in &mut buf[pad_at..end - ICRC_LEN] {
            *b = 0;
        }
        let icrc = icrc_of_datagram(ip, &buf[..end]);
        buf[end - ICRC_LEN..end].copy_from_slice(&icrc);
    }

    /// Emits a whole packet (headers, `payload`, pad, ICRC) into `buf`, which must hold at
    /// least `buffer_len()` bytes. Returns the number of bytes written.
    ///
    /// Panics: if `payload.len() != payload_len` or `buf` is too short (programmer errors).
    pub fn emit(&self, buf: &mut [u8], payload: &[u8], ip: &IcrcIp) -> usize {
        assert_eq!(
            payload.len(),
            self.payload_len,
            "payload length disagrees with the repr"
        );
        let h = self.header_len();
        self.emit_headers(buf);
        buf[h..h + payload.len()].copy_from_slice(payload);
        self.finish(buf, ip);
        self.buffer_len()
    }
}

/// A parsed RoCEv2 packet borrowing its payload from the received bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RocePacket<'a> {
    /// Headers.
    pub repr: PacketRepr,
    /// The opcode's table row.
    pub info: &'static OpcodeInfo,
    /// Payload bytes (pad and ICRC excluded).
    pub payload: &'a [u8],
    /// The ICRC bytes as received.
    pub icrc: [u8; 4],
    /// Everything before the ICRC (the bytes the ICRC covers after the IP/UDP headers).
    pub body: &'a [u8],
}

impl<'a> RocePacket<'a> {
    /// Parses a UDP payload. Checks, in rxe's order: a BTH fits; TVer = 0; the opcode is known;
    /// the headers, pad and ICRC fit; an opcode without payload has none and no pad.
    /// The ICRC is *not* checked here (see [`RocePacket::icrc_ok`]).
    ///
    /// Errors: [`Error::Truncated`], [`Error::BadTver`], [`Error::UnknownOpcode`],
    /// [`Error::BadPadCount`], [`Error::LengthMismatch`]. Panics: never. Allocates: never.
    /// Source: rxe `rxe_recv.c` `rxe_rcv` and `hdr_check`; `rxe_hdr.h` `payload_size`.
    pub fn parse(data: &'a [u8]) -> Result<RocePacket<'a>> {
        let bth_view = Bth::new_checked(data)?;
        let bth = BthRepr::parse(&bth_view)?;
        let info = bth
            .opcode
            .info()
            .ok_or(Error::UnknownOpcode(bth.opcode.0))?;
        let hdrs = info.headers;
        let hlen = hdrs.header_len();
        let pad = usize::from(bth.pad_count);
        if data.len() < hlen + pad + ICRC_LEN {
            return Err(Error::Truncated);
        }
        let payload_len = data.len() - hlen - pad - ICRC_LEN;
        if !info.payload && payload_len != 0 {
            return Err(Error::LengthMismatch);
        }
        if !info.payload && pad != 0 {
            return Err(Error::BadPadCount);
        }
        let slice = |flag: ExtHeaders, len: usize| -> Option<&'a [u8]> {
            hdrs.offset_of(flag).and_then(|o| data.get(o..o + len))
        };
        let mut repr = PacketRepr::new(bth);
        repr.payload_len = payload_len;
        if let Some(s) = slice(ExtHeaders::DETH, 8) {
            repr.deth = Some(DethRepr::parse(&Deth::new_checked(s)?));
        }
        if let Some(s) = slice(ExtHeaders::FETH, 4) {
            repr.feth = Some(be32(s));
        }
        if let Some(s) = slice(ExtHeaders::RETH, 16) {
            repr.reth = Some(RethRepr::parse(&Reth::new_checked(s)?));
        }
        if let Some(s) = slice(ExtHeaders::ATOMIC_ETH, 28) {
            repr.atomic_eth = Some(AtomicEthRepr::parse(&AtomicEth::new_checked(s)?));
        }
        if let Some(s) = slice(ExtHeaders::AETH, 4) {
            repr.aeth = Some(AethRepr::parse(&Aeth::new_checked(s)?));
        }
        if let Some(s) = slice(ExtHeaders::ATOMIC_ACK_ETH, 8) {
            repr.atomic_ack_eth = Some(AtomicAckEthRepr::parse(&AtomicAckEth::new_checked(s)?));
        }
        if let Some(s) = slice(ExtHeaders::IMMDT, 4) {
            repr.immdt = Some(ImmDtRepr::parse(&ImmDt::new_checked(s)?));
        }
        if let Some(s) = slice(ExtHeaders::IETH, 4) {
            repr.ieth = Some(IethRepr::parse(&Ieth::new_checked(s)?));
        }
        let body_end = data.len() - ICRC_LEN;
        let mut icrc = [0u8; 4];
        icrc.copy_from_slice(&data[body_end..]);
        Ok(RocePacket {
            repr,
            info,
            payload: &data[hlen..hlen + payload_len],
            icrc,
            body: &data[..body_end],
        })
    }

    /// True when the received ICRC matches the one computed for flow `ip`.
    pub fn icrc_ok(&self, ip: &IcrcIp) -> bool {
        // Under fuzzing every ICRC passes so that inputs reach deeper code (smoltcp habit).
        if cfg!(fuzzing) {
            return true;
        }
        icrc_of_body(ip, self.body) == self.icrc
    }
}
