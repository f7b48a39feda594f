//! libibverbs.so.1's C ABI, as librdmacm uses it: the functions are looked up once with
//! `dlopen("libibverbs.so.1")` + `dlvsym` at their default versions (the library is normally
//! loaded already, as the program links it; `softroce exec` makes it softroce's). A
//! libibverbs without softroce's private QP1 entry points (rdma-core's own) is refused with
//! ENODEV: this librdmacm drives softroce devices only.

use crate::abi::*;
use core::ffi::{c_char, c_int, c_void};
use std::sync::OnceLock;

/// The entry points of libibverbs.so.1 librdmacm calls.
#[allow(missing_docs)]
pub(crate) struct Ibv {
    pub get_device_list: unsafe extern "C" fn(*mut c_int) -> *mut *mut ibv_device,
    pub free_device_list: unsafe extern "C" fn(*mut *mut ibv_device),
    pub get_device_name: unsafe extern "C" fn(*mut ibv_device) -> *const c_char,
    pub get_device_guid: unsafe extern "C" fn(*mut ibv_device) -> u64,
    pub open_device: unsafe extern "C" fn(*mut ibv_device) -> *mut ibv_context,
    pub alloc_pd: unsafe extern "C" fn(*mut ibv_context) -> *mut ibv_pd,
    pub create_comp_channel: unsafe extern "C" fn(*mut ibv_context) -> *mut ibv_comp_channel,
    pub destroy_comp_channel: unsafe extern "C" fn(*mut ibv_comp_channel) -> c_int,
    pub create_cq: unsafe extern "C" fn(
        *mut ibv_context,
        c_int,
        *mut c_void,
        *mut ibv_comp_channel,
        c_int,
    ) -> *mut ibv_cq,
    pub destroy_cq: unsafe extern "C" fn(*mut ibv_cq) -> c_int,
    pub create_qp: unsafe extern "C" fn(*mut ibv_pd, *mut ibv_qp_init_attr) -> *mut ibv_qp,
    pub modify_qp: unsafe extern "C" fn(*mut ibv_qp, *mut ibv_qp_attr, c_int) -> c_int,
    pub destroy_qp: unsafe extern "C" fn(*mut ibv_qp) -> c_int,
    pub create_srq: unsafe extern "C" fn(*mut ibv_pd, *mut ibv_srq_init_attr) -> *mut ibv_srq,
    pub destroy_srq: unsafe extern "C" fn(*mut ibv_srq) -> c_int,
    pub query_port: unsafe extern "C" fn(*mut ibv_context, u8, *mut ibv_port_attr) -> c_int,
    pub attach_mcast: unsafe extern "C" fn(*mut ibv_qp, *const ibv_gid, u16) -> c_int,
    pub detach_mcast: unsafe extern "C" fn(*mut ibv_qp, *const ibv_gid, u16) -> c_int,
    pub mad_send: unsafe extern "C" fn(
        *mut ibv_context,
        *const libc::sockaddr,
        *const c_void,
        usize,
    ) -> c_int,
    pub mad_recv: unsafe extern "C" fn(
        *mut ibv_context,
        *mut c_void,
        *mut libc::sockaddr_storage,
        c_int,
    ) -> c_int,
    pub cm_slot: unsafe extern "C" fn(*mut ibv_context) -> c_int,
    pub cm_listen: unsafe extern "C" fn(*mut ibv_context, u64, c_int) -> c_int,
}

// Each transmute's target is the type of the `Ibv` field it initialises.
#[allow(clippy::missing_transmute_annotations)]
fn load() -> Result<Ibv, String> {
    // SAFETY: dlopen/dlvsym with NUL-terminated names; each symbol found is transmuted to the
    // prototype its header (or softroce-capi's src/mad.rs) gives it at that version.
    unsafe {
        let h = libc::dlopen(
            c"libibverbs.so.1".as_ptr(),
            libc::RTLD_NOW | libc::RTLD_GLOBAL,
        );
        if h.is_null() {
            return Err("cannot load libibverbs.so.1".into());
        }
        macro_rules! sym {
            ($name:literal, $ver:literal) => {{
                let p = libc::dlvsym(
                    h,
                    concat!($name, "\0").as_ptr().cast(),
                    concat!($ver, "\0").as_ptr().cast(),
                );
                if p.is_null() {
                    return Err(format!(
                        "libibverbs.so.1 has no {}@{}: softroce's librdmacm needs softroce's \
                         libibverbs (run the program with `softroce exec`)",
                        $name, $ver
                    ));
                }
                std::mem::transmute::<*mut c_void, _>(p)
            }};
        }
        Ok(Ibv {
            get_device_list: sym!("ibv_get_device_list", "IBVERBS_1.1"),
            free_device_list: sym!("ibv_free_device_list", "IBVERBS_1.1"),
            get_device_name: sym!("ibv_get_device_name", "IBVERBS_1.1"),
            get_device_guid: sym!("ibv_get_device_guid", "IBVERBS_1.1"),
            open_device: sym!("ibv_open_device", "IBVERBS_1.1"),
            alloc_pd: sym!("ibv_alloc_pd", "IBVERBS_1.1"),
            create_comp_channel: sym!("ibv_create_comp_channel", "IBVERBS_1.0"),
            destroy_comp_channel: sym!("ibv_destroy_comp_channel", "IBVERBS_1.0"),
            create_cq: sym!("ibv_create_cq", "IBVERBS_1.1"),
            destroy_cq: sym!("ibv_destroy_cq", "IBVERBS_1.1"),
            create_qp: sym!("ibv_create_qp", "IBVERBS_1.1"),
            modify_qp: sym!("ibv_modify_qp", "IBVERBS_1.1"),
            destroy_qp: sym!("ibv_destroy_qp", "IBVERBS_1.1"),
            create_srq: sym!("ibv_create_srq", "IBVERBS_1.1"),
            destroy_srq: sym!("ibv_destroy_srq", "IBVERBS_1.1"),
            query_port: sym!("ibv_query_port", "IBVERBS_1.1"),
            attach_mcast: sym!("ibv_attach_mcast", "IBVERBS_1.1"),
            detach_mcast: sym!("ibv_detach_mcast", "IBVERBS_1.1"),
            mad_send: sym!("softroce_mad_send", "SOFTROCE_PRIVATE_1"),
            mad_recv: sym!("softroce_mad_recv", "SOFTROCE_PRIVATE_1"),
            cm_slot: sym!("softroce_cm_slot", "SOFTROCE_PRIVATE_1"),
            cm_listen: sym!("softroce_cm_listen", "SOFTROCE_PRIVATE_1"),
        })
    }
}

/// The functions of the process's libibverbs.so.1, looked up on first use ([`ibv`]).
static IBV: OnceLock<Result<Ibv, String>> = OnceLock::new();

/// libibverbs.so.1's functions, or ENODEV (said once on stderr) when they are missing.
pub(crate) fn ibv() -> Result<&'static Ibv, c_int> {
    IBV.get_or_init(|| load().inspect_err(|e| eprintln!("softroce librdmacm: {e}")))
        .as_ref()
        .map_err(|_| libc::ENODEV)
}

/// (Feature `testing`.) Makes `table` this process's libibverbs.so.1 instead of the one
/// `dlopen` would find: the in-memory bench's (`cma::testing`). Returns whether it is in
/// place: false when [`ibv`] already looked the library up.
#[cfg(feature = "testing")]
pub(crate) fn install(table: Ibv) -> bool {
    IBV.set(Ok(table)).is_ok()
}
