//! Memory windows (`ibv_alloc_mw`, `ibv_bind_mw`, BIND_MW work requests), fast-register MRs
//! (`alloc_mr` + REG_MR / LOCAL_INV work requests) and MRs over caller memory
//! (`reg_mr_user`), extending `Pd`, `Mr` and `Qp`.
//!
//! Source: libibverbs `ibv_alloc_mw`, `ibv_bind_mw` (rdma-core rxe provider: a type 1 bind is
//! a BIND_MW work request with `ibv_inc_rkey` of the window's R_Key), kernel verbs
//! `ib_alloc_mr` / `IB_WR_REG_MR`; rxe `rxe_mw.c`, `rxe_mr.c`.

use super::base::{Device, State};
use super::mr::Mr;
use super::pd::Pd;
use super::qp::{Qp, post_error};
use super::{Error, ErrorKind, Result};
use crate::transport::{
    AccessFlags, BindMw, MAX_MSG_BYTES, MwType, RegMr, SendFlags, SendWr, WrOpcode, inc_rkey,
};
use core::ptr::NonNull;

/// Bytes per page of a fast-register MR (`alloc_mr`'s `max_num_sg` counts these).
pub const FAST_REG_PAGE_BYTES: usize = 4096;
/// Most pages a fast-register MR may have (softroce's cap: 2 MiB per MR).
pub const MAX_FAST_REG_PAGES: u32 = 512;

/// A memory window (`struct ibv_mw`). Dropping it deallocates it (`ibv_dealloc_mw`).
#[derive(Debug)]
pub struct Mw {
    dev: Device,
    /// The R_Key at allocation; its index names the window's slot.
    key: u32,
    mw_type: MwType,
}

impl Mw {
    /// The window's current R_Key (its key byte changes with every bind).
    pub fn rkey(&self) -> u32 {
        let st = self.dev.shared.state.lock();
        st.mrs.mw_slot(self.key).map_or(self.key, |m| m.rkey)
    }

    /// Type 1 or type 2.
    pub fn mw_type(&self) -> MwType {
        self.mw_type
    }

    /// A BIND_MW work request (for `post_send`, the way type 2 windows are bound) that binds
    /// this window to `[addr, addr + length)` of `mr` with `access`, giving it R_Key
    /// `ibv_inc_rkey(self.rkey())`. Signaled.
    pub fn bind_wr(
        &self,
        wr_id: u64,
        mr: &Mr,
        addr: u64,
        length: u64,
        access: AccessFlags,
    ) -> SendWr {
        let rkey = self.rkey();
        let mut wr = SendWr::new(wr_id, WrOpcode::BindMw, Vec::new());
        wr.bind_mw = Some(BindMw {
            mw_rkey: rkey,
            rkey: inc_rkey(rkey),
            mr_lkey: mr.lkey(),
            addr,
            length,
            access,
        });
        wr
    }
}

impl Drop for Mw {
    fn drop(&mut self) {
        self.dev.shared.state.lock().mrs.dealloc_mw(self.key);
    }
}

/// What `ibv_bind_mw` binds: `struct ibv_mw_bind` with its `bind_info`.
#[derive(Debug, Clone, Copy)]
pub struct MwBind<'a> {
    /// The MR the window opens (registered with `IBV_ACCESS_MW_BIND`).
    pub mr: &'a Mr,
    /// First address of the window, inside the MR.
    pub addr: u64,
    /// Length in bytes; 0 unbinds.
    pub length: u64,
    /// Rights granted (REMOTE_READ, REMOTE_WRITE, REMOTE_ATOMIC).
    pub access: AccessFlags,
    /// `wr_id` of the bind's work completion.
    pub wr_id: u64,
    /// `IBV_SEND_SIGNALED`, `IBV_SEND_FENCE`.
    pub send_flags: SendFlags,
}

