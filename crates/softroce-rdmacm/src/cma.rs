//! The rdma_cm objects (event channels, ids, events), the per-device CM driver, and the
//! `rdma_*` entry points.
//!
//! All state lives in one [`State`] behind one lock: the devices (each opened device has a
//! `CmEngine` and a driver thread), the ids (`IdState`, keyed by the `rdma_cm_id` address),
//! and the bound ports. Entry points and driver threads take the lock, call the engine, then
//! [`pump`] its events (into rdma_cm events, applying REQ/REP to the id's QP) and MADs (onto
//! QP1 through `softroce_mad_send`). The ibv_* calls made under the lock never call back.
//! Multicast joins and leaves live in [`mcast`] (no CM messages on RoCE: no SA).
//!
//! Sources: rdma-core `librdmacm/cma.c` (rdma_create_qp's default CQs and INIT, the
//! RTR/RTS sequence of `ucma_modify_qp_rtr`/`_rts`, rdma_disconnect moving the QP to ERR,
//! events and their private data), kernel `drivers/infiniband/core/cma.c` (service IDs, the
//! cma header, CONNECT_REQUEST parameters as the passive side sees them).

use crate::abi::*;
use crate::ibv::{Ibv, ibv};
use crate::{ffi, neg_errno};
use core::ffi::{c_char, c_int, c_void};
use parking_lot::{Mutex, MutexGuard};
use softroce::cm::{AcceptParams, CmConfig, CmEngine, CmEvent, CmState, CommId, ConnectParams};
use softroce::transport::{Instant, PathMtu};
use softroce::verbs::RcConnect;
use softroce::wire::cm::{
    CmaHdr, CmaHdrRepr, RepRepr, ReqRepr, SidrRepRepr, SidrReqRepr, SidrStatus, gid_of_ip,
    rdma_cm_service_id,
};
use std::collections::{HashMap, HashSet, VecDeque};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::OnceLock;

use softroce::cm::rdma_cm::{
    CMA_HDR_LEN, REJ_PRIVATE_DATA_LEN as REJ_PRIVATE, REP_PRIVATE_DATA_LEN as REP_PRIVATE,
    REQ_PRIVATE_DATA_LEN as REQ_PRIVATE, req_user_private_data,
};

mod mcast;
pub(crate) use mcast::{rdma_join_multicast, rdma_join_multicast_ex, rdma_leave_multicast};
mod qp;
pub(crate) use qp::{
    rdma_create_qp, rdma_create_qp_ex, rdma_create_srq, rdma_create_srq_ex, rdma_destroy_qp,
    rdma_destroy_srq,
};

/// The SIDR_REQ/SIDR_REP private data sizes (IBTA).
const SIDR_REQ_PRIVATE: usize = 216;
const SIDR_REP_PRIVATE: usize = 136;
/// The GID index of a device's IP address (softroce::net::discover: index 1, as rxe).
const SGID_INDEX: u8 = 1;
/// Longest a driver thread waits on QP1 between timer checks, in ms.
const DRIVER_TICK_MS: u64 = 20;
/// How long a device keeps listening on a service ID after its last listening id is
/// destroyed: a REQ that comes meanwhile waits for a new listener (see [`Parked`]).
const LISTEN_LINGER: std::time::Duration = std::time::Duration::from_secs(3);

// ---------------------------------------------------------------------------------------
// State

struct OpenDev {
    ctx: *mut ibv_context,
    pd: *mut ibv_pd,
    cm: CmEngine,
    /// Connection → the `rdma_cm_id` it belongs to.
    comms: HashMap<CommId, usize>,
    /// The path MTU of routes from this device (IB enum): the port's active MTU, capped by
    /// what rdma_cm derives from the interface's MTU (`rdma_cm_route_mtu`).
    mtu: u8,
    /// Service IDs whose last listening id went away, and until when the engine still
    /// listens on them ([`LISTEN_LINGER`]).
    lingering: HashMap<u64, Instant>,
    /// REQs that came for a lingering service ID, waiting for a listener.
    parked: Vec<Parked>,
}

/// A REQ for a service ID nobody listens on any more, held while the ID lingers.
///
/// The kernel answers a REQ that finds no listener at once with REJ 8. softroce holds it
/// for up to [`LISTEN_LINGER`] after the service's last listener went away: programs that
/// replace their listener between two connections (perftest with `-R` destroys the listener
/// of its control connection, then listens on the same port for the data connection) race
/// the peer's next REQ, a race the kernel's slower active side (asynchronous address and
/// route resolution, page pinning) practically never loses and softroce's often would. A
/// new listener takes the REQ as its CONNECT_REQUEST; at the end of the linger it gets the
/// kernel's answer, REJ 8 (spec/deviations.toml).
struct Parked {
    comm: CommId,
    peer: IpAddr,
    req: Box<ReqRepr>,
    cma: Option<CmaHdrRepr>,
}

struct Dev {
    name: String,
    ip: IpAddr,
    ibv_dev: *mut ibv_device,
    open: Option<OpenDev>,
}

#[derive(Default)]
struct IdState {
    dev: Option<usize>,
    local: Option<SocketAddr>,
    remote: Option<SocketAddr>,
    listening: bool,
    comm: Option<CommId>,
    /// The listening id a passive id came from.
    listen_id: usize,
    /// Passive: the REQ.
    req: Option<Box<ReqRepr>>,
    /// Passive UD: a SIDR_REQ not answered yet (its request is `comm`).
    sidr_pending: bool,
    /// The starting PSN this id announced in its REQ or REP: the PSN its QP receives from
    /// (kernel cm.c; see `ConnectParams::starting_psn`).
    starting_psn: u32,
    responder_resources: u8,
    initiator_depth: u8,
    retry_count: u8,
    /// Active: the REP's private data, for the ESTABLISHED event.
    rep_private: Option<Vec<u8>>,
    /// Active: rdma_establish was called (no ESTABLISHED event follows).
    user_established: bool,
    /// Active: the REP, for `rdma_init_qp_attr` of an external QP.
    rep: Option<Box<RepRepr>>,
    /// `RDMA_OPTION_ID_ACK_TIMEOUT`: the RC QP's local ACK timeout exponent at RTS, in place
    /// of the one the REQ/REP exchange gives (kernel `rdma_set_ack_timeout`).
    ack_timeout: Option<u8>,
    /// `rdma_set_local_ece`: kept and reported, never sent (softroce's CM carries no ECE).
    local_ece: Option<(u32, u32)>,
    /// Events handed out and not acked.
    events_out: usize,
    /// rdma_destroy_id ran while events were out: freed at the last ack.
    destroyed: bool,
    /// Synchronous: made without a channel, the id has one of its own (destroyed with it)
    /// and its calls wait for their events (librdmacm's `id_priv->sync`).
    sync: bool,
    /// rdma_create_ep of a passive id: the QP rdma_get_request makes for each request.
    qp_init_attr: Option<Box<ibv_qp_init_attr>>,
    /// rdma_resolve_route succeeded (the kernel's state is then past ADDR_RESOLVED).
    route_resolved: bool,
    /// The multicast groups joined and not left, newest first (librdmacm's `mc_list`).
    mcast: Vec<mcast::Membership>,
}

struct State {
    devs: Vec<Dev>,
    ids: HashMap<usize, IdState>,
    rng: u64,
    /// The last multicast membership handle handed out (0 is none).
    last_mc: u64,
    /// The process this state belongs to: a forked child starts afresh ([`state`]).
    pid: u32,
}

// SAFETY: the raw pointers are libibverbs handles (contexts, PDs) and our own boxes, used only
// under the state's lock; libibverbs objects may be used from any thread.
unsafe impl Send for State {}

/// The process's rdma_cm state, made on first use.
static STATE: OnceLock<Result<Mutex<State>, c_int>> = OnceLock::new();

