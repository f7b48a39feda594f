//! Local operations on the send queue (REG_MR, LOCAL_INV, BIND_MW), IBV_SEND_INLINE, and the
//! post-time checks of SEND_WITH_INV.
//!
//! Local operations send nothing. The requester stops at one; [`QpEngine::run_local_ops`]
//! executes it against the memory table when its turn comes, and it completes in send-queue
//! order once every WQE before it has completed. LOCAL_INV waits until all earlier WQEs have
//! completed (the local invalidate fence); any local operation with IBV_SEND_FENCE waits for
//! earlier READ/atomics, as other WRs do. A failed local operation completes with
//! `IBV_WC_MW_BIND_ERR` (BIND_MW) or `IBV_WC_LOC_QP_OP_ERR` (REG_MR, LOCAL_INV) and moves the
//! QP to ERR.
//!
//! Inline data is copied from memory at post time ([`QpEngine::post_send_mem`]), so the
//! caller may reuse its buffer at once and no lkey is checked.
//!
//! Source: IBTA Vol 1 ch. 10 (local invalidate fence, memory windows, fast registration);
//! rxe `rxe_req.c` (`rxe_wqe_is_fenced`, `rxe_do_local_ops`), `rxe_verbs.c`
//! (`validate_send_wr`: inline length against `max_inline`, `init_send_wqe`: inline copy).

use super::memory::{MemError, MrTable};
use super::{
    CqSel, PostError, QpEngine, QpState, QpType, SendFlags, SendWqe, SendWr, Wc, WcFlags, WcStatus,
    WrOpcode,
};

/// Largest `max_inline_data` a QP may be created with, in bytes (rxe `RXE_MAX_INLINE_DATA`).
pub const MAX_INLINE_DATA: u32 = 512;

impl WrOpcode {
    /// REG_MR, LOCAL_INV and BIND_MW: executed locally, nothing sent.
    pub fn is_local(self) -> bool {
        matches!(
            self,
            WrOpcode::LocalInv | WrOpcode::BindMw | WrOpcode::RegMr
        )
    }
    /// The opcodes whose data IBV_SEND_INLINE applies to (rxe `WR_INLINE_MASK`).
    fn takes_inline(self) -> bool {
        matches!(
            self,
            WrOpcode::Send
                | WrOpcode::SendWithImm
                | WrOpcode::SendWithInv
                | WrOpcode::RdmaWrite
                | WrOpcode::RdmaWriteWithImm
        )
    }
}

impl Wc {
    /// `invalidated_rkey`: the R_Key a SEND_WITH_INVALIDATE invalidated, when `wc_flags` has
    /// WITH_INV (it shares the `imm_data` field, as in `struct ibv_wc`).
    pub fn invalidated_rkey(&self) -> Option<u32> {
        self.wc_flags
            .contains(WcFlags::WITH_INV)
            .then_some(self.imm_data)
    }
}

/// The payload bytes `[off, off + out.len())` of a send WQE: from its inline copy, or gathered
/// from its SGEs (checked for protection domain `pd`).
pub(super) fn wqe_payload(
    wqe: &SendWqe,
    mem: &MrTable,
    pd: u32,
    off: u64,
    out: &mut [u8],
) -> Result<(), MemError> {
    match &wqe.inline_data {
        Some(data) => {
            let start = usize::try_from(off).map_err(|_| MemError::Length)?;
            let src = start
                .checked_add(out.len())
                .and_then(|end| data.get(start..end))
                .ok_or(MemError::Length)?;
            out.copy_from_slice(src);
            Ok(())
        }
        None => mem.gather(&wqe.wr.sg_list, pd, off, out),
    }
}

