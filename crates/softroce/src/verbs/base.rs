//! The core every verbs object stands on: the device handle ([`Device`]), the state its one
//! lock guards (memory table, QPs, SRQ table, multicast groups, counters) and the pump that
//! runs a QP engine after an input and hands its datagrams to the link and its completions
//! to the CQs. The objects (`pd`, `mr`, `mw`, `cq`, `qp`, `srq`, `ah`), the device's own verbs
//! (`device`) and the receive path (`rx`) build on this file; it uses only `cq` and `event`.

use super::cq::{CqShared, PollHook};
use super::event::{AsyncEvents, EventElement, EventType, SignalQueue};
use super::{Clock, Error, ErrorKind, Gid, Link, Result, SharedCounters};
use crate::transport::{
    Completion, Counters, CqSel, Instant, MemoryTable, PathMtu, QpEngine, QpEvent, SrqQueue,
};
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::{Arc, OnceLock, Weak};

/// How to build a device.
#[derive(Debug, Clone)]
pub struct DeviceConfig {
    /// Device name (`hca_id`), e.g. `softroce0`.
    pub name: String,
    /// The IP address the device owns. Its RoCEv2 GID (index 1) is the IPv4-mapped form of an
    /// IPv4 address (`::ffff:a.b.c.d`) or the IPv6 address itself, which selects IPv6.
    pub ip: IpAddr,
    /// Seed for MR key bytes (deterministic runs use a fixed seed).
    pub seed: u64,
    /// Active MTU of the port.
    pub active_mtu: PathMtu,
    /// The port's `IB_SPEED_*` and `IB_WIDTH_*` codes (`ibv_port_attr.active_speed`,
    /// `active_width`): SDR 1X (2.5 Gb/s) here, what rxe gives a netdev of 1 Gb/s or of no
    /// known speed such as `lo`; a device on a link set from its speed
    /// (`net::rxe_port_rate`).
    pub active_speed: u8,
    /// See [`DeviceConfig::active_speed`].
    pub active_width: u8,
    /// The slot of a shared device this device is (`net::steer`): its QPNs are
    /// `slot << 16 ..= slot << 16 | 0xffff`. `None`: a device with its address to itself,
    /// whose QPNs run from 0x11 as rxe's.
    pub qpn_slot: Option<u8>,
}

impl DeviceConfig {
    /// A config for `name` on `ip`, seed from the address, active MTU 4096 (loopback).
    pub fn new(name: &str, ip: IpAddr) -> DeviceConfig {
        let seed = match ip {
            IpAddr::V4(v4) => u64::from(u32::from(v4)),
            IpAddr::V6(v6) => u128::from(v6) as u64,
        };
        DeviceConfig {
            name: name.to_string(),
            ip,
            seed,
            active_mtu: PathMtu::Mtu4096,
            active_speed: 1,
            active_width: 1,
            qpn_slot: None,
        }
    }

    /// The first and last QPN this device hands out: rxe's 0x11 ..= 0xfffffe (0xffffff is
    /// the multicast QPN), or within the slot's range ([`DeviceConfig::qpn_slot`]).
    pub fn qpn_range(&self) -> (u32, u32) {
        match self.qpn_slot {
            None => (FIRST_QPN, 0x00ff_fffe),
            Some(s) => {
                let base = u32::from(s) << 16;
                (base.max(FIRST_QPN), (base | 0xffff).min(0x00ff_fffe))
            }
        }
    }
}

/// GID type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GidType {
    /// RoCE v2 (UDP/IP encapsulation).
    RoceV2,
}

/// One GID table entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GidEntry {
    /// Index in the table.
    pub index: u8,
    /// The GID.
    pub gid: Gid,
    /// Its type.
    pub gid_type: GidType,
}

