"""Parity of offgnn's R-SAGE and R-GAT with PyTorch Geometric's HeteroConv.

The trainer's test writes, into WORK, a model card (model.json, as a typed
export's), a typed batch (each type's input
rows, each block's edges per relation as positions among the types' rows,
each block's destination rows per type), offgnn's parameters and offgnn's
logits. This builds the model as MLPerf's GNN reference builds it (one
SAGEConv(root_weight=False) or GATConv(heads, add_self_loops=False) per
relation in a HeteroConv, leaky ReLU between layers, a Linear on the target
type), loads offgnn's parameters with strict=True, runs PyG's layers on the
same blocks, and compares logits (within 1e-4, absolute).

With --export DIR, it loads a typed export of the trainer (model.json and
its weights) into the model the card describes, with strict=True: the few
lines docs/export-and-inference.md shows.

Usage: python hetero_parity.py WORK | --export DIR
Prints one line of JSON; exits non-zero on a mismatch.
"""

import json
import sys

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch_geometric.nn import GATConv, HeteroConv, SAGEConv

TOLERANCE = 1e-4


def build(card):
    """The model a typed export's model.json describes (MLPerf's RGNN)."""
    widths = {t["name"]: t["in_channels"] for t in card["node_types"]}
    hidden, heads = card["hidden_channels"], card.get("heads")
    convs = torch.nn.ModuleList()
    for layer in range(card["num_layers"]):
        per_relation = {}
        for src, rel, dst in card["relations"]:
            w_src, w_dst = (widths[src], widths[dst]) if layer == 0 else (hidden, hidden)
            ins = w_src if w_src == w_dst else (w_src, w_dst)
            if card["architecture"] == "rsage":
                conv = SAGEConv(ins, hidden, root_weight=False)
            else:
                conv = GATConv(ins, hidden // heads, heads=heads, add_self_loops=False)
            per_relation[(src, rel, dst)] = conv
        convs.append(HeteroConv(per_relation, aggr="sum"))
    model = torch.nn.Module()
    model.convs = convs
    model.lin = torch.nn.Linear(hidden, card["out_channels"])
    return model


def forward(model, card, x, edges, num_dst):
    """The model on sampled blocks: layer l's relations' edges, then each
    type's first num_dst[l] rows (a block's destinations)."""
    relations = [tuple(r) for r in card["relations"]]
    for layer, conv in enumerate(model.convs):
        out = conv(x, {rel: edges[layer][r] for r, rel in enumerate(relations)})
        x = {t["name"]: out[t["name"]][: int(num_dst[layer][i])] for i, t in enumerate(card["node_types"])}
        if layer != len(model.convs) - 1:
            x = {t: F.leaky_relu(v) for t, v in x.items()}
    return model.lin(x[card["target"]])


def main(argv):
    if argv[0] == "--export":
        # An export of the trainer: its weights load into the model its
        # card describes, with strict=True.
        with open(f"{argv[1]}/model.json") as f:
            card = json.load(f)
        model = build(card)
        model.load_state_dict(load_file(f"{argv[1]}/{card['weights']}"), strict=True)
        print(json.dumps({"export": argv[1], "architecture": card["architecture"], "loaded": True}))
        return 0
    work = argv[0]
    with open(f"{work}/model.json") as f:
        card = json.load(f)
    model = build(card)
    model.load_state_dict(load_file(f"{work}/model.safetensors"), strict=True)
    model.eval()
    batch = load_file(f"{work}/batch.safetensors")
    layers = card["num_layers"]
    x = {t["name"]: batch[f"x.{t['name']}"] for t in card["node_types"]}
    edges = [[batch[f"edges.{l}.{r}"] for r in range(len(card["relations"]))] for l in range(layers)]
    num_dst = [batch[f"num_dst.{l}"] for l in range(layers)]
    with torch.no_grad():
        logits = forward(model, card, x, edges, num_dst)
    diff = (logits - batch["logits"]).abs().max().item()
    ok = logits.shape == batch["logits"].shape and diff <= TOLERANCE
    print(json.dumps({"architecture": card["architecture"], "max_abs_diff": diff, "rows": logits.shape[0], "ok": ok}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
