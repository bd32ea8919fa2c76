//! `trainer infer`: the exported model's exact function on every node of a
//! graph larger than memory, layer by layer over full neighborhoods, with
//! sequential I/O (in the spirit of DiskGNN §5.2's batched packing: read the
//! big file once, front to back, and dispatch each row to where it is
//! needed).
//!
//! Destinations are cut into contiguous groups whose state fits `--memory`
//! (multiples of 1024 nodes, so every group's rows of a layer's output start
//! on a 4 KiB boundary). For each layer and group, the layer's input H(l-1)
//! (the feature file for l = 1, the previous layer's output in the work
//! directory after that) streams through the I/O engine in source chunks,
//! and each chunk's rows are added into the group's accumulators along the
//! group's in-edges from that chunk. The edges are bucketed once per run by
//! (group, source chunk), on disk, in bounded memory. GraphSAGE's mean is a
//! sum and a count; GAT's softmax over in-edges is an online softmax (a
//! running maximum and rescaled sums) seeded with each node's self-loop, so
//! one pass over the sources suffices; a group's own rows come by in that
//! pass too (for GAT the stream starts at the group's first chunk, since a
//! score needs its destination's row), so with one group every layer reads
//! its input exactly once. The layer's dense part then runs on
//! the device, and the group's rows of H(l) go out in one O_DIRECT write;
//! the last layer's go to Parquet under `--out`, whose `_SUCCESS.json`
//! commits the result. A killed run resumes at its last finished group.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use arrow::datatypes::{DataType, Field, Schema};
use offgnn_shared::commit::{self, RunId};
use offgnn_shared::dataset::{Dataset, Split};
use offgnn_shared::io_engine::{AlignedBuf, IoEngine, IoFile, PendingWrite, ReadReq};
use offgnn_shared::npy::DType;
use offgnn_shared::prefetch;
use offgnn_shared::report::human_bytes;
use offgnn_shared::store::Store;
use parquet::file::properties::EnabledStatistics;
use parquet::schema::types::ColumnPath;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use sha2::Digest;
use tch::{Device, Kind, Tensor};

use crate::error::{Error, Result};
use crate::export::{self, ModelCard};
use crate::model::ModelKind;

mod on_device;

/// Groups and chunks are whole multiples of this many nodes: a row of d
/// float32 values times 1024 is a multiple of 4 KiB, so every group's and
/// chunk's rows start on a page of the layer files.
pub const ALIGN_NODES: u64 = 1024;
const PAGE: u64 = 4096;
/// Bytes per request and requests per call of the sequential streams.
const REQUEST: usize = 1 << 20;
const PER_CALL: usize = 8;
/// Chunks the reader thread may have ready ahead of the one in use.
const STREAM_AHEAD: usize = 2;
/// How many edges ahead a scatter asks for its destination rows' cache
/// lines (see [`prefetch`]).
const SCATTER_AHEAD: usize = 8;
/// Groups whose edge files are open at once while the edges are bucketed.
const OPEN_GROUPS: usize = 256;
/// Bytes per write of a hidden layer's rows (a multiple of the page).
const WRITE_PIECE: usize = 32 << 20;
/// Rows per output Parquet file.
const PART_ROWS: usize = 1 << 18;
/// Rows per record batch while a part is encoded.
const OUTPUT_BATCH_ROWS: usize = 8192;
/// Rows per row group of an output part.
const OUTPUT_GROUP_ROWS: usize = 4 * OUTPUT_BATCH_ROWS;
/// Bytes of an output part handed to the store at once.
const OUTPUT_PIECE: usize = 8 << 20;
/// The committed result's summary, written last.
pub const COMMIT: &str = "_SUCCESS.json";

/// Which nodes get a row in the output.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NodeSet {
    All,
    Split(Split),
    /// A `.npy` of node ids.
    File(PathBuf),
}

/// Where a graph layer's neighbor aggregation runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Aggregate {
    /// On the host, in place in the group's accumulators (threads over
    /// disjoint destinations); only the dense part runs on the device.
    #[default]
    Host,
    /// With torch's ops on the run's device, the accumulators there (the
    /// default on CUDA, where the host's random scatter would be the
    /// bottleneck).
    Device,
}

/// The optional output columns (node id and predicted class are always there).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Outputs {
    pub probabilities: bool,
    pub logits: bool,
    pub embeddings: bool,
}

#[derive(Clone, Debug)]
pub struct InferConfig {
    pub model: String,
    pub dataset: String,
    pub out: String,
    pub nodes: NodeSet,
    pub outputs: Outputs,
    pub device: Device,
    /// Host memory the run may use for its working state.
    pub memory: u64,
    pub work_dir: PathBuf,
    pub overwrite: bool,
    /// The graph as the sampler built it: reverse edges added, self-loops kept.
    pub add_reverse_edges: bool,
    pub keep_self_loops: bool,
    /// Keep repeated edges (the sampler's --keep-duplicate-edges).
    pub keep_duplicate_edges: bool,
    /// Rows per source chunk (default: from --memory).
    pub chunk_rows: Option<u64>,
    pub show_progress: bool,
    /// Fail as if killed after this many groups of this process (tests of resume).
    pub interrupt_after_groups: Option<u64>,
    /// Store the hidden layers' outputs in the work directory as float16
    /// (half the disk and I/O; values rounded to nearest even).
    pub hidden_f16: bool,
    pub aggregate: Aggregate,
}

/// One layer's figures.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct LayerFigures {
    pub layer: usize,
    pub in_width: i64,
    pub out_width: i64,
    /// Sequential passes over the layer's input (one per group).
    pub passes: u64,
    /// Bytes of the layer's input read (the feature file or the previous
    /// layer's output), over every pass.
    pub bytes_read: u64,
    /// Bytes of the bucketed edge files read (each group's, once per layer).
    #[serde(default)]
    pub edge_bytes_read: u64,
    pub bytes_written: u64,
    pub seconds: f64,
    /// Of `seconds`: waiting for the next source chunk from the disk.
    pub io_wait_seconds: f64,
    /// Of `seconds`: projecting and scattering source chunks.
    pub scatter_seconds: f64,
    /// Groups done by an earlier, interrupted run.
    pub groups_resumed: u64,
    /// Rows of a source chunk of this layer's stream.
    #[serde(default)]
    pub chunk_rows: u64,
}

/// What `trainer infer` reports, and what `_SUCCESS.json` holds.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct InferSummary {
    pub format_version: u32,
    /// The run whose parts (named `RUN/part-….parquet`) this commit lists.
    pub run_id: String,
    pub model: String,
    pub architecture: ModelKind,
    pub weights_sha256: String,
    pub dataset: String,
    pub dataset_fingerprint: String,
    pub num_nodes: u64,
    pub edges: u64,
    pub nodes_written: u64,
    pub columns: Vec<String>,
    pub files: Vec<String>,
    pub groups: u64,
    pub chunk_rows: u64,
    /// `OMP_WAIT_POLICY` as the run had it (the binary sets `PASSIVE`
    /// unless the caller chose one; empty for libgomp's default).
    pub omp_wait_policy: String,
    pub memory_limit: u64,
    pub memory_planned: u64,
    pub layers: Vec<LayerFigures>,
    pub edge_bucketing_seconds: f64,
    pub seconds: f64,
    pub device: String,
    /// Where the aggregation ran (host for results committed before the
    /// choice existed).
    #[serde(default)]
    pub aggregate: Aggregate,
}

/// The model as layers of plain tensors (on the device).
enum Layer {
    Sage {
        lin_l_w: Tensor,
        lin_l_b: Tensor,
        lin_r_w: Tensor,
    },
    Gat {
        lin_w: Tensor,
        att_src: Tensor,
        att_dst: Tensor,
        res_w: Tensor,
        bias: Tensor,
        heads: i64,
        per_head: i64,
        concat: bool,
    },
}

struct Model {
    card: ModelCard,
    /// Graph layers (empty for the MLP).
    layers: Vec<Layer>,
    /// The MLP's linear layers (weight, bias).
    mlp: Vec<(Tensor, Tensor)>,
    /// Layer widths: input, hidden..., classes.
    widths: Vec<i64>,
}

impl Model {
    fn load(location: &str, device: Device) -> Result<Model> {
        let (card, vs) = export::read(location, device)?;
        let vars = vs.variables();
        let var = |name: String| -> Tensor {
            vars.get(&name)
                .expect("export::read checked every parameter")
                .detach()
        };
        let l = card.num_layers;
        let widths: Vec<i64> = std::iter::once(card.in_channels)
            .chain(std::iter::repeat_n(card.hidden_channels, l - 1))
            .chain(std::iter::once(card.out_channels))
            .collect();
        let mut layers = Vec::new();
        let mut mlp = Vec::new();
        for i in 0..l {
            match card.architecture {
                ModelKind::Sage => layers.push(Layer::Sage {
                    lin_l_w: var(format!("convs.{i}.lin_l.weight")),
                    lin_l_b: var(format!("convs.{i}.lin_l.bias")),
                    lin_r_w: var(format!("convs.{i}.lin_r.weight")),
                }),
                ModelKind::Gat => {
                    let heads = card.heads.unwrap_or(1);
                    let att_src = var(format!("convs.{i}.att_src"));
                    let per_head = att_src.size()[2];
                    layers.push(Layer::Gat {
                        lin_w: var(format!("convs.{i}.lin.weight")),
                        att_dst: var(format!("convs.{i}.att_dst")),
                        att_src,
                        res_w: var(format!("convs.{i}.res.weight")),
                        bias: var(format!("convs.{i}.bias")),
                        heads,
                        per_head,
                        concat: i + 1 < l,
                    })
                }
                ModelKind::Mlp => mlp.push((
                    var(format!("lins.{i}.weight")),
                    var(format!("lins.{i}.bias")),
                )),
            }
        }
        Ok(Model {
            card,
            layers,
            mlp,
            widths,
        })
    }

    /// Floats a destination takes in layer `l` (accumulators, the
    /// projections of its own row, the output, host and device copies), and
    /// the floats a source row of a chunk turns into before it is
    /// scattered.
    fn layer_floats(&self, l: usize) -> (u64, u64) {
        let (d_in, d_out) = (self.widths[l] as u64, self.widths[l + 1] as u64);
        match &self.layers[l] {
            Layer::Sage { .. } => {
                // Sums at the narrower width (twice: host and device), a
                // count, three output copies, and where the layer widens
                // the projection of its own row (narrowing, that goes into
                // the sums).
                let acc = d_in.min(d_out);
                let (own, per_src) = if d_out <= d_in {
                    (0, 2 * d_out)
                } else {
                    (d_out, 0)
                };
                (2 * acc + own + 1 + 3 * d_out, per_src)
            }
            Layer::Gat {
                heads,
                per_head,
                concat,
                ..
            } => {
                let (h, c) = (*heads as u64, *per_head as u64);
                let total = if *concat { h * c } else { c };
                // acc [H, C], max, sum, er and the output rows (which
                // hold res until the softmax is finished into them), all
                // host buffers the group finishes in place, and a second
                // output width for the buffer pool's slack (a buffer an
                // earlier layer sized); the projections (z, el) of the
                // span's rows, kept for the edges that wait on a later
                // destination. A chunk's rows are projected (tensor and
                // copy).
                (2 * h * c + 4 * h + 2 * total, 3 * (h * c + h))
            }
        }
    }
}

/// The activation between layers.
fn act(kind: ModelKind, mut t: Tensor) -> Tensor {
    let _ = match kind {
        ModelKind::Gat => t.elu_(),
        ModelKind::Sage | ModelKind::Mlp => t.relu_(),
    };
    t
}

/// A layer's input: a file of `rows` rows of `width` values from byte
/// `data_offset` on.
#[derive(Clone, Debug)]
struct Input {
    path: PathBuf,
    data_offset: u64,
    rows: u64,
    width: usize,
    dtype: DType,
    /// Chunks in page-locked memory (CUDA): their copies to the device go
    /// at the DMA engine's rate, without a bounce through a staging buffer.
    pinned: bool,
}

impl Input {
    fn row_bytes(&self) -> u64 {
        (self.width * self.dtype.size()) as u64
    }

