//! Batched UDP system calls for the data path: UDP GSO (`UDP_SEGMENT`) and `sendmmsg` on
//! send, UDP GRO (`UDP_GRO`) and `recvmmsg` on receive.
//!
//! Layer: net (sockets only; no protocol knowledge beyond "a datagram is a byte slice", or
//! parts of one: [`TxPart`], engine bytes or an address and length in registered memory
//! that go to the kernel as an iovec without ever being sliced here).
//! Each call is one system call; an error is the kernel's (`EINVAL`/`EIO`/`ENOPROTOOPT` on a
//! kernel without the feature, which callers answer by falling back to plain calls).
//!
//! Why: on loopback the kernel's per-datagram cost (≈ 1.6 µs of sender CPU per 4 KiB
//! datagram) dominates; one GSO send carries up to 64 segments, one GRO receive returns them
//! in one buffer (docs/performance.md#measured-costs-on-this-machine-class: 2.6 GB/s plain, 9.4 GB/s GSO + GRO).
//!
//! Source: Linux `include/uapi/linux/udp.h` (`UDP_SEGMENT` = 103, `UDP_GRO` = 104),
//! `net/ipv4/udp.c` (`udp_send_skb`: at most `UDP_MAX_SEGMENTS` segments, each `gso_size`
//! bytes but the last; `udp_cmsg_recv`: the receive cmsg carries the segment size as an
//! `int`), `net/ipv4/udp_offload.c`.
//!
//! Allocation: [`RecvBatch`] owns its buffers, allocated once; sending allocates nothing.
//! `unsafe` here is the `libc` calls that neither std, socket2 nor rustix wrap (a cmsg of
//! our choice, `recvmmsg`); each has a `// SAFETY:` comment.

use crate::transport::TxPart;
use std::io;
use std::mem::{size_of, zeroed};
use std::net::SocketAddr;
use std::os::fd::RawFd;

/// Most segments one GSO send may carry (`UDP_MAX_SEGMENTS` in Linux ≥ 4.18; newer kernels
/// allow 128, 64 works on all).
pub const GSO_MAX_SEGMENTS: usize = 64;
/// Most UDP payload bytes one GSO send may carry: the IPv4 total-length limit less the IPv4
/// and UDP headers (IPv6 allows 8 more; we use the smaller for both).
pub const GSO_MAX_BYTES: usize = 65_535 - 20 - 8;

/// Room for up to three cmsgs carrying an `int` or a `u16` each (UDP_SEGMENT, then the
/// traffic class and the hop limit), aligned as the kernel wants.
#[repr(C, align(8))]
struct CmsgBuf([u8; CMSG_BUF_BYTES]);

/// Size of a [`CmsgBuf`]: three `CMSG_SPACE(sizeof(int))` of 24 bytes on 64-bit Linux.
const CMSG_BUF_BYTES: usize = 96;

/// IP header fields given to the kernel per datagram as cmsgs, for a socket that serves
/// several QPs or address handles: `IP_TOS` and `IP_TTL` on IPv4, `IPV6_TCLASS` and
/// `IPV6_HOPLIMIT` on IPv6. `None` leaves the socket's setting (TOS 0, the route's TTL; for
/// multicast, the socket's multicast TTL). Source: Linux `net/ipv4/ip_sockglue.c`
/// `ip_cmsg_send` (TTL 1..=255, TOS an `int` 0..=255), `net/ipv6/datagram.c`
/// `ip6_datagram_send_ctl`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IpCmsg {
    /// The socket is IPv6.
    pub v6: bool,
    /// IPv4 TOS / IPv6 traffic class byte.
    pub traffic_class: Option<u8>,
    /// IPv4 TTL (1..=255; 0 is left out) / IPv6 hop limit.
    pub hop_limit: Option<u8>,
}

impl IpCmsg {
    /// The (level, type, value) of each cmsg these fields need.
    fn cmsgs(&self) -> impl Iterator<Item = (libc::c_int, libc::c_int, libc::c_int)> {
        let (level, tclass, hops) = if self.v6 {
            (libc::IPPROTO_IPV6, libc::IPV6_TCLASS, libc::IPV6_HOPLIMIT)
        } else {
            (libc::IPPROTO_IP, libc::IP_TOS, libc::IP_TTL)
        };
        let hop_limit = self.hop_limit.filter(|h| self.v6 || *h != 0);
        let t = self
            .traffic_class
            .map(|v| (level, tclass, libc::c_int::from(v)));
        let h = hop_limit.map(|v| (level, hops, libc::c_int::from(v)));
        t.into_iter().chain(h)
    }
}

