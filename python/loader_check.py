"""Checks offgnn.Loader against the trainer and PyTorch Geometric.

Run by the end-to-end suite (tests/e2e/loader.rs) with `offgnn` importable
(PYTHONPATH) and the built binaries in --bin-dir. On a generated graph and
on Cora, sampled and packed by the binaries:

1. the same batches as the trainer's: the first test batches of a layout,
   as `trainer --dump-batches` writes them, equal the loader's (input rows
   bit for bit, node ids, every block's edges, labels), and each input row
   is the feature file's row of its node id (widened from float16 in a
   layout stored so);
2. NeighborLoader's convention: `edge_index` is each node's in-edges as the
   hop that reached it sampled them, hop by hop, so that PyG's GraphSAGE
   gives the seeds the same outputs with and without `trim_to_layer`;
3. models offgnn does not ship, trained with a plain PyTorch loop over the
   loader: GCN with jumping knowledge on Cora and on the generated graph
   reach the accuracies stated below, and PyG's GraphSAGE reaches the
   trainer's own GraphSAGE test accuracy within 1 point with the same
   hyper-parameters on a generated graph of 60000 nodes;
4. under torchrun's variables, two ranks read their shares of each epoch
   as the trainer deals them;
5. a good citizen: `len`, set_epoch (later epochs said once), a loop left
   early, `close()`, a `with` block and a Ctrl-C leave no thread behind,
   and bad input is a Python exception of one line;
6. on a typed layout, HeteroData batches equal the trainer's typed dump,
   the loader refuses a `memory` under its statement and opens at it, and
   a PyG HeteroConv model trained over them reaches a stated accuracy.

Link-prediction layouts are checked by loader_link_check.py.

Prints one JSON line of figures last.
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import warnings

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch_geometric.nn import HeteroConv, Linear, SAGEConv
from torch_geometric.nn.models import GCN, GraphSAGE

import offgnn

# Test accuracy that GCN with jumping knowledge reaches through the loader
# (best validation epoch of 30), well under what it reaches here (see the
# printed figures), over what a model without the graph reaches.
GCN_CORA_MIN_ACC = 0.82
GCN_GENERATED_MIN_ACC = 0.80
# A PyG HeteroConv model through the typed loader, on a generated typed
# graph of 4 classes (10 epochs).
HETERO_MIN_ACC = 0.55
# PyG's GraphSAGE against the trainer's, same hyper-parameters.
SAGE_MAX_GAP = 0.01


def run(bin_dir, program, *args):
    cmd = [os.path.join(bin_dir, program), *map(str, args)]
    env = dict(os.environ, RUST_LOG="warn")
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def pack(bin_dir, work, name, dataset, *extra, fanout="5,10", batch=128, epochs=2):
    samples = os.path.join(work, name, "samples")
    out = os.path.join(work, name, "pack" + "".join(extra).replace("-", ""))
    if not os.path.exists(os.path.join(samples, "run.json")):
        run(bin_dir, "sampler", "--dataset", dataset, "--out", samples,
            "--fanout", fanout, "--batch-size", batch, "--epochs", epochs, "--overwrite")
    run(bin_dir, "packer", "--samples", samples,
        "--features", os.path.join(dataset, "data", "feat.npy"), "--out", out,
        "--gpu-cache", "64K", "--cpu-cache", "128K", "--disk-budget", "8x",
        "--overwrite", *extra)
    return os.path.join(out, "manifest.json")


def generated(bin_dir, work):
    """The generated graph of 3000 nodes the checks start from."""
    gen = os.path.join(work, "generated", "dataset")
    run(bin_dir, "sampler", "generate", "--out", gen, "--nodes", 3000,
        "--feature-dim", 24, "--classes", 5, "--overwrite")
    return gen


def threads():
    return len(os.listdir("/proc/self/task"))


def quiet_threads():
    """The thread count once no pass's thread is left (a pass that just
    ended may leave its entry a moment, as below)."""
    t = time.monotonic()
    while time.monotonic() - t < 1.0:
        names = [open(f"/proc/self/task/{x}/comm").read().strip()
                 for x in os.listdir("/proc/self/task")]
        if "offgnn-loader" not in names:
            break
        time.sleep(0.005)
    return threads()


def settles_to(base):
    """The thread count back at `base` within a second: a joined thread's
    /proc entry can outlive the join by a moment (the kernel wakes the
    joiner as the thread exits, before its task is released)."""
    t = time.monotonic()
    while threads() != base and time.monotonic() - t < 1.0:
        time.sleep(0.005)
    return threads() == base


def same_batches(bin_dir, work, name, dataset, manifest, store):
    """Check 1 and 2 on one layout."""
    dump_path = os.path.join(work, name, f"dump-{store}.safetensors")
    run(bin_dir, "trainer", "--manifest", manifest, "--model", "sage", "--epochs", 1,
        "--hidden", 16, "--dump-batches", dump_path, "--dump-count", 3,
        "--export", os.path.join(work, name, f"export-{store}"), "--overwrite")
    dump = load_file(dump_path)
    feat = np.load(os.path.join(dataset, "data", "feat.npy"), mmap_mode="r")
    count = len({k.split(".")[0] for k in dump})
    loader = offgnn.Loader(manifest, split="test", device="cpu")
    sage = GraphSAGE(loader.num_features, 16, num_layers=2, out_channels=loader.num_classes).eval()
    checked, edges = 0, 0
    for k, d in enumerate(loader):
        if k == count:
            break
        b = f"batch{k}"
        assert torch.equal(d.x, dump[f"{b}.x"]), f"{name} {store} batch {k}: input rows differ"
        assert torch.equal(d.n_id, dump[f"{b}.n_id"]), f"{name} batch {k}: node ids differ"
        assert torch.equal(d.y, dump[f"{b}.labels"]), f"{name} batch {k}: labels differ"
        rows = torch.from_numpy(np.asarray(feat[d.n_id.numpy()]))
        if store == "f16":
            rows = rows.to(torch.float16).float()
        assert torch.equal(d.x, rows.float()), f"{name} {store} batch {k}: rows are not the file's"
        layers = len(d.blocks)
        for l, (e, (num_src, num_dst)) in enumerate(d.blocks):
            want = torch.stack([dump[f"{b}.block{l}.src"], dump[f"{b}.block{l}.dst"]])
            assert torch.equal(e, want), f"{name} batch {k} block {l}: edges differ"
            assert [num_src, num_dst] == dump[f"{b}.block{l}.size"].tolist()
        check_hops(d, f"{name} batch {k}")
        with torch.no_grad():
            full = sage(d.x, d.edge_index)[: d.batch_size]
            trimmed = sage(d.x, d.edge_index,
                           num_sampled_nodes_per_hop=d.num_sampled_nodes,
                           num_sampled_edges_per_hop=d.num_sampled_edges)[: d.batch_size]
        gap = (full - trimmed).abs().max().item()
        assert gap < 1e-5, f"{name} batch {k}: trim_to_layer changes the seeds' outputs by {gap}"
        assert layers == 2 and d.batch_size == d.y.numel()
        checked += 1
        edges += d.edge_index.size(1)
    assert checked == count > 0, (checked, count)
    return {"graph": name, "store": store, "batches": checked, "edges": edges}


def check_hops(d, what):
    """edge_index is hop by hop: hop k's edges are block L-k's edges into
    the nodes that hop k-1 reached."""
    L = len(d.blocks)
    assert sum(d.num_sampled_nodes) == d.x.size(0) == d.n_id.numel(), what
    assert sum(d.num_sampled_edges) == d.edge_index.size(1), what
    at, reached = 0, 0
    for k in range(1, L + 1):
        e, (num_src, num_dst) = d.blocks[L - k]
        into = (e[1] >= reached) & (e[1] < num_dst)
        want = e[:, into]
        got = d.edge_index[:, at : at + d.num_sampled_edges[k - 1]]
        assert torch.equal(got, want), f"{what}: hop {k}'s edges"
        assert d.num_sampled_nodes[k] == num_src - num_dst, what
        at += d.num_sampled_edges[k - 1]
        reached = num_dst


def accuracy(model, loader, forward, labels, seeds):
    model.eval()
    right = total = 0
    with torch.no_grad():
        for d in loader:
            pred = forward(model, d).argmax(-1)
            right += int((pred == labels(d)).sum())
            total += seeds(d)
    return right / total


def train_loop(model, manifest, epochs, lr, forward, seed=0,
               labels=lambda d: d.y, seeds=lambda d: d.batch_size):
    """A plain PyTorch loop over the loader; test accuracy at the best
    validation epoch."""
    torch.manual_seed(seed)
    train = offgnn.Loader(manifest, split="train", device="cpu")
    valid = offgnn.Loader(manifest, split="valid", device="cpu")
    test = offgnn.Loader(manifest, split="test", device="cpu")
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    best = (-1.0, 0.0, -1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for epoch in range(epochs):
            train.set_epoch(epoch)
            model.train()
            for d in train:
                opt.zero_grad()
                loss = F.cross_entropy(forward(model, d), labels(d))
                loss.backward()
                opt.step()
            v = accuracy(model, valid, forward, labels, seeds)
            t = accuracy(model, test, forward, labels, seeds)
            if v > best[0]:
                best = (v, t, epoch)
    for l in (train, valid, test):
        l.close()
    return {"valid_acc": best[0], "test_acc": best[1], "best_epoch": best[2]}


def seeds_out(model, d):
    return model(d.x, d.edge_index)[: d.batch_size]


def gcn_jk(bin_dir, manifest, name, min_acc):
    loader = offgnn.Loader(manifest, split="test", device="cpu")
    model = GCN(loader.num_features, 64, num_layers=2, out_channels=loader.num_classes,
                dropout=0.5, jk="cat")
    r = train_loop(model, manifest, 30, 0.01, seeds_out)
    assert r["test_acc"] >= min_acc, f"GCN-JK on {name}: test accuracy {r['test_acc']:.4f} < {min_acc}"
    return {"graph": name, "model": "GCN jk=cat", "min_acc": min_acc, **r}


def sage_against_trainer(bin_dir, work):
    """PyG's GraphSAGE through the loader against `trainer --model sage`,
    same hyper-parameters, on a graph with 6000 test nodes."""
    dataset = os.path.join(work, "sage", "dataset")
    run(bin_dir, "sampler", "generate", "--out", dataset, "--nodes", 60000,
        "--feature-dim", 32, "--classes", 8, "--overwrite")
    manifest = pack(bin_dir, work, "sage", dataset, fanout="5,10", batch=512, epochs=2)
    hidden, epochs, lr = 64, 8, 0.003
    ours = run(bin_dir, "trainer", "--manifest", manifest, "--model", "sage",
               "--hidden", hidden, "--epochs", epochs, "--lr", lr, "--dropout", 0.5)["summary"]
    loader = offgnn.Loader(manifest, split="test", device="cpu")
    model = GraphSAGE(loader.num_features, hidden, num_layers=2,
                      out_channels=loader.num_classes, dropout=0.5)
    r = train_loop(model, manifest, epochs, lr, seeds_out)
    trainer_acc = ours["test_acc_at_best_valid"]
    gap = trainer_acc - r["test_acc"]
    assert gap <= SAGE_MAX_GAP, (
        f"PyG GraphSAGE through the loader: test accuracy {r['test_acc']:.4f}, "
        f"the trainer's {trainer_acc:.4f}: more than {SAGE_MAX_GAP} under")
    return {"graph": "generated-60000", "model": "PyG GraphSAGE", "trainer_test_acc": trainer_acc,
            "gap": gap, **r}


def no_threads_left(manifest):
    """Check 4: leaving a pass any way joins its threads."""
    loader = offgnn.Loader(manifest, split="train", device="cpu", prefetch=1)
    n = len(loader)
    assert n == sum(1 for _ in loader) > 1, n
    base = quiet_threads()
    for _ in loader:
        assert threads() > base
        break
    assert settles_to(base), ("a loop left early", threads(), base)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        loader.set_epoch(5)
        loader.set_epoch(6)
    assert len(said) == 1 and "past the layout's" in str(said[0].message), said
    assert len(loader) == n
    with offgnn.Loader(manifest, split="train", device="cpu") as l2:
        it = iter(l2)
        next(it)
    assert settles_to(base), ("a with block left mid-pass", threads(), base)
    try:
        next(it)
        raise AssertionError("a pass went on after its loader was closed")
    except ValueError as e:
        assert str(e) == "the loader was closed during this pass", e
    try:
        iter(l2).__next__()
        raise AssertionError("a closed loader iterated")
    except ValueError as e:
        assert str(e) == "the loader is closed", e
    it = iter(loader)
    next(it)
    loader.close()
    del it, loader
    return {"batches": n, "threads": base, "after_close": threads()}


def one_pass_at_a_time(manifest):
    """An iterator a newer pass replaced raises, and dropping it leaves
    the newer pass whole. NumPy's integers are whole numbers too."""
    loader = offgnn.Loader(manifest, split="train", device="cpu", prefetch=np.int64(2),
                           epoch=np.int64(0))
    n = len(loader)
    stale = iter(loader)
    next(stale)
    got = 0
    for i, _ in enumerate(loader):
        got += 1
        if i == 1:
            del stale
    assert got == n, ("a dropped iterator ended the newer pass", got, n)
    outer = iter(loader)
    next(outer)
    assert sum(1 for _ in loader) == n
    try:
        next(outer)
        raise AssertionError("a replaced pass went on")
    except RuntimeError as e:
        assert "a newer pass over this loader ended this one" in str(e), e
    loader.close()
    return {"batches": n}


