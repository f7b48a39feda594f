//! Connection setup the rdma_cm way: a listener on a port of the device's address, and a
//! connect to `address:port`, with private data both ways, so that two programs need not
//! swap QP numbers out of band. The same CM engine and the same QP attributes as
//! softroce's librdmacm.so.1 (REQ/REP/RTU over QP1, the rdma_cm IP header, RDMA_PS_TCP
//! service IDs), so a Rust peer connects to a C program on rdma_cm and back.
//!
//! | rdma_cm (librdmacm)                               | here                                 |
//! |---------------------------------------------------|--------------------------------------|
//! | `rdma_bind_addr` + `rdma_listen`                  | [`CmListener::bind`]                 |
//! | `rdma_get_cm_event` → CONNECT_REQUEST             | [`CmListener::get_request`]          |
//! | `rdma_accept` (+ ESTABLISHED)                     | [`ConnectRequest::accept`], [`ConnectRequest::accept_with`] |
//! | `rdma_reject`                                     | [`ConnectRequest::reject`]           |
//! | `rdma_resolve_addr/route` + `rdma_connect` (+ ESTABLISHED) | [`PreparedQueuePair::connect`] |
//! | `rdma_disconnect`, DISCONNECTED                   | [`CmConnection::disconnect`], [`CmConnection::wait_for_disconnect`], drop |
//!
//! Everything protocol is the engine's: [`softroce::cm::CmEngine`] decides what goes on
//! the wire, [`softroce::net::CmDriver`] runs it on the device's QP1, and
//! `RcConnect::rdma_cm_passive` / `rdma_cm_active` turn REQ and REP into QP attributes.
//! The first use of the CM on a device takes over its QP1 (a program that posts on QP1
//! itself should not use this module).

pub use crate::error::Rejected;

use crate::error::{Error, Result};
use crate::{Context, PreparedQueuePair, QueuePair};
use softroce::cm::rdma_cm::{REJ_PRIVATE_DATA_LEN, REP_PRIVATE_DATA_LEN, req_user_private_data};
use softroce::cm::{AcceptParams, CmEvent, CmState, CommId, ConnectParams};
use softroce::net::{CmDriver, UdpDevice};
use softroce::rand::SplitMix64;
use softroce::verbs::{self, PathMtu, QpAttr, QpAttrMask, QpState, QpType, RcConnect};
use softroce::wire::cm::{ReqRepr, port_space, rdma_cm_service_id};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// How long an accept waits for the RTU, a disconnect for the DREP: at most the engine's
/// own bound, which rdma_cm's timers make minutes.
const CM_WAIT: Duration = Duration::from_secs(30);

/// ETIMEDOUT, as librdmacm reports a connect nobody answers (UNREACHABLE).
const ETIMEDOUT: i32 = 110;

fn timed_out(what: String) -> Error {
    Error::Io(std::io::Error::new(std::io::ErrorKind::TimedOut, what))
}

fn cm_error(e: softroce::cm::CmError) -> Error {
    let kind = std::io::Error::from_raw_os_error(e.errno()).kind();
    Error::Io(std::io::Error::new(kind, e.to_string()))
}

/// Moves `qp` to ERR (librdmacm's `rdma_disconnect` does before the DREQ): outstanding work
/// completes flushed.
fn qp_to_error(qp: &verbs::Qp) {
    let attr = QpAttr {
        qp_state: QpState::Err,
        ..QpAttr::default()
    };
    let _ = qp.modify(&attr, QpAttrMask::STATE);
}

fn port_mtu(dev: &UdpDevice) -> PathMtu {
    dev.query_port(1).map_or(PathMtu::Mtu1024, |p| p.active_mtu)
}

/// A port the device's address listens on for rdma_cm connections (`RDMA_PS_TCP`).
/// Dropping it stops listening; requests not taken are rejected.
#[derive(Debug)]
pub struct CmListener {
    driver: Arc<CmDriver>,
    dev: Arc<UdpDevice>,
    service_id: u64,
    local: SocketAddr,
}

