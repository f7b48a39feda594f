//! The device's own verbs: construction, `ibv_query_device`/`_port`/`_gid`, PD, CQ and
//! completion-channel creation, the asynchronous event queue, QP1 (GSI), counters and timers.

use super::base::{
    Device, DeviceConfig, FIRST_QPN, GID_ENTRIES, GID_TBL_LEN, GSI_CQE, GSI_PD, GSI_QPN, GidEntry,
    GidType, MAX_QP, MAX_QP_WR, MAX_RD_ATOM, MAX_SGE, QpSlot, Shared, State,
};
use super::cq::{CompChannel, Cq, CqShared, MAX_CQE, PollHook};
use super::event::{AsyncEvent, AsyncEvents, EventElement, EventType, LevelFd, SignalQueue};
use super::pd::Pd;
use super::qp::{Qp, rxe_initial_udp_sport};
use super::srq::{MAX_SRQ, MAX_SRQ_SGE, MAX_SRQ_WR};
use super::{Clock, Error, ErrorKind, Gid, Link, Result};
use crate::transport::{
    Counters, Instant, MemoryTable, Path, PathMtu, QpAttrs, QpCap, QpEngine, QpState, QpType,
};
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// Device attributes (`struct ibv_device_attr`, the fields softroce fills).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceAttr {
    /// Firmware version string.
    pub fw_ver: String,
    /// Node GUID (EUI-64 of the device's derived MAC).
    pub node_guid: u64,
    /// System image GUID.
    pub sys_image_guid: u64,
    /// Largest MR in bytes.
    pub max_mr_size: u64,
    /// Vendor id (rxe reports 0xFFFFFF).
    pub vendor_id: u32,
    /// Vendor part id (rxe leaves it 0).
    pub vendor_part_id: u32,
    /// Hardware version (rxe leaves it 0).
    pub hw_ver: u32,
    /// Most QPs.
    pub max_qp: u32,
    /// Most WRs per queue.
    pub max_qp_wr: u32,
    /// Most SGEs per WR.
    pub max_sge: u32,
    /// Most CQs.
    pub max_cq: u32,
    /// Most CQEs per CQ.
    pub max_cqe: u32,
    /// Most MRs.
    pub max_mr: u32,
    /// Most PDs.
    pub max_pd: u32,
    /// Outstanding READ/atomics per QP as responder.
    pub max_qp_rd_atom: u32,
    /// Outstanding READ/atomics per QP as requester.
    pub max_qp_init_rd_atom: u32,
    /// Largest message in bytes.
    pub max_msg_sz: u64,
    /// Physical ports.
    pub phys_port_cnt: u8,
    /// Most SRQs.
    pub max_srq: u32,
    /// Most WRs per SRQ.
    pub max_srq_wr: u32,
    /// Most SGEs per SRQ WR.
    pub max_srq_sge: u32,
    /// Page sizes MRs may use, one bit per size (rxe `RXE_PAGE_SIZE_CAP`: 4 KiB and up).
    pub page_size_cap: u64,
    /// `IBV_DEVICE_*` capability bits, rxe's `RXE_DEVICE_CAP_FLAGS` ([`DEVICE_CAP_FLAGS`]).
    pub device_cap_flags: u32,
    /// Most SGEs per RDMA READ WR.
    pub max_sge_rd: u32,
    /// Outstanding READ/atomics as responder, over all QPs (rxe `RXE_MAX_RES_RD_ATOM`).
    pub max_res_rd_atom: u32,
    /// Atomic operations are atomic with respect to this device's other accesses.
    pub atomic_cap: AtomicCap,
    /// Most memory windows.
    pub max_mw: u32,
    /// Most multicast groups.
    pub max_mcast_grp: u32,
    /// Most QPs per multicast group.
    pub max_mcast_qp_attach: u32,
    /// Most QP attachments over all groups (rxe `RXE_MAX_TOT_MCAST_QP_ATTACH`).
    pub max_total_mcast_qp_attach: u32,
    /// Most address handles: what rxe 6.1 reports (`ibv_devinfo -v` in the interop guest,
    /// 32767); softroce sets no lower limit.
    pub max_ah: u32,
    /// Most P_Keys (rxe `RXE_MAX_PKEYS`).
    pub max_pkeys: u16,
    /// Local CA ACK delay, the 5-bit exponent of 4.096 µs × 2^n (rxe 15).
    pub local_ca_ack_delay: u8,
}

