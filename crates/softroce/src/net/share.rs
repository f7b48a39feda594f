//! A device shared by every process of the host that opens it, as every process shares
//! kernel rxe's `rxe0`: the processes' half of the design in docs/architecture.md ("A host's
//! device"). The keeper's half is `net::keeper` (crate-private).
//!
//! Shape: the address's UDP port 4791 belongs to a `SO_REUSEPORT` group whose sockets the
//! device's *keeper* process makes and holds; the group's steering program
//! ([`super::steer`]) gives each datagram to the socket of the slot that owns its
//! destination QP (or, on QP1, its listener or connection). [`Share::join`] connects to the
//! keeper over the Unix socket `@softroce/<ip>` (abstract namespace: one per network
//! namespace, as the address is), starting the keeper first when nobody answers there, and
//! receives its slot number, a duplicate of its slot's socket and the device's counter pages
//! (`SCM_RIGHTS`; [`super::counter_pages`]). The process then receives on that socket exactly
//! as a device with the port to itself does, and adds what its device counts to its slot's
//! block of the counter pages ([`Share::counters`]), where every process of the device reads
//! the device's counters.
//!
//! While the process lives it keeps the connection; [`Share::listen`] and
//! [`Share::unlisten`] put its CM listeners in the group's program, so that a REQ for one of
//! its service IDs reaches it. When the process exits or dies, the kernel closes the
//! connection: the keeper takes the slot back (with its listeners) and the process's
//! datagrams that still come are the keeper's drops.
//!
//! The messages on the connection are `SOCK_SEQPACKET` records: the keeper's greeting
//! (`b'S'`, the slot, with the socket and the counter pages' memfd attached, in that order),
//! then requests of 16 bytes (an op, three zero bytes, four zero bytes, the service ID
//! little-endian) each answered by a reply of 8 bytes (the op, three zero bytes, an errno
//! little-endian, 0 for success); the reply to `b'D'` ([`Share::keeper_drops`]) has the
//! count after those 8 bytes (u64 little-endian). Source of the conventions (QPN and
//! comm-ID slots): [`super::steer`].

use super::counter_pages::{CounterPages, SlotCounters};
use super::fork::{Unshared, unshared};
use super::keeper::{
    DROPS_REPLY_LEN, NAME_TAKEN, OP_DROPS, OP_LISTEN, OP_SLOT, OP_UNLISTEN, REPLY_LEN, REQ_LEN,
    keeper_addr, recv_record, send_record, seqpacket,
};
use parking_lot::Mutex;
use std::io;
use std::net::IpAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;

/// The environment variable that turns sharing off: `SOFTROCE_SHARE=0` makes each device
/// bind the address's port 4791 alone, as softroce did before devices were shared (a second
/// process then gets EADDRINUSE).
pub const SOFTROCE_SHARE: &str = "SOFTROCE_SHARE";

/// Whether devices are shared (`$SOFTROCE_SHARE` is not `0`).
pub fn enabled() -> bool {
    std::env::var_os(SOFTROCE_SHARE).is_none_or(|v| v != "0")
}

/// A process's share of the device on one address: its slot and its connection to the
/// keeper. Dropping it (after the slot's socket, which the link holds) gives the slot back.
#[derive(Debug)]
pub struct Share {
    /// Keeps a `fork`ed child from holding the connection (and so the slot) open after this
    /// process is gone (`super::fork`). Declared before `ctl`: dropped first.
    _unshared: Unshared,
    /// The connection to the keeper; requests and their replies under the lock.
    ctl: Mutex<OwnedFd>,
    slot: u8,
    /// The device's counters: this process's slot's block of the keeper's counter pages.
    counters: Arc<SlotCounters>,
}

