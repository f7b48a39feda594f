//! `softroce decode [--json] FILE`: explains every frame of a pcap or pcapng file.
//!
//! Link types: Ethernet (1), raw IP (101, and 228/229 IPv4/IPv6, DLT_RAW 12/14) and Linux
//! cooked capture v1 and v2 (113, 276: `tcpdump -i any`). Frames are numbered from 1 in file
//! order, as Wireshark numbers them.
//! A RoCEv2 frame is a UDP datagram to port 4791. Its ICRC is checked over the IP and UDP
//! headers exactly as captured (`icrc_ok`: true or false; null when there is nothing to check:
//! no RoCEv2 datagram, fewer bytes than a BTH and an ICRC, or a frame cut by the snap length).
//!
//! Human output: one line per frame; PSNs in hex (`psn=0x000100`), as everywhere else in
//! softroce (the JSON has them as numbers). `--json`: one JSON object per line, with the frame
//! number, addresses, ports, the IPv4 Identification, the opcode (number and name), every field
//! of every header present (objects `bth`, `deth`, `feth`, `reth`, `atomic_eth`, `aeth`,
//! `atomic_ack_eth`, `immdt`, `ieth`, with the field names of `softroce::wire`), `payload_len`,
//! the ICRC as its four wire bytes read big-endian (as Wireshark shows it), `icrc_ok`, and for
//! a frame the wire layer rejects, `error` and the `drop_reason` a device would count.
//! The JSON is serde_json's, from the structs at the end of this file.
//!
//! A capture cut short (Ctrl-C on the program writing it) is decoded up to its last whole
//! frame; then the summary is printed and decode fails with "truncated after frame N".

use super::BoxError;
use serde::Serialize;
use softroce::net::{CaptureReader, CapturedFrame};
use softroce::transport::DropReason;
use softroce::wire::ip_udp::{UdpDatagram, parse_frame};
use softroce::wire::{
    AethSyndrome, Bth, BthRepr, ICRC_LEN, ROCE_V2_UDP_PORT, RocePacket, icrc_compute,
};
use std::fmt::Write as _;
use std::io::{self, Write};
use std::net::IpAddr;
use std::path::Path;

/// Length of a BTH in bytes.
const BTH_LEN: usize = 12;

/// One captured frame.
type Frame = CapturedFrame;

/// Decodes `path` to stdout.
pub fn run(path: &Path, json: bool) -> Result<(), BoxError> {
    let stdout = io::stdout();
    let mut out = io::BufWriter::new(stdout.lock());
    let mut stats = Stats::default();
    let frames = CaptureReader::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut read_error = None;
    for f in frames {
        let f = match f {
            Ok(f) => f,
            Err(e) => {
                read_error = Some(e);
                break;
            }
        };
        let d = decode(&f);
        stats.add(&d);
        let line = if json { d.json() } else { d.human() };
        match writeln!(out, "{line}") {
            Ok(()) => {}
            // `softroce decode … | head` closes the pipe early: not an error.
            Err(e) if e.kind() == io::ErrorKind::BrokenPipe => return Ok(()),
            Err(e) => return Err(e.into()),
        }
    }
    match out.flush() {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => return Ok(()),
        Err(e) => return Err(e.into()),
    }
    if !json || read_error.is_some() {
        eprintln!(
            "{} frames: {} RoCEv2, ICRC ok {}, ICRC bad {}, not decodable {}",
            stats.frames, stats.roce, stats.icrc_ok, stats.icrc_bad, stats.errors
        );
    }
    match read_error {
        Some(e) => Err(format!("{}: {e}", path.display()).into()),
        None => Ok(()),
    }
}

#[derive(Default)]
struct Stats {
    frames: u64,
    roce: u64,
    icrc_ok: u64,
    icrc_bad: u64,
    errors: u64,
}

