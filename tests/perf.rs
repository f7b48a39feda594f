//! `softroce perf`: every perftest test against itself as two processes over UDP on loopback,
//! servers against a hand-written peer that speaks perftest's TCP exchange byte for byte,
//! `--json`, `-a`, and the UDP/TCP baselines. Each test uses its own 127.0.7x.y / 127.0.8x.y
//! addresses and a free TCP port, so the tests can run in parallel (inside `unshare -n`).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

mod proc;

use proc::{Proc, counter, finish, free_port, read_until_line, spawn, text};

/// Reads stdout until a complete line contains `needle`; returns what was read.
fn wait_for_line(p: &mut Proc, needle: &str) -> String {
    wait_for_line_on(p, needle, false)
}

/// Reads stdout (or stderr) until a complete line contains `needle`; returns what was read.
fn wait_for_line_on(p: &mut Proc, needle: &str, stderr: bool) -> String {
    read_until_line(p, stderr, needle, |l| l.contains(needle))
}

/// The rows under perftest's result header (bandwidth or latency).
fn result_rows(out: &str) -> Vec<Vec<String>> {
    let mut lines = out.lines();
    lines
        .find(|l| l.contains("#bytes") && (l.contains("BW average[") || l.contains("t_avg[usec]")))
        .unwrap_or_else(|| panic!("no result header in {out}"));
    lines
        .take_while(|l| !l.starts_with("---"))
        .map(|l| l.split_whitespace().map(str::to_string).collect())
        .collect()
}

/// The first row under perftest's result header.
fn result_row(out: &str) -> Vec<String> {
    result_rows(out)
        .into_iter()
        .next()
        .unwrap_or_else(|| panic!("no result row in {out}"))
}

/// Runs `softroce perf TEST` as server and client processes on 127.0.NET.1 / .2 with `extra`
/// options on both; returns (client output, server output) after checking both succeeded.
fn pair(net: u8, test: &str, extra: &[&str]) -> (String, String) {
    let (sip, cip) = (format!("127.0.{net}.1"), format!("127.0.{net}.2"));
    let port = free_port(&sip).to_string();
    let common = [&["perf", test, "-p", &port][..], extra].concat();
    let mut server = spawn(&[&common[..], &["--ip", &sip]].concat());
    // With --json the banner goes to stderr with every other line of text.
    let json = extra.contains(&"--json");
    let head = wait_for_line_on(&mut server, "Waiting for client to connect", json);
    let c = finish(
        spawn(&[&common[..], &["--ip", &cip, &sip]].concat()),
        Duration::from_secs(60),
    );
    let s = finish(server, Duration::from_secs(60));
    let (cs, ss) = (text(&c), format!("{head}{}", text(&s)));
    assert!(c.status.success(), "client:\n{cs}\nserver:\n{ss}");
    assert!(s.status.success(), "server:\n{ss}\nclient:\n{cs}");
    (cs, ss)
}

fn run_pair(net: u8, test: &str, size: u32, iters: u32) {
    let (size_s, iters_s) = (size.to_string(), iters.to_string());
    let (cs, ss) = pair(
        net,
        test,
        &["-s", &size_s, "-n", &iters_s, "-t", "16", "--counters"],
    );
    let row = result_row(&cs);
    assert_eq!(row[..2], [size_s.clone(), iters_s.clone()], "{cs}");
    assert!(row[3].parse::<f64>().expect("average") > 0.0, "{cs}");
    // The server prints the results the client sent it.
    assert_eq!(result_row(&ss), row, "server:\n{ss}");
    // One request per MTU of data each way: WRITEs go client → server, READ responses back.
    let per_msg = u64::from(size.div_ceil(1024));
    let (data_side, other) = if test == "write_bw" {
        (&cs, &ss)
    } else {
        (&ss, &cs)
    };
    let sent = counter(data_side, "sent_pkts");
    let expected = u64::from(iters) * per_msg;
    // A loaded machine may make a requester time out and go back N; then the receiver
    // counts the repeats as duplicates or out of sequence.
    let repeats = counter(other, "duplicate_request")
        + counter(other, "out_of_seq_request")
        + counter(other, "out_of_sequence_dropped")
        + counter(&ss, "duplicate_request");
    if repeats == 0 {
        assert_eq!(sent, expected, "{cs}\n{ss}");
    } else {
        assert!(sent >= expected, "{cs}\n{ss}");
    }
    assert_eq!(counter(&cs, "sent_pkts"), counter(&ss, "rcvd_pkts"));
    assert_eq!(counter(&ss, "sent_pkts"), counter(&cs, "rcvd_pkts"));
}

