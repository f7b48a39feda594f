//! The CM's MAD agent hooked to a device's QP1: [`CmPort`] keeps receives posted on the GSI
//! QP (through its [`MadRing`]), feeds every received MAD (GRH stripped, source address read from it) to the
//! [`MadAgent`], and sends the MADs the CM engine queues as UD SENDs to the peer's QP1 (the
//! GSI Q_Key goes on the wire). It opens no socket and reads no clock: the caller passes `now`
//! and calls [`CmPort::process`] when QP1 has completions or the CM timer is due, as a
//! frontend (librdmacm.so.1, the Rust API) does from its event loop.
//!
//! QP1 belongs to the port once it is made: nothing else should post on it.
//! Source: kernel `drivers/infiniband/core/mad.c` (the MAD agent on QP1, receive ring,
//! `ib_post_send_mad`), `cm.c` `cm_create_response_msg_ah` (answers go to the sender).

use super::mad_ring::{MadCompletion, MadRing};
use super::{Cq, Device, Gid, PathMtu, RcConnect, Result, Wc};
use crate::cm::rdma_cm::RDMA_CM_MIN_RNR_TIMER;
use crate::cm::{CMA_IBOE_PACKET_LIFETIME, CmEngine, MadAgent, MadTransmit, cm_ack_timeout};
use crate::transport::Instant;
use crate::wire::cm::{RepRepr, ReqRepr};
use crate::wire::grh::grh_source;
use core::net::{IpAddr, Ipv4Addr};
use std::collections::VecDeque;

/// QP1 of a device driving a CM engine. See the module documentation.
#[derive(Debug)]
pub struct CmPort {
    /// The device, for what its link learns of unreachable peers.
    dev: Device,
    ring: MadRing,
    cq: Cq,
    backlog: VecDeque<MadTransmit>,
    agent: MadAgent,
    /// Receives that completed in error (QP1 flushed): not reposted.
    recv_errors: u64,
}

impl CmPort {
    /// Takes over `dev`'s QP1 for `cm`: its [`MadRing`] (buffers in the GSI PD,
    /// [`CM_PORT_RECV_SLOTS`](super::CM_PORT_RECV_SLOTS) receives posted).
    /// Errors: those of `reg_mr` and `post_recv` (e.g. QP1 not in a state to receive).
    pub fn new(dev: &Device, cm: CmEngine) -> Result<CmPort> {
        Ok(CmPort {
            dev: dev.clone(),
            ring: MadRing::new(dev)?,
            cq: dev.gsi_cq(),
            backlog: VecDeque::new(),
            agent: MadAgent::new(cm),
            recv_errors: 0,
        })
    }

    /// The CM engine (listen, connect, accept, … and `poll_event`).
    pub fn cm(&mut self) -> &mut CmEngine {
        &mut self.agent.cm
    }

    /// The MAD agent (its drop counts).
    pub fn agent(&self) -> &MadAgent {
        &self.agent
    }

    /// Receives that completed in error and were not reposted.
    pub fn recv_errors(&self) -> u64 {
        self.recv_errors
    }

    /// When `process` must run at the latest (the CM's next timer), if ever.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.agent.poll_timeout()
    }

    /// Moves everything that is ready: QP1 completions into the agent (receives reposted,
    /// send slots freed), the peers the network said are unreachable (ICMP, through the
    /// device's link) into the CM, due CM timers, and queued MADs onto QP1's send queue.
    /// Errors: those of `post_recv`/`post_send` on QP1.
    pub fn process(&mut self, now: Instant) -> Result<()> {
        while let Some(peer) = self.dev.poll_unreachable() {
            self.agent.cm.handle_unreachable(now, peer);
        }
        let mut wcs = [Wc::default(); 32];
        loop {
            let n = self.cq.poll(&mut wcs);
            self.handle_completions(now, &wcs[..n])?;
            if n < wcs.len() {
                break;
            }
        }
        if self.agent.poll_timeout().is_some_and(|t| t <= now) {
            self.agent.handle_timeout(now);
        }
        while let Some(m) = self.agent.poll_mad() {
            self.backlog.push_back(m);
        }
        while !self.backlog.is_empty() && self.ring.can_send() {
            let Some(m) = self.backlog.pop_front() else {
                break;
            };
            self.ring.send(m.dst, &m.mad[..])?;
        }
        Ok(())
    }

    /// Hands QP1 completions taken from its CQ by someone else (a driver thread waiting on
    /// [`Device::gsi_cq`]) to the agent, as [`CmPort::process`] does with those it polls;
    /// call `process` after. Errors: as `process`; a completion of a work request the port
    /// did not post is `EINVAL`.
    pub fn handle_completions(&mut self, now: Instant, wcs: &[Wc]) -> Result<()> {
        for wc in wcs {
            let agent = &mut self.agent;
            let done = self
                .ring
                .handle_completion(wc, |area| match grh_source(area) {
                    Some(src) => agent.handle_recv(now, src, area),
                    // Shorter than a GRH: the agent counts it as truncated.
                    None => agent.handle_mad(now, IpAddr::V4(Ipv4Addr::UNSPECIFIED), &[]),
                })?;
            if done == MadCompletion::RecvFailed {
                self.recv_errors += 1;
            }
        }
        Ok(())
    }
}

