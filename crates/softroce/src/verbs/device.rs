//! The device and its objects.

use super::modify::{QpAttrMask as A, check_modify};
use super::{Clock, Error, ErrorKind, Gid, Link, QpAttr, QpAttrMask, Result};
use crate::transport::to_v6;
use crate::transport::{
    AccessFlags, Completion, Counters, CqSel, DropReason, Instant, MemoryTable, Path, PathMtu,
    PostError, QpCap, QpEngine, QpEvent, QpState, QpType, RecvWr, SendWr, Wc, WcOpcode, WcStatus,
};
use crate::wire::ip_udp::{LinkType, parse_frame};
use crate::wire::{IcrcIp, OpKind, ROCE_V2_UDP_PORT, RocePacket, icrc_compute, solve_ipv4_ident};
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

// Memory windows, fast-register MRs and MRs over caller memory (src/verbs/mw.rs).
#[path = "mw.rs"]
pub(super) mod mw;

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

/// What the receiver saw of the outer IP and UDP headers of a datagram, which the ICRC covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RxHeaders<'a> {
    /// A plain UDP socket: source and destination addresses and ports are known, the rest of
    /// the IP header is not. IPv6 needs nothing else (traffic class, flow label and hop limit
    /// are masked), so its check is exact. An IPv4 header also carries the Identification
    /// field, which the ICRC covers and which rxe and NICs fill with a non-zero counter; the
    /// check assumes DF set and accepts the packet when some 16-bit ID makes the ICRC valid
    /// ([`solve_ipv4_ident`]).
    ///
    /// Measured false-accept rate (`examples/icrc_false_accept.rs`, corruptions of the UDP
    /// payload of four packet shapes): 272 of 17,779,299 randomly corrupted packets accepted,
    /// 1.53e-5 = 2^-16, about the same for 2 random bits, 3–8 bits, bursts of 2–32 and 33–128
    /// bits, 1–8 random bytes and all-random payloads; none of 41,984 single-bit flips; the
    /// exact check accepted none of them. README.md ("How it is built") has the table.
    Udp,
    /// A plain UDP socket, for segment `index` of a UDP GRO buffer: as [`RxHeaders::Udp`],
    /// but an IPv4 check also tries ID `index` before solving, the ID Linux gives segment
    /// `index` of a UDP GSO send from an unconnected `IP_PMTUDISC_DO` socket.
    UdpGro {
        /// The segment's position in its GRO buffer.
        index: usize,
    },
    /// The IP and UDP headers exactly as received (raw socket): the ICRC is checked over them,
    /// as kernel rxe does.
    Exact {
        /// IPv4 (20 bytes, no options) or IPv6 (40 bytes) header as received.
        ip_header: &'a [u8],
        /// The 8-byte UDP header as received.
        udp_header: &'a [u8],
    },
}

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
    /// Most address handles (rxe `RXE_MAX_AH`; softroce sets no lower limit).
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
    /// GID table length.
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
    /// `IB_WIDTH_*` code; rxe reports 1X (1).
    pub active_width: u8,
    /// `IB_SPEED_*` code; rxe reports SDR, 2.5 Gbps (1).
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

/// Largest queue depth, SGE count, CQ size.
const MAX_QP_WR: u32 = 16384;
const MAX_SGE: u32 = 32;
const MAX_CQE: u32 = 1 << 20;
const MAX_QP: u32 = 1 << 16;
const MAX_RD_ATOM: u32 = 128;
/// First QPN handed out; 0 and 1 are the special QPs, rxe starts its pool at 0x11.
const FIRST_QPN: u32 = 0x11;
/// The GSI QP's number.
const GSI_QPN: u32 = 1;
/// The DestQP of every multicast packet. Source: IBTA Vol 1 ch. 10 (multicast: QP 0xFFFFFF);
/// ib_core `IB_MULTICAST_QPN`.
pub const MULTICAST_QPN: u32 = 0x00ff_ffff;
/// Most multicast groups per device and QPs per group (rxe `RXE_MAX_MCAST_GRP`,
/// `RXE_MAX_MCAST_QP_ATTACH`).
const MAX_MCAST_GRP: usize = 8192;
const MAX_MCAST_QP_ATTACH: usize = 56;
/// The GSI QP's protection domain (user PDs start at 1).
const GSI_PD: u32 = 0;
/// Entries of the GSI CQ.
const GSI_CQE: u32 = 1024;

/// QP1's engine, taken to RTS as ib_mad does (`ib_mad_change_qp_state_to_rts`: INIT with
/// the Q_Key, RTR, RTS with `sq_psn` 0); UD-style path fixed at creation.
fn gsi_engine(cfg: &DeviceConfig, link: &dyn Link) -> QpEngine {
    let cap = QpCap {
        max_send_wr: 128,
        max_recv_wr: 512,
        max_send_sge: 2,
        max_recv_sge: 2,
        max_inline_data: 0,
    };
    let mut e = QpEngine::new(GSI_QPN, QpType::Gsi, GSI_PD, cap, true);
    e.set_path(Path {
        local: cfg.ip,
        remote: cfg.ip,
        src_port: link.source_port(rxe_initial_udp_sport(GSI_QPN)),
    });
    let a = e.attrs_mut();
    a.path_mtu = cfg.active_mtu;
    a.qkey = crate::transport::GSI_QKEY;
    a.sq_psn = crate::wire::Psn::new(0);
    e.set_state(QpState::Init);
    e.set_state(QpState::Rtr);
    e.set_state(QpState::Rts);
    e
}

pub(super) struct CqShared {
    /// Process-unique CQ number, named by `IBV_EVENT_CQ_ERR`.
    handle: u32,
    /// The completions, oldest first: a lock-free queue (crossbeam's list channel), so that
    /// polling, empty or not, takes no lock. Only the device pushes (under its lock); any
    /// thread may poll. A thread in [`Cq::wait`] sleeps in the channel and a push wakes it.
    ring_tx: crossbeam_channel::Sender<Wc>,
    ring_rx: crossbeam_channel::Receiver<Wc>,
    /// Completions pushed and not yet polled; at most `cqe` (the rest overflow).
    queued: std::sync::atomic::AtomicUsize,
    cqe: usize,
    overflows: AtomicU64,
    pub(super) notify: super::event::CqNotify,
}

