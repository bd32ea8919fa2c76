//! GAT's layer on the host, for one group of destinations (PyG's
//! `GATConv` with a residual): the softmax over each destination's
//! in-edges and its self-loop, computed online as the sources stream by
//! (pushed along the edges), or per destination where one group holds
//! every node (pulled).

use offgnn_shared::prefetch;
use rayon::prelude::*;
use tch::Tensor;

use super::SCATTER_AHEAD;
use super::buffer_pool::Spares;
use super::chunk::Chunk;
use super::edges::{Waiting, dst_parts};
use super::group::GroupJob;
use super::host_tensors::{Scratch, on_values, to_vec};
use super::layers::Layer;
use super::pull::{project_all, pull_in_order};
use super::stream::StreamTimes;
use crate::error::Result;

/// GAT's LeakyReLU slope, in the f32 the host's scores are computed in.
const SLOPE: f32 = crate::model::GAT_NEGATIVE_SLOPE as f32;

/// A GAT layer for one group on the host: pulled where one group holds
/// every node (see [`gat_pull`]), else pushed: the stream walks the
/// group's span first (see [`Span`]), and each chunk's rows are added into
/// their destinations' online softmax along the group's edges from that
/// chunk.
pub(super) fn layer_group(
    job: &GroupJob,
    spares: &mut Spares,
    read: &mut u64,
    times: &mut StreamTimes,
) -> Result<(Vec<f32>, Vec<f32>)> {
    let GroupJob {
        layer,
        input,
        range: (a, b),
        chunk_rows,
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
    } = layer
    else {
        unreachable!("gat::layer_group takes a GAT layer");
    };
    if (a, b) == (0, input.rows) {
        return gat_pull(job, spares, read, times);
    }
    let (h, c_out) = (*heads as usize, *per_head as usize);
    let w = h * c_out;
    let g = (b - a) as usize;
    let span = Span::of(a, b, chunk_rows);
    let kept = ((span.last - span.first) as u64 * chunk_rows) as usize;
    // The output rows, which hold res(self) until the softmax is
    // finished into them (no buffer of its own: a group's rows are
    // GBs, fresh pages on a first layer).
    let out_w = if *concat { w } else { c_out };
    assert_eq!(
        res_w.size()[0] as usize,
        out_w,
        "GAT's residual is the output's width"
    );
    let mut push = Push {
        heads: h,
        c_out,
        out_w,
        a_src: to_vec(att_src)?,
        a_dst: to_vec(att_dst)?,
        lin_t: lin_w.tr(),
        res_t: res_w.tr(),
        // Projections and residuals land in reused buffers: fresh
        // pages per chunk cost more than the matmuls on narrow layers.
        zs: Scratch::default(),
        rs: Scratch::default(),
        span,
        z_span: spares.take_empty(kept * w),
        el_span: spares.take_empty(kept * h),
        h_dst: job.kept_rows(spares),
        sm: OnlineSoftmax::new(a, g, h, c_out, spares),
        waiting: Waiting::default(),
        rows_out: spares.take(g * out_w),
        parts: rayon::current_num_threads() * 4,
    };
    *read += input.stream(
        job.engine,
        chunk_rows,
        span.first,
        times,
        job.bar,
        |c, chunk| push.chunk(job, c, chunk),
    )?;
    push.finish(job, (bias, *concat), spares)
}

/// What a GAT push keeps from chunk to chunk (see [`layer_group`]).
struct Push {
    heads: usize,
    c_out: usize,
    out_w: usize,
    /// att_src and att_dst, and lin and res transposed.
    a_src: Vec<f32>,
    a_dst: Vec<f32>,
    lin_t: Tensor,
    res_t: Tensor,
    zs: Scratch,
    rs: Scratch,
    span: Span,
    /// The projections and source scores of the span's chunks so far.
    z_span: Vec<f32>,
    el_span: Vec<f32>,
    h_dst: Vec<f32>,
    sm: OnlineSoftmax,
    waiting: Waiting,
    rows_out: Vec<f32>,
    parts: usize,
}

