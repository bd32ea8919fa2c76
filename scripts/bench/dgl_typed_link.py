"""DGL 2.1's link prediction on an offgnn typed link-prediction dataset
(`sampler split-edges --relation`), for scripts/bench-typed-link: the
heterograph of the training graph (repeated edges kept once, as offgnn's
sampler keeps them), each type's features; R-SAGE as offgnn builds it (a
`HeteroGraphConv` of one `GraphConv(norm="right")` per relation, which is
PyG's `SAGEConv(root_weight=False)`: the mean of the relation's
in-neighbours, then a linear map; summed per type, leaky ReLU between
layers); DGL's link predictor (Linear, ReLU, Linear, ReLU, Linear on
`h_u * h_v`) over the relation's pairs; binary cross-entropy over each
batch's training pairs and one uniform negative each (a destination of the
relation's destination type), with every edge joining a batch's pair, over
any relation and either way, excluded from its blocks; Adam. Evaluation
samples the same fan-outs around each query's endpoints and ranks each
held-out pair against its given negatives (ties half). Prints one JSON
line: the test MRR and Hits@50 at the best validation MRR, and the
training seconds. With --sample-only, one pass of the training loader
alone (batches built and dropped: the sampling kernel), and its pairs and
seconds.
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
ap.add_argument("--fanout", default="10,5")
ap.add_argument("--batch-size", type=int, default=512)
ap.add_argument("--epochs", type=int, default=10)
ap.add_argument("--hidden", type=int, default=64)
ap.add_argument("--lr", type=float, default=0.003)
ap.add_argument("--seed", type=int, default=0)
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--sample-only", action="store_true")
args = ap.parse_args()

torch.set_num_threads(args.threads)
torch.manual_seed(args.seed)
np.random.seed(args.seed)
import dgl  # noqa: E402  (after the thread settings)
import dgl.nn as dglnn  # noqa: E402
import dgl_typed_data  # noqa: E402  (beside this script)

dgl.seed(args.seed)
root = args.dataset
meta, g, feats = dgl_typed_data.load(root)
task = next(t for t in meta["tasks"] if t["name"] == "link_prediction")
target = tuple(task["train_set"][0]["type"].split(":"))
src_type, _, dst_type = target


def set_file(name, what):
    part = task[name][0]["data"]
    return np.load(os.path.join(root, next(p["path"] for p in part if p["name"] == what))).astype(np.int64)


train_pairs = torch.from_numpy(set_file("train_set", "seeds"))
train_eids = g.edge_ids(train_pairs[:, 0], train_pairs[:, 1], etype=target)


def exclude(seed_edges):
    """Every edge joining a seed pair's two nodes, over any relation, either way."""
    u, v = g.find_edges(seed_edges[target], etype=target)
    out = {}
    for ce in g.canonical_etypes:
        found = []
        for a, b in ((u, v), (v, u)):
            if (ce[0], ce[2]) != ((src_type, dst_type) if a is u else (dst_type, src_type)):
                continue
            has = g.has_edges_between(a, b, etype=ce)
            if has.any():
                found.append(g.edge_ids(a[has], b[has], etype=ce))
        if found:
            out[ce] = torch.unique(torch.cat(found))
    return out


fanouts = [int(x) for x in args.fanout.split(",")]
# Both list the input layer first: DGL's sample_blocks walks reversed(fanouts) from the seeds.
sampler = dgl.dataloading.NeighborSampler(fanouts)
train_sampler = dgl.dataloading.as_edge_prediction_sampler(
    sampler, exclude=exclude, negative_sampler=dgl.dataloading.negative_sampler.Uniform(1)
)
loader = dgl.dataloading.DataLoader(
    g, {target: train_eids}, train_sampler, batch_size=args.batch_size, shuffle=True, drop_last=False
)
if args.sample_only:
    started, seen = time.perf_counter(), 0
    for _, pos, _, _ in loader:
        seen += pos.num_edges(etype=target)
    print(json.dumps({"pairs": seen, "seconds": time.perf_counter() - started}))
    raise SystemExit


