//! Helpers shared by the loopback tests that open real UDP devices (IPv4, IPv6, exact ICRC,
//! captures): a connected RC pair and one round of every RC operation with its checks.

#![allow(dead_code)] // each test binary uses a different subset

use softroce::net::{UdpDevice, UdpOptions};
use softroce::verbs::{
    AccessFlags, Cq, DeviceConfig, Gid, Mr, PathMtu, Pd, Qp, QpCap, QpInitAttr, QpType, RcConnect,
    RecvWr, SendWr, Wc, WcFlags, WcOpcode, WcStatus, WrOpcode,
};
use std::io;
use std::net::IpAddr;
use std::time::Duration;

/// One device with a PD, a CQ and an RC QP.
pub struct Side {
    pub dev: UdpDevice,
    pub pd: Pd,
    pub cq: Cq,
    pub qp: Qp,
}

/// Opens a device on `ip` with `opts` and makes its PD, CQ and RC QP.
pub fn side(ip: IpAddr, opts: &UdpOptions) -> io::Result<Side> {
    let dev = UdpDevice::open_with_options(DeviceConfig::new("softroce_test", ip), opts)?;
    let pd = dev.alloc_pd().expect("alloc_pd");
    let cq = dev.create_cq(1024).expect("create_cq");
    let qp = pd
        .create_qp(&QpInitAttr {
            qp_type: QpType::Rc,
            send_cq: &cq,
            recv_cq: &cq,
            cap: QpCap {
                max_send_wr: 256,
                max_recv_wr: 256,
                ..QpCap::default()
            },
            sq_sig_all: false,
            srq: None,
        })
        .expect("create_qp");
    Ok(Side { dev, pd, cq, qp })
}

/// Connects the RC QPs of `a` and `b` (RESET → RTS, path MTU 1024, GIDs from the device
/// addresses: IPv4-mapped for IPv4, the address itself for IPv6).
pub fn connect(a: &Side, b: &Side) {
    for (me, peer, my_psn, peer_psn) in [(a, b, 0x00ff_fff0u32, 0x100), (b, a, 0x100, 0x00ff_fff0)]
    {
        let mut c = RcConnect::new(
            peer.qp.qp_num(),
            Gid::from_ip(peer.dev.ip()),
            peer_psn,
            my_psn,
        );
        c.path_mtu = PathMtu::Mtu1024;
        c.max_rd_atomic = 4;
        c.max_dest_rd_atomic = 4;
        c.timeout = 12;
        me.qp.connect_rc(&c).expect("connect_rc");
    }
}

/// Waits up to 20 s for one completion.
pub fn wait_one(cq: &Cq) -> Wc {
    let mut wc = [Wc::default()];
    let n = cq.wait(&mut wc, Duration::from_secs(20));
    assert_eq!(n, 1, "no completion within 20 s");
    wc[0]
}

/// Waits (up to 10 s, yielding) until `f` holds; panics naming `what` otherwise.
pub fn eventually(what: &str, f: impl Fn() -> bool) {
    let end = std::time::Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(
            std::time::Instant::now() < end,
            "timed out waiting for {what}"
        );
        std::thread::yield_now();
    }
}

/// An MR of `len` bytes with every access right.
pub fn mr(s: &Side, len: usize) -> Mr {
    let all = AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC;
    s.pd.reg_mr(len.max(8), all).expect("reg_mr")
}

/// Deterministic bytes.
pub fn pattern(len: usize, salt: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(salt))
        .collect()
}

