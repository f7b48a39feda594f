//! Queue pairs (`ibv_qp`): creation, `ibv_modify_qp`, posting, multicast attach and the
//! RESET→RTS shortcuts, plus the UDP source ports rxe gives a QP. Source: rxe `rxe_qp.c`,
//! `rxe_mcast.c`.

use super::base::{
    Device, GSI_QPN, MAX_MCAST_GRP, MAX_MCAST_QP_ATTACH, MAX_QP, MAX_QP_WR, MAX_SGE, QpSlot, State,
};
use super::cq::Cq;
use super::modify::{AhAttr, QpAttrMask as A};
use super::pd::Pd;
use super::srq::Srq;
use super::{Error, ErrorKind, Gid, QpAttr, QpAttrMask, QpQuery, Result};
use crate::transport::{
    AccessFlags, Counters, Path, PathMtu, PostError, QpCap, QpEngine, QpState, QpType, RecvWr,
    SendWr,
};
use std::net::IpAddr;

/// What `modify_qp` says of an address vector whose `sgid_index` names the link-local GID
/// (index 0, as on kernel rxe), which a softroce device does not send from: its sockets are
/// bound to the device address, GID 1. The error is EINVAL, as on rxe for a GID that cannot
/// be used; frontends recognise it by this text to name the fix.
pub const LINK_LOCAL_SGID: &str =
    "sgid_index names the link-local GID, which this device does not send from (use 1)";
/// The UDP source port rxe gives a QP at creation: `0xC000 + hash_32(qpn, 14)`, where
/// `hash_32(v, 14) = (v × 0x61C88647 mod 2^32) >> 18`. Source: rxe `rxe_qp.c`
/// `rxe_qp_init_req`; Linux `include/linux/hash.h`. Example: QPN 0x13 → 0xD078.
pub const fn rxe_initial_udp_sport(qpn: u32) -> u16 {
    0xc000 + ((qpn.wrapping_mul(0x61c8_8647) >> 18) & 0x3fff) as u16
}

/// The UDP source port rxe uses for an RC/UC QP once its address vector is set:
/// `rdma_get_udp_sport(flow_label, lqpn, dqpn)`; a zero flow label is first derived from the
/// product of the two QPNs, so both directions of a connection share one port.
/// Source: Linux `include/rdma/ib_verbs.h` (`rdma_calc_flow_label`, `rdma_flow_label_to_udp_sport`).
/// Example: QPN 0x18 ↔ 0x18 → 0xC240.
pub fn rdma_get_udp_sport(flow_label: u32, lqpn: u32, rqpn: u32) -> u16 {
    let fl = if flow_label == 0 {
        let v = u64::from(lqpn) * u64::from(rqpn);
        ((v ^ (v >> 20) ^ (v >> 40)) & 0x000f_ffff) as u32
    } else {
        flow_label & 0x000f_ffff
    };
    let fl_low = fl & 0x3fff;
    let fl_high = (fl >> 14) & 0x3f;
    ((fl_low ^ fl_high) | 0xc000) as u16
}

