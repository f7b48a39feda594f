//! The command loop: reading JSON command lines from stdin, dispatching each to its command,
//! and writing its reply or `error` line.

use super::args::{CmdArgs, CmdError};
use super::commands::{
    cmd_connect, cmd_counters, cmd_dump_mr, cmd_post_recv, cmd_post_send, cmd_query_qp,
    cmd_write_mr,
};
use super::state::{MAX_LINE_BYTES, Target, emit};
use serde_json::{Map, Value, json};
use std::io::{BufRead, Read};
use std::sync::atomic::Ordering;

/// What a command line produced.
enum Outcome {
    /// Write this reply and read the next command.
    Reply(Value),
    /// Write this reply and exit.
    Quit(Value),
    /// The reply is written already (`post_send`); read the next command.
    Written,
}

/// Reads command lines until EOF, `quit` or a broken stdout.
pub(super) fn command_loop(t: &Target) {
    let stdin = std::io::stdin();
    let mut input = stdin.lock();
    let mut buf = Vec::new();
    let mut lineno = 0u64;
    while !t.out_broken.load(Ordering::SeqCst) {
        buf.clear();
        let n = match (&mut input)
            .take(MAX_LINE_BYTES + 1)
            .read_until(b'\n', &mut buf)
        {
            Ok(n) => n,
            Err(_) => break,
        };
        if n == 0 {
            break; // EOF
        }
        lineno += 1;
        if buf.len() as u64 > MAX_LINE_BYTES && buf.last() != Some(&b'\n') {
            // Skip the rest of the over-long line.
            let mut rest = Vec::new();
            while let Ok(k) = (&mut input).take(1 << 20).read_until(b'\n', &mut rest) {
                if k == 0 || rest.last() == Some(&b'\n') {
                    break;
                }
                rest.clear();
            }
            let message = format!("line longer than {MAX_LINE_BYTES} bytes");
            emit(t, &error_json(None, lineno, &message));
            continue;
        }
        let Ok(text) = std::str::from_utf8(&buf) else {
            emit(t, &error_json(None, lineno, "line is not UTF-8"));
            continue;
        };
        if text.trim().is_empty() {
            continue;
        }
        match handle_line(t, text) {
            Ok(Outcome::Reply(v)) => emit(t, &v),
            Ok(Outcome::Written) => {}
            Ok(Outcome::Quit(v)) => {
                emit(t, &v);
                break;
            }
            Err(e) => emit(t, &error_json(e.command.as_deref(), lineno, &e.message)),
        }
    }
}

fn error_json(command: Option<&str>, line: u64, message: &str) -> Value {
    json!({"error": {"command": command, "line": line, "message": message}})
}

/// Parses and runs one command line.
fn handle_line(t: &Target, text: &str) -> Result<Outcome, CmdError> {
    let v: Value = serde_json::from_str(text).map_err(|e| CmdError {
        command: None,
        message: format!("not JSON: {e}"),
    })?;
    let shape = || CmdError {
        command: None,
        message: "expected one object with one key, the command, e.g. {\"counters\": {}}".into(),
    };
    let obj = v.as_object().ok_or_else(shape)?;
    if obj.len() != 1 {
        return Err(shape());
    }
    let Some((cmd, args)) = obj.iter().next() else {
        return Err(shape());
    };
    let empty = Map::new();
    let map = match args {
        Value::Object(m) => m,
        Value::Null => &empty,
        _ => {
            return Err(CmdError::new(
                cmd,
                "the arguments must be an object (or null)",
            ));
        }
    };
    let a = CmdArgs { cmd, map };
    let reply = match cmd.as_str() {
        "connect" => cmd_connect(t, &a)?,
        "post_recv" => cmd_post_recv(t, &a)?,
        "post_send" => {
            // The reply comes before the WR's `wc` line, as the protocol says: the completion
            // thread writes that line under the stdout lock, which this thread holds from
            // before the post until its reply is out (`emit` takes it again: it is
            // reentrant). Without it a fast completion's line once came first (a soak run
            // of tests/target.rs). Only here: `connect` takes the lock the completion
            // thread holds while it writes an event, and must not hold stdout.
            let out = std::io::stdout().lock();
            let reply = cmd_post_send(t, &a)?;
            emit(t, &reply);
            drop(out);
            return Ok(Outcome::Written);
        }
        "dump_mr" => cmd_dump_mr(t, &a)?,
        "write_mr" => cmd_write_mr(t, &a)?,
        "counters" => {
            a.only(&[])?;
            cmd_counters(t)
        }
        "query_qp" => {
            a.only(&[])?;
            cmd_query_qp(t)
        }
        "help" => {
            a.only(&[])?;
            json!({"help": {"commands": [
                "connect {dest_qpn, dest_gid, dest_psn?, timeout?, retry_cnt?, rnr_retry?, \
                 traffic_class?, hop_limit?}",
                "post_recv {count?, length?}",
                "post_send {opcode, index?, offset?, length?, remote_addr?, rkey?, imm_data?, \
                 wr_id?}",
                "dump_mr {index, offset?, length?}",
                "write_mr {index, offset?, hex | fill + length}",
                "counters {}",
                "query_qp {}",
                "help {}",
                "quit {}",
            ]}})
        }
        "quit" => {
            a.only(&[])?;
            return Ok(Outcome::Quit(json!({"quit": {"ok": true}})));
        }
        other => {
            return Err(CmdError::new(
                other,
                "unknown command (connect, post_recv, post_send, dump_mr, write_mr, counters, query_qp, help, quit)",
            ));
        }
    };
    Ok(Outcome::Reply(reply))
}
