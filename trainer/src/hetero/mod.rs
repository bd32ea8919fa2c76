//! Relational GNNs on typed blocks: R-SAGE and R-GAT as MLPerf's GNN
//! reference builds them with PyTorch Geometric. Each layer is a
//! `HeteroConv` of one convolution per relation, summed over the relations
//! that reach a type: `SAGEConv(in, hidden, root_weight=False)` (mean of
//! the relation's in-neighbours, then `lin_l`; with `root_weight`, PyG's
//! default, plus `lin_r` of the destination's own row) or `GATConv((in_src,
//! in_dst), hidden / heads, heads=heads, add_self_loops=False)` (attention
//! over the relation's in-edges only, heads concatenated, then `bias`);
//! leaky ReLU (slope 0.01) and dropout between layers; a linear layer on
//! the target type's rows. A link-prediction model has no linear layer:
//! its last layer's rows of every type are the embeddings its scorer
//! ([`crate::link::Scorer`]) takes. Parameters are named as PyG names them
//! (`convs.{l}.convs.<src___rel___dst>.lin_l.weight`, `...lin_r.weight`,
//! `...lin.weight` or `lin_src` / `lin_dst` where the two types' widths
//! differ, `att_src`, `att_dst`, `bias`; `lin.weight`, `lin.bias`).

pub mod blocks;
pub mod checkpoint;
mod dump;
pub mod export;
mod fetch;
mod figures;
pub mod first_layer;
pub(crate) mod historical;
pub mod infer;
pub mod memory;
mod ranks;
pub mod score;
pub mod train;

use tch::nn;
use tch::{Kind, TchError, Tensor};

pub use blocks::{Schema, TypedBlocks};

use crate::error::{Error, Result};

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RelationalKind {
    Rsage,
    Rgat,
}

/// How R-SAGE's linear maps start.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LinearInit {
    /// PyG's (`torch.nn.Linear`'s): weights and bias uniform within
    /// `1 / sqrt(fan_in)`.
    #[default]
    Pyg,
    /// DGL's for its convolutions: weights Glorot-uniform, within
    /// `sqrt(6 / (fan_in + fan_out))`, bias zero. Larger where the rows are
    /// wide (2.4x at 1,256 inputs and 64 outputs).
    Glorot,
}

#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RgnnConfig {
    pub kind: RelationalKind,
    /// Each node type's feature width, in the schema's order.
    pub in_dims: Vec<Option<i64>>,
    pub hidden: i64,
    pub classes: i64,
    pub layers: usize,
    pub heads: i64,
    pub dropout: f64,
    /// R-SAGE: each convolution adds `lin_r` (no bias) of the destination's
    /// own row, as PyG's `SAGEConv` does by default and DGL's always; MLPerf's
    /// reference builds it without (`root_weight=False`), where a type
    /// reaches its own rows only through its neighbours.
    #[serde(default)]
    pub root_weight: bool,
    /// How R-SAGE's `lin_l` and `lin_r` start (training only: an export
    /// or checkpoint holds the weights).
    #[serde(default, skip_serializing_if = "is_pyg")]
    pub init: LinearInit,
    /// Link prediction: the scorer over the last layer's rows (`classes`
    /// is then 0: no linear layer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scorer: Option<crate::link::ScorerKind>,
}

/// One relation's convolution in one layer.
enum Conv {
    Sage {
        lin_l: nn::Linear,
        /// With a root weight: the destination's own row's map.
        lin_r: Option<nn::Linear>,
    },
    Gat {
        lin_src: nn::Linear,
        /// `None`: the types' widths agree, and PyG's one `lin` serves both.
        lin_dst: Option<nn::Linear>,
        att_src: Tensor,
        att_dst: Tensor,
        bias: Tensor,
        heads: i64,
        per_head: i64,
    },
}

/// R-SAGE or R-GAT over a schema's relations.
pub struct Rgnn {
    convs: Vec<Vec<Conv>>,
    /// The classifier on the target type (none in a link model).
    lin: Option<nn::Linear>,
    scorer: Option<crate::link::Scorer>,
    /// Each relation's source and destination type.
    relations: Vec<(usize, usize)>,
    types: usize,
    target: usize,
    dropout: f64,
}

