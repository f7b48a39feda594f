//! `#[repr(C)]` mirrors of the structs of `<infiniband/verbs.h>` (rdma-core 44) that this
//! library hands out or reads. Field names are verbs.h's; unions keep only the members
//! softroce reads, padded to the union's size. Every size and offset is checked against the
//! installed header by `layout_tests` (a C program compiled with `cc`).
#![allow(non_camel_case_types)]

use core::ffi::{c_char, c_int, c_uint, c_void};
use libc::{pthread_cond_t, pthread_mutex_t};

/// A function pointer softroce leaves NULL (its type does not matter: NULL is NULL).
pub type Unset = Option<unsafe extern "C" fn()>;

/// `IBV_SYSFS_NAME_MAX`.
pub const IBV_SYSFS_NAME_MAX: usize = 64;
/// `IBV_SYSFS_PATH_MAX`.
pub const IBV_SYSFS_PATH_MAX: usize = 256;

// The `enum` constants of verbs.h that softroce's libraries read or write, under verbs.h's
// names; each typed as the field or argument that carries it. `layout_tests` compares
// every value with the installed header's.

/// `enum ibv_qp_type` (`ibv_qp.qp_type`, `ibv_qp_init_attr.qp_type`).
pub const IBV_QPT_RC: c_int = 2;
pub const IBV_QPT_UC: c_int = 3;
pub const IBV_QPT_UD: c_int = 4;
pub const IBV_QPT_XRC_RECV: c_int = 10;

/// `enum ibv_qp_state` (`ibv_qp_attr.qp_state`, `ibv_qp.state`).
pub const IBV_QPS_RESET: c_int = 0;
pub const IBV_QPS_INIT: c_int = 1;
pub const IBV_QPS_RTR: c_int = 2;
pub const IBV_QPS_RTS: c_int = 3;
pub const IBV_QPS_SQD: c_int = 4;
pub const IBV_QPS_SQE: c_int = 5;
pub const IBV_QPS_ERR: c_int = 6;

/// `enum ibv_qp_attr_mask` (the `attr_mask` argument of `ibv_modify_qp`).
pub const IBV_QP_STATE: c_int = 1 << 0;
pub const IBV_QP_CUR_STATE: c_int = 1 << 1;
pub const IBV_QP_EN_SQD_ASYNC_NOTIFY: c_int = 1 << 2;
pub const IBV_QP_ACCESS_FLAGS: c_int = 1 << 3;
pub const IBV_QP_PKEY_INDEX: c_int = 1 << 4;
pub const IBV_QP_PORT: c_int = 1 << 5;
pub const IBV_QP_QKEY: c_int = 1 << 6;
pub const IBV_QP_AV: c_int = 1 << 7;
pub const IBV_QP_PATH_MTU: c_int = 1 << 8;
pub const IBV_QP_TIMEOUT: c_int = 1 << 9;
pub const IBV_QP_RETRY_CNT: c_int = 1 << 10;
pub const IBV_QP_RNR_RETRY: c_int = 1 << 11;
pub const IBV_QP_RQ_PSN: c_int = 1 << 12;
pub const IBV_QP_MAX_QP_RD_ATOMIC: c_int = 1 << 13;
pub const IBV_QP_ALT_PATH: c_int = 1 << 14;
pub const IBV_QP_MIN_RNR_TIMER: c_int = 1 << 15;
pub const IBV_QP_SQ_PSN: c_int = 1 << 16;
pub const IBV_QP_MAX_DEST_RD_ATOMIC: c_int = 1 << 17;
pub const IBV_QP_PATH_MIG_STATE: c_int = 1 << 18;
pub const IBV_QP_CAP: c_int = 1 << 19;
pub const IBV_QP_DEST_QPN: c_int = 1 << 20;

