//! Outer IPv4/IPv6 + UDP framing, through etherparse. Used for pcap files and raw-IP input;
//! the live data path gets addresses from the UDP socket instead.

use super::{Error, Result};
use etherparse::{NetSlice, SlicedPacket, TransportSlice};

/// One RoCEv2 datagram cut out of a captured frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdpDatagram<'a> {
    /// The IP header bytes as captured (20+ bytes IPv4, 40 bytes IPv6).
    pub ip_header: &'a [u8],
    /// The 8 UDP header bytes.
    pub udp_header: &'a [u8],
    /// The UDP payload (for RoCEv2: BTH … ICRC).
    pub payload: &'a [u8],
    /// Source and destination addresses.
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
    /// Ethernet II (pcap LINKTYPE_ETHERNET = 1).
    Ethernet,
    /// Raw IPv4/IPv6 (pcap LINKTYPE_RAW = 101, or DLT_RAW 12/14).
    RawIp,
}

/// Cuts a UDP datagram out of a frame. Errors: [`Error::BadFraming`] when the frame is not
/// IPv4/IPv6 + UDP. Panics: never.
pub fn parse_frame(frame: &[u8], link: LinkType) -> Result<UdpDatagram<'_>> {
    let sliced = match link {
        LinkType::Ethernet => SlicedPacket::from_ethernet(frame),
        LinkType::RawIp => SlicedPacket::from_ip(frame),
    }
    .map_err(|_| Error::BadFraming)?;
    let (ip_len, src, dst) = match &sliced.net {
        Some(NetSlice::Ipv4(v4)) => {
            let h = v4.header();
            (
                usize::from(h.ihl()) * 4,
                h.source_addr().into(),
                h.destination_addr().into(),
            )
        }
        Some(NetSlice::Ipv6(v6)) => {
            let h = v6.header();
            (40, h.source_addr().into(), h.destination_addr().into())
        }
        _ => return Err(Error::BadFraming),
    };
    let udp = match &sliced.transport {
        Some(TransportSlice::Udp(udp)) => udp,
        _ => return Err(Error::BadFraming),
    };
    // The UDP slice lies inside `frame`; the IP header is the `ip_len` bytes before it.
    let udp_off = (udp.slice().as_ptr() as usize).wrapping_sub(frame.as_ptr() as usize);
    let ip_header = udp_off
        .checked_sub(ip_len)
        .and_then(|start| frame.get(start..udp_off))
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
