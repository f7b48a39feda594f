//! `modify_qp` in the engine: the attribute mask, the table of allowed state transitions with
//! the attributes each QP type must and may set (also in `spec/qp_states.toml`, compared row
//! by row in `tests/spec_tables_qp.rs`), and [`QpEngine::modify`], which checks a whole call
//! against that table before it changes anything and then commits it. The engine owns its
//! state: nothing outside this module moves a QP to another state except a transport error
//! (which enters ERR) and a test escape compiled only for tests (the `testing` feature:
//! `force_state_unchecked`, for a state no modify and no event reaches, an RC QP in SQE).
//!
//! Errors are [`ModifyError`]s, all `EINVAL` at the verbs boundary, each naming the
//! transition ("modify_qp INIT->RTR: missing DEST_QPN"). Nothing here allocates except
//! `Display`, panics or does I/O.
//!
//! Source: IBTA Vol 1 ch. 10 (QP state transitions); kernel ib_core `qp_state_table` and
//! `ib_modify_qp_is_ok`, which rxe applies before `rxe_qp_chk_attr`.

use super::{AccessFlags, Path, PathMtu, QpAttrs, QpEngine, QpState, QpType};
use crate::wire::Psn;

/// Which fields of [`QpModify`] (and of the verbs `QpAttr`) a `modify_qp` call sets. Bit values
/// are `enum ibv_qp_attr_mask`.
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

/// The engine's part of a `modify_qp` call: the fields of `struct ibv_qp_attr`, with the
/// address vector already resolved by the device into a [`Path`]. Only the fields named in
/// the mask are read.
///
/// Units: PSNs and `dest_qp_num` are raw `u32`s, checked to fit 24 bits; `timeout` is the
/// 5-bit exponent (4.096 µs × 2^timeout), `min_rnr_timer` the 5-bit RNR timer code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpModify {
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
    /// The address vector, resolved: required by [`QpEngine::modify`] when the mask has AV
    /// (not by [`check_modify`], which runs before the device resolves it).
    pub path: Option<Path>,
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

