//! The last layer's output: the selected nodes' rows as Parquet parts
//! under `--out`, encoded in parallel and stored by a thread of their own,
//! each part made visible whole.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::io::Write;
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::sync::{Arc, Mutex};

use arrow::datatypes::{DataType, Field, Schema};
use offgnn_shared::commit::RunId;
use offgnn_shared::dataset::Dataset;
use offgnn_shared::io_engine::AlignedBuf;
use offgnn_shared::store::Store;
use parquet::data_type::{FloatType, Int64Type};
use parquet::errors::ParquetError;
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use parquet::file::writer::{SerializedColumnWriter, SerializedFileWriter};
use parquet::schema::types::{ColumnPath, SchemaDescriptor};
use rayon::prelude::*;

use super::layers::Model;
use super::{InferConfig, NodeSet, Outputs, PAGE};
use crate::error::{Error, Result};

/// The name of part `k` of group `gi`, under the run's directory.
fn part_name(run_id: &RunId, gi: usize, k: usize) -> String {
    format!("{run_id}/part-{gi:06}-{k:04}.parquet")
}

/// Whether `name` (relative to `--out`) is an output part of a run, as
/// [`part_name`] names them.
pub(super) fn is_part(name: &str) -> bool {
    let digits = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_digit());
    let Some((run, file)) = name.split_once('/') else {
        return false;
    };
    let numbers = file
        .strip_prefix("part-")
        .and_then(|f| f.strip_suffix(".parquet"))
        .and_then(|f| f.split_once('-'));
    RunId::is_run_id(run) && numbers.is_some_and(|(g, k)| digits(g, 6) && digits(k, 4))
}

/// Rows per output Parquet file.
const PART_ROWS: usize = 1 << 18;

/// Rows per record batch while a part is encoded.
const OUTPUT_BATCH_ROWS: usize = 8192;

/// Rows per row group of an output part.
const OUTPUT_GROUP_ROWS: usize = 4 * OUTPUT_BATCH_ROWS;

/// Bytes of an output part handed to the store at once.
const OUTPUT_PIECE: usize = 8 << 20;

/// How the output's parts are encoded: in parallel, as many at once as
/// there are threads or as an eighth of `--memory` holds, at least one.
pub(super) struct OutputPlan {
    /// Parts encoded at once.
    pub(super) encoders: u64,
    /// Bytes an encoder hands to the store at once (see [`output_piece`]).
    pub(super) piece: usize,
    /// The embeddings' width: the last layer's input.
    emb_width: usize,
    /// One part's encoder's memory, and the piece being stored's (see
    /// [`output_part_bytes`]).
    part_bytes: u64,
    stored_bytes: u64,
}

impl OutputPlan {
    /// The plan for the nodes `bits` selects, stored in `out`.
    pub(super) fn new(cfg: &InferConfig, model: &Model, bits: &[u64], out: &Store) -> Self {
        let selected_nodes: u64 = bits.iter().map(|w| w.count_ones() as u64).sum();
        let emb_width = model.widths[model.card.num_layers - 1] as usize;
        let classes = model.card.out_channels as usize;
        let out_row_bytes = output_row_bytes(classes, Some(emb_width), cfg.outputs);
        let (part_bytes, stored_bytes) =
            output_part_bytes(selected_nodes, out_row_bytes, out.staged_writer_bytes());
        let piece = output_piece(selected_nodes, out_row_bytes);
        let encoders = (rayon::current_num_threads() as u64)
            .min(cfg.memory / 8 / part_bytes)
            .max(1);
        OutputPlan {
            encoders,
            piece,
            emb_width,
            part_bytes,
            stored_bytes,
        }
    }

    /// The memory of the parts being encoded and of the piece being stored.
    pub(super) fn bytes(&self) -> u64 {
        self.encoders * self.part_bytes + self.stored_bytes
    }
}

/// The last layer's rows of each group on their way to `--out`, as the
/// run's Parquet parts.
pub(super) struct OutputWriter<'a> {
    out: &'a Store,
    run_id: &'a RunId,
    outputs: Outputs,
    classes: usize,
    plan: &'a OutputPlan,
    /// The encoders' own thread pool where they are fewer than the threads.
    encoding: Option<rayon::ThreadPool>,
}

