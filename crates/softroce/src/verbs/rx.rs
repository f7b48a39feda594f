//! The receive path, as rxe `rxe_recv.c`: parse the datagram, find the QP by dest QPN (or the
//! multicast group's members), check the ICRC, dispatch to the QP's engine (with its SRQ),
//! then pump the QP. Every packet dropped on the way is counted by reason, never NAKed.

use super::base::{Device, MULTICAST_QPN, State};
use super::event::{AsyncEvents, EventElement, EventType};
use crate::transport::{DropReason, Instant};
use crate::wire::ip_udp::{LinkType, parse_frame};
use crate::wire::{
    Gid, IcrcIp, OpKind, ROCE_V2_UDP_PORT, RocePacket, icrc_compute, solve_ipv4_ident,
};
use std::net::{IpAddr, SocketAddr};

/// What the receiver saw of the outer IP and UDP headers of a datagram, which the ICRC covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RxHeaders<'a> {
    /// A plain UDP socket: source and destination addresses and ports are known, the rest of
    /// the IP header is not. IPv6 needs nothing else (traffic class, flow label and hop limit
    /// are masked), so its check is exact. An IPv4 header also carries the Identification
    /// field, which the ICRC covers and which rxe and NICs fill with a non-zero counter; the
    /// check assumes DF set and accepts the packet when some 16-bit ID makes the ICRC valid
    /// ([`solve_ipv4_ident`]).
    ///
    /// Measured false-accept rate (`examples/icrc_false_accept.rs`, corruptions of the UDP
    /// payload of four packet shapes): 272 of 17,779,299 randomly corrupted packets accepted,
    /// 1.53e-5 = 2^-16, about the same for 2 random bits, 3–8 bits, bursts of 2–32 and 33–128
    /// bits, 1–8 random bytes and all-random payloads; none of 41,984 single-bit flips; the
    /// exact check accepted none of them. README.md ("How it is built") has the table.
    Udp,
    /// A plain UDP socket, for segment `index` of a UDP GRO buffer: as [`RxHeaders::Udp`],
    /// but an IPv4 check also tries ID `index` before solving, the ID Linux gives segment
    /// `index` of a UDP GSO send from an unconnected `IP_PMTUDISC_DO` socket.
    UdpGro {
        /// The segment's position in its GRO buffer.
        index: usize,
    },
    /// The IP and UDP headers exactly as received (raw socket): the ICRC is checked over them,
    /// as kernel rxe does.
    Exact {
        /// IPv4 (20 bytes, no options) or IPv6 (40 bytes) header as received.
        ip_header: &'a [u8],
        /// The 8-byte UDP header as received.
        udp_header: &'a [u8],
    },
}

impl Device {
    /// Feeds one UDP datagram received on a plain UDP socket (sent from `src` to this device's
    /// port 4791). Parses it, finds the QP, checks the ICRC, runs the engine, delivers
    /// completions and sends what the engine answers. Malformed, unknown-QP or bad-ICRC packets
    /// are dropped and counted by reason (never NAKed), as rxe `rxe_rcv` does.
    ///
    /// The socket hides the IP header, so the ICRC is checked over the header the sender must
    /// have written: exact for IPv6; for IPv4 first with ID 0 (what softroce sends), then by
    /// solving for the 16-bit ID (see [`solve_ipv4_ident`] and [`RxHeaders::Udp`]).
    pub fn handle_datagram(&self, src: SocketAddr, data: &[u8]) {
        self.handle_received(src, self.shared.cfg.ip, data, RxHeaders::Udp);
    }

    /// Feeds one UDP datagram received on a socket bound to the multicast address `group`
    /// (port 4791), which the link joined for [`Qp::attach_mcast`](super::Qp::attach_mcast).
    /// A packet with DestQP 0xFFFFFF is delivered to every QP of this device attached to
    /// `group`, each checking the Q_Key itself (a mismatch is that QP's `BadQkey` drop); with
    /// no QP attached it is an `UnknownQp` drop. Any other DestQP is handled as by [`Device::handle_datagram`].
    /// The ICRC is checked once, over the header with `group` as destination.
    /// Source: rxe `rxe_recv.c` `rxe_rcv_mcast_pkt`.
    pub fn handle_multicast_datagram(&self, src: SocketAddr, group: IpAddr, data: &[u8]) {
        self.handle_received(src, group, data, RxHeaders::Udp);
    }