pub(super) struct QpSlot {
    pub(super) engine: QpEngine,
    send_cq: Arc<CqShared>,
    recv_cq: Arc<CqShared>,
}

pub(super) struct State {
    pub(super) mrs: MemoryTable,
    pub(super) qps: BTreeMap<u32, QpSlot>,
    pub(super) srqs: super::srq::SrqTable,
    next_qpn: u32,
    next_pd: u32,
    live_pds: Vec<u32>,
    counters: Counters,
    /// CNPs received with a good ICRC and ignored (softroce has no congestion control).
    rp_cnp_ignored: u64,
    /// Multicast groups this device's QPs are attached to: group address -> QPNs, in
    /// attach order.
    mcast: BTreeMap<IpAddr, Vec<u32>>,
    /// Reused buffer of the datagrams one `pump` hands to the link.
    tx_batch: Vec<crate::transport::Transmit>,
}

struct Shared {
    /// Completions of QP1.
    gsi_cq: Arc<CqShared>,
    cfg: DeviceConfig,
    node_guid: u64,
    gids: [GidEntry; 2],
    link: Arc<dyn Link>,
    clock: Arc<dyn Clock>,
    state: Mutex<State>,
    events: super::event::AsyncEvents,
}

/// A softroce device: one IP address, one port, a GID table, and the verbs objects made on
/// it. Cloning gives another handle to the same device.
#[derive(Clone)]
pub struct Device {
    shared: Arc<Shared>,
}

impl core::fmt::Debug for Device {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Device")
            .field("name", &self.shared.cfg.name)
            .field("ip", &self.shared.cfg.ip)
            .finish()
    }
}