impl Push {
    /// Projects chunk `c` and adds its edges into the destinations that
    /// have come by; a chunk of the span also starts its destinations
    /// (their scores, res(self) and self-loop) and adds the edges that
    /// waited for them.
    fn chunk(&mut self, job: &GroupJob, c: usize, chunk: &Chunk) -> Result<()> {
        let GroupJob {
            edges,
            range: (a, b),
            chunk_rows,
            device,
            ..
        } = *job;
        let (h, c_out) = (self.heads, self.c_out);
        let w = h * c_out;
        let Span { first, last } = self.span;
        let (e0, e1) = (edges.offsets[c] as usize, edges.offsets[c + 1] as usize);
        let in_span = self.span.holds(c);
        if !in_span && e0 == e1 {
            return Ok(());
        }
        let c0 = c as u64 * chunk_rows;
        let n_rows = chunk.rows;
        let c1 = c0 + n_rows as u64;
        // SAFETY: `x` (on the CPU, the view itself) is only read, by the
        // products below, and dropped when this returns.
        let x = unsafe { chunk.tensor() }.f_to_device(device)?;
        let z = self.zs.product(&x, &self.lin_t)?;
        let mut el = vec![0f32; z.len() / c_out];
        head_scores(z, &self.a_src, c_out, &mut el);
        // Destinations below `seen` have had their rows by now.
        let seen = if in_span { b.min(c1) } else { b };
        if in_span {
            let (lo, hi) = (a.max(c0), b.min(c1));
            let (at, len) = ((lo - c0) as i64, (hi - lo) as i64);
            let own = &z[at as usize * w..(at + len) as usize * w];
            head_scores(
                own,
                &self.a_dst,
                c_out,
                &mut self.sm.er[(lo - a) as usize * h..(hi - a) as usize * h],
            );
            let r = self.rs.product(&x.narrow(0, at, len), &self.res_t)?;
            self.rows_out[(lo - a) as usize * self.out_w..][..r.len()].copy_from_slice(r);
            job.keep_own_rows(&mut self.h_dst, chunk, c0);
            self.sm.seed((lo, hi), c0, z, &el);
            // Edges from the span's earlier chunks waited for these
            // destinations: one batch for them all, not one per pair of
            // chunks (hundreds of thousands of small parallel calls a
            // layer).
            let (src, dst) = self.waiting.gather(edges, first..c, (lo, hi));
            let base = first as u64 * chunk_rows;
            let (z_span, el_span) = (&self.z_span, &self.el_span);
            self.sm
                .add((lo, hi), src, dst, base, z_span, el_span, self.parts);
        }
        // This chunk's edges into destinations that have come by.
        let own = edges.reaching(c, (a, seen));
        self.sm.add(
            (a, seen),
            &edges.src[own.clone()],
            &edges.dst[own],
            c0,
            z,
            &el,
            self.parts,
        );
        if in_span && c < last {
            self.z_span.extend_from_slice(z);
            self.el_span.extend_from_slice(&el);
        }
        Ok(())
    }

    /// The group's output rows and own input rows: the softmax's weighted
    /// sums over its sums (PyG adds 1e-16), heads concatenated or averaged,
    /// plus res(self) (in the rows already) and `bias`, then ELU: row by
    /// row in place, no fresh GBs of tensors.
    fn finish(
        self,
        job: &GroupJob,
        (bias, concat): (&Tensor, bool),
        spares: &mut Spares,
    ) -> Result<(Vec<f32>, Vec<f32>)> {
        let (h, c_out, out_w) = (self.heads, self.c_out, self.out_w);
        spares.give(self.z_span);
        spares.give(self.el_span);
        let bias = to_vec(bias)?;
        let mut rows_out = self.rows_out;
        let (acc, sums) = (&self.sm.acc, &self.sm.s);
        rows_out
            .par_chunks_mut(out_w)
            .zip(acc.par_chunks(h * c_out))
            .zip(sums.par_chunks(h))
            .for_each_init(
                || vec![0f32; out_w],
                |mean, ((out, acc), sums)| {
                    gat_finish_row(out, acc, sums, &bias, concat, c_out, mean)
                },
            );
        if job.activate {
            elu_in_place(&mut rows_out)?;
        }
        self.sm.give(spares);
        Ok((rows_out, self.h_dst))
    }
}