/// Largest queue depth (the CQ size limit is cq.rs's `MAX_CQE`).
pub(super) const MAX_QP_WR: u32 = 16384;
/// Most SGEs in one WR: the device's `max_sge` (and `max_sge_rd`), as rxe's
/// `RXE_MAX_SGE`. The C ABI refuses a longer list with `EINVAL` before the engine sees it.
pub const MAX_SGE: u32 = 32;
pub(super) const MAX_QP: u32 = 1 << 16;
pub(super) const MAX_RD_ATOM: u32 = 128;
/// Entries of port 1's GID table, as `ibv_query_port` reports them (`gid_tbl_len`): kernel
/// rxe's `RXE_PORT_GID_TBL_LEN`. Only the first [`GID_ENTRIES`] hold a GID; the rest are
/// empty, as on rxe, where the table has a slot per address of the netdev.
pub const GID_TBL_LEN: u32 = 1024;
/// The populated entries at the start of the GID table ([`super::gid_table`]): the
/// link-local GID and the device's address.
pub const GID_ENTRIES: usize = 2;
/// First QPN handed out; 0 and 1 are the special QPs, rxe starts its pool at 0x11.
pub(super) const FIRST_QPN: u32 = 0x11;
/// The GSI QP's number.
pub(super) const GSI_QPN: u32 = 1;
pub use crate::transport::MULTICAST_QPN;
/// Most multicast groups per device and QPs per group (rxe `RXE_MAX_MCAST_GRP`,
/// `RXE_MAX_MCAST_QP_ATTACH`).
pub(super) const MAX_MCAST_GRP: usize = 8192;
pub(super) const MAX_MCAST_QP_ATTACH: usize = 56;
/// The GSI QP's protection domain (user PDs start at 1).
pub(super) const GSI_PD: u32 = 0;
/// Entries of the GSI CQ.
pub(super) const GSI_CQE: u32 = 1024;

pub(super) struct QpSlot {
    pub(super) engine: QpEngine,
    /// The attributes `modify_qp` set, for `Qp::query`.
    pub(super) query: super::modify::QpQuery,
    pub(super) send_cq: Arc<CqShared>,
    pub(super) recv_cq: Arc<CqShared>,
    /// The engine's counters as last added to the device's shared counters
    /// ([`Shared::shared_counters`]); all 0 while the device has none.
    pub(super) published: Counters,
}

impl QpSlot {
    pub(super) fn new(engine: QpEngine, send_cq: Arc<CqShared>, recv_cq: Arc<CqShared>) -> QpSlot {
        QpSlot {
            engine,
            query: super::modify::QpQuery::new(),
            send_cq,
            recv_cq,
            published: Counters::default(),
        }
    }
}

pub(super) struct State {
    pub(super) mrs: MemoryTable,
    pub(super) qps: BTreeMap<u32, QpSlot>,
    pub(super) srqs: SrqTable,
    pub(super) next_qpn: u32,
    pub(super) next_pd: u32,
    pub(super) live_pds: Vec<u32>,
    pub(super) counters: Counters,
    /// `counters` as last added to the device's shared counters
    /// ([`Shared::shared_counters`]); all 0 while the device has none.
    pub(super) published: Counters,
    /// CNPs received with a good ICRC and ignored (softroce has no congestion control).
    pub(super) rp_cnp_ignored: u64,
    /// Multicast groups this device's QPs are attached to: group address -> QPNs, in
    /// attach order.
    pub(super) mcast: BTreeMap<IpAddr, Vec<u32>>,
    /// Reused buffer of the datagrams one `pump` hands to the link.
    pub(super) tx_batch: Vec<crate::transport::Transmit>,
    /// QPs whose `post_send` left the transmit to the next poll ([`Device::pump_deferred`]).
    pub(super) deferred: Vec<u32>,
}

