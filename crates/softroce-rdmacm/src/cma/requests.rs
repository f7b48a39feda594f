//! Requests for a listener: a REQ or SIDR_REQ whose service ID an id listens on makes a
//! passive id on the device (its listener's channel, context and port space; the peer's
//! address from the cma header) and queues CONNECT_REQUEST on the listener's channel. A REQ
//! for a service ID that lingers (`LISTEN_LINGER`) is parked for the next listener; one
//! nobody listens on gets REJ 8, one whose cma header does not match REJ 28 (a SIDR_REQ:
//! SIDR_REP unsupported, and reject) (kernel `cma_ib_req_handler`, `cm_format_req_event`,
//! `cma_sidr_req_handler`).

use super::addr::{set_route, ud_ah_attr};
use super::events::{new_channel, new_event, post_on, set_private};
use super::state::{IdState, Parked, State, new_id, now};
use super::transitions::RDMA_UDP_QKEY;
use crate::abi::*;
use softroce::cm::CommId;
use softroce::cm::rdma_cm::{CMA_HDR_LEN, req_user_private_data};
use softroce::wire::cm::{
    CmaHdr, CmaHdrRepr, ReqRepr, SidrReqRepr, SidrStatus, rdma_cm_service_id,
};
use std::net::{IpAddr, SocketAddr};

/// The SIDR_REQ/SIDR_REP private data sizes (IBTA).
pub(super) const SIDR_REQ_PRIVATE: usize = 216;
pub(super) const SIDR_REP_PRIVATE: usize = 136;

/// The live id listening on `service_id` on device `dev` (or on every device), if any.
pub(super) fn listener_for(st: &State, dev: usize, service_id: u64) -> Option<usize> {
    st.ids.iter().find_map(|(&addr, s)| {
        let l = s.local?;
        // SAFETY: every key of `ids` is a live boxed rdma_cm_id.
        let ps = unsafe { (*(addr as *mut rdma_cm_id)).ps };
        (s.listening
            && !s.destroyed
            && rdma_cm_service_id(ps as u16, l.port()) == service_id
            && (s.dev.is_none() || s.dev == Some(dev)))
        .then_some(addr)
    })
}

/// A SIDR_REQ for a listening UD id: a new id on the device, and CONNECT_REQUEST on the
/// listener's channel with the request's private data after the cma header (kernel
/// `cma_sidr_req_handler`). No listener: SIDR_REP(unsupported); a cma header that does not
/// name the device's address: SIDR_REP(reject).
pub(super) fn sidr_request(
    st: &mut State,
    dev: usize,
    comm: CommId,
    peer: IpAddr,
    req: Box<SidrReqRepr>,
) {
    let Some(lid) = listener_for(st, dev, req.service_id) else {
        if let Some(o) = st.devs[dev].open.as_mut() {
            let _ =
                o.cm.sidr_reply(now(), comm, SidrStatus::UNSUPPORTED, 0, 0, &[]);
        }
        return;
    };
    let cma = CmaHdr::new_checked(&req.private_data[..])
        .map(|h| CmaHdrRepr::parse(&h))
        .ok()
        .filter(|h| h.cma_version == 0 && matches!(h.ip_version, 4 | 6));
    // A listened service ID, but an rdma_cm IP header that does not parse or names another
    // address: the kernel's rdma_cm finds no listener (`cma_ib_id_from_event`, as for a
    // REQ in connect_request), its ib_cm destroys the new id, which answers SIDR_REP
    // (reject) (`cm_destroy_id`). Before, such a SIDR_REQ made a passive id whose peer
    // address was the packet's.
    if !softroce::cm::rdma_cm::req_matches_listener(req.service_id, cma.as_ref(), st.devs[dev].ip) {
        if let Some(o) = st.devs[dev].open.as_mut() {
            let _ = o.cm.sidr_reply(now(), comm, SidrStatus::REJECT, 0, 0, &[]);
        }
        return;
    }
    let Some(id) = passive_id(st, dev, lid, comm, peer, cma, None) else {
        return;
    };
    if let Some(s) = st.ids.get_mut(&(id as usize)) {
        s.sidr_pending = true;
    }
    let mut e = new_event(id, event::CONNECT_REQUEST, 0);
    e.ev.listen_id = lid as *mut rdma_cm_id;
    set_private(&mut e, &req.private_data[CMA_HDR_LEN..SIDR_REQ_PRIVATE]);
    // SAFETY: writing the ud member.
    unsafe {
        let u = &mut e.ev.param.ud;
        u.ah_attr = ud_ah_attr(peer);
        u.qkey = RDMA_UDP_QKEY;
    }
    // SAFETY: the listener is live (listener_for checked it).
    post_on(unsafe { (*e.ev.listen_id).channel }, e);
}

