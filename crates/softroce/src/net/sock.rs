//! Net: how a device's UDP sockets are made (port 4791 and the send sockets): IPv4 with
//! `IP_PMTUDISC_DO`, IPv6 with `IPV6_V6ONLY` and `UDP_NO_CHECK6_RX`; send sockets also
//! without the IPv6 automatic flow label and, where the kernel allows it, without a UDP
//! checksum, as rxe sends (docs/wire-facts.md §0.7, §2.1). Used by `udp`, `link` and
//! `mcast`.

use rustix::event::{PollFd, PollFlags, Timespec};
use rustix::net::sockopt;
use socket2::{Domain, Protocol, Socket, Type};
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsRawFd;
use std::time::Duration;

/// Lets an IPv6 UDP socket accept datagrams whose UDP checksum is 0. Kernel rxe sends IPv6
/// UDP with checksum 0 (its tunnel socket allows it), which a plain Linux IPv6 socket drops
/// unless `UDP_NO_CHECK6_RX` is set. Source: docs/wire-facts.md §0.10; Linux `net/ipv6/udp.c`
/// (`udpv6_queue_rcv_one_skb` / `udp6_csum_init`), `include/uapi/linux/udp.h`.
pub(super) fn set_udp_no_check6_rx(s: &Socket) -> io::Result<()> {
    set_int(s, libc::SOL_UDP, libc::UDP_NO_CHECK6_RX, 1)
}

/// `setsockopt` of an `int` option that rustix and socket2 do not wrap.
fn set_int(
    s: &Socket,
    level: libc::c_int,
    name: libc::c_int,
    value: libc::c_int,
) -> io::Result<()> {
    // SAFETY: `s` is an open socket for the whole call; the option value points at a live
    // `c_int` on this stack frame and the length passed is exactly its size, so the kernel
    // reads only initialised memory that outlives the call.
    let rc = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            level,
            name,
            (&raw const value).cast::<libc::c_void>(),
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
    let s = unbound_socket(ip, reuse)?;
    s.bind(&SocketAddr::new(ip, port).into())?;
    Ok(s)
}

/// [`new_socket`] before its `bind`: every option set, no address yet.
pub(super) fn unbound_socket(ip: IpAddr, reuse: bool) -> io::Result<Socket> {
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
    if ip.is_ipv4() {
        // Unconnected + IP_PMTUDISC_DO: Linux writes IPv4 ID 0 and DF on every datagram
        // (docs/wire-facts.md §0.2), so the ICRC we computed over ID 0 is the one on the wire.
        sockopt::set_ip_mtu_discover(&s, sockopt::Ipv4PathMtuDiscovery::DO)?;
    }
    Ok(s)
}

/// A send socket bound to `ip`:`port` (shared with the device's other send sockets of that
/// port, `SO_REUSEPORT`). IPv6: the kernel's automatic flow label is off
/// (`IPV6_AUTOFLOWLABEL` = 0), so packets carry flow label 0 as rxe's do, unless the host
/// forces automatic labels (`net.ipv6.auto_flowlabels` = 3). With `udp_checksum` false, the
/// kernel leaves the UDP checksum 0 (`SO_NO_CHECK` on IPv4, `UDP_NO_CHECK6_TX` on IPv6), as
/// rxe does (the ICRC protects the packet); Linux refuses UDP GSO on such a socket
/// (`udp_send_skb`: EINVAL), so GSO sends use a socket with the checksum on.
/// Errors: socket creation and bind errors, and a refused option.
/// Source: docs/wire-facts.md §0.7, §2.1; Linux `net/ipv4/udp.c` `udp_send_skb`,
/// `net/ipv6/udp.c` `udp_v6_send_skb`, `net/ipv6/ip6_output.c` `ip6_make_flowlabel`.
pub(super) fn new_send_socket(ip: IpAddr, port: u16, udp_checksum: bool) -> io::Result<Socket> {
    let s = unbound_send_socket(ip, udp_checksum)?;
    s.bind(&SocketAddr::new(ip, port).into())?;
    Ok(s)
}

/// [`new_send_socket`] before its `bind` (for the stand-in of `super::standin`, which binds
/// only once the process it stands in for is gone, so that it never joins that process's
/// `SO_REUSEPORT` group and takes its ICMP errors).
pub(super) fn unbound_send_socket(ip: IpAddr, udp_checksum: bool) -> io::Result<Socket> {
    let s = unbound_socket(ip, true)?;
    match ip {
        IpAddr::V4(_) if !udp_checksum => set_int(&s, libc::SOL_SOCKET, SO_NO_CHECK, 1)?,
        IpAddr::V4(_) => {}
        IpAddr::V6(_) => {
            set_int(&s, libc::IPPROTO_IPV6, libc::IPV6_AUTOFLOWLABEL, 0)?;
            if !udp_checksum {
                set_int(&s, libc::SOL_UDP, libc::UDP_NO_CHECK6_TX, 1)?;
            }
        }
    }
    Ok(s)
}

/// `SO_NO_CHECK` (Linux `include/uapi/asm-generic/socket.h`; libc does not export it for
/// glibc targets).
const SO_NO_CHECK: libc::c_int = 11;

/// Waits at most `timeout` for `fd` to have something to read (`poll(2)` with `POLLIN`).
/// Returns whether it has; EINTR counts as a timeout (the caller's loop looks again).
/// Errors: those of `poll(2)`.
pub(super) fn wait_readable(fd: &impl std::os::fd::AsFd, timeout: Duration) -> io::Result<bool> {
    let mut fds = [PollFd::new(fd, PollFlags::IN)];
    let timeout = Timespec {
        tv_sec: timeout.as_secs().try_into().unwrap_or(i64::MAX),
        tv_nsec: timeout.subsec_nanos().into(),
    };
    match rustix::event::poll(&mut fds, Some(&timeout)) {
        Ok(n) => Ok(n > 0),
        Err(rustix::io::Errno::INTR) => Ok(false),
        Err(e) => Err(e.into()),
    }
}
