//! Responder: checks request packets in rxe's order (PSN → opcode sequence → operation
//! allowed → resources → length → R_Key), executes them against registered memory, and
//! queues ACKs, NAKs, READ responses and ATOMIC ACKNOWLEDGEs in PSN order.
//!
//! Source: IBTA Vol 1 ch. 9 (responder behaviour; C9-105 duplicates are re-ACKed, not
//! re-executed; C9-88 zero-length RDMA needs no R_Key); rxe `rxe_resp.c`.

use super::error::Disposition;
use super::{
    AccessFlags, CqSel, DropReason, MAX_MSG_BYTES, Path, QpAction, QpEngine, QpState, QpType,
    RecvWqe, RespError, Transmit, TxKind, Wc, WcFlags, WcOpcode, WcStatus, psns_for,
};
use crate::transport::{AtomicOp, Instant, MemoryTable};
use crate::wire::{
    AethRepr, AethSyndrome, AtomicAckEthRepr, BthRepr, Gid, OpKind, Opcode, PacketRepr, Position,
    Psn, RocePacket,
};
use core::net::IpAddr;
use std::collections::VecDeque;

/// Saved atomic results kept for duplicate replay.
const ATOMIC_REPLAY: usize = 16;
/// Most queued responder outputs; beyond this a request is dropped (and retried by the peer).
const MAX_RESP_QUEUE: usize = 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum InProgress {
    Send,
    Write,
}

#[derive(Debug, Clone)]
enum RespItem {
    Ack {
        psn: Psn,
        syndrome: AethSyndrome,
        msn: u32,
    },
    Read {
        psn: Psn,
        va: u64,
        rkey: u32,
        remaining: u64,
        first: bool,
        msn: u32,
    },
    AtomicAck {
        psn: Psn,
        orig: u64,
        msn: u32,
    },
    /// A response already built (see `materialize_reads`).
    Ready(Transmit),
}

/// Responder state.
#[derive(Debug, Clone, Default)]
pub(super) struct RespState {
    /// Expected PSN of the next request.
    pub epsn: Psn,
    msn: u32,
    sent_psn_nak: bool,
    in_progress: Option<InProgress>,
    recv: Option<RecvWqe>,
    recv_offset: u64,
    write_va: u64,
    write_rkey: u32,
    write_resid: u64,
    write_len: u64,
    out: VecDeque<RespItem>,
    atomics: VecDeque<(Psn, u64)>,
    /// Recent READ requests accepted: (first PSN, PSNs used), for duplicate replay.
    reads: VecDeque<(Psn, u32)>,
}

impl RespState {
    pub(super) fn has_recv(&self) -> bool {
        self.recv.is_some()
    }
    pub(super) fn take_recv(&mut self) -> Option<RecvWqe> {
        self.in_progress = None;
        self.recv.take()
    }
}

impl QpEngine {
    pub(super) fn responder_handle(
        &mut self,
        _now: Instant,
        pkt: &RocePacket<'_>,
        mem: &mut MemoryTable,
    ) {
        if self.qp_type == QpType::Uc {
            self.uc_handle(pkt, mem);
            return;
        }
        if self.qp_type.is_datagram() {
            self.ud_handle(pkt, mem);
            return;
        }
        let psn = pkt.repr.bth.psn;
        let d = psn.diff(self.resp.epsn);
        if d > 0 {
            // IBTA: one NAK-sequence per gap, carrying the expected PSN; later packets of
            // the gap are dropped silently (and counted) until the expected one arrives.
            if !self.resp.sent_psn_nak {
                self.resp.sent_psn_nak = true;
                self.counters.out_of_seq_request += 1;
                let epsn = self.resp.epsn;
                self.resp_fail(RespError::PsnOutOfSeq, epsn);
            } else {
                self.counters.drop_packet(DropReason::OutOfSequence);
            }
            return;
        }
        if d < 0 {
            self.counters.duplicate_request += 1;
            self.duplicate(pkt, mem);
            return;
        }
        self.resp.sent_psn_nak = false;
        if pkt.info.kind != OpKind::RdmaRead {
            self.materialize_reads(mem);
            if self.state == QpState::Err {
                // A queued READ found its MR gone and moved the QP to ERR.
                self.counters.drop_packet(DropReason::WrongQpState);
                return;
            }
        }
        if let Err(e) = self.execute(pkt, mem) {
            self.resp_fail(e, psn);
        }
    }

