//! Outer IPv4/IPv6 + UDP framing, through etherparse. Used for pcap files and raw-IP input
//! (a raw socket's receive, `softroce decode`); the live UDP data path gets addresses from the
//! socket instead.
//!
//! Contract: [`parse_frame`] never panics and never allocates; what it returns borrows from
//! the frame.

use super::{Error, Result};
use etherparse::{NetSlice, SlicedPacket, TransportSlice};

/// One RoCEv2 datagram cut out of a captured frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdpDatagram<'a> {
    /// The IP header bytes as captured: 20+ bytes for IPv4 (options included), the 40-byte
    /// fixed header for IPv6 (extension headers, which RoCEv2 does not use, are left out).
    pub ip_header: &'a [u8],
    /// The 8 UDP header bytes.
    pub udp_header: &'a [u8],
    /// The UDP payload (for RoCEv2: BTH … ICRC), cut to the UDP length (Ethernet padding is
    /// not part of it).
    pub payload: &'a [u8],
    /// Source address.
    pub src: core::net::IpAddr,
    /// Destination address.
    pub dst: core::net::IpAddr,
    /// UDP source port.
    pub src_port: u16,
    /// UDP destination port.
    pub dst_port: u16,
}

/// Link layer of a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkType {
    /// Ethernet II, VLAN tags allowed (pcap LINKTYPE_ETHERNET = 1).
    Ethernet,
    /// Raw IPv4/IPv6 (pcap LINKTYPE_RAW = 101, LINKTYPE_IPV4 = 228, LINKTYPE_IPV6 = 229, or
    /// DLT_RAW 12/14), and what a raw IP socket receives.
    RawIp,
    /// Linux cooked capture v1, what older `tcpdump -i any` writes (LINKTYPE_LINUX_SLL = 113).
    LinuxSll,
    /// Linux cooked capture v2, what `tcpdump -i any` writes since libpcap 1.10
    /// (LINKTYPE_LINUX_SLL2 = 276): a 20-byte header whose first two bytes are the EtherType.
    LinuxSll2,
}

/// Length of a LINKTYPE_LINUX_SLL2 header: protocol (2), reserved (2), interface index (4),
/// ARPHRD type (2), packet type (1), address length (1), address (8).
const SLL2_HEADER_LEN: usize = 20;

