//! Memory regions and memory windows: the key tables and the checks every local and remote
//! access goes through.
//!
//! An MR either owns its bytes (a boxed slice that never moves, so its heap address serves as
//! the MR's virtual address, as a real registration would) or lies over application memory
//! ([`MrTable::register_user`], valid for the MR's lifetime). The application keeps reading
//! and writing that memory while RDMA traffic lands in it, so the engine never forms a Rust
//! reference over it: [`ForeignMem`] moves bytes with `ptr::copy_nonoverlapping`, does
//! atomics with [`AtomicU64::from_ptr`] and gives sends an address and a length for the
//! socket (STYLE.md §3; docs/memory.md has the sanitizer and Miri commands). Owned memory is
//! sliced as usual. Keys
//! follow rxe: `lkey == rkey == index << 8 | key byte`; MR indices are 1..=0x1_0000 and MW
//! indices 0x1_0001..=0x2_0000 (rxe `RXE_MIN_MW_INDEX`), so an R_Key names an MR or an MW by
//! its index alone (rxe `rkey_is_mw`). The key byte of a new registration is drawn from the
//! device's seeded generator and always differs from the last key byte used at that index, and
//! indices are handed out cyclically, so a stale key is rejected after re-registration.
//!
//! Fast-register MRs ([`MrTable::alloc_fast_reg`]) start in the FREE state and become usable
//! only through a REG_MR work request; LOCAL_INV and SEND_WITH_INVALIDATE put them back in
//! FREE (rxe `rxe_reg_fast_mr`, `rxe_invalidate_mr`).
//!
//! The window entries ([`MwEntry`]) and the checks an access through one goes through live
//! here too, beside the MRs they point into; the operations that change them (BIND_MW,
//! REG_MR, LOCAL_INV, SEND_WITH_INVALIDATE) are `mw.rs`, which builds on this module and not
//! the other way round.
//!
//! Source: IBTA Vol 1 ch. 10 (memory regions and windows, L_Key/R_Key checks) and C9-88
//! (zero-length RDMA needs no valid R_Key); rxe `rxe_mr.c` (`lookup_mr`, `mr_check_range`,
//! `rxe_mr_copy`), `rxe_pool.c` (cyclic index allocation).

use super::{AccessFlags, Sge};
use core::ptr::NonNull;
use core::sync::atomic::{AtomicU8, AtomicU64, Ordering};

/// Why an access to registered memory (or a memory operation) was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemError {
    /// No live MR or MW has this key (wrong index, wrong key byte, or deregistered).
    BadKey,
    /// The MR or MW belongs to another protection domain.
    PdMismatch,
    /// The MR or MW was not registered (bound) with the access the operation needs.
    Access,
    /// The byte range is not inside the MR or MW (or overflows u64).
    Range,
    /// The scatter/gather list is shorter than the data.
    Length,
    /// The MR or MW is not in the state the operation needs (a FREE fast-register MR, an
    /// unbound window, REG_MR of an MR that is not FREE).
    State,
    /// The operation does not apply to this kind of MR or MW (invalidating an MR made by
    /// `reg_mr` or a type 1 window, REG_MR of an ordinary MR).
    Type,
    /// The MR still has memory windows bound to it.
    Busy,
    /// A type 2 window bound to another QP.
    WrongQp,
}

/// The state of an MR. Source: rxe `enum rxe_mr_state`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MrState {
    /// Usable.
    Valid,
    /// Allocated but not registered (fast-register MR before REG_MR, or after invalidation).
    Free,
}

