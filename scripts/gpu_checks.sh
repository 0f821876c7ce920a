#!/usr/bin/env bash
# The CUDA checks in one run (about 10 minutes at most on one H200), offline, from a plain checkout:
#
#     OUT=/some/dir bash scripts/gpu_checks.sh
#
# 1. the CUDA-marked tests (tests/cuda: greedy identity against the target alone for every drafter, MTP included,
#    the ranked head with its size changing every step, `auto` on costs measured on the device,
#    and draft shape on tiny models; the int4/int8 kernels' CUDA dispatch: at most 200 s; then the sampling tests'
#    device paths: at most 150 s);
# 2. scripts/head_costs.py on the device: each drafter's step with its full LM head and with 64k/32k/16k rows,
#    bf16/int8/int4, on random weights of the real shapes, at batch 1, 4, 16 and 64: at most 200 s.
#
# Needs only PyTorch (with CUDA), Triton and transformers (the tiny MTP families need a transformers this project
# supports: where the device's is older, install wheels of it first, e.g. `pip install --no-index --no-deps --target
# /tmp/site WHEELS && export PYTHONPATH=/tmp/site`, as the session that ran this on an H200 did). pytest is used
# when importable; if not, and a shared/wheels folder holds its wheels (`pip download pytest -d shared/wheels` on a machine with network), it is
# installed from there without network; otherwise the tests are reported as not run. Writes everything to $OUT:
# environment.txt, cuda-tests.txt and cuda-sampling-tests.txt, head-costs.txt and head-costs/ (head_costs.json, .md), and
# summary.txt (7 files: the device tool returns at most 8). Exit status: 0 when every step ran and passed.
set -u
OUT=${OUT:-gpu-checks-out}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
PY=${PYTHON:-python}
status=0

{
  date -u
  git rev-parse --short HEAD 2>/dev/null || echo "commit: unknown (no git)"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null || echo "nvidia-smi: not found"
  "$PY" -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
'available', torch.cuda.is_available(), torch.cuda.get_device_name() if torch.cuda.is_available() else '-'); \
print('transformers', transformers.__version__)"
  lscpu 2>/dev/null | grep 'Model name'
} > "$OUT/environment.txt" 2>&1
cat "$OUT/environment.txt"

if ! "$PY" -c "import pytest" 2>/dev/null && [ -d shared/wheels ]; then
  "$PY" -m pip install --no-index --find-links shared/wheels pytest > "$OUT/pytest-install.txt" 2>&1
fi
if "$PY" -c "import pytest" 2>/dev/null; then
  # The fast paths first (greedy identity, MTP, int4/int8), then the sampling tests (1,200 generations each), each
  # under its own time limit so a slow half cannot starve the other or the cost table.
  # No -q of its own (pyproject's addopts has one; a second hides the "N passed" line) and no junit files: the
  # device returns at most 8 files from $OUT, and this run writes 7.
  timeout 200 "$PY" -m pytest tests/cuda -m cuda -k "not sampling and not wrong_acceptance" -p no:cacheprovider \
      -rs --durations=10 > "$OUT/cuda-tests.txt" 2>&1
  tests=$?
  tail -n 25 "$OUT/cuda-tests.txt"
  timeout 150 "$PY" -m pytest tests/cuda -m cuda -k "sampling or wrong_acceptance" -p no:cacheprovider \
      -rs --durations=10 > "$OUT/cuda-sampling-tests.txt" 2>&1
  sampling=$?
  tail -n 15 "$OUT/cuda-sampling-tests.txt"
  [ "$sampling" -eq 0 ] || tests=$sampling
else
  echo "pytest is not installed and shared/wheels has none: the CUDA tests were NOT run" | tee "$OUT/cuda-tests.txt"
  tests=127
fi
[ "$tests" -eq 0 ] || status=1

timeout 200 "$PY" scripts/head_costs.py --device cuda --rows 1,4,16,64 --repeats 10 --warmup 3 \
    --out "$OUT/head-costs" > "$OUT/head-costs.txt" 2>&1
costs=$?
tail -n 60 "$OUT/head-costs.txt"
[ "$costs" -eq 0 ] || status=1

printf 'cuda tests exit %s\nhead costs exit %s\n' "$tests" "$costs" | tee "$OUT/summary.txt"
exit $status
