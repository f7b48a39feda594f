//! spec/qp_states.toml against verbs::TRANSITIONS, row by row, and check_modify against both,
//! for every (from, to) pair and every QP type (RC, UC, UD, GSI): each listed transition with
//! exactly its required attributes succeeds, and with its optional ones too; leaving out any
//! one required attribute names it; adding any attribute outside required + optional names it
//! (EINVAL); every pair not listed is refused. Then, on a device (no sockets: a recording
//! link and a manual clock), what each state allows to be posted: post_send from RTS (SQD
//! queues but starts nothing), post_recv from INIT, and in ERR both accepted and flushed
//! with IBV_WC_WR_FLUSH_ERR.

use softroce::net::ManualClock;
use softroce::net::sim::RecordingLink;
use softroce::verbs::{
    AccessFlags, Device, DeviceConfig, Gid, QpAttr, QpAttrMask, QpCap, QpInitAttr, QpState, QpType,
    RecvWr, SendWr, TRANSITIONS, UdDest, Wc, WcStatus, WrOpcode, check_modify,
};
use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

#[derive(serde::Deserialize)]
struct File {
    transition: Vec<Row>,
}

#[derive(serde::Deserialize)]
struct Row {
    from: String,
    to: String,
    rc: Attrs,
    uc: Attrs,
    ud: Attrs,
    gsi: Attrs,
}

#[derive(serde::Deserialize)]
struct Attrs {
    required: Vec<String>,
    optional: Vec<String>,
}

const STATES: [QpState; 7] = [
    QpState::Reset,
    QpState::Init,
    QpState::Rtr,
    QpState::Rts,
    QpState::Sqd,
    QpState::Sqe,
    QpState::Err,
];

const TYPES: [QpType; 4] = [QpType::Rc, QpType::Uc, QpType::Ud, QpType::Gsi];

fn state(name: &str) -> QpState {
    *STATES
        .iter()
        .find(|s| s.name() == name)
        .unwrap_or_else(|| panic!("state {name}"))
}

fn mask(names: &[String]) -> QpAttrMask {
    names.iter().fold(QpAttrMask(0), |m, n| {
        m | QpAttrMask::from_name(n).unwrap_or_else(|| panic!("attribute {n}"))
    })
}

type Key = (u8, u8, u8);

/// (from, to, type) -> (required, optional), from the spec file.
fn spec() -> BTreeMap<Key, (QpAttrMask, QpAttrMask)> {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/spec/qp_states.toml"))
        .expect("spec/qp_states.toml");
    let f: File = toml::from_str(&text).expect("parses");
    let mut out = BTreeMap::new();
    for r in f.transition {
        for (t, a) in [
            (QpType::Rc, &r.rc),
            (QpType::Uc, &r.uc),
            (QpType::Ud, &r.ud),
            (QpType::Gsi, &r.gsi),
        ] {
            let key = (state(&r.from) as u8, state(&r.to) as u8, t as u8);
            let v = (mask(&a.required), mask(&a.optional));
            assert!(out.insert(key, v).is_none(), "{} -> {} twice", r.from, r.to);
        }
    }
    out
}

#[test]
fn the_rust_table_equals_the_spec_row_by_row() {
    let spec = spec();
    assert_eq!(spec.len(), TRANSITIONS.len() * TYPES.len(), "same rows");
    for t in TRANSITIONS {
        for ty in TYPES {
            let key = (t.from as u8, t.to as u8, ty as u8);
            let (req, opt) = spec
                .get(&key)
                .unwrap_or_else(|| panic!("{t:?} missing from the spec"));
            let p = t.params(ty);
            assert_eq!((p.required, p.optional), (*req, *opt), "{t:?} {ty:?}");
        }
    }
    // The pairs ib_core's qp_state_table marks valid: 22, no RESET -> ERR.
    assert_eq!(TRANSITIONS.len(), 22);
    assert!(!spec.contains_key(&(QpState::Reset as u8, QpState::Err as u8, 0)));
    // Spot checks against the kernel table: GSI goes to INIT without PORT; RC may set PORT in
    // SQD -> SQD; RTS -> SQD takes only EN_SQD_ASYNC_NOTIFY.
    let gsi_init = spec[&(QpState::Reset as u8, QpState::Init as u8, QpType::Gsi as u8)];
    assert_eq!(gsi_init.0, QpAttrMask::PKEY_INDEX | QpAttrMask::QKEY);
    let rc_sqd = spec[&(QpState::Sqd as u8, QpState::Sqd as u8, QpType::Rc as u8)];
    assert!(rc_sqd.1.contains(QpAttrMask::PORT));
}