impl Default for QpModify {
    fn default() -> QpModify {
        QpModify {
            qp_state: QpState::Reset,
            cur_qp_state: QpState::Reset,
            path_mtu: PathMtu::Mtu1024,
            qkey: 0,
            rq_psn: 0,
            sq_psn: 0,
            dest_qp_num: 0,
            qp_access_flags: AccessFlags::empty(),
            path: None,
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

impl QpModify {
    /// A move to `qp_state` carrying the values of `attrs` (and `path` as the AV), for
    /// whichever of them the mask names.
    pub fn from_attrs(qp_state: QpState, attrs: &QpAttrs, path: Option<Path>) -> QpModify {
        QpModify {
            qp_state,
            path_mtu: attrs.path_mtu,
            qkey: attrs.qkey,
            rq_psn: attrs.rq_psn.value(),
            sq_psn: attrs.sq_psn.value(),
            dest_qp_num: attrs.dest_qp_num,
            qp_access_flags: attrs.qp_access_flags,
            path,
            max_rd_atomic: attrs.max_rd_atomic,
            max_dest_rd_atomic: attrs.max_dest_rd_atomic,
            min_rnr_timer: attrs.min_rnr_timer,
            timeout: attrs.timeout,
            retry_cnt: attrs.retry_cnt,
            rnr_retry: attrs.rnr_retry,
            ..QpModify::default()
        }
    }
}

/// Why a `modify_qp` call was refused: the transition it asked for and what was wrong. The
/// verbs layer reports every one as `EINVAL` with this `Display` as its message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModifyError {
    /// The QP's state.
    pub from: QpState,
    /// The state asked for (the QP's own when the mask has no STATE).
    pub to: QpState,
    /// What was wrong.
    pub kind: ModifyErrorKind,
}

/// What was wrong with a `modify_qp` call (see [`ModifyError`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModifyErrorKind {
    /// The (from, to) pair is not in [`TRANSITIONS`]: "transition not allowed for Rc QPs".
    Transition(QpType),
    /// A required attribute is missing (the first in bit order, by its `IBV_QP_*` name).
    Missing(&'static str),
    /// An attribute this transition and QP type do not take.
    NotAllowed(&'static str),
    /// CUR_STATE names another state than the QP's.
    CurState(QpState),
    /// A value out of range (named by its mask bit).
    OutOfRange(&'static str),
    /// The mask has AV but no resolved [`Path`] came with it (a caller's mistake).
    NoPath,
}

impl core::fmt::Display for ModifyError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "modify_qp {}->{}: ", self.from.name(), self.to.name())?;
        match self.kind {
            ModifyErrorKind::Transition(t) => write!(f, "transition not allowed for {t:?} QPs"),
            ModifyErrorKind::Missing(name) => write!(f, "missing {name}"),
            ModifyErrorKind::NotAllowed(name) => write!(f, "attribute {name} not allowed"),
            ModifyErrorKind::CurState(s) => write!(f, "CUR_STATE {} does not match", s.name()),
            ModifyErrorKind::OutOfRange(name) => write!(f, "{name} out of range"),
            ModifyErrorKind::NoPath => write!(f, "AV without a resolved path"),
        }
    }
}

impl std::error::Error for ModifyError {}

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
/// Errors (all `EINVAL` at the verbs boundary): a (from, to) pair not in [`TRANSITIONS`]
/// ("transition not allowed"); a required attribute missing (the message names the first one
/// in bit order); an attribute not allowed for the transition and QP type (named);
/// `CUR_STATE` that disagrees with the QP's state; out-of-range values (`timeout` > 31,
/// `retry_cnt` / `rnr_retry` > 7, `min_rnr_timer` > 31, `port_num` ≠ 1, `pkey_index` ≠ 0, a
/// PSN or `dest_qp_num` over 24 bits).
pub fn check_modify(
    qp_type: QpType,
    cur: QpState,
    attr: &QpModify,
    mask: QpAttrMask,
) -> Result<QpState, ModifyError> {
    let new = if mask.contains(A::STATE) {
        attr.qp_state
    } else {
        cur
    };
    let refuse = |kind| ModifyError {
        from: cur,
        to: new,
        kind,
    };
    let Some(row) = TRANSITIONS.iter().find(|t| t.from == cur && t.to == new) else {
        return Err(refuse(ModifyErrorKind::Transition(qp_type)));
    };
    let row = row.params(qp_type);
    for (bit, name) in A::NAMES.iter().skip(1) {
        if row.required.contains(*bit) && !mask.contains(*bit) {
            return Err(refuse(ModifyErrorKind::Missing(name)));
        }
    }
    for (bit, name) in A::NAMES.iter().skip(1) {
        if mask.contains(*bit) && !row.required.contains(*bit) && !row.optional.contains(*bit) {
            return Err(refuse(ModifyErrorKind::NotAllowed(name)));
        }
    }
    if mask.contains(A::CUR_STATE) && attr.cur_qp_state != cur {
        return Err(refuse(ModifyErrorKind::CurState(attr.cur_qp_state)));
    }
    let range = |ok: bool, what: &'static str| {
        if ok {
            Ok(())
        } else {
            Err(refuse(ModifyErrorKind::OutOfRange(what)))
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

/// The attributes the engine keeps (what [`QpEngine::modify`] commits), besides the state.
const KEPT: QpAttrMask = m(&[
    A::ACCESS_FLAGS,
    A::QKEY,
    A::AV,
    A::PATH_MTU,
    A::TIMEOUT,
    A::RETRY_CNT,
    A::RNR_RETRY,
    A::RQ_PSN,
    A::MAX_QP_RD_ATOMIC,
    A::MIN_RNR_TIMER,
    A::SQ_PSN,
    A::MAX_DEST_RD_ATOMIC,
    A::DEST_QPN,
]);

impl QpEngine {
    /// [`check_modify`] for this QP: what [`QpEngine::modify`] would refuse, without
    /// changing anything (the device runs it before it resolves the address vector).
    pub fn check_modify(&self, attr: &QpModify, mask: QpAttrMask) -> Result<QpState, ModifyError> {
        check_modify(self.qp_type, self.state, attr, mask)
    }

    /// `modify_qp`: checks the whole call against the transition table ([`check_modify`]),
    /// then sets the attributes named in `mask` (AV sets the path from `attr.path`) and, when
    /// `mask` has STATE, enters `attr.qp_state` with the side effects of entering it: RESET
    /// clears everything; RTR loads `rq_psn` into the responder; RTS (from RTR) loads `sq_psn`
    /// into the requester and completer; ERR flushes both queues with `IBV_WC_WR_FLUSH_ERR`.
    /// Returns the new state. Nothing changes when it fails.
    ///
    /// Errors: those of [`check_modify`]; [`ModifyErrorKind::NoPath`] when the mask has AV
    /// and `attr.path` is `None`.
    pub fn modify(&mut self, attr: &QpModify, mask: QpAttrMask) -> Result<QpState, ModifyError> {
        let new = self.check_modify(attr, mask)?;
        let path = if mask.contains(A::AV) {
            Some(attr.path.ok_or(ModifyError {
                from: self.state,
                to: new,
                kind: ModifyErrorKind::NoPath,
            })?)
        } else {
            None
        };
        // Everything checked: commit.
        let a = &mut self.attrs;
        if mask.contains(A::PATH_MTU) {
            a.path_mtu = attr.path_mtu;
        }
        if mask.contains(A::DEST_QPN) {
            a.dest_qp_num = attr.dest_qp_num;
        }
        if mask.contains(A::RQ_PSN) {
            a.rq_psn = Psn::new(attr.rq_psn);
        }
        if mask.contains(A::SQ_PSN) {
            a.sq_psn = Psn::new(attr.sq_psn);
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
            self.path = Some(p);
        }
        if mask.contains(A::STATE) {
            self.set_state(new);
        }
        Ok(new)
    }

    /// Brings the QP up to `to` the way ibv_rc_pingpong does, one [`QpEngine::modify`] per
    /// step along RESET→INIT→RTR→RTS, then RTS→SQD or RTS→ERR when `to` is SQD or ERR. Each
    /// step names every attribute its row of the table requires of this QP type and every
    /// optional one the engine keeps, with the values of `attrs` (P_Key index 0, port 1);
    /// `path` is the AV of a connected QP's INIT→RTR step (a datagram QP's path is set at
    /// creation with [`QpEngine::set_path`]).
    ///
    /// Errors: the first refused step's [`ModifyError`] (the steps before it stay done):
    /// the QP is not in RESET, `to` is SQE (which only a send error enters), a value is out of
    /// range, or a connected QP got no `path`.
    pub fn modify_to(
        &mut self,
        to: QpState,
        attrs: &QpAttrs,
        path: Option<Path>,
    ) -> Result<(), ModifyError> {
        let steps: &[QpState] = match to {
            S::Reset => &[],
            S::Init => &[S::Init],
            S::Rtr => &[S::Init, S::Rtr],
            S::Rts => &[S::Init, S::Rtr, S::Rts],
            S::Sqd => &[S::Init, S::Rtr, S::Rts, S::Sqd],
            S::Sqe => &[S::Init, S::Rtr, S::Rts, S::Sqe],
            S::Err => &[S::Init, S::Rtr, S::Rts, S::Err],
        };
        for &step in steps {
            let mask = TRANSITIONS
                .iter()
                .find(|t| t.from == self.state && t.to == step)
                .map_or(A::STATE, |t| {
                    let p = t.params(self.qp_type);
                    A::STATE | p.required | QpAttrMask(p.optional.0 & KEPT.0)
                });
            self.modify(&QpModify::from_attrs(step, attrs, path), mask)?;
        }
        Ok(())
    }

    /// Escape for tests that need a state `modify_qp` cannot reach, such as an RC QP in SQE:
    /// enters `new` with the side effects [`QpEngine::modify`] gives it, without the
    /// transition table. A verbs provider never calls this; it calls [`QpEngine::modify`].
    /// Compiled only for the engine's unit tests and with the `testing` feature, which only
    /// the repository's tests enable (tests/adversarial.rs), and hidden from the docs.
    #[cfg(any(test, feature = "testing"))]
    #[doc(hidden)]
    pub fn force_state_unchecked(&mut self, new: QpState) {
        self.set_state(new);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::net::{IpAddr, Ipv4Addr};

    fn rc_qp() -> QpEngine {
        QpEngine::new(0x11, QpType::Rc, 1, Default::default(), false)
    }

    fn path() -> Path {
        Path {
            local: IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)),
            remote: IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2)),
            src_port: 0xc000,
            ip: Default::default(),
        }
    }

