"""From a PettingZoo env and the ``multiagent.*`` section to policies: the agent -> policy
mapping, spaces inferred per policy, per-policy algorithm configs, frozen and checkpointed
policies (tests/test_multiagent.py::test_c04_*).

Everything here runs on the driver at set-up and raises :class:`flowkit.ConfigError` naming
the key, policy, agents and spaces involved.
"""
from __future__ import annotations

import dataclasses
import fnmatch
import itertools
import os
import random
import sys
import warnings
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Type

import gymnasium as gym
from omegaconf import DictConfig, OmegaConf

from flowkit.config import ConfigError, check_values, did_you_mean, merge_overrides, section_object, validate_section
from flowkit.core import Algorithm, PolicySpec
from flowkit_multiagent.centralized import (
    RANDOM,
    agent_id_policies,
    policy_members,
    resolve_critic_input,
    team_of,
    training_group,
    with_agent_id,
)
from flowkit_multiagent.config import PolicyConfig
from flowkit_multiagent.league import League, league_mapping, slot_ids

SHARED_POLICY_ID = "shared"


def is_pettingzoo(env: Any) -> bool:
    """Whether ``env`` is a PettingZoo ParallelEnv or AECEnv (wrappers included). No object is
    an instance of a class whose module was never imported: a single-agent run never loads
    PettingZoo for this check (0.1-0.3 s of every worker's start-up)."""
    if "pettingzoo.utils.env" not in sys.modules:
        return False
    from pettingzoo.utils.env import AECEnv, ParallelEnv
    return isinstance(env, (ParallelEnv, AECEnv))


def _plain(x: Any) -> Any:
    """``x`` with its DictConfig / ListConfig nodes turned into plain dicts and lists."""
    return OmegaConf.to_container(x, resolve=True) if OmegaConf.is_config(x) else x


def policy_model(config: Any, pid: str, overrides: Any) -> Any:
    """The ``model.*`` of policy ``pid``: the run's with ``multiagent.policies.<pid>.model``
    merged over it (checked as the run's is), or None without overrides.

    Raises:
        ConfigError: an unknown key or a value the key does not allow (named).
    """
    if not overrides:
        return None
    from flowkit.config import ModelConfig
    try:
        model = OmegaConf.merge(config.model, _plain(overrides))
    except Exception as e:
        raise ConfigError(f"multiagent.policies.{pid}.model: {str(e).splitlines()[0]}") from None
    check_values(model, ModelConfig, f"multiagent.policies.{pid}.model.")
    return model


@dataclasses.dataclass
class MAPolicySpec(PolicySpec):
    """A :class:`PolicySpec` of a multi-agent run.

    Attributes:
        agents: the agent ids mapped to this policy (at set-up, ``possible_agents`` order).
        trainable: False for frozen policies (``trainable: false``, ``algo: random``).
        group: the training group: the algorithm name, or ``<algo>[<policy id>]`` for a
            policy with its own config overrides ("" when not trained).
        init_state: policy state loaded from ``checkpoint`` (weights set before sampling).
    """
    agents: Tuple[str, ...] = ()
    trainable: bool = True
    group: str = ""
    init_state: Optional[Dict[str, Any]] = None


