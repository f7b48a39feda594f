//! `softroce pingpong --rc|--uc|--ud`: rdma-core's `ibv_rc_pingpong`, `ibv_uc_pingpong` and
//! `ibv_ud_pingpong`, on a softroce device.
//!
//! It interoperates with the unmodified rdma-core tools in either role: same options, same
//! out-of-band TCP exchange, same verbs calls in the same order, same result lines.
//!
//! Out-of-band exchange (TCP, port 18515 unless `-p`): each side's address is one text message
//! of 52 bytes, `"%04x:%06x:%06x:%s"` of LID, QPN, first PSN and GID, then a NUL. The GID is 32
//! hex digits, byte 0 first (rdma-core prints each 4-byte word with `%08x` after `htobe32` of a
//! native load, which puts the bytes in memory order on any host). The client connects, sends
//! its message, reads the server's and answers `"done"` plus NUL (5 bytes). The server reads the
//! client's message, takes its QP to RTS, then sends its own message and reads the `"done"`.
//! Source: rdma-core `libibverbs/examples/rc_pingpong.c` (`pp_client_exch_dest`,
//! `pp_server_exch_dest`), `pingpong.c` (`gid_to_wire_gid`).
//!
//! Semantics: both sides create an RC QP (1 send WR, `rx_depth` receive WRs) and post
//! `rx_depth` receives before the exchange, and keep at least two posted; the client sends
//! first; after that each side posts its next SEND only once both its previous SEND and the
//! peer's next message have completed, until `iters` of each. Both print
//! `"N bytes in S seconds = R Mbit/sec"` (N = size × iters × 2) and
//! `"I iters in S seconds = U usec/iter"`, timed from the first SEND (client) or the end of the
//! exchange (server).
//!
//! Data: like rc_pingpong, each side sends back the last message it received, so every message
//! of a session carries the bytes the client started with. softroce checks that: every message
//! it receives must equal the first one of the session (for a softroce client: the bytes it
//! sent), and it fails on the first difference. Deliberate differences from rc_pingpong: the
//! client fills its buffer with a position-dependent pattern instead of 0x7b, so that a
//! misplaced segment shows; messages land in a separate receive area of the same MR and are
//! copied to the send area before the next SEND (rc_pingpong receives into the buffer it sends
//! from); without `-g` the RoCE v2 GID (index 1) is used, since a RoCE peer cannot connect
//! without one; and the GRH hop limit is 64, what rxe puts on the wire, rather than 1.
//!
//! UC (`ibv_uc_pingpong`) differs only in the QP: no ACKs, and RTR/RTS take no READ/atomic
//! limits, RNR timer, timeout or retry counts. UD (`ibv_ud_pingpong`) uses Q_Key 0x11111111, an
//! address handle towards the peer's GID, messages of at most one MTU (default size 2048), and
//! receive buffers 40 bytes longer for the GRH that precedes every message (a receive
//! completion's `byte_len` counts it). Neither UC nor UD recovers from loss: a lost message
//! stops the run, as it stops the rdma-core tools. `--srq` is `ibv_srq_pingpong` (see the `srq`
//! submodule: `-q` QPs on one SRQ, 256 address messages each way, `-e` for CQ events). Source: rdma-core `libibverbs/examples/uc_pingpong.c`,
//! `ud_pingpong.c` (`pp_connect_ctx`, `pp_post_send`, `pp_post_recv`).

mod srq;

use crate::BoxError;
use crate::exchange;
use crate::stall::StallWatch;
use clap::{ArgGroup, Args};
use softroce::net::UdpDevice;
use softroce::net::oob::random_psn;
use softroce::verbs::{
    AccessFlags, AhAttr, Gid, Mr, PathMtu, Pd, Qp, QpAttr, QpAttrMask, QpCap, QpInitAttr, QpState,
    QpType, RcConnect, RecvWr, SendWr, UdDest, Wc, WcStatus, WrOpcode,
};
use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener};
use std::time::{Duration, Instant};

/// The TCP port rdma-core's examples use.
pub const DEFAULT_TCP_PORT: u16 = 18515;

/// Length of the address message: `"0000:000000:000000:"`, 32 hex digits, NUL.
const MSG_LEN: usize = 52;
/// rc_pingpong's work request ids.
const RECV_WRID: u64 = 1;
const SEND_WRID: u64 = 2;
/// rc_pingpong's `-c` checks the first byte of every page.
const PAGE_BYTES: usize = 4096;

