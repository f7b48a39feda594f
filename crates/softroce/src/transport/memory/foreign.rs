//! Application memory under an MR, reached only through raw pointers (see the parent
//! module's doc and docs/memory.md).

use super::MemError;
use core::ptr::NonNull;
use core::sync::atomic::{AtomicU8, AtomicU64, Ordering};

/// Application memory under an MR: `len` bytes at `ptr`, valid for reads and writes for as
/// long as the MR lives (the contract of [`MrTable::register_user`]) and read and written by
/// the application meanwhile, so no Rust reference is ever formed over them. Bytes move
/// through raw pointers ([`ForeignMem::read_into`], [`ForeignMem::write_from`]), atomics
/// through [`AtomicU64::from_ptr`] ([`ForeignMem::atomic_u64`]), and sends hand the socket
/// the address and length ([`ForeignMem::raw`]).
///
/// A copy is not atomic: what it reads (or what the application reads) while the other side
/// writes the same bytes is unspecified, as it is under a NIC's DMA. Rust's memory model
/// counts such an overlap as a data race; what this type guarantees is that the engine never
/// adds one of its own making (no `&`/`&mut` whose no-alias promise an application write
/// would break, no read the compiler may assume repeats an earlier one).
///
/// [`MrTable::register_user`]: super::MrTable::register_user
#[derive(Debug)]
pub struct ForeignMem {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: a `ForeignMem` is an address and a length; every access through it is a raw-pointer
// copy or an atomic (no reference is formed), which is as sound from one thread as another.
// The memory stays valid while the MR lives (`register_user`'s contract), and the MR table
// that holds the value is only reached under the device lock.
unsafe impl Send for ForeignMem {}
// SAFETY: as for `Send`; `&ForeignMem` gives the same raw-pointer access as the owned value,
// whose writes (`write_from`) are serialized by the device lock around the table.
unsafe impl Sync for ForeignMem {}

impl ForeignMem {
    /// The `len` bytes at `ptr`.
    ///
    /// # Safety
    /// `ptr` must be valid for reads and writes of `len` bytes for as long as the value (and
    /// every [`MrBytes`] drawn from it) is used.
    pub(super) unsafe fn new(ptr: NonNull<u8>, len: usize) -> ForeignMem {
        ForeignMem { ptr, len }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for no bytes (registration refuses a length of 0, so never in a table).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Host address of byte 0.
    pub fn addr(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }

    /// A pointer to byte `offset`, when `[offset, offset + len)` lies inside.
    /// Errors: [`MemError::Range`] otherwise.
    pub(super) fn at(&self, offset: usize, len: usize) -> Result<*mut u8, MemError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => {
                // SAFETY: `offset <= end <= self.len`, so the result stays inside (or one past
                // the end of) the `len` bytes `new`'s caller vouched for.
                Ok(unsafe { self.ptr.as_ptr().add(offset) })
            }
            _ => Err(MemError::Range),
        }
    }

    /// Copies `out.len()` bytes starting at `offset` into `out`.
    /// Errors: [`MemError::Range`] when they do not lie inside.
    pub fn read_into(&self, offset: usize, out: &mut [u8]) -> Result<(), MemError> {
        let src = self.at(offset, out.len())?;
        // SAFETY: `src` is valid for `out.len()` bytes of reads (`at` checked the range
        // against the memory `new`'s caller vouched for); `out` is a buffer of ours, so the
        // two cannot overlap (no reference over the foreign bytes exists to alias it).
        unsafe { core::ptr::copy_nonoverlapping(src, out.as_mut_ptr(), out.len()) };
        Ok(())
    }

    /// Copies `data` to `offset`. The last byte is stored after all the others, with release
    /// ordering: an application that sees it change (with an acquire load, as perftest's
    /// latency tests spin on the last byte of a buffer the peer writes) then reads the whole
    /// copy, as it would after a NIC's in-order DMA. Writes of one MR are serialized by the
    /// device lock around the table.
    /// Errors: [`MemError::Range`] when `[offset, offset + data.len())` does not lie inside.
    pub fn write_from(&self, offset: usize, data: &[u8]) -> Result<(), MemError> {
        let dst = self.at(offset, data.len())?;
        let Some((&last, head)) = data.split_last() else {
            return Ok(());
        };
        // SAFETY: `dst` is valid for `data.len()` bytes of writes (`at` checked the range);
        // `data` is ours and cannot overlap memory we hold no reference to.
        unsafe { core::ptr::copy_nonoverlapping(data.as_ptr(), dst, head.len()) };
        // SAFETY: `dst + head.len()` is the last byte of the checked range, valid for writes
        // for the MR's lifetime; `AtomicU8` has alignment 1; accesses to it during the store
        // are the application's, which the contract of `register_user` allows.
        let flag = unsafe { AtomicU8::from_ptr(dst.add(head.len())) };
        flag.store(last, Ordering::Release);
        Ok(())
    }

