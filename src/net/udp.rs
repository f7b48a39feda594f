//! UDP sockets and the driver thread of a device.

use super::SystemClock;
use crate::transport::Transmit;
use crate::verbs::{Device, DeviceConfig, Link};
use crate::wire::ROCE_V2_UDP_PORT;
use parking_lot::Mutex;
use rustix::net::sockopt;
use socket2::{Domain, Protocol, Socket, Type};
use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

/// Socket receive buffer we ask for, in bytes: room for a 128-PSN window of 4 KiB packets
/// from several QPs. Root gets it (SO_RCVBUFFORCE); others get up to `net.core.rmem_max`.
const RCVBUF_BYTES: usize = 8 << 20;
/// Longest the driver thread sleeps between timer checks.
const MAX_PARK: Duration = Duration::from_millis(5);

fn new_udp(ip: IpAddr, port: u16, reuse: bool) -> io::Result<UdpSocket> {
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
    }
    s.bind(&SocketAddr::new(ip, port).into())?;
    let u: UdpSocket = s.into();
    if ip.is_ipv4() {
        // Unconnected + IP_PMTUDISC_DO: Linux writes IPv4 ID 0 and DF on every datagram
        // (FACTS §0.2), so the ICRC we computed over ID 0 is the one on the wire.
        sockopt::set_ip_mtu_discover(&u, sockopt::Ipv4PathMtuDiscovery::DO)?;
    }
    Ok(u)
}

/// The UDP side of a device: a receive socket on port 4791 and send sockets per source port.
#[derive(Debug)]
pub struct UdpLink {
    ip: IpAddr,
    recv: UdpSocket,
    send: Mutex<HashMap<u16, Arc<UdpSocket>>>,
    /// Datagrams sent.
    pub tx_datagrams: AtomicU64,
    /// Datagrams received.
    pub rx_datagrams: AtomicU64,
}

impl UdpLink {
    /// Binds `ip`:4791 for receiving. Errors: the bind error (EADDRINUSE when another
    /// process — or kernel rxe — owns the port on that address).
    pub fn bind(ip: IpAddr) -> io::Result<UdpLink> {
        let recv = new_udp(ip, ROCE_V2_UDP_PORT, false)?;
        if sockopt::set_socket_recv_buffer_size_force(&recv, RCVBUF_BYTES).is_err() {
            let _ = sockopt::set_socket_recv_buffer_size(&recv, RCVBUF_BYTES);
        }
        Ok(UdpLink {
            ip,
            recv,
            send: Mutex::new(HashMap::new()),
            tx_datagrams: AtomicU64::new(0),
            rx_datagrams: AtomicU64::new(0),
        })
    }

    fn socket_for(&self, port: u16) -> io::Result<Arc<UdpSocket>> {
        let mut map = self.send.lock();
        if let Some(s) = map.get(&port) {
            return Ok(s.clone());
        }
        let s = Arc::new(new_udp(self.ip, port, true)?);
        map.insert(port, s.clone());
        Ok(s)
    }
}

impl Link for UdpLink {
    fn send(&self, t: &Transmit) -> io::Result<()> {
        let s = self.socket_for(t.src_port)?;
        s.send_to(&t.payload, SocketAddr::new(t.dst, ROCE_V2_UDP_PORT))?;
        self.tx_datagrams.fetch_add(1, Ordering::Relaxed);
        Ok(())
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
/// thread.
#[derive(Debug)]
pub struct UdpDevice {
    device: Device,
    link: Arc<UdpLink>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl UdpDevice {
    /// Opens device `name` on `ip` (port 4791) with the system clock and starts its driver.
    /// Errors: socket errors (e.g. EADDRINUSE, EADDRNOTAVAIL for an address not on this host).
    pub fn open(name: &str, ip: IpAddr) -> io::Result<UdpDevice> {
        UdpDevice::open_with(DeviceConfig::new(name, ip))
    }

    /// Opens a device from a full config.
    pub fn open_with(cfg: DeviceConfig) -> io::Result<UdpDevice> {
        let link = Arc::new(UdpLink::bind(cfg.ip)?);
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
    }
}

/// The driver loop: receive → `handle_datagram` → (engine sends answers); between
/// datagrams, run due timers. Sleeps at most [`MAX_PARK`] so a timer armed by another
/// thread is served late by at most that much.
fn drive(device: &Device, link: &UdpLink, stop: &AtomicBool) {
    let mut buf = vec![0u8; 65536];
    while !stop.load(Ordering::Relaxed) {
        let park = device
            .next_timeout()
            .map_or(MAX_PARK, |d| d.clamp(Duration::from_micros(1), MAX_PARK));
        let _ = link.recv.set_read_timeout(Some(park));
        match link.recv.recv_from(&mut buf) {
            Ok((n, src)) => {
                link.rx_datagrams.fetch_add(1, Ordering::Relaxed);
                device.handle_datagram(src, &buf[..n]);
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) => {}
            Err(_) => std::thread::sleep(Duration::from_millis(1)),
        }
        device.handle_timeouts();
    }
}
