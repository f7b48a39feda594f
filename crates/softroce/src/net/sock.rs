//! Net: how a device's UDP sockets are made (port 4791 and the send sockets): IPv4 with
//! `IP_PMTUDISC_DO`, IPv6 with `IPV6_V6ONLY` and `UDP_NO_CHECK6_RX`. Used by `udp` and
//! `mcast`.

use rustix::net::sockopt;
use socket2::{Domain, Protocol, Socket, Type};
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsRawFd;

/// Lets an IPv6 UDP socket accept datagrams whose UDP checksum is 0. Kernel rxe sends IPv6
/// UDP with checksum 0 (its tunnel socket allows it), which a plain Linux IPv6 socket drops
/// unless `UDP_NO_CHECK6_RX` is set. Source: docs/wire-facts.md §0.10; Linux `net/ipv6/udp.c`
/// (`udpv6_queue_rcv_one_skb` / `udp6_csum_init`), `include/uapi/linux/udp.h`.
pub(super) fn set_udp_no_check6_rx(s: &Socket) -> io::Result<()> {
    let on: libc::c_int = 1;
    // SAFETY: `s` is an open socket for the whole call; the option value points at a live
    // `c_int` on this stack frame and the length passed is exactly its size, so the kernel
    // reads only initialised memory that outlives the call. rustix and socket2 have no safe
    // wrapper for this option.
    let rc = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_UDP,
            libc::UDP_NO_CHECK6_RX,
            (&raw const on).cast::<libc::c_void>(),
            core::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

pub(super) fn new_socket(ip: IpAddr, port: u16, reuse: bool) -> io::Result<Socket> {
    let domain = if ip.is_ipv4() {
        Domain::IPV4
    } else {
        Domain::IPV6
    };
    let s = Socket::new(domain, Type::DGRAM, Some(Protocol::UDP))?;
    if reuse {
        s.set_reuse_address(true)?;
        s.set_reuse_port(true)?;
    }
    if ip.is_ipv6() {
        s.set_only_v6(true)?;
        set_udp_no_check6_rx(&s)?;
    }
    s.bind(&SocketAddr::new(ip, port).into())?;
    if ip.is_ipv4() {
        // Unconnected + IP_PMTUDISC_DO: Linux writes IPv4 ID 0 and DF on every datagram
        // (docs/wire-facts.md §0.2), so the ICRC we computed over ID 0 is the one on the wire.
        sockopt::set_ip_mtu_discover(&s, sockopt::Ipv4PathMtuDiscovery::DO)?;
    }
    Ok(s)
}
