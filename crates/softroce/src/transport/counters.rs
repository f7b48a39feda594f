//! Counters, named as kernel rxe's hw_counters (`rxe_hw_counters.c`), plus one counter per
//! drop reason so that no dropped packet goes uncounted.

use crate::wire;

/// Why a received packet was dropped without being executed.
///
/// Source: the silent drops of rxe `rxe_recv.c` and `rxe_resp.c`/`rxe_comp.c`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DropReason {
    /// Shorter than its headers, pad and ICRC.
    Truncated,
    /// BTH TVer ≠ 0.
    BadTver,
    /// Reserved or unsupported opcode.
    UnknownOpcode,
    /// Pad count does not fit.
    BadPadCount,
    /// Length does not match the opcode.
    LengthMismatch,
    /// ICRC mismatch.
    IcrcMismatch,
    /// Not IPv4/IPv6 + UDP.
    BadFraming,
    /// Destination QPN unknown (or 0).
    UnknownQp,
    /// The opcode's transport does not match the QP type.
    WrongQpType,
    /// QP state does not accept this packet (e.g. a request before RTR).
    WrongQpState,
    /// P_Key is not the default partition.
    BadPkey,
    /// Source address (or, for a datagram from a multicast group socket, destination
    /// address) does not match the connected QP's path (rxe `check_addr`).
    WrongSource,
    /// Request PSN beyond the expected one after the NAK was sent (rxe drops silently).
    OutOfSequence,
    /// A response (ACK, READ response, ATOMIC ACK) that matches no outstanding request.
    UnexpectedResponse,
    /// A response with a length that does not fit the request.
    BadResponseLength,
    /// A duplicate request that cannot be replayed.
    StaleDuplicate,
    /// A datagram that arrived while the device had no room for it.
    NoResources,
    /// UC: a packet of a message that is being dropped (a PSN gap, no receive WQE, or a
    /// failed check; UC never NAKs), or a MIDDLE/LAST whose FIRST was lost.
    UcMessageDropped,
    /// UD: the DETH Q_Key is not the QP's.
    BadQkey,
    /// UD: no receive WQE posted (UD drops, never RNR-NAKs).
    UdNoReceive,
    /// UD: the receive WQE is too short for the 40-byte GRH and the payload (dropped, the
    /// receive stays posted; rxe `rxe_resp_check_length`, class D).
    UdReceiveTooShort,
}

impl DropReason {
    /// Every reason, for reports.
    pub const ALL: [DropReason; 21] = [
        DropReason::Truncated,
        DropReason::BadTver,
        DropReason::UnknownOpcode,
        DropReason::BadPadCount,
        DropReason::LengthMismatch,
        DropReason::IcrcMismatch,
        DropReason::BadFraming,
        DropReason::UnknownQp,
        DropReason::WrongQpType,
        DropReason::WrongQpState,
        DropReason::BadPkey,
        DropReason::WrongSource,
        DropReason::OutOfSequence,
        DropReason::UnexpectedResponse,
        DropReason::BadResponseLength,
        DropReason::StaleDuplicate,
        DropReason::NoResources,
        DropReason::UcMessageDropped,
        DropReason::BadQkey,
        DropReason::UdNoReceive,
        DropReason::UdReceiveTooShort,
    ];

    /// True when a packet dropped for this reason never reaches `rcvd_pkts`: it failed a
    /// check that rxe `rxe_rcv` makes before counting (`hdr_check`: the BTH and headers
    /// fit, known opcode, TVer, DestQP, `check_type_state`, `check_addr`, `check_keys` for
    /// the P_Key and the UD Q_Key; then the ICRC), or one of softroce's own framing checks.
    /// The other reasons are decided later, by the responder or the completer, after the
    /// packet was counted, as in rxe. Source: rxe `rxe_recv.c`.
    pub const fn precedes_rcvd_pkts(self) -> bool {
        matches!(
            self,
            DropReason::Truncated
                | DropReason::BadTver
                | DropReason::UnknownOpcode
                | DropReason::BadPadCount
                | DropReason::LengthMismatch
                | DropReason::IcrcMismatch
                | DropReason::BadFraming
                | DropReason::UnknownQp
                | DropReason::WrongQpType
                | DropReason::WrongQpState
                | DropReason::BadPkey
                | DropReason::WrongSource
                | DropReason::BadQkey
        )
    }

    /// snake_case name for reports.
    pub const fn name(self) -> &'static str {
        match self {
            DropReason::Truncated => "truncated",
            DropReason::BadTver => "bad_tver",
            DropReason::UnknownOpcode => "unknown_opcode",
            DropReason::BadPadCount => "bad_pad_count",
            DropReason::LengthMismatch => "length_mismatch",
            DropReason::IcrcMismatch => "icrc_errors",
            DropReason::BadFraming => "bad_framing",
            DropReason::UnknownQp => "unknown_qp",
            DropReason::WrongQpType => "wrong_qp_type",
            DropReason::WrongQpState => "wrong_qp_state",
            DropReason::BadPkey => "bad_pkey",
            DropReason::WrongSource => "wrong_source",
            DropReason::OutOfSequence => "out_of_sequence_dropped",
            DropReason::UnexpectedResponse => "unexpected_response",
            DropReason::BadResponseLength => "bad_response_length",
            DropReason::StaleDuplicate => "stale_duplicate",
            DropReason::NoResources => "no_resources",
            DropReason::UcMessageDropped => "uc_message_dropped",
            DropReason::BadQkey => "bad_qkey",
            DropReason::UdNoReceive => "ud_no_receive",
            DropReason::UdReceiveTooShort => "ud_receive_too_short",
        }
    }
}

