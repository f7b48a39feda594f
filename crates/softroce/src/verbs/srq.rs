//! Shared receive queues (`ibv_srq`): one queue of receive WRs that several QPs (RC, UC, UD)
//! of a device take their receive WQEs from. The WRs live in the device's state next to the
//! QPs; the receive path (`rx.rs`) hands the SRQ to the engine of an attached QP with each
//! packet, and its responder takes receive WQEs from it (see `transport::srq`). Source: rdma-core `ibv_create_srq(3)`,
//! `ibv_modify_srq(3)`; rxe `rxe_srq.c`, `rxe_resp.c` `get_srq_wqe`.

use super::base::{Device, SrqEntry};
use super::pd::Pd;
use super::{Error, ErrorKind, RecvWr, Result};
use crate::transport::{PostError, SrqQueue};

/// Most SRQs per device (`max_srq`).
pub(super) const MAX_SRQ: u32 = 1 << 16;
/// Most WRs per SRQ (`max_srq_wr`; rxe `RXE_MAX_SRQ_WR`).
pub(super) const MAX_SRQ_WR: u32 = 16384;
/// Most SGEs per SRQ WR (`max_srq_sge`; the device's `max_sge`).
pub(super) const MAX_SRQ_SGE: u32 = 32;

/// SRQ creation attributes (`struct ibv_srq_init_attr`'s `attr`).
///
/// Units: `max_wr` and `srq_limit` count WRs; `max_sge` counts SGEs per WR.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SrqInitAttr {
    /// Queue depth, 1..=`max_srq_wr`.
    pub max_wr: u32,
    /// SGEs per WR, 0..=`max_srq_sge`.
    pub max_sge: u32,
    /// Limit event armed at creation (0 = not armed), at most `max_wr`.
    pub srq_limit: u32,
}

/// SRQ attributes (`struct ibv_srq_attr`), as [`Srq::query`] reports and [`Srq::modify`]
/// takes them. Units as [`SrqInitAttr`]; a `srq_limit` of 0 means the limit event is not
/// armed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SrqAttr {
    /// Queue depth in WRs.
    pub max_wr: u32,
    /// SGEs per WR (read-only: [`Srq::modify`] ignores it).
    pub max_sge: u32,
    /// Limit of the SRQ_LIMIT_REACHED event, in WRs (0 = not armed).
    pub srq_limit: u32,
}

/// Which fields of an [`SrqAttr`] [`Srq::modify`] applies (`enum ibv_srq_attr_mask`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct SrqAttrMask(pub u32);

impl SrqAttrMask {
    /// `IBV_SRQ_MAX_WR`: resize the queue to `max_wr`.
    pub const MAX_WR: SrqAttrMask = SrqAttrMask(1);
    /// `IBV_SRQ_LIMIT`: arm the limit event at `srq_limit`.
    pub const LIMIT: SrqAttrMask = SrqAttrMask(2);
    /// True when every bit of `o` is set.
    pub const fn contains(self, o: SrqAttrMask) -> bool {
        self.0 & o.0 == o.0
    }
}

impl core::ops::BitOr for SrqAttrMask {
    type Output = SrqAttrMask;
    fn bitor(self, o: SrqAttrMask) -> SrqAttrMask {
        SrqAttrMask(self.0 | o.0)
    }
}

/// A shared receive queue. Made by [`Pd::create_srq`]; QPs use it through
/// [`super::QpInitAttr::srq`]. Dropping it destroys it once no QP uses it.
#[derive(Debug)]
pub struct Srq {
    dev: Device,
    srq_num: u32,
    destroyed: bool,
}

impl Pd {
    /// `ibv_create_srq`.
    ///
    /// Errors: `EINVAL` for `max_wr` 0 or above `max_srq_wr` (16384), `max_sge` above
    /// `max_srq_sge` (32), or `srq_limit` above `max_wr`; `ENOMEM` past `max_srq` SRQs.
    /// Source: rxe `rxe_srq.c` `rxe_srq_chk_init`.
    pub fn create_srq(&self, init: &SrqInitAttr) -> Result<Srq> {
        if init.max_wr == 0 || init.max_wr > MAX_SRQ_WR {
            return Err(Error::new(
                ErrorKind::Inval,
                "create_srq: max_wr out of range",
            ));
        }
        if init.max_sge > MAX_SRQ_SGE {
            return Err(Error::new(
                ErrorKind::Inval,
                "create_srq: max_sge above max_srq_sge",
            ));
        }
        if init.srq_limit > init.max_wr {
            return Err(Error::new(
                ErrorKind::Inval,
                "create_srq: srq_limit above max_wr",
            ));
        }
        let dev = self.device();
        let mut st = dev.state();
        let t = &mut st.srqs;
        if t.srqs.len() >= MAX_SRQ as usize {
            return Err(Error::new(ErrorKind::NoMem, "create_srq: too many SRQs"));
        }
        let mut n = t.next;
        while t.srqs.contains_key(&n) {
            n = n.wrapping_add(1);
        }
        t.next = n.wrapping_add(1);
        t.srqs.insert(
            n,
            SrqEntry {
                queue: SrqQueue::new(init.max_wr, init.max_sge, init.srq_limit),
                qps: 0,
                orphaned: false,
            },
        );
        drop(st);
        Ok(Srq {
            dev,
            srq_num: n,
            destroyed: false,
        })
    }
}

impl Srq {
    /// The SRQ number (unique within its device; `ibv_get_srq_num`), as async events name it.
    pub fn srq_num(&self) -> u32 {
        self.srq_num
    }

