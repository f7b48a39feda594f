//! `softroce devinfo`.

use super::BoxError;
use softroce::verbs::{GidType, PathMtu};
use std::io::Write as _;
use std::net::IpAddr;

fn mtu_str(m: PathMtu) -> String {
    format!("{} ({})", m.bytes(), m as u8)
}

/// Prints an `ibv_devinfo -v`-shaped description of device `name` on `ip`.
pub fn run(ip: IpAddr, name: &str) -> Result<(), BoxError> {
    // Describing a device needs no socket: a device on `ip` with a link that sends nothing,
    // so devinfo works while another process runs a device on that address.
    let dev = softroce::verbs::Device::new(
        softroce::verbs::DeviceConfig::new(name, ip),
        std::sync::Arc::new(NoLink),
        std::sync::Arc::new(softroce::net::SystemClock::new()),
    );
    let a = dev.query_device();
    let p = dev.query_port(1)?;
    let guid = |g: u64| {
        let b = g.to_be_bytes();
        format!(
            "{:02x}{:02x}:{:02x}{:02x}:{:02x}{:02x}:{:02x}{:02x}",
            b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]
        )
    };
    // Written at once; a reader that closes the pipe early (`softroce devinfo | head`) is not
    // an error.
    let mut out = String::new();
    macro_rules! w {
        ($($t:tt)*) => {{
            use std::fmt::Write as _;
            let _ = writeln!(out, $($t)*);
        }};
    }
    w!("hca_id:\t{}", dev.name());
    w!("\ttransport:\t\t\tInfiniBand (0)");
    w!("\tfw_ver:\t\t\t\t{}", a.fw_ver);
    w!("\tnode_guid:\t\t\t{}", guid(a.node_guid));
    w!("\tsys_image_guid:\t\t\t{}", guid(a.sys_image_guid));
    w!("\tvendor_id:\t\t\t{:#x}", a.vendor_id);
    w!("\tvendor_part_id:\t\t\t0");
    w!("\thw_ver:\t\t\t\t0x0");
    w!("\tphys_port_cnt:\t\t\t{}", a.phys_port_cnt);
    w!("\tmax_mr_size:\t\t\t{:#x}", a.max_mr_size);
    w!("\tmax_qp:\t\t\t\t{}", a.max_qp);
    w!("\tmax_qp_wr:\t\t\t{}", a.max_qp_wr);
    w!("\tmax_sge:\t\t\t{}", a.max_sge);
    w!("\tmax_cq:\t\t\t\t{}", a.max_cq);
    w!("\tmax_cqe:\t\t\t{}", a.max_cqe);
    w!("\tmax_mr:\t\t\t\t{}", a.max_mr);
    w!("\tmax_pd:\t\t\t\t{}", a.max_pd);
    w!("\tmax_qp_rd_atom:\t\t\t{}", a.max_qp_rd_atom);
    w!("\tmax_qp_init_rd_atom:\t\t{}", a.max_qp_init_rd_atom);
    w!("\tmax_srq:\t\t\t{}", a.max_srq);
    w!("\tmax_srq_wr:\t\t\t{}", a.max_srq_wr);
    w!("\tmax_srq_sge:\t\t\t{}", a.max_srq_sge);
    w!("\t\tport:\t1");
    w!("\t\t\tstate:\t\t\tPORT_ACTIVE ({})", p.state);
    w!("\t\t\tmax_mtu:\t\t{}", mtu_str(p.max_mtu));
    w!("\t\t\tactive_mtu:\t\t{}", mtu_str(p.active_mtu));
    w!("\t\t\tsm_lid:\t\t\t0");
    w!("\t\t\tport_lid:\t\t0");
    w!("\t\t\tport_lmc:\t\t0x00");
    w!("\t\t\tlink_layer:\t\t{}", p.link_layer);
    w!("\t\t\tgid_tbl_len:\t\t{}", p.gid_tbl_len);
    w!("\t\t\tpkey_tbl_len:\t\t{}", p.pkey_tbl_len);
    for g in dev.gids() {
        let kind = match g.gid_type {
            GidType::RoceV2 => "RoCE v2",
        };
        let ip6 = std::net::Ipv6Addr::from(g.gid.0);
        w!("\t\t\tGID[{:>3}]:\t\t{ip6}, {kind}", g.index);
    }
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(out.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        r => r.map_err(Into::into),
    }
}

/// A link for a device that is only described, never used to send.
struct NoLink;

impl softroce::verbs::Link for NoLink {
    fn send(&self, _t: &softroce::verbs::Transmit) -> std::io::Result<()> {
        Err(std::io::ErrorKind::NotConnected.into())
    }
}
