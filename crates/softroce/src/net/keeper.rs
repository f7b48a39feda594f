//! The keeper of a shared device: the process that holds every slot's socket of the
//! address's `SO_REUSEPORT` group for the life of the group, hands each process that opens
//! the device a slot ([`super::share`]), keeps the group's steering program
//! ([`super::steer`]) in step with the slots and their CM listeners, and serves slot 0.
//!
//! Why a process of its own: a member's index in a reuseport group moves when a member
//! before it closes, so the sockets must outlive every user; and whatever comes for a QPN or
//! comm ID nobody owns must still be answered or counted. Slot 0 is the device's own: a CM
//! REQ for a service nobody listens on gets REJ (invalid service ID), a DREQ for no
//! connection a DREP, as the kernel CM answers them (`cm.c` `cm_req_handler`,
//! `cm_dreq_handler`); anything else is a drop, as rxe drops a packet for a QP that does not
//! exist. A slot whose process is gone is drained the same way until it is given out again,
//! round robin, so a late packet meets no new QP of the same number for a while.
//!
//! Life: [`start`] is called by the first process that finds no keeper. It binds the
//! keeper's name and the group's first socket (so that the caller sees EADDRINUSE when the
//! port is someone else's), then forks twice: the keeper runs in the grandchild, outside the
//! caller's session (the caller's Ctrl-C does not reach it), with only its own descriptors,
//! and exits when its last client's connection ends (or when no client came within
//! [`FIRST_CLIENT_WAIT`]). Nothing is left behind: the abstract name goes with its socket.
//!
//! The keeper runs in a `fork`ed copy of a possibly multi-threaded process: it allocates
//! (glibc's `fork` makes malloc usable in the child) but takes no lock another thread of the
//! parent could have held (no `tracing`, no standard streams, no environment, no statics of
//! the engine), and ends with `_exit` (no `atexit` handler of the program runs twice).

use super::counter_pages::CounterPages;
use super::steer::{self, Listener, MAX_SLOTS};
use crate::cm::{CmConfig, CmEngine};
use crate::transport::{Counters, DropReason};
use crate::verbs::Clock;
use crate::wire::{IcrcIp, ROCE_V2_UDP_PORT, RocePacket, mad::MAD_LEN, solve_ipv4_ident};
use socket2::{SockAddr, Socket};
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

// ---- the protocol between a process and the keeper (`super::share`) ----

/// The greeting's op: the slot, with its socket and the device's counter pages
/// ([`super::counter_pages`]).
pub(super) const OP_SLOT: u8 = b'S';
/// A request's op: listen on a service ID.
pub(super) const OP_LISTEN: u8 = b'L';
/// A request's op: stop listening on a service ID.
pub(super) const OP_UNLISTEN: u8 = b'U';
/// A request's op: the keeper's count of dropped datagrams (its service ID is ignored;
/// the reply is [`DROPS_REPLY_LEN`] bytes long).
pub(super) const OP_DROPS: u8 = b'D';
/// Length of a request record.
pub(super) const REQ_LEN: usize = 16;
/// Length of a reply record (and of the greeting).
pub(super) const REPLY_LEN: usize = 8;
/// Length of the reply to [`OP_DROPS`]: a reply record, then the count (u64 little-endian).
pub(super) const DROPS_REPLY_LEN: usize = REPLY_LEN + 8;

/// The keeper's Unix socket address for the device on `ip`: `@softroce/<ip>` in the
/// abstract namespace, as a `sockaddr_un` and its length.
pub(super) fn keeper_addr(ip: IpAddr) -> (libc::sockaddr_un, libc::socklen_t) {
    // SAFETY: sockaddr_un is plain data; all zero is a valid value.
    let mut a: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    a.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let name = format!("softroce/{ip}");
    // Byte 0 stays NUL: the abstract namespace. The name (at most 9 + 39 bytes) fits the
    // 107 bytes after it.
    for (d, s) in a.sun_path[1..].iter_mut().zip(name.bytes()) {
        *d = s as libc::c_char;
    }
    let len = std::mem::size_of::<libc::sa_family_t>() + 1 + name.len();
    (a, len as libc::socklen_t)
}

