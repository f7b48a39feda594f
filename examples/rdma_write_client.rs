//! The classic RDMA WRITE example, client side.
//!
//! The client connects an RC QP with the server over TCP, receives the server's packed
//! {addr u64, rkey u32, len u32}, RDMA-WRITEs a greeting straight into that buffer, polls its
//! CQ for the completion, then tells the server over TCP.
//!
//! Run: `cargo run --example rdma_write_client -- [CLIENT_IP] [SERVER_IP] [TCP_PORT]`
//! (defaults 127.0.0.2 127.0.0.1 18515) after starting the server.

use softroce::net::{QpEndpoint, RemoteBuf, UdpDevice, oob::random_psn};
use softroce::verbs::{
    AccessFlags, Gid, QpCap, QpInitAttr, QpType, RcConnect, SendWr, Wc, WcStatus, WrOpcode,
};
use std::error::Error;
use std::io::Write;
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::time::Duration;

/// The message the client writes.
pub const MESSAGE: &str = "Hello RDMA from client! Data lands directly in server memory.";

/// What the client saw.
pub struct ClientOutcome {
    /// Status of the WRITE's work completion.
    pub status: WcStatus,
    /// Datagrams sent.
    pub tx: u64,
    /// Datagrams received.
    pub rx: u64,
    /// Packets that passed parsing and the ICRC check and reached a QP.
    pub icrc_checked: u64,
    /// Packets dropped, any reason.
    pub dropped: u64,
}

/// Runs the client on device address `ip` against the server's TCP address `server`.
pub fn run(
    ip: IpAddr,
    server: SocketAddr,
    log: &dyn Fn(&str),
) -> Result<ClientOutcome, Box<dyn Error + Send + Sync>> {
    let dev = UdpDevice::open("softroce1", ip)?;
    let pd = dev.alloc_pd()?;
    let cq = dev.create_cq(16)?;
    let qp = pd.create_qp(&QpInitAttr {
        qp_type: QpType::Rc,
        send_cq: &cq,
        recv_cq: &cq,
        cap: QpCap::default(),
        sq_sig_all: false,
        srq: None,
    })?;
    // The message and its terminating NUL.
    let len = MESSAGE.len() + 1;
    let mr = pd.reg_mr(len, AccessFlags::LOCAL_WRITE)?;
    mr.write(0, MESSAGE.as_bytes())?;
    let mut tcp = TcpStream::connect(server)?;
    let me = QpEndpoint {
        qpn: qp.qp_num(),
        psn: random_psn(),
        gid: Gid::from_ip(ip),
    };
    let them = me.exchange(&mut tcp)?;
    log(&format!(
        "[client] {} on {ip}: QPN {:#x} connected to server QPN {:#x}",
        dev.name(),
        qp.qp_num(),
        them.qpn
    ));
    qp.connect_rc(&RcConnect::new(them.qpn, them.gid, them.psn, me.psn))?;
    let remote = RemoteBuf::recv(&mut tcp)?;
    if (remote.len as usize) < len {
        return Err("server buffer too small".into());
    }
    let mut wr = SendWr::new(1, WrOpcode::RdmaWrite, vec![mr.sge(0, len as u32)]);
    wr.remote_addr = remote.addr;
    wr.rkey = remote.rkey;
    qp.post_send(&[wr])?;
    let mut wc = [Wc::default()];
    if cq.wait(&mut wc, Duration::from_secs(10)) != 1 {
        return Err("no completion for the RDMA WRITE within 10 s".into());
    }
    log(&format!(
        "[client] RDMA WRITE of {len} bytes to addr {:#x} rkey {:#x}: {}",
        remote.addr, remote.rkey, wc[0].status
    ));
    tcp.write_all(b"D")?;
    let c = dev.counters();
    Ok(ClientOutcome {
        status: wc[0].status,
        tx: dev
            .link()
            .tx_datagrams
            .load(std::sync::atomic::Ordering::Relaxed),
        rx: dev
            .link()
            .rx_datagrams
            .load(std::sync::atomic::Ordering::Relaxed),
        icrc_checked: c.rcvd_pkts,
        dropped: c.dropped_total(),
    })
}

#[allow(dead_code)]
fn main() -> Result<(), Box<dyn Error + Send + Sync>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let ip: IpAddr = args.first().map_or("127.0.0.2", String::as_str).parse()?;
    let server_ip: IpAddr = args.get(1).map_or("127.0.0.1", String::as_str).parse()?;
    let port: u16 = args.get(2).map_or("18515", String::as_str).parse()?;
    let out = run(ip, SocketAddr::new(server_ip, port), &|line| {
        println!("{line}")
    })?;
    if out.status != WcStatus::Success {
        return Err(format!("RDMA WRITE failed: {}", out.status).into());
    }
    Ok(())
}
