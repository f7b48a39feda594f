//! The arguments of one JSON command: typed getters that name the field in their errors.

use super::text::parse_u64_text;
use serde_json::{Map, Value};

/// A command error: the command's name (if it got that far) and what was wrong.
pub(super) struct CmdError {
    pub(super) command: Option<String>,
    pub(super) message: String,
}

impl CmdError {
    pub(super) fn new(command: &str, message: impl Into<String>) -> CmdError {
        CmdError {
            command: Some(command.to_string()),
            message: message.into(),
        }
    }
}

/// The arguments of one command, with typed getters that name the field in their errors.
pub(super) struct CmdArgs<'a> {
    pub(super) cmd: &'a str,
    pub(super) map: &'a Map<String, Value>,
}

impl CmdArgs<'_> {
    pub(super) fn err(&self, msg: impl Into<String>) -> CmdError {
        CmdError::new(self.cmd, msg)
    }

    /// Refuses fields the command does not know (a typo should not be silently ignored).
    pub(super) fn only(&self, allowed: &[&str]) -> Result<(), CmdError> {
        match self.map.keys().find(|k| !allowed.contains(&k.as_str())) {
            None => Ok(()),
            Some(k) if allowed.is_empty() => {
                Err(self.err(format!("{} takes no fields (got {k:?})", self.cmd)))
            }
            Some(k) => Err(self.err(format!(
                "unknown field {k:?} (fields: {})",
                allowed.join(", ")
            ))),
        }
    }

    /// An unsigned integer field: a JSON integer or a `"0x…"` / decimal string.
    pub(super) fn uint(&self, name: &str, max: u64) -> Result<Option<u64>, CmdError> {
        let Some(v) = self.map.get(name) else {
            return Ok(None);
        };
        let n = match v {
            Value::Number(n) => n.as_u64(),
            Value::String(s) => parse_u64_text(s),
            _ => None,
        }
        .ok_or_else(|| self.err(format!("{name}: expected an unsigned integer, got {v}")))?;
        if n > max {
            return Err(self.err(format!("{name}: {n} is larger than {max}")));
        }
        Ok(Some(n))
    }

    pub(super) fn need_uint(&self, name: &str, max: u64) -> Result<u64, CmdError> {
        self.uint(name, max)?
            .ok_or_else(|| self.err(format!("missing field {name:?}")))
    }

    pub(super) fn string(&self, name: &str) -> Result<Option<&str>, CmdError> {
        match self.map.get(name) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(v) => Err(self.err(format!("{name}: expected a string, got {v}"))),
        }
    }
}
