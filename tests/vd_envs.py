"""A tiny cooperative PettingZoo Parallel env for the value-decomposition tests (C13, C14)."""
from __future__ import annotations

from typing import Optional

import numpy as np
from gymnasium import spaces
from pettingzoo.utils.env import ParallelEnv


class CoopEnv(ParallelEnv):
    """Agents ``a0 .. a{n-1}``, all acting every step; obs Box(0,1,(2,)) = (t / length, agent
    index / n); Discrete(``num_actions``). Reward per agent: 1 every step (``reward="const"``: the
    team's mean is 1), or 1 when the agent's action is ``t % num_actions`` (``"match"``: learnable,
    random play gets ``1 / num_actions`` of the steps). Truncated after ``length`` steps, or
    terminated at step ``terminate_at``."""

    metadata = {"name": "coop_v0"}

    def __init__(self, n: int = 2, length: int = 4, num_actions: int = 2, reward: str = "const",
                 terminate_at: Optional[int] = None):
        self.possible_agents = [f"a{i}" for i in range(n)]
        self.n, self.length, self.num_actions, self.reward, self.terminate_at = n, length, num_actions, reward, terminate_at
        self.agents, self.t = [], 0

    def observation_space(self, agent):
        return spaces.Box(0.0, 1.0, (2,), np.float32)

    def action_space(self, agent):
        return spaces.Discrete(self.num_actions)

    def _obs(self):
        return {a: np.array([self.t / self.length, i / self.n], np.float32) for i, a in enumerate(self.possible_agents)}

    def reset(self, seed=None, options=None):
        self.t, self.agents = 0, list(self.possible_agents)
        return self._obs(), {a: {} for a in self.agents}

    def step(self, actions):
        assert sorted(actions) == sorted(self.agents), f"actions for {sorted(actions)}, live {self.agents}"
        rew = {a: 1.0 if self.reward == "const" else float(int(actions[a]) == self.t % self.num_actions)
               for a in self.agents}
        self.t += 1
        end = self.t == self.terminate_at
        term = {a: end for a in self.agents}
        trunc = {a: not end and self.t >= self.length for a in self.agents}
        obs = self._obs()
        if end or self.t >= self.length:
            self.agents = []
        return obs, rew, term, trunc, {a: {} for a in obs}


def coop(**kwargs) -> CoopEnv:
    return CoopEnv(**kwargs)
