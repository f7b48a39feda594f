//! Net: [`UdpLink`], the UDP side of one device: its receive socket on port 4791, a send
//! socket per UDP source port (unconnected, `IP_PMTUDISC_DO`, so that Linux writes a known
//! IPv4 header), the batched send path (UDP GSO, `sendmmsg`) and the hold of ACKs a busy
//! poller sends with its next request. It implements the engine's `Link`; what a datagram
//! is comes from the engine's label ([`crate::transport::TxKind`]), never from its bytes.

mod errqueue;
mod sockets;
#[cfg(test)]
mod tests;

use super::batch::{
    GSO_MAX_BYTES, GSO_MAX_SEGMENTS, GatheredMsg, IpCmsg, RecvBatch, enable_gro,
    send_gathered_batch, send_gso_gather, send_mmsg_with,
};
use super::pcap::{Capture, SentHeader, roce_addr};
use super::raw::{RawRx, drop_everything};
use super::sock::new_socket;
use crate::transport::{Transmit, TxPart};
use crate::verbs::Link;
use crate::wire::{IcrcIp, ROCE_V2_UDP_PORT, icrc_of_body};
use parking_lot::Mutex;
use rustix::net::sockopt;
pub(super) use sockets::FLUSH_AFTER_DATAGRAMS;
use sockets::{
    ACK_AFTER_DATAGRAMS, DEFER_MAX_HELD, IDENT_DELTA_CACHE, IdentDeltaKey, IdentDeltas,
    PIGGYBACK_MAX, SENDMMSG_MSGS, SendSockets, body_and_icrc, gsi_source_port, gso_refused,
    may_wait, send_socket,
};
use std::borrow::Borrow;
use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

/// Socket receive buffer we ask for, in bytes: room for a 128-PSN window of 4 KiB packets
/// from several QPs. Root gets it (SO_RCVBUFFORCE); others get up to `net.core.rmem_max`.
pub(super) const RCVBUF_BYTES: usize = 8 << 20;
/// Datagrams one receive call may return (`recvmmsg` slots of 64 KiB each).
pub(super) const RECV_BATCH: usize = 8;

/// What a UDP device does beyond the plain data path.
#[derive(Debug, Clone, Default)]
pub struct UdpOptions {
    /// Exact receive-side ICRC (IPv4): receive whole IP packets on a raw socket and check
    /// the ICRC over the IP header as received, Identification included, as kernel rxe does.
    /// Needs CAP_NET_RAW: opening the device fails with EPERM without it. Without this
    /// option an IPv4 ICRC is checked by solving for the hidden ID (see
    /// [`crate::verbs::RxHeaders::Udp`]). IPv6 is exact either way; the option changes
    /// nothing there.
    pub exact_icrc: bool,
    /// Write every datagram the driver sends and receives to this capture.
    pub capture: Option<Arc<Capture>>,
    /// Busy-polling mode for latency: [`UdpDevice::poll_cq`](super::UdpDevice::poll_cq) receives from the device's
    /// socket itself (non-blocking) and runs the engine in the calling thread, instead of
    /// waiting for the driver thread to be woken by the kernel (a cross-core wakeup costs
    /// ≈ 50 µs on small VMs). The driver thread still serves timers; while polls come in
    /// it naps (up to 5 ms) without waiting on the socket and then takes what no poll took;
    /// after a nap without polls it waits on the socket and takes what arrives while no
    /// poll runs (an application that spins on memory for the peer's WRITE, as perftest's
    /// latency tests do). ACKs that a poll's datagrams cause are held back while the
    /// application has something new (a datagram this poll received, or a completion it
    /// returned), and those of what the driver thread took likewise: a request the
    /// application posts next carries them in the same send; a poll that finds nothing
    /// sends them, and the driver thread does once they have waited 0.5 ms. Off by default:
    /// then `poll_cq` only polls the CQ.
    pub busy_poll: bool,
    /// With [`UdpOptions::busy_poll`]: busy polls receive only while the device is not
    /// mostly sending. Every 2 ms the driver thread weighs the datagrams sent against those
    /// received: a device that sent more than four per one received (the requester of bulk
    /// WRITEs or SENDs) leaves receiving its ACKs to the driver thread, which then works in
    /// parallel with the application; in any other mix (ping-pong, a receiver of bulk data)
    /// busy polls take the socket, as without this option. Whether that pays depends on
    /// spare cores (docs/performance.md): on a 2-core machine that other work keeps busy a
    /// bulk sender gained bandwidth; on an idle one it got about half of what plain busy
    /// polling gets (its spinning application, its driver thread and the peer's then share
    /// two cores). Off by default; softroce's libibverbs.so.1 turns it on with
    /// `SOFTROCE_BUSY_POLL=adaptive`.
    pub busy_poll_adaptive: bool,
    /// Turn off every batching offload (UDP GSO on send, UDP GRO on receive, `sendmmsg` /
    /// `recvmmsg`): one system call per datagram, as on a kernel without them. The offloads
    /// fall back on their own when the kernel refuses them; this is for comparisons and for
    /// peers that check our ICRCs assuming IPv4 ID 0 on every datagram: with GSO, Linux
    /// gives segment `i` of a send ID `i` (our ICRCs cover that ID, so kernel rxe, which
    /// checks over the header it received, accepts them; a plain-UDP receiver must solve
    /// for the ID, as softroce's own does, or be told the segment index by UDP GRO).
    pub no_offload: bool,
    /// The address's port 4791 to this device alone, as with `SOFTROCE_SHARE=0`
    /// ([`super::share`]): for a program that drives its own CM engine on QP1
    /// ([`crate::verbs::CmPort`]) instead of the device's ([`super::UdpDevice::cm`]), whose
    /// listeners and comm IDs a shared device's steering would not know. A second device on
    /// the address then gets EADDRINUSE.
    pub exclusive: bool,
}

/// Options that [`UdpDevice::open`](super::UdpDevice::open) and [`UdpDevice::open_with`](super::UdpDevice::open_with) use; see
/// [`UdpOptions::set_process_default`].
static PROCESS_DEFAULT: Mutex<Option<UdpOptions>> = Mutex::new(None);

