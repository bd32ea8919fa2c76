"""DGL's CPU neighbor sampler on an offgnn dataset, for sampler/benches/sampling.rs.

Loads the [2, E] edge array into a DGL graph, then times
NeighborSampler(fanouts).sample_blocks over the given seed batches.
Prints one JSON line: batches, edges (sampled), seconds.
"""
import argparse
import json
import os
import time

import numpy as np
import torch
import yaml

ap = argparse.ArgumentParser()
ap.add_argument("--dataset", required=True)
ap.add_argument("--seeds", required=True)
ap.add_argument("--batch-size", type=int, default=1024)
ap.add_argument("--fanouts", default="10,15,20")
ap.add_argument("--threads", type=int, default=1)
args = ap.parse_args()

torch.set_num_threads(args.threads)
os.environ["OMP_NUM_THREADS"] = str(args.threads)
import dgl  # noqa: E402  (after the thread settings)

with open(os.path.join(args.dataset, "metadata.yaml")) as f:
    meta = yaml.safe_load(f)
edges = np.load(os.path.join(args.dataset, meta["graph"]["edges"][0]["path"]), mmap_mode="r")
n = meta["graph"]["nodes"][0]["num"]
g = dgl.graph((torch.from_numpy(np.ascontiguousarray(edges[0])), torch.from_numpy(np.ascontiguousarray(edges[1]))), num_nodes=n)
# The graph offgnn samples: repeated edges kept once.
g = dgl.to_simple(g)
g.create_formats_()
sampler = dgl.dataloading.NeighborSampler([int(x) for x in args.fanouts.split(",")])
seeds = torch.from_numpy(np.load(args.seeds))
batches = list(torch.split(seeds, args.batch_size))

sampler.sample_blocks(g, batches[0])  # warm-up
start = time.perf_counter()
total = 0
for b in batches:
    _, _, blocks = sampler.sample_blocks(g, b)
    total += sum(int(blk.num_edges()) for blk in blocks)
seconds = time.perf_counter() - start
print(json.dumps({"batches": len(batches), "edges": total, "seconds": seconds, "threads": args.threads}))
