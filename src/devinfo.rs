//! `softroce devinfo`: rdma-core's `ibv_devinfo` for softroce devices.
//!
//! The devices are those of `softroce::net::discover` (`$SOFTROCE_IP`, one device per address,
//! `softroce0`, `softroce1`, …; `--ip` names a single `softroce0`), as every frontend sees them.
//! Each device described is opened for real (it binds UDP port 4791 on its address), so an
//! address not on this host, or one another process holds, fails with the bind error instead of
//! being reported as PORT_ACTIVE.
//!
//! Output: `ibv_devinfo`'s short form, or with `-v` its long one, in rdma-core's format and
//! field order (libibverbs/examples/devinfo.c as of rdma-core 44). Values come from the
//! engine's `query_device`, `query_port` and GID table, which carry kernel rxe's values
//! (rxe_param.h); fields the engine has no notion of (LIDs, EE contexts, raw QPs, FMRs,
//! on-demand paging, TSO, RSS, packet pacing, tag matching) print the zeros rxe reports.

use super::BoxError;
use clap::Args;
use softroce::net::UdpDevice;
use softroce::verbs::{AtomicCap, GidType, PathMtu};
use std::fmt::Write as _;
use std::io::Write as _;
use std::net::IpAddr;

/// Options of `softroce devinfo`: those of `ibv_devinfo`, plus `--ip`.
#[derive(Args, Debug)]
pub struct DevinfoArgs {
    #[command(flatten)]
    pub net: crate::NetArgs,
    /// Describe only the device on this address, named softroce0 (the device binds UDP port
    /// 4791 on it); default: every device of $SOFTROCE_IP (softroce0, softroce1, … in list
    /// order), else one on 127.0.0.1.
    #[arg(long)]
    ip: Option<IpAddr>,
    /// Use device NAME (default: every device found).
    #[arg(short = 'd', long = "ib-dev", value_name = "NAME")]
    ib_dev: Option<String>,
    /// Use port PORT of the device (default: all ports; softroce devices have port 1 only).
    #[arg(short = 'i', long = "ib-port", value_name = "PORT",
          value_parser = clap::value_parser!(u8).range(1..))]
    ib_port: Option<u8>,
    /// Print only the device names.
    #[arg(short = 'l', long = "list")]
    list: bool,
    /// Print all the attributes of the device(s), GID table included.
    #[arg(short = 'v', long = "verbose")]
    verbose: bool,
}

/// Runs `softroce devinfo`. Errors: `$SOFTROCE_IP` that names no address; "IB device 'NAME'
/// wasn't found"; "Invalid port requested for device"; a device that cannot be opened (the
/// bind error, naming the address). With several devices, each that can be opened is
/// printed and the errors of the others are reported together at the end.
pub fn run(a: DevinfoArgs) -> Result<(), BoxError> {
    let devices = match a.ip {
        Some(ip) => softroce::net::discover::device_list(&[ip]),
        None => softroce::net::discover::devices_from_env()?,
    };
    let mut out = String::new();
    if a.list {
        let n = devices.len();
        let _ = writeln!(out, "{n} HCA{} found:", if n != 1 { "s" } else { "" });
        for d in &devices {
            let _ = writeln!(out, "\t{}", d.name);
        }
        let _ = writeln!(out);
        return print(&out);
    }
    let chosen: Vec<_> = match &a.ib_dev {
        Some(name) => {
            let d = devices
                .iter()
                .find(|d| &d.name == name)
                .ok_or_else(|| format!("IB device '{name}' wasn't found"))?;
            vec![d.clone()]
        }
        None => devices,
    };
    let mut errors = Vec::new();
    for d in &chosen {
        // The error names the device, its address and port, and a hint.
        match UdpDevice::open(&d.name, d.ip) {
            Ok(dev) => describe(&mut out, &dev, a.ib_port, a.verbose)?,
            Err(e) => errors.push(e.to_string()),
        }
    }
    print(&out)?;
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors.join("\nsoftroce: ").into())
    }
}

/// Written at once; a reader that closes the pipe early (`softroce devinfo | head`) is not
/// an error.
fn print(out: &str) -> Result<(), BoxError> {
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(out.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        r => r.map_err(Into::into),
    }
}

fn mtu_str(m: PathMtu) -> String {
    format!("{} ({})", m.bytes(), m as u8)
}

