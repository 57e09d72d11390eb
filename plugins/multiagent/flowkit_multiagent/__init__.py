"""flowkit-multiagent: PettingZoo Parallel and AEC games, agents mapped to policies by glob
patterns, and a different algorithm per policy in one run (entry point group ``flowkit``).

Algorithms: ``mappo`` (:mod:`flowkit_multiagent.mappo`: PPO with a centralized critic), ``masac``
and ``matd3`` (:mod:`flowkit_multiagent.centralized_critics`: continuous centralized critics), ``vdn``
and ``qmix`` (:mod:`flowkit_multiagent.qmix`: value decomposition for a team).

Hooks: ``flowkit_add_algorithms``, ``flowkit_add_config_sections`` (``multiagent.*``), ``flowkit_make_policy_specs``
(spaces inferred per policy), ``flowkit_make_env_runner`` (Parallel / AEC runners, and the
batched VMAS runner: :mod:`flowkit_multiagent.vmas`) and
``flowkit_build_plan`` (the mixing plan). Each returns None for runs that are not
multi-agent, so single-agent Gymnasium runs keep the core's fast path.
"""
import flowkit
from flowkit_multiagent.config import (
    MAPPO_REF,
    MASAC_REF,
    MATD3_REF,
    QMIX_REF,
    VDN_REF,
    MultiAgentConfig,
)


@flowkit.hookimpl
def flowkit_add_algorithms():
    """MAPPO, MASAC and MATD3 (centralized critics), and value decomposition for teams: ``vdn`` and ``qmix``."""
    return [MAPPO_REF, MASAC_REF, MATD3_REF, VDN_REF, QMIX_REF]


@flowkit.hookimpl
def flowkit_add_config_sections():
    return {"multiagent": MultiAgentConfig}


@flowkit.hookimpl
def flowkit_make_policy_specs(config, env, algorithms):
    """Runs on: driver. None unless ``env`` is a PettingZoo env.

    Raises:
        ConfigError: ``multiagent.mapping`` set for an env that is not a PettingZoo game (no
            agents to map: it would be ignored).
    """
    from flowkit_multiagent.specs import is_pettingzoo, make_policy_specs
    if is_pettingzoo(env):
        from flowkit_multiagent.vmas import VmasEnv, check_mapping
        if isinstance(env, VmasEnv):
            check_mapping(config)
        return make_policy_specs(config, env, algorithms)
    if config.get("multiagent") is not None and config.multiagent.get("mapping"):
        from flowkit.config import ConfigError
        from flowkit.core import env_name
        raise ConfigError(f"multiagent.mapping: env {env_name(config.env)!r} is a single-agent env, "
                          "not a PettingZoo game: it has no agents to map to policies")
    return None


@flowkit.hookimpl
def flowkit_make_env_runner(env, context, config, policies):
    """PettingZoo Parallel and AEC envs, VMAS's batched one (runs on: worker; None for any other env)."""
    from flowkit_multiagent.specs import is_pettingzoo
    if not is_pettingzoo(env):  # (before the runners and VMAS load: single-agent workers start without them)
        return None
    from flowkit_multiagent.runners import runner_for
    from flowkit_multiagent.vmas import VmasEnv, VmasRunner
    return VmasRunner if isinstance(env, VmasEnv) else runner_for(env)


@flowkit.hookimpl
def flowkit_build_plan(ctx):
    """Runs on: driver. None unless the policies come from this plugin."""
    from flowkit_multiagent.plan import build_plan
    return build_plan(ctx)


@flowkit.hookimpl
def flowkit_on_run_start(ctx, run_dir, history):
    """Runs on: driver. A league's matchmaking (restored on resume) to the rollout workers."""
    from flowkit_multiagent.league import STATEFUL_NAME
    league = ctx.stateful.get(STATEFUL_NAME)
    if league is not None:
        league.push(ctx.workers)


@flowkit.hookimpl
def flowkit_on_train_result(result, ctx):
    """Runs on: driver. A league's iteration: a snapshot of the main policy every
    ``multiagent.league.snapshot_interval`` iterations (its weights to the slot's policy on the
    driver and the workers), the new matchmaking to the workers, its ``league/*`` columns."""
    from flowkit_multiagent.league import STATEFUL_NAME
    league = ctx.stateful.get(STATEFUL_NAME)
    if league is None:
        return
    it = int(result["iteration"])
    if it % int(ctx.config.multiagent.league.snapshot_interval) == 0:
        slot = league.add_snapshot(it)
        w = ctx.get_weights([league.main])[league.main]
        ctx.policies[slot].set_weights(w)
        ctx.workers.sync_weights({slot: w})
    league.push(ctx.workers)
    result.update(league.columns())


# env constructors this plugin vouches for in a run folder's config (flowkit._trust): PettingZoo's
# and MPE2's games, `module:attr` in full
FLOWKIT_TRUSTED_CALLABLES = (r"pettingzoo\.(atari|butterfly|classic|mpe|sisl)\.[a-z0-9_]+_v\d+:(env|parallel_env|raw_env)",
                             r"mpe2\.[a-z0-9_]+_v\d+:(env|parallel_env|raw_env)")
