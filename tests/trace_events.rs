//! `SOFTROCE_LOG`: the engine's protocol events (issue 13 item 8). A device driven by hand,
//! under a tracing subscriber that writes into a buffer, must log a dropped packet with its
//! drop reason and a NAK it sends with the error behind it, one line each.

use softroce::net::ManualClock;
use softroce::net::sim::RecordingLink;
use softroce::verbs::{Device, DeviceConfig, Gid, QpCap, QpInitAttr, QpType, RcConnect};
use softroce::wire::{
    BthRepr, DethRepr, IcrcIp, Opcode, PacketRepr, Psn, ROCE_V2_UDP_PORT, RethRepr,
};
use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};

const DEV_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 31, 1);
const PEER_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 31, 2);
const PEER_PORT: u16 = 0xc0de;

/// Where the subscriber writes.
#[derive(Clone, Default)]
struct Buffer(Arc<Mutex<Vec<u8>>>);

impl Write for Buffer {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A request from the peer to QP 0x11 with `reth` or `deth` and `payload`, with its ICRC.
fn request(
    opcode: Opcode,
    reth: Option<RethRepr>,
    deth: Option<DethRepr>,
    payload: &[u8],
) -> Vec<u8> {
    let mut repr = PacketRepr::new(BthRepr {
        ack_req: true,
        ..BthRepr::new(opcode, 0x11, Psn::new(0x100))
    });
    repr.reth = reth;
    repr.deth = deth;
    repr.payload_len = payload.len();
    let ip = IcrcIp::V4 {
        src: PEER_IP,
        dst: DEV_IP,
        ident: 0,
        src_port: PEER_PORT,
        dst_port: ROCE_V2_UDP_PORT,
    };
    let mut buf = vec![0u8; repr.buffer_len()];
    repr.emit(&mut buf, payload, &ip);
    buf
}

#[test]
fn a_drop_and_a_nak_are_logged_with_their_reasons() {
    let out = Buffer::default();
    let sink = out.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new("debug"))
        .with_writer(move || sink.clone())
        .with_ansi(false)
        .without_time()
        .finish();
    tracing::subscriber::with_default(subscriber, || {
        let link = Arc::new(RecordingLink::new());
        let dev = Device::new(
            DeviceConfig::new("softroce_trace", IpAddr::V4(DEV_IP)),
            link.clone(),
            Arc::new(ManualClock::new()),
        );
        let pd = dev.alloc_pd().unwrap();
        let cq = dev.create_cq(16).unwrap();
        let qp = pd
            .create_qp(&QpInitAttr {
                qp_type: QpType::Rc,
                send_cq: &cq,
                recv_cq: &cq,
                cap: QpCap::default(),
                sq_sig_all: false,
                srq: None,
            })
            .unwrap();
        qp.connect_rc(&RcConnect::new(0x11, Gid::from(PEER_IP), 0x100, 0x200))
            .unwrap();
        let peer = SocketAddr::new(IpAddr::V4(PEER_IP), PEER_PORT);
        // A UD SEND to an RC QP: dropped as wrong_qp_type.
        let deth = DethRepr {
            qkey: 0x1111_1111,
            src_qpn: 0x22,
        };
        let ud = request(Opcode::UD_SEND_ONLY, None, Some(deth), b"ping");
        dev.handle_datagram(peer, &ud);
        // An RDMA WRITE with an rkey nobody registered: NAK remote access error.
        let write = request(
            Opcode::RC_RDMA_WRITE_ONLY,
            Some(RethRepr {
                va: 0x1000,
                rkey: 0xdead_be00,
                dma_len: 4,
            }),
            None,
            b"data",
        );
        dev.handle_datagram(peer, &write);
        assert!(!link.is_empty(), "the NAK was sent");
    });
    let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        lines
            .iter()
            .any(|l| l.contains("packet dropped") && l.contains("reason=\"wrong_qp_type\"")),
        "{text}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains("responder sends NAK remote access error")
                && l.contains("RkeyViolation")
                && l.contains("psn=0x000100")),
        "{text}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains("QP state Rts -> Err (transport error)")),
        "{text}"
    );
}