/// The QP attributes rdma_cm gives an RC QP from the CM exchange, for `Qp::connect_rc` (or
/// the same values through `ibv_modify_qp`, as librdmacm.so.1 applies them).
/// Source: rdma-core `librdmacm/cma.c` `ucma_modify_qp_rtr` / `ucma_modify_qp_rts` (the
/// kernel's `rdma_init_qp_attr`: `cm_init_qp_rtr_attr` / `cm_init_qp_rts_attr`).
impl RcConnect {
    /// Passive side, before its REP: towards the REQ's QP (`dest_qp_num` = its
    /// `local_qpn`) at `peer`, path MTU the smaller of `port_mtu` and the REQ's, the REQ's
    /// flow label, retry and RNR retry counts, ACK timeout the REQ's local ACK timeout (at
    /// least 1; kernel `cm_format_path_from_req`, `cm_init_av_by_path`); `max_dest_rd_atomic` =
    /// `responder_resources` (what our REP announces), `max_rd_atomic` = `initiator_depth`
    /// bounded by the REQ's responder resources. PSNs as the kernel's CM sets them (cm.c
    /// `cm_req_handler`, `ib_send_cm_rep`): a CM message's starting PSN is the one its sender
    /// receives from, so we send from the REQ's `starting_psn` (`sq_psn`) and receive from
    /// `rep_psn`, the starting PSN our REP announces (`rq_psn`; capture 30-rping: the client's
    /// first SEND carries the REP's PSN). RNR timer [`RDMA_CM_MIN_RNR_TIMER`].
    pub fn rdma_cm_passive(
        req: &ReqRepr,
        peer: core::net::IpAddr,
        port_mtu: PathMtu,
        responder_resources: u8,
        initiator_depth: u8,
        rep_psn: u32,
    ) -> RcConnect {
        let path_mtu = PathMtu::from_ibv(req.path_mtu).map_or(port_mtu, |m| m.min(port_mtu));
        RcConnect {
            path_mtu,
            // cm.c: the path's packet lifetime is the REQ's local ACK timeout − 1 (not
            // below 0), the timeout one more.
            timeout: req.primary_path.local_ack_timeout.max(1),
            retry_cnt: req.retry_count & 7,
            rnr_retry: req.rnr_retry_count & 7,
            min_rnr_timer: RDMA_CM_MIN_RNR_TIMER,
            max_rd_atomic: initiator_depth.min(req.responder_resources),
            max_dest_rd_atomic: responder_resources,
            flow_label: req.primary_path.flow_label,
            ..RcConnect::new(req.local_qpn, Gid::from_ip(peer), rep_psn, req.starting_psn)
        }
    }

    /// Active side, on the REP: towards the REP's QP (`dest_qp_num` = its `local_qpn`) at
    /// `peer`, with the `path_mtu`, `retry_cnt` and `responder_resources`
    /// (`max_dest_rd_atomic`) our REQ announced, `max_rd_atomic` = `initiator_depth` bounded
    /// by the REP's responder resources, the REP's RNR retry count, ACK timeout
    /// `cm_ack_timeout(REP's target ACK delay, CMA_IBOE_PACKET_LIFETIME)` (kernel
    /// `cm_rep_handler`: 17 with an rxe peer's 15, as `cm::rdma_cm::RDMA_CM_LOCAL_ACK_TIMEOUT`), RNR timer
    /// [`RDMA_CM_MIN_RNR_TIMER`]. PSNs as the
    /// kernel's CM sets them (cm.c `ib_send_cm_req`, `cm_rep_handler`): we receive from
    /// `req_psn`, the starting PSN our REQ announced (`rq_psn`), and send from the REP's
    /// `starting_psn` (`sq_psn`).
    pub fn rdma_cm_active(
        rep: &RepRepr,
        peer: core::net::IpAddr,
        path_mtu: PathMtu,
        responder_resources: u8,
        initiator_depth: u8,
        retry_cnt: u8,
        req_psn: u32,
    ) -> RcConnect {
        RcConnect {
            path_mtu,
            timeout: cm_ack_timeout(rep.target_ack_delay, CMA_IBOE_PACKET_LIFETIME),
            retry_cnt: retry_cnt & 7,
            rnr_retry: rep.rnr_retry_count & 7,
            min_rnr_timer: RDMA_CM_MIN_RNR_TIMER,
            max_rd_atomic: initiator_depth.min(rep.responder_resources),
            max_dest_rd_atomic: responder_resources,
            ..RcConnect::new(rep.local_qpn, Gid::from_ip(peer), req_psn, rep.starting_psn)
        }
    }
}
