"""Built-in plugin: the ``random`` algorithm, the Gymnasium env runner, the default policy
specs and the default one-algorithm plan (all ``trylast`` so plugins can take over)."""
from __future__ import annotations

from dataclasses import dataclass

import gymnasium as gym

from flowkit.config import ConfigError, F, section_object
from flowkit.core import GymEnvRunner, PolicySpec, RandomPolicy, env_name
from flowkit.core import batch as sb
from flowkit.core.algorithm import Algorithm
from flowkit.core.context import RunContext
from flowkit.core.flow import Flow
from flowkit.core.learner import Learner
from flowkit.core.ops import NoTraining, ParallelRollouts
from flowkit.hooks.manager import hookimpl


@dataclass
class RandomConfig:
    """random: uniform over the legal actions, learns nothing (baselines, opponents)."""
    report_every_env_steps: int = F(1000, "env steps per reported iteration", ge=1)


class RandomAlgorithm(Algorithm):
    """Non-learning baseline: acts uniformly over legal actions."""
    name = "random"
    config_class = RandomConfig
    policy_class = RandomPolicy
    off_policy = True

    def training_flow(self, experiences: Flow, ctx: RunContext, learner: Learner) -> Flow:
        return experiences.for_each(NoTraining())


@hookimpl
def flowkit_add_algorithms():
    return [RandomAlgorithm]


@hookimpl(trylast=True)
def flowkit_make_env_runner(env, context, config, policies):
    return GymEnvRunner if isinstance(env, gym.Env) else None


@hookimpl(trylast=True)
def flowkit_make_policy_specs(config, env, algorithms):
    """One policy (``default``) trained by ``algo`` for a Gymnasium env."""
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
    algo = ctx.algorithms[ctx.config.algo]
    mode = algo.get_rollout_mode()
    experiences = ParallelRollouts(ctx, mode=mode, prefetch=ctx.prefetch)
    if mode == "async":
        experiences = experiences.zip_with_source_actor()
    return algo.training_flow(experiences, ctx, ctx.add_learner(algo.name, ctx.policy_ids))
