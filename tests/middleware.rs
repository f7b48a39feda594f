//! Middleware unmodified (issue 21 item 3): Debian 12's UCX 1.13, Open MPI 4.1 and
//! libfabric 1.17, run through `softroce exec` as a user runs them, each checked for real
//! results and for its traffic having gone over softroce (the pcap of `softroce exec
//! --pcap` holds the RC or UD datagrams). Servers and clients on one address (processes
//! sharing the device) and on two. A missing tool prints SKIPPED with the package to install,
//! except under `CI=true`, where it fails the test (.ci/run installs them).

mod exec_support;
use exec_support::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// True when `tool` is installed; otherwise SKIPPED (or, under CI=true, a failure).
fn tool(tool: &str, package: &str) -> bool {
    if have(tool) {
        return true;
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "{tool} is missing (apt-get install {package}); CI=true requires it"
    );
    println!("SKIPPED: {tool} is not installed (apt-get install {package})");
    false
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("softroce-mw-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// `softroce decode PCAP`: the count of frames of each opcode (the 6th column).
fn opcodes(pcap: &Path) -> std::collections::BTreeMap<String, usize> {
    let out = Command::new(SOFTROCE)
        .arg("decode")
        .arg(pcap)
        .output()
        .unwrap();
    assert!(out.status.success(), "softroce decode failed");
    let mut m = std::collections::BTreeMap::new();
    for l in String::from_utf8_lossy(&out.stdout).lines() {
        if let Some(op) = l.split_whitespace().nth(5)
            && (op.starts_with("RC_") || op.starts_with("UD_"))
        {
            *m.entry(op.to_string()).or_insert(0) += 1;
        }
    }
    m
}

fn text(o: &std::process::Output) -> String {
    format!(
        "{}\n{}{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// One ucx_perftest run: a server on `server_ip`, a client on `client_ip` (its datagrams in
/// a pcap), both with `UCX_TLS=tls UCX_NET_DEVICES=softroce0:1`. Returns the client's
/// "Final:" line and the pcap's opcodes.
fn perftest(
    server_ip: &str,
    client_ip: &str,
    tls: &str,
    test: &str,
    port: u16,
) -> (String, std::collections::BTreeMap<String, usize>) {
    let dir = scratch(&format!("ucx-{port}"));
    let pcap = dir.join("client.pcap");
    let p = port.to_string();
    let mut s = exec(server_ip, &["ucx_perftest", "-p", &p]);
    s.env("UCX_TLS", tls).env("UCX_NET_DEVICES", "softroce0:1");
    let mut server = Kill(Some(s.spawn().unwrap()));
    wait_tcp_listen(port, &mut server.0);
    let mut c = exec_pcap(
        client_ip,
        &pcap,
        &["ucx_perftest", "-p", &p, "-t", test, "-n", "500", server_ip],
    );
    c.env("UCX_TLS", tls).env("UCX_NET_DEVICES", "softroce0:1");
    let what = format!("ucx_perftest {test} over {tls}");
    let client = wait(c.spawn().unwrap(), Duration::from_secs(120), &what);
    let server = wait(server.0.take().unwrap(), Duration::from_secs(60), &what);
    assert!(
        client.status.success() && server.status.success(),
        "{what}: client {}\nserver {}",
        text(&client),
        text(&server)
    );
    let out = String::from_utf8_lossy(&client.stdout).into_owned();
    let fin = out
        .lines()
        .find(|l| l.starts_with("Final:"))
        .unwrap_or_else(|| panic!("{what}: no Final: line\n{}", text(&client)))
        .to_string();
    // "Final: <iterations> ...": every iteration ran.
    assert_eq!(fin.split_whitespace().nth(1), Some("500"), "{what}: {fin}");
    let ops = opcodes(&pcap);
    let _ = std::fs::remove_dir_all(&dir);
    println!("{what} ({server_ip} <- {client_ip}): {fin}\n  {ops:?}");
    (fin, ops)
}

const UCX_TESTS: [&str; 4] = ["tag_lat", "tag_bw", "ucp_put_lat", "ucp_get"];

/// rc_verbs carries the data: RC datagrams in the client's pcap (UCX connects RC QPs over
/// ud_verbs, its auxiliary transport: `rc_verbs,ud_verbs:aux`).
fn ucx_rc(server_ip: &str, client_ip: &str, port: u16) {
    if !tool("ucx_perftest", "ucx-utils") {
        return;
    }
    for (i, t) in UCX_TESTS.iter().enumerate() {
        let (_, ops) = perftest(
            server_ip,
            client_ip,
            "rc_verbs,ud_verbs:aux",
            t,
            port + i as u16,
        );
        let rc: usize = ops
            .iter()
            .filter(|(k, _)| k.starts_with("RC_") && *k != "RC_ACKNOWLEDGE")
            .map(|(_, n)| n)
            .sum();
        assert!(
            rc >= 500,
            "{t}: {rc} RC datagrams (not ACKs) for 500 iterations: {ops:?}"
        );
    }
}

/// ud_verbs alone: UD datagrams carry the data, none RC.
fn ucx_ud(server_ip: &str, client_ip: &str, port: u16) {
    if !tool("ucx_perftest", "ucx-utils") {
        return;
    }
    for (i, t) in UCX_TESTS.iter().enumerate() {
        let (_, ops) = perftest(server_ip, client_ip, "ud_verbs", t, port + i as u16);
        let ud = ops.get("UD_SEND_ONLY").copied().unwrap_or(0);
        assert!(
            ud >= 500,
            "{t}: {ud} UD datagrams for 500 iterations: {ops:?}"
        );
        assert!(!ops.keys().any(|k| k.starts_with("RC_")), "{t}: {ops:?}");
    }
}

#[test]
fn ucx_perftest_rc_verbs_one_address() {
    ucx_rc("127.0.200.1", "127.0.200.1", 13410);
}

#[test]
fn ucx_perftest_rc_verbs_two_addresses() {
    ucx_rc("127.0.200.2", "127.0.200.3", 13420);
}

#[test]
fn ucx_perftest_ud_verbs_one_address() {
    ucx_ud("127.0.200.4", "127.0.200.4", 13430);
}

#[test]
fn ucx_perftest_ud_verbs_two_addresses() {
    ucx_ud("127.0.200.5", "127.0.200.6", 13440);
}

/// tests/c/mpi_ring.c built with mpicc into `dir`.
fn mpi_ring(dir: &Path) -> PathBuf {
    let exe = dir.join("mpi_ring");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/mpi_ring.c");
    let cc = Command::new("mpicc")
        .args(["-Wall", "-o"])
        .arg(&exe)
        .arg(&src)
        .output()
        .unwrap();
    assert!(cc.status.success(), "mpicc: {}", text(&cc));
    exe
}

/// `mpirun [--allow-run-as-root] OPTIONS… EXE` (mpirun refuses root without the flag).
fn mpirun_args(options: &[&str], exe: &Path) -> Vec<std::ffi::OsString> {
    let mut args: Vec<std::ffi::OsString> = vec!["mpirun".into()];
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        args.push("--allow-run-as-root".into());
    }
    args.extend(options.iter().map(Into::into));
    args.push(exe.into());
    args
}

/// Open MPI 4.1 with pml ucx: tests/c/mpi_ring.c (ring token, a 1 MiB send, allreduce),
/// two ranks on one host sharing softroce0, `UCX_TLS=rc_verbs,ud_verbs:aux,self` (no
/// shared memory, no TCP): the 1 MiB message is a rendezvous RDMA READ over softroce.
#[test]
fn open_mpi_pml_ucx_two_ranks_share_the_device() {
    if !tool("mpicc", "libopenmpi-dev") || !tool("mpirun", "openmpi-bin") {
        return;
    }
    let dir = scratch("mpi");
    let exe = mpi_ring(&dir);
    let pcap = dir.join("mpi.pcap");
    let args = mpirun_args(
        &["-np", "2", "--mca", "pml", "ucx", "--mca", "btl", "self"],
        &exe,
    );
    let mut c = exec_pcap("127.0.200.7", &pcap, &args);
    c.env("UCX_TLS", "rc_verbs,ud_verbs:aux,self")
        .env("UCX_NET_DEVICES", "softroce0:1")
        .stdin(Stdio::null());
    let out = wait(c.spawn().unwrap(), Duration::from_secs(180), "mpirun");
    assert!(out.status.success(), "mpirun {}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .any(|l| l == "mpi_ring: ok 2"),
        "{}",
        text(&out)
    );
    let ops = opcodes(&pcap);
    println!("mpi_ring over pml ucx: {ops:?}");
    assert!(ops.get("RC_SEND_ONLY").copied().unwrap_or(0) > 0, "{ops:?}");
    // 1 MiB by RDMA READ: 256 responses of 4096 bytes at least, each written twice (sent and
    // received: both ranks are in the pcap).
    let reads: usize = ops
        .iter()
        .filter(|(k, _)| k.starts_with("RC_RDMA_READ_RESPONSE"))
        .map(|(_, n)| n)
        .sum();
    assert!(reads >= 256, "{ops:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// What Open MPI 4.1.4 prints on kernel rxe (rxe0 there) for `--mca pml ob1 --mca btl
/// openib,self`, whitespace runs made one space: the device's parameters are not in its INI
/// file (rxe's vendor ID 0xffffff, part ID 0), then no connection scheme serves the port
/// (Debian's build has only udcm, which skips a RoCE port), then MPI_Init fails.
const OPENIB_AS_ON_RXE: [&str; 5] = [
    "WARNING: No preset parameters were found for the device that Open MPI detected:",
    "Device name: softroce0 Device vendor ID: 0xffffff Device vendor part ID: 0",
    "No OpenFabrics connection schemes reported that they were able to be used on a specific port.",
    "Local device: softroce0 Local port: 1 CPCs attempted: udcm",
    "MPI_INIT has failed because at least one MPI process is unreachable from another.",
];

/// Open MPI 4.1 with pml ob1 and the openib BTL on two ranks sharing softroce0 gets as far
/// as on kernel rxe: openib finds the device (`ibv_get_sysfs_path()/class/infiniband` is a
/// directory: before softroce answered `ibv_get_sysfs_path`, openib's init returned failure
/// there, saying nothing), warns that it has no preset parameters for it, and gives the
/// port up because no connection scheme serves it ([`OPENIB_AS_ON_RXE`]); MPI_Init then
/// fails, as on rxe.
///
/// The ranks' warnings reach mpirun through PMIx, where Open MPI 4.1 loses some at random
/// (`ORTE_ERROR_LOG: Data unpack would read past end of buffer in file
/// ../../../orte/util/show_help.c`, open-mpi/ompi#8356; also with `--mca btl self` alone,
/// without softroce). So every run must show what the ranks write to their own stderr
/// (`--mca btl_base_verbose 10`: each rank checks its distance to softroce0, then openib's
/// init fails), and the runs, up to 8, must show every line of [`OPENIB_AS_ON_RXE`] between
/// them.
#[test]
fn open_mpi_openib_btl_stops_at_the_port_as_on_rxe() {
    if !tool("mpicc", "libopenmpi-dev") || !tool("mpirun", "openmpi-bin") {
        return;
    }
    let dir = scratch("openib");
    let exe = mpi_ring(&dir);
    let args = mpirun_args(
        &[
            "-np",
            "2",
            "--mca",
            "pml",
            "ob1",
            "--mca",
            "btl",
            "openib,self",
            "--mca",
            "btl_openib_allow_ib",
            "1",
            "--mca",
            "btl_base_verbose",
            "10",
        ],
        &exe,
    );
    let mut seen = [false; OPENIB_AS_ON_RXE.len()];
    let mut runs = 0;
    while runs < 8 && !seen.iter().all(|&s| s) {
        runs += 1;
        let mut c = exec("127.0.200.8", &args);
        c.stdin(Stdio::null());
        let out = wait(c.spawn().unwrap(), Duration::from_secs(180), "mpirun");
        let t = text(&out);
        assert!(!out.status.success(), "MPI_Init succeeded: {t}");
        let count = |s: &str| t.lines().filter(|l| l.ends_with(s)).count();
        assert_eq!(
            count("Checking distance from this process to device=softroce0"),
            2,
            "run {runs}: {t}"
        );
        assert_eq!(
            count("select: init of component openib returned failure"),
            2,
            "run {runs}: {t}"
        );
        let flat = t.split_whitespace().collect::<Vec<_>>().join(" ");
        for (s, want) in seen.iter_mut().zip(OPENIB_AS_ON_RXE) {
            *s |= flat.contains(want);
        }
    }
    let missing: Vec<&str> = OPENIB_AS_ON_RXE
        .iter()
        .zip(seen)
        .filter(|(_, s)| !s)
        .map(|(w, _)| *w)
        .collect();
    assert!(missing.is_empty(), "in {runs} runs, never: {missing:?}");
    println!("openib as on rxe: every line of its output in {runs} run(s)");
    let _ = std::fs::remove_dir_all(&dir);
}

/// fi_pingpong between two processes on two addresses over the verbs provider: `-e msg`
/// (verbs' RC endpoints, connected with rdma_cm) or `-e rdm` (verbs;ofi_rxm).
/// `port` is fi_pingpong's control port (`-B` on the server, `-P` on the client), one per
/// test so that the two may run side by side.
fn fi_pingpong(ep: &str, server_ip: &str, client_ip: &str, port: u16) {
    if !tool("fi_pingpong", "libfabric-bin") {
        return;
    }
    let dir = scratch(&format!("fi-{ep}"));
    let pcap = dir.join("client.pcap");
    let p = port.to_string();
    let mut s = exec(
        server_ip,
        &["fi_pingpong", "-p", "verbs", "-e", ep, "-B", p.as_str()],
    );
    // In the scratch directory: where libinfinipath writes its crash report (below).
    s.stdin(Stdio::null()).current_dir(&dir);
    let mut server = Kill(Some(s.spawn().unwrap()));
    wait_tcp_listen(port, &mut server.0);
    let mut c = exec_pcap(
        client_ip,
        &pcap,
        &[
            "fi_pingpong",
            "-p",
            "verbs",
            "-e",
            ep,
            "-P",
            p.as_str(),
            server_ip,
        ],
    );
    c.stdin(Stdio::null());
    let what = format!("fi_pingpong -e {ep}");
    let client = wait(c.spawn().unwrap(), Duration::from_secs(120), &what);
    let server = wait(server.0.take().unwrap(), Duration::from_secs(60), &what);
    let known_crash = ep == "rdm" && !server.status.success() && rxm_teardown_crash(&dir, &server);
    if known_crash {
        println!("{what}: the server hit libfabric 1.17's rxm teardown crash after its last row");
    }
    assert!(
        client.status.success() && (server.status.success() || known_crash),
        "{what}: client {}\nserver {}",
        text(&client),
        text(&server)
    );
    let out = String::from_utf8_lossy(&client.stdout).into_owned();
    // The table's last row: 1 MiB messages, 10 iterations.
    let last = out
        .lines()
        .find(|l| l.starts_with("1m "))
        .unwrap_or_else(|| panic!("{what}: no 1m row\n{}", text(&client)));
    assert_eq!(last.split_whitespace().nth(1), Some("10"), "{what}: {last}");
    let ops = opcodes(&pcap);
    println!("{what}: {last}\n  {ops:?}");
    let rc: usize = ops
        .iter()
        .filter(|(k, _)| k.starts_with("RC_") && *k != "RC_ACKNOWLEDGE")
        .map(|(_, n)| n)
        .sum();
    // 10 round trips of 1 MiB alone are 2 × 10 × 256 packets of 4096 bytes.
    assert!(rc >= 5120, "{what}: {ops:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// True when the fi_pingpong server in `dir` ended by libfabric 1.17's rxm teardown
/// use-after-free after printing every row: libinfinipath's SIGSEGV handler (loaded with
/// libfabric's psm provider) wrote its backtrace (`*.btr`) in the server's directory, signal 11
/// at the call libfabric.so.1.20.0+0xb7882 (rxm posting a receive through a freed message
/// endpoint), and exited 1. Upstream: ofiwg/libfabric issue 11828; pull request 12674 (2026)
/// makes `rxm_close_conn` flush the CQ before it closes the endpoints. Any other end of the
/// server is a failure.
fn rxm_teardown_crash(dir: &Path, server: &std::process::Output) -> bool {
    let rows_done = String::from_utf8_lossy(&server.stdout)
        .lines()
        .any(|l| l.starts_with("1m "));
    let report = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".btr"))
        .filter_map(|e| std::fs::read_to_string(e.path()).ok())
        .any(|t| {
            t.contains("terminated with signal 11")
                && t.lines()
                    .find(|l| l.starts_with('/'))
                    .is_some_and(|top| top.contains("libfabric.so.1(+0xb7882)"))
        });
    server.status.code() == Some(1) && rows_done && report
}

/// fi_pingpong over verbs' RC endpoints (`-e msg`, connected with rdma_cm), 64 B to 1 MiB.
/// The server is on 127.0.0.1: libfabric's verbs provider lists a device's addresses from
/// the host's interfaces (getifaddrs), where only 127.0.0.1 of 127.0.0.0/8 appears.
///
/// Ignored until 2026-12-06: beside the other tests of this file (8 processes spinning on 2
/// cores) its 1 MiB messages ended in IBV_WC_RETRY_EXC_ERR about 2 runs in 3. Causes found
/// and fixed: rdma_bind_addr's hold for a REQ that beats rdma_listen; a late ACK dropped
/// after a retry's rewind; due timers run before the ACKs already on the socket
/// (`net::udp::serve_timers`); rdma_cm QPs with a 67 ms ACK timeout where the kernel CM
/// gives 537 ms (`cm::cm_ack_timeout`); 17 CRC passes per received GSO segment in debug
/// builds (`solve_ipv4_ident`, crc32fast's opt-level) (docs/testing.md).
#[test]
fn libfabric_fi_pingpong_verbs_msg() {
    fi_pingpong("msg", "127.0.0.1", "127.0.200.9", 47592);
}

/// fi_pingpong over verbs;ofi_rxm (`-e rdm`), 64 B to 1 MiB.
///
/// The server dies of SIGSEGV inside libfabric after its last row in about 1 run in 12, the
/// client having exited with status 0 (8 times in 100 runs alone, 2026-12-07,
/// docs/testing.md): rxm posting a receive again (`fid_ep->msg->recv`) on a message endpoint
/// its teardown has freed, libfabric 1.17's own bug whichever device the completions come
/// from. That end, and only that end, passes: [`rxm_teardown_crash`]. Once, before the
/// fixes above, the client hung with no output.
#[test]
fn libfabric_fi_pingpong_verbs_rdm() {
    fi_pingpong("rdm", "127.0.0.1", "127.0.200.11", 47593);
}

/// qperf over rdma_cm (`-cm1`; without it qperf addresses the peer by LID alone, with no
/// GRH, which RoCE cannot route: "failed to modify QP to RTR: Invalid argument", as on
/// rxe): rc_lat, rc_bw (whose server QP has no send queue, max_send_wr 0) and the RDMA
/// WRITE and READ tests. Not the UD tests: qperf runs them without rdma_cm whatever `-cm1`
/// says ("-cm1 set but not used in test ud_lat"), with an AH of no GRH, which
/// `ibv_create_ah` refuses on RoCE (EINVAL), on rxe as here.
///
/// qperf's server forks a process per test, which binds the wildcard address to port 0 and
/// sends the port to the client *before* it calls rdma_listen (Debian's qperf 0.4.11), so
/// the client's REQ races the listen. When rdma_listen opened the device (joining the
/// shared device's keeper), the REQ usually won and drew the keeper's REJ "invalid service
/// ID". Now rdma_bind_addr holds the port's service ID for its process (opening the
/// wildcard's devices first), and a REQ that comes before rdma_listen waits for it. The
/// tests end on SIGALRM, whose handler has no SA_RESTART: ibv_get_cq_event must return
/// EINTR then, as the kernel's read does, or the server never sends its results.
#[test]
fn qperf_rc_and_rc_rdma_tests_over_rdma_cm() {
    if !tool("qperf", "qperf") {
        return;
    }
    let mut s = exec("127.0.200.12", &["qperf", "-lp", "19770"]);
    s.stdin(Stdio::null());
    let mut server = Kill(Some(s.spawn().unwrap()));
    wait_tcp_listen(19770, &mut server.0);
    let mut c = exec(
        "127.0.200.13",
        &[
            "qperf",
            "-lp",
            "19770",
            "-cm1",
            "127.0.200.12",
            "rc_lat",
            "rc_bw",
            "rc_rdma_write_lat",
            "rc_rdma_read_bw",
        ],
    );
    c.stdin(Stdio::null());
    let out = wait(c.spawn().unwrap(), Duration::from_secs(120), "qperf");
    let t = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "qperf {}", text(&out));
    // One result block per test, each with its figure.
    for test in ["rc_lat", "rc_bw", "rc_rdma_write_lat", "rc_rdma_read_bw"] {
        let block = t
            .split(&format!("{test}:"))
            .nth(1)
            .unwrap_or_else(|| panic!("no {test} in qperf's output:\n{t}"));
        let first = block.lines().nth(1).unwrap_or_default();
        let want = if test.ends_with("lat") {
            "latency"
        } else {
            "bw"
        };
        assert!(first.contains(want), "{test}: {first:?}\n{t}");
    }
    println!("{t}");
}

/// Runs `scripts/mpi-netns.sh ARGS --softroce SOFTROCE` (mpi_ring across network
/// namespaces) and returns its output and stdout once it succeeded; `None` when Open MPI is
/// missing or the test is not root (SKIPPED; under `CI=true` a missing root fails). Fails the
/// test when the script fails or runs longer than `limit`.
fn mpi_netns(args: &[&str], limit: Duration) -> Option<(String, String)> {
    if !tool("mpicc", "libopenmpi-dev") || !tool("mpirun", "openmpi-bin") {
        return None;
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI=true: network namespaces need root"
        );
        println!("SKIPPED: network namespaces need root");
        return None;
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/mpi-netns.sh");
    let mut c = Command::new(script);
    c.args(args)
        .args(["--softroce", SOFTROCE])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let out = wait(c.spawn().unwrap(), limit, "mpi-netns.sh");
    let t = text(&out);
    assert!(out.status.success(), "mpi-netns.sh {t}");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    Some((t, stdout))
}

/// Open MPI across hosts (issue 21 item 5): `scripts/mpi-netns.sh` with 4 hosts of 2 ranks,
/// each host a network namespace with its own address and softroce device, the links
/// dropping 1 % of the packets each way (netem, or an nftables rule where the kernel has
/// no netem). mpirun starts its daemons through `ip netns exec`; the ranks pass the ring
/// token, a 1 MiB buffer from the first host to the last and an allreduce, over rc_verbs.
/// Needs root (network namespaces); otherwise SKIPPED, except under `CI=true`.
#[test]
fn open_mpi_across_four_namespaces_with_loss() {
    let args = ["--hosts", "4", "--ranks", "2", "--loss", "1"];
    let Some((t, stdout)) = mpi_netns(&args, Duration::from_secs(300)) else {
        return;
    };
    assert!(stdout.lines().any(|l| l == "mpi_ring: ok 8"), "{t}");
    // The links did drop packets (nftables counts them; netem's loss is not counted here).
    if let Some(l) = stdout
        .lines()
        .find(|l| l.starts_with("== links: ") && l.contains("dropped"))
    {
        let dropped: u64 = l
            .trim_end_matches(" dropped")
            .rsplit(' ')
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        assert!(dropped > 0, "no packet was dropped: {l}");
    }
    println!("{stdout}");
}

/// UCX's wireup survives losing the reply twice: two hosts (network namespaces, no random
/// loss), one rank each, and an nftables rule on the second host that drops exactly the first
/// two RoCEv2 datagrams of IP length 100 it sends: UCX 1.13's `ud_verbs` wireup reply to the
/// first rank and the reply's one resend. With UCX's adaptive progress (its default) the
/// second rank's idle `ud_verbs` interface then has no resend timer and the first rank, whose
/// request was acknowledged, sends nothing more: the job hung in its first MPI_Send (2 runs
/// in about 100 of `open_mpi_across_four_namespaces_with_loss`'s job in a loop). `softroce exec` sets `UCX_ADAPTIVE_PROGRESS=n` (src/exec.rs).
/// The script's count of dropped datagrams checks that the rule met the reply (a UCX whose
/// reply has another size fails here, not silently). Needs root; otherwise SKIPPED, except
/// under `CI=true`.
#[test]
fn open_mpi_wireup_survives_two_lost_replies() {
    let args = [
        "--hosts",
        "2",
        "--ranks",
        "1",
        "--loss",
        "0",
        "--delay",
        "0",
        "--drop-first",
        "2:100",
    ];
    let Some((t, stdout)) = mpi_netns(&args, Duration::from_secs(120)) else {
        return;
    };
    assert!(stdout.lines().any(|l| l == "mpi_ring: ok 2"), "{t}");
    assert!(
        stdout.lines().any(|l| l == "== drop-first: 2 dropped"),
        "the rule did not drop the reply and its resend: {t}"
    );
}
