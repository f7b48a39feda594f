//! Golden vectors: every RoCEv2 packet in the captures under tests/captures (made by kernel
//! rxe 6.1 driving rdma-core tools, perftest and pyverbs; plus one third-party sender) must
//! parse, pass the ICRC computed over the IP header as captured, and re-emit from its Repr to
//! the identical bytes. Source of the captures: docs/wire-facts.md (preface: the captures in tests/captures).

mod common;

use common::{CapturedDatagram, datagrams};
use softroce::wire::{Error, PacketRepr, ROCE_V2_UDP_PORT, RocePacket};
use std::collections::BTreeMap;

/// (file name, datagram) for every UDP datagram of every capture, files in name order.
fn all_datagrams() -> Vec<(String, CapturedDatagram)> {
    let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/captures");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .expect("tests/captures exists")
        .map(|e| {
            e.expect("dir entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .filter(|n| n.ends_with(".pcap"))
        .collect();
    names.sort();
    assert!(
        names.len() >= 35,
        "expected the rxe captures, found {}",
        names.len()
    );
    names
        .into_iter()
        .flat_map(|n| datagrams(&n).into_iter().map(move |d| (n.clone(), d)))
        .collect()
}

#[test]
fn every_captured_packet_parses_checks_and_reemits() {
    let mut by_opcode: BTreeMap<String, usize> = BTreeMap::new();
    let mut unknown = 0;
    let mut checked = 0;
    for (file, d) in all_datagrams() {
        if d.dst_port != ROCE_V2_UDP_PORT {
            continue;
        }
        let what = format!("{file} #{}", d.frame);
        let pkt = match RocePacket::parse(&d.payload) {
            Ok(p) => p,
            Err(e @ (Error::UnknownOpcode(_) | Error::BadTver(_))) => {
                // The host-path captures hold three frames that are not RoCE (Wireshark
                // calls them malformed "RD" packets); softroce drops them with a reason.
                assert!(file.starts_with("host-path"), "{what}: {e}");
                unknown += 1;
                continue;
            }
            Err(e) => panic!("{what}: {e}"),
        };
        // ICRC over the IP header exactly as captured (rxe's non-zero IP ID is covered).
        let expect = softroce::wire::icrc_compute(&d.ip_header, &d.udp_header, pkt.body);
        assert_eq!(expect, pkt.icrc, "{what}: ICRC");
        let ip = d.icrc_ip();
        assert!(pkt.icrc_ok(&ip), "{what}: ICRC through IcrcIp");
        // Re-emit from the Repr: identical bytes.
        let repr: PacketRepr = pkt.repr;
        let mut buf = vec![0u8; repr.buffer_len()];
        let n = repr.emit(&mut buf, pkt.payload, &ip);
        if !file.starts_with("oferby") {
            assert_eq!(&buf[..n], &d.payload[..], "{what}: re-emitted bytes differ");
        } else {
            // The third-party sender sets reserved bits in BTH byte 4, which BthRepr does not
            // keep (they are masked in the ICRC and ignored by receivers); all else is equal.
            assert_eq!(buf[4] & 0xc0, d.payload[4] & 0xc0, "{what}: FECN/BECN");
            buf[4] = d.payload[4];
            assert_eq!(&buf[..n], &d.payload[..], "{what}: re-emitted bytes differ");
        }
        *by_opcode
            .entry(pkt.repr.bth.opcode.to_string())
            .or_default() += 1;
        checked += 1;
    }
    eprintln!("checked {checked} packets, {unknown} unknown-opcode drops: {by_opcode:?}");
    assert_eq!(unknown, 6, "non-RoCE frames in the two host-path captures");
    // Every opcode that kernel rxe 6.1 put in the captures was seen and checked.
    for op in [
        "RC_SEND_FIRST",
        "RC_SEND_MIDDLE",
        "RC_SEND_LAST",
        "RC_SEND_LAST_WITH_IMMEDIATE",
        "RC_SEND_ONLY",
        "RC_SEND_ONLY_WITH_IMMEDIATE",
        "RC_RDMA_WRITE_FIRST",
        "RC_RDMA_WRITE_MIDDLE",
        "RC_RDMA_WRITE_LAST",
        "RC_RDMA_WRITE_LAST_WITH_IMMEDIATE",
        "RC_RDMA_WRITE_ONLY",
        "RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE",
        "RC_RDMA_READ_REQUEST",
        "RC_RDMA_READ_RESPONSE_FIRST",
        "RC_RDMA_READ_RESPONSE_MIDDLE",
        "RC_RDMA_READ_RESPONSE_LAST",
        "RC_RDMA_READ_RESPONSE_ONLY",
        "RC_ACKNOWLEDGE",
        "RC_ATOMIC_ACKNOWLEDGE",
        "RC_COMPARE_SWAP",
        "RC_FETCH_ADD",
        "UC_SEND_ONLY",
        "UC_SEND_ONLY_WITH_IMMEDIATE",
        "UC_RDMA_WRITE_ONLY",
        "UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE",
        "UD_SEND_ONLY",
        "UD_SEND_ONLY_WITH_IMMEDIATE",
    ] {
        assert!(
            by_opcode.get(op).copied().unwrap_or(0) > 0,
            "no {op} in the captures"
        );
    }
    assert!(checked > 900, "only {checked} packets checked");
}

#[test]
fn a_flipped_bit_fails_the_icrc() {
    // Every single-bit flip in the first RC packet of each capture breaks the ICRC.
    let mut tried = 0;
    for (file, d) in all_datagrams().into_iter().filter(|(_, d)| d.frame == 1) {
        if d.dst_port != ROCE_V2_UDP_PORT {
            continue;
        }
        let Ok(pkt) = RocePacket::parse(&d.payload) else {
            continue;
        };
        let ip = d.icrc_ip();
        let good = pkt.icrc;
        let mut body = pkt.body.to_vec();
        for bit in 0..body.len() * 8 {
            if bit / 8 == 4 {
                continue; // BTH byte 4 (FECN/BECN/reserved) is masked by design
            }
            body[bit / 8] ^= 1 << (bit % 8);
            assert_ne!(
                softroce::wire::icrc_of_body(&ip, &body),
                good,
                "{file} bit {bit}"
            );
            body[bit / 8] ^= 1 << (bit % 8);
            tried += 1;
        }
    }
    assert!(tried > 1000);
}
