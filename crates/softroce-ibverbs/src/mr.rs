//! Memory regions (`ibv_mr`) and the slices of local and remote memory work requests name.

use crate::{Result, Sge};
use softroce::net::UdpDevice;
use softroce::verbs;
use std::ops::Range;
use std::sync::Arc;

/// A registered memory region (`ibv_mr`) that owns its bytes. Dropping it deregisters it.
#[derive(Debug)]
pub struct MemoryRegion {
    pub(crate) mr: verbs::Mr,
    pub(crate) _dev: Arc<UdpDevice>,
}

impl MemoryRegion {
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.mr.len()
    }
    /// Never true (registration needs at least one byte).
    pub fn is_empty(&self) -> bool {
        self.mr.is_empty()
    }
    /// Local key.
    pub fn lkey(&self) -> u32 {
        self.mr.lkey()
    }
    /// Remote key.
    pub fn rkey(&self) -> u32 {
        self.mr.rkey()
    }
    /// The address of byte 0 (what a peer puts in its RETH).
    pub fn addr(&self) -> u64 {
        self.mr.addr()
    }
    /// Copies bytes out, from `offset`. Errors: `EINVAL` if the range leaves the MR.
    pub fn read(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        Ok(self.mr.read(offset, out)?)
    }
    /// Copies bytes in, at `offset`. Errors: `EINVAL` if the range leaves the MR.
    pub fn write(&self, offset: usize, data: &[u8]) -> Result<()> {
        Ok(self.mr.write(offset, data)?)
    }
    /// The whole MR.
    pub fn to_vec(&self) -> Vec<u8> {
        self.mr.to_vec()
    }
    /// The bytes `range` of this MR as the SGE of a local work request. Panics: never; a
    /// range outside the MR makes the post (or the transfer) fail with a local protection
    /// error instead, as a bad SGE does in verbs.
    pub fn slice(&self, range: Range<usize>) -> LocalMemorySlice {
        let length = range.end.saturating_sub(range.start);
        LocalMemorySlice {
            sge: Sge {
                addr: self.mr.addr().wrapping_add(range.start as u64),
                length: u32::try_from(length).unwrap_or(u32::MAX),
                lkey: self.mr.lkey(),
            },
        }
    }
    /// The whole MR as the peer names it: address, length, rkey. Send it out of band.
    pub fn remote(&self) -> RemoteMemorySlice {
        RemoteMemorySlice {
            addr: self.mr.addr(),
            length: self.mr.len() as u64,
            rkey: self.mr.rkey(),
        }
    }
}

/// A local buffer for a work request: one scatter/gather element (`struct ibv_sge`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalMemorySlice {
    pub(crate) sge: Sge,
}

impl LocalMemorySlice {
    /// The SGE.
    pub fn sge(&self) -> Sge {
        self.sge
    }
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.sge.length as usize
    }
    /// True for a zero-length slice.
    pub fn is_empty(&self) -> bool {
        self.sge.length == 0
    }
}

/// A peer's registered memory, as exchanged out of band: `addr` (the peer MR's address of
/// the first byte), `length` in bytes and `rkey`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RemoteMemorySlice {
    /// Address of the first byte in the peer's MR.
    pub addr: u64,
    /// Length in bytes.
    pub length: u64,
    /// The peer MR's remote key.
    pub rkey: u32,
}

impl RemoteMemorySlice {
    /// The bytes `range` of this slice (clamped to it).
    pub fn slice(&self, range: Range<u64>) -> RemoteMemorySlice {
        let start = range.start.min(self.length);
        let end = range.end.clamp(start, self.length);
        RemoteMemorySlice {
            addr: self.addr.wrapping_add(start),
            length: end - start,
            rkey: self.rkey,
        }
    }
}
