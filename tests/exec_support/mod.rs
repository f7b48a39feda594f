//! Helpers shared by the tests that run C programs through `softroce exec` (capi_exec,
//! capi_tools, cm_seed, cm_tools): finding a tool, starting it on a device address, waiting
//! for it with a deadline, and waiting until a device owns an address's RoCEv2 port.

#![allow(dead_code)] // each test binary uses a different subset

use std::ffi::OsStr;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The `softroce` binary under test.
pub const SOFTROCE: &str = env!("CARGO_BIN_EXE_softroce");

/// True when `tool` is installed (Debian's packages put them in /usr/bin).
pub fn have(tool: &str) -> bool {
    ["/usr/bin", "/bin", "/usr/local/bin"]
        .iter()
        .any(|d| Path::new(d).join(tool).exists())
}

/// `softroce exec --ip IP -- ARGS…`, stdout and stderr captured.
pub fn exec<S: AsRef<OsStr>>(ip: &str, args: &[S]) -> Command {
    let mut c = Command::new(SOFTROCE);
    c.args(["exec", "--ip", ip, "--"]).args(args);
    c.stdout(Stdio::piped()).stderr(Stdio::piped());
    c
}

/// `softroce exec --pcap PCAP --ip IP -- ARGS…`, stdout and stderr captured: [`exec`] with
/// every datagram of the program's devices written to `pcap`.
pub fn exec_pcap<S: AsRef<OsStr>>(ip: &str, pcap: &Path, args: &[S]) -> Command {
    let mut c = Command::new(SOFTROCE);
    c.args(["exec", "--pcap"])
        .arg(pcap)
        .args(["--ip", ip, "--"])
        .args(args);
    c.stdout(Stdio::piped()).stderr(Stdio::piped());
    c
}

