//! Fuzz target: arbitrary datagrams into a `Device` with an SRQ, memory windows and a
//! multicast attachment; see `fuzz/src/device.rs` (`check_device`).
#![no_main]

#[path = "../src/device.rs"]
mod device;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    device::check_device(data);
});
