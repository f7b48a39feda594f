//! Queue pairs: the builder ([`QueuePairBuilder`]), the created but unconnected QP
//! ([`PreparedQueuePair`]), the endpoint exchanged out of band ([`QueuePairEndpoint`]) and
//! the connected QP ([`QueuePair`]) that posts work requests.

mod builder;
mod endpoint;

pub use builder::{PreparedQueuePair, QueuePairBuilder};
pub use endpoint::QueuePairEndpoint;

use crate::{LocalMemorySlice, RecvWr, RemoteMemorySlice, Result, SendFlags, SendWr, WrOpcode};
use softroce::net::UdpDevice;
use softroce::verbs;
use std::sync::Arc;

/// A connected queue pair (`ibv_qp` in RTS). Dropping it destroys it.
#[derive(Debug)]
pub struct QueuePair {
    pub(crate) qp: verbs::Qp,
    pub(crate) remote: QueuePairEndpoint,
    pub(crate) _dev: Arc<UdpDevice>,
}

impl QueuePair {
    /// `ibv_post_send`: queues `wrs` in order and starts sending.
    ///
    /// Errors (with [`Error::bad_wr`] the index of the first refused WR; the ones before it
    /// were posted): `EINVAL` for a WR the QP cannot take (too many SGEs, a bad atomic, a UD
    /// WR without `ud`), `ENOMEM` when the send queue is full, `EOPNOTSUPP` for an opcode
    /// the QP type cannot carry.
    ///
    /// ```
    /// use softroce_ibverbs::{DeviceList, QpType, RecvWr, SendFlags, SendWr, Wc, WcOpcode, WrOpcode};
    /// use std::time::Duration;
    /// // A UD QP sends to itself on 127.0.24.104.
    /// let ctx = DeviceList::with_ip(&["127.0.24.104".parse().unwrap()])[0].open().unwrap();
    /// let (pd, cq) = (ctx.alloc_pd().unwrap(), ctx.create_cq(8, 0).unwrap());
    /// let prep = pd.create_qp(&cq, &cq, QpType::Ud).set_max_send_wr(4).set_max_recv_wr(4).build().unwrap();
    /// let me = prep.endpoint();
    /// let mut qp = prep.handshake(me).unwrap();
    /// let (buf, rbuf) = (pd.register(b"datagram").unwrap(), pd.allocate(40 + 8).unwrap());
    /// qp.post_receive(&[RecvWr { wr_id: 1, sg_list: vec![rbuf.slice(0..48).sge()] }]).unwrap();
    /// let mut send = SendWr::new(2, WrOpcode::Send, vec![buf.slice(0..8).sge()]);
    /// send.send_flags = SendFlags::empty(); // unsignaled: only the receive completes
    /// send.ud = Some(softroce_ibverbs::UdDest {
    ///     remote_ip: ctx.verbs().ip(),
    ///     remote_qpn: me.num,
    ///     remote_qkey: 0x1111_1111,
    ///     ip: Default::default(),
    /// });
    /// // The second WR has two SGEs, one more than the QP takes: refused, index 1.
    /// let mut bad = send.clone();
    /// bad.sg_list.push(buf.slice(0..1).sge());
    /// let e = qp.post_send(&[send, bad]).unwrap_err();
    /// assert_eq!((e.errno(), e.bad_wr()), (22, Some(1)));
    /// // The first was posted: its datagram arrives after the 40-byte GRH.
    /// let mut wc = [Wc::default(); 2];
    /// let got = cq.wait(&mut wc, Duration::from_secs(10)).unwrap();
    /// assert_eq!((got[0].wr_id, got[0].opcode, got[0].byte_len), (1, WcOpcode::Recv, 48));
    /// assert_eq!(&rbuf.to_vec()[40..], b"datagram");
    /// ```
    ///
    /// [`Error::bad_wr`]: crate::Error::bad_wr
    pub fn post_send(&mut self, wrs: &[SendWr]) -> Result<()> {
        Ok(self.qp.post_send(wrs)?)
    }

    /// `ibv_post_recv`: queues receive buffers in order. Errors as
    /// [`QueuePair::post_send`] (`ENOMEM` when the receive queue is full).
    pub fn post_receive(&mut self, wrs: &[RecvWr]) -> Result<()> {
        Ok(self.qp.post_recv(wrs)?)
    }

    /// A signaled RDMA WRITE (with immediate data when `imm_data` is given) of `local` to
    /// `remote`, as WR `wr_id`. Errors: as [`QueuePair::post_send`].
    pub fn post_write(
        &mut self,
        local: &[LocalMemorySlice],
        remote: RemoteMemorySlice,
        wr_id: u64,
        imm_data: Option<u32>,
    ) -> Result<()> {
        let opcode = if imm_data.is_some() {
            WrOpcode::RdmaWriteWithImm
        } else {
            WrOpcode::RdmaWrite
        };
        let mut wr = SendWr::new(wr_id, opcode, local.iter().map(|s| s.sge).collect());
        wr.send_flags = SendFlags::SIGNALED;
        wr.imm_data = imm_data.unwrap_or(0);
        wr.remote_addr = remote.addr;
        wr.rkey = remote.rkey;
        self.post_send(&[wr])
    }

    /// A signaled RDMA READ of `remote` into `local`, as WR `wr_id`. Errors: as
    /// [`QueuePair::post_send`].
    pub fn post_read(
        &mut self,
        local: &[LocalMemorySlice],
        remote: RemoteMemorySlice,
        wr_id: u64,
    ) -> Result<()> {
        let mut wr = SendWr::new(
            wr_id,
            WrOpcode::RdmaRead,
            local.iter().map(|s| s.sge).collect(),
        );
        wr.send_flags = SendFlags::SIGNALED;
        wr.remote_addr = remote.addr;
        wr.rkey = remote.rkey;
        self.post_send(&[wr])
    }

    /// This QP's number.
    pub fn qp_num(&self) -> u32 {
        self.qp.qp_num()
    }

    /// The endpoint given to the handshake.
    pub fn remote(&self) -> QueuePairEndpoint {
        self.remote
    }

    /// The verbs QP underneath (`modify`, `state`, counters, multicast attach).
    pub fn verbs(&self) -> &verbs::Qp {
        &self.qp
    }
}
