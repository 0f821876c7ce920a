#!/usr/bin/env bash
# Creates .venv and installs frspec with the given extras (default: test). Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-test}"
if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
# torch first and pinned, so nothing below can pull a CUDA build.
.venv/bin/python -m pip install -q "torch==2.13.0"
.venv/bin/python -m pip install -q -e ".[${extras}]"
