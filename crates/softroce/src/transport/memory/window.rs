//! One memory window and the checks an access through it goes through (rxe
//! `struct rxe_mw`, `rxe_lookup_mw`); the operations that bind and invalidate windows are
//! `transport/mw.rs`.

use super::MemError;
use crate::transport::AccessFlags;

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
    pub(in crate::transport) state: MwState,
    pub(in crate::transport) access: AccessFlags,
    pub(in crate::transport) addr: u64,
    pub(in crate::transport) length: u64,
    /// lkey of the MR the window is bound to.
    pub(in crate::transport) mr_key: Option<u32>,
    /// Type 2: the QP it is bound to.
    pub(in crate::transport) qpn: Option<u32>,
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
    pub(in crate::transport) fn check_access(
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
    pub(in crate::transport) fn mr_va(&self, va: u64) -> Result<u64, MemError> {
        if self.access.contains(AccessFlags::ZERO_BASED) {
            self.addr.checked_add(va).ok_or(MemError::Range)
        } else {
            Ok(va)
        }
    }
}
