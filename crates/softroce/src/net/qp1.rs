//! A MAD on QP1 as a whole RoCEv2 datagram, as the device's QP1 (and kernel rxe's) sends it:
//! for the senders that run outside a device (the stand-in of `super::standin`, the keeper's
//! slot 0 in `super::keeper`).

use crate::cm::MadTransmit;
use crate::transport::GSI_QKEY;
use crate::wire::{
    BthRepr, DethRepr, IcrcIp, Opcode, PacketRepr, Psn, ROCE_V2_UDP_PORT, mad::MAD_LEN,
};
use std::net::IpAddr;

/// The UDP source port of QP1 (the GSI QP): rxe's port for QPN 1, 0xD872
/// (docs/wire-facts.md; QP1's MADs leave from it, and its sockets report ICMP errors).
pub(super) const SOURCE_PORT: u16 = crate::verbs::rxe_initial_udp_sport(1);

/// UDP payload of a QP1 MAD: BTH (12) + DETH (8) + MAD (256) + ICRC (4).
pub(super) const DATAGRAM_LEN: usize = 12 + 8 + MAD_LEN + 4;

/// The whole UDP payload of QP1 MAD `mad` from `local` (UDP source port `src_port`): BTH
/// (UD SEND only to QP1, AckReq as rxe sets it), DETH (the GSI Q_Key, source QP 1), the MAD
/// and the ICRC, written to `out`. Returns its length, `None` when `local` and the
/// destination are of different families or `out` is too short.
pub(super) fn datagram(
    local: IpAddr,
    src_port: u16,
    mad: &MadTransmit,
    out: &mut [u8],
) -> Option<usize> {
    let mut bth = BthRepr::new(Opcode::UD_SEND_ONLY, 1, Psn::new(0));
    bth.ack_req = true;
    let mut p = PacketRepr::new(bth);
    p.deth = Some(DethRepr {
        qkey: GSI_QKEY,
        src_qpn: 1,
    });
    p.payload_len = MAD_LEN;
    let ip = match (local, mad.dst) {
        (IpAddr::V4(src), IpAddr::V4(dst)) => IcrcIp::V4 {
            src,
            dst,
            ident: 0,
            src_port,
            dst_port: ROCE_V2_UDP_PORT,
        },
        (IpAddr::V6(src), IpAddr::V6(dst)) => IcrcIp::V6 {
            src,
            dst,
            src_port,
            dst_port: ROCE_V2_UDP_PORT,
        },
        _ => return None,
    };
    if out.len() < p.buffer_len() {
        return None;
    }
    Some(p.emit(out, &mad.mad[..], &ip))
}