/// A new passive id for connection `comm` of device `dev`, made from listening id `lid`
/// (its channel, context and port space; its local port; the peer's address from the cma
/// header, else `peer`), registered in the state. None when the device is gone.
fn passive_id(
    st: &mut State,
    dev: usize,
    lid: usize,
    comm: CommId,
    peer: IpAddr,
    cma: Option<CmaHdrRepr>,
    req: Option<Box<ReqRepr>>,
) -> Option<*mut rdma_cm_id> {
    let dev_ip = st.devs[dev].ip;
    // The PSN our REP announces, fixed now so that rdma_init_qp_attr (an external QP) and
    // rdma_accept agree.
    let starting_psn = (st.random() & 0x00ff_ffff) as u32;
    let local_port = st
        .ids
        .get(&lid)
        .and_then(|s| s.local)
        .map_or(0, |l| l.port());
    let o = st.devs[dev].open.as_ref()?;
    let (ctx, pd, mtu) = (o.ctx, o.pd, o.mtu);
    let listen = lid as *mut rdma_cm_id;
    // SAFETY: `lid` is a live id (listener_for checked).
    let (mut channel, context, ps) =
        unsafe { ((*listen).channel, (*listen).context, (*listen).ps) };
    let sync = st.ids.get(&lid).is_some_and(|s| s.sync);
    if sync {
        channel = new_channel()?;
    }
    let o = st.devs[dev].open.as_mut()?;
    let id = new_id(channel, context, ps);
    // SAFETY: just made.
    unsafe {
        (*id).verbs = ctx;
        (*id).pd = pd;
        (*id).port_num = 1;
    }
    let local = SocketAddr::new(dev_ip, local_port);
    let remote = SocketAddr::new(
        cma.and_then(|c| c.src_ip()).unwrap_or(peer),
        cma.map_or(0, |c| c.port),
    );
    let mtu = req.as_ref().map_or(mtu, |r| mtu.min(r.path_mtu));
    set_route(id, local, Some(remote), mtu);
    o.comms.insert(comm, id as usize);
    st.ids.insert(
        id as usize,
        IdState {
            dev: Some(dev),
            local: Some(local),
            remote: Some(remote),
            comm: Some(comm),
            listen_id: lid,
            req,
            sync,
            starting_psn,
            ..Default::default()
        },
    );
    Some(id)
}

/// A REQ for a listening id: a new id on the device, and CONNECT_REQUEST on the listener's
/// channel (private data after the cma header; responder resources and initiator depth as
/// the passive side sees them, kernel `cm_format_req_event`).
pub(super) fn connect_request(
    st: &mut State,
    dev: usize,
    comm: CommId,
    peer: IpAddr,
    req: Box<ReqRepr>,
    cma: Option<CmaHdrRepr>,
) {
    let Some(lid) = listener_for(st, dev, req.service_id) else {
        if let Some(o) = st.devs[dev].open.as_mut() {
            if o.lingering.contains_key(&req.service_id) {
                o.parked.push(Parked {
                    comm,
                    peer,
                    req,
                    cma,
                });
            } else {
                let _ = o.cm.reject_no_listener(now(), comm);
            }
        }
        return;
    };
    // A listened service ID, but an rdma_cm IP header that does not parse or names another
    // address: the kernel's rdma_cm finds no listener for it and its ib_cm answers REJ 28
    // (consumer defined), where a service ID nobody listens on got REJ 8 above.
    if !softroce::cm::rdma_cm::req_matches_listener(req.service_id, cma.as_ref(), st.devs[dev].ip) {
        if let Some(o) = st.devs[dev].open.as_mut() {
            let _ = o.cm.reject(now(), comm, &[]);
        }
        return;
    }
    let mut e = new_event(std::ptr::null_mut(), event::CONNECT_REQUEST, 0);
    e.ev.listen_id = lid as *mut rdma_cm_id;
    set_private(&mut e, req_user_private_data(&req));
    // SAFETY: writing the conn member.
    unsafe {
        let c = &mut e.ev.param.conn;
        c.responder_resources = req.initiator_depth;
        c.initiator_depth = req.responder_resources;
        c.flow_control = u8::from(req.end_to_end_flow_control);
        c.retry_count = req.retry_count;
        c.rnr_retry_count = req.rnr_retry_count;
        c.srq = u8::from(req.srq);
        c.qp_num = req.local_qpn;
    }
    let Some(id) = passive_id(st, dev, lid, comm, peer, cma, Some(req)) else {
        return;
    };
    e.ev.id = id;
    // SAFETY: the listener is live (listener_for checked it).
    post_on(unsafe { (*e.ev.listen_id).channel }, e);
}
