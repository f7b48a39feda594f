//! Steering the RoCEv2 datagrams of one device address among the processes that share the
//! device, in the kernel, with no hand-off between processes: a `SO_REUSEPORT` group of UDP
//! sockets bound to `ip:4791`, one socket per *slot* (a process's share of the device), and a
//! classic BPF program (`SO_ATTACH_REUSEPORT_CBPF`) that picks the socket of each datagram
//! from its BTH and, for QP1, from its CM MAD. docs/architecture.md ("A host's device")
//! explains the design and what was measured against the alternatives.
//!
//! The convention the program encodes:
//! - A QPN names its slot in its top [`SLOT_BITS`] bits: slot `s` owns QPNs
//!   `s << QPN_SHIFT ..= (s << QPN_SHIFT) | 0xffff`. Slot 0 is the device's own (QP0, QP1,
//!   and what no process owns).
//! - QP1 (the CM): a REQ or SIDR_REQ goes to the slot that listens on its service ID (the
//!   [`Listener`] table, compiled into the program), else to slot 0; every other CM message
//!   names the receiver's comm ID (REP, RTU, REJ, MRA, DREQ, DREP: the remote comm ID field;
//!   SIDR_REP: the request ID), whose top [`SLOT_BITS`] bits are its slot.
//! - Anything shorter than the fields read (the program's loads fail) goes to slot 0.
//!
//! The kernel hands the program the datagram from the UDP payload on (Linux
//! `net/core/sock_reuseport.c`, `run_bpf_filter` pulls the UDP header), and falls back to its
//! hash when the returned index is not below the group's size; sockets keep their index only
//! while none before them closes (a closed socket's place is taken by the last one), so the
//! owner of a group keeps every slot's socket open for the life of the group.

use std::io;
use std::os::fd::AsRawFd;

/// Bits of a QPN (its top ones) and of a CM comm ID (its top ones) that name the slot.
pub const SLOT_BITS: u32 = 8;
/// The most slots a device is shared among (slot 0 included).
pub const MAX_SLOTS: usize = 1 << SLOT_BITS;
/// A QPN's slot is `qpn >> QPN_SHIFT` (QPNs are 24 bits).
pub const QPN_SHIFT: u32 = 24 - SLOT_BITS;
/// A comm ID's slot is `comm_id >> COMM_ID_SHIFT`.
pub const COMM_ID_SHIFT: u32 = 32 - SLOT_BITS;

/// The slot of QPN `qpn`.
pub const fn slot_of_qpn(qpn: u32) -> usize {
    ((qpn & 0x00ff_ffff) >> QPN_SHIFT) as usize
}

/// The slot of CM comm ID `id`.
pub const fn slot_of_comm_id(id: u32) -> usize {
    (id >> COMM_ID_SHIFT) as usize
}

/// A service ID some slot listens on: its REQs and SIDR_REQs go there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Listener {
    /// The IB service ID (for rdma_cm, `rdma_cm_service_id(port space, port)`).
    pub service_id: u64,
    /// The slot that listens.
    pub slot: u16,
}

// Offsets in the UDP payload: BTH (12 bytes), then for QP1 the DETH (8) and the MAD.
/// BTH bytes 4..8: reserved byte, then the 24-bit destination QP.
const OFF_BTH_DEST_QP: u32 = 4;
const OFF_MAD: u32 = 12 + 8;
/// MAD header: the attribute ID at 16, the CM message from 24 on.
const OFF_ATTR_ID: u32 = OFF_MAD + 16;
const OFF_CM_DATA: u32 = OFF_MAD + 24;
/// REQ and SIDR_REQ: the service ID at message offset 8.
const OFF_SERVICE_ID: u32 = OFF_CM_DATA + 8;
/// REP, RTU, REJ, MRA, DREQ, DREP: the receiver's (remote) comm ID at message offset 4.
const OFF_REMOTE_COMM_ID: u32 = OFF_CM_DATA + 4;
/// SIDR_REP: the request ID (the receiver's) at message offset 0.
const OFF_REQUEST_ID: u32 = OFF_CM_DATA;

