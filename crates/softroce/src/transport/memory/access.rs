//! The local (L_Key) and remote (R_Key) access checks every access to registered memory goes
//! through, and the remote READ and WRITE accesses built on them (rxe `lookup_mr`,
//! `mr_check_range`, `check_rkey`; IBTA Vol 1 ch. 10).

use super::{MemError, MrBytes, MrEntry, MrState, MrTable, is_mw_key};
use crate::transport::AccessFlags;

impl MrTable {
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
}
