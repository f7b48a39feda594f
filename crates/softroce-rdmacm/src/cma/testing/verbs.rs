//! (Feature `testing`.) The bench's libibverbs.so.1: the table of functions this library
//! calls ([`Ibv`], `ibv.rs`), over one device held in memory, so that the CM driver and the
//! rdma_* calls run unchanged without a device, a socket or a thread.
//!
//! - QP1: `softroce_mad_send` appends to an outbox, `softroce_mad_recv` takes the next
//!   input the bench queued (a MAD, zero-padded to 256 bytes as softroce-capi's is, or an
//!   ICMP "unreachable"), or gives nothing at once (it never waits: the bench owns time).
//! - Objects (PDs, completion channels, CQs, QPs, SRQs) are boxed C structs filled as
//!   libibverbs fills them, registered by address; a call on an address that is not a live
//!   object of this device, a CQ destroyed while a QP uses it and a MAD of another length
//!   are the library's faults, kept in [`Mem::violations`] for the bench's invariants
//!   (and refused with EINVAL / EBUSY, as libibverbs refuses them).
//! - `ibv_modify_qp` follows the QP state diagram (IBTA Vol 1 §10.3.1: RESET → INIT →
//!   RTR → RTS, any → ERR or RESET) and refuses, with EINVAL as rxe does, a transition the
//!   diagram lacks, a mask without the attributes the transition requires (§11.2.5.2:
//!   INIT: P_Key index, port, access flags or Q_Key; RTR of an RC QP: AV, path MTU, dest
//!   QPN, RQ PSN, responder resources, min RNR timer; RTS: SQ PSN, and for RC timeout,
//!   retry counts, initiator depth) and values out of their fields' range. It keeps the
//!   dest QPN of each RC QP's RTR, which the bench checks against the engine.
//! - `softroce_cm_listen` keeps the set of steered service IDs (the shared device's
//!   steering), `softroce_cm_slot` says "not shared".

use crate::abi::*;
use crate::ibv::Ibv;
use core::ffi::{c_char, c_int, c_void};
use parking_lot::Mutex;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::net::{IpAddr, SocketAddr};

/// The MAD size of QP1 (IBTA: 256 bytes).
const MAD_LEN: usize = 256;
/// `IBV_PORT_ACTIVE`.
const PORT_ACTIVE: c_int = 4;
/// The active MTU of the bench's port (`IBV_MTU_1024`).
pub(super) const PORT_MTU: c_int = 3;
/// The first QPN the device hands out.
const FIRST_QPN: u32 = 0x11;

/// What QP1 gives the next `softroce_mad_recv`.
pub(super) enum Qp1Input {
    /// A MAD (up to 256 bytes; fewer are zero-padded) from this address.
    Mad(IpAddr, Vec<u8>),
    /// An ICMP "port unreachable" for a MAD sent to this address.
    Unreachable(IpAddr),
}

/// A QP's state as the device keeps it.
pub(super) struct QpRec {
    /// `IBV_QPS_*`.
    pub(super) state: c_int,
    /// `IBV_QPT_*`.
    pub(super) qp_type: c_int,
    /// The dest QPN of the RC QP's RTR, once it had one.
    pub(super) dest_qpn: Option<u32>,
}

/// The device: its objects, QP1's queues, its steering and the faults it saw.
pub(super) struct Mem {
    /// The `ibv_device` (boxed).
    pub(super) dev: usize,
    /// Its one `ibv_context` (boxed).
    pub(super) ctx: usize,
    /// The device's GUID (host order).
    pub(super) guid: u64,
    pub(super) pds: BTreeSet<usize>,
    pub(super) channels: BTreeSet<usize>,
    /// CQ → its completion channel (0: none).
    pub(super) cqs: BTreeMap<usize, usize>,
    pub(super) srqs: BTreeSet<usize>,
    pub(super) qps: BTreeMap<usize, QpRec>,
    next_qpn: u32,
    /// QP1's inputs, oldest first.
    pub(super) inbox: VecDeque<Qp1Input>,
    /// MADs sent from QP1: destination, bytes.
    pub(super) outbox: VecDeque<(IpAddr, Box<[u8; MAD_LEN]>)>,
    /// Service IDs `softroce_cm_listen` steers to this process.
    pub(super) steered: BTreeSet<u64>,
    /// Calls the library should not have made, described.
    pub(super) violations: Vec<String>,
}

