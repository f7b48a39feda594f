//! Communication Manager (CM) messages: the 232 bytes that follow the MAD common header in a
//! CM MAD (management class 0x07), and the rdma_cm IP header (`struct cma_hdr`) that rdma_cm
//! puts at the start of the REQ and SIDR_REQ private data.
//!
//! One view and one `Repr` per message: REQ, MRA, REJ, REP, RTU, DREQ, DREP, SIDR_REQ,
//! SIDR_REP. LAP and APR (alternate paths) are kept as [`CmMsgRepr::Other`] with their
//! attribute ID: softroce, like rxe, has no alternate path. [`CmMadRepr`] is a whole MAD:
//! header plus message.
//!
//! Shape: every view covers [`CM_MSG_LEN`] bytes (the MAD after its 24-byte header); offsets
//! below are from the start of the message, bit positions count from the most significant bit
//! of a byte (as IBTA's tables and the kernel's `CM_FIELD_BLOC` do). Fields are big-endian.
//! Reserved bits read as they are and are written as 0; a `Repr` emit writes all 232 bytes.
//! Panics: never after `check_len`. Allocation: none.
//! Source: IBTA Vol 1 ch. 12 (CM message formats: tables 106 "REQ message contents" to 120
//! "SIDR_REP message contents"); kernel `include/rdma/ibta_vol1_c12.h` (offsets) and
//! `drivers/infiniband/core/cma.c` `struct cma_hdr`; Wireshark `packet-infiniband.c`.

use super::mad::{MAD_HDR_LEN, MAD_LEN, MadHdr, MadHdrRepr};
use super::{Error, Result, be16, be24, be32, be64, put_be24};

/// Length of a CM message (a MAD without its common header), in bytes.
pub const CM_MSG_LEN: usize = MAD_LEN - MAD_HDR_LEN;

/// CM attribute IDs (the MAD header's `attr_id`): which message a CM MAD carries.
/// Source: IBTA Vol 1 ch. 12 (CM attributes); kernel `cm.c` `CM_REQ_ATTR_ID` and siblings.
pub mod attr {
    /// ClassPortInfo.
    pub const CLASS_PORT_INFO: u16 = 0x0001;
    /// Connect request.
    pub const REQ: u16 = 0x0010;
    /// Message receipt acknowledgement.
    pub const MRA: u16 = 0x0011;
    /// Reject.
    pub const REJ: u16 = 0x0012;
    /// Reply to a REQ.
    pub const REP: u16 = 0x0013;
    /// Ready to use.
    pub const RTU: u16 = 0x0014;
    /// Disconnect request.
    pub const DREQ: u16 = 0x0015;
    /// Disconnect reply.
    pub const DREP: u16 = 0x0016;
    /// Service ID resolution request (UD).
    pub const SIDR_REQ: u16 = 0x0017;
    /// Service ID resolution reply (UD).
    pub const SIDR_REP: u16 = 0x0018;
    /// Load alternate path.
    pub const LAP: u16 = 0x0019;
    /// Alternate path response.
    pub const APR: u16 = 0x001a;
}

/// Reads `width` bits of `b` starting `msb_offset` bits below its most significant bit.
#[inline]
const fn get_bits(b: u8, msb_offset: u32, width: u32) -> u8 {
    (b >> (8 - msb_offset - width)) & (((1u16 << width) - 1) as u8)
}

/// Writes the low `width` bits of `v` into `b` at `msb_offset`, keeping the other bits.
#[inline]
fn put_bits(b: &mut u8, msb_offset: u32, width: u32, v: u8) {
    let shift = 8 - msb_offset - width;
    let mask = ((((1u16 << width) - 1) as u8) as u16) << shift;
    *b = (*b & !(mask as u8)) | (((u16::from(v) << shift) & mask) as u8);
}

