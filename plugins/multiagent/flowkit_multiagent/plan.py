"""The mixing plan: one dataflow fragment per algorithm over the same rollouts (RLlib Flow,
Liang et al. 2021, sec. 5.3, multi-agent composition)::

    rollouts = ParallelRollouts(ctx.workers, mode)              # shared by every algorithm
    branches = rollouts.duplicate(len(groups))                  # bounded buffers
    flows = [algorithm_flow(g.algorithm, b.for_each(SelectExperiences(g.policy_ids)), ctx,
                            ctx.add_learner(g.name, g.policy_ids))   # a Learner per group
             for g, b in zip(groups, branches)]
    Concurrently(flows, mode="round_robin", round_robin_weights=..., cursor=...)

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
        ConfigError: a ``multiagent.round_robin_weights`` key naming no algorithm or policy
            (rollout modes that cannot share one stream are refused earlier, by
            :func:`~flowkit_multiagent.specs.make_policy_specs`).
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
    # one rollout mode for all: make_policy_specs refused a mix
    mode = next((a.get_rollout_mode() for a in algos.values()), "bulk_sync")
    rollouts = ParallelRollouts(ctx, mode=mode, prefetch=ctx.prefetch)
    if mode != "bulk_sync":  # async, async_gradients
        rollouts = rollouts.zip_with_source_actor()
    if not groups:
        return rollouts.for_each(NoTraining())
    weights = _weights(ctx.config, groups, specs)
    branches = [rollouts] if len(groups) == 1 else rollouts.duplicate(len(groups))
    flows = [algorithm_flow(algos[g], b.for_each(SelectExperiences(pids)), ctx, ctx.add_learner(g, pids))
             for (g, pids), b in zip(groups.items(), branches, strict=True)]
    if len(flows) == 1:
        return flows[0]
    # an iteration (a metrics.csv row) is at least one round of the plan, a sampling round and every
    # fragment's training on it, as RLlib's training step: not a row per DQN gradient step
    run = ctx.config.run
    run.min_iter_env_steps = max(int(run.min_iter_env_steps), round_env_steps(ctx.config))
    cursor = ctx.add_stateful("mixing/round_robin_cycle", RoundRobinCursor(len(flows)))
    return Concurrently(flows, mode="round_robin", round_robin_weights=weights, cursor=cursor)


def _weights(config: Any, groups: Dict[str, List[str]], specs: Dict[str, MAPolicySpec]) -> List[float]:
    rr = {str(k): float(v) for k, v in (config.multiagent.round_robin_weights or {}).items()}
    trained = [p for ps in groups.values() for p in ps]
    known = set(groups) | {specs[p].algo for p in trained} | set(trained)
    for k, v in rr.items():
        if k not in known:
            raise ConfigError(f"multiagent.round_robin_weights.{k}: no trained algorithm or policy {k!r} "
                              f"(known: {', '.join(sorted(known))}){did_you_mean(k, sorted(known))}")
        if v <= 0:
            raise ConfigError(f"multiagent.round_robin_weights.{k}={v} must be > 0")
    return [rr[g] if g in rr else next((rr[p] for p in pids if p in rr), rr.get(specs[pids[0]].algo, 1.0))
            for g, pids in groups.items()]
