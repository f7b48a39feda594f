//! REJ (a REQ or REP refused, with a [`RejReason`]) and MRA ("message received, answer
//! later"), with the [`msg_ref`] values both use to name the message they answer: views and
//! `Repr`s. Layout conventions: see [`super`].
//! Source: IBTA Vol 1 ch. 12, tables 107 and 108; kernel `CM_MRA_*`, `CM_REJ_*`.

use super::bits::{CM_MSG_LEN, arr, get_bits, put_bits};
use crate::wire::{be16, be32};

cm_view!(
    /// MRA: "message received, answer later": stretches the sender's response timer.
    ///
    /// Shape: private data at 10..232 (222 bytes). Source: IBTA Vol 1 ch. 12, table 107; `CM_MRA_*`.
    Mra, private_data: 10, {
        /// Local communication ID, u32 at 0.
        local_comm_id / set_local_comm_id: u32[0];
        /// Remote communication ID, u32 at 4.
        remote_comm_id / set_remote_comm_id: u32[4];
        /// Which message is acknowledged (0 REQ, 1 REP, 2 LAP), 2 bits at byte 8 bits 0..2.
        message_mraed / set_message_mraed: bits[8, 0, 2];
        /// Service timeout, 4.096 µs × 2^n, 5 bits at byte 9 bits 0..5.
        service_timeout / set_service_timeout: bits[9, 0, 5];
    }
);

cm_view!(
    /// REJ: a REQ or REP is refused, with a reason.
    ///
    /// Shape: ARI at 12..84 (72 bytes), private data at 84..232 (148 bytes).
    /// Source: IBTA Vol 1 ch. 12, table 108; `CM_REJ_*`.
    Rej, private_data: 84, {
        /// Local communication ID, u32 at 0 (0 when rejecting a REQ with no state).
        local_comm_id / set_local_comm_id: u32[0];
        /// Remote communication ID, u32 at 4.
        remote_comm_id / set_remote_comm_id: u32[4];
        /// Which message is rejected (0 REQ, 1 REP, 2 other), 2 bits at byte 8 bits 0..2.
        message_rejected / set_message_rejected: bits[8, 0, 2];
        /// Length of the ARI in bytes, 7 bits at byte 9 bits 0..7.
        rejected_info_length / set_rejected_info_length: bits[9, 0, 7];
        /// Reason, u16 at 10 (see [`RejReason`]).
        reason / set_reason: u16[10];
    }
);

