//! An id's life and addresses: `rdma_create_id` / `rdma_destroy_id` (with the connection
//! the id still has, and the linger of a listener's service ID), `rdma_bind_addr`,
//! `rdma_resolve_addr` / `rdma_resolve_route` (a local lookup: the device with that address,
//! the port's MTU), `rdma_create_ep` / `rdma_destroy_ep`, `rdma_migrate_id`,
//! `rdma_notify`, the ports of an id, and `rdma_get_devices`.

use super::addr::{set_route, sockaddr_of, write_sockaddr};
use super::driver::{End, end_connection, pump};
use super::events::{
    drop_queued, is_sync, move_queued, new_channel, new_event, post, rdma_ack_cm_event,
    rdma_destroy_event_channel, sync_result,
};
use super::qp::{rdma_create_qp, rdma_destroy_qp, rdma_destroy_srq};
use super::requests::listener_for;
use super::state::{IdState, LISTEN_LINGER, State, errno_or, free_id, new_id, now, state};
use crate::abi::*;
use crate::ibv::ibv;
use crate::{ffi, neg_errno};
use core::ffi::{c_int, c_void};
use softroce::wire::cm::gid_of_ip;
use std::net::SocketAddr;

pub(crate) extern "C" fn rdma_create_id(
    channel: *mut rdma_event_channel,
    id: *mut *mut rdma_cm_id,
    context: *mut c_void,
    ps: c_int,
) -> c_int {
    ffi!({
        if id.is_null() {
            return Err(libc::EINVAL);
        }
        if ![RDMA_PS_TCP, RDMA_PS_UDP, RDMA_PS_IPOIB, RDMA_PS_IB].contains(&ps) {
            return Err(libc::EINVAL);
        }
        let mut st = state()?;
        // Without a channel the id is synchronous, with a channel of its own.
        let sync = channel.is_null();
        let channel = if sync {
            match new_channel() {
                Some(c) => c,
                None => return Err(errno_or(libc::EMFILE)),
            }
        } else {
            channel
        };
        let new = new_id(channel, context, ps);
        st.ids.insert(
            new as usize,
            IdState {
                sync,
                ..Default::default()
            },
        );
        // SAFETY: the caller passes a writable pointer.
        unsafe { *id = new };
        Ok(0)
    })
}

pub(crate) extern "C" fn rdma_destroy_id(id: *mut rdma_cm_id) -> c_int {
    ffi!({
        // A synchronous id's last event goes first (librdmacm acks `id->event`).
        if !id.is_null() && is_sync(id) {
            // SAFETY: a live id (is_sync checked).
            let ev = unsafe { std::mem::replace(&mut (*id).event, std::ptr::null_mut()) };
            if !ev.is_null() {
                rdma_ack_cm_event(ev);
            }
        }
        let mut st = state()?;
        destroy(&mut st, id)?;
        Ok(0)
    })
}

/// `rdma_destroy_id`'s work under the state's lock: the id is marked destroyed, its listen
/// lingers, its connection ends ([`End::Destroyed`]), the requests it was handed as a
/// listener and the application never took go with it ([`drop_requests`]), its queued
/// events are dropped (a synchronous id's channel destroyed), and it is freed now or at its
/// last ack. Errors: EINVAL for an id that is not live.
fn destroy(st: &mut State, id: *mut rdma_cm_id) -> Result<(), c_int> {
    let Some(s) = st.ids.get_mut(&(id as usize)).filter(|s| !s.destroyed) else {
        return Err(libc::EINVAL);
    };
    s.destroyed = true;
    let was_listening = std::mem::take(&mut s.listening);
    s.qp_init_attr = None;
    if was_listening {
        // SAFETY: a live id.
        let ps = unsafe { (*id).ps };
        linger(st, id, ps);
    }
    let Some(s) = st.ids.get_mut(&(id as usize)) else {
        return Err(libc::EINVAL);
    };
    let (dev, comm, out, sync) = (s.dev, s.comm.take(), s.events_out, s.sync);
    s.req = None;
    s.sidr_pending = false;
    if let (Some(d), Some(c)) = (dev, comm) {
        // The connection ends as its state says (REJ, SIDR_REP REJECT, DREQ or DREP:
        // see `End::Destroyed`).
        let _ = end_connection(st, d, id as usize, c, now(), End::Destroyed);
        pump(st, d);
    }
    if was_listening {
        drop_requests(st, id);
    }
    // Events queued for it and not yet taken go with it.
    // SAFETY: `id` is live until freed below.
    let ch = unsafe { (*id).channel };
    drop_queued(ch, |e| e.ev.id == id);
    if sync {
        // SAFETY: live id; the channel is its own, now without events.
        unsafe { (*id).channel = std::ptr::null_mut() };
        rdma_destroy_event_channel(ch);
    }
    if out == 0 {
        st.ids.remove(&(id as usize));
        free_id(id);
    }
    // Else freed by the last rdma_ack_cm_event.
    Ok(())
}

