//! Invariant CRC (ICRC) of RoCEv2 packets.
//!
//! ICRC = CRC-32 (reflected, polynomial 0x04C11DB7, as zlib / `crc32fast`) over
//! `8 × 0xFF ‖ masked IP header ‖ masked UDP header ‖ masked BTH ‖ rest of the headers ‖
//! payload ‖ pad`; the four wire bytes are that CRC least-significant byte first.
//! Masked to all-ones on a copy: IPv4 TOS, TTL and header checksum; IPv6 traffic class, flow
//! label and hop limit (the version nibble is kept); the UDP checksum; BTH byte 4 (FECN, BECN,
//! reserved). The IPv4 Identification field is *covered*.
//!
//! Source: IBTA Annex A17 (RoCEv2 ICRC); rxe `rxe_icrc.c` (`rxe_icrc_hdr` starts `crc32_le` at
//! 0xDEBB20E3, the state after eight 0xFF bytes, and stores the inverted CRC); checked against
//! every packet in tests/captures (tests/wire_vectors.rs).

use core::net::{Ipv4Addr, Ipv6Addr};

/// The outer IP and UDP fields that the ICRC covers, for a packet whose IP header we build
/// ourselves (sending) or infer (a plain UDP socket receive).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IcrcIp {
    /// IPv4 without options, DF set, fragment offset 0.
    V4 {
        /// Source address.
        src: Ipv4Addr,
        /// Destination address.
        dst: Ipv4Addr,
        /// IP Identification (0 for what softroce sends through an unconnected
        /// `IP_PMTUDISC_DO` socket; kernel rxe sends a non-zero per-destination counter).
        ident: u16,
        /// UDP source port.
        src_port: u16,
        /// UDP destination port.
        dst_port: u16,
    },
    /// IPv6 without extension headers.
    V6 {
        /// Source address.
        src: Ipv6Addr,
        /// Destination address.
        dst: Ipv6Addr,
        /// UDP source port.
        src_port: u16,
        /// UDP destination port.
        dst_port: u16,
    },
}

const LRH_ONES: [u8; 8] = [0xff; 8];

/// ICRC over an IP header, a UDP header and `roce_body` = BTH up to and including the pad
/// (everything before the 4 ICRC bytes). The headers are the bytes as on the wire; masking is
/// done here on copies. `ip_header` is 20 bytes (IPv4, no options) or 40 (IPv6); another
/// length is hashed as given (callers check the version first).
///
/// Returns the four ICRC bytes in wire order. Panics: never (a `roce_body` shorter than a BTH
/// is hashed as it is).
pub fn icrc_compute(ip_header: &[u8], udp_header: &[u8], roce_body: &[u8]) -> [u8; 4] {
    icrc_over(ip_header, udp_header, &[roce_body], roce_body.len())
}

/// Body bytes copied beside the pseudo-header so that the ICRC of a small packet (an ACK,
/// a 64-byte WRITE) is one CRC pass instead of six short ones. Measured with `cargo bench
/// --bench dataplane icrc_of_datagram`, two runs each: 96-byte datagram 61–68 ns → 45–50 ns;
/// 1 KiB and 4 KiB unchanged within the noise.
const INLINE_BODY: usize = 192;

/// The ICRC: CRC-32 over 8 bytes of 0xFF (the LRH RoCEv2 lacks), the masked IP and UDP
/// headers, then the body given as consecutive `parts`, with body byte 4 (BTH resv8a) read as
/// 0xFF (IBTA A17.8.3; docs/wire-facts.md §2.2). `body_len` is the parts' total length (the callers know
/// it already). At most 40 IP and 8 UDP header bytes are used.
fn icrc_over(ip_header: &[u8], udp_header: &[u8], parts: &[&[u8]], body_len: usize) -> [u8; 4] {
    icrc_start(ip_header, udp_header, parts, body_len)
        .finalize()
        .to_le_bytes()
}

