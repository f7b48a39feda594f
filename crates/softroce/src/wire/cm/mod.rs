//! Communication Manager (CM) messages: the 232 bytes that follow the MAD common header in a
//! CM MAD (management class 0x07), and the rdma_cm IP header (`struct cma_hdr`) that rdma_cm
//! puts at the start of the REQ and SIDR_REQ private data.
//!
//! One view and one `Repr` per message: REQ, MRA, REJ, REP, RTU, DREQ, DREP, SIDR_REQ,
//! SIDR_REP, one file per message family (req.rs; rep.rs: REP, RTU; rej.rs: REJ, MRA;
//! dreq.rs: DREQ, DREP; sidr.rs), plus the rdma_cm helpers (rdma_cm.rs) and the GID of an IP
//! (gid.rs), all re-exported here. They share bits.rs (the message length, bit-field access,
//! the view macro), which imports none of them; this file keeps the attribute IDs and
//! [`CmMsgRepr`]. LAP and APR (alternate paths) are kept as
//! [`CmMsgRepr::Other`] with their attribute ID: softroce, like rxe, has no alternate path.
//! [`CmMadRepr`] is a whole MAD: header plus message.
//!
//! Shape: every view covers [`CM_MSG_LEN`] bytes (the MAD after its 24-byte header); offsets
//! below are from the start of the message, bit positions count from the most significant bit
//! of a byte (as IBTA's tables and the kernel's `CM_FIELD_BLOC` do). Fields are big-endian.
//! Reserved bits read as they are and are written as 0; a `Repr` emit writes all 232 bytes.
//! Panics: never after `check_len`. Allocation: none.
//! Source: IBTA Vol 1 ch. 12 (CM message formats: tables 106 "REQ message contents" to 120
//! "SIDR_REP message contents"); kernel `include/rdma/ibta_vol1_c12.h` (offsets) and
//! `drivers/infiniband/core/cma.c` `struct cma_hdr`; Wireshark `packet-infiniband.c`.

use super::mad::{MAD_HDR_LEN, MAD_LEN, MadHdr, MadHdrRepr};
use super::{Error, Result};

/// CM attribute IDs (the MAD header's `attr_id`): which message a CM MAD carries.
/// Source: IBTA Vol 1 ch. 12 (CM attributes); kernel `cm.c` `CM_REQ_ATTR_ID` and siblings.
pub mod attr {
    /// ClassPortInfo.
    pub const CLASS_PORT_INFO: u16 = 0x0001;
    /// Connect request.
    pub const REQ: u16 = 0x0010;
    /// Message receipt acknowledgement.
    pub const MRA: u16 = 0x0011;
    /// Reject.
    pub const REJ: u16 = 0x0012;
    /// Reply to a REQ.
    pub const REP: u16 = 0x0013;
    /// Ready to use.
    pub const RTU: u16 = 0x0014;
    /// Disconnect request.
    pub const DREQ: u16 = 0x0015;
    /// Disconnect reply.
    pub const DREP: u16 = 0x0016;
    /// Service ID resolution request (UD).
    pub const SIDR_REQ: u16 = 0x0017;
    /// Service ID resolution reply (UD).
    pub const SIDR_REP: u16 = 0x0018;
    /// Load alternate path.
    pub const LAP: u16 = 0x0019;
    /// Alternate path response.
    pub const APR: u16 = 0x001a;
}

#[macro_use]
mod bits;
mod dreq;
mod gid;
mod rdma_cm;
mod rej;
mod rep;
mod req;
mod sidr;

pub use bits::CM_MSG_LEN;
use bits::arr;
pub use dreq::{Drep, DrepRepr, Dreq, DreqRepr};
pub use gid::{gid_of_ip, ip_of_gid};
pub use rdma_cm::{CmaHdr, CmaHdrRepr, port_space, rdma_cm_port, rdma_cm_service_id};
pub use rej::{Mra, MraRepr, Rej, RejReason, RejRepr, msg_ref};
pub use rep::{Rep, RepRepr, Rtu, RtuRepr};
pub use req::{CmPathRepr, Req, ReqRepr};
pub use sidr::{SidrRep, SidrRepRepr, SidrReq, SidrReqRepr, SidrStatus};

/// One CM message, by attribute ID. `Other` keeps an attribute softroce does not parse (LAP,
/// APR, ClassPortInfo, unknown) with its 232 bytes, so that it re-emits unchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub enum CmMsgRepr {
    Req(ReqRepr),
    Mra(MraRepr),
    Rej(RejRepr),
    Rep(RepRepr),
    Rtu(RtuRepr),
    Dreq(DreqRepr),
    Drep(DrepRepr),
    SidrReq(SidrReqRepr),
    SidrRep(SidrRepRepr),
    /// An attribute not parsed here: its ID and its bytes.
    Other(u16, [u8; CM_MSG_LEN]),
}

