//! The `device_verbs` fuzz check: arbitrary datagrams into a `Device` whose QPs use a shared
//! receive queue, memory windows and a multicast attachment. Shared by the cargo-fuzz target
//! `fuzz_targets/device_verbs.rs` and the main crate's `tests/adversarial_verbs.rs` (both
//! include this file with `#[path]`), so every finding replays on stable.
//!
//! The setup is fixed and deterministic (a `ManualClock`, a link that records nothing, key
//! bytes from the device's seed), so the fuzzer's comparison tracing can learn the QPNs,
//! R_Keys and Q_Key:
//!
//! - RC QPs `rc_a` and `rc_b` (QPN 0x11, 0x12) connected to the peer 10.9.0.2 (its QPs 0x21,
//!   0x22; first PSN 0x100 both ways; path MTU 256), both taking receive WQEs from one SRQ of 8 WRs, each
//!   WR the first 256 bytes of a 512-byte slot of MR `rbuf`;
//! - fast-register MR `win` (8 KiB at [`WIN_VA`], LOCAL_WRITE | MW_BIND, no remote rights of
//!   its own) opened by a type 2 window bound to `rc_a` over `[1024, 2048)` (REMOTE_READ |
//!   REMOTE_WRITE | REMOTE_ATOMIC) and a type 1 window over `[4096, 4608)` (REMOTE_READ only);
//! - fast-register MR `ro` (4 KiB at [`RO_VA`], REMOTE_READ only);
//! - UD QP `ud` (QPN 0x13, Q_Key 0x1111_1111) with 4 receive WRs in MR `ubuf`, and UD QP
//!   `ud_srq` (QPN 0x14, same Q_Key) on the SRQ, both attached to the group 239.9.0.1.
//!
//! Input: records `[kind, len_hi, len_lo, bytes...]`. Kind % 4: 0 = a datagram to the device's
//! address, 1 = a datagram to the group, 2 = advance the clock by `len` ms and run timers,
//! 3 = poll every CQ and give the SRQ back as many WRs as completed. A datagram's last four
//! bytes are replaced by its correct ICRC, so the records reach the transport on stable too.
//!
//! The link keeps the datagrams the device sends, so tests can read its ACKs and NAKs.
//!
//! Checks (a panic is a finding): nothing panics; no byte that no key grants remote write
//! access to ever changes (`win` outside the type 2 window, `ro`, and the unused halves of the
//! receive slots); the SRQ never holds more WRs than its depth; every datagram the device
//! sends parses; tearing down QPs with lent
//! SRQ WRs, then the SRQ, windows and MRs, works.

use softroce::net::ManualClock;
use softroce::net::sim::RecordingLink;
use softroce::transport::{
    AccessFlags, Instant, PathMtu, QpCap, QpType, RecvWr, SendFlags, WcStatus,
};
use softroce::verbs::{
    Cq, Device, DeviceConfig, Gid, Mr, MwBind, MwType, Pd, Qp, QpInitAttr, RcConnect, Srq,
    SrqInitAttr, Wc,
};
use softroce::wire::{IcrcIp, ROCE_V2_UDP_PORT, RocePacket, icrc_of_datagram};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

/// The device's address.
pub const DEV_IP: Ipv4Addr = Ipv4Addr::new(10, 9, 0, 1);
/// The connected peer's address.
pub const PEER_IP: Ipv4Addr = Ipv4Addr::new(10, 9, 0, 2);
/// The peer's UDP source port.
pub const PEER_PORT: u16 = 0xc000;
/// The multicast group the UD QP joins.
pub const GROUP: Ipv4Addr = Ipv4Addr::new(239, 9, 0, 1);
/// Address `win` is registered at.
pub const WIN_VA: u64 = 0x1_0000_0000;
/// Address `ro` is registered at.
pub const RO_VA: u64 = 0x2_0000_0000;
/// The UD QP's Q_Key.
pub const UD_QKEY: u32 = 0x1111_1111;
/// First PSN both ways on the RC connections.
pub const RC_PSN: u32 = 0x100;
/// Byte every guarded buffer is filled with.
pub const FILL: u8 = 0xa5;
/// SRQ depth.
pub const SRQ_WR: u32 = 8;
/// Bytes of one receive slot (the WR gets the first half).
pub const SLOT: usize = 512;

