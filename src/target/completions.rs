//! Completions and events: the completion thread's `wc` and `event` lines, and the receive
//! slots it re-posts (which `connect` and `post_recv` post too).

use super::state::{POLL_PERIOD, Posted, RecvBook, Target, emit};
use super::text::hex;
use serde_json::{Value, json};
use softroce::verbs::{QpState, RecvWr, Wc, WcFlags, WcOpcode, WcStatus};
use std::sync::atomic::Ordering;

/// The completion thread: reports every work completion, re-posts receives, and reports QP
/// state changes (e.g. to ERR after a NAK) that no command made. Ends once `stop` is set and
/// the CQ is empty.
pub(super) fn poll_loop(t: &Target) {
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
pub(super) fn post_recvs(
    t: &Target,
    count: u32,
    length: u32,
    repost: bool,
) -> Result<Vec<u64>, String> {
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
