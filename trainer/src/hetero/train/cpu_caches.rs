//! The node types' CPU caches that follow the sampled batch order
//! (`packer --cpu-cache-policy belady`, `window`, or `auto` choosing
//! either): each batch admits into them as it is assembled, the epoch's
//! end restores the packed rows, and a run resumed inside an epoch replays
//! the admissions of the batches it had done.

use std::time::Instant;

use offgnn_manifests::Split;
use offgnn_shared::io_engine::{AlignedBuf, IoEngine};

use super::TypedLayout;
use crate::error::{Error, Result};
use crate::pipeline;

impl TypedLayout {
    /// Reads back the rows each type's CPU cache changed, where it follows
    /// the batch order (Belady): evaluation and the next epoch start from
    /// the tier's own rows. Returns the bytes read.
    pub(crate) fn restore_cpu_caches(&self) -> Result<u64> {
        let mut bytes = 0;
        for cache in self
            .assembles
            .iter()
            .flatten()
            .filter_map(|a| a.cpu_rows.as_ref())
        {
            bytes += cache.restore()?;
        }
        Ok(bytes)
    }

    /// Whether some type's CPU cache follows the sampled batch order.
    pub(super) fn cpu_cache_follows(&self) -> bool {
        self.assembles
            .iter()
            .flatten()
            .any(|a| a.cpu_rows.as_ref().is_some_and(|c| c.follows))
    }

    /// A run resumed inside epoch `epoch` (sampled epoch `sampled`) finds
    /// each type's CPU cache that follows the batch order as the training
    /// batches `done` left it: their admissions again, from their reads
    /// again (one process trains such a layout, so the order is its own).
    /// The bytes are said, not counted in the epoch's.
    pub(super) fn rebuild_cpu_caches(
        &self,
        (epoch, sampled): (u32, u32),
        done: &[usize],
        engine: &IoEngine,
    ) -> Result<()> {
        let started = Instant::now();
        let mut bytes = 0u64;
        for (t, (part, assemble)) in self.reads.iter().zip(&self.assembles).enumerate() {
            let (Some((layout, src)), Some(cache)) =
                (part, assemble.as_ref().and_then(|a| a.cpu_rows.as_ref()))
            else {
                continue;
            };
            if !cache.follows {
                continue;
            }
            let refs = layout
                .manifest
                .schedule
                .get(&Split::Train)
                .and_then(|e| e.get(sampled as usize));
            let mut buf = AlignedBuf::new(0);
            for &k in done {
                let r = refs.and_then(|b| b.get(k)).copied().ok_or_else(|| {
                    Error::InvalidArgument(format!(
                        "node type '{}': train epoch {sampled} has no batch {k}",
                        self.schema.types[t].0
                    ))
                })?;
                let l = pipeline::load(layout, engine, src, r, buf, None)?;
                cache.admit(&l)?;
                bytes += l.disk_bytes;
                buf = l.buf;
            }
        }
        tracing::info!(
            "resumed inside epoch {epoch}: rebuilt the CPU caches, which follow the batch order, from the epoch's first {} batches ({} read again in {:.1} s)",
            done.len(),
            offgnn_shared::report::human_bytes(bytes),
            started.elapsed().as_secs_f64()
        );
        Ok(())
    }
}
