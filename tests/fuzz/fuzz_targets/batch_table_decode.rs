//! One record of a packed layout's batch address table: any bytes give a
//! table whose positions are all in range, or an error, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = offgnn_shared::address_table::decode("fuzz", data);
});
