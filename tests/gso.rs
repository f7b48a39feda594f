//! The batched data path on loopback: UDP GSO on send, UDP GRO on receive, and their
//! fallbacks (`sendmmsg` when GSO is refused, one system call per datagram with
//! `UdpOptions::no_offload`), each checked for data integrity and datagram / system-call
//! counts. Addresses 127.0.24.x, port 4791.

mod support;

use softroce::net::{UdpLink, UdpOptions};
use softroce::verbs::{PathMtu, SendWr, WcStatus, WrOpcode};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::Ordering::Relaxed;
use support::{Side, mr, pattern, side, wait_one};

const LEN: usize = 1 << 20;

fn pair(n: u8, a_opts: &UdpOptions, b_opts: &UdpOptions) -> (Side, Side) {
    let ip = |h| IpAddr::V4(Ipv4Addr::new(127, 0, 24, 2 * n + h));
    let a = side(ip(1), a_opts).expect("device a");
    let b = side(ip(2), b_opts).expect("device b");
    for (me, peer, mine, theirs) in [(&a, &b, 10, 20), (&b, &a, 20, 10)] {
        let mut c = softroce::verbs::RcConnect::new(
            peer.qp.qp_num(),
            softroce::verbs::Gid::from_ip(peer.dev.ip()),
            theirs,
            mine,
        );
        c.path_mtu = PathMtu::Mtu4096;
        c.max_rd_atomic = 4;
        c.max_dest_rd_atomic = 4;
        // ACK timeout 4.096 us x 2^20 = 4.3 s: a debug build on a loaded machine (the
        // plain receiver solves for every segment's IP ID) must not retry, so that any
        // drop or retransmission left means a real loss.
        c.timeout = 20;
        me.qp.connect_rc(&c).expect("connect_rc");
    }
    (a, b)
}

/// WRITEs 1 MiB from a to b and READs it back into a; checks both copies.
fn write_and_read_back(a: &Side, b: &Side) {
    let src = mr(a, LEN);
    let dst = mr(b, LEN);
    let back = mr(a, LEN);
    let data = pattern(LEN, 41);
    src.write(0, &data).unwrap();
    let mut w = SendWr::new(1, WrOpcode::RdmaWrite, vec![src.sge(0, LEN as u32)]);
    w.remote_addr = dst.addr();
    w.rkey = dst.rkey();
    a.qp.post_send(&[w]).unwrap();
    assert_eq!(wait_one(&a.cq).status, WcStatus::Success);
    assert!(dst.to_vec() == data, "WRITE data differs");
    let mut r = SendWr::new(2, WrOpcode::RdmaRead, vec![back.sge(0, LEN as u32)]);
    r.remote_addr = dst.addr();
    r.rkey = dst.rkey();
    a.qp.post_send(&[r]).unwrap();
    assert_eq!(wait_one(&a.cq).status, WcStatus::Success);
    assert!(back.to_vec() == data, "READ data differs");
}

struct Counts {
    tx: u64,
    rx: u64,
    tx_calls: u64,
    gso: u64,
    gro: u64,
}

fn counts(l: &UdpLink) -> Counts {
    Counts {
        tx: l.tx_datagrams.load(Relaxed),
        rx: l.rx_datagrams.load(Relaxed),
        tx_calls: l.tx_syscalls.load(Relaxed),
        gso: l.tx_gso_sends.load(Relaxed),
        gro: l.rx_gro_buffers.load(Relaxed),
    }
}

