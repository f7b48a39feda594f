//! The endpoint of a queue pair, exchanged out of band before the handshake.

use crate::Gid;

/// What the peer needs to connect to a queue pair: QP number, LID (0 on RoCE) and GID
/// (the device address). Serialisable for the out-of-band exchange. Both sides start
/// their PSNs at 0, as the `ibverbs` crate does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct QueuePairEndpoint {
    /// QP number (24 bits).
    pub num: u32,
    /// LID: always 0 on RoCE.
    pub lid: u16,
    /// The GID the QP sends from; `None` is refused by [`PreparedQueuePair::handshake`]
    /// (RoCE addresses by GID).
    ///
    /// [`PreparedQueuePair::handshake`]: crate::PreparedQueuePair::handshake
    #[serde(with = "gid_text")]
    pub gid: Option<Gid>,
}

/// `serde` for [`QueuePairEndpoint::gid`]: a GID as its `inet_ntop` text, e.g.
/// `"::ffff:127.0.24.1"` (any IPv6 address text is read back), `null` for none.
mod gid_text {
    use super::Gid;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(gid: &Option<Gid>, s: S) -> Result<S::Ok, S::Error> {
        match gid {
            Some(g) => s.collect_str(g),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Gid>, D::Error> {
        let text = <Option<std::borrow::Cow<'de, str>>>::deserialize(d)?;
        text.map(|t| {
            t.parse::<std::net::Ipv6Addr>()
                .map(|a| Gid(a.octets()))
                .map_err(serde::de::Error::custom)
        })
        .transpose()
    }
}
