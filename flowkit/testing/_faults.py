"""Fault injection for tests and benchmarks: envs that fail on cue, and a plugin that kills
rollout worker processes from outside.

Everything here is importable on Ray workers (it lives in the flowkit package), so env
factories can be named in a config: ``env.factory=flowkit.testing:flaky_env``.

Faults are reproducible: a factory decides from its :class:`~flowkit.core.EnvContext`
(worker index, sub-env index, restart count) whether and when to fail (tests/test_worker_faults.py::test_c12_*).
"""
from __future__ import annotations

import os
import signal
from typing import Any, Dict, List, Optional

import gymnasium as gym
import numpy as np

from flowkit.core import EnvContext

__all__ = ["FlakyEnv", "flaky_env", "KillWorkers"]


class FlakyEnv(gym.Env):
    """Case C12's env: Box(-1, 1, (2,)) float32 observations, Discrete(2) actions, reward 1
    per step, episodes of ``length`` steps (terminated at the last one).

    Args:
        fail: ``None`` (never fails), ``"reset"`` (the ``at``-th call of ``reset()`` raises),
            ``"step"`` (``step()`` raises at step ``at`` of episode 2) or ``"always"`` (every
            ``reset()`` raises).
        armed: whether this instance fails at all (the factory decides from the context).
        message: the RuntimeError's message.
    Attributes:
        reset_seeds: the ``seed`` argument of every ``reset()`` call (for seed tests).
    """

    metadata: Dict[str, Any] = {}

    def __init__(self, fail: Optional[str] = None, armed: bool = False, at: int = 3, length: int = 5,
                 message: str = "simulator disconnected"):
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.fail, self.armed, self.at, self.length, self.message = fail, armed, at, length, message
        self.resets = self.episode = self.t = 0
        self.reset_seeds: List[Optional[int]] = []

    def _obs(self) -> np.ndarray:
        return self.np_random.uniform(-1, 1, 2).astype(np.float32)

    def reset(self, *, seed: Optional[int] = None, options: Optional[dict] = None):
        super().reset(seed=seed)
        self.resets += 1
        self.reset_seeds.append(seed)
        if self.fail == "always" or (self.armed and self.fail == "reset" and self.resets == self.at):
            raise RuntimeError(self.message)
        self.episode, self.t = self.episode + 1, 0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        if self.armed and self.fail == "step" and self.episode == 2 and self.t == self.at:
            raise RuntimeError(self.message)
        return self._obs(), 1.0, self.t >= self.length, False, {}


def flaky_env(context: EnvContext, fail: Optional[str] = None, worker: int = 1, sub_env: int = 0,
              at: int = 3, length: int = 5, message: str = "simulator disconnected") -> FlakyEnv:
    """Env factory of the worker-fault tests: a :class:`FlakyEnv` armed only in worker ``worker``, sub-env
    ``sub_env``, and only while ``context.restart_count == 0`` (``fail="always"`` fails
    everywhere, whatever the restart count)."""
    armed = (context.worker_index == worker and context.vector_index == sub_env and context.restart_count == 0)
    return FlakyEnv(fail, armed, at, length, message)


class KillWorkers:
    """A plugin that SIGKILLs rollout worker processes from outside, from
    ``flowkit_on_train_result`` (driver), each time ``env_steps_sampled`` passes a multiple
    of ``every_env_steps`` (Ray backend only; the local backend has no worker process).

    Args:
        every_env_steps: kill interval, in env steps sampled.
        worker_index: which worker slot to kill; None: slots in turn (0, 1, ...).
        max_kills: stop after this many kills (None: no limit).
    Attributes:
        kills: ``[(env_steps_sampled, worker_index, pid, pending_env_steps)]`` per kill, where
            ``pending_env_steps`` are transitions the worker had sampled but not yet returned
            (lost with the process).
    """

    def __init__(self, every_env_steps: int, worker_index: Optional[int] = None, max_kills: Optional[int] = None):
        self.every, self.worker_index, self.max_kills = int(every_env_steps), worker_index, max_kills
        self.next_mark = self.every
        self.kills: List[tuple] = []

    def flowkit_on_train_result(self, result: Dict[str, Any], ctx: Any) -> None:
        if (ctx.workers.backend != "ray" or result["env_steps_sampled"] < self.next_mark
                or (self.max_kills is not None and len(self.kills) >= self.max_kills)):
            return
        while self.next_mark <= result["env_steps_sampled"]:
            self.next_mark += self.every
        i = self.worker_index if self.worker_index is not None else len(self.kills) % ctx.workers.num_workers
        pids = ctx.workers.foreach_worker("get_pid")
        pending = ctx.workers.foreach_worker("pending_env_steps")
        os.kill(pids[i], signal.SIGKILL)
        self.kills.append((result["env_steps_sampled"], i, pids[i], pending[i]))