    pub(super) fn same_device(&self, dev: &Device) -> bool {
        self.dev.same_device(dev)
    }

    fn with<T>(&self, call: &str, f: impl FnOnce(&mut SrqEntry) -> Result<T>) -> Result<T> {
        let mut st = self.dev.state();
        match st.srqs.srqs.get_mut(&self.srq_num) {
            Some(e) if !self.destroyed => f(e),
            _ => Err(Error::new(
                ErrorKind::NoEnt,
                format!("{call}: SRQ destroyed"),
            )),
        }
    }

    /// `ibv_post_srq_recv`: queues the WRs in order.
    ///
    /// Errors (with `bad_wr` = index of the first refused WR; those before it were posted):
    /// `ENOMEM` when `max_wr` WRs are queued, `EINVAL` for more SGEs than `max_sge`.
    pub fn post_recv(&self, wrs: &[RecvWr]) -> Result<()> {
        self.with("post_srq_recv", |e| {
            for (i, wr) in wrs.iter().enumerate() {
                e.queue.post(wr.clone()).map_err(|err| {
                    let (kind, what) = match err {
                        PostError::QueueFull => (ErrorKind::NoMem, "post_srq_recv: SRQ full"),
                        _ => (ErrorKind::Inval, "post_srq_recv: too many SGEs"),
                    };
                    Error::new(kind, what).at_wr(i)
                })?;
            }
            Ok(())
        })
    }

    /// `ibv_modify_srq`: with [`SrqAttrMask::MAX_WR`], resizes the queue to `attr.max_wr`;
    /// with [`SrqAttrMask::LIMIT`], arms the limit event at `attr.srq_limit` (0 disarms).
    /// Both are checked before either is applied.
    ///
    /// Errors: `EINVAL` for an unknown mask bit, `max_wr` 0 or above `max_srq_wr`, below the
    /// WRs queued or below the armed limit, or `srq_limit` above the (new) `max_wr`.
    /// Source: rxe `rxe_srq.c` `rxe_srq_chk_attr`, `rxe_srq_from_attr`.
    pub fn modify(&self, attr: &SrqAttr, mask: SrqAttrMask) -> Result<()> {
        if mask.0 & !(SrqAttrMask::MAX_WR.0 | SrqAttrMask::LIMIT.0) != 0 {
            return Err(Error::new(ErrorKind::Inval, "modify_srq: unknown mask bit"));
        }
        let resize = mask.contains(SrqAttrMask::MAX_WR);
        let arm = mask.contains(SrqAttrMask::LIMIT);
        if resize && (attr.max_wr == 0 || attr.max_wr > MAX_SRQ_WR) {
            return Err(Error::new(
                ErrorKind::Inval,
                "modify_srq: max_wr out of range",
            ));
        }
        self.with("modify_srq", |e| {
            // Checked on a copy, so that a refused call changes nothing. As rxe, a resize is
            // checked against the limit armed before this call.
            let mut q = e.queue.clone();
            if resize {
                q.resize(attr.max_wr)
                    .map_err(|err| Error::new(ErrorKind::Inval, post_what("modify_srq", err)))?;
            }
            if arm {
                q.arm(attr.srq_limit)
                    .map_err(|err| Error::new(ErrorKind::Inval, post_what("modify_srq", err)))?;
            }
            e.queue = q;
            Ok(())
        })
    }

    /// `ibv_query_srq`: the current `max_wr`, `max_sge` and `srq_limit` (0 once the limit
    /// event fired, until re-armed). Errors: `ENOENT` after [`Srq::destroy`].
    pub fn query(&self) -> Result<SrqAttr> {
        self.with("query_srq", |e| {
            Ok(SrqAttr {
                max_wr: e.queue.max_wr(),
                max_sge: e.queue.max_sge(),
                srq_limit: e.queue.limit(),
            })
        })
    }

    /// WRs queued in the SRQ now.
    pub fn len(&self) -> usize {
        self.with("srq", |e| Ok(e.queue.len())).unwrap_or(0)
    }

    /// True when no WR is queued.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `ibv_destroy_srq`. Errors: `EBUSY` while a QP uses the SRQ (nothing changes);
    /// `ENOENT` if already destroyed. Its queued WRs are discarded without completions.
    pub fn destroy(&mut self) -> Result<()> {
        let mut st = self.dev.state();
        let t = &mut st.srqs;
        match t.srqs.get(&self.srq_num) {
            Some(e) if !self.destroyed => {
                if e.qps > 0 {
                    return Err(Error::new(
                        ErrorKind::Busy,
                        "destroy_srq: QPs still use the SRQ",
                    ));
                }
                t.srqs.remove(&self.srq_num);
                self.destroyed = true;
                Ok(())
            }
            _ => Err(Error::new(ErrorKind::NoEnt, "destroy_srq: SRQ destroyed")),
        }
    }
}

fn post_what(call: &str, e: PostError) -> String {
    match e {
        PostError::Invalid(w) => format!("{call}: {w}"),
        other => format!("{call}: {other:?}"),
    }
}

impl Drop for Srq {
    fn drop(&mut self) {
        if self.destroyed {
            return;
        }
        let mut st = self.dev.state();
        let t = &mut st.srqs;
        if let Some(e) = t.srqs.get_mut(&self.srq_num) {
            if e.qps == 0 {
                t.srqs.remove(&self.srq_num);
            } else {
                e.orphaned = true;
            }
        }
    }
}
