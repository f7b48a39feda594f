//! `softroce`: the command-line tool.
//!
//! - `softroce demo`: the classic RDMA WRITE exchange between two softroce devices
//!   (127.0.0.1 and 127.0.0.2) in one process, over real UDP on loopback.
//! - `softroce devinfo`: an `ibv_devinfo`-shaped description of a device.

use clap::{Parser, Subcommand};
use std::net::{IpAddr, SocketAddr, TcpListener};
use std::process::ExitCode;

// The demo runs exactly the code of the two examples.
#[allow(dead_code)]
#[path = "../../../examples/rdma_write_server.rs"]
mod rdma_write_server;

#[allow(dead_code)]
#[path = "../../../examples/rdma_write_client.rs"]
mod rdma_write_client;

mod devinfo;

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
    },
    /// Describes a device the way `ibv_devinfo -v` does.
    Devinfo {
        /// Device address (the device binds UDP port 4791 on it).
        #[arg(long, default_value = "127.0.0.1")]
        ip: IpAddr,
        /// Device name.
        #[arg(short = 'd', long = "ib-dev", default_value = "softroce0")]
        name: String,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let r = match cli.command {
        Command::Demo {
            server_ip,
            client_ip,
        } => demo(server_ip, client_ip),
        Command::Devinfo { ip, name } => devinfo::run(ip, &name),
    };
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

fn demo(server_ip: IpAddr, client_ip: IpAddr) -> Result<(), BoxError> {
    let listener = TcpListener::bind(SocketAddr::new(server_ip, 0))?;
    let tcp_addr = listener.local_addr()?;
    let print = |line: &str| println!("{line}");
    let server = std::thread::spawn(move || rdma_write_server::serve(server_ip, listener, &print));
    let client = rdma_write_client::run(client_ip, tcp_addr, &print);
    let server = server.join().map_err(|_| "server thread panicked")?;
    let (s, c) = (server?, client?);
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
