//! Start-up: checking the options, opening the device, creating the QP and MRs, and the
//! `ready` line that describes them.

use super::options::TargetArgs;
use super::state::{
    MAX_MRS, MAX_RECV_DEPTH, MAX_SEND_WR, MAX_TOTAL_MR_BYTES, RecvBook, Settings, Target,
};
use super::text::{access_json, parse_access};
use crate::BoxError;
use parking_lot::Mutex;
use serde_json::{Value, json};
use softroce::net::UdpDevice;
use softroce::net::oob::random_psn;
use softroce::verbs::{AccessFlags, Gid, Mr, PathMtu, QpCap, QpInitAttr, QpState, QpType};
use std::collections::HashMap;
use std::sync::atomic::AtomicBool;

pub(super) fn setup(a: &TargetArgs) -> Result<Target, BoxError> {
    let path_mtu = PathMtu::from_bytes(a.path_mtu).ok_or_else(|| {
        format!(
            "--path-mtu {} is not one of 256, 512, 1024, 2048, 4096",
            a.path_mtu
        )
    })?;
    if a.min_rnr_timer > 31 {
        return Err(format!("--min-rnr-timer {} is not a 5-bit code", a.min_rnr_timer).into());
    }
    if a.recv_depth == 0 || a.recv_depth > MAX_RECV_DEPTH {
        return Err(format!("--recv-depth must be 1..={MAX_RECV_DEPTH}").into());
    }
    if a.recv_size == 0 {
        return Err("--recv-size must be at least 1".into());
    }
    let mr_access = parse_access(&a.access).map_err(|e| format!("--access: {e}"))?;
    let qp_access = match &a.qp_access {
        Some(l) => parse_access(l).map_err(|e| format!("--qp-access: {e}"))?,
        None => mr_access,
    };
    let count = a.mr_count.unwrap_or(a.mr_size.len());
    if count > MAX_MRS {
        return Err(format!("at most {MAX_MRS} MRs").into());
    }
    let sizes: Vec<usize> = match (a.mr_count, a.mr_size.as_slice()) {
        (Some(n), [size]) => vec![*size; n],
        (Some(_), _) => return Err("--mr-count takes exactly one --mr-size".into()),
        (None, sizes) => sizes.to_vec(),
    };
    let recv_bytes = u64::from(a.recv_depth) * u64::from(a.recv_size);
    let total = sizes
        .iter()
        .fold(recv_bytes, |sum, s| sum.saturating_add(*s as u64));
    if total > MAX_TOTAL_MR_BYTES {
        return Err(format!(
            "MRs and receive slots would take {total} bytes; the limit is {MAX_TOTAL_MR_BYTES}"
        )
        .into());
    }
    let ip = crate::pingpong::device_ip(a.ip)?;
    // One datagram per system call: the target's answers are checked byte for byte by
    // peers that see no IP header and assume IPv4 ID 0 on every datagram (docs/wire-facts.md §0.2), which
    // a UDP GSO send gives only its first segment (segment i carries ID i).
    let opts = softroce::net::UdpOptions {
        no_offload: true,
        ..softroce::net::UdpOptions::process_default()
    };
    let cfg = softroce::verbs::DeviceConfig::new(&a.ib_dev, ip);
    // The error names the device, its address and port, and a hint.
    let dev = UdpDevice::open_with_options(cfg, &opts)?;
    let pd = dev.alloc_pd()?;
    let cq = dev.create_cq(a.recv_depth + 64)?;
    let qp = pd.create_qp(&QpInitAttr {
        qp_type: QpType::Rc,
        send_cq: &cq,
        recv_cq: &cq,
        cap: QpCap {
            max_send_wr: MAX_SEND_WR,
            max_recv_wr: a.recv_depth,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        },
        sq_sig_all: false,
        srq: None,
    })?;
    let mut mrs = Vec::with_capacity(sizes.len());
    for (i, size) in sizes.iter().enumerate() {
        mrs.push(
            pd.reg_mr(*size, mr_access)
                .map_err(|e| format!("MR {i} ({size} bytes): {e}"))?,
        );
    }
    let recv_mr = pd
        .reg_mr(recv_bytes as usize, AccessFlags::LOCAL_WRITE)
        .map_err(|e| format!("receive MR: {e}"))?;
    let set = Settings {
        path_mtu,
        mr_access,
        qp_access,
        min_rnr_timer: a.min_rnr_timer,
        max_dest_rd_atomic: a.max_dest_rd_atomic,
        sq_psn: a.psn.unwrap_or_else(random_psn) & 0x00ff_ffff,
        no_recv: a.no_recv,
        recv_depth: a.recv_depth,
        recv_size: a.recv_size,
    };
    let book = RecvBook {
        free: (0..a.recv_depth).rev().collect(),
        posted: HashMap::new(),
        next_wr_id: 1,
    };
    Ok(Target {
        qp,
        mrs,
        recv_mr,
        cq,
        _pd: pd,
        dev,
        set,
        recv: Mutex::new(book),
        reported: Mutex::new(QpState::Reset),
        stop: AtomicBool::new(false),
        out_broken: AtomicBool::new(false),
    })
}

fn mr_json(index: Value, mr: &Mr, access: AccessFlags) -> Value {
    json!({
        "index": index,
        "va": mr.addr(),
        "rkey": mr.rkey(),
        "lkey": mr.lkey(),
        "length": mr.len(),
        "access": access_json(access),
    })
}

pub(super) fn ready_json(t: &Target) -> Value {
    let mrs: Vec<Value> = t
        .mrs
        .iter()
        .enumerate()
        .map(|(i, m)| mr_json(i.into(), m, t.set.mr_access))
        .collect();
    json!({"ready": {
        "device": t.dev.name(),
        "ip": t.dev.ip().to_string(),
        "gid": Gid::from_ip(t.dev.ip()).to_string(),
        "gid_index": 1,
        "qpn": t.qp.qp_num(),
        "psn": t.set.sq_psn,
        "path_mtu": t.set.path_mtu.bytes(),
        "qp_access": access_json(t.set.qp_access),
        "min_rnr_timer": t.set.min_rnr_timer,
        "max_dest_rd_atomic": t.set.max_dest_rd_atomic,
        "recv": {
            "depth": t.set.recv_depth,
            "size": t.set.recv_size,
            "auto": !t.set.no_recv,
        },
        "mrs": mrs,
        "recv_mr": mr_json("recv".into(), &t.recv_mr, AccessFlags::LOCAL_WRITE),
    }})
}
