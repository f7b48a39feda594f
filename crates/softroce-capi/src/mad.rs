//! softroce's private entry points for its librdmacm.so.1 (crates/softroce-rdmacm): raw MADs
//! on a device's QP1. librdmacm runs the CM engine itself; it reaches QP1 of the device it
//! opened with `ibv_open_device` only through these two C functions, exported under the
//! version node `SOFTROCE_PRIVATE_1` (no rdma-core program calls them):
//!
//! ```c
//! int softroce_mad_send(struct ibv_context *ctx, const struct sockaddr *dst,
//!                       const void *mad, size_t len);          /* 0, or -1 and errno */
//! int softroce_mad_recv(struct ibv_context *ctx, void *mad /* 256 bytes */,
//!                       struct sockaddr_storage *src, int timeout_ms);
//!                       /* 1: a MAD; 2: no MAD, but the network said the address
//!                          in *src has no RoCE device (ICMP port unreachable for a MAD
//!                          sent there; `Link::poll_unreachable`); 0: none within
//!                          timeout_ms; -1 and errno: EIO once the device failed (its
//!                          driver thread panicked) */
//! ```
//!
//! Only bytes cross the boundary, so the two libraries share the device registry and engine
//! of libibverbs.so.1 without sharing a Rust type. QP1 of an engine device gets one port
//! (the engine's `softroce::verbs::MadRing`, which `softroce::verbs::CmPort` is built on
//! too), whatever the number of contexts opened on it. Completions are taken with `Cq::poll_queued` / `Cq::wait`, which do
//! not drive the link: receiving stays with the device's driver thread or its busy poller.

use crate::context::Context;
use crate::handle::try_ref;
use core::ffi::{c_int, c_void};
use parking_lot::Mutex;
use softroce::net::sockaddr::{socket_addr_from_ptr, write_socket_addr};
use softroce::verbs::{Cq, MadRing, Wc};
use softroce::wire::grh::{GRH_LEN, grh_source};
use softroce::wire::mad::MAD_LEN;
use softroce_cabi::abi::ibv_context;
use softroce_cabi::ffi;
use softroce_cabi::fork::ProcessLock;
use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

/// QP1 of an engine device for librdmacm: the engine's [`MadRing`] and the MADs received
/// and not yet read, behind one lock; the GSI CQ outside it, so that a `recv` waits on it
/// without holding the lock.
struct MadPort {
    /// The device, whose failure ends a wait for MADs.
    dev: softroce::verbs::Device,
    cq: Cq,
    st: Mutex<PortState>,
}

struct PortState {
    ring: MadRing,
    received: VecDeque<(IpAddr, Vec<u8>)>,
}

impl MadPort {
    fn open(dev: &softroce::verbs::Device) -> softroce::verbs::Result<MadPort> {
        Ok(MadPort {
            dev: dev.clone(),
            cq: dev.gsi_cq(),
            st: Mutex::new(PortState {
                ring: MadRing::new(dev)?,
                received: VecDeque::new(),
            }),
        })
    }

    fn completion(st: &mut PortState, wc: &Wc) {
        let received = &mut st.received;
        // A flushed receive (QP1 in error) is not reposted; nothing else here fails.
        let _ = st.ring.handle_completion(wc, |area| {
            if area.len() > GRH_LEN
                && let Some(src) = grh_source(area)
            {
                received.push_back((src, area[GRH_LEN..].to_vec()));
            }
        });
    }

    fn drain(&self, st: &mut PortState) {
        let mut wcs = [Wc::default(); 16];
        loop {
            let n = self.cq.poll_queued(&mut wcs);
            for wc in &wcs[..n] {
                Self::completion(st, wc);
            }
            if n < wcs.len() {
                break;
            }
        }
    }

    fn send(&self, dst: IpAddr, mad: &[u8]) -> Result<(), c_int> {
        let mut st = self.st.lock();
        self.drain(&mut st);
        match st.ring.send(dst, mad) {
            Ok(true) => Ok(()),
            Ok(false) => Err(libc::EAGAIN),
            Err(e) => Err(e.errno()),
        }
    }

