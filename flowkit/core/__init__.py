"""The core: batches, the dataflow substrate, workers, policies and the shared math.

The names in ``__all__`` are the public API that plugins and users build on, as are the public
modules (each with its ``__all__``): ``encoders`` (observations by space), ``distributions``
(actions by space), ``models`` (MLPs, CNNs, the actor-critic), ``recurrent`` (LSTM/GRU and the
sequence forward), ``returns`` (GAE, V-trace), ``target_network``, ``batch``, ``flow``, ``ops``
and ``replay`` (the operators), ``learner``, ``policy``, ``workers``, ``algorithm``, ``context``.
The ``_name`` modules are private (their layout may change).
"""
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from flowkit.core import batch  # noqa: I001 - wrapped by hand, two lines instead of ruff's one name per line
    from flowkit.core._actor_critic import ActorCriticPolicy, adapt_kl_coeff, clipped_surrogate, standardized
    from flowkit.core.distributions import ActionDist
    from flowkit.core.encoders import MASK_KEY, ObsEncoder, SpaceError, add_batch_axis, batch_len
    from flowkit.core._envs import (EnvContext, EnvError, SpaceCheck, TaskSettableEnv, derive_seed, describe_value,
                                    env_name, find_mismatch, make_env, task_env)
    from flowkit.core.models import (ActorCritic, FramesCNN, ImpalaCNN, RunningMeanStd, SmallCNN, TwinMLP, build_mlp,
                                      build_trunk, init_weights, sde_std)
    from flowkit.core._numpy_model import (Acting, NumpyActorCriticPolicy, NumpyNet, NumpyPolicy, input_steps, layer_steps,
                                           mlp_forward, sample_logp_numpy)
    from flowkit.core.recurrent import RecurrentActorCritic, RecurrentStep, RecurrentTrunk, forward_sequences
    from flowkit.core.returns import bootstrap_rows, compute_gae, next_values, vtrace
    from flowkit.core._runner import Episode, GymEnvRunner, RecurrentStates, run_episodes, stack_rows
    from flowkit.core.target_network import TargetNetwork
    from flowkit.core.algorithm import Algorithm, AlgorithmRef
    from flowkit.core.batch import DEFAULT_POLICY_ID, MultiAgentBatch, SampleBatch, trajectory_ends
    from flowkit.core.flow import NOT_READY, Flow, FlowContext, ParallelFlow, Sourced
    from flowkit.core.policy import ObsNormPolicy, Policy, RandomPolicy, loss_stats, to_tensor
    from flowkit.core.workers import PolicySpec, RolloutWorker, WorkerSet

__all__ = [  # batches (column names: flowkit.core.batch.OBS, ...), dataflow, policies, envs and workers
    "batch", "DEFAULT_POLICY_ID", "MultiAgentBatch", "SampleBatch", "trajectory_ends", "Flow", "FlowContext",
    "NOT_READY", "ParallelFlow", "Sourced", "Algorithm", "AlgorithmRef", "ObsNormPolicy", "Policy", "RandomPolicy", "loss_stats", "ActorCriticPolicy", "adapt_kl_coeff", "clipped_surrogate", "standardized", "to_tensor", "MASK_KEY",
    "ObsEncoder", "SpaceError", "add_batch_axis", "batch_len", "ActionDist", "ACTIVATIONS", "ActorCritic",
    "RunningMeanStd", "FramesCNN", "ImpalaCNN", "SmallCNN", "TwinMLP", "build_mlp", "build_trunk", "init_weights", "sde_std", "NumpyNet", "NumpyPolicy", "NumpyActorCriticPolicy", "mlp_forward",
    "sample_logp_numpy", "Acting", "input_steps", "layer_steps", "bootstrap_rows", "compute_gae", "next_values", "vtrace", "EnvContext", "EnvError", "Episode", "GymEnvRunner", "run_episodes", "stack_rows",
    "RecurrentActorCritic", "RecurrentStates", "RecurrentStep", "RecurrentTrunk", "forward_sequences",
    "PolicySpec", "TargetNetwork", "RolloutWorker", "SpaceCheck", "WorkerSet", "derive_seed", "describe_value", "env_name",
    "find_mismatch", "make_env", "TaskSettableEnv", "task_env"]

_MODULES = {  # the module behind each name, imported on first use (torch only when needed)
    "_actor_critic": "ActorCriticPolicy adapt_kl_coeff clipped_surrogate standardized", "distributions": "ActionDist",
    "encoders": "MASK_KEY ObsEncoder SpaceError add_batch_axis batch_len",
    "_envs": "EnvContext EnvError SpaceCheck TaskSettableEnv derive_seed describe_value env_name find_mismatch make_env "
             "task_env",
    "models": "ActorCritic FramesCNN ImpalaCNN RunningMeanStd SmallCNN TwinMLP build_mlp build_trunk init_weights sde_std",
    "_numpy_model": "Acting NumpyActorCriticPolicy NumpyNet NumpyPolicy input_steps layer_steps mlp_forward sample_logp_numpy",
    "returns": "bootstrap_rows compute_gae next_values vtrace", "activations": "ACTIVATIONS",
    "_runner": "Episode GymEnvRunner RecurrentStates run_episodes stack_rows",
    "recurrent": "RecurrentActorCritic RecurrentStep RecurrentTrunk forward_sequences",
    "target_network": "TargetNetwork",
    "algorithm": "Algorithm AlgorithmRef", "batch": "DEFAULT_POLICY_ID MultiAgentBatch SampleBatch trajectory_ends",
    "flow": "NOT_READY Flow FlowContext ParallelFlow Sourced", "policy": "ObsNormPolicy Policy RandomPolicy loss_stats to_tensor",
    "workers": "PolicySpec RolloutWorker WorkerSet"}
_HOME = {n: m for m, names in _MODULES.items() for n in names.split()}


def _check_top_package() -> None:
    """Fail now, naming the folder, where ``import flowkit`` in this process found a folder
    without ``__init__.py`` (a namespace package) while this module came from the installed
    package: a Ray worker whose import path starts with a current folder that holds a folder
    named ``flowkit`` (the parent folder of a clone) would otherwise fail later, in a plugin,
    with "module 'flowkit' has no attribute 'hookimpl'".

    Raises:
        ImportError: naming the folder found and the package in use.
    """
    import os
    import sys
    top = sys.modules.get("flowkit")
    if top is not None and getattr(top, "__file__", None) is None:
        found = ", ".join(dict.fromkeys(os.path.abspath(str(p)) for p in getattr(top, "__path__", []))) or "?"
        pkg = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        raise ImportError(f"`import flowkit` in this process (pid {os.getpid()}) found the folder {found} (no "
                          f"__init__.py: on the import path through the current folder {os.getcwd()}?), not the "
                          f"flowkit package {pkg}: start from another folder, or rename that folder")


_check_top_package()


def __getattr__(name: str) -> Any:
    """``import flowkit.core`` (the config, the CLI, plugin metadata) imports neither torch nor Ray."""
    import importlib
    if name in _HOME or name == "batch":
        mod = importlib.import_module("flowkit.core." + _HOME.get(name, name))
        return getattr(mod, name) if name in _HOME else mod
    raise AttributeError(f"module 'flowkit.core' has no attribute {name!r}")
