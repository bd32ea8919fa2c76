//! The CPU cache tier's rows in host memory: the same rows throughout
//! (DiskGNN's static tier), or rows that follow the batch order (Ginex's
//! Belady policy or GIDS's window, which the packer computed): after each
//! training batch is assembled, the rows its table admits are copied from
//! what it read into their slots, and at the epoch's end the slots that
//! changed are read back from the tier's object, so evaluation and the
//! next epoch find the static rows the packer planned them with.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};

use offgnn_shared::address_table::page_runs;

use super::feature_loading::Loaded;
use crate::error::{Error, Result};

/// Restores read whole pages of the tier's object, as the disk does.
const PAGE: u64 = 4096;

/// The CPU cache's rows, and the slots changed since the epoch began.
pub struct CpuCache {
    /// The tier's object: the rows every epoch starts from.
    path: PathBuf,
    row_bytes: usize,
    /// Whether training batches admit rows (Belady, window) or not (static).
    pub follows: bool,
    state: Mutex<State>,
}

struct State {
    rows: Vec<u8>,
    /// Slots written since the last restore (unsorted, repeats allowed).
    changed: Vec<u32>,
}

/// The rows of a cache, held for a batch's gather.
pub struct Rows<'a>(MutexGuard<'a, State>);

impl Rows<'_> {
    pub fn as_slice(&self) -> &[u8] {
        &self.0.rows
    }
}

impl CpuCache {
    /// The tier's `rows`, read from its object at `path`.
    pub fn new(path: PathBuf, rows: Vec<u8>, row_bytes: usize, follows: bool) -> CpuCache {
        CpuCache {
            path,
            row_bytes,
            follows,
            state: Mutex::new(State {
                rows,
                changed: Vec::new(),
            }),
        }
    }

    /// The rows as they are now.
    pub fn rows(&self) -> Rows<'_> {
        Rows(self.state.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Rows in the tier.
    pub fn num_rows(&self) -> u64 {
        (self.rows().as_slice().len() / self.row_bytes.max(1)) as u64
    }

    /// Copies the rows a training batch admits from what it read from disk
    /// into their slots (its addresses were checked against the tier's
    /// rows and the bytes read before assembly).
    pub fn admit(&self, l: &Loaded) -> Result<()> {
        let t = &l.table;
        if !self.follows || t.admit_pos.is_empty() {
            return Ok(());
        }
        let rb = self.row_bytes;
        let data = l.buf.as_slice();
        let mut s = self.rows();
        let state = &mut *s.0;
        // The table's admitted positions ascend (its decoder checks it).
        let mut admitted = 0;
        for &(p, from) in &l.disk {
            if let Ok(i) = t.admit_pos.binary_search(&p) {
                let slot = t.admit_slot[i];
                let to = slot as usize * rb;
                state.rows[to..to + rb].copy_from_slice(&data[from..from + rb]);
                state.changed.push(slot);
                admitted += 1;
            }
        }
        if admitted != t.admit_pos.len() {
            return Err(Error::Layout(format!(
                "batch {} admits {} rows into the CPU cache, but reads {admitted} of them from disk",
                t.index,
                t.admit_pos.len()
            )));
        }
        Ok(())
    }

    /// Reads the slots changed since the last restore back from the
    /// tier's object: the pages that hold them, consecutive pages in one
    /// read (the rows of those pages that did not change read back as
    /// they are). Returns the bytes read.
    pub fn restore(&self) -> Result<u64> {
        let mut s = self.rows();
        let state = &mut *s.0;
        if state.changed.is_empty() {
            return Ok(0);
        }
        let mut slots = std::mem::take(&mut state.changed);
        slots.sort_unstable();
        slots.dedup();
        let rb = self.row_bytes as u64;
        let mut pages: Vec<u64> = slots
            .into_iter()
            .map(u64::from)
            .flat_map(|s| s * rb / PAGE..=((s + 1) * rb - 1) / PAGE)
            .collect();
        pages.dedup();
        let f = File::open(&self.path).map_err(|e| Error::io(self.path.display(), e))?;
        let len = state.rows.len() as u64;
        let mut read = 0u64;
        for (first, count) in page_runs(&pages) {
            let (from, to) = (first * PAGE, ((first + count) * PAGE).min(len));
            f.read_exact_at(&mut state.rows[from as usize..to as usize], from)
                .map_err(|e| Error::io(self.path.display(), e))?;
            read += to - from;
        }
        Ok(read)
    }
}
