//! Memory windows, fast-register MRs and invalidation: the table operations behind the
//! BIND_MW, REG_MR and LOCAL_INV work requests and SEND_WITH_INVALIDATE.
//!
//! A memory window grants remote access to a range of an MR that was registered with
//! `IBV_ACCESS_MW_BIND`. Its R_Key has an index in 0x1_0001..=0x2_0000, so the responder tells
//! an MW key from an MR key by the index alone (rxe `rkey_is_mw`). Type 1 windows are VALID
//! from allocation (with length 0, so unusable) and re-bound by `ibv_bind_mw`; type 2 windows
//! start FREE, are bound by a BIND_MW work request to the posting QP, and are invalidated by
//! LOCAL_INV or a peer's SEND_WITH_INVALIDATE.
//!
//! Source: IBTA Vol 1 ch. 10 (memory windows: C10-72 same PD for a type 2 bind, C10-73 the MR
//! needs MW bind access, C10-74 a writable window needs a locally writable MR, C10-75 the
//! window inside the MR; type 1 windows cannot be invalidated); rxe `rxe_mw.c`
//! (`rxe_check_bind_mw`, `rxe_do_bind_mw`, `rxe_invalidate_mw`, `rxe_lookup_mw`) and
//! `rxe_mr.c` (`rxe_reg_fast_mr`, `rxe_invalidate_mr`).

use super::AccessFlags;
use super::memory::{MemError, MrKind, MrState, MrTable, MwEntry, MwState, MwType, is_mw_key};

/// The bind part of a BIND_MW work request. Source: `struct ibv_bind_mw_wr` and
/// `struct ibv_mw_bind_info` (the MW and MR objects are named by their keys).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BindMw {
    /// The window's current R_Key.
    pub mw_rkey: u32,
    /// The R_Key after the bind; only its low byte is used (`ibv_inc_rkey(mw_rkey)` for the
    /// usual next key).
    pub rkey: u32,
    /// lkey of the MR to bind to (ignored when `length` is 0).
    pub mr_lkey: u32,
    /// First address of the window, inside the MR.
    pub addr: u64,
    /// Length in bytes; 0 unbinds a type 1 window.
    pub length: u64,
    /// Remote access to grant (REMOTE_READ, REMOTE_WRITE, REMOTE_ATOMIC).
    pub access: AccessFlags,
}

/// The registration part of a REG_MR work request. Source: kernel `struct ib_reg_wr`; rxe
/// `rxe_reg_fast_mr` (the MR is named by any key carrying its index).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegMr {
    /// A key of the fast-register MR (its index names it).
    pub mr_key: u32,
    /// The lkey/rkey after registration: the MR's index with a key byte of the caller's
    /// choice.
    pub key: u32,
    /// Virtual address the registration maps to byte 0 of the MR's buffer.
    pub iova: u64,
    /// Registered length in bytes (at most the MR's `max_num_sg` pages).
    pub length: u64,
    /// Access rights.
    pub access: AccessFlags,
}

/// `ibv_inc_rkey`: the same index with the next key byte.
pub const fn inc_rkey(rkey: u32) -> u32 {
    (rkey & 0xffff_ff00) | (rkey.wrapping_add(1) & 0xff)
}

impl MrTable {
    /// Allocates a memory window of `mw_type` in protection domain `pd`. Returns its R_Key, or
    /// `None` when [`MAX_MW`](super::MAX_MW) windows exist. Source: rxe `rxe_alloc_mw`.
    pub fn alloc_mw(&mut self, pd: u32, mw_type: MwType) -> Option<u32> {
        let slot = self.mws.alloc()?;
        let byte = self.mws.fresh_byte(slot, &mut self.rng);
        let rkey = self.mws.key(slot, byte);
        let state = match mw_type {
            MwType::Type1 => MwState::Valid,
            MwType::Type2 => MwState::Free,
        };
        *self.mws.slots.get_mut(slot)? = Some(MwEntry {
            rkey,
            pd,
            mw_type,
            state,
            access: AccessFlags::empty(),
            addr: 0,
            length: 0,
            mr_key: None,
            qpn: None,
        });
        Some(rkey)
    }

