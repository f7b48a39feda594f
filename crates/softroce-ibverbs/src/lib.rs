//! An API shaped like the [`ibverbs`](https://docs.rs/ibverbs/0.9.2) crate, over softroce.
//!
//! Code written against the `ibverbs` crate (device list → context → PD, CQ → queue pair
//! builder → prepared QP → out-of-band endpoint exchange → handshake → post / poll) ports to
//! softroce by changing the import, with the differences listed below. Everything here is a
//! thin layer over [`softroce::verbs`] (objects, checks, errors) and [`softroce::net::UdpDevice`]
//! (the UDP socket and driver thread of a device); it adds no protocol code.
//!
//! Layer: above `verbs` and `net`; opens sockets (in [`Device::open`]) and starts one driver
//! thread per opened device. Every object keeps its device open while it lives.
//!
//! # Devices
//!
//! A softroce device is an IP address the process binds UDP port 4791 on. [`devices`]
//! lists one device per address in the environment variable `SOFTROCE_IP` (addresses
//! separated by commas or white space; default `127.0.0.1`), named `softroce0`,
//! `softroce1`, … in that order. [`DeviceList::with_ip`] builds the list from explicit
//! addresses instead. Listing opens nothing; [`Device::open`] binds the socket.
//!
//! # Connecting through the CM
//!
//! Besides the crate's endpoint exchange and [`PreparedQueuePair::handshake`], [`cm`] connects
//! RC queue pairs the rdma_cm way (softroce addition): [`CmListener`] and
//! [`PreparedQueuePair::connect`], with private data both ways, interoperating with C
//! programs on softroce's librdmacm.so.1.
//!
//! # Differences from the `ibverbs` crate
//!
//! - Memory regions own their bytes inside the device (softroce keeps all registered memory
//!   in its MR table): [`MemoryRegion`] has [`read`](MemoryRegion::read) /
//!   [`write`](MemoryRegion::write) / [`to_vec`](MemoryRegion::to_vec) instead of `Deref` to
//!   a slice, and [`ProtectionDomain::register`] registers a copy of the caller's bytes.
//! - [`QueuePair::post_send`] and [`QueuePair::post_receive`] take lists of verbs work
//!   requests ([`SendWr`], [`RecvWr`]) and, on failure, report the index of the first
//!   refused one in [`Error::bad_wr`] (those before it were posted). [`QueuePair::post_write`]
//!   and [`QueuePair::post_read`] build the common one-sided WRs from memory slices.
//! - Errors are [`Error`], with [`Error::errno`] the errno `libibverbs` would return; it
//!   converts into `std::io::Error` (same errno) for code that uses `io::Result`.
//! - [`QueuePairEndpoint`] carries the GID (RoCE needs it; LID is always 0) and implements
//!   `serde::Serialize` / `Deserialize` for the out-of-band exchange, as in the crate.
//! - QP defaults are those of rdma-core's `ibv_rc_pingpong` where the `ibverbs` crate's
//!   would make a userspace device retransmit needlessly (see [`QueuePairBuilder`]).
//!
//! # Example: connect two devices on loopback and do an RDMA WRITE
//!
//! ```
//! use softroce_ibverbs::{self as ibverbs, AccessFlags, QpType, Wc, WcStatus};
//! use std::time::Duration;
//!
//! # fn main() -> Result<(), ibverbs::Error> {
//! let list = ibverbs::DeviceList::with_ip(&["127.0.24.101".parse().unwrap(),
//!                                           "127.0.24.102".parse().unwrap()]);
//! let (a, b) = (list[0].open()?, list[1].open()?);
//!
//! // Each side: PD, CQ, a registered buffer and an RC queue pair.
//! let (pd_a, pd_b) = (a.alloc_pd()?, b.alloc_pd()?);
//! let (cq_a, cq_b) = (a.create_cq(16, 0)?, b.create_cq(16, 0)?);
//! let src = pd_a.allocate(64)?;
//! let dst = pd_b.allocate(64)?;
//! src.write(0, b"hello from a")?;
//! let prep_a = pd_a
//!     .create_qp(&cq_a, &cq_a, QpType::Rc)
//!     .set_access(AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
//!     .build()?;
//! let prep_b = pd_b
//!     .create_qp(&cq_b, &cq_b, QpType::Rc)
//!     .set_access(AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
//!     .build()?;
//!
//! // Out of band (here: JSON strings), swap endpoints, then handshake on both sides.
//! let end_a = serde_json::to_string(&prep_a.endpoint()).unwrap();
//! let end_b = serde_json::to_string(&prep_b.endpoint()).unwrap();
//! let mut qp_a = prep_a.handshake(serde_json::from_str(&end_b).unwrap())?;
//! let _qp_b = prep_b.handshake(serde_json::from_str(&end_a).unwrap())?;
//!
//! // WRITE 12 bytes into b's buffer and wait for the completion.
//! qp_a.post_write(&[src.slice(0..12)], dst.remote().slice(0..12), 7, None)?;
//! let mut wc = [Wc::default(); 4];
//! let done = cq_a.wait(&mut wc, Duration::from_secs(10))?;
//! assert_eq!(done.len(), 1);
//! assert_eq!((done[0].wr_id, done[0].status), (7, WcStatus::Success));
//! assert_eq!(&dst.to_vec()[..12], b"hello from a");
//! # Ok(())
//! # }
//! ```

