//! perftest's out-of-band exchange over TCP ("Ethernet" data exchange method): the fixed
//! prelude, the 108-byte QP address message, the handshakes that repeat it, the bandwidth
//! report words and the closing `"done"`.
//!
//! Every step is one message each way, the client's first, the server answering
//! (`ctx_xchg_data` / `ctx_hand_shake` in perftest's `src/perftest_communication.c`).
//! Message layouts and the order of steps per test were checked against TCP captures between
//! two Debian bookworm perftest 4.5-0.17 peers on kernel rxe (tests/interop/README.md).

use crate::BoxError;
use crate::exchange;
use softroce::verbs::{Gid, PathMtu};
use std::io::Write;
use std::net::TcpStream;

/// perftest's exchange version (`VERSION` of perftest 4.5-0.17).
pub const VERSION: &[u8] = b"6.06";
/// What perftest calls the page size and the cache line size (x86-64).
pub const PAGE_BYTES: u32 = 4096;
const CACHE_LINE_BYTES: u32 = 64;
/// Length of the address message.
pub const KEY_MSG_LEN: usize = 108;

/// One side's QP address in perftest's exchange (`struct pingpong_dest`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PerfDest {
    /// LID (0 on RoCE).
    pub lid: u16,
    /// Outstanding RDMA READs / atomics this side accepts (1 for tests without them).
    pub out_reads: u16,
    /// QP number.
    pub qpn: u32,
    /// First PSN this side sends.
    pub psn: u32,
    /// rkey of the buffer (0 in the SEND tests, which register no remote access).
    pub rkey: u32,
    /// Address of the buffer the peer targets.
    pub vaddr: u64,
    /// GID.
    pub gid: Gid,
    /// SRQ number (0: no SRQ).
    pub srqn: u32,
}

impl PerfDest {
    /// The 108-byte address message: `"%04x:%04x:%06x:%06x:%08x:%016x:"` of LID, outstanding
    /// reads, QPN, PSN, rkey and buffer address, the 16 GID bytes each as `"%02x:"`, the SRQ
    /// number as `"%08x:"`, NUL (perftest's `KEY_PRINT_FMT_GID`).
    pub fn to_message(self) -> [u8; KEY_MSG_LEN] {
        let mut t = format!(
            "{:04x}:{:04x}:{:06x}:{:06x}:{:08x}:{:016x}:",
            self.lid, self.out_reads, self.qpn, self.psn, self.rkey, self.vaddr
        );
        for b in self.gid.0 {
            t.push_str(&format!("{b:02x}:"));
        }
        t.push_str(&format!("{:08x}:", self.srqn));
        let mut m = [0u8; KEY_MSG_LEN];
        let n = t.len().min(KEY_MSG_LEN - 1);
        m[..n].copy_from_slice(&t.as_bytes()[..n]);
        m
    }

    /// Parses an address message. Errors: anything but 23 `:`-terminated hex fields.
    pub fn from_message(m: &[u8]) -> Result<PerfDest, BoxError> {
        let end = m.iter().position(|b| *b == 0).unwrap_or(m.len());
        let text = std::str::from_utf8(&m[..end]).map_err(|_| "perftest message is not text")?;
        let bad = || format!("malformed perftest address message {text:?}");
        let f: Vec<&str> = text.split(':').collect();
        if f.len() != 24 || !f[23].is_empty() {
            return Err(bad().into());
        }
        let hex = |s: &str| u64::from_str_radix(s, 16).map_err(|_| bad());
        let mut gid = [0u8; 16];
        for (i, b) in gid.iter_mut().enumerate() {
            *b = u8::try_from(hex(f[6 + i])?).map_err(|_| bad())?;
        }
        let narrow = |v: u64, max: u64| if v > max { Err(bad()) } else { Ok(v) };
        Ok(PerfDest {
            lid: narrow(hex(f[0])?, 0xffff)? as u16,
            out_reads: narrow(hex(f[1])?, 0xffff)? as u16,
            qpn: narrow(hex(f[2])?, 0x00ff_ffff)? as u32,
            psn: narrow(hex(f[3])?, 0x00ff_ffff)? as u32,
            rkey: narrow(hex(f[4])?, 0xffff_ffff)? as u32,
            vaddr: hex(f[5])?,
            gid: Gid(gid),
            srqn: narrow(hex(f[22])?, 0xffff_ffff)? as u32,
        })
    }