#[test]
fn check_modify_follows_every_row_for_every_qp_type() {
    let mut checked = 0;
    for t in TRANSITIONS {
        for ty in TYPES {
            let p = t.params(ty);
            let attr = QpAttr {
                qp_state: t.to,
                cur_qp_state: t.from,
                ..QpAttr::default()
            };
            let base = QpAttrMask::STATE | p.required;
            let arrow = format!("modify_qp {}->{}", t.from.name(), t.to.name());
            assert_eq!(check_modify(ty, t.from, &attr, base), Ok(t.to), "{t:?}");
            assert_eq!(
                check_modify(ty, t.from, &attr, base | p.optional),
                Ok(t.to),
                "{arrow} {ty:?} with every optional attribute"
            );
            for (bit, name) in QpAttrMask::NAMES.iter().skip(1) {
                if p.required.contains(*bit) {
                    let e =
                        check_modify(ty, t.from, &attr, QpAttrMask(base.0 & !bit.0)).unwrap_err();
                    assert_eq!(e.to_string(), format!("{arrow}: missing {name}"));
                    assert_eq!(e.errno(), 22);
                } else if !p.optional.contains(*bit) {
                    let e = check_modify(ty, t.from, &attr, base | *bit).unwrap_err();
                    assert_eq!(
                        e.to_string(),
                        format!("{arrow}: attribute {name} not allowed"),
                        "{t:?} {ty:?}"
                    );
                    assert_eq!(e.errno(), 22);
                }
                checked += 1;
            }
        }
    }
    assert_eq!(checked, TRANSITIONS.len() * 4 * 20);
}

#[test]
fn unlisted_transitions_are_refused_for_every_qp_type() {
    let spec = spec();
    let mut refused = 0;
    for ty in TYPES {
        for from in STATES {
            for to in STATES {
                let attr = QpAttr {
                    qp_state: to,
                    ..QpAttr::default()
                };
                let listed = spec.contains_key(&(from as u8, to as u8, ty as u8));
                let r = check_modify(ty, from, &attr, QpAttrMask::STATE);
                if listed {
                    continue;
                }
                let e = r.expect_err("refused");
                assert_eq!(e.errno(), 22);
                assert_eq!(
                    e.to_string(),
                    format!(
                        "modify_qp {}->{}: transition not allowed for {ty:?} QPs",
                        from.name(),
                        to.name()
                    )
                );
                refused += 1;
            }
        }
    }
    // 49 pairs, 22 valid: 27 refused per type.
    assert_eq!(refused, 27 * 4);
}

#[test]
fn cur_state_is_checked_and_only_where_listed() {
    let mut attr = QpAttr {
        qp_state: QpState::Rts,
        cur_qp_state: QpState::Rts,
        ..QpAttr::default()
    };
    let m = QpAttrMask::STATE | QpAttrMask::CUR_STATE;
    assert_eq!(
        check_modify(QpType::Ud, QpState::Rts, &attr, m),
        Ok(QpState::Rts)
    );
    attr.cur_qp_state = QpState::Sqd;
    let e = check_modify(QpType::Ud, QpState::Rts, &attr, m).unwrap_err();
    assert_eq!(
        e.to_string(),
        "modify_qp RTS->RTS: CUR_STATE SQD does not match"
    );
    // ib_modify_qp_is_ok: CUR_STATE is not an attribute of a move to ERR.
    attr.qp_state = QpState::Err;
    attr.cur_qp_state = QpState::Rts;
    let e = check_modify(QpType::Rc, QpState::Rts, &attr, m).unwrap_err();
    assert_eq!(
        e.to_string(),
        "modify_qp RTS->ERR: attribute CUR_STATE not allowed"
    );
}

// ---- posting per state, on a device without sockets ----

const DEV_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 24, 1);
const PEER_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 24, 2);

fn device() -> (Device, Arc<RecordingLink>) {
    let link = Arc::new(RecordingLink::new());
    let dev = Device::new(
        DeviceConfig::new("softroce_states", IpAddr::V4(DEV_IP)),
        link.clone(),
        Arc::new(ManualClock::new()),
    );
    (dev, link)
}