/// Every datagram sent was received and handled, none dropped (a segment with a wrong ICRC
/// would count as an ICRC drop) and none retransmitted.
fn assert_clean(a: &Side, b: &Side) {
    // Let datagrams still in flight (a last re-ACK) land; bounded.
    for _ in 0..200 {
        let (ca, cb) = (counts(a.dev.link()), counts(b.dev.link()));
        if ca.tx == cb.rx && cb.tx == ca.rx {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let (ca, cb) = (counts(a.dev.link()), counts(b.dev.link()));
    assert_eq!(ca.tx, cb.rx, "a -> b datagrams");
    assert_eq!(cb.tx, ca.rx, "b -> a datagrams");
    for s in [a, b] {
        let c = s.dev.counters();
        assert_eq!(c.dropped_total(), 0, "{:?}", c.entries());
        assert_eq!(c.sent_pkts, counts(s.dev.link()).tx);
        assert_eq!(
            c.completer_retry_err + c.out_of_seq_request + c.duplicate_request,
            0,
            "{:?}",
            c.entries()
        );
    }
}

/// Posts `count` WRITEs of `len` bytes from a to b in one call (WR i from offset i·len of
/// a pattern to the same offset of b's MR, wr_id i), checks they complete in order and the
/// data arrived, and that the link stayed clean (`assert_clean`).
fn write_in_order(a: &Side, b: &Side, count: u64, len: usize, seed: u8) {
    let total = count as usize * len;
    let (src, dst) = (mr(a, total), mr(b, total));
    let data = pattern(total, seed);
    src.write(0, &data).unwrap();
    let wrs: Vec<SendWr> = (0..count)
        .map(|i| {
            let at = i as usize * len;
            let mut w = SendWr::new(i, WrOpcode::RdmaWrite, vec![src.sge(at, len as u32)]);
            w.remote_addr = dst.addr() + at as u64;
            w.rkey = dst.rkey();
            w
        })
        .collect();
    a.qp.post_send(&wrs).unwrap();
    for i in 0..count {
        let wc = wait_one(&a.cq);
        assert_eq!((wc.status, wc.wr_id), (WcStatus::Success, i));
    }
    assert!(dst.to_vec() == data, "WRITE data differs");
    assert_clean(a, b);
}

#[test]
fn gso_send_and_gro_receive_keep_every_packet_whole() {
    let (a, b) = pair(0, &UdpOptions::default(), &UdpOptions::default());
    assert!(
        a.dev.link().gso() && b.dev.link().gro(),
        "kernel without UDP GSO/GRO"
    );
    write_and_read_back(&a, &b);
    assert_clean(&a, &b);
    let (ca, cb) = (counts(a.dev.link()), counts(b.dev.link()));
    // 1 MiB at MTU 4096 is 256 WRITE packets one way and 256 READ responses the other.
    assert!(ca.tx >= 256 && cb.tx >= 256);
    // Both bulk directions went out in GSO sends of several segments each, and the
    // receivers got GRO buffers holding several datagrams.
    assert!(ca.gso > 0 && cb.gso > 0);
    assert!(
        ca.tx_calls * 4 < ca.tx,
        "a: {} calls for {} datagrams",
        ca.tx_calls,
        ca.tx
    );
    assert!(
        cb.tx_calls * 4 < cb.tx,
        "b: {} calls for {} datagrams",
        cb.tx_calls,
        cb.tx
    );
    assert!(ca.gro > 0 && cb.gro > 0);
}

#[test]
fn gso_to_a_receiver_without_gro_checks_each_segment_by_its_ip_id() {
    // b cuts nothing itself: the kernel segments a's GSO sends on receive and gives
    // segment i IPv4 ID i, which b's plain-UDP ICRC check must solve for.
    let plain = UdpOptions {
        no_offload: true,
        ..UdpOptions::default()
    };
    let (a, b) = pair(1, &UdpOptions::default(), &plain);
    assert!(!b.dev.link().gro());
    write_and_read_back(&a, &b);
    assert_clean(&a, &b);
    assert!(counts(a.dev.link()).gso > 0);
    assert_eq!(counts(b.dev.link()).gso, 0);
    assert_eq!(counts(b.dev.link()).tx_calls, counts(b.dev.link()).tx);
}

#[test]
fn sendmmsg_fallback_when_gso_is_refused() {
    let (a, b) = pair(2, &UdpOptions::default(), &UdpOptions::default());
    a.dev.link().disable_gso();
    b.dev.link().disable_gso();
    write_and_read_back(&a, &b);
    assert_clean(&a, &b);
    for s in [&a, &b] {
        let c = counts(s.dev.link());
        assert_eq!(c.gso, 0);
        assert!(
            c.tx_calls * 4 < c.tx,
            "{} calls for {} datagrams",
            c.tx_calls,
            c.tx
        );
    }
}

#[test]
fn no_offload_sends_one_datagram_per_call() {
    let plain = UdpOptions {
        no_offload: true,
        ..UdpOptions::default()
    };
    let (a, b) = pair(3, &plain, &plain);
    write_and_read_back(&a, &b);
    assert_clean(&a, &b);
    for s in [&a, &b] {
        let c = counts(s.dev.link());
        assert_eq!((c.gso, c.gro), (0, 0));
        assert_eq!(c.tx_calls, c.tx);
        assert!(c.tx >= 256);
    }
}

/// b receives a GSO batch of 64 one-packet WRITEs (as GRO buffers) under one hold of its
/// device and answers each QP once at the end of the receive: the 64 ACK requests coalesce
/// into the newest ACK (ACKs are cumulative), counted in `ack_deferred`, and a gets every
/// completion in order from those few ACKs.
#[test]
fn acks_of_one_receive_batch_coalesce() {
    let (a, b) = pair(4, &UdpOptions::default(), &UdpOptions::default());
    write_in_order(&a, &b, 64, 64, 9);
    let cb = counts(b.dev.link());
    let deferred = b.dev.counters().ack_deferred;
    assert_eq!(
        cb.tx + deferred,
        64,
        "every ACK request is answered by an ACK sent or coalesced into a later one"
    );
    assert!(
        cb.tx <= 16,
        "b sent {} ACKs for 64 WRITEs in one batch",
        cb.tx
    );
    assert!(
        cb.tx_calls <= cb.tx,
        "b: {} calls for {} ACKs",
        cb.tx_calls,
        cb.tx
    );
}

/// Request payloads are sent straight from the MR when a packet's bytes lie in one SGE
/// (`Link::gathers`), and copied when they span SGEs. A SEND of an odd length (BTH pad)
/// gathered from three SGEs whose boundaries fall inside packets, then inside one packet,
/// arrives intact over GSO, over plain sendmmsg and one datagram per call, with every
/// ICRC accepted.
#[test]
fn payloads_gathered_from_the_mr_or_copied_across_sges_arrive_intact() {
    let plain = UdpOptions {
        no_offload: true,
        ..UdpOptions::default()
    };
    for (n, opts, no_gso) in [
        (5, UdpOptions::default(), false),
        (6, UdpOptions::default(), true),
        (7, plain, false),
    ] {
        let (a, b) = pair(n, &opts, &opts);
        if no_gso {
            a.dev.link().disable_gso();
        }
        // No capture: the link takes payloads left in the MR.
        assert!(softroce::verbs::Link::gathers(a.dev.link()));
        const MSG: usize = 3 * 4096 + 333;
        let src = mr(&a, 2 * MSG);
        let dst = mr(&b, MSG);
        let data = pattern(2 * MSG, n);
        src.write(0, &data).unwrap();
        // SGEs of 5000, 3192 and 4429 bytes, path MTU 4096: packet 0 (bytes 0..4096) lies
        // in SGE 0 (gathered), packet 1 spans the SGE boundary at 5000 (copied), packet 2
        // (8192..12288) and the last (333 bytes and a 3-byte pad) lie in SGE 2 (gathered).
        let cuts = [0usize, 5000, 8192, MSG];
        let sges: Vec<_> = cuts
            .windows(2)
            .map(|w| src.sge(w[0] + 7, (w[1] - w[0]) as u32))
            .collect();
        b.qp.post_recv(&[softroce::verbs::RecvWr {
            wr_id: 9,
            sg_list: vec![dst.sge(0, MSG as u32)],
        }])
        .unwrap();
        a.qp.post_send(&[SendWr::new(1, WrOpcode::Send, sges)])
            .unwrap();
        assert_eq!(wait_one(&a.cq).status, WcStatus::Success);
        let r = wait_one(&b.cq);
        assert_eq!((r.status, r.byte_len), (WcStatus::Success, MSG as u32));
        assert!(
            dst.to_vec() == data[7..7 + MSG],
            "SEND data differs (case {n})"
        );
        assert_clean(&a, &b);
    }
}

/// A 64 KiB WRITE at path MTU 4096 is two GSO sends: its FIRST packet carries the RETH and
/// is 16 bytes longer than the MIDDLE ones, and GSO segments are equal but the last. Both,
/// and those of the next messages the window allows, leave in one `sendmmsg`: eight
/// 64 KiB WRITEs posted together take fewer system calls than GSO sends, and arrive intact.
#[test]
fn the_gso_sends_of_a_window_share_one_system_call() {
    let (a, b) = pair(8, &UdpOptions::default(), &UdpOptions::default());
    if !a.dev.link().gso() {
        eprintln!("kernel without UDP GSO: nothing to batch");
        return;
    }
    write_in_order(&a, &b, 8, 64 << 10, 11);
    let ca = counts(a.dev.link());
    assert_eq!(ca.tx, 8 * 16, "16 packets per message");
    assert!(ca.gso >= 16, "a: {} GSO sends for 8 messages", ca.gso);
    assert!(
        ca.tx_calls < ca.gso,
        "a: {} system calls for {} GSO sends",
        ca.tx_calls,
        ca.gso
    );
}
