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
//!                       /* 1: a MAD; 0: none within timeout_ms; -1 and errno */
//! ```
//!
//! Only bytes cross the boundary, so the two libraries share the device registry and engine
//! of libibverbs.so.1 without sharing a Rust type. QP1 of an engine device gets one port
//! (receives posted in the GSI PD, as `softroce::verbs::CmPort`), whatever the number of
//! contexts opened on it. Completions are taken with `Cq::poll_queued` / `Cq::wait`, which do
//! not drive the link: receiving stays with the device's driver thread or its busy poller.

use crate::abi::ibv_context;
use crate::context::Context;
use crate::device::PerProcess;
use crate::handle::try_ref;
use crate::{ffi, neg_errno};
use core::ffi::{c_int, c_void};
use parking_lot::Mutex;
use softroce::net::sockaddr::{socket_addr_from_ptr, write_socket_addr};
use softroce::transport::UdDest;
use softroce::verbs::{
    AccessFlags, Cq, GSI_QKEY, Mr, Qp, RecvWr, SendWr, Wc, WcStatus, WrOpcode, grh_source,
};
use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

const MAD_LEN: usize = 256;
const GRH_LEN: usize = 40;
const SLOT: usize = GRH_LEN + MAD_LEN;
const RECV_SLOTS: usize = 64;
const SEND_SLOTS: usize = 64;
const SEND_TAG: u64 = 1 << 63;

struct MadPort {
    qp: Qp,
    cq: Cq,
    recv_mr: Mr,
    send_mr: Mr,
    st: Mutex<PortState>,
}

#[derive(Default)]
struct PortState {
    free_send: Vec<usize>,
    received: VecDeque<(IpAddr, Vec<u8>)>,
}

impl MadPort {
    fn open(dev: &softroce::verbs::Device) -> softroce::verbs::Result<MadPort> {
        let pd = dev.gsi_pd();
        let port = MadPort {
            qp: dev.gsi_qp(),
            cq: dev.gsi_cq(),
            recv_mr: pd.reg_mr(RECV_SLOTS * SLOT, AccessFlags::LOCAL_WRITE)?,
            send_mr: pd.reg_mr(SEND_SLOTS * MAD_LEN, AccessFlags::LOCAL_WRITE)?,
            st: Mutex::new(PortState {
                free_send: (0..SEND_SLOTS).collect(),
                received: VecDeque::new(),
            }),
        };
        for slot in 0..RECV_SLOTS {
            port.post_recv(slot)?;
        }
        Ok(port)
    }

    fn post_recv(&self, slot: usize) -> softroce::verbs::Result<()> {
        self.qp.post_recv(&[RecvWr {
            wr_id: slot as u64,
            sg_list: vec![self.recv_mr.sge(slot * SLOT, SLOT as u32)],
        }])
    }

    fn completion(&self, st: &mut PortState, wc: &Wc) {
        if wc.wr_id & SEND_TAG != 0 {
            st.free_send.push((wc.wr_id & !SEND_TAG) as usize);
            return;
        }
        let slot = wc.wr_id as usize;
        if slot >= RECV_SLOTS || wc.status != WcStatus::Success {
            return; // flushed (QP1 in error): not reposted
        }
        let mut buf = [0u8; SLOT];
        let len = (wc.byte_len as usize).min(SLOT);
        if self.recv_mr.read(slot * SLOT, &mut buf[..len]).is_ok()
            && len > GRH_LEN
            && let Some(src) = grh_source(&buf[..len])
        {
            st.received.push_back((src, buf[GRH_LEN..len].to_vec()));
        }
        let _ = self.post_recv(slot);
    }

    fn drain(&self, st: &mut PortState) {
        let mut wcs = [Wc::default(); 16];
        loop {
            let n = self.cq.poll_queued(&mut wcs);
            for wc in &wcs[..n] {
                self.completion(st, wc);
            }
            if n < wcs.len() {
                break;
            }
        }
    }

