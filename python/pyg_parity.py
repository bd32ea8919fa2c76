"""Parity of offgnn's exported models with PyTorch Geometric's own classes.

For each graph (a generated one, and Cora) and each model (GraphSAGE, GAT),
this runs the offgnn binaries as a user would (sampler, packer, trainer with
--export and --dump-batches), then builds the PyG model that model.json
names, loads the weights that model.json names into it with strict=True, runs PyG's layers on
the same sampled blocks of the test batches that the trainer dumped, and
compares logits (within 1e-4, absolute) and predicted classes (all equal).
The MLP baseline is checked the same way on the generated graph. Then
`trainer infer` runs each export over the whole graph out of core, and its
logits are compared with PyG's full-graph forward pass (model(x, edge_index)). Last, a link-prediction model on the
generated graph: its encoder loads into PyG's GraphSAGE and its scorer into
torch.nn.Sequential, both with strict=True, and PyG's full-graph embeddings
and scores match `trainer infer --outputs embeddings` and `trainer score`.

Usage: python pyg_parity.py --bin-dir target/debug --work DIR [--cora-dir D]
Prints one line per case and, last, one line of JSON; exits non-zero on a
mismatch.
"""

import argparse
import json
import os
import subprocess
import sys

import numpy as np
import pyarrow.parquet as pq
import torch
import torch_geometric
import torch_geometric.nn.models as pyg_models
from safetensors.torch import load_file

TOLERANCE = 1e-4


def run(bin_dir, program, *args):
    cmd = [os.path.join(bin_dir, program), *map(str, args)]
    env = dict(os.environ, RUST_LOG="warn")
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def pack(bin_dir, work, name, dataset):
    samples = os.path.join(work, name, "samples")
    out = os.path.join(work, name, "pack")
    run(bin_dir, "sampler", "--dataset", dataset, "--out", samples,
        "--fanout", "5,10", "--batch-size", 128, "--epochs", 2, "--overwrite")
    run(bin_dir, "packer", "--samples", samples,
        "--features", os.path.join(dataset, "data", "feat.npy"), "--out", out,
        "--gpu-cache", "64K", "--cpu-cache", "128K", "--disk-budget", "8x",
        "--overwrite")
    return os.path.join(out, "manifest.json")


def pyg_model(export_dir):
    with open(os.path.join(export_dir, "model.json")) as f:
        card = json.load(f)
    cls = getattr(pyg_models, card["pyg"]["class"])
    model = cls(**card["pyg"]["kwargs"])
    # model.json names the weights object (each export run names its own).
    model.load_state_dict(load_file(os.path.join(export_dir, card["weights"])),
                          strict=True)
    return card, model.eval()


def pyg_forward(model, card, dump, k):
    """PyG's layers on batch k's blocks: layer l maps the rows of block l's
    sources to its destinations (the first num_dst sources), as the
    trainer's sampled message-flow graph does."""
    x = dump[f"batch{k}.x"]
    if card["pyg"]["class"] == "MLP":
        seeds = int(dump[f"batch{k}.block{card['num_layers'] - 1}.size"][1])
        return model(x[:seeds])
    h = x
    for l, conv in enumerate(model.convs):
        num_src, num_dst = (int(v) for v in dump[f"batch{k}.block{l}.size"])
        edge_index = torch.stack([dump[f"batch{k}.block{l}.src"],
                                  dump[f"batch{k}.block{l}.dst"]])
        assert h.size(0) == num_src, (h.size(0), num_src)
        h = conv((h, h[:num_dst]), edge_index, size=(num_src, num_dst))
        if l < len(model.convs) - 1:
            h = model.dropout(model.act(h))
    return h


