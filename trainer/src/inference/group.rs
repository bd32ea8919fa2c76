//! One graph layer's work for one group of destinations, as the host and
//! device aggregations take it, and the host's choice of aggregation by
//! the layer's kind.

use std::sync::Mutex;

use indicatif::ProgressBar;
use offgnn_shared::io_engine::IoEngine;
use tch::Device;

use super::buffer_pool::Spares;
use super::chunk::Chunk;
use super::edges::GroupEdges;
use super::hidden_rows::RowWriter;
use super::layers::Layer;
use super::stream::{Input, StreamTimes};
use super::{gat, sage};
use crate::error::Result;

/// One graph layer's work for one group of destinations: what
/// [`graph_layer_group`] and [`super::on_device::graph_layer_group`] take.
#[derive(Clone, Copy)]
pub(super) struct GroupJob<'a, 'w> {
    pub(super) layer: &'a Layer,
    pub(super) input: &'a Input,
    pub(super) engine: &'a IoEngine,
    pub(super) edges: &'a GroupEdges,
    /// The destinations `[a, b)`.
    pub(super) range: (u64, u64),
    pub(super) chunk_rows: u64,
    /// Edge buckets a chunk of the stream takes (the device path's; the
    /// host's takes one).
    pub(super) merge: u64,
    pub(super) device: Device,
    /// Keep the group's own input rows (the embeddings).
    pub(super) keep_rows: bool,
    /// The group's own input rows where the caller holds them already (the
    /// layer before's output, in memory): [`GroupJob::kept_rows`] takes
    /// them, and the stream then copies none.
    pub(super) given_rows: &'a Mutex<Option<Vec<f32>>>,
    /// Where the group's output rows go (a hidden layer's), which a group
    /// that finishes them in node order hands on as it does; the caller
    /// hands on the rest.
    pub(super) rows_to: Option<&'a Mutex<RowWriter<'w>>>,
    /// Apply the activation.
    pub(super) activate: bool,
    pub(super) bar: &'a ProgressBar,
}

impl GroupJob<'_, '_> {
    /// A buffer for the group's own input rows, kept for the embeddings,
    /// sized already (grown by doubling, GBs of rows would be copied and
    /// paged in again at each step); empty unless `keep_rows`. Taken first,
    /// the largest need, it gets the pool's largest buffer.
    pub(super) fn kept_rows(&self, spares: &mut Spares) -> Vec<f32> {
        let (a, b) = self.range;
        let given = self
            .given_rows
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        match given {
            Some(rows) if self.keep_rows => {
                assert_eq!(rows.len(), (b - a) as usize * self.input.width);
                rows
            }
            _ if self.keep_rows => spares.take_empty((b - a) as usize * self.input.width),
            _ => Vec::new(),
        }
    }

    /// Appends the group's own rows in `chunk` (whose first node is `c0`)
    /// to `h_dst`, if they are kept.
    pub(super) fn keep_own_rows(&self, h_dst: &mut Vec<f32>, chunk: &Chunk, c0: u64) {
        let (a, b) = self.range;
        let (lo, hi) = (a.max(c0), b.min(c0 + chunk.rows as u64));
        let w = self.input.width;
        // Given rows (see `given_rows`) are all there from the start.
        if self.keep_rows && lo < hi && h_dst.len() < (b - a) as usize * w {
            debug_assert_eq!(h_dst.len(), (lo - a) as usize * w, "rows in order");
            h_dst
                .extend_from_slice(&chunk.values()[(lo - c0) as usize * w..(hi - c0) as usize * w]);
        }
    }
}

/// Runs one graph layer for the destinations `[a, b)` on the host:
/// streams the input, aggregates along the group's edges, applies the
/// dense part and, with `activate`, the activation. Returns the layer's
/// output rows for the group, and (with `keep_rows`) the group's own input
/// rows, both in buffers from `spares`, which the caller gives back once
/// written.
pub(super) fn graph_layer_group(
    job: &GroupJob,
    spares: &mut Spares,
    read: &mut u64,
    times: &mut StreamTimes,
) -> Result<(Vec<f32>, Vec<f32>)> {
    match job.layer {
        Layer::Sage { .. } => sage::layer_group(job, spares, read, times),
        Layer::Gat { .. } => gat::layer_group(job, spares, read, times),
    }
}
