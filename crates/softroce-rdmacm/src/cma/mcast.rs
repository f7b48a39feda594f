//! Multicast through rdma_cm on RoCE: `rdma_join_multicast`, `rdma_join_multicast_ex` and
//! `rdma_leave_multicast`, as librdmacm does them over kernel rxe.
//!
//! RoCE has no subnet administrator, so the kernel answers a join itself
//! (`cma_iboe_join_multicast`): the MGID is the IPv4-mapped group address, and the
//! RDMA_CM_EVENT_MULTICAST_JOIN it queues at once carries the address handle attributes of
//! the group (`cma_make_mc_event`, `ib_init_ah_from_mcmember`), DestQP 0xFFFFFF and
//! rdma_cm's Q_Key. librdmacm attaches the id's QP to the MGID when the program takes that
//! event (`ucma_process_join`, in `rdma_get_cm_event`: events.rs), unless the join was send-only; a
//! failed attach turns the event into MULTICAST_ERROR with status -1. `rdma_leave_multicast`
//! detaches the QP and drops the membership's events not yet taken. The IP group itself is
//! joined by softroce's `ibv_attach_mcast` (the device's UDP link joins it on the device's
//! interface) where the kernel sends an IGMP report at join time.
//!
//! Errors, in the order librdmacm and then the kernel check them:
//! - `rdma_join_multicast_ex`: `comp_mask` with bits past JOIN_FLAGS: ENOTSUP; no ADDRESS
//!   bit, no JOIN_FLAGS bit or flags past SENDONLY_FULLMEMBER: EINVAL;
//! - an address that is neither AF_INET nor AF_INET6 (or NULL): EINVAL (`ucma_addrlen`);
//! - an id without a device (not bound to an address, or bound to the wildcard): EINVAL
//!   (ucma.c `ucma_get_ctx_dev`); an id past ADDR_BOUND / ADDR_RESOLVED (route resolved,
//!   listening, connecting or connected, a passive id): EINVAL; an id whose QP type is not
//!   UD (RDMA_PS_TCP): EINVAL (cma.c `rdma_join_multicast`);
//! - a group in 0.0.0.0/8 or `::`: EINVAL; an IPv6 group: errno 524 (the kernel's
//!   ENOTSUPP: RoCE v2 has no IPv6 multicast in `cma_iboe_join_multicast`);
//! - `rdma_leave_multicast` of an address this id has not joined (compared byte for byte
//!   over the sockaddr's length, port included): EADDRNOTAVAIL.
//!
//! Sources: rdma-core `librdmacm/cma.c` (`rdma_join_multicast2`, `rdma_join_multicast_ex`,
//! `rdma_leave_multicast`, `ucma_process_join`); kernel `drivers/infiniband/core/ucma.c`
//! (`ucma_process_join`), `cma.c` (`rdma_join_multicast`, `cma_iboe_join_multicast`,
//! `cma_iboe_set_mgid`, `cma_zero_addr`/`cma_any_addr`, `cma_make_mc_event`).

use super::addr::{sockaddr_of, ud_ah_attr};
use super::events::{drop_queued, new_event, post, sync_result};
use super::state::{ADDR_MAX, Membership, state};
use super::transitions::RDMA_UDP_QKEY;
use crate::abi::*;
use crate::ffi;
use crate::ibv::ibv;
use core::ffi::{c_int, c_void};
use std::net::{IpAddr, Ipv4Addr};

/// DestQP of a multicast send (IBTA: the multicast QPN, 0xFFFFFF).
const MULTICAST_QPN: u32 = 0x00ff_ffff;
/// The kernel's ENOTSUPP (include/linux/errno.h), which rdma_cm's `write(2)` passes to user
/// space as is.
const KERNEL_ENOTSUPP: c_int = 524;
/// `ucma_addrlen`: the size of the sockaddr `sa` points at, 0 for NULL or a family other
/// than AF_INET/AF_INET6 (AF_IB needs the kernel's AF_IB support, which RoCE lacks).
fn addr_len(sa: *const libc::sockaddr) -> usize {
    if sa.is_null() {
        return 0;
    }
    // SAFETY: a caller's sockaddr starts with its family.
    match c_int::from(unsafe { (*sa).sa_family }) {
        libc::AF_INET => size_of::<libc::sockaddr_in>(),
        libc::AF_INET6 => size_of::<libc::sockaddr_in6>(),
        _ => 0,
    }
}

/// The first `len` (at most [`ADDR_MAX`]) bytes of the caller's sockaddr, zero-padded.
fn addr_bytes(sa: *const libc::sockaddr, len: usize) -> [u8; ADDR_MAX] {
    let mut b = [0u8; ADDR_MAX];
    // SAFETY: the caller's sockaddr holds `len` bytes (addr_len of its family).
    unsafe { std::ptr::copy_nonoverlapping(sa.cast::<u8>(), b.as_mut_ptr(), len.min(ADDR_MAX)) };
    b
}

