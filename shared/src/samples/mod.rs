//! The sampler's output format, read by the packer and the trainer.
//!
//! A run lives under one URL, its objects under its run id (`RUN`):
//!
//! ```text
//! samples/RUN/split=train/epoch=0000/part-00000.parquet  (training batches, per epoch)
//! samples/RUN/split=valid/epoch=0000/part-00000.parquet  (sampled once)
//! samples/RUN/split=test/epoch=0000/part-00000.parquet
//! _shards/RUN/shard-00000-of-00004.json                   (sharded runs: what each shard wrote)
//! run.json                                                (the run summary: the commit point)
//! ```
//!
//! `run.json` is created last, conditionally (only where none exists, or in
//! place of the commit an `--overwrite` run read when it started); a run
//! without it is incomplete and is never read. It names its run id and every
//! file with its size and SHA-256. Two runs on one location: one commits,
//! the other removes its objects and fails (see `offgnn_shared::commit`).
//!
//! Each Parquet row is one mini-batch (zstd; row groups of at most ~64 MiB):
//!
//! | column | type | meaning |
//! |---|---|---|
//! | `split` | utf8 | `train`, `valid` or `test` |
//! | `epoch` | uint32 | sampled epoch (0 for valid and test) |
//! | `index` | uint32 | batch position within its split and epoch |
//! | `seeds` | list<uint32> | seed nodes (global ids) |
//! | `labels` | list<uint32> | their labels |
//! | `input_nodes` | list<uint32> | unique global ids of all nodes whose features are read, seeds first |
//! | `block_num_src` | list<uint32> | per layer, input layer first: source-node count |
//! | `block_num_dst` | list<uint32> | per layer: destination-node count (a prefix of the sources) |
//! | `block_edge_offsets` | list<uint64> | layers + 1 offsets into `edge_src`/`edge_dst` |
//! | `edge_src` | list<uint32> | edge sources in the layer's local ids |
//! | `edge_dst` | list<uint32> | edge destinations in local ids, non-decreasing within a layer (typed: within each relation's run) |
//! | `pair_src`, `pair_dst`, `pair_label`, `pair_query` | list<uint32> | link prediction: the batch's pairs (local ids among the seeds), label, query |
//! | `block_relations` | list<uint32> | typed graphs: per layer, input layer first, R + 1 offsets into that layer's edges, relation `r`'s edges between the `r`-th and the next (R: the run summary's relations); empty for one edge type |
//!
//! Local id `i` of any layer is global node `input_nodes[i]`.

use std::sync::Arc;

use arrow::array::{
    ArrayRef, ArrowPrimitiveType, AsArray, BinaryArray, ListArray, PrimitiveArray, RecordBatch,
    StringArray, UInt32Array,
};
use arrow::buffer::{Buffer, OffsetBuffer, ScalarBuffer};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef, UInt32Type, UInt64Type};

use crate::dataset::Split;
use crate::error::{Error, Result};
use crate::store::Store;

pub mod packed_ids;
mod run;
pub use run::{
    DatasetInfo, LinkParams, NodeTypeInfo, RunSummary, SampleFile, SamplingParams, ShardFiles,
    ShardSummary, SplitCounts,
};

/// Name of the run summary, the commit point of a sampling run.
pub const RUN_SUMMARY: &str = "run.json";
/// Format identifier and version of the samples layout.
pub const FORMAT: &str = "offgnn-samples";
/// Version 3 checksums files with CRC32C (version 2 and earlier with
/// SHA-256); version 2 packs `input_nodes`, `edge_src` and `edge_dst`
/// ([`packed_ids`]), where version 1 held them as Parquet lists. All are
/// still read.
pub const FORMAT_VERSION: u32 = 3;

/// One layer's sampled edges in local ids: `src[i] -> dst[i]`, with
/// `dst < num_dst <= num_src`, grouped by destination in increasing order
/// (in a typed graph: within each relation's run of edges).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Block {
    pub num_src: u32,
    pub num_dst: u32,
    pub src: Vec<u32>,
    pub dst: Vec<u32>,
    /// A typed graph's edges by relation: relation `r`'s edges are those
    /// from offset `relations[r]` to `relations[r + 1]` (relations in the
    /// run summary's order, so one offset more than there are relations).
    /// Empty in a graph of one edge type.
    pub relations: Vec<u32>,
}