impl Pd {
    /// `ibv_create_qp` for RC, UC and UD QPs. A UD QP sends from UDP source port
    /// `0xC000 + hash_32(qpn, 14)` (rxe) with the port's active MTU. The send queue's
    /// capacities are sized as rxe sizes a WQE ([`Qp::cap`] gives the result): one WQE
    /// holds `max(max_send_sge × 16, max_inline_data)` bytes, which become both
    /// `max_inline_data` and `max_send_sge × 16` (a QP with one send SGE takes 16 bytes
    /// inline). Errors: `EINVAL` for capacities over the device limits; `ENOMEM` past the
    /// QP limit. Source: rxe `rxe_qp.c` (`rxe_qp_chk_cap`, `rxe_qp_init_req`).
    pub fn create_qp(&self, init: &QpInitAttr<'_>) -> Result<Qp> {
        let mut c = init.cap;
        // A QP may have no send queue (max_send_wr 0), as rxe's `rxe_qp_chk_cap` allows: a
        // receive-only side (qperf's rc_bw server) posts nothing; its post_send is refused
        // as a full queue.
        if c.max_send_wr > MAX_QP_WR || c.max_recv_wr > MAX_QP_WR {
            return Err(Error::new(
                ErrorKind::Inval,
                format!(
                    "create_qp: max_send_wr {} / max_recv_wr {} out of range (each \
                     0..={MAX_QP_WR}, max_qp_wr)",
                    c.max_send_wr, c.max_recv_wr
                ),
            ));
        }
        if c.max_send_sge > MAX_SGE || c.max_recv_sge > MAX_SGE {
            return Err(Error::new(
                ErrorKind::Inval,
                format!(
                    "create_qp: max_send_sge {} / max_recv_sge {} out of range (at most \
                     {MAX_SGE}, max_sge)",
                    c.max_send_sge, c.max_recv_sge
                ),
            ));
        }
        if c.max_inline_data > crate::transport::MAX_INLINE_DATA {
            return Err(Error::new(
                ErrorKind::Inval,
                "create_qp: max_inline_data over 512",
            ));
        }
        // rxe `rxe_qp_init_req`: the WQE's data area is the larger of the SGE list (16 bytes
        // per `struct ib_sge`) and the inline data; the caller gets both back at that size.
        let wqe_data_bytes = (c.max_send_sge * SGE_BYTES).max(c.max_inline_data);
        c.max_send_sge = wqe_data_bytes / SGE_BYTES;
        c.max_inline_data = wqe_data_bytes;
        let mut st = self.dev.shared.state.lock();
        if st.qps.len() >= MAX_QP as usize {
            return Err(Error::new(ErrorKind::NoMem, "create_qp: too many QPs"));
        }
        let (first, last) = self.dev.shared.cfg.qpn_range();
        if st.qps.len() as u32 > last - first {
            return Err(Error::new(ErrorKind::NoMem, "create_qp: no QPN left"));
        }
        let next = |q: u32| if q >= last { first } else { q + 1 };
        let mut qpn = st.next_qpn.clamp(first, last);
        while st.qps.contains_key(&qpn) {
            qpn = next(qpn);
        }
        st.next_qpn = next(qpn);
        if init.srq.is_some() {
            // No receive queue of its own: ibv_create_qp reports its receive capacities as 0.
            c.max_recv_wr = 0;
            c.max_recv_sge = 0;
        }
        let mut engine = QpEngine::new(qpn, init.qp_type, self.handle, c, init.sq_sig_all);
        engine.set_gather(self.dev.shared.link.gathers());
        if let Some(srq) = init.srq {
            if !srq.same_device(&self.dev) {
                return Err(Error::new(
                    ErrorKind::Inval,
                    "create_qp: SRQ of another device",
                ));
            }
            st.srqs.attach(qpn, srq.srq_num())?;
            engine.attach_srq();
        }
        if init.qp_type == QpType::Ud {
            // UD has no address vector: the source is fixed at creation, each WR names its
            // destination. rxe keeps the creation-time source port for UD and GSI QPs.
            let ip = self.dev.shared.cfg.ip;
            let src_port = self.dev.shared.link.source_port(rxe_initial_udp_sport(qpn));
            engine.set_path(Path {
                local: ip,
                remote: ip,
                src_port,
                ip: crate::transport::IpFields::default(),
            });
            engine.set_datagram_path_mtu(self.dev.shared.cfg.active_mtu);
        }
        st.qps.insert(
            qpn,
            QpSlot::new(
                engine,
                init.send_cq.shared.clone(),
                init.recv_cq.shared.clone(),
            ),
        );
        Ok(Qp {
            dev: self.dev.clone(),
            qpn,
            cap: c,
            sq_sig_all: init.sq_sig_all,
        })
    }
}

/// Size of one `struct ib_sge` in an rxe send WQE, in bytes (the unit rxe sizes a WQE's
/// data area in).
const SGE_BYTES: u32 = 16;