impl Rgnn {
    /// The model of `cfg` over `schema`'s relations, its parameters under
    /// `vs`. Every type needs features (the first layer reads every
    /// relation's source rows), and every type must be some relation's
    /// destination (the next layer reads its rows).
    pub fn new(vs: &nn::Path, schema: &Schema, cfg: &RgnnConfig) -> Result<Rgnn> {
        check(schema, cfg)?;
        let mut convs = Vec::with_capacity(cfg.layers);
        for l in 0..cfg.layers {
            let layer = &(vs / "convs") / l / "convs";
            let width = |t: usize| {
                if l == 0 {
                    cfg.in_dims[t].expect("checked: every type has features")
                } else {
                    cfg.hidden
                }
            };
            let convs_l = (0..schema.relations.len())
                .map(|r| {
                    let (s, _, d) = &schema.relations[r];
                    let p = &layer / schema.conv_name(r);
                    match cfg.kind {
                        // PyG's `SAGEConv` initializes `lin_l` as
                        // `torch.nn.Linear` does.
                        RelationalKind::Rsage => Conv::Sage {
                            lin_l: nn::linear(
                                &p / "lin_l",
                                width(*s),
                                cfg.hidden,
                                linear_init(cfg, width(*s)),
                            ),
                            lin_r: cfg.root_weight.then(|| {
                                nn::linear(
                                    &p / "lin_r",
                                    width(*d),
                                    cfg.hidden,
                                    nn::LinearConfig {
                                        bias: false,
                                        ..linear_init(cfg, width(*d))
                                    },
                                )
                            }),
                        },
                        RelationalKind::Rgat => gat_conv(&p, (width(*s), width(*d)), cfg),
                    }
                })
                .collect();
            convs.push(convs_l);
        }
        Ok(Rgnn {
            convs,
            lin: cfg.scorer.is_none().then(|| {
                let init = crate::model::torch_linear_init(cfg.hidden);
                nn::linear(vs / "lin", cfg.hidden, cfg.classes, init)
            }),
            scorer: cfg
                .scorer
                .map(|kind| crate::link::Scorer::new(vs, kind, cfg.hidden)),
            relations: schema.relations.iter().map(|&(s, _, d)| (s, d)).collect(),
            types: schema.types.len(),
            target: schema.target,
            dropout: cfg.dropout,
        })
    }

    /// The target type's logits for the batch's seeds: `x` is the batch's
    /// input, `blocks` the batch.
    pub fn forward(
        &self,
        x: Inputs<'_>,
        blocks: &TypedBlocks,
        train: bool,
    ) -> Result<Tensor, TchError> {
        let h = self.layers(x, blocks, train, &mut |_, h| Ok(h))?;
        self.classify(&h[self.target])
    }

    /// A link model's embeddings of the batch's seeds: the last layer's
    /// rows of every type, one type after another in the schema's order
    /// (the rows [`TypedBlocks::seed_rows`] name).
    pub fn embed(
        &self,
        x: Inputs<'_>,
        blocks: &TypedBlocks,
        train: bool,
    ) -> Result<Tensor, TchError> {
        Tensor::f_cat(&self.layers(x, blocks, train, &mut |_, h| Ok(h))?, 0)
    }

    /// The model's output, [`Rgnn::forward`]'s for a node model and
    /// [`Rgnn::embed`]'s for a link model, with `level` called on each
    /// level's rows of every type (levels `1..layers`; after the
    /// activation, before dropout), which it may replace (the historical
    /// cache lays its rows in).
    pub fn output_levels(
        &self,
        x: Inputs<'_>,
        blocks: &TypedBlocks,
        train: bool,
        level: &mut TypedLevelHook<'_>,
    ) -> Result<Tensor, TchError> {
        let h = self.layers(x, blocks, train, level)?;
        match self.scorer {
            Some(_) => Tensor::f_cat(&h, 0),
            None => self.classify(&h[self.target]),
        }
    }