/// `IBV_DEVICE_*` bits of [`DeviceAttr::device_cap_flags`], rxe's `RXE_DEVICE_CAP_FLAGS`
/// (Linux 6.1): BAD_PKEY_CNTR, BAD_QKEY_CNTR, AUTO_PATH_MIG, CHANGE_PHY_PORT,
/// UD_AV_PORT_ENFORCE, PORT_ACTIVE_EVENT, SYS_IMAGE_GUID, RC_RNR_NAK_GEN, SRQ_RESIZE,
/// MEM_WINDOW, MEM_MGT_EXTENSIONS, MEM_WINDOW_TYPE_2B. Source: rxe_param.h; verbs.h
/// `enum ibv_device_cap_flags` for the bit positions.
pub const DEVICE_CAP_FLAGS: u32 = 0x0122_3c76;

/// `enum ibv_atomic_cap`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AtomicCap {
    /// `IBV_ATOMIC_NONE` (0): no atomics.
    None = 0,
    /// `IBV_ATOMIC_HCA` (1): atomic among the QPs of this device (rxe's value).
    Hca = 1,
    /// `IBV_ATOMIC_GLOB` (2): atomic with every other access, CPU included.
    Glob = 2,
}

/// Port attributes (`struct ibv_port_attr`, the fields softroce fills).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortAttr {
    /// Always `PORT_ACTIVE` (4).
    pub state: u8,
    /// Largest path MTU.
    pub max_mtu: PathMtu,
    /// Active path MTU.
    pub active_mtu: PathMtu,
    /// GID table length ([`GID_TBL_LEN`], rxe's 1024), of which the first
    /// [`GID_ENTRIES`] are populated ([`Device::gids`]).
    pub gid_tbl_len: u32,
    /// P_Key table length.
    pub pkey_tbl_len: u16,
    /// Link layer name.
    pub link_layer: &'static str,
    /// Largest message, in bytes ([`crate::transport::MAX_MSG_BYTES`], rxe R6.12
    /// `RXE_PORT_MAX_MSG_SZ`; rxe 6.1 said 0x800000).
    pub max_msg_sz: u64,
    /// `IBV_PORT_*` capability bits: `IBV_PORT_CM_SUP` (0x0001_0000), as rxe.
    pub port_cap_flags: u32,
    /// Virtual lanes, encoded as `ibv_port_attr.max_vl_num` (1: one VL), as rxe.
    pub max_vl_num: u8,
    /// `IB_WIDTH_*` code ([`DeviceConfig::active_width`](super::DeviceConfig)).
    pub active_width: u8,
    /// `IB_SPEED_*` code ([`DeviceConfig::active_speed`](super::DeviceConfig)); rxe
    /// reports SDR, 2.5 Gbps (1), on a netdev of 1 Gb/s or of no known speed.
    pub active_speed: u8,
    /// Physical port state; LINK_UP (5), as rxe with its netdev up.
    pub phys_state: u8,
}

/// `reg_mr` of `length` bytes, 0 or over [`crate::transport::MAX_MSG_BYTES`]: the error names
/// the length and the limit.
pub(super) fn reg_mr_length_error(length: usize) -> Error {
    Error::new(
        ErrorKind::Inval,
        format!(
            "reg_mr: length {length} out of range (1..={}, max_mr_size)",
            crate::transport::MAX_MSG_BYTES
        ),
    )
}

/// QP1's queue sizes (ib_mad's defaults).
const GSI_CAP: QpCap = QpCap {
    max_send_wr: 128,
    max_recv_wr: 512,
    max_send_sge: 2,
    max_recv_sge: 2,
    max_inline_data: 0,
};
/// QP1 signals every send WR.
const GSI_SQ_SIG_ALL: bool = true;

