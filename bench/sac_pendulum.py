"""SAC and TD3 on Pendulum-v1: the learning acceptance and SAC's speed against Stable-Baselines3.

Prints a table (and writes it as JSON with --json PATH):
  learning: for each algorithm and seed, a run of configs/<algo>/Pendulum-v1.yaml (20,000 env
      steps, one gradient step per env step), then the greedy evaluation over 50 episodes
      (``evaluation_return_mean``); acceptance: mean over seeds >= -200 and each seed >= -250.
  speed: env steps/s with learning, flowkit's SAC against SB3's SAC at RL Zoo's Pendulum settings
      (lr 1e-3, batch 256, buffer 1e6, learning_starts 256 (Zoo: 100; see below), tau 0.005,
      gamma 0.99, ent_coef auto,
      256x256 ReLU MLPs, train_freq 1 and gradient_steps 1: one gradient step of 256 per env step
      from one env, as configs/sac/Pendulum-v1.yaml), both with one torch thread, runs alternating
      flowkit / SB3, each in a fresh process, median of --runs runs; target >= 1.0x SB3.
      flowkit's figure is env steps sampled / training time (start-up excluded); SB3's is
      num_timesteps / the time of ``learn`` (its start-up excluded too).

Run: python bench/sac_pendulum.py [--algos sac td3] [--seeds 0 1 2] [--skip learning|speed]
     [--steps 20000] [--eval-episodes 50] [--speed-steps 5000] [--runs 3] [--jobs 1] [--json out.json]
Tiny check: python bench/sac_pendulum.py --seeds 0 --steps 300 --eval-episodes 1 --speed-steps 300 --runs 1
Each flowkit run writes a new folder in the system's temporary folder (``flowkit-bench-<algo>-...``,
named in the JSON as ``run_dir``), so the bench can run again.
(run with the bench environment for SB3: bash scripts/bench_env.sh, then .venv-bench/bin/python)
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import warnings

from _isolated import run_isolated

warnings.filterwarnings("ignore")
REPO = os.path.dirname(os.path.abspath(os.path.dirname(__file__)))
# learning_starts 256 on both sides in the speed runs (RL Zoo: 100): flowkit's Replay waits for a
# whole batch, so both then take the same number of gradient steps (printed)
SPEED_LEARNING_STARTS = 256
ZOO_SB3_SAC = dict(learning_rate=1e-3, batch_size=256, buffer_size=1_000_000, learning_starts=SPEED_LEARNING_STARTS,
                   tau=0.005, gamma=0.99, train_freq=1, gradient_steps=1, ent_coef="auto", policy_kwargs=dict(net_arch=[256, 256]))


def _config(algo: str) -> str:
    return os.path.join(REPO, "configs", algo, "Pendulum-v1.yaml")


def flowkit_learn(algo: str, seed: int, steps: int, episodes: int) -> dict:
    import flowkit
    res = flowkit.train([f"seed={seed}", f"stop.env_steps={steps}", f"evaluation.episodes={episodes}",
                         "run.reporters=[csv,evaluation]", "checkpoint.at_end=false", f"run.min_iter_env_steps={min(1000, steps)}",
                         f"run.dir={_new_run_dir(f'{algo}-pendulum-{seed}')}"], config_file=_config(algo))
    m = res.metrics
    return {"algo": algo, "seed": seed, "env_steps": m["env_steps_sampled"], "eval_return": m["evaluation_return_mean"],
            "seconds": m["time_total_s"], "run_dir": res.run_dir}


def _new_run_dir(tag: str) -> str:
    """A new empty folder for one run (a fixed path held the previous bench's run: flowkit
    refuses to train into a folder with an earlier run's files)."""
    return tempfile.mkdtemp(prefix=f"flowkit-bench-{tag}-")


def flowkit_speed(seed: int, steps: int) -> dict:
    import flowkit
    res = flowkit.train([f"seed={seed}", f"stop.env_steps={steps}", "evaluation.final=false", "run.reporters=[csv]",
                         "checkpoint.at_end=false", "learner.num_threads=1", "runtime.torch_threads=1",
                         f"run.min_iter_env_steps={min(1000, steps)}", f"sac.learning_starts={SPEED_LEARNING_STARTS}",
                         f"run.dir={_new_run_dir(f'sac-speed-{seed}')}"], config_file=_config("sac"))
    m, c = res.metrics, res.config["sac"]
    ti = c["training_intensity"] or c["train_batch_size"]
    return {"env_steps": m["env_steps_sampled"], "seconds": m["time_total_s"],
            "steps_per_s": m["env_steps_sampled"] / m["time_total_s"], "batch_size": c["train_batch_size"],
            "grad_steps_per_env_step": ti / c["train_batch_size"],
            "grad_steps_done": m.get("num_updates", m["env_steps_trained"] / c["train_batch_size"])}


def sb3_speed(seed: int, steps: int) -> dict:
    import torch
    from stable_baselines3 import SAC
    torch.set_num_threads(1)
    model = SAC("MlpPolicy", "Pendulum-v1", seed=seed, verbose=0, device="cpu", **ZOO_SB3_SAC)
    t0 = time.perf_counter()
    model.learn(total_timesteps=steps)
    dt = time.perf_counter() - t0
    return {"env_steps": model.num_timesteps, "seconds": dt, "steps_per_s": model.num_timesteps / dt,
            "batch_size": model.batch_size, "grad_steps_per_env_step": model.gradient_steps / model.train_freq.frequency,
            "grad_steps_done": model._n_updates}


# ---- processes -----------------------------------------------------------------------------------
def isolated(fn_name: str, *args) -> dict:
    """One measurement in a fresh (spawned) process (see bench/_isolated.py)."""
    return run_isolated("sac_pendulum", fn_name, *args, tries=1)


def _isolated_star(a: tuple) -> dict:
    return isolated(*a)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--algos", nargs="+", default=["sac", "td3"], choices=["sac", "td3"])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=20_000, help="env steps of each learning run")
    ap.add_argument("--eval-episodes", type=int, default=50)
    ap.add_argument("--speed-steps", type=int, default=5_000)
    ap.add_argument("--runs", type=int, default=3, help="speed runs per side (median)")
    ap.add_argument("--jobs", type=int, default=1, help="learning runs in parallel (a quiet machine with cores)")
    ap.add_argument("--skip", nargs="*", default=[], choices=["learning", "speed"])
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    out: dict = {"seeds": args.seeds, "steps": args.steps}
    if "learning" not in args.skip:
        jobs = [("flowkit_learn", a, s, args.steps, args.eval_episodes) for a in args.algos for s in args.seeds]
        if args.jobs > 1:
            from concurrent.futures import ThreadPoolExecutor
            with ThreadPoolExecutor(args.jobs) as ex:
                out["learning"] = list(ex.map(_isolated_star, jobs))
        else:
            out["learning"] = [isolated(*j) for j in jobs]
    if "speed" not in args.skip:
        out["speed"] = {"flowkit": [], "sb3": []}
        for i in range(args.runs):  # alternating
            out["speed"]["flowkit"].append(isolated("flowkit_speed", i, args.speed_steps))
            out["speed"]["sb3"].append(isolated("sb3_speed", i, args.speed_steps))
    print(table(out))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    return 0


def table(out: dict) -> str:
    lines = [""]
    if "learning" in out:
        lines += [f"Pendulum-v1, greedy evaluation after {out['steps']:,} env steps "
                  f"(acceptance: mean >= -200, each seed >= -250)",
                  f"{'algo':<6} {'seed':>4} {'env steps':>10} {'eval return':>12} {'seconds':>9}"]
        for r in out["learning"]:
            lines.append(f"{r['algo']:<6} {r['seed']:>4} {r['env_steps']:>10,} {r['eval_return']:>12.1f} "
                         f"{r['seconds']:>9.0f}")
        for algo in dict.fromkeys(r["algo"] for r in out["learning"]):
            rets = [r["eval_return"] for r in out["learning"] if r["algo"] == algo]
            ok = statistics.mean(rets) >= -200 and min(rets) >= -250
            lines.append(f"{algo:<6} mean {statistics.mean(rets):.1f}, worst seed {min(rets):.1f}: "
                         f"{'PASS' if ok else 'FAIL'}")
    if "speed" in out:
        f, s = out["speed"]["flowkit"], out["speed"]["sb3"]
        mf, ms = statistics.median(r["steps_per_s"] for r in f), statistics.median(r["steps_per_s"] for r in s)
        pf, ps = (" ".join(f"{r['steps_per_s']:.0f}" for r in x) for x in (f, s))
        lines += ["", f"SAC speed, RL Zoo Pendulum settings, one torch thread, median of {len(f)} alternating runs",
                  f"{'side':<8} {'batch':>6} {'grad steps/env step':>20} {'grad steps done':>16} {'env steps/s':>12} "
                  f"{'per run':>24}"]
        for name, rs, med, per in (("flowkit", f, mf, pf), ("SB3", s, ms, ps)):
            lines.append(f"{name:<8} {rs[0]['batch_size']:>6} {rs[0]['grad_steps_per_env_step']:>20.2f} "
                         f"{rs[0]['grad_steps_done']:>16.0f} {med:>12.1f} {per:>24}")
        lines.append(f"ratio flowkit/SB3: {mf / ms:.2f}x (target >= 1.0x)")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