/// [`icrc_over`] up to the final step: the CRC state after the pseudo-header and `parts`
/// (the first bytes of a `body_len`-byte body; the rest may follow through `update`).
fn icrc_start(
    ip_header: &[u8],
    udp_header: &[u8],
    parts: &[&[u8]],
    body_len: usize,
) -> crc32fast::Hasher {
    let mut scratch = [0u8; 8 + 48 + INLINE_BODY];
    scratch[..8].copy_from_slice(&LRH_ONES);
    let n = ip_header.len().min(40);
    scratch[8..8 + n].copy_from_slice(&ip_header[..n]);
    mask_ip_udp(&mut scratch[8..8 + n], n);
    let u = udp_header.len().min(8);
    let udp = &mut scratch[8 + n..8 + n + u];
    udp.copy_from_slice(&udp_header[..u]);
    for b in udp.iter_mut().skip(6) {
        *b = 0xff; // UDP checksum
    }
    let mut len = 8 + n + u;
    let body_start = len;
    // A small body joins the headers whole. Of a larger one only the first 5 bytes do (the
    // masked byte 4 among them), so that the headers stay one short table-driven pass and the
    // bulk one vectorized pass. The rest (a part's tail and the parts after it) is hashed in
    // place, where no masked byte remains.
    let inline = if body_len <= INLINE_BODY { body_len } else { 5 };
    let end = len + inline;
    let mut rest: (&[u8], &[&[u8]]) = (&[], &[]);
    for (i, p) in parts.iter().enumerate() {
        let room = end - len;
        if p.len() > room {
            let (head, tail) = p.split_at(room);
            scratch[len..end].copy_from_slice(head);
            len = end;
            rest = (tail, parts.get(i + 1..).unwrap_or_default());
            break;
        }
        scratch[len..len + p.len()].copy_from_slice(p);
        len += p.len();
    }
    if len > body_start + 4 {
        scratch[body_start + 4] = 0xff;
    }
    let mut h = crc32fast::Hasher::new();
    h.update(&scratch[..len]);
    h.update(rest.0);
    for q in rest.1 {
        h.update(q);
    }
    h
}

/// The ICRC of a body handed over piece by piece, for a body some of whose bytes cannot be
/// lent as one slice (a zero-copy send's payload in application memory arrives in copies of
/// a few hundred bytes). `new` takes the flow, the body's total length (the IP and UDP
/// lengths are covered) and its first piece, which must hold the BTH (its byte 4 is masked);
/// `update` the following pieces in order; `finish` gives what [`icrc_of_body`] gives for
/// the concatenation. Panics: never.
#[derive(Debug, Clone)]
pub struct IcrcHasher(crc32fast::Hasher);

impl IcrcHasher {
    /// Starts the ICRC of a `body_len`-byte body (BTH up to the pad) on the flow `ip`, whose
    /// first bytes are `head`.
    pub fn new(ip: &IcrcIp, head: &[u8], body_len: usize) -> IcrcHasher {
        let (hdrs, ip_len) = ip.headers(body_len + 4);
        IcrcHasher(icrc_start(
            &hdrs[..ip_len],
            &hdrs[ip_len..ip_len + 8],
            &[head],
            body_len,
        ))
    }

    /// Hashes the next `bytes` of the body.
    pub fn update(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }

    /// The four ICRC bytes, in wire order.
    #[must_use]
    pub fn finish(self) -> [u8; 4] {
        self.0.finalize().to_le_bytes()
    }
}

/// As [`icrc_of_body`], for a body given as consecutive `parts` (headers in one buffer, the
/// payload in registered memory, the pad), hashed in place.
/// Returns the four ICRC bytes. Panics: never.
pub fn icrc_of_body_parts(ip: &IcrcIp, parts: &[&[u8]]) -> [u8; 4] {
    let len: usize = parts.iter().map(|p| p.len()).sum();
    let (hdrs, ip_len) = ip.headers(len + 4);
    icrc_over(&hdrs[..ip_len], &hdrs[ip_len..ip_len + 8], parts, len)
}

