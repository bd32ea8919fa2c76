//! A graph layer's aggregation with torch's own ops on the run's device
//! (`--aggregate device`, the default on CUDA): the group's accumulators
//! live there, each source chunk goes up once, and its rows are added along
//! the group's in-edges with `index_add_` (GraphSAGE's sums) or, for GAT's
//! online softmax, `scatter_reduce_(amax)` for the running maxima and
//! `index_add_` for the rescaled sums. On the host the scatter is random
//! read-modify-write over gigabytes of accumulators, bound by host memory;
//! on a GPU it is a few kernels per chunk. The order of the stream, the
//! group's own rows and the edges that wait for their destination are as
//! in the host path ([`super::group::graph_layer_group`]); the results are the
//! same within float rounding (the sums' order differs), which the tests
//! check on the CPU device against the in-memory forward pass.

use tch::{Device, Kind, Tensor};

use super::buffer_pool::Spares;
use super::edges::GroupEdges;
use super::gat::Span;
use super::group::GroupJob;
use super::host_tensors::on_values;
use super::layers::Layer;
use super::stream::StreamTimes;
use crate::error::Result;

/// Device bytes of an edge batch's temporaries at most (about): a chunk's
/// edges go through the ops in batches of this size, so that a chunk with
/// many in-edges does not need its rows gathered all at once.
pub(super) const EDGE_BATCH_BYTES: u64 = 256 << 20;

/// The device floats per destination of a group (its state, which the
/// layer finishes in place, and the output where it is a new tensor), and
/// per source row of a chunk (the chunk on the device and what it is
/// projected to).
pub(super) fn device_floats(layer: &Layer, d_in: u64, d_out: u64) -> (u64, u64) {
    match layer {
        Layer::Sage { .. } => {
            let acc = d_in.min(d_out);
            // acc (the means, in place), own, a count, and the mean's
            // projection where the layer widens; a chunk's rows projected
            // through lin_l and lin_r where it narrows, else its group rows
            // through lin_r.
            let per_src = if d_out <= d_in { 2 * d_out } else { d_out };
            (acc + 2 * d_out + 1, d_in + per_src)
        }
        Layer::Gat {
            heads,
            per_head,
            res_w,
            ..
        } => {
            let (h, c) = (*heads as u64, *per_head as u64);
            let res = res_w.size()[0] as u64;
            // acc (normalized in place), m, s, er, the residual, the heads'
            // mean where they are averaged, and the span's projections and
            // scores, kept for the edges that wait (a group's rows, a chunk
            // more at most); a chunk's rows, projections and scores.
            (2 * h * c + 4 * h + 2 * res, d_in + 2 * (h * c + h))
        }
    }
}

/// The host floats per destination of a group when its state is on a CUDA
/// device: GraphSAGE's count and, as the host path counts them, three
/// output widths (the rows copied back, a buffer of an earlier layer the
/// pool may hold beside them, see [`super::Spares`], and the output as it
/// is written).
pub(super) fn host_floats(d_out: u64) -> u64 {
    3 * d_out + 1
}

/// Edges a batch takes, for `floats` device floats of temporaries per edge.
fn edges_per_batch(floats: u64) -> usize {
    (EDGE_BATCH_BYTES / (4 * floats.max(1))).max(1024) as usize
}

/// A batch's edges as row indices (int64) on the device: sources into a
/// block that starts at node `base`, destinations into the group that
/// starts at node `a`, and (where asked) the distinct destinations, in any
/// order: a chunk of several edge buckets has its edges sorted by
/// destination only bucket by bucket. They go up as one tensor (one copy,
/// not three, each of which waits for the device); the host buffers are
/// reused from batch to batch.
#[derive(Default)]
struct Indices {
    all: Vec<i64>,
    /// Per destination of the group, the last batch that listed it.
    listed: Vec<u32>,
    batch: u32,
}

struct Batch {
    src: Tensor,
    dst: Tensor,
    touched: Tensor,
}

