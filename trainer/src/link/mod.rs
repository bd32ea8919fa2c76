//! Link prediction: the scorer that turns two endpoints' embeddings into a
//! logit, the loss over a batch's positive and negative pairs, and the
//! ranking figures of evaluation (MRR and Hits@K over each positive's given
//! negatives, as OGB's `ogbl-citation2` evaluator computes them).
//!
//! The encoder is the node models' GNN with `classes` set to the embedding
//! width; a batch's seeds are the distinct endpoints of its pairs, and its
//! pairs index them (`samples::Pairs`).

pub(crate) mod score;

pub use score::{ScoreConfig, ScoreSummary, score};

use serde::{Deserialize, Serialize};
use tch::nn;
use tch::{Kind, Reduction, TchError, Tensor};

/// How two embeddings score as an edge.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum ScorerKind {
    /// `<h_u, h_v>`: no parameters.
    Dot,
    /// DGL's link-prediction predictor: `Linear(d, d) -> ReLU -> Linear(d,
    /// d) -> ReLU -> Linear(d, 1)` on `h_u * h_v`, its parameters named as
    /// a `torch.nn.Sequential` of those layers names them under `scorer`.
    Mlp,
}

impl ScorerKind {
    pub fn name(self) -> &'static str {
        match self {
            ScorerKind::Dot => "dot",
            ScorerKind::Mlp => "mlp",
        }
    }
}

/// The scorer's parameter prefix in the model's variables.
pub const SCORER_PREFIX: &str = "scorer.";

/// The scorer, its parameters (if any) in the model's variable store.
pub struct Scorer {
    lins: Vec<nn::Linear>,
}

impl Scorer {
    /// A scorer of `kind` over embeddings of width `dim`, under `scorer` in
    /// `vs`.
    pub fn new(vs: &nn::Path, kind: ScorerKind, dim: i64) -> Scorer {
        let p = vs / "scorer";
        let lins = match kind {
            ScorerKind::Dot => Vec::new(),
            ScorerKind::Mlp => [(0, dim), (2, dim), (4, 1)]
                .into_iter()
                .map(|(i, out)| nn::linear(&p / i, dim, out, crate::model::torch_linear_init(dim)))
                .collect(),
        };
        Scorer { lins }
    }

    /// One logit per pair: `h` holds the seeds' embeddings, `src` and `dst`
    /// (int64) index its rows.
    pub fn score(&self, h: &Tensor, src: &Tensor, dst: &Tensor) -> Result<Tensor, TchError> {
        let prod = h
            .f_index_select(0, src)?
            .f_mul(&h.f_index_select(0, dst)?)?;
        if self.lins.is_empty() {
            return prod.f_sum_dim_intlist(-1, false, Kind::Float);
        }
        let last = self.lins.len() - 1;
        let mut z = prod;
        for (i, lin) in self.lins.iter().enumerate() {
            z = z.f_linear(&lin.ws, lin.bs.as_ref())?;
            if i < last {
                z = z.f_relu()?;
            }
        }
        z.f_squeeze_dim(-1)
    }
}

/// A batch's pairs as int64 tensors on the device (views of the batch's
/// one upload): endpoints as seed rows, labels (1 an edge, 0 a negative),
/// and each pair's query.
pub struct PairTensors {
    pub src: Tensor,
    pub dst: Tensor,
    pub label: Tensor,
    pub query: Tensor,
    pub num_queries: i64,
}

/// A batch's pairs as `--dump-batches` names them (none for a node batch).
pub fn dumped_pairs(p: Option<&PairTensors>) -> Vec<(&'static str, &Tensor)> {
    p.map_or_else(Vec::new, |p| {
        vec![
            ("src", &p.src),
            ("dst", &p.dst),
            ("label", &p.label),
            ("query", &p.query),
        ]
    })
}

/// Binary cross-entropy of the pairs' logits against their labels, the
/// mean over the batch's pairs (DGL's and PyG's link-prediction loss).
pub fn pair_loss(scores: &Tensor, pairs: &PairTensors) -> Result<Tensor, TchError> {
    scores.f_binary_cross_entropy_with_logits::<Tensor>(
        &pairs.label.f_to_kind(Kind::Float)?,
        None,
        None,
        Reduction::Mean,
    )
}

/// Pairs whose logit falls on their label's side of 0, as an int64 scalar
/// on the device.
pub fn pairs_right(scores: &Tensor, pairs: &PairTensors) -> Result<Tensor, TchError> {
    scores
        .f_gt(0.0)?
        .f_eq_tensor(&pairs.label.f_eq(1)?)?
        .f_sum(Kind::Int64)
}

