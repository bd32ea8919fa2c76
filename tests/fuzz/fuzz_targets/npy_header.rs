//! The `.npy` header of a dataset's arrays: any bytes give a header whose
//! sizes do not overflow, or an error, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(h) = offgnn_shared::npy::parse_header(data) {
        let _ = h.data_bytes();
        let _ = h.len();
    }
});