/// A sampled mini-batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SampledBatch {
    pub split: Split,
    pub epoch: u32,
    /// Position of the batch within its split and epoch.
    pub index: u32,
    pub seeds: Vec<u32>,
    pub labels: Vec<u32>,
    /// Unique global ids of every node whose features the model reads,
    /// seeds first; local id `i` of any layer is `input_nodes[i]`.
    pub input_nodes: Vec<u32>,
    /// Blocks from the input layer (`blocks[0]`, the widest) to the output
    /// layer (whose destinations are the seeds).
    pub blocks: Vec<Block>,
    /// Link prediction: the node pairs the batch scores (empty for node
    /// batches, whose seeds carry labels instead).
    pub pairs: Pairs,
}

/// A link-prediction batch's node pairs, as local ids among its seeds:
/// each with its label (1 an edge, 0 a negative) and the positive it ranks
/// against (its query, numbered within the batch).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Pairs {
    pub src: Vec<u32>,
    pub dst: Vec<u32>,
    pub label: Vec<u32>,
    pub query: Vec<u32>,
}

impl Pairs {
    pub fn len(&self) -> usize {
        self.src.len()
    }

    pub fn is_empty(&self) -> bool {
        self.src.is_empty()
    }

    /// Adds the pair `(src, dst)` of query `query`.
    pub fn push(&mut self, (src, dst): (u32, u32), label: u32, query: u32) {
        self.src.push(src);
        self.dst.push(dst);
        self.label.push(label);
        self.query.push(query);
    }
}

impl SampledBatch {
    pub fn num_edges(&self) -> u64 {
        self.blocks.iter().map(|b| b.src.len() as u64).sum()
    }
}

/// The Arrow schema of a samples file.
pub fn schema() -> SchemaRef {
    let list = |name: &str, item: DataType| {
        Field::new(
            name,
            DataType::List(Arc::new(Field::new_list_field(item, false))),
            false,
        )
    };
    Arc::new(Schema::new(vec![
        Field::new("split", DataType::Utf8, false),
        Field::new("epoch", DataType::UInt32, false),
        Field::new("index", DataType::UInt32, false),
        list("seeds", DataType::UInt32),
        list("labels", DataType::UInt32),
        Field::new("input_nodes", DataType::Binary, false),
        list("block_num_src", DataType::UInt32),
        list("block_num_dst", DataType::UInt32),
        list("block_edge_offsets", DataType::UInt64),
        Field::new("edge_src", DataType::Binary, false),
        Field::new("edge_dst", DataType::Binary, false),
        list("pair_src", DataType::UInt32),
        list("pair_dst", DataType::UInt32),
        list("pair_label", DataType::UInt32),
        list("pair_query", DataType::UInt32),
        list("block_relations", DataType::UInt32),
    ]))
}

/// The pair columns, absent from files written before link prediction.
const PAIR_COLUMNS: [&str; 4] = ["pair_src", "pair_dst", "pair_label", "pair_query"];

/// One list row holding `values`, which the array takes without a copy.
fn list_row<T: ArrowPrimitiveType>(values: Vec<T::Native>) -> ArrayRef {
    Arc::new(ListArray::new(
        Arc::new(Field::new_list_field(T::DATA_TYPE, false)),
        OffsetBuffer::from_lengths([values.len()]),
        Arc::new(PrimitiveArray::<T>::new(ScalarBuffer::from(values), None)),
        None,
    ))
}

/// One binary row holding `parts` packed end to end ([`packed_ids`]).
fn packed_row(parts: &[&[u32]], delta: bool) -> ArrayRef {
    let bytes = packed_ids::pack_parts(parts, delta);
    Arc::new(BinaryArray::new(
        OffsetBuffer::from_lengths([bytes.len()]),
        Buffer::from_vec(bytes),
        None,
    ))
}

/// Encodes one batch as an Arrow record batch of one row, moving its
/// vectors into the arrays (the long id lists packed).
pub fn into_record_batch(b: SampledBatch) -> Result<RecordBatch> {
    let mut at = 0u64;
    let offsets: Vec<u64> = std::iter::once(0)
        .chain(b.blocks.iter().map(|k| {
            at += k.src.len() as u64;
            at
        }))
        .collect();
    let num_src = b.blocks.iter().map(|k| k.num_src).collect();
    let num_dst = b.blocks.iter().map(|k| k.num_dst).collect();
    let relations = b
        .blocks
        .iter()
        .flat_map(|k| k.relations.iter().copied())
        .collect();
    let src: Vec<&[u32]> = b.blocks.iter().map(|k| &k.src[..]).collect();
    let dst: Vec<&[u32]> = b.blocks.iter().map(|k| &k.dst[..]).collect();
    let columns: Vec<ArrayRef> = vec![
        Arc::new(StringArray::from(vec![b.split.name()])),
        Arc::new(UInt32Array::from(vec![b.epoch])),
        Arc::new(UInt32Array::from(vec![b.index])),
        list_row::<UInt32Type>(b.seeds),
        list_row::<UInt32Type>(b.labels),
        packed_row(&[&b.input_nodes], false),
        list_row::<UInt32Type>(num_src),
        list_row::<UInt32Type>(num_dst),
        list_row::<UInt64Type>(offsets),
        packed_row(&src, false),
        packed_row(&dst, true),
        list_row::<UInt32Type>(b.pairs.src),
        list_row::<UInt32Type>(b.pairs.dst),
        list_row::<UInt32Type>(b.pairs.label),
        list_row::<UInt32Type>(b.pairs.query),
        list_row::<UInt32Type>(relations),
    ];
    RecordBatch::try_new(schema(), columns)
        .map_err(|e| Error::InvalidArgument(format!("cannot encode batches: {e}")))
}

