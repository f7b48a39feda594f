//! Options of an id: `rdma_set_option` (the RC ACK timeout; TOS, REUSEADDR and AFONLY are
//! accepted with no effect), `rdma_init_qp_attr` (the attributes librdmacm itself would
//! apply to an external QP), and ECE (`rdma_set_local_ece`, `rdma_get_remote_ece`: kept,
//! never sent).

use super::state::state;
use super::transitions::{init_attr, rtr_attr, rts_attr};
use crate::abi::*;
use crate::ffi;
use core::ffi::{c_int, c_void};
use softroce::verbs::RcConnect;

pub(crate) extern "C" fn rdma_set_option(
    id: *mut rdma_cm_id,
    level: c_int,
    optname: c_int,
    optval: *mut c_void,
    optlen: usize,
) -> c_int {
    ffi!({
        let mut st = state()?;
        let s = st.id_mut(id)?;
        match (level, optname) {
            // RDMA_OPTION_ID_ACK_TIMEOUT (a uint8_t): the RC QP's ACK timeout at RTS
            // (kernel rdma_set_ack_timeout: RC ids only).
            (RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT) => {
                // SAFETY: live id.
                if optval.is_null() || optlen < 1 || unsafe { (*id).qp_type } != IBV_QPT_RC {
                    return Err(libc::EINVAL);
                }
                // SAFETY: the caller passes `optlen` (>= 1) readable bytes.
                s.ack_timeout = Some(unsafe { *optval.cast::<u8>() } & 0x1f);
                Ok(())
            }
            // TOS, REUSEADDR, AFONLY: accepted, no effect on softroce's paths.
            (RDMA_OPTION_ID, 0..=2) => Ok(()),
            _ => Err(libc::ENOSYS),
        }?;
        Ok(0)
    })
}

/// `rdma_init_qp_attr`: the attributes (and mask) that move an external QP to
/// `qp_attr->qp_state` for this id, as librdmacm.so.1 itself would apply them: INIT as
/// `rdma_create_qp` does; for RC, RTR and RTS from the REQ (passive, before `rdma_accept`,
/// with the REQ's responder resources and initiator depth unless `rdma_accept` is given
/// others) or the REP (active, after RDMA_CM_EVENT_CONNECT_RESPONSE); for UD, RTR and RTS
/// with SQ PSN 0. Source: kernel `rdma_init_qp_attr` / `ib_cm_init_qp_attr`.
/// Errors: EINVAL for another state, or RTR/RTS of an RC id with no REQ or REP yet.
pub(crate) extern "C" fn rdma_init_qp_attr(
    id: *mut rdma_cm_id,
    qp_attr: *mut ibv_qp_attr,
    qp_attr_mask: *mut c_int,
) -> c_int {
    ffi!({
        if qp_attr.is_null() || qp_attr_mask.is_null() {
            return Err(libc::EINVAL);
        }
        let mut st = state()?;
        let s = st.id_mut(id)?;
        // SAFETY: live id; the caller's attr.
        let (qp_type, want) = unsafe { ((*id).qp_type, (*qp_attr).qp_state) };
        let (dev, peer) = (s.dev, s.remote.map(|r| r.ip()));
        let (a, m) = if want == IBV_QPS_INIT {
            init_attr(qp_type)
        } else if qp_type == IBV_QPT_UD && want == IBV_QPS_RTR {
            (
                ibv_qp_attr {
                    qp_state: IBV_QPS_RTR,
                    ..Default::default()
                },
                IBV_QP_STATE,
            )
        } else if qp_type == IBV_QPT_UD && want == IBV_QPS_RTS {
            (
                ibv_qp_attr {
                    qp_state: IBV_QPS_RTS,
                    sq_psn: 0,
                    ..Default::default()
                },
                IBV_QP_STATE | IBV_QP_SQ_PSN,
            )
        } else if want == IBV_QPS_RTR || want == IBV_QPS_RTS {
            let (Some(dev), Some(peer)) = (dev, peer) else {
                return Err(libc::EINVAL);
            };
            let port_mtu = st.open(dev)?.path_mtu();
            let s = st.id_mut(id)?;
            let mut c = if let Some(req) = &s.req {
                RcConnect::rdma_cm_passive(
                    req,
                    peer,
                    port_mtu,
                    req.initiator_depth,
                    req.responder_resources,
                    s.starting_psn,
                )
            } else if let Some(rep) = &s.rep {
                RcConnect::rdma_cm_active(
                    rep,
                    peer,
                    port_mtu,
                    s.responder_resources,
                    s.initiator_depth,
                    s.retry_count,
                    s.starting_psn,
                )
            } else {
                return Err(libc::EINVAL);
            };
            c.timeout = s.ack_timeout.unwrap_or(c.timeout);
            if want == IBV_QPS_RTR {
                rtr_attr(&c)
            } else {
                rts_attr(&c)
            }
        } else {
            return Err(libc::EINVAL);
        };
        // SAFETY: the caller's attr and mask, writable.
        unsafe {
            *qp_attr = a;
            *qp_attr_mask = m;
        }
        Ok(0)
    })
}

/// `RDMA_OPTION_ID` (rdma_cma.h): options of the id.
const RDMA_OPTION_ID: c_int = 0;
/// `RDMA_OPTION_ID_ACK_TIMEOUT`.
const RDMA_OPTION_ID_ACK_TIMEOUT: c_int = 3;

/// `struct ibv_ece` (verbs.h): Enhanced Connection Establishment options.
#[repr(C)]
pub(crate) struct ibv_ece {
    vendor_id: u32,
    options: u32,
    comp_mask: u32,
}

/// `rdma_set_local_ece`: keeps the ECE an external-QP user wants announced. softroce's CM
/// sends none (its QPs have no ECE options, as rxe's: `ibv_query_ece` is EOPNOTSUPP), so
/// this is only remembered. Errors as librdmacm: EINVAL for a NULL id or ece, an id with a
/// QP, vendor ID 0 or a comp_mask.
pub(crate) extern "C" fn rdma_set_local_ece(id: *mut rdma_cm_id, ece: *mut ibv_ece) -> c_int {
    ffi!({
        // SAFETY: NULL or the caller's ibv_ece.
        let Some(e) = (unsafe { ece.as_ref() }) else {
            return Err(libc::EINVAL);
        };
        let mut st = state()?;
        let s = st.id_mut(id)?;
        // SAFETY: live id.
        if unsafe { !(*id).qp.is_null() } || e.vendor_id == 0 || e.comp_mask != 0 {
            return Err(libc::EINVAL);
        }
        s.local_ece = Some((e.vendor_id, e.options));
        Ok(0)
    })
}

/// `rdma_get_remote_ece`: the ECE the peer's REQ or REP carried: none on softroce's CM
/// (vendor ID 0, options 0, as a peer without ECE sends). Errors: EINVAL for a NULL id or
/// ece, or an id with a QP (librdmacm: for external QPs only).
pub(crate) extern "C" fn rdma_get_remote_ece(id: *mut rdma_cm_id, ece: *mut ibv_ece) -> c_int {
    ffi!({
        // SAFETY: NULL or the caller's ibv_ece.
        let Some(e) = (unsafe { ece.as_mut() }) else {
            return Err(libc::EINVAL);
        };
        state()?.id_mut(id)?;
        // SAFETY: live id.
        if unsafe { !(*id).qp.is_null() } {
            return Err(libc::EINVAL);
        }
        *e = ibv_ece {
            vendor_id: 0,
            options: 0,
            comp_mask: 0,
        };
        Ok(0)
    })
}
