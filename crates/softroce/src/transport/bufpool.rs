//! A per-thread cache of packet buffers, so that building a packet does not allocate once the
//! data path is warm (issue 7: no allocation per packet on the hot path).
//!
//! The engine builds every outgoing packet into a buffer from [`take`]; whoever sent the
//! packet hands the buffer back with [`give`] (the verbs layer does so after each send
//! batch). Buffers are cached per thread: the thread that sends is the one that builds, so a
//! buffer normally returns to the cache it came from, with no lock. A buffer given back on
//! another thread simply joins that thread's cache. Only the allocator is affected: the
//! transport stays sans-IO and deterministic.

use std::cell::RefCell;

/// Most buffers one thread keeps (a full GSO batch of 64 packets and as many held back).
const MAX_CACHED: usize = 256;
/// Buffers larger than this are not cached (a packet is at most 4 KiB of payload plus
/// headers; UD sends are no larger).
const MAX_CACHED_CAPACITY: usize = 8192;

thread_local! {
    static CACHE: RefCell<Vec<Vec<u8>>> = const { RefCell::new(Vec::new()) };
}

/// A buffer of `len` zero bytes, from this thread's cache when it holds one.
#[must_use]
pub fn take(len: usize) -> Vec<u8> {
    let cached = CACHE.with(|c| c.borrow_mut().pop());
    match cached {
        Some(mut v) if v.capacity() >= len => {
            v.clear();
            v.resize(len, 0);
            v
        }
        _ => vec![0u8; len],
    }
}

/// Hands a sent packet's buffer back to this thread's cache (dropped when the cache is full
/// or the buffer is unusually large).
pub fn give(v: Vec<u8>) {
    if v.capacity() == 0 || v.capacity() > MAX_CACHED_CAPACITY {
        return;
    }
    CACHE.with(|c| {
        let mut c = c.borrow_mut();
        if c.len() < MAX_CACHED {
            c.push(v);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reuses_a_given_buffer_zeroed() {
        let mut a = take(100);
        a.iter_mut().for_each(|b| *b = 0xAA);
        let p = a.as_ptr();
        give(a);
        let b = take(60);
        assert_eq!(b.as_ptr(), p, "the cached buffer came back");
        assert_eq!(b.len(), 60);
        assert!(b.iter().all(|x| *x == 0), "contents cleared");
    }

    #[test]
    fn large_buffers_are_not_cached() {
        give(vec![0u8; MAX_CACHED_CAPACITY + 1]);
        let v = take(16);
        assert!(v.capacity() <= MAX_CACHED_CAPACITY);
    }
}
