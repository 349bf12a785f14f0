#!/usr/bin/env bash
# One command for a machine with an NVIDIA GPU: the CUDA tests, a profile of the point-cloud
# presets and of message passing, speed.py's batches and message passing on the GPU, each step under its own time limit (under 5 minutes in all, issue 10's bound, so
# that a lent machine's 15 minutes leave room to run it again), results under $OUT (default
# a new folder per run, benchmarks/results/gpu_<UTC date>_<time>/, so that a check never
# writes over the committed results of an earlier one, which the benchmarks would refuse as
# another command's: set OUT to go on in a folder, with the steps' --resume where they keep
# a partial report): gpu_check.log (all output), cuda_tests.txt, and JSON + Markdown +
# PNG per benchmark. benchmarks/results/gpu/README.md (one H200, 2026-12-04) and
# benchmarks/results/gpu_h100/README.md (one H100, 2026-12-06) say what the runs found.
# On the H100 the configuration before this one (4.9 minutes in all) lost two steps to their
# limits: the CUDA tests (40 s: 6 of 9 had passed, the first call compiling the Triton
# kernels; the other 3 passed in 5 s after) and training_step.py (90 s for 5 presets, each in
# a fresh process, writing its files only at its end). The step times now come from
# gpu_profile.py, one process that writes its report after every row and also gives the FLOPs,
# the fraction of the matmul peak and the GPU's busy time; this configuration has not run yet.
#
#   bash benchmarks/gpu_check.sh            # uses .venv/bin/python if present, else python3
#   COMPILE=1 bash benchmarks/gpu_check.sh  # and message passing compiled (up to 300 s more)
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
# the first check), the point-cloud training step and inference of the presets at 32 x 1,024
# points (in the profile step; training_step.py no longer runs here), and speed.py's batches. The message-passing step writes a partial report as it goes (complete it with the
# same command plus --resume); the other steps write their files at their end, so one cut off
# by its time limit writes nothing.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
PY=${PY:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
OUT=${OUT:-benchmarks/results/gpu_$(date -u +%Y%m%d_%H%M%S)}
mkdir -p "$OUT"
exec > >(tee "$OUT/gpu_check.log") 2>&1
status=0
$PY -c "import torch, torch_geometric, torch_mz; assert torch.cuda.is_available(), 'no CUDA device'
print(torch.cuda.get_device_name(0), 'torch', torch.__version__, 'torch_geometric',
      torch_geometric.__version__)" || exit 2
echo '== CUDA tests'
# the tests that run on CUDA: attention kernels, forward-mode AD and the per-head attention's
# dropout, the LayerNorm Jacobian (eager and compiled with Triton), MZAggregation, a float16
# model with LayerNorms under autocast to bfloat16, device resolution, a training run resumed
# on CUDA, and the memory bandwidth measured on the GPU
timeout 70 $PY -m pytest -q -p no:cacheprovider -p no:logging tests/nn/test_functional.py \
  tests/nn/test_zonotope.py tests/nn/test_aggr.py tests/train/ tests/study/test_traffic.py \
  -k 'cuda or resolve_device' \
  -rs 2>&1 | tee "$OUT/cuda_tests.txt" || status=1
# The steps that write their files only at their end run first, each with room to finish; the
# message-passing steps, which write a partial report after every row, run last.
echo '== profile: the point-cloud presets and message passing, GPU busy time against wall time'
# (training step and inference of the presets on 32 x 1,024 points, SAGEConv forward +
# backward with PyG, rigid, rigid with its attention buckets merged more freely (fewer kernels)
# and the default on Poisson graphs of 10^3-10^5 nodes at d = 64; one process, the report
# rewritten after every row: 22 s for 10 of these 22 rows on one H100;
# training_step.py --device cuda measures the presets as the CPU runs do, a process per preset)
timeout 55 $PY benchmarks/gpu_profile.py --device cuda --aggrs pyg,rigid,rigid-merged,default \
  --presets rigid,st-large,mz-slim,mz,egnn --out "$OUT/profile" || status=1
echo '== speed.py batches'
# without --memory: that measures each configuration in a fresh process (20 of them); the
# message-passing rows below record the GPU allocator's peaks
timeout 40 $PY benchmarks/speed.py --device cuda --repeats 3 --out "$OUT/speed" || status=1
echo '== message passing'
# (--no-allocated: on a GPU the peak is the allocator's already; rigid-chunks and
# default-chunks on 10^5 nodes time recomputed groups of 262,144 messages, between the whole
# graph that chunk_size='auto' takes on a GPU of 80 GB or more (on one H100 the default's
# peak 14.2 GB at 278 ms, against issue 10's 4 GB) and the CPU's groups of 32,768 (0.83 GB at
# 2.07 s there))
# --same-process: the rows in this one process (the GPU's peak is the allocator's, reset per
# row), without a CUDA start-up per row; cut off by its limit, the rows measured so far are in
# message_passing.partial.* (the same command with --resume completes it)
timeout 65 $PY benchmarks/message_passing.py --device cuda --nodes 1000,10000,100000 --dims 64 \
  --degrees poisson --aggrs pyg,rigid,rigid-chunks,default,default-chunks \
  --ckpt-dims 64 --chunk-rows 262144 \
  --ckpt-min-nodes 100000 --graphconv-nodes 0 --repeats 3 --no-allocated --same-process \
  --out "$OUT/message_passing" || status=1
echo '== message passing, a new graph every call'
# (the rows above run every call on the graph of the call before, as full-batch training does,
# and find their attention layouts again; a new mini-batch each step computes them every call)
timeout 20 $PY benchmarks/message_passing.py --device cuda --nodes 1000,10000 --dims 64 \
  --degrees poisson --aggrs pyg,rigid --graphconv-nodes 0 --repeats 3 --same-process \
  --no-allocated --new-graph --out "$OUT/message_passing_new_graph" || status=1
echo '== message passing, inference'
# (one forward pass in eval() mode without gradients, full-graph inference after training)
timeout 40 $PY benchmarks/message_passing.py --device cuda --nodes 1000,10000,100000 --dims 64 \
  --degrees poisson --aggrs pyg,rigid --graphconv-nodes 0 --repeats 3 --same-process \
  --no-allocated --inference --out "$OUT/message_passing_inference" || status=1
if [ "${COMPILE:-0}" = 1 ]; then
  # COMPILE=1 (outside the 5 minutes above: up to 300 s more): the same graphs with every
  # convolution compiled by torch.compile (inductor), on the small graphs where the eager GPU
  # time is bound by the host (41-51 us a kernel on the H100); on the CPU compiling took the
  # default MZAggregation to 0.64x its eager time (benchmarks/results/message_passing_compile)
  echo '== message passing, compiled (COMPILE=1)'
  timeout 300 $PY benchmarks/message_passing.py --device cuda --compile --nodes 1000,10000 \
    --dims 64 --degrees poisson --aggrs pyg,rigid,default --graphconv-nodes 0 --repeats 3 \
    --same-process --no-allocated --out "$OUT/message_passing_compile" || status=1
fi
if [ "${NO_PNG:-0}" = 1 ]; then
  rm -f "$OUT"/*/*.png
fi
echo "results in $OUT (exit $status)"
exit $status
