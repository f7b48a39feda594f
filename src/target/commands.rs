//! The commands that act on the QP and MRs: `connect`, `post_recv`, `post_send`, `dump_mr`,
//! `write_mr`, `counters` and `query_qp`.

use super::args::{CmdArgs, CmdError};
use super::completions::post_recvs;
use super::state::{MAX_DUMP_BYTES, MAX_RECV_DEPTH, Target};
use super::text::{hex, unhex};
use serde_json::{Map, Value, json};
use softroce::verbs::{Gid, Mr, QpAttr, QpAttrMask as A, QpState, RcConnect, SendWr, WrOpcode};
use std::net::IpAddr;
use std::sync::atomic::Ordering;

/// `connect`: RESET (if needed) → INIT → RTR → RTS towards the peer, then the receives.
pub(super) fn cmd_connect(t: &Target, a: &CmdArgs<'_>) -> Result<Value, CmdError> {
    a.only(&[
        "dest_qpn",
        "dest_psn",
        "dest_gid",
        "timeout",
        "retry_cnt",
        "rnr_retry",
        "traffic_class",
        "hop_limit",
    ])?;
    let dest_qpn = a.need_uint("dest_qpn", 0x00ff_ffff)? as u32;
    // The requester's retry settings (ibv_qp_attr): 5-bit local ACK timeout code, 3-bit
    // counts (rnr_retry 7 = retry for ever).
    let timeout = a.uint("timeout", 31)?.unwrap_or(14) as u8;
    let retry_cnt = a.uint("retry_cnt", 7)?.unwrap_or(7) as u8;
    let rnr_retry = a.uint("rnr_retry", 7)?.unwrap_or(7) as u8;
    let dest_psn = a.uint("dest_psn", 0x00ff_ffff)?.unwrap_or(0) as u32;
    // The address vector's IP header fields (IPv4 TOS / IPv6 traffic class, TTL / hop limit).
    let traffic_class = a.uint("traffic_class", 0xff)?.unwrap_or(0) as u8;
    let hop_limit = a.uint("hop_limit", 0xff)?.unwrap_or(64) as u8;
    let gid_text = a
        .string("dest_gid")?
        .ok_or_else(|| a.err("missing field \"dest_gid\""))?;
    let dgid = gid_text
        .trim()
        .parse::<IpAddr>()
        .map(Gid::from_ip)
        .map_err(|_| a.err(format!("dest_gid: {gid_text:?} is not a GID or IP address")))?;
    let s = t.set;
    let mut reported = t.reported.lock();
    let mut book = t.recv.lock();
    let mut reset = t.qp.state() == QpState::Reset;
    let result = (|| -> Result<(), String> {
        if !reset {
            let attr = QpAttr {
                qp_state: QpState::Reset,
                ..QpAttr::default()
            };
            t.qp.modify(&attr, A::STATE)
                .map_err(|e| format!("to RESET: {e}"))?;
            reset = true;
        }
        let c = RcConnect {
            path_mtu: s.path_mtu,
            qp_access_flags: s.qp_access,
            timeout,
            retry_cnt,
            rnr_retry,
            min_rnr_timer: s.min_rnr_timer,
            max_rd_atomic: 1,
            max_dest_rd_atomic: s.max_dest_rd_atomic,
            traffic_class,
            hop_limit,
            ..RcConnect::new(dest_qpn, dgid, dest_psn, s.sq_psn)
        };
        t.qp.connect_rc(&c).map_err(|e| e.to_string())
    })();
    if reset {
        // RESET dropped every posted receive: every slot is free again.
        book.posted.clear();
        book.free = (0..s.recv_depth).rev().collect();
    }
    *reported = t.qp.state();
    drop(book);
    drop(reported);
    if let Err(e) = result {
        return Err(a.err(format!("{e} (QP now {})", t.qp.state().name())));
    }
    let posted = if s.no_recv {
        Vec::new()
    } else {
        post_recvs(t, s.recv_depth, s.recv_size, true).map_err(|e| a.err(e))?
    };
    Ok(json!({"connect": {
        "ok": true,
        "state": t.qp.state().name(),
        "qpn": t.qp.qp_num(),
        "dest_qpn": dest_qpn,
        "dest_gid": dgid.to_string(),
        "rq_psn": dest_psn,
        "sq_psn": s.sq_psn,
        "timeout": timeout,
        "retry_cnt": retry_cnt,
        "rnr_retry": rnr_retry,
        "traffic_class": traffic_class,
        "hop_limit": hop_limit,
        "recv_posted": posted.len(),
    }}))
}

