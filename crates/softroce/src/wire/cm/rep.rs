//! REP (the passive side accepts a REQ) and RTU (the active side's "ready to use", closing
//! the three-way handshake): their views and `Repr`s. Layout conventions: see [`super`].
//! Source: IBTA Vol 1 ch. 12, tables 110 and 111; kernel `CM_REP_*`, `CM_RTU_*`.

use super::bits::{CM_MSG_LEN, arr, get_bits, put_bits};
use crate::wire::{be24, be32, be64, put_be24};

cm_view!(
    /// REP: the passive side accepts a REQ.
    ///
    /// Shape: private data at 36..232 (196 bytes). Source: IBTA Vol 1 ch. 12, table 110; `CM_REP_*`.
    Rep, private_data: 36, {
        /// Local communication ID, u32 at 0.
        local_comm_id / set_local_comm_id: u32[0];
        /// Remote communication ID, u32 at 4.
        remote_comm_id / set_remote_comm_id: u32[4];
        /// Local Q_Key, u32 at 8.
        local_qkey / set_local_qkey: u32[8];
        /// Local QPN, 24 bits at 12.
        local_qpn / set_local_qpn: u24[12];
        /// Local EE context number, 24 bits at 16.
        local_eecn / set_local_eecn: u24[16];
        /// Starting PSN, 24 bits at 20.
        starting_psn / set_starting_psn: u24[20];
        /// Responder resources, u8 at 24.
        responder_resources / set_responder_resources: u8[24];
        /// Initiator depth, u8 at 25.
        initiator_depth / set_initiator_depth: u8[25];
        /// Target ACK delay, 5 bits at byte 26 bits 0..5.
        target_ack_delay / set_target_ack_delay: bits[26, 0, 5];
        /// Failover accepted, 2 bits at byte 26 bits 5..7.
        failover_accepted / set_failover_accepted: bits[26, 5, 2];
        /// End-to-end flow control, byte 26 bit 7.
        end_to_end_flow_control / set_end_to_end_flow_control: flag[26, 7];
        /// RNR retry count, 3 bits at byte 27 bits 0..3.
        rnr_retry_count / set_rnr_retry_count: bits[27, 0, 3];
        /// SRQ, byte 27 bit 3.
        srq / set_srq: flag[27, 3];
        /// Local CA GUID, u64 at 28.
        local_ca_guid / set_local_ca_guid: u64[28];
    }
);

cm_view!(
    /// RTU: the active side's "ready to use", closing the three-way handshake.
    ///
    /// Shape: private data at 8..232 (224 bytes). Source: IBTA Vol 1 ch. 12, table 111; `CM_RTU_*`.
    Rtu, private_data: 8, {
        /// Local communication ID, u32 at 0.
        local_comm_id / set_local_comm_id: u32[0];
        /// Remote communication ID, u32 at 4.
        remote_comm_id / set_remote_comm_id: u32[4];
    }
);

/// Owned REP. Field meanings: see [`Rep`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub struct RepRepr {
    pub local_comm_id: u32,
    pub remote_comm_id: u32,
    pub local_qkey: u32,
    pub local_qpn: u32,
    pub local_eecn: u32,
    pub starting_psn: u32,
    pub responder_resources: u8,
    pub initiator_depth: u8,
    pub target_ack_delay: u8,
    pub failover_accepted: u8,
    pub end_to_end_flow_control: bool,
    pub rnr_retry_count: u8,
    pub srq: bool,
    pub local_ca_guid: u64,
    pub private_data: [u8; 196],
}

/// Owned RTU. Field meanings: see [`Rtu`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub struct RtuRepr {
    pub local_comm_id: u32,
    pub remote_comm_id: u32,
    pub private_data: [u8; 224],
}

impl RepRepr {
    /// Parses a checked view; never fails.
    pub fn parse<T: AsRef<[u8]>>(h: &Rep<T>) -> RepRepr {
        RepRepr {
            local_comm_id: h.local_comm_id(),
            remote_comm_id: h.remote_comm_id(),
            local_qkey: h.local_qkey(),
            local_qpn: h.local_qpn(),
            local_eecn: h.local_eecn(),
            starting_psn: h.starting_psn(),
            responder_resources: h.responder_resources(),
            initiator_depth: h.initiator_depth(),
            target_ack_delay: h.target_ack_delay(),
            failover_accepted: h.failover_accepted(),
            end_to_end_flow_control: h.end_to_end_flow_control(),
            rnr_retry_count: h.rnr_retry_count(),
            srq: h.srq(),
            local_ca_guid: h.local_ca_guid(),
            private_data: arr(h.private_data()),
        }
    }
    /// Writes all [`CM_MSG_LEN`] bytes (reserved bits 0).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, h: &mut Rep<T>) {
        h.buffer.as_mut()[..CM_MSG_LEN].fill(0);
        h.set_local_comm_id(self.local_comm_id);
        h.set_remote_comm_id(self.remote_comm_id);
        h.set_local_qkey(self.local_qkey);
        h.set_local_qpn(self.local_qpn);
        h.set_local_eecn(self.local_eecn);
        h.set_starting_psn(self.starting_psn);
        h.set_responder_resources(self.responder_resources);
        h.set_initiator_depth(self.initiator_depth);
        h.set_target_ack_delay(self.target_ack_delay);
        h.set_failover_accepted(self.failover_accepted);
        h.set_end_to_end_flow_control(self.end_to_end_flow_control);
        h.set_rnr_retry_count(self.rnr_retry_count);
        h.set_srq(self.srq);
        h.set_local_ca_guid(self.local_ca_guid);
        h.private_data_mut().copy_from_slice(&self.private_data);
    }
}

impl RtuRepr {
    /// Parses a checked view; never fails.
    pub fn parse<T: AsRef<[u8]>>(h: &Rtu<T>) -> RtuRepr {
        RtuRepr {
            local_comm_id: h.local_comm_id(),
            remote_comm_id: h.remote_comm_id(),
            private_data: arr(h.private_data()),
        }
    }
    /// Writes all [`CM_MSG_LEN`] bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, h: &mut Rtu<T>) {
        h.set_local_comm_id(self.local_comm_id);
        h.set_remote_comm_id(self.remote_comm_id);
        h.private_data_mut().copy_from_slice(&self.private_data);
    }
}
