//! `softroce pingpong --srq`: rdma-core's `ibv_srq_pingpong`, on a softroce device.
//!
//! Each side makes `-q` RC QPs (default 16) that share one CQ and one SRQ of `-r` receive WRs
//! (default 500), posts all of them, and exchanges addresses over TCP (port 18515 unless `-p`).
//! The exchange is rc_pingpong's 52-byte message (`"%04x:%06x:%06x:"`, the GID as 32 hex
//! digits, NUL), but sent 256 times each way whatever `-q` is (srq_pingpong's `MAX_QP`; the
//! entries past `-q` are all zeros): the client sends its 256, reads the server's 256 and
//! answers `"done"` plus NUL; the server reads the client's 256, takes its QPs to RTS, then
//! sends its own and reads the `"done"`. QP `i` of one side connects to QP `i` of the other.
//!
//! Run: the client posts one SEND on every QP. A QP posts its next SEND once both its last
//! SEND and the peer's next message have completed (the server starts by waiting for a
//! message), while fewer than `-n` SENDs (in total, over all QPs) have completed. A receive
//! completion is matched to its QP by the WC's `qp_num`; when only `-q` receives are left in
//! the SRQ it is refilled to `-r`. Both sides print `"N bytes in S seconds = R Mbit/sec"`
//! (N = size × iters × 2) and `"I iters in S seconds = U usec/iter"`. With `-e` the loop
//! sleeps on a completion channel (`ibv_get_cq_event`, `ibv_req_notify_cq`) instead of polling.
//!
//! Data: as for `--rc`, every received message must equal the session's first message (the
//! client's pattern). Messages land in a receive area of the MR and the server sends from a
//! send area holding the first message it received (srq_pingpong uses one buffer for both).
//! Source: rdma-core `libibverbs/examples/srq_pingpong.c` (`pp_init_ctx`, `pp_connect_ctx`,
//! `pp_client_exch_dest`, `pp_server_exch_dest`, `main`).

use super::{
    MSG_LEN, PingpongArgs, PingpongDest, RECV_WRID, SEND_WRID, check_same, chk_mark_pages,
    chk_verify_pages, connect_qp, counters_line, device_ip, fill_byte, print_result_lines, quiesce,
};
use crate::BoxError;
use crate::exchange;
use crate::stall::StallWatch;
use softroce::net::UdpDevice;
use softroce::net::oob::random_psn;
use softroce::verbs::{
    AccessFlags, Gid, PathMtu, Qp, QpAttr, QpAttrMask, QpCap, QpInitAttr, QpState, QpType, RecvWr,
    SendWr, Srq, SrqInitAttr, Wc, WcStatus, WrOpcode,
};
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener};
use std::time::Instant;

/// Address messages each side sends, whatever the number of QPs (srq_pingpong's `MAX_QP`).
pub const MAX_QP: usize = 256;