#[test]
fn write_bw_two_processes() {
    run_pair(70, "write_bw", 16384, 200);
}

#[test]
fn read_bw_two_processes() {
    run_pair(71, "read_bw", 16384, 200);
}

/// A peer that speaks perftest's exchange (as Debian's perftest 4.5-0.17 does) drives the
/// server through every step; its WRITEs are replaced by nothing, since only the exchange is
/// checked here.
#[test]
fn server_speaks_perftest_exchange() {
    let ip = "127.0.72.1";
    let port = free_port(ip);
    let mut server = spawn(&["perf", "write_bw", "--ip", ip, "-p", &port.to_string()]);
    wait_for_line(&mut server, "Waiting for client to connect");
    let mut tcp = TcpStream::connect((ip, port)).expect("connect");
    let mut xchg = |mine: &[u8]| -> Vec<u8> {
        tcp.write_all(mine).expect("write");
        let mut theirs = vec![0u8; mine.len()];
        tcp.read_exact(&mut theirs).expect("read");
        theirs
    };
    let mut version = [0u8; 16];
    version[..4].copy_from_slice(b"6.06");
    assert_eq!(&xchg(&version)[..5], b"6.06\0");
    assert_eq!(xchg(&4096u32.to_be_bytes()), 4096u32.to_be_bytes());
    assert_eq!(xchg(&64u32.to_be_bytes()), 64u32.to_be_bytes());
    assert_eq!(xchg(b"2\0"), b"3\0", "the server's MTU, 1024");
    let mine = b"0000:0001:000123:abcdef:00000456:0000000000001000:00:00:00:00:00:00:00:00:00:00:ff:ff:7f:00:48:02:00000000:\0";
    assert_eq!(mine.len(), 108);
    let theirs = xchg(mine);
    assert_eq!(theirs[107], 0);
    let t = std::str::from_utf8(&theirs[..107]).expect("text");
    let f: Vec<&str> = t.split(':').collect();
    assert_eq!(f.len(), 24, "{t}");
    assert_eq!(f[1], "0001", "one outstanding read for write_bw: {t}");
    assert_eq!(f[6..22].join(""), "00000000000000000000ffff7f004801", "{t}");
    for _ in 0..3 {
        assert_eq!(xchg(mine), theirs, "synchronisations repeat the address");
    }
    let results = [
        4096u64.to_be_bytes(),
        1000u64.to_be_bytes(),
        12.5f64.to_be_bytes(),
        10.25f64.to_be_bytes(),
        0.002624f64.to_be_bytes(),
    ];
    for r in results {
        xchg(&r);
    }
    assert_eq!(xchg(mine), theirs);
    let mut done = [0u8; 5];
    tcp.read_exact(&mut done).expect("server's done");
    assert_eq!(&done, b"done\0");
    tcp.write_all(b"done\0").expect("our done");
    let o = finish(server, Duration::from_secs(20));
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    // Our "results", printed by the server as perftest's server prints the client's.
    assert_eq!(
        result_row(&out),
        ["4096", "1000", "12.50", "10.25", "0.002624"]
    );
    assert!(
        out.contains("Mtu             : 512[B]"),
        "the smaller MTU: {out}"
    );
}

#[test]
fn send_bw_two_processes_each_side_measures() {
    let (cs, ss) = pair(
        73,
        "send_bw",
        &["-s", "3000", "-n", "300", "-q", "2", "--counters"],
    );
    let (c, s) = (result_row(&cs), result_row(&ss));
    // perftest's #iterations counts both QPs' messages.
    assert_eq!(c[..2], ["3000", "600"], "{cs}");
    // The server measured its receives itself (perftest's run_iter_bw_server).
    assert_eq!(s[..2], ["3000", "600"], "{ss}");
    assert!(s[3].parse::<f64>().expect("server average") > 0.0, "{ss}");
    // Two QPs × 300 SENDs of three packets each (MTU 1024), all received.
    assert_eq!(counter(&cs, "sent_pkts"), 2 * 300 * 3);
    assert_eq!(counter(&ss, "rcvd_pkts"), 2 * 300 * 3);
    assert_eq!(
        counter(&ss, "send_rnr_err") + counter(&cs, "rcvd_rnr_err"),
        0
    );
}

