//! The packed-layout manifest: schema, format version and validation.
//!
//! The packer writes `manifest.json` last, as the commit point of a layout;
//! the trainer reads nothing the manifest does not name. Every object is
//! named relative to the manifest's directory, with its size and CRC32C.
//! A reader refuses a manifest of another format version instead of
//! misreading it, and refuses object names that would leave the layout.

#![forbid(unsafe_code)]

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

mod kinds;
mod typed;
pub use kinds::{DiskCacheMode, Dtype, PackingMode, RowOrder, Split};
pub use typed::{
    NodeTypePart, TYPED_FORMAT_VERSION, Topology, TopologyTable, TypedBatchShape, TypedBlockShape,
    TypedDatasetRef, TypedManifest, is_typed,
};

/// The manifest format this build reads and writes. Format 2 added
/// `dataset.store_dtype` (rows converted while packing); format 3 names
/// address tables of format OGATBL02 (compressed topology, bit-packed
/// addresses), which builds before it cannot read. Formats 1 and 2 name
/// tables of raw arrays, which this build no longer reads: such a layout
/// is refused with a line that says to pack it again. Format 4 is a
/// layout whose CPU cache follows the batch order (`cpu_cache.policy`
/// `belady`; its address tables carry admissions). Format 5 is a
/// link-prediction layout (`samples.link`; its address tables carry node
/// pairs). The packer writes the oldest format a layout fits, so builds
/// that read format 3 still read static node-classification layouts.
/// Format 6 is a typed graph's layout ([`TypedManifest`]), which
/// [`Manifest::parse`] names and refuses.
pub const FORMAT_VERSION: u32 = 5;
/// The format of a link-prediction layout.
pub const LINK_FORMAT_VERSION: u32 = 5;
/// The format of a layout whose CPU cache follows the batch order.
pub const BELADY_FORMAT_VERSION: u32 = 4;
/// The format of a layout whose CPU cache is static.
pub const STATIC_FORMAT_VERSION: u32 = 3;
/// The oldest manifest format this build reads.
pub const OLDEST_FORMAT_VERSION: u32 = 3;
/// The manifest's own name inside a layout.
pub const MANIFEST: &str = "manifest.json";
/// Disk pages, and the alignment of every region of every object.
pub const PAGE: u64 = 4096;
/// The most an `.npy` header before a feature file's rows takes (format 1's
/// 16-bit header length, and its preamble).
const NPY_HEADER_MOST: u64 = 10 + u16::MAX as u64;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{origin}: not a manifest: {reason}")]
    Malformed { origin: String, reason: String },
    #[error(
        "{origin}: manifest format version {found} is newer than this build understands (up to {TYPED_FORMAT_VERSION}); upgrade offgnn"
    )]
    FutureVersion { origin: String, found: u32 },
    #[error(
        "{origin}: manifest format version {found} is from an older offgnn, whose address tables this build does not read (it reads format {OLDEST_FORMAT_VERSION} to {FORMAT_VERSION}); pack the layout again with this packer"
    )]
    UnsupportedVersion { origin: String, found: u32 },
    #[error("{origin}: invalid manifest: {reason}")]
    Invalid { origin: String, reason: String },
    #[error(
        "{origin}: the layout of a typed graph (format {TYPED_FORMAT_VERSION}), where a homogeneous layout's manifest was expected"
    )]
    Typed { origin: String },
}

#[derive(Deserialize)]
struct VersionProbe {
    format_version: u32,
}

/// Reads only `format_version` and checks that this build can read the rest.
pub fn check_version(origin: &str, bytes: &[u8]) -> Result<u32, Error> {
    let probe: VersionProbe = serde_json::from_slice(bytes).map_err(|e| Error::Malformed {
        origin: origin.to_string(),
        reason: e.to_string(),
    })?;
    match probe.format_version {
        v @ OLDEST_FORMAT_VERSION..=FORMAT_VERSION => Ok(v),
        TYPED_FORMAT_VERSION => Err(Error::Typed {
            origin: origin.to_string(),
        }),
        v if v > TYPED_FORMAT_VERSION => Err(Error::FutureVersion {
            origin: origin.to_string(),
            found: v,
        }),
        v => Err(Error::UnsupportedVersion {
            origin: origin.to_string(),
            found: v,
        }),
    }
}