class Model(nn.Module):
    def __init__(self, etypes, in_dims, hidden, layers):
        super().__init__()
        self.convs = nn.ModuleList()
        for layer in range(layers):
            convs = {}
            for s, r, d in etypes:
                ins = in_dims[s] if layer == 0 else hidden
                convs[r] = dglnn.GraphConv(ins, hidden, norm="right", allow_zero_in_degree=True)
            self.convs.append(dglnn.HeteroGraphConv(convs, aggregate="sum"))
        self.predictor = nn.Sequential(
            nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 1)
        )

    def forward(self, blocks, x):
        h = x
        for i, (conv, block) in enumerate(zip(self.convs, blocks)):
            h = conv(block, h)
            if i != len(self.convs) - 1:
                h = {k: F.leaky_relu(v) for k, v in h.items()}
        return h

    def score(self, hu, hv):
        return self.predictor(hu * hv).squeeze(-1)


model = Model(g.canonical_etypes, {t: f.shape[1] for t, f in feats.items()}, args.hidden, len(fanouts))
opt = torch.optim.Adam(model.parameters(), lr=args.lr)


def inputs(input_nodes):
    return {t: feats[t][ids] for t, ids in input_nodes.items()}


def evaluate(name):
    seeds, labels, index = set_file(name, "seeds"), set_file(name, "labels"), set_file(name, "indexes")
    ranks = []
    model.eval()
    with torch.no_grad():
        # Twenty queries at a time, each a positive and its negatives.
        step = 20 * int((index == index[0]).sum())
        for at in range(0, len(seeds), step):
            ps, pl, pi = seeds[at : at + step], labels[at : at + step], index[at : at + step]
            if src_type == dst_type:
                nodes, local = np.unique(ps.reshape(-1), return_inverse=True)
                local = local.reshape(-1, 2)
                seed_nodes = {src_type: torch.from_numpy(nodes)}
                lu, lv = local[:, 0], local[:, 1]
            else:
                us, lu = np.unique(ps[:, 0], return_inverse=True)
                vs, lv = np.unique(ps[:, 1], return_inverse=True)
                seed_nodes = {src_type: torch.from_numpy(us), dst_type: torch.from_numpy(vs)}
            input_nodes, _, blocks = sampler.sample_blocks(g, seed_nodes)
            h = model(blocks, inputs(input_nodes))
            sc = model.score(h[src_type][torch.from_numpy(lu)], h[dst_type][torch.from_numpy(lv)]).numpy()
            for q in np.unique(pi):
                m = pi == q
                pos = sc[m][pl[m] == 1][0]
                neg = sc[m][pl[m] == 0]
                ranks.append(1 + (neg > pos).sum() + 0.5 * (neg == pos).sum())
    r = np.array(ranks, dtype=np.float64)
    return float((1 / r).mean()), float((r <= 50).mean())


best, train_seconds = None, 0.0
for epoch in range(args.epochs):
    model.train()
    t = time.perf_counter()
    for input_nodes, pos, neg, blocks in loader:
        h = model(blocks, inputs(input_nodes))
        ps, pd = pos.edges(etype=target)
        ns, nd = neg.edges(etype=target)
        logits = torch.cat([model.score(h[src_type][ps], h[dst_type][pd]), model.score(h[src_type][ns], h[dst_type][nd])])
        y = torch.cat([torch.ones(len(ps)), torch.zeros(len(ns))])
        loss = F.binary_cross_entropy_with_logits(logits, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    train_seconds += time.perf_counter() - t
    valid, _ = evaluate("validation_set")
    if best is None or valid > best[0]:
        best = (valid, epoch) + evaluate("test_set")
print(json.dumps({"mrr": best[2], "hits_at_50": best[3], "best_epoch": best[1], "valid_mrr": best[0],
                  "train_seconds": train_seconds}))
