"""Atari sampling rate: a flowkit rollout worker (env.preset=atari, PPO's Nature-CNN policy
acting, no learning) against a raw Gymnasium vector loop of the same wrapped envs with random
actions (no policy), and against the same loop acting as CleanRL's ppo_atari.py does (its Nature
CNN in plain torch, ``x / 255`` then the convolutions, a Categorical sample and the value, one
call a step); and against a raw loop of ale-py's own vector env with random actions (what
flowkit's rollout workers step under the preset since 2026-12-05: ``AtariVector``, the same
frames, docs/envs.md); and the bytes per transition of a sample batch.

The flowkit worker is double-buffered (``runtime.double_buffered=true``, as where a worker
reserves two cores: its 8 sub-envs in two halves, one stepping in ale-py's thread while the CNN
acts for the other, so it keeps a second core busy; its frames per CPU second say what that
costs); the last side is the same worker with one vector env (the default on one core).

The wrapped-env sides step ``--envs`` sub-envs of ``--env`` built by flowkit's ``make_env`` (the
preset's training wrappers) in a SyncVectorEnv; every side runs ``--steps`` env steps per sub-env, in this process
with one torch thread; the sides alternate, ``--runs`` times each, and the table gives the
median frames/s (env steps x 4: the preset skips 4 frames a step). Acceptance (issue 23):
flowkit >= 0.8x the raw loop of the wrapped envs with random actions; the CleanRL-style loop
shows what the same network costs outside flowkit, and the ale-py loop what flowkit's worker
costs over the env it now steps. The bytes per transition are those of the worker's sample batch
(``nbytes`` of its columns / rows), against the same batch with float32 observations (as
before observations stayed uint8).

Run: python bench/atari_sampling.py [--env PongNoFrameskip-v4] [--envs 8] [--steps 256] [--runs 3]
(``PYTHONPATH=<an older checkout>`` measures that checkout's worker against the same loops.)
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np


def _worker(env_id: str, n: int, steps: int, *extra: str):
    from flowkit.core import batch as sb  # noqa: F401
    from flowkit.core.workers import RolloutWorker
    from flowkit.engine import _probe_env, load_config
    pm, cfg = load_config(["algo=ppo", f"env={env_id}", "env.preset=atari", "runtime.backend=local",
                           "runtime.num_workers=1", f"runtime.num_envs_per_worker={n}",
                           f"runtime.rollout_fragment_length={steps}", "model.hidden_sizes=[512]",
                           "model.activation=relu", "model.shared_value_network=true", "env.check_spaces_steps=0", *extra])
    env = _probe_env(cfg)
    specs = pm.hook.flowkit_make_policy_specs(config=cfg, env=env, algorithms=pm.algorithms())
    env.close()
    return RolloutWorker(cfg, 0, 1, specs, pm=pm)


class _Clock:
    """Wall and CPU seconds of a block (the CPU time of this process: on a shared machine the
    wall time also counts the time other processes held the core)."""

    def __enter__(self):
        self.wall, self.cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc):
        self.wall, self.cpu = time.perf_counter() - self.wall, time.process_time() - self.cpu


def flowkit_side(worker, steps: int, n: int) -> tuple:
    with _Clock() as c:
        b = worker.sample()
    pb = b.policy_batches["default"]
    assert len(pb) == steps * n
    return steps * n * 4, c, pb


def raw_side(vec, n: int, steps: int) -> tuple:
    with _Clock() as c:
        for _ in range(steps):
            vec.step(vec.action_space.sample())
    return steps * n * 4, c


def make_vec(env_id: str, n: int):
    import gymnasium as gym
    from flowkit_atari.preset import make_env

    from flowkit.core import EnvContext
    vec = gym.vector.SyncVectorEnv([lambda j=j: make_env({"id": env_id}, EnvContext(0, j, 1, 0, j)) for j in range(n)])
    vec.reset(seed=list(range(n)))
    return vec


def cleanrl_net(n_act: int) -> tuple:
    """CleanRL's ppo_atari.py Agent: Nature CNN and a 512-unit ReLU layer, actor and critic heads."""
    from torch import nn
    return (nn.Sequential(nn.Conv2d(4, 32, 8, stride=4), nn.ReLU(), nn.Conv2d(32, 64, 4, stride=2), nn.ReLU(),
                          nn.Conv2d(64, 64, 3, stride=1), nn.ReLU(), nn.Flatten(), nn.Linear(64 * 7 * 7, 512),
                          nn.ReLU()), nn.Linear(512, n_act), nn.Linear(512, 1))