    /// The 8 bytes at `offset` as an atomic, for an ATOMIC request (the application may
    /// use them concurrently, atomically or not; rxe does a native u64 operation too).
    /// Errors: [`MemError::Range`] when they do not lie inside or their host address is not
    /// 8-byte aligned (the responder checked the virtual address, which for application
    /// memory is the host address).
    pub fn atomic_u64(&self, offset: usize) -> Result<&AtomicU64, MemError> {
        let p = self.at(offset, 8)?;
        if !(p as usize).is_multiple_of(core::mem::align_of::<AtomicU64>()) {
            return Err(MemError::Range);
        }
        // SAFETY: `p` is 8-byte aligned and valid for 8 bytes of reads and writes for as long
        // as `&self` (the MR) lives; every access the engine makes to these bytes while the
        // returned reference lives is through it, and an atomic reference tolerates other
        // threads' concurrent accesses.
        Ok(unsafe { AtomicU64::from_ptr(p.cast::<u64>()) })
    }

    /// Address and length of `[offset, offset + len)`, for the socket's iovec (zero-copy
    /// send). The kernel reads the bytes; nothing in Rust does.
    /// Errors: [`MemError::Range`] when the range does not lie inside.
    pub fn raw(&self, offset: usize, len: usize) -> Result<(NonNull<u8>, usize), MemError> {
        let p = self.at(offset, len)?;
        Ok((NonNull::new(p).ok_or(MemError::Range)?, len))
    }
}

/// Bytes of an MR, checked and ready to copy or send: a slice of memory the engine owns, or
/// a range of application memory (never sliced). Valid while the table borrow `'a` lasts.
#[derive(Debug, Clone, Copy)]
pub enum MrBytes<'a> {
    /// Engine-owned memory ([`MrTable::register`], [`MrTable::alloc_fast_reg`]).
    ///
    /// [`MrTable::register`]: super::MrTable::register
    /// [`MrTable::alloc_fast_reg`]: super::MrTable::alloc_fast_reg
    Owned(&'a [u8]),
    /// `len` bytes at `offset` of application memory ([`MrTable::register_user`]).
    ///
    /// [`MrTable::register_user`]: super::MrTable::register_user
    Foreign {
        /// The MR's memory.
        mem: &'a ForeignMem,
        /// First byte.
        offset: usize,
        /// Length in bytes (checked against `mem` when this was made).
        len: usize,
    },
}

/// Foreign bytes are copied through a stack buffer of this size when code needs a slice of
/// them (the ICRC of a zero-copy send): small enough to stay in L1.
pub(super) const BOUNCE_BYTES: usize = 1024;

impl MrBytes<'_> {
    /// Length in bytes.
    pub fn len(&self) -> usize {
        match self {
            MrBytes::Owned(b) => b.len(),
            MrBytes::Foreign { len, .. } => *len,
        }
    }

    /// True for no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Copies the bytes into `out`, which must be exactly as long.
    /// Errors: [`MemError::Length`] when it is not.
    pub fn copy_to(&self, out: &mut [u8]) -> Result<(), MemError> {
        if out.len() != self.len() {
            return Err(MemError::Length);
        }
        match self {
            MrBytes::Owned(b) => {
                out.copy_from_slice(b);
                Ok(())
            }
            MrBytes::Foreign { mem, offset, .. } => mem.read_into(*offset, out),
        }
    }

    /// How many slices [`MrBytes::for_each_chunk`] hands out.
    pub fn chunks(&self) -> usize {
        match self {
            MrBytes::Owned(_) => 1,
            MrBytes::Foreign { len, .. } => len.div_ceil(BOUNCE_BYTES),
        }
    }

    /// Calls `each` with the bytes in order, as one slice (owned memory) or as copies of up
    /// to `BOUNCE_BYTES` (1 KiB) (application memory, which is never sliced).
    pub fn for_each_chunk(&self, mut each: impl FnMut(&[u8])) {
        match self {
            MrBytes::Owned(b) => each(b),
            MrBytes::Foreign { mem, offset, len } => {
                let mut bounce = [0u8; BOUNCE_BYTES];
                let mut done = 0;
                while done < *len {
                    let n = (*len - done).min(BOUNCE_BYTES);
                    let chunk = &mut bounce[..n];
                    // In range: `len` was checked against `mem` when `self` was made.
                    if mem.read_into(offset + done, chunk).is_err() {
                        return;
                    }
                    each(chunk);
                    done += n;
                }
            }
        }
    }

    /// Address and length, for a zero-copy send's iovec.
    pub fn raw(&self) -> (NonNull<u8>, usize) {
        match self {
            MrBytes::Owned(b) => (NonNull::from(*b).cast(), b.len()),
            MrBytes::Foreign { mem, offset, len } => {
                // In range: `len` was checked against `mem` when `self` was made.
                mem.raw(*offset, *len).unwrap_or((mem.ptr, 0))
            }
        }
    }
}
