#!/usr/bin/env bash
# Creates .venv and installs frspec with the given extras (default: test). Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
# This machine's pip config lists local index folders that may not exist; their warnings are noise.
pip_quiet() { "$@" 2> >(grep -v "^WARNING: Location 'file://" >&2); }
extras="${1:-test}"
if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
pip_quiet .venv/bin/python -m pip install -q --upgrade pip >/dev/null
# torch first and pinned, so nothing below can pull a CUDA build.
pip_quiet .venv/bin/python -m pip install -q "torch==2.13.0"
pip_quiet .venv/bin/python -m pip install -q -e ".[${extras}]"