    fn execute(&mut self, pkt: &RocePacket<'_>, mem: &mut MemoryTable) -> Result<(), RespError> {
        let info = pkt.info;
        let pos = info.position;
        let bth = pkt.repr.bth;
        // Opcode sequence.
        match (self.resp.in_progress, info.kind, pos) {
            (Some(InProgress::Send), OpKind::Send, Position::Middle | Position::Last)
            | (Some(InProgress::Write), OpKind::RdmaWrite, Position::Middle | Position::Last) => {}
            (None, _, Position::First | Position::Only) => {}
            (None, _, _) => return Err(RespError::MissingOpcodeFirst),
            (Some(_), _, _) => return Err(RespError::MissingOpcodeLast),
        }
        // Operation allowed by the QP's access flags.
        let need = match info.kind {
            OpKind::RdmaWrite => Some(AccessFlags::REMOTE_WRITE),
            OpKind::RdmaRead => Some(AccessFlags::REMOTE_READ),
            OpKind::CompareSwap | OpKind::FetchAdd => Some(AccessFlags::REMOTE_ATOMIC),
            OpKind::Send => None,
            _ => return Err(RespError::UnsupportedOpcode),
        };
        if let Some(need) = need
            && !self.attrs.qp_access_flags.contains(need)
        {
            return Err(RespError::UnsupportedOpcode);
        }
        // Resources before lengths and keys (rxe `check_resource` runs before
        // `check_length` and `check_rkey`): a SEND that starts a message, or the packet of a
        // WRITE that carries immediate data, needs a receive WQE, else RNR NAK.
        let needs_recv = (info.kind == OpKind::Send && pos.starts_message())
            || (info.kind == OpKind::RdmaWrite && pos.ends_message() && pkt.repr.immdt.is_some());
        if needs_recv && self.rq.is_empty() {
            return Err(RespError::Rnr);
        }
        // WRITE pad count: 0 on non-final packets, and on the final one the pad of the
        // remaining RETH length (rxe `check_rkey`; docs/wire-facts.md §2.4).
        if info.kind == OpKind::RdmaWrite
            && bth.pad_count != crate::wire::pad_count(pkt.payload.len())
        {
            return Err(RespError::InvalidLength);
        }
        // Per-packet length against the path MTU (rxe R6.12 `rxe_resp_check_length`).
        let pmtu = self.pmtu();
        let len = pkt.payload.len() as u64;
        if matches!(info.kind, OpKind::Send | OpKind::RdmaWrite) {
            let ok = match pos {
                Position::First | Position::Middle => len == pmtu,
                Position::Last => len > 0 && len <= pmtu,
                Position::Only => len <= pmtu,
            };
            if !ok {
                return Err(RespError::InvalidLength);
            }
        }
        match info.kind {
            OpKind::Send => self.exec_send(pkt, mem),
            OpKind::RdmaWrite => self.exec_write(pkt, mem),
            OpKind::RdmaRead => self.exec_read(pkt, mem),
            _ => self.exec_atomic(pkt, mem),
        }?;
        if matches!(info.kind, OpKind::Send | OpKind::RdmaWrite) {
            self.resp.epsn = self.resp.epsn.add(1);
            if bth.ack_req && self.qp_type == QpType::Rc {
                let msn = self.resp.msn;
                self.queue_resp(RespItem::Ack {
                    psn: bth.psn,
                    syndrome: AethSyndrome::ACK_UNLIMITED,
                    msn,
                });
            }
        }
        Ok(())
    }