/// CM attribute IDs (IBTA 16.7.3; the values `wire::cm::attr` holds).
const ATTR_REQ: u32 = 0x0010;
const ATTR_SIDR_REQ: u32 = 0x0017;
const ATTR_SIDR_REP: u32 = 0x0018;

/// Classic BPF opcodes: class | size | mode or operation | source (Linux
/// `include/uapi/linux/bpf_common.h`: LD 0x00, ALU 0x04, JMP 0x05, RET 0x06; W 0x00, H 0x08;
/// ABS 0x20; AND 0x50, RSH 0x70; JA 0x00, JEQ 0x10, JGE 0x30; K 0x00; A 0x10 for RET).
mod op {
    /// `ld [k]`: A = the 32-bit big-endian word at payload offset k (BPF_LD|BPF_W|BPF_ABS).
    pub const LD_W_ABS: u16 = 0x20;
    /// `ldh [k]`: A = the 16-bit word at k (BPF_LD|BPF_H|BPF_ABS).
    pub const LD_H_ABS: u16 = 0x28;
    /// `and #k` (BPF_ALU|BPF_AND|BPF_K).
    pub const AND_K: u16 = 0x54;
    /// `rsh #k` (BPF_ALU|BPF_RSH|BPF_K).
    pub const RSH_K: u16 = 0x74;
    /// `ja +k` (BPF_JMP|BPF_JA).
    pub const JA: u16 = 0x05;
    /// `jeq #k, jt, jf` (BPF_JMP|BPF_JEQ|BPF_K).
    pub const JEQ_K: u16 = 0x15;
    /// `jge #k, jt, jf` (BPF_JMP|BPF_JGE|BPF_K).
    pub const JGE_K: u16 = 0x35;
    /// `ret a` (BPF_RET|BPF_A).
    pub const RET_A: u16 = 0x16;
    /// `ret #k` (BPF_RET|BPF_K).
    pub const RET_K: u16 = 0x06;
}

/// One classic BPF instruction.
fn insn(code: u16, jt: u8, jf: u8, k: u32) -> libc::sock_filter {
    libc::sock_filter { code, jt, jf, k }
}

/// The longest program the kernel takes (`BPF_MAXINSNS`).
const MAX_INSNS: usize = 4096;

/// The steering program of a group of `slots` sockets (slot `i` is the group's socket `i`)
/// for `listeners` (see the module documentation); a slot at or past `slots` is slot 0.
/// A CM message naming comm ID 0 as its receiver's (a REJ the active side sends when it
/// gives up on its REQ before any answer, kernel `cm_destroy_id` in REQ_SENT) goes to slot 0.
/// Errors: `EINVAL` if `slots` is 0 or over [`MAX_SLOTS`], a listener's slot is not below
/// `slots`, or the table makes the program longer than the kernel takes (about 800
/// listeners).
pub fn program(slots: usize, listeners: &[Listener]) -> io::Result<Vec<libc::sock_filter>> {
    program_with_unnamed(slots, listeners, 0)
}