impl From<wire::Error> for DropReason {
    fn from(e: wire::Error) -> DropReason {
        match e {
            wire::Error::Truncated => DropReason::Truncated,
            wire::Error::BadTver(_) => DropReason::BadTver,
            wire::Error::UnknownOpcode(_) => DropReason::UnknownOpcode,
            wire::Error::BadPadCount => DropReason::BadPadCount,
            wire::Error::LengthMismatch => DropReason::LengthMismatch,
            wire::Error::IcrcMismatch => DropReason::IcrcMismatch,
            wire::Error::BadFraming => DropReason::BadFraming,
        }
    }
}

/// Packet and event counters of a device or a QP. Field names are rxe's hw_counters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counters {
    /// Packets sent.
    pub sent_pkts: u64,
    /// Packets received and accepted past the header checks.
    pub rcvd_pkts: u64,
    /// Duplicate requests seen by the responder.
    pub duplicate_request: u64,
    /// Requests beyond the expected PSN (once per gap, when the NAK is sent).
    pub out_of_seq_request: u64,
    /// RNR NAKs received by the requester.
    pub rcvd_rnr_err: u64,
    /// RNR NAKs sent by the responder.
    pub send_rnr_err: u64,
    /// PSN sequence error NAKs received by the requester.
    pub rcvd_seq_err: u64,
    /// ACK requests answered later (coalesced).
    pub ack_deferred: u64,
    /// Work requests failed with `IBV_WC_RETRY_EXC_ERR`.
    pub retry_exceeded_err: u64,
    /// Work requests failed with `IBV_WC_RNR_RETRY_EXC_ERR`.
    pub retry_rnr_exceeded_err: u64,
    /// Retries started, by retransmit timeout or by NAK (rxe `RXE_CNT_COMP_RETRY`).
    pub completer_retry_err: u64,
    /// Request packets sent again after a retry rewound the requester (go-back-N). Not an rxe
    /// counter; listed after rxe's.
    pub retransmitted_pkts: u64,
    /// Packets that could not be sent.
    pub send_err: u64,
    /// Times the link went down.
    pub link_downed: u64,
    /// SEND messages completed at the requester.
    pub rdma_sends: u64,
    /// Receive WQEs completed at the responder.
    pub rdma_recvs: u64,
    /// Drops by reason, indexed like [`DropReason::ALL`].
    pub drops: [u64; DropReason::ALL.len()],
}

impl Counters {
    /// Counts one dropped packet.
    pub fn drop_packet(&mut self, why: DropReason) {
        tracing::debug!(target: "softroce::drop", reason = why.name(), "packet dropped");
        if let Some(i) = DropReason::ALL.iter().position(|r| *r == why) {
            self.drops[i] += 1;
        }
    }

    /// Drops counted for one reason.
    pub fn dropped(&self, why: DropReason) -> u64 {
        DropReason::ALL
            .iter()
            .position(|r| *r == why)
            .map_or(0, |i| self.drops[i])
    }

    /// Total drops.
    pub fn dropped_total(&self) -> u64 {
        self.drops.iter().sum()
    }

    /// Adds `other` into `self`.
    pub fn add(&mut self, o: &Counters) {
        self.sent_pkts += o.sent_pkts;
        self.rcvd_pkts += o.rcvd_pkts;
        self.duplicate_request += o.duplicate_request;
        self.out_of_seq_request += o.out_of_seq_request;
        self.rcvd_rnr_err += o.rcvd_rnr_err;
        self.send_rnr_err += o.send_rnr_err;
        self.rcvd_seq_err += o.rcvd_seq_err;
        self.ack_deferred += o.ack_deferred;
        self.retry_exceeded_err += o.retry_exceeded_err;
        self.retry_rnr_exceeded_err += o.retry_rnr_exceeded_err;
        self.completer_retry_err += o.completer_retry_err;
        self.retransmitted_pkts += o.retransmitted_pkts;
        self.send_err += o.send_err;
        self.link_downed += o.link_downed;
        self.rdma_sends += o.rdma_sends;
        self.rdma_recvs += o.rdma_recvs;
        for (a, b) in self.drops.iter_mut().zip(o.drops.iter()) {
            *a += b;
        }
    }

    /// `(name, value)` pairs in rxe's order, then the drop reasons.
    pub fn entries(&self) -> Vec<(&'static str, u64)> {
        let mut v = vec![
            ("sent_pkts", self.sent_pkts),
            ("rcvd_pkts", self.rcvd_pkts),
            ("duplicate_request", self.duplicate_request),
            ("out_of_seq_request", self.out_of_seq_request),
            ("rcvd_rnr_err", self.rcvd_rnr_err),
            ("send_rnr_err", self.send_rnr_err),
            ("rcvd_seq_err", self.rcvd_seq_err),
            ("ack_deferred", self.ack_deferred),
            ("retry_exceeded_err", self.retry_exceeded_err),
            ("retry_rnr_exceeded_err", self.retry_rnr_exceeded_err),
            ("completer_retry_err", self.completer_retry_err),
            ("send_err", self.send_err),
            ("link_downed", self.link_downed),
            ("rdma_sends", self.rdma_sends),
            ("rdma_recvs", self.rdma_recvs),
            ("retransmitted_pkts", self.retransmitted_pkts),
        ];
        for (r, n) in DropReason::ALL.iter().zip(self.drops.iter()) {
            v.push((r.name(), *n));
        }
        v
    }
}