    fn to_f32(&self, raw: &[u8], out: &mut Vec<f32>) {
        out.clear();
        match self.dtype {
            DType::F16 => out.extend(
                raw.chunks_exact(2)
                    .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32()),
            ),
            _ => out.extend(
                raw.chunks_exact(4)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
            ),
        }
    }

    /// Rows `[a, b)` as float32, read in place.
    fn read_rows(&self, a: u64, b: u64, out: &mut Vec<f32>) -> Result<u64> {
        let mut raw = vec![0u8; ((b - a) * self.row_bytes()) as usize];
        let f = File::open(&self.path).map_err(|e| Error::io(self.path.display(), e))?;
        f.read_exact_at(&mut raw, self.data_offset + a * self.row_bytes())
            .map_err(|e| Error::io(self.path.display(), e))?;
        self.to_f32(&raw, out);
        Ok(raw.len() as u64)
    }

    /// Streams every row once through the I/O engine and hands `each`
    /// chunks of `chunk_rows` rows (the last may be shorter) as float32,
    /// with the chunk's index: chunks `first..` in order, then `0..first`
    /// (a rotation, so that a group's own rows can come first; still one
    /// sequential pass, in two runs). A reader thread reads the next chunks
    /// and converts their bytes straight into the chunks' tensors while
    /// `each` works on this one (two chunks ahead at most, their tensors
    /// recycled). Returns the bytes read: the rows, from the page their
    /// data starts on.
    fn stream(
        &self,
        engine: &IoEngine,
        chunk_rows: u64,
        first: usize,
        times: &mut StreamTimes,
        bar: &indicatif::ProgressBar,
        mut each: impl FnMut(usize, &Chunk) -> Result<()>,
    ) -> Result<u64> {
        let stop = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|scope| {
            // Made inside the scope: if `each` panics, the consumer's ends
            // are dropped as it unwinds, so the reader, blocked on them,
            // ends before the scope waits for it.
            let (full_tx, full_rx) = std::sync::mpsc::sync_channel::<(usize, Chunk)>(STREAM_AHEAD);
            let (free_tx, free_rx) = std::sync::mpsc::channel::<Chunk>();
            let stop = &stop;
            let reader = scope.spawn(move || {
                if self.reads_in_place() {
                    self.read_into_chunks(engine, chunk_rows, first, &full_tx, &free_rx, stop)
                } else {
                    self.read_chunks(engine, chunk_rows, first, full_tx, free_rx, stop)
                }
            });
            let mut outcome = Ok(());
            let mut waited = Instant::now();
            for (c, chunk) in full_rx.iter() {
                times.io_wait += waited.elapsed().as_secs_f64();
                let t = Instant::now();
                if outcome.is_ok() {
                    // SIGINT or SIGTERM: the group ends here, unfinished.
                    outcome = offgnn_shared::signals::check()
                        .map_err(Error::from)
                        .and_then(|()| each(c, &chunk));
                    if outcome.is_err() {
                        stop.store(true, std::sync::atomic::Ordering::Relaxed);
                    }
                }
                times.scatter += t.elapsed().as_secs_f64();
                bar.inc(chunk.rows as u64 * self.row_bytes());
                let _ = free_tx.send(chunk);
                waited = Instant::now();
            }
            drop(free_tx);
            let read = reader.join().expect("the reader thread does not panic")?;
            outcome.map(|()| read)
        })
    }

    /// Whether the stream reads straight into the chunks' memory: float32
    /// rows in this machine's byte order, starting on a float's boundary.
    fn reads_in_place(&self) -> bool {
        self.dtype == DType::F32
            && cfg!(target_endian = "little")
            && self.data_offset.is_multiple_of(4)
    }

    /// The reader side of [`Input::stream`] where the rows need no
    /// conversion: each chunk's bytes are read straight into its memory
    /// (O_DIRECT, whole pages, from the page boundary before its rows), the
    /// next chunk's reads queued before this one is handed on, so the disk
    /// never waits for the hand-over and no byte is copied. A page shared
    /// by two chunks is read once, by the first to need it: the next chunk
    /// in the file gets its bytes of that page copied (a few KB), and the
    /// chunk before `first`, handed on last, the bytes of `first`'s first
    /// page that are its own. At most `STREAM_AHEAD + 2` chunks exist, as
    /// the memory plan counts them.
    fn read_into_chunks(
        &self,
        engine: &IoEngine,
        chunk_rows: u64,
        first: usize,
        full: &std::sync::mpsc::SyncSender<(usize, Chunk)>,
        free: &std::sync::mpsc::Receiver<Chunk>,
        stop: &std::sync::atomic::AtomicBool,
    ) -> Result<u64> {
        let file = engine.open(&self.path)?;
        let rb = self.row_bytes();
        let end = self.data_offset + self.rows * rb;
        // Whole pages up to the last one the rows fill, read directly; the
        // bytes after it through the page cache.
        let direct_end = if file.is_direct() {
            end / PAGE * PAGE
        } else {
            end
        };
        let chunks = self.rows.div_ceil(chunk_rows) as usize;
        let order: Vec<usize> = (first..chunks).chain(0..first).collect();
        let stopped = || stop.load(std::sync::atomic::Ordering::Relaxed);
        let mut made = 0;
        let mut read = 0u64;
        // The next chunk's bytes of the page this one ends in, and the
        // bytes of chunk `first`'s first page before it.
        let (mut carry, mut wrap) = (Vec::new(), Vec::new());
        let mut in_flight = std::collections::VecDeque::new();
        let mut finish = |(span, pending): (
            ChunkSpan,
            offgnn_shared::io_engine::PendingRead<'_, Chunk>,
        )|
         -> Result<()> {
            let (n, mut chunk) = pending.wait();
            read += n?;
            let lead = chunk.page_lead();
            let page = span.s / PAGE * PAGE;
            let mem = offgnn_shared::io_engine::ReadTarget::target(&mut chunk);
            // The bytes past the last whole page, through the page cache.
            let (b0, b1) = (span.read_from.max(direct_end), span.read_to.min(end));
            if b0 < b1 {
                let f = File::open(&self.path).map_err(|e| Error::io(self.path.display(), e))?;
                f.read_exact_at(&mut mem[(b0 - page) as usize..(b1 - page) as usize], b0)
                    .map_err(|e| Error::io(self.path.display(), e))?;
                read += b1 - b0;
            }
            if span.head_carried {
                let at = (span.s - page) as usize;
                mem[at..at + carry.len()].copy_from_slice(&carry);
            }
            if span.tail_wrapped {
                let at = (span.e / PAGE * PAGE - page) as usize;
                mem[at..at + wrap.len()].copy_from_slice(&wrap);
            }
            if span.c == first && first > 0 {
                wrap = mem[..(span.s - page) as usize].to_vec();
            }
            carry.clear();
            if span.c + 1 < chunks && !span.tail_wrapped {
                let to = span.e.next_multiple_of(PAGE).min(end);
                carry.extend_from_slice(&mem[(span.e - page) as usize..(to - page) as usize]);
            }
            // On a float's boundary: the memory's start is, and so are the
            // data offset and the rows (`reads_in_place`).
            debug_assert!((lead + (span.s - page) as usize).is_multiple_of(4));
            chunk.start = (lead + (span.s - page) as usize) / 4;
            chunk.rows = ((span.e - span.s) / rb) as usize;
            if !stopped() {
                // A closed channel means the consumer stopped on an error.
                let _ = full.send((span.c, chunk));
            }
            Ok(())
        };
        for (i, &c) in order.iter().enumerate() {
            if stopped() {
                break;
            }
            let s = self.data_offset + c as u64 * chunk_rows * rb;
            let e = (self.data_offset + ((c as u64 + 1) * chunk_rows).min(self.rows) * rb).min(end);
            let head_carried = i > 0 && order[i - 1] + 1 == c && !s.is_multiple_of(PAGE);
            let tail_wrapped = first > 0 && c + 1 == first && !e.is_multiple_of(PAGE);
            let page = s / PAGE * PAGE;
            let read_from = if head_carried {
                s.next_multiple_of(PAGE)
            } else {
                page
            };
            let read_to = if tail_wrapped {
                e / PAGE * PAGE
            } else {
                e.next_multiple_of(PAGE)
            }
            .max(read_from);
            let span = ChunkSpan {
                c,
                s,
                e,
                read_from,
                read_to,
                head_carried,
                tail_wrapped,
            };
            let chunk = match free.try_recv() {
                Ok(chunk) => chunk,
                Err(_) if made < STREAM_AHEAD + 2 => {
                    made += 1;
                    Chunk::new(chunk_rows as usize, self.width, self.pinned)?
                }
                Err(_) => match free.recv() {
                    Ok(chunk) => chunk,
                    // The consumer is gone.
                    Err(_) => break,
                },
            };
            let direct_to = read_to.min(direct_end).max(read_from);
            let reqs = ReadReq::span((read_from, direct_to), REQUEST, (read_from - page) as usize);
            in_flight.push_back((span, engine.read_behind(&file, &reqs, chunk)?));
            if in_flight.len() == 2 {
                finish(in_flight.pop_front().expect("two in flight"))?;
            }
        }
        while let Some(next) = in_flight.pop_front() {
            finish(next)?;
        }
        Ok(read)
    }

    /// The reader side of [`Input::stream`]: sends whole chunks in the
    /// stream's order. The rows from chunk `first` on are read first, from
    /// the page that chunk starts on; the bytes of that page before the
    /// chunk belong to chunk `first - 1` and are kept until the second run
    /// (from the page the data starts on up to that page) reaches them, so
    /// no byte is read twice.
    fn read_chunks(
        &self,
        engine: &IoEngine,
        chunk_rows: u64,
        first: usize,
        full: std::sync::mpsc::SyncSender<(usize, Chunk)>,
        free: std::sync::mpsc::Receiver<Chunk>,
        stop: &std::sync::atomic::AtomicBool,
    ) -> Result<u64> {
        let file = engine.open(&self.path)?;
        let data = self.data_offset;
        let end = data + self.rows * self.row_bytes();
        let split = (data + first as u64 * chunk_rows * self.row_bytes()).min(end);
        let (data_page, split_page) = (data / PAGE * PAGE, split / PAGE * PAGE);
        // Two calls' room: the next is read while this one's bytes are
        // converted into the chunks (see [`IoEngine::read_span`]).
        let mut buf = AlignedBuf::new(2 * REQUEST * PER_CALL);
        let from = split_page.max(data_page);
        // The first run's bytes before chunk `first`.
        let lead = (split - from) as usize;
        let mut chunker = Chunker {
            input: self,
            chunk_rows: chunk_rows as usize,
            filling: None,
            filled: 0,
            odd: Vec::new(),
            chunk: first,
            skip: lead,
            full: &full,
            free: &free,
            stop,
            failed: None,
        };
        let mut carried = Vec::with_capacity(lead);
        let mut read = read_range(
            engine,
            &file,
            &self.path,
            (from, end),
            &mut buf,
            stop,
            |bytes| {
                let take = (lead - carried.len()).min(bytes.len());
                carried.extend_from_slice(&bytes[..take]);
                chunker.feed(bytes);
            },
        )?;
        chunker.flush();
        if first > 0 {
            chunker.chunk = 0;
            chunker.skip = (data - data_page) as usize;
            read += read_range(
                engine,
                &file,
                &self.path,
                (data_page, from),
                &mut buf,
                stop,
                |bytes| chunker.feed(bytes),
            )?;
            chunker.feed(&carried);
            chunker.flush();
        }
        match chunker.failed {
            Some(e) => Err(e),
            None => Ok(read),
        }
    }
}

/// Where a chunk's rows lie in its layer's file (`[s, e)`), the bytes
/// the stream reads for it (`[read_from, read_to)`, whole pages, clipped
/// to the rows' end), and which of its bytes come from another chunk's
/// pages instead: its first partial page (read for the chunk before it)
/// or its last (read for chunk `first`, at the stream's start).
struct ChunkSpan {
    c: usize,
    s: u64,
    e: u64,
    read_from: u64,
    read_to: u64,
    head_carried: bool,
    tail_wrapped: bool,
}

/// A chunk of a layer's input rows as float32, in CPU memory that the
/// reader reads (or converts) the bytes into as they arrive: the matmuls
/// take its tensor as it is (a first layer's pass is tens of GB, each copy
/// seconds of CPU).
struct Chunk {
    /// Flat float32 memory: the capacity's values and three pages more
    /// (to start a direct read on a page, and for the partial pages at
    /// either end of its rows).
    raw: Tensor,
    /// Where the rows start in `raw`, in values.
    start: usize,
    rows: usize,
    width: usize,
    capacity: usize,
}

impl Chunk {
    /// Values of slack past the capacity (see `raw`).
    const SLACK: usize = 3 * PAGE as usize / 4;

    /// A chunk of `capacity` rows, in page-locked memory if `pinned` (its
    /// copies to the device are blocking, so it is free again once `each`
    /// has returned).
    fn new(capacity: usize, width: usize, pinned: bool) -> Result<Chunk> {
        let values = capacity * width + Self::SLACK;
        let raw = if pinned {
            crate::cuda::pinned(values * 4)?.f_view_dtype(Kind::Float)?
        } else {
            Tensor::f_empty([values as i64], (Kind::Float, Device::Cpu))?
        };
        Ok(Chunk {
            raw,
            start: 0,
            rows: 0,
            width,
            capacity,
        })
    }

    /// The chunk's rows, a view of its memory (no copy).
    fn tensor(&self) -> Tensor {
        self.raw
            .narrow(0, self.start as i64, (self.rows * self.width) as i64)
            .view([self.rows as i64, self.width as i64])
    }

    /// The chunk's rows' values.
    fn values(&self) -> &[f32] {
        // Only `&mut self` methods write the memory; the views `tensor`
        // hands out are only read.
        &cpu_values(&self.raw, self.start + self.rows * self.width)[self.start..]
    }

    /// The capacity's bytes from the memory's start, for the converting
    /// reader to write (the rows then start there).
    fn bytes_mut(&mut self) -> &mut [u8] {
        self.start = 0;
        let len = self.capacity * self.width * 4;
        // SAFETY: `raw` holds more than `len` bytes, contiguous from its data
        // pointer; `&mut self` makes this the only access.
        unsafe { std::slice::from_raw_parts_mut(self.raw.data_ptr().cast::<u8>(), len) }
    }

    /// Bytes from the memory's start to its first page boundary.
    fn page_lead(&self) -> usize {
        (self.raw.data_ptr() as usize).next_multiple_of(PAGE as usize)
            - self.raw.data_ptr() as usize
    }
}

// SAFETY: `raw` owns its memory (a CPU or page-locked allocation that
// moving the struct does not move), freed only when the chunk is dropped;
// `target` always returns the same window of it, and nothing else touches
// the memory while the engine holds the chunk.
unsafe impl offgnn_shared::io_engine::ReadTarget for Chunk {
    /// From the memory's first page boundary: the capacity's bytes and two
    /// pages (a span's partial first and last page).
    fn target(&mut self) -> &mut [u8] {
        let len = self.capacity * self.width * 4 + 2 * PAGE as usize;
        let at = self.page_lead();
        // SAFETY: `raw` holds `capacity * width * 4 + 3 * PAGE` bytes and
        // `at < PAGE`, so the window lies inside it.
        unsafe { std::slice::from_raw_parts_mut(self.raw.data_ptr().cast::<u8>().add(at), len) }
    }
}

/// The first `len` values of a contiguous CPU float32 tensor, borrowed
/// with it. Callers hold the tensor alone and write it only through
/// `&mut` (or not while the slice lives).
fn cpu_values(t: &Tensor, len: usize) -> &[f32] {
    assert!(
        t.device() == Device::Cpu
            && t.kind() == Kind::Float
            && t.is_contiguous()
            && t.numel() >= len,
        "a contiguous CPU float32 tensor of at least {len} values"
    );
    if len == 0 {
        return &[];
    }
    // SAFETY: checked just above: `len` float32 values lie contiguously
    // from the tensor's data pointer, in memory the tensor keeps alive
    // while `t` is borrowed.
    unsafe { std::slice::from_raw_parts(t.data_ptr().cast::<f32>(), len) }
}

/// A reused CPU float32 buffer for a chunk's matmul product: a fresh one
/// per chunk costs page faults and clearing, more than the matmul itself
/// on a narrow layer.
#[derive(Default)]
struct Scratch {
    t: Option<Tensor>,
}

impl Scratch {
    /// `x · w` into the buffer; its values, row after row of `w`'s width.
    fn product(&mut self, x: &Tensor, w: &Tensor) -> Result<&[f32]> {
        let (rows, width) = (x.size()[0], w.size()[1]);
        let n = rows * width;
        if self.t.as_ref().is_none_or(|t| t.numel() < n as usize) {
            self.t = Some(Tensor::f_empty([n], (Kind::Float, Device::Cpu))?);
        }
        let t = self.t.as_ref().expect("allocated above");
        matmul_into(x, w, &mut t.narrow(0, 0, n).view([rows, width]))?;
        Ok(cpu_values(t, n as usize))
    }
}

/// `x · w` into `out` (on the CPU): on the CPU with no intermediate, else
/// made on `x`'s device and copied over.
fn matmul_into(x: &Tensor, w: &Tensor, out: &mut Tensor) -> Result<()> {
    if x.device() == Device::Cpu {
        let _ = x.f_matmul_out(out, w)?;
    } else {
        out.f_copy_(&x.f_matmul(w)?)?;
    }
    Ok(())
}

/// `x · w` written straight into `dst` (`x`'s rows times `w`'s width
/// values, row after row).
fn product_into(x: &Tensor, w: &Tensor, dst: &mut [f32]) -> Result<()> {
    let (rows, width) = (x.size()[0], w.size()[1]);
    if dst.is_empty() {
        return Ok(());
    }
    on_values(dst, &[rows, width], |out| matmul_into(x, w, out))
}

/// Runs `f` on a CPU float32 tensor of `shape` (row-major) over `values`,
/// with no copy: where a group's rows are gigabytes, torch's ops write
/// straight into buffers already paged in. `f` must not keep the tensor.
fn on_values<T>(
    values: &mut [f32],
    shape: &[i64],
    f: impl FnOnce(&mut Tensor) -> Result<T>,
) -> Result<T> {
    assert_eq!(
        shape.iter().product::<i64>(),
        values.len() as i64,
        "the shape covers the values"
    );
    let mut strides = vec![1i64; shape.len()];
    for i in (1..shape.len()).rev() {
        strides[i - 1] = strides[i] * shape[i];
    }
    // SAFETY: `values` holds exactly the shape's float32 values (checked
    // above), contiguously in row-major order, and is borrowed mutably for
    // this call: the tensor, dropped at its end (`f` keeps none), is the
    // only access to them meanwhile.
    let mut t = unsafe {
        Tensor::f_from_blob(
            values.as_mut_ptr().cast::<u8>(),
            shape,
            &strides,
            Kind::Float,
            Device::Cpu,
        )?
    };
    f(&mut t)
}

/// Cuts a run of bytes into chunks of rows, converting them into each
/// chunk's tensor as they come, and sends each chunk on with its index.
struct Chunker<'a> {
    input: &'a Input,
    chunk_rows: usize,
    /// The chunk being filled, and the input bytes written into it so far.
    filling: Option<Chunk>,
    filled: usize,
    /// An element's bytes split between two runs of bytes.
    odd: Vec<u8>,
    chunk: usize,
    /// Bytes still to drop at the front of the run (before its first row).
    skip: usize,
    full: &'a std::sync::mpsc::SyncSender<(usize, Chunk)>,
    free: &'a std::sync::mpsc::Receiver<Chunk>,
    stop: &'a std::sync::atomic::AtomicBool,
    /// A chunk's tensor that could not be allocated: the stream stops.
    failed: Option<Error>,
}

impl Chunker<'_> {
    fn feed(&mut self, mut bytes: &[u8]) {
        let elem = self.input.dtype.size();
        let s = self.skip.min(bytes.len());
        bytes = &bytes[s..];
        self.skip -= s;
        if !self.odd.is_empty() {
            let take = (elem - self.odd.len()).min(bytes.len());
            self.odd.extend_from_slice(&bytes[..take]);
            bytes = &bytes[take..];
            if self.odd.len() == elem {
                let odd = std::mem::take(&mut self.odd);
                self.put(&odd);
            }
        }
        let whole = bytes.len() / elem * elem;
        self.put(&bytes[..whole]);
        self.odd.extend_from_slice(&bytes[whole..]);
    }

    /// Converts whole elements into the chunks.
    fn put(&mut self, mut bytes: &[u8]) {
        let chunk_bytes = self.chunk_rows * self.input.row_bytes() as usize;
        let elem = self.input.dtype.size();
        while !bytes.is_empty() {
            if self.stop.load(std::sync::atomic::Ordering::Relaxed) || self.failed.is_some() {
                return;
            }
            if self.filling.is_none() {
                let chunk = match self.free.try_recv() {
                    Ok(c) => Ok(c),
                    Err(_) => Chunk::new(self.chunk_rows, self.input.width, self.input.pinned),
                };
                match chunk {
                    Ok(c) => self.filling = Some(c),
                    Err(e) => {
                        self.failed = Some(e);
                        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
                        return;
                    }
                }
            }
            let take = (chunk_bytes - self.filled).min(bytes.len());
            let chunk = self.filling.as_mut().expect("a chunk is filling");
            let out = &mut chunk.bytes_mut()[self.filled / elem * 4..][..take / elem * 4];
            match self.input.dtype {
                DType::F16 => {
                    for (o, b) in out.chunks_exact_mut(4).zip(bytes[..take].chunks_exact(2)) {
                        o.copy_from_slice(
                            &half::f16::from_le_bytes([b[0], b[1]])
                                .to_f32()
                                .to_ne_bytes(),
                        );
                    }
                }
                _ if cfg!(target_endian = "little") => out.copy_from_slice(&bytes[..take]),
                _ => {
                    for (o, b) in out.chunks_exact_mut(4).zip(bytes[..take].chunks_exact(4)) {
                        o.copy_from_slice(
                            &f32::from_le_bytes([b[0], b[1], b[2], b[3]]).to_ne_bytes(),
                        );
                    }
                }
            }
            self.filled += take;
            bytes = &bytes[take..];
            if self.filled == chunk_bytes {
                self.flush();
            }
        }
    }

    /// Sends the rows gathered so far as one chunk (the last of a run may
    /// be short).
    fn flush(&mut self) {
        let filled = std::mem::take(&mut self.filled);
        let Some(mut chunk) = self.filling.take() else {
            return;
        };
        if filled == 0 || self.stop.load(std::sync::atomic::Ordering::Relaxed) {
            self.filling = Some(chunk);
            return;
        }
        chunk.rows = filled / self.input.row_bytes() as usize;
        // A closed channel means the consumer stopped on an error.
        let _ = self.full.send((self.chunk, chunk));
        self.chunk += 1;
    }
}

