//! QP transitions, as librdmacm makes them for an id's QP (`ucma_init_conn_qp`,
//! `ucma_modify_qp_rtr` / `_rts` / `_err`, `ucma_init_ud_qp`): the attributes and masks
//! of INIT, RTR and RTS (also what `rdma_init_qp_attr` hands out, `options.rs`) and their
//! application through libibverbs.so.1's `ibv_modify_qp`. RTR and RTS come from the
//! `RcConnect` the engine derives from the REQ or REP.

use super::state::errno_or;
use crate::abi::*;
use crate::ibv::Ibv;
use core::ffi::c_int;
use softroce::verbs::RcConnect;

fn modify(ibv: &Ibv, qp: *mut ibv_qp, attr: &mut ibv_qp_attr, mask: c_int) -> Result<(), c_int> {
    // SAFETY: `qp` is the id's live QP; `attr` a valid ibv_qp_attr.
    match unsafe { (ibv.modify_qp)(qp, attr, mask) } {
        0 => Ok(()),
        e if e > 0 => Err(e),
        _ => Err(errno_or(libc::EINVAL)),
    }
}

/// INIT's attributes and mask for a QP of type `qp_type` (librdmacm `ucma_init_conn_qp`,
/// kernel `cma_ib_init_qp_attr`).
pub(super) fn init_attr(qp_type: c_int) -> (ibv_qp_attr, c_int) {
    let mut a = ibv_qp_attr {
        qp_state: IBV_QPS_INIT,
        pkey_index: 0,
        port_num: 1,
        ..Default::default()
    };
    let mut m = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT;
    if qp_type == IBV_QPT_UD {
        a.qkey = RDMA_UDP_QKEY;
        m |= IBV_QP_QKEY;
    } else {
        // Deviation: librdmacm grants remote READ/atomics only when responder resources
        // are negotiated; softroce grants them at INIT (the engine still bounds READs by
        // max_dest_rd_atomic).
        a.qp_access_flags =
            IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
        m |= IBV_QP_ACCESS_FLAGS;
    }
    (a, m)
}

pub(super) fn qp_init(ibv: &Ibv, qp: *mut ibv_qp, qp_type: c_int) -> Result<(), c_int> {
    let (mut a, m) = init_attr(qp_type);
    modify(ibv, qp, &mut a, m)
}

/// rdma_cm's Q_Key for UDP port space ids.
pub(super) const RDMA_UDP_QKEY: u32 = 0x0123_4567;

/// RTR's attributes and mask from what the engine derived from the REQ or REP
/// (`RcConnect::rdma_cm_passive` / `rdma_cm_active`).
pub(super) fn rtr_attr(c: &RcConnect) -> (ibv_qp_attr, c_int) {
    let mut a = ibv_qp_attr {
        qp_state: IBV_QPS_RTR,
        path_mtu: c.path_mtu as c_int,
        dest_qp_num: c.dest_qp_num,
        rq_psn: c.rq_psn,
        max_dest_rd_atomic: c.max_dest_rd_atomic,
        min_rnr_timer: c.min_rnr_timer,
        ..Default::default()
    };
    a.ah_attr.is_global = 1;
    a.ah_attr.port_num = 1;
    a.ah_attr.dlid = 0;
    a.ah_attr.grh.dgid.raw = c.dgid.0;
    a.ah_attr.grh.sgid_index = c.sgid_index;
    a.ah_attr.grh.hop_limit = c.hop_limit;
    a.ah_attr.grh.traffic_class = c.traffic_class;
    a.ah_attr.grh.flow_label = c.flow_label;
    let m = IBV_QP_STATE
        | IBV_QP_AV
        | IBV_QP_PATH_MTU
        | IBV_QP_DEST_QPN
        | IBV_QP_RQ_PSN
        | IBV_QP_MAX_DEST_RD_ATOMIC
        | IBV_QP_MIN_RNR_TIMER;
    (a, m)
}

/// RTS's attributes and mask, from the same `RcConnect` as [`rtr_attr`].
pub(super) fn rts_attr(c: &RcConnect) -> (ibv_qp_attr, c_int) {
    let a = ibv_qp_attr {
        qp_state: IBV_QPS_RTS,
        sq_psn: c.sq_psn,
        timeout: c.timeout,
        retry_cnt: c.retry_cnt,
        rnr_retry: c.rnr_retry,
        max_rd_atomic: c.max_rd_atomic,
        ..Default::default()
    };
    let m = IBV_QP_STATE
        | IBV_QP_SQ_PSN
        | IBV_QP_TIMEOUT
        | IBV_QP_RETRY_CNT
        | IBV_QP_RNR_RETRY
        | IBV_QP_MAX_QP_RD_ATOMIC;
    (a, m)
}

/// RTR through `ibv_modify_qp`.
pub(super) fn qp_rtr(ibv: &Ibv, qp: *mut ibv_qp, c: &RcConnect) -> Result<(), c_int> {
    let (mut a, m) = rtr_attr(c);
    modify(ibv, qp, &mut a, m)
}

/// RTS through `ibv_modify_qp`.
pub(super) fn qp_rts(ibv: &Ibv, qp: *mut ibv_qp, c: &RcConnect) -> Result<(), c_int> {
    let (mut a, m) = rts_attr(c);
    modify(ibv, qp, &mut a, m)
}

/// A UD QP goes on to RTR and RTS at once (librdmacm's `ucma_init_ud_qp`: SQ PSN 0).
pub(super) fn ud_qp_rts(ibv: &Ibv, qp: *mut ibv_qp) -> Result<(), c_int> {
    let mut a = ibv_qp_attr {
        qp_state: IBV_QPS_RTR,
        ..Default::default()
    };
    modify(ibv, qp, &mut a, IBV_QP_STATE)?;
    let mut a = ibv_qp_attr {
        qp_state: IBV_QPS_RTS,
        sq_psn: 0,
        ..Default::default()
    };
    modify(ibv, qp, &mut a, IBV_QP_STATE | IBV_QP_SQ_PSN)
}

pub(super) fn qp_err(ibv: &Ibv, qp: *mut ibv_qp) {
    if qp.is_null() {
        return;
    }
    let mut a = ibv_qp_attr {
        qp_state: IBV_QPS_ERR,
        ..Default::default()
    };
    let _ = modify(ibv, qp, &mut a, IBV_QP_STATE);
}