impl QpEngine {
    /// Queues a send work request as [`QpEngine::post_send`] does, first copying the data of
    /// an IBV_SEND_INLINE WR out of `mem` (whichever MR's buffer holds each SGE's bytes; the
    /// lkey is not checked, as libibverbs reads plain memory). After this returns the caller
    /// may change those bytes.
    ///
    /// Errors: those of [`QpEngine::post_send`]; [`PostError::Invalid`] for inline data
    /// longer than the QP's `max_inline_data` (rxe `validate_send_wr`) or an inline SGE that
    /// is not inside any MR's buffer.
    pub fn post_send_mem(&mut self, wr: SendWr, mem: &MrTable) -> Result<(), PostError> {
        let length: u64 = wr.sg_list.iter().map(|s| u64::from(s.length)).sum();
        let inline = wr.send_flags.contains(SendFlags::INLINE)
            && wr.opcode.takes_inline()
            && length <= u64::from(self.cap.max_inline_data);
        if !inline {
            return self.post_send_inner(wr, None);
        }
        let mut data = vec![0u8; length as usize];
        let mut at = 0;
        for s in wr.sg_list.iter().filter(|s| s.length > 0) {
            let n = s.length as usize;
            mem.host_bytes(s.addr, n)
                .and_then(|b| b.copy_to(data.get_mut(at..at + n)?).ok())
                .ok_or(PostError::Invalid(
                    "inline SGE is not inside any registered buffer",
                ))?;
            at += n;
        }
        self.post_send_inner(wr, Some(data))
    }

    /// Queues an IBV_SEND_INLINE WR whose data the caller has already gathered from its
    /// SGEs (`data`, their bytes in order): a C frontend reads the program's plain memory as
    /// libibverbs' providers do (rxe `copy_inline_data_to_wqe`), registered or not. A WR
    /// that is not inline (no flag, an opcode without data, or data over
    /// `max_inline_data`) is posted as by [`QpEngine::post_send`], `data` unused.
    ///
    /// Errors: those of [`QpEngine::post_send`]; [`PostError::Invalid`] when `data`'s length
    /// is not the SGEs' total length.
    pub fn post_send_gathered(&mut self, wr: SendWr, data: Vec<u8>) -> Result<(), PostError> {
        let length: u64 = wr.sg_list.iter().map(|s| u64::from(s.length)).sum();
        let inline = wr.send_flags.contains(SendFlags::INLINE)
            && wr.opcode.takes_inline()
            && length <= u64::from(self.cap.max_inline_data);
        if !inline {
            return self.post_send_inner(wr, None);
        }
        if data.len() as u64 != length {
            return Err(PostError::Invalid(
                "inline data of another length than the SGEs",
            ));
        }
        self.post_send_inner(wr, Some(data))
    }

    /// The post-time checks of inline data, local operations and SEND_WITH_INV.
    pub(super) fn check_post_extensions(
        &self,
        wr: &SendWr,
        length: u64,
        has_inline: bool,
    ) -> Result<(), PostError> {
        let op = wr.opcode;
        // rxe `rxe_wr_opcode_info`: LOCAL_INV and REG_MR on RC only, BIND_MW on RC and UC;
        // SEND with Invalidate has wire opcodes for RC (and XRC) only.
        let allowed = match op {
            WrOpcode::LocalInv | WrOpcode::RegMr | WrOpcode::SendWithInv => {
                self.qp_type == QpType::Rc
            }
            WrOpcode::BindMw => self.qp_type != QpType::Ud,
            _ => true,
        };
        if !allowed {
            return Err(PostError::NotSupported);
        }
        if op.is_local() && !wr.sg_list.is_empty() {
            return Err(PostError::Invalid("a local operation takes no SGEs"));
        }
        if op == WrOpcode::BindMw && wr.bind_mw.is_none() {
            return Err(PostError::Invalid("BIND_MW without bind_mw"));
        }
        if op == WrOpcode::RegMr && wr.reg_mr.is_none() {
            return Err(PostError::Invalid("REG_MR without reg_mr"));
        }
        if wr.send_flags.contains(SendFlags::INLINE) && op.takes_inline() {
            if length > u64::from(self.cap.max_inline_data) {
                return Err(PostError::Invalid(
                    "inline data longer than max_inline_data",
                ));
            }
            if length > 0 && !has_inline {
                return Err(PostError::Invalid(
                    "IBV_SEND_INLINE data is copied at post time: use post_send_mem",
                ));
            }
        }
        Ok(())
    }

