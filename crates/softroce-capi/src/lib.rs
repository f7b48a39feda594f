//! `libibverbs.so.1` over the softroce engine: a drop-in for rdma-core's libibverbs that
//! runs unmodified, dynamically linked verbs programs on softroce devices.
//!
//! Layer: a frontend over `softroce::verbs` (objects, checks, errors) and
//! `softroce::net::UdpDevice` (one UDP socket and driver thread per opened device). It adds no
//! protocol: every verb converts the C structs of `<infiniband/verbs.h>` (mirrored in [`abi`])
//! to the engine's types and back.
//!
//! - Devices: one per address in `$SOFTROCE_IP` (`softroce::net::discover`), named
//!   `softroce0`, `softroce1`, …; `ibv_open_device` binds the address's UDP port 4791 (two
//!   opens of one device in a process share the engine device). Devices open in
//!   busy-polling mode (`UdpOptions::busy_poll`: the thread in `ibv_poll_cq` receives from
//!   the socket itself); `$SOFTROCE_BUSY_POLL` `0` turns it off, `adaptive` leaves receiving
//!   to the driver thread while the device mostly sends (`UdpOptions::busy_poll_adaptive`);
//!   `ibv_get_cq_event` hands receiving back to the driver thread before it blocks
//!   (`UdpDevice::poller_sleeps`).
//! - sysfs: `ibv_get_sysfs_path` and `ibv_read_sysfs_file` as rdma-core's (`sysfs.rs`);
//!   each device's `dev_path` and `ibdev_path` start with that path, where `softroce exec`
//!   puts the files kernel rxe's devices have.
//! - Files: one per object, as rdma-core's libibverbs splits its commands (cmd_cq.c,
//!   cmd_qp.c, …): `context.rs`, `pd.rs`, `mr.rs`, `mw.rs`, `comp_channel.rs`, `cq.rs`
//!   (with polling and the extended CQ), `srq.rs`, `ah.rs`, `qp.rs` (with post_send /
//!   post_recv), `qp_ex.rs` (the `ibv_wr_*` builder); `wr.rs` converts receive WR lists for
//!   qp.rs and srq.rs; `device.rs` lists and opens devices and fills each context's function
//!   tables from the object files. Each object file depends on the handle layer, the engine
//!   and the objects it is made from, never in a circle (`module_tests.rs` checks it).
//! - Extended objects: every QP is a `struct ibv_qp_ex` and every CQ a `struct ibv_cq_ex`;
//!   `ibv_create_qp_ex` with send ops fills the `ibv_wr_*` builder, `ibv_create_cq_ex` the
//!   `ibv_start_poll` / `ibv_wc_read_*` functions.
//! - Handles (`handle.rs`): every object is one `Box` of a `#[repr(C)]` struct whose first
//!   field is the C struct libibverbs defines, freed by its `ibv_destroy_*`. The context is a
//!   `verbs_context` (whose last field is the `ibv_context` handed out) followed by
//!   softroce's state. `Castable` ties each C handle type to its one Rust object and
//!   `handle::try_ref` is the one checked conversion (a NULL handle is EINVAL through `?`).
//! - Symbols: `exports.txt` lists every symbol of rdma-core 44's libibverbs.so.1 with its
//!   version node; build.rs makes the version script and one `.symver` per symbol. What
//!   softroce does not implement returns EOPNOTSUPP (NULL/-1 with errno, as each returns).
//! - Errors: every entry point runs inside `softroce_cabi::ffi!`, whose body returns the
//!   function's convention as a Rust type (`Result<(), c_int>` for an errno value,
//!   `SetsErrno` when rdma-core also leaves it in errno, `Result<*mut T, c_int>` for NULL and
//!   errno, `Result<c_int, c_int>` for -1 and errno), so `?` works and a panic becomes that
//!   convention's error return with errno `EIO`; no panic crosses the C boundary. Only
//!   entry points that forward to one that does (`ibv_reg_mr`, `ibv_query_port`, the
//!   `ibv_wr_*` and `ibv_wc_read_*` builders) and table lookups (`ibv_*_str`, the rate
//!   conversions, `ibv_rereg_mr`'s argument checks) run outside it.
//! - A device's driver thread that panics fails the device (`Device::fail`): its QPs are
//!   flushed, `IBV_EVENT_DEVICE_FATAL` is raised, `ibv_get_cq_event` returns EIO once the
//!   pending events are taken, and `softroce_mad_recv` EIO (librdmacm then fails the
//!   device's ids). `SOFTROCE_TEST_PANIC=device:<ms>` is the test hook that causes it
//!   (`softroce::net::panic::SOFTROCE_TEST_PANIC`).
//! - `SOFTROCE_LOG`: the first `ibv_get_device_list` installs the engine's event log on
//!   stderr, as the `softroce` CLI does (`log.rs`).
//! - Memory: `ibv_reg_mr` registers the caller's memory itself (`Pd::reg_mr_user`); RDMA
//!   WRITEs land in it.

#![cfg_attr(test, allow(dead_code, unused_imports, unused_macros))]

pub use softroce_cabi::abi;
mod ah;
mod comp_channel;
mod context;
mod cq;
mod device;
mod handle;
mod mad;
mod mr;
mod mw;
mod pd;
mod qp;
mod qp_ex;
mod srq;
mod strings;
mod sysfs;
mod wr;

#[cfg(test)]
mod layout_tests;
#[cfg(test)]
mod module_tests;

// The entry points, by name at the crate root for the generated exports (`crate::<name>`,
// build_exports.rs). The object files name each other by module, never through these.
pub(crate) use ah::*;
pub(crate) use comp_channel::*;
pub(crate) use context::*;
pub(crate) use cq::*;
pub(crate) use device::*;
pub(crate) use mad::{softroce_cm_listen, softroce_cm_slot, softroce_mad_recv, softroce_mad_send};
pub(crate) use mr::*;
pub(crate) use pd::*;
pub(crate) use qp::*;
pub(crate) use qp_ex::ibv_qp_to_qp_ex;
pub(crate) use srq::*;
pub(crate) use strings::*;
pub(crate) use sysfs::{ibv_get_sysfs_path, ibv_read_sysfs_file};

// The versioned symbols (generated from exports.txt by build.rs). Not in the unit-test
// binary, which is an executable without the version script.
#[cfg(not(test))]
mod exports {
    include!(concat!(env!("OUT_DIR"), "/exports.rs"));
}
