//! `softroce target`: a scriptable RC responder (and, with `post_send`, requester) for people
//! testing their own RoCE code and scapy scripts.
//!
//! It opens a device on `--ip`, creates one RC QP, registers the MRs asked for and a receive
//! MR, and prints one JSON line (`{"ready": {...}}`) with the GID, QPN, PSN and each MR's
//! `va` / `rkey` / `length`. Then it reads one JSON command per line on stdin and writes one
//! JSON line per reply, per work completion (`{"wc": {...}}`) and per QP state change it did
//! not cause itself (`{"event": {...}}`, e.g. RTS → ERR after a NAK). Every output line is an
//! object with exactly one key naming its kind, as the commands are.
//!
//! Commands (`{"name": {args}}`; numbers may be JSON integers or `"0x…"` strings):
//!
//! | command | args | reply |
//! |---|---|---|
//! | `connect` | `dest_qpn`, `dest_gid` (GID or IP), `dest_psn` (default 0), `timeout` (14), `retry_cnt` (7), `rnr_retry` (7), `traffic_class` (0: the IPv4 TOS / IPv6 traffic class of the QP's packets, e.g. 0xb8 for DSCP 46), `hop_limit` (64) | QP through INIT/RTR/RTS (from RESET first if needed); receives posted |
//! | `post_recv` | `count` (1), `length` (`--recv-size`) | `wr_ids` posted |
//! | `post_send` | `opcode` (`send`, `send_imm`, `write`, `write_imm` or `read`), `index` (MR, 0), `offset` (0), `length` (rest of the MR), `remote_addr` + `rkey` (write, write_imm, read), `imm_data` (send_imm, write_imm: the 32 bits as on the wire, 0), `wr_id` (1) | one signaled WR posted; its `wc` line follows |
//! | `dump_mr` | `index` (or `"recv"`), `offset` (0), `length` (rest of the MR) | `hex` |
//! | `write_mr` | `index`, `offset` (0), `hex`, or `fill` + `length` | bytes written |
//! | `counters` | — | device counters (rxe names), drop reasons, datagrams |
//! | `query_qp` | — | QP state and numbers |
//! | `help` | — | the command list |
//! | `quit` | — | then exit 0 (EOF on stdin also exits 0) |
//!
//! A line that is not valid JSON, an unknown command or field, or a failing verbs call gives
//! `{"error": {"command", "line", "message"}}` and the target carries on. Receives live in
//! slots of `--recv-size` bytes in the receive MR; unless `--no-recv`, `--recv-depth` are
//! posted at connect and each is re-posted when it completes successfully (before its `wc`
//! line is written, so a peer that sees the line can send again at once).

use crate::BoxError;
use clap::Args;
use parking_lot::Mutex;
use serde_json::{Map, Value, json};
use softroce::net::UdpDevice;
use softroce::net::oob::random_psn;
use softroce::verbs::{
    AccessFlags, Cq, Gid, Mr, PathMtu, Pd, Qp, QpAttr, QpAttrMask as A, QpCap, QpInitAttr, QpState,
    QpType, RcConnect, RecvWr, SendWr, Wc, WcFlags, WcOpcode, WcStatus, WrOpcode,
};
use std::collections::HashMap;
use std::io::{BufRead, Read, Write};
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Most MRs `--mr-size` / `--mr-count` may ask for.
const MAX_MRS: usize = 1024;
/// Most bytes all MRs together may hold (1 GiB).
const MAX_TOTAL_MR_BYTES: u64 = 1 << 30;
/// Most receive slots.
const MAX_RECV_DEPTH: u32 = 4096;
/// Send queue depth (`post_send` WRs outstanding at once).
const MAX_SEND_WR: u32 = 16;
/// Most bytes one `dump_mr` returns (the hex line is twice as long).
const MAX_DUMP_BYTES: u64 = 16 << 20;
/// Longest command line accepted, in bytes.
const MAX_LINE_BYTES: u64 = 64 << 20;
/// How long the completion thread waits on the CQ before it looks at the QP state again.
const POLL_PERIOD: Duration = Duration::from_millis(20);

