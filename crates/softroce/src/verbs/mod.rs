//! Verbs: devices, protection domains, memory regions, completion queues and queue pairs,
//! with libibverbs names, API checks and errno-style errors. Opens no sockets: a device
//! sends through a [`Link`] and reads time from a [`Clock`], both injected (`net` provides
//! the UDP link and the system clock; tests and `net::sim` provide their own).
//!
//! Threading: every object is `Send + Sync`; a device serialises its protocol work behind
//! one lock and runs it to completion in the calling thread (`post_send` transmits at once;
//! the driver thread that calls [`Device::handle_datagram`] sends the answers).

mod ah;
mod base;
mod cm_port;
mod cq;
mod device;
mod event;
mod mad_ring;
mod modify;
mod mr;
mod mw;
mod pd;
mod qp;
mod rx;
#[cfg(test)]
mod shared_counters_tests;
mod srq;

pub use crate::transport::{
    AccessFlags, BindMw, Counters, DropReason, GSI_QKEY, MAX_INLINE_DATA, MwType, PathMtu, QpCap,
    QpState, QpType, RecvWr, RegMr, SendFlags, SendWr, Sge, Transmit, UdDest, Wc, WcFlags,
    WcOpcode, WcStatus, WrOpcode, inc_rkey,
};
pub use crate::wire::Gid;
pub use crate::wire::grh::grh_source;
pub use ah::Ah;
pub use base::{
    Device, DeviceConfig, GID_ENTRIES, GID_TBL_LEN, GidEntry, GidType, MAX_SGE, MULTICAST_QPN,
};
pub use cm_port::CmPort;
pub use cq::{CompChannel, Cq, PollHook};
pub use device::{
    AtomicCap, DEVICE_CAP_FLAGS, DeviceAttr, PortAttr, device_attr, gid_table, node_guid, port_attr,
};
pub use event::{AsyncEvent, EventElement, EventType, wait_readable};
pub use mad_ring::{
    CM_PORT_RECV_SLOTS, CM_PORT_SEND_SLOTS, MAD_RECV_SLOT_BYTES, MadCompletion, MadRing,
};
pub use modify::{
    AhAttr, Params, QpAttr, QpAttrMask, QpQuery, TRANSITIONS, Transition, check_modify,
};
pub use mr::Mr;
pub use mw::{FAST_REG_PAGE_BYTES, MAX_FAST_REG_PAGES, Mw, MwBind};
pub use pd::Pd;
pub use qp::{
    LINK_LOCAL_SGID, Qp, QpInitAttr, RcConnect, rdma_get_udp_sport, rxe_initial_udp_sport,
};
pub use rx::{RxBatch, RxHeaders};
pub use srq::{Srq, SrqAttr, SrqAttrMask, SrqInitAttr};

use crate::transport::Instant;
use std::borrow::Cow;
use std::net::IpAddr;

/// errno-shaped error kinds. Source: the errno values libibverbs returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// EINVAL: an argument or attribute is invalid.
    Inval,
    /// ENOMEM: a queue or table is full.
    NoMem,
    /// EPERM: not permitted.
    Perm,
    /// EAGAIN: try again.
    Again,
    /// EBUSY: the object is in use.
    Busy,
    /// ENOENT: no such object.
    NoEnt,
    /// EOPNOTSUPP: not supported.
    OpNotSupp,
    /// EFAULT: bad address.
    Fault,
    /// EIO: an I/O error from the link.
    Io,
}

impl ErrorKind {
    /// The Linux errno value.
    pub const fn errno(self) -> i32 {
        match self {
            ErrorKind::Perm => 1,
            ErrorKind::NoEnt => 2,
            ErrorKind::Io => 5,
            ErrorKind::Again => 11,
            ErrorKind::NoMem => 12,
            ErrorKind::Fault => 14,
            ErrorKind::Busy => 16,
            ErrorKind::Inval => 22,
            ErrorKind::OpNotSupp => 95,
        }
    }
}

/// A verbs API error: a kind and a message saying what was wrong, e.g.
/// "modify_qp INIT->RTR: missing DEST_QPN". For `post_send`/`post_recv`, `bad_wr` is the
/// index of the first work request that was refused (none after it was posted).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    kind: ErrorKind,
    what: Cow<'static, str>,
    bad_wr: Option<usize>,
}

