"""Agent steps/s sampled on mpe2 simple_spread (3 agents): flowkit's ParallelEnvRunner against a
raw PettingZoo loop with the same network (PPO's actor-critic, one batched forward over the
agents per step, action sampling, log-prob and value as flowkit computes them).

flowkit's figure includes everything a rollout worker does per fragment: per-agent
trajectory bookkeeping, batch building and PPO's GAE postprocessing. Both run in this process,
one after the other, on one core (torch threads = 1); repeated ``--rounds`` times, best taken.

    python bench/multiagent.py [--steps 6000] [--rounds 3]
"""
from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("SDL_VIDEODRIVER", "dummy")

import numpy as np
import torch


def raw_loop(env_steps: int, seed: int = 0) -> float:
    """Agent steps/s of a plain PettingZoo loop with PPOPolicy's network."""
    from mpe2 import simple_spread_v3
    from flowkit.config import build_config
    from flowkit.hooks import get_plugin_manager
    from flowkit_ppo.ppo import PPOPolicy
    from flowkit.config import section_object
    pm = get_plugin_manager()
    cfg = build_config(["env.factory=mpe2.simple_spread_v3:parallel_env"], None, pm.config_sections())
    env = simple_spread_v3.parallel_env()
    agents = env.possible_agents
    pol = PPOPolicy(env.observation_space(agents[0]), env.action_space(agents[0]),
                    section_object(cfg, "ppo", pm.algorithms()["ppo"].config_class), cfg.model, "cpu", seed,
                    inference_only=True)
    obs, _ = env.reset(seed=seed)
    n = 0
    t0 = time.perf_counter()
    for _ in range(env_steps):
        live = list(obs)
        x = np.stack([obs[a] for a in live]).astype(np.float32)
        actions, _ = pol.compute_actions_encoded(x, None, True)
        obs, rew, term, trunc, _ = env.step(dict(zip(live, actions.tolist())))
        n += len(live)
        if not env.agents:
            obs, _ = env.reset()
    return n / (time.perf_counter() - t0)


def flowkit_runner(env_steps: int, num_envs: int, fragment: int, seed: int = 0) -> float:
    """Agent steps/s of one local rollout worker's sample() calls (PPO policy, GAE included)."""
    import flowkit
    from flowkit.engine import load_config, setup
    pm, cfg = load_config(["env.factory=mpe2.simple_spread_v3:parallel_env", "runtime.backend=local",
                           "runtime.num_workers=1", f"runtime.num_envs_per_worker={num_envs}",
                           f"runtime.rollout_fragment_length={fragment}", f"seed={seed}"])
    ctx = setup(cfg, pm)
    w = ctx.workers.local_worker()
    w.sample()  # warm-up (first resets, space checks)
    n = 0
    t0 = time.perf_counter()
    while n < env_steps * 3:
        b = w.sample()
        n += b.agent_steps
    rate = n / (time.perf_counter() - t0)
    ctx.shutdown()
    return rate


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=6000, help="env steps per measurement")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    rows = []
    raw = max(raw_loop(args.steps) for _ in range(args.rounds))
    rows.append(("raw PettingZoo loop (1 env, batched over agents)", raw))
    for envs, frag in ((1, 64), (8, 64)):
        r = max(flowkit_runner(args.steps, envs, frag) for _ in range(args.rounds))
        rows.append((f"flowkit ParallelEnvRunner ({envs} sub-env{'s' if envs > 1 else ''}, fragment {frag})", r))
    print(f"\nsimple_spread (3 agents), agent steps/s sampled, best of {args.rounds} x {args.steps} env steps\n")
    print(f"| {'sampler':<58} | {'agent steps/s':>13} | {'vs raw':>6} |")
    print(f"|{'-' * 60}|{'-' * 15}|{'-' * 8}|")
    for name, r in rows:
        print(f"| {name:<58} | {r:>13,.0f} | {r / raw:>5.2f}x |")


if __name__ == "__main__":
    main()
