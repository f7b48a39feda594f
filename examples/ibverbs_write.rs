//! An RDMA WRITE written the way code for the `ibverbs` crate is, ported to softroce by
//! importing `softroce_ibverbs` instead: list the devices, open two, build an RC queue pair
//! on each, swap endpoints and the remote buffer out of band (as JSON text, which could go
//! over any channel), handshake, WRITE, poll.
//!
//! Run: `SOFTROCE_IP=127.0.0.1,127.0.0.2 cargo run --example ibverbs_write`. The devices
//! are the first two addresses in `$SOFTROCE_IP` (default 127.0.0.1 and 127.0.0.2; all of
//! 127.0.0.0/8 is loopback, and each address can be one device in one process at a time).

use softroce_ibverbs::{
    self as ibverbs, AccessFlags, DeviceList, QpType, QueuePairEndpoint, RemoteMemorySlice, Wc,
    WcStatus,
};
use std::time::Duration;

const MESSAGE: &[u8] = b"Hello RDMA through the ibverbs-shaped API!";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut list = ibverbs::devices()?;
    if list.len() < 2 {
        list = DeviceList::with_ip(&["127.0.0.1".parse()?, "127.0.0.2".parse()?]);
    }
    let (server, client) = (list[0].open()?, list[1].open()?);
    println!(
        "devices: {} ({}), {} ({})",
        list[0].name(),
        list[0].ip(),
        list[1].name(),
        list[1].ip()
    );

    // Server: a buffer peers may write, a CQ, an RC QP that accepts WRITEs.
    let spd = server.alloc_pd()?;
    let scq = server.create_cq(16, 0)?;
    let target = spd.allocate(MESSAGE.len())?;
    let sprep = spd
        .create_qp(&scq, &scq, QpType::Rc)
        .set_access(AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
        .build()?;

    // Client: the message in a registered buffer, a CQ, an RC QP.
    let cpd = client.alloc_pd()?;
    let ccq = client.create_cq(16, 1)?;
    let source = cpd.register(MESSAGE)?;
    let cprep = cpd
        .create_qp(&ccq, &ccq, QpType::Rc)
        .set_max_send_wr(4)
        .build()?;

    // Out of band: endpoints both ways, the server's buffer to the client.
    let to_client = serde_json::to_string(&(sprep.endpoint(), target.remote()))?;
    let to_server = serde_json::to_string(&cprep.endpoint())?;
    println!("server -> client: {to_client}");
    println!("client -> server: {to_server}");
    let (server_end, remote): (QueuePairEndpoint, RemoteMemorySlice) =
        serde_json::from_str(&to_client)?;
    let client_end: QueuePairEndpoint = serde_json::from_str(&to_server)?;
    let _sqp = sprep.handshake(client_end)?;
    let mut cqp = cprep.handshake(server_end)?;

    // The WRITE, and its completion.
    cqp.post_write(&[source.slice(0..MESSAGE.len())], remote, 42, None)?;
    let mut wc = [Wc::default(); 1];
    let done = ccq.wait(&mut wc, Duration::from_secs(10))?;
    let Some(wc) = done.first() else {
        return Err("no completion within 10 s".into());
    };
    println!("completion: wr_id {} status {}", wc.wr_id, wc.status);
    if wc.status != WcStatus::Success {
        return Err(format!("WRITE failed: {}", wc.status).into());
    }
    let landed = target.to_vec();
    println!("server buffer: {:?}", String::from_utf8_lossy(&landed));
    if landed != MESSAGE {
        return Err("the server buffer does not hold the message".into());
    }
    Ok(())
}
