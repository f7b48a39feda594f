//! Net: the only layer with sockets, threads and the real clock.
//!
//! - [`clock`]: [`SystemClock`] (monotonic, ns since the device opened) and [`ManualClock`]
//!   (set by tests); [`seed_from_clock_and_pid`], the frontends' seed that differs per run.
//! - [`udp`]: one UDP socket per device bound to its IP on port 4791 for receiving, plus one
//!   unconnected send socket per UDP source port with `IP_MTU_DISCOVER = IP_PMTUDISC_DO`, so
//!   that Linux writes IPv4 ID 0 and DF on every datagram and the ICRC of what we send is
//!   computable; and the driver thread that feeds received datagrams to the device.
//!   IPv6 sockets set `UDP_NO_CHECK6_RX` (rxe sends IPv6 UDP checksum 0). [`UdpOptions`]
//!   adds the exact receive-side ICRC mode, a pcap capture, busy polling and turning the
//!   batching offloads off. (A UDP GSO send gives IPv4 segment `i` ID `i`; its ICRC covers
//!   that ID.)
//! - [`cm`]: [`CmDriver`], a device's CM engine on its QP1 with a driver thread and
//!   per-connection mailboxes (what the Rust API's rdma_cm-shaped connect/accept wait on).
//! - [`cm_loop`]: the one CM driver loop (wait on QP1 up to the next CM timer, feed the
//!   engine, sort its events) that [`CmDriver`], librdmacm.so.1 and the simulator's CM
//!   storms (tests/cm_sim.rs, on [`sim`]'s clock) all run, with its panic guard.
//! - [`discover`]: the devices of this process, from `$SOFTROCE_IP`, for every frontend.
//! - [`batch`]: UDP GSO / GRO and `sendmmsg` / `recvmmsg` system calls.
//! - [`pcap`]: [`Capture`], a pcap (raw-IP link type) of every datagram drivers send and
//!   receive, each with the IP header its ICRC was computed over; [`pcap_reader`]:
//!   [`CaptureReader`], which reads pcap and pcapng files back, frame by frame.
//! - `mcast`: IP multicast for UD multicast groups (`Qp::attach_mcast`): one socket per
//!   joined group, bound to group:4791 and joined on the device's interface, drained by the
//!   driver thread; send sockets name the device's interface for multicast.
//! - `raw`: the raw IPv4 socket of the exact ICRC mode (CAP_NET_RAW), and the cutting of a
//!   UDP GSO send it sees whole into its datagrams.
//! - [`panic`](mod@panic): how a thread softroce starts reports a panic before it fails what it drove
//!   (no silent hang).
//! - `icmp`: the ICMP errors QP1's send sockets report (`IP_RECVERR`): a peer address with
//!   no RoCE device, which the CM then reports unreachable at once.
//! - `fork`: a forked child does not keep the parent's device ports (`pthread_atfork`).
//! - `sock`: how the device's UDP sockets are made (shared by `udp` and `mcast`).
//! - [`sockaddr`]: C `sockaddr_in`/`sockaddr_in6` to and from `SocketAddr` (socket2), for
//!   the C ABIs.
//! - [`sim`]: the in-memory twin of `udp`: a seeded lossy link and a virtual clock that
//!   drive the same devices and engines deterministically.
//! - [`steer`]: the `SO_REUSEPORT` steering program that lets processes share a device
//!   address: each datagram to the socket of the process that owns its QP or CM ID.
//! - [`share`]: a process's share of a device's address (its slot, from the device's keeper,
//!   `keeper`); [`counter_pages`]: the shared memory where the processes of a shared device
//!   keep its counters.
//! - [`oob`]: the out-of-band TCP exchange of QP endpoints and remote buffers that the
//!   examples and the demo use.

pub mod batch;
pub mod clock;
pub mod cm;
pub mod cm_loop;
pub mod counter_pages;
pub mod discover;
mod fork;
mod icmp;
mod iface;
mod keeper;
mod link;
mod mcast;
pub mod oob;
pub mod panic;
pub mod pcap;
pub mod pcap_reader;
mod qp1;
mod raw;
pub mod sched;
pub mod share;
pub mod sim;
mod sock;
pub mod sockaddr;
pub mod standin;
pub mod steer;
pub mod udp;

pub use clock::{ManualClock, SystemClock, seed_from_clock_and_pid};
pub use cm::CmDriver;
pub use iface::{
    interface_name, link_mtu, link_speed_mbps, rxe_port_mtu, rxe_port_rate, set_rxe_port,
};
pub use link::UdpLink;
pub use link::UdpOptions;
pub use oob::{QpEndpoint, RemoteBuf};
pub use pcap::Capture;
pub use pcap_reader::{CaptureReadError, CaptureReader, CapturedFrame};
pub use udp::UdpDevice;
