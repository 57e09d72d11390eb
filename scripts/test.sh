#!/usr/bin/env bash
# Quick start, command 2: set up, then run the test suite. Extra arguments go to pytest.
# Without a -m of yours the learning runs marked slow are left out (the quick pass, under 15
# minutes on 2 cores); `bash scripts/test.sh -m slow` runs them (the slow run, also in CI).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/lint.sh
marker=(-m "not slow")
for a in "$@"; do
  [[ $a == -m || $a == -m* ]] && marker=()
done
exec .venv/bin/python -m pytest -q "${marker[@]}" "$@"
