//! One node type of a typed run, seen as a homogeneous run of its own:
//! each batch's input rows of that type, by type-local id, in the order
//! they appear among the batch's inputs. The seeds are the target type's
//! first inputs, so its view keeps their labels; no view keeps the blocks,
//! which the typed layout stores once, in its topology tables.

use offgnn_shared::samples::{NodeTypeInfo, Pairs, SampledBatch};

use crate::error::{Error, Result};

#[derive(Clone, Debug)]
pub(crate) struct TypeView {
    /// Its position among the dataset's node types.
    pub index: usize,
    pub name: String,
    /// Its homogenized id range: `offset..offset + rows`.
    pub offset: u32,
    pub rows: u32,
    /// The type that carries the task: its view keeps the seeds' labels.
    pub target: bool,
}

impl TypeView {
    pub(crate) fn of(index: usize, t: &NodeTypeInfo, target: &str) -> Result<TypeView> {
        let narrow = |v: u64| {
            u32::try_from(v).map_err(|_| {
                Error::InvalidArgument(format!(
                    "node type '{}' ends past 2^32 nodes: node ids are 32-bit",
                    t.name
                ))
            })
        };
        Ok(TypeView {
            index,
            name: t.name.clone(),
            offset: narrow(t.offset)?,
            rows: narrow(t.num)?,
            target: t.name == target,
        })
    }

    /// The type-local ids of `inputs` of this type, in their order.
    pub(crate) fn project(&self, inputs: &[u32]) -> Vec<u32> {
        let (lo, hi) = (self.offset, self.offset + self.rows);
        inputs
            .iter()
            .filter(|&&v| v >= lo && v < hi)
            .map(|&v| v - lo)
            .collect()
    }

    /// The batch as this type's layout records it: its inputs of the
    /// type, the seeds' labels in the target type's view, no blocks.
    pub(crate) fn batch(&self, b: &SampledBatch) -> SampledBatch {
        SampledBatch {
            split: b.split,
            epoch: b.epoch,
            index: b.index,
            seeds: Vec::new(),
            labels: if self.target {
                b.labels.clone()
            } else {
                Vec::new()
            },
            input_nodes: self.project(&b.input_nodes),
            blocks: Vec::new(),
            pairs: Pairs::default(),
        }
    }

    /// The object prefix of its layout under the run's prefix.
    pub(crate) fn prefix(&self, run_prefix: &str) -> String {
        format!("{run_prefix}/type-{:02}", self.index)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use offgnn_shared::dataset::Split;

    fn view(offset: u32, rows: u32, target: bool) -> TypeView {
        TypeView {
            index: 1,
            name: "author".into(),
            offset,
            rows,
            target,
        }
    }

    #[test]
    fn a_view_keeps_its_types_inputs_in_order_by_local_id() {
        let b = SampledBatch {
            split: Split::Train,
            epoch: 0,
            index: 3,
            seeds: vec![1, 0],
            labels: vec![5, 6],
            input_nodes: vec![1, 0, 12, 10, 3, 11, 20],
            blocks: Vec::new(),
            pairs: Pairs::default(),
        };
        let authors = view(10, 10, false).batch(&b);
        assert_eq!(authors.input_nodes, [2, 0, 1]);
        assert!(authors.labels.is_empty());
        let papers = view(0, 10, true).batch(&b);
        assert_eq!(papers.input_nodes, [1, 0, 3]);
        assert_eq!(papers.labels, [5, 6]);
        assert_eq!((papers.index, papers.split), (3, Split::Train));
        assert_eq!(view(20, 1, false).prefix("pack/r"), "pack/r/type-01");
    }
}
