"""The Gymnasium vector-env runner (the fast single-agent path), :class:`Episode`, and
:func:`run_episodes`, the one episode loop of evaluation (in-run and ``flowkit evaluate``) and
``flowkit record``.

Counting: a batch's ``env_steps`` are real transitions; the autoreset step of a
``next_step`` vector env is not one and is not recorded.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple, Union

import gymnasium as gym
import numpy as np
from gymnasium.vector.utils import concatenate, create_empty_array, iterate

from flowkit.core import batch as sb
from flowkit.core._envs import EnvContext, EnvError, env_name, find_mismatch, make_env
from flowkit.core.encoders import ObsEncoder
from flowkit.core.presets import env_preset

if TYPE_CHECKING:
    from flowkit.core.workers import RolloutWorker


# ---- episodes --------------------------------------------------------------------------------
class Episode:
    """One episode as seen by a worker (passed to ``flowkit_on_episode_end`` /
    ``flowkit_on_trajectory``).

    Attributes:
        episode_id: unique int.
        env_index: sub-env index in the worker's vector env.
        worker_index: the rollout worker's index (-1: the driver's evaluation worker).
        length: env steps so far.
        total_reward: sum of rewards (all agents).
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
                "policy_returns": self.policy_returns()}

    def policy_returns(self) -> Dict[str, Dict[str, float]]:
        """Each agent's return this episode, by the policy it played: ``{policy_id: {agent_id:
        return}}`` (empty for a single-agent env)."""
        out: Dict[str, Dict[str, float]] = {}
        for (agent, pid), r in self.agent_rewards.items():
            out.setdefault(pid, {})[agent] = float(r)
        return out


# ---- recurrent state -----------------------------------------------------------------------------
class RecurrentStates:
    """The recurrent state of one policy for ``n`` rows a runner acts for (sub-envs): what a
    runner needs to act with a recurrent policy, for any algorithm (actor-critics, a recurrent
    Q-network). Torch-free.

    ``act(obs, mask, explore)`` calls ``policy.compute_actions_encoded(..., state=...)`` for
    every row (or the rows ``rows``: indexes, a bool mask or a slice), keeps the new states and returns ``(actions, extras)``
    with ``state_in`` (the states acted from: a batch column) and without ``state_out``;
    ``reset(rows)`` puts rows (bool[n] or indexes) back to ``policy.initial_state``.

    Attributes:
        state: float32[n, S], each row's current state.
    """

    def __init__(self, policy: Any, n: int):
        self.policy = policy
        init = policy.initial_state(n)
        assert init is not None, "RecurrentStates needs a recurrent policy"
        self.state: np.ndarray = np.array(init, np.float32)

    @classmethod
    def of(cls, policy: Any, n: int) -> Optional["RecurrentStates"]:
        """States for ``n`` rows of ``policy``, or None for a feed-forward policy."""
        init = getattr(policy, "initial_state", None)
        return None if init is None or init(0) is None else cls(policy, n)

    def act(self, obs: np.ndarray, mask: Optional[np.ndarray], explore: bool,
            rows: Optional[Union[np.ndarray, slice]] = None) -> Tuple[np.ndarray, Dict[str, np.ndarray]]:
        state = self.state if rows is None else self.state[rows]
        actions, extras = self.policy.compute_actions_encoded(obs, mask, explore, state=state)
        extras = dict(extras)
        out = np.asarray(extras.pop(sb.STATE_OUT), np.float32)
        extras[sb.STATE_IN] = state
        self.state = self.state.copy()  # (the old array is a recorded state_in)
        self.state[slice(None) if rows is None else rows] = out
        return actions, extras

    def reset(self, rows: np.ndarray) -> None:
        rows = np.asarray(rows)
        k = int(rows.sum()) if rows.dtype == bool else len(rows)
        if k:
            self.state = self.state.copy()  # the old array may be a recorded state_in
            self.state[rows] = self.policy.initial_state(k)