/// One object of the layout.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Object {
    /// Relative to the manifest's directory, `/`-separated.
    pub name: String,
    pub size: u64,
    /// CRC32C (Castagnoli) of the object's bytes.
    pub crc32c: u32,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DatasetRef {
    pub name: String,
    pub num_nodes: u64,
    pub feature_dim: u64,
    /// The feature file's values: `float32` or `float16`.
    pub feature_dtype: Dtype,
    /// Bytes of a row of the feature file.
    pub row_bytes: u64,
    pub feature_file_bytes: u64,
    /// The feature file that was packed (path or URL), for `packer verify`.
    pub feature_location: String,
    pub dataset_fingerprint: String,
    pub feature_fingerprint: String,
    pub num_classes: u32,
    /// CRC32C of every row of the feature file, taken while packing read
    /// them all (batched packing); `packer verify` reads the file again and
    /// compares. The fingerprint only samples the file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub feature_rows_crc32c: Option<u32>,
    /// How the layout's rows (caches, disk caches, packed chunks) hold
    /// each value when the packer converted them (format 2): `float16` or
    /// `bfloat16` (rounded to nearest even), or `float32` widened from a
    /// `float16` file. Absent: as the feature file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store_dtype: Option<Dtype>,
}

impl DatasetRef {
    /// How the layout's rows hold each value.
    pub fn store_dtype(&self) -> Dtype {
        self.store_dtype.unwrap_or(self.feature_dtype)
    }

    /// Bytes of a row in the layout: the stride of every cache, disk cache
    /// and packed chunk.
    pub fn store_row_bytes(&self) -> u64 {
        match &self.store_dtype {
            // Saturates where a manifest that was never validated would wrap.
            Some(d) => self.feature_dim.saturating_mul(d.size()),
            None => self.row_bytes,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SamplesRef {
    pub location: String,
    /// SHA-256 of the sampler's run.json.
    pub run_sha256: String,
    pub fanouts: Vec<usize>,
    pub batch_size: usize,
    /// Seeds (a link task's pairs) per validation and test batch, where
    /// it differs from `batch_size`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eval_batch_size: Option<usize>,
    pub epochs: u32,
    pub seed: u64,
    /// The graph the sampler built from the dataset's edges, which
    /// inference must build the same. Absent in layouts of older packers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub graph: Option<GraphOptions>,
    /// Link-prediction samples (`sampler --task link`): their batches score
    /// node pairs instead of labelling seeds. Absent in node layouts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link: Option<LinkSamples>,
}

/// How a link-prediction run drew its negatives, under the names of the
/// sampler's run summary's `params.link`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LinkSamples {
    /// Negatives per training positive.
    pub negatives: u32,
    /// `uniform` or `degree`.
    pub negative_sampler: String,
}

/// How the sampler turned the dataset's edge list into its graph, under the
/// names of its run summary's `params`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GraphOptions {
    /// The reverse of every edge added (an undirected graph).
    pub add_reverse_edges: bool,
    /// Each (source, destination) pair kept once.
    pub dedup_edges: bool,
    /// `v -> v` edges kept.
    pub keep_self_loops: bool,
}

/// One cache tier: rows in slot order in one object.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Tier {
    pub object: Option<String>,
    pub rows: u64,
    pub budget_bytes: u64,
    /// How the tier's rows change while training (the CPU cache's; the
    /// GPU cache is static).
    #[serde(default, skip_serializing_if = "CachePolicy::is_static")]
    pub policy: CachePolicy,
}