/// A new `SOCK_SEQPACKET` Unix socket (close-on-exec).
pub(super) fn seqpacket() -> io::Result<OwnedFd> {
    // SAFETY: socket(2) with constant arguments; the descriptor is owned once, here.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a descriptor socket(2) just returned.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Sends one record on a connected seqpacket socket, never raising SIGPIPE.
pub(super) fn send_record(fd: RawFd, rec: &[u8]) -> io::Result<()> {
    // SAFETY: `rec` is readable for its length for the whole call.
    let n = unsafe { libc::send(fd, rec.as_ptr().cast(), rec.len(), libc::MSG_NOSIGNAL) };
    if n == rec.len() as isize {
        Ok(())
    } else if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Err(io::Error::from(io::ErrorKind::WriteZero))
    }
}

/// Receives one record (up to `buf.len()` bytes; 0 means the peer closed).
pub(super) fn recv_record(fd: RawFd, buf: &mut [u8], flags: libc::c_int) -> io::Result<usize> {
    loop {
        // SAFETY: `buf` is writable for its length for the whole call.
        let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), flags) };
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// What [`super::keeper::start`]'s error says when the keeper's name was taken.
pub(super) const NAME_TAKEN: &str = "keeper name taken";

/// How long a keeper waits for its first client before it gives up (its starter died).
pub const FIRST_CLIENT_WAIT: Duration = Duration::from_secs(10);

/// Longest the keeper's poll waits before it looks at its slot-0 CM's timers and its exit
/// conditions again (the CM's next timer, when sooner, through
/// [`wait_for_capped`](super::cm_loop::wait_for_capped)).
const KEEPER_TICK: Duration = Duration::from_secs(1);

/// A socket of the group: bound to `ip:4791` with `SO_REUSEPORT`, set up as a device's
/// receive socket (`super::sock`).
fn group_socket(ip: IpAddr) -> io::Result<Socket> {
    let s = super::sock::unbound_socket(ip, false)?;
    s.set_reuse_port(true)?;
    s.bind(&SocketAddr::new(ip, ROCE_V2_UDP_PORT).into())?;
    Ok(s)
}

/// Starts the keeper of the device on `ip` (see the module documentation). Returns once the
/// keeper's name is bound and listening, so that a `connect` right after reaches it.
/// Errors: EADDRINUSE with [`NAME_TAKEN`] in its message when another process bound the
/// keeper's name first; EADDRINUSE (port 4791 of `ip` is someone else's) or EADDRNOTAVAIL
/// from the first socket of the group; `fork` errors.
pub(super) fn start(ip: IpAddr) -> io::Result<()> {
    let listener = seqpacket()?;
    let (addr, len) = keeper_addr(ip);
    // SAFETY: `addr` is a sockaddr_un of `len` meaningful bytes.
    if unsafe { libc::bind(listener.as_raw_fd(), (&raw const addr).cast(), len) } != 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EADDRINUSE) {
            return Err(io::Error::new(
                io::ErrorKind::AddrInUse,
                format!("{NAME_TAKEN} (@softroce/{ip})"),
            ));
        }
        return Err(e);
    }
    // SAFETY: listen(2) on a bound socket this function owns.
    if unsafe { libc::listen(listener.as_raw_fd(), 128) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let slot0 = group_socket(ip)?;
    steer::attach(&slot0, &steer::program(1, &[])?)?;
    // The device's counters, made here (where a failure can be reported) for the keeper.
    let (memfd, pages) = CounterPages::create().map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("making the device's counter pages (memfd): {e}"),
        )
    })?;
    // What the keeper answers with on slot 0, made here where the environment may be read.
    let guid = crate::verbs::device_attr(ip).node_guid;
    let seed = super::clock::seed_from_clock_and_pid();
    // Every signal blocked until the child has dropped the program's handlers.
    let blocked = super::fork::SignalsBlocked::new();
    // SAFETY: fork(2). The child only runs `keeper_main` (through a second fork), which
    // never returns and follows the rules of the module documentation.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(io::Error::last_os_error());
    }
    if pid == 0 {
        // SAFETY: in the child: a new session, then the grandchild runs the keeper and the
        // child exits at once (its parent reaps it below), so the keeper is nobody's child
        // that a program's wait() could meet later.
        unsafe {
            libc::setsid();
            let pid2 = libc::fork();
            if pid2 != 0 {
                libc::_exit(0);
            }
        }
        keeper_main(ip, listener, slot0, memfd, pages, guid, seed);
    }
    drop(blocked);
    loop {
        // SAFETY: waits for the child forked above; no status wanted.
        let r = unsafe { libc::waitpid(pid, std::ptr::null_mut(), 0) };
        if r >= 0 || io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
            break;
        }
    }
    Ok(())
}

