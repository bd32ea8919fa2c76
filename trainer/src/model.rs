//! The models, on message-flow-graph blocks (input layer first): GraphSAGE
//! with mean aggregation and GAT with multi-head attention, softmax over each
//! destination's sampled in-edges. Three layers by default; dropout between
//! layers. DiskGNN §7 uses hidden 256 for GraphSAGE and 4 heads x 32 for GAT.
//! Each computes exactly the function of PyTorch Geometric's model class of
//! the same kind, and names its parameters as that class does, so that an
//! export (see `export`) loads into PyG with `strict=True`.
//! An MLP on the seeds' own features is the features-only baseline: what a
//! GNN gains over it is what the graph contributes.

use tch::nn;
use tch::{Device, Kind, TchError, Tensor};

/// One block as index tensors on the training device.
pub struct BlockTensors {
    pub src: Tensor,
    pub dst: Tensor,
    pub num_src: i64,
    pub num_dst: i64,
    /// In-degree of each destination (int64); edges are sorted by
    /// destination, so these are also the lengths of its edge segments.
    pub counts: Tensor,
    /// Where each destination's edges start in `src`, `num_dst + 1`
    /// entries (int64): the edges as bags, for `embedding_bag`.
    pub offsets: Tensor,
}

/// A level's embeddings between two layers, after the activation and
/// before dropout: `(level, rows the block below computed)` in, the next
/// block's sources out. The historical cache (`crate::historical`) lays
/// its cached rows in here; plain training passes them through.
pub type LevelHook<'a> = dyn FnMut(usize, Tensor) -> Result<Tensor, TchError> + 'a;

/// A GNN over a stack of blocks. Its forward pass is fallible: on a GPU any
/// of its allocations can run out of memory, which the caller reports.
pub trait Gnn: Send {
    fn forward(
        &self,
        x: &Tensor,
        blocks: &[BlockTensors],
        train: bool,
    ) -> Result<Tensor, TchError> {
        self.forward_levels(x, blocks, train, &mut |_, h| Ok(h))
    }

    /// The forward pass with `level` called on each level's embeddings
    /// (levels `1..layers`, input layer 0).
    fn forward_levels(
        &self,
        x: &Tensor,
        blocks: &[BlockTensors],
        train: bool,
        level: &mut LevelHook<'_>,
    ) -> Result<Tensor, TchError>;
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ModelKind {
    Sage,
    Gat,
    Mlp,
}

#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ModelConfig {
    pub kind: ModelKind,
    pub in_dim: i64,
    pub hidden: i64,
    pub classes: i64,
    pub layers: usize,
    pub heads: i64,
    pub dropout: f64,
    /// Link prediction: the scorer over pairs of the encoder's outputs
    /// (`classes` is then the embedding width). Absent for node tasks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scorer: Option<crate::link::ScorerKind>,
}

pub fn build(vs: &nn::Path, cfg: &ModelConfig) -> Box<dyn Gnn> {
    match cfg.kind {
        ModelKind::Sage => Box::new(Sage::new(vs, cfg)),
        ModelKind::Gat => Box::new(Gat::new(vs, cfg)),
        ModelKind::Mlp => Box::new(Mlp::new(vs, cfg)),
    }
}

/// The model of `cfg` and, for a link-prediction model, its scorer: every
/// parameter its checkpoints and exports hold.
pub fn build_with_scorer(
    vs: &nn::Path,
    cfg: &ModelConfig,
) -> (Box<dyn Gnn>, Option<crate::link::Scorer>) {
    let net = build(vs, cfg);
    let scorer = (cfg.scorer).map(|kind| crate::link::Scorer::new(vs, kind, cfg.classes));
    (net, scorer)
}

/// Layer widths: input, `layers - 1` hidden, classes.
pub(crate) fn widths(cfg: &ModelConfig) -> Vec<i64> {
    std::iter::once(cfg.in_dim)
        .chain(std::iter::repeat_n(cfg.hidden, cfg.layers - 1))
        .chain(std::iter::once(cfg.classes))
        .collect()
}

/// The slope of GAT's LeakyReLU on negative attention scores (PyG's
/// `GATConv` default, `negative_slope=0.2`); inference computes the same.
pub const GAT_NEGATIVE_SLOPE: f64 = 0.2;

