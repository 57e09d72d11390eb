"""Tiny PettingZoo envs for the multi-agent tests (cases C03, C04, AEC reward attribution)."""
from __future__ import annotations

import numpy as np
from gymnasium import spaces
from pettingzoo.utils import AgentSelector
from pettingzoo.utils.env import AECEnv, ParallelEnv


class LateEarlyEnv(ParallelEnv):
    """Case C03: agents a, b, c; Box(0,1,(2,)) obs, Discrete(2), reward 1 per action.
    Reset: a and b. b terminates at step 2 and leaves; c is first observed after step 3 and
    terminates on its first step (step 4); a is truncated at step 6. step() asserts it gets
    actions for exactly the live agents."""

    metadata = {"name": "late_early_v0"}
    possible_agents = ["a", "b", "c"]

    def __init__(self):
        self.agents = []
        self.t = 0

    def observation_space(self, agent):
        return spaces.Box(0.0, 1.0, (2,), np.float32)

    def action_space(self, agent):
        return spaces.Discrete(2)

    def _obs(self, agent):
        return np.array([self.t / 10.0, self.possible_agents.index(agent) / 3.0], np.float32)

    def reset(self, seed=None, options=None):
        self.t = 0
        self.agents = ["a", "b"]
        return {a: self._obs(a) for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions):
        assert sorted(actions) == sorted(self.agents), f"actions for {sorted(actions)}, live {self.agents}"
        self.t += 1
        rew = {a: 1.0 for a in actions}
        term = {a: (a == "b" and self.t == 2) or (a == "c" and self.t == 4) for a in actions}
        trunc = {a: a == "a" and self.t == 6 for a in actions}
        obs = {a: self._obs(a) for a in actions}
        infos = {a: {} for a in actions}
        self.agents = [a for a in actions if not (term[a] or trunc[a])]
        if self.t == 3:
            self.agents.append("c")
            obs["c"] = self._obs("c")
            infos["c"] = {}
        return obs, rew, term, trunc, infos


class ScoutTankEnv(ParallelEnv):
    """Case C04: "scout" Box(-1,1,(3,)) obs, Discrete(4); "tank" Box(-1,1,(5,)) obs,
    Box(-1,1,(2,)) actions; reward 0; length 5 (both truncated)."""

    metadata = {"name": "scout_tank_v0"}
    possible_agents = ["scout", "tank"]

    def __init__(self):
        self.agents = []
        self._obs = {"scout": spaces.Box(-1.0, 1.0, (3,), np.float32), "tank": spaces.Box(-1.0, 1.0, (5,), np.float32)}
        self._act = {"scout": spaces.Discrete(4), "tank": spaces.Box(-1.0, 1.0, (2,), np.float32)}

    def observation_space(self, agent):
        return self._obs[agent]

    def action_space(self, agent):
        return self._act[agent]

    def reset(self, seed=None, options=None):
        self.t = 0
        self.agents = list(self.possible_agents)
        return {a: np.zeros(self._obs[a].shape, np.float32) for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions):
        for a, x in actions.items():
            assert self._act[a].contains(np.asarray(x, self._act[a].dtype)), (a, x)
        self.t += 1
        obs = {a: np.full(self._obs[a].shape, self.t / 10.0, np.float32) for a in actions}
        done = self.t >= 5
        self.agents = [] if done else list(actions)
        return (obs, {a: 0.0 for a in actions}, {a: False for a in actions}, {a: done for a in actions},
                {a: {} for a in actions})


