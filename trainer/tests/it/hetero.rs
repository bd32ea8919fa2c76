//! R-SAGE and R-GAT compute PyG's functions: a typed batch of three node
//! types of different widths (one with a self-relation, relations whose
//! destinations draw no edge) runs through offgnn's models and, with the
//! same parameters loaded with strict=True, through PyG's `HeteroConv`
//! (python/hetero_parity.py, a real PyG client): logits within 1e-4.

use std::path::Path;

use offgnn_shared::samples::Block;
use tch::{Device, Kind, Tensor, nn};
use trainer::hetero::first_layer::neighbour_means;
use trainer::hetero::{Inputs, LinearInit, RelationalKind, Rgnn, RgnnConfig, Schema, TypedBlocks};

/// paper (ids 0..30, 8-d), author (30..70, 5-d), fos (70..80, 8-d).
fn schema() -> Schema {
    let relations: Vec<String> = [
        "paper:cites:paper",
        "paper:written_by:author",
        "author:rev_written_by:paper",
        "paper:topic:fos",
        "fos:rev_topic:paper",
    ]
    .map(String::from)
    .to_vec();
    Schema::new(
        vec![
            ("paper".into(), 0, 30),
            ("author".into(), 30, 40),
            ("fos".into(), 70, 10),
        ],
        &relations,
        "paper",
    )
    .unwrap()
}

/// A deterministic draw in `0..n`.
struct Draw(u64);

impl Draw {
    fn below(&mut self, n: usize) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 33) % n as u64) as usize
    }
}

/// A two-layer batch: 4 paper seeds, then inputs of every type; each
/// destination draws 0 to 3 in-edges per relation that reaches its type,
/// grouped by relation and sorted by destination within each.
fn batch(schema: &Schema) -> (Vec<u32>, Vec<Block>) {
    let inputs: Vec<u32> = vec![
        0, 5, 9, 12, 31, 44, 71, 3, 50, 72, 18, 33, 60, 75, 21, 2, 39, 79, 65, 27,
    ];
    let type_of = |v: u32| {
        schema
            .types
            .iter()
            .position(|t| u64::from(v) >= t.1 && u64::from(v) < t.1 + t.2)
            .unwrap()
    };
    let mut draw = Draw(11);
    let mut block = |num_dst: usize, num_src: usize| {
        let (mut src, mut dst, mut offsets) = (Vec::new(), Vec::new(), vec![0u32]);
        for &(s, _, d) in &schema.relations {
            let sources: Vec<u32> = (0..num_src as u32)
                .filter(|&i| type_of(inputs[i as usize]) == s)
                .collect();
            for v in (0..num_dst as u32).filter(|&i| type_of(inputs[i as usize]) == d) {
                for _ in 0..draw.below(4) {
                    src.push(sources[draw.below(sources.len())]);
                    dst.push(v);
                }
            }
            offsets.push(src.len() as u32);
        }
        Block {
            num_src: num_src as u32,
            num_dst: num_dst as u32,
            src,
            dst,
            relations: offsets,
        }
    };
    let blocks = vec![block(11, inputs.len()), block(4, 11)];
    (inputs, blocks)
}