impl<T: AsRef<[u8]>> Rej<T> {
    /// Additional rejection information, 72 bytes at 12.
    pub fn ari(&self) -> &[u8] {
        &self.buffer.as_ref()[12..84]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Rej<T> {
    /// The ARI, writable.
    pub fn ari_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[12..84]
    }
}

/// REJ reason codes (open: unknown values are kept).
/// Source: IBTA Vol 1 ch. 12 (REJ reasons, with table 108); kernel `include/rdma/ib_cm.h`
/// `enum ib_cm_rej_reason`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RejReason(pub u16);

impl RejReason {
    /// No QP available.
    pub const NO_QP: RejReason = RejReason(1);
    /// No EEC available.
    pub const NO_EEC: RejReason = RejReason(2);
    /// No resources available.
    pub const NO_RESOURCES: RejReason = RejReason(3);
    /// Timeout: the sender gave up waiting for a response.
    pub const TIMEOUT: RejReason = RejReason(4);
    /// Unsupported request.
    pub const UNSUPPORTED: RejReason = RejReason(5);
    /// Invalid communication ID.
    pub const INVALID_COMM_ID: RejReason = RejReason(6);
    /// Invalid communication instance.
    pub const INVALID_COMM_INSTANCE: RejReason = RejReason(7);
    /// Invalid service ID: nobody listens on it.
    pub const INVALID_SERVICE_ID: RejReason = RejReason(8);
    /// Invalid transport service type.
    pub const INVALID_TRANSPORT_TYPE: RejReason = RejReason(9);
    /// Stale connection.
    pub const STALE_CONN: RejReason = RejReason(10);
    /// RDC does not exist.
    pub const RDC_NOT_EXIST: RejReason = RejReason(11);
    /// Primary remote port GID rejected.
    pub const INVALID_GID: RejReason = RejReason(12);
    /// Invalid path MTU.
    pub const INVALID_MTU: RejReason = RejReason(26);
    /// Insufficient responder resources.
    pub const INSUFFICIENT_RESP_RESOURCES: RejReason = RejReason(27);
    /// Consumer reject (the application said no; rdma_reject).
    pub const CONSUMER_DEFINED: RejReason = RejReason(28);
    /// Invalid RNR retry count.
    pub const INVALID_RNR_RETRY: RejReason = RejReason(29);
    /// Duplicate local communication ID.
    pub const DUPLICATE_LOCAL_COMM_ID: RejReason = RejReason(30);
    /// Unsupported class version.
    pub const INVALID_CLASS_VERSION: RejReason = RejReason(31);
}

/// Which message an MRA or REJ refers to (`message_mraed`, `message_rejected`).
pub mod msg_ref {
    /// The REQ.
    pub const REQ: u8 = 0;
    /// The REP.
    pub const REP: u8 = 1;
    /// Another message (REJ) or the LAP (MRA).
    pub const OTHER: u8 = 2;
}

/// Owned MRA. Field meanings: see [`Mra`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub struct MraRepr {
    pub local_comm_id: u32,
    pub remote_comm_id: u32,
    pub message_mraed: u8,
    pub service_timeout: u8,
    pub private_data: [u8; 222],
}

/// Owned REJ. Field meanings: see [`Rej`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub struct RejRepr {
    pub local_comm_id: u32,
    pub remote_comm_id: u32,
    pub message_rejected: u8,
    pub rejected_info_length: u8,
    pub reason: RejReason,
    pub ari: [u8; 72],
    pub private_data: [u8; 148],
}

impl MraRepr {
    /// Parses a checked view; never fails.
    pub fn parse<T: AsRef<[u8]>>(h: &Mra<T>) -> MraRepr {
        MraRepr {
            local_comm_id: h.local_comm_id(),
            remote_comm_id: h.remote_comm_id(),
            message_mraed: h.message_mraed(),
            service_timeout: h.service_timeout(),
            private_data: arr(h.private_data()),
        }
    }
    /// Writes all [`CM_MSG_LEN`] bytes (reserved bits 0).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, h: &mut Mra<T>) {
        h.buffer.as_mut()[..CM_MSG_LEN].fill(0);
        h.set_local_comm_id(self.local_comm_id);
        h.set_remote_comm_id(self.remote_comm_id);
        h.set_message_mraed(self.message_mraed);
        h.set_service_timeout(self.service_timeout);
        h.private_data_mut().copy_from_slice(&self.private_data);
    }
}

impl RejRepr {
    /// Parses a checked view; never fails.
    pub fn parse<T: AsRef<[u8]>>(h: &Rej<T>) -> RejRepr {
        RejRepr {
            local_comm_id: h.local_comm_id(),
            remote_comm_id: h.remote_comm_id(),
            message_rejected: h.message_rejected(),
            rejected_info_length: h.rejected_info_length(),
            reason: RejReason(h.reason()),
            ari: arr(h.ari()),
            private_data: arr(h.private_data()),
        }
    }
    /// Writes all [`CM_MSG_LEN`] bytes (reserved bits 0).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, h: &mut Rej<T>) {
        h.buffer.as_mut()[..CM_MSG_LEN].fill(0);
        h.set_local_comm_id(self.local_comm_id);
        h.set_remote_comm_id(self.remote_comm_id);
        h.set_message_rejected(self.message_rejected);
        h.set_rejected_info_length(self.rejected_info_length);
        h.set_reason(self.reason.0);
        h.ari_mut().copy_from_slice(&self.ari);
        h.private_data_mut().copy_from_slice(&self.private_data);
    }
}
