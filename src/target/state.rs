//! What the command loop and the completion thread share: the target (QP, MRs, CQ, device,
//! receive slots, the state last reported), the settings fixed at start-up, the limits, and
//! the one writer of output lines. It imports none of the other files of `target`.

use parking_lot::Mutex;
use serde_json::Value;
use softroce::net::UdpDevice;
use softroce::verbs::{AccessFlags, Cq, Mr, PathMtu, Pd, Qp, QpState};
use std::collections::HashMap;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Most MRs `--mr-size` / `--mr-count` may ask for.
pub(super) const MAX_MRS: usize = 1024;
/// Most bytes all MRs together may hold (1 GiB).
pub(super) const MAX_TOTAL_MR_BYTES: u64 = 1 << 30;
/// Most receive slots.
pub(super) const MAX_RECV_DEPTH: u32 = 4096;
/// Send queue depth (`post_send` WRs outstanding at once).
pub(super) const MAX_SEND_WR: u32 = 16;
/// Most bytes one `dump_mr` returns (the hex line is twice as long).
pub(super) const MAX_DUMP_BYTES: u64 = 16 << 20;
/// Longest command line accepted, in bytes.
pub(super) const MAX_LINE_BYTES: u64 = 64 << 20;
/// How long the completion thread waits on the CQ before it looks at the QP state again.
pub(super) const POLL_PERIOD: Duration = Duration::from_millis(20);

/// Settings fixed at start-up.
#[derive(Debug, Clone, Copy)]
pub(super) struct Settings {
    pub(super) path_mtu: PathMtu,
    pub(super) mr_access: AccessFlags,
    pub(super) qp_access: AccessFlags,
    pub(super) min_rnr_timer: u8,
    pub(super) max_dest_rd_atomic: u8,
    pub(super) sq_psn: u32,
    pub(super) no_recv: bool,
    pub(super) recv_depth: u32,
    pub(super) recv_size: u32,
}

/// One receive WR the target posted.
#[derive(Debug, Clone, Copy)]
pub(super) struct Posted {
    pub(super) slot: u32,
    pub(super) length: u32,
    /// Post it again when it completes successfully.
    pub(super) repost: bool,
}

/// Which receive slots are in use, by `wr_id`.
#[derive(Debug, Default)]
pub(super) struct RecvBook {
    pub(super) free: Vec<u32>,
    pub(super) posted: HashMap<u64, Posted>,
    pub(super) next_wr_id: u64,
}

/// Everything the command loop and the completion thread share. Fields drop in order: the
/// QP and MRs before the CQ, PD and device.
pub(super) struct Target {
    pub(super) qp: Qp,
    pub(super) mrs: Vec<Mr>,
    pub(super) recv_mr: Mr,
    pub(super) cq: Cq,
    pub(super) _pd: Pd,
    pub(super) dev: UdpDevice,
    pub(super) set: Settings,
    pub(super) recv: Mutex<RecvBook>,
    /// The QP state last reported; held while a command changes the state, so that the
    /// completion thread reports only changes the target did not make itself.
    pub(super) reported: Mutex<QpState>,
    pub(super) stop: AtomicBool,
    /// Set when stdout is gone: nothing more can be reported.
    pub(super) out_broken: AtomicBool,
}

/// Writes one JSON line to stdout (whole, under the stdout lock) and flushes it.
pub(super) fn emit(t: &Target, v: &Value) {
    let mut o = std::io::stdout().lock();
    if writeln!(o, "{v}").and_then(|()| o.flush()).is_err() {
        t.out_broken.store(true, Ordering::SeqCst);
    }
}