/// The CONNECT_REQUESTs listener `listener` was handed that wait on its channel, not taken
/// by the application: the events go, and their new ids are destroyed ([`destroy`]: the
/// request refused, REJ or SIDR_REP(reject)), as the kernel's `ucma_cleanup_ctx_events`
/// destroys the new ids of a destroyed listener's unread requests. Before, the events
/// stayed queued with `listen_id` naming the freed listener (and with a synchronous
/// listener, its channel freed them and their ids leaked); found by the rdmacm_driver fuzz
/// target.
fn drop_requests(st: &mut State, listener: *mut rdma_cm_id) {
    let mut new_ids = Vec::new();
    // SAFETY: a live id (freed only after this).
    let ch = unsafe { (*listener).channel };
    drop_queued(ch, |e| {
        let mine = e.ev.event == event::CONNECT_REQUEST && e.ev.listen_id == listener;
        if mine {
            new_ids.push(e.ev.id);
        }
        mine
    });
    for new in new_ids {
        let _ = destroy(st, new);
    }
}

/// A listening id went away: the service IDs it listened on that no other id listens on
/// keep being listened on for [`LISTEN_LINGER`] (the kernel stops at once; see [`Parked`]).
fn linger(st: &mut State, id: *mut rdma_cm_id, ps: c_int) {
    let Some((sid, devs)) = st.service_scope(id, ps) else {
        return;
    };
    let until = now() + LISTEN_LINGER;
    for d in devs {
        if listener_for(st, d, sid).is_none()
            && let Some(o) = st.devs[d].open.as_mut()
        {
            o.lingering.insert(sid, until);
        }
    }
}

/// Binds `id` to `addr` (port 0: an ephemeral one); a specific address binds the device.
pub(super) fn bind(st: &mut State, id: *mut rdma_cm_id, addr: SocketAddr) -> Result<(), c_int> {
    // SAFETY: `id` is live (the caller checked it under the lock).
    let ps = unsafe { (*id).ps };
    let dev = if addr.ip().is_unspecified() {
        None
    } else {
        Some(st.dev_of_ip(addr.ip()).ok_or(libc::EADDRNOTAVAIL)?)
    };
    let port = match addr.port() {
        0 => st.ephemeral_port(ps),
        p if st.port_taken(ps, p, Some(addr.ip())) => return Err(libc::EADDRINUSE),
        p => p,
    };
    let local = SocketAddr::new(addr.ip(), port);
    let mut mtu = 3;
    if dev.is_none() {
        // The wildcard address is on every device: open them now (joining or starting
        // each one's keeper), so that rdma_bind_addr can hold the port's service on them
        // (`hold_bound_service`) and rdma_listen only registers it. A device
        // that fails to open here fails rdma_listen, which opens it again and says why.
        for d in 0..st.devs.len() {
            let _ = st.open(d);
        }
    }
    if let Some(d) = dev {
        let o = st.open(d)?;
        mtu = o.mtu;
        let (ctx, pd) = (o.ctx, o.pd);
        // SAFETY: live id.
        unsafe {
            (*id).verbs = ctx;
            (*id).pd = pd;
            (*id).port_num = 1;
        }
    }
    set_route(id, local, None, mtu);
    let s = st.id_mut(id)?;
    s.dev = dev;
    s.local = Some(local);
    Ok(())
}

