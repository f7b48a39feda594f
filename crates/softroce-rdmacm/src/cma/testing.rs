//! (Feature `testing`.) The in-memory bench: this library's CM driver and `rdma_*` entry
//! points, run unchanged against a libibverbs.so.1 held in memory (`testing/verbs.rs`) on a
//! clock set by hand, one step at a time. For the `rdmacm_driver` fuzz target
//! (`fuzz/src/rdmacm.rs`) and its stable replay (tests/rdmacm_fuzz.rs).
//!
//! What runs is the production code: a MAD handed to [`Bench::deliver`] is queued on the
//! device's QP1 and one round of the CM loop runs (`softroce::net::cm_loop::run_once` over
//! the driver's own `CmLoop`: `next_timer`, `wait` taking the MAD through
//! `softroce_mad_recv`, `turn` feeding it and the due timers to the engine, ending
//! lingering listeners and pumping the engine's events into rdma_cm events); the calls
//! ([`Bench::listen`], [`Bench::accept`], …) are the `rdma_*` entry points themselves;
//! events are taken with `rdma_get_cm_event` and acked with `rdma_ack_cm_event`. Only the
//! device's opening is the bench's: [`Bench::new`] puts an opened device (its context and
//! PD from the in-memory libibverbs, an engine with rdma_cm's configuration, no stand-in)
//! into the library's state instead of `State::open`, which starts a thread.
//!
//! Process-wide: the library's state, its libibverbs and its clock are the process's, so
//! one bench runs at a time (others wait in [`Bench::new`]), and the first bench's
//! libibverbs stays the process's ([`crate::ibv::install`]). The bench's application keeps
//! one asynchronous event channel for all its ids.
//!
//! [`Bench::check_invariants`] checks the library's tables against each other and against
//! the engine and the device; [`Bench::poll_event`] checks each event as it is taken;
//! [`Bench::finish`] destroys everything and checks that nothing was left behind.

mod verbs;

use super::events::{Event, new_channel, queued};
use super::state::{BENCH_NOW, Dev, OpenDev, State, now, replace_state, state};
use crate::abi::*;
use crate::ibv::ibv;
use core::ffi::c_int;
use parking_lot::{Mutex, MutexGuard};
use softroce::cm::{CmConfig, CmEngine, CmState, CommId};
use softroce::net::cm_loop::run_once;
use softroce::transport::Instant;
use softroce::verbs::Clock;
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use verbs::{MEM, Mem, Qp1Input};

/// Connections nobody's id holds may be in these states only: a destroyed id's
/// disconnect on its way (DREQ_SENT) and TIMEWAIT both end by the engine's own timers
/// without reaching a state that waits for the application.
const ORPHAN_STATES: [CmState; 2] = [CmState::DreqSent, CmState::Timewait];

/// One bench at a time (module doc).
static SERIAL: Mutex<()> = Mutex::new(());

/// Panics seen in this process since the bench's hook went in (an entry point's panic is
/// caught at its FFI boundary and becomes EIO; the bench counts it as a finding).
static PANICS: AtomicUsize = AtomicUsize::new(0);

/// An id the bench's application holds: made by [`Bench::create_id`], or handed over by a
/// CONNECT_REQUEST. Its `rdma_cm_id`'s address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Id(usize);

/// What the application passes as `struct rdma_conn_param` (connect, accept).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConnParam {
    /// The private data (up to 255 bytes are passed).
    pub private_data: Vec<u8>,
    /// `responder_resources`.
    pub responder_resources: u8,
    /// `initiator_depth`.
    pub initiator_depth: u8,
    /// `retry_count`.
    pub retry_count: u8,
    /// `rnr_retry_count`.
    pub rnr_retry_count: u8,
    /// `qp_num`, for an id without a QP.
    pub qp_num: u32,
}

/// An event as `rdma_get_cm_event` handed it out (copied before the ack).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventView {
    /// `RDMA_CM_EVENT_*` (`crate::abi::event`).
    pub event: c_int,
    /// Its status.
    pub status: c_int,
    /// Its id (for CONNECT_REQUEST the new one, which the application now holds).
    pub id: Id,
    /// A CONNECT_REQUEST's listening id.
    pub listen_id: Option<Id>,
    /// The private data the event points at.
    pub private_data: Vec<u8>,
}

