"""Env construction (:func:`make_env`, :class:`EnvContext`), seeds (:func:`derive_seed`),
space checks (:func:`find_mismatch`, :class:`SpaceCheck`) and the task-settable env protocol
(:class:`TaskSettableEnv`, :func:`task_env`).

Seeds (documented, derived from the one ``seed``): sub-env ``j`` of worker ``i`` after ``r``
restarts resets first with ``derive_seed(seed, "env", i, j, r)``; worker ``i``'s exploration
RNG uses ``derive_seed(seed, "policy", i, r)``; the learner uses ``derive_seed(seed,
"learner")``. ``derive_seed`` hashes its arguments with numpy's SeedSequence, so sub-envs never
share a seed and a restarted worker does not replay its first episodes.
"""
from __future__ import annotations

import contextlib
import dataclasses
import inspect
import math
import sys
import zlib
from typing import Any, Callable, List, Optional, Protocol, Tuple, runtime_checkable

import gymnasium as gym
import numpy as np

from flowkit.config import ConfigError
from flowkit.core.names import resolve
from flowkit.core.presets import env_preset, preset_hint


class EnvError(RuntimeError):
    """An env misbehaved (bad output, or it raised); names env, worker and sub-env."""


@dataclasses.dataclass
class EnvContext:
    """What an env factory gets as ``context=`` (if it accepts that keyword).

    Attributes:
        worker_index: 0-based rollout worker index (-1 for the driver's evaluation worker).
        vector_index: sub-env index inside the worker's vector env.
        num_workers: rollout workers in the run.
        restart_count: how many times this worker slot was rebuilt after a failure.
        seed: the derived seed of this sub-env (see module docstring).
    """
    worker_index: int = 0
    vector_index: int = 0
    num_workers: int = 1
    restart_count: int = 0
    seed: int = 0


def derive_seed(seed: int, *keys: Any) -> int:
    """A 32-bit seed derived from ``seed`` and ``keys`` (strings hashed with crc32)."""
    ints = [int(seed) & 0xFFFFFFFF] + [zlib.crc32(k.encode()) if isinstance(k, str) else int(k) & 0xFFFFFFFF
                                       for k in keys]
    return int(np.random.SeedSequence(ints).generate_state(1)[0])


@runtime_checkable
class TaskSettableEnv(Protocol):
    """An env whose task can be set: the protocol of meta-learning (MAML) and of
    RLlib's ``TaskSettableEnv``. A Gymnasium env (or anything under its wrappers) that has
    these methods is one; no base class is needed.

    - ``sample_tasks(n) -> list``: ``n`` tasks drawn from the task distribution with the env's
      own RNG (``self.np_random``, seeded by ``reset(seed=...)``: flowkit seeds it before each
      draw, so the tasks of a run follow from its seed). A task is plain, picklable data (a
      goal array, a dict of physics parameters): it travels to the rollout workers.
    - ``set_task(task)``: episodes from the next ``reset()`` on are of ``task``.
    - ``get_task()``: the current task.

    Example: :class:`flowkit.testing.envs.PointGoalEnv` (the MAML paper's 2D navigation);
    :meth:`flowkit.core.RolloutWorker.set_task` sets one task on every sub-env of a worker.
    """

    def sample_tasks(self, n: int) -> List[Any]: ...

    def set_task(self, task: Any) -> None: ...

    def get_task(self) -> Any: ...


def task_env(env: Any, name: str = "") -> TaskSettableEnv:
    """The object under ``env``'s wrappers that implements :class:`TaskSettableEnv` (the env
    itself, or its ``unwrapped`` env).

    Raises:
        EnvError: neither has ``sample_tasks``, ``set_task`` and ``get_task`` (``name``: the
            env's name for the message).
    """
    for obj in (env, getattr(env, "unwrapped", None)):
        if obj is not None and isinstance(obj, TaskSettableEnv):
            return obj
    raise EnvError(f"env {name or type(env).__name__!r} is not task-settable: it needs methods sample_tasks(n), "
                   "set_task(task) and get_task() (flowkit.core.TaskSettableEnv)")


def env_name(env_cfg: Any) -> str:
    return env_cfg.get("id") or env_cfg.get("factory") or "<no env>"