    /// The scorer of a link model.
    pub fn scorer(&self) -> Option<&crate::link::Scorer> {
        self.scorer.as_ref()
    }

    /// Every type's rows after the last layer.
    fn layers(
        &self,
        x: Inputs<'_>,
        blocks: &TypedBlocks,
        train: bool,
        level: &mut TypedLevelHook<'_>,
    ) -> Result<Vec<Tensor>, TchError> {
        let mut h: Vec<Tensor> = match x {
            Inputs::Rows(x) => x.iter().map(Tensor::shallow_clone).collect(),
            Inputs::FirstMeans(_) => Vec::new(),
        };
        let last = blocks.layers.len().saturating_sub(1);
        for (l, layer) in blocks.layers.iter().enumerate() {
            let mut out: Vec<Option<Tensor>> = (0..self.types).map(|_| None).collect();
            for (r, conv) in self.convs[l].iter().enumerate() {
                let (s, d) = self.relations[r];
                let y = match x {
                    Inputs::FirstMeans(means) if l == 0 => conv.of_mean(&means[r])?,
                    _ => {
                        let nd = layer.num_dst[d];
                        conv.forward(&h[s], &h[d].f_narrow(0, 0, nd)?, &layer.relations[r])?
                    }
                };
                out[d] = Some(match out[d].take() {
                    Some(o) => o.f_add(&y)?,
                    None => y,
                });
            }
            let out = out
                .into_iter()
                .map(|o| o.expect("checked: every type is some relation's destination"));
            if l == last {
                h = out.collect();
                break;
            }
            let active = out
                .map(|o| o.f_leaky_relu())
                .collect::<Result<Vec<_>, TchError>>()?;
            h = level(l + 1, active)?
                .iter()
                .map(|o| crate::model::dropout_of(o, self.dropout, train))
                .collect::<Result<_, TchError>>()?;
        }
        Ok(h)
    }

    /// Layers of convolutions.
    pub fn num_layers(&self) -> usize {
        self.convs.len()
    }

    /// Each relation's source and destination type.
    pub fn relations(&self) -> &[(usize, usize)] {
        &self.relations
    }

    /// Whether a convolution reads its destinations' own rows (R-GAT's
    /// attention and R-SAGE's root weight do).
    pub fn reads_destinations(&self) -> bool {
        matches!(
            self.convs.first().and_then(|c| c.first()),
            Some(Conv::Gat { .. } | Conv::Sage { lin_r: Some(_), .. })
        )
    }

    /// Relation `r`'s messages at layer `l` into the destination rows
    /// `x_dst` from `x_src`, along `e`: what [`Rgnn::forward`] sums over
    /// the relations that reach a type.
    pub fn messages(
        &self,
        (l, r): (usize, usize),
        x_src: &Tensor,
        x_dst: &Tensor,
        e: &blocks::RelationEdges,
    ) -> Result<Tensor, TchError> {
        self.convs[l][r].forward(x_src, x_dst, e)
    }