impl Indices {
    /// The edges `src[k] -> dst[k]`, without those from a node to itself if
    /// `skip_self` (PyG's GAT replaces them by the one self-loop), and their
    /// distinct destinations if `distinct` (else none); `None` when no edge
    /// is left.
    #[allow(clippy::too_many_arguments)]
    fn upload(
        &mut self,
        (src, dst): (&[u32], &[u32]),
        base: u64,
        a: u64,
        skip_self: bool,
        distinct: bool,
        device: Device,
    ) -> Result<Option<Batch>> {
        let kept = |(&s, &t): (&u32, &u32)| !(skip_self && s == t);
        // Sources, then destinations, then the distinct destinations.
        self.all.clear();
        let sources = src.iter().zip(dst).filter(|&e| kept(e));
        self.all
            .extend(sources.map(|(&s, _)| (s as u64 - base) as i64));
        let n = self.all.len();
        if n == 0 {
            return Ok(None);
        }
        let targets = src.iter().zip(dst).filter(|&e| kept(e));
        self.all
            .extend(targets.map(|(_, &t)| (t as u64 - a) as i64));
        if distinct {
            self.batch = self.batch.wrapping_add(1);
            if self.batch == 0 {
                self.listed.fill(0);
                self.batch = 1;
            }
            for k in n..2 * n {
                let t = self.all[k] as usize;
                if t >= self.listed.len() {
                    self.listed.resize(t + 1, 0);
                }
                if self.listed[t] != self.batch {
                    self.listed[t] = self.batch;
                    self.all.push(t as i64);
                }
            }
        }
        let all = Tensor::from_slice(&self.all).f_to_device(device)?;
        let n = n as i64;
        Ok(Some(Batch {
            src: all.narrow(0, 0, n),
            dst: all.narrow(0, n, n),
            touched: all.narrow(0, 2 * n, all.size()[0] - 2 * n),
        }))
    }
}

/// The layer's output rows for the destinations `[a, b)`, in a buffer from
/// `spares`, and (with `keep_rows`) the group's own input rows: as
/// [`super::group::graph_layer_group`], with the aggregation on `device`.
pub(super) fn graph_layer_group(
    job: &GroupJob,
    spares: &mut Spares,
    read: &mut u64,
    times: &mut StreamTimes,
) -> Result<(Vec<f32>, Vec<f32>)> {
    let mut h_dst = job.kept_rows(spares);
    let out = match job.layer {
        Layer::Sage { .. } => sage(job, &mut h_dst, read, times)?,
        Layer::Gat { .. } => gat(job, &mut h_dst, read, times)?,
    };
    let rows = rows_to_host(job, &out, spares)?;
    Ok((rows, h_dst))
}

/// How the stream takes the edge buckets: a chunk of the stream is `merge`
/// buckets' rows (see [`super::plan`]'s merges).
#[derive(Clone, Copy)]
struct Merged {
    merge: usize,
    buckets: usize,
    /// Rows of a chunk of the stream.
    chunk_rows: u64,
}

impl Merged {
    fn of(job: &GroupJob) -> Merged {
        Merged {
            merge: job.merge as usize,
            buckets: job.edges.offsets.len() - 1,
            chunk_rows: job.chunk_rows * job.merge,
        }
    }

    /// The buckets `[b0, b1)` that chunk `c` of the stream takes.
    fn range(&self, c: usize) -> (usize, usize) {
        (c * self.merge, ((c + 1) * self.merge).min(self.buckets))
    }
}

