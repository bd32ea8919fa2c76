//! The packed layout's manifest, as the trainer reads it from the store:
//! any bytes give a manifest that passed validation or an error, never a
//! panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(m) = offgnn_manifests::Manifest::parse("fuzz", data) {
        // A manifest that parsed must validate again, and every object it
        // references must resolve.
        assert!(m.validate().is_ok());
        for o in &m.objects {
            assert!(m.object(&o.name).is_some());
        }
    }
});