/// `enum ibv_access_flags` (`ibv_qp_attr.qp_access_flags`, the `access` of `ibv_reg_mr`).
pub const IBV_ACCESS_LOCAL_WRITE: c_uint = 1 << 0;
pub const IBV_ACCESS_REMOTE_WRITE: c_uint = 1 << 1;
pub const IBV_ACCESS_REMOTE_READ: c_uint = 1 << 2;
pub const IBV_ACCESS_REMOTE_ATOMIC: c_uint = 1 << 3;
pub const IBV_ACCESS_MW_BIND: c_uint = 1 << 4;
pub const IBV_ACCESS_ZERO_BASED: c_uint = 1 << 5;
/// `IBV_ACCESS_OPTIONAL_RANGE`: the bits from `IBV_ACCESS_OPTIONAL_FIRST` (1 << 20) on,
/// hints a device may ignore.
pub const IBV_ACCESS_OPTIONAL_RANGE: c_uint = 0x3ff0_0000;

/// `enum ibv_mw_type` (the `type` of `ibv_alloc_mw`).
pub const IBV_MW_TYPE_1: c_int = 1;
pub const IBV_MW_TYPE_2: c_int = 2;

/// `enum ibv_wr_opcode` (`ibv_send_wr.opcode`).
pub const IBV_WR_RDMA_WRITE: c_int = 0;
pub const IBV_WR_RDMA_WRITE_WITH_IMM: c_int = 1;
pub const IBV_WR_SEND: c_int = 2;
pub const IBV_WR_SEND_WITH_IMM: c_int = 3;
pub const IBV_WR_RDMA_READ: c_int = 4;
pub const IBV_WR_ATOMIC_CMP_AND_SWP: c_int = 5;
pub const IBV_WR_ATOMIC_FETCH_AND_ADD: c_int = 6;
pub const IBV_WR_LOCAL_INV: c_int = 7;
pub const IBV_WR_BIND_MW: c_int = 8;
pub const IBV_WR_SEND_WITH_INV: c_int = 9;

/// `enum ibv_wc_opcode` (`ibv_wc.opcode`).
pub const IBV_WC_SEND: c_int = 0;
pub const IBV_WC_RDMA_WRITE: c_int = 1;
pub const IBV_WC_RDMA_READ: c_int = 2;
pub const IBV_WC_COMP_SWAP: c_int = 3;
pub const IBV_WC_FETCH_ADD: c_int = 4;
pub const IBV_WC_BIND_MW: c_int = 5;
pub const IBV_WC_LOCAL_INV: c_int = 6;
pub const IBV_WC_RECV: c_int = 1 << 7;
pub const IBV_WC_RECV_RDMA_WITH_IMM: c_int = (1 << 7) + 1;

/// `enum ibv_wc_flags` (`ibv_wc.wc_flags`): `IBV_WC_GRH`, the receive buffer starts with
/// the 40-byte network header.
pub const IBV_WC_GRH: c_uint = 1 << 0;

/// `enum ibv_gid_type` (`ibv_gid_entry.gid_type`).
pub const IBV_GID_TYPE_ROCE_V2: u32 = 2;

/// `IBV_LINK_LAYER_UNSPECIFIED` and `IBV_LINK_LAYER_ETHERNET` (`ibv_port_attr.link_layer`).
pub const IBV_LINK_LAYER_UNSPECIFIED: u8 = 0;
pub const IBV_LINK_LAYER_ETHERNET: u8 = 2;

/// `struct _ibv_device_ops`.
#[repr(C)]
pub struct _ibv_device_ops {
    pub _dummy1: Unset,
    pub _dummy2: Unset,
}

/// `struct ibv_device`.
#[repr(C)]
pub struct ibv_device {
    pub _ops: _ibv_device_ops,
    pub node_type: c_int,
    pub transport_type: c_int,
    pub name: [c_char; IBV_SYSFS_NAME_MAX],
    pub dev_name: [c_char; IBV_SYSFS_NAME_MAX],
    pub dev_path: [c_char; IBV_SYSFS_PATH_MAX],
    pub ibdev_path: [c_char; IBV_SYSFS_PATH_MAX],
}

