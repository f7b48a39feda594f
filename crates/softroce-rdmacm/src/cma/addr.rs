//! Addresses: `sockaddr` <-> `SocketAddr`, an id's route (its addresses, GIDs and one path
//! record) and the address handle attributes of a route. No state, no lock.
//!
//! RoCE: GIDs are the IPv4-mapped addresses (`gid_of_ip`); the source GID is index 1 of the
//! device (softroce::net::discover, as rxe).

use crate::abi::*;
use core::ffi::c_int;
use softroce::wire::cm::gid_of_ip;
use std::net::{IpAddr, SocketAddr};

/// The GID index of a device's IP address (softroce::net::discover: index 1, as rxe).
const SGID_INDEX: u8 = 1;

/// The address a caller's `sockaddr` holds (`softroce::net::sockaddr`). Errors: EINVAL for
/// NULL, EAFNOSUPPORT for a family other than AF_INET / AF_INET6.
pub(super) fn sockaddr_of(sa: *const libc::sockaddr) -> Result<SocketAddr, c_int> {
    if sa.is_null() {
        return Err(libc::EINVAL);
    }
    // SAFETY: the caller passes a sockaddr of the size its family says.
    unsafe { softroce::net::sockaddr::socket_addr_from_ptr(sa) }.ok_or(libc::EAFNOSUPPORT)
}

/// Writes `a` into `out` (`softroce::net::sockaddr::write_socket_addr`).
pub(super) fn write_sockaddr(out: &mut libc::sockaddr_storage, a: SocketAddr) {
    softroce::net::sockaddr::write_socket_addr(out, a);
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