/// `-c` on the client: byte 0 of every page of the message is `page % sizeof(char)`, that
/// is 0, as rdma-core's pingpong clients set it (`pp_init_ctx` with `validate_buf`).
fn chk_mark_pages(buf: &mut [u8]) {
    for b in buf.iter_mut().step_by(PAGE_BYTES) {
        *b = 0;
    }
}

/// `-c` on the server: every page of the last message received must start with 0; prints
/// rdma-core's "invalid data in page N" for each that does not, and fails if any.
fn chk_verify_pages(buf: &[u8]) -> Result<(), BoxError> {
    let firsts: Vec<u8> = buf.iter().step_by(PAGE_BYTES).copied().collect();
    chk_verify_firsts(&firsts)
}

/// [`chk_verify_pages`] given the first byte of each page, in page order.
fn chk_verify_firsts(firsts: &[u8]) -> Result<(), BoxError> {
    let bad: Vec<usize> = firsts
        .iter()
        .enumerate()
        .filter(|(_, b)| **b != 0)
        .map(|(page, _)| page)
        .collect();
    for page in &bad {
        println!("invalid data in page {page}");
    }
    if bad.is_empty() {
        Ok(())
    } else {
        Err(format!("-c: {} page(s) hold invalid data", bad.len()).into())
    }
}

/// Options of `softroce pingpong`, those of rdma-core's `ibv_rc_pingpong` plus `--ip`.
#[derive(Args, Debug)]
#[command(group(ArgGroup::new("transport").required(true).args(["rc", "uc", "ud", "srq"])))]
pub struct PingpongArgs {
    #[command(flatten)]
    pub net: crate::NetArgs,
    /// RC QP, SEND/RECV (as ibv_rc_pingpong).
    #[arg(long)]
    rc: bool,
    /// UC QP, SEND/RECV (as ibv_uc_pingpong).
    #[arg(long)]
    uc: bool,
    /// UD QP, SEND/RECV with a GRH (as ibv_ud_pingpong).
    #[arg(long)]
    ud: bool,
    /// RC QPs on one shared receive queue (as ibv_srq_pingpong).
    #[arg(long)]
    srq: bool,
    /// --srq: number of QPs to use [default: 16].
    #[arg(short = 'q', long = "num-qp")]
    num_qp: Option<u32>,
    /// Sleep on CQ events (a completion channel) instead of polling, as the rdma-core tools' -e.
    #[arg(short = 'e', long = "events")]
    events: bool,
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
    /// Size of each message, in bytes [default: 4096; 2048 with --ud].
    #[arg(short = 's', long = "size")]
    size: Option<u32>,
    /// Path MTU in bytes (256, 512, 1024, 2048 or 4096; RC and UC).
    #[arg(short = 'm', long = "mtu", default_value_t = 1024)]
    mtu: u32,
    /// Receives to post at a time.
    #[arg(short = 'r', long = "rx-depth", default_value_t = 500)]
    rx_depth: u32,
    /// Number of exchanges.
    #[arg(short = 'n', long = "iters", default_value_t = 1000)]
    iters: u32,
    /// Service level (accepted and ignored: RoCE has none).
    #[arg(short = 'l', long = "sl", default_value_t = 0)]
    sl: u8,
    /// Local GID index (default 1, the RoCE v2 GID of the device address).
    #[arg(short = 'g', long = "gid-idx")]
    gid_idx: Option<u8>,
    /// Validate the received buffer as rc_pingpong -c does (first byte of every page).
    #[arg(short = 'c', long = "chk")]
    chk: bool,
    /// Address the device binds (UDP 4791); default $SOFTROCE_IP, else 127.0.0.1.
    #[arg(long)]
    ip: Option<IpAddr>,
    /// After the results, print the device's counters (rxe hw_counters names), read once the
    /// link has been quiet for 200 ms; with --srq also "sends: posted=N" (SENDs posted, of
    /// which `rdma_sends` completed).
    #[arg(long)]
    counters: bool,
}

/// The device address: `--ip`, else the first address of `$SOFTROCE_IP`, else 127.0.0.1
/// (`softroce::net::discover`, as every frontend finds its devices).
/// Errors: `$SOFTROCE_IP` that names no IP address.
pub fn device_ip(ip: Option<IpAddr>) -> Result<IpAddr, BoxError> {
    Ok(softroce::net::discover::default_device_ip(ip)?)
}