    /// An accumulator of relation `r`'s messages at layer `l` into `n`
    /// destinations, fed source rows a chunk at a time
    /// ([`Aggregator::add`]), on the model's device; R-GAT and a root
    /// weight need the destinations' own rows `x_dst` there.
    pub fn aggregator(
        &self,
        (l, r): (usize, usize),
        x_dst: Option<&Tensor>,
        n: i64,
    ) -> Result<Aggregator<'_>, TchError> {
        let device = match &self.convs[l][r] {
            Conv::Sage { lin_l, .. } => lin_l.ws.device(),
            Conv::Gat { lin_src, .. } => lin_src.ws.device(),
        };
        let opts = (Kind::Float, device);
        Ok(match &self.convs[l][r] {
            Conv::Sage { lin_l, lin_r } => Aggregator::Sage {
                lin_l,
                sum: Tensor::f_zeros([n, lin_l.ws.size()[0]], opts)?,
                count: Tensor::f_zeros([n], opts)?,
                root: match lin_r {
                    Some(lin_r) => {
                        let x_dst = x_dst.expect("a root weight reads its destinations' rows");
                        Some(x_dst.f_linear::<Tensor>(&lin_r.ws, None)?)
                    }
                    None => None,
                },
            },
            Conv::Gat {
                lin_src,
                lin_dst,
                att_src,
                att_dst,
                bias,
                heads,
                per_head,
            } => {
                let x_dst = x_dst.expect("R-GAT reads its destinations' rows");
                let zd = x_dst
                    .f_linear::<Tensor>(&lin_dst.as_ref().unwrap_or(lin_src).ws, None)?
                    .f_view([-1, *heads, *per_head])?;
                Aggregator::Gat {
                    lin_src,
                    att_src,
                    bias,
                    a_dst: zd.f_mul(att_dst)?.f_sum_dim_intlist(
                        [-1i64].as_slice(),
                        false,
                        Kind::Float,
                    )?,
                    max: Tensor::f_full([n, *heads], f64::NEG_INFINITY, opts)?,
                    denom: Tensor::f_zeros([n, *heads], opts)?,
                    num: Tensor::f_zeros([n, *heads, *per_head], opts)?,
                }
            }
        })
    }

    /// What comes between two layers, in evaluation (dropout off), in
    /// `h`'s own memory.
    pub fn between_layers(h: &mut Tensor) -> Result<(), TchError> {
        h.f_leaky_relu_().map(|_| ())
    }

    /// The target type's logits of its last layer's rows `h`.
    pub fn classify(&self, h: &Tensor) -> Result<Tensor, TchError> {
        let lin = self
            .lin
            .as_ref()
            .ok_or_else(|| TchError::Kind("a link-prediction model has no classifier".into()))?;
        h.f_linear(&lin.ws, lin.bs.as_ref())
    }
}

/// A level's rows of every type between two layers, after the activation
/// and before dropout: `(level, each type's rows)` in, the rows the next
/// layer reads out ([`Rgnn::output_levels`]).
pub type TypedLevelHook<'a> = dyn FnMut(usize, Vec<Tensor>) -> Result<Vec<Tensor>, TchError> + 'a;

/// A batch's input to a model.
#[derive(Clone, Copy)]
pub enum Inputs<'a> {
    /// Each type's input rows, in the schema's order.
    Rows(&'a [Tensor]),
    /// R-SAGE's first layer aggregated already: each relation's mean over
    /// its destinations' in-neighbours ([`first_layer::neighbour_means`]),
    /// the rows themselves never assembled.
    FirstMeans(&'a [Tensor]),
}

/// One relation's messages into a group of destinations, summed as source
/// rows stream by: what [`Conv::forward`] computes on a block holding every
/// in-edge, without holding every source row at once. R-SAGE keeps each
/// destination's sum of projected rows and its count (the mean's linear map
/// commutes with the mean); R-GAT an online softmax per head (a running
/// maximum, the exponentials' sum and the weighted messages, rescaled as
/// the maximum grows), which equals PyG's shifted softmax.
pub enum Aggregator<'m> {
    Sage {
        lin_l: &'m nn::Linear,
        sum: Tensor,
        count: Tensor,
        /// The root weight's map of the destinations' own rows.
        root: Option<Tensor>,
    },
    Gat {
        lin_src: &'m nn::Linear,
        att_src: &'m Tensor,
        bias: &'m Tensor,
        a_dst: Tensor,
        max: Tensor,
        denom: Tensor,
        num: Tensor,
    },
}

/// A chunk of source rows projected by a relation's convolution: its
/// messages' values (R-GAT's per head) and R-GAT's source scores.
pub struct Projected {
    z: Tensor,
    a_src: Option<Tensor>,
}