impl CmMsgRepr {
    /// Parses the 232 message bytes of a MAD whose attribute ID is `attr_id`.
    /// Errors: [`Error::Truncated`] if fewer than [`CM_MSG_LEN`] bytes.
    pub fn parse(attr_id: u16, msg: &[u8]) -> Result<CmMsgRepr> {
        Ok(match attr_id {
            attr::REQ => CmMsgRepr::Req(ReqRepr::parse(&Req::new_checked(msg)?)),
            attr::MRA => CmMsgRepr::Mra(MraRepr::parse(&Mra::new_checked(msg)?)),
            attr::REJ => CmMsgRepr::Rej(RejRepr::parse(&Rej::new_checked(msg)?)),
            attr::REP => CmMsgRepr::Rep(RepRepr::parse(&Rep::new_checked(msg)?)),
            attr::RTU => CmMsgRepr::Rtu(RtuRepr::parse(&Rtu::new_checked(msg)?)),
            attr::DREQ => CmMsgRepr::Dreq(DreqRepr::parse(&Dreq::new_checked(msg)?)),
            attr::DREP => CmMsgRepr::Drep(DrepRepr::parse(&Drep::new_checked(msg)?)),
            attr::SIDR_REQ => CmMsgRepr::SidrReq(SidrReqRepr::parse(&SidrReq::new_checked(msg)?)),
            attr::SIDR_REP => CmMsgRepr::SidrRep(SidrRepRepr::parse(&SidrRep::new_checked(msg)?)),
            other => {
                if msg.len() < CM_MSG_LEN {
                    return Err(Error::Truncated);
                }
                CmMsgRepr::Other(other, arr(msg))
            }
        })
    }

    /// The attribute ID of this message.
    pub fn attr_id(&self) -> u16 {
        match self {
            CmMsgRepr::Req(_) => attr::REQ,
            CmMsgRepr::Mra(_) => attr::MRA,
            CmMsgRepr::Rej(_) => attr::REJ,
            CmMsgRepr::Rep(_) => attr::REP,
            CmMsgRepr::Rtu(_) => attr::RTU,
            CmMsgRepr::Dreq(_) => attr::DREQ,
            CmMsgRepr::Drep(_) => attr::DREP,
            CmMsgRepr::SidrReq(_) => attr::SIDR_REQ,
            CmMsgRepr::SidrRep(_) => attr::SIDR_REP,
            CmMsgRepr::Other(id, _) => *id,
        }
    }

    /// Writes the message into the first [`CM_MSG_LEN`] bytes of `msg`.
    /// Panics: if `msg` is shorter than [`CM_MSG_LEN`] (our own buffer).
    pub fn emit(&self, msg: &mut [u8]) {
        let msg = &mut msg[..CM_MSG_LEN];
        match self {
            CmMsgRepr::Req(r) => r.emit(&mut Req::new_unchecked(msg)),
            CmMsgRepr::Mra(r) => r.emit(&mut Mra::new_unchecked(msg)),
            CmMsgRepr::Rej(r) => r.emit(&mut Rej::new_unchecked(msg)),
            CmMsgRepr::Rep(r) => r.emit(&mut Rep::new_unchecked(msg)),
            CmMsgRepr::Rtu(r) => r.emit(&mut Rtu::new_unchecked(msg)),
            CmMsgRepr::Dreq(r) => r.emit(&mut Dreq::new_unchecked(msg)),
            CmMsgRepr::Drep(r) => r.emit(&mut Drep::new_unchecked(msg)),
            CmMsgRepr::SidrReq(r) => r.emit(&mut SidrReq::new_unchecked(msg)),
            CmMsgRepr::SidrRep(r) => r.emit(&mut SidrRep::new_unchecked(msg)),
            CmMsgRepr::Other(_, b) => msg.copy_from_slice(b),
        }
    }
}

/// A whole CM MAD: common header and message. The header's `attr_id` selects the message; on
/// emit it is taken from the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CmMadRepr {
    /// The MAD common header.
    pub hdr: MadHdrRepr,
    /// The message.
    pub msg: CmMsgRepr,
}