/// Runs `softroce pingpong --srq`.
pub fn run(a: PingpongArgs) -> Result<(), BoxError> {
    let num_qp_arg = a.num_qp.unwrap_or(16);
    let num_qp = num_qp_arg as usize;
    if num_qp == 0 || num_qp > MAX_QP {
        return Err(format!("-q {num_qp}: between 1 and {MAX_QP} QPs").into());
    }
    if num_qp_arg > a.rx_depth {
        return Err(format!(
            "rx_depth {} is too small for {num_qp_arg} QPs -- must have at least one receive per QP.",
            a.rx_depth
        )
        .into());
    }
    if a.ib_port != 1 {
        return Err(format!("device port {} does not exist (only port 1)", a.ib_port).into());
    }
    let mtu = PathMtu::from_bytes(a.mtu)
        .ok_or_else(|| format!("MTU {} is not one of 256, 512, 1024, 2048, 4096", a.mtu))?;
    if a.iters == 0 {
        return Err("iters must be at least 1".into());
    }
    let msg_size = a.size.unwrap_or(4096).max(1);
    let size = msg_size as usize;
    let ip = device_ip(a.ip)?;
    // The error names the device, its address and port, and a hint.
    let dev = UdpDevice::open(&a.ib_dev, ip)?;
    // Counters are watched from here: what the peer sends right after the exchange counts.
    let mut watch = StallWatch::new(&dev);
    let channel = if a.events {
        Some(dev.create_comp_channel()?)
    } else {
        None
    };
    let pd = dev.alloc_pd()?;
    // [0, size): SENDs go from here; [size, 2 × size): every receive lands here.
    super::check_size(&dev, size, 0)?;
    let mr = pd.reg_mr(2 * size, AccessFlags::LOCAL_WRITE)?;
    let cqe = a.rx_depth + num_qp_arg;
    let cq = match &channel {
        Some(ch) => dev.create_cq_with_channel(cqe, ch)?,
        None => dev.create_cq(cqe)?,
    };
    let srq = pd
        .create_srq(&SrqInitAttr {
            max_wr: a.rx_depth,
            max_sge: 1,
            srq_limit: 0,
        })
        .map_err(|e| format!("Couldn't create SRQ: {e}"))?;
    let mut qps = Vec::with_capacity(num_qp);
    for i in 0..num_qp {
        let qp = pd
            .create_qp(&QpInitAttr {
                qp_type: QpType::Rc,
                send_cq: &cq,
                recv_cq: &cq,
                cap: QpCap {
                    max_send_wr: 1,
                    max_recv_wr: 0,
                    max_send_sge: 1,
                    max_recv_sge: 0,
                    max_inline_data: 0,
                },
                sq_sig_all: false,
                srq: Some(&srq),
            })
            .map_err(|e| format!("Couldn't create QP[{i}]: {e}"))?;
        qp.modify(
            &QpAttr {
                qp_state: QpState::Init,
                pkey_index: 0,
                port_num: 1,
                qp_access_flags: AccessFlags::empty(),
                ..QpAttr::default()
            },
            QpAttrMask::STATE
                | QpAttrMask::PKEY_INDEX
                | QpAttrMask::PORT
                | QpAttrMask::ACCESS_FLAGS,
        )
        .map_err(|e| format!("Failed to modify QP[{i}] to INIT: {e}"))?;
        qps.push(qp);
    }
    let mut client_data: Vec<u8> = (0..size).map(fill_byte).collect();
    if a.chk && a.host.is_some() {
        chk_mark_pages(&mut client_data);
    }
    if a.host.is_some() {
        mr.write(0, &client_data)?;
    }
    let recv_wr = RecvWr {
        wr_id: RECV_WRID,
        sg_list: vec![mr.sge(size, msg_size)],
    };
    let mut routs = post_srq_recvs(&srq, &recv_wr, a.rx_depth);
    if routs < a.rx_depth {
        return Err(format!("Couldn't post receive ({routs})").into());
    }
    if let Some(_ch) = &channel {
        cq.req_notify(false)
            .map_err(|e| format!("Couldn't request CQ notification: {e}"))?;
    }
    let gid_index = a.gid_idx.unwrap_or(1);
    let gid = super::local_gid(&dev, gid_index, "-g")?;
    let mut me = [PingpongDest {
        lid: 0,
        qpn: 0,
        psn: 0,
        gid: Gid::ZERO,
    }; MAX_QP];
    for (d, qp) in me.iter_mut().zip(&qps) {
        *d = PingpongDest {
            lid: 0,
            qpn: qp.qp_num(),
            psn: random_psn(),
            gid,
        };
    }
    let connect_all = |peer: &[PingpongDest]| -> Result<(), BoxError> {
        for (i, qp) in qps.iter().enumerate() {
            // srq_pingpong puts the first entry's GID in every QP's GRH.
            let dest = PingpongDest {
                gid: peer[0].gid,
                ..peer[i]
            };
            connect_qp(qp, &dest, me[i].psn, mtu, gid_index)
                .map_err(|e| format!("QP[{i}]: {e}"))?;
        }
        Ok(())
    };
    let peer = match &a.host {
        Some(host) => {
            print_all(&me[..num_qp], "local address: ");
            let peer = client_exchange(host, a.port, &me)?;
            print_all(&peer[..num_qp], "remote address:");
            connect_all(&peer)?;
            peer
        }
        None => {
            let unspecified = if ip.is_ipv4() {
                IpAddr::V4(Ipv4Addr::UNSPECIFIED)
            } else {
                IpAddr::V6(Ipv6Addr::UNSPECIFIED)
            };
            let listener = TcpListener::bind(SocketAddr::new(unspecified, a.port))
                .map_err(|e| format!("Couldn't listen to port {}: {e}", a.port))?;
            print_all(&me[..num_qp], "local address: ");
            let peer = server_exchange(listener, &me, connect_all)?;
            print_all(&peer[..num_qp], "remote address:");
            peer
        }
    };
    drop(peer);

    // SENDs posted, for `--counters`: the last ones may still be unacknowledged when the loop
    // ends (and never complete if the peer has destroyed its QPs by then).
    let posted = std::cell::Cell::new(0u64);
    let send = |qp: &Qp| -> Result<(), BoxError> {
        qp.post_send(&[SendWr::new(
            SEND_WRID,
            WrOpcode::Send,
            vec![mr.sge(0, msg_size)],
        )])
        .map_err(|e| format!("Couldn't post send: {e}"))?;
        posted.set(posted.get() + 1);
        Ok(())
    };
    let mut pending = vec![RECV_WRID; num_qp];
    if a.host.is_some() {
        for (qp, p) in qps.iter().zip(pending.iter_mut()) {
            send(qp)?;
            *p = RECV_WRID | SEND_WRID;
        }
    }
    let start = Instant::now();
    let mut reference: Option<Vec<u8>> = a.host.as_ref().map(|_| client_data.clone());
    let (mut rcnt, mut scnt) = (0u32, 0u32);
    let mut num_cq_events = 0u32;
    let mut wcs = vec![Wc::default(); num_qp + a.rx_depth as usize];
    watch.progress();
    while rcnt < a.iters || scnt < a.iters {
        let n = super::next_completions(channel.as_ref(), &cq, &mut wcs, &mut num_cq_events)?;
        if n == 0 {
            let done = format!("{rcnt} of {} messages received, {scnt} sent", a.iters);
            watch.idle("pingpong", &done)?;
            continue;
        }
        watch.progress();
        for wc in &wcs[..n] {
            if wc.status != WcStatus::Success {
                return Err(format!(
                    "Failed status {} ({}) for wr_id {}",
                    wc.status, wc.status as u32, wc.wr_id
                )
                .into());
            }
            let qp_ind = qps
                .iter()
                .position(|q| q.qp_num() == wc.qp_num)
                .ok_or_else(|| format!("Couldn't find QPN {:06x}", wc.qp_num))?;
            match wc.wr_id {
                SEND_WRID => scnt += 1,
                RECV_WRID => {
                    routs -= 1;
                    if routs <= num_qp_arg {
                        routs += post_srq_recvs(&srq, &recv_wr, a.rx_depth - routs);
                        if routs < a.rx_depth {
                            return Err(format!("Couldn't post receive ({routs})").into());
                        }
                    }
                    rcnt += 1;
                    if wc.byte_len != msg_size {
                        return Err(format!(
                            "message {rcnt}: received {} bytes, expected {msg_size}",
                            wc.byte_len
                        )
                        .into());
                    }
                    let mut got = vec![0u8; size];
                    mr.read(size, &mut got)?;
                    match &reference {
                        Some(want) => check_same(want, &got, rcnt)?,
                        None => {
                            // The server sends back what the client sent.
                            mr.write(0, &got)?;
                            reference = Some(got);
                        }
                    }
                }
                other => return Err(format!("Completion for unknown wr_id {other}").into()),
            }
            let p = &mut pending[qp_ind];
            *p &= !wc.wr_id;
            if scnt < a.iters && *p == 0 {
                send(&qps[qp_ind])?;
                *p = RECV_WRID | SEND_WRID;
            }
        }
    }
    let elapsed = start.elapsed();
    if let Some(ch) = &channel {
        ch.ack_cq_events(&cq, num_cq_events)?;
    }
    if a.counters {
        quiesce(&dev);
    }
    let counters = counters_line(&dev);
    print_result_lines(msg_size, a.iters, elapsed);
    if a.chk
        && let Some(last) = &reference
    {
        chk_verify_pages(last)?;
    }
    println!(
        "data: {rcnt} received messages of {msg_size} bytes on {num_qp} QPs and one SRQ checked, each equal to the first message of the session"
    );
    if a.counters {
        println!("{counters}");
        println!("sends: posted={}", posted.get());
    }
    Ok(())
}

