#!/usr/bin/env bash
# Idempotent set-up: a virtual environment in .venv with flowkit, every plugin under
# plugins/, the test tools, the docs tools (MkDocs) and the Atari (ale-py, ROMs included),
# MuJoCo and MiniGrid envs. torch==2.13.0 is installed first,
# before anything can ask for an unpinned torch (which would pull a multi-GB CUDA build): on
# the project's machines pip finds that version's CPU wheel on disk; elsewhere set
# PIP_INDEX_URL=https://download.pytorch.org/whl/cpu for that one step if you want the CPU
# build. Every package is installed at the version constraints.txt pins (the lock: the whole
# dependency set, resolved once by scripts/lock.sh), so two set-ups on different days install
# the same versions. Re-runs only when a pyproject.toml or constraints.txt changed.
# FLOWKIT_VENV=DIR sets up DIR instead of .venv; FLOWKIT_UNLOCKED=1 installs without the lock
# (the newest versions the pyproject.toml files allow: what scripts/lock.sh resolves).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${FLOWKIT_VENV:-.venv}
lock=(-c constraints.txt)
[[ ${FLOWKIT_UNLOCKED:-0} == 1 ]] && lock=()
if [[ ! -x $VENV/bin/python ]]; then
  echo "setting up $VENV (first time: a few minutes)"
  "$PY" -m venv "$VENV"
fi
. "$VENV/bin/activate"
stamp=$VENV/.flowkit-setup
inputs=(pyproject.toml plugins/*/pyproject.toml)
[[ ${#lock[@]} -gt 0 ]] && inputs+=(constraints.txt)
want=$(cat "${inputs[@]}" | sha1sum | cut -c1-16)
if [[ -f $stamp && $(cat $stamp) == "$want" ]]; then
  exit 0
fi
log=$VENV/setup.log
run() { "$@" >>"$log" 2>&1 || { echo "set-up step failed: $*"; tail -40 "$log"; exit 1; }; }
: >"$log"
echo "set-up 1/3: pip"
run pip install --upgrade pip "${lock[@]}"
if ! python -c "import torch" 2>/dev/null; then
  echo "set-up 2/3: torch 2.13.0 (CPU build)"
  run pip install "torch==2.13.0" "${lock[@]}"
fi
args=(-e ".[test,multiagent,docs,tensorboard,tune,box2d,atari,mujoco,offline,minigrid]")
for p in plugins/*/; do
  [[ -f $p/pyproject.toml ]] && args+=(-e "$p")
done
echo "set-up 3/3: flowkit, its plugins, Ray, Gymnasium, PettingZoo, test and docs tools (the longest step; log: $log)"
run pip install "${args[@]}" "${lock[@]}"
python -c "import flowkit, torch, ray, gymnasium, ale_py, mujoco"
echo "$want" > $stamp
echo "set-up done ($VENV; log in $log)"
