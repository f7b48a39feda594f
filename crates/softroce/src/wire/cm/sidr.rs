//! SIDR_REQ (resolve a service ID to a UD QPN and Q_Key) and SIDR_REP (its answer, with a
//! [`SidrStatus`]): views and `Repr`s. Layout conventions: see [`super`].
//! Source: IBTA Vol 1 ch. 12, tables 119 and 120; kernel `CM_SIDR_REQ_*`, `CM_SIDR_REP_*`.

use super::bits::{CM_MSG_LEN, arr};
use crate::wire::{be16, be24, be32, be64, put_be24};

cm_view!(
    /// SIDR_REQ: resolve a service ID to a UD QPN and Q_Key.
    ///
    /// Shape: private data at 16..232 (216 bytes). Source: IBTA Vol 1 ch. 12, table 119;
    /// `CM_SIDR_REQ_*`.
    SidrReq, private_data: 16, {
        /// Request ID, u32 at 0.
        request_id / set_request_id: u32[0];
        /// Partition key, u16 at 4.
        pkey / set_pkey: u16[4];
        /// Service ID, u64 at 8.
        service_id / set_service_id: u64[8];
    }
);

cm_view!(
    /// SIDR_REP: the answer to a SIDR_REQ.
    ///
    /// Shape: additional information at 24..96 (72 bytes), private data at 96..232 (136
    /// bytes). Source: IBTA Vol 1 ch. 12, table 120; `CM_SIDR_REP_*`.
    SidrRep, private_data: 96, {
        /// Request ID, u32 at 0.
        request_id / set_request_id: u32[0];
        /// Status (0 valid; see [`SidrStatus`]), u8 at 4.
        status / set_status: u8[4];
        /// Additional information length, u8 at 5.
        additional_info_length / set_additional_info_length: u8[5];
        /// QPN, 24 bits at 8.
        qpn / set_qpn: u24[8];
        /// Service ID, u64 at 12.
        service_id / set_service_id: u64[12];
        /// Q_Key, u32 at 20.
        qkey / set_qkey: u32[20];
    }
);

impl<T: AsRef<[u8]>> SidrRep<T> {
    /// Additional information, 72 bytes at 24.
    pub fn additional_info(&self) -> &[u8] {
        &self.buffer.as_ref()[24..96]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> SidrRep<T> {
    /// The additional information, writable.
    pub fn additional_info_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[24..96]
    }
}

/// SIDR_REP status values (open). Source: IBTA Vol 1 ch. 12 (SIDR_REP status, with table 120); kernel `ib_cm.h`
/// `enum ib_cm_sidr_status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SidrStatus(pub u8);

impl SidrStatus {
    /// The QPN and Q_Key are valid.
    pub const SUCCESS: SidrStatus = SidrStatus(0);
    /// Service ID not supported (nobody listens).
    pub const UNSUPPORTED: SidrStatus = SidrStatus(1);
    /// Rejected by the service provider.
    pub const REJECT: SidrStatus = SidrStatus(2);
    /// No QP available.
    pub const NO_QP: SidrStatus = SidrStatus(3);
    /// Redirected.
    pub const REDIRECT: SidrStatus = SidrStatus(4);
    /// Class version not supported.
    pub const UNSUPPORTED_VERSION: SidrStatus = SidrStatus(5);
}

/// Owned SIDR_REQ. Field meanings: see [`SidrReq`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub struct SidrReqRepr {
    pub request_id: u32,
    pub pkey: u16,
    pub service_id: u64,
    pub private_data: [u8; 216],
}

/// Owned SIDR_REP. Field meanings: see [`SidrRep`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub struct SidrRepRepr {
    pub request_id: u32,
    pub status: SidrStatus,
    pub additional_info_length: u8,
    pub qpn: u32,
    pub service_id: u64,
    pub qkey: u32,
    pub additional_info: [u8; 72],
    pub private_data: [u8; 136],
}

impl SidrReqRepr {
    /// Parses a checked view; never fails.
    pub fn parse<T: AsRef<[u8]>>(h: &SidrReq<T>) -> SidrReqRepr {
        SidrReqRepr {
            request_id: h.request_id(),
            pkey: h.pkey(),
            service_id: h.service_id(),
            private_data: arr(h.private_data()),
        }
    }
    /// Writes all [`CM_MSG_LEN`] bytes (reserved bits 0).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, h: &mut SidrReq<T>) {
        h.buffer.as_mut()[..CM_MSG_LEN].fill(0);
        h.set_request_id(self.request_id);
        h.set_pkey(self.pkey);
        h.set_service_id(self.service_id);
        h.private_data_mut().copy_from_slice(&self.private_data);
    }
}

impl SidrRepRepr {
    /// Parses a checked view; never fails.
    pub fn parse<T: AsRef<[u8]>>(h: &SidrRep<T>) -> SidrRepRepr {
        SidrRepRepr {
            request_id: h.request_id(),
            status: SidrStatus(h.status()),
            additional_info_length: h.additional_info_length(),
            qpn: h.qpn(),
            service_id: h.service_id(),
            qkey: h.qkey(),
            additional_info: arr(h.additional_info()),
            private_data: arr(h.private_data()),
        }
    }
    /// Writes all [`CM_MSG_LEN`] bytes (reserved bits 0).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, h: &mut SidrRep<T>) {
        h.buffer.as_mut()[..CM_MSG_LEN].fill(0);
        h.set_request_id(self.request_id);
        h.set_status(self.status.0);
        h.set_additional_info_length(self.additional_info_length);
        h.set_qpn(self.qpn);
        h.set_service_id(self.service_id);
        h.set_qkey(self.qkey);
        h.additional_info_mut()
            .copy_from_slice(&self.additional_info);
        h.private_data_mut().copy_from_slice(&self.private_data);
    }
}
