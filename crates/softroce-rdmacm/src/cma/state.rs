//! The process's rdma_cm state: one [`State`] behind one lock, holding the devices (each
//! opened device has a `CmEngine` and a driver thread, `driver.rs`), the ids ([`IdState`],
//! keyed by the `rdma_cm_id` address, with the multicast groups each joined) and the bound
//! ports; the per-process reset of a `fork`ed child ([`state`]); making and freeing the
//! boxed `rdma_cm_id`s; and the library's clock and errno helpers.
//!
//! Contracts: every entry point and driver thread takes the lock through [`state`]; the
//! ibv_* calls made under it never call back. Nothing here sends a MAD or queues an event.

use crate::abi::*;
use crate::ibv::ibv;
use core::ffi::{c_int, c_void};
use parking_lot::{MappedMutexGuard, Mutex, MutexGuard};
use softroce::cm::{CmEngine, CommId};
use softroce::net::standin::StandIn;
use softroce::transport::{Instant, PathMtu};
use softroce::wire::cm::{CmaHdrRepr, RepRepr, ReqRepr, rdma_cm_service_id};
use softroce_cabi::fork::PerProcess;
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::OnceLock;

/// How long a device keeps listening on a service ID after its last listening id is
/// destroyed: a REQ that comes meanwhile waits for a new listener (see [`Parked`]).
pub(super) const LISTEN_LINGER: std::time::Duration = std::time::Duration::from_secs(3);

pub(super) struct OpenDev {
    pub(super) ctx: *mut ibv_context,
    pub(super) pd: *mut ibv_pd,
    pub(super) cm: CmEngine,
    /// Connection → the `rdma_cm_id` it belongs to.
    pub(super) comms: HashMap<CommId, usize>,
    /// The path MTU of routes from this device (IB enum): the port's active MTU, capped by
    /// what rdma_cm derives from the interface's MTU (`rdma_cm_route_mtu`).
    pub(super) mtu: u8,
    /// Service IDs whose last listening id went away, and until when the engine still
    /// listens on them ([`LISTEN_LINGER`]).
    pub(super) lingering: HashMap<u64, Instant>,
    /// REQs that came for a lingering service ID, waiting for a listener.
    pub(super) parked: Vec<Parked>,
    /// The process's stand-in for this device, which ends its established connections
    /// once the process is gone (`softroce::net::standin`); `None` if it could not start.
    pub(super) standin: Option<StandIn>,
}