/// Cuts a UDP datagram out of a frame.
///
/// Errors: [`Error::BadFraming`] when the frame is not (Ethernet or Linux SLL or nothing) +
/// IPv4/IPv6 + UDP, or is shorter than its IP or UDP length fields say (e.g. cut by a capture
/// snap length). Panics: never.
pub fn parse_frame(frame: &[u8], link: LinkType) -> Result<UdpDatagram<'_>> {
    let sliced = match link {
        LinkType::Ethernet => SlicedPacket::from_ethernet(frame),
        LinkType::RawIp => SlicedPacket::from_ip(frame),
        LinkType::LinuxSll => SlicedPacket::from_linux_sll(frame),
        // etherparse has no SLL2: the EtherType names the protocol after the header.
        LinkType::LinuxSll2 => match frame.get(..SLL2_HEADER_LEN) {
            Some([0x08, 0x00, ..] | [0x86, 0xdd, ..]) => {
                SlicedPacket::from_ip(&frame[SLL2_HEADER_LEN..])
            }
            _ => return Err(Error::BadFraming),
        },
    }
    .map_err(|_| Error::BadFraming)?;
    // Offset of a sub-slice of `frame` from its start.
    let offset = |s: &[u8]| (s.as_ptr() as usize).wrapping_sub(frame.as_ptr() as usize);
    let (ip_at, ip_len, src, dst) = match &sliced.net {
        Some(NetSlice::Ipv4(v4)) => {
            let h = v4.header();
            (
                offset(h.slice()),
                h.slice().len(),
                h.source_addr().into(),
                h.destination_addr().into(),
            )
        }
        Some(NetSlice::Ipv6(v6)) => {
            let h = v6.header();
            (
                offset(h.slice()),
                h.slice().len(),
                h.source_addr().into(),
                h.destination_addr().into(),
            )
        }
        _ => return Err(Error::BadFraming),
    };
    let udp = match &sliced.transport {
        Some(TransportSlice::Udp(udp)) => udp,
        _ => return Err(Error::BadFraming),
    };
    let ip_header = ip_at
        .checked_add(ip_len)
        .and_then(|end| frame.get(ip_at..end))
        .ok_or(Error::BadFraming)?;
    Ok(UdpDatagram {
        ip_header,
        udp_header: udp.header_slice(),
        payload: udp.payload(),
        src,
        dst,
        src_port: udp.source_port(),
        dst_port: udp.destination_port(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The ConnectX-4 Lx CNP frame of secdev/scapy test/contrib/roce.uts ("RoCE CNP captured
    /// on ConnectX-4 Lx"), which docs/wire-facts.md §2.2 uses to check the ICRC byte order.
    const CX4_CNP_FRAME: [u8; 74] = [
        0xe4, 0x1d, 0x2d, 0xab, 0x2b, 0xc2, 0x7c, 0xfe, 0x90, 0x64, 0x3b, 0x32, 0x08, 0x00, 0x45,
        0xc2, 0x00, 0x3c, 0x71, 0x8c, 0x40, 0x00, 0x40, 0x11, 0x91, 0x61, 0x0a, 0x00, 0x11, 0x01,
        0x0a, 0x00, 0x12, 0x01, 0x00, 0x00, 0x12, 0xb7, 0x00, 0x28, 0x00, 0x00, 0x81, 0x00, 0xff,
        0xff, 0x40, 0x00, 0x01, 0x18, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x82, 0xfd, 0x00, 0x2a,
    ];

    #[test]
    fn ethernet_ipv4_udp_is_cut_into_headers_and_payload() {
        let d = parse_frame(&CX4_CNP_FRAME, LinkType::Ethernet).unwrap();
        assert_eq!(d.ip_header, &CX4_CNP_FRAME[14..34]);
        assert_eq!(d.udp_header, &CX4_CNP_FRAME[34..42]);
        assert_eq!(d.payload, &CX4_CNP_FRAME[42..]);
        assert_eq!(d.src, core::net::IpAddr::from([10, 0, 17, 1]));
        assert_eq!(d.dst, core::net::IpAddr::from([10, 0, 18, 1]));
        assert_eq!((d.src_port, d.dst_port), (0, 4791));
        // The same packet without its Ethernet header, as a raw-IP capture holds it.
        let raw = parse_frame(&CX4_CNP_FRAME[14..], LinkType::RawIp).unwrap();
        assert_eq!(raw.ip_header, d.ip_header);
        assert_eq!(raw.payload, d.payload);
    }

    #[test]
    fn ethernet_padding_is_not_payload_and_truncation_is_an_error() {
        let mut padded = CX4_CNP_FRAME.to_vec();
        padded.extend_from_slice(&[0xee; 6]);
        let d = parse_frame(&padded, LinkType::Ethernet).unwrap();
        assert_eq!(d.payload, &CX4_CNP_FRAME[42..]);
        for cut in 0..CX4_CNP_FRAME.len() {
            assert_eq!(
                parse_frame(&CX4_CNP_FRAME[..cut], LinkType::Ethernet),
                Err(Error::BadFraming),
                "cut at {cut}"
            );
        }
    }

    #[test]
    fn ipv6_header_is_the_fixed_40_bytes() {
        let mut pkt = vec![0x60, 0, 0, 0, 0, 12, 17, 64];
        pkt.extend_from_slice(&[0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
        pkt.extend_from_slice(&[0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]);
        pkt.extend_from_slice(&[0xc0, 0x00, 0x12, 0xb7, 0, 12, 0, 0, 1, 2, 3, 4]);
        let d = parse_frame(&pkt, LinkType::RawIp).unwrap();
        assert_eq!(d.ip_header, &pkt[..40]);
        assert_eq!(d.udp_header, &pkt[40..48]);
        assert_eq!(d.payload, &[1, 2, 3, 4]);
        assert_eq!((d.src_port, d.dst_port), (0xc000, 4791));
    }

    #[test]
    fn linux_cooked_capture_is_cut_like_ethernet() {
        // SLL v1: packet type 0 (to us), ARPHRD_ETHER, 6-byte address padded to 8, EtherType.
        let mut sll = vec![
            0, 0, 0, 1, 0, 6, 0x7c, 0xfe, 0x90, 0x64, 0x3b, 0x32, 0, 0, 0x08, 0x00,
        ];
        sll.extend_from_slice(&CX4_CNP_FRAME[14..]);
        let d = parse_frame(&sll, LinkType::LinuxSll).unwrap();
        assert_eq!(d.ip_header, &CX4_CNP_FRAME[14..34]);
        assert_eq!(d.payload, &CX4_CNP_FRAME[42..]);
    }

    #[test]
    fn linux_cooked_capture_v2_is_cut_after_its_20_bytes() {
        // SLL2: EtherType IPv4, reserved, ifindex 3, ARPHRD_ETHER, outgoing (4), 6-byte
        // address padded to 8.
        let mut sll2 = vec![
            0x08, 0x00, 0, 0, 0, 0, 0, 3, 0, 1, 4, 6, 0x7c, 0xfe, 0x90, 0x64, 0x3b, 0x32, 0, 0,
        ];
        sll2.extend_from_slice(&CX4_CNP_FRAME[14..]);
        let d = parse_frame(&sll2, LinkType::LinuxSll2).unwrap();
        assert_eq!(d.ip_header, &CX4_CNP_FRAME[14..34]);
        assert_eq!(d.payload, &CX4_CNP_FRAME[42..]);
        // Another protocol (ARP), and a header cut short.
        sll2[1] = 0x06;
        assert_eq!(
            parse_frame(&sll2, LinkType::LinuxSll2),
            Err(Error::BadFraming)
        );
        assert_eq!(
            parse_frame(&sll2[..19], LinkType::LinuxSll2),
            Err(Error::BadFraming)
        );
    }

    #[test]
    fn not_udp_is_bad_framing() {
        let mut tcp = CX4_CNP_FRAME;
        tcp[23] = 6; // IPv4 protocol: TCP
        assert_eq!(
            parse_frame(&tcp, LinkType::Ethernet),
            Err(Error::BadFraming)
        );
        assert_eq!(parse_frame(&[], LinkType::RawIp), Err(Error::BadFraming));
    }
}