/// QP creation attributes (`struct ibv_qp_init_attr`).
#[derive(Clone, Copy)]
pub struct QpInitAttr<'a> {
    /// Transport type.
    pub qp_type: QpType,
    /// CQ for send completions.
    pub send_cq: &'a Cq,
    /// CQ for receive completions.
    pub recv_cq: &'a Cq,
    /// Queue sizes.
    pub cap: QpCap,
    /// Signal every send WR (`sq_sig_all`).
    pub sq_sig_all: bool,
    /// The shared receive queue the QP takes its receive WQEs from (`srq`); `None` for its
    /// own receive queue. With an SRQ, `cap.max_recv_wr`/`max_recv_sge` are ignored (the
    /// QP's [`Qp::cap`] says 0) and [`Qp::post_recv`] fails with `EINVAL`.
    pub srq: Option<&'a Srq>,
}

/// A queue pair. Dropping it destroys it (outstanding work is discarded).
#[derive(Debug)]
pub struct Qp {
    pub(super) dev: Device,
    pub(super) qpn: u32,
    /// The engine's capacities and `sq_sig_all`, which no call changes after creation (read
    /// here without the device lock, on every post).
    pub(super) cap: QpCap,
    pub(super) sq_sig_all: bool,
}

impl Qp {
    /// QP number.
    pub fn qp_num(&self) -> u32 {
        self.qpn
    }

    /// Transport type.
    pub fn qp_type(&self) -> QpType {
        let st = self.dev.shared.state.lock();
        st.qps
            .get(&self.qpn)
            .map_or(QpType::Rc, |s| s.engine.qp_type())
    }

    /// The capacities the QP was created with, as [`Pd::create_qp`] sized them
    /// (`ibv_create_qp` writes them back into `init_attr->cap`; `ibv_query_qp` reports them).
    /// With an SRQ the receive capacities are 0.
    pub fn cap(&self) -> QpCap {
        self.cap
    }

    /// Whether every send WR completes with a CQE, whatever its `SIGNALED` flag
    /// (`sq_sig_all` at creation; `ibv_query_qp` reports it).
    pub fn sq_sig_all(&self) -> bool {
        self.sq_sig_all
    }

    /// Current state.
    pub fn state(&self) -> QpState {
        let st = self.dev.shared.state.lock();
        st.qps
            .get(&self.qpn)
            .map_or(QpState::Err, |s| s.engine.state())
    }

    /// `ibv_query_qp`: the attributes as `modify_qp` last set them, and the state now.
    /// Errors: `ENOENT` once the QP is destroyed (not reachable through a live `Qp`).
    pub fn query(&self) -> Result<QpQuery> {
        let st = self.dev.shared.state.lock();
        let slot = st
            .qps
            .get(&self.qpn)
            .ok_or_else(|| Error::new(ErrorKind::NoEnt, "query_qp: QP destroyed"))?;
        let mut q = slot.query;
        let state = slot.engine.state();
        q.attr.qp_state = state;
        q.attr.cur_qp_state = state;
        Ok(q)
    }

    /// This QP's counters.
    pub fn counters(&self) -> Counters {
        let st = self.dev.shared.state.lock();
        st.qps
            .get(&self.qpn)
            .map(|s| s.engine.counters().clone())
            .unwrap_or_default()
    }