/// The device, while a bench runs (`None` between runs).
pub(super) static MEM: Mutex<Option<Mem>> = Mutex::new(None);

/// A zeroed, boxed C struct's address.
fn boxed<T>() -> *mut T {
    // SAFETY: the structs boxed here are plain C data (integers, pointers, arrays of them,
    // pthread objects that libibverbs initialises itself); all zeros is a valid value.
    Box::into_raw(Box::new(unsafe { std::mem::zeroed::<T>() }))
}

/// Frees a struct [`boxed`] made.
///
/// # Safety
/// `p` came from `boxed::<T>()` and is freed once.
unsafe fn unbox<T>(p: *mut T) {
    // SAFETY: the caller's contract.
    drop(unsafe { Box::from_raw(p) });
}

impl Mem {
    /// A device with GUID `guid`: its `ibv_device` and context, no other object.
    pub(super) fn new(guid: u64) -> Mem {
        let dev = boxed::<ibv_device>();
        let ctx = boxed::<ibv_context>();
        // SAFETY: just made.
        unsafe { (*ctx).device = dev };
        Mem {
            dev: dev as usize,
            ctx: ctx as usize,
            guid,
            pds: BTreeSet::new(),
            channels: BTreeSet::new(),
            cqs: BTreeMap::new(),
            srqs: BTreeSet::new(),
            qps: BTreeMap::new(),
            next_qpn: FIRST_QPN,
            inbox: VecDeque::new(),
            outbox: VecDeque::new(),
            steered: BTreeSet::new(),
            violations: Vec::new(),
        }
    }

    /// What the library left behind (objects it made and did not destroy), described; the
    /// device's PDs (the library never frees one) are not counted.
    pub(super) fn leftovers(&self) -> Option<String> {
        let n = (
            self.channels.len(),
            self.cqs.len(),
            self.srqs.len(),
            self.qps.len(),
        );
        (n != (0, 0, 0, 0)).then(|| {
            format!(
                "left behind {} completion channels, {} CQs, {} SRQs, {} QPs",
                n.0, n.1, n.2, n.3
            )
        })
    }

    fn fault(&mut self, what: String) {
        if self.violations.len() < 16 {
            self.violations.push(what);
        }
    }
}

impl Drop for Mem {
    fn drop(&mut self) {
        // SAFETY: every address in the tables is a box of that type made here and not freed
        // (a destroy removes it first); each is freed once, as the tables are dropped.
        unsafe {
            for &q in self.qps.keys() {
                unbox(q as *mut ibv_qp);
            }
            for &s in &self.srqs {
                unbox(s as *mut ibv_srq);
            }
            for &c in self.cqs.keys() {
                unbox(c as *mut ibv_cq);
            }
            for &c in &self.channels {
                unbox(c as *mut ibv_comp_channel);
            }
            for &p in &self.pds {
                unbox(p as *mut ibv_pd);
            }
            unbox(self.ctx as *mut ibv_context);
            unbox(self.dev as *mut ibv_device);
        }
    }
}

/// Runs `f` on the device, or returns `none` when no bench runs.
fn with<R>(none: R, f: impl FnOnce(&mut Mem) -> R) -> R {
    match MEM.lock().as_mut() {
        Some(m) => f(m),
        None => none,
    }
}

/// Sets errno to `e` and returns NULL (a constructor's failure).
fn fail<T>(e: c_int) -> *mut T {
    crate::set_errno(e);
    std::ptr::null_mut()
}

