"""Centralized training with decentralized execution (CTDE): what a policy may learn from
beyond its own observation, and how agents that share one network tell themselves apart.

**Parameter sharing with agent ids** (``multiagent.*``): ``share_parameters`` (default true)
lets every agent share one policy when no mapping is given; false gives each agent a policy of
its own (policy id = agent id). ``obs_agent_id`` (EPyMARL's and BenchMARL's name) appends the
agent's one-hot id to the observation of every policy that several agents play: its
observation space becomes ``Dict({..., "agent_id": Discrete(n)})`` (``n = len(possible_agents)``;
a Dict space keeps its keys, any other is put under ``"obs"``), encoded as every Dict is (its
keys in order, the id one-hot float32[n]), so one network acts differently per agent. The
exported and evaluated policy takes the same Dict observation.

**The centralized value input** of an algorithm whose section has a ``critic_input`` key
(MAPPO, :mod:`flowkit_multiagent.mappo`): per agent step a row float32[D] =
``[base | one-hot agent id]``, ``base`` being

- ``state``: the env's global state, PettingZoo's ``state()`` flattened (float32[S]; the env
  declares ``state_space``);
- ``concat_obs``: the observations of the agent's **team**, each encoded as a policy encodes
  it (Box flattened, Discrete one-hot, Dict flattened without ``action_mask``) and
  concatenated in ``possible_agents`` order; zeros for a team agent not in the game at that step;
- ``auto``: ``state`` where the env declares a ``state_space``, else ``concat_obs``;

and, with ``critic_agent_id`` (default true), the one-hot agent index float32[n]: the
"agent-specific global state" of Yu et al. 2022 ("The Surprising Effectiveness of PPO in
Cooperative Multi-Agent Games", NeurIPS Datasets and Benchmarks, sec. 4.2). The **team** of a
trained policy (:func:`team_of`) is every agent mapped (first choice of ``multiagent.mapping``) to
a policy of its training group (one algorithm, one section: the plan's group); a frozen
policy's team is its own agents.

The runners add two batch columns for such a policy: ``critic_obs`` float32[B, D] (the row
at the row's action) and ``next_critic_obs`` float32[B, D] (at the agent's next observation:
what a truncation or a fragment cut bootstraps from). Acting, export and evaluation never see
them. ``critic_input`` and ``critic_input_dim`` of the policy's section are resolved at set-up
(``auto`` made concrete, D filled in) so that a checkpoint rebuilds the same network.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Set

import gymnasium as gym
import numpy as np

from flowkit.config import ConfigError
from flowkit.core import ObsEncoder, add_batch_axis

CRITIC_OBS = "critic_obs"            # float32[B, D], the centralized value input at the row's action
NEXT_CRITIC_OBS = "next_critic_obs"  # float32[B, D], the same at the agent's next observation
AGENT_ID = "agent_id"                # the key of the agent id in an observation with obs_agent_id
RANDOM = "random"


# ---- parameter sharing with agent ids --------------------------------------------------------
def with_agent_id(space: gym.Space, n_agents: int) -> gym.spaces.Dict:
    """``space`` with the agent id added: a Dict space gains the key ``agent_id`` (Discrete(n));
    any other becomes ``Dict(obs=space, agent_id=Discrete(n))``.

    Raises:
        ConfigError: the Dict space has an ``agent_id`` key already.
    """
    if isinstance(space, gym.spaces.Dict):
        if AGENT_ID in space.spaces:
            raise ConfigError(f"multiagent.obs_agent_id=true: the observation space {space} has an `{AGENT_ID}` "
                              "key already")
        return gym.spaces.Dict({**space.spaces, AGENT_ID: gym.spaces.Discrete(n_agents)})
    return gym.spaces.Dict({"obs": space, AGENT_ID: gym.spaces.Discrete(n_agents)})


def add_agent_id(env_space: gym.Space, obs: Any, agent_index: Any) -> Dict[str, Any]:
    """One raw observation of ``env_space`` in the form of :func:`with_agent_id`'s space (or a
    batch of them: ``agent_index`` int64[N])."""
    if isinstance(env_space, gym.spaces.Dict):
        return {**obs, AGENT_ID: np.int64(agent_index)}
    return {"obs": obs, AGENT_ID: np.int64(agent_index)}


def agent_id_policies(config: Any, members: Mapping[str, Sequence[str]]) -> Set[str]:
    """Policy ids whose observations get the agent id: with ``multiagent.obs_agent_id``, those
    that more than one agent plays (``members``: policy id -> its agents)."""
    if not config.multiagent.obs_agent_id:
        return set()
    return {pid for pid, ags in members.items() if len(ags) > 1}


def policy_members(mapping: Any, possible_agents: Sequence[str]) -> Dict[str, List[str]]:
    """``{policy id: [agents]}``: every agent a policy may play (any option of a weighted rule),
    in ``possible_agents`` order."""
    members: Dict[str, List[str]] = {p: [] for p in mapping.policy_ids}
    for a in possible_agents:
        for p in mapping.options(a):
            members[p].append(a)
    return members


# ---- teams ----------------------------------------------------------------------------------------
def training_group(config: Any, pid: str, algo: Optional[str] = None) -> str:
    """Policy ``pid``'s training group from the config alone, as :class:`~flowkit_multiagent.specs.MAPolicySpec`
    names it: ``""`` when not trained (``trainable: false``, ``algo: random``), the algorithm's
    name, or ``<algo>[<pid>]`` for a policy with its own ``config`` overrides (``algo``: its
    algorithm where set-up knows it, else ``multiagent.policies.<pid>.algo`` or ``algo``)."""
    pc = (config.multiagent.policies or {}).get(pid)
    algo = str(algo or (pc.algo if pc is not None else None) or config.algo)
    if (pc is not None and not bool(pc.trainable)) or algo == RANDOM:
        return ""
    return f"{algo}[{pid}]" if pc is not None and pc.config else algo


def team_of(config: Any, mapping: Any, possible_agents: Sequence[str], pid: str) -> List[str]:
    """The team of policy ``pid``: the agents whose first-choice policy (``multiagent.mapping``)
    is in ``pid``'s training group (:func:`training_group`), in ``possible_agents`` order; a
    policy that is not trained: its own agents."""
    group = training_group(config, pid)
    if not group:
        return [a for a in possible_agents if mapping.base(a) == pid]
    return [a for a in possible_agents if training_group(config, mapping.base(a)) == group]


# ---- the centralized value input -------------------------------------------------------------------
def env_state_space(env: Any) -> Optional[gym.Space]:
    """The PettingZoo env's declared ``state_space`` (wrappers looked through), or None."""
    for e in (env, getattr(env, "unwrapped", None)):
        sp = getattr(e, "state_space", None) if e is not None else None
        if isinstance(sp, gym.Space):
            return sp
    return None