impl CmListener {
    /// `rdma_bind_addr` to the address of `ctx` and port `port`, then `rdma_listen`.
    /// Errors: `EADDRINUSE` when the port is already listened on (in this process: a
    /// port of another process is another device address); those of starting the device's
    /// CM (QP1 unusable).
    pub fn bind(ctx: &Context, port: u16) -> Result<CmListener> {
        let driver = ctx.dev.cm()?;
        let service_id = rdma_cm_service_id(port_space::TCP, port);
        driver.listen(service_id).map_err(cm_error)?;
        Ok(CmListener {
            driver,
            dev: ctx.dev.clone(),
            service_id,
            local: SocketAddr::new(ctx.dev.ip(), port),
        })
    }

    /// The address and port listened on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// The next connection request (`rdma_get_cm_event` → RDMA_CM_EVENT_CONNECT_REQUEST),
    /// waiting up to `timeout`. Answer it with [`ConnectRequest::accept`] or
    /// [`ConnectRequest::reject`]; dropping it rejects it.
    /// Errors: `ETIMEDOUT` when none came within `timeout`; `EIO` when the device's CM failed (its driver thread panicked, or the device did).
    pub fn get_request(&self, timeout: Duration) -> Result<ConnectRequest> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let Some(ev) = self.driver.next_request(self.service_id, left)? else {
                return Err(timed_out(format!(
                    "no connection request on {} within {timeout:?}",
                    self.local
                )));
            };
            // A SIDR_REQ (a UD connect) on the RC service: refused, as nothing here answers
            // UD requests.
            let CmEvent::ConnectRequest { id, peer, req, cma } = ev else {
                let id = ev.id();
                let _ = self.driver.with(|cm, now| {
                    cm.sidr_reply(now, id, softroce::wire::cm::SidrStatus::REJECT, 0, 0, &[])
                });
                continue;
            };
            let peer_addr = SocketAddr::new(
                cma.and_then(|c| c.src_ip()).unwrap_or(peer),
                cma.map_or(0, |c| c.port),
            );
            return Ok(ConnectRequest {
                driver: self.driver.clone(),
                dev: self.dev.clone(),
                id,
                peer: peer_addr,
                local: self.local,
                req: Some(req),
                handed_over: false,
            });
        }
    }
}

impl Drop for CmListener {
    fn drop(&mut self) {
        self.driver.unlisten(self.service_id);
    }
}

/// A connection request a [`CmListener`] received: the peer's address, its private data
/// and QP parameters. Dropping it unanswered rejects it (REJ, no private data).
#[derive(Debug)]
pub struct ConnectRequest {
    driver: Arc<CmDriver>,
    dev: Arc<UdpDevice>,
    id: CommId,
    peer: SocketAddr,
    local: SocketAddr,
    /// The REQ; taken by accept or reject.
    req: Option<Box<ReqRepr>>,
    /// Set when accept made the connection a CmConnection's (which detaches it when
    /// dropped).
    handed_over: bool,
}

impl ConnectRequest {
    /// The peer's address and port (from the rdma_cm header of its REQ).
    pub fn peer_addr(&self) -> SocketAddr {
        self.peer
    }

    /// The private data the peer passed to its connect: 56 bytes, zero-padded past what it
    /// gave (the REQ's 92 minus rdma_cm's 36-byte header), as librdmacm's CONNECT_REQUEST
    /// event shows it.
    pub fn private_data(&self) -> &[u8] {
        self.req.as_deref().map_or(&[], req_user_private_data)
    }

    /// `rdma_accept` without private data: see [`ConnectRequest::accept_with`].
    pub fn accept(self, qp: PreparedQueuePair) -> Result<CmConnection> {
        self.accept_with(qp, &[])
    }