/// Encodes batches as one Arrow record batch (one row each).
pub fn to_record_batch(batches: &[SampledBatch]) -> Result<RecordBatch> {
    let rows = batches
        .iter()
        .cloned()
        .map(into_record_batch)
        .collect::<Result<Vec<_>>>()?;
    arrow::compute::concat_batches(&schema(), &rows)
        .map_err(|e| Error::InvalidArgument(format!("cannot encode batches: {e}")))
}

/// A record batch's columns by name, cast with checks; `origin` names the
/// file in errors.
struct Columns<'a> {
    origin: &'a str,
    rb: &'a RecordBatch,
}

impl<'a> Columns<'a> {
    fn bad(&self, fault: String) -> Error {
        Error::Store {
            kind: None,
            url: self.origin.to_string(),
            fault,
        }
    }

    fn col(&self, name: &str) -> Result<&'a ArrayRef> {
        self.rb
            .column_by_name(name)
            .ok_or_else(|| self.bad(format!("no column '{name}': not a samples file")))
    }

    fn list(&self, name: &str) -> Result<&'a ListArray> {
        self.col(name)?
            .as_list_opt::<i32>()
            .ok_or_else(|| self.bad(format!("column '{name}' is not a list")))
    }

    /// Row `row` of an id column: packed (format 2, differences when
    /// `delta`) or a Parquet list (format 1).
    fn ids_of(&self, name: &str, row: usize, delta: bool) -> Result<Vec<u32>> {
        match self.col(name)?.as_binary_opt::<i32>() {
            Some(packed) => packed_ids::unpack(packed.value(row), delta)
                .map_err(|e| self.bad(format!("row {row}: column '{name}': {e}"))),
            None => self.u32s(self.list(name)?, row),
        }
    }

    fn u32s(&self, l: &ListArray, row: usize) -> Result<Vec<u32>> {
        let v = l.value(row);
        v.as_primitive_opt::<UInt32Type>()
            .map(|a| a.values().to_vec())
            .ok_or_else(|| self.bad("a list column does not hold uint32".into()))
    }

    /// Each row's split, epoch and index.
    fn ids(&self) -> Result<Vec<(Split, u32, u32)>> {
        let split = self
            .col("split")?
            .as_string_opt::<i32>()
            .ok_or_else(|| self.bad("column 'split' is not utf8".into()))?;
        let epoch = self
            .col("epoch")?
            .as_primitive_opt::<UInt32Type>()
            .ok_or_else(|| self.bad("column 'epoch' is not uint32".into()))?;
        let index = self
            .col("index")?
            .as_primitive_opt::<UInt32Type>()
            .ok_or_else(|| self.bad("column 'index' is not uint32".into()))?;
        (0..self.rb.num_rows())
            .map(|row| {
                let split = match split.value(row) {
                    "train" => Split::Train,
                    "valid" => Split::Valid,
                    "test" => Split::Test,
                    other => return Err(self.bad(format!("row {row}: unknown split '{other}'"))),
                };
                Ok((split, epoch.value(row), index.value(row)))
            })
            .collect()
    }

    /// Row `row`'s pairs (none in a file without the pair columns), checked:
    /// columns of one length, ends among the `seeds`, labels 0 or 1.
    fn pairs(&self, row: usize, seeds: usize) -> Result<Pairs> {
        if self.rb.column_by_name(PAIR_COLUMNS[0]).is_none() {
            return Ok(Pairs::default());
        }
        let [src, dst, label, query] =
            PAIR_COLUMNS.map(|c| self.list(c).and_then(|l| self.u32s(l, row)));
        let p = Pairs {
            src: src?,
            dst: dst?,
            label: label?,
            query: query?,
        };
        let n = p.src.len();
        if p.dst.len() != n || p.label.len() != n || p.query.len() != n {
            return Err(self.bad(format!("row {row}: pair columns disagree")));
        }
        if p.src.iter().chain(&p.dst).any(|&v| v as usize >= seeds) {
            return Err(self.bad(format!("row {row}: a pair's node is not among the seeds")));
        }
        if p.label.iter().any(|&l| l > 1) {
            return Err(self.bad(format!("row {row}: a pair's label is neither 0 nor 1")));
        }
        Ok(p)
    }

    /// Row `row`'s seeds and input nodes, the seeds a prefix of the inputs.
    fn seeds_and_inputs(&self, row: usize) -> Result<(Vec<u32>, Vec<u32>)> {
        let seeds = self.u32s(self.list("seeds")?, row)?;
        let inputs = self.ids_of("input_nodes", row, false)?;
        if inputs.get(..seeds.len()) != Some(&seeds[..]) {
            return Err(self.bad(format!(
                "row {row}: the seeds are not the first input nodes"
            )));
        }
        Ok((seeds, inputs))
    }
}

