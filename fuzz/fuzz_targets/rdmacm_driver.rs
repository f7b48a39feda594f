//! Fuzz target: librdmacm.so.1's CM driver and rdma_* calls on the in-memory bench, against a
//! peer CM engine and built MADs; see `fuzz/src/rdmacm.rs` (`check_rdmacm`).
#![no_main]

#[path = "../src/rdmacm.rs"]
mod rdmacm;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    rdmacm::check_rdmacm(data);
});