/// The ICRC's masking of an IPv4 (20-byte) or IPv6 (40-byte) header, in place.
fn mask_ip_udp(ip: &mut [u8], n: usize) {
    if n >= 20 && ip[0] >> 4 == 4 {
        ip[1] = 0xff; // TOS
        ip[8] = 0xff; // TTL
        ip[10] = 0xff; // header checksum
        ip[11] = 0xff;
    } else if n >= 40 && ip[0] >> 4 == 6 {
        ip[0] |= 0x0f; // traffic class, high nibble
        ip[1] = 0xff; // traffic class low nibble + flow label
        ip[2] = 0xff;
        ip[3] = 0xff;
        ip[7] = 0xff; // hop limit
    }
}

impl IcrcIp {
    /// Builds the IP and UDP headers the ICRC covers for a UDP payload of `udp_payload_len`
    /// bytes. Returns the 48-byte scratch and how many of its bytes are the IP header.
    fn headers(&self, udp_payload_len: usize) -> ([u8; 48], usize) {
        let mut b = [0u8; 48];
        // A real datagram fits in u16 lengths; a longer body (never received) wraps instead of
        // panicking, so the ICRC helpers stay total.
        let udp_len = (8 + udp_payload_len) as u16;
        let (ip_len, sport, dport) = match *self {
            IcrcIp::V4 {
                src,
                dst,
                ident,
                src_port,
                dst_port,
            } => {
                let total = udp_len.wrapping_add(20);
                b[0] = 0x45;
                b[2..4].copy_from_slice(&total.to_be_bytes());
                b[4..6].copy_from_slice(&ident.to_be_bytes());
                b[6] = 0x40; // DF
                b[9] = 17; // UDP
                b[12..16].copy_from_slice(&src.octets());
                b[16..20].copy_from_slice(&dst.octets());
                (20, src_port, dst_port)
            }
            IcrcIp::V6 {
                src,
                dst,
                src_port,
                dst_port,
            } => {
                b[0] = 0x60;
                b[4..6].copy_from_slice(&udp_len.to_be_bytes());
                b[6] = 17;
                b[8..24].copy_from_slice(&src.octets());
                b[24..40].copy_from_slice(&dst.octets());
                (40, src_port, dst_port)
            }
        };
        b[ip_len..ip_len + 2].copy_from_slice(&sport.to_be_bytes());
        b[ip_len + 2..ip_len + 4].copy_from_slice(&dport.to_be_bytes());
        b[ip_len + 4..ip_len + 6].copy_from_slice(&udp_len.to_be_bytes());
        (b, ip_len)
    }
}

/// ICRC of a whole UDP payload `datagram` (BTH ‖ … ‖ pad ‖ ICRC) sent or received on the flow
/// `ip`; the last 4 bytes of `datagram` (the ICRC slot) are not hashed.
/// Returns the four expected ICRC bytes. Panics: never (a datagram under 4 bytes is hashed
/// whole).
pub fn icrc_of_datagram(ip: &IcrcIp, datagram: &[u8]) -> [u8; 4] {
    icrc_of_body(ip, &datagram[..datagram.len().saturating_sub(4)])
}

/// ICRC of `body` = a UDP payload without its 4 ICRC bytes, on the flow `ip`.
/// Returns the four expected ICRC bytes. Panics: never.
pub fn icrc_of_body(ip: &IcrcIp, body: &[u8]) -> [u8; 4] {
    let (hdrs, ip_len) = ip.headers(body.len() + 4);
    icrc_over(
        &hdrs[..ip_len],
        &hdrs[ip_len..ip_len + 8],
        &[body],
        body.len(),
    )
}