/// The table [`crate::ibv::install`] takes.
pub(super) fn table() -> Ibv {
    Ibv {
        get_device_list,
        free_device_list,
        get_device_name,
        get_device_guid,
        open_device,
        alloc_pd,
        create_comp_channel,
        destroy_comp_channel,
        create_cq,
        destroy_cq,
        create_qp,
        modify_qp,
        destroy_qp,
        create_srq,
        destroy_srq,
        query_port,
        attach_mcast,
        detach_mcast,
        mad_send,
        mad_recv,
        cm_slot,
        cm_listen,
    }
}

/// Whether `f` is this module's `softroce_mad_send` (the check that the table in place is
/// the bench's).
pub(super) fn is_ours(
    f: unsafe extern "C" fn(*mut ibv_context, *const libc::sockaddr, *const c_void, usize) -> c_int,
) -> bool {
    std::ptr::fn_addr_eq(f, mad_send as unsafe extern "C" fn(_, _, _, _) -> _)
}

unsafe extern "C" fn get_device_list(n: *mut c_int) -> *mut *mut ibv_device {
    let Some(dev) = with(None, |m| Some(m.dev)) else {
        return fail(libc::ENOSYS);
    };
    if !n.is_null() {
        // SAFETY: the caller's int.
        unsafe { *n = 1 };
    }
    Box::into_raw(Box::new([dev as *mut ibv_device, std::ptr::null_mut()])).cast()
}

unsafe extern "C" fn free_device_list(list: *mut *mut ibv_device) {
    if !list.is_null() {
        // SAFETY: a list get_device_list made (two entries), freed once.
        drop(unsafe { Box::from_raw(list.cast::<[*mut ibv_device; 2]>()) });
    }
}

unsafe extern "C" fn get_device_name(_dev: *mut ibv_device) -> *const c_char {
    c"mem0".as_ptr()
}

unsafe extern "C" fn get_device_guid(_dev: *mut ibv_device) -> u64 {
    with(0, |m| m.guid.to_be())
}

unsafe extern "C" fn open_device(dev: *mut ibv_device) -> *mut ibv_context {
    with(fail(libc::ENODEV), |m| {
        if dev as usize == m.dev {
            m.ctx as *mut ibv_context
        } else {
            m.fault(format!("ibv_open_device({dev:p}): not the device"));
            fail(libc::ENODEV)
        }
    })
}

/// Whether `ctx` is the device's context (else a fault, named after `call`).
fn ctx_ok(m: &mut Mem, call: &str, ctx: *mut ibv_context) -> bool {
    let ok = ctx as usize == m.ctx;
    if !ok {
        m.fault(format!("{call}({ctx:p}): not the device's context"));
    }
    ok
}

unsafe extern "C" fn alloc_pd(ctx: *mut ibv_context) -> *mut ibv_pd {
    with(fail(libc::ENODEV), |m| {
        if !ctx_ok(m, "ibv_alloc_pd", ctx) {
            return fail(libc::EINVAL);
        }
        let pd = boxed::<ibv_pd>();
        // SAFETY: just made.
        unsafe { (*pd).context = ctx };
        m.pds.insert(pd as usize);
        pd
    })
}

unsafe extern "C" fn create_comp_channel(ctx: *mut ibv_context) -> *mut ibv_comp_channel {
    with(fail(libc::ENODEV), |m| {
        if !ctx_ok(m, "ibv_create_comp_channel", ctx) {
            return fail(libc::EINVAL);
        }
        let ch = boxed::<ibv_comp_channel>();
        // SAFETY: just made.
        unsafe {
            (*ch).context = ctx;
            (*ch).fd = -1;
        }
        m.channels.insert(ch as usize);
        ch
    })
}

unsafe extern "C" fn destroy_comp_channel(ch: *mut ibv_comp_channel) -> c_int {
    with(libc::ENODEV, |m| {
        if !m.channels.contains(&(ch as usize)) {
            m.fault(format!("ibv_destroy_comp_channel({ch:p}): no such channel"));
            return libc::EINVAL;
        }
        if m.cqs.values().any(|&c| c == ch as usize) {
            m.fault(format!(
                "ibv_destroy_comp_channel({ch:p}): a CQ still uses it"
            ));
            return libc::EBUSY;
        }
        m.channels.remove(&(ch as usize));
        // SAFETY: a live channel of ours, just unregistered: freed once.
        unsafe { unbox(ch) };
        0
    })
}

