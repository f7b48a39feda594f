//! The CM engine's inputs (`handle_mad`, `handle_timeout`), outputs (`poll_*`) and the
//! helpers that queue MADs and move connections between states. Source: kernel `cm.c`
//! (`cm_req_handler`, `cm_rep_handler`, `cm_rtu_handler`, `cm_dreq_handler`,
//! `cm_drep_handler`, `cm_rej_handler`, `cm_mra_handler`, `cm_sidr_*_handler`, the `cm_dup_*`
//! helpers and `cm_process_send_error`).

use super::*;

impl CmEngine {
    // ---- inputs ----

    /// Handles a MAD received on QP1 from `src` (its first 256 bytes; a GRH must already be
    /// stripped). Every MAD is acted on or counted as a drop.
    pub fn handle_mad(&mut self, now: Instant, src: IpAddr, mad: &[u8]) {
        self.counters.mads_received += 1;
        let m = match CmMadRepr::parse(mad) {
            Ok(m) => m,
            Err(_) => return self.counters.drop(CmDropReason::Truncated),
        };
        let h = m.hdr;
        let reason = if h.base_version != MAD_BASE_VERSION {
            Some(CmDropReason::BadBaseVersion)
        } else if h.mgmt_class != MGMT_CLASS_CM {
            Some(CmDropReason::NotCmClass)
        } else if h.class_version != CM_CLASS_VERSION {
            Some(CmDropReason::BadClassVersion)
        } else if h.method != MAD_METHOD_SEND {
            Some(CmDropReason::BadMethod)
        } else {
            None
        };
        if let Some(r) = reason {
            return self.counters.drop(r);
        }
        let result = match m.msg {
            CmMsgRepr::Req(r) => self.on_req(now, src, h.tid, &r),
            CmMsgRepr::Mra(r) => self.on_mra(now, src, &r),
            CmMsgRepr::Rej(r) => self.on_rej(src, &r),
            CmMsgRepr::Rep(r) => self.on_rep(src, h.tid, &r),
            CmMsgRepr::Rtu(r) => self.on_rtu(src, &r),
            CmMsgRepr::Dreq(r) => self.on_dreq(now, src, h.tid, &r),
            CmMsgRepr::Drep(r) => self.on_drep(now, src, &r),
            CmMsgRepr::SidrReq(r) => self.on_sidr_req(now, src, h.tid, &r),
            CmMsgRepr::SidrRep(r) => self.on_sidr_rep(src, &r),
            CmMsgRepr::Other(..) => Err(CmDropReason::UnsupportedAttribute),
        };
        if let Err(r) = result {
            self.counters.drop(r);
        }
    }

    /// Fires every timer due at `now`: retransmissions, give-ups, TIMEWAIT exits.
    pub fn handle_timeout(&mut self, now: Instant) {
        let due: Vec<u32> = self
            .conns
            .iter()
            .filter(|(_, c)| c.deadline.is_some_and(|d| d <= now))
            .map(|(&id, _)| id)
            .collect();
        for id in due {
            self.fire(now, id);
        }
    }

    // ---- outputs ----

    /// The next event for the user.
    #[must_use]
    pub fn poll_event(&mut self) -> Option<CmEvent> {
        self.events.pop_front()
    }

    /// The next MAD to send.
    #[must_use]
    pub fn poll_mad(&mut self) -> Option<MadTransmit> {
        self.mads.pop_front()
    }

