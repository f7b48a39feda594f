//! The counters of a shared device in memory every process of the device maps: rxe's
//! `hw_counters` are per device, so every process that shares an address
//! ([`super::share`]) adds what its device counts to these pages and reads the device's
//! counters from them (docs/architecture.md, "A host's device").
//!
//! The pages are a memfd that the keeper (`net::keeper`) makes when it starts and hands
//! each process with its slot's socket (`SCM_RIGHTS`). It is [`PAGES_LEN`] bytes long,
//! sealed against shrinking and growing (`F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL`: no
//! access through a mapping of it can fall past its end) and allocated when made
//! (`fallocate`: a store never finds its page missing). It holds native-endian u64 words (its
//! processes are on one host), each only ever read and written with atomic operations:
//!
//! | words | what |
//! |---|---|
//! | 0 | [`MAGIC`] |
//! | 1 | counters per block, `Counters::LEN` (37: rxe's 16, then one per drop reason) |
//! | 2 | words per block, [`BLOCK_WORDS`] (the counters padded to a 64-byte line: 40) |
//! | 3 | blocks, [`MAX_SLOTS`] (256) |
//! | 4 ..= 7 | 0 |
//! | 8 + s × [`BLOCK_WORDS`], `Counters::LEN` words | slot `s`'s block: its counters in the order of `Counters::NAMES` |
//!
//! Slot 0's block is the keeper's (datagrams for no process, the CM answers it sends); the
//! block of slot `s` ≥ 1 is added to by the process holding slot `s` alone (its device adds
//! under its lock), each add a relaxed atomic load and store on cache lines no other process
//! writes: the data path's cost is a few plain loads and stores per pump, no locked
//! instruction (`crate::verbs::SharedCounters`). A `fork`ed child that went on using its
//! parent's device object would be a second writer, whose adds could overwrite some of the
//! parent's (counts lost, nothing else; a child opens its own devices). A block is never reset:
//! when a process exits or is killed its counts stay in its slot's block, and the process the
//! slot is given to next adds to them. So the device's counters are the sum of all blocks,
//! whichever processes live, and they only grow, as rxe's do; nothing folds a block away, so
//! no reader can count a process gone twice or not at all. Sums wrap: whatever another process
//! wrote there, reading never panics. The pages live as long as the keeper: the device's
//! counters start at 0 with the keeper that the first process of an address starts.

use super::steer::MAX_SLOTS;

// Every slot's block (slots are u8) is inside the pages.
const _: () = assert!(MAX_SLOTS == 1 << u8::BITS);
use crate::transport::Counters;
use crate::verbs::SharedCounters;
use rustix::fs::{FallocateFlags, MemfdFlags, SealFlags};
use rustix::mm::{MapFlags, ProtFlags};
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

/// Word 0 of the pages: "srcntr01" (little-endian), the layout's name and version.
pub const MAGIC: u64 = u64::from_le_bytes(*b"srcntr01");
/// Words before slot 0's block (the header, one 64-byte line).
pub const HEADER_WORDS: usize = 8;
/// Words per slot block: `Counters::LEN` rounded up to whole 64-byte lines, so that no two
/// processes write one line.
pub const BLOCK_WORDS: usize = Counters::LEN.div_ceil(8) * 8;
const _: () = assert!(BLOCK_WORDS.is_multiple_of(8) && BLOCK_WORDS >= Counters::LEN);
/// Words of the pages: the header and [`MAX_SLOTS`] blocks.
pub const WORDS: usize = HEADER_WORDS + MAX_SLOTS * BLOCK_WORDS;
/// Length of the pages in bytes.
pub const PAGES_LEN: usize = WORDS * 8;

/// A mapping of a shared device's counter pages.
pub(super) struct CounterPages {
    /// Word 0 of a shared mapping of [`PAGES_LEN`] bytes, owned by this value (unmapped on
    /// drop).
    base: NonNull<AtomicU64>,
}

// SAFETY: the mapping is reached only through `&AtomicU64` (`CounterPages::word`), which any
// thread may use at once; the pointer is this value's alone, unmapped once, when it drops.
unsafe impl Send for CounterPages {}
// SAFETY: as for Send: shared references give atomic access only.
unsafe impl Sync for CounterPages {}