# ---- the env's own values (run.output) -------------------------------------------------------
def raw_leaves(x: Any, prefix: str) -> Dict[str, np.ndarray]:
    """A batched raw observation or action (an array, or dicts / tuples of them, as a vector
    env returns them) as ``{column: array}``: ``prefix`` for an array, ``prefix/key`` (or
    ``prefix/i``) for the leaves of a dict (tuple), nested alike. The arrays are copies (a
    vector env may reuse its output buffers)."""
    if isinstance(x, dict):
        return {k: v for key, sub in x.items() for k, v in raw_leaves(sub, f"{prefix}/{key}").items()}
    if isinstance(x, tuple):
        return {k: v for i, sub in enumerate(x) for k, v in raw_leaves(sub, f"{prefix}/{i}").items()}
    return {prefix: np.array(x, copy=True)}


def take_raw(batch: sb.SampleBatch) -> Dict[str, np.ndarray]:
    """Take the ``raw:*`` columns out of ``batch`` (in place) as the ``meta["raw"]`` of a
    fragment: every row's ``raw:obs*``, ``raw:actions``, ``raw:rewards`` (float64, as the env
    gave them), ``raw:terminateds``, ``raw:truncateds`` (the env's own flags), ``eps_id`` and
    ``t``, and ``raw:next_obs*`` only of the rows that end an episode (in row order)."""
    raw = {k: batch.pop(k) for k in list(batch) if k.startswith(sb.RAW_PREFIX)}
    ends = np.asarray(raw[sb.RAW_PREFIX + "terminateds"], bool) | np.asarray(raw[sb.RAW_PREFIX + "truncateds"], bool)
    nxt = sb.RAW_PREFIX + "next_obs"
    out = {k: (v[ends] if k == nxt or k.startswith(nxt + "/") else v) for k, v in raw.items()}
    out[sb.EPS_ID], out[sb.T] = np.array(batch[sb.EPS_ID]), np.array(batch[sb.T])
    return out


# ---- the Gymnasium vector-env runner ---------------------------------------------------------
AUTORESET_MODES = {"next_step": gym.vector.AutoresetMode.NEXT_STEP,
                   "same_step": gym.vector.AutoresetMode.SAME_STEP}


def _reports_games(env: Any) -> bool:
    """Whether ``env`` (a wrapped env, or a vector env) reports whole games (``flowkit_game_stats``:
    :mod:`flowkit.core.presets`)."""
    get = getattr(env, "get_wrapper_attr", None)
    try:
        return bool(get("flowkit_game_stats") if get is not None else getattr(env, "flowkit_game_stats", False))
    except AttributeError:
        return False


def _thunk(env: Any) -> Callable[[], Any]:
    return lambda: env