/// What a cache tier holds as training goes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CachePolicy {
    /// The most frequently read rows, the same for every batch (DiskGNN §4).
    #[default]
    Static,
    /// Starts as the static rows each epoch; each training batch's table
    /// admits rows it read from disk in place of the rows read again
    /// furthest ahead (Belady's policy, as Ginex computes it, §3.4).
    Belady,
    /// As `belady`, but each row read goes in, in place of a random row
    /// that the next few batches do not read (GIDS's window buffering).
    Window,
}

impl CachePolicy {
    pub fn is_static(&self) -> bool {
        *self == CachePolicy::Static
    }

    pub fn name(self) -> &'static str {
        match self {
            CachePolicy::Static => "static",
            CachePolicy::Belady => "belady",
            CachePolicy::Window => "window",
        }
    }
}

/// A segment: its object holds the disk cache, then each batch's packed
/// chunk; its table object holds the batches' address tables.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Segment {
    pub object: String,
    pub table: String,
    pub split: Split,
    pub batches: u32,
    pub disk_cache_rows: u64,
    pub disk_cache_bytes: u64,
    pub packed_rows: u64,
    pub chunk_bytes: u64,
}

/// Where one batch lives: segment index and record index in its table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchRef {
    pub segment: u32,
    pub record: u32,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Packing {
    pub mode: PackingMode,
    pub disk_cache: DiskCacheMode,
    pub segment_size: usize,
    /// Whether the segment size came from the search (Algorithm 2).
    pub searched: bool,
    /// Algorithm 2's estimate of the training segments' bytes.
    pub estimated_bytes: Option<u64>,
    /// Feature-file partitions read (batched packing).
    pub partitions: u64,
    /// Random permutations of the batches the row order drew.
    pub minhash_functions: usize,
    /// How the disk caches' rows are ordered. Absent in layouts from
    /// before: [`RowOrder::UNRECORDED`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub row_order: Option<RowOrder>,
}

impl Packing {
    pub fn row_order(&self) -> RowOrder {
        self.row_order.unwrap_or(RowOrder::UNRECORDED)
    }
}

/// Shares of training-batch row accesses served by each tier.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct AccessShares {
    pub gpu: f64,
    pub cpu: f64,
    pub disk_cache: f64,
    pub packed: f64,
}

/// The largest batch of the layout, figure by figure: each is the maximum
/// over all batches (of every split), so together they bound any one batch.
/// The trainer states its memory from them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchShape {
    /// Input nodes (rows of the assembled feature matrix).
    pub inputs: u64,
    /// Per block, input layer first: `[sources, destinations, edges]`.
    pub blocks: Vec<[u64; 3]>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub format_version: u32,
    /// The packer run whose objects this manifest commits; they are named
    /// under `pack/RUN/` (empty for layouts from before run ids).
    #[serde(default)]
    pub run_id: String,
    pub created_by: String,
    pub dataset: DatasetRef,
    pub samples: SamplesRef,
    pub gpu_cache: Tier,
    pub cpu_cache: Tier,
    pub packing: Packing,
    pub segments: Vec<Segment>,
    /// Batches of each split per sampled epoch, in the order the trainer
    /// consumes them.
    #[serde(with = "schedule_by_name")]
    pub schedule: BTreeMap<Split, Vec<Vec<BatchRef>>>,
    pub objects: Vec<Object>,
    /// Bytes of every object on disk (features, address tables, topology):
    /// what the disk budget bounds (format 3; before, only the features).
    pub disk_bytes: u64,
    /// Bytes of the feature objects (caches and segments); the rest of
    /// `disk_bytes` is the address tables.
    pub feature_disk_bytes: u64,
    /// `disk_bytes / feature_file_bytes`.
    pub blow_up: f64,
    /// Bytes a training epoch reads from disk over the bytes of the rows it
    /// needs from disk (averaged over the sampled epochs).
    pub predicted_read_amplification: f64,
    pub access_shares: AccessShares,
    /// Absent in layouts packed before it was recorded: the trainer then
    /// bounds batches by the sampling fan-outs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub largest_batch: Option<BatchShape>,
}