/// Options of `softroce target`.
#[derive(Args, Debug)]
pub struct TargetArgs {
    #[command(flatten)]
    pub net: crate::NetArgs,
    /// Address the device binds (UDP 4791); default $SOFTROCE_IP, else 127.0.0.1.
    #[arg(long)]
    ip: Option<IpAddr>,
    /// Device name.
    #[arg(short = 'd', long = "ib-dev", default_value = "softroce0")]
    ib_dev: String,
    /// Bytes of each MR to register; repeat (or comma-separate) for several MRs.
    #[arg(long = "mr-size", value_name = "BYTES", value_delimiter = ',', default_values_t = [4096usize])]
    mr_size: Vec<usize>,
    /// Register this many MRs of the (single) --mr-size.
    #[arg(long = "mr-count", value_name = "N")]
    mr_count: Option<usize>,
    /// Access flags of the MRs (and of the QP unless --qp-access), comma-separated:
    /// local_write, remote_write, remote_read, remote_atomic (or `none`).
    #[arg(
        long,
        value_name = "LIST",
        default_value = "local_write,remote_write,remote_read,remote_atomic"
    )]
    access: String,
    /// The QP's remote access flags (`qp_access_flags`), if they differ from --access.
    #[arg(long = "qp-access", value_name = "LIST")]
    qp_access: Option<String>,
    /// Path MTU in bytes (256, 512, 1024, 2048 or 4096).
    #[arg(long = "path-mtu", value_name = "BYTES", default_value_t = 1024)]
    path_mtu: u32,
    /// RNR timer code (0..=31) this responder sends in RNR NAKs (AETH 0x20 | code).
    #[arg(long = "min-rnr-timer", value_name = "CODE", default_value_t = 12)]
    min_rnr_timer: u8,
    /// The QP's `max_dest_rd_atomic` (0: every READ and atomic is NAKed invalid request).
    #[arg(long = "max-dest-rd-atomic", value_name = "N", default_value_t = 1)]
    max_dest_rd_atomic: u8,
    /// Post no receives at connect and never re-post (use `post_recv`).
    #[arg(long = "no-recv")]
    no_recv: bool,
    /// Receives kept posted (and receive slots in the receive MR).
    #[arg(long = "recv-depth", value_name = "N", default_value_t = 16)]
    recv_depth: u32,
    /// Bytes of each receive slot.
    #[arg(long = "recv-size", value_name = "BYTES", default_value_t = 4096)]
    recv_size: u32,
    /// First PSN this QP sends (`sq_psn`), decimal or 0x hex; default random.
    #[arg(long, value_name = "PSN", value_parser = parse_psn)]
    psn: Option<u32>,
}

fn parse_psn(s: &str) -> Result<u32, String> {
    let v = parse_u64_text(s).ok_or_else(|| format!("{s:?} is not a number"))?;
    u32::try_from(v)
        .ok()
        .filter(|v| *v <= 0x00ff_ffff)
        .ok_or_else(|| format!("{s} does not fit in 24 bits"))
}

/// Decimal, or hex with a `0x` prefix.
fn parse_u64_text(s: &str) -> Option<u64> {
    let s = s.trim();
    match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(h) => u64::from_str_radix(h, 16).ok(),
        None => s.parse().ok(),
    }
}

/// Access flag names, as `ibv_access_flags` without the prefix.
const ACCESS_NAMES: [(AccessFlags, &str); 4] = [
    (AccessFlags::LOCAL_WRITE, "local_write"),
    (AccessFlags::REMOTE_WRITE, "remote_write"),
    (AccessFlags::REMOTE_READ, "remote_read"),
    (AccessFlags::REMOTE_ATOMIC, "remote_atomic"),
];

fn parse_access(list: &str) -> Result<AccessFlags, String> {
    let mut f = AccessFlags::empty();
    for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        let low = name.to_ascii_lowercase();
        let low = low.strip_prefix("ibv_access_").unwrap_or(&low);
        if low == "none" {
            continue;
        }
        let (bit, _) = ACCESS_NAMES
            .iter()
            .find(|(_, n)| *n == low)
            .ok_or_else(|| {
                format!(
                    "unknown access flag {name:?} (use none, local_write, remote_write, remote_read, remote_atomic)"
                )
            })?;
        f |= *bit;
    }
    Ok(f)
}

fn access_json(f: AccessFlags) -> Value {
    ACCESS_NAMES
        .iter()
        .filter(|(b, _)| f.contains(*b))
        .map(|(_, n)| Value::from(*n))
        .collect()
}

/// Settings fixed at start-up.
#[derive(Debug, Clone, Copy)]
struct Settings {
    path_mtu: PathMtu,
    mr_access: AccessFlags,
    qp_access: AccessFlags,
    min_rnr_timer: u8,
    max_dest_rd_atomic: u8,
    sq_psn: u32,
    no_recv: bool,
    recv_depth: u32,
    recv_size: u32,
}

/// One receive WR the target posted.
#[derive(Debug, Clone, Copy)]
struct Posted {
    slot: u32,
    length: u32,
    /// Post it again when it completes successfully.
    repost: bool,
}

/// Which receive slots are in use, by `wr_id`.
#[derive(Debug, Default)]
struct RecvBook {
    free: Vec<u32>,
    posted: HashMap<u64, Posted>,
    next_wr_id: u64,
}

/// Everything the command loop and the completion thread share. Fields drop in order: the
/// QP and MRs before the CQ, PD and device.
struct Target {
    qp: Qp,
    mrs: Vec<Mr>,
    recv_mr: Mr,
    cq: Cq,
    _pd: Pd,
    dev: UdpDevice,
    set: Settings,
    recv: Mutex<RecvBook>,
    /// The QP state last reported; held while a command changes the state, so that the
    /// completion thread reports only changes the target did not make itself.
    reported: Mutex<QpState>,
    stop: AtomicBool,
    /// Set when stdout is gone: nothing more can be reported.
    out_broken: AtomicBool,
}

/// Writes one JSON line to stdout (whole, under the stdout lock) and flushes it.
fn emit(t: &Target, v: &Value) {
    let mut o = std::io::stdout().lock();
    if writeln!(o, "{v}").and_then(|()| o.flush()).is_err() {
        t.out_broken.store(true, Ordering::SeqCst);
    }
}