/// Reads `path`'s bytes `[from, to)` front to back (`from` on a page) in
/// requests of `REQUEST` bytes, `PER_CALL` of them queued together, and
/// hands each call's bytes to `each`; on an O_DIRECT file a partial last
/// page is read buffered. Ends early once `stop` is set (the consumer
/// failed or was signalled). Returns the bytes read.
fn read_range(
    engine: &IoEngine,
    file: &offgnn_shared::io_engine::IoFile,
    path: &Path,
    (from, to): (u64, u64),
    buf: &mut AlignedBuf,
    stop: &std::sync::atomic::AtomicBool,
    mut each: impl FnMut(&[u8]),
) -> Result<u64> {
    let stopped = || stop.load(std::sync::atomic::Ordering::Relaxed);
    let direct_to = if file.is_direct() {
        (to / PAGE * PAGE).max(from)
    } else {
        to
    };
    let mut at = from;
    if !stopped() {
        at += engine.read_span(file, (from, direct_to), REQUEST, PER_CALL, buf, |bytes| {
            each(bytes);
            !stopped()
        })?;
    }
    if at < to && !stopped() {
        let mut tail = vec![0u8; (to - at) as usize];
        let f = File::open(path).map_err(|e| Error::io(path.display(), e))?;
        f.read_exact_at(&mut tail, at)
            .map_err(|e| Error::io(path.display(), e))?;
        each(&tail);
        at = to;
    }
    Ok(at - from)
}

/// Where a stream's time went: waiting for the disk, and in the work on
/// each chunk (projection and scatter).
#[derive(Clone, Copy, Debug, Default)]
struct StreamTimes {
    io_wait: f64,
    scatter: f64,
}

/// The plan: groups of destinations and the source chunk size (that of
/// the edge buckets), and per layer the buckets a chunk of its stream
/// takes (see [`chunk_merges`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Plan {
    groups: Vec<(u64, u64)>,
    chunk_rows: u64,
    planned_bytes: u64,
    #[serde(default)]
    merges: Vec<u64>,
}

impl Plan {
    fn chunks(&self, n: u64) -> usize {
        n.div_ceil(self.chunk_rows) as usize
    }
}

/// Where an interrupted run stands; `key` says which run it belongs to.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct Progress {
    key: String,
    /// The run whose parts these are: a resumed run keeps its id.
    #[serde(default)]
    run_id: String,
    edges_ready: bool,
    /// Layers finished.
    layer: usize,
    /// Groups of layer `layer` finished.
    groups_done: usize,
    figures: Vec<LayerFigures>,
    edge_bucketing_seconds: f64,
    output_files: Vec<String>,
    nodes_written: u64,
}

const PROGRESS: &str = "progress.json";

fn save_progress(work: &Path, p: &Progress) -> Result<()> {
    let tmp = work.join(format!("{PROGRESS}.partial"));
    let bytes = serde_json::to_vec_pretty(p).expect("progress serializes");
    std::fs::write(&tmp, bytes)
        .and_then(|()| File::open(&tmp)?.sync_all())
        .map_err(|e| Error::io(tmp.display(), e))?;
    std::fs::rename(&tmp, work.join(PROGRESS)).map_err(|e| Error::io(work.display(), e))
}

/// The in-edges of each destination, as `(source, destination)` pairs, in
/// the graph the sampler sampled from.
fn for_each_edge(
    ds: &Dataset,
    cfg: &InferConfig,
    mut f: impl FnMut(u32, u32) -> Result<()>,
) -> Result<()> {
    let mut failure = None;
    let streamed = ds.edges.for_each_chunk(1 << 20, |src, dst| {
        for (&s, &d) in src.iter().zip(dst) {
            let (s, d) = (s as u32, d as u32);
            if s == d && !cfg.keep_self_loops {
                continue;
            }
            let reverse = cfg.add_reverse_edges && s != d;
            if let Err(e) = f(s, d).and_then(|()| if reverse { f(d, s) } else { Ok(()) }) {
                failure = Some(e);
                // Stops the stream; the error that counts is kept above.
                return Err(offgnn_shared::Error::io(
                    ds.edges.path(),
                    std::io::Error::other("stopped"),
                ));
            }
        }
        Ok(())
    });
    match failure {
        Some(e) => Err(e),
        None => Ok(streamed?),
    }
}

/// What a destination group costs in one memory, and how much of that
/// memory groups may use.
#[derive(Clone, Copy, Debug)]
struct Budget {
    node_bytes: u64,
    edge_bytes: u64,
    bytes: u64,
}

impl Budget {
    fn of(&self, nodes: u64, edges: u64) -> u64 {
        nodes * self.node_bytes + edges * self.edge_bytes
    }
}

/// Cuts the destinations into groups whose working state fits the host's
/// budget (each node costs `node_bytes`, each of its in-edges 16 bytes: the
/// pairs, and their sorted copy while bucketing) and, with the aggregation
/// on a CUDA device, that device's (`device`, with the device's index).
/// Returns the groups and the largest group's cost on the host.
fn plan_groups(
    indegree: &[u32],
    host: Budget,
    device: Option<(Budget, usize)>,
) -> Result<(Vec<(u64, u64)>, u64)> {
    let n = indegree.len() as u64;
    let mut groups = Vec::new();
    let (mut start, mut cost, mut cost_dev, mut largest) = (0u64, 0u64, 0u64, 0u64);
    let mut a = 0u64;
    while a < n {
        let b = (a + ALIGN_NODES).min(n);
        let edges: u64 = indegree[a as usize..b as usize]
            .iter()
            .map(|&d| d as u64)
            .sum();
        let block = host.of(b - a, edges);
        if block > host.bytes {
            return Err(Error::InvalidArgument(format!(
                "--memory leaves {} for destination groups, but nodes {a}..{b} alone need {} ({} per node, 16 bytes per in-edge); give --memory at least {} more",
                human_bytes(host.bytes),
                human_bytes(block),
                human_bytes(host.node_bytes),
                human_bytes(block - host.bytes)
            )));
        }
        let block_dev = device.map_or(0, |(d, _)| d.of(b - a, edges));
        if let Some((d, index)) = device.filter(|(d, _)| block_dev > d.bytes) {
            return Err(Error::InvalidArgument(format!(
                "cuda:{index} has {} free for destination groups, but nodes {a}..{b} alone need {} there ({} per node); aggregate on the host (--aggregate host)",
                human_bytes(d.bytes),
                human_bytes(block_dev),
                human_bytes(d.node_bytes)
            )));
        }
        let over_dev = device.is_some_and(|(d, _)| cost_dev + block_dev > d.bytes);
        if cost + block > host.bytes || over_dev {
            groups.push((start, a));
            start = a;
            cost = 0;
            cost_dev = 0;
        }
        cost += block;
        cost_dev += block_dev;
        largest = largest.max(cost);
        a = b;
    }
    if start < n || groups.is_empty() {
        groups.push((start, n));
    }
    Ok((groups, largest))
}

fn edge_file(work: &Path, g: usize) -> PathBuf {
    work.join(format!("edges-{g:06}.bin"))
}

/// Buckets the edges by (group, source chunk), once per run: a pass that
/// appends each edge to its group's file (at most `OPEN_GROUPS` files open;
/// more groups take more passes), then each group's file sorted by
/// (destination, source), duplicates dropped (the sampler samples distinct
/// neighbors), and stably regrouped by source chunk, with the chunk offsets
/// after the pairs. Returns the distinct edges.
fn bucket_edges(ds: &Dataset, cfg: &InferConfig, plan: &Plan) -> Result<u64> {
    let n = ds.num_nodes;
    let chunks = plan.chunks(n);
    let group_of = |d: u32| -> usize { plan.groups.partition_point(|&(_, end)| end <= d as u64) };
    let pb = offgnn_shared::progress::bar_if(
        cfg.show_progress,
        plan.groups.len() as u64,
        "bucketing edges",
        "groups",
    );
    let mut total = 0u64;
    for first in (0..plan.groups.len()).step_by(OPEN_GROUPS) {
        let last = (first + OPEN_GROUPS).min(plan.groups.len());
        let mut writers = (first..last)
            .map(|g| {
                let path = edge_file(&cfg.work_dir, g);
                File::create(&path)
                    .map(|f| BufWriter::with_capacity(1 << 16, f))
                    .map_err(|e| Error::io(path.display(), e))
            })
            .collect::<Result<Vec<_>>>()?;
        for_each_edge(ds, cfg, |s, d| {
            let g = group_of(d);
            if (first..last).contains(&g) {
                let w = &mut writers[g - first];
                w.write_all(&s.to_le_bytes())
                    .and_then(|()| w.write_all(&d.to_le_bytes()))
                    .map_err(|e| Error::io(edge_file(&cfg.work_dir, g).display(), e))?;
            }
            Ok(())
        })?;
        for (i, w) in writers.into_iter().enumerate() {
            let path = edge_file(&cfg.work_dir, first + i);
            w.into_inner()
                .map_err(|e| Error::io(path.display(), e.into_error()))?;
        }
        for g in first..last {
            let path = edge_file(&cfg.work_dir, g);
            let mut pairs = read_pairs(&path)?;
            pairs.par_sort_unstable_by_key(|&(s, d)| ((d as u64) << 32) | s as u64);
            if !cfg.keep_duplicate_edges {
                pairs.dedup();
            }
            // Stable regrouping by source chunk keeps each bucket sorted by
            // destination.
            let mut offsets = vec![0u64; chunks + 1];
            for &(s, _) in &pairs {
                offsets[(s as u64 / plan.chunk_rows) as usize + 1] += 1;
            }
            for c in 0..chunks {
                offsets[c + 1] += offsets[c];
            }
            let mut at = offsets.clone();
            let mut bucketed = vec![(0u32, 0u32); pairs.len()];
            for &(s, d) in &pairs {
                let c = (s as u64 / plan.chunk_rows) as usize;
                bucketed[at[c] as usize] = (s, d);
                at[c] += 1;
            }
            let mut bytes = Vec::with_capacity(pairs.len() * 8 + offsets.len() * 8);
            for (s, d) in bucketed {
                bytes.extend_from_slice(&s.to_le_bytes());
                bytes.extend_from_slice(&d.to_le_bytes());
            }
            for o in &offsets {
                bytes.extend_from_slice(&o.to_le_bytes());
            }
            std::fs::write(&path, bytes).map_err(|e| Error::io(path.display(), e))?;
            total += pairs.len() as u64;
            pb.inc(1);
        }
    }
    pb.finish_and_clear();
    Ok(total)
}

fn read_pairs(path: &Path) -> Result<Vec<(u32, u32)>> {
    let bytes = std::fs::read(path).map_err(|e| Error::io(path.display(), e))?;
    Ok(bytes
        .chunks_exact(8)
        .map(|b| {
            (
                u32::from_le_bytes([b[0], b[1], b[2], b[3]]),
                u32::from_le_bytes([b[4], b[5], b[6], b[7]]),
            )
        })
        .collect())
}

/// A group's bucketed edges: pairs, and where each chunk's bucket starts.
struct GroupEdges {
    src: Vec<u32>,
    dst: Vec<u32>,
    offsets: Vec<u64>,
    /// The same edges by destination, made once where a layer pulls (see
    /// [`GroupEdges::by_destination`]) and kept with them.
    by_dst: std::sync::OnceLock<(Vec<u64>, Vec<u32>)>,
    /// Each destination's in-degree, made once where a layer averages (see
    /// [`GroupEdges::in_degrees`]) and kept with them.
    in_degree: std::sync::OnceLock<Vec<f32>>,
}

impl GroupEdges {
    /// Where the edges of `bucket` into destinations `[lo, hi)` lie: a
    /// range of indices, the bucket being sorted by destination.
    fn reaching(&self, bucket: usize, (lo, hi): (u64, u64)) -> std::ops::Range<usize> {
        let (f0, f1) = (
            self.offsets[bucket] as usize,
            self.offsets[bucket + 1] as usize,
        );
        let dst = &self.dst[f0..f1];
        f0 + dst.partition_point(|&t| (t as u64) < lo)
            ..f0 + dst.partition_point(|&t| (t as u64) < hi)
    }

    /// A group's in-edges by destination (compressed rows): the sources of
    /// destination `a + i` are `src[starts[i]..starts[i + 1]]`, in the
    /// buckets' order: a counting sort of the pairs, made on the first
    /// call (the group's range `[a, b)`) and kept.
    fn by_destination(&self, (a, b): (u64, u64)) -> &(Vec<u64>, Vec<u32>) {
        let made = self.by_dst.get_or_init(|| {
            let started = Instant::now();
            let g = (b - a) as usize;
            let buckets = self.offsets.len() - 1;
            // Ranges of destinations, a few a thread: each takes its edges
            // out of every bucket (sorted by destination) and writes only
            // its own counts and sources, where one pass over every edge
            // wrote both at random on one thread (0.57 s on the bench graph
            // here, before the first layer's stream).
            let step = g.div_ceil(rayon::current_num_threads() * 4).max(1);
            let range = |r: usize| (a + (r * step) as u64, a + ((r + 1) * step).min(g) as u64);
            let mut starts = vec![0u64; g + 1];
            starts[1..]
                .par_chunks_mut(step)
                .enumerate()
                .for_each(|(r, counts)| {
                    let (lo, hi) = range(r);
                    for c in 0..buckets {
                        for &t in &self.dst[self.reaching(c, (lo, hi))] {
                            counts[(t as u64 - lo) as usize] += 1;
                        }
                    }
                });
            for i in 0..g {
                starts[i + 1] += starts[i];
            }
            let mut src = vec![0u32; self.src.len()];
            let mut parts = Vec::with_capacity(g.div_ceil(step));
            let mut rest = src.as_mut_slice();
            for r in 0..g.div_ceil(step) {
                let (lo, hi) = range(r);
                let (i0, i1) = ((lo - a) as usize, (hi - a) as usize);
                let (mine, tail) = rest.split_at_mut((starts[i1] - starts[i0]) as usize);
                parts.push((r, mine));
                rest = tail;
            }
            parts.into_par_iter().for_each(|(r, mine)| {
                let (lo, hi) = range(r);
                let i0 = (lo - a) as usize;
                let mut next: Vec<u64> = starts[i0..(hi - a) as usize]
                    .iter()
                    .map(|s| s - starts[i0])
                    .collect();
                for c in 0..buckets {
                    let k = self.reaching(c, (lo, hi));
                    for (&u, &t) in self.src[k.clone()].iter().zip(&self.dst[k]) {
                        let at = &mut next[(t as u64 - lo) as usize];
                        mine[*at as usize] = u;
                        *at += 1;
                    }
                }
            });
            tracing::debug!(
                "edges by destination in {:.2} s",
                started.elapsed().as_secs_f64()
            );
            (starts, src)
        });
        assert_eq!(made.0.len() as u64, b - a + 1, "the group's range, as made");
        made
    }

    /// The in-degree of each destination of the group's range `[a, b)`,
    /// counted on the first call and kept: with one group its edges stay
    /// from layer to layer, and counting 32M edges took a tenth of a
    /// second a layer.
    fn in_degrees(&self, (a, b): (u64, u64)) -> &[f32] {
        let made = self.in_degree.get_or_init(|| match self.by_dst.get() {
            // A hidden layer pulled by destination: the counts are there.
            Some((starts, _)) => starts
                .par_windows(2)
                .map(|s| (s[1] - s[0]) as f32)
                .collect(),
            None => {
                let mut count = vec![0f32; (b - a) as usize];
                for &t in &self.dst {
                    count[(t as u64 - a) as usize] += 1.0;
                }
                count
            }
        });
        assert_eq!(made.len() as u64, b - a, "the group's range, as made");
        made
    }
}

/// Encodes hidden rows' values into `dst` as float16 or float32
/// (little-endian), on the thread pool; returns the bytes written.
fn encode_rows(values: &[f32], f16: bool, dst: &mut [u8]) -> usize {
    let elem = if f16 { 2 } else { 4 };
    let bytes = values.len() * elem;
    // Slices of 64 KiB of values a task.
    const TASK: usize = 1 << 14;
    dst[..bytes]
        .par_chunks_mut(TASK * elem)
        .zip(values.par_chunks(TASK))
        .for_each(|(dst, values)| {
            if f16 {
                for (d, v) in dst.chunks_exact_mut(2).zip(values) {
                    d.copy_from_slice(&half::f16::from_f32(*v).to_le_bytes());
                }
            } else {
                for (d, v) in dst.chunks_exact_mut(4).zip(values) {
                    d.copy_from_slice(&v.to_le_bytes());
                }
            }
        });
    bytes
}

