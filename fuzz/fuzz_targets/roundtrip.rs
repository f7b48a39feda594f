//! Fuzz target: whatever parses re-emits to bytes that parse to the same repr and payload;
//! see `softroce_fuzz::check_roundtrip`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    softroce_fuzz::check_roundtrip(data);
});
