//! Addresses: `sockaddr` <-> `SocketAddr`, an id's route (its addresses, GIDs and one path
//! record) and the address handle attributes of a route. No state, no lock.
//!
//! RoCE: GIDs are the IPv4-mapped addresses (`gid_of_ip`); the source GID is index 1 of the
//! device (softroce::net::discover, as rxe).

use crate::abi::*;
use core::ffi::c_int;
use softroce::wire::cm::gid_of_ip;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// The GID index of a device's IP address (softroce::net::discover: index 1, as rxe).
const SGID_INDEX: u8 = 1;

pub(super) fn sockaddr_of(sa: *const libc::sockaddr) -> Result<SocketAddr, c_int> {
    if sa.is_null() {
        return Err(libc::EINVAL);
    }
    // SAFETY: the caller passes a sockaddr of the size its family says.
    unsafe {
        match c_int::from((*sa).sa_family) {
            libc::AF_INET => {
                let s = &*sa.cast::<libc::sockaddr_in>();
                Ok(SocketAddr::new(
                    IpAddr::V4(Ipv4Addr::from(u32::from_be(s.sin_addr.s_addr))),
                    u16::from_be(s.sin_port),
                ))
            }
            libc::AF_INET6 => {
                let s = &*sa.cast::<libc::sockaddr_in6>();
                Ok(SocketAddr::new(
                    IpAddr::V6(Ipv6Addr::from(s.sin6_addr.s6_addr)),
                    u16::from_be(s.sin6_port),
                ))
            }
            _ => Err(libc::EAFNOSUPPORT),
        }
    }
}

pub(super) fn write_sockaddr(out: &mut libc::sockaddr_storage, a: SocketAddr) {
    // SAFETY: sockaddr_storage is plain data, large and aligned enough for both families.
    unsafe {
        *out = std::mem::zeroed();
        match a {
            SocketAddr::V4(v4) => {
                let s = &mut *(out as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in>();
                s.sin_family = libc::AF_INET as libc::sa_family_t;
                s.sin_port = v4.port().to_be();
                s.sin_addr.s_addr = u32::from(*v4.ip()).to_be();
            }
            SocketAddr::V6(v6) => {
                let s = &mut *(out as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in6>();
                s.sin6_family = libc::AF_INET6 as libc::sa_family_t;
                s.sin6_port = v6.port().to_be();
                s.sin6_addr.s6_addr = v6.ip().octets();
            }
        }
    }
}

/// Fills the id's addresses, GIDs and (with a remote) its one path record.
pub(super) fn set_route(
    id: *mut rdma_cm_id,
    local: SocketAddr,
    remote: Option<SocketAddr>,
    mtu: u8,
) {
    // SAFETY: `id` is a live boxed rdma_cm_id (checked by the caller under the lock).
    let id = unsafe { &mut *id };
    write_sockaddr(&mut id.route.addr.src_storage, local);
    id.route.addr.ibaddr.sgid.raw = gid_of_ip(local.ip());
    id.route.addr.ibaddr.pkey = 0xffff_u16.to_be();
    if let Some(r) = remote {
        write_sockaddr(&mut id.route.addr.dst_storage, r);
        id.route.addr.ibaddr.dgid.raw = gid_of_ip(r.ip());
        let path = ibv_sa_path_rec {
            dgid: ibv_gid {
                raw: gid_of_ip(r.ip()),
            },
            sgid: ibv_gid {
                raw: gid_of_ip(local.ip()),
            },
            dlid: 0xffff,
            slid: 0xffff,
            flow_label: softroce::cm::rdma_cm_flow_label(local.port(), r.port()).to_be(),
            hop_limit: 64,
            reversible: 1,
            numb_path: 1,
            pkey: 0xffff_u16.to_be(),
            mtu_selector: 2,
            mtu,
            rate_selector: 2,
            rate: 3,
            packet_life_time_selector: 2,
            packet_life_time: softroce::cm::CMA_IBOE_PACKET_LIFETIME,
            ..Default::default()
        };
        if id.route.path_rec.is_null() {
            id.route.path_rec = Box::into_raw(Box::new(path));
        } else {
            // SAFETY: a path record we boxed earlier.
            unsafe { *id.route.path_rec = path };
        }
        id.route.num_paths = 1;
    }
}

/// The address handle attributes of the route to `peer` (RoCE: a GRH to its GID).
pub(super) fn ud_ah_attr(peer: IpAddr) -> ibv_ah_attr {
    let mut a = ibv_ah_attr {
        is_global: 1,
        port_num: 1,
        ..Default::default()
    };
    a.grh.dgid.raw = gid_of_ip(peer);
    a.grh.sgid_index = SGID_INDEX;
    a.grh.hop_limit = 64;
    a
}