/// devinfo.c `guid_str`: four groups of four hex digits.
pub(crate) fn guid_str(g: u64) -> String {
    format!(
        "{:04x}:{:04x}:{:04x}:{:04x}",
        (g >> 48) & 0xffff,
        (g >> 32) & 0xffff,
        (g >> 16) & 0xffff,
        g & 0xffff
    )
}

/// The names devinfo.c `print_device_cap_flags` prints, bit by bit, in its order.
const CAP_FLAG_NAMES: [(u32, &str); 24] = [
    (1 << 0, "RESIZE_MAX_WR"),
    (1 << 1, "BAD_PKEY_CNTR"),
    (1 << 2, "BAD_QKEY_CNTR"),
    (1 << 3, "RAW_MULTI"),
    (1 << 4, "AUTO_PATH_MIG"),
    (1 << 5, "CHANGE_PHY_PORT"),
    (1 << 6, "UD_AV_PORT_ENFORCE"),
    (1 << 7, "CURR_QP_STATE_MOD"),
    (1 << 8, "SHUTDOWN_PORT"),
    (1 << 9, "INIT_TYPE"),
    (1 << 10, "PORT_ACTIVE_EVENT"),
    (1 << 11, "SYS_IMAGE_GUID"),
    (1 << 12, "RC_RNR_NAK_GEN"),
    (1 << 13, "SRQ_RESIZE"),
    (1 << 14, "N_NOTIFY_CQ"),
    (1 << 17, "MEM_WINDOW"),
    (1 << 18, "UD_IP_CSUM"),
    (1 << 20, "XRC"),
    (1 << 21, "MEM_MGT_EXTENSIONS"),
    (1 << 23, "MEM_WINDOW_TYPE_2A"),
    (1 << 24, "MEM_WINDOW_TYPE_2B"),
    (1 << 25, "RC_IP_CSUM"),
    (1 << 26, "RAW_IP_CSUM"),
    (1 << 29, "MANAGED_FLOW_STEERING"),
];

fn atomic_cap_str(c: AtomicCap) -> &'static str {
    match c {
        AtomicCap::None => "ATOMIC_NONE",
        AtomicCap::Hca => "ATOMIC_HCA",
        AtomicCap::Glob => "ATOMIC_GLOB",
    }
}

fn port_state_str(s: u8) -> &'static str {
    match s {
        1 => "PORT_DOWN",
        2 => "PORT_INIT",
        3 => "PORT_ARMED",
        4 => "PORT_ACTIVE",
        _ => "invalid state",
    }
}

fn width_str(w: u8) -> &'static str {
    match w {
        1 => "1",
        2 => "4",
        4 => "8",
        8 => "12",
        16 => "2",
        _ => "invalid width",
    }
}

fn speed_str(s: u8) -> &'static str {
    match s {
        1 => "2.5 Gbps",
        2 => "5.0 Gbps",
        4 | 8 => "10.0 Gbps",
        16 => "14.0 Gbps",
        32 => "25.0 Gbps",
        64 => "50.0 Gbps",
        128 => "100.0 Gbps",
        _ => "invalid speed",
    }
}

fn vl_str(v: u8) -> &'static str {
    match v {
        1 => "1",
        2 => "2",
        3 => "4",
        4 => "8",
        5 => "15",
        _ => "invalid value",
    }
}

fn phys_state_str(s: u8) -> &'static str {
    match s {
        1 => "SLEEP",
        2 => "POLLING",
        3 => "DISABLED",
        4 => "PORT_CONFIGURATION TRAINNING",
        5 => "LINK_UP",
        6 => "LINK_ERROR_RECOVERY",
        7 => "PHY TEST",
        _ => "invalid physical state",
    }
}