/// The keeper process. Never returns.
fn keeper_main(
    ip: IpAddr,
    listener: OwnedFd,
    slot0: Socket,
    memfd: OwnedFd,
    pages: CounterPages,
    guid: u64,
    seed: u64,
) -> ! {
    // SAFETY (the block): descriptor and signal housekeeping on this process's own
    // descriptors: the listener, slot 0 and the counter pages' memfd move to 3, 4 and 5, the
    // standard descriptors to /dev/null, every other descriptor inherited from the program
    // is closed (the pages' mapping stays: it is no descriptor).
    let (listener, slot0, memfd) = unsafe {
        let l = libc::fcntl(listener.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 100);
        let s = libc::fcntl(slot0.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 100);
        let m = libc::fcntl(memfd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 100);
        if l < 0
            || s < 0
            || m < 0
            || libc::dup2(l, 3) < 0
            || libc::dup2(s, 4) < 0
            || libc::dup2(m, 5) < 0
        {
            libc::_exit(1);
        }
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
        for fd in 0..3 {
            libc::dup2(null, fd);
        }
        if libc::syscall(libc::SYS_close_range, 6u32, u32::MAX, 0u32) != 0 {
            for fd in 6..4096 {
                libc::close(fd);
            }
        }
        super::fork::child_signal_defaults(&[
            libc::SIGINT,
            libc::SIGHUP,
            libc::SIGQUIT,
            libc::SIGPIPE,
        ]);
        libc::chdir(c"/".as_ptr());
        // The originals (3, 4 and 5 are now the same files) were closed by close_range or
        // are the dups themselves; forget the owners without closing again.
        std::mem::forget(listener);
        std::mem::forget(slot0);
        std::mem::forget(memfd);
        (
            OwnedFd::from_raw_fd(3),
            Socket::from_raw_fd(4),
            OwnedFd::from_raw_fd(5),
        )
    };
    let mut k = Keeper::new(ip, listener, slot0, (memfd, pages), guid, seed);
    k.serve();
    // SAFETY: ends the keeper without running the program's atexit handlers.
    unsafe { libc::_exit(0) }
}

/// A connected process.
struct Client {
    fd: OwnedFd,
    slot: u8,
}

