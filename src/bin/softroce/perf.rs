//! `softroce perf`: perftest's `ib_write_bw` and `ib_read_bw` on a softroce device, as client
//! or server, interoperable with the unmodified perftest tools (Debian's perftest 4.5-0.17,
//! whose exchange calls itself version "6.06").
//!
//! Out-of-band exchange (TCP, port 18515 unless `-p`; perftest's "Ethernet" data exchange).
//! Every step is one message each way, the client's first, the server answering:
//! 1. the version, 16 bytes of NUL-padded text (`"6.06"`);
//! 2. the page size, 4 bytes big-endian (4096);
//! 3. the cache line size, 4 bytes big-endian (64);
//! 4. the path MTU as its `enum ibv_mtu` digit and a NUL (`"3"` for 1024); both use the smaller;
//! 5. the QP address, 108 bytes: `"%04x:%04x:%06x:%06x:%08x:%016x:"` of LID, outstanding
//!    reads, QPN, PSN, rkey and buffer address, the 16 GID bytes each as `"%02x:"`, the SRQ
//!    number as `"%08x:"`, NUL; then each side takes its QP to RTS;
//! 6. two synchronisations (the same address message again, each way);
//! 7. the test: the client WRITEs (or READs) `iters` messages of `size` bytes to (from) the
//!    server's buffer, at most `tx_depth` outstanding; the server only waits;
//! 8. a synchronisation; the client's results as five 8-byte big-endian values, each answered
//!    by 8 bytes from the server: size, iterations (integers), peak BW, average BW (MB/s,
//!    MB = 2^20 bytes) and message rate (Mpps) (IEEE doubles); a synchronisation;
//! 9. `"done"` and a NUL from the server, then from the client.
//!
//! Source: the TCP stream between two Debian bookworm perftest 4.5-0.17 peers on kernel rxe,
//! captured by the interop rig (tests/interop/README.md); the message layouts match
//! linux-rdma/perftest `src/perftest_communication.c` (`KEY_PRINT_FMT_GID`).
//!
//! The other perftest tests (`send_bw`, `write_lat`, `send_lat`, `read_lat`) have different
//! exchanges and are refused with an error that says so.
//!
//! Results: both sides print perftest's result table (`#bytes #iterations BW peak[MB/sec] BW
//! average[MB/sec] MsgRate[Mpps]`); the server prints the client's numbers, as perftest does.
//! Average BW = bytes / (last completion − first post); peak BW = the best rate, completion to
//! completion, over any run of a tenth of the messages (never below the average).

use crate::BoxError;
use crate::pingpong::{DEFAULT_TCP_PORT, device_ip, quiesce};
use clap::{Args, ValueEnum};
use softroce::net::UdpDevice;
use softroce::net::oob::random_psn;
use softroce::verbs::{
    AccessFlags, AhAttr, Gid, PathMtu, Qp, QpAttr, QpAttrMask, QpCap, QpInitAttr, QpState, QpType,
    SendWr, Wc, WcStatus, WrOpcode,
};
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// perftest's exchange version.
const VERSION: &[u8] = b"6.06";
/// What perftest calls the page size and the cache line size (x86-64).
const PAGE_BYTES: u32 = 4096;
const CACHE_LINE_BYTES: u32 = 64;
/// Length of the address message.
const KEY_MSG_LEN: usize = 108;
/// Longest the client waits for any completion before it gives up.
const STALL: Duration = Duration::from_secs(30);
const LINE: &str =
    "---------------------------------------------------------------------------------------";

/// The perftest test to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PerfTest {
    /// RDMA WRITE bandwidth (ib_write_bw).
    #[value(name = "write_bw")]
    WriteBw,
    /// RDMA READ bandwidth (ib_read_bw).
    #[value(name = "read_bw")]
    ReadBw,
    /// SEND bandwidth (ib_send_bw): not implemented yet.
    #[value(name = "send_bw")]
    SendBw,
    /// RDMA WRITE latency (ib_write_lat): not implemented yet.
    #[value(name = "write_lat")]
    WriteLat,
    /// SEND latency (ib_send_lat): not implemented yet.
    #[value(name = "send_lat")]
    SendLat,
    /// RDMA READ latency (ib_read_lat): not implemented yet.
    #[value(name = "read_lat")]
    ReadLat,
}