    /// UC responder: no ACKs and no NAKs, ever. A FIRST or ONLY at any PSN starts a message
    /// and resynchronises the expected PSN; a MIDDLE/LAST that does not continue the message
    /// in order drops the rest of it; a message that fails a check (no receive WQE, R_Key,
    /// length) is dropped silently and its receive WQE is not consumed.
    /// Source: IBTA Vol 1 ch. 9 (UC responder); rxe `rxe_resp.c` (`check_psn` for UC,
    /// `drop_msg`); docs/wire-facts.md §2.9.
    fn uc_handle(&mut self, pkt: &RocePacket<'_>, mem: &mut MemoryTable) {
        let psn = pkt.repr.bth.psn;
        let starts = pkt.info.position.starts_message();
        if psn != self.resp.epsn || (!starts && self.resp.in_progress.is_none()) {
            self.uc_drop_message();
            if !starts {
                self.resp.epsn = psn.add(1);
                self.counters.drop_packet(DropReason::UcMessageDropped);
                return;
            }
            self.resp.epsn = psn;
        }
        if starts && self.resp.in_progress.is_some() {
            // A new message while one is in progress: the old one lost its LAST.
            self.uc_drop_message();
        }
        if self.execute(pkt, mem).is_err() {
            self.uc_drop_message();
            self.resp.epsn = psn.add(1);
            self.counters.drop_packet(DropReason::UcMessageDropped);
        }
    }

    /// UD responder: the DETH Q_Key must be the QP's (else drop); a receive WQE is taken
    /// (none → drop, never an RNR NAK); the 40-byte GRH — the IPv6 header, or 20 zero bytes
    /// then the IPv4 header — goes first in the buffer, then the payload; the work
    /// completion has `IBV_WC_GRH`, `byte_len` = 40 + payload, and `src_qp` from the DETH.
    /// The PSN is ignored. Source: IBTA Vol 1 ch. 9/10 (UD, GRH); rxe `rxe_resp.c` `execute`
    /// (`union rdma_network_hdr`), `rxe_recv.c` `check_keys`; docs/wire-facts.md §2.12.
    fn ud_handle(&mut self, pkt: &RocePacket<'_>, mem: &mut MemoryTable) {
        let Some(deth) = pkt.repr.deth else {
            self.counters.drop_packet(DropReason::LengthMismatch);
            return;
        };
        // The Q_Key was checked with the other header checks (`QpEngine::handle_packet`).
        let Some(room) = self.rq.front().map(|r| {
            r.wr.sg_list
                .iter()
                .map(|s| u64::from(s.length))
                .sum::<u64>()
        }) else {
            self.counters.drop_packet(DropReason::UdNoReceive);
            return;
        };
        let len = 40 + pkt.payload.len() as u64;
        if len > room {
            // rxe `rxe_resp_check_length` → class D for UD: dropped, the receive stays.
            self.counters.drop_packet(DropReason::UdReceiveTooShort);
            return;
        }
        let Some(r) = self.rq.pop_front() else { return };
        let mut wc = super::recv_wc(&r.wr, WcStatus::Success, self.qpn);
        wc.src_qp = deth.src_qpn;
        let grh = self.grh(pkt.body.len() + crate::wire::ICRC_LEN);
        let ok = mem.scatter(&r.wr.sg_list, self.pd, 0, &grh).is_ok()
            && (pkt.payload.is_empty()
                || mem.scatter(&r.wr.sg_list, self.pd, 40, pkt.payload).is_ok());
        if !ok {
            wc.status = WcStatus::LocProtErr;
            self.push_wc(CqSel::Recv, wc);
            return;
        }
        wc.byte_len = len as u32;
        wc.wc_flags = WcFlags::GRH;
        if let Some(i) = pkt.repr.immdt {
            wc.imm_data = i.imm_data;
            wc.wc_flags |= WcFlags::WITH_IMM;
        }
        wc.opcode = WcOpcode::Recv;
        self.counters.rdma_recvs += 1;
        self.push_wc(CqSel::Recv, wc);
    }

