"""flowkit: reinforcement learning as dataflow, on Ray.

Quick use::

    import flowkit
    result = flowkit.train(["algo=ppo", "env=CartPole-v1", "stop.env_steps=100000"])
    algo = flowkit.Algorithm.from_checkpoint(result.run_dir)
    action = algo.compute_actions(obs, explore=False)
"""
import os as _os
import signal as _signal
import sys as _sys
from typing import TYPE_CHECKING, Any


def _exit_on_signal(signum: int, frame: object) -> None:
    """The handler while the ``flowkit`` command imports (nothing started yet): one line and 128
    + the signal number, not a KeyboardInterrupt traceback or the default action (a silent -15)."""
    _os.write(2, f"flowkit: stopped: interrupted ({_signal.Signals(signum).name}) while starting\n".encode())
    _os._exit(128 + signum)


# first thing when the program is the `flowkit` command (its script, `python -m flowkit` or `python -m
# flowkit.cli`: each imports this package before flowkit.cli, numpy and torch), never for a library user;
# signals inherited as ignored (nohup) stay so. (sys.argv[0] is "-m" while -m imports its module.)
_argv = getattr(_sys, "orig_argv", [])
if _os.path.basename(getattr(_sys.modules.get("__main__"), "__file__", None) or "") == "flowkit" or (
        _sys.argv[:1] == ["-m"] and "-m" in _argv and _argv[_argv.index("-m") + 1:][:1] in (["flowkit"], ["flowkit.cli"])):
    for _sig in (_signal.SIGINT, _signal.SIGTERM, _signal.SIGHUP):
        if _signal.getsignal(_sig) != _signal.SIG_IGN:
            _signal.signal(_sig, _exit_on_signal)

from flowkit.core.algorithm import Algorithm as _Algorithm  # noqa: E402

if TYPE_CHECKING:
    from flowkit.config import ConfigError  # noqa: I001 - wrapped by hand, as in flowkit/core/__init__.py
    from flowkit.core import (DEFAULT_POLICY_ID, NOT_READY, ActorCriticPolicy, Algorithm, EnvContext,
                              EnvError, Episode, Flow, FlowContext, MultiAgentBatch, ParallelFlow, Policy,
                              PolicySpec, SampleBatch)
    from flowkit.core.context import RunContext
    from flowkit.core.learner import Learner, NonFiniteError
    from flowkit.core.metrics import Result
    from flowkit.core.presets import EnvPreset
    from flowkit.engine import describe_plan, load_config, train
    from flowkit.hooks import AlgorithmRef, PluginError, get_plugin_manager, hookimpl, register, unregister

__version__ = "0.1.0"

__all__ = ["ActorCriticPolicy", "Algorithm", "AlgorithmRef", "ConfigError", "DEFAULT_POLICY_ID", "EnvContext", "EnvError",
           "EnvPreset", "Episode", "Flow",
           "FlowContext", "Learner", "MultiAgentBatch", "NonFiniteError", "NOT_READY", "ParallelFlow", "PluginError", "Policy",
           "PolicySpec", "Result", "RunContext", "SampleBatch", "describe_plan", "get_plugin_manager",
           "hookimpl", "load_config", "register", "train", "unregister", "__version__"]

_HOME = {"ConfigError": "config", "EnvPreset": "core.presets", "Result": "core.metrics", "RunContext": "core.context", "Learner": "core.learner", "NonFiniteError": "core.learner",
         "describe_plan": "engine",
         "load_config": "engine", "train": "engine", "PluginError": "hooks", "AlgorithmRef": "hooks", "get_plugin_manager": "hooks",
         "hookimpl": "hooks", "register": "hooks", "unregister": "hooks"}


def _from_checkpoint(cls: type, path: str, trust_config: bool = False) -> Any:
    """``Algorithm.from_checkpoint(path)``: rebuild a trained algorithm (policies with their
    weights) from a checkpoint folder, a run folder (its latest checkpoint) or a ``state.pt``
    file (:func:`flowkit.checkpoint.load_trained`). Starts no worker. ``trust_config``: allow
    the callables its config names that no installed flowkit plugin provides (a run folder is
    data; see :mod:`flowkit._trust`).

    Raises:
        FileNotFoundError: no checkpoint at ``path``.
        RunFolderError: unreadable, or an algorithm it needs is not registered.
        ConfigError: its config names such a callable and ``trust_config`` is false.
    """
    from flowkit.checkpoint import load_trained
    return load_trained(path, cls if cls is not _Algorithm else None, trust_config)


_Algorithm.from_checkpoint = classmethod(_from_checkpoint)  # type: ignore[assignment]


def __getattr__(name: str) -> Any:
    """The public API, imported on first use: ``import flowkit`` (and the CLI's start, which
    takes the signals first) does not wait for torch and Ray."""
    import importlib
    if name in __all__:
        return getattr(importlib.import_module("flowkit." + _HOME.get(name, "core")), name)
    try:
        return importlib.import_module(f"flowkit.{name}")
    except ModuleNotFoundError as e:
        if e.name != f"flowkit.{name}":
            raise
        raise AttributeError(f"module 'flowkit' has no attribute {name!r}") from None


_RAY_WORKER = _sys.modules.get("ray._private.worker")
if _RAY_WORKER is not None and getattr(_RAY_WORKER.global_worker, "mode", None) == _RAY_WORKER.WORKER_MODE:
    from flowkit._ray import lean_serializers  # a Ray worker loading flowkit (a rollout worker), before
    lean_serializers()  # its first deserialization: no pydantic, starlette and pyarrow imports (see there)