/// How an MR was made. Source: `enum ib_mr_type` (`IB_MR_TYPE_USER`, `IB_MR_TYPE_MEM_REG`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MrKind {
    /// `reg_mr` / `reg_mr_user`: valid from registration until deregistration.
    User,
    /// `alloc_mr`: registered and invalidated by work requests.
    FastReg,
}

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
    unsafe fn new(ptr: NonNull<u8>, len: usize) -> ForeignMem {
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
    fn at(&self, offset: usize, len: usize) -> Result<*mut u8, MemError> {
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
    Owned(&'a [u8]),
    /// `len` bytes at `offset` of application memory ([`MrTable::register_user`]).
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
const BOUNCE_BYTES: usize = 1024;

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
    /// to [`BOUNCE_BYTES`] (application memory, which is never sliced).
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

/// The operation of an ATOMIC request on the 8 bytes it names (in the responder's host
/// order, as rxe does a native u64 operation). Source: IBTA Vol 1 ch. 9 (atomic operations);
/// rxe `rxe_resp.c` `atomic_reply`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AtomicOp {
    /// Store `swap` if the value equals `compare`.
    CompareSwap {
        /// Compared with the value.
        compare: u64,
        /// Stored when they are equal.
        swap: u64,
    },
    /// Add, wrapping.
    FetchAdd(u64),
}

impl AtomicOp {
    fn apply(self, orig: u64) -> u64 {
        match self {
            AtomicOp::CompareSwap { compare, swap } if orig == compare => swap,
            AtomicOp::CompareSwap { .. } => orig,
            AtomicOp::FetchAdd(add) => orig.wrapping_add(add),
        }
    }
}

/// The bytes behind an MR.
#[derive(Debug)]
enum MrBuf {
    /// Engine memory: a boxed slice that never moves, sliced as usual.
    Owned(Box<[u8]>),
    /// Application memory: never sliced.
    Foreign(ForeignMem),
}

impl MrBuf {
    fn len(&self) -> usize {
        match self {
            MrBuf::Owned(b) => b.len(),
            MrBuf::Foreign(m) => m.len(),
        }
    }
    fn addr(&self) -> u64 {
        match self {
            MrBuf::Owned(b) => b.as_ptr() as u64,
            MrBuf::Foreign(m) => m.addr(),
        }
    }
}

/// One memory region.
#[derive(Debug)]
pub struct MrEntry {
    /// Local key (== rkey).
    pub lkey: u32,
    /// Protection domain handle.
    pub pd: u32,
    /// Access rights granted at registration.
    pub access: AccessFlags,
    /// Virtual address of byte 0 (the buffer's address, or what REG_MR set).
    pub iova: u64,
    length: u64,
    state: MrState,
    kind: MrKind,
    /// Memory windows bound to this MR.
    pub(super) num_mw: u32,
    buf: MrBuf,
}

impl MrEntry {
    /// Registered length in bytes (0 for a fast-register MR never registered).
    pub fn length(&self) -> u64 {
        self.length
    }
    /// State.
    pub fn state(&self) -> MrState {
        self.state
    }
    /// Kind.
    pub fn kind(&self) -> MrKind {
        self.kind
    }
    /// The MR's whole buffer (for a fast-register MR, all `max_num_sg` pages) when the
    /// engine owns it; `None` for application memory, which is never sliced.
    pub fn owned_bytes(&self) -> Option<&[u8]> {
        match &self.buf {
            MrBuf::Owned(b) => Some(b),
            MrBuf::Foreign(_) => None,
        }
    }
    /// As [`MrEntry::owned_bytes`], writable.
    pub fn owned_bytes_mut(&mut self) -> Option<&mut [u8]> {
        match &mut self.buf {
            MrBuf::Owned(b) => Some(b),
            MrBuf::Foreign(_) => None,
        }
    }
    /// Size of the buffer in bytes (for a fast-register MR, all its pages).
    pub fn buf_len(&self) -> usize {
        self.buf.len()
    }
    /// Host address of the buffer's byte 0.
    pub fn host_addr(&self) -> u64 {
        self.buf.addr()
    }
    /// The `len` bytes at byte `offset` of the buffer.
    /// Errors: [`MemError::Range`] when they do not lie inside it.
    pub fn bytes_at(&self, offset: usize, len: usize) -> Result<MrBytes<'_>, MemError> {
        match &self.buf {
            MrBuf::Owned(b) => offset
                .checked_add(len)
                .and_then(|end| b.get(offset..end))
                .map(MrBytes::Owned)
                .ok_or(MemError::Range),
            MrBuf::Foreign(mem) => {
                mem.at(offset, len)?;
                Ok(MrBytes::Foreign { mem, offset, len })
            }
        }
    }
    /// Copies `out.len()` bytes from byte `offset` of the buffer.
    /// Errors: [`MemError::Range`] when they do not lie inside it.
    pub fn read(&self, offset: usize, out: &mut [u8]) -> Result<(), MemError> {
        self.bytes_at(offset, out.len())?.copy_to(out)
    }
    /// Copies `data` to byte `offset` of the buffer (for application memory, the last byte
    /// last, as [`ForeignMem::write_from`] says).
    /// Errors: [`MemError::Range`] when it does not fit inside.
    pub fn write(&mut self, offset: usize, data: &[u8]) -> Result<(), MemError> {
        match &mut self.buf {
            MrBuf::Owned(b) => {
                let dst = offset
                    .checked_add(data.len())
                    .and_then(|end| b.get_mut(offset..end))
                    .ok_or(MemError::Range)?;
                dst.copy_from_slice(data);
                Ok(())
            }
            MrBuf::Foreign(mem) => mem.write_from(offset, data),
        }
    }
    /// Applies `op` to the 8 bytes at byte `offset` of the buffer and returns their value
    /// before it. Application memory is changed with one atomic operation (the application
    /// may use the word concurrently); owned memory, which only the engine reaches, in
    /// place. Errors: as [`ForeignMem::atomic_u64`].
    pub fn atomic(&mut self, offset: usize, op: AtomicOp) -> Result<u64, MemError> {
        match &mut self.buf {
            MrBuf::Owned(b) => {
                let cell: &mut [u8; 8] = offset
                    .checked_add(8)
                    .and_then(|end| b.get_mut(offset..end))
                    .and_then(|c| c.try_into().ok())
                    .ok_or(MemError::Range)?;
                let orig = u64::from_ne_bytes(*cell);
                *cell = op.apply(orig).to_ne_bytes();
                Ok(orig)
            }
            MrBuf::Foreign(mem) => {
                let cell = mem.atomic_u64(offset)?;
                Ok(match op {
                    AtomicOp::CompareSwap { compare, swap } => cell
                        .compare_exchange(compare, swap, Ordering::AcqRel, Ordering::Acquire)
                        .unwrap_or_else(|cur| cur),
                    AtomicOp::FetchAdd(add) => cell.fetch_add(add, Ordering::AcqRel),
                })
            }
        }
    }

    /// REG_MR: the MR becomes VALID with this length and access.
    pub(super) fn set_registered(&mut self, length: u64, access: AccessFlags) {
        self.length = length;
        self.access = access;
        self.state = MrState::Valid;
    }
    /// Invalidation: back to FREE.
    pub(super) fn set_free(&mut self) {
        self.state = MrState::Free;
    }

    /// Offset of `[va, va + len)` inside the MR, or [`MemError::Range`].
    /// Overflow-safe: `va + len` is computed in checked arithmetic.
    pub fn offset_of(&self, va: u64, len: u64) -> Result<usize, MemError> {
        let end = va.checked_add(len).ok_or(MemError::Range)?;
        let mr_end = self.iova.checked_add(self.length).ok_or(MemError::Range)?;
        if va < self.iova || end > mr_end {
            return Err(MemError::Range);
        }
        usize::try_from(va - self.iova).map_err(|_| MemError::Range)
    }
}

/// Maximum number of MRs per device (rxe `RXE_MAX_MR_INDEX` was 0x1_0000).
pub const MAX_MR: usize = 1 << 16;
/// Key index of the first MR slot.
const MR_BASE: u32 = 1;

/// A range of key indices: slots handed out cyclically, with the last key byte of each slot
/// remembered so that the next registration there gets another one.
#[derive(Debug)]
pub(super) struct KeySpace<T> {
    pub(super) slots: Vec<Option<T>>,
    last_byte: Vec<Option<u8>>,
    next: usize,
    base: u32,
    max: usize,
}

impl<T> KeySpace<T> {
    pub(super) const fn new(base: u32, max: usize) -> KeySpace<T> {
        KeySpace {
            slots: Vec::new(),
            last_byte: Vec::new(),
            next: 0,
            base,
            max,
        }
    }

    /// A free slot, searching cyclically from the one after the last handed out (rxe pools
    /// allocate indices cyclically, so a freed index is not reused at once).
    pub(super) fn alloc(&mut self) -> Option<usize> {
        for i in 0..self.max {
            let idx = (self.next + i) % self.max;
            if idx == self.slots.len() {
                self.slots.push(None);
                self.last_byte.push(None);
            }
            if matches!(self.slots.get(idx), Some(None)) {
                self.next = (idx + 1) % self.max;
                return Some(idx);
            }
        }
        None
    }

    /// The slot a key's index names, if inside this space.
    pub(super) fn slot_of(&self, key: u32) -> Option<usize> {
        let i = (key >> 8).checked_sub(self.base)? as usize;
        (i < self.slots.len()).then_some(i)
    }

    /// The key of `slot` with key byte `byte`.
    pub(super) fn key(&self, slot: usize, byte: u8) -> u32 {
        ((slot as u32 + self.base) << 8) | u32::from(byte)
    }

    /// A key byte for a new registration in `slot`: from `rng`, never the slot's last one.
    pub(super) fn fresh_byte(&mut self, slot: usize, rng: &mut u64) -> u8 {
        let last = self.last_byte.get(slot).copied().flatten();
        let mut b = splitmix_byte(rng);
        // Bounded: a few draws, then a step away from the last byte.
        for _ in 0..8 {
            if Some(b) != last {
                break;
            }
            b = splitmix_byte(rng);
        }
        if Some(b) == last {
            b = b.wrapping_add(1);
        }
        if let Some(l) = self.last_byte.get_mut(slot) {
            *l = Some(b);
        }
        b
    }

    /// Records `byte` as the slot's last key byte (REG_MR and MW binds choose their own).
    pub(super) fn note_byte(&mut self, slot: usize, byte: u8) {
        if let Some(l) = self.last_byte.get_mut(slot) {
            *l = Some(byte);
        }
    }
}

/// Key index of the first MW slot (rxe `RXE_MIN_MW_INDEX`).
pub(super) const MW_BASE: u32 = 0x0001_0001;
/// Most memory windows per device (rxe `RXE_MAX_MW`).
pub const MAX_MW: usize = 0x1000;

/// True when `key`'s index lies in the memory-window range (rxe `rkey_is_mw`).
pub fn is_mw_key(key: u32) -> bool {
    let index = key >> 8;
    (MW_BASE..MW_BASE + MAX_MW as u32).contains(&index)
}

/// Memory window type. Source: `enum ibv_mw_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MwType {
    /// `IBV_MW_TYPE_1`: bound with `ibv_bind_mw`, not invalidatable.
    Type1,
    /// `IBV_MW_TYPE_2` (rxe implements 2B): bound by a BIND_MW work request to one QP.
    Type2,
}

