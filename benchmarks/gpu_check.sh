#!/usr/bin/env bash
# One command for a machine with an NVIDIA GPU: the CUDA tests and the three operator benchmarks
# on the GPU, each step under its own time limit (under 5 minutes in all, issue 10's bound, so
# that a lent machine's 15 minutes leave room to run it again; on one H200, 2026-12-04, the
# tests took 0.4 minutes, 12 message-passing rows with the allocator figure 3.4 minutes over
# two calls, each row in a process of its own, the training step 1.1 with --repeats 3; this
# configuration, with 13 message-passing rows, 4 more on a new graph every call and 6 of
# inference, all in one process each (--same-process), has not run yet), results under $OUT (default
# benchmarks/results/gpu/): gpu_check.log (all output), cuda_tests.txt, and JSON + Markdown +
# PNG per benchmark. benchmarks/results/gpu/README.md says what the last run found.
#
#   bash benchmarks/gpu_check.sh            # uses .venv/bin/python if present, else python3
#
# Runs from the source tree (PYTHONPATH is the repository root: no install needed, only torch,
# torch_geometric, numpy, scipy, tqdm, hypothesis, pytest and matplotlib). Where only 8 files
# come back from a lent machine, add `NO_PNG=1` (the figures are left out; the Markdown files
# hold the same tables), or pack $OUT into one archive afterwards.
#
# Sizes are cut to fit the time: message passing up to 10^5 nodes at d = 64 (Poisson degrees;
# rigid-chunks and default-chunks beside rigid and the default: chunk_size='auto' on a GPU takes
# groups sized by its memory, the whole graph on one H200, against the CPU's recomputed groups of
# 32,768 rows that it took in the first check; PyG's blocks on the flat layout, pyg-flat, ran in
# the first check), the point-cloud training step of the presets at 32 x 1,024 points, and speed.py's
# batches. The message-passing step writes a partial report as it goes (complete it with the
# same command plus --resume); the other steps write their files at their end, so one cut off
# by its time limit writes nothing.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
PY=${PY:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
OUT=${OUT:-benchmarks/results/gpu}
mkdir -p "$OUT"
exec > >(tee "$OUT/gpu_check.log") 2>&1
status=0
$PY -c "import torch, torch_geometric, torch_mz; assert torch.cuda.is_available(), 'no CUDA device'
print(torch.cuda.get_device_name(0), 'torch', torch.__version__, 'torch_geometric',
      torch_geometric.__version__)" || exit 2
echo '== CUDA tests'
# the tests that run on CUDA: attention kernels, forward-mode AD and the per-head attention's
# dropout, the LayerNorm Jacobian (eager and compiled with Triton), MZAggregation, device
# resolution, a training run resumed on CUDA, and the memory bandwidth measured on the GPU
timeout 40 $PY -m pytest -q -p no:cacheprovider -p no:logging tests/nn/test_functional.py \
  tests/nn/test_zonotope.py tests/nn/test_aggr.py tests/train/ tests/study/test_traffic.py \
  -k 'cuda or resolve_device' \
  -rs 2>&1 | tee "$OUT/cuda_tests.txt" || status=1
# The steps that write their files only at their end run first, each with room to finish; the
# message-passing steps, which write a partial report after every row, run last.
echo '== point-cloud training step'
# the presets only: the +keep rows are about the CPU's malloc, the +compile rows compile for
# a minute or more each (1.1 minutes with --repeats 3 on one H200, each preset in a process
# of its own)
timeout 90 $PY benchmarks/training_step.py --device cuda --repeats 2 \
  --models rigid,st-large,mz-slim,mz,egnn --out "$OUT/training_step" || status=1
echo '== speed.py batches'
# without --memory: that measures each configuration in a fresh process (20 of them); the
# message-passing rows below record the GPU allocator's peaks
timeout 40 $PY benchmarks/speed.py --device cuda --repeats 3 --out "$OUT/speed" || status=1
echo '== message passing'
# (--no-allocated: on a GPU the peak is the allocator's already; rigid-chunks and
# default-chunks on 10^4 and 10^5 nodes time the CPU's recomputed groups, which multiply the
# kernel launches (launches.py), against chunk_size='auto' on this GPU)
# --same-process: the rows in this one process (the GPU's peak is the allocator's, reset per
# row), without a CUDA start-up per row; cut off by its limit, the rows measured so far are in
# message_passing.partial.* (the same command with --resume completes it)
timeout 80 $PY benchmarks/message_passing.py --device cuda --nodes 1000,10000,100000 --dims 64 \
  --degrees poisson --aggrs pyg,rigid,rigid-chunks,default,default-chunks \
  --ckpt-dims 64 \
  --ckpt-min-nodes 10000 --graphconv-nodes 0 --repeats 3 --no-allocated --same-process \
  --out "$OUT/message_passing" || status=1
echo '== message passing, a new graph every call'
# (the rows above run every call on the graph of the call before, as full-batch training does,
# and find their attention layouts again; a new mini-batch each step computes them every call)
timeout 20 $PY benchmarks/message_passing.py --device cuda --nodes 1000,10000 --dims 64 \
  --degrees poisson --aggrs pyg,rigid --graphconv-nodes 0 --repeats 3 --same-process \
  --no-allocated --new-graph --out "$OUT/message_passing_new_graph" || status=1
echo '== message passing, inference'
# (one forward pass in eval() mode without gradients, full-graph inference after training)
timeout 20 $PY benchmarks/message_passing.py --device cuda --nodes 1000,10000,100000 --dims 64 \
  --degrees poisson --aggrs pyg,rigid --graphconv-nodes 0 --repeats 3 --same-process \
  --no-allocated --inference --out "$OUT/message_passing_inference" || status=1
if [ "${NO_PNG:-0}" = 1 ]; then
  rm -f "$OUT"/*/*.png
fi
echo "results in $OUT (exit $status)"
exit $status
