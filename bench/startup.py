"""Start-up and latency of the main job against tuned Stable-Baselines3 PPO on CartPole-v1.

Whole processes, from the command to its exit, alternating flowkit and SB3, seeds 0-2, one
torch thread each; both stop when the mean return of the last 20 episodes reaches 475
(budget 100,000 env steps). ``python -c "import torch"`` is measured in the same run.

flowkit's phases (seconds from the command) come from result.json (``time_*_s``, measured
from ``train()``'s entry, placed by the file's write time): imports, config, Ray up, actors
ready, first sample, first train step, solved (result.json written), process exit. SB3's:
imports, model and envs, solved, exit.

Usage: ``python bench/startup.py [--repeats 5] [--seeds 0 1 2] [--quick] [--no-sb3] [--env-steps N] [--against DIR] [--no-bytecode-cache] [--out FILE]``
(``--quick``: one repeat, seed 0, 20,000 env steps at most: checks that the bench works;
``--no-sb3``: flowkit and ``import torch`` only, SB3 needs the ``bench`` extra). ``--against DIR``:
another checkout of flowkit, set up (its own ``.venv``, e.g. ``git worktree add DIR COMMIT && bash
DIR/scripts/setup.sh``), run with its own Python in turn with this one (each repeat and seed
runs this checkout, then DIR), so a start-up change is measured against the commit before it
on the same machine at the same load; its rows are ``flowkit@COMMIT``. The rows and medians go
to ``--out`` as JSON, by default ``bench/results/startup.json`` in the repository
(git-ignored), wherever the command runs from; the path is printed with the load average.

Bytecode: every process runs with ``PYTHONPYCACHEPREFIX`` set to a folder of the bench's
temporary directory (``PYTHONDONTWRITEBYTECODE`` dropped), filled by one untimed short run of
each checkout first, so flowkit's modules load compiled, as they do for a user after the first
run (an editable install keeps no bytecode of its own). ``--no-bytecode-cache`` keeps the caller's
environment: where it sets ``PYTHONDONTWRITEBYTECODE``, each process (the driver and every Ray
worker) compiles every flowkit module it imports, about 0.1 s of CPU per process for the
13,000 lines the command imports on its way to the first sample (2026-12-07).
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
SB3 = r"""
import json, sys, time
t0 = time.time()
import numpy as np, torch
torch.set_num_threads(1)
from stable_baselines3 import PPO
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env
t_imp = time.time()
seed, budget = int(sys.argv[1]), int(sys.argv[2])
lin = lambda v: (lambda f: f * v)
env = make_vec_env("CartPole-v1", n_envs=8, seed=seed)
model = PPO("MlpPolicy", env, n_steps=32, batch_size=256, gae_lambda=0.8, gamma=0.98, n_epochs=20, ent_coef=0.0,
            learning_rate=lin(1e-3), clip_range=lin(0.2), seed=seed, device="cpu")
t_model = time.time()
class Stop(BaseCallback):
    rets = []
    def _on_step(self):
        for info in self.locals["infos"]:
            if "episode" in info:
                self.rets.append(info["episode"]["r"])
        return not (len(self.rets) >= 20 and np.mean(self.rets[-20:]) >= 475)
