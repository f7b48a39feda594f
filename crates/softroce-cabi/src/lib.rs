//! What softroce's two C libraries share, so that neither includes the other's files:
//! `crates/softroce-capi` (`libibverbs.so.1`) and `crates/softroce-rdmacm` (`librdmacm.so.1`).
//!
//! - [`abi`]: the C structs and `IBV_*` constants of rdma-core 44's `<infiniband/verbs.h>`,
//!   laid out as C lays them out (checked against the installed header by each library's
//!   layout tests).
//! - [`ffi!`]: the panic boundary every `extern "C"` function of both libraries runs inside;
//!   a panic becomes the function's error return with errno `EIO`, never an unwind into C
//!   (rustls-ffi's `ffi_panic_boundary!` is the model). The body returns a [`CReturn`]: the
//!   return conventions of libibverbs and librdmacm as Rust types (`Result<(), c_int>`,
//!   `Result<*mut T, c_int>`, `Result<c_int, c_int>`, [`SetsErrno`], …), so `?` works in it
//!   and the type picks both the C value and the panic value.
//! - errno helpers: [`set_errno`] and its counterpart [`errno`], [`null_errno`], [`neg_errno`].
//! - [`fork`]: [`PerProcess`](fork::PerProcess), a value that a `fork`ed child replaces
//!   with a fresh one on first use (the parent's devices are not the child's).
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
#[cfg(feature = "testing")]
pub mod elf_check;
pub mod exports;
pub mod fork;
pub mod log;

use core::ffi::c_int;

/// Runs the body of an `extern "C"` function under `catch_unwind`, as a closure (so
/// `return` and `?` leave the body, not the function), and turns its value into the C
/// return value; a panic becomes the convention's error return with errno `EIO`.
///
/// - `ffi!({ body })`: the body's value is a [`CReturn`], whose type is the function's
///   return convention (`Result<(), c_int>`: an errno value; `Result<*mut T, c_int>`: a
///   handle or NULL and errno; `Result<c_int, c_int>`: a value or -1 and errno; `()`; a
///   pointer whose NULL sets no errno).
/// - `ffi!(Wrapper, { body })`: the body's value goes into the newtype `Wrapper`, a
///   [`CReturn`] for a convention that shares its Rust type with another ([`SetsErrno`]:
///   an errno value that is also left in `errno`).
/// - `ffi!(panic = value, { body })`: a function returning a plain value that has no
///   error form (a GUID, a port number, a field of a completion): the body's value as is,
///   `value` (with errno `EIO`) on a panic.
#[macro_export]
macro_rules! ffi {
    ($body:block) => {
        $crate::boundary(|| $body)
    };
    (panic = $on_panic:expr, $body:block) => {
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| $body)) {
            Ok(v) => v,
            Err(_) => {
                $crate::set_errno(libc::EIO);
                $on_panic
            }
        }
    };
    ($wrap:path, $body:block) => {
        $crate::boundary_wrapped($wrap, || $body)
    };
}

/// A return convention of libibverbs or librdmacm: how the Rust value of an entry point's
/// body becomes its C return value ([`into_c`](CReturn::into_c)), and what the function
/// returns when the body panicked ([`panicked`](CReturn::panicked); [`boundary`] has set
/// errno to `EIO` by then).
pub trait CReturn {
    /// The C return type.
    type C;
    /// The C return value of a body that returned `self`; sets errno where the convention
    /// says so.
    fn into_c(self) -> Self::C;
    /// The C return value of a body that panicked.
    fn panicked() -> Self::C;
}

/// The verbs that return an errno value (`ibv_post_send`, `ibv_req_notify_cq`, …): 0, or
/// the error; `errno` is left alone. A panic is `EIO`.
impl CReturn for Result<(), c_int> {
    type C = c_int;
    fn into_c(self) -> c_int {
        match self {
            Ok(()) => 0,
            Err(e) => e,
        }
    }
    fn panicked() -> c_int {
        libc::EIO
    }
}

/// The verbs that rdma-core runs through a kernel command and that return an errno value
/// (`ibv_modify_qp`, `ibv_destroy_cq`, …): 0, or the error, which is also left in `errno`
/// as the failed system call leaves it under rdma-core (tutorials `perror()` it). A panic
/// is `EIO`. Used as `ffi!(SetsErrno, { body })`.
pub struct SetsErrno(pub Result<(), c_int>);

