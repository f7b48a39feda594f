//! Helpers shared by the tests that run the `softroce` binary as child processes
//! (`tests/pingpong.rs`, `tests/perf.rs`): start it, wait for a line of its output, wait for
//! it to end within a limit, and read its result and counter lines.

#![allow(dead_code)] // each test binary uses a different subset

use std::io::Read;
use std::net::TcpListener;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_softroce");

/// A softroce process that is killed if the test fails before it ends.
pub struct Proc(Option<Child>);

impl Proc {
    pub fn child(&mut self) -> &mut Child {
        self.0.as_mut().expect("running")
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Starts `softroce ARGS` with stdout and stderr piped.
pub fn spawn(args: &[&str]) -> Proc {
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

/// Waits for the process; kills it and fails the test after `limit`.
pub fn finish(mut p: Proc, limit: Duration) -> Output {
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

/// Reads stdout (or stderr) until a complete line satisfies `wanted`; returns what was read.
/// `what` names the line in the failure message.
pub fn read_until_line(
    p: &mut Proc,
    stderr: bool,
    what: &str,
    wanted: impl Fn(&str) -> bool,
) -> String {
    let c = p.child();
    let out: &mut dyn Read = if stderr {
        c.stderr.as_mut().expect("piped stderr")
    } else {
        c.stdout.as_mut().expect("piped stdout")
    };
    let mut seen = Vec::new();
    let mut byte = [0u8; 1];
    // Complete lines only: the one we wait for must have arrived whole.
    while !String::from_utf8_lossy(&seen)
        .split_inclusive('\n')
        .any(|l| l.ends_with('\n') && wanted(l))
    {
        match out.read(&mut byte) {
            Ok(1) => seen.push(byte[0]),
            _ => panic!(
                "output ended before {what:?}: {}",
                String::from_utf8_lossy(&seen)
            ),
        }
    }
    String::from_utf8_lossy(&seen).into_owned()
}

/// A TCP port nobody listens on at `ip` right now.
pub fn free_port(ip: &str) -> u16 {
    TcpListener::bind((ip, 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free TCP port")
}

/// stdout then stderr, as text.
pub fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The value of `name=` in the first `counters:` line of `out`.
pub fn counter(out: &str, name: &str) -> u64 {
    let line = out
        .lines()
        .find_map(|l| l.strip_prefix("counters: "))
        .unwrap_or_else(|| panic!("no counters line in {out}"));
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(&format!("{name}=")))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("counter {name} missing: {line}"))
}
