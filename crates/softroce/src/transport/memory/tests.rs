//! Unit tests of the MR/MW key tables and of application memory access. Those on
//! [`ForeignMem`] touch the buffer only through raw pointers and open no socket, so they run
//! under Miri (docs/memory.md).

use super::foreign::BOUNCE_BYTES;
use super::*;
use crate::transport::{AccessFlags, Sge};
use core::ptr::NonNull;
use core::sync::atomic::{AtomicU8, AtomicU64, Ordering};

fn table() -> (MrTable, u32) {
    let mut t = MrTable::new(7);
    let k = t
        .register(1, 64, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
        .unwrap();
    (t, k)
}

#[test]
fn key_shape_and_lookup() {
    let (t, k) = table();
    assert_eq!(k >> 8, 1);
    assert!(t.get(k).is_some());
    assert!(t.get(k ^ 1).is_none(), "wrong key byte");
    assert!(t.get(0).is_none() && t.get(0xffff_ffff).is_none());
}

#[test]
fn remote_checks() {
    let (mut t, k) = table();
    let va = t.get(k).unwrap().iova;
    assert_eq!(t.write_remote(k, 1, 0x11, va + 60, b"abcd"), Ok(()));
    assert_eq!(
        t.write_remote(k, 1, 0x11, va + 61, b"abcd"),
        Err(MemError::Range)
    );
    assert_eq!(
        t.write_remote(k, 2, 0x11, va, b"a"),
        Err(MemError::PdMismatch)
    );
    assert_eq!(
        t.write_remote(k + 0x100, 1, 0x11, va, b"a"),
        Err(MemError::BadKey)
    );
    let mut out = [0u8; 4];
    assert_eq!(
        t.read_remote(k, 1, 0x11, va + 60, &mut out),
        Err(MemError::Access)
    );
    assert_eq!(
        t.check(k, 1, u64::MAX, 2, AccessFlags::empty()).err(),
        Some(MemError::Range)
    );
}

#[test]
fn gather_scatter_across_sges() {
    let (mut t, k) = table();
    let va = t.get(k).unwrap().iova;
    let sges = [
        Sge {
            addr: va,
            length: 3,
            lkey: k,
        },
        Sge {
            addr: va + 10,
            length: 5,
            lkey: k,
        },
    ];
    t.scatter(&sges, 1, 1, b"XYZW").unwrap();
    let mut out = [0u8; 8];
    t.gather(&sges, 1, 0, &mut out).unwrap();
    assert_eq!(&out, b"\0XYZW\0\0\0");
    assert_eq!(t.gather(&sges, 1, 4, &mut [0u8; 5]), Err(MemError::Length));
}

/// Re-registering a slot never brings back the key it had: with every other index in
/// use, a deregistered slot is handed out again with a new key byte, and the old key is
/// rejected remotely while the new one works.
#[test]
#[cfg_attr(
    miri,
    ignore = "65 536 registrations: key allocation, not memory access"
)]
fn a_reused_slot_gets_a_new_key_and_the_old_key_is_rejected() {
    let mut t = MrTable::new(1);
    let all = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let keys: Vec<u32> = (0..MAX_MR)
        .map(|_| t.register(1, 1, all).unwrap())
        .collect();
    assert!(t.register(1, 1, all).is_none(), "table full");
    for &old in keys.iter().step_by(997) {
        assert!(t.deregister(old));
        let new = t.register(1, 1, all).unwrap();
        assert_eq!(new >> 8, old >> 8, "the only free slot is reused");
        assert_ne!(new, old, "with another key byte");
        let va = t.get(new).unwrap().iova;
        assert_eq!(
            t.write_remote(old, 1, 0x11, va, b"x"),
            Err(MemError::BadKey)
        );
        assert_eq!(t.write_remote(new, 1, 0x11, va, b"x"), Ok(()));
        assert!(!t.deregister(old));
    }
}

/// Freed indices are not reused at once (cyclic allocation, as rxe's pools).
#[test]
fn indices_are_handed_out_cyclically() {
    let mut t = MrTable::new(2);
    let a = t.register(1, 8, AccessFlags::empty()).unwrap();
    assert!(t.deregister(a));
    let b = t.register(1, 8, AccessFlags::empty()).unwrap();
    assert_eq!(b >> 8, (a >> 8) + 1);
}