/// GraphSAGE's layer on the device: the group's sums there, each chunk's
/// rows added along its edges with `index_add_`.
fn sage(
    job: &GroupJob,
    h_dst: &mut Vec<f32>,
    read: &mut u64,
    times: &mut StreamTimes,
) -> Result<Tensor> {
    let GroupJob {
        input,
        edges,
        range: (a, b),
        device,
        ..
    } = *job;
    let Layer::Sage {
        lin_l_w,
        lin_l_b,
        lin_r_w,
    } = job.layer
    else {
        unreachable!("on_device::sage takes a GraphSAGE layer");
    };
    let merged = Merged::of(job);
    let chunk_rows = merged.chunk_rows;
    let g = (b - a) as i64;
    let opts = (Kind::Float, device);
    let mut idx = Indices::default();
    let d_out = lin_r_w.size()[0];
    // mean(h) W = mean(h W): where the layer narrows, sources are
    // projected first (with the group's own rows through lin_r in
    // the same matmul) and the sums kept at the output's width.
    let project = lin_l_w.size()[0] <= input.width as i64;
    let d = if project { d_out } else { input.width as i64 };
    let mut acc = Tensor::f_zeros([g, d], opts)?;
    let own = Tensor::f_zeros([g, d_out], opts)?;
    let (w_l, w_lr) = (
        lin_l_w.tr(),
        Tensor::f_cat(&[lin_l_w, lin_r_w], 0)?.tr().contiguous(),
    );
    let per_batch = edges_per_batch(2 * d as u64);
    *read += input.stream(job.engine, chunk_rows, 0, times, job.bar, |c, chunk| {
        let c0 = c as u64 * chunk_rows;
        let c1 = c0 + chunk.rows as u64;
        let (lo, hi) = (a.max(c0), b.min(c1));
        let (b0, b1) = merged.range(c);
        let (e0, e1) = (edges.offsets[b0] as usize, edges.offsets[b1] as usize);
        if lo >= hi && e0 == e1 {
            return Ok(());
        }
        job.keep_own_rows(h_dst, chunk, c0);
        // SAFETY: `x` (on the CPU, the view itself, and then perhaps
        // `rows`) is only read, by matmuls and index_select, and dropped
        // when this closure returns.
        let x = unsafe { chunk.tensor() }.f_to_device(device)?;
        let (at, len) = ((lo - c0) as i64, hi.saturating_sub(lo) as i64);
        let rows = if project {
            let y = x.f_matmul(if lo < hi { &w_lr } else { &w_l })?;
            if lo < hi {
                own.narrow(0, (lo - a) as i64, len)
                    .f_copy_(&y.narrow(0, at, len).narrow(1, d_out, d_out))?;
            }
            y.narrow(1, 0, d_out)
        } else {
            if lo < hi {
                own.narrow(0, (lo - a) as i64, len)
                    .f_copy_(&x.narrow(0, at, len).f_matmul(&lin_r_w.tr())?)?;
            }
            x
        };
        for k in (e0..e1).step_by(per_batch) {
            let k1 = (k + per_batch).min(e1);
            let pair = (&edges.src[k..k1], &edges.dst[k..k1]);
            if let Some(e) = idx.upload(pair, c0, a, false, false, device)? {
                let _ = acc.f_index_add_(0, &e.dst, &rows.f_index_select(0, &e.src)?)?;
            }
        }
        Ok(())
    })?;
    let count = Tensor::from_slice(edges.in_degrees((a, b)))
        .f_to_device(device)?
        .f_clamp_min(1.0)?
        .f_unsqueeze(1)?;
    // In place, in the host path's order: mean + lin_l's bias +
    // lin_r(self).
    let _ = acc.f_div_(&count)?;
    let mut out = if project {
        acc
    } else {
        acc.f_matmul(&lin_l_w.tr())?
    };
    let _ = out.f_add_(lin_l_b)?;
    let _ = out.f_add_(&own)?;
    if job.activate {
        let _ = out.f_relu_()?;
    }
    Ok(out)
}

