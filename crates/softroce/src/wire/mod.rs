//! Wire layer: bytes <-> RoCEv2 headers. No state, no I/O, no allocation, no panic.
//!
//! Contract (the smoltcp one, in our words):
//! - A header view `Xxx<T: AsRef<[u8]>>` is built with `new_checked`, which calls `check_len`;
//!   after that succeeds, no getter and no `XxxRepr::parse` panics.
//! - `XxxRepr::emit` never panics on a buffer of at least `XxxRepr::buffer_len()` bytes; it is
//!   used on buffers we size ourselves (`new_unchecked` views are for emission only).
//! - Every way received bytes can be wrong is one [`Error`] variant, and every variant maps to
//!   exactly one [`crate::transport::DropReason`], so every dropped packet is counted by reason.
//!
//! Layout of a RoCEv2 datagram (UDP payload, destination port [`ROCE_V2_UDP_PORT`]):
//! `BTH (12) ‖ extension headers (by opcode) ‖ payload ‖ pad (0..=3) ‖ ICRC (4)`.
//! Source: IBTA Vol 1 ch. 9 (transport headers) and Annex A17 (RoCEv2); kernel rxe `rxe_hdr.h`.

#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

/// Declares a fixed-length header view `$name<T: AsRef<[u8]>>` with `new_unchecked`,
/// `new_checked`, `check_len` and `into_inner`, following the contract above.
macro_rules! header_view {
    ($(#[$m:meta])* $name:ident, $len:expr) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub struct $name<T: AsRef<[u8]>> {
            buffer: T,
        }

        impl<T: AsRef<[u8]>> $name<T> {
            /// Length of this header in bytes.
            pub const LEN: usize = $len;

            /// Wraps a buffer without checking its length (for emission into a sized buffer).
            pub const fn new_unchecked(buffer: T) -> Self {
                Self { buffer }
            }

            /// Wraps received bytes, checking that the whole header is present.
            pub fn new_checked(buffer: T) -> $crate::wire::Result<Self> {
                let h = Self::new_unchecked(buffer);
                h.check_len()?;
                Ok(h)
            }

            /// [`Error::Truncated`](crate::wire::Error::Truncated) unless the whole header
            /// is present.
            pub fn check_len(&self) -> $crate::wire::Result<()> {
                if self.buffer.as_ref().len() < $len {
                    Err($crate::wire::Error::Truncated)
                } else {
                    Ok(())
                }
            }

            /// The wrapped buffer.
            pub fn into_inner(self) -> T {
                self.buffer
            }
        }
    };
}

mod aeth;
mod atomic_ack_eth;
mod atomic_eth;
mod bth;
pub mod cm;
mod deth;
mod gid;
pub mod grh;
mod icrc;
mod ieth;
mod immdt;
pub mod ip_udp;
pub mod mad;
mod opcode;
mod packet;
mod psn;
mod reth;

pub use aeth::{Aeth, AethRepr, AethSyndrome, NakCode, RNR_TIMER_TABLE_US};
pub use atomic_ack_eth::{AtomicAckEth, AtomicAckEthRepr};
pub use atomic_eth::{AtomicEth, AtomicEthRepr};
pub use bth::{Bth, BthRepr};
pub use deth::{Deth, DethRepr};
pub use gid::Gid;
pub use icrc::{
    IcrcHasher, IcrcIp, icrc_compute, icrc_of_body, icrc_of_body_parts, icrc_of_datagram,
    solve_ipv4_ident,
};
pub use ieth::{Ieth, IethRepr};
pub use immdt::{ImmDt, ImmDtRepr};
pub use opcode::{ExtHeaders, OPCODE_TABLE, OpKind, Opcode, OpcodeInfo, Position, Transport};
pub use packet::{PacketRepr, RocePacket};
pub use psn::Psn;
pub use reth::{Reth, RethRepr};

/// UDP destination port of every RoCEv2 packet, ACKs included.
/// Source: IBTA Annex A17 (RoCEv2); rxe `rxe_net.c` `ROCE_V2_UDP_DPORT`.
pub const ROCE_V2_UDP_PORT: u16 = 4791;

/// Length of the invariant CRC that closes every RoCEv2 packet, in bytes.
pub const ICRC_LEN: usize = 4;

/// Length of the Base Transport Header in bytes: the start of every packet's layout, which
/// [`Bth`] reads and [`ExtHeaders`] counts the extension headers' offsets from.
pub const BTH_LEN: usize = 12;

/// The default (full-membership) partition key; rxe sends and accepts only this one.
pub const DEFAULT_PKEY: u16 = 0xffff;

/// Why received bytes are not a valid RoCEv2 packet.
///
/// Each variant maps to exactly one drop reason (see `transport::DropReason::from`).
/// Source: the receive checks of rxe `rxe_recv.c` (`rxe_rcv`, `hdr_check`) and `rxe_hdr.h`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    /// Fewer bytes than the headers the opcode requires, plus pad and ICRC.
    Truncated,
    /// BTH transport header version is not 0 (value carried).
    BadTver(u8),
    /// The opcode is reserved or of a transport softroce does not implement (value carried).
    UnknownOpcode(u8),
    /// The pad count does not fit the packet (payload shorter than the pad, or padding on an
    /// opcode that carries no payload).
    BadPadCount,
    /// A length field disagrees with the bytes present (e.g. an opcode that carries no payload
    /// has payload bytes).
    LengthMismatch,
    /// The ICRC does not match the masked headers and payload.
    IcrcMismatch,
    /// The outer IP/UDP framing is not IPv4/IPv6 + UDP (pcap and raw-socket input only).
    BadFraming,
}

impl core::fmt::Display for Error {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Error::Truncated => write!(f, "packet truncated"),
            Error::BadTver(v) => write!(f, "BTH TVer {v} is not 0"),
            Error::UnknownOpcode(op) => write!(f, "unknown or unsupported opcode {op:#04x}"),
            Error::BadPadCount => write!(f, "pad count does not fit the packet"),
            Error::LengthMismatch => write!(f, "length does not match the opcode"),
            Error::IcrcMismatch => write!(f, "ICRC mismatch"),
            Error::BadFraming => write!(f, "not IPv4/IPv6 + UDP framing"),
        }
    }
}

impl std::error::Error for Error {}

/// Result of a wire operation.
pub type Result<T> = core::result::Result<T, Error>;

/// Reads a big-endian 24-bit value from 3 bytes. Callers pass a checked 3-byte slice.
#[inline]
pub(crate) fn be24(b: &[u8]) -> u32 {
    (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2])
}

/// Writes the low 24 bits of `v` big-endian into 3 bytes.
#[inline]
pub(crate) fn put_be24(b: &mut [u8], v: u32) {
    b[0] = (v >> 16) as u8;
    b[1] = (v >> 8) as u8;
    b[2] = v as u8;
}

#[inline]
pub(crate) fn be16(b: &[u8]) -> u16 {
    u16::from_be_bytes([b[0], b[1]])
}

#[inline]
pub(crate) fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

#[inline]
pub(crate) fn be64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_be_bytes(a)
}

/// Pad count for a payload of `payload_bytes`: (4 − n mod 4) mod 4.
/// Source: IBTA Vol 1 ch. 9 (BTH PadCnt); rxe `init_req_packet`.
#[inline]
pub const fn pad_count(payload_bytes: usize) -> u8 {
    ((4 - (payload_bytes % 4)) % 4) as u8
}
