//! The errors of this API: [`Error`] (a verbs error, an I/O error or a refused connection)
//! and [`Rejected`], what the peer's REJ said. Every other file of the crate imports them;
//! this one imports none of its siblings.

use softroce::verbs;
use softroce::wire::cm::RejReason;

/// An error of this API: a verbs error (with its errno and, for posts, the index of the
/// first refused work request) or an I/O error from opening a device's socket.
#[derive(Debug)]
pub enum Error {
    /// A verbs call refused its arguments or ran out of a resource.
    Verbs(verbs::Error),
    /// Opening a device failed (e.g. `EADDRINUSE`: another process owns that address's
    /// RoCEv2 port; `EADDRNOTAVAIL`: the address is not on this host), or an environment
    /// setting is malformed (`EINVAL`).
    Io(std::io::Error),
    /// The peer's Communication Manager refused a connection ([`cm`](crate::cm): REJ);
    /// `errno()` is ECONNREFUSED, as librdmacm's synchronous calls report it.
    Rejected(Rejected),
}

impl Error {
    /// The errno `libibverbs` would report: the verbs error's errno, or the OS error of an
    /// I/O failure (EIO, 5, when the OS gave none).
    pub fn errno(&self) -> i32 {
        match self {
            Error::Verbs(e) => e.errno(),
            Error::Io(e) => io_errno(e),
            Error::Rejected(_) => ECONNREFUSED,
        }
    }

    /// For a failed post: the index of the first refused work request; none after it was
    /// posted, all before it were.
    pub fn bad_wr(&self) -> Option<usize> {
        match self {
            Error::Verbs(e) => e.bad_wr(),
            Error::Io(_) | Error::Rejected(_) => None,
        }
    }
}

/// ECONNREFUSED (Linux).
const ECONNREFUSED: i32 = 111;

/// The errno of an I/O error: its OS error, else the errno of its kind (the device-open
/// errors carry a message and a kind, not the raw number), else EIO.
fn io_errno(e: &std::io::Error) -> i32 {
    use std::io::ErrorKind as K;
    e.raw_os_error().unwrap_or(match e.kind() {
        K::PermissionDenied => 1,
        K::NotFound => 2,
        K::InvalidInput => 22,
        K::AddrInUse => 98,
        K::AddrNotAvailable => 99,
        K::TimedOut => 110,
        K::ConnectionRefused => ECONNREFUSED,
        _ => 5,
    })
}

impl core::fmt::Display for Error {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Error::Verbs(e) => write!(f, "{e}"),
            Error::Io(e) => write!(f, "{e}"),
            Error::Rejected(r) => write!(
                f,
                "connection rejected by the peer (REJ reason {})",
                r.reason.0
            ),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Verbs(e) => Some(e),
            Error::Io(e) => Some(e),
            Error::Rejected(_) => None,
        }
    }
}

impl From<verbs::Error> for Error {
    fn from(e: verbs::Error) -> Error {
        Error::Verbs(e)
    }
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Error {
        Error::Io(e)
    }
}

impl From<Error> for std::io::Error {
    /// Keeps the errno (so `kind()` is what `from_raw_os_error` gives) and the message.
    fn from(e: Error) -> std::io::Error {
        match e {
            Error::Io(e) => e,
            Error::Rejected(_) => std::io::Error::new(std::io::ErrorKind::ConnectionRefused, e),
            Error::Verbs(v) => {
                let kind = std::io::Error::from_raw_os_error(v.errno()).kind();
                std::io::Error::new(kind, v)
            }
        }
    }
}

/// Result of this API.
pub type Result<T> = core::result::Result<T, Error>;

/// The error of a connection attempt the peer's CM refused (REJ): [`Error::Rejected`].
/// librdmacm reports it as RDMA_CM_EVENT_REJECTED with `status` = `reason`, and its
/// synchronous calls fail with ECONNREFUSED.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejected {
    /// The REJ reason (IBTA Vol 1 ch. 12, table 108): 28 (consumer defined) when the peer
    /// called reject, 8 (invalid service ID) when nobody listens on the port, 4 (timeout)…
    pub reason: RejReason,
    /// The REJ's private data (148 bytes, zero-padded past what the peer gave).
    pub private_data: Vec<u8>,
}
