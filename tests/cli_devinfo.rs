//! `softroce devinfo` as a newcomer types it after `ibv_devinfo` (issue 17 item 3): `-l`, `-v`,
//! `-d NAME`, `-i PORT`, and devices that cannot be opened. Addresses in 127.0.91.0/24, which
//! no other test uses; a UDP socket of this test holds a "taken" address; nothing is sent.
//! The port's rate on a veth is read in a network namespace of the test's own (root).

mod netns;

use std::net::UdpSocket;
use std::process::Command;

/// Runs softroce with `args` and `$SOFTROCE_IP` = `env` (unset for `None`): (success, stdout,
/// stderr).
fn softroce(args: &[&str], env: Option<&str>) -> (bool, String, String) {
    let mut c = Command::new(env!("CARGO_BIN_EXE_softroce"));
    c.args(args).env_remove("SOFTROCE_IP");
    if let Some(v) = env {
        c.env("SOFTROCE_IP", v);
    }
    let o = c.output().expect("runs");
    (
        o.status.success(),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn list_prints_the_device_names_as_ibv_devinfo_l() {
    let (ok, out, err) = softroce(&["devinfo", "-l"], Some("127.0.91.1, 127.0.91.2"));
    assert!(ok, "{err}");
    assert_eq!(out, "2 HCAs found:\n\tsoftroce0\n\tsoftroce1\n\n");
    let (ok, out, _) = softroce(&["devinfo", "--list", "--ip", "127.0.91.1"], None);
    assert!(ok);
    assert_eq!(out, "1 HCA found:\n\tsoftroce0\n\n");
}

#[test]
fn an_unknown_device_is_not_found() {
    let (ok, out, err) = softroce(&["devinfo", "-d", "mlx5_0"], Some("127.0.91.3"));
    assert!(!ok);
    assert!(out.is_empty(), "{out}");
    assert!(err.contains("IB device 'mlx5_0' wasn't found"), "{err}");
}

#[test]
fn short_form_is_ibv_devinfo_s_and_names_the_chosen_device() {
    let (ok, out, err) = softroce(
        &["devinfo", "-d", "softroce1"],
        Some("127.0.91.4 127.0.91.5"),
    );
    assert!(ok, "{err}");
    assert!(
        out.starts_with("hca_id:\tsoftroce1\n\ttransport:\t\t\tInfiniBand (0)\n"),
        "{out}"
    );
    assert!(!out.contains("softroce0"), "{out}");
    assert!(
        out.contains("\t\tport:\t1\n\t\t\tstate:\t\t\tPORT_ACTIVE (4)\n"),
        "{out}"
    );
    assert!(out.ends_with("\t\t\tlink_layer:\t\tEthernet\n\n"), "{out}");
    // The long form's fields are not in the short one.
    assert!(!out.contains("max_qp") && !out.contains("GID["), "{out}");
}

#[test]
fn verbose_prints_rxe_s_fields_in_ibv_devinfo_s_order() {
    let (ok, out, err) = softroce(&["devinfo", "-v", "--ip", "127.0.91.6"], None);
    assert!(ok, "{err}");
    let want = [
        "\tphys_port_cnt:\t\t\t1\n",
        "\tmax_mr_size:\t\t\t0x",
        "\tpage_size_cap:\t\t\t0xfffff000\n",
        "\tmax_qp:\t\t\t\t",
        "\tmax_qp_wr:\t\t\t",
        "\tdevice_cap_flags:\t\t0x01223c76\n\t\t\t\t\tBAD_PKEY_CNTR\n",
        "\t\t\t\t\tMEM_WINDOW_TYPE_2B\n\tmax_sge:\t\t\t32\n\tmax_sge_rd:\t\t\t32\n",
        "\tatomic_cap:\t\t\tATOMIC_HCA (1)\n",
        "\tmax_mw:\t\t\t\t4096\n",
        "\tmax_ah:\t\t\t\t",
        "\tmax_pkeys:\t\t\t64\n\tlocal_ca_ack_delay:\t\t15\n",
        "\t\tport:\t1\n",
        "\t\t\tlink_layer:\t\tEthernet\n\t\t\tmax_msg_sz:\t\t0x80000000\n",
        "\t\t\tport_cap_flags:\t\t0x00010000\n",
        "\t\t\tactive_width:\t\t1X (1)\n\t\t\tactive_speed:\t\t2.5 Gbps (1)\n\t\t\tphys_state:\t\tLINK_UP (5)\n",
        "\t\t\tGID[  0]:\t\tfe80::",
        ", RoCE v2 (link-local: softroce sends only from its address, GID 1; use -g 1 / -x 1)\n",
        "\t\t\tGID[  1]:\t\t::ffff:127.0.91.6, RoCE v2\n\n",
    ];
    let mut at = 0;
    for w in want {
        let i = out[at..]
            .find(w)
            .unwrap_or_else(|| panic!("{w:?} missing after byte {at}:\n{out}"));
        at += i + w.len();
    }
    let (ok, _, err) = softroce(&["devinfo", "-v", "-i", "2", "--ip", "127.0.91.6"], None);
    assert!(!ok);
    assert!(err.contains("Invalid port requested for device"), "{err}");
}

#[test]
fn a_device_that_cannot_be_opened_is_an_error_not_port_active() {
    // Held by another process (here: a socket of this test).
    let _held = UdpSocket::bind(("127.0.91.7", 4791)).expect("binds a free loopback address");
    let (ok, out, err) = softroce(&["devinfo", "--ip", "127.0.91.7"], None);
    assert!(!ok);
    assert!(!out.contains("PORT_ACTIVE"), "{out}");
    assert!(
        err.contains("opening device softroce0 on 127.0.91.7:4791: Address already in use"),
        "{err}"
    );
    // TEST-NET-1 (RFC 5737): on no host.
    let (ok, out, err) = softroce(&["devinfo"], Some("192.0.2.1"));
    assert!(!ok);
    assert!(!out.contains("PORT_ACTIVE"), "{out}");
    assert!(err.contains("that address is not on this host"), "{err}");
    // One device of two cannot be opened: the other is described, and the run fails.
    let (ok, out, err) = softroce(&["devinfo"], Some("127.0.91.8,127.0.91.7"));
    assert!(!ok);
    assert!(out.contains("hca_id:\tsoftroce0"), "{out}");
    assert!(!out.contains("softroce1"), "{out}");
    assert!(
        err.contains("opening device softroce1 on 127.0.91.7"),
        "{err}"
    );
}

// Kernel rxe sets its port's speed and width from the netdev's ethtool link speed
// (ib_get_eth_speed): 2.5 Gbps SDR 1X on `lo` (no speed; the test above), 10 Gbps FDR10 1X
// on a veth (10000 Mb/s). In a namespace of this test's own (root): a veth pair, a device
// on each end's address.
#[test]
fn a_port_on_a_veth_has_the_rate_rxe_gives_a_10_gbps_link() {
    let Some(ns) = netns::Netns::create_or_skip("rate") else {
        return;
    };
    for args in [
        &["link", "add", "v0", "type", "veth", "peer", "name", "v1"][..],
        &["addr", "add", "10.91.0.1/24", "dev", "v0"],
        &["addr", "add", "10.91.0.2/24", "dev", "v1"],
        &["link", "set", "v0", "up"],
        &["link", "set", "v1", "up"],
    ] {
        ns.ip(args).unwrap();
    }
    let o = Command::new("ip")
        .args(["netns", "exec", &ns.0, env!("CARGO_BIN_EXE_softroce")])
        .args(["devinfo", "-v", "--ip", "10.91.0.1"])
        .env_remove("SOFTROCE_IP")
        .output()
        .expect("runs");
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let want = "\t\t\tactive_width:\t\t1X (1)\n\t\t\tactive_speed:\t\t10.0 Gbps (8)\n";
    assert!(out.contains(want), "{want:?} missing:\n{out}");
}