pub mod cm;

pub use cm::{CmConnection, CmListener, ConnectRequest, Rejected};
pub use softroce::wire::cm::RejReason;

use softroce::net::UdpDevice;
use softroce::verbs::{self, QpCap, QpInitAttr};
use std::net::IpAddr;
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

pub use softroce::verbs::{
    AccessFlags, Gid, PathMtu, QpType, RecvWr, SendFlags, SendWr, Sge, UdDest, Wc, WcFlags,
    WcOpcode, WcStatus, WrOpcode,
};

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
    /// The peer's Communication Manager refused a connection ([`cm`]: REJ); `errno()` is
    /// ECONNREFUSED, as librdmacm's synchronous calls report it.
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

/// The environment variable [`devices`] reads: the device addresses, separated by commas
/// or white space (see [`softroce::net::discover`]).
pub use softroce::net::discover::SOFTROCE_IP;

/// `ibv_get_device_list`: the softroce devices configured for this process, one per
/// address in `$SOFTROCE_IP` (default `127.0.0.1`), named `softroce0`, `softroce1`, … in
/// order. Nothing is opened.
///
/// Errors: [`Error::Io`] with `EINVAL` when `$SOFTROCE_IP` holds something that is not an
/// IP address, or no address at all.
///
/// ```
/// // With SOFTROCE_IP unset this is one device on 127.0.0.1.
/// let list = softroce_ibverbs::devices().unwrap();
/// assert!(!list.is_empty());
/// assert!(list[0].name().starts_with("softroce"));
/// ```
pub fn devices() -> Result<DeviceList> {
    softroce::net::discover::devices_from_env()
        .map(DeviceList::from_addrs)
        .map_err(discover_error)
}

/// A [`softroce::net::discover::DiscoverError`] as this API's `EINVAL` I/O error.
fn discover_error(e: softroce::net::discover::DiscoverError) -> Error {
    Error::Io(std::io::Error::new(
        std::io::ErrorKind::InvalidInput,
        e.to_string(),
    ))
}

impl DeviceList {
    /// The list [`devices`] makes from the text of `$SOFTROCE_IP`: addresses separated by
    /// commas or white space. Errors: as [`devices`].
    ///
    /// ```
    /// let l = softroce_ibverbs::DeviceList::parse("127.0.24.1, 127.0.24.2 ::1").unwrap();
    /// assert_eq!(l.len(), 3);
    /// assert_eq!((l[2].name(), l[2].ip().to_string().as_str()), ("softroce2", "::1"));
    /// assert_eq!(softroce_ibverbs::DeviceList::parse("10.0.0.300").unwrap_err().errno(), 22);
    /// ```
    pub fn parse(text: &str) -> Result<DeviceList> {
        softroce::net::discover::parse_device_list(text)
            .map(DeviceList::from_addrs)
            .map_err(discover_error)
    }

    fn from_addrs(addrs: Vec<softroce::net::discover::DeviceAddr>) -> DeviceList {
        DeviceList {
            devices: addrs
                .into_iter()
                .map(|d| Device {
                    name: d.name,
                    ip: d.ip,
                })
                .collect(),
        }
    }
}

/// The list of devices ([`devices`], [`DeviceList::with_ip`]). Derefs to `[Device]`.
#[derive(Debug, Clone)]
pub struct DeviceList {
    devices: Vec<Device>,
}

impl DeviceList {
    /// One device per address, named `softroce0`, `softroce1`, … in order.
    pub fn with_ip(ips: &[IpAddr]) -> DeviceList {
        DeviceList::from_addrs(softroce::net::discover::device_list(ips))
    }
}

impl core::ops::Deref for DeviceList {
    type Target = [Device];
    fn deref(&self) -> &[Device] {
        &self.devices
    }
}

