"""``offgnn.Loader``: a packed layout's mini-batches as PyTorch Geometric
``Data``, read and assembled ahead of the Python loop by the trainer's
pipeline in Rust (``offgnn._offgnn``)."""

import operator
import os
import warnings

import torch
from torch_geometric.data import Data, HeteroData

from offgnn import _offgnn


def _tensor(capsule):
    # DLPack: the tensor is libtorch's own, no copy.
    return torch.utils.dlpack.from_dlpack(capsule)


def _edge_labels(store, d):
    # LinkNeighborLoader's names (binary labels), and each pair's query.
    store.edge_label_index = _tensor(d["edge_label_index"])
    store.edge_label = _tensor(d["edge_label"])
    store.edge_label_query = _tensor(d["edge_label_query"])


def _hetero(d):
    data = HeteroData()
    for t in d["types"]:
        store = data[t["name"]]
        store.x = _tensor(t["x"])
        store.n_id = _tensor(t["n_id"])
        store.num_sampled_nodes = t["num_sampled_nodes"]
    target = data[d["target"]]
    target.batch_size = d["batch_size"]
    if "link" in d:
        _edge_labels(data[tuple(d["link"]["key"])], d["link"])
    else:
        target.y = _tensor(d["y"])
    for r in d["relations"]:
        store = data[tuple(r["key"])]
        store.edge_index = _tensor(r["edge_index"])
        store.num_sampled_edges = r["num_sampled_edges"]
    keys = [tuple(r["key"]) for r in d["relations"]]
    names = [t["name"] for t in d["types"]]
    data.blocks = [
        ({k: _tensor(e) for k, e in zip(keys, edges)}, dict(zip(names, num_src)),
         dict(zip(names, num_dst)))
        for edges, num_src, num_dst in d["blocks"]
    ]
    data.target = d["target"]
    return data


SPLITS = ("train", "valid", "test")


def _whole(name, value, most, least=0, unit=""):
    # A Python or NumPy integer in [least, most], else a ValueError.
    try:
        if isinstance(value, bool):
            raise TypeError
        v = operator.index(value)
    except TypeError:
        raise ValueError(f"{name} {value!r}: expected a whole number{unit}") from None
    if not least <= v <= most:
        raise ValueError(f"{name} {v}: expected a whole number{unit} from {least} to {most}")
    return v