    /// `rdma_accept`: connects `qp` (an RC QP of this listener's device, not yet connected)
    /// to the requesting QP with the attributes of the REQ (RESET→INIT→RTR→RTS), answers with
    /// a REP carrying `private_data`, and returns once the peer's RTU has come
    /// (RDMA_CM_EVENT_ESTABLISHED). Responder resources and initiator depth are those the
    /// builder set (`max_dest_rd_atomic`, `max_rd_atomic`), bounded by the REQ's. The path
    /// MTU is the REQ's (bounded by the port's): a REP cannot announce another, so the
    /// builder's `set_path_mtu` does not apply here.
    ///
    /// Errors: `EINVAL` for a QP that is not RC, is on another device, or more than 196
    /// bytes of private data; [`Error::Rejected`] if the peer refused the REP;
    /// `ETIMEDOUT` when no RTU came (after the CM's retries, or 30 s); `EIO` when the device's CM failed (its driver thread panicked, or the device did).
    pub fn accept_with(
        mut self,
        qp: PreparedQueuePair,
        private_data: &[u8],
    ) -> Result<CmConnection> {
        if qp.b.qp_type != QpType::Rc || qp.b.dev.ip() != self.dev.ip() {
            return Err(verbs::Error::new(
                verbs::ErrorKind::Inval,
                "accept: the QP must be an RC QP of the listener's device",
            )
            .into());
        }
        if private_data.len() > REP_PRIVATE_DATA_LEN {
            return Err(cm_error(softroce::cm::CmError::PrivateDataTooLong {
                given: private_data.len(),
                max: REP_PRIVATE_DATA_LEN,
            }));
        }
        let Some(req) = self.req.take() else {
            return Err(verbs::Error::new(verbs::ErrorKind::Inval, "accept: answered").into());
        };
        // The PSN our REP announces: the one we receive from (kernel cm.c roles).
        let rep_psn = psn_of(&self.driver, qp.qp.qp_num());
        let b = &qp.b;
        let (rr, ini) = (b.max_dest_rd_atomic, b.max_rd_atomic);
        let c = RcConnect {
            sgid_index: b.gid_index,
            hop_limit: b.hop_limit,
            traffic_class: b.traffic_class,
            qp_access_flags: b.access,
            min_rnr_timer: b.min_rnr_timer,
            ..RcConnect::rdma_cm_passive(
                &req,
                self.peer.ip(),
                port_mtu(&self.dev),
                rr,
                ini,
                rep_psn,
            )
        };
        if let Err(e) = qp.qp.connect_rc(&c) {
            let id = self.id;
            let _ = self.driver.with(|cm, now| cm.reject(now, id, &[]));
            return Err(e.into());
        }
        let p = AcceptParams {
            local_qpn: qp.qp.qp_num(),
            starting_psn: rep_psn,
            responder_resources: rr,
            initiator_depth: ini,
            target_ack_delay: softroce::cm::LOCAL_CA_ACK_DELAY,
            rnr_retry_count: b.rnr_retry & 7,
            srq: false,
            private_data: private_data.to_vec(),
        };
        let id = self.id;
        self.driver
            .with(|cm, now| cm.accept(now, id, &p))
            .map_err(cm_error)?;
        self.handed_over = true;
        let user = req_user_private_data(&req).to_vec();
        let (dev, remote_num) = (qp.b.dev.clone(), req.local_qpn);
        let conn = CmConnection {
            qp: QueuePair {
                qp: qp.qp,
                remote: crate::QueuePairEndpoint {
                    num: remote_num,
                    lid: 0,
                    gid: Some(c.dgid),
                },
                _dev: dev,
            },
            driver: self.driver.clone(),
            id,
            peer: self.peer,
            local: self.local,
            private_data: user,
            state: ConnState::Connecting,
        };
        conn.established(CM_WAIT)
    }

    /// `rdma_reject`: refuses the request with a REJ (reason 28, consumer defined)
    /// carrying `private_data` (at most 148 bytes).
    /// Errors: `EINVAL` for longer private data (the request stays unanswered and is
    /// rejected without it when dropped).
    pub fn reject(mut self, private_data: &[u8]) -> Result<()> {
        if private_data.len() > REJ_PRIVATE_DATA_LEN {
            return Err(cm_error(softroce::cm::CmError::PrivateDataTooLong {
                given: private_data.len(),
                max: REJ_PRIVATE_DATA_LEN,
            }));
        }
        self.req = None;
        let id = self.id;
        self.driver
            .with(|cm, now| cm.reject(now, id, private_data))
            .map_err(cm_error)
    }
}

