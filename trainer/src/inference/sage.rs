//! GraphSAGE's layer on the host, for one group of destinations: the mean
//! of the in-neighbors' rows through lin_l, plus lin_r of the node's own
//! row (PyG's `SAGEConv`), pushed along the edges chunk by chunk or, where
//! one group holds every node, pulled by destination.

use offgnn_shared::prefetch;
use rayon::prelude::*;
use tch::{Device, Tensor};

use super::SCATTER_AHEAD;
use super::buffer_pool::Spares;
use super::edges::dst_parts;
use super::group::GroupJob;
use super::host_tensors::{Scratch, copy_into, tensor, to_vec};
use super::layers::Layer;
use super::pull::{project_all, pull_in_order};
use super::stream::StreamTimes;
use crate::error::Result;

/// A GraphSAGE layer for one group on the host: pulled where one group
/// holds every node and the rows go to the work directory (see
/// [`sage_pull`]), else pushed: each source chunk's rows are added into
/// the sums of their destinations in the group, along the group's edges
/// from that chunk.
pub(super) fn layer_group(
    job: &GroupJob,
    spares: &mut Spares,
    read: &mut u64,
    times: &mut StreamTimes,
) -> Result<(Vec<f32>, Vec<f32>)> {
    let Layer::Sage { lin_l_w, .. } = job.layer else {
        unreachable!("sage::layer_group takes a GraphSAGE layer");
    };
    let input = job.input;
    // mean(h) W = mean(h W): where the layer narrows, sources are
    // projected first and the sums are kept at the output's width.
    let project = lin_l_w.size()[0] <= input.width as i64;
    // One group, the rows going to the work directory: pulled, so
    // they go while the next are made (see `sage_pull`). The last
    // layer's narrow sums are pushed, hidden in the stream's reads.
    if project && job.range == (0, input.rows) && job.rows_to.is_some() {
        return sage_pull(job, spares, read, times);
    }
    push(job, project, spares, read, times)
}

/// The push (see [`layer_group`]), the sums at the output's width where
/// the layer is projected first (`project`), else at the input's.
fn push(
    job: &GroupJob,
    project: bool,
    spares: &mut Spares,
    read: &mut u64,
    times: &mut StreamTimes,
) -> Result<(Vec<f32>, Vec<f32>)> {
    let GroupJob {
        layer,
        input,
        engine,
        edges,
        range: (a, b),
        chunk_rows,
        device,
        activate,
        bar,
        ..
    } = *job;
    let Layer::Sage {
        lin_l_w,
        lin_l_b,
        lin_r_w,
    } = layer
    else {
        unreachable!("sage::push takes a GraphSAGE layer");
    };
    let g = (b - a) as usize;
    let parts = rayon::current_num_threads() * 4;
    // The group's own rows pass by in the stream: lin_r is applied
    // to them there, with no second read.
    let d_out = lin_r_w.size()[0] as usize;
    let mut h_dst = job.kept_rows(spares);
    let d = if project {
        lin_l_w.size()[0] as usize
    } else {
        input.width
    };
    // In-degrees first: projecting, lin_r(self) goes straight into
    // the sums, times the count they are divided by, where it would
    // take a buffer of the group's width of its own (fresh pages on
    // a first layer, gigabytes of them). A widening layer's sums are
    // at the input's width: its lin_r(self) is kept apart.
    let count = edges.in_degrees((a, b));
    let mut acc = spares.take(g * d);
    let mut own_buf = if project {
        Vec::new()
    } else {
        spares.take(g * d_out)
    };
    // Projecting, a chunk that holds group rows goes through lin_l
    // and lin_r in one matmul (its rows are packed once), into
    // one reused buffer (fresh pages cost more than the matmul on
    // narrow layers); the rest through lin_l alone.
    let (w_l, w_lr) = (
        lin_l_w.tr(),
        Tensor::cat(&[lin_l_w, lin_r_w], 0).tr().contiguous(),
    );
    let mut y = Scratch::default();
    *read += input.stream(engine, chunk_rows, 0, times, bar, |c, chunk| {
        let rows = chunk.values();
        let c0 = c as u64 * chunk_rows;
        let c1 = c0 + chunk.rows as u64;
        let (lo, hi) = (a.max(c0), b.min(c1));
        let (e0, e1) = (edges.offsets[c] as usize, edges.offsets[c + 1] as usize);
        if lo >= hi && e0 == e1 {
            return Ok(());
        }
        // The chunk's tensor as it is on the CPU (a view, no copy).
        // SAFETY: `x` is only read, by the products below, and dropped when
        // this closure returns.
        let x = unsafe { chunk.tensor() }.f_to_device(device)?;
        job.keep_own_rows(&mut h_dst, chunk, c0);
        // The rows the scatter adds up, `stride` apart.
        let (rows, stride) = if project {
            let own = lo < hi;
            let ys = y.product(&x, if own { &w_lr } else { &w_l })?;
            if own {
                add_own_rows(&mut acc, ys, count, (lo, hi), (a, c0), d_out);
                (ys, 2 * d_out)
            } else {
                (ys, d_out)
            }
        } else {
            if lo < hi {
                own_rows_apart(&x, lin_r_w, (lo, hi), (a, c0), &mut own_buf)?;
            }
            (rows, input.width)
        };
        if e0 < e1 {
            let pairs = (&edges.src[e0..e1], &edges.dst[e0..e1]);
            scatter(&mut acc, d, (a, b), pairs, (rows, stride, c0), parts);
        }
        Ok(())
    })?;
    let bias = to_vec(lin_l_b)?;
    if project {
        finish_projected(&mut acc, count, &bias, d_out, activate);
    } else {
        finish_widened(
            &mut acc,
            count,
            &own_buf,
            (&bias, lin_l_w),
            (g, device),
            activate,
        )?;
        spares.give(own_buf);
    }
    Ok((acc, h_dst))
}