/// Memory window state. Source: rxe `enum rxe_mw_state`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MwState {
    /// Bound (type 2) or allocated (type 1).
    Valid,
    /// Allocated and not bound (type 2).
    Free,
}

/// One memory window.
#[derive(Debug, Clone)]
pub struct MwEntry {
    /// Current R_Key (its key byte changes with each bind).
    pub rkey: u32,
    /// Protection domain handle.
    pub pd: u32,
    /// Type.
    pub mw_type: MwType,
    pub(super) state: MwState,
    pub(super) access: AccessFlags,
    pub(super) addr: u64,
    pub(super) length: u64,
    /// lkey of the MR the window is bound to.
    pub(super) mr_key: Option<u32>,
    /// Type 2: the QP it is bound to.
    pub(super) qpn: Option<u32>,
}

impl MwEntry {
    /// State.
    pub fn state(&self) -> MwState {
        self.state
    }
    /// Bound range: (address, length in bytes).
    pub fn range(&self) -> (u64, u64) {
        (self.addr, self.length)
    }
    /// Access the window grants.
    pub fn access(&self) -> AccessFlags {
        self.access
    }

    /// The checks of rxe `rxe_lookup_mw`, plus the window's own bounds.
    pub(super) fn check_access(
        &self,
        pd: u32,
        qpn: u32,
        va: u64,
        len: u64,
        need: AccessFlags,
    ) -> Result<(), MemError> {
        if self.pd != pd {
            return Err(MemError::PdMismatch);
        }
        if self.state != MwState::Valid || self.length == 0 {
            return Err(MemError::State);
        }
        if self.mw_type == MwType::Type2 && self.qpn != Some(qpn) {
            return Err(MemError::WrongQp);
        }
        if !self.access.contains(need) {
            return Err(MemError::Access);
        }
        // IBTA: an access through a window must lie inside the window (rxe checks only the
        // MR's range here; spec/deviations.toml).
        let end = va.checked_add(len).ok_or(MemError::Range)?;
        let mw_end = self.addr.checked_add(self.length).ok_or(MemError::Range)?;
        if va < self.addr || end > mw_end {
            return Err(MemError::Range);
        }
        Ok(())
    }
}

