//! Management Datagram (MAD) common header: the first 24 bytes of every 256-byte MAD that
//! travels on QP1 (the GSI QP) as the payload of a UD SEND.
//!
//! Shape: 24 bytes, big-endian: `base_version` u8 at 0, `mgmt_class` u8 at 1, `class_version`
//! u8 at 2, `method` u8 at 3 (bit 7 is the response bit `R`), `status` u16 at 4..6,
//! `class_specific` u16 at 6..8, `tid` (transaction ID) u64 at 8..16, `attr_id` u16 at 16..18,
//! reserved u16 at 18..20, `attr_mod` u32 at 20..24. The class-specific data follows, up to
//! [`MAD_LEN`] bytes in all.
//! Panics: never after `check_len`. Allocation: none.
//! Source: IBTA Vol 1 ch. 13 (MAD common header); kernel `include/rdma/ib_mad.h`
//! `struct ib_mad_hdr`; Wireshark `packet-infiniband.c` (MAD common header).

use super::{be16, be32, be64};

/// Length of every GSI MAD, header included, in bytes.
pub const MAD_LEN: usize = 256;

/// Length of the MAD common header, in bytes.
pub const MAD_HDR_LEN: usize = 24;

/// Base version of every MAD this crate speaks.
pub const MAD_BASE_VERSION: u8 = 1;

/// Management class of the Communication Manager.
/// Source: IBTA Vol 1 ch. 12 (CM MADs); kernel `ib_mad.h` `IB_MGMT_CLASS_CM`.
pub const MGMT_CLASS_CM: u8 = 0x07;

/// Class version of CM MADs (kernel `IB_CM_CLASS_VERSION`).
pub const CM_CLASS_VERSION: u8 = 2;

/// MAD method `Send` (0x03): every CM message uses it. Source: IBTA Vol 1 ch. 13 (MAD methods);
/// kernel `IB_MGMT_METHOD_SEND`.
pub const MAD_METHOD_SEND: u8 = 0x03;

header_view!(
    /// The MAD common header over the first 24 bytes of a MAD.
    ///
    /// Shape and source: see the module documentation.
    /// Errors: `Truncated` if fewer than 24 bytes. Panics: never after `check_len`.
    MadHdr,
    MAD_HDR_LEN
);

impl<T: AsRef<[u8]>> MadHdr<T> {
    /// Base version (1).
    pub fn base_version(&self) -> u8 {
        self.buffer.as_ref()[0]
    }
    /// Management class (0x07 for the CM).
    pub fn mgmt_class(&self) -> u8 {
        self.buffer.as_ref()[1]
    }
    /// Class version (2 for the CM).
    pub fn class_version(&self) -> u8 {
        self.buffer.as_ref()[2]
    }
    /// Method, response bit included.
    pub fn method(&self) -> u8 {
        self.buffer.as_ref()[3]
    }
    /// Status.
    pub fn status(&self) -> u16 {
        be16(&self.buffer.as_ref()[4..6])
    }
    /// Class-specific field.
    pub fn class_specific(&self) -> u16 {
        be16(&self.buffer.as_ref()[6..8])
    }
    /// Transaction ID.
    pub fn tid(&self) -> u64 {
        be64(&self.buffer.as_ref()[8..16])
    }
    /// Attribute ID (for the CM: which message).
    pub fn attr_id(&self) -> u16 {
        be16(&self.buffer.as_ref()[16..18])
    }
    /// The reserved 16 bits after the attribute ID.
    pub fn reserved(&self) -> u16 {
        be16(&self.buffer.as_ref()[18..20])
    }
    /// Attribute modifier.
    pub fn attr_mod(&self) -> u32 {
        be32(&self.buffer.as_ref()[20..24])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> MadHdr<T> {
    /// Sets the base version.
    pub fn set_base_version(&mut self, v: u8) {
        self.buffer.as_mut()[0] = v;
    }
    /// Sets the management class.
    pub fn set_mgmt_class(&mut self, v: u8) {
        self.buffer.as_mut()[1] = v;
    }
    /// Sets the class version.
    pub fn set_class_version(&mut self, v: u8) {
        self.buffer.as_mut()[2] = v;
    }
    /// Sets the method.
    pub fn set_method(&mut self, v: u8) {
        self.buffer.as_mut()[3] = v;
    }
    /// Sets the status.
    pub fn set_status(&mut self, v: u16) {
        self.buffer.as_mut()[4..6].copy_from_slice(&v.to_be_bytes());
    }
    /// Sets the class-specific field.
    pub fn set_class_specific(&mut self, v: u16) {
        self.buffer.as_mut()[6..8].copy_from_slice(&v.to_be_bytes());
    }
    /// Sets the transaction ID.
    pub fn set_tid(&mut self, v: u64) {
        self.buffer.as_mut()[8..16].copy_from_slice(&v.to_be_bytes());
    }
    /// Sets the attribute ID; the reserved 16 bits after it become 0.
    pub fn set_attr_id(&mut self, v: u16) {
        self.buffer.as_mut()[16..18].copy_from_slice(&v.to_be_bytes());
        self.buffer.as_mut()[18..20].copy_from_slice(&[0, 0]);
    }
    /// Sets the attribute modifier.
    pub fn set_attr_mod(&mut self, v: u32) {
        self.buffer.as_mut()[20..24].copy_from_slice(&v.to_be_bytes());
    }
}

/// Owned MAD common header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MadHdrRepr {
    /// Base version (1).
    pub base_version: u8,
    /// Management class.
    pub mgmt_class: u8,
    /// Class version.
    pub class_version: u8,
    /// Method, response bit included.
    pub method: u8,
    /// Status.
    pub status: u16,
    /// Class-specific field.
    pub class_specific: u16,
    /// Transaction ID.
    pub tid: u64,
    /// Attribute ID.
    pub attr_id: u16,
    /// Attribute modifier.
    pub attr_mod: u32,
}

impl MadHdrRepr {
    /// A CM MAD header: base version 1, class 0x07, class version 2, method Send, status 0.
    pub const fn cm(tid: u64, attr_id: u16) -> MadHdrRepr {
        MadHdrRepr {
            base_version: MAD_BASE_VERSION,
            mgmt_class: MGMT_CLASS_CM,
            class_version: CM_CLASS_VERSION,
            method: MAD_METHOD_SEND,
            status: 0,
            class_specific: 0,
            tid,
            attr_id,
            attr_mod: 0,
        }
    }