_MUJOCO_QUIET: List[bool] = []
_MUJOCO_SHOW = [True]  # False in a Ray rollout worker's process (see mute_env_notes)


def mute_env_notes() -> None:
    """In this process, MuJoCo's notes about its model files are dropped, not shown: a Ray
    rollout worker's envs are the driver's, which built one first and said them once."""
    _MUJOCO_SHOW[0] = False


def _mujoco_warnings_once(env_id: str) -> None:
    """Before the first MuJoCo env of a process: MuJoCo's own warnings (mujoco 4 warns of a
    deprecated attribute in Gymnasium's model files, once per env built) become Python warnings,
    each message once per process (none in a Ray rollout worker: :func:`mute_env_notes`), instead
    of a line per env on stderr and a MUJOCO_LOG.TXT written into the current folder."""
    if _MUJOCO_QUIET:
        return
    try:
        spec = gym.spec(str(env_id))
    except Exception:
        return  # gym.make gives the error
    if "mujoco" not in str(spec.entry_point):
        return
    import warnings

    import mujoco  # type: ignore[import-untyped]
    seen = set()

    def once(msg: str) -> None:  # (Python's own once-per-place is reset by every filter change, e.g. torch's import)
        if _MUJOCO_SHOW[0] and msg.strip() not in seen:
            seen.add(msg.strip())
            warnings.warn(f"MuJoCo: {msg.strip()}", stacklevel=2)

    mujoco.set_mju_user_warning(once)
    _MUJOCO_QUIET.append(True)


def make_env(env_cfg: Any, context: EnvContext) -> Any:
    """Build one env from ``env.id`` (gym.make) or ``env.factory`` (called with
    ``env.kwargs`` and, if it accepts it, ``context=``); wrap in TimeLimit when
    ``env.max_episode_steps`` is set. With ``env.preset``: the env of the preset registered
    under that name (:mod:`flowkit.core.presets`: its training wrappers on rollout workers,
    ``context.worker_index >= 0``, its evaluation ones elsewhere; it applies
    ``env.max_episode_steps`` itself).

    Raises:
        ConfigError: ``env.preset`` names no registered preset.
    """
    kwargs = dict(env_cfg.get("kwargs") or {})
    if name := env_cfg.get("preset"):
        return env_preset(name).make_env(env_cfg, context)
    elif path := env_cfg.get("factory"):
        fn = resolve(path, "env.factory")
        if not callable(fn):
            raise ValueError(f"env.factory={path!r} is not callable")
        try:
            accepts = "context" in inspect.signature(fn).parameters
        except (TypeError, ValueError):
            accepts = False
        env = fn(context=context, **kwargs) if accepts else fn(**kwargs)
    else:
        _mujoco_warnings_once(env_cfg["id"])
        env = gym.make(env_cfg["id"], **kwargs)
    if env_cfg.get("max_episode_steps") and isinstance(env, gym.Env):
        env = gym.wrappers.TimeLimit(env, max_episode_steps=int(env_cfg["max_episode_steps"]))
    return env


def build_error(env_cfg: Any, e: BaseException) -> ConfigError:
    """The one-line error of an env that cannot be built (``e``: what building it raised),
    naming ``env.id`` or ``env.factory``; for an ``env.id`` without a preset that a preset
    claims, the preset's hint."""
    hint = None if env_cfg.get("factory") or env_cfg.get("preset") else preset_hint(env_cfg.get("id"))
    mod, _, attr = str(env_cfg.get("id") or "").rpartition(":")  # gym.make imported `mod`: a function of it?
    if not hint and mod and callable(getattr(sys.modules.get(mod), attr, None)):
        hint = (f"env.id={env_cfg['id']!r} names a function, not a Gymnasium id (pkg:Name-v0): a function that builds "
                f"the env (a PettingZoo parallel_env, a gymnasium.Env factory) is given as env.factory={env_cfg['id']}")
    what = f"{'env.factory' if env_cfg.get('factory') else 'env.id'}={env_name(env_cfg)!r}"
    return ConfigError(hint or f"{what}: cannot build the env: {type(e).__name__}: "
                       f"{(str(e).strip().splitlines() or [''])[0]}")