/// Posts up to `n` copies of `wr` to the SRQ; returns how many were posted
/// (srq_pingpong's `pp_post_recv`).
fn post_srq_recvs(srq: &Srq, wr: &RecvWr, n: u32) -> u32 {
    let mut posted = 0;
    while posted < n && srq.post_recv(std::slice::from_ref(wr)).is_ok() {
        posted += 1;
    }
    posted
}

fn print_all(dests: &[PingpongDest], which: &str) {
    for d in dests {
        d.print(which);
    }
}

fn write_all_dests<W: Write>(w: &mut W, dests: &[PingpongDest; MAX_QP]) -> std::io::Result<()> {
    let mut out = Vec::with_capacity(MAX_QP * MSG_LEN);
    for d in dests {
        out.extend_from_slice(&d.to_message());
    }
    w.write_all(&out)
}

fn read_all_dests<R: Read>(r: &mut R) -> Result<Vec<PingpongDest>, BoxError> {
    let mut dests = Vec::with_capacity(MAX_QP);
    let mut msg = [0u8; MSG_LEN];
    for i in 0..MAX_QP {
        r.read_exact(&mut msg)
            .map_err(|e| format!("Couldn't read remote address [{i}]: {e}"))?;
        dests.push(PingpongDest::from_message(&msg)?);
    }
    Ok(dests)
}

