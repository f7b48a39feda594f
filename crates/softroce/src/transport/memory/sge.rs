//! Scatter/gather lists: validating a local SGE list, gathering from it, scattering into it
//! (rxe `rxe_mr.c` `copy_data`).

use super::{MemError, MrBytes, MrTable};
use crate::transport::{AccessFlags, Sge};

impl MrTable {
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