impl Drop for ConnectRequest {
    fn drop(&mut self) {
        let id = self.id;
        if self.req.take().is_some() {
            let _ = self.driver.with(|cm, now| cm.reject(now, id, &[]));
        }
        // Unless a CmConnection took the connection over, what still comes for it (the
        // peer's REJ after ours crossed it, say) has nobody to read it.
        if !self.handed_over {
            self.driver.detach(id);
        }
    }
}

/// A first PSN for `qpn` (24 bits): the first draw of the engine's [`SplitMix64`] seeded
/// from the driver's clock and the QPN, as a connect's random `starting_psn`.
fn psn_of(driver: &CmDriver, qpn: u32) -> u32 {
    let seed = driver.now().as_nanos() ^ (u64::from(qpn) << 32);
    (SplitMix64::new(seed).next_u64() & 0x00ff_ffff) as u32
}

impl PreparedQueuePair {
    /// `rdma_connect` (after resolving `addr`): sends a REQ for this RC QP to the rdma_cm
    /// listener at `addr` (an IP address of a softroce or rxe device and an RDMA_PS_TCP
    /// port) with `private_data` (at most 56 bytes), and, when the REP comes, connects
    /// the QP with its attributes (RTR, RTS) and sends the RTU. Returns the connection
    /// with the REP's private data (196 bytes, zero-padded). Responder resources and
    /// initiator depth are the builder's `max_dest_rd_atomic` and `max_rd_atomic`; the
    /// path MTU the smaller of the builder's and the port's.
    ///
    /// Errors: [`Error::Rejected`] when the peer refused (reason 8 when nothing listens on
    /// the port, 28 when its application rejected; `errno()` ECONNREFUSED);
    /// `ETIMEDOUT` when no answer came within `timeout` (the REQ is then withdrawn with a
    /// REJ, as rdma_cm does for an id destroyed mid-connect) or after the CM's retries;
    /// `EINVAL` for a QP that is not RC, more than 56 bytes of private data or an address
    /// of the other IP family; `EIO` when the device's CM failed (its driver thread panicked, or the device did).
    pub fn connect(
        self,
        addr: SocketAddr,
        private_data: &[u8],
        timeout: Duration,
    ) -> Result<CmConnection> {
        let dev = self.b.dev.clone();
        if self.b.qp_type != QpType::Rc || addr.is_ipv4() != dev.ip().is_ipv4() {
            return Err(verbs::Error::new(
                verbs::ErrorKind::Inval,
                "connect: an RC QP to an address of the device's IP family",
            )
            .into());
        }
        let driver = dev.cm()?;
        let qpn = self.qp.qp_num();
        // The PSN our REQ announces: the one we receive from (kernel cm.c roles).
        let req_psn = psn_of(&driver, qpn);
        // An ephemeral source port, as the kernel picks one for an unbound rdma_cm id.
        let local = SocketAddr::new(dev.ip(), 32768 + (psn_of(&driver, !qpn) % 28232) as u16);
        let mtu = self.b.path_mtu.min(port_mtu(&dev));
        let mut p = ConnectParams::rdma_cm(
            local,
            addr,
            port_space::TCP,
            qpn,
            req_psn,
            mtu as u8,
            private_data,
        )
        .map_err(cm_error)?;
        p.responder_resources = self.b.max_dest_rd_atomic;
        p.initiator_depth = self.b.max_rd_atomic;
        p.retry_count = self.b.retry_count & 7;
        p.rnr_retry_count = self.b.rnr_retry & 7;
        p.local_ack_timeout = self.b.timeout;
        p.traffic_class = self.b.traffic_class;
        p.hop_limit = self.b.hop_limit;
        let id = driver
            .with(|cm, now| cm.connect(now, &p))
            .map_err(cm_error)?;
        let deadline = std::time::Instant::now() + timeout;
        // Set once the caller's timeout is over but the connection had an answer already:
        // the next look takes it without waiting.
        let mut expired = false;
        let rep = loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match driver.next_event(id, left)? {
                Some(CmEvent::ConnectResponse { rep, .. }) => break rep,
                Some(CmEvent::Rejected {
                    reason,
                    private_data,
                    ..
                }) => {
                    driver.detach(id);
                    return Err(Error::Rejected(Rejected {
                        reason,
                        private_data: private_data.to_vec(),
                    }));
                }
                Some(CmEvent::Unreachable { .. }) => {
                    driver.detach(id);
                    return Err(Error::Io(std::io::Error::from_raw_os_error(ETIMEDOUT)));
                }
                Some(_) => {}
                None if expired => {
                    driver.detach(id);
                    return Err(timed_out(format!(
                        "connect to {addr}: no answer within {timeout:?}"
                    )));
                }
                None => {
                    // The caller's timeout: withdraw the REQ (REJ timeout), unless an answer
                    // came meanwhile.
                    if driver.with(|cm, now| cm.cancel(now, id)).is_ok() {
                        driver.detach(id);
                        return Err(timed_out(format!(
                            "connect to {addr}: no answer within {timeout:?}"
                        )));
                    }
                    expired = true;
                }
            }
        };
        let b = &self.b;
        let c = RcConnect {
            sgid_index: b.gid_index,
            hop_limit: b.hop_limit,
            traffic_class: b.traffic_class,
            qp_access_flags: b.access,
            min_rnr_timer: b.min_rnr_timer,
            timeout: b.timeout,
            flow_label: p.flow_label,
            ..RcConnect::rdma_cm_active(
                &rep,
                addr.ip(),
                mtu,
                b.max_dest_rd_atomic,
                b.max_rd_atomic,
                b.retry_count,
                req_psn,
            )
        };
        if let Err(e) = self.qp.connect_rc(&c) {
            // librdmacm: CONNECT_ERROR, and the REP is refused.
            let _ = driver.with(|cm, now| cm.reject(now, id, &[]));
            driver.detach(id);
            return Err(e.into());
        }
        if let Err(e) = driver.with(|cm, now| cm.establish(now, id)) {
            // The peer gave up between its REP and our RTU (its REJ came first).
            driver.detach(id);
            return Err(cm_error(e));
        }
        let conn = CmConnection {
            qp: QueuePair {
                qp: self.qp,
                remote: crate::QueuePairEndpoint {
                    num: rep.local_qpn,
                    lid: 0,
                    gid: Some(c.dgid),
                },
                _dev: dev,
            },
            driver,
            id,
            peer: addr,
            local,
            private_data: rep.private_data.to_vec(),
            state: ConnState::Connecting,
        };
        conn.established(CM_WAIT)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ConnState {
    /// REP sent or RTU sent; ESTABLISHED not seen yet.
    Connecting,
    Established,
    /// The peer's DREQ came (DISCONNECTED); our disconnect answers it.
    PeerDisconnected,
    /// Our disconnect ran: nothing more to do.
    Closed,
}

/// A queue pair connected through the CM (an `rdma_cm_id` with its QP, ESTABLISHED).
/// Derefs to the [`QueuePair`] for posting. Dropping it disconnects (QP to ERR, DREQ or the
/// DREP to the peer's DREQ) without waiting, then destroys the QP.
#[derive(Debug)]
pub struct CmConnection {
    qp: QueuePair,
    driver: Arc<CmDriver>,
    id: CommId,
    peer: SocketAddr,
    local: SocketAddr,
    private_data: Vec<u8>,
    state: ConnState,
}

impl CmConnection {
    /// Waits for ESTABLISHED (the RTU on the passive side; at once on the active side).
    fn established(mut self, timeout: Duration) -> Result<CmConnection> {
        let deadline = std::time::Instant::now() + timeout;
        while self.state == ConnState::Connecting {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.driver.next_event(self.id, left)? {
                Some(CmEvent::Established { .. }) => self.state = ConnState::Established,
                Some(CmEvent::Rejected {
                    reason,
                    private_data,
                    ..
                }) => {
                    self.state = ConnState::Closed;
                    return Err(Error::Rejected(Rejected {
                        reason,
                        private_data: private_data.to_vec(),
                    }));
                }
                Some(CmEvent::Unreachable { .. }) => {
                    self.state = ConnState::Closed;
                    return Err(Error::Io(std::io::Error::from_raw_os_error(ETIMEDOUT)));
                }
                Some(_) => {}
                None => {
                    return Err(timed_out(format!(
                        "connection with {}: not established within {timeout:?}",
                        self.peer
                    )));
                }
            }
        }
        Ok(self)
    }