    /// Feeds datagram number `index` of a UDP GRO buffer received from `src`: as
    /// [`Device::handle_datagram`], with the IPv4 ID guess of [`RxHeaders::UdpGro`].
    pub fn handle_gro_segment(&self, src: SocketAddr, data: &[u8], index: usize) {
        self.handle_received(src, self.shared.cfg.ip, data, RxHeaders::UdpGro { index });
    }

    /// Feeds one whole IP packet (IPv4 or IPv6, then UDP, then the RoCEv2 datagram) received
    /// on a raw socket, and checks the ICRC over its IP and UDP headers exactly as received
    /// ([`RxHeaders::Exact`]). A packet whose framing does not parse, or that is not UDP to
    /// this device's address and port 4791, is dropped and counted as
    /// [`DropReason::BadFraming`]; the rest is as [`Device::handle_datagram`].
    pub fn handle_ip_packet(&self, packet: &[u8]) {
        match parse_frame(packet, LinkType::RawIp) {
            Ok(d) if d.dst == self.shared.cfg.ip && d.dst_port == ROCE_V2_UDP_PORT => {
                let hdrs = RxHeaders::Exact {
                    ip_header: d.ip_header,
                    udp_header: d.udp_header,
                };
                let src = SocketAddr::new(d.src, d.src_port);
                self.handle_received(src, d.dst, d.payload, hdrs);
            }
            _ => {
                let mut st = self.shared.state.lock();
                st.counters.drop_packet(DropReason::BadFraming);
                self.publish_device_counters(&mut st);
            }
        }
    }

    /// One datagram: a batch of one ([`Device::rx_batch`]), so the QP answers at once.
    fn handle_received(&self, src: SocketAddr, dst: IpAddr, data: &[u8], hdrs: RxHeaders<'_>) {
        self.rx_batch().receive(src, dst, data, hdrs);
    }