/// Declares a CM message view over [`CM_MSG_LEN`] bytes: a getter and a setter per field, and
/// the private data from `$pd` to the end. Field kinds: `u8[o]`, `bits[o, msb_offset, width]`
/// (an `u8`), `flag[o, msb_offset]` (a `bool`), `u16[o]`, `u20[o]` (the top 20 bits of the
/// 32 at `o`), `u24[o]` (the 24 bits at `o..o+3`), `u32[o]`, `u64[o]`, `gid[o]` (16 bytes).
macro_rules! cm_view {
    (
        $(#[$m:meta])* $name:ident, private_data: $pd:expr,
        { $( $(#[$fm:meta])* $get:ident / $set:ident : $kind:ident [ $($pos:expr),+ ] ; )* }
    ) => {
        header_view!($(#[$m])* $name, CM_MSG_LEN);

        impl<T: AsRef<[u8]>> $name<T> {
            /// Offset of the private data in the message, in bytes.
            pub const PRIVATE_DATA_OFFSET: usize = $pd;
            /// Length of the private data, in bytes.
            pub const PRIVATE_DATA_LEN: usize = CM_MSG_LEN - $pd;
            $(
                $(#[$fm])*
                pub fn $get(&self) -> cm_view!(@ty $kind) {
                    cm_view!(@get $kind, self.buffer.as_ref(), $($pos),+)
                }
            )*
            /// The private data: from its offset to the end of the message.
            pub fn private_data(&self) -> &[u8] {
                &self.buffer.as_ref()[$pd..CM_MSG_LEN]
            }
        }

        impl<T: AsRef<[u8]> + AsMut<[u8]>> $name<T> {
            $(
                #[doc = concat!("Sets the field `", stringify!($get), "` returns.")]
                pub fn $set(&mut self, v: cm_view!(@ty $kind)) {
                    cm_view!(@set $kind, self.buffer.as_mut(), v, $($pos),+)
                }
            )*
            /// The private data, writable.
            pub fn private_data_mut(&mut self) -> &mut [u8] {
                &mut self.buffer.as_mut()[$pd..CM_MSG_LEN]
            }
        }
    };
    (@ty u8) => { u8 };
    (@ty bits) => { u8 };
    (@ty flag) => { bool };
    (@ty u16) => { u16 };
    (@ty u20) => { u32 };
    (@ty u24) => { u32 };
    (@ty u32) => { u32 };
    (@ty u64) => { u64 };
    (@ty gid) => { [u8; 16] };
    (@get u8, $b:expr, $o:expr) => { $b[$o] };
    (@get bits, $b:expr, $o:expr, $s:expr, $w:expr) => { get_bits($b[$o], $s, $w) };
    (@get flag, $b:expr, $o:expr, $s:expr) => { get_bits($b[$o], $s, 1) != 0 };
    (@get u16, $b:expr, $o:expr) => { be16(&$b[$o..$o + 2]) };
    (@get u20, $b:expr, $o:expr) => { be32(&$b[$o..$o + 4]) >> 12 };
    (@get u24, $b:expr, $o:expr) => { be24(&$b[$o..$o + 3]) };
    (@get u32, $b:expr, $o:expr) => { be32(&$b[$o..$o + 4]) };
    (@get u64, $b:expr, $o:expr) => { be64(&$b[$o..$o + 8]) };
    (@get gid, $b:expr, $o:expr) => {{
        let mut g = [0u8; 16];
        g.copy_from_slice(&$b[$o..$o + 16]);
        g
    }};
    (@set u8, $b:expr, $v:expr, $o:expr) => { $b[$o] = $v };
    (@set bits, $b:expr, $v:expr, $o:expr, $s:expr, $w:expr) => { put_bits(&mut $b[$o], $s, $w, $v) };
    (@set flag, $b:expr, $v:expr, $o:expr, $s:expr) => { put_bits(&mut $b[$o], $s, 1, u8::from($v)) };
    (@set u16, $b:expr, $v:expr, $o:expr) => { $b[$o..$o + 2].copy_from_slice(&$v.to_be_bytes()) };
    (@set u20, $b:expr, $v:expr, $o:expr) => {{
        let low = $b[$o + 2] & 0x0f;
        put_be24(&mut $b[$o..$o + 3], ($v & 0x000f_ffff) << 4);
        $b[$o + 2] |= low;
    }};
    (@set u24, $b:expr, $v:expr, $o:expr) => { put_be24(&mut $b[$o..$o + 3], $v) };
    (@set u32, $b:expr, $v:expr, $o:expr) => { $b[$o..$o + 4].copy_from_slice(&$v.to_be_bytes()) };
    (@set u64, $b:expr, $v:expr, $o:expr) => { $b[$o..$o + 8].copy_from_slice(&$v.to_be_bytes()) };
    (@set gid, $b:expr, $v:expr, $o:expr) => { $b[$o..$o + 16].copy_from_slice(&$v) };
}

cm_view!(
    /// REQ: the active side asks to connect a QP to a service.
    ///
    /// Shape: see the getters (offset, bits); private data at 140..232 (92 bytes).
    /// Source: IBTA Vol 1 ch. 12, table 106 (REQ message contents); kernel `CM_REQ_*`.
    Req, private_data: 140, {
        /// Local communication ID (the sender's), u32 at 0.
        local_comm_id / set_local_comm_id: u32[0];
        /// Service ID, u64 at 8.
        service_id / set_service_id: u64[8];
        /// Local CA GUID, u64 at 16.
        local_ca_guid / set_local_ca_guid: u64[16];
        /// Local Q_Key (RD only), u32 at 28.
        local_qkey / set_local_qkey: u32[28];
        /// Local QPN, 24 bits at 32.
        local_qpn / set_local_qpn: u24[32];
        /// Responder resources (incoming RDMA READs/atomics the sender accepts), u8 at 35.
        responder_resources / set_responder_resources: u8[35];
        /// Local EECN (RD only), 24 bits at 36.
        local_eecn / set_local_eecn: u24[36];
        /// Initiator depth (RDMA READs/atomics the sender issues), u8 at 39.
        initiator_depth / set_initiator_depth: u8[39];
        /// Remote EECN (RD only), 24 bits at 40.
        remote_eecn / set_remote_eecn: u24[40];
        /// Remote CM response timeout, 4.096 µs × 2^n, 5 bits at byte 43 bits 0..5.
        remote_cm_response_timeout / set_remote_cm_response_timeout: bits[43, 0, 5];
        /// Transport service type (0 RC, 1 UC, 2 RD), 2 bits at byte 43 bits 5..7.
        transport_service_type / set_transport_service_type: bits[43, 5, 2];
        /// End-to-end flow control, byte 43 bit 7.
        end_to_end_flow_control / set_end_to_end_flow_control: flag[43, 7];
        /// Starting PSN (the sender's send PSN), 24 bits at 44.
        starting_psn / set_starting_psn: u24[44];
        /// Local CM response timeout, 5 bits at byte 47 bits 0..5.
        local_cm_response_timeout / set_local_cm_response_timeout: bits[47, 0, 5];
        /// Retry count (transport), 3 bits at byte 47 bits 5..8.
        retry_count / set_retry_count: bits[47, 5, 3];
        /// Partition key, u16 at 48.
        pkey / set_pkey: u16[48];
        /// Path packet payload MTU (IB enum: 1 = 256 … 5 = 4096), 4 bits at byte 50 bits 0..4.
        path_mtu / set_path_mtu: bits[50, 0, 4];
        /// RDC exists, byte 50 bit 4.
        rdc_exists / set_rdc_exists: flag[50, 4];
        /// RNR retry count, 3 bits at byte 50 bits 5..8.
        rnr_retry_count / set_rnr_retry_count: bits[50, 5, 3];
        /// Max CM retries, 4 bits at byte 51 bits 0..4.
        max_cm_retries / set_max_cm_retries: bits[51, 0, 4];
        /// SRQ, byte 51 bit 4.
        srq / set_srq: flag[51, 4];
        /// Extended transport type, 3 bits at byte 51 bits 5..8.
        extended_transport_type / set_extended_transport_type: bits[51, 5, 3];
        /// Primary local port LID, u16 at 52.
        primary_local_lid / set_primary_local_lid: u16[52];
        /// Primary remote port LID, u16 at 54.
        primary_remote_lid / set_primary_remote_lid: u16[54];
        /// Primary local port GID, 16 bytes at 56.
        primary_local_gid / set_primary_local_gid: gid[56];
        /// Primary remote port GID, 16 bytes at 72.
        primary_remote_gid / set_primary_remote_gid: gid[72];
        /// Primary flow label, 20 bits at 88.
        primary_flow_label / set_primary_flow_label: u20[88];
        /// Primary packet rate, 6 bits at byte 91 bits 2..8.
        primary_packet_rate / set_primary_packet_rate: bits[91, 2, 6];
        /// Primary traffic class, u8 at 92.
        primary_traffic_class / set_primary_traffic_class: u8[92];
        /// Primary hop limit, u8 at 93.
        primary_hop_limit / set_primary_hop_limit: u8[93];
        /// Primary SL, 4 bits at byte 94 bits 0..4.
        primary_sl / set_primary_sl: bits[94, 0, 4];
        /// Primary subnet local, byte 94 bit 4.
        primary_subnet_local / set_primary_subnet_local: flag[94, 4];
        /// Primary local ACK timeout, 5 bits at byte 95 bits 0..5.
        primary_local_ack_timeout / set_primary_local_ack_timeout: bits[95, 0, 5];
        /// Alternate local port LID, u16 at 96.
        alternate_local_lid / set_alternate_local_lid: u16[96];
        /// Alternate remote port LID, u16 at 98.
        alternate_remote_lid / set_alternate_remote_lid: u16[98];
        /// Alternate local port GID, 16 bytes at 100.
        alternate_local_gid / set_alternate_local_gid: gid[100];
        /// Alternate remote port GID, 16 bytes at 116.
        alternate_remote_gid / set_alternate_remote_gid: gid[116];
        /// Alternate flow label, 20 bits at 132.
        alternate_flow_label / set_alternate_flow_label: u20[132];
        /// Alternate packet rate, 6 bits at byte 135 bits 2..8.
        alternate_packet_rate / set_alternate_packet_rate: bits[135, 2, 6];
        /// Alternate traffic class, u8 at 136.
        alternate_traffic_class / set_alternate_traffic_class: u8[136];
        /// Alternate hop limit, u8 at 137.
        alternate_hop_limit / set_alternate_hop_limit: u8[137];
        /// Alternate SL, 4 bits at byte 138 bits 0..4.
        alternate_sl / set_alternate_sl: bits[138, 0, 4];
        /// Alternate subnet local, byte 138 bit 4.
        alternate_subnet_local / set_alternate_subnet_local: flag[138, 4];
        /// Alternate local ACK timeout, 5 bits at byte 139 bits 0..5.
        alternate_local_ack_timeout / set_alternate_local_ack_timeout: bits[139, 0, 5];
        /// SAP supported, byte 139 bit 5.
        sap_supported / set_sap_supported: flag[139, 5];
    }
);

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

cm_view!(
    /// DREQ: either side asks to disconnect.
    ///
    /// Shape: private data at 12..232 (220 bytes). Source: IBTA Vol 1 ch. 12, table 112; `CM_DREQ_*`.
    Dreq, private_data: 12, {
        /// Local communication ID, u32 at 0.
        local_comm_id / set_local_comm_id: u32[0];
        /// Remote communication ID, u32 at 4.
        remote_comm_id / set_remote_comm_id: u32[4];
        /// Remote QPN/EECN, 24 bits at 8.
        remote_qpn_eecn / set_remote_qpn_eecn: u24[8];
    }
);

cm_view!(
    /// DREP: the answer to a DREQ.
    ///
    /// Shape: private data at 8..232 (224 bytes). Source: IBTA Vol 1 ch. 12, table 113; `CM_DREP_*`.
    Drep, private_data: 8, {
        /// Local communication ID, u32 at 0.
        local_comm_id / set_local_comm_id: u32[0];
        /// Remote communication ID, u32 at 4.
        remote_comm_id / set_remote_comm_id: u32[4];
    }
);

cm_view!(
    /// SIDR_REQ: resolve a service ID to a UD QPN and Q_Key.
    ///
    /// Shape: private data at 16..232 (216 bytes). Source: IBTA Vol 1 ch. 12, table 119;
    /// `CM_SIDR_REQ_*`.
    SidrReq, private_data: 16, {
        /// Request ID, u32 at 0.
        request_id / set_request_id: u32[0];
        /// Partition key, u16 at 4.
        pkey / set_pkey: u16[4];
        /// Service ID, u64 at 8.
        service_id / set_service_id: u64[8];
    }
);

cm_view!(
    /// SIDR_REP: the answer to a SIDR_REQ.
    ///
    /// Shape: additional information at 24..96 (72 bytes), private data at 96..232 (136
    /// bytes). Source: IBTA Vol 1 ch. 12, table 120; `CM_SIDR_REP_*`.
    SidrRep, private_data: 96, {
        /// Request ID, u32 at 0.
        request_id / set_request_id: u32[0];
        /// Status (0 valid; see [`SidrStatus`]), u8 at 4.
        status / set_status: u8[4];
        /// Additional information length, u8 at 5.
        additional_info_length / set_additional_info_length: u8[5];
        /// QPN, 24 bits at 8.
        qpn / set_qpn: u24[8];
        /// Service ID, u64 at 12.
        service_id / set_service_id: u64[12];
        /// Q_Key, u32 at 20.
        qkey / set_qkey: u32[20];
    }
);

impl<T: AsRef<[u8]>> SidrRep<T> {
    /// Additional information, 72 bytes at 24.
    pub fn additional_info(&self) -> &[u8] {
        &self.buffer.as_ref()[24..96]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> SidrRep<T> {
    /// The additional information, writable.
    pub fn additional_info_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[24..96]
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

/// SIDR_REP status values (open). Source: IBTA Vol 1 ch. 12 (SIDR_REP status, with table 120); kernel `ib_cm.h`
/// `enum ib_cm_sidr_status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SidrStatus(pub u8);

impl SidrStatus {
    /// The QPN and Q_Key are valid.
    pub const SUCCESS: SidrStatus = SidrStatus(0);
    /// Service ID not supported (nobody listens).
    pub const UNSUPPORTED: SidrStatus = SidrStatus(1);
    /// Rejected by the service provider.
    pub const REJECT: SidrStatus = SidrStatus(2);
    /// No QP available.
    pub const NO_QP: SidrStatus = SidrStatus(3);
    /// Redirected.
    pub const REDIRECT: SidrStatus = SidrStatus(4);
    /// Class version not supported.
    pub const UNSUPPORTED_VERSION: SidrStatus = SidrStatus(5);
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

/// One path of a REQ (primary or alternate). Source: IBTA Vol 1 ch. 12, table 106.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct CmPathRepr {
    /// Local port LID (0xffff on RoCE).
    pub local_lid: u16,
    /// Remote port LID (0xffff on RoCE).
    pub remote_lid: u16,
    /// Local port GID (on RoCE: the IP address, IPv4 mapped).
    pub local_gid: [u8; 16],
    /// Remote port GID.
    pub remote_gid: [u8; 16],
    /// Flow label (20 bits).
    pub flow_label: u32,
    /// Packet rate (6 bits, IB rate enum).
    pub packet_rate: u8,
    /// Traffic class.
    pub traffic_class: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Service level (4 bits).
    pub sl: u8,
    /// Subnet local.
    pub subnet_local: bool,
    /// Local ACK timeout, 4.096 µs × 2^n (5 bits).
    pub local_ack_timeout: u8,
}

/// Owned REQ. Field meanings: see [`Req`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub struct ReqRepr {
    pub local_comm_id: u32,
    pub service_id: u64,
    pub local_ca_guid: u64,
    pub local_qkey: u32,
    pub local_qpn: u32,
    pub responder_resources: u8,
    pub local_eecn: u32,
    pub initiator_depth: u8,
    pub remote_eecn: u32,
    pub remote_cm_response_timeout: u8,
    pub transport_service_type: u8,
    pub end_to_end_flow_control: bool,
    pub starting_psn: u32,
    pub local_cm_response_timeout: u8,
    pub retry_count: u8,
    pub pkey: u16,
    pub path_mtu: u8,
    pub rdc_exists: bool,
    pub rnr_retry_count: u8,
    pub max_cm_retries: u8,
    pub srq: bool,
    pub extended_transport_type: u8,
    pub primary_path: CmPathRepr,
    pub alternate_path: CmPathRepr,
    pub sap_supported: bool,
    pub private_data: [u8; 92],
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

/// Owned DREQ. Field meanings: see [`Dreq`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub struct DreqRepr {
    pub local_comm_id: u32,
    pub remote_comm_id: u32,
    pub remote_qpn_eecn: u32,
    pub private_data: [u8; 220],
}

/// Owned DREP. Field meanings: see [`Drep`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub struct DrepRepr {
    pub local_comm_id: u32,
    pub remote_comm_id: u32,
    pub private_data: [u8; 224],
}

/// Owned SIDR_REQ. Field meanings: see [`SidrReq`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub struct SidrReqRepr {
    pub request_id: u32,
    pub pkey: u16,
    pub service_id: u64,
    pub private_data: [u8; 216],
}

/// Owned SIDR_REP. Field meanings: see [`SidrRep`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub struct SidrRepRepr {
    pub request_id: u32,
    pub status: SidrStatus,
    pub additional_info_length: u8,
    pub qpn: u32,
    pub service_id: u64,
    pub qkey: u32,
    pub additional_info: [u8; 72],
    pub private_data: [u8; 136],
}

/// Copies `src` into a fixed array (the caller passes exactly N bytes from a checked view).
fn arr<const N: usize>(src: &[u8]) -> [u8; N] {
    let mut a = [0u8; N];
    let n = src.len().min(N);
    a[..n].copy_from_slice(&src[..n]);
    a
}

/// Reads one path of a REQ view by its getter prefix.
macro_rules! path_parse {
    ($h:expr, primary) => {
        CmPathRepr {
            local_lid: $h.primary_local_lid(),
            remote_lid: $h.primary_remote_lid(),
            local_gid: $h.primary_local_gid(),
            remote_gid: $h.primary_remote_gid(),
            flow_label: $h.primary_flow_label(),
            packet_rate: $h.primary_packet_rate(),
            traffic_class: $h.primary_traffic_class(),
            hop_limit: $h.primary_hop_limit(),
            sl: $h.primary_sl(),
            subnet_local: $h.primary_subnet_local(),
            local_ack_timeout: $h.primary_local_ack_timeout(),
        }
    };
    ($h:expr, alternate) => {
        CmPathRepr {
            local_lid: $h.alternate_local_lid(),
            remote_lid: $h.alternate_remote_lid(),
            local_gid: $h.alternate_local_gid(),
            remote_gid: $h.alternate_remote_gid(),
            flow_label: $h.alternate_flow_label(),
            packet_rate: $h.alternate_packet_rate(),
            traffic_class: $h.alternate_traffic_class(),
            hop_limit: $h.alternate_hop_limit(),
            sl: $h.alternate_sl(),
            subnet_local: $h.alternate_subnet_local(),
            local_ack_timeout: $h.alternate_local_ack_timeout(),
        }
    };
}

impl ReqRepr {
    /// Parses a checked view; never fails.
    pub fn parse<T: AsRef<[u8]>>(h: &Req<T>) -> ReqRepr {
        ReqRepr {
            local_comm_id: h.local_comm_id(),
            service_id: h.service_id(),
            local_ca_guid: h.local_ca_guid(),
            local_qkey: h.local_qkey(),
            local_qpn: h.local_qpn(),
            responder_resources: h.responder_resources(),
            local_eecn: h.local_eecn(),
            initiator_depth: h.initiator_depth(),
            remote_eecn: h.remote_eecn(),
            remote_cm_response_timeout: h.remote_cm_response_timeout(),
            transport_service_type: h.transport_service_type(),
            end_to_end_flow_control: h.end_to_end_flow_control(),
            starting_psn: h.starting_psn(),
            local_cm_response_timeout: h.local_cm_response_timeout(),
            retry_count: h.retry_count(),
            pkey: h.pkey(),
            path_mtu: h.path_mtu(),
            rdc_exists: h.rdc_exists(),
            rnr_retry_count: h.rnr_retry_count(),
            max_cm_retries: h.max_cm_retries(),
            srq: h.srq(),
            extended_transport_type: h.extended_transport_type(),
            primary_path: path_parse!(h, primary),
            alternate_path: path_parse!(h, alternate),
            sap_supported: h.sap_supported(),
            private_data: arr(h.private_data()),
        }
    }

    /// Writes all [`CM_MSG_LEN`] bytes (reserved bits 0).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, h: &mut Req<T>) {
        h.buffer.as_mut()[..CM_MSG_LEN].fill(0);
        h.set_local_comm_id(self.local_comm_id);
        h.set_service_id(self.service_id);
        h.set_local_ca_guid(self.local_ca_guid);
        h.set_local_qkey(self.local_qkey);
        h.set_local_qpn(self.local_qpn);
        h.set_responder_resources(self.responder_resources);
        h.set_local_eecn(self.local_eecn);
        h.set_initiator_depth(self.initiator_depth);
        h.set_remote_eecn(self.remote_eecn);
        h.set_remote_cm_response_timeout(self.remote_cm_response_timeout);
        h.set_transport_service_type(self.transport_service_type);
        h.set_end_to_end_flow_control(self.end_to_end_flow_control);
        h.set_starting_psn(self.starting_psn);
        h.set_local_cm_response_timeout(self.local_cm_response_timeout);
        h.set_retry_count(self.retry_count);
        h.set_pkey(self.pkey);
        h.set_path_mtu(self.path_mtu);
        h.set_rdc_exists(self.rdc_exists);
        h.set_rnr_retry_count(self.rnr_retry_count);
        h.set_max_cm_retries(self.max_cm_retries);
        h.set_srq(self.srq);
        h.set_extended_transport_type(self.extended_transport_type);
        let (p, a) = (&self.primary_path, &self.alternate_path);
        h.set_primary_local_lid(p.local_lid);
        h.set_primary_remote_lid(p.remote_lid);
        h.set_primary_local_gid(p.local_gid);
        h.set_primary_remote_gid(p.remote_gid);
        h.set_primary_flow_label(p.flow_label);
        h.set_primary_packet_rate(p.packet_rate);
        h.set_primary_traffic_class(p.traffic_class);
        h.set_primary_hop_limit(p.hop_limit);
        h.set_primary_sl(p.sl);
        h.set_primary_subnet_local(p.subnet_local);
        h.set_primary_local_ack_timeout(p.local_ack_timeout);
        h.set_alternate_local_lid(a.local_lid);
        h.set_alternate_remote_lid(a.remote_lid);
        h.set_alternate_local_gid(a.local_gid);
        h.set_alternate_remote_gid(a.remote_gid);
        h.set_alternate_flow_label(a.flow_label);
        h.set_alternate_packet_rate(a.packet_rate);
        h.set_alternate_traffic_class(a.traffic_class);
        h.set_alternate_hop_limit(a.hop_limit);
        h.set_alternate_sl(a.sl);
        h.set_alternate_subnet_local(a.subnet_local);
        h.set_alternate_local_ack_timeout(a.local_ack_timeout);
        h.set_sap_supported(self.sap_supported);
        h.private_data_mut().copy_from_slice(&self.private_data);
    }
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

impl DreqRepr {
    /// Parses a checked view; never fails.
    pub fn parse<T: AsRef<[u8]>>(h: &Dreq<T>) -> DreqRepr {
        DreqRepr {
            local_comm_id: h.local_comm_id(),
            remote_comm_id: h.remote_comm_id(),
            remote_qpn_eecn: h.remote_qpn_eecn(),
            private_data: arr(h.private_data()),
        }
    }
    /// Writes all [`CM_MSG_LEN`] bytes (reserved bits 0).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, h: &mut Dreq<T>) {
        h.buffer.as_mut()[..CM_MSG_LEN].fill(0);
        h.set_local_comm_id(self.local_comm_id);
        h.set_remote_comm_id(self.remote_comm_id);
        h.set_remote_qpn_eecn(self.remote_qpn_eecn);
        h.private_data_mut().copy_from_slice(&self.private_data);
    }
}

impl DrepRepr {
    /// Parses a checked view; never fails.
    pub fn parse<T: AsRef<[u8]>>(h: &Drep<T>) -> DrepRepr {
        DrepRepr {
            local_comm_id: h.local_comm_id(),
            remote_comm_id: h.remote_comm_id(),
            private_data: arr(h.private_data()),
        }
    }
    /// Writes all [`CM_MSG_LEN`] bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, h: &mut Drep<T>) {
        h.set_local_comm_id(self.local_comm_id);
        h.set_remote_comm_id(self.remote_comm_id);
        h.private_data_mut().copy_from_slice(&self.private_data);
    }
}

impl SidrReqRepr {
    /// Parses a checked view; never fails.
    pub fn parse<T: AsRef<[u8]>>(h: &SidrReq<T>) -> SidrReqRepr {
        SidrReqRepr {
            request_id: h.request_id(),
            pkey: h.pkey(),
            service_id: h.service_id(),
            private_data: arr(h.private_data()),
        }
    }
    /// Writes all [`CM_MSG_LEN`] bytes (reserved bits 0).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, h: &mut SidrReq<T>) {
        h.buffer.as_mut()[..CM_MSG_LEN].fill(0);
        h.set_request_id(self.request_id);
        h.set_pkey(self.pkey);
        h.set_service_id(self.service_id);
        h.private_data_mut().copy_from_slice(&self.private_data);
    }
}

impl SidrRepRepr {
    /// Parses a checked view; never fails.
    pub fn parse<T: AsRef<[u8]>>(h: &SidrRep<T>) -> SidrRepRepr {
        SidrRepRepr {
            request_id: h.request_id(),
            status: SidrStatus(h.status()),
            additional_info_length: h.additional_info_length(),
            qpn: h.qpn(),
            service_id: h.service_id(),
            qkey: h.qkey(),
            additional_info: arr(h.additional_info()),
            private_data: arr(h.private_data()),
        }
    }
    /// Writes all [`CM_MSG_LEN`] bytes (reserved bits 0).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, h: &mut SidrRep<T>) {
        h.buffer.as_mut()[..CM_MSG_LEN].fill(0);
        h.set_request_id(self.request_id);
        h.set_status(self.status.0);
        h.set_additional_info_length(self.additional_info_length);
        h.set_qpn(self.qpn);
        h.set_service_id(self.service_id);
        h.set_qkey(self.qkey);
        h.additional_info_mut()
            .copy_from_slice(&self.additional_info);
        h.private_data_mut().copy_from_slice(&self.private_data);
    }
}

/// One CM message, by attribute ID. `Other` keeps an attribute softroce does not parse (LAP,
/// APR, ClassPortInfo, unknown) with its 232 bytes, so that it re-emits unchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub enum CmMsgRepr {
    Req(ReqRepr),
    Mra(MraRepr),
    Rej(RejRepr),
    Rep(RepRepr),
    Rtu(RtuRepr),
    Dreq(DreqRepr),
    Drep(DrepRepr),
    SidrReq(SidrReqRepr),
    SidrRep(SidrRepRepr),
    /// An attribute not parsed here: its ID and its bytes.
    Other(u16, [u8; CM_MSG_LEN]),
}

impl CmMsgRepr {
    /// Parses the 232 message bytes of a MAD whose attribute ID is `attr_id`.
    /// Errors: [`Error::Truncated`] if fewer than [`CM_MSG_LEN`] bytes.
    pub fn parse(attr_id: u16, msg: &[u8]) -> Result<CmMsgRepr> {
        Ok(match attr_id {
            attr::REQ => CmMsgRepr::Req(ReqRepr::parse(&Req::new_checked(msg)?)),
            attr::MRA => CmMsgRepr::Mra(MraRepr::parse(&Mra::new_checked(msg)?)),
            attr::REJ => CmMsgRepr::Rej(RejRepr::parse(&Rej::new_checked(msg)?)),
            attr::REP => CmMsgRepr::Rep(RepRepr::parse(&Rep::new_checked(msg)?)),
            attr::RTU => CmMsgRepr::Rtu(RtuRepr::parse(&Rtu::new_checked(msg)?)),
            attr::DREQ => CmMsgRepr::Dreq(DreqRepr::parse(&Dreq::new_checked(msg)?)),
            attr::DREP => CmMsgRepr::Drep(DrepRepr::parse(&Drep::new_checked(msg)?)),
            attr::SIDR_REQ => CmMsgRepr::SidrReq(SidrReqRepr::parse(&SidrReq::new_checked(msg)?)),
            attr::SIDR_REP => CmMsgRepr::SidrRep(SidrRepRepr::parse(&SidrRep::new_checked(msg)?)),
            other => {
                if msg.len() < CM_MSG_LEN {
                    return Err(Error::Truncated);
                }
                CmMsgRepr::Other(other, arr(msg))
            }
        })
    }

    /// The attribute ID of this message.
    pub fn attr_id(&self) -> u16 {
        match self {
            CmMsgRepr::Req(_) => attr::REQ,
            CmMsgRepr::Mra(_) => attr::MRA,
            CmMsgRepr::Rej(_) => attr::REJ,
            CmMsgRepr::Rep(_) => attr::REP,
            CmMsgRepr::Rtu(_) => attr::RTU,
            CmMsgRepr::Dreq(_) => attr::DREQ,
            CmMsgRepr::Drep(_) => attr::DREP,
            CmMsgRepr::SidrReq(_) => attr::SIDR_REQ,
            CmMsgRepr::SidrRep(_) => attr::SIDR_REP,
            CmMsgRepr::Other(id, _) => *id,
        }
    }

    /// Writes the message into the first [`CM_MSG_LEN`] bytes of `msg`.
    /// Panics: if `msg` is shorter than [`CM_MSG_LEN`] (our own buffer).
    pub fn emit(&self, msg: &mut [u8]) {
        let msg = &mut msg[..CM_MSG_LEN];
        match self {
            CmMsgRepr::Req(r) => r.emit(&mut Req::new_unchecked(msg)),
            CmMsgRepr::Mra(r) => r.emit(&mut Mra::new_unchecked(msg)),
            CmMsgRepr::Rej(r) => r.emit(&mut Rej::new_unchecked(msg)),
            CmMsgRepr::Rep(r) => r.emit(&mut Rep::new_unchecked(msg)),
            CmMsgRepr::Rtu(r) => r.emit(&mut Rtu::new_unchecked(msg)),
            CmMsgRepr::Dreq(r) => r.emit(&mut Dreq::new_unchecked(msg)),
            CmMsgRepr::Drep(r) => r.emit(&mut Drep::new_unchecked(msg)),
            CmMsgRepr::SidrReq(r) => r.emit(&mut SidrReq::new_unchecked(msg)),
            CmMsgRepr::SidrRep(r) => r.emit(&mut SidrRep::new_unchecked(msg)),
            CmMsgRepr::Other(_, b) => msg.copy_from_slice(b),
        }
    }
}

/// A whole CM MAD: common header and message. The header's `attr_id` selects the message; on
/// emit it is taken from the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CmMadRepr {
    /// The MAD common header.
    pub hdr: MadHdrRepr,
    /// The message.
    pub msg: CmMsgRepr,
}