/// For an IPv4 packet received on a plain UDP socket, which does not show the IP
/// Identification field that the ICRC covers: finds an ID (with DF set, as rxe and ConnectX
/// send) that makes `received` the valid ICRC of `body`, by CRC linearity.
///
/// The CRC is affine in the 16 ID bits, so with `f(x)` the ICRC for ID `x`,
/// `f(x) = f(0) ⊕ L(x)` for a linear `L`; we compute `L` on the 16 unit vectors and solve
/// `L(x) = f(0) ⊕ received` over GF(2). A corrupted packet is then accepted only if its
/// error happens to lie in the 16-dimensional image of `L`: about 2^-16 of random
/// corruptions. Measured (`examples/icrc_false_accept.rs`): 272 of 17,779,299 corrupted
/// packets accepted (1.53e-5), whether 2 bits, 3–8 bits, a burst or random bytes were hit;
/// none of 41,984 single-bit flips.
/// Returns `None` when no ID fits; `ip` must be [`IcrcIp::V4`] (else `None`).
///
/// `L` depends only on where the ID field sits from the end of the packet, that is on the
/// body's length, not on its bytes or the addresses: each thread keeps the reduced bases of
/// the last `IDENT_BASES` (8) body lengths it solved. Cost: one CRC pass over the packet (17
/// for a body length the thread has not solved lately).
pub fn solve_ipv4_ident(ip: &IcrcIp, body: &[u8], received: [u8; 4]) -> Option<u16> {
    let IcrcIp::V4 {
        src,
        dst,
        src_port,
        dst_port,
        ..
    } = *ip
    else {
        return None;
    };
    let f = |ident: u16| {
        u32::from_le_bytes(icrc_of_body(
            &IcrcIp::V4 {
                src,
                dst,
                ident,
                src_port,
                dst_port,
            },
            body,
        ))
    };
    let f0 = f(0);
    let basis = IDENT_BASIS_CACHE.with(|c| {
        let mut c = c.borrow_mut();
        if let Some(b) = c.slots.iter().flatten().find(|b| b.body_len == body.len()) {
            return *b;
        }
        let b = IdentBasis::new(body.len(), |bit| f(1 << bit) ^ f0);
        let i = c.next;
        c.slots[i] = Some(b);
        c.next = (i + 1) % IDENT_BASES;
        b
    });
    basis.solve(f0 ^ u32::from_le_bytes(received))
}

/// How many body lengths' bases [`solve_ipv4_ident`] keeps per thread: a flow's full-MTU
/// packets, its last ones, ACKs and a few more.
pub const IDENT_BASES: usize = 8;

/// The bases of the last [`IDENT_BASES`] body lengths solved on this thread, replaced round
/// robin.
struct IdentBasisCache {
    slots: [Option<IdentBasis>; IDENT_BASES],
    next: usize,
}

thread_local! {
    static IDENT_BASIS_CACHE: core::cell::RefCell<IdentBasisCache> =
        const { core::cell::RefCell::new(IdentBasisCache { slots: [None; IDENT_BASES], next: 0 }) };
}

/// The linear map `L` from the 16 IPv4 ID bits to the ICRC, for one body length, reduced by
/// Gaussian elimination over GF(2): rows of (vector, which ID bits make it), sorted by
/// leading bit, highest first, so that reducing a vector is one greedy pass.
#[derive(Clone, Copy)]
struct IdentBasis {
    body_len: usize,
    rows: [(u32, u16); 16],
    n: usize,
}

impl IdentBasis {
    /// The basis from `unit(bit)` = `L` of the ID with only `bit` set.
    fn new(body_len: usize, mut unit: impl FnMut(u16) -> u32) -> IdentBasis {
        let mut b = IdentBasis {
            body_len,
            rows: [(0, 0); 16],
            n: 0,
        };
        for bit in 0..16 {
            let mut v = unit(bit);
            let mut mask = 1u16 << bit;
            for &(rv, rm) in &b.rows[..b.n] {
                if v ^ rv < v {
                    v ^= rv;
                    mask ^= rm;
                }
            }
            if v != 0 {
                b.rows[b.n] = (v, mask);
                b.n += 1;
                b.rows[..b.n].sort_unstable_by_key(|r| r.0.leading_zeros());
            }
        }
        b
    }

