"""One timed pass for scripts/bench-loader, as the MODE says:

  loader    a Python loop over offgnn.Loader with a model that does nothing
  pipeline  the trainer's pipeline alone on the same layout, in Rust, each
            batch dropped where the model step would take it
  memmap    what a PyG user writes today: each batch's input rows gathered
            from the feature file memory-mapped with numpy (the node ids of
            the same batches, taken from a loader pass beforehand, untimed;
            no sampling is timed, which favours this loop)

Prints one JSON line: mode, batches, seconds, batches per second, input
rows, and the process's peak RSS.
"""

import argparse
import json
import resource
import time

import numpy as np
import torch

import offgnn


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("mode", choices=["loader", "pipeline", "memmap"])
    p.add_argument("--manifest", required=True)
    p.add_argument("--features", required=True)
    a = p.parse_args()
    torch.set_num_threads(2)
    loader = offgnn.Loader(a.manifest, split="train", device="cpu")
    rows = 0
    if a.mode == "loader":
        t = time.perf_counter()
        batches = 0
        for d in loader:
            batches += 1
            rows += d.x.size(0)
        seconds = time.perf_counter() - t
    elif a.mode == "pipeline":
        batches, seconds = loader._inner.pipeline_pass("train", 0)
    else:
        ids = [d.n_id.numpy().copy() for d in loader]
        loader.close()
        feat = np.load(a.features, mmap_mode="r")
        t = time.perf_counter()
        for n_id in ids:
            x = torch.from_numpy(feat[n_id])
            rows += x.size(0)
        seconds = time.perf_counter() - t
        batches = len(ids)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"mode": a.mode, "batches": batches, "seconds": seconds,
                      "batches_per_s": batches / seconds, "rows": rows,
                      "peak_rss_bytes": peak, "loader_statement_bytes": loader.memory_bytes}))


if __name__ == "__main__":
    main()