/// A device that can be opened: a name and the IP address it will own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Device {
    name: String,
    ip: IpAddr,
}

impl Device {
    /// The device name (`hca_id`), e.g. `softroce0`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The address the device binds (UDP port 4791); its GID index 1 names it.
    pub fn ip(&self) -> IpAddr {
        self.ip
    }

    /// `ibv_open_device`: binds the device's UDP port 4791 and starts its driver thread,
    /// with the process's default [`softroce::net::UdpOptions`].
    ///
    /// Errors: [`Error::Io`] with the bind error (`EADDRINUSE`, `EADDRNOTAVAIL`).
    ///
    /// ```
    /// use softroce_ibverbs::DeviceList;
    /// let list = DeviceList::with_ip(&["127.0.24.103".parse().unwrap()]);
    /// let ctx = list[0].open().unwrap();
    /// assert_eq!(ctx.gid(1).unwrap().to_string(), "::ffff:127.0.24.103");
    /// let pd = ctx.alloc_pd().unwrap();
    /// let mr = pd.register(b"registered bytes").unwrap();
    /// assert_eq!((mr.len(), mr.to_vec()), (16, b"registered bytes".to_vec()));
    /// // The address is now taken: a second open fails with EADDRINUSE (98).
    /// assert_eq!(list[0].open().unwrap_err().errno(), 98);
    /// ```
    pub fn open(&self) -> Result<Context> {
        let dev = UdpDevice::open(&self.name, self.ip)?;
        Ok(Context { dev: Arc::new(dev) })
    }
}

/// An open device (`ibv_context`). Cloning gives another handle; the device closes (its
/// socket and thread end) when the last handle and the last object made from it are gone.
#[derive(Debug, Clone)]
pub struct Context {
    dev: Arc<UdpDevice>,
}

impl Context {
    /// `ibv_create_cq` with at least `min_cq_entries` entries; `id` is the caller's tag
    /// (the `ibverbs` crate's `cq_context`), returned by [`CompletionQueue::id`].
    ///
    /// Errors: `EINVAL` for a size below 1 or above the device's `max_cqe` (2^20).
    pub fn create_cq(&self, min_cq_entries: i32, id: isize) -> Result<CompletionQueue> {
        let n = u32::try_from(min_cq_entries)
            .map_err(|_| verbs::Error::new(verbs::ErrorKind::Inval, "create_cq: negative size"))?;
        Ok(CompletionQueue {
            cq: self.dev.create_cq(n)?,
            id,
            dev: self.dev.clone(),
        })
    }

    /// `ibv_alloc_pd`. Errors: `ENOMEM` past the device's PD limit.
    pub fn alloc_pd(&self) -> Result<ProtectionDomain> {
        Ok(ProtectionDomain {
            pd: self.dev.alloc_pd()?,
            dev: self.dev.clone(),
        })
    }

    /// `ibv_query_gid` on port 1. Index 1 is the device address (IPv4-mapped for IPv4);
    /// index 0 the link-local GID. Errors: `EINVAL` past the table (2 entries).
    pub fn gid(&self, index: u32) -> Result<Gid> {
        let i = u8::try_from(index).unwrap_or(u8::MAX);
        Ok(self.dev.query_gid(1, i)?.gid)
    }

    /// The verbs device underneath (device attributes, counters, QP1, …).
    pub fn verbs(&self) -> &verbs::Device {
        self.dev.device()
    }

    /// The device's Communication Manager ([`cm`] uses it): its engine (state, counters)
    /// through [`CmDriver::with`](softroce::net::CmDriver::with). Started on first use; it
    /// takes over QP1. Errors: those of starting it (QP1 unusable).
    pub fn cm(&self) -> Result<Arc<softroce::net::CmDriver>> {
        Ok(self.dev.cm()?)
    }

    /// Test hook: makes the device's driver thread panic
    /// ([`UdpDevice::inject_panic_for_test`](softroce::net::UdpDevice::inject_panic_for_test)),
    /// which fails the device. Not for use outside tests.
    #[doc(hidden)]
    pub fn inject_panic_for_test(&self) {
        self.dev.inject_panic_for_test();
    }
}

/// A completion queue (`ibv_cq`).
#[derive(Debug)]
pub struct CompletionQueue {
    cq: verbs::Cq,
    id: isize,
    dev: Arc<UdpDevice>,
}