/// QP1's engine, taken to RTS as ib_mad does (`ib_mad_change_qp_state_to_rts`: INIT with
/// the Q_Key, RTR, RTS with `sq_psn` 0); UD-style path fixed at creation.
fn gsi_engine(cfg: &DeviceConfig, link: &dyn Link) -> QpEngine {
    let mut e = QpEngine::new(GSI_QPN, QpType::Gsi, GSI_PD, GSI_CAP, GSI_SQ_SIG_ALL);
    e.set_path(Path {
        local: cfg.ip,
        remote: cfg.ip,
        src_port: link.source_port(rxe_initial_udp_sport(GSI_QPN)),
        ip: crate::transport::IpFields::default(),
    });
    e.set_datagram_path_mtu(cfg.active_mtu);
    let attrs = QpAttrs {
        qkey: crate::transport::GSI_QKEY,
        sq_psn: crate::wire::Psn::new(0),
        ..QpAttrs::default()
    };
    let up = e.modify_to(QpState::Rts, &attrs, None);
    assert_eq!(up, Ok(()), "QP1's bring-up follows the transition table");
    e
}

/// The EUI-64 of the device on `ip`: that of the locally administered MAC 02:00:a:b:c:d
/// derived from the address (IPv4 `a.b.c.d`, or an IPv6 address's last four bytes), the
/// universal/local bit flipped back. Its node GUID and link-local GID 0 are made of it.
fn eui64(ip: IpAddr) -> [u8; 8] {
    let ip4 = match ip {
        IpAddr::V4(v4) => v4.octets(),
        IpAddr::V6(v6) => {
            let o = v6.octets();
            [o[12], o[13], o[14], o[15]]
        }
    };
    let mac = [0x02, 0x00, ip4[0], ip4[1], ip4[2], ip4[3]];
    [
        mac[0] ^ 0x02,
        mac[1],
        mac[2],
        0xff,
        0xfe,
        mac[3],
        mac[4],
        mac[5],
    ]
}

/// The node GUID (and system image GUID) of the device on `ip`, as
/// [`Device::query_device`] reports it once the device is open: its EUI-64, read
/// big-endian. The C ABI lists it before the device opens (`ibv_get_device_guid`).
pub fn node_guid(ip: IpAddr) -> u64 {
    u64::from_be_bytes(eui64(ip))
}

/// The GID table of the device on `ip`, as [`Device::gids`] and `ibv_query_gid` report it:
/// index 0 the link-local GID `fe80::` + the device's EUI-64 (as kernel rxe's first entry),
/// index 1 the address itself (`::ffff:a.b.c.d` for IPv4), both RoCE v2.
pub fn gid_table(ip: IpAddr) -> [GidEntry; GID_ENTRIES] {
    let mut ll = [0u8; 16];
    ll[0] = 0xfe;
    ll[1] = 0x80;
    ll[8..].copy_from_slice(&eui64(ip));
    [
        GidEntry {
            index: 0,
            gid: Gid(ll),
            gid_type: GidType::RoceV2,
        },
        GidEntry {
            index: 1,
            gid: Gid::from_ip(ip),
            gid_type: GidType::RoceV2,
        },
    ]
}