def probe_env(env_cfg: Any, context: EnvContext, check: bool = False) -> Any:
    """:func:`make_env` on the driver (a probe: the run's set-up, ``flowkit evaluate``, a
    dataset's check and recording), its failure one line. ``check`` (the run's set-up): also
    what the maker does not check, before anything starts: a Gymnasium env's time step
    ``unwrapped.dt`` (MuJoCo's ``frame_skip`` x the model's step) must be finite and > 0
    (``frame_skip=-1`` steps the simulation backwards in time, without an error); and a
    registered env (``env.id``) is reset and stepped once (a sampled action): an exception
    there, or a non-finite or out-of-space observation, comes from its ``env.kwargs``
    (``frame_skip=1.5``: MuJoCo's step raises), not from a worker fault to retry. An
    ``env.factory``'s reset is left to the workers (its faults are retried, C12).

    Raises:
        ConfigError: one line naming ``env.id`` or ``env.factory`` (for an ``env.id`` without a
            preset that a preset claims: the preset's hint), what is wrong and ``env.kwargs``.
    """
    what = f"{'env.factory' if env_cfg.get('factory') else 'env.id'}={env_name(env_cfg)!r}"
    try:
        env = make_env(env_cfg, context)
    except Exception as e:
        raise build_error(env_cfg, e) from None
    if not check or not isinstance(env, gym.Env):
        return env
    kw = f" (env.kwargs: {dict(env_cfg['kwargs'])})" if env_cfg.get("kwargs") else ""
    try:
        dt = getattr(env.unwrapped, "dt", None)
        if isinstance(dt, (int, float)) and not (math.isfinite(dt) and dt > 0):
            raise ConfigError(f"{what}: the env's time step dt={dt:g} s is not > 0{kw}")
        for call in ([] if env_cfg.get("factory") else ["reset()", "step()"]):  # (a factory's spaces: checked later)
            try:
                if call == "step()":
                    env.action_space.seed(0)
                obs = env.reset(seed=0)[0] if call == "reset()" else env.step(env.action_space.sample())[0]
            except Exception as e:
                first = (str(e).strip().splitlines() or [""])[0]
                raise ConfigError(f"{what}: its first {call} raised {type(e).__name__}: {first}{kw}") from None
            a = np.asarray(obs) if not isinstance(obs, (dict, tuple)) else None
            if a is not None and a.dtype.kind == "f" and not np.all(np.isfinite(a)):  # (unbounded Boxes too)
                raise ConfigError(f"{what}: its first {call} returned an observation that is not finite: "
                                  f"{describe_value(a)}{kw}")
            if (m := find_mismatch(env.observation_space, obs)) is not None:
                raise ConfigError(f"{what}: its first {call} returned an observation `{m[0]}` outside its space: "
                                  f"expected {m[1]}, received {m[2]}{kw}")
    except ConfigError:
        with contextlib.suppress(Exception):
            env.close()
        raise
    return env


# ---- space checks ---------------------------------------------------------------------------
def describe_value(x: Any) -> str:
    """A short description of a received value for error messages (arrays: shape, dtype and
    the first values)."""
    if isinstance(x, np.ndarray):
        vals = np.array2string(x.reshape(-1)[:6], precision=4, separator=", ")
        return f"array(shape={x.shape}, dtype={x.dtype}, values={vals}{'...' if x.size > 6 else ''})"
    r = repr(x)
    return f"{r[:120]}{'...' if len(r) > 120 else ''} ({type(x).__name__})"


