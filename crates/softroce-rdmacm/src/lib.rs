//! `librdmacm.so.1` over softroce: a drop-in for rdma-core's librdmacm that runs unmodified
//! rdma_cm programs (the seed's rdma_server/rdma_client, rping, …) on the devices of
//! softroce's `libibverbs.so.1` (crates/softroce-capi).
//!
//! Layer: a frontend over the sans-IO CM engine (`softroce::cm::CmEngine`). It owns no
//! device: like rdma-core's librdmacm it reaches devices, PDs, CQs and QPs through
//! libibverbs.so.1's C ABI (`ibv.rs`), so an `rdma_cm_id`'s `verbs`, `pd` and `qp` are the very
//! objects `ibv_*` calls take, and the process has one device registry and engine (those of
//! libibverbs.so.1). QP1 is reached through two private entry points of softroce's
//! libibverbs.so.1 (`softroce_mad_send` / `softroce_mad_recv`, version node
//! `SOFTROCE_PRIVATE_1`), which carry 256-byte MADs and an IP address: no Rust type crosses
//! between the two libraries.
//!
//! - CM driver (`cma/driver.rs`): per opened device, a `CmEngine` and one thread that waits on QP1
//!   (`softroce_mad_recv` with the engine's next timer as timeout), feeds the MADs and timers
//!   to the engine, and turns its events into rdma_cm events (applying REQ/REP to the id's
//!   QP as librdmacm does: INIT at `rdma_create_qp`, RTR/RTS at accept and at the REP).
//!   No silent hang: a driver thread that panics (reported on stderr), or whose device
//!   failed (`softroce_mad_recv` says EIO), fails its device: each of the device's ids gets
//!   RDMA_CM_EVENT_DEVICE_REMOVAL with status -EIO and the calls that need the device fail
//!   with EIO. `SOFTROCE_TEST_PANIC=rdmacm:<ms>` is the test hook that makes the driver
//!   threads panic (`softroce::net::panic::SOFTROCE_TEST_PANIC`), read once.
//! - Event channels: an eventfd in semaphore mode per channel plus a queue;
//!   `rdma_get_cm_event` blocks in `read(2)` on it (EAGAIN when the program made the fd
//!   non-blocking), so the fd works with poll/select as librdmacm's does.
//! - Addresses: `$SOFTROCE_IP` (`softroce::net::discover`, the devices of libibverbs.so.1);
//!   binding or resolving to an IP picks the device with that address; route resolution is a
//!   local lookup (RoCE: GIDs are the IPv4-mapped addresses, MTU the port's active MTU).
//! - Symbols: `exports.txt` lists every symbol of rdma-core 44's librdmacm.so.1 with its
//!   version node; what softroce does not implement returns -1 with errno ENOSYS.
//! - Errors: every entry point runs inside `softroce_cabi::ffi!`, whose body returns
//!   `Result<c_int, c_int>` ("0 or -1 and errno"; `Ok(0)`, or `?` on an errno) or
//!   `Result<*mut T, c_int>` (NULL and errno): a panic becomes the error return with errno
//!   EIO, never an unwind into C. Each synchronous call's body is a plain function
//!   returning `Result<(), c_int>` that `sync_result` then completes.

#![cfg_attr(test, allow(dead_code, unused_imports, unused_macros))]

pub mod abi;
mod addrinfo;
mod cma;
mod ibv;

pub(crate) use addrinfo::*;
/// (Feature `testing`.) The in-memory bench: this library's CM driver and `rdma_*` calls
/// against a libibverbs.so.1 held in memory, one step at a time (the `rdmacm_driver` fuzz
/// target and tests/rdmacm_fuzz.rs).
#[cfg(feature = "testing")]
pub use cma::testing;
pub(crate) use cma::*;

// The panic boundary and errno helpers are the two libraries' shared ones.
pub(crate) use softroce_cabi::{ffi, neg_errno, set_errno};

// The versioned symbols (generated from exports.txt by build.rs); not in the unit-test
// binary, which is an executable without the version script.
#[cfg(not(test))]
mod exports {
    include!(concat!(env!("OUT_DIR"), "/exports.rs"));
}