    /// `ibv_modify_qp`: applies the attributes named in `mask` and moves to
    /// `attr.qp_state` when `mask` has STATE. The whole call is checked against the
    /// transition table before anything changes.
    ///
    /// Errors: `EINVAL` naming the transition and the missing or forbidden attribute, an
    /// out-of-range value, an unknown source GID index, or a destination GID of another IP
    /// family than the device's.
    pub fn modify(&self, attr: &QpAttr, mask: QpAttrMask) -> Result<()> {
        let mut st = self.dev.shared.state.lock();
        let slot = st
            .qps
            .get_mut(&self.qpn)
            .ok_or_else(|| Error::new(ErrorKind::NoEnt, "modify_qp: QP destroyed"))?;
        let e = &mut slot.engine;
        let mut m = attr.to_modify();
        let new = e.check_modify(&m, mask)?;
        if mask.contains(A::AV) {
            // Named as the engine names its errors: "modify_qp INIT->RTR: …".
            let refused = |why: &str| {
                Error::new(
                    ErrorKind::Inval,
                    format!("modify_qp {}->{}: {why}", e.state().name(), new.name()),
                )
            };
            let ah = &attr.ah_attr;
            let local = self
                .dev
                .shared
                .gids
                .get(usize::from(ah.sgid_index))
                .ok_or_else(|| refused("sgid_index past the GID table"))?;
            let remote = ah.dgid.ip();
            // Index 1 is the device's own address (IPv4-mapped or IPv6). Index 0, the
            // link-local GID derived from the MAC, names no address the device's sockets are
            // bound to, so nothing could be sent from it with a correct ICRC.
            if local.gid != Gid::from_ip(self.dev.shared.cfg.ip) {
                return Err(refused(LINK_LOCAL_SGID));
            }
            let local_ip = self.dev.shared.cfg.ip;
            if remote.is_ipv4() != local_ip.is_ipv4() {
                return Err(refused("dgid and sgid are of different IP families"));
            }
            let dqpn = if mask.contains(A::DEST_QPN) {
                attr.dest_qp_num
            } else {
                e.attrs().dest_qp_num
            };
            let want = rdma_get_udp_sport(ah.flow_label, self.qpn, dqpn);
            let src_port = self.dev.shared.link.source_port(want);
            m.path = Some(Path {
                local: local_ip,
                remote,
                src_port,
                ip: ah.ip_fields(),
            });
        }
        // Everything checked: the engine checks again and commits.
        e.modify(&m, mask)?;
        slot.query.keep(attr, mask);
        let now = self.dev.now();
        self.dev.pump(&mut st, self.qpn, now);
        Ok(())
    }

    /// `ibv_post_send`: queues the work requests in order and transmits what the window
    /// allows at once. IBV_SEND_INLINE data is copied before this returns; REG_MR, LOCAL_INV
    /// and BIND_MW run when the requester reaches them (LOCAL_INV once every earlier WR has
    /// completed). Errors (with `bad_wr` = index of the first refused WR; those before
    /// it were posted): `EINVAL` before RTS or for an invalid WR, `ENOMEM` when the send
    /// queue is full, `EOPNOTSUPP` for an opcode the QP type cannot carry.
    pub fn post_send(&self, wrs: &[SendWr]) -> Result<()> {
        let now = self.dev.now();
        let mut st = self.dev.shared.state.lock();
        let State { mrs, qps, .. } = &mut *st;
        let slot = qps
            .get_mut(&self.qpn)
            .ok_or_else(|| Error::new(ErrorKind::NoEnt, "post_send: QP destroyed"))?;
        let defer = self.may_defer(slot);
        let mut result = Ok(());
        for (i, wr) in wrs.iter().enumerate() {
            if let Err(e) = slot.engine.post_send_mem(wr.clone(), mrs) {
                result = Err(post_error("post_send", e, slot.engine.state()).at_wr(i));
                break;
            }
        }
        self.ring(&mut st, defer, now);
        result
    }

    /// Whether this post may leave its transmit to the next poll (doorbell batching): only
    /// on a busy-polled device (every CQ poll transmits what waits, `Device::pump_deferred`)
    /// and only while earlier WRs of the QP are outstanding, whose ACK also transmits it.
    /// A post to an idle QP (a ping-pong) leaves at once. perftest's `ib_write_bw` posts
    /// one WR per `ibv_post_send` and then polls: the WRs of a window leave in one batch.
    fn may_defer(&self, slot: &super::base::QpSlot) -> bool {
        self.dev.shared.poll_hook.get().is_some() && slot.engine.sq_outstanding() > 0
    }

    /// After posting: transmits now, or leaves it to the next poll ([`Qp::may_defer`]).
    fn ring(
        &self,
        st: &mut parking_lot::MutexGuard<'_, State>,
        defer: bool,
        now: crate::transport::Instant,
    ) {
        if defer {
            if !st.deferred.contains(&self.qpn) {
                st.deferred.push(self.qpn);
            }
            self.dev
                .shared
                .any_deferred
                .store(true, std::sync::atomic::Ordering::Release);
            return;
        }
        self.dev.pump(st, self.qpn, now);
        self.dev.shared.link.wake();
    }