model.learn(budget, callback=Stop())
print(json.dumps({"imports": t_imp, "model": t_model, "solved": time.time(), "env_steps": model.num_timesteps}))
"""
FLOWKIT_PHASES = ("config", "ray", "actors", "first_sample", "first_train", "end")


PYCACHE = {"prefix": None}  # main() sets it: the processes' bytecode cache folder (None: as the caller's environment says)


def _env(root: str = ROOT):
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    if PYCACHE["prefix"]:  # compiled once, as an installed flowkit is; not every process from source
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = PYCACHE["prefix"]
    paths = [root] + [os.path.join(root, "plugins", p) for p in ("ppo", "dqn", "impala", "multiagent")]
    env["PYTHONPATH"] = os.pathsep.join(paths + [env.get("PYTHONPATH", "")])
    return env


def checkout(root: str) -> tuple:
    """(label, Python) of a flowkit checkout: ``flowkit@<short commit>`` (``+`` if it has changes
    not committed) and its ``.venv``'s Python (this process's Python for this checkout)."""
    root = os.path.abspath(root)

    def git(*a: str) -> str:
        return subprocess.run(["git", "-C", root, *a], capture_output=True, text=True).stdout.strip()
    label = f"flowkit@{git('rev-parse', '--short', 'HEAD')}{'+' if git('status', '--porcelain', '-uno') else ''}"
    python = sys.executable if root == ROOT else os.path.join(root, ".venv", "bin", "python")
    if not os.path.exists(python):
        raise SystemExit(f"--against {root}: no {python} (set that checkout up: bash {root}/scripts/setup.sh)")
    return label, python


def run_flowkit(seed: int, budget: int, tmp: str, root: str = ROOT, python: str = sys.executable) -> dict:
    run_dir = os.path.join(tmp, f"fk-{seed}-{time.time_ns()}")
    cmd = [python, "-m", "flowkit.cli", "train", "-c", "configs/ppo/CartPole-v1.yaml", f"seed={seed}",
           f"run.dir={run_dir}", "run.reporters=[csv]", "learner.num_threads=1", f"stop.env_steps={budget}"]
    t0 = time.time()
    p = subprocess.run(cmd, cwd=root, env=_env(root), capture_output=True, text=True)
    t_exit = time.time()
    path = os.path.join(run_dir, "result.json")
    if p.returncode != 0 or not os.path.exists(path):
        raise RuntimeError(f"flowkit failed ({p.returncode}): {p.stderr[-2000:]}")
    with open(path) as f:
        r = json.load(f)
    entry = os.path.getmtime(path) - r["time_end_s"] - t0  # train() entry, from the command
    row = {"imports": entry, **{k: entry + r[f"time_{k}_s"] for k in FLOWKIT_PHASES if f"time_{k}_s" in r}}
    row.update(exit=t_exit - t0, env_steps=r["env_steps_sampled"], solved=r["episode_return_mean"] >= 475,
               train_s=r["time_total_s"])
    return row


def run_sb3(seed: int, budget: int) -> dict:
    t0 = time.time()
    p = subprocess.run([sys.executable, "-c", SB3, str(seed), str(budget)], env=_env(), capture_output=True, text=True)
    t_exit = time.time()
    if p.returncode != 0:
        raise RuntimeError(f"SB3 failed: {p.stderr[-2000:]}")
    r = json.loads(p.stdout.strip().splitlines()[-1])
    return {"imports": r["imports"] - t0, "model": r["model"] - t0, "end": r["solved"] - t0, "exit": t_exit - t0,
            "env_steps": r["env_steps"], "train_s": r["solved"] - r["model"]}


def run_import_torch() -> dict:
    t0 = time.time()
    subprocess.run([sys.executable, "-c", "import torch"], env=_env(), check=True)
    return {"exit": time.time() - t0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--seeds", type=int, nargs="*", default=[0, 1, 2])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-sb3", action="store_true", help="leave Stable-Baselines3 out")
    ap.add_argument("--env-steps", type=int, help="the budget (default 100,000; the start-up phases need a few thousand)")
    ap.add_argument("--against", metavar="DIR", help="another flowkit checkout (set up) to alternate with")
    ap.add_argument("--no-bytecode-cache", action="store_true",
                    help="keep the caller's PYTHONDONTWRITEBYTECODE (every process compiles flowkit's source)")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "startup.json"),
                    help="the JSON file to write (default: bench/results/startup.json)")
    a = ap.parse_args()
    repeats, seeds, budget = (1, [0], 20_000) if a.quick else (a.repeats, a.seeds, 100_000)
    budget = a.env_steps or budget
    flowkits = [(ROOT, *checkout(ROOT))] + ([(os.path.abspath(a.against), *checkout(a.against))] if a.against else [])
    if len(flowkits) == 2 and flowkits[0][1] == flowkits[1][1]:
        flowkits[1] = (flowkits[1][0], flowkits[1][1] + " (against)", flowkits[1][2])
    load0, rows = os.getloadavg(), []
    with tempfile.TemporaryDirectory() as tmp:
        if not a.no_bytecode_cache:
            PYCACHE["prefix"] = os.path.join(tmp, "pycache")
            for root, _, py in flowkits:  # untimed: fills the bytecode cache of each checkout
                run_flowkit(0, 1_000, tmp, root, py)
        for rep in range(repeats):
            for seed in seeds:
                sides = [(label, lambda seed=seed, root=root, py=py: run_flowkit(seed, budget, tmp, root, py))
                         for root, label, py in flowkits]
                sides += [] if a.no_sb3 else [("sb3", lambda seed=seed: run_sb3(seed, budget))]
                for name, fn in sides + [("import torch", run_import_torch)]:
                    r = {"who": name, "seed": seed, "repeat": rep, **fn()}
                    rows.append(r)
                    print(json.dumps(r), file=sys.stderr)
    load1 = os.getloadavg()
    med = table(rows, [label for _, label, _ in flowkits] + ([] if a.no_sb3 else ["sb3"]) + ["import torch"])
    mine = med[flowkits[0][1]]
    first = mine.get("first_sample", float("nan")) / med["import torch"]["exit"]
    ratio = mine["exit"] / med["sb3"]["exit"] if "sb3" in med else float("nan")
    print(f"\nwhole process flowkit / SB3: {ratio:.2f}x; command to first sample / `import torch`: {first:.2f}x; "
          f"summary to exit: {mine['exit'] - mine['end']:.2f} s")
    if a.against:
        other = med[flowkits[1][1]]
        print(f"command to first sample: {flowkits[0][1]} {mine['first_sample']:.3f} s, {flowkits[1][1]} "
              f"{other['first_sample']:.3f} s ({mine['first_sample'] / other['first_sample']:.3f}x)")
    print(f"load average (1, 5, 15 min) at the start {', '.join(f'{x:.2f}' for x in load0)}; "
          f"at the end {', '.join(f'{x:.2f}' for x in load1)}; {os.cpu_count()} cores")
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump({"rows": rows, "median": med, "ratio_whole": ratio, "ratio_first_sample": first,
                   "load_average": [load0, load1]}, f, indent=1)
    print(f"wrote {a.out}")


def table(rows: list, whos: list) -> dict:
    """Print the median of each phase per side (a Markdown table); returns {who: {phase: median}}."""
    cols = ("imports", "model", "config", "ray", "actors", "first_sample", "first_train", "end", "exit",
            "train_s", "env_steps")
    print("| who | " + " | ".join(cols) + " |  (median s from the command; env_steps median)")
    print("|---" * (len(cols) + 1) + "|")
    med = {}
    for who in whos:
        mine = [r for r in rows if r["who"] == who]
        med[who] = {c: statistics.median(r[c] for r in mine) for c in cols if all(c in r for r in mine)}
        print(f"| {who} | " + " | ".join(f"{med[who][c]:.4g}" if c in med[who] else "-" for c in cols) + " |")
    return med


if __name__ == "__main__":
    main()