impl Share {
    /// Joins the device on `ip`: connects to its keeper, starting one when none answers, and
    /// returns the share and the slot's socket (bound to `ip:4791`, ready to receive).
    /// Errors: EADDRINUSE when the address's port is someone else's (a device opened with
    /// `SOFTROCE_SHARE=0`, or kernel rxe); EADDRNOTAVAIL for an address not on this host;
    /// EAGAIN when no keeper could be reached after [`JOIN_TRIES`] tries (each failed try
    /// met a keeper that was exiting); `InvalidData` when the keeper's greeting does not
    /// carry a socket and counter pages of this build's layout (a keeper of another
    /// softroce build); other socket, `fork` and `mmap` errors.
    pub fn join(ip: IpAddr) -> io::Result<(Share, OwnedFd)> {
        let mut last = io::Error::from_raw_os_error(libc::EAGAIN);
        for _ in 0..JOIN_TRIES {
            match connect(ip) {
                Ok(ctl) => match greeting(&ctl) {
                    Ok((slot, sock, memfd)) => {
                        // Closing `ctl` on an error gives the slot back.
                        let pages = CounterPages::open(&memfd)?;
                        let share = Share {
                            _unshared: unshared(ctl.as_raw_fd()),
                            ctl: Mutex::new(ctl),
                            slot,
                            counters: Arc::new(SlotCounters::new(pages, slot)),
                        };
                        return Ok((share, sock));
                    }
                    // The keeper closed its listener while this connection waited in its
                    // backlog (it was exiting with its last client): start afresh.
                    Err(e) if e.raw_os_error() == Some(libc::ECONNRESET) => last = e,
                    Err(e) => return Err(e),
                },
                // Nobody listens (ECONNREFUSED: a name being set up; ENOENT, or in the
                // abstract namespace ECONNREFUSED too, for no name at all): start the
                // keeper, or lose the race to whoever starts it, and connect again.
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::ECONNREFUSED) | Some(libc::ENOENT)
                    ) =>
                {
                    match super::keeper::start(ip) {
                        Ok(()) => {}
                        // Another process bound the name first: its keeper is starting.
                        Err(e) if e.kind() == io::ErrorKind::AddrInUse && is_name(&e) => {
                            // Its keeper listens a moment after its bind: wait that moment.
                            std::thread::sleep(std::time::Duration::from_millis(1));
                        }
                        Err(e) => return Err(e),
                    }
                    last = e;
                }
                Err(e) => return Err(e),
            }
        }
        Err(last)
    }

    /// The process's slot (1..=255): the top 8 bits of its QPNs and CM comm IDs.
    pub fn slot(&self) -> u8 {
        self.slot
    }

    /// The device's counters, shared by every process of the device: where this process
    /// adds its counts (its slot's block) and reads the device's
    /// ([`crate::verbs::SharedCounters`]).
    pub fn counters(&self) -> Arc<SlotCounters> {
        self.counters.clone()
    }

    /// Makes the REQs and SIDR_REQs for `service_id` that reach the device come to this
    /// process. Errors: EADDRINUSE when another process listens on it (as the kernel CM's
    /// `cm_insert_listen` refuses a second listener of a service ID on a device), ENOSPC when
    /// the steering program holds no more listeners, EPIPE when the keeper is gone.
    pub fn listen(&self, service_id: u64) -> io::Result<()> {
        self.request(OP_LISTEN, service_id)
    }

    /// Undoes [`Share::listen`] (nothing if this process does not listen on `service_id`).
    /// Errors: EPIPE when the keeper is gone.
    pub fn unlisten(&self, service_id: u64) -> io::Result<()> {
        self.request(OP_UNLISTEN, service_id)
    }

    /// How many datagrams the device's keeper dropped since it started: those for a slot no
    /// process holds (a QPN or CM comm ID of no process, or of a process gone) that are not
    /// CM MADs it answers, and datagrams on slot 0 that are not a well-formed MAD to QP1
    /// (rxe counts its drops per device the same way). Each is in the device's counters
    /// too (slot 0's block of the counter pages), by its drop reason, or, for a datagram to
    /// QP1 too short for a MAD, in `rcvd_pkts`. A process's own drops (an unknown QPN in its
    /// slot, a bad ICRC) are its part of the device's counters. Errors: EPIPE when the
    /// keeper is gone.
    pub fn keeper_drops(&self) -> io::Result<u64> {
        let mut reply = [0u8; DROPS_REPLY_LEN];
        self.exchange(OP_DROPS, 0, &mut reply)?;
        let mut n = [0u8; 8];
        n.copy_from_slice(&reply[REPLY_LEN..]);
        Ok(u64::from_le_bytes(n))
    }

    fn request(&self, op: u8, service_id: u64) -> io::Result<()> {
        self.exchange(op, service_id, &mut [0u8; REPLY_LEN])
    }

    /// Sends request `op` and reads its reply, of exactly `reply.len()` bytes, into `reply`.
    fn exchange(&self, op: u8, service_id: u64, reply: &mut [u8]) -> io::Result<()> {
        let ctl = self.ctl.lock();
        let mut req = [0u8; REQ_LEN];
        req[0] = op;
        req[8..].copy_from_slice(&service_id.to_le_bytes());
        send_record(ctl.as_raw_fd(), &req)?;
        let n = recv_record(ctl.as_raw_fd(), reply, 0)?;
        if n != reply.len() || reply.first() != Some(&op) {
            return Err(io::Error::from_raw_os_error(libc::EPIPE));
        }
        match i32::from_le_bytes([reply[4], reply[5], reply[6], reply[7]]) {
            0 => Ok(()),
            e => Err(io::Error::from_raw_os_error(e)),
        }
    }
}