class TinyTurnGame(AECEnv):
    """A three-move, two-player turn-based game for the AEC reward attribution test.

    p0 moves (p1 gets +0.5), p1 moves (p0 gets +2, p1 gets -1), p0 moves with mask [0, 1]
    (only action 1 is legal) and the game ends: p0 +10, p1 -10. Observations are dicts with an
    ``action_mask``.

    Right attribution: p0's transitions get 0 + 2 = 2 and then +10 (terminated); p1's one
    transition gets -1 - 10 = -11 (terminated); p1's +0.5 came before it ever moved (its return
    only). Returns: p0 12, p1 -10.5.
    """

    metadata = {"name": "tiny_turn_v0", "is_parallelizable": False}

    def __init__(self):
        super().__init__()
        self.possible_agents = ["p0", "p1"]
        self._space = spaces.Dict({"observation": spaces.Box(0.0, 1.0, (1,), np.float32),
                                   "action_mask": spaces.Box(0, 1, (2,), np.int8)})

    def observation_space(self, agent):
        return self._space

    def action_space(self, agent):
        return spaces.Discrete(2)

    def observe(self, agent):
        over = all(self.terminations.values())
        mask = [0, 0] if over else ([0, 1] if self.move == 2 else [1, 1])
        return {"observation": np.array([self.move / 3.0], np.float32), "action_mask": np.array(mask, np.int8)}

    def reset(self, seed=None, options=None):
        self.agents = list(self.possible_agents)
        self.move = 0
        self.rewards = {a: 0.0 for a in self.agents}
        self._cumulative_rewards = {a: 0.0 for a in self.agents}
        self.terminations = {a: False for a in self.agents}
        self.truncations = {a: False for a in self.agents}
        self.infos = {a: {} for a in self.agents}
        self._selector = AgentSelector(self.agents)
        self.agent_selection = self._selector.reset()

    def step(self, action):
        a = self.agent_selection
        if self.terminations[a] or self.truncations[a]:
            return self._was_dead_step(action)
        assert self.observe(a)["action_mask"][action] == 1, f"illegal action {action} at move {self.move}"
        self._cumulative_rewards[a] = 0.0
        self.rewards = {x: 0.0 for x in self.agents}
        self.move += 1
        if self.move == 1:
            self.rewards["p1"] += 0.5
        elif self.move == 2:
            self.rewards["p0"] += 2.0
            self.rewards["p1"] -= 1.0
        else:
            self.rewards["p0"] += 10.0
            self.rewards["p1"] -= 10.0
            self.terminations = {x: True for x in self.agents}
        self._accumulate_rewards()
        self.agent_selection = self._selector.next()


class TeamMatch(ParallelEnv):
    """Centralized critics (issue 51): a cooperative two-agent game with a global state.
    Agents ``a0``, ``a1``; each sees Box(0, 1, (2,)) = [its own target bit, t / length] and acts
    Discrete(2); both get the team reward (number of agents whose action is their target) / 2,
    so an episode of ``length`` steps returns at most ``length`` per agent (random: half).
    ``state()`` is Box(0, 100, (3,)) = [target of a0, target of a1, 10 * t + 100]: known to
    the tests, and different from any observation. Truncated after ``length`` steps."""

    metadata = {"name": "team_match_v0"}
    possible_agents = ["a0", "a1"]

    def __init__(self, length=8):
        self.length, self.agents, self.t = int(length), [], 0
        self.state_space = spaces.Box(0.0, 200.0, (3,), np.float32)
        self.rng = np.random.default_rng(0)
        self.targets = np.zeros(2, np.int64)

    def observation_space(self, agent):
        return spaces.Box(0.0, 1.0, (2,), np.float32)

    def action_space(self, agent):
        return spaces.Discrete(2)

    def _obs(self):
        return {a: np.array([self.targets[i], self.t / self.length], np.float32) for i, a in enumerate(self.agents)}

    def state(self):
        return np.array([self.targets[0], self.targets[1], 10.0 * self.t + 100.0], np.float32)

    def reset(self, seed=None, options=None):
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.agents, self.t = list(self.possible_agents), 0
        self.targets = self.rng.integers(0, 2, 2)
        return self._obs(), {a: {} for a in self.agents}

    def step(self, actions):
        assert set(actions) == set(self.agents), (actions, self.agents)
        r = sum(int(actions[a]) == int(self.targets[i]) for i, a in enumerate(self.possible_agents)) / 2.0
        self.t += 1
        self.targets = self.rng.integers(0, 2, 2)
        done = self.t >= self.length
        obs = self._obs()
        out = (obs, {a: r for a in self.agents}, {a: False for a in self.agents}, {a: done for a in self.agents},
               {a: {} for a in self.agents})
        if done:
            self.agents = []
        return out
