//! The fuzz seed corpus on stable: every file in `fuzz/seeds/` goes through the same checks as
//! the cargo-fuzz targets (`fuzz/src/lib.rs`, included below), plus every prefix of it and a
//! byte flip at each header position, so CI exercises the corpus without nightly.
//!
//! The seeds are cut out of the kernel-rxe captures in `tests/captures/` by
//! `write_seeds_from_captures` (ignored; run it to regenerate, see fuzz/README.md), and
//! `seeds_match_the_captures` keeps the committed files equal to what it would write.
//! Files named `regress-*` are hand-added fuzz findings and are only run, never regenerated.

#[path = "../fuzz/src/lib.rs"]
mod checks;

use softroce::wire::ip_udp::{LinkType, parse_frame};
use softroce::wire::{AethSyndrome, IcrcIp, ROCE_V2_UDP_PORT, RocePacket, icrc_of_datagram};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn seed_dir() -> PathBuf {
    root().join("fuzz/seeds")
}

/// The committed seeds, by file name.
fn committed_seeds() -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    for e in std::fs::read_dir(seed_dir()).expect("fuzz/seeds exists") {
        let p = e.expect("dir entry").path();
        let name = p
            .file_name()
            .expect("file name")
            .to_string_lossy()
            .into_owned();
        out.insert(name, std::fs::read(&p).expect("read seed"));
    }
    out
}

#[test]
fn seeds_pass_the_fuzz_checks() {
    let seeds = committed_seeds();
    assert!(seeds.len() >= 30, "only {} seeds", seeds.len());
    assert!(
        seeds.len() <= 64,
        "{} seeds: keep the corpus small",
        seeds.len()
    );
    let mut parsed = 0;
    for (name, data) in &seeds {
        checks::check_parse(data);
        checks::check_roundtrip(data);
        // Every prefix (truncation) and a flipped byte at each position of the first 64.
        for len in 0..data.len() {
            checks::check_parse(&data[..len]);
            checks::check_roundtrip(&data[..len]);
        }
        let mut m = data.clone();
        for i in 0..m.len().min(64) {
            m[i] ^= 0xff;
            checks::check_parse(&m);
            checks::check_roundtrip(&m);
            m[i] ^= 0xff;
        }
        // The corpus is what its names say, so a broken extractor cannot hide.
        if name.starts_with("pkt-unknown") {
            assert!(RocePacket::parse(data).is_err(), "{name}");
        } else if name.starts_with("pkt-") {
            assert!(RocePacket::parse(data).is_ok(), "{name}");
            parsed += 1;
        } else if let Some(rest) = name.strip_prefix("frame-") {
            let link = if rest.starts_with("eth") {
                LinkType::Ethernet
            } else {
                LinkType::RawIp
            };
            let d = parse_frame(data, link);
            if rest.contains("-ipv6-mld") {
                assert!(d.is_err(), "{name}: ICMPv6 is not UDP");
                continue;
            }
            let d = d.unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(d.dst_port, ROCE_V2_UDP_PORT, "{name}");
            let pkt = RocePacket::parse(d.payload).unwrap_or_else(|e| panic!("{name}: {e}"));
            // Captured ICRCs are valid over the captured IP/UDP headers.
            let icrc = softroce::wire::icrc_compute(d.ip_header, d.udp_header, pkt.body);
            assert_eq!(icrc, pkt.icrc, "{name}: ICRC");
        } else {
            assert!(name.starts_with("regress-"), "unexpected seed name {name}");
        }
    }
    assert!(parsed >= 27, "only {parsed} packet seeds parse");
}

// ---------------------------------------------------------------------------------------------
// Extraction from the captures
// ---------------------------------------------------------------------------------------------

/// Opcodes whose smallest captured frame is also kept whole (Ethernet) and without its
/// Ethernet header (raw IP), so `parse_frame` gets real frames of each shape.
const FRAME_OPCODES: [&str; 5] = [
    "RC_ACKNOWLEDGE",
    "RC_SEND_ONLY",
    "RC_FETCH_ADD",
    "RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE",
    "UD_SEND_ONLY",
];

fn pcap_frames(path: &Path) -> Vec<Vec<u8>> {
    softroce::net::CaptureReader::open(path)
        .expect("open pcap")
        .map(|pkt| {
            let pkt = pkt.expect("pcap record");
            assert_eq!(
                pkt.link,
                Ok(softroce::wire::ip_udp::LinkType::Ethernet),
                "{}",
                path.display()
            );
            pkt.data
        })
        .collect()
}

/// Keeps the smallest value per key (the first one on a tie).
fn keep_smallest(map: &mut BTreeMap<String, Vec<u8>>, key: String, value: &[u8]) {
    match map.get(&key) {
        Some(old) if old.len() <= value.len() => {}
        _ => {
            map.insert(key, value.to_vec());
        }
    }
}