impl OpenDev {
    /// [`OpenDev::mtu`] as the engine's path MTU (an enum value no port reports: 1024).
    pub(super) fn path_mtu(&self) -> PathMtu {
        PathMtu::from_ibv(self.mtu).unwrap_or(PathMtu::Mtu1024)
    }
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
pub(super) struct Parked {
    pub(super) comm: CommId,
    pub(super) peer: IpAddr,
    pub(super) req: Box<ReqRepr>,
    pub(super) cma: Option<CmaHdrRepr>,
}

pub(super) struct Dev {
    pub(super) name: String,
    pub(super) ip: IpAddr,
    pub(super) ibv_dev: *mut ibv_device,
    pub(super) open: Option<OpenDev>,
    /// Why the device failed: its CM driver thread panicked, or libibverbs.so.1's device
    /// did (`softroce_mad_recv` says EIO). Its ids got DEVICE_REMOVAL ([`fail_device`]);
    /// the calls that need the device fail with EIO from then on.
    pub(super) failed: Option<String>,
}

#[derive(Default)]
pub(super) struct IdState {
    pub(super) dev: Option<usize>,
    pub(super) local: Option<SocketAddr>,
    pub(super) remote: Option<SocketAddr>,
    pub(super) listening: bool,
    pub(super) comm: Option<CommId>,
    /// The listening id a passive id came from.
    pub(super) listen_id: usize,
    /// Passive: the REQ.
    pub(super) req: Option<Box<ReqRepr>>,
    /// Passive UD: a SIDR_REQ not answered yet (its request is `comm`).
    pub(super) sidr_pending: bool,
    /// The starting PSN this id announced in its REQ or REP: the PSN its QP receives from
    /// (kernel cm.c; see `ConnectParams::starting_psn`).
    pub(super) starting_psn: u32,
    pub(super) responder_resources: u8,
    pub(super) initiator_depth: u8,
    pub(super) retry_count: u8,
    /// Active: the REP's private data, for the ESTABLISHED event.
    pub(super) rep_private: Option<Vec<u8>>,
    /// Active: rdma_establish was called (no ESTABLISHED event follows).
    pub(super) user_established: bool,
    /// Active: the REP, for `rdma_init_qp_attr` of an external QP.
    pub(super) rep: Option<Box<RepRepr>>,
    /// `RDMA_OPTION_ID_ACK_TIMEOUT`: the RC QP's local ACK timeout exponent at RTS, in place
    /// of the one the REQ/REP exchange gives (kernel `rdma_set_ack_timeout`).
    pub(super) ack_timeout: Option<u8>,
    /// `rdma_set_local_ece`: kept and reported, never sent (softroce's CM carries no ECE).
    pub(super) local_ece: Option<(u32, u32)>,
    /// Events handed out and not acked.
    pub(super) events_out: usize,
    /// rdma_destroy_id ran while events were out: freed at the last ack.
    pub(super) destroyed: bool,
    /// Synchronous: made without a channel, the id has one of its own (destroyed with it)
    /// and its calls wait for their events (librdmacm's `id_priv->sync`).
    pub(super) sync: bool,
    /// rdma_create_ep of a passive id: the QP rdma_get_request makes for each request.
    pub(super) qp_init_attr: Option<Box<ibv_qp_init_attr>>,
    /// rdma_resolve_route succeeded (the kernel's state is then past ADDR_RESOLVED).
    pub(super) route_resolved: bool,
    /// The multicast groups joined and not left, newest first (librdmacm's `mc_list`).
    pub(super) mcast: Vec<Membership>,
}

pub(super) struct State {
    pub(super) devs: Vec<Dev>,
    pub(super) ids: HashMap<usize, IdState>,
    pub(super) rng: softroce::rand::SplitMix64,
    /// The last multicast membership handle handed out (0 is none).
    pub(super) last_mc: u64,
}

// SAFETY: the raw pointers are libibverbs handles (contexts, PDs) and our own boxes, used only
// under the state's lock; libibverbs objects may be used from any thread.
unsafe impl Send for State {}

/// The process's rdma_cm state, made on first use; a `fork`ed child's first use makes its
/// own ([`PerProcess`]).
static STATE: OnceLock<Result<Mutex<PerProcess<State>>, c_int>> = OnceLock::new();

/// The process's rdma_cm state, locked ([`state`]).
pub(super) type StateGuard = MappedMutexGuard<'static, State>;

/// The process's rdma_cm state, locked. In a `fork`ed child the first call replaces the
/// parent's state with a new one ([`PerProcess`]): the parent's open devices, ids and
/// channels are the parent's (their driver threads did not fork, and libibverbs.so.1 gives a
/// child none of the parent's devices), so the child opens the devices it uses itself. The
/// parent's state is leaked in the child, not dropped. The lock is held across `fork`
/// (`pthread_atfork`), so a child never inherits it locked by a thread that does not exist
/// there (a driver thread takes it every few milliseconds). Errors: those of the first
/// `init_state`, or of the child's (which leaves the parent's state for the next call).
pub(super) fn state() -> Result<StateGuard, c_int> {
    let s = STATE.get_or_init(|| {
        // SOFTROCE_LOG for this library's copy of the engine (its CM's events), as
        // libibverbs.so.1 installs it for its own.
        softroce_cabi::log::init_log();
        // SAFETY: registers plain functions with no arguments. A failure (ENOMEM) leaves a
        // child to inherit the lock as it is.
        unsafe {
            libc::pthread_atfork(
                Some(lock_for_fork),
                Some(unlock_after_fork),
                Some(unlock_after_fork),
            )
        };
        init_state().map(|st| Mutex::new(PerProcess::new(st)))
    });
    let m = s.as_ref().map_err(|e| *e)?;
    // The state of this process, or the error of making it (the guard is then let go).
    let mut err = libc::EIO;
    MutexGuard::try_map(m.lock(), |p| {
        p.get_or_reset(init_state).map_err(|e| err = e).ok()
    })
    .map_err(|_| err)
}

std::thread_local! {
    /// The state's lock, held by the forking thread from [`lock_for_fork`] to
    /// [`unlock_after_fork`] (in the child, that thread's copy).
    static FORK_LOCK: std::cell::RefCell<Option<MutexGuard<'static, PerProcess<State>>>> =
        const { std::cell::RefCell::new(None) };
}

std::thread_local! {
    /// Set while this thread, holding the state's lock, opens a device: opening a shared
    /// device may fork its keeper (`softroce::net::share`), and the prepare handler must not
    /// take again a lock its own thread holds. The child (the keeper) never uses the state.
    pub(super) static OPENING_DEVICE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// `pthread_atfork` prepare handler: takes the state's lock, so that no other thread holds
/// it at the fork (unless this very thread holds it: [`OPENING_DEVICE`]).
extern "C" fn lock_for_fork() {
    if OPENING_DEVICE
        .try_with(std::cell::Cell::get)
        .unwrap_or(false)
    {
        return;
    }
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
                    failed: None,
                });
            }
        }
        (ibv.free_device_list)(list);
    }
    let seed = softroce::net::clock::seed_from_clock_and_pid();
    Ok(State {
        devs,
        ids: HashMap::new(),
        rng: softroce::rand::SplitMix64::new(seed),
        last_mc: 0,
    })
}

impl State {
    pub(super) fn random(&mut self) -> u64 {
        self.rng.next_u64()
    }

    pub(super) fn dev_of_ip(&self, ip: IpAddr) -> Option<usize> {
        self.devs.iter().position(|d| d.ip == ip)
    }