    /// [`Qp::post_send`] for a C frontend: `inline[i]`, when given, is the data of WR `i`'s
    /// SGEs already read from the program's memory (IBV_SEND_INLINE from a buffer that
    /// need not be registered, as with libibverbs); other WRs are posted as by
    /// [`Qp::post_send`]. Errors as [`Qp::post_send`].
    pub fn post_send_gathered(&self, wrs: &[SendWr], inline: Vec<Option<Vec<u8>>>) -> Result<()> {
        let now = self.dev.now();
        let mut st = self.dev.shared.state.lock();
        let State { mrs, qps, .. } = &mut *st;
        let slot = qps
            .get_mut(&self.qpn)
            .ok_or_else(|| Error::new(ErrorKind::NoEnt, "post_send: QP destroyed"))?;
        let defer = self.may_defer(slot);
        let mut result = Ok(());
        let mut inline = inline.into_iter();
        for (i, wr) in wrs.iter().enumerate() {
            let r = match inline.next().flatten() {
                Some(data) => slot.engine.post_send_gathered(wr.clone(), data),
                None => slot.engine.post_send_mem(wr.clone(), mrs),
            };
            if let Err(e) = r {
                result = Err(post_error("post_send", e, slot.engine.state()).at_wr(i));
                break;
            }
        }
        self.ring(&mut st, defer, now);
        result
    }

    /// `ibv_post_recv`. Errors as [`Qp::post_send`] (RESET refuses; INIT and later accept).
    pub fn post_recv(&self, wrs: &[RecvWr]) -> Result<()> {
        let now = self.dev.now();
        let mut st = self.dev.shared.state.lock();
        let slot = st
            .qps
            .get_mut(&self.qpn)
            .ok_or_else(|| Error::new(ErrorKind::NoEnt, "post_recv: QP destroyed"))?;
        let mut result = Ok(());
        for (i, wr) in wrs.iter().enumerate() {
            if let Err(e) = slot.engine.post_recv(wr.clone()) {
                result = Err(post_error("post_recv", e, slot.engine.state()).at_wr(i));
                break;
            }
        }
        self.dev.pump(&mut st, self.qpn, now);
        result
    }
}

impl Qp {
    /// `ibv_attach_mcast`: this UD QP receives the datagrams sent to multicast group `gid`
    /// (DestQP 0xFFFFFF, the QP's own Q_Key). The first QP of the device to attach makes the
    /// link join the group (the UDP link joins the IP group on the device's interface);
    /// attaching twice is a no-op, as in rxe. `lid` is ignored (RoCE has no LIDs).
    ///
    /// Errors: `EINVAL` for a QP that is not UD (GSI included, as ib_core) or a GID that is
    /// not multicast or not of the device's IP family; `ENOMEM` past 8192 groups per
    /// device or 56 QPs per group (rxe's limits); `EIO` when the link cannot join.
    /// Source: ib_core `ib_attach_mcast`; rxe `rxe_mcast.c` `rxe_attach_mcast`.
    pub fn attach_mcast(&self, gid: &Gid, lid: u16) -> Result<()> {
        let _ = lid;
        let group = self.mcast_group("attach_mcast", gid)?;
        let mut st = self.dev.shared.state.lock();
        let n_groups = st.mcast.len();
        let members = st.mcast.get(&group);
        if members.is_some_and(|m| m.contains(&self.qpn)) {
            return Ok(());
        }
        if members.is_none() && n_groups >= MAX_MCAST_GRP {
            return Err(Error::new(
                ErrorKind::NoMem,
                "attach_mcast: too many groups",
            ));
        }
        if members.is_some_and(|m| m.len() >= MAX_MCAST_QP_ATTACH) {
            return Err(Error::new(
                ErrorKind::NoMem,
                "attach_mcast: too many QPs in the group",
            ));
        }
        if members.is_none() {
            self.dev.shared.link.join_multicast(group).map_err(|e| {
                Error::new(ErrorKind::Io, format!("attach_mcast: joining {group}: {e}"))
            })?;
        }
        st.mcast.entry(group).or_default().push(self.qpn);
        Ok(())
    }

