//! `modify_qp`: the attribute struct, the attribute mask, and the table of allowed state
//! transitions with their required and optional attributes (also in `spec/qp_states.toml`,
//! compared row by row in `tests/spec_tables_qp.rs`).
//!
//! Source: IBTA Vol 1 ch. 10 (QP state transitions); kernel ib_core `qp_state_table` and
//! `ib_modify_qp_is_ok`, which rxe applies before `rxe_qp_chk_attr`.

use super::{Error, ErrorKind, Gid};
use crate::transport::{AccessFlags, IpFields, PathMtu, QpState, QpType};
use crate::wire::Psn;

/// Which fields of [`QpAttr`] a `modify_qp` call sets. Bit values are `enum ibv_qp_attr_mask`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct QpAttrMask(pub u32);

impl QpAttrMask {
    /// `IBV_QP_STATE`.
    pub const STATE: QpAttrMask = QpAttrMask(1 << 0);
    /// `IBV_QP_CUR_STATE`.
    pub const CUR_STATE: QpAttrMask = QpAttrMask(1 << 1);
    /// `IBV_QP_EN_SQD_ASYNC_NOTIFY`.
    pub const EN_SQD_ASYNC_NOTIFY: QpAttrMask = QpAttrMask(1 << 2);
    /// `IBV_QP_ACCESS_FLAGS`.
    pub const ACCESS_FLAGS: QpAttrMask = QpAttrMask(1 << 3);
    /// `IBV_QP_PKEY_INDEX`.
    pub const PKEY_INDEX: QpAttrMask = QpAttrMask(1 << 4);
    /// `IBV_QP_PORT`.
    pub const PORT: QpAttrMask = QpAttrMask(1 << 5);
    /// `IBV_QP_QKEY`.
    pub const QKEY: QpAttrMask = QpAttrMask(1 << 6);
    /// `IBV_QP_AV`.
    pub const AV: QpAttrMask = QpAttrMask(1 << 7);
    /// `IBV_QP_PATH_MTU`.
    pub const PATH_MTU: QpAttrMask = QpAttrMask(1 << 8);
    /// `IBV_QP_TIMEOUT`.
    pub const TIMEOUT: QpAttrMask = QpAttrMask(1 << 9);
    /// `IBV_QP_RETRY_CNT`.
    pub const RETRY_CNT: QpAttrMask = QpAttrMask(1 << 10);
    /// `IBV_QP_RNR_RETRY`.
    pub const RNR_RETRY: QpAttrMask = QpAttrMask(1 << 11);
    /// `IBV_QP_RQ_PSN`.
    pub const RQ_PSN: QpAttrMask = QpAttrMask(1 << 12);
    /// `IBV_QP_MAX_QP_RD_ATOMIC`.
    pub const MAX_QP_RD_ATOMIC: QpAttrMask = QpAttrMask(1 << 13);
    /// `IBV_QP_ALT_PATH`.
    pub const ALT_PATH: QpAttrMask = QpAttrMask(1 << 14);
    /// `IBV_QP_MIN_RNR_TIMER`.
    pub const MIN_RNR_TIMER: QpAttrMask = QpAttrMask(1 << 15);
    /// `IBV_QP_SQ_PSN`.
    pub const SQ_PSN: QpAttrMask = QpAttrMask(1 << 16);
    /// `IBV_QP_MAX_DEST_RD_ATOMIC`.
    pub const MAX_DEST_RD_ATOMIC: QpAttrMask = QpAttrMask(1 << 17);
    /// `IBV_QP_PATH_MIG_STATE`.
    pub const PATH_MIG_STATE: QpAttrMask = QpAttrMask(1 << 18);
    /// `IBV_QP_CAP`.
    pub const CAP: QpAttrMask = QpAttrMask(1 << 19);
    /// `IBV_QP_DEST_QPN`.
    pub const DEST_QPN: QpAttrMask = QpAttrMask(1 << 20);

