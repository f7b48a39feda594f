//! Requester: turns send WQEs into request packets — path-MTU segmentation, PSN assignment,
//! AckReq, the unacknowledged window, READ/atomic limits and fences — and rewinds for
//! go-back-N retransmission.
//!
//! Source: IBTA Vol 1 ch. 9 (requester behaviour); rxe `rxe_req.c` (`init_req_packet`,
//! `update_wqe_psn`, `req_retry`, `rxe_requester`).

use super::local_ops::wqe_payload;
use super::{
    MAX_PKT_PER_ACK, MAX_UNACKED_PSNS, Path, QpEngine, QpState, QpType, SendFlags, Timer, Transmit,
    WcStatus, WrOpcode, ack_timeout, psns_for,
};
use crate::transport::{Instant, MemoryTable};
use crate::wire::{
    AtomicEthRepr, BthRepr, DethRepr, IethRepr, ImmDtRepr, Opcode, PacketRepr, Psn, RethRepr,
};

/// Requester cursor: which WQE and byte offset the next packet comes from, and its PSN.
#[derive(Debug, Clone, Default)]
pub(super) struct ReqState {
    /// PSN of the next request packet.
    pub psn: Psn,
    /// Index in the send queue of the WQE being sent.
    pub wqe: usize,
    /// Bytes of that WQE already sent.
    pub offset: u64,
    /// Packets sent since the last one with AckReq.
    pub noack_pkts: u32,
    /// One past the highest PSN sent so far: a request packet below it is a retransmission.
    pub high_psn: Psn,
}