    /// Parses a checked view; never fails (the reserved field is not kept).
    pub fn parse<T: AsRef<[u8]>>(h: &MadHdr<T>) -> MadHdrRepr {
        MadHdrRepr {
            base_version: h.base_version(),
            mgmt_class: h.mgmt_class(),
            class_version: h.class_version(),
            method: h.method(),
            status: h.status(),
            class_specific: h.class_specific(),
            tid: h.tid(),
            attr_id: h.attr_id(),
            attr_mod: h.attr_mod(),
        }
    }

    /// 24.
    pub const fn buffer_len(&self) -> usize {
        MAD_HDR_LEN
    }

    /// Writes the header (reserved bits 0).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, h: &mut MadHdr<T>) {
        h.set_base_version(self.base_version);
        h.set_mgmt_class(self.mgmt_class);
        h.set_class_version(self.class_version);
        h.set_method(self.method);
        h.set_status(self.status);
        h.set_class_specific(self.class_specific);
        h.set_tid(self.tid);
        h.set_attr_id(self.attr_id);
        h.set_attr_mod(self.attr_mod);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::Error;

    // The MAD header of the CM REQ in tests/captures/30-rping.pcap (frame 1).
    const BYTES: [u8; 24] = [
        0x01, 0x07, 0x02, 0x03, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x04, 0x44, 0xa2, 0x87,
        0x93, 0x00, 0x10, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    ];

    fn repr() -> MadHdrRepr {
        MadHdrRepr::cm(0x0000_0004_44a2_8793, 0x0010)
    }

    #[test]
    fn deconstruct() {
        let h = MadHdr::new_checked(&BYTES[..]).unwrap();
        assert_eq!(
            (
                h.base_version(),
                h.mgmt_class(),
                h.class_version(),
                h.method()
            ),
            (1, MGMT_CLASS_CM, CM_CLASS_VERSION, MAD_METHOD_SEND)
        );
        assert_eq!((h.status(), h.class_specific(), h.reserved()), (0, 0, 0));
        assert_eq!(
            (h.tid(), h.attr_id(), h.attr_mod()),
            (0x4_44a2_8793, 0x10, 0)
        );
    }

    #[test]
    fn construct() {
        let mut buf = [0xa5u8; 24];
        let mut h = MadHdr::new_unchecked(&mut buf[..]);
        h.set_base_version(1);
        h.set_mgmt_class(7);
        h.set_class_version(2);
        h.set_method(3);
        h.set_status(0);
        h.set_class_specific(0);
        h.set_tid(0x4_44a2_8793);
        h.set_attr_id(0x10);
        h.set_attr_mod(0);
        assert_eq!(buf, BYTES);
    }

    #[test]
    fn parse() {
        let h = MadHdr::new_checked(&BYTES[..]).unwrap();
        assert_eq!(MadHdrRepr::parse(&h), repr());
    }

    #[test]
    fn emit() {
        let mut buf = [0xffu8; 24];
        repr().emit(&mut MadHdr::new_unchecked(&mut buf[..]));
        assert_eq!(buf, BYTES);
    }

    #[test]
    fn truncated() {
        for n in 0..MAD_HDR_LEN {
            assert_eq!(MadHdr::new_checked(&BYTES[..n]), Err(Error::Truncated));
        }
    }
}
