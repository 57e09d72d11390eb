"""Every flowkit hook, grouped by stage (pluggy hookspecs, project name ``flowkit``).

Hooks are called with keyword arguments. "Runs on" says which process calls the hook: the
**driver** (the process that called ``flowkit.train``) or a rollout **worker** (a Ray actor,
or the driver itself with ``runtime.backend=local``). Workers build their own plugin manager
from importable plugins (built-ins, entry points, ``plugins=[...]``); objects registered in
code with :func:`flowkit.register` reach workers only on the local backend.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional

import pluggy

hookspec = pluggy.HookspecMarker("flowkit")


# ---- registration ------------------------------------------------------------------------
@hookspec
def flowkit_add_algorithms() -> List[type]:
    """Contribute Algorithm classes.

    Returns:
        a list of :class:`flowkit.Algorithm` subclasses, each with a unique ``name``.
    Runs on: driver and workers (at plugin-manager set-up).
    Implement in: an algorithm plugin.

    Example::

        @flowkit.hookimpl
        def flowkit_add_algorithms():
            return [MyPPO]
    """


@hookspec
def flowkit_add_config_sections() -> Dict[str, type]:
    """Contribute config sections that are not an algorithm's (``{"multiagent": MAConfig}``).

    Returns:
        ``{section name: dataclass}``; keys become top-level config sections.
    Runs on: driver.
    """


# ---- set-up --------------------------------------------------------------------------------
@hookspec(firstresult=True)
def flowkit_make_env_runner(env: Any, context: Any, config: Any, policies: Dict[str, Any]) -> Optional[Any]:
    """Pick the runner for built envs.

    Args:
        env: the first sub-env built for this worker (a Gymnasium Env, or a PettingZoo env).
        context: the worker's :class:`flowkit.EnvContext`.
        config: the full run config (DictConfig).
        policies: ``{policy_id: Policy}`` of this worker.
    Returns:
        an env-runner class (called as ``cls(worker)``), or None if the env is not yours.
    firstresult: stops at the first non-None result. The core's Gymnasium runner is tried
    last.
    Runs on: worker.
    """


@hookspec(firstresult=True)
def flowkit_make_policy_specs(config: Any, env: Any, algorithms: Dict[str, type]) -> Optional[Dict[str, Any]]:
    """Decide the policies of a run from a probe env built on the driver.

    Args:
        config: the full run config. env: a probe env (closed afterwards).
        algorithms: ``{name: Algorithm class}`` of every installed algorithm.
    Returns:
        ``{policy_id: PolicySpec}`` (policy class, spaces, algorithm config, algorithm name),
        or None if the env is not yours.
    firstresult: stops at the first non-None result. Core (trylast): one ``default`` policy
    for a Gymnasium env, trained by ``algo``. The multiagent plugin maps PettingZoo agents.
    Runs on: driver.
    """


@hookspec(firstresult=True)
def flowkit_build_plan(ctx: Any) -> Optional[Any]:
    """Build the whole train flow of a run.

    Args:
        ctx: the :class:`flowkit.RunContext` (config, WorkerSet, learner policies, counters).
    Returns:
        a Flow of train results (dicts), or None to let another plugin decide.
    firstresult: stops at the first non-None result. The core's default (trylast) runs the
    one algorithm of ``algo``; the multiagent plugin mixes several.
    Runs on: driver. The engine wraps the result in StandardMetricsReporting.
    """


@hookspec
def flowkit_on_run_start(ctx: Any) -> None:
    """The run is set up (plan built, nothing sampled yet). Runs on: driver."""


# ---- sampling (worker) -------------------------------------------------------------------
@hookspec
def flowkit_on_trajectory(policy_id: str, batch: Any, episode: Any) -> None:
    """A trajectory piece of one agent is complete, **before** the policy's postprocessing
    (GAE, n-step): reward shaping done here reaches the advantages. Mutate ``batch`` in place
    (it is the worker's own copy).

    Args:
        policy_id: the policy the agent is mapped to.
        batch: the :class:`SampleBatch` of this piece (time order).
        episode: the :class:`flowkit.Episode` it belongs to.
    Runs on: worker.
    """


@hookspec
def flowkit_on_episode_end(episode: Any, worker: Any) -> None:
    """An episode ended (terminated or truncated). Set ``episode.custom_metrics[name]`` to have
    the per-iteration mean reported as ``custom/<name>``.

    Args:
        episode: the :class:`flowkit.Episode` (return, length, per-agent returns, user_data).
        worker: the rollout worker (``worker.index``, ``worker.env_context``).
    Runs on: worker.
    """


# ---- training (driver) ---------------------------------------------------------------------
@hookspec
def flowkit_on_train_result(result: Dict[str, Any], ctx: Any) -> None:
    """One iteration's result is ready (before it is written to metrics.csv). Reporters,
    early stopping (``ctx.request_stop(reason)``), fault injection in tests.

    Args:
        result: the flat metrics dict of this iteration (mutable: add columns here).
        ctx: the :class:`flowkit.RunContext`, with ``ctx.workers`` (the WorkerSet).
    Runs on: driver.
    """


@hookspec
def flowkit_on_checkpoint(path: str, ctx: Any) -> None:
    """A checkpoint was written (atomically) to ``path``. Runs on: driver."""


@hookspec
def flowkit_on_run_end(result: Any, ctx: Any) -> None:
    """The run ended (``result.stop_reason`` says why). Runs on: driver."""


# ---- state ---------------------------------------------------------------------------------
@hookspec
def flowkit_state_dict() -> Optional[Dict[str, Any]]:
    """Plugin state to store in checkpoints, or None: plain data only (tensors, numpy arrays,
    numbers, strings, None, lists/tuples/dicts of those; an object fails the save, naming it).
    The manager stores it under the plugin's name. Runs on: driver."""


@hookspec
def flowkit_load_state_dict(state: Dict[str, Any]) -> None:
    """Restore what :func:`flowkit_state_dict` returned (called only for plugins that saved
    state, with their own part). Runs on: driver."""
