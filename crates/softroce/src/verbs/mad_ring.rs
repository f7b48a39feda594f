//! QP1's MAD ring: [`MadRing`] keeps [`CM_PORT_RECV_SLOTS`] receives posted on a device's GSI
//! QP (each slot a 40-byte GRH area and a 256-byte MAD, in the GSI PD) and sends MADs as UD
//! SENDs to a peer's QP1 with the GSI Q_Key from [`CM_PORT_SEND_SLOTS`] send slots. It polls
//! nothing: its owner takes QP1's completions from the GSI CQ (driving the link or not) and
//! hands each to [`MadRing::handle_completion`]. The one ring of the workspace: the CM's
//! [`super::CmPort`] and libibverbs.so.1's raw MAD entry points (for librdmacm.so.1) are
//! both built on it. Opens no socket, reads no clock.
//!
//! Source: kernel `drivers/infiniband/core/mad.c` (the receive ring of the MAD layer,
//! `ib_post_send_mad`).

use super::{AccessFlags, Device, Error, ErrorKind, GSI_QKEY, Mr, Qp, RecvWr, Result};
use super::{SendWr, Wc, WcStatus, WrOpcode};
use crate::transport::UdDest;
use crate::wire::grh::GRH_LEN;
use crate::wire::mad::MAD_LEN;
use core::net::IpAddr;

/// Bytes of one receive slot: the GRH area, then the MAD.
pub const MAD_RECV_SLOT_BYTES: usize = GRH_LEN + MAD_LEN;
/// Receives kept posted on QP1.
pub const CM_PORT_RECV_SLOTS: usize = 64;
/// MADs in flight on QP1's send queue at once; more wait in the owner's backlog.
pub const CM_PORT_SEND_SLOTS: usize = 64;
const SEND_TAG: u64 = 1 << 63;

/// What one QP1 completion was, for the ring's owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MadCompletion {
    /// A send finished (well or not: MAD senders retransmit on their own timers); its slot
    /// is free again.
    Sent,
    /// A receive landed: `len` bytes (GRH area and MAD, at most
    /// [`MAD_RECV_SLOT_BYTES`]) were given to the callback; the slot is posted again.
    Received {
        /// Bytes of the receive.
        len: usize,
    },
    /// A receive completed in error (QP1 flushed): not posted again.
    RecvFailed,
}

/// QP1's receive ring and send slots. See the module documentation.
#[derive(Debug)]
pub struct MadRing {
    qp: Qp,
    recv_mr: Mr,
    send_mr: Mr,
    free_send: Vec<usize>,
}

impl MadRing {
    /// Takes over `dev`'s QP1: registers the buffers in the GSI PD and posts
    /// [`CM_PORT_RECV_SLOTS`] receives.
    /// Errors: those of `reg_mr` and `post_recv` (e.g. QP1 not in a state to receive).
    pub fn new(dev: &Device) -> Result<MadRing> {
        let pd = dev.gsi_pd();
        let recv_mr = pd.reg_mr(
            CM_PORT_RECV_SLOTS * MAD_RECV_SLOT_BYTES,
            AccessFlags::LOCAL_WRITE,
        )?;
        let send_mr = pd.reg_mr(CM_PORT_SEND_SLOTS * MAD_LEN, AccessFlags::LOCAL_WRITE)?;
        let ring = MadRing {
            qp: dev.gsi_qp(),
            recv_mr,
            send_mr,
            free_send: (0..CM_PORT_SEND_SLOTS).rev().collect(),
        };
        for slot in 0..CM_PORT_RECV_SLOTS {
            ring.post_recv(slot)?;
        }
        Ok(ring)
    }

    /// Handles one completion taken from the GSI CQ. A receive is read out of its slot and
    /// given to `on_recv` (GRH area and MAD), then the slot is posted again.
    /// Errors: `EINVAL` for a completion of a work request the ring did not post (nothing
    /// changes); those of reading the slot or of `post_recv` (the slot is then not posted).
    pub fn handle_completion(
        &mut self,
        wc: &Wc,
        on_recv: impl FnOnce(&[u8]),
    ) -> Result<MadCompletion> {
        if wc.wr_id & SEND_TAG != 0 {
            self.free_send.push((wc.wr_id & !SEND_TAG) as usize);
            return Ok(MadCompletion::Sent);
        }
        let slot = wc.wr_id as usize;
        if slot >= CM_PORT_RECV_SLOTS {
            return Err(Error::new(
                ErrorKind::Inval,
                "CmPort: foreign work request on QP1",
            ));
        }
        if wc.status != WcStatus::Success {
            return Ok(MadCompletion::RecvFailed);
        }
        let mut buf = [0u8; MAD_RECV_SLOT_BYTES];
        let len = (wc.byte_len as usize).min(MAD_RECV_SLOT_BYTES);
        self.recv_mr
            .read(slot * MAD_RECV_SLOT_BYTES, &mut buf[..len])?;
        on_recv(&buf[..len]);
        self.post_recv(slot)?;
        Ok(MadCompletion::Received { len })
    }

    /// True when a send slot is free (a [`MadRing::send`] would not return `Ok(false)`).
    pub fn can_send(&self) -> bool {
        !self.free_send.is_empty()
    }

    /// Sends `mad` (at most [`MAD_LEN`] bytes are taken) to QP1 at `dst` with the GSI Q_Key.
    /// Returns `Ok(false)`, sending nothing, when every send slot is in flight.
    /// Errors: those of writing the slot or of `post_send` (the slot is free again).
    pub fn send(&mut self, dst: IpAddr, mad: &[u8]) -> Result<bool> {
        let Some(slot) = self.free_send.pop() else {
            return Ok(false);
        };
        let n = mad.len().min(MAD_LEN);
        if let Err(e) = self.send_mr.write(slot * MAD_LEN, &mad[..n]) {
            self.free_send.push(slot);
            return Err(e);
        }
        let mut wr = SendWr::new(
            SEND_TAG | slot as u64,
            WrOpcode::Send,
            vec![self.send_mr.sge(slot * MAD_LEN, n as u32)],
        );
        wr.ud = Some(UdDest {
            remote_ip: dst,
            remote_qpn: 1,
            remote_qkey: GSI_QKEY,
            ip: Default::default(),
        });
        if let Err(e) = self.qp.post_send(&[wr]) {
            self.free_send.push(slot);
            return Err(e);
        }
        Ok(true)
    }

    fn post_recv(&self, slot: usize) -> Result<()> {
        self.qp.post_recv(&[RecvWr {
            wr_id: slot as u64,
            sg_list: vec![
                self.recv_mr
                    .sge(slot * MAD_RECV_SLOT_BYTES, MAD_RECV_SLOT_BYTES as u32),
            ],
        }])
    }
}