impl CReturn for SetsErrno {
    type C = c_int;
    fn into_c(self) -> c_int {
        let r = self.0.into_c();
        if r != 0 {
            set_errno(r);
        }
        r
    }
    fn panicked() -> c_int {
        libc::EIO
    }
}

/// The constructors (`ibv_alloc_pd`, `ibv_create_qp`, `rdma_create_event_channel`, …): the
/// handle, or NULL with errno set to the error ([`null_errno`]). A body's `Ok(NULL)` is
/// NULL with the errno some inner call set. A panic is NULL.
impl<T> CReturn for Result<*mut T, c_int> {
    type C = *mut T;
    fn into_c(self) -> *mut T {
        self.unwrap_or_else(null_errno)
    }
    fn panicked() -> *mut T {
        std::ptr::null_mut()
    }
}

/// As `Result<*mut T, c_int>` for a constant string (`ibv_get_device_name`): the pointer,
/// or NULL with errno set to the error. A panic is NULL.
impl<T> CReturn for Result<*const T, c_int> {
    type C = *const T;
    fn into_c(self) -> *const T {
        self.unwrap_or_else(|e| null_errno::<T>(e).cast_const())
    }
    fn panicked() -> *const T {
        std::ptr::null()
    }
}

/// The calls whose man page says "-1 and errno" (`ibv_get_cq_event`, `ibv_query_gid`,
/// every `rdma_*` call that returns an int): the value, or -1 with errno set to the error
/// ([`neg_errno`]); a body's `Ok(-1)` is -1 with the errno some inner call set. A panic is
/// -1.
impl CReturn for Result<c_int, c_int> {
    type C = c_int;
    fn into_c(self) -> c_int {
        self.unwrap_or_else(neg_errno)
    }
    fn panicked() -> c_int {
        -1
    }
}

/// `_ibv_query_gid_table` (what verbs.h's inline `ibv_query_gid_table` calls): the number
/// of entries, or minus the error; `errno` is left alone. A panic is `-EIO`.
impl CReturn for Result<isize, c_int> {
    type C = isize;
    fn into_c(self) -> isize {
        self.unwrap_or_else(|e| -(e as isize))
    }
    fn panicked() -> isize {
        -(libc::EIO as isize)
    }
}

/// The functions that return nothing (`ibv_ack_cq_events`, `rdma_destroy_qp`, …).
impl CReturn for () {
    type C = ();
    fn into_c(self) {}
    fn panicked() {}
}

/// The functions that return a pointer whose NULL is no error with errno (`ibv_qp_to_qp_ex`):
/// the pointer as is. A panic is NULL.
impl<T> CReturn for *mut T {
    type C = *mut T;
    fn into_c(self) -> *mut T {
        self
    }
    fn panicked() -> *mut T {
        std::ptr::null_mut()
    }
}

/// As `*mut T`: the pointer as is; a panic is NULL.
impl<T> CReturn for *const T {
    type C = *const T;
    fn into_c(self) -> *const T {
        self
    }
    fn panicked() -> *const T {
        std::ptr::null()
    }
}

/// What `ffi!(Wrapper, { body })` expands to: [`boundary`] of the body's value put into
/// the newtype `wrap` (a tuple struct's constructor).
pub fn boundary_wrapped<T, R: CReturn>(
    wrap: impl FnOnce(T) -> R,
    body: impl FnOnce() -> T,
) -> R::C {
    boundary(|| wrap(body()))
}

/// What [`ffi!`] expands to: runs `body` under `catch_unwind` and returns its value as C
/// returns it ([`CReturn::into_c`]), or, when it panicked, sets errno to `EIO` and returns
/// [`CReturn::panicked`].
pub fn boundary<R: CReturn>(body: impl FnOnce() -> R) -> R::C {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)) {
        Ok(r) => r.into_c(),
        Err(_) => {
            set_errno(libc::EIO);
            R::panicked()
        }
    }
}

/// Sets the calling thread's `errno`.
pub fn set_errno(e: i32) {
    // SAFETY: __errno_location returns this thread's errno slot, always valid.
    unsafe { *libc::__errno_location() = e };
}