impl Pd {
    /// `ibv_alloc_mw`. A type 1 window is usable once bound with [`Qp::bind_mw`]; a type 2
    /// window once a BIND_MW work request ([`Mw::bind_wr`]) binds it to a QP.
    /// Errors: `ENOMEM` past 4096 windows per device (rxe `RXE_MAX_MW`).
    pub fn alloc_mw(&self, mw_type: MwType) -> Result<Mw> {
        let mut st = self.dev.shared.state.lock();
        let key = st
            .mrs
            .alloc_mw(self.handle, mw_type)
            .ok_or_else(|| Error::new(ErrorKind::NoMem, "alloc_mw: too many memory windows"))?;
        Ok(Mw {
            dev: self.dev.clone(),
            key,
            mw_type,
        })
    }

    /// `ib_alloc_mr(pd, IB_MR_TYPE_MEM_REG, max_num_sg)`: a fast-register MR owning
    /// `max_num_sg` pages of 4096 bytes, in the FREE state: no local or remote access until a
    /// REG_MR work request ([`Mr::reg_wr`]) registers it; LOCAL_INV or a peer's
    /// SEND_WITH_INV makes it FREE again. Errors: `EINVAL` for 0 or more than 512 pages;
    /// `ENOMEM` when the key table is full.
    pub fn alloc_mr(&self, max_num_sg: u32) -> Result<Mr> {
        if max_num_sg == 0 || max_num_sg > MAX_FAST_REG_PAGES {
            return Err(Error::new(
                ErrorKind::Inval,
                "alloc_mr: max_num_sg out of range",
            ));
        }
        let length = max_num_sg as usize * FAST_REG_PAGE_BYTES;
        let mut st = self.dev.shared.state.lock();
        let lkey = st
            .mrs
            .alloc_fast_reg(self.handle, length)
            .ok_or_else(|| Error::new(ErrorKind::NoMem, "alloc_mr: MR table full"))?;
        Ok(new_mr(&self.dev, &st, lkey, length))
    }

    /// `ibv_reg_mr` over caller memory: registers the `len` bytes at `ptr`, whose address is
    /// the MR's virtual address. Dropping the [`Mr`] deregisters it.
    ///
    /// Errors: `EINVAL` for a null `ptr`, a length of 0 or over 2 GiB, or REMOTE_WRITE /
    /// REMOTE_ATOMIC without LOCAL_WRITE; `ENOMEM` when the key table is full.
    ///
    /// The application keeps using the memory: it may read and write it directly, from any
    /// thread, while peers' WRITEs, ATOMICs and local receives land in it (perftest's latency
    /// tests spin on the last byte of such a buffer). What it reads while a WRITE lands there
    /// is unspecified, as on hardware, except that the device stores the last byte of each
    /// piece it writes (a packet's payload, or its part in one SGE) after the others, with
    /// release ordering: seeing it change (with an acquire load) means the bytes before it in
    /// that piece, and in the message's earlier packets, are there. The
    /// device never forms a Rust reference over the memory (docs/memory.md).
    ///
    /// # Safety
    ///
    /// `ptr` must stay valid for reads and writes of `len` bytes until the returned `Mr` is
    /// dropped (the allocation outlives the MR). Nothing more.
    pub unsafe fn reg_mr_user(&self, ptr: *mut u8, len: usize, access: AccessFlags) -> Result<Mr> {
        // SAFETY: our caller's contract, which is `reg_mr_user_iova`'s.
        unsafe { self.reg_mr_user_iova(ptr, len, ptr as u64, access) }
    }

