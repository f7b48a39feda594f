//! RoCE GIDs: [`Gid`] and its one conversion to and from IP addresses.
//!
//! On RoCE v2 a GID is an IPv6 address, IPv4-mapped (`::ffff:a.b.c.d`) for IPv4. Every layer
//! and frontend converts through [`Gid::from_ip`], [`Gid::ip`] and [`Gid::ipv6`] (the CM's
//! REQ paths, the ICRC pseudo-header, the GRH the responder writes, the C ABI's GID table).
//! No state, no I/O, no panics. Source: IBTA Annex A17 (RoCEv2 GIDs); ib_core
//! `rdma_gid2ip` / `rdma_ip2gid`.

use core::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// A 128-bit global identifier. For RoCEv2 it is an IPv6 address, IPv4-mapped for IPv4.
///
/// Shape: 16 bytes, network order. A GID of the form `::ffff:a.b.c.d` selects IPv4 (and an
/// IPv4 address vector); any other GID selects IPv6 with the GID as the address, as rdma-core
/// and ib_core do (`ipv6_addr_v4mapped`, `rdma_gid2ip`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Gid(pub [u8; 16]);

impl Gid {
    /// The all-zero GID.
    pub const ZERO: Gid = Gid([0; 16]);

    /// The GID of an IP address (IPv4 becomes `::ffff:a.b.c.d`).
    pub fn from_ip(ip: IpAddr) -> Gid {
        match ip {
            IpAddr::V4(v4) => Gid(v4.to_ipv6_mapped().octets()),
            IpAddr::V6(v6) => Gid(v6.octets()),
        }
    }

    /// True for a multicast GID: an IPv4-mapped class D address (`::ffff:224.0.0.0/100`) or
    /// an IPv6 multicast address (`ff00::/8`). Source: ib_core `rdma_is_multicast_addr`.
    pub fn is_multicast(&self) -> bool {
        self.ip().is_multicast()
    }

    /// The IP address this GID names (IPv4 for an IPv4-mapped GID).
    pub fn ip(&self) -> IpAddr {
        let v6 = self.ipv6();
        match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        }
    }

    /// The GID as an IPv6 address (an IPv4 GID stays mapped), as the IPv6 ICRC
    /// pseudo-header and an IPv6 GRH carry it.
    pub fn ipv6(&self) -> Ipv6Addr {
        Ipv6Addr::from(self.0)
    }
}

impl core::fmt::Display for Gid {
    /// As `inet_ntop` prints it, like rdma-core's tools (`::ffff:10.77.0.1`).
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{}", self.ipv6())
    }
}

impl From<Ipv4Addr> for Gid {
    fn from(v: Ipv4Addr) -> Gid {
        Gid::from_ip(IpAddr::V4(v))
    }
}

impl From<IpAddr> for Gid {
    fn from(ip: IpAddr) -> Gid {
        Gid::from_ip(ip)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ip_round_trips_through_the_gid() {
        for ip in [
            IpAddr::V4(Ipv4Addr::new(10, 77, 0, 1)),
            IpAddr::V6(Ipv6Addr::LOCALHOST),
            IpAddr::V6("fe80::1".parse().unwrap()),
        ] {
            assert_eq!(Gid::from_ip(ip).ip(), ip);
        }
        let g = Gid::from(Ipv4Addr::new(10, 77, 0, 1));
        assert_eq!(g.to_string(), "::ffff:10.77.0.1");
        assert_eq!(g.ipv6().octets(), g.0);
        assert!(Gid::from(Ipv4Addr::new(239, 1, 2, 3)).is_multicast());
        assert!(!g.is_multicast());
    }
}