/// Application memory for the tests: `len` bytes from the global allocator, 8-byte
/// aligned, which the "application" reads and writes only through raw pointers (as C
/// does), so that Miri's aliasing checks see what a real program does to registered
/// memory. Freed on drop, after the table that registered it.
struct AppBuf {
    ptr: NonNull<u8>,
    layout: std::alloc::Layout,
}

impl AppBuf {
    fn new(len: usize, fill: u8) -> AppBuf {
        let layout = std::alloc::Layout::from_size_align(len, 8).unwrap();
        // SAFETY: `layout` has a non-zero size (every test asks for some bytes).
        let ptr = NonNull::new(unsafe { std::alloc::alloc(layout) }).unwrap();
        // SAFETY: `ptr` is a fresh allocation of `len` bytes.
        unsafe { ptr.as_ptr().write_bytes(fill, len) };
        AppBuf { ptr, layout }
    }
    fn len(&self) -> usize {
        self.layout.size()
    }
    /// Registers the whole buffer with `access`.
    fn register(&self, t: &mut MrTable, access: AccessFlags) -> u32 {
        // SAFETY: the buffer lives until `self` drops, and every test drops its table
        // (or deregisters) first.
        unsafe { t.register_user(1, self.ptr, self.len(), access) }.unwrap()
    }
    /// The application writes `data` at `off` (plain stores, no reference).
    fn poke(&self, off: usize, data: &[u8]) {
        assert!(off + data.len() <= self.len());
        // SAFETY: in bounds (asserted); the buffer is live.
        unsafe {
            core::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.as_ptr().add(off), data.len())
        };
    }
    /// The application reads `n` bytes at `off`.
    fn peek(&self, off: usize, n: usize) -> Vec<u8> {
        assert!(off + n <= self.len());
        let mut v = vec![0u8; n];
        // SAFETY: in bounds (asserted); the buffer is live.
        unsafe { core::ptr::copy_nonoverlapping(self.ptr.as_ptr().add(off), v.as_mut_ptr(), n) };
        v
    }
    /// The byte at `off`, as a flag the application spins on.
    fn flag(&self, off: usize) -> &AtomicU8 {
        assert!(off < self.len());
        // SAFETY: in bounds (asserted) and live for `&self`; every concurrent access in
        // the tests that use it is atomic or ordered by it.
        unsafe { AtomicU8::from_ptr(self.ptr.as_ptr().add(off)) }
    }
}

// SAFETY: the buffer is a plain allocation; the tests share it between threads only
// through raw pointers and atomics.
unsafe impl Send for AppBuf {}
// SAFETY: as for `Send`.
unsafe impl Sync for AppBuf {}

impl Drop for AppBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) };
    }
}

fn all() -> AccessFlags {
    AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC
}

/// An MR over application memory reads and writes the application's bytes in place,
/// while the application keeps reading and writing them itself: no deregistration is
/// needed to see what a peer wrote, and the engine sends what the application wrote
/// last. (Run under Miri and the sanitizers; docs/memory.md.)
#[test]
fn user_memory_is_read_and_written_in_place() {
    let app = AppBuf::new(32, 7);
    let mut t = MrTable::new(3);
    let k = app.register(&mut t, all());
    let va = t.get(k).unwrap().iova;
    assert_eq!(va, app.ptr.as_ptr() as u64);
    assert_eq!(t.get(k).unwrap().owned_bytes(), None, "never sliced");
    t.write_remote(k, 1, 0x11, va + 30, b"ab").unwrap();
    assert_eq!(
        t.write_remote(k, 1, 0x11, va + 31, b"ab"),
        Err(MemError::Range)
    );
    assert_eq!(app.peek(28, 4), b"\x07\x07ab", "seen while registered");
    app.poke(0, b"app!");
    let mut out = [0u8; 5];
    t.read_remote(k, 1, 0x11, va, &mut out).unwrap();
    assert_eq!(&out, b"app!\x07");
    let mut two = [0u8; 2];
    t.host_bytes(va + 30, 2).unwrap().copy_to(&mut two).unwrap();
    assert_eq!(&two, b"ab");
    // Local scatter and gather over the same bytes.
    let sge = [Sge {
        addr: va + 8,
        length: 8,
        lkey: k,
    }];
    t.scatter(&sge, 1, 2, b"xyz").unwrap();
    assert_eq!(app.peek(8, 8), b"\x07\x07xyz\x07\x07\x07");
    app.poke(13, b"Q");
    let mut g = [0u8; 8];
    t.gather(&sge, 1, 0, &mut g).unwrap();
    assert_eq!(&g, b"\x07\x07xyzQ\x07\x07");
    assert!(t.deregister(k));
    assert_eq!(app.peek(28, 4), b"\x07\x07ab");
}

