//! Out-of-core inference against an in-memory full-graph forward pass of
//! the same model: with memory so small that every layer takes several
//! destination groups and several source chunks, the logits and embeddings
//! equal the in-memory ones within 1e-5; a killed run resumes; bad input is
//! refused.

use std::path::Path;

use arrow::array::{Array, AsArray};
use arrow::datatypes::{Float32Type, UInt64Type};
use offgnn_shared::address_table::BatchTable;
use offgnn_shared::dataset::Dataset;
use offgnn_shared::io_engine::{IoEngine, IoOptions};
use offgnn_shared::samples::Block;
use sampler::parquet_import::{self, ImportConfig};
use sampler::synthetic::{GeneratorConfig, generate};
use tch::{Device, Kind, Tensor, nn};
use trainer::export;
use trainer::inference::{Aggregate, InferConfig, InferSummary, NodeSet, Outputs, infer};
use trainer::model::{self, ModelConfig, ModelKind};

const NODES: u64 = 3000;

fn dataset(root: &Path) -> std::path::PathBuf {
    generated(&root.join("g"), NODES, 24, 11)
}

/// A generated graph of `nodes` nodes (degree 6, 5 classes) with
/// `feature_dim`-d features, at `path`.
fn generated(path: &Path, nodes: u64, feature_dim: u64, seed: u64) -> std::path::PathBuf {
    generate(
        path,
        &GeneratorConfig {
            num_nodes: nodes,
            avg_degree: 6.0,
            feature_dim,
            num_classes: 5,
            seed,
            ..Default::default()
        },
        false,
        false,
    )
    .unwrap();
    path.to_path_buf()
}

/// A randomly initialised model of `kind`, exported for the dataset.
fn exported(
    root: &Path,
    ds: &Dataset,
    kind: ModelKind,
) -> (String, Box<dyn model::Gnn>, ModelConfig) {
    exported_with(root, ds, kind, 16)
}

/// As [`exported`], with `hidden` channels.
fn exported_with(
    root: &Path,
    ds: &Dataset,
    kind: ModelKind,
    hidden: i64,
) -> (String, Box<dyn model::Gnn>, ModelConfig) {
    tch::manual_seed(5);
    let cfg = ModelConfig {
        kind,
        in_dim: ds.feature_dim() as i64,
        hidden,
        classes: ds.num_classes as i64,
        layers: 3,
        heads: 4,
        dropout: 0.5,
        scorer: None,
    };
    let vs = nn::VarStore::new(Device::Cpu);
    let net = model::build(&vs.root(), &cfg);
    let location = root.join(format!("model-{kind:?}-{hidden}"));
    let from = export::Provenance {
        feature_dtype: "float32".into(),
        dataset_fingerprint: ds.fingerprint().unwrap(),
        feature_fingerprint: offgnn_shared::dataset::file_fingerprint(ds.features.path()).unwrap(),
        samples_run_sha256: "none".into(),
        graph: None,
        which: "best".into(),
        epoch: 0,
        valid_acc: 0.0,
        test_acc: 0.0,
        mrr: None,
    };
    let location = location.to_str().unwrap().to_string();
    export::write(
        &location,
        &cfg,
        &export::snapshot(&vs).unwrap(),
        &from,
        false,
    )
    .unwrap();
    (location, net, cfg)
}

/// The in-memory reference: the model's own forward pass over the whole
/// graph as one block per layer (every node a destination, every distinct
/// edge an in-edge), all features in memory.
fn full_graph_forward(ds: &Dataset, net: &dyn model::Gnn, cfg: &ModelConfig) -> Tensor {
    let n = ds.num_nodes as usize;
    let mut pairs: Vec<(u32, u32)> = Vec::new();
    ds.edges
        .for_each_chunk(1 << 16, |s, d| {
            pairs.extend(s.iter().zip(d).map(|(&s, &d)| (s as u32, d as u32)));
            Ok::<_, offgnn_shared::Error>(())
        })
        .unwrap();
    pairs.sort_by_key(|&(s, d)| (d, s));
    pairs.dedup();
    let block = Block {
        num_src: n as u32,
        num_dst: n as u32,
        src: pairs.iter().map(|p| p.0).collect(),
        dst: pairs.iter().map(|p| p.1).collect(),
        relations: Vec::new(),
    };
    let table = BatchTable {
        blocks: vec![block; cfg.layers],
        ..Default::default()
    };
    let blocks = trainer::pipeline::graph(&table, Device::Cpu)
        .unwrap()
        .blocks;
    let mut raw = vec![0u8; n * ds.features.row_bytes() as usize];
    ds.features.read_data_at(0, &mut raw).unwrap();
    let x = Tensor::from_data_size(&raw, &[n as i64, ds.feature_dim() as i64], Kind::Float);
    tch::no_grad(|| net.forward(&x, &blocks, false)).unwrap()
}

