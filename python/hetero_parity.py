"""Parity of offgnn's R-SAGE and R-GAT with PyTorch Geometric's HeteroConv.

The trainer's test writes, into WORK, a model card (model.json, as a typed
export's), a typed batch (each type's input
rows, each block's edges per relation as positions among the types' rows,
each block's destination rows per type), offgnn's parameters and offgnn's
logits. This builds the model as MLPerf's GNN reference builds it (one
SAGEConv(root_weight=False; True where the card says `root_weight`) or
GATConv(heads, add_self_loops=False) per
relation in a HeteroConv, leaky ReLU between layers, a Linear on the target
type), loads offgnn's parameters with strict=True, runs PyG's layers on the
same blocks, and compares logits (within 1e-4, absolute).

With --export DIR, it loads a typed export of the trainer (model.json and
its weights) into the model the card describes, with strict=True: the few
lines docs/export-and-inference.md shows. A link-prediction model (format
4) has no Linear on the target type, and its MLP scorer (if it has one) is
a torch.nn.Sequential under `scorer`.

With --infer DIR DATASET OUT, it runs the export's model over the whole
graph of DATASET (every in-edge of every node, each relation's pairs once
where the card says the sampler kept them once) and compares every type's
embedding and the target type's logits and classes with what `trainer
infer --outputs logits,embeddings` committed at OUT (within 1e-4, or
--tolerance T after OUT: a run with --hidden-dtype f16 rounds its hidden
layers).

With --dump DIR FILE, it runs the export's model on each batch that
`trainer --dump-batches FILE` wrote of a typed layout (each type's input
rows, each block's edges per relation) and compares the logits the trainer
wrote beside them (within 1e-4).

Usage: python hetero_parity.py WORK | --export DIR | --infer DIR DATASET OUT [--tolerance T] | --dump DIR FILE
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
                conv = SAGEConv(ins, hidden, root_weight=card.get("root_weight", False))
            else:
                conv = GATConv(ins, hidden // heads, heads=heads, add_self_loops=False)
            per_relation[(src, rel, dst)] = conv
        convs.append(HeteroConv(per_relation, aggr="sum"))
    model = torch.nn.Module()
    model.convs = convs
    if card.get("scorer") is None:
        model.lin = torch.nn.Linear(hidden, card["out_channels"])
    elif card["scorer"] == "mlp":
        d = card["out_channels"]
        model.scorer = torch.nn.Sequential(
            torch.nn.Linear(d, d), torch.nn.ReLU(), torch.nn.Linear(d, d), torch.nn.ReLU(), torch.nn.Linear(d, 1)
        )
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


def read_metadata(root):
    """The edge and feature files of a metadata.yaml as the sampler writes
    it (block lists of flat mappings; not YAML in general)."""
    items, parents = [], []
    with open(f"{root}/metadata.yaml") as f:
        for line in f:
            body = line.rstrip("\n")
            if not body.strip():
                continue
            indent = len(body) - len(body.lstrip(" "))
            text = body.strip()
            if text.startswith("- "):
                # A list's items sit at its key's indent or deeper.
                while parents and parents[-1][0] > indent:
                    parents.pop()
                items.append((parents[-1][1] if parents else None, {}))
                text = text[2:]
                indent += 2
            key, _, value = text.partition(":")
            value = value.strip()
            if not value:
                while parents and parents[-1][0] >= indent:
                    parents.pop()
                parents.append((indent, key))
            elif items:
                items[-1][1][key] = value
    edges = {i["type"]: f"{root}/{i['path']}" for parent, i in items if parent == "edges"}
    features = {
        i["type"]: f"{root}/{i['path']}"
        for parent, i in items
        if parent == "feature_data" and i.get("name") == "feat"
    }
    return edges, features


def infer(export, dataset, out, tolerance=TOLERANCE):
    """The model over the whole graph against trainer infer's output."""
    import numpy as np
    import pyarrow.parquet as pq

    with open(f"{export}/model.json") as f:
        card = json.load(f)
    model = build(card)
    model.load_state_dict(load_file(f"{export}/{card['weights']}"), strict=True)
    model.eval()
    edge_files, feature_files = read_metadata(dataset)
    x = {t: torch.from_numpy(np.load(p)).float() for t, p in feature_files.items()}
    edges = {}
    for src, rel, dst in card["relations"]:
        e = torch.from_numpy(np.load(edge_files[f"{src}:{rel}:{dst}"])).long()
        edges[(src, rel, dst)] = torch.unique(e, dim=1) if card.get("dedup_edges", True) else e
    with torch.no_grad():
        for layer, conv in enumerate(model.convs):
            x = conv(x, edges)
            if layer != len(model.convs) - 1:
                x = {t: F.leaky_relu(v) for t, v in x.items()}
        logits = model.lin(x[card["target"]]) if hasattr(model, "lin") else None
    with open(f"{out}/_SUCCESS.json") as f:
        summary = json.load(f)
    got = {}
    for name in summary["files"]:
        node_type = name.split("/")[1]
        got.setdefault(node_type, []).append(pq.read_table(f"{out}/{name}").to_pydict())
    diff, rows = 0.0, 0
    for t, want in x.items():
        parts = got[t]
        ids = torch.tensor([i for p in parts for i in p["node_id"]])
        emb = torch.tensor([e for p in parts for e in p["embedding"]])
        if ids.tolist() != list(range(want.shape[0])):
            raise SystemExit(f"type {t}: rows {ids.shape[0]} of {want.shape[0]}, or out of order")
        diff = max(diff, (emb - want).abs().max().item())
        rows += ids.shape[0]
        if t == card["target"] and logits is not None:
            lg = torch.tensor([v for p in parts for v in p["logits"]])
            diff = max(diff, (lg - logits).abs().max().item())
            cls = torch.tensor([c for p in parts for c in p["class"]])
            if not torch.equal(cls, lg.argmax(1)):
                raise SystemExit("classes are not the logits' argmax")
    ok = diff <= tolerance
    print(json.dumps({"architecture": card["architecture"], "max_abs_diff": diff, "rows": rows, "ok": ok}))
    return 0 if ok else 1