impl Stats {
    fn add(&mut self, d: &Decoded) {
        self.frames += 1;
        if d.pkt.is_some() {
            self.roce += 1;
        }
        match d.icrc_ok {
            Some(true) => self.icrc_ok += 1,
            Some(false) => self.icrc_bad += 1,
            None => {}
        }
        if d.error.is_some() {
            self.errors += 1;
        }
    }
}

/// What one frame holds.
struct Decoded<'a> {
    number: u64,
    datagram: Option<UdpDatagram<'a>>,
    /// The BTH, when 12 bytes are present (also for opcodes the wire layer rejects).
    bth: Option<BthRepr>,
    pkt: Option<RocePacket<'a>>,
    icrc: Option<[u8; 4]>,
    icrc_ok: Option<bool>,
    error: Option<String>,
    drop_reason: Option<DropReason>,
}

fn decode(f: &Frame) -> Decoded<'_> {
    let mut d = Decoded {
        number: f.number,
        datagram: None,
        bth: None,
        pkt: None,
        icrc: None,
        icrc_ok: None,
        error: None,
        drop_reason: None,
    };
    let link = match f.link {
        Ok(l) => l,
        Err(n) => {
            d.error = Some(format!("unsupported link type {n}"));
            return d;
        }
    };
    let dg = match parse_frame(&f.data, link) {
        Ok(dg) => dg,
        Err(e) => {
            d.error = Some(if (f.data.len() as u64) < u64::from(f.orig_len) {
                "frame cut by the capture's snap length".to_string()
            } else {
                e.to_string()
            });
            if f.data.len() as u64 >= u64::from(f.orig_len) {
                d.drop_reason = Some(DropReason::from(e));
            }
            return d;
        }
    };
    d.datagram = Some(dg);
    if dg.dst_port != ROCE_V2_UDP_PORT {
        d.error = Some(format!("UDP port {} is not RoCEv2", dg.dst_port));
        return d;
    }
    let payload = dg.payload;
    // The BTH as far as it goes, even when the opcode or TVer makes the packet invalid.
    if let Ok(view) = Bth::new_checked(payload) {
        d.bth = Some(BthRepr {
            opcode: view.opcode(),
            se: view.se(),
            mig_req: view.mig_req(),
            pad_count: view.pad_count(),
            tver: view.tver(),
            pkey: view.pkey(),
            fecn: view.fecn(),
            becn: view.becn(),
            dest_qpn: view.dest_qpn(),
            ack_req: view.ack_req(),
            psn: view.psn(),
        });
    }
    if payload.len() >= BTH_LEN + ICRC_LEN {
        let (body, icrc) = payload.split_at(payload.len() - ICRC_LEN);
        let mut wire = [0u8; 4];
        wire.copy_from_slice(icrc);
        d.icrc = Some(wire);
        d.icrc_ok = Some(icrc_compute(dg.ip_header, dg.udp_header, body) == wire);
    }
    match RocePacket::parse(payload) {
        Ok(p) => d.pkt = Some(p),
        Err(e) => {
            d.error = Some(e.to_string());
            d.drop_reason = Some(DropReason::from(e));
        }
    }
    d
}

/// IPv4 Identification of a captured IPv4 header.
fn ip_ident(ip_header: &[u8]) -> Option<u16> {
    match ip_header {
        [b0, _, _, _, i0, i1, ..] if b0 >> 4 == 4 => Some(u16::from_be_bytes([*i0, *i1])),
        _ => None,
    }
}

