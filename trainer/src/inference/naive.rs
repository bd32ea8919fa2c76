//! The naive baseline (`--method naive`): the first layer's aggregation
//! with one read per in-edge's source row, the random reads that DiskGNN
//! §5.2's batched packing avoids, timed on a sample and extrapolated.

use std::collections::HashMap;
use std::time::Instant;

use offgnn_shared::dataset::Dataset;
use offgnn_shared::io_engine::{AlignedBuf, IoEngine, ReadReq};
use serde::Serialize;

use super::edges::for_each_edge;
use super::run::local_dataset;
use super::stream::Input;
use super::{ALIGN_NODES, InferConfig, PAGE};
use crate::error::Result;

/// What the naive baseline measured: the first layer's aggregation with one
/// read per in-edge's source row, on a sample of destination blocks.
#[derive(Clone, Debug, Serialize)]
pub struct NaiveEstimate {
    pub sample_destinations: u64,
    pub sample_edges: u64,
    pub reads: u64,
    pub bytes_read: u64,
    pub seconds: f64,
    /// Distinct edges of the whole graph (estimated from the sample's
    /// share of duplicates).
    pub total_edges: u64,
    /// `seconds` scaled by `total_edges / sample_edges`.
    pub extrapolated_seconds: f64,
}

/// The naive baseline (`--method naive`): for `blocks` blocks of 1024
/// destinations spread evenly over the graph, gathers every in-neighbor's
/// feature row with one O_DIRECT read of the pages it spans (many in flight
/// through the I/O engine, as a careful naive implementation would queue
/// them) and sums them per destination, as the first layer's aggregation
/// must. The time is extrapolated to the whole graph by edges.
pub fn naive_first_layer(
    cfg: &InferConfig,
    engine: &IoEngine,
    blocks: u64,
) -> Result<NaiveEstimate> {
    let ds = Dataset::open(&local_dataset(cfg)?)?;
    let n = ds.num_nodes;
    let all_blocks = n.div_ceil(ALIGN_NODES);
    let blocks = blocks.clamp(1, all_blocks);
    let stride = all_blocks / blocks;
    let in_sample = |v: u32| -> bool {
        let b = v as u64 / ALIGN_NODES;
        b.is_multiple_of(stride) && b / stride < blocks
    };
    let (mut pairs, mut streamed, mut sampled_raw) = (Vec::new(), 0u64, 0u64);
    for_each_edge(&ds, cfg, |s, d| {
        streamed += 1;
        if in_sample(d) {
            sampled_raw += 1;
            pairs.push((d, s));
        }
        Ok(())
    })?;
    pairs.sort_unstable();
    pairs.dedup();
    let sample_destinations = (0..n).filter(|&v| in_sample(v as u32)).count() as u64;
    let file = engine.open(ds.features.path())?;
    let rb = ds.features.row_bytes();
    let data_offset = ds.features.header().data_offset;
    let width = ds.feature_dim() as usize;
    let input = Input {
        path: ds.features.path().to_path_buf(),
        data_offset,
        rows: n,
        width,
        dtype: ds.features.dtype(),
        pinned: false,
        features: true,
    };
    let span = |u: u32| -> (u64, u64) {
        let start = data_offset + u as u64 * rb;
        let first = start / PAGE * PAGE;
        let end = if file.is_direct() {
            (start + rb).div_ceil(PAGE) * PAGE
        } else {
            start + rb
        };
        (first, end)
    };
    // Reads per call: enough to keep every ring busy.
    const PER_READ: usize = 512;
    let slot = ((rb.div_ceil(PAGE) + 1) * PAGE) as usize;
    let mut buf = AlignedBuf::new(slot * PER_READ);
    let mut acc: HashMap<u32, Vec<f32>> = HashMap::new();
    let mut row = Vec::with_capacity(width);
    let (mut reads, mut bytes) = (0u64, 0u64);
    let started = Instant::now();
    let direct_end = file.len() / PAGE * PAGE;
    for batch in pairs.chunks(PER_READ) {
        // Rows in the file's last partial page cannot be read with
        // O_DIRECT: those few go through a buffered read.
        let reqs: Vec<ReadReq> = batch
            .iter()
            .enumerate()
            .filter(|(_, (_, s))| !file.is_direct() || span(*s).1 <= direct_end)
            .map(|(i, &(_, s))| {
                let (first, end) = span(s);
                ReadReq {
                    offset: first,
                    len: (end - first) as usize,
                    buf_offset: i * slot,
                }
            })
            .collect();
        bytes += engine.read(&file, &reqs, &mut buf)?;
        reads += reqs.len() as u64;
        for (i, &(d, s)) in batch.iter().enumerate() {
            if file.is_direct() && span(s).1 > direct_end {
                bytes += input.read_rows(s as u64, s as u64 + 1, &mut row)?;
                reads += 1;
            } else {
                let start = data_offset + s as u64 * rb;
                let at = i * slot + (start - span(s).0) as usize;
                input.to_f32(&buf.as_slice()[at..at + rb as usize], &mut row);
            }
            let sum = acc.entry(d).or_insert_with(|| vec![0.0; width]);
            for (o, v) in sum.iter_mut().zip(&row) {
                *o += v;
            }
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    let sample_edges = pairs.len() as u64;
    let total_edges = if sampled_raw == 0 {
        streamed
    } else {
        (streamed as f64 * sample_edges as f64 / sampled_raw as f64) as u64
    };
    Ok(NaiveEstimate {
        sample_destinations,
        sample_edges,
        reads,
        bytes_read: bytes,
        seconds,
        total_edges,
        extrapolated_seconds: seconds * total_edges as f64 / sample_edges.max(1) as f64,
    })
}