/// GAT's walk of a group's input: a destination's scores need its own row
/// (att_dst·W h_dst), so the stream starts at the group's first chunk: the
/// chunks `first..=last` that hold the group's rows (its span) come first,
/// in order, then the rest. An edge whose destination has not come by yet
/// waits: its source is in the span, whose projections are kept until the
/// span's last chunk. So the group's own rows are read once, in the stream.
#[derive(Clone, Copy, Debug)]
pub(super) struct Span {
    pub(super) first: usize,
    pub(super) last: usize,
}

impl Span {
    /// The span of the destinations `[a, b)` in chunks of `chunk_rows`.
    pub(super) fn of(a: u64, b: u64, chunk_rows: u64) -> Span {
        Span {
            first: (a / chunk_rows) as usize,
            last: ((b - 1) / chunk_rows) as usize,
        }
    }

    pub(super) fn holds(&self, c: usize) -> bool {
        (self.first..=self.last).contains(&c)
    }
}

/// A group's GAT softmax over in-edges, computed online (a running maximum
/// and sums rescaled when it grows; Milakov and Gimelshein, "Online
/// normalizer calculation for softmax", 2018): per destination and head
/// the maximum score `m`, the sum `s` of exp(score - m) and `acc`, the sum
/// of the sources' projected rows weighted alike. The order of the terms
/// does not matter, so sources may come in any chunk order.
struct OnlineSoftmax {
    /// The group's first destination.
    a: u64,
    heads: usize,
    per_head: usize,
    m: Vec<f32>,
    s: Vec<f32>,
    acc: Vec<f32>,
    /// The destination side of each score, att_dst·W h_dst, per head;
    /// known once the destination's own row has come by.
    er: Vec<f32>,
}

impl OnlineSoftmax {
    /// The state of a group of `g` destinations from `a`, in buffers from
    /// `spares` ([`OnlineSoftmax::give`] hands them back).
    fn new(a: u64, g: usize, heads: usize, per_head: usize, spares: &mut Spares) -> Self {
        OnlineSoftmax {
            a,
            heads,
            per_head,
            acc: spares.take(g * heads * per_head),
            m: spares.take(g * heads),
            s: spares.take(g * heads),
            er: spares.take(g * heads),
        }
    }

    fn give(self, spares: &mut Spares) {
        for buf in [self.acc, self.m, self.s, self.er] {
            spares.give(buf);
        }
    }

    /// Starts destinations `[lo, hi)` with their self-loop (PyG's
    /// add_self_loops), their rows' projections `z` and source scores `el`
    /// taken from a chunk that starts at node `base`: max = e_self, sum =
    /// 1, acc = z_dst. Their `er` must be set.
    fn seed(&mut self, (lo, hi): (u64, u64), base: u64, z: &[f32], el: &[f32]) {
        let (h, w) = (self.heads, self.heads * self.per_head);
        for v in lo..hi {
            let (row, at) = ((v - base) as usize, (v - self.a) as usize);
            for hh in 0..h {
                let raw = el[row * h + hh] + self.er[at * h + hh];
                self.m[at * h + hh] = if raw >= 0.0 { raw } else { SLOPE * raw };
                self.s[at * h + hh] = 1.0;
            }
            self.acc[at * w..][..w].copy_from_slice(&z[row * w..][..w]);
        }
    }