unsafe extern "C" fn create_cq(
    ctx: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    _comp_vector: c_int,
) -> *mut ibv_cq {
    with(fail(libc::ENODEV), |m| {
        if !ctx_ok(m, "ibv_create_cq", ctx) {
            return fail(libc::EINVAL);
        }
        if !channel.is_null() && !m.channels.contains(&(channel as usize)) {
            m.fault(format!("ibv_create_cq: no such channel {channel:p}"));
            return fail(libc::EINVAL);
        }
        if cqe < 1 {
            return fail(libc::EINVAL);
        }
        let cq = boxed::<ibv_cq>();
        // SAFETY: just made.
        unsafe {
            (*cq).context = ctx;
            (*cq).channel = channel;
            (*cq).cq_context = cq_context;
            (*cq).cqe = cqe;
        }
        m.cqs.insert(cq as usize, channel as usize);
        cq
    })
}

unsafe extern "C" fn destroy_cq(cq: *mut ibv_cq) -> c_int {
    with(libc::ENODEV, |m| {
        if !m.cqs.contains_key(&(cq as usize)) {
            m.fault(format!("ibv_destroy_cq({cq:p}): no such CQ"));
            return libc::EINVAL;
        }
        let used = m.qps.keys().any(|&q| {
            // SAFETY: a live QP of ours.
            let qp = unsafe { &*(q as *const ibv_qp) };
            qp.send_cq == cq || qp.recv_cq == cq
        });
        if used {
            m.fault(format!("ibv_destroy_cq({cq:p}): a QP still uses it"));
            return libc::EBUSY;
        }
        m.cqs.remove(&(cq as usize));
        // SAFETY: a live CQ of ours, just unregistered: freed once.
        unsafe { unbox(cq) };
        0
    })
}

unsafe extern "C" fn create_qp(pd: *mut ibv_pd, attr: *mut ibv_qp_init_attr) -> *mut ibv_qp {
    with(fail(libc::ENODEV), |m| {
        if !m.pds.contains(&(pd as usize)) || attr.is_null() {
            m.fault(format!(
                "ibv_create_qp({pd:p}, {attr:p}): no such PD, or no attributes"
            ));
            return fail(libc::EINVAL);
        }
        // SAFETY: the caller's attributes.
        let a = unsafe { &*attr };
        for cq in [a.send_cq, a.recv_cq] {
            if !m.cqs.contains_key(&(cq as usize)) {
                m.fault(format!("ibv_create_qp: no such CQ {cq:p}"));
                return fail(libc::EINVAL);
            }
        }
        if !a.srq.is_null() && !m.srqs.contains(&(a.srq as usize)) {
            m.fault(format!("ibv_create_qp: no such SRQ {:p}", a.srq));
            return fail(libc::EINVAL);
        }
        if a.qp_type != IBV_QPT_RC && a.qp_type != IBV_QPT_UD {
            return fail(libc::EOPNOTSUPP);
        }
        let qp = boxed::<ibv_qp>();
        let qpn = m.next_qpn;
        m.next_qpn = (m.next_qpn + 1) & 0x00ff_ffff;
        // SAFETY: just made; `pd` is a live PD of ours.
        unsafe {
            (*qp).context = (*pd).context;
            (*qp).qp_context = a.qp_context;
            (*qp).pd = pd;
            (*qp).send_cq = a.send_cq;
            (*qp).recv_cq = a.recv_cq;
            (*qp).srq = a.srq;
            (*qp).qp_num = qpn;
            (*qp).state = IBV_QPS_RESET;
            (*qp).qp_type = a.qp_type;
        }
        m.qps.insert(
            qp as usize,
            QpRec {
                state: IBV_QPS_RESET,
                qp_type: a.qp_type,
                dest_qpn: None,
            },
        );
        qp
    })
}