/// Options of `softroce perf`, named as perftest's.
#[derive(Args, Debug)]
pub struct PerfArgs {
    /// The test (perftest's program name without "ib_").
    test: PerfTest,
    /// Server to connect to; without it, wait for a client.
    host: Option<String>,
    /// Listen on / connect to this TCP port.
    #[arg(short = 'p', long = "port", default_value_t = DEFAULT_TCP_PORT)]
    port: u16,
    /// Device name.
    #[arg(short = 'd', long = "ib-dev", default_value = "softroce0")]
    ib_dev: String,
    /// Device port (softroce devices have port 1 only).
    #[arg(short = 'i', long = "ib-port", default_value_t = 1)]
    ib_port: u8,
    /// Message size in bytes.
    #[arg(short = 's', long = "size", default_value_t = 65536)]
    size: u32,
    /// Number of messages.
    #[arg(short = 'n', long = "iters", default_value_t = 5000)]
    iters: u32,
    /// Path MTU in bytes; the smaller of both sides' is used.
    #[arg(short = 'm', long = "mtu", default_value_t = 1024)]
    mtu: u32,
    /// Local GID index (1: the RoCE v2 GID of the device address).
    #[arg(short = 'x', long = "gid-index", default_value_t = 1)]
    gid_index: u8,
    /// Messages in flight at a time.
    #[arg(short = 't', long = "tx-depth", default_value_t = 128)]
    tx_depth: u32,
    /// Accepted for perftest compatibility (softroce reads no CPU frequency).
    #[arg(short = 'F', long = "CPU-freq")]
    cpu_freq: bool,
    /// Address the device binds (UDP 4791); default $SOFTROCE_IP, else 127.0.0.1.
    #[arg(long)]
    ip: Option<IpAddr>,
    /// After the results, print the device's counters (rxe hw_counters names), read once the
    /// link has been quiet for 200 ms.
    #[arg(long)]
    counters: bool,
}

/// One side's QP address in perftest's exchange.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PerfDest {
    /// LID (0 on RoCE).
    pub lid: u16,
    /// Outstanding RDMA READs this side accepts (1 for the other tests).
    pub out_reads: u16,
    /// QP number.
    pub qpn: u32,
    /// First PSN this side sends.
    pub psn: u32,
    /// rkey of the buffer.
    pub rkey: u32,
    /// Address of the buffer.
    pub vaddr: u64,
    /// GID.
    pub gid: Gid,
    /// SRQ number (0: no SRQ).
    pub srqn: u32,
}

impl PerfDest {
    /// The 108-byte address message.
    pub fn to_message(self) -> [u8; KEY_MSG_LEN] {
        let mut t = format!(
            "{:04x}:{:04x}:{:06x}:{:06x}:{:08x}:{:016x}:",
            self.lid, self.out_reads, self.qpn, self.psn, self.rkey, self.vaddr
        );
        for b in self.gid.0 {
            t.push_str(&format!("{b:02x}:"));
        }
        t.push_str(&format!("{:08x}:", self.srqn));
        let mut m = [0u8; KEY_MSG_LEN];
        let n = t.len().min(KEY_MSG_LEN - 1);
        m[..n].copy_from_slice(&t.as_bytes()[..n]);
        m
    }

    /// Parses an address message. Errors: anything but 23 `:`-terminated hex fields.
    pub fn from_message(m: &[u8]) -> Result<PerfDest, BoxError> {
        let end = m.iter().position(|b| *b == 0).unwrap_or(m.len());
        let text = std::str::from_utf8(&m[..end]).map_err(|_| "perftest message is not text")?;
        let bad = || format!("malformed perftest address message {text:?}");
        let f: Vec<&str> = text.split(':').collect();
        if f.len() != 24 || !f[23].is_empty() {
            return Err(bad().into());
        }
        let hex = |s: &str| u64::from_str_radix(s, 16).map_err(|_| bad());
        let mut gid = [0u8; 16];
        for (i, b) in gid.iter_mut().enumerate() {
            *b = u8::try_from(hex(f[6 + i])?).map_err(|_| bad())?;
        }
        let narrow = |v: u64, max: u64| if v > max { Err(bad()) } else { Ok(v) };
        Ok(PerfDest {
            lid: narrow(hex(f[0])?, 0xffff)? as u16,
            out_reads: narrow(hex(f[1])?, 0xffff)? as u16,
            qpn: narrow(hex(f[2])?, 0x00ff_ffff)? as u32,
            psn: narrow(hex(f[3])?, 0x00ff_ffff)? as u32,
            rkey: narrow(hex(f[4])?, 0xffff_ffff)? as u32,
            vaddr: hex(f[5])?,
            gid: Gid(gid),
            srqn: narrow(hex(f[22])?, 0xffff_ffff)? as u32,
        })
    }

