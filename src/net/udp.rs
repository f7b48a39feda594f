//! UDP sockets and the driver thread of a device.
//!
//! A device owns UDP port 4791 on its address (IPv4, or IPv6 with `IPV6_V6ONLY`), sends from
//! one unconnected socket per UDP source port, and runs one driver thread that receives,
//! feeds [`Device::handle_datagram`] and runs timers. [`UdpOptions`] add the exact
//! receive-side ICRC mode (a raw socket beside the UDP one, `net::raw`) and a pcap capture
//! ([`Capture`]).

use super::SystemClock;
use super::pcap::{Capture, roce_addr};
use super::raw::{RawRx, drop_everything};
use crate::transport::Transmit;
use crate::verbs::{Device, DeviceConfig, Link};
use crate::wire::ROCE_V2_UDP_PORT;
use parking_lot::Mutex;
use rustix::net::sockopt;
use socket2::{Domain, Protocol, Socket, Type};
use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

/// Socket receive buffer we ask for, in bytes: room for a 128-PSN window of 4 KiB packets
/// from several QPs. Root gets it (SO_RCVBUFFORCE); others get up to `net.core.rmem_max`.
const RCVBUF_BYTES: usize = 8 << 20;
/// Longest the driver thread sleeps between timer checks.
const MAX_PARK: Duration = Duration::from_millis(5);

/// Lets an IPv6 UDP socket accept datagrams whose UDP checksum is 0. Kernel rxe sends IPv6
/// UDP with checksum 0 (its tunnel socket allows it), which a plain Linux IPv6 socket drops
/// unless `UDP_NO_CHECK6_RX` is set. Source: FACTS §0.10; Linux `net/ipv6/udp.c`
/// (`udpv6_queue_rcv_one_skb` / `udp6_csum_init`), `include/uapi/linux/udp.h`.
pub(super) fn set_udp_no_check6_rx(s: &Socket) -> io::Result<()> {
    let on: libc::c_int = 1;
    // SAFETY: `s` is an open socket for the whole call; the option value points at a live
    // `c_int` on this stack frame and the length passed is exactly its size, so the kernel
    // reads only initialised memory that outlives the call. rustix and socket2 have no safe
    // wrapper for this option.
    let rc = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_UDP,
            libc::UDP_NO_CHECK6_RX,
            (&raw const on).cast::<libc::c_void>(),
            core::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

fn new_socket(ip: IpAddr, port: u16, reuse: bool) -> io::Result<Socket> {
    let domain = if ip.is_ipv4() {
        Domain::IPV4
    } else {
        Domain::IPV6
    };
    let s = Socket::new(domain, Type::DGRAM, Some(Protocol::UDP))?;
    if reuse {
        s.set_reuse_address(true)?;
        s.set_reuse_port(true)?;
    }
    if ip.is_ipv6() {
        s.set_only_v6(true)?;
        set_udp_no_check6_rx(&s)?;
    }
    s.bind(&SocketAddr::new(ip, port).into())?;
    if ip.is_ipv4() {
        // Unconnected + IP_PMTUDISC_DO: Linux writes IPv4 ID 0 and DF on every datagram
        // (FACTS §0.2), so the ICRC we computed over ID 0 is the one on the wire.
        sockopt::set_ip_mtu_discover(&s, sockopt::Ipv4PathMtuDiscovery::DO)?;
    }
    Ok(s)
}

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
}

/// Options that [`UdpDevice::open`] and [`UdpDevice::open_with`] use; see
/// [`UdpOptions::set_process_default`].
static PROCESS_DEFAULT: Mutex<Option<UdpOptions>> = Mutex::new(None);

impl UdpOptions {
    /// Makes `opts` the options of every device this process opens later with
    /// [`UdpDevice::open`] or [`UdpDevice::open_with`] (the CLI's `--pcap` and
    /// `--exact-icrc`, which so apply to every subcommand). [`UdpDevice::open_with_options`]
    /// ignores it.
    pub fn set_process_default(opts: UdpOptions) {
        *PROCESS_DEFAULT.lock() = Some(opts);
    }

    /// The options set by [`UdpOptions::set_process_default`], else the defaults.
    pub fn process_default() -> UdpOptions {
        PROCESS_DEFAULT.lock().clone().unwrap_or_default()
    }
}

