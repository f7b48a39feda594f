//! Net: a pcap capture of the RoCEv2 datagrams that device drivers send and receive.
//!
//! One [`Capture`] is a pcap file with link type RAW (LINKTYPE_RAW = 101: each record is an
//! IPv4 or IPv6 packet, no link header), so Wireshark and tshark decode it as RoCEv2 (UDP port
//! 4791) and `softroce decode` reads it back. Several devices may share one capture; a
//! datagram that one of them sends to another is then written once, when it is sent: a
//! receiver skips a datagram that this capture recorded as sent (same addresses, ports, length
//! and ICRC) and has not yet seen arrive. Up to [`IN_FLIGHT_MAX`] sent datagrams are
//! remembered; past that the memory is reset, and a datagram then in flight may be written
//! twice.
//!
//! The IP header of each record is the one the ICRC was computed over, so the ICRC of every
//! record verifies against it:
//! - sent: the header Linux writes for the send socket and the datagram's cmsgs
//!   ([`SentHeader`]): IPv4 with ID 0 and DF (what an unconnected `IP_PMTUDISC_DO` socket
//!   makes Linux write, docs/wire-facts.md §0.2); the TOS / traffic class the address vector
//!   asked for; the TTL / hop limit sent (the route's for unicast, the address handle's for
//!   multicast); IPv6 flow label 0 (the send sockets turn the automatic label off); and UDP
//!   checksum 0, as the checksum-free send socket sends it (a capture turns batching off, so
//!   no datagram goes by UDP GSO, which needs a checksum).
//! - received on a raw socket (exact ICRC mode): the IP packet as received, byte for byte.
//! - received on a plain UDP socket, which hides the IP header: addresses, ports and lengths
//!   from the socket; for IPv4 DF and the Identification recovered by
//!   [`solve_ipv4_ident`] (0 when the ICRC is bad, so that record's ICRC fails as the packet
//!   did); TTL / hop limit 64 and TOS 0, which the ICRC masks.
//!
//! The UDP checksum of a received record is computed here: the socket does not show the one
//! that arrived. The ICRC masks it.
//!
//! Errors while writing are counted ([`Capture::write_errors`]), never returned to the data
//! path; [`Capture::flush`] reports the first one.

use crate::wire::ip_udp::{LinkType, parse_frame};
use crate::wire::{IcrcIp, ROCE_V2_UDP_PORT, RocePacket, solve_ipv4_ident};
use etherparse::{IpNumber, Ipv4Header, Ipv6FlowLabel, Ipv6Header, UdpHeader};
use parking_lot::Mutex;
use pcap_file::pcap::{PcapHeader, PcapPacket, PcapWriter};
use pcap_file::{DataLink, Endianness, TsResolution};
use std::collections::HashMap;
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Largest record, in bytes: an IP packet (the snap length of the file).
const SNAPLEN: u32 = 65_535;
/// TTL / hop limit written for received datagrams, whose real value a UDP socket hides.
const RX_HOP_LIMIT: u8 = 64;
/// Most sent datagrams remembered to skip their receive (see the module doc).
pub const IN_FLIGHT_MAX: usize = 1 << 16;

/// What identifies a datagram between its send and its receive: addresses, ports, length and
/// the last 4 bytes (for RoCEv2, the ICRC over everything else).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Fingerprint {
    src: SocketAddr,
    dst: SocketAddr,
    len: usize,
    tail: [u8; 4],
}

impl Fingerprint {
    fn new(src: SocketAddr, dst: SocketAddr, payload: &[u8]) -> Fingerprint {
        let mut tail = [0u8; 4];
        let n = payload.len().min(4);
        tail[..n].copy_from_slice(&payload[payload.len() - n..]);
        Fingerprint {
            src,
            dst,
            len: payload.len(),
            tail,
        }
    }
}

struct Inner {
    writer: PcapWriter<Sink>,
    sink: Sink,
    /// Datagrams recorded as sent and not yet seen arriving, with their count.
    in_flight: HashMap<Fingerprint, u32>,
    packets: u64,
    write_errors: u64,
    first_error: Option<String>,
}

/// A pcap capture shared by the drivers of one or more devices. See the module doc for what
/// each record holds.
pub struct Capture {
    inner: Mutex<Inner>,
}

impl core::fmt::Debug for Capture {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let g = self.inner.lock();
        f.debug_struct("Capture")
            .field("packets", &g.packets)
            .field("write_errors", &g.write_errors)
            .finish()
    }
}

