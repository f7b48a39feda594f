//! Memory regions: the key table and the checks every local and remote access goes through.
//!
//! An MR owns its bytes (a boxed slice that never moves, so its heap address serves as the
//! MR's virtual address, as a real registration would). Keys follow rxe: `lkey == rkey ==
//! index << 8 | key byte`, the key byte drawn from the device's seeded generator.
//! Source: IBTA Vol 1 ch. 10 (memory regions, L_Key/R_Key checks) and C9-88 (zero-length
//! RDMA needs no valid R_Key); rxe `rxe_mr.c` (`lookup_mr`, `mr_check_range`, `rxe_mr_copy`).

use super::{AccessFlags, Sge};

/// Why an access to registered memory was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemError {
    /// No live MR has this key (wrong index, wrong key byte, or deregistered).
    BadKey,
    /// The MR belongs to another protection domain.
    PdMismatch,
    /// The MR was not registered with the access the operation needs.
    Access,
    /// The byte range is not inside the MR (or overflows u64).
    Range,
    /// The scatter/gather list is shorter than the data.
    Length,
}

/// One registered memory region.
#[derive(Debug)]
pub struct MrEntry {
    /// Local key (== rkey).
    pub lkey: u32,
    /// Protection domain handle.
    pub pd: u32,
    /// Access rights granted at registration.
    pub access: AccessFlags,
    /// Virtual address of byte 0 (the buffer's address).
    pub iova: u64,
    buf: Box<[u8]>,
}

impl MrEntry {
    /// Length in bytes.
    pub fn length(&self) -> u64 {
        self.buf.len() as u64
    }
    /// The MR's bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.buf
    }
    /// The MR's bytes, writable.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.buf
    }

    /// Offset of `[va, va + len)` inside the MR, or [`MemError::Range`].
    /// Overflow-safe: `va + len` is computed in checked arithmetic.
    pub fn offset_of(&self, va: u64, len: u64) -> Result<usize, MemError> {
        let end = va.checked_add(len).ok_or(MemError::Range)?;
        let mr_end = self
            .iova
            .checked_add(self.length())
            .ok_or(MemError::Range)?;
        if va < self.iova || end > mr_end {
            return Err(MemError::Range);
        }
        usize::try_from(va - self.iova).map_err(|_| MemError::Range)
    }
}

/// The MR key table of one device.
#[derive(Debug, Default)]
pub struct MrTable {
    slots: Vec<Option<MrEntry>>,
    rng: u64,
}

/// Maximum number of MRs per device (rxe `RXE_MAX_MR` is 0x40000; we keep it smaller).
pub const MAX_MR: usize = 1 << 16;

impl MrTable {
    /// An empty table whose key bytes come from `seed`.
    pub fn new(seed: u64) -> MrTable {
        MrTable {
            slots: Vec::new(),
            rng: seed,
        }
    }

    fn next_key_byte(&mut self) -> u8 {
        // splitmix64: a seeded, deterministic key-byte source (the sans-IO rule: no global RNG).
        self.rng = self.rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        (z ^ (z >> 31)) as u8
    }

    /// Registers a zeroed region of `length` bytes. Returns its key.
    /// Errors: `None` when the table is full (the caller maps it to ENOMEM).
    pub fn register(&mut self, pd: u32, length: usize, access: AccessFlags) -> Option<u32> {
        let buf = vec![0u8; length].into_boxed_slice();
        let iova = buf.as_ptr() as u64;
        let index = match self.slots.iter().position(Option::is_none) {
            Some(i) => i,
            None if self.slots.len() < MAX_MR => {
                self.slots.push(None);
                self.slots.len() - 1
            }
            None => return None,
        };
        // Index 0 is never used, so no valid key is below 0x100.
        let lkey = ((index as u32 + 1) << 8) | u32::from(self.next_key_byte());
        self.slots[index] = Some(MrEntry {
            lkey,
            pd,
            access,
            iova,
            buf,
        });
        Some(lkey)
    }

    /// Deregisters `key`. Returns false when no such MR exists.
    pub fn deregister(&mut self, key: u32) -> bool {
        match self.slot_mut(key) {
            Some(slot) => {
                *slot = None;
                true
            }
            None => false,
        }
    }

    fn slot_mut(&mut self, key: u32) -> Option<&mut Option<MrEntry>> {
        let index = (key >> 8).checked_sub(1)? as usize;
        let slot = self.slots.get_mut(index)?;
        match slot {
            Some(mr) if mr.lkey == key => Some(slot),
            _ => None,
        }
    }

