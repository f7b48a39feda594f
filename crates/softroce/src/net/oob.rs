//! Out-of-band exchange of QP endpoints over TCP, as the classic verbs examples do before
//! any RDMA traffic: each side sends its QPN, first PSN and GID, and reads the peer's.

use crate::rand::SplitMix64;
use crate::verbs::Gid;
use std::io::{self, Read, Write};

/// What a peer needs to connect an RC QP to ours.
///
/// Shape on the wire: 24 bytes, big-endian: `qpn` u32, `psn` u32 (low 24 bits), `gid` 16
/// bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpEndpoint {
    /// QP number.
    pub qpn: u32,
    /// First PSN this side will send (the peer's `rq_psn`).
    pub psn: u32,
    /// This side's GID (RoCEv2, IPv4-mapped for IPv4).
    pub gid: Gid,
}

impl QpEndpoint {
    /// Encoded length in bytes.
    pub const LEN: usize = 24;

    /// Encodes to 24 bytes.
    pub fn to_bytes(&self) -> [u8; 24] {
        let mut b = [0u8; 24];
        b[0..4].copy_from_slice(&self.qpn.to_be_bytes());
        b[4..8].copy_from_slice(&self.psn.to_be_bytes());
        b[8..24].copy_from_slice(&self.gid.0);
        b
    }

    /// Decodes 24 bytes.
    pub fn from_bytes(b: &[u8; 24]) -> QpEndpoint {
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&b[8..24]);
        QpEndpoint {
            qpn: u32::from_be_bytes([b[0], b[1], b[2], b[3]]),
            psn: u32::from_be_bytes([b[4], b[5], b[6], b[7]]) & 0x00ff_ffff,
            gid: Gid(gid),
        }
    }

    /// Sends ours, then reads the peer's. Errors: the stream's I/O errors.
    pub fn exchange<S: Read + Write>(&self, stream: &mut S) -> io::Result<QpEndpoint> {
        stream.write_all(&self.to_bytes())?;
        stream.flush()?;
        let mut b = [0u8; 24];
        stream.read_exact(&mut b)?;
        Ok(QpEndpoint::from_bytes(&b))
    }
}

/// A remote buffer as the classic RDMA WRITE example hands it over: 16 bytes, big-endian
/// `addr` u64, `rkey` u32, `len` u32.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoteBuf {
    /// Virtual address of the buffer in the peer's MR.
    pub addr: u64,
    /// The MR's rkey.
    pub rkey: u32,
    /// Length in bytes.
    pub len: u32,
}

impl RemoteBuf {
    /// Encodes to 16 bytes.
    pub fn to_bytes(&self) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[0..8].copy_from_slice(&self.addr.to_be_bytes());
        b[8..12].copy_from_slice(&self.rkey.to_be_bytes());
        b[12..16].copy_from_slice(&self.len.to_be_bytes());
        b
    }

    /// Decodes 16 bytes.
    pub fn from_bytes(b: &[u8; 16]) -> RemoteBuf {
        let mut a = [0u8; 8];
        a.copy_from_slice(&b[0..8]);
        RemoteBuf {
            addr: u64::from_be_bytes(a),
            rkey: u32::from_be_bytes([b[8], b[9], b[10], b[11]]),
            len: u32::from_be_bytes([b[12], b[13], b[14], b[15]]),
        }
    }

    /// Writes the 16 bytes to `w`.
    pub fn send<W: Write>(&self, w: &mut W) -> io::Result<()> {
        w.write_all(&self.to_bytes())?;
        w.flush()
    }

    /// Reads 16 bytes from `r`.
    pub fn recv<R: Read>(r: &mut R) -> io::Result<RemoteBuf> {
        let mut b = [0u8; 16];
        r.read_exact(&mut b)?;
        Ok(RemoteBuf::from_bytes(&b))
    }
}

/// A 24-bit starting PSN that differs between runs (like `lrand48() & 0xffffff` in the
/// rdma-core examples): the first draw of [`SplitMix64`] from
/// [`seed_from_clock_and_pid`](super::seed_from_clock_and_pid).
pub fn random_psn() -> u32 {
    (SplitMix64::new(super::seed_from_clock_and_pid()).next_u64() & 0x00ff_ffff) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodings_round_trip() {
        let e = QpEndpoint {
            qpn: 0x11,
            psn: 0xab_cdef,
            gid: Gid([7; 16]),
        };
        assert_eq!(QpEndpoint::from_bytes(&e.to_bytes()), e);
        let r = RemoteBuf {
            addr: 0x5638_bba8_e000,
            rkey: 0x105,
            len: 4096,
        };
        assert_eq!(RemoteBuf::from_bytes(&r.to_bytes()), r);
        assert!(random_psn() <= 0x00ff_ffff);
    }
}