    fn print(self, which: &str, read: bool) {
        let out = if read {
            format!(" OUT {:#04x}", self.out_reads)
        } else {
            String::new()
        };
        println!(
            " {which} address: LID {:04x} QPN {:#06x} PSN {:#06x}{out} RKey {:#08x} VAddr {:#016x}",
            self.lid, self.qpn, self.psn, self.rkey, self.vaddr
        );
        let gid: Vec<String> = self.gid.0.iter().map(|b| format!("{b:02}")).collect();
        println!(" GID: {}", gid.join(":"));
    }
}

/// The client's results as perftest exchanges them.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Report {
    size: u64,
    iters: u64,
    bw_peak: f64,
    bw_avg: f64,
    msg_rate: f64,
}

impl Report {
    fn words(&self) -> [[u8; 8]; 5] {
        [
            self.size.to_be_bytes(),
            self.iters.to_be_bytes(),
            self.bw_peak.to_be_bytes(),
            self.bw_avg.to_be_bytes(),
            self.msg_rate.to_be_bytes(),
        ]
    }

    fn from_words(w: &[[u8; 8]; 5]) -> Report {
        Report {
            size: u64::from_be_bytes(w[0]),
            iters: u64::from_be_bytes(w[1]),
            bw_peak: f64::from_be_bytes(w[2]),
            bw_avg: f64::from_be_bytes(w[3]),
            msg_rate: f64::from_be_bytes(w[4]),
        }
    }

    fn print(&self) {
        println!(
            " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]"
        );
        println!(
            " {:<10} {:<16} {:<18.2} {:<20.2} {:.6}",
            self.size, self.iters, self.bw_peak, self.bw_avg, self.msg_rate
        );
        println!("{LINE}");
    }
}

/// The TCP side of the exchange. The client writes first; the server reads first.
struct Oob {
    tcp: TcpStream,
    client: bool,
}

impl Oob {
    /// Sends `mine` and receives the peer's message of the same length, in this side's order.
    fn xchg(&mut self, mine: &[u8], what: &str) -> Result<Vec<u8>, BoxError> {
        let mut theirs = vec![0u8; mine.len()];
        let r = if self.client {
            self.tcp
                .write_all(mine)
                .and_then(|()| self.tcp.read_exact(&mut theirs))
        } else {
            self.tcp
                .read_exact(&mut theirs)
                .and_then(|()| self.tcp.write_all(mine))
        };
        r.map_err(|e| format!("exchanging the {what} with the peer: {e}"))?;
        Ok(theirs)
    }

    fn sync(&mut self, me: &PerfDest) -> Result<(), BoxError> {
        self.xchg(&me.to_message(), "synchronisation").map(|_| ())
    }

    /// perftest's closing: "done" from the server, then from the client.
    fn close(&mut self) -> Result<(), BoxError> {
        let mut done = [0u8; 5];
        let r = if self.client {
            self.tcp
                .read_exact(&mut done)
                .and_then(|()| self.tcp.write_all(b"done\0"))
        } else {
            self.tcp
                .write_all(b"done\0")
                .and_then(|()| self.tcp.read_exact(&mut done))
        };
        r.map_err(|e| format!("closing the exchange: {e}").into())
    }
}

