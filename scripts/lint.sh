#!/usr/bin/env bash
# Lint (ruff) and type check (mypy) flowkit/, plugins/ and examples/; the settings are in pyproject.toml.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
echo "lint: ruff check flowkit plugins examples; mypy"
"$PY" -m ruff check flowkit plugins examples
"$PY" -m mypy