    /// Frees the window in the slot `key`'s index names (whatever its key byte now), releasing
    /// its MR. Returns false for an empty slot.
    pub fn dealloc_mw(&mut self, key: u32) -> bool {
        let Some(slot) = self.mws.slot_of(key) else {
            return false;
        };
        let Some(mw) = self.mws.slots.get_mut(slot).and_then(Option::take) else {
            return false;
        };
        self.release_mr(mw.mr_key);
        true
    }

    fn release_mr(&mut self, mr_key: Option<u32>) {
        if let Some(mr) = mr_key.and_then(|k| self.get_mut(k)) {
            mr.num_mw = mr.num_mw.saturating_sub(1);
        }
    }

    /// Executes a bind for QP `qpn` of protection domain `qp_pd`. Errors (the WR completes
    /// with `IBV_WC_MW_BIND_ERR`): [`MemError::BadKey`] for an unknown window or MR key,
    /// [`MemError::Access`] for access bits a window cannot grant, an MR without MW_BIND, or
    /// a writable window on an MR without LOCAL_WRITE, [`MemError::PdMismatch`] when QP, MW
    /// and MR are not all of one PD, [`MemError::State`] for a type 2 window that is not FREE
    /// or a zero-length type 2 bind or an MR that is not VALID, [`MemError::Range`] for a
    /// window outside the MR (a zero-based window: longer than the MR), [`MemError::Type`]
    /// for a zero-based type 1 window. Source: rxe `rxe_bind_mw`, `rxe_check_bind_mw` (as
    /// fixed by "RDMA/rxe: Fix access checks in rxe_check_bind_mw", which checks the access
    /// of the bind rather than the window's previous one).
    pub fn bind_mw(&mut self, qpn: u32, qp_pd: u32, b: &BindMw) -> Result<(), MemError> {
        let mw = self.mw(b.mw_rkey).ok_or(MemError::BadKey)?.clone();
        let remote = AccessFlags::REMOTE_READ
            | AccessFlags::REMOTE_WRITE
            | AccessFlags::REMOTE_ATOMIC
            | AccessFlags::ZERO_BASED;
        if !remote.contains(b.access) {
            return Err(MemError::Access);
        }
        let zero_based = b.access.contains(AccessFlags::ZERO_BASED);
        // IBTA o10-36.2.2: a type 1 window is never zero based.
        if zero_based && mw.mw_type == MwType::Type1 {
            return Err(MemError::Type);
        }
        if mw.pd != qp_pd {
            return Err(MemError::PdMismatch);
        }
        match mw.mw_type {
            MwType::Type1 => {}
            // IBTA o10-37.2.30: a type 2 window is bound only from FREE; o10-37.2.40: never
            // with a zero length.
            MwType::Type2 if mw.state != MwState::Free => return Err(MemError::State),
            MwType::Type2 if b.length == 0 => return Err(MemError::State),
            MwType::Type2 => {}
        }
        let mr_key = if b.length > 0 {
            let mr = self.get(b.mr_lkey).ok_or(MemError::BadKey)?;
            if mr.state() != MrState::Valid {
                return Err(MemError::State);
            }
            if mr.pd != mw.pd {
                return Err(MemError::PdMismatch);
            }
            // C10-73: the MR must allow binding windows.
            if !mr.access.contains(AccessFlags::MW_BIND) {
                return Err(MemError::Access);
            }
            // C10-74: a window that lets peers write needs a locally writable MR.
            if b.access
                .intersects(AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC)
                && !mr.access.contains(AccessFlags::LOCAL_WRITE)
            {
                return Err(MemError::Access);
            }
            // C10-75: the window lies inside the MR; a zero-based one is no longer than the
            // MR (rxe checks only that; an access beyond the MR fails when it is made).
            if zero_based {
                if b.length > mr.length() {
                    return Err(MemError::Range);
                }
            } else {
                mr.offset_of(b.addr, b.length)?;
            }
            Some(b.mr_lkey)
        } else {
            None
        };
        // Commit.
        self.release_mr(mw.mr_key);
        if let Some(mr) = mr_key.and_then(|k| self.get_mut(k)) {
            mr.num_mw += 1;
        }
        let slot = self.mws.slot_of(b.mw_rkey).ok_or(MemError::BadKey)?;
        let byte = (b.rkey & 0xff) as u8;
        self.mws.note_byte(slot, byte);
        let e = self
            .mws
            .slots
            .get_mut(slot)
            .and_then(Option::as_mut)
            .ok_or(MemError::BadKey)?;
        e.rkey = (e.rkey & 0xffff_ff00) | u32::from(byte);
        e.access = b.access;
        e.addr = b.addr;
        e.length = b.length;
        e.state = MwState::Valid;
        e.mr_key = mr_key;
        if e.mw_type == MwType::Type2 {
            e.qpn = Some(qpn);
        }
        Ok(())
    }

