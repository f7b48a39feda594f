//! The C structs of `<rdma/rdma_cma.h>` (rdma-core 44), and those of `<infiniband/verbs.h>`
//! they use, from the crate both C libraries share (`softroce_cabi::abi`: plain Rust items,
//! so this library carries no second libibverbs). Layouts are checked against the installed headers by
//! tests/layout.rs.

#![allow(non_camel_case_types, missing_docs)]

use core::ffi::{c_int, c_void};

pub use softroce_cabi::abi::*;

/// `struct rdma_event_channel`.
#[repr(C)]
pub struct rdma_event_channel {
    pub fd: c_int,
}

/// `struct rdma_ib_addr`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct rdma_ib_addr {
    pub sgid: ibv_gid,
    pub dgid: ibv_gid,
    pub pkey: u16,
}

/// `struct rdma_addr`: source and destination as `sockaddr_storage`, then the GIDs.
#[repr(C)]
pub struct rdma_addr {
    pub src_storage: libc::sockaddr_storage,
    pub dst_storage: libc::sockaddr_storage,
    pub ibaddr: rdma_ib_addr,
}

/// `struct ibv_sa_path_rec` (`<infiniband/sa.h>`).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_sa_path_rec {
    pub dgid: ibv_gid,
    pub sgid: ibv_gid,
    pub dlid: u16,
    pub slid: u16,
    pub raw_traffic: c_int,
    pub flow_label: u32,
    pub hop_limit: u8,
    pub traffic_class: u8,
    pub reversible: c_int,
    pub numb_path: u8,
    pub pkey: u16,
    pub sl: u8,
    pub mtu_selector: u8,
    pub mtu: u8,
    pub rate_selector: u8,
    pub rate: u8,
    pub packet_life_time_selector: u8,
    pub packet_life_time: u8,
    pub preference: u8,
}

/// `struct rdma_route`.
#[repr(C)]
pub struct rdma_route {
    pub addr: rdma_addr,
    pub path_rec: *mut ibv_sa_path_rec,
    pub num_paths: c_int,
}

/// `struct rdma_cm_id`.
#[repr(C)]
pub struct rdma_cm_id {
    pub verbs: *mut ibv_context,
    pub channel: *mut rdma_event_channel,
    pub context: *mut c_void,
    pub qp: *mut ibv_qp,
    pub route: rdma_route,
    pub ps: c_int,
    pub port_num: u8,
    pub event: *mut rdma_cm_event,
    pub send_cq_channel: *mut ibv_comp_channel,
    pub send_cq: *mut ibv_cq,
    pub recv_cq_channel: *mut ibv_comp_channel,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut ibv_srq,
    pub pd: *mut ibv_pd,
    pub qp_type: c_int,
}

/// `struct rdma_conn_param`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_conn_param {
    pub private_data: *const c_void,
    pub private_data_len: u8,
    pub responder_resources: u8,
    pub initiator_depth: u8,
    pub flow_control: u8,
    pub retry_count: u8,
    pub rnr_retry_count: u8,
    pub srq: u8,
    pub qp_num: u32,
}

/// `struct rdma_ud_param`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_ud_param {
    pub private_data: *const c_void,
    pub private_data_len: u8,
    pub ah_attr: ibv_ah_attr,
    pub qp_num: u32,
    pub qkey: u32,
}

/// The `param` union of `struct rdma_cm_event`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union rdma_cm_event_param {
    pub conn: rdma_conn_param,
    pub ud: rdma_ud_param,
}

/// `struct rdma_cm_event`.
#[repr(C)]
pub struct rdma_cm_event {
    pub id: *mut rdma_cm_id,
    pub listen_id: *mut rdma_cm_id,
    pub event: c_int,
    pub status: c_int,
    pub param: rdma_cm_event_param,
}

/// `enum rdma_cm_event_type`.
pub mod event {
    pub const ADDR_RESOLVED: i32 = 0;
    pub const ADDR_ERROR: i32 = 1;
    pub const ROUTE_RESOLVED: i32 = 2;
    pub const ROUTE_ERROR: i32 = 3;
    pub const CONNECT_REQUEST: i32 = 4;
    pub const CONNECT_RESPONSE: i32 = 5;
    pub const CONNECT_ERROR: i32 = 6;
    pub const UNREACHABLE: i32 = 7;
    pub const REJECTED: i32 = 8;
    pub const ESTABLISHED: i32 = 9;
    pub const DISCONNECTED: i32 = 10;
    pub const DEVICE_REMOVAL: i32 = 11;
    pub const MULTICAST_JOIN: i32 = 12;
    pub const MULTICAST_ERROR: i32 = 13;
    pub const ADDR_CHANGE: i32 = 14;
    pub const TIMEWAIT_EXIT: i32 = 15;
}