class Loader:
    """Iterates the mini-batches of one split of a packed layout.

    ``manifest`` is the layout's ``manifest.json`` (a path, or a URL of an
    object store, staged into ``local_dir``). Each item is a
    ``torch_geometric.data.Data`` in ``NeighborLoader``'s convention:

    - ``x``: the input rows, float32 on ``device`` (widened from a layout
      stored as float16 or bfloat16); row ``i`` is node ``n_id[i]``, the
      ``batch_size`` seeds first;
    - ``edge_index``: ``[2, E]`` (source, destination) local ids, each
      node's in-edges as sampled at the hop that reached it, hop by hop;
    - ``y``: the seeds' labels; ``n_id``: global node ids (on the CPU);
    - ``num_sampled_nodes``, ``num_sampled_edges``: per hop, for PyG's
      ``trim_to_layer``;
    - ``blocks``: each layer's message-flow graph, input layer first, as
      ``(edge_index, (num_src, num_dst))``, destinations the first
      ``num_dst`` sources.

    A typed layout (R-SAGE's and R-GAT's) yields ``HeteroData`` the same
    way: per node type ``x`` (``[n, 0]`` for a type without features),
    ``n_id`` (type-local ids) and ``num_sampled_nodes``; the seeds' type
    also ``y`` and ``batch_size``; per relation ``(src, rel, dst)``
    ``edge_index`` (positions among its types' rows, hop by hop) and
    ``num_sampled_edges``; ``blocks`` per layer ``(edge_index per relation,
    num_src per type, num_dst per type)``. ``target`` names the seeds' type.

    A link-prediction layout (``sampler --task link``; ``task`` is then
    ``"link"``) yields its batches as ``LinkNeighborLoader`` does with
    binary negative sampling: the seeds are the distinct endpoints of the
    batch's pairs, and instead of ``y`` there are ``edge_label_index``
    (``[2, P]``: each pair's endpoints as rows of ``x``), ``edge_label``
    (float32, 1 an edge and 0 a negative) and ``edge_label_query`` (the
    query each pair is ranked in: a held-out edge and its given negatives
    share one, numbered within the batch). A typed layout puts them on the
    relation the pairs are of (``link_edge_type``), the endpoints as rows
    of its source and destination types.

    ``split`` is ``"train"``, ``"valid"`` or ``"test"``. Training batches
    come in the order the trainer reads epoch ``epoch`` (``set_epoch``);
    past the sampled epochs they are the sampled ones again, reshuffled per
    epoch with ``seed`` as the trainer does (a typed layout's replayed in
    their sampled order, as the trainer does). Under torchrun or srun, each
    rank reads its share, as the trainer deals it. ``memory`` (bytes, or
    text such as ``"8G"``) refuses a layout whose loader would need more;
    ``prefetch`` is how many finished batches wait ahead of the loop.

    Iterating starts a pass on background threads; leaving the loop early
    or a KeyboardInterrupt stops them and joins them before returning.
    A loader runs one pass at a time: a new pass ends an unfinished one,
    whose iterator then raises ``RuntimeError`` (open a second loader to
    read two passes at once). ``close()`` (or the end of a ``with`` block)
    also lets the layout go; an iterator of the pass it ended raises
    ``ValueError``.
    """

    def __init__(
        self,
        manifest,
        split="train",
        epoch=0,
        device="cuda",
        local_dir=None,
        memory=None,
        prefetch=2,
        seed=0,
    ):
        if split not in SPLITS:
            raise ValueError(f'split {split!r}: expected "train", "valid" or "test"')
        prefetch = _whole("prefetch", prefetch, 2**32 - 1, least=1, unit=" of batches")
        seed = _whole("seed", seed, 2**64 - 1)
        if isinstance(device, torch.device):
            device = str(device)
        if memory is not None and not isinstance(memory, str):
            memory = str(_whole("memory", memory, 2**64 - 1, unit=' of bytes, or text such as "8G"'))
        if local_dir is not None:
            local_dir = os.fspath(local_dir)
        self._inner = _offgnn.Loader(
            os.fspath(manifest), device, local_dir, memory, prefetch, seed, None, None
        )
        info = self._inner.info()
        #: The feature width; of a typed layout, a dict of each type's.
        self.num_features = info["feature_dim"]
        #: The seeds' node type (typed layouts), else None.
        self.target = info.get("target")
        self.num_classes = info["num_classes"]
        self.num_nodes = info["num_nodes"]
        #: "node" or "link": what the batches' labels are.
        self.task = info["task"]
        #: A typed link-prediction layout's (src, rel, dst), else None.
        self.link_edge_type = tuple(info["link_edge_type"]) if info.get("link_edge_type") else None
        #: The loader's stated peak host memory, in bytes.
        self.memory_bytes = info["memory_bytes"]
        self.split = split
        self._said_reuse = False
        # Passes started, and whether close() ended this loader.
        self._passes = 0
        self._closed = False
        self._set_epoch(epoch, stacklevel=3)

    def set_epoch(self, epoch):
        """The epoch the next pass reads (training batches' order)."""
        self._set_epoch(epoch, stacklevel=3)

    def _set_epoch(self, epoch, stacklevel):
        # stacklevel: the warning names the user's line, not this module's.
        self.epoch = _whole("epoch", epoch, 2**32 - 1)
        sampled = self._inner.sampled_epochs()
        if self.split == "train" and self.epoch >= sampled and not self._said_reuse:
            self._said_reuse = True
            warnings.warn(
                f"epoch {self.epoch} is past the layout's {sampled} sampled epoch(s): "
                "it reads the sampled batches again, reshuffled (sample more epochs for new ones)",
                stacklevel=stacklevel,
            )

    def __len__(self):
        return self._inner.num_batches(self.split, self.epoch)

    def __iter__(self):
        self._passes += 1
        mine = self._passes
        self._inner.start(self.split, self.epoch)
        try:
            while True:
                if self._passes != mine:
                    raise RuntimeError(
                        "a newer pass over this loader ended this one: a loader runs one pass "
                        "at a time (open a second Loader to read two at once)"
                    )
                d = self._inner.next()
                if d is None:
                    if self._closed:
                        raise ValueError("the loader was closed during this pass")
                    return
                if "types" in d:
                    yield _hetero(d)
                    continue
                data = Data(
                    x=_tensor(d["x"]),
                    edge_index=_tensor(d["edge_index"]),
                    n_id=_tensor(d["n_id"]),
                )
                if "y" in d:
                    data.y = _tensor(d["y"])
                else:
                    _edge_labels(data, d)
                data.batch_size = d["batch_size"]
                data.num_sampled_nodes = d["num_sampled_nodes"]
                data.num_sampled_edges = d["num_sampled_edges"]
                data.blocks = [(_tensor(e), size) for e, size in d["blocks"]]
                yield data
        finally:
            # An iterator a newer pass replaced leaves that pass alone.
            if self._passes == mine:
                self._inner.stop()

    def close(self):
        """Stops a pass in progress and lets the layout go (the I/O
        threads, the caches); the threads are joined on return. A closed
        loader refuses to iterate."""
        self._closed = True
        self._inner.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