impl CmMadRepr {
    /// Parses a MAD of at least [`MAD_LEN`] bytes (more are ignored: a receive buffer may be
    /// larger). The management class is not checked here (the MAD agent demultiplexes by it).
    /// Errors: [`Error::Truncated`] if shorter than [`MAD_LEN`].
    pub fn parse(mad: &[u8]) -> Result<CmMadRepr> {
        if mad.len() < MAD_LEN {
            return Err(Error::Truncated);
        }
        let hdr = MadHdrRepr::parse(&MadHdr::new_checked(mad)?);
        let msg = CmMsgRepr::parse(hdr.attr_id, &mad[MAD_HDR_LEN..MAD_LEN])?;
        Ok(CmMadRepr { hdr, msg })
    }

    /// [`MAD_LEN`].
    pub const fn buffer_len(&self) -> usize {
        MAD_LEN
    }

    /// Writes the 256-byte MAD. Panics: if `mad` is shorter than [`MAD_LEN`] (our buffer).
    pub fn emit(&self, mad: &mut [u8]) {
        let mut hdr = self.hdr;
        hdr.attr_id = self.msg.attr_id();
        hdr.emit(&mut MadHdr::new_unchecked(&mut mad[..MAD_HDR_LEN]));
        self.msg.emit(&mut mad[MAD_HDR_LEN..MAD_LEN]);
    }