#[test]
fn atomic_bw_two_processes() {
    let (cs, ss) = pair(74, "atomic_bw", &["-n", "200", "--counters"]);
    let row = result_row(&cs);
    assert_eq!(row[..2], ["8", "200"], "{cs}");
    assert_eq!(
        result_row(&ss),
        row,
        "the server prints the client's results:\n{ss}"
    );
    assert!(cs.contains("Atomic FETCH_AND_ADD BW Test"), "{cs}");
    // 200 atomic requests, 200 atomic ACKs.
    assert_eq!(counter(&cs, "sent_pkts"), 200);
    assert_eq!(counter(&ss, "sent_pkts"), 200);
    let (cs, _) = pair(74, "atomic_bw", &["-n", "50", "-A", "CMP_AND_SWAP"]);
    assert!(cs.contains("Atomic CMP_AND_SWAP BW Test"), "{cs}");
    assert_eq!(result_row(&cs)[..2], ["8", "50"]);
}

/// A latency row: #bytes #iterations t_min t_max t_typical t_avg t_stdev p99 p99.9, with
/// t_min <= t_typical <= t_max and the percentiles in order.
fn check_lat_row(row: &[String], size: &str, iters: &str, out: &str) {
    assert_eq!(row.len(), 9, "{out}");
    assert_eq!(row[..2], [size, iters], "{out}");
    let v: Vec<f64> = row[2..]
        .iter()
        .map(|x| x.parse().expect("number"))
        .collect();
    let (min, max, typ, p99, p999) = (v[0], v[1], v[2], v[5], v[6]);
    assert!(min > 0.0 && min <= typ && typ <= max, "{out}");
    assert!(min <= p99 && p99 <= p999, "{out}");
}

#[test]
fn write_lat_two_processes_both_sides_measure() {
    let (cs, ss) = pair(75, "write_lat", &["-s", "64", "-n", "100", "--counters"]);
    check_lat_row(&result_row(&cs), "64", "100", &cs);
    check_lat_row(&result_row(&ss), "64", "100", &ss);
    assert!(cs.contains("RDMA_Write Latency Test"), "{cs}");
    // A ping-pong: 100 WRITEs each way, one packet each.
    assert_eq!(counter(&cs, "sent_pkts"), counter(&ss, "rcvd_pkts"));
    assert_eq!(counter(&ss, "sent_pkts"), counter(&cs, "rcvd_pkts"));
    assert!(counter(&ss, "rcvd_pkts") >= 100, "{ss}");
}

#[test]
fn send_lat_two_processes_both_sides_measure() {
    let (cs, ss) = pair(76, "send_lat", &["-s", "2000", "-n", "50", "--counters"]);
    check_lat_row(&result_row(&cs), "2000", "50", &cs);
    check_lat_row(&result_row(&ss), "2000", "50", &ss);
    // 50 SENDs of two packets each way, no receive ever missing.
    assert!(counter(&ss, "rcvd_pkts") >= 100, "{ss}");
    assert_eq!(
        counter(&ss, "send_rnr_err") + counter(&cs, "send_rnr_err"),
        0
    );
}

#[test]
fn read_lat_two_processes_client_measures() {
    let (cs, ss) = pair(77, "read_lat", &["-s", "512", "-n", "60", "--counters"]);
    check_lat_row(&result_row(&cs), "512", "60", &cs);
    // The server only takes part in the exchange, as perftest's read_lat server.
    assert!(!ss.contains("t_min[usec]"), "{ss}");
    // 60 READ requests from the client; 60 READ responses from the server.
    assert_eq!(counter(&cs, "sent_pkts"), 60);
    assert_eq!(counter(&ss, "sent_pkts"), 60);
}