struct Keeper {
    ip: IpAddr,
    listener: OwnedFd,
    /// The group's sockets; index = slot.
    socks: Vec<Socket>,
    /// Whether slot `i` belongs to a connected process.
    taken: Vec<bool>,
    clients: Vec<Client>,
    listeners: Vec<Listener>,
    /// The slot given out last (round robin).
    last: usize,
    /// Slot 0's CM: no listener, no connection; answers as the kernel CM answers for them.
    cm: CmEngine,
    /// Datagrams for no live slot (an unknown QPN, an unanswered MAD, a bad ICRC).
    dropped: u64,
    /// The device's counter pages ([`super::counter_pages`]) and their memfd, handed to
    /// every process with its slot.
    pages: CounterPages,
    memfd: OwnedFd,
    /// What the keeper counted, as rxe counts for its device (slot 0's block of `pages`):
    /// the drops, the MADs received and the answers sent.
    counters: Counters,
    /// `counters` as last added to slot 0's block.
    published: Counters,
    started: Instant,
    clock: super::SystemClock,
    served_any: bool,
    buf: Vec<u8>,
}

impl Keeper {
    fn new(
        ip: IpAddr,
        listener: OwnedFd,
        slot0: Socket,
        (memfd, pages): (OwnedFd, CounterPages),
        guid: u64,
        seed: u64,
    ) -> Keeper {
        Keeper {
            ip,
            listener,
            socks: vec![slot0],
            taken: vec![true],
            clients: Vec::new(),
            listeners: Vec::new(),
            last: 0,
            cm: CmEngine::new(CmConfig::new(ip, guid, seed)),
            dropped: 0,
            pages,
            memfd,
            counters: Counters::default(),
            published: Counters::default(),
            started: Instant::now(),
            clock: super::SystemClock::new(),
            served_any: false,
            buf: vec![0u8; 65536],
        }
    }