def check(bin_dir, work, name, manifest, arch):
    export_dir = os.path.join(work, name, f"export-{arch}")
    dump_path = os.path.join(work, name, f"dump-{arch}.safetensors")
    summary = run(bin_dir, "trainer", "--manifest", manifest, "--model", arch,
                  "--epochs", 3, "--hidden", 32, "--heads", 4, "--lr", 0.01,
                  "--export", export_dir, "--overwrite",
                  "--dump-batches", dump_path, "--dump-count", 3)["summary"]
    card, model = pyg_model(export_dir)
    dump = load_file(dump_path)
    batches = sorted({key.split(".")[0] for key in dump})
    worst, nodes, edges = 0.0, 0, 0
    with torch.no_grad():
        for b in batches:
            k = int(b.removeprefix("batch"))
            ours = dump[f"batch{k}.logits"]
            theirs = pyg_forward(model, card, dump, k)
            if theirs.shape != ours.shape:
                sys.exit(f"{name} {arch} batch {k}: PyG logits {tuple(theirs.shape)}, "
                         f"offgnn {tuple(ours.shape)}")
            diff = (theirs - ours).abs().max().item()
            worst = max(worst, diff)
            same = bool((theirs.argmax(-1) == ours.argmax(-1)).all())
            nodes += ours.size(0)
            edges += sum(dump[f"batch{k}.block{l}.src"].numel()
                         for l in range(card["num_layers"]))
            if diff > TOLERANCE or not same:
                sys.exit(f"FAIL {name} {arch} batch {k}: largest logit difference "
                         f"{diff:.3e} (tolerance {TOLERANCE}), classes equal: {same}")
    if not batches:
        sys.exit(f"{name} {arch}: the dump holds no batches")
    # The comparison must be able to fail: parameters moved by 1e-3 give
    # logits beyond the tolerance.
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1e-3 * torch.randn_like(p))
        moved = max((pyg_forward(model, card, dump, int(b.removeprefix("batch")))
                     - dump[f"{b}.logits"]).abs().max().item() for b in batches)
    if moved <= TOLERANCE:
        sys.exit(f"{name} {arch}: perturbed parameters still agree ({moved:.3e}); "
                 "the comparison cannot tell models apart")
    row = {"graph": name, "model": arch, "pyg_class": card["pyg"]["class"],
           "batches": len(batches), "seed_nodes": nodes, "edges": edges,
           "max_abs_logit_diff": worst, "perturbed_diff": moved,
           "test_acc_at_best_valid": summary["test_acc_at_best_valid"],
           "exported_epoch": card["epoch"]}
    print(f"ok {name:>9} {arch:<4} ({card['pyg']['class']}): {len(batches)} batches, "
          f"{nodes} seeds, {edges} edges, largest logit difference {worst:.3e} "
          f"(parameters moved by 1e-3: {moved:.3e})")
    return row


def full_graph(bin_dir, work, name, dataset, arch, memory):
    """`trainer infer` (out of core, with memory for a few destination
    groups) against PyG's own full-graph forward pass with the exported
    weights: every node's logits within the tolerance, classes equal."""
    export_dir = os.path.join(work, name, f"export-{arch}")
    out = os.path.join(work, name, f"infer-{arch}")
    card, model = pyg_model(export_dir)
    summary = run(bin_dir, "trainer", "infer", "--model", export_dir, "--dataset", dataset,
                  "--out", out, "--outputs", "logits,embeddings", "--memory", memory,
                  "--chunk-rows", 1024, "--overwrite",
                  "--work-dir", os.path.join(work, name, f"infer-work-{arch}"))["summary"]
    # The committed result is the parts _SUCCESS.json lists.
    with open(os.path.join(out, "_SUCCESS.json")) as f:
        parts = [os.path.join(out, p) for p in json.load(f)["files"]]
    table = pq.ParquetDataset(parts).read()
    ids = table.column("node_id").to_numpy()
    ours = torch.from_numpy(np.stack(table.column("logits").to_numpy(zero_copy_only=False)))
    order = np.argsort(ids)
    ours, ids = ours[order], ids[order]
    x = torch.from_numpy(np.load(os.path.join(dataset, "data", "feat.npy")).astype(np.float32))
    edges = torch.from_numpy(np.load(os.path.join(dataset, "edges", "edges.npy")).astype(np.int64))
    # The graph the sampler samples: each (source, target) pair once.
    edge_index = torch.unique(edges, dim=1)
    # The embedding column is the last layer's input: what PyG hands its
    # last conv (or the MLP's last linear), caught by a pre-hook.
    mlp = card["pyg"]["class"] == "MLP"
    last = model.lins[-1] if mlp else model.convs[-1]
    caught = {}

    def catch(_module, args):
        caught["x"] = args[0]  # returns None: the arguments go on unchanged

    hook = last.register_forward_pre_hook(catch)
    with torch.no_grad():
        theirs = model(x) if mlp else model(x, edge_index)
    hook.remove()
    if not np.array_equal(ids, np.arange(x.size(0))):
        sys.exit(f"{name} {arch}: trainer infer wrote {len(ids)} rows, not one per node")
    emb = torch.from_numpy(
        np.stack(table.column("embedding").to_numpy(zero_copy_only=False)))[order]
    emb_diff = (caught["x"] - emb).abs().max().item()
    if caught["x"].shape != emb.shape or emb_diff > TOLERANCE:
        sys.exit(f"FAIL {name} {arch} full graph: embeddings {tuple(emb.shape)} against "
                 f"PyG's {tuple(caught['x'].shape)}, largest difference {emb_diff:.3e}")
    diff = (theirs - ours).abs().max().item()
    same = bool((theirs.argmax(-1) == ours.argmax(-1)).all())
    classes = np.concatenate([c.to_numpy() for c in table.column("class").chunks])[order]
    same_written = bool((torch.from_numpy(classes) == theirs.argmax(-1)).all())
    if diff > TOLERANCE or not same or not same_written:
        sys.exit(f"FAIL {name} {arch} full graph: largest logit difference {diff:.3e}, "
                 f"classes equal: {same} (written column: {same_written})")
    print(f"ok {name:>9} {arch:<4} full graph, trainer infer vs PyG: {x.size(0)} nodes, "
          f"{edge_index.size(1)} edges, {summary['groups']} groups, "
          f"largest logit difference {diff:.3e}, embedding difference {emb_diff:.3e}")
    return {"graph": name, "model": arch, "check": "full_graph_infer",
            "nodes": x.size(0), "groups": summary["groups"],
            "max_abs_logit_diff": diff, "max_abs_embedding_diff": emb_diff}