/// Runs `softroce target`.
pub fn run(a: TargetArgs) -> Result<(), BoxError> {
    let t = match setup(&a) {
        Ok(t) => Arc::new(t),
        Err(e) => {
            // The one start-up line is an error instead of `ready`.
            println!(
                "{}",
                json!({"error": {"command": null, "line": null, "message": e.to_string()}})
            );
            return Err(e);
        }
    };
    emit(&t, &ready_json(&t));
    let poller = {
        let t = t.clone();
        std::thread::Builder::new()
            .name("target-cq".into())
            .spawn(move || poll_loop(&t))?
    };
    command_loop(&t);
    t.stop.store(true, Ordering::SeqCst);
    poller.join().map_err(|_| "completion thread panicked")?;
    Ok(())
}

fn setup(a: &TargetArgs) -> Result<Target, BoxError> {
    let path_mtu = PathMtu::from_bytes(a.path_mtu).ok_or_else(|| {
        format!(
            "--path-mtu {} is not one of 256, 512, 1024, 2048, 4096",
            a.path_mtu
        )
    })?;
    if a.min_rnr_timer > 31 {
        return Err(format!("--min-rnr-timer {} is not a 5-bit code", a.min_rnr_timer).into());
    }
    if a.recv_depth == 0 || a.recv_depth > MAX_RECV_DEPTH {
        return Err(format!("--recv-depth must be 1..={MAX_RECV_DEPTH}").into());
    }
    if a.recv_size == 0 {
        return Err("--recv-size must be at least 1".into());
    }
    let mr_access = parse_access(&a.access).map_err(|e| format!("--access: {e}"))?;
    let qp_access = match &a.qp_access {
        Some(l) => parse_access(l).map_err(|e| format!("--qp-access: {e}"))?,
        None => mr_access,
    };
    let count = a.mr_count.unwrap_or(a.mr_size.len());
    if count > MAX_MRS {
        return Err(format!("at most {MAX_MRS} MRs").into());
    }
    let sizes: Vec<usize> = match (a.mr_count, a.mr_size.as_slice()) {
        (Some(n), [size]) => vec![*size; n],
        (Some(_), _) => return Err("--mr-count takes exactly one --mr-size".into()),
        (None, sizes) => sizes.to_vec(),
    };
    let recv_bytes = u64::from(a.recv_depth) * u64::from(a.recv_size);
    let total = sizes
        .iter()
        .fold(recv_bytes, |sum, s| sum.saturating_add(*s as u64));
    if total > MAX_TOTAL_MR_BYTES {
        return Err(format!(
            "MRs and receive slots would take {total} bytes; the limit is {MAX_TOTAL_MR_BYTES}"
        )
        .into());
    }
    let ip = crate::pingpong::device_ip(a.ip)?;
    // One datagram per system call: the target's answers are checked byte for byte by
    // peers that see no IP header and assume IPv4 ID 0 on every datagram (docs/wire-facts.md §0.2), which
    // a UDP GSO send gives only its first segment (segment i carries ID i).
    let opts = softroce::net::UdpOptions {
        no_offload: true,
        ..softroce::net::UdpOptions::process_default()
    };
    let cfg = softroce::verbs::DeviceConfig::new(&a.ib_dev, ip);
    // The error names the device, its address and port, and a hint.
    let dev = UdpDevice::open_with_options(cfg, &opts)?;
    let pd = dev.alloc_pd()?;
    let cq = dev.create_cq(a.recv_depth + 64)?;
    let qp = pd.create_qp(&QpInitAttr {
        qp_type: QpType::Rc,
        send_cq: &cq,
        recv_cq: &cq,
        cap: QpCap {
            max_send_wr: MAX_SEND_WR,
            max_recv_wr: a.recv_depth,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        },
        sq_sig_all: false,
        srq: None,
    })?;
    let mut mrs = Vec::with_capacity(sizes.len());
    for (i, size) in sizes.iter().enumerate() {
        mrs.push(
            pd.reg_mr(*size, mr_access)
                .map_err(|e| format!("MR {i} ({size} bytes): {e}"))?,
        );
    }
    let recv_mr = pd
        .reg_mr(recv_bytes as usize, AccessFlags::LOCAL_WRITE)
        .map_err(|e| format!("receive MR: {e}"))?;
    let set = Settings {
        path_mtu,
        mr_access,
        qp_access,
        min_rnr_timer: a.min_rnr_timer,
        max_dest_rd_atomic: a.max_dest_rd_atomic,
        sq_psn: a.psn.unwrap_or_else(random_psn) & 0x00ff_ffff,
        no_recv: a.no_recv,
        recv_depth: a.recv_depth,
        recv_size: a.recv_size,
    };
    let book = RecvBook {
        free: (0..a.recv_depth).rev().collect(),
        posted: HashMap::new(),
        next_wr_id: 1,
    };
    Ok(Target {
        qp,
        mrs,
        recv_mr,
        cq,
        _pd: pd,
        dev,
        set,
        recv: Mutex::new(book),
        reported: Mutex::new(QpState::Reset),
        stop: AtomicBool::new(false),
        out_broken: AtomicBool::new(false),
    })
}

fn mr_json(index: Value, mr: &Mr, access: AccessFlags) -> Value {
    json!({
        "index": index,
        "va": mr.addr(),
        "rkey": mr.rkey(),
        "lkey": mr.lkey(),
        "length": mr.len(),
        "access": access_json(access),
    })
}