    /// Steps the requester over local operations it already executed (after a go-back-N
    /// rewind they are not executed again, rxe `req_retry`).
    pub(super) fn skip_done_local_ops(&mut self) {
        while self.sq.get(self.req.wqe).is_some_and(|w| w.local_done) {
            self.req.wqe += 1;
        }
    }

    /// Completes, in order, the executed local operations at the head of the send queue.
    pub(super) fn pop_done_local_ops(&mut self) {
        while self.sq.front().is_some_and(|w| w.local_done) {
            if let Some(w) = self.sq.pop_front() {
                self.req.wqe = self.req.wqe.saturating_sub(1);
                self.complete_send(&w, WcStatus::Success);
            }
        }
    }

    /// Executes the local operations (REG_MR, LOCAL_INV, BIND_MW) the requester has reached,
    /// as far as the fences allow. Returns true if any ran, after which the owner should
    /// call [`QpEngine::poll_transmit`] again (the requester may have moved on). The device
    /// calls this whenever `poll_transmit` has nothing left.
    pub fn run_local_ops(&mut self, mem: &mut MrTable) -> bool {
        let mut ran = false;
        while self.state == QpState::Rts {
            self.skip_done_local_ops();
            let idx = self.req.wqe;
            let Some(w) = self.sq.get(idx) else { break };
            let op = w.wr.opcode;
            if !op.is_local() {
                break;
            }
            // IBTA 10.6.5.1 local invalidate fence: LOCAL_INV waits for every earlier WR
            // (rxe `rxe_wqe_is_fenced` makes it mandatory).
            if op == WrOpcode::LocalInv && idx > 0 {
                break;
            }
            // IBV_SEND_FENCE: wait for earlier READ/atomics.
            if w.wr.send_flags.contains(SendFlags::FENCE)
                && self.sq.iter().take(idx).any(|w| w.wr.opcode.is_rd_atomic())
            {
                break;
            }
            let result = match op {
                WrOpcode::LocalInv => mem.invalidate(w.wr.invalidate_rkey, self.pd, None),
                WrOpcode::BindMw => {
                    w.wr.bind_mw
                        .ok_or(MemError::BadKey)
                        .and_then(|b| mem.bind_mw(self.qpn, self.pd, &b))
                }
                _ => {
                    w.wr.reg_mr
                        .ok_or(MemError::BadKey)
                        .and_then(|r| mem.reg_fast(self.pd, &r))
                }
            };
            ran = true;
            if result.is_err() {
                let status = if op == WrOpcode::BindMw {
                    WcStatus::MwBindErr
                } else {
                    WcStatus::LocQpOpErr
                };
                if let Some(w) = self.sq.remove(idx) {
                    self.complete_send(&w, status);
                }
                self.enter_error();
                break;
            }
            let psn = self.req.psn;
            if let Some(w) = self.sq.get_mut(idx) {
                // Done, and holding no PSNs: the completer passes over it in order.
                w.local_done = true;
                w.assigned = true;
                w.first_psn = psn;
                w.npsn = 0;
            }
            self.req.wqe += 1;
            self.pop_done_local_ops();
        }
        ran
    }

    /// Marks the receive completion just queued as having invalidated `rkey`
    /// (`IBV_WC_WITH_INV`, `invalidated_rkey`).
    pub(super) fn note_invalidated(&mut self, rkey: u32) {
        if let Some(c) = self.completions.back_mut()
            && c.cq == CqSel::Recv
        {
            c.wc.wc_flags |= WcFlags::WITH_INV;
            c.wc.imm_data = rkey;
        }
    }
}
