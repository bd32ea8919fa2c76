"""Checks offgnn.Loader on link-prediction layouts against the trainer and
PyTorch Geometric.

Run by the end-to-end suite (tests/e2e/loader.rs) as loader_check.py is.
On a generated graph and on a generated graph of IGBH's schema (the pairs
of `paper:written_by:author`), each split by `sampler split-edges` (five
given negatives per held-out edge), sampled with one negative per training
pair and packed by the binaries:

1. the same batches as the trainer's: the first test batches of each
   layout, as `trainer --dump-batches` writes them, equal the loader's
   (input rows bit for bit, node ids, and the pairs: endpoints, labels,
   queries; a typed batch's endpoints as rows of its relation's source and
   destination types);
2. LinkNeighborLoader's convention: the pairs' endpoints are the batch's
   seeds, the first rows of their types, and each test query is one
   held-out edge with its five negatives;
3. models offgnn does not ship, trained with a plain PyTorch loop over the
   loader (PyG's GraphSAGE, and a HeteroConv of SAGEConv, each with a dot
   product over the pair's embeddings and binary cross-entropy), rank the
   held-out edges against their negatives: test MRR (OGB's mean of the
   optimistic and pessimistic ranks) at the best validation epoch over the
   floors below, where chance is 0.41; the trainer's own R-SAGE and
   GraphSAGE on the same layouts are printed beside them.

Prints one JSON line of figures last.
"""

import argparse
import json
import os
import sys
import warnings

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch_geometric.nn import HeteroConv, SAGEConv
from torch_geometric.nn.models import GraphSAGE

import offgnn

# loader_check.py's helpers; its folder goes last on the path, after the
# installed `offgnn`.
sys.path.append(os.path.dirname(os.path.abspath(__file__)))
from loader_check import generated, run  # noqa: E402

# Test MRR over five negatives per held-out edge (chance: (1 + 1/2 + ...
# + 1/6) / 6 = 0.41) that the models below reach through the loader, under
# what they reach here (see the printed figures).
GRAPHSAGE_MIN_MRR = 0.55
HETERO_MIN_MRR = 0.55
NEGATIVES = 5


def link_layout(bin_dir, work, name, dataset, *split_args, features=True):
    """Splits `dataset`'s edges, samples link batches and packs them."""
    d = os.path.join(work, name)
    lp = os.path.join(d, "lp")
    run(bin_dir, "sampler", "split-edges", "--dataset", dataset, "--out", lp,
        "--negatives", NEGATIVES, *split_args, "--overwrite")
    run(bin_dir, "sampler", "--dataset", lp, "--out", os.path.join(d, "samples"),
        "--task", "link", "--negatives", 1, "--fanout", "5,5", "--batch-size", 128,
        "--eval-batch-size", 128, "--epochs", 2, "--overwrite")
    extra = ["--features", os.path.join(lp, "data", "feat.npy")] if features else []
    run(bin_dir, "packer", "--samples", os.path.join(d, "samples"), *extra,
        "--out", os.path.join(d, "pack"), "--gpu-cache", "8K", "--cpu-cache", "16K",
        "--disk-budget", "40x", "--overwrite")
    return os.path.join(d, "pack", "manifest.json")


def dump(bin_dir, work, name, manifest):
    path = os.path.join(work, name, "dump.safetensors")
    run(bin_dir, "trainer", "--manifest", manifest, "--model", "sage", "--epochs", 1,
        "--hidden", 16, "--dump-batches", path, "--dump-count", 3)
    return load_file(path)


def check_queries(store, seeds, what):
    """Each test query: one positive, NEGATIVES negatives, all endpoints
    among the seeds."""
    src_seeds, dst_seeds = seeds
    ei, label, query = store.edge_label_index, store.edge_label, store.edge_label_query
    assert label.dtype == torch.float32 and ei.dtype == query.dtype == torch.int64, what
    assert int(ei[0].max()) < src_seeds and int(ei[1].max()) < dst_seeds, what
    per = torch.bincount(query)
    positives = torch.bincount(query[label == 1], minlength=per.numel())
    assert bool((per == NEGATIVES + 1).all() and (positives == 1).all()), what


