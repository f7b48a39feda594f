//! Address handles (`ibv_ah`): the destination of UD sends. Source: rxe `rxe_av.c`.

use super::modify::AhAttr;
use super::pd::Pd;
use super::{Error, ErrorKind, Gid, Result};
use crate::transport::IpFields;

/// An address handle (`ibv_ah`): where UD sends go. For RoCEv2 the destination GID names
/// the IP address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ah {
    dgid: Gid,
    ip: IpFields,
}

impl Ah {
    /// The destination GID.
    pub fn dgid(&self) -> Gid {
        self.dgid
    }
    /// The `wr.ud` of a send to QP `remote_qpn` with Q_Key `remote_qkey` behind this AH.
    pub fn dest(&self, remote_qpn: u32, remote_qkey: u32) -> crate::transport::UdDest {
        crate::transport::UdDest {
            remote_ip: self.dgid.ip(),
            remote_qpn,
            remote_qkey,
            ip: self.ip,
        }
    }
}

impl Pd {
    /// `ibv_create_ah`. Errors: `EINVAL` when the destination GID is of another IP family
    /// than the device's address.
    pub fn create_ah(&self, attr: &AhAttr) -> Result<Ah> {
        if attr.dgid.ip().is_ipv4() != self.dev.shared.cfg.ip.is_ipv4() {
            return Err(Error::new(
                ErrorKind::Inval,
                "create_ah: dgid of another IP family than the device",
            ));
        }
        Ok(Ah {
            dgid: attr.dgid,
            ip: attr.ip_fields(),
        })
    }
}
