//! Devices: the device list from `$SOFTROCE_IP` (`ibv_get_device_list` and the
//! `ibv_get_device_*` queries), and `ibv_open_device` / `ibv_close_device`, which make a
//! [`Context`] and fill its function tables (`ibv_context_ops`, `verbs_context`) from the
//! object files. The queries made on an open device are `context.rs`'s.

use crate::context::{Context, query_device_ex_op, query_port_op};
use crate::handle::{free, into_handle, try_ref};
use crate::strings::copy_str;
use crate::{cq, mw, qp, qp_ex, srq};
use core::ffi::{c_char, c_int};
use parking_lot::Mutex;
use softroce::net::discover::{self, DeviceAddr};
use softroce::net::{UdpDevice, UdpOptions};
use softroce::verbs::DeviceConfig;
use softroce_cabi::abi::*;
use softroce_cabi::ffi;
use softroce_cabi::fork::ProcessLock;
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
    // rdma-core makes both paths from ibv_get_sysfs_path() (init.c).
    let sysfs = crate::sysfs::sysfs_path().to_string_lossy();
    copy_str(&mut ibv.name, &addr.name);
    copy_str(&mut ibv.dev_name, &format!("uverbs{index}"));
    copy_str(
        &mut ibv.dev_path,
        &format!("{sysfs}/class/infiniband_verbs/uverbs{index}"),
    );
    copy_str(
        &mut ibv.ibdev_path,
        &format!("{sysfs}/class/infiniband/{}", addr.name),
    );
    Device { ibv, addr, index }
}

pub(crate) extern "C" fn ibv_get_device_list(num_devices: *mut c_int) -> *mut *mut ibv_device {
    ffi!({
        static LOG: std::sync::Once = std::sync::Once::new();
        LOG.call_once(softroce_cabi::log::init_log);
        let list = devices()?;
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
        Ok(Box::into_raw(ptrs.into_boxed_slice()) as *mut *mut ibv_device)
    })
}

pub(crate) extern "C" fn ibv_free_device_list(list: *mut *mut ibv_device) {
    ffi!({
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
    ffi!({
        match device_of(dev) {
            Some(d) => Ok(d.ibv.name.as_ptr()),
            None => Err(libc::EINVAL),
        }
    })
}

pub(crate) extern "C" fn ibv_get_device_guid(dev: *mut ibv_device) -> u64 {
    // 0 for an unknown device, with no errno (as libibverbs).
    ffi!(panic = 0, {
        match device_of(dev) {
            // __be64: the GUID's bytes in network order.
            Some(d) => softroce::verbs::node_guid(d.addr.ip).to_be(),
            None => 0,
        }
    })
}

pub(crate) extern "C" fn ibv_get_device_index(dev: *mut ibv_device) -> c_int {
    // -1 for an unknown device, with no errno (as libibverbs).
    ffi!(panic = -1, {
        match device_of(dev) {
            Some(d) => d.index,
            None => -1,
        }
    })
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

/// Engine devices open in this process, by address: a second `ibv_open_device` of a device
/// shares the first one's socket and driver thread. A forked child opens its own
/// ([`ProcessLock`]); the parent's receive socket is not open in the child (the engine's
/// `pthread_atfork` handler), so the child's open fails with EADDRINUSE while the parent
/// holds the device, and succeeds once the parent has closed it.
fn open_udp(addr: &DeviceAddr) -> std::io::Result<Arc<UdpDevice>> {
    static OPEN: ProcessLock<HashMap<IpAddr, Weak<UdpDevice>>> = ProcessLock::new();
    let mut open = OPEN.lock();
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
    ffi!({
        let device = device_of(dev).ok_or(libc::EINVAL)?;
        let udp = open_udp(&device.addr).map_err(|e| {
            eprintln!("softroce: {e}");
            open_errno(&e)
        })?;
        let async_fd = udp.device().as_raw_fd();
        let cmd_fd = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/null")
            .ok()
            .map(std::os::fd::OwnedFd::from);
        Ok(into_handle::<ibv_context>(Context {
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
                create_cq_ex: Some(cq::create_cq_ex),
                priv_: std::ptr::null_mut(),
                query_device_ex: Some(query_device_ex_op),
                ibv_destroy_flow: None,
                abi_placeholder2: None,
                ibv_create_flow: None,
                abi_placeholder1: None,
                open_qp: None,
                create_qp_ex: Some(qp_ex::create_qp_ex),
                get_srq_num: None,
                create_srq_ex: None,
                open_xrcd: None,
                close_xrcd: None,
                _abi_placeholder3: 0,
                sz: std::mem::size_of::<verbs_context>(),
                context: ibv_context {
                    device: &device.ibv as *const ibv_device as *mut ibv_device,
                    ops: context_ops(),
                    cmd_fd: cmd_fd.as_ref().map_or(-1, |f| f.as_raw_fd()),
                    async_fd,
                    num_comp_vectors: 1,
                    mutex: libc::PTHREAD_MUTEX_INITIALIZER,
                    abi_compat: VERBS_ABI_IS_EXTENDED,
                },
            },
            dev: udp,
            addr: &device.addr,
            cqs: Mutex::new(HashMap::new()),
            qps: Mutex::new(HashMap::new()),
            srqs: Mutex::new(HashMap::new()),
            cmd_fd,
        }))
    })
}

pub(crate) extern "C" fn ibv_close_device(ctx: *mut ibv_context) -> c_int {
    ffi!({
        // SAFETY: NULL or a context from ibv_open_device (the caller's contract).
        unsafe { try_ref(ctx) }?;
        // SAFETY: a live context, which closing frees; the caller gives it up.
        unsafe { free(ctx) };
        Ok(0)
    })
}

/// The ops table of every context: the data path and memory windows, whose verbs.h
/// functions are static inlines that call these.
fn context_ops() -> ibv_context_ops {
    ibv_context_ops {
        _compat_query_device: None,
        _compat_query_port: None,
        _compat_alloc_pd: None,
        _compat_dealloc_pd: None,
        _compat_reg_mr: None,
        _compat_rereg_mr: None,
        _compat_dereg_mr: None,
        alloc_mw: Some(mw::alloc_mw),
        bind_mw: Some(qp::bind_mw),
        dealloc_mw: Some(mw::dealloc_mw),
        _compat_create_cq: None,
        poll_cq: Some(cq::poll_cq),
        req_notify_cq: Some(cq::req_notify_cq),
        _compat_cq_event: None,
        _compat_resize_cq: None,
        _compat_destroy_cq: None,
        _compat_create_srq: None,
        _compat_modify_srq: None,
        _compat_query_srq: None,
        _compat_destroy_srq: None,
        post_srq_recv: Some(srq::post_srq_recv),
        _compat_create_qp: None,
        _compat_query_qp: None,
        _compat_modify_qp: None,
        _compat_destroy_qp: None,
        post_send: Some(qp::post_send),
        post_recv: Some(qp::post_recv),
        _compat_create_ah: None,
        _compat_destroy_ah: None,
        _compat_attach_mcast: None,
        _compat_detach_mcast: None,
        _compat_async_event: None,
    }
}

/// `ibv_is_fork_initialized`: `IBV_FORK_UNNEEDED` (2). softroce reaches registered memory
/// through the process's own address space, so after a `fork` the parent's MRs keep
/// working with no `MADV_DONTFORK` (what `ibv_fork_init` sets up on a real device); the
/// child may not use the parent's verbs objects (its engine threads did not fork).
pub(crate) extern "C" fn ibv_is_fork_initialized() -> c_int {
    2
}
