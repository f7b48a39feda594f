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
mod options;
mod setup;
mod state;
mod text;

pub use options::TargetArgs;

use crate::BoxError;
use completions::poll_loop;
use input::command_loop;
use serde_json::json;
use setup::{ready_json, setup};
use state::emit;
use std::sync::Arc;
use std::sync::atomic::Ordering;

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