/// `run` as if this process were killed after `groups` groups.
fn killed_after<R>(groups: u64, run: impl FnOnce() -> R) -> R {
    let hooks = trainer::test_hooks::TestHooks {
        interrupt_after_groups: Some(groups),
        ..Default::default()
    };
    trainer::test_hooks::with(hooks, run)
}

struct Output {
    ids: Vec<u64>,
    logits: Vec<f32>,
    probabilities: Vec<f32>,
    embedding: Vec<f32>,
}

fn read_output(out: &Path, s: &InferSummary) -> Output {
    let mut o = Output {
        ids: vec![],
        logits: vec![],
        probabilities: vec![],
        embedding: vec![],
    };
    for name in &s.files {
        let file = std::fs::File::open(out.join(name)).unwrap();
        let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file)
            .unwrap()
            .build()
            .unwrap();
        for batch in reader {
            let batch = batch.unwrap();
            let col = |name: &str| batch.column_by_name(name).unwrap().clone();
            o.ids
                .extend(col("node_id").as_primitive::<UInt64Type>().values());
            let floats = |name: &str, into: &mut Vec<f32>| {
                if let Some(c) = batch.column_by_name(name) {
                    let list = c.as_fixed_size_list();
                    into.extend(list.values().as_primitive::<Float32Type>().values());
                    assert_eq!(list.null_count(), 0);
                }
            };
            floats("logits", &mut o.logits);
            floats("probabilities", &mut o.probabilities);
            floats("embedding", &mut o.embedding);
        }
    }
    o
}

fn config(model: &str, ds: &Path, out: &Path, work: &Path) -> InferConfig {
    InferConfig {
        keep_duplicate_edges: false,
        model: model.to_string(),
        dataset: ds.display().to_string(),
        out: out.to_str().unwrap().to_string(),
        nodes: NodeSet::All,
        outputs: Outputs {
            probabilities: true,
            logits: true,
            embeddings: true,
            link_embedding: false,
        },
        device: Device::Cpu,
        // Room for the per-node counts, the read buffers and one 1024-row
        // source chunk, and about one group of 1024 destinations.
        memory: 11 << 20,
        work_dir: work.to_path_buf(),
        overwrite: false,
        add_reverse_edges: false,
        keep_self_loops: true,
        graph_override: false,
        chunk_rows: Some(1024),
        show_progress: false,
        hidden_f16: false,
        aggregate: Aggregate::Host,
    }
}

/// The least memory (in steps of 64 KiB) a run of `model` accepts with
/// each of `aggregates`: at that size each destination group holds about
/// one block of 1024 nodes. A binary search: a run is refused below that
/// size and works above it.
fn least_memory(
    model: &str,
    ds: &Path,
    root: &Path,
    engine: &IoEngine,
    aggregates: &[Aggregate],
) -> u64 {
    let works = |memory: u64| {
        aggregates.iter().all(|&aggregate| {
            let mut cfg = config(model, ds, &root.join("probe-out"), &root.join("probe-work"));
            cfg.memory = memory;
            cfg.overwrite = true;
            cfg.aggregate = aggregate;
            match infer(&cfg, engine) {
                Ok(_) => true,
                Err(e) => {
                    assert!(e.to_string().contains("--memory"), "{e}");
                    false
                }
            }
        })
    };
    let base = trainer::memory::RUNTIME_BYTES;
    assert!(!works(base), "a run with no room for data worked");
    assert!(works(base + (256 << 20)), "no memory size worked");
    least_that_works(base, base + (256 << 20), works)
}

/// The least memory in `(lo, hi]`, in steps of 64 KiB from `lo`, that
/// `works`, which refuses `lo`, takes `hi`, and takes every size above one
/// it takes: a binary search.
fn least_that_works(lo: u64, hi: u64, works: impl Fn(u64) -> bool) -> u64 {
    const STEP: u64 = 64 << 10;
    let (mut l, mut h) = (0, (hi - lo).div_ceil(STEP));
    while h - l > 1 {
        let mid = (l + h) / 2;
        if works(lo + mid * STEP) {
            h = mid;
        } else {
            l = mid;
        }
    }
    lo + h * STEP
}

