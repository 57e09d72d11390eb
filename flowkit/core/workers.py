"""Rollout workers: env construction, space checks, the Gymnasium vector-env runner and the
WorkerSet (Ray actors or in-process objects, same code path).

Seeds (documented, derived from the one ``seed``): sub-env ``j`` of worker ``i`` after ``r``
restarts resets first with ``derive_seed(seed, "env", i, j, r)``; worker ``i``'s exploration
RNG uses ``derive_seed(seed, "policy", i, r)``; the learner uses ``derive_seed(seed,
"learner")``. ``derive_seed`` hashes its arguments with numpy's SeedSequence, so sub-envs never
share a seed and a restarted worker does not replay its first episodes.

Counting: a batch's ``env_steps`` are real transitions; the autoreset step of a
``next_step`` vector env is not one and is not recorded.
"""
from __future__ import annotations

import dataclasses
import importlib
import inspect
import itertools
import logging
import os
import time
import zlib
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import gymnasium as gym
import numpy as np

from flowkit.core import batch as sb
from flowkit.core.flow import LocalActor, LocalFuture, RayActor, get_result
from flowkit.core.policy import MASK_KEY, ObsEncoder, Policy

_log = logging.getLogger("flowkit")


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


def env_name(env_cfg: Any) -> str:
    return env_cfg.get("id") or env_cfg.get("factory") or "<no env>"


def _import_callable(path: str) -> Callable:
    if ":" not in path:
        raise ValueError(f"env.factory={path!r} must be of the form module:callable")
    mod, attr = path.split(":", 1)
    obj = importlib.import_module(mod)
    for part in attr.split("."):
        obj = getattr(obj, part)
    if not callable(obj):
        raise ValueError(f"env.factory={path!r} is not callable")
    return obj


def make_env(env_cfg: Any, context: EnvContext) -> Any:
    """Build one env from ``env.id`` (gym.make) or ``env.factory`` (called with
    ``env.kwargs`` and, if it accepts it, ``context=``); wrap in TimeLimit when
    ``env.max_episode_steps`` is set."""
    kwargs = dict(env_cfg.get("kwargs") or {})
    if env_cfg.get("factory"):
        fn = _import_callable(env_cfg["factory"])
        try:
            accepts = "context" in inspect.signature(fn).parameters
        except (TypeError, ValueError):
            accepts = False
        env = fn(context=context, **kwargs) if accepts else fn(**kwargs)
    else:
        env = gym.make(env_cfg["id"], **kwargs)
    if env_cfg.get("max_episode_steps") and isinstance(env, gym.Env):
        env = gym.wrappers.TimeLimit(env, max_episode_steps=int(env_cfg["max_episode_steps"]))
    return env


# ---- space checks ---------------------------------------------------------------------------
def _describe(x: Any) -> str:
    if isinstance(x, np.ndarray):
        vals = np.array2string(x.reshape(-1)[:6], precision=4, separator=", ")
        return f"array(shape={x.shape}, dtype={x.dtype}, values={vals}{'...' if x.size > 6 else ''})"
    return f"{x!r} ({type(x).__name__})"


def find_mismatch(space: gym.Space, x: Any, path: str = "obs") -> Optional[Tuple[str, str, str]]:
    """The first place where ``x`` is not in ``space``: ``(key path, expected, received)``,
    or None. float64 values in a float32 Box are accepted (precision, not a bug)."""
    if isinstance(space, gym.spaces.Dict):
        if not isinstance(x, dict):
            return path, f"a dict with keys {list(space.spaces)}", _describe(x)
        if set(x) != set(space.spaces):
            return path, f"keys {sorted(space.spaces)}", f"keys {sorted(x)}"
        for k, s in space.spaces.items():
            m = find_mismatch(s, x[k], f"{path}.{k}")
            if m:
                return m
        return None
    if isinstance(space, gym.spaces.Tuple):
        if not isinstance(x, (tuple, list)) or len(x) != len(space.spaces):
            return path, f"a tuple of {len(space.spaces)}", _describe(x)
        for i, s in enumerate(space.spaces):
            m = find_mismatch(s, x[i], f"{path}[{i}]")
            if m:
                return m
        return None
    if isinstance(space, gym.spaces.Box):
        a = np.asarray(x)
        exp = f"Box(shape={space.shape}, dtype={space.dtype}, low={space.low.min():g}, high={space.high.max():g})"
        if a.shape != space.shape:
            return path, exp, _describe(a)
        if a.dtype.kind not in "fiub":
            return path, exp, _describe(a)
        if np.issubdtype(space.dtype, np.integer) and a.dtype.kind == "f":
            return path, exp, _describe(a)
        if a.dtype.kind == "f" and not np.all(np.isfinite(a)) and np.all(np.isfinite(space.low)):
            return path, exp, _describe(a)
        tol = 1e-6 * np.maximum(1.0, np.abs(space.high))
        if np.any(a < space.low - tol) or np.any(a > space.high + tol):
            return path, exp + " (values out of bounds)", _describe(a)
        return None
    if isinstance(space, gym.spaces.Discrete):
        a = np.asarray(x)
        if a.shape != () or a.dtype.kind not in "iu" or not space.contains(int(a)):
            return path, f"Discrete({space.n}, start={space.start}) integer", _describe(x)
        return None
    if not space.contains(x):
        return path, str(space), _describe(np.asarray(x))
    return None