impl QpEngine {
    /// Builds the next request packet, if the window, the READ/atomic limit and fences allow.
    pub(super) fn requester_transmit(
        &mut self,
        now: Instant,
        path: &Path,
        mem: &MemoryTable,
    ) -> Option<Transmit> {
        // SQD: WRs stay queued and none is started; one already under way is finished (and
        // retransmitted) so the send queue can drain (rxe `req_next_wqe` in the drain state).
        let sqd = self.state == QpState::Sqd;
        if !(self.state == QpState::Rts || sqd) || self.timers.is_armed(Timer::Rnr) {
            return None;
        }
        if self.qp_type.is_datagram() {
            return if sqd {
                None
            } else {
                self.ud_transmit(path, mem)
            };
        }
        self.skip_done_local_ops();
        let idx = self.req.wqe;
        let pmtu = self.pmtu();
        let max_rd = usize::from(self.attrs.max_rd_atomic.max(1));
        let wqe = self.sq.get(idx)?;
        if wqe.wr.opcode.is_local() {
            // Sends nothing: `run_local_ops` executes it.
            return None;
        }
        if sqd && !wqe.assigned {
            return None;
        }
        let uc = self.qp_type == QpType::Uc;
        // rxe: at most RXE_MAX_UNACKED_PSNS outstanding PSNs (RC; UC is never acknowledged).
        if !uc && self.req.psn.diff(self.comp.psn) >= MAX_UNACKED_PSNS as i32 {
            return None;
        }
        let rd_atomic = wqe.wr.opcode.is_rd_atomic();
        let fence = wqe.wr.send_flags.contains(SendFlags::FENCE);
        if self.req.offset == 0 && (rd_atomic || fence) {
            // Counted only for the WQEs it limits (a scan of the queue per packet would make
            // a deep queue of WRITEs quadratic).
            let outstanding = self
                .sq
                .iter()
                .take(idx)
                .filter(|w| w.wr.opcode.is_rd_atomic())
                .count();
            if rd_atomic && outstanding >= max_rd {
                return None;
            }
            // IBV_SEND_FENCE: wait until earlier READ/atomics have completed.
            if fence && outstanding > 0 {
                return None;
            }
        }
        if !wqe.assigned {
            let npsn = if wqe.wr.opcode.is_atomic() {
                1
            } else {
                psns_for(wqe.length, pmtu)
            };
            let psn = self.req.psn;
            let w = self.sq.get_mut(idx)?;
            w.first_psn = psn;
            w.npsn = npsn;
            w.assigned = true;
        }
        let wqe = self.sq.get(idx)?;
        let wr = &wqe.wr;
        let mut bth = BthRepr::new(Opcode::RC_SEND_ONLY, self.attrs.dest_qp_num, self.req.psn);
        let mut advance_psns = 1;
        let mut done_wqe = true;
        let mut payload_off = 0u64;
        let mut repr;
        match wr.opcode {
            WrOpcode::Send
            | WrOpcode::SendWithImm
            | WrOpcode::SendWithInv
            | WrOpcode::RdmaWrite
            | WrOpcode::RdmaWriteWithImm => {
                let off = self.req.offset;
                let pay = (wqe.length - off).min(pmtu);
                let first = off == 0;
                let last = off + pay == wqe.length;
                let send = matches!(
                    wr.opcode,
                    WrOpcode::Send | WrOpcode::SendWithImm | WrOpcode::SendWithInv
                );
                let inv = wr.opcode == WrOpcode::SendWithInv;
                let imm = matches!(
                    wr.opcode,
                    WrOpcode::SendWithImm | WrOpcode::RdmaWriteWithImm
                );
                bth.opcode = match (send, first, last, imm) {
                    (true, true, true, false) => Opcode::RC_SEND_ONLY,
                    (true, true, true, true) => Opcode::RC_SEND_ONLY_WITH_IMMEDIATE,
                    (true, true, false, _) => Opcode::RC_SEND_FIRST,
                    (true, false, false, _) => Opcode::RC_SEND_MIDDLE,
                    (true, false, true, false) => Opcode::RC_SEND_LAST,
                    (true, false, true, true) => Opcode::RC_SEND_LAST_WITH_IMMEDIATE,
                    (false, true, true, false) => Opcode::RC_RDMA_WRITE_ONLY,
                    (false, true, true, true) => Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE,
                    (false, true, false, _) => Opcode::RC_RDMA_WRITE_FIRST,
                    (false, false, false, _) => Opcode::RC_RDMA_WRITE_MIDDLE,
                    (false, false, true, false) => Opcode::RC_RDMA_WRITE_LAST,
                    (false, false, true, true) => Opcode::RC_RDMA_WRITE_LAST_WITH_IMMEDIATE,
                };
                if inv && last {
                    bth.opcode = if first {
                        Opcode::RC_SEND_ONLY_WITH_INVALIDATE
                    } else {
                        Opcode::RC_SEND_LAST_WITH_INVALIDATE
                    };
                }
                if uc {
                    // UC opcodes are the RC ones with transport bits 0b001.
                    bth.opcode = Opcode(bth.opcode.0 | 0x20);
                }
                // rxe: AckReq on the last packet and on one in MAX_PKT_PER_ACK of a long
                // message; its responder ACKs nothing else. UC asks for no ACK.
                bth.ack_req = !uc && (last || self.req.noack_pkts >= MAX_PKT_PER_ACK);
                bth.se = last && wr.send_flags.contains(SendFlags::SOLICITED) && (send || imm);
                repr = PacketRepr::new(bth);
                if !send && first {
                    repr.reth = Some(RethRepr {
                        va: wr.remote_addr,
                        rkey: wr.rkey,
                        dma_len: wqe.length as u32,
                    });
                }
                if imm && last {
                    repr.immdt = Some(ImmDtRepr {
                        imm_data: wr.imm_data,
                    });
                }
                // The IETH goes in the last packet of a SEND with Invalidate (rxe
                // `init_req_packet`).
                if inv && last {
                    repr.ieth = Some(IethRepr {
                        rkey: wr.invalidate_rkey,
                    });
                }
                repr.payload_len = pay as usize;
                payload_off = off;
                done_wqe = last;
            }
            WrOpcode::RdmaRead => {
                let off = self.req.offset;
                let remaining = wqe.length - off;
                bth.opcode = Opcode::RC_RDMA_READ_REQUEST;
                bth.ack_req = true;
                repr = PacketRepr::new(bth);
                repr.reth = Some(RethRepr {
                    va: wr.remote_addr.wrapping_add(off),
                    rkey: wr.rkey,
                    dma_len: remaining as u32,
                });
                advance_psns = psns_for(remaining, pmtu);
            }
            WrOpcode::AtomicCmpAndSwp | WrOpcode::AtomicFetchAndAdd => {
                let cas = wr.opcode == WrOpcode::AtomicCmpAndSwp;
                bth.opcode = if cas {
                    Opcode::RC_COMPARE_SWAP
                } else {
                    Opcode::RC_FETCH_ADD
                };
                bth.ack_req = true;
                repr = PacketRepr::new(bth);
                repr.atomic_eth = Some(AtomicEthRepr {
                    va: wr.remote_addr,
                    rkey: wr.rkey,
                    swap_add: if cas { wr.swap } else { wr.compare_add },
                    compare: if cas { wr.compare_add } else { 0 },
                });
            }
            WrOpcode::LocalInv | WrOpcode::BindMw | WrOpcode::RegMr => return None,
        }
        let h = repr.header_len();
        let pay = repr.payload_len;
        // With a gathering link, a payload that lies in one SGE stays in the MR: only the
        // headers are built here and the ICRC is computed over the MR bytes in place. An SGE
        // that fails its checks takes the copying path below, which reports it.
        let in_mr = if self.gather && pay > 0 && wqe.inline_data.is_none() {
            mem.payload_bytes(&wr.sg_list, self.pd, payload_off, pay)
                .ok()
                .flatten()
        } else {
            None
        };
        let t = if let Some(data) = in_mr {
            super::gathered(&repr, data, path)
        } else {
            let mut buf = super::bufpool::take(repr.buffer_len());
            repr.emit_headers(&mut buf);
            if pay > 0
                && let Err(_e) = wqe_payload(wqe, mem, self.pd, payload_off, &mut buf[h..h + pay])
            {
                // A local SGE that fails its key/range check: IBV_WC_LOC_PROT_ERR, QP to ERR.
                super::bufpool::give(buf);
                if let Some(w) = self.sq.remove(idx) {
                    self.complete_send(&w, WcStatus::LocProtErr, 0);
                }
                self.enter_error();
                return None;
            }
            repr.finish(&mut buf, &path.icrc_ip());
            Transmit::new(path.remote, path.src_port, buf)
        };
        // Advance the cursor.
        if repr.bth.opcode == Opcode::RC_RDMA_READ_REQUEST
            && let Some(w) = self.sq.get_mut(idx)
        {
            w.read_req_psn = repr.bth.psn;
        }
        if self.req.psn.diff(self.req.high_psn) < 0 {
            self.counters.retransmitted_pkts += 1;
        }
        self.req.psn = self.req.psn.add(advance_psns);
        if self.req.psn.diff(self.req.high_psn) > 0 {
            self.req.high_psn = self.req.psn;
        }
        if repr.bth.ack_req {
            self.req.noack_pkts = 0;
        } else {
            self.req.noack_pkts += 1;
        }
        if done_wqe {
            self.req.wqe += 1;
            self.req.offset = 0;
        } else {
            self.req.offset += pay as u64;
        }
        if uc {
            // UC: a WQE is complete once its last packet is sent (rxe `rxe_requester`).
            if done_wqe {
                self.req.wqe = self.req.wqe.saturating_sub(1);
                if let Some(w) = self.sq.remove(idx) {
                    self.complete_send(&w, WcStatus::Success, 0);
                }
            }
            self.comp.psn = self.req.psn;
        } else if !self.timers.is_armed(Timer::Retransmit)
            && let Some(d) = ack_timeout(self.attrs.timeout)
        {
            self.timers.set(Timer::Retransmit, now + d);
        }
        Some(t)
    }