    /// Every named bit with its `IBV_QP_*` name (without the prefix), in bit order.
    pub const NAMES: [(QpAttrMask, &'static str); 21] = [
        (Self::STATE, "STATE"),
        (Self::CUR_STATE, "CUR_STATE"),
        (Self::EN_SQD_ASYNC_NOTIFY, "EN_SQD_ASYNC_NOTIFY"),
        (Self::ACCESS_FLAGS, "ACCESS_FLAGS"),
        (Self::PKEY_INDEX, "PKEY_INDEX"),
        (Self::PORT, "PORT"),
        (Self::QKEY, "QKEY"),
        (Self::AV, "AV"),
        (Self::PATH_MTU, "PATH_MTU"),
        (Self::TIMEOUT, "TIMEOUT"),
        (Self::RETRY_CNT, "RETRY_CNT"),
        (Self::RNR_RETRY, "RNR_RETRY"),
        (Self::RQ_PSN, "RQ_PSN"),
        (Self::MAX_QP_RD_ATOMIC, "MAX_QP_RD_ATOMIC"),
        (Self::ALT_PATH, "ALT_PATH"),
        (Self::MIN_RNR_TIMER, "MIN_RNR_TIMER"),
        (Self::SQ_PSN, "SQ_PSN"),
        (Self::MAX_DEST_RD_ATOMIC, "MAX_DEST_RD_ATOMIC"),
        (Self::PATH_MIG_STATE, "PATH_MIG_STATE"),
        (Self::CAP, "CAP"),
        (Self::DEST_QPN, "DEST_QPN"),
    ];

    /// True when every bit of `o` is set.
    pub const fn contains(self, o: QpAttrMask) -> bool {
        self.0 & o.0 == o.0
    }

    /// The mask bit with this name.
    pub fn from_name(name: &str) -> Option<QpAttrMask> {
        Self::NAMES
            .iter()
            .find(|(_, n)| *n == name)
            .map(|(m, _)| *m)
    }
}

impl core::ops::BitOr for QpAttrMask {
    type Output = QpAttrMask;
    fn bitor(self, o: QpAttrMask) -> QpAttrMask {
        QpAttrMask(self.0 | o.0)
    }
}

/// Address vector (`struct ibv_ah_attr` with its GRH) for RoCEv2: the peer is named by its
/// GID, whose IPv4-mapped form selects IPv4.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AhAttr {
    /// Destination GID.
    pub dgid: Gid,
    /// Index of the local GID to send from (1 = the IPv4-mapped one).
    pub sgid_index: u8,
    /// Flow label (0 = derive the UDP source port from the QPNs, as rxe).
    pub flow_label: u32,
    /// Hop limit (IPv4 TTL); masked in the ICRC.
    pub hop_limit: u8,
    /// Traffic class (IPv4 TOS); masked in the ICRC.
    pub traffic_class: u8,
    /// Port number (1).
    pub port_num: u8,
}

impl AhAttr {
    /// The IP header fields of the packets sent with this address vector: its traffic
    /// class always; its hop limit only toward a multicast group. ib_core replaces the hop
    /// limit of a unicast RoCE address vector with the route's (`ib_resolve_eth_dmac`, at
    /// `ibv_create_ah` and at `modify_qp` with an AV), so rxe's unicast packets leave with
    /// the route's TTL (64) whatever was asked (`ibv_rc_pingpong` asks for 1), and its
    /// multicast ones with this hop limit. Source: rxe `rxe_net.c` `prepare_ipv4_hdr`;
    /// docs/wire-facts.md §2.1.
    pub fn ip_fields(&self) -> IpFields {
        IpFields {
            traffic_class: self.traffic_class,
            hop_limit: self.dgid.ip().is_multicast().then_some(self.hop_limit),
        }
    }

    /// A RoCEv2 address vector to `dgid` from GID index 1, hop limit 64.
    pub fn roce_v2(dgid: Gid) -> AhAttr {
        AhAttr {
            dgid,
            sgid_index: 1,
            flow_label: 0,
            hop_limit: 64,
            traffic_class: 0,
            port_num: 1,
        }
    }
}

