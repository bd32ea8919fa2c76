//! The layers' passes: for each layer, each destination group's input
//! streamed and aggregated (or, for the MLP, its rows read and put through
//! the layers), and its rows written, to the work directory for a hidden
//! layer, to the output's Parquet parts for the last; the progress saved
//! after each group, so that a killed run resumes there.

use std::fs::File;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use offgnn_shared::io_engine::{AlignedBuf, IoEngine, IoFile};
use offgnn_shared::npy::DType;

use super::buffer_pool::Spares;
use super::edges::{GroupEdges, load_group_edges};
use super::group::{GroupJob, graph_layer_group};
use super::hidden_rows::{RowWriter, hidden_file};
use super::host_tensors::{tensor, to_vec};
use super::layers::{Model, act, graph_layers_of};
use super::on_device;
use super::output::OutputWriter;
use super::plan::{Plan, RunPlan};
use super::resume::{Progress, save_progress};
use super::stream::{Input, StreamTimes};
use super::{Aggregate, InferConfig, LayerFigures, PAGE};
use crate::error::{Error, Result};
use crate::model::ModelKind;

/// The layers' passes over the groups, and what they hand on from group to
/// group and layer to layer.
pub(super) struct Passes<'a> {
    cfg: &'a InferConfig,
    engine: &'a IoEngine,
    model: &'a Model,
    plan: &'a Plan,
    /// The output's selected nodes (see [`super::output::selection`]).
    bits: &'a [u64],
    features: Input,
    output: OutputWriter<'a>,
    /// The hidden rows' write buffers, handed from group to group.
    write_bufs: Vec<AlignedBuf>,
    /// A group's buffers, kept from group to group and layer to layer:
    /// reused memory is already paged in.
    spares: Spares,
    /// A group's edges, kept for the next pass where it is the same group.
    held_edges: Option<(usize, GroupEdges)>,
    /// The last hidden layer's output, kept for the last layer's embeddings
    /// where one group holds every node and the rows are float32 on disk
    /// (as read back they are these): the last layer's stream then copies
    /// none of them.
    held_rows: Option<Vec<f32>>,
    /// Groups this process finished.
    groups_here: u64,
    /// The tests' stand-in for a kill after this many groups.
    interrupt_after_groups: Option<u64>,
}

/// One layer's pass: its input, the width of its output, the edge buckets
/// a chunk of its stream takes, and its output's file (a hidden layer's).
struct LayerPass {
    l: usize,
    last: bool,
    input: Input,
    out_width: usize,
    merge: u64,
    out_file: Option<Arc<IoFile>>,
}

impl<'a> Passes<'a> {
    pub(super) fn new(
        cfg: &'a InferConfig,
        engine: &'a IoEngine,
        model: &'a Model,
        run_plan: &'a RunPlan,
        bits: &'a [u64],
        features: Input,
        output: OutputWriter<'a>,
    ) -> Self {
        let write_piece = run_plan.write_piece;
        Passes {
            cfg,
            engine,
            model,
            plan: &run_plan.plan,
            bits,
            features,
            output,
            write_bufs: vec![AlignedBuf::new(write_piece), AlignedBuf::new(write_piece)],
            spares: Spares::default(),
            held_edges: None,
            held_rows: None,
            groups_here: 0,
            interrupt_after_groups: crate::test_hooks::current().interrupt_after_groups,
        }
    }

    fn graph_layers(&self) -> usize {
        graph_layers_of(self.model)
    }

    /// Runs the layers' passes from where `progress` stands.
    pub(super) fn run(&mut self, progress: &mut Progress) -> Result<()> {
        while progress.layer < self.graph_layers() {
            let layer = self.layer(progress)?;
            while progress.groups_done < self.plan.groups.len() {
                self.group(&layer, progress)?;
            }
            if let Some(file) = &layer.out_file {
                file_sync(file.path())?;
            }
            progress.layer += 1;
            progress.groups_done = 0;
            save_progress(&self.cfg.work_dir, progress)?;
        }
        Ok(())
    }