impl CompletionQueue {
    /// `ibv_poll_cq`: moves up to `completions.len()` work completions into the front of
    /// `completions`, oldest first, and returns that filled prefix (empty when none was
    /// ready). Never blocks. Errors: none today (the `Result` is the crate's shape).
    pub fn poll<'c>(&self, completions: &'c mut [Wc]) -> Result<&'c mut [Wc]> {
        let n = self.cq.poll(completions);
        Ok(completions.get_mut(..n).unwrap_or_default())
    }

    /// Like [`CompletionQueue::poll`], but first waits up to `timeout` for at least one
    /// completion (softroce addition, in place of a completion channel). Returns the filled
    /// prefix, empty on timeout.
    /// Errors: `EIO` when the device failed (its driver thread panicked) and the CQ holds
    /// nothing more (the WRs outstanding then were flushed into it first).
    pub fn wait<'c>(&self, completions: &'c mut [Wc], timeout: Duration) -> Result<&'c mut [Wc]> {
        let n = self.cq.wait(completions, timeout);
        if n == 0
            && !completions.is_empty()
            && let Some(why) = self.dev.failure()
        {
            return Err(Error::Verbs(verbs::Error::new(
                verbs::ErrorKind::Io,
                format!("wait on a CQ of device {}: {why}", self.dev.name()),
            )));
        }
        Ok(completions.get_mut(..n).unwrap_or_default())
    }

    /// The `id` given to [`Context::create_cq`].
    pub fn id(&self) -> isize {
        self.id
    }
}

/// A protection domain (`ibv_pd`).
#[derive(Debug)]
pub struct ProtectionDomain {
    pd: verbs::Pd,
    dev: Arc<UdpDevice>,
}

/// The access [`ProtectionDomain::allocate`] and [`ProtectionDomain::register`] grant, as
/// the `ibverbs` crate's `allocate`: local write, remote write, read and atomic.
const ALL_ACCESS: AccessFlags = AccessFlags(
    AccessFlags::LOCAL_WRITE.0
        | AccessFlags::REMOTE_WRITE.0
        | AccessFlags::REMOTE_READ.0
        | AccessFlags::REMOTE_ATOMIC.0,
);

impl ProtectionDomain {
    /// `ibv_reg_mr` of `n` new zeroed bytes with local write, remote write, remote read and
    /// remote atomic access. Units: bytes (the `ibverbs` crate counts elements of `T`).
    ///
    /// Errors: `EINVAL` for `n` = 0 or over 2 GiB; `ENOMEM` when the MR table is full.
    pub fn allocate(&self, n: usize) -> Result<MemoryRegion> {
        Ok(MemoryRegion {
            mr: self.pd.reg_mr(n, ALL_ACCESS)?,
            _dev: self.dev.clone(),
        })
    }

    /// Registers a copy of `data` (same access as [`ProtectionDomain::allocate`]): the MR
    /// holds its own bytes, so later changes to `data` are not seen by the device.
    /// Errors: as [`ProtectionDomain::allocate`] for `data.len()`.
    pub fn register(&self, data: &[u8]) -> Result<MemoryRegion> {
        let mr = self.allocate(data.len())?;
        mr.write(0, data)?;
        Ok(mr)
    }