    /// Adds the edges `src[k] -> dst[k]`, sorted by destination, all in
    /// `[lo, hi)` and seeded; the sources' projections `z` and scores `el`
    /// are rows of a block that starts at node `base`. Threads take
    /// disjoint ranges of destinations, so no locks.
    #[allow(clippy::too_many_arguments)]
    fn add(
        &mut self,
        (lo, hi): (u64, u64),
        src: &[u32],
        dst: &[u32],
        base: u64,
        z: &[f32],
        el: &[f32],
        parts: usize,
    ) {
        if src.is_empty() {
            return;
        }
        let (h, c_out) = (self.heads, self.per_head);
        let w = h * c_out;
        let split = dst_parts(dst, lo, hi, parts);
        let mut slices = Vec::with_capacity(split.len());
        let (mut acc_rest, mut m_rest, mut s_rest) = (
            self.acc.as_mut_slice(),
            self.m.as_mut_slice(),
            self.s.as_mut_slice(),
        );
        let mut at = self.a;
        for &((plo, phi), edge_range) in &split {
            let skip = (plo - at) as usize;
            let len = (phi - plo) as usize;
            let (_, t) = acc_rest.split_at_mut(skip * w);
            let (acc_mine, t) = t.split_at_mut(len * w);
            acc_rest = t;
            let (_, t) = m_rest.split_at_mut(skip * h);
            let (m_mine, t) = t.split_at_mut(len * h);
            m_rest = t;
            let (_, t) = s_rest.split_at_mut(skip * h);
            let (s_mine, t) = t.split_at_mut(len * h);
            s_rest = t;
            slices.push((plo, acc_mine, m_mine, s_mine, edge_range));
            at = phi;
        }
        let (er, a) = (&self.er, self.a);
        slices
            .into_par_iter()
            .for_each(|(plo, acc_mine, m_mine, s_mine, (x0, x1))| {
                for k in x0..x1 {
                    // Rows all over the group's state and the chunk's
                    // projections: their misses overlap when asked for
                    // ahead (see the GraphSAGE scatter).
                    let ahead = k + SCATTER_AHEAD;
                    if ahead < x1 {
                        let (r, l) = (
                            (src[ahead] as u64 - base) as usize,
                            (dst[ahead] as u64 - plo) as usize,
                        );
                        prefetch::lines(acc_mine, l * w, w);
                        prefetch::lines(z, r * w, w);
                        prefetch::line(m_mine, l * h);
                        prefetch::line(s_mine, l * h);
                        prefetch::line(el, r * h);
                        prefetch::line(er, (dst[ahead] as u64 - a) as usize * h);
                    }
                    let (sv, t) = (src[k], dst[k]);
                    // PyG replaces edges from a node to itself by the one
                    // self-loop, already in the seed.
                    if sv == t {
                        continue;
                    }
                    let row = (sv as u64 - base) as usize;
                    let local = (t as u64 - plo) as usize;
                    let global = (t as u64 - a) as usize;
                    for hh in 0..h {
                        let raw = el[row * h + hh] + er[global * h + hh];
                        let e = if raw >= 0.0 { raw } else { SLOPE * raw };
                        let mi = &mut m_mine[local * h + hh];
                        let si = &mut s_mine[local * h + hh];
                        let out = &mut acc_mine[local * w + hh * c_out..][..c_out];
                        let zr = &z[row * w + hh * c_out..][..c_out];
                        if e > *mi {
                            let scale = (*mi - e).exp();
                            *si = *si * scale + 1.0;
                            for (o, v) in out.iter_mut().zip(zr) {
                                *o = *o * scale + v;
                            }
                            *mi = e;
                        } else {
                            let wt = (e - *mi).exp();
                            *si += wt;
                            for (o, v) in out.iter_mut().zip(zr) {
                                *o += wt * v;
                            }
                        }
                    }
                }
            });
    }
}

/// Each row's score per head: the dot product of the row's slice of each
/// head (`c_out` values) with that head's slice of `att` (GAT's
/// `att_src` or `att_dst`), for rows `w = heads * c_out` wide, into
/// `out` (a row's `heads` scores after another), on the thread pool.
fn head_scores(z: &[f32], att: &[f32], c_out: usize, out: &mut [f32]) {
    let (w, h) = (att.len(), att.len() / c_out);
    debug_assert_eq!(z.len() / w * h, out.len());
    const ROWS: usize = 1024;
    out.par_chunks_mut(ROWS * h)
        .zip(z.par_chunks(ROWS * w))
        .for_each(|(out, z)| {
            for (o, row) in out.chunks_exact_mut(h).zip(z.chunks_exact(w)) {
                for ((o, v), a) in o
                    .iter_mut()
                    .zip(row.chunks_exact(c_out))
                    .zip(att.chunks_exact(c_out))
                {
                    *o = dot(v, a);
                }
            }
        });
}

/// `x . y` in eight partial sums, which the compiler keeps in one vector
/// register: a float sum taken strictly left to right cannot be
/// vectorized, and the scores are taken on the stream's one thread, where
/// their time adds to the stream's.
fn dot(x: &[f32], y: &[f32]) -> f32 {
    const LANES: usize = 8;
    let (xs, ys) = (x.chunks_exact(LANES), y.chunks_exact(LANES));
    let tail: f32 = xs
        .remainder()
        .iter()
        .zip(ys.remainder())
        .map(|(a, b)| a * b)
        .sum();
    let mut lanes = [0f32; LANES];
    for (a, b) in xs.zip(ys) {
        for i in 0..LANES {
            lanes[i] += a[i] * b[i];
        }
    }
    lanes.iter().sum::<f32>() + tail
}