/// The MGID of multicast address `group` on RoCE v2 (kernel `cma_iboe_join_multicast` with
/// `cma_iboe_set_mgid`, GID type RoCE v2): the IPv4-mapped address (`::ffff:a.b.c.d`), all
/// zeros for a loopback address (`cma_any_addr`). Errors: EINVAL for 0.0.0.0/8 and `::`
/// (`cma_zero_addr`), 524 (ENOTSUPP) for any other IPv6 address.
fn mgid_of(group: IpAddr) -> Result<[u8; 16], c_int> {
    match group {
        IpAddr::V4(v4) if v4.octets()[0] == 0 => Err(libc::EINVAL),
        IpAddr::V4(v4) if v4.is_loopback() => Ok([0; 16]),
        IpAddr::V4(v4) => Ok(v4.to_ipv6_mapped().octets()),
        IpAddr::V6(v6) if v6.is_unspecified() => Err(libc::EINVAL),
        IpAddr::V6(_) => Err(KERNEL_ENOTSUPP),
    }
}

/// Joins `id` to the group at `addr` and queues its MULTICAST_JOIN (the kernel's checks and
/// answer; see the module doc for the errors).
fn join(
    id: *mut rdma_cm_id,
    addr: *const libc::sockaddr,
    join_flags: u32,
    context: *mut c_void,
) -> Result<(), c_int> {
    let len = addr_len(addr);
    if len == 0 {
        return Err(libc::EINVAL);
    }
    let group = sockaddr_of(addr)?;
    let mut st = state()?;
    let s = st.id_mut(id)?;
    // A device comes with a bind to (or a resolve from) one of its addresses.
    if s.dev.is_none() {
        return Err(libc::EINVAL);
    }
    // The kernel's ADDR_BOUND or ADDR_RESOLVED states, nothing later.
    if s.listening || s.listen_id != 0 || s.comm.is_some() || s.route_resolved {
        return Err(libc::EINVAL);
    }
    // SAFETY: a live id (checked above, under the lock).
    if unsafe { (*id).qp_type } != IBV_QPT_UD {
        return Err(libc::EINVAL);
    }
    let mgid = mgid_of(group.ip())?;
    st.last_mc += 1;
    let handle = st.last_mc;
    st.id_mut(id)?.mcast.insert(
        0,
        Membership {
            handle,
            addr: addr_bytes(addr, len),
            join_flags,
            mgid: [0; 16],
        },
    );
    let mut e = new_event(id, event::MULTICAST_JOIN, 0);
    e.mc = handle;
    let mut ah = ud_ah_attr(IpAddr::V4(Ipv4Addr::UNSPECIFIED));
    ah.grh.dgid.raw = mgid;
    // Writing a union member needs no unsafe; the private data is the caller's context
    // pointer (librdmacm sets it after copying the kernel's event, length 0).
    e.ev.param.ud = rdma_ud_param {
        private_data: context.cast_const(),
        private_data_len: 0,
        ah_attr: ah,
        qp_num: MULTICAST_QPN,
        qkey: RDMA_UDP_QKEY,
    };
    post(e);
    Ok(())
}

/// `rdma_join_multicast`: joins `id` to the group at `addr` as a full member; `context` is
/// the MULTICAST_JOIN's `param.ud.private_data`. Returns 0, or -1 with errno (module doc).
pub(crate) extern "C" fn rdma_join_multicast(
    id: *mut rdma_cm_id,
    addr: *mut libc::sockaddr,
    context: *mut c_void,
) -> c_int {
    ffi!({
        let r = join(id, addr, RDMA_MC_JOIN_FLAG_FULLMEMBER, context);
        sync_result(id, r)
    })
}

/// The body of [`rdma_join_multicast_ex`].
fn join_multicast_ex(
    id: *mut rdma_cm_id,
    mc_join_attr: *mut rdma_cm_join_mc_attr_ex,
    context: *mut c_void,
) -> Result<(), c_int> {
    // SAFETY: NULL or the caller's attributes.
    let a = unsafe { mc_join_attr.as_ref() }.ok_or(libc::EINVAL)?;
    if a.comp_mask >= RDMA_CM_JOIN_MC_ATTR_RESERVED {
        return Err(libc::ENOTSUP);
    }
    if a.comp_mask & RDMA_CM_JOIN_MC_ATTR_ADDRESS == 0
        || a.comp_mask & RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS == 0
        || a.join_flags >= RDMA_MC_JOIN_FLAG_RESERVED
    {
        return Err(libc::EINVAL);
    }
    join(id, a.addr, a.join_flags, context)
}

