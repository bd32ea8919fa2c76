//! The pull, where one group holds every node: the layer's input streamed
//! once and projected for every node, then each destination's output row
//! made from its sources' projections, in parallel and in node order, so
//! that a hidden layer's rows go to the disk while the next are pulled.
//! Reading a source's row and writing nothing, it avoids the push's random
//! read-modify-writes over the group's state.

use std::time::Instant;

use rayon::prelude::*;
use tch::Tensor;

use super::buffer_pool::Spares;
use super::group::GroupJob;
use super::host_tensors::{Scratch, product_into};
use super::stream::StreamTimes;
use crate::error::Result;

/// Parts each row of `y` between a row of `left` (its first `lw` values)
/// and one of `right` (the `rw` after), on the thread pool.
fn part_rows(y: &[f32], (left, lw): (&mut [f32], usize), (right, rw): (&mut [f32], usize)) {
    left.par_chunks_mut(lw)
        .zip(right.par_chunks_mut(rw))
        .zip(y.par_chunks(lw + rw))
        .for_each(|((l, r), y)| {
            l.copy_from_slice(&y[..lw]);
            r.copy_from_slice(&y[lw..]);
        });
}

/// A pull's first half, where one group holds every node: streams the
/// layer's input once, each chunk through `w`: of each product row, the
/// first `kw` values go to the kept projection of every node (compact, for
/// the pull's random reads), the `ow` after into the output rows (one
/// matmul a part, or for a wide input one matmul whose rows are parted);
/// `each` then sees the chunk's first node and its kept rows. Returns the
/// kept rows, the output rows and the group's own input rows (see
/// [`GroupJob::kept_rows`]).
pub(super) fn project_all(
    job: &GroupJob,
    spares: &mut Spares,
    read: &mut u64,
    times: &mut StreamTimes,
    w: &Tensor,
    (kw, ow): (usize, usize),
    mut each: impl FnMut(usize, &[f32]),
) -> Result<(Vec<f32>, Vec<f32>, Vec<f32>)> {
    let (input, chunk_rows) = (job.input, job.chunk_rows);
    let n = input.rows as usize;
    let mut ys = Scratch::default();
    // Where the input is no wider than the product, a matmul a part, each
    // straight into its rows: parting one product's rows copies more
    // bytes than packing the input twice reads. A wide first layer keeps
    // one matmul, its input's rows packed once.
    let apart = (input.width <= kw + ow).then(|| {
        (
            w.narrow(1, 0, kw as i64).contiguous(),
            w.narrow(1, kw as i64, ow as i64).contiguous(),
        )
    });
    let t = Instant::now();
    let mut kept = spares.take_overwritten(n * kw);
    let mut h_dst = job.kept_rows(spares);
    let mut rows_out = spares.take_overwritten(n * ow);
    tracing::debug!("buffers taken in {:.2} s", t.elapsed().as_secs_f64());
    let t = Instant::now();
    *read += input.stream(job.engine, chunk_rows, 0, times, job.bar, |c, chunk| {
        let (c0, rows) = (c * chunk_rows as usize, chunk.rows);
        // SAFETY: `x` (on the CPU, the view itself) is only read, by the
        // products below, and dropped when this closure returns.
        let x = unsafe { chunk.tensor() }.f_to_device(job.device)?;
        let k = &mut kept[c0 * kw..(c0 + rows) * kw];
        let o = &mut rows_out[c0 * ow..(c0 + rows) * ow];
        match &apart {
            Some((w_k, w_o)) => {
                product_into(&x, w_k, k)?;
                product_into(&x, w_o, o)?;
            }
            None => part_rows(ys.product(&x, w)?, (k, kw), (o, ow)),
        }
        each(c0, k);
        job.keep_own_rows(&mut h_dst, chunk, c0 as u64);
        Ok(())
    })?;
    tracing::debug!("projected in {:.2} s", t.elapsed().as_secs_f64());
    Ok((kept, rows_out, h_dst))
}

/// A pull's second half, where one group holds every node: each node's
/// output row (`out_w` values of `rows`) is made by `pull` (with a thread's
/// scratch from `scratch`), in parallel, a piece of whole chunks' rows at
/// a time in node order; each piece is then finished by `then` (the
/// activation) and handed on to the job's hidden output, so the disk
/// writes it while the next is pulled. Its time counts in `times` as the
/// scatter's.
pub(super) fn pull_in_order<S>(
    job: &GroupJob,
    times: &mut StreamTimes,
    rows: &mut [f32],
    out_w: usize,
    scratch: impl Fn() -> S + Sync + Send,
    pull: impl Fn(&mut S, usize, &mut [f32]) + Sync + Send,
    then: impl Fn(&mut [f32]) -> Result<()>,
) -> Result<()> {
    let (n, t) = (rows.len() / out_w, Instant::now());
    // The destinations done: the stream's bar has filled by now, and this
    // part is as long as the edges are many.
    let pulled = offgnn_shared::progress::bar_if(
        !job.bar.is_hidden(),
        n as u64,
        &format!("{}, by destination", job.bar.prefix()),
        "nodes",
    );
    // Blocks of destinations a task, and whole chunks' rows a piece, at
    // least four tasks a thread: the threads meet at the end of each piece
    // (its activation, its hand-off to the writer), and where many output
    // parts encoded at once left chunks of 3072 rows, a chunk was 12 tasks
    // for 16 threads.
    const BLOCK: usize = 256;
    let chunk_rows = job.chunk_rows as usize;
    let piece_rows = (rayon::current_num_threads() * 4 * BLOCK)
        .div_ceil(chunk_rows)
        .max(1)
        * chunk_rows;
    for (p, piece) in rows.chunks_mut(piece_rows * out_w).enumerate() {
        let v0 = p * piece_rows;
        piece
            .par_chunks_mut(BLOCK * out_w)
            .enumerate()
            .for_each_init(&scratch, |s, (blk, out_rows)| {
                for (i, out) in out_rows.chunks_exact_mut(out_w).enumerate() {
                    pull(s, v0 + blk * BLOCK + i, out);
                }
                pulled.inc((out_rows.len() / out_w) as u64);
            });
        then(piece)?;
        if let Some(writer) = job.rows_to {
            writer
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .put(piece)?;
        }
        offgnn_shared::signals::check()?;
    }
    pulled.finish_and_clear();
    times.scatter += t.elapsed().as_secs_f64();
    tracing::debug!("pulled in {:.2} s", t.elapsed().as_secs_f64());
    Ok(())
}