    /// Starts a receive batch: the datagrams fed to the returned [`RxBatch`] are handled
    /// under one hold of the device lock, and each QP they reached sends its answers once,
    /// when the batch is dropped. An RC responder's ACKs for the batch then coalesce into
    /// the newest one (ACKs are cumulative, IBTA Vol 1 §9.7.5.1.2; counted in
    /// `ack_deferred`), and a requester sends what the batch's ACKs opened in one run. For a
    /// driver that receives many datagrams per system call (`recvmmsg`, UDP GRO).
    pub fn rx_batch(&self) -> RxBatch<'_> {
        RxBatch {
            now: self.now(),
            st: self.shared.state.lock(),
            dev: self,
            touched: Vec::new(),
        }
    }

    /// Checks and executes one received datagram under the device lock; returns the QP
    /// that must now send its answers and completions ([`Device::pump`]), if any.
    fn receive_locked(
        &self,
        st: &mut State,
        now: Instant,
        src: SocketAddr,
        dst: IpAddr,
        data: &[u8],
        hdrs: RxHeaders<'_>,
    ) -> Option<u32> {
        let pkt = match RocePacket::parse(data) {
            Ok(p) => p,
            Err(e) => {
                st.counters.drop_packet(DropReason::from(e));
                return None;
            }
        };
        if pkt.info.kind == OpKind::Cnp {
            // A CNP asks the sender of an ECN-marked flow to slow down (DCQCN reaction
            // point). softroce implements no rate control: counted as ignored, like mlx5's
            // `rp_cnp_ignored`, once its ICRC holds; a bad one is an ICRC drop.
            if self.icrc_ok(&pkt, src, dst, hdrs) {
                st.rp_cnp_ignored += 1;
            } else {
                st.counters.drop_packet(DropReason::IcrcMismatch);
            }
            return None;
        }
        let qpn = pkt.repr.bth.dest_qpn;
        if qpn == MULTICAST_QPN && dst.is_multicast() {
            self.deliver_multicast(st, now, &pkt, src, dst, hdrs);
            return None;
        }
        if !st.qps.contains_key(&qpn) {
            st.counters.drop_packet(DropReason::UnknownQp);
            return None;
        }
        // IBTA A17 (RoCEv2): a packet whose ICRC fails is dropped silently; never NAKed.
        if !self.icrc_ok(&pkt, src, dst, hdrs) {
            st.counters.drop_packet(DropReason::IcrcMismatch);
            return None;
        }
        // A datagram that reached a multicast group's socket but names a QP: `dst` is the
        // group, which a connected QP refuses (rxe `check_addr`).
        let to = (dst != self.shared.cfg.ip).then_some(dst);
        handle_packet(st, qpn, now, &pkt, src.ip(), to, &self.shared.events);
        Some(qpn)
    }

    /// A multicast packet: to every QP attached to `group`, after one ICRC check.
    fn deliver_multicast(
        &self,
        st: &mut State,
        now: Instant,
        pkt: &RocePacket<'_>,
        src: SocketAddr,
        group: IpAddr,
        hdrs: RxHeaders<'_>,
    ) {
        let members = st.mcast.get(&group).cloned().unwrap_or_default();
        if members.is_empty() {
            st.counters.drop_packet(DropReason::UnknownQp);
            return;
        }
        if !self.icrc_ok(pkt, src, group, hdrs) {
            st.counters.drop_packet(DropReason::IcrcMismatch);
            return;
        }
        // rxe `rxe_rcv`: a multicast packet is counted in `rcvd_pkts` once, after the ICRC
        // and before it is copied to each member (whose type, state and Q_Key checks then
        // drop it per QP); the members' engines do not count it again.
        st.counters.rcvd_pkts += 1;
        self.publish_device_counters(st);
        for qpn in members {
            // The same receive path as a unicast datagram: a member on an SRQ is lent the
            // SRQ's head WR (rxe `rxe_rcv_mcast_pkt` -> `rxe_rcv_pkt` -> `get_srq_wqe`).
            let ev = &self.shared.events;
            handle_packet(st, qpn, now, pkt, src.ip(), Some(group), ev);
            self.pump(st, qpn, now);
        }
    }

    /// The receive-side ICRC check of `pkt`, sent from `src` to `dst` (this device's
    /// address, or a multicast group), for what the receiver saw of the outer headers.
    fn icrc_ok(
        &self,
        pkt: &RocePacket<'_>,
        src: SocketAddr,
        dst: IpAddr,
        hdrs: RxHeaders<'_>,
    ) -> bool {
        if cfg!(fuzzing) {
            return true;
        }
        match hdrs {
            RxHeaders::Exact {
                ip_header,
                udp_header,
            } => icrc_compute(ip_header, udp_header, pkt.body) == pkt.icrc,
            RxHeaders::Udp | RxHeaders::UdpGro { .. } => {
                let ip = match (src.ip(), dst) {
                    (IpAddr::V4(s), IpAddr::V4(d)) => IcrcIp::V4 {
                        src: s,
                        dst: d,
                        ident: 0,
                        src_port: src.port(),
                        dst_port: ROCE_V2_UDP_PORT,
                    },
                    (s, d) => IcrcIp::V6 {
                        src: Gid::from_ip(s).ipv6(),
                        dst: Gid::from_ip(d).ipv6(),
                        src_port: src.port(),
                        dst_port: ROCE_V2_UDP_PORT,
                    },
                };
                // Our own senders write IPv4 ID 0; kernel rxe and NICs write a counter that a
                // UDP socket cannot see, which is recovered by CRC linearity.
                // Segment i of a GSO send carries ID i.
                let gro_ident = match (hdrs, ip) {
                    (RxHeaders::UdpGro { index }, IcrcIp::V4 { .. }) => {
                        u16::try_from(index).ok().filter(|i| *i != 0)
                    }
                    _ => None,
                };
                // Segment i >= 1 of a GRO buffer is checked for its ID first: one CRC pass.
                gro_ident.is_some_and(|ident| match ip {
                    IcrcIp::V4 {
                        src,
                        dst,
                        src_port,
                        dst_port,
                        ..
                    } => pkt.icrc_ok(&IcrcIp::V4 {
                        src,
                        dst,
                        ident,
                        src_port,
                        dst_port,
                    }),
                    IcrcIp::V6 { .. } => false,
                }) || pkt.icrc_ok(&ip)
                    || (matches!(ip, IcrcIp::V4 { .. })
                        && solve_ipv4_ident(&ip, pkt.body, pkt.icrc).is_some())
            }
        }
    }
}