impl Aggregator<'_> {
    /// Projects a chunk `x` of the source type's rows, once for all the
    /// edges from it.
    pub fn project(&self, x: &Tensor) -> Result<Projected, TchError> {
        match self {
            Aggregator::Sage { lin_l, .. } => Ok(Projected {
                z: x.f_linear::<Tensor>(&lin_l.ws, None)?,
                a_src: None,
            }),
            Aggregator::Gat {
                lin_src,
                att_src,
                num,
                ..
            } => {
                let (h, c) = (num.size()[1], num.size()[2]);
                let z = x
                    .f_linear::<Tensor>(&lin_src.ws, None)?
                    .f_view([-1, h, c])?;
                let a_src =
                    z.f_mul(att_src)?
                        .f_sum_dim_intlist([-1i64].as_slice(), false, Kind::Float)?;
                Ok(Projected {
                    z,
                    a_src: Some(a_src),
                })
            }
        }
    }

    /// Adds the messages of edges `src[i] -> dst[i]`: `src` positions among
    /// the rows of the projected chunk `p`, `dst` among the group's.
    pub fn add(&mut self, p: &Projected, src: &Tensor, dst: &Tensor) -> Result<(), TchError> {
        match self {
            Aggregator::Sage { sum, count, .. } => {
                let _ = sum.f_index_add_(0, dst, &p.z.f_index_select(0, src)?)?;
                let ones = Tensor::f_ones([dst.size()[0]], (Kind::Float, dst.device()))?;
                let _ = count.f_index_add_(0, dst, &ones)?;
            }
            Aggregator::Gat {
                a_dst,
                max,
                denom,
                num,
                ..
            } => {
                let a_src = p.a_src.as_ref().expect("R-GAT's projection scores");
                let score = a_src
                    .f_index_select(0, src)?
                    .f_add(&a_dst.f_index_select(0, dst)?)?;
                let score =
                    score.f_maximum(&score.f_mul_scalar(crate::model::GAT_NEGATIVE_SLOPE)?)?;
                // scatter_reduce (index_reduce is torch's beta API, which
                // warns on every run); the destinations repeated across
                // the heads.
                let at = dst.f_unsqueeze(1)?.f_expand_as(&score)?.f_contiguous()?;
                let grown = max.f_internal_scatter_reduce(0, &at, &score, "amax", true)?;
                // exp(-inf - -inf) is NaN where a destination has no edge
                // yet: its sums are 0, and stay so.
                let scale = max.f_sub(&grown)?.f_exp()?.f_nan_to_num(0.0, None, None)?;
                let _ = denom.f_mul_(&scale)?;
                let _ = num.f_mul_(&scale.f_unsqueeze(-1)?)?;
                *max = grown;
                let w = score.f_sub(&max.f_index_select(0, dst)?)?.f_exp()?;
                let _ = denom.f_index_add_(0, dst, &w)?;
                let msg = p.z.f_index_select(0, src)?.f_mul(&w.f_unsqueeze(-1)?)?;
                let _ = num.f_index_add_(0, dst, &msg)?;
            }
        }
        Ok(())
    }

    /// The relation's messages into each destination, computed in the
    /// accumulators' own memory.
    pub fn finish(self) -> Result<Tensor, TchError> {
        match self {
            Aggregator::Sage {
                lin_l,
                mut sum,
                count,
                root,
            } => {
                let _ = sum.f_div_(&count.f_clamp_min(1.0)?.f_unsqueeze(1)?)?;
                if let Some(b) = &lin_l.bs {
                    let _ = sum.f_add_(b)?;
                }
                if let Some(root) = &root {
                    let _ = sum.f_add_(root)?;
                }
                Ok(sum)
            }
            Aggregator::Gat {
                bias,
                denom,
                mut num,
                ..
            } => {
                let _ = num.f_div_(&denom.f_add_scalar(1e-16)?.f_unsqueeze(-1)?)?;
                let mut out = num.f_flatten(1, 2)?;
                let _ = out.f_add_(bias)?;
                Ok(out)
            }
        }
    }
}

fn is_pyg(init: &LinearInit) -> bool {
    *init == LinearInit::Pyg
}

/// R-SAGE's linear map from `fan_in` to `cfg.hidden`, as `cfg.init` starts it.
fn linear_init(cfg: &RgnnConfig, fan_in: i64) -> nn::LinearConfig {
    match cfg.init {
        LinearInit::Pyg => crate::model::torch_linear_init(fan_in),
        LinearInit::Glorot => {
            let bound = (6.0 / (fan_in + cfg.hidden) as f64).sqrt();
            nn::LinearConfig {
                ws_init: nn::Init::Uniform {
                    lo: -bound,
                    up: bound,
                },
                bs_init: Some(nn::Init::Const(0.0)),
                bias: true,
            }
        }
    }
}

