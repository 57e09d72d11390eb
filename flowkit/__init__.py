"""flowkit: reinforcement learning as dataflow, on Ray.

Quick use::

    import flowkit
    result = flowkit.train(["algo=ppo", "env=CartPole-v1", "stop.env_steps=100000"])
    algo = flowkit.Algorithm.from_checkpoint(result.run_dir)
    action = algo.compute_actions(obs, explore=False)
"""
from flowkit.config import ConfigError  # noqa: I001 - wrapped by hand (ruff: one name per line)
from flowkit.core import (NOT_READY, ActorCriticPolicy, Algorithm, DEFAULT_POLICY_ID, EnvContext, EnvError, Episode,
                          Flow, FlowContext, MultiAgentBatch, ParallelFlow, Policy, PolicySpec, SampleBatch)
from flowkit.engine import Result, RunContext, describe_plan, load_config, train
from flowkit.hooks import PluginError, get_plugin_manager, hookimpl, register, unregister

__version__ = "0.1.0"

__all__ = ["ActorCriticPolicy", "Algorithm", "ConfigError", "DEFAULT_POLICY_ID", "EnvContext", "EnvError", "Episode", "Flow",
           "FlowContext", "MultiAgentBatch", "NOT_READY", "ParallelFlow", "PluginError", "Policy",
           "PolicySpec", "Result", "RunContext", "SampleBatch", "describe_plan", "get_plugin_manager",
           "hookimpl", "load_config", "register", "train", "unregister", "__version__"]