fn ready_json(t: &Target) -> Value {
    let mrs: Vec<Value> = t
        .mrs
        .iter()
        .enumerate()
        .map(|(i, m)| mr_json(i.into(), m, t.set.mr_access))
        .collect();
    json!({"ready": {
        "device": t.dev.name(),
        "ip": t.dev.ip().to_string(),
        "gid": Gid::from_ip(t.dev.ip()).to_string(),
        "gid_index": 1,
        "qpn": t.qp.qp_num(),
        "psn": t.set.sq_psn,
        "path_mtu": t.set.path_mtu.bytes(),
        "qp_access": access_json(t.set.qp_access),
        "min_rnr_timer": t.set.min_rnr_timer,
        "max_dest_rd_atomic": t.set.max_dest_rd_atomic,
        "recv": {
            "depth": t.set.recv_depth,
            "size": t.set.recv_size,
            "auto": !t.set.no_recv,
        },
        "mrs": mrs,
        "recv_mr": mr_json("recv".into(), &t.recv_mr, AccessFlags::LOCAL_WRITE),
    }})
}

// ---- completions and events ----

/// The completion thread: reports every work completion, re-posts receives, and reports QP
/// state changes (e.g. to ERR after a NAK) that no command made. Ends once `stop` is set and
/// the CQ is empty.
fn poll_loop(t: &Target) {
    let mut wcs = [Wc::default(); 32];
    loop {
        let stopping = t.stop.load(Ordering::SeqCst);
        let n = t.cq.wait(&mut wcs, POLL_PERIOD);
        if n == 0 && t.dev.failure().is_some() {
            // The device failed (its driver thread panicked, reported on stderr): waits
            // return at once now; keep this loop's pace instead of spinning.
            std::thread::sleep(POLL_PERIOD);
        }
        for wc in &wcs[..n] {
            let line = on_wc(t, wc);
            emit(t, &line);
        }
        report_state(t);
        if (stopping && n == 0) || t.out_broken.load(Ordering::SeqCst) {
            break;
        }
    }
}

fn report_state(t: &Target) {
    let mut reported = t.reported.lock();
    let now = t.qp.state();
    if now != *reported {
        emit(
            t,
            &json!({"event": {"qp_state": now.name(), "previous": reported.name()}}),
        );
        *reported = now;
    }
}

/// Handles one completion: frees (and, if asked, re-posts) its receive slot and returns its
/// `wc` line. A successful SEND's bytes are in `data` (hex).
fn on_wc(t: &Target, wc: &Wc) -> Value {
    let mut line = json!({
        "wr_id": wc.wr_id,
        "status": wc.status.ibv_name(),
        "status_text": wc.status.to_string(),
        "opcode": wc.opcode.ibv_name(),
        "byte_len": wc.byte_len,
        "imm_data": wc.imm_data,
        "with_imm": wc.wc_flags.contains(WcFlags::WITH_IMM),
        "grh": wc.wc_flags.contains(WcFlags::GRH),
        "wc_flags": wc.wc_flags.0,
        "qp_num": wc.qp_num,
        "src_qp": wc.src_qp,
        "vendor_err": wc.vendor_err,
    });
    let is_recv = matches!(wc.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm);
    if !is_recv {
        return json!({ "wc": line });
    }
    // The book stays locked from lookup to re-post, so a `connect` cannot reset in between.
    let mut book = t.recv.lock();
    if let (Some(p), Some(obj)) = (book.posted.remove(&wc.wr_id), line.as_object_mut()) {
        let offset = u64::from(p.slot) * u64::from(t.set.recv_size);
        obj.insert("recv_offset".into(), offset.into());
        if wc.status == WcStatus::Success && wc.opcode == WcOpcode::Recv {
            let n = wc.byte_len.min(p.length) as usize;
            let mut data = vec![0u8; n];
            if t.recv_mr.read(offset as usize, &mut data).is_ok() {
                obj.insert("data".into(), hex(&data).into());
            }
        }
        // Re-post first, so that a peer that reads this line may send again at once (not in
        // ERR, where the WR would only be flushed).
        let again = p.repost && wc.status == WcStatus::Success && t.qp.state() != QpState::Err;
        if !(again && post_slot(t, &mut book, p).is_ok()) {
            book.free.push(p.slot);
        }
    }
    drop(book);
    json!({ "wc": line })
}

/// Posts a receive WR for slot `p` under a fresh `wr_id`. Errors: the verbs error.
fn post_slot(t: &Target, book: &mut RecvBook, p: Posted) -> Result<u64, String> {
    let wr_id = book.next_wr_id;
    let offset = p.slot as usize * t.set.recv_size as usize;
    let wr = RecvWr {
        wr_id,
        sg_list: vec![t.recv_mr.sge(offset, p.length)],
    };
    t.qp.post_recv(&[wr]).map_err(|e| e.to_string())?;
    book.next_wr_id += 1;
    book.posted.insert(wr_id, p);
    Ok(wr_id)
}

/// Posts `count` receives of `length` bytes into free slots. Errors: not enough free slots,
/// or the verbs error (the WRs posted before it stay posted).
fn post_recvs(t: &Target, count: u32, length: u32, repost: bool) -> Result<Vec<u64>, String> {
    let mut book = t.recv.lock();
    let free = book.free.len();
    if count as usize > free {
        return Err(format!(
            "{count} receives asked, {free} of {} receive slots free",
            t.set.recv_depth
        ));
    }
    let mut ids = Vec::new();
    for _ in 0..count {
        let Some(slot) = book.free.pop() else {
            break;
        };
        let p = Posted {
            slot,
            length,
            repost,
        };
        match post_slot(t, &mut book, p) {
            Ok(id) => ids.push(id),
            Err(e) => {
                book.free.push(slot);
                return Err(format!("post_recv after {} posted: {e}", ids.len()));
            }
        }
    }
    Ok(ids)
}