/// The UDP source port rxe gives a QP at creation: `0xC000 + hash_32(qpn, 14)`, where
/// `hash_32(v, 14) = (v × 0x61C88647 mod 2^32) >> 18`. Source: rxe `rxe_qp.c`
/// `rxe_qp_init_req`; Linux `include/linux/hash.h`. Example: QPN 0x13 → 0xD078.
pub fn rxe_initial_udp_sport(qpn: u32) -> u16 {
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

impl Device {
    /// Makes a device that sends through `link` and reads time from `clock`.
    pub fn new(cfg: DeviceConfig, link: Arc<dyn Link>, clock: Arc<dyn Clock>) -> Device {
        // A locally administered MAC from the IP (02:00:a:b:c:d) and its EUI-64.
        let ip4 = match cfg.ip {
            IpAddr::V4(v4) => v4.octets(),
            IpAddr::V6(v6) => {
                let o = v6.octets();
                [o[12], o[13], o[14], o[15]]
            }
        };
        let mac = [0x02, 0x00, ip4[0], ip4[1], ip4[2], ip4[3]];
        let eui = [
            mac[0] ^ 0x02,
            mac[1],
            mac[2],
            0xff,
            0xfe,
            mac[3],
            mac[4],
            mac[5],
        ];
        let node_guid = u64::from_be_bytes(eui);
        let mut ll = [0u8; 16];
        ll[0] = 0xfe;
        ll[1] = 0x80;
        ll[8..].copy_from_slice(&eui);
        let gids = [
            GidEntry {
                index: 0,
                gid: Gid(ll),
                gid_type: GidType::RoceV2,
            },
            GidEntry {
                index: 1,
                gid: Gid::from_ip(cfg.ip),
                gid_type: GidType::RoceV2,
            },
        ];
        let gsi_cq = Arc::new(CqShared::new(GSI_CQE));
        let mut qps = BTreeMap::new();
        qps.insert(
            GSI_QPN,
            QpSlot {
                engine: gsi_engine(&cfg, link.as_ref()),
                send_cq: gsi_cq.clone(),
                recv_cq: gsi_cq.clone(),
            },
        );
        let state = State {
            mrs: MemoryTable::new(cfg.seed),
            qps,
            srqs: Default::default(),
            next_qpn: FIRST_QPN,
            next_pd: 1,
            live_pds: Vec::new(),
            counters: Counters::default(),
            rp_cnp_ignored: 0,
            mcast: BTreeMap::new(),
            tx_batch: Vec::new(),
        };
        let dev = Device {
            shared: Arc::new(Shared {
                cfg,
                node_guid,
                gids,
                link,
                clock,
                state: Mutex::new(state),
                gsi_cq,
                events: super::event::AsyncEvents::new(),
            }),
        };
        // rxe raises IB_EVENT_PORT_ACTIVE when its netdev comes up (`rxe_port_up`).
        dev.shared
            .events
            .push(super::EventType::PortActive, super::EventElement::Port(1));
        dev
    }

    pub(super) fn state(&self) -> parking_lot::MutexGuard<'_, State> {
        self.shared.state.lock()
    }

    pub(super) fn async_events(&self) -> &super::event::AsyncEvents {
        &self.shared.events
    }

    pub(super) fn same_device(&self, other: &Device) -> bool {
        Arc::ptr_eq(&self.shared, &other.shared)
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
    /// `rxe_recv.c` `check_keys` (GSI_QKEY), FACTS §2.12.
    pub fn gsi_qp(&self) -> Qp {
        Qp {
            dev: self.clone(),
            qpn: GSI_QPN,
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

    /// `ibv_query_device`.
    pub fn query_device(&self) -> DeviceAttr {
        DeviceAttr {
            fw_ver: env!("CARGO_PKG_VERSION").to_string(),
            node_guid: self.shared.node_guid,
            sys_image_guid: self.shared.node_guid,
            max_mr_size: 1 << 31,
            vendor_id: 0x00ff_ffff,
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
            max_srq: super::srq::MAX_SRQ,
            max_srq_wr: super::srq::MAX_SRQ_WR,
            max_srq_sge: super::srq::MAX_SRQ_SGE,
            page_size_cap: 0xffff_f000,
            device_cap_flags: DEVICE_CAP_FLAGS,
            max_sge_rd: MAX_SGE,
            max_res_rd_atom: 0x3_f000,
            atomic_cap: AtomicCap::Hca,
            max_mw: crate::transport::MAX_MW as u32,
            max_mcast_grp: MAX_MCAST_GRP as u32,
            max_mcast_qp_attach: MAX_MCAST_QP_ATTACH as u32,
            max_total_mcast_qp_attach: 0x7_0000,
            max_ah: 1 << 20,
            max_pkeys: 64,
            local_ca_ack_delay: 15,
        }
    }

    /// `ibv_query_port` for port 1. Errors: `EINVAL` for another port number.
    pub fn query_port(&self, port_num: u8) -> Result<PortAttr> {
        if port_num != 1 {
            return Err(Error::new(
                ErrorKind::Inval,
                "query_port: only port 1 exists",
            ));
        }
        Ok(PortAttr {
            state: 4,
            max_mtu: PathMtu::Mtu4096,
            active_mtu: self.shared.cfg.active_mtu,
            gid_tbl_len: self.shared.gids.len() as u32,
            pkey_tbl_len: 1,
            link_layer: "Ethernet",
            max_msg_sz: crate::transport::MAX_MSG_BYTES,
            port_cap_flags: 0x0001_0000,
            max_vl_num: 1,
            active_width: 1,
            active_speed: 1,
            phys_state: 5,
        })
    }

    /// `ibv_query_gid`. Errors: `EINVAL` for port ≠ 1 or an index past the table.
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
            .ok_or_else(|| Error::new(ErrorKind::Inval, "query_gid: index past the GID table"))
    }

    /// The GID table.
    pub fn gids(&self) -> &[GidEntry] {
        &self.shared.gids
    }

    /// Device-level counters plus every QP's.
    pub fn counters(&self) -> Counters {
        let st = self.shared.state.lock();
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
        Ok(Cq {
            shared: Arc::new(CqShared::new(cqe)),
        })
    }

    fn now(&self) -> Instant {
        self.shared.clock.now()
    }

    /// Feeds one UDP datagram received on a plain UDP socket (sent from `src` to this device's
    /// port 4791). Parses it, finds the QP, checks the ICRC, runs the engine, delivers
    /// completions and sends what the engine answers. Malformed, unknown-QP or bad-ICRC packets
    /// are dropped and counted by reason (never NAKed), as rxe `rxe_rcv` does.
    ///
    /// The socket hides the IP header, so the ICRC is checked over the header the sender must
    /// have written: exact for IPv6; for IPv4 first with ID 0 (what softroce sends), then by
    /// solving for the 16-bit ID (see [`solve_ipv4_ident`] and [`RxHeaders::Udp`]).
    pub fn handle_datagram(&self, src: SocketAddr, data: &[u8]) {
        self.handle_received(src, self.shared.cfg.ip, data, RxHeaders::Udp);
    }

    /// Feeds one UDP datagram received on a socket bound to the multicast address `group`
    /// (port 4791), which the link joined for [`Qp::attach_mcast`]. A packet with DestQP
    /// 0xFFFFFF is delivered to every QP of this device attached to `group`, each checking
    /// the Q_Key itself (a mismatch is that QP's `BadQkey` drop); with no QP attached it is
    /// an `UnknownQp` drop. Any other DestQP is handled as by [`Device::handle_datagram`].
    /// The ICRC is checked once, over the header with `group` as destination.
    /// Source: rxe `rxe_recv.c` `rxe_rcv_mcast_pkt`.
    pub fn handle_multicast_datagram(&self, src: SocketAddr, group: IpAddr, data: &[u8]) {
        self.handle_received(src, group, data, RxHeaders::Udp);
    }

    /// Feeds datagram number `index` of a UDP GRO buffer received from `src`: as
    /// [`Device::handle_datagram`], with the IPv4 ID guess of [`RxHeaders::UdpGro`].
    pub fn handle_gro_segment(&self, src: SocketAddr, data: &[u8], index: usize) {
        self.handle_received(src, self.shared.cfg.ip, data, RxHeaders::UdpGro { index });
    }

    /// Feeds one whole IP packet (IPv4 or IPv6, then UDP, then the RoCEv2 datagram) received
    /// on a raw socket, and checks the ICRC over its IP and UDP headers exactly as received
    /// ([`RxHeaders::Exact`]). A packet whose framing does not parse, or that is not UDP to
    /// this device's address and port 4791, is dropped and counted as
    /// [`DropReason::BadFraming`]; the rest is as [`Device::handle_datagram`].
    pub fn handle_ip_packet(&self, packet: &[u8]) {
        match parse_frame(packet, LinkType::RawIp) {
            Ok(d) if d.dst == self.shared.cfg.ip && d.dst_port == ROCE_V2_UDP_PORT => {
                let hdrs = RxHeaders::Exact {
                    ip_header: d.ip_header,
                    udp_header: d.udp_header,
                };
                let src = SocketAddr::new(d.src, d.src_port);
                self.handle_received(src, d.dst, d.payload, hdrs);
            }
            _ => self
                .shared
                .state
                .lock()
                .counters
                .drop_packet(DropReason::BadFraming),
        }
    }

    /// One datagram: a batch of one ([`Device::rx_batch`]), so the QP answers at once.
    fn handle_received(&self, src: SocketAddr, dst: IpAddr, data: &[u8], hdrs: RxHeaders<'_>) {
        self.rx_batch().receive(src, dst, data, hdrs);
    }

    /// Starts a receive batch: the datagrams fed to the returned [`RxBatch`] are handled
    /// under one hold of the device lock, and each QP they reached sends its answers once,
    /// when the batch is dropped. An RC responder's ACKs for the batch then coalesce into
    /// the newest one (ACKs are cumulative, IBTA Vol 1 §9.7.5.1.2; counted in
    /// `ack_deferred`), and a requester sends what the batch's ACKs opened in one run. For a
    /// driver that receives many datagrams per system call (`recvmmsg`, UDP GRO).
    pub fn rx_batch(&self) -> RxBatch<'_> {
        RxBatch {
            now: self.now(),
            st: self.shared.state.lock(),
            dev: self,
            touched: Vec::new(),
        }
    }

    /// Checks and executes one received datagram under the device lock; returns the QP
    /// that must now send its answers and completions ([`Device::pump`]), if any.
    fn receive_locked(
        &self,
        st: &mut State,
        now: Instant,
        src: SocketAddr,
        dst: IpAddr,
        data: &[u8],
        hdrs: RxHeaders<'_>,
    ) -> Option<u32> {
        let pkt = match RocePacket::parse(data) {
            Ok(p) => p,
            Err(e) => {
                st.counters.drop_packet(DropReason::from(e));
                return None;
            }
        };
        if pkt.info.kind == OpKind::Cnp {
            // A CNP asks the sender of an ECN-marked flow to slow down (DCQCN reaction
            // point). softroce implements no rate control: counted as ignored, like mlx5's
            // `rp_cnp_ignored`, once its ICRC holds; a bad one is an ICRC drop.
            if self.icrc_ok(&pkt, src, dst, hdrs) {
                st.rp_cnp_ignored += 1;
            } else {
                st.counters.drop_packet(DropReason::IcrcMismatch);
            }
            return None;
        }
        let qpn = pkt.repr.bth.dest_qpn;
        if qpn == MULTICAST_QPN && dst.is_multicast() {
            self.deliver_multicast(st, now, &pkt, src, dst, hdrs);
            return None;
        }
        if !st.qps.contains_key(&qpn) {
            st.counters.drop_packet(DropReason::UnknownQp);
            return None;
        }
        // IBTA A17 (RoCEv2): a packet whose ICRC fails is dropped silently; never NAKed.
        if !self.icrc_ok(&pkt, src, dst, hdrs) {
            st.counters.drop_packet(DropReason::IcrcMismatch);
            return None;
        }
        // A datagram that reached a multicast group's socket but names a QP: `dst` is the
        // group, which a connected QP refuses (rxe `check_addr`).
        let to = (dst != self.shared.cfg.ip).then_some(dst);
        super::srq::handle_packet(st, qpn, now, &pkt, src.ip(), to, &self.shared.events);
        Some(qpn)
    }

    /// A multicast packet: to every QP attached to `group`, after one ICRC check.
    fn deliver_multicast(
        &self,
        st: &mut State,
        now: Instant,
        pkt: &RocePacket<'_>,
        src: SocketAddr,
        group: IpAddr,
        hdrs: RxHeaders<'_>,
    ) {
        let members = st.mcast.get(&group).cloned().unwrap_or_default();
        if members.is_empty() {
            st.counters.drop_packet(DropReason::UnknownQp);
            return;
        }
        if !self.icrc_ok(pkt, src, group, hdrs) {
            st.counters.drop_packet(DropReason::IcrcMismatch);
            return;
        }
        for qpn in members {
            // The same receive path as a unicast datagram: a member on an SRQ is lent the
            // SRQ's head WR (rxe `rxe_rcv_mcast_pkt` -> `rxe_rcv_pkt` -> `get_srq_wqe`).
            let ev = &self.shared.events;
            super::srq::handle_packet(st, qpn, now, pkt, src.ip(), Some(group), ev);
            self.pump(st, qpn, now);
        }
    }

    /// The receive-side ICRC check of `pkt`, sent from `src` to `dst` (this device's
    /// address, or a multicast group), for what the receiver saw of the outer headers.
    fn icrc_ok(
        &self,
        pkt: &RocePacket<'_>,
        src: SocketAddr,
        dst: IpAddr,
        hdrs: RxHeaders<'_>,
    ) -> bool {
        if cfg!(fuzzing) {
            return true;
        }
        match hdrs {
            RxHeaders::Exact {
                ip_header,
                udp_header,
            } => icrc_compute(ip_header, udp_header, pkt.body) == pkt.icrc,
            RxHeaders::Udp | RxHeaders::UdpGro { .. } => {
                let ip = match (src.ip(), dst) {
                    (IpAddr::V4(s), IpAddr::V4(d)) => IcrcIp::V4 {
                        src: s,
                        dst: d,
                        ident: 0,
                        src_port: src.port(),
                        dst_port: ROCE_V2_UDP_PORT,
                    },
                    (s, d) => IcrcIp::V6 {
                        src: to_v6(s),
                        dst: to_v6(d),
                        src_port: src.port(),
                        dst_port: ROCE_V2_UDP_PORT,
                    },
                };
                // Our own senders write IPv4 ID 0; kernel rxe and NICs write a counter that a
                // UDP socket cannot see, which is recovered by CRC linearity.
                // Segment i of a GSO send carries ID i.
                let gro_ident = match (hdrs, ip) {
                    (RxHeaders::UdpGro { index }, IcrcIp::V4 { .. }) => {
                        u16::try_from(index).ok().filter(|i| *i != 0)
                    }
                    _ => None,
                };
                // Segment i >= 1 of a GRO buffer is checked for its ID first: one CRC pass.
                gro_ident.is_some_and(|ident| match ip {
                    IcrcIp::V4 {
                        src,
                        dst,
                        src_port,
                        dst_port,
                        ..
                    } => pkt.icrc_ok(&IcrcIp::V4 {
                        src,
                        dst,
                        ident,
                        src_port,
                        dst_port,
                    }),
                    IcrcIp::V6 { .. } => false,
                }) || pkt.icrc_ok(&ip)
                    || (matches!(ip, IcrcIp::V4 { .. })
                        && solve_ipv4_ident(&ip, pkt.body, pkt.icrc).is_some())
            }
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

    /// Sends everything QP `qpn` has to send and delivers its completions.
    fn pump(&self, st: &mut State, qpn: u32, now: Instant) {
        let State {
            mrs,
            qps,
            counters,
            tx_batch,
            ..
        } = st;
        let Some(slot) = qps.get_mut(&qpn) else {
            return;
        };
        // Local operations (REG_MR, LOCAL_INV, BIND_MW) run when the requester reaches
        // them; after one runs the requester may have more to send. Each round's datagrams
        // go to the link as one batch, so it can send them with few system calls.
        loop {
            let mut batch = core::mem::take(tx_batch);
            while let Some(t) = slot.engine.poll_transmit(now, mrs) {
                batch.push(t);
            }
            if !batch.is_empty() {
                counters.send_err += self.shared.link.send_batch(&batch) as u64;
                for t in batch.drain(..) {
                    crate::transport::bufpool::give(t.payload);
                }
            }
            *tx_batch = batch;
            if !slot.engine.run_local_ops(mrs) {
                break;
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
                self.shared.events.push(
                    super::EventType::CqErr,
                    super::EventElement::Cq(target.handle),
                );
            }
        }
        while let Some(ev) = slot.engine.poll_event() {
            use super::EventType as E;
            let t = match ev {
                QpEvent::Fatal => E::QpFatal,
                QpEvent::SqDrained => E::SqDrained,
                QpEvent::LastWqeReached => E::QpLastWqeReached,
            };
            self.shared.events.push(t, super::EventElement::Qp(qpn));
        }
    }
}

/// How long [`Cq::wait`] polls before it sleeps.
const CQ_WAIT_SPIN: Duration = Duration::from_micros(20);

/// A batch of received datagrams handled under one hold of the device lock
/// ([`Device::rx_batch`]). Dropping it sends every answer the batch caused, once per QP, and
/// delivers the completions; the device's other users (posting threads, timers) wait until
/// then.
pub struct RxBatch<'a> {
    dev: &'a Device,
    st: parking_lot::MutexGuard<'a, State>,
    now: Instant,
    /// QPs reached, in first-reached order, each once.
    touched: Vec<u32>,
}

impl RxBatch<'_> {
    /// Feeds one UDP datagram, as [`Device::handle_datagram`] does, except that the QP's
    /// answers wait for the end of the batch.
    pub fn datagram(&mut self, src: SocketAddr, data: &[u8]) {
        let ip = self.dev.shared.cfg.ip;
        self.receive(src, ip, data, RxHeaders::Udp);
    }

    /// Feeds datagram number `index` of a UDP GRO buffer, as
    /// [`Device::handle_gro_segment`] does, except that the answers wait for the batch's end.
    pub fn gro_segment(&mut self, src: SocketAddr, data: &[u8], index: usize) {
        let ip = self.dev.shared.cfg.ip;
        self.receive(src, ip, data, RxHeaders::UdpGro { index });
    }

    fn receive(&mut self, src: SocketAddr, dst: IpAddr, data: &[u8], hdrs: RxHeaders<'_>) {
        let RxBatch {
            dev,
            st,
            now,
            touched,
            ..
        } = self;
        if let Some(qpn) = dev.receive_locked(st, *now, src, dst, data, hdrs)
            && !touched.contains(&qpn)
        {
            touched.push(qpn);
        }
    }
}

impl Drop for RxBatch<'_> {
    fn drop(&mut self) {
        for qpn in core::mem::take(&mut self.touched) {
            self.dev.pump(&mut self.st, qpn, self.now);
        }
    }
}

