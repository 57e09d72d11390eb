"""MuJoCo against Stable-Baselines3 at the same settings and budget on this machine (issue 23):
SAC and TD3 on HalfCheetah-v5 (100k env steps), PPO on Hopper-v5 and HalfCheetah-v5 (1M env steps).

flowkit runs ``configs/<algo>/<Env>.yaml`` with ``stop.env_steps`` set to the budget; SB3 runs the
same settings, key for key (the table ``SB3`` below: the configs' comments give their source, the
RL Baselines3 Zoo), with ``VecNormalize`` where the config normalises (PPO: observations and
rewards, at the config's gamma). Both sides use one torch thread and seed ``--seeds``; each run is a
fresh process. After training, both are evaluated greedily over ``--eval-episodes`` episodes of
the raw env (SB3: ``evaluate_policy``, VecNormalize frozen, unnormalised rewards; flowkit: the
run's final evaluation, the same).

Columns: the greedy mean return (and its standard deviation over episodes), env steps/s with
learning (env steps / seconds of training, start-up excluded on both sides) and the wall seconds.
The two sides of a seed run at the same time (``--jobs 2``, one core each on a 2-core machine:
the steps/s are then comparable with each other, not with a quiet machine's) or one after the
other (``--jobs 1``).

    python bench/mujoco_sb3.py --only sac/HalfCheetah-v5 td3/HalfCheetah-v5 --budget 100000
    python bench/mujoco_sb3.py --only ppo/Hopper-v5 --budget 1000000 --json out.json
    python bench/mujoco_sb3.py --only sac/HalfCheetah-v5 --budget 12000 --eval-episodes 1   # a tiny check
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
REPO = os.path.dirname(os.path.abspath(os.path.dirname(__file__)))

# SB3's constructor arguments for each config, key for key (configs/<algo>/<Env>.yaml)
SB3 = {
    "sac/HalfCheetah-v5": ("SAC", dict(learning_rate=3e-4, batch_size=256, buffer_size=1_000_000, learning_starts=10_000,
                                       tau=0.005, gamma=0.99, train_freq=1, gradient_steps=1, ent_coef="auto",
                                       policy_kwargs=dict(net_arch=[256, 256])), None),
    "td3/HalfCheetah-v5": ("TD3", dict(learning_rate=1e-3, batch_size=256, buffer_size=1_000_000, learning_starts=10_000,
                                       tau=0.005, gamma=0.99, train_freq=1, gradient_steps=1, policy_delay=2,
                                       target_policy_noise=0.2, target_noise_clip=0.5,
                                       policy_kwargs=dict(net_arch=[400, 300])), 0.1),
    "ppo/Hopper-v5": ("PPO", dict(n_steps=512, batch_size=32, n_epochs=5, gamma=0.999, gae_lambda=0.99,
                                  learning_rate=9.80828e-5, clip_range=0.2, ent_coef=0.00229519, vf_coef=0.835671,
                                  max_grad_norm=0.7, policy_kwargs=dict(log_std_init=-2, ortho_init=False,
                                                                        net_arch=dict(pi=[256, 256], vf=[256, 256]))),
                      None),
    "ppo/HalfCheetah-v5": ("PPO", dict(n_steps=512, batch_size=64, n_epochs=20, gamma=0.98, gae_lambda=0.92,
                                       learning_rate=2.0633e-5, clip_range=0.1, ent_coef=0.000401762, vf_coef=0.58096,
                                       max_grad_norm=0.8, policy_kwargs=dict(log_std_init=-2, ortho_init=False,
                                                                             net_arch=dict(pi=[256, 256], vf=[256, 256]))),
                           None),
}
# configs with ppo.normalize_observations and ppo.normalize_rewards: VecNormalize at the config's gamma
NORMALIZE = {"ppo/Hopper-v5", "ppo/HalfCheetah-v5"}


def flowkit_run(name: str, seed: int, budget: int, episodes: int) -> dict:
    import flowkit
    res = flowkit.train([f"seed={seed}", f"stop.env_steps={budget}", f"evaluation.episodes={episodes}",
                         "run.reporters=[csv,evaluation]", "checkpoint.at_end=false", "learner.num_threads=1",
                         "runtime.torch_threads=1", f"run.dir={fresh_run_dir('mujoco-' + name.replace('/', '-') + f'-{seed}')}"],
                        config_file=os.path.join(REPO, "configs", f"{name}.yaml"), verbose=False)
    m = res.metrics
    return {"side": "flowkit", "name": name, "seed": seed, "env_steps": int(m["env_steps_sampled"]),
            "return": float(m["evaluation_return_mean"]), "return_std": float(m.get("evaluation_return_std", float("nan"))),
            "steps_per_s": m["env_steps_sampled"] / m["time_total_s"], "seconds": float(m["time_total_s"]),
            "run_dir": res.run_dir}


def sb3_run(name: str, seed: int, budget: int, episodes: int) -> dict:
    import gymnasium as gym
    import numpy as np
    import stable_baselines3 as sb3
    import torch
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.evaluation import evaluate_policy
    from stable_baselines3.common.noise import NormalActionNoise
    from stable_baselines3.common.vec_env import VecNormalize
    torch.set_num_threads(1)
    cls, kw, noise = SB3[name]
    env_id = name.split("/")[1]
    env = make_vec_env(env_id, n_envs=1, seed=seed)
    if name in NORMALIZE:
        env = VecNormalize(env, norm_obs=True, norm_reward=True, gamma=kw["gamma"])
    if noise is not None:
        n = gym.make(env_id).action_space.shape[0]
        kw = {**kw, "action_noise": NormalActionNoise(np.zeros(n), noise * np.ones(n))}
    model = getattr(sb3, cls)("MlpPolicy", env, seed=seed, verbose=0, device="cpu", **kw)
    t0 = time.perf_counter()
    model.learn(total_timesteps=budget)
    dt = time.perf_counter() - t0
    ev = make_vec_env(env_id, n_envs=1, seed=seed + 1000)
    if isinstance(env, VecNormalize):
        ev = VecNormalize(ev, training=False, norm_obs=True, norm_reward=False, gamma=kw["gamma"])
        ev.obs_rms = env.obs_rms
    mean, std = evaluate_policy(model, ev, n_eval_episodes=episodes, deterministic=True)
    return {"side": "SB3", "name": name, "seed": seed, "env_steps": int(model.num_timesteps), "return": float(mean),
            "return_std": float(std), "steps_per_s": model.num_timesteps / dt, "seconds": dt}


def _job(a: tuple) -> dict:
    return run_isolated("mujoco_sb3", *a, tries=1)


def table(rows: list) -> str:
    lines = ["", "| config | seed | side | env steps | greedy return | env steps/s | seconds |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['name']} | {r['seed']} | {r['side']} | {r['env_steps']:,} | {r['return']:.1f} +- "
                     f"{r['return_std']:.1f} | {r['steps_per_s']:.1f} | {r['seconds']:.0f} |")
    for name in dict.fromkeys(r["name"] for r in rows):
        f = [r for r in rows if r["name"] == name and r["side"] == "flowkit"]
        s = [r for r in rows if r["name"] == name and r["side"] == "SB3"]
        if f and s:
            mf, ms = statistics.mean(r["return"] for r in f), statistics.mean(r["return"] for r in s)
            sf, ss = statistics.median(r["steps_per_s"] for r in f), statistics.median(r["steps_per_s"] for r in s)
            lines.append(f"\n{name}: mean greedy return flowkit {mf:.1f} vs SB3 {ms:.1f} "
                         f"({'at least SB3' if mf >= ms else 'below SB3'}); env steps/s {sf:.1f} vs {ss:.1f} "
                         f"({sf / ss:.2f}x)")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="+", default=list(SB3), choices=list(SB3))
    ap.add_argument("--budget", type=int, default=None, help="env steps (default: 100k SAC/TD3, 1M PPO)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--eval-episodes", type=int, default=10)
    ap.add_argument("--jobs", type=int, default=2, help="runs at the same time (the two sides of a seed)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    jobs = []
    for name in args.only:
        budget = args.budget or (1_000_000 if name.startswith("ppo/") else 100_000)
        for seed in args.seeds:
            jobs += [("flowkit_run", name, seed, budget, args.eval_episodes),
                     ("sb3_run", name, seed, budget, args.eval_episodes)]
    if args.jobs > 1:
        from concurrent.futures import ThreadPoolExecutor
        with ThreadPoolExecutor(args.jobs) as ex:
            rows = list(ex.map(_job, jobs))
    else:
        rows = [_job(j) for j in jobs]
    print(table(rows), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