    /// `ibv_detach_mcast`: stops delivering `gid`'s datagrams to this QP; the last QP of the
    /// device to detach makes the link leave the group. Errors: `EINVAL` as
    /// [`Qp::attach_mcast`], and for a QP not attached to `gid` (rxe).
    pub fn detach_mcast(&self, gid: &Gid, lid: u16) -> Result<()> {
        let _ = lid;
        let group = self.mcast_group("detach_mcast", gid)?;
        let mut st = self.dev.shared.state.lock();
        if !self.dev.detach_locked(&mut st, group, self.qpn) {
            return Err(Error::new(
                ErrorKind::Inval,
                "detach_mcast: QP not attached to that group",
            ));
        }
        Ok(())
    }

    /// The group address of a valid attach/detach of this QP to `gid`.
    fn mcast_group(&self, call: &'static str, gid: &Gid) -> Result<IpAddr> {
        if self.qp_type() != QpType::Ud {
            return Err(Error::new(
                ErrorKind::Inval,
                format!("{call}: only UD QPs join multicast groups"),
            ));
        }
        if !gid.is_multicast() {
            return Err(Error::new(
                ErrorKind::Inval,
                format!("{call}: {gid} is not a multicast GID"),
            ));
        }
        let group = gid.ip();
        if group.is_ipv4() != self.dev.shared.cfg.ip.is_ipv4() {
            return Err(Error::new(
                ErrorKind::Inval,
                format!("{call}: {gid} is of another IP family than the device"),
            ));
        }
        Ok(group)
    }
}

impl Device {
    /// Removes `qpn` from `group`; leaves the group when it was the last member. Returns
    /// whether it was attached.
    pub(super) fn detach_locked(&self, st: &mut State, group: IpAddr, qpn: u32) -> bool {
        let Some(members) = st.mcast.get_mut(&group) else {
            return false;
        };
        let before = members.len();
        members.retain(|q| *q != qpn);
        let was = members.len() != before;
        if members.is_empty() {
            st.mcast.remove(&group);
            self.shared.link.leave_multicast(group);
        }
        was
    }

    /// The QPNs attached to multicast group `gid`, in attach order.
    pub fn mcast_members(&self, gid: &Gid) -> Vec<u32> {
        let st = self.shared.state.lock();
        st.mcast.get(&gid.ip()).cloned().unwrap_or_default()
    }
}

/// Everything needed to take an RC or UC QP to RTS in one call (see [`Qp::connect_rc`]), the
/// one connect sequence every frontend uses (the CLI's pingpong, perf and target, the
/// `ibverbs`-shaped API). Field names are the `ibv_qp_attr` / `ibv_ah_attr` ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RcConnect {
    /// The peer's QPN.
    pub dest_qp_num: u32,
    /// The peer's GID.
    pub dgid: Gid,
    /// Index of the local GID to send from (1: the RoCE v2 GID of the device address).
    pub sgid_index: u8,
    /// IPv4 TTL / IPv6 hop limit of the QP's packets.
    pub hop_limit: u8,
    /// IPv4 TOS / IPv6 traffic class of the QP's packets (DSCP << 2 | ECN).
    pub traffic_class: u8,
    /// The first PSN the peer sends (our `rq_psn`).
    pub rq_psn: u32,
    /// The first PSN we send.
    pub sq_psn: u32,
    /// Path MTU (both sides must agree).
    pub path_mtu: PathMtu,
    /// Remote access this QP allows (set at INIT; a QP already in INIT keeps its own).
    pub qp_access_flags: AccessFlags,
    /// ACK timeout exponent (14 ≈ 67 ms).
    pub timeout: u8,
    /// Retries on timeout.
    pub retry_cnt: u8,
    /// Retries on RNR NAK (7 = forever).
    pub rnr_retry: u8,
    /// RNR timer code we send (12 = 0.64 ms).
    pub min_rnr_timer: u8,
    /// Outstanding READ/atomics we issue (`max_rd_atomic`).
    pub max_rd_atomic: u8,
    /// Outstanding READ/atomics we accept (`max_dest_rd_atomic`).
    pub max_dest_rd_atomic: u8,
    /// Flow label of the QP's packets (`ah_attr.grh.flow_label`, 20 bits); 0: none.
    pub flow_label: u32,
}

