"""Tiny envs for the tests (importable as ``env.factory=envs:Name``; Ray workers see this
folder through the test session's PYTHONPATH)."""
import gymnasium as gym
import numpy as np
from gymnasium import spaces


class ConstantEnv(gym.Env):
    """C01: obs 0.5 (reset obs configurable), reward +1, never terminates by itself; a
    TimeLimit is added by the factory."""

    def __init__(self, reset_obs=0.5, terminate_at=None):
        self.observation_space = spaces.Box(0.0, 1.0, (1,), np.float32)
        self.action_space = spaces.Discrete(2)
        self.reset_obs, self.terminate_at, self.t = reset_obs, terminate_at, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.array([self.reset_obs], np.float32), {}

    def step(self, action):
        self.t += 1
        term = self.terminate_at is not None and self.t >= self.terminate_at
        return np.array([0.5], np.float32), 1.0, term, False, {}


def constant(limit=5, reset_obs=0.5, terminate_at=None):
    return gym.wrappers.TimeLimit(ConstantEnv(reset_obs, terminate_at), limit)


class FixedLenEnv(gym.Env):
    """Episodes of exactly ``length`` steps (terminated), obs = step / length."""

    def __init__(self, length=3):
        self.observation_space = spaces.Box(0.0, 1.0, (1,), np.float32)
        self.action_space = spaces.Discrete(2)
        self.length, self.t = length, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.array([0.0], np.float32), {}

    def step(self, action):
        self.t += 1
        return np.array([self.t / self.length], np.float32), 1.0, self.t >= self.length, False, {}


class CounterEnv(gym.Env):
    """C02: obs Discrete(10) = step count from 0, reward 1, never terminates."""

    def __init__(self):
        self.observation_space = spaces.Discrete(10)
        self.action_space = spaces.Discrete(2)
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return 0, {}

    def step(self, action):
        self.t += 1
        return self.t, 1.0, False, False, {}


def counter(context=None):
    """Sub-env j gets TimeLimit(3 + j)."""
    j = 0 if context is None else context.vector_index
    return gym.wrappers.TimeLimit(CounterEnv(), 3 + j)


class BoxTargetEnv(gym.Env):
    """C06: action Box(0,1,(1,)), obs fixed 0, reward -(a - 0.1)^2, episode length 1; step()
    asserts the action is inside the space."""

    received = []

    def __init__(self, low=0.0, high=1.0, dtype=np.float32):
        self.observation_space = spaces.Box(-1.0, 1.0, (1,), np.float32)
        self.action_space = spaces.Box(low, high, (1,), dtype)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(1, np.float32), {}

    def step(self, action):
        assert self.action_space.contains(np.asarray(action, self.action_space.dtype)), action
        a = float(np.asarray(action).reshape(-1)[0])
        BoxTargetEnv.received.append(a)
        return np.zeros(1, np.float32), -(a - 0.1) ** 2, True, False, {}


class RandomRewardEnv(gym.Env):
    """C07: obs Box(-1,1,(2,)), Discrete(2), reward uniform in [0,1], length 10."""

    def __init__(self, equal_reward=None):
        self.observation_space = spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.action_space = spaces.Discrete(2)
        self.equal_reward, self.t = equal_reward, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self.np_random.uniform(-1, 1, 2).astype(np.float32), {}

    def step(self, action):
        self.t += 1
        r = self.equal_reward if self.equal_reward is not None else float(self.np_random.uniform())
        return self.np_random.uniform(-1, 1, 2).astype(np.float32), r, self.t >= 10, False, {}


class BadObsEnv(gym.Env):
    """Returns an observation of the wrong shape on step 2 (for the space checks)."""

    def __init__(self, mode="shape"):
        self.observation_space = spaces.Dict({"pos": spaces.Box(-1.0, 1.0, (3,), np.float32)})
        self.action_space = spaces.Discrete(2)
        self.mode, self.t = mode, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return {"pos": np.zeros(3, np.float32)}, {}

    def step(self, action):
        self.t += 1
        if self.t >= 2 and self.mode == "shape":
            return {"pos": np.zeros(2, np.float32)}, 0.0, False, False, {}
        if self.t >= 2 and self.mode == "bounds":
            return {"pos": np.full(3, 5.0, np.float32)}, 0.0, False, False, {}
        if self.t >= 2 and self.mode == "reward":
            return {"pos": np.zeros(3, np.float32)}, float("nan"), False, False, {}
        return {"pos": np.zeros(3, np.float32)}, 0.0, False, False, {}