def cleanrl_side(vec, n: int, steps: int, net: tuple) -> tuple:
    """CleanRL's ppo_atari.py acting loop: ``torch.Tensor(obs)``, ``x / 255.0`` inside the
    network, a Categorical sample, its log-prob and the value per step, under ``torch.no_grad()``."""
    import torch
    trunk, actor, critic = net
    obs = vec.step(vec.action_space.sample())[0]  # (the loops share the vector env: no reset)
    with _Clock() as c:
        for _ in range(steps):
            with torch.no_grad():
                hidden = trunk(torch.Tensor(obs) / 255.0)
                dist = torch.distributions.Categorical(logits=actor(hidden))
                action = dist.sample()
                dist.log_prob(action), critic(hidden)
            obs, *_ = vec.step(action.numpy())
    return steps * n * 4, c


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--env", default="PongNoFrameskip-v4")
    ap.add_argument("--envs", type=int, default=8)
    ap.add_argument("--steps", type=int, default=256)
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    import torch
    torch.set_num_threads(1)
    worker = _worker(a.env, a.envs, a.steps, "runtime.double_buffered=true")
    single = _worker(a.env, a.envs, a.steps, "runtime.double_buffered=false")
    vec = make_vec(a.env, a.envs)
    net = cleanrl_net(int(vec.single_action_space.n))
    from flowkit_atari.preset import make_vector_env
    ale = make_vector_env({"id": a.env}, a.envs)
    ale.reset(seed=0)
    flowkit_side(worker, a.steps, a.envs)  # warm-up: first fragment, lazy imports
    flowkit_side(single, a.steps, a.envs)
    cleanrl_side(vec, a.envs, 2, net)
    names = ("flowkit worker (PPO Nature CNN acting)", "raw gymnasium SyncVectorEnv, random actions",
             "CleanRL-style loop, same CNN in plain torch", "raw ale-py vector env, random actions",
             "flowkit worker, one vector env")
    wall: list = [[] for _ in names]
    cpu: list = [[] for _ in names]
    pb = None
    for _ in range(a.runs):
        frames, c, pb = flowkit_side(worker, a.steps, a.envs)
        sides = [(frames, c), raw_side(vec, a.envs, a.steps), cleanrl_side(vec, a.envs, a.steps, net),
                 raw_side(ale, a.envs, a.steps), flowkit_side(single, a.steps, a.envs)[:2]]
        for i, (frames, c) in enumerate(sides):
            wall[i].append(frames / c.wall)
            cpu[i].append(frames / c.cpu)
    assert pb is not None
    rows = len(pb)
    now = sum(np.asarray(v).nbytes for v in pb.values()) / rows
    before = now + sum(np.asarray(pb[k]).size * 3 for k in ("obs", "next_obs")) / rows  # uint8 -> float32
    med = statistics.median
    print(f"{a.env}, {a.envs} sub-envs x {a.steps} steps, one torch thread, median of {a.runs} (alternating)")
    print(f"{'side':<44}{'frames/s':>9}{'frames/CPU s':>14}   runs (frames/s)")
    for i, name in enumerate(names):
        print(f"{name:<44}{med(wall[i]):>9.0f}{med(cpu[i]):>14.0f}   " + " ".join(f"{x:.0f}" for x in wall[i]))
    print(f"ratio flowkit / raw: {med(wall[0]) / med(wall[1]):.2f} (target >= 0.8), per CPU second "
          f"{med(cpu[0]) / med(cpu[1]):.2f}; flowkit / CleanRL-style: {med(wall[0]) / med(wall[2]):.2f}, per CPU "
          f"second {med(cpu[0]) / med(cpu[2]):.2f}")
    print(f"flowkit / raw ale-py vector env: {med(wall[0]) / med(wall[3]):.2f}, per CPU second "
          f"{med(cpu[0]) / med(cpu[3]):.2f}")
    print(f"flowkit with one vector env / raw: {med(wall[4]) / med(wall[1]):.2f}, per CPU second "
          f"{med(cpu[4]) / med(cpu[1]):.2f}")
    print(f"sample batch bytes per transition: {now:,.0f} (obs and next_obs uint8[4, 84, 84]); "
          f"{before:,.0f} with float32 observations")
    vec.close()
    ale.close()


if __name__ == "__main__":
    main()
