//! `rdma_getaddrinfo` / `rdma_freeaddrinfo` for IP addresses (what rdma-core's
//! librdmacm/addrinfo.c does without an ib_acm service): getaddrinfo(3) resolves the node and
//! service; with `RAI_PASSIVE` the result is the source address (INADDR_ANY without a node),
//! else the destination, with the hints' source address copied when given. The port space
//! and QP type come from the hints, else RDMA_PS_TCP / IBV_QPT_RC (UD for RDMA_PS_UDP).
//! Only the first address getaddrinfo returns is used; no route or connect data is filled.

use crate::abi::*;
use crate::ffi;
use core::ffi::{c_char, c_int};

/// Copies `len` bytes of a sockaddr into a malloc'd block (freed by rdma_freeaddrinfo).
///
/// # Safety
/// `sa` points to `len` readable bytes.
unsafe fn dup_sockaddr(sa: *const libc::sockaddr, len: libc::socklen_t) -> *mut libc::sockaddr {
    // SAFETY: malloc of len bytes, then a copy of the caller's len bytes.
    unsafe {
        let p = libc::malloc(len as usize).cast::<libc::sockaddr>();
        if !p.is_null() {
            std::ptr::copy_nonoverlapping(sa.cast::<u8>(), p.cast::<u8>(), len as usize);
        }
        p
    }
}

pub(crate) extern "C" fn rdma_getaddrinfo(
    node: *const c_char,
    service: *const c_char,
    hints: *const rdma_addrinfo,
    res: *mut *mut rdma_addrinfo,
) -> c_int {
    ffi!({
        if res.is_null() || (node.is_null() && service.is_null() && hints.is_null()) {
            return Err(libc::EINVAL);
        }
        // SAFETY: NULL or the caller's hints.
        let h = unsafe { hints.as_ref() };
        if let (true, true, Some(h)) = (node.is_null(), service.is_null(), h) {
            // Nothing to resolve: the hints' fields and addresses, copied (librdmacm
            // addrinfo.c, `rdma_getaddrinfo` without node and service; pyverbs' AddrInfo with
            // only a source, for a multicast join).
            // SAFETY: the hints' addresses are the caller's (pointer, length) pairs; every
            // pointer stored is malloc'd and freed by rdma_freeaddrinfo.
            unsafe {
                let mut rai: Box<rdma_addrinfo> = Box::new(std::mem::zeroed());
                rai.ai_flags = h.ai_flags;
                rai.ai_family = h.ai_family;
                rai.ai_qp_type = h.ai_qp_type;
                rai.ai_port_space = h.ai_port_space;
                if h.ai_dst_len != 0 && !h.ai_dst_addr.is_null() {
                    rai.ai_dst_addr = dup_sockaddr(h.ai_dst_addr, h.ai_dst_len);
                    rai.ai_dst_len = h.ai_dst_len;
                }
                if h.ai_src_len != 0 && !h.ai_src_addr.is_null() {
                    rai.ai_src_addr = dup_sockaddr(h.ai_src_addr, h.ai_src_len);
                    rai.ai_src_len = h.ai_src_len;
                }
                *res = Box::into_raw(rai);
            }
            return Ok(0);
        }
        let flags = h.map_or(0, |h| h.ai_flags);
        let passive = flags & RAI_PASSIVE != 0;
        // SAFETY: addrinfo is plain data; zeros are "no hint".
        let mut gh: libc::addrinfo = unsafe { std::mem::zeroed() };
        gh.ai_family = h.map_or(0, |h| h.ai_family);
        gh.ai_socktype = libc::SOCK_STREAM;
        if passive {
            gh.ai_flags |= libc::AI_PASSIVE;
        }
        if flags & RAI_NUMERICHOST != 0 {
            gh.ai_flags |= libc::AI_NUMERICHOST;
        }
        let mut gres: *mut libc::addrinfo = std::ptr::null_mut();
        // SAFETY: NUL-terminated strings or NULL, our hints, an out pointer.
        let r = unsafe { libc::getaddrinfo(node, service, &gh, &mut gres) };
        if r != 0 {
            // getaddrinfo's EAI_* error, returned as librdmacm returns it (no errno).
            return Ok(r);
        }

        let ps = h
            .map(|h| h.ai_port_space)
            .filter(|&p| p != 0)
            .unwrap_or_else(|| {
                if h.is_some_and(|h| h.ai_qp_type == IBV_QPT_UD) {
                    RDMA_PS_UDP
                } else {
                    RDMA_PS_TCP
                }
            });
        let qp_type = h
            .map(|h| h.ai_qp_type)
            .filter(|&q| q != 0)
            .unwrap_or(if ps == RDMA_PS_UDP {
                IBV_QPT_UD
            } else {
                IBV_QPT_RC
            });
        // SAFETY: getaddrinfo succeeded: `gres` is a list of at least one entry; every
        // pointer stored below is malloc'd and freed by rdma_freeaddrinfo.
        unsafe {
            let g = &*gres;
            let mut rai: Box<rdma_addrinfo> = Box::new(std::mem::zeroed());
            rai.ai_flags = flags;
            rai.ai_family = g.ai_family;
            rai.ai_qp_type = qp_type;
            rai.ai_port_space = ps;
            if passive {
                rai.ai_src_addr = dup_sockaddr(g.ai_addr, g.ai_addrlen);
                rai.ai_src_len = g.ai_addrlen;
            } else {
                rai.ai_dst_addr = dup_sockaddr(g.ai_addr, g.ai_addrlen);
                rai.ai_dst_len = g.ai_addrlen;
                if let Some(h) = h
                    && !h.ai_src_addr.is_null()
                {
                    rai.ai_src_addr = dup_sockaddr(h.ai_src_addr, h.ai_src_len);
                    rai.ai_src_len = h.ai_src_len;
                }
            }
            libc::freeaddrinfo(gres);
            *res = Box::into_raw(rai);
        }
        Ok(0)
    })
}