    #[test]
    fn reset_modify_missing_attribute_changes_nothing() {
        let mut e = rc_qp();
        let m = QpModify {
            qp_state: S::Init,
            qp_access_flags: AccessFlags::REMOTE_WRITE,
            ..QpModify::default()
        };
        let err = e.modify(&m, A::STATE | A::ACCESS_FLAGS).unwrap_err();
        assert_eq!(err.to_string(), "modify_qp RESET->INIT: missing PKEY_INDEX");
        assert_eq!((e.state(), e.attrs()), (S::Reset, &QpAttrs::default()));
        let all = A::STATE | A::ACCESS_FLAGS | A::PKEY_INDEX | A::PORT;
        assert_eq!(e.modify(&m, all), Ok(S::Init));
        assert_eq!(e.attrs().qp_access_flags, AccessFlags::REMOTE_WRITE);
    }

    #[test]
    fn init_modify_av_without_path_is_refused_and_changes_nothing() {
        let mut e = rc_qp();
        e.modify_to(S::Init, &QpAttrs::default(), None).unwrap();
        let attrs = QpAttrs {
            dest_qp_num: 0x22,
            ..QpAttrs::default()
        };
        let err = e.modify_to(S::Rtr, &attrs, None).unwrap_err();
        assert_eq!(err.kind, ModifyErrorKind::NoPath);
        assert_eq!(
            (e.state(), e.attrs().dest_qp_num, e.path()),
            (S::Init, 0, None)
        );
        e.modify_to(S::Rtr, &attrs, Some(path())).unwrap();
        assert_eq!((e.state(), e.path()), (S::Rtr, Some(path())));
    }

    #[test]
    fn rts_modify_to_sqe_is_refused_and_forcing_it_is_the_escape() {
        let mut e = rc_qp();
        let err = e
            .modify_to(S::Sqe, &QpAttrs::default(), Some(path()))
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "modify_qp RTS->SQE: transition not allowed for Rc QPs"
        );
        assert_eq!(e.state(), S::Rts);
        e.force_state_unchecked(S::Sqe);
        assert_eq!(e.state(), S::Sqe);
    }
}
