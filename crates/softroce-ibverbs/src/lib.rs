//! An API shaped like the [`ibverbs`](https://docs.rs/ibverbs/0.9.2) crate, over softroce.
//!
//! Code written against the `ibverbs` crate (device list → context → PD, CQ → queue pair
//! builder → prepared QP → out-of-band endpoint exchange → handshake → post / poll) ports to
//! softroce by changing the import, with the differences listed below. Everything here is a
//! thin layer over [`softroce::verbs`] (objects, checks, errors) and [`softroce::net::UdpDevice`]
//! (the UDP socket and driver thread of a device); it adds no protocol code.
//!
//! Layer: above `verbs` and `net`; opens sockets (in [`Device::open`]) and starts one driver
//! thread per opened device. Every object keeps its device open while it lives.
//!
//! # Devices
//!
//! A softroce device is an IP address the process binds UDP port 4791 on. [`devices`]
//! lists one device per address in the environment variable `SOFTROCE_IP` (addresses
//! separated by commas or white space; default `127.0.0.1`), named `softroce0`,
//! `softroce1`, … in that order. [`DeviceList::with_ip`] builds the list from explicit
//! addresses instead. Listing opens nothing; [`Device::open`] binds the socket.
//!
//! # Connecting through the CM
//!
//! Besides the crate's endpoint exchange and [`PreparedQueuePair::handshake`], [`cm`] connects
//! RC queue pairs the rdma_cm way (softroce addition): [`CmListener`] and
//! [`PreparedQueuePair::connect`], with private data both ways, interoperating with C
//! programs on softroce's librdmacm.so.1.
//!
//! # Differences from the `ibverbs` crate
//!
//! - Memory regions own their bytes inside the device (softroce keeps all registered memory
//!   in its MR table): [`MemoryRegion`] has [`read`](MemoryRegion::read) /
//!   [`write`](MemoryRegion::write) / [`to_vec`](MemoryRegion::to_vec) instead of `Deref` to
//!   a slice, and [`ProtectionDomain::register`] registers a copy of the caller's bytes.
//! - [`QueuePair::post_send`] and [`QueuePair::post_receive`] take lists of verbs work
//!   requests ([`SendWr`], [`RecvWr`]) and, on failure, report the index of the first
//!   refused one in [`Error::bad_wr`] (those before it were posted). [`QueuePair::post_write`]
//!   and [`QueuePair::post_read`] build the common one-sided WRs from memory slices.
//! - Errors are [`Error`], with [`Error::errno`] the errno `libibverbs` would return; it
//!   converts into `std::io::Error` (same errno) for code that uses `io::Result`.
//! - [`QueuePairEndpoint`] carries the GID (RoCE needs it; LID is always 0) and implements
//!   `serde::Serialize` / `Deserialize` for the out-of-band exchange, as in the crate.
//! - QP defaults are those of rdma-core's `ibv_rc_pingpong` where the `ibverbs` crate's
//!   would make a userspace device retransmit needlessly (see [`QueuePairBuilder`]).
//!
//! # Example: connect two devices on loopback and do an RDMA WRITE
//!
//! ```
//! use softroce_ibverbs::{self as ibverbs, AccessFlags, QpType, Wc, WcStatus};
//! use std::time::Duration;
//!
//! # fn main() -> Result<(), ibverbs::Error> {
//! let list = ibverbs::DeviceList::with_ip(&["127.0.24.101".parse().unwrap(),
//!                                           "127.0.24.102".parse().unwrap()]);
//! let (a, b) = (list[0].open()?, list[1].open()?);
//!
//! // Each side: PD, CQ, a registered buffer and an RC queue pair.
//! let (pd_a, pd_b) = (a.alloc_pd()?, b.alloc_pd()?);
//! let (cq_a, cq_b) = (a.create_cq(16, 0)?, b.create_cq(16, 0)?);
//! let src = pd_a.allocate(64)?;
//! let dst = pd_b.allocate(64)?;
//! src.write(0, b"hello from a")?;
//! let prep_a = pd_a
//!     .create_qp(&cq_a, &cq_a, QpType::Rc)
//!     .set_access(AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
//!     .build()?;
//! let prep_b = pd_b
//!     .create_qp(&cq_b, &cq_b, QpType::Rc)
//!     .set_access(AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
//!     .build()?;
//!
//! // Out of band (here: JSON strings), swap endpoints, then handshake on both sides.
//! let end_a = serde_json::to_string(&prep_a.endpoint()).unwrap();
//! let end_b = serde_json::to_string(&prep_b.endpoint()).unwrap();
//! let mut qp_a = prep_a.handshake(serde_json::from_str(&end_b).unwrap())?;
//! let _qp_b = prep_b.handshake(serde_json::from_str(&end_a).unwrap())?;
//!
//! // WRITE 12 bytes into b's buffer and wait for the completion.
//! qp_a.post_write(&[src.slice(0..12)], dst.remote().slice(0..12), 7, None)?;
//! let mut wc = [Wc::default(); 4];
//! let done = cq_a.wait(&mut wc, Duration::from_secs(10))?;
//! assert_eq!(done.len(), 1);
//! assert_eq!((done[0].wr_id, done[0].status), (7, WcStatus::Success));
//! assert_eq!(&dst.to_vec()[..12], b"hello from a");
//! # Ok(())
//! # }
//! ```

pub mod cm;

pub use cm::{CmConnection, CmListener, ConnectRequest};
pub use softroce::wire::cm::RejReason;

mod context;
mod cq;
mod device;
mod error;
mod mr;
mod pd;
mod qp;

pub use context::Context;
pub use cq::CompletionQueue;
pub use device::{Device, DeviceList, devices};
pub use error::{Error, Rejected, Result};
pub use mr::{LocalMemorySlice, MemoryRegion, RemoteMemorySlice};
pub use pd::ProtectionDomain;
pub use qp::{PreparedQueuePair, QueuePair, QueuePairBuilder, QueuePairEndpoint};

pub use softroce::verbs::{
    AccessFlags, Gid, PathMtu, QpType, RecvWr, SendFlags, SendWr, Sge, UdDest, Wc, WcFlags,
    WcOpcode, WcStatus, WrOpcode,
};

/// The environment variable [`devices`] reads: the device addresses, separated by commas
/// or white space (see [`softroce::net::discover`]).
pub use softroce::net::discover::SOFTROCE_IP;

/// The Rust snippets of the repository's README.md, compiled (not run) by `cargo test` as
/// doctests, so that what the README shows keeps building.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
struct ReadmeSnippets;
