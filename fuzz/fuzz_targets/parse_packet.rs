//! Fuzz target: arbitrary bytes through `RocePacket::parse` and `ip_udp::parse_frame`
//! (Ethernet and raw IP). Must never panic; see `softroce_fuzz::check_parse`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    softroce_fuzz::check_parse(data);
});
