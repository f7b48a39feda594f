//! Fuzz target: structured CM MAD / API / clock sequences against two `CmEngine`s; see
//! `fuzz/src/cm.rs` (`check_cm`).
#![no_main]

#[path = "../src/cm.rs"]
mod cm;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    cm::check_cm(data);
});
