//! The CM driver: per opened device ([`State::open`]), a `CmEngine` and one thread running
//! the engine's CM loop (`softroce::net::cm_loop`) over QP1 (`softroce_mad_recv` with the
//! engine's next timer as timeout): it feeds the MADs and timers to the engine, and
//! [`pump`]s: its events become rdma_cm events (applying
//! the REP to the id's QP as librdmacm does; a REQ or SIDR_REQ makes a passive id,
//! `requests.rs`), its MADs go onto QP1 (`softroce_mad_send`). Entry points pump too, after
//! calling the engine. Ending a connection, whoever ends it, is [`end_connection`].
//!
//! No silent hang: a driver thread that panics, or whose device failed, fails its device
//! ([`fail_device`]).
//!
//! Sources: kernel `drivers/infiniband/core/cma.c` (`cma_sidr_rep_handler`, the events of a
//! connection), `cm.c` (`cm_destroy_id`).

use super::addr::{sockaddr_of, ud_ah_attr, write_sockaddr};
use super::events::{Event, new_event, post, set_private};
use super::requests::{SIDR_REP_PRIVATE, connect_request, sidr_request};
use super::state::{OpenDev, State, clock, errno_or, now, state};
use super::transitions::{RDMA_UDP_QKEY, qp_rtr, qp_rts};
use crate::abi::*;
use crate::ibv::ibv;
use core::ffi::c_int;
use softroce::cm::rdma_cm::{
    REJ_PRIVATE_DATA_LEN as REJ_PRIVATE, REP_PRIVATE_DATA_LEN as REP_PRIVATE,
};
use softroce::cm::{CmConfig, CmEngine, CmEvent, CmState, CommId};
use softroce::net::cm_loop::{CM_TICK, LoopEnd};
use softroce::net::standin::StandIn;
use softroce::transport::Instant;
use softroce::verbs::RcConnect;
use softroce::wire::cm::{SidrRepRepr, SidrStatus};
use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

