//! `softroce decode [--json] FILE`: explains every frame of a pcap or pcapng file.
//!
//! Link types: Ethernet (1), raw IP (101, and 228/229 IPv4/IPv6, DLT_RAW 12/14) and Linux
//! cooked capture (113). Frames are numbered from 1 in file order, as Wireshark numbers them.
//! A RoCEv2 frame is a UDP datagram to port 4791. Its ICRC is checked over the IP and UDP
//! headers exactly as captured (`icrc_ok`: true or false; null when there is nothing to check:
//! no RoCEv2 datagram, fewer bytes than a BTH and an ICRC, or a frame cut by the snap length).
//!
//! Human output: one line per frame. `--json`: one JSON object per line, with the frame
//! number, addresses, ports, the IPv4 Identification, the opcode (number and name), every field
//! of every header present (objects `bth`, `deth`, `feth`, `reth`, `atomic_eth`, `aeth`,
//! `atomic_ack_eth`, `immdt`, `ieth`, with the field names of `softroce::wire`), `payload_len`,
//! the ICRC as its four wire bytes read big-endian (as Wireshark shows it), `icrc_ok`, and for
//! a frame the wire layer rejects, `error` and the `drop_reason` a device would count.
//! JSON is written by hand: the values are numbers, booleans and short ASCII strings.

use super::BoxError;
use softroce::transport::DropReason;
use softroce::wire::ip_udp::{LinkType, UdpDatagram, parse_frame};
use softroce::wire::{
    AethSyndrome, Bth, BthRepr, ICRC_LEN, NakCode, Opcode, PacketRepr, ROCE_V2_UDP_PORT,
    RocePacket, icrc_compute,
};
use std::fmt::Write as _;
use std::fs::File;
use std::io::{self, BufReader, Read, Write};
use std::net::IpAddr;
use std::path::Path;

/// Length of a BTH in bytes.
const BTH_LEN: usize = 12;

/// One captured frame.
struct Frame {
    /// 1-based position in the file.
    number: u64,
    /// The captured bytes.
    data: Vec<u8>,
    /// Length on the wire (more than `data.len()` when the snap length cut the frame).
    orig_len: u32,
    /// Link type, or the unsupported pcap link type number.
    link: Result<LinkType, u32>,
}

