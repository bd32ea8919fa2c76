//! A typed batch's blocks as the relational models read them. The batch's
//! inputs are homogenized ids, each node type a contiguous range; a type's
//! rows are its inputs in the order they appear among the batch's inputs,
//! which is the order its layout assembles them in. A block's destinations
//! are a prefix of its sources, so at every layer each type's destinations
//! are a prefix of that type's sources. Each relation's edges become
//! positions among its source type's and destination type's rows.

use offgnn_shared::samples::Block;
use tch::{Device, Tensor};

use crate::error::{Error, Result};

/// The graph's types and relations, as the run summary names them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Schema {
    /// Each type's name and homogenized id range `offset..offset + rows`,
    /// in id order.
    pub types: Vec<(String, u64, u64)>,
    /// Each relation's source type, name and destination type, in the
    /// order of the blocks' relation offsets.
    pub relations: Vec<(usize, String, usize)>,
    /// The type the seeds are.
    pub target: usize,
}

impl Schema {
    /// The schema of `types` (name, offset, rows) and `relations`
    /// (`src:relation:dst`) with seeds of type `target`.
    pub fn new(
        types: Vec<(String, u64, u64)>,
        relations: &[String],
        target: &str,
    ) -> Result<Schema> {
        let find = |name: &str, what: &str| {
            types.iter().position(|t| t.0 == name).ok_or_else(|| {
                Error::InvalidArgument(format!("{what} '{name}' is not a node type of the graph"))
            })
        };
        let relations = relations
            .iter()
            .map(|r| match r.split(':').collect::<Vec<_>>()[..] {
                [s, name, d] => Ok((
                    find(s, "relation source")?,
                    name.to_string(),
                    find(d, "relation destination")?,
                )),
                _ => Err(Error::InvalidArgument(format!(
                    "relation '{r}' is not src:relation:dst"
                ))),
            })
            .collect::<Result<_>>()?;
        let target = find(target, "target type")?;
        Ok(Schema {
            types,
            relations,
            target,
        })
    }

    /// The schema of a typed layout.
    pub fn of(m: &offgnn_manifests::TypedManifest) -> Result<Schema> {
        let types = m
            .node_types
            .iter()
            .map(|t| (t.name.clone(), t.offset, t.rows))
            .collect();
        Schema::new(types, &m.relations, &m.dataset.target_type)
    }

    /// The type of homogenized node `v`.
    pub(crate) fn type_of(&self, v: u64) -> Option<usize> {
        let t = self.types.partition_point(|t| t.1 <= v).checked_sub(1)?;
        (v < self.types[t].1 + self.types[t].2).then_some(t)
    }

    /// The name PyG's `HeteroConv` gives a relation's convolution.
    pub fn conv_name(&self, r: usize) -> String {
        let (s, name, d) = &self.relations[r];
        format!("<{}___{name}___{}>", self.types[*s].0, self.types[*d].0)
    }
}

/// One relation's edges in one block, as positions among its types' rows,
/// sorted by destination.
pub struct RelationEdges {
    pub src: Tensor,
    pub dst: Tensor,
    /// In-degree of each of the destination type's rows in the block: the
    /// lengths of the edges' segments.
    pub counts: Tensor,
    /// Where each destination row's edges start, one more entry than rows
    /// (int64): the edges as bags, for `embedding_bag`.
    pub offsets: Tensor,
}

impl RelationEdges {
    /// Edges `src[i] -> dst[i]` (positions among the types' rows), sorted
    /// by destination, `counts` the in-degree of each destination row.
    pub fn new(src: &[i64], dst: &[i64], counts: &[i64], device: Device) -> RelationEdges {
        let mut offsets = Vec::with_capacity(counts.len() + 1);
        offsets.push(0i64);
        for &c in counts {
            offsets.push(offsets.last().copied().unwrap_or(0) + c);
        }
        RelationEdges {
            src: Tensor::from_slice(src).to_device(device),
            dst: Tensor::from_slice(dst).to_device(device),
            counts: Tensor::from_slice(counts).to_device(device),
            offsets: Tensor::from_slice(&offsets).to_device(device),
        }
    }
}