/// What `ibv_query_device` reports for the device on `ip` (kernel rxe's values, rxe_param.h),
/// without opening it: [`Device::query_device`] of an open device is this.
pub fn device_attr(ip: IpAddr) -> DeviceAttr {
    DeviceAttr {
        fw_ver: env!("CARGO_PKG_VERSION").to_string(),
        node_guid: node_guid(ip),
        sys_image_guid: node_guid(ip),
        max_mr_size: 1 << 31,
        vendor_id: 0x00ff_ffff,
        vendor_part_id: 0,
        hw_ver: 0,
        max_qp: MAX_QP,
        max_qp_wr: MAX_QP_WR,
        max_sge: MAX_SGE,
        max_cq: MAX_QP,
        max_cqe: MAX_CQE,
        max_mr: crate::transport::MAX_MR as u32,
        max_pd: MAX_QP,
        max_qp_rd_atom: MAX_RD_ATOM,
        max_qp_init_rd_atom: MAX_RD_ATOM,
        max_msg_sz: crate::transport::MAX_MSG_BYTES,
        phys_port_cnt: 1,
        max_srq: MAX_SRQ,
        max_srq_wr: MAX_SRQ_WR,
        max_srq_sge: MAX_SRQ_SGE,
        page_size_cap: 0xffff_f000,
        device_cap_flags: DEVICE_CAP_FLAGS,
        max_sge_rd: MAX_SGE,
        max_res_rd_atom: 0x3_f000,
        atomic_cap: AtomicCap::Hca,
        max_mw: crate::transport::MAX_MW as u32,
        max_mcast_grp: super::base::MAX_MCAST_GRP as u32,
        max_mcast_qp_attach: super::base::MAX_MCAST_QP_ATTACH as u32,
        max_total_mcast_qp_attach: 0x7_0000,
        max_ah: 32767,
        max_pkeys: 64,
        local_ca_ack_delay: crate::cm::LOCAL_CA_ACK_DELAY,
    }
}

/// What `ibv_query_port` reports for port 1 of a device built from `cfg` (its active MTU,
/// speed and width), without opening it: [`Device::query_port`] of an open device is this.
pub fn port_attr(cfg: &super::DeviceConfig) -> PortAttr {
    PortAttr {
        state: 4,
        max_mtu: PathMtu::Mtu4096,
        active_mtu: cfg.active_mtu,
        gid_tbl_len: GID_TBL_LEN,
        pkey_tbl_len: 1,
        link_layer: "Ethernet",
        max_msg_sz: crate::transport::MAX_MSG_BYTES,
        port_cap_flags: 0x0001_0000,
        max_vl_num: 1,
        active_width: cfg.active_width,
        active_speed: cfg.active_speed,
        phys_state: 5,
    }
}

impl Device {
    /// Makes a device that sends through `link` and reads time from `clock`.
    pub fn new(cfg: DeviceConfig, link: Arc<dyn Link>, clock: Arc<dyn Clock>) -> Device {
        let gids = gid_table(cfg.ip);
        let gsi_cq = Arc::new(CqShared::new(GSI_CQE));
        let fatal = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let _ = gsi_cq.failed.set(fatal.clone());
        let gsi_weak = Arc::downgrade(&gsi_cq);
        let mut qps = BTreeMap::new();
        qps.insert(
            GSI_QPN,
            QpSlot::new(
                gsi_engine(&cfg, link.as_ref()),
                gsi_cq.clone(),
                gsi_cq.clone(),
            ),
        );
        let state = State {
            mrs: MemoryTable::new(cfg.seed),
            qps,
            srqs: Default::default(),
            next_qpn: FIRST_QPN,
            next_pd: 1,
            live_pds: Vec::new(),
            counters: Counters::default(),
            published: Counters::default(),
            rp_cnp_ignored: 0,
            mcast: BTreeMap::new(),
            tx_batch: Vec::new(),
            deferred: Vec::new(),
        };
        let dev = Device {
            shared: Arc::new(Shared {
                cfg,
                gids,
                shared_counters: link.shared_counters(),
                link,
                clock,
                state: Mutex::new(state),
                gsi_cq,
                events: AsyncEvents::new(),
                poll_hook: OnceLock::new(),
                failed: OnceLock::new(),
                cqs: Mutex::new(vec![gsi_weak]),
                fatal,
                any_deferred: std::sync::atomic::AtomicBool::new(false),
                channels: Mutex::new(Vec::new()),
            }),
        };
        // rxe raises IB_EVENT_PORT_ACTIVE when its netdev comes up (`rxe_port_up`).
        dev.shared
            .events
            .push(EventType::PortActive, EventElement::Port(1));
        dev
    }

