//! The tables in `spec/` against the tables in `crates/softroce/src/wire/`, row by row.
//!
//! - `spec/opcodes.toml` vs `OPCODE_TABLE`: every field of every row, no row missing on either
//!   side, header order and lengths vs `ExtHeaders::ORDER`, every other code point unknown.
//! - `spec/rnr_timer.toml` vs `RNR_TIMER_TABLE_US`.
//! - `spec/nak_codes.toml` vs `AethSyndrome::from_byte` / `to_byte` for every syndrome byte.
//!
//! A failure names the row and the column, so fixing either side is a one-line change.

use serde::Deserialize;
use softroce::wire::{
    AethSyndrome, ExtHeaders, NakCode, OPCODE_TABLE, OpKind, Opcode, OpcodeInfo, Position,
    RNR_TIMER_TABLE_US, Transport,
};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

fn load<T: for<'de> Deserialize<'de>>(name: &str) -> T {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("spec")
        .join(name);
    let text =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    toml::from_str(&text).unwrap_or_else(|e| panic!("parse {}: {e}", path.display()))
}

// ---------------------------------------------------------------------------------------------
// spec/opcodes.toml
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct OpcodesFile {
    header_order: Vec<HeaderLen>,
    reserved: Vec<Range>,
    opcode: Vec<OpcodeRow>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct HeaderLen {
    name: String,
    bytes: usize,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Range {
    first: u8,
    last: u8,
    #[allow(dead_code)] // documentation for the reader of the TOML
    why: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct OpcodeRow {
    code: u8,
    name: String,
    transport: String,
    kind: String,
    position: String,
    headers: Vec<String>,
    payload: bool,
    request: bool,
}

// Exhaustive matches, so a new enum variant cannot be added without naming it here.
fn transport_name(t: Transport) -> &'static str {
    match t {
        Transport::Rc => "RC",
        Transport::Uc => "UC",
        Transport::Rd => "RD",
        Transport::Ud => "UD",
        Transport::Cnp => "CNP",
        Transport::Xrc => "XRC",
    }
}

fn kind_name(k: OpKind) -> &'static str {
    match k {
        OpKind::Send => "send",
        OpKind::RdmaWrite => "rdma_write",
        OpKind::RdmaRead => "rdma_read",
        OpKind::ReadResponse => "read_response",
        OpKind::Acknowledge => "acknowledge",
        OpKind::AtomicAcknowledge => "atomic_acknowledge",
        OpKind::CompareSwap => "compare_swap",
        OpKind::FetchAdd => "fetch_add",
        OpKind::Flush => "flush",
        OpKind::AtomicWrite => "atomic_write",
        OpKind::Cnp => "cnp",
    }
}

fn position_name(p: Position) -> &'static str {
    match p {
        Position::First => "first",
        Position::Middle => "middle",
        Position::Last => "last",
        Position::Only => "only",
    }
}

/// The names of the headers in `h`, in wire order.
fn header_names(h: ExtHeaders) -> Vec<String> {
    ExtHeaders::ORDER
        .iter()
        .filter(|(flag, _, _)| h.contains(*flag))
        .map(|(_, _, name)| (*name).to_string())
        .collect()
}

fn check_row(rust: &OpcodeInfo, spec: &OpcodeRow) {
    let what = format!("opcode {:#04x} ({})", spec.code, spec.name);
    assert_eq!(rust.opcode, Opcode(spec.code), "{what}: code");
    assert_eq!(rust.name, spec.name, "{what}: name");
    assert_eq!(
        transport_name(rust.transport),
        spec.transport,
        "{what}: transport"
    );
    assert_eq!(kind_name(rust.kind), spec.kind, "{what}: kind");
    assert_eq!(
        position_name(rust.position),
        spec.position,
        "{what}: position"
    );
    assert_eq!(header_names(rust.headers), spec.headers, "{what}: headers");
    assert_eq!(rust.payload, spec.payload, "{what}: payload");
    assert_eq!(rust.is_request(), spec.request, "{what}: request");
    // The lookup by code point finds this very row, and Display prints its name.
    assert_eq!(Opcode(spec.code).info(), Some(rust), "{what}: info()");
    assert_eq!(Opcode(spec.code).to_string(), spec.name, "{what}: Display");
}