/// QP attributes (`struct ibv_qp_attr`); only the fields named in the mask are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpAttr {
    /// Target state.
    pub qp_state: QpState,
    /// Current state the caller believes the QP is in (checked when CUR_STATE is given).
    pub cur_qp_state: QpState,
    /// Path MTU.
    pub path_mtu: PathMtu,
    /// Q_Key (UD).
    pub qkey: u32,
    /// Receive queue PSN.
    pub rq_psn: u32,
    /// Send queue PSN.
    pub sq_psn: u32,
    /// Remote QPN.
    pub dest_qp_num: u32,
    /// Remote access allowed on this QP.
    pub qp_access_flags: AccessFlags,
    /// Address vector.
    pub ah_attr: AhAttr,
    /// P_Key index (0).
    pub pkey_index: u16,
    /// Requester outstanding READ/atomic limit.
    pub max_rd_atomic: u8,
    /// Responder outstanding READ/atomic limit.
    pub max_dest_rd_atomic: u8,
    /// RNR NAK timer code (0..=31).
    pub min_rnr_timer: u8,
    /// Port number (1).
    pub port_num: u8,
    /// ACK timeout exponent (0..=31).
    pub timeout: u8,
    /// Retry count (0..=7).
    pub retry_cnt: u8,
    /// RNR retry count (0..=7, 7 = infinite).
    pub rnr_retry: u8,
}

impl Default for QpAttr {
    fn default() -> QpAttr {
        QpAttr {
            qp_state: QpState::Reset,
            cur_qp_state: QpState::Reset,
            path_mtu: PathMtu::Mtu1024,
            qkey: 0,
            rq_psn: 0,
            sq_psn: 0,
            dest_qp_num: 0,
            qp_access_flags: AccessFlags::empty(),
            ah_attr: AhAttr::roce_v2(Gid::ZERO),
            pkey_index: 0,
            max_rd_atomic: 0,
            max_dest_rd_atomic: 0,
            min_rnr_timer: 0,
            port_num: 1,
            timeout: 0,
            retry_cnt: 0,
            rnr_retry: 0,
        }
    }
}

/// The attributes one QP type must and may set in one transition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Params {
    /// Attributes that must be in the mask (besides STATE).
    pub required: QpAttrMask,
    /// Attributes that may be in the mask.
    pub optional: QpAttrMask,
}

/// One row of the transition table: a (from, to) pair that `modify_qp` accepts, with the
/// attributes of each QP type. A pair not in [`TRANSITIONS`] is refused for every type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transition {
    /// From state.
    pub from: QpState,
    /// To state.
    pub to: QpState,
    /// RC attributes.
    pub rc: Params,
    /// UC attributes.
    pub uc: Params,
    /// UD attributes.
    pub ud: Params,
    /// GSI (QP1) attributes.
    pub gsi: Params,
}

impl Transition {
    /// The attributes of `qp_type` in this transition.
    pub const fn params(&self, qp_type: QpType) -> Params {
        match qp_type {
            QpType::Rc => self.rc,
            QpType::Uc => self.uc,
            QpType::Ud => self.ud,
            QpType::Gsi => self.gsi,
        }
    }
}

const fn m(bits: &[QpAttrMask]) -> QpAttrMask {
    let mut v = 0;
    let mut i = 0;
    while i < bits.len() {
        v |= bits[i].0;
        i += 1;
    }
    QpAttrMask(v)
}

const fn p(required: &[QpAttrMask], optional: &[QpAttrMask]) -> Params {
    Params {
        required: m(required),
        optional: m(optional),
    }
}

use QpAttrMask as A;
use QpState as S;

/// No attributes besides STATE.
const NONE: Params = p(&[], &[]);

