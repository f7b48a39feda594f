//! The seed's `rdma_server` / `rdma_client` (tests/c/seed) in Rust, over the rdma_cm-shaped
//! connect/accept of `softroce_ibverbs::cm`: no QP numbers swapped by hand. The server
//! listens on a port, accepts the request with its buffer's `{addr, rkey, len}` as the REP's
//! private data (the seed's packed `struct ConnInfo`), and prints what landed once the client
//! disconnects; the client connects, reads the three fields from the REP, RDMA WRITEs its
//! message there and disconnects. Either side interoperates with the seed's C program run
//! through `softroce exec` (tests/ibverbs_cm.rs runs both pairings).
//!
//! Run (two terminals; each address is one device of one process):
//!
//! ```sh
//! cargo run --example cm_write -- server 127.0.0.1 7471
//! cargo run --example cm_write -- client 127.0.0.2 127.0.0.1 7471
//! ```
//!
//! With no arguments both run in this process, on 127.0.0.1 and 127.0.0.2.

use softroce_ibverbs::{
    AccessFlags, CmListener, Context, DeviceList, QpType, RemoteMemorySlice, Wc, WcStatus,
};
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

const MESSAGE: &[u8] = b"Hello RDMA from client! Data lands directly in server memory.";
const WAIT: Duration = Duration::from_secs(30);

fn open(ip: IpAddr) -> Res<Context> {
    Ok(DeviceList::with_ip(&[ip])[0].open()?)
}

fn bind(ip: IpAddr, port: u16) -> Res<(Context, CmListener)> {
    let ctx = open(ip)?;
    let listener = CmListener::bind(&ctx, port)?;
    println!("[server] listening on {}", listener.local_addr());
    Ok((ctx, listener))
}

fn serve(ctx: Context, listener: CmListener) -> Res<()> {
    let (pd, cq) = (ctx.alloc_pd()?, ctx.create_cq(8, 0)?);
    let buf = pd.allocate(4096)?;
    let req = listener.get_request(WAIT)?;
    println!("[server] connection request from {}", req.peer_addr());
    let qp = pd
        .create_qp(&cq, &cq, QpType::Rc)
        .set_access(AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
        .build()?;
    // struct ConnInfo { uint64_t addr; uint32_t rkey; uint32_t len; } __attribute__((packed))
    let mut info = [0u8; 16];
    info[..8].copy_from_slice(&buf.addr().to_le_bytes());
    info[8..12].copy_from_slice(&buf.rkey().to_le_bytes());
    info[12..].copy_from_slice(&4096u32.to_le_bytes());
    let mut conn = req.accept_with(qp, &info)?;
    conn.wait_for_disconnect(WAIT)?;
    let data = buf.to_vec();
    let end = data.iter().position(|&b| b == 0).unwrap_or(64).min(64);
    println!(
        "[server] received: '{}'",
        String::from_utf8_lossy(&data[..end])
    );
    conn.disconnect(WAIT)?;
    Ok(())
}

fn client(ip: IpAddr, to: SocketAddr) -> Res<()> {
    let ctx = open(ip)?;
    let (pd, cq) = (ctx.alloc_pd()?, ctx.create_cq(8, 0)?);
    let qp = pd.create_qp(&cq, &cq, QpType::Rc).build()?;
    let mut conn = qp.connect(to, &[], WAIT)?;
    let p = conn.private_data();
    let remote = RemoteMemorySlice {
        addr: u64::from_le_bytes(p[..8].try_into()?),
        rkey: u32::from_le_bytes(p[8..12].try_into()?),
        length: u64::from(u32::from_le_bytes(p[12..16].try_into()?)),
    };
    println!(
        "[client] remote addr={:#x}, rkey={:#x}, len={}",
        remote.addr, remote.rkey, remote.length
    );
    let src = pd.register(MESSAGE)?;
    conn.post_write(&[src.slice(0..MESSAGE.len())], remote, 1, None)?;
    let mut wc = [Wc::default(); 1];
    let done = cq.wait(&mut wc, WAIT)?;
    let status = done.first().map_or(WcStatus::RetryExcErr, |w| w.status);
    println!("[client] write done, status={}", status as u32);
    conn.disconnect(WAIT)?;
    Ok(())
}

fn main() -> Res<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        ["server", ip, port] => {
            let (ctx, listener) = bind(ip.parse()?, port.parse()?)?;
            serve(ctx, listener)
        }
        ["client", ip, server_ip, port] => client(
            ip.parse()?,
            SocketAddr::new(server_ip.parse()?, port.parse()?),
        ),
        [] => {
            let (ctx, listener) = bind("127.0.0.1".parse()?, 7471)?;
            let s = std::thread::spawn(move || serve(ctx, listener));
            client("127.0.0.2".parse()?, "127.0.0.1:7471".parse()?)?;
            s.join().map_err(|_| "server thread panicked")?
        }
        _ => Err("usage: cm_write server IP PORT | cm_write client IP SERVER_IP PORT".into()),
    }
}