pub(super) struct Shared {
    /// Completions of QP1.
    pub(super) gsi_cq: Arc<CqShared>,
    pub(super) cfg: DeviceConfig,
    pub(super) gids: [GidEntry; GID_ENTRIES],
    pub(super) link: Arc<dyn Link>,
    /// The counters this device shares with the other processes on its address
    /// ([`Link::shared_counters`]), where it adds what it counts.
    pub(super) shared_counters: Option<Arc<dyn SharedCounters>>,
    pub(super) clock: Arc<dyn Clock>,
    pub(super) state: Mutex<State>,
    pub(super) events: AsyncEvents,
    /// The link's CQ poll hook ([`Device::set_poll_hook`]).
    pub(super) poll_hook: OnceLock<Arc<dyn PollHook>>,
    /// Why the device failed ([`Device::fail`]); unset while it works.
    pub(super) failed: OnceLock<String>,
    /// Set by [`Device::fail`]; every CQ of the device holds it, so that a
    /// [`Cq::wait`](super::Cq::wait) does not sleep once it is set.
    pub(super) fatal: Arc<std::sync::atomic::AtomicBool>,
    /// Whether `State::deferred` may hold a QP (read without the lock by every poll).
    pub(super) any_deferred: std::sync::atomic::AtomicBool,
    /// The device's CQs (QP1's too), which [`Device::fail`] wakes.
    pub(super) cqs: Mutex<Vec<Weak<CqShared>>>,
    /// The queues of the completion channels made on this device, which
    /// [`Device::fail`] closes.
    pub(super) channels: Mutex<Vec<Weak<SignalQueue<Weak<CqShared>>>>>,
}

/// A softroce device: one IP address, one port, a GID table, and the verbs objects made on
/// it. Cloning gives another handle to the same device.
#[derive(Clone)]
pub struct Device {
    pub(super) shared: Arc<Shared>,
}

impl core::fmt::Debug for Device {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Device")
            .field("name", &self.shared.cfg.name)
            .field("ip", &self.shared.cfg.ip)
            .finish()
    }
}

impl Device {
    pub(super) fn state(&self) -> parking_lot::MutexGuard<'_, State> {
        self.shared.state.lock()
    }

    pub(super) fn async_events(&self) -> &AsyncEvents {
        &self.shared.events
    }

    pub(super) fn same_device(&self, other: &Device) -> bool {
        Arc::ptr_eq(&self.shared, &other.shared)
    }

    pub(super) fn now(&self) -> Instant {
        self.shared.clock.now()
    }

    /// Sends everything QP `qpn` has to send and delivers its completions.
    pub(super) fn pump(&self, st: &mut State, qpn: u32, now: Instant) {
        let State {
            mrs,
            qps,
            counters,
            published,
            tx_batch,
            ..
        } = st;
        let Some(slot) = qps.get_mut(&qpn) else {
            return;
        };
        let share = self.shared.shared_counters.as_deref();
        // Whether the engine may have counted something not yet added to the shared
        // counters (the input that led to this pump, a local operation).
        let mut unpublished = true;
        let mut send_errs = 0;
        // Local operations (REG_MR, LOCAL_INV, BIND_MW) run when the requester reaches
        // them; after one runs the requester may have more to send. Each round's datagrams
        // go to the link as one batch, so it can send them with few system calls.
        loop {
            let mut batch = core::mem::take(tx_batch);
            while let Some(t) = slot.engine.poll_transmit(now, mrs) {
                batch.push(t);
            }
            if !batch.is_empty() {
                // Counted in the shared counters before they leave: a process that sees
                // their answer sees them counted.
                if let Some(share) = share {
                    publish(share, slot.engine.counters(), &mut slot.published);
                }
                unpublished = false;
                send_errs += self.shared.link.send_batch(&batch) as u64;
                for t in batch.drain(..) {
                    crate::transport::bufpool::give(t.payload);
                }
            }
            *tx_batch = batch;
            if !slot.engine.run_local_ops(mrs) {
                break;
            }
            unpublished = true;
        }
        counters.send_err += send_errs;
        // Before the completions: a process that sees one sees what led to it counted.
        if let Some(share) = share {
            if unpublished {
                publish(share, slot.engine.counters(), &mut slot.published);
            }
            if send_errs != 0 {
                publish(share, counters, published);
            }
        }
        while let Some(Completion { cq, wc, solicited }) = slot.engine.poll_completion() {
            let target = match cq {
                CqSel::Send => &slot.send_cq,
                CqSel::Recv => &slot.recv_cq,
            };
            if !target.push(wc, solicited) {
                // CQ overrun: the completion is lost; rxe `rxe_cq_post` raises
                // IB_EVENT_CQ_ERR on the CQ each time.
                self.shared
                    .events
                    .push(EventType::CqErr, EventElement::Cq(target.handle));
            }
        }
        while let Some(ev) = slot.engine.poll_event() {
            use EventType as E;
            let t = match ev {
                QpEvent::Fatal => E::QpFatal,
                QpEvent::SqDrained => E::SqDrained,
                QpEvent::LastWqeReached => E::QpLastWqeReached,
            };
            self.shared.events.push(t, EventElement::Qp(qpn));
        }
    }

    /// Adds what the device's own counters (not its QPs') counted since they were last
    /// added to its shared counters, if it has them.
    pub(super) fn publish_device_counters(&self, st: &mut State) {
        if let Some(share) = &self.shared.shared_counters {
            publish(share.as_ref(), &st.counters, &mut st.published);
        }
    }

    /// Adds what QP `qpn` counted since its counts were last added to the device's shared
    /// counters, if it has them.
    pub(super) fn publish_qp_counters(&self, st: &mut State, qpn: u32) {
        if let (Some(share), Some(slot)) = (&self.shared.shared_counters, st.qps.get_mut(&qpn)) {
            publish(share.as_ref(), slot.engine.counters(), &mut slot.published);
        }
    }

    /// Adds everything the device counted and did not yet add to its shared counters: its
    /// own counters' and every QP's.
    pub(super) fn publish_all_counters(&self, st: &mut State) {
        let Some(share) = &self.shared.shared_counters else {
            return;
        };
        for slot in st.qps.values_mut() {
            publish(share.as_ref(), slot.engine.counters(), &mut slot.published);
        }
        publish(share.as_ref(), &st.counters, &mut st.published);
    }
}

