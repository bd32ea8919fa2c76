//! How a typed layout's batches are fetched and made ready for the model:
//! on a loader thread that reads ahead (pipelined) or each in its turn.

use std::time::Instant;

use offgnn_manifests::Split;
use offgnn_shared::io_engine::AlignedBuf;
use tch::{Kind, Tensor};

use super::{Batch, Run, StageSeconds, TypedLayout, first_layer};
use crate::error::{Error, Result};
use crate::hetero::fetch::{Fetched, Reader};
use crate::pipeline;

impl TypedLayout {
    /// What the loader thread reads.
    fn reader(&self) -> Reader<'_> {
        Reader {
            manifest: &self.manifest,
            schema: &self.schema,
            reads: &self.reads,
            topology: &self.topology,
            stops_on_signal: true,
            historical: None,
        }
    }

    /// A fetched batch assembled: each type's rows, float32 on `device`
    /// (copied on every core if `run.parallel_assembly`), or where
    /// `run.first_means`, R-SAGE's first-layer means taken where the rows
    /// lie; and its read buffers, spare now.
    fn ready(&self, mut f: Fetched, run: Run<'_>) -> Result<(Batch, Vec<AlignedBuf>)> {
        let (x, first_means) = if run.first_means && first_layer::rows_are_float32(&self.assembles)
        {
            let means = first_layer::batch_means(&f, &self.assembles, &self.schema)?;
            (Vec::new(), Some(means))
        } else {
            (self.assemble(&f, run.parallel_assembly)?, None)
        };
        let spare = f.spare_buffers();
        let b = Batch {
            x,
            first_means,
            blocks: f.blocks,
            labels: f.labels,
            pairs: f.pairs,
            disk_bytes: f.disk_bytes,
            disk_rows_bytes: f.disk_rows_bytes,
            plan: f.plan.take(),
        };
        Ok((b, spare))
    }

    /// Each type's rows of batch `f` in one matrix.
    fn assemble(&self, f: &Fetched, parallel: bool) -> Result<Vec<Tensor>> {
        let assemble = if parallel {
            pipeline::assemble_parallel
        } else {
            pipeline::assemble
        };
        let mut x = Vec::with_capacity(f.loaded.len());
        for (t, loaded) in f.loaded.iter().enumerate() {
            match (loaded, &self.assembles[t]) {
                (Some(loaded), Some(src)) => {
                    let rows = assemble(src, loaded)?.0;
                    // A pruned batch's model reads its kept rows only.
                    x.push(match &f.plan {
                        Some(p) => p.select(t, &rows)?,
                        None => rows,
                    });
                }
                _ => x.push(Tensor::f_zeros(
                    [f.blocks.num_inputs[t], 0],
                    (Kind::Float, f.device),
                )?),
            }
        }
        Ok(x)
    }

    /// Runs `step` on the batches `order` names (positions into `split`'s
    /// sampled epoch `epoch`), in turn: pipelined, a loader thread fetches
    /// up to two batches ahead; else each is fetched when its turn comes.
    /// `step` sees each batch's index in `order`. With the historical
    /// cache (`run.historical`), the batches are training steps from the
    /// given one on, each pruned against the cache.
    pub(crate) fn for_each_batch(
        &self,
        (split, epoch, order): (Split, u32, &[usize]),
        run: Run<'_>,
        step: &mut dyn FnMut(usize, Batch) -> Result<()>,
    ) -> Result<StageSeconds> {
        // Training stops on a signal at a step or epoch boundary (every
        // rank of a group at the same one); anything else at its next
        // batch.
        let reader = Reader {
            stops_on_signal: run.ranks.group().is_none() && !run.stops_at_boundaries,
            historical: run.historical.map(|(h, _)| h),
            ..self.reader()
        };
        let step_of = |k: usize| run.historical.map(|(_, first)| first + k as u64);
        if let Some((h, first)) = run.historical {
            h.begin(first);
        }
        let result = self.fetch_and_step((split, epoch, order), run, reader, step_of, step);
        if let Some((h, _)) = run.historical {
            h.release();
        }
        result
    }

    /// [`TypedLayout::for_each_batch`] through `reader`, each batch of
    /// `order` as training step `step_of(its index)`.
    fn fetch_and_step(
        &self,
        (split, epoch, order): (Split, u32, &[usize]),
        run: Run<'_>,
        reader: Reader<'_>,
        step_of: impl Fn(usize) -> Option<u64> + Copy + Send,
        step: &mut dyn FnMut(usize, Batch) -> Result<()>,
    ) -> Result<StageSeconds> {
        let (engine, device) = (run.engine, run.device);
        let mut stages = StageSeconds::default();
        let since = |t: Instant| t.elapsed().as_secs_f64();
        let mut train = |k: usize, f: Fetched, stages: &mut StageSeconds| {
            let t = Instant::now();
            let (b, spare) = self.ready(f, run)?;
            stages.assemble += since(t);
            let t = Instant::now();
            step(k, b)?;
            stages.step += since(t);
            Ok::<_, Error>(spare)
        };
        if !run.pipelined {
            let mut bufs = Vec::new();
            for (k, &b) in order.iter().enumerate() {
                let t = Instant::now();
                let f = reader.fetch((split, epoch, b), step_of(k), engine, device, bufs)?;
                stages.fetch += since(t);
                stages.wait += since(t);
                bufs = train(k, f, &mut stages)?;
            }
            return Ok(stages);
        }
        std::thread::scope(|s| {
            let (tx, rx) = std::sync::mpsc::sync_channel::<Result<Fetched>>(2);
            // Read buffers back from assembled batches, for the next ones.
            let (give_back, spares) = std::sync::mpsc::sync_channel::<Vec<AlignedBuf>>(2);
            let loader = s.spawn(move || {
                let mut busy = 0.0;
                for (k, &b) in order.iter().enumerate() {
                    let t = Instant::now();
                    let bufs = spares.try_recv().unwrap_or_default();
                    let fetched = reader.fetch((split, epoch, b), step_of(k), engine, device, bufs);
                    busy += since(t);
                    let failed = fetched.is_err();
                    // The receiver is gone when the step failed: stop.
                    if tx.send(fetched).is_err() || failed {
                        break;
                    }
                }
                busy
            });
            let stepped = (0..order.len()).try_for_each(|k| {
                let t = Instant::now();
                let f = rx
                    .recv()
                    .map_err(|_| Error::Internal("the typed loader stopped early".into()))??;
                stages.wait += since(t);
                let spare = train(k, f, &mut stages)?;
                // A full queue (the loader ahead on fresh buffers) drops them.
                let _ = give_back.try_send(spare);
                Ok::<_, Error>(())
            });
            // A loader waiting on the cache for a step that failed is let go.
            if let (Err(_), Some((h, _))) = (&stepped, run.historical) {
                h.release();
            }
            drop(rx);
            stages.fetch = loader
                .join()
                .map_err(|_| Error::Internal("the typed loader panicked".into()))?;
            stepped?;
            Ok(stages)
        })
    }
}
