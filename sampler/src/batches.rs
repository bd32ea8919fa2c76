//! The batches of a run: how the plan cuts each split into batches, and
//! what each batch becomes when sampled. A node-classification batch is
//! seeds with their labels; a link-prediction batch is training pairs
//! (with negatives drawn and their own edges excluded) or evaluation
//! queries (each positive with its given negatives).
//!
//! The plan is fixed by the dataset, the parameters and the seed: training
//! items are shuffled per epoch by a generator of (seed, epoch); batches
//! are cut in order; every `batches_per_file` batches make one file; files
//! are dealt to shards round-robin.

use offgnn_shared::dataset::{LinkTask, Split};
use offgnn_shared::samples::{Pairs, SampledBatch};
use rand::SeedableRng;
use rand::seq::SliceRandom;

use crate::config::SampleConfig;
use crate::input::{Graph, Input};
use crate::link_sampling::{LinkSampler, sample_rows};
use crate::neighbor_sampling::{Scratch, batch_rng, mix, sample_blocks};
use crate::typed_sampling::sample_typed_blocks;

/// What one batch holds before sampling.
#[derive(Clone, Debug)]
pub(crate) enum Batch {
    /// Seeds and their labels.
    Nodes(Vec<(u32, u32)>),
    /// Positive training pairs (global ids).
    Pairs(Vec<(u32, u32)>),
    /// Evaluation queries, by their number in the split.
    Queries(Vec<u32>),
}

/// One output file's worth of batches.
pub(crate) struct Unit {
    pub split: Split,
    pub epoch: u32,
    pub part: u32,
    pub first_batch: u32,
    pub batches: Vec<Batch>,
}

/// The run's task, as the sampler needs it: the dataset's node
/// classification, or its link prediction.
pub(crate) struct Task<'a> {
    pub input: Input<'a>,
    pub links: Option<Links<'a>>,
}

/// Link prediction's pairs and how its training batches are sampled.
pub(crate) struct Links<'a> {
    pub task: &'a LinkTask,
    pub sampler: LinkSampler<'a>,
}

impl Task<'_> {
    /// A split's items (seeds, pairs or queries) and how many make a batch:
    /// the split's batch size in seeds or pairs; evaluation queries such
    /// that a batch scores about that many pairs.
    pub fn split_size(&self, split: Split, cfg: &SampleConfig) -> (u64, usize) {
        let batch_size = cfg.batch_size_for(split);
        match &self.links {
            None => (self.input.split(split).seeds.len() as u64, batch_size),
            Some(Links { task, .. }) => task.split_items(split, batch_size),
        }
    }

    /// The batches of one epoch of `split`, in order.
    fn epoch_batches(&self, split: Split, epoch: u32, cfg: &SampleConfig) -> Vec<Batch> {
        let (_, per_batch) = self.split_size(split, cfg);
        let shuffle = |v: &mut Vec<(u32, u32)>| {
            if split == Split::Train {
                let key = mix(mix(cfg.seed) ^ 0xE90C ^ u64::from(epoch));
                v.shuffle(&mut rand_pcg::Pcg64Mcg::seed_from_u64(key));
            }
        };
        match &self.links {
            None => {
                let set = self.input.split(split);
                let mut items: Vec<(u32, u32)> = set
                    .seeds
                    .iter()
                    .copied()
                    .zip(set.labels.iter().copied())
                    .collect();
                shuffle(&mut items);
                items
                    .chunks(per_batch)
                    .map(|c| Batch::Nodes(c.to_vec()))
                    .collect()
            }
            Some(Links { task, .. }) => match split {
                Split::Train => {
                    let mut items = task.train.pairs.clone();
                    shuffle(&mut items);
                    items
                        .chunks(per_batch)
                        .map(|c| Batch::Pairs(c.to_vec()))
                        .collect()
                }
                Split::Valid | Split::Test => {
                    let (queries, _) = self.split_size(split, cfg);
                    let all: Vec<u32> = (0..queries as u32).collect();
                    all.chunks(per_batch)
                        .map(|c| Batch::Queries(c.to_vec()))
                        .collect()
                }
            },
        }
    }

    /// Every file of the run, in a fixed order; `owned` keeps one shard's.
    pub fn plan(&self, cfg: &SampleConfig, owned: bool) -> Vec<Unit> {
        let mut units = Vec::new();
        let mut global = 0u32;
        let epochs = |split: Split| if split == Split::Train { cfg.epochs } else { 1 };
        for split in Split::ALL {
            for epoch in 0..epochs(split) {
                let batches = self.epoch_batches(split, epoch, cfg);
                for (part, chunk) in batches.chunks(cfg.batches_per_file as usize).enumerate() {
                    if !owned || global % cfg.num_shards == cfg.shard {
                        units.push(Unit {
                            split,
                            epoch,
                            part: part as u32,
                            first_batch: part as u32 * cfg.batches_per_file,
                            batches: chunk.to_vec(),
                        });
                    }
                    global += 1;
                }
            }
        }
        units
    }

    /// Samples batch `index` of `unit`, from its own generator.
    pub fn sample(
        &self,
        cfg: &SampleConfig,
        graph: &Graph,
        (unit, index, batch): (&Unit, u32, &Batch),
        scratch: &mut Scratch,
    ) -> SampledBatch {
        let mut rng = batch_rng(cfg.seed, unit.split, unit.epoch, index);
        let (seeds, labels, input_nodes, blocks, pairs) = match (&self.links, batch) {
            (Some(Links { sampler, .. }), Batch::Pairs(pairs)) => {
                let b = sampler.sample(pairs, &mut rng, scratch);
                (b.seeds, vec![], b.nodes, b.blocks, b.pairs)
            }
            (Some(Links { task, sampler }), Batch::Queries(queries)) => {
                let set = if unit.split == Split::Valid {
                    &task.valid
                } else {
                    &task.test
                };
                let mut rows = Vec::new();
                for (q, &query) in queries.iter().enumerate() {
                    let query_no = query as usize;
                    rows.push((set.positives[query_no], 1, q as u32));
                    let range = set.offsets[query_no] as usize..set.offsets[query_no + 1] as usize;
                    rows.extend(set.negatives[range].iter().map(|&p| (p, 0, q as u32)));
                }
                // Evaluation pairs are held out of the graph already.
                let b = sample_rows(sampler.graph, &rows, None, &mut rng, scratch);
                (b.seeds, vec![], b.nodes, b.blocks, b.pairs)
            }
            (_, Batch::Nodes(items)) => {
                let seeds: Vec<u32> = items.iter().map(|p| p.0).collect();
                let labels: Vec<u32> = items.iter().map(|p| p.1).collect();
                let (input_nodes, blocks) = match graph {
                    Graph::Plain(csr) => {
                        sample_blocks(csr, &cfg.fanouts, &seeds, &mut rng, scratch)
                    }
                    Graph::Typed(g, fanouts) => {
                        sample_typed_blocks(g, fanouts, &seeds, &mut rng, scratch)
                    }
                };
                (seeds, labels, input_nodes, blocks, Pairs::default())
            }
            (None, Batch::Pairs(_) | Batch::Queries(_)) => {
                unreachable!("a node task plans node batches only")
            }
        };
        SampledBatch {
            split: unit.split,
            epoch: unit.epoch,
            index,
            seeds,
            labels,
            input_nodes,
            blocks,
            pairs,
        }
    }
}