fn hex(b: &[u8]) -> String {
    let mut s = String::with_capacity(b.len() * 2);
    for x in b {
        s.push_str(&format!("{x:02x}"));
    }
    s
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    let s: String = s.chars().filter(|c| !c.is_whitespace()).collect();
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| s.get(i..i + 2).and_then(|h| u8::from_str_radix(h, 16).ok()))
        .collect()
}

// ---- commands ----

/// What a command line produced.
enum Outcome {
    /// Write this reply and read the next command.
    Reply(Value),
    /// Write this reply and exit.
    Quit(Value),
}

/// A command error: the command's name (if it got that far) and what was wrong.
struct CmdError {
    command: Option<String>,
    message: String,
}

impl CmdError {
    fn new(command: &str, message: impl Into<String>) -> CmdError {
        CmdError {
            command: Some(command.to_string()),
            message: message.into(),
        }
    }
}

/// Reads command lines until EOF, `quit` or a broken stdout.
fn command_loop(t: &Target) {
    let stdin = std::io::stdin();
    let mut input = stdin.lock();
    let mut buf = Vec::new();
    let mut lineno = 0u64;
    while !t.out_broken.load(Ordering::SeqCst) {
        buf.clear();
        let n = match (&mut input)
            .take(MAX_LINE_BYTES + 1)
            .read_until(b'\n', &mut buf)
        {
            Ok(n) => n,
            Err(_) => break,
        };
        if n == 0 {
            break; // EOF
        }
        lineno += 1;
        if buf.len() as u64 > MAX_LINE_BYTES && buf.last() != Some(&b'\n') {
            // Skip the rest of the over-long line.
            let mut rest = Vec::new();
            while let Ok(k) = (&mut input).take(1 << 20).read_until(b'\n', &mut rest) {
                if k == 0 || rest.last() == Some(&b'\n') {
                    break;
                }
                rest.clear();
            }
            let message = format!("line longer than {MAX_LINE_BYTES} bytes");
            emit(t, &error_json(None, lineno, &message));
            continue;
        }
        let Ok(text) = std::str::from_utf8(&buf) else {
            emit(t, &error_json(None, lineno, "line is not UTF-8"));
            continue;
        };
        if text.trim().is_empty() {
            continue;
        }
        match handle_line(t, text) {
            Ok(Outcome::Reply(v)) => emit(t, &v),
            Ok(Outcome::Quit(v)) => {
                emit(t, &v);
                break;
            }
            Err(e) => emit(t, &error_json(e.command.as_deref(), lineno, &e.message)),
        }
    }
}

fn error_json(command: Option<&str>, line: u64, message: &str) -> Value {
    json!({"error": {"command": command, "line": line, "message": message}})
}

/// The arguments of one command, with typed getters that name the field in their errors.
struct CmdArgs<'a> {
    cmd: &'a str,
    map: &'a Map<String, Value>,
}

impl CmdArgs<'_> {
    fn err(&self, msg: impl Into<String>) -> CmdError {
        CmdError::new(self.cmd, msg)
    }

    /// Refuses fields the command does not know (a typo should not be silently ignored).
    fn only(&self, allowed: &[&str]) -> Result<(), CmdError> {
        match self.map.keys().find(|k| !allowed.contains(&k.as_str())) {
            None => Ok(()),
            Some(k) if allowed.is_empty() => {
                Err(self.err(format!("{} takes no fields (got {k:?})", self.cmd)))
            }
            Some(k) => Err(self.err(format!(
                "unknown field {k:?} (fields: {})",
                allowed.join(", ")
            ))),
        }
    }

    /// An unsigned integer field: a JSON integer or a `"0x…"` / decimal string.
    fn uint(&self, name: &str, max: u64) -> Result<Option<u64>, CmdError> {
        let Some(v) = self.map.get(name) else {
            return Ok(None);
        };
        let n = match v {
            Value::Number(n) => n.as_u64(),
            Value::String(s) => parse_u64_text(s),
            _ => None,
        }
        .ok_or_else(|| self.err(format!("{name}: expected an unsigned integer, got {v}")))?;
        if n > max {
            return Err(self.err(format!("{name}: {n} is larger than {max}")));
        }
        Ok(Some(n))
    }

    fn need_uint(&self, name: &str, max: u64) -> Result<u64, CmdError> {
        self.uint(name, max)?
            .ok_or_else(|| self.err(format!("missing field {name:?}")))
    }

    fn string(&self, name: &str) -> Result<Option<&str>, CmdError> {
        match self.map.get(name) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(v) => Err(self.err(format!("{name}: expected a string, got {v}"))),
        }
    }
}