/// The largest difference between the logits of the result `s` committed
/// at `out` and the in-memory forward pass of `net` over `ds`.
fn logit_difference(
    out: &Path,
    s: &InferSummary,
    ds: &Dataset,
    net: &dyn model::Gnn,
    cfg: &ModelConfig,
) -> f32 {
    let o = read_output(out, s);
    let want = full_graph_forward(ds, net, cfg);
    let want: Vec<f32> = Vec::try_from(want.view([-1])).unwrap();
    max_diff(&o.logits, &want)
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// One model over `ds` out of core at the least --memory that works (for a
/// graph model: several groups and several source chunks a layer), checked
/// against the in-memory forward pass: every node once, each pass reading
/// the layer's input once, logits within 1e-5.
struct Checked {
    run: InferConfig,
    s: InferSummary,
    o: Output,
    want: Vec<f32>,
    cfg: ModelConfig,
}

fn check_at_least_memory(
    root: &Path,
    ds_path: &Path,
    ds: &Dataset,
    (kind, hidden): (ModelKind, i64),
    engine: &IoEngine,
) -> Checked {
    let n = ds.num_nodes;
    let (location, net, cfg) = exported_with(root, ds, kind, hidden);
    let out = root.join(format!("out-{kind:?}"));
    let mut run = config(
        &location,
        ds_path,
        &out,
        &root.join(format!("work-{kind:?}")),
    );
    // Where the device's aggregation is checked too, the least that both
    // take, so that the two runs share one plan.
    let aggregates: &[Aggregate] = if kind == ModelKind::Mlp {
        &[Aggregate::Host]
    } else {
        &[Aggregate::Host, Aggregate::Device]
    };
    run.memory = least_memory(&location, ds_path, root, engine, aggregates);
    let s = infer(&run, engine).unwrap();
    assert!(out.join(trainer::inference::COMMIT).exists());
    if kind != ModelKind::Mlp {
        assert!(s.groups >= 2, "{kind:?}: {} groups", s.groups);
        assert!(n.div_ceil(s.chunk_rows) >= 2, "{kind:?}: one chunk");
        assert_eq!(s.layers.len(), 3);
        for (i, l) in s.layers.iter().enumerate() {
            assert_eq!(l.passes, s.groups, "a pass per group");
            // Each pass reads the layer's input once, nothing more.
            let once = input_bytes(ds, i, cfg.hidden as u64, 4);
            assert_eq!(l.bytes_read, l.passes * once, "{kind:?}: layer {}", i + 1);
        }
    }
    let o = read_output(&out, &s);
    assert_eq!(o.ids, (0..n).collect::<Vec<_>>());
    let want = full_graph_forward(ds, net.as_ref(), &cfg);
    let want: Vec<f32> = Vec::try_from(want.view([-1])).unwrap();
    let diff = max_diff(&o.logits, &want);
    println!(
        "{kind:?}: {} groups, {} chunks, largest logit difference {diff:.2e}",
        s.groups,
        n.div_ceil(s.chunk_rows)
    );
    assert!(diff <= 1e-5, "{kind:?}: logits differ by {diff}");
    if kind != ModelKind::Mlp {
        check_on_device(root, &run, &s, &o, &want);
    }
    Checked {
        run,
        s,
        o,
        want,
        cfg,
    }
}

/// `run` again with the aggregation in torch's ops on the device (the CPU
/// here: the same ops as on CUDA): the same plan and reads, the logits
/// within 1e-5 of the in-memory forward pass, the embeddings within 1e-5 of
/// the host aggregation's.
fn check_on_device(root: &Path, run: &InferConfig, s: &InferSummary, o: &Output, want: &[f32]) {
    let tag = Path::new(&run.out).file_name().unwrap().to_str().unwrap();
    let mut dev = run.clone();
    dev.aggregate = Aggregate::Device;
    dev.out = root.join(format!("{tag}-device")).to_str().unwrap().into();
    dev.work_dir = root.join(format!("{tag}-device.work"));
    let sd = infer(&dev, &IoEngine::new(IoOptions::default())).unwrap();
    assert_eq!(sd.aggregate, Aggregate::Device);
    assert_eq!(s.aggregate, run.aggregate);
    assert_eq!((sd.groups, sd.chunk_rows), (s.groups, s.chunk_rows));
    for (d, h) in sd.layers.iter().zip(&s.layers) {
        assert_eq!(
            (d.passes, d.bytes_read, d.bytes_written > 0),
            (h.passes, h.bytes_read, true),
            "{tag}: layer {}",
            d.layer
        );
    }
    let od = read_output(Path::new(&dev.out), &sd);
    assert_eq!(od.ids, o.ids);
    let diff = max_diff(&od.logits, want);
    let emb = max_diff(&od.embedding, &o.embedding);
    println!(
        "{tag}, aggregated on the device: largest logit difference {diff:.2e}, embeddings {emb:.2e} from the host's"
    );
    assert!(diff <= 1e-5, "{tag} on the device: logits differ by {diff}");
    assert!(
        emb <= 1e-5,
        "{tag} on the device: embeddings differ by {emb}"
    );
}

#[test]
fn out_of_core_inference_equals_the_in_memory_forward_pass() {
    let _serial = super::serial();
    tch::set_num_threads(1);
    let dir = tempfile::tempdir().unwrap();
    let ds_path = dataset(dir.path());
    let ds = Dataset::open(&ds_path).unwrap();
    let engine = IoEngine::new(IoOptions::default());
    for kind in [ModelKind::Sage, ModelKind::Gat, ModelKind::Mlp] {
        let Checked {
            run,
            s,
            o,
            want,
            cfg,
        } = check_at_least_memory(dir.path(), &ds_path, &ds, (kind, 16), &engine);
        let work = &run.work_dir;
        // Probabilities are the softmax of the logits; rows sum to one.
        for row in o.probabilities.chunks_exact(cfg.classes as usize) {
            assert!((row.iter().sum::<f32>() - 1.0).abs() < 1e-5);
        }
        assert_eq!(
            o.embedding.len(),
            NODES as usize * cfg.hidden as usize,
            "{kind:?}: embeddings"
        );
        // The work directory is cleaned up after the commit.
        assert!(!work.join("progress.json").exists());
        if kind == ModelKind::Gat {
            // Hidden layers stored as float16: the same classes, logits
            // within float16's rounding.
            let mut half = run.clone();
            half.hidden_f16 = true;
            half.out = dir.path().join("out-f16").to_str().unwrap().to_string();
            let s16 = infer(&half, &engine).unwrap();
            let o16 = read_output(&dir.path().join("out-f16"), &s16);
            let diff16 = max_diff(&o16.logits, &want);
            println!("{kind:?} with float16 hidden layers: largest logit difference {diff16:.2e}");
            assert!(diff16 > 0.0 && diff16 < 1e-2, "{diff16}");
            let s32_written: u64 = s.layers[..2].iter().map(|l| l.bytes_written).sum();
            let s16_written: u64 = s16.layers[..2].iter().map(|l| l.bytes_written).sum();
            assert!(
                s16_written * 2 <= s32_written + 8192,
                "{s16_written} vs {s32_written}"
            );
        }
    }
}

/// The bytes of a layer's input as stored: the feature rows from the page
/// their data starts on, or a hidden layer's rows at its stored width.
fn input_bytes(ds: &Dataset, l: usize, hidden: u64, elem: u64) -> u64 {
    if l == 0 {
        let start = ds.features.header().data_offset;
        start % 4096 + ds.num_nodes * ds.features.row_bytes()
    } else {
        ds.num_nodes * hidden * elem
    }
}

/// Cora's tables (`scripts/setup` fetches them), imported as the sampler's
/// `import-parquet --preset cora` does.
fn cora(root: &Path) -> std::path::PathBuf {
    let tables = std::env::var_os("OFFGNN_CORA_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../.cache/cora"));
    let nodes = tables.join("cora_nodes.parquet.gzip");
    assert!(
        nodes.exists(),
        "the Cora tables are missing from {}: run scripts/setup",
        tables.display()
    );
    let ds = root.join("cora");
    let cfg = ImportConfig::cora(nodes, tables.join("cora_rels.parquet.gzip"));
    parquet_import::import(&ds, &cfg, false).unwrap();
    ds
}