/// The UDP side of a device: a receive socket on port 4791 and send sockets per source port,
/// plus, in exact ICRC mode, a raw receive socket.
#[derive(Debug)]
pub struct UdpLink {
    ip: IpAddr,
    recv: UdpSocket,
    raw: Option<RawRx>,
    send: Mutex<HashMap<u16, Arc<UdpSocket>>>,
    /// One socket per joined multicast group, bound to group:4791 (`super::mcast`).
    mcast: Mutex<HashMap<IpAddr, Arc<UdpSocket>>>,
    capture: Option<Arc<Capture>>,
    /// TTL / hop limit of our sockets (for the capture).
    hop_limit: u8,
    /// Datagrams sent.
    pub tx_datagrams: AtomicU64,
    /// Datagrams received.
    pub rx_datagrams: AtomicU64,
}

impl UdpLink {
    /// Binds `ip`:4791 for receiving. Errors: the bind error (EADDRINUSE when another
    /// process — or kernel rxe — owns the port on that address).
    pub fn bind(ip: IpAddr) -> io::Result<UdpLink> {
        UdpLink::bind_with(ip, &UdpOptions::default())
    }

    /// Binds `ip`:4791 with `opts`. Errors: as [`UdpLink::bind`]; with `exact_icrc` on IPv4,
    /// EPERM without CAP_NET_RAW.
    pub fn bind_with(ip: IpAddr, opts: &UdpOptions) -> io::Result<UdpLink> {
        let recv = new_socket(ip, ROCE_V2_UDP_PORT, false)?;
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
        Ok(UdpLink {
            ip,
            recv: recv.into(),
            raw,
            send: Mutex::new(HashMap::new()),
            mcast: Mutex::new(HashMap::new()),
            capture: opts.capture.clone(),
            hop_limit,
            tx_datagrams: AtomicU64::new(0),
            rx_datagrams: AtomicU64::new(0),
        })
    }

    /// True when received IPv4 packets are checked over their IP header as received.
    pub fn exact_icrc(&self) -> bool {
        self.raw.is_some()
    }

    /// The capture this link writes to, if any.
    pub fn capture(&self) -> Option<&Arc<Capture>> {
        self.capture.as_ref()
    }

    fn socket_for(&self, port: u16) -> io::Result<Arc<UdpSocket>> {
        let mut map = self.send.lock();
        if let Some(s) = map.get(&port) {
            return Ok(s.clone());
        }
        let s = new_socket(self.ip, port, true)?;
        // Multicast sends leave through the device's own interface (on loopback there is no
        // multicast route otherwise). Unicast is unaffected, so a failure is ignored.
        let _ = super::mcast::set_sending_interface(&s, self.ip);
        let s = Arc::new(UdpSocket::from(s));
        map.insert(port, s.clone());
        Ok(s)
    }
}

