//! REQ, the connect request: its view and its `Repr`, with the paths it carries
//! ([`CmPathRepr`]). Layout conventions: see the [`super`] module.
//! Source: IBTA Vol 1 ch. 12, table 106 (REQ message contents); kernel `CM_REQ_*`.

use super::bits::{CM_MSG_LEN, arr, get_bits, put_bits};
use crate::wire::{be16, be24, be32, be64, put_be24};

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