pub type PollCqFn = unsafe extern "C" fn(*mut ibv_cq, c_int, *mut ibv_wc) -> c_int;
pub type ReqNotifyFn = unsafe extern "C" fn(*mut ibv_cq, c_int) -> c_int;
pub type PostSrqRecvFn =
    unsafe extern "C" fn(*mut ibv_srq, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int;
pub type PostSendFn =
    unsafe extern "C" fn(*mut ibv_qp, *mut ibv_send_wr, *mut *mut ibv_send_wr) -> c_int;
pub type PostRecvFn =
    unsafe extern "C" fn(*mut ibv_qp, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int;

pub type AllocMwFn = unsafe extern "C" fn(*mut ibv_pd, c_int) -> *mut ibv_mw;
pub type BindMwFn = unsafe extern "C" fn(*mut ibv_qp, *mut ibv_mw, *mut ibv_mw_bind) -> c_int;
pub type DeallocMwFn = unsafe extern "C" fn(*mut ibv_mw) -> c_int;

/// `struct ibv_context_ops`: the data path the static inline verbs call through.
#[repr(C)]
pub struct ibv_context_ops {
    pub _compat_query_device: Unset,
    pub _compat_query_port: Unset,
    pub _compat_alloc_pd: Unset,
    pub _compat_dealloc_pd: Unset,
    pub _compat_reg_mr: Unset,
    pub _compat_rereg_mr: Unset,
    pub _compat_dereg_mr: Unset,
    pub alloc_mw: Option<AllocMwFn>,
    pub bind_mw: Option<BindMwFn>,
    pub dealloc_mw: Option<DeallocMwFn>,
    pub _compat_create_cq: Unset,
    pub poll_cq: Option<PollCqFn>,
    pub req_notify_cq: Option<ReqNotifyFn>,
    pub _compat_cq_event: Unset,
    pub _compat_resize_cq: Unset,
    pub _compat_destroy_cq: Unset,
    pub _compat_create_srq: Unset,
    pub _compat_modify_srq: Unset,
    pub _compat_query_srq: Unset,
    pub _compat_destroy_srq: Unset,
    pub post_srq_recv: Option<PostSrqRecvFn>,
    pub _compat_create_qp: Unset,
    pub _compat_query_qp: Unset,
    pub _compat_modify_qp: Unset,
    pub _compat_destroy_qp: Unset,
    pub post_send: Option<PostSendFn>,
    pub post_recv: Option<PostRecvFn>,
    pub _compat_create_ah: Unset,
    pub _compat_destroy_ah: Unset,
    pub _compat_attach_mcast: Unset,
    pub _compat_detach_mcast: Unset,
    pub _compat_async_event: Unset,
}

/// `struct ibv_context`.
#[repr(C)]
pub struct ibv_context {
    pub device: *mut ibv_device,
    pub ops: ibv_context_ops,
    pub cmd_fd: c_int,
    pub async_fd: c_int,
    pub num_comp_vectors: c_int,
    pub mutex: pthread_mutex_t,
    pub abi_compat: *mut c_void,
}

/// `__VERBS_ABI_IS_EXTENDED`: `abi_compat` of a context that has a `verbs_context`.
pub const VERBS_ABI_IS_EXTENDED: *mut c_void = usize::MAX as *mut c_void;

pub type QueryPortFn =
    unsafe extern "C" fn(*mut ibv_context, u8, *mut ibv_port_attr, usize) -> c_int;
pub type QueryDeviceExFn = unsafe extern "C" fn(
    *mut ibv_context,
    *const ibv_query_device_ex_input,
    *mut ibv_device_attr_ex,
    usize,
) -> c_int;

/// `struct verbs_context`: the extended ops, which sit before the `ibv_context`.
#[repr(C)]
pub struct verbs_context {
    pub query_port: Option<QueryPortFn>,
    pub advise_mr: Unset,
    pub alloc_null_mr: Unset,
    pub read_counters: Unset,
    pub attach_counters_point_flow: Unset,
    pub create_counters: Unset,
    pub destroy_counters: Unset,
    pub reg_dm_mr: Unset,
    pub alloc_dm: Unset,
    pub free_dm: Unset,
    pub modify_flow_action_esp: Unset,
    pub destroy_flow_action: Unset,
    pub create_flow_action_esp: Unset,
    pub modify_qp_rate_limit: Unset,
    pub alloc_parent_domain: Unset,
    pub dealloc_td: Unset,
    pub alloc_td: Unset,
    pub modify_cq: Unset,
    pub post_srq_ops: Unset,
    pub destroy_rwq_ind_table: Unset,
    pub create_rwq_ind_table: Unset,
    pub destroy_wq: Unset,
    pub modify_wq: Unset,
    pub create_wq: Unset,
    pub query_rt_values: Unset,
    pub create_cq_ex: Option<CreateCqExFn>,
    pub priv_: *mut c_void,
    pub query_device_ex: Option<QueryDeviceExFn>,
    pub ibv_destroy_flow: Unset,
    pub abi_placeholder2: Unset,
    pub ibv_create_flow: Unset,
    pub abi_placeholder1: Unset,
    pub open_qp: Unset,
    pub create_qp_ex: Option<CreateQpExFn>,
    pub get_srq_num: Unset,
    pub create_srq_ex: Unset,
    pub open_xrcd: Unset,
    pub close_xrcd: Unset,
    pub _abi_placeholder3: u64,
    pub sz: usize,
    pub context: ibv_context,
}

/// `struct ibv_device_attr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_device_attr {
    pub fw_ver: [c_char; 64],
    pub node_guid: u64,
    pub sys_image_guid: u64,
    pub max_mr_size: u64,
    pub page_size_cap: u64,
    pub vendor_id: u32,
    pub vendor_part_id: u32,
    pub hw_ver: u32,
    pub max_qp: c_int,
    pub max_qp_wr: c_int,
    pub device_cap_flags: c_uint,
    pub max_sge: c_int,
    pub max_sge_rd: c_int,
    pub max_cq: c_int,
    pub max_cqe: c_int,
    pub max_mr: c_int,
    pub max_pd: c_int,
    pub max_qp_rd_atom: c_int,
    pub max_ee_rd_atom: c_int,
    pub max_res_rd_atom: c_int,
    pub max_qp_init_rd_atom: c_int,
    pub max_ee_init_rd_atom: c_int,
    pub atomic_cap: c_int,
    pub max_ee: c_int,
    pub max_rdd: c_int,
    pub max_mw: c_int,
    pub max_raw_ipv6_qp: c_int,
    pub max_raw_ethy_qp: c_int,
    pub max_mcast_grp: c_int,
    pub max_mcast_qp_attach: c_int,
    pub max_total_mcast_qp_attach: c_int,
    pub max_ah: c_int,
    pub max_fmr: c_int,
    pub max_map_per_fmr: c_int,
    pub max_srq: c_int,
    pub max_srq_wr: c_int,
    pub max_srq_sge: c_int,
    pub max_pkeys: u16,
    pub local_ca_ack_delay: u8,
    pub phys_port_cnt: u8,
}

/// `struct ibv_query_device_ex_input`.
#[repr(C)]
pub struct ibv_query_device_ex_input {
    pub comp_mask: u32,
}

/// `struct ibv_device_attr_ex`: `orig_attr`, `comp_mask`, then the extended capabilities,
/// which softroce reports as zero (none), and `phys_port_cnt_ex`.
#[repr(C)]
pub struct ibv_device_attr_ex {
    pub orig_attr: ibv_device_attr,
    pub comp_mask: u32,
    pub _extended: [u8; IBV_DEVICE_ATTR_EX_EXTENDED],
    pub xrc_odp_caps: u32,
    pub phys_port_cnt_ex: u32,
}
/// Bytes from after `comp_mask` to `xrc_odp_caps` (odp_caps … pci_atomic_caps).
pub const IBV_DEVICE_ATTR_EX_EXTENDED: usize = 156;

/// `struct ibv_port_attr`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_port_attr {
    pub state: c_int,
    pub max_mtu: c_int,
    pub active_mtu: c_int,
    pub gid_tbl_len: c_int,
    pub port_cap_flags: u32,
    pub max_msg_sz: u32,
    pub bad_pkey_cntr: u32,
    pub qkey_viol_cntr: u32,
    pub pkey_tbl_len: u16,
    pub lid: u16,
    pub sm_lid: u16,
    pub lmc: u8,
    pub max_vl_num: u8,
    pub sm_sl: u8,
    pub subnet_timeout: u8,
    pub init_type_reply: u8,
    pub active_width: u8,
    pub active_speed: u8,
    pub phys_state: u8,
    pub link_layer: u8,
    pub flags: u8,
    pub port_cap_flags2: u16,
}

