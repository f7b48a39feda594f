//! The send side of [`UdpLink`](super::UdpLink): the sockets of one UDP source port, and
//! the limits and helpers of the batched send path (the hold of ACKs, GSO, `sendmmsg`).

use super::super::batch::GSO_MAX_SEGMENTS;
use super::super::sock::new_send_socket;
use crate::transport::{Transmit, TxKind, TxPart};
use std::io;
use std::net::{IpAddr, UdpSocket};
use std::sync::OnceLock;

/// The send sockets of one UDP source port: `plain` sends with UDP checksum 0, as rxe does;
/// `gso`, made on the first GSO send, keeps the checksum, because Linux refuses UDP GSO on a
/// socket without one (both bound to the port with `SO_REUSEPORT`; [`new_send_socket`]).
#[derive(Debug)]
pub(in crate::net) struct SendSockets {
    pub(super) ip: IpAddr,
    pub(super) port: u16,
    /// Lone datagrams and `sendmmsg` batches: UDP checksum 0.
    pub(super) plain: UdpSocket,
    pub(super) gso: OnceLock<Option<UdpSocket>>,
}

impl SendSockets {
    /// The socket for UDP GSO sends (checksummed); the plain one if it cannot be made (its
    /// GSO sends then fail, and the link falls back to `sendmmsg`).
    pub(super) fn gso(&self) -> &UdpSocket {
        self.gso
            .get_or_init(|| send_socket(self.ip, self.port, true).ok())
            .as_ref()
            .unwrap_or(&self.plain)
    }
}

/// A send socket of a device at `ip` ([`new_send_socket`]) whose multicast leaves through the
/// device's own interface (on loopback there is no multicast route otherwise; unicast is
/// unaffected, so a failure there is ignored).
pub(super) fn send_socket(ip: IpAddr, port: u16, udp_checksum: bool) -> io::Result<UdpSocket> {
    let s = new_send_socket(ip, port, udp_checksum)?;
    let _ = super::super::mcast::set_sending_interface(&s, ip);
    // ICMP errors for a peer without a RoCE device: QP1's reach the CM, a QP's are logged
    // (`super::icmp`; a send that such an error fails is made again, `UdpLink::send`).
    super::super::icmp::set_recv_err(&s, ip)?;
    Ok(UdpSocket::from(s))
}

/// The UDP source port of QP1 (the GSI QP), whose sockets report ICMP errors
/// ([`super::super::qp1::SOURCE_PORT`]).
pub(super) fn gsi_source_port() -> u16 {
    super::super::qp1::SOURCE_PORT
}

/// A busy poll that returns completions sends the held-back ACKs anyway once this many wait.
pub(super) const DEFER_MAX_HELD: usize = 32;

/// ... or once this many datagrams came in since held ACKs last went: a quarter of the
/// 128-PSN window of an rxe or softroce requester (rxe's RXE_MAX_UNACKED_PSNS), so the ACK
/// is on its way while the peer still has three quarters of its window to send.
pub(super) const ACK_AFTER_DATAGRAMS: u64 = 32;

/// The driver thread answers (sends the ACKs it holds) after a received buffer once this
/// many datagrams came in since the last answer: after each full GRO buffer of 4096-byte
/// datagrams (64 KiB), after a few short buffers (messages that are not a multiple of the
/// MTU are a buffer each).
pub(in crate::net) const FLUSH_AFTER_DATAGRAMS: u64 = 16;

/// At most this many requests in one batch take the held-back ACKs along (a latency-bound
/// reply; a bulk batch is not copied for it).
pub(super) const PIGGYBACK_MAX: usize = 4;

/// True for what may be held back while `UdpLink::holding_acks` is set: ACKs, NAKs and ATOMIC
/// ACKNOWLEDGEs, as the engine labelled them. READ responses and requests go at once.
pub(super) fn may_wait(t: &Transmit) -> bool {
    matches!(t.kind, TxKind::Acknowledge | TxKind::AtomicAcknowledge)
}

/// (destination, UDP source port, body bytes) of a cached table of ICRC corrections.
pub(super) type IdentDeltaKey = (std::net::Ipv4Addr, u16, usize);

/// The ICRC corrections for IPv4 IDs 0..64 ([`UdpLink::ident_deltas`]).
pub(super) type IdentDeltas = [[u8; 4]; GSO_MAX_SEGMENTS];

/// Most cached tables of IPv4 GSO ICRC corrections (then the cache starts over).
pub(super) const IDENT_DELTA_CACHE: usize = 1024;

/// Most GSO sends (or lone datagrams) one `sendmmsg` carries: enough for a window's worth
/// of 64 KiB messages (two sends each), few enough that one call does not hold the device
/// lock long.
pub(super) const SENDMMSG_MSGS: usize = 16;

/// Whether a GSO send error means the kernel (or the route's device) cannot do UDP GSO,
/// as opposed to a transient failure.
pub(super) fn gso_refused(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EIO | libc::EINVAL | libc::ENOPROTOOPT | libc::EOPNOTSUPP)
    )
}

/// A datagram as (its bytes before the ICRC, in up to three parts; its ICRC).
///
/// # Safety
/// As [`Transmit::parts`]: under the device lock that built a gathered `t`.
pub(super) unsafe fn body_and_icrc(t: &Transmit) -> ([TxPart<'_>; 3], [u8; 4]) {
    match t.tail_icrc() {
        Some(icrc) => {
            // SAFETY: forwarded to the caller.
            let [head, data, pad, _] = unsafe { t.parts() };
            ([head, data, pad], icrc)
        }
        None => {
            let b = t.payload.len().saturating_sub(4);
            let (body, last) = t.payload.split_at(b);
            let mut icrc = [0u8; 4];
            icrc[..last.len()].copy_from_slice(last);
            let none = TxPart::from(&[][..]);
            ([TxPart::from(body), none, none], icrc)
        }
    }
}