def dumped(export, dump):
    """The export's model on the trainer's dumped batches."""
    with open(f"{export}/model.json") as f:
        card = json.load(f)
    model = build(card)
    model.load_state_dict(load_file(f"{export}/{card['weights']}"), strict=True)
    model.eval()
    batch = load_file(dump)
    layers, relations = card["num_layers"], len(card["relations"])
    diff, batches = 0.0, 0
    while f"batch{batches}.logits" in batch:
        k = f"batch{batches}"
        x = {t["name"]: batch[f"{k}.x.{t['name']}"] for t in card["node_types"]}
        edges = [
            [torch.stack([batch[f"{k}.block{l}.rel{r}.src"], batch[f"{k}.block{l}.rel{r}.dst"]]) for r in range(relations)]
            for l in range(layers)
        ]
        num_dst = [batch[f"{k}.block{l}.num_dst"] for l in range(layers)]
        with torch.no_grad():
            logits = forward(model, card, x, edges, num_dst)
        if logits.shape != batch[f"{k}.logits"].shape:
            raise SystemExit(f"{k}: logits {tuple(logits.shape)}, dumped {tuple(batch[k + '.logits'].shape)}")
        diff = max(diff, (logits - batch[f"{k}.logits"]).abs().max().item())
        batches += 1
    ok = batches > 0 and diff <= TOLERANCE
    print(json.dumps({"architecture": card["architecture"], "batches": batches, "max_abs_diff": diff, "ok": ok}))
    return 0 if ok else 1


def main(argv):
    if argv[0] == "--dump":
        return dumped(*argv[1:3])
    if argv[0] == "--infer":
        tolerance = float(argv[5]) if argv[4:5] == ["--tolerance"] else TOLERANCE
        return infer(*argv[1:4], tolerance)
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