    /// QP1, the general services QP (GSI) every device has, as ib_core's MAD layer sets it
    /// up: UD on the wire, Q_Key [`GSI_QKEY`](crate::verbs::GSI_QKEY) (sent on every packet
    /// whatever the WR says, and the only one accepted: others are dropped and counted as
    /// `BadQkey`), already in RTS with `sq_psn` 0, send and receive completions on
    /// [`Device::gsi_cq`], buffers registered in [`Device::gsi_pd`]. A datagram with DestQP
    /// 1 lands in the oldest receive posted on it, preceded by the 40-byte GRH; with none
    /// posted it is dropped and counted (`UdNoReceive`).
    ///
    /// Queue sizes (ib_mad's defaults): 128 send WRs, 512 receive WRs, 2 SGEs each.
    /// The handle does not own QP1: dropping it destroys nothing, and `modify` on it follows
    /// the GSI rows of the transition table (e.g. to ERR and back through RESET, INIT, RTR,
    /// RTS with `PKEY_INDEX`, `QKEY` and `SQ_PSN`).
    /// Source: ib_core `ib_mad_port_open` / `ib_mad_change_qp_state_to_rts`; rxe
    /// `rxe_recv.c` `check_keys` (GSI_QKEY), docs/wire-facts.md §2.12.
    pub fn gsi_qp(&self) -> Qp {
        Qp {
            dev: self.clone(),
            qpn: GSI_QPN,
            cap: GSI_CAP,
            sq_sig_all: GSI_SQ_SIG_ALL,
        }
    }

    /// The CQ of QP1's send and receive completions ([`Device::gsi_qp`]); 1024 entries.
    pub fn gsi_cq(&self) -> Cq {
        Cq {
            shared: self.shared.gsi_cq.clone(),
        }
    }

    /// The protection domain of QP1: MRs whose SGEs are posted on [`Device::gsi_qp`] must be
    /// registered in it (a PD's MRs serve only its own QPs). Its handle is 0; PDs from
    /// [`Device::alloc_pd`] start at 1.
    pub fn gsi_pd(&self) -> Pd {
        Pd {
            dev: self.clone(),
            handle: GSI_PD,
        }
    }

    /// Device name.
    pub fn name(&self) -> &str {
        &self.shared.cfg.name
    }

    /// The device's IP address.
    pub fn ip(&self) -> IpAddr {
        self.shared.cfg.ip
    }

    /// A peer address the device's link learnt has no RoCE device ([`Link::poll_unreachable`]),
    /// for the CM on QP1.
    pub fn poll_unreachable(&self) -> Option<IpAddr> {
        self.shared.link.poll_unreachable()
    }

    /// `ibv_query_device`: [`device_attr`] of the device's address.
    pub fn query_device(&self) -> DeviceAttr {
        device_attr(self.shared.cfg.ip)
    }

    /// `ibv_query_port` for port 1. Errors: `EINVAL` for another port number.
    pub fn query_port(&self, port_num: u8) -> Result<PortAttr> {
        if port_num != 1 {
            return Err(Error::new(
                ErrorKind::Inval,
                "query_port: only port 1 exists",
            ));
        }
        Ok(port_attr(&self.shared.cfg))
    }

