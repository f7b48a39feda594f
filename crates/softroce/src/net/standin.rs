//! A process's stand-in: a small child process that ends the process's CM connections when
//! the process is gone, as the kernel's CM does for a process that exits or is killed
//! (closing its rdma_cm file destroys its ids, kernel `cm.c` `cm_destroy_id`: a DREQ for an
//! established connection, the DREP a received DREQ waits for). softroce's CM runs inside
//! the process (crates/softroce-rdmacm), so without this a killed server leaves its clients
//! waiting for a message that never comes.
//!
//! Shape: [`StandIn::start`] makes, before anything else, a UDP send socket set up as the
//! device's (bound only once the process is gone, to the device's address and QP1's source
//! port 0xD872: bound earlier it would join the device's `SO_REUSEPORT` group and could take
//! the ICMP errors meant for QP1's socket), a pipe, and a table of [`MAX_ENTRIES`] slots, then clones a child that closes every other
//! file descriptor, leaves the terminal's session (so that the Ctrl-C that kills the process
//! does not reach it) and waits on the pipe. The frontend [`arm`](StandIn::arm)s a
//! connection with the MAD that ends it ([`crate::cm::CmEngine::exit_mad`]): the whole
//! datagram (BTH, DETH, MAD, ICRC) is built here and written to the pipe as one record of
//! [`RECORD_LEN`] bytes (atomic: at most `PIPE_BUF`), and [`disarm`](StandIn::disarm)s it
//! when the connection ends while the process lives. When the pipe reaches end of file (the
//! process exited, however: SIGKILL included) or the child's parent changes, the child sends
//! every armed datagram once and exits, as `cm_destroy_id` sends a dead process's DREQ (or
//! DREP) once and cancels its retries. A process that ended its connections itself leaves
//! nothing armed, and its stand-in exits silently.
//!
//! The child runs between `clone` and `_exit` only system calls that are async-signal-safe
//! (poll, read, bind, sendto, getppid, close) on memory allocated before the clone: it
//! is a copy of a multi-threaded process whose other threads, and their locks, did not come
//! along. It is cloned without an exit signal, so a program's `wait()` never sees it.
//!
//! Errors: arming fails quietly when the child is gone or the pipe is full (the connection
//! is then ended only if the process ends it); [`StandIn::start`] returns the system
//! call's error.

use super::qp1::{DATAGRAM_LEN, SOURCE_PORT};
use super::sock::unbound_send_socket;
use crate::cm::MadTransmit;
use crate::wire::ROCE_V2_UDP_PORT;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// Connections a stand-in can hold at once (a process with more has the later ones ended
/// only by itself).
pub const MAX_ENTRIES: usize = 512;

/// A `sockaddr_in6`, the larger of the two address shapes.
const ADDR_LEN: usize = 28;
/// One record on the pipe: op (1), key (4), address length (1), address, datagram.
pub const RECORD_LEN: usize = 1 + 4 + 1 + ADDR_LEN + DATAGRAM_LEN;
const OP_ARM: u8 = 1;
const OP_DISARM: u8 = 2;

/// The stand-in of one device of this process. Dropping it closes the pipe, which the
/// child takes as the end of the process: drop it only when the process ends (or after
/// disarming everything).
#[derive(Debug)]
pub struct StandIn {
    pipe: OwnedFd,
    local: IpAddr,
    child: libc::pid_t,
}

/// One slot of the child's table.
#[derive(Clone, Copy)]
struct Entry {
    key: u32,
    used: bool,
    addr_len: u8,
    addr: [u8; ADDR_LEN],
    datagram: [u8; DATAGRAM_LEN],
}

const EMPTY: Entry = Entry {
    key: 0,
    used: false,
    addr_len: 0,
    addr: [0; ADDR_LEN],
    datagram: [0; DATAGRAM_LEN],
};