    /// The live MR with this key.
    pub fn get(&self, key: u32) -> Option<&MrEntry> {
        let index = (key >> 8).checked_sub(1)? as usize;
        self.slots.get(index)?.as_ref().filter(|mr| mr.lkey == key)
    }

    /// The live MR with this key, writable.
    pub fn get_mut(&mut self, key: u32) -> Option<&mut MrEntry> {
        let index = (key >> 8).checked_sub(1)? as usize;
        self.slots
            .get_mut(index)?
            .as_mut()
            .filter(|mr| mr.lkey == key)
    }

    /// Checks `key` for an access of `[va, va + len)` by protection domain `pd` needing
    /// `need`. Returns the MR and the byte offset.
    pub fn check(
        &self,
        key: u32,
        pd: u32,
        va: u64,
        len: u64,
        need: AccessFlags,
    ) -> Result<(&MrEntry, usize), MemError> {
        let mr = self.get(key).ok_or(MemError::BadKey)?;
        if mr.pd != pd {
            return Err(MemError::PdMismatch);
        }
        if !mr.access.contains(need) {
            return Err(MemError::Access);
        }
        let off = mr.offset_of(va, len)?;
        Ok((mr, off))
    }

    /// Copies `out.len()` bytes from the remote-visible range at `va` of MR `key` (READ).
    pub fn read_remote(&self, key: u32, pd: u32, va: u64, out: &mut [u8]) -> Result<(), MemError> {
        let (mr, off) = self.check(key, pd, va, out.len() as u64, AccessFlags::REMOTE_READ)?;
        out.copy_from_slice(&mr.bytes()[off..off + out.len()]);
        Ok(())
    }

    /// Copies `data` into MR `key` at `va` (WRITE), checking REMOTE_WRITE.
    pub fn write_remote(
        &mut self,
        key: u32,
        pd: u32,
        va: u64,
        data: &[u8],
    ) -> Result<(), MemError> {
        let (_, off) = self.check(key, pd, va, data.len() as u64, AccessFlags::REMOTE_WRITE)?;
        let mr = self.get_mut(key).ok_or(MemError::BadKey)?;
        mr.bytes_mut()[off..off + data.len()].copy_from_slice(data);
        Ok(())
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
        let mut skip = offset;
        let mut done = 0usize;
        for s in sges {
            if done == out.len() {
                break;
            }
            let len = u64::from(s.length);
            if skip >= len {
                skip -= len;
                continue;
            }
            let n = ((len - skip) as usize).min(out.len() - done);
            let va = s.addr.checked_add(skip).ok_or(MemError::Range)?;
            let (mr, off) = self.check(s.lkey, pd, va, n as u64, AccessFlags::empty())?;
            out[done..done + n].copy_from_slice(&mr.bytes()[off..off + n]);
            done += n;
            skip = 0;
        }
        if done == out.len() {
            Ok(())
        } else {
            Err(MemError::Length)
        }
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
        let mut skip = offset;
        let mut done = 0usize;
        for s in sges {
            if done == data.len() {
                break;
            }
            let len = u64::from(s.length);
            if skip >= len {
                skip -= len;
                continue;
            }
            let n = ((len - skip) as usize).min(data.len() - done);
            let va = s.addr.checked_add(skip).ok_or(MemError::Range)?;
            let (_, off) = self.check(s.lkey, pd, va, n as u64, AccessFlags::LOCAL_WRITE)?;
            let mr = self.get_mut(s.lkey).ok_or(MemError::BadKey)?;
            mr.bytes_mut()[off..off + n].copy_from_slice(&data[done..done + n]);
            done += n;
            skip = 0;
        }
        if done == data.len() {
            Ok(())
        } else {
            Err(MemError::Length)
        }
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
        assert_eq!(t.write_remote(k, 1, va + 60, b"abcd"), Ok(()));
        assert_eq!(t.write_remote(k, 1, va + 61, b"abcd"), Err(MemError::Range));
        assert_eq!(t.write_remote(k, 2, va, b"a"), Err(MemError::PdMismatch));
        assert_eq!(
            t.write_remote(k + 0x100, 1, va, b"a"),
            Err(MemError::BadKey)
        );
        let mut out = [0u8; 4];
        assert_eq!(
            t.read_remote(k, 1, va + 60, &mut out),
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
}