/// An MR over application memory registered at an IOVA other than the buffer's address
/// (`ibv_reg_mr_iova`, rxe `rxe_mr_init_user`): peers' and local accesses name the bytes by
/// the IOVA, the host address is outside the MR, and the bytes are the application's.
#[test]
fn user_memory_at_an_iova_is_addressed_by_it() {
    let app = AppBuf::new(64, 0);
    let mut t = MrTable::new(5);
    let iova = 0x7e57_0000_0000 + (app.ptr.as_ptr() as u64 & 0xfff);
    // SAFETY: the buffer outlives the table, which is dropped first.
    let k = unsafe { t.register_user_iova(1, app.ptr, app.len(), iova, all()) }.unwrap();
    assert_eq!(t.get(k).unwrap().iova, iova);
    assert_eq!(t.get(k).unwrap().host_addr(), app.ptr.as_ptr() as u64);
    t.write_remote(k, 1, 0x11, iova + 60, b"wxyz").unwrap();
    assert_eq!(app.peek(60, 4), b"wxyz");
    assert_eq!(
        t.write_remote(k, 1, 0x11, app.ptr.as_ptr() as u64, b"a"),
        Err(MemError::Range)
    );
    app.poke(0, b"host");
    let mut out = [0u8; 4];
    t.read_remote(k, 1, 0x11, iova, &mut out).unwrap();
    assert_eq!(&out, b"host");
    let sge = [Sge {
        addr: iova + 2,
        length: 4,
        lkey: k,
    }];
    let mut g = [0u8; 4];
    t.gather(&sge, 1, 0, &mut g).unwrap();
    assert_eq!(&g, b"st\0\0");
    drop(t);
}

/// An MR whose IOVA range ends exactly at 2^64 (rxe `mr_check_range` computes
/// `mr->iova + mr->length - length` modulo 2^64, so its last byte at `u64::MAX` is
/// reachable): the last byte and the whole range are inside, one byte before the start and
/// any range that would wrap are not.
#[test]
fn user_memory_whose_iova_range_ends_at_2_pow_64_is_reachable_to_its_last_byte() {
    let app = AppBuf::new(64, 0);
    let mut t = MrTable::new(5);
    let iova = 0u64.wrapping_sub(64);
    let k = {
        // SAFETY: the buffer outlives the table, which is dropped first.
        unsafe { t.register_user_iova(1, app.ptr, app.len(), iova, all()) }.unwrap()
    };
    t.write_remote(k, 1, 0x11, u64::MAX, b"z").unwrap();
    assert_eq!(app.peek(63, 1), b"z");
    t.write_remote(k, 1, 0x11, iova, &[5; 64]).unwrap();
    let mut out = [0u8; 64];
    t.read_remote(k, 1, 0x11, iova, &mut out).unwrap();
    assert_eq!(out, [5; 64]);
    assert_eq!(
        t.write_remote(k, 1, 0x11, u64::MAX, b"zz"),
        Err(MemError::Range)
    );
    assert_eq!(
        t.write_remote(k, 1, 0x11, iova - 1, b"z"),
        Err(MemError::Range)
    );
    drop(t);
}

