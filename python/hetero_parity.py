"""Parity of offgnn's R-SAGE and R-GAT with PyTorch Geometric's HeteroConv.

The trainer's test writes, into WORK, a typed batch (each type's input
rows, each block's edges per relation as positions among the types' rows,
each block's destination rows per type), offgnn's parameters and offgnn's
logits. This builds the model as MLPerf's GNN reference builds it (one
SAGEConv(root_weight=False) or GATConv(heads, add_self_loops=False) per
relation in a HeteroConv, leaky ReLU between layers, a Linear on the target
type), loads offgnn's parameters with strict=True, runs PyG's layers on the
same blocks, and compares logits (within 1e-4, absolute).

Usage: python hetero_parity.py WORK
Prints one line of JSON; exits non-zero on a mismatch.
"""

import json
import sys

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch_geometric.nn import GATConv, HeteroConv, SAGEConv

TOLERANCE = 1e-4


def build(meta):
    types, dims = meta["types"], meta["in_dims"]
    hidden, heads = meta["hidden"], meta["heads"]
    relations = [tuple(r) for r in meta["relations"]]
    convs = torch.nn.ModuleList()
    for layer in range(meta["layers"]):
        width = {t: (dims[i] if layer == 0 else hidden) for i, t in enumerate(types)}
        per_relation = {}
        for src, rel, dst in relations:
            ins = width[src] if width[src] == width[dst] else (width[src], width[dst])
            if meta["kind"] == "rsage":
                per_relation[(src, rel, dst)] = SAGEConv(ins, hidden, root_weight=False)
            else:
                per_relation[(src, rel, dst)] = GATConv(
                    ins, hidden // heads, heads=heads, add_self_loops=False
                )
        convs.append(HeteroConv(per_relation))
    model = torch.nn.Module()
    model.convs = convs
    model.lin = torch.nn.Linear(hidden, meta["classes"])
    return model, relations


def main(work):
    with open(f"{work}/meta.json") as f:
        meta = json.load(f)
    model, relations = build(meta)
    model.load_state_dict(load_file(f"{work}/model.safetensors"), strict=True)
    model.eval()
    batch = load_file(f"{work}/batch.safetensors")
    types = meta["types"]
    x = {t: batch[f"x.{t}"] for t in types}
    last = meta["layers"] - 1
    with torch.no_grad():
        for layer, conv in enumerate(model.convs):
            edges = {rel: batch[f"edges.{layer}.{r}"] for r, rel in enumerate(relations)}
            out = conv(x, edges)
            num_dst = batch[f"num_dst.{layer}"]
            x = {t: out[t][: int(num_dst[i])] for i, t in enumerate(types)}
            if layer != last:
                x = {t: F.leaky_relu(v) for t, v in x.items()}
        logits = model.lin(x[meta["target"]])
    diff = (logits - batch["logits"]).abs().max().item()
    ok = logits.shape == batch["logits"].shape and diff <= TOLERANCE
    print(json.dumps({"kind": meta["kind"], "max_abs_diff": diff, "rows": logits.shape[0], "ok": ok}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
