//! Protection domains: `ibv_alloc_pd` / `ibv_dealloc_pd` over the engine's `verbs::Pd`.

use crate::context::Context;
use crate::handle::{Castable, Users, free, into_handle, try_ref};
use core::ffi::c_int;
use softroce::verbs;
use softroce_cabi::abi::*;
use softroce_cabi::{SetsErrno, ffi};

/// A protection domain.
#[repr(C)]
pub(crate) struct Pd {
    pub ibv: ibv_pd,
    pub pd: verbs::Pd,
    /// MRs, MWs, QPs, SRQs and AHs made on this PD and not yet destroyed.
    pub users: Users,
}

// SAFETY: `ibv_pd` is the first field of the `#[repr(C)]` `Pd` that `ibv_alloc_pd` boxes.
unsafe impl Castable for ibv_pd {
    type RustType = Pd;
}

pub(crate) extern "C" fn ibv_alloc_pd(ctx: *mut ibv_context) -> *mut ibv_pd {
    ffi!({
        // SAFETY: NULL or a live context (the caller's contract).
        let c: &Context = unsafe { try_ref(ctx) }?;
        let pd = c.dev.device().alloc_pd().map_err(|e| e.errno())?;
        let handle = pd.handle();
        Ok(into_handle(Pd {
            ibv: ibv_pd {
                context: ctx,
                handle,
            },
            pd,
            users: Users::default(),
        }))
    })
}

pub(crate) extern "C" fn ibv_dealloc_pd(pd: *mut ibv_pd) -> c_int {
    ffi!(SetsErrno, {
        // SAFETY: NULL or a live PD (the caller's contract).
        if unsafe { try_ref(pd) }?.users.in_use() {
            return Err(libc::EBUSY);
        }
        // SAFETY: a live PD that the caller gives up.
        unsafe { free(pd) };
        Ok(())
    })
}
