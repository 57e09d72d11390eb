"""Start-up and latency of the main job against tuned Stable-Baselines3 PPO on CartPole-v1.

Whole processes, from the command to its exit, alternating flowkit and SB3, seeds 0-2, one
torch thread each; both stop when the mean return of the last 20 episodes reaches 475
(budget 100,000 env steps). ``python -c "import torch"`` is measured in the same run.

flowkit's phases (seconds from the command) come from result.json (``time_*_s``, measured
from ``train()``'s entry, placed by the file's write time): imports, config, Ray up, actors
ready, first sample, first train step, solved (result.json written), process exit. SB3's:
imports, model and envs, solved, exit.

Usage: ``python bench/startup.py [--repeats 5] [--quick] [--out FILE]``
(``--quick``: one repeat, seed 0, 20,000 env steps at most: checks that the bench works). The
rows and medians go to ``--out`` as JSON, by default ``bench/results/startup.json`` in the
repository (git-ignored), wherever the command runs from; the path is printed.
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


def _env():
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    paths = [ROOT] + [os.path.join(ROOT, "plugins", p) for p in ("ppo", "dqn", "impala", "multiagent")]
    env["PYTHONPATH"] = os.pathsep.join(paths + [env.get("PYTHONPATH", "")])
    return env


def run_flowkit(seed: int, budget: int, tmp: str) -> dict:
    run_dir = os.path.join(tmp, f"fk-{seed}-{time.time_ns()}")
    cmd = [sys.executable, "-m", "flowkit.cli", "train", "-c", "configs/ppo/CartPole-v1.yaml", f"seed={seed}",
           f"run.dir={run_dir}", "run.reporters=[csv]", "learner.num_threads=1", f"stop.env_steps={budget}"]
    t0 = time.time()
    p = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True)
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
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "startup.json"),
                    help="the JSON file to write (default: bench/results/startup.json)")
    a = ap.parse_args()
    repeats, seeds, budget = (1, [0], 20_000) if a.quick else (a.repeats, a.seeds, 100_000)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(repeats):
            for seed in seeds:
                for name, fn in (("flowkit", lambda: run_flowkit(seed, budget, tmp)),
                                 ("sb3", lambda: run_sb3(seed, budget)), ("import torch", run_import_torch)):
                    r = {"who": name, "seed": seed, "repeat": rep, **fn()}
                    rows.append(r)
                    print(json.dumps(r), file=sys.stderr)
    cols = ("imports", "model", "config", "ray", "actors", "first_sample", "first_train", "end", "exit",
            "train_s", "env_steps")
    print("| who | " + " | ".join(cols) + " |  (median s from the command; env_steps median)")
    print("|---" * (len(cols) + 1) + "|")
    med = {}
    for who in ("flowkit", "sb3", "import torch"):
        mine = [r for r in rows if r["who"] == who]
        med[who] = {c: statistics.median(r[c] for r in mine) for c in cols if all(c in r for r in mine)}
        print(f"| {who} | " + " | ".join(f"{med[who][c]:.4g}" if c in med[who] else "-" for c in cols) + " |")
    ratio = med["flowkit"]["exit"] / med["sb3"]["exit"]
    first = med["flowkit"].get("first_sample", float("nan")) / med["import torch"]["exit"]
    print(f"\nwhole process flowkit / SB3: {ratio:.2f}x; command to first sample / `import torch`: {first:.2f}x; "
          f"summary to exit: {med['flowkit']['exit'] - med['flowkit']['end']:.2f} s")
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump({"rows": rows, "median": med, "ratio_whole": ratio, "ratio_first_sample": first}, f, indent=1)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