#[test]
fn relational_models_compute_pyg_heteroconv_logits() {
    // Its models draw from the generator a parallel training seeds.
    let _serial = super::serial();
    let python = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/python");
    assert!(
        python.exists(),
        "{} is missing: run scripts/setup",
        python.display()
    );
    let schema = schema();
    let (inputs, blocks) = batch(&schema);
    let typed = TypedBlocks::new(&schema, &inputs, &blocks, Device::Cpu).unwrap();
    let dims = [8i64, 5, 8];
    // R-SAGE as MLPerf's reference has it, with PyG's default root weight
    // (each destination's own row through lin_r, of the destination type's
    // width), and R-GAT.
    for (kind, root_weight) in [
        (RelationalKind::Rsage, false),
        (RelationalKind::Rsage, true),
        (RelationalKind::Rgat, false),
    ] {
        let work = tempfile::tempdir().unwrap();
        let cfg = RgnnConfig {
            kind,
            in_dims: dims.iter().map(|&d| Some(d)).collect(),
            hidden: 6,
            classes: 3,
            layers: 2,
            heads: 2,
            dropout: 0.5,
            root_weight,
            init: Default::default(),
            scorer: None,
        };
        let vs = nn::VarStore::new(Device::Cpu);
        let model = Rgnn::new(&vs.root(), &schema, &cfg).unwrap();
        // Nonzero biases and attention, so that each is checked.
        tch::no_grad(|| {
            for (_, mut p) in vs.variables() {
                p.copy_(&(Tensor::randn(p.size(), (Kind::Float, Device::Cpu)) * 0.5));
            }
        });
        let x: Vec<Tensor> = typed
            .num_inputs
            .iter()
            .zip(dims)
            .map(|(&n, d)| Tensor::randn([n, d], (Kind::Float, Device::Cpu)))
            .collect();
        let logits = model.forward(Inputs::Rows(&x), &typed, false).unwrap();
        assert_eq!(logits.size(), [4, 3]);
        assert_eq!(
            model.reads_destinations(),
            kind == RelationalKind::Rgat || root_weight
        );
        if !model.reads_destinations() {
            // The first layer's means taken where each row lies (the CPU
            // path that assembles no matrix) give the same logits.
            let bytes: Vec<Vec<u8>> = (x.iter())
                .map(|t| {
                    bytemuck::cast_slice(&Vec::<f32>::try_from(&t.flatten(0, -1)).unwrap()).to_vec()
                })
                .collect();
            let layer = &typed.layers[0];
            let means: Vec<Tensor> = (schema.relations.iter().enumerate())
                .map(|(r, &(s, _, _))| {
                    let d = dims[s] as usize;
                    let rows: Vec<&[u8]> = bytes[s].chunks(4 * d).collect();
                    neighbour_means(&rows, d, &layer.relations[r]).unwrap()
                })
                .collect();
            let fused = model
                .forward(Inputs::FirstMeans(&means), &typed, false)
                .unwrap();
            let diff = (&fused - &logits).abs().max().double_value(&[]);
            assert!(diff < 1e-5, "first-layer means: logits differ by {diff}");
        }

        let mut named: Vec<(String, Tensor)> = vs.variables().into_iter().collect();
        named.sort_by(|a, b| a.0.cmp(&b.0));
        trainer::export::write_tensors(&work.path().join("model.safetensors"), &named).unwrap();
        let mut batch: Vec<(String, Tensor)> = vec![("logits".into(), logits)];
        for (t, rows) in schema.types.iter().zip(&x) {
            batch.push((format!("x.{}", t.0), rows.shallow_clone()));
        }
        for (l, layer) in typed.layers.iter().enumerate() {
            batch.push((format!("num_dst.{l}"), Tensor::from_slice(&layer.num_dst)));
            for (r, e) in layer.relations.iter().enumerate() {
                batch.push((
                    format!("edges.{l}.{r}"),
                    Tensor::stack(&[&e.src, &e.dst], 0),
                ));
            }
        }
        trainer::export::write_tensors(&work.path().join("batch.safetensors"), &batch).unwrap();
        // The fields of a typed export's model.json that build the model.
        let card = serde_json::json!({
            "architecture": kind,
            "node_types": schema.types.iter().zip(dims).map(|(t, d)| serde_json::json!({"name": t.0, "in_channels": d})).collect::<Vec<_>>(),
            "relations": schema.relations.iter().map(|(s, r, d)| [&schema.types[*s].0, r, &schema.types[*d].0]).collect::<Vec<_>>(),
            "hidden_channels": cfg.hidden,
            "heads": cfg.heads,
            "root_weight": root_weight,
            "num_layers": cfg.layers,
            "out_channels": cfg.classes,
            "target": "paper",
        });
        std::fs::write(work.path().join("model.json"), card.to_string()).unwrap();
        let out = std::process::Command::new(&python)
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("../python/hetero_parity.py"))
            .arg(work.path())
            .output()
            .expect("python starts");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{kind:?}, root weight {root_weight}: hetero_parity.py failed:\n{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        println!("{stdout}");
    }
}