    /// Executes a REG_MR work request of a QP in protection domain `qp_pd`. Errors (the WR
    /// completes with `IBV_WC_LOC_QP_OP_ERR`): [`MemError::BadKey`] for no MR at that index or
    /// a new key with another index, [`MemError::Type`] for an MR not made by `alloc_mr`,
    /// [`MemError::State`] unless the MR is FREE, [`MemError::PdMismatch`],
    /// [`MemError::Range`] for a length beyond the MR's pages, [`MemError::Access`] for remote
    /// write/atomic without LOCAL_WRITE. Source: rxe `rxe_reg_fast_mr`.
    pub fn reg_fast(&mut self, qp_pd: u32, r: &RegMr) -> Result<(), MemError> {
        let mr = self.get_slot(r.mr_key).ok_or(MemError::BadKey)?;
        if mr.kind() != MrKind::FastReg {
            return Err(MemError::Type);
        }
        if mr.state() != MrState::Free {
            return Err(MemError::State);
        }
        if mr.pd != qp_pd {
            return Err(MemError::PdMismatch);
        }
        if (r.key >> 8) != (mr.lkey >> 8) {
            return Err(MemError::BadKey);
        }
        // The range may end at 2^64 (its last byte at u64::MAX), not past it.
        if r.length > mr.buf_len() as u64 || u128::from(r.iova) + u128::from(r.length) > 1 << 64 {
            return Err(MemError::Range);
        }
        if r.access
            .intersects(AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC)
            && !r.access.contains(AccessFlags::LOCAL_WRITE)
        {
            return Err(MemError::Access);
        }
        let slot = self.mrs.slot_of(r.mr_key).ok_or(MemError::BadKey)?;
        self.mrs.note_byte(slot, (r.key & 0xff) as u8);
        let mr = self.get_slot_mut(r.mr_key).ok_or(MemError::BadKey)?;
        mr.lkey = r.key;
        mr.iova = r.iova;
        mr.set_registered(r.length, r.access);
        Ok(())
    }

