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
    /// How many counters there are: rxe's 16 ([`Counters::entries`]' first ones) and one per
    /// [`DropReason`].
    pub const LEN: usize = 16 + DropReason::ALL.len();

    /// The counters' names, in the order of [`Counters::values`] and [`Counters::entries`].
    pub const NAMES: [&'static str; Counters::LEN] = {
        let rxe = [
            "sent_pkts",
            "rcvd_pkts",
            "duplicate_request",
            "out_of_seq_request",
            "rcvd_rnr_err",
            "send_rnr_err",
            "rcvd_seq_err",
            "ack_deferred",
            "retry_exceeded_err",
            "retry_rnr_exceeded_err",
            "completer_retry_err",
            "send_err",
            "link_downed",
            "rdma_sends",
            "rdma_recvs",
            "retransmitted_pkts",
        ];
        let mut names = [""; Counters::LEN];
        let mut i = 0;
        while i < rxe.len() {
            names[i] = rxe[i];
            i += 1;
        }
        let mut d = 0;
        while d < DropReason::ALL.len() {
            names[rxe.len() + d] = DropReason::ALL[d].name();
            d += 1;
        }
        names
    };

    /// Counts one dropped packet.
    pub fn drop_packet(&mut self, why: DropReason) {
        tracing::debug!(target: "softroce::drop", reason = why.name(), "packet dropped");
        self.count_drop(why);
    }

    /// Counts one dropped packet, as [`Counters::drop_packet`] without its trace event (for
    /// a shared device's keeper, a forked process that may take no lock of the program's,
    /// `tracing`'s included).
    pub fn count_drop(&mut self, why: DropReason) {
        if let Some(i) = DropReason::ALL.iter().position(|r| *r == why) {
            self.drops[i] += 1;
        }
    }

    /// Every counter's value, in the order of [`Counters::NAMES`].
    pub fn values(&self) -> [u64; Counters::LEN] {
        let rxe = [
            self.sent_pkts,
            self.rcvd_pkts,
            self.duplicate_request,
            self.out_of_seq_request,
            self.rcvd_rnr_err,
            self.send_rnr_err,
            self.rcvd_seq_err,
            self.ack_deferred,
            self.retry_exceeded_err,
            self.retry_rnr_exceeded_err,
            self.completer_retry_err,
            self.send_err,
            self.link_downed,
            self.rdma_sends,
            self.rdma_recvs,
            self.retransmitted_pkts,
        ];
        let mut v = [0u64; Counters::LEN];
        v[..rxe.len()].copy_from_slice(&rxe);
        v[rxe.len()..].copy_from_slice(&self.drops);
        v
    }

    /// The counters whose values, in the order of [`Counters::NAMES`], are `v`.
    pub fn from_values(v: &[u64; Counters::LEN]) -> Counters {
        let mut drops = [0u64; DropReason::ALL.len()];
        drops.copy_from_slice(&v[16..]);
        Counters {
            sent_pkts: v[0],
            rcvd_pkts: v[1],
            duplicate_request: v[2],
            out_of_seq_request: v[3],
            rcvd_rnr_err: v[4],
            send_rnr_err: v[5],
            rcvd_seq_err: v[6],
            ack_deferred: v[7],
            retry_exceeded_err: v[8],
            retry_rnr_exceeded_err: v[9],
            completer_retry_err: v[10],
            send_err: v[11],
            link_downed: v[12],
            rdma_sends: v[13],
            rdma_recvs: v[14],
            retransmitted_pkts: v[15],
            drops,
        }
    }

    /// Calls `grew(i, n)` for each counter `i` (in the order of [`Counters::NAMES`]) that
    /// grew by `n` since `published`, these counters as they were when last handed on, and
    /// makes `published` these counters. For the part of a shared device's counters a
    /// process adds to the device's shared memory (`verbs::SharedCounters`), on the data
    /// path: straight-line compares, no copy when nothing moved. Counters only grow; one
    /// below its published value gives the wrapped difference, never a panic.
    pub fn hand_on_growth(&self, published: &mut Counters, mut grew: impl FnMut(usize, u64)) {
        let mut field = |i: usize, now: u64, old: &mut u64| {
            if now != *old {
                grew(i, now.wrapping_sub(*old));
                *old = now;
            }
        };
        field(0, self.sent_pkts, &mut published.sent_pkts);
        field(1, self.rcvd_pkts, &mut published.rcvd_pkts);
        field(2, self.duplicate_request, &mut published.duplicate_request);
        field(
            3,
            self.out_of_seq_request,
            &mut published.out_of_seq_request,
        );
        field(4, self.rcvd_rnr_err, &mut published.rcvd_rnr_err);
        field(5, self.send_rnr_err, &mut published.send_rnr_err);
        field(6, self.rcvd_seq_err, &mut published.rcvd_seq_err);
        field(7, self.ack_deferred, &mut published.ack_deferred);
        field(
            8,
            self.retry_exceeded_err,
            &mut published.retry_exceeded_err,
        );
        field(
            9,
            self.retry_rnr_exceeded_err,
            &mut published.retry_rnr_exceeded_err,
        );
        field(
            10,
            self.completer_retry_err,
            &mut published.completer_retry_err,
        );
        field(11, self.send_err, &mut published.send_err);
        field(12, self.link_downed, &mut published.link_downed);
        field(13, self.rdma_sends, &mut published.rdma_sends);
        field(14, self.rdma_recvs, &mut published.rdma_recvs);
        field(
            15,
            self.retransmitted_pkts,
            &mut published.retransmitted_pkts,
        );
        if self.drops != published.drops {
            for (d, (now, old)) in self
                .drops
                .iter()
                .zip(published.drops.iter_mut())
                .enumerate()
            {
                field(16 + d, *now, old);
            }
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

    /// `(name, value)` pairs in rxe's order, then the drop reasons ([`Counters::NAMES`]).
    pub fn entries(&self) -> Vec<(&'static str, u64)> {
        Counters::NAMES.into_iter().zip(self.values()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn numbered() -> Counters {
        let mut v = [0u64; Counters::LEN];
        for (i, x) in v.iter_mut().enumerate() {
            *x = 100 + i as u64;
        }
        Counters::from_values(&v)
    }

    #[test]
    fn values_follow_the_names_and_come_back() {
        let c = numbered();
        assert_eq!(Counters::from_values(&c.values()), c);
        assert_eq!(
            (c.sent_pkts, c.rcvd_pkts, c.retransmitted_pkts),
            (100, 101, 115)
        );
        assert_eq!(c.dropped(DropReason::Truncated), 116);
        assert_eq!(c.dropped(DropReason::UdReceiveTooShort), 100 + 36);
        let e = c.entries();
        assert_eq!(e.len(), Counters::LEN);
        assert_eq!(e[0], ("sent_pkts", 100));
        assert_eq!(e[11], ("send_err", 111));
        assert_eq!(e[15], ("retransmitted_pkts", 115));
        assert_eq!(e[16 + 5], ("icrc_errors", 121));
        let mut names = Counters::NAMES.to_vec();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), Counters::LEN, "names are distinct");
    }

    #[test]
    fn hand_on_growth_gives_what_grew_once() {
        let grown = |c: &Counters, published: &mut Counters| {
            let mut v = Vec::new();
            c.hand_on_growth(published, |i, n| v.push((Counters::NAMES[i], n)));
            v
        };
        let mut published = Counters::default();
        let mut c = Counters::default();
        assert_eq!(grown(&c, &mut published), []);
        c.sent_pkts = 3;
        c.retransmitted_pkts = 1;
        c.count_drop(DropReason::BadQkey);
        assert_eq!(
            grown(&c, &mut published),
            [("sent_pkts", 3), ("retransmitted_pkts", 1), ("bad_qkey", 1)]
        );
        assert_eq!(published, c);
        assert_eq!(grown(&c, &mut published), [], "nothing new");
        c.sent_pkts += 2;
        assert_eq!(grown(&c, &mut published), [("sent_pkts", 2)]);
        // Every counter has its index.
        let every = numbered();
        let mut seen = [0u64; Counters::LEN];
        every.hand_on_growth(&mut Counters::default(), |i, n| seen[i] = n);
        assert_eq!(seen, every.values());
    }
}