    /// `ibv_query_gid` of a populated entry (the first [`GID_ENTRIES`] of the table).
    /// Errors: `EINVAL` for port ≠ 1 or an index past the populated entries.
    pub fn query_gid(&self, port_num: u8, index: u8) -> Result<GidEntry> {
        if port_num != 1 {
            return Err(Error::new(
                ErrorKind::Inval,
                "query_gid: only port 1 exists",
            ));
        }
        self.shared
            .gids
            .get(usize::from(index))
            .copied()
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::Inval,
                    "query_gid: index past the populated GID entries",
                )
            })
    }

    /// The GID table.
    pub fn gids(&self) -> &[GidEntry] {
        &self.shared.gids
    }

    /// The device's counters (rxe's `hw_counters`, one per drop reason after them): what
    /// its receive path counted and what every QP counted, destroyed QPs included (they only
    /// grow, as rxe's). For a device whose address several processes share (its link's
    /// [`Link::shared_counters`](super::Link::shared_counters), `net::share`) they are the
    /// device's, as rxe's are: the sum over every process that has used the address since
    /// the device's keeper started, those gone (exited or killed) and the keeper itself
    /// (datagrams for no process's QP, CM answers for no listener) included; this process's
    /// part is [`Device::process_counters`]. Otherwise they are this device's alone, the
    /// same as [`Device::process_counters`].
    pub fn counters(&self) -> Counters {
        let mut st = self.shared.state.lock();
        match &self.shared.shared_counters {
            Some(share) => {
                // Whatever this process counted is in the total it reads.
                self.publish_all_counters(&mut st);
                drop(st);
                share.total()
            }
            None => Self::own_counters(&st),
        }
    }

    /// This process's part of the device's counters: what this device (its receive path
    /// and its QPs, destroyed ones included) counted, whether or not other processes share
    /// the address ([`Device::counters`]).
    pub fn process_counters(&self) -> Counters {
        Self::own_counters(&self.shared.state.lock())
    }

    fn own_counters(st: &State) -> Counters {
        let mut c = st.counters.clone();
        for slot in st.qps.values() {
            c.add(slot.engine.counters());
        }
        c
    }

    /// `ibv_alloc_pd`. Errors: `ENOMEM` past the PD limit.
    pub fn alloc_pd(&self) -> Result<Pd> {
        let mut st = self.shared.state.lock();
        if st.live_pds.len() >= MAX_QP as usize {
            return Err(Error::new(ErrorKind::NoMem, "alloc_pd: too many PDs"));
        }
        let handle = st.next_pd;
        st.next_pd += 1;
        st.live_pds.push(handle);
        Ok(Pd {
            dev: self.clone(),
            handle,
        })
    }

    /// `ibv_create_cq` with `cqe` entries. Errors: `EINVAL` for 0 or more than the device
    /// maximum.
    pub fn create_cq(&self, cqe: u32) -> Result<Cq> {
        if cqe == 0 || cqe > MAX_CQE {
            return Err(Error::new(
                ErrorKind::Inval,
                format!("create_cq: cqe {cqe} out of range (1..={MAX_CQE}, max_cqe)"),
            ));
        }
        let shared = Arc::new(CqShared::new(cqe));
        if let Some(hook) = self.shared.poll_hook.get() {
            let _ = shared.hook.set(hook.clone());
        }
        let _ = shared.failed.set(self.shared.fatal.clone());
        let mut cqs = self.shared.cqs.lock();
        if cqs.len() == cqs.capacity() {
            // Before the list grows (amortized O(1) a CQ): forget the CQs destroyed since.
            cqs.retain(|c| c.strong_count() > 0);
        }
        cqs.push(Arc::downgrade(&shared));
        drop(cqs);
        Ok(Cq { shared })
    }

    /// Transmits what `post_send` left for the next poll (the QPs of [`Qp::post_send`]'s
    /// doorbell batching): called by the link's poll hook at every CQ poll, by the driver
    /// thread at each turn and before a poller sleeps. Nothing (one atomic load) when no
    /// QP waits.
    pub fn pump_deferred(&self) {
        use std::sync::atomic::Ordering;
        // A plain load first: every poll comes here, and a swap would write the flag's
        // cache line each time.
        let flag = &self.shared.any_deferred;
        if !flag.load(Ordering::Acquire) || !flag.swap(false, Ordering::AcqRel) {
            return;
        }
        let now = self.now();
        let mut st = self.shared.state.lock();
        // A pump never defers, so the list stays empty meanwhile; its buffer goes back.
        let mut qpns = std::mem::take(&mut st.deferred);
        for &qpn in &qpns {
            self.pump(&mut st, qpn, now);
        }
        qpns.clear();
        st.deferred = qpns;
    }

    /// Installs the link's CQ poll hook ([`PollHook`]): every later poll of this device's
    /// CQs, QP1's included, goes through it. Called by the link's owner once, before the
    /// device is handed out (`net::UdpDevice` does when it opens with busy polling); CQs
    /// created before the call keep polling without it, and a second call changes nothing.
    pub fn set_poll_hook(&self, hook: Arc<dyn PollHook>) {
        if self.shared.poll_hook.set(hook.clone()).is_ok() {
            let _ = self.shared.gsi_cq.hook.set(hook);
        }
    }

    /// CNPs (opcode 0x81) received with a good ICRC. softroce reacts to none of them (no
    /// DCQCN rate control), so the name is mlx5's counter for CNPs a reaction point ignored.
    pub fn rp_cnp_ignored(&self) -> u64 {
        self.shared.state.lock().rp_cnp_ignored
    }

    /// Runs every QP timer that is due and sends what follows.
    pub fn handle_timeouts(&self) {
        let now = self.now();
        let mut st = self.shared.state.lock();
        let due: Vec<u32> = st
            .qps
            .iter()
            .filter(|(_, s)| s.engine.poll_timeout().is_some_and(|t| t <= now))
            .map(|(q, _)| *q)
            .collect();
        for qpn in due {
            if let Some(slot) = st.qps.get_mut(&qpn) {
                slot.engine.handle_timeout(now);
            }
            self.pump(&mut st, qpn, now);
        }
    }

    /// Whether a QP timer is due now on the device's clock (what [`Device::handle_timeouts`]
    /// would run).
    pub fn timer_due(&self) -> bool {
        let now = self.now();
        self.next_deadline().is_some_and(|t| t <= now)
    }

    /// The earliest QP timer deadline on the device's clock, if any.
    pub fn next_deadline(&self) -> Option<Instant> {
        let st = self.shared.state.lock();
        st.qps
            .values()
            .filter_map(|s| s.engine.poll_timeout())
            .min()
    }

    /// Time until the earliest QP timer, if any.
    pub fn next_timeout(&self) -> Option<Duration> {
        let now = self.now();
        let st = self.shared.state.lock();
        st.qps
            .values()
            .filter_map(|s| s.engine.poll_timeout())
            .min()
            .map(|t| t.since(now))
    }
}