fn sockaddr_of(a: &SocketAddr) -> socket2::SockAddr {
    socket2::SockAddr::from(*a)
}

/// An iovec over `p`, for a send (the kernel only reads it; bytes in registered memory go
/// as their address and length, with no slice formed over them).
fn iovec_of(p: TxPart<'_>) -> libc::iovec {
    let (ptr, len) = p.raw();
    libc::iovec {
        iov_base: ptr.cast_mut().cast(),
        iov_len: len,
    }
}

/// Points `msg`'s control data at `cbuf` and writes into it the cmsgs of one send: the
/// `UDP_SEGMENT` cmsg that makes the kernel cut the message every `segment_bytes` bytes
/// (when given), then those of `ip`. Leaves `msg` without control data when there are none.
///
/// # Safety
/// `cbuf` must stay alive and unmoved for as long as `msg` is used.
unsafe fn set_cmsgs(
    msg: &mut libc::msghdr,
    cbuf: &mut CmsgBuf,
    segment_bytes: Option<u16>,
    ip: IpCmsg,
) {
    let ints = ip.cmsgs().count();
    if segment_bytes.is_none() && ints == 0 {
        return;
    }
    // SAFETY: CMSG_SPACE only computes lengths.
    let (seg_space, int_space) = unsafe {
        (
            libc::CMSG_SPACE(size_of::<u16>() as u32) as usize,
            libc::CMSG_SPACE(size_of::<libc::c_int>() as u32) as usize,
        )
    };
    let total = usize::from(segment_bytes.is_some()) * seg_space + ints * int_space;
    debug_assert!(total <= CMSG_BUF_BYTES);
    msg.msg_control = cbuf.0.as_mut_ptr().cast();
    msg.msg_controllen = total;
    // SAFETY: `msg_control` is `cbuf`, at least `total` bytes long, and `msg_controllen` is
    // the space of exactly the cmsgs written, so CMSG_FIRSTHDR and each CMSG_NXTHDR before
    // the last return a header whose data lies in `cbuf`; CMSG_LEN only computes lengths.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(msg);
        if let Some(seg) = segment_bytes {
            (*c).cmsg_level = libc::SOL_UDP;
            (*c).cmsg_type = libc::UDP_SEGMENT;
            (*c).cmsg_len = libc::CMSG_LEN(size_of::<u16>() as u32) as usize;
            std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<u16>(), seg);
            c = libc::CMSG_NXTHDR(msg, c);
        }
        for (level, ty, value) in ip.cmsgs() {
            (*c).cmsg_level = level;
            (*c).cmsg_type = ty;
            (*c).cmsg_len = libc::CMSG_LEN(size_of::<libc::c_int>() as u32) as usize;
            std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<libc::c_int>(), value);
            c = libc::CMSG_NXTHDR(msg, c);
        }
    }
}

/// Sends `buf` to `dst` as UDP GSO: the kernel cuts it into datagrams of `segment_bytes`
/// (the last may be shorter). `buf.len()` ≤ [`GSO_MAX_BYTES`] and at most
/// [`GSO_MAX_SEGMENTS`] segments (the caller's invariant; the kernel answers `EINVAL`).
///
/// Every segment leaves with its own UDP and IP header; for IPv4 the kernel numbers the
/// IP Identification of segment `i` as the first one's plus `i` (0, 1, 2, … for softroce's
/// unconnected `IP_PMTUDISC_DO` sockets; measured on Linux 6.18 with software segmentation
/// on a veth), which the caller's ICRCs must cover.
///
/// Errors: the kernel's; `EIO`, `EINVAL` or `ENOPROTOOPT` when UDP GSO is not available.
pub fn send_gso(fd: RawFd, dst: &SocketAddr, buf: &[u8], segment_bytes: u16) -> io::Result<()> {
    send_gso_gather(
        fd,
        dst,
        &[TxPart::from(buf)],
        segment_bytes,
        IpCmsg::default(),
    )
}