/// A GAT destination's output row from its softmax state: per head the
/// weighted sum over the sum of weights (PyG adds 1e-16), heads
/// concatenated or averaged (summed in head order, into `mean`), added to
/// `out` (which holds res(self)) with the bias.
fn gat_finish_row(
    out: &mut [f32],
    acc: &[f32],
    sums: &[f32],
    bias: &[f32],
    concat: bool,
    c_out: usize,
    mean: &mut [f32],
) {
    if concat {
        for (hh, s) in sums.iter().enumerate() {
            let d = s + 1e-16;
            for ((o, v), b) in out[hh * c_out..][..c_out]
                .iter_mut()
                .zip(&acc[hh * c_out..][..c_out])
                .zip(&bias[hh * c_out..])
            {
                *o = v / d + *o + b;
            }
        }
    } else {
        mean.fill(0.0);
        for (hh, s) in sums.iter().enumerate() {
            let d = s + 1e-16;
            for (m, v) in mean.iter_mut().zip(&acc[hh * c_out..][..c_out]) {
                *m += v / d;
            }
        }
        for ((o, m), b) in out.iter_mut().zip(mean.iter()).zip(bias) {
            *o = m / sums.len() as f32 + *o + b;
        }
    }
}

/// ELU in place through torch, whose expm1 is vectorized where glibc's is
/// scalar, a sizable share of a GAT layer's time.
fn elu_in_place(rows: &mut [f32]) -> Result<()> {
    let n = rows.len() as i64;
    // SAFETY: the closure drops `f_elu_`'s result, the tensor again, at once.
    unsafe {
        on_values(rows, &[n], |t| {
            let _ = t.f_elu_()?;
            Ok(())
        })
    }
}

