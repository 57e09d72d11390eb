#!/usr/bin/env bash
# Idempotent set-up: a virtual environment in .venv with flowkit, every plugin under
# plugins/ and the test tools. torch is pinned to the CPU build first (an unpinned torch
# would pull a multi-GB CUDA build).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [[ ! -x .venv/bin/python ]]; then
  "$PY" -m venv .venv
fi
. .venv/bin/activate
stamp=.venv/.flowkit-setup
want=$(cat pyproject.toml plugins/*/pyproject.toml | sha1sum | cut -c1-16)
if [[ -f $stamp && $(cat $stamp) == "$want" ]]; then
  exit 0
fi
pip install -q --upgrade pip 2>&1 | grep -v '^WARNING: Location' || true
python -c "import torch" 2>/dev/null || pip install -q "torch==2.13.0" 2>&1 | grep -v '^WARNING: Location' || true
args=(-e ".[test,multiagent]")
for p in plugins/*/; do
  [[ -f $p/pyproject.toml ]] && args+=(-e "$p")
done
pip install -q "${args[@]}" 2>&1 | grep -vE '^WARNING: Location|^\s*$|!!|\*\*\*|^ +(with|name|Please|See|By|This|[a-zA-Z])' || true
python -c "import flowkit, torch, ray, gymnasium" 
echo "$want" > $stamp