/// Parses and runs one command line.
fn handle_line(t: &Target, text: &str) -> Result<Outcome, CmdError> {
    let v: Value = serde_json::from_str(text).map_err(|e| CmdError {
        command: None,
        message: format!("not JSON: {e}"),
    })?;
    let shape = || CmdError {
        command: None,
        message: "expected one object with one key, the command, e.g. {\"counters\": {}}".into(),
    };
    let obj = v.as_object().ok_or_else(shape)?;
    if obj.len() != 1 {
        return Err(shape());
    }
    let Some((cmd, args)) = obj.iter().next() else {
        return Err(shape());
    };
    let empty = Map::new();
    let map = match args {
        Value::Object(m) => m,
        Value::Null => &empty,
        _ => {
            return Err(CmdError::new(
                cmd,
                "the arguments must be an object (or null)",
            ));
        }
    };
    let a = CmdArgs { cmd, map };
    let reply = match cmd.as_str() {
        "connect" => cmd_connect(t, &a)?,
        "post_recv" => cmd_post_recv(t, &a)?,
        "post_send" => cmd_post_send(t, &a)?,
        "dump_mr" => cmd_dump_mr(t, &a)?,
        "write_mr" => cmd_write_mr(t, &a)?,
        "counters" => {
            a.only(&[])?;
            cmd_counters(t)
        }
        "query_qp" => {
            a.only(&[])?;
            cmd_query_qp(t)
        }
        "help" => {
            a.only(&[])?;
            json!({"help": {"commands": [
                "connect {dest_qpn, dest_gid, dest_psn?, timeout?, retry_cnt?, rnr_retry?, \
                 traffic_class?, hop_limit?}",
                "post_recv {count?, length?}",
                "post_send {opcode, index?, offset?, length?, remote_addr?, rkey?, imm_data?, \
                 wr_id?}",
                "dump_mr {index, offset?, length?}",
                "write_mr {index, offset?, hex | fill + length}",
                "counters {}",
                "query_qp {}",
                "help {}",
                "quit {}",
            ]}})
        }
        "quit" => {
            a.only(&[])?;
            return Ok(Outcome::Quit(json!({"quit": {"ok": true}})));
        }
        other => {
            return Err(CmdError::new(
                other,
                "unknown command (connect, post_recv, post_send, dump_mr, write_mr, counters, query_qp, help, quit)",
            ));
        }
    };
    Ok(Outcome::Reply(reply))
}

/// `connect`: RESET (if needed) → INIT → RTR → RTS towards the peer, then the receives.
fn cmd_connect(t: &Target, a: &CmdArgs<'_>) -> Result<Value, CmdError> {
    a.only(&[
        "dest_qpn",
        "dest_psn",
        "dest_gid",
        "timeout",
        "retry_cnt",
        "rnr_retry",
        "traffic_class",
        "hop_limit",
    ])?;
    let dest_qpn = a.need_uint("dest_qpn", 0x00ff_ffff)? as u32;
    // The requester's retry settings (ibv_qp_attr): 5-bit local ACK timeout code, 3-bit
    // counts (rnr_retry 7 = retry for ever).
    let timeout = a.uint("timeout", 31)?.unwrap_or(14) as u8;
    let retry_cnt = a.uint("retry_cnt", 7)?.unwrap_or(7) as u8;
    let rnr_retry = a.uint("rnr_retry", 7)?.unwrap_or(7) as u8;
    let dest_psn = a.uint("dest_psn", 0x00ff_ffff)?.unwrap_or(0) as u32;
    // The address vector's IP header fields (IPv4 TOS / IPv6 traffic class, TTL / hop limit).
    let traffic_class = a.uint("traffic_class", 0xff)?.unwrap_or(0) as u8;
    let hop_limit = a.uint("hop_limit", 0xff)?.unwrap_or(64) as u8;
    let gid_text = a
        .string("dest_gid")?
        .ok_or_else(|| a.err("missing field \"dest_gid\""))?;
    let dgid = gid_text
        .trim()
        .parse::<IpAddr>()
        .map(Gid::from_ip)
        .map_err(|_| a.err(format!("dest_gid: {gid_text:?} is not a GID or IP address")))?;
    let s = t.set;
    let mut reported = t.reported.lock();
    let mut book = t.recv.lock();
    let mut reset = t.qp.state() == QpState::Reset;
    let result = (|| -> Result<(), String> {
        if !reset {
            let attr = QpAttr {
                qp_state: QpState::Reset,
                ..QpAttr::default()
            };
            t.qp.modify(&attr, A::STATE)
                .map_err(|e| format!("to RESET: {e}"))?;
            reset = true;
        }
        let c = RcConnect {
            path_mtu: s.path_mtu,
            qp_access_flags: s.qp_access,
            timeout,
            retry_cnt,
            rnr_retry,
            min_rnr_timer: s.min_rnr_timer,
            max_rd_atomic: 1,
            max_dest_rd_atomic: s.max_dest_rd_atomic,
            traffic_class,
            hop_limit,
            ..RcConnect::new(dest_qpn, dgid, dest_psn, s.sq_psn)
        };
        t.qp.connect_rc(&c).map_err(|e| e.to_string())
    })();
    if reset {
        // RESET dropped every posted receive: every slot is free again.
        book.posted.clear();
        book.free = (0..s.recv_depth).rev().collect();
    }
    *reported = t.qp.state();
    drop(book);
    drop(reported);
    if let Err(e) = result {
        return Err(a.err(format!("{e} (QP now {})", t.qp.state().name())));
    }
    let posted = if s.no_recv {
        Vec::new()
    } else {
        post_recvs(t, s.recv_depth, s.recv_size, true).map_err(|e| a.err(e))?
    };
    Ok(json!({"connect": {
        "ok": true,
        "state": t.qp.state().name(),
        "qpn": t.qp.qp_num(),
        "dest_qpn": dest_qpn,
        "dest_gid": dgid.to_string(),
        "rq_psn": dest_psn,
        "sq_psn": s.sq_psn,
        "timeout": timeout,
        "retry_cnt": retry_cnt,
        "rnr_retry": rnr_retry,
        "traffic_class": traffic_class,
        "hop_limit": hop_limit,
        "recv_posted": posted.len(),
    }}))
}

