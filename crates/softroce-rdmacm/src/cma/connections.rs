//! Connections: `rdma_listen` (and the REQs parked while its service ID lingered),
//! `rdma_connect` (a REQ, or a SIDR_REQ for a UD id), `rdma_accept` (RTR/RTS of the id's
//! QP, then the REP; a SIDR_REP), `rdma_reject`, `rdma_establish`, `rdma_disconnect` (the
//! QP to ERR, then the DREQ) and a synchronous listener's `rdma_get_request`.
//!
//! Sources: rdma-core `librdmacm/cma.c` (the RTR/RTS sequence of `ucma_modify_qp_rtr` /
//! `_rts`, rdma_disconnect moving the QP to ERR), kernel `drivers/infiniband/core/cma.c`.

use super::driver::{End, end_connection, pump};
use super::events::{rdma_ack_cm_event, rdma_get_cm_event, sync_result};
use super::ids::bind;
use super::qp::rdma_create_qp;
use super::requests::{SIDR_REP_PRIVATE, SIDR_REQ_PRIVATE, connect_request};
use super::state::{State, errno_or, now, state};
use super::transitions::{RDMA_UDP_QKEY, qp_err, qp_rtr, qp_rts};
use crate::abi::*;
use crate::ffi;
use crate::ibv::ibv;
use core::ffi::{c_int, c_void};
use softroce::cm::rdma_cm::{
    CMA_HDR_LEN, REP_PRIVATE_DATA_LEN as REP_PRIVATE, REQ_PRIVATE_DATA_LEN as REQ_PRIVATE,
};
use softroce::cm::{AcceptParams, ConnectParams};
use softroce::verbs::RcConnect;
use softroce::wire::cm::{CmaHdrRepr, SidrStatus, rdma_cm_service_id};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

pub(crate) extern "C" fn rdma_listen(id: *mut rdma_cm_id, backlog: c_int) -> c_int {
    ffi!({
        let mut st = state()?;
        if st.id_mut(id)?.local.is_none() {
            bind(
                &mut st,
                id,
                SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0),
            )?;
        }
        let s = st.id_mut(id)?;
        if s.listening {
            return Ok(0);
        }
        // SAFETY: live id.
        let ps = unsafe { (*id).ps };
        // UD port spaces listen for SIDR_REQs on the same service ID.
        let (sid, devs) = st.service_scope(id, ps).ok_or(libc::EINVAL)?;
        let ibv = ibv()?;
        for &d in &devs {
            let o = st.open(d)?;
            // A shared device steers the service's REQs to one process: this one, unless
            // another listens on it (then EADDRINUSE, as the kernel's rdma_listen gives
            // for a port another process holds).
            // SAFETY: the device's open context.
            if unsafe { (ibv.cm_listen)(o.ctx, sid, 1) } != 0 {
                return Err(errno_or(libc::EADDRINUSE));
            }
            // Another id of this process may listen on the same service on another
            // address of the device set: the engine listens once per device.
            // The backlog caps the requests not yet answered; <= 0 means the largest
            // (kernel ucma_listen).
            // A held or lingering service ID is listened on already, with the largest
            // backlog: listen again with this one.
            if o.lingering.contains_key(&sid) {
                o.cm.unlisten(sid);
            }
            let _ =
                o.cm.listen_with_backlog(sid, usize::try_from(backlog).unwrap_or(0));
        }
        st.id_mut(id)?.listening = true;
        // REQs that came while the service lingered are this listener's now.
        for d in devs {
            let Some(o) = st.devs[d].open.as_mut() else {
                continue;
            };
            o.lingering.remove(&sid);
            let (mine, kept) = std::mem::take(&mut o.parked)
                .into_iter()
                .partition(|p| p.req.service_id == sid);
            o.parked = kept;
            for p in mine {
                connect_request(&mut st, d, p.comm, p.peer, p.req, p.cma);
            }
            pump(&mut st, d);
        }
        Ok(0)
    })
}

/// The SRQ bit of a REQ or REP (librdmacm: whether the id's QP has an SRQ, else
/// `conn_param->srq`).
fn qp_has_srq(idr: &rdma_cm_id, cp: Option<&rdma_conn_param>) -> bool {
    if idr.qp.is_null() {
        cp.is_some_and(|c| c.srq != 0)
    } else {
        // SAFETY: the id's live QP.
        !unsafe { (*idr.qp).srq }.is_null()
    }
}

