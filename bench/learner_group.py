"""Learner group throughput: env steps trained per second by ``learner.num_learners=2``
single-threaded learner processes against one single-threaded learner in this process.

Both sides get the same fixed PPO train batch (``--rows`` rows, default 4,096; CartPole-sized
observations and actions) and the same network (separate ``--hidden`` MLPs for the policy and
the value, default 256x256, tanh), ``--epochs`` passes of ``--minibatch``-row minibatches, one
torch thread each (``learner.num_threads=1``). The group is a
:class:`flowkit.core.learner.LearnerGroup` of 2 Ray actors (1 CPU each) over a local Ray
session. The learners keep the policy and optimizer state between updates: an update sends the
batch (one object in Ray's store) and the minibatch RNG state, and brings back stats; with
``--with-weights`` each side also takes the weights for the rollout workers after every update
(``Learner.get_weights``, as PPO's ``SyncWeights`` does each iteration: rank 0's weights
travel back), so that figure includes that traffic. The sides alternate, ``--repeats`` times each, each
measurement ``--updates`` updates after one warm-up update; the table shows the median rows/s
and the ratio (target: >= 1.6x). The load of the machine (``os.getloadavg``) is printed with
it: other processes on the cores lower the group's side first.

Run: python bench/learner_group.py [--rows 4096] [--hidden 256 256] [--epochs 2] [--minibatch 1024]
                                   [--repeats 3] [--updates 3] [--device cpu|cuda] [--with-weights]
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
import warnings

import gymnasium as gym
import numpy as np
import torch

warnings.filterwarnings("ignore")
OBS = gym.spaces.Box(-5.0, 5.0, (4,), np.float32)
ACT = gym.spaces.Discrete(2)


def fixed_batch(rows: int, seed: int = 0):
    from flowkit.core import batch as sb
    r = np.random.default_rng(seed)
    pb = sb.SampleBatch({sb.OBS: r.normal(size=(rows, 4)).astype(np.float32), sb.ACTIONS: r.integers(0, 2, rows),
                         sb.ACTION_LOGP: np.full(rows, np.log(0.5), np.float32),
                         sb.ACTION_DIST_INPUTS: np.zeros((rows, 2), np.float32),
                         sb.VF_PREDS: r.normal(size=rows).astype(np.float32),
                         sb.ADVANTAGES: r.normal(size=rows).astype(np.float32),
                         sb.VALUE_TARGETS: r.normal(size=rows).astype(np.float32)})
    return sb.MultiAgentBatch({"default": pb}, rows)


def make_learner(args, num_learners: int):
    """One Learner (num_learners=0) or a LearnerGroup of ``num_learners`` processes."""
    from flowkit_ppo import PPOConfig
    from flowkit_ppo.ppo import PPOPolicy

    from flowkit.core.learner import Learner, LearnerGroup
    from flowkit.core.workers import PolicySpec
    model = {"hidden_sizes": list(args.hidden), "activation": "tanh"}
    pol = PPOPolicy(OBS, ACT, PPOConfig(), model, args.device, 0)
    if num_learners:
        lr = LearnerGroup("ppo", {"default": pol}, None, np.random.default_rng(0),
                          {"default": PolicySpec(PPOPolicy, OBS, ACT, PPOConfig(), "ppo")}, {"default": model},
                          num_learners, num_cpus=1.0, device=args.device, num_threads=1)
    else:
        lr = Learner("ppo", {"default": pol}, rng=np.random.default_rng(0))
    lr.configure(args.epochs, args.minibatch)
    return lr


def measure(lr, batch, updates: int, with_weights: bool) -> float:
    """Rows trained per second over ``updates`` updates (after one warm-up update), each followed
    by ``lr.get_weights()`` if ``with_weights``."""
    lr.update(batch)
    t0 = time.perf_counter()
    for _ in range(updates):
        lr.update(batch)
        if with_weights:
            lr.get_weights()
    return updates * batch.env_steps / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--hidden", type=int, nargs="+", default=[256, 256])
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--minibatch", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--updates", type=int, default=3)
    ap.add_argument("--num-learners", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--with-weights", action="store_true", help="get_weights() after every update")
    args = ap.parse_args()
    import ray
    torch.set_num_threads(1)
    ray.init(address="local", num_cpus=args.num_learners, include_dashboard=False, logging_level="error", log_to_driver=False)
    batch = fixed_batch(args.rows)
    one, group = make_learner(args, 0), make_learner(args, args.num_learners)
    sides = {"1 learner": [], f"{args.num_learners} learners": []}
    try:
        for _ in range(args.repeats):
            sides["1 learner"].append(measure(one, batch, args.updates, args.with_weights))
            sides[f"{args.num_learners} learners"].append(measure(group, batch, args.updates, args.with_weights))
    finally:
        group.stop()
        ray.shutdown()
    load = os.getloadavg()
    print(f"PPO learner, {args.rows}-row batch, {'x'.join(map(str, args.hidden))} MLP, {args.epochs} epochs x "
          f"{args.minibatch}-row minibatches, 1 torch thread per learner, {args.device}"
          f"{', get_weights() after each update' if args.with_weights else ''}; "
          f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} CPUs")
    print(f"{'side':<14}{'rows/s (median)':>16}  runs")
    med = {k: statistics.median(v) for k, v in sides.items()}
    for k, v in sides.items():
        print(f"{k:<14}{med[k]:>16,.0f}  {', '.join(f'{x:,.0f}' for x in v)}")
    a, b = med.values()
    print(f"ratio {b / a:.2f}x (target >= 1.6x)")


if __name__ == "__main__":
    main()
