//! The queue pair builder (`ibv_create_qp` and the attributes of the later `ibv_modify_qp`
//! calls) and the prepared QP it creates, which the handshake connects.

use super::{QueuePair, QueuePairEndpoint};
use crate::{AccessFlags, PathMtu, QpType, Result};
use softroce::net::UdpDevice;
use softroce::verbs::{self, QpCap, QpInitAttr};
use std::sync::Arc;

/// Builds a queue pair (`ibv_create_qp` + the attributes its `ibv_modify_qp` calls will
/// use). Setters take and return `&mut Self`; [`QueuePairBuilder::build`] creates the QP.
///
/// Defaults: 1 send and 1 receive WR of 1 SGE each; access `LOCAL_WRITE`; GID index 1;
/// path MTU 1024; `timeout` 14 (4.096 µs × 2^14 ≈ 67 ms), `retry_count` 7, `rnr_retry` 7
/// (forever), `min_rnr_timer` 12 (0.64 ms) — the values of rdma-core's `ibv_rc_pingpong`;
/// 1 outstanding READ/atomic each way; traffic class 0, hop limit 64; UD Q_Key 0x11111111.
#[derive(Debug, Clone)]
pub struct QueuePairBuilder {
    pub(crate) pd: verbs::Pd,
    pub(crate) dev: Arc<UdpDevice>,
    pub(crate) send: verbs::Cq,
    pub(crate) recv: verbs::Cq,
    pub(crate) qp_type: QpType,
    pub(crate) cap: QpCap,
    pub(crate) access: AccessFlags,
    pub(crate) gid_index: u8,
    pub(crate) path_mtu: PathMtu,
    pub(crate) timeout: u8,
    pub(crate) retry_count: u8,
    pub(crate) rnr_retry: u8,
    pub(crate) min_rnr_timer: u8,
    pub(crate) max_rd_atomic: u8,
    pub(crate) max_dest_rd_atomic: u8,
    pub(crate) traffic_class: u8,
    pub(crate) hop_limit: u8,
    pub(crate) qkey: u32,
}

impl QueuePairBuilder {
    /// Remote access the QP allows (`qp_access_flags`).
    pub fn set_access(&mut self, access: AccessFlags) -> &mut Self {
        self.access = access;
        self
    }
    /// Index of the local GID to send from (`ah_attr.grh.sgid_index`); only 1, the device
    /// address, can send (0 makes the handshake fail with `EINVAL`).
    pub fn set_gid_index(&mut self, index: u8) -> &mut Self {
        self.gid_index = index;
        self
    }
    /// Send queue depth (`cap.max_send_wr`), 1..=16384.
    pub fn set_max_send_wr(&mut self, n: u32) -> &mut Self {
        self.cap.max_send_wr = n;
        self
    }
    /// Receive queue depth (`cap.max_recv_wr`), 0..=16384.
    pub fn set_max_recv_wr(&mut self, n: u32) -> &mut Self {
        self.cap.max_recv_wr = n;
        self
    }
    /// SGEs per send WR (`cap.max_send_sge`), up to 32.
    pub fn set_max_send_sge(&mut self, n: u32) -> &mut Self {
        self.cap.max_send_sge = n;
        self
    }
    /// SGEs per receive WR (`cap.max_recv_sge`), up to 32.
    pub fn set_max_recv_sge(&mut self, n: u32) -> &mut Self {
        self.cap.max_recv_sge = n;
        self
    }
    /// Path MTU (`path_mtu`); both sides must agree.
    pub fn set_path_mtu(&mut self, mtu: PathMtu) -> &mut Self {
        self.path_mtu = mtu;
        self
    }
    /// ACK timeout exponent (`timeout`, 0..=31): 4.096 µs × 2^timeout.
    pub fn set_timeout(&mut self, timeout: u8) -> &mut Self {
        self.timeout = timeout;
        self
    }
    /// Retries after an ACK timeout (`retry_cnt`, 0..=7).
    pub fn set_retry_count(&mut self, count: u8) -> &mut Self {
        self.retry_count = count;
        self
    }
    /// Retries after an RNR NAK (`rnr_retry`, 0..=7; 7 = forever).
    pub fn set_rnr_retry(&mut self, count: u8) -> &mut Self {
        self.rnr_retry = count;
        self
    }
    /// RNR NAK timer code this QP sends (`min_rnr_timer`, 0..=31; 12 = 0.64 ms).
    pub fn set_min_rnr_timer(&mut self, code: u8) -> &mut Self {
        self.min_rnr_timer = code;
        self
    }
    /// Outstanding READ/atomics this QP issues (`max_rd_atomic`).
    pub fn set_max_rd_atomic(&mut self, n: u8) -> &mut Self {
        self.max_rd_atomic = n;
        self
    }
    /// Outstanding READ/atomics this QP accepts (`max_dest_rd_atomic`).
    pub fn set_max_dest_rd_atomic(&mut self, n: u8) -> &mut Self {
        self.max_dest_rd_atomic = n;
        self
    }
    /// Traffic class (IPv4 TOS) of the packets (`ah_attr.grh.traffic_class`).
    pub fn set_traffic_class(&mut self, tc: u8) -> &mut Self {
        self.traffic_class = tc;
        self
    }
    /// Hop limit / TTL (`ah_attr.grh.hop_limit`).
    pub fn set_hop_limit(&mut self, hops: u8) -> &mut Self {
        self.hop_limit = hops;
        self
    }
    /// Q_Key of a UD QP (`qkey`).
    pub fn set_qkey(&mut self, qkey: u32) -> &mut Self {
        self.qkey = qkey;
        self
    }