def same_untyped(bin_dir, work, dataset):
    manifest = link_layout(bin_dir, work, "untyped", dataset)
    want = dump(bin_dir, work, "untyped", manifest)
    feat = np.load(os.path.join(dataset, "data", "feat.npy"), mmap_mode="r")
    loader = offgnn.Loader(manifest, split="test", device="cpu")
    assert loader.task == "link" and loader.link_edge_type is None
    checked = 0
    for k, d in enumerate(loader):
        b, what = f"batch{k}", f"untyped link batch {k}"
        if f"{b}.pairs.src" not in want:
            break
        assert "y" not in d, what
        assert torch.equal(d.x, want[f"{b}.x"]), f"{what}: input rows differ"
        assert torch.equal(d.n_id, want[f"{b}.n_id"]), f"{what}: node ids differ"
        rows = torch.from_numpy(np.asarray(feat[d.n_id.numpy()]))
        assert torch.equal(d.x, rows), f"{what}: rows are not the file's"
        pairs = torch.stack([want[f"{b}.pairs.src"], want[f"{b}.pairs.dst"]])
        assert torch.equal(d.edge_label_index, pairs), f"{what}: pairs differ"
        assert torch.equal(d.edge_label, want[f"{b}.pairs.label"].float()), what
        assert torch.equal(d.edge_label_query, want[f"{b}.pairs.query"]), what
        check_queries(d, (d.batch_size, d.batch_size), what)
        checked += 1
    loader.close()
    assert checked == 3, checked
    return manifest, {"graph": "generated-3000", "batches": checked}


def same_typed(bin_dir, work):
    ds = os.path.join(work, "typed", "igbh")
    run(bin_dir, "sampler", "generate", "--schema", "igbh", "--nodes", 3000, "--feature-dim", 16,
        "--type-dims", "author=8,fos=4,institute=6", "--classes", 4, "--out", ds, "--overwrite")
    relation = ("paper", "written_by", "author")
    manifest = link_layout(bin_dir, work, "typed", ds, "--relation", ":".join(relation),
                           features=False)
    want = dump(bin_dir, work, "typed", manifest)
    loader = offgnn.Loader(manifest, split="test", device="cpu")
    assert loader.task == "link" and loader.link_edge_type == relation, loader.link_edge_type
    checked = 0
    for k, h in enumerate(loader):
        b, what = f"batch{k}", f"typed link batch {k}"
        if f"{b}.pairs.src" not in want:
            break
        types = list(h.node_types)
        for t in types:
            assert torch.equal(h[t].x, want[f"{b}.x.{t}"]), f"{what}: {t} rows differ"
            assert torch.equal(h[t].n_id, want[f"{b}.n_id.{t}"]), f"{what}: {t} ids differ"
        # The dump's endpoints are rows among every type's seeds, one
        # type after another.
        seeds = {t: h[t].num_sampled_nodes[0] for t in types}
        first = {t: sum(seeds[u] for u in types[: types.index(t)]) for t in types}
        store = h[relation]
        got = store.edge_label_index + torch.tensor([[first["paper"]], [first["author"]]])
        pairs = torch.stack([want[f"{b}.pairs.src"], want[f"{b}.pairs.dst"]])
        assert torch.equal(got, pairs), f"{what}: pairs differ"
        assert torch.equal(store.edge_label, want[f"{b}.pairs.label"].float()), what
        assert torch.equal(store.edge_label_query, want[f"{b}.pairs.query"]), what
        check_queries(store, (seeds["paper"], seeds["author"]), what)
        checked += 1
    loader.close()
    assert checked == 3, checked
    return manifest, {"graph": "igbh-3000", "relation": ":".join(relation), "batches": checked}


def ranks(scores, label, query):
    """OGB's rank of each query's positive among its negatives: the mean of
    the optimistic and the pessimistic rank."""
    n = int(query.max()) + 1
    pos = torch.zeros(n).scatter_(0, query[label == 1], scores[label == 1])
    neg, q = scores[label == 0], query[label == 0]
    above = torch.zeros(n).index_add_(0, q, (neg > pos[q]).float())
    tied = torch.zeros(n).index_add_(0, q, (neg >= pos[q]).float())
    return 0.5 * (above + tied) + 1


