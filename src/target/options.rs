//! The command-line options of `softroce target`.

use super::text::parse_psn;
use clap::Args;
use std::net::IpAddr;

/// Options of `softroce target`.
#[derive(Args, Debug)]
pub struct TargetArgs {
    #[command(flatten)]
    pub net: crate::NetArgs,
    /// Address the device binds (UDP 4791); default $SOFTROCE_IP, else 127.0.0.1.
    #[arg(long)]
    pub(super) ip: Option<IpAddr>,
    /// Device name.
    #[arg(short = 'd', long = "ib-dev", default_value = "softroce0")]
    pub(super) ib_dev: String,
    /// Bytes of each MR to register; repeat (or comma-separate) for several MRs.
    #[arg(long = "mr-size", value_name = "BYTES", value_delimiter = ',', default_values_t = [4096usize])]
    pub(super) mr_size: Vec<usize>,
    /// Register this many MRs of the (single) --mr-size.
    #[arg(long = "mr-count", value_name = "N")]
    pub(super) mr_count: Option<usize>,
    /// Access flags of the MRs (and of the QP unless --qp-access), comma-separated:
    /// local_write, remote_write, remote_read, remote_atomic (or `none`).
    #[arg(
        long,
        value_name = "LIST",
        default_value = "local_write,remote_write,remote_read,remote_atomic"
    )]
    pub(super) access: String,
    /// The QP's remote access flags (`qp_access_flags`), if they differ from --access.
    #[arg(long = "qp-access", value_name = "LIST")]
    pub(super) qp_access: Option<String>,
    /// Path MTU in bytes (256, 512, 1024, 2048 or 4096).
    #[arg(long = "path-mtu", value_name = "BYTES", default_value_t = 1024)]
    pub(super) path_mtu: u32,
    /// RNR timer code (0..=31) this responder sends in RNR NAKs (AETH 0x20 | code).
    #[arg(long = "min-rnr-timer", value_name = "CODE", default_value_t = 12)]
    pub(super) min_rnr_timer: u8,
    /// The QP's `max_dest_rd_atomic` (0: every READ and atomic is NAKed invalid request).
    #[arg(long = "max-dest-rd-atomic", value_name = "N", default_value_t = 1)]
    pub(super) max_dest_rd_atomic: u8,
    /// Post no receives at connect and never re-post (use `post_recv`).
    #[arg(long = "no-recv")]
    pub(super) no_recv: bool,
    /// Receives kept posted (and receive slots in the receive MR).
    #[arg(long = "recv-depth", value_name = "N", default_value_t = 16)]
    pub(super) recv_depth: u32,
    /// Bytes of each receive slot.
    #[arg(long = "recv-size", value_name = "BYTES", default_value_t = 4096)]
    pub(super) recv_size: u32,
    /// First PSN this QP sends (`sq_psn`), decimal or 0x hex; default random.
    #[arg(long, value_name = "PSN", value_parser = parse_psn)]
    pub(super) psn: Option<u32>,
}