    /// The private data the peer sent: its REQ's (56 bytes) on the accepting side, its
    /// REP's (196 bytes) on the connecting side, zero-padded past what it gave.
    pub fn private_data(&self) -> &[u8] {
        &self.private_data
    }

    /// The peer's address and port.
    pub fn peer_addr(&self) -> SocketAddr {
        self.peer
    }

    /// This side's address and port (the listener's, or the connect's ephemeral port).
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// Waits up to `timeout` for the peer to disconnect (RDMA_CM_EVENT_DISCONNECTED: its
    /// DREQ came). Then call [`CmConnection::disconnect`] (or drop) to answer with the DREP.
    /// Errors: `ETIMEDOUT` when the peer stayed connected; `EIO` when the device's CM failed (its driver thread panicked, or the device did).
    pub fn wait_for_disconnect(&mut self, timeout: Duration) -> Result<()> {
        let deadline = std::time::Instant::now() + timeout;
        while self.state == ConnState::Established {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.driver.next_event(self.id, left)? {
                Some(CmEvent::Disconnected { .. }) => self.state = ConnState::PeerDisconnected,
                Some(_) => {}
                None => {
                    return Err(timed_out(format!(
                        "{} did not disconnect within {timeout:?}",
                        self.peer
                    )));
                }
            }
        }
        Ok(())
    }