impl UdpOptions {
    /// Makes `opts` the options of every device this process opens later with
    /// [`UdpDevice::open`](super::UdpDevice::open) or [`UdpDevice::open_with`](super::UdpDevice::open_with) (the CLI's `--pcap` and
    /// `--exact-icrc`, which so apply to every subcommand). [`UdpDevice::open_with_options`](super::UdpDevice::open_with_options)
    /// ignores it.
    pub fn set_process_default(opts: UdpOptions) {
        *PROCESS_DEFAULT.lock() = Some(opts);
    }

    /// The options set by [`UdpOptions::set_process_default`], else the defaults with, when
    /// [`SOFTROCE_PCAP`](super::pcap::SOFTROCE_PCAP) names a file, the process's capture
    /// appending to it ([`Capture::append`], opened once; if it cannot be, the reason is said
    /// on stderr once and devices open without a capture).
    pub fn process_default() -> UdpOptions {
        if let Some(o) = PROCESS_DEFAULT.lock().clone() {
            return o;
        }
        UdpOptions {
            capture: env_capture(),
            ..UdpOptions::default()
        }
    }
}

/// The capture [`SOFTROCE_PCAP`](super::pcap::SOFTROCE_PCAP) asks for, opened on first use.
fn env_capture() -> Option<Arc<Capture>> {
    static CAPTURE: std::sync::OnceLock<Option<Arc<Capture>>> = std::sync::OnceLock::new();
    CAPTURE
        .get_or_init(|| {
            let path = std::env::var_os(super::pcap::SOFTROCE_PCAP).filter(|p| !p.is_empty())?;
            match Capture::append(std::path::Path::new(&path)) {
                Ok(c) => Some(c),
                Err(e) => {
                    eprintln!(
                        "softroce: {}={}: {e}; devices open without a capture",
                        super::pcap::SOFTROCE_PCAP,
                        path.to_string_lossy()
                    );
                    None
                }
            }
        })
        .clone()
}

/// The UDP side of a device: a receive socket on port 4791 and send sockets per source port,
/// plus, in exact ICRC mode, a raw receive socket.
#[derive(Debug)]
pub struct UdpLink {
    pub(super) ip: IpAddr,
    /// `recv` on the list of sockets a forked child does not keep (`super::fork`); before
    /// `recv`, so that it is taken off the list before the socket closes.
    _unshared: super::fork::Unshared,
    pub(super) recv: UdpSocket,
    /// This process's share of a shared device (`super::share`); after `recv`, so that the
    /// slot's socket is closed before the keeper takes the slot back. `None`: the port is
    /// this link's alone (sharing off, or the exact-ICRC raw socket mode).
    share: Option<super::share::Share>,
    pub(super) raw: Option<RawRx>,
    pub(super) send: Mutex<foldhash::HashMap<u16, Arc<SendSockets>>>,
    /// One socket per joined multicast group, bound to group:4791 (`super::mcast`).
    pub(super) mcast: Mutex<HashMap<IpAddr, Arc<UdpSocket>>>,
    /// How many groups `mcast` holds, read without its lock by every busy poll.
    pub(super) mcast_groups: std::sync::atomic::AtomicUsize,
    /// Peer addresses that ICMP said have no RoCE device (or no route), from the error queue
    /// of QP1's send sockets, for the CM ([`Link::poll_unreachable`]); at most
    /// [`UNREACHABLE_MAX`], the oldest dropped first.
    unreachable: Mutex<std::collections::VecDeque<IpAddr>>,
    /// Peers whose ICMP errors for a QP's datagrams (not QP1's) were logged, each once at
    /// `warn` (later ones at `debug`); at most [`UNREACHABLE_MAX`].
    told_unreachable: Mutex<Vec<IpAddr>>,
    pub(super) capture: Option<Arc<Capture>>,
    /// TTL / hop limit of our sockets for unicast (for the capture).
    pub(super) hop_limit: u8,
    /// Datagrams sent.
    pub tx_datagrams: AtomicU64,
    /// Datagrams received.
    pub rx_datagrams: AtomicU64,
    /// Send system calls made (`sendto`, `sendmsg` with GSO, `sendmmsg`).
    pub tx_syscalls: AtomicU64,
    /// Receive calls that returned data (`recvfrom`, `recvmmsg`).
    pub rx_syscalls: AtomicU64,
    /// UDP GSO sends (each carrying 2 to [`GSO_MAX_SEGMENTS`] datagrams).
    pub tx_gso_sends: AtomicU64,
    /// Received GRO buffers that held more than one datagram.
    pub rx_gro_buffers: AtomicU64,
    /// Batching allowed (not [`UdpOptions::no_offload`], no capture).
    pub(super) offload: bool,
    /// UDP GSO still believed to work (cleared by the first refusal).
    pub(super) gso: AtomicBool,
    /// UDP GRO is on for the receive socket.
    pub(super) gro: bool,
    /// Cached tables of ICRC corrections for IPv4 GSO segments ([`UdpLink::ident_deltas`]),
    /// by (destination, source port, body length). foldhash, not SipHash: this and the
    /// socket map are looked up on every send, and SipHash was 70 ns of a 0.7 µs
    /// latency-bound `post_send` (the keys come from our own QPs, not from the network).
    pub(super) ident_deltas: Mutex<foldhash::HashMap<IdentDeltaKey, Arc<IdentDeltas>>>,
    /// The receive buffers of the plain UDP socket. Whoever holds the lock receives and
    /// handles what it got before letting go, so datagrams reach the device in order.
    pub(super) rx: Mutex<RecvBatch>,
    /// Busy-polling mode ([`UdpOptions::busy_poll`]; not with a raw receive socket).
    pub(super) busy_poll: bool,
    /// Count of busy polls; the driver thread stays off the socket while it moves.
    pub(super) polls: AtomicU64,
    /// Busy polls running now (entered and not returned): the driver thread takes a datagram
    /// off the socket only while none runs (`udp::poller_quiet`).
    pub(super) in_poll: AtomicU32,
    /// When the last busy poll ended ([`UdpLink::poll_ended`]): nanoseconds since `epoch`,
    /// shifted left by one, the low bit set when that poll returned completions.
    last_poll: AtomicU64,
    /// Set while the driver thread naps because a busy poll was there to take what woke it;
    /// the next poll that returns completions wakes it ([`UdpLink::poll_returned`]).
    pub(super) driver_awaits_poll: AtomicBool,
    /// The device's driver thread, once it runs.
    pub(super) driver_thread: Mutex<Option<std::thread::Thread>>,
    /// Set by [`UdpDevice::poller_sleeps`](super::UdpDevice::poller_sleeps), cleared by the
    /// next busy poll: the polling thread blocks, so the driver thread receives again at
    /// once instead of napping.
    pub(super) poller_asleep: AtomicBool,
    /// Adaptive busy polling ([`UdpOptions::busy_poll_adaptive`]).
    pub(super) adaptive: bool,
    /// With `adaptive`: whether busy polls take the socket now (set by the driver thread
    /// from the traffic mix; `udp::TrafficMix`).
    pub(super) poller_takes_socket: AtomicBool,
    /// ACKs held back by a busy poll until its completions are handed out.
    pub(super) deferred: Mutex<Vec<Transmit>>,
    /// When the oldest ACK in `deferred` was held back: nanoseconds since `epoch` plus one,
    /// 0 while none is. Written under the `deferred` lock.
    held_since: AtomicU64,
    /// The origin of `held_since` and `last_poll`.
    epoch: std::time::Instant,
    /// `rx_datagrams` when held ACKs last went (or none were held): see
    /// [`UdpLink::holds_too_many_acks`].
    rx_at_flush: AtomicU64,
    /// Set while received datagrams are delivered ([`deliver`], by whoever holds `rx`): the
    /// ACKs they cause are held back in `deferred`. The driver thread sends them together
    /// at the end of each receive batch; a busy poll sends them at the next poll, after the
    /// application has seen the completions and answered (docs/performance.md#measured-costs-on-this-machine-class: ACKs off the critical
    /// path). Only a pump that handles received packets produces ACKs, so another thread
    /// that sends while this is set sends requests, which are never held.
    pub(super) holding_acks: AtomicBool,
}