    /// `ibv_create_qp`: the QP exists (in RESET) and has a number; exchange its
    /// [`PreparedQueuePair::endpoint`], then [`PreparedQueuePair::handshake`].
    ///
    /// Errors: `EINVAL` for queue sizes over the device limits; `ENOMEM` past the QP limit.
    pub fn build(&self) -> Result<PreparedQueuePair> {
        let qp = self.pd.create_qp(&QpInitAttr {
            qp_type: self.qp_type,
            send_cq: &self.send,
            recv_cq: &self.recv,
            cap: self.cap,
            sq_sig_all: false,
            srq: None,
        })?;
        Ok(PreparedQueuePair {
            qp,
            b: self.clone(),
        })
    }
}

/// A created queue pair that is not connected yet.
#[derive(Debug)]
pub struct PreparedQueuePair {
    pub(crate) qp: verbs::Qp,
    pub(crate) b: QueuePairBuilder,
}

impl PreparedQueuePair {
    /// This QP's endpoint, to send to the peer.
    pub fn endpoint(&self) -> QueuePairEndpoint {
        QueuePairEndpoint {
            num: self.qp.qp_num(),
            lid: 0,
            gid: self
                .b
                .dev
                .query_gid(1, self.b.gid_index)
                .ok()
                .map(|g| g.gid),
        }
    }

    /// Connects the QP to `remote` with `ibv_modify_qp` RESET→INIT→RTR→RTS, using the
    /// builder's attributes (for UC, those UC takes; for UD, INIT with the Q_Key, then RTR
    /// and RTS: `remote` is not used, each UD send names its destination in `wr.ud`).
    ///
    /// Errors: `EINVAL` for a remote endpoint without a GID or of another IP family, a GID
    /// index other than 1, or attribute values out of range (each named, see
    /// [`softroce::verbs::check_modify`]).
    pub fn handshake(self, remote: QueuePairEndpoint) -> Result<QueuePair> {
        let b = &self.b;
        let qp = &self.qp;
        if b.qp_type == QpType::Ud {
            qp.ready_ud(b.qkey, 0)?;
            return Ok(QueuePair {
                qp: self.qp,
                remote,
                _dev: self.b.dev.clone(),
            });
        }
        let Some(dgid) = remote.gid else {
            return Err(verbs::Error::new(
                verbs::ErrorKind::Inval,
                "handshake: the remote endpoint has no GID (RoCE needs one)",
            )
            .into());
        };
        // The library's one connect sequence (UC takes only the attributes UC has).
        qp.connect_rc(&verbs::RcConnect {
            sgid_index: b.gid_index,
            hop_limit: b.hop_limit,
            traffic_class: b.traffic_class,
            path_mtu: b.path_mtu,
            qp_access_flags: b.access,
            timeout: b.timeout,
            retry_cnt: b.retry_count,
            rnr_retry: b.rnr_retry,
            min_rnr_timer: b.min_rnr_timer,
            max_rd_atomic: b.max_rd_atomic,
            max_dest_rd_atomic: b.max_dest_rd_atomic,
            ..verbs::RcConnect::new(remote.num, dgid, 0, 0)
        })?;
        Ok(QueuePair {
            qp: self.qp,
            remote,
            _dev: self.b.dev.clone(),
        })
    }
}