/// A hidden layer's output rows on their way to the work directory, handed
/// on in node order (a group's rows at once, or a pull's as it finishes
/// them, so the disk takes them while it computes the next), encoded into
/// pieces of one buffer's size, each written behind while the next is
/// filled: two buffers, reused from group to group (a group's rows can be
/// gigabytes, and fresh pages cost more than the copy).
struct RowWriter<'a> {
    engine: &'a IoEngine,
    file: Arc<IoFile>,
    f16: bool,
    /// Buffers free to fill; the one being filled, and its bytes so far.
    free: Vec<AlignedBuf>,
    filling: Option<(AlignedBuf, usize)>,
    in_flight: std::collections::VecDeque<PendingWrite>,
    /// Where the piece being filled goes in the file (page-aligned).
    offset: u64,
    /// Values handed on so far, and bytes written.
    handed: usize,
    written: u64,
}

impl<'a> RowWriter<'a> {
    /// A writer of rows from byte `offset` of `file` on (a group's first
    /// row: page-aligned, see [`ALIGN_NODES`]), through `bufs` (of equal,
    /// page-multiple sizes).
    fn new(
        engine: &'a IoEngine,
        file: Arc<IoFile>,
        f16: bool,
        bufs: Vec<AlignedBuf>,
        offset: u64,
    ) -> Self {
        RowWriter {
            engine,
            file,
            f16,
            free: bufs,
            filling: None,
            in_flight: Default::default(),
            offset,
            handed: 0,
            written: 0,
        }
    }

    /// The values handed on so far.
    fn handed(&self) -> usize {
        self.handed
    }

    /// Hands on the next `values`.
    fn put(&mut self, mut values: &[f32]) -> Result<()> {
        let elem = if self.f16 { 2 } else { 4 };
        while !values.is_empty() {
            let (mut buf, filled) = match self.filling.take() {
                Some(filling) => filling,
                None => (self.spare()?, 0),
            };
            let size = buf.as_mut_slice().len();
            let take = ((size - filled) / elem).min(values.len());
            let (now, rest) = values.split_at(take);
            let filled = filled + encode_rows(now, self.f16, &mut buf.as_mut_slice()[filled..]);
            self.handed += take;
            values = rest;
            if filled == size {
                self.submit(buf, filled)?;
            } else {
                self.filling = Some((buf, filled));
            }
        }
        Ok(())
    }

    /// Writes what is left, with zeros up to the next page, and waits for
    /// every write; returns the bytes written and the buffers.
    fn finish(mut self) -> Result<(u64, Vec<AlignedBuf>)> {
        if let Some((mut buf, filled)) = self.filling.take() {
            let len = (filled as u64).div_ceil(PAGE) as usize * PAGE as usize;
            buf.as_mut_slice()[filled..len].fill(0);
            self.submit(buf, len)?;
        }
        while let Some(pending) = self.in_flight.pop_front() {
            let (outcome, buf) = pending.wait();
            self.written += outcome?;
            self.free.push(buf);
        }
        Ok((self.written, self.free))
    }

    /// A free buffer, waiting for the oldest write if none is.
    fn spare(&mut self) -> Result<AlignedBuf> {
        if let Some(buf) = self.free.pop() {
            return Ok(buf);
        }
        let pending = self.in_flight.pop_front().expect("a buffer is out");
        let (outcome, buf) = pending.wait();
        self.written += outcome?;
        Ok(buf)
    }

    fn submit(&mut self, buf: AlignedBuf, len: usize) -> Result<()> {
        let size = buf.as_slice().len() as u64;
        let req = ReadReq {
            offset: self.offset,
            len,
            buf_offset: 0,
        };
        self.in_flight
            .push_back(self.engine.write_behind(&self.file, &[req], buf)?);
        self.offset += size;
        Ok(())
    }
}

/// The edges from a span's earlier chunks into a chunk's destinations,
/// gathered from their buckets into one list sorted by destination (each
/// bucket is; together they are not) by a counting sort over the chunk's
/// destinations, for the host's scatter, whose threads take disjoint
/// destination ranges. Buffers reused from chunk to chunk.
#[derive(Default)]
struct Waiting {
    counts: Vec<usize>,
    src: Vec<u32>,
    dst: Vec<u32>,
}

impl Waiting {
    /// The edges of the buckets `chunks` whose destinations lie in
    /// `[lo, hi)`, as sources and destinations sorted by destination.
    fn gather(
        &mut self,
        edges: &GroupEdges,
        chunks: std::ops::Range<usize>,
        (lo, hi): (u64, u64),
    ) -> (&[u32], &[u32]) {
        let ranges: Vec<_> = chunks.map(|c| edges.reaching(c, (lo, hi))).collect();
        // Edges per destination, then where each destination's edges start.
        self.counts.clear();
        self.counts.resize((hi - lo) as usize + 1, 0);
        for r in &ranges {
            for &t in &edges.dst[r.clone()] {
                self.counts[(t as u64 - lo) as usize + 1] += 1;
            }
        }
        for i in 1..self.counts.len() {
            self.counts[i] += self.counts[i - 1];
        }
        let total = *self.counts.last().expect("one count at least");
        self.src.clear();
        self.src.resize(total, 0);
        self.dst.clear();
        self.dst.resize(total, 0);
        for r in ranges {
            for (&t, &s) in edges.dst[r.clone()].iter().zip(&edges.src[r]) {
                let at = &mut self.counts[(t as u64 - lo) as usize];
                self.src[*at] = s;
                self.dst[*at] = t;
                *at += 1;
            }
        }
        (&self.src, &self.dst)
    }
}

/// Per layer whose aggregation runs on the device (`row_costs`: host bytes
/// and device floats per source row), how many edge buckets' rows a chunk
/// of its stream takes: as many as the memory planned for a chunk of the
/// widest layer holds (`per_chunk_row` host bytes and `device_row` device
/// floats a row). A narrow hidden layer then streams in chunks as large
/// as the first layer's, in bytes, not in 16 times as many small ones,
/// each of which costs the device a few copies and dozens of kernels.
fn chunk_merges(row_costs: &[(u64, u64)], per_chunk_row: u64, device_row: u64) -> Vec<u64> {
    row_costs
        .iter()
        .map(|&(host, device)| {
            let by_device = device_row.checked_div(device).unwrap_or(u64::MAX);
            (per_chunk_row / host.max(1)).min(by_device).max(1)
        })
        .collect()
}