#[test]
fn json_rows_parse_and_name_the_columns() {
    let (cs, ss) = pair(78, "write_bw", &["-s", "1024", "-n", "50", "--json"]);
    let rows: Vec<serde_json::Value> = cs
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).expect("JSON"))
        .collect();
    assert_eq!(rows.len(), 1, "{cs}");
    let r = &rows[0];
    assert_eq!(r["test"], "write_bw");
    assert_eq!(r["bytes"], 1024);
    assert_eq!(r["iterations"], 50);
    for f in ["bw_peak_mb_sec", "bw_average_mb_sec", "msg_rate_mpps"] {
        assert!(r[f].as_f64().expect(f) > 0.0, "{f} in {r}");
    }
    assert!(
        ss.lines()
            .any(|l| l.starts_with("{\"bytes\":1024") || l.contains("\"bytes\":1024"))
    );
    let (cs, _) = pair(78, "send_lat", &["-s", "8", "-n", "20", "--json"]);
    let r: serde_json::Value = cs
        .lines()
        .find(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).expect("JSON"))
        .unwrap_or_else(|| panic!("no JSON row in {cs}"));
    for f in [
        "t_min_usec",
        "t_max_usec",
        "t_typical_usec",
        "t_avg_usec",
        "t_stdev_usec",
        "percentile_99_usec",
        "percentile_99_9_usec",
    ] {
        assert!(r[f].as_f64().is_some(), "{f} in {r}");
    }
    assert_eq!(
        (r["bytes"].as_u64(), r["iterations"].as_u64()),
        (Some(8), Some(20))
    );
}

#[test]
fn all_sizes_run_every_power_of_two() {
    // perftest's -a has no upper bound option: 2 B to 8 MiB, here with 2 messages each.
    let (cs, ss) = pair(79, "send_bw", &["-a", "-n", "2", "-m", "4096"]);
    let sizes: Vec<String> = result_rows(&cs).into_iter().map(|r| r[0].clone()).collect();
    let want: Vec<String> = (1..24).map(|i| (1u64 << i).to_string()).collect();
    assert_eq!(sizes, want, "{cs}");
    assert_eq!(result_rows(&ss).len(), 23, "{ss}");
}

/// The JSON objects a successful `--json` run printed on stdout, one per line, with the
/// stdout text for messages.
fn json_objects(o: &std::process::Output) -> (String, Vec<serde_json::Value>) {
    let stdout = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(o.status.success(), "{}", text(o));
    let objs = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l:?}")))
        .collect();
    (stdout, objs)
}

/// The ratio lines printed after a --loopback run: (baseline name, ratio).
fn ratios(out: &str) -> Vec<(String, f64)> {
    out.lines()
        .filter(|l| l.contains(" ratio "))
        .map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            let ratio = w.last().and_then(|r| r.parse().ok()).expect("ratio");
            let name = w
                .iter()
                .find(|x| x.ends_with("-stream") || x.ends_with("-pingpong"))
                .expect("baseline name")
                .to_string();
            (name, ratio)
        })
        .collect()
}

/// Runs `softroce perf TEST --loopback` with the server device on `pair.0` and the client
/// on `pair.1`, plus `extra` options, to completion within `secs` seconds.
fn loopback(test: &str, pair: (&str, &str), extra: &[&str], secs: u64) -> std::process::Output {
    let args = [
        &[
            "perf",
            test,
            "--loopback",
            "--ip",
            pair.0,
            "--peer-ip",
            pair.1,
        ][..],
        extra,
    ]
    .concat();
    finish(spawn(&args), Duration::from_secs(secs))
}

#[test]
fn loopback_prints_ratios_to_udp_and_tcp_baselines() {
    const PAIR: (&str, &str) = ("127.0.80.1", "127.0.80.2");
    let o = loopback(
        "write_bw",
        PAIR,
        &["--compare-tcp", "-s", "4096", "-n", "100"],
        60,
    );
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    assert_eq!(result_row(&out)[..2], ["4096", "100"], "{out}");
    let r = ratios(&out);
    assert_eq!(
        r.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
        ["udp-stream", "tcp-stream"],
        "{out}"
    );
    assert!(r.iter().all(|(_, x)| *x > 0.0), "{out}");

    let o = loopback(
        "write_lat",
        PAIR,
        &["--compare-tcp", "-s", "64", "-n", "50", "--json"],
        60,
    );
    let (stdout, objs) = json_objects(&o);
    assert_eq!(objs.len(), 3, "a latency row and two comparisons: {stdout}");
    assert_eq!(objs[0]["test"], "write_lat");
    assert_eq!(objs[1]["baseline"], "udp-pingpong");
    assert_eq!(objs[2]["baseline"], "tcp-pingpong");
    for c in &objs[1..] {
        assert!(c["ratio"].as_f64().expect("ratio") > 0.0, "{c}");
        assert_eq!(c["softroce"], objs[0]["t_typical_usec"]);
    }
}

