//! `solve_ipv4_ident` against kernel rxe's own packets: every IPv4 RoCEv2 frame of the
//! captures in tests/captures (rxe writes a counter in the IPv4 Identification, which a UDP
//! socket cannot see, and the receive-side ICRC check solves for it), taken in order through
//! one thread, so that the per-length bases it keeps serve many flows, lengths and evictions.

use softroce::net::pcap_reader::CaptureReader;
use softroce::wire::ip_udp::{LinkType, parse_frame};
use softroce::wire::{IcrcIp, RocePacket, solve_ipv4_ident};
use std::net::IpAddr;

#[test]
fn the_solved_ident_is_the_one_rxe_wrote_in_every_captured_packet() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/captures");
    let mut paths: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "pcap"))
        .collect();
    paths.sort();
    let (mut checked, mut nonzero) = (0usize, 0usize);
    for path in &paths {
        for f in CaptureReader::open(path).expect("open a capture") {
            let f = f.expect("a frame");
            let Ok(LinkType::Ethernet) = f.link else {
                continue;
            };
            // Ethernet II without a VLAN tag, then IPv4: its Identification at bytes 4..6.
            if f.data.get(12..14) != Some(&[0x08, 0x00][..]) {
                continue;
            }
            let ident = u16::from_be_bytes([f.data[18], f.data[19]]);
            let Ok(d) = parse_frame(&f.data, LinkType::Ethernet) else {
                continue;
            };
            let (IpAddr::V4(src), IpAddr::V4(dst)) = (d.src, d.dst) else {
                continue;
            };
            let Ok(p) = RocePacket::parse(d.payload) else {
                continue;
            };
            let ip = |ident| IcrcIp::V4 {
                src,
                dst,
                ident,
                src_port: d.src_port,
                dst_port: d.dst_port,
            };
            if !p.icrc_ok(&ip(ident)) {
                continue;
            }
            assert_eq!(
                solve_ipv4_ident(&ip(0), p.body, p.icrc),
                Some(ident),
                "{} frame {}",
                path.display(),
                f.number
            );
            checked += 1;
            nonzero += usize::from(ident != 0);
        }
    }
    println!("{checked} packets solved, {nonzero} with a non-zero ID");
    assert!(
        nonzero > 500,
        "{checked} packets, {nonzero} with a non-zero ID"
    );
}
