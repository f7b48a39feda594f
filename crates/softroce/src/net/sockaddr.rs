//! C socket addresses (`struct sockaddr_in` / `sockaddr_in6`, behind a `struct sockaddr *`
//! or in a `struct sockaddr_storage`) to and from std's [`SocketAddr`], through socket2's
//! [`SockAddr`]: the one conversion of the workspace (the batch receive path, interface
//! discovery, libibverbs.so.1's private MAD entry points; librdmacm.so.1 is to move to it). Only AF_INET and AF_INET6 are addresses here;
//! any other family is `None`. Never panics, never allocates.

use socket2::{SockAddr, SockAddrStorage, socklen_t};
use std::net::SocketAddr;

/// The address `sa` points to, read as its family says (`sockaddr_in` for AF_INET,
/// `sockaddr_in6` for AF_INET6); `None` for NULL or another family.
///
/// # Safety
/// `sa` is NULL or points to a readable `sockaddr` of its family's full size.
pub unsafe fn socket_addr_from_ptr(sa: *const libc::sockaddr) -> Option<SocketAddr> {
    if sa.is_null() {
        return None;
    }
    // SAFETY: non-NULL and readable (the caller's contract); every sockaddr starts with its
    // family.
    let family = libc::c_int::from(unsafe { (*sa).sa_family });
    let len = match family {
        libc::AF_INET => size_of::<libc::sockaddr_in>(),
        libc::AF_INET6 => size_of::<libc::sockaddr_in6>(),
        _ => return None,
    };
    // SAFETY: `len` bytes at `sa` are readable (the caller's contract) and fit in the
    // zeroed storage socket2 passes, which the copy fully initialises up to `len`.
    let made = unsafe {
        SockAddr::try_init(|storage, storage_len| {
            std::ptr::copy_nonoverlapping(sa.cast::<u8>(), storage.cast::<u8>(), len);
            *storage_len = len as socklen_t;
            Ok(())
        })
    };
    made.ok()?.1.as_socket()
}

/// The address in `s` (as `recvmmsg` or a C caller filled it), read as its family says;
/// `None` for a family other than AF_INET/AF_INET6. Flow info and scope ID are kept.
pub fn socket_addr_from_storage(s: &libc::sockaddr_storage) -> Option<SocketAddr> {
    let mut storage = SockAddrStorage::zeroed();
    // SAFETY: `sockaddr_storage` is one of this platform's sockaddr types.
    unsafe { *storage.view_as::<libc::sockaddr_storage>() = *s };
    let len = size_of::<libc::sockaddr_storage>() as socklen_t;
    // SAFETY: all `len` bytes of the storage are initialised (a copy of `s`).
    unsafe { SockAddr::new(storage, len) }.as_socket()
}

/// Writes `a` into `out` as a `sockaddr_in` or `sockaddr_in6` (port, flow info and scope
/// as in `a`), the rest of the storage zeroed.
pub fn write_socket_addr(out: &mut libc::sockaddr_storage, a: SocketAddr) {
    let s = SockAddr::from(a);
    // SAFETY: all zeros is a valid `sockaddr_storage`.
    *out = unsafe { std::mem::zeroed() };
    let len = (s.len() as usize).min(size_of::<libc::sockaddr_storage>());
    // SAFETY: `s` holds `len` initialised bytes, and `out` is a whole sockaddr_storage of at
    // least `len` bytes; the two do not overlap.
    unsafe {
        std::ptr::copy_nonoverlapping(
            s.as_ptr().cast::<u8>(),
            (out as *mut libc::sockaddr_storage).cast::<u8>(),
            len,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

    #[test]
    fn both_families_round_trip_through_a_storage() {
        for a in [
            SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 77, 0, 1)), 4791),
            SocketAddr::new(IpAddr::V6(Ipv6Addr::LOCALHOST), 0),
        ] {
            // SAFETY: all zeros is a valid `sockaddr_storage`.
            let mut st: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
            write_socket_addr(&mut st, a);
            let p = (&st as *const libc::sockaddr_storage).cast::<libc::sockaddr>();
            // SAFETY: a whole storage.
            assert_eq!(unsafe { socket_addr_from_ptr(p) }, Some(a));
            assert_eq!(socket_addr_from_storage(&st), Some(a));
        }
        // SAFETY: NULL is allowed.
        assert_eq!(unsafe { socket_addr_from_ptr(std::ptr::null()) }, None);
        // SAFETY: all zeros is a valid `sockaddr_storage` (family AF_UNSPEC).
        let st: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        let p = (&st as *const libc::sockaddr_storage).cast::<libc::sockaddr>();
        // SAFETY: a whole storage.
        assert_eq!(unsafe { socket_addr_from_ptr(p) }, None);
    }

    #[test]
    fn a_written_sockaddr_in_is_what_c_expects() {
        // SAFETY: all zeros is a valid `sockaddr_storage`.
        let mut st: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        write_socket_addr(&mut st, "10.0.0.2:0".parse().unwrap());
        // SAFETY: the family is AF_INET: a sockaddr_in, which fits in the storage.
        let s = unsafe { &*(&st as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
        assert_eq!(i32::from(s.sin_family), libc::AF_INET);
        assert_eq!(
            s.sin_addr.s_addr,
            u32::from(Ipv4Addr::new(10, 0, 0, 2)).to_be()
        );
        assert_eq!(s.sin_port, 0);
    }
}