/// splitmix64: a seeded, deterministic key-byte source (the sans-IO rule: no global RNG).
fn splitmix_byte(state: &mut u64) -> u8 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (z ^ (z >> 31)) as u8
}

/// The MR and MW key tables of one device.
#[derive(Debug)]
pub struct MrTable {
    pub(super) mrs: KeySpace<MrEntry>,
    pub(super) mws: KeySpace<MwEntry>,
    pub(super) rng: u64,
}

impl Default for MrTable {
    fn default() -> MrTable {
        MrTable::new(0)
    }
}

impl MrTable {
    /// An empty table whose key bytes come from `seed`.
    pub fn new(seed: u64) -> MrTable {
        MrTable {
            mrs: KeySpace::new(MR_BASE, MAX_MR),
            mws: KeySpace::new(MW_BASE, MAX_MW),
            rng: seed,
        }
    }

    fn insert(
        &mut self,
        pd: u32,
        access: AccessFlags,
        kind: MrKind,
        buf: MrBuf,
        length: u64,
    ) -> Option<u32> {
        let slot = self.mrs.alloc()?;
        let byte = self.mrs.fresh_byte(slot, &mut self.rng);
        let lkey = self.mrs.key(slot, byte);
        let iova = buf.addr();
        let state = match kind {
            MrKind::User => MrState::Valid,
            MrKind::FastReg => MrState::Free,
        };
        let entry = MrEntry {
            lkey,
            pd,
            access,
            iova,
            length,
            state,
            kind,
            num_mw: 0,
            buf,
        };
        *self.mrs.slots.get_mut(slot)? = Some(entry);
        Some(lkey)
    }