/// The calling thread's `errno`, as the last failed call (ours or libc's) left it; 0 when
/// nothing set it since it was cleared.
pub fn errno() -> i32 {
    // SAFETY: __errno_location returns this thread's errno slot, always valid.
    unsafe { *libc::__errno_location() }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A body that panics when `errno` is 0 (so the compiler cannot see the panic coming)
    /// and else returns `v`.
    fn panics<T>(v: T) -> T {
        if errno() == 0 {
            panic!("injected");
        }
        v
    }

    /// Runs `f` with errno 0 first; its value and the errno it left.
    fn run<T>(f: impl FnOnce() -> T) -> (T, i32) {
        set_errno(0);
        let v = f();
        (v, errno())
    }

    #[test]
    fn a_panic_is_the_conventions_error_return_with_eio() {
        let eio = libc::EIO;
        assert_eq!(run(|| ffi!({ panics(Ok::<(), c_int>(())) })), (eio, eio));
        assert_eq!(run(|| ffi!(SetsErrno, { panics(Ok(())) })), (eio, eio));
        let (p, e) = run(|| ffi!({ panics(Ok::<*mut u8, c_int>(8 as *mut u8)) }));
        assert_eq!((p.is_null(), e), (true, eio));
        let (p, e) = run(|| ffi!({ panics(Ok::<*const u8, c_int>(8 as *const u8)) }));
        assert_eq!((p.is_null(), e), (true, eio));

        assert_eq!(run(|| ffi!({ panics(Ok::<c_int, c_int>(3)) })), (-1, eio));
        assert_eq!(run(|| ffi!({ panics(Ok::<isize, c_int>(3)) })), (-5, eio));
        assert_eq!(run(|| ffi!({ panics(()) })), ((), eio));
        let (p, e) = run(|| ffi!({ panics(8 as *mut u8) }));
        assert_eq!((p.is_null(), e), (true, eio));
        let (p, e) = run(|| ffi!({ panics(8 as *const u8) }));
        assert_eq!((p.is_null(), e), (true, eio));
        assert_eq!(run(|| ffi!(panic = 7u64, { panics(1u64) })), (7, eio));
    }

    #[test]
    fn each_conventions_ok_and_err() {
        // An errno value, errno untouched.
        assert_eq!(run(|| ffi!({ Ok(()) })), (0, 0));
        assert_eq!(
            run(|| ffi!({ Err::<(), c_int>(libc::EBUSY) })),
            (libc::EBUSY, 0)
        );
        // An errno value, also left in errno.
        assert_eq!(run(|| ffi!(SetsErrno, { Ok(()) })), (0, 0));
        let einval = libc::EINVAL;
        assert_eq!(run(|| ffi!(SetsErrno, { Err(einval) })), (einval, einval));
        // A handle, or NULL and errno (Ok(NULL) keeps the errno of the inner call).
        assert_eq!(run(|| ffi!({ Ok(8 as *mut u8) })), (8 as *mut u8, 0));
        let (p, e) = run(|| ffi!({ Err::<*mut u8, c_int>(libc::ENOMEM) }));
        assert_eq!((p.is_null(), e), (true, libc::ENOMEM));
        let (p, e) = run(|| ffi!({ Err::<*const u8, c_int>(libc::EINVAL) }));
        assert_eq!((p.is_null(), e), (true, libc::EINVAL));
        assert_eq!(run(|| ffi!({ Ok(8 as *const u8) })), (8 as *const u8, 0));

        // A value, or -1 and errno; `?` and `return` leave the body.
        assert_eq!(run(|| ffi!({ Ok(3) })), (3, 0));
        let enoent = libc::ENOENT;
        let (v, e) = run(|| {
            ffi!({
                Err(enoent)?;
                Ok(0)
            })
        });
        assert_eq!((v, e), (-1, libc::ENOENT));
        let (v, e) = run(|| {
            ffi!({
                if errno() == 0 {
                    return Ok(5);
                }
                Ok(0)
            })
        });
        assert_eq!((v, e), (5, 0));
        // A count, or minus the error, errno untouched.
        assert_eq!(run(|| ffi!({ Ok(2isize) })), (2, 0));
        assert_eq!(
            run(|| ffi!({ Err::<isize, c_int>(libc::EINVAL) })),
            (-22, 0)
        );
        // Plain values pass as they are.

        assert_eq!(run(|| ffi!({ 8 as *const u8 })), (8 as *const u8, 0));
        assert_eq!(run(|| ffi!(panic = 0u16, { 4791u16 })), (4791, 0));
    }
}
