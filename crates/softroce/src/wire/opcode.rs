//! BTH opcodes and the per-opcode table: which headers follow the BTH, where the packet sits
//! in its message, and what it asks for. The same table is kept as data in `spec/opcodes.toml`
//! and the two are compared row by row in `tests/spec_tables.rs`.
//!
//! Source: IBTA Vol 1 ch. 9 (BTH OpCode field and the header-per-opcode table); kernel rxe
//! `rxe_opcode.c` `rxe_opcode[]`.

/// BTH opcode: bits 7–5 select the transport, bits 4–0 the operation.
///
/// Unknown and reserved code points are kept as values (`OpcodeInfo` lookup returns `None`),
/// so a receiver can count what it drops.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Opcode(pub u8);

macro_rules! opcodes {
    ($( $name:ident = $val:expr, $tr:ident, $kind:ident, $pos:ident, [$($h:ident)|*], $payload:expr; )*) => {
        impl Opcode {
            $( #[doc = concat!("`", stringify!($name), "` (", stringify!($val), ").")]
               pub const $name: Opcode = Opcode($val); )*
        }

        /// Every opcode softroce knows, in code-point order.
        pub const OPCODE_TABLE: &[OpcodeInfo] = &[
            $( OpcodeInfo {
                opcode: Opcode($val),
                name: stringify!($name),
                transport: Transport::$tr,
                kind: OpKind::$kind,
                position: Position::$pos,
                headers: ExtHeaders(0 $(| ExtHeaders::$h.0)*),
                payload: $payload,
            }, )*
        ];
    };
}

opcodes! {
    RC_SEND_FIRST = 0x00, Rc, Send, First, [], true;
    RC_SEND_MIDDLE = 0x01, Rc, Send, Middle, [], true;
    RC_SEND_LAST = 0x02, Rc, Send, Last, [], true;
    RC_SEND_LAST_WITH_IMMEDIATE = 0x03, Rc, Send, Last, [IMMDT], true;
    RC_SEND_ONLY = 0x04, Rc, Send, Only, [], true;
    RC_SEND_ONLY_WITH_IMMEDIATE = 0x05, Rc, Send, Only, [IMMDT], true;
    RC_RDMA_WRITE_FIRST = 0x06, Rc, RdmaWrite, First, [RETH], true;
    RC_RDMA_WRITE_MIDDLE = 0x07, Rc, RdmaWrite, Middle, [], true;
    RC_RDMA_WRITE_LAST = 0x08, Rc, RdmaWrite, Last, [], true;
    RC_RDMA_WRITE_LAST_WITH_IMMEDIATE = 0x09, Rc, RdmaWrite, Last, [IMMDT], true;
    RC_RDMA_WRITE_ONLY = 0x0a, Rc, RdmaWrite, Only, [RETH], true;
    RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE = 0x0b, Rc, RdmaWrite, Only, [RETH | IMMDT], true;
    RC_RDMA_READ_REQUEST = 0x0c, Rc, RdmaRead, Only, [RETH], false;
    RC_RDMA_READ_RESPONSE_FIRST = 0x0d, Rc, ReadResponse, First, [AETH], true;
    RC_RDMA_READ_RESPONSE_MIDDLE = 0x0e, Rc, ReadResponse, Middle, [], true;
    RC_RDMA_READ_RESPONSE_LAST = 0x0f, Rc, ReadResponse, Last, [AETH], true;
    RC_RDMA_READ_RESPONSE_ONLY = 0x10, Rc, ReadResponse, Only, [AETH], true;
    RC_ACKNOWLEDGE = 0x11, Rc, Acknowledge, Only, [AETH], false;
    RC_ATOMIC_ACKNOWLEDGE = 0x12, Rc, AtomicAcknowledge, Only, [AETH | ATOMIC_ACK_ETH], false;
    RC_COMPARE_SWAP = 0x13, Rc, CompareSwap, Only, [ATOMIC_ETH], false;
    RC_FETCH_ADD = 0x14, Rc, FetchAdd, Only, [ATOMIC_ETH], false;
    RC_SEND_LAST_WITH_INVALIDATE = 0x16, Rc, Send, Last, [IETH], true;
    RC_SEND_ONLY_WITH_INVALIDATE = 0x17, Rc, Send, Only, [IETH], true;
    RC_FLUSH = 0x1c, Rc, Flush, Only, [FETH | RETH], false;
    RC_ATOMIC_WRITE = 0x1d, Rc, AtomicWrite, Only, [RETH], true;
    UC_SEND_FIRST = 0x20, Uc, Send, First, [], true;
    UC_SEND_MIDDLE = 0x21, Uc, Send, Middle, [], true;
    UC_SEND_LAST = 0x22, Uc, Send, Last, [], true;
    UC_SEND_LAST_WITH_IMMEDIATE = 0x23, Uc, Send, Last, [IMMDT], true;
    UC_SEND_ONLY = 0x24, Uc, Send, Only, [], true;
    UC_SEND_ONLY_WITH_IMMEDIATE = 0x25, Uc, Send, Only, [IMMDT], true;
    UC_RDMA_WRITE_FIRST = 0x26, Uc, RdmaWrite, First, [RETH], true;
    UC_RDMA_WRITE_MIDDLE = 0x27, Uc, RdmaWrite, Middle, [], true;
    UC_RDMA_WRITE_LAST = 0x28, Uc, RdmaWrite, Last, [], true;
    UC_RDMA_WRITE_LAST_WITH_IMMEDIATE = 0x29, Uc, RdmaWrite, Last, [IMMDT], true;
    UC_RDMA_WRITE_ONLY = 0x2a, Uc, RdmaWrite, Only, [RETH], true;
    UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE = 0x2b, Uc, RdmaWrite, Only, [RETH | IMMDT], true;
    UD_SEND_ONLY = 0x64, Ud, Send, Only, [DETH], true;
    UD_SEND_ONLY_WITH_IMMEDIATE = 0x65, Ud, Send, Only, [DETH | IMMDT], true;
    CNP = 0x81, Cnp, Cnp, Only, [], true;
}