    /// Layer `progress.layer`'s pass, its figures started and its hidden
    /// output's file made (on the layer's first group).
    fn layer(&self, progress: &mut Progress) -> Result<LayerPass> {
        let (cfg, model) = (self.cfg, self.model);
        let n = self.features.rows;
        let l = progress.layer;
        let last = l + 1 == self.graph_layers();
        let input = if l == 0 {
            self.features.clone()
        } else {
            Input {
                path: hidden_file(&cfg.work_dir, l - 1),
                data_offset: 0,
                rows: n,
                width: model.widths[l] as usize,
                dtype: if cfg.hidden_f16 {
                    DType::F16
                } else {
                    DType::F32
                },
                pinned: self.features.pinned,
                features: false,
            }
        };
        let out_width = if model.mlp.is_empty() {
            model.widths[l + 1] as usize
        } else {
            model.card.out_channels as usize
        };
        if progress.figures.len() == l {
            progress.figures.push(LayerFigures {
                layer: l + 1,
                in_width: input.width as i64,
                out_width: out_width as i64,
                groups_resumed: progress.groups_done as u64,
                ..Default::default()
            });
        }
        let merge = self.plan.merges.get(l).copied().unwrap_or(1);
        progress.figures[l].chunk_rows = self.plan.chunk_rows * merge;
        let out_path = hidden_file(&cfg.work_dir, l);
        let out_file = if last {
            None
        } else {
            let elem = if cfg.hidden_f16 { 2 } else { 4 };
            let padded = (n * out_width as u64 * elem).div_ceil(PAGE) * PAGE;
            if progress.groups_done == 0 {
                let f = File::create(&out_path).map_err(|e| Error::io(out_path.display(), e))?;
                f.set_len(padded)
                    .map_err(|e| Error::io(out_path.display(), e))?;
            }
            Some(Arc::new(self.engine.open_write(&out_path)?))
        };
        Ok(LayerPass {
            l,
            last,
            input,
            out_width,
            merge,
            out_file,
        })
    }

    /// The layer's pass over group `progress.groups_done`: its rows
    /// computed and written, its figures and the progress saved.
    fn group(&mut self, layer: &LayerPass, progress: &mut Progress) -> Result<()> {
        let cfg = self.cfg;
        let (l, input) = (layer.l, &layer.input);
        let graph_layers = self.graph_layers();
        let gi = progress.groups_done;
        let (a, b) = self.plan.groups[gi];
        let t = Instant::now();
        let mut figures = GroupFigures::default();
        // A bar per pass: the bytes of the layer's input streamed so far.
        let bar = offgnn_shared::progress::bytes_bar_if(
            cfg.show_progress,
            input.rows * input.row_bytes(),
            &format!(
                "layer {}/{graph_layers}, pass {}/{}",
                l + 1,
                gi + 1,
                self.plan.groups.len()
            ),
        );
        // The group's hidden rows go to the work directory from here,
        // handed on by the group as it finishes them or after.
        let elem = if cfg.hidden_f16 { 2 } else { 4 };
        let rows_to = layer.out_file.as_ref().map(|file| {
            Mutex::new(RowWriter::new(
                self.engine,
                file.clone(),
                cfg.hidden_f16,
                std::mem::take(&mut self.write_bufs),
                a * layer.out_width as u64 * elem,
            ))
        });
        let (out_rows, embedding) = if self.model.mlp.is_empty() {
            self.graph_group(layer, (gi, a, b), rows_to.as_ref(), &bar, &mut figures)?
        } else {
            self.mlp_group(input, (a, b), &mut figures)?
        };
        let t_write = Instant::now();
        if let Some(writer) = rows_to {
            // The rows the group has not handed on as it finished them.
            let mut writer = writer.into_inner().unwrap_or_else(|e| e.into_inner());
            writer.put(&out_rows[writer.handed()..])?;
            let (bytes, bufs) = writer.finish()?;
            figures.written += bytes;
            self.write_bufs = bufs;
        } else {
            let parts =
                self.output
                    .write_group(gi, (a, b), self.bits, &out_rows, embedding.as_deref())?;
            for (name, size, rows) in parts {
                figures.written += size;
                progress.run.output_files.push(name);
                progress.nodes_written += rows;
            }
        }
        tracing::debug!(
            "layer {l} group {gi}: written in {:.2} s",
            t_write.elapsed().as_secs_f64()
        );
        self.keep_or_give(l, out_rows, embedding);
        figures.add_to(&mut progress.figures[l], t);
        progress.groups_done += 1;
        save_progress(&cfg.work_dir, progress)?;
        bar.finish_and_clear();
        self.groups_here += 1;
        if self.interrupt_after_groups == Some(self.groups_here) {
            return Err(Error::Interrupted(self.groups_here, "groups"));
        }
        offgnn_shared::signals::check()?;
        Ok(())
    }

