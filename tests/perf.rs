//! `softroce perf write_bw` and `read_bw` against themselves, as two processes over UDP on
//! loopback, and against a hand-written peer that speaks perftest's TCP exchange byte for byte.
//! Each test uses its own 127.0.7x.y addresses and a free TCP port.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_softroce");

/// A softroce process that is killed if the test fails before it ends.
struct Proc(Option<Child>);

impl Drop for Proc {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn spawn(args: &[&str]) -> Proc {
    Proc(Some(
        Command::new(BIN)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start softroce"),
    ))
}

fn finish(mut p: Proc, limit: Duration) -> Output {
    let mut c = p.0.take().expect("running");
    let deadline = Instant::now() + limit;
    while c.try_wait().expect("try_wait").is_none() {
        if Instant::now() > deadline {
            let _ = c.kill();
            let out = c.wait_with_output().expect("output");
            panic!(
                "softroce did not finish in {limit:?}:\n{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    c.wait_with_output().expect("output")
}

/// Reads stdout until a complete line contains `needle`; returns what was read.
fn wait_for_line(p: &mut Proc, needle: &str) -> String {
    let out =
        p.0.as_mut()
            .and_then(|c| c.stdout.as_mut())
            .expect("piped stdout");
    let mut seen = Vec::new();
    let mut byte = [0u8; 1];
    while !String::from_utf8_lossy(&seen)
        .split_inclusive('\n')
        .any(|l| l.contains(needle) && l.ends_with('\n'))
    {
        match out.read(&mut byte) {
            Ok(1) => seen.push(byte[0]),
            _ => panic!(
                "stdout ended before {needle:?}: {}",
                String::from_utf8_lossy(&seen)
            ),
        }
    }
    String::from_utf8_lossy(&seen).into_owned()
}

fn free_port(ip: &str) -> u16 {
    TcpListener::bind((ip, 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free TCP port")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The row under perftest's result header.
fn result_row(out: &str) -> Vec<String> {
    let mut lines = out.lines();
    lines
        .find(|l| l.contains("#bytes") && l.contains("BW average[MB/sec]"))
        .unwrap_or_else(|| panic!("no result header in {out}"));
    lines
        .next()
        .expect("a result row")
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

fn counter(out: &str, name: &str) -> u64 {
    out.lines()
        .find_map(|l| l.strip_prefix("counters: "))
        .and_then(|l| {
            l.split_whitespace()
                .find_map(|kv| kv.strip_prefix(&format!("{name}=")))
        })
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("counter {name} missing in {out}"))
}

fn run_pair(net: u8, test: &str, size: u32, iters: u32) {
    let (sip, cip) = (format!("127.0.{net}.1"), format!("127.0.{net}.2"));
    let port = free_port(&sip).to_string();
    let (size_s, iters_s) = (size.to_string(), iters.to_string());
    let common = [
        "perf",
        test,
        "-p",
        &port,
        "-s",
        &size_s,
        "-n",
        &iters_s,
        "-t",
        "16",
        "--counters",
    ];
    let mut server = spawn(&[&common[..], &["--ip", &sip]].concat());
    let head = wait_for_line(&mut server, "Waiting for client to connect");
    let c = finish(
        spawn(&[&common[..], &["--ip", &cip, &sip]].concat()),
        Duration::from_secs(60),
    );
    let s = finish(server, Duration::from_secs(60));
    let (cs, ss) = (text(&c), format!("{head}{}", text(&s)));
    assert!(c.status.success(), "client:\n{cs}\nserver:\n{ss}");
    assert!(s.status.success(), "server:\n{ss}\nclient:\n{cs}");
    let row = result_row(&cs);
    assert_eq!(row[..2], [size_s.clone(), iters_s.clone()], "{cs}");
    assert!(row[3].parse::<f64>().expect("average") > 0.0, "{cs}");
    // The server prints the results the client sent it.
    assert_eq!(result_row(&ss), row, "server:\n{ss}");
    // One request per MTU of data each way: WRITEs go client → server, READ responses back.
    let per_msg = u64::from(size.div_ceil(1024));
    let data_side = if test == "write_bw" { &cs } else { &ss };
    assert_eq!(counter(data_side, "sent_pkts"), u64::from(iters) * per_msg);
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
fn unimplemented_tests_are_refused_with_a_clear_error() {
    for t in ["send_bw", "write_lat", "send_lat", "read_lat"] {
        let o = finish(spawn(&["perf", t]), Duration::from_secs(20));
        assert_eq!(o.status.code(), Some(1), "{t}");
        assert!(
            text(&o).contains(&format!("{t} is not implemented yet")),
            "{t}: {}",
            text(&o)
        );
    }
}