/// An output part as stored: its name, its bytes and its rows.
pub(super) type StoredPart = (String, u64, u64);

impl<'a> OutputWriter<'a> {
    pub(super) fn new(
        out: &'a Store,
        run_id: &'a RunId,
        outputs: Outputs,
        classes: usize,
        plan: &'a OutputPlan,
    ) -> Result<Self> {
        // Fewer encoders than threads: a pool of their own.
        let encoding = (plan.encoders < rayon::current_num_threads() as u64)
            .then(|| {
                rayon::ThreadPoolBuilder::new()
                    .num_threads(plan.encoders as usize)
                    .thread_name(|i| format!("infer-encode-{i}"))
                    .build()
                    .map_err(|cause| Error::ThreadPool {
                        what: "starting the output's encoders",
                        cause,
                    })
            })
            .transpose()?;
        Ok(OutputWriter {
            out,
            run_id,
            outputs,
            classes,
            plan,
            encoding,
        })
    }

    /// Writes group `gi`'s selected rows (`bits`) of the destinations
    /// `[a, b)`: their `logits` and `embedding` rows, as parts of at most
    /// PART_ROWS rows, encoded in parallel and stored by a thread of their
    /// own, so that no encoder's core waits for the disk. An encoder hands
    /// its part's bytes over in pieces of OUTPUT_PIECE bytes, in buffers
    /// that later pieces reuse: a whole part's (over 100 MB) would be fresh
    /// pages. Returns the parts.
    pub(super) fn write_group(
        &self,
        gi: usize,
        (a, b): (u64, u64),
        bits: &[u64],
        logits: &[f32],
        embedding: Option<&[f32]>,
    ) -> Result<Vec<StoredPart>> {
        let keep: Vec<usize> = (a..b)
            .filter(|&v| selected(bits, v))
            .map(|v| (v - a) as usize)
            .collect();
        let pool = Mutex::new(Vec::<AlignedBuf>::new());
        let parts = keep.chunks(PART_ROWS).enumerate().collect::<Vec<_>>();
        let (parts, stored) = std::thread::scope(|scope| {
            // A rendezvous: a piece waits in its encoder's hands until the
            // store takes it, as the plan counts.
            let (tx, rx) = sync_channel::<Piece>(self.plan.encoders as usize);
            let (out, pool) = (self.out, &pool);
            let store = scope.spawn(move || store_pieces(out, rx, pool));
            // As many parts at once as the plan counted.
            let encode = || -> Vec<Result<StoredPart>> {
                parts
                    .into_par_iter()
                    .map_with(tx, |tx, (k, rows)| {
                        let name = part_name(self.run_id, gi, k);
                        let sink = PartSink::new(&name, self.plan.piece, tx.clone(), pool);
                        let sink = output_part(
                            rows,
                            a,
                            logits,
                            self.classes,
                            embedding.map(|e| (e, self.plan.emb_width)),
                            self.outputs,
                            sink,
                        )?;
                        let size = sink.finish()?;
                        Ok((name, size, rows.len() as u64))
                    })
                    .collect()
            };
            let parts = match &self.encoding {
                Some(pool) => pool.install(encode),
                None => encode(),
            };
            let stored = store.join().expect("the output's store does not panic");
            (parts, stored)
        });
        // The store's error first: the encoders' is then only that it
        // stopped.
        stored?;
        parts.into_iter().collect()
    }
}

/// The output's selected nodes, as a bit per node.
pub(super) fn selection(ds: &Dataset, nodes: &NodeSet) -> Result<Vec<u64>> {
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
            if let Some(line) = merged(path, &ids) {
                tracing::warn!("{line}");
            }
            ids.into_iter().for_each(set);
        }
    }
    Ok(bits)
}