pub(crate) extern "C" fn rdma_bind_addr(id: *mut rdma_cm_id, addr: *mut libc::sockaddr) -> c_int {
    ffi!({
        let a = sockaddr_of(addr)?;
        let mut st = state()?;
        if st.id_mut(id)?.local.is_some() {
            return Err(libc::EINVAL);
        }
        bind(&mut st, id, a)?;
        hold_bound_service(&mut st, id);
        Ok(0)
    })
}

/// After `rdma_bind_addr`: the service ID of the bound port is held for this process on
/// its device(s) for [`LISTEN_LINGER`](LISTEN_LINGER), as a lingering
/// service (see [`Parked`](super::state::Parked)): the device's steering brings its REQs
/// here and the engine takes them, so that a REQ that arrives before `rdma_listen` waits
/// for it instead of drawing REJ 8. qperf's server sends `rdma_get_src_port` to its client
/// between `rdma_bind_addr` and `rdma_listen`; the kernel's listen is one system call and
/// wins that race, softroce's (a request to the shared device's keeper) lost it to a fast
/// client. A hold that finds the service taken by another process is skipped:
/// `rdma_listen` reports EADDRINUSE then, as before. Nothing listens at the end of the hold:
/// the engine and the keeper let the service go and parked REQs get REJ 8
/// (`driver.rs`, `end_lingers`).
fn hold_bound_service(st: &mut State, id: *mut rdma_cm_id) {
    if st.id_mut(id).is_err() {
        return;
    }
    // SAFETY: live id (checked above under the lock).
    let ps = unsafe { (*id).ps };
    let Some((sid, devs)) = st.service_scope(id, ps) else {
        return;
    };
    let Ok(ibv) = ibv() else {
        return;
    };
    let until = now() + LISTEN_LINGER;
    for d in devs {
        if listener_for(st, d, sid).is_some() {
            continue;
        }
        let Some(o) = st.devs[d].open.as_mut() else {
            continue;
        };
        // SAFETY: the device's open context.
        if !o.lingering.contains_key(&sid) && unsafe { (ibv.cm_listen)(o.ctx, sid, 1) } != 0 {
            continue;
        }
        let _ = o.cm.listen(sid);
        o.lingering.insert(sid, until);
    }
}

/// The body of [`rdma_resolve_addr`].
fn resolve_addr(
    id: *mut rdma_cm_id,
    src_addr: *mut libc::sockaddr,
    dst_addr: *mut libc::sockaddr,
) -> Result<(), c_int> {
    let dst = sockaddr_of(dst_addr)?;
    let mut st = state()?;
    let s = st.id_mut(id)?;
    // A listening or passive id resolves nothing (kernel rdma_resolve_addr: state IDLE or
    // ADDR_BOUND, else EINVAL), so it never connects.
    if s.listening || s.listen_id != 0 {
        return Err(libc::EINVAL);
    }
    let bound = s.local;
    let bound_dev = s.dev;
    match (bound, src_addr.is_null()) {
        (None, false) => bind(&mut st, id, sockaddr_of(src_addr)?)?,
        (None, true) => {
            // Source by "routing": the device that has the destination's address
            // (a loopback connection), else the first device.
            let d = st.dev_of_ip(dst.ip()).unwrap_or(0);
            let ip = st.devs.get(d).ok_or(libc::ENODEV)?.ip;
            bind(&mut st, id, SocketAddr::new(ip, 0))?;
        }
        (Some(l), _) if bound_dev.is_none() => {
            // Bound to a port only: take the first device's address, keep the port.
            st.id_mut(id)?.local = None;
            let ip = st.devs.first().ok_or(libc::ENODEV)?.ip;
            bind(&mut st, id, SocketAddr::new(ip, l.port()))?;
        }
        (Some(_), _) => {}
    }
    let s = st.id_mut(id)?;
    s.remote = Some(dst);
    // SAFETY: live id.
    unsafe { write_sockaddr(&mut (*id).route.addr.dst_storage, dst) };
    // SAFETY: live id.
    unsafe { (*id).route.addr.ibaddr.dgid.raw = gid_of_ip(dst.ip()) };
    post(new_event(id, event::ADDR_RESOLVED, 0));
    Ok(())
}

pub(crate) extern "C" fn rdma_resolve_addr(
    id: *mut rdma_cm_id,
    src_addr: *mut libc::sockaddr,
    dst_addr: *mut libc::sockaddr,
    _timeout_ms: c_int,
) -> c_int {
    ffi!({ sync_result(id, resolve_addr(id, src_addr, dst_addr)) })
}

