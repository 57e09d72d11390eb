"""Tiny deterministic envs for tests: a few steps each, seeded through ``reset(seed=...)``,
learnable in a few thousand env steps (the learning check of
:func:`~flowkit.testing.check_algorithm`). Importable on Ray workers (name them as
``env.factory=flowkit.testing.envs:match``). Episodes last ``length`` steps (terminated).

- :func:`match` -- discrete: obs Discrete(n) = a random target, action Discrete(n), reward 1
  when the action is the target (return ``length`` at best, ``length / n`` at random).
- :func:`target` -- Box: obs Box(-1, 1, (1,)) float32 = a random target x, action
  Box(-1, 1, (1,)), reward ``1 - |a - x|`` (``length`` at best, about ``length / 3`` at random).
- :func:`masked_match` -- Dict(observation=Discrete(n), action_mask=MultiBinary(n)): as
  :func:`match`, with a mask allowing the target and one other action (the rest illegal).
- :func:`turn_game` -- a two-player PettingZoo AEC game (needs ``pettingzoo``): players
  ``p0`` and ``p1`` take turns; each sees :func:`masked_match`'s observation and gets 1 for
  matching its target; the game ends after ``length`` moves.
- :class:`PointGoalEnv` (Gymnasium id ``flowkit.testing.envs:PointGoal-v0``, or
  :func:`point_goal`) -- a task distribution, the MAML paper's 2D navigation: a point moves
  towards a goal it does not see; task-settable (:class:`flowkit.core.TaskSettableEnv`).

An env whose cost is waiting, for scaling benchmarks (bench/scaling.py):

- :class:`SleepEnv` (Gymnasium id ``flowkit.testing.envs:Sleep-v0``) -- each step sleeps
  ``step_s`` seconds and returns a CartPole-sized observation (``obs="vector"``: float32 (4,))
  or an Atari-sized frame stack (``obs="image"``: uint8 (84, 84, 4)); Discrete(2), reward 1,
  ``length`` steps (truncated). Made with ``gym.make_vec`` (flowkit's native vector path) it
  is :class:`SleepVectorEnv`, a batched simulator: one sleep of ``step_s`` per step of all its
  sub-envs, so a worker with ``k`` sub-envs can at best make ``k / step_s`` env steps per
  second, and ``N`` workers ``N k / step_s``: the optimum a framework's overhead is measured
  against when the env computes nothing.

Partially observed envs, for recurrent policies (``model.recurrent``):

- :func:`recall` -- a memory task: obs Discrete(n) = a random symbol each step, action
  Discrete(n), reward 1 when the action is the symbol shown ``k`` steps before (none in the
  first ``k`` steps): ``length - k`` at best; a feed-forward policy sees only the current
  symbol, independent of the rewarded one, and stays at chance, ``(length - k) / n``.
- :func:`cartpole_no_velocity` -- CartPole-v1 with the velocities hidden: obs Box(2,) = (cart
  position, pole angle). Gymnasium's CartPole otherwise (500 steps, truncated); a policy must
  infer the velocities from the observations it saw. Also the Gymnasium id ``CartPoleNoVel-v1``
  (registered when this module is imported: ``env=flowkit.testing.envs:CartPoleNoVel-v1``;
  the RL Zoo's name for it).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

import gymnasium as gym
import numpy as np
from gymnasium import spaces


class _Tiny(gym.Env):
    metadata: Dict[str, Any] = {}

    def __init__(self, length: int = 8):
        self.length, self.t, self.x = int(length), 0, 0

    def _draw(self) -> None:
        raise NotImplementedError

    def _obs(self) -> Any:
        raise NotImplementedError

    def _reward(self, action: Any) -> float:
        raise NotImplementedError

    def reset(self, *, seed: Optional[int] = None, options: Optional[dict] = None):
        super().reset(seed=seed)
        self.t = 0
        self._draw()
        return self._obs(), {}

    def step(self, action):
        r = self._reward(action)
        self.t += 1
        self._draw()
        return self._obs(), r, self.t >= self.length, False, {}


class MatchEnv(_Tiny):
    """See :func:`match`."""

    def __init__(self, n: int = 2, length: int = 8):
        super().__init__(length)
        self.n = int(n)
        self.observation_space = spaces.Discrete(self.n)
        self.action_space = spaces.Discrete(self.n)

    def _draw(self) -> None:
        self.x = int(self.np_random.integers(self.n))

    def _obs(self) -> Any:
        return self.x

    def _reward(self, action: Any) -> float:
        return float(int(action) == self.x)


class MaskedMatchEnv(MatchEnv):
    """See :func:`masked_match`."""

    def __init__(self, n: int = 3, length: int = 8):
        super().__init__(n, length)
        self.observation_space = spaces.Dict({"observation": spaces.Discrete(self.n),
                                              "action_mask": spaces.MultiBinary(self.n)})
        self.mask = np.ones(self.n, np.int8)

    def _draw(self) -> None:
        super()._draw()
        self.mask = np.zeros(self.n, np.int8)
        self.mask[[self.x, (self.x + 1 + int(self.np_random.integers(self.n - 1))) % self.n]] = 1

    def _obs(self) -> Any:
        return {"observation": self.x, "action_mask": self.mask.copy()}

    def _reward(self, action: Any) -> float:
        if not self.mask[int(action)]:
            raise ValueError(f"illegal action {int(action)} (mask {self.mask.tolist()})")
        return super()._reward(action)


class TargetEnv(_Tiny):
    """See :func:`target`."""

    def __init__(self, length: int = 8):
        super().__init__(length)
        self.observation_space = spaces.Box(-1.0, 1.0, (1,), np.float32)
        self.action_space = spaces.Box(-1.0, 1.0, (1,), np.float32)
        self.xf = 0.0

    def _draw(self) -> None:
        self.xf = float(self.np_random.uniform(-1, 1))

    def _obs(self) -> Any:
        return np.array([self.xf], np.float32)

    def _reward(self, action: Any) -> float:
        return 1.0 - abs(float(np.clip(np.asarray(action, np.float32).reshape(-1)[0], -1, 1)) - self.xf)


class PointGoalEnv(gym.Env):
    """The 2D navigation task distribution of MAML (Finn, Abbeel, Levine 2017, "Model-Agnostic
    Meta-Learning for Fast Adaptation of Deep Networks", arXiv 1703.03400, section 5.3).

    A point starts at the origin; its observation is its position (float32[2]); an action is
    its velocity, Box(-0.1, 0.1, (2,)) (clipped); the reward of a step is minus the distance
    from the new position to the goal. Episodes last ``horizon`` steps (truncated; never
    terminated). A task is a goal, float32[2] drawn uniformly from [-0.5, 0.5]^2; the goal is
    not observed, so a policy finds it only from rewards: what one adaptation step learns.

    Task-settable (:class:`flowkit.core.TaskSettableEnv`): ``sample_tasks(n)`` (with
    ``self.np_random``), ``set_task(goal)``, ``get_task()``. Until a task is set, every reset
    draws a new goal: the env is then the whole distribution (multi-task training).
    Returns of reference: about -38 staying at the origin for a goal drawn at random, and
    about -0.5 heading straight to a known goal (horizon 100).
    """

    metadata: Dict[str, Any] = {"render_modes": []}

    def __init__(self, horizon: int = 100, goal: Optional[Any] = None):
        self.horizon = int(horizon)
        self.observation_space = spaces.Box(-0.1 * self.horizon, 0.1 * self.horizon, (2,), np.float32)
        self.action_space = spaces.Box(-0.1, 0.1, (2,), np.float32)
        self.task: Optional[np.ndarray] = None if goal is None else np.asarray(goal, np.float32).reshape(2)
        self.goal = np.zeros(2, np.float32)
        self.pos = np.zeros(2, np.float32)
        self.t = 0

    def sample_tasks(self, n: int) -> List[np.ndarray]:
        return [g for g in self.np_random.uniform(-0.5, 0.5, (int(n), 2)).astype(np.float32)]

    def set_task(self, task: Any) -> None:
        self.task = np.asarray(task, np.float32).reshape(2).copy()

    def get_task(self) -> Optional[np.ndarray]:
        return None if self.task is None else self.task.copy()

    def reset(self, *, seed: Optional[int] = None, options: Optional[dict] = None):
        super().reset(seed=seed)
        self.goal = self.task.copy() if self.task is not None else self.sample_tasks(1)[0]
        self.pos, self.t = np.zeros(2, np.float32), 0
        return self.pos.copy(), {}

    def step(self, action):
        a = np.clip(np.asarray(action, np.float32).reshape(2), -0.1, 0.1)
        lim = 0.1 * self.horizon
        self.pos = np.clip(self.pos + a, -lim, lim).astype(np.float32)
        self.t += 1
        reward = -float(np.linalg.norm(self.pos - self.goal))
        return self.pos.copy(), reward, False, self.t >= self.horizon, {}


class SleepEnv(gym.Env):
    """See the module docstring: ``step_s`` (seconds, >= 0) of sleep per step."""

    def __init__(self, step_s: float = 0.002, obs: str = "vector", length: int = 200):
        if obs not in ("vector", "image") or not step_s >= 0 or int(length) < 1:
            raise ValueError(f"Sleep-v0: obs={obs!r} (vector or image), step_s={step_s} (>= 0), length={length} (>= 1)")
        self.step_s, self.length, self.t = float(step_s), int(length), 0
        self.observation_space = (spaces.Box(-1.0, 1.0, (4,), np.float32) if obs == "vector"
                                  else spaces.Box(0, 255, (84, 84, 4), np.uint8))
        self.action_space = spaces.Discrete(2)
        self._obs = np.zeros(self.observation_space.shape, self.observation_space.dtype)

    def reset(self, *, seed: Optional[int] = None, options: Optional[dict] = None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs.copy(), {}

    def step(self, action):
        time.sleep(self.step_s)
        self.t += 1
        return self._obs.copy(), 1.0, False, self.t >= self.length, {}


class SleepVectorEnv(gym.vector.VectorEnv):
    """``num_envs`` :class:`SleepEnv` stepped together, with one sleep of ``step_s`` per step
    (Gymnasium's next-step autoreset: the step after a truncation resets that sub-env and is
    not a transition)."""

    metadata = {"autoreset_mode": gym.vector.AutoresetMode.NEXT_STEP}

    def __init__(self, num_envs: int = 1, step_s: float = 0.002, obs: str = "vector", length: int = 200, **_: Any):
        one = SleepEnv(0.0, obs, length)
        self.num_envs, self.step_s, self.length = int(num_envs), float(step_s), one.length
        self.single_observation_space, self.single_action_space = one.observation_space, one.action_space
        self.observation_space = gym.vector.utils.batch_space(one.observation_space, self.num_envs)
        self.action_space = gym.vector.utils.batch_space(one.action_space, self.num_envs)
        self._obs = np.zeros((self.num_envs, *one._obs.shape), one._obs.dtype)
        self.t = np.zeros(self.num_envs, np.int64)
        self.done = np.zeros(self.num_envs, bool)

    def reset(self, *, seed: Any = None, options: Optional[dict] = None):
        self.t[:], self.done[:] = 0, False
        return self._obs.copy(), {}

    def step(self, actions):
        time.sleep(self.step_s)
        self.t = np.where(self.done, 0, self.t + 1)
        reward = np.where(self.done, 0.0, 1.0)
        trunc = self.t >= self.length
        self.done = trunc.copy()
        return self._obs.copy(), reward, np.zeros(self.num_envs, bool), trunc, {}


def point_goal(horizon: int = 100, goal: Optional[Any] = None) -> PointGoalEnv:
    return PointGoalEnv(horizon, goal)


if "Sleep-v0" not in gym.registry:
    gym.register("Sleep-v0", entry_point="flowkit.testing.envs:SleepEnv",
                 vector_entry_point="flowkit.testing.envs:SleepVectorEnv")
if "PointGoal-v0" not in gym.registry:
    gym.register("PointGoal-v0", entry_point="flowkit.testing.envs:PointGoalEnv")
class RecallEnv(_Tiny):
    """See :func:`recall`."""

    def __init__(self, n: int = 2, k: int = 1, length: int = 16):
        super().__init__(length)
        self.n, self.k = int(n), int(k)
        if not 1 <= self.k < self.length:
            raise ValueError(f"recall: k={k} must be in [1, length={length})")
        self.observation_space = spaces.Discrete(self.n)
        self.action_space = spaces.Discrete(self.n)
        self.shown: list = []

    def _draw(self) -> None:
        if self.t == 0:
            self.shown = []
        self.x = int(self.np_random.integers(self.n))
        self.shown.append(self.x)

    def _obs(self) -> Any:
        return self.x

    def _reward(self, action: Any) -> float:  # the symbol shown k steps before this one
        return float(self.t >= self.k and int(action) == self.shown[self.t - self.k])


def recall(n: int = 2, k: int = 1, length: int = 16) -> RecallEnv:
    return RecallEnv(n, k, length)


def cartpole_no_velocity(**kwargs: Any) -> gym.Env:
    env = gym.make("CartPole-v1", **kwargs)
    box = env.observation_space
    assert isinstance(box, spaces.Box)
    return gym.wrappers.TransformObservation(env, lambda o: np.asarray(o, np.float32)[[0, 2]],
                                             spaces.Box(box.low[[0, 2]], box.high[[0, 2]], (2,), np.float32))


if "CartPoleNoVel-v1" not in gym.registry:
    gym.register("CartPoleNoVel-v1", entry_point="flowkit.testing.envs:cartpole_no_velocity")




def match(n: int = 2, length: int = 8) -> MatchEnv:
    return MatchEnv(n, length)


def masked_match(n: int = 3, length: int = 8) -> MaskedMatchEnv:
    return MaskedMatchEnv(n, length)


def target(length: int = 8) -> TargetEnv:
    return TargetEnv(length)


def turn_game(n: int = 3, length: int = 6) -> Any:
    from flowkit.testing._aec import TurnGame
    return TurnGame(n, length)


@dataclass(frozen=True)
class TinyEnv:
    """A tiny env as the fixtures give it: ``factory`` (``module:callable``), ``override``
    (``env.factory=...`` for a config), ``make()`` (an instance) and ``solved``, a greedy
    return per episode that only a policy that learned reaches (random play is far below)."""
    factory: str
    solved: float

    @property
    def override(self) -> str:
        return f"env.factory={self.factory}"

    def make(self, **kwargs: Any) -> Any:
        from flowkit.core.names import resolve
        return resolve(self.factory, "env.factory")(**kwargs)


DISCRETE = TinyEnv("flowkit.testing.envs:match", 7.0)   # random: 4 of 8
BOX = TinyEnv("flowkit.testing.envs:target", 6.4)       # random: about 2.7 of 8
MASKED = TinyEnv("flowkit.testing.envs:masked_match", 7.0)  # random among legal: 4 of 8
TURN_GAME = TinyEnv("flowkit.testing.envs:turn_game", 2.5)  # per player; random: 1.5 of 3
RECALL = TinyEnv("flowkit.testing.envs:recall", 13.0)       # random (and any feed-forward policy): 7.5 of 15