    /// The next MAD received, waiting up to `timeout`; `None` if none came. Errors: `EIO`
    /// once the device failed and nothing received before is left (its CQ waits return at
    /// once then: the caller would spin).
    fn recv(&self, timeout: Duration) -> Result<Option<(IpAddr, Vec<u8>)>, c_int> {
        {
            let mut st = self.st.lock();
            self.drain(&mut st);
            if let Some(m) = st.received.pop_front() {
                return Ok(Some(m));
            }
        }
        if self.dev.failure().is_some() {
            return Err(libc::EIO);
        }
        let mut one = [Wc::default()];
        let got = self.cq.wait(&mut one, timeout);
        let mut st = self.st.lock();
        if got == 1 {
            Self::completion(&mut st, &one[0]);
        }
        self.drain(&mut st);
        Ok(st.received.pop_front())
    }
}

/// The port of the engine device behind `ctx`, made on first use.
fn port_of(ctx: *mut ibv_context) -> Result<Arc<MadPort>, c_int> {
    // A forked child's contexts are its own: it gets no port of the parent's, and never
    // the parent's lock, which the parent's CM driver thread may have held at the fork.
    static PORTS: ProcessLock<HashMap<IpAddr, Arc<MadPort>>> = ProcessLock::new();
    // SAFETY: the caller passes NULL or a context from ibv_open_device that it has not
    // closed.
    let c: &Context = unsafe { try_ref(ctx) }?;
    let mut ports = PORTS.lock();
    if let Some(p) = ports.get(&c.addr.ip) {
        return Ok(p.clone());
    }
    let p = Arc::new(MadPort::open(c.dev.device()).map_err(|e| e.errno())?);
    ports.insert(c.addr.ip, p.clone());
    Ok(p)
}

pub(crate) extern "C" fn softroce_mad_send(
    ctx: *mut ibv_context,
    dst: *const libc::sockaddr,
    mad: *const c_void,
    len: usize,
) -> c_int {
    ffi!({
        // SAFETY: the caller passes a sockaddr (or NULL).
        let dst = (unsafe { socket_addr_from_ptr(dst) })
            .map(|a| a.ip())
            .ok_or(libc::EINVAL)?;
        if mad.is_null() || len == 0 || len > MAD_LEN {
            return Err(libc::EINVAL);
        }
        // SAFETY: the caller passes `len` readable bytes at `mad`.
        let bytes = unsafe { std::slice::from_raw_parts(mad.cast::<u8>(), len) };
        port_of(ctx)?.send(dst, bytes)?;
        Ok(0)
    })
}

pub(crate) extern "C" fn softroce_mad_recv(
    ctx: *mut ibv_context,
    mad: *mut c_void,
    src: *mut libc::sockaddr_storage,
    timeout_ms: c_int,
) -> c_int {
    ffi!({
        if mad.is_null() || src.is_null() {
            return Err(libc::EINVAL);
        }
        let port = port_of(ctx)?;
        // What the device's link learnt of a peer without a RoCE device goes first: the CM
        // ends the connects waiting for it at once (softroce::cm::CmEngine::handle_unreachable).
        if let Some(peer) = port.dev.poll_unreachable() {
            // SAFETY: the caller passes a sockaddr_storage.
            unsafe { write_socket_addr(&mut *src, SocketAddr::new(peer, 0)) };
            return Ok(2);
        }
        let Some((from, bytes)) = port.recv(Duration::from_millis(timeout_ms.max(0) as u64))?
        else {
            return Ok(0);
        };
        // SAFETY: the caller passes 256 writable bytes at `mad` and a sockaddr_storage.
        unsafe {
            std::ptr::write_bytes(mad.cast::<u8>(), 0, MAD_LEN);
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), mad.cast::<u8>(), bytes.len());
            write_socket_addr(&mut *src, SocketAddr::new(from, 0));
        }
        Ok(1)
    })
}

pub(crate) extern "C" fn softroce_cm_slot(ctx: *mut ibv_context) -> c_int {
    ffi!({
        // SAFETY: the caller passes NULL or a context from ibv_open_device that it has not
        // closed.
        let c: &Context = unsafe { try_ref(ctx) }?;
        Ok(c_int::from(c.dev.link().slot().unwrap_or(0)))
    })
}

pub(crate) extern "C" fn softroce_cm_listen(
    ctx: *mut ibv_context,
    service_id: u64,
    listen: c_int,
) -> c_int {
    ffi!({
        // SAFETY: as in softroce_cm_slot.
        let c: &Context = unsafe { try_ref(ctx) }?;
        let link = c.dev.link();
        if listen != 0 {
            link.share_listen(service_id)
                .map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))?;
        } else {
            link.share_unlisten(service_id);
        }
        Ok(0)
    })
}