impl Capture {
    /// Creates (truncates) the pcap file at `path` and writes its header.
    /// Errors: the file cannot be created or written.
    pub fn create(path: &Path) -> io::Result<Arc<Capture>> {
        let file = File::create(path)?;
        Capture::to_writer(Box::new(BufWriter::new(file)))
    }

    /// Appends to the pcap file at `path`, shared with other processes that append to it
    /// (the children of `softroce exec --pcap`, through [`SOFTROCE_PCAP`]): it is created
    /// with its header if missing or empty, and each record is written with one `write(2)`
    /// on an `O_APPEND` descriptor, so records of different processes never interleave
    /// (nothing is buffered: a killed process loses no record it wrote). A datagram between
    /// two processes sharing the file is written by each, as sent and as received.
    /// Errors: the file cannot be opened, locked or written, or holds something shorter than
    /// a pcap header.
    pub fn append(path: &Path) -> io::Result<Arc<Capture>> {
        let file = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(path)?;
        // The check for an empty file and the header are one step among the processes.
        file.lock()?;
        let len = file.metadata()?.len();
        if len != 0 && len < PCAP_HEADER_LEN as u64 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}: not a pcap file ({len} bytes)", path.display()),
            ));
        }
        let records = AppendRecords {
            file,
            pending: Vec::new(),
            header_left: PCAP_HEADER_LEN,
            write_header: len == 0,
        };
        // `to_writer` writes the header (or `records` skips it) and so unlocks the file.
        Capture::to_writer(Box::new(records))
    }

    /// A capture into any writer (e.g. a `Vec<u8>` behind a lock, in tests).
    /// Errors: writing the pcap header failed.
    pub fn to_writer(w: Box<dyn Write + Send>) -> io::Result<Arc<Capture>> {
        let header = PcapHeader {
            snaplen: SNAPLEN,
            datalink: DataLink::RAW,
            ts_resolution: TsResolution::NanoSecond,
            endianness: Endianness::native(),
            ..PcapHeader::default()
        };
        let sink = Sink(Arc::new(Mutex::new(w)));
        let writer = PcapWriter::with_header(sink.clone(), header).map_err(io::Error::other)?;
        Ok(Arc::new(Capture {
            inner: Mutex::new(Inner {
                writer,
                sink,
                in_flight: HashMap::new(),
                packets: 0,
                write_errors: 0,
                first_error: None,
            }),
        }))
    }

    /// Records a datagram sent from `src` to `dst` with UDP payload `payload` and the IP and
    /// UDP header fields `header`.
    pub fn record_sent(
        &self,
        src: SocketAddr,
        dst: SocketAddr,
        payload: &[u8],
        header: &SentHeader,
    ) {
        self.send_and_record(src, dst, payload, header, || Ok(()))
            .unwrap_or(());
    }

    /// Runs `send` and, if it succeeds, records the datagram as [`Capture::record_sent`]
    /// does. The capture stays locked meanwhile, so that a receiver sharing the capture
    /// (which on loopback gets the datagram before `send` returns) finds it recorded, and
    /// the records keep the order of events. Errors: `send`'s.
    pub fn send_and_record(
        &self,
        src: SocketAddr,
        dst: SocketAddr,
        payload: &[u8],
        header: &SentHeader,
        send: impl FnOnce() -> io::Result<()>,
    ) -> io::Result<()> {
        let mut g = self.inner.lock();
        send()?;
        if g.in_flight.len() >= IN_FLIGHT_MAX {
            g.in_flight.clear();
        }
        *g.in_flight
            .entry(Fingerprint::new(src, dst, payload))
            .or_insert(0) += 1;
        match ip_packet_as_sent(src, dst, header, payload) {
            Some(p) => write_locked(&mut g, &p),
            None => g.write_errors += 1,
        }
        Ok(())
    }

    /// Records a datagram that a plain UDP socket bound to `dst` received from `src`,
    /// rebuilding the IP header the sender must have written (module doc).
    pub fn record_received_udp(&self, src: SocketAddr, dst: SocketAddr, payload: &[u8]) {
        if self.seen_sent(src, dst, payload) {
            return;
        }
        // Solved outside the lock: 17 CRC passes.
        let ident = recovered_ident(src, dst, payload).unwrap_or(0);
        let mut g = self.inner.lock();
        match ip_packet(src, dst, ident, RX_HOP_LIMIT, payload) {
            Some(p) => write_locked(&mut g, &p),
            None => g.write_errors += 1,
        }
    }

    /// Records an IP packet as a raw socket received it.
    pub fn record_received_ip(&self, packet: &[u8]) {
        if let Ok(d) = parse_frame(packet, LinkType::RawIp) {
            let src = SocketAddr::new(d.src, d.src_port);
            let dst = SocketAddr::new(d.dst, d.dst_port);
            if self.seen_sent(src, dst, d.payload) {
                return;
            }
        }
        write_locked(&mut self.inner.lock(), packet);
    }

    /// True (and forgotten) when this capture recorded the datagram as sent.
    fn seen_sent(&self, src: SocketAddr, dst: SocketAddr, payload: &[u8]) -> bool {
        let mut g = self.inner.lock();
        let key = Fingerprint::new(src, dst, payload);
        match g.in_flight.get_mut(&key) {
            Some(n) if *n > 1 => {
                *n -= 1;
                true
            }
            Some(_) => {
                g.in_flight.remove(&key);
                true
            }
            None => false,
        }
    }

    /// Records written so far.
    pub fn packets(&self) -> u64 {
        self.inner.lock().packets
    }

    /// Records that could not be written.
    pub fn write_errors(&self) -> u64 {
        self.inner.lock().write_errors
    }

    /// Flushes the file. Errors: the first write error seen, or the flush error.
    pub fn flush(&self) -> io::Result<()> {
        let mut g = self.inner.lock();
        if let Some(e) = &g.first_error {
            return Err(io::Error::other(format!("pcap capture: {e}")));
        }
        g.sink.flush()
    }
}