/// Transport class in BTH opcode bits 7–5. Source: IBTA Vol 1 ch. 9 (OpCode field).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// Reliable connected, 0b000.
    Rc,
    /// Unreliable connected, 0b001.
    Uc,
    /// Reliable datagram, 0b010 (not implemented; its opcodes are unknown to softroce).
    Rd,
    /// Unreliable datagram, 0b011.
    Ud,
    /// Congestion notification packet, 0b100 (opcode 0x81).
    Cnp,
    /// Extended reliable connected, 0b101 (not implemented).
    Xrc,
}

/// What a packet asks the receiver to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpKind {
    /// SEND (consumes a receive WQE at the responder).
    Send,
    /// RDMA WRITE.
    RdmaWrite,
    /// RDMA READ request.
    RdmaRead,
    /// RDMA READ response (carries data back to the requester).
    ReadResponse,
    /// ACKNOWLEDGE (ACK or NAK, by the AETH syndrome).
    Acknowledge,
    /// ATOMIC ACKNOWLEDGE (carries the original remote value).
    AtomicAcknowledge,
    /// COMPARE_SWAP.
    CompareSwap,
    /// FETCH_ADD.
    FetchAdd,
    /// FLUSH (persistence; kernel 6.2+).
    Flush,
    /// ATOMIC WRITE (8 bytes; kernel 6.2+).
    AtomicWrite,
    /// Congestion notification (RoCEv2 CNP, opcode 0x81): BTH with BECN set, then 16 reserved
    /// bytes, which the packet layer carries as its payload. Neither a request nor a response:
    /// a receiver counts it and executes nothing.
    Cnp,
}

/// Where a packet sits in its message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Position {
    /// First packet of a multi-packet message.
    First,
    /// Neither first nor last.
    Middle,
    /// Last packet of a multi-packet message.
    Last,
    /// A one-packet message (also every non-segmented opcode: READ request, ACK, atomics).
    Only,
}

impl Position {
    /// True for FIRST and ONLY: the packet starts a message.
    pub const fn starts_message(self) -> bool {
        matches!(self, Position::First | Position::Only)
    }
    /// True for LAST and ONLY: the packet ends a message.
    pub const fn ends_message(self) -> bool {
        matches!(self, Position::Last | Position::Only)
    }
}

