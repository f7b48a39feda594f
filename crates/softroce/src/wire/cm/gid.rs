//! RoCE GIDs and IP addresses as the CM's REQ paths carry them: raw 16-byte arrays, through
//! the one conversion of [`Gid`]. Source: IBTA Annex A17 (RoCEv2 GIDs).

use crate::wire::Gid;

/// The GID of an IP address on RoCE: IPv4 mapped into IPv6 (`::ffff:a.b.c.d`), IPv6 as is.
/// Source: IBTA Annex A17 (RoCEv2 GIDs); the REQ GIDs of tests/captures/30-rping.pcap.
pub fn gid_of_ip(ip: core::net::IpAddr) -> [u8; 16] {
    Gid::from_ip(ip).0
}

/// The IP address of a RoCE GID (IPv4-mapped GIDs give IPv4).
pub fn ip_of_gid(gid: [u8; 16]) -> core::net::IpAddr {
    Gid(gid).ip()
}
