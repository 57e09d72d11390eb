#!/usr/bin/env bash
# Lint (ruff) and type check (mypy) flowkit/, plugins/ and examples/; the settings are in pyproject.toml.
# Both keep a cache in the checkout (.ruff_cache, .mypy_cache; mypy is incremental: a warm run
# re-checks only the modules that changed and those that depend on them). Most of a cold mypy
# run is the installed packages (torch, Ray, ...), the same files in every set-up from the lock,
# so a checkout without a .mypy_cache (a fresh clone) starts from a copy of the cache the last
# clean run of any checkout left in ${XDG_CACHE_HOME:-~/.cache}/flowkit (one per Python, mypy
# version and lock). mypy checks each module it reuses against its file's content hash, so a
# copied cache never hides a change; FLOWKIT_LINT_SEED=0 leaves the shared copy alone.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
echo "lint: ruff check flowkit plugins examples; mypy"
"$PY" -m ruff check flowkit plugins examples
cache=.mypy_cache
key=$("$PY" -c 'import sys, mypy.version; print("py%d.%d-mypy%s" % (sys.version_info[:2] + (mypy.version.__version__,)))')
seed=${XDG_CACHE_HOME:-$HOME/.cache}/flowkit/mypy-$key-$(sha1sum constraints.txt | cut -c1-12)
[[ ${FLOWKIT_LINT_SEED:-1} == 1 ]] || seed=
if [[ -n $seed && ! -d $cache && -d $seed ]]; then
  cp -r "$seed" "$cache.tmp$$" && mv -T "$cache.tmp$$" "$cache" || rm -rf "$cache.tmp$$"
fi
"$PY" -m mypy --cache-dir "$cache"
if [[ -n $seed && ! -d $seed ]]; then  # (first come: one writer, renamed into place whole)
  mkdir -p "$(dirname "$seed")" && cp -r "$cache" "$seed.tmp$$" && { mv -T "$seed.tmp$$" "$seed" 2>/dev/null || rm -rf "$seed.tmp$$"; }
fi
