//! RoCE GIDs and IP addresses: the IPv4-mapped form rdma_cm and the CM's REQ paths use.
//! Source: IBTA Annex A17 (RoCEv2 GIDs).

/// The GID of an IP address on RoCE: IPv4 mapped into IPv6 (`::ffff:a.b.c.d`), IPv6 as is.
/// Source: IBTA Annex A17 (RoCEv2 GIDs); the REQ GIDs of tests/captures/30-rping.pcap.
pub fn gid_of_ip(ip: core::net::IpAddr) -> [u8; 16] {
    match ip {
        core::net::IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        core::net::IpAddr::V6(v6) => v6.octets(),
    }
}

/// The IP address of a RoCE GID (IPv4-mapped GIDs give IPv4).
pub fn ip_of_gid(gid: [u8; 16]) -> core::net::IpAddr {
    let v6 = core::net::Ipv6Addr::from(gid);
    match v6.to_ipv4_mapped() {
        Some(v4) => core::net::IpAddr::V4(v4),
        None => core::net::IpAddr::V6(v6),
    }
}
