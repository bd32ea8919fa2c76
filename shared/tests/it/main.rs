//! Integration tests of the shared crate: the dataset readers, homogeneous
//! and typed, against every malformed input they must refuse.

mod dataset_reader;
mod typed_dataset;
