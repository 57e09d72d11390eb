"""flowkit DQN against Stable-Baselines3 DQN on CartPole-v1, in one process tree.

Prints a table (and writes it as JSON with --json PATH):
  (a) env steps/s with learning, both sides at RL Zoo's tuned DQN CartPole hyperparameters
      (lr 2.3e-3, batch 64, buffer 100,000, learning_starts 1,000, gamma 0.99, target update
      every 10 gradient steps, train_freq 256 with 128 gradient steps = training_intensity 32,
      epsilon to 0.04 over 16% of 200,000 steps, 256x256 ReLU MLP, vanilla DQN targets):
      flowkit with one Ray rollout worker of 8 sub-envs x 32 steps (256 env steps per round,
      sampled ahead while the learner trains), SB3 with its single env;
  (b) seconds from the first sample request to the mean of the last 20 training episodes
      >= 450, each side at its best config (flowkit: configs/dqn/CartPole-v1.yaml; SB3: RL Zoo's,
      200,000 steps), median over seeds, an unsolved seed counted as 300 s.
Every seed's figure is printed. Both learners use one torch thread.

Run: python bench/dqn_cartpole.py [--seeds 0 1 2] [--json out.json] [--skip a|b]
(run with the bench environment: bash scripts/bench_env.sh, then .venv-bench/bin/python)
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import warnings

from _isolated import fresh_run_dir, run_isolated

warnings.filterwarnings("ignore")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
UNSOLVED_S = 300.0
SOLVE = 450.0
ZOO_FLOWKIT = ["algo=dqn", "env=CartPole-v1", "runtime.backend=ray", "runtime.num_workers=1",
               "runtime.num_envs_per_worker=8", "runtime.rollout_fragment_length=32",
               "model.hidden_sizes=[256,256]", "model.activation=relu", "dqn.lr=2.3e-3",
               "dqn.train_batch_size=64", "dqn.buffer_size=100000", "dqn.learning_starts=1000",
               "dqn.gamma=0.99", "dqn.target_network_update_freq=10", "dqn.training_intensity=32",
               "dqn.final_epsilon=0.04", "dqn.epsilon_timesteps=32000", "dqn.double_q=false",
               "dqn.dueling=false", "dqn.n_step=1", "dqn.max_grad_norm=10", "run.min_iter_env_steps=1000"]
ZOO_SB3 = dict(learning_rate=2.3e-3, batch_size=64, buffer_size=100_000, learning_starts=1000, gamma=0.99,
               target_update_interval=10, train_freq=256, gradient_steps=128, exploration_fraction=0.16,
               exploration_final_eps=0.04, policy_kwargs=dict(net_arch=[256, 256]))


# ---- flowkit ---------------------------------------------------------------------------------
def flowkit_throughput(seed: int, steps: int) -> dict:
    import flowkit
    res = flowkit.train(ZOO_FLOWKIT + [f"seed={seed}", f"stop.env_steps={steps}", "run.reporters=[csv,checkpoint,evaluation]", "checkpoint.at_end=false",
                                       f"run.dir={fresh_run_dir(f'dqn-thr-{seed}')}"])
    m = res.metrics
    return {"env_steps": m["env_steps_sampled"], "seconds": m["time_total_s"],
            "steps_per_s": m["env_steps_sampled"] / m["time_total_s"]}


def flowkit_solve(seed: int) -> dict:
    import flowkit
    res = flowkit.train([f"seed={seed}", "run.reporters=[csv,checkpoint,evaluation]", "checkpoint.at_end=false",
                         f"stop.episode_return_mean={SOLVE}", f"stop.time_s={UNSOLVED_S}",
                         # SB3's criterion on both sides (the config's own stop is a greedy evaluation)
                         "stop.evaluation_return_mean=null", "evaluation.interval=0",
                         f"run.dir={fresh_run_dir(f'dqn-solve-{seed}')}"],
                        config_file=os.path.join(REPO, "configs", "dqn", "CartPole-v1.yaml"))
    m = res.metrics
    solved = m["episode_return_mean"] >= SOLVE
    return {"solved": solved, "seconds": m["time_total_s"] if solved else UNSOLVED_S,
            "env_steps": m["env_steps_sampled"], "return": m["episode_return_mean"],
            "startup_s": m.get("time_startup_s", m.get("time_setup_s", float("nan")))}


# ---- Stable-Baselines3 -------------------------------------------------------------------------
def _sb3_model(seed: int, total: int):
    import torch
    from stable_baselines3 import DQN
    torch.set_num_threads(1)  # as flowkit's learner (learner.num_threads=1); 2 threads on 2 busy cores was ~10x slower
    return DQN("MlpPolicy", "CartPole-v1", seed=seed, verbose=0, **ZOO_SB3)


def sb3_throughput(seed: int, steps: int) -> dict:
    model = _sb3_model(seed, steps)
    t0 = time.perf_counter()
    model.learn(total_timesteps=steps)
    dt = time.perf_counter() - t0
    return {"env_steps": model.num_timesteps, "seconds": dt, "steps_per_s": model.num_timesteps / dt}


def sb3_solve(seed: int, total: int = 200_000) -> dict:
    import numpy as np
    from stable_baselines3.common.callbacks import BaseCallback

    class Solved(BaseCallback):
        def __init__(self, t0: float):
            super().__init__()
            self.t0, self.t_solved, self.ret = t0, None, float("nan")

        def _on_step(self) -> bool:
            buf = self.model.ep_info_buffer
            if len(buf) >= 20:
                self.ret = float(np.mean([e["r"] for e in list(buf)[-20:]]))
                if self.ret >= SOLVE:
                    self.t_solved = time.perf_counter()
                    return False
            return time.perf_counter() - self.t0 < UNSOLVED_S
    t_start = time.perf_counter()
    model = _sb3_model(seed, total)
    startup = time.perf_counter() - t_start
    t0 = time.perf_counter()
    cb = Solved(t0)
    model.learn(total_timesteps=total, callback=cb)
    solved = cb.t_solved is not None
    return {"solved": solved, "seconds": (cb.t_solved - t0) if solved else UNSOLVED_S,
            "env_steps": model.num_timesteps, "return": cb.ret, "startup_s": startup}


# ---- main --------------------------------------------------------------------------------------
def isolated(fn_name: str, *args, tries: int = 2) -> dict:
    """One measurement in a fresh (spawned) process (see bench/_isolated.py)."""
    return run_isolated("dqn_cartpole", fn_name, *args, tries=tries)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--throughput-steps", type=int, default=20480)
    ap.add_argument("--json", default=None)
    ap.add_argument("--skip", nargs="*", default=[], choices=["a", "b"])
    args = ap.parse_args()
    out: dict = {"seeds": args.seeds}
    if "a" not in args.skip:
        out["a"] = {"flowkit": [isolated("flowkit_throughput", s, args.throughput_steps) for s in args.seeds],
                    "sb3": [isolated("sb3_throughput", s, args.throughput_steps) for s in args.seeds]}
    if "b" not in args.skip:
        out["b"] = {"flowkit": [isolated("flowkit_solve", s) for s in args.seeds],
                    "sb3": [isolated("sb3_solve", s) for s in args.seeds]}
    print(table(out))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    return 0


def table(out: dict) -> str:
    med = statistics.median
    lines = ["", "DQN on CartPole-v1: flowkit vs Stable-Baselines3 (seeds " + ", ".join(map(str, out["seeds"])) + ")",
             f"{'measure':<60} {'flowkit':>10} {'SB3':>10} {'ratio':>7} {'target':>8}"]
    if "a" in out:
        f = med(r["steps_per_s"] for r in out["a"]["flowkit"])
        s = med(r["steps_per_s"] for r in out["a"]["sb3"])
        lines.append(f"{'(a) env steps/s, learning, RL Zoo hyperparameters (median)':<60} {f:>10.0f} {s:>10.0f} "
                     f"{f / s:>6.2f}x {'>=1.5x':>8}")
        lines.append(f"{'    per seed (steps/s): flowkit / SB3':<60} "
                     + " | ".join(f"{a['steps_per_s']:.0f}/{b['steps_per_s']:.0f}"
                                  for a, b in zip(out["a"]["flowkit"], out["a"]["sb3"])))
    if "b" in out:
        f = med(r["seconds"] for r in out["b"]["flowkit"])
        s = med(r["seconds"] for r in out["b"]["sb3"])
        lines.append(f"{'(b) s to mean(last 20) >= 450, best configs (median)':<60} {f:>10.1f} {s:>10.1f} "
                     f"{f / s:>6.2f}x {'<=0.5x':>8}")
        lines.append(f"{'    per seed (s, 300 = unsolved): flowkit / SB3':<60} "
                     + " | ".join(f"{a['seconds']:.1f}/{b['seconds']:.1f}" for a, b in zip(out["b"]["flowkit"], out["b"]["sb3"])))
        lines.append(f"{'    env steps at stop: flowkit / SB3':<60} "
                     + " | ".join(f"{a['env_steps']}/{b['env_steps']}" for a, b in zip(out["b"]["flowkit"], out["b"]["sb3"])))
        lines.append(f"{'    return at stop: flowkit / SB3':<60} "
                     + " | ".join(f"{a['return']:.0f}/{b['return']:.0f}" for a, b in zip(out["b"]["flowkit"], out["b"]["sb3"])))
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
