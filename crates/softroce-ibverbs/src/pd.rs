//! Protection domains (`ibv_pd`): registering memory and starting queue pair builders.

use crate::{
    AccessFlags, CompletionQueue, MemoryRegion, PathMtu, QpType, QueuePairBuilder, Result,
};
use softroce::net::UdpDevice;
use softroce::verbs::{self, QpCap};
use std::sync::Arc;

/// A protection domain (`ibv_pd`).
#[derive(Debug)]
pub struct ProtectionDomain {
    pub(crate) pd: verbs::Pd,
    pub(crate) dev: Arc<UdpDevice>,
}

/// The access [`ProtectionDomain::allocate`] and [`ProtectionDomain::register`] grant, as
/// the `ibverbs` crate's `allocate`: local write, remote write, read and atomic.
const ALL_ACCESS: AccessFlags = AccessFlags(
    AccessFlags::LOCAL_WRITE.0
        | AccessFlags::REMOTE_WRITE.0
        | AccessFlags::REMOTE_READ.0
        | AccessFlags::REMOTE_ATOMIC.0,
);

impl ProtectionDomain {
    /// `ibv_reg_mr` of `n` new zeroed bytes with local write, remote write, remote read and
    /// remote atomic access. Units: bytes (the `ibverbs` crate counts elements of `T`).
    ///
    /// Errors: `EINVAL` for `n` = 0 or over 2 GiB; `ENOMEM` when the MR table is full.
    pub fn allocate(&self, n: usize) -> Result<MemoryRegion> {
        Ok(MemoryRegion {
            mr: self.pd.reg_mr(n, ALL_ACCESS)?,
            _dev: self.dev.clone(),
        })
    }

    /// Registers a copy of `data` (same access as [`ProtectionDomain::allocate`]): the MR
    /// holds its own bytes, so later changes to `data` are not seen by the device.
    /// Errors: as [`ProtectionDomain::allocate`] for `data.len()`.
    pub fn register(&self, data: &[u8]) -> Result<MemoryRegion> {
        let mr = self.allocate(data.len())?;
        mr.write(0, data)?;
        Ok(mr)
    }

    /// Starts building a queue pair of type `qp_type` (RC, UC or UD) whose send completions
    /// go to `send` and receive completions to `recv` (which may be the same CQ).
    pub fn create_qp(
        &self,
        send: &CompletionQueue,
        recv: &CompletionQueue,
        qp_type: QpType,
    ) -> QueuePairBuilder {
        QueuePairBuilder {
            pd: self.pd.clone(),
            dev: self.dev.clone(),
            send: send.cq.clone(),
            recv: recv.cq.clone(),
            qp_type,
            cap: QpCap {
                max_send_wr: 1,
                max_recv_wr: 1,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            access: AccessFlags::LOCAL_WRITE,
            gid_index: 1,
            path_mtu: PathMtu::Mtu1024,
            timeout: 14,
            retry_count: 7,
            rnr_retry: 7,
            min_rnr_timer: 12,
            max_rd_atomic: 1,
            max_dest_rd_atomic: 1,
            traffic_class: 0,
            hop_limit: 64,
            qkey: 0x1111_1111,
        }
    }
}