#[test]
fn out_of_core_inference_equals_the_in_memory_forward_pass_on_cora() {
    let _serial = super::serial();
    tch::set_num_threads(1);
    let dir = tempfile::tempdir().unwrap();
    let ds_path = cora(dir.path());
    let ds = Dataset::open(&ds_path).unwrap();
    let engine = IoEngine::new(IoOptions::default());
    for kind in [ModelKind::Sage, ModelKind::Gat] {
        check_at_least_memory(dir.path(), &ds_path, &ds, (kind, 16), &engine);
    }
}

/// GraphSAGE layers that widen (32 hidden channels over 24 features) sum
/// their inputs and project the mean, where narrowing ones project first:
/// out of core on the host and on the device, equal to the in-memory pass.
#[test]
fn widening_layers_aggregate_before_they_project() {
    let _serial = super::serial();
    tch::set_num_threads(1);
    let dir = tempfile::tempdir().unwrap();
    let ds_path = dataset(dir.path());
    let ds = Dataset::open(&ds_path).unwrap();
    assert!(ds.feature_dim() < 32);
    let engine = IoEngine::new(IoOptions::default());
    let c = check_at_least_memory(dir.path(), &ds_path, &ds, (ModelKind::Sage, 32), &engine);
    let widths: Vec<_> =
        c.s.layers
            .iter()
            .map(|l| (l.in_width, l.out_width))
            .collect();
    assert_eq!(widths, [(24, 32), (32, 32), (32, 5)]);
}

