//! The CM's two kinds of error: protocol outcomes that put a REJ (or SIDR_REP status) on the
//! wire, mapped in one place, and API errors returned to the engine's user.

use crate::wire::cm::{RejReason, SidrStatus};

/// Why the engine refuses or abandons a connection. [`CmReject::rej_reason`] is the single
/// place that decides which REJ reason goes on the wire.
///
/// Source: kernel `cm.c` (`cm_req_handler`: no listener; `cm_dup_req_handler`: stale;
/// `cm_rep_handler`: unknown comm ID; `ib_send_cm_rej` from rdma_reject) and IBTA Vol 1
/// ch. 12 (table 108, REJ reasons).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CmReject {
    /// The application called `reject`.
    Consumer,
    /// A REP names a communication ID we do not know.
    InvalidCommId,
    /// Nobody listens on the REQ's service ID.
    NoListener,
    /// The engine holds `max_connections` connections.
    NoResources,
    /// A REQ for a connection in TIMEWAIT, or that reuses an established peer QP.
    StaleConnection,
    /// No response after all retries.
    Timeout,
}

impl CmReject {
    /// The REJ reason code this outcome sends.
    pub const fn rej_reason(self) -> RejReason {
        match self {
            CmReject::Consumer => RejReason::CONSUMER_DEFINED,
            CmReject::InvalidCommId => RejReason::INVALID_COMM_ID,
            CmReject::NoListener => RejReason::INVALID_SERVICE_ID,
            CmReject::NoResources => RejReason::NO_RESOURCES,
            CmReject::StaleConnection => RejReason::STALE_CONN,
            CmReject::Timeout => RejReason::TIMEOUT,
        }
    }

    /// The SIDR_REP status of the same outcome for a SIDR_REQ.
    pub const fn sidr_status(self) -> SidrStatus {
        match self {
            CmReject::NoListener => SidrStatus::UNSUPPORTED,
            CmReject::NoResources => SidrStatus::NO_QP,
            _ => SidrStatus::REJECT,
        }
    }
}

/// What an API call of the engine got wrong. `errno()` gives the value librdmacm returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CmError {
    /// No connection with this ID (ENOENT... librdmacm says EINVAL for a bad id).
    NoSuchId,
    /// The call is not valid in the connection's state (EINVAL).
    InvalidState {
        /// The call.
        op: &'static str,
        /// The state the connection was in.
        state: super::CmState,
    },
    /// Someone already listens on this service ID (EADDRINUSE).
    AddrInUse,
    /// The engine holds `max_connections` connections (ENOMEM).
    NoMem,
    /// Private data longer than the message holds (EINVAL).
    PrivateDataTooLong {
        /// Bytes given.
        given: usize,
        /// Bytes the message holds.
        max: usize,
    },
}

impl CmError {
    /// The errno librdmacm reports for this error.
    pub const fn errno(&self) -> i32 {
        match self {
            CmError::NoSuchId | CmError::InvalidState { .. } => 22, // EINVAL
            CmError::PrivateDataTooLong { .. } => 22,
            CmError::AddrInUse => 98, // EADDRINUSE
            CmError::NoMem => 12,     // ENOMEM
        }
    }
}

impl core::fmt::Display for CmError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            CmError::NoSuchId => write!(f, "no CM connection with this ID"),
            CmError::InvalidState { op, state } => write!(f, "{op}: not valid in state {state:?}"),
            CmError::AddrInUse => write!(f, "listen: service ID already in use"),
            CmError::NoMem => write!(f, "too many CM connections"),
            CmError::PrivateDataTooLong { given, max } => {
                write!(f, "private data of {given} bytes, at most {max} fit")
            }
        }
    }
}

impl std::error::Error for CmError {}

#[cfg(test)]
mod tests {
    use super::*;

    // One row per outcome: the kernel's reason codes (ib_cm.h enum ib_cm_rej_reason).
    #[test]
    fn every_outcome_maps_to_the_kernel_rej_reason() {
        for (o, code) in [
            (CmReject::Consumer, 28),
            (CmReject::InvalidCommId, 6),
            (CmReject::NoListener, 8),
            (CmReject::NoResources, 3),
            (CmReject::StaleConnection, 10),
            (CmReject::Timeout, 4),
        ] {
            assert_eq!(o.rej_reason().0, code, "{o:?}");
        }
        assert_eq!(CmReject::NoListener.sidr_status(), SidrStatus::UNSUPPORTED);
    }
}
