"""offgnn.Loader on a GPU: run by scripts/gpu-check-device on the device.

The device machine has torch but maybe not PyTorch Geometric, so this
imports the extension (``_offgnn``, from --module-dir) without the
``offgnn`` package and reads its batches as the package does (DLPack
capsules to tensors). For each layout given:

1. every batch of the test split read with ``device`` equals the same
   batch read with ``device="cpu"``, tensor for tensor and bit for bit,
   and each tensor that the package places on the device is there;
2. the loader's rate on each (batches a second, after the first);

and on the first layout (homogeneous, node labels), a model offgnn does
not ship, written here in plain PyTorch (two rounds of mean aggregation
over each batch's ``edge_index``, a linear layer on the seeds), trains
for a few epochs on the device through the loader: its loss falls and its
test accuracy is printed.

Prints one JSON line of figures last; exits 1 when a check fails.
"""

import argparse
import importlib.machinery
import importlib.util
import json
import os
import sys
import time

import torch


def load_extension(module_dir):
    """The `_offgnn` extension in `module_dir`, imported on its own."""
    path = next(
        os.path.join(module_dir, f)
        for f in sorted(os.listdir(module_dir))
        if f.startswith("_offgnn") and f.endswith(".so")
    )
    loader = importlib.machinery.ExtensionFileLoader("_offgnn", path)
    spec = importlib.util.spec_from_file_location("_offgnn", path, loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def tensors(value):
    """`value` with every DLPack capsule made a tensor (no copy)."""
    if type(value).__name__ == "PyCapsule":
        return torch.utils.dlpack.from_dlpack(value)
    if isinstance(value, dict):
        return {k: tensors(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [tensors(v) for v in value]
    return value


def flatten(value, prefix=""):
    """(path, tensor) of every tensor in `value`, in order."""
    if isinstance(value, torch.Tensor):
        yield prefix, value
    elif isinstance(value, dict):
        for k in sorted(value):
            yield from flatten(value[k], f"{prefix}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from flatten(v, f"{prefix}[{i}]")


def batches(ext, manifest, device, split, epoch=0):
    inner = ext.Loader(manifest, device, None, None, 2, 0, None, None)
    inner.start(split, epoch)
    out, started, first = [], time.perf_counter(), None
    while True:
        d = inner.next()
        if d is None:
            break
        out.append(tensors(d))
        if first is None:
            first = time.perf_counter()
    done = time.perf_counter()
    inner.stop()
    inner.close()
    rate = (len(out) - 1) / (done - first) if len(out) > 1 and done > first else None
    return out, {"batches": len(out), "seconds": done - started, "batches_per_s_after_first": rate}


def compare(manifest, ext, device):
    on_device, rate_device = batches(ext, manifest, device, "test")
    on_cpu, rate_cpu = batches(ext, manifest, "cpu", "test")
    problems = []
    if len(on_device) != len(on_cpu):
        problems.append(f"{len(on_device)} batches on {device}, {len(on_cpu)} on the CPU")
    placed = 0
    for i, (a, b) in enumerate(zip(on_device, on_cpu)):
        fa, fb = list(flatten(a)), list(flatten(b))
        if [p for p, _ in fa] != [p for p, _ in fb]:
            problems.append(f"batch {i}: fields differ")
            continue
        for (path, x), (_, y) in zip(fa, fb):
            if x.device.type == device:
                placed += 1
            if x.dtype != y.dtype or x.shape != y.shape or not torch.equal(x.cpu(), y):
                problems.append(f"batch {i} {path}: {device} and the CPU differ")
    if device != "cpu" and placed == 0:
        problems.append(f"no tensor of any batch is on {device}")
    return {
        "manifest": manifest,
        "device": rate_device,
        "cpu": rate_cpu,
        "tensors_on_device": placed,
        "problems": problems[:20],
    }


class MeanSage(torch.nn.Module):
    """Two rounds of mean aggregation over a batch's edges, then a linear
    layer on the seeds: a model of the user's, not one offgnn ships."""

    def __init__(self, dim, hidden, classes):
        super().__init__()
        self.a = torch.nn.Linear(2 * dim, hidden)
        self.b = torch.nn.Linear(2 * hidden, hidden)
        self.out = torch.nn.Linear(hidden, classes)

    @staticmethod
    def mean(h, edge_index):
        src, dst = edge_index[0], edge_index[1]
        total = torch.zeros_like(h).index_add_(0, dst, h[src])
        count = torch.zeros(h.shape[0], device=h.device).index_add_(
            0, dst, torch.ones_like(dst, dtype=h.dtype)
        )
        return total / count.clamp(min=1).unsqueeze(1)

    def forward(self, x, edge_index, seeds):
        h = torch.relu(self.a(torch.cat([x, self.mean(x, edge_index)], 1)))
        h = torch.relu(self.b(torch.cat([h, self.mean(h, edge_index)], 1)))
        return self.out(h[:seeds])


def train(ext, manifest, device, epochs):
    info = ext.Loader(manifest, device, None, None, 2, 0, None, None)
    meta = info.info()
    info.close()
    model = MeanSage(meta["feature_dim"], 64, meta["num_classes"]).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    losses = []
    for epoch in range(epochs):
        total, n = 0.0, 0
        for d in batches(ext, manifest, device, "train", epoch)[0]:
            seeds = d["batch_size"]
            logits = model(d["x"], d["edge_index"], seeds)
            loss = torch.nn.functional.cross_entropy(logits, d["y"][:seeds])
            opt.zero_grad()
            loss.backward()
            opt.step()
            total, n = total + loss.item(), n + 1
        losses.append(total / max(n, 1))
    right = seen = 0
    with torch.no_grad():
        for d in batches(ext, manifest, device, "test")[0]:
            seeds = d["batch_size"]
            pred = model(d["x"], d["edge_index"], seeds).argmax(1)
            right += int((pred == d["y"][:seeds]).sum())
            seen += seeds
    return {"losses": losses, "test_accuracy": right / max(seen, 1)}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--module-dir", required=True)
    p.add_argument("--device", default="cuda")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("manifests", nargs="+")
    a = p.parse_args()
    ext = load_extension(a.module_dir)
    report = {"device": a.device, "torch": torch.__version__, "layouts": []}
    failed = False
    for m in a.manifests:
        try:
            r = compare(m, ext, a.device)
        except Exception as e:  # one layout's failure is reported, not fatal
            r = {"manifest": m, "problems": [f"{type(e).__name__}: {e}"]}
        failed |= bool(r["problems"])
        report["layouts"].append(r)
    t = train(ext, a.manifests[0], a.device, a.epochs)
    if not t["losses"][-1] < t["losses"][0]:
        failed = True
        t["problem"] = "the loss did not fall"
    report["train"] = t
    print(json.dumps(report))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