CTRL_C = r"""
import faulthandler, json, os, signal, sys, time
import offgnn
# Where each thread is, on SIGUSR1: what a check that times out reports.
faulthandler.register(signal.SIGUSR1, all_threads=True)
# Ctrl-C raises KeyboardInterrupt, as in an interactive Python, even when
# this runs under a background job (a non-interactive shell starts those
# with SIGINT ignored, and Python then leaves it ignored).
signal.signal(signal.SIGINT, signal.default_int_handler)
loader = offgnn.Loader(sys.argv[1], split="train", device="cpu", prefetch=1)
def names():
    return [open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task")]
for _ in loader:
    pass
# The pass's thread, joined, leaves /proc a moment later.
while "offgnn-loader" in names():
    time.sleep(0.005)
base = len(names())
try:
    while True:
        for k, d in enumerate(loader):
            if k == 1:
                print("in a pass", flush=True)
            time.sleep(0.02)
except KeyboardInterrupt:
    t = time.monotonic()
    while len(os.listdir("/proc/self/task")) > base and time.monotonic() - t < 5:
        time.sleep(0.01)
    print(json.dumps({"threads_after": len(os.listdir("/proc/self/task")), "base": base,
                      "joined_s": time.monotonic() - t}), flush=True)
"""


def ctrl_c(manifest):
    p = subprocess.Popen([sys.executable, "-c", CTRL_C, manifest], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "in a pass"
    p.send_signal(signal.SIGINT)
    # The threads' joining is timed inside (joined_s); the wait here only
    # bounds a child that never exits, and says where its threads are.
    try:
        out, err = p.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        tasks = {}
        for t in os.listdir(f"/proc/{p.pid}/task"):
            with open(f"/proc/{p.pid}/task/{t}/comm") as f, open(f"/proc/{p.pid}/task/{t}/wchan") as w:
                tasks[t] = (f.read().strip(), w.read().strip())
        p.send_signal(signal.SIGUSR1)
        time.sleep(1)
        p.kill()
        out, err = p.communicate()
        raise AssertionError(f"no exit 120 s after Ctrl-C; threads {tasks}; stdout {out!r}; stderr {err[-6000:]}")
    assert p.returncode == 0, err
    r = json.loads(out.strip().splitlines()[-1])
    assert r["threads_after"] == r["base"] and r["joined_s"] < 1.0, r
    return r


def typed_batches(bin_dir, work):
    """A typed layout (IGBH's schema, types of different widths): the
    loader's HeteroData batches equal the trainer's
    `--dump-batches` (each type's rows and node ids, every relation's edges
    in every block, the labels), each type's rows are its feature file's
    rows of its node ids, and each relation's edge_index is hop by hop."""
    d = os.path.join(work, "typed")
    ds = os.path.join(d, "igbh")
    run(bin_dir, "sampler", "generate", "--schema", "igbh", "--nodes", 3000, "--feature-dim", 16,
        "--type-dims", "author=8,fos=4,institute=6", "--classes", 4,
        "--out", ds, "--overwrite")
    run(bin_dir, "sampler", "--dataset", ds, "--fanout", "5,3", "--batch-size", 128,
        "--epochs", 2, "--out", os.path.join(d, "samples"), "--overwrite")
    run(bin_dir, "packer", "--samples", os.path.join(d, "samples"), "--out",
        os.path.join(d, "pack"), "--gpu-cache", "8K", "--cpu-cache", "16K",
        "--disk-budget", "10x", "--overwrite")
    manifest = os.path.join(d, "pack", "manifest.json")
    dump_path = os.path.join(d, "dump.safetensors")
    run(bin_dir, "trainer", "--manifest", manifest, "--model", "sage", "--epochs", 1,
        "--hidden", 16, "--dump-batches", dump_path, "--dump-count", 3)
    dump = load_file(dump_path)
    loader = offgnn.Loader(manifest, split="test", device="cpu")
    assert loader.target == "paper" and set(loader.num_features) >= {"paper", "author"}
    # The statement: refused under it, opened at it.
    stated = loader.memory_bytes
    assert isinstance(stated, int) and stated > 0, stated
    try:
        offgnn.Loader(manifest, device="cpu", memory=stated - 1)
        raise AssertionError("a typed loader under its statement was not refused")
    except MemoryError as e:
        assert "\n" not in str(e) and "this loader needs up to" in str(e), str(e)
    offgnn.Loader(manifest, device="cpu", memory=stated).close()
    feats = {t: np.load(os.path.join(ds, "data", f"{t}-feat.npy"), mmap_mode="r")
             for t in ("paper", "author", "institute", "fos")}
    checked, types, keys = 0, [], []
    for k, h in enumerate(loader):
        b = f"batch{k}"
        if f"{b}.labels" not in dump:
            break
        what = f"typed batch {k}"
        types = list(h.node_types)
        for t in types:
            assert torch.equal(h[t].x, dump[f"{b}.x.{t}"]), f"{what}: {t} rows differ"
            assert torch.equal(h[t].n_id, dump[f"{b}.n_id.{t}"]), f"{what}: {t} ids differ"
            if t in feats:
                rows = torch.from_numpy(np.asarray(feats[t][h[t].n_id.numpy()]))
                assert torch.equal(h[t].x, rows.float()), f"{what}: {t} rows are not the file's"
            assert sum(h[t].num_sampled_nodes) == h[t].x.size(0), what
        assert torch.equal(h["paper"].y, dump[f"{b}.labels"]), f"{what}: labels differ"
        keys = list(h.blocks[0][0])
        L = len(h.blocks)
        for l, (edges, num_src, num_dst) in enumerate(h.blocks):
            assert dump[f"{b}.block{l}.num_dst"].tolist() == [num_dst[t] for t in types], what
            for r, key in enumerate(keys):
                want = torch.stack([dump[f"{b}.block{l}.rel{r}.src"],
                                    dump[f"{b}.block{l}.rel{r}.dst"]])
                assert torch.equal(edges[key], want), f"{what} block {l} {key}: edges differ"
        for key in keys:
            dst = key[2]
            at, reached = 0, 0
            ei, counts = h[key].edge_index, h[key].num_sampled_edges
            for hop in range(1, L + 1):
                edges, _, num_dst = h.blocks[L - hop]
                e = edges[key]
                into = (e[1] >= reached) & (e[1] < num_dst[dst])
                assert torch.equal(ei[:, at:at + counts[hop - 1]], e[:, into]), (what, key, hop)
                at += counts[hop - 1]
                reached = num_dst[dst]
            assert at == ei.size(1), (what, key)
        checked += 1
    loader.close()
    assert checked == 3, checked
    return manifest, {"graph": "igbh-3000", "batches": checked, "types": len(types),
                      "relations": len(keys)}


def hetero_model(manifest, min_acc):
    """A PyG `HeteroConv` model (SAGEConv per relation, summed), trained
    with a plain loop over the typed loader."""
    loader = offgnn.Loader(manifest, split="test", device="cpu")
    first = next(iter(loader))
    relations = list(first.edge_index_dict)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.convs = torch.nn.ModuleList([
                HeteroConv({r: SAGEConv((-1, -1), 32) for r in relations}, aggr="sum")
                for _ in range(2)])
            self.lin = Linear(32, loader.num_classes)

        def forward(self, h):
            x = h.x_dict
            for conv in self.convs:
                x = {t: F.relu(v) for t, v in conv(x, h.edge_index_dict).items()}
            return self.lin(x[h.target][: h[h.target].batch_size])

    torch.manual_seed(0)
    net = Net()
    net(first)  # PyG's lazy widths
    hetero_out = lambda model, h: model(h)  # noqa: E731
    r = train_loop(net, manifest, 10, 0.01, hetero_out, labels=lambda h: h[h.target].y,
                   seeds=lambda h: h[h.target].batch_size)
    assert r["test_acc"] >= min_acc, f"HeteroConv: test accuracy {r['test_acc']:.4f} < {min_acc}"
    return {"graph": "igbh-3000", "model": "HeteroConv(SAGEConv)", "min_acc": min_acc, **r}


SEEDS = r"""
import json, sys
import offgnn
loader = offgnn.Loader(sys.argv[1], split=sys.argv[2], epoch=int(sys.argv[3]), device="cpu")
print(json.dumps([d.n_id[: d.batch_size].tolist() for d in loader]))
"""


def rank_shares(manifest):
    """Under torchrun's variables, each of two ranks reads its share of an
    epoch as the trainer deals it (DistributedSampler's padding: each rank
    the same number of batches, the order's first batches again where the
    world does not divide it), past the sampled epochs too; and its part
    of the evaluation batches, each batch once."""
    def seeds(split, epoch, rank=None):
        env = dict(os.environ)
        if rank is not None:
            env.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank),
                       MASTER_ADDR="127.0.0.1", MASTER_PORT="29500")
        done = subprocess.run([sys.executable, "-c", SEEDS, manifest, split, str(epoch)],
                              capture_output=True, text=True, env=env)
        assert done.returncode == 0, done.stderr
        return [tuple(b) for b in json.loads(done.stdout.strip().splitlines()[-1])]
    out = {}
    for split, epoch in (("train", 0), ("train", 3), ("test", 0)):
        whole = seeds(split, epoch)
        shares = [seeds(split, epoch, r) for r in (0, 1)]
        got, n = shares[0] + shares[1], len(whole)
        what = f"{split} epoch {epoch}: ranks read {[len(s) for s in shares]} of {n} batches"
        if split != "train":
            assert got == whole, what
        else:
            steps = -(-n // 2)
            assert [len(s) for s in shares] == [steps, steps], what
            assert set(got) == set(whole), what
            if epoch == 0:
                assert got == [whole[i % n] for i in range(2 * steps)], what
        out[f"{split}{epoch}"] = [len(s) for s in shares]
    return out


def refusals(manifest, work):
    cases = [
        (lambda: offgnn.Loader(os.path.join(work, "missing", "manifest.json"), device="cpu"),
         RuntimeError),
        (lambda: offgnn.Loader(manifest, device="cpu", memory="1M"), MemoryError),
        (lambda: offgnn.Loader(manifest, device="tpu"), ValueError),
        (lambda: offgnn.Loader(manifest, device="cpu", prefetch=0), ValueError),
        (lambda: offgnn.Loader(manifest, device="cpu", prefetch=-1), ValueError),
        (lambda: offgnn.Loader(manifest, split="training", device="cpu"), ValueError),
        (lambda: offgnn.Loader(manifest, device="cpu").set_epoch("a"), ValueError),
        (lambda: offgnn.Loader(manifest, device="cpu").set_epoch(2**32), ValueError),
        (lambda: offgnn.Loader(manifest, device="cpu", memory=1.5), ValueError),
        (lambda: offgnn.Loader(manifest, device="cpu", seed=-1), ValueError),
    ]
    lines = []
    for make, kind in cases:
        try:
            make()
        except kind as e:
            line = str(e)
            assert line and "\n" not in line, repr(line)
            lines.append(line)
        else:
            raise AssertionError(f"no {kind.__name__}")
    return lines


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bin-dir", required=True)
    p.add_argument("--work", required=True)
    p.add_argument("--cora-dir", required=True)
    a = p.parse_args()
    torch.set_num_threads(2)
    gen = generated(a.bin_dir, a.work)
    cora = os.path.join(a.work, "cora", "dataset")
    run(a.bin_dir, "sampler", "import-parquet", "--preset", "cora",
        "--nodes", os.path.join(a.cora_dir, "cora_nodes.parquet.gzip"),
        "--edges", os.path.join(a.cora_dir, "cora_rels.parquet.gzip"),
        "--out", cora, "--overwrite")
    out = {"torch": torch.__version__, "same_batches": [], "accuracy": []}
    for name, dataset in (("generated", gen), ("cora", cora)):
        manifest = pack(a.bin_dir, a.work, name, dataset)
        out["same_batches"].append(same_batches(a.bin_dir, a.work, name, dataset, manifest, "f32"))
        if name == "generated":
            f16 = pack(a.bin_dir, a.work, name, dataset, "--store-dtype", "f16")
            out["same_batches"].append(same_batches(a.bin_dir, a.work, name, dataset, f16, "f16"))
            out["threads"] = no_threads_left(manifest)
            out["one_pass"] = one_pass_at_a_time(manifest)
            out["ctrl_c"] = ctrl_c(manifest)
            out["ranks"] = rank_shares(manifest)
            out["refusals"] = refusals(manifest, a.work)
        min_acc = GCN_CORA_MIN_ACC if name == "cora" else GCN_GENERATED_MIN_ACC
        out["accuracy"].append(gcn_jk(a.bin_dir, manifest, name, min_acc))
        print(json.dumps(out["accuracy"][-1]), file=sys.stderr)
    typed, out["typed"] = typed_batches(a.bin_dir, a.work)
    out["accuracy"].append(hetero_model(typed, HETERO_MIN_ACC))
    out["accuracy"].append(sage_against_trainer(a.bin_dir, a.work))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
