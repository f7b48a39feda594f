//! `softroce`: the command-line tool.
//!
//! - `softroce demo`: the classic RDMA WRITE exchange between two softroce devices
//!   (127.0.0.1 and 127.0.0.2) in one process, over real UDP on loopback.
//! - `softroce devinfo`: an `ibv_devinfo`-shaped description of a device.
//! - `softroce decode [--json] FILE`: every frame of a pcap/pcapng explained, as text or JSON.
//! - `softroce pingpong --rc|--uc|--ud|--srq`: rdma-core's `ibv_{rc,uc,ud,srq}_pingpong`,
//!   interoperable with them.
//! - `softroce perf write_bw|read_bw|send_bw|atomic_bw|write_lat|read_lat|send_lat`:
//!   perftest's `ib_*` tests, likewise; `softroce perf udp-baseline` and `--loopback` /
//!   `--compare-tcp` put the numbers beside kernel UDP and TCP on loopback.
//! - `softroce target`: a scriptable RC responder driven by JSON lines on stdin.
//! - `softroce exec`: an unmodified C program on softroce's libibverbs and librdmacm, with
//!   its devices in a private `/dev/infiniband` and `/sys/class/infiniband*`; `softroce
//!   sysfs` writes those files for a host-wide view.

use clap::{Parser, Subcommand};
use std::net::{IpAddr, SocketAddr, TcpListener};
use std::process::ExitCode;

// The demo runs exactly the code of the two examples.
#[allow(dead_code)]
#[path = "../examples/rdma_write_server.rs"]
mod rdma_write_server;

#[allow(dead_code)]
#[path = "../examples/rdma_write_client.rs"]
mod rdma_write_client;

mod decode;
mod devinfo;
mod exchange;
mod exec;
mod interrupt;
// One `SOFTROCE_LOG` setup for the CLI and the C libraries.
use softroce_cabi::log;
mod perf;
mod pingpong;
mod sim;
mod stall;
mod target;
mod view;

#[derive(Parser)]
#[command(
    name = "softroce",
    version,
    about = "A userspace Soft-RoCE (RoCEv2) emulator"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// The options of every subcommand that opens UDP devices.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct NetArgs {
    /// Write every RoCEv2 datagram the devices send and receive to this pcap (raw-IP link
    /// type, readable by Wireshark and `softroce decode`); flushed and closed on exit, on
    /// Ctrl-C and on SIGTERM.
    #[arg(long, value_name = "FILE")]
    pub pcap: Option<std::path::PathBuf>,
    /// Check the ICRC of received IPv4 packets over their IP header as received (a raw
    /// socket beside the UDP one; needs CAP_NET_RAW) instead of solving for the IPv4 ID.
    #[arg(long)]
    pub exact_icrc: bool,
}