/// GAT's layer on the device: the group's online softmax there (see
/// [`Softmax`]), the stream walking the group's span first as the host's
/// push does (see [`Span`]).
fn gat(
    job: &GroupJob,
    h_dst: &mut Vec<f32>,
    read: &mut u64,
    times: &mut StreamTimes,
) -> Result<Tensor> {
    let GroupJob {
        input,
        edges,
        range: (a, b),
        device,
        ..
    } = *job;
    let Layer::Gat {
        lin_w,
        att_src,
        att_dst,
        res_w,
        bias,
        heads,
        per_head,
        concat,
    } = job.layer
    else {
        unreachable!("on_device::gat takes a GAT layer");
    };
    let merged = Merged::of(job);
    let chunk_rows = merged.chunk_rows;
    let g = (b - a) as i64;
    let opts = (Kind::Float, device);
    let mut idx = Indices::default();
    let (h, c_out) = (*heads, *per_head);
    let w = h * c_out;
    let (att_s, att_d) = (
        att_src.f_view([1, h, c_out])?,
        att_dst.f_view([1, h, c_out])?,
    );
    let (lin_t, res_t) = (lin_w.tr(), res_w.tr());
    let scores = |z: &Tensor, att: &Tensor| -> Result<Tensor> {
        let n = z.size()[0];
        Ok(z.f_view([n, h, c_out])?
            .f_mul(att)?
            .f_sum_dim_intlist(-1, false, Kind::Float)?)
    };
    let mut sm = Softmax {
        h,
        c_out,
        acc: Tensor::f_zeros([g, w], opts)?,
        m: Tensor::f_zeros([g, h], opts)?,
        s: Tensor::f_zeros([g, h], opts)?,
        er: Tensor::f_zeros([g, h], opts)?,
        per_batch: edges_per_batch(3 * w as u64 + 4 * h as u64),
    };
    let res = Tensor::f_zeros([g, res_w.size()[0]], opts)?;
    // The projections and scores of the span's chunks but its last,
    // kept for the edges that wait on a later destination: one
    // block from the span's first row, so that the edges waiting on
    // a chunk's destinations go through the ops as one batch, not as
    // many small ones as pairs of chunks, each of which costs the
    // device a few kernels.
    let walk = Span::of(a, b, chunk_rows);
    let base = walk.first as u64 * chunk_rows;
    let kept = (walk.last - walk.first) as i64 * chunk_rows as i64;
    let (span_z, span_el) = (
        Tensor::f_zeros([kept, w], opts)?,
        Tensor::f_zeros([kept, h], opts)?,
    );
    let mut picked = Picked::default();
    *read += input.stream(
        job.engine,
        chunk_rows,
        walk.first,
        times,
        job.bar,
        |c, chunk| {
            let (b0, b1) = merged.range(c);
            let (e0, e1) = (edges.offsets[b0] as usize, edges.offsets[b1] as usize);
            let in_span = walk.holds(c);
            if !in_span && e0 == e1 {
                return Ok(());
            }
            let c0 = c as u64 * chunk_rows;
            let c1 = c0 + chunk.rows as u64;
            // SAFETY: `x` (on the CPU, the view itself) is only read, by
            // matmuls, and dropped when this closure returns.
            let x = unsafe { chunk.tensor() }.f_to_device(device)?;
            let z = x.f_matmul(&lin_t)?;
            let el = scores(&z, &att_s)?;
            let seen = if in_span { b.min(c1) } else { b };
            if in_span {
                let (lo, hi) = (a.max(c0), b.min(c1));
                let (at, len) = ((lo - c0) as i64, (hi - lo) as i64);
                let z_own = z.narrow(0, at, len);
                let er = scores(&z_own, &att_d)?;
                let into = |t: &Tensor| t.narrow(0, (lo - a) as i64, len);
                into(&res).f_copy_(&x.narrow(0, at, len).f_matmul(&res_t)?)?;
                job.keep_own_rows(h_dst, chunk, c0);
                sm.seed((lo - a) as i64, &el.narrow(0, at, len), &er, &z_own)?;
                // Edges from the span's earlier chunks waited for these
                // destinations.
                let earlier = merged.range(walk.first).0..b0;
                let pair = picked.pick(edges, earlier, (lo, hi));
                sm.add(&mut idx, pair, base, a, (&span_z, &span_el), device)?;
            }
            // This chunk's edges into destinations that have come by.
            let pair = picked.pick(edges, b0..b1, (a, seen));
            sm.add(&mut idx, pair, c0, a, (&z, &el), device)?;
            if in_span && c < walk.last {
                let at = (c0 - base) as i64;
                let n = chunk.rows as i64;
                span_z.narrow(0, at, n).f_copy_(&z)?;
                span_el.narrow(0, at, n).f_copy_(&el)?;
            }
            Ok(())
        },
    )?;
    drop((span_z, span_el));
    sm.finish(g, &res, bias, *concat, job.activate)
}

/// The layer's output rows on the host, straight into a buffer already
/// paged in (see [`Spares`]), every value overwritten: a group's rows are
/// GBs, and a fresh host tensor's pages cost more than the copy. A hidden
/// layer's go to the disk a chunk's rows at a time as they come off the
/// device, each written while the next is copied, not after the last.
fn rows_to_host(job: &GroupJob, out: &Tensor, spares: &mut Spares) -> Result<Vec<f32>> {
    let chunk_rows = Merged::of(job).chunk_rows;
    let n = out.numel();
    let flat = out.f_reshape([-1])?;
    let mut rows = spares.take_overwritten(n);
    let piece = if job.rows_to.is_some() {
        chunk_rows as usize * out.size()[1] as usize
    } else {
        n
    }
    .max(1);
    for (p, values) in rows.chunks_mut(piece).enumerate() {
        let len = values.len() as i64;
        // SAFETY: the closure copies into the tensor and keeps nothing.
        unsafe {
            on_values(values, &[len], |host| {
                host.f_copy_(&flat.narrow(0, (p * piece) as i64, len))?;
                Ok(())
            })?;
        }
        if let Some(writer) = job.rows_to {
            writer
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .put(values)?;
        }
    }
    Ok(rows)
}

/// The edges of some buckets into a range of destinations, one list in
/// any order (torch's ops need none; see [`Indices`]). The buffers are
/// reused from chunk to chunk.
#[derive(Default)]
struct Picked {
    src: Vec<u32>,
    dst: Vec<u32>,
}

