//! Integration tests of the shared crate: the dataset reader against every
//! malformed input it must refuse.

mod dataset_reader;
