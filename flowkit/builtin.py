"""Built-in plugin: the ``random`` algorithm, the Gymnasium env runner, the default policy
specs and the default one-algorithm plan (all ``trylast`` so plugins can take over)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from flowkit.config import RANDOM_NORMALIZE_OBS, ConfigError, RandomConfig, section_object
from flowkit.hooks.manager import AlgorithmRef, hookimpl

if TYPE_CHECKING:  # the rest imports torch: only where a hook runs
    from flowkit.core.context import RunContext
    from flowkit.core.flow import Flow


@hookimpl
def flowkit_add_algorithms():
    return [AlgorithmRef("random", RandomConfig, "flowkit.core.ops:RandomAlgorithm",
                         normalize_obs_refusal=RANDOM_NORMALIZE_OBS)]


@hookimpl(trylast=True)
def flowkit_make_env_runner(env, context, config, policies):
    """Gymnasium envs, vectorised (GymEnvRunner; runs on: worker)."""
    import gymnasium as gym

    from flowkit.core import GymEnvRunner
    return GymEnvRunner if isinstance(env, gym.Env) else None


@hookimpl(trylast=True)
def flowkit_make_policy_specs(config, env, algorithms):
    """One policy (``default``) trained by ``algo`` for a Gymnasium env."""
    import gymnasium as gym

    from flowkit.core import PolicySpec, env_name
    from flowkit.core import batch as sb
    if not isinstance(env, gym.Env):
        return None
    if not all(isinstance(getattr(env, a, None), gym.Space) for a in ("observation_space", "action_space")):
        raise ConfigError(f"env {env_name(config.env)!r} has no observation_space and action_space "
                          "(gymnasium.spaces objects): set both in its constructor")
    algo_cls = algorithms[config.algo]
    sec = section_object(config, algo_cls.name, algo_cls.config_class) if algo_cls.config_class else None
    return {sb.DEFAULT_POLICY_ID: PolicySpec(algo_cls.policy_class, env.observation_space,
                                             env.action_space, sec, algo_cls.name)}


@hookimpl(trylast=True)
def flowkit_build_plan(ctx: RunContext) -> Flow:
    """The one algorithm of ``algo`` over all policies, with one Learner (named after it)."""
    from flowkit.core.ops import ParallelRollouts, algorithm_flow
    algo = ctx.algorithms[ctx.config.algo]
    mode = algo.get_rollout_mode()
    experiences = ParallelRollouts(ctx, mode=mode, prefetch=ctx.prefetch) if algo.consumes_rollouts else None
    if experiences is not None and mode != "bulk_sync":  # async, async_gradients
        experiences = experiences.zip_with_source_actor()
    return algorithm_flow(algo, experiences, ctx, ctx.add_learner(algo.name, ctx.policy_ids))
