"""flowkit PPO against Stable-Baselines3 PPO on CartPole-v1, in one process tree.

Prints a table (and writes it as JSON with --json PATH):
  (a) env steps/s with learning at SB3's default hyperparameters (n_steps 2048, 10 epochs,
      minibatch 64, lr 3e-4): flowkit with 2 Ray workers x 8 envs x 128 steps = 2048 per
      train batch, SB3 with its default single env;
  (b) seconds from the first sample request to the solve criterion (mean of the last 20
      training episodes >= 475): flowkit at its default CartPole config
      (configs/ppo/CartPole-v1.yaml) against SB3 with RL Zoo's tuned CartPole hyperparameters;
      median over seeds, an unsolved seed counted as 300 s; start-up on its own line;
  (c) sampling-only throughput (no learning) against a raw loop over the same vector env and
      network on the same number of cores (2 processes).

Run: python bench/ppo_cartpole.py [--seeds 0 1 2] [--json out.json]   (run with the bench
environment: bash scripts/bench_env.sh, then .venv-bench/bin/python)
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
import warnings

warnings.filterwarnings("ignore")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _isolated import fresh_run_dir  # noqa: E402  (bench/ is not a package)
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
UNSOLVED_S = 300.0
SOLVE = 475.0


# ---- flowkit ---------------------------------------------------------------------------------
def flowkit_throughput(seed: int, steps: int) -> dict:
    import flowkit
    res = flowkit.train(["algo=ppo", "env=CartPole-v1", f"seed={seed}", "runtime.backend=ray",
                         "runtime.num_workers=2", "runtime.num_envs_per_worker=8",
                         "runtime.rollout_fragment_length=128", "ppo.train_batch_size=2048",
                         "ppo.num_epochs=10", "ppo.minibatch_size=64", "ppo.lr=3e-4",
                         f"stop.env_steps={steps}", "run.reporters=[csv,checkpoint,evaluation]",
                         "checkpoint.at_end=false", f"run.dir={fresh_run_dir(f'thr-{seed}')}"])
    m = res.metrics
    return {"env_steps": m["env_steps_sampled"], "seconds": m["time_total_s"],
            "steps_per_s": m["env_steps_sampled"] / m["time_total_s"]}


def flowkit_solve(seed: int, *extra: str) -> dict:
    import flowkit
    t0 = time.perf_counter()
    res = flowkit.train([f"seed={seed}", "run.reporters=[csv,checkpoint,evaluation]", "checkpoint.at_end=false",
                         f"run.dir={fresh_run_dir(f'solve-{seed}' + '-'.join(('',) + extra))}", *extra],
                        config_file=os.path.join(REPO, "configs", "ppo", "CartPole-v1.yaml"))
    wall = time.perf_counter() - t0
    m = res.metrics
    solved = m["episode_return_mean"] >= SOLVE
    return {"solved": solved, "seconds": m["time_total_s"] if solved else UNSOLVED_S,
            "env_steps": m["env_steps_sampled"], "startup_s": m["time_startup_s"], "wall_s": wall}


def flowkit_sampling(seconds: float) -> dict:
    import flowkit  # noqa: F401
    import ray
    from flowkit.core.ops import ParallelRollouts
    from flowkit.engine import load_config, setup
    pm, cfg = load_config(["env=CartPole-v1", "runtime.backend=ray", "runtime.num_workers=2",
                           "runtime.num_envs_per_worker=8", "runtime.rollout_fragment_length=256"])
    from flowkit import _ray
    _ray.stop()  # the session flowkit.train kept for part (a): this part starts its own
    ray.init(address="local", include_dashboard=False, logging_level="error", log_to_driver=False)
    try:
        ctx = setup(cfg, pm)
        ctx.workers.start()
        flow = ParallelRollouts(ctx, "async", num_async=2)
        flow.take(4)
        n0, t0 = ctx.counters["env_steps_sampled"], time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            next(flow)
        dt = time.perf_counter() - t0
        rate = (ctx.counters["env_steps_sampled"] - n0) / dt
        ctx.shutdown()
    finally:
        ray.shutdown()
    return {"steps_per_s": rate}


# ---- the raw loop ------------------------------------------------------------------------------
def _raw_loop(seconds: float, q) -> None:
    import gymnasium as gym
    import numpy as np
    import torch
    from torch import nn
    torch.set_num_threads(1)
    envs = gym.make_vec("CartPole-v1", num_envs=8, vectorization_mode="vector_entry_point")
    pi = nn.Sequential(nn.Linear(4, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 2))
    vf = nn.Sequential(nn.Linear(4, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1))
    obs, _ = envs.reset(seed=0)
    n, t0 = 0, time.perf_counter()
    with torch.inference_mode():
        while time.perf_counter() - t0 < seconds:
            x = torch.from_numpy(obs)
            logits, _ = pi(x), vf(x)
            a = torch.multinomial(torch.softmax(logits, -1), 1).squeeze(-1).numpy()
            obs, r, term, trunc, _ = envs.step(a)
            n += 8
    q.put(n / (time.perf_counter() - t0))


def raw_sampling(seconds: float, procs: int = 2) -> dict:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    ps = [ctx.Process(target=_raw_loop, args=(seconds, q)) for _ in range(procs)]
    for p in ps:
        p.start()
    rates = [q.get() for _ in ps]
    for p in ps:
        p.join()
    return {"steps_per_s": sum(rates)}


# ---- Stable-Baselines3 -------------------------------------------------------------------------
def sb3_throughput(seed: int, steps: int) -> dict:
    from stable_baselines3 import PPO
    model = PPO("MlpPolicy", "CartPole-v1", seed=seed, verbose=0)  # SB3 defaults
    t0 = time.perf_counter()
    model.learn(total_timesteps=steps)
    dt = time.perf_counter() - t0
    return {"env_steps": model.num_timesteps, "seconds": dt, "steps_per_s": model.num_timesteps / dt}


def sb3_solve(seed: int) -> dict:
    import numpy as np
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env

    class Solved(BaseCallback):
        def __init__(self):
            super().__init__()
            self.t_solved = None

        def _on_step(self) -> bool:
            buf = self.model.ep_info_buffer
            if len(buf) >= 20 and np.mean([e["r"] for e in list(buf)[-20:]]) >= SOLVE:
                self.t_solved = time.perf_counter()
                return False
            return True
    t_start = time.perf_counter()
    env = make_vec_env("CartPole-v1", n_envs=8, seed=seed)
    model = PPO("MlpPolicy", env, n_steps=32, batch_size=256, gae_lambda=0.8, gamma=0.98, n_epochs=20,
                ent_coef=0.0, learning_rate=lambda p: p * 1e-3, clip_range=lambda p: p * 0.2, seed=seed, verbose=0)
    startup = time.perf_counter() - t_start
    cb = Solved()
    t0 = time.perf_counter()
    model.learn(total_timesteps=100_000, callback=cb)
    solved = cb.t_solved is not None
    return {"solved": solved, "seconds": (cb.t_solved - t0) if solved else UNSOLVED_S,
            "env_steps": model.num_timesteps, "startup_s": startup}


# ---- main --------------------------------------------------------------------------------------
def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--throughput-steps", type=int, default=20480)
    ap.add_argument("--sampling-seconds", type=float, default=8.0)
    ap.add_argument("--json", default=None)
    ap.add_argument("--skip", nargs="*", default=[], choices=["a", "b", "c"])
    args = ap.parse_args()
    out: dict = {"seeds": args.seeds}

    def save():  # after every measurement, so a crash keeps what was measured
        if args.json:
            with open(args.json, "w") as f:
                json.dump(out, f, indent=2)
    if "a" not in args.skip:
        out["a"] = {"flowkit": [], "sb3": []}
        for s in args.seeds:
            out["a"]["flowkit"].append(flowkit_throughput(s, args.throughput_steps))
            out["a"]["sb3"].append(sb3_throughput(s, args.throughput_steps))
            save()
    if "b" not in args.skip:
        out["b"] = {"flowkit": [], "sb3": []}
        for s in args.seeds:
            out["b"]["flowkit"].append(flowkit_solve(s))
            out["b"].setdefault("flowkit_on_policy", []).append(flowkit_solve(s, "runtime.prefetch=false"))
            out["b"]["sb3"].append(sb3_solve(s))
            save()
    if "c" not in args.skip:
        out["c"] = {"flowkit": flowkit_sampling(args.sampling_seconds),
                    "raw": raw_sampling(args.sampling_seconds)}
        save()
    print(table(out))
    return 0


def table(out: dict) -> str:
    med = statistics.median
    lines = ["", "PPO on CartPole-v1: flowkit vs Stable-Baselines3 (seeds " + ", ".join(map(str, out["seeds"])) + ")",
             f"{'measure':<58} {'flowkit':>10} {'peer':>10} {'ratio':>7} {'target':>8}"]
    if "a" in out:
        f = med(r["steps_per_s"] for r in out["a"]["flowkit"])
        s = med(r["steps_per_s"] for r in out["a"]["sb3"])
        lines.append(f"{'(a) env steps/s, learning, SB3 defaults (median)':<58} {f:>10.0f} {s:>10.0f} {f / s:>6.2f}x {'>=2x':>8}")
    if "b" in out:
        f = med(r["seconds"] for r in out["b"]["flowkit"])
        s = med(r["seconds"] for r in out["b"]["sb3"])
        lines.append(f"{'(b) s to solve, first sample -> mean(last 20) >= 475 (median)':<58} {f:>10.2f} {s:>10.2f} {f / s:>6.2f}x {'<=0.75x':>8}")
        lines.append(f"{'    per seed (s): flowkit / tuned SB3':<58} "
                     + " | ".join(f"{a['seconds']:.1f}/{b['seconds']:.1f}" for a, b in zip(out['b']['flowkit'], out['b']['sb3'])))
        lines.append(f"{'    env steps to solve: flowkit / tuned SB3':<58} "
                     + " | ".join(f"{a['env_steps']}/{b['env_steps']}" for a, b in zip(out['b']['flowkit'], out['b']['sb3'])))
        if "flowkit_on_policy" in out["b"]:
            f2 = med(r["seconds"] for r in out["b"]["flowkit_on_policy"])
            lines.append(f"{'    the same config, strictly on-policy (runtime.prefetch=false)':<58} {f2:>10.2f} {s:>10.2f} {f2 / s:>6.2f}x")
        fs = med(r["startup_s"] for r in out["b"]["flowkit"])
        ss = med(r["startup_s"] for r in out["b"]["sb3"])
        lines.append(f"{'    start-up (flowkit: config+Ray+actors; SB3: model+envs)':<58} {fs:>10.2f} {ss:>10.2f}")
    if "c" in out:
        f, r = out["c"]["flowkit"]["steps_per_s"], out["c"]["raw"]["steps_per_s"]
        lines.append(f"{'(c) sampling-only env steps/s vs raw loop (2 cores)':<58} {f:>10.0f} {r:>10.0f} {f / r:>6.2f}x {'>=0.7x':>8}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