/// Each query's rank: one plus the negatives scored above its positive,
/// ties counting half (the mean of OGB's optimistic and pessimistic ranks).
/// Float, one per query.
pub fn ranks(scores: &Tensor, pairs: &PairTensors) -> Result<Tensor, TchError> {
    let opts = (Kind::Float, scores.device());
    let positive = pairs.label.f_eq(1)?;
    let negative = positive.f_logical_not()?;
    let pos_scores = Tensor::f_zeros([pairs.num_queries], opts)?.f_index_put(
        &[Some(pairs.query.f_masked_select(&positive)?)],
        &scores.f_masked_select(&positive)?,
        false,
    )?;
    let neg_query = pairs.query.f_masked_select(&negative)?;
    let neg = scores.f_masked_select(&negative)?;
    let against = pos_scores.f_index_select(0, &neg_query)?;
    let above = neg.f_gt_tensor(&against)?.f_to_kind(Kind::Float)?;
    let tied = neg.f_eq_tensor(&against)?.f_to_kind(Kind::Float)?;
    let weight = above.f_add(&tied.f_mul_scalar(0.5)?)?;
    Tensor::f_ones([pairs.num_queries], opts)?.f_index_add(0, &neg_query, &weight)
}

/// The K of Hits@K that evaluation reports.
pub const HITS_AT: [i64; 3] = [10, 50, 100];

/// Running sums of the ranking figures over evaluation batches: on the
/// device, reciprocal ranks, hits at each K and pairs classified right (read
/// back once, at the end); on the host, the queries and pairs.
pub struct RankSums {
    /// `[sum of 1/rank, hits@10, hits@50, hits@100, pairs right]`, float64.
    sums: Tensor,
    queries: f64,
    pairs: f64,
}

impl RankSums {
    pub fn new(device: tch::Device) -> RankSums {
        RankSums {
            sums: Tensor::zeros([5], (Kind::Double, device)),
            queries: 0.0,
            pairs: 0.0,
        }
    }

    /// Adds a batch's scored pairs.
    pub fn add(&mut self, scores: &Tensor, pairs: &PairTensors) -> Result<(), TchError> {
        let r = ranks(scores, pairs)?.f_to_kind(Kind::Double)?;
        let mut parts = vec![r.f_reciprocal()?.f_sum(Kind::Double)?];
        for k in HITS_AT {
            parts.push(r.f_le(k as f64)?.f_sum(Kind::Double)?);
        }
        parts.push(pairs_right(scores, pairs)?.f_to_kind(Kind::Double)?);
        let _ = self.sums.f_add_(&Tensor::f_stack(&parts, 0)?)?;
        self.queries += pairs.num_queries as f64;
        self.pairs += scores.size()[0] as f64;
        Ok(())
    }

    /// The sums read back (a sync on CUDA), for adding over ranks: those of
    /// the device, then queries and pairs.
    pub fn values(&self) -> Result<Vec<f64>, TchError> {
        let mut v = Vec::<f64>::try_from(&self.sums)?;
        v.extend([self.queries, self.pairs]);
        Ok(v)
    }
}

/// Ranking figures of one evaluation set.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RankMetrics {
    pub mrr: f64,
    pub hits_at_10: f64,
    pub hits_at_50: f64,
    pub hits_at_100: f64,
    pub queries: u64,
}