/// `--trials 3`: three rounds of (test, UDP baseline, TCP baseline), then per baseline the
/// median ratio with its range over the rounds; the median lies in the range and equals one
/// of the three per-round ratios (an odd count has a middle value).
#[test]
fn trials_print_the_median_ratio_and_its_range() {
    let o = loopback(
        "write_bw",
        ("127.0.80.3", "127.0.80.4"),
        &[
            "--compare-tcp",
            "--trials",
            "3",
            "-s",
            "4096",
            "-n",
            "100",
            "--json",
        ],
        120,
    );
    let (stdout, objs) = json_objects(&o);
    for base in ["udp-stream", "tcp-stream"] {
        let per_trial: Vec<f64> = objs
            .iter()
            .filter(|v| v["baseline"] == base && v.get("ratio").is_some())
            .map(|v| v["ratio"].as_f64().expect("ratio"))
            .collect();
        assert_eq!(per_trial.len(), 3, "{base}: {stdout}");
        let summary: Vec<&serde_json::Value> = objs
            .iter()
            .filter(|v| v["baseline"] == base && v.get("ratio_median").is_some())
            .collect();
        assert_eq!(summary.len(), 1, "{base}: {stdout}");
        let s = summary[0];
        assert_eq!(s["trials"], 3);
        let (med, lo, hi) = (
            s["ratio_median"].as_f64().unwrap(),
            s["ratio_min"].as_f64().unwrap(),
            s["ratio_max"].as_f64().unwrap(),
        );
        assert!(lo <= med && med <= hi && lo > 0.0, "{s}");
        assert!(
            per_trial.iter().any(|r| (r - med).abs() < 1e-9),
            "{s} vs {per_trial:?}"
        );
    }
    // Without --loopback there is no second side in this process to alternate with.
    let o = finish(
        spawn(&["perf", "write_bw", "--trials", "2", "--ip", "127.0.80.3"]),
        Duration::from_secs(30),
    );
    assert!(!o.status.success());
    assert!(
        text(&o).contains("--trials needs --loopback"),
        "{}",
        text(&o)
    );
}

#[test]
fn udp_baseline_prints_stream_and_pingpong_rows() {
    let o = finish(
        spawn(&[
            "perf",
            "udp-baseline",
            "--ip",
            "127.0.81.1",
            "--peer-ip",
            "127.0.81.2",
            "-s",
            "8192",
            "-m",
            "4096",
            "-n",
            "200",
        ]),
        Duration::from_secs(60),
    );
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    assert!(
        out.contains("4112-byte datagrams"),
        "MTU payload + BTH + ICRC: {out}"
    );
    let bw = result_row(&out);
    assert_eq!(bw[..2], ["8192", "200"], "{out}");
    assert!(bw[3].parse::<f64>().expect("MB/s") > 0.0, "{out}");
    let lat_part = &out[out.find("UDP ping-pong").expect("ping-pong section")..];
    check_lat_row(&result_row(lat_part), "8192", "200", lat_part);
}

/// Whether this kernel takes a UDP GSO send on loopback (two segments between two sockets
/// of this process), and gives it to a `UDP_GRO` receiver as one buffer.
fn kernel_gso_and_gro(ip: &str) -> (bool, bool) {
    use softroce::net::batch::{RecvBatch, enable_gro, send_gso};
    use std::os::fd::AsRawFd;
    let tx = std::net::UdpSocket::bind((ip, 0)).expect("bind");
    let rx = std::net::UdpSocket::bind((ip, 0)).expect("bind");
    rx.set_read_timeout(Some(Duration::from_secs(2)))
        .expect("timeout");
    let gro = enable_gro(rx.as_raw_fd()).is_ok();
    let to = rx.local_addr().expect("addr");
    if send_gso(tx.as_raw_fd(), &to, &[7u8; 200], 100).is_err() {
        return (false, false);
    }
    let mut b = RecvBatch::new(2);
    b.recv(rx.as_raw_fd(), true).expect("the GSO send arrives");
    let coalesced = b.received().any(|r| r.segments().count() == 2);
    (true, gro && coalesced)
}