impl State {
    /// Opens device `i` (context, PD, CM engine, QP1 port, driver thread) if not yet open.
    /// Errors: `EIO` once the device failed ([`fail_device`]); those of opening it.
    pub(super) fn open(&mut self, i: usize) -> Result<&mut OpenDev, c_int> {
        if self.devs[i].failed.is_some() {
            return Err(libc::EIO);
        }
        if self.devs[i].open.is_none() {
            let ibv = ibv()?;
            let d = &self.devs[i];
            // SAFETY: `ibv_dev` is from libibverbs' list; the calls follow their prototypes.
            let (ctx, pd, guid, mtu) = unsafe {
                let _ = super::state::OPENING_DEVICE.try_with(|o| o.set(true));
                let ctx = (ibv.open_device)(d.ibv_dev);
                let _ = super::state::OPENING_DEVICE.try_with(|o| o.set(false));
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
            // Started before the driver thread: it must exist before any connection does.
            let standin = match StandIn::start(self.devs[i].ip) {
                Ok(s) => Some(s),
                Err(e) => {
                    tracing::warn!(
                        target: "softroce::cm",
                        "no stand-in for {}: {e}; a connection this process leaves open \
                         when it dies is not ended for its peer",
                        self.devs[i].ip
                    );
                    None
                }
            };
            let seed = self.random();
            let mut config = CmConfig::new(self.devs[i].ip, guid, seed);
            // On a shared device the comm IDs carry the process's slot, so that the
            // device's steering brings the peers' answers here (softroce::net::steer).
            // SAFETY: a context opened above.
            let slot = unsafe { (ibv.cm_slot)(ctx) };
            config.comm_id_slot = u8::try_from(slot).ok().filter(|&s| s != 0);
            let cm = CmEngine::new(config);
            self.devs[i].open = Some(OpenDev {
                ctx,
                pd,
                cm,
                comms: HashMap::new(),
                mtu,
                lingering: HashMap::new(),
                parked: Vec::new(),
                standin,
            });
            let name = self.devs[i].name.clone();
            start_driver(i, ctx as usize, &name)?;
        }
        self.devs[i].open.as_mut().ok_or(libc::ENODEV)
    }
}

/// Fails device `dev` for `why`: every live id on it (and, once every device failed, every
/// listener on the wildcard address) gets RDMA_CM_EVENT_DEVICE_REMOVAL with status `-EIO`
/// (a synchronous id's waiting call returns EIO), and later calls that need the device fail
/// with EIO ([`State::open`]). The kernel's rdma_cm sends the same
/// event when a device goes away (cma.c `cma_process_remove`), with status 0; the status
/// says here that the id cannot be used any more (spec/deviations.toml).
fn fail_device(dev: usize, why: String) {
    let Ok(mut st) = state() else { return };
    let Some(d) = st.devs.get_mut(dev) else {
        return;
    };
    if d.failed.is_some() {
        return;
    }
    d.failed = Some(why);
    // A listener on the wildcard address listens on every device: it is told once none is
    // left (the kernel's wildcard listener, too, keeps listening on the other devices).
    let none_left = st.devs.iter().all(|d| d.failed.is_some());
    let ids: Vec<usize> = st
        .ids
        .iter()
        .filter(|(_, s)| {
            !s.destroyed && (s.dev == Some(dev) || (none_left && s.dev.is_none() && s.listening))
        })
        .map(|(&id, _)| id)
        .collect();
    for id in ids {
        post(new_event(
            id as *mut rdma_cm_id,
            event::DEVICE_REMOVAL,
            -libc::EIO,
        ));
    }
}

/// librdmacm's side of the CM loop ([`softroce::net::cm_loop`]) for device `dev` (context
/// `ctx`): waits on QP1 through `softroce_mad_recv`, feeds the MAD (or the ICMP
/// "unreachable") and the due timers to the engine, ends lingering listeners, and pumps.
/// Stops when the state or the device is gone; fails when `softroce_mad_recv` says EIO (the
/// device failed). Panics (only) when the test hook `SOFTROCE_TEST_PANIC=rdmacm:<ms>` asks
/// it to.
pub(super) struct Driver {
    dev: usize,
    /// The device's `ibv_context`, open for the life of the process.
    ctx: usize,
    ibv: &'static crate::ibv::Ibv,
    panic_at: Option<std::time::Instant>,
    mad: [u8; 256],
}

impl Driver {
    /// The driver of device `dev` (context `ctx`), with the test hook's panic time if
    /// `SOFTROCE_TEST_PANIC` asks for one. What [`start_driver`]'s thread runs, and what the
    /// in-memory bench (`cma::testing`, feature `testing`) runs one round at a time
    /// (`softroce::net::cm_loop::run_once`). Errors: ENODEV without libibverbs.so.1.
    pub(super) fn new(dev: usize, ctx: usize) -> Result<Driver, c_int> {
        Ok(Driver {
            dev,
            ctx,
            ibv: ibv()?,
            panic_at: softroce::net::panic::test_panic_delay("rdmacm")
                .map(|d| std::time::Instant::now() + d),
            mad: [0; 256],
        })
    }
}

/// What one `softroce_mad_recv` gave: its result (1 a MAD, 2 an ICMP "unreachable", 0
/// nothing, < 0 an error) and the sender.
pub(super) struct Recv {
    got: c_int,
    from: Option<SocketAddr>,
}

impl softroce::net::cm_loop::CmLoop for Driver {
    type Input = Recv;

    fn next_timer(&mut self) -> Result<Option<Instant>, LoopEnd> {
        let mut st = state().map_err(|_| LoopEnd::Stopped)?;
        // The test hook (nothing else sets it): the one panic here is the one a test asks
        // for, with the state's lock held, as a real one could be.
        if self
            .panic_at
            .is_some_and(|t| std::time::Instant::now() >= t)
        {
            panic!("panic injected by a test (SOFTROCE_TEST_PANIC)");
        }
        let o = st.devs[self.dev].open.as_mut().ok_or(LoopEnd::Stopped)?;
        Ok(o.cm.poll_timeout())
    }