impl StandIn {
    /// Starts the stand-in of the device at `local`.
    /// Errors: those of `socket`/`bind` (the device's QP1 send port), `pipe2` and `clone`.
    pub fn start(local: IpAddr) -> io::Result<StandIn> {
        // Bound only by the child, once this process is gone: bound now, it would join the
        // device's SO_REUSEPORT group on 0xD872 and could take the ICMP errors meant for
        // the device's QP1 socket (the kernel picks one socket of the group for them).
        let sock = unbound_send_socket(local, false)?;
        let bind_to = socket2::SockAddr::from(SocketAddr::new(local, SOURCE_PORT));
        let mut bind_addr = [0u8; ADDR_LEN];
        let bind_len = (bind_to.len() as usize).min(ADDR_LEN);
        // SAFETY: `bind_to` holds `bind_len` initialised bytes of a sockaddr.
        bind_addr[..bind_len].copy_from_slice(unsafe {
            std::slice::from_raw_parts(bind_to.as_ptr().cast::<u8>(), bind_len)
        });
        let mut fds = [0 as RawFd; 2];
        // SAFETY: `fds` has room for the two descriptors pipe2 writes.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: pipe2 just made these two descriptors; each is owned once.
        let (rd, wr) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        // The child's memory, allocated before the clone (the child may not allocate).
        let mut table = vec![EMPTY; MAX_ENTRIES];
        let mut buf = vec![0u8; RECORD_LEN * 8];
        // SAFETY: getpid has no preconditions.
        let parent = unsafe { libc::getpid() };
        // Every signal blocked until the child has dropped the program's handlers.
        let blocked = super::fork::SignalsBlocked::new();
        // SAFETY: a fork-like clone (no CLONE_VM, no new stack: the child continues on a
        // copy of this stack) with no exit signal. The child runs only `child_main`, which
        // makes async-signal-safe system calls on memory allocated above and never returns.
        let pid = unsafe {
            libc::syscall(
                libc::SYS_clone,
                0 as libc::c_ulong,
                0usize,
                0usize,
                0usize,
                0usize,
            )
        };
        if pid < 0 {
            return Err(io::Error::last_os_error());
        }
        if pid == 0 {
            child_main(
                rd.as_raw_fd(),
                sock.as_raw_fd(),
                (&bind_addr, bind_len),
                parent,
                &mut table,
                &mut buf,
            );
        }
        drop(blocked);
        drop(rd);
        drop(sock);
        // SAFETY: the write end; O_NONBLOCK so that a stalled child never blocks the CM.
        unsafe {
            let fl = libc::fcntl(wr.as_raw_fd(), libc::F_GETFL);
            libc::fcntl(wr.as_raw_fd(), libc::F_SETFL, fl | libc::O_NONBLOCK);
        }
        Ok(StandIn {
            pipe: wr,
            local,
            child: pid as libc::pid_t,
        })
    }

    /// The child's process ID.
    pub fn pid(&self) -> libc::pid_t {
        self.child
    }