# ---- the mapping ------------------------------------------------------------------------------
class AgentMapping:
    """Agent id -> policy id: exact keys of ``patterns`` first, then glob patterns in the order
    given (``fnmatch``, case-sensitive), then an agent whose id is a policy id, then (only
    without patterns) the single policy. Picklable; rule lookups are cached.

    A rule maps to one policy id, or to a weighted choice ``{policy_id: weight, ...}`` drawn
    once per episode and rule (every agent the rule matches in that episode gets the same
    policy; the draw depends only on ``seed``, the episode id and the rule, so runs and
    restarts are reproducible). This is opponent sampling, as RLlib's ``policy_mapping_fn``
    does it with the episode: e.g. ``adversary_*: {adversaries: 0.5, random_adversaries: 0.5}``
    makes the other policies train against a mix of learning and random opponents. In
    evaluation (``evaluation=True``) a weighted rule always picks its first policy.

    With ``alternate_seats``, episode ``k`` gives agent ``possible_agents[i]`` the policy of
    ``possible_agents[(i + k) % n]`` (every policy plays every seat).

    Raises:
        ConfigError: an agent no rule maps, a rule naming an unknown policy, or weights that
            are not positive numbers.
    """

    def __init__(self, patterns: Dict[str, Any], policy_ids: Sequence[str],
                 possible_agents: Sequence[str] = (), seed: int = 0):
        self.policy_ids, self.possible_agents, self.seed = list(policy_ids), list(possible_agents), int(seed)
        # rule -> [(policy id, cumulative probability)]
        self.rules: Dict[str, List[Tuple[str, float]]] = {}
        for pat, target in dict(patterns).items():
            target = _plain(target)
            opts = {str(p): w for p, w in target.items()} if isinstance(target, dict) else {str(target): 1.0}
            if not opts:
                raise ConfigError(f"multiagent.mapping.{pat}: an empty choice; give a policy id or "
                                  "{policy_id: weight, ...}")
            for pid, w in opts.items():
                if pid not in self.policy_ids:
                    key = f"multiagent.mapping.{pat}" + (f".{pid}" if isinstance(target, dict) else "")
                    raise ConfigError(f"{key}={target if not isinstance(target, dict) else w!r}: no policy "
                                      f"{pid!r} (policies: {', '.join(self.policy_ids)})"
                                      f"{did_you_mean(pid, self.policy_ids)}")
                if not (isinstance(w, (int, float)) and w > 0):
                    raise ConfigError(f"multiagent.mapping.{pat}.{pid}={w!r}: a weight must be a positive number")
            total = sum(float(w) for w in opts.values())
            cum = itertools.accumulate(float(w) / total for w in opts.values())
            self.rules[str(pat)] = list(zip(map(str, opts), cum, strict=True))
        self._cache: Dict[str, str] = {}

    def rule(self, agent_id: str) -> str:
        """The mapping rule that applies to ``agent_id`` ("" for the fallbacks)."""
        if agent_id not in self._cache:
            r = agent_id if agent_id in self.rules else next(
                (pat for pat in self.rules if fnmatch.fnmatchcase(agent_id, pat)), None)
            if r is None and not (agent_id in self.policy_ids or (not self.rules and len(self.policy_ids) == 1)):
                pats = ", ".join(f"{k!r}->{[p for p, _ in v]}" for k, v in self.rules.items()) or "none"
                raise ConfigError(f"agent {agent_id!r} is not mapped to a policy: no multiagent.mapping "
                                  f"pattern matches it (patterns: {pats}) and it is not a policy id "
                                  f"(policies: {', '.join(self.policy_ids)})")
            self._cache[agent_id] = r or ""
        return self._cache[agent_id]

    def options(self, agent_id: str) -> List[str]:
        """Every policy ``agent_id`` can be mapped to (the first is the evaluation choice)."""
        r = self.rule(agent_id)
        if r:
            return [p for p, _ in self.rules[r]]
        return [agent_id if agent_id in self.policy_ids else self.policy_ids[0]]

    def base(self, agent_id: str) -> str:
        """``agent_id``'s policy outside any episode draw (a weighted rule's first policy)."""
        return self.options(agent_id)[0]

    def _draw(self, agent_id: str, episode_id: int) -> str:
        r = self.rule(agent_id)
        cum = self.rules.get(r) if r else None
        if not cum or len(cum) == 1:
            return self.base(agent_id)
        u = random.Random(f"{self.seed}/{episode_id}/{r}").random()
        return next((p for p, c in cum if u < c), cum[-1][0])

    def policy_for(self, agent_id: str, episode_index: int = 0, alternate: bool = False,
                   episode_id: Optional[int] = None) -> str:
        """The policy of ``agent_id`` in an episode: seats rotated by ``episode_index`` when
        ``alternate``; weighted rules drawn by ``episode_id`` (None: the first policy)."""
        if alternate and self.possible_agents and agent_id in self.possible_agents:
            seats = self.possible_agents
            agent_id = seats[(seats.index(agent_id) + episode_index) % len(seats)]
        return self.base(agent_id) if episode_id is None else self._draw(agent_id, episode_id)