/// One block: each type's destination rows, and each relation's edges.
pub struct TypedLayer {
    pub num_dst: Vec<i64>,
    pub relations: Vec<RelationEdges>,
}

/// A typed batch's blocks (input layer first) and each type's input rows.
pub struct TypedBlocks {
    /// Rows of each type among the batch's inputs.
    pub num_inputs: Vec<i64>,
    /// Each type's input rows' node ids, type-local, on the host.
    pub n_id: Vec<Vec<i64>>,
    pub layers: Vec<TypedLayer>,
    /// Each seed's row among the last layer's rows of every type, one type
    /// after another (what [`super::Rgnn::embed`] returns).
    pub seed_rows: Vec<i64>,
}

impl TypedBlocks {
    /// Builds the blocks of a batch whose inputs are `input_nodes`
    /// (homogenized ids), on `device`; refuses an input outside every type
    /// and an edge whose endpoints are not its relation's types.
    pub fn new(
        schema: &Schema,
        input_nodes: &[u32],
        blocks: &[Block],
        device: Device,
    ) -> Result<TypedBlocks> {
        let inputs = Typed::of(schema, input_nodes.iter().copied())?;
        let levels = vec![&inputs; blocks.len()];
        Self::with_levels(schema, &inputs, &levels, blocks, device)
    }

    /// The blocks of a batch pruned against the historical cache, each
    /// with its own nodes: block `l`'s sources are `input_nodes` at the
    /// positions `orders[l]` (its destinations a prefix of them), block 0's
    /// the rows the model reads.
    pub fn pruned(
        schema: &Schema,
        input_nodes: &[u32],
        orders: &[&[u32]],
        blocks: &[Block],
        device: Device,
    ) -> Result<TypedBlocks> {
        let nodes = |order: &[u32]| {
            let ids = order.iter().map(|&p| input_nodes.get(p as usize).copied());
            let ids: Option<Vec<u32>> = ids.collect();
            let ids = ids.ok_or_else(|| {
                Error::InvalidArgument("a pruned level names a node past the batch's inputs".into())
            })?;
            Typed::of(schema, ids.into_iter())
        };
        let levels = orders
            .iter()
            .map(|o| nodes(o))
            .collect::<Result<Vec<_>>>()?;
        let empty = Typed::of(schema, std::iter::empty())?;
        let inputs = levels.first().unwrap_or(&empty);
        Self::with_levels(
            schema,
            inputs,
            &levels.iter().collect::<Vec<_>>(),
            blocks,
            device,
        )
    }

    /// The blocks over `levels` (each block's sources), `inputs` the rows
    /// the model reads.
    fn with_levels(
        schema: &Schema,
        inputs: &Typed,
        levels: &[&Typed],
        blocks: &[Block],
        device: Device,
    ) -> Result<TypedBlocks> {
        let layers = blocks
            .iter()
            .zip(levels)
            .enumerate()
            .map(|(l, (b, nodes))| {
                let at = (&nodes.type_of[..], &nodes.position[..]);
                layer(schema, b, at, device).map_err(|e| match e {
                    Error::InvalidArgument(m) => Error::InvalidArgument(format!("block {l}: {m}")),
                    e => e,
                })
            })
            .collect::<Result<Vec<TypedLayer>>>()?;
        // The seeds are the last block's destinations, each type's a prefix
        // of its rows.
        let seed_rows = match (layers.last(), levels.last()) {
            (Some(last), Some(nodes)) => {
                let mut base = vec![0i64; last.num_dst.len()];
                for t in 1..base.len() {
                    base[t] = base[t - 1] + last.num_dst[t - 1];
                }
                let seeds: i64 = last.num_dst.iter().sum();
                (0..seeds as usize)
                    .map(|i| base[nodes.type_of[i]] + nodes.position[i])
                    .collect()
            }
            _ => Vec::new(),
        };
        Ok(TypedBlocks {
            num_inputs: inputs.count.clone(),
            n_id: inputs.n_id.clone(),
            layers,
            seed_rows,
        })
    }
}

/// Nodes (homogenized ids) as their types see them: each one's type and
/// place among its type's, and each type's count and type-local ids.
struct Typed {
    type_of: Vec<usize>,
    position: Vec<i64>,
    count: Vec<i64>,
    n_id: Vec<Vec<i64>>,
}