class CriticInput:
    """Builds the centralized value input rows of one policy (see module docstring).

    Args:
        kind: ``state`` or ``concat_obs`` (resolved).
        team: the agents whose observations ``concat_obs`` joins, in ``possible_agents`` order.
        possible_agents: every agent of the env (the one-hot id's order).
        obs_spaces: ``{agent: its raw observation space}`` (the env's).
        state_space: the env's ``state_space`` (``state``), else None.
        agent_id: append the one-hot agent index.
    """

    def __init__(self, kind: str, team: Sequence[str], possible_agents: Sequence[str],
                 obs_spaces: Mapping[str, gym.Space], state_space: Optional[gym.Space], agent_id: bool):
        self.kind, self.team, self.agent_id = kind, list(team), bool(agent_id)
        self.n = len(possible_agents)
        if kind == "state":
            assert state_space is not None, "critic_input=state needs the env's state_space"
            self.base_dim = int(gym.spaces.flatdim(state_space))
            self.encoders: Dict[str, ObsEncoder] = {}
        else:
            self.encoders = {a: ObsEncoder(obs_spaces[a]) for a in self.team}
            self.base_dim = sum(int(np.prod(e.shape)) for e in self.encoders.values())
        self.dim = self.base_dim + (self.n if self.agent_id else 0)

    def base(self, state: Any, observe: Callable[[str], Any], n: int = 0) -> np.ndarray:
        """float32[base_dim] at one moment of one sub-env: ``state()`` flattened (``state``: the
        env's method; None for ``concat_obs``), or every team agent's ``observe(agent)`` (None: not
        in the game, zeros) encoded and concatenated; with ``n`` > 0, float32[n, base_dim] of ``n``
        sub-envs at once (``observe`` gives ``n`` rows)."""
        if self.kind == "state":
            return np.asarray(state(), np.float32).reshape(-1)
        k, parts = max(n, 1), []
        for a, enc in self.encoders.items():
            o = observe(a)
            x = np.zeros(enc.shape, np.float32) if o is None else enc(o if n else add_batch_axis(o), k)[0]
            parts.append(np.asarray(x, np.float32).reshape(k, -1))
        out = np.concatenate(parts, 1) if parts else np.zeros((k, 0), np.float32)
        return out if n else out[0]

    def row(self, base: np.ndarray, agent_index: int) -> np.ndarray:
        """float32[..., dim]: ``base`` float32[..., base_dim] then, with ``agent_id``, the one-hot
        of ``agent_index``."""
        if not self.agent_id:
            return base
        out = np.zeros((*base.shape[:-1], self.dim), np.float32)
        out[..., :self.base_dim], out[..., self.base_dim + agent_index] = base, 1.0
        return out


