//! softroce: a userspace Soft-RoCE (RoCEv2) emulator.
//!
//! Layers, each depending only on those before it:
//! - [`wire`]: bytes ⇄ headers (BTH, RETH, AETH, ImmDt, IETH, DETH, AtomicETH, AtomicAckETH),
//!   the opcode table, PSN arithmetic and the ICRC. No state, no I/O, no panics.
//! - [`transport`]: one sans-IO engine per queue pair (requester, responder, completer) plus
//!   the memory-region table. Time is passed in; nothing here opens a socket or reads a clock.
//! - [`verbs`]: devices, PDs, MRs, CQs and QPs with libibverbs names and errno-style errors.
//! - [`net`]: the only place with sockets, threads and the real clock: one UDP socket per
//!   device on port 4791, and a driver thread that feeds received datagrams to the engines.
//! - [`ibverbs`]: an API shaped like the `ibverbs` crate (device list, context, PD, CQ,
//!   queue pair builder, endpoint handshake) over `verbs` and `net`, for porting code.

#![warn(missing_docs)]

pub mod ibverbs;
pub mod net;
pub mod transport;
pub mod verbs;
pub mod wire;