/// Adds to `share` what `counters` counted since `published`, their values when last added.
fn publish(share: &dyn SharedCounters, counters: &Counters, published: &mut Counters) {
    counters.hand_on_growth(published, |i, n| share.add(i, n));
}

pub(super) struct SrqEntry {
    pub(super) queue: SrqQueue,
    /// QPs attached.
    pub(super) qps: usize,
    /// The `Srq` handle is gone; the entry lives until its last QP does.
    pub(super) orphaned: bool,
}

/// The device's SRQs and which QP uses which.
#[derive(Default)]
pub(super) struct SrqTable {
    pub(super) srqs: BTreeMap<u32, SrqEntry>,
    pub(super) by_qp: BTreeMap<u32, u32>,
    pub(super) next: u32,
}

impl SrqTable {
    /// Attaches QP `qpn` to SRQ `srq_num`. Errors: `EINVAL` if the SRQ is destroyed.
    pub(super) fn attach(&mut self, qpn: u32, srq_num: u32) -> Result<()> {
        let e = self
            .srqs
            .get_mut(&srq_num)
            .filter(|e| !e.orphaned)
            .ok_or_else(|| Error::new(ErrorKind::Inval, "create_qp: SRQ destroyed"))?;
        e.qps += 1;
        self.by_qp.insert(qpn, srq_num);
        Ok(())
    }

    /// The SRQ QP `qpn` is attached to, by number, with its queue.
    pub(super) fn queue_of(&mut self, qpn: u32) -> Option<(u32, &mut SrqQueue)> {
        let n = *self.by_qp.get(&qpn)?;
        self.srqs.get_mut(&n).map(|e| (n, &mut e.queue))
    }

    /// Detaches a destroyed QP; frees an orphaned SRQ with its last QP.
    pub(super) fn detach(&mut self, qpn: u32) {
        let Some(n) = self.by_qp.remove(&qpn) else {
            return;
        };
        if let Some(e) = self.srqs.get_mut(&n) {
            e.qps = e.qps.saturating_sub(1);
            if e.qps == 0 && e.orphaned {
                self.srqs.remove(&n);
            }
        }
    }
}
