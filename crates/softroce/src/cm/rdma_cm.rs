//! rdma_cm's conventions on top of the CM, shared by every frontend that connects the way
//! librdmacm does (librdmacm.so.1, the Rust API): the REQ an `rdma_connect` sends (the
//! rdma_cm IP header first in its private data, the service ID from the port space and
//! port, the flow label from the two ports, softroce's local ACK timeout) and the user's
//! part of a REQ's private data. Pure functions: no I/O, no clock, no QP. How REQ and REP
//! become QP attributes is next to the QP, in `verbs::RcConnect::rdma_cm_passive` /
//! `rdma_cm_active`.
//!
//! Source: kernel `drivers/infiniband/core/cma.c` (`cma_connect_ib`, `cma_format_hdr`,
//! `cma_get_roce_udp_flow_label`, `cma_req_handler` hiding the header from the user);
//! rdma-core `librdmacm/cma.c` (`rdma_connect`'s conn_param defaults).

use super::{CmError, ConnectParams, rdma_cm_flow_label};
use crate::wire::cm::{CmaHdrRepr, ReqRepr, port_space, rdma_cm_service_id};
use core::net::SocketAddr;

/// Length of rdma_cm's IP header (`struct cma_hdr`) at the start of a REQ's (and
/// SIDR_REQ's) private data.
pub const CMA_HDR_LEN: usize = 36;
/// Private data bytes of a REQ (IBTA Vol 1 ch. 12: REQ message).
pub const REQ_PRIVATE_DATA_LEN: usize = 92;
/// Private data bytes of a REP.
pub const REP_PRIVATE_DATA_LEN: usize = 196;
/// Private data bytes of a REJ.
pub const REJ_PRIVATE_DATA_LEN: usize = 148;
/// Most private data an rdma_cm user puts in a REQ: 92 − 36 (librdmacm's
/// `rdma_connect` returns EINVAL beyond it).
pub const RDMA_CM_REQ_USER_DATA_MAX: usize = REQ_PRIVATE_DATA_LEN - CMA_HDR_LEN;
/// The local ACK timeout exponent of an rdma_cm REQ on RoCE: the kernel's
/// `cm_ack_timeout(ack_delay, CMA_IBOE_PACKET_LIFETIME)` with rxe's ACK delay, 17 (4.096 µs ×
/// 2^17 ≈ 537 ms), which the passive side's QP takes as its timeout (kernel `cm.c`
/// `cm_format_req`, `cm_format_path_from_req`). Kernels before 6.2 had a packet lifetime of
/// 18 and say 19 (capture of the interop rig's 6.1 kernel).
pub const RDMA_CM_LOCAL_ACK_TIMEOUT: u8 =
    super::cm_ack_timeout(super::LOCAL_CA_ACK_DELAY, super::CMA_IBOE_PACKET_LIFETIME);
/// RNR NAK timer code rdma_cm gives its RC QPs at RTR: 0, which is the longest, 655.36 ms
/// (kernel `cm.c` `cm_init_qp_rtr_attr`). A peer whose SEND finds no receive posted waits
/// that long per RNR retry (pyverbs' external-QP test posts its receive late and relies on
/// it).
pub const RDMA_CM_MIN_RNR_TIMER: u8 = 0;

impl ConnectParams {
    /// The REQ of an rdma_cm connect from `local` to `remote` in port space `port_space`
    /// (e.g. `wire::cm::port_space::TCP`): service ID `port_space << 16 | remote port`,
    /// private data = the rdma_cm IP header then `user_private_data`, flow label from the
    /// two ports, local ACK timeout [`RDMA_CM_LOCAL_ACK_TIMEOUT`], hop limit 64, and
    /// librdmacm's defaults for a NULL `conn_param`: no responder resources or initiator
    /// depth, 7 retries, 7 RNR retries (forever). The caller adjusts the public fields.
    ///
    /// Errors: [`CmError::PrivateDataTooLong`] for more than
    /// [`RDMA_CM_REQ_USER_DATA_MAX`] bytes of user data (librdmacm: EINVAL).
    pub fn rdma_cm(
        local: SocketAddr,
        remote: SocketAddr,
        port_space: u16,
        local_qpn: u32,
        starting_psn: u32,
        path_mtu: u8,
        user_private_data: &[u8],
    ) -> Result<ConnectParams, CmError> {
        if user_private_data.len() > RDMA_CM_REQ_USER_DATA_MAX {
            return Err(CmError::PrivateDataTooLong {
                given: user_private_data.len(),
                max: RDMA_CM_REQ_USER_DATA_MAX,
            });
        }
        let mut private_data = vec![0u8; CMA_HDR_LEN];
        CmaHdrRepr::new(local.ip(), local.port(), remote.ip()).emit(&mut private_data);
        private_data.extend_from_slice(user_private_data);
        Ok(ConnectParams {
            peer: remote.ip(),
            service_id: rdma_cm_service_id(port_space, remote.port()),
            local_qpn,
            starting_psn,
            responder_resources: 0,
            initiator_depth: 0,
            path_mtu,
            retry_count: 7,
            rnr_retry_count: 7,
            local_ack_timeout: RDMA_CM_LOCAL_ACK_TIMEOUT,
            flow_label: rdma_cm_flow_label(local.port(), remote.port()),
            traffic_class: 0,
            hop_limit: 64,
            srq: false,
            private_data,
        })
    }
}