def build_mapping(config: Any, possible_agents: Sequence[str]) -> AgentMapping:
    """The run's :class:`AgentMapping` from ``multiagent.*`` (weighted draws seeded by ``seed``);
    with a league, its rules start with the league's first matchmaking distribution."""
    m = AgentMapping(league_mapping(config), policy_ids_of(config, possible_agents), possible_agents,
                     seed=int(config.get("seed") or 0))
    if config.multiagent.league.main:
        league = League.from_config(config)
        for r in league.rules:
            m.rules[r] = league.cumulative()
    return m


def policy_ids_of(config: Any, possible_agents: Sequence[str] = ()) -> List[str]:
    """Policy ids: ``multiagent.policies`` keys, then the mapping's other targets (trained by
    ``algo``; a league's snapshot slots among them); when both are empty, ``shared`` (``multiagent.share_parameters``, the default) or
    one policy per agent of ``possible_agents``.

    Raises:
        ConfigError: ``share_parameters=false`` with a mapping or policies (they decide who shares).
    """
    ma = config.multiagent
    targets = (p for v in league_mapping(config).values() for p in (v if isinstance(v, (dict, DictConfig)) else [v]))
    pids = list(dict.fromkeys(map(str, [*(ma.policies or {}), *targets])))
    if not ma.share_parameters:
        if pids:
            raise ConfigError("multiagent.share_parameters=false gives each agent a policy of its own; it does not "
                              "combine with multiagent.policies / multiagent.mapping (they decide which agents share "
                              "a policy): drop one")
        return list(map(str, possible_agents)) or [SHARED_POLICY_ID]
    return pids or [SHARED_POLICY_ID]


def _differing_settings(ck_spec: Any, algo: str, section: Any, model: Any) -> str:
    """The settings of a checkpoint's policy that differ from this run's (``qrdqn.num_quantiles=51
    in the checkpoint, 32 here``): the algorithm section (same algorithm only) and ``model.*``."""
    def plain(x: Any) -> Dict[str, Any]:
        return dataclasses.asdict(x) if dataclasses.is_dataclass(x) and not isinstance(x, type) else dict(_plain(x) or {})
    pairs = [("model", plain(ck_spec.model), plain(model))] if ck_spec.model is not None else []
    if ck_spec.algo == algo:
        pairs.insert(0, (algo, plain(ck_spec.config), plain(section)))
    diffs = [f"{name}.{k}={there[k]!r} in the checkpoint, {here[k]!r} here" for name, there, here in pairs
             for k in there if k in here and there[k] != here[k]]
    return "; ".join(diffs[:4]) + (f"; +{len(diffs) - 4} more" if len(diffs) > 4 else "")


# ---- per-policy algorithm sections --------------------------------------------------------------
def policy_section(config: Any, pid: str, algo_cls: Type[Algorithm], overrides: Any) -> Any:
    """The algorithm section of policy ``pid``: ``<algo>.*`` with
    ``multiagent.policies.<pid>.config.*`` applied.

    Returns:
        the config dataclass instance (None: the algorithm has no config class).
    Raises:
        ConfigError: an unknown, mistyped or out-of-range override, named in full
            (``multiagent.policies.<pid>.config.<key>``), with the closest valid key.
    """
    cls = algo_cls.config_class
    if cls is None:
        return None
    base = OmegaConf.structured(section_object(config, algo_cls.name, cls))
    ov: Dict[str, Any] = dict(_plain(overrides) or {})
    if ov:
        prefix = f"multiagent.policies.{pid}.config."
        try:
            base = merge_overrides(base, ov, cls)
        except ConfigError as e:
            raise ConfigError(str(e).replace("`", "`" + prefix, 1).replace("did you mean `", "did you mean `" + prefix)) from None
        except Exception as e:  # OmegaConf validation
            key = getattr(e, "full_key", "?")
            raise ConfigError(f"`{prefix}{key}`: {str(e).splitlines()[0]}") from None
        check_values(base, cls, prefix)  # the ranges its fields declare (the base section is checked)
    return cls(**_plain(base))


