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
//! - [`rand`]: the one seeded PRNG ([`rand::SplitMix64`]) every layer and frontend draws from;
//!   a seed that differs between runs comes from [`net::clock::seed_from_clock_and_pid`].
//! - The `ibverbs`-shaped Rust API is the `softroce-ibverbs` crate, a frontend over `verbs` and
//!   `net`; the `softroce` command is the `softroce-cli` package at the repository root.
//!
//! `docs/architecture.md` in the repository maps every module (where the receive path, the
//! requester and the MR checks are); `tests/sim_scenarios.rs` and `tests/rx_checks.rs` are
//! templates for simulator and single-device tests.
//!
//! # Example: two QP engines driven by hand (no socket, no clock)
//!
//! The transport is sans-IO: packets and time go in as arguments, packets and completions
//! come out of `poll_*` calls. Here QP 0x11 RDMA-WRITEs five bytes into QP 0x22's MR.
//!
//! ```
//! use softroce::transport::{
//!     AccessFlags, Instant, MemoryTable, Path, QpAttrs, QpCap, QpEngine, QpState, QpType,
//!     SendWr, Sge, WcStatus, WrOpcode,
//! };
//! use softroce::wire::{Psn, RocePacket};
//! use std::net::{IpAddr, Ipv4Addr};
//!
//! let (ip_a, ip_b) = (IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)), IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2)));
//! let qp = |qpn, peer, local, remote| {
//!     let mut e = QpEngine::new(qpn, QpType::Rc, 1, QpCap::default(), false);
//!     let attrs = QpAttrs {
//!         dest_qp_num: peer,
//!         rq_psn: Psn::new(0x100),
//!         sq_psn: Psn::new(0x100),
//!         qp_access_flags: AccessFlags::REMOTE_WRITE,
//!         ..QpAttrs::default()
//!     };
//!     let path = Path { local, remote, src_port: 0xc000, ip: Default::default() };
//!     // RESET -> INIT -> RTR -> RTS, each step checked against the modify_qp table.
//!     e.modify_to(QpState::Rts, &attrs, Some(path)).unwrap();
//!     e
//! };
//! let (mut a, mut b) = (qp(0x11, 0x22, ip_a, ip_b), qp(0x22, 0x11, ip_b, ip_a));
//! let rw = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
//! let (mut mem_a, mut mem_b) = (MemoryTable::new(1), MemoryTable::new(2));
//! let src = mem_a.register(1, 64, rw).unwrap();
//! mem_a.get_mut(src).unwrap().write(0, b"hello").unwrap();
//! let dst = mem_b.register(1, 64, rw).unwrap();
//! let dst_va = mem_b.get(dst).unwrap().iova;
//!
//! let sge = Sge { addr: mem_a.get(src).unwrap().iova, length: 5, lkey: src };
//! let mut wr = SendWr::new(7, WrOpcode::RdmaWrite, vec![sge]);
//! wr.remote_addr = dst_va;
//! wr.rkey = dst;
//! a.post_send(wr).unwrap();
//! let now = Instant::ZERO;
//! // A sends the WRITE; B executes it and answers with an ACK; A completes the WR.
//! let write = a.poll_transmit(now, &mem_a).unwrap();
//! b.handle_packet(now, &RocePacket::parse(&write.payload).unwrap(), ip_a, &mut mem_b);
//! let ack = b.poll_transmit(now, &mem_b).unwrap();
//! a.handle_packet(now, &RocePacket::parse(&ack.payload).unwrap(), ip_b, &mut mem_a);
//! let done = a.poll_completion().unwrap();
//! assert_eq!((done.wc.wr_id, done.wc.status), (7, WcStatus::Success));
//! let mut landed = [0u8; 5];
//! mem_b.get(dst).unwrap().read(0, &mut landed).unwrap();
//! assert_eq!(&landed, b"hello");
//! ```
//!
//! # Example: two devices on the seeded simulator
//!
//! `net::sim` runs the same devices and engines as UDP, on a virtual clock and a link whose
//! faults (loss, duplication, reordering, delay, bit flips) come from a seed, so any run
//! replays exactly. Here 10 % of datagrams are lost, and the WRITE still lands.
//!
//! ```
//! use softroce::net::sim::{Sim, SimFaults};
//! use softroce::verbs::{AccessFlags, Gid, QpCap, QpInitAttr, QpType, RcConnect, SendWr, WcStatus, WrOpcode};
//! use std::time::Duration;
//!
//! let faults = SimFaults { loss: 0.1, ..SimFaults::NONE };
//! let mut sim = Sim::new(42, faults);
//! let (ip_a, ip_b) = ("192.0.2.1".parse().unwrap(), "192.0.2.2".parse().unwrap());
//! let (a, b) = (sim.add_device("simA", ip_a), sim.add_device("simB", ip_b));
//! let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
//! let (ca, cb) = (a.create_cq(16).unwrap(), b.create_cq(16).unwrap());
//! let init = |cq| QpInitAttr {
//!     qp_type: QpType::Rc, send_cq: cq, recv_cq: cq, cap: QpCap::default(),
//!     sq_sig_all: true, srq: None,
//! };
//! let (qa, qb) = (pa.create_qp(&init(&ca)).unwrap(), pb.create_qp(&init(&cb)).unwrap());
//! let rw = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
//! let (src, dst) = (pa.reg_mr(4096, rw).unwrap(), pb.reg_mr(4096, rw).unwrap());
//! qa.connect_rc(&RcConnect::new(qb.qp_num(), Gid::from_ip(ip_b), 0, 0)).unwrap();
//! qb.connect_rc(&RcConnect::new(qa.qp_num(), Gid::from_ip(ip_a), 0, 0)).unwrap();
//!
//! src.write(0, &[0xab; 3000]).unwrap();
//! let mut wr = SendWr::new(1, WrOpcode::RdmaWrite, vec![src.sge(0, 3000)]);
//! wr.remote_addr = dst.addr();
//! wr.rkey = dst.rkey();
//! qa.post_send(&[wr]).unwrap();
//! // Virtual time jumps from event to event; retransmissions repair the losses.
//! let mut wc = None;
//! assert!(sim.run_until(Duration::from_secs(10), || {
//!     wc = ca.poll_one();
//!     wc.is_some()
//! }));
//! assert_eq!(wc.unwrap().status, WcStatus::Success);
//! assert_eq!(dst.to_vec()[..3000], [0xab; 3000]);
//! ```

#![warn(missing_docs)]

pub mod cm;
pub mod net;
pub mod rand;
pub mod transport;
pub mod verbs;
pub mod wire;