/// ATOMICs on application memory are single atomic operations on the aligned word, so
/// the application may use the word atomically at the same time; a misaligned host
/// address is refused.
#[test]
fn user_memory_atomics_use_the_word_in_place() {
    let app = AppBuf::new(24, 0);
    let mut t = MrTable::new(4);
    let k = app.register(&mut t, all());
    let va = t.get(k).unwrap().iova;
    app.poke(8, &40u64.to_ne_bytes());
    let add = AtomicOp::FetchAdd(2);
    assert_eq!(t.atomic_remote(k, 1, 0x11, va + 8, add), Ok(40));
    let cas = AtomicOp::CompareSwap {
        compare: 42,
        swap: 7,
    };
    assert_eq!(t.atomic_remote(k, 1, 0x11, va + 8, cas), Ok(42));
    assert_eq!(t.atomic_remote(k, 1, 0x11, va + 8, cas), Ok(7), "no swap");
    assert_eq!(app.peek(8, 8), 7u64.to_ne_bytes());
    assert_eq!(
        t.atomic_remote(k, 1, 0x11, va + 9, add),
        Err(MemError::Range)
    );
    assert_eq!(
        t.atomic_remote(k, 1, 0x11, va + 20, add),
        Err(MemError::Range)
    );
    // The application adds concurrently, atomically: no update is lost. (It reads the
    // result atomically too: ThreadSanitizer does not see the join in an uninstrumented
    // std, and would call a plain read after it a race.)
    // SAFETY: bytes 16..24 are in the live, 8-byte aligned buffer, which outlives `word`.
    let word = unsafe { AtomicU64::from_ptr(app.ptr.as_ptr().add(16).cast()) };
    std::thread::scope(|s| {
        s.spawn(|| {
            for _ in 0..100 {
                word.fetch_add(1, Ordering::Relaxed);
            }
        });
        for _ in 0..100 {
            t.atomic_remote(k, 1, 0x11, va + 16, AtomicOp::FetchAdd(1))
                .unwrap();
        }
    });
    assert_eq!(word.load(Ordering::Acquire), 200);
    drop(t);
}

/// The latency-test pattern: the application spins on the last byte of a buffer while a
/// WRITE lands in it, then reads the payload. The last byte is stored last with release
/// ordering, so a reader that sees it (acquire) sees every byte before it.
#[test]
fn a_reader_spinning_on_the_last_byte_sees_the_whole_write() {
    const LEN: usize = 3000;
    let app = AppBuf::new(LEN, 0);
    let mut t = MrTable::new(5);
    let k = app.register(&mut t, all());
    let va = t.get(k).unwrap().iova;
    let payload: Vec<u8> = (0..LEN).map(|i| (i % 251) as u8 | 1).collect();
    std::thread::scope(|s| {
        let reader = s.spawn(|| {
            let flag = app.flag(LEN - 1);
            // Bounded: the writer below writes once; Miri runs this slowly but surely.
            let mut spins = 0u64;
            while flag.load(Ordering::Acquire) == 0 {
                spins += 1;
                assert!(spins < 1 << 40, "the flag never came");
                std::hint::spin_loop();
            }
            app.peek(0, LEN)
        });
        // Two packets' worth, as the responder writes a multi-packet WRITE.
        t.write_remote(k, 1, 0x11, va, &payload[..2048]).unwrap();
        t.write_remote(k, 1, 0x11, va + 2048, &payload[2048..])
            .unwrap();
        assert_eq!(reader.join().unwrap(), payload);
    });
    drop(t);
}

/// Application bytes handed out for a send come in copies of at most `BOUNCE_BYTES`
/// that together are the bytes; owned bytes as one slice.
#[test]
fn foreign_bytes_are_copied_in_chunks_never_lent() {
    let app = AppBuf::new(2500, 0);
    let bytes: Vec<u8> = (0..2500).map(|i| (i * 7 % 256) as u8).collect();
    app.poke(0, &bytes);
    let mut t = MrTable::new(6);
    let k = app.register(&mut t, all());
    let mr = t.get(k).unwrap();
    let b = mr.bytes_at(3, 2400).unwrap();
    assert_eq!(b.chunks(), 3);
    let mut got = Vec::new();
    b.for_each_chunk(|c| {
        assert!(c.len() <= BOUNCE_BYTES);
        got.extend_from_slice(c);
    });
    assert_eq!(got, &bytes[3..2403]);
    let (ptr, len) = b.raw();
    assert_eq!((ptr.as_ptr() as u64, len), (mr.iova + 3, 2400));
    assert_eq!(mr.bytes_at(2400, 101).err(), Some(MemError::Range));
    let o = t.register(1, 16, all()).unwrap();
    assert_eq!(t.get(o).unwrap().bytes_at(0, 16).unwrap().chunks(), 1);
    drop(t);
}
