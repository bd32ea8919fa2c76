//! The exported model as layers of plain tensors on the run's device, and
//! what each layer costs in floats per destination and per source row.

use tch::{Device, Tensor};

use crate::error::Result;
use crate::export::{self, ModelCard};
use crate::model::ModelKind;

/// The model as layers of plain tensors (on the device).
pub(super) enum Layer {
    Sage {
        lin_l_w: Tensor,
        lin_l_b: Tensor,
        lin_r_w: Tensor,
    },
    Gat {
        lin_w: Tensor,
        att_src: Tensor,
        att_dst: Tensor,
        res_w: Tensor,
        bias: Tensor,
        heads: i64,
        per_head: i64,
        concat: bool,
    },
}

pub(super) struct Model {
    pub(super) card: ModelCard,
    /// Graph layers (empty for the MLP).
    pub(super) layers: Vec<Layer>,
    /// The MLP's linear layers (weight, bias).
    pub(super) mlp: Vec<(Tensor, Tensor)>,
    /// Layer widths: input, hidden..., classes.
    pub(super) widths: Vec<i64>,
}

impl Model {
    pub(super) fn load(location: &str, device: Device) -> Result<Model> {
        let (card, vs) = export::read(location, device)?;
        let vars = vs.variables();
        let var = |name: String| -> Tensor {
            vars.get(&name)
                .expect("export::read checked every parameter")
                .detach()
        };
        let l = card.num_layers;
        let widths: Vec<i64> = std::iter::once(card.in_channels)
            .chain(std::iter::repeat_n(card.hidden_channels, l - 1))
            .chain(std::iter::once(card.out_channels))
            .collect();
        let mut layers = Vec::new();
        let mut mlp = Vec::new();
        for i in 0..l {
            match card.architecture {
                ModelKind::Sage => layers.push(Layer::Sage {
                    lin_l_w: var(format!("convs.{i}.lin_l.weight")),
                    lin_l_b: var(format!("convs.{i}.lin_l.bias")),
                    lin_r_w: var(format!("convs.{i}.lin_r.weight")),
                }),
                ModelKind::Gat => {
                    let heads = card.heads.unwrap_or(1);
                    let att_src = var(format!("convs.{i}.att_src"));
                    let per_head = att_src.size()[2];
                    layers.push(Layer::Gat {
                        lin_w: var(format!("convs.{i}.lin.weight")),
                        att_dst: var(format!("convs.{i}.att_dst")),
                        att_src,
                        res_w: var(format!("convs.{i}.res.weight")),
                        bias: var(format!("convs.{i}.bias")),
                        heads,
                        per_head,
                        concat: i + 1 < l,
                    })
                }
                ModelKind::Mlp => mlp.push((
                    var(format!("lins.{i}.weight")),
                    var(format!("lins.{i}.bias")),
                )),
            }
        }
        Ok(Model {
            card,
            layers,
            mlp,
            widths,
        })
    }

    /// Floats a destination takes in layer `l` (accumulators, the
    /// projections of its own row, the output, host and device copies), and
    /// the floats a source row of a chunk turns into before it is
    /// scattered.
    pub(super) fn layer_floats(&self, l: usize) -> (u64, u64) {
        let (d_in, d_out) = (self.widths[l] as u64, self.widths[l + 1] as u64);
        match &self.layers[l] {
            Layer::Sage { .. } => {
                // Sums at the narrower width (twice: host and device), a
                // count, three output copies, and where the layer widens
                // the projection of its own row (narrowing, that goes into
                // the sums).
                let acc = d_in.min(d_out);
                let (own, per_src) = if d_out <= d_in {
                    (0, 2 * d_out)
                } else {
                    (d_out, 0)
                };
                (2 * acc + own + 1 + 3 * d_out, per_src)
            }
            Layer::Gat {
                heads,
                per_head,
                concat,
                ..
            } => {
                let (h, c) = (*heads as u64, *per_head as u64);
                let total = if *concat { h * c } else { c };
                // acc [H, C], max, sum, er and the output rows (which
                // hold res until the softmax is finished into them), all
                // host buffers the group finishes in place, and a second
                // output width for the buffer pool's slack (a buffer an
                // earlier layer sized); the projections (z, el) of the
                // span's rows, kept for the edges that wait on a later
                // destination. A chunk's rows are projected (tensor and
                // copy).
                (2 * h * c + 4 * h + 2 * total, 3 * (h * c + h))
            }
        }
    }
}

/// The activation between layers.
pub(super) fn act(kind: ModelKind, mut t: Tensor) -> Tensor {
    let _ = match kind {
        ModelKind::Gat => t.elu_(),
        ModelKind::Sage | ModelKind::Mlp => t.relu_(),
    };
    t
}

/// Graph layers the run computes: the model's layers, or one pass for the MLP.
pub(super) fn graph_layers_of(model: &Model) -> usize {
    if model.mlp.is_empty() {
        model.card.num_layers
    } else {
        1
    }
}
