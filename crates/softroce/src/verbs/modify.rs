//! `modify_qp` at the verbs boundary: the attribute struct (`struct ibv_qp_attr`, with its
//! address vector) and [`check_modify`], which reports the engine's table check
//! ([`crate::transport::check_modify`]) as `EINVAL`. The mask and the transition table live in
//! the engine (`transport/modify.rs`, also in `spec/qp_states.toml`, compared row by row in
//! `tests/spec_tables_qp.rs`) and are re-exported here.
//!
//! Source: IBTA Vol 1 ch. 10 (QP state transitions); kernel ib_core `qp_state_table` and
//! `ib_modify_qp_is_ok`, which rxe applies before `rxe_qp_chk_attr`.

use super::{Error, ErrorKind, Gid};
use crate::transport::{AccessFlags, IpFields, ModifyError, PathMtu, QpModify, QpState, QpType};
pub use crate::transport::{Params, QpAttrMask, TRANSITIONS, Transition};

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
    /// Destination LID, service level, source path bits and static rate: InfiniBand fields a
    /// RoCE port does not route by; kept as given, for `ibv_query_qp`.
    pub dlid: u16,
    /// Service level (kept, not used on RoCE).
    pub sl: u8,
    /// Source path bits (kept, not used on RoCE).
    pub src_path_bits: u8,
    /// Static rate (kept, not used: softroce does not pace).
    pub static_rate: u8,
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
            dlid: 0,
            sl: 0,
            src_path_bits: 0,
            static_rate: 0,
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
    /// `enum ibv_mig_state` as given (kept for `ibv_query_qp`; softroce has no
    /// alternate path to migrate to).
    pub path_mig_state: u32,
    /// Whether the SQD-drained async event is asked for (kept for `ibv_query_qp`).
    pub en_sqd_async_notify: u8,
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
            path_mig_state: 0,
            en_sqd_async_notify: 0,
        }
    }
}

/// The attributes of a QP as `ibv_query_qp` reports them: each field as the last successful
/// `modify_qp` that named it in its mask set it, `mask` the union of those masks (the
/// fields never set are at [`QpAttr::default`]), and `qp_state` / `cur_qp_state` the
/// QP's state now. Source: rxe `rxe_qp_to_attr` (what rxe reports back is what was set).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpQuery {
    /// The attributes.
    pub attr: QpAttr,
    /// Which attributes have been set (never STATE or CUR_STATE).
    pub mask: QpAttrMask,
}

impl QpQuery {
    /// A new QP's: nothing set, in RESET.
    pub(super) fn new() -> QpQuery {
        QpQuery {
            attr: QpAttr::default(),
            mask: QpAttrMask::default(),
        }
    }

    /// Keeps the fields `mask` names from `from`, after a successful `modify_qp`.
    pub(super) fn keep(&mut self, from: &QpAttr, mask: QpAttrMask) {
        use QpAttrMask as A;
        let (to, kept) = (&mut self.attr, &mut self.mask);
        macro_rules! keep {
            ($($bit:ident: $f:ident),+ $(,)?) => {
                $(if mask.contains(A::$bit) {
                    to.$f = from.$f;
                    *kept = *kept | A::$bit;
                })+
            };
        }
        keep!(
            EN_SQD_ASYNC_NOTIFY: en_sqd_async_notify,
            ACCESS_FLAGS: qp_access_flags,
            PKEY_INDEX: pkey_index,
            PORT: port_num,
            QKEY: qkey,
            AV: ah_attr,
            PATH_MTU: path_mtu,
            TIMEOUT: timeout,
            RETRY_CNT: retry_cnt,
            RNR_RETRY: rnr_retry,
            RQ_PSN: rq_psn,
            MAX_QP_RD_ATOMIC: max_rd_atomic,
            MIN_RNR_TIMER: min_rnr_timer,
            SQ_PSN: sq_psn,
            MAX_DEST_RD_ATOMIC: max_dest_rd_atomic,
            PATH_MIG_STATE: path_mig_state,
            DEST_QPN: dest_qp_num,
        );
    }
}

impl QpAttr {
    /// The engine's part of this call: every field but the address vector, which the device
    /// resolves into a [`crate::transport::Path`] itself.
    pub fn to_modify(&self) -> QpModify {
        QpModify {
            qp_state: self.qp_state,
            cur_qp_state: self.cur_qp_state,
            path_mtu: self.path_mtu,
            qkey: self.qkey,
            rq_psn: self.rq_psn,
            sq_psn: self.sq_psn,
            dest_qp_num: self.dest_qp_num,
            qp_access_flags: self.qp_access_flags,
            path: None,
            pkey_index: self.pkey_index,
            max_rd_atomic: self.max_rd_atomic,
            max_dest_rd_atomic: self.max_dest_rd_atomic,
            min_rnr_timer: self.min_rnr_timer,
            port_num: self.port_num,
            timeout: self.timeout,
            retry_cnt: self.retry_cnt,
            rnr_retry: self.rnr_retry,
        }
    }
}

impl From<ModifyError> for Error {
    /// Every refused `modify_qp` is `EINVAL`, its message naming the transition.
    fn from(e: ModifyError) -> Error {
        Error::new(ErrorKind::Inval, e.to_string())
    }
}

/// Checks a `modify_qp` call against the table before anything changes (rxe
/// `rxe_qp_chk_attr` after `ib_modify_qp_is_ok`). Returns the target state. The check is the
/// engine's ([`crate::transport::check_modify`], which [`crate::transport::QpEngine::modify`]
/// runs again before it commits); the address vector is the device's to check.
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
    Ok(crate::transport::check_modify(
        qp_type,
        cur,
        &attr.to_modify(),
        mask,
    )?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use QpAttrMask as A;
    use QpState as S;
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

    // What ibv_query_qp reports is what each successful modify_qp named in its mask.
    #[test]
    fn query_keeps_only_the_fields_a_mask_names() {
        let mut q = QpQuery::new();
        let init = QpAttr {
            qp_state: S::Init,
            qkey: 0x1111,
            pkey_index: 0,
            port_num: 1,
            qp_access_flags: AccessFlags::REMOTE_WRITE,
            path_mig_state: 2,
            ..QpAttr::default()
        };
        q.keep(&init, A::STATE | A::PKEY_INDEX | A::PORT | A::ACCESS_FLAGS);
        assert_eq!(q.attr.qp_access_flags, AccessFlags::REMOTE_WRITE);
        assert_eq!(q.attr.qkey, 0, "QKEY was not in the mask");
        assert_eq!(
            q.attr.path_mig_state, 0,
            "PATH_MIG_STATE was not in the mask"
        );
        assert_eq!(q.attr.qp_state, S::Reset, "the state is the QP's, not kept");
        let rtr = QpAttr {
            dest_qp_num: 0x22,
            ah_attr: AhAttr {
                dlid: 7,
                sl: 3,
                ..AhAttr::roce_v2(Gid([9; 16]))
            },
            ..QpAttr::default()
        };
        q.keep(&rtr, A::STATE | A::AV | A::DEST_QPN);
        assert_eq!(q.attr.dest_qp_num, 0x22);
        assert_eq!((q.attr.ah_attr.dlid, q.attr.ah_attr.sl), (7, 3));
        assert_eq!(
            q.attr.qp_access_flags,
            AccessFlags::REMOTE_WRITE,
            "kept from before"
        );
        assert_eq!(
            q.mask,
            A::PKEY_INDEX | A::PORT | A::ACCESS_FLAGS | A::AV | A::DEST_QPN
        );
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