/// `GATConv((in_src, in_dst), hidden / heads, heads, add_self_loops=False)`.
fn gat_conv(p: &nn::Path, (in_src, in_dst): (i64, i64), cfg: &RgnnConfig) -> Conv {
    let per_head = cfg.hidden / cfg.heads;
    // Glorot-uniform weights, as PyG's GATConv initializes its linear maps.
    let lin = |name: &str, d_in: i64| {
        let bound = (6.0 / (d_in + cfg.hidden) as f64).sqrt();
        nn::linear(
            p / name,
            d_in,
            cfg.hidden,
            nn::LinearConfig {
                ws_init: nn::Init::Uniform {
                    lo: -bound,
                    up: bound,
                },
                bias: false,
                ..Default::default()
            },
        )
    };
    let (lin_src, lin_dst) = if in_src == in_dst {
        (lin("lin", in_src), None)
    } else {
        (lin("lin_src", in_src), Some(lin("lin_dst", in_dst)))
    };
    let bound = (6.0 / (cfg.heads + per_head) as f64).sqrt();
    let glorot = |name: &str| {
        p.var(
            name,
            &[1, cfg.heads, per_head],
            nn::Init::Uniform {
                lo: -bound,
                up: bound,
            },
        )
    };
    Conv::Gat {
        lin_src,
        lin_dst,
        att_src: glorot("att_src"),
        att_dst: glorot("att_dst"),
        bias: p.zeros("bias", &[cfg.hidden]),
        heads: cfg.heads,
        per_head,
    }
}

impl Conv {
    /// R-SAGE's messages from each destination's mean over its
    /// in-neighbours' rows, taken already ([`first_layer`]).
    fn of_mean(&self, mean: &Tensor) -> Result<Tensor, TchError> {
        match self {
            Conv::Sage { lin_l, lin_r: None } => mean.f_linear(&lin_l.ws, lin_l.bs.as_ref()),
            Conv::Sage { lin_r: Some(_), .. } => Err(TchError::Kind(
                "a root weight reads the destinations' rows, not only their means".into(),
            )),
            Conv::Gat { .. } => Err(TchError::Kind(
                "R-GAT's attention reads its rows, not their means".into(),
            )),
        }
    }