/// Decodes `path` to stdout.
pub fn run(path: &Path, json: bool) -> Result<(), BoxError> {
    let stdout = io::stdout();
    let mut out = io::BufWriter::new(stdout.lock());
    let mut stats = Stats::default();
    let r = for_each_frame(path, |f| {
        let d = decode(&f);
        stats.add(&d);
        let line = if json { d.json() } else { d.human() };
        writeln!(out, "{line}")
    });
    let r = r.and_then(|()| out.flush().map_err(Into::into));
    match r {
        // `softroce decode … | head` closes the pipe early: not an error.
        Err(e)
            if e.downcast_ref::<io::Error>().map(io::Error::kind)
                == Some(io::ErrorKind::BrokenPipe) =>
        {
            Ok(())
        }
        Err(e) => Err(e),
        Ok(()) => {
            if !json {
                eprintln!(
                    "{} frames: {} RoCEv2, ICRC ok {}, ICRC bad {}, not decodable {}",
                    stats.frames, stats.roce, stats.icrc_ok, stats.icrc_bad, stats.errors
                );
            }
            Ok(())
        }
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

/// Calls `f` on every frame of the pcap or pcapng file at `path`, in order.
fn for_each_frame(path: &Path, mut f: impl FnMut(Frame) -> io::Result<()>) -> Result<(), BoxError> {
    let mut file =
        BufReader::new(File::open(path).map_err(|e| format!("{}: {e}", path.display()))?);
    let mut magic = [0u8; 4];
    file.read_exact(&mut magic)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let file = io::Cursor::new(magic).chain(file);
    let mut number = 0;
    if magic == [0x0a, 0x0d, 0x0d, 0x0a] {
        use pcap_file::pcapng::{Block, PcapNgReader};
        let mut r = PcapNgReader::new(file).map_err(|e| format!("{}: {e}", path.display()))?;
        while let Some(block) = r.next_block() {
            let (data, orig_len, iface) = match block? {
                Block::EnhancedPacket(p) => (p.data.into_owned(), p.original_len, p.interface_id),
                Block::SimplePacket(p) => {
                    let n = u32::try_from(p.data.len()).unwrap_or(u32::MAX);
                    (p.data.into_owned(), p.original_len.max(n), 0)
                }
                Block::Packet(p) => (
                    p.data.into_owned(),
                    p.original_len,
                    u32::from(p.interface_id),
                ),
                _ => continue,
            };
            let link = r
                .interfaces()
                .get(iface as usize)
                .map_or(Err(u32::MAX), |i| link_type(i.linktype));
            number += 1;
            f(Frame {
                number,
                data,
                orig_len,
                link,
            })?;
        }
    } else {
        use pcap_file::pcap::PcapReader;
        let mut r = PcapReader::new(file).map_err(|e| format!("{}: {e}", path.display()))?;
        let link = link_type(r.header().datalink);
        while let Some(pkt) = r.next_packet() {
            let pkt = pkt?;
            number += 1;
            f(Frame {
                number,
                orig_len: pkt.orig_len,
                data: pkt.data.into_owned(),
                link,
            })?;
        }
    }
    Ok(())
}

fn link_type(d: pcap_file::DataLink) -> Result<LinkType, u32> {
    use pcap_file::DataLink as D;
    match d {
        D::ETHERNET => Ok(LinkType::Ethernet),
        D::RAW | D::IPV4 | D::IPV6 | D::Unknown(12 | 14) => Ok(LinkType::RawIp),
        D::LINUX_SLL => Ok(LinkType::LinuxSll),
        other => Err(u32::from(other)),
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

fn opcode_name(op: Opcode) -> String {
    op.to_string()
}

fn aeth_meaning(syndrome: u8) -> String {
    match AethSyndrome::from_byte(syndrome) {
        AethSyndrome::Ack { credit } => format!("ACK credit={credit}"),
        AethSyndrome::RnrNak { timer } => format!("RNR NAK timer={timer}"),
        AethSyndrome::Nak(code) => match code {
            NakCode::PsnSeqErr => "NAK PSN sequence error".to_string(),
            NakCode::InvalidRequest => "NAK invalid request".to_string(),
            NakCode::RemoteAccessErr => "NAK remote access error".to_string(),
            NakCode::RemoteOpErr => "NAK remote operational error".to_string(),
            NakCode::InvalidRdRequest => "NAK invalid RD request".to_string(),
            NakCode::Reserved(c) => format!("NAK reserved code {c}"),
        },
        AethSyndrome::Reserved(b) => format!("reserved syndrome {b:#04x}"),
    }
}

/// A JSON object written field by field.
struct Obj(String);

impl Obj {
    fn new() -> Obj {
        Obj(String::from("{"))
    }
    fn key(&mut self, k: &str) {
        if self.0.len() > 1 {
            self.0.push(',');
        }
        let _ = write!(self.0, "\"{k}\":");
    }
    fn num(&mut self, k: &str, v: impl Into<u64>) -> &mut Obj {
        self.key(k);
        let _ = write!(self.0, "{}", v.into());
        self
    }
    fn boolean(&mut self, k: &str, v: bool) -> &mut Obj {
        self.key(k);
        self.0.push_str(if v { "true" } else { "false" });
        self
    }
    fn opt_bool(&mut self, k: &str, v: Option<bool>) -> &mut Obj {
        match v {
            Some(b) => self.boolean(k, b),
            None => {
                self.key(k);
                self.0.push_str("null");
                self
            }
        }
    }
    fn str(&mut self, k: &str, v: &str) -> &mut Obj {
        self.key(k);
        self.0.push('"');
        for c in v.chars() {
            match c {
                '"' => self.0.push_str("\\\""),
                '\\' => self.0.push_str("\\\\"),
                c if u32::from(c) < 0x20 => {
                    let _ = write!(self.0, "\\u{:04x}", u32::from(c));
                }
                c => self.0.push(c),
            }
        }
        self.0.push('"');
        self
    }
    fn obj(&mut self, k: &str, v: Obj) -> &mut Obj {
        self.key(k);
        self.0.push_str(&v.finish());
        self
    }
    fn finish(mut self) -> String {
        self.0.push('}');
        self.0
    }
}

fn bth_json(b: &BthRepr) -> Obj {
    let mut o = Obj::new();
    o.num("opcode", b.opcode.0)
        .boolean("se", b.se)
        .boolean("mig_req", b.mig_req)
        .num("pad_count", b.pad_count)
        .num("tver", b.tver)
        .num("pkey", b.pkey)
        .boolean("fecn", b.fecn)
        .boolean("becn", b.becn)
        .num("dest_qpn", b.dest_qpn)
        .boolean("ack_req", b.ack_req)
        .num("psn", b.psn.value());
    o
}

fn headers_json(o: &mut Obj, r: &PacketRepr) {
    if let Some(h) = r.deth {
        let mut x = Obj::new();
        x.num("qkey", h.qkey).num("src_qpn", h.src_qpn);
        o.obj("deth", x);
    }
    if let Some(v) = r.feth {
        let mut x = Obj::new();
        x.num("value", v);
        o.obj("feth", x);
    }
    if let Some(h) = r.reth {
        let mut x = Obj::new();
        x.num("va", h.va)
            .num("rkey", h.rkey)
            .num("dma_len", h.dma_len);
        o.obj("reth", x);
    }
    if let Some(h) = r.atomic_eth {
        let mut x = Obj::new();
        x.num("va", h.va)
            .num("rkey", h.rkey)
            .num("swap_add", h.swap_add)
            .num("compare", h.compare);
        o.obj("atomic_eth", x);
    }
    if let Some(h) = r.aeth {
        let mut x = Obj::new();
        x.num("syndrome", h.syndrome).num("msn", h.msn);
        o.obj("aeth", x);
    }
    if let Some(h) = r.atomic_ack_eth {
        let mut x = Obj::new();
        x.num("orig_remote_data", h.orig_remote_data);
        o.obj("atomic_ack_eth", x);
    }
    if let Some(h) = r.immdt {
        let mut x = Obj::new();
        x.num("imm_data", h.imm_data);
        o.obj("immdt", x);
    }
    if let Some(h) = r.ieth {
        let mut x = Obj::new();
        x.num("rkey", h.rkey);
        o.obj("ieth", x);
    }
}

impl Decoded<'_> {
    fn json(&self) -> String {
        let mut o = Obj::new();
        o.num("frame", self.number);
        if let Some(dg) = &self.datagram {
            o.str("src", &dg.src.to_string())
                .str("dst", &dg.dst.to_string())
                .num("src_port", dg.src_port)
                .num("dst_port", dg.dst_port);
            if let Some(id) = ip_ident(dg.ip_header) {
                o.num("ip_id", id);
            }
        }
        if let Some(b) = &self.bth {
            o.num("opcode", b.opcode.0)
                .str("opcode_name", &opcode_name(b.opcode))
                .obj("bth", bth_json(b));
        }
        if let Some(p) = &self.pkt {
            headers_json(&mut o, &p.repr);
            o.num("payload_len", p.repr.payload_len as u64);
        }
        if let Some(icrc) = self.icrc {
            o.str("icrc", &format!("{:#010x}", u32::from_be_bytes(icrc)));
        }
        o.opt_bool("icrc_ok", self.icrc_ok);
        if let Some(e) = &self.error {
            o.str("error", e);
        }
        if let Some(r) = self.drop_reason {
            o.str("drop_reason", r.name());
        }
        o.finish()
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
            let _ = write!(
                s,
                " {} qp={:#x} psn={}",
                opcode_name(b.opcode),
                b.dest_qpn,
                b.psn.value()
            );
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
                let _ = write!(s, " AETH {} msn={}", aeth_meaning(h.syndrome), h.msn);
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

#[cfg(test)]
mod tests {
    use super::*;

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
            "     7 10.0.17.1:0 > 10.0.18.1:4791 id=0x718c CNP qp=0x118 psn=0 BECN payload=16 icrc=ok"
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
