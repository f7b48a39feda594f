//! An open device (`ibv_context`): the CQs and PDs made from it, its GIDs and its CM.

use crate::{CompletionQueue, Gid, ProtectionDomain, Result};
use softroce::net::UdpDevice;
use softroce::verbs;
use std::sync::Arc;

/// An open device (`ibv_context`). Cloning gives another handle; the device closes (its
/// socket and thread end) when the last handle and the last object made from it are gone.
#[derive(Debug, Clone)]
pub struct Context {
    pub(crate) dev: Arc<UdpDevice>,
}

impl Context {
    /// `ibv_create_cq` with at least `min_cq_entries` entries; `id` is the caller's tag
    /// (the `ibverbs` crate's `cq_context`), returned by [`CompletionQueue::id`].
    ///
    /// Errors: `EINVAL` for a size below 1 or above the device's `max_cqe` (2^20).
    pub fn create_cq(&self, min_cq_entries: i32, id: isize) -> Result<CompletionQueue> {
        let n = u32::try_from(min_cq_entries)
            .map_err(|_| verbs::Error::new(verbs::ErrorKind::Inval, "create_cq: negative size"))?;
        Ok(CompletionQueue {
            cq: self.dev.create_cq(n)?,
            id,
            dev: self.dev.clone(),
        })
    }

    /// `ibv_alloc_pd`. Errors: `ENOMEM` past the device's PD limit.
    pub fn alloc_pd(&self) -> Result<ProtectionDomain> {
        Ok(ProtectionDomain {
            pd: self.dev.alloc_pd()?,
            dev: self.dev.clone(),
        })
    }

    /// `ibv_query_gid` on port 1. Index 1 is the device address (IPv4-mapped for IPv4);
    /// index 0 the link-local GID. Errors: `EINVAL` past the table (2 entries).
    pub fn gid(&self, index: u32) -> Result<Gid> {
        let i = u8::try_from(index).unwrap_or(u8::MAX);
        Ok(self.dev.query_gid(1, i)?.gid)
    }

    /// The verbs device underneath (device attributes, counters, QP1, …).
    pub fn verbs(&self) -> &verbs::Device {
        self.dev.device()
    }

    /// The device's Communication Manager ([`cm`](crate::cm) uses it): its engine (state, counters)
    /// through [`CmDriver::with`](softroce::net::CmDriver::with). Started on first use; it
    /// takes over QP1. Errors: those of starting it (QP1 unusable).
    pub fn cm(&self) -> Result<Arc<softroce::net::CmDriver>> {
        Ok(self.dev.cm()?)
    }

    /// Test hook: makes the device's driver thread panic
    /// ([`UdpDevice::inject_panic_for_test`](softroce::net::UdpDevice::inject_panic_for_test)),
    /// which fails the device. Not for use outside tests.
    #[doc(hidden)]
    pub fn inject_panic_for_test(&self) {
        self.dev.inject_panic_for_test();
    }
}
