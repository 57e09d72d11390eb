#!/usr/bin/env bash
# The bench environment: .venv-bench holds the peers bench/ compares against (Stable-Baselines3,
# sb3-contrib: bench/requirements.txt) and sees flowkit's set-up (.venv: flowkit, its plugins,
# torch, Ray) through a path appended after its own packages, so the peers never enter
# flowkit's dependencies and both sides of a bench import the same torch and Gymnasium.
# Run the benches with its python: `.venv-bench/bin/python bench/ppo_cartpole.py`.
# FLOWKIT_VENV=DIR takes another set-up as the base (e.g. an older checkout's .venv, for a
# before/after bench); FLOWKIT_BENCH_VENV=DIR writes the bench environment there.
set -euo pipefail
cd "$(dirname "$0")/.."
base=$(cd "${FLOWKIT_VENV:-.venv}" 2>/dev/null && pwd) || { bash scripts/setup.sh; base=$(cd .venv && pwd); }
[[ -x $base/bin/python ]] || bash scripts/setup.sh
out=${FLOWKIT_BENCH_VENV:-.venv-bench}
site=$("$base/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
[[ -x $out/bin/python ]] || "$base/bin/python" -m venv "$out"
own=$("$out/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "import site; site.addsitedir('$site')" > "$own/zz_flowkit_venv.pth"
"$out/bin/python" -m pip install -q -r bench/requirements.txt -c constraints.txt 2>&1 | grep -v "^WARNING: Location" || true
"$out/bin/python" -c "import flowkit, torch, stable_baselines3, sb3_contrib; print('bench environment ready:', '$out', '(flowkit from $base)')"