/// `union ibv_gid` (16 bytes, aligned as its two `__be64` halves).
#[repr(C, align(8))]
#[derive(Clone, Copy, Default, PartialEq, Eq)]
pub struct ibv_gid {
    pub raw: [u8; 16],
}

/// `struct ibv_gid_entry`.
#[repr(C)]
pub struct ibv_gid_entry {
    pub gid: ibv_gid,
    pub gid_index: u32,
    pub port_num: u32,
    pub gid_type: u32,
    pub ndev_ifindex: u32,
}

/// `struct ibv_pd`.
#[repr(C)]
pub struct ibv_pd {
    pub context: *mut ibv_context,
    pub handle: u32,
}

/// `struct ibv_mr`.
#[repr(C)]
pub struct ibv_mr {
    pub context: *mut ibv_context,
    pub pd: *mut ibv_pd,
    pub addr: *mut c_void,
    pub length: usize,
    pub handle: u32,
    pub lkey: u32,
    pub rkey: u32,
}

/// `struct ibv_mw`.
#[repr(C)]
pub struct ibv_mw {
    pub context: *mut ibv_context,
    pub pd: *mut ibv_pd,
    pub rkey: u32,
    pub handle: u32,
    /// `enum ibv_mw_type`: 1 or 2.
    pub type_: c_int,
}