impl CmMadRepr {
    /// Parses a MAD of at least [`MAD_LEN`] bytes (more are ignored: a receive buffer may be
    /// larger). The management class is not checked here (the MAD agent demultiplexes by it).
    /// Errors: [`Error::Truncated`] if shorter than [`MAD_LEN`].
    pub fn parse(mad: &[u8]) -> Result<CmMadRepr> {
        if mad.len() < MAD_LEN {
            return Err(Error::Truncated);
        }
        let hdr = MadHdrRepr::parse(&MadHdr::new_checked(mad)?);
        let msg = CmMsgRepr::parse(hdr.attr_id, &mad[MAD_HDR_LEN..MAD_LEN])?;
        Ok(CmMadRepr { hdr, msg })
    }

    /// [`MAD_LEN`].
    pub const fn buffer_len(&self) -> usize {
        MAD_LEN
    }

    /// Writes the 256-byte MAD. Panics: if `mad` is shorter than [`MAD_LEN`] (our buffer).
    pub fn emit(&self, mad: &mut [u8]) {
        let mut hdr = self.hdr;
        hdr.attr_id = self.msg.attr_id();
        hdr.emit(&mut MadHdr::new_unchecked(&mut mad[..MAD_HDR_LEN]));
        self.msg.emit(&mut mad[MAD_HDR_LEN..MAD_LEN]);
    }

    /// The MAD as a fresh 256-byte array.
    pub fn to_bytes(&self) -> [u8; MAD_LEN] {
        let mut b = [0u8; MAD_LEN];
        self.emit(&mut b);
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flow_label_keeps_the_packet_rate_bits() {
        let mut buf = [0u8; CM_MSG_LEN];
        let mut r = Req::new_unchecked(&mut buf[..]);
        r.set_primary_packet_rate(0x3f);
        r.set_primary_flow_label(0xf_ffff);
        assert_eq!(
            (r.primary_flow_label(), r.primary_packet_rate()),
            (0xf_ffff, 0x3f)
        );
        r.set_primary_flow_label(0);
        assert_eq!(&buf[88..92], &[0, 0, 0x00, 0x3f]);
    }

    #[test]
    fn every_view_is_truncated_below_232_bytes() {
        let buf = [0u8; CM_MSG_LEN];
        for n in 0..CM_MSG_LEN {
            let b = &buf[..n];
            assert_eq!(Req::new_checked(b).err(), Some(Error::Truncated));
            assert_eq!(Mra::new_checked(b).err(), Some(Error::Truncated));
            assert_eq!(Rej::new_checked(b).err(), Some(Error::Truncated));
            assert_eq!(Rep::new_checked(b).err(), Some(Error::Truncated));
            assert_eq!(Rtu::new_checked(b).err(), Some(Error::Truncated));
            assert_eq!(Dreq::new_checked(b).err(), Some(Error::Truncated));
            assert_eq!(Drep::new_checked(b).err(), Some(Error::Truncated));
            assert_eq!(SidrReq::new_checked(b).err(), Some(Error::Truncated));
            assert_eq!(SidrRep::new_checked(b).err(), Some(Error::Truncated));
            assert!(CmMsgRepr::parse(0x0019, b).is_err());
        }
        assert!(CmaHdr::new_checked(&buf[..35]).is_err());
    }

    #[test]
    fn private_data_lengths_follow_the_kernel_layout() {
        assert_eq!(Req::<&[u8]>::PRIVATE_DATA_LEN, 92);
        assert_eq!(Mra::<&[u8]>::PRIVATE_DATA_LEN, 222);
        assert_eq!(Rej::<&[u8]>::PRIVATE_DATA_LEN, 148);
        assert_eq!(Rep::<&[u8]>::PRIVATE_DATA_LEN, 196);
        assert_eq!(Rtu::<&[u8]>::PRIVATE_DATA_LEN, 224);
        assert_eq!(Dreq::<&[u8]>::PRIVATE_DATA_LEN, 220);
        assert_eq!(Drep::<&[u8]>::PRIVATE_DATA_LEN, 224);
        assert_eq!(SidrReq::<&[u8]>::PRIVATE_DATA_LEN, 216);
        assert_eq!(SidrRep::<&[u8]>::PRIVATE_DATA_LEN, 136);
    }

    #[test]
    fn rdma_cm_service_ids_and_gids() {
        assert_eq!(rdma_cm_service_id(port_space::TCP, 7174), 0x0106_1c06);
        assert_eq!(rdma_cm_port(0x0106_1c06), Some((port_space::TCP, 7174)));
        assert_eq!(rdma_cm_port(1 << 40), None);
        let ip = core::net::IpAddr::V4(core::net::Ipv4Addr::new(10, 77, 0, 2));
        assert_eq!(ip_of_gid(gid_of_ip(ip)), ip);
    }
}
