"""The two-player AEC game of :func:`flowkit.testing.envs.turn_game` (imports pettingzoo)."""
from __future__ import annotations

from typing import Any, Optional

import numpy as np
from gymnasium import spaces
from gymnasium.utils import seeding
from pettingzoo.utils import AgentSelector
from pettingzoo.utils.env import AECEnv


class TurnGame(AECEnv):
    """Players ``p0``, ``p1`` move in turn; the mover sees ``{observation: its target (of n),
    action_mask: the target and one other action}`` and gets 1 for playing its target; the
    game ends (terminated) after ``length`` moves."""

    metadata = {"name": "flowkit_turn_game_v0", "is_parallelizable": False}

    def __init__(self, n: int = 3, length: int = 6):
        super().__init__()
        self.n, self.length = int(n), int(length)
        self.possible_agents = ["p0", "p1"]
        self._obs_space = spaces.Dict({"observation": spaces.Discrete(self.n),
                                       "action_mask": spaces.MultiBinary(self.n)})
        self._act_space = spaces.Discrete(self.n)
        self.rng, _ = seeding.np_random(None)

    def observation_space(self, agent: str) -> spaces.Space:
        return self._obs_space

    def action_space(self, agent: str) -> spaces.Space:
        return self._act_space

    def _draw(self, agent: str) -> None:
        x = int(self.rng.integers(self.n))
        mask = np.zeros(self.n, np.int8)
        mask[[x, (x + 1 + int(self.rng.integers(self.n - 1))) % self.n]] = 1
        self.state[agent] = (x, mask)

    def observe(self, agent: str) -> Any:
        x, mask = self.state[agent]
        return {"observation": np.int64(x), "action_mask": mask.copy()}

    def reset(self, seed: Optional[int] = None, options: Optional[dict] = None) -> None:
        if seed is not None:
            self.rng, _ = seeding.np_random(seed)
        self.agents = list(self.possible_agents)
        self.moves = 0
        self.state: dict = {}
        for a in self.agents:
            self._draw(a)
        self.rewards = {a: 0.0 for a in self.agents}
        self._cumulative_rewards = {a: 0.0 for a in self.agents}
        self.terminations = {a: False for a in self.agents}
        self.truncations = {a: False for a in self.agents}
        self.infos: dict = {a: {} for a in self.agents}
        self._selector = AgentSelector(self.agents)
        self.agent_selection = self._selector.reset()

    def step(self, action: Any) -> None:
        a = self.agent_selection
        if self.terminations[a] or self.truncations[a]:
            return self._was_dead_step(action)
        x, mask = self.state[a]
        if not mask[int(action)]:
            raise ValueError(f"illegal action {int(action)} of {a} (mask {mask.tolist()})")
        self._cumulative_rewards[a] = 0.0
        self.rewards = {p: 0.0 for p in self.agents}
        self.rewards[a] = float(int(action) == x)
        self.moves += 1
        self._draw(a)
        if self.moves >= self.length:
            self.terminations = {p: True for p in self.agents}
        self._accumulate_rewards()
        self.agent_selection = self._selector.next()
