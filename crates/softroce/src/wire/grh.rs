//! The 40-byte GRH area at the start of a UD receive buffer: its one parser.
//!
//! A RoCE v2 UD receive (and every QP1 MAD) lands behind a 40-byte area holding the
//! datagram's network header: for IPv4, 20 zero bytes and then the IPv4 header (as kernel
//! rxe and our responder write it); for IPv6, the IPv6 header. No state, no I/O; nothing
//! here panics or allocates: a short area is `None`.
//!
//! Two ways of telling the IP version from the bytes: [`header_version`] is libibverbs' and
//! the kernel's (`get_grh_header_version`, `ib_get_rdma_header_version`), which what a C
//! program sees must follow; [`grh_source`] reads an area as this engine writes it (20 zero
//! bytes and an IPv4 header, or else IPv6), the rule of the QP1 MAD port.
//! Source: IBTA Vol 1 §8.3 (GRH) and Annex A17 (RoCE v2); libibverbs 44 `verbs.c`;
//! docs/wire-facts.md §2.12.

use core::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Bytes of the GRH area in front of a UD receive.
pub const GRH_LEN: usize = 40;

/// The network header of a GRH area, decoded.
///
/// Shape: for an IPv4 area, `src`/`dst` are the IPv4 header's addresses (bytes 32..36 and
/// 36..40), `hop_limit` its TTL (28), `traffic_class` its TOS byte (21), `next_header` its
/// protocol (29); for an IPv6 area, the IPv6 header's source (8..24, never un-mapped) and
/// destination (24..40), hop limit (7), traffic class (bits 20..28 of the first word) and
/// next header (6). `flow_label` is the low 20 bits of the area's first word, big-endian,
/// for either (libibverbs reads it so).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grh {
    /// Source address (who sent the datagram).
    pub src: IpAddr,
    /// Destination address (the receiving device's, or a multicast group).
    pub dst: IpAddr,
    /// IPv6 hop limit or IPv4 TTL.
    pub hop_limit: u8,
    /// IPv6 traffic class or IPv4 TOS byte.
    pub traffic_class: u8,
    /// IPv6 next header or IPv4 protocol (17 = UDP; 0x1b marks RoCE v1).
    pub next_header: u8,
    /// Flow label: the first word's low 20 bits.
    pub flow_label: u32,
}

impl Grh {
    /// The area read with [`header_version`]'s rule; `None` for an area shorter than
    /// [`GRH_LEN`] or of neither version (libibverbs' `EPROTONOSUPPORT`).
    pub fn parse(area: &[u8]) -> Option<Grh> {
        let area = area_of(area)?;
        match header_version(area)? {
            4 => Some(Grh::ipv4(area)),
            _ => Some(Grh::ipv6(area)),
        }
    }

    /// True when the area held an IPv4 header (`src` and `dst` are then IPv4).
    pub fn is_ipv4(&self) -> bool {
        self.src.is_ipv4()
    }

    /// The area read as 20 zero bytes and an IPv4 header (not checked).
    pub fn ipv4(area: &[u8; GRH_LEN]) -> Grh {
        let h = &area[20..40];
        Grh {
            src: IpAddr::V4(Ipv4Addr::new(h[12], h[13], h[14], h[15])),
            dst: IpAddr::V4(Ipv4Addr::new(h[16], h[17], h[18], h[19])),
            hop_limit: h[8],
            traffic_class: h[1],
            next_header: h[9],
            flow_label: flow_label(area),
        }
    }

    /// The area read as an IPv6 header (not checked).
    pub fn ipv6(area: &[u8; GRH_LEN]) -> Grh {
        let addr = |at: usize| {
            let mut a = [0u8; 16];
            a.copy_from_slice(&area[at..at + 16]);
            IpAddr::V6(Ipv6Addr::from(a))
        };
        Grh {
            src: addr(8),
            dst: addr(24),
            hop_limit: area[7],
            traffic_class: (first_word(area) >> 20) as u8,
            next_header: area[6],
            flow_label: flow_label(area),
        }
    }
}

/// The first [`GRH_LEN`] bytes of `area`, if it has them.
fn area_of(area: &[u8]) -> Option<&[u8; GRH_LEN]> {
    area.get(..GRH_LEN)?.try_into().ok()
}

fn first_word(area: &[u8; GRH_LEN]) -> u32 {
    u32::from_be_bytes([area[0], area[1], area[2], area[3]])
}

/// The flow label of a GRH area: the low 20 bits of its first word (big-endian), whatever
/// header it holds (libibverbs `ibv_init_ah_from_wc`).
pub fn flow_label(area: &[u8; GRH_LEN]) -> u32 {
    first_word(area) & 0x000f_ffff
}