    pub(super) fn id_mut(&mut self, id: *mut rdma_cm_id) -> Result<&mut IdState, c_int> {
        self.ids
            .get_mut(&(id as usize))
            .filter(|s| !s.destroyed)
            .ok_or(libc::EINVAL)
    }

    /// The service ID of `id`'s bound port in port space `ps`, and the devices it covers:
    /// its own, or every device for the wildcard address. `None` for an id not in the table
    /// (a destroyed id that is still there counts).
    pub(super) fn service_scope(
        &self,
        id: *mut rdma_cm_id,
        ps: c_int,
    ) -> Option<(u64, Vec<usize>)> {
        let s = self.ids.get(&(id as usize))?;
        let sid = rdma_cm_service_id(ps as u16, s.local.map_or(0, |l| l.port()));
        let devs = match s.dev {
            Some(d) => vec![d],
            None => (0..self.devs.len()).collect(),
        };
        Some((sid, devs))
    }

    /// A free port of port space `ps` (librdmacm: the kernel picks one in the local range).
    pub(super) fn ephemeral_port(&mut self, ps: c_int) -> u16 {
        loop {
            let p = 32768 + (self.random() % 28232) as u16;
            if !self.port_taken(ps, p, None) {
                return p;
            }
        }
    }

    pub(super) fn port_taken(&self, ps: c_int, port: u16, ip: Option<IpAddr>) -> bool {
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

/// The errno an inner call left, or `default` when it left none (errno 0).
pub(super) fn errno_or(default: c_int) -> c_int {
    match softroce_cabi::errno() {
        0 => default,
        e => e,
    }
}

/// The library's clock: one [`SystemClock`](softroce::net::SystemClock) for the process, the
/// engine's adapter of the real clock (a copy reads the same time).
pub(super) fn clock() -> softroce::net::SystemClock {
    static CLOCK: OnceLock<softroce::net::SystemClock> = OnceLock::new();
    *CLOCK.get_or_init(softroce::net::SystemClock::new)
}

/// The library's time: [`clock`]'s (with feature `testing`, the bench's clock once a bench
/// set it, [`BENCH_NOW`]).
pub(super) fn now() -> Instant {
    #[cfg(feature = "testing")]
    if let t @ 1.. = BENCH_NOW.load(std::sync::atomic::Ordering::SeqCst) {
        return Instant::from_nanos(t);
    }
    softroce::verbs::Clock::now(&clock())
}

/// (Feature `testing`.) The in-memory bench's time in ns, which [`now`] returns instead of
/// the real clock's while it is not 0 (`cma::testing` sets it; nothing else does).
#[cfg(feature = "testing")]
pub(super) static BENCH_NOW: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// (Feature `testing`.) Replaces the process's rdma_cm state with `fresh`, making it first
/// if no call made it yet; returns the state it replaced (`None`: there was none). Errors:
/// the error of an earlier first use that failed (then the state can never be made). Only
/// the in-memory bench (`cma::testing`) calls it, before and after each run, holding no
/// other lock of the library.
#[cfg(feature = "testing")]
pub(super) fn replace_state(fresh: State) -> Result<Option<State>, c_int> {
    let mut fresh = Some(fresh);
    let s = STATE.get_or_init(|| {
        let first = fresh.take().map(|st| Mutex::new(PerProcess::new(st)));
        first.ok_or(libc::EIO)
    });
    let m = s.as_ref().map_err(|e| *e)?;
    let Some(f) = fresh else { return Ok(None) };
    let mut p = m.lock();
    // (Another process's state is never here: the bench does not fork.)
    let cur = p.get_or_reset(|| Err(libc::EIO))?;
    Ok(Some(std::mem::replace(cur, f)))
}

pub(super) fn new_id(
    channel: *mut rdma_event_channel,
    context: *mut c_void,
    ps: c_int,
) -> *mut rdma_cm_id {
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
pub(super) fn free_id(id: *mut rdma_cm_id) {
    // SAFETY: `id` came from new_id and is freed once (its state was just removed).
    unsafe {
        let b = Box::from_raw(id);
        if !b.route.path_rec.is_null() {
            drop(Box::from_raw(b.route.path_rec));
        }
    }
}

/// `sizeof(struct sockaddr_storage)`: the most librdmacm keeps of a group's address.
pub(super) const ADDR_MAX: usize = 128;

/// One group an id joined (librdmacm's `struct cma_multicast`).
pub(super) struct Membership {
    /// Names the membership in its events (librdmacm's `mc` pointer).
    pub(super) handle: u64,
    /// The address as joined: the bytes of its sockaddr, then zeros.
    pub(super) addr: [u8; ADDR_MAX],
    pub(super) join_flags: u32,
    /// The MGID, once the program took the MULTICAST_JOIN (librdmacm's `mc->mgid`, zero
    /// before): what rdma_leave_multicast detaches.
    pub(super) mgid: [u8; 16],
}