/// Whether `attr` under `mask` is a valid move of a QP of type `qp_type` from `from`
/// (module doc); the new state when it is.
fn transition(qp_type: c_int, from: c_int, attr: &ibv_qp_attr, mask: c_int) -> Option<c_int> {
    if mask & IBV_QP_STATE == 0 {
        return None;
    }
    let to = attr.qp_state;
    let rc = qp_type == IBV_QPT_RC;
    let has = |m: c_int| mask & m == m;
    let ok = match (from, to) {
        (_, IBV_QPS_RESET | IBV_QPS_ERR) => true,
        (IBV_QPS_RESET, IBV_QPS_INIT) => {
            has(IBV_QP_PKEY_INDEX | IBV_QP_PORT)
                && has(if rc { IBV_QP_ACCESS_FLAGS } else { IBV_QP_QKEY })
                && attr.port_num == 1
        }
        (IBV_QPS_INIT, IBV_QPS_INIT) => true,
        (IBV_QPS_INIT, IBV_QPS_RTR) => {
            !rc || (has(IBV_QP_AV
                | IBV_QP_PATH_MTU
                | IBV_QP_DEST_QPN
                | IBV_QP_RQ_PSN
                | IBV_QP_MAX_DEST_RD_ATOMIC
                | IBV_QP_MIN_RNR_TIMER)
                && (1..=5).contains(&attr.path_mtu)
                && attr.dest_qp_num <= 0x00ff_ffff
                && attr.rq_psn <= 0x00ff_ffff
                && attr.min_rnr_timer <= 31)
        }
        (IBV_QPS_RTR, IBV_QPS_RTS) => {
            has(IBV_QP_SQ_PSN)
                && attr.sq_psn <= 0x00ff_ffff
                && (!rc
                    || (has(IBV_QP_TIMEOUT
                        | IBV_QP_RETRY_CNT
                        | IBV_QP_RNR_RETRY
                        | IBV_QP_MAX_QP_RD_ATOMIC)
                        && attr.timeout <= 31
                        && attr.retry_cnt <= 7
                        && attr.rnr_retry <= 7))
        }
        (IBV_QPS_RTS, IBV_QPS_RTS) => true,
        _ => false,
    };
    ok.then_some(to)
}

unsafe extern "C" fn modify_qp(qp: *mut ibv_qp, attr: *mut ibv_qp_attr, mask: c_int) -> c_int {
    with(libc::ENODEV, |m| {
        if attr.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: the caller's attributes.
        let a = unsafe { &*attr };
        let Some(rec) = m.qps.get_mut(&(qp as usize)) else {
            m.fault(format!("ibv_modify_qp({qp:p}): no such QP"));
            return libc::EINVAL;
        };
        let Some(to) = transition(rec.qp_type, rec.state, a, mask) else {
            return libc::EINVAL;
        };
        if to == IBV_QPS_RTR && rec.qp_type == IBV_QPT_RC {
            rec.dest_qpn = Some(a.dest_qp_num);
        }
        rec.state = to;
        // SAFETY: a live QP of ours.
        unsafe { (*qp).state = to };
        0
    })
}

unsafe extern "C" fn destroy_qp(qp: *mut ibv_qp) -> c_int {
    with(libc::ENODEV, |m| {
        if m.qps.remove(&(qp as usize)).is_none() {
            m.fault(format!("ibv_destroy_qp({qp:p}): no such QP"));
            return libc::EINVAL;
        }
        // SAFETY: a live QP of ours, just unregistered: freed once.
        unsafe { unbox(qp) };
        0
    })
}

unsafe extern "C" fn create_srq(pd: *mut ibv_pd, attr: *mut ibv_srq_init_attr) -> *mut ibv_srq {
    with(fail(libc::ENODEV), |m| {
        if !m.pds.contains(&(pd as usize)) || attr.is_null() {
            m.fault(format!(
                "ibv_create_srq({pd:p}, {attr:p}): no such PD, or no attributes"
            ));
            return fail(libc::EINVAL);
        }
        let srq = boxed::<ibv_srq>();
        // SAFETY: just made; `pd` a live PD of ours, `attr` the caller's.
        unsafe {
            (*srq).context = (*pd).context;
            (*srq).srq_context = (*attr).srq_context;
            (*srq).pd = pd;
        }
        m.srqs.insert(srq as usize);
        srq
    })
}

