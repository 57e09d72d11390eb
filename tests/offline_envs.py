"""Scripted envs and policies for the offline tests (``env.factory=offline_envs:boundary``)."""
from __future__ import annotations

from typing import Any, Optional

import gymnasium as gym
import numpy as np
from gymnasium import spaces


class BoundaryEnv(gym.Env):
    """Observation ``[seed, t]``; the episode reset with seed ``s`` lasts ``2 + s % 5`` steps and
    ends terminated when ``s`` is odd, truncated (a time limit) when even. Reward
    ``action + 0.5 * t``."""

    metadata: dict = {}
    observation_space = spaces.Box(0.0, 1e10, (2,), np.float32)  # training workers seed with large ints
    action_space = spaces.Discrete(3)

    def reset(self, *, seed: Optional[int] = None, options: Optional[dict] = None):
        super().reset(seed=seed)
        self.s, self.t = int(seed or 0), 0
        return np.array([self.s, 0], np.float32), {}

    def step(self, action: Any):
        self.t += 1
        end = self.t >= 2 + self.s % 5
        return (np.array([self.s, self.t], np.float32), float(action) + 0.5 * self.t,
                end and self.s % 2 == 1, end and self.s % 2 == 0, {})


def boundary() -> BoundaryEnv:
    return BoundaryEnv()


class BoundaryPolicy:
    """Action ``(seed + t) % 3`` from the observation (batched)."""

    def compute_actions(self, obs: Any, explore: bool = False) -> np.ndarray:
        o = np.asarray(obs)
        return ((o[:, 0] + o[:, 1]).astype(np.int64)) % 3


class CartPoleExpert:
    """A scripted CartPole-v1 controller (push toward where the pole falls: angle plus half
    its angular velocity): return 500 from most starts."""

    def compute_actions(self, obs: Any, explore: bool = False) -> np.ndarray:
        o = np.asarray(obs)
        return (o[:, 2] + 0.5 * o[:, 3] > 0).astype(np.int64)


class MatchExpert:
    """The best action of ``flowkit.testing.envs:match``: the observed target."""

    def compute_actions(self, obs: Any, explore: bool = False) -> np.ndarray:
        return np.asarray(obs).astype(np.int64).reshape(-1)


class MatchAntiExpert:
    """The worst action of ``flowkit.testing.envs:match`` (n=2): never the target."""

    def compute_actions(self, obs: Any, explore: bool = False) -> np.ndarray:
        return 1 - np.asarray(obs).astype(np.int64).reshape(-1)


class TargetExpert:
    """The best action of ``flowkit.testing.envs:target`` (Box): the observed target x."""

    def compute_actions(self, obs: Any, explore: bool = False) -> np.ndarray:
        return np.asarray(obs, np.float32).reshape(-1, 1)


class EchoEnv(gym.Env):
    """Scripted episodes for ``run.output``: the ``k``-th episode of an env (``k`` counts its
    resets from 0) lasts ``1 + k % 4`` steps and ends terminated when ``k`` is odd, truncated
    when even. Observation ``[k, t, a]``: ``a`` is the action the last step received (0 at
    reset), so a dataset's ``observations[t + 1, 2]`` must equal its ``actions[t]``. Reward
    ``t + k / 10``. ``box=True``: actions in Box(-0.5, 0.5, (1,)) (a Gaussian policy's draws
    are scaled and clipped into it); else Discrete(3). ``discrete_obs=True``: the observation
    is ``Discrete(5)``, the step ``t`` alone."""

    metadata: dict = {}

    def __init__(self, box: bool = False, discrete_obs: bool = False):
        self.box, self.discrete_obs = box, discrete_obs
        self.action_space = spaces.Box(-0.5, 0.5, (1,), np.float32) if box else spaces.Discrete(3)
        self.observation_space = (spaces.Discrete(5) if discrete_obs
                                  else spaces.Box(-1.0, 1e6, (3,), np.float32))
        self.k = -1

    def _obs(self, a: float) -> Any:
        return self.t if self.discrete_obs else np.array([self.k, self.t, a], np.float32)

    def reset(self, *, seed: Optional[int] = None, options: Optional[dict] = None):
        super().reset(seed=seed)
        self.k, self.t = self.k + 1, 0
        return self._obs(0.0), {}

    def step(self, action: Any):
        self.t += 1
        end = self.t >= 1 + self.k % 4
        a = float(np.asarray(action).reshape(-1)[0])
        return self._obs(a), self.t + self.k / 10, end and self.k % 2 == 1, end and self.k % 2 == 0, {}


def echo(box: bool = False, discrete_obs: bool = False) -> EchoEnv:
    return EchoEnv(box, discrete_obs)
