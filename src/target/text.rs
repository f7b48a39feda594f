//! The text `softroce target` reads and writes besides JSON structure: numbers (decimal or
//! `0x` hex), access flag lists, and bytes as hex.

use serde_json::Value;
use softroce::verbs::AccessFlags;

pub(super) fn parse_psn(s: &str) -> Result<u32, String> {
    let v = parse_u64_text(s).ok_or_else(|| format!("{s:?} is not a number"))?;
    u32::try_from(v)
        .ok()
        .filter(|v| *v <= 0x00ff_ffff)
        .ok_or_else(|| format!("{s} does not fit in 24 bits"))
}

/// Decimal, or hex with a `0x` prefix.
pub(super) fn parse_u64_text(s: &str) -> Option<u64> {
    let s = s.trim();
    match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(h) => u64::from_str_radix(h, 16).ok(),
        None => s.parse().ok(),
    }
}

/// Access flag names, as `ibv_access_flags` without the prefix.
const ACCESS_NAMES: [(AccessFlags, &str); 4] = [
    (AccessFlags::LOCAL_WRITE, "local_write"),
    (AccessFlags::REMOTE_WRITE, "remote_write"),
    (AccessFlags::REMOTE_READ, "remote_read"),
    (AccessFlags::REMOTE_ATOMIC, "remote_atomic"),
];

pub(super) fn parse_access(list: &str) -> Result<AccessFlags, String> {
    let mut f = AccessFlags::empty();
    for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        let low = name.to_ascii_lowercase();
        let low = low.strip_prefix("ibv_access_").unwrap_or(&low);
        if low == "none" {
            continue;
        }
        let (bit, _) = ACCESS_NAMES
            .iter()
            .find(|(_, n)| *n == low)
            .ok_or_else(|| {
                format!(
                    "unknown access flag {name:?} (use none, local_write, remote_write, remote_read, remote_atomic)"
                )
            })?;
        f |= *bit;
    }
    Ok(f)
}

pub(super) fn access_json(f: AccessFlags) -> Value {
    ACCESS_NAMES
        .iter()
        .filter(|(b, _)| f.contains(*b))
        .map(|(_, n)| Value::from(*n))
        .collect()
}

pub(super) fn hex(b: &[u8]) -> String {
    let mut s = String::with_capacity(b.len() * 2);
    for x in b {
        s.push_str(&format!("{x:02x}"));
    }
    s
}

pub(super) fn unhex(s: &str) -> Option<Vec<u8>> {
    let s: String = s.chars().filter(|c| !c.is_whitespace()).collect();
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| s.get(i..i + 2).and_then(|h| u8::from_str_radix(h, 16).ok()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn access_lists_parse() {
        assert_eq!(
            parse_access("local_write, REMOTE_WRITE,ibv_access_remote_read").map(|f| f.0),
            Ok(7)
        );
        assert_eq!(parse_access("none").map(|f| f.0), Ok(0));
        assert!(parse_access("remote_wirte").is_err());
    }

    #[test]
    fn numbers_parse_as_decimal_or_hex() {
        assert_eq!(parse_u64_text("0x10"), Some(16));
        assert_eq!(parse_u64_text("17"), Some(17));
        assert_eq!(parse_u64_text("x"), None);
        assert_eq!(
            parse_psn("0x1000000"),
            Err("0x1000000 does not fit in 24 bits".into())
        );
    }

    #[test]
    fn hex_round_trips() {
        assert_eq!(hex(&[0, 0xab, 0x10]), "00ab10");
        assert_eq!(unhex("00ab10"), Some(vec![0, 0xab, 0x10]));
        assert_eq!(unhex("0a b"), None);
        assert_eq!(unhex("zz"), None);
    }
}
