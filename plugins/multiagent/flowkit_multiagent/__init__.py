"""flowkit-multiagent: PettingZoo Parallel and AEC games, agents mapped to policies by glob
patterns, and a different algorithm per policy in one run (entry point group ``flowkit``).

Hooks: ``flowkit_add_config_sections`` (``multiagent.*``), ``flowkit_make_policy_specs``
(spaces inferred per policy), ``flowkit_make_env_runner`` (Parallel / AEC runners) and
``flowkit_build_plan`` (the mixing plan). Each returns None for runs that are not
multi-agent, so single-agent Gymnasium runs keep the core's fast path.
"""
import flowkit
from flowkit_multiagent.config import MultiAgentConfig, PolicyConfig
from flowkit_multiagent.plan import SelectPolicies, build_plan, training_groups
from flowkit_multiagent.runners import AECEnvRunner, ParallelEnvRunner, runner_for
from flowkit_multiagent.specs import SHARED_POLICY_ID, AgentMapping, MAPolicySpec, is_pettingzoo, make_policy_specs

__all__ = ["AECEnvRunner", "AgentMapping", "MAPolicySpec", "MultiAgentConfig", "ParallelEnvRunner",
           "PolicyConfig", "SHARED_POLICY_ID", "SelectPolicies", "build_plan", "make_policy_specs", "training_groups"]


@flowkit.hookimpl
def flowkit_add_config_sections():
    return {"multiagent": MultiAgentConfig}


@flowkit.hookimpl
def flowkit_make_policy_specs(config, env, algorithms):
    """Runs on: driver. None unless ``env`` is a PettingZoo env."""
    return make_policy_specs(config, env, algorithms) if is_pettingzoo(env) else None


@flowkit.hookimpl
def flowkit_make_env_runner(env, context, config, policies):
    """Runs on: worker. None unless ``env`` is a PettingZoo env."""
    return runner_for(env) if is_pettingzoo(env) else None


@flowkit.hookimpl
def flowkit_build_plan(ctx):
    """Runs on: driver. None unless the policies come from this plugin."""
    return build_plan(ctx)