unsafe extern "C" fn destroy_srq(srq: *mut ibv_srq) -> c_int {
    with(libc::ENODEV, |m| {
        if !m.srqs.contains(&(srq as usize)) {
            m.fault(format!("ibv_destroy_srq({srq:p}): no such SRQ"));
            return libc::EINVAL;
        }
        let used = m.qps.keys().any(|&q| {
            // SAFETY: a live QP of ours.
            unsafe { (*(q as *const ibv_qp)).srq == srq }
        });
        if used {
            m.fault(format!("ibv_destroy_srq({srq:p}): a QP still uses it"));
            return libc::EBUSY;
        }
        m.srqs.remove(&(srq as usize));
        // SAFETY: a live SRQ of ours, just unregistered: freed once.
        unsafe { unbox(srq) };
        0
    })
}

unsafe extern "C" fn query_port(
    ctx: *mut ibv_context,
    port: u8,
    attr: *mut ibv_port_attr,
) -> c_int {
    with(libc::ENODEV, |m| {
        if !ctx_ok(m, "ibv_query_port", ctx) || attr.is_null() {
            return libc::EINVAL;
        }
        if port != 1 {
            return libc::EINVAL;
        }
        // SAFETY: the caller's attributes; all zeros is a valid ibv_port_attr.
        unsafe {
            *attr = std::mem::zeroed();
            (*attr).state = PORT_ACTIVE;
            (*attr).max_mtu = PORT_MTU;
            (*attr).active_mtu = PORT_MTU;
            (*attr).gid_tbl_len = 1024;
        }
        0
    })
}

/// `ibv_attach_mcast` / `ibv_detach_mcast`: 0 for a live UD QP of ours.
fn mcast(call: &str, qp: *mut ibv_qp) -> c_int {
    with(libc::ENODEV, |m| match m.qps.get(&(qp as usize)) {
        Some(q) if q.qp_type == IBV_QPT_UD => 0,
        Some(_) => libc::EINVAL,
        None => {
            m.fault(format!("{call}({qp:p}): no such QP"));
            libc::EINVAL
        }
    })
}

unsafe extern "C" fn attach_mcast(qp: *mut ibv_qp, _gid: *const ibv_gid, _lid: u16) -> c_int {
    mcast("ibv_attach_mcast", qp)
}

unsafe extern "C" fn detach_mcast(qp: *mut ibv_qp, _gid: *const ibv_gid, _lid: u16) -> c_int {
    mcast("ibv_detach_mcast", qp)
}

unsafe extern "C" fn mad_send(
    ctx: *mut ibv_context,
    dst: *const libc::sockaddr,
    mad: *const c_void,
    len: usize,
) -> c_int {
    with(-1, |m| {
        if !ctx_ok(m, "softroce_mad_send", ctx) {
            return -1;
        }
        // SAFETY: the caller passes a sockaddr (or NULL).
        let Some(to) = (unsafe { softroce::net::sockaddr::socket_addr_from_ptr(dst) }) else {
            m.fault("softroce_mad_send: no destination address".into());
            return -1;
        };
        if mad.is_null() || len != MAD_LEN {
            m.fault(format!("softroce_mad_send: {len} bytes, not a MAD"));
            return -1;
        }
        let mut b = Box::new([0u8; MAD_LEN]);
        // SAFETY: the caller passes `len` (= 256) readable bytes at `mad`.
        b.copy_from_slice(unsafe { std::slice::from_raw_parts(mad.cast::<u8>(), MAD_LEN) });
        m.outbox.push_back((to.ip(), b));
        0
    })
}