/// The seed corpus: for each opcode (and each ACK syndrome class) seen in the captures, the
/// smallest UDP payload; a few whole frames; one synthesized IPv6 frame; one non-UDP IPv6
/// frame. Deterministic: captures are read in name order.
fn seeds_from_captures() -> BTreeMap<String, Vec<u8>> {
    let mut paths: Vec<_> = std::fs::read_dir(root().join("tests/captures"))
        .expect("tests/captures exists")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "pcap"))
        .collect();
    paths.sort();
    let mut seeds = BTreeMap::new();
    let mut frames: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    for p in &paths {
        for f in pcap_frames(p) {
            let Ok(d) = parse_frame(&f, LinkType::Ethernet) else {
                if f.get(12..14) == Some(&[0x86, 0xdd]) {
                    keep_smallest(&mut seeds, "frame-eth-ipv6-mld".into(), &f);
                }
                continue;
            };
            if d.dst_port != ROCE_V2_UDP_PORT {
                continue;
            }
            let pkt = match RocePacket::parse(d.payload) {
                Ok(pkt) => pkt,
                Err(_) => {
                    let key = format!("pkt-unknown-{:#04x}", d.payload.first().unwrap_or(&0));
                    keep_smallest(&mut seeds, key, d.payload);
                    continue;
                }
            };
            let name = pkt.info.name;
            let mut key = format!("pkt-{}", name.to_lowercase());
            if let Some(aeth) = pkt.repr.aeth.filter(|_| name == "RC_ACKNOWLEDGE") {
                key.push_str(&match AethSyndrome::from_byte(aeth.syndrome) {
                    AethSyndrome::Ack { .. } => "-ack".to_string(),
                    AethSyndrome::RnrNak { .. } => "-rnr".to_string(),
                    _ => format!("-nak-{:#04x}", aeth.syndrome),
                });
            }
            keep_smallest(&mut seeds, key, d.payload);
            if FRAME_OPCODES.contains(&name) && d.src.is_ipv4() {
                keep_smallest(&mut frames, name.to_lowercase(), &f);
            }
        }
    }
    for (name, f) in frames {
        seeds.insert(format!("frame-eth-ipv4-{name}"), f.clone());
        seeds.insert(format!("frame-raw-ipv4-{name}"), f[14..].to_vec());
    }
    let ud = seeds["pkt-ud_send_only"].clone();
    seeds.insert("frame-raw-ipv6-ud_send_only".into(), ipv6_frame(&ud));
    seeds
}

/// A raw IPv6 + UDP frame around a captured UDP payload, with the ICRC recomputed for it.
/// (The captures hold no RoCE over IPv6.)
fn ipv6_frame(udp_payload: &[u8]) -> Vec<u8> {
    let src = std::net::Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1);
    let dst = std::net::Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 2);
    let flow = IcrcIp::V6 {
        src,
        dst,
        src_port: 0xd078,
        dst_port: ROCE_V2_UDP_PORT,
    };
    let mut payload = udp_payload.to_vec();
    let icrc = icrc_of_datagram(&flow, &payload);
    let n = payload.len();
    payload[n - 4..].copy_from_slice(&icrc);
    let udp_len = u16::try_from(8 + n).expect("small seed");
    let mut f = vec![0x60, 0, 0, 0];
    f.extend_from_slice(&udp_len.to_be_bytes());
    f.extend_from_slice(&[17, 64]);
    f.extend_from_slice(&src.octets());
    f.extend_from_slice(&dst.octets());
    f.extend_from_slice(&0xd078u16.to_be_bytes());
    f.extend_from_slice(&ROCE_V2_UDP_PORT.to_be_bytes());
    f.extend_from_slice(&udp_len.to_be_bytes());
    f.extend_from_slice(&[0, 0]);
    f.extend_from_slice(&payload);
    f
}

#[test]
fn seeds_match_the_captures() {
    let want = seeds_from_captures();
    let have: BTreeMap<_, _> = committed_seeds()
        .into_iter()
        .filter(|(name, _)| !name.starts_with("regress-"))
        .collect();
    let want_names: Vec<_> = want.keys().collect();
    let have_names: Vec<_> = have.keys().collect();
    assert_eq!(
        have_names, want_names,
        "fuzz/seeds is stale: run `cargo test --test fuzz_seeds -- --ignored write_seeds_from_captures`"
    );
    for (name, bytes) in &want {
        assert_eq!(&have[name], bytes, "fuzz/seeds/{name} is stale");
    }
}

/// Regenerates fuzz/seeds from tests/captures (keeps `regress-*` files).
#[test]
#[ignore = "writes fuzz/seeds; run by hand after the captures change"]
fn write_seeds_from_captures() {
    let dir = seed_dir();
    std::fs::create_dir_all(&dir).expect("create fuzz/seeds");
    for (name, _) in committed_seeds() {
        if !name.starts_with("regress-") {
            std::fs::remove_file(dir.join(&name)).expect("remove old seed");
        }
    }
    let seeds = seeds_from_captures();
    for (name, bytes) in &seeds {
        std::fs::write(dir.join(name), bytes).expect("write seed");
    }
    eprintln!("wrote {} seeds to {}", seeds.len(), dir.display());
}
