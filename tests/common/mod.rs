//! Shared helpers for integration tests: reading the golden captures in tests/captures.

#![allow(dead_code)]

use softroce::wire::IcrcIp;
use softroce::wire::ip_udp::{LinkType, parse_frame};
use std::net::IpAddr;
use std::path::PathBuf;

/// One RoCEv2 datagram from a capture, with the IP/UDP facts its ICRC covers.
#[derive(Debug, Clone)]
pub struct CapturedDatagram {
    /// 1-based frame number in the file.
    pub frame: u64,
    /// IP header bytes as captured.
    pub ip_header: Vec<u8>,
    /// UDP header bytes.
    pub udp_header: Vec<u8>,
    /// UDP payload: BTH … ICRC.
    pub payload: Vec<u8>,
    /// Source address.
    pub src: IpAddr,
    /// Destination address.
    pub dst: IpAddr,
    /// UDP source port.
    pub src_port: u16,
    /// UDP destination port.
    pub dst_port: u16,
}

impl CapturedDatagram {
    /// The flow as `IcrcIp`, with the IPv4 Identification the sender wrote.
    pub fn icrc_ip(&self) -> IcrcIp {
        match (self.src, self.dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => IcrcIp::V4 {
                src: s,
                dst: d,
                ident: u16::from_be_bytes([self.ip_header[4], self.ip_header[5]]),
                src_port: self.src_port,
                dst_port: self.dst_port,
            },
            (IpAddr::V6(s), IpAddr::V6(d)) => IcrcIp::V6 {
                src: s,
                dst: d,
                src_port: self.src_port,
                dst_port: self.dst_port,
            },
            _ => panic!("mixed address families"),
        }
    }
}

/// Path of a capture file in tests/captures.
pub fn capture_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/captures")
        .join(name)
}

/// Every UDP datagram in capture `name` (Ethernet or raw-IP link type).
pub fn datagrams(name: &str) -> Vec<CapturedDatagram> {
    let r = softroce::net::CaptureReader::open(&capture_path(name)).expect("open capture");
    let mut out = Vec::new();
    for pkt in r {
        let pkt = pkt.expect("pcap record");
        let link = match pkt.link {
            Ok(l @ (LinkType::Ethernet | LinkType::RawIp)) => l,
            other => panic!("{name}: unexpected link type {other:?}"),
        };
        if let Ok(d) = parse_frame(&pkt.data, link) {
            out.push(CapturedDatagram {
                frame: pkt.number,
                ip_header: d.ip_header.to_vec(),
                udp_header: d.udp_header.to_vec(),
                payload: d.payload.to_vec(),
                src: d.src,
                dst: d.dst,
                src_port: d.src_port,
                dst_port: d.dst_port,
            });
        }
    }
    out
}