/// The bench's clock: [`BENCH_NOW`], which the library's `now()` reads too.
struct BenchClock;

impl Clock for BenchClock {
    fn now(&self) -> Instant {
        Instant::from_nanos(BENCH_NOW.load(Ordering::SeqCst))
    }
}

/// The library with one in-memory device (module doc).
pub struct Bench {
    _serial: MutexGuard<'static, ()>,
    driver: super::driver::Driver,
    /// The application's event channel.
    channel: *mut rdma_event_channel,
    /// Ids the application holds, oldest first.
    known: Vec<usize>,
    ip: IpAddr,
    panics: usize,
    finished: bool,
}

/// The errno of a `-1` return.
fn errno_of(r: c_int) -> Result<(), c_int> {
    if r == 0 {
        Ok(())
    } else {
        Err(match softroce_cabi::errno() {
            0 => libc::EIO,
            e => e,
        })
    }
}

/// A `sockaddr_storage` holding `a`.
fn sockaddr(a: SocketAddr) -> libc::sockaddr_storage {
    // SAFETY: all zeros is a valid sockaddr_storage.
    let mut s: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    softroce::net::sockaddr::write_socket_addr(&mut s, a);
    s
}

impl Bench {
    /// The library with one device at `ip` (rdma_cm's CM configuration, engine and id
    /// randomness from `seed`), at time 1 ns, with one event channel and no id. Waits for
    /// another bench of the process to be dropped first (so a thread that holds one and
    /// makes a second waits forever).
    /// Panics: when the process's libibverbs was looked up before the first bench, or the
    /// library's state was made without it (the bench cannot run there).
    pub fn new(ip: IpAddr, seed: u64) -> Bench {
        let serial = SERIAL.lock();
        static HOOK: std::sync::Once = std::sync::Once::new();
        HOOK.call_once(|| {
            let _ = crate::ibv::install(verbs::table());
            let prev = std::panic::take_hook();
            std::panic::set_hook(Box::new(move |info| {
                PANICS.fetch_add(1, Ordering::SeqCst);
                prev(info);
            }));
        });
        let table = ibv().ok().filter(|t| verbs::is_ours(t.mad_send));
        let Some(table) = table else {
            panic!("the bench's libibverbs is not the process's: it was looked up before");
        };
        BENCH_NOW.store(1, Ordering::SeqCst);
        let guid = seed | 1;
        *MEM.lock() = Some(Mem::new(guid));
        let (dev, ctx) = MEM.lock().as_ref().map_or((0, 0), |m| (m.dev, m.ctx));
        let ctx = ctx as *mut ibv_context;
        // SAFETY: the in-memory device's context.
        let pd = unsafe { (table.alloc_pd)(ctx) };
        let open = OpenDev {
            ctx,
            pd,
            cm: CmEngine::new(CmConfig::new(ip, guid, seed)),
            comms: HashMap::new(),
            mtu: verbs::PORT_MTU as u8,
            lingering: HashMap::new(),
            parked: Vec::new(),
            standin: None,
        };
        let fresh = State {
            devs: vec![Dev {
                name: "mem0".into(),
                ip,
                ibv_dev: dev as *mut ibv_device,
                open: Some(open),
                failed: None,
            }],
            ids: HashMap::new(),
            rng: softroce::rand::SplitMix64::new(seed),
            last_mc: 0,
        };
        match replace_state(fresh) {
            Ok(old) => drop(old),
            Err(e) => panic!("the library's state was made without the bench (errno {e})"),
        }
        let channel = new_channel().unwrap_or(std::ptr::null_mut());
        assert!(
            !channel.is_null(),
            "no event channel: {}",
            softroce_cabi::errno()
        );
        // The application polls: rdma_get_cm_event says EAGAIN when nothing is queued.
        // SAFETY: fcntl on the channel's own eventfd.
        unsafe {
            let fd = (*channel).fd;
            libc::fcntl(
                fd,
                libc::F_SETFL,
                libc::fcntl(fd, libc::F_GETFL) | libc::O_NONBLOCK,
            );
        }
        let driver = match super::driver::Driver::new(0, ctx as usize) {
            Ok(d) => d,
            Err(e) => panic!("no driver (errno {e})"),
        };
        Bench {
            _serial: serial,
            driver,
            channel,
            known: Vec::new(),
            ip,
            panics: PANICS.load(Ordering::SeqCst),
            finished: false,
        }
    }

