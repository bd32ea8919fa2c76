"""An offgnn typed dataset as DGL 2.1 takes it, shared by the typed DGL
benchmark scripts: the heterograph of every relation (repeated edges kept
once, as offgnn's sampler keeps them) and each type's features."""
import os

import numpy as np
import torch
import yaml


def load(root):
    """metadata.yaml as parsed, the heterograph, and {type: features}."""
    import dgl  # after the caller's thread settings

    with open(os.path.join(root, "metadata.yaml")) as f:
        meta = yaml.safe_load(f)
    counts = {n["type"]: n["num"] for n in meta["graph"]["nodes"]}
    data = {}
    for e in meta["graph"]["edges"]:
        s, r, d = e["type"].split(":")
        ei = np.load(os.path.join(root, e["path"]))
        data[(s, r, d)] = (torch.from_numpy(ei[0].astype(np.int64)), torch.from_numpy(ei[1].astype(np.int64)))
    g = dgl.to_simple(dgl.heterograph(data, num_nodes_dict=counts), copy_ndata=False)
    feats = {
        fd["type"]: torch.from_numpy(np.load(os.path.join(root, fd["path"])).astype(np.float32))
        for fd in meta["feature_data"]
        if fd["name"] == "feat"
    }
    return meta, g, feats