fn to_state(qp: &softroce::verbs::Qp, ty: QpType, target: QpState) {
    let path: &[QpState] = match target {
        QpState::Reset => &[],
        QpState::Init => &[QpState::Init],
        QpState::Rtr => &[QpState::Init, QpState::Rtr],
        QpState::Rts => &[QpState::Init, QpState::Rtr, QpState::Rts],
        QpState::Sqd => &[QpState::Init, QpState::Rtr, QpState::Rts, QpState::Sqd],
        QpState::Err => &[QpState::Init, QpState::Err],
        QpState::Sqe => unreachable!("SQE is entered by a send error, not by modify_qp"),
    };
    for &s in path {
        let t = TRANSITIONS
            .iter()
            .find(|t| t.from == qp.state() && t.to == s)
            .expect("a row");
        let attr = QpAttr {
            qp_state: s,
            qkey: 0x1111,
            qp_access_flags: AccessFlags::LOCAL_WRITE,
            ah_attr: softroce::verbs::AhAttr::roce_v2(Gid::from(PEER_IP)),
            dest_qp_num: 0x99,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            ..QpAttr::default()
        };
        qp.modify(&attr, QpAttrMask::STATE | t.params(ty).required)
            .unwrap_or_else(|e| panic!("{ty:?} -> {s:?}: {e}"));
        assert_eq!(qp.state(), s);
    }
}

#[test]
fn posting_follows_the_qp_state() {
    for ty in [QpType::Rc, QpType::Uc, QpType::Ud] {
        for target in [
            QpState::Reset,
            QpState::Init,
            QpState::Rtr,
            QpState::Rts,
            QpState::Sqd,
            QpState::Err,
        ] {
            let (dev, link) = device();
            let pd = dev.alloc_pd().unwrap();
            let cq = dev.create_cq(64).unwrap();
            let mr = pd.reg_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
            let qp = pd
                .create_qp(&QpInitAttr {
                    qp_type: ty,
                    send_cq: &cq,
                    recv_cq: &cq,
                    cap: QpCap::default(),
                    sq_sig_all: true,
                    srq: None,
                })
                .unwrap();
            to_state(&qp, ty, target);
            link.clear();
            let mut send = SendWr::new(7, WrOpcode::Send, vec![mr.sge(0, 8)]);
            if ty == QpType::Ud {
                send.ud = Some(UdDest {
                    remote_ip: IpAddr::V4(PEER_IP),
                    remote_qpn: 0x99,
                    remote_qkey: 0x1111,
                    ip: Default::default(),
                });
            }
            let recv = RecvWr {
                wr_id: 8,
                sg_list: vec![mr.sge(0, 64)],
            };
            let s = qp.post_send(std::slice::from_ref(&send));
            let r = qp.post_recv(std::slice::from_ref(&recv));
            let what = format!("{ty:?} in {target:?}");
            // post_send: RTS and later (rxe `rxe_post_send` refuses before RTS).
            match target {
                QpState::Reset | QpState::Init | QpState::Rtr => {
                    let e = s.expect_err(&what);
                    assert_eq!((e.errno(), e.bad_wr()), (22, Some(0)), "{what}");
                }
                _ => s.unwrap_or_else(|e| panic!("{what}: {e}")),
            }
            // post_recv: INIT and later.
            if target == QpState::Reset {
                let e = r.expect_err(&what);
                assert_eq!((e.errno(), e.bad_wr()), (22, Some(0)), "{what}");
            } else {
                r.unwrap_or_else(|e| panic!("{what}: {e}"));
            }
            let sent = link.len();
            let mut wcs = [Wc::default(); 4];
            let n = cq.poll(&mut wcs);
            match target {
                QpState::Rts => assert_eq!((sent, n), (1, usize::from(ty != QpType::Rc))),
                // SQD: the WR waits in the send queue; nothing goes out, nothing completes.
                QpState::Sqd => assert_eq!((sent, n), (0, 0), "{what}"),
                QpState::Err => {
                    assert_eq!((sent, n), (0, 2), "{what}");
                    let ids: Vec<_> = wcs[..2].iter().map(|w| (w.wr_id, w.status)).collect();
                    assert_eq!(
                        ids,
                        [(7, WcStatus::WrFlushErr), (8, WcStatus::WrFlushErr)],
                        "{what}"
                    );
                }
                _ => assert_eq!((sent, n), (0, 0), "{what}"),
            }
            if target == QpState::Sqd {
                // SQD -> RTS resumes the queue: the waiting WR goes out.
                let attr = QpAttr {
                    qp_state: QpState::Rts,
                    ..QpAttr::default()
                };
                qp.modify(&attr, QpAttrMask::STATE).unwrap();
                assert_eq!(link.len(), 1, "{what} after SQD -> RTS");
            }
        }
    }
}