    /// Registers a zeroed region of `length` bytes owned by the table. Returns its key.
    /// Errors: `None` when the table is full (the caller maps it to ENOMEM).
    pub fn register(&mut self, pd: u32, length: usize, access: AccessFlags) -> Option<u32> {
        let buf = MrBuf::Owned(vec![0u8; length].into_boxed_slice());
        self.insert(pd, access, MrKind::User, buf, length as u64)
    }

    /// Registers `len` bytes of application memory at `ptr`; the MR's virtual address is
    /// `ptr`. Returns its key, or `None` when the table is full.
    ///
    /// The application keeps using the memory: it may read and write it at any time,
    /// from any thread, while peers' WRITEs and ATOMICs and local receives land in it (what
    /// it reads while one lands is unspecified, as on hardware). The engine never forms a
    /// Rust reference over it ([`ForeignMem`]).
    ///
    /// # Safety
    ///
    /// `ptr` must be valid for reads and writes of `len` bytes until the MR is deregistered
    /// (or the table dropped). Nothing more.
    pub unsafe fn register_user(
        &mut self,
        pd: u32,
        ptr: NonNull<u8>,
        len: usize,
        access: AccessFlags,
    ) -> Option<u32> {
        // SAFETY: our caller vouches for `len` bytes at `ptr` until deregistration, and the
        // `ForeignMem` lives in the table's entry, which deregistration drops.
        let mem = unsafe { ForeignMem::new(ptr, len) };
        self.insert(pd, access, MrKind::User, MrBuf::Foreign(mem), len as u64)
    }

    /// Allocates a fast-register MR with room for `max_bytes` bytes, in the FREE state (no
    /// access until a REG_MR work request registers it). Source: rxe `rxe_alloc_mr`.
    pub fn alloc_fast_reg(&mut self, pd: u32, max_bytes: usize) -> Option<u32> {
        let buf = MrBuf::Owned(vec![0u8; max_bytes].into_boxed_slice());
        self.insert(pd, AccessFlags::empty(), MrKind::FastReg, buf, 0)
    }

    /// Deregisters `key`. Returns false when no such MR exists. Windows still bound to the
    /// MR are unbound (rxe refuses the deregistration with EBUSY instead; a dropped handle
    /// cannot fail, and a window must never reach a later MR in the same slot).
    pub fn deregister(&mut self, key: u32) -> bool {
        if self.get(key).is_none() {
            return false;
        }
        self.deregister_slot(key)
    }

