#!/usr/bin/env bash
# Data-parallel training with torchrun (installed with the torch the trainer
# uses): one trainer process per GPU of this machine, each a rank. torchrun
# sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT, which the
# trainer reads; with --device cuda each rank takes GPU LOCAL_RANK and
# gradients are averaged over NCCL (Gloo with --device cpu). --no-python
# runs the trainer binary itself. The arguments are the trainer's:
#
#   deploy/torchrun.sh --manifest s3://bucket/papers/pack/manifest.json \
#       --local-dir /nvme/papers --model sage --device cuda --epochs 20 \
#       --metrics metrics.jsonl --checkpoint-dir ckpt
#
# Several machines: the same line on each, with NNODES and RDZV (the
# HOST:PORT of one of them) set alike, e.g. NNODES=2 RDZV=node0:29400;
# torchrun's c10d rendezvous forms the job. NPROC=2 runs two processes
# (e.g. on the CPU) where the default is one per visible GPU.
set -euo pipefail
if [ $# = 0 ]; then
  echo "usage: deploy/torchrun.sh TRAINER-ARGS... (see the comment at its top)" >&2
  exit 2
fi

if [ "${NNODES:-1}" = 1 ]; then
  rendezvous=(--standalone)
else
  rendezvous=(--nnodes="$NNODES" --rdzv-backend=c10d --rdzv-id="${RDZV_ID:-offgnn}"
    --rdzv-endpoint="${RDZV:?set RDZV to HOST:PORT of one of the machines, the same on each}")
fi
nproc="${NPROC:-gpu}"
# torchrun's own Python (its script's interpreter) says whether torch sees a GPU.
python="$(sed -n '1s/^#!//p' "$(command -v torchrun)" 2>/dev/null || true)"
if [ "$nproc" = gpu ] && [ -x "${python%% *}" ] &&
  ! $python -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  echo "deploy/torchrun.sh: this machine has no GPU torch can see; set NPROC to the number of processes (e.g. NPROC=2 with --device cpu)" >&2
  exit 2
fi
exec torchrun "${rendezvous[@]}" --nproc-per-node="$nproc" --no-python trainer "$@"