// ---- SQD on the engine: finish what was started, start nothing new ----

/// An RC QP in SQD finishes the message it was sending (also after a loss, by timeout) and
/// starts no new one; SQD -> RTS starts the queued WR. Source: rxe `req_next_wqe` (a WQE in
/// progress continues while the QP drains); IBTA ch. 10 (SQ drain).
#[test]
fn sqd_finishes_the_started_message_and_starts_no_new_one() {
    use softroce::transport::{Instant, MemoryTable, Path, QpAttrs, QpEngine, QpModify};
    use softroce::wire::{AethRepr, BthRepr, IcrcIp, Opcode, PacketRepr, Psn, RocePacket};
    let me = IpAddr::V4(DEV_IP);
    let peer = IpAddr::V4(PEER_IP);
    let mut e = QpEngine::new(0x11, QpType::Rc, 1, QpCap::default(), true);
    let attrs = QpAttrs {
        dest_qp_num: 0x22,
        timeout: 14,
        retry_cnt: 7,
        max_rd_atomic: 1,
        ..QpAttrs::default()
    };
    let path = Path {
        local: me,
        remote: peer,
        src_port: 0xc000,
        ip: Default::default(),
    };
    e.modify_to(QpState::Rts, &attrs, Some(path))
        .expect("RESET -> RTS");
    let to = |qp_state| QpModify {
        qp_state,
        ..QpModify::default()
    };
    let mut mem = MemoryTable::new(7);
    let key = mem.register(1, 8192, AccessFlags::LOCAL_WRITE).unwrap();
    let va = mem.get(key).unwrap().iova;
    let sge = |off: u64, len: u32| softroce::verbs::Sge {
        addr: va + off,
        length: len,
        lkey: key,
    };
    let psns = |e: &mut QpEngine, mem: &MemoryTable, now: Instant| -> Vec<u32> {
        std::iter::from_fn(|| e.poll_transmit(now, mem))
            .map(|t| RocePacket::parse(&t.payload).unwrap().repr.bth.psn.value())
            .collect()
    };
    // A 4-packet WRITE (path MTU 1024): two packets leave, then the QP enters SQD.
    let mut w1 = SendWr::new(1, WrOpcode::RdmaWrite, vec![sge(0, 4096)]);
    w1.remote_addr = 0x1000;
    w1.rkey = 0x99;
    e.post_send(w1).unwrap();
    let t0 = Instant::ZERO;
    assert!(e.poll_transmit(t0, &mem).is_some());
    assert!(e.poll_transmit(t0, &mem).is_some());
    assert_eq!(
        e.modify(&to(QpState::Sqd), QpAttrMask::STATE),
        Ok(QpState::Sqd)
    );
    // A new WR is accepted in SQD but waits.
    let mut w2 = SendWr::new(2, WrOpcode::RdmaWrite, vec![sge(4096, 8)]);
    w2.remote_addr = 0x2000;
    w2.rkey = 0x99;
    e.post_send(w2).unwrap();
    // The rest of the started WRITE goes out; nothing of WR 2.
    assert_eq!(psns(&mut e, &mem, t0), [2, 3]);
    // Lost: after the ACK timeout the message is resent from its first PSN, still in SQD.
    let later = e.poll_timeout().expect("retransmit timer armed in SQD");
    e.handle_timeout(later);
    assert_eq!(psns(&mut e, &mem, later), [0, 1, 2, 3]);
    // The ACK of PSN 3 completes WR 1; WR 2 still waits.
    let mut ack = PacketRepr::new(BthRepr::new(Opcode::RC_ACKNOWLEDGE, 0x11, Psn::new(3)));
    ack.aeth = Some(AethRepr {
        syndrome: 0x1f,
        msn: 1,
    });
    let mut buf = vec![0u8; ack.buffer_len()];
    let ip = IcrcIp::V4 {
        src: PEER_IP,
        dst: DEV_IP,
        ident: 0,
        src_port: 0xc000,
        dst_port: 4791,
    };
    ack.emit(&mut buf, &[], &ip);
    e.handle_packet(later, &RocePacket::parse(&buf).unwrap(), peer, &mut mem);
    let c = e.poll_completion().expect("WR 1 completes");
    assert_eq!((c.wc.wr_id, c.wc.status), (1, WcStatus::Success));
    assert!(psns(&mut e, &mem, later).is_empty());
    assert_eq!(e.sq_outstanding(), 1);
    // Back to RTS: WR 2 starts.
    assert_eq!(
        e.modify(&to(QpState::Rts), QpAttrMask::STATE),
        Ok(QpState::Rts)
    );
    assert_eq!(psns(&mut e, &mem, later), [4]);
}