/// The process's rdma_cm state, locked. In a `fork`ed child the first call replaces the
/// parent's state with a new one: the parent's open devices, ids and channels are the
/// parent's (their driver threads did not fork, and libibverbs.so.1 gives a child none of the
/// parent's devices), so the child opens the devices it uses itself. The parent's state is
/// leaked in the child, not dropped. The lock is held across `fork` (`pthread_atfork`), so a
/// child never inherits it locked by a thread that does not exist there (a driver thread
/// takes it every few milliseconds). Errors: those of the first `init_state`, or of the
/// child's.
fn state() -> Result<MutexGuard<'static, State>, c_int> {
    let s = STATE.get_or_init(|| {
        // SAFETY: registers plain functions with no arguments. A failure (ENOMEM) leaves a
        // child to inherit the lock as it is.
        unsafe {
            libc::pthread_atfork(
                Some(lock_for_fork),
                Some(unlock_after_fork),
                Some(unlock_after_fork),
            )
        };
        init_state().map(Mutex::new)
    });
    let m = s.as_ref().map_err(|e| *e)?;
    let mut st = m.lock();
    if st.pid != std::process::id() {
        let fresh = init_state()?;
        std::mem::forget(std::mem::replace(&mut *st, fresh));
    }
    Ok(st)
}

std::thread_local! {
    /// The state's lock, held by the forking thread from [`lock_for_fork`] to
    /// [`unlock_after_fork`] (in the child, that thread's copy).
    static FORK_LOCK: std::cell::RefCell<Option<MutexGuard<'static, State>>> =
        const { std::cell::RefCell::new(None) };
}

/// `pthread_atfork` prepare handler: takes the state's lock, so that no other thread holds
/// it at the fork.
extern "C" fn lock_for_fork() {
    if let Some(Ok(m)) = STATE.get() {
        let g = m.lock();
        let _ = FORK_LOCK.try_with(|l| {
            if let Ok(mut held) = l.try_borrow_mut() {
                *held = Some(g);
            }
        });
    }
}

/// `pthread_atfork` parent and child handler: lets go of the lock [`lock_for_fork`] took.
extern "C" fn unlock_after_fork() {
    let _ = FORK_LOCK.try_with(|l| {
        if let Ok(mut held) = l.try_borrow_mut() {
            drop(held.take());
        }
    });
}

fn init_state() -> Result<State, c_int> {
    let ibv = ibv()?;
    let addrs = softroce::net::discover::devices_from_env().map_err(|e| {
        eprintln!("softroce librdmacm: {e}");
        e.errno()
    })?;
    let mut devs = Vec::new();
    let mut n = 0;
    // SAFETY: libibverbs' device list: `n` device pointers, NULL-terminated, valid for the
    // life of the process (softroce's devices are never freed); the list itself is freed.
    unsafe {
        let list = (ibv.get_device_list)(&mut n);
        if list.is_null() {
            return Err(libc::ENODEV);
        }
        for i in 0..n.max(0) as usize {
            let d = *list.add(i);
            let name = std::ffi::CStr::from_ptr((ibv.get_device_name)(d))
                .to_string_lossy()
                .into_owned();
            if let Some(a) = addrs.iter().find(|a| a.name == name) {
                devs.push(Dev {
                    name,
                    ip: a.ip,
                    ibv_dev: d,
                    open: None,
                });
            }
        }
        (ibv.free_device_list)(list);
    }
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64)
        ^ (u64::from(std::process::id()) << 32);
    Ok(State {
        devs,
        ids: HashMap::new(),
        rng: seed | 1,
        last_mc: 0,
        pid: std::process::id(),
    })
}