/// A run of the model at `location` over `ds` with room for every
/// destination in one group (chunks stay 1024 rows), its output and work
/// directory in `root` named by `tag`.
fn one_group(
    location: &str,
    ds: &Path,
    root: &Path,
    tag: &str,
    aggregate: Aggregate,
) -> InferConfig {
    let mut run = config(
        location,
        ds,
        &root.join(format!("out-{tag}")),
        &root.join(format!("work-{tag}")),
    );
    run.memory = trainer::memory::RUNTIME_BYTES + (256 << 20);
    run.aggregate = aggregate;
    run
}

#[test]
fn with_one_group_each_layer_reads_its_input_once() {
    let _serial = super::serial();
    tch::set_num_threads(1);
    let dir = tempfile::tempdir().unwrap();
    // Features wider than a pull's two products together (16 hidden
    // channels each), where the hidden layers' inputs are not: the first
    // layer parts one product's rows, the others take a product a part.
    let ds_path = generated(&dir.path().join("g40"), NODES, 40, 11);
    let ds = Dataset::open(&ds_path).unwrap();
    let engine = IoEngine::new(IoOptions::default());
    for kind in [ModelKind::Sage, ModelKind::Gat] {
        let (location, net, cfg) = exported(dir.path(), &ds, kind);
        // Aggregated on the host (the hidden layers pull along their
        // edges by destination, the group holding every node, and hand
        // their rows on to the disk as they finish them) and on the device
        // (one group spans every chunk, so edges wait for destinations in
        // later chunks); on the host also with float16 hidden layers: half
        // the bytes, read once.
        let cases = [
            (false, Aggregate::Host),
            (false, Aggregate::Device),
            (true, Aggregate::Host),
        ];
        for (f16, aggregate) in cases {
            let tag = format!("{kind:?}-{f16}-{aggregate:?}");
            let mut run = one_group(&location, &ds_path, dir.path(), &tag, aggregate);
            run.hidden_f16 = f16;
            let s = infer(&run, &engine).unwrap();
            assert_eq!(s.aggregate, aggregate, "{tag}");
            assert_eq!(s.groups, 1, "{tag}");
            assert!(NODES.div_ceil(s.chunk_rows) >= 3, "{tag}: chunks");
            let elem = if f16 { 2 } else { 4 };
            for (l, f) in s.layers.iter().enumerate() {
                let want = input_bytes(&ds, l, cfg.hidden as u64, elem);
                println!(
                    "{tag}: layer {} read {} bytes of input ({want} as stored), {} of edges",
                    l + 1,
                    f.bytes_read,
                    f.edge_bytes_read
                );
                assert_eq!(f.passes, 1, "{tag}: layer {}", l + 1);
                assert_eq!(f.bytes_read, want, "{tag}: layer {} input", l + 1);
                // The one group's edges are read by the first layer, and
                // kept for the later ones.
                if l == 0 {
                    assert!(f.edge_bytes_read > 0, "{tag}: edges counted apart");
                } else {
                    assert_eq!(f.edge_bytes_read, 0, "{tag}: layer {} edges", l + 1);
                }
            }
            let out = dir.path().join(format!("out-{tag}"));
            let diff = logit_difference(&out, &s, &ds, net.as_ref(), &cfg);
            println!("{tag}: largest logit difference {diff:.2e}");
            let tolerance = if f16 { 1e-2 } else { 1e-5 };
            assert!(diff <= tolerance, "{tag}: logits differ by {diff}");
        }
    }
}