/// Runs `softroce perf`.
pub fn run(a: PerfArgs) -> Result<(), BoxError> {
    let read = match a.test {
        PerfTest::WriteBw => false,
        PerfTest::ReadBw => true,
        other => {
            let name = other
                .to_possible_value()
                .map_or_else(String::new, |v| v.get_name().to_string());
            return Err(format!(
                "{name} is not implemented yet: softroce perf runs write_bw and read_bw"
            )
            .into());
        }
    };
    if a.ib_port != 1 {
        return Err(format!("device port {} does not exist (only port 1)", a.ib_port).into());
    }
    let my_mtu = PathMtu::from_bytes(a.mtu)
        .ok_or_else(|| format!("MTU {} is not one of 256, 512, 1024, 2048, 4096", a.mtu))?;
    if a.iters == 0 || a.tx_depth == 0 || a.size == 0 {
        return Err("size, iters and tx depth must be at least 1".into());
    }
    let _ = a.cpu_freq;
    let ip = device_ip(a.ip)?;
    let size = a.size as usize;
    let client = a.host.is_some();

    let dev = UdpDevice::open(&a.ib_dev, ip).map_err(|e| {
        format!(
            "cannot open device {} on {ip} (UDP port 4791): {e}",
            a.ib_dev
        )
    })?;
    let attr = dev.query_device();
    let pd = dev.alloc_pd()?;
    let cq = dev.create_cq(a.tx_depth + 1)?;
    let qp = pd.create_qp(&QpInitAttr {
        qp_type: QpType::Rc,
        send_cq: &cq,
        recv_cq: &cq,
        cap: QpCap {
            max_send_wr: a.tx_depth,
            max_recv_wr: 1,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        },
        sq_sig_all: true,
        srq: None,
    })?;
    // Twice the larger of the message and a page: perftest peers may cycle their WRITEs and
    // READs through a page's worth of addresses.
    let mr_len = 2 * size.max(PAGE_BYTES as usize);
    let mr = pd.reg_mr(
        mr_len,
        AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
    )?;
    let pattern: Vec<u8> = (0..mr_len).map(|i| (i % 251) as u8).collect();
    mr.write(0, &pattern)?;
    let gid = dev
        .query_gid(1, a.gid_index)
        .map_err(|e| format!("can't read sgid of index {}: {e}", a.gid_index))?
        .gid;
    let out_reads = if read {
        u16::try_from(attr.max_qp_rd_atom.min(0xffff)).unwrap_or(u16::MAX)
    } else {
        1
    };
    let me = PerfDest {
        lid: 0,
        out_reads,
        qpn: qp.qp_num(),
        psn: random_psn(),
        rkey: mr.rkey(),
        vaddr: mr.addr(),
        gid,
        srqn: 0,
    };

    let mut oob = match &a.host {
        Some(host) => Oob {
            tcp: connect(host, a.port)?,
            client: true,
        },
        None => {
            let unspecified = if ip.is_ipv4() {
                IpAddr::V4(Ipv4Addr::UNSPECIFIED)
            } else {
                IpAddr::V6(Ipv6Addr::UNSPECIFIED)
            };
            let listener = TcpListener::bind(SocketAddr::new(unspecified, a.port))
                .map_err(|e| format!("Couldn't listen to port {}: {e}", a.port))?;
            println!("\n************************************");
            println!("* Waiting for client to connect... *");
            println!("************************************");
            let (tcp, _) = listener
                .accept()
                .map_err(|e| format!("accept() failed: {e}"))?;
            Oob { tcp, client: false }
        }
    };

    let mut version = [0u8; 16];
    version[..VERSION.len()].copy_from_slice(VERSION);
    let theirs = oob.xchg(&version, "version")?;
    let end = theirs.iter().position(|b| *b == 0).unwrap_or(theirs.len());
    let their_version = String::from_utf8_lossy(&theirs[..end]).into_owned();
    oob.xchg(&PAGE_BYTES.to_be_bytes(), "page size")?;
    oob.xchg(&CACHE_LINE_BYTES.to_be_bytes(), "cache line size")?;
    let theirs = oob.xchg(&[b'0' + my_mtu as u8, 0], "MTU")?;
    let mtu = theirs
        .first()
        .and_then(|c| c.checked_sub(b'0'))
        .and_then(|n| PathMtu::from_bytes(128u32 << n))
        .map(|p| {
            if p.bytes() < my_mtu.bytes() {
                p
            } else {
                my_mtu
            }
        })
        .ok_or_else(|| format!("peer sent MTU {theirs:?}"))?;
    let title = if read {
        "RDMA_Read BW Test"
    } else {
        "RDMA_Write BW Test"
    };
    println!("{LINE}");
    println!("                    {title}");
    println!(" Number of qps   : 1\t\tTransport type : IB");
    println!(" Connection type : RC\t\tUsing SRQ      : OFF");
    if client {
        println!(" TX depth        : {}", a.tx_depth);
    }
    println!(" Mtu             : {}[B]", mtu.bytes());
    println!(" Link type       : Ethernet");
    println!(" GID index       : {}", a.gid_index);
    if read {
        println!(" Outstand reads  : {out_reads}");
    }
    println!(" Data ex. method : Ethernet (peer exchange version {their_version})");
    println!("{LINE}");

    let peer = PerfDest::from_message(&oob.xchg(&me.to_message(), "QP address")?)?;
    me.print("local", read);
    peer.print("remote", read);
    println!("{LINE}");
    let rd_atomic = u8::try_from(peer.out_reads.min(out_reads).clamp(1, 255)).unwrap_or(1);
    connect_qp(&qp, &peer, me.psn, mtu, a.gid_index, rd_atomic)?;
    oob.sync(&me)?;
    oob.sync(&me)?;

    let report = if client {
        let rep = run_client(&qp, &cq, &mr, &peer, &a, read)?;
        oob.sync(&me)?;
        for w in rep.words() {
            oob.xchg(&w, "results")?;
        }
        rep
    } else {
        oob.sync(&me)?;
        let mut words = [[0u8; 8]; 5];
        for w in words.iter_mut() {
            let theirs = oob.xchg(&[0u8; 8], "results")?;
            w.copy_from_slice(&theirs);
        }
        Report::from_words(&words)
    };
    oob.sync(&me)?;
    oob.close()?;
    report.print();
    if a.counters {
        quiesce(&dev);
        let tx = dev
            .link()
            .tx_datagrams
            .load(std::sync::atomic::Ordering::Relaxed);
        let rx = dev
            .link()
            .rx_datagrams
            .load(std::sync::atomic::Ordering::Relaxed);
        let mut line = format!("counters: tx_datagrams={tx} rx_datagrams={rx}");
        for (name, v) in dev.counters().entries() {
            line.push_str(&format!(" {name}={v}"));
        }
        println!("{line}");
    }
    Ok(())
}