/// How many of the newest datagrams the device sent the rig keeps (bounded, for long fuzz
/// runs).
const KEEP_SENT: usize = 256;

/// The fixed setup described in the module doc.
pub struct Rig {
    /// The device under attack.
    pub dev: Device,
    /// Its clock.
    pub clock: Arc<ManualClock>,
    /// Its link.
    pub link: Arc<RecordingLink>,
    /// Receive CQ of every QP (and send CQ).
    pub cq: Cq,
    /// The SRQ of `rc_a` and `rc_b`.
    pub srq: Srq,
    /// RC QP bound to the type 2 window.
    pub rc_a: Qp,
    /// Second RC QP on the same SRQ.
    pub rc_b: Qp,
    /// UD QP attached to [`GROUP`].
    pub ud: Qp,
    /// UD QP on the SRQ, also attached to [`GROUP`].
    pub ud_srq: Qp,
    /// The MR the windows open.
    pub win: Mr,
    /// Remote-read-only MR.
    pub ro: Mr,
    /// SRQ receive buffers.
    pub rbuf: Mr,
    /// UD receive buffers.
    pub ubuf: Mr,
    /// The type 2 window (bound to `rc_a`).
    pub mw2: softroce::verbs::Mw,
    /// The type 1 window.
    pub mw1: softroce::verbs::Mw,
    /// The protection domain.
    pub pd: Pd,
    /// Next SRQ slot to post.
    next_slot: usize,
    /// The clock's time, ns.
    now_ns: u64,
}

fn rc(pd: &Pd, cq: &Cq, srq: &Srq, dest: u32) -> Qp {
    let qp = pd
        .create_qp(&QpInitAttr {
            qp_type: QpType::Rc,
            send_cq: cq,
            recv_cq: cq,
            cap: QpCap::default(),
            sq_sig_all: false,
            srq: Some(srq),
        })
        .expect("create RC QP");
    let mut c = RcConnect::new(dest, Gid::from(PEER_IP), RC_PSN, RC_PSN);
    c.max_rd_atomic = 4;
    c.max_dest_rd_atomic = 4;
    c.path_mtu = PathMtu::Mtu256;
    qp.connect_rc(&c).expect("connect RC QP");
    qp
}

fn remote_all() -> AccessFlags {
    AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC
}