# ---- checkpoints ------------------------------------------------------------------------------
def load_checkpoint_policy(path: str, pid: str, want: Optional[str] = None, key: str = "",
                           algorithms: Optional[Dict[str, Type[Algorithm]]] = None, config: Any = None
                           ) -> Tuple[PolicySpec, Dict[str, Any]]:
    """``(PolicySpec, policy state)`` of one policy stored in a flowkit checkpoint, read as
    plain data (nothing in the file is run); its policy class is that of the registered
    algorithm the checkpoint names (``algorithms``, default: every importable one).

    Picks ``want``, else the policy of the same id ``pid``, else the checkpoint's only policy.
    A callable its spec names (its own ``model.class``) must come from an installed flowkit
    plugin or be named in this run's ``config`` too (a run folder is data).

    Raises:
        ConfigError: no checkpoint at ``path``, a file refused as not plain data, an algorithm
            that is not registered, no such policy in it, or a callable named without consent
            (naming ``key`` and the file).
    """
    from flowkit.checkpoint import (
        STATE_FILE,
        RunFolderError,
        check_spec_callables,
        find_checkpoint,
        load_state,
        spec_from_dict,
    )
    from flowkit.core.names import code_values
    from flowkit.hooks import get_plugin_manager
    try:
        st = load_state(state_path := os.path.join(find_checkpoint(path), STATE_FILE))
        pols = st["policies"]
        pick = want or (pid if pid in pols else (next(iter(pols)) if len(pols) == 1 else None))
        if pick not in pols:
            raise ConfigError(f"{key}={path!r}: the checkpoint holds policies {sorted(pols)}, not "
                              f"{(want or pid)!r}; name one with multiagent.policies.{pid}.checkpoint_policy")
        mine: Any = OmegaConf.to_container(config, resolve=True) if isinstance(config, DictConfig) else config
        check_spec_callables({"policy_specs": {pick: st["policy_specs"][pick]}}, state_path,
                             allowed={v for _, v in code_values(mine if isinstance(mine, dict) else {})})
        algos = get_plugin_manager().algorithms() if algorithms is None else algorithms
        return spec_from_dict(st["policy_specs"][pick], algos, state_path), pols[pick]
    except (FileNotFoundError, RunFolderError) as e:
        raise ConfigError(f"{key}={path!r}: {e}") from None


def check_same_spaces(what: str, spec: Any, obs_space: gym.Space, act_space: gym.Space) -> None:
    if spec.observation_space != obs_space or spec.action_space != act_space:
        raise ConfigError(f"{what}: its policy has spaces obs={spec.observation_space}, "
                          f"actions={spec.action_space}, but the agents it plays have obs={obs_space}, "
                          f"actions={act_space}")


# ---- the hook's work -------------------------------------------------------------------------------
def make_policy_specs(config: Any, env: Any, algorithms: Dict[str, Type[Algorithm]]) -> Dict[str, MAPolicySpec]:
    """``{policy_id: MAPolicySpec}`` for a PettingZoo env (see module docstring)."""
    agents = list(getattr(env, "possible_agents", None) or [])
    if not agents:
        raise ConfigError(f"PettingZoo env {type(env).__name__} declares no possible_agents")
    obs_sp, act_sp = {a: env.observation_space(a) for a in agents}, {a: env.action_space(a) for a in agents}

    def mismatch(ags: List[str]) -> str:  # the first agent whose spaces differ from ags[0]'s, described ("": none)
        a0, a = ags[0], next((a for a in ags[1:] if obs_sp[a] != obs_sp[ags[0]] or act_sp[a] != act_sp[ags[0]]), None)
        return "" if a is None else (f"agent {a0!r} has obs={obs_sp[a0]}, actions={act_sp[a0]} and agent {a!r} has "
                                     f"obs={obs_sp[a]}, actions={act_sp[a]}")
    if config.env.max_episode_steps is not None:
        raise ConfigError(f"env.max_episode_steps={config.env.max_episode_steps}: the TimeLimit wrapper is for "
                          "Gymnasium envs; give a PettingZoo env its own limit through env.kwargs "
                          "(e.g. env.kwargs.max_cycles=25 for MPE)")
    ma = config.multiagent
    _check_league(config)
    mapping = build_mapping(config, agents)
    pids = mapping.policy_ids
    members = policy_members(mapping, agents)
    for pid, ags in members.items():
        if not ags:
            raise ConfigError(f"multiagent.policies.{pid}: no agent is mapped to policy {pid!r} "
                              f"(agents: {', '.join(agents)}; see multiagent.mapping)")
        if m := mismatch(ags):
            raise ConfigError(f"policy {pid!r}: agents mapped to one policy must share their spaces, but {m}; "
                              "map them to different policies")
    if (bool(ma.alternate_seats) or bool(ma.eval_alternate_seats)) and (m := mismatch(agents)):
        raise ConfigError(f"alternate_seats needs every agent to have the same spaces; {m}")
    with_id = agent_id_policies(config, members)
    slots = slot_ids(config)
    specs: Dict[str, MAPolicySpec] = {}
    for pid in pids:
        if pid not in slots:
            o = obs_sp[members[pid][0]]
            specs[pid] = _policy_spec(config, pid, tuple(members[pid]), with_agent_id(o, len(agents))
                                      if pid in with_id else o, act_sp[members[pid][0]], algorithms, (env, mapping))
    main = config.multiagent.league.main
    for pid in slots:  # a league's snapshot slots: frozen copies of the main policy
        specs[pid] = dataclasses.replace(specs[main], agents=tuple(members[pid]), trainable=False, group="",
                                         init_state=None)
    specs = {pid: specs[pid] for pid in pids}
    eval_opponents(config, specs, algorithms)  # (checked: built and dropped)
    assign_teams(config, specs, mapping, agents)
    return specs