/// `post_recv`: `count` receives (default 1) of `length` bytes (default `--recv-size`).
/// Under `--no-recv` they are not re-posted when they complete.
fn cmd_post_recv(t: &Target, a: &CmdArgs<'_>) -> Result<Value, CmdError> {
    a.only(&["count", "length"])?;
    let count = a.uint("count", u64::from(MAX_RECV_DEPTH))?.unwrap_or(1) as u32;
    let length = a
        .uint("length", u64::from(t.set.recv_size))?
        .map_or(t.set.recv_size, |l| l as u32);
    if t.qp.state() == QpState::Reset {
        return Err(a.err("the QP is in RESET: connect first"));
    }
    let ids = post_recvs(t, count, length, !t.set.no_recv).map_err(|e| a.err(e))?;
    let outstanding = t.recv.lock().posted.len();
    Ok(json!({"post_recv": {
        "posted": ids.len(),
        "wr_ids": ids,
        "length": length,
        "outstanding": outstanding,
    }}))
}

/// `post_send`: one signaled SEND, RDMA WRITE or RDMA READ from (READ: into) bytes
/// `offset..offset + length` of MR `index`; WRITE and READ go to `remote_addr` / `rkey`. The
/// WR's completion comes as a `wc` line like any other.
fn cmd_post_send(t: &Target, a: &CmdArgs<'_>) -> Result<Value, CmdError> {
    a.only(&[
        "opcode",
        "index",
        "offset",
        "length",
        "remote_addr",
        "rkey",
        "imm_data",
        "wr_id",
    ])?;
    let op_text = a.string("opcode")?.ok_or_else(|| {
        a.err("missing field \"opcode\" (send, send_imm, write, write_imm or read)")
    })?;
    let opcode = match op_text {
        "send" => WrOpcode::Send,
        "send_imm" => WrOpcode::SendWithImm,
        "write" => WrOpcode::RdmaWrite,
        "write_imm" => WrOpcode::RdmaWriteWithImm,
        "read" => WrOpcode::RdmaRead,
        other => {
            return Err(a.err(format!(
                "opcode {other:?}: use send, send_imm, write, write_imm or read"
            )));
        }
    };
    let with_imm = matches!(opcode, WrOpcode::SendWithImm | WrOpcode::RdmaWriteWithImm);
    if !with_imm && a.map.contains_key("imm_data") {
        return Err(a.err("only send_imm and write_imm take imm_data"));
    }
    let imm_data = a.uint("imm_data", u64::from(u32::MAX))?.unwrap_or(0) as u32;
    let (mr, index) = if a.map.contains_key("index") {
        mr_arg(t, a)?
    } else {
        let mr = t
            .mrs
            .first()
            .ok_or_else(|| a.err("there is no MR 0: give index"))?;
        (mr, Value::from(0))
    };
    let (offset, length) = range_arg(a, mr, None)?;
    let length32 = u32::try_from(length)
        .map_err(|_| a.err(format!("length {length} does not fit in 32 bits")))?;
    let remote = !matches!(opcode, WrOpcode::Send | WrOpcode::SendWithImm);
    let (remote_addr, rkey) = if remote {
        (
            a.need_uint("remote_addr", u64::MAX)?,
            a.need_uint("rkey", u64::from(u32::MAX))? as u32,
        )
    } else {
        if a.map.contains_key("remote_addr") || a.map.contains_key("rkey") {
            return Err(a.err("a send takes no remote_addr or rkey"));
        }
        (0, 0)
    };
    let wr_id = a.uint("wr_id", u64::MAX)?.unwrap_or(1);
    let mut wr = SendWr::new(wr_id, opcode, vec![mr.sge(offset as usize, length32)]);
    wr.remote_addr = remote_addr;
    wr.rkey = rkey;
    wr.imm_data = imm_data;
    t.qp.post_send(&[wr]).map_err(|e| a.err(e.to_string()))?;
    Ok(json!({"post_send": {
        "wr_id": wr_id,
        "opcode": op_text,
        "index": index,
        "offset": offset,
        "length": length,
        "remote_addr": remote_addr,
        "rkey": rkey,
        "imm_data": imm_data,
    }}))
}

/// The MR named by `index` (a number, or `"recv"` for the receive MR).
fn mr_arg<'t>(t: &'t Target, a: &CmdArgs<'_>) -> Result<(&'t Mr, Value), CmdError> {
    match a.map.get("index") {
        None => Err(a.err("missing field \"index\"")),
        Some(Value::String(s)) if s == "recv" => Ok((&t.recv_mr, Value::from("recv"))),
        Some(_) => {
            let i = a.need_uint("index", u64::MAX)?;
            let mr = usize::try_from(i)
                .ok()
                .and_then(|i| t.mrs.get(i))
                .ok_or_else(|| {
                    a.err(format!(
                        "no MR {i}: there are {} MRs, from index 0, and \"recv\"",
                        t.mrs.len()
                    ))
                })?;
            Ok((mr, Value::from(i)))
        }
    }
}

