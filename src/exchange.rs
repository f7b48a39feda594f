//! The out-of-band TCP exchange of the pingpong and perf subcommands, with a deadline and
//! errors that name the likely cause: a client pointed at a port that some other program
//! holds waits for an answer that never comes, and a peer that quits (a different test or
//! mode on the two sides) closes the connection mid-exchange (issue 17).

use crate::BoxError;
use std::io::{self, Read};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::Duration;

/// How long one step of the exchange may wait for the peer.
pub const DEADLINE: Duration = Duration::from_secs(10);

/// One side of the exchange: the TCP connection and the peer's address, kept from the start
/// (a connection the peer reset has no peer address any more, and the error should name it).
/// Derefs to the stream for writing.
pub struct Conn {
    tcp: TcpStream,
    peer: Option<SocketAddr>,
}

impl Conn {
    /// A connection this side accepted; puts [`DEADLINE`] on its reads and writes.
    pub fn accepted(tcp: TcpStream, peer: SocketAddr) -> Conn {
        with_deadline(&tcp);
        Conn {
            tcp,
            peer: Some(peer),
        }
    }

    /// Reads exactly `buf.len()` bytes of the peer's `what` (e.g. "address"), naming the
    /// likely cause when the peer does not answer in time or closes the connection.
    pub fn read_exact(&mut self, buf: &mut [u8], what: &str) -> Result<(), BoxError> {
        self.tcp
            .read_exact(buf)
            .map_err(|e| read_error(self.peer, &e, what))
    }

    /// Lifts the deadline: from here on a step may wait for the peer's whole run.
    pub fn without_deadline(&mut self) {
        let _ = self.tcp.set_read_timeout(None);
        let _ = self.tcp.set_write_timeout(None);
    }
}

impl std::ops::Deref for Conn {
    type Target = TcpStream;
    fn deref(&self) -> &TcpStream {
        &self.tcp
    }
}

impl std::ops::DerefMut for Conn {
    fn deref_mut(&mut self) -> &mut TcpStream {
        &mut self.tcp
    }
}

/// Connects to the server at `host:port` (the first address that accepts), with
/// [`DEADLINE`] on every later read and write. Errors: "Couldn't connect to HOST:PORT", with
/// the reason.
pub fn connect(host: &str, port: u16) -> Result<Conn, BoxError> {
    let addrs: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .map_err(|e| format!("{e} for {host}:{port}"))?
        .collect();
    let mut last = None;
    for a in &addrs {
        match TcpStream::connect_timeout(a, DEADLINE) {
            Ok(tcp) => {
                with_deadline(&tcp);
                return Ok(Conn {
                    tcp,
                    peer: Some(*a),
                });
            }
            Err(e) => last = Some(e),
        }
    }
    Err(match last {
        Some(e) if e.kind() == io::ErrorKind::ConnectionRefused => format!(
            "Couldn't connect to {host}:{port}: nothing listens there (start the server first)"
        ),
        Some(e) => format!("Couldn't connect to {host}:{port}: {e}"),
        None => format!("Couldn't connect to {host}:{port}: no address"),
    }
    .into())
}

/// Puts [`DEADLINE`] on the reads and writes of a connection.
fn with_deadline(tcp: &TcpStream) {
    let _ = tcp.set_read_timeout(Some(DEADLINE));
    let _ = tcp.set_write_timeout(Some(DEADLINE));
}

/// The error for a failed read of the peer's `what`.
fn read_error(peer: Option<SocketAddr>, e: &io::Error, what: &str) -> BoxError {
    let peer = peer.map_or_else(|| "the peer".to_string(), |a| a.to_string());
    match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => format!(
            "no answer from {peer} in {} s while waiting for its {what}: is a softroce or \
             rdma-core peer of the same test listening there?",
            DEADLINE.as_secs()
        ),
        io::ErrorKind::UnexpectedEof | io::ErrorKind::ConnectionReset => format!(
            "{peer} closed the connection before sending its {what}: see the peer's output \
             (does it run the same test, mode and options?)"
        ),
        _ => format!("reading the {what} from {peer}: {e}"),
    }
    .into()
}