impl Decoded<'_> {
    fn json(&self) -> String {
        let dg = self.datagram.as_ref();
        let repr = self.pkt.as_ref().map(|p| &p.repr);
        let line = FrameJson {
            frame: self.number,
            src: dg.map(|d| d.src.to_string()),
            dst: dg.map(|d| d.dst.to_string()),
            src_port: dg.map(|d| d.src_port),
            dst_port: dg.map(|d| d.dst_port),
            ip_id: dg.and_then(|d| ip_ident(d.ip_header)),
            opcode: self.bth.map(|b| b.opcode.0),
            opcode_name: self.bth.map(|b| b.opcode.to_string()),
            bth: self.bth.map(|b| BthJson {
                opcode: b.opcode.0,
                se: b.se,
                mig_req: b.mig_req,
                pad_count: b.pad_count,
                tver: b.tver,
                pkey: b.pkey,
                fecn: b.fecn,
                becn: b.becn,
                dest_qpn: b.dest_qpn,
                ack_req: b.ack_req,
                psn: b.psn.value(),
            }),
            deth: repr.and_then(|r| r.deth).map(|h| DethJson {
                qkey: h.qkey,
                src_qpn: h.src_qpn,
            }),
            feth: repr.and_then(|r| r.feth).map(|value| FethJson { value }),
            reth: repr.and_then(|r| r.reth).map(|h| RethJson {
                va: h.va,
                rkey: h.rkey,
                dma_len: h.dma_len,
            }),
            atomic_eth: repr.and_then(|r| r.atomic_eth).map(|h| AtomicEthJson {
                va: h.va,
                rkey: h.rkey,
                swap_add: h.swap_add,
                compare: h.compare,
            }),
            aeth: repr.and_then(|r| r.aeth).map(|h| AethJson {
                syndrome: h.syndrome,
                msn: h.msn,
            }),
            atomic_ack_eth: repr
                .and_then(|r| r.atomic_ack_eth)
                .map(|h| AtomicAckEthJson {
                    orig_remote_data: h.orig_remote_data,
                }),
            immdt: repr.and_then(|r| r.immdt).map(|h| ImmDtJson {
                imm_data: h.imm_data,
            }),
            ieth: repr.and_then(|r| r.ieth).map(|h| IethJson { rkey: h.rkey }),
            payload_len: repr.map(|r| r.payload_len as u64),
            icrc: self
                .icrc
                .map(|i| format!("{:#010x}", u32::from_be_bytes(i))),
            icrc_ok: self.icrc_ok,
            error: self.error.as_deref(),
            drop_reason: self.drop_reason.map(|r| r.name()),
        };
        // Serialising plain structs of numbers, strings and booleans cannot fail.
        serde_json::to_string(&line).unwrap_or_default()
    }

    fn human(&self) -> String {
        let mut s = format!("{:>6}", self.number);
        if let Some(dg) = &self.datagram {
            let addr = |ip: IpAddr, port: u16| match ip {
                IpAddr::V4(_) => format!("{ip}:{port}"),
                IpAddr::V6(_) => format!("[{ip}]:{port}"),
            };
            let _ = write!(
                s,
                " {} > {}",
                addr(dg.src, dg.src_port),
                addr(dg.dst, dg.dst_port)
            );
            if let Some(id) = ip_ident(dg.ip_header) {
                let _ = write!(s, " id={id:#06x}");
            }
        }
        if let Some(b) = &self.bth {
            let _ = write!(s, " {} qp={:#x} psn={}", b.opcode, b.dest_qpn, b.psn);
            for (on, name) in [
                (b.ack_req, "A"),
                (b.se, "SE"),
                (b.mig_req, "M"),
                (b.fecn, "FECN"),
                (b.becn, "BECN"),
            ] {
                if on {
                    let _ = write!(s, " {name}");
                }
            }
            if b.pkey != 0xffff {
                let _ = write!(s, " pkey={:#06x}", b.pkey);
            }
        }
        if let Some(p) = &self.pkt {
            let r = &p.repr;
            if let Some(h) = r.deth {
                let _ = write!(s, " DETH qkey={:#x} src_qp={:#x}", h.qkey, h.src_qpn);
            }
            if let Some(v) = r.feth {
                let _ = write!(s, " FETH {v:#010x}");
            }
            if let Some(h) = r.reth {
                let _ = write!(
                    s,
                    " RETH va={:#x} rkey={:#x} len={}",
                    h.va, h.rkey, h.dma_len
                );
            }
            if let Some(h) = r.atomic_eth {
                let _ = write!(
                    s,
                    " AtomicETH va={:#x} rkey={:#x} swap_add={:#x} compare={:#x}",
                    h.va, h.rkey, h.swap_add, h.compare
                );
            }
            if let Some(h) = r.aeth {
                let _ = write!(
                    s,
                    " AETH {} msn={}",
                    AethSyndrome::from_byte(h.syndrome),
                    h.msn
                );
            }
            if let Some(h) = r.atomic_ack_eth {
                let _ = write!(s, " AtomicAckETH orig={:#x}", h.orig_remote_data);
            }
            if let Some(h) = r.immdt {
                let _ = write!(s, " imm={:#010x}", h.imm_data);
            }
            if let Some(h) = r.ieth {
                let _ = write!(s, " IETH rkey={:#x}", h.rkey);
            }
            let _ = write!(s, " payload={}", r.payload_len);
        }
        match self.icrc_ok {
            Some(true) => s.push_str(" icrc=ok"),
            Some(false) => s.push_str(" icrc=BAD"),
            None => {}
        }
        if let Some(e) = &self.error {
            let _ = write!(s, " [{e}]");
        }
        s
    }
}