    /// The 40-byte network header a UD receive buffer starts with, for a datagram of
    /// `udp_payload` bytes from the packet's source to this QP's address. Fields a UDP
    /// socket cannot see are as softroce sends them (TOS 0, ID 0, DF, TTL 64).
    fn grh(&self, udp_payload: usize) -> [u8; 40] {
        let mut g = [0u8; 40];
        let local = self.path.map(|p| p.local);
        let local = self.rx_dst.or(local);
        match (self.last_src, local) {
            (IpAddr::V4(src), Some(IpAddr::V4(dst))) => {
                let h = &mut g[20..40];
                h[0] = 0x45;
                h[2..4].copy_from_slice(&((20 + 8 + udp_payload) as u16).to_be_bytes());
                h[6] = 0x40;
                h[8] = 64;
                h[9] = 17;
                h[12..16].copy_from_slice(&src.octets());
                h[16..20].copy_from_slice(&dst.octets());
                let sum = (0..10)
                    .map(|i| u32::from(u16::from_be_bytes([h[2 * i], h[2 * i + 1]])))
                    .sum::<u32>();
                let folded = (sum & 0xffff) + (sum >> 16);
                let csum = !(((folded & 0xffff) + (folded >> 16)) as u16);
                h[10..12].copy_from_slice(&csum.to_be_bytes());
            }
            (src, dst) => {
                g[0] = 0x60;
                g[4..6].copy_from_slice(&((8 + udp_payload) as u16).to_be_bytes());
                g[6] = 17;
                g[7] = 64;
                g[8..24].copy_from_slice(&Gid::from_ip(src).0);
                g[24..40].copy_from_slice(&Gid::from_ip(dst.unwrap_or(src)).0);
            }
        }
        g
    }

    fn uc_drop_message(&mut self) {
        if let Some(r) = self.resp.recv.take() {
            self.rq.push_front(r);
        }
        self.resp.in_progress = None;
    }

    fn exec_send(&mut self, pkt: &RocePacket<'_>, mem: &mut MemoryTable) -> Result<(), RespError> {
        let pos = pkt.info.position;
        if pos.starts_message() {
            let Some(r) = self.rq.pop_front() else {
                return Err(RespError::Rnr);
            };
            self.resp.recv = Some(r);
            self.resp.recv_offset = 0;
            self.resp.in_progress = Some(InProgress::Send);
        }
        let Some(recv) = self.resp.recv.as_ref() else {
            return Err(RespError::MissingOpcodeFirst);
        };
        let room: u64 = recv.wr.sg_list.iter().map(|s| u64::from(s.length)).sum();
        let len = pkt.payload.len() as u64;
        if self.resp.recv_offset + len > room {
            return Err(RespError::RecvTooShort);
        }
        if len > 0 {
            mem.scatter(
                &recv.wr.sg_list,
                self.pd,
                self.resp.recv_offset,
                pkt.payload,
            )
            .map_err(|_| RespError::MalformedWqe)?;
        }
        self.resp.recv_offset += len;
        if pos.ends_message() {
            // SEND with Invalidate: the IETH R_Key is invalidated once the data is placed
            // (rxe `execute` → `invalidate_rkey`); a key this QP may not invalidate fails the
            // receive (class J).
            let inv = pkt.repr.ieth.map(|i| i.rkey);
            if let Some(rkey) = inv {
                mem.invalidate(rkey, self.pd, Some(self.qpn))
                    .map_err(|_| RespError::InvalidateRkey)?;
            }
            let imm = pkt.repr.immdt.map(|i| i.imm_data);
            let byte_len = self.resp.recv_offset;
            self.finish_recv(WcOpcode::Recv, byte_len, imm);
            if let Some(rkey) = inv {
                self.note_invalidated(rkey);
            }
            self.resp.msn = (self.resp.msn + 1) & 0x00ff_ffff;
        }
        Ok(())
    }

    fn finish_recv(&mut self, opcode: WcOpcode, byte_len: u64, imm: Option<u32>) {
        self.resp.in_progress = None;
        if let Some(r) = self.resp.recv.take() {
            let wc = Wc {
                wr_id: r.wr.wr_id,
                status: WcStatus::Success,
                opcode,
                vendor_err: 0,
                byte_len: byte_len as u32,
                imm_data: imm.unwrap_or(0),
                qp_num: self.qpn,
                src_qp: self.attrs.dest_qp_num,
                // rxe `do_complete` (user CQ): every successful receive completion has
                // IBV_WC_GRH, RC and UC included, since a RoCE packet always carries a
                // network header; only a UD receive also puts it in the buffer.
                wc_flags: if imm.is_some() {
                    WcFlags::GRH | WcFlags::WITH_IMM
                } else {
                    WcFlags::GRH
                },
            };
            self.counters.rdma_recvs += 1;
            self.push_wc(CqSel::Recv, wc);
        }
    }

