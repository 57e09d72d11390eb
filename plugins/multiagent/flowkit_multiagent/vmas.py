"""VMAS, the Vectorized Multi-Agent Simulator (Bettini et al. 2022, "VMAS: A Vectorized
Multi-Agent Simulator for Collective Robot Learning", DARS, arXiv 2207.03530), as a batched
multi-agent env: the ``runtime.num_envs_per_worker`` sub-envs of a rollout worker are **one**
VMAS env (``num_envs`` = that number), stepped by one torch call per env step for all of them,
not one Python env per sub-env::

    flowkit train env.factory=flowkit_multiagent.vmas:parallel_env env.kwargs.scenario=balance \\
        env.kwargs.n_agents=4 runtime.num_envs_per_worker=32

``env.kwargs``: ``scenario`` (a name in ``vmas.scenarios``, ``vmas.mpe_scenarios`` or
``vmas.debug_scenarios``), ``continuous_actions`` (default true: Box actions; false:
Discrete), ``max_steps`` (the episode limit, a truncation; default 100, as BenchMARL's VMAS
tasks) and the scenario's own arguments (``n_agents``, ``package_mass``, ...): every other
key. A key the scenario does not take is an error (VMAS itself only warns).

:func:`parallel_env` returns a :class:`VmasEnv`, a PettingZoo ParallelEnv of one sub-env (the
probe the driver infers each agent's spaces from, and a plain single env where one is
stepped), and the worker's runner, :class:`VmasRunner`, builds the batched VMAS env of all its
sub-envs from it. The agent -> policy mapping, per-policy algorithms, frozen policies and
evaluation opponents work as for any PettingZoo game, except what needs a per-episode mapping:
weighted mapping rules (opponent sampling) and ``alternate_seats`` are refused at set-up.

Counting and batches are those of the PettingZoo runners (:mod:`flowkit_multiagent.runners`):
a fragment is ``runtime.rollout_fragment_length`` env steps of each sub-env; every agent acts
every step (``agent_steps = n_agents x env_steps``); VMAS ends all agents of a sub-env
together (``terminated``: the scenario's ``done()``, e.g. balance's package fell or reached
the goal; ``truncated``: ``max_steps``); the sub-env is reset in the same call (VMAS has no
autoreset step), and the row that ends the episode keeps the final observation as
``next_obs``. The CTDE layer (:mod:`flowkit_multiagent.centralized`) works as in the other
runners, batched: ``multiagent.obs_agent_id`` adds each agent's id to the observations of a
shared policy, and a policy with a centralized value input gets ``critic_obs`` /
``next_critic_obs`` rows (VMAS has no global state: ``concat_obs``, the team's observations).
"""
from __future__ import annotations

import difflib
import warnings
from typing import Any, Dict, List, Optional, Tuple

import gymnasium as gym
import numpy as np
from pettingzoo.utils.env import ParallelEnv

from flowkit.config import ConfigError
from flowkit.core import EnvError, Episode, RecurrentStates, find_mismatch
from flowkit.core import batch as sb
from flowkit_multiagent.centralized import CRITIC_OBS, NEXT_CRITIC_OBS, add_agent_id
from flowkit_multiagent.runners import RunnerBase

DEFAULT_MAX_STEPS = 100


def scenario_names() -> List[str]:
    """Every scenario name VMAS knows (its robot, MPE and debug scenarios)."""
    import vmas  # type: ignore[import-untyped]
    return sorted({*vmas.scenarios, *vmas.mpe_scenarios, *vmas.debug_scenarios})


