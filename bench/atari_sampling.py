"""Atari sampling rate: a flowkit rollout worker (env.preset=atari, PPO's Nature-CNN policy
acting, no learning) against a raw Gymnasium vector loop of the same wrapped envs with random
actions (no policy), and the bytes per transition of a sample batch.

Both sides step ``--envs`` sub-envs of ``--env`` built by flowkit's ``make_env`` (the preset's
training wrappers) in a SyncVectorEnv, for ``--steps`` env steps per sub-env, in this process
with one torch thread; the sides alternate, ``--runs`` times each, and the table gives the
median frames/s (env steps x 4: the preset skips 4 frames a step). Acceptance (issue 23):
flowkit >= 0.8x the raw loop. The bytes per transition are those of the worker's sample batch
(``nbytes`` of its columns / rows), against the same batch with float32 observations (as
before observations stayed uint8).

Run: python bench/atari_sampling.py [--env PongNoFrameskip-v4] [--envs 8] [--steps 256] [--runs 3]
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np


def _worker(env_id: str, n: int, steps: int):
    from flowkit.core import batch as sb  # noqa: F401
    from flowkit.core.workers import RolloutWorker
    from flowkit.engine import _probe_env, load_config
    pm, cfg = load_config(["algo=ppo", f"env={env_id}", "env.preset=atari", "runtime.backend=local",
                           "runtime.num_workers=1", f"runtime.num_envs_per_worker={n}",
                           f"runtime.rollout_fragment_length={steps}", "model.hidden_sizes=[512]",
                           "model.activation=relu", "model.shared_value_network=true", "env.check_spaces_steps=0"])
    env = _probe_env(cfg)
    specs = pm.hook.flowkit_make_policy_specs(config=cfg, env=env, algorithms=pm.algorithms())
    env.close()
    return RolloutWorker(cfg, 0, 1, specs, pm=pm)


def flowkit_side(worker, steps: int, n: int) -> tuple:
    t = time.perf_counter()
    b = worker.sample()
    dt = time.perf_counter() - t
    pb = b.policy_batches["default"]
    assert len(pb) == steps * n
    return steps * n * 4 / dt, pb


def raw_side(env_id: str, n: int, steps: int, vec=None) -> float:
    import gymnasium as gym

    from flowkit.core import EnvContext, make_env
    if vec is None:
        vec = gym.vector.SyncVectorEnv([lambda j=j: make_env({"id": env_id, "preset": "atari"},
                                                            EnvContext(0, j, 1, 0, j)) for j in range(n)])
        vec.reset(seed=list(range(n)))
    t = time.perf_counter()
    for _ in range(steps):
        vec.step(vec.action_space.sample())
    return steps * n * 4 / (time.perf_counter() - t), vec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--env", default="PongNoFrameskip-v4")
    ap.add_argument("--envs", type=int, default=8)
    ap.add_argument("--steps", type=int, default=256)
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    import torch
    torch.set_num_threads(1)
    worker = _worker(a.env, a.envs, a.steps)
    _, vec = raw_side(a.env, a.envs, 1)
    flowkit_side(worker, a.steps, a.envs)  # warm-up: first fragment, lazy imports
    fk, raw = [], []
    pb = None
    for _ in range(a.runs):
        f, pb = flowkit_side(worker, a.steps, a.envs)
        r, _ = raw_side(a.env, a.envs, a.steps, vec)
        fk.append(f)
        raw.append(r)
    assert pb is not None
    rows = len(pb)
    now = sum(np.asarray(v).nbytes for v in pb.values()) / rows
    before = now + sum(np.asarray(pb[k]).size * 3 for k in ("obs", "next_obs")) / rows  # uint8 -> float32
    print(f"{a.env}, {a.envs} sub-envs x {a.steps} steps, one torch thread, median of {a.runs} (alternating)")
    print(f"{'side':<42}{'frames/s':>10}   runs")
    print(f"{'flowkit worker (PPO Nature CNN acting)':<42}{statistics.median(fk):>10.0f}   "
          + " ".join(f"{x:.0f}" for x in fk))
    print(f"{'raw gymnasium SyncVectorEnv, random actions':<42}{statistics.median(raw):>10.0f}   "
          + " ".join(f"{x:.0f}" for x in raw))
    print(f"ratio flowkit / raw: {statistics.median(fk) / statistics.median(raw):.2f} (target >= 0.8)")
    print(f"sample batch bytes per transition: {now:,.0f} (obs and next_obs uint8[4, 84, 84]); "
          f"{before:,.0f} with float32 observations")
    vec.close()


if __name__ == "__main__":
    main()