/// [`program`], with the CM messages that name comm ID 0 as their receiver's going to slot
/// `unnamed` instead of slot 0: the keeper points it at the slot of the newest listener, the
/// only one that can hold the REQ such a REJ withdraws when one process listens.
/// Errors: as [`program`], and `EINVAL` if `unnamed` is not below `slots`.
pub fn program_with_unnamed(
    slots: usize,
    listeners: &[Listener],
    unnamed: u16,
) -> io::Result<Vec<libc::sock_filter>> {
    let einval = || io::Error::from_raw_os_error(libc::EINVAL);
    if slots == 0
        || slots > MAX_SLOTS
        || usize::from(unnamed) >= slots
        || listeners.iter().any(|l| usize::from(l.slot) >= slots)
    {
        return Err(einval());
    }
    let mut p = vec![
        // 0: A = destination QP; QP1 goes to the CM part (5), any other by its slot (14).
        insn(op::LD_W_ABS, 0, 0, OFF_BTH_DEST_QP),
        insn(op::AND_K, 0, 0, 0x00ff_ffff),
        insn(op::JEQ_K, 2, 0, 1),
        insn(op::RSH_K, 0, 0, QPN_SHIFT),
        insn(op::JA, 0, 0, 9),
        // 5: QP1, by attribute: REQ and SIDR_REQ to the listener table (jumps set below).
        insn(op::LD_H_ABS, 0, 0, OFF_ATTR_ID),
        insn(op::JEQ_K, 0, 0, ATTR_REQ),
        insn(op::JEQ_K, 0, 0, ATTR_SIDR_REQ),
        // 8: SIDR_REP names its receiver by the request ID, the others by the remote
        // comm ID; either way the top bits are the slot, and ID 0 names nobody (17).
        insn(op::JEQ_K, 0, 2, ATTR_SIDR_REP),
        insn(op::LD_W_ABS, 0, 0, OFF_REQUEST_ID),
        insn(op::JA, 0, 0, 1),
        insn(op::LD_W_ABS, 0, 0, OFF_REMOTE_COMM_ID),
        insn(op::JEQ_K, 4, 0, 0),
        insn(op::RSH_K, 0, 0, COMM_ID_SHIFT),
        // 14: A = a slot; one the group has no socket for is slot 0 (the kernel would pick
        // a socket by hash).
        insn(op::JGE_K, 1, 0, slots as u32),
        insn(op::RET_A, 0, 0, 0),
        insn(op::RET_K, 0, 0, 0),
        // 17: comm ID 0.
        insn(op::RET_K, 0, 0, u32::from(unnamed)),
    ];
    // 18: REQ / SIDR_REQ: the listener table, 5 instructions a row, then slot 0.
    let svc = p.len();
    for l in listeners {
        let (hi, lo) = ((l.service_id >> 32) as u32, l.service_id as u32);
        p.push(insn(op::LD_W_ABS, 0, 0, OFF_SERVICE_ID));
        p.push(insn(op::JEQ_K, 0, 3, hi));
        p.push(insn(op::LD_W_ABS, 0, 0, OFF_SERVICE_ID + 4));
        p.push(insn(op::JEQ_K, 0, 1, lo));
        p.push(insn(op::RET_K, 0, 0, u32::from(l.slot)));
    }
    p.push(insn(op::RET_K, 0, 0, 0));
    // The two attribute tests jump to the table (offsets count from the next instruction).
    for at in [6, 7] {
        let jt = u8::try_from(svc - at - 1).map_err(|_| einval())?;
        if let Some(i) = p.get_mut(at) {
            i.jt = jt;
        }
    }
    if p.len() > MAX_INSNS {
        return Err(einval());
    }
    Ok(p)
}

/// Attaches `prog` as the steering program of the `SO_REUSEPORT` group of `sock` (the whole
/// group's, whichever member it is set on; a later one replaces it).
/// Errors: those of `setsockopt(SO_ATTACH_REUSEPORT_CBPF)` (EINVAL for a program the kernel's
/// checker refuses).
pub fn attach(sock: &impl AsRawFd, prog: &[libc::sock_filter]) -> io::Result<()> {
    let fprog = libc::sock_fprog {
        len: u16::try_from(prog.len()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?,
        filter: prog.as_ptr().cast_mut(),
    };
    // SAFETY: `sock` is an open socket for the whole call; `fprog` points at `prog`, which
    // outlives the call, with its exact length; the kernel copies the program and keeps no
    // pointer into our memory.
    let rc = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_ATTACH_REUSEPORT_CBPF,
            (&raw const fprog).cast::<libc::c_void>(),
            core::mem::size_of::<libc::sock_fprog>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}
