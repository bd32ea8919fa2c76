"""One timed pass for scripts/bench-loader, as the MODE says:

  loader    a Python loop over offgnn.Loader with a model that does nothing
  pipeline  the trainer's pipeline alone on the same layout, in Rust, each
            batch dropped where the model step would take it
  memmap    what a PyG user writes today: each batch's input rows gathered
            from the feature file memory-mapped with numpy (the node ids of
            the same batches, taken from a loader pass beforehand, untimed;
            no sampling is timed, which favours this loop). A batch takes
            seconds here, so its figure is of MEMMAP_BATCHES batches after
            MEMMAP_WARM untimed ones, not of whole passes
  memmap-random  the same with the mapping advised MADV_RANDOM (no
            read-ahead around each faulting row), as a careful user would

The loader and the pipeline make one untimed pass first (imports, the
caches), then PASSES timed ones, over SPLIT's batches (train by default). Prints one JSON line: mode,
batches, seconds, batches per second, input rows, and the process's peak
RSS.
"""

import argparse
import json
import mmap
import resource
import time

import numpy as np
import torch

import offgnn

MEMMAP_WARM, MEMMAP_BATCHES = 1, 3


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("mode", choices=["loader", "pipeline", "memmap", "memmap-random"])
    p.add_argument("--manifest", required=True)
    p.add_argument("--features", required=True)
    p.add_argument("--passes", type=int, default=2)
    p.add_argument("--split", default="train")
    a = p.parse_args()
    torch.set_num_threads(2)
    loader = offgnn.Loader(a.manifest, split=a.split, device="cpu")
    memmap = a.mode.startswith("memmap")
    if memmap:
        ids = [d.n_id.numpy().copy() for d in loader]
        loader.close()
        feat = np.load(a.features, mmap_mode="r")
        if a.mode == "memmap-random":
            feat._mmap.madvise(mmap.MADV_RANDOM)
        for n_id in ids[:MEMMAP_WARM]:
            torch.from_numpy(feat[n_id])
        ids = ids[MEMMAP_WARM:MEMMAP_WARM + MEMMAP_BATCHES]

    def one_pass():
        batches = rows = 0
        if a.mode == "loader":
            for d in loader:
                batches += 1
                rows += d.x.size(0)
        elif a.mode == "pipeline":
            batches, _ = loader._inner.pipeline_pass(a.split, 0)
        else:
            for n_id in ids:
                x = torch.from_numpy(feat[n_id])
                batches += 1
                rows += x.size(0)
        return batches, rows

    if not memmap:
        one_pass()
    t = time.perf_counter()
    batches = rows = 0
    for _ in range(1 if memmap else a.passes):
        b, r = one_pass()
        batches, rows = batches + b, rows + r
    seconds = time.perf_counter() - t
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"mode": a.mode, "batches": batches, "seconds": seconds,
                      "batches_per_s": batches / seconds, "rows": rows,
                      "peak_rss_bytes": peak, "loader_statement_bytes": loader.memory_bytes}))


if __name__ == "__main__":
    main()