impl core::fmt::Debug for RxBatch<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("RxBatch")
            .field("touched", &self.touched)
            .finish_non_exhaustive()
    }
}

impl CqShared {
    fn new(cqe: u32) -> CqShared {
        static NEXT_HANDLE: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(1);
        let (ring_tx, ring_rx) = crossbeam_channel::unbounded();
        CqShared {
            handle: NEXT_HANDLE.fetch_add(1, Ordering::Relaxed),
            ring_tx,
            ring_rx,
            queued: std::sync::atomic::AtomicUsize::new(0),
            cqe: cqe as usize,
            overflows: AtomicU64::new(0),
            notify: Default::default(),
        }
    }

    /// Adds `wc`; false when the CQ is full (the entry is dropped and counted, and the
    /// caller raises `IBV_EVENT_CQ_ERR`, as rxe `rxe_cq_post` does).
    fn push(self: &Arc<Self>, wc: Wc, solicited: bool) -> bool {
        // Counted before it is queued, uncounted after it is polled: `queued` never
        // undercounts, so the CQ never holds more than `cqe`.
        if self.queued.fetch_add(1, Ordering::AcqRel) >= self.cqe {
            self.queued.fetch_sub(1, Ordering::AcqRel);
            self.overflows.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        let error = wc.status != WcStatus::Success;
        // Cannot fail: `self` holds the receiving end.
        let _ = self.ring_tx.send(wc);
        self.notify.completed(self, solicited, error);
        true
    }

    /// Uncounts `wc`, just taken off the queue (frees its slot), and returns it.
    fn taken(&self, wc: Wc) -> Wc {
        self.queued.fetch_sub(1, Ordering::AcqRel);
        wc
    }
}

/// A protection domain.
#[derive(Debug, Clone)]
pub struct Pd {
    dev: Device,
    handle: u32,
}

impl Pd {
    /// The PD's handle (unique within its device).
    pub fn handle(&self) -> u32 {
        self.handle
    }