/// GAT on the host where a group spans several chunks but not every
/// node: a group of every node pulls along its edges by destination, a
/// smaller one pushes along its sources' buckets, and edges from the
/// group's earlier chunks wait for its destinations in later ones. Here
/// the first of two groups holds two blocks of 1024 nodes, two chunks; the
/// result equals the in-memory forward pass.
#[test]
fn gat_groups_of_several_chunks_push_with_waiting_edges() {
    let _serial = super::serial();
    tch::set_num_threads(1);
    let dir = tempfile::tempdir().unwrap();
    let ds_path = dataset(dir.path());
    let ds = Dataset::open(&ds_path).unwrap();
    let engine = IoEngine::new(IoOptions::default());
    let (location, net, cfg) = exported(dir.path(), &ds, ModelKind::Gat);
    let mut run = config(
        &location,
        &ds_path,
        &dir.path().join("out"),
        &dir.path().join("work"),
    );
    run.aggregate = Aggregate::Host;
    run.overwrite = true;
    // The least memory whose plan has at most two groups: the groups
    // shrink as the memory does.
    let two_groups = |memory: u64| {
        let mut probe = run.clone();
        probe.memory = memory;
        infer(&probe, &engine).is_ok_and(|s| s.groups <= 2)
    };
    let least = least_memory(&location, &ds_path, dir.path(), &engine, &[Aggregate::Host]);
    let most = least + (256 << 20);
    assert!(!two_groups(least) && two_groups(most));
    run.memory = least_that_works(least, most, two_groups);
    let s = infer(&run, &engine).unwrap();
    assert_eq!(s.groups, 2);
    assert_eq!(NODES.div_ceil(s.chunk_rows), 3, "chunks");
    let diff = logit_difference(&dir.path().join("out"), &s, &ds, net.as_ref(), &cfg);
    println!("GAT in two groups: largest logit difference {diff:.2e}");
    assert!(diff <= 1e-5, "logits differ by {diff}");
}

/// With the aggregation on the device, a narrow layer streams in chunks
/// of several edge buckets (as many rows as the widest layer's chunk holds
/// in its bytes): on 8000 nodes with 64-d features, the hidden layers'
/// chunks take 2 or 3 buckets of 1024 rows, several chunks a layer, so
/// edges still wait from one chunk for destinations in a later one. The
/// result equals the in-memory forward pass, and each layer reads its
/// input once.
#[test]
fn narrow_layers_on_the_device_stream_in_merged_chunks() {
    let _serial = super::serial();
    tch::set_num_threads(1);
    let dir = tempfile::tempdir().unwrap();
    let ds_path = generated(&dir.path().join("wide"), 8000, 64, 12);
    let ds = Dataset::open(&ds_path).unwrap();
    let engine = IoEngine::new(IoOptions::default());
    for kind in [ModelKind::Sage, ModelKind::Gat] {
        let (location, net, cfg) = exported_with(dir.path(), &ds, kind, 16);
        let tag = format!("{kind:?}");
        let run = one_group(&location, &ds_path, dir.path(), &tag, Aggregate::Device);
        let s = infer(&run, &engine).unwrap();
        assert_eq!((s.groups, s.chunk_rows), (1, 1024), "{tag}");
        let rows: Vec<u64> = s.layers.iter().map(|l| l.chunk_rows).collect();
        println!("{tag}: chunk rows per layer {rows:?}");
        assert_eq!(rows[0], 1024, "{tag}: the widest layer takes one bucket");
        for (l, &r) in rows.iter().enumerate().skip(1) {
            assert!(
                r > 1024 && r % 1024 == 0,
                "{tag}: layer {}: {r} rows",
                l + 1
            );
            assert!(
                ds.num_nodes.div_ceil(r) >= 2,
                "{tag}: layer {}: one chunk",
                l + 1
            );
        }
        for (l, f) in s.layers.iter().enumerate() {
            let once = input_bytes(&ds, l, f.in_width as u64, 4);
            assert_eq!(
                (f.passes, f.bytes_read),
                (1, once),
                "{tag}: layer {}",
                l + 1
            );
        }
        let out = dir.path().join(format!("out-{tag}"));
        let diff = logit_difference(&out, &s, &ds, net.as_ref(), &cfg);
        println!("{tag}: largest logit difference {diff:.2e}");
        assert!(diff <= 1e-5, "{tag}: logits differ by {diff}");
    }
}