    /// When `handle_timeout` must next be called, if ever.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.conns.values().filter_map(|c| c.deadline).min()
    }

    // ---- message handlers: Ok = acted on (answered, state changed), Err = dropped ----

    fn on_req(
        &mut self,
        now: Instant,
        src: IpAddr,
        tid: u64,
        r: &ReqRepr,
    ) -> Result<(), CmDropReason> {
        if let Some(&id) = self.by_remote.get(&(src, r.local_comm_id)) {
            return self.on_dup_req(now, id, tid, r);
        }
        let Some(&backlog) = self.listens.get(&r.service_id) else {
            // IBTA C12: a REQ for a service nobody listens on gets REJ(invalid service ID);
            // kernel cm_req_handler -> cm_issue_rej.
            self.send_rej(
                src,
                tid,
                0,
                r.local_comm_id,
                msg_ref::REQ,
                CmReject::NoListener,
            );
            return Ok(());
        };
        // A new REQ from a peer QP that is still connected to us is stale (kernel
        // cm_insert_remote_qpn).
        let stale = self.conns.values().any(|c| {
            c.peer == src
                && c.remote_qpn == r.local_qpn
                && matches!(c.state, CmState::Established | CmState::DreqSent)
        });
        if stale {
            self.send_rej(
                src,
                tid,
                0,
                r.local_comm_id,
                msg_ref::REQ,
                CmReject::StaleConnection,
            );
            return Ok(());
        }
        if self.pending_requests(r.service_id) >= backlog {
            // kernel ucma_event_handler refuses a connect request beyond the listener's
            // backlog (-ENOMEM) and cm_destroy_id drops a REQ_RCVD destroyed so without a
            // REJ, "to allow future retries": the peer's next REQ may find room.
            return Err(CmDropReason::BacklogFull);
        }
        let Ok(id) = self.new_conn(src, CmState::ReqRcvd) else {
            self.send_rej(
                src,
                tid,
                0,
                r.local_comm_id,
                msg_ref::REQ,
                CmReject::NoResources,
            );
            return Err(CmDropReason::TooManyConnections);
        };
        let timeout = self.peer_response_timeout(r.local_cm_response_timeout);
        let lifetime = self.request_lifetime(r.remote_cm_response_timeout, r.max_cm_retries);
        let c = self.conn_mut(id)?;
        c.remote_comm_id = r.local_comm_id;
        c.remote_qpn = r.local_qpn;
        c.service_id = r.service_id;
        c.tid = tid;
        c.response_timeout = timeout;
        c.max_cm_retries = r.max_cm_retries;
        c.registered = Some(r.local_comm_id);
        // Aged out when the peer has given up waiting for our REP.
        c.deadline = Some(now + lifetime);
        self.by_remote.insert((src, r.local_comm_id), id);
        let cma = CmaHdr::new_checked(&r.private_data[..])
            .map(|h| CmaHdrRepr::parse(&h))
            .ok()
            .filter(|h| h.cma_version == 0 && matches!(h.ip_version, 4 | 6));
        self.events.push_back(CmEvent::ConnectRequest {
            id: CommId(id),
            peer: src,
            req: Box::new(*r),
            cma,
        });
        Ok(())
    }

    fn on_dup_req(
        &mut self,
        now: Instant,
        id: u32,
        tid: u64,
        r: &ReqRepr,
    ) -> Result<(), CmDropReason> {
        // The peer waits for the REP the MRA's service timeout at each of its retries.
        let mra_wait = self.request_lifetime(self.config.mra_service_timeout, r.max_cm_retries);
        let c = self.conn_mut(id)?;
        match c.state {
            // IBTA C12: a duplicate REQ while the consumer decides gets an MRA.
            CmState::ReqRcvd => {
                c.state = CmState::MraReqSent;
                c.deadline = Some(now + mra_wait);
                let mra = MraRepr {
                    local_comm_id: id,
                    remote_comm_id: r.local_comm_id,
                    message_mraed: msg_ref::REQ,
                    service_timeout: self.config.mra_service_timeout & 0x1f,
                    private_data: [0; 222],
                };
                self.send(id, CmMsgRepr::Mra(mra), true);
                self.counters.resends += 1;
                Ok(())
            }
            // kernel cm_dup_req_handler: resend what we last sent (the MRA or the REP).
            CmState::MraReqSent => {
                c.deadline = Some(now + mra_wait);
                self.resend(id);
                Ok(())
            }
            CmState::RepSent | CmState::MraRepRcvd => {
                self.resend(id);
                Ok(())
            }
            CmState::Timewait => {
                let peer = c.peer;
                self.send_rej(
                    peer,
                    tid,
                    id,
                    r.local_comm_id,
                    msg_ref::REQ,
                    CmReject::StaleConnection,
                );
                Ok(())
            }
            _ => Err(CmDropReason::DuplicateReq),
        }
    }

    fn on_mra(&mut self, now: Instant, src: IpAddr, r: &MraRepr) -> Result<(), CmDropReason> {
        let id = self.lookup(src, r.remote_comm_id, r.local_comm_id)?;
        let wait = self.peer_response_timeout(r.service_timeout);
        let c = self.conn_mut(id)?;
        let next = match (c.state, r.message_mraed) {
            (CmState::ReqSent, msg_ref::REQ) => CmState::MraReqRcvd,
            (CmState::RepSent, msg_ref::REP) => CmState::MraRepRcvd,
            // kernel cm_mra_handler: a second MRA is a duplicate; it does not stretch the
            // wait again (else a peer could hold the connection forever with MRAs).
            (CmState::MraReqRcvd, msg_ref::REQ) | (CmState::MraRepRcvd, msg_ref::REP) => {
                return Err(CmDropReason::DuplicateMra);
            }
            _ => return Err(CmDropReason::UnexpectedResponse),
        };
        // IBTA C12: an MRA stretches the wait by its service timeout. As the kernel's
        // cm_mra_handler -> ib_modify_mad, the message keeps its retries: each now waits the
        // stretched time, and one that runs out resends (a REP held up past the MRA's wait
        // still finds the REQ's next copy answered).
        c.state = next;
        // The active side learns the peer's ID from the first MRA or REP; the passive side
        // keeps the one its REQ gave (and under which `by_remote` holds it).
        if c.remote_comm_id == 0 && c.registered.is_none() {
            c.remote_comm_id = r.local_comm_id;
        }
        c.deadline = Some(now + wait);
        c.response_timeout = wait;
        Ok(())
    }

    fn on_rej(&mut self, src: IpAddr, r: &RejRepr) -> Result<(), CmDropReason> {
        let id = match self.lookup(src, r.remote_comm_id, r.local_comm_id) {
            Ok(id) => id,
            // kernel cm_acquire_rejected_id: a peer that abandons its connect in REQ_SENT
            // knows no ID of ours (its REJ(timeout) has remote comm ID 0) and names the
            // connection by its own ID, which our REQ_RCVD side keeps.
            Err(e) if r.reason == RejReason::TIMEOUT => {
                *self.by_remote.get(&(src, r.local_comm_id)).ok_or(e)?
            }
            Err(e) => return Err(e),
        };
        match self.conn_mut(id)?.state {
            CmState::ReqSent
            | CmState::MraReqRcvd
            | CmState::RepRcvd
            | CmState::ReqRcvd
            | CmState::MraReqSent
            | CmState::RepSent
            | CmState::MraRepRcvd => {
                self.events.push_back(CmEvent::Rejected {
                    id: CommId(id),
                    reason: r.reason,
                    private_data: Box::new(r.private_data),
                });
                self.remove(id);
                Ok(())
            }
            _ => Err(CmDropReason::WrongState),
        }
    }

    fn on_rep(&mut self, src: IpAddr, tid: u64, r: &RepRepr) -> Result<(), CmDropReason> {
        if !self.conns.contains_key(&r.remote_comm_id) {
            // kernel cm_rep_handler: a REP for no connection gets REJ(invalid comm ID).
            self.send_rej(
                src,
                tid,
                r.remote_comm_id,
                r.local_comm_id,
                msg_ref::REP,
                CmReject::InvalidCommId,
            );
            return Ok(());
        }
        let id = self.lookup(src, r.remote_comm_id, r.local_comm_id)?;
        let c = self.conn_mut(id)?;
        match c.state {
            CmState::ReqSent | CmState::MraReqRcvd => {
                c.state = CmState::RepRcvd;
                c.remote_comm_id = r.local_comm_id;
                c.remote_qpn = r.local_qpn;
                c.deadline = None;
                c.last_sent = None;
                self.events.push_back(CmEvent::ConnectResponse {
                    id: CommId(id),
                    rep: Box::new(*r),
                });
                Ok(())
            }
            // kernel cm_dup_rep_handler: the RTU was lost; send it again.
            CmState::Established => {
                self.resend(id);
                Ok(())
            }
            CmState::RepRcvd => Err(CmDropReason::DuplicateRep),
            _ => Err(CmDropReason::WrongState),
        }
    }

    fn on_rtu(&mut self, src: IpAddr, r: &RtuRepr) -> Result<(), CmDropReason> {
        let id = self.lookup(src, r.remote_comm_id, r.local_comm_id)?;
        let c = self.conn_mut(id)?;
        match c.state {
            CmState::RepSent | CmState::MraRepRcvd => {
                c.state = CmState::Established;
                c.deadline = None;
                c.last_sent = None;
                self.events
                    .push_back(CmEvent::Established { id: CommId(id) });
                Ok(())
            }
            CmState::Established => Err(CmDropReason::DuplicateRtu),
            _ => Err(CmDropReason::WrongState),
        }
    }

    fn on_dreq(
        &mut self,
        now: Instant,
        src: IpAddr,
        tid: u64,
        r: &DreqRepr,
    ) -> Result<(), CmDropReason> {
        let drep_for = |local, remote| DrepRepr {
            local_comm_id: local,
            remote_comm_id: remote,
            private_data: [0; 224],
        };
        if !self.conns.contains_key(&r.remote_comm_id) {
            // kernel cm_dreq_handler -> cm_issue_drep: a DREQ for no connection gets a DREP.
            let drep = drep_for(r.remote_comm_id, r.local_comm_id);
            self.push_mad(src, tid, CmMsgRepr::Drep(drep));
            return Ok(());
        }
        let id = self.lookup(src, r.remote_comm_id, r.local_comm_id)?;
        let c = self.conn_mut(id)?;
        match c.state {
            CmState::Established | CmState::RepSent | CmState::MraRepRcvd | CmState::RepRcvd => {
                c.state = CmState::DreqRcvd;
                c.tid = tid;
                c.deadline = None;
                self.events
                    .push_back(CmEvent::Disconnected { id: CommId(id) });
                Ok(())
            }
            // Both sides sent a DREQ: answer, and wait out TIMEWAIT.
            CmState::DreqSent => {
                c.tid = tid;
                self.send(id, CmMsgRepr::Drep(drep_for(id, r.local_comm_id)), true);
                self.enter_timewait(now, id);
                self.events
                    .push_back(CmEvent::Disconnected { id: CommId(id) });
                Ok(())
            }
            // kernel cm_dreq_handler: in TIMEWAIT the DREP is sent again.
            CmState::Timewait => {
                let peer = c.peer;
                self.push_mad(peer, tid, CmMsgRepr::Drep(drep_for(id, r.local_comm_id)));
                self.counters.resends += 1;
                Ok(())
            }
            CmState::DreqRcvd => Err(CmDropReason::DuplicateDreq),
            _ => Err(CmDropReason::WrongState),
        }
    }

    fn on_drep(&mut self, now: Instant, src: IpAddr, r: &DrepRepr) -> Result<(), CmDropReason> {
        let id = self.lookup(src, r.remote_comm_id, r.local_comm_id)?;
        if self.conn_mut(id)?.state != CmState::DreqSent {
            return Err(CmDropReason::UnexpectedResponse);
        }
        self.enter_timewait(now, id);
        self.events
            .push_back(CmEvent::Disconnected { id: CommId(id) });
        Ok(())
    }

    fn on_sidr_req(
        &mut self,
        now: Instant,
        src: IpAddr,
        tid: u64,
        r: &SidrReqRepr,
    ) -> Result<(), CmDropReason> {
        if self.by_remote.contains_key(&(src, r.request_id)) {
            return Err(CmDropReason::DuplicateSidrReq);
        }
        let refuse = |why: CmReject| SidrRepRepr {
            request_id: r.request_id,
            status: why.sidr_status(),
            additional_info_length: 0,
            qpn: 0,
            service_id: r.service_id,
            qkey: 0,
            additional_info: [0; 72],
            private_data: [0; 136],
        };
        let Some(&backlog) = self.listens.get(&r.service_id) else {
            // kernel cm_sidr_req_handler: no listener -> SIDR_REP(unsupported).
            self.push_mad(src, tid, CmMsgRepr::SidrRep(refuse(CmReject::NoListener)));
            return Ok(());
        };
        if self.pending_requests(r.service_id) >= backlog {
            // kernel ucma_event_handler -> cm_destroy_id in SIDR_REQ_RCVD: IB_SIDR_REJECT.
            self.push_mad(src, tid, CmMsgRepr::SidrRep(refuse(CmReject::Consumer)));
            return Err(CmDropReason::BacklogFull);
        }
        let lifetime = self.request_lifetime(MAX_PEER_CM_RESPONSE_TIMEOUT, CMA_MAX_CM_RETRIES);
        let Ok(id) = self.new_conn(src, CmState::SidrReqRcvd) else {
            self.push_mad(src, tid, CmMsgRepr::SidrRep(refuse(CmReject::NoResources)));
            return Err(CmDropReason::TooManyConnections);
        };
        let c = self.conn_mut(id)?;
        c.remote_comm_id = r.request_id;
        c.service_id = r.service_id;
        c.tid = tid;
        c.registered = Some(r.request_id);
        // The requester sends no timeout: aged out as a REQ with the largest timeout and
        // rdma_cm's retries would be.
        c.deadline = Some(now + lifetime);
        self.by_remote.insert((src, r.request_id), id);
        self.events.push_back(CmEvent::SidrRequest {
            id: CommId(id),
            peer: src,
            req: Box::new(*r),
        });
        Ok(())
    }

    fn on_sidr_rep(&mut self, src: IpAddr, r: &SidrRepRepr) -> Result<(), CmDropReason> {
        let Some(c) = self.conns.get(&r.request_id) else {
            return Err(CmDropReason::UnknownCommId);
        };
        if c.peer != src {
            return Err(CmDropReason::WrongPeer);
        }
        if c.state != CmState::SidrReqSent {
            return Err(CmDropReason::UnexpectedResponse);
        }
        self.events.push_back(CmEvent::SidrResponse {
            id: CommId(r.request_id),
            rep: Box::new(*r),
        });
        self.remove(r.request_id);
        Ok(())
    }

    /// A timer of connection `id` is due.
    fn fire(&mut self, now: Instant, id: u32) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        c.deadline = None;
        let (state, retries_left) = (c.state, c.retries_left);
        let (peer, tid, remote) = (c.peer, c.tid, c.remote_comm_id);
        let resendable = matches!(
            state,
            CmState::ReqSent
                | CmState::MraReqRcvd
                | CmState::RepSent
                | CmState::MraRepRcvd
                | CmState::DreqSent
                | CmState::SidrReqSent
        );
        if resendable && retries_left > 0 {
            c.retries_left -= 1;
            c.deadline = Some(now + c.response_timeout);
            tracing::debug!(
                target: "softroce::cm",
                comm_id = %format_args!("{id:#x}"),
                %peer,
                "{state:?}: no answer within {:?}; sending again ({} retries left)",
                c.response_timeout,
                c.retries_left
            );
            self.counters.retransmits += 1;
            self.resend_raw(id);
            return;
        }
        if resendable || matches!(state, CmState::MraReqRcvd | CmState::MraRepRcvd) {
            tracing::info!(
                target: "softroce::cm",
                comm_id = %format_args!("{id:#x}"),
                %peer,
                "{state:?}: no answer from {peer} after all retries; giving up"
            );
        }
        match state {
            // IBTA C12: no REP after all retries: REJ(timeout), UNREACHABLE.
            CmState::ReqSent | CmState::MraReqRcvd => {
                self.send_rej(peer, tid, id, remote, msg_ref::REQ, CmReject::Timeout);
                self.events
                    .push_back(CmEvent::Unreachable { id: CommId(id) });
                self.remove(id);
            }
            // No RTU after all retries (kernel IB_CM_REP_ERROR -> cma UNREACHABLE).
            CmState::RepSent | CmState::MraRepRcvd => {
                self.send_rej(peer, tid, id, remote, msg_ref::REP, CmReject::Timeout);
                self.events
                    .push_back(CmEvent::Unreachable { id: CommId(id) });
                self.remove(id);
            }
            // No DREP after all retries: TIMEWAIT anyway (kernel IB_CM_DREQ_ERROR).
            CmState::DreqSent => {
                self.enter_timewait(now, id);
                self.events
                    .push_back(CmEvent::Disconnected { id: CommId(id) });
            }
            CmState::SidrReqSent => {
                self.events
                    .push_back(CmEvent::Unreachable { id: CommId(id) });
                self.remove(id);
            }
            // A request the application never answered: the peer has given up on it by now
            // (every try of its REQ's timeout, or of our MRA's). REJ(timeout) for the REQ in
            // case it still listens, Unreachable, gone.
            CmState::ReqRcvd | CmState::MraReqSent => {
                self.send_rej(peer, tid, id, remote, msg_ref::REQ, CmReject::Timeout);
                self.events
                    .push_back(CmEvent::Unreachable { id: CommId(id) });
                self.remove(id);
            }
            CmState::SidrReqRcvd => {
                self.events
                    .push_back(CmEvent::Unreachable { id: CommId(id) });
                self.remove(id);
            }
            CmState::Timewait => {
                self.events
                    .push_back(CmEvent::TimewaitExit { id: CommId(id) });
                self.remove(id);
            }
            _ => {}
        }
    }

    // ---- helpers ----

    pub(super) fn next_random(&mut self) -> u64 {
        self.rng.next_u64()
    }

    /// 2 × packet lifetime + 4.096 µs × 2^`exp` (kernel `cm.c`: `cm_convert_to_ms`).
    pub(super) fn response_timeout(&self, exp: u8) -> Duration {
        ib_time(self.config.packet_life_time) * 2 + ib_time(exp)
    }

    /// [`Self::response_timeout`] of an exponent a peer chose, capped at
    /// [`MAX_PEER_CM_RESPONSE_TIMEOUT`].
    pub(super) fn peer_response_timeout(&self, exp: u8) -> Duration {
        self.response_timeout(exp.min(MAX_PEER_CM_RESPONSE_TIMEOUT))
    }

    /// How long a peer that waits [`Self::peer_response_timeout`]`(exp)` for each of
    /// `retries` + 1 tries waits in all: how long a request it sent stays worth answering.
    pub(super) fn request_lifetime(&self, exp: u8, retries: u8) -> Duration {
        self.peer_response_timeout(exp) * (u32::from(retries.min(15)) + 1)
    }

    pub(super) fn new_conn(&mut self, peer: IpAddr, state: CmState) -> Result<u32, CmError> {
        if self.conns.len() >= self.config.max_connections {
            return Err(CmError::NoMem);
        }
        // Bounded: with fewer than max_connections IDs in use out of 2^32 - 1, a free random
        // ID is found at once in practice.
        for _ in 0..64 {
            let mut id = self.next_random() as u32;
            if let Some(slot) = self.config.comm_id_slot {
                id = (u32::from(slot) << 24) | (id & 0x00ff_ffff);
            }
            if id == 0 || self.conns.contains_key(&id) {
                continue;
            }
            self.conns.insert(
                id,
                Conn {
                    state,
                    peer,
                    remote_comm_id: 0,
                    tid: 0,
                    remote_qpn: 0,
                    service_id: 0,
                    last_sent: None,
                    deadline: None,
                    retries_left: 0,
                    response_timeout: Duration::ZERO,
                    max_cm_retries: 0,
                    registered: None,
                },
            );
            return Ok(id);
        }
        Err(CmError::NoMem)
    }

    /// The connection `id`, for a message handler. Errors: [`CmDropReason::UnknownCommId`]
    /// if there is none (the message is dropped and counted, never a panic: a table entry
    /// that names a connection already gone must not kill the thread driving the engine).
    pub(super) fn conn_mut(&mut self, id: u32) -> Result<&mut Conn, CmDropReason> {
        self.conns.get_mut(&id).ok_or(CmDropReason::UnknownCommId)
    }

    /// The connection `id`, for an API call. Errors: [`CmError::NoSuchId`].
    pub(super) fn conn_api(&mut self, id: CommId) -> Result<&mut Conn, CmError> {
        self.conns.get_mut(&id.0).ok_or(CmError::NoSuchId)
    }

    pub(super) fn expect_state(
        &self,
        id: CommId,
        op: &'static str,
        ok: &[CmState],
    ) -> Result<CmState, CmError> {
        let state = self.conns.get(&id.0).ok_or(CmError::NoSuchId)?.state;
        if ok.contains(&state) {
            Ok(state)
        } else {
            Err(CmError::InvalidState { op, state })
        }
    }

    /// The connection a message from `src` names: `our_id` is its remote comm ID field,
    /// `their_id` its local one.
    fn lookup(&self, src: IpAddr, our_id: u32, their_id: u32) -> Result<u32, CmDropReason> {
        let c = self.conns.get(&our_id).ok_or(CmDropReason::UnknownCommId)?;
        if c.peer != src || (c.remote_comm_id != 0 && their_id != 0 && c.remote_comm_id != their_id)
        {
            return Err(CmDropReason::WrongPeer);
        }
        Ok(our_id)
    }

    /// Queues `msg` on connection `id` with its TID; `remember` keeps it for resending.
    pub(super) fn send(&mut self, id: u32, msg: CmMsgRepr, remember: bool) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        let bytes = mad_bytes(c.tid, msg);
        let peer = c.peer;
        if remember {
            c.last_sent = Some(bytes.clone());
        }
        self.counters.mads_sent += 1;
        self.mads.push_back(MadTransmit {
            dst: peer,
            mad: bytes,
        });
    }

    /// Sends `msg`, keeps it, and arms the response timer with all retries.
    pub(super) fn send_and_arm(&mut self, now: Instant, id: u32, msg: CmMsgRepr) {
        self.send(id, msg, true);
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        c.deadline = Some(now + c.response_timeout);
        c.retries_left = c.max_cm_retries;
    }

    /// Sends the last message again because a duplicate asked for it.
    fn resend(&mut self, id: u32) {
        self.counters.resends += 1;
        self.resend_raw(id);
    }

    fn resend_raw(&mut self, id: u32) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        if let Some(bytes) = c.last_sent.clone() {
            let peer = c.peer;
            self.counters.mads_sent += 1;
            self.mads.push_back(MadTransmit {
                dst: peer,
                mad: bytes,
            });
        }
    }

    /// Queues a MAD that belongs to no connection.
    pub(super) fn push_mad(&mut self, dst: IpAddr, tid: u64, msg: CmMsgRepr) {
        let mad = mad_bytes(tid, msg);
        self.counters.mads_sent += 1;
        self.mads.push_back(MadTransmit { dst, mad });
    }

    /// Queues a REJ: the one place a REJ reason is chosen is [`CmReject::rej_reason`].
    pub(super) fn send_rej(
        &mut self,
        dst: IpAddr,
        tid: u64,
        local: u32,
        remote: u32,
        which: u8,
        why: CmReject,
    ) {
        self.send_rej_pd(dst, tid, local, remote, which, why, [0; 148]);
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn send_rej_pd(
        &mut self,
        dst: IpAddr,
        tid: u64,
        local: u32,
        remote: u32,
        which: u8,
        why: CmReject,
        private_data: [u8; 148],
    ) {
        let rej = RejRepr {
            local_comm_id: local,
            remote_comm_id: remote,
            message_rejected: which,
            rejected_info_length: 0,
            reason: why.rej_reason(),
            ari: [0; 72],
            private_data,
        };
        self.counters.rejects_sent += 1;
        self.push_mad(dst, tid, CmMsgRepr::Rej(rej));
    }

    pub(super) fn enter_timewait(&mut self, now: Instant, id: u32) {
        let wait = ib_time(self.config.packet_life_time.saturating_add(1));
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        c.state = CmState::Timewait;
        c.deadline = Some(now + wait);
        c.retries_left = 0;
    }

    pub(super) fn remove(&mut self, id: u32) {
        if let Some(c) = self.conns.remove(&id)
            && let Some(key) = c.registered
        {
            self.by_remote.remove(&(c.peer, key));
        }
    }
}
