//! IP multicast for UD multicast groups.
//!
//! When the first QP of a device attaches to a multicast GID, the UDP link opens one socket
//! bound to the group address on port 4791 (`SO_REUSEADDR`, so that every device in the host
//! joined to the group gets its own copy of each datagram) and joins the group on the
//! interface that owns the device's address: by address for IPv4, by interface index (from
//! `/proc/net/if_inet6`) for IPv6, whose socket is also bound to that interface
//! (`SO_BINDTODEVICE`) because IPv6 filters memberships by group only. `IP_MULTICAST_ALL` is
//! off, so a socket sees only the groups it joined itself. The driver thread drains these sockets between receives
//! on the unicast one. Send sockets set `IP_MULTICAST_IF` / `IPV6_MULTICAST_IF` to that
//! interface, and `IP_MULTICAST_LOOP` stays on, so group members on the same host (another
//! device, or the sender's own) receive the datagram too.
//!
//! What the host needs: IPv4 groups (GIDs `::ffff:224.0.0.0/100`, e.g. `::ffff:239.1.2.3`)
//! work on loopback as is, also in a fresh network namespace once `lo` is up, because the
//! sending interface is named explicitly (no multicast route is needed). IPv6 groups
//! (`ff0x::`) need an interface with the MULTICAST flag (Linux `lo` has none): put the device
//! address on such an interface (e.g. a veth pair in a namespace, as `tests/multicast.rs`).

use crate::wire::ROCE_V2_UDP_PORT;
use socket2::{Domain, Protocol, Socket, Type};
use std::io;
use std::net::{IpAddr, Ipv6Addr, SocketAddr, UdpSocket};
use std::time::Duration;

/// Longest the driver sleeps on the unicast socket while groups are joined (the latency
/// bound of multicast delivery on an idle device).
pub(super) const MAX_PARK: Duration = Duration::from_millis(1);

/// The index and name of the interface holding IPv6 address `ip`, from
/// `/proc/net/if_inet6` (per network namespace). None if not found.
fn ipv6_interface(ip: Ipv6Addr) -> Option<(u32, String)> {
    let text = std::fs::read_to_string("/proc/net/if_inet6").ok()?;
    let want = ip
        .octets()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<String>();
    text.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        let (addr, idx, name) = (f.first()?, f.get(1)?, f.get(5)?);
        if *addr != want {
            return None;
        }
        Some((u32::from_str_radix(idx, 16).ok()?, (*name).to_string()))
    })
}

/// Makes multicast datagrams sent on `s` leave through the interface of `local`.
pub(super) fn set_sending_interface(s: &Socket, local: IpAddr) -> io::Result<()> {
    match local {
        IpAddr::V4(v4) => s.set_multicast_if_v4(&v4),
        IpAddr::V6(v6) => match ipv6_interface(v6) {
            Some((i, _)) => s.set_multicast_if_v6(i),
            None => Ok(()),
        },
    }
}

/// A non-blocking socket bound to `group`:4791 and joined to `group` on the interface of
/// `local`. Errors: a group of another family than `local`, and socket errors.
pub(super) fn join(local: IpAddr, group: IpAddr) -> io::Result<UdpSocket> {
    let domain = match group {
        IpAddr::V4(_) => Domain::IPV4,
        IpAddr::V6(_) => Domain::IPV6,
    };
    let s = Socket::new(domain, Type::DGRAM, Some(Protocol::UDP))?;
    s.set_reuse_address(true)?;
    // Only the memberships of this socket count (IP_MULTICAST_ALL off): a device receives
    // the group on its own interface, not also each copy arriving on another one.
    match (group, local) {
        (IpAddr::V4(g), IpAddr::V4(l)) => {
            s.set_multicast_all_v4(false)?;
            s.bind(&SocketAddr::new(group, ROCE_V2_UDP_PORT).into())?;
            s.join_multicast_v4(&g, &l)?;
        }
        (IpAddr::V6(g), IpAddr::V6(l)) => {
            s.set_only_v6(true)?;
            s.set_multicast_all_v6(false)?;
            super::sock::set_udp_no_check6_rx(&s)?;
            let interface = ipv6_interface(l);
            let idx = interface.as_ref().map_or(0, |(i, _)| *i);
            // IPv6 sockets filter multicast by group only, not by the interface a membership
            // is on: bind to the device's interface so the copies that arrive on another
            // one (from the same sender, looped or forwarded) are not delivered twice.
            if let Some((_, name)) = &interface {
                let _ = s.bind_device(Some(name.as_bytes()));
            }
            let addr = std::net::SocketAddrV6::new(g, ROCE_V2_UDP_PORT, 0, idx);
            s.bind(&SocketAddr::V6(addr).into())?;
            s.join_multicast_v6(&g, idx)?;
        }
        _ => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "multicast group and device address of different IP families",
            ));
        }
    }
    s.set_nonblocking(true)?;
    Ok(s.into())
}