/// `struct ibv_mw_bind_info`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_mw_bind_info {
    pub mr: *mut ibv_mr,
    pub addr: u64,
    pub length: u64,
    pub mw_access_flags: c_uint,
}

/// `struct ibv_mw_bind`: what `ibv_bind_mw` binds a type 1 window with.
#[repr(C)]
pub struct ibv_mw_bind {
    pub wr_id: u64,
    pub send_flags: c_uint,
    pub bind_info: ibv_mw_bind_info,
}

/// `ibv_send_wr.bind_mw`: an `IBV_WR_BIND_MW` request's window, new R_Key and binding.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_send_wr_bind_mw {
    pub mw: *mut ibv_mw,
    pub rkey: u32,
    pub bind_info: ibv_mw_bind_info,
}

/// `struct ibv_comp_channel`.
#[repr(C)]
pub struct ibv_comp_channel {
    pub context: *mut ibv_context,
    pub fd: c_int,
    pub refcnt: c_int,
}

/// `struct ibv_cq`.
#[repr(C)]
pub struct ibv_cq {
    pub context: *mut ibv_context,
    pub channel: *mut ibv_comp_channel,
    pub cq_context: *mut c_void,
    pub handle: u32,
    pub cqe: c_int,
    pub mutex: pthread_mutex_t,
    pub cond: pthread_cond_t,
    pub comp_events_completed: u32,
    pub async_events_completed: u32,
}

/// `struct ibv_srq`.
#[repr(C)]
pub struct ibv_srq {
    pub context: *mut ibv_context,
    pub srq_context: *mut c_void,
    pub pd: *mut ibv_pd,
    pub handle: u32,
    pub mutex: pthread_mutex_t,
    pub cond: pthread_cond_t,
    pub events_completed: u32,
}

