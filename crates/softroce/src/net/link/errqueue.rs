//! What [`UdpLink`] reads from its send sockets' error queues (`IP_RECVERR`): the ICMP
//! errors of QP1's datagrams go to the CM, a QP's are logged.

use super::UdpLink;
use super::sockets::gsi_source_port;
use std::io;
use std::net::IpAddr;

/// Most peer addresses [`UdpLink`] keeps for the CM between two [`Link::poll_unreachable`].
pub(super) const UNREACHABLE_MAX: usize = 64;

impl UdpLink {
    /// Reads the ICMP errors queued on the send sockets of source port `port`: QP1's go to
    /// the CM ([`UdpLink::take_icmp_errors`]); a QP's are logged, at `warn` the first time
    /// for a peer (an RC QP whose peer address has no RoCE device retries, then fails with
    /// `IBV_WC_RETRY_EXC_ERR`: the log says why), at `debug` after that.
    pub(super) fn take_icmp_errors_of(&self, port: u16) {
        if port == gsi_source_port() {
            self.take_icmp_errors();
            return;
        }
        let Some(socks) = self.send.lock().get(&port).cloned() else {
            return;
        };
        let mut errs = super::super::icmp::drain(&socks.plain, UNREACHABLE_MAX);
        if let Some(Some(g)) = socks.gso.get() {
            errs.extend(super::super::icmp::drain(g, UNREACHABLE_MAX));
        }
        for e in errs {
            let first = {
                let mut told = self.told_unreachable.lock();
                let new = !told.contains(&e.dst.ip());
                if new {
                    if told.len() == UNREACHABLE_MAX {
                        told.remove(0);
                    }
                    told.push(e.dst.ip());
                }
                new
            };
            let err = io::Error::from_raw_os_error(e.errno);
            if first {
                tracing::warn!(
                    target: "softroce::net",
                    peer = %e.dst,
                    src_port = port,
                    "ICMP: {err} for a QP's datagrams: no RoCE device answers at that address \
                     (its QPs will exhaust their retries)"
                );
            } else {
                tracing::debug!(
                    target: "softroce::net",
                    peer = %e.dst,
                    src_port = port,
                    "ICMP: {err} for a QP's datagrams"
                );
            }
        }
    }

    /// Whether ICMP errors said that `peer` has no RoCE device, for a QP's datagrams (the
    /// peers logged from the error queues of the QPs' send sockets).
    pub fn told_unreachable(&self, peer: IpAddr) -> bool {
        self.told_unreachable.lock().contains(&peer)
    }

    /// Moves the ICMP errors queued on QP1's send sockets into `unreachable`, logging each.
    pub(super) fn take_icmp_errors(&self) {
        let Some(socks) = self.send.lock().get(&gsi_source_port()).cloned() else {
            return;
        };
        let mut errs = super::super::icmp::drain(&socks.plain, UNREACHABLE_MAX);
        if let Some(Some(g)) = socks.gso.get() {
            errs.extend(super::super::icmp::drain(g, UNREACHABLE_MAX));
        }
        if errs.is_empty() {
            return;
        }
        let mut q = self.unreachable.lock();
        for e in errs {
            tracing::info!(
                target: "softroce::net",
                peer = %e.dst,
                "ICMP: {} (no RoCE device answers at that address)",
                io::Error::from_raw_os_error(e.errno)
            );
            if q.len() == UNREACHABLE_MAX {
                q.pop_front();
            }
            if !q.contains(&e.dst.ip()) {
                q.push_back(e.dst.ip());
            }
        }
    }
}