impl Device {
    /// `ibv_get_async_event` with a timeout: waits up to `timeout` for the next asynchronous
    /// event of this device and returns it (events need no acknowledgement here).
    ///
    /// Errors: `EAGAIN` when none arrived in time.
    /// Events raised: `IBV_EVENT_PORT_ACTIVE` (port 1, once when the device is made),
    /// `IBV_EVENT_QP_FATAL`, `IBV_EVENT_QP_LAST_WQE_REACHED`, `IBV_EVENT_SQ_DRAINED` (QPN)
    /// and `IBV_EVENT_SRQ_LIMIT_REACHED` (SRQ number); `IBV_EVENT_DEVICE_FATAL` (port 1)
    /// when the device fails ([`Device::fail`]). Source: rxe raises the same ones from
    /// `rxe_qp.c`, `rxe_comp.c`, `rxe_resp.c` and `rxe_net.c` (`rxe_port_up`).
    pub fn get_async_event(&self, timeout: Duration) -> Result<AsyncEvent> {
        self.async_events()
            .0
            .pop_timeout(timeout)
            .ok_or_else(|| Error::new(ErrorKind::Again, "get_async_event: no event pending"))
    }

    /// The next asynchronous event if one is pending, without waiting (what
    /// `ibv_get_async_event` does on a non-blocking `async_fd`).
    pub fn try_get_async_event(&self) -> Option<AsyncEvent> {
        self.async_events().0.try_pop()
    }

    /// Asynchronous events dropped because more than 4096 were unread.
    pub fn async_events_lost(&self) -> u64 {
        self.async_events().0.lost.load(Ordering::Relaxed)
    }

    /// `ibv_create_comp_channel`. Errors: `ENOMEM` when no socket pair can be made (the
    /// process is out of descriptors).
    pub fn create_comp_channel(&self) -> Result<CompChannel> {
        let fd = LevelFd::new().map_err(|e| {
            Error::new(
                ErrorKind::NoMem,
                format!("create_comp_channel: socketpair: {e}"),
            )
        })?;
        let shared = Arc::new(SignalQueue::new(Some(fd), usize::MAX));
        // Registered, then checked, under the lock `fail` drains the list under (after it
        // set `failed`): a channel made while the device fails is closed by one of the two.
        let mut channels = self.shared.channels.lock();
        if channels.len() == channels.capacity() {
            // Before the list grows (amortized O(1) a channel): forget those destroyed since.
            channels.retain(|c| c.strong_count() > 0);
        }
        channels.push(Arc::downgrade(&shared));
        if self.shared.failed.get().is_some() {
            shared.close();
        }
        Ok(CompChannel { shared })
    }