/// `struct ibv_qp`.
#[repr(C)]
pub struct ibv_qp {
    pub context: *mut ibv_context,
    pub qp_context: *mut c_void,
    pub pd: *mut ibv_pd,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut ibv_srq,
    pub handle: u32,
    pub qp_num: u32,
    pub state: c_int,
    pub qp_type: c_int,
    pub mutex: pthread_mutex_t,
    pub cond: pthread_cond_t,
    pub events_completed: u32,
}

/// `struct ibv_ah`.
#[repr(C)]
pub struct ibv_ah {
    pub context: *mut ibv_context,
    pub pd: *mut ibv_pd,
    pub handle: u32,
}

/// `struct ibv_global_route`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_global_route {
    pub dgid: ibv_gid,
    pub flow_label: u32,
    pub sgid_index: u8,
    pub hop_limit: u8,
    pub traffic_class: u8,
}

/// `struct ibv_ah_attr`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_ah_attr {
    pub grh: ibv_global_route,
    pub dlid: u16,
    pub sl: u8,
    pub src_path_bits: u8,
    pub static_rate: u8,
    pub is_global: u8,
    pub port_num: u8,
}

/// `struct ibv_qp_cap`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_qp_cap {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

/// `struct ibv_qp_attr`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_qp_attr {
    pub qp_state: c_int,
    pub cur_qp_state: c_int,
    pub path_mtu: c_int,
    pub path_mig_state: c_int,
    pub qkey: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub dest_qp_num: u32,
    pub qp_access_flags: c_uint,
    pub cap: ibv_qp_cap,
    pub ah_attr: ibv_ah_attr,
    pub alt_ah_attr: ibv_ah_attr,
    pub pkey_index: u16,
    pub alt_pkey_index: u16,
    pub en_sqd_async_notify: u8,
    pub sq_draining: u8,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub min_rnr_timer: u8,
    pub port_num: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub alt_port_num: u8,
    pub alt_timeout: u8,
    pub rate_limit: u32,
}

/// `struct ibv_qp_init_attr`.
#[repr(C)]
pub struct ibv_qp_init_attr {
    pub qp_context: *mut c_void,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut ibv_srq,
    pub cap: ibv_qp_cap,
    pub qp_type: c_int,
    pub sq_sig_all: c_int,
}

/// `struct ibv_srq_attr`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_srq_attr {
    pub max_wr: u32,
    pub max_sge: u32,
    pub srq_limit: u32,
}

/// `struct ibv_srq_init_attr`.
#[repr(C)]
pub struct ibv_srq_init_attr {
    pub srq_context: *mut c_void,
    pub attr: ibv_srq_attr,
}

/// `struct ibv_sge`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_sge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

/// `struct ibv_recv_wr`.
#[repr(C)]
pub struct ibv_recv_wr {
    pub wr_id: u64,
    pub next: *mut ibv_recv_wr,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
}

/// `ibv_send_wr.wr.rdma`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_send_wr_rdma {
    pub remote_addr: u64,
    pub rkey: u32,
}

/// `ibv_send_wr.wr.atomic`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_send_wr_atomic {
    pub remote_addr: u64,
    pub compare_add: u64,
    pub swap: u64,
    pub rkey: u32,
}

/// `ibv_send_wr.wr.ud`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_send_wr_ud {
    pub ah: *mut ibv_ah,
    pub remote_qpn: u32,
    pub remote_qkey: u32,
}

/// `ibv_send_wr.wr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union ibv_send_wr_wr {
    pub rdma: ibv_send_wr_rdma,
    pub atomic: ibv_send_wr_atomic,
    pub ud: ibv_send_wr_ud,
}