/// `rdma_join_multicast_ex`: as [`rdma_join_multicast`] with the address and the join
/// flags (full member, or send-only full member: the QP is not attached) from `mc_join_attr`.
pub(crate) extern "C" fn rdma_join_multicast_ex(
    id: *mut rdma_cm_id,
    mc_join_attr: *mut rdma_cm_join_mc_attr_ex,
    context: *mut c_void,
) -> c_int {
    ffi!({ sync_result(id, join_multicast_ex(id, mc_join_attr, context)) })
}

/// `rdma_leave_multicast`: leaves the group `id` joined at `addr` (the newest such join),
/// detaching the id's QP from its MGID unless the join was send-only. Returns 0, or -1 with
/// errno EINVAL (no AF_INET/AF_INET6 address) or EADDRNOTAVAIL (not joined).
pub(crate) extern "C" fn rdma_leave_multicast(
    id: *mut rdma_cm_id,
    addr: *mut libc::sockaddr,
) -> c_int {
    ffi!({
        let len = addr_len(addr);
        if len == 0 {
            return Err(libc::EINVAL);
        }
        let want = addr_bytes(addr, len);
        let mut st = state()?;
        let s = st.id_mut(id)?;
        let at = s
            .mcast
            .iter()
            .position(|m| m.addr[..len] == want[..len])
            .ok_or(libc::EADDRNOTAVAIL)?;
        let m = s.mcast.remove(at);
        // SAFETY: a live id (checked above, under the lock).
        let (qp, ch) = unsafe { ((*id).qp, (*id).channel) };
        if !qp.is_null() && m.join_flags != RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER {
            let gid = ibv_gid { raw: m.mgid };
            // As librdmacm, whatever the detach says (a join not taken yet has no MGID).
            // SAFETY: the id's live QP and a GID on our stack.
            let _ = unsafe { (ibv()?.detach_mcast)(qp, &gid, 0) };
        }
        drop_queued(ch, |e| e.mc == m.handle);
        Ok(0)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv6Addr;

    // cma_iboe_set_mgid (RoCE v2): an IPv4 group's MGID is its IPv4-mapped address.
    #[test]
    fn ipv4_group_mgid_is_the_ipv4_mapped_address() {
        let g = IpAddr::V4(Ipv4Addr::new(239, 160, 0, 1));
        let mut want = [0u8; 16];
        want[10] = 0xff;
        want[11] = 0xff;
        want[12..].copy_from_slice(&[239, 160, 0, 1]);
        assert_eq!(mgid_of(g), Ok(want));
    }

    // cma_zero_addr: 0.0.0.0/8 and :: are refused; cma_any_addr: loopback gives MGID 0.
    #[test]
    fn zero_net_refused_loopback_gives_zero_mgid() {
        assert_eq!(
            mgid_of(IpAddr::V4(Ipv4Addr::UNSPECIFIED)),
            Err(libc::EINVAL)
        );
        assert_eq!(
            mgid_of(IpAddr::V4(Ipv4Addr::new(0, 1, 2, 3))),
            Err(libc::EINVAL)
        );
        assert_eq!(
            mgid_of(IpAddr::V6(Ipv6Addr::UNSPECIFIED)),
            Err(libc::EINVAL)
        );
        assert_eq!(
            mgid_of(IpAddr::V4(Ipv4Addr::new(127, 0, 160, 9))),
            Ok([0; 16])
        );
    }

    // cma_iboe_join_multicast: RoCE v2 has no IPv6 groups (ENOTSUPP, 524).
    #[test]
    fn ipv6_group_is_enotsupp() {
        let g: Ipv6Addr = "ff0e::160:1".parse().unwrap();
        assert_eq!(mgid_of(IpAddr::V6(g)), Err(KERNEL_ENOTSUPP));
        assert_eq!(
            mgid_of(IpAddr::V6(Ipv6Addr::LOCALHOST)),
            Err(KERNEL_ENOTSUPP)
        );
    }

    #[test]
    fn addr_len_by_family() {
        let len_of = |family: c_int| {
            // SAFETY: zeroed sockaddr_storage is valid.
            let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
            ss.ss_family = family as libc::sa_family_t;
            addr_len((&ss as *const libc::sockaddr_storage).cast())
        };
        assert_eq!(addr_len(std::ptr::null()), 0);
        assert_eq!(len_of(libc::AF_UNSPEC), 0);
        assert_eq!(len_of(libc::AF_INET), 16);
        assert_eq!(len_of(libc::AF_INET6), 28);
    }
}