impl Error {
    /// A new error.
    pub fn new(kind: ErrorKind, what: impl Into<Cow<'static, str>>) -> Error {
        Error {
            kind,
            what: what.into(),
            bad_wr: None,
        }
    }
    /// The kind.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }
    /// The errno value.
    pub fn errno(&self) -> i32 {
        self.kind.errno()
    }
    /// What was wrong.
    pub fn what(&self) -> &str {
        &self.what
    }
    /// Index of the first refused work request (post calls only).
    pub fn bad_wr(&self) -> Option<usize> {
        self.bad_wr
    }
    pub(crate) fn at_wr(mut self, i: usize) -> Error {
        self.bad_wr = Some(i);
        self
    }
}

impl core::fmt::Display for Error {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(&self.what)?;
        if let Some(i) = self.bad_wr {
            write!(f, " (bad_wr {i})")?;
        }
        Ok(())
    }
}

impl std::error::Error for Error {}

/// Result of a verbs call.
pub type Result<T> = core::result::Result<T, Error>;

/// Where a device's packets go. Implemented by `net` (UDP sockets) and by simulators.
pub trait Link: Send + Sync {
    /// Sends one RoCEv2 datagram. Errors are counted (`send_err`); the transport recovers
    /// by retransmission.
    fn send(&self, t: &Transmit) -> std::io::Result<()>;

    /// Sends `ts` in order (the datagrams one pump of a QP produced). A link may batch them
    /// into fewer system calls (UDP GSO, `sendmmsg`); the default sends them one by one.
    /// Returns how many could not be sent (counted as `send_err`).
    fn send_batch(&self, ts: &[Transmit]) -> usize {
        ts.iter().filter(|t| self.send(t).is_err()).count()
    }

    /// True if this link sends (or copies) every datagram before `send` / `send_batch`
    /// returns, so that the engine may hand it datagrams whose payload still lies in an MR
    /// ([`crate::transport::Transmit::tail`], valid only during the call). A link that
    /// keeps datagrams for later (a simulator's queue) must leave this false, the default.
    fn gathers(&self) -> bool {
        false
    }

    /// Prepares to send from UDP source port `want` and returns the port actually used (a
    /// link that cannot bind `want` picks another; the ICRC is computed over the result).
    fn source_port(&self, want: u16) -> u16 {
        want
    }

    /// Tells the link's receive side that a timer may now be due earlier than it planned.
    fn wake(&self) {}

    /// A peer address the network said has no RoCE device (an ICMP port unreachable for a
    /// datagram of QP1) or no route, once each, for the CM ([`CmPort::process`] hands it to
    /// [`crate::cm::CmEngine::handle_unreachable`]). A link that learns nothing of the kind
    /// (a simulator) returns `None`, the default.
    fn poll_unreachable(&self) -> Option<IpAddr> {
        None
    }

    /// Starts receiving datagrams sent to the multicast address `group` (port 4791) and
    /// handing them to [`Device::handle_multicast_datagram`]; called when the first QP of
    /// the device attaches to the group. A link without IP multicast (a simulator) has
    /// nothing to do. Errors: the socket error (the attach then fails with `EIO`).
    fn join_multicast(&self, group: IpAddr) -> std::io::Result<()> {
        let _ = group;
        Ok(())
    }

    /// Stops receiving `group`; called when the last QP of the device detaches from it.
    fn leave_multicast(&self, group: IpAddr) {
        let _ = group;
    }

    /// The device counters this link's device shares with the other processes that opened
    /// a device on its address ([`SharedCounters`]; `net::share`), asked once, when the
    /// device is made. `None`, the default: the address is this device's alone, and its
    /// counters are its own.
    fn shared_counters(&self) -> Option<std::sync::Arc<dyn SharedCounters>> {
        None
    }
}

/// The counters of a device whose address several processes share, each with its own
/// [`Device`] on it (`net::share`), as every process of a host shares kernel rxe's device and
/// its `hw_counters`. Each process adds what its device counts to its own part; the device's
/// counters are the sum of the parts.
///
/// A device adds what it counted (what grew since it last added: a few counters per
/// packet) before the datagrams it caused leave and before the completions it caused are
/// delivered, at the end of each receive batch, and before a destroyed QP's counts join the
/// device's own; a read of [`Device::counters`] adds everything first. So a process that sees
/// the answer or the completion of a packet sees the packet counted.
pub trait SharedCounters: Send + Sync {
    /// Adds `n` to counter `index` (in the order of [`Counters::NAMES`]) of this process's
    /// part; nothing for an index past them.
    fn add(&self, index: usize, n: u64);

    /// The device's counters: the sum of every part (every process that has used the
    /// device's address, those gone included, and whatever serves the address between
    /// them, such as `net::share`'s keeper).
    fn total(&self) -> Counters;
}

/// A monotonic clock for the device. `net::SystemClock` reads the real one.
pub trait Clock: Send + Sync {
    /// Now, in ns from the clock's origin.
    fn now(&self) -> Instant;
}
