//! `--dump-batches` for a typed layout: the first test batches as the best
//! epoch's model sees them, for parity checks outside the trainer (PyG's
//! `HeteroConv` on the same blocks, a loader's batches against the
//! trainer's).

use tch::{Device, Kind, Tensor};

use offgnn_shared::dataset::Split;

use super::Rgnn;
use super::train::{Run, TypedLayout};
use crate::error::Result;
use crate::train::DumpTarget;

/// Runs `model` on the first `target.batches` test batches of epoch 0 and
/// writes, per batch `k`: `batch{k}.x.{type}` (each type's input rows,
/// float32) and `batch{k}.n_id.{type}` (their type-local node ids, int64),
/// for each layer `l` and relation `r` `batch{k}.block{l}.rel{r}.src`
/// and `.dst` (int64 positions among the source and destination types'
/// rows, sorted by destination), `batch{k}.block{l}.num_dst` (each type's
/// destination rows), `batch{k}.logits` and `batch{k}.labels`, the types
/// and relations in the layout's order; a link batch's
/// `batch{k}.embeddings` (every type's seeds', one type after another) in
/// place of logits, and its pairs as `batch{k}.pairs.src`, `.dst` (rows
/// of those embeddings), `.label` and `.query`. Written to a temporary name,
/// then renamed.
pub(super) fn dump_batches(
    layout: &TypedLayout,
    model: &Rgnn,
    run: Run<'_>,
    target: &DumpTarget,
) -> Result<()> {
    let n = layout.batches(Split::Test, 0).min(target.batches);
    let order: Vec<usize> = (0..n).collect();
    let mut named: Vec<(String, Tensor)> = Vec::new();
    let types: Vec<String> = layout.schema.types.iter().map(|t| t.0.clone()).collect();
    layout
        .for_each_batch((Split::Test, 0, &order), run.with_rows(), &mut |k, b| {
            // A link model's outputs are its seeds' embeddings.
            let (out, logits) = match &b.pairs {
                Some(_) => (
                    "embeddings",
                    tch::no_grad(|| model.embed(super::Inputs::Rows(&b.x), &b.blocks, false))?,
                ),
                None => (
                    "logits",
                    tch::no_grad(|| model.forward(super::Inputs::Rows(&b.x), &b.blocks, false))?,
                ),
            };
            let mut add = |name: String, t: &Tensor| -> Result<()> {
                named.push((name, t.f_to_device(Device::Cpu)?));
                Ok(())
            };
            for (t, x) in b.x.iter().enumerate() {
                add(
                    format!("batch{k}.x.{}", types[t]),
                    &x.f_to_kind(Kind::Float)?,
                )?;
                add(
                    format!("batch{k}.n_id.{}", types[t]),
                    &Tensor::from_slice(&b.blocks.n_id[t]),
                )?;
            }
            for (l, layer) in b.blocks.layers.iter().enumerate() {
                for (r, e) in layer.relations.iter().enumerate() {
                    add(format!("batch{k}.block{l}.rel{r}.src"), &e.src)?;
                    add(format!("batch{k}.block{l}.rel{r}.dst"), &e.dst)?;
                }
                add(
                    format!("batch{k}.block{l}.num_dst"),
                    &Tensor::from_slice(&layer.num_dst),
                )?;
            }
            add(format!("batch{k}.{out}"), &logits)?;
            for (name, t) in crate::link::dumped_pairs(b.pairs.as_ref()) {
                add(format!("batch{k}.pairs.{name}"), t)?;
            }
            add(
                format!("batch{k}.labels"),
                &b.labels.f_to_kind(Kind::Int64)?,
            )
        })
        .map_err(|e| e.during(|| format!("dumping batches to {}", target.path.display())))?;
    crate::export::write_tensors(&target.path, &named)
}
