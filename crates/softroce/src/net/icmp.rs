//! ICMP errors on a device's send socket: what the network says about a peer address that
//! has no RoCE device (ICMP port unreachable) or no route (host / network unreachable).
//!
//! An unconnected UDP socket ignores ICMP errors unless `IP_RECVERR` (`IPV6_RECVERR`) is set;
//! with it, Linux queues each error on the socket's error queue, read with
//! `recvmsg(MSG_ERRQUEUE)`: the datagram's destination in `msg_name` and a
//! `sock_extended_err` in a control message (Linux `net/ipv4/ip_sockglue.c`, `ip_icmp_error`,
//! `ip_recv_error`; `include/uapi/linux/errqueue.h`). It also sets the socket's pending error,
//! which the next send on that socket returns instead of sending (`sock_alloc_send_pskb` ->
//! `sock_error`): a sender must retry once when a send fails with one of the
//! [`is_icmp_errno`] values.

use super::sockaddr::socket_addr_from_storage;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsRawFd;

/// What one ICMP error said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IcmpError {
    /// Where the datagram that caused it was going.
    pub dst: SocketAddr,
    /// The error, as errno: ECONNREFUSED (port unreachable), EHOSTUNREACH, ENETUNREACH, ...
    pub errno: i32,
}

/// `sock_extended_err` origins (`include/uapi/linux/errqueue.h`).
const SO_EE_ORIGIN_ICMP: u8 = 2;
const SO_EE_ORIGIN_ICMP6: u8 = 3;

/// The layout of `struct sock_extended_err` (`include/uapi/linux/errqueue.h`).
#[repr(C)]
#[derive(Clone, Copy)]
struct SockExtendedErr {
    ee_errno: u32,
    ee_origin: u8,
    ee_type: u8,
    ee_code: u8,
    ee_pad: u8,
    ee_info: u32,
    ee_data: u32,
}

/// Asks the kernel to queue ICMP errors on `sock` (`IP_RECVERR` or `IPV6_RECVERR` by the
/// family of `ip`, the socket's address). Errors: those of `setsockopt`.
pub(super) fn set_recv_err(sock: &impl AsRawFd, ip: IpAddr) -> io::Result<()> {
    let (level, name) = match ip {
        IpAddr::V4(_) => (libc::IPPROTO_IP, libc::IP_RECVERR),
        IpAddr::V6(_) => (libc::IPPROTO_IPV6, libc::IPV6_RECVERR),
    };
    let one: libc::c_int = 1;
    // SAFETY: `sock` is open for the call; the value points at a live `c_int` of the size
    // passed.
    let rc = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            level,
            name,
            (&raw const one).cast::<libc::c_void>(),
            core::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// True for the errnos an ICMP error leaves pending on a socket (the next send fails with it
/// once, having sent nothing).
pub(super) fn is_icmp_errno(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ECONNREFUSED | libc::EHOSTUNREACH | libc::ENETUNREACH | libc::EHOSTDOWN)
    )
}

/// Takes every ICMP error queued on `sock` (at most `max`), without blocking.
pub(super) fn drain(sock: &impl AsRawFd, max: usize) -> Vec<IcmpError> {
    let mut out = Vec::new();
    while out.len() < max {
        match recv_error(sock) {
            Ok(Some(e)) => out.push(e),
            Ok(None) => continue,
            Err(_) => break,
        }
    }
    out
}