impl RcConnect {
    /// The settings rdma-core's `ibv_rc_pingpong` uses, towards `dest_qp_num` at `dgid`, from
    /// GID index 1 with hop limit 64 and traffic class 0.
    pub fn new(dest_qp_num: u32, dgid: Gid, rq_psn: u32, sq_psn: u32) -> RcConnect {
        RcConnect {
            dest_qp_num,
            dgid,
            sgid_index: 1,
            hop_limit: 64,
            traffic_class: 0,
            rq_psn,
            sq_psn,
            path_mtu: PathMtu::Mtu1024,
            qp_access_flags: AccessFlags::LOCAL_WRITE
                | AccessFlags::REMOTE_WRITE
                | AccessFlags::REMOTE_READ
                | AccessFlags::REMOTE_ATOMIC,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 12,
            max_rd_atomic: 1,
            max_dest_rd_atomic: 1,
            flow_label: 0,
        }
    }
}

impl Qp {
    /// Takes an RC QP to RTS with `ibv_modify_qp`, exactly as the rdma-core examples do:
    /// RESET→INIT (skipped for a QP already in INIT, which keeps its access flags: rdma-core's
    /// pingpongs post their receives there first), INIT→RTR, RTR→RTS. A UC QP gets the
    /// attributes UC takes (no READ / atomic limits, RNR timer, timeout or retry counts).
    /// Errors: those of [`Qp::modify`], whose text names the transition that failed
    /// ("modify_qp INIT->RTR: missing DEST_QPN").
    pub fn connect_rc(&self, c: &RcConnect) -> Result<()> {
        let uc = {
            let st = self.dev.shared.state.lock();
            st.qps.get(&self.qpn).map(|s| s.engine.qp_type()) == Some(QpType::Uc)
        };
        if self.state() != QpState::Init {
            let init = QpAttr {
                qp_state: QpState::Init,
                pkey_index: 0,
                port_num: 1,
                qp_access_flags: c.qp_access_flags,
                ..QpAttr::default()
            };
            self.modify(&init, A::STATE | A::PKEY_INDEX | A::PORT | A::ACCESS_FLAGS)?;
        }
        let rtr = QpAttr {
            qp_state: QpState::Rtr,
            path_mtu: c.path_mtu,
            dest_qp_num: c.dest_qp_num,
            rq_psn: c.rq_psn,
            max_dest_rd_atomic: c.max_dest_rd_atomic,
            min_rnr_timer: c.min_rnr_timer,
            ah_attr: AhAttr {
                sgid_index: c.sgid_index,
                hop_limit: c.hop_limit,
                traffic_class: c.traffic_class,
                flow_label: c.flow_label & 0x000f_ffff,
                ..AhAttr::roce_v2(c.dgid)
            },
            ..QpAttr::default()
        };
        let rtr_mask = A::STATE | A::AV | A::PATH_MTU | A::DEST_QPN | A::RQ_PSN;
        let rc_rtr = A::MAX_DEST_RD_ATOMIC | A::MIN_RNR_TIMER;
        self.modify(&rtr, if uc { rtr_mask } else { rtr_mask | rc_rtr })?;
        let rts = QpAttr {
            qp_state: QpState::Rts,
            sq_psn: c.sq_psn,
            timeout: c.timeout,
            retry_cnt: c.retry_cnt,
            rnr_retry: c.rnr_retry,
            max_rd_atomic: c.max_rd_atomic,
            ..QpAttr::default()
        };
        let rc_rts = A::TIMEOUT | A::RETRY_CNT | A::RNR_RETRY | A::MAX_QP_RD_ATOMIC;
        self.modify(
            &rts,
            if uc {
                A::STATE | A::SQ_PSN
            } else {
                A::STATE | A::SQ_PSN | rc_rts
            },
        )
    }
}