class GymEnvRunner:
    """Steps a Gymnasium vector env of ``runtime.num_envs_per_worker`` sub-envs with one
    batched policy call per step, and returns fragments of exactly
    ``runtime.rollout_fragment_length`` real transitions per sub-env (rows of one sub-env
    contiguous; transitions a sub-env made beyond that are kept for the next fragment).

    Both autoreset modes give the same transitions: ``next_step`` (the reset step is skipped)
    and ``same_step`` (the final observation is read from ``info["final_obs"]``). Truncated
    rows keep ``next_obs`` = the real final observation.

    Double-buffered sampling (``runtime.double_buffered``; Petrenko et al. 2020, Sample
    Factory, sec. 3.2): the sub-envs are split into two halves (*lanes*), each its own vector
    env stepping in its own thread off the GIL (ale-py's vector env, C++); while one half
    steps, the policy acts for the other, so env stepping and inference overlap (a second core
    busy: by default on where a worker reserves two, ``runtime.num_cpus_per_worker >= 2``).
    Each half acts on its own latest observations, as one vector env would; only the order of
    calls (and so the draws of exploration noise) differs.

    A recurrent policy (``policy.initial_state(n)`` not None) acts with one state per sub-env
    (:class:`RecurrentStates`), back to the initial state when the sub-env's episode starts (in
    both modes: the first real step of an episode always acts from it); every row records the
    state it acted from (``state_in``), so any sequence of rows starts from its first row's.

    With ``run.output`` set, every row also carries the env's own values (the observation
    before encoding, the action as the env received it after ``to_env``, the float64 reward,
    the env's ``terminated`` / ``truncated``; the final observation of rows that end an
    episode), cut with the other columns and handed out in ``meta["raw"]`` (:func:`take_raw`)
    for the driver's dataset writer; post-processing never sees them.
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
        own = self._preset_vectors(cfg, worker, envs[0] if envs else None)
        if own is not None or self.native:  # the sub-envs built are not stepped
            for e in envs:
                e.close()
        if own is not None:  # the preset's training side on its own vector env(s)
            # (space checks count per vector env: each half checks its first steps)
            self.vecs, self.native, self._check_left = own, True, int(cfg.env.check_spaces_steps) * len(own)
        elif self.native:
            # the env's own vectorized implementation: one numpy step for all sub-envs
            self.vecs = [gym.make_vec(cfg.env.id, num_envs=self.n, vectorization_mode="vector_entry_point",
                                      **dict(cfg.env.kwargs or {}))]
            self._check_left = int(cfg.env.check_spaces_steps)
        else:
            self.vecs = [gym.vector.SyncVectorEnv([_thunk(e) for e in envs], autoreset_mode=AUTORESET_MODES[mode])]
            self._check_left = 0  # SpaceCheck wraps each sub-env
        self.vec = self.vecs[0]
        sizes = np.cumsum([0] + [v.num_envs for v in self.vecs])
        self.lanes = [slice(int(a), int(b)) for a, b in zip(sizes[:-1], sizes[1:])]  # sub-envs of each vector env
        self._inflight: List[Any] = [None] * len(self.vecs)
        self.T = int(cfg.runtime.rollout_fragment_length)
        if len(worker.policies) != 1:
            raise ValueError("the Gymnasium runner serves exactly one policy; got "
                             f"{sorted(worker.policies)}")
        self.policy_id, self.policy = next(iter(worker.policies.items()))
        self.encoder: ObsEncoder = self.policy.encoder
        self.dist = self.policy.dist
        # envs that report whole games (a preset's: e.g. a lost life ends a training episode;
        # metrics count games, with their unclipped return, from info["game_return"])
        self.games = any(_reports_games(e) for e in (own or ([] if self.native else envs)))
        self.record = bool(cfg.get("run", {}).get("output"))  # run.output: keep the env's own values
        self._reset_all()

    @staticmethod
    def _preset_vectors(cfg, worker, like: Optional[gym.Env]) -> Optional[List[Any]]:
        """The vector env(s) of ``env.preset``'s own
        (:meth:`~flowkit.core.presets.EnvPreset.make_vector_env`) for a rollout worker's sub-envs with
        ``env.vectorization=auto`` and ``next_step`` autoreset: one, or two halves where
        ``runtime.double_buffered`` is on (None: where the worker reserves a second core,
        ``runtime.num_cpus_per_worker >= 2``) and there are 2+ sub-envs; None: the wrapped envs."""
        env, n = cfg.env, len(worker.sub_env_contexts)
        if (not env.get("preset") or env.vectorization != "auto" or env.autoreset_mode != "next_step"
                or any(c.worker_index < 0 for c in worker.sub_env_contexts)):
            return None
        double = cfg.runtime.get("double_buffered")
        if double is None:  # the second thread wants a core of its own
            double = float(cfg.runtime.num_cpus_per_worker) >= 2
        sizes = [n - n // 2, n // 2] if n >= 2 and double else [n]
        preset = env_preset(env.preset)
        vecs = [preset.make_vector_env(worker.env_cfg, k, like) for k in sizes]
        if any(v is None for v in vecs):
            return None
        return vecs

    @staticmethod
    def _use_native(cfg) -> bool:
        env = cfg.env
        if env.vectorization not in ("auto", "sync"):
            raise ValueError(f"env.vectorization={env.vectorization!r} must be auto or sync")
        if (env.vectorization != "auto" or not env.id or env.factory or env.max_episode_steps
                or env.get("preset") or env.autoreset_mode != "next_step"):  # a preset's wrappers define the env
            return False
        try:
            # (`module:Id`: the module was imported when the sub-envs were built; spec() looks up Id)
            return bool(gym.spec(str(env.id).rpartition(":")[2]).vector_entry_point)
        except Exception:
            return False

    def _call(self, call: str, fn: Callable, *args, **kw) -> Any:
        """``fn(*args, **kw)`` of the vector env. An exception the env's own code raised passes
        unchanged (a fault: the worker is rebuilt); any other means the env broke the API
        (outputs that cannot be batched, e.g. a shape change after the checked steps): an
        :class:`EnvError`, never retried."""
        try:
            return fn(*args, **kw)
        except Exception as e:
            if isinstance(e, (EnvError, TimeoutError)) or any(
                    str(n).startswith("[flowkit] raised by") for n in getattr(e, "__notes__", ())):
                raise
            w = self.worker
            raise EnvError(f"env {env_name(w.config.env)!r} (worker {w.index}): the outputs of {call} cannot be "
                           f"batched ({type(e).__name__}: {(str(e).splitlines() or [''])[0]}); expected observations "
                           f"in {self.vec.single_observation_space}, a float reward, bool terminated and truncated"
                           ) from e

    def _check_rows(self, raw: Any, where: str, first: int = 0) -> None:
        """Space checks for the native vector env (SpaceCheck wraps single envs instead);
        ``first``: the sub-env index of ``raw``'s first row."""
        self._check_left -= 1
        for j, x in enumerate(np.asarray(raw), first):
            if m := find_mismatch(self.vec.single_observation_space, x):
                raise EnvError(f"env {self.worker.config.env.id!r} (worker {self.worker.index}, sub-env {j}) "
                               f"returned a bad observation from {where}: at `{m[0]}` expected {m[1]}, "
                               f"received {m[2]}")

    def reset(self) -> None:
        """Start a new episode in every sub-env (their RNGs go on, no reseeding); what was
        sampled of the running episodes and not yet returned is dropped (a new task:
        :meth:`~flowkit.core.RolloutWorker.set_task`)."""
        self._reset_all(reseed=False)

    def _reset_all(self, reseed: bool = True):
        seeds = [ctx.seed for ctx in self.worker.sub_env_contexts]
        # per lane (vector env): its latest observations, encoded, and their action masks
        self.obs_enc: List[Any] = []
        self.mask: List[Any] = []
        self.raw_obs: Optional[List[Dict[str, np.ndarray]]] = [] if self.record else None
        for vec, sl in zip(self.vecs, self.lanes):
            # a native vector env takes one seed for its single RNG (sub-envs still differ; ale-py's
            # seeds its sub-envs with consecutive ones: the second lane goes on counting)
            kw = {"seed": seeds[0] + sl.start if self.native else seeds[sl]} if reseed else {}
            raw, _ = self._call("reset()", vec.reset, **kw)
            if self._check_left > 0:
                self._check_rows(raw, "reset()", sl.start)
            enc, mask = self.encoder(raw, sl.stop - sl.start)
            self.obs_enc.append(enc)
            self.mask.append(mask)
            if self.raw_obs is not None:
                self.raw_obs.append(raw_leaves(raw, sb.RAW_PREFIX + "obs"))
        self._inflight = [None] * len(self.vecs)
        self.pending: List[Optional[np.ndarray]] = [None] * len(self.vecs)  # per lane: rows whose next step resets
        self.states = RecurrentStates.of(self.policy, self.n)
        self.episodes = [self._new_episode(j) for j in range(self.n)]
        self.t = np.zeros(self.n, np.int64)  # each sub-env's step in its episode (= its length so far)
        # per-sub-env running figures, kept as arrays (no Python loop per env step)
        self.eps_ids = np.array([e.episode_id for e in self.episodes], np.int64)
        self.ep_ret = np.zeros(self.n, np.float64)
        self.carry: List[Optional[sb.SampleBatch]] = [None] * self.n

    def _new_episode(self, j: int) -> Episode:
        return Episode(next(self.worker.episode_ids), j, self.worker.index)

    def sample(self, explore: bool = True) -> sb.MultiAgentBatch:
        # steps each sub-env needs for T real transitions (raised by each reset step it makes)
        self._need = self.T - np.array([len(c or ()) for c in self.carry])
        self._bufs: List[Dict[str, np.ndarray]] = [{} for _ in self.lanes]  # per lane: {column: [sub-env, step, ...]}
        self._steps = [0] * len(self.lanes)
        self._skipped: List[List[Tuple[int, np.ndarray]]] = [[] for _ in self.lanes]  # per lane: (step, rows not real)
        finished: List[Dict[str, Any]] = []
        live_eps: Dict[int, Episode] = {e.episode_id: e for e in self.episodes}
        ep_hook = bool(self.worker.pm.hook.flowkit_on_episode_end.get_hookimpls())
        # each lane acts, its vector env steps (with 2 lanes: in its own thread, while the other
        # lane's step is recorded and acted on), then its step is recorded; until every sub-env
        # has T real transitions
        short = [int(self._need[sl].max()) for sl in self.lanes]
        acted = [self._act(g, explore) if short[g] > 0 else None for g in range(len(self.lanes))]
        while any(a is not None for a in acted):
            for g, sl in enumerate(self.lanes):
                if (a := acted[g]) is not None:
                    if self._record(g, a, finished, live_eps, ep_hook):
                        short[g] = int(self._need[sl].max())
                    acted[g] = self._act(g, explore) if self._steps[g] < short[g] else None
        for i, ep in enumerate(self.episodes):  # running episodes, as hooks see them
            ep.length, ep.total_reward = int(self.t[i]), float(self.ep_ret[i])
        batch = self._cut()
        meta: Dict[str, Any] = {"weights_version": self.worker.weights_version}
        if self.raw_obs is not None:
            meta["raw"] = take_raw(batch)
        batch = self._postprocess(batch, live_eps)
        return sb.MultiAgentBatch({self.policy_id: batch}, env_steps=self.n * self.T, agent_steps=self.n * self.T,
                                  episodes=finished, worker_index=self.worker.index, meta=meta)

    def _act(self, g: int, explore: bool) -> Tuple[Any, Dict[str, Any], Any]:
        """Act for lane ``g``'s sub-envs on their latest observations and send the actions to
        its vector env (stepped now, or in its own thread with 2 lanes: :meth:`_record` takes
        the outputs); returns ``(actions, extras, env_actions)``."""
        obs_enc, mask = self.obs_enc[g], self.mask[g]
        if self.states is None:
            actions, extras = self.policy.compute_actions_encoded(obs_enc, mask, explore)
        else:
            actions, extras = self.states.act(obs_enc, mask, explore, None if len(self.vecs) == 1 else self.lanes[g])
        env_actions = self.dist.to_env(actions)
        vec = self.vecs[g]
        if len(self.vecs) > 1:
            self._call("step()", vec.send, env_actions)
        else:
            self._inflight[g] = self._call("step()", vec.step, env_actions)
        return actions, extras, env_actions

    def _record(self, g: int, acted: Tuple[Any, Dict[str, Any], Any], finished: List[Dict[str, Any]],
                live_eps: Dict[int, Episode], ep_hook: bool) -> bool:
        """Take lane ``g``'s step outputs and record the step: its row of every column, written
        in place into the lane's fragment arrays, episode figures, and the episodes that ended
        (``finished``, ``flowkit_on_episode_end``). True where some sub-env made no real
        transition (a reset step: it needs one step more)."""
        actions, extras, env_actions = acted
        vec, sl = self.vecs[g], self.lanes[g]
        m, pm = sl.stop - sl.start, self.worker.pm
        out, self._inflight[g] = self._inflight[g], None
        raw_next, rew, term, trunc, infos = out if out is not None else self._call("step()", vec.recv)
        if self._check_left > 0:
            self._check_rows(raw_next, "step()", sl.start)
        next_enc, next_mask = self.encoder(raw_next, m)
        rec_next, rec_next_mask, rec_raw_next = next_enc, next_mask, raw_next
        done = term | trunc
        if self.same_step and done.any():  # record the real final observations (from info)
            space = vec.single_observation_space
            final = [f if d else o for o, f, d in zip(iterate(vec.observation_space, raw_next),
                                                      infos["final_obs"], done)]
            empty: Any = create_empty_array(space, m)  # Any: typed Optional, never None here
            rec_raw_next = concatenate(space, final, empty)
            rec_next, rec_next_mask = self.encoder(rec_raw_next, m)
        step = {sb.OBS: self.obs_enc[g], sb.ACTIONS: actions, sb.REWARDS: rew, sb.TERMINATEDS: term,
                sb.TRUNCATEDS: trunc, sb.NEXT_OBS: rec_next, sb.EPS_ID: self.eps_ids[sl], sb.T: self.t[sl], **extras}
        if self.mask[g] is not None:
            step.update({sb.ACTION_MASK: self.mask[g], sb.NEXT_ACTION_MASK: rec_next_mask})
        if self.raw_obs is not None:  # run.output: the env's own values of this step
            step.update(self._raw_columns(g, raw_next, rec_raw_next, env_actions, rew, term, trunc))
        self._write(g, step)
        # episode bookkeeping (real transitions only; the slices are views: updated in place)
        skipped = self.pending[g]  # the rows of a reset step (no transition), or None
        if skipped is not None:
            self._skipped[g].append((self._steps[g] - 1, skipped))
            self._need[sl] += skipped
            done, rew = done & ~skipped, np.where(skipped, 0.0, rew)
        self.ep_ret[sl] += rew
        self.t[sl] += 1 if skipped is None else ~skipped
        ended = np.flatnonzero(done) if done.any() else ()  # (same_step: no step is skipped)
        for i in ended:
            j = sl.start + int(i)
            ep = self.episodes[j]
            ep.length, ep.total_reward = int(self.t[j]), float(self.ep_ret[j])
            self.ep_ret[j], self.t[j] = 0.0, 0
            ep.terminated, ep.truncated = bool(term[i]), bool(trunc[i] and not term[i])
            if ep_hook:
                pm.hook.flowkit_on_episode_end(episode=ep, worker=self.worker)
            if self.games:  # only whole games count, with their own (unclipped) figures
                gi = infos.get("final_info", {}) if self.same_step else infos
                if gi.get("_game_return", np.zeros(m, bool))[i]:
                    summary = ep.summary()
                    summary.update({"return": float(gi["game_return"][i]), "length": int(gi["game_length"][i])})
                    finished.append(summary)
            else:
                finished.append(ep.summary())
            self.episodes[j] = self._new_episode(j)
            self.eps_ids[j] = self.episodes[j].episode_id
            live_eps[self.episodes[j].episode_id] = self.episodes[j]
        if self.states is not None and (len(ended) or skipped is not None):  # next acts start an episode
            self.states.reset(sl.start + np.flatnonzero(done if skipped is None else done | skipped))
        self.pending[g] = done if len(ended) and not self.same_step else None
        self.obs_enc[g], self.mask[g] = next_enc, next_mask
        return skipped is not None

    def _write(self, g: int, step: Dict[str, Any]) -> None:
        """Lane ``g``'s step ``step`` (``{column: rows of its sub-envs}``) into its fragment
        arrays ``[sub-env, step, ...]``, made at its first step (T steps; doubled when full)."""
        buf, s = self._bufs[g], self._steps[g]
        if not buf:
            for k, v in step.items():
                v = np.asarray(v)
                buf[k] = np.empty((len(v), self.T, *v.shape[1:]), np.float32 if k == sb.REWARDS else v.dtype)
        elif s == next(iter(buf.values())).shape[1]:
            buf.update({k: np.concatenate([v, np.empty_like(v)], 1) for k, v in buf.items()})
        for k, v in step.items():
            buf[k][:, s] = v
        self._steps[g] = s + 1

    def _raw_columns(self, g: int, raw_next: Any, rec_raw_next: Any, env_actions: Any, rew: Any, term: Any,
                     trunc: Any) -> Dict[str, np.ndarray]:
        """``run.output``'s columns of lane ``g``'s step: the env's own values (observations
        before encoding, actions as the env took them, float64 rewards)."""
        out = {**self.raw_obs[g], **raw_leaves(rec_raw_next, sb.RAW_PREFIX + "next_obs"),  # type: ignore[index]
               sb.RAW_PREFIX + "actions": np.array(env_actions, copy=True),
               sb.RAW_PREFIX + "rewards": np.asarray(rew, np.float64),
               sb.RAW_PREFIX + "terminateds": np.asarray(term, bool),
               sb.RAW_PREFIX + "truncateds": np.asarray(trunc, bool)}
        self.raw_obs[g] = raw_leaves(raw_next, sb.RAW_PREFIX + "obs")  # type: ignore[index]
        return out

    def _cut(self) -> sb.SampleBatch:
        """Rows of sub-env ``j``: its carried rows, then its real transitions of this call,
        exactly T in all (one copy of each column into the batch, none where one lane's arrays hold
        just that); its later ones are carried. The fragment arrays are let go here."""
        T, bufs, self._bufs = self.T, self._bufs, []
        for b in bufs:
            b[sb.TRUNCATEDS] &= ~b[sb.TERMINATEDS]  # (a row that terminates is not truncated)
        if self._steps == [T] and not self._skipped[0] and all(c is None for c in self.carry):
            # fast path: one lane, every step real, nothing carried: its arrays are the columns (no copy)
            return sb.SampleBatch({k: v.reshape(self.n * T, *v.shape[2:]) for k, v in bufs[0].items()})
        plan = []  # per sub-env: (lane, its row there, rows carried in, step indexes taken, and kept)
        for g, sl in enumerate(self.lanes):
            valid = np.ones((sl.stop - sl.start, self._steps[g]), bool)
            for s, rows in self._skipped[g]:
                valid[rows, s] = False
            for i in range(sl.stop - sl.start):
                nc = len(self.carry[sl.start + i] or ())
                idx = np.flatnonzero(valid[i])
                plan.append((g, i, nc, idx[:max(T - nc, 0)], idx[max(T - nc, 0):]))
        cols: Dict[str, np.ndarray] = {}
        carry: List[Dict[str, np.ndarray]] = [{} for _ in plan]
        for k, first in bufs[0].items():
            col = cols[k] = np.empty((self.n * T, *first.shape[2:]), first.dtype)
            for j, (g, i, nc, take, keep) in enumerate(plan):
                lo, carried, buf = j * T, self.carry[j], bufs[g][k]
                if nc:
                    col[lo:lo + min(nc, T)] = carried[k][:T]  # type: ignore[index]
                col[lo + nc:lo + T] = buf[i, take]
                parts = ([carried[k][T:]] if nc > T else []) + ([buf[i, keep]] if len(keep) else [])  # type: ignore[index]
                if parts:
                    carry[j][k] = parts[0] if len(parts) == 1 else np.concatenate(parts)
        self.carry = [sb.SampleBatch(c) if c else None for c in carry]
        return sb.SampleBatch(cols)

    def _postprocess(self, batch: sb.SampleBatch, live_eps: Dict[int, Episode]) -> sb.SampleBatch:
        pm = self.worker.pm
        if pm.hook.flowkit_on_trajectory.get_hookimpls():
            pieces = batch.copy().split_by_episode()
            for piece in pieces:
                pm.hook.flowkit_on_trajectory(policy_id=self.policy_id, batch=piece,
                                              episode=live_eps.get(int(piece[sb.EPS_ID][0])))
            return sb.concat_samples([self.policy.postprocess_trajectory(p) for p in pieces])
        return self.policy.postprocess_trajectory(batch)

    def evaluate(self, num_episodes: int, explore: bool = False) -> List[Dict[str, Any]]:
        """``num_episodes`` whole episodes on fresh single envs (:func:`run_episodes`), episode
        ``i`` reset with this worker's first sub-env seed + ``i``: each evaluation of a run
        starts from the same states, so successive evaluations compare the policies alone."""
        return run_episodes(self.policy, self.worker.env_cfg, num_episodes,
                            self.worker.sub_env_contexts[0].seed, explore, self.n)

    def close(self):
        for vec in self.vecs:
            vec.close()


