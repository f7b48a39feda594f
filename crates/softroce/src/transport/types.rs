//! The transport's vocabulary: QP types and states, path MTU, access / send / completion
//! flags, the addressing of a QP, its attributes and capacities, and why a post is refused.
//! Plain data with `ibv_*` names; the engine that runs on it is in [`super::QpEngine`].
//! Nothing here allocates, panics or does I/O.

use crate::wire::{Gid, IcrcIp, Psn, ROCE_V2_UDP_PORT};
use core::net::IpAddr;

/// Queue pair transport type. Source: `enum ibv_qp_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QpType {
    /// Reliable connected (`IBV_QPT_RC`).
    Rc,
    /// Unreliable connected (`IBV_QPT_UC`).
    Uc,
    /// Unreliable datagram (`IBV_QPT_UD`).
    Ud,
    /// The general services QP, QP1 (`IB_QPT_GSI`): UD on the wire, created by the device,
    /// Q_Key fixed at 0x8001_0000 for what it sends and receives (rxe `GSI_QKEY`).
    Gsi,
}

impl QpType {
    /// True for the datagram types (UD and GSI), which share the UD data path.
    pub const fn is_datagram(self) -> bool {
        matches!(self, QpType::Ud | QpType::Gsi)
    }
}

/// The Q_Key of QP1: every GSI packet carries it and QP1 accepts no other. Source: ib_core
/// `IB_QP1_QKEY`; rxe `GSI_QKEY` in `rxe_req.c` / `rxe_recv.c` `check_keys`.
pub const GSI_QKEY: u32 = 0x8001_0000;

/// The DestQP of every multicast packet. Source: IBTA Vol 1 ch. 10 (multicast: QP 0xFFFFFF);
/// ib_core `IB_MULTICAST_QPN`.
pub const MULTICAST_QPN: u32 = 0x00ff_ffff;

/// Queue pair state, in `enum ibv_qp_state` order. Source: IBTA Vol 1 ch. 10 (QP state machine).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum QpState {
    /// `IBV_QPS_RESET`.
    Reset,
    /// `IBV_QPS_INIT`.
    Init,
    /// `IBV_QPS_RTR`: ready to receive.
    Rtr,
    /// `IBV_QPS_RTS`: ready to send.
    Rts,
    /// `IBV_QPS_SQD`: send queue drained.
    Sqd,
    /// `IBV_QPS_SQE`: send queue error.
    Sqe,
    /// `IBV_QPS_ERR`.
    Err,
}

impl QpState {
    /// Upper-case verbs name (`RESET`, `INIT`, `RTR`, …).
    pub const fn name(self) -> &'static str {
        match self {
            QpState::Reset => "RESET",
            QpState::Init => "INIT",
            QpState::Rtr => "RTR",
            QpState::Rts => "RTS",
            QpState::Sqd => "SQD",
            QpState::Sqe => "SQE",
            QpState::Err => "ERR",
        }
    }
}

/// Path MTU: the largest payload of one packet. Source: `enum ibv_mtu` (1 = 256 … 5 = 4096).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum PathMtu {
    /// 256 bytes (`IBV_MTU_256` = 1).
    Mtu256 = 1,
    /// 512 bytes.
    Mtu512 = 2,
    /// 1024 bytes.
    Mtu1024 = 3,
    /// 2048 bytes.
    Mtu2048 = 4,
    /// 4096 bytes.
    Mtu4096 = 5,
}

impl PathMtu {
    /// Payload bytes per packet.
    pub const fn bytes(self) -> u32 {
        128 << (self as u32)
    }
    /// From a byte count (256, 512, 1024, 2048, 4096).
    pub const fn from_bytes(b: u32) -> Option<PathMtu> {
        match b {
            256 => Some(PathMtu::Mtu256),
            512 => Some(PathMtu::Mtu512),
            1024 => Some(PathMtu::Mtu1024),
            2048 => Some(PathMtu::Mtu2048),
            4096 => Some(PathMtu::Mtu4096),
            _ => None,
        }
    }
    /// The largest MTU not above `bytes`: how kernel rxe (`eth_mtu_int_to_enum`) and rdma_cm
    /// (`iboe_get_mtu`) turn what a link leaves after their headers into an IB MTU.
    /// Units: bytes in. Errors: None below 256 bytes.
    pub const fn largest_fitting(bytes: u32) -> Option<PathMtu> {
        if bytes >= 4096 {
            Some(PathMtu::Mtu4096)
        } else if bytes >= 2048 {
            Some(PathMtu::Mtu2048)
        } else if bytes >= 1024 {
            Some(PathMtu::Mtu1024)
        } else if bytes >= 512 {
            Some(PathMtu::Mtu512)
        } else if bytes >= 256 {
            Some(PathMtu::Mtu256)
        } else {
            None
        }
    }
    /// From the `enum ibv_mtu` value (1..=5).
    pub const fn from_ibv(v: u8) -> Option<PathMtu> {
        match v {
            1 => Some(PathMtu::Mtu256),
            2 => Some(PathMtu::Mtu512),
            3 => Some(PathMtu::Mtu1024),
            4 => Some(PathMtu::Mtu2048),
            5 => Some(PathMtu::Mtu4096),
            _ => None,
        }
    }
}

