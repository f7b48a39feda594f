//! The `ibverbs`-shaped API over real UDP on loopback (127.0.24.31 / 127.0.24.32; run inside
//! `unshare -n`): RC READ and WRITE with immediate, a UC WRITE, the errors of a handshake
//! without a GID and of an out-of-range attribute, errno through `std::io::Error`, and the
//! serde form of endpoints and remote slices.

use softroce_ibverbs::{
    AccessFlags, DeviceList, Gid, QpType, QueuePairEndpoint, RecvWr, RemoteMemorySlice, Wc,
    WcFlags, WcOpcode, WcStatus,
};
use std::time::Duration;

fn wait(cq: &softroce_ibverbs::CompletionQueue) -> Wc {
    let mut wc = [Wc::default()];
    let got = cq.wait(&mut wc, Duration::from_secs(10)).unwrap();
    assert_eq!(got.len(), 1, "no completion");
    got[0]
}

#[test]
fn rc_read_write_imm_uc_write_and_errors() {
    let list = DeviceList::with_ip(&[
        "127.0.24.31".parse().unwrap(),
        "127.0.24.32".parse().unwrap(),
    ]);
    let (a, b) = (list[0].open().unwrap(), list[1].open().unwrap());
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (ca, cb) = (a.create_cq(16, 1).unwrap(), b.create_cq(16, 2).unwrap());
    assert_eq!((ca.id(), cb.id()), (1, 2));
    let all = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;

    // RC: b's buffer is read by a, then written with immediate data.
    let qa = pa
        .create_qp(&ca, &ca, QpType::Rc)
        .set_access(all)
        .set_max_send_wr(8)
        .build()
        .unwrap();
    let qb = pb
        .create_qp(&cb, &cb, QpType::Rc)
        .set_access(all)
        .set_max_recv_wr(8)
        .build()
        .unwrap();
    let (ea, eb) = (qa.endpoint(), qb.endpoint());
    assert_eq!(
        ea.gid,
        Some(Gid::from(std::net::Ipv4Addr::new(127, 0, 24, 31)))
    );
    let mut qa = qa.handshake(eb).unwrap();
    let mut qb = qb.handshake(ea).unwrap();
    let theirs = pb.register(&[7u8; 256]).unwrap();
    let mine = pa.allocate(256).unwrap();
    qa.post_read(&[mine.slice(0..256)], theirs.remote(), 1)
        .unwrap();
    let wc = wait(&ca);
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode),
        (1, WcStatus::Success, WcOpcode::RdmaRead)
    );
    assert_eq!(mine.to_vec(), vec![7u8; 256]);

    mine.write(0, b"imm!").unwrap();
    qb.post_receive(&[RecvWr {
        wr_id: 9,
        sg_list: vec![],
    }])
    .unwrap();
    qa.post_write(
        &[mine.slice(0..4)],
        theirs.remote().slice(100..104),
        2,
        Some(0xfeed),
    )
    .unwrap();
    assert_eq!(wait(&ca).status, WcStatus::Success);
    let r = wait(&cb);
    assert_eq!(
        (r.wr_id, r.opcode, r.imm_data),
        (9, WcOpcode::RecvRdmaWithImm, 0xfeed)
    );
    assert!(r.wc_flags.contains(WcFlags::WITH_IMM));
    assert_eq!(&theirs.to_vec()[100..104], b"imm!");

    // UC WRITE.
    let ua = pa.create_qp(&ca, &ca, QpType::Uc).build().unwrap();
    let ub = pb
        .create_qp(&cb, &cb, QpType::Uc)
        .set_access(AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
        .build()
        .unwrap();
    let (eua, eub) = (ua.endpoint(), ub.endpoint());
    let mut ua = ua.handshake(eub).unwrap();
    let _ub = ub.handshake(eua).unwrap();
    ua.post_write(&[mine.slice(0..4)], theirs.remote().slice(0..4), 3, None)
        .unwrap();
    assert_eq!(wait(&ca).status, WcStatus::Success);
    let end = std::time::Instant::now() + Duration::from_secs(10);
    while &theirs.to_vec()[..4] != b"imm!" {
        assert!(std::time::Instant::now() < end, "UC WRITE did not land");
        std::thread::yield_now();
    }

    // Errors: no GID; a timeout exponent over 31 (named); errno through io::Error.
    let p = pa.create_qp(&ca, &ca, QpType::Rc).build().unwrap();
    let e = p
        .handshake(QueuePairEndpoint {
            num: 0x11,
            lid: 0,
            gid: None,
        })
        .unwrap_err();
    assert_eq!(e.errno(), 22);
    let p = pa
        .create_qp(&ca, &ca, QpType::Rc)
        .set_timeout(32)
        .build()
        .unwrap();
    let e = p.handshake(eb).unwrap_err();
    assert_eq!(e.to_string(), "modify_qp RTR->RTS: TIMEOUT out of range");
    let io: std::io::Error = e.into();
    assert_eq!(io.kind(), std::io::ErrorKind::InvalidInput);
    assert!(a.create_cq(-1, 0).is_err());
    assert_eq!(a.gid(2).unwrap_err().errno(), 22);
}

#[test]
fn endpoints_and_remote_slices_round_trip_through_json() {
    let e = QueuePairEndpoint {
        num: 0x12_3456,
        lid: 0,
        gid: Some(Gid::from(std::net::Ipv4Addr::new(10, 1, 2, 3))),
    };
    let text = serde_json::to_string(&e).unwrap();
    assert_eq!(text, r#"{"num":1193046,"lid":0,"gid":"::ffff:10.1.2.3"}"#);
    assert_eq!(serde_json::from_str::<QueuePairEndpoint>(&text).unwrap(), e);
    assert!(serde_json::from_str::<QueuePairEndpoint>(r#"{"num":1,"lid":0,"gid":"x"}"#).is_err());
    let r = RemoteMemorySlice {
        addr: 0x1000,
        length: 64,
        rkey: 0x1234,
    };
    assert_eq!(
        r.slice(8..200),
        RemoteMemorySlice {
            addr: 0x1008,
            length: 56,
            rkey: 0x1234
        }
    );
    let back: RemoteMemorySlice =
        serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
    assert_eq!(back, r);
}