impl Link for UdpLink {
    fn send(&self, t: &Transmit) -> io::Result<()> {
        let s = self.socket_for(t.src_port)?;
        let dst = roce_addr(t.dst);
        let send = || s.send_to(&t.payload, dst).map(|_| ());
        match &self.capture {
            Some(c) => {
                let src = SocketAddr::new(self.ip, t.src_port);
                c.send_and_record(src, dst, &t.payload, self.hop_limit, send)?;
            }
            None => send()?,
        }
        self.tx_datagrams.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn join_multicast(&self, group: IpAddr) -> io::Result<()> {
        let s = super::mcast::join(self.ip, group)?;
        self.mcast.lock().insert(group, Arc::new(s));
        Ok(())
    }

    fn leave_multicast(&self, group: IpAddr) {
        // Closing the socket leaves the group.
        self.mcast.lock().remove(&group);
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

/// A device on real UDP, with its driver thread. Derefs to [`Device`]; dropping it stops the
/// thread and flushes its capture.
#[derive(Debug)]
pub struct UdpDevice {
    device: Device,
    link: Arc<UdpLink>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl UdpDevice {
    /// Opens device `name` on `ip` (port 4791) with the system clock and starts its driver,
    /// with the process's default options ([`UdpOptions::set_process_default`]).
    /// Errors: socket errors (e.g. EADDRINUSE, EADDRNOTAVAIL for an address not on this host).
    pub fn open(name: &str, ip: IpAddr) -> io::Result<UdpDevice> {
        UdpDevice::open_with(DeviceConfig::new(name, ip))
    }

    /// Opens a device from a full config, with the process's default options.
    pub fn open_with(cfg: DeviceConfig) -> io::Result<UdpDevice> {
        UdpDevice::open_with_options(cfg, &UdpOptions::process_default())
    }

    /// Opens a device from a full config and explicit options. Errors: as
    /// [`UdpDevice::open`]; with `exact_icrc` on IPv4, EPERM without CAP_NET_RAW.
    pub fn open_with_options(cfg: DeviceConfig, opts: &UdpOptions) -> io::Result<UdpDevice> {
        let link = Arc::new(UdpLink::bind_with(cfg.ip, opts).map_err(|e| {
            let hint = match e.kind() {
                io::ErrorKind::AddrInUse => {
                    "; another softroce device (or kernel rxe) owns that address's RoCEv2 port: \
                     use another address (all of 127.0.0.0/8 is loopback)"
                }
                io::ErrorKind::AddrNotAvailable => "; that address is not on this host",
                io::ErrorKind::PermissionDenied if opts.exact_icrc => {
                    "; --exact-icrc needs a raw socket (root or CAP_NET_RAW)"
                }
                _ => "",
            };
            io::Error::new(
                e.kind(),
                format!(
                    "opening device {} on {}:{}: {e}{hint}",
                    cfg.name, cfg.ip, ROCE_V2_UDP_PORT
                ),
            )
        })?);
        let device = Device::new(cfg, link.clone(), Arc::new(SystemClock::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (device, link, stop) = (device.clone(), link.clone(), stop.clone());
            std::thread::Builder::new()
                .name(format!("softroce-{}", device.name()))
                .spawn(move || drive(&device, &link, &stop))?
        };
        Ok(UdpDevice {
            device,
            link,
            stop,
            thread: Some(thread),
        })
    }

    /// The device.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The UDP link (datagram counters).
    pub fn link(&self) -> &UdpLink {
        &self.link
    }
}

impl core::ops::Deref for UdpDevice {
    type Target = Device;
    fn deref(&self) -> &Device {
        &self.device
    }
}

impl Drop for UdpDevice {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        if let Some(c) = &self.link.capture {
            let _ = c.flush();
        }
    }
}

/// The driver loop: receive → `handle_datagram` (or `handle_ip_packet` in exact mode) →
/// (engine sends answers); between datagrams, run due timers. Sleeps at most [`MAX_PARK`]
/// so a timer armed by another thread is served late by at most that much.
fn drive(device: &Device, link: &UdpLink, stop: &AtomicBool) {
    let mut buf = vec![0u8; 65536];
    let local = roce_addr(link.ip);
    while !stop.load(Ordering::Relaxed) {
        let mut park = device
            .next_timeout()
            .map_or(MAX_PARK, |d| d.clamp(Duration::from_micros(1), MAX_PARK));
        if !link.mcast.lock().is_empty() {
            // Group sockets are drained between receives on the unicast one.
            park = park.min(super::mcast::MAX_PARK);
        }
        let got = match &link.raw {
            Some(raw) => raw.recv(&mut buf, park).map(|n| (n, None)),
            None => {
                let _ = link.recv.set_read_timeout(Some(park));
                link.recv.recv_from(&mut buf).map(|(n, src)| (n, Some(src)))
            }
        };
        match got {
            Ok((n, src)) => {
                link.rx_datagrams.fetch_add(1, Ordering::Relaxed);
                let data = &buf[..n];
                match src {
                    Some(src) => {
                        if let Some(c) = &link.capture {
                            c.record_received_udp(src, local, data);
                        }
                        device.handle_datagram(src, data);
                    }
                    None => {
                        if let Some(c) = &link.capture {
                            c.record_received_ip(data);
                        }
                        device.handle_ip_packet(data);
                    }
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) => {}
            Err(_) => std::thread::sleep(Duration::from_millis(1)),
        }
        let groups: Vec<_> = link
            .mcast
            .lock()
            .iter()
            .map(|(g, s)| (*g, s.clone()))
            .collect();
        for (group, sock) in groups {
            super::mcast::drain(device, link, group, &sock, &mut buf);
        }
        device.handle_timeouts();
    }
}