/// `udp-baseline --json` reports how its datagrams went through the kernel, batched as the
/// data path batches: 8 KiB messages at MTU 4096 are 2 datagrams of 4112 bytes; the stream
/// sends runs of 15 (65,507 / 4112, the most one GSO send carries), the ping-pong one send
/// of 2 per message each way; UDP GSO when the kernel takes it (else `sendmmsg`), and the
/// receiver gets a GSO send as one GRO buffer when the kernel coalesces.
#[test]
fn udp_baseline_batches_as_the_data_path() {
    let (gso, gro) = kernel_gso_and_gro("127.0.84.1");
    let o = finish(
        spawn(&[
            "perf",
            "udp-baseline",
            "--ip",
            "127.0.84.1",
            "--peer-ip",
            "127.0.84.2",
            "-s",
            "8192",
            "-m",
            "4096",
            "-n",
            "200",
            "--json",
        ]),
        Duration::from_secs(60),
    );
    let (stdout, objs) = json_objects(&o);
    let find = |t: &str| {
        objs.iter()
            .find(|v| v["test"] == t)
            .unwrap_or_else(|| panic!("no {t} in {stdout}"))
    };
    let n = |v: &serde_json::Value, k: &str| v[k].as_u64().unwrap_or_else(|| panic!("{k}: {v}"));

    let s = find("udp-stream-batching");
    assert_eq!(s["bytes"], 8192, "{s}");
    assert_eq!(n(s, "datagrams_sent"), 400, "{s}");
    assert_eq!(n(s, "datagrams_received"), 400, "{s}");
    assert_eq!(n(s, "send_calls"), 400_u64.div_ceil(15), "{s}");
    assert!(
        s["datagrams_per_send"].as_f64().expect("per send") > 14.0,
        "{s}"
    );
    assert_eq!(n(s, "gso_sends"), if gso { 27 } else { 0 }, "{s}");
    if gro {
        assert!(n(s, "gro_buffers") > 0, "{s}");
        assert!(n(s, "recv_calls") < 400, "{s}");
    }

    let p = find("udp-pingpong-batching");
    assert_eq!(n(p, "datagrams_sent"), 800, "{p}");
    assert_eq!(n(p, "datagrams_received"), 800, "{p}");
    assert_eq!(n(p, "send_calls"), 400, "{p}");
    assert_eq!(n(p, "gso_sends"), if gso { 400 } else { 0 }, "{p}");
    if gro {
        assert_eq!(
            n(p, "gro_buffers"),
            400,
            "each message arrives as one buffer: {p}"
        );
    }
    eprintln!("kernel GSO {gso}, GRO {gro}: {s}\n{p}");
}

/// A hand-written perftest peer drives a read_lat and an atomic_bw server through their
/// whole exchange (both servers only wait while the client works), with the step counts of
/// perftest 4.5's captures.
#[test]
fn servers_follow_perftest_step_counts() {
    for (test, before, reports) in [("read_lat", 4, false), ("atomic_bw", 3, true)] {
        let ip = "127.0.82.1";
        let port = free_port(ip);
        let mut server = spawn(&["perf", test, "--ip", ip, "-p", &port.to_string()]);
        wait_for_line(&mut server, "Waiting for client to connect");
        let mut tcp = TcpStream::connect((ip, port)).expect("connect");
        let mut xchg = |mine: &[u8]| -> Vec<u8> {
            tcp.write_all(mine).expect("write");
            let mut theirs = vec![0u8; mine.len()];
            tcp.read_exact(&mut theirs).expect("read");
            theirs
        };
        let mut version = [0u8; 16];
        version[..4].copy_from_slice(b"6.06");
        xchg(&version);
        xchg(&4096u32.to_be_bytes());
        xchg(&64u32.to_be_bytes());
        xchg(b"3\0");
        let mine = b"0000:0080:000123:abcdef:00000456:0000000000001000:00:00:00:00:00:00:00:00:00:00:ff:ff:7f:00:52:02:00000000:\0";
        let theirs = xchg(mine);
        let t = std::str::from_utf8(&theirs[..107]).expect("text");
        assert_eq!(&t[5..9], "0080", "{test} accepts outstanding reads: {t}");
        for _ in 1..before {
            assert_eq!(xchg(mine), theirs, "{test}");
        }
        if reports {
            xchg(mine);
            let r = [
                8u64.to_be_bytes(),
                5u64.to_be_bytes(),
                1.5f64.to_be_bytes(),
                1.25f64.to_be_bytes(),
                0.1f64.to_be_bytes(),
            ];
            for w in r {
                xchg(&w);
            }
        }
        assert_eq!(xchg(mine), theirs, "{test}: closing handshake");
        let mut done = [0u8; 5];
        tcp.read_exact(&mut done).expect("server's done");
        assert_eq!(&done, b"done\0");
        tcp.write_all(b"done\0").expect("our done");
        let o = finish(server, Duration::from_secs(20));
        let out = text(&o);
        assert!(o.status.success(), "{test}: {out}");
        if reports {
            assert_eq!(
                result_row(&out),
                ["8", "5", "1.50", "1.25", "0.100000"],
                "{out}"
            );
        }
    }
}