/// `struct ibv_send_wr`.
#[repr(C)]
pub struct ibv_send_wr {
    pub wr_id: u64,
    pub next: *mut ibv_send_wr,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
    pub opcode: c_int,
    pub send_flags: c_uint,
    /// `imm_data` (network byte order) or `invalidate_rkey`.
    pub imm_data: u32,
    pub wr: ibv_send_wr_wr,
    /// `qp_type.xrc.remote_srqn`.
    pub remote_srqn: u32,
    /// The `bind_mw` / `tso` union (`tso` is not read: no raw packet QPs).
    pub bind_mw: ibv_send_wr_bind_mw,
}

/// `struct ibv_wc`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_wc {
    pub wr_id: u64,
    pub status: c_int,
    pub opcode: c_int,
    pub vendor_err: u32,
    pub byte_len: u32,
    /// `imm_data` (network byte order) or `invalidated_rkey`.
    pub imm_data: u32,
    pub qp_num: u32,
    pub src_qp: u32,
    pub wc_flags: c_uint,
    pub pkey_index: u16,
    pub slid: u16,
    pub sl: u8,
    pub dlid_path_bits: u8,
}

/// `struct ibv_async_event`.
#[repr(C)]
pub struct ibv_async_event {
    /// `element`: a CQ, QP, SRQ or WQ pointer, or `port_num`.
    pub element: *mut c_void,
    pub event_type: c_int,
}

/// `struct ibv_rx_hash_conf` (read by nothing; RSS QPs are not supported).
#[repr(C)]
pub struct ibv_rx_hash_conf {
    pub rx_hash_function: u8,
    pub rx_hash_key_len: u8,
    pub rx_hash_key: *mut u8,
    pub rx_hash_fields_mask: u64,
}

/// `struct ibv_qp_init_attr_ex`: `ibv_qp_init_attr` then the extended fields.
#[repr(C)]
pub struct ibv_qp_init_attr_ex {
    pub qp_context: *mut c_void,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut ibv_srq,
    pub cap: ibv_qp_cap,
    pub qp_type: c_int,
    pub sq_sig_all: c_int,
    pub comp_mask: u32,
    pub pd: *mut ibv_pd,
    pub xrcd: *mut c_void,
    pub create_flags: u32,
    pub max_tso_header: u16,
    pub rwq_ind_tbl: *mut c_void,
    pub rx_hash_conf: ibv_rx_hash_conf,
    pub source_qpn: u32,
    pub send_ops_flags: u64,
}

/// `IBV_QP_INIT_ATTR_PD`.
pub const IBV_QP_INIT_ATTR_PD: u32 = 1 << 0;
/// `IBV_QP_INIT_ATTR_XRCD`.
pub const IBV_QP_INIT_ATTR_XRCD: u32 = 1 << 1;
/// `IBV_QP_INIT_ATTR_CREATE_FLAGS`.
pub const IBV_QP_INIT_ATTR_CREATE_FLAGS: u32 = 1 << 2;
/// `IBV_QP_INIT_ATTR_SEND_OPS_FLAGS`.
pub const IBV_QP_INIT_ATTR_SEND_OPS_FLAGS: u32 = 1 << 6;

/// `struct ibv_data_buf`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_data_buf {
    pub addr: *mut c_void,
    pub length: usize,
}