#[derive(Subcommand)]
enum Command {
    /// Two devices in one process do the classic RDMA WRITE over UDP on loopback.
    Demo {
        /// Server device address.
        #[arg(long, default_value = "127.0.0.1")]
        server_ip: IpAddr,
        /// Client device address.
        #[arg(long, default_value = "127.0.0.2")]
        client_ip: IpAddr,
        #[command(flatten)]
        net: NetArgs,
    },
    /// rdma-core's ibv_devinfo (-d, -i, -l, -v): opens each device and describes it.
    Devinfo(devinfo::DevinfoArgs),
    /// rdma-core's ibv_rc/uc/ud/srq_pingpong on a softroce device (--rc, --uc, --ud or --srq;
    /// same options and TCP exchange).
    Pingpong(pingpong::PingpongArgs),
    /// perftest's bandwidth and latency tests on a softroce device (same TCP exchange), and
    /// UDP/TCP baselines on loopback.
    Perf(perf::PerfArgs),
    /// Random RC operations between two simulated devices on a seeded lossy link, checked
    /// against a reference model.
    Sim(sim::SimArgs),
    /// A scriptable RC responder: prints its QPN, PSN and MRs as JSON, then takes JSON
    /// commands on stdin and reports every completion as a JSON line.
    Target(target::TargetArgs),
    /// Runs an unmodified verbs or rdma_cm program (linked with libibverbs / librdmacm) on
    /// softroce devices: `softroce exec [--ip ADDR[,ADDR…]] [--pcap FILE] -- PROGRAM [ARGS…]`.
    #[command(after_help = "What new users hit:\n  \
        - Build with --release: the debug build is about 50x slower per message.\n  \
        - Use GID index 1 (-g 1 for rdma-core's examples, -x 1 for perftest): index 0 is the \
        link-local GID,\n    which softroce does not send from (ibv_modify_qp to RTR fails, \
        EINVAL).\n  \
        - Processes share a device, as they share rxe0 (servers and clients on one \
        address);\n    every address of 127.0.0.0/8 is loopback (--ip 127.0.0.2 for a \
        second device).\n  \
        - SOFTROCE_LOG=debug says what the devices did; the README's Troubleshooting table \
        lists\n    the common messages.\n  \
        - Middleware: exec sets UCX_UD_VERBS_ETH_DGID_CHECK=n unless it is set (UCX's \
        ud_verbs reads\n    the IP version from wc.sl, which rxe and softroce leave 0), and \
        UCX_ADAPTIVE_PROGRESS=n\n    (else a lost UCX wireup reply can stop a connection \
        for good).")]
    Exec(exec::ExecArgs),
    /// Writes the /sys/class/infiniband* files of softroce's devices (those `exec` shows its
    /// program) under a directory, with /dev/infiniband placeholders, and prints the mounts
    /// that would put them in place host-wide (root runs them; nothing is mounted here).
    Sysfs(view::SysfsArgs),
    /// Explains every frame of a pcap or pcapng file (Ethernet, raw IP or Linux cooked).
    Decode {
        /// One JSON object per frame instead of one line of text.
        #[arg(long)]
        json: bool,
        /// The capture to read.
        file: std::path::PathBuf,
    },
}

impl Command {
    /// The device options of a subcommand that opens UDP devices.
    fn net(&self) -> Option<&NetArgs> {
        match self {
            Command::Demo { net, .. } => Some(net),
            Command::Devinfo(a) => Some(&a.net),
            Command::Pingpong(a) => Some(&a.net),
            Command::Perf(a) => Some(&a.net),
            Command::Target(a) => Some(&a.net),
            Command::Decode { .. } | Command::Sim(_) | Command::Exec(_) | Command::Sysfs(_) => None,
        }
    }
}

fn main() -> ExitCode {
    // A reader that goes away (`softroce perf … | head -1`) ends the process quietly, as it
    // ends a C tool: the Rust runtime ignores SIGPIPE, so `println!` would panic on EPIPE
    // instead. Sockets are unaffected: std sends on TCP with MSG_NOSIGNAL, and UDP raises no
    // SIGPIPE.
    // SAFETY: the first thing `main` does, before any other thread exists; SIG_DFL installs
    // no handler, so no Rust code runs in signal context.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    log::init_log();
    let cli = Cli::parse();
    if let Command::Exec(args) = cli.command {
        // Returns only when the program could not be started.
        let e = exec::run(args)
            .err()
            .map_or_else(String::new, |e| e.to_string());
        eprintln!("softroce: {e}");
        return ExitCode::from(127);
    }
    // `--pcap` and `--exact-icrc` apply to every device this process opens.
    let net = cli.command.net().cloned().unwrap_or_default();
    let capture = match net_options(net.pcap.as_deref(), net.exact_icrc) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("softroce: {e}");
            return ExitCode::FAILURE;
        }
    };
    // Ctrl-C and SIGTERM: `sim` and `perf -D` stop and report what they did; any other
    // subcommand ends at once, its capture flushed first.
    interrupt::install(capture.clone(), net.pcap.clone());
    let r = match cli.command {
        Command::Demo {
            server_ip,
            client_ip,
            ..
        } => demo(server_ip, client_ip),
        Command::Devinfo(args) => devinfo::run(args),
        Command::Pingpong(args) => pingpong::run(args),
        Command::Perf(args) => perf::run(args),
        Command::Decode { json, file } => decode::run(&file, json),
        Command::Sim(args) => sim::run_sim(args),
        Command::Target(args) => target::run(args),
        Command::Sysfs(args) => view::run_sysfs(args),
        Command::Exec(_) => unreachable!("exec returned above"),
    };
    // Flushed on failure too: the capture of a failed run is the interesting one.
    let flushed = finish_capture(capture, net.pcap.as_deref());
    let r = r.and(flushed);
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("softroce: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Error type of the subcommands.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Makes `--pcap` and `--exact-icrc` the options of every device this process opens.
fn net_options(
    pcap: Option<&std::path::Path>,
    exact_icrc: bool,
) -> Result<Option<std::sync::Arc<softroce::net::Capture>>, BoxError> {
    let capture = match pcap {
        Some(p) => Some(
            softroce::net::Capture::create(p)
                .map_err(|e| format!("--pcap {}: {e}", p.display()))?,
        ),
        None => None,
    };
    softroce::net::UdpOptions::set_process_default(softroce::net::UdpOptions {
        exact_icrc,
        capture: capture.clone(),
        ..Default::default()
    });
    Ok(capture)
}

/// Flushes the `--pcap` capture and says how many packets it holds.
fn finish_capture(
    capture: Option<std::sync::Arc<softroce::net::Capture>>,
    pcap: Option<&std::path::Path>,
) -> Result<(), BoxError> {
    if let (Some(c), Some(p)) = (capture, pcap) {
        c.flush()?;
        eprintln!("[pcap] {} packets written to {}", c.packets(), p.display());
    }
    Ok(())
}

/// A TCP listener on `ip`, on a port the kernel picks (the out-of-band exchange of the
/// two-device subcommands, `demo` and `perf --loopback`). Errors: "Couldn't listen on IP:
/// <the kernel's error>", with a hint when the address is not on this host.
pub fn listen_on(ip: IpAddr) -> Result<TcpListener, String> {
    TcpListener::bind(SocketAddr::new(ip, 0)).map_err(|e| {
        let hint = if e.kind() == std::io::ErrorKind::AddrNotAvailable {
            "; that address is not on this host"
        } else {
            ""
        };
        format!("Couldn't listen on {ip}: {e}{hint}")
    })
}

fn demo(server_ip: IpAddr, client_ip: IpAddr) -> Result<(), BoxError> {
    if server_ip == client_ip {
        return Err(format!(
            "--server-ip and --client-ip are both {server_ip}: each device owns UDP port 4791 \
             on its address, so the two need different addresses"
        )
        .into());
    }
    let listener = listen_on(server_ip).map_err(|e| format!("server: {e}"))?;
    let tcp_addr = listener.local_addr()?;
    let print = |line: &str| println!("{line}");
    let server = std::thread::spawn(move || rdma_write_server::serve(server_ip, listener, &print));
    let c = match rdma_write_client::run(client_ip, tcp_addr, &print) {
        Ok(c) => c,
        Err(e) => {
            // A server that failed first (its address taken, say) closed its listener, and
            // the client's connection was refused: the server's error is the cause. A server
            // still waiting for the client would wait forever: it is left behind and ends
            // with the process.
            let until = std::time::Instant::now() + std::time::Duration::from_millis(500);
            while !server.is_finished() && std::time::Instant::now() < until {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            if server.is_finished()
                && let Ok(Err(se)) = server.join()
            {
                return Err(format!("server: {se}").into());
            }
            return Err(format!("client: {e}").into());
        }
    };
    let s = server
        .join()
        .map_err(|_| "server thread panicked")?
        .map_err(|e| format!("server: {e}"))?;
    println!(
        "[wire] {} RoCEv2 datagrams sent, {} received, {} passed the ICRC check, {} dropped",
        s.tx + c.tx,
        s.rx + c.rx,
        s.icrc_checked + c.icrc_checked,
        s.dropped + c.dropped
    );
    if s.received != rdma_write_client::MESSAGE {
        return Err("the server buffer does not hold the client's message".into());
    }
    Ok(())
}