macro_rules! bitflags_u32 {
    ($(#[$m:meta])* $name:ident { $($(#[$fm:meta])* $f:ident = $v:expr,)* }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
        pub struct $name(pub u32);
        impl $name {
            $($(#[$fm])* pub const $f: $name = $name($v);)*
            /// No flag.
            pub const fn empty() -> $name { $name(0) }
            /// True when every flag of `o` is set.
            pub const fn contains(self, o: $name) -> bool { self.0 & o.0 == o.0 }
            /// True when any flag of `o` is set.
            pub const fn intersects(self, o: $name) -> bool { self.0 & o.0 != 0 }
        }
        impl core::ops::BitOr for $name {
            type Output = $name;
            fn bitor(self, o: $name) -> $name { $name(self.0 | o.0) }
        }
        impl core::ops::BitOrAssign for $name {
            fn bitor_assign(&mut self, o: $name) { self.0 |= o.0; }
        }
    };
}

bitflags_u32!(
    /// Memory and QP access flags. Source: `enum ibv_access_flags`.
    AccessFlags {
        /// `IBV_ACCESS_LOCAL_WRITE`.
        LOCAL_WRITE = 1,
        /// `IBV_ACCESS_REMOTE_WRITE`.
        REMOTE_WRITE = 2,
        /// `IBV_ACCESS_REMOTE_READ`.
        REMOTE_READ = 4,
        /// `IBV_ACCESS_REMOTE_ATOMIC`.
        REMOTE_ATOMIC = 8,
        /// `IBV_ACCESS_MW_BIND`.
        MW_BIND = 16,
        /// `IBV_ACCESS_ZERO_BASED`: a memory window addressed from 0 (type 2 windows only):
        /// a peer's va is an offset from the bound address. Source: IBTA Vol 1 ch. 10
        /// (zero based virtual address, o10-36.2.2); rxe `rxe_mw.c`, `rxe_resp.c`.
        ZERO_BASED = 32,
    }
);

bitflags_u32!(
    /// Send work request flags. Source: `enum ibv_send_flags`.
    SendFlags {
        /// `IBV_SEND_FENCE`: wait for earlier READ/atomics to complete.
        FENCE = 1,
        /// `IBV_SEND_SIGNALED`: generate a work completion on success.
        SIGNALED = 2,
        /// `IBV_SEND_SOLICITED`: set SE on the last packet.
        SOLICITED = 4,
        /// `IBV_SEND_INLINE`: copy the data at post time.
        INLINE = 8,
    }
);

bitflags_u32!(
    /// Work completion flags. Source: `enum ibv_wc_flags`.
    WcFlags {
        /// `IBV_WC_GRH`: the message came with a network header, as every RoCE receive does
        /// (rxe sets it on every successful receive completion); for UD it also occupies
        /// the first 40 bytes of the buffer.
        GRH = 1,
        /// `IBV_WC_WITH_IMM`: `imm_data` is valid.
        WITH_IMM = 2,
        /// `IBV_WC_WITH_INV`: a SEND_WITH_INVALIDATE invalidated the R_Key in `imm_data`
        /// (libibverbs' `invalidated_rkey`, which shares the union with `imm_data`).
        WITH_INV = 8,
    }
);

/// The IP header fields an address vector chooses for the packets sent with it: IPv4 TOS /
/// IPv6 traffic class, and the TTL / hop limit. Both are masked in the ICRC, so they never
/// change a packet's bytes above IP; the link applies them per datagram.
///
/// Units: `traffic_class` is the whole byte (DSCP << 2 | ECN; 0xB8 is DSCP 46);
/// `hop_limit` is a count of hops, `None` for the route's default (what ib_core gives a
/// unicast RoCE address vector, whatever `hop_limit` the application asked for).
/// Source: rxe `rxe_net.c` `prepare_ipv4_hdr` / `prepare_ipv6_hdr` (TOS = `av->grh.traffic_class`,
/// TTL = `av->grh.hop_limit`); ib_core `ib_resolve_eth_dmac` (a unicast RoCE address vector's
/// hop limit comes from the route); docs/wire-facts.md §2.1.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct IpFields {
    /// IPv4 TOS / IPv6 traffic class byte.
    pub traffic_class: u8,
    /// IPv4 TTL / IPv6 hop limit; `None`: the sending socket's default for the route.
    pub hop_limit: Option<u8>,
}

/// The addressing of a connected QP, fixed at RTR.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Path {
    /// This device's address (the source GID's IP).
    pub local: IpAddr,
    /// The peer's address (the destination GID's IP).
    pub remote: IpAddr,
    /// UDP source port for this QP's packets.
    pub src_port: u16,
    /// Traffic class and hop limit of this QP's packets (its address vector's GRH).
    pub ip: IpFields,
}

impl Path {
    pub(crate) fn icrc_ip(&self) -> IcrcIp {
        match (self.local, self.remote) {
            (IpAddr::V4(src), IpAddr::V4(dst)) => IcrcIp::V4 {
                src,
                dst,
                ident: 0,
                src_port: self.src_port,
                dst_port: ROCE_V2_UDP_PORT,
            },
            (src, dst) => IcrcIp::V6 {
                src: Gid::from_ip(src).ipv6(),
                dst: Gid::from_ip(dst).ipv6(),
                src_port: self.src_port,
                dst_port: ROCE_V2_UDP_PORT,
            },
        }
    }
}

/// The QP attributes the engine runs on (the `ibv_qp_attr` fields, as last set).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpAttrs {
    /// Path MTU.
    pub path_mtu: PathMtu,
    /// Remote QP number.
    pub dest_qp_num: u32,
    /// First PSN the responder expects.
    pub rq_psn: Psn,
    /// First PSN the requester sends.
    pub sq_psn: Psn,
    /// ACK timeout exponent (4.096 µs × 2^timeout; 0 = none).
    pub timeout: u8,
    /// Retries on timeout / sequence NAK (0..=7).
    pub retry_cnt: u8,
    /// Retries on RNR NAK (0..=7; 7 = forever).
    pub rnr_retry: u8,
    /// RNR timer code this responder sends in RNR NAKs.
    pub min_rnr_timer: u8,
    /// Outstanding READ/atomic requests this requester may have.
    pub max_rd_atomic: u8,
    /// Outstanding READ/atomic requests this responder accepts.
    pub max_dest_rd_atomic: u8,
    /// Remote operations this QP allows.
    pub qp_access_flags: AccessFlags,
    /// Q_Key (UD).
    pub qkey: u32,
}