/// The client's part of the test: `iters` WRITEs or READs of `size` bytes at the peer's
/// buffer, at most `tx_depth` in flight, every one signaled.
fn run_client(
    qp: &Qp,
    cq: &softroce::verbs::Cq,
    mr: &softroce::verbs::Mr,
    peer: &PerfDest,
    a: &PerfArgs,
    read: bool,
) -> Result<Report, BoxError> {
    let iters = a.iters as usize;
    let opcode = if read {
        WrOpcode::RdmaRead
    } else {
        WrOpcode::RdmaWrite
    };
    let mut posted_at = Vec::with_capacity(iters);
    let mut completed_at = Vec::with_capacity(iters);
    let mut wcs = vec![Wc::default(); 64];
    let start = Instant::now();
    while completed_at.len() < iters {
        while posted_at.len() < iters && posted_at.len() - completed_at.len() < a.tx_depth as usize
        {
            let mut wr = SendWr::new(posted_at.len() as u64, opcode, vec![mr.sge(0, a.size)]);
            wr.remote_addr = peer.vaddr;
            wr.rkey = peer.rkey;
            posted_at.push(start.elapsed());
            qp.post_send(&[wr])
                .map_err(|e| format!("Couldn't post send: {e}"))?;
        }
        let n = cq.wait(&mut wcs, STALL);
        if n == 0 {
            return Err(format!(
                "no completion in {STALL:?} ({} of {iters} done)",
                completed_at.len()
            )
            .into());
        }
        let now = start.elapsed();
        for wc in &wcs[..n] {
            if wc.status != WcStatus::Success {
                return Err(format!(
                    "Completion with error at client: {} ({}) for wr_id {}",
                    wc.status, wc.status as u32, wc.wr_id
                )
                .into());
            }
            completed_at.push(now);
        }
    }
    let mib = f64::from(1u32 << 20);
    let bytes = f64::from(a.size);
    let total = completed_at[iters - 1]
        .saturating_sub(posted_at[0])
        .as_secs_f64()
        .max(1e-9);
    // Peak: the best steady rate over a tenth of the messages, completion to completion.
    let window = (iters / 10).max(1);
    let avg = bytes * iters as f64 / total / mib;
    let peak = (0..iters.saturating_sub(window))
        .filter_map(|i| {
            let dt = completed_at[i + window]
                .saturating_sub(completed_at[i])
                .as_secs_f64();
            (dt > 0.0).then(|| bytes * window as f64 / dt / mib)
        })
        .fold(avg, f64::max);
    Ok(Report {
        size: u64::from(a.size),
        iters: iters as u64,
        bw_peak: peak,
        bw_avg: avg,
        msg_rate: iters as f64 / total / 1e6,
    })
}

fn connect(host: &str, port: u16) -> Result<TcpStream, BoxError> {
    let addrs: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .map_err(|e| format!("{e} for {host}:{port}"))?
        .collect();
    addrs
        .iter()
        .find_map(|a| TcpStream::connect(a).ok())
        .ok_or_else(|| format!("Couldn't connect to {host}:{port}").into())
}