/// GAT for a group that holds every node, pulled: the stream projects
/// each chunk (z = W h, its scores as a source and as a destination, and
/// res(self) into the output rows) and keeps z for every node; then each
/// destination, in parallel, takes its softmax over its in-edges (and its
/// self-loop) in two passes, its state in cache, and its output row is
/// finished there, in node order, so a hidden layer's rows go to the disk
/// while the next are pulled. Pushed along the edges instead (as a
/// smaller group must be, its sources' projections not all kept), every
/// edge read and wrote its destination's accumulator rows, random in the
/// group's state: the pull reads a source's row and writes nothing, and
/// keeps no accumulators (z for every node is what the push kept of its
/// span, the whole input here).
fn gat_pull(
    job: &GroupJob,
    spares: &mut Spares,
    read: &mut u64,
    times: &mut StreamTimes,
) -> Result<(Vec<f32>, Vec<f32>)> {
    let (input, edges) = (job.input, job.edges);
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
        unreachable!("gat_pull takes a GAT layer");
    };
    let n = input.rows as usize;
    let (h, c_out) = (*heads as usize, *per_head as usize);
    let w = h * c_out;
    let out_w = if *concat { w } else { c_out };
    let (a_src, a_dst) = (to_vec(att_src)?, to_vec(att_dst)?);
    let lin_res = Tensor::cat(&[lin_w, res_w], 0).tr().contiguous();
    let (starts, src) = edges.by_destination((0, input.rows));
    // Each node's scores as a source and as a destination, per head.
    let (mut el_all, mut er_all) = (
        spares.take_overwritten(n * h),
        spares.take_overwritten(n * h),
    );
    let (z_all, mut rows_out, h_dst) =
        project_all(job, spares, read, times, &lin_res, (w, out_w), |c0, z| {
            let rows = z.len() / w;
            head_scores(z, &a_src, c_out, &mut el_all[c0 * h..(c0 + rows) * h]);
            head_scores(z, &a_dst, c_out, &mut er_all[c0 * h..(c0 + rows) * h]);
        })?;
    let bias = to_vec(bias)?;
    let lrelu = |raw: f32| if raw >= 0.0 { raw } else { SLOPE * raw };
    let (z, el, er) = (&z_all, &el_all, &er_all);
    // A thread's scratch: the scores of a destination's edges (self-loop
    // first), per head, and its sums.
    let scratch = || (Vec::new(), vec![0f32; w], vec![0f32; h], vec![0f32; out_w]);
    let pull = |(scores, acc, sums, mean): &mut (Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>),
                v: usize,
                out: &mut [f32]| {
        let er = &er[v * h..][..h];
        // PyG replaces edges from a node to itself by one self-loop.
        let (k0, k1) = (starts[v] as usize, starts[v + 1] as usize);
        let edges = src[k0..k1].iter().filter(|&&u| u as usize != v);
        scores.clear();
        scores.extend((0..h).map(|hh| lrelu(el[v * h + hh] + er[hh])));
        for (j, &u) in edges.clone().enumerate() {
            // The rows of the edges a few on: their misses overlap (see
            // the GraphSAGE scatter).
            if let Some(&ahead) = src.get(k0 + j + SCATTER_AHEAD) {
                // Into the L2 cache: the rows are read a pass later, and
                // a prefetch into L1 that waits for a fill buffer stalls
                // the loop.
                prefetch::lines_to_l2(z, ahead as usize * w, w);
                prefetch::line(el, ahead as usize * h);
            }
            let u = u as usize;
            scores.extend((0..h).map(|hh| lrelu(el[u * h + hh] + er[hh])));
        }
        // Per head: the largest score, then the weights.
        for hh in 0..h {
            let m = scores[hh..]
                .iter()
                .step_by(h)
                .fold(f32::NEG_INFINITY, |m, &e| m.max(e));
            let mut s = 0.0;
            for e in scores[hh..].iter_mut().step_by(h) {
                *e = (*e - m).exp();
                s += *e;
            }
            sums[hh] = s;
        }
        acc.copy_from_slice(&z[v * w..][..w]);
        for (hh, a) in acc.chunks_exact_mut(c_out).enumerate() {
            let wt = scores[hh];
            a.iter_mut().for_each(|x| *x *= wt);
        }
        for (j, u) in edges.enumerate() {
            let (wts, row) = (&scores[(j + 1) * h..][..h], &z[*u as usize * w..][..w]);
            for ((a, z), &wt) in acc
                .chunks_exact_mut(c_out)
                .zip(row.chunks_exact(c_out))
                .zip(wts)
            {
                for (x, v) in a.iter_mut().zip(z) {
                    *x += wt * v;
                }
            }
        }
        gat_finish_row(out, acc, sums, &bias, *concat, c_out, mean);
    };
    pull_in_order(job, times, &mut rows_out, out_w, scratch, pull, |rows| {
        if job.activate {
            elu_in_place(rows)?;
        }
        Ok(())
    })?;
    spares.give(z_all);
    spares.give(el_all);
    spares.give(er_all);
    Ok((rows_out, h_dst))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The heads' scores equal the plain per-head dot products, for heads
    /// wider and narrower than a vector's lanes (with a tail) and more
    /// rows than a task takes.
    #[test]
    fn head_scores_are_each_heads_dot_product() {
        for (h, c_out) in [(4, 32), (3, 13), (2, 5), (1, 8)] {
            let w = h * c_out;
            let rows = 2500;
            let value = |i: usize, salt: usize| ((i * 7919 + salt) % 101) as f32 / 50.0 - 1.0;
            let z: Vec<f32> = (0..rows * w).map(|i| value(i, 3)).collect();
            let att: Vec<f32> = (0..w).map(|i| value(i, 17)).collect();
            let mut got = vec![f32::NAN; rows * h];
            head_scores(&z, &att, c_out, &mut got);
            for r in 0..rows {
                for hh in 0..h {
                    let want: f64 = (0..c_out)
                        .map(|j| z[r * w + hh * c_out + j] as f64 * att[hh * c_out + j] as f64)
                        .sum();
                    let g = got[r * h + hh] as f64;
                    assert!(
                        (g - want).abs() <= 1e-5 * (1.0 + want.abs()),
                        "row {r} head {hh} of {h}x{c_out}: {g} against {want}"
                    );
                }
            }
        }
    }
}
