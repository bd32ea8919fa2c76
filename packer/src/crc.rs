//! Checksums of objects written out of order. Batched packing fills each
//! object with runs at scattered offsets (one per partition and
//! destination), so the CRC32C of each run is taken as it is written and the
//! object's CRC is combined at the end in offset order, gaps (alignment
//! padding, zeros) included — no second read of the output.

use std::sync::Mutex;

/// The runs written into one object.
#[derive(Default)]
pub struct RunCrcs {
    runs: Mutex<Vec<(u64, u64, u32)>>,
}

impl RunCrcs {
    /// Records a run of `data` written at `offset`.
    pub fn record(&self, offset: u64, data: &[u8]) {
        let crc = crc32c::crc32c(data);
        self.runs
            .lock()
            .expect("crc list")
            .push((offset, data.len() as u64, crc));
    }

    /// The CRC32C of an object of `size` bytes made of the recorded runs and
    /// zeros elsewhere. Overlapping runs are a bug and are refused.
    pub fn object_crc(&self, size: u64) -> Result<u32, String> {
        let mut runs = self.runs.lock().expect("crc list").clone();
        runs.sort_unstable();
        let mut crc = 0u32;
        let mut at = 0u64;
        for (offset, len, run_crc) in runs {
            if offset < at {
                return Err(format!("runs overlap at byte {offset}"));
            }
            crc = append_zeros(crc, offset - at);
            crc = crc32c::crc32c_combine(crc, run_crc, len as usize);
            at = offset + len;
        }
        if at > size {
            return Err(format!("runs end at {at}, past the object's {size} bytes"));
        }
        Ok(append_zeros(crc, size - at))
    }
}

fn append_zeros(mut crc: u32, mut len: u64) -> u32 {
    static ZEROS: [u8; 65536] = [0; 65536];
    while len > 0 {
        let n = len.min(ZEROS.len() as u64) as usize;
        crc = crc32c::crc32c_append(crc, &ZEROS[..n]);
        len -= n as u64;
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn combined_crc_equals_the_crc_of_the_whole() {
        let mut whole = vec![0u8; 20_000];
        let runs = RunCrcs::default();
        // Written out of order, with zero gaps between and after.
        for (offset, len, fill) in [(9000u64, 3000usize, 7u8), (100, 4096, 3), (15_000, 10, 9)] {
            let data = vec![fill; len];
            whole[offset as usize..offset as usize + len].copy_from_slice(&data);
            runs.record(offset, &data);
        }
        assert_eq!(runs.object_crc(20_000).unwrap(), crc32c::crc32c(&whole));
    }

    #[test]
    fn refuses_overlaps() {
        let runs = RunCrcs::default();
        runs.record(0, &[1; 10]);
        runs.record(5, &[1; 10]);
        assert!(runs.object_crc(100).is_err());
    }
}