impl core::fmt::Debug for CounterPages {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("CounterPages")
            .field("base", &self.base)
            .field("len", &PAGES_LEN)
            .finish()
    }
}

impl CounterPages {
    /// Makes new pages (the keeper, once): a sealed, allocated memfd with the header written
    /// and every counter 0, and its mapping. Errors: those of `memfd_create`, `ftruncate`,
    /// `fallocate` (ENOSPC, ENOMEM), the seals and `mmap`.
    pub(super) fn create() -> io::Result<(OwnedFd, CounterPages)> {
        let fd = rustix::fs::memfd_create(
            c"softroce-counters",
            MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING,
        )?;
        rustix::fs::ftruncate(&fd, PAGES_LEN as u64)?;
        rustix::fs::fallocate(&fd, FallocateFlags::empty(), 0, PAGES_LEN as u64)?;
        rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)?;
        let pages = CounterPages::map(&fd)?;
        for (i, v) in [
            MAGIC,
            Counters::LEN as u64,
            BLOCK_WORDS as u64,
            MAX_SLOTS as u64,
        ]
        .into_iter()
        .enumerate()
        {
            if let Some(w) = pages.word(i) {
                w.store(v, Ordering::Relaxed);
            }
        }
        Ok((fd, pages))
    }

    /// Maps the pages a keeper handed this process, after checking that they are what
    /// [`CounterPages::create`] makes. Errors: `InvalidData` naming what is wrong when `fd` is
    /// not a memfd sealed against shrinking, not [`PAGES_LEN`] bytes long, or its header is
    /// not this layout's (a keeper of another softroce build); those of `fstat` and `mmap`.
    pub(super) fn open(fd: impl AsFd) -> io::Result<CounterPages> {
        let bad = |why: String| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("the device keeper's counter pages: {why}"),
            )
        };
        let size = rustix::fs::fstat(&fd)?.st_size;
        if u64::try_from(size).ok() != Some(PAGES_LEN as u64) {
            return Err(bad(format!("{size} bytes, not {PAGES_LEN}")));
        }
        // Only a file sealed against shrinking cannot end before the mapping does (a
        // store past a file's end raises SIGBUS).
        let seals = rustix::fs::fcntl_get_seals(&fd)
            .map_err(|e| bad(format!("not a sealed memfd ({e})")))?;
        if !seals.contains(SealFlags::SHRINK) {
            return Err(bad("not sealed against shrinking".into()));
        }
        let pages = CounterPages::map(&fd)?;
        let header: Vec<u64> = (0..HEADER_WORDS)
            .map(|i| pages.word(i).map_or(0, |w| w.load(Ordering::Relaxed)))
            .collect();
        let want = [
            MAGIC,
            Counters::LEN as u64,
            BLOCK_WORDS as u64,
            MAX_SLOTS as u64,
            0,
            0,
            0,
            0,
        ];
        if header != want {
            return Err(bad(format!(
                "header {header:x?}, not {want:x?} (a keeper of another softroce build?)"
            )));
        }
        Ok(pages)
    }

    /// A shared read-write mapping of the first [`PAGES_LEN`] bytes of `fd`, which must be at
    /// least that long and unable to shrink (checked, or made so, by the callers).
    fn map(fd: impl AsFd) -> io::Result<CounterPages> {
        // SAFETY: a new mapping at an address the kernel picks, so no memory of this
        // program changes; `fd` is a file of at least PAGES_LEN bytes that cannot shrink,
        // so every byte of the mapping stays backed by it.
        let p = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                PAGES_LEN,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED,
                fd,
                0,
            )?
        };
        let base = NonNull::new(p.cast::<AtomicU64>())
            .ok_or_else(|| io::Error::from_raw_os_error(libc::ENOMEM))?;
        Ok(CounterPages { base })
    }

    /// Word `i` of the pages; `None` past their end.
    fn word(&self, i: usize) -> Option<&AtomicU64> {
        // SAFETY: `i` < WORDS, so the word lies inside the mapping, which lives as long as
        // `self`; the page-aligned base plus 8 × i is aligned for AtomicU64; every process
        // that maps the pages accesses them only atomically.
        (i < WORDS).then(|| unsafe { self.base.add(i).as_ref() })
    }

    /// Slot `slot`'s counters, in the order of `Counters::NAMES` (every slot's block is
    /// inside the pages: `MAX_SLOTS` is 256).
    fn block(&self, slot: u8) -> impl Iterator<Item = &AtomicU64> {
        let start = HEADER_WORDS + usize::from(slot) * BLOCK_WORDS;
        (start..start + Counters::LEN).filter_map(|i| self.word(i))
    }

    /// Adds `n` to counter `index` (in the order of `Counters::NAMES`) of slot `slot`'s
    /// block; nothing for an index past the counters. The block's one writer calls this (the
    /// process holding the slot, under its device's lock; the keeper for slot 0): a relaxed
    /// load and store, no locked instruction on the data path.
    pub(super) fn add(&self, slot: u8, index: usize, n: u64) {
        if index < Counters::LEN
            && let Some(w) = self.word(HEADER_WORDS + usize::from(slot) * BLOCK_WORDS + index)
        {
            w.store(w.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed);
        }
    }

    /// Slot `slot`'s block's values.
    pub(super) fn slot_values(&self, slot: u8) -> [u64; Counters::LEN] {
        let mut v = [0u64; Counters::LEN];
        for (v, w) in v.iter_mut().zip(self.block(slot)) {
            *v = w.load(Ordering::Relaxed);
        }
        v
    }

    /// The device's counters: every block summed (wrapping).
    pub(super) fn total(&self) -> Counters {
        let mut sum = [0u64; Counters::LEN];
        for slot in 0..=u8::MAX {
            for (s, w) in sum.iter_mut().zip(self.block(slot)) {
                *s = s.wrapping_add(w.load(Ordering::Relaxed));
            }
        }
        Counters::from_values(&sum)
    }
}

