#!/usr/bin/env bash
# Quick start, command 2: set up, then run the test suite. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/lint.sh
exec .venv/bin/python -m pytest -q "$@"
