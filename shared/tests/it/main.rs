//! Integration tests of the shared crate: the dataset reader against every
//! malformed input it must refuse, the Parquet importer (on Cora and on
//! small hand-made tables), and the CSR built from a real dataset.

mod dataset_reader;
mod parquet_importer;