/// The peer's 256 address messages from the exchange connection (with its deadline).
fn read_dests_from(tcp: &mut exchange::Conn) -> Result<Vec<PingpongDest>, BoxError> {
    let mut all = vec![0u8; MAX_QP * MSG_LEN];
    tcp.read_exact(&mut all, "addresses")?;
    read_all_dests(&mut &all[..])
}

/// Client side of the exchange (srq_pingpong `pp_client_exch_dest`).
fn client_exchange(
    host: &str,
    port: u16,
    me: &[PingpongDest; MAX_QP],
) -> Result<Vec<PingpongDest>, BoxError> {
    let mut tcp = exchange::connect(host, port)?;
    write_all_dests(&mut *tcp, me).map_err(|e| format!("Couldn't send local address: {e}"))?;
    let peer = read_dests_from(&mut tcp)?;
    tcp.write_all(b"done\0")
        .map_err(|e| format!("client write: {e}"))?;
    Ok(peer)
}

/// Server side of the exchange (srq_pingpong `pp_server_exch_dest`): one client, whose QPs we
/// connect to before answering. The wait for a client has no deadline; the steps after it
/// have.
fn server_exchange(
    listener: TcpListener,
    me: &[PingpongDest; MAX_QP],
    connect: impl FnOnce(&[PingpongDest]) -> Result<(), BoxError>,
) -> Result<Vec<PingpongDest>, BoxError> {
    let (tcp, peer) = listener
        .accept()
        .map_err(|e| format!("accept() failed: {e}"))?;
    drop(listener);
    let mut tcp = exchange::Conn::accepted(tcp, peer);
    let peer = read_dests_from(&mut tcp)?;
    connect(&peer).map_err(|e| format!("Couldn't connect to remote QP: {e}"))?;
    write_all_dests(&mut *tcp, me).map_err(|e| format!("Couldn't send local address: {e}"))?;
    let mut done = [0u8; 5];
    tcp.read_exact(&mut done, "\"done\"")?;
    Ok(peer)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exchange_is_256_messages_with_zeros_past_the_qps_used() {
        let mut me = [PingpongDest {
            lid: 0,
            qpn: 0,
            psn: 0,
            gid: Gid::ZERO,
        }; MAX_QP];
        me[0] = PingpongDest {
            lid: 0,
            qpn: 0x11,
            psn: 0x12_3456,
            gid: Gid::from_ip("10.0.0.1".parse().unwrap()),
        };
        let mut wire = Vec::new();
        write_all_dests(&mut wire, &me).unwrap();
        assert_eq!(wire.len(), 256 * 52);
        assert_eq!(
            &wire[..52],
            b"0000:000011:123456:00000000000000000000ffff0a000001\0"
        );
        assert_eq!(
            &wire[52..104],
            b"0000:000000:000000:00000000000000000000000000000000\0"
        );
        let back = read_all_dests(&mut &wire[..]).unwrap();
        assert_eq!(back[..], me[..]);
    }
}