/// The private data of a conn_param.
///
/// # Safety
/// `p` is NULL or a valid rdma_conn_param whose private data has its length.
unsafe fn private_of<'a>(p: *const rdma_conn_param) -> &'a [u8] {
    // SAFETY: the caller's contract.
    unsafe {
        match p.as_ref() {
            Some(c) if !c.private_data.is_null() && c.private_data_len > 0 => {
                std::slice::from_raw_parts(c.private_data.cast(), c.private_data_len.into())
            }
            _ => &[],
        }
    }
}

/// The body of [`rdma_connect`].
fn connect(id: *mut rdma_cm_id, conn_param: *mut rdma_conn_param) -> Result<(), c_int> {
    let mut st = state()?;
    let psn = (st.random() & 0x00ff_ffff) as u32;
    let s = st.id_mut(id)?;
    let (Some(local), Some(remote), Some(dev)) = (s.local, s.remote, s.dev) else {
        return Err(libc::EINVAL);
    };
    if s.comm.is_some() {
        return Err(libc::EISCONN);
    }
    // Only to a route the application resolved (kernel rdma_connect: state
    // ROUTE_RESOLVED). A passive id's address is the one its peer's rdma_cm header names,
    // which rdma_connect must not send a REQ to: before, one whose request had ended
    // connected to whatever address a (cut) header said (a fuzz finding).
    if !s.route_resolved {
        return Err(libc::EINVAL);
    }
    // SAFETY: live id; conn_param NULL or the caller's.
    let (idr, cp) = unsafe { (&*id, conn_param.as_ref()) };
    // SAFETY: as above.
    let user = unsafe { private_of(conn_param) };
    let max = if idr.qp_type == IBV_QPT_UD {
        SIDR_REQ_PRIVATE
    } else {
        REQ_PRIVATE
    };
    if user.len() > max - CMA_HDR_LEN {
        return Err(libc::EINVAL);
    }
    if idr.qp_type == IBV_QPT_UD {
        // A SIDR_REQ (kernel cma_resolve_ib_udp): the cma header, then the user's.
        let mut pd = vec![0u8; CMA_HDR_LEN];
        CmaHdrRepr::new(local.ip(), local.port(), remote.ip()).emit(&mut pd);
        pd.extend_from_slice(user);
        let sid = rdma_cm_service_id(idr.ps as u16, remote.port());
        let o = st.open(dev)?;
        let comm =
            o.cm.sidr_request(now(), remote.ip(), sid, &pd)
                .map_err(|e| e.errno())?;
        o.comms.insert(comm, id as usize);
        st.id_mut(id)?.comm = Some(comm);
        pump(&mut st, dev);
        return Ok(());
    }
    let qpn = if idr.qp.is_null() {
        cp.map_or(0, |c| c.qp_num)
    } else {
        // SAFETY: the id's live QP.
        unsafe { (*idr.qp).qp_num }
    };
    let rr = cp.map_or(0, |c| c.responder_resources);
    let ini = cp.map_or(0, |c| c.initiator_depth);
    let retry = cp.map_or(7, |c| c.retry_count) & 7;
    let rnr = cp.map_or(7, |c| c.rnr_retry_count) & 7;
    s.starting_psn = psn;
    s.responder_resources = rr;
    s.initiator_depth = ini;
    s.retry_count = retry;
    let o = st.open(dev)?;
    let mut p = ConnectParams::rdma_cm(local, remote, idr.ps as u16, qpn, psn, o.mtu, user)
        .map_err(|e| e.errno())?;
    p.responder_resources = rr;
    p.initiator_depth = ini;
    p.retry_count = retry;
    p.rnr_retry_count = rnr;
    p.srq = qp_has_srq(idr, cp);
    let comm = o.cm.connect(now(), &p).map_err(|e| e.errno())?;
    o.comms.insert(comm, id as usize);
    st.id_mut(id)?.comm = Some(comm);
    pump(&mut st, dev);
    Ok(())
}

pub(crate) extern "C" fn rdma_connect(
    id: *mut rdma_cm_id,
    conn_param: *mut rdma_conn_param,
) -> c_int {
    ffi!({ sync_result(id, connect(id, conn_param)) })
}