    pub(super) fn device(&self) -> Device {
        self.dev.clone()
    }

    /// `ibv_reg_mr` of a new zeroed buffer of `length` bytes owned by the MR.
    /// Errors: `EINVAL` for a length of 0 or over 2 GiB, or REMOTE_WRITE / REMOTE_ATOMIC
    /// without LOCAL_WRITE (as `ibv_reg_mr`); `ENOMEM` when the key table is full.
    pub fn reg_mr(&self, length: usize, access: AccessFlags) -> Result<Mr> {
        if length == 0 || length as u64 > crate::transport::MAX_MSG_BYTES {
            return Err(reg_mr_length_error(length));
        }
        if access.intersects(AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC)
            && !access.contains(AccessFlags::LOCAL_WRITE)
        {
            return Err(Error::new(
                ErrorKind::Inval,
                "reg_mr: remote write/atomic needs LOCAL_WRITE",
            ));
        }
        let mut st = self.dev.shared.state.lock();
        let lkey = st
            .mrs
            .register(self.handle, length, access)
            .ok_or_else(|| Error::new(ErrorKind::NoMem, "reg_mr: MR table full"))?;
        let addr = st.mrs.get(lkey).map_or(0, |m| m.iova);
        Ok(Mr {
            dev: self.dev.clone(),
            lkey,
            addr,
            length,
        })
    }

