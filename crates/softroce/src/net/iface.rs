//! Net: the network interface that owns a device's address, its MTU and its link speed.
//!
//! rdma_cm sizes a RoCE route's path MTU from the MTU of the interface the route leaves by
//! (`cma.c` `cma_resolve_iboe_route`), so softroce's librdmacm asks here for the MTU of the
//! interface holding its device's address. Lookups use the calling thread's network namespace
//! (`getifaddrs`, then `SIOCGIFMTU` or `SIOCETHTOOL` on a UDP socket), never `/sys`, which
//! shows the namespace that mounted it.

use std::ffi::CStr;
use std::net::IpAddr;

/// The MTU in bytes of the interface holding address `ip` (the netdev MTU: the largest IP
/// packet, e.g. 1500 on Ethernet, 65536 on Linux `lo`). Errors: None when no interface holds
/// `ip` or the system calls fail.
pub fn link_mtu(ip: IpAddr) -> Option<u32> {
    let name = interface_of(ip)?;
    interface_mtu(&name)
}

/// The active MTU kernel rxe gives its port on a netdev of `netdev_mtu` bytes: the largest IB
/// MTU not above `netdev_mtu` − 80 (`RXE_MAX_HDR_LENGTH`), 256 when not even that fits, at
/// most 4096 (rxe_net.c `rxe_set_mtu`, rxe_param.h `eth_mtu_int_to_enum`): 1024 on a
/// 1500-byte Ethernet link, 4096 on `lo` (65536).
pub fn rxe_port_mtu(netdev_mtu: u32) -> crate::transport::PathMtu {
    use crate::transport::PathMtu;
    PathMtu::largest_fitting(netdev_mtu.saturating_sub(80)).unwrap_or(PathMtu::Mtu256)
}

/// The link speed in Mb/s of the interface a device on `ip` sends by ([`interface_name`]),
/// as ethtool reports it (`ETHTOOL_GSET`): 10000 on a veth, for example. None when the
/// interface reports none: Linux `lo` has no such ethtool operation, a virtio NIC and a link
/// that is down report SPEED_UNKNOWN; also when no interface does or a system call fails.
pub fn link_speed_mbps(ip: IpAddr) -> Option<u32> {
    let name = find_interface(ip, true)?;
    interface_speed(&name)
}

/// `(active_speed, active_width)`, the `IB_SPEED_*` and `IB_WIDTH_*` codes kernel rxe gives
/// its port on a netdev of `mbps` Mb/s (None: unknown, taken as 1000), as
/// `ib_get_eth_speed` maps them (drivers/infiniband/core/verbs.c, Linux 6.1): up to 1 Gb/s
/// SDR 1X (2.5 Gb/s, also `lo`), 10 Gb/s FDR10 1X, 20 Gb/s DDR 4X, 25 Gb/s EDR 1X, 40 Gb/s
/// FDR10 4X, faster EDR 4X.
pub fn rxe_port_rate(mbps: Option<u32>) -> (u8, u8) {
    const SDR: u8 = 1;
    const DDR: u8 = 2;
    const FDR10: u8 = 8;
    const EDR: u8 = 32;
    const W1X: u8 = 1;
    const W4X: u8 = 2;
    match mbps.unwrap_or(1000) {
        0..=1000 => (SDR, W1X),
        1001..=10_000 => (FDR10, W1X),
        10_001..=20_000 => (DDR, W4X),
        20_001..=25_000 => (EDR, W1X),
        25_001..=40_000 => (FDR10, W4X),
        _ => (EDR, W4X),
    }
}

/// Sets in `cfg` what kernel rxe derives from the netdev holding `cfg.ip`: the active MTU,
/// capped at [`rxe_port_mtu`] of the link's MTU, and the speed and width
/// ([`rxe_port_rate`] of the link's speed).
pub fn set_rxe_port(cfg: &mut crate::verbs::DeviceConfig) {
    if let Some(mtu) = link_mtu(cfg.ip) {
        cfg.active_mtu = cfg.active_mtu.min(rxe_port_mtu(mtu));
    }
    (cfg.active_speed, cfg.active_width) = rxe_port_rate(link_speed_mbps(cfg.ip));
}

/// The name of the interface holding `ip`, from `getifaddrs`.
fn interface_of(ip: IpAddr) -> Option<Vec<u8>> {
    find_interface(ip, false)
}

/// The name of the network interface (netdev) a device on `ip` sends by, what kernel rxe's
/// GID entries name as their `ndev` (`/sys/class/infiniband/*/ports/1/gid_attrs/ndevs/N`):
/// the interface that holds `ip`, else the one whose subnet contains it (Linux `lo` for a
/// loopback address such as 127.0.77.1, which is bound without being configured). None when
/// no interface does or the system call fails.
pub fn interface_name(ip: IpAddr) -> Option<String> {
    let name = find_interface(ip, true)?;
    String::from_utf8(name).ok()
}