/// The activation between layers, by PyTorch Geometric's name for it (the
/// `act` argument of its model classes): ReLU for GraphSAGE and the MLP (PyG's
/// default), ELU for GAT (Veličković et al.).
pub fn activation(kind: ModelKind) -> &'static str {
    match kind {
        ModelKind::Sage | ModelKind::Mlp => "relu",
        ModelKind::Gat => "elu",
    }
}

/// Between two layers, as PyG's `BasicGNN` and `MLP` do: activation, then
/// dropout; `level` sees the activated rows of level `l` first.
fn between_layers(
    h: Tensor,
    kind: ModelKind,
    dropout: f64,
    train: bool,
    (l, level): (usize, &mut LevelHook<'_>),
) -> Result<Tensor, TchError> {
    let h = match kind {
        ModelKind::Gat => h.f_elu()?,
        ModelKind::Sage | ModelKind::Mlp => h.f_relu()?,
    };
    dropout_of(&level(l, h)?, dropout, train)
}

/// Dropout as torch's: in training, each element kept with probability
/// `1 - p` and scaled by `1 / (1 - p)`, decided by the global generator
/// (which the trainer seeds per batch). On the CPU the keep mask is drawn
/// here ([`keep_mask`]): libtorch's CPU Bernoulli kernel runs serially and
/// takes MKL's vectorized path only on Intel processors, and elsewhere it
/// cost a link batch's step a good share of its time. The mask is kept as bytes, as torch's own
/// dropout keeps its booleans.
pub(crate) fn dropout_of(x: &Tensor, p: f64, train: bool) -> Result<Tensor, TchError> {
    if !train || p == 0.0 || p >= 1.0 || x.device() != Device::Cpu {
        return x.f_dropout(p, train);
    }
    x.f_mul(&keep_mask(&x.size(), p)?)?
        .f_mul_scalar(1.0 / (1.0 - p))
}

/// A uint8 tensor of `shape` whose elements are 1 with probability `1 - p`
/// (to within 2^-32), 0 otherwise: one seed drawn from torch's global
/// generator, then PCG's 32-bit draws, one an element.
fn keep_mask(shape: &[i64], p: f64) -> Result<Tensor, TchError> {
    use rand::{RngCore, SeedableRng};
    let seed = Tensor::f_randint(i64::MAX, [1], (Kind::Int64, Device::Cpu))?.f_int64_value(&[0])?;
    let mut rng = rand_pcg::Pcg64Mcg::seed_from_u64(seed as u64);
    // An element is dropped when its draw is below p * 2^32.
    let below = (p * 4_294_967_296.0) as u64;
    let n = shape.iter().product::<i64>().max(0) as usize;
    let mut keep = vec![0u8; n];
    for pair in keep.chunks_mut(2) {
        let draw = rng.next_u64();
        for (k, half) in pair.iter_mut().zip([draw & 0xFFFF_FFFF, draw >> 32]) {
            *k = u8::from(half >= below);
        }
    }
    Tensor::f_from_slice(&keep)?.f_view(shape)
}

/// `lin`'s forward pass on `x`, as `nn::Linear` computes it, but fallible.
fn linear(lin: &nn::Linear, x: &Tensor) -> Result<Tensor, TchError> {
    x.f_linear(&lin.ws, lin.bs.as_ref())
}

/// `torch.nn.Linear`'s own initialization (and PyG's `Linear`'s, whose
/// Kaiming-uniform with `a = sqrt(5)` is the same bound), weights and bias
/// uniform in `±1/sqrt(fan_in)`: tch's default draws the weights 2.45 times
/// wider (Kaiming's ReLU gain).
pub(crate) fn torch_linear_init(fan_in: i64) -> nn::LinearConfig {
    let bound = 1.0 / (fan_in as f64).sqrt();
    let uniform = nn::Init::Uniform {
        lo: -bound,
        up: bound,
    };
    nn::LinearConfig {
        ws_init: uniform,
        bs_init: Some(uniform),
        bias: true,
    }
}

/// A linear layer without bias, as PyG's `Linear(..., bias=False)`.
fn linear_no_bias(p: nn::Path, d_in: i64, d_out: i64) -> nn::Linear {
    nn::linear(
        p,
        d_in,
        d_out,
        nn::LinearConfig {
            bias: false,
            ..Default::default()
        },
    )
}

/// The features-only baseline: as many linear layers as the GNN has, on the
/// seeds' own rows (input rows `0..seeds`), no neighbor in sight. Parameters
/// are named as in `torch_geometric.nn.models.MLP` with `norm=None`
/// (`lins.{l}.weight`, `lins.{l}.bias`).
pub struct Mlp {
    lin: Vec<nn::Linear>,
    dropout: f64,
}

impl Mlp {
    pub fn new(vs: &nn::Path, cfg: &ModelConfig) -> Self {
        let dims = widths(cfg);
        let lins = vs / "lins";
        let lin = (0..cfg.layers)
            .map(|l| nn::linear(&lins / l, dims[l], dims[l + 1], Default::default()))
            .collect();
        Mlp {
            lin,
            dropout: cfg.dropout,
        }
    }
}

impl Gnn for Mlp {
    /// The MLP has no levels of nodes: `level` is never called.
    fn forward_levels(
        &self,
        x: &Tensor,
        blocks: &[BlockTensors],
        train: bool,
        _level: &mut LevelHook<'_>,
    ) -> Result<Tensor, TchError> {
        let seeds = blocks.last().map_or(x.size()[0], |b| b.num_dst);
        let mut h = x.f_narrow(0, 0, seeds)?;
        let last = self.lin.len() - 1;
        for (l, lin) in self.lin.iter().enumerate() {
            let out = linear(lin, &h)?;
            h = if l == last {
                out
            } else {
                between_layers(
                    out,
                    ModelKind::Mlp,
                    self.dropout,
                    train,
                    (l + 1, &mut |_, h| Ok(h)),
                )?
            };
        }
        Ok(h)
    }
}

/// Mean of each destination's incoming source rows (zero without any), as
/// an `embedding_bag` over `h` with a bag per destination: it never holds
/// an `[edges, d]` matrix, and is several times faster on the CPU than
/// gathering a row per edge and adding them up (`index_select` +
/// `index_add`).
fn mean_aggregate(h: &Tensor, b: &BlockTensors) -> Result<Tensor, TchError> {
    const MEAN: i64 = 1;
    let (out, _, _, _) =
        Tensor::f_embedding_bag::<Tensor>(h, &b.src, &b.offsets, false, MEAN, false, None, true)?;
    Ok(out)
}

/// GraphSAGE (Hamilton et al.) with mean aggregation, exactly PyG's
/// `SAGEConv`: `h_dst' = lin_l(mean(h_src)) + lin_r(h_dst)`, the bias on
/// `lin_l`. Parameters are named as in `torch_geometric.nn.models.GraphSAGE`
/// (`convs.{l}.lin_l.weight`, `convs.{l}.lin_l.bias`, `convs.{l}.lin_r.weight`).
pub struct Sage {
    lin_l: Vec<nn::Linear>,
    lin_r: Vec<nn::Linear>,
    dropout: f64,
}

impl Sage {
    pub fn new(vs: &nn::Path, cfg: &ModelConfig) -> Self {
        let dims = widths(cfg);
        let convs = vs / "convs";
        let (mut lin_l, mut lin_r) = (Vec::new(), Vec::new());
        for l in 0..cfg.layers {
            let p = &convs / l;
            lin_l.push(nn::linear(
                &p / "lin_l",
                dims[l],
                dims[l + 1],
                Default::default(),
            ));
            lin_r.push(linear_no_bias(&p / "lin_r", dims[l], dims[l + 1]));
        }
        Sage {
            lin_l,
            lin_r,
            dropout: cfg.dropout,
        }
    }
}

impl Gnn for Sage {
    fn forward_levels(
        &self,
        x: &Tensor,
        blocks: &[BlockTensors],
        train: bool,
        level: &mut LevelHook<'_>,
    ) -> Result<Tensor, TchError> {
        let mut h = x.shallow_clone();
        let last = blocks.len() - 1;
        for (l, b) in blocks.iter().enumerate() {
            let h_dst = h.f_narrow(0, 0, b.num_dst)?;
            let out = linear(&self.lin_l[l], &mean_aggregate(&h, b)?)?
                .f_add(&linear(&self.lin_r[l], &h_dst)?)?;
            h = if l == last {
                out
            } else {
                between_layers(out, ModelKind::Sage, self.dropout, train, (l + 1, level))?
            };
        }
        Ok(h)
    }
}

/// GAT (Veličković et al.), exactly PyG's `GATConv` with `residual=True` as
/// `torch_geometric.nn.models.GAT` builds it: per head,
/// `e_uv = LeakyReLU_0.2(att_src·Wh_u + att_dst·Wh_v)`, softmax over each
/// destination's in-edges plus a self-loop (edges from a node to itself in
/// the block are replaced by that one self-loop, as PyG's `add_self_loops`
/// does), weighted sum of `Wh_u`; hidden layers concatenate heads, the
/// output layer averages them; then `+ res(h_dst) + bias`. Attention
/// coefficients get the model's dropout in training, as in PyG. Parameters:
/// `convs.{l}.lin.weight`, `convs.{l}.att_src`, `convs.{l}.att_dst`,
/// `convs.{l}.res.weight`, `convs.{l}.bias`.
pub struct Gat {
    lin: Vec<nn::Linear>,
    res: Vec<nn::Linear>,
    att_src: Vec<Tensor>,
    att_dst: Vec<Tensor>,
    bias: Vec<Tensor>,
    heads: i64,
    out_per_head: Vec<i64>,
    dropout: f64,
}

impl Gat {
    pub fn new(vs: &nn::Path, cfg: &ModelConfig) -> Self {
        // PyG's GAT gives each hidden head hidden / heads channels and
        // requires the division to be exact (checked where flags are read).
        let per_head = (cfg.hidden / cfg.heads).max(1);
        let mut in_dim = cfg.in_dim;
        let convs = vs / "convs";
        let mut g = Gat {
            lin: vec![],
            res: vec![],
            att_src: vec![],
            att_dst: vec![],
            bias: vec![],
            heads: cfg.heads,
            out_per_head: vec![],
            dropout: cfg.dropout,
        };
        for l in 0..cfg.layers {
            let last = l + 1 == cfg.layers;
            let out = if last { cfg.classes } else { per_head };
            // Hidden layers concatenate the heads; the last averages them.
            let total_out = if last { out } else { cfg.heads * out };
            let p = &convs / l;
            g.lin
                .push(linear_no_bias(&p / "lin", in_dim, cfg.heads * out));
            g.res.push(linear_no_bias(&p / "res", in_dim, total_out));
            let glorot = |name: &str| {
                let bound = (6.0 / (cfg.heads + out) as f64).sqrt();
                p.var(
                    name,
                    &[1, cfg.heads, out],
                    nn::Init::Uniform {
                        lo: -bound,
                        up: bound,
                    },
                )
            };
            g.att_src.push(glorot("att_src"));
            g.att_dst.push(glorot("att_dst"));
            g.bias.push(p.zeros("bias", &[total_out]));
            g.out_per_head.push(out);
            in_dim = total_out;
        }
        g
    }
}

impl Gnn for Gat {
    fn forward_levels(
        &self,
        x: &Tensor,
        blocks: &[BlockTensors],
        train: bool,
        level: &mut LevelHook<'_>,
    ) -> Result<Tensor, TchError> {
        let mut h = x.shallow_clone();
        let last = blocks.len() - 1;
        for (l, b) in blocks.iter().enumerate() {
            let out = self.out_per_head[l];
            let z = linear(&self.lin[l], &h)?.f_view([-1, self.heads, out])?;
            let z_dst = z.f_narrow(0, 0, b.num_dst)?;
            let sum_last = |t: Tensor| t.f_sum_dim_intlist([-1i64].as_slice(), false, Kind::Float);
            let el = sum_last(z.f_mul(&self.att_src[l])?)?;
            let er = sum_last(z_dst.f_mul(&self.att_dst[l])?)?;
            let leaky_relu = |e: Tensor| e.f_maximum(&e.f_mul_scalar(GAT_NEGATIVE_SLOPE)?);
            // Block edges from a destination to itself give way to the one
            // self-loop every destination gets (PyG: remove_self_loops, then
            // add_self_loops); their scores become -inf, their weights 0.
            let self_edge = b.src.f_eq_tensor(&b.dst)?.f_unsqueeze(-1)?;
            let e = leaky_relu(
                el.f_index_select(0, &b.src)?
                    .f_add(&er.f_index_select(0, &b.dst)?)?,
            )?
            .f_masked_fill(&self_edge, f64::NEG_INFINITY)?;
            let e_self = leaky_relu(el.f_narrow(0, 0, b.num_dst)?.f_add(&er)?)?;
            // Softmax over each destination's in-edges and its self-loop,
            // shifted by their maximum. Edges come sorted by destination: a
            // segment max per destination.
            let max = tch::no_grad(|| {
                Tensor::f_segment_reduce(
                    &e,
                    "max",
                    Some(&b.counts),
                    None,
                    None,
                    0,
                    // unsafe: the lengths are the block's in-degrees, counted
                    // from its sorted edges (checking them syncs a CUDA device).
                    true,
                    f64::NEG_INFINITY,
                )?
                .f_maximum(&e_self)
            })?;
            let w = e.f_sub(&max.f_index_select(0, &b.dst)?)?.f_exp()?;
            let w_self = e_self.f_sub(&max)?.f_exp()?;
            // PyG's softmax divides by the sum plus 1e-16.
            let denom = Tensor::f_zeros([b.num_dst, self.heads], (w.kind(), w.device()))?
                .f_index_add(0, &b.dst, &w)?
                .f_add(&w_self)?
                .f_add_scalar(1e-16)?;
            let alpha = dropout_of(
                &w.f_div(&denom.f_index_select(0, &b.dst)?)?,
                self.dropout,
                train,
            )?;
            let alpha_self = dropout_of(&w_self.f_div(&denom)?, self.dropout, train)?;
            let msg = z
                .f_index_select(0, &b.src)?
                .f_mul(&alpha.f_unsqueeze(-1)?)?;
            let agg = Tensor::f_zeros([b.num_dst, self.heads, out], (msg.kind(), msg.device()))?
                .f_index_add(0, &b.dst, &msg)?
                .f_add(&z_dst.f_mul(&alpha_self.f_unsqueeze(-1)?)?)?;
            let agg = if l == last {
                agg.f_mean_dim([1i64].as_slice(), false, Kind::Float)?
            } else {
                agg.f_flatten(1, 2)?
            };
            let y = agg
                .f_add(&linear(&self.res[l], &h.f_narrow(0, 0, b.num_dst)?)?)?
                .f_add(&self.bias[l])?;
            h = if l == last {
                y
            } else {
                between_layers(y, ModelKind::Gat, self.dropout, train, (l + 1, level))?
            };
        }
        Ok(h)
    }
}

/// Adam (Kingma & Ba) with its moments kept as named tensors, so that a
/// checkpoint holds the optimizer state and a resumed run continues exactly.
pub struct Adam {
    params: Vec<(String, Tensor)>,
    m: Vec<Tensor>,
    v: Vec<Tensor>,
    pub step: i64,
    pub lr: f64,
    beta1: f64,
    beta2: f64,
    eps: f64,
}

impl Adam {
    pub fn new(vs: &nn::VarStore, lr: f64) -> Self {
        let mut params: Vec<(String, Tensor)> = vs.variables().into_iter().collect();
        params.sort_by(|a, b| a.0.cmp(&b.0));
        let m = params.iter().map(|(_, p)| p.zeros_like()).collect();
        let v = params.iter().map(|(_, p)| p.zeros_like()).collect();
        Adam {
            params,
            m,
            v,
            step: 0,
            lr,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
        }
    }

    pub fn zero_grad(&mut self) {
        for (_, p) in self.params.iter_mut() {
            p.zero_grad();
        }
    }

    /// One step over the gradients the backward pass left; on a GPU its
    /// temporaries can run out of memory, which the caller reports.
    pub fn step(&mut self) -> Result<(), TchError> {
        self.step += 1;
        let (b1, b2) = (self.beta1, self.beta2);
        let c1 = 1.0 - b1.powi(self.step as i32);
        let c2 = 1.0 - b2.powi(self.step as i32);
        tch::no_grad(|| {
            for ((_, p), (m, v)) in self
                .params
                .iter_mut()
                .zip(self.m.iter_mut().zip(self.v.iter_mut()))
            {
                let g = p.grad();
                if !g.defined() {
                    continue;
                }
                let _ = m.f_mul_scalar_(b1)?.f_add_(&g.f_mul_scalar(1.0 - b1)?)?;
                let _ = v
                    .f_mul_scalar_(b2)?
                    .f_add_(&g.f_mul(&g)?.f_mul_scalar(1.0 - b2)?)?;
                let update = m
                    .f_div_scalar(c1)?
                    .f_div(&v.f_div_scalar(c2)?.f_sqrt()?.f_add_scalar(self.eps)?)?
                    .f_mul_scalar(self.lr)?;
                let _ = p.f_sub_(&update)?;
            }
            Ok(())
        })
    }

    /// The parameters it updates, sorted by name (handles to the model's
    /// own tensors).
    pub fn params(&self) -> &[(String, Tensor)] {
        &self.params
    }

    /// The optimizer state as named tensors.
    pub fn state(&self) -> Vec<(String, Tensor)> {
        let mut out = vec![("adam.step".to_string(), Tensor::from(self.step))];
        for ((name, _), (m, v)) in self.params.iter().zip(self.m.iter().zip(&self.v)) {
            out.push((format!("adam.m.{name}"), m.shallow_clone()));
            out.push((format!("adam.v.{name}"), v.shallow_clone()));
        }
        out
    }

    /// Restores the state saved by [`Adam::state`].
    pub fn load_state(
        &mut self,
        named: &std::collections::HashMap<String, Tensor>,
    ) -> Result<(), String> {
        let step = named
            .get("adam.step")
            .ok_or("the checkpoint has no optimizer step")?;
        self.step = step.int64_value(&[]);
        for ((name, _), (m, v)) in self
            .params
            .iter()
            .zip(self.m.iter_mut().zip(self.v.iter_mut()))
        {
            let sm = named
                .get(&format!("adam.m.{name}"))
                .ok_or_else(|| format!("no optimizer state for {name}"))?;
            let sv = named
                .get(&format!("adam.v.{name}"))
                .ok_or_else(|| format!("no optimizer state for {name}"))?;
            if sm.size() != m.size() || sv.size() != v.size() {
                return Err(format!("optimizer state for {name} has the wrong shape"));
            }
            tch::no_grad(|| -> Result<(), TchError> {
                m.f_copy_(&sm.f_to_device(m.device())?)?;
                v.f_copy_(&sv.f_to_device(v.device())?)
            })
            .map_err(|e| format!("restoring the optimizer state for {name}: {e}"))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::graph;
    use offgnn_shared::address_table::BatchTable;
    use offgnn_shared::samples::Block;

    /// The CPU's dropout keeps each element with probability 1 - p, scales
    /// what it keeps by 1 / (1 - p), passes the gradient through the same
    /// mask, and is the identity outside training. (That one seed gives
    /// one mask, the resume tests show: other tests draw from the same
    /// global generator meanwhile.)
    #[test]
    fn cpu_dropout_keeps_one_minus_p_and_scales_it() {
        let x = Tensor::ones([200, 100], (Kind::Float, Device::Cpu)).set_requires_grad(true);
        tch::manual_seed(3);
        let y = dropout_of(&x, 0.3, true).unwrap();
        let kept = y
            .ne(0.0)
            .to_kind(Kind::Float)
            .mean(Kind::Float)
            .double_value(&[]);
        assert!((kept - 0.7).abs() < 0.01, "kept {kept}");
        let max = y.max().double_value(&[]);
        assert!((max - 1.0 / 0.7).abs() < 1e-6, "kept values {max}");
        y.sum(Kind::Float).backward();
        assert!(x.grad().equal(&y.detach()), "the gradient follows the mask");
        tch::manual_seed(3);
        assert!(
            dropout_of(&x, 0.3, true).unwrap().equal(&y),
            "same seed, same mask"
        );
        assert!(dropout_of(&x, 0.3, false).unwrap().equal(&x));
        assert!(dropout_of(&x, 0.0, true).unwrap().equal(&x));
    }

    /// GAT replaces a block's edges from a node to itself by the one
    /// self-loop every destination gets (PyG's remove_self_loops then
    /// add_self_loops): the same block with and without such an edge gives
    /// the same output, and a destination without in-edges attends to
    /// itself alone.
    #[test]
    fn gat_treats_existing_self_edges_as_pyg_does() {
        let cfg = ModelConfig {
            kind: ModelKind::Gat,
            in_dim: 4,
            hidden: 6,
            classes: 3,
            layers: 1,
            heads: 2,
            dropout: 0.0,
            scorer: None,
        };
        let vs = nn::VarStore::new(Device::Cpu);
        let net = build(&vs.root(), &cfg);
        let block = |src: Vec<u32>, dst: Vec<u32>| BatchTable {
            blocks: vec![Block {
                num_src: 5,
                num_dst: 3,
                src,
                dst,
                relations: Vec::new(),
            }],
            ..Default::default()
        };
        let x = Tensor::randn([5, 4], (Kind::Float, Device::Cpu));
        let run = |t: &BatchTable| {
            net.forward(&x, &graph(t, Device::Cpu).unwrap().blocks, false)
                .unwrap()
        };
        // Destination 1 has no in-edges; destination 2 has one from itself.
        let plain = run(&block(vec![1, 4, 4, 3], vec![0, 0, 2, 2]));
        let with_self = run(&block(vec![1, 4, 4, 2, 3], vec![0, 0, 2, 2, 2]));
        assert!(
            plain.allclose(&with_self, 1e-6, 1e-6, false),
            "{plain} vs {with_self}"
        );
        // Destination 1 alone: attention 1 on itself, so the output is
        // the mean over heads of lin(x_1), plus res(x_1) and the bias.
        let vars = vs.variables();
        let x1 = x.get(1).unsqueeze(0);
        let z = x1.matmul(&vars["convs.0.lin.weight"].tr()).view([2, 3]);
        let want = z.mean_dim([0i64].as_slice(), false, Kind::Float)
            + x1.matmul(&vars["convs.0.res.weight"].tr()).squeeze_dim(0)
            + &vars["convs.0.bias"];
        let got = plain.get(1);
        assert!(got.allclose(&want, 1e-5, 1e-6, false), "{got} vs {want}");
    }

    /// The sparse mean against a row-per-edge reference, forward and
    /// backward, with a destination that has no in-edges.
    #[test]
    fn mean_aggregate_matches_the_gather_and_add_reference() {
        let t = BatchTable {
            blocks: vec![Block {
                num_src: 5,
                num_dst: 3,
                // Destination 1 has no in-edges.
                src: vec![1, 4, 4, 0, 3],
                dst: vec![0, 0, 2, 2, 2],
                relations: Vec::new(),
            }],
            ..Default::default()
        };
        let blocks = graph(&t, Device::Cpu).unwrap().blocks;
        let b = &blocks[0];
        let h = Tensor::arange(5 * 4, (Kind::Float, Device::Cpu))
            .reshape([5, 4])
            .set_requires_grad(true);
        let got = mean_aggregate(&h, b).unwrap();
        let deg = b.counts.clamp_min(1).to_kind(Kind::Float).unsqueeze(1);
        let want = Tensor::zeros([3, 4], (Kind::Float, Device::Cpu)).index_add(
            0,
            &b.dst,
            &h.index_select(0, &b.src),
        ) / deg;
        assert!(got.allclose(&want, 1e-6, 1e-6, false), "{got} vs {want}");
        assert_eq!(got.get(1).abs().sum(Kind::Float).double_value(&[]), 0.0);
        // Each source's gradient is the sum of 1 / in-degree over its edges.
        got.sum(Kind::Float).backward();
        let grad: Vec<f32> = h
            .grad()
            .sum_dim_intlist(1, false, Kind::Float)
            .try_into()
            .unwrap();
        let per_row = [1.0 / 3.0, 0.5, 0.0, 1.0 / 3.0, 0.5 + 1.0 / 3.0];
        for (g, w) in grad.iter().zip(per_row) {
            assert!((g - 4.0 * w as f32).abs() < 1e-5, "{grad:?}");
        }
    }
}