unsafe extern "C" fn mad_recv(
    ctx: *mut ibv_context,
    mad: *mut c_void,
    src: *mut libc::sockaddr_storage,
    _timeout_ms: c_int,
) -> c_int {
    with(-1, |m| {
        if !ctx_ok(m, "softroce_mad_recv", ctx) || mad.is_null() || src.is_null() {
            crate::set_errno(libc::EINVAL);
            return -1;
        }
        let (got, from) = match m.inbox.pop_front() {
            None => return 0,
            Some(Qp1Input::Unreachable(from)) => (2, from),
            Some(Qp1Input::Mad(from, bytes)) => {
                let n = bytes.len().min(MAD_LEN);
                // SAFETY: the caller passes 256 writable bytes at `mad`.
                unsafe {
                    std::ptr::write_bytes(mad.cast::<u8>(), 0, MAD_LEN);
                    std::ptr::copy_nonoverlapping(bytes.as_ptr(), mad.cast::<u8>(), n);
                }
                (1, from)
            }
        };
        // SAFETY: the caller passes a sockaddr_storage.
        softroce::net::sockaddr::write_socket_addr(unsafe { &mut *src }, SocketAddr::new(from, 0));
        got
    })
}

unsafe extern "C" fn cm_slot(_ctx: *mut ibv_context) -> c_int {
    0
}

unsafe extern "C" fn cm_listen(ctx: *mut ibv_context, service_id: u64, listen: c_int) -> c_int {
    with(-1, |m| {
        if !ctx_ok(m, "softroce_cm_listen", ctx) {
            return -1;
        }
        if listen != 0 {
            m.steered.insert(service_id);
        } else {
            m.steered.remove(&service_id);
        }
        0
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attr(state: c_int) -> ibv_qp_attr {
        ibv_qp_attr {
            qp_state: state,
            port_num: 1,
            path_mtu: 3,
            ..Default::default()
        }
    }

    #[test]
    fn modify_qp_follows_the_state_diagram_and_its_required_attributes() {
        let init = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
        let rtr = IBV_QP_STATE
            | IBV_QP_AV
            | IBV_QP_PATH_MTU
            | IBV_QP_DEST_QPN
            | IBV_QP_RQ_PSN
            | IBV_QP_MAX_DEST_RD_ATOMIC
            | IBV_QP_MIN_RNR_TIMER;
        let rc = IBV_QPT_RC;
        let reset = IBV_QPS_RESET;
        assert_eq!(
            transition(rc, reset, &attr(IBV_QPS_INIT), init),
            Some(IBV_QPS_INIT)
        );
        assert_eq!(
            transition(rc, reset, &attr(IBV_QPS_INIT), init & !IBV_QP_PORT),
            None
        );
        assert_eq!(
            transition(rc, reset, &attr(IBV_QPS_RTR), rtr),
            None,
            "RESET -> RTR"
        );
        assert_eq!(
            transition(rc, IBV_QPS_INIT, &attr(IBV_QPS_RTR), rtr),
            Some(IBV_QPS_RTR)
        );
        let mut bad = attr(IBV_QPS_RTR);
        bad.path_mtu = 0;
        assert_eq!(transition(rc, IBV_QPS_INIT, &bad, rtr), None, "path MTU 0");
        assert_eq!(
            transition(rc, IBV_QPS_ERR, &attr(IBV_QPS_RTR), rtr),
            None,
            "ERR -> RTR"
        );
        assert_eq!(
            transition(rc, IBV_QPS_RTS, &attr(IBV_QPS_ERR), IBV_QP_STATE),
            Some(IBV_QPS_ERR)
        );
        let ud = IBV_QPT_UD;
        assert_eq!(
            transition(ud, IBV_QPS_INIT, &attr(IBV_QPS_RTR), IBV_QP_STATE),
            Some(IBV_QPS_RTR)
        );
        let sq = IBV_QP_STATE | IBV_QP_SQ_PSN;
        assert_eq!(
            transition(ud, IBV_QPS_RTR, &attr(IBV_QPS_RTS), sq),
            Some(IBV_QPS_RTS)
        );
        assert_eq!(
            transition(rc, IBV_QPS_RTR, &attr(IBV_QPS_RTS), sq),
            None,
            "RC RTS needs more"
        );
    }
}
