//! Why the CM engine dropped a MAD, and the engine's counters. No MAD is dropped without a
//! count.

/// Why a received MAD was not acted on.
///
/// Source: the silent discards of kernel `drivers/infiniband/core/cm.c` (`cm_recv_handler`,
/// the `*_handler` functions and their `cm_dup_*` helpers), and of `mad.c` for the header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CmDropReason {
    /// Fewer than 256 bytes.
    Truncated,
    /// Base version is not 1.
    BadBaseVersion,
    /// Management class is not the CM's (the MAD agent counts these).
    NotCmClass,
    /// Class version is not 2.
    BadClassVersion,
    /// Method is not Send.
    BadMethod,
    /// An attribute the engine does not implement (LAP, APR, ClassPortInfo, unknown).
    UnsupportedAttribute,
    /// The remote communication ID names no connection of this engine (a late or stale
    /// message; REP and DREQ are answered instead, with REJ and DREP).
    UnknownCommId,
    /// The message names a connection but comes from another peer or carries another
    /// remote communication ID.
    WrongPeer,
    /// The message is not valid in the connection's state (e.g. an RTU before the REP was
    /// sent, a REJ after ESTABLISHED).
    WrongState,
    /// A duplicate REQ with nothing to resend.
    DuplicateReq,
    /// A duplicate REP that arrived while the user has not yet acted on the first.
    DuplicateRep,
    /// A duplicate RTU.
    DuplicateRtu,
    /// A duplicate DREQ while the user has not yet answered the first.
    DuplicateDreq,
    /// A duplicate SIDR_REQ.
    DuplicateSidrReq,
    /// A DREP, REJ or MRA that answers nothing outstanding.
    UnexpectedResponse,
    /// A new REQ or SIDR_REQ while the engine holds `max_connections` connections.
    TooManyConnections,
    /// A new REQ or SIDR_REQ while its listener holds as many unanswered requests as its
    /// backlog (kernel `ucma_event_handler`; the REQ gets no REJ, the SIDR_REQ a SIDR_REP
    /// reject).
    BacklogFull,
    /// A second MRA for the same message: it does not stretch the wait again (kernel
    /// `cm_mra_handler` counts it as a duplicate in MRA_REQ_RCVD / MRA_REP_RCVD).
    DuplicateMra,
}

impl CmDropReason {
    /// Every reason, for reports.
    pub const ALL: [CmDropReason; 18] = [
        CmDropReason::Truncated,
        CmDropReason::BadBaseVersion,
        CmDropReason::NotCmClass,
        CmDropReason::BadClassVersion,
        CmDropReason::BadMethod,
        CmDropReason::UnsupportedAttribute,
        CmDropReason::UnknownCommId,
        CmDropReason::WrongPeer,
        CmDropReason::WrongState,
        CmDropReason::DuplicateReq,
        CmDropReason::DuplicateRep,
        CmDropReason::DuplicateRtu,
        CmDropReason::DuplicateDreq,
        CmDropReason::DuplicateSidrReq,
        CmDropReason::UnexpectedResponse,
        CmDropReason::TooManyConnections,
        CmDropReason::BacklogFull,
        CmDropReason::DuplicateMra,
    ];
}

/// Counters of one CM engine: plain numbers tests assert on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CmCounters {
    /// MADs handed to `handle_mad`.
    pub mads_received: u64,
    /// MADs handed out by `poll_mad`, retransmissions included.
    pub mads_sent: u64,
    /// Retransmissions after a response timeout.
    pub retransmits: u64,
    /// Messages resent because a duplicate asked for them (REP, RTU, MRA, DREP).
    pub resends: u64,
    /// REJs sent, for any reason.
    pub rejects_sent: u64,
    /// Connects ended because the network said their peer has no CM
    /// ([`CmEngine::handle_unreachable`](super::CmEngine::handle_unreachable)).
    pub unreachable: u64,
    /// Drops, indexed like [`CmDropReason::ALL`].
    drops: [u64; CmDropReason::ALL.len()],
}

impl CmCounters {
    /// MADs dropped for `reason`.
    pub fn drops(&self, reason: CmDropReason) -> u64 {
        self.drops[reason as usize]
    }
    /// MADs dropped for any reason.
    pub fn total_drops(&self) -> u64 {
        self.drops.iter().sum()
    }
    pub(crate) fn drop(&mut self, reason: CmDropReason) {
        self.drops[reason as usize] += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_lists_every_reason_at_its_index() {
        for (i, r) in CmDropReason::ALL.iter().enumerate() {
            assert_eq!(*r as usize, i);
        }
    }
}