/// Each row's identity and input nodes ([`read_inputs`]).
fn inputs_from_record_batch(origin: &str, rb: &RecordBatch) -> Result<Vec<BatchInputs>> {
    let cols = Columns { origin, rb };
    cols.ids()?
        .into_iter()
        .enumerate()
        .map(|(row, (split, epoch, index))| {
            let (_, input_nodes) = cols.seeds_and_inputs(row)?;
            Ok(BatchInputs {
                split,
                epoch,
                index,
                input_nodes,
            })
        })
        .collect()
}

/// Decodes the rows of a record batch, checking the invariants a consumer
/// relies on (ids in range, offsets consistent). `origin` names the file.
pub fn from_record_batch(origin: &str, rb: &RecordBatch) -> Result<Vec<SampledBatch>> {
    let cols = Columns { origin, rb };
    let bad = |fault: String| cols.bad(fault);
    let list = |name: &str| cols.list(name);
    let u32s = |l: &ListArray, row: usize| cols.u32s(l, row);
    let ids = cols.ids()?;
    let labels = list("labels")?;
    let (nsrc, ndst, offs) = (
        list("block_num_src")?,
        list("block_num_dst")?,
        list("block_edge_offsets")?,
    );
    // Absent from files written before typed graphs.
    let relations = match rb.column_by_name("block_relations") {
        Some(_) => Some(list("block_relations")?),
        None => None,
    };
    let mut out = Vec::with_capacity(rb.num_rows());
    for (row, (split, epoch, index)) in ids.into_iter().enumerate() {
        let offsets: Vec<u64> = offs
            .value(row)
            .as_primitive_opt::<UInt64Type>()
            .map(|a| a.values().to_vec())
            .ok_or_else(|| bad("column 'block_edge_offsets' is not uint64".into()))?;
        let (num_src, num_dst) = (u32s(nsrc, row)?, u32s(ndst, row)?);
        let (src, dst) = (
            cols.ids_of("edge_src", row, false)?,
            cols.ids_of("edge_dst", row, true)?,
        );
        let (seeds, input_nodes) = cols.seeds_and_inputs(row)?;
        let layers = num_src.len();
        if num_dst.len() != layers
            || offsets.len() != layers + 1
            || offsets.first() != Some(&0)
            || offsets.last() != Some(&(src.len() as u64))
            || src.len() != dst.len()
            || offsets.windows(2).any(|w| w[0] > w[1])
        {
            return Err(bad(format!("row {row}: block columns disagree")));
        }
        let relation_offsets = match relations {
            Some(l) => u32s(l, row)?,
            None => Vec::new(),
        };
        // Per block, one offset more than there are relations.
        let per_block = relation_offsets.len() / layers.max(1);
        if relation_offsets.len() != per_block * layers || per_block == 1 {
            return Err(bad(format!(
                "row {row}: block_relations disagrees with the blocks"
            )));
        }
        let mut blocks = Vec::with_capacity(layers);
        for l in 0..layers {
            let r = offsets[l] as usize..offsets[l + 1] as usize;
            let block = Block {
                num_src: num_src[l],
                num_dst: num_dst[l],
                src: src[r.clone()].to_vec(),
                dst: dst[r].to_vec(),
                relations: relation_offsets[l * per_block..(l + 1) * per_block].to_vec(),
            };
            if block.num_dst > block.num_src
                || block.num_src as usize > input_nodes.len()
                || block.src.iter().any(|&s| s >= block.num_src)
                || block.dst.iter().any(|&d| d >= block.num_dst)
            {
                return Err(bad(format!(
                    "row {row}: layer {l} has local ids out of range"
                )));
            }
            let runs: Vec<(usize, usize)> = if block.relations.is_empty() {
                vec![(0, block.dst.len())]
            } else {
                let rel = &block.relations;
                if rel[0] != 0
                    || *rel.last().expect("two or more") as usize != block.dst.len()
                    || !rel.is_sorted()
                {
                    return Err(bad(format!(
                        "row {row}: layer {l}'s relation offsets do not cover its edges"
                    )));
                }
                rel.windows(2)
                    .map(|w| (w[0] as usize, w[1] as usize))
                    .collect()
            };
            if runs.into_iter().any(|(a, b)| !block.dst[a..b].is_sorted()) {
                return Err(bad(format!(
                    "row {row}: layer {l}'s edges are not grouped by destination"
                )));
            }
            blocks.push(block);
        }
        let labels = u32s(labels, row)?;
        let pairs = cols.pairs(row, seeds.len())?;
        // A node batch labels its seeds; a link batch its pairs.
        let link_batch = labels.is_empty() && !pairs.is_empty();
        if labels.len() != seeds.len() && !link_batch {
            return Err(bad(format!(
                "row {row}: {} labels for {} seeds",
                labels.len(),
                seeds.len()
            )));
        }
        out.push(SampledBatch {
            split,
            epoch,
            index,
            seeds,
            labels,
            input_nodes,
            blocks,
            pairs,
        });
    }
    Ok(out)
}