/// One frame of `decode --json`. Keys appear in this order; `None` keys are left out,
/// except `icrc_ok`, which is `null` when there was nothing to check.
#[derive(Serialize)]
struct FrameJson<'a> {
    frame: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    src: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    dst: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    src_port: Option<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    dst_port: Option<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    ip_id: Option<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    opcode: Option<u8>,
    #[serde(skip_serializing_if = "Option::is_none")]
    opcode_name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    bth: Option<BthJson>,
    #[serde(skip_serializing_if = "Option::is_none")]
    deth: Option<DethJson>,
    #[serde(skip_serializing_if = "Option::is_none")]
    feth: Option<FethJson>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reth: Option<RethJson>,
    #[serde(skip_serializing_if = "Option::is_none")]
    atomic_eth: Option<AtomicEthJson>,
    #[serde(skip_serializing_if = "Option::is_none")]
    aeth: Option<AethJson>,
    #[serde(skip_serializing_if = "Option::is_none")]
    atomic_ack_eth: Option<AtomicAckEthJson>,
    #[serde(skip_serializing_if = "Option::is_none")]
    immdt: Option<ImmDtJson>,
    #[serde(skip_serializing_if = "Option::is_none")]
    ieth: Option<IethJson>,
    #[serde(skip_serializing_if = "Option::is_none")]
    payload_len: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    icrc: Option<String>,
    icrc_ok: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    drop_reason: Option<&'static str>,
}

/// The BTH's fields, named as in `softroce::wire::BthRepr`.
#[derive(Serialize)]
struct BthJson {
    opcode: u8,
    se: bool,
    mig_req: bool,
    pad_count: u8,
    tver: u8,
    pkey: u16,
    fecn: bool,
    becn: bool,
    dest_qpn: u32,
    ack_req: bool,
    psn: u32,
}

#[derive(Serialize)]
struct DethJson {
    qkey: u32,
    src_qpn: u32,
}

#[derive(Serialize)]
struct FethJson {
    value: u32,
}

#[derive(Serialize)]
struct RethJson {
    va: u64,
    rkey: u32,
    dma_len: u32,
}

#[derive(Serialize)]
struct AtomicEthJson {
    va: u64,
    rkey: u32,
    swap_add: u64,
    compare: u64,
}

#[derive(Serialize)]
struct AethJson {
    syndrome: u8,
    msn: u32,
}

#[derive(Serialize)]
struct AtomicAckEthJson {
    orig_remote_data: u64,
}

#[derive(Serialize)]
struct ImmDtJson {
    imm_data: u32,
}

#[derive(Serialize)]
struct IethJson {
    rkey: u32,
}

#[cfg(test)]
mod tests {
    use super::*;
    use softroce::wire::ip_udp::LinkType;