/// Adds lin_r(self) of the destinations `[lo, hi)` times their in-degree
/// (`count`, the group's, from node `a` on) into their sums (`acc`): before
/// this chunk's edges reach them, these destinations' sums hold only the
/// earlier chunks'. `ys` is the chunk's product through lin_l and lin_r,
/// rows `2 d_out` wide from node `c0` on.
fn add_own_rows(
    acc: &mut [f32],
    ys: &[f32],
    count: &[f32],
    (lo, hi): (u64, u64),
    (a, c0): (u64, u64),
    d_out: usize,
) {
    let stride = 2 * d_out;
    let at = (lo - a) as usize * d_out;
    acc[at..at + (hi - lo) as usize * d_out]
        .par_chunks_mut(d_out)
        .zip(ys[(lo - c0) as usize * stride..].par_chunks(stride))
        .zip(&count[(lo - a) as usize..(hi - a) as usize])
        .for_each(|((o, y), &c)| {
            let c = c.max(1.0);
            for (o, y) in o.iter_mut().zip(&y[d_out..]) {
                *o += c * y;
            }
        });
}

/// A widening layer's lin_r(self) of the destinations `[lo, hi)`, rows of
/// the chunk `x` (from node `c0` on), into their rows of `own` (the
/// group's, from node `a` on), kept apart from the sums.
fn own_rows_apart(
    x: &Tensor,
    lin_r_w: &Tensor,
    (lo, hi): (u64, u64),
    (a, c0): (u64, u64),
    own: &mut [f32],
) -> Result<()> {
    let d_out = lin_r_w.size()[0] as usize;
    let rows = x
        .f_narrow(0, (lo - c0) as i64, (hi - lo) as i64)?
        .f_matmul(&lin_r_w.f_tr()?)?
        .f_to_device(Device::Cpu)?
        .f_contiguous()?;
    let at = (lo - a) as usize * d_out;
    let n = rows.numel();
    rows.f_copy_data(&mut own[at..at + n], n)?;
    Ok(())
}

/// Adds each edge's source row into its destination's sums: `acc` holds
/// the group `[a, b)`'s sums, `d` a row; a source's row is the first `d`
/// of its values in `rows`, a chunk's rows `stride` apart from node `c0`
/// on. The edges are sorted by destination: threads take `parts` disjoint
/// ranges of destinations, so no locks.
fn scatter(
    acc: &mut [f32],
    d: usize,
    (a, b): (u64, u64),
    (src, dst): (&[u32], &[u32]),
    (rows, stride, c0): (&[f32], usize, u64),
    parts: usize,
) {
    let split = dst_parts(dst, a, b, parts);
    // Each part owns the accumulator rows of its destinations.
    let mut slices = Vec::with_capacity(split.len());
    let mut rest = acc;
    let mut at = a;
    for &((lo, hi), edge_range) in &split {
        let (_, tail) = rest.split_at_mut(((lo - at) as usize) * d);
        let (mine, tail) = tail.split_at_mut(((hi - lo) as usize) * d);
        slices.push((lo, mine, edge_range));
        rest = tail;
        at = hi;
    }
    slices.into_par_iter().for_each(|(lo, mine, (x0, x1))| {
        for k in x0..x1 {
            // The rows are random in a large accumulator and a
            // chunk of several MB: their misses overlap when
            // asked for ahead.
            let ahead = k + SCATTER_AHEAD;
            if ahead < x1 {
                prefetch::lines(mine, (dst[ahead] as u64 - lo) as usize * d, d);
                prefetch::lines(rows, (src[ahead] as u64 - c0) as usize * stride, d);
            }
            let row = &rows[(src[k] as u64 - c0) as usize * stride..][..d];
            let out = &mut mine[(dst[k] as u64 - lo) as usize * d..][..d];
            for (o, v) in out.iter_mut().zip(row) {
                *o += v;
            }
        }
    });
}