/// `offset` (default 0) and `length` (default: to the end) within `mr`.
fn range_arg(a: &CmdArgs<'_>, mr: &Mr, default_len: Option<u64>) -> Result<(u64, u64), CmdError> {
    let size = mr.len() as u64;
    let offset = a.uint("offset", u64::MAX)?.unwrap_or(0);
    if offset > size {
        return Err(a.err(format!("offset {offset} is past the MR's {size} bytes")));
    }
    let length = match a.uint("length", u64::MAX)? {
        Some(l) => l,
        None => default_len.unwrap_or(size - offset),
    };
    if length > size - offset {
        return Err(a.err(format!(
            "offset {offset} + length {length} is past the MR's {size} bytes"
        )));
    }
    Ok((offset, length))
}

/// `dump_mr`: bytes of an MR as hex.
fn cmd_dump_mr(t: &Target, a: &CmdArgs<'_>) -> Result<Value, CmdError> {
    a.only(&["index", "offset", "length"])?;
    let (mr, index) = mr_arg(t, a)?;
    let (offset, length) = range_arg(a, mr, None)?;
    if length > MAX_DUMP_BYTES {
        return Err(a.err(format!(
            "length {length}: at most {MAX_DUMP_BYTES} bytes per dump_mr"
        )));
    }
    let mut data = vec![0u8; length as usize];
    mr.read(offset as usize, &mut data)
        .map_err(|e| a.err(e.to_string()))?;
    Ok(json!({"dump_mr": {
        "index": index,
        "va": mr.addr() + offset,
        "offset": offset,
        "length": length,
        "hex": hex(&data),
    }}))
}

/// `write_mr`: bytes into an MR, given as `hex` or as `fill` (a byte) repeated `length` times.
fn cmd_write_mr(t: &Target, a: &CmdArgs<'_>) -> Result<Value, CmdError> {
    a.only(&["index", "offset", "hex", "fill", "length"])?;
    let (mr, index) = mr_arg(t, a)?;
    let data = match (a.string("hex")?, a.uint("fill", 0xff)?) {
        (Some(h), None) => {
            if a.map.contains_key("length") {
                return Err(a.err("give length with fill, not with hex"));
            }
            unhex(h).ok_or_else(|| a.err("hex: not an even number of hex digits"))?
        }
        (None, Some(byte)) => {
            let (_, length) = range_arg(a, mr, None)?;
            vec![byte as u8; length as usize]
        }
        _ => return Err(a.err("give exactly one of hex or fill")),
    };
    let offset = a.uint("offset", u64::MAX)?.unwrap_or(0);
    let fits = offset
        .checked_add(data.len() as u64)
        .is_some_and(|end| end <= mr.len() as u64);
    if !fits {
        return Err(a.err(format!(
            "offset {offset} + {} bytes is past the MR's {} bytes",
            data.len(),
            mr.len()
        )));
    }
    mr.write(offset as usize, &data)
        .map_err(|e| a.err(e.to_string()))?;
    Ok(json!({"write_mr": {
        "index": index,
        "offset": offset,
        "length": data.len(),
    }}))
}

/// `counters`: the device's counters (rxe hw_counters names, then one per drop reason,
/// e.g. `icrc_errors`), CNPs ignored, and datagrams through the UDP socket.
fn cmd_counters(t: &Target) -> Value {
    let mut m = Map::new();
    for (name, v) in t.dev.counters().entries() {
        m.insert(name.into(), v.into());
    }
    m.insert("rp_cnp_ignored".into(), t.dev.rp_cnp_ignored().into());
    let link = t.dev.link();
    m.insert(
        "rx_datagrams".into(),
        link.rx_datagrams.load(Ordering::Relaxed).into(),
    );
    m.insert(
        "tx_datagrams".into(),
        link.tx_datagrams.load(Ordering::Relaxed).into(),
    );
    json!({ "counters": m })
}

/// `query_qp`: the QP's state and numbers.
fn cmd_query_qp(t: &Target) -> Value {
    let book = t.recv.lock();
    json!({"query_qp": {
        "qpn": t.qp.qp_num(),
        "state": t.qp.state().name(),
        "sq_psn": t.set.sq_psn,
        "recv_outstanding": book.posted.len(),
        "recv_free_slots": book.free.len(),
    }})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn access_lists_parse() {
        assert_eq!(
            parse_access("local_write, REMOTE_WRITE,ibv_access_remote_read").map(|f| f.0),
            Ok(7)
        );
        assert_eq!(parse_access("none").map(|f| f.0), Ok(0));
        assert!(parse_access("remote_wirte").is_err());
    }

    #[test]
    fn numbers_parse_as_decimal_or_hex() {
        assert_eq!(parse_u64_text("0x10"), Some(16));
        assert_eq!(parse_u64_text("17"), Some(17));
        assert_eq!(parse_u64_text("x"), None);
        assert_eq!(
            parse_psn("0x1000000"),
            Err("0x1000000 does not fit in 24 bits".into())
        );
    }

    #[test]
    fn hex_round_trips() {
        assert_eq!(hex(&[0, 0xab, 0x10]), "00ab10");
        assert_eq!(unhex("00ab10"), Some(vec![0, 0xab, 0x10]));
        assert_eq!(unhex("0a b"), None);
        assert_eq!(unhex("zz"), None);
    }
}