    /// Starts building a queue pair of type `qp_type` (RC, UC or UD) whose send completions
    /// go to `send` and receive completions to `recv` (which may be the same CQ).
    pub fn create_qp(
        &self,
        send: &CompletionQueue,
        recv: &CompletionQueue,
        qp_type: QpType,
    ) -> QueuePairBuilder {
        QueuePairBuilder {
            pd: self.pd.clone(),
            dev: self.dev.clone(),
            send: send.cq.clone(),
            recv: recv.cq.clone(),
            qp_type,
            cap: QpCap {
                max_send_wr: 1,
                max_recv_wr: 1,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            access: AccessFlags::LOCAL_WRITE,
            gid_index: 1,
            path_mtu: PathMtu::Mtu1024,
            timeout: 14,
            retry_count: 7,
            rnr_retry: 7,
            min_rnr_timer: 12,
            max_rd_atomic: 1,
            max_dest_rd_atomic: 1,
            traffic_class: 0,
            hop_limit: 64,
            qkey: 0x1111_1111,
        }
    }
}

/// A registered memory region (`ibv_mr`) that owns its bytes. Dropping it deregisters it.
#[derive(Debug)]
pub struct MemoryRegion {
    mr: verbs::Mr,
    _dev: Arc<UdpDevice>,
}

impl MemoryRegion {
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.mr.len()
    }
    /// Never true (registration needs at least one byte).
    pub fn is_empty(&self) -> bool {
        self.mr.is_empty()
    }
    /// Local key.
    pub fn lkey(&self) -> u32 {
        self.mr.lkey()
    }
    /// Remote key.
    pub fn rkey(&self) -> u32 {
        self.mr.rkey()
    }
    /// The address of byte 0 (what a peer puts in its RETH).
    pub fn addr(&self) -> u64 {
        self.mr.addr()
    }
    /// Copies bytes out, from `offset`. Errors: `EINVAL` if the range leaves the MR.
    pub fn read(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        Ok(self.mr.read(offset, out)?)
    }
    /// Copies bytes in, at `offset`. Errors: `EINVAL` if the range leaves the MR.
    pub fn write(&self, offset: usize, data: &[u8]) -> Result<()> {
        Ok(self.mr.write(offset, data)?)
    }
    /// The whole MR.
    pub fn to_vec(&self) -> Vec<u8> {
        self.mr.to_vec()
    }
    /// The bytes `range` of this MR as the SGE of a local work request. Panics: never; a
    /// range outside the MR makes the post (or the transfer) fail with a local protection
    /// error instead, as a bad SGE does in verbs.
    pub fn slice(&self, range: Range<usize>) -> LocalMemorySlice {
        let length = range.end.saturating_sub(range.start);
        LocalMemorySlice {
            sge: Sge {
                addr: self.mr.addr().wrapping_add(range.start as u64),
                length: u32::try_from(length).unwrap_or(u32::MAX),
                lkey: self.mr.lkey(),
            },
        }
    }
    /// The whole MR as the peer names it: address, length, rkey. Send it out of band.
    pub fn remote(&self) -> RemoteMemorySlice {
        RemoteMemorySlice {
            addr: self.mr.addr(),
            length: self.mr.len() as u64,
            rkey: self.mr.rkey(),
        }
    }
}

/// A local buffer for a work request: one scatter/gather element (`struct ibv_sge`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalMemorySlice {
    sge: Sge,
}

impl LocalMemorySlice {
    /// The SGE.
    pub fn sge(&self) -> Sge {
        self.sge
    }
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.sge.length as usize
    }
    /// True for a zero-length slice.
    pub fn is_empty(&self) -> bool {
        self.sge.length == 0
    }
}

/// A peer's registered memory, as exchanged out of band: `addr` (the peer MR's address of
/// the first byte), `length` in bytes and `rkey`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RemoteMemorySlice {
    /// Address of the first byte in the peer's MR.
    pub addr: u64,
    /// Length in bytes.
    pub length: u64,
    /// The peer MR's remote key.
    pub rkey: u32,
}

impl RemoteMemorySlice {
    /// The bytes `range` of this slice (clamped to it).
    pub fn slice(&self, range: Range<u64>) -> RemoteMemorySlice {
        let start = range.start.min(self.length);
        let end = range.end.clamp(start, self.length);
        RemoteMemorySlice {
            addr: self.addr.wrapping_add(start),
            length: end - start,
            rkey: self.rkey,
        }
    }
}

/// Builds a queue pair (`ibv_create_qp` + the attributes its `ibv_modify_qp` calls will
/// use). Setters take and return `&mut Self`; [`QueuePairBuilder::build`] creates the QP.
///
/// Defaults: 1 send and 1 receive WR of 1 SGE each; access `LOCAL_WRITE`; GID index 1;
/// path MTU 1024; `timeout` 14 (4.096 µs × 2^14 ≈ 67 ms), `retry_count` 7, `rnr_retry` 7
/// (forever), `min_rnr_timer` 12 (0.64 ms) — the values of rdma-core's `ibv_rc_pingpong`;
/// 1 outstanding READ/atomic each way; traffic class 0, hop limit 64; UD Q_Key 0x11111111.
#[derive(Debug, Clone)]
pub struct QueuePairBuilder {
    pd: verbs::Pd,
    dev: Arc<UdpDevice>,
    send: verbs::Cq,
    recv: verbs::Cq,
    qp_type: QpType,
    cap: QpCap,
    access: AccessFlags,
    gid_index: u8,
    path_mtu: PathMtu,
    timeout: u8,
    retry_count: u8,
    rnr_retry: u8,
    min_rnr_timer: u8,
    max_rd_atomic: u8,
    max_dest_rd_atomic: u8,
    traffic_class: u8,
    hop_limit: u8,
    qkey: u32,
}