/// A narrowing layer's output rows, in place in its sums (which hold
/// lin_r(self) times the count already): sum / count + lin_l's bias, then
/// ReLU with `activate`, row by row: no fresh gigabytes for the group's
/// tensors.
fn finish_projected(acc: &mut [f32], count: &[f32], bias: &[f32], d_out: usize, activate: bool) {
    acc.par_chunks_mut(d_out)
        .zip(count.par_iter())
        .for_each(|(row, &c)| {
            let c = c.max(1.0);
            for (v, b) in row.iter_mut().zip(bias) {
                *v = *v / c + b;
                if activate && *v < 0.0 {
                    *v = 0.0;
                }
            }
        });
}

/// A widening layer's output rows, into `acc` (its `g` rows of sums at the
/// input's width): the mean of the inputs through lin_l on `device`, then
/// plus its bias and lin_r(self) (`own`) in place, then ReLU with
/// `activate`.
fn finish_widened(
    acc: &mut Vec<f32>,
    count: &[f32],
    own: &[f32],
    (bias, lin_l_w): (&[f32], &Tensor),
    (g, device): (usize, Device),
    activate: bool,
) -> Result<()> {
    let d_out = bias.len();
    let mut mean = tensor(&acc[..], g as i64, device)?;
    let c = Tensor::from_slice(count)
        .f_to_device(device)?
        .f_clamp_min(1.0)?;
    let _ = mean.f_div_(&c.f_unsqueeze(1)?)?;
    copy_into(&mean.f_matmul(&lin_l_w.f_tr()?)?, acc)?;
    acc.par_chunks_mut(d_out)
        .zip(own.par_chunks(d_out))
        .for_each(|(row, own)| {
            for ((v, b), o) in row.iter_mut().zip(bias).zip(own) {
                *v = *v + b + o;
                if activate && *v < 0.0 {
                    *v = 0.0;
                }
            }
        });
    Ok(())
}

/// A hidden GraphSAGE layer for a group that holds every node, where the
/// layer does not widen, pulled: the stream projects each chunk through
/// lin_l and lin_r, keeping lin_l's rows for every node and putting
/// lin_r's in the output rows; then each destination, in parallel, sums
/// its sources' lin_l rows and its output row is finished there (mean(h) W
/// = mean(h W)), in node order, so the rows go to the disk while the next
/// are pulled. Pushed along the edges instead (as a smaller group must
/// be), every edge read and wrote its destination's sums, random in the
/// group's state, and the rows went out only after the last chunk: the
/// pull reads a source's row and writes nothing.
fn sage_pull(
    job: &GroupJob,
    spares: &mut Spares,
    read: &mut u64,
    times: &mut StreamTimes,
) -> Result<(Vec<f32>, Vec<f32>)> {
    let (input, edges) = (job.input, job.edges);
    let Layer::Sage {
        lin_l_w,
        lin_l_b,
        lin_r_w,
    } = job.layer
    else {
        unreachable!("sage_pull takes a GraphSAGE layer");
    };
    let d = lin_l_w.size()[0] as usize;
    let w_lr = Tensor::cat(&[lin_l_w, lin_r_w], 0).tr().contiguous();
    let (starts, src) = edges.by_destination((0, input.rows));
    let (y_all, mut rows_out, h_dst) =
        project_all(job, spares, read, times, &w_lr, (d, d), |_, _| ())?;
    let bias = to_vec(lin_l_b)?;
    let y = &y_all;
    let activate = job.activate;
    // A thread's scratch: a destination's sum.
    let scratch = || vec![0f32; d];
    let pull = |sum: &mut Vec<f32>, v: usize, out: &mut [f32]| {
        let (k0, k1) = (starts[v] as usize, starts[v + 1] as usize);
        sum.fill(0.0);
        for k in k0..k1 {
            // The rows of the edges a few on: their misses overlap (into
            // L2, as in the GAT pull).
            if let Some(&ahead) = src.get(k + SCATTER_AHEAD) {
                prefetch::lines_to_l2(y, ahead as usize * d, d);
            }
            for (s, v) in sum.iter_mut().zip(&y[src[k] as usize * d..][..d]) {
                *s += v;
            }
        }
        // lin_r(self) is in the row already; PyG's mean over no edges is 0.
        let c = ((k1 - k0) as f32).max(1.0);
        for ((o, s), b) in out.iter_mut().zip(sum.iter()).zip(&bias) {
            *o += s / c + b;
            if activate && *o < 0.0 {
                *o = 0.0;
            }
        }
    };
    pull_in_order(job, times, &mut rows_out, d, scratch, pull, |_| Ok(()))?;
    spares.give(y_all);
    Ok((rows_out, h_dst))
}