def parallel_env(scenario: str, context: Any = None, continuous_actions: bool = True,
                 max_steps: Optional[int] = DEFAULT_MAX_STEPS, **scenario_kwargs: Any) -> "VmasEnv":
    """The env factory (``env.factory=flowkit_multiagent.vmas:parallel_env``): VMAS
    ``scenario`` with ``scenario_kwargs`` as one sub-env (see the module docstring). The first
    sub-env of a worker (``context.vector_index == 0``, the driver's probe too) builds its VMAS
    env now, so that a bad ``env.kwargs`` fails here; the others build nothing (the runner
    steps all sub-envs in one VMAS env).

    Raises:
        ValueError: ``scenario`` is not a VMAS scenario, ``max_steps`` is not a positive int, or
            a key of ``scenario_kwargs`` is not an argument of the scenario (each naming the
            ``env.kwargs`` key).
    """
    names = scenario_names()
    if scenario not in names:
        close = difflib.get_close_matches(str(scenario), names, n=1)
        raise ValueError(f"env.kwargs.scenario={scenario!r} is not a VMAS scenario"
                         + (f"; did you mean {close[0]!r}?" if close else f" (scenarios: {', '.join(names)})"))
    if max_steps is not None and (not isinstance(max_steps, int) or max_steps < 1):
        raise ValueError(f"env.kwargs.max_steps={max_steps!r} must be a positive int (or null: no limit)")
    seed = 0 if context is None else int(context.seed)
    env = VmasEnv(scenario, bool(continuous_actions), max_steps, scenario_kwargs, seed)
    if context is None or int(context.vector_index) == 0:
        env.single()
    return env


class VmasEnv(ParallelEnv):
    """A VMAS scenario as a PettingZoo ParallelEnv of one sub-env, and the recipe of its batched
    form (:meth:`make`). Its VMAS env of one sub-env is built when first needed (spaces,
    ``reset``, ``step``).

    Spaces: an agent's observation is VMAS's, float32[d] (``Box(-inf, inf)``); its action is
    ``Box`` of VMAS's bounds (``continuous_actions``) or ``Discrete`` (VMAS's discrete actions).
    Rewards are float; ``terminated`` / ``truncated`` are the sub-env's, the same for every agent.
    """

    metadata = {"name": "vmas", "is_parallelizable": True}

    def __init__(self, scenario: str, continuous_actions: bool, max_steps: Optional[int],
                 scenario_kwargs: Dict[str, Any], seed: int):
        self.scenario, self.continuous_actions, self.max_steps = scenario, continuous_actions, max_steps
        self.scenario_kwargs, self.seed = dict(scenario_kwargs), seed
        self._one: Any = None
        self.agents: List[str] = []

    def make(self, num_envs: int, seed: int) -> Any:
        """The VMAS env of ``num_envs`` sub-envs (CPU, dict spaces keyed by agent name,
        ``terminated`` and ``truncated`` apart), reset with ``seed``.

        Raises:
            ValueError: a key of ``env.kwargs`` the scenario did not take.
        """
        import vmas
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            env = vmas.make_env(self.scenario, num_envs=num_envs, device="cpu",
                                continuous_actions=self.continuous_actions, max_steps=self.max_steps, seed=seed,
                                dict_spaces=True, terminated_truncated=True, **self.scenario_kwargs)
        unused = [w for w in caught if "passed but not used" in str(w.message)]
        if unused:
            left = [k for k in self.scenario_kwargs if repr(k) in str(unused[0].message)]
            raise ValueError(f"env.kwargs: {', '.join(left) or str(unused[0].message)} not an argument of VMAS "
                             f"scenario {self.scenario!r}")
        for w in caught:
            if w not in unused:
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        return env

    def single(self) -> Any:
        """This sub-env's own VMAS env of one sub-env (built on first use)."""
        if self._one is None:
            self._one = self.make(1, self.seed)
        return self._one

    @property
    def possible_agents(self) -> List[str]:
        return [a.name for a in self.single().agents]

    @property
    def observation_spaces(self) -> Dict[str, gym.Space]:
        return {a: gymnasium_space(s) for a, s in self.single().observation_space.spaces.items()}

    @property
    def action_spaces(self) -> Dict[str, gym.Space]:
        return {a: gymnasium_space(s) for a, s in self.single().action_space.spaces.items()}

    def observation_space(self, agent: str) -> gym.Space:
        return self.observation_spaces[agent]

    def action_space(self, agent: str) -> gym.Space:
        return self.action_spaces[agent]

    def reset(self, seed: Optional[int] = None, options: Optional[Dict[str, Any]] = None):
        obs = self.single().reset(seed=seed)
        self.agents = self.possible_agents
        return {a: o[0].numpy() for a, o in obs.items()}, {a: {} for a in self.agents}

    def step(self, actions: Dict[str, Any]):
        env = self.single()
        acts = {a: to_torch(self.action_space(a), np.asarray(actions[a])[None]) for a in self.agents}
        obs, rew, term, trunc, _ = env.step(acts)
        te, tu = bool(term[0]), bool(trunc[0])
        agents, self.agents = self.agents, ([] if te or tu else self.agents)
        return ({a: obs[a][0].numpy() for a in agents}, {a: float(rew[a][0]) for a in agents},
                {a: te for a in agents}, {a: tu for a in agents}, {a: {} for a in agents})

    def close(self) -> None:
        self._one = None


