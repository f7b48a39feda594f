//! RDMA READ: the server exposes a buffer with REMOTE_READ; the client pulls 1 MiB of it into
//! its own memory with one READ work request (the responder answers with READ RESPONSE
//! FIRST/MIDDLE/LAST packets, one per path-MTU of data). Two devices in one process.
//!
//! Run: `cargo run --example read`

use softroce::net::UdpDevice;
use softroce::verbs::{
    AccessFlags, Gid, PathMtu, QpCap, QpInitAttr, QpType, RcConnect, SendWr, Wc, WcStatus, WrOpcode,
};
use std::error::Error;
use std::time::{Duration, Instant};

const LEN: usize = 1 << 20;

fn main() -> Result<(), Box<dyn Error>> {
    let server = UdpDevice::open("softroce0", "127.0.0.1".parse()?)?;
    let client = UdpDevice::open("softroce1", "127.0.0.2".parse()?)?;
    let (spd, cpd) = (server.alloc_pd()?, client.alloc_pd()?);
    let (scq, ccq) = (server.create_cq(16)?, client.create_cq(16)?);
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
    let mut to_client = RcConnect::new(cqp.qp_num(), Gid::from_ip(client.ip()), 1, 2);
    let mut to_server = RcConnect::new(sqp.qp_num(), Gid::from_ip(server.ip()), 2, 1);
    to_client.path_mtu = PathMtu::Mtu4096;
    to_server.path_mtu = PathMtu::Mtu4096;
    sqp.connect_rc(&to_client)?;
    cqp.connect_rc(&to_server)?;

    let exposed = spd.reg_mr(LEN, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ)?;
    let data: Vec<u8> = (0..LEN).map(|i| (i % 251) as u8).collect();
    exposed.write(0, &data)?;
    let local = cpd.reg_mr(LEN, AccessFlags::LOCAL_WRITE)?;

    let mut wr = SendWr::new(1, WrOpcode::RdmaRead, vec![local.sge(0, LEN as u32)]);
    wr.remote_addr = exposed.addr();
    wr.rkey = exposed.rkey();
    let start = Instant::now();
    cqp.post_send(&[wr])?;
    let mut wc = [Wc::default()];
    if ccq.wait(&mut wc, Duration::from_secs(10)) != 1 {
        return Err("no READ completion".into());
    }
    let took = start.elapsed();
    if wc[0].status != WcStatus::Success {
        return Err(format!("READ failed: {}", wc[0].status).into());
    }
    let same = local.to_vec() == data;
    println!(
        "[client] RDMA READ of {} bytes from addr {:#x} rkey {:#x}: {} in {:?}, data {}",
        wc[0].byte_len,
        exposed.addr(),
        exposed.rkey(),
        wc[0].status,
        took,
        if same { "identical" } else { "DIFFERENT" }
    );
    if !same {
        return Err("READ data differs".into());
    }
    Ok(())
}