impl UdpLink {
    /// The slot of the shared device this link is ([`super::share::Share::slot`]), `None`
    /// when the port is this link's alone.
    pub fn slot(&self) -> Option<u8> {
        self.share.as_ref().map(super::share::Share::slot)
    }

    /// Makes the CM REQs for `service_id` that reach the shared device come to this process
    /// ([`super::share::Share::listen`]); nothing to do when the port is this link's alone.
    /// Errors: EADDRINUSE when another process listens on it.
    pub fn share_listen(&self, service_id: u64) -> io::Result<()> {
        self.share.as_ref().map_or(Ok(()), |s| s.listen(service_id))
    }

    /// How many datagrams the shared device's keeper dropped
    /// ([`super::share::Share::keeper_drops`]); `None` when the port is this link's alone.
    /// Errors: EPIPE when the keeper is gone.
    pub fn keeper_drops(&self) -> Option<io::Result<u64>> {
        self.share.as_ref().map(super::share::Share::keeper_drops)
    }

    /// Undoes [`UdpLink::share_listen`].
    pub fn share_unlisten(&self, service_id: u64) {
        if let Some(s) = &self.share {
            let _ = s.unlisten(service_id);
        }
    }

    /// Binds `ip`:4791 for receiving. Errors: the bind error (EADDRINUSE when another
    /// process — or kernel rxe — owns the port on that address).
    pub fn bind(ip: IpAddr) -> io::Result<UdpLink> {
        UdpLink::bind_with(ip, &UdpOptions::default())
    }

    /// Binds `ip`:4791 with `opts`. Errors: as [`UdpLink::bind`]; with `exact_icrc` on IPv4,
    /// EPERM without CAP_NET_RAW.
    pub fn bind_with(ip: IpAddr, opts: &UdpOptions) -> io::Result<UdpLink> {
        // A shared device's slot socket, from its keeper; alone with the raw socket of the
        // exact-ICRC mode (which receives every packet of the address) or with sharing off.
        let (recv, share) = if opts.exact_icrc || opts.exclusive || !super::share::enabled() {
            (new_socket(ip, ROCE_V2_UDP_PORT, false)?, None)
        } else {
            let (share, fd) = super::share::Share::join(ip)?;
            (socket2::Socket::from(fd), Some(share))
        };
        if sockopt::set_socket_recv_buffer_size_force(&recv, RCVBUF_BYTES).is_err() {
            let _ = sockopt::set_socket_recv_buffer_size(&recv, RCVBUF_BYTES);
        }
        let raw = match ip {
            IpAddr::V4(v4) if opts.exact_icrc => {
                let raw = RawRx::open(v4, ROCE_V2_UDP_PORT, RCVBUF_BYTES)?;
                drop_everything(&recv)?;
                Some(raw)
            }
            _ => None,
        };
        let hop_limit = match ip {
            IpAddr::V4(_) => sockopt::ip_ttl(&recv).map_or(64, |t| u8::try_from(t).unwrap_or(64)),
            IpAddr::V6(_) => sockopt::ipv6_unicast_hops(&recv).unwrap_or(64),
        };
        let offload = !opts.no_offload && opts.capture.is_none();
        // GRO coalesces the segments of a GSO send (and, behind a NIC, runs of one flow)
        // into one receive; refused by kernels before 5.0, which then deliver one by one.
        let gro = offload && raw.is_none() && enable_gro(recv.as_raw_fd()).is_ok();
        let busy_poll = opts.busy_poll && raw.is_none();
        Ok(UdpLink {
            ip,
            _unshared: super::fork::unshared(recv.as_raw_fd()),
            recv: recv.into(),
            share,
            raw,
            send: Mutex::new(foldhash::HashMap::default()),
            mcast: Mutex::new(HashMap::new()),
            mcast_groups: std::sync::atomic::AtomicUsize::new(0),
            unreachable: Mutex::new(std::collections::VecDeque::new()),
            told_unreachable: Mutex::new(Vec::new()),
            capture: opts.capture.clone(),
            hop_limit,
            tx_datagrams: AtomicU64::new(0),
            rx_datagrams: AtomicU64::new(0),
            tx_syscalls: AtomicU64::new(0),
            rx_syscalls: AtomicU64::new(0),
            tx_gso_sends: AtomicU64::new(0),
            rx_gro_buffers: AtomicU64::new(0),
            offload,
            gso: AtomicBool::new(offload),
            gro,
            ident_deltas: Mutex::new(foldhash::HashMap::default()),
            rx: Mutex::new(RecvBatch::new(if offload { RECV_BATCH } else { 1 })),
            busy_poll,
            polls: AtomicU64::new(0),
            in_poll: AtomicU32::new(0),
            last_poll: AtomicU64::new(0),
            driver_awaits_poll: AtomicBool::new(false),
            driver_thread: Mutex::new(None),
            poller_asleep: AtomicBool::new(false),
            adaptive: busy_poll && opts.busy_poll_adaptive,
            poller_takes_socket: AtomicBool::new(true),
            deferred: Mutex::new(Vec::new()),
            held_since: AtomicU64::new(0),
            epoch: std::time::Instant::now(),
            rx_at_flush: AtomicU64::new(0),
            holding_acks: AtomicBool::new(false),
        })
    }