    fn exec_write(&mut self, pkt: &RocePacket<'_>, mem: &mut MemoryTable) -> Result<(), RespError> {
        let pos = pkt.info.position;
        if let Some(reth) = pkt.repr.reth {
            let dma_len = u64::from(reth.dma_len);
            if dma_len > MAX_MSG_BYTES {
                return Err(RespError::InvalidLength);
            }
            // C9-88: a zero-length WRITE needs no valid R_Key or address.
            if dma_len > 0 {
                mem.check_remote(
                    reth.rkey,
                    self.pd,
                    self.qpn,
                    reth.va,
                    dma_len,
                    AccessFlags::REMOTE_WRITE,
                )
                .map_err(|_| RespError::RkeyViolation)?;
            }
            self.resp.write_va = reth.va;
            self.resp.write_rkey = reth.rkey;
            self.resp.write_resid = dma_len;
            self.resp.write_len = dma_len;
        }
        let len = pkt.payload.len() as u64;
        // The data must fill the RETH length exactly (rxe R6.12 `check_rkey`).
        let fits = if pos.ends_message() {
            len == self.resp.write_resid
        } else {
            len < self.resp.write_resid
        };
        if !fits {
            return Err(RespError::InvalidLength);
        }
        // The payload of an ends-message packet needs a receive WQE if it has immediate
        // data; check it before touching memory so that an RNR retry replays cleanly.
        let imm = pkt.repr.immdt.map(|i| i.imm_data);
        if pos.ends_message() && imm.is_some() {
            let Some(r) = self.rq.pop_front() else {
                return Err(RespError::Rnr);
            };
            self.resp.recv = Some(r);
        }
        if len > 0 {
            let r = mem.write_remote(
                self.resp.write_rkey,
                self.pd,
                self.qpn,
                self.resp.write_va,
                pkt.payload,
            );
            if r.is_err() {
                if let Some(r) = self.resp.recv.take() {
                    // Put the WQE back: it was not consumed.
                    self.rq.push_front(r);
                }
                return Err(RespError::RkeyViolation);
            }
        }
        self.resp.write_va = self.resp.write_va.wrapping_add(len);
        self.resp.write_resid -= len;
        if pos.ends_message() {
            self.resp.in_progress = None;
            self.resp.msn = (self.resp.msn + 1) & 0x00ff_ffff;
            if imm.is_some() {
                let total = self.resp.write_len;
                self.finish_recv(WcOpcode::RecvRdmaWithImm, total, imm);
            }
        } else {
            self.resp.in_progress = Some(InProgress::Write);
        }
        Ok(())
    }

    fn exec_read(&mut self, pkt: &RocePacket<'_>, mem: &mut MemoryTable) -> Result<(), RespError> {
        let reth = pkt.repr.reth.ok_or(RespError::InvalidLength)?;
        let len = u64::from(reth.dma_len);
        if len > MAX_MSG_BYTES {
            return Err(RespError::InvalidLength);
        }
        if self.attrs.max_dest_rd_atomic == 0 {
            return Err(RespError::TooManyRdAtomic);
        }
        if len > 0 {
            mem.check_remote(
                reth.rkey,
                self.pd,
                self.qpn,
                reth.va,
                len,
                AccessFlags::REMOTE_READ,
            )
            .map_err(|_| RespError::RkeyViolation)?;
        }
        let psn = pkt.repr.bth.psn;
        // C9-148: the MSN counts the READ when it is accepted, before its responses.
        self.resp.msn = (self.resp.msn + 1) & 0x00ff_ffff;
        let msn = self.resp.msn;
        self.queue_resp(RespItem::Read {
            psn,
            va: reth.va,
            rkey: reth.rkey,
            remaining: len,
            first: true,
            msn,
        });
        let npsn = psns_for(len, self.pmtu());
        if self.resp.reads.len() == ATOMIC_REPLAY {
            self.resp.reads.pop_front();
        }
        self.resp.reads.push_back((psn, npsn));
        self.resp.epsn = psn.add(npsn);
        Ok(())
    }

