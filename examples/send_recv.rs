//! SEND/RECV ping-pong between two softroce devices in one process (127.0.0.1 and
//! 127.0.0.2), like `ibv_rc_pingpong`: each side posts a receive, the client SENDs, the
//! server answers with a SEND of its own, `ITERS` times; the message sizes cross the path MTU
//! so that FIRST/MIDDLE/LAST segmentation is used.
//!
//! Run: `cargo run --example send_recv`

use softroce::net::UdpDevice;
use softroce::verbs::{
    AccessFlags, Cq, Gid, Mr, QpCap, QpInitAttr, QpType, RcConnect, RecvWr, SendWr, Wc, WcOpcode,
    WcStatus, WrOpcode,
};
use std::error::Error;
use std::time::{Duration, Instant};

const SIZE: usize = 2500;
const ITERS: u64 = 5;

fn wait(cq: &Cq) -> Result<Wc, Box<dyn Error>> {
    let mut wc = [Wc::default()];
    if cq.wait(&mut wc, Duration::from_secs(5)) != 1 {
        return Err("no completion within 5 s".into());
    }
    if wc[0].status != WcStatus::Success {
        return Err(format!("work completion failed: {}", wc[0].status).into());
    }
    Ok(wc[0])
}

fn main() -> Result<(), Box<dyn Error>> {
    let server = UdpDevice::open("softroce0", "127.0.0.1".parse()?)?;
    let client = UdpDevice::open("softroce1", "127.0.0.2".parse()?)?;
    let mut ends = Vec::new();
    for dev in [&server, &client] {
        let pd = dev.alloc_pd()?;
        let cq = dev.create_cq(16)?;
        let qp = pd.create_qp(&QpInitAttr {
            qp_type: QpType::Rc,
            send_cq: &cq,
            recv_cq: &cq,
            cap: QpCap::default(),
            sq_sig_all: true,
            srq: None,
        })?;
        let mr: Mr = pd.reg_mr(SIZE, AccessFlags::LOCAL_WRITE)?;
        ends.push((pd, cq, qp, mr));
    }
    let (s, c) = (&ends[0], &ends[1]);
    // The out-of-band exchange is a plain function call here: both QPs live in one process.
    s.2.connect_rc(&RcConnect::new(
        c.2.qp_num(),
        Gid::from_ip(client.ip()),
        100,
        200,
    ))?;
    c.2.connect_rc(&RcConnect::new(
        s.2.qp_num(),
        Gid::from_ip(server.ip()),
        200,
        100,
    ))?;

    let start = Instant::now();
    for i in 0..ITERS {
        let ping: Vec<u8> = (0..SIZE).map(|k| (k as u64 + i) as u8).collect();
        s.2.post_recv(&[RecvWr {
            wr_id: i,
            sg_list: vec![s.3.sge(0, SIZE as u32)],
        }])?;
        c.2.post_recv(&[RecvWr {
            wr_id: i,
            sg_list: vec![c.3.sge(0, SIZE as u32)],
        }])?;
        c.3.write(0, &ping)?;
        c.2.post_send(&[SendWr::new(
            i,
            WrOpcode::Send,
            vec![c.3.sge(0, SIZE as u32)],
        )])?;
        let got = wait(&s.1)?;
        assert_eq!(got.opcode, WcOpcode::Recv);
        assert_eq!(s.3.to_vec(), ping, "server got the client's bytes");
        // Pong: the server sends the same bytes back.
        s.2.post_send(&[SendWr::new(
            i,
            WrOpcode::Send,
            vec![s.3.sge(0, SIZE as u32)],
        )])?;
        // Server: its SEND completion; client: its SEND completion and the RECV.
        wait(&s.1)?;
        let mut seen_recv = false;
        for _ in 0..2 {
            seen_recv |= wait(&c.1)?.opcode == WcOpcode::Recv;
        }
        assert!(seen_recv);
        println!(
            "iteration {i}: {SIZE} bytes each way, {} bytes back intact",
            c.3.to_vec().len()
        );
    }
    let us = start.elapsed().as_micros() as f64 / ITERS as f64;
    println!(
        "{ITERS} iters of {SIZE} bytes in {:.0} µs/iter (RC SEND FIRST/MIDDLE/LAST at MTU 1024)",
        us
    );
    Ok(())
}