    /// True when received IPv4 packets are checked over their IP header as received.
    pub fn exact_icrc(&self) -> bool {
        self.raw.is_some()
    }

    /// True when threads that poll a CQ receive from the socket themselves
    /// ([`UdpOptions::busy_poll`]).
    pub fn busy_poll(&self) -> bool {
        self.busy_poll
    }

    /// True when busy polls of this link's device receive from the socket now: in
    /// busy-polling mode ([`UdpOptions::busy_poll`]) unless adaptive mode
    /// ([`UdpOptions::busy_poll_adaptive`]) found the device mostly sending. False outside
    /// busy-polling mode.
    pub fn busy_polls_receive(&self) -> bool {
        self.busy_poll && self.poller_receives()
    }

    /// The capture this link writes to, if any.
    pub fn capture(&self) -> Option<&Arc<Capture>> {
        self.capture.as_ref()
    }

    /// True while sends are batched with UDP GSO (cleared when the kernel refuses it).
    pub fn gso(&self) -> bool {
        self.gso.load(Ordering::Relaxed)
    }

    /// Sends `ts` now: runs of one (source port, destination) batched, unless offloads are
    /// off. Returns how many failed.
    pub(super) fn send_now<T: Borrow<Transmit>>(&self, ts: &[T]) -> usize {
        if ts.is_empty() {
            return 0;
        }
        if !self.offload || ts.len() < 2 {
            return ts
                .iter()
                .filter(|t| self.send((*t).borrow()).is_err())
                .count();
        }
        // Runs of one (source port, destination, IP fields): one socket, one GSO flow, one
        // set of cmsgs.
        let mut errors = 0;
        let mut i = 0;
        while let Some(t) = ts.get(i) {
            let t = t.borrow();
            let len = ts[i..]
                .iter()
                .map(Borrow::borrow)
                .take_while(|u: &&Transmit| {
                    u.src_port == t.src_port && u.dst == t.dst && u.ip == t.ip
                })
                .count();
            errors += self.send_run(&ts[i..i + len]);
            i += len;
        }
        errors
    }

    /// Sends the ACKs held back, if any. The lock is held while they go out, so two threads
    /// flushing cannot reorder them (a stale ACK overtaking a newer one is dropped by the
    /// peer's completer as an unexpected response).
    pub(super) fn flush_deferred(&self) {
        let mut held = self.deferred.lock();
        self.rx_at_flush
            .store(self.rx_datagrams.load(Ordering::Relaxed), Ordering::Relaxed);
        if !held.is_empty() {
            let _ = self.send_now(&held);
            self.release_held(&mut held);
        }
    }

    /// A busy poll returned completions: the application acts on them and may not poll
    /// again before the peer's next message (perftest's latency loop spins on memory), so
    /// a driver thread napping while polls received goes back to the socket now.
    pub(super) fn poll_returned(&self) {
        if self.driver_awaits_poll.load(Ordering::Relaxed)
            && self.driver_awaits_poll.swap(false, Ordering::SeqCst)
            && let Some(t) = &*self.driver_thread.lock()
        {
            t.unpark();
        }
    }

    /// True when busy polls take the socket now: always in plain busy-polling mode; in
    /// adaptive mode ([`UdpOptions::busy_poll_adaptive`]) unless the device is mostly
    /// sending.
    pub(super) fn poller_receives(&self) -> bool {
        !self.adaptive || self.poller_takes_socket.load(Ordering::Relaxed)
    }

    /// True when the ACKs a busy poller holds back must go now even if the application has
    /// something new to answer: [`DEFER_MAX_HELD`] of them wait, or [`ACK_AFTER_DATAGRAMS`]
    /// datagrams came in since held ACKs last went. The second bounds how far a streaming
    /// peer gets into its window before it hears from us: an application that keeps finding
    /// completions never polls idle, and ACKs that wait for that let the peer fill its
    /// 128-PSN window and stop, then wait while this side drains the window, sends the ACK,
    /// and idles until new packets arrive (`ucx_perftest -t tag_bw`: one ACK per about 108
    /// packets, both sides idle most of the time).
    pub(super) fn holds_too_many_acks(&self) -> bool {
        self.datagrams_since_flush() >= ACK_AFTER_DATAGRAMS
            || self.deferred.lock().len() >= DEFER_MAX_HELD
    }

    /// Empties the held ACKs once they went; `held` is the `deferred` lock's contents (so
    /// `held_since` is 0 exactly while nothing is held).
    fn release_held(&self, held: &mut Vec<Transmit>) {
        held.clear();
        self.held_since.store(0, Ordering::Relaxed);
    }