/// Reads group `g`'s bucketed edges; returns them and the file's size.
fn load_group_edges(work: &Path, g: usize, chunks: usize) -> Result<(GroupEdges, u64)> {
    let path = edge_file(work, g);
    let bytes = std::fs::read(&path).map_err(|e| Error::io(path.display(), e))?;
    let index_bytes = (chunks + 1) * 8;
    if bytes.len() < index_bytes || !(bytes.len() - index_bytes).is_multiple_of(8) {
        return Err(Error::InvalidArgument(format!(
            "{}: truncated edge bucket file; remove the work directory and run again",
            path.display()
        )));
    }
    let (pairs, index) = bytes.split_at(bytes.len() - index_bytes);
    let offsets = index
        .chunks_exact(8)
        .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
        .collect();
    let (mut src, mut dst) = (Vec::new(), Vec::new());
    for b in pairs.chunks_exact(8) {
        src.push(u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
        dst.push(u32::from_le_bytes([b[4], b[5], b[6], b[7]]));
    }
    Ok((
        GroupEdges {
            src,
            dst,
            offsets,
            by_dst: Default::default(),
            in_degree: Default::default(),
        },
        bytes.len() as u64,
    ))
}

/// Splits the destinations `[a, b)` into `parts` ranges and, for a bucket
/// sorted by destination, the edge range of each: the ranges are disjoint,
/// so threads may fill their accumulators without locks.
fn dst_parts(dst: &[u32], a: u64, b: u64, parts: usize) -> Vec<((u64, u64), (usize, usize))> {
    let span = (b - a).div_ceil(parts as u64).max(1);
    (0..parts as u64)
        .map(|i| (a + i * span, (a + (i + 1) * span).min(b)))
        .filter(|(lo, hi)| lo < hi)
        .map(|(lo, hi)| {
            let e0 = dst.partition_point(|&d| (d as u64) < lo);
            let e1 = dst.partition_point(|&d| (d as u64) < hi);
            ((lo, hi), (e0, e1))
        })
        .collect()
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
/// vectorized. Those plain sums, on the stream's one thread, took a third
/// of a second of a GAT hidden layer's stream on the bench graph here
/// (1.8-1.9 s against 1.5-1.7 s, the pull aside).
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

fn to_vec(t: &Tensor) -> Result<Vec<f32>> {
    Ok(Vec::<f32>::try_from(
        &t.to_device(Device::Cpu)
            .to_kind(Kind::Float)
            .contiguous()
            .view([-1]),
    )?)
}

/// `t`'s values into `buf`, reusing its memory: a group's rows are
/// gigabytes, and fresh pages cost more than the copy (the kernel clears
/// each one on first touch).
fn copy_into(t: &Tensor, buf: &mut Vec<f32>) -> Result<()> {
    let t = t.to_device(Device::Cpu).to_kind(Kind::Float).contiguous();
    let n = t.numel();
    buf.clear();
    buf.resize(n, 0.0);
    t.f_copy_data(buf, n)?;
    Ok(())
}

fn tensor(values: &[f32], rows: i64, device: Device) -> Tensor {
    Tensor::from_slice(values)
        .view([rows, -1])
        .to_device(device)
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
                self.m[at * h + hh] = if raw >= 0.0 { raw } else { 0.2 * raw };
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
                        let e = if raw >= 0.0 { raw } else { 0.2 * raw };
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

/// GAT's walk of a group's input: a destination's scores need its own row
/// (att_dst·W h_dst), so the stream starts at the group's first chunk: the
/// chunks `first..=last` that hold the group's rows (its span) come first,
/// in order, then the rest. An edge whose destination has not come by yet
/// waits: its source is in the span, whose projections are kept until the
/// span's last chunk. So the group's own rows are read once, in the stream.
#[derive(Clone, Copy, Debug)]
struct Span {
    first: usize,
    last: usize,
}

impl Span {
    /// The span of the destinations `[a, b)` in chunks of `chunk_rows`.
    fn of(a: u64, b: u64, chunk_rows: u64) -> Span {
        Span {
            first: (a / chunk_rows) as usize,
            last: ((b - 1) / chunk_rows) as usize,
        }
    }

    fn holds(&self, c: usize) -> bool {
        (self.first..=self.last).contains(&c)
    }
}

/// Buffers a run hands from group to group and layer to layer: a group's
/// rows are GBs, and fresh pages cost more than the work on them (the
/// kernel clears each on first touch, at a few GB/s on this VM). A request
/// gets the smallest buffer that holds it, else the largest one, grown.
#[derive(Default)]
struct Spares(Vec<Vec<f32>>);

impl Spares {
    /// An empty buffer with room for `capacity` values.
    fn take_empty(&mut self, capacity: usize) -> Vec<f32> {
        let mut buf = self.pick(capacity);
        buf.clear();
        buf.reserve(capacity);
        buf
    }

    /// The smallest buffer that holds `capacity` values, else the largest,
    /// else a new one; as it was given back.
    fn pick(&mut self, capacity: usize) -> Vec<f32> {
        let fits = (0..self.0.len())
            .filter(|&i| self.0[i].capacity() >= capacity)
            .min_by_key(|&i| self.0[i].capacity());
        let largest = (0..self.0.len()).max_by_key(|&i| self.0[i].capacity());
        fits.or(largest)
            .map(|i| self.0.swap_remove(i))
            .unwrap_or_default()
    }

    /// A buffer of `len` values that the caller overwrites, every one: a
    /// reused buffer keeps its old values (clearing gigabytes the caller
    /// writes anyway took a tenth of a second or more a buffer here); only
    /// values it never held are zeroed, as [`Spares::take`] does.
    fn take_overwritten(&mut self, len: usize) -> Vec<f32> {
        let mut buf = self.pick(len);
        if buf.len() >= len {
            buf.truncate(len);
            return buf;
        }
        if buf.capacity() < len {
            // Grown: nothing of the old values is worth the copy.
            buf.clear();
            buf.reserve(len);
        }
        let old = buf.len();
        buf.spare_capacity_mut()[..len - old]
            .par_chunks_mut(1 << 16)
            .for_each(|c| c.fill(std::mem::MaybeUninit::new(0.0)));
        // SAFETY: the first `old` values were there, the rest up to `len`
        // are written just above.
        unsafe { buf.set_len(len) };
        buf
    }

    /// A buffer of `len` zeros, written by the thread pool: gigabytes of
    /// fresh pages are faulted in (and zeroed by the kernel) on each
    /// thread at once, where one thread's `resize` took a first layer
    /// seconds here. Faulted in later, by the scatter, they cost the
    /// stream more than that.
    fn take(&mut self, len: usize) -> Vec<f32> {
        let mut buf = self.take_empty(len);
        buf.spare_capacity_mut()[..len]
            .par_chunks_mut(1 << 16)
            .for_each(|c| c.fill(std::mem::MaybeUninit::new(0.0)));
        // SAFETY: `take_empty` leaves the buffer empty with room for `len`
        // values, all written just above.
        unsafe { buf.set_len(len) };
        buf
    }

    fn give(&mut self, buf: Vec<f32>) {
        if buf.capacity() > 0 {
            self.0.push(buf);
        }
    }
}

/// One graph layer's work for one group of destinations: what
/// [`graph_layer_group`] and [`on_device::graph_layer_group`] take.
#[derive(Clone, Copy)]
struct GroupJob<'a, 'w> {
    layer: &'a Layer,
    input: &'a Input,
    engine: &'a IoEngine,
    edges: &'a GroupEdges,
    /// The destinations `[a, b)`.
    range: (u64, u64),
    chunk_rows: u64,
    /// Edge buckets a chunk of the stream takes (the device path's; the
    /// host's takes one).
    merge: u64,
    device: Device,
    /// Keep the group's own input rows (the embeddings).
    keep_rows: bool,
    /// The group's own input rows where the caller holds them already (the
    /// layer before's output, in memory): [`GroupJob::kept_rows`] takes
    /// them, and the stream then copies none.
    given_rows: &'a std::sync::Mutex<Option<Vec<f32>>>,
    /// Where the group's output rows go (a hidden layer's), which a group
    /// that finishes them in node order hands on as it does; the caller
    /// hands on the rest.
    rows_to: Option<&'a std::sync::Mutex<RowWriter<'w>>>,
    /// Apply the activation.
    activate: bool,
    bar: &'a indicatif::ProgressBar,
}

impl GroupJob<'_, '_> {
    /// A buffer for the group's own input rows, kept for the embeddings,
    /// sized already (grown by doubling, GBs of rows would be copied and
    /// paged in again at each step); empty unless `keep_rows`. Taken first,
    /// the largest need, it gets the pool's largest buffer.
    fn kept_rows(&self, spares: &mut Spares) -> Vec<f32> {
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
    fn keep_own_rows(&self, h_dst: &mut Vec<f32>, chunk: &Chunk, c0: u64) {
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

/// Runs one graph layer for the destinations `[a, b)`: streams the input,
/// scatters along the group's edges, applies the dense part and, with
/// `activate`, the activation. Returns the layer's output rows for the
/// group, and (with `keep_rows`) the group's own input rows, both in
/// buffers from `spares`, which the caller gives back once written.
fn graph_layer_group(
    job: &GroupJob,
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
    let g = (b - a) as usize;
    let parts = rayon::current_num_threads() * 4;
    match layer {
        Layer::Sage {
            lin_l_w,
            lin_l_b,
            lin_r_w,
        } => {
            // The group's own rows pass by in the stream: lin_r is applied
            // to them there, with no second read.
            let d_out = lin_r_w.size()[0];
            // mean(h) W = mean(h W): where the layer narrows, sources are
            // projected first and the sums are kept at the output's width.
            let project = lin_l_w.size()[0] <= input.width as i64;
            // One group, the rows going to the work directory: pulled, so
            // they go while the next are made (see `sage_pull`). The last
            // layer's narrow sums are pushed, hidden in the stream's reads.
            if project && (a, b) == (0, input.rows) && job.rows_to.is_some() {
                return sage_pull(job, spares, read, times);
            }
            let mut h_dst = job.kept_rows(spares);
            let d = if project {
                lin_l_w.size()[0] as usize
            } else {
                input.width
            };
            // In-degrees first: projecting, lin_r(self) goes straight into
            // the sums, times the count they are divided by, where it would
            // take a buffer of the group's width of its own (fresh pages on
            // a first layer: 1.6 GB took 1.7 s here). A widening layer's
            // sums are at the input's width: its lin_r(self) is kept apart.
            let count = edges.in_degrees((a, b));
            let mut acc = spares.take(g * d);
            let mut own_buf = if project {
                Vec::new()
            } else {
                spares.take(g * d_out as usize)
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
                let x = chunk.tensor().to_device(device);
                let d_out = d_out as usize;
                job.keep_own_rows(&mut h_dst, chunk, c0);
                // The rows the scatter adds up, `stride` apart.
                let (rows, stride) = if project {
                    let own = lo < hi;
                    let ys = y.product(&x, if own { &w_lr } else { &w_l })?;
                    if own {
                        // Before this chunk's edges reach them, these
                        // destinations' sums hold only the earlier
                        // chunks': lin_r(self) times the count is added.
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
                        (ys, stride)
                    } else {
                        (ys, d_out)
                    }
                } else {
                    if lo < hi {
                        let own = x
                            .narrow(0, (lo - c0) as i64, (hi - lo) as i64)
                            .matmul(&lin_r_w.tr())
                            .to_device(Device::Cpu)
                            .contiguous();
                        let at = (lo - a) as usize * d_out;
                        let n = own.numel();
                        own.f_copy_data(&mut own_buf[at..at + n], n)?;
                    }
                    (rows, input.width)
                };
                if e0 == e1 {
                    return Ok(());
                }
                let (src, dst) = (&edges.src[e0..e1], &edges.dst[e0..e1]);
                let split = dst_parts(dst, a, b, parts);
                // Each part owns the accumulator rows of its destinations.
                let mut slices = Vec::with_capacity(split.len());
                let mut rest = acc.as_mut_slice();
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
                Ok(())
            })?;
            let bias = to_vec(lin_l_b)?;
            let d_out = d_out as usize;
            if project {
                // (sum + count lin_r(self)) / count + lin_l's bias, row by
                // row in place, then ReLU: no fresh gigabytes for the
                // group's tensors.
                acc.par_chunks_mut(d_out)
                    .zip(count.par_iter())
                    .for_each(|(row, &c)| {
                        let c = c.max(1.0);
                        for (v, b) in row.iter_mut().zip(&bias) {
                            *v = *v / c + b;
                            if activate && *v < 0.0 {
                                *v = 0.0;
                            }
                        }
                    });
            } else {
                // The layer widens: the mean of the inputs, then lin_l, +
                // its bias + lin_r(self) in place, then ReLU.
                let mut mean = tensor(&acc, g as i64, device);
                let c = Tensor::from_slice(count).to_device(device).clamp_min(1.0);
                let _ = mean.g_div_(&c.unsqueeze(1));
                copy_into(&mean.matmul(&lin_l_w.tr()), &mut acc)?;
                acc.par_chunks_mut(d_out)
                    .zip(own_buf.par_chunks(d_out))
                    .for_each(|(row, own)| {
                        for ((v, b), o) in row.iter_mut().zip(&bias).zip(own) {
                            *v = *v + b + o;
                            if activate && *v < 0.0 {
                                *v = 0.0;
                            }
                        }
                    });
                spares.give(own_buf);
            }
            Ok((acc, h_dst))
        }
        Layer::Gat {
            lin_w,
            att_src,
            att_dst,
            res_w,
            bias,
            heads,
            per_head,
            concat,
        } => {
            let (h, c_out) = (*heads as usize, *per_head as usize);
            let w = h * c_out;
            if (a, b) == (0, input.rows) {
                return gat_pull(job, spares, read, times);
            }
            let (a_src, a_dst) = (to_vec(att_src)?, to_vec(att_dst)?);
            let (lin_t, res_t) = (lin_w.tr(), res_w.tr());
            // Projections and residuals land in reused buffers: fresh
            // pages per chunk cost more than the matmuls on narrow layers.
            let (mut zs, mut rs) = (Scratch::default(), Scratch::default());
            let span = Span::of(a, b, chunk_rows);
            let Span { first, last } = span;
            let kept = ((last - first) as u64 * chunk_rows) as usize;
            let (mut z_span, mut el_span) =
                (spares.take_empty(kept * w), spares.take_empty(kept * h));
            let mut h_dst = job.kept_rows(spares);
            let mut sm = OnlineSoftmax::new(a, g, h, c_out, spares);
            let mut waiting = Waiting::default();
            // The output rows, which hold res(self) until the softmax is
            // finished into them (no buffer of its own: a group's rows are
            // GBs, fresh pages on a first layer).
            let out_w = if *concat { w } else { c_out };
            assert_eq!(
                res_w.size()[0] as usize,
                out_w,
                "GAT's residual is the output's width"
            );
            let mut rows_out = spares.take(g * out_w);
            *read += input.stream(engine, chunk_rows, first, times, bar, |c, chunk| {
                let (e0, e1) = (edges.offsets[c] as usize, edges.offsets[c + 1] as usize);
                let in_span = span.holds(c);
                if !in_span && e0 == e1 {
                    return Ok(());
                }
                let c0 = c as u64 * chunk_rows;
                let n_rows = chunk.rows;
                let c1 = c0 + n_rows as u64;
                let x = chunk.tensor().to_device(device);
                let z = zs.product(&x, &lin_t)?;
                let mut el = vec![0f32; z.len() / c_out];
                head_scores(z, &a_src, c_out, &mut el);
                // Destinations below `seen` have had their rows by now.
                let seen = if in_span { b.min(c1) } else { b };
                if in_span {
                    let (lo, hi) = (a.max(c0), b.min(c1));
                    let (at, len) = ((lo - c0) as i64, (hi - lo) as i64);
                    let own = &z[at as usize * w..(at + len) as usize * w];
                    head_scores(
                        own,
                        &a_dst,
                        c_out,
                        &mut sm.er[(lo - a) as usize * h..(hi - a) as usize * h],
                    );
                    let r = rs.product(&x.narrow(0, at, len), &res_t)?;
                    rows_out[(lo - a) as usize * out_w..][..r.len()].copy_from_slice(r);
                    job.keep_own_rows(&mut h_dst, chunk, c0);
                    sm.seed((lo, hi), c0, z, &el);
                    // Edges from the span's earlier chunks waited for these
                    // destinations: one batch for them all (a batch per
                    // pair of chunks was hundreds of thousands of small
                    // parallel calls a layer).
                    let (src, dst) = waiting.gather(edges, first..c, (lo, hi));
                    let base = first as u64 * chunk_rows;
                    sm.add((lo, hi), src, dst, base, &z_span, &el_span, parts);
                }
                // This chunk's edges into destinations that have come by.
                let own = edges.reaching(c, (a, seen));
                sm.add(
                    (a, seen),
                    &edges.src[own.clone()],
                    &edges.dst[own],
                    c0,
                    z,
                    &el,
                    parts,
                );
                if in_span && c < last {
                    z_span.extend_from_slice(z);
                    el_span.extend_from_slice(&el);
                }
                Ok(())
            })?;
            spares.give(z_span);
            spares.give(el_span);
            // The softmax's weighted sums over its sums (PyG adds 1e-16),
            // heads concatenated or averaged, + res(self) (in the rows
            // already) + bias, then ELU: row by row in place, no fresh GBs
            // of tensors.
            let bias = to_vec(bias)?;
            let (acc, sums) = (&sm.acc, &sm.s);
            rows_out
                .par_chunks_mut(out_w)
                .zip(acc.par_chunks(w))
                .zip(sums.par_chunks(h))
                .for_each_init(
                    || vec![0f32; out_w],
                    |mean, ((out, acc), sums)| {
                        gat_finish_row(out, acc, sums, &bias, *concat, c_out, mean)
                    },
                );
            if activate {
                elu_in_place(&mut rows_out)?;
            }
            sm.give(spares);
            Ok((rows_out, h_dst))
        }
    }
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

/// ELU in place through torch, whose expm1 is vectorized (glibc's scalar
/// one took an eighth of a GAT run).
fn elu_in_place(rows: &mut [f32]) -> Result<()> {
    let n = rows.len() as i64;
    on_values(rows, &[n], |t| {
        let _ = t.f_elu_()?;
        Ok(())
    })
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
    let lrelu = |raw: f32| if raw >= 0.0 { raw } else { 0.2 * raw };
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
                // the loop (3-5% of the pull in alternated runs here).
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
fn project_all(
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
    // straight into its rows: parting one product's rows copied more
    // bytes than packing the input twice reads (a hidden GraphSAGE layer's
    // stream, its pull aside, took 1.24-1.34 s against 0.90-0.93 s in
    // alternated runs on the bench graph). A wide first layer keeps one
    // matmul, its input's rows packed once.
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
        let x = chunk.tensor().to_device(job.device);
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
fn pull_in_order<S>(
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

/// The output's selected nodes, as a bit per node.
fn selection(ds: &Dataset, nodes: &NodeSet) -> Result<Vec<u64>> {
    let n = ds.num_nodes;
    let mut bits = vec![0u64; n.div_ceil(64) as usize];
    let mut set = |v: u64| bits[(v / 64) as usize] |= 1 << (v % 64);
    match nodes {
        NodeSet::All => (0..n).for_each(&mut set),
        NodeSet::Split(s) => ds.split(*s).seeds.iter().for_each(|&v| set(v as u64)),
        NodeSet::File(path) => {
            let npy = offgnn_shared::npy::NpyFile::open(path)?;
            if npy.shape().len() != 1 {
                return Err(Error::InvalidArgument(format!(
                    "{}: --nodes needs a one-dimensional array of node ids, found shape {:?}",
                    path.display(),
                    npy.shape()
                )));
            }
            let ids = npy.read_u64(0, npy.shape()[0] as usize)?;
            if let Some((i, v)) = ids.iter().enumerate().find(|(_, v)| **v >= n) {
                return Err(Error::InvalidArgument(format!(
                    "{}: element {i} is node {v}, but the dataset has {n} nodes",
                    path.display()
                )));
            }
            ids.into_iter().for_each(set);
        }
    }
    Ok(bits)
}

fn selected(bits: &[u64], v: u64) -> bool {
    bits[(v / 64) as usize] >> (v % 64) & 1 == 1
}

/// A part of the output as one Parquet file: the group rows `rows` (indices
/// into the group, whose first node is `a`), their `logits` (`classes` a
/// row) and `embeddings` (a row of `width` each), with the columns
/// `outputs` asks for.
/// An output row's bytes as encoded (plain, uncompressed): the node id and
/// class, and each list column's floats. `embedding` is the embedding's
/// width where there is one.
fn output_row_bytes(classes: usize, embedding: Option<usize>, outputs: Outputs) -> usize {
    let lists = outputs.probabilities as usize + outputs.logits as usize;
    let embedding = embedding.filter(|_| outputs.embeddings).unwrap_or(0);
    16 + 4 * (lists * classes + embedding)
}

/// Bytes an output part's encoder hands to the store at once
/// ([`PartSink`]): [`OUTPUT_PIECE`], or a whole part where parts are
/// smaller.
fn output_piece(selected: u64, row_bytes: usize) -> usize {
    let part = (PART_ROWS as u64).min(selected) * row_bytes as u64;
    (OUTPUT_PIECE as u64).min(part.max(1).next_multiple_of(PAGE)) as usize
}

/// The memory of one output part's encoder (a row group's ids and classes,
/// a batch of rows' list values and their levels, and the page being
/// encoded, see [`output_part`], bounded by a row group's and a batch's
/// rows; the piece it fills, see [`PartSink`]; and its part's staged
/// writer, which holds `staged` bytes) and of the piece being stored.
fn output_part_bytes(selected: u64, row_bytes: usize, staged: u64) -> (u64, u64) {
    let part = (PART_ROWS as u64).min(selected);
    let building = part.min(OUTPUT_GROUP_ROWS as u64) + part.min(OUTPUT_BATCH_ROWS as u64);
    let piece = output_piece(selected, row_bytes) as u64;
    (building * row_bytes as u64 + piece + staged, piece)
}

fn output_part<W: Write + Send>(
    rows: &[usize],
    a: u64,
    logits: &[f32],
    classes: usize,
    embeddings: Option<(&[f32], usize)>,
    outputs: Outputs,
    sink: W,
) -> Result<W> {
    use parquet::data_type::{FloatType, Int64Type};
    let fail =
        |e: parquet::errors::ParquetError| Error::InvalidArgument(format!("writing Parquet: {e}"));
    let item = || Arc::new(Field::new("item", DataType::Float32, false));
    let list_type = |width: usize| DataType::FixedSizeList(item(), width as i32);
    let embeddings = embeddings.filter(|_| outputs.embeddings);
    // The list columns in the schema's order: a name, its width, and a
    // batch's values from its rows, or the rows' values to take them from.
    type Fill<'f> = Box<dyn Fn(&[usize], &mut Vec<f32>) + 'f>;
    enum Values<'v> {
        Computed(Fill<'v>),
        Rows(&'v [f32]),
    }
    let mut lists: Vec<(&str, usize, Values)> = Vec::new();
    if outputs.probabilities {
        let fill: Fill = Box::new(|rows: &[usize], out: &mut Vec<f32>| {
            for &i in rows {
                let row = &logits[i * classes..][..classes];
                let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let sum: f32 = row.iter().map(|v| (v - max).exp()).sum();
                out.extend(row.iter().map(|v| (v - max).exp() / sum));
            }
        });
        lists.push(("probabilities", classes, Values::Computed(fill)));
    }
    if outputs.logits {
        lists.push(("logits", classes, Values::Rows(logits)));
    }
    if let Some((e, width)) = embeddings {
        lists.push(("embedding", width, Values::Rows(e)));
    }
    let mut fields = vec![
        Field::new("node_id", DataType::UInt64, false),
        Field::new("class", DataType::Int64, false),
    ];
    for (name, width, _) in &lists {
        fields.push(Field::new(*name, list_type(*width), false));
    }
    let schema = Schema::new(fields);
    // Uncompressed and plain: float columns barely compress, and a codec or
    // a dictionary would cost more time than the bytes it saves (the
    // classes, few and repeated, keep their dictionary). Statistics on the
    // node ids and classes only, which readers filter on.
    let mut props = parquet::file::properties::WriterProperties::builder()
        .set_compression(parquet::basic::Compression::UNCOMPRESSED)
        .set_dictionary_enabled(false)
        .set_column_dictionary_enabled(ColumnPath::from("class"), true);
    for (name, _, _) in &lists {
        props = props.set_column_statistics_enabled(
            ColumnPath::from(vec![name.to_string(), "list".into(), "item".into()]),
            EnabledStatistics::None,
        );
    }
    let mut props = props.build();
    // The Parquet schema and the Arrow schema in the footer, as Arrow's
    // writer makes them, so that readers see fixed-size lists.
    let descr = parquet::arrow::ArrowSchemaConverter::new()
        .convert(&schema)
        .map_err(fail)?;
    parquet::arrow::add_encoded_arrow_schema_to_metadata(&schema, &mut props);
    // Column by column through Parquet's own writer rather than Arrow's:
    // for a list, Arrow's derives each value's levels row by row, which
    // took a third of the encoding. A list here is never null nor empty,
    // so its levels are the same for every row: the first value starts a
    // row (repetition 0) and every value is present (the leaf's full
    // definition level).
    let levels: Vec<(Vec<i16>, Vec<i16>)> = lists
        .iter()
        .enumerate()
        .map(|(k, (_, width, _))| {
            let leaf = descr.column(2 + k);
            let n = rows.len().min(OUTPUT_BATCH_ROWS) * width;
            let def = vec![leaf.max_def_level(); n];
            let rep = (0..n)
                .map(|v| {
                    if v % width == 0 {
                        0
                    } else {
                        leaf.max_rep_level()
                    }
                })
                .collect();
            (def, rep)
        })
        .collect();
    let mut w = parquet::file::writer::SerializedFileWriter::new(
        sink,
        descr.root_schema_ptr(),
        Arc::new(props),
    )
    .map_err(fail)?;
    let (mut ints, mut floats) = (Vec::<i64>::new(), Vec::<f32>::new());
    // Row groups of OUTPUT_GROUP_ROWS, each column written whole in turn.
    for group in rows.chunks(OUTPUT_GROUP_ROWS) {
        let mut rg = w.next_row_group().map_err(fail)?;
        let mut column = |write: &mut dyn FnMut(
            &mut parquet::file::writer::SerializedColumnWriter,
        ) -> parquet::errors::Result<()>| {
            let mut col = rg
                .next_column()
                .map_err(fail)?
                .expect("a column for each field");
            write(&mut col).map_err(fail)?;
            col.close().map_err(fail)
        };
        column(&mut |col| {
            ints.clear();
            ints.extend(group.iter().map(|&i| (a + i as u64) as i64));
            col.typed::<Int64Type>().write_batch(&ints, None, None)?;
            Ok(())
        })?;
        column(&mut |col| {
            ints.clear();
            ints.extend(group.iter().map(|&i| {
                let row = &logits[i * classes..][..classes];
                let mut best = 0;
                for (c, v) in row.iter().enumerate() {
                    // The first of equal maxima, as torch's argmax.
                    if *v > row[best] {
                        best = c;
                    }
                }
                best as i64
            }));
            col.typed::<Int64Type>().write_batch(&ints, None, None)?;
            Ok(())
        })?;
        for ((_, width, values), (def, rep)) in lists.iter().zip(&levels) {
            column(&mut |col| {
                for batch in group.chunks(OUTPUT_BATCH_ROWS) {
                    let n = batch.len() * width;
                    let first = batch[0] * width;
                    let values = match values {
                        // Consecutive rows (all nodes selected) as they lie.
                        Values::Rows(v) if batch[batch.len() - 1] - batch[0] + 1 == batch.len() => {
                            &v[first..first + n]
                        }
                        Values::Rows(v) => {
                            floats.clear();
                            for &i in batch {
                                floats.extend_from_slice(&v[i * width..][..*width]);
                            }
                            &floats
                        }
                        Values::Computed(fill) => {
                            floats.clear();
                            fill(batch, &mut floats);
                            &floats
                        }
                    };
                    col.typed::<FloatType>().write_batch(
                        values,
                        Some(&def[..n]),
                        Some(&rep[..n]),
                    )?;
                }
                Ok(())
            })?;
        }
        rg.close().map_err(fail)?;
    }
    w.into_inner().map_err(fail)
}

/// A piece of an output part's bytes on its way to the store, its first
/// `len` bytes; the last one of a part ends it.
struct Piece {
    name: String,
    bytes: AlignedBuf,
    len: usize,
    last: bool,
}

/// Where the Parquet writer puts an output part's bytes: handed to the
/// storing thread ([`store_pieces`]) in pieces of `piece` bytes (see
/// [`output_piece`]), in aligned buffers from `pool`, where the store
/// gives them back: a local store writes them past the page cache as they
/// are.
struct PartSink<'a> {
    name: String,
    buf: AlignedBuf,
    filled: usize,
    size: u64,
    tx: std::sync::mpsc::SyncSender<Piece>,
    pool: &'a std::sync::Mutex<Vec<AlignedBuf>>,
}

impl<'a> PartSink<'a> {
    fn new(
        name: &str,
        piece: usize,
        tx: std::sync::mpsc::SyncSender<Piece>,
        pool: &'a std::sync::Mutex<Vec<AlignedBuf>>,
    ) -> Self {
        let buf = Self::spare(pool, piece);
        PartSink {
            name: name.to_string(),
            buf,
            filled: 0,
            size: 0,
            tx,
            pool,
        }
    }

    /// A buffer of `piece` bytes.
    fn spare(pool: &std::sync::Mutex<Vec<AlignedBuf>>, piece: usize) -> AlignedBuf {
        pool.lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop()
            .unwrap_or_else(|| AlignedBuf::new(piece))
    }

    fn hand(&mut self, last: bool) -> std::io::Result<()> {
        let next = if last {
            AlignedBuf::new(0)
        } else {
            Self::spare(self.pool, self.buf.len())
        };
        let piece = Piece {
            name: self.name.clone(),
            bytes: std::mem::replace(&mut self.buf, next),
            len: std::mem::take(&mut self.filled),
            last,
        };
        // Refused only when the store has stopped on an error, which it
        // returns.
        self.tx
            .send(piece)
            .map_err(|_| std::io::Error::other("the output's store stopped"))
    }

    /// Hands over the part's last piece; returns the part's size.
    fn finish(mut self) -> Result<u64> {
        self.hand(true)
            .map_err(|e| Error::InvalidArgument(format!("storing {}: {e}", self.name)))?;
        Ok(self.size)
    }
}

impl Write for PartSink<'_> {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        let mut rest = bytes;
        while !rest.is_empty() {
            let n = rest.len().min(self.buf.len() - self.filled);
            self.buf.as_mut_slice()[self.filled..][..n].copy_from_slice(&rest[..n]);
            self.filled += n;
            rest = &rest[n..];
            if self.filled == self.buf.len() {
                self.hand(false)?;
            }
        }
        self.size += bytes.len() as u64;
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Stores the output parts' pieces as they come ([`PartSink`]), each part
/// through a staged writer that makes it visible whole once its last piece
/// is in, and gives each piece's buffer back to `pool`. A part whose last
/// piece never comes (its encoder failed) is dropped unfinished, leaving
/// nothing.
fn store_pieces(
    out: &Store,
    pieces: std::sync::mpsc::Receiver<Piece>,
    pool: &std::sync::Mutex<Vec<AlignedBuf>>,
) -> Result<()> {
    let mut open = HashMap::new();
    for Piece {
        name,
        bytes,
        len,
        last,
    } in pieces
    {
        let w = match open.entry(name.clone()) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => e.insert(out.staged_writer(&name)?),
        };
        w.append(&bytes.as_slice()[..len])?;
        if last {
            let w = open.remove(&name).expect("the part just appended to");
            w.finish()?;
        }
        if !bytes.is_empty() {
            pool.lock().unwrap_or_else(|e| e.into_inner()).push(bytes);
        }
    }
    Ok(())
}

/// Graph layers the run computes: the model's layers, or one pass for the MLP.
fn graph_layers_of(model: &Model) -> usize {
    if model.mlp.is_empty() {
        model.card.num_layers
    } else {
        1
    }
}

/// Bytes per value of the hidden layers' files.
fn hidden_elem(cfg: &InferConfig) -> u64 {
    if cfg.hidden_f16 { 2 } else { 4 }
}

fn hidden_file(work: &Path, l: usize) -> PathBuf {
    work.join(format!("h{l}.f32"))
}

/// Runs inference as configured. Stopped by SIGINT or SIGTERM, it keeps
/// the groups it finished, for the same command to resume.
pub fn infer(cfg: &InferConfig, engine: &IoEngine) -> Result<InferSummary> {
    let result = infer_run(cfg, engine);
    match offgnn_shared::signals::received() {
        Some(signal) if result.is_err() => Err(Error::Stopped(format!(
            "stopped by {signal}: the groups finished so far are kept in {} (and their parts under --out, uncommitted); run the same command again to resume",
            cfg.work_dir.display()
        ))),
        _ => result,
    }
}

/// The dataset's local directory: `--dataset` itself, or for a URL its
/// copy staged into the work directory (kept there, so a rerun downloads
/// nothing again).
fn local_dataset(cfg: &InferConfig) -> Result<PathBuf> {
    crate::staging::resolve_dataset(
        &cfg.dataset,
        &cfg.work_dir.join("dataset"),
        cfg.show_progress,
    )
}

fn infer_run(cfg: &InferConfig, engine: &IoEngine) -> Result<InferSummary> {
    let started = Instant::now();
    let model = Model::load(&cfg.model, cfg.device)?;
    let card = &model.card;
    let ds = Dataset::open(&local_dataset(cfg)?)?;
    let fingerprint = ds.fingerprint()?;
    if fingerprint != card.dataset_fingerprint {
        return Err(Error::InvalidArgument(format!(
            "{}: the model was trained on another dataset (fingerprint {}, this dataset's is {})",
            cfg.dataset,
            short(&card.dataset_fingerprint),
            short(&fingerprint)
        )));
    }
    let d = ds.feature_dim() as i64;
    if d != card.in_channels {
        return Err(Error::InvalidArgument(format!(
            "{}: features are {d} wide, the model takes {}",
            ds.features.path().display(),
            card.in_channels
        )));
    }
    // The dataset's fingerprint leaves the features out (they may be packed
    // again over the same samples); the export records theirs apart.
    if card.feature_fingerprint.is_empty() {
        tracing::warn!(
            "{}: the export does not record its feature file's fingerprint (an older trainer wrote it), so the features cannot be checked against those it was trained on",
            cfg.model
        );
    } else {
        let features = offgnn_shared::dataset::file_fingerprint(ds.features.path())?;
        if features != card.feature_fingerprint {
            return Err(Error::InvalidArgument(format!(
                "{}: not the features the model was trained on (fingerprint {}, this file's is {}); the topology and labels match",
                ds.features.path().display(),
                short(&card.feature_fingerprint),
                short(&features)
            )));
        }
    }
    let out = Store::open(&cfg.out)?;
    let previous = commit::read(&out, COMMIT)?;
    if previous.is_some() && !cfg.overwrite {
        return Err(Error::InvalidArgument(format!(
            "{}: holds a committed inference result; pass --overwrite to replace it",
            out.url()
        )));
    }
    if cfg.hidden_f16 && card.hidden_channels % 2 == 1 {
        return Err(Error::InvalidArgument(format!(
            "--hidden-dtype f16 needs an even hidden width (groups start on 4 KiB pages), this model's is {}",
            card.hidden_channels
        )));
    }
    let bits = selection(&ds, &cfg.nodes)?;
    let n = ds.num_nodes;
    let num_layers = card.num_layers;
    // The work directory is this run's alone (created here): two runs in it
    // would overwrite each other's layers and progress.
    let _held = offgnn_shared::commit::hold_dir(
        &cfg.work_dir,
        "another trainer infer is working here; wait for it to end or pass another --work-dir",
    )?;

    // Memory: a count per node and the selection, the chunk's rows (raw and
    // as float32, and GAT's projection), the stream's buffer, then groups.
    let max_in = *model.widths[..num_layers].iter().max().expect("a layer") as u64;
    let mut per_node = 0u64;
    // A chunk's float32 tensors in flight (the one in use, those ready
    // ahead, and two the reader fills: it reads or converts into them, and
    // the matmuls read them as they are), then what it is projected to. On
    // CUDA they are page-locked, and libtorch's caching host allocator
    // rounds each up to a power of two: up to twice their size.
    let pin = if cfg.device.is_cuda() { 2 } else { 1 };
    let chunks_per_row = pin * 4 * (STREAM_AHEAD as u64 + 2) * max_in;
    let mut per_chunk_row = chunks_per_row;
    // With the aggregation on CUDA: the device floats per destination and
    // per source row (see [`on_device::device_floats`]).
    let mut device_floats = (0u64, 0u64);
    // Per layer, where its aggregation runs on the device: host bytes and
    // device floats per row of a source chunk.
    let mut row_costs = Vec::new();
    for l in 0..num_layers {
        let last = l + 1 == num_layers;
        let d_in = model.widths[l] as u64;
        // Embeddings keep the last layer's input rows of the group.
        let kept = if last && cfg.outputs.embeddings {
            d_in
        } else {
            0
        };
        let floats = if model.mlp.is_empty() {
            let (mut node, mut per_src) = model.layer_floats(l);
            if cfg.aggregate == Aggregate::Device {
                let d_out = model.widths[l + 1] as u64;
                let (dev_node, dev_src) = on_device::device_floats(&model.layers[l], d_in, d_out);
                if cfg.device.is_cuda() {
                    // The group's state is on the device, planned below;
                    // the host holds the output rows.
                    node = on_device::host_floats(d_out);
                    per_src = 0;
                    device_floats = (device_floats.0.max(dev_node), device_floats.1.max(dev_src));
                } else {
                    // torch's ops on the CPU: the device's tensors are host
                    // memory (a chunk "on the device" is the chunk itself),
                    // and the output rows are copied out of them.
                    node = node.max(dev_node + d_out);
                    per_src = per_src.max(dev_src - d_in);
                }
                let dev_src = if cfg.device.is_cuda() { dev_src } else { 0 };
                let host_row = pin * 4 * (STREAM_AHEAD as u64 + 2) * d_in + 4 * per_src;
                row_costs.push((host_row, dev_src));
            }
            per_chunk_row = per_chunk_row.max(chunks_per_row + 4 * per_src);
            node + kept
        } else {
            // The MLP's rows, every hidden width and the output, twice.
            2 * (d_in + model.widths[1..].iter().sum::<i64>() as u64)
        };
        per_node = per_node.max(4 * floats);
        if !model.mlp.is_empty() {
            break;
        }
    }
    // Hidden rows go out in pieces of at most WRITE_PIECE bytes.
    let widest = *model.widths[1..].iter().max().expect("a layer") as u64;
    let write_piece = (WRITE_PIECE as u64).min((n * widest * 4).div_ceil(PAGE) * PAGE) as usize;
    // The output's parts are encoded in parallel, as many at once as there
    // are threads or as an eighth of --memory holds, at least one.
    let selected_nodes: u64 = bits.iter().map(|w| w.count_ones() as u64).sum();
    let emb_width = model.widths[num_layers - 1] as usize;
    let out_row_bytes = output_row_bytes(card.out_channels as usize, Some(emb_width), cfg.outputs);
    let (part_bytes, stored_bytes) =
        output_part_bytes(selected_nodes, out_row_bytes, out.staged_writer_bytes());
    let piece = output_piece(selected_nodes, out_row_bytes);
    let encoders = (rayon::current_num_threads() as u64)
        .min(cfg.memory / 8 / part_bytes)
        .max(1);
    // libtorch's runtime and the process's own, as the training statement
    // counts them, then a count per node, the selection, the read and
    // write buffers, and the output parts being encoded and the one being
    // stored.
    let fixed = crate::memory::RUNTIME_BYTES
        + 4 * n
        + n.div_ceil(8)
        + (2 * REQUEST * PER_CALL + 2 * write_piece) as u64
        + pin * (STREAM_AHEAD as u64 + 2) * 4 * Chunk::SLACK as u64
        + encoders * part_bytes
        + stored_bytes;
    let chunk_rows = match cfg.chunk_rows {
        Some(c) => c.div_ceil(ALIGN_NODES).max(1) * ALIGN_NODES,
        None => {
            // An eighth of what is left after the fixed part.
            let bytes = (cfg.memory.saturating_sub(fixed) / 8).min(256 << 20);
            (bytes / per_chunk_row / ALIGN_NODES).max(1) * ALIGN_NODES
        }
    };
    let chunk_bytes = chunk_rows * per_chunk_row;
    let merges = chunk_merges(&row_costs, per_chunk_row, device_floats.1);
    let budget = cfg
        .memory
        .checked_sub(fixed + chunk_bytes)
        .filter(|b| *b > 0)
        .ok_or_else(|| {
            Error::InvalidArgument(format!(
                "--memory {} is below the {} this run needs before any group (libtorch's runtime {}, 4 bytes per node for {n} nodes, {} for a source chunk of {chunk_rows} rows, {} of read and write buffers, {} for {encoders} output parts encoded at once and one being stored); the least that works is about {}",
                human_bytes(cfg.memory),
                human_bytes(fixed + chunk_bytes),
                human_bytes(crate::memory::RUNTIME_BYTES),
                human_bytes(chunk_bytes),
                human_bytes((2 * REQUEST * PER_CALL + 2 * write_piece) as u64),
                human_bytes(encoders * part_bytes + stored_bytes),
                human_bytes(fixed + chunk_bytes + ALIGN_NODES * per_node * 2)
            ))
        })?;
    let mut indegree = vec![0u32; n as usize];
    let mut edge_upper_bound = 0u64;
    for_each_edge(&ds, cfg, |_, dst| {
        indegree[dst as usize] += 1;
        edge_upper_bound += 1;
        Ok(())
    })?;
    let host = Budget {
        node_bytes: per_node,
        edge_bytes: 16,
        bytes: budget,
    };
    let device = match (cfg.aggregate, cfg.device, model.mlp.is_empty()) {
        (Aggregate::Device, Device::Cuda(index), true) => {
            device_budget(index, 4 * device_floats.0, 4 * chunk_rows * device_floats.1)?
        }
        _ => None,
    };
    let (groups, largest) = if model.mlp.is_empty() {
        plan_groups(&indegree, host, device)?
    } else {
        plan_groups(&vec![0; n as usize], host, None)?
    };
    drop(indegree);
    let plan = Plan {
        planned_bytes: fixed + chunk_bytes + largest,
        groups,
        chunk_rows,
        merges,
    };
    let chunks = plan.chunks(n);
    tracing::info!(
        "inference: {} nodes in {} groups, source chunks of {} rows, memory at most {}",
        n,
        plan.groups.len(),
        chunk_rows,
        human_bytes(cfg.memory)
    );

    // Resume where a run of the same model, data and plan stopped.
    let key = {
        let mut h = sha2::Sha256::new();
        h.update(&card.weights_sha256);
        h.update(&fingerprint);
        h.update(serde_json::to_vec(&plan).expect("plan serializes"));
        h.update([
            cfg.add_reverse_edges as u8,
            cfg.keep_self_loops as u8,
            cfg.keep_duplicate_edges as u8,
        ]);
        h.update(format!(
            "{:?}{:?}{}",
            cfg.nodes, cfg.outputs, cfg.hidden_f16
        ));
        offgnn_shared::store::hex(&h.finalize())
    };
    let mut progress = std::fs::read(cfg.work_dir.join(PROGRESS))
        .ok()
        .and_then(|b| serde_json::from_slice::<Progress>(&b).ok())
        .filter(|p| p.key == key)
        // A run killed after its commit (before it cleared its work
        // directory) is done: the next run is a new one, not that one again.
        .filter(|p| {
            previous
                .as_ref()
                .is_none_or(|c| c.run_id.as_deref() != Some(p.run_id.as_str()))
        })
        .unwrap_or_else(|| Progress {
            key: key.clone(),
            ..Default::default()
        });
    let run_id = match RunId::parse(&progress.run_id) {
        Some(id) => id,
        None => {
            let id = RunId::new();
            progress.run_id = id.to_string();
            id
        }
    };
    // What an earlier run did is reported as resumed.
    for f in progress.figures.iter_mut() {
        f.groups_resumed = f.passes;
    }
    if progress.layer > 0 || progress.groups_done > 0 {
        tracing::info!(
            "resuming in {}: layer {} of {}, group {} of {}",
            cfg.work_dir.display(),
            progress.layer + 1,
            num_layers,
            progress.groups_done,
            plan.groups.len()
        );
    }

    if !progress.edges_ready && progress.layer == 0 && progress.groups_done == 0 {
        // What the work directory will hold at most: the hidden layers'
        // outputs and the bucketed edges (counted with duplicates).
        let hidden: u64 = (1..graph_layers_of(&model))
            .map(|l| (n * model.widths[l] as u64 * hidden_elem(cfg)).div_ceil(PAGE) * PAGE)
            .sum();
        let edges_bytes = if model.mlp.is_empty() {
            edge_upper_bound * 8 + plan.groups.len() as u64 * (chunks as u64 + 1) * 8
        } else {
            0
        };
        let free = offgnn_shared::io_engine::free_bytes(&cfg.work_dir)?;
        if hidden + edges_bytes > free {
            return Err(Error::InvalidArgument(format!(
                "--work-dir {}: {} free, this run needs up to {} there (hidden layers {}, bucketed edges {}); free some space or point --work-dir elsewhere",
                cfg.work_dir.display(),
                human_bytes(free),
                human_bytes(hidden + edges_bytes),
                human_bytes(hidden),
                human_bytes(edges_bytes)
            )));
        }
    }
    let mut edges_total = 0u64;
    if model.mlp.is_empty() && !progress.edges_ready {
        let t = Instant::now();
        edges_total = bucket_edges(&ds, cfg, &plan)?;
        progress.edges_ready = true;
        progress.edge_bucketing_seconds = t.elapsed().as_secs_f64();
        save_progress(&cfg.work_dir, &progress)?;
    }
    let features = Input {
        path: ds.features.path().to_path_buf(),
        data_offset: ds.features.header().data_offset,
        rows: n,
        width: d as usize,
        dtype: ds.features.dtype(),
        pinned: cfg.device.is_cuda(),
    };
    let classes = card.out_channels as usize;
    let (hidden_dtype, elem) = if cfg.hidden_f16 {
        (DType::F16, 2u64)
    } else {
        (DType::F32, 4u64)
    };
    let graph_layers = if model.mlp.is_empty() { num_layers } else { 1 };
    let mut groups_here = 0u64;
    let mut write_bufs = vec![AlignedBuf::new(write_piece), AlignedBuf::new(write_piece)];
    // Fewer encoders than threads: a pool of their own.
    let encoding = (encoders < rayon::current_num_threads() as u64)
        .then(|| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(encoders as usize)
                .thread_name(|i| format!("infer-encode-{i}"))
                .build()
                .map_err(|e| Error::InvalidArgument(format!("starting the output's encoders: {e}")))
        })
        .transpose()?;
    // A group's buffers, kept from group to group and layer to layer:
    // reused memory is already paged in.
    let mut spares = Spares::default();
    // A group's edges, kept for the next pass where it is the same group.
    let mut held_edges: Option<(usize, GroupEdges)> = None;
    // The last hidden layer's output, kept for the last layer's embeddings
    // where one group holds every node and the rows are float32 on disk (as
    // read back they are these): the last layer's stream then copies none
    // of its 1.6 GB on the benchmark's graph.
    let mut held_rows: Option<Vec<f32>> = None;
    while progress.layer < graph_layers {
        let l = progress.layer;
        let last = l + 1 == graph_layers;
        let input = if l == 0 {
            features.clone()
        } else {
            Input {
                path: hidden_file(&cfg.work_dir, l - 1),
                data_offset: 0,
                rows: n,
                width: model.widths[l] as usize,
                dtype: hidden_dtype,
                pinned: features.pinned,
            }
        };
        let out_width = if model.mlp.is_empty() {
            model.widths[l + 1] as usize
        } else {
            classes
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
        let merge = plan.merges.get(l).copied().unwrap_or(1);
        progress.figures[l].chunk_rows = chunk_rows * merge;
        let out_path = hidden_file(&cfg.work_dir, l);
        let out_file = if last {
            None
        } else {
            let padded = (n * out_width as u64 * elem).div_ceil(PAGE) * PAGE;
            if progress.groups_done == 0 {
                let f = File::create(&out_path).map_err(|e| Error::io(out_path.display(), e))?;
                f.set_len(padded)
                    .map_err(|e| Error::io(out_path.display(), e))?;
            }
            Some(Arc::new(engine.open_write(&out_path)?))
        };
        while progress.groups_done < plan.groups.len() {
            let gi = progress.groups_done;
            let (a, b) = plan.groups[gi];
            let t = Instant::now();
            let (mut read, mut edge_read) = (0u64, 0u64);
            let mut times = StreamTimes::default();
            // A bar per pass: the bytes of the layer's input streamed so far.
            let bar = offgnn_shared::progress::bytes_bar_if(
                cfg.show_progress,
                input.rows * input.row_bytes(),
                &format!(
                    "layer {}/{graph_layers}, pass {}/{}",
                    l + 1,
                    gi + 1,
                    plan.groups.len()
                ),
            );
            // The group's hidden rows go to the work directory from here,
            // handed on by the group as it finishes them or after.
            let rows_to = out_file.as_ref().map(|file| {
                std::sync::Mutex::new(RowWriter::new(
                    engine,
                    file.clone(),
                    cfg.hidden_f16,
                    std::mem::take(&mut write_bufs),
                    a * out_width as u64 * elem,
                ))
            });
            let (out_rows, embedding) = if model.mlp.is_empty() {
                // The group's edges, unless the last pass (a layer's only
                // group, the one before) left them here.
                let edges = match held_edges.take() {
                    Some((held, edges)) if held == gi => edges,
                    _ => {
                        let t_edges = Instant::now();
                        let (edges, size) = load_group_edges(&cfg.work_dir, gi, chunks)?;
                        tracing::debug!(
                            "layer {l} group {gi}: edges loaded in {:.2} s",
                            t_edges.elapsed().as_secs_f64()
                        );
                        edge_read += size;
                        edges
                    }
                };
                let t_group = Instant::now();
                let group = match cfg.aggregate {
                    Aggregate::Host => graph_layer_group,
                    Aggregate::Device => on_device::graph_layer_group,
                };
                let given_rows = std::sync::Mutex::new(held_rows.take());
                let job = GroupJob {
                    layer: &model.layers[l],
                    input: &input,
                    engine,
                    edges: &edges,
                    range: (a, b),
                    chunk_rows,
                    merge,
                    device: cfg.device,
                    keep_rows: last && cfg.outputs.embeddings,
                    given_rows: &given_rows,
                    rows_to: rows_to.as_ref(),
                    activate: !last,
                    bar: &bar,
                };
                let (rows, h_dst) = group(&job, &mut spares, &mut read, &mut times)?;
                tracing::debug!(
                    "layer {l} group {gi}: computed in {:.2} s ({:.2} s streaming)",
                    t_group.elapsed().as_secs_f64(),
                    times.io_wait + times.scatter
                );
                // One group: the next layer's pass is this one's again, and
                // its edges (counted in the group's memory) stay.
                if plan.groups.len() == 1 && !last {
                    held_edges = Some((gi, edges));
                }
                (rows, (last && cfg.outputs.embeddings).then_some(h_dst))
            } else {
                let mut x = Vec::new();
                read += input.read_rows(a, b, &mut x)?;
                let mut h = tensor(&x, (b - a) as i64, cfg.device);
                let mut before_last = None;
                for (i, (w, bias)) in model.mlp.iter().enumerate() {
                    if i + 1 == model.mlp.len() {
                        before_last = Some(to_vec(&h)?);
                    }
                    h = h.matmul(&w.tr()) + bias;
                    if i + 1 < model.mlp.len() {
                        h = act(ModelKind::Mlp, h);
                    }
                }
                (to_vec(&h)?, before_last.filter(|_| cfg.outputs.embeddings))
            };
            let mut written = 0u64;
            let t_write = Instant::now();
            if let Some(writer) = rows_to {
                // The rows the group has not handed on as it finished them.
                let mut writer = writer.into_inner().unwrap_or_else(|e| e.into_inner());
                writer.put(&out_rows[writer.handed()..])?;
                let (bytes, bufs) = writer.finish()?;
                written += bytes;
                write_bufs = bufs;
            } else {
                let keep: Vec<usize> = (a..b)
                    .filter(|&v| selected(&bits, v))
                    .map(|v| (v - a) as usize)
                    .collect();
                // Parts of at most PART_ROWS rows, encoded in parallel and
                // stored by a thread of their own (an encoder that stored
                // its own part left its core idle while the disk took it: a
                // third of the last layer's write on 2 cores). An encoder
                // hands its part's bytes over in pieces of OUTPUT_PIECE
                // bytes, in buffers that later pieces reuse: a whole part's
                // (over 100 MB) was fresh pages, which took a first part
                // four times as long to encode as the next on this VM.
                let pool = std::sync::Mutex::new(Vec::<AlignedBuf>::new());
                let parts = keep.chunks(PART_ROWS).enumerate().collect::<Vec<_>>();
                let (parts, stored) = std::thread::scope(|scope| {
                    // A rendezvous: a piece waits in its encoder's hands
                    // until the store takes it, as the plan counts.
                    let (tx, rx) = std::sync::mpsc::sync_channel::<Piece>(encoders as usize);
                    let (out, pool) = (&out, &pool);
                    let store = scope.spawn(move || store_pieces(out, rx, pool));
                    // As many parts at once as the plan counted.
                    let encode = || -> Vec<Result<(String, u64, u64)>> {
                        parts
                            .into_par_iter()
                            .map_with(tx, |tx, (k, rows)| {
                                let name = format!("{run_id}/part-{gi:06}-{k:04}.parquet");
                                let sink = PartSink::new(&name, piece, tx.clone(), pool);
                                let sink = output_part(
                                    rows,
                                    a,
                                    &out_rows,
                                    classes,
                                    embedding.as_deref().map(|e| (e, emb_width)),
                                    cfg.outputs,
                                    sink,
                                )?;
                                let size = sink.finish()?;
                                Ok((name, size, rows.len() as u64))
                            })
                            .collect()
                    };
                    let parts = match &encoding {
                        Some(pool) => pool.install(encode),
                        None => encode(),
                    };
                    let stored = store.join().expect("the output's store does not panic");
                    (parts, stored)
                });
                // The store's error first: the encoders' is then only that
                // it stopped.
                stored?;
                for part in parts {
                    let (name, size, rows) = part?;
                    written += size;
                    progress.output_files.push(name);
                    progress.nodes_written += rows;
                }
            }
            tracing::debug!(
                "layer {l} group {gi}: written in {:.2} s",
                t_write.elapsed().as_secs_f64()
            );
            let hand_on = plan.groups.len() == 1
                && l + 2 == graph_layers
                && model.mlp.is_empty()
                && cfg.outputs.embeddings
                && !cfg.hidden_f16;
            if hand_on {
                held_rows = Some(out_rows);
            } else {
                spares.give(out_rows);
            }
            if let Some(e) = embedding {
                spares.give(e);
            }
            let f = &mut progress.figures[l];
            f.passes += 1;
            f.bytes_read += read;
            f.edge_bytes_read += edge_read;
            f.bytes_written += written;
            f.seconds += t.elapsed().as_secs_f64();
            f.io_wait_seconds += times.io_wait;
            f.scatter_seconds += times.scatter;
            progress.groups_done += 1;
            save_progress(&cfg.work_dir, &progress)?;
            bar.finish_and_clear();
            groups_here += 1;
            if cfg.interrupt_after_groups == Some(groups_here) {
                return Err(Error::Interrupted(groups_here));
            }
            offgnn_shared::signals::check()?;
        }
        if let Some(file) = &out_file {
            file_sync(file.path())?;
        }
        progress.layer += 1;
        progress.groups_done = 0;
        save_progress(&cfg.work_dir, &progress)?;
    }

    let mut columns = vec!["node_id".to_string(), "class".to_string()];
    for (on, name) in [
        (cfg.outputs.probabilities, "probabilities"),
        (cfg.outputs.logits, "logits"),
        (cfg.outputs.embeddings, "embedding"),
    ] {
        if on {
            columns.push(name.into());
        }
    }
    if edges_total == 0 && model.mlp.is_empty() {
        edges_total = (0..plan.groups.len())
            .map(|g| {
                std::fs::metadata(edge_file(&cfg.work_dir, g))
                    .map(|m| (m.len() - (chunks as u64 + 1) * 8) / 8)
                    .unwrap_or(0)
            })
            .sum();
    }
    let summary = InferSummary {
        format_version: 1,
        run_id: run_id.to_string(),
        model: offgnn_shared::store::redact(&cfg.model),
        architecture: card.architecture,
        weights_sha256: card.weights_sha256.clone(),
        dataset: cfg.dataset.clone(),
        dataset_fingerprint: fingerprint,
        num_nodes: n,
        edges: edges_total,
        nodes_written: progress.nodes_written,
        columns,
        files: progress.output_files.clone(),
        groups: plan.groups.len() as u64,
        chunk_rows,
        omp_wait_policy: std::env::var(crate::OMP_WAIT_POLICY).unwrap_or_default(),
        memory_limit: cfg.memory,
        memory_planned: plan.planned_bytes,
        layers: progress.figures.clone(),
        edge_bucketing_seconds: progress.edge_bucketing_seconds,
        seconds: started.elapsed().as_secs_f64(),
        device: format!("{:?}", cfg.device),
        aggregate: cfg.aggregate,
    };
    // The commit; a replaced result's parts go only once it is in place.
    let json = serde_json::to_vec_pretty(&summary).expect("summary serializes");
    match commit::commit(&out, COMMIT, json, &run_id, previous.as_ref())? {
        commit::Outcome::Committed => {}
        commit::Outcome::Lost { winner } => {
            let removed = summary
                .files
                .iter()
                .filter(|f| out.delete(f).is_ok())
                .count();
            let _ = std::fs::remove_file(cfg.work_dir.join(PROGRESS));
            return Err(commit::lost(&out.join(COMMIT), &winner, removed).into());
        }
    }
    if let Some(old) = &previous {
        let ours: std::collections::HashSet<&String> = summary.files.iter().collect();
        let old_files = serde_json::from_slice::<serde_json::Value>(&old.body)
            .ok()
            .and_then(|v| serde_json::from_value::<Vec<String>>(v["files"].clone()).ok())
            .unwrap_or_default();
        for name in old_files.iter().filter(|f| !ours.contains(f)) {
            if let Err(e) = out.delete(name) {
                tracing::warn!("could not remove the replaced result's parts: {e}");
                break;
            }
        }
        commit::fault_point(commit::REPLACED_REMOVED);
    }
    // The work directory's files are ours; the result is committed.
    for l in 0..num_layers {
        let _ = std::fs::remove_file(hidden_file(&cfg.work_dir, l));
    }
    for g in 0..plan.groups.len() {
        let _ = std::fs::remove_file(edge_file(&cfg.work_dir, g));
    }
    let _ = std::fs::remove_file(cfg.work_dir.join(PROGRESS));
    Ok(summary)
}

/// The device's budget for destination groups when the aggregation runs on
/// CUDA device `index`, each node costing `node_bytes` there: its free
/// memory, in whole GiB (so that a resumed run plans the same groups while
/// the free figure moves a little), less a source chunk's state
/// (`chunk_bytes`), an edge batch's temporaries and the CUDA context.
/// `None` where the free memory cannot be read.
fn device_budget(
    index: usize,
    node_bytes: u64,
    chunk_bytes: u64,
) -> Result<Option<(Budget, usize)>> {
    let Some((free, total)) = crate::memory::cuda_free_memory(index) else {
        tracing::warn!(
            "cuda:{index}: the CUDA runtime's free memory could not be read; groups are planned by --memory alone"
        );
        return Ok(None);
    };
    let fixed = chunk_bytes + on_device::EDGE_BATCH_BYTES + crate::memory::CUDA_CONTEXT_BYTES;
    let usable = free >> 30 << 30;
    let bytes = usable.checked_sub(fixed).filter(|b| *b > 0).ok_or_else(|| {
        Error::InvalidArgument(format!(
            "cuda:{index} has {} free of {}, below the {} aggregating there needs before any group (a source chunk's state {}, edge batches {}, the CUDA context {}); aggregate on the host (--aggregate host)",
            human_bytes(free),
            human_bytes(total),
            human_bytes(fixed),
            human_bytes(chunk_bytes),
            human_bytes(on_device::EDGE_BATCH_BYTES),
            human_bytes(crate::memory::CUDA_CONTEXT_BYTES)
        ))
    })?;
    tracing::info!(
        "aggregating on cuda:{index}: {} of its {} free for destination groups ({} per node)",
        human_bytes(bytes),
        human_bytes(free),
        human_bytes(node_bytes)
    );
    Ok(Some((
        Budget {
            node_bytes,
            edge_bytes: 0,
            bytes,
        },
        index,
    )))
}

fn file_sync(path: &Path) -> Result<()> {
    File::open(path)
        .and_then(|f| f.sync_all())
        .map_err(|e| Error::io(path.display(), e))
}

fn short(s: &str) -> &str {
    &s[..s.len().min(12)]
}

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

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    const BLOCK: u64 = ALIGN_NODES * (100 + 16);

    fn host(blocks: u64) -> Budget {
        Budget {
            node_bytes: 100,
            edge_bytes: 16,
            bytes: blocks * BLOCK,
        }
    }

    /// Streams a file of `rows` rows of `width` float32 values (row r's
    /// values r * width..) after a header of `offset` bytes, in chunks of
    /// 1024 rows from chunk `first` on; checks each chunk's rows and the
    /// order, and returns the bytes read.
    fn stream_rows(engine: &IoEngine, offset: u64, rows: u64, width: usize, first: usize) -> u64 {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rows.bin");
        let mut bytes = vec![0xA5u8; offset as usize];
        for v in 0..rows as usize * width {
            bytes.extend_from_slice(&(v as f32).to_le_bytes());
        }
        std::fs::write(&path, &bytes).unwrap();
        let input = Input {
            path,
            data_offset: offset,
            rows,
            width,
            dtype: DType::F32,
            pinned: false,
        };
        let chunk_rows = ALIGN_NODES;
        let chunks = rows.div_ceil(chunk_rows) as usize;
        let mut seen = Vec::new();
        let read = input
            .stream(
                engine,
                chunk_rows,
                first,
                &mut StreamTimes::default(),
                &indicatif::ProgressBar::hidden(),
                |c, chunk| {
                    let r0 = c as u64 * chunk_rows;
                    let want: Vec<f32> = (r0 as usize * width
                        ..(r0 + chunk_rows).min(rows) as usize * width)
                        .map(|v| v as f32)
                        .collect();
                    assert!(
                        chunk.values() == want,
                        "offset {offset}, first {first}: chunk {c}"
                    );
                    let t = chunk.tensor();
                    assert_eq!(t.size(), [(want.len() / width) as i64, width as i64]);
                    assert_eq!(t.double_value(&[0, 0]), want[0] as f64);
                    seen.push(c);
                    Ok(())
                },
            )
            .unwrap();
        let order: Vec<usize> = (first..chunks).chain(0..first).collect();
        assert_eq!(seen, order, "offset {offset}, first {first}");
        read
    }

    #[test]
    fn streams_hand_every_row_once_whatever_the_pages() {
        // Chunks of 1024 rows of 3 values are 3 pages; the last chunk is
        // 17 rows, inside one page. A header of 128 bytes puts every chunk
        // boundary inside a page (read once, for the chunk before it, in
        // place); 4096 on one; 130 makes the rows' floats unaligned, so the
        // reader converts them through its buffer instead.
        let rows = 5 * ALIGN_NODES + 17;
        for direct in [true, false] {
            let engine = IoEngine::new(offgnn_shared::io_engine::IoOptions {
                direct,
                ..Default::default()
            });
            for offset in [128u64, 4096, 130] {
                assert_eq!(
                    Input {
                        path: PathBuf::new(),
                        data_offset: offset,
                        rows,
                        width: 3,
                        dtype: DType::F32,
                        pinned: false,
                    }
                    .reads_in_place(),
                    offset % 4 == 0
                );
                for first in [0, 1, 3, 5] {
                    let read = stream_rows(&engine, offset, rows, 3, first);
                    // Every byte from the page the rows start on, once.
                    assert_eq!(
                        read,
                        offset % PAGE + rows * 12,
                        "direct {direct}, offset {offset}, first {first}"
                    );
                }
            }
        }
    }

    /// A buffer to overwrite keeps a reused buffer's values and zeroes
    /// only those it never held; grown, it copies none of the old ones.
    #[test]
    fn buffers_to_overwrite_zero_only_what_they_never_held() {
        let mut spares = Spares::default();
        let mut held = Vec::with_capacity(100);
        held.extend([1.0f32; 40]);
        spares.give(held);
        let buf = spares.take_overwritten(60);
        assert_eq!(buf.len(), 60);
        assert!(buf[..40].iter().all(|&v| v == 1.0) && buf[40..].iter().all(|&v| v == 0.0));
        spares.give(buf);
        let buf = spares.take_overwritten(30);
        assert_eq!(buf.len(), 30);
        spares.give(buf);
        let buf = spares.take_overwritten(1000);
        assert_eq!(buf.len(), 1000);
        assert!(buf.iter().all(|&v| v == 0.0));
    }

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

    /// Rows handed on in runs that straddle the writer's buffers, as
    /// float32 and float16, land in the file from the group's offset on in order, the
    /// last page padded with zeros; the bytes before are not touched and
    /// the buffers come back.
    #[test]
    fn hidden_rows_handed_on_in_runs_land_in_order() {
        let engine = IoEngine::new(offgnn_shared::io_engine::IoOptions::default());
        let dir = tempfile::tempdir().unwrap();
        for f16 in [false, true] {
            let path = dir.path().join(format!("h-{f16}.bin"));
            let elem = if f16 { 2 } else { 4 };
            let values: Vec<f32> = (0..20_000).map(|v| v as f32 * 0.5).collect();
            let offset = 2 * PAGE;
            let padded = (values.len() * elem).div_ceil(PAGE as usize) * PAGE as usize;
            std::fs::write(
                &path,
                vec![0xA5u8; offset as usize + padded + PAGE as usize],
            )
            .unwrap();
            let file = Arc::new(engine.open_write(&path).unwrap());
            let bufs = vec![
                AlignedBuf::new(2 * PAGE as usize),
                AlignedBuf::new(2 * PAGE as usize),
            ];
            let mut w = RowWriter::new(&engine, file, f16, bufs, offset);
            let mut at = 0;
            for run in [1, 2047, 2048, 3000, 1, 5000].into_iter().cycle() {
                let end = (at + run).min(values.len());
                w.put(&values[at..end]).unwrap();
                at = end;
                assert_eq!(w.handed(), at);
                if at == values.len() {
                    break;
                }
            }
            let (written, bufs) = w.finish().unwrap();
            assert_eq!(written, padded as u64, "f16 {f16}");
            assert_eq!(bufs.len(), 2);
            let bytes = std::fs::read(&path).unwrap();
            assert!(bytes[..offset as usize].iter().all(|&b| b == 0xA5));
            let body = &bytes[offset as usize..];
            for (i, v) in values.iter().enumerate() {
                let got = if f16 {
                    half::f16::from_le_bytes([body[2 * i], body[2 * i + 1]]).to_f32()
                } else {
                    f32::from_le_bytes(body[4 * i..4 * i + 4].try_into().unwrap())
                };
                let want = if f16 {
                    half::f16::from_f32(*v).to_f32()
                } else {
                    *v
                };
                assert_eq!(got, want, "f16 {f16}: value {i}");
            }
            assert!(body[values.len() * elem..padded].iter().all(|&b| b == 0));
            assert!(body[padded..].iter().all(|&b| b == 0xA5));
        }
    }

    #[test]
    fn parts_go_to_the_store_in_pieces_and_appear_whole() {
        let dir = tempfile::tempdir().unwrap();
        let out = Store::open(dir.path().to_str().unwrap()).unwrap();
        let pool = std::sync::Mutex::new(Vec::new());
        let a: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
        let b: Vec<u8> = (0..5_000u32).map(|i| (i % 13) as u8).collect();
        std::thread::scope(|scope| {
            let (tx, rx) = std::sync::mpsc::sync_channel(0);
            let store = scope.spawn(|| store_pieces(&out, rx, &pool));
            let mut sa = PartSink::new("p/a.bin", 4096, tx.clone(), &pool);
            let mut sb = PartSink::new("p/b.bin", 4096, tx.clone(), &pool);
            let mut failed = PartSink::new("p/c.bin", 4096, tx, &pool);
            // Interleaved, in writes that straddle the pieces.
            for (x, y) in a.chunks(3000).zip(b.chunks(1500)) {
                sa.write_all(x).unwrap();
                sb.write_all(y).unwrap();
                failed.write_all(y).unwrap();
            }
            assert!(!dir.path().join("p/a.bin").exists(), "visible unfinished");
            assert_eq!(sa.finish().unwrap(), a.len() as u64);
            assert_eq!(sb.finish().unwrap(), b.len() as u64);
            // An encoder that fails drops its sink before the last piece.
            drop(failed);
            store.join().unwrap().unwrap();
        });
        assert!(std::fs::read(dir.path().join("p/a.bin")).unwrap() == a);
        assert!(std::fs::read(dir.path().join("p/b.bin")).unwrap() == b);
        let names: Vec<String> = std::fs::read_dir(dir.path().join("p"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names.len(), 2, "{names:?}");
        // The pieces' buffers came back, at a piece's size.
        let pool = pool.into_inner().unwrap();
        assert!(!pool.is_empty() && pool.iter().all(|b| b.len() == 4096));

        // A part that cannot land stops the store, naming it; its encoder's
        // next piece is refused.
        std::fs::create_dir_all(dir.path().join("p/taken.bin/inside")).unwrap();
        let pool = std::sync::Mutex::new(Vec::new());
        std::thread::scope(|scope| {
            let (tx, rx) = std::sync::mpsc::sync_channel(0);
            let store = scope.spawn(|| store_pieces(&out, rx, &pool));
            let mut sink = PartSink::new("p/taken.bin", 4096, tx.clone(), &pool);
            sink.write_all(&a[..100]).unwrap();
            sink.finish().unwrap();
            let err = store.join().unwrap().unwrap_err();
            assert!(err.to_string().contains("taken.bin"), "{err}");
            let mut next = PartSink::new("p/next.bin", 4096, tx, &pool);
            let refused = next.write_all(&a).unwrap_err();
            assert!(refused.to_string().contains("stopped"), "{refused}");
        });
        assert!(!dir.path().join("p/next.bin").exists());
    }

    #[test]
    fn output_parts_span_row_groups() {
        use arrow::array::AsArray;
        use arrow::datatypes::{Float32Type, Int64Type, UInt64Type};
        let (n, classes, width) = (2 * OUTPUT_GROUP_ROWS + 100, 3, 4);
        let logits: Vec<f32> = (0..n * classes).map(|i| (i % 7) as f32 - 3.0).collect();
        let emb: Vec<f32> = (0..n * width).map(|i| i as f32 * 0.5).collect();
        let outputs = Outputs {
            probabilities: true,
            logits: true,
            embeddings: true,
        };
        // Every row, then every other row.
        for step in [1, 2] {
            let rows: Vec<usize> = (0..n).step_by(step).collect();
            let bytes = output_part(
                &rows,
                10,
                &logits,
                classes,
                Some((&emb, width)),
                outputs,
                Vec::new(),
            )
            .unwrap();
            // Plain and uncompressed floats and node ids (the classes in a
            // dictionary), as the plan's row bytes count them.
            let row_bytes = output_row_bytes(classes, Some(width), outputs);
            assert_eq!(row_bytes, 16 + 4 * (2 * classes + width));
            let floats_and_ids = rows.len() as u64 * (row_bytes as u64 - 8);
            assert!(
                bytes.len() as u64 >= floats_and_ids
                    && (bytes.len() as u64) < rows.len() as u64 * row_bytes as u64,
                "step {step}: {} bytes encoded",
                bytes.len()
            );
            let dir = tempfile::tempdir().unwrap();
            std::fs::write(dir.path().join("part.parquet"), &bytes).unwrap();
            let file = File::open(dir.path().join("part.parquet")).unwrap();
            let reader =
                parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file)
                    .unwrap();
            let groups = reader.metadata().num_row_groups();
            assert_eq!(
                groups,
                rows.len().div_ceil(OUTPUT_GROUP_ROWS),
                "step {step}"
            );
            let (mut ids, mut got_class) = (vec![], vec![]);
            let (mut got_p, mut got_logits, mut got_emb) = (vec![], vec![], vec![]);
            for batch in reader.build().unwrap() {
                let batch = batch.unwrap();
                let col = |name: &str| batch.column_by_name(name).unwrap().clone();
                ids.extend(
                    col("node_id")
                        .as_primitive::<UInt64Type>()
                        .values()
                        .iter()
                        .copied(),
                );
                got_class.extend(
                    col("class")
                        .as_primitive::<Int64Type>()
                        .values()
                        .iter()
                        .copied(),
                );
                for (name, into) in [
                    ("probabilities", &mut got_p),
                    ("logits", &mut got_logits),
                    ("embedding", &mut got_emb),
                ] {
                    let list = col(name);
                    into.extend(
                        list.as_fixed_size_list()
                            .values()
                            .as_primitive::<Float32Type>()
                            .values()
                            .iter()
                            .copied(),
                    );
                }
            }
            assert_eq!(ids, rows.iter().map(|&r| 10 + r as u64).collect::<Vec<_>>());
            let want = |v: &[f32], w: usize| -> Vec<f32> {
                rows.iter()
                    .flat_map(|&r| v[r * w..(r + 1) * w].to_vec())
                    .collect()
            };
            assert!(got_logits == want(&logits, classes), "step {step}: logits");
            assert!(got_emb == want(&emb, width), "step {step}: embeddings");
            // The class is the largest logit's; the probabilities are the
            // softmax of the logits.
            let (mut class, mut p) = (vec![], vec![]);
            for &r in &rows {
                let row = &logits[r * classes..][..classes];
                let best = (0..classes).fold(0, |b, c| if row[c] > row[b] { c } else { b });
                class.push(best as i64);
                let sum: f32 = row.iter().map(|v| v.exp()).sum();
                p.extend(row.iter().map(|v| v.exp() / sum));
            }
            assert_eq!(got_class, class, "step {step}: classes");
            assert_eq!(got_p.len(), p.len());
            for (got, want) in got_p.iter().zip(&p) {
                assert!(
                    (got - want).abs() < 1e-6,
                    "step {step}: {got} against {want}"
                );
            }
        }
    }

    #[test]
    fn edges_by_destination_list_its_sources_in_bucket_order() {
        // Two buckets, each sorted by destination, for the group [10, 14).
        let edges = GroupEdges {
            src: vec![5, 9, 3, 1, 2],
            dst: vec![10, 10, 12, 11, 12],
            offsets: vec![0, 3, 5],
            by_dst: Default::default(),
            in_degree: Default::default(),
        };
        let (starts, src) = edges.by_destination((10, 14));
        assert_eq!(starts, &[0, 2, 3, 5, 5]);
        assert_eq!(src, &[5, 9, 1, 3, 2]);

        // Many buckets and destinations (more than the ranges a thread
        // takes), against each destination's sources listed bucket by
        // bucket.
        let (a, g, buckets) = (1000u64, 3001usize, 17usize);
        let mut rng = rand_pcg::Pcg64Mcg::seed_from_u64(7);
        let (mut src, mut dst, mut offsets) = (Vec::new(), Vec::new(), vec![0u64]);
        let mut want = vec![Vec::new(); g];
        for _ in 0..buckets {
            let mut bucket: Vec<(u32, u32)> = (0..rng.random_range(0..4 * g))
                .map(|_| {
                    (
                        rng.random::<u32>(),
                        (a + rng.random_range(0..g as u64)) as u32,
                    )
                })
                .collect();
            bucket.sort_by_key(|&(_, t)| t);
            for &(u, t) in &bucket {
                want[(t as u64 - a) as usize].push(u);
                src.push(u);
                dst.push(t);
            }
            offsets.push(src.len() as u64);
        }
        let edges = GroupEdges {
            src,
            dst,
            offsets,
            by_dst: Default::default(),
            in_degree: Default::default(),
        };
        let (starts, src) = edges.by_destination((a, a + g as u64));
        for (i, want) in want.iter().enumerate() {
            assert_eq!(
                &src[starts[i] as usize..starts[i + 1] as usize],
                want,
                "node {i}"
            );
        }
        assert_eq!(starts[g] as usize, src.len());
    }

    #[test]
    fn groups_fit_the_host_and_the_device_budget() {
        // 10 blocks of 1024 nodes, an in-edge each: a block costs BLOCK.
        let indegree = vec![1u32; 10 * ALIGN_NODES as usize];
        let k = ALIGN_NODES;
        let (groups, largest) = plan_groups(&indegree, host(3), None).unwrap();
        assert_eq!(
            groups,
            [(0, 3 * k), (3 * k, 6 * k), (6 * k, 9 * k), (9 * k, 10 * k)]
        );
        assert_eq!(largest, 3 * BLOCK);
        // A device that holds two blocks' state (edges cost it nothing)
        // cuts the groups there, whatever the host could hold.
        let device = Budget {
            node_bytes: 100,
            edge_bytes: 0,
            bytes: 2 * k * 100,
        };
        let (groups, largest) = plan_groups(&indegree, host(8), Some((device, 3))).unwrap();
        let starts: Vec<u64> = groups.iter().map(|g| g.0).collect();
        assert_eq!(starts, [0, 2 * k, 4 * k, 6 * k, 8 * k]);
        assert_eq!(groups.last(), Some(&(8 * k, 10 * k)));
        assert_eq!(largest, 2 * BLOCK);
        // A device roomier than the host leaves the host's groups.
        let roomy = Budget {
            bytes: 100 * k * 100,
            ..device
        };
        let (groups, _) = plan_groups(&indegree, host(3), Some((roomy, 0))).unwrap();
        assert_eq!(groups.len(), 4);
    }

    #[test]
    fn a_block_over_either_budget_is_refused_naming_that_memory() {
        let indegree = vec![1u32; 2 * ALIGN_NODES as usize];
        let e = plan_groups(
            &indegree,
            Budget {
                bytes: BLOCK - 1,
                ..host(1)
            },
            None,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("--memory leaves"), "{e}");
        let device = Budget {
            node_bytes: 100,
            edge_bytes: 0,
            bytes: ALIGN_NODES * 100 - 1,
        };
        let e = plan_groups(&indegree, host(4), Some((device, 3)))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("cuda:3") && e.contains("--aggregate host"),
            "{e}"
        );
    }
}