/// The set of extension headers that follow the BTH, as bit flags. On the wire they appear in
/// this fixed order: RDETH, DETH, FETH, RETH, AtomicETH, AETH, AtomicAckETH, ImmDt, IETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ExtHeaders(pub u16);

impl ExtHeaders {
    /// Datagram Extended Transport Header (8 bytes).
    pub const DETH: ExtHeaders = ExtHeaders(1 << 0);
    /// Flush Extended Transport Header (4 bytes).
    pub const FETH: ExtHeaders = ExtHeaders(1 << 1);
    /// RDMA Extended Transport Header (16 bytes).
    pub const RETH: ExtHeaders = ExtHeaders(1 << 2);
    /// Atomic Extended Transport Header (28 bytes).
    pub const ATOMIC_ETH: ExtHeaders = ExtHeaders(1 << 3);
    /// ACK Extended Transport Header (4 bytes).
    pub const AETH: ExtHeaders = ExtHeaders(1 << 4);
    /// Atomic ACK Extended Transport Header (8 bytes).
    pub const ATOMIC_ACK_ETH: ExtHeaders = ExtHeaders(1 << 5);
    /// Immediate data (4 bytes).
    pub const IMMDT: ExtHeaders = ExtHeaders(1 << 6);
    /// Invalidate Extended Transport Header (4 bytes).
    pub const IETH: ExtHeaders = ExtHeaders(1 << 7);

    /// Wire order and length in bytes of each header.
    pub const ORDER: [(ExtHeaders, usize, &'static str); 8] = [
        (Self::DETH, 8, "DETH"),
        (Self::FETH, 4, "FETH"),
        (Self::RETH, 16, "RETH"),
        (Self::ATOMIC_ETH, 28, "AtomicETH"),
        (Self::AETH, 4, "AETH"),
        (Self::ATOMIC_ACK_ETH, 8, "AtomicAckETH"),
        (Self::IMMDT, 4, "ImmDt"),
        (Self::IETH, 4, "IETH"),
    ];

    /// True when every flag of `other` is set in `self`.
    pub const fn contains(self, other: ExtHeaders) -> bool {
        self.0 & other.0 == other.0
    }

    /// Byte offset of header `h` from the start of the BTH, if present.
    pub fn offset_of(self, h: ExtHeaders) -> Option<usize> {
        if !self.contains(h) {
            return None;
        }
        let mut off = super::BTH_LEN;
        for (flag, len, _) in Self::ORDER {
            if flag == h {
                return Some(off);
            }
            if self.contains(flag) {
                off += len;
            }
        }
        None
    }

    /// Total length in bytes of BTH plus the extension headers.
    pub fn header_len(self) -> usize {
        let mut off = super::BTH_LEN;
        for (flag, len, _) in Self::ORDER {
            if self.contains(flag) {
                off += len;
            }
        }
        off
    }
}

impl core::ops::BitOr for ExtHeaders {
    type Output = ExtHeaders;
    fn bitor(self, rhs: ExtHeaders) -> ExtHeaders {
        ExtHeaders(self.0 | rhs.0)
    }
}

/// One row of the opcode table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpcodeInfo {
    /// The code point.
    pub opcode: Opcode,
    /// Kernel / Wireshark-style name, e.g. `RC_RDMA_WRITE_FIRST`.
    pub name: &'static str,
    /// Transport class (bits 7–5).
    pub transport: Transport,
    /// What the packet does.
    pub kind: OpKind,
    /// Place in the message.
    pub position: Position,
    /// Extension headers after the BTH.
    pub headers: ExtHeaders,
    /// Whether the opcode may carry payload bytes.
    pub payload: bool,
}

impl OpcodeInfo {
    /// True for packets a requester sends (requests), false for responses (ACK, READ
    /// response, ATOMIC ACKNOWLEDGE) and for CNPs, which belong to neither side.
    pub const fn is_request(&self) -> bool {
        !matches!(
            self.kind,
            OpKind::ReadResponse | OpKind::Acknowledge | OpKind::AtomicAcknowledge | OpKind::Cnp
        )
    }
}