    /// The ID `x` with `L(x) = target`, if one exists.
    fn solve(&self, mut target: u32) -> Option<u16> {
        let mut ident = 0u16;
        for &(rv, rm) in &self.rows[..self.n] {
            if target ^ rv < target {
                target ^= rv;
                ident ^= rm;
            }
        }
        (target == 0).then_some(ident)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The single-pass hash against the ICRC written out: one buffer of LRH ones, the masked
    /// IPv4 and UDP headers and the body with byte 4 set, hashed whole. Body lengths cross
    /// the inline boundary and the masked byte.
    #[test]
    fn matches_the_icrc_written_out() {
        let ip = IcrcIp::V4 {
            src: std::net::Ipv4Addr::new(10, 0, 0, 1),
            dst: std::net::Ipv4Addr::new(10, 0, 0, 2),
            ident: 0x1234,
            src_port: 0xc001,
            dst_port: 4791,
        };
        for len in (0..12)
            .chain(INLINE_BODY - 2..INLINE_BODY + 3)
            .chain([700, 4108])
        {
            let body: Vec<u8> = (0..len as u32).map(|i| (i * 73 % 241) as u8).collect();
            let (hdrs, ip_len) = ip.headers(len + 4);
            let mut all = vec![0xffu8; 8];
            all.extend_from_slice(&hdrs[..ip_len + 8]);
            for i in [8 + 1, 8 + 8, 8 + 10, 8 + 11, 8 + 20 + 6, 8 + 20 + 7] {
                all[i] = 0xff; // TOS, TTL, IP checksum, UDP checksum
            }
            let at = all.len();
            all.extend_from_slice(&body);
            if len > 4 {
                all[at + 4] = 0xff;
            }
            let want = crc32fast::hash(&all).to_le_bytes();
            assert_eq!(icrc_of_body(&ip, &body), want, "body of {len} bytes");
            let cut = len / 3;
            let parts = [&body[..cut], &body[cut..2 * cut], &body[2 * cut..]];
            assert_eq!(
                icrc_of_body_parts(&ip, &parts),
                want,
                "{len} bytes in 3 parts"
            );
        }
    }

    #[test]
    fn body_in_parts_hashes_as_the_whole_body() {
        let ip = IcrcIp::V4 {
            src: std::net::Ipv4Addr::new(10, 0, 0, 1),
            dst: std::net::Ipv4Addr::new(10, 0, 0, 2),
            ident: 7,
            src_port: 0xc001,
            dst_port: 4791,
        };
        let body: Vec<u8> = (0..300u32).map(|i| (i * 37 % 251) as u8).collect();
        let whole = icrc_of_body(&ip, &body);
        // Every split point pair, including splits around the masked byte 4.
        for a in [0, 1, 3, 4, 5, 12, 28, 299, 300] {
            for b in [a, a + 1, 150, 300] {
                let (a, b) = (a.min(300), b.clamp(a.min(300), 300));
                let parts = [&body[..a], &body[a..b], &body[b..]];
                assert_eq!(icrc_of_body_parts(&ip, &parts), whole, "split {a}/{b}");
            }
        }
    }

    /// A body fed to `IcrcHasher` as a head holding the BTH and then chunks of any size
    /// hashes as the whole body, for bodies below and above the inline threshold.
    #[test]
    fn hasher_in_pieces_hashes_as_the_whole_body() {
        let ip = IcrcIp::V6 {
            src: std::net::Ipv6Addr::LOCALHOST,
            dst: std::net::Ipv4Addr::new(10, 0, 0, 2).to_ipv6_mapped(),
            src_port: 0xc002,
            dst_port: 4791,
        };
        for len in [12, 40, INLINE_BODY, INLINE_BODY + 1, 4096 + 28] {
            let body: Vec<u8> = (0..len as u32).map(|i| (i * 31 % 253) as u8).collect();
            for head in [12, 28] {
                let head = head.min(len);
                for chunk in [1, 7, 1024] {
                    let mut h = IcrcHasher::new(&ip, &body[..head], len);
                    body[head..].chunks(chunk).for_each(|c| h.update(c));
                    assert_eq!(h.finish(), icrc_of_body(&ip, &body), "{len}/{head}/{chunk}");
                }
            }
        }
    }

    #[test]
    fn ipv4_ident_is_recovered_by_linearity() {
        let body: Vec<u8> = (0..300u32).map(|i| (i * 7 + 3) as u8).collect();
        for ident in [0u16, 1, 0x1c8, 0xbeef, 0xffff] {
            let ip = IcrcIp::V4 {
                src: Ipv4Addr::new(10, 77, 0, 2),
                dst: Ipv4Addr::new(10, 77, 0, 1),
                ident,
                src_port: 0xc240,
                dst_port: 4791,
            };
            let icrc = icrc_of_body(&ip, &body);
            assert_eq!(solve_ipv4_ident(&ip, &body, icrc), Some(ident));
            let mut bad = body.clone();
            bad[100] ^= 0x10;
            assert_eq!(solve_ipv4_ident(&ip, &bad, icrc), None);
        }
    }

    // The per-thread bases are keyed by body length only: flows with other addresses,
    // ports and bytes reuse them, and more lengths than the cache holds evict and
    // recompute. Every solve must still give the ID the sender wrote.
    #[test]
    fn cached_bases_serve_every_flow_of_a_length() {
        let lengths = [
            0usize, 12, 16, 64, 300, 1024, 1036, 2048, 4096, 4108, 4112, 9000,
        ];
        assert!(lengths.len() > IDENT_BASES);
        let mut seed = 0x9e37_79b9u32;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 17;
            seed ^= seed << 5;
            seed
        };
        for round in 0..3u8 {
            for &len in &lengths {
                let body: Vec<u8> = (0..len).map(|_| next() as u8).collect();
                let ident = next() as u16;
                let ip = IcrcIp::V4 {
                    src: Ipv4Addr::new(10, round, 0, (next() % 250) as u8 + 1),
                    dst: Ipv4Addr::new(10, 77, round, 1),
                    ident,
                    src_port: next() as u16 | 0xc000,
                    dst_port: 4791,
                };
                let icrc = icrc_of_body(&ip, &body);
                assert_eq!(
                    solve_ipv4_ident(&ip, &body, icrc),
                    Some(ident),
                    "{round}/{len}"
                );
                if len > 0 {
                    let mut bad = body.clone();
                    bad[len / 2] ^= 0x01;
                    assert_eq!(solve_ipv4_ident(&ip, &bad, icrc), None, "{round}/{len}");
                }
            }
        }
    }

    #[test]
    fn masks_do_not_matter_covered_fields_do() {
        let body = [
            0x04, 0, 0xff, 0xff, 0, 0, 0, 0x11, 0x80, 0, 0, 1, 1, 2, 3, 4,
        ];
        let v4 = |ttl: u8, tos: u8, id: u16| {
            let mut ip = [0u8; 20];
            ip[0] = 0x45;
            ip[1] = tos;
            ip[4..6].copy_from_slice(&id.to_be_bytes());
            ip[8] = ttl;
            icrc_compute(&ip, &[0xc0, 0, 0x12, 0xb7, 0, 28, 0x12, 0x34], &body)
        };
        assert_eq!(v4(64, 0, 7), v4(1, 0xc2, 7));
        assert_ne!(v4(64, 0, 7), v4(64, 0, 8));
        let mut fecn = body;
        fecn[4] = 0xc0;
        let ip = [0x45u8; 20];
        let udp = [0u8; 8];
        assert_eq!(
            icrc_compute(&ip, &udp, &body),
            icrc_compute(&ip, &udp, &fecn)
        );
    }
}