    /// A graph layer's rows for group `gi`, the destinations `[a, b)`, and
    /// (for the last layer, with embeddings) the group's own input rows.
    fn graph_group(
        &mut self,
        layer: &LayerPass,
        (gi, a, b): (usize, u64, u64),
        rows_to: Option<&Mutex<RowWriter>>,
        bar: &indicatif::ProgressBar,
        figures: &mut GroupFigures,
    ) -> Result<(Vec<f32>, Option<Vec<f32>>)> {
        let (cfg, l, last) = (self.cfg, layer.l, layer.last);
        // The group's edges, unless the last pass (a layer's only
        // group, the one before) left them here.
        let edges = match self.held_edges.take() {
            Some((held, edges)) if held == gi => edges,
            _ => {
                let t_edges = Instant::now();
                let chunks = self.plan.chunks(self.features.rows);
                let (edges, size) =
                    load_group_edges(&cfg.work_dir, gi, (chunks, self.plan.chunk_rows), (a, b))?;
                tracing::debug!(
                    "layer {l} group {gi}: edges loaded in {:.2} s",
                    t_edges.elapsed().as_secs_f64()
                );
                figures.edge_read += size;
                edges
            }
        };
        let t_group = Instant::now();
        let group = match cfg.aggregate {
            Aggregate::Host => graph_layer_group,
            Aggregate::Device => on_device::graph_layer_group,
        };
        let given_rows = Mutex::new(self.held_rows.take());
        let job = GroupJob {
            layer: &self.model.layers[l],
            input: &layer.input,
            engine: self.engine,
            edges: &edges,
            range: (a, b),
            chunk_rows: self.plan.chunk_rows,
            merge: layer.merge,
            device: cfg.device,
            keep_rows: last && cfg.outputs.embeddings,
            given_rows: &given_rows,
            rows_to,
            activate: !last,
            bar,
        };
        let times = &mut figures.times;
        let (rows, h_dst) = group(&job, &mut self.spares, &mut figures.read, times)?;
        tracing::debug!(
            "layer {l} group {gi}: computed in {:.2} s ({:.2} s streaming)",
            t_group.elapsed().as_secs_f64(),
            figures.times.io_wait + figures.times.scatter
        );
        // One group: the next layer's pass is this one's again, and
        // its edges (counted in the group's memory) stay.
        if self.plan.groups.len() == 1 && !last {
            self.held_edges = Some((gi, edges));
        }
        Ok((rows, (last && cfg.outputs.embeddings).then_some(h_dst)))
    }

    /// The MLP's rows for the nodes `[a, b)`, read from `input`, and (with
    /// embeddings) their last hidden layer's.
    fn mlp_group(
        &self,
        input: &Input,
        (a, b): (u64, u64),
        figures: &mut GroupFigures,
    ) -> Result<(Vec<f32>, Option<Vec<f32>>)> {
        let mlp = &self.model.mlp;
        let mut x = Vec::new();
        figures.read += input.read_rows(a, b, &mut x)?;
        let mut h = tensor(&x, (b - a) as i64, self.cfg.device)?;
        let mut before_last = None;
        for (i, (w, bias)) in mlp.iter().enumerate() {
            if i + 1 == mlp.len() {
                before_last = Some(to_vec(&h)?);
            }
            h = h.f_matmul(&w.f_tr()?)?.f_add(bias)?;
            if i + 1 < mlp.len() {
                h = act(ModelKind::Mlp, h);
            }
        }
        Ok((
            to_vec(&h)?,
            before_last.filter(|_| self.cfg.outputs.embeddings),
        ))
    }

    /// Gives a group's buffers back to the pool once written, but for
    /// layer `l`'s output rows where the last layer takes them as its
    /// input (see `held_rows`).
    fn keep_or_give(&mut self, l: usize, out_rows: Vec<f32>, embedding: Option<Vec<f32>>) {
        let hand_on = self.plan.groups.len() == 1
            && l + 2 == self.graph_layers()
            && self.model.mlp.is_empty()
            && self.cfg.outputs.embeddings
            && !self.cfg.hidden_f16;
        if hand_on {
            self.held_rows = Some(out_rows);
        } else {
            self.spares.give(out_rows);
        }
        if let Some(e) = embedding {
            self.spares.give(e);
        }
    }
}

/// What a group's pass read, wrote and spent its time on.
#[derive(Default)]
struct GroupFigures {
    read: u64,
    edge_read: u64,
    written: u64,
    times: StreamTimes,
}

impl GroupFigures {
    /// Adds the group's figures, and its time since `started`, to its
    /// layer's.
    fn add_to(&self, f: &mut LayerFigures, started: Instant) {
        f.passes += 1;
        f.bytes_read += self.read;
        f.edge_bytes_read += self.edge_read;
        f.bytes_written += self.written;
        f.seconds += started.elapsed().as_secs_f64();
        f.io_wait_seconds += self.times.io_wait;
        f.scatter_seconds += self.times.scatter;
    }
}

fn file_sync(path: &Path) -> Result<()> {
    File::open(path)
        .and_then(|f| f.sync_all())
        .map_err(|e| Error::io(path.display(), e))
}