def gymnasium_space(space: Any) -> gym.Space:
    """A space of VMAS (``gym``'s, the package Gymnasium forked from) as Gymnasium's.

    Raises:
        TypeError: a kind of space VMAS does not make (Box, Discrete, MultiDiscrete, Dict).
    """
    kind = type(space).__name__
    if kind == "Box":
        return gym.spaces.Box(space.low, space.high, space.shape, space.dtype)
    if kind == "Discrete":
        return gym.spaces.Discrete(int(space.n))
    if kind == "MultiDiscrete":
        return gym.spaces.MultiDiscrete(space.nvec)
    if kind == "Dict":
        return gym.spaces.Dict({k: gymnasium_space(v) for k, v in space.spaces.items()})
    raise TypeError(f"a VMAS space of kind {kind} ({space}) has no Gymnasium equivalent here")


def _numpy(x: Any) -> Any:
    """A VMAS observation (a tensor, or a dict of them) as numpy arrays (sharing memory)."""
    return {k: _numpy(v) for k, v in x.items()} if isinstance(x, dict) else x.numpy()


def to_torch(space: gym.Space, actions: np.ndarray) -> Any:
    """Env actions of one agent for ``B`` sub-envs (numpy, ``[B, *space.shape]``) as the tensor
    VMAS takes: float32 for Box, int64 otherwise."""
    import torch
    return torch.from_numpy(np.ascontiguousarray(actions, np.float32 if isinstance(space, gym.spaces.Box) else np.int64))


def check_mapping(config: Any) -> None:
    """What the batched runner needs of ``multiagent.*``: one policy per agent for the whole run.

    Raises:
        ConfigError: a weighted mapping rule, or ``alternate_seats`` / ``eval_alternate_seats``.
    """
    ma = config.multiagent
    for key in ("alternate_seats", "eval_alternate_seats"):
        if bool(ma.get(key)):
            raise ConfigError(f"multiagent.{key}=true: VMAS envs keep each agent's policy for the whole run "
                              "(its sub-envs step as one batch); leave it false")
    for pat, target in (ma.mapping or {}).items():
        if not isinstance(target, str) and hasattr(target, "keys") and len(target) > 1:
            raise ConfigError(f"multiagent.mapping.{pat}: a weighted choice is drawn per episode, but VMAS envs keep "
                              "each agent's policy for the whole run (its sub-envs step as one batch); map it to one policy")


class _Group:
    """The agents that act through one policy: their indexes in ``possible_agents``, and the
    recurrent state of their ``len(agents) x N`` rows (agent-major)."""

    def __init__(self, pid: str, policy: Any, agents: List[int], n: int):
        self.pid, self.policy, self.agents = pid, policy, agents
        self.states = RecurrentStates.of(policy, len(agents) * n)