/// Appends one record, timestamped now.
fn write_locked(g: &mut Inner, packet: &[u8]) {
    let ts = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO);
    let len = u32::try_from(packet.len()).unwrap_or(u32::MAX);
    match g.writer.write_packet(&PcapPacket::new(ts, len, packet)) {
        Ok(_) => g.packets += 1,
        Err(e) => {
            g.write_errors += 1;
            if g.first_error.is_none() {
                g.first_error = Some(e.to_string());
            }
        }
    }
}

/// The environment variable that makes every device a process opens append its datagrams to
/// that pcap file ([`Capture::append`]), unless the process chose its own options
/// ([`UdpOptions::set_process_default`](super::UdpOptions::set_process_default)). Set by
/// `softroce exec --pcap FILE` for the program and its children.
pub const SOFTROCE_PCAP: &str = "SOFTROCE_PCAP";

/// Bytes of a pcap file header.
const PCAP_HEADER_LEN: usize = 24;
/// Bytes of a pcap record header (timestamp, captured and original length).
const PCAP_RECORD_HEADER_LEN: usize = 16;

/// A writer that turns what a [`PcapWriter`] writes into whole records, each appended with
/// one `write(2)` (see [`Capture::append`]). The file header is written only when
/// `write_header`, else dropped. The file lock taken by `Capture::append` is released once
/// the header has gone.
struct AppendRecords {
    file: File,
    /// Bytes of a record not yet complete.
    pending: Vec<u8>,
    /// Bytes of the file header still to come from the writer.
    header_left: usize,
    write_header: bool,
}

impl Write for AppendRecords {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.pending.extend_from_slice(buf);
        if self.header_left > 0 {
            if self.pending.len() < self.header_left {
                return Ok(buf.len());
            }
            let header: Vec<u8> = self.pending.drain(..self.header_left).collect();
            self.header_left = 0;
            if self.write_header {
                self.file.write_all(&header)?;
            }
            self.file.unlock()?;
        }
        while self.pending.len() >= PCAP_RECORD_HEADER_LEN {
            let mut incl = [0u8; 4];
            incl.copy_from_slice(&self.pending[8..12]);
            let whole = PCAP_RECORD_HEADER_LEN + u32::from_ne_bytes(incl) as usize;
            if self.pending.len() < whole {
                break;
            }
            // One write of the whole record: O_APPEND places it at the end as one piece.
            let n = self.file.write(&self.pending[..whole])?;
            if n != whole {
                return Err(io::Error::new(
                    io::ErrorKind::WriteZero,
                    format!("pcap record cut short: {n} of {whole} bytes written"),
                ));
            }
            self.pending.drain(..whole);
        }
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The file behind a [`PcapWriter`], shared so that [`Capture::flush`] can reach it
/// (`PcapWriter` hands its writer out only by value).
#[derive(Clone)]
struct Sink(Arc<Mutex<Box<dyn Write + Send>>>);

impl Write for Sink {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.lock().write(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.0.lock().flush()
    }
}

/// The IPv4 Identification the sender of `payload` (from `src` to `dst`) must have written for
/// its ICRC to hold: 0 when ID 0 fits (softroce senders), else the one solved by CRC
/// linearity; `None` for IPv6, a payload that is not RoCEv2, or an ICRC no ID makes valid.
pub fn recovered_ident(src: SocketAddr, dst: SocketAddr, payload: &[u8]) -> Option<u16> {
    let (IpAddr::V4(s), IpAddr::V4(d)) = (src.ip(), dst.ip()) else {
        return None;
    };
    let pkt = RocePacket::parse(payload).ok()?;
    let ip = IcrcIp::V4 {
        src: s,
        dst: d,
        ident: 0,
        src_port: src.port(),
        dst_port: dst.port(),
    };
    if pkt.icrc_ok(&ip) {
        return Some(0);
    }
    solve_ipv4_ident(&ip, pkt.body, pkt.icrc)
}

/// The IP and UDP header fields of a datagram as sent, beyond addresses, ports and lengths.
/// IPv4 always has DF; IPv6 always flow label 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SentHeader {
    /// IPv4 Identification (unused for IPv6).
    pub ident: u16,
    /// IPv4 TOS / IPv6 traffic class byte.
    pub traffic_class: u8,
    /// IPv4 TTL / IPv6 hop limit.
    pub hop_limit: u8,
    /// A computed UDP checksum; `false` for checksum 0 (what softroce's send sockets send).
    pub udp_checksum: bool,
}

