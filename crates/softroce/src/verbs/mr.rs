//! Memory regions that own their buffer (`ibv_reg_mr`): registration, keys, copies in and
//! out. Fast-register MRs and MRs over caller memory are in `mw.rs`. Source: rxe `rxe_mr.c`.

use super::base::Device;
use super::pd::Pd;
use super::{Error, ErrorKind, Result};
use crate::transport::AccessFlags;

impl Pd {
    /// `ibv_reg_mr` of a new zeroed buffer of `length` bytes owned by the MR.
    /// Errors: `EINVAL` for a length of 0 or over 2 GiB, or REMOTE_WRITE / REMOTE_ATOMIC
    /// without LOCAL_WRITE (as `ibv_reg_mr`); `ENOMEM` when the key table is full.
    pub fn reg_mr(&self, length: usize, access: AccessFlags) -> Result<Mr> {
        if length == 0 || length as u64 > crate::transport::MAX_MSG_BYTES {
            return Err(super::device::reg_mr_length_error(length));
        }
        if access.intersects(AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC)
            && !access.contains(AccessFlags::LOCAL_WRITE)
        {
            return Err(Error::new(
                ErrorKind::Inval,
                "reg_mr: remote write/atomic needs LOCAL_WRITE",
            ));
        }
        let mut st = self.dev.shared.state.lock();
        let lkey = st
            .mrs
            .register(self.handle, length, access)
            .ok_or_else(|| Error::new(ErrorKind::NoMem, "reg_mr: MR table full"))?;
        let addr = st.mrs.get(lkey).map_or(0, |m| m.iova);
        Ok(Mr {
            dev: self.dev.clone(),
            lkey,
            addr,
            length,
        })
    }
}

/// A memory region: one that owns its buffer ([`Pd::reg_mr`], [`Pd::alloc_mr`]) or one over
/// caller memory ([`Pd::reg_mr_user`]). Dropping it deregisters it (memory windows still
/// bound to it stop granting access).
#[derive(Debug)]
pub struct Mr {
    pub(super) dev: Device,
    pub(super) lkey: u32,
    pub(super) addr: u64,
    pub(super) length: usize,
}

impl Mr {
    /// Local key (a fast-register MR's changes with each REG_MR).
    pub fn lkey(&self) -> u32 {
        let st = self.dev.shared.state.lock();
        st.mrs.get_slot(self.lkey).map_or(self.lkey, |m| m.lkey)
    }
    /// Remote key (equal to the local key, as in rxe).
    pub fn rkey(&self) -> u32 {
        self.lkey()
    }
    /// Virtual address of byte 0: what a peer puts in its RETH (a fast-register MR's is
    /// the iova of its last REG_MR).
    pub fn addr(&self) -> u64 {
        let st = self.dev.shared.state.lock();
        st.mrs.get_slot(self.lkey).map_or(self.addr, |m| m.iova)
    }
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.length
    }
    /// True for an empty MR (never: registration needs a length).
    pub fn is_empty(&self) -> bool {
        self.length == 0
    }
    /// An SGE covering `[offset, offset + length)` of this MR. Never fails: an `offset`
    /// outside the MR gives an SGE that the lkey range check refuses when it is used (the
    /// address wraps modulo 2^64 rather than overflowing).
    pub fn sge(&self, offset: usize, length: u32) -> crate::transport::Sge {
        let st = self.dev.shared.state.lock();
        let (addr, lkey) = st
            .mrs
            .get_slot(self.lkey)
            .map_or((self.addr, self.lkey), |m| (m.iova, m.lkey));
        crate::transport::Sge {
            addr: addr.wrapping_add(offset as u64),
            length,
            lkey,
        }
    }
    /// Copies bytes out of the MR. Errors: `EINVAL` if the range is outside the MR.
    pub fn read(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        let st = self.dev.shared.state.lock();
        let mr = st
            .mrs
            .get_slot(self.lkey)
            .ok_or_else(|| Error::new(ErrorKind::NoEnt, "mr: deregistered"))?;
        mr.read(offset, out)
            .map_err(|_| Error::new(ErrorKind::Inval, "mr read: range outside the MR"))
    }
    /// Copies bytes into the MR. Errors: `EINVAL` if the range is outside the MR.
    pub fn write(&self, offset: usize, data: &[u8]) -> Result<()> {
        let mut st = self.dev.shared.state.lock();
        let mr = st
            .mrs
            .get_slot_mut(self.lkey)
            .ok_or_else(|| Error::new(ErrorKind::NoEnt, "mr: deregistered"))?;
        mr.write(offset, data)
            .map_err(|_| Error::new(ErrorKind::Inval, "mr write: range outside the MR"))
    }
    /// The whole MR as a vector.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = vec![0u8; self.length];
        // The range is the MR itself, so this cannot fail while the MR lives.
        let _ = self.read(0, &mut v);
        v
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        self.dev.shared.state.lock().mrs.deregister_slot(self.lkey);
    }
}