#[test]
fn a_killed_inference_resumes_and_bad_input_is_refused() {
    let _serial = super::serial();
    tch::set_num_threads(1);
    let dir = tempfile::tempdir().unwrap();
    let ds_path = dataset(dir.path());
    let ds = Dataset::open(&ds_path).unwrap();
    let engine = IoEngine::new(IoOptions::default());
    let (location, _, _) = exported(dir.path(), &ds, ModelKind::Gat);
    let out = dir.path().join("out");
    let work = dir.path().join("work");
    let memory = least_memory(&location, &ds_path, dir.path(), &engine, &[Aggregate::Host]);
    let mut whole = config(
        &location,
        &ds_path,
        &dir.path().join("whole"),
        &dir.path().join("w2"),
    );
    whole.memory = memory;
    let whole = infer(&whole, &engine).unwrap();
    assert!(whole.groups >= 3, "{} groups", whole.groups);

    // Killed after 4 groups (inside layer 2), then resumed.
    let mut cfg = config(&location, &ds_path, &out, &work);
    cfg.memory = memory;
    let err = killed_after(4, || infer(&cfg, &engine)).expect_err("interrupted");
    assert!(err.to_string().contains("interrupted"), "{err}");
    assert!(!out.join(trainer::inference::COMMIT).exists());
    let resumed = infer(&cfg, &engine).unwrap();
    assert!(
        resumed.layers.iter().any(|l| l.groups_resumed > 0),
        "{:?}",
        resumed.layers
    );
    let (a, b) = (
        read_output(&dir.path().join("whole"), &whole),
        read_output(&out, &resumed),
    );
    assert_eq!(a.ids, b.ids);
    assert_eq!(max_diff(&a.logits, &b.logits), 0.0);

    // A committed result is not replaced without --overwrite.
    let err = infer(&cfg, &engine).err().unwrap().to_string();
    assert!(err.contains("holds a committed inference result"), "{err}");
    // --memory below one group is refused naming the least that works,
    // from far below it and from just below it; that least works.
    for short in [
        memory - (64 << 10),
        trainer::memory::RUNTIME_BYTES + (1 << 20),
    ] {
        let o3 = dir.path().join(format!("o3-{short}"));
        let mut small = config(&location, &ds_path, &o3, &work);
        small.memory = short;
        let err = infer(&small, &engine).err().unwrap().to_string();
        let least: f64 = err
            .rsplit("give --memory at least ")
            .next()
            .and_then(|t| t.trim().strip_suffix(" MiB"))
            .and_then(|t| t.parse().ok())
            .unwrap_or_else(|| panic!("no least memory in {err}"));
        small.memory = (least * f64::from(1 << 20)) as u64;
        small.overwrite = true;
        infer(&small, &engine).unwrap_or_else(|e| panic!("{least} MiB, named least: {e}"));
    }
    // A model of another dataset.
    let other = generated(&dir.path().join("other"), NODES, 24, 12);
    let err = infer(
        &config(&location, &other, &dir.path().join("o4"), &work),
        &engine,
    )
    .err()
    .unwrap()
    .to_string();
    assert!(err.contains("another dataset"), "{err}");
    // The same dataset with one feature value changed: the topology and
    // labels match, the features do not.
    let changed = dir.path().join("changed");
    let status = std::process::Command::new("cp")
        .args(["-r", ds_path.to_str().unwrap(), changed.to_str().unwrap()])
        .status()
        .unwrap();
    assert!(status.success());
    let feat = Dataset::open(&changed)
        .unwrap()
        .features
        .path()
        .to_path_buf();
    let mut bytes = std::fs::read(&feat).unwrap();
    let at = bytes.len() / 2 / 4 * 4;
    let v = f32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) + 1.0;
    bytes[at..at + 4].copy_from_slice(&v.to_le_bytes());
    std::fs::write(&feat, bytes).unwrap();
    assert_eq!(
        Dataset::open(&changed).unwrap().fingerprint().unwrap(),
        ds.fingerprint().unwrap()
    );
    let err = infer(
        &config(&location, &changed, &dir.path().join("o5"), &work),
        &engine,
    )
    .err()
    .unwrap()
    .to_string();
    assert!(
        err.contains("not the features the model was trained on"),
        "{err}"
    );
}

