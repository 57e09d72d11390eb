"""Issue 6, part 5: bad input never becomes a traceback."""
import gymnasium as gym
import numpy as np


class _BadObsEnv(gym.Env):
    """Box(-1, 1, (3,)) float32 declared; ``obs_fn(t)`` is what it really returns."""

    def __init__(self, obs_fn):
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.obs_fn, self.t = obs_fn, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self.obs_fn(0), {}

    def step(self, action):
        self.t += 1
        return self.obs_fn(self.t), 1.0, self.t >= 5, False, {}


def wrong_shape_env():
    return _BadObsEnv(lambda t: np.zeros(4, np.float32))
