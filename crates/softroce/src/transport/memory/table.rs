//! The MR and MW key tables of one device: registration, deregistration and lookup by key
//! (rxe `rxe_mr.c` `rxe_mr_init_user`, `rxe_alloc_mr`; `rxe_pool.c`).

use super::keys::{KeySpace, MR_BASE};
use super::mr::MrBuf;
use super::{
    ForeignMem, MAX_MR, MAX_MW, MW_BASE, MrBytes, MrEntry, MrKind, MrState, MwEntry, MwState,
    MwType,
};
use crate::transport::AccessFlags;
use core::ptr::NonNull;

/// The MR and MW key tables of one device.
#[derive(Debug)]
pub struct MrTable {
    pub(in crate::transport) mrs: KeySpace<MrEntry>,
    pub(in crate::transport) mws: KeySpace<MwEntry>,
    pub(in crate::transport) rng: crate::rand::SplitMix64,
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
            rng: crate::rand::SplitMix64::new(seed),
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
    pub(in crate::transport) fn unbind_windows_of(&mut self, mr_key: u32) {
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
}