/// The path of rows from `from` to `to` (breadth-first over TRANSITIONS), if any.
fn route(from: QpState, to: QpState) -> Option<Vec<QpState>> {
    let mut prev: BTreeMap<u8, QpState> = BTreeMap::new();
    let mut queue = std::collections::VecDeque::from([from]);
    let mut seen = vec![from];
    while let Some(s) = queue.pop_front() {
        if s == to {
            let mut path = vec![to];
            let mut cur = to;
            while cur != from {
                cur = prev[&(cur as u8)];
                path.push(cur);
            }
            path.reverse();
            return Some(path[1..].to_vec());
        }
        for t in TRANSITIONS.iter().filter(|t| t.from == s) {
            if !seen.contains(&t.to) {
                seen.push(t.to);
                prev.insert(t.to as u8, s);
                queue.push_back(t.to);
            }
        }
    }
    None
}

/// Every row of the table, for every QP type, through `Qp::modify` on a device: the QP is
/// first walked to the row's `from` state (rows are the only way), then the row with exactly
/// its required attributes succeeds and leaves the QP in `to`. SQE is not reachable with
/// modify_qp (a send error enters it), so its rows are covered by check_modify alone.
#[test]
fn every_row_succeeds_through_qp_modify_on_a_device() {
    let attr_for = |s: QpState| QpAttr {
        qp_state: s,
        qkey: 0x1111,
        qp_access_flags: AccessFlags::LOCAL_WRITE,
        ah_attr: softroce::verbs::AhAttr::roce_v2(Gid::from(PEER_IP)),
        dest_qp_num: 0x99,
        timeout: 14,
        retry_cnt: 7,
        rnr_retry: 7,
        min_rnr_timer: 12,
        max_rd_atomic: 1,
        max_dest_rd_atomic: 1,
        ..QpAttr::default()
    };
    let mut done = 0;
    for ty in TYPES {
        for t in TRANSITIONS.iter().filter(|t| t.from != QpState::Sqe) {
            let (dev, _link) = device();
            let pd = dev.alloc_pd().unwrap();
            let cq = dev.create_cq(16).unwrap();
            let qp = if ty == QpType::Gsi {
                dev.gsi_qp()
            } else {
                pd.create_qp(&QpInitAttr {
                    qp_type: ty,
                    send_cq: &cq,
                    recv_cq: &cq,
                    cap: QpCap::default(),
                    sq_sig_all: false,
                    srq: None,
                })
                .unwrap()
            };
            let step = |s: QpState| {
                let row = TRANSITIONS
                    .iter()
                    .find(|r| r.from == qp.state() && r.to == s)
                    .unwrap();
                qp.modify(&attr_for(s), QpAttrMask::STATE | row.params(ty).required)
            };
            if qp.state() != t.from {
                for s in route(qp.state(), t.from).expect("reachable") {
                    step(s).unwrap_or_else(|e| panic!("{ty:?} walking to {s:?}: {e}"));
                }
            }
            assert_eq!(qp.state(), t.from);
            step(t.to).unwrap_or_else(|e| panic!("{ty:?} {:?}->{:?}: {e}", t.from, t.to));
            assert_eq!(qp.state(), t.to, "{ty:?} {t:?}");
            done += 1;
        }
    }
    assert_eq!(done, 4 * (TRANSITIONS.len() - 3));
}
