//! The checks behind the fuzz targets, in one place so that two harnesses share them:
//! `fuzz_targets/*.rs` (cargo-fuzz, nightly flags) and the main crate's `tests/fuzz_seeds.rs`,
//! which includes this file with `#[path]` and runs it over `fuzz/seeds/` on stable.
//!
//! A check panics on a finding; otherwise it returns. Under `cfg(fuzzing)` the wire layer
//! passes every ICRC (`RocePacket::icrc_ok`) so inputs reach deeper code; the checks below
//! never assert on `icrc_ok` and compute ICRCs with `icrc_of_body` when they need one.

use softroce::wire::ip_udp::{LinkType, parse_frame};
use softroce::wire::{
    ExtHeaders, ICRC_LEN, IcrcIp, PacketRepr, ROCE_V2_UDP_PORT, RocePacket, icrc_compute,
    icrc_of_body, pad_count,
};
use std::net::{Ipv4Addr, Ipv6Addr};

/// Flows to compute ICRCs on (addresses from the documentation ranges; nothing is sent).
pub const FLOWS: [IcrcIp; 2] = [
    IcrcIp::V4 {
        src: Ipv4Addr::new(192, 0, 2, 1),
        dst: Ipv4Addr::new(192, 0, 2, 2),
        ident: 0,
        src_port: 0xc000,
        dst_port: ROCE_V2_UDP_PORT,
    },
    IcrcIp::V6 {
        src: Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1),
        dst: Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 2),
        src_port: 0xc000,
        dst_port: ROCE_V2_UDP_PORT,
    },
];

/// `parse_packet` target: `data` as a UDP payload, then as an Ethernet frame and as a raw IP
/// packet. Nothing may panic; what parses must account for every byte.
pub fn check_parse(data: &[u8]) {
    check_packet(data);
    for link in [LinkType::Ethernet, LinkType::RawIp] {
        if let Ok(d) = parse_frame(data, link) {
            let body = &d.payload[..d.payload.len().saturating_sub(ICRC_LEN)];
            let _ = icrc_compute(d.ip_header, d.udp_header, body);
            check_packet(d.payload);
        }
    }
}

/// Parses one UDP payload and checks the length accounting of what parses.
fn check_packet(data: &[u8]) {
    let Ok(pkt) = RocePacket::parse(data) else {
        return;
    };
    let hlen = pkt.info.headers.header_len();
    let pad = usize::from(pkt.repr.bth.pad_count);
    assert_eq!(hlen + pkt.payload.len() + pad + ICRC_LEN, data.len());
    assert_eq!(pkt.payload.len(), pkt.repr.payload_len);
    assert_eq!(pkt.body.len() + ICRC_LEN, data.len());
    assert_eq!(pkt.repr.headers(), pkt.info.headers);
    assert_eq!(pkt.repr.bth.opcode, pkt.info.opcode);
    assert_eq!(pkt.repr.bth.tver, 0);
    assert!(pkt.info.payload || (pkt.payload.is_empty() && pad == 0));
    for ip in &FLOWS {
        let _ = pkt.icrc_ok(ip);
    }
}

/// `roundtrip` target: whatever parses re-emits to bytes that parse to the same repr (with
/// the pad count recomputed from the payload length, as `emit` does) and the same payload;
/// emitting again gives the same bytes; and when the input was already in canonical form, the
/// re-emitted bytes equal the input's up to the ICRC (rustls `fuzz_message` habit).
pub fn check_roundtrip(data: &[u8]) {
    let Ok(pkt) = RocePacket::parse(data) else {
        return;
    };
    let mut want = pkt.repr;
    want.bth.pad_count = pad_count(want.payload_len);
    let canonical = canonical_body(data, &pkt);
    for ip in &FLOWS {
        let buf = emit(&want, pkt.payload, ip);
        let again = match RocePacket::parse(&buf) {
            Ok(p) => p,
            Err(e) => panic!("re-emitted {} does not parse: {e}", pkt.info.name),
        };
        assert_eq!(again.repr, want, "repr changed through emit -> parse");
        assert_eq!(
            again.payload, pkt.payload,
            "payload changed through emit -> parse"
        );
        assert_eq!(
            icrc_of_body(ip, again.body),
            again.icrc,
            "emitted ICRC is wrong"
        );
        assert_eq!(
            emit(&again.repr, again.payload, ip),
            buf,
            "emit is not stable"
        );
        if let Some(body) = &canonical {
            assert_eq!(
                &buf[..buf.len() - ICRC_LEN],
                &body[..],
                "canonical bytes changed"
            );
        }
    }
}

/// Emits `repr` with `payload` on flow `ip` into a buffer of exactly `buffer_len()` bytes.
pub fn emit(repr: &PacketRepr, payload: &[u8], ip: &IcrcIp) -> Vec<u8> {
    let mut buf = vec![0u8; repr.buffer_len()];
    let n = repr.emit(&mut buf, payload, ip);
    assert_eq!(n, buf.len());
    buf
}

/// The input's bytes before the ICRC as `emit` would write them, when the length is kept
/// (pad count equal to the computed one): reserved bits the reprs drop are cleared (BTH byte 4
/// bits 5-0, BTH byte 8 bits 6-0, the DETH reserved byte) and the pad bytes zeroed. `None` when
/// the pad count disagrees with the payload length, because then `emit` changes the length.
fn canonical_body(data: &[u8], pkt: &RocePacket<'_>) -> Option<Vec<u8>> {
    if pkt.repr.bth.pad_count != pad_count(pkt.repr.payload_len) {
        return None;
    }
    let mut body = pkt.body.to_vec();
    body[4] &= 0xc0;
    body[8] &= 0x80;
    if let Some(o) = pkt.info.headers.offset_of(ExtHeaders::DETH) {
        body[o + 4] = 0;
    }
    let pad_at = pkt.info.headers.header_len() + pkt.repr.payload_len;
    body[pad_at..].fill(0);
    debug_assert_eq!(body.len() + ICRC_LEN, data.len());
    Some(body)
}