    /// UD: one SEND ONLY (+IMM) per WQE to the WR's address handle, with a DETH; complete
    /// once sent. A message longer than the path MTU is not sent and completes successfully
    /// (IBTA C10-93.1.1; rxe `rxe_requester`). Source: IBTA Vol 1 ch. 9 (UD); FACTS §2.12.
    fn ud_transmit(&mut self, path: &Path, mem: &MemoryTable) -> Option<Transmit> {
        let pmtu = self.pmtu();
        loop {
            let w = self.sq.front()?;
            let Some(dest) = w.wr.ud else {
                // post_send refuses a UD WR without a destination; drop it defensively.
                let w = self.sq.pop_front()?;
                self.complete_send(&w, WcStatus::LocQpOpErr, 0);
                continue;
            };
            if w.length > pmtu {
                let w = self.sq.pop_front()?;
                self.complete_send(&w, WcStatus::Success, 0);
                continue;
            }
            let imm = w.wr.opcode == WrOpcode::SendWithImm;
            let opcode = if imm {
                Opcode::UD_SEND_ONLY_WITH_IMMEDIATE
            } else {
                Opcode::UD_SEND_ONLY
            };
            let bth = BthRepr {
                se: w.wr.send_flags.contains(SendFlags::SOLICITED),
                // rxe sets AckReq on GSI (QP1) packets only (FACTS §2.12).
                ack_req: self.qpn == 1,
                ..BthRepr::new(opcode, dest.remote_qpn, self.req.psn)
            };
            let mut repr = PacketRepr::new(bth);
            // A WR Q_Key with bit 31 set means "use the QP's own Q_Key"; QP1 always sends
            // GSI_QKEY (rxe `init_req_packet`).
            let qkey = if self.qp_type == QpType::Gsi {
                super::GSI_QKEY
            } else if dest.remote_qkey & 0x8000_0000 != 0 {
                self.attrs.qkey
            } else {
                dest.remote_qkey
            };
            repr.deth = Some(DethRepr {
                qkey,
                src_qpn: self.qpn,
            });
            if imm {
                repr.immdt = Some(ImmDtRepr {
                    imm_data: w.wr.imm_data,
                });
            }
            repr.payload_len = w.length as usize;
            let mut buf = super::bufpool::take(repr.buffer_len());
            repr.emit_headers(&mut buf);
            let h = repr.header_len();
            let n = repr.payload_len;
            if n > 0 && wqe_payload(w, mem, self.pd, 0, &mut buf[h..h + n]).is_err() {
                let w = self.sq.pop_front()?;
                self.complete_send(&w, WcStatus::LocProtErr, 0);
                self.enter_error();
                return None;
            }
            let to = Path {
                local: path.local,
                remote: dest.remote_ip,
                src_port: path.src_port,
            };
            repr.finish(&mut buf, &to.icrc_ip());
            self.req.psn = self.req.psn.add(1);
            let w = self.sq.pop_front()?;
            self.complete_send(&w, WcStatus::Success, 0);
            return Some(Transmit::new(dest.remote_ip, path.src_port, buf));
        }
    }

    /// Go-back-N: the next packet sent will be the one at `psn`, from the WQE that holds it.
    /// A READ restarts at that response PSN with its address advanced and length reduced by
    /// the bytes already received (rxe `req_retry`). A PSN no WQE holds changes nothing.
    pub(super) fn rewind_to(&mut self, psn: Psn) {
        let pmtu = self.pmtu();
        for (i, w) in self.sq.iter().enumerate() {
            if !w.assigned {
                break;
            }
            let d = psn.diff(w.first_psn);
            if d >= 0 && (d as u32) < w.npsn {
                self.req.wqe = i;
                self.req.offset = if w.wr.opcode.is_atomic() {
                    0
                } else {
                    d as u64 * pmtu
                };
                self.req.psn = psn;
                self.req.noack_pkts = 0;
                return;
            }
        }
    }
}
