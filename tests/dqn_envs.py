"""Tiny envs for the DQN / replay tests (factories for ``env.factory=dqn_envs:...``)."""
import gymnasium as gym
import numpy as np


class Counter(gym.Env):
    """C02: obs Discrete(10) = steps since reset, Discrete(2) actions, reward 1, never
    terminates (a TimeLimit truncates)."""

    observation_space = gym.spaces.Discrete(10)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.n = 0
        return self.n, {}

    def step(self, action):
        self.n += 1
        return self.n, 1.0, False, False, {}


def counter(context=None):
    """Sub-env 0 truncates after 3 steps, sub-env 1 after 4."""
    limit = 3 + (context.vector_index if context is not None else 0)
    return gym.wrappers.TimeLimit(Counter(), max_episode_steps=limit)


class Chain5(gym.Env):
    """C11: Discrete(5) obs, actions 0 = left, 1 = right, reward 1 when at the right end."""

    observation_space = gym.spaces.Discrete(5)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.s = 0
        return self.s, {}

    def step(self, action):
        self.s = min(4, self.s + 1) if int(action) == 1 else max(0, self.s - 1)
        return self.s, float(self.s == 4), False, False, {}


def chain5(context=None):
    return gym.wrappers.TimeLimit(Chain5(), max_episode_steps=10)


class MaskedTwoState(gym.Env):
    """C05: obs Dict(observation=Discrete(2), action_mask=MultiBinary(2)). s0: mask [1,1], any
    action -> s1, reward 0. s1: mask [1,0]; action 0 terminates with reward 0."""

    observation_space = gym.spaces.Dict({"observation": gym.spaces.Discrete(2),
                                         "action_mask": gym.spaces.MultiBinary(2)})
    action_space = gym.spaces.Discrete(2)

    def _obs(self):
        mask = np.array([1, 1] if self.s == 0 else [1, 0], np.int8)
        return {"observation": self.s, "action_mask": mask}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.s = 0
        return self._obs(), {}

    def step(self, action):
        if self.s == 0:
            self.s = 1
            return self._obs(), 0.0, False, False, {}
        assert int(action) == 0, f"illegal action {action} at s1"
        return self._obs(), 0.0, True, False, {}


def masked_two_state(context=None):
    return MaskedTwoState()


class BoxActions(gym.Env):
    observation_space = gym.spaces.Box(-1, 1, (2,), np.float32)
    action_space = gym.spaces.Box(-1, 1, (1,), np.float32)

    def reset(self, *, seed=None, options=None):
        return np.zeros(2, np.float32), {}

    def step(self, action):
        return np.zeros(2, np.float32), 0.0, True, False, {}


def box_actions(context=None):
    return BoxActions()