def stack_rows(rows: List[Any]) -> Any:
    """Observations or actions (arrays, or dicts / tuples of them) stacked on a leading axis."""
    if isinstance(rows[0], dict):
        return {k: stack_rows([r[k] for r in rows]) for k in rows[0]}
    if isinstance(rows[0], tuple):
        return tuple(stack_rows([r[i] for r in rows]) for i in range(len(rows[0])))
    return np.stack([np.asarray(r) for r in rows])


def _eval_env_call(env_cfg: Dict[str, Any], j: int, what: str, fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
    """``fn(*args, **kw)``, an env method of an evaluation's sub-env ``j``: what it raises is one
    EnvError line naming the env (the original chained)."""
    try:
        return fn(*args, **kw)
    except (EnvError, TimeoutError):  # already one line; the evaluation's deadline
        raise
    except Exception as e:  # the env's own code
        raise EnvError(f"env {env_name(env_cfg)!r} (evaluation, sub-env {j}) raised in {what}: "
                       f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}") from e


def run_episodes(policy: Any, env_cfg: Dict[str, Any], episodes: int, seed: int, explore: bool = False,
                 num_envs: int = 8, on_step: Optional[Callable[..., None]] = None,
                 after_env: Optional[Callable[[int, Any, bool], None]] = None) -> List[Dict[str, Any]]:
    """Whole episodes of a single-agent Gymnasium env under ``policy`` (evaluation's wrappers
    of ``env.preset``: no life loss, unclipped rewards).

    ``episodes`` episodes are spread over ``min(num_envs, episodes)`` single envs stepped
    together (one batched ``policy.compute_actions(obs, explore)`` call per step); episode ``i``
    starts with ``reset(seed=seed + i)`` whichever env runs it, so a greedy evaluation equals a
    plain loop over those seeds and no episode is favoured for being short. A recurrent policy
    (``policy.initial_state(n)`` not None) keeps one state per episode, from its initial state.

    ``on_step(episode, obs, action, next_obs, reward, terminated, truncated, info)`` is called
    after every env step (``obs``: the observation the action was chosen on); ``after_env(episode,
    env, ended)`` after each reset (``ended`` False) and step (a video grabs ``env.render()``).
    An exception either raises ends the loop (the envs are closed) and reaches the caller.

    Returns:
        ``[{"return": float, "length": int, "seed": int}]`` in episode order.
    Raises:
        EnvError: the env's ``reset`` or ``step`` raised (its type and message, one line).
    """
    k = max(1, min(num_envs, episodes))
    out: Dict[int, Dict[str, Any]] = {}  # by episode, as they end (episodes may be a bound never reached: record steps=)
    slot_ep: List[Optional[int]] = [None] * k
    obs: List[Any] = [None] * k
    ret, length = np.zeros(k), np.zeros(k, np.int64)
    init: Any = getattr(policy, "initial_state", None)
    state = None if init is None else init(k)  # one recurrent state per slot (None: feed-forward)
    envs: List[Any] = []
    next_ep = 0

    def start(j: int) -> None:
        nonlocal next_ep
        if next_ep >= episodes:
            slot_ep[j] = None
            return
        i, next_ep = next_ep, next_ep + 1
        slot_ep[j], ret[j], length[j] = i, 0.0, 0
        obs[j], _ = _eval_env_call(env_cfg, j, "reset()", envs[j].reset, seed=seed + i)
        if state is not None:
            state[j] = init(1)[0]
        if after_env is not None:
            after_env(i, envs[j], False)

    try:
        for j in range(k):
            envs.append(make_env(env_cfg, EnvContext(-1, j, 1, 0, seed + j)))
        for j in range(k):
            start(j)
        while any(e is not None for e in slot_ep):
            live = [j for j in range(k) if slot_ep[j] is not None]
            batch = stack_rows([obs[j] for j in live])
            if state is None:
                actions = policy.compute_actions(batch, explore=explore)
            else:
                actions, state[live] = policy.compute_actions(batch, explore=explore, state=state[live])
            for j, a in zip(live, actions):
                i, prev = slot_ep[j], obs[j]
                assert i is not None
                obs[j], r, term, trunc, info = _eval_env_call(env_cfg, j, "step()", envs[j].step, a)
                if on_step is not None:
                    on_step(i, prev, a, obs[j], r, term, trunc, info)
                ret[j] += float(r)
                length[j] += 1
                if after_env is not None:
                    after_env(i, envs[j], bool(term or trunc))
                if term or trunc:
                    out[i] = {"return": float(ret[j]), "length": int(length[j]), "seed": seed + i}
                    start(j)
    finally:
        for env in envs:
            env.close()
    return [out[i] for i in range(episodes)]