/// The schedule's splits are written in the order of their names, as
/// manifests have always been, so that a layout's bytes do not depend on
/// the enum's order.
mod schedule_by_name {
    use std::collections::BTreeMap;

    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    use super::{BatchRef, Split};

    type Schedule = BTreeMap<Split, Vec<Vec<BatchRef>>>;

    pub fn serialize<S: Serializer>(schedule: &Schedule, s: S) -> Result<S::Ok, S::Error> {
        let by_name: BTreeMap<&str, _> = schedule.iter().map(|(k, v)| (k.name(), v)).collect();
        by_name.serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Schedule, D::Error> {
        Schedule::deserialize(d)
    }
}

/// Decodes a manifest of a version already checked, then `validate`s it.
fn decode_valid<T: serde::de::DeserializeOwned>(
    origin: &str,
    bytes: &[u8],
    validate: impl FnOnce(&T) -> Result<(), String>,
) -> Result<T, Error> {
    let m: T = serde_json::from_slice(bytes).map_err(|e| Error::Malformed {
        origin: origin.to_string(),
        reason: e.to_string(),
    })?;
    validate(&m).map_err(|reason| Error::Invalid {
        origin: origin.to_string(),
        reason,
    })?;
    Ok(m)
}

/// The objects' names, each checked to stay inside the layout and to be
/// listed once.
fn object_names(objects: &[Object]) -> Result<std::collections::HashSet<&str>, String> {
    let mut names = std::collections::HashSet::new();
    for o in objects {
        if !safe_name(&o.name) {
            return Err(format!(
                "object name '{}' leaves the layout's directory",
                o.name
            ));
        }
        if !names.insert(o.name.as_str()) {
            return Err(format!("object '{}' is listed twice", o.name));
        }
    }
    Ok(names)
}

/// `n` must be among the objects `names`.
fn named_in(names: &std::collections::HashSet<&str>, n: &str) -> Result<(), String> {
    if names.contains(n) {
        Ok(())
    } else {
        Err(format!("'{n}' is not among the manifest's objects"))
    }
}

fn safe_name(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with('/')
        && !name.contains('\\')
        && name
            .split('/')
            .all(|p| !p.is_empty() && p != "." && p != "..")
}

impl Manifest {
    /// Parses and validates a manifest: version first, then the schema,
    /// then the references between its parts.
    pub fn parse(origin: &str, bytes: &[u8]) -> Result<Manifest, Error> {
        check_version(origin, bytes)?;
        decode_valid(origin, bytes, Manifest::validate)
    }

