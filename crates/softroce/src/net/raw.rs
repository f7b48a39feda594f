//! Net: the raw IPv4 socket of the exact receive-side ICRC mode.
//!
//! The ICRC of a RoCEv2 packet covers the sender's IPv4 Identification field, which a UDP
//! socket never shows (FACTS §0.2). A raw `AF_INET`/`IPPROTO_UDP` socket receives a copy of
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