impl QueuePairBuilder {
    /// Remote access the QP allows (`qp_access_flags`).
    pub fn set_access(&mut self, access: AccessFlags) -> &mut Self {
        self.access = access;
        self
    }
    /// Index of the local GID to send from (`ah_attr.grh.sgid_index`); only 1, the device
    /// address, can send (0 makes the handshake fail with `EINVAL`).
    pub fn set_gid_index(&mut self, index: u8) -> &mut Self {
        self.gid_index = index;
        self
    }
    /// Send queue depth (`cap.max_send_wr`), 1..=16384.
    pub fn set_max_send_wr(&mut self, n: u32) -> &mut Self {
        self.cap.max_send_wr = n;
        self
    }
    /// Receive queue depth (`cap.max_recv_wr`), 0..=16384.
    pub fn set_max_recv_wr(&mut self, n: u32) -> &mut Self {
        self.cap.max_recv_wr = n;
        self
    }
    /// SGEs per send WR (`cap.max_send_sge`), up to 32.
    pub fn set_max_send_sge(&mut self, n: u32) -> &mut Self {
        self.cap.max_send_sge = n;
        self
    }
    /// SGEs per receive WR (`cap.max_recv_sge`), up to 32.
    pub fn set_max_recv_sge(&mut self, n: u32) -> &mut Self {
        self.cap.max_recv_sge = n;
        self
    }
    /// Path MTU (`path_mtu`); both sides must agree.
    pub fn set_path_mtu(&mut self, mtu: PathMtu) -> &mut Self {
        self.path_mtu = mtu;
        self
    }
    /// ACK timeout exponent (`timeout`, 0..=31): 4.096 µs × 2^timeout.
    pub fn set_timeout(&mut self, timeout: u8) -> &mut Self {
        self.timeout = timeout;
        self
    }
    /// Retries after an ACK timeout (`retry_cnt`, 0..=7).
    pub fn set_retry_count(&mut self, count: u8) -> &mut Self {
        self.retry_count = count;
        self
    }
    /// Retries after an RNR NAK (`rnr_retry`, 0..=7; 7 = forever).
    pub fn set_rnr_retry(&mut self, count: u8) -> &mut Self {
        self.rnr_retry = count;
        self
    }
    /// RNR NAK timer code this QP sends (`min_rnr_timer`, 0..=31; 12 = 0.64 ms).
    pub fn set_min_rnr_timer(&mut self, code: u8) -> &mut Self {
        self.min_rnr_timer = code;
        self
    }
    /// Outstanding READ/atomics this QP issues (`max_rd_atomic`).
    pub fn set_max_rd_atomic(&mut self, n: u8) -> &mut Self {
        self.max_rd_atomic = n;
        self
    }
    /// Outstanding READ/atomics this QP accepts (`max_dest_rd_atomic`).
    pub fn set_max_dest_rd_atomic(&mut self, n: u8) -> &mut Self {
        self.max_dest_rd_atomic = n;
        self
    }
    /// Traffic class (IPv4 TOS) of the packets (`ah_attr.grh.traffic_class`).
    pub fn set_traffic_class(&mut self, tc: u8) -> &mut Self {
        self.traffic_class = tc;
        self
    }
    /// Hop limit / TTL (`ah_attr.grh.hop_limit`).
    pub fn set_hop_limit(&mut self, hops: u8) -> &mut Self {
        self.hop_limit = hops;
        self
    }
    /// Q_Key of a UD QP (`qkey`).
    pub fn set_qkey(&mut self, qkey: u32) -> &mut Self {
        self.qkey = qkey;
        self
    }

    /// `ibv_create_qp`: the QP exists (in RESET) and has a number; exchange its
    /// [`PreparedQueuePair::endpoint`], then [`PreparedQueuePair::handshake`].
    ///
    /// Errors: `EINVAL` for queue sizes over the device limits; `ENOMEM` past the QP limit.
    pub fn build(&self) -> Result<PreparedQueuePair> {
        let qp = self.pd.create_qp(&QpInitAttr {
            qp_type: self.qp_type,
            send_cq: &self.send,
            recv_cq: &self.recv,
            cap: self.cap,
            sq_sig_all: false,
            srq: None,
        })?;
        Ok(PreparedQueuePair {
            qp,
            b: self.clone(),
        })
    }
}

/// A created queue pair that is not connected yet.
#[derive(Debug)]
pub struct PreparedQueuePair {
    qp: verbs::Qp,
    b: QueuePairBuilder,
}