/// The relative name of a samples file of run `run_id`.
pub fn file_name(run_id: &str, split: Split, epoch: u32, part: u32) -> String {
    format!(
        "samples/{run_id}/split={}/epoch={epoch:04}/part-{part:05}.parquet",
        split.name()
    )
}

/// Upper bounds on one batch's blocks, input layer first: `(sources,
/// destinations, edges)` of each, for `batch_size` seeds and these
/// fan-outs (input layer first) on a graph of `num_nodes`. Node counts grow
/// from the seeds outwards and stop at the node count; every count
/// saturates rather than overflows. Memory statements rest on these.
pub fn block_bounds(num_nodes: u64, batch_size: u64, fanouts: &[usize]) -> Vec<(u64, u64, u64)> {
    let mut dst = batch_size.min(num_nodes);
    let mut out = Vec::with_capacity(fanouts.len());
    for &f in fanouts.iter().rev() {
        let edges = dst.saturating_mul(f as u64);
        let src = dst.saturating_add(edges).min(num_nodes);
        out.push((src, dst, edges));
        dst = src;
    }
    out.reverse();
    out
}

/// Fetches one samples file and checks its size and checksum against the
/// run summary; returns its bytes and its URL for errors.
fn fetch_checked(store: &Store, file: &SampleFile) -> Result<(String, bytes::Bytes)> {
    let bytes = store.get(&file.object.name)?;
    let origin = format!("{}/{}", store.url().trim_end_matches('/'), file.object.name);
    if !file.object.matches(&bytes) {
        return Err(Error::Store {
            kind: None,
            url: origin,
            fault:
                "size or checksum differs from the run summary: the file is corrupt or was replaced; copy the samples again, or sample again"
                    .into(),
        });
    }
    Ok((origin, bytes))
}

/// Checks that a file held the batches the run summary says.
fn check_count<T>(origin: String, out: Vec<T>, file: &SampleFile) -> Result<Vec<T>> {
    if out.len() != file.batches as usize {
        return Err(Error::Store {
            kind: None,
            url: origin,
            fault: format!(
                "holds {} batches, the run summary says {}",
                out.len(),
                file.batches
            ),
        });
    }
    Ok(out)
}

/// Reads every batch of one samples file, checking its size and checksum
/// against the run summary first.
pub fn read_file(store: &Store, file: &SampleFile) -> Result<Vec<SampledBatch>> {
    let (origin, bytes) = fetch_checked(store, file)?;
    let out = decode_file(&origin, bytes)?;
    check_count(origin, out, file)
}

/// What planning a layout needs of a batch: which batch it is and the nodes
/// whose feature rows it reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchInputs {
    pub split: Split,
    pub epoch: u32,
    pub index: u32,
    pub input_nodes: Vec<u32>,
}

/// The columns [`read_inputs`] decodes; the blocks' edges, most of a
/// file's bytes, are skipped.
const INPUT_COLUMNS: [&str; 5] = ["split", "epoch", "index", "seeds", "input_nodes"];