    /// The MAD as a fresh 256-byte array.
    pub fn to_bytes(&self) -> [u8; MAD_LEN] {
        let mut b = [0u8; MAD_LEN];
        self.emit(&mut b);
        b
    }
}

/// rdma_cm port spaces: the high 16 of the low 32 bits of an rdma_cm service ID.
/// Source: kernel `include/rdma/rdma_cm.h` `enum rdma_ucm_port_space`, `cma.c`
/// `cma_get_service_id` (service ID = `RDMA_IB_IP_PS_*` | port).
pub mod port_space {
    /// IPoIB.
    pub const IPOIB: u16 = 0x0002;
    /// Connected, reliable (RC): rping, ucmatose, ib_send_bw -R.
    pub const TCP: u16 = 0x0106;
    /// Unreliable datagrams (UD, via SIDR): udaddy.
    pub const UDP: u16 = 0x0111;
    /// Native IB.
    pub const IB: u16 = 0x013f;
}

/// The rdma_cm service ID of `port` in `port_space`: `0x0000_0000_PPPP_pppp` with `PPPP` the
/// port space and `pppp` the port. Source: `cma.c` `cma_get_service_id`.
pub const fn rdma_cm_service_id(port_space: u16, port: u16) -> u64 {
    ((port_space as u64) << 16) | port as u64
}