#[test]
fn typed_blocks_refuse_edges_across_the_wrong_types_and_models_name_what_they_lack() {
    // Its models draw from the generator a parallel training seeds.
    let _serial = super::serial();
    let schema = schema();
    let (inputs, mut blocks) = batch(&schema);
    // The first edge of paper:cites:paper now leaves an author.
    blocks[0].src[0] = 4;
    let err = TypedBlocks::new(&schema, &inputs, &blocks, Device::Cpu)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("block 0") && err.contains("'cites'"), "{err}");
    let vs = nn::VarStore::new(Device::Cpu);
    let cfg = RgnnConfig {
        kind: RelationalKind::Rgat,
        in_dims: vec![Some(8), None, Some(8)],
        hidden: 6,
        classes: 3,
        layers: 2,
        heads: 4,
        dropout: 0.0,
        root_weight: false,
        init: Default::default(),
        scorer: None,
    };
    let err = Rgnn::new(&vs.root(), &schema, &cfg)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("'author' has no features"), "{err}");
    let cfg = RgnnConfig {
        in_dims: vec![Some(8), Some(5), Some(8)],
        ..cfg
    };
    let err = Rgnn::new(&vs.root(), &schema, &cfg)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("multiple of --heads"), "{err}");
    let cfg = RgnnConfig {
        heads: 2,
        root_weight: true,
        ..cfg
    };
    let err = Rgnn::new(&vs.root(), &schema, &cfg)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("R-GAT's attention has none"), "{err}");
    let cfg = RgnnConfig {
        root_weight: false,
        init: LinearInit::Glorot,
        ..cfg
    };
    let err = Rgnn::new(&vs.root(), &schema, &cfg)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("--init is R-SAGE's"), "{err}");
}

/// R-SAGE's linear maps start as PyG's (within 1 / sqrt(fan_in), bias
/// too) or, with `--init glorot`, as DGL's (within sqrt(6 / (fan_in +
/// fan_out)), bias zero).
#[test]
fn rsage_starts_as_pyg_or_glorot_asks() {
    // Its models draw from the generator a parallel training seeds.
    let _serial = super::serial();
    let schema = schema();
    let (fan_in, hidden) = (200i64, 8i64);
    for (init, root_weight) in [(LinearInit::Pyg, true), (LinearInit::Glorot, true)] {
        let cfg = RgnnConfig {
            kind: RelationalKind::Rsage,
            in_dims: vec![Some(fan_in); 3],
            hidden,
            classes: 3,
            layers: 1,
            heads: 1,
            dropout: 0.0,
            root_weight,
            init,
            scorer: None,
        };
        let vs = nn::VarStore::new(Device::Cpu);
        Rgnn::new(&vs.root(), &schema, &cfg).unwrap();
        let bound = match init {
            LinearInit::Pyg => 1.0 / (fan_in as f64).sqrt(),
            LinearInit::Glorot => (6.0 / (fan_in + hidden) as f64).sqrt(),
        };
        let vars = vs.variables();
        let mut maps = 0;
        for (name, t) in &vars {
            let max = t.abs().max().double_value(&[]);
            if name.ends_with("lin_l.weight") || name.ends_with("lin_r.weight") {
                maps += 1;
                // Within the bound, and filling it (the larger bound is
                // 2.4 times the smaller here).
                assert!(
                    max <= bound && max > 0.9 * bound,
                    "{init:?} {name}: {max} against {bound}"
                );
            }
            if name.ends_with("lin_l.bias") && init == LinearInit::Glorot {
                assert_eq!(max, 0.0, "{name}");
            }
        }
        assert_eq!(maps, 2 * schema.relations.len(), "{:?}", vars.keys());
    }
}