    /// Nanoseconds since the link's `epoch` (saturating; 584 years).
    fn nanos(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// How long the oldest ACK held back ([`UdpLink::flush_deferred`]) has waited, whoever
    /// holds it (a busy poll for its application's answer, or the driver thread for the
    /// answer to what it took); `None` when none is held.
    pub(super) fn held_for(&self) -> Option<std::time::Duration> {
        let since = self.held_since.load(Ordering::Relaxed).checked_sub(1)?;
        Some(std::time::Duration::from_nanos(
            self.nanos().saturating_sub(since),
        ))
    }

    /// Records the end of a busy poll, and whether it returned completions.
    pub(super) fn poll_ended(&self, returned: bool) {
        let stamp = (self.nanos() << 1) | u64::from(returned);
        self.last_poll.store(stamp, Ordering::SeqCst);
    }

    /// True when the last busy poll ended less than `window` ago and returned nothing: the
    /// application is in a loop that polls until something comes (it will poll again),
    /// even if it does not run at this moment (on a core this thread may have taken from
    /// it). A poll that returned completions says the opposite: the application acts on
    /// them and may not poll again for a while (perftest's latency loop spins on memory).
    pub(super) fn polling_in_a_loop(&self, window: std::time::Duration) -> bool {
        let stamp = self.last_poll.load(Ordering::SeqCst);
        if stamp == 0 || stamp & 1 == 1 {
            return false;
        }
        let ended = stamp >> 1;
        let window = u64::try_from(window.as_nanos()).unwrap_or(u64::MAX);
        self.nanos().saturating_sub(ended) < window
    }

    /// How many datagrams came in since held ACKs last went ([`UdpLink::flush_deferred`]).
    pub(super) fn datagrams_since_flush(&self) -> u64 {
        self.rx_datagrams
            .load(Ordering::Relaxed)
            .wrapping_sub(self.rx_at_flush.load(Ordering::Relaxed))
    }

    /// Stops using UDP GSO, as when the kernel refuses it: runs of datagrams then go out
    /// with one `sendmmsg` each. For tests of that fallback.
    pub fn disable_gso(&self) {
        self.gso.store(false, Ordering::Relaxed);
    }

    /// True when the receive socket has UDP GRO on.
    pub fn gro(&self) -> bool {
        self.gro
    }

    /// Sends a run of datagrams that share source port and destination: UDP GSO
    /// super-datagrams of equal-sized segments where possible, up to [`SENDMMSG_MSGS`] of
    /// them (and lone datagrams between them) per `sendmmsg`; without GSO, one plain
    /// `sendmmsg`. Returns how many datagrams could not be sent.
    pub(super) fn send_run<T: Borrow<Transmit>>(&self, run: &[T]) -> usize {
        let Some(first) = run.first().map(Borrow::borrow) else {
            return 0;
        };
        if run.len() == 1 {
            return usize::from(self.send(first).is_err());
        }
        let Ok(socks) = self.socket_for(first.src_port) else {
            return run.len();
        };
        let dst = roce_addr(first.dst);
        let ip = self.ip_cmsg(first);
        let mut errors = 0;
        let mut k = 0;
        while k < run.len() {
            // Err: the kernel refused GSO (now off), and the rest goes the plain way.
            if self.gso()
                && let Ok((n, failed)) = self.send_gso_batch(&socks, &dst, &run[k..], ip)
            {
                k += n;
                errors += failed;
                continue;
            }
            // GSO unavailable: one sendmmsg for the rest, with gathered datagrams copied
            // whole (this fallback takes one buffer each).
            let n = run.len() - k;
            let whole: Vec<std::borrow::Cow<'_, [u8]>> = run[k..]
                .iter()
                .map(Borrow::borrow)
                .map(|t: &Transmit| match t.tail {
                    // SAFETY: inside the pump, under the device lock (`gathers`).
                    Some(_) => std::borrow::Cow::Owned(unsafe { t.to_vec() }),
                    None => std::borrow::Cow::Borrowed(&t.payload[..]),
                })
                .collect();
            let parts: Vec<&[u8]> = whole.iter().map(|w| &w[..]).collect();
            let sent = send_mmsg_with(socks.plain.as_raw_fd(), &dst, &parts, ip).unwrap_or(0);
            self.tx_syscalls.fetch_add(1, Ordering::Relaxed);
            self.tx_datagrams.fetch_add(sent as u64, Ordering::Relaxed);
            errors += n - sent;
            k += n;
        }
        if errors > 0 {
            // An ICMP error may have failed a send (the retransmission timer sends again).
            self.take_icmp_errors_of(first.src_port);
        }
        errors
    }

    /// How many datagrams from the start of `ts` make one GSO send: segments of the first
    /// one's size, the last possibly shorter, at most [`GSO_MAX_SEGMENTS`] and
    /// [`GSO_MAX_BYTES`]. 1 (a lone datagram) when the second cannot follow the first.
    pub(super) fn gso_prefix<T: Borrow<Transmit>>(ts: &[T]) -> usize {
        let Some(seg) = ts.first().map(|t| t.borrow().len()) else {
            return 0;
        };
        if seg == 0 || seg > usize::from(u16::MAX) {
            return 1;
        }
        let mut n = 1;
        let mut total = seg;
        while let Some(t) = ts.get(n).map(Borrow::borrow) {
            let l = t.len();
            if n >= GSO_MAX_SEGMENTS || l > seg || l == 0 || total + l > GSO_MAX_BYTES {
                break;
            }
            n += 1;
            total += l;
            if l < seg {
                break;
            }
        }
        n
    }

    /// Sends a prefix of `ts` (all to `dst` from `fd`) as up to [`SENDMMSG_MSGS`] GSO
    /// super-datagrams (or lone datagrams) in one system call: `sendmsg` for one, `sendmmsg`
    /// for more. Returns `Ok((datagrams consumed, of which failed))`, or `Err(())` when the
    /// kernel refused GSO (GSO is then off for this link and nothing was sent).
    ///
    /// Every segment stays a whole RoCE packet with its own ICRC. For IPv4 the kernel gives
    /// segment `i` of a GSO send the IP Identification `i` (`batch::send_gso`), which the
    /// ICRC covers, so the ICRC of segments after the first is corrected here for that ID
    /// (the engine computed it for ID 0, what a lone datagram carries;
    /// [`UdpLink::ident_deltas`]). The datagrams are gathered from the engine's buffers, not
    /// copied.
    pub(super) fn send_gso_batch<T: Borrow<Transmit>>(
        &self,
        socks: &SendSockets,
        dst: &SocketAddr,
        ts: &[T],
        ip: IpCmsg,
    ) -> Result<(usize, usize), ()> {
        // The messages: (first datagram, datagrams, segment size if GSO). Fixed-size lists
        // on the stack where a latency-bound send (a request and the ACKs it carries) fits:
        // each heap list cost a malloc and a free per send.
        let mut plan = [(0usize, 0usize, None::<u16>); SENDMMSG_MSGS];
        let mut planned = 0;
        let mut j = 0;
        while j < ts.len() && planned < SENDMMSG_MSGS {
            let n = Self::gso_prefix(&ts[j..]);
            // In range: `gso_prefix` took the first length only if it fits a u16.
            let seg = (n > 1).then(|| ts[j].borrow().len() as u16);
            plan[planned] = (j, n, seg);
            planned += 1;
            j += n;
        }
        let plan = &plan[..planned];
        // A send with a GSO message goes out of the checksummed socket (Linux refuses UDP
        // GSO without a checksum); one of lone datagrams only (an ACK and a request of
        // another size, say) out of the plain one, with UDP checksum 0 as rxe sends.
        let fd = if plan.iter().any(|p| p.2.is_some()) {
            socks.gso().as_raw_fd()
        } else {
            socks.plain.as_raw_fd()
        };
        let v4 = match (self.ip, dst.ip()) {
            (IpAddr::V4(src), IpAddr::V4(d)) => Some((src, d)),
            _ => None,
        };
        // Each datagram's ICRC; for IPv4, segment i >= 1 of a GSO send gets the ICRC for
        // ID i.
        let mut icrc_stack = [[0u8; 4]; GSO_MAX_SEGMENTS];
        let mut icrc_heap = Vec::new();
        let icrcs: &mut [[u8; 4]] = if j <= icrc_stack.len() {
            &mut icrc_stack[..j]
        } else {
            icrc_heap.resize(j, [0u8; 4]);
            &mut icrc_heap
        };
        // The correction table of the last body length seen (a run has one or two).
        let mut table: Option<(usize, Arc<IdentDeltas>)> = None;
        for &(start, n, _) in plan {
            for (i, t) in ts[start..start + n].iter().map(Borrow::borrow).enumerate() {
                // SAFETY: inside the engine's pump, under the device lock that keeps a
                // gathered datagram's MR registered (`Link::gathers`).
                let mut icrc = unsafe { body_and_icrc(t) }.1;
                if let Some((src, d)) = v4
                    && i >= 1
                {
                    let body_bytes = t.len().saturating_sub(4);
                    let deltas = match &table {
                        Some((len, tab)) if *len == body_bytes => tab.clone(),
                        _ => {
                            let tab = self.ident_deltas(src, d, t.src_port, body_bytes);
                            table = Some((body_bytes, tab.clone()));
                            tab
                        }
                    };
                    // In range: a GSO send has at most GSO_MAX_SEGMENTS segments.
                    for (o, x) in icrc.iter_mut().zip(deltas[i]) {
                        *o ^= x;
                    }
                }
                icrcs[start + i] = icrc;
            }
        }
        // Every datagram's parts (up to three, then its ICRC), and each message's range.
        let none = TxPart::from(&[][..]);
        let mut part_stack = [none; 16];
        let mut part_heap: Vec<TxPart<'_>> = Vec::new();
        let parts: &mut [TxPart<'_>] = if 4 * j <= part_stack.len() {
            &mut part_stack[..]
        } else {
            part_heap.resize(4 * j, none);
            &mut part_heap
        };
        let mut msgs = [NO_MSG; SENDMMSG_MSGS];
        let mut np = 0;
        for (m, &(start, n, seg)) in msgs.iter_mut().zip(plan) {
            let first = np;
            for (t, icrc) in ts[start..start + n]
                .iter()
                .map(Borrow::borrow)
                .zip(&icrcs[start..start + n])
            {
                // SAFETY: as above.
                let (body, _) = unsafe { body_and_icrc(t) };
                for p in body.into_iter().filter(|p| !p.is_empty()) {
                    parts[np] = p;
                    np += 1;
                }
                parts[np] = TxPart::from(&icrc[..]);
                np += 1;
            }
            *m = GatheredMsg {
                first,
                count: np - first,
                segment_bytes: seg,
            };
        }
        let (parts, msgs) = (&parts[..np], &msgs[..planned]);
        // Small datagrams go as one iovec per message, copied here: the kernel's cost per
        // iovec is larger than the copy ([`STAGE_MAX_DATAGRAM`]).
        let stage = np > planned
            && ts[..j]
                .iter()
                .all(|t| t.borrow().len() <= STAGE_MAX_DATAGRAM);
        let mut staging = if stage {
            STAGING.with(|s| s.take())
        } else {
            Vec::new()
        };
        let staged;
        let (parts, msgs) = if stage {
            staged = stage_messages(parts, msgs, &mut staging);
            staged.as_slices()
        } else {
            (parts, msgs)
        };
        self.tx_syscalls.fetch_add(1, Ordering::Relaxed);
        let sent = match msgs {
            [one] => match one.segment_bytes {
                Some(seg) => send_gso_gather(fd, dst, parts, seg, ip),
                None => super::batch::send_parts(fd, dst, parts, ip),
            }
            .map(|()| 1),
            _ => send_gathered_batch(fd, dst, parts, msgs, ip),
        };
        if stage {
            STAGING.with(|s| s.replace(staging));
        }
        match sent {
            // (A kernel that took none without an error is treated as an error below, so
            // the caller always moves on.)
            Ok(m) if m > 0 => {
                let m = m.min(plan.len());
                let datagrams: usize = plan[..m].iter().map(|p| p.1).sum();
                let gso = plan[..m].iter().filter(|p| p.2.is_some()).count();
                self.tx_gso_sends.fetch_add(gso as u64, Ordering::Relaxed);
                self.tx_datagrams
                    .fetch_add(datagrams as u64, Ordering::Relaxed);
                Ok((datagrams, 0))
            }
            Err(e) if plan[0].2.is_some() && gso_refused(&e) => {
                self.gso.store(false, Ordering::Relaxed);
                Err(())
            }
            // Another error (e.g. no buffer space) on the first message: its datagrams are
            // lost, as a plain send error would lose them; the transport retransmits.
            Ok(_) | Err(_) => Ok((plan[0].1, plan[0].1)),
        }
    }

    /// What to XOR into the ICRC of an IPv4 datagram with a `body_bytes`-byte body (all but
    /// the ICRC), computed for IP ID 0 on the flow from this link's address and `src_port`
    /// to `dst`:4791, to make it the ICRC for ID `i`: entry `i` of the returned table, for
    /// the IDs 0..64 of a GSO send's segments (entry 0 is zero).
    ///
    /// The ICRC is affine in the bits it covers, so `icrc(id, body) = icrc(0, body) ⊕ L(id)`
    /// with `L` linear in the 16 ID bits and depending only on the flow and the length:
    /// `L` of the six bits an ID below 64 uses costs six CRC passes over a zero body, and
    /// every entry is an XOR of those. One table per (flow, length) is cached: a bulk flow
    /// uses a handful of lengths, and a GSO send looks its table up once per length instead
    /// of once per segment.
    pub(super) fn ident_deltas(
        &self,
        src: std::net::Ipv4Addr,
        dst: std::net::Ipv4Addr,
        src_port: u16,
        body_bytes: usize,
    ) -> Arc<IdentDeltas> {
        let key = (dst, src_port, body_bytes);
        let mut cache = self.ident_deltas.lock();
        if let Some(d) = cache.get(&key) {
            return d.clone();
        }
        let zeros = vec![0u8; body_bytes];
        let flow = |ident| IcrcIp::V4 {
            src,
            dst,
            ident,
            src_port,
            dst_port: ROCE_V2_UDP_PORT,
        };
        let base = u32::from_le_bytes(icrc_of_body(&flow(0), &zeros));
        let bits: Vec<u32> = (0..GSO_MAX_SEGMENTS.trailing_zeros())
            .map(|b| u32::from_le_bytes(icrc_of_body(&flow(1 << b), &zeros)) ^ base)
            .collect();
        let mut table = [[0u8; 4]; GSO_MAX_SEGMENTS];
        for (i, d) in table.iter_mut().enumerate() {
            let l = bits
                .iter()
                .enumerate()
                .filter(|(b, _)| i >> b & 1 == 1)
                .fold(0, |acc, (_, v)| acc ^ v);
            *d = l.to_le_bytes();
        }
        let table = Arc::new(table);
        if cache.len() >= IDENT_DELTA_CACHE {
            cache.clear();
        }
        cache.insert(key, table.clone());
        table
    }

    pub(super) fn socket_for(&self, port: u16) -> io::Result<Arc<SendSockets>> {
        let mut map = self.send.lock();
        if let Some(s) = map.get(&port) {
            return Ok(s.clone());
        }
        let s = Arc::new(SendSockets {
            ip: self.ip,
            port,
            plain: send_socket(self.ip, port, false)?,
            gso: OnceLock::new(),
        });
        map.insert(port, s.clone());
        Ok(s)
    }

    /// The cmsgs that give `t` its address vector's IP fields: none for traffic class 0 and
    /// the route's hop limit, the common case, which so costs nothing per datagram.
    pub(super) fn ip_cmsg(&self, t: &Transmit) -> IpCmsg {
        IpCmsg {
            v6: self.ip.is_ipv6(),
            traffic_class: (t.ip.traffic_class != 0).then_some(t.ip.traffic_class),
            hop_limit: t.ip.hop_limit,
        }
    }

    /// The IP and UDP header fields Linux writes for `t` sent from a checksum-free send
    /// socket (a lone datagram, as every datagram is while a capture runs): IPv4 ID 0 (DF,
    /// unconnected socket), the traffic class and hop limit of `t`'s cmsgs or the socket's
    /// defaults (the route's TTL; 1 for multicast), flow label 0, UDP checksum 0.
    fn sent_header(&self, t: &Transmit) -> SentHeader {
        let ip = self.ip_cmsg(t);
        let default_hops = if t.dst.is_multicast() {
            1
        } else {
            self.hop_limit
        };
        SentHeader {
            ident: 0,
            traffic_class: ip.traffic_class.unwrap_or(0),
            hop_limit: ip
                .hop_limit
                .filter(|h| ip.v6 || *h != 0)
                .unwrap_or(default_hops),
            udp_checksum: false,
        }
    }
}

impl Link for UdpLink {
    fn shared_counters(&self) -> Option<Arc<dyn crate::verbs::SharedCounters>> {
        let c = self.share.as_ref()?.counters();
        Some(c)
    }