/// The (port space, port) of an rdma_cm service ID, or `None` if the ID is not one (bits above
/// the low 32 set).
pub const fn rdma_cm_port(service_id: u64) -> Option<(u16, u16)> {
    if service_id >> 32 != 0 {
        return None;
    }
    Some(((service_id >> 16) as u16, service_id as u16))
}

header_view!(
    /// The rdma_cm IP header at the start of REQ and SIDR_REQ private data.
    ///
    /// Shape: 36 bytes: `cma_version` u8 at 0 (0x00), `ip_version` in the top 4 bits of byte 1
    /// (4 or 6), `port` u16 at 2..4 (the active side's port), `src_addr` at 4..20 and
    /// `dst_addr` at 20..36, each 16 bytes: an IPv6 address, or for IPv4 12 zero bytes and the
    /// address. Source: kernel `drivers/infiniband/core/cma.c` `struct cma_hdr`,
    /// `union cma_ip_addr`, `cma_format_hdr`.
    CmaHdr,
    36
);

impl<T: AsRef<[u8]>> CmaHdr<T> {
    /// CMA version (0).
    pub fn cma_version(&self) -> u8 {
        self.buffer.as_ref()[0]
    }
    /// IP version (4 or 6) from the top nibble of byte 1.
    pub fn ip_version(&self) -> u8 {
        self.buffer.as_ref()[1] >> 4
    }
    /// The active side's port.
    pub fn port(&self) -> u16 {
        be16(&self.buffer.as_ref()[2..4])
    }
    /// The source (active side) address field.
    pub fn src_addr(&self) -> [u8; 16] {
        arr(&self.buffer.as_ref()[4..20])
    }
    /// The destination (passive side) address field.
    pub fn dst_addr(&self) -> [u8; 16] {
        arr(&self.buffer.as_ref()[20..36])
    }
}