/// True when `a` and `b` have the same first `prefix` bits.
fn same_prefix(a: &[u8], b: &[u8], prefix: u32) -> bool {
    let mut left = prefix as usize;
    for (x, y) in a.iter().zip(b) {
        if left == 0 {
            return true;
        }
        let bits = left.min(8);
        let mask = !0u8 << (8 - bits);
        if x & mask != y & mask {
            return false;
        }
        left -= bits;
    }
    a.len() == b.len()
}

/// Bytes of an address: 4 for IPv4, 16 for IPv6.
fn ip_bytes(ip: IpAddr) -> Vec<u8> {
    match ip {
        IpAddr::V4(v4) => v4.octets().to_vec(),
        IpAddr::V6(v6) => v6.octets().to_vec(),
    }
}

/// The interface holding `ip` exactly; with `subnet`, failing that the first whose address
/// and netmask contain it.
fn find_interface(ip: IpAddr, subnet: bool) -> Option<Vec<u8>> {
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs writes a list head we own until freeifaddrs.
    if unsafe { libc::getifaddrs(&mut list) } != 0 {
        return None;
    }
    let mut exact = None;
    let mut containing = None;
    let want = ip_bytes(ip);
    let mut cur = list;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned, alive until freeifaddrs.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        if ifa.ifa_addr.is_null() || ifa.ifa_name.is_null() {
            continue;
        }
        // SAFETY: a non-null ifa_addr points at a sockaddr of the family it names.
        let addr = unsafe { super::sockaddr::socket_addr_from_ptr(ifa.ifa_addr) }.map(|a| a.ip());
        // SAFETY: ifa_name is a NUL-terminated interface name owned by the list.
        let name = || unsafe { CStr::from_ptr(ifa.ifa_name) }.to_bytes().to_vec();
        if addr == Some(ip) {
            exact = Some(name());
            break;
        }
        if !subnet || containing.is_some() || ifa.ifa_netmask.is_null() {
            continue;
        }
        // SAFETY: a non-null ifa_netmask points at a sockaddr of the address's family.
        let mask =
            unsafe { super::sockaddr::socket_addr_from_ptr(ifa.ifa_netmask) }.map(|a| a.ip());
        if let (Some(a), Some(m)) = (addr, mask) {
            let prefix: u32 = ip_bytes(m).iter().map(|b| b.count_ones()).sum();
            let a = ip_bytes(a);
            if a.len() == want.len() && same_prefix(&a, &want, prefix) {
                containing = Some(name());
            }
        }
    }
    // SAFETY: the list from getifaddrs, freed once; nothing of it is used afterwards.
    unsafe { libc::freeifaddrs(list) };
    exact.or(containing)
}

/// `struct ethtool_cmd` of linux/ethtool.h, the legacy `ETHTOOL_GSET` answer (44 bytes).
#[repr(C)]
#[derive(Default)]
struct EthtoolCmd {
    cmd: u32,
    supported: u32,
    advertising: u32,
    speed: u16,
    duplex: u8,
    port: u8,
    phy_address: u8,
    transceiver: u8,
    autoneg: u8,
    mdio_support: u8,
    maxtxpkt: u32,
    maxrxpkt: u32,
    speed_hi: u16,
    eth_tp_mdix: u8,
    eth_tp_mdix_ctrl: u8,
    lp_advertising: u32,
    reserved: [u32; 2],
}

/// linux/ethtool.h `ETHTOOL_GSET`; linux/sockios.h `SIOCETHTOOL`.
const ETHTOOL_GSET: u32 = 0x1;
const SIOCETHTOOL: libc::c_ulong = 0x8946;

/// The link speed in Mb/s of interface `name` (`SIOCETHTOOL` `ETHTOOL_GSET`, which needs no
/// privilege); None when the driver has none to give or reports SPEED_UNKNOWN.
fn interface_speed(name: &[u8]) -> Option<u32> {
    // SAFETY: a zeroed ifreq is a valid value (integers and arrays).
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    if name.len() >= req.ifr_name.len() {
        return None;
    }
    for (d, &s) in req.ifr_name.iter_mut().zip(name) {
        *d = s as libc::c_char;
    }
    let mut cmd = EthtoolCmd {
        cmd: ETHTOOL_GSET,
        ..EthtoolCmd::default()
    };
    req.ifr_ifru.ifru_data = (&raw mut cmd).cast();
    // SAFETY: a plain socket(2) call; the descriptor is closed below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return None;
    }
    // SAFETY: SIOCETHTOOL reads ifr_name and the command at ifr_data, which points at `cmd`
    // (alive and unmoved until the call returns), and writes at most an ethtool_cmd there.
    let rc = unsafe { libc::ioctl(fd, SIOCETHTOOL, &mut req) };
    // SAFETY: our descriptor, closed once.
    unsafe { libc::close(fd) };
    if rc != 0 {
        return None;
    }
    // ethtool_cmd_speed(): SPEED_UNKNOWN is -1, all ones.
    let speed = u32::from(cmd.speed) | u32::from(cmd.speed_hi) << 16;
    (speed != u32::MAX).then_some(speed)
}

