//! What softroce's two C libraries share, so that neither includes the other's files:
//! `crates/softroce-capi` (`libibverbs.so.1`) and `crates/softroce-rdmacm` (`librdmacm.so.1`).
//!
//! - [`abi`]: the C structs and `IBV_*` constants of rdma-core 44's `<infiniband/verbs.h>`,
//!   laid out as C lays them out (checked against the installed header by each library's
//!   layout tests).
//! - [`ffi!`] and [`ffi_errno!`]: the panic boundary every `extern "C"` function of both
//!   libraries runs inside; a panic becomes the function's error return with errno `EIO`,
//!   never an unwind into C (rustls-ffi's `ffi_panic_boundary!` is the model).
//! - errno helpers: [`set_errno`], and the three return conventions of libibverbs and
//!   librdmacm as functions of a body that returns `Result` (so `?` works):
//!   [`errno_result`] (0 or an errno value), [`ptr_result`] (a handle, or NULL and errno),
//!   [`neg_result`] (a value, or -1 and errno).
//! - [`log`]: the `SOFTROCE_LOG` subscriber, installed by each library on first use (and by
//!   the `softroce` CLI), since each `.so` carries its own copy of the engine's tracing
//!   call sites.
//!
//! - [`exports`]: the build scripts' generator of each library's exported symbols, version
//!   script, SONAME and `softroce-libs/` link, from its `exports.txt` (a build-dependency of
//!   both).
//!
//! An rlib of plain Rust items: it exports no C symbol.

pub mod abi;
pub mod exports;
pub mod log;

/// Runs an `extern "C"` body, turning a panic into `$on_panic` with errno `EIO`.
#[macro_export]
macro_rules! ffi {
    ($on_panic:expr, $body:block) => {
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| $body)) {
            Ok(v) => v,
            Err(_) => {
                $crate::set_errno(libc::EIO);
                $on_panic
            }
        }
    };
}

/// [`ffi!`] for the verbs that rdma-core runs through a kernel command and that return an
/// errno value (`ibv_modify_qp`, `ibv_destroy_cq`, …): a failure also leaves that value in
/// `errno`, as the failed system call does under rdma-core (tutorials `perror()` it); a
/// panic is `EIO`.
#[macro_export]
macro_rules! ffi_errno {
    ($body:block) => {{
        let r: core::ffi::c_int = $crate::ffi!(libc::EIO, $body);
        if r > 0 {
            $crate::set_errno(r);
        }
        r
    }};
}

/// Sets the calling thread's `errno`.
pub fn set_errno(e: i32) {
    // SAFETY: __errno_location returns this thread's errno slot, always valid.
    unsafe { *libc::__errno_location() = e };
}

/// NULL with errno `e`: the failure of a constructor.
pub fn null_errno<T>(e: i32) -> *mut T {
    set_errno(e);
    std::ptr::null_mut()
}

/// -1 with errno `e`: the failure of the calls whose man page says "-1 and errno".
pub fn neg_errno(e: i32) -> i32 {
    set_errno(e);
    -1
}

/// The return value of a verb that returns an errno value: 0, or the error of `body`, in
/// which `?` works. Leaves `errno` alone ([`ffi_errno!`] sets it for the verbs that do).
pub fn errno_result(body: impl FnOnce() -> Result<(), core::ffi::c_int>) -> core::ffi::c_int {
    match body() {
        Ok(()) => 0,
        Err(e) => e,
    }
}

/// The return value of a constructor: the handle `body` made, or NULL with errno set to its
/// error ([`null_errno`]).
pub fn ptr_result<T>(body: impl FnOnce() -> Result<*mut T, core::ffi::c_int>) -> *mut T {
    body().unwrap_or_else(null_errno)
}

/// The return value of a call whose man page says "-1 and errno": the value of `body`, or
/// -1 with errno set to its error ([`neg_errno`]).
pub fn neg_result(
    body: impl FnOnce() -> Result<core::ffi::c_int, core::ffi::c_int>,
) -> core::ffi::c_int {
    body().unwrap_or_else(neg_errno)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn errno() -> i32 {
        std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
    }

    #[test]
    fn a_panic_is_the_error_return_with_eio() {
        set_errno(0);
        let r: i32 = ffi!(-1, {
            if errno() == 0 {
                panic!("injected");
            }
            0
        });
        assert_eq!((r, errno()), (-1, libc::EIO));
        set_errno(0);
        let r = ffi_errno!({ libc::EINVAL });
        assert_eq!((r, errno()), (libc::EINVAL, libc::EINVAL));
    }

    #[test]
    fn the_three_return_conventions() {
        assert_eq!(errno_result(|| Err(libc::EBUSY)), libc::EBUSY);
        assert_eq!(errno_result(|| Ok(())), 0);
        set_errno(0);
        assert!(ptr_result::<u8>(|| Err(libc::ENOMEM)).is_null());
        assert_eq!(errno(), libc::ENOMEM);
        assert_eq!(neg_result(|| Err(libc::ENOENT)), -1);
        assert_eq!(errno(), libc::ENOENT);
        assert_eq!(neg_result(|| Ok(3)), 3);
    }
}