/// The body of [`rdma_resolve_route`].
fn resolve_route(id: *mut rdma_cm_id) -> Result<(), c_int> {
    let mut st = state()?;
    let s = st.id_mut(id)?;
    // As rdma_resolve_addr: not for a listening or passive id (kernel: state
    // ADDR_RESOLVED, else EINVAL).
    if s.listening || s.listen_id != 0 {
        return Err(libc::EINVAL);
    }
    let (Some(local), Some(remote), Some(dev)) = (s.local, s.remote, s.dev) else {
        return Err(libc::EINVAL);
    };
    let mtu = st.open(dev)?.mtu;
    set_route(id, local, Some(remote), mtu);
    st.id_mut(id)?.route_resolved = true;
    post(new_event(id, event::ROUTE_RESOLVED, 0));
    Ok(())
}

pub(crate) extern "C" fn rdma_resolve_route(id: *mut rdma_cm_id, _timeout_ms: c_int) -> c_int {
    ffi!({ sync_result(id, resolve_route(id)) })
}

/// rdma_create_ep: a synchronous id for `res` (librdmacm's). Passive (`RAI_PASSIVE`): bound
/// to the source address, `pd` and the QP attributes kept for rdma_get_request. Active:
/// address and route resolved (waiting for each), then its QP if `qp_init_attr` is given.
/// On an error the id is destroyed and errno says why.
pub(crate) extern "C" fn rdma_create_ep(
    id: *mut *mut rdma_cm_id,
    res: *mut rdma_addrinfo,
    pd: *mut ibv_pd,
    qp_init_attr: *mut ibv_qp_init_attr,
) -> c_int {
    ffi!({
        if id.is_null() || res.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: the caller's addrinfo.
        let res = unsafe { &*res };
        let mut new = std::ptr::null_mut();
        if rdma_create_id(
            std::ptr::null_mut(),
            &mut new,
            std::ptr::null_mut(),
            res.ai_port_space,
        ) != 0
        {
            return Ok(-1);
        }
        // SAFETY: the id just made.
        unsafe { (*new).qp_type = res.ai_qp_type };
        let r = if res.ai_flags & RAI_PASSIVE != 0 {
            passive_ep(new, res, pd, qp_init_attr)
        } else {
            active_ep(new, res, pd, qp_init_attr)
        };
        if r != 0 {
            let e = errno_or(libc::EINVAL);
            rdma_destroy_ep(new);
            return Err(e);
        }
        // SAFETY: the caller's out pointer.
        unsafe { *id = new };
        Ok(0)
    })
}

fn passive_ep(
    id: *mut rdma_cm_id,
    res: &rdma_addrinfo,
    pd: *mut ibv_pd,
    qp_init_attr: *mut ibv_qp_init_attr,
) -> c_int {
    if rdma_bind_addr(id, res.ai_src_addr) != 0 {
        return -1;
    }
    if !pd.is_null() {
        // SAFETY: the live id.
        unsafe { (*id).pd = pd };
    }
    // SAFETY: NULL or the caller's attributes, a plain C struct.
    if let Some(a) = unsafe { qp_init_attr.as_ref() } {
        // SAFETY: as above.
        let mut a = Box::new(unsafe { std::ptr::read(a) });
        a.qp_type = res.ai_qp_type;
        match state() {
            Ok(mut st) => match st.id_mut(id) {
                Ok(s) => s.qp_init_attr = Some(a),
                Err(e) => return neg_errno(e),
            },
            Err(e) => return neg_errno(e),
        }
    }
    0
}

fn active_ep(
    id: *mut rdma_cm_id,
    res: &rdma_addrinfo,
    pd: *mut ibv_pd,
    qp_init_attr: *mut ibv_qp_init_attr,
) -> c_int {
    if rdma_resolve_addr(id, res.ai_src_addr, res.ai_dst_addr, 2000) != 0
        || rdma_resolve_route(id, 2000) != 0
    {
        return -1;
    }
    if !qp_init_attr.is_null() {
        // SAFETY: the caller's attributes.
        unsafe { (*qp_init_attr).qp_type = res.ai_qp_type };
        return rdma_create_qp(id, pd, qp_init_attr);
    }
    0
}