    /// perftest's `ctx_print_pingpong_data` lines (`read` adds the outstanding reads,
    /// `keys` the rkey and address, as the READ/atomic and latency tests print them).
    pub fn describe(self, which: &str, read: bool, keys: bool) -> Vec<String> {
        let out = if read {
            format!(" OUT {:#04x}", self.out_reads)
        } else {
            String::new()
        };
        let keys = if keys {
            format!(" RKey {:#08x} VAddr {:#016x}", self.rkey, self.vaddr)
        } else {
            String::new()
        };
        let gid: Vec<String> = self.gid.0.iter().map(|b| format!("{b:02}")).collect();
        vec![
            format!(
                " {which} address: LID {:04x} QPN {:#06x} PSN {:#06x}{out}{keys}",
                self.lid, self.qpn, self.psn
            ),
            format!(" GID: {}", gid.join(":")),
        ]
    }
}

/// The client's bandwidth results as perftest's `xchg_bw_reports` sends them: size and
/// iterations as 8-byte big-endian integers, then peak BW, average BW (MB/s, MB = 2^20
/// bytes) and message rate (Mpps) as big-endian IEEE doubles; each word answered by the
/// peer's.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BwReport {
    /// Message size in bytes.
    pub size: u64,
    /// Messages, all QPs together.
    pub iters: u64,
    /// Peak bandwidth, MB/s.
    pub bw_peak: f64,
    /// Average bandwidth, MB/s.
    pub bw_avg: f64,
    /// Messages per second, in millions.
    pub msg_rate: f64,
}

impl BwReport {
    /// The five words, in exchange order.
    pub fn words(&self) -> [[u8; 8]; 5] {
        [
            self.size.to_be_bytes(),
            self.iters.to_be_bytes(),
            self.bw_peak.to_be_bytes(),
            self.bw_avg.to_be_bytes(),
            self.msg_rate.to_be_bytes(),
        ]
    }

    /// The report from its five words.
    pub fn from_words(w: &[[u8; 8]; 5]) -> BwReport {
        BwReport {
            size: u64::from_be_bytes(w[0]),
            iters: u64::from_be_bytes(w[1]),
            bw_peak: f64::from_be_bytes(w[2]),
            bw_avg: f64::from_be_bytes(w[3]),
            msg_rate: f64::from_be_bytes(w[4]),
        }
    }
}

/// What both sides learn from the prelude.
#[derive(Debug, Clone)]
pub struct Prelude {
    /// The peer's version text.
    pub their_version: String,
    /// The path MTU both use: the smaller of the two.
    pub mtu: PathMtu,
}

/// The TCP side of the exchange. The client writes first; the server reads first.
pub struct Oob {
    tcp: exchange::Conn,
    client: bool,
}

impl Oob {
    /// Wraps a connected stream; `client` says which side writes first. Every step waits
    /// at most [`exchange::DEADLINE`] for the peer until [`Oob::without_deadline`].
    pub fn new(tcp: exchange::Conn, client: bool) -> Oob {
        let _ = tcp.set_nodelay(true);
        Oob { tcp, client }
    }

    /// Lifts the deadline: from here on a step may wait for the peer's whole run (the
    /// synchronisation after a long test).
    pub fn without_deadline(&mut self) {
        self.tcp.without_deadline();
    }

    /// Sends `mine` and receives the peer's message of the same length, in this side's order.
    /// Errors name the step, and the likely cause when the peer is silent or gone.
    pub fn xchg(&mut self, mine: &[u8], what: &str) -> Result<Vec<u8>, BoxError> {
        let mut theirs = vec![0u8; mine.len()];
        let send = |tcp: &mut TcpStream| {
            tcp.write_all(mine)
                .map_err(|e| format!("sending the {what} to the peer: {e}"))
        };
        if self.client {
            send(&mut self.tcp)?;
            self.tcp.read_exact(&mut theirs, what)?;
        } else {
            self.tcp.read_exact(&mut theirs, what)?;
            send(&mut self.tcp)?;
        }
        Ok(theirs)
    }