    fn exec_atomic(
        &mut self,
        pkt: &RocePacket<'_>,
        mem: &mut MemoryTable,
    ) -> Result<(), RespError> {
        let a = pkt.repr.atomic_eth.ok_or(RespError::InvalidLength)?;
        if self.attrs.max_dest_rd_atomic == 0 {
            return Err(RespError::TooManyRdAtomic);
        }
        if a.va % 8 != 0 {
            return Err(RespError::MisalignedAtomic);
        }
        // The target is 8 bytes in the responder's host order (rxe does a native u64 op).
        let op = if pkt.info.kind == OpKind::CompareSwap {
            AtomicOp::CompareSwap {
                compare: a.compare,
                swap: a.swap_add,
            }
        } else {
            AtomicOp::FetchAdd(a.swap_add)
        };
        let orig = mem
            .atomic_remote(a.rkey, self.pd, self.qpn, a.va, op)
            .map_err(|_| RespError::RkeyViolation)?;
        let psn = pkt.repr.bth.psn;
        self.resp.msn = (self.resp.msn + 1) & 0x00ff_ffff;
        let msn = self.resp.msn;
        self.queue_resp(RespItem::AtomicAck { psn, orig, msn });
        if self.resp.atomics.len() == ATOMIC_REPLAY {
            self.resp.atomics.pop_front();
        }
        self.resp.atomics.push_back((psn, orig));
        self.resp.epsn = psn.add(1);
        Ok(())
    }

    /// A request below the expected PSN. IBTA C9-105: a duplicate SEND/WRITE is re-ACKed with
    /// the last in-order PSN, never re-executed; a duplicate READ is answered again after the
    /// MR is re-validated; a duplicate atomic is answered from its saved result.
    fn duplicate(&mut self, pkt: &RocePacket<'_>, mem: &MemoryTable) {
        let psn = pkt.repr.bth.psn;
        let msn = self.resp.msn;
        match pkt.info.kind {
            OpKind::Send | OpKind::RdmaWrite => {
                let last = self.resp.epsn.sub(1);
                self.queue_resp(RespItem::Ack {
                    psn: last,
                    syndrome: AethSyndrome::ACK_UNLIMITED,
                    msn,
                });
            }
            OpKind::RdmaRead => {
                let Some(reth) = pkt.repr.reth else { return };
                let len = u64::from(reth.dma_len);
                // rxe `duplicate_request` → `find_resource`: replay only a READ that lies
                // inside one this responder accepted (and still allows), no longer than what
                // is left of it from this PSN; anything else is dropped.
                let pmtu = self.pmtu();
                let saved = self.resp.reads.iter().find_map(|&(first, n)| {
                    let d = psn.diff(first);
                    (d >= 0 && (d as u32) < n).then_some((d as u32, n))
                });
                let allowed = self
                    .attrs
                    .qp_access_flags
                    .contains(AccessFlags::REMOTE_READ)
                    && self.attrs.max_dest_rd_atomic > 0;
                let fits = saved.is_some_and(|(d, n)| psns_for(len, pmtu) <= n - d);
                if !(allowed && fits) {
                    self.counters.drop_packet(DropReason::StaleDuplicate);
                    return;
                }
                // rxe `read_reply` re-checks the MR of a replayed READ (`rxe_recheck_mr`); a
                // key that no longer validates (MR deregistered, invalidated, shrunk) is an
                // R_Key violation: NAK remote access error and ERR, as for a new READ.
                let valid = len == 0
                    || mem
                        .check_remote(
                            reth.rkey,
                            self.pd,
                            self.qpn,
                            reth.va,
                            len,
                            AccessFlags::REMOTE_READ,
                        )
                        .is_ok();
                if !valid {
                    self.resp_fail(RespError::RkeyViolation, psn);
                    return;
                }
                // Answered as a replay — MIDDLE/LAST — unless it starts at that READ's first
                // PSN (rxe: res->state = replay when the PSN is not first_psn).
                let inside = saved.is_some_and(|(d, _)| d > 0);
                self.queue_resp(RespItem::Read {
                    psn,
                    va: reth.va,
                    rkey: reth.rkey,
                    remaining: len,
                    first: !inside,
                    msn,
                });
            }
            OpKind::CompareSwap | OpKind::FetchAdd => {
                match self.resp.atomics.iter().find(|(p, _)| *p == psn) {
                    Some(&(_, orig)) => self.queue_resp(RespItem::AtomicAck { psn, orig, msn }),
                    None => self.counters.drop_packet(DropReason::StaleDuplicate),
                }
            }
            _ => self.counters.drop_packet(DropReason::StaleDuplicate),
        }
    }