    /// The ConnectX-4 Lx CNP of secdev/scapy test/contrib/roce.uts (see crates/softroce/src/wire/ip_udp.rs).
    const CX4_CNP_FRAME: [u8; 74] = [
        0xe4, 0x1d, 0x2d, 0xab, 0x2b, 0xc2, 0x7c, 0xfe, 0x90, 0x64, 0x3b, 0x32, 0x08, 0x00, 0x45,
        0xc2, 0x00, 0x3c, 0x71, 0x8c, 0x40, 0x00, 0x40, 0x11, 0x91, 0x61, 0x0a, 0x00, 0x11, 0x01,
        0x0a, 0x00, 0x12, 0x01, 0x00, 0x00, 0x12, 0xb7, 0x00, 0x28, 0x00, 0x00, 0x81, 0x00, 0xff,
        0xff, 0x40, 0x00, 0x01, 0x18, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x82, 0xfd, 0x00, 0x2a,
    ];

    fn frame(data: &[u8], link: LinkType) -> Frame {
        Frame {
            number: 7,
            data: data.to_vec(),
            orig_len: data.len() as u32,
            link: Ok(link),
        }
    }

    #[test]
    fn cnp_decodes_with_becn_and_a_good_icrc() {
        let f = frame(&CX4_CNP_FRAME, LinkType::Ethernet);
        let d = decode(&f);
        assert_eq!(
            d.json(),
            concat!(
                r#"{"frame":7,"src":"10.0.17.1","dst":"10.0.18.1","src_port":0,"dst_port":4791,"#,
                r#""ip_id":29068,"opcode":129,"opcode_name":"CNP","bth":{"opcode":129,"se":false,"#,
                r#""mig_req":false,"pad_count":0,"tver":0,"pkey":65535,"fecn":false,"becn":true,"#,
                r#""dest_qpn":280,"ack_req":false,"psn":0},"payload_len":16,"icrc":"0x82fd002a","#,
                r#""icrc_ok":true}"#
            )
        );
        assert_eq!(
            d.human(),
            "     7 10.0.17.1:0 > 10.0.18.1:4791 id=0x718c CNP qp=0x118 psn=0x000000 BECN payload=16 icrc=ok"
        );
    }

    #[test]
    fn a_corrupted_frame_has_a_bad_icrc_and_an_unknown_opcode_a_drop_reason() {
        let mut bad = CX4_CNP_FRAME;
        bad[60] ^= 1;
        let f = frame(&bad, LinkType::Ethernet);
        assert_eq!(decode(&f).icrc_ok, Some(false));
        let mut unknown = CX4_CNP_FRAME;
        unknown[42] = 0x15; // reserved RC opcode
        let f = frame(&unknown, LinkType::Ethernet);
        let d = decode(&f);
        assert!(d.pkt.is_none());
        assert!(
            d.json().contains(r#""opcode_name":"UNKNOWN_0x15""#),
            "{}",
            d.json()
        );
        assert!(
            d.json().ends_with(r#""drop_reason":"unknown_opcode"}"#),
            "{}",
            d.json()
        );
    }

    #[test]
    fn cut_and_foreign_frames_cannot_be_checked() {
        let cut = Frame {
            number: 1,
            data: CX4_CNP_FRAME[..50].to_vec(),
            orig_len: 74,
            link: Ok(LinkType::Ethernet),
        };
        let d = decode(&cut);
        assert_eq!(d.icrc_ok, None);
        assert_eq!(
            d.json(),
            r#"{"frame":1,"icrc_ok":null,"error":"frame cut by the capture's snap length"}"#
        );
        let mut other_port = CX4_CNP_FRAME;
        other_port[37] = 0xb8; // UDP destination port 4792
        let f = frame(&other_port, LinkType::Ethernet);
        let d = decode(&f);
        assert_eq!(d.icrc_ok, None);
        assert!(d.bth.is_none());
        let f = Frame {
            number: 1,
            data: vec![0; 20],
            orig_len: 20,
            link: Err(147),
        };
        let d = decode(&f);
        assert_eq!(d.error.as_deref(), Some("unsupported link type 147"));
    }
}
