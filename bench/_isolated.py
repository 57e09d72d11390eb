"""Benchmarks' helper: one measurement per fresh (spawned) process."""
from __future__ import annotations

import os
import shutil
import sys


def fresh_run_dir(name: str) -> str:
    """``/tmp/flowkit-bench/NAME``, emptied: a rerun of a bench starts new runs (flowkit refuses
    a run.dir that holds an earlier run)."""
    path = os.path.join("/tmp/flowkit-bench", name)
    shutil.rmtree(path, ignore_errors=True)
    return path


def _child(module: str, fn_name: str, args: tuple, q) -> None:
    import importlib
    q.put(getattr(importlib.import_module(module), fn_name)(*args))


def run_isolated(module: str, fn_name: str, *args, tries: int = 2) -> dict:
    """Run ``module.fn_name(*args)`` (``module``: a script of bench/) as one measurement in a
    fresh (spawned) process: its own Ray session and torch state. A child that dies without a result (e.g. Ray failing to start on a busy machine) is
    retried once."""
    import multiprocessing as mp
    import queue
    ctx = mp.get_context("spawn")
    for attempt in range(tries):
        q = ctx.Queue()
        p = ctx.Process(target=_child, args=(module, fn_name, args, q))
        p.start()
        out = None
        while out is None:
            try:
                out = q.get(timeout=5.0)
            except queue.Empty:
                if not p.is_alive():
                    break
        p.join()
        if out is not None:
            print(f"  {fn_name}{args}: {out}", file=sys.stderr, flush=True)
            return out
        print(f"  {fn_name}{args}: child died (exit code {p.exitcode}), attempt {attempt + 1}/{tries}",
              file=sys.stderr, flush=True)
    raise RuntimeError(f"{fn_name}{args} failed {tries} times")
