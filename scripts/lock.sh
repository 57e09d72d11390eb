#!/usr/bin/env bash
# Refresh the lock: resolve the set-up's whole dependency set afresh (the newest versions the
# pyproject.toml files allow, torch 2.13.0 as scripts/setup.sh installs it) in a throw-away
# virtual environment and write every installed version to constraints.txt, which
# scripts/setup.sh installs from. The editable flowkit packages are left out; torch's local
# build label (+cpu) is dropped so the pin matches the CPU and the default build alike.
# After a refresh, rerun the README's figures (README "Quick start": which figures depend on
# the lock) and commit constraints.txt with them.
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
FLOWKIT_VENV=$tmp/venv FLOWKIT_UNLOCKED=1 bash scripts/setup.sh
{
  echo "# The lock: every package scripts/setup.sh installs, at the version it installs (Python $("$tmp/venv/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])'), $(uname -sm))."
  echo "# Written by scripts/lock.sh on $(date -u +%Y-%m-%d); refresh with \`bash scripts/lock.sh\`, do not edit by hand."
  "$tmp/venv/bin/pip" freeze --all --exclude-editable | grep -v -i '^flowkit' | sed -E 's/^(torch==[^+]*)\+.*/\1/' | LC_ALL=C sort -f
} > constraints.txt.new
mv constraints.txt.new constraints.txt
echo "wrote constraints.txt ($(grep -c '==' constraints.txt) packages)"
