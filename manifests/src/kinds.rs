//! The closed sets of names the formats hold: value types, splits, packing
//! modes and row orders. Each is an enum that serde reads and writes by its
//! name, so a document with any other name is refused while it is parsed.

use std::fmt;

use serde::{Deserialize, Serialize};

/// The type of the values of a feature row, in a feature file or a layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Dtype {
    #[serde(rename = "float32")]
    F32,
    #[serde(rename = "float16")]
    F16,
    /// Only in layouts: the packer narrows rows into it; no feature file
    /// holds it.
    #[serde(rename = "bfloat16")]
    BF16,
}

impl Dtype {
    pub const ALL: [Dtype; 3] = [Dtype::F32, Dtype::F16, Dtype::BF16];

    /// Bytes of one value.
    pub fn size(self) -> u64 {
        match self {
            Dtype::F32 => 4,
            Dtype::F16 | Dtype::BF16 => 2,
        }
    }

    /// The name the formats record (torch's and NumPy's spelling).
    pub fn name(self) -> &'static str {
        match self {
            Dtype::F32 => "float32",
            Dtype::F16 => "float16",
            Dtype::BF16 => "bfloat16",
        }
    }

    /// The type a document names, if it is one.
    pub fn from_name(name: &str) -> Option<Dtype> {
        Dtype::ALL.into_iter().find(|d| d.name() == name)
    }

    /// Bytes of a row of `dim` values; `None` where it would not fit 64 bits.
    pub fn row_bytes(self, dim: u64) -> Option<u64> {
        dim.checked_mul(self.size())
    }
}

impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The three seed splits of a node-classification task.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Split {
    Train,
    Valid,
    Test,
}

impl Split {
    pub const ALL: [Split; 3] = [Split::Train, Split::Valid, Split::Test];

    pub fn name(self) -> &'static str {
        match self {
            Split::Train => "train",
            Split::Valid => "valid",
            Split::Test => "test",
        }
    }

    /// The split a document names, if it is one.
    pub fn from_name(name: &str) -> Option<Split> {
        Split::ALL.into_iter().find(|s| s.name() == name)
    }
}

impl fmt::Display for Split {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How a layout packs each batch's rows that no cache holds (DiskGNN §5.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PackingMode {
    /// Chunks written from sequential passes over the feature file.
    Batched,
    /// Each batch's rows read one by one.
    Individual,
}

impl PackingMode {
    pub fn name(self) -> &'static str {
        match self {
            PackingMode::Batched => "batched",
            PackingMode::Individual => "individual",
        }
    }
}

impl fmt::Display for PackingMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Whether each segment has its own disk cache or the layout one for all.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DiskCacheMode {
    Segmented,
    Global,
}

impl DiskCacheMode {
    pub fn name(self) -> &'static str {
        match self {
            DiskCacheMode::Segmented => "segmented",
            DiskCacheMode::Global => "global",
        }
    }
}

impl fmt::Display for DiskCacheMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How a disk cache's rows are ordered; recorded as `minhash-K` or
/// `bottom-K`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum RowOrder {
    /// DiskGNN §5.1, Algorithm 1: a row's signature is its least batch under
    /// each of `functions` independent random permutations of the batches.
    MinHash { functions: usize },
    /// A row's signature is its `k` least batches under one random
    /// permutation, ascending (a bottom-k sketch): rows whose batch sets
    /// share their first members sit together, so the rows of a page share
    /// more than one batch, and a batch reads fewer pages than under
    /// Algorithm 1's independent minima.
    BottomK { k: usize },
}

impl RowOrder {
    /// The packer's default.
    pub const DEFAULT: RowOrder = RowOrder::BottomK { k: 4 };
    /// The order of layouts that do not record one.
    pub const UNRECORDED: RowOrder = RowOrder::MinHash { functions: 2 };

    /// Its name in a manifest: `minhash-2`, `bottom-4`.
    pub fn name(self) -> String {
        match self {
            RowOrder::MinHash { functions } => format!("minhash-{functions}"),
            RowOrder::BottomK { k } => format!("bottom-{k}"),
        }
    }
}

impl fmt::Display for RowOrder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

impl From<RowOrder> for String {
    fn from(order: RowOrder) -> String {
        order.name()
    }
}

impl TryFrom<String> for RowOrder {
    type Error = String;

    fn try_from(name: String) -> Result<RowOrder, String> {
        let bad = || format!("row order '{name}' is not minhash-K or bottom-K");
        let (kind, k) = name.split_once('-').ok_or_else(bad)?;
        let k: usize = k.parse().map_err(|_| bad())?;
        match kind {
            "minhash" => Ok(RowOrder::MinHash { functions: k }),
            "bottom" => Ok(RowOrder::BottomK { k }),
            _ => Err(bad()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_others_are_refused() {
        for d in Dtype::ALL {
            let json = serde_json::to_string(&d).unwrap();
            assert_eq!(json, format!("\"{}\"", d.name()));
            assert_eq!(serde_json::from_str::<Dtype>(&json).unwrap(), d);
            assert_eq!(Dtype::from_name(d.name()), Some(d));
        }
        assert!(serde_json::from_str::<Dtype>("\"int8\"").is_err());
        for s in Split::ALL {
            assert_eq!(Split::from_name(s.name()), Some(s));
        }
        for order in [RowOrder::DEFAULT, RowOrder::UNRECORDED] {
            let json = serde_json::to_string(&order).unwrap();
            assert_eq!(serde_json::from_str::<RowOrder>(&json).unwrap(), order);
        }
        for bad in ["\"minhash\"", "\"bottom-x\"", "\"random-2\""] {
            let err = serde_json::from_str::<RowOrder>(bad).unwrap_err();
            assert!(
                err.to_string().contains("not minhash-K or bottom-K"),
                "{err}"
            );
        }
        assert_eq!(Dtype::F32.row_bytes(u64::MAX / 2), None);
    }
}