def find_mismatch(space: gym.Space, x: Any, path: str = "obs") -> Optional[Tuple[str, str, str]]:
    """The first place where ``x`` is not in ``space``: ``(key path, expected, received)``,
    or None. float64 values in a float32 Box are accepted (precision, not a bug)."""
    if isinstance(space, gym.spaces.Dict):
        if not isinstance(x, dict):
            return path, f"a dict with keys {list(space.spaces)}", describe_value(x)
        if set(x) != set(space.spaces):
            return path, f"keys {sorted(space.spaces)}", f"keys {sorted(x)}"
        return next(filter(None, (find_mismatch(s, x[k], f"{path}.{k}") for k, s in space.spaces.items())), None)
    if isinstance(space, gym.spaces.Tuple):
        if not isinstance(x, (tuple, list)) or len(x) != len(space.spaces):
            return path, f"a tuple of {len(space.spaces)}", describe_value(x)
        return next(filter(None, (find_mismatch(s, x[i], f"{path}[{i}]") for i, s in enumerate(space.spaces))), None)
    if isinstance(space, gym.spaces.Box):
        a = np.asarray(x)
        exp = f"Box(shape={space.shape}, dtype={space.dtype}, low={space.low.min():g}, high={space.high.max():g})"
        if (a.shape != space.shape or a.dtype.kind not in "fiub"
                or (np.issubdtype(space.dtype, np.integer) and a.dtype.kind == "f")
                or (a.dtype.kind == "f" and not np.all(np.isfinite(a)) and np.all(np.isfinite(space.low)))):
            return path, exp, describe_value(a)
        tol = 1e-6 * np.maximum(1.0, np.abs(space.high))
        if np.any(a < space.low - tol) or np.any(a > space.high + tol):
            return path, exp + " (values out of bounds)", describe_value(a)
    elif isinstance(space, gym.spaces.Discrete):
        a = np.asarray(x)
        if a.shape != () or a.dtype.kind not in "iu" or not space.contains(int(a)):
            return path, f"Discrete({space.n}, start={space.start}) integer", describe_value(x)
    elif not space.contains(x):
        return path, str(space), describe_value(np.asarray(x))
    return None


class SpaceCheck(gym.Wrapper):
    """Checks the first ``steps`` outputs of one env against its declared spaces, then gets
    out of the way. Raises EnvError naming env, worker, sub-env, key path, expected,
    received. Any exception the env itself raises keeps its type and message and gets a note
    naming env, worker, sub-env and restart count (every sub-env is wrapped, ``steps=0``
    included)."""

    def __init__(self, env: gym.Env, name: str, context: EnvContext, steps: int):
        super().__init__(env)
        self._name, self._ctx, self._left = name, context, steps

    def _fail(self, what: str, m: Tuple[str, str, str]):
        raise EnvError(f"env {self._name!r} (worker {self._ctx.worker_index}, sub-env "
                       f"{self._ctx.vector_index}) returned a bad {what}: at `{m[0]}` "
                       f"expected {m[1]}, received {m[2]}")

    def _call(self, call: str, fn: Callable, *args, **kw) -> Any:
        try:
            return fn(*args, **kw)
        except Exception as e:
            if not isinstance(e, EnvError):
                e.add_note(f"[flowkit] raised by {call} of env {self._name!r} in worker "
                           f"{self._ctx.worker_index}, sub-env {self._ctx.vector_index} "
                           f"(restart {self._ctx.restart_count})")
            raise

    def reset(self, **kw):
        out = self._call("reset()", self.env.reset, **kw)
        if not isinstance(out, tuple) or len(out) != 2:  # old Gym: the observation alone
            self._fail("value from reset()", ("reset()", "a tuple (obs, info) (Gymnasium API)", describe_value(out)))
        obs, info = out
        if self._left > 0 and (m := find_mismatch(self.observation_space, obs)):
            self._fail("observation from reset()", m)
        return obs, info

    def step(self, action):
        out = self._call("step()", self.env.step, action)
        if not isinstance(out, tuple) or len(out) != 5 or out[1] is None:  # every step: cheap
            self._fail("value from step()", ("step()", "a tuple (obs, reward, terminated, truncated, info) with "
                                             "a float reward (Gymnasium API)", describe_value(out)))
        if self._left > 0:
            self._left -= 1
            obs, rew, term, trunc, _ = out
            if m := find_mismatch(self.observation_space, obs):
                self._fail("observation from step()", m)
            if np.ndim(rew) != 0 or not np.isfinite(float(np.asarray(rew))):
                self._fail("reward", ("reward", "a finite float scalar", describe_value(np.asarray(rew))))
            for nm, v in (("terminated", term), ("truncated", trunc)):
                if not isinstance(v, (bool, np.bool_)):
                    self._fail(nm, (nm, "a bool", describe_value(v)))
        return out