/// Whether a REQ for `service_id` whose private data starts with the rdma_cm IP header
/// `cma` (`None`: it did not parse, or is not CMA version 0 with IP version 4 or 6) may
/// reach an rdma_cm listener bound to `listen_ip`. Service IDs outside rdma_cm's IP port
/// spaces (TCP, UDP, IPoIB) carry no such header and always may. Otherwise the header must
/// name `listen_ip` as its destination (same IP version, same address); a REQ that fails
/// this finds no listener in the kernel (`cma.c` `cma_save_ip_info`,
/// `cma_match_private_data`), whose ib_cm then destroys the new id and sends REJ 28
/// (consumer defined).
pub fn req_matches_listener(
    service_id: u64,
    cma: Option<&CmaHdrRepr>,
    listen_ip: core::net::IpAddr,
) -> bool {
    let ip_port_space = service_id >> 32 == 0
        && matches!(
            (service_id >> 16) as u16,
            port_space::TCP | port_space::UDP | port_space::IPOIB
        );
    !ip_port_space || cma.and_then(CmaHdrRepr::dst_ip) == Some(listen_ip)
}

/// The user's part of a REQ's private data: what follows the rdma_cm IP header (56 bytes,
/// zero-padded past what the peer gave, as the passive side's CONNECT_REQUEST shows it).
pub fn req_user_private_data(req: &ReqRepr) -> &[u8] {
    &req.private_data[CMA_HDR_LEN..]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::cm::CmaHdr;

    // The kernel CM's arithmetic (cm.c cm_ack_timeout), and what it gives on RoCE: the REQ
    // of a 6.1 kernel says 19 (packet lifetime 18, captured on the interop rig), of later
    // kernels 17 (lifetime 16), softroce's 17. A timeout of 14 (67 ms, softroce's before)
    // retransmitted eight times sooner than rxe under rdma_cm, and a process that the
    // scheduler kept off the CPU for 7 x 67 ms lost its connection to IBV_WC_RETRY_EXC_ERR
    // (fi_pingpong beside the other middleware tests).
    #[test]
    fn the_ack_timeout_is_the_kernel_cms() {
        use crate::cm::{CMA_IBOE_PACKET_LIFETIME, LOCAL_CA_ACK_DELAY, cm_ack_timeout};
        assert_eq!(cm_ack_timeout(15, 18), 19);
        assert_eq!(cm_ack_timeout(15, 16), 17);
        assert_eq!(cm_ack_timeout(0, 16), 17);
        assert_eq!(cm_ack_timeout(16, 15), 17);
        assert_eq!(cm_ack_timeout(20, 10), 20);
        assert_eq!(cm_ack_timeout(20, 18), 21);
        assert_eq!(cm_ack_timeout(31, 31), 31);
        assert_eq!(
            RDMA_CM_LOCAL_ACK_TIMEOUT,
            cm_ack_timeout(LOCAL_CA_ACK_DELAY, CMA_IBOE_PACKET_LIFETIME)
        );
        assert_eq!(RDMA_CM_LOCAL_ACK_TIMEOUT, 17);
        let local: SocketAddr = "127.0.170.1:40000".parse().unwrap();
        let remote: SocketAddr = "127.0.170.2:7471".parse().unwrap();
        let p = ConnectParams::rdma_cm(local, remote, port_space::TCP, 17, 0x123, 3, b"").unwrap();
        assert_eq!(p.local_ack_timeout, 17);
    }

    #[test]
    fn rdma_cm_req_carries_the_cma_header_then_the_user_data() {
        let local: SocketAddr = "127.0.170.1:40000".parse().unwrap();
        let remote: SocketAddr = "127.0.170.2:7471".parse().unwrap();
        let p =
            ConnectParams::rdma_cm(local, remote, port_space::TCP, 17, 0x123, 3, b"hi").unwrap();
        assert_eq!(p.service_id, 0x0106_1d2f);
        assert_eq!(p.private_data.len(), CMA_HDR_LEN + 2);
        let h = CmaHdrRepr::parse(&CmaHdr::new_checked(&p.private_data[..]).unwrap());
        assert_eq!((h.src_ip(), h.port), (Some(local.ip()), 40000));
        assert_eq!(&p.private_data[CMA_HDR_LEN..], b"hi");
        assert_eq!(p.flow_label, rdma_cm_flow_label(40000, 7471));
        let long = [0u8; RDMA_CM_REQ_USER_DATA_MAX + 1];
        assert_eq!(
            ConnectParams::rdma_cm(local, remote, port_space::TCP, 17, 0, 3, &long),
            Err(CmError::PrivateDataTooLong { given: 57, max: 56 })
        );
    }

    // kernel cma_match_private_data: a listener bound to an address takes only REQs whose
    // rdma_cm header names that address, in its IP version.
    #[test]
    fn req_matches_a_listener_only_through_a_valid_header_naming_its_address() {
        let me: core::net::IpAddr = "127.0.190.2".parse().unwrap();
        let other: core::net::IpAddr = "127.0.190.9".parse().unwrap();
        let tcp = rdma_cm_service_id(port_space::TCP, 7000);
        let good = CmaHdrRepr::new(other, 40000, me);
        assert!(req_matches_listener(tcp, Some(&good), me));
        assert!(!req_matches_listener(tcp, Some(&good), other));
        assert!(!req_matches_listener(tcp, None, me));
        let mut v6 = good;
        v6.ip_version = 6;
        assert!(!req_matches_listener(tcp, Some(&v6), me));
        // Native IB service IDs carry no rdma_cm header.
        assert!(req_matches_listener(0x1234_5678_9abc, None, me));
        assert!(req_matches_listener(
            rdma_cm_service_id(port_space::IB, 1),
            None,
            me
        ));
    }
}
