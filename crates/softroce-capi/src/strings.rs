//! The string and rate helpers of libibverbs (`ibv_wc_status_str`, `ibv_event_type_str`,
//! `ibv_node_type_str`, `ibv_port_state_str`, `ibv_rate_to_mult`, ...). Source: rdma-core
//! libibverbs/enum_strs.c and verbs.c. Also [`copy_str`], which fills the fixed-size
//! strings of the C structs.

use core::ffi::{CStr, c_char, c_int};
use softroce::verbs::WcStatus;
use std::ffi::CString;
use std::sync::OnceLock;

/// Copies `s` into the fixed C string `dst`, cut to leave room for the terminating NUL (the
/// rest of `dst` is left as it was, zeros in every caller).
pub(crate) fn copy_str(dst: &mut [c_char], s: &str) {
    let n = dst.len() - 1;
    for (d, b) in dst.iter_mut().zip(s.bytes().take(n)) {
        *d = b as c_char;
    }
}

pub(crate) extern "C" fn ibv_wc_status_str(status: c_int) -> *const c_char {
    static TEXT: OnceLock<Vec<CString>> = OnceLock::new();
    let text = TEXT.get_or_init(|| {
        WcStatus::ALL
            .iter()
            .map(|s| CString::new(s.to_string()).unwrap_or_default())
            .collect()
    });
    usize::try_from(status)
        .ok()
        .and_then(|i| text.get(i))
        .map_or(c"unknown".as_ptr(), |s| s.as_ptr())
}

fn lookup(table: &[&'static CStr], v: c_int) -> *const c_char {
    usize::try_from(v)
        .ok()
        .and_then(|i| table.get(i))
        .map_or(c"unknown".as_ptr(), |s| s.as_ptr())
}

pub(crate) extern "C" fn ibv_event_type_str(event: c_int) -> *const c_char {
    const T: [&CStr; 20] = [
        c"CQ error",
        c"local work queue catastrophic error",
        c"invalid request local work queue error",
        c"local access violation work queue error",
        c"communication established",
        c"send queue drained",
        c"path migrated",
        c"path migration request error",
        c"local catastrophic error",
        c"port active",
        c"port error",
        c"LID change",
        c"P_Key change",
        c"SM change",
        c"SRQ catastrophic error",
        c"SRQ limit reached",
        c"last WQE reached",
        c"client reregistration",
        c"GID table change",
        c"WQ fatal",
    ];
    lookup(&T, event)
}

pub(crate) extern "C" fn ibv_node_type_str(node_type: c_int) -> *const c_char {
    const T: [&CStr; 7] = [
        c"unknown",
        c"InfiniBand channel adapter",
        c"InfiniBand switch",
        c"InfiniBand router",
        c"iWARP NIC",
        c"usNIC",
        c"usNIC UDP",
    ];
    lookup(&T, node_type)
}

pub(crate) extern "C" fn ibv_port_state_str(state: c_int) -> *const c_char {
    const T: [&CStr; 6] = [
        c"PORT_NOP",
        c"PORT_DOWN",
        c"PORT_INIT",
        c"PORT_ARMED",
        c"PORT_ACTIVE",
        c"PORT_ACTIVE_DEFER",
    ];
    lookup(&T, state)
}

/// `enum ibv_rate` → (multiple of 2.5 Gb/s, Mb/s), by enum value. Source: verbs.c.
const RATES: [(c_int, c_int); 22] = [
    (0, 0),        // IBV_RATE_MAX
    (0, 0),        // (1 is unused)
    (1, 2500),     // IBV_RATE_2_5_GBPS
    (4, 10000),    // IBV_RATE_10_GBPS
    (12, 30000),   // IBV_RATE_30_GBPS
    (2, 5000),     // IBV_RATE_5_GBPS
    (8, 20000),    // IBV_RATE_20_GBPS
    (16, 40000),   // IBV_RATE_40_GBPS
    (24, 60000),   // IBV_RATE_60_GBPS
    (32, 80000),   // IBV_RATE_80_GBPS
    (48, 120000),  // IBV_RATE_120_GBPS
    (6, 14062),    // IBV_RATE_14_GBPS
    (22, 56250),   // IBV_RATE_56_GBPS
    (44, 112500),  // IBV_RATE_112_GBPS
    (66, 168750),  // IBV_RATE_168_GBPS
    (10, 25781),   // IBV_RATE_25_GBPS
    (40, 103125),  // IBV_RATE_100_GBPS
    (80, 206250),  // IBV_RATE_200_GBPS
    (120, 309375), // IBV_RATE_300_GBPS
    (11, 28125),   // IBV_RATE_28_GBPS
    (20, 50000),   // IBV_RATE_50_GBPS
    (160, 400000), // IBV_RATE_400_GBPS
];

fn rate(v: c_int) -> (c_int, c_int) {
    usize::try_from(v)
        .ok()
        .and_then(|i| RATES.get(i).copied())
        .unwrap_or((-1, -1))
}

fn rate_from(f: impl Fn(&(c_int, c_int)) -> c_int, x: c_int) -> c_int {
    RATES
        .iter()
        .position(|r| f(r) == x && x > 0)
        .map_or(0, |i| i as c_int)
}

pub(crate) extern "C" fn ibv_rate_to_mult(r: c_int) -> c_int {
    rate(r).0
}

pub(crate) extern "C" fn mult_to_ibv_rate(mult: c_int) -> c_int {
    rate_from(|r| r.0, mult)
}

pub(crate) extern "C" fn ibv_rate_to_mbps(r: c_int) -> c_int {
    rate(r).1
}

pub(crate) extern "C" fn mbps_to_ibv_rate(mbps: c_int) -> c_int {
    rate_from(|r| r.1, mbps)
}