    /// Deregisters the MR in the slot `key`'s index names, whatever its key byte is now (a
    /// fast-register MR changes it with each REG_MR), unbinding its windows. Returns false
    /// for an empty slot.
    pub fn deregister_slot(&mut self, key: u32) -> bool {
        let old = self
            .mrs
            .slot_of(key)
            .and_then(|s| self.mrs.slots.get_mut(s))
            .and_then(Option::take);
        match old {
            Some(mr) => {
                if mr.num_mw > 0 {
                    self.unbind_windows_of(mr.lkey);
                }
                true
            }
            None => false,
        }
    }

    /// The live MR with this key (any state).
    pub fn get(&self, key: u32) -> Option<&MrEntry> {
        let s = self.mrs.slot_of(key)?;
        self.mrs.slots.get(s)?.as_ref().filter(|mr| mr.lkey == key)
    }

    /// The live MR with this key, writable.
    pub fn get_mut(&mut self, key: u32) -> Option<&mut MrEntry> {
        let s = self.mrs.slot_of(key)?;
        self.mrs
            .slots
            .get_mut(s)?
            .as_mut()
            .filter(|mr| mr.lkey == key)
    }

    /// The MR in the slot `key`'s index names, whatever its key byte.
    pub fn get_slot(&self, key: u32) -> Option<&MrEntry> {
        let s = self.mrs.slot_of(key)?;
        self.mrs.slots.get(s)?.as_ref()
    }

    /// As [`MrTable::get_slot`], writable.
    pub fn get_slot_mut(&mut self, key: u32) -> Option<&mut MrEntry> {
        let s = self.mrs.slot_of(key)?;
        self.mrs.slots.get_mut(s)?.as_mut()
    }

    /// The live window with this R_Key.
    pub fn mw(&self, key: u32) -> Option<&MwEntry> {
        let s = self.mws.slot_of(key)?;
        self.mws.slots.get(s)?.as_ref().filter(|m| m.rkey == key)
    }

    /// The window in the slot `key`'s index names, whatever its key byte.
    pub fn mw_slot(&self, key: u32) -> Option<&MwEntry> {
        let s = self.mws.slot_of(key)?;
        self.mws.slots.get(s)?.as_ref()
    }

    /// Unbinds every window bound to the MR with key `mr_key` (the MR is going away): type 1
    /// windows stay VALID with length 0, type 2 windows go back to FREE.
    pub(super) fn unbind_windows_of(&mut self, mr_key: u32) {
        for mw in self.mws.slots.iter_mut().flatten() {
            if mw.mr_key == Some(mr_key) {
                mw.mr_key = None;
                mw.access = AccessFlags::empty();
                mw.addr = 0;
                mw.length = 0;
                if mw.mw_type == MwType::Type2 {
                    mw.state = MwState::Free;
                    mw.qpn = None;
                }
            }
        }
    }

    /// Checks `key` for a local access of `[va, va + len)` by protection domain `pd` needing
    /// `need`: the key must name a VALID MR of `pd` with that access and the range. Returns
    /// the MR and the byte offset. Source: rxe `lookup_mr` + `mr_check_range`.
    pub fn check(
        &self,
        key: u32,
        pd: u32,
        va: u64,
        len: u64,
        need: AccessFlags,
    ) -> Result<(&MrEntry, usize), MemError> {
        let mr = self.get(key).ok_or(MemError::BadKey)?;
        if mr.state != MrState::Valid {
            return Err(MemError::State);
        }
        if mr.pd != pd {
            return Err(MemError::PdMismatch);
        }
        if !mr.access.contains(need) {
            return Err(MemError::Access);
        }
        let off = mr.offset_of(va, len)?;
        Ok((mr, off))
    }

    /// Checks an R_Key for a remote access of `[va, va + len)` needing `need`, arriving on QP
    /// `qpn` of protection domain `pd`. The key names an MR (checked as [`MrTable::check`]) or,
    /// by its index, a memory window: the window must be bound (VALID, non-zero length), of
    /// `pd`, bound to `qpn` if it is type 2, grant `need`, and contain the range; the MR it
    /// is bound to must still be VALID. Returns the MR's slot and the byte offset in it.
    /// Source: rxe `check_rkey`, `rxe_lookup_mw`; IBTA Vol 1 ch. 10 (memory windows).
    pub fn check_remote(
        &self,
        key: u32,
        pd: u32,
        qpn: u32,
        va: u64,
        len: u64,
        need: AccessFlags,
    ) -> Result<(usize, usize), MemError> {
        let mr_key = if is_mw_key(key) {
            let mw = self.mw(key).ok_or(MemError::BadKey)?;
            mw.check_access(pd, qpn, va, len, need)?;
            mw.mr_key.ok_or(MemError::State)?
        } else {
            key
        };
        let mr = self.get(mr_key).ok_or(MemError::BadKey)?;
        if mr.state != MrState::Valid {
            return Err(MemError::State);
        }
        if mr.pd != pd {
            return Err(MemError::PdMismatch);
        }
        if mr_key == key && !mr.access.contains(need) {
            return Err(MemError::Access);
        }
        let off = mr.offset_of(va, len)?;
        let slot = self.mrs.slot_of(mr_key).ok_or(MemError::BadKey)?;
        Ok((slot, off))
    }

