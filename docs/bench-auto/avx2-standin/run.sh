#!/bin/bash
# Stand-in for the AVX2-only EPYC: this Xeon with torch's and oneDNN's kernels restricted to AVX2.
cd <clone>
export PYTHONPATH=<clone>/src ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2
uptime
/work/main/.venv/bin/frspec bench --num-prompts 3 --max-new-tokens 48 --num-spec-tokens 3 --token-map-sizes 32768 \
  --quant-rows none --no-llamacpp --row-costs 8 --threads 2 --no-progress --out /work/runs/avx2-default
uptime