/// The GID at `index` of `dev`'s table, checked before anything is exchanged, so that both
/// sides of a run fail at once and say why (`flag` is the option that chose the index: `-g`
/// for pingpong, `-x` for perf). Errors: an index past the table; index 0, the link-local GID
/// (fe80::, from the device's derived MAC, as kernel rxe's GID 0 is its netdev's link-local
/// address), which no socket of the device is bound to, so the device sends only from index
/// 1, its own address.
pub fn local_gid(dev: &softroce::verbs::Device, index: u8, flag: &str) -> Result<Gid, BoxError> {
    let entry = dev
        .query_gid(1, index)
        .map_err(|e| format!("can't read sgid of index {index}: {e}; use {flag} 1"))?;
    let own = Gid::from_ip(dev.ip());
    if entry.gid != own {
        return Err(format!(
            "{flag} {index}: GID[{index}] {} is the link-local GID, which softroce devices do not \
             send from (on kernel rxe it would not route between two loopback addresses either): \
             use {flag} 1, the GID of the device address, {own}",
            entry.gid
        )
        .into());
    }
    Ok(entry.gid)
}

/// `-s`: the one MR holds a send area and a receive area of `size` bytes (plus `grh` for UD),
/// so it must fit the device's `max_mr_size`. Errors: the size and the largest one allowed.
pub fn check_size(dev: &softroce::verbs::Device, size: usize, grh: usize) -> Result<(), BoxError> {
    let max_mr = dev.query_device().max_mr_size;
    let max = (max_mr.saturating_sub(grh as u64)) / 2;
    if size as u64 > max {
        return Err(format!(
            "-s {size}: message size out of range: at most {max} (the MR holds a send and a \
             receive buffer of that size, and max_mr_size is {max_mr})"
        )
        .into());
    }
    Ok(())
}

/// One side's address as the pingpong tools exchange it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PingpongDest {
    /// LID (0 on RoCE).
    pub lid: u16,
    /// QP number.
    pub qpn: u32,
    /// First PSN this side sends.
    pub psn: u32,
    /// GID.
    pub gid: Gid,
}

impl PingpongDest {
    /// The 52-byte message: `"%04x:%06x:%06x:"`, the GID as 32 hex digits, NUL.
    pub fn to_message(self) -> [u8; MSG_LEN] {
        let mut text = format!("{:04x}:{:06x}:{:06x}:", self.lid, self.qpn, self.psn);
        for b in self.gid.0 {
            text.push_str(&format!("{b:02x}"));
        }
        let mut m = [0u8; MSG_LEN];
        let n = text.len().min(MSG_LEN - 1);
        m[..n].copy_from_slice(&text.as_bytes()[..n]);
        m
    }

