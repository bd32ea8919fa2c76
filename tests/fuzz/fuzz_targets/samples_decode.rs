//! A samples file (Parquet) as the packer and trainer decode it after its
//! checksum matched: any bytes give checked batches or an error, never a
//! panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(
    init: {
        // libfuzzer-sys aborts in its panic hook; `decode_file` turns a panic
        // inside the parquet crate into an error, so take the default hook
        // back. A panic in our own code still reaches libfuzzer-sys, which
        // aborts on it.
        let _ = std::panic::take_hook();
    },
    |data: &[u8]| {
        let _ = offgnn_shared::samples::decode_file("fuzz", bytes::Bytes::copy_from_slice(data));
    }
);