    /// Checks that every reference resolves inside the layout.
    pub fn validate(&self) -> Result<(), String> {
        if let Some(shape) = &self.largest_batch
            && shape.blocks.len() != self.samples.fanouts.len()
        {
            return Err(format!(
                "largest_batch has {} blocks, the sampling {} layers",
                shape.blocks.len(),
                self.samples.fanouts.len()
            ));
        }
        if !self.gpu_cache.policy.is_static() {
            return Err("the GPU cache is static; its policy cannot be another".into());
        }
        if self.samples.link.is_some() && self.format_version < LINK_FORMAT_VERSION {
            return Err(format!(
                "link-prediction samples in a manifest of format {}",
                self.format_version
            ));
        }
        if !self.cpu_cache.policy.is_static() && self.format_version < BELADY_FORMAT_VERSION {
            return Err(format!(
                "a {} CPU cache in a manifest of format {}",
                self.cpu_cache.policy.name(),
                self.format_version
            ));
        }
        let names = object_names(&self.objects)?;
        let named = |n: &str| named_in(&names, n);
        for tier in [&self.gpu_cache, &self.cpu_cache] {
            if let Some(o) = &tier.object {
                named(o)?;
            }
        }
        for s in &self.segments {
            named(&s.object)?;
            named(&s.table)?;
        }
        for epochs in self.schedule.values() {
            for refs in epochs {
                for r in refs {
                    let seg = self.segments.get(r.segment as usize).ok_or_else(|| {
                        format!(
                            "schedule names segment {} of {}",
                            r.segment,
                            self.segments.len()
                        )
                    })?;
                    if r.record >= seg.batches {
                        return Err(format!(
                            "schedule names record {} of segment {} which holds {}",
                            r.record, r.segment, seg.batches
                        ));
                    }
                }
            }
        }
        if self
            .schedule
            .get(&Split::Train)
            .is_none_or(|e| e.is_empty())
        {
            return Err("the schedule has no training epochs".into());
        }
        if self.dataset.row_bytes == 0 || self.dataset.num_nodes == 0 {
            return Err("dataset shape is empty".into());
        }
        let d = &self.dataset;
        if d.feature_dtype == Dtype::BF16 {
            return Err("feature_dtype 'bfloat16' is not float32 or float16".into());
        }
        // A crafted feature_dim must be refused, not wrap a row's size.
        if d.feature_dtype.row_bytes(d.feature_dim) != Some(d.row_bytes) {
            return Err(format!(
                "row_bytes {} is not feature_dim {} {} values",
                d.row_bytes, d.feature_dim, d.feature_dtype
            ));
        }
        // The feature file's rows, an .npy header before them.
        let rows_bytes = d.num_nodes.checked_mul(d.row_bytes);
        if d.feature_file_bytes > 0
            && rows_bytes.is_none_or(|r| {
                r > d.feature_file_bytes || d.feature_file_bytes - r > NPY_HEADER_MOST
            })
        {
            return Err(format!(
                "feature_file_bytes {} cannot hold num_nodes {} rows of row_bytes {} and an .npy header",
                d.feature_file_bytes, d.num_nodes, d.row_bytes
            ));
        }
        if self.samples.link.is_none() && d.num_classes == 0 {
            return Err("num_classes is 0 in a node-classification layout".into());
        }
        let stored = d.store_row_bytes();
        for (name, tier) in [
            ("gpu_cache", &self.gpu_cache),
            ("cpu_cache", &self.cpu_cache),
        ] {
            let Some(bytes) = tier.rows.checked_mul(stored) else {
                return Err(format!(
                    "{name} holds {} rows of {stored} bytes: more bytes than a 64-bit size",
                    tier.rows
                ));
            };
            // The tier's object holds its rows, padded to whole pages.
            let object = tier.object.as_deref().and_then(|o| self.object(o));
            if let Some(o) = object
                && o.size != bytes.div_ceil(PAGE) * PAGE
            {
                return Err(format!(
                    "{name} holds {} rows of {stored} bytes, but its object {} is {} bytes",
                    tier.rows, o.name, o.size
                ));
            }
        }
        Ok(())
    }

