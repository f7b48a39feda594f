//! Memory regions: `ibv_reg_mr` (and its `_iova` forms), `ibv_rereg_mr`, `ibv_dereg_mr`,
//! over the caller's own memory (`verbs::Pd::reg_mr_user_iova`).

use crate::handle::{Castable, free, into_handle, try_ref};
use crate::pd::Pd;
use core::ffi::{c_int, c_uint, c_void};
use softroce::verbs::{self, AccessFlags};
use softroce_cabi::abi::*;
use softroce_cabi::{SetsErrno, ffi};

/// A memory region over the caller's memory.
#[repr(C)]
pub(crate) struct Mr {
    pub ibv: ibv_mr,
    pub mr: verbs::Mr,
}

// SAFETY: `ibv_mr` is the first field of the `#[repr(C)]` `Mr` that `ibv_reg_mr` boxes.
unsafe impl Castable for ibv_mr {
    type RustType = Mr;
}

/// The access flags softroce knows; the optional-range bits (`IBV_ACCESS_OPTIONAL_RANGE`)
/// are hints a device may ignore.
const ACCESS_KNOWN: c_uint = IBV_ACCESS_LOCAL_WRITE
    | IBV_ACCESS_REMOTE_WRITE
    | IBV_ACCESS_REMOTE_READ
    | IBV_ACCESS_REMOTE_ATOMIC
    | IBV_ACCESS_MW_BIND;

pub(crate) extern "C" fn ibv_reg_mr(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> *mut ibv_mr {
    ibv_reg_mr_iova2(pd, addr, length, addr as u64, access as c_uint)
}

pub(crate) extern "C" fn ibv_reg_mr_iova(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_int,
) -> *mut ibv_mr {
    ibv_reg_mr_iova2(pd, addr, length, iova, access as c_uint)
}

pub(crate) extern "C" fn ibv_reg_mr_iova2(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_uint,
) -> *mut ibv_mr {
    ffi!({
        // SAFETY: NULL or a live PD (the caller's contract).
        let p: &Pd = unsafe { try_ref(pd) }?;
        // On-demand paging, zero-based and the other access flags beyond these are not
        // supported.
        if access & !(ACCESS_KNOWN | IBV_ACCESS_OPTIONAL_RANGE) != 0 {
            return Err(libc::EOPNOTSUPP);
        }
        // SAFETY: libibverbs' contract: `addr` is valid for `length` bytes until
        // ibv_dereg_mr. (That the program keeps accessing it meanwhile is the engine's
        // user-memory model; see `Pd::reg_mr_user`.)
        let mr = unsafe {
            p.pd.reg_mr_user_iova(
                addr.cast(),
                length,
                iova,
                AccessFlags(access & ACCESS_KNOWN),
            )
        }
        .map_err(|e| e.errno())?;
        p.users.hold();
        Ok(into_handle(Mr {
            ibv: ibv_mr {
                context: p.ibv.context,
                pd,
                addr,
                length,
                handle: mr.lkey(),
                lkey: mr.lkey(),
                rkey: mr.rkey(),
            },
            mr,
        }))
    })
}

/// `ibv_rereg_mr` fails as it does on rxe with rdma-core 44, whose provider has no
/// `rereg_mr`: libibverbs checks the arguments (`IBV_REREG_MR_ERR_INPUT`, -1, errno
/// `EINVAL`: flags other than CHANGE_TRANSLATION / CHANGE_PD / CHANGE_ACCESS, a new
/// translation without an address or a length, access flags without CHANGE_ACCESS), then
/// the provider's default says `EOPNOTSUPP` and libibverbs returns `IBV_REREG_MR_ERR_CMD`
/// (-4) with that errno. The MR stays registered as it was. Its results are
/// `enum ibv_rereg_mr_err_code` values, not errno values. Source: libibverbs 44 `verbs.c`
/// `ibv_rereg_mr`, `dummy_ops.c` `rereg_mr`; providers/rxe/rxe.c `rxe_ctx_ops`.
pub(crate) extern "C" fn ibv_rereg_mr(
    mr: *mut ibv_mr,
    flags: c_int,
    _pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> c_int {
    /// `IBV_REREG_MR_CHANGE_TRANSLATION`, `_CHANGE_ACCESS`, `_FLAGS_SUPPORTED`.
    const CHANGE_TRANSLATION: c_int = 1 << 0;
    const CHANGE_ACCESS: c_int = 1 << 2;
    const FLAGS_SUPPORTED: c_int = (CHANGE_ACCESS << 1) - 1;
    /// `IBV_REREG_MR_ERR_INPUT`, `IBV_REREG_MR_ERR_CMD`.
    const ERR_INPUT: c_int = -1;
    const ERR_CMD: c_int = -4;
    let bad_input = mr.is_null()
        || flags & !FLAGS_SUPPORTED != 0
        || (flags & CHANGE_TRANSLATION != 0 && (length == 0 || addr.is_null()))
        || (access != 0 && flags & CHANGE_ACCESS == 0);
    if bad_input {
        softroce_cabi::set_errno(libc::EINVAL);
        return ERR_INPUT;
    }
    softroce_cabi::set_errno(libc::EOPNOTSUPP);
    ERR_CMD
}

pub(crate) extern "C" fn ibv_dereg_mr(mr: *mut ibv_mr) -> c_int {
    ffi!(SetsErrno, {
        // SAFETY: NULL or a live MR; its PD is live while it is.
        let p: &Pd = unsafe { try_ref(try_ref(mr)?.ibv.pd) }?;
        p.users.release();
        // SAFETY: a live MR that the caller gives up.
        unsafe { free(mr) };
        Ok(())
    })
}