/// A `--nodes` file whose contents changed between a killed run and its
/// rerun (same path) starts anew rather than mixing two selections, and the
/// killed run's output parts, which no commit names, are removed.
#[test]
fn a_rerun_with_another_node_selection_starts_anew() {
    let _serial = super::serial();
    tch::set_num_threads(1);
    let dir = tempfile::tempdir().unwrap();
    let ds_path = dataset(dir.path());
    let ds = Dataset::open(&ds_path).unwrap();
    let engine = IoEngine::new(IoOptions::default());
    let (location, _, _) = exported(dir.path(), &ds, ModelKind::Sage);
    let memory = least_memory(&location, &ds_path, dir.path(), &engine, &[Aggregate::Host]);
    let (out, work) = (dir.path().join("out"), dir.path().join("work"));
    let nodes = dir.path().join("nodes.npy");
    // Nearly every node, so that the run needs as many groups as all nodes.
    let first: Vec<u64> = (0..NODES).filter(|&v| v != 1).collect();
    offgnn_shared::npy::write_i64(&nodes, &first).unwrap();
    let mut cfg = config(&location, &ds_path, &out, &work);
    cfg.memory = memory;
    cfg.nodes = NodeSet::File(nodes.clone());

    // Killed one group into the last layer, which has written parts.
    let probe = infer(
        &InferConfig {
            out: dir.path().join("probe").to_str().unwrap().to_string(),
            work_dir: dir.path().join("probe-w"),
            ..cfg.clone()
        },
        &engine,
    )
    .unwrap();
    let layers = probe.layers.len() as u64;
    assert!(probe.groups >= 2, "{} groups", probe.groups);
    let err = killed_after((layers - 1) * probe.groups + 1, || infer(&cfg, &engine))
        .expect_err("interrupted");
    assert!(err.to_string().contains("interrupted"), "{err}");
    let parquet_files = || -> Vec<std::path::PathBuf> {
        let mut found = vec![];
        let mut dirs = vec![out.clone()];
        while let Some(d) = dirs.pop() {
            for e in std::fs::read_dir(&d).unwrap() {
                let p = e.unwrap().path();
                if p.is_dir() {
                    dirs.push(p);
                } else if p.extension().is_some_and(|x| x == "parquet") {
                    found.push(p);
                }
            }
        }
        found.sort();
        found
    };
    assert!(!parquet_files().is_empty(), "the killed run wrote no part");

    // Bucketed edges that are not what the run wrote (zeroed at the right
    // length, or cut short) are refused, naming the file, not used.
    let edges = work.join(format!("edges-{:06}.bin", probe.groups - 1));
    let good = std::fs::read(&edges).unwrap();
    let resume = cfg.clone();
    for bad in [vec![0u8; good.len()], good[..good.len() - 4].to_vec()] {
        std::fs::write(&edges, bad).unwrap();
        let err = infer(&resume, &engine).unwrap_err();
        assert!(
            matches!(err, trainer::error::Error::Corrupt { .. }),
            "a corrupt file, by kind: {err:?}"
        );
        let err = err.to_string();
        assert!(
            err.contains(&*edges.to_string_lossy()) && err.contains("not the edge buckets"),
            "{err}"
        );
    }
    std::fs::write(&edges, good).unwrap();

    // The same path now selects the other nodes.
    let second: Vec<u64> = (0..NODES).filter(|&v| v != 0).collect();
    offgnn_shared::npy::write_i64(&nodes, &second).unwrap();
    let s = infer(&cfg, &engine).unwrap();
    assert!(
        s.layers.iter().all(|l| l.groups_resumed == 0),
        "resumed another selection's progress: {:?}",
        s.layers
    );
    let mut ids = read_output(&out, &s).ids;
    ids.sort_unstable();
    assert_eq!(ids, second);
    let committed: Vec<_> = s.files.iter().map(|f| out.join(f)).collect();
    let mut committed = committed;
    committed.sort();
    assert_eq!(parquet_files(), committed, "parts of the killed run stayed");
}