    /// Invalidates `key` for a QP of protection domain `pd` (LOCAL_INV), or, with
    /// `remote_qpn`, for a SEND_WITH_INVALIDATE arriving on that QP. An MW key: a bound type 2
    /// window of `pd` (bound to `remote_qpn` when remote) goes back to FREE and releases its
    /// MR. An MR key: a fast-register MR of `pd` with no windows bound goes to FREE.
    /// Errors: [`MemError::BadKey`], [`MemError::PdMismatch`], [`MemError::Type`] (type 1
    /// window, ordinary MR), [`MemError::State`] (window not bound), [`MemError::WrongQp`],
    /// [`MemError::Busy`] (MR with windows). Source: rxe `rxe_invalidate_mw`,
    /// `rxe_invalidate_mr`; IBTA o10-37.2.26 (type 1 windows are not invalidated).
    pub fn invalidate(
        &mut self,
        key: u32,
        pd: u32,
        remote_qpn: Option<u32>,
    ) -> Result<(), MemError> {
        if is_mw_key(key) {
            let mw = self.mw(key).ok_or(MemError::BadKey)?.clone();
            if mw.pd != pd {
                return Err(MemError::PdMismatch);
            }
            if mw.mw_type == MwType::Type1 {
                return Err(MemError::Type);
            }
            if mw.state != MwState::Valid {
                return Err(MemError::State);
            }
            if remote_qpn.is_some() && mw.qpn != remote_qpn {
                return Err(MemError::WrongQp);
            }
            self.release_mr(mw.mr_key);
            let slot = self.mws.slot_of(key).ok_or(MemError::BadKey)?;
            if let Some(e) = self.mws.slots.get_mut(slot).and_then(Option::as_mut) {
                e.state = MwState::Free;
                e.access = AccessFlags::empty();
                e.addr = 0;
                e.length = 0;
                e.mr_key = None;
                e.qpn = None;
            }
            return Ok(());
        }
        let mr = self.get_mut(key).ok_or(MemError::BadKey)?;
        if mr.pd != pd {
            return Err(MemError::PdMismatch);
        }
        if mr.kind() != MrKind::FastReg {
            return Err(MemError::Type);
        }
        if mr.num_mw > 0 {
            return Err(MemError::Busy);
        }
        mr.set_free();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::memory::MW_BASE;

    const PD: u32 = 1;
    const QPN: u32 = 0x11;

    fn bindable() -> AccessFlags {
        AccessFlags::LOCAL_WRITE
            | AccessFlags::REMOTE_WRITE
            | AccessFlags::REMOTE_READ
            | AccessFlags::MW_BIND
    }

    fn table_with_mr() -> (MrTable, u32, u64) {
        let mut t = MrTable::new(5);
        let k = t.register(PD, 4096, bindable()).unwrap();
        let va = t.get(k).unwrap().iova;
        (t, k, va)
    }

    fn bind(mw: u32, mr: u32, addr: u64, length: u64) -> BindMw {
        BindMw {
            mw_rkey: mw,
            rkey: inc_rkey(mw),
            mr_lkey: mr,
            addr,
            length,
            access: AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
        }
    }

    // IBTA o10-36.2.2: a type 1 window is never zero based. A zero-based type 2 window is
    // addressed from 0: va 0 is the bound address; it may be as long as the MR, and access
    // past its length is out of range (rxe rxe_check_bind_mw, rxe_resp.c check_rkey).
    #[test]
    fn zero_based_type2_window_is_addressed_from_0() {
        let (mut t, mr, va) = table_with_mr();
        let zb = AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ | AccessFlags::ZERO_BASED;
        let w1 = t.alloc_mw(PD, MwType::Type1).unwrap();
        let mut b1 = bind(w1, mr, va + 64, 32);
        b1.access = zb;
        assert_eq!(t.bind_mw(QPN, PD, &b1), Err(MemError::Type));
        let w2 = t.alloc_mw(PD, MwType::Type2).unwrap();
        let mut too_long = bind(w2, mr, va + 64, 4097);
        too_long.access = zb;
        assert_eq!(t.bind_mw(QPN, PD, &too_long), Err(MemError::Range));
        let mut b2 = bind(w2, mr, va + 64, 32);
        b2.access = zb;
        t.bind_mw(QPN, PD, &b2).unwrap();
        let key = b2.rkey;
        t.write_remote(key, PD, QPN, 4, b"zero").unwrap();
        let mut got = [0u8; 4];
        t.read_remote(mr, PD, QPN, va + 68, &mut got).unwrap();
        assert_eq!(&got, b"zero");
        assert_eq!(
            t.write_remote(key, PD, QPN, 30, b"abc"),
            Err(MemError::Range)
        );
        assert_eq!(
            t.write_remote(key, PD, QPN, va + 64, b"a"),
            Err(MemError::Range),
            "the bound address is not an address through a zero-based window"
        );
    }

    #[test]
    fn mw_keys_are_in_the_mw_index_range() {
        let (mut t, mr, _) = table_with_mr();
        let w = t.alloc_mw(PD, MwType::Type1).unwrap();
        assert!(is_mw_key(w) && !is_mw_key(mr));
        assert_eq!(w >> 8, MW_BASE);
        assert_eq!(inc_rkey(0x1234_56ff), 0x1234_5600);
    }

    #[test]
    fn type1_bind_grants_its_range_and_rebind_changes_the_key() {
        let (mut t, mr, va) = table_with_mr();
        let w = t.alloc_mw(PD, MwType::Type1).unwrap();
        // Allocated: VALID but zero length, so no access.
        assert_eq!(
            t.check_remote(w, PD, QPN, va, 1, AccessFlags::REMOTE_READ),
            Err(MemError::State)
        );
        t.bind_mw(QPN, PD, &bind(w, mr, va + 100, 200)).unwrap();
        let w1 = inc_rkey(w);
        assert!(t.mw(w).is_none(), "old key gone");
        let (_, off) = t
            .check_remote(w1, PD, 0x99, va + 100, 200, AccessFlags::REMOTE_WRITE)
            .unwrap();
        assert_eq!(off, 100);
        // Outside the window but inside the MR.
        assert_eq!(
            t.check_remote(w1, PD, QPN, va + 99, 2, AccessFlags::REMOTE_READ),
            Err(MemError::Range)
        );
        assert_eq!(
            t.check_remote(w1, PD, QPN, va + 100, 8, AccessFlags::REMOTE_ATOMIC),
            Err(MemError::Access)
        );
        assert_eq!(t.get(mr).unwrap().num_mw, 1);
        // Unbind (length 0): the key stops working, the MR is released.
        t.bind_mw(QPN, PD, &bind(w1, mr, 0, 0)).unwrap();
        let w2 = inc_rkey(w1);
        assert_eq!(
            t.check_remote(w2, PD, QPN, va + 100, 1, AccessFlags::REMOTE_READ),
            Err(MemError::State)
        );
        assert_eq!(t.get(mr).unwrap().num_mw, 0);
        // Type 1 windows cannot be invalidated.
        assert_eq!(t.invalidate(w2, PD, None), Err(MemError::Type));
    }

    #[test]
    fn bind_checks_follow_c10_72_to_75() {
        let (mut t, mr, va) = table_with_mr();
        let w = t.alloc_mw(PD, MwType::Type2).unwrap();
        let nobind = t
            .register(PD, 64, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
            .unwrap();
        let nvb = t.get(nobind).unwrap().iova;
        assert_eq!(
            t.bind_mw(QPN, PD, &bind(w, nobind, nvb, 8)),
            Err(MemError::Access)
        );
        let readonly = t.register(PD, 64, AccessFlags::MW_BIND).unwrap();
        let ro = t.get(readonly).unwrap().iova;
        assert_eq!(
            t.bind_mw(QPN, PD, &bind(w, readonly, ro, 8)),
            Err(MemError::Access)
        );
        assert_eq!(
            t.bind_mw(QPN, PD, &bind(w, mr, va + 4000, 200)),
            Err(MemError::Range)
        );
        assert_eq!(
            t.bind_mw(QPN, PD + 1, &bind(w, mr, va, 8)),
            Err(MemError::PdMismatch)
        );
        assert_eq!(
            t.bind_mw(QPN, PD, &bind(w, mr, va, 0)),
            Err(MemError::State)
        );
        assert_eq!(
            t.bind_mw(QPN, PD, &bind(w ^ 1, mr, va, 8)),
            Err(MemError::BadKey)
        );
        let mut b = bind(w, mr, va, 8);
        b.access |= AccessFlags::MW_BIND;
        assert_eq!(t.bind_mw(QPN, PD, &b), Err(MemError::Access));
        // Nothing above changed the window.
        assert_eq!(t.mw(w).unwrap().state(), MwState::Free);
    }

    #[test]
    fn type2_is_bound_to_one_qp_and_invalidation_frees_it() {
        let (mut t, mr, va) = table_with_mr();
        let w = t.alloc_mw(PD, MwType::Type2).unwrap();
        t.bind_mw(QPN, PD, &bind(w, mr, va, 64)).unwrap();
        let w1 = inc_rkey(w);
        assert!(
            t.check_remote(w1, PD, QPN, va, 64, AccessFlags::REMOTE_WRITE)
                .is_ok()
        );
        assert_eq!(
            t.check_remote(w1, PD, QPN + 1, va, 64, AccessFlags::REMOTE_WRITE),
            Err(MemError::WrongQp)
        );
        // A bound type 2 window cannot be bound again; its MR cannot be invalidated.
        assert_eq!(
            t.bind_mw(QPN, PD, &bind(w1, mr, va, 8)),
            Err(MemError::State)
        );
        // Remote invalidation must come through the QP it is bound to.
        assert_eq!(t.invalidate(w1, PD, Some(QPN + 1)), Err(MemError::WrongQp));
        assert_eq!(t.invalidate(w1, PD + 1, None), Err(MemError::PdMismatch));
        t.invalidate(w1, PD, Some(QPN)).unwrap();
        assert_eq!(
            t.check_remote(w1, PD, QPN, va, 64, AccessFlags::REMOTE_WRITE),
            Err(MemError::State)
        );
        assert_eq!(t.invalidate(w1, PD, None), Err(MemError::State));
        assert_eq!(t.get(mr).unwrap().num_mw, 0);
        assert!(t.dealloc_mw(w1) && t.mw_slot(w1).is_none());
    }

    #[test]
    fn fast_reg_mr_is_free_until_registered_and_after_invalidation() {
        let mut t = MrTable::new(9);
        let k = t.alloc_fast_reg(PD, 8192).unwrap();
        assert_eq!(t.get(k).unwrap().state(), MrState::Free);
        let all = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
        assert_eq!(
            t.check_remote(k, PD, QPN, 0, 1, AccessFlags::empty()),
            Err(MemError::State)
        );
        let new = (k & !0xff) | ((k + 7) & 0xff);
        let r = RegMr {
            mr_key: k,
            key: new,
            iova: 0x7000_0000,
            length: 8192,
            access: all,
        };
        assert_eq!(
            t.reg_fast(PD, &RegMr { length: 8193, ..r }),
            Err(MemError::Range)
        );
        assert_eq!(t.reg_fast(PD + 1, &r), Err(MemError::PdMismatch));
        assert_eq!(
            t.reg_fast(
                PD,
                &RegMr {
                    key: new + 0x100,
                    ..r
                }
            ),
            Err(MemError::BadKey)
        );
        t.reg_fast(PD, &r).unwrap();
        assert!(t.get(k).is_none() || k == new);
        t.write_remote(new, PD, QPN, 0x7000_1000, b"frmr").unwrap();
        assert_eq!(
            &t.get(new).unwrap().owned_bytes().unwrap()[0x1000..0x1004],
            b"frmr"
        );
        assert_eq!(t.reg_fast(PD, &r), Err(MemError::State), "only from FREE");
        t.invalidate(new, PD, None).unwrap();
        assert_eq!(
            t.write_remote(new, PD, QPN, 0x7000_0000, b"x"),
            Err(MemError::State)
        );
        // Ordinary MRs are not invalidated.
        let plain = t.register(PD, 64, all).unwrap();
        assert_eq!(t.invalidate(plain, PD, None), Err(MemError::Type));
    }

    /// A window never outlives its MR: deregistering the MR unbinds it, so a later MR in the
    /// same slot is not reachable through the window.
    #[test]
    fn deregistering_an_mr_unbinds_its_windows() {
        let mut t = MrTable::new(4);
        let k = t.alloc_fast_reg(PD, 4096).unwrap();
        let r = RegMr {
            mr_key: k,
            key: k,
            iova: 0x1000,
            length: 4096,
            access: AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND,
        };
        t.reg_fast(PD, &r).unwrap();
        let w1 = t.alloc_mw(PD, MwType::Type1).unwrap();
        let w2 = t.alloc_mw(PD, MwType::Type2).unwrap();
        t.bind_mw(QPN, PD, &bind(w1, k, 0x1000, 64)).unwrap();
        t.bind_mw(QPN, PD, &bind(w2, k, 0x1000, 64)).unwrap();
        let (w1, w2) = (inc_rkey(w1), inc_rkey(w2));
        assert!(t.deregister_slot(k));
        for w in [w1, w2] {
            assert_eq!(
                t.check_remote(w, PD, QPN, 0x1000, 8, AccessFlags::REMOTE_READ),
                Err(MemError::State)
            );
        }
        assert_eq!(t.mw(w2).unwrap().state(), MwState::Free);
        assert_eq!(t.mw(w1).unwrap().state(), MwState::Valid);
    }

    #[test]
    fn an_mr_with_windows_is_not_invalidated() {
        let mut t = MrTable::new(9);
        let k = t.alloc_fast_reg(PD, 4096).unwrap();
        let access = AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND;
        t.reg_fast(
            PD,
            &RegMr {
                mr_key: k,
                key: k,
                iova: 0x1000,
                length: 4096,
                access,
            },
        )
        .unwrap();
        let w = t.alloc_mw(PD, MwType::Type2).unwrap();
        t.bind_mw(QPN, PD, &bind(w, k, 0x1000, 16)).unwrap();
        assert_eq!(t.invalidate(k, PD, None), Err(MemError::Busy));
        t.invalidate(inc_rkey(w), PD, None).unwrap();
        assert_eq!(t.invalidate(k, PD, None), Ok(()));
    }
}