/// What selecting `ids` as a set does to the file's list, where it changes
/// it: repeated ids are written once and every row in node id order.
fn merged(path: &std::path::Path, ids: &[u64]) -> Option<String> {
    if ids.windows(2).all(|w| w[0] < w[1]) {
        return None;
    }
    let mut sorted = ids.to_vec();
    sorted.sort_unstable();
    let repeats = sorted.windows(2).filter(|w| w[0] == w[1]).count();
    let first = (repeats > 0)
        .then(|| {
            let mut seen = std::collections::HashSet::new();
            ids.iter().find(|&&v| !seen.insert(v))
        })
        .flatten();
    Some(match first {
        Some(v) => format!(
            "{}: {repeats} of its {} ids are repeats (the first: node {v}); each node is written once, the rows in node id order",
            path.display(),
            ids.len()
        ),
        None => format!(
            "{}: its ids are not ascending; the rows are written in node id order",
            path.display()
        ),
    })
}

fn selected(bits: &[u64], v: u64) -> bool {
    bits[(v / 64) as usize] >> (v % 64) & 1 == 1
}

/// An output row's bytes as encoded (plain, uncompressed): the node id and
/// class, and each list column's floats. `embedding` is the embedding's
/// width where there is one.
fn output_row_bytes(classes: usize, embedding: Option<usize>, outputs: Outputs) -> usize {
    let lists =
        outputs.probabilities as usize + outputs.logits as usize + outputs.link_embedding as usize;
    let embedding = embedding.filter(|_| outputs.embeddings).unwrap_or(0);
    8 + 8 * outputs.class() as usize + 4 * (lists * classes + embedding)
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

/// A part of the output as one Parquet file: the group rows `rows` (indices
/// into the group, whose first node is `a`), their `logits` (`classes` a
/// row) and `embeddings` (a row of `width` each), with the columns
/// `outputs` asks for.
fn output_part<W: Write + Send>(
    rows: &[usize],
    a: u64,
    logits: &[f32],
    classes: usize,
    embeddings: Option<(&[f32], usize)>,
    outputs: Outputs,
    sink: W,
) -> Result<W> {
    let lists = list_columns(logits, classes, embeddings, outputs);
    let class = outputs.class();
    let (descr, props) = part_schema(&lists, class)?;
    let levels = list_levels(&descr, &lists, rows.len());
    let part = PartColumns {
        a,
        logits,
        classes,
        class,
        lists,
        levels,
    };
    let mut w = SerializedFileWriter::new(sink, descr.root_schema_ptr(), Arc::new(props))
        .map_err(parquet_error)?;
    let (mut ints, mut floats) = (Vec::<i64>::new(), Vec::<f32>::new());
    // Row groups of OUTPUT_GROUP_ROWS, each column written whole in turn.
    for group in rows.chunks(OUTPUT_GROUP_ROWS) {
        part.write_row_group(&mut w, group, &mut ints, &mut floats)?;
    }
    w.into_inner().map_err(parquet_error)
}

fn parquet_error(cause: ParquetError) -> Error {
    Error::Parquet { cause }
}

/// A batch's values of a list column, from its rows.
type Fill<'f> = Box<dyn Fn(&[usize], &mut Vec<f32>) + 'f>;

/// Where a list column's values come from: computed for a batch from its
/// rows, or the rows' values to take them from.
enum Values<'v> {
    Computed(Fill<'v>),
    Rows(&'v [f32]),
}

/// A list column: its name, its width and its values.
type List<'v> = (&'static str, usize, Values<'v>);

/// The list columns `outputs` asks for, in the schema's order.
fn list_columns<'v>(
    logits: &'v [f32],
    classes: usize,
    embeddings: Option<(&'v [f32], usize)>,
    outputs: Outputs,
) -> Vec<List<'v>> {
    let embeddings = embeddings.filter(|_| outputs.embeddings);
    let mut lists: Vec<List> = Vec::new();
    if outputs.probabilities {
        let fill: Fill = Box::new(move |rows: &[usize], out: &mut Vec<f32>| {
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
    if outputs.link_embedding {
        lists.push(("embedding", classes, Values::Rows(logits)));
    }
    lists
}

/// The writer properties of an output part, homogeneous or typed, whose
/// float-list columns are `lists`. Uncompressed and plain: float columns
/// barely compress, and a codec or a dictionary would cost more time than
/// the bytes it saves (the classes, few and repeated, keep their
/// dictionary). Statistics on the node ids and classes only, which readers
/// filter on.
pub(crate) fn part_properties<'a>(lists: impl IntoIterator<Item = &'a str>) -> WriterProperties {
    let mut props = WriterProperties::builder()
        .set_compression(parquet::basic::Compression::UNCOMPRESSED)
        .set_dictionary_enabled(false)
        .set_column_dictionary_enabled(ColumnPath::from("class"), true);
    for name in lists {
        props = props.set_column_statistics_enabled(
            ColumnPath::from(vec![name.to_string(), "list".into(), "item".into()]),
            EnabledStatistics::None,
        );
    }
    props.build()
}

/// A part's Parquet schema and writer properties, with the Arrow schema in
/// the footer.
fn part_schema(lists: &[List], class: bool) -> Result<(SchemaDescriptor, WriterProperties)> {
    let item = || Arc::new(Field::new("item", DataType::Float32, false));
    let list_type = |width: usize| DataType::FixedSizeList(item(), width as i32);
    let mut fields = vec![Field::new("node_id", DataType::UInt64, false)];
    if class {
        fields.push(Field::new("class", DataType::Int64, false));
    }
    for (name, width, _) in lists {
        fields.push(Field::new(*name, list_type(*width), false));
    }
    let schema = Schema::new(fields);
    let mut props = part_properties(lists.iter().map(|(name, _, _)| *name));
    // The Parquet schema and the Arrow schema in the footer, as Arrow's
    // writer makes them, so that readers see fixed-size lists.
    let descr = parquet::arrow::ArrowSchemaConverter::new()
        .convert(&schema)
        .map_err(parquet_error)?;
    parquet::arrow::add_encoded_arrow_schema_to_metadata(&schema, &mut props);
    Ok((descr, props))
}

/// Each list column's definition and repetition levels for a batch of
/// rows (at most `rows`). The columns go through Parquet's own writer
/// rather than Arrow's, which derives each value's levels row by row, a
/// large share of the encoding: a list here is never null nor empty, so
/// its levels are the same for every row: the first value starts a row
/// (repetition 0) and every value is present (the leaf's full definition
/// level).
fn list_levels(descr: &SchemaDescriptor, lists: &[List], rows: usize) -> Vec<(Vec<i16>, Vec<i16>)> {
    lists
        .iter()
        .enumerate()
        .map(|(k, (_, width, _))| {
            // The list columns come last.
            let leaf = descr.column(descr.num_columns() - lists.len() + k);
            let n = rows.min(OUTPUT_BATCH_ROWS) * width;
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
        .collect()
}

/// What an output part's row groups are made of: the group's first node
/// `a`, the logits (`classes` a row), and the list columns with their
/// levels (see [`list_levels`]).
struct PartColumns<'v> {
    a: u64,
    logits: &'v [f32],
    classes: usize,
    /// Whether the rows have a class column.
    class: bool,
    lists: Vec<List<'v>>,
    levels: Vec<(Vec<i16>, Vec<i16>)>,
}

impl PartColumns<'_> {
    /// Writes the rows `group` as one row group, each column whole in turn
    /// (`ints` and `floats` are reused buffers).
    fn write_row_group<W: Write + Send>(
        &self,
        w: &mut SerializedFileWriter<W>,
        group: &[usize],
        ints: &mut Vec<i64>,
        floats: &mut Vec<f32>,
    ) -> Result<()> {
        let (a, logits, classes) = (self.a, self.logits, self.classes);
        let mut rg = w.next_row_group().map_err(parquet_error)?;
        let mut column =
            |write: &mut dyn FnMut(&mut SerializedColumnWriter) -> parquet::errors::Result<()>| {
                let mut col = rg
                    .next_column()
                    .map_err(parquet_error)?
                    .expect("a column for each field");
                write(&mut col).map_err(parquet_error)?;
                col.close().map_err(parquet_error)
            };
        column(&mut |col| {
            ints.clear();
            ints.extend(group.iter().map(|&i| (a + i as u64) as i64));
            col.typed::<Int64Type>().write_batch(ints, None, None)?;
            Ok(())
        })?;
        if self.class {
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
                col.typed::<Int64Type>().write_batch(ints, None, None)?;
                Ok(())
            })?;
        }
        for ((_, width, values), (def, rep)) in self.lists.iter().zip(&self.levels) {
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
                            &floats[..]
                        }
                        Values::Computed(fill) => {
                            floats.clear();
                            fill(batch, floats);
                            &floats[..]
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
        rg.close().map_err(parquet_error)?;
        Ok(())
    }
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
    tx: SyncSender<Piece>,
    pool: &'a Mutex<Vec<AlignedBuf>>,
}

impl<'a> PartSink<'a> {
    fn new(
        name: &str,
        piece: usize,
        tx: SyncSender<Piece>,
        pool: &'a Mutex<Vec<AlignedBuf>>,
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
    fn spare(pool: &Mutex<Vec<AlignedBuf>>, piece: usize) -> AlignedBuf {
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
    pub(super) fn finish(mut self) -> Result<u64> {
        self.hand(true)
            .map_err(|e| Error::io(format!("storing {}", self.name), e))?;
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
fn store_pieces(out: &Store, pieces: Receiver<Piece>, pool: &Mutex<Vec<AlignedBuf>>) -> Result<()> {
    let mut open = HashMap::new();
    for Piece {
        name,
        bytes,
        len,
        last,
    } in pieces
    {
        let w = match open.entry(name.clone()) {
            Entry::Occupied(e) => e.into_mut(),
            Entry::Vacant(e) => e.insert(out.staged_writer(&name)?),
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::File;

    /// Every output part, homogeneous or typed, is uncompressed, with a
    /// dictionary only on `class` and no statistics on the float lists.
    #[test]
    fn parts_keep_dictionaries_and_statistics_off_the_float_lists() {
        let props = part_properties(["probabilities", "embedding"]);
        let col = |name: &str| ColumnPath::from(name);
        let item = |name: &str| ColumnPath::from(vec![name.into(), "list".into(), "item".into()]);
        assert!(props.dictionary_enabled(&col("class")));
        assert!(!props.dictionary_enabled(&col("node_id")));
        assert!(!props.dictionary_enabled(&item("embedding")));
        for list in ["probabilities", "embedding"] {
            assert_eq!(
                props.statistics_enabled(&item(list)),
                EnabledStatistics::None
            );
        }
        assert_ne!(
            props.statistics_enabled(&col("node_id")),
            EnabledStatistics::None
        );
        assert_eq!(
            props.compression(&item("embedding")),
            parquet::basic::Compression::UNCOMPRESSED
        );
    }

    #[test]
    fn a_node_list_that_selection_changes_is_said_to() {
        let p = std::path::Path::new("n.npy");
        assert_eq!(super::merged(p, &[1, 3, 7]), None);
        let line = super::merged(p, &[7, 7, 3, 7]).unwrap();
        assert!(
            line.contains("2 of its 4 ids are repeats") && line.contains("node 7"),
            "{line}"
        );
        let line = super::merged(p, &[7, 3]).unwrap();
        assert!(line.contains("not ascending"), "{line}");
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
            link_embedding: false,
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

    /// A link model's part: node ids and its output as `embedding`, no
    /// class column, as many bytes a row as the plan counts.
    #[test]
    fn a_link_models_part_holds_its_output_as_the_embedding() {
        use arrow::array::AsArray;
        use arrow::datatypes::Float32Type;
        let (n, width) = (1000, 5);
        let out: Vec<f32> = (0..n * width).map(|i| i as f32 * 0.25).collect();
        let outputs = Outputs {
            link_embedding: true,
            ..Default::default()
        };
        let rows: Vec<usize> = (0..n).collect();
        let bytes = output_part(&rows, 0, &out, width, None, outputs, Vec::new()).unwrap();
        assert_eq!(output_row_bytes(width, Some(7), outputs), 8 + 4 * width);
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("part.parquet"), &bytes).unwrap();
        let file = File::open(dir.path().join("part.parquet")).unwrap();
        let reader =
            parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file).unwrap();
        let names: Vec<String> = (reader.schema().fields().iter())
            .map(|f| f.name().clone())
            .collect();
        assert_eq!(names, ["node_id", "embedding"]);
        let mut got = Vec::new();
        for batch in reader.build().unwrap() {
            let list = batch.unwrap().column_by_name("embedding").unwrap().clone();
            let values = list
                .as_fixed_size_list()
                .values()
                .as_primitive::<Float32Type>();
            got.extend(values.values().iter().copied());
        }
        assert!(got == out);
    }
}