def link_full_graph(bin_dir, work, dataset):
    """A link-prediction model trained by the binaries: the encoder's
    weights (all but `scorer.`) load into the PyG class model.json names,
    the scorer's into the torch.nn.Sequential model.json describes, and
    PyG's full-graph embeddings and the Sequential's scores of the test pairs
    equal `trainer infer --outputs embeddings` and `trainer score`."""
    d = os.path.join(work, "link")
    lp, samples, layout = (os.path.join(d, n) for n in ("lp", "samples", "pack"))
    export_dir, emb = os.path.join(d, "export"), os.path.join(d, "emb")
    run(bin_dir, "sampler", "split-edges", "--dataset", dataset, "--out", lp,
        "--negatives", 20, "--overwrite")
    run(bin_dir, "sampler", "--dataset", lp, "--out", samples, "--task", "link",
        "--negatives", 2, "--fanout", "5,10", "--batch-size", 128, "--epochs", 1, "--overwrite")
    run(bin_dir, "packer", "--samples", samples, "--features", os.path.join(lp, "data", "feat.npy"),
        "--out", layout, "--gpu-cache", "64K", "--cpu-cache", "128K", "--disk-budget", "40x",
        "--overwrite")
    run(bin_dir, "trainer", "--manifest", os.path.join(layout, "manifest.json"), "--epochs", 2,
        "--hidden", 32, "--lr", 0.01, "--scorer", "mlp", "--export", export_dir, "--overwrite")
    run(bin_dir, "trainer", "infer", "--model", export_dir, "--dataset", lp, "--out", emb,
        "--outputs", "embeddings", "--overwrite")
    with open(os.path.join(export_dir, "model.json")) as f:
        card = json.load(f)
    weights = load_file(os.path.join(export_dir, card["weights"]))
    model = getattr(pyg_models, card["pyg"]["class"])(**card["pyg"]["kwargs"])
    model.load_state_dict({k: v for k, v in weights.items() if not k.startswith("scorer.")},
                          strict=True)
    d_out = card["out_channels"]
    scorer = torch.nn.Sequential(torch.nn.Linear(d_out, d_out), torch.nn.ReLU(),
                                 torch.nn.Linear(d_out, d_out), torch.nn.ReLU(),
                                 torch.nn.Linear(d_out, 1))
    scorer.load_state_dict({k.removeprefix("scorer."): v for k, v in weights.items()
                            if k.startswith("scorer.")}, strict=True)
    model.eval()
    x = torch.from_numpy(np.load(os.path.join(lp, "data", "feat.npy")).astype(np.float32))
    edges = torch.from_numpy(np.load(os.path.join(lp, "edges", "edges.npy")).astype(np.int64))
    with torch.no_grad():
        theirs = model(x, torch.unique(edges, dim=1))
    with open(os.path.join(emb, "_SUCCESS.json")) as f:
        parts = [os.path.join(emb, p) for p in json.load(f)["files"]]
    table = pq.ParquetDataset(parts).read()
    order = np.argsort(table.column("node_id").to_numpy())
    ours = torch.from_numpy(
        np.stack(table.column("embedding").to_numpy(zero_copy_only=False)))[order]
    emb_diff = (theirs - ours).abs().max().item()
    pairs = np.load(os.path.join(lp, "set", "lp_test_seeds.npy")).astype(np.int64)
    pairs_path, scores_path = os.path.join(d, "pairs.npy"), os.path.join(d, "scores.npy")
    np.save(pairs_path, pairs)
    run(bin_dir, "trainer", "score", "--model", export_dir, "--embeddings", emb,
        "--pairs", pairs_path, "--out", scores_path, "--overwrite")
    with torch.no_grad():
        want = scorer(theirs[pairs[:, 0]] * theirs[pairs[:, 1]]).squeeze(-1)
    got = torch.from_numpy(np.load(scores_path))
    score_diff = (want - got).abs().max().item()
    if ours.shape != theirs.shape or emb_diff > TOLERANCE or score_diff > TOLERANCE:
        sys.exit(f"FAIL link full graph: embeddings {tuple(ours.shape)} against PyG's "
                 f"{tuple(theirs.shape)}, largest difference {emb_diff:.3e}; "
                 f"scores {score_diff:.3e}")
    print(f"ok generated link full graph, trainer infer and score vs PyG + Sequential: "
          f"{x.size(0)} nodes, {len(pairs)} pairs, embedding difference {emb_diff:.3e}, "
          f"score difference {score_diff:.3e}")
    return {"graph": "generated", "model": "sage", "check": "link_full_graph",
            "nodes": x.size(0), "pairs": len(pairs), "max_abs_logit_diff": score_diff,
            "max_abs_embedding_diff": emb_diff}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bin-dir", required=True)
    p.add_argument("--work", required=True)
    p.add_argument("--cora-dir", help="the Cora Parquet tables (scripts/setup fetches them)")
    a = p.parse_args()
    os.makedirs(a.work, exist_ok=True)
    torch.manual_seed(0)

    graphs = []
    gen = os.path.join(a.work, "generated", "dataset")
    run(a.bin_dir, "sampler", "generate", "--out", gen, "--nodes", 3000,
        "--feature-dim", 24, "--classes", 5, "--overwrite")
    # --memory for `trainer infer`: libtorch's 704 MiB, the stream's 16 MiB
    # of read buffers and the output parts being encoded (a few MiB), then
    # room for a few destination groups.
    graphs.append(("generated", gen, ["sage", "gat", "mlp"], "736M"))
    if a.cora_dir:
        cora = os.path.join(a.work, "cora", "dataset")
        run(a.bin_dir, "sampler", "import-parquet", "--preset", "cora",
            "--nodes", os.path.join(a.cora_dir, "cora_nodes.parquet.gzip"),
            "--edges", os.path.join(a.cora_dir, "cora_rels.parquet.gzip"),
            "--out", cora, "--overwrite")
        graphs.append(("cora", cora, ["sage", "gat"], "1G"))

    rows = []
    for name, dataset, archs, memory in graphs:
        manifest = pack(a.bin_dir, a.work, name, dataset)
        for arch in archs:
            rows.append(check(a.bin_dir, a.work, name, manifest, arch))
            rows.append(full_graph(a.bin_dir, a.work, name, dataset, arch, memory))
    rows.append(link_full_graph(a.bin_dir, a.work, gen))
    print(json.dumps({"torch": torch.__version__,
                      "torch_geometric": torch_geometric.__version__,
                      "tolerance": TOLERANCE,
                      "max_abs_logit_diff": max(r["max_abs_logit_diff"] for r in rows),
                      "cases": rows}))


if __name__ == "__main__":
    main()