/// As [`send_gso`], with the super-datagram gathered from `parts` (the kernel concatenates
/// them; segment boundaries fall every `segment_bytes` bytes whatever the parts), so no copy
/// is made here, and every segment sent with the IP fields `ip`. At most [`GSO_MAX_IOV`]
/// parts.
///
/// Errors: as [`send_gso`]; `EINVAL` for more than [`GSO_MAX_IOV`] parts.
pub fn send_gso_gather(
    fd: RawFd,
    dst: &SocketAddr,
    parts: &[TxPart<'_>],
    segment_bytes: u16,
    ip: IpCmsg,
) -> io::Result<()> {
    send_gathered(fd, dst, parts, Some(segment_bytes), ip)
}

/// Sends one datagram gathered from `parts` (at most [`GSO_MAX_IOV`]) with one `sendmsg`,
/// no copy here, with the IP fields `ip`. Errors: the kernel's; `EINVAL` for too many parts.
pub fn send_parts(fd: RawFd, dst: &SocketAddr, parts: &[TxPart<'_>], ip: IpCmsg) -> io::Result<()> {
    send_gathered(fd, dst, parts, None, ip)
}

/// `sendmsg` of `parts` to `dst`, with a UDP_SEGMENT cmsg when `segment_bytes` is given and
/// the cmsgs of `ip`.
fn send_gathered(
    fd: RawFd,
    dst: &SocketAddr,
    parts: &[TxPart<'_>],
    segment_bytes: Option<u16>,
    ip: IpCmsg,
) -> io::Result<()> {
    if parts.len() > GSO_MAX_IOV {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    let addr = sockaddr_of(dst);
    const EMPTY: libc::iovec = libc::iovec {
        iov_base: std::ptr::null_mut(),
        iov_len: 0,
    };
    // A few parts (a latency-bound send) on the stack; an array for all GSO_MAX_IOV would be
    // 4 KiB to zero per call.
    let mut few = [EMPTY; 16];
    let mut many = Vec::new();
    let iovs: &mut [libc::iovec] = if parts.len() <= few.len() {
        &mut few[..parts.len()]
    } else {
        many.resize(parts.len(), EMPTY);
        &mut many
    };
    for (iov, p) in iovs.iter_mut().zip(parts) {
        *iov = iovec_of(*p);
    }
    let mut cbuf = CmsgBuf([0; CMSG_BUF_BYTES]);
    // SAFETY: `msg` points at `addr`, the first `parts.len()` entries of `iovs` (over the
    // borrowed `parts`: engine bytes, or MR bytes the caller's device lock keeps registered,
    // `Transmit::parts`) and `cbuf`, all alive and unmoved for the call; the kernel only
    // reads them.
    let rc = unsafe {
        let mut msg: libc::msghdr = zeroed();
        msg.msg_name = addr.as_ptr() as *mut libc::c_void;
        msg.msg_namelen = addr.len();
        msg.msg_iov = iovs.as_mut_ptr();
        msg.msg_iovlen = parts.len();
        set_cmsgs(&mut msg, &mut cbuf, segment_bytes, ip);
        libc::sendmsg(fd, &raw const msg, 0)
    };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// One datagram or GSO super-datagram of a [`send_gathered_batch`]: `count` consecutive
/// parts from index `first`, cut by the kernel every `segment_bytes` bytes when given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GatheredMsg {
    /// Index of its first part.
    pub first: usize,
    /// Number of parts.
    pub count: usize,
    /// UDP GSO segment size, bytes (`None`: one plain datagram).
    pub segment_bytes: Option<u16>,
}

/// Sends `msgs` (each gathered from its run of `parts`, with its own `UDP_SEGMENT` cmsg
/// when it is a GSO super-datagram) to `dst` with one `sendmmsg`: a 64 KiB RDMA message at
/// path MTU 4096 is two GSO sends (its FIRST packet carries a RETH and so is 16 bytes longer
/// than the MIDDLE ones that follow, and GSO segments are equal but the last), and one
/// system call for both costs less sender CPU than two (16–17 µs against 18.6–18.8 µs per
/// 64 KiB message on loopback; docs/performance.md).
///
/// Every datagram goes with the IP fields `ip`.
///
/// Returns how many of `msgs` the kernel took (it stops at the first that fails); an error
/// only when the first failed: the kernel's, `EINVAL` for a part range outside `parts`.
pub fn send_gathered_batch(
    fd: RawFd,
    dst: &SocketAddr,
    parts: &[TxPart<'_>],
    msgs: &[GatheredMsg],
    ip: IpCmsg,
) -> io::Result<usize> {
    if msgs.iter().any(|m| {
        m.first
            .checked_add(m.count)
            .is_none_or(|end| end > parts.len())
    }) {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    let addr = sockaddr_of(dst);
    let iovs: Vec<libc::iovec> = parts.iter().map(|p| iovec_of(*p)).collect();
    let mut cmsgs: Vec<CmsgBuf> = msgs.iter().map(|_| CmsgBuf([0; CMSG_BUF_BYTES])).collect();
    // SAFETY: an all-zero `mmsghdr` is a valid value (null pointers, zero lengths).
    let mut hdrs: Vec<libc::mmsghdr> = msgs.iter().map(|_| unsafe { zeroed() }).collect();
    for ((h, m), c) in hdrs.iter_mut().zip(msgs).zip(cmsgs.iter_mut()) {
        let msg = &mut h.msg_hdr;
        msg.msg_name = addr.as_ptr() as *mut libc::c_void;
        msg.msg_namelen = addr.len();
        // In bounds: checked above.
        msg.msg_iov = iovs[m.first..].as_ptr().cast_mut();
        msg.msg_iovlen = m.count;
        // SAFETY: `c` is this message's own entry of `cmsgs`, alive and unmoved until the
        // call below returns.
        unsafe { set_cmsgs(msg, c, m.segment_bytes, ip) };
    }
    // SAFETY: every header points at `addr`, at its own run of `iovs` (over the borrowed
    // `parts`, in bounds as checked; MR parts are kept registered by the caller's device lock,
    // `Transmit::parts`) and at its own `cmsgs` entry, all alive and not moved
    // for the call; the kernel reads them and writes only each header's `msg_len`.
    let rc = unsafe { libc::sendmmsg(fd, hdrs.as_mut_ptr(), hdrs.len() as libc::c_uint, 0) };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc as usize)
    }
}

/// Most parts [`send_gso_gather`] takes: four per segment (headers, payload in the MR, pad,
/// ICRC) for [`GSO_MAX_SEGMENTS`] segments.
pub const GSO_MAX_IOV: usize = 4 * GSO_MAX_SEGMENTS;

/// Sends each of `datagrams` to `dst` with one `sendmmsg` call (up to 64 at a time; loops
/// for more). Returns how many were sent; stops at the first error, which it returns if
/// nothing was sent.
pub fn send_mmsg(fd: RawFd, dst: &SocketAddr, datagrams: &[&[u8]]) -> io::Result<usize> {
    send_mmsg_with(fd, dst, datagrams, IpCmsg::default())
}

/// As [`send_mmsg`], every datagram with the IP fields `ip`.
pub fn send_mmsg_with(
    fd: RawFd,
    dst: &SocketAddr,
    datagrams: &[&[u8]],
    ip: IpCmsg,
) -> io::Result<usize> {
    const MAX: usize = 64;
    let addr = sockaddr_of(dst);
    let mut sent = 0;
    while sent < datagrams.len() {
        let chunk = &datagrams[sent..datagrams.len().min(sent + MAX)];
        let mut iovs: [libc::iovec; MAX] = [libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        }; MAX];
        // SAFETY: an all-zero `mmsghdr` is a valid value (null pointers, zero lengths).
        let mut msgs: [libc::mmsghdr; MAX] = unsafe { zeroed() };
        // One control buffer serves every message: the kernel only reads it.
        let mut cbuf = CmsgBuf([0; CMSG_BUF_BYTES]);
        for (i, d) in chunk.iter().enumerate() {
            iovs[i] = iovec_of(TxPart::from(*d));
            msgs[i].msg_hdr.msg_name = addr.as_ptr() as *mut libc::c_void;
            msgs[i].msg_hdr.msg_namelen = addr.len();
            msgs[i].msg_hdr.msg_iov = &raw mut iovs[i];
            msgs[i].msg_hdr.msg_iovlen = 1;
            // SAFETY: `cbuf` lives, unmoved, until the `sendmmsg` below returns.
            unsafe { set_cmsgs(&mut msgs[i].msg_hdr, &mut cbuf, None, ip) };
        }
        // SAFETY: the first `chunk.len()` entries of `msgs` point at `addr` and at iovecs
        // over the borrowed `datagrams`, all alive for the call; the kernel reads them and
        // writes only `msg_len` of those entries.
        let rc = unsafe { libc::sendmmsg(fd, msgs.as_mut_ptr(), chunk.len() as libc::c_uint, 0) };
        if rc <= 0 {
            let e = io::Error::last_os_error();
            return if sent == 0 { Err(e) } else { Ok(sent) };
        }
        sent += rc as usize;
    }
    Ok(sent)
}

/// Asks the kernel to coalesce received datagrams of one flow into one buffer (`UDP_GRO`);
/// [`RecvBatch`] then reports the segment size of each. Errors: `ENOPROTOOPT` on kernels
/// before 5.0.
pub fn enable_gro(fd: RawFd) -> io::Result<()> {
    let on: libc::c_int = 1;
    // SAFETY: the option value is a live `c_int` on this frame and its exact size is passed.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_UDP,
            libc::UDP_GRO,
            (&raw const on).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Buffers for one `recvmmsg` of up to `slots` datagrams (each up to 64 KiB, the most a GRO
/// receive returns), and what the last call received.
pub struct RecvBatch {
    bufs: Vec<Vec<u8>>,
    addrs: Vec<libc::sockaddr_storage>,
    cmsgs: Vec<CmsgBuf>,
    iovs: Vec<libc::iovec>,
    msgs: Vec<libc::mmsghdr>,
    got: usize,
}

// SAFETY: the raw pointers inside `iovs`/`msgs` point only into this struct's own heap
// buffers, which move with it; nothing is shared with another thread.
unsafe impl Send for RecvBatch {}

impl core::fmt::Debug for RecvBatch {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("RecvBatch")
            .field("slots", &self.bufs.len())
            .field("got", &self.got)
            .finish()
    }
}

/// One received datagram (or GRO super-datagram) of a [`RecvBatch`].
#[derive(Debug, Clone, Copy)]
pub struct Received<'a> {
    /// Sender.
    pub src: Option<SocketAddr>,
    /// The bytes: one datagram, or with GRO several of `segment_bytes` each (the last may be
    /// shorter).
    pub data: &'a [u8],
    /// The GRO segment size, when the kernel coalesced (`UDP_GRO` cmsg).
    pub segment_bytes: Option<usize>,
}

impl Received<'_> {
    /// The datagrams: `data` cut at `segment_bytes` (or whole).
    pub fn segments(&self) -> impl Iterator<Item = &[u8]> {
        let seg = self.segment_bytes.unwrap_or(self.data.len()).max(1);
        self.data.chunks(seg)
    }
}

impl RecvBatch {
    /// Buffers for `slots` datagrams of up to 64 KiB each.
    pub fn new(slots: usize) -> RecvBatch {
        let slots = slots.max(1);
        RecvBatch {
            bufs: (0..slots).map(|_| vec![0u8; 65_536]).collect(),
            // SAFETY: all-zero `sockaddr_storage` and `mmsghdr` are valid values.
            addrs: (0..slots).map(|_| unsafe { zeroed() }).collect(),
            cmsgs: (0..slots).map(|_| CmsgBuf([0; CMSG_BUF_BYTES])).collect(),
            iovs: (0..slots)
                .map(|_| libc::iovec {
                    iov_base: std::ptr::null_mut(),
                    iov_len: 0,
                })
                .collect(),
            // SAFETY: as above.
            msgs: (0..slots).map(|_| unsafe { zeroed() }).collect(),
            got: 0,
        }
    }

    /// One `recvmmsg`: with `wait`, blocks (up to the socket's receive timeout) for the first
    /// datagram and takes whatever else is queued (`MSG_WAITFORONE`); without, returns at
    /// once (`MSG_DONTWAIT`). Returns how many were received. Errors: the kernel's
    /// (`EAGAIN`/`EWOULDBLOCK` when nothing came).
    pub fn recv(&mut self, fd: RawFd, wait: bool) -> io::Result<usize> {
        let n = self.bufs.len();
        for i in 0..n {
            self.iovs[i] = libc::iovec {
                iov_base: self.bufs[i].as_mut_ptr().cast(),
                iov_len: self.bufs[i].len(),
            };
            let h = &mut self.msgs[i].msg_hdr;
            h.msg_name = (&raw mut self.addrs[i]).cast();
            h.msg_namelen = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            h.msg_iov = &raw mut self.iovs[i];
            h.msg_iovlen = 1;
            h.msg_control = self.cmsgs[i].0.as_mut_ptr().cast();
            h.msg_controllen = self.cmsgs[i].0.len();
            h.msg_flags = 0;
            self.msgs[i].msg_len = 0;
        }
        let flags = if wait {
            libc::MSG_WAITFORONE
        } else {
            libc::MSG_DONTWAIT
        };
        // SAFETY: every `msgs[i]` points at this struct's own buffers (`bufs[i]` through
        // `iovs[i]`, `addrs[i]`, `cmsgs[i]`), sized as declared in the headers and alive and
        // unaliased for the call (`&mut self`).
        let rc = unsafe {
            libc::recvmmsg(
                fd,
                self.msgs.as_mut_ptr(),
                n as libc::c_uint,
                flags,
                std::ptr::null_mut(),
            )
        };
        if rc < 0 {
            self.got = 0;
            return Err(io::Error::last_os_error());
        }
        self.got = rc as usize;
        Ok(self.got)
    }

    /// The datagrams of the last [`RecvBatch::recv`].
    pub fn received(&self) -> impl Iterator<Item = Received<'_>> {
        (0..self.got).map(move |i| {
            let m = &self.msgs[i];
            let len = (m.msg_len as usize).min(self.bufs[i].len());
            Received {
                src: super::sockaddr::socket_addr_from_storage(&self.addrs[i]),
                data: &self.bufs[i][..len],
                segment_bytes: gro_segment(&m.msg_hdr),
            }
        })
    }
}

/// The `UDP_GRO` cmsg of a received message, if any.
fn gro_segment(h: &libc::msghdr) -> Option<usize> {
    // SAFETY: `h` was filled by `recvmmsg`: `msg_control`/`msg_controllen` describe a buffer
    // of ours holding the kernel's cmsgs; the CMSG_* macros stay within `msg_controllen`.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(h);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_UDP && (*c).cmsg_type == libc::UDP_GRO {
                let v = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<libc::c_int>());
                return usize::try_from(v).ok().filter(|v| *v > 0);
            }
            c = libc::CMSG_NXTHDR(h, c);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    /// One `sendmmsg` of a 3-segment GSO send gathered from four parts, a plain datagram
    /// and a 2-segment GSO send arrives as exactly those datagrams, in order (each GSO send
    /// as one GRO buffer where the kernel coalesces, else segment by segment).
    #[test]
    fn gathered_batch_sends_each_message_with_its_own_segment_size() {
        let tx = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
        let rx = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
        rx.set_read_timeout(Some(std::time::Duration::from_secs(2)))
            .expect("timeout");
        let _ = enable_gro(rx.as_raw_fd());
        let to = rx.local_addr().expect("addr");
        let bytes: Vec<u8> = (0..=255u8).cycle().take(400).collect();
        let parts: Vec<TxPart<'_>> = [0..60, 60..100, 100..200, 200..230, 230..280, 280..325]
            .map(|r| TxPart::from(&bytes[r]))
            .to_vec();
        let msgs = [
            GatheredMsg {
                first: 0,
                count: 4,
                segment_bytes: Some(100),
            },
            GatheredMsg {
                first: 4,
                count: 1,
                segment_bytes: None,
            },
            GatheredMsg {
                first: 5,
                count: 1,
                segment_bytes: Some(25),
            },
        ];
        let sent = match send_gathered_batch(tx.as_raw_fd(), &to, &parts, &msgs, IpCmsg::default())
        {
            Ok(n) => n,
            // A kernel without UDP GSO refuses the first message: nothing to check here
            // (the data path then falls back to plain sends, tests/gso.rs).
            Err(e) if matches!(e.raw_os_error(), Some(libc::EIO | libc::EINVAL)) => return,
            Err(e) => panic!("sendmmsg: {e}"),
        };
        assert_eq!(sent, 3);
        let want: Vec<&[u8]> = vec![
            &bytes[0..100],
            &bytes[100..200],
            &bytes[200..230],
            &bytes[230..280],
            &bytes[280..305],
            &bytes[305..325],
        ];
        let mut got: Vec<Vec<u8>> = Vec::new();
        let mut b = RecvBatch::new(8);
        while got.len() < want.len() {
            b.recv(rx.as_raw_fd(), true).expect("the datagrams arrive");
            for r in b.received() {
                got.extend(r.segments().map(<[u8]>::to_vec));
            }
        }
        assert_eq!(got, want);
    }

    #[test]
    fn gathered_batch_refuses_a_part_range_outside_the_parts() {
        let tx = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
        let to: SocketAddr = "127.0.0.1:9".parse().expect("addr");
        let parts = [TxPart::from(&[1u8, 2, 3][..])];
        for (first, count) in [(0, 2), (1, 1), (usize::MAX, 2)] {
            let m = [GatheredMsg {
                first,
                count,
                segment_bytes: None,
            }];
            let e = send_gathered_batch(tx.as_raw_fd(), &to, &parts, &m, IpCmsg::default())
                .expect_err("refused");
            assert_eq!(e.raw_os_error(), Some(libc::EINVAL));
        }
    }
}