/// The body of [`rdma_accept`].
fn accept(id: *mut rdma_cm_id, conn_param: *mut rdma_conn_param) -> Result<(), c_int> {
    let ibv = ibv()?;
    let mut st = state()?;
    let s = st.id_mut(id)?;
    let psn = s.starting_psn;
    if s.sidr_pending {
        return sidr_accept(&mut st, id, conn_param);
    }
    // The request stays the id's until the engine took the REP: an rdma_accept that fails
    // (private data too long, the QP refused) may be tried again, or the request rejected.
    let (Some(dev), Some(comm), Some(req)) = (s.dev, s.comm, s.req.clone()) else {
        return Err(libc::EINVAL);
    };
    let peer = s
        .remote
        .map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |r| r.ip());
    // SAFETY: live id; conn_param NULL or the caller's.
    let (idr, cp) = unsafe { (&*id, conn_param.as_ref()) };
    // Without a conn_param, librdmacm answers with what the REQ asked for.
    let rr = cp.map_or(req.initiator_depth, |c| c.responder_resources);
    let ini = cp.map_or(req.responder_resources, |c| c.initiator_depth);
    let rnr = cp.map_or(7, |c| c.rnr_retry_count) & 7;
    // SAFETY: as above.
    let user = unsafe { private_of(conn_param) };
    if user.len() > REP_PRIVATE {
        return Err(libc::EINVAL);
    }
    let ack_timeout = s.ack_timeout;
    let port_mtu = st.open(dev)?.path_mtu();
    let qpn = if idr.qp.is_null() {
        cp.map_or(0, |c| c.qp_num)
    } else {
        let mut c = RcConnect::rdma_cm_passive(&req, peer, port_mtu, rr, ini, psn);
        c.timeout = ack_timeout.unwrap_or(c.timeout);
        qp_rtr(ibv, idr.qp, &c)?;
        qp_rts(ibv, idr.qp, &c)?;
        // SAFETY: the id's live QP.
        unsafe { (*idr.qp).qp_num }
    };
    let p = AcceptParams {
        local_qpn: qpn,
        starting_psn: psn,
        responder_resources: rr,
        initiator_depth: ini,
        target_ack_delay: softroce::cm::LOCAL_CA_ACK_DELAY,
        rnr_retry_count: rnr,
        srq: qp_has_srq(idr, cp),
        private_data: user.to_vec(),
    };
    let o = st.open(dev)?;
    o.cm.accept(now(), comm, &p).map_err(|e| e.errno())?;
    st.id_mut(id)?.req = None;
    pump(&mut st, dev);
    Ok(())
}

pub(crate) extern "C" fn rdma_accept(
    id: *mut rdma_cm_id,
    conn_param: *mut rdma_conn_param,
) -> c_int {
    ffi!({
        let r = accept(id, conn_param);
        // SAFETY: NULL or a live id (checked by the call).
        if !id.is_null() && unsafe { (*id).qp_type } == IBV_QPT_UD {
            return r.map(|()| 0); // a SIDR_REP: nothing to wait for
        }
        sync_result(id, r)
    })
}

/// rdma_accept of a SIDR request: a SIDR_REP with the id's QP (or conn_param's qp_num),
/// rdma_cm's Q_Key and the private data; the request is then answered and gone (the
/// passive side of a UD id gets no ESTABLISHED, as with the kernel). On an error the
/// request stays the id's.
fn sidr_accept(
    st: &mut State,
    id: *mut rdma_cm_id,
    conn_param: *mut rdma_conn_param,
) -> Result<(), c_int> {
    let s = st.id_mut(id)?;
    let (Some(dev), Some(comm)) = (s.dev, s.comm) else {
        return Err(libc::EINVAL);
    };
    // SAFETY: live id; conn_param NULL or the caller's, its private data its length.
    let (idr, cp, user) = unsafe { (&*id, conn_param.as_ref(), private_of(conn_param)) };
    if user.len() > SIDR_REP_PRIVATE {
        return Err(libc::EINVAL);
    }
    let qpn = if idr.qp.is_null() {
        cp.map_or(0, |c| c.qp_num)
    } else {
        // SAFETY: the id's live QP.
        unsafe { (*idr.qp).qp_num }
    };
    st.open(dev)?;
    let how = End::SidrRep {
        status: SidrStatus::SUCCESS,
        qpn,
        qkey: RDMA_UDP_QKEY,
        private_data: user,
    };
    let r = end_connection(st, dev, id as usize, comm, now(), how);
    if r.is_ok() {
        st.id_mut(id)?.sidr_pending = false;
    }
    pump(st, dev);
    r
}

pub(crate) extern "C" fn rdma_reject(
    id: *mut rdma_cm_id,
    private_data: *const c_void,
    private_data_len: u8,
) -> c_int {
    ffi!({
        let mut st = state()?;
        let s = st.id_mut(id)?;
        let (Some(dev), Some(comm)) = (s.dev, s.comm) else {
            return Err(libc::EINVAL);
        };
        let sidr = s.sidr_pending;
        let data = if private_data.is_null() {
            &[][..]
        } else {
            // SAFETY: the caller passes private_data_len readable bytes.
            unsafe { std::slice::from_raw_parts(private_data.cast(), private_data_len.into()) }
        };
        st.open(dev)?;
        let how = if sidr {
            End::SidrRep {
                status: SidrStatus::REJECT,
                qpn: 0,
                qkey: 0,
                private_data: &data[..data.len().min(SIDR_REP_PRIVATE)],
            }
        } else {
            End::Reject(data)
        };
        // A connection the engine cannot refuse (ESTABLISHED, say) stays the id's: EINVAL.
        end_connection(&mut st, dev, id as usize, comm, now(), how)?;
        let s = st.id_mut(id)?;
        s.req = None;
        s.sidr_pending = false;
        pump(&mut st, dev);
        Ok(0)
    })
}