class SpaceCheck(gym.Wrapper):
    """Checks the first ``steps`` outputs of one env against its declared spaces, then gets
    out of the way. Raises EnvError naming env, worker, sub-env, agent, key path, expected,
    received. Any exception the env itself raises keeps its type and message and gets a note
    naming env, worker, sub-env and restart count (every sub-env is wrapped, ``steps=0``
    included)."""

    def __init__(self, env: gym.Env, name: str, context: EnvContext, steps: int):
        super().__init__(env)
        self._name, self._ctx, self._left = name, context, steps

    def _fail(self, what: str, m: Tuple[str, str, str]):
        raise EnvError(f"env {self._name!r} (worker {self._ctx.worker_index}, sub-env "
                       f"{self._ctx.vector_index}, agent 'agent0') returned a bad {what}: at `{m[0]}` "
                       f"expected {m[1]}, received {m[2]}")

    def _note(self, e: BaseException, call: str) -> None:
        if not isinstance(e, EnvError):
            e.add_note(f"[flowkit] raised by {call} of env {self._name!r} in worker "
                       f"{self._ctx.worker_index}, sub-env {self._ctx.vector_index} "
                       f"(restart {self._ctx.restart_count})")

    def reset(self, **kw):
        try:
            obs, info = self.env.reset(**kw)
        except Exception as e:
            self._note(e, "reset()")
            raise
        if self._left > 0:
            m = find_mismatch(self.observation_space, obs)
            if m:
                self._fail("observation from reset()", m)
        return obs, info

    def step(self, action):
        try:
            out = self.env.step(action)
        except Exception as e:
            self._note(e, "step()")
            raise
        if self._left > 0:
            self._left -= 1
            if len(out) != 5:
                raise EnvError(f"env {self._name!r}: step() must return (obs, reward, terminated, "
                               f"truncated, info), got {len(out)} values")
            obs, rew, term, trunc, _ = out
            m = find_mismatch(self.observation_space, obs)
            if m:
                self._fail("observation from step()", m)
            if not np.isscalar(rew) and np.ndim(rew) != 0 or not np.isfinite(float(np.asarray(rew))):
                self._fail("reward", ("reward", "a finite float scalar", _describe(np.asarray(rew))))
            for nm, v in (("terminated", term), ("truncated", trunc)):
                if not isinstance(v, (bool, np.bool_)):
                    self._fail(nm, (nm, "a bool", _describe(v)))
        return out


# ---- episodes --------------------------------------------------------------------------------
class Episode:
    """One episode as seen by a worker (passed to ``flowkit_on_episode_end`` /
    ``flowkit_on_trajectory``).

    Attributes:
        episode_id: unique int. env_index: sub-env index. worker_index.
        length: env steps so far. total_reward: sum of rewards (all agents).
        agent_rewards: ``{(agent_id, policy_id): return}``.
        custom_metrics: set values here; reported as ``custom/<name>`` (iteration mean).
        user_data: free scratch space.
    """

    __slots__ = ("episode_id", "env_index", "worker_index", "length", "total_reward",
                 "agent_rewards", "custom_metrics", "user_data", "terminated", "truncated")

    def __init__(self, episode_id: int, env_index: int, worker_index: int):
        self.episode_id, self.env_index, self.worker_index = episode_id, env_index, worker_index
        self.length, self.total_reward = 0, 0.0
        self.agent_rewards: Dict[Tuple[str, str], float] = {}
        self.custom_metrics: Dict[str, float] = {}
        self.user_data: Dict[str, Any] = {}
        self.terminated = self.truncated = False

    def summary(self) -> Dict[str, Any]:
        return {"return": float(self.total_reward), "length": int(self.length),
                "custom": dict(self.custom_metrics),
                "agent_returns": {f"{a}|{p}": float(r) for (a, p), r in self.agent_rewards.items()}}