impl Picked {
    /// The edges of the buckets `buckets` into destinations `[lo, hi)`.
    fn pick(
        &mut self,
        edges: &GroupEdges,
        buckets: std::ops::Range<usize>,
        range: (u64, u64),
    ) -> (&[u32], &[u32]) {
        self.src.clear();
        self.dst.clear();
        for bucket in buckets {
            let r = edges.reaching(bucket, range);
            self.src.extend_from_slice(&edges.src[r.clone()]);
            self.dst.extend_from_slice(&edges.dst[r]);
        }
        (&self.src, &self.dst)
    }
}

/// GAT's attention slope for negative scores.
fn leaky(raw: &Tensor) -> Result<Tensor> {
    Ok(raw.f_maximum(&raw.f_mul_scalar(crate::model::GAT_NEGATIVE_SLOPE)?)?)
}

/// A group's online softmax as device tensors (see
/// the host's `OnlineSoftmax` in [`super::gat`]): per destination and head the running
/// maximum `m`, the sum `s` of exp(score - m), and `acc`, the sources'
/// projections weighted alike; `er` the destination side of the scores.
struct Softmax {
    h: i64,
    c_out: i64,
    acc: Tensor,
    m: Tensor,
    s: Tensor,
    er: Tensor,
    per_batch: usize,
}

impl Softmax {
    /// Starts the destinations from the group's row `at` on with their
    /// self-loop: max = e_self, sum = 1, acc = their own projection
    /// `z_own`; `el_own` and `er` are their scores as sources and as
    /// destinations.
    fn seed(&mut self, at: i64, el_own: &Tensor, er: &Tensor, z_own: &Tensor) -> Result<()> {
        let len = er.size()[0];
        let into = |t: &Tensor| t.narrow(0, at, len);
        let raw = el_own.f_add(er)?;
        into(&self.m).f_copy_(&leaky(&raw)?)?;
        let _ = into(&self.s).f_fill_(1.0)?;
        into(&self.acc).f_copy_(z_own)?;
        into(&self.er).f_copy_(er)?;
        Ok(())
    }

    /// The group's `g` output rows, in place: the weighted sums over their
    /// sums (PyG adds 1e-16), heads concatenated or averaged, plus
    /// res(self) and the bias, then ELU with `activate`.
    fn finish(
        self,
        g: i64,
        res: &Tensor,
        bias: &Tensor,
        concat: bool,
        activate: bool,
    ) -> Result<Tensor> {
        let (h, c_out) = (self.h, self.c_out);
        let Softmax { acc, mut s, .. } = self;
        let _ = s.f_add_scalar_(1e-16)?;
        let mut norm = acc.f_view([g, h, c_out])?;
        let _ = norm.f_div_(&s.f_unsqueeze(-1)?)?;
        let mut out = if concat {
            norm.f_view([g, h * c_out])?
        } else {
            norm.f_mean_dim(1, false, Kind::Float)?
        };
        let _ = out.f_add_(res)?;
        let _ = out.f_add_(bias)?;
        if activate {
            let _ = out.f_elu_()?;
        }
        Ok(out)
    }