impl Rig {
    /// Builds the setup. Panics only if the library refuses a valid setup.
    pub fn new() -> Rig {
        let clock = Arc::new(ManualClock::new());
        let link = Arc::new(RecordingLink::keeping_last(KEEP_SENT));
        let dev = Device::new(
            DeviceConfig::new("softroce_fuzz", IpAddr::V4(DEV_IP)),
            link.clone(),
            clock.clone(),
        );
        let pd = dev.alloc_pd().expect("alloc_pd");
        let cq = dev.create_cq(4096).expect("create_cq");
        let srq = pd
            .create_srq(&SrqInitAttr {
                max_wr: SRQ_WR,
                max_sge: 2,
                srq_limit: 2,
            })
            .expect("create_srq");
        let rc_a = rc(&pd, &cq, &srq, 0x21);
        let rc_b = rc(&pd, &cq, &srq, 0x22);
        let ud = pd
            .create_qp(&QpInitAttr {
                qp_type: QpType::Ud,
                send_cq: &cq,
                recv_cq: &cq,
                cap: QpCap::default(),
                sq_sig_all: false,
                srq: None,
            })
            .expect("create UD QP");
        ud.ready_ud(UD_QKEY, 0).expect("ready_ud");
        ud.attach_mcast(&Gid::from(GROUP), 0).expect("attach_mcast");
        let ud_srq = pd
            .create_qp(&QpInitAttr {
                qp_type: QpType::Ud,
                send_cq: &cq,
                recv_cq: &cq,
                cap: QpCap::default(),
                sq_sig_all: false,
                srq: Some(&srq),
            })
            .expect("create UD QP on the SRQ");
        ud_srq.ready_ud(UD_QKEY, 0).expect("ready_ud");
        ud_srq
            .attach_mcast(&Gid::from(GROUP), 0)
            .expect("attach_mcast");

        // `win` and `ro` are fast-register MRs registered at fixed addresses, so that the
        // R_Keys and addresses the fuzzer must hit do not depend on the heap.
        let win = pd.alloc_mr(2).expect("alloc win");
        let ro = pd.alloc_mr(1).expect("alloc ro");
        rc_a.post_send(&[
            win.reg_wr(
                3,
                0x5a,
                WIN_VA,
                8192,
                AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND,
            ),
            ro.reg_wr(4, 0x6b, RO_VA, 4096, AccessFlags::REMOTE_READ),
        ])
        .expect("register win and ro");
        let rbuf = pd
            .reg_mr(SLOT * SRQ_WR as usize, AccessFlags::LOCAL_WRITE)
            .expect("reg rbuf");
        let ubuf = pd
            .reg_mr(4 * 4096, AccessFlags::LOCAL_WRITE)
            .expect("reg ubuf");
        for mr in [&win, &ro, &rbuf, &ubuf] {
            mr.write(0, &vec![FILL; mr.len()]).expect("fill");
        }
        let mw2 = pd.alloc_mw(MwType::Type2).expect("alloc type 2");
        let mw1 = pd.alloc_mw(MwType::Type1).expect("alloc type 1");
        rc_a.post_send(&[mw2.bind_wr(1, &win, WIN_VA + 1024, 1024, remote_all())])
            .expect("bind type 2");
        rc_a.bind_mw(
            &mw1,
            &MwBind {
                mr: &win,
                addr: WIN_VA + 4096,
                length: 512,
                access: AccessFlags::REMOTE_READ,
                wr_id: 2,
                send_flags: SendFlags::SIGNALED,
            },
        )
        .expect("bind type 1");
        let mut wc = [Wc::default(); 4];
        let n = cq.poll(&mut wc);
        assert_eq!(n, 4, "both registrations and both binds complete");
        assert!(wc[..n].iter().all(|w| w.status == WcStatus::Success));

        for i in 0..4 {
            ud.post_recv(&[RecvWr {
                wr_id: 0x100 + i,
                sg_list: vec![ubuf.sge(i as usize * 4096, 4096)],
            }])
            .expect("UD post_recv");
        }
        let mut rig = Rig {
            dev,
            clock,
            link,
            cq,
            srq,
            rc_a,
            rc_b,
            ud,
            ud_srq,
            win,
            ro,
            rbuf,
            ubuf,
            mw2,
            mw1,
            pd,
            next_slot: 0,
            now_ns: 0,
        };
        for _ in 0..SRQ_WR {
            rig.post_srq_one();
        }
        rig
    }

    /// Posts the next SRQ slot's WR; false when the SRQ refuses it (full).
    pub fn post_srq_one(&mut self) -> bool {
        let slot = self.next_slot % SRQ_WR as usize;
        let ok = self
            .srq
            .post_recv(&[RecvWr {
                wr_id: 0x1000 + slot as u64,
                sg_list: vec![self.rbuf.sge(slot * SLOT, (SLOT / 2) as u32)],
            }])
            .is_ok();
        if ok {
            self.next_slot += 1;
        }
        ok
    }

    /// The peer's socket address.
    pub fn peer() -> SocketAddr {
        SocketAddr::new(IpAddr::V4(PEER_IP), PEER_PORT)
    }

