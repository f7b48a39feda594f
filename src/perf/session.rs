//! One side's verbs resources for a perftest test: the device, a PD, a send and a receive CQ,
//! `-q` RC QPs and one MR, and the moves of the QPs to RTS with perftest's attributes
//! (`ctx_init`, `set_up_connection` and `ctx_connect` in perftest's
//! `src/perftest_resources.c`).
//!
//! MR layout: QP i owns `2 * region` bytes at `i * 2 * region`: the first half is what the
//! peer targets (its WRITEs land there, its READs and atomics read it, and in the SEND tests
//! this side's receives fill it), the second half is this side's own source (SEND/WRITE) or
//! sink (READ responses, atomic results). `region` is the larger of the biggest message and
//! a page, since a perftest peer cycles messages smaller than a page through the page.

use super::oob::{PAGE_BYTES, PerfDest};
use crate::BoxError;
use softroce::net::UdpDevice;
use softroce::net::oob::random_psn;
use softroce::verbs::{AccessFlags, Cq, Mr, PathMtu, Pd, Qp, QpCap, QpInitAttr, QpType, RcConnect};
use std::net::IpAddr;

/// What a side needs to build its resources.
#[derive(Debug, Clone, Copy)]
pub struct SessionSpec {
    /// Number of QPs (`-q`).
    pub qps: usize,
    /// Largest message, bytes.
    pub max_size: usize,
    /// Send queue depth per QP (`-t`).
    pub tx_depth: u32,
    /// Receive queue depth per QP (`-r`; 1 for tests without receives).
    pub rx_depth: u32,
    /// Whether the peer may READ or use atomics (sets OUT and the access flags).
    pub rd_atomic: bool,
    /// Whether the peer addresses this side's memory at all (SEND tests send rkey 0).
    pub remote_access: bool,
    /// GID index (`-x`).
    pub gid_index: u8,
}

/// One side's resources.
pub struct Session {
    /// The device (kept open for the whole test).
    pub dev: UdpDevice,
    _pd: Pd,
    /// Completions of sends, WRITEs, READs and atomics.
    pub send_cq: Cq,
    /// Completions of receives.
    pub recv_cq: Cq,
    /// The QPs, index = position in the address exchange.
    pub qps: Vec<Qp>,
    /// The one MR (see the module doc for its layout).
    pub mr: Mr,
    /// Bytes of each half-region.
    pub region: usize,
    /// This side's address messages, one per QP.
    pub me: Vec<PerfDest>,
}

impl Session {
    /// Opens `dev_name` on `ip` and creates everything. Errors: the device cannot be opened
    /// (address taken, UDP 4791 bound), or a verbs call fails.
    pub fn open(dev_name: &str, ip: IpAddr, spec: &SessionSpec) -> Result<Session, BoxError> {
        // The error names the device, its address and port, and a hint.
        let dev = UdpDevice::open(dev_name, ip)?;
        let attr = dev.query_device();
        let pd = dev.alloc_pd()?;
        let qps_u32 = u32::try_from(spec.qps).map_err(|_| "too many QPs")?;
        let send_cq = dev.create_cq(spec.tx_depth.saturating_mul(qps_u32).saturating_add(1))?;
        let recv_cq = dev.create_cq(spec.rx_depth.saturating_mul(qps_u32).saturating_add(1))?;
        let mut qps = Vec::with_capacity(spec.qps);
        for _ in 0..spec.qps {
            qps.push(pd.create_qp(&QpInitAttr {
                qp_type: QpType::Rc,
                send_cq: &send_cq,
                recv_cq: &recv_cq,
                cap: QpCap {
                    max_send_wr: spec.tx_depth,
                    max_recv_wr: spec.rx_depth.max(1),
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data: 0,
                },
                sq_sig_all: false,
                srq: None,
            })?);
        }
        let region = spec.max_size.max(PAGE_BYTES as usize).next_multiple_of(64);
        let access = AccessFlags::LOCAL_WRITE
            | AccessFlags::REMOTE_WRITE
            | AccessFlags::REMOTE_READ
            | AccessFlags::REMOTE_ATOMIC;
        let mr = pd.reg_mr(2 * region * spec.qps, access)?;
        let gid = crate::pingpong::local_gid(&dev, spec.gid_index, "-x")?;
        let out_reads = if spec.rd_atomic {
            u16::try_from(attr.max_qp_rd_atom.min(0xffff)).unwrap_or(u16::MAX)
        } else {
            1
        };
        let me = qps
            .iter()
            .enumerate()
            .map(|(i, qp)| PerfDest {
                lid: 0,
                out_reads,
                qpn: qp.qp_num(),
                psn: random_psn(),
                rkey: if spec.remote_access { mr.rkey() } else { 0 },
                vaddr: mr.addr() + (2 * region * i) as u64,
                gid,
                srqn: 0,
            })
            .collect();
        Ok(Session {
            dev,
            _pd: pd,
            send_cq,
            recv_cq,
            qps,
            mr,
            region,
            me,
        })
    }

    /// MR offset of the part of QP `i`'s region that the peer targets.
    pub fn target_offset(&self, i: usize) -> usize {
        2 * self.region * i
    }

    /// MR offset of QP `i`'s own source/sink.
    pub fn local_offset(&self, i: usize) -> usize {
        2 * self.region * i + self.region
    }

    /// Takes every QP to RTS towards its peer (`ctx_connect`): INIT with all remote access,
    /// RTR with the path MTU, the peer's QPN and PSN, `min_rnr_timer` 12 and as many
    /// outstanding READs/atomics as both accept, RTS with `timeout` 14, `retry_cnt` 7,
    /// `rnr_retry` 7. Errors: a peer without a RoCE GID; a refused transition.
    pub fn connect(&self, peers: &[PerfDest], mtu: PathMtu, gid_index: u8) -> Result<(), BoxError> {
        for ((qp, me), peer) in self.qps.iter().zip(&self.me).zip(peers) {
            let rd_atomic =
                u8::try_from(peer.out_reads.min(me.out_reads).clamp(1, 255)).unwrap_or(1);
            connect_qp(qp, peer, me.psn, mtu, gid_index, rd_atomic)?;
        }
        Ok(())
    }
}

/// RTR → RTS (from RESET, through INIT with every remote access) towards `peer` with
/// perftest's attributes (`ctx_modify_qp_to_rtr`, `ctx_modify_qp_to_rts`), through the
/// library's one connect sequence ([`Qp::connect_rc`]).
fn connect_qp(
    qp: &Qp,
    peer: &PerfDest,
    my_psn: u32,
    mtu: PathMtu,
    sgid_index: u8,
    rd_atomic: u8,
) -> Result<(), BoxError> {
    if peer.gid.0[8..].iter().all(|b| *b == 0) {
        return Err(format!(
            "the peer sent GID {}: RoCE needs a GID, run the peer with -x <its RoCE v2 GID index>",
            peer.gid
        )
        .into());
    }
    let c = RcConnect {
        sgid_index,
        path_mtu: mtu,
        max_rd_atomic: rd_atomic,
        max_dest_rd_atomic: rd_atomic,
        ..RcConnect::new(peer.qpn, peer.gid, peer.psn, my_psn)
    };
    qp.connect_rc(&c)
        .map_err(|e| format!("Failed to modify QP: {e}").into())
}