    /// Arms connection `key` (its local comm ID): once this process is gone, `mad` is sent
    /// to its peer from QP1. Arming a key again replaces its MAD. Errors: `EAGAIN` when the
    /// pipe is full, `EPIPE` when the child is gone, `EINVAL` for an address of another
    /// family than the device's.
    pub fn arm(&self, key: u32, mad: &MadTransmit) -> io::Result<()> {
        let mut rec = [0u8; RECORD_LEN];
        rec[0] = OP_ARM;
        rec[1..5].copy_from_slice(&key.to_be_bytes());
        let dst = SocketAddr::new(mad.dst, ROCE_V2_UDP_PORT);
        let sa = socket2::SockAddr::from(dst);
        let n = sa.len() as usize;
        if n > ADDR_LEN || mad.dst.is_ipv4() != self.local.is_ipv4() {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        rec[5] = n as u8;
        // SAFETY: `sa` holds `n` initialised bytes of a sockaddr.
        let bytes = unsafe { std::slice::from_raw_parts(sa.as_ptr().cast::<u8>(), n) };
        rec[6..6 + n].copy_from_slice(bytes);
        let at = 6 + ADDR_LEN;
        self.datagram(mad, &mut rec[at..at + DATAGRAM_LEN]);
        self.write(&rec)
    }

    /// Disarms connection `key` (it ended while this process lives). Errors as
    /// [`StandIn::arm`].
    pub fn disarm(&self, key: u32) -> io::Result<()> {
        let mut rec = [0u8; RECORD_LEN];
        rec[0] = OP_DISARM;
        rec[1..5].copy_from_slice(&key.to_be_bytes());
        self.write(&rec)
    }

    /// The UDP payload that carries `mad` from this device's QP1 to the peer's: UD SEND
    /// ONLY to QP 1, P_Key 0xFFFF, Q_Key 0x80010000 from QP 1, and the ICRC over the IP and
    /// UDP headers the stand-in's socket sends with (IPv4 ID 0, flow label 0).
    fn datagram(&self, mad: &MadTransmit, out: &mut [u8]) {
        // `arm` refused mixed families before.
        let _ = super::qp1::datagram(self.local, SOURCE_PORT, mad, out);
    }

    fn write(&self, rec: &[u8; RECORD_LEN]) -> io::Result<()> {
        // SAFETY: the pipe's write end; `rec` is RECORD_LEN readable bytes.
        let n = unsafe { libc::write(self.pipe.as_raw_fd(), rec.as_ptr().cast(), RECORD_LEN) };
        match n {
            n if n == RECORD_LEN as isize => Ok(()),
            n if n < 0 => Err(io::Error::last_os_error()),
            // PIPE_BUF makes a write of RECORD_LEN bytes all or nothing.
            _ => Err(io::Error::from_raw_os_error(libc::EIO)),
        }
    }
}

/// The stand-in: see the module documentation. Never returns.
fn child_main(
    rd: RawFd,
    sock: RawFd,
    bind_to: (&[u8; ADDR_LEN], usize),
    parent: libc::pid_t,
    table: &mut [Entry],
    buf: &mut [u8],
) -> ! {
    // SAFETY (the whole function): async-signal-safe system calls on descriptors and memory
    // this process owns; no allocation, no lock, no unwinding.
    unsafe {
        // Keep only the pipe (as 0) and the socket (as 1).
        let s2 = libc::fcntl(sock, libc::F_DUPFD, 3);
        let r2 = libc::fcntl(rd, libc::F_DUPFD, 3);
        if s2 < 0 || r2 < 0 || libc::dup2(r2, 0) < 0 || libc::dup2(s2, 1) < 0 {
            libc::_exit(1);
        }
        if libc::syscall(libc::SYS_close_range, 2u32, u32::MAX, 0u32) != 0 {
            for fd in 2..4096 {
                libc::close(fd);
            }
        }
        // Out of the terminal's process group: the Ctrl-C (SIGINT), hangup or quit that
        // ends the process must leave its stand-in running. None of the program's signal
        // handlers comes along (`child_signal_defaults`): SIGTERM ends the stand-in.
        libc::setsid();
        super::fork::child_signal_defaults(&[
            libc::SIGINT,
            libc::SIGHUP,
            libc::SIGQUIT,
            libc::SIGPIPE,
        ]);
        let (rd, sock) = (0, 1);
        loop {
            let mut pfd = libc::pollfd {
                fd: rd,
                events: libc::POLLIN,
                revents: 0,
            };
            let r = libc::poll(&mut pfd, 1, 200);
            let mut gone = libc::getppid() != parent;
            if r > 0 {
                let n = libc::read(rd, buf.as_mut_ptr().cast(), buf.len());
                if n == 0 {
                    gone = true;
                } else if n > 0 {
                    let mut at = 0usize;
                    while at + RECORD_LEN <= n as usize {
                        if let Some(rec) = buf.get(at..at + RECORD_LEN) {
                            apply(table, rec);
                        }
                        at += RECORD_LEN;
                    }
                } else if *libc::__errno_location() != libc::EINTR {
                    gone = true;
                }
            }
            if gone {
                break;
            }
        }
        // The process is gone, and its QP1 port with it: take that port to send from.
        if libc::bind(
            sock,
            bind_to.0.as_ptr().cast(),
            bind_to.1 as libc::socklen_t,
        ) != 0
        {
            libc::_exit(1);
        }
        // Once each, as the kernel: cm_destroy_id sends an established connection's DREQ
        // and cancels its retries at once (state DREQ_SENT -> TIMEWAIT).
        for e in table.iter().filter(|e| e.used) {
            libc::sendto(
                sock,
                e.datagram.as_ptr().cast(),
                DATAGRAM_LEN,
                0,
                e.addr.as_ptr().cast(),
                libc::socklen_t::from(e.addr_len),
            );
        }
        libc::_exit(0)
    }
}

/// Applies one record to the table (no allocation, no panic: slices are checked).
fn apply(table: &mut [Entry], rec: &[u8]) {
    let (Some(&op), Some(k), Some(&alen)) = (rec.first(), rec.get(1..5), rec.get(5)) else {
        return;
    };
    let key = u32::from_be_bytes([k[0], k[1], k[2], k[3]]);
    let slot = table.iter().position(|e| e.used && e.key == key);
    match op {
        OP_ARM => {
            let Some(i) = slot.or_else(|| table.iter().position(|e| !e.used)) else {
                return;
            };
            let (Some(addr), Some(dg)) = (
                rec.get(6..6 + ADDR_LEN),
                rec.get(6 + ADDR_LEN..6 + ADDR_LEN + DATAGRAM_LEN),
            ) else {
                return;
            };
            if let Some(e) = table.get_mut(i) {
                e.used = true;
                e.key = key;
                e.addr_len = alen.min(ADDR_LEN as u8);
                e.addr.copy_from_slice(addr);
                e.datagram.copy_from_slice(dg);
            }
        }
        OP_DISARM => {
            if let Some(e) = slot.and_then(|i| table.get_mut(i)) {
                e.used = false;
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{IcrcIp, RocePacket, mad::MAD_LEN};
    use std::time::Duration;

    /// The `/proc/<pid>/status` field `name` (a hexadecimal signal mask) of process `pid`,
    /// with its `State` line; `None` once the process is reaped. Signals 32 and 33 are left
    /// out: glibc keeps them for its threads and refuses to change them.
    fn status(pid: libc::pid_t, name: &str) -> Option<(u64, String)> {
        let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let field = |n: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(n).map(|v| v.trim().to_string()))
        };
        let glibc = (1u64 << 31) | (1u64 << 32);
        let mask = u64::from_str_radix(&field(name)?, 16).ok()? & !glibc;
        Some((mask, field("State:")?))
    }

    // The stand-in is a copy of a program whose libraries may catch signals (libinfinipath,
    // loaded by libfabric, catches SIGTERM and calls exit, whose handlers in the copy wait
    // for a lock that a thread of the program held at the clone): a stand-in that kept
    // them never ended. It must catch nothing, ignore only the four signals it documents,
    // and die of SIGTERM.
    #[test]
    fn the_stand_in_keeps_none_of_the_programs_signal_handlers() {
        extern "C" fn caught(_: libc::c_int) {}
        // SAFETY: installs a handler that does nothing for SIGUSR2, which no test sends.
        unsafe {
            libc::signal(libc::SIGUSR2, caught as *const () as libc::sighandler_t);
        }
        let s = StandIn::start(IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 23, 31))).expect("start");
        let pid = s.pid();
        let bit = |sig: libc::c_int| 1u64 << (sig - 1);
        let ignored =
            bit(libc::SIGINT) | bit(libc::SIGHUP) | bit(libc::SIGQUIT) | bit(libc::SIGPIPE);
        // The child sets its signals up as it starts; the deadline only ends a failing run.
        // It waits for the whole final state, not for `SigIgn` alone: a program started in
        // the background under nohup already ignores exactly these four signals, so the
        // copy matches `SigIgn` before it has reset its handlers (seen in a soak started
        // with `nohup ... &`: caught 0xc40, the test's SIGUSR2 and Rust's SIGSEGV/SIGBUS).
        let end = std::time::Instant::now() + Duration::from_secs(20);
        let masks = || ["SigIgn:", "SigCgt:", "SigBlk:"].map(|f| status(pid, f).map(|(m, _)| m));
        while masks() != [Some(ignored), Some(0), Some(0)] {
            assert!(
                std::time::Instant::now() < end,
                "ignored, caught, blocked: {:x?}, want [{ignored:#x}, 0, 0]",
                masks()
            );
            std::thread::yield_now();
        }
        // SAFETY: signals the stand-in child made above.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
        while status(pid, "SigIgn:").is_some_and(|(_, state)| !state.starts_with('Z')) {
            assert!(
                std::time::Instant::now() < end,
                "the stand-in outlived SIGTERM"
            );
            std::thread::yield_now();
        }
        // SAFETY: restores SIGUSR2's default action.
        unsafe {
            libc::signal(libc::SIGUSR2, libc::SIG_DFL);
        }
        drop(s);
    }