def resolve_critic_input(config: Any, pid: str, algo: str, section: Any, env: Any, mapping: Any,
                         possible_agents: Sequence[str]) -> CriticInput:
    """Policy ``pid``'s :class:`CriticInput` from its section's ``critic_input`` and
    ``critic_agent_id`` (``auto`` resolved on ``env``).

    Raises:
        ConfigError: ``critic_input=state`` for an env without a ``state_space`` (naming the key
            and the env), or a ``critic_input_dim`` given that differs from the env's.
    """
    pc = (config.multiagent.policies or {}).get(pid)  # the key critic_input comes from: the override, else the section
    over = pc.config if pc is not None else None
    key = f"multiagent.policies.{pid}.config.critic_input" if over and "critic_input" in over else f"{algo}.critic_input"
    kind = str(section.critic_input)
    st = env_state_space(env)
    if kind == "auto":
        kind = "state" if st is not None else "concat_obs"
    if kind == "state" and st is None:
        raise ConfigError(f"{key}=state: env {type(env).__name__} declares no state_space (PettingZoo's global "
                          "state()); use concat_obs (the team's observations) or auto")
    team = team_of(config, mapping, possible_agents, pid)
    ci = CriticInput(kind, team, possible_agents, {a: env.observation_space(a) for a in possible_agents}, st,
                     bool(section.critic_agent_id))
    given = section.critic_input_dim
    if given is not None and int(given) != ci.dim:
        raise ConfigError(f"{key.rsplit('.', 1)[0]}.critic_input_dim={given}: the {kind} input of policy {pid!r} "
                          f"(team {', '.join(team)}) is {ci.dim} wide here; leave it unset (set-up fills it in)")
    return ci


def critic_inputs(config: Any, policies: Mapping[str, Any], env: Any, mapping: Any,
                  possible_agents: Sequence[str]) -> Dict[str, CriticInput]:
    """``{policy id: CriticInput}`` of the policies whose section declares a centralized value
    input (resolved at set-up: ``critic_input`` concrete, ``critic_input_dim`` set); on a worker."""
    return {pid: resolve_critic_input(config, pid, "", pol.config, env, mapping, possible_agents)
            for pid, pol in policies.items() if getattr(getattr(pol, "config", None), "critic_input", None)}


# ---- joining a team's rows of one env step (driver side, before replay) ------------------------------
def with_policy_batches(batch: Any, fn: Callable[[Dict[str, Any]], Dict[str, Any]]) -> Any:
    """A new MultiAgentBatch: ``batch``'s with its policy batches ``fn(batch.policy_batches)``
    (the team joins' operators, before the replay buffer)."""
    from flowkit.core import batch as sb
    return sb.MultiAgentBatch(fn(batch.policy_batches), batch.env_steps, batch.agent_steps, batch.episodes,
                              batch.worker_index, batch.meta)