/// `struct ibv_qp_ex`: the QP, then the work request builder (`ibv_wr_*`).
#[repr(C)]
pub struct ibv_qp_ex {
    pub qp_base: ibv_qp,
    pub comp_mask: u64,
    pub wr_id: u64,
    pub wr_flags: c_uint,
    pub wr_atomic_cmp_swp: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, u64, u64)>,
    pub wr_atomic_fetch_add: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, u64)>,
    pub wr_bind_mw:
        Option<unsafe extern "C" fn(*mut ibv_qp_ex, *mut ibv_mw, u32, *const ibv_mw_bind_info)>,
    pub wr_local_inv: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32)>,
    pub wr_rdma_read: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64)>,
    pub wr_rdma_write: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64)>,
    pub wr_rdma_write_imm: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, u32)>,
    pub wr_send: Option<unsafe extern "C" fn(*mut ibv_qp_ex)>,
    pub wr_send_imm: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32)>,
    pub wr_send_inv: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32)>,
    pub wr_send_tso: Option<unsafe extern "C" fn(*mut ibv_qp_ex, *mut c_void, u16, u16)>,
    pub wr_set_ud_addr: Option<unsafe extern "C" fn(*mut ibv_qp_ex, *mut ibv_ah, u32, u32)>,
    pub wr_set_xrc_srqn: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32)>,
    pub wr_set_inline_data: Option<unsafe extern "C" fn(*mut ibv_qp_ex, *mut c_void, usize)>,
    pub wr_set_inline_data_list:
        Option<unsafe extern "C" fn(*mut ibv_qp_ex, usize, *const ibv_data_buf)>,
    pub wr_set_sge: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, u32)>,
    pub wr_set_sge_list: Option<unsafe extern "C" fn(*mut ibv_qp_ex, usize, *const ibv_sge)>,
    pub wr_start: Option<unsafe extern "C" fn(*mut ibv_qp_ex)>,
    pub wr_complete: Option<unsafe extern "C" fn(*mut ibv_qp_ex) -> c_int>,
    pub wr_abort: Option<unsafe extern "C" fn(*mut ibv_qp_ex)>,
    pub wr_atomic_write: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, *const c_void)>,
}

/// `struct ibv_cq_init_attr_ex`.
#[repr(C)]
pub struct ibv_cq_init_attr_ex {
    pub cqe: u32,
    pub cq_context: *mut c_void,
    pub channel: *mut ibv_comp_channel,
    pub comp_vector: u32,
    pub wc_flags: u64,
    pub comp_mask: u32,
    pub flags: u32,
    pub parent_domain: *mut ibv_pd,
}

/// `struct ibv_poll_cq_attr`.
#[repr(C)]
pub struct ibv_poll_cq_attr {
    pub comp_mask: u32,
}

/// `struct ibv_cq_ex`: `ibv_cq`, then the current completion and its readers.
#[repr(C)]
pub struct ibv_cq_ex {
    pub context: *mut ibv_context,
    pub channel: *mut ibv_comp_channel,
    pub cq_context: *mut c_void,
    pub handle: u32,
    pub cqe: c_int,
    pub mutex: pthread_mutex_t,
    pub cond: pthread_cond_t,
    pub comp_events_completed: u32,
    pub async_events_completed: u32,
    pub comp_mask: u32,
    pub status: c_int,
    pub wr_id: u64,
    pub start_poll: Option<unsafe extern "C" fn(*mut ibv_cq_ex, *mut ibv_poll_cq_attr) -> c_int>,
    pub next_poll: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> c_int>,
    pub end_poll: Option<unsafe extern "C" fn(*mut ibv_cq_ex)>,
    pub read_opcode: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> c_int>,
    pub read_vendor_err: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u32>,
    pub read_byte_len: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u32>,
    pub read_imm_data: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u32>,
    pub read_qp_num: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u32>,
    pub read_src_qp: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u32>,
    pub read_wc_flags: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> c_uint>,
    pub read_slid: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u32>,
    pub read_sl: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u8>,
    pub read_dlid_path_bits: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u8>,
    pub read_completion_ts: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u64>,
    pub read_cvlan: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u16>,
    pub read_flow_tag: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u32>,
    pub read_tm_info: Option<unsafe extern "C" fn(*mut ibv_cq_ex, *mut c_void)>,
    pub read_completion_wallclock_ns: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u64>,
}

/// `verbs_context.create_qp_ex`.
pub type CreateQpExFn =
    unsafe extern "C" fn(*mut ibv_context, *mut ibv_qp_init_attr_ex) -> *mut ibv_qp;
/// `verbs_context.create_cq_ex`.
pub type CreateCqExFn =
    unsafe extern "C" fn(*mut ibv_context, *mut ibv_cq_init_attr_ex) -> *mut ibv_cq_ex;