    /// `ibv_create_cq` with a completion channel: like [`Device::create_cq`], and
    /// [`Cq::req_notify`] then reports completions on `channel`. Errors: those of
    /// [`Device::create_cq`].
    pub fn create_cq_with_channel(&self, cqe: u32, channel: &CompChannel) -> Result<Cq> {
        let cq = self.create_cq(cqe)?;
        *cq.shared().notify.channel.lock() = Some(channel.clone());
        Ok(cq)
    }
}

impl Device {
    /// Marks the device failed, as a device that hits a fatal error does (mlx5
    /// `mlx5_ib_handle_internal_error`; the kernel's uverbs closes its event files): every
    /// QP not in RESET or ERR enters ERR, which completes its outstanding WRs with
    /// `IBV_WC_WR_FLUSH_ERR`; `IBV_EVENT_DEVICE_FATAL` (port 1) is raised; the completion
    /// channels made on the device close ([`CompChannel::get_cq_event`] fails with `EIO`
    /// once their pending events are taken, and their descriptors stay readable); and every
    /// [`Cq::wait`] returns at once, now and later, with what its CQ holds. What a driver
    /// thread that panicked calls (`net::UdpDevice`); `reason` says why, for
    /// [`Device::failure`]. A second call changes nothing. Other verbs keep working on the
    /// device's objects (destroying them, polling, modify_qp), but nothing receives for
    /// them any more.
    pub fn fail(&self, reason: &str) {
        if self.shared.failed.set(reason.to_string()).is_err() {
            return;
        }
        tracing::error!(
            target: "softroce::verbs",
            device = %self.shared.cfg.name,
            "device failed: {reason}"
        );
        // The state may be half-changed by the panic that got us here: should the flush
        // panic too, the waiters below are woken all the same.
        let flush = || {
            let now = self.now();
            let mut st = self.shared.state.lock();
            let live: Vec<u32> = st
                .qps
                .iter()
                .filter(|(_, s)| !matches!(s.engine.state(), QpState::Reset | QpState::Err))
                .map(|(q, _)| *q)
                .collect();
            for qpn in live {
                if let Some(slot) = st.qps.get_mut(&qpn) {
                    // Any state may go to ERR (the modify_qp table), so this is not refused.
                    let to_err = crate::transport::QpModify {
                        qp_state: QpState::Err,
                        ..crate::transport::QpModify::default()
                    };
                    let _ = slot
                        .engine
                        .modify(&to_err, crate::transport::QpAttrMask::STATE);
                }
                self.pump(&mut st, qpn, now);
            }
        };
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(flush));
        self.shared
            .events
            .push(EventType::DeviceFatal, EventElement::Port(1));
        for ch in self.shared.channels.lock().drain(..) {
            if let Some(q) = ch.upgrade() {
                q.close();
            }
        }
        // Set before the wake-ups: a waiter that looks after its wake-up sees it, and one
        // that looks before sleeps until the wake-up comes.
        self.shared.fatal.store(true, Ordering::SeqCst);
        for cq in self
            .shared
            .cqs
            .lock()
            .iter()
            .filter_map(std::sync::Weak::upgrade)
        {
            cq.wake();
        }
    }

    /// Why the device failed ([`Device::fail`]), or `None` while it works.
    pub fn failure(&self) -> Option<&str> {
        self.shared.failed.get().map(String::as_str)
    }
}

/// The device's event queue is readable (pollable) while events are pending: its
/// descriptor (the read end of a socket pair).
/// -1 if the process had no descriptor left when the device was made.
impl AsRawFd for Device {
    fn as_raw_fd(&self) -> RawFd {
        self.async_events().0.raw_fd()
    }
}