impl Qp {
    /// Takes a UD QP to RTS with Q_Key `qkey` and first PSN `sq_psn`, as `ibv_ud_pingpong`
    /// does: RESET→INIT (skipped for a QP already in INIT, which keeps its Q_Key), INIT→RTR,
    /// RTR→RTS. Errors: those of [`Qp::modify`], naming the transition that failed.
    pub fn ready_ud(&self, qkey: u32, sq_psn: u32) -> Result<()> {
        if self.state() != QpState::Init {
            let init = QpAttr {
                qp_state: QpState::Init,
                pkey_index: 0,
                port_num: 1,
                qkey,
                ..QpAttr::default()
            };
            self.modify(&init, A::STATE | A::PKEY_INDEX | A::PORT | A::QKEY)?;
        }
        self.modify(
            &QpAttr {
                qp_state: QpState::Rtr,
                ..QpAttr::default()
            },
            A::STATE,
        )?;
        let rts = QpAttr {
            qp_state: QpState::Rts,
            sq_psn,
            ..QpAttr::default()
        };
        self.modify(&rts, A::STATE | A::SQ_PSN)
    }
}

/// The error of a refused post on a QP in `state`; a refusal for the state names it and the
/// state that would accept the post.
pub(super) fn post_error(call: &'static str, e: PostError, state: QpState) -> Error {
    match e {
        PostError::QueueFull => Error::new(ErrorKind::NoMem, format!("{call}: queue full")),
        PostError::WrongState => {
            let needs = if call == "post_recv" {
                "INIT or later"
            } else {
                "RTS"
            };
            Error::new(
                ErrorKind::Inval,
                format!(
                    "{call}: the QP is in {}; posting needs {needs} (connect the QP first)",
                    state.name()
                ),
            )
        }
        PostError::Invalid(what) => Error::new(ErrorKind::Inval, format!("{call}: {what}")),
        PostError::NotSupported => Error::new(
            ErrorKind::OpNotSupp,
            format!("{call}: opcode not supported on this QP type"),
        ),
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
        if self.qpn == GSI_QPN {
            // QP1 belongs to the device; a handle from `gsi_qp` destroys nothing.
            return;
        }
        let mut st = self.dev.shared.state.lock();
        // A destroyed QP leaves its multicast groups (ib_core would refuse the destroy with
        // EBUSY; a Rust drop cannot fail).
        let groups: Vec<IpAddr> = st
            .mcast
            .iter()
            .filter(|(_, m)| m.contains(&self.qpn))
            .map(|(g, _)| *g)
            .collect();
        for g in groups {
            self.dev.detach_locked(&mut st, g, self.qpn);
        }
        // Device counters only grow (as rxe's hw_counters): the device's own counts keep
        // the QP's. Its counts in the device's shared counters stay there (what it counted
        // since its last pump is added first), now as part of the device's own.
        self.dev.publish_qp_counters(&mut st, self.qpn);
        if let Some(slot) = st.qps.remove(&self.qpn) {
            let c = slot.engine.counters().clone();
            st.counters.add(&c);
            st.published.add(&slot.published);
        }
        st.srqs.detach(self.qpn);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn udp_source_ports_match_rxe_captures() {
        // docs/wire-facts.md §2.1: QPN 0x13 → 0xD078 at creation; RC pairs 0x18↔0x18 → 0xC240,
        // 0x1E↔0x1E → 0xC384, 0x1C↔0x1C → 0xC310.
        assert_eq!(rxe_initial_udp_sport(0x13), 0xd078);
        assert_eq!(rdma_get_udp_sport(0, 0x18, 0x18), 0xc240);
        assert_eq!(rdma_get_udp_sport(0, 0x1e, 0x1e), 0xc384);
        assert_eq!(rdma_get_udp_sport(0, 0x1c, 0x1c), 0xc310);
        assert_eq!(
            rdma_get_udp_sport(0, 0x11, 0x12),
            rdma_get_udp_sport(0, 0x12, 0x11)
        );
    }
}
