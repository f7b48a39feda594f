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

mod args;
mod commands;
mod completions;
mod input;
mod setup;
mod text;

use crate::BoxError;
use clap::Args;
use completions::poll_loop;
use input::command_loop;
use parking_lot::Mutex;
use serde_json::{Value, json};
use setup::{ready_json, setup};
use softroce::net::UdpDevice;
use softroce::verbs::{AccessFlags, Cq, Mr, PathMtu, Pd, Qp, QpState};
use std::collections::HashMap;
use std::io::Write;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use text::parse_psn;

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
