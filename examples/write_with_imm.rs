//! RDMA WRITE with immediate: the client writes batches into a ring in the server's memory;
//! each WRITE carries its batch number (in network byte order) as immediate data and consumes
//! one receive at the server, whose work completion tells it which batch just landed — with
//! no extra message. Two devices in one process (127.0.0.1, 127.0.0.2).
//!
//! Run: `cargo run --example write_with_imm`

use softroce::net::UdpDevice;
use softroce::verbs::{
    AccessFlags, Gid, QpCap, QpInitAttr, QpType, RcConnect, RecvWr, SendWr, Wc, WcFlags, WcOpcode,
    WcStatus, WrOpcode,
};
use std::error::Error;
use std::time::Duration;

const BATCH: usize = 1024;
const BATCHES: u32 = 8;

fn main() -> Result<(), Box<dyn Error>> {
    let server = UdpDevice::open("softroce0", "127.0.0.1".parse()?)?;
    let client = UdpDevice::open("softroce1", "127.0.0.2".parse()?)?;
    let (spd, cpd) = (server.alloc_pd()?, client.alloc_pd()?);
    let (scq, ccq) = (server.create_cq(64)?, client.create_cq(64)?);
    let init = |cq| QpInitAttr {
        qp_type: QpType::Rc,
        send_cq: cq,
        recv_cq: cq,
        cap: QpCap::default(),
        sq_sig_all: true,
        srq: None,
    };
    let sqp = spd.create_qp(&init(&scq))?;
    let cqp = cpd.create_qp(&init(&ccq))?;
    sqp.connect_rc(&RcConnect::new(
        cqp.qp_num(),
        Gid::from_ip(client.ip()),
        7,
        9,
    ))?;
    cqp.connect_rc(&RcConnect::new(
        sqp.qp_num(),
        Gid::from_ip(server.ip()),
        9,
        7,
    ))?;

    let ring = spd.reg_mr(
        BATCH * BATCHES as usize,
        AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
    )?;
    let src = cpd.reg_mr(BATCH, AccessFlags::LOCAL_WRITE)?;
    // One receive per expected WRITE_WITH_IMM; it needs no buffer.
    for i in 0..BATCHES {
        sqp.post_recv(&[RecvWr {
            wr_id: u64::from(i),
            sg_list: vec![],
        }])?;
    }
    for seq in 0..BATCHES {
        src.write(0, &vec![seq as u8 + b'A'; BATCH])?;
        let mut wr = SendWr::new(
            u64::from(seq),
            WrOpcode::RdmaWriteWithImm,
            vec![src.sge(0, BATCH as u32)],
        );
        wr.remote_addr = ring.addr() + u64::from(seq) * BATCH as u64;
        wr.rkey = ring.rkey();
        wr.imm_data = seq.to_be();
        cqp.post_send(&[wr])?;
        let mut wc = [Wc::default()];
        // The client's completion means the data is acknowledged; reuse the buffer after it.
        if ccq.wait(&mut wc, Duration::from_secs(5)) != 1 || wc[0].status != WcStatus::Success {
            return Err("WRITE_WITH_IMM did not complete".into());
        }
    }
    let mut wcs = [Wc::default(); BATCHES as usize];
    let mut got = 0;
    while got < wcs.len() {
        let n = scq.wait(&mut wcs[got..], Duration::from_secs(5));
        if n == 0 {
            return Err("server saw too few completions".into());
        }
        got += n;
    }
    for wc in &wcs {
        assert_eq!(
            (wc.status, wc.opcode),
            (WcStatus::Success, WcOpcode::RecvRdmaWithImm)
        );
        assert!(wc.wc_flags.contains(WcFlags::WITH_IMM));
        let seq = u32::from_be(wc.imm_data);
        let mut landed = vec![0u8; BATCH];
        ring.read(seq as usize * BATCH, &mut landed)?;
        let ok = landed.iter().all(|b| *b == seq as u8 + b'A');
        println!(
            "[server] batch {seq} landed: {} bytes of '{}' ({})",
            wc.byte_len,
            (seq as u8 + b'A') as char,
            if ok { "intact" } else { "CORRUPT" }
        );
        if !ok {
            return Err("batch corrupt".into());
        }
    }
    Ok(())
}
