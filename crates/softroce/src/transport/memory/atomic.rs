//! ATOMIC requests on registered memory: the operation, its application to one MR's 8
//! bytes, and the remote access that checks REMOTE_ATOMIC first (rxe `rxe_resp.c`
//! `atomic_reply`).

use super::mr::{MrBuf, MrEntry};
use super::{MemError, MrTable};
use crate::transport::AccessFlags;
use core::sync::atomic::Ordering;

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

impl MrEntry {
    /// Applies `op` to the 8 bytes at byte `offset` of the buffer and returns their value
    /// before it. Application memory is changed with one atomic operation (the application
    /// may use the word concurrently); owned memory, which only the engine reaches, in
    /// place. Errors: as [`ForeignMem::atomic_u64`](super::ForeignMem::atomic_u64).
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
}

impl MrTable {
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
}