/// One of each RC operation from `a` to `b`, each checked end to end: SEND (3 packets),
/// SEND_WITH_IMM, RDMA WRITE (3 packets), RDMA WRITE_WITH_IMM, RDMA READ (3 responses),
/// COMPARE_AND_SWAP, FETCH_AND_ADD. Returns how many operations completed.
pub fn every_rc_operation(a: &Side, b: &Side) -> usize {
    let len = 2500;
    let src = mr(a, len);
    let dst = mr(b, len);
    let data = pattern(len, 3);
    src.write(0, &data).expect("mr write");

    // SEND, then SEND_WITH_IMM.
    for (i, op) in [WrOpcode::Send, WrOpcode::SendWithImm]
        .into_iter()
        .enumerate()
    {
        b.qp.post_recv(&[RecvWr {
            wr_id: 100 + i as u64,
            sg_list: vec![dst.sge(0, len as u32)],
        }])
        .expect("post_recv");
        let mut w = SendWr::new(i as u64, op, vec![src.sge(0, len as u32)]);
        w.imm_data = u32::to_be(0xc0ff_ee00 + i as u32);
        a.qp.post_send(&[w]).expect("post_send");
        let s = wait_one(&a.cq);
        assert_eq!((s.status, s.wr_id), (WcStatus::Success, i as u64));
        let r = wait_one(&b.cq);
        assert_eq!((r.status, r.wr_id), (WcStatus::Success, 100 + i as u64));
        assert_eq!(r.byte_len as usize, len);
        assert_eq!(r.wc_flags.contains(WcFlags::WITH_IMM), i == 1);
        assert_eq!(dst.to_vec()[..len], data[..]);
    }

    // RDMA WRITE, then WRITE_WITH_IMM (which consumes a receive).
    let dst2 = mr(b, len);
    let mut w = SendWr::new(2, WrOpcode::RdmaWrite, vec![src.sge(0, len as u32)]);
    w.remote_addr = dst2.addr();
    w.rkey = dst2.rkey();
    a.qp.post_send(&[w]).expect("post_send");
    assert_eq!(wait_one(&a.cq).status, WcStatus::Success);
    assert_eq!(dst2.to_vec()[..len], data[..]);
    b.qp.post_recv(&[RecvWr {
        wr_id: 103,
        sg_list: vec![],
    }])
    .expect("post_recv");
    let mut w = SendWr::new(3, WrOpcode::RdmaWriteWithImm, vec![src.sge(0, 16)]);
    w.remote_addr = dst2.addr();
    w.rkey = dst2.rkey();
    w.imm_data = u32::to_be(0x1234_5678);
    a.qp.post_send(&[w]).expect("post_send");
    assert_eq!(wait_one(&a.cq).status, WcStatus::Success);
    let r = wait_one(&b.cq);
    assert_eq!(
        (r.status, r.opcode, u32::from_be(r.imm_data)),
        (WcStatus::Success, WcOpcode::RecvRdmaWithImm, 0x1234_5678)
    );

    // RDMA READ of 2500 bytes: FIRST, MIDDLE, LAST responses at MTU 1024.
    let back = mr(a, len);
    let mut w = SendWr::new(4, WrOpcode::RdmaRead, vec![back.sge(0, len as u32)]);
    w.remote_addr = dst2.addr();
    w.rkey = dst2.rkey();
    a.qp.post_send(&[w]).expect("post_send");
    let s = wait_one(&a.cq);
    assert_eq!(
        (s.status, s.opcode),
        (WcStatus::Success, WcOpcode::RdmaRead)
    );
    assert_eq!(back.to_vec()[..len], data[..]);

    // Atomics on the first 8 bytes of `dst2`.
    let old = u64::from_ne_bytes(dst2.to_vec()[..8].try_into().expect("8 bytes"));
    let mut w = SendWr::new(5, WrOpcode::AtomicCmpAndSwp, vec![back.sge(0, 8)]);
    w.remote_addr = dst2.addr();
    w.rkey = dst2.rkey();
    w.compare_add = old;
    w.swap = 41;
    a.qp.post_send(&[w]).expect("post_send");
    assert_eq!(wait_one(&a.cq).status, WcStatus::Success);
    let mut w = SendWr::new(6, WrOpcode::AtomicFetchAndAdd, vec![back.sge(8, 8)]);
    w.remote_addr = dst2.addr();
    w.rkey = dst2.rkey();
    w.compare_add = 1;
    a.qp.post_send(&[w]).expect("post_send");
    assert_eq!(wait_one(&a.cq).status, WcStatus::Success);
    assert_eq!(
        u64::from_ne_bytes(dst2.to_vec()[..8].try_into().expect("8 bytes")),
        42
    );
    7
}

/// tshark options that turn off the heuristic dissectors Wireshark tries on RDMA payloads
/// (RPC-over-RDMA, SMB Direct, NVMe/RDMA, iSER, …). The test payloads are none of these
/// protocols; with the heuristics on, RPC-over-RDMA claims some perftest and softroce payloads
/// and calls them malformed, which says nothing about the RoCE headers under test.
pub const TSHARK_NO_PAYLOAD_HEURISTICS: [&str; 16] = [
    "--disable-protocol",
    "rpcordma",
    "--disable-protocol",
    "smc",
    "--disable-protocol",
    "smb_direct",
    "--disable-protocol",
    "nvme-rdma",
    "--disable-protocol",
    "lnet",
    "--disable-protocol",
    "iser",
    "--disable-protocol",
    "infiniband_sdp",
    "--disable-protocol",
    "fcoib",
];