def hang(context=None, at=12, seconds=3600.0, every_restart=False):
    """FixedLenEnv whose worker 0, sub-env 0 hangs (sleeps ``seconds``) at its step ``at``:
    only before its first restart unless ``every_restart`` (then at the first step of each
    rebuilt one) (issue 13, a stuck worker)."""
    import time
    env = FixedLenEnv()
    stuck = context is not None and context.worker_index == 0 and context.vector_index == 0 and (
        every_restart or context.restart_count == 0)
    if stuck:
        step, count = env.step, [0]
        at = at if context.restart_count == 0 else 1

        def slow_step(action):
            count[0] += 1
            if count[0] == at:
                time.sleep(seconds)
            return step(action)
        env.step = slow_step
    return env


def slow(delay=0.05, init_s=0.0, marker=None):
    """FixedLenEnv with ``delay`` seconds per step (and ``init_s`` in its constructor, after
    creating the file ``marker``)."""
    import time
    if marker:
        open(marker, "w").close()
    time.sleep(init_s)
    env = FixedLenEnv()
    step = env.step

    def slow_step(action):
        time.sleep(delay)
        return step(action)
    env.step = slow_step
    return env


class BadApiEnv(FixedLenEnv):
    """Breaks the Gymnasium API: ``none_reward`` at step 2, ``old_reset`` (reset returns the
    observation alone), ``late_shape`` (a wrong obs shape at step 6, after the checked steps)."""

    def __init__(self, mode="none_reward"):
        super().__init__(length=100)
        self.mode = mode

    def reset(self, *, seed=None, options=None):
        obs, info = super().reset(seed=seed)
        return obs if self.mode == "old_reset" else (obs, info)

    def step(self, action):
        obs, r, term, trunc, info = super().step(action)
        if self.mode == "none_reward" and self.t == 2:
            r = None
        if self.mode == "late_shape" and self.t >= 6:
            obs = np.zeros(3, np.float32)
        return obs, r, term, trunc, info


class NonFiniteEnv(gym.Env):
    """Issue 13, non-finite values: Dict obs with an unbounded ``position``; ``mode`` ``obs``
    puts NaN in ``position[2]`` and ``reward`` an inf reward at step ``at``; ``huge`` gives
    rewards of ``scale`` (finite, but the value loss overflows float32)."""

    def __init__(self, mode="obs", at=7, scale=1e30):
        self.observation_space = spaces.Dict({"speed": spaces.Box(-1.0, 1.0, (1,), np.float32),
                                              "position": spaces.Box(-np.inf, np.inf, (3,), np.float32)})
        self.action_space = spaces.Discrete(2)
        self.mode, self.at, self.scale, self.t = mode, at, scale, 0

    def _obs(self):
        pos = np.full(3, float(self.t), np.float32)
        if self.mode == "obs" and self.t == self.at:
            pos[2] = np.nan
        return {"speed": np.zeros(1, np.float32), "position": pos}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        r = np.inf if self.mode == "reward" and self.t == self.at else self.scale if self.mode == "huge" else 1.0
        return self._obs(), float(r), self.t >= 20, False, {}


class NoSpacesEnv(gym.Env):
    """An env that never sets observation_space / action_space (issue 13)."""

    def reset(self, *, seed=None, options=None):
        return np.zeros(2, np.float32), {}

    def step(self, action):
        return np.zeros(2, np.float32), 0.0, False, False, {}