    /// The `len` bytes at `va` that R_Key `key` grants (see [`MrTable::check_remote`]).
    pub fn remote_bytes(
        &self,
        key: u32,
        pd: u32,
        qpn: u32,
        va: u64,
        len: usize,
        need: AccessFlags,
    ) -> Result<MrBytes<'_>, MemError> {
        let (slot, off) = self.check_remote(key, pd, qpn, va, len as u64, need)?;
        let mr = self.mrs.slots.get(slot).and_then(Option::as_ref);
        mr.ok_or(MemError::BadKey)?.bytes_at(off, len)
    }

    /// Copies `out.len()` bytes from `va` of R_Key `key` (READ), checking REMOTE_READ.
    pub fn read_remote(
        &self,
        key: u32,
        pd: u32,
        qpn: u32,
        va: u64,
        out: &mut [u8],
    ) -> Result<(), MemError> {
        let src = self.remote_bytes(key, pd, qpn, va, out.len(), AccessFlags::REMOTE_READ)?;
        src.copy_to(out)
    }

    /// Copies `data` to `va` of R_Key `key` (WRITE), checking REMOTE_WRITE.
    pub fn write_remote(
        &mut self,
        key: u32,
        pd: u32,
        qpn: u32,
        va: u64,
        data: &[u8],
    ) -> Result<(), MemError> {
        let need = AccessFlags::REMOTE_WRITE;
        let (slot, off) = self.check_remote(key, pd, qpn, va, data.len() as u64, need)?;
        let mr = self.mrs.slots.get_mut(slot).and_then(Option::as_mut);
        mr.ok_or(MemError::BadKey)?.write(off, data)
    }

    /// Applies `op` to the 8 bytes at `va` of R_Key `key` (ATOMIC), checking REMOTE_ATOMIC,
    /// and returns their value before it (see [`MrEntry::atomic`]).
    pub fn atomic_remote(
        &mut self,
        key: u32,
        pd: u32,
        qpn: u32,
        va: u64,
        op: AtomicOp,
    ) -> Result<u64, MemError> {
        let need = AccessFlags::REMOTE_ATOMIC;
        let (slot, off) = self.check_remote(key, pd, qpn, va, 8, need)?;
        let mr = self.mrs.slots.get_mut(slot).and_then(Option::as_mut);
        mr.ok_or(MemError::BadKey)?.atomic(off, op)
    }

    /// The bytes of `[addr, addr + len)` in host memory, if some MR's buffer holds all of
    /// them (whatever its key, PD or state). Used to copy IBV_SEND_INLINE data at post time,
    /// where libibverbs reads plain process memory and needs no lkey.
    pub fn host_bytes(&self, addr: u64, len: usize) -> Option<MrBytes<'_>> {
        let end = addr.checked_add(len as u64)?;
        self.mrs.slots.iter().flatten().find_map(|mr| {
            let start = mr.host_addr();
            let stop = start.checked_add(mr.buf_len() as u64)?;
            if addr >= start && end <= stop {
                let off = usize::try_from(addr - start).ok()?;
                mr.bytes_at(off, len).ok()
            } else {
                None
            }
        })
    }

    /// Validates a local scatter/gather list for protection domain `pd` with `need` access
    /// (empty for a gather, LOCAL_WRITE for a scatter). Returns the total length in bytes.
    pub fn check_sges(&self, sges: &[Sge], pd: u32, need: AccessFlags) -> Result<u64, MemError> {
        let mut total = 0u64;
        for s in sges {
            if s.length == 0 {
                continue;
            }
            self.check(s.lkey, pd, s.addr, u64::from(s.length), need)?;
            total += u64::from(s.length);
        }
        Ok(total)
    }

    /// Gathers `out.len()` bytes starting `offset` bytes into the list `sges` (checked for
    /// protection domain `pd`). Errors: any key/range failure, or [`MemError::Length`] if the
    /// list is too short.
    pub fn gather(
        &self,
        sges: &[Sge],
        pd: u32,
        offset: u64,
        out: &mut [u8],
    ) -> Result<(), MemError> {
        walk_sges(sges, offset, out.len(), |lkey, va, r| {
            let n = r.len();
            let (mr, off) = self.check(lkey, pd, va, n as u64, AccessFlags::empty())?;
            mr.read(off, &mut out[r])
        })
    }

    /// The `len` bytes starting `offset` bytes into the list `sges`, when they lie in one
    /// SGE: that MR's bytes, checked as [`MrTable::gather`] checks (lkey, PD, range).
    /// `Ok(None)` when they span SGEs (the caller copies them then).
    /// Errors: as [`MrTable::gather`].
    pub fn payload_bytes(
        &self,
        sges: &[Sge],
        pd: u32,
        offset: u64,
        len: usize,
    ) -> Result<Option<MrBytes<'_>>, MemError> {
        let mut skip = offset;
        for s in sges {
            let sl = u64::from(s.length);
            if skip >= sl {
                skip -= sl;
                continue;
            }
            if (sl - skip) < len as u64 {
                return Ok(None);
            }
            let va = s.addr.checked_add(skip).ok_or(MemError::Range)?;
            let (mr, off) = self.check(s.lkey, pd, va, len as u64, AccessFlags::empty())?;
            return mr.bytes_at(off, len).map(Some);
        }
        Err(MemError::Length)
    }

    /// Scatters `data` starting `offset` bytes into the list `sges`, which needs LOCAL_WRITE.
    /// Errors: as [`MrTable::gather`].
    pub fn scatter(
        &mut self,
        sges: &[Sge],
        pd: u32,
        offset: u64,
        data: &[u8],
    ) -> Result<(), MemError> {
        walk_sges(sges, offset, data.len(), |lkey, va, r| {
            let n = r.len();
            let (_, off) = self.check(lkey, pd, va, n as u64, AccessFlags::LOCAL_WRITE)?;
            let mr = self.get_mut(lkey).ok_or(MemError::BadKey)?;
            mr.write(off, &data[r])
        })
    }
}