/// What the peer needs to connect to a queue pair: QP number, LID (0 on RoCE) and GID
/// (the device address). Serialisable for the out-of-band exchange. Both sides start
/// their PSNs at 0, as the `ibverbs` crate does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct QueuePairEndpoint {
    /// QP number (24 bits).
    pub num: u32,
    /// LID: always 0 on RoCE.
    pub lid: u16,
    /// The GID the QP sends from; `None` is refused by [`PreparedQueuePair::handshake`]
    /// (RoCE addresses by GID).
    #[serde(with = "gid_text")]
    pub gid: Option<Gid>,
}

/// `serde` for [`QueuePairEndpoint::gid`]: a GID as its `inet_ntop` text, e.g.
/// `"::ffff:127.0.24.1"` (any IPv6 address text is read back), `null` for none.
mod gid_text {
    use super::Gid;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(gid: &Option<Gid>, s: S) -> Result<S::Ok, S::Error> {
        match gid {
            Some(g) => s.collect_str(g),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Gid>, D::Error> {
        let text = <Option<std::borrow::Cow<'de, str>>>::deserialize(d)?;
        text.map(|t| {
            t.parse::<std::net::Ipv6Addr>()
                .map(|a| Gid(a.octets()))
                .map_err(serde::de::Error::custom)
        })
        .transpose()
    }
}

impl PreparedQueuePair {
    /// This QP's endpoint, to send to the peer.
    pub fn endpoint(&self) -> QueuePairEndpoint {
        QueuePairEndpoint {
            num: self.qp.qp_num(),
            lid: 0,
            gid: self
                .b
                .dev
                .query_gid(1, self.b.gid_index)
                .ok()
                .map(|g| g.gid),
        }
    }

    /// Connects the QP to `remote` with `ibv_modify_qp` RESET→INIT→RTR→RTS, using the
    /// builder's attributes (for UC, those UC takes; for UD, INIT with the Q_Key, then RTR
    /// and RTS: `remote` is not used, each UD send names its destination in `wr.ud`).
    ///
    /// Errors: `EINVAL` for a remote endpoint without a GID or of another IP family, a GID
    /// index other than 1, or attribute values out of range (each named, see
    /// [`softroce::verbs::check_modify`]).
    pub fn handshake(self, remote: QueuePairEndpoint) -> Result<QueuePair> {
        let b = &self.b;
        let qp = &self.qp;
        if b.qp_type == QpType::Ud {
            qp.ready_ud(b.qkey, 0)?;
            return Ok(QueuePair {
                qp: self.qp,
                remote,
                _dev: self.b.dev.clone(),
            });
        }
        let Some(dgid) = remote.gid else {
            return Err(verbs::Error::new(
                verbs::ErrorKind::Inval,
                "handshake: the remote endpoint has no GID (RoCE needs one)",
            )
            .into());
        };
        // The library's one connect sequence (UC takes only the attributes UC has).
        qp.connect_rc(&verbs::RcConnect {
            sgid_index: b.gid_index,
            hop_limit: b.hop_limit,
            traffic_class: b.traffic_class,
            path_mtu: b.path_mtu,
            qp_access_flags: b.access,
            timeout: b.timeout,
            retry_cnt: b.retry_count,
            rnr_retry: b.rnr_retry,
            min_rnr_timer: b.min_rnr_timer,
            max_rd_atomic: b.max_rd_atomic,
            max_dest_rd_atomic: b.max_dest_rd_atomic,
            ..verbs::RcConnect::new(remote.num, dgid, 0, 0)
        })?;
        Ok(QueuePair {
            qp: self.qp,
            remote,
            _dev: self.b.dev.clone(),
        })
    }
}

/// A connected queue pair (`ibv_qp` in RTS). Dropping it destroys it.
#[derive(Debug)]
pub struct QueuePair {
    qp: verbs::Qp,
    remote: QueuePairEndpoint,
    _dev: Arc<UdpDevice>,
}

impl QueuePair {
    /// `ibv_post_send`: queues `wrs` in order and starts sending.
    ///
    /// Errors (with [`Error::bad_wr`] the index of the first refused WR; the ones before it
    /// were posted): `EINVAL` for a WR the QP cannot take (too many SGEs, a bad atomic, a UD
    /// WR without `ud`), `ENOMEM` when the send queue is full, `EOPNOTSUPP` for an opcode
    /// the QP type cannot carry.
    ///
    /// ```
    /// use softroce_ibverbs::{DeviceList, QpType, RecvWr, SendFlags, SendWr, Wc, WcOpcode, WrOpcode};
    /// use std::time::Duration;
    /// // A UD QP sends to itself on 127.0.24.104.
    /// let ctx = DeviceList::with_ip(&["127.0.24.104".parse().unwrap()])[0].open().unwrap();
    /// let (pd, cq) = (ctx.alloc_pd().unwrap(), ctx.create_cq(8, 0).unwrap());
    /// let prep = pd.create_qp(&cq, &cq, QpType::Ud).set_max_send_wr(4).set_max_recv_wr(4).build().unwrap();
    /// let me = prep.endpoint();
    /// let mut qp = prep.handshake(me).unwrap();
    /// let (buf, rbuf) = (pd.register(b"datagram").unwrap(), pd.allocate(40 + 8).unwrap());
    /// qp.post_receive(&[RecvWr { wr_id: 1, sg_list: vec![rbuf.slice(0..48).sge()] }]).unwrap();
    /// let mut send = SendWr::new(2, WrOpcode::Send, vec![buf.slice(0..8).sge()]);
    /// send.send_flags = SendFlags::empty(); // unsignaled: only the receive completes
    /// send.ud = Some(softroce_ibverbs::UdDest {
    ///     remote_ip: ctx.verbs().ip(),
    ///     remote_qpn: me.num,
    ///     remote_qkey: 0x1111_1111,
    ///     ip: Default::default(),
    /// });
    /// // The second WR has two SGEs, one more than the QP takes: refused, index 1.
    /// let mut bad = send.clone();
    /// bad.sg_list.push(buf.slice(0..1).sge());
    /// let e = qp.post_send(&[send, bad]).unwrap_err();
    /// assert_eq!((e.errno(), e.bad_wr()), (22, Some(1)));
    /// // The first was posted: its datagram arrives after the 40-byte GRH.
    /// let mut wc = [Wc::default(); 2];
    /// let got = cq.wait(&mut wc, Duration::from_secs(10)).unwrap();
    /// assert_eq!((got[0].wr_id, got[0].opcode, got[0].byte_len), (1, WcOpcode::Recv, 48));
    /// assert_eq!(&rbuf.to_vec()[40..], b"datagram");
    /// ```
    pub fn post_send(&mut self, wrs: &[SendWr]) -> Result<()> {
        Ok(self.qp.post_send(wrs)?)
    }

    /// `ibv_post_recv`: queues receive buffers in order. Errors as
    /// [`QueuePair::post_send`] (`ENOMEM` when the receive queue is full).
    pub fn post_receive(&mut self, wrs: &[RecvWr]) -> Result<()> {
        Ok(self.qp.post_recv(wrs)?)
    }

    /// A signaled RDMA WRITE (with immediate data when `imm_data` is given) of `local` to
    /// `remote`, as WR `wr_id`. Errors: as [`QueuePair::post_send`].
    pub fn post_write(
        &mut self,
        local: &[LocalMemorySlice],
        remote: RemoteMemorySlice,
        wr_id: u64,
        imm_data: Option<u32>,
    ) -> Result<()> {
        let opcode = if imm_data.is_some() {
            WrOpcode::RdmaWriteWithImm
        } else {
            WrOpcode::RdmaWrite
        };
        let mut wr = SendWr::new(wr_id, opcode, local.iter().map(|s| s.sge).collect());
        wr.send_flags = SendFlags::SIGNALED;
        wr.imm_data = imm_data.unwrap_or(0);
        wr.remote_addr = remote.addr;
        wr.rkey = remote.rkey;
        self.post_send(&[wr])
    }

    /// A signaled RDMA READ of `remote` into `local`, as WR `wr_id`. Errors: as
    /// [`QueuePair::post_send`].
    pub fn post_read(
        &mut self,
        local: &[LocalMemorySlice],
        remote: RemoteMemorySlice,
        wr_id: u64,
    ) -> Result<()> {
        let mut wr = SendWr::new(
            wr_id,
            WrOpcode::RdmaRead,
            local.iter().map(|s| s.sge).collect(),
        );
        wr.send_flags = SendFlags::SIGNALED;
        wr.remote_addr = remote.addr;
        wr.rkey = remote.rkey;
        self.post_send(&[wr])
    }

    /// This QP's number.
    pub fn qp_num(&self) -> u32 {
        self.qp.qp_num()
    }

    /// The endpoint given to the handshake.
    pub fn remote(&self) -> QueuePairEndpoint {
        self.remote
    }

    /// The verbs QP underneath (`modify`, `state`, counters, multicast attach).
    pub fn verbs(&self) -> &verbs::Qp {
        &self.qp
    }
}

/// The Rust snippets of the repository's README.md, compiled (not run) by `cargo test` as
/// doctests, so that what the README shows keeps building.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
struct ReadmeSnippets;