pub(crate) extern "C" fn rdma_reject_ece(
    id: *mut rdma_cm_id,
    private_data: *const c_void,
    private_data_len: u8,
) -> c_int {
    rdma_reject(id, private_data, private_data_len)
}

pub(crate) extern "C" fn rdma_establish(id: *mut rdma_cm_id) -> c_int {
    ffi!({
        let mut st = state()?;
        let s = st.id_mut(id)?;
        let (Some(dev), Some(comm)) = (s.dev, s.comm) else {
            return Err(libc::EINVAL);
        };
        s.user_established = true;
        let o = st.open(dev)?;
        if let Err(e) = o.cm.establish(now(), comm) {
            st.id_mut(id)?.user_established = false;
            return Err(e.errno());
        }
        pump(&mut st, dev);
        Ok(0)
    })
}

/// The body of [`rdma_disconnect`].
fn disconnect(id: *mut rdma_cm_id) -> Result<(), c_int> {
    let ibv = ibv()?;
    let mut st = state()?;
    let s = st.id_mut(id)?;
    let (Some(dev), Some(comm)) = (s.dev, s.comm) else {
        return Err(libc::EINVAL);
    };
    // SAFETY: live id.
    qp_err(ibv, unsafe { (*id).qp });
    let o = st.open(dev)?;
    let r = o.cm.disconnect(now(), comm).map_err(|e| e.errno());
    super::driver::stand_in_sync(o, comm);
    pump(&mut st, dev);
    r
}

pub(crate) extern "C" fn rdma_disconnect(id: *mut rdma_cm_id) -> c_int {
    ffi!({ sync_result(id, disconnect(id)) })
}

/// rdma_get_request: a synchronous listener's next CONNECT_REQUEST, with the QP its
/// rdma_create_ep attributes ask for; the event stays in the new id's `event` (acked by its
/// rdma_accept). Errors: EINVAL for an asynchronous listener or another event (kept in
/// the listener's `event`), ECONNREFUSED for REJECTED, an event's status.
pub(crate) extern "C" fn rdma_get_request(
    listen: *mut rdma_cm_id,
    id: *mut *mut rdma_cm_id,
) -> c_int {
    ffi!({
        if id.is_null() {
            return Err(libc::EINVAL);
        }
        let attr = {
            let mut st = state()?;
            match st.id_mut(listen) {
                Ok(s) if s.sync => s.qp_init_attr.as_deref().map(|a| {
                    // SAFETY: a plain C struct we copied in rdma_create_ep.
                    unsafe { std::ptr::read(a) }
                }),
                _ => return Err(libc::EINVAL),
            }
        };
        // SAFETY: a live synchronous listener.
        let prev = unsafe { std::mem::replace(&mut (*listen).event, std::ptr::null_mut()) };
        if !prev.is_null() {
            rdma_ack_cm_event(prev);
        }
        let mut ev: *mut rdma_cm_event = std::ptr::null_mut();
        // SAFETY: the listener's own channel.
        if rdma_get_cm_event(unsafe { (*listen).channel }, &mut ev) != 0 {
            return Ok(-1);
        }
        // SAFETY: the event just taken.
        let (kind, status, new) = unsafe { ((*ev).event, (*ev).status, (*ev).id) };
        let err = if kind == event::REJECTED {
            libc::ECONNREFUSED
        } else if status != 0 {
            status.abs()
        } else if kind != event::CONNECT_REQUEST {
            libc::EINVAL
        } else {
            0
        };
        if err == 0
            && let Some(mut a) = attr
            // SAFETY: a live listener.
            && rdma_create_qp(new, unsafe { (*listen).pd }, &mut a) != 0
        {
            // SAFETY: a live listener keeps the event.
            unsafe { (*listen).event = ev };
            return Ok(-1);
        }
        if err != 0 {
            // SAFETY: as above.
            unsafe { (*listen).event = ev };
            return Err(err);
        }
        // SAFETY: the new id (live: its event is out) and the caller's out pointer.
        unsafe {
            (*new).event = ev;
            *id = new;
        }
        Ok(0)
    })
}