/// One entry of the error queue: `Ok(None)` for an entry that is not an ICMP error (skipped),
/// `Err(WouldBlock)` once the queue is empty.
fn recv_error(sock: &impl AsRawFd) -> io::Result<Option<IcmpError>> {
    let mut name: libc::sockaddr_storage =
        // SAFETY: sockaddr_storage is plain old data; all zeroes is a valid value.
        unsafe { core::mem::zeroed() };
    let mut data = [0u8; 64];
    // Room for one IP_RECVERR control message (a sock_extended_err and the offender's
    // address) with its header, 8-byte aligned.
    let mut control = [0u64; 16];
    let mut iov = libc::iovec {
        iov_base: data.as_mut_ptr().cast(),
        iov_len: data.len(),
    };
    // SAFETY: msghdr is plain old data; the fields that matter are set below.
    let mut msg: libc::msghdr = unsafe { core::mem::zeroed() };
    msg.msg_name = (&raw mut name).cast();
    msg.msg_namelen = core::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    msg.msg_iov = &raw mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = core::mem::size_of_val(&control);
    // SAFETY: every pointer in `msg` points at a live local buffer of the length given,
    // which outlives the call; the kernel writes within those lengths.
    let n = unsafe {
        libc::recvmsg(
            sock.as_raw_fd(),
            &raw mut msg,
            libc::MSG_ERRQUEUE | libc::MSG_DONTWAIT,
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let Some(dst) = socket_addr_from_storage(&name) else {
        return Ok(None);
    };
    // SAFETY: `msg` was filled by recvmsg; CMSG_FIRSTHDR / CMSG_NXTHDR walk the control
    // buffer within msg_controllen, and CMSG_DATA points inside the header it is given.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&raw const msg);
        while !c.is_null() {
            let h = &*c;
            let ours = (h.cmsg_level == libc::IPPROTO_IP && h.cmsg_type == libc::IP_RECVERR)
                || (h.cmsg_level == libc::IPPROTO_IPV6 && h.cmsg_type == libc::IPV6_RECVERR);
            let len_needed = libc::CMSG_LEN(core::mem::size_of::<SockExtendedErr>() as u32);
            if ours && h.cmsg_len as usize >= len_needed as usize {
                let ee = libc::CMSG_DATA(c)
                    .cast::<SockExtendedErr>()
                    .read_unaligned();
                if matches!(ee.ee_origin, SO_EE_ORIGIN_ICMP | SO_EE_ORIGIN_ICMP6) {
                    return Ok(Some(IcmpError {
                        dst,
                        errno: i32::try_from(ee.ee_errno).unwrap_or(libc::EIO),
                    }));
                }
            }
            c = libc::CMSG_NXTHDR(&raw const msg, c);
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, UdpSocket};

    // A datagram to a loopback port nobody listens on comes back as ICMP port unreachable:
    // with IP_RECVERR the next send on the socket fails once with ECONNREFUSED, sending
    // nothing, and the error queue holds the error with its destination; once it is
    // drained, sends go.
    #[test]
    fn port_unreachable_is_queued_with_its_destination() {
        let ip = IpAddr::V4(Ipv4Addr::new(127, 0, 94, 1));
        let s = UdpSocket::bind((ip, 0)).unwrap();
        set_recv_err(&s, ip).unwrap();
        // A port that was just free: bind it, note it, close it.
        let dead = UdpSocket::bind((Ipv4Addr::new(127, 0, 94, 2), 0))
            .unwrap()
            .local_addr()
            .unwrap();
        s.send_to(b"hello", dead).unwrap();
        // Wait for the error as an event (POLLERR), with a deadline only for a failing run.
        let mut pfd = libc::pollfd {
            fd: s.as_raw_fd(),
            events: 0,
            revents: 0,
        };
        // SAFETY: one live pollfd.
        let ready = unsafe { libc::poll(&raw mut pfd, 1, 10_000) };
        assert_eq!(ready, 1, "no ICMP error within 10 s");
        let live = UdpSocket::bind((Ipv4Addr::new(127, 0, 94, 3), 0)).unwrap();
        let to = live.local_addr().unwrap();
        let e = s.send_to(b"lost", to).unwrap_err();
        assert!(is_icmp_errno(&e), "{e}");
        assert_eq!(
            drain(&s, 8),
            [IcmpError {
                dst: dead,
                errno: libc::ECONNREFUSED
            }]
        );
        assert_eq!(drain(&s, 8), []);
        s.send_to(b"again", to).unwrap();
        let mut buf = [0u8; 16];
        let (n, _) = live.recv_from(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"again");
    }
}