/// `post_recv`: `count` receives (default 1) of `length` bytes (default `--recv-size`).
/// Under `--no-recv` they are not re-posted when they complete.
pub(super) fn cmd_post_recv(t: &Target, a: &CmdArgs<'_>) -> Result<Value, CmdError> {
    a.only(&["count", "length"])?;
    let count = a.uint("count", u64::from(MAX_RECV_DEPTH))?.unwrap_or(1) as u32;
    let length = a
        .uint("length", u64::from(t.set.recv_size))?
        .map_or(t.set.recv_size, |l| l as u32);
    if t.qp.state() == QpState::Reset {
        return Err(a.err("the QP is in RESET: connect first"));
    }
    let ids = post_recvs(t, count, length, !t.set.no_recv).map_err(|e| a.err(e))?;
    let outstanding = t.recv.lock().posted.len();
    Ok(json!({"post_recv": {
        "posted": ids.len(),
        "wr_ids": ids,
        "length": length,
        "outstanding": outstanding,
    }}))
}

/// `post_send`: one signaled SEND, RDMA WRITE or RDMA READ from (READ: into) bytes
/// `offset..offset + length` of MR `index`; WRITE and READ go to `remote_addr` / `rkey`. The
/// WR's completion comes as a `wc` line like any other.
pub(super) fn cmd_post_send(t: &Target, a: &CmdArgs<'_>) -> Result<Value, CmdError> {
    a.only(&[
        "opcode",
        "index",
        "offset",
        "length",
        "remote_addr",
        "rkey",
        "imm_data",
        "wr_id",
    ])?;
    let op_text = a.string("opcode")?.ok_or_else(|| {
        a.err("missing field \"opcode\" (send, send_imm, write, write_imm or read)")
    })?;
    let opcode = match op_text {
        "send" => WrOpcode::Send,
        "send_imm" => WrOpcode::SendWithImm,
        "write" => WrOpcode::RdmaWrite,
        "write_imm" => WrOpcode::RdmaWriteWithImm,
        "read" => WrOpcode::RdmaRead,
        other => {
            return Err(a.err(format!(
                "opcode {other:?}: use send, send_imm, write, write_imm or read"
            )));
        }
    };
    let with_imm = matches!(opcode, WrOpcode::SendWithImm | WrOpcode::RdmaWriteWithImm);
    if !with_imm && a.map.contains_key("imm_data") {
        return Err(a.err("only send_imm and write_imm take imm_data"));
    }
    let imm_data = a.uint("imm_data", u64::from(u32::MAX))?.unwrap_or(0) as u32;
    let (mr, index) = if a.map.contains_key("index") {
        mr_arg(t, a)?
    } else {
        let mr = t
            .mrs
            .first()
            .ok_or_else(|| a.err("there is no MR 0: give index"))?;
        (mr, Value::from(0))
    };
    let (offset, length) = range_arg(a, mr, None)?;
    let length32 = u32::try_from(length)
        .map_err(|_| a.err(format!("length {length} does not fit in 32 bits")))?;
    let remote = !matches!(opcode, WrOpcode::Send | WrOpcode::SendWithImm);
    let (remote_addr, rkey) = if remote {
        (
            a.need_uint("remote_addr", u64::MAX)?,
            a.need_uint("rkey", u64::from(u32::MAX))? as u32,
        )
    } else {
        if a.map.contains_key("remote_addr") || a.map.contains_key("rkey") {
            return Err(a.err("a send takes no remote_addr or rkey"));
        }
        (0, 0)
    };
    let wr_id = a.uint("wr_id", u64::MAX)?.unwrap_or(1);
    let mut wr = SendWr::new(wr_id, opcode, vec![mr.sge(offset as usize, length32)]);
    wr.remote_addr = remote_addr;
    wr.rkey = rkey;
    wr.imm_data = imm_data;
    t.qp.post_send(&[wr]).map_err(|e| a.err(e.to_string()))?;
    Ok(json!({"post_send": {
        "wr_id": wr_id,
        "opcode": op_text,
        "index": index,
        "offset": offset,
        "length": length,
        "remote_addr": remote_addr,
        "rkey": rkey,
        "imm_data": imm_data,
    }}))
}

/// The MR named by `index` (a number, or `"recv"` for the receive MR).
fn mr_arg<'t>(t: &'t Target, a: &CmdArgs<'_>) -> Result<(&'t Mr, Value), CmdError> {
    match a.map.get("index") {
        None => Err(a.err("missing field \"index\"")),
        Some(Value::String(s)) if s == "recv" => Ok((&t.recv_mr, Value::from("recv"))),
        Some(_) => {
            let i = a.need_uint("index", u64::MAX)?;
            let mr = usize::try_from(i)
                .ok()
                .and_then(|i| t.mrs.get(i))
                .ok_or_else(|| {
                    a.err(format!(
                        "no MR {i}: there are {} MRs, from index 0, and \"recv\"",
                        t.mrs.len()
                    ))
                })?;
            Ok((mr, Value::from(i)))
        }
    }
}