    fn poll_unreachable(&self) -> Option<IpAddr> {
        self.take_icmp_errors();
        self.unreachable.lock().pop_front()
    }

    fn gathers(&self) -> bool {
        // A capture records each datagram whole; without one, payloads go out from the MR.
        self.capture.is_none()
    }

    fn send(&self, t: &Transmit) -> io::Result<()> {
        let s = &self.socket_for(t.src_port)?.plain;
        let dst = roce_addr(t.dst);
        let ip = self.ip_cmsg(t);
        // SAFETY: `send` runs inside the engine's pump, under the device lock that keeps a
        // gathered datagram's MR registered (`Link::gathers`).
        let parts = unsafe { t.parts() };
        let send = || {
            if t.tail.is_some() || ip != IpCmsg::default() {
                super::batch::send_parts(s.as_raw_fd(), &dst, &parts, ip)
            } else {
                s.send_to(&t.payload, dst).map(|_| ())
            }
        };
        match &self.capture {
            Some(c) => {
                let src = SocketAddr::new(self.ip, t.src_port);
                let mut whole = Vec::with_capacity(t.len());
                parts.iter().for_each(|p| p.copy_into(&mut whole));
                c.send_and_record(src, dst, &whole, &self.sent_header(t), send)?;
            }
            None => match send() {
                // An ICMP error for an earlier datagram of this socket failed this send (the
                // kernel reports it once, sending nothing): keep it for the CM (QP1) or log
                // it (a QP's), and send again.
                Err(e) if super::icmp::is_icmp_errno(&e) => {
                    self.take_icmp_errors_of(t.src_port);
                    send()?;
                }
                r => r?,
            },
        }
        self.tx_datagrams.fetch_add(1, Ordering::Relaxed);
        self.tx_syscalls.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn join_multicast(&self, group: IpAddr) -> io::Result<()> {
        let s = super::mcast::join(self.ip, group)?;
        let mut groups = self.mcast.lock();
        groups.insert(group, Arc::new(s));
        self.mcast_groups.store(groups.len(), Ordering::Relaxed);
        Ok(())
    }

    fn leave_multicast(&self, group: IpAddr) {
        // Closing the socket leaves the group.
        let mut groups = self.mcast.lock();
        groups.remove(&group);
        self.mcast_groups.store(groups.len(), Ordering::Relaxed);
    }

    fn send_batch(&self, ts: &[Transmit]) -> usize {
        if ts.first().is_some_and(|t| t.src_port == gsi_source_port()) {
            // QP1's MADs (a pump's datagrams share their QP's port): one by one through
            // `send`, which handles the ICMP errors their socket reports. The ACKs held
            // back go first: a MAD can end the connection they acknowledge (a DREQ moves
            // the peer's QP to ERR, kernel cma.c, and an ACK behind it is dropped, so the
            // peer flushes SENDs we received; seen with ucmatose against rxe).
            self.flush_deferred();
            return ts.iter().filter(|t| self.send(t).is_err()).count();
        }
        if self.holding_acks.load(Ordering::Relaxed) && ts.iter().all(may_wait) {
            // ACKs only: they wait for the end of the receive batch (driver thread) or the
            // next poll (busy polling, so the application's reply goes first).
            let mut held = self.deferred.lock();
            if held.is_empty() {
                self.held_since
                    .store(self.nanos().saturating_add(1), Ordering::Relaxed);
            }
            held.extend(ts.iter().cloned());
            return 0;
        }
        // Held ACKs go before any other response (READ responses, ACKs), which share their
        // PSN order; requests (the other direction's stream) need not wait for them.
        if ts.iter().any(|t| t.kind.is_response()) {
            self.flush_deferred();
        } else if ts.len() <= PIGGYBACK_MAX {
            // A few requests (an application's reply to what a busy poll delivered) take the
            // held ACKs along in the same system call: on one flow they form one GSO send
            // (the shorter ACK last), so the peer gets both in one receive.
            let mut held = self.deferred.lock();
            if !held.is_empty() {
                let all: Vec<&Transmit> = ts.iter().chain(held.iter()).collect();
                // Sent under the lock, as `flush_deferred` does, so no response of another
                // thread overtakes these ACKs on the wire.
                let failed = self.send_now(&all);
                drop(all);
                self.release_held(&mut held);
                self.rx_at_flush
                    .store(self.rx_datagrams.load(Ordering::Relaxed), Ordering::Relaxed);
                return failed;
            }
        }
        self.send_now(ts)
    }

    fn source_port(&self, want: u16) -> u16 {
        if self.socket_for(want).is_ok() {
            return want;
        }
        // Another process holds that port: take the next free one in rxe's range.
        (0..0x3fffu16)
            .map(|i| 0xc000 | ((want.wrapping_add(i + 1)) & 0x3fff))
            .find(|p| self.socket_for(*p).is_ok())
            .unwrap_or(want)
    }
}

/// The largest datagram (bytes, headers to ICRC) that [`UdpLink::send_gso_batch`] copies
/// into one buffer with the rest of its message instead of gathering it from its parts
/// (headers, payload, pad, ICRC: three or four iovecs). The kernel's cost per iovec is
/// larger than the copy for small datagrams: a C microbenchmark of a 29-segment GSO send of
/// 96-byte datagrams on loopback to a GRO socket took 280-330 ns per datagram in `sendmsg`
/// gathered from three iovecs each and 180-250 ns from one (a 2-segment send: 6.2 against
/// 5.6 µs); docs/performance.md, "One iovec per send for small datagrams".
const STAGE_MAX_DATAGRAM: usize = 512;

thread_local! {
    /// The buffer a thread's small-datagram sends are copied into ([`STAGE_MAX_DATAGRAM`]),
    /// kept for its next send (at most [`SENDMMSG_MSGS`] × 64 × 512 bytes).
    static STAGING: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
}

/// An empty entry of a list of [`GatheredMsg`]s.
const NO_MSG: GatheredMsg = GatheredMsg {
    first: 0,
    count: 0,
    segment_bytes: None,
};

/// The messages of a send as [`stage_messages`] copied them: message `k` is `parts[k]`,
/// one part in the staging buffer, with `msgs[k]` naming it; `n` of each are used.
struct Staged<'s> {
    parts: [TxPart<'s>; SENDMMSG_MSGS],
    msgs: [GatheredMsg; SENDMMSG_MSGS],
    n: usize,
}

impl<'s> Staged<'s> {
    /// The used parts and messages, as `send_gathered_batch` takes them.
    fn as_slices(&self) -> (&[TxPart<'s>], &[GatheredMsg]) {
        (&self.parts[..self.n], &self.msgs[..self.n])
    }
}

/// Copies each of `msgs` (runs of `parts`, at most [`SENDMMSG_MSGS`]) into `staging`, one
/// after the other, and returns the same messages as one part each, over `staging`. The
/// parts' bytes are read as [`TxPart::copy_into`] says (registered memory under the
/// caller's device lock).
fn stage_messages<'s>(
    parts: &[TxPart<'_>],
    msgs: &[GatheredMsg],
    staging: &'s mut Vec<u8>,
) -> Staged<'s> {
    staging.clear();
    let mut ends = [0usize; SENDMMSG_MSGS];
    for (end, m) in ends.iter_mut().zip(msgs) {
        for p in parts.get(m.first..m.first + m.count).unwrap_or_default() {
            p.copy_into(staging);
        }
        *end = staging.len();
    }
    let staging: &'s [u8] = staging;
    let mut staged = Staged {
        parts: [TxPart::from(&[][..]); SENDMMSG_MSGS],
        msgs: [NO_MSG; SENDMMSG_MSGS],
        n: msgs.len().min(SENDMMSG_MSGS),
    };
    let mut start = 0;
    for (k, (m, &end)) in msgs.iter().zip(&ends).enumerate() {
        staged.parts[k] = TxPart::from(staging.get(start..end).unwrap_or_default());
        staged.msgs[k] = GatheredMsg {
            first: k,
            count: 1,
            segment_bytes: m.segment_bytes,
        };
        start = end;
    }
    staged
}
