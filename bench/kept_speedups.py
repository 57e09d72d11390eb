"""Issue 49 item 4: the numpy mirror, ``FlatAdam`` and the Ray start-up patches, each against
its removal, on the job it serves (the figures in their docstrings come from this script).

- ``mirror``: sampling only, bench/ppo_cartpole.py part (c) (2 Ray workers x 8 CartPole envs,
  8 s), with the mirror (the default) and without it (``model.numpy_inference=false``); env
  steps/s.
- ``adam``: the first optimizer a learning process builds, after ``import torch`` and
  flowkit's policy module: ``FlatAdam(...)`` against ``torch.optim.Adam(...)`` over the same
  flat buffer; seconds. (Their gradient steps: ``bench/learner.py --optimizers``.)
- ``patches``: bench/startup.py's flowkit run (``flowkit train -c configs/ppo/CartPole-v1.yaml``,
  4,000 env steps, seeds by repeat), seconds from the command to the first sample: with
  flowkit._ray's local patches (``on``), without them (``off``: ``_local_patches`` returns
  nothing) and with the agents started at once (``nodelay``: ``AGENT_DELAY_S = 0``).

Every measurement is a fresh process; the sides alternate (their order rotates each repeat),
``--repeats`` times, and the median is printed with the load average before and after. The
rows go to ``--out`` (JSON) after every measurement.

Usage: ``python bench/kept_speedups.py [--parts mirror adam patches] [--repeats 3] [--out FILE]``
(flowkit's own ``.venv``; run from the repository root).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))

SAMPLING = r'''
import json, sys
sys.path.insert(0, "bench")
import flowkit.engine as engine
import ppo_cartpole
load = engine.load_config
engine.load_config = lambda over: load(over + sys.argv[1:])
print(json.dumps(ppo_cartpole.flowkit_sampling(8.0)))
'''

BUILD = r'''
import sys, time, torch
torch.set_num_threads(1)
from flowkit.core.policy import FlatAdam
flat = torch.nn.Parameter(torch.zeros(9000))
t0 = time.perf_counter()
FlatAdam(flat, 3e-4) if sys.argv[1] == "FlatAdam" else torch.optim.Adam([flat], lr=3e-4)
print(time.perf_counter() - t0)
'''

TRAIN = r'''
import runpy, sys
import flowkit._ray as r
if sys.argv[1] == "off":
    r._local_patches = lambda: []
elif sys.argv[1] == "nodelay":
    r.AGENT_DELAY_S = 0.0
sys.argv = ["flowkit"] + sys.argv[2:]
runpy.run_module("flowkit.cli", run_name="__main__")
'''


def _run(code: str, *args: str, env: dict = None) -> str:
    p = subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, capture_output=True, text=True,
                       env=env or dict(os.environ, OMP_NUM_THREADS="1"))
    if p.returncode:
        raise RuntimeError(p.stderr[-3000:])
    return p.stdout.strip().splitlines()[-1]


def mirror(side: str, seed: int, tmp: str) -> float:
    return json.loads(_run(SAMPLING, *([] if side == "on" else ["model.numpy_inference=false"])))["steps_per_s"]


def adam(side: str, seed: int, tmp: str) -> float:
    return float(_run(BUILD, side))


def patches(side: str, seed: int, tmp: str) -> float:
    import startup
    run_dir = os.path.join(tmp, f"fk-{side}-{seed}-{time.time_ns()}")
    t0 = time.time()
    _run(TRAIN, side, "train", "-c", "configs/ppo/CartPole-v1.yaml", f"seed={seed}", f"run.dir={run_dir}",
         "run.reporters=[csv]", "learner.num_threads=1", "stop.env_steps=4000", env=startup._env(ROOT))
    path = os.path.join(run_dir, "result.json")
    with open(path) as f:
        r = json.load(f)
    return os.path.getmtime(path) - r["time_end_s"] - t0 + r["time_first_sample_s"]  # as bench/startup.py


PARTS = {"mirror": (mirror, ["on", "off"], "env steps/s"), "adam": (adam, ["FlatAdam", "Adam"], "s to build"),
         "patches": (patches, ["on", "off", "nodelay"], "s to first sample")}


def load() -> str:
    return "load average " + ", ".join(f"{x:.1f}" for x in os.getloadavg())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", nargs="+", choices=list(PARTS), default=list(PARTS))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "kept_speedups.json"))
    args = ap.parse_args()
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    out: dict = {"load": [load()], **{p: {s: [] for s in PARTS[p][1]} for p in args.parts}}
    with tempfile.TemporaryDirectory() as tmp:
        if "patches" in args.parts:
            patches("on", 0, tmp)  # untimed: bytecode and the OS caches warm for every side
        for i in range(args.repeats):
            for p in args.parts:
                fn, sides, _ = PARTS[p]
                for side in sides[i % len(sides):] + sides[:i % len(sides)]:
                    out[p][side].append(fn(side, i, tmp))
                    with open(args.out, "w") as f:
                        json.dump(out, f, indent=1)
    out["load"].append(load())
    print(f"{out['load'][0]} -> {out['load'][1]}; median of {args.repeats}, alternating; rows in {args.out}")
    for p in args.parts:
        med = {s: statistics.median(v) for s, v in out[p].items()}
        first = PARTS[p][1][0]
        print(f"{p:8} ({PARTS[p][2]}): " + ", ".join(f"{s} {m:,.5g} ({m / med[first]:.2f}x)" for s, m in med.items()))


if __name__ == "__main__":
    main()