def stuck_eval(context=None, mode="sleep", seconds=60.0, marker=None):
    """FixedLenEnv that gets stuck on the driver's evaluation worker (worker index -1) only
    (issue 28): ``sleep``: its first step sleeps ``seconds``; ``endless``: its episodes do not
    end for ``seconds``; ``exit``: its first step calls ``os._exit(3)``; ``sys.exit``: ``sys.exit(3)``;
    ``raise``: its first step raises RuntimeError("simulator disconnected");
    ``from_env``: the mode named by the environment variable STUCK_EVAL (none: not stuck).
    ``marker``: a file created when it gets stuck."""
    import os
    import sys
    import time
    env = FixedLenEnv()
    mode = os.environ.get("STUCK_EVAL", "none") if mode == "from_env" else mode
    if context is None or context.worker_index != -1 or mode == "none":
        return env
    step = env.step
    t0 = [None]

    def stuck_step(action):
        if marker:
            open(marker, "a").close()
        if mode == "exit":
            os._exit(3)
        if mode == "sys.exit":
            sys.exit(3)
        if mode == "raise":
            raise RuntimeError("simulator disconnected")
        if mode == "sleep":
            time.sleep(seconds)
            return step(action)
        t0[0] = t0[0] or time.monotonic()
        obs, r, _, trunc, info = step(action)
        env.t = 0
        return obs, r, time.monotonic() - t0[0] > seconds, trunc, info
    env.step = stuck_step
    return env


def slow_worker(context=None, worker=1, delay=0.01):
    """CartPole-v1 whose steps on rollout worker ``worker`` take ``delay`` seconds longer (a
    straggler, for DD-PPO's preemption)."""
    import time
    env = gym.make("CartPole-v1")
    if context is not None and context.worker_index == worker:
        step = env.step

        def slow_step(action):
            time.sleep(delay)
            return step(action)
        env.step = slow_step
    return env


class EpisodesEnv(gym.Env):
    """Recurrent-state tests: episodes of known lengths, obs Box(1,) = 10 * episode + step + 1
    (never 0, the final observation included), action Discrete(2) ignored, reward 1; sub-env
    ``j``'s episode ``e`` lasts ``lengths[(e + j) % len(lengths)]`` steps and ends terminated
    (even ``e``) or truncated (odd ``e``)."""

    lengths = (3, 5, 1, 4)

    def __init__(self, j=0):
        self.observation_space = spaces.Box(0.0, 1e6, (1,), np.float32)
        self.action_space = spaces.Discrete(2)
        self.j, self.e, self.t = j, -1, 0

    def _obs(self):
        return np.array([10 * self.e + self.t + 1], np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.e, self.t = self.e + 1, 0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        end = self.t >= self.lengths[(self.e + self.j) % len(self.lengths)]
        return self._obs(), 1.0, end and self.e % 2 == 0, end and self.e % 2 == 1, {}


def episodes(context=None):
    return EpisodesEnv(0 if context is None else context.vector_index)


def interrupted_cartpole(render_mode=None, at=5):
    """CartPole-v1 whose step ``at`` raises KeyboardInterrupt, as Ctrl-C (or flowkit's SIGTERM
    handler) would in the middle of an evaluation's episode."""
    env = gym.make("CartPole-v1", render_mode=render_mode)
    step, n = env.step, [0]

    def interrupted_step(action):
        n[0] += 1
        if n[0] == at:
            raise KeyboardInterrupt
        return step(action)
    env.step = interrupted_step
    return env


class _Counted(gym.Wrapper):
    """Appends "built" to the file ``log`` when made and "released" when freed; with ``at``, sends
    this process SIGTERM at its step ``at``."""

    def __init__(self, env, log, at=None):
        super().__init__(env)
        self.log, self.at, self.n = log, at, 0
        with open(log, "a") as f:
            f.write("built\n")

    def step(self, action):
        self.n += 1
        if self.n == self.at:
            import os
            import signal
            os.kill(os.getpid(), signal.SIGTERM)
        return self.env.step(action)

    def __del__(self):
        with open(self.log, "a") as f:
            f.write("released\n")


def sigterm_at(context=None, at=20, log="envs.log"):
    """CartPole-v1 that sends this process SIGTERM at step ``at`` of rollout worker 0's sub-env 0
    (on the local backend the signal lands inside the env's step); every instance is counted in
    ``log`` (:class:`_Counted`)."""
    armed = context is not None and (context.worker_index, context.vector_index) == (0, 0)
    return _Counted(gym.make("CartPole-v1"), log, at if armed else None)
