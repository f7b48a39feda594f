//! A network namespace of a test's own, for the tests that need addresses the host's loopback
//! does not have (`tests/ipv6_loopback.rs`, `tests/multicast.rs`): create it with `ip netns
//! add` (root and iproute2; otherwise the caller skips, saying why), configure it, re-run one
//! ignored test of the same binary inside it with `ip netns exec`, and delete it when done,
//! also on panic.

#![allow(dead_code)] // each test binary uses a different subset

use std::ffi::OsStr;
use std::process::Command;

/// Runs `ip ARGS`; Err(reason) when it cannot.
pub fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("cannot run `ip` (iproute2): {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "`ip {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// A namespace named `softroce-TAG-PID`, deleted on drop.
pub struct Netns(pub String);

impl Netns {
    /// Creates the namespace and brings its `lo` up. Err(reason) when this machine cannot
    /// (not root, no iproute2): the caller prints it and skips.
    pub fn create(tag: &str) -> Result<Netns, String> {
        let name = format!("softroce-{tag}-{}", std::process::id());
        ip(&["netns", "add", &name])?;
        let ns = Netns(name);
        ns.ip(&["link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// [`Netns::create`], or None after printing why this machine cannot (the caller
    /// returns: the test is skipped, saying so).
    pub fn create_or_skip(tag: &str) -> Option<Netns> {
        Netns::create(tag)
            .map_err(|why| {
                eprintln!("SKIPPED: this test needs its own network namespace (root): {why}")
            })
            .ok()
    }

    /// Runs `ip -n NAME ARGS`.
    pub fn ip(&self, args: &[&str]) -> Result<(), String> {
        let mut all = vec!["-n", self.0.as_str()];
        all.extend_from_slice(args);
        ip(&all)
    }

    /// Re-runs this test binary inside the namespace, only the ignored test `test`, with the
    /// environment variable `key` set to `value` (how the test knows it is the inner run).
    /// Prints the inner run's output, asserts that it passed and that `test` ran, and
    /// returns its stdout.
    pub fn run_ignored_test(&self, test: &str, key: &str, value: &OsStr) -> String {
        let exe = std::env::current_exe().expect("test binary path");
        let out = Command::new("ip")
            .args(["netns", "exec", &self.0])
            .arg(&exe)
            .args(["--exact", test, "--ignored", "--test-threads=1"])
            .env(key, value)
            .output()
            .expect("ip netns exec");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr);
        eprintln!("--- run inside netns {} ---\n{stdout}{stderr}", self.0);
        assert!(
            out.status.success(),
            "the checks inside the namespace failed"
        );
        assert!(
            stdout.contains(&format!("test {test} ... ok")) && stdout.contains("1 passed"),
            "the checks did not run inside the namespace"
        );
        stdout
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = ip(&["netns", "del", &self.0]);
    }
}