    /// `ibv_create_qp` for RC, UC and UD QPs. A UD QP sends from UDP source port
    /// `0xC000 + hash_32(qpn, 14)` (rxe) with the port's active MTU. Errors: `EINVAL` for
    /// capacities over the device limits; `ENOMEM` past the QP limit.
    pub fn create_qp(&self, init: &QpInitAttr<'_>) -> Result<Qp> {
        let c = init.cap;
        if c.max_send_wr == 0 || c.max_send_wr > MAX_QP_WR || c.max_recv_wr > MAX_QP_WR {
            return Err(Error::new(
                ErrorKind::Inval,
                format!(
                    "create_qp: max_send_wr {} / max_recv_wr {} out of range (max_send_wr \
                     1..={MAX_QP_WR}, max_recv_wr 0..={MAX_QP_WR}, max_qp_wr)",
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
        let mut st = self.dev.shared.state.lock();
        if st.qps.len() >= MAX_QP as usize {
            return Err(Error::new(ErrorKind::NoMem, "create_qp: too many QPs"));
        }
        let mut qpn = st.next_qpn;
        while st.qps.contains_key(&qpn) {
            qpn = if qpn >= 0x00ff_fffe {
                FIRST_QPN
            } else {
                qpn + 1
            };
        }
        st.next_qpn = if qpn >= 0x00ff_fffe {
            FIRST_QPN
        } else {
            qpn + 1
        };
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
            });
            engine.attrs_mut().path_mtu = self.dev.shared.cfg.active_mtu;
        }
        st.qps.insert(
            qpn,
            QpSlot {
                engine,
                send_cq: init.send_cq.shared.clone(),
                recv_cq: init.recv_cq.shared.clone(),
            },
        );
        Ok(Qp {
            dev: self.dev.clone(),
            qpn,
        })
    }
}

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
    /// own receive queue. With an SRQ, `cap.max_recv_wr`/`max_recv_sge` are ignored and
    /// [`Qp::post_recv`] fails with `EINVAL`.
    pub srq: Option<&'a super::Srq>,
}

/// A memory region: one that owns its buffer ([`Pd::reg_mr`], [`Pd::alloc_mr`]) or one over
/// caller memory ([`Pd::reg_mr_user`]). Dropping it deregisters it (memory windows still
/// bound to it stop granting access).
#[derive(Debug)]
pub struct Mr {
    dev: Device,
    lkey: u32,
    addr: u64,
    length: usize,
}

impl Mr {
    /// Local key (a fast-register MR's changes with each REG_MR).
    pub fn lkey(&self) -> u32 {
        let st = self.dev.shared.state.lock();
        st.mrs.get_slot(self.lkey).map_or(self.lkey, |m| m.lkey)
    }
    /// Remote key (equal to the local key, as in rxe).
    pub fn rkey(&self) -> u32 {
        self.lkey()
    }
    /// Virtual address of byte 0: what a peer puts in its RETH (a fast-register MR's is
    /// the iova of its last REG_MR).
    pub fn addr(&self) -> u64 {
        let st = self.dev.shared.state.lock();
        st.mrs.get_slot(self.lkey).map_or(self.addr, |m| m.iova)
    }
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.length
    }
    /// True for an empty MR (never: registration needs a length).
    pub fn is_empty(&self) -> bool {
        self.length == 0
    }
    /// An SGE covering `[offset, offset + length)` of this MR. Never fails: an `offset`
    /// outside the MR gives an SGE that the lkey range check refuses when it is used (the
    /// address wraps modulo 2^64 rather than overflowing).
    pub fn sge(&self, offset: usize, length: u32) -> crate::transport::Sge {
        let st = self.dev.shared.state.lock();
        let (addr, lkey) = st
            .mrs
            .get_slot(self.lkey)
            .map_or((self.addr, self.lkey), |m| (m.iova, m.lkey));
        crate::transport::Sge {
            addr: addr.wrapping_add(offset as u64),
            length,
            lkey,
        }
    }
    /// Copies bytes out of the MR. Errors: `EINVAL` if the range is outside the MR.
    pub fn read(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        let st = self.dev.shared.state.lock();
        let mr = st
            .mrs
            .get_slot(self.lkey)
            .ok_or_else(|| Error::new(ErrorKind::NoEnt, "mr: deregistered"))?;
        mr.read(offset, out)
            .map_err(|_| Error::new(ErrorKind::Inval, "mr read: range outside the MR"))
    }
    /// Copies bytes into the MR. Errors: `EINVAL` if the range is outside the MR.
    pub fn write(&self, offset: usize, data: &[u8]) -> Result<()> {
        let mut st = self.dev.shared.state.lock();
        let mr = st
            .mrs
            .get_slot_mut(self.lkey)
            .ok_or_else(|| Error::new(ErrorKind::NoEnt, "mr: deregistered"))?;
        mr.write(offset, data)
            .map_err(|_| Error::new(ErrorKind::Inval, "mr write: range outside the MR"))
    }
    /// The whole MR as a vector.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = vec![0u8; self.length];
        // The range is the MR itself, so this cannot fail while the MR lives.
        let _ = self.read(0, &mut v);
        v
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        self.dev.shared.state.lock().mrs.deregister_slot(self.lkey);
    }
}

/// A completion queue.
#[derive(Clone)]
pub struct Cq {
    shared: Arc<CqShared>,
}

impl core::fmt::Debug for Cq {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Cq").field("cqe", &self.shared.cqe).finish()
    }
}

impl Cq {
    pub(super) fn shared(&self) -> &Arc<CqShared> {
        &self.shared
    }

    pub(super) fn from_shared(shared: Arc<CqShared>) -> Cq {
        Cq { shared }
    }

    /// True when `self` and `other` are handles to the same CQ (as comparing `ibv_cq`
    /// pointers).
    pub fn same_cq(&self, other: &Cq) -> bool {
        Arc::ptr_eq(&self.shared, &other.shared)
    }

    /// `ibv_poll_cq`: moves up to `out.len()` completions into `out`; returns how many.
    /// Takes no lock: an empty poll is two atomic loads.
    pub fn poll(&self, out: &mut [Wc]) -> usize {
        let mut n = 0;
        for slot in out.iter_mut() {
            match self.poll_one() {
                Some(wc) => *slot = wc,
                None => break,
            }
            n += 1;
        }
        n
    }

    /// One completion, if any.
    pub fn poll_one(&self) -> Option<Wc> {
        self.shared
            .ring_rx
            .try_recv()
            .ok()
            .map(|wc| self.shared.taken(wc))
    }