TEAM_MEMBER = "team_member"  # int64[B], the index of the row's agent in its team
_T_BITS = 20                 # step keys: episode * 2**20 + t


def join_team(policy_batches: Mapping[str, Any], team: Sequence[str], agent_indexes: Sequence[int], n_agents: int,
              columns: Mapping[str, Any], incomplete: str = "drop") -> Dict[str, Any]:
    """Each policy's rows with the values of every team member at the row's env step.

    The rows of one env step of one sub-env are those of one episode (``eps_id // n_agents``:
    a multi-agent ``eps_id`` is ``episode_id * n_agents + agent_index``) with the same ``t``.
    A step where some member has no row (an agent that is done while others go on) is dropped
    (``incomplete="drop"``) or refused (``"raise"``). Inputs are not modified.

    Args:
        policy_batches: ``{policy id: SampleBatch}`` of the team's policies (rows with ``eps_id``,
            ``t``, ``agent_index``).
        team: the members' agent ids; ``agent_indexes``: their indexes in ``possible_agents``;
            ``n_agents``: ``len(possible_agents)``.
        columns: ``{out column: (source column, [width per member])}``: the out column is
            float32[B, sum(widths)], every member's source row flattened, in team order.
    Returns:
        ``{policy id: SampleBatch}`` with the out columns and :data:`TEAM_MEMBER` added.
    Raises:
        ConfigError: a row of an agent outside the team, or a source row whose width is not
            the member's.
        ValueError: ``incomplete="raise"`` and a step without a row of every member: ``episode
            E, step T: rows of agents [...] of the team [...]`` (the first such step).
    """
    from flowkit.core import batch as sb
    lut = np.full(int(n_agents), -1, np.int64)
    lut[list(agent_indexes)] = np.arange(len(agent_indexes))
    parts = {pid: b for pid, b in policy_batches.items() if len(b)}
    members = {pid: lut[b[sb.AGENT_INDEX]] for pid, b in parts.items()}
    for pid, m in members.items():
        if (m < 0).any():
            raise ConfigError(f"policy {pid!r}: agent index {int(parts[pid][sb.AGENT_INDEX][m < 0][0])} is not in "
                              f"its team {list(team)}")
    keys = [(b[sb.EPS_ID] // int(n_agents)) * (1 << _T_BITS) + b[sb.T] for b in parts.values()]
    uniq, inv = np.unique(np.concatenate(keys or [np.zeros(0, np.int64)]), return_inverse=True)
    offsets = {c: np.cumsum([0, *widths]) for c, (_, widths) in columns.items()}
    tables = {c: np.zeros((len(uniq), int(off[-1])), np.float32) for c, off in offsets.items()}
    start, rows = 0, {}
    for pid, b in parts.items():
        rows[pid], m = inv[start:start + len(b)], members[pid]
        start += len(b)
        for c, (src, widths) in columns.items():
            v = np.asarray(b[src], np.float32).reshape(len(b), -1)
            if (bad := np.flatnonzero(np.asarray(widths)[m] != v.shape[1])).size:
                raise ConfigError(f"policy {pid!r}: {src} has {v.shape[1]} columns, the team says "
                                  f"{widths[m[bad[0]]]} for agent {team[m[bad[0]]]!r}")
            tables[c][rows[pid][:, None], offsets[c][m][:, None] + np.arange(v.shape[1])] = v
    complete = np.bincount(inv, minlength=len(uniq)) == len(team)
    if incomplete == "raise" and not complete.all():
        u = int(np.flatnonzero(~complete)[0])
        here = sorted(team[int(j)] for pid in parts for j in members[pid][rows[pid] == u])
        raise ValueError(f"episode {int(uniq[u]) >> _T_BITS}, step {int(uniq[u]) & ((1 << _T_BITS) - 1)}: rows of "
                         f"agents {here} of the team {list(team)}")
    out = dict(policy_batches)
    for pid, b in parts.items():
        keep = np.flatnonzero(complete[rows[pid]])
        nb = b.take(keep)
        nb.update({c: t[rows[pid][keep]] for c, t in tables.items()})
        nb[TEAM_MEMBER] = members[pid][keep]
        out[pid] = nb
    return out
