//! Completion channels: `ibv_create_comp_channel` / `ibv_destroy_comp_channel` over the
//! engine's `verbs::CompChannel` (whose eventfd is the channel's `fd`). The events on it
//! are `cq.rs`'s (`ibv_get_cq_event`, `ibv_ack_cq_events`).

use crate::context::Context;
use crate::handle::{Castable, free, into_handle, try_ref};
use core::ffi::c_int;
use softroce::verbs;
use softroce_cabi::abi::*;
use softroce_cabi::{SetsErrno, ffi};
use std::os::fd::AsRawFd;

/// A completion channel: `fd` is the engine channel's eventfd.
#[repr(C)]
pub(crate) struct CompChannel {
    pub ibv: ibv_comp_channel,
    pub ch: verbs::CompChannel,
}

// SAFETY: `ibv_comp_channel` is the first field of the `#[repr(C)]` `CompChannel` that
// `ibv_create_comp_channel` boxes.
unsafe impl Castable for ibv_comp_channel {
    type RustType = CompChannel;
}

pub(crate) extern "C" fn ibv_create_comp_channel(ctx: *mut ibv_context) -> *mut ibv_comp_channel {
    ffi!({
        // SAFETY: NULL or a live context.
        let c: &Context = unsafe { try_ref(ctx) }?;
        let ch = c
            .dev
            .device()
            .create_comp_channel()
            .map_err(|e| e.errno())?;
        Ok(into_handle(CompChannel {
            ibv: ibv_comp_channel {
                context: ctx,
                fd: ch.as_raw_fd(),
                refcnt: 0,
            },
            ch,
        }))
    })
}

pub(crate) extern "C" fn ibv_destroy_comp_channel(ch: *mut ibv_comp_channel) -> c_int {
    ffi!(SetsErrno, {
        // SAFETY: NULL or a live channel.
        if unsafe { try_ref(ch) }?.ibv.refcnt != 0 {
            return Err(libc::EBUSY);
        }
        // SAFETY: a live channel the caller gives up.
        unsafe { free(ch) };
        Ok(())
    })
}