    /// The relation's messages into its destination rows `x_dst` (a
    /// prefix of the destination type's rows) from `x_src`.
    fn forward(
        &self,
        x_src: &Tensor,
        x_dst: &Tensor,
        e: &blocks::RelationEdges,
    ) -> Result<Tensor, TchError> {
        let nd = x_dst.size()[0];
        match self {
            Conv::Sage { lin_l, lin_r } => {
                // The mean of each destination row's in-neighbours (0
                // without any) as an embedding bag per row: it never holds
                // an `[edges, width]` matrix.
                const MEAN: i64 = 1;
                let (mean, _, _, _) = Tensor::f_embedding_bag::<Tensor>(
                    x_src, &e.src, &e.offsets, false, MEAN, false, None, true,
                )?;
                let y = mean.f_linear(&lin_l.ws, lin_l.bs.as_ref())?;
                match lin_r {
                    Some(lin_r) => y.f_add(&x_dst.f_linear::<Tensor>(&lin_r.ws, None)?),
                    None => Ok(y),
                }
            }
            Conv::Gat {
                lin_src,
                lin_dst,
                att_src,
                att_dst,
                bias,
                heads,
                per_head,
            } => {
                let (h, c) = (*heads, *per_head);
                let zs = x_src
                    .f_linear::<Tensor>(&lin_src.ws, None)?
                    .f_view([-1, h, c])?;
                let zd = x_dst
                    .f_linear::<Tensor>(&lin_dst.as_ref().unwrap_or(lin_src).ws, None)?
                    .f_view([-1, h, c])?;
                let sum_last =
                    |t: Tensor| t.f_sum_dim_intlist([-1i64].as_slice(), false, Kind::Float);
                let a_src = sum_last(zs.f_mul(att_src)?)?;
                let a_dst = sum_last(zd.f_mul(att_dst)?)?;
                let score = a_src
                    .f_index_select(0, &e.src)?
                    .f_add(&a_dst.f_index_select(0, &e.dst)?)?;
                let score =
                    score.f_maximum(&score.f_mul_scalar(crate::model::GAT_NEGATIVE_SLOPE)?)?;
                // PyG's softmax: shifted by each destination's maximum,
                // divided by the sum plus 1e-16.
                let max = tch::no_grad(|| {
                    Tensor::f_segment_reduce(
                        &score,
                        "max",
                        Some(&e.counts),
                        None,
                        None,
                        0,
                        // unsafe: the lengths are counted from the edges,
                        // which `TypedBlocks` checked are sorted by
                        // destination (checking syncs a CUDA device).
                        true,
                        f64::NEG_INFINITY,
                    )
                })?;
                let w = score.f_sub(&max.f_index_select(0, &e.dst)?)?.f_exp()?;
                let denom = Tensor::f_zeros([nd, h], (w.kind(), w.device()))?
                    .f_index_add(0, &e.dst, &w)?
                    .f_add_scalar(1e-16)?;
                let alpha = w.f_div(&denom.f_index_select(0, &e.dst)?)?;
                let msg = zs
                    .f_index_select(0, &e.src)?
                    .f_mul(&alpha.f_unsqueeze(-1)?)?;
                Tensor::f_zeros([nd, h, c], (msg.kind(), msg.device()))?
                    .f_index_add(0, &e.dst, &msg)?
                    .f_flatten(1, 2)?
                    .f_add(bias)
            }
        }
    }
}

/// What a model over `schema` needs of `cfg`, in one line each.
fn check(schema: &Schema, cfg: &RgnnConfig) -> Result<()> {
    let bad = |m: String| Err(Error::InvalidArgument(m));
    if cfg.in_dims.len() != schema.types.len() {
        return bad(format!(
            "{} feature widths for {} node types",
            cfg.in_dims.len(),
            schema.types.len()
        ));
    }
    if let Some(t) = cfg.in_dims.iter().position(Option::is_none) {
        return bad(format!(
            "node type '{}' has no features, and R-SAGE and R-GAT read every type's rows: give it a feature file (sampler derive-features)",
            schema.types[t].0
        ));
    }
    if let Some(t) = (0..schema.types.len()).find(|&t| !schema.relations.iter().any(|r| r.2 == t)) {
        return bad(format!(
            "node type '{}' is no relation's destination, so no layer computes its rows: add reverse relations (--add-reverse)",
            schema.types[t].0
        ));
    }
    if cfg.layers == 0 || cfg.hidden <= 0 || (cfg.classes <= 0) == cfg.scorer.is_none() {
        return bad(
            "layers and hidden must be positive, and classes too unless the model scores links (then 0)"
                .into(),
        );
    }
    if cfg.kind == RelationalKind::Rgat && cfg.init != LinearInit::Pyg {
        return bad(
            "--init is R-SAGE's; R-GAT's linear maps start Glorot-uniform, as PyG's GATConv's"
                .into(),
        );
    }
    if cfg.kind == RelationalKind::Rgat && cfg.root_weight {
        return bad(
            "--root-weight is R-SAGE's (SAGEConv's lin_r); R-GAT's attention has none".into(),
        );
    }
    if cfg.kind == RelationalKind::Rgat && (cfg.heads <= 0 || cfg.hidden % cfg.heads != 0) {
        return bad(format!(
            "R-GAT gives each of {} heads hidden / heads channels: --hidden {} must be a multiple of --heads",
            cfg.heads, cfg.hidden
        ));
    }
    if let Some(r) = (0..schema.relations.len()).find(|&r| schema.conv_name(r).contains('.')) {
        return bad(format!(
            "relation '{}' has a '.' in its name, which parameter names cannot hold",
            schema.relations[r].1
        ));
    }
    Ok(())
}