def assign_teams(config: Any, specs: Dict[str, MAPolicySpec], mapping: AgentMapping,
                 possible_agents: Sequence[str]) -> None:
    """Give each trained policy of an algorithm whose section has a ``team`` key (``masac``,
    ``matd3``: a critic over every team agent's action; ``vdn``, ``qmix``: a mixer of their Q-values) its team
    (:func:`~flowkit_multiagent.centralized.team_of`) as plain data in its spec's config:
    ``{"agents", "policies" (each agent's), "agent_indexes", "n_agents" (len of possible_agents),
    "obs_dims", "act_dims" (flattened sizes of each agent's policy's spaces)}``."""
    for pid, s in specs.items():
        if not (s.group and hasattr(s.config, "team")):
            continue
        agents = team_of(config, mapping, possible_agents, pid)
        pols = [mapping.base(a) for a in agents]
        team = {"agents": agents, "policies": pols, "agent_indexes": [list(possible_agents).index(a) for a in agents],
                "n_agents": len(possible_agents),
                "obs_dims": [int(gym.spaces.flatdim(specs[p].observation_space)) for p in pols],
                "act_dims": [int(gym.spaces.flatdim(specs[p].action_space)) for p in pols]}
        s.config = dataclasses.replace(s.config, team=team)


def _policy_spec(config: Any, pid: str, agents: Tuple[str, ...], o: gym.Space, act: gym.Space,
                 algorithms: Dict[str, Type[Algorithm]], env_mapping: Tuple[Any, AgentMapping]) -> MAPolicySpec:
    """Policy ``pid``'s spec (played by ``agents``, spaces ``o`` and ``act``): its algorithm,
    section overrides, model and checkpoint weights (:class:`PolicyConfig`) checked; a
    centralized critic's input (a section with ``critic_input``) resolved on the env of
    ``env_mapping`` (:func:`~flowkit_multiagent.centralized.resolve_critic_input`)."""
    pc = (config.multiagent.policies or {}).get(pid) or PolicyConfig()
    algo, ck_path, init_state, ck_spec = pc.algo, pc.checkpoint, None, None
    if ck_path:
        key = f"multiagent.policies.{pid}.checkpoint"
        ck_spec, init_state = load_checkpoint_policy(ck_path, pid, pc.checkpoint_policy, key, algorithms, config)
        check_same_spaces(f"{key}={ck_path!r}", ck_spec, o, act)
        algo = algo or ck_spec.algo
    algo = algo or config.algo
    if algo not in algorithms:
        raise ConfigError(f"multiagent.policies.{pid}.algo={algo!r} is not an installed algorithm "
                          f"({', '.join(sorted(algorithms))}){did_you_mean(algo, algorithms)}")
    cls = algorithms[algo]
    cfg_obj = policy_section(config, pid, cls, pc.config)
    if hasattr(cfg_obj, "critic_input"):
        env, mapping = env_mapping
        ci = resolve_critic_input(config, pid, algo, cfg_obj, env, mapping, mapping.possible_agents)
        cfg_obj = dataclasses.replace(cfg_obj, critic_input=ci.kind, critic_input_dim=ci.dim)
    if pc.config:
        for w in validate_section(algo, config, cfg_obj):
            warnings.warn(f"policy {pid!r}: {w}", stacklevel=3)
    policy_class = ck_spec.policy_class if ck_spec is not None and ck_spec.algo == algo else cls.policy_class
    if policy_class is None:
        raise ConfigError(f"algorithm {algo!r} ({cls.__module__}) declares no policy_class")
    model = policy_model(config, pid, pc.model)
    if init_state is not None:  # the checkpoint's weights must fit this run's network
        try:
            policy_class(o, act, cfg_obj, model if model is not None else config.model, "cpu", 0,
                         inference_only=True).set_weights(init_state["weights"])
        except Exception as e:
            diff = _differing_settings(ck_spec, algo, cfg_obj, model if model is not None else config.model)
            raise ConfigError(f"multiagent.policies.{pid}.checkpoint={ck_path!r}: its weights do not fit this "
                              f"run's network ({diff or 'the settings that shape it must match the run that wrote it'}"
                              f"): {type(e).__name__}: {str(e).splitlines()[0]}") from None
    group = training_group(config, pid, algo)
    return MAPolicySpec(policy_class, o, act, cfg_obj, algo, model, agents=agents,
                        trainable=bool(group), group=group, init_state=init_state)


