"""The mixing plan: one dataflow fragment per algorithm over the rollouts (RLlib Flow,
Liang et al. 2021, sec. 5.3, multi-agent composition)::

    streams = {mode: ParallelRollouts(ctx.workers, mode)        # one per rollout mode in the run
               for mode in modes of the groups}                 # (bulk_sync, async, ...)
    branches = streams[mode].duplicate(groups of that mode)     # bounded buffers
    flows = [algorithm_flow(g.algorithm, b.for_each(SelectExperiences(g.policy_ids)), ctx,
                            ctx.add_learner(g.name, g.policy_ids))   # a Learner per group
             for g, b in zip(groups, branches)]
    Concurrently(flows, mode="round_robin", round_robin_weights=..., cursor=...)

Each algorithm pulls the stream of its own rollout mode: PPO and DQN groups share one
bulk-synchronous stream, an IMPALA or APPO group pulls an async one (its weights go back to the
worker that sampled each fragment) from the same rollout workers. In a run that mixes modes, a
fragment sampled for one stream also holds the other groups' rows (every agent acts in it):
only the policies of that stream's groups learn from it, so each mode learns from its own
share of the env steps.

An iteration of a mixed run is at least one sampling round (``run.min_iter_env_steps`` raised to
it): one row per round of the plan, not one per train step of the fastest fragment.
The cursor (where the cycle stands) is checkpointed as ``mixing/round_robin_cycle``: an
iteration ends inside one group's turn, and a resumed run goes on from there. A group is the
trained policies of one algorithm (a policy with its own config overrides is a group of its
own, with its own Algorithm instance, and its own Learner named after the group, which
prefixes its stateful parts: two DQN groups keep separate replay buffers). Frozen and random
policies act in the rollouts but belong to no group.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional

from flowkit.config import ConfigError, did_you_mean, round_env_steps
from flowkit.core.context import RunContext
from flowkit.core.flow import Flow, RoundRobinCursor
from flowkit.core.ops import Concurrently, NoTraining, ParallelRollouts, SelectExperiences, algorithm_flow
from flowkit_multiagent.league import STATEFUL_NAME, League
from flowkit_multiagent.specs import MAPolicySpec


def training_groups(specs: Dict[str, MAPolicySpec]) -> Dict[str, List[str]]:
    """``{group name: [policy ids]}`` of the trained policies, in policy order."""
    groups: Dict[str, List[str]] = {}
    for pid, s in specs.items():
        if s.trainable and s.group:
            groups.setdefault(s.group, []).append(pid)
    return groups


def build_plan(ctx: RunContext) -> Optional[Flow]:
    """The mixing plan of a multi-agent run, or None for other runs.

    Raises:
        ConfigError: a ``multiagent.round_robin_weights`` key naming no algorithm or policy.
    """
    specs = {pid: s for pid, s in ctx.policy_specs.items() if isinstance(s, MAPolicySpec)}
    if not specs:  # not a multi-agent run (the plugin makes every spec of one that is)
        return None
    for pid, s in specs.items():
        if s.init_state is not None:
            ctx.policies[pid].set_weights(s.init_state["weights"])
    groups = training_groups(specs)
    algos: Dict[str, Any] = {}
    for g, pids in groups.items():
        s = specs[pids[0]]
        if g == s.algo:
            algos[g] = ctx.algorithms[s.algo]
        else:  # a policy with its own config overrides: its own Algorithm instance
            cls = type(ctx.algorithms[s.algo])
            algos[g] = ctx.add_stateful(f"multiagent/{g}", cls(ctx.config, config=s.config))
    league = ctx.add_stateful(STATEFUL_NAME, League.from_config(ctx.config)) if ctx.config.multiagent.league.main \
        else None
    modes = {g: a.get_rollout_mode() for g, a in algos.items()} or {"": "bulk_sync"}
    streams = {m: _rollouts(ctx, m, league) for m in dict.fromkeys(modes.values())}
    if not groups:
        return streams["bulk_sync"].for_each(NoTraining())
    weights = _weights(ctx.config, groups, specs)
    # each rollout mode's stream is shared by the groups of that mode (bounded duplicates)
    shares = {m: iter([st] if (n := list(modes.values()).count(m)) == 1 else st.duplicate(n)) for m, st in streams.items()}
    flows = [algorithm_flow(algos[g], next(shares[modes[g]]).for_each(SelectExperiences(pids)), ctx,
                            ctx.add_learner(g, pids)) for g, pids in groups.items()]
    if len(flows) == 1:
        return flows[0]
    # an iteration (a metrics.csv row) is at least one round of the plan, a sampling round and every
    # fragment's training on it, as RLlib's training step: not a row per DQN gradient step
    run = ctx.config.run
    run.min_iter_env_steps = max(int(run.min_iter_env_steps), round_env_steps(ctx.config))
    cursor = ctx.add_stateful("mixing/round_robin_cycle", RoundRobinCursor(len(flows)))
    return Concurrently(flows, mode="round_robin", round_robin_weights=weights, cursor=cursor)


def _rollouts(ctx: RunContext, mode: str, league: Optional[League]) -> Flow:
    """The rollouts of ``mode`` (async ones with their source actor), through the league's
    recorder when there is one."""
    rollouts = ParallelRollouts(ctx, mode=mode, prefetch=ctx.prefetch)
    if league is not None:  # the league records the games of every sampled batch
        rollouts = rollouts.for_each(league)
    return rollouts if mode == "bulk_sync" else rollouts.zip_with_source_actor()  # async, async_gradients


def _weights(config: Any, groups: Dict[str, List[str]], specs: Dict[str, MAPolicySpec]) -> List[float]:
    rr = {str(k): float(v) for k, v in (config.multiagent.round_robin_weights or {}).items()}
    trained = [p for ps in groups.values() for p in ps]
    known = set(groups) | {specs[p].algo for p in trained} | set(trained)
    for k in rr:
        if k not in known:
            raise ConfigError(f"multiagent.round_robin_weights.{k}: no trained algorithm or policy {k!r} "
                              f"(known: {', '.join(sorted(known))}){did_you_mean(k, sorted(known))}")
    return [rr[g] if g in rr else next((rr[p] for p in pids if p in rr), rr.get(specs[pids[0]].algo, 1.0))
            for g, pids in groups.items()]
