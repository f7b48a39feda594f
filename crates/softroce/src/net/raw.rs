//! Net: the raw IPv4 socket of the exact receive-side ICRC mode.
//!
//! The ICRC of a RoCEv2 packet covers the sender's IPv4 Identification field, which a UDP
//! socket never shows (docs/wire-facts.md §0.2). A raw `AF_INET`/`IPPROTO_UDP` socket receives a copy of
//! every UDP datagram delivered to this host, IP header included, exactly as received; the
//! device then checks the ICRC over that header, as kernel rxe does. The device's UDP socket
//! stays bound to port 4791 so that the kernel delivers the datagrams rather than answering
//! with ICMP port-unreachable; in this mode a socket filter makes it drop everything, so that
//! each datagram is read once, from the raw socket (Linux counts those filtered copies in the
//! UDP `InErrors` statistic).
//!
//! Needs CAP_NET_RAW (opening fails with EPERM without it). IPv6 needs no such socket: its
//! header has no field that the ICRC covers and a UDP socket hides (an IPv6 raw socket would
//! not show the header anyway).

use crate::wire::icrc_compute;
use socket2::{Domain, Protocol, SockFilter, Socket, Type};
use std::io::{self, Read};
use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

/// Classic BPF opcodes (linux/filter.h).
const BPF_LD_W_ABS: u16 = 0x20; // A <- u32 at pkt[k]
const BPF_LDX_B_MSH: u16 = 0xb1; // X <- 4 * (pkt[k] & 0x0f): the IPv4 header length
const BPF_LD_H_IND: u16 = 0x48; // A <- u16 at pkt[X + k]
const BPF_JEQ_K: u16 = 0x15; // if A == k
const BPF_RET_K: u16 = 0x06; // accept k bytes (0 = drop)

/// A filter for a raw IPv4 socket: keep only datagrams to `ip`, UDP port `port`.
fn udp_dst_filter(ip: Ipv4Addr, port: u16) -> [SockFilter; 7] {
    [
        SockFilter::new(BPF_LD_W_ABS, 0, 0, 16), // IPv4 destination address
        SockFilter::new(BPF_JEQ_K, 0, 4, u32::from(ip)),
        SockFilter::new(BPF_LDX_B_MSH, 0, 0, 0),
        SockFilter::new(BPF_LD_H_IND, 0, 0, 2), // UDP destination port
        SockFilter::new(BPF_JEQ_K, 0, 1, u32::from(port)),
        SockFilter::new(BPF_RET_K, 0, 0, u32::MAX),
        SockFilter::new(BPF_RET_K, 0, 0, 0),
    ]
}

/// Makes `s` drop every datagram before it is queued (the UDP socket of exact mode).
pub(crate) fn drop_everything(s: &Socket) -> io::Result<()> {
    s.attach_filter(&[SockFilter::new(BPF_RET_K, 0, 0, 0)])
}

/// A raw socket that receives the IPv4 packets sent to one address and UDP port.
#[derive(Debug)]
pub(crate) struct RawRx {
    sock: Socket,
}

impl RawRx {
    /// Opens a raw IPv4/UDP socket that keeps only datagrams to `ip`, UDP port `port`.
    /// Errors: EPERM without CAP_NET_RAW; other socket errors.
    pub(crate) fn open(ip: Ipv4Addr, port: u16, rcvbuf_bytes: usize) -> io::Result<RawRx> {
        let sock = Socket::new(Domain::IPV4, Type::RAW, Some(Protocol::UDP))?;
        sock.attach_filter(&udp_dst_filter(ip, port))?;
        sock.bind(&SocketAddr::new(ip.into(), 0).into())?;
        // Until the filter was attached, the socket took every UDP datagram of the host:
        // discard what it queued then.
        sock.set_nonblocking(true)?;
        let mut scratch = [0u8; 64];
        while (&sock).read(&mut scratch).is_ok() {}
        sock.set_nonblocking(false)?;
        // Best effort, as for the UDP socket: a smaller buffer only drops sooner under bursts.
        if rustix::net::sockopt::set_socket_recv_buffer_size_force(&sock, rcvbuf_bytes).is_err() {
            let _ = sock.set_recv_buffer_size(rcvbuf_bytes);
        }
        Ok(RawRx { sock })
    }