/// `enum rdma_port_space`.
pub const RDMA_PS_IPOIB: c_int = 0x0002;
pub const RDMA_PS_TCP: c_int = 0x0106;
pub const RDMA_PS_UDP: c_int = 0x0111;
pub const RDMA_PS_IB: c_int = 0x013f;

/// `struct rdma_addrinfo`.
#[repr(C)]
pub struct rdma_addrinfo {
    pub ai_flags: c_int,
    pub ai_family: c_int,
    pub ai_qp_type: c_int,
    pub ai_port_space: c_int,
    pub ai_src_len: libc::socklen_t,
    pub ai_dst_len: libc::socklen_t,
    pub ai_src_addr: *mut libc::sockaddr,
    pub ai_dst_addr: *mut libc::sockaddr,
    pub ai_src_canonname: *mut core::ffi::c_char,
    pub ai_dst_canonname: *mut core::ffi::c_char,
    pub ai_route_len: usize,
    pub ai_route: *mut c_void,
    pub ai_connect_len: usize,
    pub ai_connect: *mut c_void,
    pub ai_next: *mut rdma_addrinfo,
}

/// `struct rdma_cm_join_mc_attr_ex` (`rdma_join_multicast_ex`).
#[repr(C)]
pub struct rdma_cm_join_mc_attr_ex {
    /// `RDMA_CM_JOIN_MC_ATTR_*` bits saying which fields are valid.
    pub comp_mask: u32,
    /// An `RDMA_MC_JOIN_FLAG_*` value.
    pub join_flags: u32,
    pub addr: *mut libc::sockaddr,
}

/// `enum rdma_cm_join_mc_attr_mask`.
pub const RDMA_CM_JOIN_MC_ATTR_ADDRESS: u32 = 1 << 0;
pub const RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS: u32 = 1 << 1;
pub const RDMA_CM_JOIN_MC_ATTR_RESERVED: u32 = 1 << 2;
/// `enum rdma_cm_mc_join_flags`.
pub const RDMA_MC_JOIN_FLAG_FULLMEMBER: u32 = 0;
pub const RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER: u32 = 1;
pub const RDMA_MC_JOIN_FLAG_RESERVED: u32 = 2;

/// `rdma_addrinfo.ai_flags` bits.
pub const RAI_PASSIVE: c_int = 1;
pub const RAI_NUMERICHOST: c_int = 2;

/// `struct ibv_tm_cap`: tag matching capabilities of an SRQ.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_tm_cap {
    pub max_num_tags: u32,
    pub max_ops: u32,
}

/// `struct ibv_srq_init_attr_ex`: `ibv_srq_init_attr` then the extended fields.
#[repr(C)]
pub struct ibv_srq_init_attr_ex {
    pub srq_context: *mut c_void,
    pub attr: ibv_srq_attr,
    pub comp_mask: u32,
    pub srq_type: c_int,
    pub pd: *mut ibv_pd,
    pub xrcd: *mut c_void,
    pub cq: *mut ibv_cq,
    pub tm_cap: ibv_tm_cap,
}

/// `enum ibv_srq_init_attr_mask` bits.
pub const IBV_SRQ_INIT_ATTR_TYPE: u32 = 1 << 0;
pub const IBV_SRQ_INIT_ATTR_PD: u32 = 1 << 1;
pub const IBV_SRQ_INIT_ATTR_XRCD: u32 = 1 << 2;
pub const IBV_SRQ_INIT_ATTR_CQ: u32 = 1 << 3;
/// `enum ibv_srq_type` values.
pub const IBV_SRQT_BASIC: c_int = 0;
pub const IBV_SRQT_XRC: c_int = 1;

/// `verbs_context.create_srq_ex`.
pub type CreateSrqExFn =
    unsafe extern "C" fn(*mut ibv_context, *mut ibv_srq_init_attr_ex) -> *mut ibv_srq;

/// `struct ibv_xrcd_init_attr`.
#[repr(C)]
pub struct ibv_xrcd_init_attr {
    pub comp_mask: u32,
    pub fd: c_int,
    pub oflags: c_int,
}

/// `enum ibv_xrcd_init_attr_mask` bits.
pub const IBV_XRCD_INIT_ATTR_FD: u32 = 1 << 0;
pub const IBV_XRCD_INIT_ATTR_OFLAGS: u32 = 1 << 1;

/// `verbs_context.open_xrcd` (returns a `struct ibv_xrcd *`, opaque here).
pub type OpenXrcdFn =
    unsafe extern "C" fn(*mut ibv_context, *mut ibv_xrcd_init_attr) -> *mut c_void;