/// Owned rdma_cm IP header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CmaHdrRepr {
    /// CMA version (0).
    pub cma_version: u8,
    /// IP version, 4 or 6 (other values are kept).
    pub ip_version: u8,
    /// The active side's port.
    pub port: u16,
    /// Source address field, raw.
    pub src_addr: [u8; 16],
    /// Destination address field, raw.
    pub dst_addr: [u8; 16],
}

fn ip_of(version: u8, a: &[u8; 16]) -> Option<core::net::IpAddr> {
    match version {
        4 => Some(core::net::IpAddr::V4(core::net::Ipv4Addr::new(
            a[12], a[13], a[14], a[15],
        ))),
        6 => Some(core::net::IpAddr::V6(core::net::Ipv6Addr::from(*a))),
        _ => None,
    }
}

fn addr_of(ip: core::net::IpAddr) -> [u8; 16] {
    match ip {
        core::net::IpAddr::V4(v4) => {
            let mut a = [0u8; 16];
            a[12..].copy_from_slice(&v4.octets());
            a
        }
        core::net::IpAddr::V6(v6) => v6.octets(),
    }
}

impl CmaHdrRepr {
    /// The header rdma_cm's active side sends: version 0, the address family of `src`.
    /// `src` and `dst` must be of one family.
    pub fn new(src: core::net::IpAddr, src_port: u16, dst: core::net::IpAddr) -> CmaHdrRepr {
        CmaHdrRepr {
            cma_version: 0,
            ip_version: if src.is_ipv4() { 4 } else { 6 },
            port: src_port,
            src_addr: addr_of(src),
            dst_addr: addr_of(dst),
        }
    }
    /// Parses a checked view; never fails.
    pub fn parse<T: AsRef<[u8]>>(h: &CmaHdr<T>) -> CmaHdrRepr {
        CmaHdrRepr {
            cma_version: h.cma_version(),
            ip_version: h.ip_version(),
            port: h.port(),
            src_addr: h.src_addr(),
            dst_addr: h.dst_addr(),
        }
    }
    /// 36.
    pub const fn buffer_len(&self) -> usize {
        36
    }
    /// Writes the 36 bytes (the low nibble of byte 1 is 0). Panics: if `buf` is shorter.
    pub fn emit(&self, buf: &mut [u8]) {
        buf[0] = self.cma_version;
        buf[1] = self.ip_version << 4;
        buf[2..4].copy_from_slice(&self.port.to_be_bytes());
        buf[4..20].copy_from_slice(&self.src_addr);
        buf[20..36].copy_from_slice(&self.dst_addr);
    }
    /// The source address, if `ip_version` is 4 or 6.
    pub fn src_ip(&self) -> Option<core::net::IpAddr> {
        ip_of(self.ip_version, &self.src_addr)
    }
    /// The destination address, if `ip_version` is 4 or 6.
    pub fn dst_ip(&self) -> Option<core::net::IpAddr> {
        ip_of(self.ip_version, &self.dst_addr)
    }
}