    /// `rdma_disconnect`: moves the QP to ERR, sends a DREQ (or, if the peer's DREQ came,
    /// the DREP) and waits up to `timeout` for the peer's DREP (DISCONNECTED). Later calls
    /// do nothing.
    /// Errors: `ETIMEDOUT` when no DREP came within `timeout` (the CM still retries the
    /// DREQ, then gives up on its own); `EIO` when the device's CM failed (its driver thread panicked, or the device did).
    pub fn disconnect(&mut self, timeout: Duration) -> Result<()> {
        if self.state == ConnState::Closed {
            return Ok(());
        }
        qp_to_error(self.qp.verbs());
        let id = self.id;
        // A DREQ that came since the last look is answered with the DREP.
        let peer_first = self.driver.with(|cm, now| {
            let dreq_rcvd = cm.state(id) == Some(CmState::DreqRcvd);
            let _ = cm.disconnect(now, id);
            dreq_rcvd
        });
        let waiting = self.state == ConnState::Established && !peer_first;
        self.state = ConnState::Closed;
        if !waiting {
            return Ok(());
        }
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.driver.next_event(id, left)? {
                Some(CmEvent::Disconnected { .. }) => return Ok(()),
                Some(_) => {}
                None => {
                    return Err(timed_out(format!(
                        "disconnect from {}: no DREP within {timeout:?}",
                        self.peer
                    )));
                }
            }
        }
    }
}

impl core::ops::Deref for CmConnection {
    type Target = QueuePair;
    fn deref(&self) -> &QueuePair {
        &self.qp
    }
}

impl core::ops::DerefMut for CmConnection {
    fn deref_mut(&mut self) -> &mut QueuePair {
        &mut self.qp
    }
}

impl Drop for CmConnection {
    fn drop(&mut self) {
        if self.state != ConnState::Closed {
            qp_to_error(self.qp.verbs());
            let id = self.id;
            let _ = self.driver.with(|cm, now| cm.disconnect(now, id));
        }
        self.driver.detach(self.id);
    }
}
