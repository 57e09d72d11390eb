"""The single-agent learning checks of the acceptance lists, one table.

Each check trains one config in a fresh process (`flowkit train -c CONFIG ...`), reads the
run's metrics.csv and reports the first env step at which the metric reached its threshold
(or the best value within the budget when it did not). Multi-agent checks live in
bench/multiagent_acceptance.py.

    python bench/acceptance.py                      # every check, seeds as listed
    python bench/acceptance.py --only ppo_cartpole dqn_acrobot --json out.json
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import os
import subprocess
import sys
import time

# name: (config, metric, threshold, budget in env steps, seeds, extra overrides)
CHECKS = {
    "ppo_cartpole": ("configs/ppo/CartPole-v1.yaml", "episode_return_mean", 475, 100_000, [0, 1, 2], []),
    "ppo_pendulum": ("configs/ppo/Pendulum-v1.yaml", "episode_return_mean", -250, 200_000, [0], []),
    "dqn_cartpole": ("configs/dqn/CartPole-v1.yaml", "episode_return_mean", 450, 100_000, [0, 1, 2], []),
    "dqn_acrobot": ("configs/dqn/Acrobot-v1.yaml", "episode_return_mean", -100, 50_000, [0, 1, 2], []),
    "apex_cartpole": ("configs/apex/CartPole-v1.yaml", "evaluation_return_mean", 450, 150_000, [0], []),
    "impala_cartpole": ("configs/impala/CartPole-v1.yaml", "episode_return_mean", 450, 500_000, [0, 1, 2], []),
    "a2c_cartpole": ("configs/a2c/CartPole-v1.yaml", "episode_return_mean", 475, 500_000, [0, 1, 2], []),
    "a3c_cartpole": ("configs/a3c/CartPole-v1.yaml", "episode_return_mean", 450, 1_000_000, [0, 1, 2], []),
}


def read_rows(path: str) -> list:
    with open(path) as f:
        return [r for r in csv.DictReader(f) if None not in r.values()]


def run_check(name: str, seed: int, out_root: str) -> dict:
    config, metric, threshold, budget, _, extra = CHECKS[name]
    run_dir = os.path.join(out_root, f"{name}-seed{seed}")
    stop = [f"stop.env_steps={budget}"]
    if metric == "episode_return_mean":  # stop as soon as it is reached
        stop.append(f"stop.episode_return_mean={threshold}")
    cmd = [sys.executable, "-m", "flowkit.cli", "train", "-c", config, f"seed={seed}",
           f"run.dir={run_dir}", *stop, *extra]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    row = {"check": name, "seed": seed, "metric": metric, "threshold": threshold, "budget": budget,
           "wall_s": round(wall, 1), "exit": proc.returncode}
    mpath = os.path.join(run_dir, "metrics.csv")
    if proc.returncode != 0 or not os.path.exists(mpath):
        row.update(passed=False, error=(proc.stderr or proc.stdout).strip().splitlines()[-3:])
        return row
    rows = read_rows(mpath)
    rpath = os.path.join(run_dir, "result.json")
    if os.path.exists(rpath):  # evaluation.final's evaluation is in the run's summary only
        with open(rpath) as f:
            summary = json.load(f)
        if summary.get("final_evaluation"):
            rows.append({"time_total_s": rows[-1]["time_total_s"] if rows else 0, **summary})
    hit, best = None, -math.inf
    for r in rows:
        v = r.get(metric)
        if v in (None, ""):
            continue
        v, steps = float(v), int(float(r["env_steps_sampled"]))
        if steps > budget:
            break
        best = max(best, v)
        if hit is None and v >= threshold:
            hit = (steps, float(r["time_total_s"]))
    row.update(passed=hit is not None, env_steps=hit[0] if hit else None,
               train_s=round(hit[1], 1) if hit else None, best=round(best, 2))
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", choices=sorted(CHECKS), default=None)
    ap.add_argument("--seeds", type=int, nargs="*", default=None, help="override every check's seeds")
    ap.add_argument("--out", default="runs/bench-acceptance")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    rows = []
    print("| check | seed | metric >= threshold | budget | reached at env steps | train s | best | wall s | pass |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name in args.only or list(CHECKS):
        for seed in args.seeds if args.seeds is not None else CHECKS[name][4]:
            rows.append(print_row(name, seed, run_check(name, seed, args.out)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)



def print_row(name: str, seed: int, r: dict, train_s: bool = True) -> dict:
    """Print one check's table row (and its error, if any); return ``r``."""
    cells = [name, str(seed), f"{r['metric']} >= {r['threshold']:g}", f"{r['budget']:,}",
             "" if r.get("env_steps") is None else format(r["env_steps"], ",")]
    cells += [str(r.get("train_s") or "")] if train_s else []
    cells += [str(r.get("best", "")), str(r["wall_s"]), "yes" if r["passed"] else "NO"]
    print("| " + " | ".join(cells) + " |", flush=True)
    if r.get("error"):
        print("    " + " / ".join(r["error"]), flush=True)
    return r

if __name__ == "__main__":
    main()