def _check_league(config: Any) -> None:
    """``multiagent.league.*`` names policies of this run and a seat that some rule maps."""
    lg, ma = config.multiagent.league, config.multiagent
    if not lg.main:
        return
    own = list(dict.fromkeys([*(ma.policies or {}), *(str(t) for t in (ma.mapping or {}).values()
                                                     if not isinstance(t, (dict, DictConfig)))]))
    if lg.main not in own:
        raise ConfigError(f"multiagent.league.main={lg.main!r}: no policy {lg.main!r} in this run "
                          f"(policies: {', '.join(own)}){did_you_mean(lg.main, own)}")
    pc = (ma.policies or {}).get(lg.main)
    if pc is not None and (not pc.trainable or pc.algo == RANDOM):
        raise ConfigError(f"multiagent.league.main={lg.main!r}: the main policy must be trained "
                          f"(it is {'frozen' if not pc.trainable else 'random'})")
    if lg.opponent == lg.main or not any(str(t) == lg.opponent for t in (ma.mapping or {}).values()):
        raise ConfigError(f"multiagent.league.opponent={lg.opponent!r}: no multiagent.mapping rule maps to it "
                          "(the league fills the seat of the policy a rule maps to, e.g. "
                          f"multiagent.mapping.player_1={lg.opponent}; it must not be the main policy)")


def eval_opponents(config: Any, policies: Mapping[str, Any], algorithms: Dict[str, Type[Algorithm]],
                   seed: int = 0) -> Dict[str, Any]:
    """The fixed policies that replace those named in ``multiagent.eval_opponents`` in
    evaluation: ``random``, or a checkpoint's policy whose algorithm is in ``algorithms``, each
    with the spaces of the run's policy it replaces (``policies``: the run's specs or policies).
    Built at set-up to check them, and once by each rollout worker.

    Raises:
        ConfigError: no such policy in this run, a checkpoint that cannot be read, or spaces that
            differ (naming the key).
    """
    from flowkit.core import RandomPolicy
    out: Dict[str, Any] = {}
    for pid, what in (config.multiagent.eval_opponents or {}).items():
        key, spec = f"multiagent.eval_opponents.{pid}", policies.get(pid)
        if spec is None:
            raise ConfigError(f"{key}: no policy {pid!r} in this run (policies: {', '.join(policies)})"
                              f"{did_you_mean(pid, policies, 'multiagent.eval_opponents.')}")
        if str(what) == RANDOM:
            out[pid] = RandomPolicy(spec.observation_space, spec.action_space, None, config.model, "cpu", seed,
                                    inference_only=True)
            continue
        ck, state = load_checkpoint_policy(str(what), pid, None, key, algorithms, config)
        check_same_spaces(f"{key}={what!r}", ck, spec.observation_space, spec.action_space)
        out[pid] = ck.policy_class(ck.observation_space, ck.action_space, ck.config, ck.model_config(config), "cpu",
                                   seed, inference_only=True)
        out[pid].set_weights(state["weights"])
    return out