impl Opcode {
    /// The table row for this opcode, or `None` for a reserved / unsupported code point
    /// (RD, XRC, 0x15, manufacturer-specific).
    pub fn info(self) -> Option<&'static OpcodeInfo> {
        OPCODE_TABLE.iter().find(|row| row.opcode == self)
    }

    /// The opcode of the table row for `transport`, `kind` and `position` whose extension
    /// headers include ImmDt exactly when `with_immdt` and an IETH exactly when
    /// `with_ieth` (the `_WITH_IMMEDIATE` and `_WITH_INVALIDATE` variants), or `None` if
    /// no row has that shape (UC has no SEND with Invalidate, nothing has both).
    /// Source: the table, as rxe `rxe_req.c` `next_opcode` chooses from `rxe_opcode[]`.
    pub const fn lookup(
        transport: Transport,
        kind: OpKind,
        position: Position,
        with_immdt: bool,
        with_ieth: bool,
    ) -> Option<Opcode> {
        let mut i = 0;
        while i < OPCODE_TABLE.len() {
            let row = &OPCODE_TABLE[i];
            if row.transport as u8 == transport as u8
                && row.kind as u8 == kind as u8
                && row.position as u8 == position as u8
                && row.headers.contains(ExtHeaders::IMMDT) == with_immdt
                && row.headers.contains(ExtHeaders::IETH) == with_ieth
            {
                return Some(row.opcode);
            }
            i += 1;
        }
        None
    }

    /// Transport class from bits 7–5.
    pub const fn transport_bits(self) -> u8 {
        self.0 >> 5
    }
}

impl core::fmt::Display for Opcode {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self.info() {
            Some(row) => f.write_str(row.name),
            None => write!(f, "UNKNOWN_{:#04x}", self.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_sorted_and_unique() {
        for w in OPCODE_TABLE.windows(2) {
            assert!(
                w[0].opcode < w[1].opcode,
                "{} then {}",
                w[0].name,
                w[1].name
            );
        }
    }

    #[test]
    fn transport_bits_match_rows() {
        for row in OPCODE_TABLE {
            let want = match row.transport {
                Transport::Rc => 0,
                Transport::Uc => 1,
                Transport::Rd => 2,
                Transport::Ud => 3,
                Transport::Cnp => 4,
                Transport::Xrc => 5,
            };
            assert_eq!(row.opcode.transport_bits(), want, "{}", row.name);
        }
    }

    #[test]
    fn offsets_follow_wire_order() {
        let h = ExtHeaders::RETH | ExtHeaders::IMMDT;
        assert_eq!(h.offset_of(ExtHeaders::RETH), Some(12));
        assert_eq!(h.offset_of(ExtHeaders::IMMDT), Some(28));
        assert_eq!(h.header_len(), 32);
        let a = ExtHeaders::AETH | ExtHeaders::ATOMIC_ACK_ETH;
        assert_eq!(a.offset_of(ExtHeaders::ATOMIC_ACK_ETH), Some(16));
        assert_eq!(a.offset_of(ExtHeaders::RETH), None);
    }

    #[test]
    fn lookup_finds_every_row_by_its_shape() {
        for row in OPCODE_TABLE {
            let found = Opcode::lookup(
                row.transport,
                row.kind,
                row.position,
                row.headers.contains(ExtHeaders::IMMDT),
                row.headers.contains(ExtHeaders::IETH),
            );
            assert_eq!(found, Some(row.opcode), "{}", row.name);
        }
        let uc_send_inv = Opcode::lookup(Transport::Uc, OpKind::Send, Position::Last, false, true);
        assert_eq!(uc_send_inv, None);
    }

    #[test]
    fn reserved_codes_are_unknown() {
        for op in [0x15u8, 0x18, 0x40, 0x80, 0x82, 0xa0, 0xb7, 0xe0] {
            assert!(Opcode(op).info().is_none(), "{op:#x}");
        }
        assert_eq!(Opcode(0x15).to_string(), "UNKNOWN_0x15");
        assert_eq!(Opcode(0x81).to_string(), "CNP");
        assert_eq!(
            Opcode::RC_RDMA_WRITE_FIRST.to_string(),
            "RC_RDMA_WRITE_FIRST"
        );
    }
}