    /// The device's address.
    pub fn ip(&self) -> IpAddr {
        self.ip
    }

    /// The bench's time (the library's `now()`).
    pub fn now(&self) -> Instant {
        BenchClock.now()
    }

    /// Moves the clock to `t` (never back). Nothing runs: [`Bench::turn`] then fires what
    /// is due, as the driver thread does when its wait ends.
    pub fn advance_to(&mut self, t: Instant) {
        BENCH_NOW.fetch_max(t.as_nanos(), Ordering::SeqCst);
    }

    /// The earliest of the engine's next timer and the end of a lingering listen: when
    /// the driver next has something to do without input.
    pub fn next_timer(&self) -> Option<Instant> {
        let st = state().ok()?;
        let o = st.devs.first()?.open.as_ref()?;
        let linger = o.lingering.values().copied().min();
        match (o.cm.poll_timeout(), linger) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// One round of the driver's loop (nothing queued on QP1: the timers that are due).
    /// Errors: the loop ended (its state or device gone).
    pub fn turn(&mut self) -> Result<(), String> {
        run_once(&mut self.driver, &BenchClock).map_err(|e| format!("the CM loop ended: {e:?}"))
    }

    /// Queues `mad` (up to 256 bytes, zero-padded) from `from` on QP1 and runs one round
    /// of the driver's loop, which takes it.
    /// Errors: those of [`Bench::turn`].
    pub fn deliver(&mut self, from: IpAddr, mad: &[u8]) -> Result<(), String> {
        self.queue(Qp1Input::Mad(from, mad.to_vec()));
        self.turn()
    }

    /// Queues an ICMP "port unreachable" for `from` on QP1 and runs one round of the loop.
    /// Errors: those of [`Bench::turn`].
    pub fn unreachable(&mut self, from: IpAddr) -> Result<(), String> {
        self.queue(Qp1Input::Unreachable(from));
        self.turn()
    }

    fn queue(&mut self, input: Qp1Input) {
        if let Some(m) = MEM.lock().as_mut() {
            m.inbox.push_back(input);
        }
    }

    /// The MADs the library sent from QP1 since the last call: destination, bytes.
    pub fn take_sent(&mut self) -> Vec<(IpAddr, Box<[u8; 256]>)> {
        MEM.lock()
            .as_mut()
            .map(|m| m.outbox.drain(..).collect())
            .unwrap_or_default()
    }

    /// How many events wait on the application's channel.
    pub fn queued_events(&self) -> usize {
        // The lock the library posts under, so that no post is half done.
        let _st = state();
        queued(self.channel).len()
    }

    /// The ids the application holds, oldest first.
    pub fn ids(&self) -> Vec<Id> {
        self.known.iter().map(|&a| Id(a)).collect()
    }

    /// `id` as the library's pointer, if the application holds it.
    fn held(&self, id: Id) -> Result<*mut rdma_cm_id, c_int> {
        if self.known.contains(&id.0) {
            Ok(id.0 as *mut rdma_cm_id)
        } else {
            Err(libc::EINVAL)
        }
    }

    /// `rdma_create_id` on the bench's channel, port space `ps` (`RDMA_PS_*`).
    /// Errors: its errno.
    pub fn create_id(&mut self, ps: c_int) -> Result<Id, c_int> {
        let mut id = std::ptr::null_mut();
        errno_of(crate::rdma_create_id(
            self.channel,
            &mut id,
            std::ptr::null_mut(),
            ps,
        ))?;
        self.known.push(id as usize);
        Ok(Id(id as usize))
    }

    /// `rdma_bind_addr`. Errors: its errno.
    pub fn bind(&mut self, id: Id, addr: SocketAddr) -> Result<(), c_int> {
        let p = self.held(id)?;
        let mut a = sockaddr(addr);
        errno_of(crate::rdma_bind_addr(p, (&raw mut a).cast()))
    }

    /// `rdma_listen`. Errors: its errno.
    pub fn listen(&mut self, id: Id, backlog: c_int) -> Result<(), c_int> {
        errno_of(crate::rdma_listen(self.held(id)?, backlog))
    }

    /// `rdma_resolve_addr` (no source address) to `dst`, then `rdma_resolve_route`.
    /// Errors: the errno of the first that fails.
    pub fn resolve(&mut self, id: Id, dst: SocketAddr) -> Result<(), c_int> {
        let p = self.held(id)?;
        let mut d = sockaddr(dst);
        errno_of(crate::rdma_resolve_addr(
            p,
            std::ptr::null_mut(),
            (&raw mut d).cast(),
            2000,
        ))?;
        errno_of(crate::rdma_resolve_route(p, 2000))
    }

    /// Runs `f` with `p` as a `struct rdma_conn_param` (NULL for `None`).
    fn with_param(p: Option<&ConnParam>, f: impl FnOnce(*mut rdma_conn_param) -> c_int) -> c_int {
        let Some(p) = p else {
            return f(std::ptr::null_mut());
        };
        let len = p.private_data.len().min(255);
        let mut c = rdma_conn_param {
            private_data: p.private_data.as_ptr().cast(),
            private_data_len: len as u8,
            responder_resources: p.responder_resources,
            initiator_depth: p.initiator_depth,
            flow_control: 0,
            retry_count: p.retry_count,
            rnr_retry_count: p.rnr_retry_count,
            srq: 0,
            qp_num: p.qp_num,
        };
        f(&mut c)
    }

    /// `rdma_connect`. Errors: its errno.
    pub fn connect(&mut self, id: Id, p: Option<&ConnParam>) -> Result<(), c_int> {
        let id = self.held(id)?;
        errno_of(Self::with_param(p, |c| crate::rdma_connect(id, c)))
    }

    /// `rdma_accept`. Errors: its errno.
    pub fn accept(&mut self, id: Id, p: Option<&ConnParam>) -> Result<(), c_int> {
        let id = self.held(id)?;
        errno_of(Self::with_param(p, |c| crate::rdma_accept(id, c)))
    }

    /// `rdma_reject` with `private_data` (up to 255 bytes are passed). Errors: its errno.
    pub fn reject(&mut self, id: Id, private_data: &[u8]) -> Result<(), c_int> {
        let len = private_data.len().min(255) as u8;
        errno_of(crate::rdma_reject(
            self.held(id)?,
            private_data.as_ptr().cast(),
            len,
        ))
    }

    /// `rdma_establish`. Errors: its errno.
    pub fn establish(&mut self, id: Id) -> Result<(), c_int> {
        errno_of(crate::rdma_establish(self.held(id)?))
    }

    /// `rdma_disconnect`. Errors: its errno.
    pub fn disconnect(&mut self, id: Id) -> Result<(), c_int> {
        errno_of(crate::rdma_disconnect(self.held(id)?))
    }

    /// `rdma_destroy_qp` if the id has a QP, then `rdma_destroy_id`; the application no
    /// longer holds it. Errors: the errno of `rdma_destroy_id`.
    pub fn destroy(&mut self, id: Id) -> Result<(), c_int> {
        let p = self.held(id)?;
        // SAFETY: a live id the application holds.
        if !unsafe { (*p).qp }.is_null() {
            crate::rdma_destroy_qp(p);
        }
        self.known.retain(|&a| a != id.0);
        errno_of(crate::rdma_destroy_id(p))
    }

    /// `rdma_create_qp` with the id's PD and QP type, 4 WRs each way. Errors: its errno.
    pub fn create_qp(&mut self, id: Id) -> Result<(), c_int> {
        let p = self.held(id)?;
        let mut a = ibv_qp_init_attr {
            qp_context: std::ptr::null_mut(),
            send_cq: std::ptr::null_mut(),
            recv_cq: std::ptr::null_mut(),
            srq: std::ptr::null_mut(),
            cap: ibv_qp_cap {
                max_send_wr: 4,
                max_recv_wr: 4,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            // SAFETY: a live id the application holds.
            qp_type: unsafe { (*p).qp_type },
            sq_sig_all: 0,
        };
        errno_of(crate::rdma_create_qp(p, std::ptr::null_mut(), &mut a))
    }

    /// `rdma_destroy_qp` (nothing without a QP). Errors: EINVAL for an id not held.
    pub fn destroy_qp(&mut self, id: Id) -> Result<(), c_int> {
        crate::rdma_destroy_qp(self.held(id)?);
        Ok(())
    }

    /// The application moves the id's QP to ERR itself (`ibv_modify_qp`), as a program
    /// that tears its QP down before rdma_cm is done with it does.
    /// Errors: EINVAL without a QP; the errno of `ibv_modify_qp`.
    pub fn qp_to_err(&mut self, id: Id) -> Result<(), c_int> {
        let p = self.held(id)?;
        // SAFETY: a live id the application holds.
        let qp = unsafe { (*p).qp };
        if qp.is_null() {
            return Err(libc::EINVAL);
        }
        let mut a = ibv_qp_attr {
            qp_state: IBV_QPS_ERR,
            ..Default::default()
        };
        let ibv = ibv()?;
        // SAFETY: the id's live QP and attributes on our stack.
        match unsafe { (ibv.modify_qp)(qp, &mut a, IBV_QP_STATE) } {
            0 => Ok(()),
            e => Err(e),
        }
    }

    /// The local port of `id`'s address (`rdma_get_src_port`), 0 when unbound.
    pub fn local_port(&self, id: Id) -> u16 {
        self.held(id)
            .map_or(0, |p| u16::from_be(crate::rdma_get_src_port(p)))
    }

    /// The engine's state of `id`'s connection, `None` when it has none (or the engine
    /// forgot it).
    pub fn conn_state(&self, id: Id) -> Option<CmState> {
        let st = state().ok()?;
        let comm = st.ids.get(&id.0)?.comm?;
        st.devs.first()?.open.as_ref()?.cm.state(comm)
    }

    /// Takes the next event of the application's channel (`rdma_get_cm_event`), checks it
    /// and acks it (`rdma_ack_cm_event`); a CONNECT_REQUEST's new id is the application's
    /// from then on. `Ok(None)`: nothing queued.
    /// Errors: the event names an id that is not live (or, for CONNECT_REQUEST, a listener
    /// that is not live and listening, or a new id the application already held); an id the
    /// application never held; private data outside the event; `rdma_get_cm_event` failed
    /// with something else than EAGAIN.
    pub fn poll_event(&mut self) -> Result<Option<EventView>, String> {
        let mut ev: *mut rdma_cm_event = std::ptr::null_mut();
        if crate::rdma_get_cm_event(self.channel, &mut ev) != 0 {
            return match softroce_cabi::errno() {
                libc::EAGAIN => Ok(None),
                e => Err(format!("rdma_get_cm_event failed with errno {e}")),
            };
        }
        let view = self.check_event(ev);
        crate::rdma_ack_cm_event(ev);
        let view = view?;
        if view.event == event::CONNECT_REQUEST {
            self.known.push(view.id.0);
        }
        Ok(Some(view))
    }

    /// [`Bench::poll_event`]'s checks of event `ev`, handed out and not acked yet.
    fn check_event(&self, ev: *mut rdma_cm_event) -> Result<EventView, String> {
        // SAFETY: an event rdma_get_cm_event just handed out: one of the library's boxed
        // `Event`s (its `ev` first), live until acked.
        let e = unsafe { &*ev.cast::<Event>() };
        let (id, listen, kind) = (e.ev.id as usize, e.ev.listen_id as usize, e.ev.event);
        // SAFETY: writing and reading the `conn` member: the private data fields sit at the
        // same offsets in both members (set_private).
        let (data, len) = unsafe {
            (
                e.ev.param.conn.private_data,
                usize::from(e.ev.param.conn.private_data_len),
            )
        };
        let name = format!("event {kind} (status {}) of id {id:#x}", e.ev.status);
        if !(data.is_null() && len == 0 || data == e.data.as_ptr().cast() && len > 0) {
            return Err(format!(
                "{name}: private data {data:p} + {len} is not the event's"
            ));
        }
        let st = state().map_err(|e| format!("no state: errno {e}"))?;
        check_event_id(&st, &name, (id, listen, kind), &self.known)?;
        if kind != event::CONNECT_REQUEST {
            if listen != 0 {
                return Err(format!("{name}: a listener {listen:#x}"));
            }
            if !self.known.contains(&id) {
                return Err(format!("{name}: an id the application does not hold"));
            }
        }
        Ok(EventView {
            event: kind,
            status: e.ev.status,
            id: Id(id),
            listen_id: (listen != 0).then_some(Id(listen)),
            private_data: e.data[..len].to_vec(),
        })
    }

    /// Checks the library against itself, its engine and its device (module doc); call it
    /// with every event taken ([`Bench::poll_event`]).
    /// Errors: a description of the first inconsistency.
    pub fn check_invariants(&self) -> Result<(), String> {
        let panics = PANICS.load(Ordering::SeqCst);
        if panics != self.panics {
            return Err(format!(
                "{} panics (caught at an FFI boundary: see stderr)",
                panics - self.panics
            ));
        }
        let st = state().map_err(|e| format!("no state: errno {e}"))?;
        let o = st
            .devs
            .first()
            .and_then(|d| d.open.as_ref())
            .ok_or("the device is not open")?;
        let mem = MEM.lock();
        let m = mem.as_ref().ok_or("no device")?;
        if let Some(v) = m.violations.first() {
            return Err(format!("libibverbs call: {v}"));
        }
        o.cm.check_invariants()
            .map_err(|e| format!("engine: {e}"))?;
        let waiting = queued(self.channel);
        check_queued(&st, &waiting, &self.known)?;
        check_ids(&st, o, &self.known, &waiting)?;
        check_connections(o)?;
        check_listens(&st, o, m, now())?;
        check_qps(&st, o, m, &self.known)
    }

    /// Destroys every id (QP first) and the channel, then checks that nothing was left:
    /// no id in the library's table, no libibverbs object but the device's PD, no
    /// [`Bench::check_invariants`] failure on the way. The library's state is then empty.
    /// Errors: what was left or broken.
    pub fn finish(mut self) -> Result<(), String> {
        self.teardown()
    }

    fn teardown(&mut self) -> Result<(), String> {
        if std::mem::replace(&mut self.finished, true) {
            return Ok(());
        }
        let mut first_err = self.check_invariants().err();
        // One live id at a time: destroying one may destroy others (a listener's untaken
        // requests).
        let live = || {
            let st = state().ok()?;
            st.ids.iter().find(|(_, s)| !s.destroyed).map(|(&a, _)| a)
        };
        for _ in 0..4096 {
            let Some(a) = live() else { break };
            let p = a as *mut rdma_cm_id;
            crate::rdma_destroy_qp(p);
            if crate::rdma_destroy_id(p) != 0 {
                first_err.get_or_insert(format!("rdma_destroy_id of {a:#x} failed at the end"));
                break;
            }
        }
        self.known.clear();
        // Destroying an id drops its queued events: none may be left.
        for _ in 0..1024 {
            match self.poll_event() {
                Ok(None) => break,
                Ok(Some(_)) | Err(_) => {
                    if first_err.is_none() {
                        first_err = Some("an event queued for a destroyed id".into());
                    }
                }
            }
        }
        crate::rdma_destroy_event_channel(self.channel);
        let left = state().map_or(0, |st| st.ids.len());
        if left != 0 && first_err.is_none() {
            first_err = Some(format!("{left} ids left in the library's table"));
        }
        if let Some(l) = MEM.lock().as_ref().and_then(Mem::leftovers)
            && first_err.is_none()
        {
            first_err = Some(format!("libibverbs: the library {l}"));
        }
        let empty = State {
            devs: Vec::new(),
            ids: HashMap::new(),
            rng: softroce::rand::SplitMix64::new(0),
            last_mc: 0,
        };
        drop(replace_state(empty));
        *MEM.lock() = None;
        BENCH_NOW.store(0, Ordering::SeqCst);
        first_err.map_or(Ok(()), Err)
    }
}

impl Drop for Bench {
    fn drop(&mut self) {
        // A bench dropped without `finish` (its harness failed) still leaves the process's
        // library empty for the next one; what it finds is not reported.
        let _ = self.teardown();
    }
}

/// What every event (handed out or waiting; `event`: id, listener, kind) must name: a live
/// id, and for a CONNECT_REQUEST a live listener and an id the application (`known`) does
/// not hold yet. `name` starts each error.
fn check_event_id(
    st: &State,
    name: &str,
    (id, listen, kind): (usize, usize, c_int),
    known: &[usize],
) -> Result<(), String> {
    if st.ids.get(&id).is_none_or(|s| s.destroyed) {
        return Err(format!("{name}: its id is not live"));
    }
    if kind == event::CONNECT_REQUEST {
        if !st
            .ids
            .get(&listen)
            .is_some_and(|s| !s.destroyed && s.listening)
        {
            return Err(format!(
                "{name}: listener {listen:#x} is not a live listener"
            ));
        }
        if known.contains(&id) {
            return Err(format!("{name}: a CONNECT_REQUEST for an id already held"));
        }
    }
    Ok(())
}

/// Every event waiting on the application's channel (`waiting`: id, listener, kind)
/// names a live id: a CONNECT_REQUEST a new one (not held yet) and a live listener, any
/// other event an id the application holds or one an earlier CONNECT_REQUEST hands over.
fn check_queued(
    st: &State,
    waiting: &[(usize, usize, c_int)],
    known: &[usize],
) -> Result<(), String> {
    for (i, &(id, listen, kind)) in waiting.iter().enumerate() {
        let name = format!("queued event {kind} of id {id:#x}");
        check_event_id(st, &name, (id, listen, kind), known)?;
        if kind != event::CONNECT_REQUEST {
            let handed = waiting[..i]
                .iter()
                .any(|&(e, _, k)| e == id && k == event::CONNECT_REQUEST);
            if listen != 0 || !(known.contains(&id) || handed) {
                return Err(format!(
                    "{name}: listener {listen:#x}, or an id nobody holds"
                ));
            }
        }
    }
    Ok(())
}

/// Every id the library holds (not destroyed) is one the application holds or one that a
/// waiting CONNECT_REQUEST hands over, and every id the application holds is live; no
/// destroyed id is left (every event is acked); each id's connection is the device's entry
/// for it, and each entry names a live id holding it.
fn check_ids(
    st: &State,
    o: &OpenDev,
    known: &[usize],
    waiting: &[(usize, usize, c_int)],
) -> Result<(), String> {
    for (&a, s) in &st.ids {
        if s.destroyed {
            return Err(format!(
                "id {a:#x}: destroyed, all its events acked, still held"
            ));
        }
        let handed = waiting
            .iter()
            .any(|&(e, _, k)| e == a && k == event::CONNECT_REQUEST);
        if !known.contains(&a) && !handed {
            return Err(format!(
                "id {a:#x}: live, but the application was never given it"
            ));
        }
        if let Some(c) = s.comm
            && o.comms.get(&c) != Some(&a)
        {
            return Err(format!(
                "id {a:#x} holds connection {:#x}, which the device gives to {:?}",
                c.0,
                o.comms.get(&c)
            ));
        }
    }
    if let Some(a) = known.iter().find(|a| !st.ids.contains_key(a)) {
        return Err(format!(
            "id {a:#x}: held by the application, gone from the library"
        ));
    }
    for (c, &a) in &o.comms {
        match st.ids.get(&a) {
            Some(s) if s.comm == Some(*c) && s.dev == Some(0) => {}
            _ => {
                return Err(format!(
                    "connection {:#x} names id {a:#x}, which does not hold it",
                    c.0
                ));
            }
        }
        if o.cm.state(*c).is_none() {
            return Err(format!(
                "id {a:#x} holds connection {:#x}, which the engine forgot",
                c.0
            ));
        }
    }
    Ok(())
}

/// Every connection of the engine belongs to an id or a parked request, or is in one of
/// [`ORPHAN_STATES`]; a parked request is a request (REQ_RCVD, MRA_REQ_SENT) of a
/// lingering service that no id holds.
fn check_connections(o: &OpenDev) -> Result<(), String> {
    let parked = |c: CommId| o.parked.iter().any(|p| p.comm == c);
    for (c, s) in o.cm.connections() {
        if !o.comms.contains_key(&c) && !parked(c) && !ORPHAN_STATES.contains(&s) {
            return Err(format!("connection {:#x} in {s:?} belongs to no id", c.0));
        }
    }
    for p in &o.parked {
        let s = o.cm.state(p.comm);
        if !matches!(s, Some(CmState::ReqRcvd | CmState::MraReqSent))
            || o.comms.contains_key(&p.comm)
            || !o.lingering.contains_key(&p.req.service_id)
        {
            return Err(format!(
                "parked request {:#x} ({s:?}) for service {:#x}: not a request of a lingering \
                 service that no id holds",
                p.comm.0, p.req.service_id
            ));
        }
    }
    Ok(())
}

/// The engine listens on a service ID exactly when the device steers it here, and when a
/// live id listens on it or it lingers (held after rdma_bind_addr or after its last
/// listener, until a time still ahead at `now`).
fn check_listens(st: &State, o: &OpenDev, m: &Mem, now: Instant) -> Result<(), String> {
    let mut wanted: Vec<u64> = o.lingering.keys().copied().collect();
    for (&a, s) in &st.ids {
        if s.listening && !s.destroyed {
            let scope = st.service_scope(a as *mut rdma_cm_id, {
                // SAFETY: every key of `ids` is a live boxed rdma_cm_id.
                unsafe { (*(a as *mut rdma_cm_id)).ps }
            });
            wanted.extend(scope.map(|(sid, _)| sid));
        }
    }
    for (&sid, &until) in &o.lingering {
        if until <= now {
            return Err(format!(
                "service {sid:#x} lingers until {until:?}, past (now {now:?})"
            ));
        }
    }
    let listened: Vec<u64> = o.cm.listened().map(|(sid, _)| sid).collect();
    for sid in &wanted {
        if !listened.contains(sid) || !m.steered.contains(sid) {
            return Err(format!(
                "service {sid:#x} is listened on or lingers, but the engine listens: {}, the \
                 device steers it here: {}",
                listened.contains(sid),
                m.steered.contains(sid)
            ));
        }
    }
    for sid in listened.iter().chain(&m.steered) {
        if !wanted.contains(sid) || listened.contains(sid) != m.steered.contains(sid) {
            return Err(format!(
                "service {sid:#x}: engine listens {}, device steers {}, an id listens or it \
                 lingers {}",
                listened.contains(sid),
                m.steered.contains(sid),
                wanted.contains(sid)
            ));
        }
    }
    Ok(())
}

/// Every id's QP is a live QP of the device; an RC QP that reached RTR for a connection
/// whose peer QPN the engine knows was given that QPN.
fn check_qps(st: &State, o: &OpenDev, m: &Mem, known: &[usize]) -> Result<(), String> {
    for &a in known {
        // SAFETY: ids the application holds are live (check_ids).
        let qp = unsafe { (*(a as *mut rdma_cm_id)).qp };
        if qp.is_null() {
            continue;
        }
        let Some(rec) = m.qps.get(&(qp as usize)) else {
            return Err(format!("id {a:#x}: its QP {qp:p} is not a live QP"));
        };
        let comm = st.ids.get(&a).and_then(|s| s.comm);
        let want = comm.and_then(|c| o.cm.remote_qpn(c));
        if let (Some(have), Some(want)) = (rec.dest_qpn, want)
            && matches!(rec.state, IBV_QPS_RTR | IBV_QPS_RTS)
            && have != want
        {
            return Err(format!(
                "id {a:#x}: its QP is at RTR/RTS to QPN {have:#x}, its connection's peer QPN \
                 is {want:#x}"
            ));
        }
    }
    Ok(())
}