/// The MTU of interface `name` (`SIOCGIFMTU`).
fn interface_mtu(name: &[u8]) -> Option<u32> {
    // SAFETY: a zeroed ifreq is a valid value (integers and arrays).
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    if name.len() >= req.ifr_name.len() {
        return None;
    }
    for (d, &s) in req.ifr_name.iter_mut().zip(name) {
        *d = s as libc::c_char;
    }
    // SAFETY: a plain socket(2) call; the descriptor is closed below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return None;
    }
    // SAFETY: SIOCGIFMTU reads ifr_name and writes ifr_mtu of the ifreq we own.
    let rc = unsafe { libc::ioctl(fd, libc::SIOCGIFMTU, &mut req) };
    // SAFETY: our descriptor, closed once.
    unsafe { libc::close(fd) };
    if rc != 0 {
        return None;
    }
    // SAFETY: after a successful SIOCGIFMTU the union holds ifru_mtu.
    u32::try_from(unsafe { req.ifr_ifru.ifru_mtu }).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    #[test]
    fn rxe_port_mtu_follows_rxe_set_mtu() {
        use crate::transport::PathMtu::*;
        for (netdev, want) in [
            (65536, Mtu4096),
            (4176, Mtu4096),
            (4175, Mtu2048),
            (2128, Mtu2048),
            (2127, Mtu1024),
            (1500, Mtu1024),
            (1104, Mtu1024),
            (1103, Mtu512),
            (592, Mtu512),
            (591, Mtu256),
            (0, Mtu256),
        ] {
            assert_eq!(rxe_port_mtu(netdev), want, "netdev MTU {netdev}");
        }
    }

    #[test]
    fn rxe_port_rate_follows_ib_get_eth_speed() {
        for (mbps, want) in [
            (None, (1, 1)),
            (Some(10), (1, 1)), // a tun/tap device
            (Some(1000), (1, 1)),
            (Some(1001), (8, 1)),
            (Some(10_000), (8, 1)), // a veth
            (Some(20_000), (2, 2)),
            (Some(25_000), (32, 1)),
            (Some(40_000), (8, 2)),
            (Some(100_000), (32, 2)),
        ] {
            assert_eq!(rxe_port_rate(mbps), want, "{mbps:?} Mb/s");
        }
        assert_eq!(std::mem::size_of::<EthtoolCmd>(), 44);
    }

    #[test]
    fn the_loopback_interface_has_no_link_speed() {
        // Linux `lo` has no ethtool link settings: rxe takes it as 1 Gb/s, SDR 1X.
        assert_eq!(
            link_speed_mbps(IpAddr::V4(Ipv4Addr::new(127, 0, 77, 1))),
            None
        );
    }

    #[test]
    fn a_loopback_address_is_on_the_loopback_interface() {
        // 127.0.0.1 is configured on lo; 127.0.77.1 is only inside its 127.0.0.0/8.
        let lo = interface_name(IpAddr::V4(Ipv4Addr::LOCALHOST));
        assert!(lo.is_some(), "no interface holds 127.0.0.1");
        assert_eq!(interface_name(IpAddr::V4(Ipv4Addr::new(127, 0, 77, 1))), lo);
        assert!(same_prefix(&[10, 1, 2, 3], &[10, 1, 255, 0], 16));
        assert!(!same_prefix(&[10, 1, 2, 3], &[10, 2, 2, 3], 16));
    }

    #[test]
    fn loopback_has_the_loopback_mtu() {
        // Linux lo: 65536 since 3.x; any namespace has lo with 127.0.0.1 once it is up.
        let mtu = link_mtu(IpAddr::V4(Ipv4Addr::LOCALHOST));
        assert!(mtu.is_some_and(|m| m >= 1500), "lo MTU {mtu:?}");
    }

    #[test]
    fn an_address_no_interface_holds_has_no_mtu() {
        // TEST-NET-3 (RFC 5737) is never assigned to a host's interface.
        assert_eq!(link_mtu(IpAddr::V4(Ipv4Addr::new(203, 0, 113, 254))), None);
    }
}