    /// `ibv_reg_mr_iova` over caller memory: as [`Pd::reg_mr_user`], but the MR's virtual
    /// address (what local SGEs and peers' RETH / AtomicETH name, and [`Mr::addr`]
    /// returns) is `iova` instead of `ptr`.
    ///
    /// Errors: those of [`Pd::reg_mr_user`]; `EINVAL` when `iova` and `ptr` lie at
    /// different offsets inside a 4 KiB page (ib_core `ib_uverbs_reg_mr`: "start" and
    /// "hca_va" must agree below the page size) or `iova + len` passes 2^64 (a
    /// deviation: rxe registers it; spec/deviations.toml). A range ending at 2^64 is fine.
    /// Source: ib_core `uverbs_cmd.c` `ib_uverbs_reg_mr`; rxe `rxe_mr.c` `rxe_mr_init_user`.
    ///
    /// # Safety
    ///
    /// As [`Pd::reg_mr_user`].
    pub unsafe fn reg_mr_user_iova(
        &self,
        ptr: *mut u8,
        len: usize,
        iova: u64,
        access: AccessFlags,
    ) -> Result<Mr> {
        let ptr = NonNull::new(ptr)
            .ok_or_else(|| Error::new(ErrorKind::Inval, "reg_mr: null address"))?;
        if (ptr.as_ptr() as u64 ^ iova) & (PAGE_BYTES - 1) != 0 {
            return Err(Error::new(
                ErrorKind::Inval,
                "reg_mr: iova at another offset in its page than the address",
            ));
        }
        // spec/deviations.toml: rxe registers an IOVA range that wraps past 2^64 (and then
        // refuses every access to it); here it is EINVAL. A range that ends at 2^64 is
        // fine in both.
        if u128::from(iova) + len as u128 > 1 << 64 {
            return Err(Error::new(
                ErrorKind::Inval,
                "reg_mr: iova + length passes 2^64",
            ));
        }
        if len == 0 || len as u64 > MAX_MSG_BYTES {
            return Err(super::device::reg_mr_length_error(len));
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
        // SAFETY: our caller upholds `register_user`'s contract (see `# Safety` above: the
        // memory outlives the MR, which deregisters on drop).
        let lkey = unsafe {
            st.mrs
                .register_user_iova(self.handle, ptr, len, iova, access)
        }
        .ok_or_else(|| Error::new(ErrorKind::NoMem, "reg_mr: MR table full"))?;
        Ok(new_mr(&self.dev, &st, lkey, len))
    }
}

/// The page size whose offsets an IOVA must share with the address it maps (ib_core's
/// `PAGE_SIZE` on x86_64), in bytes.
const PAGE_BYTES: u64 = 4096;

fn new_mr(dev: &Device, st: &State, lkey: u32, length: usize) -> Mr {
    let addr = st.mrs.get(lkey).map_or(0, |m| m.iova);
    Mr {
        dev: dev.clone(),
        lkey,
        addr,
        length,
    }
}

impl Mr {
    /// A REG_MR work request (for `post_send`) that registers this fast-register MR at
    /// `iova` for `length` bytes with `access`, under the key with this MR's index and key
    /// byte `key_byte` (after it completes, [`Mr::lkey`] and [`Mr::rkey`] return that key).
    /// Signaled.
    pub fn reg_wr(
        &self,
        wr_id: u64,
        key_byte: u8,
        iova: u64,
        length: u64,
        access: AccessFlags,
    ) -> SendWr {
        let mut wr = SendWr::new(wr_id, WrOpcode::RegMr, Vec::new());
        wr.reg_mr = Some(RegMr {
            mr_key: self.lkey,
            key: (self.lkey & 0xffff_ff00) | u32::from(key_byte),
            iova,
            length,
            access,
        });
        wr
    }
}

impl SendWr {
    /// A signaled LOCAL_INV work request for `rkey` (an MR from `alloc_mr` or a type 2 MW).
    pub fn local_inv(wr_id: u64, rkey: u32) -> SendWr {
        let mut wr = SendWr::new(wr_id, WrOpcode::LocalInv, Vec::new());
        wr.invalidate_rkey = rkey;
        wr
    }
}

impl Qp {
    /// `ibv_bind_mw`: binds type 1 window `mw` as `bind` says by posting a BIND_MW work
    /// request; the window's R_Key becomes `ibv_inc_rkey` of the current one, which is
    /// returned. The bind completes with `IBV_WC_BIND_MW` (or `IBV_WC_MW_BIND_ERR` when its
    /// checks fail, which moves the QP to ERR). Errors: `EINVAL` for a type 2 window (bind
    /// those with [`Mw::bind_wr`] and `post_send`) and the errors of [`Qp::post_send`].
    pub fn bind_mw(&self, mw: &Mw, bind: &MwBind<'_>) -> Result<u32> {
        if mw.mw_type != MwType::Type1 {
            return Err(Error::new(
                ErrorKind::Inval,
                "bind_mw: only type 1 windows (post a BIND_MW WR for type 2)",
            ));
        }
        let mut wr = mw.bind_wr(bind.wr_id, bind.mr, bind.addr, bind.length, bind.access);
        wr.send_flags = bind.send_flags;
        let rkey = wr.bind_mw.map_or(0, |b| b.rkey);
        let now = self.dev.now();
        let mut st = self.dev.shared.state.lock();
        let State { mrs, qps, .. } = &mut *st;
        let slot = qps
            .get_mut(&self.qpn)
            .ok_or_else(|| Error::new(ErrorKind::NoEnt, "bind_mw: QP destroyed"))?;
        let state = slot.engine.state();
        slot.engine
            .post_send_mem(wr, mrs)
            .map_err(|e| post_error("bind_mw", e, state))?;
        self.dev.pump(&mut st, self.qpn, now);
        drop(st);
        self.dev.shared.link.wake();
        Ok(rkey)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::Instant;
    use crate::verbs::{Clock, DeviceConfig, Link, Transmit};
    use std::net::{IpAddr, Ipv4Addr};
    use std::sync::Arc;

    struct NoLink;
    impl Link for NoLink {
        fn send(&self, _: &Transmit) -> std::io::Result<()> {
            Ok(())
        }
    }
    struct Zero;
    impl Clock for Zero {
        fn now(&self) -> Instant {
            Instant::ZERO
        }
    }

    fn device() -> Device {
        let ip = IpAddr::V4(Ipv4Addr::new(10, 1, 1, 1));
        Device::new(DeviceConfig::new("t", ip), Arc::new(NoLink), Arc::new(Zero))
    }

    /// `reg_mr_user` over a caller's buffer: `Mr::write` lands in the buffer, `Mr::read`
    /// sees it, and after the MR is dropped the caller reads it directly. Run under Miri.
    #[test]
    fn reg_mr_user_is_the_callers_memory() {
        let pd = device().alloc_pd().unwrap();
        let mut buf = [1u8; 64];
        let ptr = buf.as_mut_ptr();
        // SAFETY: `buf` outlives `mr` (dropped before `buf` is read) and is not touched
        // except through `mr` meanwhile.
        let mr = unsafe { pd.reg_mr_user(ptr, buf.len(), AccessFlags::LOCAL_WRITE) }.unwrap();
        assert_eq!((mr.addr(), mr.len()), (ptr as u64, 64));
        mr.write(60, b"tail").unwrap();
        let mut out = [0u8; 6];
        mr.read(58, &mut out).unwrap();
        assert_eq!(&out, b"\x01\x01tail");
        assert!(mr.write(61, b"tail").is_err(), "past the end");
        drop(mr);
        assert_eq!(&buf[58..], b"\x01\x01tail");
        // SAFETY: a zero length is refused before anything is registered.
        let e = unsafe { pd.reg_mr_user(ptr, 0, AccessFlags::empty()) }.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Inval);
        // SAFETY: refused (remote write without local write) before registration.
        let e = unsafe { pd.reg_mr_user(ptr, 8, AccessFlags::REMOTE_WRITE) }.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Inval);
    }

    /// `alloc_mr` makes a FREE fast-register MR of whole pages; REG_MR posted on a QP is the
    /// only way to use it (covered over loopback in tests/memory_windows.rs).
    #[test]
    fn alloc_mr_limits() {
        let pd = device().alloc_pd().unwrap();
        assert_eq!(pd.alloc_mr(0).unwrap_err().kind(), ErrorKind::Inval);
        assert_eq!(
            pd.alloc_mr(MAX_FAST_REG_PAGES + 1).unwrap_err().kind(),
            ErrorKind::Inval
        );
        let mr = pd.alloc_mr(2).unwrap();
        assert_eq!(mr.len(), 2 * FAST_REG_PAGE_BYTES);
        let st = mr.dev.shared.state.lock();
        let e = st.mrs.get_slot(mr.lkey).unwrap();
        assert_eq!(e.state(), crate::transport::MrState::Free);
    }
}