    /// Adds the edges `src[k] -> dst[k]` (in any order, all seeded), whose
    /// sources are rows of a block from node `base` with
    /// projections `z` and scores `el`.
    fn add(
        &mut self,
        idx: &mut Indices,
        (src, dst): (&[u32], &[u32]),
        base: u64,
        a: u64,
        (z, el): (&Tensor, &Tensor),
        device: Device,
    ) -> Result<()> {
        let (h, c_out) = (self.h, self.c_out);
        for k in (0..src.len()).step_by(self.per_batch) {
            let k1 = (k + self.per_batch).min(src.len());
            let pair = (&src[k..k1], &dst[k..k1]);
            let Some(Batch { src, dst, touched }) =
                idx.upload(pair, base, a, true, true, device)?
            else {
                continue;
            };
            let n = src.size()[0];
            let e = leaky(
                &el.f_index_select(0, &src)?
                    .f_add(&self.er.f_index_select(0, &dst)?)?,
            )?;
            // The new maxima, and the touched destinations' sums rescaled
            // to them: exp(old max - new max).
            let before = self.m.f_index_select(0, &touched)?;
            // scatter_reduce_ (index_reduce_ is torch's beta API, which
            // warns); the destinations repeated across the heads.
            let at = dst
                .f_unsqueeze(1)?
                .f_expand([n, h], false)?
                .f_contiguous()?;
            let _ = self
                .m
                .f_internal_scatter_reduce_(0, &at, &e, "amax", true)?;
            let scale = before
                .f_sub(&self.m.f_index_select(0, &touched)?)?
                .f_exp()?;
            let s = self.s.f_index_select(0, &touched)?.f_mul(&scale)?;
            let _ = self.s.f_index_copy_(0, &touched, &s)?;
            let t = touched.size()[0];
            let acc = self
                .acc
                .f_index_select(0, &touched)?
                .f_view([t, h, c_out])?
                .f_mul(&scale.f_unsqueeze(-1)?)?
                .f_view([t, h * c_out])?;
            let _ = self.acc.f_index_copy_(0, &touched, &acc)?;
            // Each edge's weight against its destination's new maximum.
            let wt = e.f_sub(&self.m.f_index_select(0, &dst)?)?.f_exp()?;
            let _ = self.s.f_index_add_(0, &dst, &wt)?;
            let rows = z
                .f_index_select(0, &src)?
                .f_view([n, h, c_out])?
                .f_mul(&wt.f_unsqueeze(-1)?)?
                .f_view([n, h * c_out])?;
            let _ = self.acc.f_index_add_(0, &dst, &rows)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::edges::Waiting;
    use super::*;

    // Three buckets, each sorted by destination: the waiting edges into
    // [10, 13) come back sorted by destination, every one once, and the
    // batch's distinct destinations once each.
    #[test]
    fn waiting_edges_come_sorted_by_destination() {
        let buckets: [&[(u32, u32)]; 3] = [
            &[(0, 9), (1, 10), (2, 12), (3, 12), (0, 14)],
            &[(4, 10), (5, 11), (6, 13)],
            &[(7, 8), (8, 12), (9, 10)],
        ];
        let mut edges = GroupEdges {
            src: Vec::new(),
            dst: Vec::new(),
            offsets: vec![0],
            by_dst: Default::default(),
            in_degree: Default::default(),
        };
        for bucket in buckets {
            for &(s, t) in bucket {
                edges.src.push(s);
                edges.dst.push(t);
            }
            edges.offsets.push(edges.src.len() as u64);
        }
        let mut waiting = Waiting::default();
        let (src, dst) = waiting.gather(&edges, 0..3, (10, 13));
        assert!(dst.is_sorted(), "{dst:?}");
        let mut got: Vec<(u32, u32)> = src.iter().copied().zip(dst.iter().copied()).collect();
        got.sort_unstable();
        assert_eq!(
            got,
            [
                (1, 10),
                (2, 12),
                (3, 12),
                (4, 10),
                (5, 11),
                (8, 12),
                (9, 10)
            ]
        );
        // Only the first two buckets: the third's edges are left out.
        let (src, dst) = waiting.gather(&edges, 0..2, (10, 13));
        assert_eq!((src.len(), dst), (5, &[10, 10, 11, 12, 12][..]));

        let (src, dst) = (src.to_vec(), dst.to_vec());
        let batch = Indices::default()
            .upload((&src, &dst), 0, 10, false, true, Device::Cpu)
            .unwrap()
            .expect("edges");
        let ints = |t: &Tensor| Vec::<i64>::try_from(t).unwrap();
        assert_eq!(ints(&batch.dst), [0, 0, 1, 2, 2]);
        assert_eq!(ints(&batch.touched), [0, 1, 2]);
        assert_eq!(
            ints(&batch.src),
            src.iter().map(|&s| s as i64).collect::<Vec<_>>()
        );
        // Destinations in any order (a chunk of several buckets): each
        // distinct one once, in the order first met; a self-loop skipped.
        let mut idx = Indices::default();
        let batch = idx
            .upload(
                (&[1, 2, 12, 3, 4], &[12, 10, 12, 11, 10]),
                0,
                10,
                true,
                true,
                Device::Cpu,
            )
            .unwrap()
            .expect("edges");
        assert_eq!(ints(&batch.dst), [2, 0, 1, 0]);
        assert_eq!(ints(&batch.touched), [2, 0, 1]);
        // The next batch lists its own.
        let batch = idx
            .upload((&[5, 6], &[11, 11]), 0, 10, false, true, Device::Cpu)
            .unwrap()
            .expect("edges");
        assert_eq!(ints(&batch.touched), [1]);
    }
}