    /// The prelude of every test: version (16 bytes of NUL-padded text), page size and cache
    /// line size (4 bytes big-endian each), then the path MTU as its `enum ibv_mtu` digit and
    /// a NUL (`exchange_versions`, `check_sys_data`, `check_mtu`). Both use the smaller MTU.
    pub fn prelude(&mut self, my_mtu: PathMtu) -> Result<Prelude, BoxError> {
        let mut version = [0u8; 16];
        version[..VERSION.len()].copy_from_slice(VERSION);
        let theirs = self.xchg(&version, "version")?;
        let end = theirs.iter().position(|b| *b == 0).unwrap_or(theirs.len());
        let their_version = String::from_utf8_lossy(&theirs[..end]).into_owned();
        self.xchg(&PAGE_BYTES.to_be_bytes(), "page size")?;
        self.xchg(&CACHE_LINE_BYTES.to_be_bytes(), "cache line size")?;
        let theirs = self.xchg(&[b'0' + my_mtu as u8, 0], "MTU")?;
        let mtu = theirs
            .first()
            .and_then(|c| c.checked_sub(b'0'))
            .and_then(PathMtu::from_ibv)
            .map(|p| {
                if p.bytes() < my_mtu.bytes() {
                    p
                } else {
                    my_mtu
                }
            })
            .ok_or_else(|| format!("peer sent MTU {theirs:?}"))?;
        Ok(Prelude { their_version, mtu })
    }

    /// One address message each way per QP (`ctx_hand_shake` in a loop over the QPs).
    pub fn addresses(&mut self, me: &[PerfDest]) -> Result<Vec<PerfDest>, BoxError> {
        me.iter()
            .map(|d| PerfDest::from_message(&self.xchg(&d.to_message(), "QP address")?))
            .collect()
    }

    /// A synchronisation: `ctx_hand_shake` of the first QP's address, whose answer is ignored.
    pub fn sync(&mut self, me: &PerfDest) -> Result<(), BoxError> {
        self.xchg(&me.to_message(), "synchronisation").map(|_| ())
    }

    /// `xchg_bw_reports`: this side's five words, each answered by the peer's.
    pub fn reports(&mut self, mine: &BwReport) -> Result<BwReport, BoxError> {
        let mut words = [[0u8; 8]; 5];
        for (w, m) in words.iter_mut().zip(mine.words()) {
            w.copy_from_slice(&self.xchg(&m, "results")?);
        }
        Ok(BwReport::from_words(&words))
    }

    /// `ctx_close_connection`: a synchronisation, then both sides write `"done"` and a NUL
    /// and close. perftest writes without reading, so the server writes first and then
    /// reads, the client reads first; the client's own `"done"` may find the socket closed,
    /// which is no error.
    pub fn close(&mut self, me: &PerfDest) -> Result<(), BoxError> {
        self.sync(me)?;
        let mut done = [0u8; 5];
        if self.client {
            self.tcp.read_exact(&mut done, "closing \"done\"")?;
            let _ = self.tcp.write_all(b"done\0");
        } else {
            self.tcp
                .write_all(b"done\0")
                .map_err(|e| format!("closing the exchange: {e}"))?;
            self.tcp.read_exact(&mut done, "closing \"done\"")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn address_message_matches_perftest_layout() {
        // What ib_read_bw -x 1 on rxe at 10.77.0.2 sent in a capture of the interop rig (its
        // server printed "QPN 0x001c PSN 0x997cbb OUT 0x80 RKey 0x000ddf VAddr 0x0055aceea83000").
        let d = PerfDest {
            lid: 0,
            out_reads: 0x80,
            qpn: 0x1c,
            psn: 0x99_7cbb,
            rkey: 0xddf,
            vaddr: 0x0000_55ac_eea8_3000,
            gid: Gid::from_ip("10.77.0.2".parse().unwrap()),
            srqn: 0,
        };
        let m = d.to_message();
        assert_eq!(
            &m[..107],
            &b"0000:0080:00001c:997cbb:00000ddf:000055aceea83000:00:00:00:00:00:00:00:00:00:00:ff:ff:0a:4d:00:02:00000000:"[..]
        );
        assert_eq!(m[107], 0);
        assert_eq!(PerfDest::from_message(&m).unwrap(), d);
        assert!(PerfDest::from_message(&m[..60]).is_err());
    }

    #[test]
    fn results_round_trip_as_perftest_sends_them() {
        // From the rig's ib_write_bw capture: 64 B, 5 iterations, then three doubles.
        let w = [
            0x40u64.to_be_bytes(),
            5u64.to_be_bytes(),
            0x3fe1_e290_ac5b_b48cu64.to_be_bytes(),
            0x3fd1_6cb8_a5ba_ffe5u64.to_be_bytes(),
            0x3f72_4567_c025_bf91u64.to_be_bytes(),
        ];
        let r = BwReport::from_words(&w);
        assert_eq!((r.size, r.iters), (64, 5));
        assert!((r.bw_avg - 0.2723).abs() < 1e-3, "{r:?}");
        assert!((r.msg_rate - 0.004461).abs() < 1e-6, "{r:?}");
        assert_eq!(r.words(), w);
    }
}