/// A row whose four QP types take no attribute (the moves to RESET and ERR).
const fn bare(from: QpState, to: QpState) -> Transition {
    Transition {
        from,
        to,
        rc: NONE,
        uc: NONE,
        ud: NONE,
        gsi: NONE,
    }
}

const RC_INIT: &[QpAttrMask] = &[A::PKEY_INDEX, A::PORT, A::ACCESS_FLAGS];
const UD_INIT: &[QpAttrMask] = &[A::PKEY_INDEX, A::PORT, A::QKEY];
const GSI_INIT: &[QpAttrMask] = &[A::PKEY_INDEX, A::QKEY];
const RTR_OPT: &[QpAttrMask] = &[A::ALT_PATH, A::ACCESS_FLAGS, A::PKEY_INDEX];
const RC_RTS_OPT: &[QpAttrMask] = &[
    A::CUR_STATE,
    A::ALT_PATH,
    A::ACCESS_FLAGS,
    A::MIN_RNR_TIMER,
    A::PATH_MIG_STATE,
];
const UC_RTS_OPT: &[QpAttrMask] = &[
    A::CUR_STATE,
    A::ALT_PATH,
    A::ACCESS_FLAGS,
    A::PATH_MIG_STATE,
];
const UD_RTS_OPT: &[QpAttrMask] = &[A::CUR_STATE, A::QKEY];
const SQD_OPT: Params = p(&[], &[A::EN_SQD_ASYNC_NOTIFY]);

/// The transition table, mirrored row by row in `spec/qp_states.toml` (and compared with it
/// in `tests/spec_tables_qp.rs`). Source: ib_core `qp_state_table`.
pub const TRANSITIONS: &[Transition] = &[
    bare(S::Reset, S::Reset),
    Transition {
        from: S::Reset,
        to: S::Init,
        rc: p(RC_INIT, &[]),
        uc: p(RC_INIT, &[]),
        ud: p(UD_INIT, &[]),
        gsi: p(GSI_INIT, &[]),
    },
    bare(S::Init, S::Reset),
    bare(S::Init, S::Err),
    Transition {
        from: S::Init,
        to: S::Init,
        rc: p(&[], RC_INIT),
        uc: p(&[], RC_INIT),
        ud: p(&[], UD_INIT),
        gsi: p(&[], GSI_INIT),
    },
    Transition {
        from: S::Init,
        to: S::Rtr,
        rc: p(
            &[
                A::AV,
                A::PATH_MTU,
                A::DEST_QPN,
                A::RQ_PSN,
                A::MAX_DEST_RD_ATOMIC,
                A::MIN_RNR_TIMER,
            ],
            RTR_OPT,
        ),
        uc: p(&[A::AV, A::PATH_MTU, A::DEST_QPN, A::RQ_PSN], RTR_OPT),
        ud: p(&[], GSI_INIT),
        gsi: p(&[], GSI_INIT),
    },
    bare(S::Rtr, S::Reset),
    bare(S::Rtr, S::Err),
    Transition {
        from: S::Rtr,
        to: S::Rts,
        rc: p(
            &[
                A::SQ_PSN,
                A::TIMEOUT,
                A::RETRY_CNT,
                A::RNR_RETRY,
                A::MAX_QP_RD_ATOMIC,
            ],
            RC_RTS_OPT,
        ),
        uc: p(&[A::SQ_PSN], UC_RTS_OPT),
        ud: p(&[A::SQ_PSN], UD_RTS_OPT),
        gsi: p(&[A::SQ_PSN], UD_RTS_OPT),
    },
    bare(S::Rts, S::Reset),
    bare(S::Rts, S::Err),
    Transition {
        from: S::Rts,
        to: S::Rts,
        rc: p(&[], RC_RTS_OPT),
        uc: p(&[], UC_RTS_OPT),
        ud: p(&[], UD_RTS_OPT),
        gsi: p(&[], UD_RTS_OPT),
    },
    Transition {
        from: S::Rts,
        to: S::Sqd,
        rc: SQD_OPT,
        uc: SQD_OPT,
        ud: SQD_OPT,
        gsi: SQD_OPT,
    },
    bare(S::Sqd, S::Reset),
    bare(S::Sqd, S::Err),
    Transition {
        from: S::Sqd,
        to: S::Rts,
        rc: p(&[], RC_RTS_OPT),
        uc: p(&[], UC_RTS_OPT),
        ud: p(&[], UD_RTS_OPT),
        gsi: p(&[], UD_RTS_OPT),
    },
    Transition {
        from: S::Sqd,
        to: S::Sqd,
        rc: p(
            &[],
            &[
                A::PORT,
                A::AV,
                A::TIMEOUT,
                A::RETRY_CNT,
                A::RNR_RETRY,
                A::MAX_QP_RD_ATOMIC,
                A::MAX_DEST_RD_ATOMIC,
                A::ALT_PATH,
                A::ACCESS_FLAGS,
                A::PKEY_INDEX,
                A::MIN_RNR_TIMER,
                A::PATH_MIG_STATE,
            ],
        ),
        uc: p(
            &[],
            &[
                A::AV,
                A::ALT_PATH,
                A::ACCESS_FLAGS,
                A::PKEY_INDEX,
                A::PATH_MIG_STATE,
            ],
        ),
        ud: p(&[], GSI_INIT),
        gsi: p(&[], GSI_INIT),
    },
    bare(S::Sqe, S::Reset),
    bare(S::Sqe, S::Err),
    // RC never enters SQE (a send error takes it to ERR); ib_core still marks the pair
    // valid with no RC attributes, and so does this table.
    Transition {
        from: S::Sqe,
        to: S::Rts,
        rc: NONE,
        uc: p(&[], &[A::CUR_STATE, A::ACCESS_FLAGS]),
        ud: p(&[], UD_RTS_OPT),
        gsi: p(&[], UD_RTS_OPT),
    },
    bare(S::Err, S::Reset),
    bare(S::Err, S::Err),
];