/// A batch of received datagrams handled under one hold of the device lock
/// ([`Device::rx_batch`]). Dropping it sends every answer the batch caused, once per QP, and
/// delivers the completions; the device's other users (posting threads, timers) wait until
/// then.
pub struct RxBatch<'a> {
    dev: &'a Device,
    st: parking_lot::MutexGuard<'a, State>,
    now: Instant,
    /// QPs reached, in first-reached order, each once.
    touched: Vec<u32>,
}

impl RxBatch<'_> {
    /// Feeds one UDP datagram, as [`Device::handle_datagram`] does, except that the QP's
    /// answers wait for the end of the batch.
    pub fn datagram(&mut self, src: SocketAddr, data: &[u8]) {
        let ip = self.dev.shared.cfg.ip;
        self.receive(src, ip, data, RxHeaders::Udp);
    }

    /// Feeds datagram number `index` of a UDP GRO buffer, as
    /// [`Device::handle_gro_segment`] does, except that the answers wait for the batch's end.
    pub fn gro_segment(&mut self, src: SocketAddr, data: &[u8], index: usize) {
        let ip = self.dev.shared.cfg.ip;
        self.receive(src, ip, data, RxHeaders::UdpGro { index });
    }

    fn receive(&mut self, src: SocketAddr, dst: IpAddr, data: &[u8], hdrs: RxHeaders<'_>) {
        let RxBatch {
            dev,
            st,
            now,
            touched,
            ..
        } = self;
        if let Some(qpn) = dev.receive_locked(st, *now, src, dst, data, hdrs)
            && !touched.contains(&qpn)
        {
            touched.push(qpn);
        }
    }
}

impl Drop for RxBatch<'_> {
    fn drop(&mut self) {
        // The batch's drops (and its multicast packets) are the device's own counts; the
        // QPs' are added as each is pumped.
        self.dev.publish_device_counters(&mut self.st);
        for qpn in core::mem::take(&mut self.touched) {
            self.dev.pump(&mut self.st, qpn, self.now);
        }
    }
}

impl core::fmt::Debug for RxBatch<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("RxBatch")
            .field("touched", &self.touched)
            .finish_non_exhaustive()
    }
}

/// Runs QP `qpn`'s engine on `pkt`. A QP attached to an SRQ gets the SRQ as an input, its
/// responder taking receive WQEs from it; when that undercuts the SRQ's armed limit,
/// `IBV_EVENT_SRQ_LIMIT_REACHED` is raised. `dst` is the destination address when it is not
/// the device's own (a datagram to a multicast group's socket).
fn handle_packet(
    st: &mut State,
    qpn: u32,
    now: Instant,
    pkt: &RocePacket<'_>,
    src: IpAddr,
    dst: Option<IpAddr>,
    events: &AsyncEvents,
) {
    let State { mrs, qps, srqs, .. } = st;
    let Some(slot) = qps.get_mut(&qpn) else {
        return;
    };
    let srq = slot.engine.uses_srq().then(|| srqs.queue_of(qpn)).flatten();
    match (srq, dst) {
        (Some((srq_num, queue)), _) => {
            slot.engine
                .handle_packet_srq(now, pkt, src, dst, mrs, queue);
            if queue.poll_limit_reached() {
                events.push(EventType::SrqLimitReached, EventElement::Srq(srq_num));
            }
        }
        (None, Some(d)) => slot.engine.handle_packet_to(now, pkt, src, d, mrs),
        (None, None) => slot.engine.handle_packet(now, pkt, src, mrs),
    }
}