# ---- the Gymnasium vector-env runner ---------------------------------------------------------
AUTORESET_MODES = {"next_step": gym.vector.AutoresetMode.NEXT_STEP,
                   "same_step": gym.vector.AutoresetMode.SAME_STEP}


class GymEnvRunner:
    """Steps a Gymnasium SyncVectorEnv of ``runtime.num_envs_per_worker`` sub-envs with one
    batched policy call per step, and returns fragments of exactly
    ``runtime.rollout_fragment_length`` real transitions per sub-env (rows of one sub-env
    contiguous; transitions a sub-env made beyond that are kept for the next fragment).

    Both autoreset modes give the same transitions: ``next_step`` (the reset step is skipped)
    and ``same_step`` (the final observation is read from ``info["final_obs"]``). Truncated
    rows keep ``next_obs`` = the real final observation.
    """

    policy_id = sb.DEFAULT_POLICY_ID

    def __init__(self, worker: "RolloutWorker", envs: List[gym.Env]):
        self.worker = worker
        cfg = worker.config
        mode = cfg.env.autoreset_mode
        if mode not in AUTORESET_MODES:
            raise ValueError(f"env.autoreset_mode={mode!r} is not supported; use one of {sorted(AUTORESET_MODES)}")
        self.same_step = mode == "same_step"
        self.n = len(envs)
        self.native = self._use_native(cfg)
        if self.native:
            # the env's own vectorized implementation: one numpy step for all sub-envs
            for e in envs:
                e.close()
            self.vec = gym.make_vec(cfg.env.id, num_envs=self.n, vectorization_mode="vector_entry_point",
                                    **dict(cfg.env.kwargs or {}))
            self._check_left = int(cfg.env.check_spaces_steps)
        else:
            self.vec = gym.vector.SyncVectorEnv([(lambda e=e: e) for e in envs],
                                                autoreset_mode=AUTORESET_MODES[mode])
            self._check_left = 0  # SpaceCheck wraps each sub-env
        self.T = int(cfg.runtime.rollout_fragment_length)
        if len(worker.policies) != 1:
            raise ValueError("the Gymnasium runner serves exactly one policy; got "
                             f"{sorted(worker.policies)}")
        self.policy_id, self.policy = next(iter(worker.policies.items()))
        self.encoder: ObsEncoder = self.policy.encoder
        self.dist = self.policy.dist
        self._eps_counter = itertools.count(worker.index * 10_000_000 + worker.restart_count * 1_000_000_000)
        self._reset_all()

    @staticmethod
    def _use_native(cfg) -> bool:
        env = cfg.env
        if env.vectorization not in ("auto", "sync"):
            raise ValueError(f"env.vectorization={env.vectorization!r} must be auto or sync")
        if env.vectorization != "auto" or not env.id or env.factory or env.max_episode_steps:
            return False
        if env.autoreset_mode != "next_step":
            return False
        try:
            return bool(gym.spec(env.id).vector_entry_point)
        except Exception:
            return False

    def _check_rows(self, raw: Any, where: str) -> None:
        """Space checks for the native vector env (SpaceCheck wraps single envs instead)."""
        self._check_left -= 1
        space = self.vec.single_observation_space
        arr = np.asarray(raw)
        for j in range(self.n):
            m = find_mismatch(space, arr[j])
            if m:
                raise EnvError(f"env {self.worker.config.env.id!r} (worker {self.worker.index}, sub-env {j}) "
                               f"returned a bad observation from {where}: at `{m[0]}` expected {m[1]}, "
                               f"received {m[2]}")

    def _reset_all(self):
        seeds = [ctx.seed for ctx in self.worker.sub_env_contexts]
        # a native vector env takes one seed for its single RNG (sub-envs still differ)
        raw, _ = self.vec.reset(seed=seeds[0] if self.native else seeds)
        if self._check_left > 0:
            self._check_rows(raw, "reset()")
        self.raw_obs = raw
        self.obs_enc, self.mask = self.encoder(raw, self.n)
        self.reset_pending = np.zeros(self.n, bool)
        self.episodes = [self._new_episode(j) for j in range(self.n)]
        self.t = np.zeros(self.n, np.int64)
        # per-sub-env running figures, kept as arrays (no Python loop per env step)
        self.eps_ids = np.array([e.episode_id for e in self.episodes], np.int64)
        self.ep_len = np.zeros(self.n, np.int64)
        self.ep_ret = np.zeros(self.n, np.float64)
        self.carry: List[Optional[sb.SampleBatch]] = [None] * self.n

    def _new_episode(self, j: int) -> Episode:
        return Episode(next(self._eps_counter), j, self.worker.index)

    def sample(self, explore: bool = True) -> sb.MultiAgentBatch:
        n, T = self.n, self.T
        pol, enc, dist = self.policy, self.encoder, self.dist
        have = np.array([0 if c is None else len(c) for c in self.carry])
        cols: Dict[str, List[np.ndarray]] = {k: [] for k in (sb.OBS, sb.ACTIONS, sb.REWARDS, sb.TERMINATEDS,
                                                               sb.TRUNCATEDS, sb.NEXT_OBS, sb.EPS_ID, sb.T)}
        if enc.has_mask:
            cols[sb.ACTION_MASK], cols[sb.NEXT_ACTION_MASK] = [], []
        extras_l: Dict[str, List[np.ndarray]] = {}
        valid_l: List[np.ndarray] = []
        finished: List[Dict[str, Any]] = []
        pm = self.worker.pm
        ep_hook = bool(pm.hook.flowkit_on_episode_end.get_hookimpls())
        live_eps: Dict[int, Episode] = {e.episode_id: e for e in self.episodes}
        while (have < T).any():
            obs_enc, mask = self.obs_enc, self.mask
            actions, extras = pol.compute_actions_encoded(obs_enc, mask, explore)
            raw_next, rew, term, trunc, infos = self.vec.step(dist.to_env(actions))
            if self._check_left > 0:
                self._check_rows(raw_next, "step()")
            valid = ~self.reset_pending
            next_enc, next_mask = enc(raw_next, n)
            rec_next, rec_next_mask = next_enc, next_mask
            done = term | trunc
            if self.same_step and done.any():
                rec_next = next_enc.copy()
                rec_next_mask = None if next_mask is None else next_mask.copy()
                for j in np.flatnonzero(done):
                    fe, fm = enc(_add_axis(infos["final_obs"][j]), 1)
                    rec_next[j] = fe[0]
                    if rec_next_mask is not None:
                        rec_next_mask[j] = fm[0]
            cols[sb.OBS].append(obs_enc)
            cols[sb.ACTIONS].append(actions)
            cols[sb.REWARDS].append(np.asarray(rew, np.float32))
            cols[sb.TERMINATEDS].append(term)
            cols[sb.TRUNCATEDS].append(trunc & ~term)
            cols[sb.NEXT_OBS].append(rec_next)
            cols[sb.EPS_ID].append(self.eps_ids.copy())
            cols[sb.T].append(self.t.copy())
            if mask is not None:
                cols[sb.ACTION_MASK].append(mask)
                cols[sb.NEXT_ACTION_MASK].append(rec_next_mask)
            for k, v in extras.items():
                extras_l.setdefault(k, []).append(v)
            valid_l.append(valid)
            # episode bookkeeping (real transitions only)
            self.ep_len += valid
            self.ep_ret += np.where(valid, rew, 0.0)
            self.t += valid
            have += valid
            if self.same_step:
                ended = done
            else:
                ended = done & valid
            for j in np.flatnonzero(ended):
                ep = self.episodes[j]
                ep.length, ep.total_reward = int(self.ep_len[j]), float(self.ep_ret[j])
                self.ep_len[j], self.ep_ret[j] = 0, 0.0
                ep.terminated, ep.truncated = bool(term[j]), bool(trunc[j] and not term[j])
                ep.agent_rewards[("agent0", self.policy_id)] = ep.total_reward
                if ep_hook:
                    pm.hook.flowkit_on_episode_end(episode=ep, worker=self.worker)
                finished.append(ep.summary())
                self.episodes[j] = self._new_episode(j)
                self.eps_ids[j] = self.episodes[j].episode_id
                live_eps[self.episodes[j].episode_id] = self.episodes[j]
                self.t[j] = 0
            self.reset_pending = ended if not self.same_step else np.zeros(n, bool)
            self.raw_obs, self.obs_enc, self.mask = raw_next, next_enc, next_mask
        for j, ep in enumerate(self.episodes):  # running episodes, as hooks see them
            ep.length, ep.total_reward = int(self.ep_len[j]), float(self.ep_ret[j])
        batch = self._cut(cols, extras_l, valid_l)
        batch = self._postprocess(batch, live_eps)
        return sb.MultiAgentBatch({self.policy_id: batch}, env_steps=n * T, agent_steps=n * T,
                                  episodes=finished, worker_index=self.worker.index,
                                  meta={"weights_version": self.worker.weights_version})

    def _cut(self, cols, extras_l, valid_l) -> sb.SampleBatch:
        """Stack steps (S, N, ...) and cut exactly T real transitions per sub-env."""
        T = self.T
        stacked = {k: np.stack(v) for k, v in cols.items()}
        stacked.update({k: np.stack(v) for k, v in extras_l.items()})
        valid = np.stack(valid_l)
        if valid.all() and all(c is None for c in self.carry) and valid.shape[0] == T:
            # fast path: every step real, nothing carried -> (N, T) layout
            return sb.SampleBatch({k: np.ascontiguousarray(np.swapaxes(v, 0, 1)).reshape(-1, *v.shape[2:])
                                   for k, v in stacked.items()})
        parts = []
        for j in range(self.n):
            rows = np.flatnonzero(valid[:, j])
            piece = sb.SampleBatch({k: v[rows, j] for k, v in stacked.items()})
            if self.carry[j] is not None:
                piece = sb.concat_samples([self.carry[j], piece])
            parts.append(piece.slice(0, T))
            self.carry[j] = piece.slice(T, len(piece)) if len(piece) > T else None
        return sb.concat_samples(parts)

    def _postprocess(self, batch: sb.SampleBatch, live_eps: Dict[int, Episode]) -> sb.SampleBatch:
        pm = self.worker.pm
        if pm.hook.flowkit_on_trajectory.get_hookimpls():
            batch = batch.copy()
            pieces = batch.split_by_episode()
            for piece in pieces:
                ep = live_eps.get(int(piece[sb.EPS_ID][0]))
                pm.hook.flowkit_on_trajectory(policy_id=self.policy_id, batch=piece, episode=ep)
            pieces = [self.policy.postprocess_trajectory(p) for p in pieces]
            return sb.concat_samples(pieces)
        return self.policy.postprocess_trajectory(batch)

    def evaluate(self, num_episodes: int, explore: bool = False) -> List[Dict[str, Any]]:
        """Run ``num_episodes`` whole episodes with fresh resets; return their summaries.
        Episodes are spread over the sub-envs; an episode only counts if it started after the
        evaluation began (no bias toward short episodes: each sub-env's first episodes)."""
        self._reset_all()
        per_env = [num_episodes // self.n + (1 if j < num_episodes % self.n else 0) for j in range(self.n)]
        done_count = [0] * self.n
        out: List[Dict[str, Any]] = []
        while len(out) < num_episodes:
            actions, _ = self.policy.compute_actions_encoded(self.obs_enc, self.mask, explore)
            raw_next, rew, term, trunc, infos = self.vec.step(self.dist.to_env(actions))
            valid = ~self.reset_pending
            ended = (term | trunc) & (valid if not self.same_step else True)
            for j in np.flatnonzero(valid):
                self.episodes[j].length += 1
                self.episodes[j].total_reward += float(rew[j])
            for j in np.flatnonzero(ended):
                if done_count[j] < per_env[j]:
                    out.append(self.episodes[j].summary())
                    done_count[j] += 1
                self.episodes[j] = self._new_episode(j)
            self.reset_pending = ended if not self.same_step else np.zeros(self.n, bool)
            self.obs_enc, self.mask = self.encoder(raw_next, self.n)
        self._reset_all()
        return out

    def close(self):
        self.vec.close()


def _add_axis(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _add_axis(v) for k, v in x.items()}
    if isinstance(x, tuple):
        return tuple(_add_axis(v) for v in x)
    return np.asarray(x)[None]


# ---- the rollout worker ----------------------------------------------------------------------
@dataclasses.dataclass
class PolicySpec:
    """How to build one policy on a worker or the learner."""
    policy_class: type
    observation_space: gym.Space
    action_space: gym.Space
    config: Any                 # the algorithm's config dataclass instance
    algo: str = ""


class RolloutWorker:
    """Holds inference copies of the policies and one env runner. Methods are called on the
    driver through :class:`flowkit.core.flow.LocalActor` / :class:`RayActor`.

    Args:
        config: the run config (DictConfig or container).
        index: worker index (0-based; -1 for the driver's evaluation worker).
        num_workers: workers in the run.
        policy_specs: ``{policy_id: PolicySpec}``.
        restart_count: times this slot was rebuilt.
        pm: a plugin manager (local backend); None builds one from importable plugins.
        num_envs: sub-envs (default ``runtime.num_envs_per_worker``).
    """

    def __init__(self, config: Any, index: int, num_workers: int, policy_specs: Dict[str, PolicySpec],
                 restart_count: int = 0, pm: Any = None, num_envs: Optional[int] = None):
        from omegaconf import DictConfig, OmegaConf
        import torch
        if not isinstance(config, DictConfig):
            config = OmegaConf.create(config)
        self.config = config
        self.index, self.num_workers, self.restart_count = index, num_workers, restart_count
        if pm is None:
            from flowkit.hooks import get_plugin_manager
            pm = get_plugin_manager(list(config.plugins), include_registered=False)
            torch.set_num_threads(max(1, int(config.runtime.torch_threads)))
        self.pm = pm
        self.weights_version = 0
        seed = int(config.seed)
        self.policies: Dict[str, Policy] = {
            pid: spec.policy_class(spec.observation_space, spec.action_space, spec.config,
                                   config.model, "cpu", derive_seed(seed, "policy", pid, index, restart_count),
                                   inference_only=True)
            for pid, spec in policy_specs.items()}
        n = int(num_envs or config.runtime.num_envs_per_worker)
        env_cfg = OmegaConf.to_container(config.env, resolve=True)
        self.sub_env_contexts = [EnvContext(index, j, num_workers, restart_count,
                                            derive_seed(seed, "env", index, j, restart_count))
                                 for j in range(n)]
        name = env_name(env_cfg)
        checks = int(config.env.check_spaces_steps)
        envs = []
        for ctx in self.sub_env_contexts:
            e = make_env(env_cfg, ctx)
            if isinstance(e, gym.Env):
                e = SpaceCheck(e, name, ctx, checks)
            envs.append(e)
        self.env_context = self.sub_env_contexts[0]
        runner_cls = pm.hook.flowkit_make_env_runner(env=envs[0], context=self.env_context,
                                                     config=config, policies=self.policies)
        if runner_cls is None:
            raise ValueError(f"no env runner accepts env {name!r} ({type(envs[0]).__name__})")
        self.runner = runner_cls(self, envs)

    # -- remote API --
    def sample(self, weights: Optional[Dict[str, Dict[str, np.ndarray]]] = None,
               version: int = 0) -> sb.MultiAgentBatch:
        """One fragment (see the env runner); ``weights`` (with their ``version``), when
        given, are set first."""
        if weights is not None:
            self.set_weights(weights, version)
        try:
            return self.runner.sample()
        except Exception as e:
            e.add_note(f"[flowkit] in rollout worker {self.index} (restart {self.restart_count}), "
                       f"env {env_name(self.config.env)!r}")
            raise

    def apply_flow(self, method: str, fns: Sequence[Callable], *args) -> Any:
        x = getattr(self, method)(*args)
        for fn in fns:
            x = fn(x)
        return x

    def set_weights(self, weights: Dict[str, Dict[str, np.ndarray]], version: int = 0) -> None:
        for pid, w in weights.items():
            if pid in self.policies:
                self.policies[pid].set_weights(w)
        self.weights_version = version

    def get_weights(self) -> Dict[str, Dict[str, np.ndarray]]:
        return {pid: p.get_weights() for pid, p in self.policies.items()}

    def apply(self, fn: Callable[["RolloutWorker"], Any]) -> Any:
        return fn(self)

    def evaluate(self, num_episodes: int, explore: bool = False) -> List[Dict[str, Any]]:
        return self.runner.evaluate(num_episodes, explore)

    def get_pid(self) -> int:
        return os.getpid()

    def pending_env_steps(self) -> int:
        """Transitions sampled but not yet returned (carried into the next fragment); they
        are lost if this worker dies."""
        carry = getattr(self.runner, "carry", None) or []
        return int(sum(len(c) for c in carry if c is not None))

    def ping(self) -> bool:
        return True

    def stop(self) -> None:
        close = getattr(self.runner, "close", None)
        if close:
            close()


# ---- the worker set ----------------------------------------------------------------------------
class _RayRolloutWorker(RolloutWorker):
    """The Ray actor class: an error in the constructor is kept and raised by ``ping`` (the
    first call the WorkerSet makes), so it reaches the driver with its own type, message and
    notes; Ray would turn it into a bare ActorDiedError."""

    def __init__(self, *args, **kwargs):
        self._init_error: Optional[BaseException] = None
        try:
            super().__init__(*args, **kwargs)
        except Exception as e:
            self._init_error = e

    def ping(self) -> bool:
        if self._init_error is not None:
            raise self._init_error
        return True


class _FailedActor(LocalActor):
    """A local worker whose constructor raised: every call answers with that error."""

    def __init__(self, error: BaseException, index: int):
        super().__init__(None, index)
        self.error = error

    def submit(self, method: str, *args, **kwargs) -> Any:
        return LocalFuture(error=self.error)


class WorkerSet:
    """The rollout workers of a run, started lazily (``flowkit plan`` starts none).

    ``runtime.backend=ray``: one Ray actor per worker (``runtime.num_cpus_per_worker``);
    ``local``: in-process RolloutWorkers behind the same call interface. Failed workers are
    rebuilt (``runtime.restart_failed_workers``) with the current weights and a seed that
    includes the restart count, at most ``runtime.max_worker_restarts`` consecutive times per
    slot without a successful sample in between.
    """

    def __init__(self, config: Any, policy_specs: Dict[str, PolicySpec], pm: Any,
                 weights_fn: Optional[Callable[[], Dict[str, Any]]] = None):
        self.config, self.policy_specs, self.pm = config, policy_specs, pm
        self.backend = config.runtime.backend
        self.num_workers = max(1, int(config.runtime.num_workers))
        self.weights_fn = weights_fn
        self._actors: Optional[List[Any]] = None
        self.restart_counts = [0] * self.num_workers
        self.consecutive_failures = [0] * self.num_workers
        self.num_restarts = 0
        self.restart_log: List[Dict[str, Any]] = []
        self.weights_version = 0
        self._last_weights_ref = None
        self._last_weights_key: Optional[tuple] = None
        self._last_weights_obj: Any = None
        self._next_sample_weights: Dict[int, tuple] = {}   # worker index -> (actor, weights, version)
        self._container = None

    # -- lifecycle --
    @property
    def started(self) -> bool:
        return self._actors is not None

    def _make(self, index: int) -> Any:
        rc = self.restart_counts[index]
        if self.backend == "local":
            w = RolloutWorker(self.config, index, self.num_workers, self.policy_specs, rc, pm=self.pm)
            return LocalActor(w, index)
        import ray
        from omegaconf import OmegaConf
        if self._container is None:
            self._container = OmegaConf.to_container(self.config, resolve=True)
        cls = ray.remote(num_cpus=float(self.config.runtime.num_cpus_per_worker), max_restarts=0)(_RayRolloutWorker)
        h = cls.remote(self._container, index, self.num_workers, self.policy_specs, rc)
        return RayActor(h, index)

    def _make_or_failed(self, index: int) -> Any:
        try:
            return self._make(index)
        except Exception as e:  # local backend: the constructor ran here, not in an actor
            return _FailedActor(e, index)

    def start(self) -> None:
        if self._actors is not None:
            return
        self._actors = [self._make_or_failed(i) for i in range(self.num_workers)]
        # surface construction errors (bad env, bad spaces) now, with their own type; a
        # worker whose env fails at start is rebuilt like one that fails while sampling
        for a in list(self._actors):
            try:
                get_result(a.submit("ping"))
            except Exception as e:
                if not self.on_failure(a, e):
                    raise
        if self.weights_fn is not None:
            self.sync_weights(self.weights_fn())

    @property
    def actors(self) -> List[Any]:
        if self._actors is None:
            self.start()
        return list(self._actors)

    def local_worker(self) -> Optional[RolloutWorker]:
        """The first worker object (local backend only)."""
        return self.actors[0].obj if self.backend == "local" else None

    def stop(self) -> None:
        if self._actors is None:
            return
        for a in self._actors:
            try:
                if a.is_remote:
                    import ray
                    ray.kill(a.handle)
                else:
                    a.obj.stop()
            except Exception:
                pass
        self._actors = None

    # -- weights --
    def sync_weights(self, weights: Dict[str, Any], actors: Optional[Sequence[Any]] = None,
                     version: Optional[int] = None, with_next_sample: bool = False) -> None:
        """Send ``{policy_id: weights}`` to ``actors`` (default: all): one ``ray.put`` per
        weights object (pushing the same ``weights`` of the same ``version`` to several
        workers one after another, as IMPALA's push to each producing worker does, reuses it).

        ``with_next_sample``: no call of its own; the weights travel with the next ``sample``
        request to each of ``actors`` (see :meth:`sample_args`), which applies them before it
        samples. An async pipeline that keeps a request queued per worker gets its weights at
        the same point as with a separate call, with half the calls."""
        if version is not None:
            self.weights_version = version
        targets = self.actors if actors is None else list(actors)
        if self.backend == "ray":
            import ray
            key = (id(weights), version)
            if version is not None and self._last_weights_key == key and self._last_weights_ref is not None:
                ref = self._last_weights_ref
            else:
                ref = ray.put(weights)
                self._last_weights_ref, self._last_weights_key = ref, key
                self._last_weights_obj = weights   # keeps id(weights) from being reused
        else:
            ref = weights
        if with_next_sample:
            for a in targets:
                self._next_sample_weights[a.index] = (a, ref, self.weights_version)
            return
        if self.backend == "ray":
            futs = [a.submit("set_weights", ref, self.weights_version) for a in targets]
            self._pending_weight_futs = futs
        else:
            for a in targets:
                a.obj.set_weights(weights, self.weights_version)

    def sample_args(self, actor: Any) -> tuple:
        """Arguments of the next ``sample`` request to ``actor``: ``(weights, version)`` when
        weights wait to travel with it (``sync_weights(..., with_next_sample=True)``), else ()."""
        item = self._next_sample_weights.pop(getattr(actor, "index", None), None)
        if item is None or item[0] is not actor:
            return ()
        return item[1], item[2]

    def foreach_worker(self, method: str, *args) -> List[Any]:
        futs = [a.submit(method, *args) for a in self.actors]
        return [get_result(f) for f in futs]

    # -- faults --
    def mark_success(self, actor: Any) -> None:
        self.consecutive_failures[actor.index] = 0

    def on_failure(self, actor: Any, exc: BaseException) -> bool:
        """Handle a failed call on ``actor``: rebuild it (True) or let the error stop the run
        (False). The error is annotated with the worker index either way.

        Not restarted: a space mismatch (:class:`EnvError` from :class:`SpaceCheck`: a bug
        in the env, the same after a restart), and any failure once
        ``runtime.max_worker_restarts`` consecutive restarts of the slot did not help. A
        failure reported by an actor that was already replaced (a stale request) is dropped.
        """
        i = actor.index
        rt = self.config.runtime
        if self._actors is not None and not any(a is actor for a in self._actors):
            return True  # stale: this actor was already rebuilt
        exc_note = f"[flowkit] rollout worker {i} failed"
        if exc_note not in getattr(exc, "__notes__", []):
            exc.add_note(exc_note)
        if not rt.restart_failed_workers or self._actors is None or isinstance(exc, EnvError):
            return False
        self.consecutive_failures[i] += 1
        if self.consecutive_failures[i] > int(rt.max_worker_restarts):
            exc.add_note(f"[flowkit] worker {i} failed {self.consecutive_failures[i]} times in a row "
                         f"(runtime.max_worker_restarts={rt.max_worker_restarts}); stopping")
            return False
        try:
            if actor.is_remote:
                import ray
                ray.kill(actor.handle)
        except Exception:
            pass
        self.restart_counts[i] += 1
        self.num_restarts += 1
        self.restart_log.append({"worker_index": i, "restart_count": self.restart_counts[i],
                                 "error": f"{type(exc).__name__}: {exc}".splitlines()[0]})
        _log.warning("rollout worker %d failed (%s); rebuilding it (restart %d, %d/%d in a row)", i,
                     self.restart_log[-1]["error"], self.restart_counts[i], self.consecutive_failures[i],
                     int(rt.max_worker_restarts))
        new = None
        try:
            new = self._make(i)
            get_result(new.submit("ping"))
        except Exception as e2:  # the rebuild itself failed: count it and retry
            e2.add_note(f"[flowkit] while rebuilding worker {i}")
            if new is not None and new.is_remote:  # it holds its CPUs until killed
                import ray
                ray.kill(new.handle)
            if self.on_failure(actor, e2):
                return True
            raise e2 from exc  # the latest failure, chained to the one before it
        pos = [k for k, a in enumerate(self._actors) if a is actor]
        if pos:
            self._actors[pos[0]] = new
        if self.weights_fn is not None:
            self.sync_weights(self.weights_fn(), [new])
        return True