    /// Waits up to `timeout` for at least one completion, then polls like [`Cq::poll`].
    /// Returns 0 on timeout, and at once for an empty `out`.
    pub fn wait(&self, out: &mut [Wc], timeout: Duration) -> usize {
        let now = std::time::Instant::now();
        let deadline = now + timeout;
        // Spin briefly before sleeping: a completion that comes within the spin costs no
        // wakeup (≈ 50 µs across cores here, PERF.md).
        let spin_end = now + CQ_WAIT_SPIN.min(timeout);
        while self.shared.ring_rx.is_empty() && std::time::Instant::now() < spin_end {
            std::hint::spin_loop();
        }
        let Some(first) = out.first_mut() else {
            return 0;
        };
        match self.shared.ring_rx.recv_deadline(deadline) {
            Ok(wc) => *first = self.shared.taken(wc),
            Err(_) => return 0,
        }
        1 + self.poll(&mut out[1..])
    }

    /// The CQ's number, unique in the process: what an `IBV_EVENT_CQ_ERR` event names
    /// ([`super::EventElement::Cq`]).
    pub fn cq_num(&self) -> u32 {
        self.shared.handle
    }

    /// Completions dropped because the CQ was full; each raised `IBV_EVENT_CQ_ERR`.
    pub fn overflows(&self) -> u64 {
        self.shared.overflows.load(Ordering::Relaxed)
    }
}

impl Default for Wc {
    fn default() -> Wc {
        Wc {
            wr_id: 0,
            status: WcStatus::GeneralErr,
            opcode: WcOpcode::Send,
            vendor_err: 0,
            byte_len: 0,
            imm_data: 0,
            qp_num: 0,
            src_qp: 0,
            wc_flags: crate::transport::WcFlags::empty(),
        }
    }
}

/// A queue pair. Dropping it destroys it (outstanding work is discarded).
#[derive(Debug)]
pub struct Qp {
    dev: Device,
    qpn: u32,
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