#[test]
fn opcode_rows_equal_the_rust_table() {
    let spec: OpcodesFile = load("opcodes.toml");
    let rust: BTreeMap<u8, &OpcodeInfo> = OPCODE_TABLE.iter().map(|r| (r.opcode.0, r)).collect();
    let toml: BTreeMap<u8, &OpcodeRow> = spec.opcode.iter().map(|r| (r.code, r)).collect();
    assert_eq!(
        rust.len(),
        OPCODE_TABLE.len(),
        "duplicate code in OPCODE_TABLE"
    );
    assert_eq!(
        toml.len(),
        spec.opcode.len(),
        "duplicate code in opcodes.toml"
    );

    let only_rust: Vec<_> = rust
        .iter()
        .filter(|(c, _)| !toml.contains_key(c))
        .map(|(_, r)| r.name)
        .collect();
    let only_toml: Vec<_> = toml
        .iter()
        .filter(|(c, _)| !rust.contains_key(c))
        .map(|(_, r)| r.name.as_str())
        .collect();
    assert!(
        only_rust.is_empty(),
        "rows missing from opcodes.toml: {only_rust:?}"
    );
    assert!(
        only_toml.is_empty(),
        "rows missing from OPCODE_TABLE: {only_toml:?}"
    );

    for (code, row) in &toml {
        check_row(rust[code], row);
    }
    // The TOML lists rows in code-point order, like OPCODE_TABLE.
    let codes: Vec<u8> = spec.opcode.iter().map(|r| r.code).collect();
    let mut sorted = codes.clone();
    sorted.sort_unstable();
    assert_eq!(codes, sorted, "opcodes.toml rows out of order");
}

#[test]
fn header_order_and_lengths_equal_ext_headers_order() {
    let spec: OpcodesFile = load("opcodes.toml");
    let rust: Vec<(String, usize)> = ExtHeaders::ORDER
        .iter()
        .map(|(_, len, name)| ((*name).to_string(), *len))
        .collect();
    let toml: Vec<(String, usize)> = spec
        .header_order
        .iter()
        .map(|h| (h.name.clone(), h.bytes))
        .collect();
    assert_eq!(rust, toml);
    // Every opcode's header length is BTH (12) plus the lengths the TOML gives.
    let len_of: BTreeMap<&str, usize> = spec
        .header_order
        .iter()
        .map(|h| (h.name.as_str(), h.bytes))
        .collect();
    for row in &spec.opcode {
        let want = 12
            + row
                .headers
                .iter()
                .map(|h| len_of[h.as_str()])
                .sum::<usize>();
        let info = Opcode(row.code).info().expect("known opcode");
        assert_eq!(info.headers.header_len(), want, "{}: header_len", row.name);
    }
}