/// Reads each batch's identity and input nodes from one samples file (size
/// and checksum checked first), decoding only those columns: the packer
/// plans from these and reads the topology again, whole and fully checked,
/// while it packs.
pub fn read_inputs(store: &Store, file: &SampleFile) -> Result<Vec<BatchInputs>> {
    let (origin, bytes) = fetch_checked(store, file)?;
    let out = decode_columns(&origin, bytes, Some(&INPUT_COLUMNS), |rb| {
        inputs_from_record_batch(&origin, rb)
    })?;
    check_count(origin, out, file)
}

/// Decodes the batches of one samples file's bytes: a Parquet file in
/// [`schema`], each row checked by [`from_record_batch`]. `origin` names the
/// file in errors. The fuzz target `samples_decode` drives this with
/// arbitrary bytes: it must return an error, never panic.
pub fn decode_file(origin: &str, bytes: bytes::Bytes) -> Result<Vec<SampledBatch>> {
    decode_columns(origin, bytes, None, |rb| from_record_batch(origin, rb))
}

/// Decodes a samples file's rows with `rows`, reading only `columns` (all
/// when `None`).
fn decode_columns<T>(
    origin: &str,
    bytes: bytes::Bytes,
    columns: Option<&[&str]>,
    mut rows: impl FnMut(&RecordBatch) -> Result<Vec<T>>,
) -> Result<Vec<T>> {
    use parquet::arrow::ProjectionMask;
    use parquet::arrow::arrow_reader::{ArrowReaderOptions, ParquetRecordBatchReaderBuilder};
    let fault = |e: &dyn std::fmt::Display| Error::Store {
        kind: None,
        url: origin.to_string(),
        fault: format!("not a readable samples file: {e}"),
    };
    // The Arrow schema embedded in the footer is not read: arrow-ipc panics
    // on some corrupt ones (found by the fuzz target; the input is kept in
    // tests/fuzz/regressions/samples_decode). The Parquet schema maps to
    // the same Arrow types, and every column is checked below.
    let options = ArrowReaderOptions::new().with_skip_arrow_metadata(true);
    // The parquet crate itself still panics on some corrupt footers (a
    // child count that overflows an allocation, also found by fuzzing): a
    // panic inside it is this file's fault, reported as such. Only calls
    // into parquet are guarded; a panic in our own checks stays a bug.
    let guarded = |step: String| fault(&format!("the Parquet decoder failed ({step})"));
    let mut reader = std::panic::catch_unwind(|| {
        ParquetRecordBatchReaderBuilder::try_new_with_options(bytes, options).and_then(|b| {
            let b = match columns {
                Some(names) => {
                    let mask = ProjectionMask::columns(
                        b.metadata().file_metadata().schema_descr(),
                        names.iter().copied(),
                    );
                    b.with_projection(mask)
                }
                None => b,
            };
            // One mini-batch a record batch: the decoder's buffers (values,
            // and two levels a value) then hold one batch's lists, not 16.
            b.with_batch_size(1).build()
        })
    })
    .map_err(|_| guarded("footer".into()))?
    .map_err(|e| fault(&e))?;
    let mut out = Vec::new();
    loop {
        let next = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| reader.next()))
            .map_err(|_| guarded(format!("row group after {} batches", out.len())))?;
        let Some(rb) = next else { break };
        let rb = rb.map_err(|e| fault(&e))?;
        out.extend(rows(&rb)?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch() -> SampledBatch {
        SampledBatch {
            split: Split::Valid,
            epoch: 0,
            index: 3,
            seeds: vec![5, 9],
            labels: vec![1, 0],
            input_nodes: vec![5, 9, 2, 7],
            blocks: vec![
                Block {
                    num_src: 4,
                    num_dst: 3,
                    src: vec![2, 3, 0],
                    dst: vec![0, 1, 2],
                    relations: Vec::new(),
                },
                Block {
                    num_src: 3,
                    num_dst: 2,
                    src: vec![2, 1],
                    dst: vec![0, 1],
                    relations: Vec::new(),
                },
            ],
            pairs: Pairs::default(),
        }
    }

    /// The same batch as a link-prediction batch: the pair (5, 9) and the
    /// negative (5, 5) rank together; its seeds carry no labels.
    fn link_batch() -> SampledBatch {
        let mut pairs = Pairs::default();
        pairs.push((0, 1), 1, 0);
        pairs.push((0, 0), 0, 0);
        SampledBatch {
            labels: vec![],
            pairs,
            ..batch()
        }
    }

    #[test]
    fn record_batch_round_trip() {
        let batches = vec![
            batch(),
            SampledBatch {
                index: 4,
                ..batch()
            },
            link_batch(),
        ];
        let rb = to_record_batch(&batches).unwrap();
        assert_eq!(from_record_batch("x", &rb).unwrap(), batches);
    }

    #[test]
    fn version_1_files_with_id_lists_still_read_and_damaged_packed_ids_are_refused() {
        let batches = vec![batch(), link_batch()];
        let rb = to_record_batch(&batches).unwrap();
        // Version 1: the packed columns as Parquet lists of uint32.
        let mut fields: Vec<Field> = rb.schema().fields().iter().map(|f| (**f).clone()).collect();
        let mut columns = rb.columns().to_vec();
        for (name, rows) in [
            (
                "input_nodes",
                batches.iter().map(|b| b.input_nodes.clone()).collect(),
            ),
            (
                "edge_src",
                batches
                    .iter()
                    .map(|b| b.blocks.iter().flat_map(|k| k.src.clone()).collect())
                    .collect(),
            ),
            (
                "edge_dst",
                batches
                    .iter()
                    .map(|b| b.blocks.iter().flat_map(|k| k.dst.clone()).collect())
                    .collect::<Vec<_>>(),
            ),
        ] {
            let at = rb.schema().index_of(name).unwrap();
            let list = ListArray::from_iter_primitive::<UInt32Type, _, _>(
                rows.into_iter()
                    .map(|r: Vec<u32>| Some(r.into_iter().map(Some))),
            );
            let item = Arc::new(Field::new_list_field(DataType::UInt32, false));
            let list = ListArray::new(item, list.offsets().clone(), list.values().clone(), None);
            fields[at] = Field::new(name, arrow::array::Array::data_type(&list).clone(), false);
            columns[at] = Arc::new(list);
        }
        let v1 = RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).unwrap();
        assert_eq!(from_record_batch("x", &v1).unwrap(), batches);

        let mut columns = rb.columns().to_vec();
        let at = rb.schema().index_of("edge_src").unwrap();
        columns[at] = Arc::new(BinaryArray::from_vec(vec![&[1u8, 0][..], &[0u8; 4][..]]));
        let damaged = RecordBatch::try_new(rb.schema(), columns).unwrap();
        let e = from_record_batch("x", &damaged).unwrap_err().to_string();
        assert!(e.contains("row 0: column 'edge_src'"), "{e}");
    }

    #[test]
    fn a_file_is_read_only_where_its_size_and_checksum_match_the_run_summary() {
        use sha2::Digest;
        let batches = vec![batch(), link_batch()];
        let rb = to_record_batch(&batches).unwrap();
        let mut bytes = Vec::new();
        let mut w = parquet::arrow::ArrowWriter::try_new(&mut bytes, rb.schema(), None).unwrap();
        w.write(&rb).unwrap();
        w.close().unwrap();
        let store = Store::memory();
        store.put_slice("f.parquet", &bytes).unwrap();
        let file = |crc32c: Option<u32>, sha256: Option<String>| SampleFile {
            object: crate::store::WrittenObject {
                name: "f.parquet".into(),
                size: bytes.len() as u64,
                crc32c,
                sha256,
            },
            split: Split::Valid,
            epoch: 0,
            first_batch: 3,
            batches: 2,
            edges: 10,
            input_nodes: 8,
        };
        let crc = crc32c::crc32c(&bytes);
        let sha = crate::store::hex(&sha2::Sha256::digest(&bytes));
        assert_eq!(read_file(&store, &file(Some(crc), None)).unwrap(), batches);
        // Runs of format 2 and earlier record SHA-256.
        assert_eq!(
            read_file(&store, &file(None, Some(sha.clone()))).unwrap(),
            batches
        );
        let refused = |f: &SampleFile| read_file(&store, f).unwrap_err().to_string();
        for wrong in [
            file(Some(crc ^ 1), None),
            file(None, Some(sha.replacen(&sha[..1], "x", 1))),
            file(None, None),
        ] {
            assert!(refused(&wrong).contains("checksum differs"), "{wrong:?}");
        }
        // One bit changed, the size the same.
        let mut damaged = bytes.clone();
        damaged[bytes.len() / 2] ^= 4;
        store.put_slice("f.parquet", &damaged).unwrap();
        for f in [file(Some(crc), None), file(None, Some(sha))] {
            let e = refused(&f);
            assert!(
                e.contains("f.parquet") && e.contains("checksum differs"),
                "{e}"
            );
        }
    }

    #[test]
    fn pairs_out_of_the_seeds_or_badly_labelled_are_refused_and_old_files_have_none() {
        for (edit, says) in [
            (
                (|p: &mut Pairs| p.dst[1] = 2) as fn(&mut Pairs),
                "a pair's node is not among the seeds",
            ),
            (|p: &mut Pairs| p.label[0] = 3, "neither 0 nor 1"),
            (|p: &mut Pairs| p.query.push(0), "pair columns disagree"),
        ] {
            let mut b = link_batch();
            edit(&mut b.pairs);
            let rb = to_record_batch(&[b]).unwrap();
            let e = from_record_batch("x", &rb).unwrap_err().to_string();
            assert!(e.contains(says), "{e}");
        }
        // A file written before the pair and relation columns reads with no
        // pairs and untyped blocks.
        let rb = to_record_batch(&[batch()]).unwrap();
        let old = rb
            .project(&(0..rb.num_columns() - 5).collect::<Vec<_>>())
            .unwrap();
        assert_eq!(from_record_batch("x", &old).unwrap(), vec![batch()]);
    }

    #[test]
    fn typed_blocks_round_trip_with_their_relations_and_bad_offsets_are_refused() {
        // Two relations: layer 0 has 2 edges of the first and 1 of the
        // second, whose destinations restart (sorted within each run);
        // layer 1 has none of the first.
        let mut b = batch();
        b.blocks[0].src = vec![2, 3, 1];
        b.blocks[0].dst = vec![0, 2, 1];
        b.blocks[0].relations = vec![0, 2, 3];
        b.blocks[1].relations = vec![0, 0, 2];
        let rb = to_record_batch(std::slice::from_ref(&b)).unwrap();
        assert_eq!(from_record_batch("x", &rb).unwrap(), vec![b.clone()]);

        for (edit, says) in [
            (
                (|b: &mut SampledBatch| b.blocks[0].relations = vec![0, 1, 3]) as fn(&mut _),
                "not grouped by destination",
            ),
            (
                |b: &mut SampledBatch| b.blocks[1].relations = vec![0, 1, 3],
                "do not cover its edges",
            ),
            (
                |b: &mut SampledBatch| b.blocks[1].relations = vec![0, 2],
                "block_relations disagrees",
            ),
        ] {
            let mut bad = b.clone();
            edit(&mut bad);
            let rb = to_record_batch(&[bad]).unwrap();
            let e = from_record_batch("x", &rb).unwrap_err().to_string();
            assert!(e.contains(says), "{e}");
        }
    }

    fn parquet_bytes(batches: &[SampledBatch]) -> bytes::Bytes {
        let rb = to_record_batch(batches).unwrap();
        let mut out = Vec::new();
        let mut w = parquet::arrow::ArrowWriter::try_new(&mut out, rb.schema(), None).unwrap();
        w.write(&rb).unwrap();
        w.close().unwrap();
        out.into()
    }

    fn inputs_of(bytes: bytes::Bytes) -> Result<Vec<BatchInputs>> {
        decode_columns("x", bytes, Some(&INPUT_COLUMNS), |rb| {
            inputs_from_record_batch("x", rb)
        })
    }

    #[test]
    fn inputs_are_read_without_the_topology() {
        let batches = vec![
            batch(),
            SampledBatch {
                split: Split::Train,
                epoch: 2,
                index: 4,
                input_nodes: vec![5, 9, 1, 2, 7],
                ..batch()
            },
        ];
        let want: Vec<BatchInputs> = batches
            .iter()
            .map(|b| BatchInputs {
                split: b.split,
                epoch: b.epoch,
                index: b.index,
                input_nodes: b.input_nodes.clone(),
            })
            .collect();
        let bytes = parquet_bytes(&batches);
        assert_eq!(inputs_of(bytes.clone()).unwrap(), want);
        assert_eq!(decode_file("x", bytes).unwrap(), batches);
        // Seeds that do not lead the input nodes: both readers refuse.
        let mut bad = batch();
        bad.input_nodes.swap(0, 2);
        let bytes = parquet_bytes(&[bad]);
        for err in [
            inputs_of(bytes.clone()).unwrap_err(),
            decode_file("x", bytes).unwrap_err(),
        ] {
            assert!(err.to_string().contains("seeds are not the first"), "{err}");
        }
    }

    #[test]
    fn rejects_inconsistent_rows() {
        let mut b = batch();
        b.blocks[1].src[0] = 7; // out of the layer's source range
        let rb = to_record_batch(&[b]).unwrap();
        let err = from_record_batch("file.parquet", &rb)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("file.parquet") && err.contains("out of range"),
            "{err}"
        );
    }
}
