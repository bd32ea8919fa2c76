"""offgnn: out-of-core GNN training on a packed feature layout.

``offgnn.Loader`` reads a layout's mini-batches through the trainer's
pipeline (io_uring reads, the caches, feature assembly and graph loading on
background threads) and yields PyTorch Geometric batches for a model of
your own. See docs/loader.md.
"""

import torch

# The libtorch this module is built against: it runs inside the torch that
# Python imported, so the series must match (scripts/wheel checks that the
# build's torch is of this series).
TORCH_SERIES = "2.11"

if not torch.__version__.startswith(TORCH_SERIES + "."):
    raise ImportError(
        f"offgnn is built for torch {TORCH_SERIES}.*, and this environment has torch "
        f"{torch.__version__}: install torch=={TORCH_SERIES}.* (pip install 'torch=={TORCH_SERIES}.*')"
    )

from offgnn.loader import Loader  # noqa: E402

__all__ = ["Loader", "TORCH_SERIES"]
