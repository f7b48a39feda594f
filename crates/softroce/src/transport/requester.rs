//! Requester: turns send WQEs into request packets — path-MTU segmentation, PSN assignment,
//! AckReq, the unacknowledged window, READ/atomic limits and fences — and rewinds for
//! go-back-N retransmission.
//!
//! Building one packet follows rxe's steps, one function each: `next_wqe`,
//! `check_init_depth`, `update_wqe_psn`, `next_opcode` (a lookup in the opcode table),
//! `init_req_packet`, `finish_packet`, `update_state`.
//!
//! Source: IBTA Vol 1 ch. 9 (requester behaviour); rxe `rxe_req.c` (`req_next_wqe`,
//! `check_init_depth`, `next_opcode`, `init_req_packet`, `finish_packet`, `update_wqe_psn`,
//! `update_state`, `req_retry`, `rxe_requester`).

use super::local_ops::wqe_payload;
use super::{
    MAX_PKT_PER_ACK, MAX_UNACKED_PSNS, Path, QpEngine, QpState, QpType, SendFlags, SendWqe, Timer,
    Transmit, TxKind, WcStatus, WrOpcode, ack_timeout, psns_for,
};
use crate::transport::{Instant, MemoryTable};
use crate::wire::{
    AtomicEthRepr, BthRepr, DethRepr, ExtHeaders, IethRepr, ImmDtRepr, OpKind, Opcode, PacketRepr,
    Position, Psn, RethRepr, Transport,
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

/// A request packet being built: its headers, and what sending it does to the cursor.
#[derive(Debug)]
struct ReqPacket {
    repr: PacketRepr,
    /// The operation, from the opcode's table row.
    kind: OpKind,
    /// Byte offset in the WQE's message of this packet's payload.
    payload_off: u64,
    /// PSNs this packet uses: 1, or all the responses of a READ request.
    advance_psns: u32,
    /// This is the WQE's last packet.
    done_wqe: bool,
}

impl QpEngine {
    /// Builds the next request packet, if the window, the READ/atomic limit and fences allow.
    /// The steps are rxe's: which WQE ([`QpEngine::next_wqe`]), whether it may start
    /// ([`QpEngine::check_init_depth`]), its PSNs, the opcode from the table
    /// ([`QpEngine::next_opcode`]), the headers ([`QpEngine::init_req_packet`]), payload and
    /// ICRC ([`QpEngine::finish_packet`]), then the cursor ([`QpEngine::update_state`]).
    pub(super) fn requester_transmit(
        &mut self,
        now: Instant,
        path: &Path,
        mem: &MemoryTable,
    ) -> Option<Transmit> {
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
        let idx = self.next_wqe()?;
        // rxe: at most RXE_MAX_UNACKED_PSNS outstanding PSNs (RC; UC is never acknowledged).
        if self.qp_type == QpType::Rc && self.req.psn.diff(self.comp.psn) >= MAX_UNACKED_PSNS as i32
        {
            return None;
        }
        if !self.check_init_depth(idx) {
            return None;
        }
        self.update_wqe_psn(idx);
        let pkt = self.init_req_packet(idx)?;
        let t = self.finish_packet(idx, &pkt, path, mem)?;
        self.update_state(idx, &pkt, now);
        Some(t)
    }

    /// The index of the WQE the next request packet comes from, past executed local
    /// operations; `None` if there is none, if it is a local operation (sends nothing:
    /// `run_local_ops` executes it), or in SQD if it has not started: WRs stay queued and none
    /// is started, while one already under way is finished (and retransmitted) so the send
    /// queue can drain. Source: rxe `req_next_wqe`.
    fn next_wqe(&mut self) -> Option<usize> {
        self.skip_done_local_ops();
        let idx = self.req.wqe;
        let wqe = self.sq.get(idx)?;
        if wqe.wr.opcode.is_local() || (self.state == QpState::Sqd && !wqe.assigned) {
            return None;
        }
        Some(idx)
    }

    /// Whether WQE `idx` may start: a READ/atomic only while fewer than `max_rd_atomic` are
    /// outstanding, and a WR with IBV_SEND_FENCE only once every earlier READ/atomic has
    /// completed. A WQE already under way continues. Source: rxe `check_init_depth` and the
    /// fence check of `rxe_requester`.
    fn check_init_depth(&self, idx: usize) -> bool {
        let Some(wqe) = self.sq.get(idx) else {
            return false;
        };
        let rd_atomic = wqe.wr.opcode.is_rd_atomic();
        let fence = wqe.wr.send_flags.contains(SendFlags::FENCE);
        if self.req.offset != 0 || !(rd_atomic || fence) {
            return true;
        }
        // Counted only for the WQEs it limits (a scan of the queue per packet would make a
        // deep queue of WRITEs quadratic).
        let outstanding = self
            .sq
            .iter()
            .take(idx)
            .filter(|w| w.wr.opcode.is_rd_atomic())
            .count();
        let max_rd = usize::from(self.attrs.max_rd_atomic.max(1));
        let over_depth = rd_atomic && outstanding >= max_rd;
        // IBV_SEND_FENCE: wait until earlier READ/atomics have completed.
        let fenced = fence && outstanding > 0;
        !over_depth && !fenced
    }

    /// Gives WQE `idx` its PSNs when its first packet is built: one for an atomic, one per
    /// path MTU of data (at least one) otherwise. Source: rxe `update_wqe_psn`.
    fn update_wqe_psn(&mut self, idx: usize) {
        let pmtu = self.pmtu();
        let psn = self.req.psn;
        if let Some(w) = self.sq.get_mut(idx)
            && !w.assigned
        {
            w.npsn = if w.wr.opcode.is_atomic() {
                1
            } else {
                psns_for(w.length, pmtu)
            };
            w.first_psn = psn;
            w.assigned = true;
        }
    }

    /// The opcode of the next packet of `wqe`, `offset` bytes into it with `payload_bytes`
    /// of data, chosen from the opcode table by transport, operation, place in the message
    /// and the immediate/invalidate variant, which only the last packet carries. `None` for
    /// a local operation. Source: rxe `next_opcode`.
    fn next_opcode(&self, wqe: &SendWqe, offset: u64, payload_bytes: u64) -> Option<Opcode> {
        let kind = match wqe.wr.opcode {
            WrOpcode::Send | WrOpcode::SendWithImm | WrOpcode::SendWithInv => OpKind::Send,
            WrOpcode::RdmaWrite | WrOpcode::RdmaWriteWithImm => OpKind::RdmaWrite,
            WrOpcode::RdmaRead => OpKind::RdmaRead,
            WrOpcode::AtomicCmpAndSwp => OpKind::CompareSwap,
            WrOpcode::AtomicFetchAndAdd => OpKind::FetchAdd,
            WrOpcode::LocalInv | WrOpcode::BindMw | WrOpcode::RegMr => return None,
        };
        let transport = if self.qp_type == QpType::Uc {
            Transport::Uc
        } else {
            Transport::Rc
        };
        // A READ re-issued from the middle is still one READ request: ONLY, like atomics.
        let (first, last) = if matches!(kind, OpKind::Send | OpKind::RdmaWrite) {
            (offset == 0, offset + payload_bytes == wqe.length)
        } else {
            (true, true)
        };
        let position = match (first, last) {
            (true, true) => Position::Only,
            (true, false) => Position::First,
            (false, false) => Position::Middle,
            (false, true) => Position::Last,
        };
        let imm = matches!(
            wqe.wr.opcode,
            WrOpcode::SendWithImm | WrOpcode::RdmaWriteWithImm
        );
        let inv = wqe.wr.opcode == WrOpcode::SendWithInv;
        Opcode::lookup(transport, kind, position, imm && last, inv && last)
    }

    /// Builds the headers of the next packet of WQE `idx`: the BTH (AckReq on the last
    /// packet of a message and on one in [`MAX_PKT_PER_ACK`] of a long one, never on UC; SE
    /// on the last packet of a solicited SEND or WRITE with immediate), then each extension
    /// header the opcode's table row lists. Source: rxe `init_req_packet`.
    fn init_req_packet(&self, idx: usize) -> Option<ReqPacket> {
        let wqe = self.sq.get(idx)?;
        let wr = &wqe.wr;
        let offset = self.req.offset;
        let remaining = wqe.length - offset;
        // READ and atomic requests carry no data (a READ's comes back in its responses).
        let payload_bytes = if wr.opcode.is_rd_atomic() {
            0
        } else {
            remaining.min(self.pmtu())
        };
        let row = self.next_opcode(wqe, offset, payload_bytes)?.info()?;
        let ends = row.position.ends_message();
        let uc = self.qp_type == QpType::Uc;
        let bth = BthRepr {
            ack_req: !uc && (ends || self.req.noack_pkts >= MAX_PKT_PER_ACK),
            se: ends
                && wr.send_flags.contains(SendFlags::SOLICITED)
                && (row.kind == OpKind::Send || row.headers.contains(ExtHeaders::IMMDT)),
            ..BthRepr::new(row.opcode, self.attrs.dest_qp_num, self.req.psn)
        };
        let mut repr = PacketRepr::new(bth);
        if row.headers.contains(ExtHeaders::RETH) {
            // WRITE FIRST/ONLY: the whole message; a READ (re)issued `offset` bytes in: the
            // rest of it (rxe `req_retry`).
            repr.reth = Some(RethRepr {
                va: wr.remote_addr.wrapping_add(offset),
                rkey: wr.rkey,
                dma_len: remaining as u32,
            });
        }
        if row.headers.contains(ExtHeaders::ATOMIC_ETH) {
            let cas = row.kind == OpKind::CompareSwap;
            repr.atomic_eth = Some(AtomicEthRepr {
                va: wr.remote_addr,
                rkey: wr.rkey,
                swap_add: if cas { wr.swap } else { wr.compare_add },
                compare: if cas { wr.compare_add } else { 0 },
            });
        }
        if row.headers.contains(ExtHeaders::IMMDT) {
            repr.immdt = Some(ImmDtRepr {
                imm_data: wr.imm_data,
            });
        }
        // The IETH goes in the last packet of a SEND with Invalidate.
        if row.headers.contains(ExtHeaders::IETH) {
            repr.ieth = Some(IethRepr {
                rkey: wr.invalidate_rkey,
            });
        }
        repr.payload_len = payload_bytes as usize;
        let (advance_psns, done_wqe) = if row.kind == OpKind::RdmaRead {
            (psns_for(remaining, self.pmtu()), true)
        } else {
            (1, ends)
        };
        Some(ReqPacket {
            repr,
            kind: row.kind,
            payload_off: offset,
            advance_psns,
            done_wqe,
        })
    }

    /// The datagram of `pkt`: its payload gathered from WQE `idx`'s SGEs (or its inline
    /// copy) and the ICRC. A local SGE that fails its key/range check completes the WQE
    /// with IBV_WC_LOC_PROT_ERR and moves the QP to ERR. Source: rxe `finish_packet`.
    fn finish_packet(
        &mut self,
        idx: usize,
        pkt: &ReqPacket,
        path: &Path,
        mem: &MemoryTable,
    ) -> Option<Transmit> {
        let wqe = self.sq.get(idx)?;
        let repr = &pkt.repr;
        let h = repr.header_len();
        let pay = repr.payload_len;
        // With a gathering link, a payload that lies in one SGE stays in the MR: only the
        // headers are built here and the ICRC is computed over the MR bytes in place. An SGE
        // that fails its checks takes the copying path below, which reports it.
        let in_mr = if self.gather && pay > 0 && wqe.inline_data.is_none() {
            mem.payload_bytes(&wqe.wr.sg_list, self.pd, pkt.payload_off, pay)
                .ok()
                .flatten()
        } else {
            None
        };
        if let Some(data) = in_mr {
            return Some(super::gathered(TxKind::Request, repr, data, path));
        }
        let mut buf = super::bufpool::take(repr.buffer_len());
        repr.emit_headers(&mut buf);
        if pay > 0 && wqe_payload(wqe, mem, self.pd, pkt.payload_off, &mut buf[h..h + pay]).is_err()
        {
            super::bufpool::give(buf);
            if let Some(w) = self.sq.remove(idx) {
                self.complete_send(&w, WcStatus::LocProtErr);
            }
            self.enter_error();
            return None;
        }
        repr.finish(&mut buf, &path.icrc_ip());
        Some(Transmit::new(TxKind::Request, path.remote, path.src_port, buf).with_ip(path.ip))
    }

    /// Moves the cursor past `pkt`, sent from WQE `idx`: the next PSN, the AckReq count, the
    /// next WQE or byte offset; a UC WQE completes once its last packet is sent; an RC
    /// requester arms its retransmit timer. Source: rxe `update_wqe_state`, `update_state`.
    fn update_state(&mut self, idx: usize, pkt: &ReqPacket, now: Instant) {
        let bth = pkt.repr.bth;
        if pkt.kind == OpKind::RdmaRead
            && let Some(w) = self.sq.get_mut(idx)
        {
            w.read_req_psn = bth.psn;
        }
        if self.req.psn.diff(self.req.high_psn) < 0 {
            self.counters.retransmitted_pkts += 1;
        }
        self.req.psn = self.req.psn.add(pkt.advance_psns);
        if self.req.psn.diff(self.req.high_psn) > 0 {
            self.req.high_psn = self.req.psn;
        }
        if bth.ack_req {
            self.req.noack_pkts = 0;
        } else {
            self.req.noack_pkts += 1;
        }
        if pkt.done_wqe {
            self.req.wqe += 1;
            self.req.offset = 0;
        } else {
            self.req.offset += pkt.repr.payload_len as u64;
        }
        if self.qp_type == QpType::Uc {
            // UC: a WQE is complete once its last packet is sent (rxe `rxe_requester`).
            if pkt.done_wqe {
                self.req.wqe = self.req.wqe.saturating_sub(1);
                if let Some(w) = self.sq.remove(idx) {
                    self.complete_send(&w, WcStatus::Success);
                }
            }
            self.comp.psn = self.req.psn;
        } else if !self.timers.is_armed(Timer::Retransmit)
            && let Some(d) = ack_timeout(self.attrs.timeout)
        {
            self.timers.set(Timer::Retransmit, now + d);
        }
    }

    /// UD: one SEND ONLY (+IMM) per WQE to the WR's address handle, with a DETH; complete
    /// once sent. A message longer than the path MTU is not sent and completes successfully
    /// (IBTA C10-93.1.1; rxe `rxe_requester`). Source: IBTA Vol 1 ch. 9 (UD); docs/wire-facts.md §2.12.
    fn ud_transmit(&mut self, path: &Path, mem: &MemoryTable) -> Option<Transmit> {
        let pmtu = self.pmtu();
        loop {
            let w = self.sq.front()?;
            let Some(dest) = w.wr.ud else {
                // post_send refuses a UD WR without a destination; drop it defensively.
                let w = self.sq.pop_front()?;
                self.complete_send(&w, WcStatus::LocQpOpErr);
                continue;
            };
            if w.length > pmtu {
                let w = self.sq.pop_front()?;
                self.complete_send(&w, WcStatus::Success);
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
                // rxe sets AckReq on GSI (QP1) packets only (docs/wire-facts.md §2.12).
                ack_req: self.qpn == 1,
                ..BthRepr::new(opcode, dest.remote_qpn, self.req.psn)
            };
            let mut repr = PacketRepr::new(bth);
            // IBTA ch. 10: a WR Q_Key with the high bit set is replaced by the QP's own
            // Q_Key (rxe 6.1 sends it as is: spec/deviations.toml); QP1 always sends
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
                self.complete_send(&w, WcStatus::LocProtErr);
                self.enter_error();
                return None;
            }
            let to = Path {
                local: path.local,
                remote: dest.remote_ip,
                src_port: path.src_port,
                ip: dest.ip,
            };
            repr.finish(&mut buf, &to.icrc_ip());
            self.req.psn = self.req.psn.add(1);
            let w = self.sq.pop_front()?;
            self.complete_send(&w, WcStatus::Success);
            return Some(
                Transmit::new(TxKind::Request, dest.remote_ip, path.src_port, buf).with_ip(dest.ip),
            );
        }
    }

    /// Go-back-N: the next packet sent will be the one at `psn`, from the WQE that holds it.
    /// A READ restarts at that response PSN with its address advanced and length reduced by
    /// the bytes already received (rxe `req_retry`). A PSN no WQE holds changes nothing
    /// (false).
    pub(super) fn rewind_to(&mut self, psn: Psn) -> bool {
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
                return true;
            }
        }
        false
    }

    /// Moves the cursor forward to `psn`, the first PSN the peer has not acknowledged, when
    /// that is past the cursor (an ACK of packets sent before a rewind): `psn`'s packet of
    /// the WQE that holds it, or, past every WQE that has PSNs, the first WQE without.
    pub(super) fn advance_to(&mut self, psn: Psn) {
        if psn.diff(self.req.psn) <= 0 || self.rewind_to(psn) {
            return;
        }
        self.req.wqe = self
            .sq
            .iter()
            .position(|w| !w.assigned && !w.local_done)
            .unwrap_or(self.sq.len());
        self.req.offset = 0;
        self.req.psn = psn;
        self.req.noack_pkts = 0;
    }
}