    fn serve(&mut self) {
        loop {
            if self.served_any && self.clients.is_empty() {
                return;
            }
            if !self.served_any && self.started.elapsed() > FIRST_CLIENT_WAIT {
                return;
            }
            // What to wait on: the listener, every client, every socket no process reads
            // (slot 0 and the slots of processes gone).
            let mut pfds = vec![pollfd(self.listener.as_raw_fd())];
            pfds.extend(self.clients.iter().map(|c| pollfd(c.fd.as_raw_fd())));
            let idle: Vec<usize> = (0..self.socks.len())
                .filter(|&s| s == 0 || !self.taken[s])
                .collect();
            pfds.extend(idle.iter().map(|&s| pollfd(self.socks[s].as_raw_fd())));
            let now = self.clock.now();
            let timeout = super::cm_loop::wait_for_capped(self.cm.poll_timeout(), now, KEEPER_TICK)
                .as_millis() as libc::c_int;
            // SAFETY: `pfds` is a live array of `pfds.len()` pollfd.
            let n = unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, timeout) };
            if n < 0 {
                if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return;
            }
            let nc = self.clients.len();
            // Clients first (gone ones release their slots), highest index first so that
            // removals do not move the ones still to look at.
            for i in (0..nc).rev() {
                if pfds[1 + i].revents != 0 {
                    self.on_client(i);
                }
            }
            for (j, &s) in idle.iter().enumerate() {
                if pfds[1 + nc + j].revents & libc::POLLIN != 0 {
                    self.drain(s);
                }
            }
            if pfds[0].revents & libc::POLLIN != 0 {
                self.accept();
            }
            self.cm.handle_timeout(self.clock.now());
            self.publish();
            self.flush_cm();
            self.publish();
        }
    }

    /// Adds what the keeper counted since it last did to slot 0's block of the counter
    /// pages.
    fn publish(&mut self) {
        let pages = &self.pages;
        self.counters
            .hand_on_growth(&mut self.published, |i, n| pages.add(0, i, n));
    }

    /// A new process: its slot, with the slot's socket.
    fn accept(&mut self) {
        // SAFETY: accept4 on the listening socket; the new descriptor is owned once, here.
        let fd = unsafe {
            libc::accept4(
                self.listener.as_raw_fd(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                libc::SOCK_CLOEXEC,
            )
        };
        if fd < 0 {
            return;
        }
        // SAFETY: a descriptor accept4 just returned.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        self.served_any = true;
        let Some(slot) = self.free_slot() else {
            let mut rec = [0u8; REPLY_LEN];
            rec[0] = OP_SLOT;
            rec[4..].copy_from_slice(&libc::EBUSY.to_le_bytes());
            let _ = send_record(fd.as_raw_fd(), &rec);
            return;
        };
        let fds = [self.socks[slot].as_raw_fd(), self.memfd.as_raw_fd()];
        if send_slot(fd.as_raw_fd(), slot as u8, fds).is_ok() {
            self.taken[slot] = true;
            self.last = slot;
            self.clients.push(Client {
                fd,
                slot: slot as u8,
            });
        }
    }

    /// The next free slot after the last one given out (creating the group's next socket
    /// when the turn comes to it), or `None` when all are taken.
    fn free_slot(&mut self) -> Option<usize> {
        for step in 1..MAX_SLOTS {
            let s = 1 + (self.last + step - 1) % (MAX_SLOTS - 1);
            if s < self.socks.len() && !self.taken[s] {
                return Some(s);
            }
            if s == self.socks.len() {
                let sock = group_socket(self.ip).ok()?;
                self.socks.push(sock);
                self.taken.push(false);
                // Datagrams for the new slot reach its socket from now on.
                if self.reprogram().is_err() {
                    return None;
                }
                return Some(s);
            }
        }
        None
    }

    fn reprogram(&self) -> io::Result<()> {
        // A REJ naming no receiver (the active side withdrawing its REQ) can only be for a
        // listener's process: the newest one's (the only one when one process listens).
        let unnamed = self.listeners.last().map_or(0, |l| l.slot);
        let prog = steer::program_with_unnamed(self.socks.len(), &self.listeners, unnamed)?;
        steer::attach(&self.socks[0], &prog)
    }

    /// A client's request, or its end.
    fn on_client(&mut self, i: usize) {
        let mut req = [0u8; REQ_LEN];
        let fd = self.clients[i].fd.as_raw_fd();
        match recv_record(fd, &mut req, libc::MSG_DONTWAIT) {
            Ok(REQ_LEN) => {
                let mut sid = [0u8; 8];
                sid.copy_from_slice(&req[8..]);
                let sid = u64::from_le_bytes(sid);
                let slot = self.clients[i].slot;
                let mut reply = [0u8; DROPS_REPLY_LEN];
                let errno = match req[0] {
                    OP_LISTEN => self.listen(slot, sid),
                    OP_UNLISTEN => self.unlisten(slot, sid),
                    OP_DROPS => {
                        reply[REPLY_LEN..].copy_from_slice(&self.dropped.to_le_bytes());
                        0
                    }
                    _ => libc::EINVAL,
                };
                reply[0] = req[0];
                reply[4..REPLY_LEN].copy_from_slice(&errno.to_le_bytes());
                let len = if req[0] == OP_DROPS {
                    DROPS_REPLY_LEN
                } else {
                    REPLY_LEN
                };
                if send_record(fd, &reply[..len]).is_err() {
                    self.release(i);
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            // End of file (the process closed the device or is gone), an error, or a
            // record that is not a request.
            _ => self.release(i),
        }
    }

    fn listen(&mut self, slot: u8, service_id: u64) -> libc::c_int {
        if let Some(l) = self.listeners.iter().find(|l| l.service_id == service_id) {
            return if l.slot == u16::from(slot) {
                0
            } else {
                libc::EADDRINUSE
            };
        }
        self.listeners.push(Listener {
            service_id,
            slot: u16::from(slot),
        });
        if self.reprogram().is_err() {
            self.listeners.pop();
            return libc::ENOSPC;
        }
        0
    }

    fn unlisten(&mut self, slot: u8, service_id: u64) -> libc::c_int {
        let before = self.listeners.len();
        self.listeners
            .retain(|l| !(l.service_id == service_id && l.slot == u16::from(slot)));
        if self.listeners.len() != before {
            let _ = self.reprogram();
        }
        0
    }

    /// Client `i` is gone: its slot and listeners come back to the keeper.
    fn release(&mut self, i: usize) {
        let c = self.clients.swap_remove(i);
        let slot = usize::from(c.slot);
        if let Some(t) = self.taken.get_mut(slot) {
            *t = false;
        }
        self.listeners.retain(|l| usize::from(l.slot) != slot);
        let _ = self.reprogram();
    }

    /// Reads every datagram waiting on slot `s`'s socket (slot 0, or a slot no process
    /// holds): CM MADs are answered, the rest dropped and counted (each in `dropped`, and by
    /// its reason in the device's counters, or, for a QP1 datagram too short for a MAD,
    /// received there: rxe's QP1 receives it and ib_mad drops it).
    fn drain(&mut self, s: usize) {
        let Some(sock) = self.socks.get(s) else {
            return;
        };
        let fd = sock.as_raw_fd();
        loop {
            // SAFETY: sockaddr_storage is plain data; all zero is valid.
            let mut from: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
            let mut flen = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            // SAFETY: `buf` and `from` are writable for the lengths given.
            let n = unsafe {
                libc::recvfrom(
                    fd,
                    self.buf.as_mut_ptr().cast(),
                    self.buf.len(),
                    libc::MSG_DONTWAIT,
                    (&raw mut from).cast(),
                    &mut flen,
                )
            };
            if n < 0 {
                return;
            }
            // A MAD naming a comm ID of a process gone (its slot's socket) is answered as
            // slot 0's are: the kernel CM answers a DREQ for a connection it no longer has
            // with a DREP and a REP with REJ (invalid comm ID), so that the peer of a killed
            // process is told at once instead of retrying until its CM timeout.
            let outcome = match super::sockaddr::socket_addr_from_storage(&from) {
                Some(src) => self.on_slot0(src, n as usize),
                None => Slot0::Dropped(DropReason::BadFraming),
            };
            match outcome {
                Slot0::Answered => self.counters.rcvd_pkts += 1,
                Slot0::Dropped(why) => {
                    self.counters.count_drop(why);
                    self.dropped += 1;
                }
                Slot0::NoMad => {
                    self.counters.rcvd_pkts += 1;
                    self.dropped += 1;
                }
            }
        }
    }

    /// A datagram for slot 0 or a slot no process holds from `src` (`len` bytes in `buf`):
    /// a CM MAD goes to slot 0's engine.
    fn on_slot0(&mut self, src: SocketAddr, len: usize) -> Slot0 {
        let Some(data) = self.buf.get(..len) else {
            return Slot0::Dropped(DropReason::Truncated);
        };
        let p = match RocePacket::parse(data) {
            Ok(p) => p,
            Err(e) => return Slot0::Dropped(DropReason::from(e)),
        };
        // rxe's checks before its ICRC check: the QP exists and takes the opcode's
        // transport (QP1 is UD).
        if p.repr.bth.dest_qpn != 1 {
            return Slot0::Dropped(DropReason::UnknownQp);
        }
        if p.repr.deth.is_none() {
            return Slot0::Dropped(DropReason::WrongQpType);
        }
        let ip = match (src.ip(), self.ip) {
            (IpAddr::V4(s), IpAddr::V4(d)) => IcrcIp::V4 {
                src: s,
                dst: d,
                ident: 0,
                src_port: src.port(),
                dst_port: ROCE_V2_UDP_PORT,
            },
            (IpAddr::V6(s), IpAddr::V6(d)) => IcrcIp::V6 {
                src: s,
                dst: d,
                src_port: src.port(),
                dst_port: ROCE_V2_UDP_PORT,
            },
            _ => return Slot0::Dropped(DropReason::BadFraming),
        };
        // Over IPv4 the ICRC covers the IP ID the socket does not show (as the device's
        // receive path, which solves for it).
        if !p.icrc_ok(&ip) && solve_ipv4_ident(&ip, p.body, p.icrc).is_none() {
            return Slot0::Dropped(DropReason::IcrcMismatch);
        }
        let Some(mad) = p.payload.get(..MAD_LEN) else {
            return Slot0::NoMad;
        };
        let now = self.clock.now();
        self.cm.handle_mad(now, src.ip(), mad);
        Slot0::Answered
    }

    /// Sends what slot 0's CM answers; its events (none the keeper acts on) are dropped.
    fn flush_cm(&mut self) {
        while self.cm.poll_event().is_some() {}
        let mut sock = None;
        while let Some(m) = self.cm.poll_mad() {
            // From QP1's port, as every QP1 MAD of rxe and of softroce's processes. The
            // socket joins their SO_REUSEPORT group on that port, where the kernel could
            // hand it an ICMP error meant for a process's QP1 socket (the CM's quick
            // "unreachable"): so it exists only for these sends.
            if sock.is_none() {
                sock = super::sock::new_send_socket(self.ip, super::qp1::SOURCE_PORT, false).ok();
            }
            // Counted as a device counts what it sends: before it leaves (so that a peer
            // that sees the answer sees it counted), with `send_err` when it could not.
            self.counters.sent_pkts += 1;
            self.publish();
            let mut out = [0u8; super::qp1::DATAGRAM_LEN];
            let sent = match (
                &sock,
                super::qp1::datagram(self.ip, super::qp1::SOURCE_PORT, &m, &mut out),
            ) {
                (Some(s), Some(n)) => {
                    let to = SockAddr::from(SocketAddr::new(m.dst, ROCE_V2_UDP_PORT));
                    s.send_to(&out[..n], &to).is_ok()
                }
                _ => false,
            };
            if !sent {
                self.counters.send_err += 1;
            }
        }
    }
}

/// What the keeper did with a datagram for slot 0 or a slot no process holds.
enum Slot0 {
    /// A CM MAD to QP1, handed to slot 0's CM (received, as rxe's QP1 receives it).
    Answered,
    /// Dropped before rxe would count it received, for this reason.
    Dropped(DropReason),
    /// A well-formed datagram to QP1 too short for a MAD: received, then dropped (by
    /// ib_mad, on rxe's host).
    NoMad,
}

fn pollfd(fd: RawFd) -> libc::pollfd {
    libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    }
}

/// Sends the greeting: `slot` and, attached, `fds`: the slot's socket and the counter
/// pages' memfd.
fn send_slot(fd: RawFd, slot: u8, fds: [RawFd; 2]) -> io::Result<()> {
    let mut rec = [0u8; REPLY_LEN];
    rec[0] = OP_SLOT;
    rec[1] = slot;
    let mut iov = libc::iovec {
        iov_base: rec.as_mut_ptr().cast(),
        iov_len: rec.len(),
    };
    let mut cbuf = [0u64; 8];
    let fds_len = std::mem::size_of_val(&fds) as u32;
    // SAFETY: msghdr is plain data; all zero is valid. The CMSG_* calls write one
    // SCM_RIGHTS header and two descriptors inside `cbuf` (CMSG_SPACE(8) = 24 < 64 bytes).
    let n = unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &raw mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cbuf.as_mut_ptr().cast();
        msg.msg_controllen = libc::CMSG_SPACE(fds_len) as usize;
        let c = libc::CMSG_FIRSTHDR(&raw const msg);
        if c.is_null() {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        (*c).cmsg_level = libc::SOL_SOCKET;
        (*c).cmsg_type = libc::SCM_RIGHTS;
        (*c).cmsg_len = libc::CMSG_LEN(fds_len) as usize;
        let data = libc::CMSG_DATA(c).cast::<RawFd>();
        for (i, f) in fds.into_iter().enumerate() {
            data.add(i).write_unaligned(f);
        }
        libc::sendmsg(fd, &raw const msg, libc::MSG_NOSIGNAL)
    };
    if n == rec.len() as isize {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}