impl Typed {
    fn of(schema: &Schema, nodes: impl Iterator<Item = u32>) -> Result<Typed> {
        let mut t = Typed {
            type_of: Vec::new(),
            position: Vec::new(),
            count: vec![0; schema.types.len()],
            n_id: vec![Vec::new(); schema.types.len()],
        };
        for v in nodes {
            let k = schema.type_of(u64::from(v)).ok_or_else(|| {
                Error::InvalidArgument(format!("input node {v} is of no node type"))
            })?;
            t.type_of.push(k);
            t.n_id[k].push((u64::from(v) - schema.types[k].1) as i64);
            t.position.push(t.count[k]);
            t.count[k] += 1;
        }
        Ok(t)
    }
}

fn layer(
    schema: &Schema,
    b: &Block,
    (type_of, position): (&[usize], &[i64]),
    device: Device,
) -> Result<TypedLayer> {
    let r = schema.relations.len();
    if b.relations.len() != r + 1 || b.relations.last() != Some(&(b.src.len() as u32)) {
        return Err(Error::InvalidArgument(format!(
            "{} relation offsets for {r} relations and {} edges",
            b.relations.len(),
            b.src.len()
        )));
    }
    if b.num_dst > b.num_src || b.num_src as usize > type_of.len() {
        return Err(Error::InvalidArgument(format!(
            "{} destinations and {} sources among {} inputs",
            b.num_dst,
            b.num_src,
            type_of.len()
        )));
    }
    let mut num_dst = vec![0i64; schema.types.len()];
    for &t in &type_of[..b.num_dst as usize] {
        num_dst[t] += 1;
    }
    let relations = schema
        .relations
        .iter()
        .enumerate()
        .map(|(ri, &(st, ref name, dt))| {
            let edges = b.relations[ri] as usize..b.relations[ri + 1] as usize;
            let mut src = Vec::with_capacity(edges.len());
            let mut dst = Vec::with_capacity(edges.len());
            let mut counts = vec![0i64; num_dst[dt] as usize];
            for e in edges {
                let (s, d) = (b.src[e] as usize, b.dst[e] as usize);
                if s >= b.num_src as usize || d >= b.num_dst as usize {
                    return Err(Error::InvalidArgument(format!(
                        "an edge of relation '{name}' leaves the block"
                    )));
                }
                if type_of[s] != st || type_of[d] != dt {
                    return Err(Error::InvalidArgument(format!(
                        "an edge of relation '{name}' joins nodes of other types"
                    )));
                }
                if dst.last().is_some_and(|&last| last > position[d]) {
                    return Err(Error::InvalidArgument(format!(
                        "the edges of relation '{name}' are not sorted by destination"
                    )));
                }
                src.push(position[s]);
                dst.push(position[d]);
                counts[position[d] as usize] += 1;
            }
            Ok(RelationEdges::new(&src, &dst, &counts, device))
        })
        .collect::<Result<_>>()?;
    Ok(TypedLayer { num_dst, relations })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeds_map_to_their_rows_among_every_types_last_layer_rows() {
        // Types a (ids 0..5) and b (5..10); seeds b, a, b, a, then two
        // more inputs; one block over a:r:b and b:s:a.
        let schema = Schema::new(
            vec![("a".into(), 0, 5), ("b".into(), 5, 5)],
            &["a:r:b".into(), "b:s:a".into()],
            "a",
        )
        .unwrap();
        let block = Block {
            num_src: 6,
            num_dst: 4,
            src: vec![4, 5],
            dst: vec![0, 1],
            relations: vec![0, 1, 2],
        };
        let blocks = TypedBlocks::new(&schema, &[6, 1, 7, 2, 3, 8], &[block], Device::Cpu).unwrap();
        assert_eq!(blocks.layers[0].num_dst, [2, 2]);
        assert_eq!(blocks.num_inputs, [3, 3]);
        // a's rows come first (seeds 1 and 2), then b's (6 and 7).
        assert_eq!(blocks.seed_rows, [2, 0, 3, 1]);
        assert_eq!(blocks.n_id, [vec![1, 2, 3], vec![1, 2, 3]]);
    }
}