impl RankMetrics {
    /// The figures of [`RankSums::values`] (summed over ranks), and the
    /// share of pairs classified right.
    pub fn of(v: &[f64]) -> (RankMetrics, f64) {
        let q = v[5].max(1.0);
        (
            RankMetrics {
                mrr: v[0] / q,
                hits_at_10: v[1] / q,
                hits_at_50: v[2] / q,
                hits_at_100: v[3] / q,
                queries: v[5] as u64,
            },
            v[4] / v[6].max(1.0),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::Device;

    fn pairs(label: &[i64], query: &[i64], num_queries: i64) -> PairTensors {
        let n = label.len() as i64;
        PairTensors {
            src: Tensor::zeros([n], (Kind::Int64, Device::Cpu)),
            dst: Tensor::zeros([n], (Kind::Int64, Device::Cpu)),
            label: Tensor::from_slice(label),
            query: Tensor::from_slice(query),
            num_queries,
        }
    }

    /// The ranks, MRR and Hits@K of random scores equal a direct count per
    /// query, ties included.
    #[test]
    fn ranks_and_hits_equal_a_direct_count() {
        tch::manual_seed(3);
        let negatives = [150usize, 3, 60, 1];
        let (mut label, mut query) = (Vec::new(), Vec::new());
        for (q, &k) in negatives.iter().enumerate() {
            label.push(1);
            query.push(q as i64);
            label.extend(std::iter::repeat_n(0, k));
            query.extend(std::iter::repeat_n(q as i64, k));
        }
        let p = pairs(&label, &query, negatives.len() as i64);
        // Scores on a coarse grid, so that ties occur.
        let scores = Tensor::randint(5, [label.len() as i64], (Kind::Float, Device::Cpu));
        let s: Vec<f32> = Vec::try_from(&scores).unwrap();
        let mut want = Vec::new();
        let mut at = 0;
        for &k in &negatives {
            let pos = s[at];
            let negs = &s[at + 1..at + 1 + k];
            let above = negs.iter().filter(|&&n| n > pos).count() as f64;
            let tied = negs.iter().filter(|&&n| n == pos).count() as f64;
            want.push(1.0 + above + tied / 2.0);
            at += 1 + k;
        }
        let got: Vec<f32> = Vec::try_from(&ranks(&scores, &p).unwrap()).unwrap();
        assert_eq!(got, want.iter().map(|&r| r as f32).collect::<Vec<_>>());
        let mut sums = RankSums::new(Device::Cpu);
        sums.add(&scores, &p).unwrap();
        sums.add(&scores, &p).unwrap();
        let (m, _) = RankMetrics::of(&sums.values().unwrap());
        let mrr = want.iter().map(|r| 1.0 / r).sum::<f64>() / want.len() as f64;
        assert!((m.mrr - mrr).abs() < 1e-12, "{} {mrr}", m.mrr);
        let hits = |k: f64| want.iter().filter(|&&r| r <= k).count() as f64 / want.len() as f64;
        assert_eq!(
            (m.hits_at_10, m.hits_at_50, m.hits_at_100),
            (hits(10.0), hits(50.0), hits(100.0))
        );
        assert_eq!(m.queries, 8);
    }

    /// A positive above all its negatives ranks first; below all, last.
    #[test]
    fn a_perfect_and_a_worst_scorer_rank_first_and_last() {
        let p = pairs(&[1, 0, 0, 1, 0], &[0, 0, 0, 1, 1], 2);
        let s = Tensor::from_slice(&[3.0f32, 1.0, 2.0, -1.0, 0.0]);
        let r: Vec<f32> = Vec::try_from(&ranks(&s, &p).unwrap()).unwrap();
        assert_eq!(r, [1.0, 2.0]);
        let right: i64 = pairs_right(&s, &p).unwrap().int64_value(&[]);
        // 3 an edge called an edge, 0 a negative called one; 1 and 2 are
        // negatives called edges, -1 an edge missed.
        assert_eq!(right, 2);
    }

    /// The MLP scorer's parameters are named as `torch.nn.Sequential`
    /// names `Linear, ReLU, Linear, ReLU, Linear`; the dot scorer has none.
    #[test]
    fn scorer_parameters_are_named_as_a_sequential() {
        let vs = nn::VarStore::new(Device::Cpu);
        let s = Scorer::new(&vs.root(), ScorerKind::Mlp, 4);
        let mut names: Vec<String> = vs.variables().into_keys().collect();
        names.sort();
        assert_eq!(
            names,
            [
                "scorer.0.bias",
                "scorer.0.weight",
                "scorer.2.bias",
                "scorer.2.weight",
                "scorer.4.bias",
                "scorer.4.weight"
            ]
        );
        let h = Tensor::randn([3, 4], (Kind::Float, Device::Cpu));
        let idx = Tensor::from_slice(&[0i64, 2]);
        assert_eq!(s.score(&h, &idx, &idx).unwrap().size(), [2]);
        let vs = nn::VarStore::new(Device::Cpu);
        let dot = Scorer::new(&vs.root(), ScorerKind::Dot, 4);
        assert!(vs.variables().is_empty());
        let got = dot
            .score(&h, &idx, &Tensor::from_slice(&[1i64, 1]))
            .unwrap();
        let want = (h.get(0) * h.get(1)).sum(Kind::Float);
        assert!(got.get(0).allclose(&want, 1e-6, 1e-6, false));
    }
}