    /// Requests execute in PSN order (IBTA ch. 9 responder ordering): a READ must return the
    /// memory as it was before any later request changed it. READ responses are normally
    /// built when polled; before a later request executes, any still queued are built now.
    fn materialize_reads(&mut self, mem: &MemoryTable) {
        if !self
            .resp
            .out
            .iter()
            .any(|i| matches!(i, RespItem::Read { .. }))
        {
            return;
        }
        let Some(path) = self.path else { return };
        let mut ready = VecDeque::new();
        while let Some(t) = self.responder_transmit(&path, mem, false) {
            ready.push_back(RespItem::Ready(t));
        }
        self.resp.out = ready;
    }

    fn queue_resp(&mut self, item: RespItem) {
        // ACKs are cumulative: a newer ACK replaces one still waiting at the tail.
        if let (
            RespItem::Ack {
                syndrome: AethSyndrome::Ack { .. },
                ..
            },
            Some(RespItem::Ack {
                syndrome: AethSyndrome::Ack { .. },
                ..
            }),
        ) = (&item, self.resp.out.back())
        {
            self.counters.ack_deferred += 1;
            self.resp.out.pop_back();
        }
        // The cap bounds the work requests can queue (READ and atomic answers); ACKs and NAKs
        // of executed requests are always queued, behind what came before them.
        let work = self
            .resp
            .out
            .iter()
            .filter(|i| !matches!(i, RespItem::Ack { .. }))
            .count();
        if !matches!(item, RespItem::Ack { .. }) && work >= MAX_RESP_QUEUE {
            self.counters.drop_packet(DropReason::NoResources);
            return;
        }
        self.resp.out.push_back(item);
    }

    fn resp_fail(&mut self, e: RespError, psn: Psn) {
        let Disposition { nak, wc_status, qp } = e.disposition(self.attrs.min_rnr_timer);
        if let Some(syndrome) = nak {
            tracing::debug!(
                target: "softroce::nak",
                qpn = %format_args!("{:#x}", self.qpn),
                %psn,
                error = ?e,
                "responder sends {syndrome}"
            );
        }
        if e == RespError::Rnr {
            self.counters.send_rnr_err += 1;
        }
        if let Some(syndrome) = nak {
            let msn = self.resp.msn;
            self.queue_resp(RespItem::Ack { psn, syndrome, msn });
        }
        if let Some(status) = wc_status
            && let Some(r) = self.resp.take_recv()
        {
            let mut wc = super::recv_wc(&r.wr, status, self.qpn);
            wc.src_qp = self.attrs.dest_qp_num;
            self.push_wc(CqSel::Recv, wc);
        }
        if qp == QpAction::Error {
            self.enter_error();
        }
    }