    /// A stand-in whose process is gone (here: its pipe closed) sends what was armed and
    /// not disarmed, each datagram a QP1 MAD that parses with a good ICRC, from QP1's port.
    #[test]
    fn the_stand_in_sends_what_is_armed_once_its_pipe_closes() {
        let local = IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 23, 21));
        let peer_ip = std::net::Ipv4Addr::new(127, 0, 23, 22);
        let peer = std::net::UdpSocket::bind((peer_ip, ROCE_V2_UDP_PORT)).expect("bind peer");
        peer.set_read_timeout(Some(Duration::from_secs(20)))
            .expect("timeout");
        let s = StandIn::start(local).expect("start");
        let mad = |tag: u8| MadTransmit {
            dst: IpAddr::V4(peer_ip),
            mad: Box::new([tag; MAD_LEN]),
        };
        s.arm(7, &mad(0x71)).expect("arm 7");
        s.arm(8, &mad(0x81)).expect("arm 8");
        s.arm(7, &mad(0x72)).expect("re-arm 7");
        s.disarm(8).expect("disarm 8");
        let pid = s.pid();
        drop(s);
        // The child sends before it exits: once it is reaped, all it sent is queued here.
        let mut st = 0;
        // SAFETY: waits for this process's own child (cloned without an exit signal: __WALL).
        let reaped = unsafe { libc::waitpid(pid, &mut st, libc::__WALL) };
        assert_eq!(reaped, pid, "waitpid: {}", std::io::Error::last_os_error());
        assert!(
            libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 0,
            "status {st:#x}"
        );
        let mut buf = [0u8; 512];
        let (n, from) = peer.recv_from(&mut buf).expect("a datagram within 20 s");
        assert_eq!((n, from.port()), (DATAGRAM_LEN, SOURCE_PORT));
        let p = RocePacket::parse(&buf[..n]).expect("parses");
        let ip = IcrcIp::V4 {
            src: std::net::Ipv4Addr::new(127, 0, 23, 21),
            dst: peer_ip,
            ident: 0,
            src_port: SOURCE_PORT,
            dst_port: ROCE_V2_UDP_PORT,
        };
        assert!(p.icrc_ok(&ip), "ICRC");
        assert_eq!(p.payload, &[0x72; MAD_LEN][..], "connection 7's last MAD");
        // Sent once, as the kernel's cm_destroy_id sends it, and nothing for connection 8.
        peer.set_nonblocking(true).expect("nonblocking");
        let more = peer.recv_from(&mut buf);
        assert!(
            more.as_ref()
                .is_err_and(|e| e.kind() == std::io::ErrorKind::WouldBlock),
            "a second datagram: {more:?}"
        );
    }
}