    /// Waits up to `timeout` for one IP packet and copies it into `buf`; returns its length.
    /// Errors: `WouldBlock`/`TimedOut` when nothing came.
    pub(crate) fn recv(&self, buf: &mut [u8], timeout: Duration) -> io::Result<usize> {
        self.sock.set_read_timeout(Some(timeout))?;
        (&self.sock).read(buf)
    }
}

/// A raw socket sees a UDP GSO send from this host (loopback, or a veth into this namespace)
/// before the kernel cuts it: one IPv4 packet whose UDP payload is several RoCE packets of
/// one size (the last maybe shorter), IP total length and UDP length covering them all, and
/// the first segment's IP ID. The kernel would give segment `i` ID `first + i` and its own
/// lengths. When `packet` is such a packet, calls `each` with every segment rebuilt that
/// way (IPv4 header checksum recomputed, UDP checksum 0) and returns true; for anything
/// else (a packet whose ICRC holds as it is, IPv6, IP options, no segment size that makes
/// the first segment's ICRC valid) returns false without calling it.
///
/// The segment size is not on the wire, so it is found from the data: candidate sizes
/// (multiples of 4) where a BTH with the first one's P_Key and destination QP starts,
/// confirmed by the first segment's exact ICRC. Every segment is then checked exactly by
/// the device like any received packet. Cost: one CRC pass over the packet when it is a
/// single RoCE packet.
pub(super) fn split_gso_ipv4(
    packet: &[u8],
    scratch: &mut Vec<u8>,
    each: &mut dyn FnMut(&[u8]),
) -> bool {
    const IP: usize = 20;
    const HDRS: usize = IP + 8;
    const BTH: usize = 12;
    if packet.len() < HDRS + BTH + 4 || packet[0] != 0x45 {
        return false;
    }
    let (ip, rest) = packet.split_at(IP);
    let (udp, payload) = rest.split_at(8);
    let body_end = payload.len() - 4;
    if icrc_compute(ip, udp, &payload[..body_end]) == payload[body_end..] {
        return false;
    }
    let base_id = u16::from_be_bytes([ip[4], ip[5]]);
    let header = |seg_len: usize, index: usize, out: &mut Vec<u8>| {
        out.clear();
        out.extend_from_slice(&packet[..HDRS]);
        let total = (HDRS + seg_len) as u16;
        out[2..4].copy_from_slice(&total.to_be_bytes());
        let id = base_id.wrapping_add(index as u16);
        out[4..6].copy_from_slice(&id.to_be_bytes());
        out[10..12].copy_from_slice(&[0, 0]);
        let sum = ipv4_header_checksum(&out[..IP]);
        out[10..12].copy_from_slice(&sum.to_be_bytes());
        out[IP + 4..IP + 6].copy_from_slice(&((8 + seg_len) as u16).to_be_bytes());
        out[IP + 6..IP + 8].copy_from_slice(&[0, 0]);
    };
    // BTH bytes 1 (flags, TVer), 2..4 (P_Key) and 5..8 (reserved, dest QP) repeat in every
    // segment of one QP's GSO send.
    let same_flow = |at: usize| {
        payload.get(at + 2..at + 8).is_some_and(|b| {
            b[..2] == payload[2..4] && b[3..] == payload[5..8] && payload[at + 1] & 0x0f == 0
        })
    };
    let found = (BTH + 4..payload.len())
        .step_by(4)
        .filter(|g| same_flow(*g))
        .find(|&g| {
            header(g, 0, scratch);
            let (ip0, udp0) = scratch.split_at(IP);
            icrc_compute(ip0, udp0, &payload[..g - 4]) == payload[g - 4..g]
        });
    let Some(g) = found else { return false };
    for (i, seg) in payload.chunks(g).enumerate() {
        header(seg.len(), i, scratch);
        scratch.extend_from_slice(seg);
        each(scratch);
    }
    true
}

/// The IPv4 header checksum (RFC 791: ones' complement of the ones' complement sum of the
/// header's 16-bit words, with the checksum field taken as 0).
fn ipv4_header_checksum(h: &[u8]) -> u16 {
    let mut sum: u32 = h
        .chunks(2)
        .map(|w| u32::from(u16::from_be_bytes([w[0], w.get(1).copied().unwrap_or(0)])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}
