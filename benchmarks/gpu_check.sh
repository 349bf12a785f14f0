#!/usr/bin/env bash
# One command for a machine with an NVIDIA GPU: the CUDA tests and the three operator benchmarks
# on the GPU, in about five minutes, results under benchmarks/results/gpu/.
#
#   bash benchmarks/gpu_check.sh            # uses .venv/bin/python if present, else python3
#
# Sizes are cut to fit the time: message passing up to 10^5 nodes at d = 64 (Poisson degrees),
# the point-cloud training step of the presets at 32 x 1,024 points, and speed.py's batches.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
OUT=${OUT:-benchmarks/results/gpu}
mkdir -p "$OUT"
status=0
$PY -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.cuda.get_device_name(0))" || exit 2
echo '== CUDA tests'
$PY -m pytest -q tests -k cuda -p no:cacheprovider 2>&1 | tee "$OUT/cuda_tests.txt" || status=1
echo '== message passing'
timeout 150 $PY benchmarks/message_passing.py --device cuda --nodes 1000,10000,100000 --dims 64 \
  --degrees poisson --aggrs pyg,pyg-flat,rigid,default --graphconv-nodes 0 --repeats 5 --timeout 60 \
  --out "$OUT/message_passing" || status=1
echo '== point-cloud training step'
# the presets only: the +keep rows are about the CPU's malloc, the +compile rows compile for
# a minute or more each
timeout 90 $PY benchmarks/training_step.py --device cuda --repeats 5 \
  --models rigid,st-large,mz-slim,mz,egnn --out "$OUT/training_step" || status=1
echo '== speed.py batches'
timeout 60 $PY benchmarks/speed.py --device cuda --repeats 5 --memory --out "$OUT/speed" || status=1
echo "results in $OUT (exit $status)"
exit $status