    fn send(&self, dst: IpAddr, mad: &[u8]) -> Result<(), c_int> {
        let mut st = self.st.lock();
        self.drain(&mut st);
        let slot = st.free_send.pop().ok_or(libc::EAGAIN)?;
        let n = mad.len().min(MAD_LEN);
        if self.send_mr.write(slot * MAD_LEN, &mad[..n]).is_err() {
            st.free_send.push(slot);
            return Err(libc::EIO);
        }
        let mut wr = SendWr::new(
            SEND_TAG | slot as u64,
            WrOpcode::Send,
            vec![self.send_mr.sge(slot * MAD_LEN, n as u32)],
        );
        wr.ud = Some(UdDest {
            remote_ip: dst,
            remote_qpn: 1,
            remote_qkey: GSI_QKEY,
            ip: Default::default(),
        });
        self.qp.post_send(&[wr]).map_err(|e| {
            st.free_send.push(slot);
            e.errno()
        })
    }

    fn recv(&self, timeout: Duration) -> Option<(IpAddr, Vec<u8>)> {
        {
            let mut st = self.st.lock();
            self.drain(&mut st);
            if let Some(m) = st.received.pop_front() {
                return Some(m);
            }
        }
        let mut one = [Wc::default()];
        let got = self.cq.wait(&mut one, timeout);
        let mut st = self.st.lock();
        if got == 1 {
            self.completion(&mut st, &one[0]);
        }
        self.drain(&mut st);
        st.received.pop_front()
    }
}

/// The port of the engine device behind `ctx`, made on first use.
fn port_of(ctx: *mut ibv_context) -> Result<Arc<MadPort>, c_int> {
    // A forked child's contexts are its own: it does not get the parent's ports.
    type Ports = PerProcess<HashMap<IpAddr, Arc<MadPort>>>;
    static PORTS: OnceLock<Mutex<Ports>> = OnceLock::new();
    // SAFETY: the caller passes NULL or a context from ibv_open_device that it has not
    // closed.
    let c: &Context = unsafe { try_ref(ctx) }?;
    let mut guard = PORTS.get_or_init(Default::default).lock();
    let ports = guard.get();
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
    ffi!(-1, {
        // SAFETY: the caller passes a sockaddr (or NULL).
        let Some(dst) = (unsafe { socket_addr_from_ptr(dst) }).map(|a| a.ip()) else {
            return neg_errno(libc::EINVAL);
        };
        if mad.is_null() || len == 0 || len > MAD_LEN {
            return neg_errno(libc::EINVAL);
        }
        // SAFETY: the caller passes `len` readable bytes at `mad`.
        let bytes = unsafe { std::slice::from_raw_parts(mad.cast::<u8>(), len) };
        match port_of(ctx).and_then(|p| p.send(dst, bytes)) {
            Ok(()) => 0,
            Err(e) => neg_errno(e),
        }
    })
}

pub(crate) extern "C" fn softroce_mad_recv(
    ctx: *mut ibv_context,
    mad: *mut c_void,
    src: *mut libc::sockaddr_storage,
    timeout_ms: c_int,
) -> c_int {
    ffi!(-1, {
        if mad.is_null() || src.is_null() {
            return neg_errno(libc::EINVAL);
        }
        let port = match port_of(ctx) {
            Ok(p) => p,
            Err(e) => return neg_errno(e),
        };
        let Some((from, bytes)) = port.recv(Duration::from_millis(timeout_ms.max(0) as u64)) else {
            return 0;
        };
        // SAFETY: the caller passes 256 writable bytes at `mad` and a sockaddr_storage.
        unsafe {
            std::ptr::write_bytes(mad.cast::<u8>(), 0, MAD_LEN);
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), mad.cast::<u8>(), bytes.len());
            write_socket_addr(&mut *src, SocketAddr::new(from, 0));
        }
        1
    })
}