impl Drop for CounterPages {
    fn drop(&mut self) {
        // SAFETY: the mapping `map` made, of PAGES_LEN bytes; no reference into it outlives
        // `self` (`word`'s borrow `self`).
        let _ = unsafe { rustix::mm::munmap(self.base.as_ptr().cast(), PAGES_LEN) };
    }
}

/// A process's part of a shared device's counters: the block of its slot in the counter
/// pages its keeper handed it (`Share::join`).
#[derive(Debug)]
pub struct SlotCounters {
    pages: CounterPages,
    slot: u8,
}

impl SlotCounters {
    pub(super) fn new(pages: CounterPages, slot: u8) -> SlotCounters {
        SlotCounters { pages, slot }
    }

    /// The counts in this process's slot's block: this process's and those of the processes
    /// that held the slot before it.
    pub fn slot_counters(&self) -> Counters {
        Counters::from_values(&self.pages.slot_values(self.slot))
    }
}

impl SharedCounters for SlotCounters {
    fn add(&self, index: usize, n: u64) {
        self.pages.add(self.slot, index, n);
    }

    fn total(&self) -> Counters {
        self.pages.total()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::DropReason;

    /// The index of counter `name`.
    fn at(name: &str) -> usize {
        Counters::NAMES.iter().position(|x| *x == name).unwrap()
    }

    /// A second mapping of the same memfd, as a process that received it maps it.
    fn reopen(fd: &OwnedFd) -> CounterPages {
        // Through a new descriptor, as SCM_RIGHTS gives one.
        let dup = rustix::io::fcntl_dupfd_cloexec(fd, 0).unwrap();
        CounterPages::open(&dup).unwrap()
    }

    #[test]
    fn the_total_is_every_block_summed_and_survives_the_processes_gone() {
        let (fd, keeper) = CounterPages::create().unwrap();
        assert_eq!(keeper.total(), Counters::default());
        let a = SlotCounters::new(reopen(&fd), 1);
        let b = SlotCounters::new(reopen(&fd), 2);
        a.add(at("sent_pkts"), 5);
        a.add(at("rcvd_pkts"), 5);
        b.add(at("sent_pkts"), 3);
        keeper.add(0, at(DropReason::UnknownQp.name()), 1);
        let t = b.total();
        assert_eq!((t.sent_pkts, t.rcvd_pkts), (8, 5));
        assert_eq!(t.dropped(DropReason::UnknownQp), 1);
        assert_eq!(a.total(), t, "every process reads the same total");
        assert_eq!(a.slot_counters().sent_pkts, 5);
        // Process a is gone (its mapping with it): its counts stay.
        drop(a);
        assert_eq!(b.total(), t);
        // Slot 1 is given to a new process: it adds to the slot's block.
        let c = SlotCounters::new(reopen(&fd), 1);
        c.add(at("sent_pkts"), 2);
        assert_eq!(c.slot_counters().sent_pkts, 7);
        assert_eq!(b.total().sent_pkts, 10);
        assert_eq!(keeper.total().sent_pkts, 10);
    }

    #[test]
    fn blocks_are_whole_lines_and_fit_every_slot() {
        let (fd, p) = CounterPages::create().unwrap();
        // The last counter of the last slot is the pages' last block's.
        p.add(u8::MAX, Counters::LEN - 1, 9);
        assert_eq!(reopen(&fd).slot_values(u8::MAX)[Counters::LEN - 1], 9);
        let w = p.word(WORDS - BLOCK_WORDS + Counters::LEN - 1).unwrap();
        assert_eq!(w.load(Ordering::Relaxed), 9);
        assert!(p.word(WORDS).is_none());
        // An index past the counters (into the block's padding, or the next block) is not
        // added anywhere.
        p.add(3, Counters::LEN, 1);
        assert_eq!(p.total(), reopen(&fd).total());
        assert_eq!(p.slot_values(4), [0; Counters::LEN]);
        let pad = p
            .word(HEADER_WORDS + 3 * BLOCK_WORDS + Counters::LEN)
            .unwrap();
        assert_eq!(pad.load(Ordering::Relaxed), 0);
        assert_eq!(rustix::fs::fstat(&fd).unwrap().st_size as usize, PAGES_LEN);
    }

    #[test]
    fn sums_wrap_instead_of_panicking() {
        let (_fd, p) = CounterPages::create().unwrap();
        p.add(1, at("sent_pkts"), u64::MAX);
        p.add(2, at("sent_pkts"), 2);
        assert_eq!(p.total().sent_pkts, 1);
    }

    /// Whatever a keeper hands over that is not these pages is an error saying so, never a
    /// mapping that could fault or a panic.
    #[test]
    fn bad_pages_are_errors() {
        let invalid = |r: io::Result<CounterPages>| match r {
            Err(e) => {
                assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
                e.to_string()
            }
            Ok(_) => panic!("accepted"),
        };
        let memfd = |len: u64, seals: SealFlags| {
            let fd = rustix::fs::memfd_create(
                c"softroce-test",
                MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING,
            )
            .unwrap();
            rustix::fs::ftruncate(&fd, len).unwrap();
            if !seals.is_empty() {
                rustix::fs::fcntl_add_seals(&fd, seals).unwrap();
            }
            fd
        };
        // Short.
        let short = memfd(PAGES_LEN as u64 - 8, SealFlags::SHRINK);
        assert!(invalid(CounterPages::open(&short)).contains("bytes"));
        // Long enough but free to shrink under the mapping.
        let unsealed = memfd(PAGES_LEN as u64, SealFlags::empty());
        assert!(invalid(CounterPages::open(&unsealed)).contains("shrinking"));
        // No memfd at all: a socket.
        let (s, _t) = std::os::unix::net::UnixStream::pair().unwrap();
        invalid(CounterPages::open(&s));
        // The right size and seals, another layout (all zero: no magic).
        let zero = memfd(PAGES_LEN as u64, SealFlags::SHRINK);
        assert!(invalid(CounterPages::open(&zero)).contains("header"));
        // Another counter count.
        let (fd, p) = CounterPages::create().unwrap();
        p.word(1)
            .unwrap()
            .store(Counters::LEN as u64 + 1, Ordering::Relaxed);
        assert!(invalid(CounterPages::open(&fd)).contains("header"));
    }
}
