//! The handle layer: the one way from a C handle of `<infiniband/verbs.h>` to the Rust
//! object behind it, in the manner of rustls-ffi (librustls/src/ffi.rs: `Castable` with
//! `type RustType`, `try_ref_from_ptr!`).
//!
//! - [`Castable`] ties each C handle type this library hands out to exactly one Rust object
//!   type: `ibv_context` → `Context`, `ibv_pd` → `Pd`, `ibv_mr` → `Mr`, `ibv_mw` → `Mw`,
//!   `ibv_comp_channel` → `CompChannel`, `ibv_cq` and `ibv_cq_ex` → `Cq`, `ibv_qp` and
//!   `ibv_qp_ex` → `Qp`, `ibv_srq` → `Srq`, `ibv_ah` → `Ah`. Each `impl` sits next to its
//!   object, so this module depends on no object file.
//! - Shape: an object is one `Box` of a `#[repr(C)]` struct that holds the C struct
//!   [`Castable::OFFSET`] bytes in (0: its first field; a context's `ibv_context` is the
//!   last field of the `verbs_context` that begins it). [`into_handle`] makes the box and
//!   gives out the C pointer, [`try_ref`] / [`try_mut`] turn it back (the null check is
//!   there, and only there), [`free`] drops it in the object's `ibv_destroy_*`.
//! - Errors: a NULL handle is [`NullHandle`], which `?` turns into the errno value `EINVAL`
//!   (`impl From<NullHandle> for c_int`).
//! - [`Users`] is an object's use count (kernel uverbs' `usecnt`): a PD's or a CQ's
//!   destroy refuses with EBUSY while other objects use it.

use core::ffi::c_int;
use std::sync::atomic::{AtomicU32, Ordering};

/// A C handle type, tied to the one Rust object type behind every handle of it.
///
/// # Safety
/// In every handle of type `Self` this library hands out, the `Self` sits [`Self::OFFSET`]
/// bytes into a boxed `#[repr(C)]` [`Self::RustType`] (made by [`into_handle`]).
pub(crate) unsafe trait Castable {
    /// The Rust object behind a handle.
    type RustType;
    /// The byte offset of the C struct in the Rust object.
    const OFFSET: usize = 0;
}

/// A NULL handle where an object was expected: `EINVAL` (through `?`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct NullHandle;

impl From<NullHandle> for c_int {
    fn from(_: NullHandle) -> c_int {
        libc::EINVAL
    }
}

/// The object behind handle `p`, or [`NullHandle`] for NULL.
///
/// # Safety
/// `p` is NULL or a live handle of this library (not yet freed), whose object nobody
/// mutates through a `&mut` for `'a`.
pub(crate) unsafe fn try_ref<'a, C: Castable>(p: *mut C) -> Result<&'a C::RustType, NullHandle> {
    if p.is_null() {
        return Err(NullHandle);
    }
    // SAFETY: our caller's contract: a live handle, which sits `OFFSET` bytes into its
    // object (`Castable`'s contract).
    Ok(unsafe { &*p.byte_sub(C::OFFSET).cast::<C::RustType>() })
}

/// [`try_ref`], mutable: for the thread that owns the object (it made it and has not handed
/// it out yet, or it destroys it).
///
/// # Safety
/// As [`try_ref`], and no other reference to the object is used for `'a`.
pub(crate) unsafe fn try_mut<'a, C: Castable>(
    p: *mut C,
) -> Result<&'a mut C::RustType, NullHandle> {
    if p.is_null() {
        return Err(NullHandle);
    }
    // SAFETY: as in `try_ref`; our caller's contract makes the reference unique.
    Ok(unsafe { &mut *p.byte_sub(C::OFFSET).cast::<C::RustType>() })
}

/// A new object in its own `Box`, given out as its C handle.
pub(crate) fn into_handle<C: Castable>(object: C::RustType) -> *mut C {
    let p = Box::into_raw(Box::new(object));
    // SAFETY: `OFFSET` bytes into the object just allocated is inside it (`Castable`'s
    // contract: the C struct is there).
    unsafe { p.byte_add(C::OFFSET) }.cast()
}

/// Frees the object behind handle `p`, made by [`into_handle`].
///
/// # Safety
/// `p` is a live, non-NULL handle of this library (as [`try_ref`]); nobody uses it, or a
/// reference to its object, afterwards.
pub(crate) unsafe fn free<C: Castable>(p: *mut C) {
    // SAFETY: our caller's contract: the box `into_handle` made, `OFFSET` bytes back.
    drop(unsafe { Box::from_raw(p.byte_sub(C::OFFSET).cast::<C::RustType>()) });
}

/// How many live objects use this one: the MRs, MWs, QPs, SRQs and AHs made on a PD; the
/// send and receive queues of live QPs that are a CQ. Counted on when each is made, off
/// when it is destroyed: `ibv_dealloc_pd` and `ibv_destroy_cq` refuse with EBUSY while any
/// remain and the handle stays valid, as kernel uverbs does with its objects' `usecnt`.
#[derive(Debug, Default)]
pub(crate) struct Users(AtomicU32);

impl Users {
    /// One more user.
    pub(crate) fn hold(&self) {
        self.0.fetch_add(1, Ordering::AcqRel);
    }

    /// One user fewer.
    pub(crate) fn release(&self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }

    /// Whether any user remains.
    pub(crate) fn in_use(&self) -> bool {
        self.0.load(Ordering::Acquire) > 0
    }
}