    /// Parses a message as rc_pingpong's `sscanf("%x:%x:%x:%s")` + `wire_gid_to_gid` do.
    /// Errors: a message that is not four `:`-separated hex fields with a 32-digit GID.
    pub fn from_message(m: &[u8]) -> Result<PingpongDest, BoxError> {
        let end = m.iter().position(|b| *b == 0).unwrap_or(m.len());
        let text = std::str::from_utf8(&m[..end])
            .map_err(|_| format!("peer address message is not text: {m:02x?}"))?;
        let bad = || format!("malformed peer address message {text:?}");
        let mut f = text.split(':');
        let mut hex = |max: u32| -> Result<u32, String> {
            let v = f
                .next()
                .and_then(|s| u32::from_str_radix(s, 16).ok())
                .ok_or_else(bad)?;
            if v > max { Err(bad()) } else { Ok(v) }
        };
        let lid = hex(0xffff)? as u16;
        let qpn = hex(0x00ff_ffff)?;
        let psn = hex(0x00ff_ffff)?;
        let g = f.next().ok_or_else(bad)?;
        if g.len() != 32 || f.next().is_some() {
            return Err(bad().into());
        }
        let mut gid = [0u8; 16];
        for (i, b) in gid.iter_mut().enumerate() {
            *b = u8::from_str_radix(&g[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
        }
        Ok(PingpongDest {
            lid,
            qpn,
            psn,
            gid: Gid(gid),
        })
    }

    fn print(self, which: &str) {
        println!(
            "  {which} LID 0x{:04x}, QPN 0x{:06x}, PSN 0x{:06x}, GID {}",
            self.lid, self.qpn, self.psn, self.gid
        );
    }
}

/// Q_Key of ud_pingpong.
const UD_QKEY: u32 = 0x1111_1111;
/// Bytes of GRH in front of every UD receive.
const GRH_BYTES: usize = 40;

/// Runs `softroce pingpong`.
pub fn run(a: PingpongArgs) -> Result<(), BoxError> {
    if a.srq {
        return srq::run(a);
    }
    if a.num_qp.is_some() {
        return Err("-q is an ibv_srq_pingpong option: use it with --srq".into());
    }
    let qp_type = if a.uc {
        QpType::Uc
    } else if a.ud {
        QpType::Ud
    } else {
        QpType::Rc
    };
    let ud = qp_type == QpType::Ud;
    let msg_size = a.size.unwrap_or(if ud { 2048 } else { 4096 });
    if a.ib_port != 1 {
        return Err(format!("device port {} does not exist (only port 1)", a.ib_port).into());
    }
    let mtu = PathMtu::from_bytes(a.mtu)
        .ok_or_else(|| format!("MTU {} is not one of 256, 512, 1024, 2048, 4096", a.mtu))?;
    if a.rx_depth < 2 {
        return Err("rx depth must be at least 2".into());
    }
    if a.iters == 0 {
        return Err("iters must be at least 1".into());
    }
    let ip = device_ip(a.ip)?;
    let size = msg_size as usize;
    // UD: each receive starts with the 40-byte GRH.
    let grh = if ud { GRH_BYTES } else { 0 };

    // The error names the device, its address and port, and a hint.
    let dev = UdpDevice::open(&a.ib_dev, ip)?;
    // Counters are watched from here: what the peer sends right after the exchange counts.
    let mut watch = StallWatch::new(&dev);
    // -e: completions wake the loop through a completion channel, as rc_pingpong's -e.
    let channel = if a.events {
        Some(dev.create_comp_channel()?)
    } else {
        None
    };
    let pd = dev.alloc_pd()?;
    let cq = match &channel {
        Some(ch) => dev.create_cq_with_channel(a.rx_depth + 1, ch)?,
        None => dev.create_cq(a.rx_depth + 1)?,
    };
    if ud {
        let port_mtu = dev.query_port(1)?.active_mtu.bytes();
        if msg_size > port_mtu {
            return Err(format!("Requested size larger than port MTU ({port_mtu})").into());
        }
    }
    let qp = pd.create_qp(&QpInitAttr {
        qp_type,
        send_cq: &cq,
        recv_cq: &cq,
        cap: QpCap {
            max_send_wr: 1,
            max_recv_wr: a.rx_depth,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        },
        sq_sig_all: false,
        srq: None,
    })?;
    // [0, size): the buffer SENDs go from; [size, 2 × size + grh): where receives land.
    check_size(&dev, size, grh)?;
    let mr = pd.reg_mr((2 * size + grh).max(1), AccessFlags::LOCAL_WRITE)?;
    let mut buf: Vec<u8> = (0..size).map(fill_byte).collect();
    if a.chk && a.host.is_some() {
        chk_mark_pages(&mut buf);
    }
    mr.write(0, &buf)?;
    let init = QpAttr {
        qp_state: QpState::Init,
        pkey_index: 0,
        port_num: 1,
        qp_access_flags: AccessFlags::empty(),
        qkey: UD_QKEY,
        ..QpAttr::default()
    };
    let base = QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT;
    qp.modify(
        &init,
        base | if ud {
            QpAttrMask::QKEY
        } else {
            QpAttrMask::ACCESS_FLAGS
        },
    )?;
    let recv_len = u32::try_from(size + grh).map_err(|_| "message size too large")?;
    let recv_wr = RecvWr {
        wr_id: RECV_WRID,
        sg_list: vec![mr.sge(size, recv_len)],
    };
    let mut routs = post_recvs(&qp, &recv_wr, a.rx_depth);
    if routs < a.rx_depth {
        return Err(format!("Couldn't post receive ({routs})").into());
    }
    if channel.is_some() {
        cq.req_notify(false)
            .map_err(|e| format!("Couldn't request CQ notification: {e}"))?;
    }
    let gid_index = a.gid_idx.unwrap_or(1);
    let gid = local_gid(&dev, gid_index, "-g")?;
    let me = PingpongDest {
        lid: 0,
        qpn: qp.qp_num(),
        psn: random_psn(),
        gid,
    };

    // The UD destination (address handle, QPN, Q_Key) once the peer is known.
    let mut ud_dest = None;
    let mut connect = |peer: &PingpongDest| -> Result<(), BoxError> {
        if ud {
            ud_dest = Some(ready_ud(&qp, &pd, peer, me.psn, gid_index)?);
            Ok(())
        } else {
            connect_qp(&qp, peer, me.psn, mtu, gid_index)
        }
    };
    match &a.host {
        Some(host) => {
            me.print("local address: ");
            let peer = client_exchange(host, a.port, &me)?;
            peer.print("remote address:");
            connect(&peer)?;
        }
        None => {
            let unspecified = if ip.is_ipv4() {
                IpAddr::V4(Ipv4Addr::UNSPECIFIED)
            } else {
                IpAddr::V6(Ipv6Addr::UNSPECIFIED)
            };
            let listener = TcpListener::bind(SocketAddr::new(unspecified, a.port))
                .map_err(|e| format!("Couldn't listen to port {}: {e}", a.port))?;
            // Printed once the listener exists, so a script that sees this line may connect.
            me.print("local address: ");
            let peer = server_exchange(listener, &me, connect)?;
            peer.print("remote address:");
        }
    }

    let mut pending = RECV_WRID;
    if a.host.is_some() {
        qp.post_send(&[send_wr(&mr, msg_size, ud_dest)])
            .map_err(|e| format!("Couldn't post send: {e}"))?;
        pending |= SEND_WRID;
    }
    let start = Instant::now();
    // What every received message must equal: the client knows it from the start, the server
    // learns it from the first message. The messages themselves stay in the MR: they are
    // compared and copied there in chunks, so that a large message costs the MR (send and
    // receive halves) and this one copy, not a new buffer per message.
    let mut reference: Option<Vec<u8>> = a.host.as_ref().map(|_| std::mem::take(&mut buf));
    drop(buf);
    let mut scratch = Vec::new();
    let mut received_any = false;
    let (mut rcnt, mut scnt) = (0u32, 0u32);
    let mut wcs = [Wc::default(), Wc::default()];
    watch.progress();
    let mut num_cq_events = 0u32;
    while rcnt < a.iters || scnt < a.iters {
        // One event, re-arm, then one poll, as rc_pingpong does: at most one SEND and one
        // receive are outstanding, so the two-entry poll takes all there is.
        let n = next_completions(channel.as_ref(), &cq, &mut wcs, &mut num_cq_events)?;
        if n == 0 {
            let done = format!("{rcnt} of {} messages received, {scnt} sent", a.iters);
            watch.idle("pingpong", &done)?;
            continue;
        }
        watch.progress();
        for wc in &wcs[..n] {
            if wc.status != WcStatus::Success {
                return Err(format!(
                    "Failed status {} ({}) for wr_id {}",
                    wc.status, wc.status as u32, wc.wr_id
                )
                .into());
            }
            match wc.wr_id {
                SEND_WRID => scnt += 1,
                RECV_WRID => {
                    routs -= 1;
                    if routs <= 1 {
                        routs += post_recvs(&qp, &recv_wr, a.rx_depth - routs);
                        if routs < a.rx_depth {
                            return Err(format!("Couldn't post receive ({routs})").into());
                        }
                    }
                    rcnt += 1;
                    if wc.byte_len != recv_len {
                        return Err(format!(
                            "message {rcnt}: received {} bytes, expected {recv_len}",
                            wc.byte_len
                        )
                        .into());
                    }
                    match &reference {
                        Some(want) => mr_check_same(&mr, size + grh, want, rcnt, &mut scratch)?,
                        None => {
                            let mut first = vec![0u8; size];
                            mr.read(size + grh, &mut first)?;
                            reference = Some(first);
                        }
                    }
                    received_any = true;
                }
                other => return Err(format!("Completion for unknown wr_id {other}").into()),
            }
            pending &= !wc.wr_id;
            if scnt < a.iters && pending == 0 {
                // Send back what came in last, as rc_pingpong does by receiving into its buffer.
                if received_any {
                    mr_copy_within(&mr, size + grh, 0, size, &mut scratch)?;
                }
                qp.post_send(&[send_wr(&mr, msg_size, ud_dest)])
                    .map_err(|e| format!("Couldn't post send: {e}"))?;
                pending = RECV_WRID | SEND_WRID;
            }
        }
    }
    let elapsed = start.elapsed();
    if let Some(ch) = &channel {
        ch.ack_cq_events(&cq, num_cq_events)?;
    }
    if a.counters {
        quiesce(&dev);
    }
    // Counters live with the QP: read them before anything is torn down.
    let counters = counters_line(&dev);

    print_result_lines(msg_size, a.iters, elapsed);
    if a.chk {
        // The last message received, or (none received) the one this side sent.
        let last = if received_any { size + grh } else { 0 };
        chk_verify_mr_pages(&mr, last, size)?;
    }
    println!(
        "data: {rcnt} received messages of {msg_size} bytes checked, each equal to the first message of the session"
    );
    if a.counters {
        println!("{counters}");
    }
    Ok(())
}

/// rdma-core pingpong's two result lines, for `iters` round trips of `msg_size`-byte
/// messages in `elapsed`: "N bytes in S seconds = R Mbit/sec" (N = size × iters × 2) and
/// "I iters in S seconds = U usec/iter".
pub fn print_result_lines(msg_size: u32, iters: u32, elapsed: Duration) {
    let usec = (elapsed.as_secs_f64() * 1e6).max(1.0);
    let bytes = u64::from(msg_size) * u64::from(iters) * 2;
    println!(
        "{bytes} bytes in {:.2} seconds = {:.2} Mbit/sec",
        usec / 1e6,
        bytes as f64 * 8.0 / usec
    );
    println!(
        "{iters} iters in {:.2} seconds = {:.2} usec/iter",
        usec / 1e6,
        usec / f64::from(iters)
    );
}

/// `--counters`: "counters: tx_datagrams=N rx_datagrams=N" (the link's datagrams) followed by
/// every device counter as `name=value`, rxe's hw_counter names.
pub fn counters_line(dev: &UdpDevice) -> String {
    let load = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
    let mut line = format!(
        "counters: tx_datagrams={} rx_datagrams={}",
        load(&dev.link().tx_datagrams),
        load(&dev.link().rx_datagrams)
    );
    for (name, v) in dev.counters().entries() {
        line.push_str(&format!(" {name}={v}"));
    }
    line
}

/// Waits until the device has received nothing for 200 ms (at most 3 s), so that counters
/// read afterwards include the answers to the peer's late retransmissions: a datagram that
/// arrived just before the run ended is counted as received at once but answered a moment
/// later. rxe retransmits every 67 ms while it waits for an ACK, so 200 ms of silence means it
/// waits for nothing.
pub fn quiesce(dev: &UdpDevice) {
    let rx = || {
        dev.link()
            .rx_datagrams
            .load(std::sync::atomic::Ordering::Relaxed)
    };
    let deadline = Instant::now() + Duration::from_secs(3);
    let (mut last, mut quiet_since) = (rx(), Instant::now());
    while Instant::now() < deadline && quiet_since.elapsed() < Duration::from_millis(200) {
        std::thread::sleep(Duration::from_millis(20));
        let now = rx();
        if now != last {
            (last, quiet_since) = (now, Instant::now());
        }
    }
}

/// The client's initial buffer: byte `i` is `0x7b ^ i ^ (i >> 8)` (rc_pingpong fills 0x7b).
fn fill_byte(i: usize) -> u8 {
    0x7b ^ (i as u8) ^ ((i >> 8) as u8)
}

fn check_same(want: &[u8], got: &[u8], msg: u32) -> Result<(), BoxError> {
    match want.iter().zip(got).position(|(w, g)| w != g) {
        None => Ok(()),
        Some(i) => Err(mismatch(msg, i, got[i], want[i])),
    }
}

/// Byte `i` of received message `msg` is `got` where the session's message has `want`.
fn mismatch(msg: u32, i: usize, got: u8, want: u8) -> BoxError {
    format!(
        "data mismatch in received message {msg}: byte {i} is 0x{got:02x}, expected 0x{want:02x} \
         (every message of a pingpong session carries the client's first message)"
    )
    .into()
}

/// Bytes compared or copied at a time inside the MR (the scratch buffer's size).
const CHUNK_BYTES: usize = 1 << 20;

/// [`check_same`] for the message at `offset` in `mr`, read in chunks through `scratch`.
fn mr_check_same(
    mr: &Mr,
    offset: usize,
    want: &[u8],
    msg: u32,
    scratch: &mut Vec<u8>,
) -> Result<(), BoxError> {
    for (i, part) in want.chunks(CHUNK_BYTES).enumerate() {
        scratch.resize(part.len(), 0);
        mr.read(offset + i * CHUNK_BYTES, scratch)?;
        if let Some(j) = scratch.iter().zip(part).position(|(g, w)| g != w) {
            return Err(mismatch(msg, i * CHUNK_BYTES + j, scratch[j], part[j]));
        }
    }
    Ok(())
}

/// Copies `len` bytes inside `mr` from `from` to `to` (non-overlapping), in chunks.
fn mr_copy_within(
    mr: &Mr,
    from: usize,
    to: usize,
    len: usize,
    scratch: &mut Vec<u8>,
) -> Result<(), BoxError> {
    let mut done = 0;
    while done < len {
        let n = (len - done).min(CHUNK_BYTES);
        scratch.resize(n, 0);
        mr.read(from + done, scratch)?;
        mr.write(to + done, scratch)?;
        done += n;
    }
    Ok(())
}

/// [`chk_verify_pages`] for the `len`-byte message at `offset` in `mr`: only the first byte
/// of each page is read.
fn chk_verify_mr_pages(mr: &Mr, offset: usize, len: usize) -> Result<(), BoxError> {
    let mut firsts = Vec::with_capacity(len.div_ceil(PAGE_BYTES));
    for page_start in (0..len).step_by(PAGE_BYTES) {
        let mut b = [0u8; 1];
        mr.read(offset + page_start, &mut b)?;
        firsts.push(b[0]);
    }
    chk_verify_firsts(&firsts)
}

/// The completions of one turn of a pingpong's loop, as rdma-core's pingpongs take them:
/// with a completion channel (`-e`), one CQ event, the CQ re-armed, then one poll (counted in
/// `num_cq_events`, which the tools acknowledge at the end); without, a poll. Waits at most
/// 1 s, so that the caller's stall watch can say why nothing comes; 0 then. Errors: an
/// event for another CQ, a failed re-arm or event read, as the tools word them.
pub(crate) fn next_completions(
    channel: Option<&softroce::verbs::CompChannel>,
    cq: &softroce::verbs::Cq,
    wcs: &mut [Wc],
    num_cq_events: &mut u32,
) -> Result<usize, BoxError> {
    const WAIT: Duration = Duration::from_secs(1);
    let Some(ch) = channel else {
        return Ok(cq.wait(wcs, WAIT));
    };
    match ch.get_cq_event(WAIT) {
        Ok(ev_cq) => {
            *num_cq_events += 1;
            if !ev_cq.same_cq(cq) {
                return Err("CQ event for unknown CQ".into());
            }
            cq.req_notify(false)
                .map_err(|e| format!("Couldn't request CQ notification: {e}"))?;
            Ok(cq.poll(wcs))
        }
        Err(e) if e.kind() == softroce::verbs::ErrorKind::Again => Ok(0),
        Err(e) => Err(format!("Failed to get cq_event: {e}").into()),
    }
}

fn send_wr(mr: &Mr, size: u32, ud: Option<UdDest>) -> SendWr {
    let mut wr = SendWr::new(SEND_WRID, WrOpcode::Send, vec![mr.sge(0, size)]);
    wr.ud = ud;
    wr
}

/// Posts up to `n` copies of `wr`; returns how many were posted (as rc_pingpong's
/// `pp_post_recv`).
fn post_recvs(qp: &Qp, wr: &RecvWr, n: u32) -> u32 {
    let mut posted = 0;
    while posted < n && qp.post_recv(std::slice::from_ref(wr)).is_ok() {
        posted += 1;
    }
    posted
}

/// rc_pingpong sets a GRH only when the peer's interface id is non-zero; RoCE needs one.
fn check_peer_gid(peer: &PingpongDest) -> Result<(), BoxError> {
    if peer.gid.0[8..].iter().all(|b| *b == 0) {
        return Err(format!(
            "the peer sent GID {}: RoCE needs a GID, run the peer with -g <its RoCE v2 GID index>",
            peer.gid
        )
        .into());
    }
    Ok(())
}

/// UD: RTR, RTS with our first PSN (the QP is in INIT with its Q_Key, receives posted), and
/// an address handle towards the peer (ud_pingpong's `pp_connect_ctx`); returns where SENDs
/// go.
fn ready_ud(
    qp: &Qp,
    pd: &Pd,
    peer: &PingpongDest,
    my_psn: u32,
    sgid_index: u8,
) -> Result<UdDest, BoxError> {
    check_peer_gid(peer)?;
    qp.ready_ud(UD_QKEY, my_psn)
        .map_err(|e| format!("Failed to modify QP: {e}"))?;
    let ah = pd
        .create_ah(&AhAttr {
            sgid_index,
            ..AhAttr::roce_v2(peer.gid)
        })
        .map_err(|e| format!("Failed to create AH: {e}"))?;
    Ok(ah.dest(peer.qpn, UD_QKEY))
}

/// RC/UC: RTR → RTS towards `peer` with rc_pingpong's / uc_pingpong's attributes
/// (`pp_connect_ctx`, the library's one connect sequence: [`Qp::connect_rc`]; the QP is in
/// INIT with its receives posted).
pub fn connect_qp(
    qp: &Qp,
    peer: &PingpongDest,
    my_psn: u32,
    mtu: PathMtu,
    sgid_index: u8,
) -> Result<(), BoxError> {
    check_peer_gid(peer)?;
    let c = RcConnect {
        sgid_index,
        path_mtu: mtu,
        ..RcConnect::new(peer.qpn, peer.gid, peer.psn, my_psn)
    };
    qp.connect_rc(&c)
        .map_err(|e| format!("Failed to modify QP: {e}").into())
}

/// Client side of the exchange (`pp_client_exch_dest`).
fn client_exchange(host: &str, port: u16, me: &PingpongDest) -> Result<PingpongDest, BoxError> {
    let mut tcp = exchange::connect(host, port)?;
    tcp.write_all(&me.to_message())
        .map_err(|e| format!("Couldn't send local address: {e}"))?;
    let mut msg = [0u8; MSG_LEN];
    tcp.read_exact(&mut msg, "address")?;
    tcp.write_all(b"done\0")
        .map_err(|e| format!("Couldn't read/write remote address: {e}"))?;
    PingpongDest::from_message(&msg)
}

/// Server side of the exchange (`pp_server_exch_dest`): one client, whose QP we connect to
/// before answering. The wait for a client has no deadline; the steps after it have.
fn server_exchange(
    listener: TcpListener,
    me: &PingpongDest,
    connect: impl FnOnce(&PingpongDest) -> Result<(), BoxError>,
) -> Result<PingpongDest, BoxError> {
    let (tcp, peer) = listener
        .accept()
        .map_err(|e| format!("accept() failed: {e}"))?;
    drop(listener);
    let mut tcp = exchange::Conn::accepted(tcp, peer);
    let mut msg = [0u8; MSG_LEN];
    tcp.read_exact(&mut msg, "address")?;
    let peer = PingpongDest::from_message(&msg)?;
    connect(&peer).map_err(|e| format!("Couldn't connect to remote QP: {e}"))?;
    tcp.write_all(&me.to_message())
        .map_err(|e| format!("Couldn't send local address: {e}"))?;
    let mut done = [0u8; 5];
    tcp.read_exact(&mut done, "\"done\"")?;
    Ok(peer)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn address_message_matches_rdma_core_layout() {
        // LID 0, QPN 0x11, PSN 0x5d2b83, GID ::ffff:10.77.0.2 in rc_pingpong's layout:
        // "%04x:%06x:%06x:" and the GID bytes in order as 32 hex digits, then a NUL.
        let d = PingpongDest {
            lid: 0,
            qpn: 0x11,
            psn: 0x5d_2b83,
            gid: Gid::from_ip("10.77.0.2".parse().unwrap()),
        };
        let m = d.to_message();
        assert_eq!(
            &m[..51],
            b"0000:000011:5d2b83:00000000000000000000ffff0a4d0002"
        );
        assert_eq!(m[51], 0);
        assert_eq!(PingpongDest::from_message(&m).unwrap(), d);
    }

    #[test]
    fn malformed_messages_are_refused() {
        for m in [
            &b"0000:000011:5d2b83"[..],
            b"0000:000011:5d2b83:0000",
            b"zzzz:000011:5d2b83:00000000000000000000ffff0a4d0002",
            b"0000:1000011:5d2b83:00000000000000000000ffff0a4d0002",
            b"0000:000011:5d2b83:00000000000000000000ffff0a4d0002:00",
        ] {
            assert!(PingpongDest::from_message(m).is_err(), "{m:?}");
        }
    }
}
