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

mod foreign;
#[cfg(test)]
use foreign::BOUNCE_BYTES;
pub use foreign::{ForeignMem, MrBytes};

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
    /// Overflow-safe: the ends are computed in 128 bits, so an MR whose IOVA range ends at
    /// 2^64 (its last byte at `u64::MAX`, which rxe's `mr_check_range` allows) is reachable
    /// to its last byte, and a range that would wrap is outside.
    pub fn offset_of(&self, va: u64, len: u64) -> Result<usize, MemError> {
        let end = u128::from(va) + u128::from(len);
        let mr_end = u128::from(self.iova) + u128::from(self.length);
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
        // MR's range here; spec/deviations.toml). A zero-based window spans [0, length)
        // (rxe `rxe_check_mw` would, had it the check: `va + resid > mw->length`).
        // In 128 bits: a window may end at 2^64, as its MR may.
        let end = u128::from(va) + u128::from(len);
        let (start, mw_end) = if self.access.contains(AccessFlags::ZERO_BASED) {
            (0, u128::from(self.length))
        } else {
            (self.addr, u128::from(self.addr) + u128::from(self.length))
        };
        if va < start || end > mw_end {
            return Err(MemError::Range);
        }
        Ok(())
    }

    /// The MR address that `va`, an address through this window, names: `va` itself, or
    /// for a zero-based window the bound address plus `va` (rxe `rxe_resp.c` `check_rkey`:
    /// `qp->resp.offset = mw->addr`). Errors: [`MemError::Range`] on overflow.
    pub(super) fn mr_va(&self, va: u64) -> Result<u64, MemError> {
        if self.access.contains(AccessFlags::ZERO_BASED) {
            self.addr.checked_add(va).ok_or(MemError::Range)
        } else {
            Ok(va)
        }
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
        // SAFETY: our caller's contract, which is `register_user_iova`'s.
        unsafe { self.register_user_iova(pd, ptr, len, ptr.as_ptr() as u64, access) }
    }

    /// [`MrTable::register_user`] with virtual address `iova` for byte 0 instead of `ptr`
    /// (`ibv_reg_mr_iova`): local SGEs and peers' RETH / AtomicETH addresses name the
    /// memory by `iova`; the bytes stay the application's at `ptr`. Returns its key, or
    /// `None` when the table is full. Source: rxe `rxe_mr.c` `rxe_mr_init_user`
    /// (`mr->iova = iova`).
    ///
    /// # Safety
    ///
    /// As [`MrTable::register_user`].
    pub unsafe fn register_user_iova(
        &mut self,
        pd: u32,
        ptr: NonNull<u8>,
        len: usize,
        iova: u64,
        access: AccessFlags,
    ) -> Option<u32> {
        // SAFETY: our caller vouches for `len` bytes at `ptr` until deregistration, and the
        // `ForeignMem` lives in the table's entry, which deregistration drops.
        let mem = unsafe { ForeignMem::new(ptr, len) };
        let key = self.insert(pd, access, MrKind::User, MrBuf::Foreign(mem), len as u64)?;
        if let Some(mr) = self.get_mut(key) {
            mr.iova = iova;
        }
        Some(key)
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
        let (mr_key, va) = if is_mw_key(key) {
            let mw = self.mw(key).ok_or(MemError::BadKey)?;
            mw.check_access(pd, qpn, va, len, need)?;
            (mw.mr_key.ok_or(MemError::State)?, mw.mr_va(va)?)
        } else {
            (key, va)
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
mod tests;