pub(crate) extern "C" fn rdma_freeaddrinfo(res: *mut rdma_addrinfo) {
    ffi!({
        let mut p = res;
        while !p.is_null() {
            // SAFETY: a list rdma_getaddrinfo made, freed once.
            unsafe {
                let b = Box::from_raw(p);
                libc::free(b.ai_src_addr.cast());
                libc::free(b.ai_dst_addr.cast());
                p = b.ai_next;
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without node and service, librdmacm copies the hints (pyverbs' `AddrInfo(src=group)`
    /// before a multicast join); without hints too, EINVAL.
    #[test]
    fn no_node_no_service_copies_the_hints() {
        // SAFETY (test): plain-data structs, zeros are valid.
        let mut sin: libc::sockaddr_in = unsafe { std::mem::zeroed() };
        sin.sin_family = libc::AF_INET as libc::sa_family_t;
        sin.sin_addr.s_addr = u32::from_ne_bytes([239, 1, 2, 3]);
        let mut hints: rdma_addrinfo = unsafe { std::mem::zeroed() };
        hints.ai_port_space = RDMA_PS_UDP;
        hints.ai_qp_type = IBV_QPT_UD;
        hints.ai_src_addr = (&mut sin as *mut libc::sockaddr_in).cast();
        hints.ai_src_len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        let mut res: *mut rdma_addrinfo = std::ptr::null_mut();
        let null = std::ptr::null();
        assert_eq!(rdma_getaddrinfo(null, null, &hints, &mut res), 0);
        // SAFETY (test): a result rdma_getaddrinfo just made.
        let r = unsafe { &*res };
        assert_eq!((r.ai_port_space, r.ai_qp_type), (RDMA_PS_UDP, IBV_QPT_UD));
        assert!(r.ai_dst_addr.is_null() && r.ai_dst_len == 0);
        assert_eq!(r.ai_src_len, hints.ai_src_len);
        // SAFETY (test): a copy of `sin`, `ai_src_len` bytes.
        let got = unsafe { &*r.ai_src_addr.cast::<libc::sockaddr_in>() };
        assert_eq!(got.sin_addr.s_addr, sin.sin_addr.s_addr);
        assert_ne!(
            r.ai_src_addr.cast::<libc::sockaddr_in>(),
            &mut sin as *mut _
        );
        rdma_freeaddrinfo(res);
        assert_eq!(rdma_getaddrinfo(null, null, std::ptr::null(), &mut res), -1);
        assert_eq!(softroce_cabi::errno(), libc::EINVAL);
    }
}
