//! Responder outcomes and the one function that decides what each puts on the wire.
//!
//! Source: the error states of rxe `rxe_resp.c` `rxe_responder` and their IBTA classes
//! (Vol 1 ch. 9, responder error behaviour: class A/B/C/D/E); the table is also kept in
//! `spec/nak_codes.toml`.

use super::WcStatus;
use crate::wire::{AethSyndrome, NakCode};

/// Why the responder did not execute a request packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RespError {
    /// PSN beyond the expected one (class B): NAK PSN sequence error once per gap.
    PsnOutOfSeq,
    /// MIDDLE/LAST with no FIRST before it (class A at rxe).
    MissingOpcodeFirst,
    /// FIRST/ONLY (or another kind) while a message is in progress.
    MissingOpcodeLast,
    /// The QP does not allow this operation (access flags) or it is not implemented.
    UnsupportedOpcode,
    /// Packet or message length not allowed (path MTU, RETH length, receive buffer).
    InvalidLength,
    /// The receive WQE is too short for the SEND (IBV_WC_LOC_LEN_ERR at the responder).
    RecvTooShort,
    /// Misaligned atomic address.
    MisalignedAtomic,
    /// READ/atomic while the responder has no resources (`max_dest_rd_atomic` = 0).
    TooManyRdAtomic,
    /// R_Key, PD, access or range check failed (class C), also for a READ response whose MR
    /// went away after the READ was accepted.
    RkeyViolation,
    /// No receive WQE posted for a SEND or WRITE with immediate.
    Rnr,
    /// The receive WQE's SGEs failed their local checks.
    MalformedWqe,
    /// SEND with Invalidate named an R_Key this QP may not invalidate (unknown, another PD,
    /// a type 1 window, a window bound to another QP, an ordinary MR, an MR with windows):
    /// rxe `RESPST_ERR_INVALIDATE_RKEY`, class J.
    InvalidateRkey,
}

/// What the QP does after a [`RespError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QpAction {
    /// Stay in the current state.
    None,
    /// Move to ERR and flush.
    Error,
}

/// The decision for a [`RespError`]: the AETH syndrome to NAK with, the status for the
/// receive WQE in use (if any), and the QP's fate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Disposition {
    /// NAK to send (at the offending PSN; at the expected PSN for a sequence error).
    pub nak: Option<AethSyndrome>,
    /// Completion status of the receive WQE in use.
    pub wc_status: Option<WcStatus>,
    /// QP action.
    pub qp: QpAction,
}

impl RespError {
    /// The single map from responder outcome to wire and completion behaviour for RC.
    /// `min_rnr_timer` is the QP's RNR timer code, sent in RNR NAKs.
    pub const fn disposition(self, min_rnr_timer: u8) -> Disposition {
        use RespError::*;
        let inv = Some(AethSyndrome::Nak(NakCode::InvalidRequest));
        match self {
            PsnOutOfSeq => Disposition {
                nak: Some(AethSyndrome::Nak(NakCode::PsnSeqErr)),
                wc_status: None,
                qp: QpAction::None,
            },
            Rnr => Disposition {
                nak: Some(AethSyndrome::RnrNak {
                    timer: min_rnr_timer,
                }),
                wc_status: None,
                qp: QpAction::None,
            },
            MissingOpcodeFirst | MissingOpcodeLast | UnsupportedOpcode | InvalidLength
            | MisalignedAtomic | TooManyRdAtomic => Disposition {
                nak: inv,
                wc_status: Some(WcStatus::RemInvReqErr),
                qp: QpAction::Error,
            },
            // rxe completes the receive with IB_WC_REM_INV_REQ_ERR and moves the QP to ERR
            // but leaves the ACK syndrome as it was (a positive ACK if AckReq is set);
            // softroce NAKs the SEND (spec/deviations.toml).
            InvalidateRkey => Disposition {
                nak: inv,
                wc_status: Some(WcStatus::RemInvReqErr),
                qp: QpAction::Error,
            },
            // IBTA ch. 9: a SEND longer than its receive WQE is a length error, NAK
            // Invalid Request and a local length error; rxe 6.1 answers Remote Operational
            // Error instead (spec/deviations.toml, "RC SEND longer than the posted receive
            // buffer").
            RecvTooShort => Disposition {
                nak: inv,
                wc_status: Some(WcStatus::LocLenErr),
                qp: QpAction::Error,
            },
            RkeyViolation => Disposition {
                nak: Some(AethSyndrome::Nak(NakCode::RemoteAccessErr)),
                wc_status: Some(WcStatus::RemAccessErr),
                qp: QpAction::Error,
            },
            MalformedWqe => Disposition {
                nak: Some(AethSyndrome::Nak(NakCode::RemoteOpErr)),
                wc_status: Some(WcStatus::LocQpOpErr),
                qp: QpAction::Error,
            },
        }
    }
}

/// The requester's completion status for a NAK code. Source: rxe `rxe_comp.c`
/// `check_ack` (invalid request → REM_INV_REQ_ERR, remote access → REM_ACCESS_ERR, remote
/// operational and anything else → REM_OP_ERR).
pub const fn nak_wc_status(code: NakCode) -> WcStatus {
    match code {
        NakCode::InvalidRequest => WcStatus::RemInvReqErr,
        NakCode::RemoteAccessErr => WcStatus::RemAccessErr,
        _ => WcStatus::RemOpErr,
    }
}