/// Lays the `len` bytes that start `offset` bytes into the list `sges` over its SGEs, in
/// order, and calls `each(lkey, va, range)` for each piece: bytes `range` of the `len` lie
/// at virtual address `va` of the MR that `lkey` names (unchecked: `each` checks). SGEs
/// before `offset` and zero-length ones are skipped. Errors: `each`'s (the walk stops
/// there); [`MemError::Range`] when an address passes 2^64; [`MemError::Length`] when the
/// list ends before `offset + len` bytes.
fn walk_sges(
    sges: &[Sge],
    offset: u64,
    len: usize,
    mut each: impl FnMut(u32, u64, core::ops::Range<usize>) -> Result<(), MemError>,
) -> Result<(), MemError> {
    let mut skip = offset;
    let mut done = 0usize;
    for s in sges {
        if done == len {
            break;
        }
        let sl = u64::from(s.length);
        if skip >= sl {
            skip -= sl;
            continue;
        }
        let n = usize::try_from(sl - skip)
            .unwrap_or(usize::MAX)
            .min(len - done);
        let va = s.addr.checked_add(skip).ok_or(MemError::Range)?;
        each(s.lkey, va, done..done + n)?;
        done += n;
        skip = 0;
    }
    if done == len {
        Ok(())
    } else {
        Err(MemError::Length)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
                core::ptr::copy_nonoverlapping(
                    data.as_ptr(),
                    self.ptr.as_ptr().add(off),
                    data.len(),
                )
            };
        }
        /// The application reads `n` bytes at `off`.
        fn peek(&self, off: usize, n: usize) -> Vec<u8> {
            assert!(off + n <= self.len());
            let mut v = vec![0u8; n];
            // SAFETY: in bounds (asserted); the buffer is live.
            unsafe {
                core::ptr::copy_nonoverlapping(self.ptr.as_ptr().add(off), v.as_mut_ptr(), n)
            };
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
}
