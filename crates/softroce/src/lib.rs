//! softroce: a userspace Soft-RoCE (RoCEv2) emulator.
//!
//! Layers, each depending only on those before it:
//! - [`wire`]: bytes ⇄ headers (BTH, RETH, AETH, ImmDt, IETH, DETH, AtomicETH, AtomicAckETH),
//!   the opcode table, PSN arithmetic and the ICRC. No state, no I/O, no panics.
//! - [`transport`]: one sans-IO engine per queue pair (requester, responder, completer) plus
//!   the memory-region table. Time is passed in; nothing here opens a socket or reads a clock.
//! - [`cm`]: the IB Communication Manager, a second sans-IO engine (connect, accept,
//!   disconnect by CM MADs on QP1), and the MAD agent that feeds it.
//! - [`verbs`]: devices, PDs, MRs, CQs and QPs with libibverbs names and errno-style errors.
//! - [`net`]: the only place with sockets, threads and the real clock: one UDP socket per
//!   device on port 4791, and a driver thread that feeds received datagrams to the engines.
//! - The `ibverbs`-shaped Rust API is the `softroce-ibverbs` crate, a frontend over `verbs` and
//!   `net`; the `softroce` command is the `softroce-cli` package at the repository root.

#![warn(missing_docs)]

pub mod cm;
pub mod net;
pub mod transport;
pub mod verbs;
pub mod wire;