impl State {
    fn random(&mut self) -> u64 {
        // xorshift64*
        let mut x = self.rng;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn dev_of_ip(&self, ip: IpAddr) -> Option<usize> {
        self.devs.iter().position(|d| d.ip == ip)
    }

    /// Opens device `i` (context, PD, CM engine, QP1 port, driver thread) if not yet open.
    fn open(&mut self, i: usize) -> Result<&mut OpenDev, c_int> {
        if self.devs[i].open.is_none() {
            let ibv = ibv()?;
            let d = &self.devs[i];
            // SAFETY: `ibv_dev` is from libibverbs' list; the calls follow their prototypes.
            let (ctx, pd, guid, mtu) = unsafe {
                let ctx = (ibv.open_device)(d.ibv_dev);
                if ctx.is_null() {
                    return Err(errno_or(libc::ENODEV));
                }
                let pd = (ibv.alloc_pd)(ctx);
                if pd.is_null() {
                    return Err(errno_or(libc::ENOMEM));
                }
                let mut pa: ibv_port_attr = std::mem::zeroed();
                let active = if (ibv.query_port)(ctx, 1, &mut pa) == 0 {
                    pa.active_mtu as u8
                } else {
                    3
                };
                // rdma_cm's route MTU comes from the MTU of the interface the route leaves by
                // (cma.c `cma_resolve_iboe_route`: 1024 on a 1500-byte link), capped by the
                // port's: a REQ asking for 4096 there gets packets the link drops.
                let link = softroce::net::link_mtu(d.ip)
                    .and_then(softroce::cm::rdma_cm_route_mtu)
                    .unwrap_or(active);
                let mtu = active.min(link);
                // Makes QP1's port (its receives posted) before anyone can send us a REQ.
                let mut mad = [0u8; 256];
                let mut src: libc::sockaddr_storage = std::mem::zeroed();
                let _ = (ibv.mad_recv)(ctx, mad.as_mut_ptr().cast(), &mut src, 0);
                (ctx, pd, u64::from_be((ibv.get_device_guid)(d.ibv_dev)), mtu)
            };
            let seed = self.random();
            let cm = CmEngine::new(CmConfig::new(self.devs[i].ip, guid, seed));
            self.devs[i].open = Some(OpenDev {
                ctx,
                pd,
                cm,
                comms: HashMap::new(),
                mtu,
                lingering: HashMap::new(),
                parked: Vec::new(),
            });
            let ctx = ctx as usize;
            let name = format!("softroce-cm-{}", self.devs[i].name);
            std::thread::Builder::new()
                .name(name)
                .spawn(move || driver(i, ctx))
                .map_err(|_| libc::EAGAIN)?;
        }
        self.devs[i].open.as_mut().ok_or(libc::ENODEV)
    }

    fn id_mut(&mut self, id: *mut rdma_cm_id) -> Result<&mut IdState, c_int> {
        self.ids
            .get_mut(&(id as usize))
            .filter(|s| !s.destroyed)
            .ok_or(libc::EINVAL)
    }

    /// A free port of port space `ps` (librdmacm: the kernel picks one in the local range).
    fn ephemeral_port(&mut self, ps: c_int) -> u16 {
        loop {
            let p = 32768 + (self.random() % 28232) as u16;
            if !self.port_taken(ps, p, None) {
                return p;
            }
        }
    }

    fn port_taken(&self, ps: c_int, port: u16, ip: Option<IpAddr>) -> bool {
        self.ids.iter().any(|(&addr, s)| {
            let Some(l) = s.local else { return false };
            // SAFETY: every key of `ids` is a live boxed rdma_cm_id.
            let id_ps = unsafe { (*(addr as *mut rdma_cm_id)).ps };
            !s.destroyed
                && s.listen_id == 0
                && id_ps == ps
                && l.port() == port
                && (s.listening || s.comm.is_none())
                && (ip.is_none() || l.ip().is_unspecified() || Some(l.ip()) == ip)
        })
    }
}

fn errno_or(default: c_int) -> c_int {
    match std::io::Error::last_os_error().raw_os_error() {
        Some(e) if e != 0 => e,
        _ => default,
    }
}

fn now() -> Instant {
    static EPOCH: OnceLock<std::time::Instant> = OnceLock::new();
    let e = *EPOCH.get_or_init(std::time::Instant::now);
    Instant::from_nanos(e.elapsed().as_nanos() as u64 + 1)
}

// ---------------------------------------------------------------------------------------
// Addresses

fn sockaddr_of(sa: *const libc::sockaddr) -> Result<SocketAddr, c_int> {
    if sa.is_null() {
        return Err(libc::EINVAL);
    }
    // SAFETY: the caller passes a sockaddr of the size its family says.
    unsafe {
        match c_int::from((*sa).sa_family) {
            libc::AF_INET => {
                let s = &*sa.cast::<libc::sockaddr_in>();
                Ok(SocketAddr::new(
                    IpAddr::V4(Ipv4Addr::from(u32::from_be(s.sin_addr.s_addr))),
                    u16::from_be(s.sin_port),
                ))
            }
            libc::AF_INET6 => {
                let s = &*sa.cast::<libc::sockaddr_in6>();
                Ok(SocketAddr::new(
                    IpAddr::V6(Ipv6Addr::from(s.sin6_addr.s6_addr)),
                    u16::from_be(s.sin6_port),
                ))
            }
            _ => Err(libc::EAFNOSUPPORT),
        }
    }
}

fn write_sockaddr(out: &mut libc::sockaddr_storage, a: SocketAddr) {
    // SAFETY: sockaddr_storage is plain data, large and aligned enough for both families.
    unsafe {
        *out = std::mem::zeroed();
        match a {
            SocketAddr::V4(v4) => {
                let s = &mut *(out as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in>();
                s.sin_family = libc::AF_INET as libc::sa_family_t;
                s.sin_port = v4.port().to_be();
                s.sin_addr.s_addr = u32::from(*v4.ip()).to_be();
            }
            SocketAddr::V6(v6) => {
                let s = &mut *(out as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in6>();
                s.sin6_family = libc::AF_INET6 as libc::sa_family_t;
                s.sin6_port = v6.port().to_be();
                s.sin6_addr.s6_addr = v6.ip().octets();
            }
        }
    }
}

/// Fills the id's addresses, GIDs and (with a remote) its one path record.
fn set_route(id: *mut rdma_cm_id, local: SocketAddr, remote: Option<SocketAddr>, mtu: u8) {
    // SAFETY: `id` is a live boxed rdma_cm_id (checked by the caller under the lock).
    let id = unsafe { &mut *id };
    write_sockaddr(&mut id.route.addr.src_storage, local);
    id.route.addr.ibaddr.sgid.raw = gid_of_ip(local.ip());
    id.route.addr.ibaddr.pkey = 0xffff_u16.to_be();
    if let Some(r) = remote {
        write_sockaddr(&mut id.route.addr.dst_storage, r);
        id.route.addr.ibaddr.dgid.raw = gid_of_ip(r.ip());
        let path = ibv_sa_path_rec {
            dgid: ibv_gid {
                raw: gid_of_ip(r.ip()),
            },
            sgid: ibv_gid {
                raw: gid_of_ip(local.ip()),
            },
            dlid: 0xffff,
            slid: 0xffff,
            flow_label: softroce::cm::rdma_cm_flow_label(local.port(), r.port()).to_be(),
            hop_limit: 64,
            reversible: 1,
            numb_path: 1,
            pkey: 0xffff_u16.to_be(),
            mtu_selector: 2,
            mtu,
            rate_selector: 2,
            rate: 3,
            packet_life_time_selector: 2,
            packet_life_time: softroce::cm::CMA_IBOE_PACKET_LIFETIME,
            ..Default::default()
        };
        if id.route.path_rec.is_null() {
            id.route.path_rec = Box::into_raw(Box::new(path));
        } else {
            // SAFETY: a path record we boxed earlier.
            unsafe { *id.route.path_rec = path };
        }
        id.route.num_paths = 1;
    }
}

// ---------------------------------------------------------------------------------------
// Channels and events

/// An event channel: the C struct (its fd an eventfd in semaphore mode, one count per queued
/// event), then the queue.
#[repr(C)]
struct Channel {
    ch: rdma_event_channel,
    queue: Mutex<VecDeque<usize>>,
}

/// An event handed out: the C struct, then the private data its `param` points at, inline
/// as in librdmacm's `struct cma_event`. Inline matters: programs read the private data after
/// `rdma_ack_cm_event` has freed the event (the seed's rdma_client does), which works with
/// librdmacm because free(3) clobbers only the first bytes of a block; a separate buffer
/// would be clobbered at its start, where the data is.
#[repr(C)]
struct Event {
    ev: rdma_cm_event,
    data: [u8; 256],
    /// The multicast membership a MULTICAST_JOIN is for (librdmacm's `cma_event.mc`); 0
    /// for other events.
    mc: u64,
}

fn new_event(id: *mut rdma_cm_id, kind: c_int, status: c_int) -> Box<Event> {
    Box::new(Event {
        ev: rdma_cm_event {
            id,
            listen_id: std::ptr::null_mut(),
            event: kind,
            status,
            // SAFETY: the union of plain C structs; all zeros (NULL pointers) is valid.
            param: unsafe { std::mem::zeroed() },
        },
        data: [0; 256],
        mc: 0,
    })
}

/// Sets a connection event's private data (copied into the event).
fn set_private(ev: &mut Event, data: &[u8]) {
    let n = data.len().min(ev.data.len());
    ev.data[..n].copy_from_slice(&data[..n]);
    // Writing a member of the union (the `conn` one) needs no unsafe.
    ev.ev.param.conn.private_data = if n == 0 {
        std::ptr::null()
    } else {
        ev.data.as_ptr().cast()
    };
    ev.ev.param.conn.private_data_len = n.min(255) as u8;
}

/// Queues `ev` on its id's channel.
fn post(ev: Box<Event>) {
    // SAFETY: the event's id is live (callers hold the lock and checked it) and its channel
    // outlives it (rdma_destroy_event_channel requires its ids destroyed first).
    let ch = unsafe { (*ev.ev.id).channel };
    post_on(ch, ev);
}

/// Queues `ev` on channel `ch` (a request goes to its listener's channel, which is not the
/// new id's when the listener is synchronous).
fn post_on(ch: *mut rdma_event_channel, ev: Box<Event>) {
    if ch.is_null() {
        return;
    }
    let chan = ch.cast::<Channel>();
    // SAFETY: every channel of an id is one of our boxed `Channel`s.
    let chan = unsafe { &*chan };
    chan.queue.lock().push_back(Box::into_raw(ev) as usize);
    let one: u64 = 1;
    // SAFETY: writing 8 bytes to our eventfd.
    let _ = unsafe { libc::write(chan.ch.fd, (&one as *const u64).cast(), 8) };
}

// ---------------------------------------------------------------------------------------
// QP transitions (librdmacm's ucma_init_conn_qp, ucma_modify_qp_rtr/_rts/_err)

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
fn init_attr(qp_type: c_int) -> (ibv_qp_attr, c_int) {
    let mut a = ibv_qp_attr {
        qp_state: IBV_QPS_INIT,
        pkey_index: 0,
        port_num: 1,
        ..Default::default()
    };
    let mut m = mask::STATE | mask::PKEY_INDEX | mask::PORT;
    if qp_type == IBV_QPT_UD {
        a.qkey = RDMA_UDP_QKEY;
        m |= mask::QKEY;
    } else {
        // Deviation: librdmacm grants remote READ/atomics only when responder resources
        // are negotiated; softroce grants them at INIT (the engine still bounds READs by
        // max_dest_rd_atomic).
        a.qp_access_flags =
            IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
        m |= mask::ACCESS_FLAGS;
    }
    (a, m)
}

fn qp_init(ibv: &Ibv, qp: *mut ibv_qp, qp_type: c_int) -> Result<(), c_int> {
    let (mut a, m) = init_attr(qp_type);
    modify(ibv, qp, &mut a, m)
}

/// rdma_cm's Q_Key for UDP port space ids.
const RDMA_UDP_QKEY: u32 = 0x0123_4567;

/// RTR's attributes and mask from what the engine derived from the REQ or REP
/// (`RcConnect::rdma_cm_passive` / `rdma_cm_active`).
fn rtr_attr(c: &RcConnect) -> (ibv_qp_attr, c_int) {
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
    let m = mask::STATE
        | mask::AV
        | mask::PATH_MTU
        | mask::DEST_QPN
        | mask::RQ_PSN
        | mask::MAX_DEST_RD_ATOMIC
        | mask::MIN_RNR_TIMER;
    (a, m)
}

/// RTS's attributes and mask, from the same `RcConnect` as [`rtr_attr`].
fn rts_attr(c: &RcConnect) -> (ibv_qp_attr, c_int) {
    let a = ibv_qp_attr {
        qp_state: IBV_QPS_RTS,
        sq_psn: c.sq_psn,
        timeout: c.timeout,
        retry_cnt: c.retry_cnt,
        rnr_retry: c.rnr_retry,
        max_rd_atomic: c.max_rd_atomic,
        ..Default::default()
    };
    let m = mask::STATE
        | mask::SQ_PSN
        | mask::TIMEOUT
        | mask::RETRY_CNT
        | mask::RNR_RETRY
        | mask::MAX_QP_RD_ATOMIC;
    (a, m)
}

/// RTR through `ibv_modify_qp`.
fn qp_rtr(ibv: &Ibv, qp: *mut ibv_qp, c: &RcConnect) -> Result<(), c_int> {
    let (mut a, m) = rtr_attr(c);
    modify(ibv, qp, &mut a, m)
}

/// RTS through `ibv_modify_qp`.
fn qp_rts(ibv: &Ibv, qp: *mut ibv_qp, c: &RcConnect) -> Result<(), c_int> {
    let (mut a, m) = rts_attr(c);
    modify(ibv, qp, &mut a, m)
}

/// A UD QP goes on to RTR and RTS at once (librdmacm's `ucma_init_ud_qp`: SQ PSN 0).
fn ud_qp_rts(ibv: &Ibv, qp: *mut ibv_qp) -> Result<(), c_int> {
    let mut a = ibv_qp_attr {
        qp_state: IBV_QPS_RTR,
        ..Default::default()
    };
    modify(ibv, qp, &mut a, mask::STATE)?;
    let mut a = ibv_qp_attr {
        qp_state: IBV_QPS_RTS,
        sq_psn: 0,
        ..Default::default()
    };
    modify(ibv, qp, &mut a, mask::STATE | mask::SQ_PSN)
}

fn qp_err(ibv: &Ibv, qp: *mut ibv_qp) {
    if qp.is_null() {
        return;
    }
    let mut a = ibv_qp_attr {
        qp_state: IBV_QPS_ERR,
        ..Default::default()
    };
    let _ = modify(ibv, qp, &mut a, mask::STATE);
}

// ---------------------------------------------------------------------------------------
// The CM driver

/// A device's driver thread: waits on QP1 up to the engine's next timer, feeds MADs and
/// timers to the engine, and pumps.
fn driver(dev: usize, ctx: usize) {
    let Ok(ibv) = ibv() else { return };
    let mut mad = [0u8; 256];
    loop {
        let timeout_ms = {
            let Ok(mut st) = state() else { return };
            let Some(o) = st.devs[dev].open.as_mut() else {
                return;
            };
            match o.cm.poll_timeout() {
                Some(t) => {
                    (t.as_nanos().saturating_sub(now().as_nanos()) / 1_000_000).min(DRIVER_TICK_MS)
                }
                None => DRIVER_TICK_MS,
            }
        };
        // SAFETY: zeroed sockaddr_storage is valid.
        let mut src: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        // SAFETY: `ctx` is the device's context, open for the life of the process; `mad`
        // holds 256 bytes.
        let got = unsafe {
            (ibv.mad_recv)(
                ctx as *mut ibv_context,
                mad.as_mut_ptr().cast(),
                &mut src,
                timeout_ms as c_int,
            )
        };
        if got < 0 {
            std::thread::sleep(std::time::Duration::from_millis(DRIVER_TICK_MS));
        }
        let Ok(mut st) = state() else { return };
        let t = now();
        if let Some(o) = st.devs[dev].open.as_mut() {
            if got == 1
                && let Ok(from) = sockaddr_of((&src as *const libc::sockaddr_storage).cast())
            {
                o.cm.handle_mad(t, from.ip(), &mad);
            }
            if o.cm.poll_timeout().is_some_and(|d| d <= t) {
                o.cm.handle_timeout(t);
            }
            end_lingers(o, t);
        }
        pump(&mut st, dev);
    }
}

/// Stops listening on the service IDs of `o` whose linger is over; their parked REQs get
/// REJ 8, as a REQ that finds no listener.
fn end_lingers(o: &mut OpenDev, now: Instant) {
    let over: Vec<u64> = o
        .lingering
        .iter()
        .filter(|&(_, &until)| until <= now)
        .map(|(&sid, _)| sid)
        .collect();
    for sid in over {
        o.lingering.remove(&sid);
        let _ = o.cm.unlisten(sid);
        let (gone, kept) = std::mem::take(&mut o.parked)
            .into_iter()
            .partition(|p| p.req.service_id == sid);
        o.parked = kept;
        for p in gone {
            let _ = o.cm.reject_no_listener(now, p.comm);
        }
    }
}

/// Drains device `dev`'s engine: its events into rdma_cm events, then its MADs onto QP1.
fn pump(st: &mut State, dev: usize) {
    loop {
        let Some(o) = st.devs[dev].open.as_mut() else {
            return;
        };
        let Some(ev) = o.cm.poll_event() else { break };
        on_event(st, dev, ev);
    }
    let Ok(ibv) = ibv() else { return };
    let Some(o) = st.devs[dev].open.as_mut() else {
        return;
    };
    while let Some(m) = o.cm.poll_mad() {
        // SAFETY: zeroed sockaddr_storage is valid.
        let mut dst: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        write_sockaddr(&mut dst, SocketAddr::new(m.dst, 0));
        // SAFETY: the device's live context, a sockaddr, 256 bytes.
        let _ = unsafe {
            (ibv.mad_send)(
                o.ctx,
                (&dst as *const libc::sockaddr_storage).cast(),
                m.mad.as_ptr().cast(),
                m.mad.len(),
            )
        };
    }
}

fn listener_for(st: &State, dev: usize, service_id: u64) -> Option<usize> {
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

fn on_event(st: &mut State, dev: usize, ev: CmEvent) {
    let Ok(ibv) = ibv() else { return };
    let t = now();
    let comm = ev.id();
    if let CmEvent::ConnectRequest {
        id: comm,
        peer,
        req,
        cma,
    } = ev
    {
        return connect_request(st, dev, comm, peer, req, cma);
    }
    if let CmEvent::SidrRequest {
        id: comm,
        peer,
        req,
    } = ev
    {
        return sidr_request(st, dev, comm, peer, req);
    }
    let Some(o) = st.devs[dev].open.as_mut() else {
        return;
    };
    // A parked REQ whose peer gave up (REJ) is forgotten.
    o.parked.retain(|p| p.comm != comm);
    let Some(&addr) = o.comms.get(&comm) else {
        return; // its id is gone
    };
    let id = addr as *mut rdma_cm_id;
    // SAFETY: ids in `comms` are live boxes (rdma_destroy_id removes them).
    let qp = unsafe { (*id).qp };
    let mtu = o.mtu;
    match ev {
        CmEvent::ConnectRequest { .. } | CmEvent::SidrRequest { .. } => {}
        CmEvent::ConnectResponse { rep, .. } => {
            let Some(s) = st.ids.get_mut(&addr) else {
                return;
            };
            s.rep_private = Some(rep.private_data.to_vec());
            s.rep = Some(rep.clone());
            if qp.is_null() {
                let mut e = new_event(id, event::CONNECT_RESPONSE, 0);
                set_private(&mut e, &rep.private_data[..REP_PRIVATE]);
                e.ev.param.conn.responder_resources = rep.initiator_depth;
                e.ev.param.conn.initiator_depth = rep.responder_resources;
                e.ev.param.conn.qp_num = rep.local_qpn;
                return post(e);
            }
            let peer = s
                .remote
                .map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |r| r.ip());
            let mut c = RcConnect::rdma_cm_active(
                &rep,
                peer,
                PathMtu::from_ibv(mtu).unwrap_or(PathMtu::Mtu1024),
                s.responder_resources,
                s.initiator_depth,
                s.retry_count,
                s.starting_psn,
            );
            c.timeout = s.ack_timeout.unwrap_or(c.timeout);
            let ok = qp_rtr(ibv, qp, &c).and_then(|()| qp_rts(ibv, qp, &c));
            let Some(o) = st.devs[dev].open.as_mut() else {
                return;
            };
            match ok {
                // The engine reports Established, which carries the REP's private data.
                Ok(()) => {
                    let _ = o.cm.establish(t, comm);
                }
                Err(e) => {
                    let _ = o.cm.reject(t, comm, &[]);
                    o.comms.remove(&comm);
                    if let Some(s) = st.ids.get_mut(&addr) {
                        s.comm = None;
                    }
                    post(new_event(id, event::CONNECT_ERROR, -e));
                }
            }
        }
        CmEvent::Established { .. } => {
            let Some(s) = st.ids.get_mut(&addr) else {
                return;
            };
            let p = s.rep_private.take();
            // The active side's rdma_establish (an external QP) completes the connection
            // without an event (kernel rdma_establish only sends the RTU).
            if std::mem::take(&mut s.user_established) {
                return;
            }
            let mut e = new_event(id, event::ESTABLISHED, 0);
            if let Some(p) = p {
                set_private(&mut e, &p);
            }
            post(e);
        }
        CmEvent::Rejected {
            reason,
            private_data,
            ..
        } => {
            o.comms.remove(&comm);
            if let Some(s) = st.ids.get_mut(&addr) {
                s.comm = None;
            }
            let mut e = new_event(id, event::REJECTED, c_int::from(reason.0));
            set_private(&mut e, &private_data[..REJ_PRIVATE]);
            post(e);
        }
        CmEvent::Unreachable { .. } => {
            o.comms.remove(&comm);
            if let Some(s) = st.ids.get_mut(&addr) {
                s.comm = None;
            }
            post(new_event(id, event::UNREACHABLE, -libc::ETIMEDOUT));
        }
        CmEvent::Disconnected { .. } => post(new_event(id, event::DISCONNECTED, 0)),
        CmEvent::TimewaitExit { .. } => {
            o.comms.remove(&comm);
            if let Some(s) = st.ids.get_mut(&addr) {
                s.comm = None;
            }
            post(new_event(id, event::TIMEWAIT_EXIT, 0));
        }
        CmEvent::SidrResponse { rep, .. } => {
            o.comms.remove(&comm);
            let Some(s) = st.ids.get_mut(&addr) else {
                return;
            };
            s.comm = None;
            let peer = s
                .remote
                .map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |r| r.ip());
            post(sidr_response(id, peer, &rep));
        }
    }
}

/// The answer to our SIDR_REQ as rdma_cm reports it (kernel `cma_sidr_rep_handler`):
/// ESTABLISHED with the peer's QPN, Q_Key, the address handle attributes of the route and
/// the SIDR_REP's private data; UNREACHABLE when the peer refused (status: the SIDR status)
/// or answered with another Q_Key than rdma_cm's (-EINVAL).
fn sidr_response(id: *mut rdma_cm_id, peer: IpAddr, rep: &SidrRepRepr) -> Box<Event> {
    if rep.status != SidrStatus::SUCCESS {
        return new_event(id, event::UNREACHABLE, c_int::from(rep.status.0));
    }
    if rep.qkey != RDMA_UDP_QKEY {
        return new_event(id, event::UNREACHABLE, -libc::EINVAL);
    }
    let mut e = new_event(id, event::ESTABLISHED, 0);
    set_private(&mut e, &rep.private_data[..SIDR_REP_PRIVATE]);
    // SAFETY: writing the ud member (its private data fields were just set, at the same
    // offsets as conn's).
    unsafe {
        let u = &mut e.ev.param.ud;
        u.qp_num = rep.qpn;
        u.qkey = rep.qkey;
        u.ah_attr = ud_ah_attr(peer);
    }
    e
}

/// The address handle attributes of the route to `peer` (RoCE: a GRH to its GID).
fn ud_ah_attr(peer: IpAddr) -> ibv_ah_attr {
    let mut a = ibv_ah_attr {
        is_global: 1,
        port_num: 1,
        ..Default::default()
    };
    a.grh.dgid.raw = gid_of_ip(peer);
    a.grh.sgid_index = SGID_INDEX;
    a.grh.hop_limit = 64;
    a
}

/// A SIDR_REQ for a listening UD id: a new id on the device, and CONNECT_REQUEST on the
/// listener's channel with the request's private data after the cma header (kernel
/// `cma_sidr_req_handler`). No listener: SIDR_REP(unsupported).
fn sidr_request(st: &mut State, dev: usize, comm: CommId, peer: IpAddr, req: Box<SidrReqRepr>) {
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
fn connect_request(
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

// ---------------------------------------------------------------------------------------
// Entry points

fn new_id(channel: *mut rdma_event_channel, context: *mut c_void, ps: c_int) -> *mut rdma_cm_id {
    // SAFETY: rdma_cm_id is plain C data; all zeros (NULL pointers) is valid.
    let mut id: Box<rdma_cm_id> = Box::new(unsafe { std::mem::zeroed() });
    id.channel = channel;
    id.context = context;
    id.ps = ps;
    id.qp_type = if ps == RDMA_PS_UDP || ps == RDMA_PS_IPOIB {
        IBV_QPT_UD
    } else {
        IBV_QPT_RC
    };
    Box::into_raw(id)
}

/// Frees a boxed id and its path record.
fn free_id(id: *mut rdma_cm_id) {
    // SAFETY: `id` came from new_id and is freed once (its state was just removed).
    unsafe {
        let b = Box::from_raw(id);
        if !b.route.path_rec.is_null() {
            drop(Box::from_raw(b.route.path_rec));
        }
    }
}

/// The channels made and not destroyed yet, by address. A program may hand a channel back
/// after destroying it (perftest's `-R` client does, when its connection is refused: its
/// retry destroys the channel, then destroys it again); that call is refused with EBADF,
/// what librdmacm's calls on the channel's closed fd give, instead of reading freed memory.
fn live_channels() -> &'static Mutex<HashSet<usize>> {
    static LIVE: OnceLock<Mutex<HashSet<usize>>> = OnceLock::new();
    LIVE.get_or_init(Default::default)
}

/// A new channel: an eventfd in semaphore mode and an empty queue (None: errno is set).
fn new_channel() -> Option<*mut rdma_event_channel> {
    // SAFETY: plain eventfd creation.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_SEMAPHORE) };
    if fd < 0 {
        return None;
    }
    let ch = Box::new(Channel {
        ch: rdma_event_channel { fd },
        queue: Mutex::new(VecDeque::new()),
    });
    let ch = Box::into_raw(ch);
    live_channels().lock().insert(ch as usize);
    Some(ch.cast())
}

pub(crate) extern "C" fn rdma_create_event_channel() -> *mut rdma_event_channel {
    ffi!(std::ptr::null_mut(), {
        if let Err(e) = state() {
            crate::set_errno(e);
            return std::ptr::null_mut();
        }
        new_channel().unwrap_or(std::ptr::null_mut())
    })
}

pub(crate) extern "C" fn rdma_destroy_event_channel(channel: *mut rdma_event_channel) {
    ffi!((), {
        if channel.is_null() || !live_channels().lock().remove(&(channel as usize)) {
            crate::set_errno(libc::EBADF);
            return;
        }
        // SAFETY: a channel from rdma_create_event_channel, destroyed once (it was live).
        let ch = unsafe { Box::from_raw(channel.cast::<Channel>()) };
        for e in ch.queue.lock().drain(..) {
            // SAFETY: queued events are boxes nobody was handed.
            drop(unsafe { Box::from_raw(e as *mut Event) });
        }
        // SAFETY: our eventfd.
        unsafe { libc::close(ch.ch.fd) };
    })
}

pub(crate) extern "C" fn rdma_create_id(
    channel: *mut rdma_event_channel,
    id: *mut *mut rdma_cm_id,
    context: *mut c_void,
    ps: c_int,
) -> c_int {
    ffi!(-1, {
        if id.is_null() {
            return neg_errno(libc::EINVAL);
        }
        if ![RDMA_PS_TCP, RDMA_PS_UDP, RDMA_PS_IPOIB, RDMA_PS_IB].contains(&ps) {
            return neg_errno(libc::EINVAL);
        }
        let mut st = match state() {
            Ok(s) => s,
            Err(e) => return neg_errno(e),
        };
        // Without a channel the id is synchronous, with a channel of its own.
        let sync = channel.is_null();
        let channel = if sync {
            match new_channel() {
                Some(c) => c,
                None => return neg_errno(errno_or(libc::EMFILE)),
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
        0
    })
}

pub(crate) extern "C" fn rdma_destroy_id(id: *mut rdma_cm_id) -> c_int {
    ffi!(-1, {
        // A synchronous id's last event goes first (librdmacm acks `id->event`).
        if !id.is_null() && is_sync(id) {
            // SAFETY: a live id (is_sync checked).
            let ev = unsafe { std::mem::replace(&mut (*id).event, std::ptr::null_mut()) };
            if !ev.is_null() {
                rdma_ack_cm_event(ev);
            }
        }
        let mut st = match state() {
            Ok(s) => s,
            Err(e) => return neg_errno(e),
        };
        let Some(s) = st.ids.get_mut(&(id as usize)).filter(|s| !s.destroyed) else {
            return neg_errno(libc::EINVAL);
        };
        s.destroyed = true;
        let was_listening = std::mem::take(&mut s.listening);
        s.qp_init_attr = None;
        if was_listening {
            // SAFETY: a live id.
            let ps = unsafe { (*id).ps };
            linger(&mut st, id, ps);
        }
        let Some(s) = st.ids.get_mut(&(id as usize)) else {
            return neg_errno(libc::EINVAL);
        };
        let (dev, comm, out, sync) = (s.dev, s.comm.take(), s.events_out, s.sync);
        let unanswered = s.req.take().is_some();
        let sidr_unanswered = std::mem::take(&mut s.sidr_pending);
        if let (Some(d), Some(c)) = (dev, comm)
            && let Some(o) = st.devs[d].open.as_mut()
        {
            o.comms.remove(&c);
            // A request never answered: reject it (rdma-core's kernel does the same).
            if unanswered {
                let _ = o.cm.reject(now(), c, &[]);
            }
            if sidr_unanswered {
                let _ = o.cm.sidr_reply(now(), c, SidrStatus::REJECT, 0, 0, &[]);
            }
            // A connection the application did not disconnect is disconnected now, as the
            // kernel's cm_destroy_id does: DREQ when established, the DREP a received DREQ
            // waits for (perftest's server destroys its ids without rdma_disconnect; without
            // the DREP rxe retries its DREQ and rejects the next REQ from the same QPN as
            // stale, REJ 10).
            let state = o.cm.connections().find(|(id, _)| *id == c).map(|(_, s)| s);
            if matches!(state, Some(CmState::Established | CmState::DreqRcvd)) {
                let _ = o.cm.disconnect(now(), c);
            }
            pump(&mut st, d);
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
        0
    })
}

/// A listening id went away: the service IDs it listened on that no other id listens on
/// keep being listened on for [`LISTEN_LINGER`] (the kernel stops at once; see [`Parked`]).
fn linger(st: &mut State, id: *mut rdma_cm_id, ps: c_int) {
    let Some(s) = st.ids.get(&(id as usize)) else {
        return;
    };
    let sid = rdma_cm_service_id(ps as u16, s.local.map_or(0, |l| l.port()));
    let devs: Vec<usize> = match s.dev {
        Some(d) => vec![d],
        None => (0..st.devs.len()).collect(),
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

/// Frees the events queued on channel `ch` (NULL: none) that `pred` picks, with their
/// counts on the channel's eventfd.
fn drop_queued(ch: *mut rdma_event_channel, mut pred: impl FnMut(&Event) -> bool) {
    if ch.is_null() {
        return;
    }
    // SAFETY: every channel of an id is one of our boxed `Channel`s.
    let chan = unsafe { &*ch.cast::<Channel>() };
    let mut q = chan.queue.lock();
    let before = q.len();
    q.retain(|&e| {
        // SAFETY: queued events are live boxes nobody was handed.
        let picked = pred(unsafe { &*(e as *const Event) });
        if picked {
            // SAFETY: removed from the queue, so freed once.
            drop(unsafe { Box::from_raw(e as *mut Event) });
        }
        !picked
    });
    for _ in q.len()..before {
        take_count(chan.ch.fd);
    }
}

/// Takes one count from a channel's eventfd without blocking.
fn take_count(fd: c_int) {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let mut v = 0u64;
    // SAFETY: poll on one pollfd, then an 8-byte read from our eventfd, which is ready.
    unsafe {
        if libc::poll(&mut p, 1, 0) == 1 {
            let _ = libc::read(fd, (&mut v as *mut u64).cast(), 8);
        }
    }
}

/// Binds `id` to `addr` (port 0: an ephemeral one); a specific address binds the device.
fn bind(st: &mut State, id: *mut rdma_cm_id, addr: SocketAddr) -> Result<(), c_int> {
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
    ffi!(-1, {
        let r = (|| {
            let a = sockaddr_of(addr)?;
            let mut st = state()?;
            if st.id_mut(id)?.local.is_some() {
                return Err(libc::EINVAL);
            }
            bind(&mut st, id, a)
        })();
        result(r)
    })
}

fn result(r: Result<(), c_int>) -> c_int {
    match r {
        Ok(()) => 0,
        Err(e) => neg_errno(e),
    }
}

/// Whether `id` is a live synchronous id.
fn is_sync(id: *mut rdma_cm_id) -> bool {
    state().is_ok_and(|mut st| st.id_mut(id).is_ok_and(|s| s.sync))
}

/// An entry point's return: on success, a synchronous id then waits for its event.
fn sync_result(id: *mut rdma_cm_id, r: Result<(), c_int>) -> c_int {
    match r {
        Ok(()) if is_sync(id) => complete(id),
        r => result(r),
    }
}

/// librdmacm's `ucma_complete`: acks the id's last event, waits on its own channel for the
/// next one and keeps it in `id->event`; an event with a status is the call's error
/// (ECONNREFUSED for REJECTED). Called without the state lock.
fn complete(id: *mut rdma_cm_id) -> c_int {
    // SAFETY: a live synchronous id; its `event` is one we handed out (or NULL).
    let prev = unsafe { std::mem::replace(&mut (*id).event, std::ptr::null_mut()) };
    if !prev.is_null() {
        rdma_ack_cm_event(prev);
    }
    let mut ev = std::ptr::null_mut();
    // SAFETY: the id's own channel.
    if rdma_get_cm_event(unsafe { (*id).channel }, &mut ev) != 0 {
        return -1;
    }
    // SAFETY: live id; `ev` the event just taken.
    let (kind, status) = unsafe {
        (*id).event = ev;
        ((*ev).event, (*ev).status)
    };
    match status {
        0 => 0,
        _ if kind == event::REJECTED => neg_errno(libc::ECONNREFUSED),
        s => neg_errno(s.abs()),
    }
}

pub(crate) extern "C" fn rdma_resolve_addr(
    id: *mut rdma_cm_id,
    src_addr: *mut libc::sockaddr,
    dst_addr: *mut libc::sockaddr,
    _timeout_ms: c_int,
) -> c_int {
    ffi!(-1, {
        let r = (|| {
            let dst = sockaddr_of(dst_addr)?;
            let mut st = state()?;
            let s = st.id_mut(id)?;
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
        })();
        sync_result(id, r)
    })
}

pub(crate) extern "C" fn rdma_resolve_route(id: *mut rdma_cm_id, _timeout_ms: c_int) -> c_int {
    ffi!(-1, {
        let r = (|| {
            let mut st = state()?;
            let s = st.id_mut(id)?;
            let (Some(local), Some(remote), Some(dev)) = (s.local, s.remote, s.dev) else {
                return Err(libc::EINVAL);
            };
            let mtu = st.open(dev)?.mtu;
            set_route(id, local, Some(remote), mtu);
            st.id_mut(id)?.route_resolved = true;
            post(new_event(id, event::ROUTE_RESOLVED, 0));
            Ok(())
        })();
        sync_result(id, r)
    })
}

pub(crate) extern "C" fn rdma_listen(id: *mut rdma_cm_id, backlog: c_int) -> c_int {
    ffi!(-1, {
        let r = (|| {
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
                return Ok(());
            }
            let (dev, port) = (s.dev, s.local.map_or(0, |l| l.port()));
            // SAFETY: live id.
            let ps = unsafe { (*id).ps };
            // UD port spaces listen for SIDR_REQs on the same service ID.
            let sid = rdma_cm_service_id(ps as u16, port);
            let devs: Vec<usize> = match dev {
                Some(d) => vec![d],
                None => (0..st.devs.len()).collect(),
            };
            for &d in &devs {
                let o = st.open(d)?;
                // Another id of this process may listen on the same service on another
                // address of the device set: the engine listens once per device.
                // The backlog caps the requests not yet answered; <= 0 means the largest
                // (kernel ucma_listen).
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
            Ok(())
        })();
        result(r)
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

pub(crate) extern "C" fn rdma_connect(
    id: *mut rdma_cm_id,
    conn_param: *mut rdma_conn_param,
) -> c_int {
    ffi!(-1, {
        let r = (|| {
            let mut st = state()?;
            let psn = (st.random() & 0x00ff_ffff) as u32;
            let s = st.id_mut(id)?;
            let (Some(local), Some(remote), Some(dev)) = (s.local, s.remote, s.dev) else {
                return Err(libc::EINVAL);
            };
            if s.comm.is_some() {
                return Err(libc::EISCONN);
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
        })();
        sync_result(id, r)
    })
}

pub(crate) extern "C" fn rdma_accept(
    id: *mut rdma_cm_id,
    conn_param: *mut rdma_conn_param,
) -> c_int {
    ffi!(-1, {
        let r = (|| {
            let ibv = ibv()?;
            let mut st = state()?;
            let s = st.id_mut(id)?;
            let psn = s.starting_psn;
            if std::mem::take(&mut s.sidr_pending) {
                return sidr_accept(&mut st, id, conn_param);
            }
            let (Some(dev), Some(comm), Some(req)) = (s.dev, s.comm, s.req.take()) else {
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
            let port_mtu = PathMtu::from_ibv(st.open(dev)?.mtu).unwrap_or(PathMtu::Mtu1024);
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
                target_ack_delay: 0,
                rnr_retry_count: rnr,
                srq: qp_has_srq(idr, cp),
                private_data: user.to_vec(),
            };
            let o = st.open(dev)?;
            o.cm.accept(now(), comm, &p).map_err(|e| e.errno())?;
            pump(&mut st, dev);
            Ok(())
        })();
        // SAFETY: NULL or a live id (checked by the call).
        if !id.is_null() && unsafe { (*id).qp_type } == IBV_QPT_UD {
            return result(r); // a SIDR_REP: nothing to wait for
        }
        sync_result(id, r)
    })
}

/// rdma_accept of a SIDR request: a SIDR_REP with the id's QP (or conn_param's qp_num),
/// rdma_cm's Q_Key and the private data; the request is then answered and gone (the
/// passive side of a UD id gets no ESTABLISHED, as with the kernel).
fn sidr_accept(
    st: &mut State,
    id: *mut rdma_cm_id,
    conn_param: *mut rdma_conn_param,
) -> Result<(), c_int> {
    let s = st.id_mut(id)?;
    let (Some(dev), Some(comm)) = (s.dev, s.comm.take()) else {
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
    let o = st.open(dev)?;
    o.comms.remove(&comm);
    let r =
        o.cm.sidr_reply(now(), comm, SidrStatus::SUCCESS, qpn, RDMA_UDP_QKEY, user)
            .map_err(|e| e.errno());
    pump(st, dev);
    r
}

pub(crate) extern "C" fn rdma_reject(
    id: *mut rdma_cm_id,
    private_data: *const c_void,
    private_data_len: u8,
) -> c_int {
    ffi!(-1, {
        let r = (|| {
            let mut st = state()?;
            let s = st.id_mut(id)?;
            let (Some(dev), Some(comm)) = (s.dev, s.comm.take()) else {
                return Err(libc::EINVAL);
            };
            s.req = None;
            let sidr = std::mem::take(&mut s.sidr_pending);
            let data = if private_data.is_null() {
                &[][..]
            } else {
                // SAFETY: the caller passes private_data_len readable bytes.
                unsafe { std::slice::from_raw_parts(private_data.cast(), private_data_len.into()) }
            };
            let o = st.open(dev)?;
            o.comms.remove(&comm);
            if sidr {
                let data = &data[..data.len().min(SIDR_REP_PRIVATE)];
                o.cm.sidr_reply(now(), comm, SidrStatus::REJECT, 0, 0, data)
            } else {
                o.cm.reject(now(), comm, data)
            }
            .map_err(|e| e.errno())?;
            pump(&mut st, dev);
            Ok(())
        })();
        result(r)
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
    ffi!(-1, {
        let r = (|| {
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
            Ok(())
        })();
        result(r)
    })
}

pub(crate) extern "C" fn rdma_disconnect(id: *mut rdma_cm_id) -> c_int {
    ffi!(-1, {
        let r = (|| {
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
            pump(&mut st, dev);
            r
        })();
        sync_result(id, r)
    })
}

/// rdma_get_request: a synchronous listener's next CONNECT_REQUEST, with the QP its
/// rdma_create_ep attributes ask for; the event stays in the new id's `event` (acked by its
/// rdma_accept). Errors: EINVAL for an asynchronous listener or another event (kept in
/// the listener's `event`), ECONNREFUSED for REJECTED, an event's status.
pub(crate) extern "C" fn rdma_get_request(
    listen: *mut rdma_cm_id,
    id: *mut *mut rdma_cm_id,
) -> c_int {
    ffi!(-1, {
        if id.is_null() {
            return neg_errno(libc::EINVAL);
        }
        let attr = {
            let mut st = match state() {
                Ok(s) => s,
                Err(e) => return neg_errno(e),
            };
            match st.id_mut(listen) {
                Ok(s) if s.sync => s.qp_init_attr.as_deref().map(|a| {
                    // SAFETY: a plain C struct we copied in rdma_create_ep.
                    unsafe { std::ptr::read(a) }
                }),
                _ => return neg_errno(libc::EINVAL),
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
            return -1;
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
            return -1;
        }
        if err != 0 {
            // SAFETY: as above.
            unsafe { (*listen).event = ev };
            return neg_errno(err);
        }
        // SAFETY: the new id (live: its event is out) and the caller's out pointer.
        unsafe {
            (*new).event = ev;
            *id = new;
        }
        0
    })
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
    ffi!(-1, {
        if id.is_null() || res.is_null() {
            return neg_errno(libc::EINVAL);
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
            return -1;
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
            return neg_errno(e);
        }
        // SAFETY: the caller's out pointer.
        unsafe { *id = new };
        0
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
    ffi!((), {
        if id.is_null() {
            return;
        }
        rdma_destroy_qp(id);
        rdma_destroy_srq(id);
        rdma_destroy_id(id);
    })
}

pub(crate) extern "C" fn rdma_get_cm_event(
    channel: *mut rdma_event_channel,
    event: *mut *mut rdma_cm_event,
) -> c_int {
    ffi!(-1, {
        if channel.is_null() || event.is_null() {
            return neg_errno(libc::EINVAL);
        }
        if !live_channels().lock().contains(&(channel as usize)) {
            return neg_errno(libc::EBADF);
        }
        // SAFETY: a live channel of ours.
        let chan = unsafe { &*channel.cast::<Channel>() };
        loop {
            let mut v = 0u64;
            // SAFETY: an 8-byte read from our eventfd; blocks unless made non-blocking.
            let n = unsafe { libc::read(chan.ch.fd, (&mut v as *mut u64).cast(), 8) };
            if n != 8 {
                let e = errno_or(libc::EIO);
                if e == libc::EINTR {
                    continue;
                }
                return neg_errno(e);
            }
            // The id's state is updated under the state lock, before the queue.
            let Ok(mut st) = state() else {
                return neg_errno(libc::ENODEV);
            };
            let Some(e) = chan.queue.lock().pop_front() else {
                continue; // its id was destroyed meanwhile
            };
            let ev = e as *mut Event;
            // SAFETY: a live queued event, now ours alone.
            let id = unsafe { (*ev).ev.id };
            // SAFETY: as above.
            mcast::process_join(&mut st, unsafe { &mut *ev });
            if let Some(s) = st.ids.get_mut(&(id as usize)) {
                s.events_out += 1;
            }
            // SAFETY: the caller's out pointer.
            unsafe { *event = ev.cast() };
            return 0;
        }
    })
}

pub(crate) extern "C" fn rdma_ack_cm_event(event: *mut rdma_cm_event) -> c_int {
    ffi!(-1, {
        if event.is_null() {
            return neg_errno(libc::EINVAL);
        }
        // SAFETY: an event from rdma_get_cm_event, acked once.
        let ev = unsafe { Box::from_raw(event.cast::<Event>()) };
        let Ok(mut st) = state() else { return 0 };
        let id = ev.ev.id as usize;
        if let Some(s) = st.ids.get_mut(&id) {
            s.events_out = s.events_out.saturating_sub(1);
            if s.destroyed && s.events_out == 0 {
                st.ids.remove(&id);
                free_id(id as *mut rdma_cm_id);
            }
        }
        0
    })
}

pub(crate) extern "C" fn rdma_migrate_id(
    id: *mut rdma_cm_id,
    channel: *mut rdma_event_channel,
) -> c_int {
    ffi!(-1, {
        let r = (|| {
            let mut st = state()?;
            st.id_mut(id)?;
            if channel.is_null() {
                return Err(libc::ENOSYS);
            }
            // SAFETY: live id.
            unsafe { (*id).channel = channel };
            Ok(())
        })();
        result(r)
    })
}

pub(crate) extern "C" fn rdma_notify(id: *mut rdma_cm_id, _event: c_int) -> c_int {
    ffi!(-1, {
        let r = (|| {
            state()?.id_mut(id)?;
            Ok(())
        })();
        result(r)
    })
}

pub(crate) extern "C" fn rdma_set_option(
    id: *mut rdma_cm_id,
    level: c_int,
    optname: c_int,
    optval: *mut c_void,
    optlen: usize,
) -> c_int {
    ffi!(-1, {
        let r = (|| {
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
            }
        })();
        result(r)
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
    ffi!(-1, {
        let r = (|| {
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
                    mask::STATE,
                )
            } else if qp_type == IBV_QPT_UD && want == IBV_QPS_RTS {
                (
                    ibv_qp_attr {
                        qp_state: IBV_QPS_RTS,
                        sq_psn: 0,
                        ..Default::default()
                    },
                    mask::STATE | mask::SQ_PSN,
                )
            } else if want == IBV_QPS_RTR || want == IBV_QPS_RTS {
                let (Some(dev), Some(peer)) = (dev, peer) else {
                    return Err(libc::EINVAL);
                };
                let port_mtu = PathMtu::from_ibv(st.open(dev)?.mtu).unwrap_or(PathMtu::Mtu1024);
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
            Ok(())
        })();
        result(r)
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
    ffi!(-1, {
        let r = (|| {
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
            Ok(())
        })();
        result(r)
    })
}

/// `rdma_get_remote_ece`: the ECE the peer's REQ or REP carried: none on softroce's CM
/// (vendor ID 0, options 0, as a peer without ECE sends). Errors: EINVAL for a NULL id or
/// ece, or an id with a QP (librdmacm: for external QPs only).
pub(crate) extern "C" fn rdma_get_remote_ece(id: *mut rdma_cm_id, ece: *mut ibv_ece) -> c_int {
    ffi!(-1, {
        let r = (|| {
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
            Ok(())
        })();
        result(r)
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
    ffi!(0, { port_of(id, false) })
}

pub(crate) extern "C" fn rdma_get_dst_port(id: *mut rdma_cm_id) -> u16 {
    ffi!(0, { port_of(id, true) })
}

pub(crate) extern "C" fn rdma_get_devices(num_devices: *mut c_int) -> *mut *mut ibv_context {
    ffi!(std::ptr::null_mut(), {
        let mut st = match state() {
            Ok(s) => s,
            Err(e) => {
                crate::set_errno(e);
                return std::ptr::null_mut();
            }
        };
        let mut list = Vec::new();
        for i in 0..st.devs.len() {
            match st.open(i) {
                Ok(o) => list.push(o.ctx),
                Err(e) => {
                    crate::set_errno(e);
                    return std::ptr::null_mut();
                }
            }
        }
        if !num_devices.is_null() {
            // SAFETY: the caller's int.
            unsafe { *num_devices = list.len() as c_int };
        }
        list.push(std::ptr::null_mut());
        Box::into_raw(list.into_boxed_slice()).cast()
    })
}

pub(crate) extern "C" fn rdma_free_devices(list: *mut *mut ibv_context) {
    ffi!((), {
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

pub(crate) extern "C" fn rdma_event_str(event: c_int) -> *const c_char {
    const NAMES: [&std::ffi::CStr; 16] = [
        c"RDMA_CM_EVENT_ADDR_RESOLVED",
        c"RDMA_CM_EVENT_ADDR_ERROR",
        c"RDMA_CM_EVENT_ROUTE_RESOLVED",
        c"RDMA_CM_EVENT_ROUTE_ERROR",
        c"RDMA_CM_EVENT_CONNECT_REQUEST",
        c"RDMA_CM_EVENT_CONNECT_RESPONSE",
        c"RDMA_CM_EVENT_CONNECT_ERROR",
        c"RDMA_CM_EVENT_UNREACHABLE",
        c"RDMA_CM_EVENT_REJECTED",
        c"RDMA_CM_EVENT_ESTABLISHED",
        c"RDMA_CM_EVENT_DISCONNECTED",
        c"RDMA_CM_EVENT_DEVICE_REMOVAL",
        c"RDMA_CM_EVENT_MULTICAST_JOIN",
        c"RDMA_CM_EVENT_MULTICAST_ERROR",
        c"RDMA_CM_EVENT_ADDR_CHANGE",
        c"RDMA_CM_EVENT_TIMEWAIT_EXIT",
    ];
    usize::try_from(event)
        .ok()
        .and_then(|i| NAMES.get(i))
        .map_or(c"UNKNOWN EVENT".as_ptr(), |n| n.as_ptr())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn errno() -> c_int {
        std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
    }

    // A channel destroyed twice (perftest -R's client retry does it) is refused with EBADF,
    // as librdmacm's calls on the closed fd are, and so is taking an event from it.
    #[test]
    fn destroyed_channel_is_refused_with_ebadf() {
        let ch = new_channel().unwrap();
        rdma_destroy_event_channel(ch);
        crate::set_errno(0);
        rdma_destroy_event_channel(ch);
        assert_eq!(errno(), libc::EBADF);
        let mut ev = std::ptr::null_mut();
        assert_eq!(rdma_get_cm_event(ch, &mut ev), -1);
        assert_eq!(errno(), libc::EBADF);
        assert!(ev.is_null());
    }
}