    /// The next responder packet (ACK/NAK, one READ response, ATOMIC ACKNOWLEDGE), if any.
    /// With `gather`, a READ response leaves its payload in the MR ([`Transmit::tail`]).
    pub(super) fn responder_transmit(
        &mut self,
        path: &Path,
        mem: &MemoryTable,
        gather: bool,
    ) -> Option<Transmit> {
        let pmtu = self.pmtu();
        let item = self.resp.out.front_mut()?;
        let mut bth = BthRepr::new(Opcode::RC_ACKNOWLEDGE, self.attrs.dest_qp_num, Psn::new(0));
        let mut read_src = None;
        let (kind, repr) = match item {
            RespItem::Ready(_) => {
                let Some(RespItem::Ready(t)) = self.resp.out.pop_front() else {
                    return None;
                };
                return Some(t);
            }
            RespItem::Ack { psn, syndrome, msn } => {
                bth.psn = *psn;
                let mut r = PacketRepr::new(bth);
                r.aeth = Some(AethRepr {
                    syndrome: syndrome.to_byte(),
                    msn: *msn,
                });
                self.resp.out.pop_front();
                (TxKind::Acknowledge, r)
            }
            RespItem::AtomicAck { psn, orig, msn } => {
                bth.psn = *psn;
                bth.opcode = Opcode::RC_ATOMIC_ACKNOWLEDGE;
                let mut r = PacketRepr::new(bth);
                r.aeth = Some(AethRepr {
                    syndrome: AethSyndrome::ACK_UNLIMITED.to_byte(),
                    msn: *msn,
                });
                r.atomic_ack_eth = Some(AtomicAckEthRepr {
                    orig_remote_data: *orig,
                });
                self.resp.out.pop_front();
                (TxKind::AtomicAcknowledge, r)
            }
            RespItem::Read {
                psn,
                va,
                rkey,
                remaining,
                first,
                msn,
            } => {
                let pay = (*remaining).min(pmtu);
                let last = *remaining <= pmtu;
                bth.psn = *psn;
                bth.opcode = match (*first, last) {
                    (true, true) => Opcode::RC_RDMA_READ_RESPONSE_ONLY,
                    (true, false) => Opcode::RC_RDMA_READ_RESPONSE_FIRST,
                    (false, false) => Opcode::RC_RDMA_READ_RESPONSE_MIDDLE,
                    (false, true) => Opcode::RC_RDMA_READ_RESPONSE_LAST,
                };
                let mut r = PacketRepr::new(bth);
                if *first || last {
                    r.aeth = Some(AethRepr {
                        syndrome: AethSyndrome::ACK_UNLIMITED.to_byte(),
                        msn: *msn,
                    });
                }
                r.payload_len = pay as usize;
                read_src = Some((*rkey, *va));
                *psn = psn.add(1);
                *va = va.wrapping_add(pay);
                *remaining -= pay;
                *first = false;
                if last {
                    self.resp.out.pop_front();
                }
                (TxKind::ReadResponse, r)
            }
        };
        // A READ response's payload: checked against the R_Key now (the MR may have gone
        // away since the request was executed).
        let h = repr.header_len();
        let n = repr.payload_len;
        let src = match read_src {
            Some((rkey, va)) if n > 0 => {
                match mem.remote_bytes(rkey, self.pd, self.qpn, va, n, AccessFlags::REMOTE_READ) {
                    Ok(b) => Some(b),
                    Err(_) => {
                        // The MR went away between the request and this response: an R_Key
                        // violation (class C), NAKed at this response's PSN, and the QP goes
                        // to ERR, as rxe `read_reply` → RESPST_ERR_RKEY_VIOLATION does.
                        // Nothing queued behind it goes out: rxe would not have executed
                        // the requests it answers.
                        self.resp.out.clear();
                        self.resp_fail(RespError::RkeyViolation, repr.bth.psn);
                        return self.responder_transmit(path, mem, gather);
                    }
                }
            }
            _ => None,
        };
        if let Some(data) = src.filter(|_| gather) {
            // Headers here, payload straight from the MR, ICRC over both in place.
            return Some(super::gathered(kind, &repr, data, path));
        }
        let mut buf = super::bufpool::take(repr.buffer_len());
        repr.emit_headers(&mut buf);
        if let Some(data) = src {
            // Cannot fail: `data` is the `n` bytes asked for.
            let _ = data.copy_to(&mut buf[h..h + n]);
        }
        repr.finish(&mut buf, &path.icrc_ip());
        Some(Transmit::new(kind, path.remote, path.src_port, buf).with_ip(path.ip))
    }
}
