"""DGL 2.1's R-SAGE and R-GAT on an offgnn typed dataset, for
scripts/bench-typed-accuracy: the heterograph from the dataset's relations
(repeated edges kept once, as offgnn's sampler keeps them), each type's
features, the target type's splits and their labels; a `HeteroGraphConv` of one
`GraphConv(norm="right")` (PyG's `SAGEConv(root_weight=False)`), with
`--model sage-root` `SAGEConv(mean)` (PyG's `SAGEConv` with its root
weight), or `GATConv(hidden / heads, heads)` per relation, summed
per type, leaky ReLU and dropout between layers, a linear layer on the
target type; trained with Adam over `NeighborSampler` blocks. Prints one
JSON line: the test accuracy at the best validation epoch, and each epoch's.
"""
import argparse
import json
import os
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

ap = argparse.ArgumentParser()
ap.add_argument("--dataset", required=True)
ap.add_argument("--model", choices=["sage", "sage-root", "gat"], required=True)
ap.add_argument("--fanout", default="10,5")
ap.add_argument("--batch-size", type=int, default=512)
ap.add_argument("--epochs", type=int, default=8)
ap.add_argument("--hidden", type=int, default=64)
ap.add_argument("--heads", type=int, default=4)
ap.add_argument("--dropout", type=float, default=0.2)
ap.add_argument("--lr", type=float, default=0.003)
ap.add_argument("--seed", type=int, default=0)
ap.add_argument("--threads", type=int, default=2)
args = ap.parse_args()

torch.set_num_threads(args.threads)
torch.manual_seed(args.seed)
import dgl  # noqa: E402  (after the thread settings)
import dgl.nn as dglnn  # noqa: E402
import dgl_typed_data  # noqa: E402  (beside this script)

root = args.dataset
meta, g, feats = dgl_typed_data.load(root)
task = meta["tasks"][0]
target = task["train_set"][0]["type"]


def split_set(name):
    part = task[name][0]["data"]
    load = lambda what: torch.from_numpy(  # noqa: E731
        np.load(os.path.join(root, next(p["path"] for p in part if p["name"] == what))).astype(np.int64))
    return load("seeds"), load("labels")


# The splits carry their labels (a graph may label only some of its target
# nodes); every other node's label is -1 and never read.
splits, labels = {}, torch.full((g.num_nodes(target),), -1, dtype=torch.int64)
for name in ("train", "valid", "test"):
    seeds, y = split_set(f"{name}_set" if name != "valid" else "validation_set")
    splits[name] = seeds
    labels[seeds] = y


class RGNN(nn.Module):
    def __init__(self, etypes, in_dims, hidden, classes, layers, model, heads, dropout):
        super().__init__()
        self.convs = nn.ModuleList()
        for layer in range(layers):
            convs = {}
            for s, r, d in etypes:
                ins = (in_dims[s], in_dims[d]) if layer == 0 else (hidden, hidden)
                if model == "sage":
                    # The mean of the relation's in-neighbours through one
                    # linear map: PyG's SAGEConv(root_weight=False), as
                    # offgnn and MLPerf's reference build R-SAGE (DGL's
                    # SAGEConv would add the destination's own row).
                    convs[r] = dglnn.GraphConv(ins[0], hidden, norm="right", allow_zero_in_degree=True)
                elif model == "sage-root":
                    # PyG's SAGEConv with its root weight (offgnn's
                    # --root-weight): the destination's own row through
                    # fc_self, beside the neighbours' mean through fc_neigh.
                    convs[r] = dglnn.SAGEConv(ins, hidden, "mean")
                else:
                    convs[r] = dglnn.GATConv(ins, hidden // heads, heads, allow_zero_in_degree=True)
            self.convs.append(dglnn.HeteroGraphConv(convs, aggregate="sum"))
        self.dropout = nn.Dropout(dropout)
        self.lin = nn.Linear(hidden, classes)
        self.model = model

    def forward(self, blocks, x):
        h = x
        for i, (conv, block) in enumerate(zip(self.convs, blocks)):
            h = conv(block, h)
            if self.model == "gat":
                h = {k: v.flatten(1) for k, v in h.items()}
            if i != len(self.convs) - 1:
                h = {k: self.dropout(F.leaky_relu(v)) for k, v in h.items()}
        return self.lin(h[target])


fanouts = [int(x) for x in args.fanout.split(",")]
# Both list the input layer first: DGL's sample_blocks walks reversed(fanouts) from the seeds.
sampler = dgl.dataloading.NeighborSampler(fanouts)
model = RGNN(g.canonical_etypes, {t: f.shape[1] for t, f in feats.items()}, args.hidden,
             meta["tasks"][0]["num_classes"], len(fanouts), args.model, args.heads, args.dropout)
opt = torch.optim.Adam(model.parameters(), lr=args.lr)


def loader(name, shuffle):
    return dgl.dataloading.DataLoader(g, {target: splits[name]}, sampler, batch_size=args.batch_size,
                                      shuffle=shuffle, drop_last=False)


def inputs(input_nodes):
    return {t: feats[t][ids] for t, ids in input_nodes.items()}


def accuracy(name):
    model.eval()
    right = seen = 0
    with torch.no_grad():
        for input_nodes, output_nodes, blocks in loader(name, False):
            out = model(blocks, inputs(input_nodes))
            y = labels[output_nodes[target]]
            right += int((out.argmax(-1) == y).sum())
            seen += len(y)
    return right / max(seen, 1)


start = time.perf_counter()
epochs = []
for epoch in range(args.epochs):
    model.train()
    for input_nodes, output_nodes, blocks in loader("train", True):
        out = model(blocks, inputs(input_nodes))
        loss = F.cross_entropy(out, labels[output_nodes[target]])
        opt.zero_grad()
        loss.backward()
        opt.step()
    epochs.append({"epoch": epoch, "valid": accuracy("valid"), "test": accuracy("test")})
best = max(epochs, key=lambda e: e["valid"])
print(json.dumps({"model": args.model, "epochs": epochs, "best_epoch": best["epoch"],
                  "test_at_best": best["test"], "seconds": time.perf_counter() - start}))
