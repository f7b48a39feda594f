//! DREQ (either side asks to disconnect) and DREP (its answer): views and `Repr`s. Layout
//! conventions: see [`super`].
//! Source: IBTA Vol 1 ch. 12, tables 112 and 113; kernel `CM_DREQ_*`, `CM_DREP_*`.

use super::bits::{CM_MSG_LEN, arr};
use crate::wire::{be24, be32, put_be24};

cm_view!(
    /// DREQ: either side asks to disconnect.
    ///
    /// Shape: private data at 12..232 (220 bytes). Source: IBTA Vol 1 ch. 12, table 112; `CM_DREQ_*`.
    Dreq, private_data: 12, {
        /// Local communication ID, u32 at 0.
        local_comm_id / set_local_comm_id: u32[0];
        /// Remote communication ID, u32 at 4.
        remote_comm_id / set_remote_comm_id: u32[4];
        /// Remote QPN/EECN, 24 bits at 8.
        remote_qpn_eecn / set_remote_qpn_eecn: u24[8];
    }
);

cm_view!(
    /// DREP: the answer to a DREQ.
    ///
    /// Shape: private data at 8..232 (224 bytes). Source: IBTA Vol 1 ch. 12, table 113; `CM_DREP_*`.
    Drep, private_data: 8, {
        /// Local communication ID, u32 at 0.
        local_comm_id / set_local_comm_id: u32[0];
        /// Remote communication ID, u32 at 4.
        remote_comm_id / set_remote_comm_id: u32[4];
    }
);

/// Owned DREQ. Field meanings: see [`Dreq`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub struct DreqRepr {
    pub local_comm_id: u32,
    pub remote_comm_id: u32,
    pub remote_qpn_eecn: u32,
    pub private_data: [u8; 220],
}

/// Owned DREP. Field meanings: see [`Drep`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub struct DrepRepr {
    pub local_comm_id: u32,
    pub remote_comm_id: u32,
    pub private_data: [u8; 224],
}

impl DreqRepr {
    /// Parses a checked view; never fails.
    pub fn parse<T: AsRef<[u8]>>(h: &Dreq<T>) -> DreqRepr {
        DreqRepr {
            local_comm_id: h.local_comm_id(),
            remote_comm_id: h.remote_comm_id(),
            remote_qpn_eecn: h.remote_qpn_eecn(),
            private_data: arr(h.private_data()),
        }
    }
    /// Writes all [`CM_MSG_LEN`] bytes (reserved bits 0).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, h: &mut Dreq<T>) {
        h.buffer.as_mut()[..CM_MSG_LEN].fill(0);
        h.set_local_comm_id(self.local_comm_id);
        h.set_remote_comm_id(self.remote_comm_id);
        h.set_remote_qpn_eecn(self.remote_qpn_eecn);
        h.private_data_mut().copy_from_slice(&self.private_data);
    }
}

impl DrepRepr {
    /// Parses a checked view; never fails.
    pub fn parse<T: AsRef<[u8]>>(h: &Drep<T>) -> DrepRepr {
        DrepRepr {
            local_comm_id: h.local_comm_id(),
            remote_comm_id: h.remote_comm_id(),
            private_data: arr(h.private_data()),
        }
    }
    /// Writes all [`CM_MSG_LEN`] bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, h: &mut Drep<T>) {
        h.set_local_comm_id(self.local_comm_id);
        h.set_remote_comm_id(self.remote_comm_id);
        h.private_data_mut().copy_from_slice(&self.private_data);
    }
}