#[test]
fn duration_mode_counts_what_fit_in_the_time() {
    // -D 1: the client sends for a second; the row gives what completed, peak 0 (perftest).
    let (cs, ss) = pair(83, "send_bw", &["-D", "1", "-s", "1024"]);
    let (c, s) = (result_row(&cs), result_row(&ss));
    assert_eq!(c[0], "1024", "{cs}");
    assert!(c[1].parse::<u64>().expect("iterations") > 10, "{cs}");
    assert_eq!(c[2], "0.00", "no peak in duration mode: {cs}");
    assert_eq!(
        s[1], c[1],
        "the server received every SEND the client completed: {ss}"
    );
    // Latency: perftest's duration table (#bytes #iterations t_avg tps).
    let (cs, ss) = pair(83, "write_lat", &["-D", "1", "-s", "64"]);
    for out in [&cs, &ss] {
        assert!(out.contains("t_avg[usec]    tps average"), "{out}");
        let r = result_row(out);
        assert_eq!(r.len(), 4, "{out}");
        assert!(r[1].parse::<u64>().expect("iterations") > 10, "{out}");
        assert!(r[2].parse::<f64>().expect("t_avg") > 0.0, "{out}");
    }
}

/// `--busy-poll`: the latency tests complete with every iteration when the polling thread
/// receives from the socket itself (both devices in one process, so both sides busy-poll),
/// and so do the bandwidth tests, whose client thread then receives the ACKs and sends the
/// next window itself.
#[test]
fn busy_poll_tests_complete() {
    for (test, size) in [
        ("send_lat", "64"),
        ("write_lat", "64"),
        ("read_lat", "64"),
        ("write_bw", "65536"),
        ("read_bw", "65536"),
        ("send_bw", "65536"),
    ] {
        let o = loopback(
            test,
            ("127.0.80.5", "127.0.80.6"),
            &["--busy-poll", "-m", "4096", "-s", size, "-n", "200"],
            60,
        );
        let out = text(&o);
        assert!(o.status.success(), "{test}: {out}");
        let row = result_row(&out);
        assert_eq!(row[..2], [size, "200"], "{test}: {out}");
        assert_eq!(ratios(&out).len(), 1, "{test}: {out}");
        if test.ends_with("_lat") {
            // t_min <= t_typical <= t_max, all positive.
            let t: Vec<f64> = row[2..5].iter().map(|x| x.parse().unwrap()).collect();
            assert!(t[0] > 0.0 && t[0] <= t[2] && t[2] <= t[1], "{test}: {out}");
        }
    }
}

/// `--cpus 0`: both ends of the test and of its baselines run on CPU 0, and the comparison
/// says so; a CPU the process may not use is refused before anything starts.
#[test]
fn cpus_pins_both_ends_and_is_stated_with_the_ratios() {
    // A CPU this process may use (0 unless a restricting taskset says otherwise).
    let allowed = rustix::thread::sched_getaffinity(None).expect("affinity");
    let cpu = (0..rustix::thread::CpuSet::MAX_CPU)
        .find(|c| allowed.is_set(*c))
        .expect("an allowed CPU")
        .to_string();
    let o = loopback(
        "write_bw",
        ("127.0.86.1", "127.0.86.2"),
        &["--compare-tcp", "--cpus", &cpu, "-s", "4096", "-n", "100"],
        60,
    );
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    let both = format!("both ends on CPU {cpu}");
    assert!(out.contains(&format!(" CPUs            : {both}")), "{out}");
    assert_eq!(
        out.matches(&format!("on loopback, {both} (ratio")).count(),
        2,
        "{out}"
    );
    assert_eq!(ratios(&out).len(), 2, "{out}");

    let o = finish(
        spawn(&[
            "perf",
            "write_bw",
            "--loopback",
            "--cpus",
            &format!("{cpu},1000"),
        ]),
        Duration::from_secs(20),
    );
    let out = text(&o);
    assert!(!o.status.success(), "{out}");
    assert!(out.contains("may not run on CPU 1000"), "{out}");
}