    /// Current state.
    pub fn state(&self) -> QpState {
        let st = self.dev.shared.state.lock();
        st.qps
            .get(&self.qpn)
            .map_or(QpState::Err, |s| s.engine.state())
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
        let new = check_modify(e.qp_type(), e.state(), attr, mask)?;
        let mut path = None;
        if mask.contains(A::AV) {
            let ah = &attr.ah_attr;
            let local = self
                .dev
                .shared
                .gids
                .get(usize::from(ah.sgid_index))
                .ok_or_else(|| {
                    Error::new(ErrorKind::Inval, "modify_qp: sgid_index past the GID table")
                })?;
            let remote = ah.dgid.ip();
            // Index 1 is the device's own address (IPv4-mapped or IPv6). Index 0, the
            // link-local GID derived from the MAC, names no address the device's sockets are
            // bound to, so nothing could be sent from it with a correct ICRC.
            if local.gid != Gid::from_ip(self.dev.shared.cfg.ip) {
                return Err(Error::new(
                    ErrorKind::Inval,
                    "modify_qp: sgid_index names the link-local GID, which this device does not send from (use 1)",
                ));
            }
            let local_ip = self.dev.shared.cfg.ip;
            if remote.is_ipv4() != local_ip.is_ipv4() {
                return Err(Error::new(
                    ErrorKind::Inval,
                    "modify_qp: dgid and sgid are of different IP families",
                ));
            }
            let dqpn = if mask.contains(A::DEST_QPN) {
                attr.dest_qp_num
            } else {
                e.attrs().dest_qp_num
            };
            let want = rdma_get_udp_sport(ah.flow_label, self.qpn, dqpn);
            let src_port = self.dev.shared.link.source_port(want);
            path = Some(Path {
                local: local_ip,
                remote,
                src_port,
            });
        }
        // Everything checked: commit.
        let a = e.attrs_mut();
        if mask.contains(A::PATH_MTU) {
            a.path_mtu = attr.path_mtu;
        }
        if mask.contains(A::DEST_QPN) {
            a.dest_qp_num = attr.dest_qp_num;
        }
        if mask.contains(A::RQ_PSN) {
            a.rq_psn = crate::wire::Psn::new(attr.rq_psn);
        }
        if mask.contains(A::SQ_PSN) {
            a.sq_psn = crate::wire::Psn::new(attr.sq_psn);
        }
        if mask.contains(A::TIMEOUT) {
            a.timeout = attr.timeout;
        }
        if mask.contains(A::RETRY_CNT) {
            a.retry_cnt = attr.retry_cnt;
        }
        if mask.contains(A::RNR_RETRY) {
            a.rnr_retry = attr.rnr_retry;
        }
        if mask.contains(A::MIN_RNR_TIMER) {
            a.min_rnr_timer = attr.min_rnr_timer;
        }
        if mask.contains(A::MAX_QP_RD_ATOMIC) {
            a.max_rd_atomic = attr.max_rd_atomic;
        }
        if mask.contains(A::MAX_DEST_RD_ATOMIC) {
            a.max_dest_rd_atomic = attr.max_dest_rd_atomic;
        }
        if mask.contains(A::ACCESS_FLAGS) {
            a.qp_access_flags = attr.qp_access_flags;
        }
        if mask.contains(A::QKEY) {
            a.qkey = attr.qkey;
        }
        if let Some(p) = path {
            e.set_path(p);
        }
        if mask.contains(A::STATE) {
            e.set_state(new);
        }
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
        let mut result = Ok(());
        for (i, wr) in wrs.iter().enumerate() {
            if let Err(e) = slot.engine.post_send_mem(wr.clone(), mrs) {
                result = Err(post_error("post_send", e, slot.engine.state()).at_wr(i));
                break;
            }
        }
        self.dev.pump(&mut st, self.qpn, now);
        drop(st);
        self.dev.shared.link.wake();
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
    fn detach_locked(&self, st: &mut State, group: IpAddr, qpn: u32) -> bool {
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

/// Everything needed to take an RC QP from RESET to RTS in one call (see
/// [`Qp::connect_rc`]). Field names are the `ibv_qp_attr` ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RcConnect {
    /// The peer's QPN.
    pub dest_qp_num: u32,
    /// The peer's GID.
    pub dgid: Gid,
    /// The first PSN the peer sends (our `rq_psn`).
    pub rq_psn: u32,
    /// The first PSN we send.
    pub sq_psn: u32,
    /// Path MTU (both sides must agree).
    pub path_mtu: PathMtu,
    /// Remote access this QP allows.
    pub qp_access_flags: AccessFlags,
    /// ACK timeout exponent (14 ≈ 67 ms).
    pub timeout: u8,
    /// Retries on timeout.
    pub retry_cnt: u8,
    /// Retries on RNR NAK (7 = forever).
    pub rnr_retry: u8,
    /// RNR timer code we send (12 = 0.64 ms).
    pub min_rnr_timer: u8,
    /// Outstanding READ/atomics we issue and accept.
    pub max_rd_atomic: u8,
}

impl RcConnect {
    /// The settings rdma-core's `ibv_rc_pingpong` uses, towards `dest_qp_num` at `dgid`.
    pub fn new(dest_qp_num: u32, dgid: Gid, rq_psn: u32, sq_psn: u32) -> RcConnect {
        RcConnect {
            dest_qp_num,
            dgid,
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
        }
    }
}

impl Qp {
    /// Takes an RC QP through RESET→INIT→RTR→RTS with `ibv_modify_qp`, exactly as the
    /// rdma-core examples do; for a UC QP, the same with the attributes UC takes (no READ /
    /// atomic limits, RNR timer, timeout or retry counts). Errors: those of [`Qp::modify`].
    pub fn connect_rc(&self, c: &RcConnect) -> Result<()> {
        let uc = {
            let st = self.dev.shared.state.lock();
            st.qps.get(&self.qpn).map(|s| s.engine.qp_type()) == Some(QpType::Uc)
        };
        let init = QpAttr {
            qp_state: QpState::Init,
            pkey_index: 0,
            port_num: 1,
            qp_access_flags: c.qp_access_flags,
            ..QpAttr::default()
        };
        self.modify(&init, A::STATE | A::PKEY_INDEX | A::PORT | A::ACCESS_FLAGS)?;
        let rtr = QpAttr {
            qp_state: QpState::Rtr,
            path_mtu: c.path_mtu,
            dest_qp_num: c.dest_qp_num,
            rq_psn: c.rq_psn,
            max_dest_rd_atomic: c.max_rd_atomic,
            min_rnr_timer: c.min_rnr_timer,
            ah_attr: super::AhAttr::roce_v2(c.dgid),
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
    /// Takes a UD QP through RESET→INIT→RTR→RTS with Q_Key `qkey` and first PSN `sq_psn`,
    /// as `ibv_ud_pingpong` does. Errors: those of [`Qp::modify`].
    pub fn ready_ud(&self, qkey: u32, sq_psn: u32) -> Result<()> {
        let init = QpAttr {
            qp_state: QpState::Init,
            pkey_index: 0,
            port_num: 1,
            qkey,
            ..QpAttr::default()
        };
        self.modify(&init, A::STATE | A::PKEY_INDEX | A::PORT | A::QKEY)?;
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

/// An address handle (`ibv_ah`): where UD sends go. For RoCEv2 the destination GID names
/// the IP address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ah {
    dgid: Gid,
}

impl Ah {
    /// The destination GID.
    pub fn dgid(&self) -> Gid {
        self.dgid
    }
    /// The `wr.ud` of a send to QP `remote_qpn` with Q_Key `remote_qkey` behind this AH.
    pub fn dest(&self, remote_qpn: u32, remote_qkey: u32) -> crate::transport::UdDest {
        crate::transport::UdDest {
            remote_ip: self.dgid.ip(),
            remote_qpn,
            remote_qkey,
        }
    }
}

impl Pd {
    /// `ibv_create_ah`. Errors: `EINVAL` when the destination GID is of another IP family
    /// than the device's address.
    pub fn create_ah(&self, attr: &super::AhAttr) -> Result<Ah> {
        if attr.dgid.ip().is_ipv4() != self.dev.shared.cfg.ip.is_ipv4() {
            return Err(Error::new(
                ErrorKind::Inval,
                "create_ah: dgid of another IP family than the device",
            ));
        }
        Ok(Ah { dgid: attr.dgid })
    }
}

/// The error of a refused post on a QP in `state`; a refusal for the state names it and the
/// state that would accept the post.
fn post_error(call: &'static str, e: PostError, state: QpState) -> Error {
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
        // Device counters only grow (as rxe's hw_counters): keep the QP's counts.
        if let Some(slot) = st.qps.remove(&self.qpn) {
            let c = slot.engine.counters().clone();
            st.counters.add(&c);
        }
        st.srqs.detach(self.qpn);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wc(wr_id: u64) -> Wc {
        Wc {
            wr_id,
            status: WcStatus::Success,
            ..Wc::default()
        }
    }

    /// The lock-free CQ keeps order, holds at most `cqe` completions (the rest overflow and
    /// are counted), frees a slot per poll, and `wait` sleeps until another thread pushes.
    #[test]
    fn cq_keeps_order_and_bounds_and_wakes_a_waiter() {
        let cq = Cq::from_shared(Arc::new(CqShared::new(3)));
        let sh = cq.shared().clone();
        for i in 0..4 {
            assert_eq!(sh.push(wc(i), false), i < 3, "push {i}");
        }
        assert_eq!(cq.overflows(), 1);
        let mut out = [Wc::default(); 2];
        assert_eq!(cq.poll(&mut out), 2);
        assert_eq!([out[0].wr_id, out[1].wr_id], [0, 1]);
        assert!(sh.push(wc(10), false) && sh.push(wc(11), false));
        assert!(!sh.push(wc(12), false), "full again at 3");
        let mut all = [Wc::default(); 8];
        assert_eq!(cq.poll(&mut all), 3);
        assert_eq!([all[0].wr_id, all[1].wr_id, all[2].wr_id], [2, 10, 11]);
        assert_eq!(cq.poll(&mut all), 0);
        assert_eq!(cq.wait(&mut all, Duration::from_millis(20)), 0, "timeout");

        let pusher = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            sh.push(wc(20), false) && sh.push(wc(21), false)
        });
        let n = cq.wait(&mut all, Duration::from_secs(10));
        assert!(pusher.join().unwrap_or(false));
        assert!(
            n >= 1 && all[0].wr_id == 20,
            "woken with the first completion"
        );
        let rest = cq.poll(&mut all[n..]);
        assert_eq!(n + rest, 2);
    }

    #[test]
    fn udp_source_ports_match_rxe_captures() {
        // FACTS §2.1: QPN 0x13 → 0xD078 at creation; RC pairs 0x18↔0x18 → 0xC240,
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