/// How many times [`Share::join`] tries to reach a keeper.
pub const JOIN_TRIES: usize = 64;

/// Whether `e` is about the keeper's name (the error [`super::keeper::start`] gives when
/// another process bound it first) rather than the UDP port.
fn is_name(e: &io::Error) -> bool {
    e.to_string().contains(NAME_TAKEN)
}

fn connect(ip: IpAddr) -> io::Result<OwnedFd> {
    let fd = seqpacket()?;
    let (addr, len) = keeper_addr(ip);
    // SAFETY: `addr` is a sockaddr_un of `len` meaningful bytes.
    let rc = unsafe { libc::connect(fd.as_raw_fd(), (&raw const addr).cast(), len) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

/// Reads the keeper's greeting: the slot, its socket and the counter pages' memfd.
fn greeting(ctl: &OwnedFd) -> io::Result<(u8, OwnedFd, OwnedFd)> {
    let mut rec = [0u8; REPLY_LEN];
    // Room for the greeting's two descriptors (CMSG_SPACE(2 * sizeof(int)) is 24 on Linux).
    let mut cbuf = [0u64; 8];
    let mut iov = libc::iovec {
        iov_base: rec.as_mut_ptr().cast(),
        iov_len: rec.len(),
    };
    // SAFETY: msghdr is plain data; all zero is valid (no name, no control yet).
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &raw mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&cbuf);
    let n = loop {
        // SAFETY: `msg` points at `iov` (into `rec`) and `cbuf`, live for the call.
        let n = unsafe { libc::recvmsg(ctl.as_raw_fd(), &raw mut msg, libc::MSG_CMSG_CLOEXEC) };
        if n >= 0 {
            break n as usize;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    };
    let mut fds: Vec<OwnedFd> = Vec::new();
    // SAFETY: the CMSG_* walk stays inside `msg.msg_control` as recvmsg filled it; a
    // SCM_RIGHTS message's data holds descriptors now owned by this process.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&raw const msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(c).cast::<RawFd>();
                let count = ((*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize)
                    / std::mem::size_of::<RawFd>();
                for i in 0..count {
                    fds.push(OwnedFd::from_raw_fd(data.add(i).read_unaligned()));
                }
            }
            c = libc::CMSG_NXTHDR(&raw const msg, c);
        }
    }
    let truncated = msg.msg_flags & libc::MSG_CTRUNC != 0;
    let mut fds = fds.into_iter();
    match (n, fds.next(), fds.next(), fds.next()) {
        (REPLY_LEN, Some(sock), Some(memfd), None)
            if rec[0] == OP_SLOT && rec[1] != 0 && !truncated =>
        {
            Ok((rec[1], sock, memfd))
        }
        (REPLY_LEN, Some(_), _, _) if rec[0] == OP_SLOT && rec[1] != 0 => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "the device keeper's greeting did not carry a socket and counter pages \
             (a keeper of another softroce build?)",
        )),
        // The greeting says why the keeper could not give a slot (all taken: EBUSY).
        (REPLY_LEN, None, _, _) if rec[0] == OP_SLOT => {
            let e = i32::from_le_bytes([rec[4], rec[5], rec[6], rec[7]]);
            Err(io::Error::from_raw_os_error(if e == 0 {
                libc::EIO
            } else {
                e
            }))
        }
        _ => Err(io::Error::from_raw_os_error(libc::ECONNRESET)),
    }
}
