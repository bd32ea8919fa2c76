//! The Parquet encoder of a samples file: one row per batch, its columns
//! encoded in parallel on the sampling pool.
//!
//! The work is split so that nothing heavy runs on one thread alone: the
//! sampling threads turn each batch into Parquet leaves (Arrow arrays, the
//! long id lists packed, [`Encoded::new`]), and the encoder hands each column's leaf
//! to its own column writer on the pool ([`Encoder::write`]), where pages
//! are encoded and compressed. Only appending the finished column chunks to
//! the object is left to the encoder's thread. Each column's bytes depend
//! only on its values, and row groups end after the same batches whatever
//! the thread count, so a file's bytes depend only on the samples.

use std::io::Write;

use parquet::arrow::ArrowWriter;
use parquet::arrow::arrow_writer::{
    ArrowColumnWriter, ArrowLeafColumn, ArrowRowGroupWriterFactory, compute_leaves,
};
use parquet::basic::{Compression, ZstdLevel};
use parquet::errors::{ParquetError, Result};
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::types::ColumnPath;
use rayon::prelude::*;

use offgnn_shared::samples::{self, SampledBatch};

/// Row groups are closed once this much is buffered.
const ROW_GROUP_BYTES: usize = 16 << 20;

fn properties() -> WriterProperties {
    WriterProperties::builder()
        .set_compression(Compression::ZSTD(
            ZstdLevel::try_new(1).expect("level 1 is valid"),
        ))
        .set_dictionary_enabled(false)
        .set_statistics_enabled(EnabledStatistics::None)
        // Packed ids are as small as their bits: compressing them again
        // would cost more time than it saves bytes. Destinations, packed
        // as differences of 0 and 1, still halve.
        .set_column_compression(ColumnPath::from("input_nodes"), Compression::UNCOMPRESSED)
        .set_column_compression(ColumnPath::from("edge_src"), Compression::UNCOMPRESSED)
        .build()
}

/// A sampled batch made ready for the encoder, on a sampling thread: its
/// row as the Parquet leaves of its columns (values and list levels), in
/// schema order.
pub struct Encoded {
    pub edges: u64,
    pub inputs: u64,
    leaves: Vec<ArrowLeafColumn>,
}

impl Encoded {
    pub fn new(batch: SampledBatch) -> Result<Self> {
        let (edges, inputs) = (batch.num_edges(), batch.input_nodes.len() as u64);
        let row =
            samples::into_record_batch(batch).map_err(|e| ParquetError::General(e.to_string()))?;
        let mut leaves = Vec::with_capacity(row.num_columns());
        for (field, array) in row.schema().fields().iter().zip(row.columns()) {
            leaves.extend(compute_leaves(field, array)?);
        }
        Ok(Self {
            edges,
            inputs,
            leaves,
        })
    }
}

/// A samples file being written: the file writer and the open row group's
/// column writers.
pub struct Encoder<'p, W: Write + Send> {
    pool: &'p rayon::ThreadPool,
    file: SerializedFileWriter<W>,
    factory: ArrowRowGroupWriterFactory,
    columns: Vec<ArrowColumnWriter>,
    rows: usize,
}

impl<'p, W: Write + Send> Encoder<'p, W> {
    pub fn new(out: W, pool: &'p rayon::ThreadPool) -> Result<Self> {
        let arrow = ArrowWriter::try_new(out, samples::schema(), Some(properties()))?;
        let (file, factory) = arrow.into_serialized_writer()?;
        let columns = factory.create_column_writers(0)?;
        Ok(Self {
            pool,
            file,
            factory,
            columns,
            rows: 0,
        })
    }

    /// Appends one row, each column on its own task of the pool; closes
    /// the row group once it holds [`ROW_GROUP_BYTES`].
    pub fn write(&mut self, batch: Encoded) -> Result<()> {
        assert_eq!(
            batch.leaves.len(),
            self.columns.len(),
            "one leaf per column"
        );
        self.pool.install(|| {
            self.columns
                .par_iter_mut()
                .zip(batch.leaves.into_par_iter())
                .try_for_each(|(column, leaf)| column.write(&leaf))
        })?;
        self.rows += 1;
        let buffered: usize = self
            .columns
            .iter()
            .map(ArrowColumnWriter::get_estimated_total_bytes)
            .sum();
        if buffered > ROW_GROUP_BYTES {
            self.close_row_group()?;
        }
        Ok(())
    }

    fn close_row_group(&mut self) -> Result<()> {
        if self.rows == 0 {
            return Ok(());
        }
        let columns = std::mem::take(&mut self.columns);
        // Each column's last page is encoded as it closes.
        let chunks = self.pool.install(|| {
            columns
                .into_par_iter()
                .map(ArrowColumnWriter::close)
                .collect::<Result<Vec<_>>>()
        })?;
        let mut group = self.file.next_row_group()?;
        for chunk in chunks {
            chunk.append_to_row_group(&mut group)?;
        }
        group.close()?;
        self.columns = self
            .factory
            .create_column_writers(self.file.flushed_row_groups().len())?;
        self.rows = 0;
        Ok(())
    }

    /// Closes the last row group and writes the footer.
    pub fn finish(mut self) -> Result<W> {
        self.close_row_group()?;
        self.file.into_inner()
    }
}