/// Which network header a GRH area holds: 4 (an IPv4 header in its last 20 bytes), 6 (an
/// IPv6 header), or `None` (libibverbs' `EPROTONOSUPPORT`). An area whose first nibble says
/// 6 is still IPv4 when its last 20 bytes are an IPv4 header with IHL 5 and a right
/// checksum. Source: libibverbs 44 `verbs.c` `get_grh_header_version` (the kernel's
/// `ib_get_rdma_header_version` is the same).
pub fn header_version(area: &[u8; GRH_LEN]) -> Option<u8> {
    let ip4 = &area[20..40];
    if area[0] >> 4 != 6 {
        return (ip4[0] >> 4 == 4).then_some(4);
    }
    if ip4[0] & 0x0f != 5 {
        return Some(6);
    }
    // The header's one's-complement sum with the checksum field taken as 0, complemented.
    let sum: u32 = (0..10)
        .filter(|&i| i != 5)
        .map(|i| u32::from(u16::from_ne_bytes([ip4[2 * i], ip4[2 * i + 1]])))
        .sum();
    let folded = (sum & 0xffff) + (sum >> 16);
    let check = !(folded as u16);
    Some(if u16::from_ne_bytes([ip4[10], ip4[11]]) == check {
        4
    } else {
        6
    })
}

/// The source IP of a UD receive, from its GRH area as this engine writes it: an IPv4
/// header in the last 20 bytes (the first 20 zero), else an IPv6 header. `None` for an area
/// shorter than [`GRH_LEN`]. Source: docs/wire-facts.md §2.12; tests/gsi.rs.
pub fn grh_source(area: &[u8]) -> Option<IpAddr> {
    let area = area_of(area)?;
    Some(
        if area[..20].iter().all(|&b| b == 0) && area[20] >> 4 == 4 {
            Grh::ipv4(area).src
        } else {
            Grh::ipv6(area).src
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The GRH area of a UD receive as rxe writes it for IPv4: 20 zero bytes, then the
    /// IPv4 header (here 127.0.150.2 -> 127.0.150.1, TTL 64, UDP, right checksum).
    fn rxe_ipv4_area() -> [u8; 40] {
        let mut g = [0u8; 40];
        g[20..40].copy_from_slice(&[
            0x45, 0x00, 0x00, 0x3c, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0x00, 0x00, 127, 0, 150, 2,
            127, 0, 150, 1,
        ]);
        let sum: u32 = (0..10)
            .map(|i| u32::from(u16::from_be_bytes([g[20 + 2 * i], g[21 + 2 * i]])))
            .sum();
        let folded = (sum & 0xffff) + (sum >> 16);
        g[30..32].copy_from_slice(&(!(folded as u16)).to_be_bytes());
        g
    }

    // libibverbs get_grh_header_version: a first nibble other than 6 with an IPv4 header in
    // the last 20 bytes is IPv4; neither is EPROTONOSUPPORT.
    #[test]
    fn grh_version_ipv4_as_rxe_writes_it() {
        assert_eq!(header_version(&rxe_ipv4_area()), Some(4));
        assert_eq!(header_version(&[0u8; 40]), None);
    }

    // libibverbs get_grh_header_version: a first nibble of 6 is IPv6 unless the last 20
    // bytes are an IPv4 header with IHL 5 and a right checksum.
    #[test]
    fn grh_version_ipv6_unless_a_checked_ipv4_header_follows() {
        let mut v6 = [0u8; 40];
        v6[0] = 0x60;
        v6[6] = 17;
        v6[7] = 64;
        v6[23] = 1; // source ::1
        v6[39] = 1; // destination ::1
        assert_eq!(header_version(&v6), Some(6));
        let mut both = rxe_ipv4_area();
        both[0] = 0x60;
        assert_eq!(header_version(&both), Some(4));
        both[31] ^= 1; // a wrong checksum: IPv6 after all
        assert_eq!(header_version(&both), Some(6));
    }

    #[test]
    fn parse_reads_the_fields_of_either_header() {
        let g = Grh::parse(&rxe_ipv4_area()).unwrap();
        assert_eq!(g.src, IpAddr::V4(Ipv4Addr::new(127, 0, 150, 2)));
        assert_eq!(g.dst, IpAddr::V4(Ipv4Addr::new(127, 0, 150, 1)));
        assert_eq!((g.hop_limit, g.traffic_class, g.next_header), (64, 0, 17));
        let mut v6 = [0u8; 40];
        v6[..4].copy_from_slice(&0x6ab1_2345u32.to_be_bytes());
        v6[6] = 17;
        v6[7] = 9;
        v6[23] = 1;
        v6[24] = 0xff;
        let g = Grh::parse(&v6).unwrap();
        assert_eq!(g.src, IpAddr::V6(Ipv6Addr::LOCALHOST));
        assert!(g.dst.is_multicast());
        assert_eq!((g.hop_limit, g.traffic_class, g.next_header), (9, 0xab, 17));
        assert_eq!(g.flow_label, 0x1_2345);
        assert_eq!(Grh::parse(&v6[..39]), None);
    }

    #[test]
    fn grh_source_reads_the_engines_areas() {
        assert_eq!(
            grh_source(&rxe_ipv4_area()),
            Some(IpAddr::V4(Ipv4Addr::new(127, 0, 150, 2)))
        );
        let mut v6 = [0u8; 40];
        v6[0] = 0x60;
        let mapped = crate::wire::Gid::from(Ipv4Addr::new(10, 0, 0, 1));
        v6[8..24].copy_from_slice(&mapped.0);
        // An IPv6 area keeps a mapped source as IPv6, as the engine wrote it.
        assert_eq!(grh_source(&v6), Some(IpAddr::V6(mapped.ipv6())));
        assert_eq!(grh_source(&[0u8; 39]), None);
    }
}
