//! A [`Link`] that sends nothing and keeps what a device gave it, for tests and fuzz targets
//! that drive one device by hand: feed it datagrams with `Device::handle_datagram`, then look
//! at the ACKs, NAKs and requests it produced.

use crate::transport::Transmit;
use crate::verbs::Link;
use parking_lot::Mutex;

/// Keeps every datagram the device sends (or only the newest `keep`, for long fuzz runs).
/// Sending never fails.
#[derive(Debug, Default)]
pub struct RecordingLink {
    sent: Mutex<Vec<Transmit>>,
    keep: Option<usize>,
}

impl RecordingLink {
    /// A link that keeps every datagram.
    pub fn new() -> RecordingLink {
        RecordingLink::default()
    }

    /// A link that keeps only the newest `keep` datagrams (at least one).
    pub fn keeping_last(keep: usize) -> RecordingLink {
        RecordingLink {
            sent: Mutex::new(Vec::new()),
            keep: Some(keep.max(1)),
        }
    }

    /// How many datagrams are kept.
    pub fn len(&self) -> usize {
        self.sent.lock().len()
    }

    /// True when nothing was sent (since the last [`take`](Self::take) or
    /// [`clear`](Self::clear)).
    pub fn is_empty(&self) -> bool {
        self.sent.lock().is_empty()
    }

    /// The kept datagrams, oldest first; they stay kept.
    pub fn snapshot(&self) -> Vec<Transmit> {
        self.sent.lock().clone()
    }

    /// The kept datagrams, oldest first; the link keeps none after this.
    pub fn take(&self) -> Vec<Transmit> {
        std::mem::take(&mut *self.sent.lock())
    }

    /// Forgets the kept datagrams.
    pub fn clear(&self) {
        self.sent.lock().clear();
    }
}

impl Link for RecordingLink {
    fn send(&self, t: &Transmit) -> std::io::Result<()> {
        let mut sent = self.sent.lock();
        if let Some(keep) = self.keep
            && sent.len() >= keep
        {
            let excess = sent.len() + 1 - keep;
            sent.drain(..excess);
        }
        sent.push(t.clone());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::TxKind;
    use std::net::{IpAddr, Ipv4Addr};

    fn datagram(n: u8) -> Transmit {
        Transmit::new(
            TxKind::Request,
            IpAddr::V4(Ipv4Addr::LOCALHOST),
            0xc000,
            vec![n],
        )
    }

    #[test]
    fn a_bounded_link_keeps_the_newest() {
        let link = RecordingLink::keeping_last(2);
        for n in 0..5 {
            link.send(&datagram(n)).unwrap();
        }
        let kept: Vec<u8> = link.take().iter().map(|t| t.payload[0]).collect();
        assert_eq!(kept, [3, 4]);
        assert!(link.is_empty());
    }
}
