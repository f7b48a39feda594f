//! The classic RDMA WRITE example, server side.
//!
//! The server registers a zeroed 4096-byte buffer with LOCAL_WRITE | REMOTE_WRITE, connects
//! an RC QP with the client over an out-of-band TCP connection, hands the client the packed
//! 16-byte {addr u64, rkey u32, len u32} of that buffer, and posts no receive: the client's
//! RDMA WRITE lands in server memory without the server's CPU taking part. When the client
//! says (over TCP) that its WRITE completed, the server prints what is in the buffer.
//!
//! Run: `cargo run --example rdma_write_server -- [SERVER_IP] [TCP_PORT]` (defaults
//! 127.0.0.1 18515), then the client. `softroce demo` runs both in one process.

use softroce::net::{QpEndpoint, RemoteBuf, UdpDevice, oob::random_psn};
use softroce::verbs::{AccessFlags, Gid, QpCap, QpInitAttr, QpType, RcConnect};
use std::error::Error;
use std::io::Read;
use std::net::{IpAddr, TcpListener};

/// Size of the buffer the client writes into.
pub const BUF_LEN: usize = 4096;

/// What the server saw.
pub struct ServerOutcome {
    /// The text found in the buffer (up to the first NUL).
    pub received: String,
    /// Datagrams the server's device sent and received.
    pub tx: u64,
    /// Datagrams received.
    pub rx: u64,
    /// Packets that passed parsing and the ICRC check and reached a QP.
    pub icrc_checked: u64,
    /// Packets dropped, any reason.
    pub dropped: u64,
}

/// Runs the server on device address `ip`, talking to one client that connects to
/// `listener`. `log` receives each line to print.
pub fn serve(
    ip: IpAddr,
    listener: TcpListener,
    log: &dyn Fn(&str),
) -> Result<ServerOutcome, Box<dyn Error + Send + Sync>> {
    let dev = UdpDevice::open("softroce0", ip)?;
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
    let mr = pd.reg_mr(
        BUF_LEN,
        AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
    )?;
    log(&format!(
        "[server] {} on {ip}: QPN {:#x}, MR addr {:#x} rkey {:#x} len {BUF_LEN}, waiting on TCP {}",
        dev.name(),
        qp.qp_num(),
        mr.addr(),
        mr.rkey(),
        listener.local_addr()?
    ));
    let (mut tcp, peer) = listener.accept()?;
    let me = QpEndpoint {
        qpn: qp.qp_num(),
        psn: random_psn(),
        gid: Gid::from_ip(ip),
    };
    let them = me.exchange(&mut tcp)?;
    // The client's device address is its GID's; the TCP address is only the exchange's.
    log(&format!(
        "[server] client device {}: QPN {:#x}, GID {} (exchanged over TCP from {peer})",
        them.gid.ip(),
        them.qpn,
        them.gid
    ));
    qp.connect_rc(&RcConnect::new(them.qpn, them.gid, them.psn, me.psn))?;
    RemoteBuf {
        addr: mr.addr(),
        rkey: mr.rkey(),
        len: BUF_LEN as u32,
    }
    .send(&mut tcp)?;
    // No receive is posted: an RDMA WRITE needs none. Wait for the client's word.
    let mut done = [0u8; 1];
    tcp.read_exact(&mut done)?;
    let bytes = mr.to_vec();
    let end = bytes.iter().position(|b| *b == 0).unwrap_or(bytes.len());
    let received = String::from_utf8_lossy(&bytes[..end]).into_owned();
    log(&format!("[server] received: '{received}'"));
    let c = dev.counters();
    Ok(ServerOutcome {
        received,
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
    let ip: IpAddr = args.first().map_or("127.0.0.1", String::as_str).parse()?;
    let port: u16 = args.get(1).map_or("18515", String::as_str).parse()?;
    let listener = TcpListener::bind((ip, port))?;
    serve(ip, listener, &|line| println!("{line}"))?;
    Ok(())
}