/// The GID of an IP address on RoCE: IPv4 mapped into IPv6 (`::ffff:a.b.c.d`), IPv6 as is.
/// Source: IBTA Annex A17 (RoCEv2 GIDs); the REQ GIDs of tests/captures/30-rping.pcap.
pub fn gid_of_ip(ip: core::net::IpAddr) -> [u8; 16] {
    match ip {
        core::net::IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        core::net::IpAddr::V6(v6) => v6.octets(),
    }
}

/// The IP address of a RoCE GID (IPv4-mapped GIDs give IPv4).
pub fn ip_of_gid(gid: [u8; 16]) -> core::net::IpAddr {
    let v6 = core::net::Ipv6Addr::from(gid);
    match v6.to_ipv4_mapped() {
        Some(v4) => core::net::IpAddr::V4(v4),
        None => core::net::IpAddr::V6(v6),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bits_read_and_write_from_the_most_significant_bit() {
        // REQ byte 43 of 30-rping: 0xa0 = remote CM response timeout 0x14, type 0, e2e 0.
        assert_eq!(get_bits(0xa0, 0, 5), 0x14);
        assert_eq!(get_bits(0xa7, 5, 3), 7);
        let mut b = 0xffu8;
        put_bits(&mut b, 5, 2, 0);
        assert_eq!(b, 0xf9);
        put_bits(&mut b, 0, 5, 0x1f_u8 + 0x20); // bits above the width are ignored
        assert_eq!(b, 0xf9);
    }

    #[test]
    fn flow_label_keeps_the_packet_rate_bits() {
        let mut buf = [0u8; CM_MSG_LEN];
        let mut r = Req::new_unchecked(&mut buf[..]);
        r.set_primary_packet_rate(0x3f);
        r.set_primary_flow_label(0xf_ffff);
        assert_eq!(
            (r.primary_flow_label(), r.primary_packet_rate()),
            (0xf_ffff, 0x3f)
        );
        r.set_primary_flow_label(0);
        assert_eq!(&buf[88..92], &[0, 0, 0x00, 0x3f]);
    }

    #[test]
    fn every_view_is_truncated_below_232_bytes() {
        let buf = [0u8; CM_MSG_LEN];
        for n in 0..CM_MSG_LEN {
            let b = &buf[..n];
            assert_eq!(Req::new_checked(b).err(), Some(Error::Truncated));
            assert_eq!(Mra::new_checked(b).err(), Some(Error::Truncated));
            assert_eq!(Rej::new_checked(b).err(), Some(Error::Truncated));
            assert_eq!(Rep::new_checked(b).err(), Some(Error::Truncated));
            assert_eq!(Rtu::new_checked(b).err(), Some(Error::Truncated));
            assert_eq!(Dreq::new_checked(b).err(), Some(Error::Truncated));
            assert_eq!(Drep::new_checked(b).err(), Some(Error::Truncated));
            assert_eq!(SidrReq::new_checked(b).err(), Some(Error::Truncated));
            assert_eq!(SidrRep::new_checked(b).err(), Some(Error::Truncated));
            assert!(CmMsgRepr::parse(0x0019, b).is_err());
        }
        assert!(CmaHdr::new_checked(&buf[..35]).is_err());
    }

    #[test]
    fn private_data_lengths_follow_the_kernel_layout() {
        assert_eq!(Req::<&[u8]>::PRIVATE_DATA_LEN, 92);
        assert_eq!(Mra::<&[u8]>::PRIVATE_DATA_LEN, 222);
        assert_eq!(Rej::<&[u8]>::PRIVATE_DATA_LEN, 148);
        assert_eq!(Rep::<&[u8]>::PRIVATE_DATA_LEN, 196);
        assert_eq!(Rtu::<&[u8]>::PRIVATE_DATA_LEN, 224);
        assert_eq!(Dreq::<&[u8]>::PRIVATE_DATA_LEN, 220);
        assert_eq!(Drep::<&[u8]>::PRIVATE_DATA_LEN, 224);
        assert_eq!(SidrReq::<&[u8]>::PRIVATE_DATA_LEN, 216);
        assert_eq!(SidrRep::<&[u8]>::PRIVATE_DATA_LEN, 136);
    }

    #[test]
    fn rdma_cm_service_ids_and_gids() {
        assert_eq!(rdma_cm_service_id(port_space::TCP, 7174), 0x0106_1c06);
        assert_eq!(rdma_cm_port(0x0106_1c06), Some((port_space::TCP, 7174)));
        assert_eq!(rdma_cm_port(1 << 40), None);
        let ip = core::net::IpAddr::V4(core::net::Ipv4Addr::new(10, 77, 0, 2));
        assert_eq!(ip_of_gid(gid_of_ip(ip)), ip);
    }
}