    pub fn object(&self, name: &str) -> Option<&Object> {
        self.objects.iter().find(|o| o.name == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn sample() -> Manifest {
        let obj = |name: &str| Object {
            name: name.into(),
            size: 4096,
            crc32c: 7,
        };
        Manifest {
            run_id: String::new(),
            format_version: FORMAT_VERSION,
            created_by: "test".into(),
            dataset: DatasetRef {
                name: "d".into(),
                num_nodes: 10,
                feature_dim: 4,
                feature_dtype: Dtype::F32,
                row_bytes: 16,
                feature_file_bytes: 288,
                feature_location: "feat.npy".into(),
                dataset_fingerprint: "a".into(),
                feature_fingerprint: "b".into(),
                num_classes: 2,
                feature_rows_crc32c: None,
                store_dtype: None,
            },
            samples: SamplesRef {
                location: "s".into(),
                run_sha256: "c".into(),
                fanouts: vec![2],
                batch_size: 4,
                eval_batch_size: None,
                epochs: 1,
                seed: 0,
                graph: None,
                link: None,
            },
            gpu_cache: Tier {
                object: Some("pack/gpu_cache.bin".into()),
                rows: 1,
                budget_bytes: 16,
                policy: CachePolicy::Static,
            },
            cpu_cache: Tier {
                object: None,
                rows: 0,
                budget_bytes: 0,
                policy: CachePolicy::Static,
            },
            packing: Packing {
                mode: PackingMode::Batched,
                disk_cache: DiskCacheMode::Segmented,
                segment_size: 1,
                searched: false,
                estimated_bytes: None,
                partitions: 1,
                minhash_functions: 2,
                row_order: None,
            },
            segments: vec![Segment {
                object: "pack/segment-00000.bin".into(),
                table: "pack/table-00000.bin".into(),
                split: Split::Train,
                batches: 1,
                disk_cache_rows: 0,
                disk_cache_bytes: 0,
                packed_rows: 3,
                chunk_bytes: 4096,
            }],
            schedule: BTreeMap::from([(
                Split::Train,
                vec![vec![BatchRef {
                    segment: 0,
                    record: 0,
                }]],
            )]),
            objects: vec![
                obj("pack/gpu_cache.bin"),
                obj("pack/segment-00000.bin"),
                obj("pack/table-00000.bin"),
            ],
            disk_bytes: 3 * 4096,
            feature_disk_bytes: 2 * 4096,
            blow_up: 42.0,
            predicted_read_amplification: 1.0,
            access_shares: AccessShares {
                gpu: 0.25,
                cpu: 0.0,
                disk_cache: 0.0,
                packed: 0.75,
            },
            largest_batch: Some(BatchShape {
                inputs: 3,
                blocks: vec![[3, 1, 2]],
            }),
        }
    }

    #[test]
    fn round_trips_and_validates() {
        let m = sample();
        let bytes = serde_json::to_vec(&m).unwrap();
        assert_eq!(Manifest::parse("m.json", &bytes).unwrap(), m);
    }

    // Numbers edited by hand that the layout's objects contradict: a
    // narrower row over the same feature file, a cache object of another
    // size than its rows, no classes for node labels.
    #[test]
    fn numbers_the_layout_contradicts_are_refused() {
        let refused = |edit: &dyn Fn(&mut Manifest), says: &str| {
            let mut m = sample();
            edit(&mut m);
            let err = Manifest::parse("m.json", &serde_json::to_vec(&m).unwrap()).unwrap_err();
            assert!(err.to_string().contains(says), "{err}");
        };
        let wide = |m: &mut Manifest| {
            m.dataset.num_nodes = 100_000;
            m.dataset.feature_file_bytes = 128 + 100_000 * 16;
        };
        let mut m = sample();
        wide(&mut m);
        Manifest::parse("m.json", &serde_json::to_vec(&m).unwrap()).unwrap();
        refused(
            &|m| {
                wide(m);
                m.dataset.feature_dim = 2;
                m.dataset.row_bytes = 8;
            },
            "cannot hold num_nodes 100000 rows of row_bytes 8",
        );
        refused(&|m| m.dataset.num_classes = 0, "num_classes is 0");
        refused(&|m| m.gpu_cache.rows = 1000, "but its object");
    }

    #[test]
    fn the_largest_batch_is_optional_and_matches_the_layers() {
        let mut m = sample();
        m.largest_batch = None;
        let bytes = serde_json::to_vec(&m).unwrap();
        assert!(!String::from_utf8_lossy(&bytes).contains("largest_batch"));
        assert_eq!(Manifest::parse("m.json", &bytes).unwrap(), m);
        let mut m = sample();
        m.largest_batch = Some(BatchShape {
            inputs: 3,
            blocks: vec![[3, 1, 2], [1, 1, 0]],
        });
        let err = Manifest::parse("m.json", &serde_json::to_vec(&m).unwrap()).unwrap_err();
        assert!(err.to_string().contains("2 blocks"), "{err}");
    }

    #[test]
    fn converted_rows_have_their_own_stride() {
        let mut m = sample();
        assert_eq!(
            (m.dataset.store_dtype(), m.dataset.store_row_bytes()),
            (Dtype::F32, 16)
        );
        m.dataset.store_dtype = Some(Dtype::BF16);
        let bytes = serde_json::to_vec(&m).unwrap();
        let back = Manifest::parse("m.json", &bytes).unwrap();
        assert_eq!(
            (back.dataset.store_dtype(), back.dataset.store_row_bytes()),
            (Dtype::BF16, 8)
        );
        let doc = String::from_utf8(serde_json::to_vec(&m).unwrap()).unwrap();
        let doc = doc.replace(r#""store_dtype":"bfloat16""#, r#""store_dtype":"int8""#);
        let err = Manifest::parse("m.json", doc.as_bytes()).unwrap_err();
        assert!(err.to_string().contains("unknown variant `int8`"), "{err}");
        // Formats 1 and 2 name tables of raw arrays: refused, saying to re-pack.
        let mut m = sample();
        for old in [1, 2] {
            m.format_version = old;
            let err = Manifest::parse("m.json", &serde_json::to_vec(&m).unwrap()).unwrap_err();
            assert!(matches!(err, Error::UnsupportedVersion { .. }), "{err}");
            assert!(err.to_string().contains("pack the layout again"), "{err}");
        }
        m.format_version = 0;
        let err = Manifest::parse("m.json", &serde_json::to_vec(&m).unwrap()).unwrap_err();
        assert!(matches!(err, Error::UnsupportedVersion { found: 0, .. }));
    }

    #[test]
    fn link_samples_need_the_format_that_carries_pairs() {
        let mut m = sample();
        m.samples.link = Some(LinkSamples {
            negatives: 4,
            negative_sampler: "uniform".into(),
        });
        let back = Manifest::parse("m.json", &serde_json::to_vec(&m).unwrap()).unwrap();
        assert_eq!(back.samples.link, m.samples.link);
        m.format_version = BELADY_FORMAT_VERSION;
        let err = Manifest::parse("m.json", &serde_json::to_vec(&m).unwrap()).unwrap_err();
        assert!(
            err.to_string()
                .contains("link-prediction samples in a manifest of format 4"),
            "{err}"
        );
    }

    #[test]
    fn refuses_row_sizes_that_overflow() {
        // feature_dim * 4 wraps to a small row_bytes in 64 bits: refused, not wrapped.
        let mut m = sample();
        m.dataset.feature_dim = (1u64 << 62) + 4;
        m.dataset.row_bytes = 16;
        let err = Manifest::parse("m.json", &serde_json::to_vec(&m).unwrap()).unwrap_err();
        assert!(
            err.to_string().contains("row_bytes 16 is not feature_dim"),
            "{err}"
        );
        // A cache whose bytes exceed 64 bits.
        let mut m = sample();
        m.cpu_cache.rows = u64::MAX / 2;
        let err = Manifest::parse("m.json", &serde_json::to_vec(&m).unwrap()).unwrap_err();
        assert!(err.to_string().contains("cpu_cache holds"), "{err}");
        // A manifest never validated saturates instead of wrapping.
        let mut m = sample();
        m.dataset.feature_dim = u64::MAX / 2;
        m.dataset.store_dtype = Some(Dtype::F32);
        assert_eq!(m.dataset.store_row_bytes(), u64::MAX);
    }

    #[test]
    fn names_outside_their_sets_are_refused_and_splits_keep_their_order() {
        let mut m = sample();
        m.schedule.insert(Split::Test, vec![vec![]]);
        m.schedule.insert(Split::Valid, vec![vec![]]);
        let doc = String::from_utf8(serde_json::to_vec(&m).unwrap()).unwrap();
        // Written by name, as before the splits were an enum.
        let at = |k: &str| doc.find(&format!(r#""{k}":[["#)).unwrap();
        assert!(
            at("test") < at("train") && at("train") < at("valid"),
            "{doc}"
        );
        assert_eq!(Manifest::parse("m.json", doc.as_bytes()).unwrap(), m);
        for (from, to, says) in [
            (r#""valid":"#, r#""holdout":"#, "unknown variant `holdout`"),
            (
                r#""mode":"batched""#,
                r#""mode":"packed""#,
                "unknown variant `packed`",
            ),
            (
                r#""disk_cache":"segmented""#,
                r#""disk_cache":"none""#,
                "unknown variant `none`",
            ),
            (
                r#""feature_dtype":"float32""#,
                r#""feature_dtype":"bfloat16""#,
                "feature_dtype 'bfloat16'",
            ),
        ] {
            let bad = doc.replacen(from, to, 1);
            assert_ne!(bad, doc, "{from}");
            let err = Manifest::parse("m.json", bad.as_bytes()).unwrap_err();
            assert!(err.to_string().contains(says), "{from}: {err}");
        }
        m.packing.row_order = Some(RowOrder::DEFAULT);
        let doc = String::from_utf8(serde_json::to_vec(&m).unwrap()).unwrap();
        assert!(doc.contains(r#""row_order":"bottom-4""#), "{doc}");
        let bad = doc.replace("bottom-4", "bottom-four");
        let err = Manifest::parse("m.json", bad.as_bytes()).unwrap_err();
        assert!(
            err.to_string().contains("not minhash-K or bottom-K"),
            "{err}"
        );
    }

    #[test]
    fn refuses_a_future_version_by_name() {
        let mut m = sample();
        m.format_version = TYPED_FORMAT_VERSION + 1;
        let err = Manifest::parse("s3://b/m.json", &serde_json::to_vec(&m).unwrap()).unwrap_err();
        assert!(matches!(err, Error::FutureVersion { .. }));
        assert!(
            err.to_string().contains("s3://b/m.json") && err.to_string().contains("upgrade"),
            "{err}"
        );
        // A typed layout is named as one, not as a future version.
        m.format_version = TYPED_FORMAT_VERSION;
        let err = Manifest::parse("m.json", &serde_json::to_vec(&m).unwrap()).unwrap_err();
        assert!(err.to_string().contains("of a typed graph"), "{err}");
    }

    #[test]
    fn refuses_documents_without_a_version_or_fields() {
        assert!(matches!(
            check_version("m", b"{}"),
            Err(Error::Malformed { .. })
        ));
        assert!(matches!(
            check_version("m", b"not json"),
            Err(Error::Malformed { .. })
        ));
        let doc = format!(r#"{{"format_version": {FORMAT_VERSION}}}"#);
        let err = Manifest::parse("m.json", doc.as_bytes()).unwrap_err();
        assert!(matches!(err, Error::Malformed { .. }), "{err}");
        assert!(err.to_string().contains("missing field"), "{err}");
    }

    #[test]
    fn refuses_paths_that_escape_and_dangling_references() {
        for bad in ["../etc/passwd", "/abs", "pack/../../x", "pack//x", "."] {
            let mut m = sample();
            m.objects[0].name = bad.into();
            m.gpu_cache.object = Some(bad.into());
            let err = Manifest::parse("m.json", &serde_json::to_vec(&m).unwrap()).unwrap_err();
            assert!(
                err.to_string().contains("leaves the layout"),
                "{bad}: {err}"
            );
        }
        let mut m = sample();
        m.schedule.get_mut(&Split::Train).unwrap()[0][0].record = 5;
        let err = Manifest::parse("m.json", &serde_json::to_vec(&m).unwrap()).unwrap_err();
        assert!(err.to_string().contains("record 5"), "{err}");
        let mut m = sample();
        m.segments[0].table = "pack/missing.bin".into();
        let err = Manifest::parse("m.json", &serde_json::to_vec(&m).unwrap()).unwrap_err();
        assert!(err.to_string().contains("not among"), "{err}");
    }
}
