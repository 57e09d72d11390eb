"""PPO on Pong with learning: env frames/s of flowkit against Stable-Baselines3 at the RL Zoo's
Atari settings (issue 23: flowkit >= 1.5x SB3; SB3 acts and learns in one process, flowkit's two
workers sample in parallel and the driver learns; strictly on-policy as in the Zoo, so the
two phases take turns: ``runtime.prefetch=true`` would overlap them one round stale, slower on
2 cores, docs/envs.md).

flowkit: ``configs/ppo/PongNoFrameskip-v4.yaml`` (2 Ray workers x 4 sub-envs through
``env.preset=atari``, 128-step fragments, 4 epochs of minibatches of 256, the Nature CNN).
SB3: ``PPO("CnnPolicy")`` on ``make_atari_env(8 envs)`` + ``VecFrameStack(4)`` (the same
DeepMind wrappers) with the same settings (n_steps 128, batch 256, 4 epochs, lr 2.5e-4 and clip
0.1 decaying linearly, entropy 0.01, value coefficient 0.5). Each side trains from scratch for
``--time-s`` seconds in a fresh process; its rate is the steady state: env steps between its
first and last train batch (start-up and the first batch left out) x 4 frames (the frame skip)
per second. The learner takes ``--threads`` torch threads on both sides (flowkit's rollout
workers one each). The sides alternate, ``--runs`` times each; the table gives the medians.

    python bench/pong_ppo_sb3.py                   # 3 x 180 s per side
    python bench/pong_ppo_sb3.py --time-s 60 --runs 1
    python bench/pong_ppo_sb3.py --override runtime.prefetch=true   # flowkit's side with other settings
(run with the bench environment: bash scripts/bench_env.sh, then .venv-bench/bin/python)
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

from _isolated import fresh_run_dir, run_isolated

REPO = os.path.dirname(os.path.abspath(os.path.dirname(__file__)))
FRAME_SKIP = 4


def flowkit_side(time_s: float, threads: int, i: int, overrides: tuple = ()) -> dict:
    import flowkit
    res = flowkit.train([f"stop.time_s={time_s}", "stop.episode_return_mean=null", "run.reporters=[csv]",
                         "checkpoint.at_end=false", "evaluation.final=false", f"learner.num_threads={threads}",
                         "runtime.torch_threads=1", "run.min_iter_env_steps=0", f"seed={i}",
                         f"run.dir={fresh_run_dir(f'pong-ppo-{i}')}", *overrides],
                        config_file=os.path.join(REPO, "configs", "ppo", "PongNoFrameskip-v4.yaml"), verbose=False)
    rows = res.history[1:]  # the first train batch carries the start-up
    steps = rows[-1]["env_steps_sampled"] - rows[0]["env_steps_sampled"]
    dt = rows[-1]["time_total_s"] - rows[0]["time_total_s"]
    return {"side": "flowkit", "frames_per_s": FRAME_SKIP * steps / dt, "env_steps": int(rows[-1]["env_steps_sampled"]),
            "batches": len(rows) + 1}


def sb3_side(time_s: float, threads: int, i: int) -> dict:
    import ale_py
    import gymnasium as gym
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_atari_env
    from stable_baselines3.common.vec_env import VecFrameStack
    gym.register_envs(ale_py)
    torch.set_num_threads(threads)

    class Clock(BaseCallback):
        def __init__(self):
            super().__init__()
            self.t0, self.points = time.perf_counter(), []

        def _on_step(self) -> bool:
            return time.perf_counter() - self.t0 < time_s

        def _on_rollout_start(self) -> None:  # a train batch has just been learned from (or none yet)
            self.points.append((time.perf_counter(), self.num_timesteps))

    env = VecFrameStack(make_atari_env("PongNoFrameskip-v4", n_envs=8, seed=i), n_stack=4)
    model = PPO("CnnPolicy", env, n_steps=128, batch_size=256, n_epochs=4, learning_rate=lambda f: 2.5e-4 * f,
                clip_range=lambda f: 0.1 * f, ent_coef=0.01, vf_coef=0.5, max_grad_norm=0.5, gamma=0.99,
                gae_lambda=0.95, seed=i, device="cpu", verbose=0)
    clock = Clock()
    model.learn(total_timesteps=10_000_000, callback=clock)
    pts = clock.points[1:]  # from the end of the first train batch
    (t0, s0), (t1, s1) = pts[0], pts[-1]
    return {"side": "SB3", "frames_per_s": FRAME_SKIP * (s1 - s0) / (t1 - t0), "env_steps": int(model.num_timesteps),
            "batches": len(clock.points) - 1}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--time-s", type=float, default=180.0)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--override", action="append", default=[], help="a config override for flowkit's side "
                    "(repeatable), e.g. runtime.prefetch=true")
    args = ap.parse_args()
    out: dict = {"flowkit": [], "SB3": []}
    for i in range(args.runs):  # alternating
        out["flowkit"].append(run_isolated("pong_ppo_sb3", "flowkit_side", args.time_s, args.threads, i,
                                              tuple(args.override), tries=1))
        out["SB3"].append(run_isolated("pong_ppo_sb3", "sb3_side", args.time_s, args.threads, i, tries=1))
    med = {k: statistics.median(r["frames_per_s"] for r in v) for k, v in out.items()}
    print(f"\nPPO PongNoFrameskip-v4 with learning, RL Zoo Atari settings, {args.time_s:.0f} s per run, "
          f"median of {args.runs} alternating runs, learner torch threads {args.threads}"
          + (f", flowkit with {' '.join(args.override)}" if args.override else "") + "\n")
    print("| side | env frames/s (median) | each run | env steps reached |")
    print("|---|---|---|---|")
    for k, v in out.items():
        each = ", ".join(f"{r['frames_per_s']:.0f}" for r in v)
        reached = ", ".join(str(r["env_steps"]) for r in v)
        print(f"| {k} | {med[k]:.0f} | {each} | {reached} |")
    print(f"\nflowkit / SB3: {med['flowkit'] / med['SB3']:.2f}x (target >= 1.5x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
