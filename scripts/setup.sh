#!/usr/bin/env bash
# Idempotent set-up: a virtual environment in .venv with flowkit, every plugin under
# plugins/, the test tools, the docs tools (MkDocs) and the Atari (ale-py, ROMs included),
# MuJoCo and MiniGrid envs. torch==2.13.0 is installed first,
# before anything can ask for an unpinned torch (which would pull a multi-GB CUDA build): on
# the project's machines pip finds that version's CPU wheel on disk; elsewhere set
# PIP_INDEX_URL=https://download.pytorch.org/whl/cpu for that one step if you want the CPU
# build. Re-runs only when a pyproject.toml changed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [[ ! -x .venv/bin/python ]]; then
  echo "setting up .venv (first time: a few minutes)"
  "$PY" -m venv .venv
fi
. .venv/bin/activate
stamp=.venv/.flowkit-setup
want=$(cat pyproject.toml plugins/*/pyproject.toml | sha1sum | cut -c1-16)
if [[ -f $stamp && $(cat $stamp) == "$want" ]]; then
  exit 0
fi
log=.venv/setup.log
run() { "$@" >>"$log" 2>&1 || { echo "set-up step failed: $*"; tail -40 "$log"; exit 1; }; }
: >"$log"
echo "set-up 1/3: pip"
run pip install --upgrade pip
if ! python -c "import torch" 2>/dev/null; then
  echo "set-up 2/3: torch 2.13.0 (CPU build)"
  run pip install "torch==2.13.0"
fi
args=(-e ".[test,multiagent,docs,tensorboard,tune,box2d,atari,mujoco,offline,minigrid]")
for p in plugins/*/; do
  [[ -f $p/pyproject.toml ]] && args+=(-e "$p")
done
echo "set-up 3/3: flowkit, its plugins, Ray, Gymnasium, PettingZoo, test and docs tools (the longest step; log: $log)"
run pip install "${args[@]}"
python -c "import flowkit, torch, ray, gymnasium, ale_py, mujoco"
echo "$want" > $stamp
echo "set-up done (.venv; log in $log)"
