//! rdma_cm on top of the CM: its port spaces and service IDs, and the IP header
//! (`struct cma_hdr`) it puts at the start of the REQ and SIDR_REQ private data.
//! Panics: never after `check_len`. Allocation: none.
//! Source: kernel `include/rdma/rdma_cm.h`, `drivers/infiniband/core/cma.c`.

use super::bits::arr;
use crate::wire::be16;

/// rdma_cm port spaces: the high 16 of the low 32 bits of an rdma_cm service ID.
/// Source: kernel `include/rdma/rdma_cm.h` `enum rdma_ucm_port_space`, `cma.c`
/// `cma_get_service_id` (service ID = `RDMA_IB_IP_PS_*` | port).
pub mod port_space {
    /// IPoIB.
    pub const IPOIB: u16 = 0x0002;
    /// Connected, reliable (RC): rping, ucmatose, ib_send_bw -R.
    pub const TCP: u16 = 0x0106;
    /// Unreliable datagrams (UD, via SIDR): udaddy.
    pub const UDP: u16 = 0x0111;
    /// Native IB.
    pub const IB: u16 = 0x013f;
}

/// The rdma_cm service ID of `port` in `port_space`: `0x0000_0000_PPPP_pppp` with `PPPP` the
/// port space and `pppp` the port. Source: `cma.c` `cma_get_service_id`.
pub const fn rdma_cm_service_id(port_space: u16, port: u16) -> u64 {
    ((port_space as u64) << 16) | port as u64
}

/// The (port space, port) of an rdma_cm service ID, or `None` if the ID is not one (bits above
/// the low 32 set).
pub const fn rdma_cm_port(service_id: u64) -> Option<(u16, u16)> {
    if service_id >> 32 != 0 {
        return None;
    }
    Some(((service_id >> 16) as u16, service_id as u16))
}

header_view!(
    /// The rdma_cm IP header at the start of REQ and SIDR_REQ private data.
    ///
    /// Shape: 36 bytes: `cma_version` u8 at 0 (0x00), `ip_version` in the top 4 bits of byte 1
    /// (4 or 6), `port` u16 at 2..4 (the active side's port), `src_addr` at 4..20 and
    /// `dst_addr` at 20..36, each 16 bytes: an IPv6 address, or for IPv4 12 zero bytes and the
    /// address. Source: kernel `drivers/infiniband/core/cma.c` `struct cma_hdr`,
    /// `union cma_ip_addr`, `cma_format_hdr`.
    CmaHdr,
    36
);

impl<T: AsRef<[u8]>> CmaHdr<T> {
    /// CMA version (0).
    pub fn cma_version(&self) -> u8 {
        self.buffer.as_ref()[0]
    }
    /// IP version (4 or 6) from the top nibble of byte 1.
    pub fn ip_version(&self) -> u8 {
        self.buffer.as_ref()[1] >> 4
    }
    /// The active side's port.
    pub fn port(&self) -> u16 {
        be16(&self.buffer.as_ref()[2..4])
    }
    /// The source (active side) address field.
    pub fn src_addr(&self) -> [u8; 16] {
        arr(&self.buffer.as_ref()[4..20])
    }
    /// The destination (passive side) address field.
    pub fn dst_addr(&self) -> [u8; 16] {
        arr(&self.buffer.as_ref()[20..36])
    }
}

/// Owned rdma_cm IP header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CmaHdrRepr {
    /// CMA version (0).
    pub cma_version: u8,
    /// IP version, 4 or 6 (other values are kept).
    pub ip_version: u8,
    /// The active side's port.
    pub port: u16,
    /// Source address field, raw.
    pub src_addr: [u8; 16],
    /// Destination address field, raw.
    pub dst_addr: [u8; 16],
}

fn ip_of(version: u8, a: &[u8; 16]) -> Option<core::net::IpAddr> {
    match version {
        4 => Some(core::net::IpAddr::V4(core::net::Ipv4Addr::new(
            a[12], a[13], a[14], a[15],
        ))),
        6 => Some(core::net::IpAddr::V6(core::net::Ipv6Addr::from(*a))),
        _ => None,
    }
}

fn addr_of(ip: core::net::IpAddr) -> [u8; 16] {
    match ip {
        core::net::IpAddr::V4(v4) => {
            let mut a = [0u8; 16];
            a[12..].copy_from_slice(&v4.octets());
            a
        }
        core::net::IpAddr::V6(v6) => v6.octets(),
    }
}

impl CmaHdrRepr {
    /// The header rdma_cm's active side sends: version 0, the address family of `src`.
    /// `src` and `dst` must be of one family.
    pub fn new(src: core::net::IpAddr, src_port: u16, dst: core::net::IpAddr) -> CmaHdrRepr {
        CmaHdrRepr {
            cma_version: 0,
            ip_version: if src.is_ipv4() { 4 } else { 6 },
            port: src_port,
            src_addr: addr_of(src),
            dst_addr: addr_of(dst),
        }
    }
    /// Parses a checked view; never fails.
    pub fn parse<T: AsRef<[u8]>>(h: &CmaHdr<T>) -> CmaHdrRepr {
        CmaHdrRepr {
            cma_version: h.cma_version(),
            ip_version: h.ip_version(),
            port: h.port(),
            src_addr: h.src_addr(),
            dst_addr: h.dst_addr(),
        }
    }
    /// 36.
    pub const fn buffer_len(&self) -> usize {
        36
    }
    /// Writes the 36 bytes (the low nibble of byte 1 is 0). Panics: if `buf` is shorter.
    pub fn emit(&self, buf: &mut [u8]) {
        buf[0] = self.cma_version;
        buf[1] = self.ip_version << 4;
        buf[2..4].copy_from_slice(&self.port.to_be_bytes());
        buf[4..20].copy_from_slice(&self.src_addr);
        buf[20..36].copy_from_slice(&self.dst_addr);
    }
    /// The source address, if `ip_version` is 4 or 6.
    pub fn src_ip(&self) -> Option<core::net::IpAddr> {
        ip_of(self.ip_version, &self.src_addr)
    }
    /// The destination address, if `ip_version` is 4 or 6.
    pub fn dst_ip(&self) -> Option<core::net::IpAddr> {
        ip_of(self.ip_version, &self.dst_addr)
    }
}