/// Checks a `modify_qp` call against the table before anything changes (rxe
/// `rxe_qp_chk_attr` after `ib_modify_qp_is_ok`). Returns the target state.
///
/// Errors (all `EINVAL`): a (from, to) pair not in [`TRANSITIONS`] ("transition not
/// allowed"); a required attribute missing (the message names the first one in bit order);
/// an attribute not allowed for the transition and QP type (named); `CUR_STATE` that
/// disagrees with the QP's state; out-of-range values (`timeout` > 31, `retry_cnt` /
/// `rnr_retry` > 7, `min_rnr_timer` > 31, `port_num` ≠ 1, `pkey_index` ≠ 0, a PSN or
/// `dest_qp_num` over 24 bits).
pub fn check_modify(
    qp_type: QpType,
    cur: QpState,
    attr: &QpAttr,
    mask: QpAttrMask,
) -> Result<QpState, Error> {
    let new = if mask.contains(A::STATE) {
        attr.qp_state
    } else {
        cur
    };
    let inval = |msg: String| Error::new(ErrorKind::Inval, msg);
    let arrow = format!("modify_qp {}->{}", cur.name(), new.name());
    let Some(row) = TRANSITIONS.iter().find(|t| t.from == cur && t.to == new) else {
        return Err(inval(format!(
            "{arrow}: transition not allowed for {qp_type:?} QPs"
        )));
    };
    let row = row.params(qp_type);
    for (bit, name) in A::NAMES.iter().skip(1) {
        if row.required.contains(*bit) && !mask.contains(*bit) {
            return Err(inval(format!("{arrow}: missing {name}")));
        }
    }
    for (bit, name) in A::NAMES.iter().skip(1) {
        if mask.contains(*bit) && !row.required.contains(*bit) && !row.optional.contains(*bit) {
            return Err(inval(format!("{arrow}: attribute {name} not allowed")));
        }
    }
    if mask.contains(A::CUR_STATE) && attr.cur_qp_state != cur {
        return Err(inval(format!(
            "{arrow}: CUR_STATE {} does not match",
            attr.cur_qp_state.name()
        )));
    }
    let range = |ok: bool, what: &str| {
        if ok {
            Ok(())
        } else {
            Err(inval(format!("{arrow}: {what} out of range")))
        }
    };
    if mask.contains(A::TIMEOUT) {
        range(attr.timeout <= 31, "TIMEOUT")?;
    }
    if mask.contains(A::RETRY_CNT) {
        range(attr.retry_cnt <= 7, "RETRY_CNT")?;
    }
    if mask.contains(A::RNR_RETRY) {
        range(attr.rnr_retry <= 7, "RNR_RETRY")?;
    }
    if mask.contains(A::MIN_RNR_TIMER) {
        range(attr.min_rnr_timer <= 31, "MIN_RNR_TIMER")?;
    }
    if mask.contains(A::PORT) {
        range(attr.port_num == 1, "PORT")?;
    }
    if mask.contains(A::PKEY_INDEX) {
        range(attr.pkey_index == 0, "PKEY_INDEX")?;
    }
    if mask.contains(A::RQ_PSN) {
        range(attr.rq_psn <= Psn::MASK, "RQ_PSN")?;
    }
    if mask.contains(A::SQ_PSN) {
        range(attr.sq_psn <= Psn::MASK, "SQ_PSN")?;
    }
    if mask.contains(A::DEST_QPN) {
        range(attr.dest_qp_num <= 0x00ff_ffff, "DEST_QPN")?;
    }
    Ok(new)
}

