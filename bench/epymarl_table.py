"""QMIX, VDN and MAPPO on the EPyMARL benchmark's tasks beside the paper's figures (issue 51),
not run in CI.

Papoudakis, Christianos, Schäfer and Albrecht 2021, "Benchmarking Multi-Agent Deep Reinforcement
Learning Algorithms in Cooperative Tasks", NeurIPS Datasets and Benchmarks (arXiv 2006.07869),
trained QMIX and MAPPO with EPyMARL on Level-Based Foraging ``8x8-2p-2f-coop`` and the
multi-robot warehouse ``tiny-2ag`` for millions of env steps (five seeds) and reports each
algorithm's maximum and average evaluation returns. This script trains flowkit's algorithm with
the tuned configs (``configs/multiagent/<algo>_*.yaml``) on seeds 0-2 at ``--env-steps`` (the
largest budget that fits the machine), evaluates each run greedily (100 episodes) and prints a
table: per seed, the median, a random team's return on the same env, EPyMARL's budget for the
algorithm (``BUDGET``) and the paper's figure where one is given.

The paper's figures: ``PAPER`` below holds none: the sessions that wrote this script could not
read the paper's tables (reference searches of 2026-12-07 returned the paper's abstract and first
page only; EPyMARL's repository holds configs, not results). Pass them with ``--paper
TASK=RETURN`` (e.g. ``--paper lbf=...``, from the paper's table of maximum returns with
parameter sharing) and the table prints them; without them the column says "not quoted".
``BUDGET`` is EPyMARL's ``t_max`` in its repository's configs (uoe-agents/epymarl cbc38c0:
``config/envs/gymma.yaml`` 2,050,000 for LBF/RWARE, overridden by ``config/algs/mappo.yaml``
20,050,000), not a figure read from the paper.

Runs already finished under ``--out`` are reused (evaluated again). ``simple_spread`` (MPE2,
not an EPyMARL task here: the paper used its own MPE fork) runs the same way for the docs' table.

Usage: nice -n 19 python bench/epymarl_table.py [--task lbf rware simple_spread] [--algo qmix|vdn|mappo]
       [--seeds 0 1 2] [--env-steps N] [--eval-episodes N] [--out DIR] [--paper TASK=RETURN ...]
"""
from __future__ import annotations

import argparse
import csv
import os
import statistics
from typing import Dict, List, Optional

import flowkit
from flowkit.evaluation import evaluate

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)

TASKS = {  # task -> (config of qmix (vdn: the name with vdn_), what it is)
    "lbf": ("qmix_lbf_8x8-2p-2f-coop.yaml", "LBF Foraging-8x8-2p-2f-coop-v3"),
    "rware": ("qmix_rware_tiny-2ag.yaml", "RWARE rware-tiny-2ag-v2"),
    "simple_spread": ("qmix_simple_spread.yaml", "MPE2 simple_spread_v3 (25 steps)"),
}
PAPER: Dict[str, float] = {}  # task -> the paper's return for --algo (none found: see the module docstring)
BUDGET = {"qmix": 2_050_000, "vdn": 2_050_000, "mappo": 20_050_000}  # EPyMARL's t_max (module docstring)


def config_path(task: str, algo: str) -> str:
    name = TASKS[task][0]
    return os.path.join(REPO, "configs", "multiagent", name if algo == "qmix" else name.replace("qmix_", f"{algo}_"))


def train(out: str, task: str, algo: str, seed: int, env_steps: int, episodes: int = 100) -> float:
    """One run (reused when finished at ``out``), then its greedy return over ``episodes`` episodes."""
    if not os.path.exists(os.path.join(out, "result.json")):
        flowkit.train([f"seed={seed}", f"run.dir={out}", f"stop.env_steps={env_steps}",
                       "run.reporters=[csv,checkpoint]"], config_file=config_path(task, algo), verbose=False)
    return float(evaluate(out, episodes=episodes, seed=1000, trust_config=True)["episode_return_mean"])


def random_team(out: str, task: str, algo: str, env_steps: int = 5000) -> float:
    """A team acting at random on the same env: the mean episode return of ``env_steps`` steps."""
    if not os.path.exists(os.path.join(out, "metrics.csv")):
        flowkit.train([f"run.dir={out}", f"stop.env_steps={env_steps}", "multiagent.policies.team.algo=random", "model.recurrent=null",
                       "run.reporters=[csv]"], config_file=config_path(task, "qmix"), verbose=False)
    with open(os.path.join(out, "metrics.csv")) as f:
        rows = list(csv.DictReader(f))
    return float(rows[-1]["episode_return_mean"])


def learning_curve(out: str) -> List[str]:
    """``env steps: training return`` of each reported iteration of a run."""
    with open(os.path.join(out, "metrics.csv")) as f:
        return [f"{int(r['env_steps_sampled'])}: {float(r['episode_return_mean']):.3f}" for r in csv.DictReader(f)]


def main(argv: Optional[List[str]] = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--task", nargs="+", default=["lbf", "rware"], choices=sorted(TASKS))
    p.add_argument("--algo", default="qmix", choices=sorted(BUDGET))
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--env-steps", type=int, default=200_000)
    p.add_argument("--out", default=os.path.join(REPO, "runs", "epymarl_table"))
    p.add_argument("--eval-episodes", type=int, default=100, help="greedy evaluation episodes per run")
    p.add_argument("--paper", nargs="*", default=[], help="TASK=RETURN: the paper's figure for a task")
    a = p.parse_args(argv)
    paper = {**PAPER, **{k: float(v) for k, v in (x.split("=", 1) for x in a.paper)}}
    rows = []
    for task in a.task:
        base = os.path.join(a.out, f"{a.algo}-{task}")
        rnd = random_team(os.path.join(base, "random"), task, a.algo)
        got = []
        for s in a.seeds:
            out = os.path.join(base, f"{a.env_steps}-seed{s}")
            got.append(train(out, task, a.algo, s, a.env_steps, a.eval_episodes))
            print(f"{task} seed {s}: greedy {got[-1]:.3f} over {a.eval_episodes} episodes; training curve "
                  f"{', '.join(learning_curve(out))}", flush=True)
        rows.append((task, got, rnd))
    print(f"\n{a.algo.upper()} at {a.env_steps:,} env steps, seeds {' '.join(map(str, a.seeds))} (greedy, "
          f"{a.eval_episodes} episodes each); EPyMARL's budget {BUDGET[a.algo]:,} env steps; paper: Papoudakis et al. "
          f"2021, {a.algo.upper()} with parameter sharing")
    print(f"| task | {' | '.join(f'seed {s}' for s in a.seeds)} | median | random team | paper |")
    print("|---|" + "---|" * (len(a.seeds) + 3))
    for task, got, rnd in rows:
        ref = f"{paper[task]:.2f}" if task in paper else "not quoted"
        print(f"| {TASKS[task][1]} | {' | '.join(f'{g:.3f}' for g in got)} | {statistics.median(got):.3f} | "
              f"{rnd:.3f} | {ref} |")


if __name__ == "__main__":
    main()