#[test]
fn reserved_code_points_are_unknown() {
    let spec: OpcodesFile = load("opcodes.toml");
    let known: BTreeSet<u8> = spec.opcode.iter().map(|r| r.code).collect();
    let mut reserved = 0;
    for r in &spec.reserved {
        assert!(
            r.first <= r.last,
            "reserved range {:#04x}..={:#04x}",
            r.first,
            r.last
        );
        for code in r.first..=r.last {
            assert!(
                !known.contains(&code),
                "{code:#04x} is both reserved and an opcode row"
            );
            assert_eq!(
                Opcode(code).info(),
                None,
                "reserved {code:#04x} is known to Rust"
            );
            assert_eq!(Opcode(code).to_string(), format!("UNKNOWN_{code:#04x}"));
            reserved += 1;
        }
    }
    // 0x15, 0x18-0x1b, 0x1e-0x1f, RD 0x40-0x5f, XRC 0xa0-0xb7, 0xe0-0xff.
    assert_eq!(reserved, 1 + 4 + 2 + 32 + 24 + 32);
    // And beyond the listed ranges: a code point is known exactly when it has a TOML row.
    for code in 0..=u8::MAX {
        assert_eq!(
            Opcode(code).info().is_some(),
            known.contains(&code),
            "{code:#04x}: known to Rust iff it has a row in opcodes.toml"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// spec/rnr_timer.toml
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RnrFile {
    timer: Vec<RnrRow>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RnrRow {
    code: u8,
    microseconds: u32,
}

#[test]
fn rnr_timer_rows_equal_the_rust_table() {
    let spec: RnrFile = load("rnr_timer.toml");
    assert_eq!(spec.timer.len(), RNR_TIMER_TABLE_US.len(), "32 codes");
    for (i, row) in spec.timer.iter().enumerate() {
        assert_eq!(
            usize::from(row.code),
            i,
            "rnr_timer.toml row {i}: code out of order"
        );
        assert_eq!(
            RNR_TIMER_TABLE_US[i], row.microseconds,
            "RNR timer code {i}: Rust vs rnr_timer.toml"
        );
    }
    // Shape of the IBTA table: code 0 is the longest wait; 1..=31 strictly increase.
    assert!(RNR_TIMER_TABLE_US[1..].windows(2).all(|w| w[0] < w[1]));
    assert!(RNR_TIMER_TABLE_US[0] > RNR_TIMER_TABLE_US[31]);
}

// ---------------------------------------------------------------------------------------------
// spec/nak_codes.toml
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NakFile {
    class: Vec<ClassRow>,
    nak: Vec<NakRow>,
    reserved_nak: ReservedNak,
    /// Checked variant by variant by crates/softroce/src/transport/tests.rs, not here.
    #[allow(dead_code)]
    responder_error: Vec<toml::Value>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ClassRow {
    name: String,
    first: u8,
    last: u8,
    value: String,
    requester: String,
    retry_counter: Option<String>,
    wc_status_when_exhausted: Option<String>,
    #[allow(dead_code)]
    note: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NakRow {
    syndrome: u8,
    code: u8,
    name: String,
    rust: String,
    requester: String,
    wc_status: Option<String>,
    retry_counter: Option<String>,
    wc_status_when_exhausted: Option<String>,
    #[allow(dead_code)]
    note: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReservedNak {
    first: u8,
    last: u8,
    requester: String,
    wc_status: String,
}

fn nak_code_name(c: NakCode) -> String {
    match c {
        NakCode::PsnSeqErr => "PsnSeqErr".into(),
        NakCode::InvalidRequest => "InvalidRequest".into(),
        NakCode::RemoteAccessErr => "RemoteAccessErr".into(),
        NakCode::RemoteOpErr => "RemoteOpErr".into(),
        NakCode::InvalidRdRequest => "InvalidRdRequest".into(),
        NakCode::Reserved(c) => format!("Reserved({c})"),
    }
}

/// Statuses a NAK may complete a WQE with: names from `enum ibv_wc_status`.
const WC_STATUSES: [&str; 5] = [
    "IBV_WC_REM_INV_REQ_ERR",
    "IBV_WC_REM_ACCESS_ERR",
    "IBV_WC_REM_OP_ERR",
    "IBV_WC_RETRY_EXC_ERR",
    "IBV_WC_RNR_RETRY_EXC_ERR",
];

fn check_requester_columns(
    what: &str,
    requester: &str,
    wc_status: Option<&str>,
    retry_counter: Option<&str>,
    exhausted: Option<&str>,
) {
    match requester {
        "retry" => {
            assert_eq!(
                wc_status, None,
                "{what}: a retry NAK completes nothing at once"
            );
            assert!(
                matches!(retry_counter, Some("retry_cnt" | "rnr_retry")),
                "{what}: retry_counter {retry_counter:?}"
            );
            let ex = exhausted.unwrap_or_else(|| panic!("{what}: wc_status_when_exhausted"));
            assert!(WC_STATUSES.contains(&ex), "{what}: {ex}");
        }
        "complete_with_error" => {
            if let Some(s) = wc_status {
                assert!(WC_STATUSES[..3].contains(&s), "{what}: {s}");
            }
            assert_eq!(retry_counter, None, "{what}: retry_counter");
            assert_eq!(exhausted, None, "{what}: wc_status_when_exhausted");
        }
        "complete" | "per_nak_code" => {
            assert_eq!(wc_status, None, "{what}: wc_status");
            assert_eq!(retry_counter, None, "{what}: retry_counter");
        }
        other => panic!("{what}: unknown requester action {other:?}"),
    }
}

#[test]
fn syndrome_classes_decode_and_round_trip() {
    let spec: NakFile = load("nak_codes.toml");
    let mut covered = [false; 256];
    for class in &spec.class {
        check_requester_columns(
            &class.name,
            &class.requester,
            None,
            class.retry_counter.as_deref(),
            class.wc_status_when_exhausted.as_deref(),
        );
        for b in class.first..=class.last {
            let what = format!("syndrome {b:#04x} ({})", class.name);
            assert!(!covered[usize::from(b)], "{what}: in two classes");
            covered[usize::from(b)] = true;
            let syn = AethSyndrome::from_byte(b);
            // IBTA AETH: bits 6-5 give the type, bits 4-0 its value; bit 7 is reserved.
            match (class.value.as_str(), syn) {
                ("credit", AethSyndrome::Ack { credit }) => assert_eq!(credit, b & 0x1f, "{what}"),
                ("rnr_timer", AethSyndrome::RnrNak { timer }) => {
                    assert_eq!(timer, b & 0x1f, "{what}")
                }
                ("nak_code", AethSyndrome::Nak(code)) => {
                    assert_eq!(code.code(), b & 0x1f, "{what}")
                }
                ("none", AethSyndrome::Reserved(raw)) => assert_eq!(raw, b, "{what}"),
                (v, s) => panic!("{what}: TOML says {v}, Rust decodes {s:?}"),
            }
            assert_eq!(syn.to_byte(), b, "{what}: to_byte(from_byte(b)) != b");
        }
    }
    assert!(
        covered.iter().all(|c| *c),
        "classes do not cover 0x00..=0xff"
    );
    // The two encodings softroce sends most: rxe's unlimited-credit ACK and RNR NAK code 0.
    assert_eq!(AethSyndrome::ACK_UNLIMITED.to_byte(), 0x1f);
    assert_eq!(AethSyndrome::RnrNak { timer: 0 }.to_byte(), 0x20);
}

#[test]
fn nak_rows_decode_to_their_nak_codes() {
    let spec: NakFile = load("nak_codes.toml");
    assert_eq!(spec.nak.len(), 5, "NAK codes 0..=4");
    for (i, row) in spec.nak.iter().enumerate() {
        let what = format!("NAK {:#04x} ({})", row.syndrome, row.name);
        assert_eq!(usize::from(row.code), i, "{what}: codes in order");
        assert_eq!(
            row.syndrome,
            0x60 | row.code,
            "{what}: syndrome = 0x60 | code"
        );
        let syn = AethSyndrome::from_byte(row.syndrome);
        let AethSyndrome::Nak(code) = syn else {
            panic!("{what}: decodes to {syn:?}");
        };
        assert_eq!(nak_code_name(code), row.rust, "{what}: Rust variant");
        assert_eq!(code.code(), row.code, "{what}: NakCode::code");
        assert_eq!(
            NakCode::from_code(row.code),
            code,
            "{what}: NakCode::from_code"
        );
        assert_eq!(
            AethSyndrome::Nak(code).to_byte(),
            row.syndrome,
            "{what}: to_byte"
        );
        check_requester_columns(
            &what,
            &row.requester,
            row.wc_status.as_deref(),
            row.retry_counter.as_deref(),
            row.wc_status_when_exhausted.as_deref(),
        );
    }
    // The requester's mapping the brief fixes (IBTA ch. 9 NAK handling; rxe_comp.c check_ack).
    let status = |syn: u8| {
        spec.nak
            .iter()
            .find(|r| r.syndrome == syn)
            .and_then(|r| r.wc_status.clone())
    };
    assert_eq!(status(0x60), None);
    assert_eq!(status(0x61).as_deref(), Some("IBV_WC_REM_INV_REQ_ERR"));
    assert_eq!(status(0x62).as_deref(), Some("IBV_WC_REM_ACCESS_ERR"));
    assert_eq!(status(0x63).as_deref(), Some("IBV_WC_REM_OP_ERR"));

    let r = &spec.reserved_nak;
    assert_eq!((r.first, r.last), (0x65, 0x7f));
    check_requester_columns("reserved NAK", &r.requester, Some(&r.wc_status), None, None);
    for b in r.first..=r.last {
        assert_eq!(
            AethSyndrome::from_byte(b),
            AethSyndrome::Nak(NakCode::Reserved(b & 0x1f)),
            "{b:#04x}"
        );
    }
}