#[cfg(test)]
mod tests {
    use super::*;
    use QpType as T;

    fn rc_rtr_mask() -> QpAttrMask {
        A::STATE
            | A::AV
            | A::PATH_MTU
            | A::DEST_QPN
            | A::RQ_PSN
            | A::MAX_DEST_RD_ATOMIC
            | A::MIN_RNR_TIMER
    }

    #[test]
    fn init_to_rtr_names_the_missing_attribute() {
        let attr = QpAttr {
            qp_state: S::Rtr,
            ..QpAttr::default()
        };
        let mask = QpAttrMask(rc_rtr_mask().0 & !A::DEST_QPN.0);
        let e = check_modify(T::Rc, S::Init, &attr, mask).unwrap_err();
        assert_eq!(e.to_string(), "modify_qp INIT->RTR: missing DEST_QPN");
        assert_eq!(e.kind(), ErrorKind::Inval);
        assert_eq!(
            check_modify(T::Rc, S::Init, &attr, rc_rtr_mask()),
            Ok(S::Rtr)
        );
    }

    #[test]
    fn forbidden_attribute_is_named() {
        let attr = QpAttr {
            qp_state: S::Init,
            ..QpAttr::default()
        };
        let mask = A::STATE | A::PKEY_INDEX | A::PORT | A::ACCESS_FLAGS | A::SQ_PSN;
        let e = check_modify(T::Rc, S::Reset, &attr, mask).unwrap_err();
        assert_eq!(
            e.to_string(),
            "modify_qp RESET->INIT: attribute SQ_PSN not allowed"
        );
    }

    #[test]
    fn skipping_a_state_is_refused_and_any_but_reset_to_err_is_allowed() {
        let attr = QpAttr {
            qp_state: S::Rts,
            ..QpAttr::default()
        };
        assert!(check_modify(T::Rc, S::Init, &attr, A::STATE).is_err());
        let err = QpAttr {
            qp_state: S::Err,
            ..QpAttr::default()
        };
        for s in [S::Init, S::Rtr, S::Rts, S::Sqd, S::Sqe, S::Err] {
            assert_eq!(check_modify(T::Rc, s, &err, A::STATE), Ok(S::Err));
        }
        // ib_core lists no RESET -> ERR.
        assert!(check_modify(T::Rc, S::Reset, &err, A::STATE).is_err());
    }
}