/// `offset` (default 0) and `length` (default: to the end) within `mr`.
fn range_arg(a: &CmdArgs<'_>, mr: &Mr, default_len: Option<u64>) -> Result<(u64, u64), CmdError> {
    let size = mr.len() as u64;
    let offset = a.uint("offset", u64::MAX)?.unwrap_or(0);
    if offset > size {
        return Err(a.err(format!("offset {offset} is past the MR's {size} bytes")));
    }
    let length = match a.uint("length", u64::MAX)? {
        Some(l) => l,
        None => default_len.unwrap_or(size - offset),
    };
    if length > size - offset {
        return Err(a.err(format!(
            "offset {offset} + length {length} is past the MR's {size} bytes"
        )));
    }
    Ok((offset, length))
}

/// `dump_mr`: bytes of an MR as hex.
pub(super) fn cmd_dump_mr(t: &Target, a: &CmdArgs<'_>) -> Result<Value, CmdError> {
    a.only(&["index", "offset", "length"])?;
    let (mr, index) = mr_arg(t, a)?;
    let (offset, length) = range_arg(a, mr, None)?;
    if length > MAX_DUMP_BYTES {
        return Err(a.err(format!(
            "length {length}: at most {MAX_DUMP_BYTES} bytes per dump_mr"
        )));
    }
    let mut data = vec![0u8; length as usize];
    mr.read(offset as usize, &mut data)
        .map_err(|e| a.err(e.to_string()))?;
    Ok(json!({"dump_mr": {
        "index": index,
        "va": mr.addr() + offset,
        "offset": offset,
        "length": length,
        "hex": hex(&data),
    }}))
}

/// `write_mr`: bytes into an MR, given as `hex` or as `fill` (a byte) repeated `length` times.
pub(super) fn cmd_write_mr(t: &Target, a: &CmdArgs<'_>) -> Result<Value, CmdError> {
    a.only(&["index", "offset", "hex", "fill", "length"])?;
    let (mr, index) = mr_arg(t, a)?;
    let data = match (a.string("hex")?, a.uint("fill", 0xff)?) {
        (Some(h), None) => {
            if a.map.contains_key("length") {
                return Err(a.err("give length with fill, not with hex"));
            }
            unhex(h).ok_or_else(|| a.err("hex: not an even number of hex digits"))?
        }
        (None, Some(byte)) => {
            let (_, length) = range_arg(a, mr, None)?;
            vec![byte as u8; length as usize]
        }
        _ => return Err(a.err("give exactly one of hex or fill")),
    };
    let offset = a.uint("offset", u64::MAX)?.unwrap_or(0);
    let fits = offset
        .checked_add(data.len() as u64)
        .is_some_and(|end| end <= mr.len() as u64);
    if !fits {
        return Err(a.err(format!(
            "offset {offset} + {} bytes is past the MR's {} bytes",
            data.len(),
            mr.len()
        )));
    }
    mr.write(offset as usize, &data)
        .map_err(|e| a.err(e.to_string()))?;
    Ok(json!({"write_mr": {
        "index": index,
        "offset": offset,
        "length": data.len(),
    }}))
}

/// `counters`: the device's counters (rxe hw_counters names, then one per drop reason,
/// e.g. `icrc_errors`), CNPs ignored, and datagrams through the UDP socket.
pub(super) fn cmd_counters(t: &Target) -> Value {
    let mut m = Map::new();
    for (name, v) in t.dev.counters().entries() {
        m.insert(name.into(), v.into());
    }
    m.insert("rp_cnp_ignored".into(), t.dev.rp_cnp_ignored().into());
    let link = t.dev.link();
    m.insert(
        "rx_datagrams".into(),
        link.rx_datagrams.load(Ordering::Relaxed).into(),
    );
    m.insert(
        "tx_datagrams".into(),
        link.tx_datagrams.load(Ordering::Relaxed).into(),
    );
    json!({ "counters": m })
}

/// `query_qp`: the QP's state and numbers.
pub(super) fn cmd_query_qp(t: &Target) -> Value {
    let book = t.recv.lock();
    json!({"query_qp": {
        "qpn": t.qp.qp_num(),
        "state": t.qp.state().name(),
        "sq_psn": t.set.sq_psn,
        "recv_outstanding": book.posted.len(),
        "recv_free_slots": book.free.len(),
    }})
}
