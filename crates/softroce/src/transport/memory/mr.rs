//! One memory region: its state, its kind, the bytes behind it (engine-owned or the
//! application's) and the byte-level access to them (rxe `struct rxe_mr`, `mr_check_range`).

use super::{ForeignMem, MemError, MrBytes};
use crate::transport::AccessFlags;

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

/// The bytes behind an MR.
#[derive(Debug)]
pub(super) enum MrBuf {
    /// Engine memory: a boxed slice that never moves, sliced as usual.
    Owned(Box<[u8]>),
    /// Application memory: never sliced.
    Foreign(ForeignMem),
}

impl MrBuf {
    pub(super) fn len(&self) -> usize {
        match self {
            MrBuf::Owned(b) => b.len(),
            MrBuf::Foreign(m) => m.len(),
        }
    }
    pub(super) fn addr(&self) -> u64 {
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
    pub(super) length: u64,
    pub(super) state: MrState,
    pub(super) kind: MrKind,
    /// Memory windows bound to this MR.
    pub(in crate::transport) num_mw: u32,
    pub(super) buf: MrBuf,
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

    /// REG_MR: the MR becomes VALID with this length and access.
    pub(in crate::transport) fn set_registered(&mut self, length: u64, access: AccessFlags) {
        self.length = length;
        self.access = access;
        self.state = MrState::Valid;
    }
    /// Invalidation: back to FREE.
    pub(in crate::transport) fn set_free(&mut self) {
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