class VmasRunner(RunnerBase):
    """Steps one VMAS env of ``N = runtime.num_envs_per_worker`` sub-envs; per env step one
    batched call per policy (``len(agents) x N`` rows) and one ``env.step`` of VMAS. Returns a
    :class:`~flowkit.core.batch.MultiAgentBatch` keyed by policy id whose rows are ordered
    (agent, sub-env, time): each agent's piece of each sub-env, ``T`` rows in time order (see the
    module docstring for counting and episode ends)."""

    def __init__(self, worker: Any, envs: List[VmasEnv]):
        super().__init__(worker, envs)
        game = envs[0]
        self.act_spaces = {a: game.action_space(a) for a in self.possible_agents}
        for e in envs:
            e.close()
        self.seed = int(worker.sub_env_contexts[0].seed)
        self.env = game.make(self.n, self.seed)
        self.pid_of = [self.mapping.base(a) for a in self.possible_agents]
        self.check_left = int(self.config.env.check_spaces_steps)
        self._live = False  # the training episodes are running (an evaluation resets the sub-envs)
        self._seed_next: Optional[int] = self.seed  # the first training reset reseeds VMAS's RNG

    # ---- the episodes of the N sub-envs -----------------------------------------------------
    def _start(self, acting: Dict[str, Any], seed: Optional[int]) -> None:
        """Reset every sub-env (with ``seed``: VMAS's RNG reseeded) and start their episodes."""
        self.groups = [_Group(p, acting[p], [i for i, q in enumerate(self.pid_of) if q == p], self.n)
                       for p in dict.fromkeys(self.pid_of)]
        self._observe(self.env.reset(seed=seed), "reset()")
        self.episodes = [Episode(next(self.worker.episode_ids), j, self.worker.index) for j in range(self.n)]
        self.eps = np.array([e.episode_id for e in self.episodes], np.int64)
        self.t = np.zeros(self.n, np.int64)
        self.ret = np.zeros((self.n, len(self.possible_agents)), np.float64)

    def _observe(self, obs: Dict[str, Any], what: str) -> None:
        """Encode every agent's observations (``obs``: agent -> float32 tensor [N, d], or a dict
        of them) into ``self.enc`` (agent index -> float32[N, ...]), checking them in the first
        steps; and the team observations of the centralized value inputs (``self.bases``: policy
        id -> float32[N, base_dim])."""
        raw = [_numpy(obs[a]) for a in self.possible_agents]
        if self.check_left > 0:
            self.check_left -= 1
            for a, x in zip(self.possible_agents, raw, strict=True):
                m = self._mismatch(a, x)
                if m:
                    raise EnvError(f"env {self.name!r} (worker {self.worker.index}) returned a bad observation from "
                                   f"{what} for agent {a!r}: at `{m[0]}` expected {m[1]}, received {m[2]}")
        self.enc: Dict[int, np.ndarray] = {}
        for g in self.groups:
            for i in g.agents:
                x = raw[i]
                if g.pid in self.with_id:  # N rows of agent i
                    x = add_agent_id(self.obs_spaces[self.possible_agents[i]], x, np.full(self.n, i, np.int64))
                self.enc[i] = g.policy.encoder(x, self.n)[0]
        self.bases = {pid: ci.base(None, lambda a: raw[self.possible_agents.index(a)], self.n)
                      for pid, ci in self.critics.items() if not self._eval}

    def _mismatch(self, agent: str, x: Any) -> Optional[Tuple[str, str, str]]:
        """The first sub-env's observation of ``agent`` against its space, after the batch's rows."""
        first = next(iter(x.values())) if isinstance(x, dict) else x
        if np.shape(first)[:1] != (self.n,):
            return f"obs[{agent}]", f"{self.n} rows (one per sub-env)", f"shape {np.shape(first)}"
        row = {k: v[0] for k, v in x.items()} if isinstance(x, dict) else x[0]
        return find_mismatch(self.obs_spaces[agent], row, f"obs[{agent}]")

    def _critic_rows(self, g: _Group) -> np.ndarray:
        """float32[k N, dim]: the centralized value input of group ``g``'s rows (agent-major):
        the team's observations of each sub-env, then (``critic_agent_id``) the agent's one-hot id."""
        return np.concatenate([self.critics[g.pid].row(self.bases[g.pid], i) for i in g.agents])

    def _act(self, g: _Group, explore: bool) -> Tuple[np.ndarray, np.ndarray, Dict[str, np.ndarray], Dict[str, Any]]:
        """One policy call for group ``g``'s rows; returns (obs, actions, extras, env actions by agent)."""
        obs = np.concatenate([self.enc[i] for i in g.agents]) if len(g.agents) > 1 else self.enc[g.agents[0]]
        if g.states is None:
            actions, extras = g.policy.compute_actions_encoded(obs, None, explore)
        else:
            actions, extras = g.states.act(obs, None, explore)
        env_actions = g.policy.dist.to_env(actions)
        names = [self.possible_agents[i] for i in g.agents]
        out = {a: to_torch(self.act_spaces[a], env_actions[k * self.n:(k + 1) * self.n]) for k, a in enumerate(names)}
        return obs, actions, dict(extras), out

    def _step(self, explore: bool, record: Optional[List[List[Dict[str, np.ndarray]]]]
              ) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        """One env step of every sub-env: act, step VMAS, record each group's rows (when
        ``record``: per group, per step a dict of columns), advance the episode figures.
        Returns (rewards float32[N, n_agents], terminated bool[N], truncated bool[N])."""
        acted = [self._act(g, explore) for g in self.groups]
        critic = {g.pid: self._critic_rows(g) for g in self.groups if g.pid in self.bases}
        actions = {a: x for _, _, _, out in acted for a, x in out.items()}
        obs, rew, term, trunc, _ = self.env.step(actions)
        r = np.stack([rew[a].numpy() for a in self.possible_agents], axis=1).astype(np.float32)
        te, tu = term.numpy().astype(bool), trunc.numpy().astype(bool) & ~term.numpy().astype(bool)
        if self.check_left > 0 and r.shape != (self.n, len(self.possible_agents)):
            raise EnvError(f"env {self.name!r} (worker {self.worker.index}) returned rewards of shapes "
                           f"{[tuple(rew[a].shape) for a in self.possible_agents]}, expected ({self.n},) per agent")
        self._observe(obs, "step()")
        if record is not None:
            for g, (o, a, ex, _), rows in zip(self.groups, acted, record, strict=True):
                k = len(g.agents)
                rows.append({sb.OBS: o, sb.ACTIONS: a, **ex, sb.REWARDS: r[:, g.agents].T.reshape(-1),
                             sb.TERMINATEDS: np.tile(te, k), sb.TRUNCATEDS: np.tile(tu, k),
                             sb.NEXT_OBS: np.concatenate([self.enc[i] for i in g.agents]),
                             sb.EPS_ID: np.concatenate([self.eps * len(self.possible_agents) + i for i in g.agents]),
                             sb.T: np.tile(self.t, k),
                             sb.AGENT_INDEX: np.repeat(np.asarray(g.agents, np.int64), self.n)})
                if g.pid in critic:
                    rows[-1].update({CRITIC_OBS: critic[g.pid], NEXT_CRITIC_OBS: self._critic_rows(g)})
        self.t += 1
        self.ret += r
        return r, te, tu

    def _end(self, done: np.ndarray, te: np.ndarray, finished: List[Dict[str, Any]], hook: bool,
             counted: Optional[np.ndarray] = None) -> None:
        """Close the episodes of the sub-envs ``done`` (bool[N]) into ``finished`` (only those
        ``counted`` allows, when given), reset those sub-envs and start new episodes there."""
        idx = np.flatnonzero(done)
        if not len(idx):
            return
        for j in idx:
            ep = self.episodes[j]
            ep.length, ep.total_reward = int(self.t[j]), float(self.ret[j].sum())
            ep.agent_rewards = {(a, self.pid_of[i]): float(self.ret[j, i]) for i, a in enumerate(self.possible_agents)}
            ep.terminated, ep.truncated = bool(te[j]), not bool(te[j])
            if hook:
                self.worker.pm.hook.flowkit_on_episode_end(episode=ep, worker=self.worker)
            if counted is None or counted[j]:
                finished.append(ep.summary())
            self.episodes[j] = Episode(next(self.worker.episode_ids), int(j), self.worker.index)
            self.eps[j], self.t[j], self.ret[j] = self.episodes[j].episode_id, 0, 0.0
        if len(idx) == self.n:
            obs = self.env.reset()
        else:
            for j in idx:
                self.env.reset_at(int(j), return_observations=False)
            obs = self.env.get_from_scenario(get_observations=True, get_rewards=False, get_infos=False,
                                             get_dones=False)[0]
        self._observe(obs, "reset_at()")
        for g in self.groups:
            if g.states is not None:
                g.states.reset((np.arange(len(g.agents))[:, None] * self.n + idx[None, :]).reshape(-1))

    # ---- the public API ---------------------------------------------------------------------
    def sample(self, explore: bool = True) -> sb.MultiAgentBatch:
        if not self._live:
            self._start(self.worker.policies, self._seed_next)
            self._live, self._seed_next = True, None
        hook = bool(self.worker.pm.hook.flowkit_on_episode_end.get_hookimpls())
        record: List[List[Dict[str, np.ndarray]]] = [[] for _ in self.groups]
        finished: List[Dict[str, Any]] = []
        live = {e.episode_id: e for e in self.episodes}
        for _ in range(self.T):
            _, te, tu = self._step(explore, record)
            self._end(te | tu, te, finished, hook)
            live.update({e.episode_id: e for e in self.episodes})
        for j, ep in enumerate(self.episodes):  # running episodes, as trajectory hooks see them
            ep.length, ep.total_reward = int(self.t[j]), float(self.ret[j].sum())
        batches = {g.pid: self._postprocess(g, rows, live) for g, rows in zip(self.groups, record, strict=True)}
        return self._batch(batches, finished, self.n * self.T * len(self.possible_agents))

    def _postprocess(self, g: _Group, rows: List[Dict[str, np.ndarray]], live: Dict[int, Episode]) -> sb.SampleBatch:
        """Group ``g``'s steps as one batch, rows (agent, sub-env, time), post-processed by its
        policy (``flowkit_on_trajectory`` first, per trajectory piece, where a plugin implements it)."""
        batch = sb.SampleBatch({k: np.stack([s[k] for s in rows], axis=1).reshape(-1, *rows[0][k].shape[1:])
                                for k in rows[0]})
        pm = self.worker.pm
        if not pm.hook.flowkit_on_trajectory.get_hookimpls():
            return g.policy.postprocess_trajectory(batch)
        pieces = batch.split_by_episode()
        for piece in pieces:
            ep = live.get(int(piece[sb.EPS_ID][0]) // len(self.possible_agents))
            pm.hook.flowkit_on_trajectory(policy_id=g.pid, batch=piece, episode=ep)
        return sb.concat_samples([g.policy.postprocess_trajectory(p) for p in pieces])

    def evaluate(self, num_episodes: int, explore: bool = False) -> List[Dict[str, Any]]:
        """``num_episodes`` whole episodes from a reset of every sub-env with this worker's
        first sub-env seed (each evaluation starts from the same states), spread over the
        sub-envs (sub-env ``j`` counts its episodes ``j, j + N, ...``), with the policies of
        ``multiagent.eval_opponents`` replaced by fixed ones. The training episodes start
        afresh afterwards."""
        self._live, self._eval = False, True
        try:
            self._start(self._eval_policies(), self.seed)
            quota = np.array([len(range(j, num_episodes, self.n)) for j in range(self.n)])
            finished: List[Dict[str, Any]] = []
            while len(finished) < num_episodes:
                _, te, tu = self._step(explore, None)
                done = te | tu
                self._end(done, te, finished, False, counted=quota > 0)
                quota -= done
        finally:
            self._eval = False
        return finished

    def close(self) -> None:
        self.env = None
