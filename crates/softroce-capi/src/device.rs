//! Devices and contexts: the device list from `$SOFTROCE_IP`, `ibv_open_device` /
//! `ibv_close_device`, and the queries (`ibv_query_device`, `ibv_query_port`, the GID and
//! P_Key tables, async events).

use crate::abi::*;
use crate::{ffi, ffi_errno, neg_errno, null_errno};
use core::ffi::{c_char, c_int, c_void};
use parking_lot::Mutex;
use softroce::net::discover::{self, DeviceAddr};
use softroce::net::{UdpDevice, UdpOptions};
use softroce::verbs::{DeviceConfig, EventElement, PathMtu};
use std::collections::HashMap;
use std::net::IpAddr;
use std::os::fd::AsRawFd;
use std::sync::{Arc, OnceLock, Weak};

/// A device of the list: the `ibv_device` programs read, and its address.
#[repr(C)]
pub(crate) struct Device {
    pub ibv: ibv_device,
    pub addr: DeviceAddr,
    pub index: c_int,
}

// SAFETY: the raw pointers in `ibv_device` are NULL function pointers; nothing is shared
// mutably (devices are created once and never change).
unsafe impl Sync for Device {}
unsafe impl Send for Device {}

/// The process's devices, made on the first `ibv_get_device_list` and kept for the life of
/// the process (rdma-core keeps its devices too: a context outlives `ibv_free_device_list`).
fn devices() -> Result<&'static [Device], i32> {
    static DEVICES: OnceLock<Result<Vec<Device>, i32>> = OnceLock::new();
    DEVICES
        .get_or_init(|| match discover::devices_from_env() {
            Ok(list) => Ok(list
                .into_iter()
                .enumerate()
                .map(|(i, addr)| new_device(addr, i as c_int))
                .collect()),
            Err(e) => {
                eprintln!("softroce: {e}");
                Err(e.errno())
            }
        })
        .as_ref()
        .map(|v| v.as_slice())
        .map_err(|e| *e)
}

fn copy_str(dst: &mut [c_char], s: &str) {
    let n = dst.len() - 1;
    for (d, b) in dst.iter_mut().zip(s.bytes().take(n)) {
        *d = b as c_char;
    }
}

fn new_device(addr: DeviceAddr, index: c_int) -> Device {
    let mut ibv = ibv_device {
        _ops: _ibv_device_ops {
            _dummy1: None,
            _dummy2: None,
        },
        node_type: 1,      // IBV_NODE_CA
        transport_type: 0, // IBV_TRANSPORT_IB (as rxe)
        name: [0; IBV_SYSFS_NAME_MAX],
        dev_name: [0; IBV_SYSFS_NAME_MAX],
        dev_path: [0; IBV_SYSFS_PATH_MAX],
        ibdev_path: [0; IBV_SYSFS_PATH_MAX],
    };
    copy_str(&mut ibv.name, &addr.name);
    copy_str(&mut ibv.dev_name, &format!("uverbs{index}"));
    copy_str(
        &mut ibv.dev_path,
        &format!("/sys/class/infiniband_verbs/uverbs{index}"),
    );
    copy_str(
        &mut ibv.ibdev_path,
        &format!("/sys/class/infiniband/{}", addr.name),
    );
    Device { ibv, addr, index }
}

/// The node GUID of the device on `ip`, before it is opened: the EUI-64 of the MAC
/// 02:00:a:b:c:d the engine derives from the address (checked against
/// `Device::query_device` when the device opens).
fn node_guid(ip: IpAddr) -> u64 {
    let o = match ip {
        IpAddr::V4(v4) => v4.octets(),
        IpAddr::V6(v6) => {
            let o = v6.octets();
            [o[12], o[13], o[14], o[15]]
        }
    };
    u64::from_be_bytes([0x00, 0x00, o[0], 0xff, 0xfe, o[1], o[2], o[3]])
}