/// devinfo.c `print_hca_cap` for one opened device.
fn describe(
    out: &mut String,
    dev: &UdpDevice,
    ib_port: Option<u8>,
    verbose: bool,
) -> Result<(), BoxError> {
    let a = dev.query_device();
    if ib_port.is_some_and(|p| p > a.phys_port_cnt) {
        return Err("Invalid port requested for device".into());
    }
    macro_rules! w {
        ($($t:tt)*) => {{
            let _ = writeln!(out, $($t)*);
        }};
    }
    w!("hca_id:\t{}", dev.name());
    w!("\ttransport:\t\t\tInfiniBand (0)");
    if !a.fw_ver.is_empty() {
        w!("\tfw_ver:\t\t\t\t{}", a.fw_ver);
    }
    w!("\tnode_guid:\t\t\t{}", guid_str(a.node_guid));
    w!("\tsys_image_guid:\t\t\t{}", guid_str(a.sys_image_guid));
    w!("\tvendor_id:\t\t\t{:#06x}", a.vendor_id);
    w!("\tvendor_part_id:\t\t\t{}", a.vendor_part_id);
    w!("\thw_ver:\t\t\t\t{:#x}", a.hw_ver);
    w!("\tphys_port_cnt:\t\t\t{}", a.phys_port_cnt);
    if verbose {
        w!("\tmax_mr_size:\t\t\t{:#x}", a.max_mr_size);
        w!("\tpage_size_cap:\t\t\t{:#x}", a.page_size_cap);
        w!("\tmax_qp:\t\t\t\t{}", a.max_qp);
        w!("\tmax_qp_wr:\t\t\t{}", a.max_qp_wr);
        w!("\tdevice_cap_flags:\t\t0x{:08x}", a.device_cap_flags);
        let mut known = 0;
        for (bit, name) in CAP_FLAG_NAMES {
            known |= bit;
            if a.device_cap_flags & bit != 0 {
                w!("\t\t\t\t\t{name}");
            }
        }
        if a.device_cap_flags & !known != 0 {
            w!(
                "\t\t\t\t\tUnknown flags: 0x{:X}",
                a.device_cap_flags & !known
            );
        }
        w!("\tmax_sge:\t\t\t{}", a.max_sge);
        w!("\tmax_sge_rd:\t\t\t{}", a.max_sge_rd);
        w!("\tmax_cq:\t\t\t\t{}", a.max_cq);
        w!("\tmax_cqe:\t\t\t{}", a.max_cqe);
        w!("\tmax_mr:\t\t\t\t{}", a.max_mr);
        w!("\tmax_pd:\t\t\t\t{}", a.max_pd);
        w!("\tmax_qp_rd_atom:\t\t\t{}", a.max_qp_rd_atom);
        w!("\tmax_ee_rd_atom:\t\t\t0");
        w!("\tmax_res_rd_atom:\t\t{}", a.max_res_rd_atom);
        w!("\tmax_qp_init_rd_atom:\t\t{}", a.max_qp_init_rd_atom);
        w!("\tmax_ee_init_rd_atom:\t\t0");
        w!(
            "\tatomic_cap:\t\t\t{} ({})",
            atomic_cap_str(a.atomic_cap),
            a.atomic_cap as u8
        );
        w!("\tmax_ee:\t\t\t\t0");
        w!("\tmax_rdd:\t\t\t0");
        w!("\tmax_mw:\t\t\t\t{}", a.max_mw);
        w!("\tmax_raw_ipv6_qp:\t\t0");
        w!("\tmax_raw_ethy_qp:\t\t0");
        w!("\tmax_mcast_grp:\t\t\t{}", a.max_mcast_grp);
        w!("\tmax_mcast_qp_attach:\t\t{}", a.max_mcast_qp_attach);
        w!(
            "\tmax_total_mcast_qp_attach:\t{}",
            a.max_total_mcast_qp_attach
        );
        w!("\tmax_ah:\t\t\t\t{}", a.max_ah);
        w!("\tmax_fmr:\t\t\t0");
        w!("\tmax_srq:\t\t\t{}", a.max_srq);
        if a.max_srq != 0 {
            w!("\tmax_srq_wr:\t\t\t{}", a.max_srq_wr);
            w!("\tmax_srq_sge:\t\t\t{}", a.max_srq_sge);
        }
        w!("\tmax_pkeys:\t\t\t{}", a.max_pkeys);
        w!("\tlocal_ca_ack_delay:\t\t{}", a.local_ca_ack_delay);
        // No on-demand paging, timestamps, core clock, raw packet caps, TSO, RSS, work queues,
        // packet pacing, tag matching or CQ moderation: what rxe reports.
        w!("\tgeneral_odp_caps:");
        for t in ["rc", "uc", "ud", "xrc"] {
            w!("\t{t}_odp_caps:");
            w!("\t\t\t\t\tNO SUPPORT");
        }
        w!("\tcompletion_timestamp_mask not supported");
        w!("\tcore clock not supported");
        w!("\tdevice_cap_flags_ex:\t\t0x{:X}", a.device_cap_flags);
        w!("\ttso_caps:");
        w!("\t\tmax_tso:\t\t\t0");
        w!("\trss_caps:");
        w!("\t\tmax_rwq_indirection_tables:\t\t\t0");
        w!("\t\tmax_rwq_indirection_table_size:\t\t\t0");
        w!("\t\trx_hash_function:\t\t\t\t0x0");
        w!("\t\trx_hash_fields_mask:\t\t\t\t0x0");
        w!("\tmax_wq_type_rq:\t\t\t0");
        w!("\tpacket_pacing_caps:");
        w!("\t\tqp_rate_limit_min:\t0kbps");
        w!("\t\tqp_rate_limit_max:\t0kbps");
        w!("\ttag matching not supported");
        // One completion vector: every CQ of a device is served by its driver thread.
        w!("\tnum_comp_vectors:\t\t1");
    }
    for port in 1..=a.phys_port_cnt {
        if ib_port.is_some_and(|p| p != port) {
            continue;
        }
        let p = dev.query_port(port)?;
        w!("\t\tport:\t{port}");
        w!(
            "\t\t\tstate:\t\t\t{} ({})",
            port_state_str(p.state),
            p.state
        );
        w!("\t\t\tmax_mtu:\t\t{}", mtu_str(p.max_mtu));
        w!("\t\t\tactive_mtu:\t\t{}", mtu_str(p.active_mtu));
        w!("\t\t\tsm_lid:\t\t\t0");
        w!("\t\t\tport_lid:\t\t0");
        w!("\t\t\tport_lmc:\t\t0x00");
        w!("\t\t\tlink_layer:\t\t{}", p.link_layer);
        if verbose {
            w!("\t\t\tmax_msg_sz:\t\t{:#x}", p.max_msg_sz);
            w!("\t\t\tport_cap_flags:\t\t0x{:08x}", p.port_cap_flags);
            w!("\t\t\tport_cap_flags2:\t0x0000");
            w!(
                "\t\t\tmax_vl_num:\t\t{} ({})",
                vl_str(p.max_vl_num),
                p.max_vl_num
            );
            w!("\t\t\tbad_pkey_cntr:\t\t0x0");
            w!("\t\t\tqkey_viol_cntr:\t\t0x0");
            w!("\t\t\tsm_sl:\t\t\t0");
            w!("\t\t\tpkey_tbl_len:\t\t{}", p.pkey_tbl_len);
            w!("\t\t\tgid_tbl_len:\t\t{}", p.gid_tbl_len);
            w!("\t\t\tsubnet_timeout:\t\t0");
            w!("\t\t\tinit_type_reply:\t0");
            w!(
                "\t\t\tactive_width:\t\t{}X ({})",
                width_str(p.active_width),
                p.active_width
            );
            w!(
                "\t\t\tactive_speed:\t\t{} ({})",
                speed_str(p.active_speed),
                p.active_speed
            );
            w!(
                "\t\t\tphys_state:\t\t{} ({})",
                phys_state_str(p.phys_state),
                p.phys_state
            );
            // GID 0 is the link-local GID of the device's derived MAC, as on kernel rxe; the
            // device sends only from GID 1, its own address (see `pingpong -g`).
            for g in dev.gids() {
                let kind = match g.gid_type {
                    GidType::RoceV2 => "RoCE v2",
                };
                let ip6 = g.gid;
                // rdma-core's line, and for the link-local entry what a QP told to use it
                // gets (issue 25 item 2).
                let note = if g.gid == softroce::verbs::Gid::from_ip(dev.ip()) {
                    ""
                } else {
                    " (link-local: softroce sends only from its address, GID 1; use -g 1 / -x 1)"
                };
                w!("\t\t\tGID[{:>3}]:\t\t{ip6}, {kind}{note}", g.index);
            }
        }
        w!();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guids_print_as_devinfo_does() {
        assert_eq!(guid_str(0x0000_7fff_fe00_0001), "0000:7fff:fe00:0001");
    }

    #[test]
    fn rxe_cap_flags_name_twelve_bits() {
        let names: Vec<&str> = CAP_FLAG_NAMES
            .iter()
            .filter(|(b, _)| softroce::verbs::DEVICE_CAP_FLAGS & b != 0)
            .map(|(_, n)| *n)
            .collect();
        assert_eq!(names.len(), 12, "{names:?}");
        assert!(names.contains(&"MEM_WINDOW_TYPE_2B"), "{names:?}");
    }
}