/// Builds the IP packet (IP header, UDP header with a computed checksum, `payload`) of a
/// datagram from `src` to `dst`: IPv4 with DF, Identification `ident`, TOS 0 and TTL
/// `hop_limit`; IPv6 with traffic class 0, flow label 0 and hop limit `hop_limit`. `None` for
/// mixed address families or a payload too long for one datagram.
pub fn ip_packet(
    src: SocketAddr,
    dst: SocketAddr,
    ident: u16,
    hop_limit: u8,
    payload: &[u8],
) -> Option<Vec<u8>> {
    let header = SentHeader {
        ident,
        traffic_class: 0,
        hop_limit,
        udp_checksum: true,
    };
    ip_packet_as_sent(src, dst, &header, payload)
}

/// Builds the IP packet of a datagram from `src` to `dst` with the header fields `h`
/// (IPv4 with DF; IPv6 with flow label 0). `None` for mixed address families or a payload
/// too long for one datagram.
pub fn ip_packet_as_sent(
    src: SocketAddr,
    dst: SocketAddr,
    h: &SentHeader,
    payload: &[u8],
) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(48 + payload.len());
    let udp_len = u16::try_from(8 + payload.len()).ok()?;
    match (src.ip(), dst.ip()) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            let mut ip =
                Ipv4Header::new(udp_len, h.hop_limit, IpNumber::UDP, s.octets(), d.octets())
                    .ok()?;
            ip.identification = h.ident;
            ip.dont_fragment = true;
            ip.dscp = etherparse::IpDscp::try_new(h.traffic_class >> 2).ok()?;
            ip.ecn = etherparse::IpEcn::try_new(h.traffic_class & 3).ok()?;
            ip.header_checksum = ip.calc_header_checksum();
            let udp = if h.udp_checksum {
                UdpHeader::with_ipv4_checksum(src.port(), dst.port(), &ip, payload).ok()?
            } else {
                UdpHeader::without_ipv4_checksum(src.port(), dst.port(), payload.len()).ok()?
            };
            out.extend_from_slice(&ip.to_bytes());
            out.extend_from_slice(&udp.to_bytes());
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            let ip = Ipv6Header {
                traffic_class: h.traffic_class,
                flow_label: Ipv6FlowLabel::ZERO,
                payload_length: udp_len,
                next_header: IpNumber::UDP,
                hop_limit: h.hop_limit,
                source: s.octets(),
                destination: d.octets(),
            };
            let mut udp =
                UdpHeader::with_ipv6_checksum(src.port(), dst.port(), &ip, payload).ok()?;
            if !h.udp_checksum {
                udp.checksum = 0;
            }
            out.extend_from_slice(&ip.to_bytes());
            out.extend_from_slice(&udp.to_bytes());
        }
        _ => return None,
    }
    out.extend_from_slice(payload);
    Some(out)
}

/// The UDP/4791 socket address of a device on `ip`.
pub(crate) fn roce_addr(ip: IpAddr) -> SocketAddr {
    SocketAddr::new(ip, ROCE_V2_UDP_PORT)
}

impl Drop for Capture {
    fn drop(&mut self) {
        let _ = self.inner.get_mut().sink.flush();
    }
}