/// INIT → RTR → RTS towards `peer` with perftest's attributes.
fn connect_qp(
    qp: &Qp,
    peer: &PerfDest,
    my_psn: u32,
    mtu: PathMtu,
    sgid_index: u8,
    rd_atomic: u8,
) -> Result<(), BoxError> {
    if peer.gid.0[8..].iter().all(|b| *b == 0) {
        return Err(format!(
            "the peer sent GID {}: RoCE needs a GID, run the peer with -x <its RoCE v2 GID index>",
            peer.gid
        )
        .into());
    }
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    qp.modify(
        &QpAttr {
            qp_state: QpState::Init,
            pkey_index: 0,
            port_num: 1,
            qp_access_flags: access,
            ..QpAttr::default()
        },
        QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::ACCESS_FLAGS,
    )
    .map_err(|e| format!("Failed to modify QP to INIT: {e}"))?;
    qp.modify(
        &QpAttr {
            qp_state: QpState::Rtr,
            path_mtu: mtu,
            dest_qp_num: peer.qpn,
            rq_psn: peer.psn,
            max_dest_rd_atomic: rd_atomic,
            min_rnr_timer: 12,
            ah_attr: AhAttr {
                sgid_index,
                ..AhAttr::roce_v2(peer.gid)
            },
            ..QpAttr::default()
        },
        QpAttrMask::STATE
            | QpAttrMask::AV
            | QpAttrMask::PATH_MTU
            | QpAttrMask::DEST_QPN
            | QpAttrMask::RQ_PSN
            | QpAttrMask::MAX_DEST_RD_ATOMIC
            | QpAttrMask::MIN_RNR_TIMER,
    )
    .map_err(|e| format!("Failed to modify QP to RTR: {e}"))?;
    qp.modify(
        &QpAttr {
            qp_state: QpState::Rts,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            sq_psn: my_psn,
            max_rd_atomic: rd_atomic,
            ..QpAttr::default()
        },
        QpAttrMask::STATE
            | QpAttrMask::TIMEOUT
            | QpAttrMask::RETRY_CNT
            | QpAttrMask::RNR_RETRY
            | QpAttrMask::SQ_PSN
            | QpAttrMask::MAX_QP_RD_ATOMIC,
    )
    .map_err(|e| format!("Failed to modify QP to RTS: {e}"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn address_message_matches_perftest_layout() {
        // What ib_read_bw -x 1 on rxe at 10.77.0.2 sent in a capture of the interop rig (its
        // server printed "QPN 0x001c PSN 0x997cbb OUT 0x80 RKey 0x000ddf VAddr 0x0055aceea83000").
        let d = PerfDest {
            lid: 0,
            out_reads: 0x80,
            qpn: 0x1c,
            psn: 0x99_7cbb,
            rkey: 0xddf,
            vaddr: 0x0000_55ac_eea8_3000,
            gid: Gid::from_ip("10.77.0.2".parse().unwrap()),
            srqn: 0,
        };
        let m = d.to_message();
        assert_eq!(
            &m[..107],
            &b"0000:0080:00001c:997cbb:00000ddf:000055aceea83000:00:00:00:00:00:00:00:00:00:00:ff:ff:0a:4d:00:02:00000000:"[..]
        );
        assert_eq!(m[107], 0);
        assert_eq!(PerfDest::from_message(&m).unwrap(), d);
        assert!(PerfDest::from_message(&m[..60]).is_err());
    }

    #[test]
    fn results_round_trip_as_perftest_sends_them() {
        // From the rig's ib_write_bw capture: 64 B, 5 iterations, then three doubles.
        let w = [
            0x40u64.to_be_bytes(),
            5u64.to_be_bytes(),
            0x3fe1_e290_ac5b_b48cu64.to_be_bytes(),
            0x3fd1_6cb8_a5ba_ffe5u64.to_be_bytes(),
            0x3f72_4567_c025_bf91u64.to_be_bytes(),
        ];
        let r = Report::from_words(&w);
        assert_eq!((r.size, r.iters), (64, 5));
        assert!((r.bw_avg - 0.2723).abs() < 1e-3, "{r:?}");
        assert!((r.msg_rate - 0.004461).abs() < 1e-6, "{r:?}");
        assert_eq!(r.words(), w);
    }
}