impl Default for QpAttrs {
    fn default() -> QpAttrs {
        QpAttrs {
            path_mtu: PathMtu::Mtu1024,
            dest_qp_num: 0,
            rq_psn: Psn::new(0),
            sq_psn: Psn::new(0),
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 12,
            max_rd_atomic: 1,
            max_dest_rd_atomic: 1,
            qp_access_flags: AccessFlags::empty(),
            qkey: 0,
        }
    }
}

/// Sizes fixed at QP creation. Source: `struct ibv_qp_cap`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpCap {
    /// Send queue depth.
    pub max_send_wr: u32,
    /// Receive queue depth.
    pub max_recv_wr: u32,
    /// SGEs per send WR.
    pub max_send_sge: u32,
    /// SGEs per receive WR.
    pub max_recv_sge: u32,
    /// Most bytes an IBV_SEND_INLINE WR may carry (at most
    /// [`MAX_INLINE_DATA`](super::MAX_INLINE_DATA), 512, as rxe).
    pub max_inline_data: u32,
}

impl Default for QpCap {
    fn default() -> QpCap {
        QpCap {
            max_send_wr: 256,
            max_recv_wr: 256,
            max_send_sge: 4,
            max_recv_sge: 4,
            max_inline_data: 0,
        }
    }
}

/// Why a post was refused (the verbs layer maps these to errno kinds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PostError {
    /// The queue is full (ENOMEM).
    QueueFull,
    /// The QP state does not allow posting (EINVAL).
    WrongState,
    /// The WR itself is invalid (EINVAL), with what is wrong.
    Invalid(&'static str),
    /// The operation is not supported on this QP type (EOPNOTSUPP).
    NotSupported,
}