/// Waits for `child` up to `limit`; past that ends it (and every process it started that
/// still runs) and panics with what it printed.
/// Ending it: SIGTERM, so that a script's EXIT trap removes what it started
/// (scripts/mpi-netns.sh: its namespaces and their processes), then SIGKILL after 10 s. Its
/// output is read for at most 10 s more: a process it started and that outlives it (mpirun's
/// daemons) may hold the pipes open for ever, and the test must still end and say why.
pub fn wait(mut child: Child, limit: Duration, what: &str) -> Output {
    let deadline = Instant::now() + limit;
    loop {
        if child.try_wait().unwrap().is_some() {
            return child.wait_with_output().unwrap();
        }
        if Instant::now() > deadline {
            // Where it waits, read before it is ended (the cause of a hang seen once).
            let report = stuck_report(child.id());
            // Its descendants, listed while they are still its: ended below with it, so that
            // a hung program under `softroce exec` does not outlive the test.
            let tree = process_tree(child.id());
            let (stdout, stderr) = (
                read_in_background(child.stdout.take()),
                read_in_background(child.stderr.take()),
            );
            // SAFETY: signals our own child, which has not been reaped (try_wait said so).
            unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
            let grace = Instant::now() + Duration::from_secs(10);
            while child.try_wait().unwrap().is_none() && Instant::now() < grace {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
            for (p, start) in tree.into_iter().skip(1) {
                // Only the process listed, not a later one that reused its number.
                if process_tree(p).first() == Some(&(p, start)) {
                    // SAFETY: kill(2) of a descendant of our child, checked by start time.
                    unsafe { libc::kill(p as libc::pid_t, libc::SIGKILL) };
                }
            }
            let until = Instant::now() + Duration::from_secs(10);
            panic!(
                "{what}: still running after {limit:?}; stdout:\n{}\nstderr:\n{}\nwhere its \
                 processes waited:\n{report}",
                String::from_utf8_lossy(&stdout(until)),
                String::from_utf8_lossy(&stderr(until))
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `pid` and its descendants, each with its start time (`/proc/PID/stat` field 22, clock
/// ticks after boot), parents before children.
fn process_tree(pid: u32) -> Vec<(u32, u64)> {
    // (pid, ppid, start) of every process: "pid (comm) state ppid ...", comm may hold
    // anything, so the fields are counted after its closing parenthesis.
    let all: Vec<(u32, u32, u64)> = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let pid = e.file_name().to_str()?.parse::<u32>().ok()?;
            let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
            let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
            Some((
                pid,
                fields.get(1)?.parse().ok()?,
                fields.get(19)?.parse().ok()?,
            ))
        })
        .collect();
    let mut tree: Vec<(u32, u64)> = all
        .iter()
        .filter(|(p, _, _)| *p == pid)
        .map(|(p, _, t)| (*p, *t))
        .collect();
    let mut i = 0;
    while let Some(&(p, _)) = tree.get(i) {
        tree.extend(
            all.iter()
                .filter(|(_, pp, _)| *pp == p)
                .map(|(c, _, t)| (*c, *t)),
        );
        i += 1;
    }
    tree
}

/// What each process of `pid`'s tree waits in, for a test whose child overran its deadline:
/// every thread's name, kernel wait channel and system call (`/proc/TID/{comm,wchan,syscall}`:
/// the number first, 202 a futex, 7 poll, 232 epoll_wait, 45/47 recvfrom/recvmsg), and where
/// gdb is installed each thread's stack (`gdb -batch -p`, up to 20 s a process).
pub fn stuck_report(pid: u32) -> String {
    use std::fmt::Write as _;
    let read = |p: &Path| std::fs::read_to_string(p).unwrap_or_default();
    let mut out = String::new();
    for (p, _) in process_tree(pid) {
        let dir = PathBuf::from(format!("/proc/{p}"));
        let _ = writeln!(out, "process {p} {}", read(&dir.join("comm")).trim());
        let mut tids: Vec<PathBuf> = std::fs::read_dir(dir.join("task"))
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .collect();
        tids.sort();
        for t in tids {
            let syscall = read(&t.join("syscall"));
            let _ = writeln!(
                out,
                "  thread {} {}: wchan {}, syscall {}",
                t.file_name().unwrap_or_default().to_string_lossy(),
                read(&t.join("comm")).trim(),
                read(&t.join("wchan")).trim(),
                syscall.split_whitespace().next().unwrap_or("?")
            );
        }
        if have("gdb") {
            let bt = Command::new("timeout")
                .args(["20", "gdb", "-q", "-batch", "-p", &p.to_string()])
                .args(["-ex", "thread apply all bt 20"])
                .output();
            if let Ok(o) = bt {
                for l in String::from_utf8_lossy(&o.stdout)
                    .lines()
                    .filter(|l| l.starts_with('#') || l.starts_with("Thread "))
                    .take(150)
                {
                    let _ = writeln!(out, "    {l}");
                }
            }
        }
    }
    out
}

/// Reads `pipe` to its end in a thread; the returned function gives what was read by then
/// or by `until`, whichever comes first.
fn read_in_background(
    pipe: Option<impl std::io::Read + Send + 'static>,
) -> impl FnOnce(Instant) -> Vec<u8> {
    let got = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    if let Some(mut p) = pipe {
        let got = got.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n @ 1..) = p.read(&mut buf) {
                got.lock().unwrap().extend_from_slice(&buf[..n]);
            }
            let _ = tx.send(());
        });
    } else {
        let _ = tx.send(());
    }
    move |until: Instant| {
        let _ = rx.recv_timeout(until.saturating_duration_since(Instant::now()));
        got.lock().unwrap().clone()
    }
}

/// Waits for `child` up to `limit`; past that kills it (by its pid) and returns None.
pub fn wait_or_kill(mut child: Child, limit: Duration) -> Option<Output> {
    let deadline = Instant::now() + limit;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Some(child.wait_with_output().unwrap())
}

/// Waits (up to 10 s) until a softroce device owns `ip`'s RoCEv2 port, read from
/// /proc/net/udp (binding the port to probe it could steal it from the server).
pub fn wait_device(ip: Ipv4Addr) {
    // /proc/net/udp writes the address as the hex of its in-memory (network-order) u32.
    let want = format!("{:08X}:12B7", u32::from_ne_bytes(ip.octets()));
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        let table = std::fs::read_to_string("/proc/net/udp").unwrap_or_default();
        if table
            .lines()
            .any(|l| l.split_whitespace().nth(1) == Some(&want))
        {
            return;
        }
        assert!(Instant::now() < end, "no device on {ip} within 10 s");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Compiles tests/c/`name`.c (`name` may have a folder: `seed/rdma_server`) against the
/// installed rdma-core headers (`cc -Wall -o DIR/<file name> … -lrdmacm -libverbs`) into
/// `dir`. None, saying why on stdout, when librdmacm-dev or a C compiler is missing; a
/// compile error fails the test.
pub fn compile_c(name: &str, dir: &Path) -> Option<std::path::PathBuf> {
    if !Path::new("/usr/include/rdma/rdma_cma.h").exists() {
        println!("SKIPPED: librdmacm-dev is not installed (apt-get install librdmacm-dev)");
        return None;
    }
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/c/{name}.c"));
    let exe = dir.join(Path::new(name).file_name().unwrap_or(name.as_ref()));
    let Ok(out) = Command::new("cc")
        .args(["-Wall", "-o"])
        .arg(&exe)
        .arg(&src)
        .args(["-lrdmacm", "-libverbs"])
        .output()
    else {
        println!("SKIPPED: no C compiler (cc)");
        return None;
    };
    assert!(
        out.status.success(),
        "cc {name}.c failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(exe)
}

/// Compiles tests/c/`name`.c ([`compile_c`]), runs it through `softroce exec --ip ips` with
/// `args` (60 s at most), and asserts that it exits 0, prints the line "`name`: end 0" and
/// exactly `checks` lines starting "ok   " (a check that was skipped would shrink the
/// count). Returns its stdout; None when skipped (no librdmacm-dev or C compiler).
pub fn run_c_checks(name: &str, ips: &str, args: &[&str], checks: usize) -> Option<String> {
    let dir = std::env::temp_dir().join(format!("softroce-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let exe = compile_c(name, &dir)?;
    let mut argv = vec![exe.as_os_str()];
    argv.extend(args.iter().map(std::ffi::OsStr::new));
    let out = wait(
        exec(ips, &argv).spawn().unwrap(),
        Duration::from_secs(60),
        name,
    );
    let _ = std::fs::remove_dir_all(&dir);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let report = format!(
        "{}\n{text}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{report}");
    let end = format!("{name}: end 0");
    assert!(text.lines().any(|l| l == end), "{report}");
    assert_eq!(
        text.lines().filter(|l| l.starts_with("ok   ")).count(),
        checks,
        "{report}"
    );
    Some(text)
}

/// What [`server_then_client`] returns: each side's stdout, and a report of both sides'
/// statuses, stdouts and stderrs for assertion messages.
pub struct ServerClient {
    pub server: String,
    pub client: String,
    pub report: String,
}

/// Runs `server` through `softroce exec` on `sip`, waits until its device is open and 300 ms
/// more (an rdma_cm server listens a moment after it opens its device), then `client` on
/// `cip`; waits up to `limit` for each (named `names` in a timeout's message) and asserts that
/// both exited 0.
pub fn server_then_client<S: AsRef<OsStr>>(
    sip: &str,
    server: &[S],
    cip: &str,
    client: &[S],
    limit: Duration,
    names: (&str, &str),
) -> ServerClient {
    let srv = exec(sip, server).spawn().unwrap();
    wait_device(sip.parse().unwrap());
    std::thread::sleep(Duration::from_millis(300));
    let cli = exec(cip, client).spawn().unwrap();
    let c = wait(cli, limit, names.1);
    let s = wait(srv, limit, names.0);
    let (cout, sout) = (
        String::from_utf8_lossy(&c.stdout).into_owned(),
        String::from_utf8_lossy(&s.stdout).into_owned(),
    );
    let report = format!(
        "client ({}):\n{cout}{}\nserver ({}):\n{sout}{}",
        c.status,
        String::from_utf8_lossy(&c.stderr),
        s.status,
        String::from_utf8_lossy(&s.stderr)
    );
    assert!(c.status.success() && s.status.success(), "{report}");
    ServerClient {
        server: sout,
        client: cout,
        report,
    }
}

/// `softroce decode PCAP`'s output (one line per frame), asserting that it succeeded.
pub fn decode(pcap: &Path) -> String {
    let out = Command::new(SOFTROCE)
        .arg("decode")
        .arg(pcap)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "decode: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Waits (up to 60 s) until a TCP socket listens on `port` (/proc/net/tcp, tcp6); fails at
/// once, with its output, if `server` exits first (it is taken then).
pub fn wait_tcp_listen(port: u16, server: &mut Option<Child>) {
    let want = format!(":{port:04X}");
    let end = Instant::now() + Duration::from_secs(60);
    loop {
        for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
            let t = std::fs::read_to_string(table).unwrap_or_default();
            if t.lines().any(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                f.len() > 3 && f[1].ends_with(&want) && f[3] == "0A"
            }) {
                return;
            }
        }
        if let Some(c) = server.as_mut()
            && let Ok(Some(st)) = c.try_wait()
        {
            let out = server.take().unwrap().wait_with_output().unwrap();
            panic!(
                "server exited ({st}) before listening on TCP {port}:\n{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        assert!(
            Instant::now() < end,
            "nothing listens on TCP {port} within 60 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Kills the child by its pid if the test panics first.
pub struct Kill(pub Option<Child>);

impl Drop for Kill {
    fn drop(&mut self) {
        if let Some(c) = &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A child of `softroce exec` whose stdout lines arrive on a channel as they are printed (the
/// program is run under `stdbuf -oL`, so that its lines are not held in a pipe buffer until
/// it exits). Its waits end a failing run after `line_limit` (a line) and `exit_limit` (the
/// exit).
pub struct Lines {
    kill: Kill,
    rx: std::sync::mpsc::Receiver<String>,
    seen: Vec<String>,
    line_limit: Duration,
    exit_limit: Duration,
}

impl Lines {
    /// `softroce exec --ip IP -- stdbuf -oL ARGS…`, waiting up to 30 s for a line and 60 s
    /// for the exit.
    pub fn spawn(ip: &str, args: &[&str]) -> Lines {
        Lines::spawn_with_limits(ip, args, Duration::from_secs(30), Duration::from_secs(60))
    }

    /// [`Lines::spawn`] with other limits.
    pub fn spawn_with_limits(
        ip: &str,
        args: &[&str],
        line_limit: Duration,
        exit_limit: Duration,
    ) -> Lines {
        let mut all = vec!["stdbuf", "-oL"];
        all.extend_from_slice(args);
        let mut c = exec(ip, &all)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let out = c.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for l in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        Lines {
            kill: Kill(Some(c)),
            rx,
            seen: Vec::new(),
            line_limit,
            exit_limit,
        }
    }

    /// Waits for a line containing `what`; returns it.
    pub fn wait_for(&mut self, what: &str) -> String {
        let end = Instant::now() + self.line_limit;
        loop {
            if let Some(l) = self.seen.iter().find(|l| l.contains(what)) {
                return l.clone();
            }
            let left = end.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left) {
                Ok(l) => self.seen.push(l),
                Err(_) => panic!(
                    "no line with {what:?} within {:?}; saw:\n{:#?}",
                    self.line_limit, self.seen
                ),
            }
        }
    }

    /// Kills the child with SIGKILL and reaps it (a process killed mid-run).
    pub fn kill_now(&mut self) {
        if let Some(mut c) = self.kill.0.take() {
            c.kill().unwrap();
            c.wait().unwrap();
        }
    }

    /// Whether the child has not exited yet.
    pub fn running(&mut self) -> bool {
        self.kill
            .0
            .as_mut()
            .is_some_and(|c| c.try_wait().unwrap().is_none())
    }

    /// Waits for the exit: the status and every line printed (stdout, then stderr).
    pub fn finish(mut self, what: &str) -> (std::process::ExitStatus, String) {
        let o = wait(self.kill.0.take().unwrap(), self.exit_limit, what);
        // Every line: the reader thread ends at the pipe's end of file.
        self.seen.extend(self.rx.iter());
        let text = format!(
            "{}\n{}",
            self.seen.join("\n"),
            String::from_utf8_lossy(&o.stderr)
        );
        (o.status, text)
    }
}