def link_loop(model, manifest, epochs, lr, pairs_of):
    """A plain PyTorch loop over the loader, binary cross-entropy over each
    batch's pairs; test MRR at the best validation MRR. `pairs_of(model, d)`
    gives a batch's scores and its pairs' store."""
    torch.manual_seed(0)
    loaders = {s: offgnn.Loader(manifest, split=s, device="cpu") for s in ("train", "valid", "test")}
    opt = torch.optim.Adam(model.parameters(), lr=lr)

    def mrr(split):
        model.eval()
        total, n = 0.0, 0
        with torch.no_grad():
            for d in loaders[split]:
                scores, store = pairs_of(model, d)
                r = ranks(scores, store.edge_label, store.edge_label_query)
                total, n = total + float((1 / r).sum()), n + r.numel()
        return total / n

    best = (-1.0, 0.0, -1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for epoch in range(epochs):
            loaders["train"].set_epoch(epoch)
            model.train()
            for d in loaders["train"]:
                opt.zero_grad()
                scores, store = pairs_of(model, d)
                F.binary_cross_entropy_with_logits(scores, store.edge_label).backward()
                opt.step()
            v, t = mrr("valid"), mrr("test")
            if v > best[0]:
                best = (v, t, epoch)
    for l in loaders.values():
        l.close()
    return {"valid_mrr": best[0], "test_mrr": best[1], "best_epoch": best[2]}


def trainer_mrr(bin_dir, manifest, hidden, epochs, lr):
    s = run(bin_dir, "trainer", "--manifest", manifest, "--model", "sage", "--hidden", hidden,
            "--epochs", epochs, "--lr", lr, "--scorer", "dot")["summary"]
    return s["test_rank_at_best_valid"]["mrr"]


def graphsage(bin_dir, manifest):
    loader = offgnn.Loader(manifest, split="test", device="cpu")
    torch.manual_seed(0)
    model = GraphSAGE(loader.num_features, 64, num_layers=2, out_channels=64)
    loader.close()

    def pairs_of(model, d):
        h = model(d.x, d.edge_index)
        src, dst = d.edge_label_index
        return (h[src] * h[dst]).sum(-1), d

    r = link_loop(model, manifest, 10, 0.01, pairs_of)
    assert r["test_mrr"] >= GRAPHSAGE_MIN_MRR, f"GraphSAGE: test MRR {r['test_mrr']:.4f}"
    return {"graph": "generated-3000", "model": "PyG GraphSAGE, dot", "min_mrr": GRAPHSAGE_MIN_MRR,
            "trainer_test_mrr": trainer_mrr(bin_dir, manifest, 64, 10, 0.01), **r}


def hetero(bin_dir, manifest):
    loader = offgnn.Loader(manifest, split="test", device="cpu")
    first = next(iter(loader))
    relation = loader.link_edge_type
    loader.close()

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.convs = torch.nn.ModuleList([
                HeteroConv({r: SAGEConv((-1, -1), 32) for r in first.edge_types}, aggr="sum")
                for _ in range(2)])

        def forward(self, h):
            x = h.x_dict
            for i, conv in enumerate(self.convs):
                x = conv(x, h.edge_index_dict)
                if i + 1 < len(self.convs):
                    x = {t: F.relu(v) for t, v in x.items()}
            return x

    def pairs_of(model, h):
        x = model(h)
        store = h[relation]
        src, dst = store.edge_label_index
        return (x[relation[0]][src] * x[relation[2]][dst]).sum(-1), store

    torch.manual_seed(0)
    net = Net()
    net(first)  # PyG's lazy widths
    r = link_loop(net, manifest, 10, 0.01, pairs_of)
    assert r["test_mrr"] >= HETERO_MIN_MRR, f"HeteroConv: test MRR {r['test_mrr']:.4f}"
    return {"graph": "igbh-3000", "model": "HeteroConv(SAGEConv), dot", "min_mrr": HETERO_MIN_MRR,
            "trainer_test_mrr": trainer_mrr(bin_dir, manifest, 32, 10, 0.01), **r}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bin-dir", required=True)
    p.add_argument("--work", required=True)
    a = p.parse_args()
    torch.set_num_threads(2)
    untyped, same = same_untyped(a.bin_dir, a.work, generated(a.bin_dir, a.work))
    typed, same_t = same_typed(a.bin_dir, a.work)
    out = {"same_batches": [same, same_t], "mrr": []}
    out["mrr"].append(graphsage(a.bin_dir, untyped))
    print(json.dumps(out["mrr"][-1]), file=sys.stderr)
    out["mrr"].append(hetero(a.bin_dir, typed))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