/// rdma_destroy_ep: the id's QP, its SRQ (each with the CQs librdmacm made for the id), then
/// the id.
pub(crate) extern "C" fn rdma_destroy_ep(id: *mut rdma_cm_id) {
    ffi!({
        if id.is_null() {
            return;
        }
        rdma_destroy_qp(id);
        rdma_destroy_srq(id);
        rdma_destroy_id(id);
    })
}

pub(crate) extern "C" fn rdma_migrate_id(
    id: *mut rdma_cm_id,
    channel: *mut rdma_event_channel,
) -> c_int {
    ffi!({
        // librdmacm's: a NULL channel makes the id synchronous, with a channel of its own;
        // a channel makes it asynchronous (its calls no longer wait for their events). A
        // synchronous id's last event is acked and its own channel destroyed. Before, the
        // id stayed synchronous: libfabric's verbs provider (rdma_create_ep, then
        // rdma_migrate_id to its EQ's channel) had rdma_resolve_route take its own
        // ROUTE_RESOLVED event, so the EQ never saw it and never called rdma_connect.
        let mut st = state()?;
        let was_sync = st.id_mut(id)?.sync;
        let sync = channel.is_null();
        let channel = if sync {
            new_channel().ok_or_else(|| errno_or(libc::EMFILE))?
        } else {
            channel
        };
        // SAFETY: live id.
        let old = unsafe { std::mem::replace(&mut (*id).channel, channel) };
        move_queued(old, channel, id);
        st.id_mut(id)?.sync = sync;
        drop(st);
        if was_sync {
            // SAFETY: live id; its event, if any, is one we handed out.
            let ev = unsafe { std::mem::replace(&mut (*id).event, std::ptr::null_mut()) };
            if !ev.is_null() {
                rdma_ack_cm_event(ev);
            }
            if old != channel {
                rdma_destroy_event_channel(old);
            }
        }
        Ok(0)
    })
}

pub(crate) extern "C" fn rdma_notify(id: *mut rdma_cm_id, _event: c_int) -> c_int {
    ffi!({
        state()?.id_mut(id)?;
        Ok(0)
    })
}

fn port_of(id: *mut rdma_cm_id, dst: bool) -> u16 {
    if id.is_null() {
        return 0;
    }
    // SAFETY: the caller's live id; the storage holds a sockaddr_in/in6 or zeros.
    unsafe {
        let st = if dst {
            &(*id).route.addr.dst_storage
        } else {
            &(*id).route.addr.src_storage
        };
        sockaddr_of((st as *const libc::sockaddr_storage).cast()).map_or(0, |a| a.port().to_be())
    }
}

pub(crate) extern "C" fn rdma_get_src_port(id: *mut rdma_cm_id) -> u16 {
    // The port, or 0 (no error return).
    ffi!(panic = 0, { port_of(id, false) })
}

pub(crate) extern "C" fn rdma_get_dst_port(id: *mut rdma_cm_id) -> u16 {
    // The port, or 0 (no error return).
    ffi!(panic = 0, { port_of(id, true) })
}

pub(crate) extern "C" fn rdma_get_devices(num_devices: *mut c_int) -> *mut *mut ibv_context {
    ffi!({
        let mut st = state()?;
        let mut list = Vec::new();
        for i in 0..st.devs.len() {
            list.push(st.open(i)?.ctx);
        }
        if !num_devices.is_null() {
            // SAFETY: the caller's int.
            unsafe { *num_devices = list.len() as c_int };
        }
        list.push(std::ptr::null_mut());
        Ok(Box::into_raw(list.into_boxed_slice()).cast())
    })
}

pub(crate) extern "C" fn rdma_free_devices(list: *mut *mut ibv_context) {
    ffi!({
        if list.is_null() {
            return;
        }
        let mut n = 0;
        // SAFETY: a NULL-terminated boxed slice from rdma_get_devices, freed once.
        unsafe {
            while !(*list.add(n)).is_null() {
                n += 1;
            }
            drop(Box::from_raw(std::ptr::slice_from_raw_parts_mut(
                list,
                n + 1,
            )));
        }
    })
}