pub(crate) extern "C" fn ibv_get_device_list(num_devices: *mut c_int) -> *mut *mut ibv_device {
    ffi!(std::ptr::null_mut(), {
        static LOG: std::sync::Once = std::sync::Once::new();
        LOG.call_once(crate::log::init_log);
        let list = match devices() {
            Ok(l) => l,
            Err(e) => return null_errno(e),
        };
        let mut ptrs: Vec<*mut ibv_device> = list
            .iter()
            .map(|d| &d.ibv as *const ibv_device as *mut ibv_device)
            .collect();
        ptrs.push(std::ptr::null_mut());
        if !num_devices.is_null() {
            // SAFETY: the caller passes NULL or a writable int.
            unsafe { *num_devices = list.len() as c_int };
        }
        // Freed by ibv_free_device_list, which knows the length from the NULL terminator.
        Box::into_raw(ptrs.into_boxed_slice()) as *mut *mut ibv_device
    })
}

pub(crate) extern "C" fn ibv_free_device_list(list: *mut *mut ibv_device) {
    ffi!((), {
        if list.is_null() {
            return;
        }
        let mut n = 0;
        // SAFETY: `list` came from ibv_get_device_list: NULL-terminated, allocated as a boxed
        // slice of n + 1 pointers.
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

/// The `Device` behind an `ibv_device` pointer of our list.
fn device_of(dev: *mut ibv_device) -> Option<&'static Device> {
    let list = devices().ok()?;
    list.iter().find(|d| std::ptr::eq(&d.ibv, dev))
}

pub(crate) extern "C" fn ibv_get_device_name(dev: *mut ibv_device) -> *const c_char {
    ffi!(std::ptr::null(), {
        match device_of(dev) {
            Some(d) => d.ibv.name.as_ptr(),
            None => null_errno::<c_char>(libc::EINVAL),
        }
    })
}

pub(crate) extern "C" fn ibv_get_device_guid(dev: *mut ibv_device) -> u64 {
    ffi!(0, {
        match device_of(dev) {
            // __be64: the GUID's bytes in network order.
            Some(d) => node_guid(d.addr.ip).to_be(),
            None => 0,
        }
    })
}

pub(crate) extern "C" fn ibv_get_device_index(dev: *mut ibv_device) -> c_int {
    ffi!(-1, {
        match device_of(dev) {
            Some(d) => d.index,
            None => -1,
        }
    })
}

/// An open device: the `verbs_context` (whose `context` is the `ibv_context` programs hold),
/// then softroce's state.
#[repr(C)]
pub(crate) struct Context {
    pub vctx: verbs_context,
    pub dev: Arc<UdpDevice>,
    pub device: &'static Device,
    /// CQ number → `*mut Cq`, for `ibv_get_cq_event` and CQ async events.
    pub cqs: Mutex<HashMap<u32, usize>>,
    /// QP number → `*mut Qp`, for QP async events.
    pub qps: Mutex<HashMap<u32, usize>>,
    /// SRQ number → `*mut Srq`, for SRQ async events.
    pub srqs: Mutex<HashMap<u32, usize>>,
    /// `ibv_context.cmd_fd`: softroce has no uverbs command file, so this is `/dev/null`,
    /// open for the context's life. Programs that only `dup` it (pyverbs' shared-PD test,
    /// before `ibv_import_device`) get a valid descriptor, and `ibv_import_device` then says
    /// EOPNOTSUPP, as rdma-core does for a device that cannot import.
    pub cmd_fd: Option<std::os::fd::OwnedFd>,
}

/// The `Context` an `ibv_context` pointer (from `ibv_open_device`) belongs to.
///
/// # Safety
/// `ctx` must come from `ibv_open_device` and not be closed.
pub(crate) unsafe fn context<'a>(ctx: *mut ibv_context) -> &'a Context {
    let off = std::mem::offset_of!(Context, vctx) + std::mem::offset_of!(verbs_context, context);
    // SAFETY: our caller guarantees `ctx` is the `vctx.context` field of a live `Context`.
    unsafe { &*(ctx as *mut u8).sub(off).cast::<Context>() }
}

/// The environment variable that chooses how `ibv_poll_cq` drives a device: unset (or `1`,
/// `always`, or anything not below): busy polling (`UdpOptions::busy_poll`: the polling
/// thread receives from the socket itself); `adaptive`: busy polling except while the device
/// mostly sends (`UdpOptions::busy_poll_adaptive`: then its own thread receives the ACKs,
/// which pays on a machine whose cores other work keeps busy and costs on an idle one);
/// `0`: never (the device's thread receives). Measured in docs/performance.md.
pub const SOFTROCE_BUSY_POLL: &str = "SOFTROCE_BUSY_POLL";

/// `(busy_poll, busy_poll_adaptive)` from `$SOFTROCE_BUSY_POLL` ([`SOFTROCE_BUSY_POLL`]).
fn busy_poll_from_env() -> (bool, bool) {
    match std::env::var_os(SOFTROCE_BUSY_POLL) {
        Some(v) if v == "0" => (false, false),
        Some(v) if v == "adaptive" => (true, true),
        _ => (true, false),
    }
}

/// A table of the process's objects that a `fork`ed child starts empty: what the parent put
/// in it is the parent's (a child opens the devices it uses itself: the parent's contexts
/// have no driver thread in the child). The child leaks the parent's entries
/// instead of dropping them: dropping could run the destructors of the parent's devices,
/// which join threads that do not exist in the child.
#[derive(Default)]
pub(crate) struct PerProcess<T: Default> {
    /// The process the table's entries belong to (0 before the first use).
    pid: u32,
    table: T,
}

impl<T: Default> PerProcess<T> {
    /// The table, emptied first if this process is not the one that filled it.
    pub(crate) fn get(&mut self) -> &mut T {
        let pid = std::process::id();
        if self.pid != pid {
            std::mem::forget(std::mem::take(&mut self.table));
            self.pid = pid;
        }
        &mut self.table
    }
}

/// Engine devices open in this process, by address: a second `ibv_open_device` of a device
/// shares the first one's socket and driver thread. A forked child opens its own
/// ([`PerProcess`]); the parent's receive socket is not open in the child (the engine's
/// `pthread_atfork` handler), so the child's open fails with EADDRINUSE while the parent
/// holds the device, and succeeds once the parent has closed it.
fn open_udp(addr: &DeviceAddr) -> std::io::Result<Arc<UdpDevice>> {
    type Open = PerProcess<HashMap<IpAddr, Weak<UdpDevice>>>;
    static OPEN: OnceLock<Mutex<Open>> = OnceLock::new();
    let mut guard = OPEN.get_or_init(Default::default).lock();
    let open = guard.get();
    if let Some(d) = open.get(&addr.ip).and_then(Weak::upgrade) {
        return Ok(d);
    }
    let (busy_poll, busy_poll_adaptive) = busy_poll_from_env();
    let opts = UdpOptions {
        busy_poll,
        busy_poll_adaptive,
        ..UdpOptions::process_default()
    };
    let d = Arc::new(UdpDevice::open_with_options(
        DeviceConfig::new(&addr.name, addr.ip),
        &opts,
    )?);
    open.insert(addr.ip, Arc::downgrade(&d));
    if let Some(delay) = softroce::net::panic::test_panic_delay("device") {
        // The test hook `SOFTROCE_TEST_PANIC=device:<ms>`: the driver thread panics then.
        let d = Arc::downgrade(&d);
        std::thread::spawn(move || {
            std::thread::sleep(delay);
            if let Some(d) = d.upgrade() {
                d.inject_panic_for_test();
            }
        });
    }
    Ok(d)
}

/// The errno of a failed device open: the system call's, which the engine's message (the
/// address, a hint) wraps by kind: EADDRINUSE when another process (or kernel rxe) owns the
/// address's UDP port 4791, EADDRNOTAVAIL for an address not on the host, EPERM for a raw
/// socket refused; ENODEV otherwise.
fn open_errno(e: &std::io::Error) -> c_int {
    e.raw_os_error().unwrap_or(match e.kind() {
        std::io::ErrorKind::AddrInUse => libc::EADDRINUSE,
        std::io::ErrorKind::AddrNotAvailable => libc::EADDRNOTAVAIL,
        std::io::ErrorKind::PermissionDenied => libc::EPERM,
        _ => libc::ENODEV,
    })
}

pub(crate) extern "C" fn ibv_open_device(dev: *mut ibv_device) -> *mut ibv_context {
    ffi!(std::ptr::null_mut(), {
        let Some(device) = device_of(dev) else {
            return null_errno(libc::EINVAL);
        };
        let udp = match open_udp(&device.addr) {
            Ok(d) => d,
            Err(e) => {
                eprintln!("softroce: {e}");
                return null_errno(open_errno(&e));
            }
        };
        let async_fd = udp.device().as_raw_fd();
        let cmd_fd = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/null")
            .ok()
            .map(std::os::fd::OwnedFd::from);
        let ctx = Box::new(Context {
            vctx: verbs_context {
                query_port: Some(query_port_op),
                advise_mr: None,
                alloc_null_mr: None,
                read_counters: None,
                attach_counters_point_flow: None,
                create_counters: None,
                destroy_counters: None,
                reg_dm_mr: None,
                alloc_dm: None,
                free_dm: None,
                modify_flow_action_esp: None,
                destroy_flow_action: None,
                create_flow_action_esp: None,
                modify_qp_rate_limit: None,
                alloc_parent_domain: None,
                dealloc_td: None,
                alloc_td: None,
                modify_cq: None,
                post_srq_ops: None,
                destroy_rwq_ind_table: None,
                create_rwq_ind_table: None,
                destroy_wq: None,
                modify_wq: None,
                create_wq: None,
                query_rt_values: None,
                create_cq_ex: Some(crate::ex::create_cq_ex),
                priv_: std::ptr::null_mut(),
                query_device_ex: Some(query_device_ex_op),
                ibv_destroy_flow: None,
                abi_placeholder2: None,
                ibv_create_flow: None,
                abi_placeholder1: None,
                open_qp: None,
                create_qp_ex: Some(crate::ex::create_qp_ex),
                get_srq_num: None,
                create_srq_ex: None,
                open_xrcd: None,
                close_xrcd: None,
                _abi_placeholder3: 0,
                sz: std::mem::size_of::<verbs_context>(),
                context: ibv_context {
                    device: &device.ibv as *const ibv_device as *mut ibv_device,
                    ops: crate::post::context_ops(),
                    cmd_fd: cmd_fd.as_ref().map_or(-1, |f| f.as_raw_fd()),
                    async_fd,
                    num_comp_vectors: 1,
                    mutex: libc::PTHREAD_MUTEX_INITIALIZER,
                    abi_compat: VERBS_ABI_IS_EXTENDED,
                },
            },
            dev: udp,
            device,
            cqs: Mutex::new(HashMap::new()),
            qps: Mutex::new(HashMap::new()),
            srqs: Mutex::new(HashMap::new()),
            cmd_fd,
        });
        let ctx = Box::into_raw(ctx);
        // SAFETY: just allocated; the field lives as long as the box.
        unsafe { &raw mut (*ctx).vctx.context }
    })
}

pub(crate) extern "C" fn ibv_close_device(ctx: *mut ibv_context) -> c_int {
    ffi!(neg_errno(libc::EIO), {
        if ctx.is_null() {
            return neg_errno(libc::EINVAL);
        }
        let off =
            std::mem::offset_of!(Context, vctx) + std::mem::offset_of!(verbs_context, context);
        // SAFETY: `ctx` came from ibv_open_device (the caller's contract), so it sits `off`
        // bytes into a boxed `Context`; closing frees it.
        drop(unsafe { Box::from_raw((ctx as *mut u8).sub(off).cast::<Context>()) });
        0
    })
}

fn fill_device_attr(c: &Context, out: &mut ibv_device_attr) {
    let a = c.dev.device().query_device();
    // SAFETY: ibv_device_attr is plain old data; all zeros is a valid value.
    *out = unsafe { std::mem::zeroed() };
    copy_str(&mut out.fw_ver, &a.fw_ver);
    out.node_guid = a.node_guid.to_be();
    out.sys_image_guid = a.sys_image_guid.to_be();
    out.max_mr_size = a.max_mr_size;
    out.page_size_cap = 0xffff_f000; // rxe: RXE_PAGE_SIZE_CAP
    out.vendor_id = a.vendor_id;
    out.vendor_part_id = 0;
    out.hw_ver = 0;
    out.max_qp = a.max_qp as c_int;
    out.max_qp_wr = a.max_qp_wr as c_int;
    // rxe's RXE_DEVICE_CAP_FLAGS, in `enum ibv_device_cap_flags` bits: BAD_PKEY_CNTR,
    // BAD_QKEY_CNTR, AUTO_PATH_MIG, CHANGE_PHY_PORT, UD_AV_PORT_ENFORCE, PORT_ACTIVE_EVENT,
    // SYS_IMAGE_GUID, RC_RNR_NAK_GEN, SRQ_RESIZE, MEM_WINDOW, MEM_MGT_EXTENSIONS,
    // MEM_WINDOW_TYPE_2B.
    out.device_cap_flags = (1 << 1)
        | (1 << 2)
        | (1 << 4)
        | (1 << 5)
        | (1 << 6)
        | (1 << 10)
        | (1 << 11)
        | (1 << 12)
        | (1 << 13)
        | (1 << 17)
        | (1 << 21)
        | (1 << 24);
    out.max_sge = a.max_sge as c_int;
    out.max_sge_rd = a.max_sge as c_int;
    out.max_cq = a.max_cq as c_int;
    out.max_cqe = (a.max_cqe - 1) as c_int;
    out.max_mr = a.max_mr as c_int;
    out.max_pd = a.max_pd as c_int;
    out.max_qp_rd_atom = a.max_qp_rd_atom as c_int;
    out.max_res_rd_atom = a.max_res_rd_atom as c_int;
    out.max_qp_init_rd_atom = a.max_qp_init_rd_atom as c_int;
    out.atomic_cap = 1; // IBV_ATOMIC_HCA
    out.max_mw = a.max_mw as c_int;
    out.max_mcast_grp = a.max_mcast_grp as c_int;
    out.max_mcast_qp_attach = a.max_mcast_qp_attach as c_int;
    out.max_total_mcast_qp_attach = a.max_total_mcast_qp_attach as c_int;
    out.max_ah = a.max_ah as c_int;
    out.max_srq = a.max_srq as c_int;
    out.max_srq_wr = a.max_srq_wr as c_int;
    out.max_srq_sge = a.max_srq_sge as c_int;
    out.max_pkeys = a.max_pkeys;
    out.local_ca_ack_delay = a.local_ca_ack_delay;
    out.phys_port_cnt = a.phys_port_cnt;
}

pub(crate) extern "C" fn ibv_query_device(
    ctx: *mut ibv_context,
    attr: *mut ibv_device_attr,
) -> c_int {
    ffi_errno!({
        if ctx.is_null() || attr.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: a live context and a writable attribute struct (the caller's contract).
        unsafe { fill_device_attr(context(ctx), &mut *attr) };
        0
    })
}

/// `verbs_context.query_device_ex`: `orig_attr` and zeros (no extended capabilities).
unsafe extern "C" fn query_device_ex_op(
    ctx: *mut ibv_context,
    input: *const ibv_query_device_ex_input,
    attr: *mut ibv_device_attr_ex,
    attr_size: usize,
) -> c_int {
    ffi_errno!({
        // SAFETY: `input` is NULL or readable (the caller's contract).
        if !input.is_null() && unsafe { (*input).comp_mask } != 0 {
            return libc::EINVAL;
        }
        if attr.is_null() || attr_size < std::mem::size_of::<ibv_device_attr>() {
            return libc::EINVAL;
        }
        // SAFETY: `attr` is writable for `attr_size` bytes and `ctx` is a live context.
        unsafe {
            std::ptr::write_bytes(attr.cast::<u8>(), 0, attr_size);
            fill_device_attr(context(ctx), &mut (*attr).orig_attr);
            let n = std::mem::size_of::<ibv_device_attr_ex>();
            if attr_size >= n {
                (*attr).phys_port_cnt_ex = 1;
            }
        }
        0
    })
}

fn port_attr(c: &Context, port_num: u8) -> Result<ibv_port_attr, i32> {
    let p = c.dev.device().query_port(port_num).map_err(|e| e.errno())?;
    let a = c.dev.device().query_device();
    Ok(ibv_port_attr {
        state: c_int::from(p.state),
        max_mtu: p.max_mtu as c_int,
        active_mtu: p.active_mtu as c_int,
        gid_tbl_len: GID_TBL_LEN.max(p.gid_tbl_len) as c_int,
        // rxe: RXE_PORT_CAP_FLAGS = IBV_PORT_CM_SUP
        port_cap_flags: 1 << 16,
        max_msg_sz: a.max_msg_sz.min(u64::from(u32::MAX)) as u32,
        bad_pkey_cntr: 0,
        qkey_viol_cntr: 0,
        pkey_tbl_len: p.pkey_tbl_len,
        lid: 0,
        sm_lid: 0,
        lmc: 0,
        max_vl_num: 1, // IBV_VL_0 ... rxe reports 1
        sm_sl: 0,
        subnet_timeout: 0,
        init_type_reply: 0,
        active_width: 1, // 1X, as rxe 6.1 on the interop guest's virtio NIC
        active_speed: 1, // rxe reports the netdev's speed; SDR here
        phys_state: 5,   // LINK_UP
        link_layer: 2,   // IBV_LINK_LAYER_ETHERNET
        flags: 0,
        port_cap_flags2: 0,
    })
}

/// `verbs_context.query_port`, what the static inline `ibv_query_port` calls.
unsafe extern "C" fn query_port_op(
    ctx: *mut ibv_context,
    port_num: u8,
    attr: *mut ibv_port_attr,
    attr_len: usize,
) -> c_int {
    ffi_errno!({
        if ctx.is_null() || attr.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: a live context.
        let c = unsafe { context(ctx) };
        match port_attr(c, port_num) {
            Ok(p) => {
                let n = attr_len.min(std::mem::size_of::<ibv_port_attr>());
                // SAFETY: `attr` is writable for `attr_len` bytes; we write at most that.
                unsafe {
                    std::ptr::copy_nonoverlapping((&raw const p).cast::<u8>(), attr.cast::<u8>(), n)
                };
                0
            }
            Err(e) => e,
        }
    })
}

/// The exported `ibv_query_port` (the fallback of the inline one for contexts without
/// `verbs_context.query_port`): the struct up to and including `link_layer`.
pub(crate) extern "C" fn ibv_query_port(
    ctx: *mut ibv_context,
    port_num: u8,
    attr: *mut ibv_port_attr,
) -> c_int {
    let n = std::mem::offset_of!(ibv_port_attr, link_layer) + 1;
    // SAFETY: forwards the caller's pointers; the compat struct holds at least `n` bytes.
    unsafe { query_port_op(ctx, port_num, attr, n) }
}

/// Entries of the port's GID table that `ibv_query_port` reports (`gid_tbl_len`): rxe's
/// `RXE_PORT_GID_TBL_LEN`. softroce fills the first few (the device's GIDs); the rest are
/// empty, as on rxe: `ibv_query_gid` reads them as zeros, `ibv_query_gid_ex` says ENODATA.
pub(crate) const GID_TBL_LEN: u32 = 1024;

/// GID `index` of port `port_num`: `Ok(None)` for an empty entry of the table, EINVAL for a
/// port other than 1 or an index past [`GID_TBL_LEN`].
fn gid_slot(
    c: &Context,
    port_num: u32,
    index: u32,
) -> Result<Option<softroce::verbs::GidEntry>, i32> {
    let port = u8::try_from(port_num).map_err(|_| libc::EINVAL)?;
    c.dev.device().query_port(port).map_err(|e| e.errno())?;
    if index >= GID_TBL_LEN {
        return Err(libc::EINVAL);
    }
    let Ok(index) = u8::try_from(index) else {
        return Ok(None);
    };
    Ok(c.dev.device().query_gid(port, index).ok())
}

pub(crate) extern "C" fn ibv_query_gid(
    ctx: *mut ibv_context,
    port_num: u8,
    index: c_int,
    gid: *mut ibv_gid,
) -> c_int {
    ffi!(neg_errno(libc::EIO), {
        if ctx.is_null() || gid.is_null() || index < 0 {
            return neg_errno(libc::EINVAL);
        }
        // SAFETY: a live context.
        let c = unsafe { context(ctx) };
        // An empty entry reads as zeros (rdma-core: "preserve API behavior for empty GID").
        match gid_slot(c, u32::from(port_num), index as u32) {
            Ok(e) => {
                // SAFETY: `gid` is writable (the caller's contract).
                unsafe { (*gid).raw = e.map_or([0; 16], |e| e.gid.0) };
                0
            }
            Err(e) => neg_errno(e),
        }
    })
}

/// `ibv_query_gid_type` (IBVERBS_PRIVATE_34, used by ibv_devinfo): every softroce GID is
/// RoCE v2 (`IBV_GID_TYPE_SYSFS_ROCE_V2` = 1).
pub(crate) extern "C" fn ibv_query_gid_type(
    ctx: *mut ibv_context,
    port_num: u8,
    index: u32,
    gid_type: *mut u32,
) -> c_int {
    ffi!(neg_errno(libc::EIO), {
        if ctx.is_null() || gid_type.is_null() {
            return neg_errno(libc::EINVAL);
        }
        // SAFETY: a live context.
        let c = unsafe { context(ctx) };
        // An empty entry is IBV_GID_TYPE_SYSFS_IB_ROCE_V1 (0), as rdma-core says for one.
        match gid_slot(c, u32::from(port_num), index) {
            Ok(e) => {
                // SAFETY: writable (the caller's contract).
                unsafe { *gid_type = u32::from(e.is_some()) };
                0
            }
            Err(e) => neg_errno(e),
        }
    })
}

/// `IBV_GID_TYPE_ROCE_V2` of `enum ibv_gid_type`.
const IBV_GID_TYPE_ROCE_V2: u32 = 2;

pub(crate) extern "C" fn _ibv_query_gid_ex(
    ctx: *mut ibv_context,
    port_num: u32,
    gid_index: u32,
    entry: *mut ibv_gid_entry,
    flags: u32,
    entry_size: usize,
) -> c_int {
    ffi!(libc::EIO, {
        if ctx.is_null() || entry.is_null() || flags != 0 {
            return libc::EINVAL;
        }
        if entry_size < std::mem::size_of::<ibv_gid_entry>() {
            return libc::EINVAL;
        }
        // SAFETY: a live context.
        let c = unsafe { context(ctx) };
        match gid_slot(c, port_num, gid_index) {
            Ok(None) => libc::ENODATA,
            Err(e) => e,
            Ok(Some(e)) => {
                // SAFETY: `entry` is writable for `entry_size` bytes.
                unsafe {
                    *entry = ibv_gid_entry {
                        gid: ibv_gid { raw: e.gid.0 },
                        gid_index,
                        port_num,
                        gid_type: IBV_GID_TYPE_ROCE_V2,
                        ndev_ifindex: 0,
                    }
                };
                0
            }
        }
    })
}

pub(crate) extern "C" fn _ibv_query_gid_table(
    ctx: *mut ibv_context,
    entries: *mut ibv_gid_entry,
    max_entries: usize,
    flags: u32,
    entry_size: usize,
) -> isize {
    ffi!(-(libc::EIO as isize), {
        if ctx.is_null() || flags != 0 || entry_size < std::mem::size_of::<ibv_gid_entry>() {
            return -(libc::EINVAL as isize);
        }
        // SAFETY: a live context.
        let c = unsafe { context(ctx) };
        let gids = c.dev.device().gids();
        if gids.len() > max_entries {
            return -(libc::EINVAL as isize);
        }
        for (i, e) in gids.iter().enumerate() {
            // SAFETY: `entries` holds `max_entries` entries of `entry_size` bytes.
            unsafe {
                let p = entries
                    .cast::<u8>()
                    .add(i * entry_size)
                    .cast::<ibv_gid_entry>();
                p.write_unaligned(ibv_gid_entry {
                    gid: ibv_gid { raw: e.gid.0 },
                    gid_index: u32::from(e.index),
                    port_num: 1,
                    gid_type: IBV_GID_TYPE_ROCE_V2,
                    ndev_ifindex: 0,
                });
            }
        }
        gids.len() as isize
    })
}

/// The one P_Key: the default full-membership 0xFFFF (network order in `*pkey`).
pub(crate) extern "C" fn ibv_query_pkey(
    ctx: *mut ibv_context,
    port_num: u8,
    index: c_int,
    pkey: *mut u16,
) -> c_int {
    ffi!(neg_errno(libc::EIO), {
        if ctx.is_null() || pkey.is_null() || port_num != 1 || index != 0 {
            return neg_errno(libc::EINVAL);
        }
        // SAFETY: writable (the caller's contract).
        unsafe { *pkey = 0xffff_u16.to_be() };
        0
    })
}

pub(crate) extern "C" fn ibv_get_pkey_index(
    ctx: *mut ibv_context,
    port_num: u8,
    pkey: u16,
) -> c_int {
    ffi!(-1, {
        if ctx.is_null() || port_num != 1 {
            return neg_errno(libc::EINVAL);
        }
        if u16::from_be(pkey) & 0x7fff == 0x7fff {
            0
        } else {
            neg_errno(libc::ENOENT)
        }
    })
}

pub(crate) extern "C" fn ibv_get_async_event(
    ctx: *mut ibv_context,
    event: *mut ibv_async_event,
) -> c_int {
    ffi!(neg_errno(libc::EIO), {
        if ctx.is_null() || event.is_null() {
            return neg_errno(libc::EINVAL);
        }
        // SAFETY: a live context.
        let c = unsafe { context(ctx) };
        let dev = c.dev.device();
        let ev = loop {
            if let Some(ev) = dev.try_get_async_event() {
                break ev;
            }
            if let Err(e) = wait_readable(c.vctx.context.async_fd) {
                return neg_errno(e);
            }
        };
        let element: *mut c_void = match ev.element {
            EventElement::Qp(n) => c.qps.lock().get(&n).copied().unwrap_or(0) as *mut c_void,
            EventElement::Cq(n) => c.cqs.lock().get(&n).copied().unwrap_or(0) as *mut c_void,
            EventElement::Srq(n) => c.srqs.lock().get(&n).copied().unwrap_or(0) as *mut c_void,
            EventElement::Port(p) => usize::from(p) as *mut c_void,
        };
        // SAFETY: writable (the caller's contract).
        unsafe {
            *event = ibv_async_event {
                element,
                event_type: ev.event_type as c_int,
            }
        };
        0
    })
}

pub(crate) extern "C" fn ibv_ack_async_event(_event: *mut ibv_async_event) {}

/// Waits until `fd` is readable: blocks in `poll` for a blocking fd; for an fd the program
/// made non-blocking, fails with `EAGAIN` at once (as a `read` would).
pub(crate) fn wait_readable(fd: c_int) -> Result<(), i32> {
    // SAFETY: fcntl on an fd we own; no pointers.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags >= 0 && flags & libc::O_NONBLOCK != 0 {
        return Err(libc::EAGAIN);
    }
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    loop {
        // SAFETY: one valid pollfd.
        let r = unsafe { libc::poll(&mut p, 1, -1) };
        if r >= 0 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO);
        if e != libc::EINTR {
            return Err(e);
        }
    }
}

/// The engine's path MTU from an `enum ibv_mtu` value.
pub(crate) fn path_mtu(v: c_int) -> Option<PathMtu> {
    match v {
        1 => Some(PathMtu::Mtu256),
        2 => Some(PathMtu::Mtu512),
        3 => Some(PathMtu::Mtu1024),
        4 => Some(PathMtu::Mtu2048),
        5 => Some(PathMtu::Mtu4096),
        _ => None,
    }
}

/// `ibv_is_fork_initialized`: `IBV_FORK_UNNEEDED` (2). softroce reaches registered memory
/// through the process's own address space, so after a `fork` the parent's MRs keep
/// working with no `MADV_DONTFORK` (what `ibv_fork_init` sets up on a real device); the
/// child may not use the parent's verbs objects (its engine threads did not fork).
pub(crate) extern "C" fn ibv_is_fork_initialized() -> c_int {
    2
}