    fn wait(&mut self, timeout: std::time::Duration) -> Result<Recv, LoopEnd> {
        // SAFETY: zeroed sockaddr_storage is valid.
        let mut src: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        let ms = c_int::try_from(timeout.as_millis()).unwrap_or(c_int::MAX);
        // SAFETY: `ctx` is the device's context, open for the life of the process; `mad`
        // holds 256 bytes.
        let got = unsafe {
            (self.ibv.mad_recv)(
                self.ctx as *mut ibv_context,
                self.mad.as_mut_ptr().cast(),
                &mut src,
                ms,
            )
        };
        if got < 0 {
            if errno_or(0) == libc::EIO {
                // The device failed (its driver thread panicked): QP1 is gone.
                return Err(LoopEnd::Failed("its device failed".to_string()));
            }
            std::thread::sleep(CM_TICK);
        }
        let from = sockaddr_of((&src as *const libc::sockaddr_storage).cast()).ok();
        Ok(Recv { got, from })
    }

    fn turn(&mut self, t: Instant, r: Recv) -> Result<(), LoopEnd> {
        let mut st = state().map_err(|_| LoopEnd::Stopped)?;
        let o = st.devs[self.dev].open.as_mut().ok_or(LoopEnd::Stopped)?;
        match (r.got, r.from) {
            (1, Some(from)) => o.cm.handle_mad(t, from.ip(), &self.mad),
            // ICMP said that address has no RoCE device: its connects end now.
            (2, Some(from)) => {
                o.cm.handle_unreachable(t, from.ip());
            }
            _ => {}
        }
        if o.cm.poll_timeout().is_some_and(|d| d <= t) {
            o.cm.handle_timeout(t);
        }
        end_lingers(o, t);
        pump(&mut st, self.dev);
        Ok(())
    }
}

/// Starts device `dev`'s CM driver thread (context `ctx`) on [`softroce::net::cm_loop`]. No
/// silent hang: when it panics (reported on stderr and through `tracing`) or finds the
/// device failed, the device fails ([`fail_device`]), so that no caller waits for an event
/// that will not come.
/// Errors: `EAGAIN` when the thread cannot start.
fn start_driver(dev: usize, ctx: usize, name: &str) -> Result<(), c_int> {
    let driver = Driver::new(dev, ctx)?;
    softroce::net::cm_loop::spawn(
        format!("softroce-cm-{name}"),
        format!("librdmacm CM driver thread of device {name}"),
        "its rdma_cm ids get DEVICE_REMOVAL and their calls fail with EIO",
        driver,
        clock(),
        move |why| fail_device(dev, why),
    )
    .map(|_| ())
    .map_err(|_| libc::EAGAIN)
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
        if let Ok(ibv) = ibv() {
            // SAFETY: the device's open context.
            unsafe { (ibv.cm_listen)(o.ctx, sid, 0) };
        }
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
pub(super) fn pump(st: &mut State, dev: usize) {
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

/// Tells device `o`'s stand-in what ends connection `comm` for its peer should this
/// process die now: the engine's DREQ (ESTABLISHED) or DREP (DREQ_RCVD), or nothing (any
/// other state, or the connection is gone). Call after every change of the connection's
/// state that the frontend sees (its events, rdma_disconnect, [`end_connection`]).
pub(super) fn stand_in_sync(o: &OpenDev, comm: CommId) {
    let Some(s) = &o.standin else { return };
    let r = match o.cm.exit_mad(comm) {
        Some(m) => s.arm(comm.0, &m),
        None => s.disarm(comm.0),
    };
    if let Err(e) = r {
        tracing::debug!(
            target: "softroce::cm",
            comm_id = %format_args!("{:#x}", comm.0),
            "the stand-in did not take the connection: {e}"
        );
    }
}

/// What the engine is told when a connection ends ([`end_connection`]).
pub(super) enum End<'a> {
    /// Nothing: the engine ended it itself (a REJ came, the peer did not answer, TimeWait
    /// is over, the SIDR_REP came).
    Ended,
    /// A REJ with this private data (rdma_reject; a REP our QP could not take).
    Reject(&'a [u8]),
    /// A SIDR_REP (rdma_accept or rdma_reject of a SIDR request).
    SidrRep {
        status: SidrStatus,
        qpn: u32,
        qkey: u32,
        private_data: &'a [u8],
    },
    /// The id is destroyed: its connection ends as the kernel's `cm_destroy_id` ends it,
    /// by its state in the engine ([`destroyed_in_engine`]), so that none is left that only
    /// the gone id could end: a connect not answered yet is abandoned, a request or a REP
    /// not answered is refused, a connection not disconnected is disconnected. What the
    /// engine says is ignored.
    Destroyed,
}

/// Ends connection `comm` of id `addr` on device `dev` at time `now`: the engine is told
/// as `how` says, then the id forgets the connection and the device whose it was (later
/// engine events for it find no id). The caller then queues the id's event or pumps.
/// Errors: those of the engine's REJ or SIDR_REP, as errnos: the engine refused (the
/// connection is in no state to be rejected or answered), and nothing changed, the id
/// keeps its connection. Before, the id forgot it first, so an `rdma_reject` of an
/// established connection left it in the engine with no id (found by the rdmacm_driver
/// fuzz target).
pub(super) fn end_connection(
    st: &mut State,
    dev: usize,
    addr: usize,
    comm: CommId,
    now: Instant,
    how: End<'_>,
) -> Result<(), c_int> {
    if let Some(o) = st.devs[dev].open.as_mut() {
        end_in_engine(o, comm, now, how)?;
        o.comms.remove(&comm);
        stand_in_sync(o, comm);
    }
    if let Some(s) = st.ids.get_mut(&addr) {
        s.comm = None;
    }
    Ok(())
}

/// [`end_connection`]'s part in the engine, as `how` says.
fn end_in_engine(o: &mut OpenDev, comm: CommId, now: Instant, how: End<'_>) -> Result<(), c_int> {
    match how {
        End::Ended => Ok(()),
        End::Reject(data) => o.cm.reject(now, comm, data).map_err(|e| e.errno()),
        End::SidrRep {
            status,
            qpn,
            qkey,
            private_data,
        } => {
            o.cm.sidr_reply(now, comm, status, qpn, qkey, private_data)
                .map_err(|e| e.errno())
        }
        End::Destroyed => {
            destroyed_in_engine(&mut o.cm, comm, now);
            Ok(())
        }
    }
}

/// [`End::Destroyed`]: ends connection `comm` of a destroyed id as the kernel's
/// `cm_destroy_id` does, by its state in `cm`:
/// - a connect not answered yet is abandoned: REQ_SENT, MRA_REQ_RCVD: REJ (timeout);
///   SIDR_REQ_SENT: forgotten (`CmEngine::cancel`);
/// - a request or a REP not answered is refused: REQ_RCVD, MRA_REQ_SENT, REP_RCVD: REJ
///   (consumer defined), also after an `rdma_accept` that failed before its REP;
///   SIDR_REQ_RCVD: SIDR_REP (reject);
/// - a connection the application did not disconnect is disconnected: ESTABLISHED: DREQ;
///   DREQ_RCVD: the DREP the peer waits for (perftest's server destroys its ids without
///   rdma_disconnect; without the DREP rxe retries its DREQ and rejects the next REQ from
///   the same QPN as stale, REJ 10); REP_SENT, MRA_REP_RCVD (accepted, no RTU yet): DREQ,
///   where the kernel sends a REJ, because a peer whose RTU is on its way is ESTABLISHED,
///   where softroce's engine drops a REJ (the kernel's takes it), and either answers a
///   DREQ (spec/deviations.toml);
/// - DREQ_SENT and TIMEWAIT end by their own timers.
///
/// Before, only a request the id still held and ESTABLISHED / DREQ_RCVD were ended: a
/// destroyed id's pending connect, unanswered REP or accepted connection stayed in the
/// engine with no id, and a REP or RTU then left it waiting forever for an application
/// that was gone (found by the rdmacm_driver fuzz target).
fn destroyed_in_engine(cm: &mut CmEngine, comm: CommId, now: Instant) {
    let _ = match cm.state(comm) {
        Some(CmState::ReqSent | CmState::MraReqRcvd | CmState::SidrReqSent) => cm.cancel(now, comm),
        Some(CmState::ReqRcvd | CmState::MraReqSent | CmState::RepRcvd) => {
            cm.reject(now, comm, &[])
        }
        Some(CmState::SidrReqRcvd) => cm.sidr_reply(now, comm, SidrStatus::REJECT, 0, 0, &[]),
        Some(CmState::Established | CmState::DreqRcvd | CmState::RepSent | CmState::MraRepRcvd) => {
            cm.disconnect(now, comm)
        }
        Some(CmState::Idle | CmState::DreqSent | CmState::Timewait) | None => Ok(()),
    };
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
    let path_mtu = o.path_mtu();
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
                path_mtu,
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
                    let _ = end_connection(st, dev, addr, comm, t, End::Reject(&[]));
                    post(new_event(id, event::CONNECT_ERROR, -e));
                }
            }
        }
        CmEvent::Established { .. } => {
            stand_in_sync(o, comm);
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
            let _ = end_connection(st, dev, addr, comm, t, End::Ended);
            let mut e = new_event(id, event::REJECTED, c_int::from(reason.0));
            set_private(&mut e, &private_data[..REJ_PRIVATE]);
            post(e);
        }
        CmEvent::Unreachable { .. } => {
            let _ = end_connection(st, dev, addr, comm, t, End::Ended);
            post(new_event(id, event::UNREACHABLE, -libc::ETIMEDOUT));
        }
        CmEvent::Disconnected { .. } => {
            stand_in_sync(o, comm);
            post(new_event(id, event::DISCONNECTED, 0))
        }
        CmEvent::TimewaitExit { .. } => {
            let _ = end_connection(st, dev, addr, comm, t, End::Ended);
            post(new_event(id, event::TIMEWAIT_EXIT, 0));
        }
        CmEvent::SidrResponse { rep, .. } => {
            let _ = end_connection(st, dev, addr, comm, t, End::Ended);
            let Some(s) = st.ids.get(&addr) else {
                return;
            };
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

#[cfg(test)]
mod tests {
    use super::*;
    use softroce::cm::{AcceptParams, ConnectParams};
    use softroce::wire::cm::{CmMadRepr, CmMsgRepr, RejReason, port_space, rdma_cm_service_id};

    const L: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2));
    const P: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));
    const TCP: u64 = rdma_cm_service_id(port_space::TCP, 7174);
    const UDP: u64 = rdma_cm_service_id(port_space::UDP, 7174);

    /// The library's engine L and a peer's P, both listening on TCP and UDP port 7174.
    fn pair() -> (CmEngine, CmEngine) {
        let mut l = CmEngine::new(CmConfig::new(L, 1, 1));
        let mut p = CmEngine::new(CmConfig::new(P, 2, 2));
        for e in [&mut l, &mut p] {
            e.listen(TCP).unwrap();
            e.listen(UDP).unwrap();
        }
        (l, p)
    }

    /// Hands `from`'s MADs (sent from `ip`) to `to`; drops both sides' events.
    fn pass(from: &mut CmEngine, ip: IpAddr, to: &mut CmEngine) {
        while let Some(m) = from.poll_mad() {
            to.handle_mad(Instant::ZERO, ip, &m.mad[..]);
        }
        while from.poll_event().is_some() || to.poll_event().is_some() {}
    }

    fn connect(e: &mut CmEngine, peer: IpAddr) -> CommId {
        let to = SocketAddr::new(peer, 7174);
        let from = SocketAddr::new(e.config().local_ip, 40000);
        let c = ConnectParams::rdma_cm(from, to, port_space::TCP, 0x11, 1, 3, &[]).unwrap();
        e.connect(Instant::ZERO, &c).unwrap()
    }

    fn accept(e: &mut CmEngine, id: CommId) {
        let a = AcceptParams {
            local_qpn: 0x22,
            starting_psn: 2,
            responder_resources: 0,
            initiator_depth: 0,
            target_ack_delay: 0,
            rnr_retry_count: 7,
            srq: false,
            private_data: Vec::new(),
        };
        e.accept(Instant::ZERO, id, &a).unwrap();
    }

    /// The only connection of `e`.
    fn only(e: &CmEngine) -> CommId {
        let c: Vec<_> = e.connections().collect();
        assert_eq!(c.len(), 1, "{c:?}");
        c[0].0
    }

    /// Destroys L's connection `id` in `state`: what L sends, and its state after.
    fn destroy(l: &mut CmEngine, id: CommId, state: CmState) -> (Vec<CmMsgRepr>, Option<CmState>) {
        assert_eq!(l.state(id), Some(state));
        while l.poll_mad().is_some() {}
        destroyed_in_engine(l, id, Instant::ZERO);
        let mut sent = Vec::new();
        while let Some(m) = l.poll_mad() {
            sent.push(CmMadRepr::parse(&m.mad[..]).unwrap().msg);
        }
        (sent, l.state(id))
    }

    fn rej_reason(sent: &[CmMsgRepr]) -> Option<RejReason> {
        match sent {
            [CmMsgRepr::Rej(r)] => Some(r.reason),
            _ => None,
        }
    }

    // kernel cm_destroy_id: every state of a destroyed id's connection is ended, none is
    // left for an application that is gone.
    #[test]
    fn a_destroyed_ids_connection_ends_in_every_state() {
        // Active: REQ_SENT (REJ timeout), REP_RCVD (REJ), ESTABLISHED (DREQ).
        let (mut l, mut p) = pair();
        let id = connect(&mut l, P);
        let (sent, after) = destroy(&mut l, id, CmState::ReqSent);
        assert_eq!((rej_reason(&sent), after), (Some(RejReason::TIMEOUT), None));

        let (mut l, mut p2) = pair();
        let id = connect(&mut l, P);
        pass(&mut l, L, &mut p2);
        let pid = only(&p2);
        accept(&mut p2, pid);
        pass(&mut p2, P, &mut l);
        let (sent, after) = destroy(&mut l, id, CmState::RepRcvd);
        assert_eq!(
            (rej_reason(&sent), after),
            (Some(RejReason::CONSUMER_DEFINED), None)
        );

        let (mut l, mut p3) = pair();
        let id = connect(&mut l, P);
        pass(&mut l, L, &mut p3);
        let pid = only(&p3);
        accept(&mut p3, pid);
        pass(&mut p3, P, &mut l);
        l.establish(Instant::ZERO, id).unwrap();
        pass(&mut l, L, &mut p3);
        let (sent, after) = destroy(&mut l, id, CmState::Established);
        assert!(matches!(sent[..], [CmMsgRepr::Dreq(_)]), "{sent:?}");
        assert_eq!(after, Some(CmState::DreqSent));

        // Passive: REQ_RCVD (REJ), REP_SENT (DREQ), DREQ_RCVD (DREP).
        let (mut l, _) = pair();
        connect(&mut p, L);
        pass(&mut p, P, &mut l);
        let id = only(&l);
        let (sent, after) = destroy(&mut l, id, CmState::ReqRcvd);
        assert_eq!(
            (rej_reason(&sent), after),
            (Some(RejReason::CONSUMER_DEFINED), None)
        );

        let (mut l, mut p) = pair();
        connect(&mut p, L);
        pass(&mut p, P, &mut l);
        let id = only(&l);
        accept(&mut l, id);
        pass(&mut l, L, &mut p);
        let (sent, after) = destroy(&mut l, id, CmState::RepSent);
        assert!(matches!(sent[..], [CmMsgRepr::Dreq(_)]), "{sent:?}");
        assert_eq!(after, Some(CmState::DreqSent));

        let (mut l, mut p) = pair();
        let pid = connect(&mut p, L);
        pass(&mut p, P, &mut l);
        let id = only(&l);
        accept(&mut l, id);
        pass(&mut l, L, &mut p);
        p.establish(Instant::ZERO, pid).unwrap();
        pass(&mut p, P, &mut l);
        p.disconnect(Instant::ZERO, pid).unwrap();
        pass(&mut p, P, &mut l);
        let (sent, after) = destroy(&mut l, id, CmState::DreqRcvd);
        assert!(matches!(sent[..], [CmMsgRepr::Drep(_)]), "{sent:?}");
        assert_eq!(after, Some(CmState::Timewait));

        // SIDR: SIDR_REQ_SENT (forgotten, no message), SIDR_REQ_RCVD (SIDR_REP reject).
        let (mut l, mut p) = pair();
        let id = l.sidr_request(Instant::ZERO, P, UDP, &[]).unwrap();
        let (sent, after) = destroy(&mut l, id, CmState::SidrReqSent);
        assert_eq!((sent.len(), after, l.poll_timeout()), (0, None, None));

        p.sidr_request(Instant::ZERO, L, UDP, &[]).unwrap();
        pass(&mut p, P, &mut l);
        let id = only(&l);
        let (sent, after) = destroy(&mut l, id, CmState::SidrReqRcvd);
        let status = match &sent[..] {
            [CmMsgRepr::SidrRep(r)] => Some(r.status),
            _ => None,
        };
        assert_eq!((status, after), (Some(SidrStatus::REJECT), None));
    }
}