    /// Feeds `data` (its ICRC fixed for the destination `dst`) to the device.
    pub fn feed(&self, data: &[u8], multicast: bool) {
        let dst = if multicast { GROUP } else { DEV_IP };
        let mut d = data.to_vec();
        if d.len() >= 4 {
            let icrc = icrc_of_datagram(
                &IcrcIp::V4 {
                    src: PEER_IP,
                    dst,
                    ident: 0,
                    src_port: PEER_PORT,
                    dst_port: ROCE_V2_UDP_PORT,
                },
                &d,
            );
            let n = d.len();
            d[n - 4..].copy_from_slice(&icrc);
        }
        if multicast {
            self.dev
                .handle_multicast_datagram(Rig::peer(), IpAddr::V4(GROUP), &d);
        } else {
            self.dev.handle_datagram(Rig::peer(), &d);
        }
    }

    /// Advances the clock by `ms` milliseconds (at least 1) and runs due timers.
    pub fn advance(&mut self, ms: u64) {
        self.now_ns += Duration::from_millis(ms.max(1)).as_nanos() as u64;
        self.clock.set(Instant::from_nanos(self.now_ns));
        self.dev.handle_timeouts();
    }

    /// Polls the CQ dry and reposts one SRQ WR per SRQ receive completion.
    pub fn poll_and_repost(&mut self) {
        let mut wc = [Wc::default(); 64];
        loop {
            let n = self.cq.poll(&mut wc);
            if n == 0 {
                break;
            }
            let srq_done = wc[..n]
                .iter()
                .filter(|w| (0x1000..0x1000 + u64::from(SRQ_WR)).contains(&w.wr_id))
                .count();
            for _ in 0..srq_done {
                self.post_srq_one();
            }
        }
    }

    /// The invariants of the module doc.
    pub fn check(&self) {
        let w = self.win.to_vec();
        assert!(
            w[..1024].iter().chain(&w[2048..]).all(|&b| b == FILL),
            "win changed outside the type 2 window"
        );
        assert!(self.ro.to_vec().iter().all(|&b| b == FILL), "ro changed");
        let r = self.rbuf.to_vec();
        for (i, s) in r.chunks(SLOT).enumerate() {
            assert!(
                s[SLOT / 2..].iter().all(|&b| b == FILL),
                "receive slot {i} written past its SGE"
            );
        }
        assert!(self.srq.len() <= SRQ_WR as usize, "SRQ over its depth");
        // Whatever the device answered is a well-formed RoCEv2 packet.
        let sent = self.link.take();
        for t in &sent {
            assert!(
                RocePacket::parse(&t.payload[..]).is_ok(),
                "the device sent a malformed packet: {:02x?}",
                t.payload
            );
        }
    }

    /// Tears down in the order most likely to strand a lent SRQ WR: QPs first.
    pub fn teardown(self) {
        let Rig {
            dev,
            cq,
            mut srq,
            rc_a,
            rc_b,
            ud,
            ud_srq,
            win,
            ro,
            rbuf,
            ubuf,
            mw2,
            mw1,
            pd,
            ..
        } = self;
        drop(rc_a);
        drop(rc_b);
        drop(ud_srq);
        let _ = srq.destroy();
        drop(srq);
        drop(ud);
        drop((mw2, mw1, win, ro, rbuf, ubuf, pd));
        let mut wc = [Wc::default(); 64];
        while cq.poll(&mut wc) > 0 {}
        drop(cq);
        dev.handle_timeouts();
    }
}

impl Default for Rig {
    fn default() -> Rig {
        Rig::new()
    }
}

/// The fuzz check: runs the records of `data` against a fresh [`Rig`].
pub fn check_device(data: &[u8]) {
    let mut rig = Rig::new();
    let mut rest = data;
    let mut steps = 0;
    while rest.len() >= 3 && steps < 64 {
        steps += 1;
        let kind = rest[0] % 4;
        let len = usize::from(u16::from_be_bytes([rest[1], rest[2]]));
        rest = &rest[3..];
        match kind {
            0 | 1 => {
                let n = len.min(rest.len()).min(9000);
                rig.feed(&rest[..n], kind == 1);
                rest = &rest[n..];
            }
            2 => rig.advance((len % 4096) as u64),
            _ => rig.poll_and_repost(),
        }
        rig.check();
    }
    rig.poll_and_repost();
    rig.check();
    rig.teardown();
}
