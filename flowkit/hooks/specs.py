# mypy: disable-error-code="empty-body"
"""Every flowkit hook, grouped by stage (pluggy hookspecs, project name ``flowkit``).

Hooks are called with keyword arguments; an implementation may take any subset of them.
"Runs on" says which process calls the hook: the **driver** (the process that called
``flowkit.train``) or a rollout **worker** (a Ray actor, or the driver itself with
``runtime.backend=local``). Workers build their own plugin manager from importable plugins
(built-ins, entry points, ``plugins=[...]``); objects registered in code with
:func:`flowkit.register` reach workers only on the local backend.

Any hook accepts ``@flowkit.hookimpl(wrapper=True)`` implementations (pluggy new-style
wrappers: a generator that yields once, receives the result of the inner implementations and
returns it, possibly changed). ``flowkit_train_iteration`` exists for them (timing,
profiling); ``flowkit_build_plan`` can be wrapped to extend or time the plan.

Groups, in order: registration (driver and workers, at plugin-manager set-up); set-up
(driver, except the runner); sampling (worker); training iterations (driver); state (driver).

The order in which the engine calls these hooks is shown in :mod:`flowkit.engine` and
asserted by ``tests/test_hooks.py``.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, Iterator, List, Mapping, Optional, Type, Union

import pluggy

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from flowkit.core import EnvContext, Episode, Policy, PolicySpec, RolloutWorker
    from flowkit.core.algorithm import Algorithm
    from flowkit.core.batch import SampleBatch
    from flowkit.core.context import RunContext
    from flowkit.core.flow import Flow, _NotReady
    from flowkit.core.metrics import Result
    from flowkit.core.presets import EnvPreset

hookspec = pluggy.HookspecMarker("flowkit")

Row = Dict[str, Any]  #: one iteration's flat metrics: ``{"iteration": 3, "env_steps_sampled": 1536, ...}``


@hookspec
def flowkit_add_algorithms() -> List[Type[Algorithm]]:
    """Contribute algorithms.

    Returns:
        a list of :class:`flowkit.Algorithm` subclasses or :class:`flowkit.AlgorithmRef`
        (name, config section, ``"module:Class"``), each with a unique ``name`` (a name
        contributed by two plugins is an error naming both).
    Runs on: driver and workers (at plugin-manager set-up).
    Implement in: an algorithm plugin. The contract for CLI commands that train nothing
    (``--help``, ``plugins``, config errors: no torch, no Ray): the module the plugin is
    registered from (its entry point) imports no torch, so it returns an ``AlgorithmRef``
    whose section dataclass lives in a torch-free module; the class is imported when a run
    builds it. Returning the class itself still works (the CLI then imports torch).

    Example::

        @flowkit.hookimpl
        def flowkit_add_algorithms():
            return [flowkit.AlgorithmRef("myppo", MyPPOConfig, "my_pkg.algo:MyPPO")]
    """


@hookspec
def flowkit_add_config_sections() -> Dict[str, type]:
    """Contribute config sections that are not an algorithm's.

    Returns:
        ``{section name: dataclass}``; keys become top-level config sections.
    Runs on: driver.
    Implement in: a plugin with its own settings (the multiagent plugin: ``multiagent``).

    Example::

        @flowkit.hookimpl
        def flowkit_add_config_sections():
            return {"multiagent": MultiAgentConfig}
    """


@hookspec
def flowkit_add_reporters() -> List[type]:
    """Contribute reporters: classes with a ``name`` whose ``flowkit_*`` methods are hooks
    (see :mod:`flowkit.reporters`). ``run.reporters`` lists the names used in a run; the
    engine builds one instance of each (no arguments) per run and registers it, in list order.

    Returns:
        a list of reporter classes, each with a unique ``name``.
    Runs on: driver.
    Implement in: a logger plugin (MLflow, W&B), or a user's replacement of a built-in.

    Example::

        class JsonLines:
            name = "jsonl"
            def flowkit_on_run_start(self, run_dir):
                self.f = open(os.path.join(run_dir, "metrics.jsonl"), "a")
            def flowkit_report(self, result):
                self.f.write(json.dumps(result) + "\\n")
            def flowkit_on_train_end(self):
                self.f.close()

        @flowkit.hookimpl
        def flowkit_add_reporters():
            return [JsonLines]          # run.reporters=[progress,jsonl,checkpoint,evaluation]
    """


@hookspec
def flowkit_add_env_presets() -> List[EnvPreset]:
    """Contribute env presets: named families of env wrappers that ``env.preset=NAME`` picks.

    Returns:
        a list of :class:`flowkit.EnvPreset` (``name``, the module that implements it, a
        one-line ``help``), each with a unique ``name`` (a name contributed by two plugins is an
        error naming both). The module (imported when a run uses the preset) defines
        ``make_env(env_cfg, context)``, the training wrappers on rollout workers and the
        evaluation ones elsewhere, and may define ``check(env_cfg)`` (its checks before Ray
        starts; registering its env ids), ``make_vector_env(env_cfg, num_envs, like)`` (a vector
        env of its own for a worker's sub-envs) and ``hint(env_id)`` (the error for one of its
        ids given without the preset): see :mod:`flowkit.core.presets`.
    Runs on: driver and workers (at plugin-manager set-up, which registers them in the process).
    Implement in: a plugin for a family of envs (plugins/atari's ``atari``, plugins/minigrid's
    ``minigrid``).

    Example::

        @flowkit.hookimpl
        def flowkit_add_env_presets():
            return [flowkit.EnvPreset("procgen", "my_pkg.procgen_preset", "Procgen, 64x64 frames")]
    """


@hookspec(firstresult=True)
def flowkit_make_policy_specs(config: DictConfig, env: Any,
                              algorithms: Mapping[str, Type[Algorithm]]) -> Optional[Dict[str, PolicySpec]]:
    """Decide the policies of a run from a probe env built on the driver.

    Args:
        config: the full run config.
        env: a probe env, closed afterwards (a Gymnasium Env or a PettingZoo env: no common
            base class, hence ``Any``).
        algorithms: ``{name: Algorithm class}`` of every installed algorithm (a read-only
            mapping that imports each class when it is first looked up).
    Returns:
        ``{policy_id: PolicySpec}`` (policy class, spaces, algorithm config, algorithm name),
        or None if the env is not yours.
    firstresult: stops at the first non-None result.
    Runs on: driver.
    Implement in: an env-family plugin. Core (trylast): one ``default`` policy for a
    Gymnasium env, trained by ``algo``; the multiagent plugin maps PettingZoo agents.

    Example::

        @flowkit.hookimpl
        def flowkit_make_policy_specs(config, env, algorithms):
            if not isinstance(env, MyEnv):
                return None
            return {"default": PolicySpec(PPOPolicy, env.obs_space, env.act_space, None, "ppo")}
    """


@hookspec(firstresult=True)
def flowkit_build_plan(ctx: RunContext) -> Optional[Flow]:
    """Build the whole train flow of a run.

    Args:
        ctx: the run context (config, WorkerSet, learner policies, counters, timers).
    Returns:
        a Flow of train results, or None to let another plugin decide.
    firstresult: stops at the first non-None result.
    Runs on: driver. The engine wraps the result in StandardMetricsReporting.
    Implement in: a plugin that composes algorithms. The core's default (trylast) runs the
    one algorithm of ``algo``; the multiagent plugin mixes several. A ``wrapper=True``
    implementation sees (and may extend) whichever plan won.

    Example::

        @flowkit.hookimpl(wrapper=True)
        def flowkit_build_plan(ctx):
            plan = yield
            return plan.for_each(log_each_train_step)
    """


@hookspec(firstresult=True)
def flowkit_make_env_runner(env: Any, context: EnvContext, config: DictConfig,
                            policies: Dict[str, Policy]) -> Optional[type]:
    """Pick the runner for built envs.

    Args:
        env: the first sub-env built for this worker (a Gymnasium Env or a PettingZoo env).
        context: the worker's :class:`flowkit.EnvContext`.
        config: the full run config.
        policies: ``{policy_id: Policy}`` of this worker.
    Returns:
        an env-runner class (called as ``cls(worker)``), or None if the env is not yours. Its
        ``evaluate(n, explore)`` returns episode summaries; a summary's ``eval_metrics``
        (``{"<policy>/<name>": float}``, e.g. the multiagent plugin's ``win_rate``) are averaged
        into the evaluation's per-policy figures (``evaluation/<policy>/<name>`` in a run's rows,
        ``policies.<policy>.<name>`` in ``flowkit evaluate``'s report and table).
    firstresult: stops at the first non-None result.
    Runs on: worker.
    Implement in: an env-family plugin. The core's Gymnasium runner is tried last; the
    multiagent plugin's PettingZoo runners before it.

    Example::

        @flowkit.hookimpl
        def flowkit_make_env_runner(env, context, config, policies):
            return MyRunner if isinstance(env, MyEnv) else None
    """


@hookspec
def flowkit_on_run_start(ctx: RunContext, run_dir: str, history: List[Row]) -> None:
    """The run is set up: plan built, checkpoint restored on resume, workers started, nothing
    sampled yet. Reporters open their outputs here.

    Args:
        ctx: the run context.
        run_dir: the run folder (exists; holds config.yaml).
        history: on resume, the rows kept from ``metrics.csv`` (iterations up to the
            checkpoint's, in order); [] on a fresh run. Do not mutate.
    Runs on: driver.
    Implement in: reporters, loggers (log ``ctx.config`` as hyperparameters here).

    Example::

        def flowkit_on_run_start(self, ctx, run_dir, history):
            self.run = mlflow.start_run(run_name=os.path.basename(run_dir))
            mlflow.log_params(flatten(ctx.config))
    """


@hookspec
def flowkit_on_trajectory(policy_id: str, batch: SampleBatch, episode: Episode) -> None:
    """A trajectory piece of one agent is complete, **before** the policy's postprocessing
    (GAE, n-step): reward shaping done here reaches the advantages. Mutate ``batch`` in place
    (it is the worker's own copy).

    Args:
        policy_id: the policy the agent is mapped to.
        batch: the :class:`SampleBatch` of this piece (time order).
        episode: the :class:`flowkit.Episode` it belongs to.
    Runs on: worker.
    Implement in: reward shaping, trajectory filters.

    Example::

        @flowkit.hookimpl
        def flowkit_on_trajectory(policy_id, batch, episode):
            batch["rewards"] -= 0.01              # a time penalty
    """


@hookspec
def flowkit_on_episode_end(episode: Episode, worker: RolloutWorker) -> None:
    """An episode ended (terminated or truncated). Set ``episode.custom_metrics[name]`` to have
    the per-iteration mean reported as ``custom/<name>``.

    Args:
        episode: the :class:`flowkit.Episode` (return, length, per-agent returns, user_data).
        worker: the rollout worker (``worker.index``, ``worker.env_context``).
    Runs on: worker.
    Implement in: custom episode metrics.

    Example::

        @flowkit.hookimpl
        def flowkit_on_episode_end(episode, worker):
            episode.custom_metrics["len_x10"] = episode.length * 10
    """


@hookspec(firstresult=True)
def flowkit_train_iteration(ctx: RunContext, results: Iterator[Union[Row, _NotReady]]) -> Optional[Row]:
    """Produce the next iteration's row by pulling the plan (sampling and learning happen
    inside). The point to wrap for timing and profiling.

    Args:
        ctx: the run context.
        results: the run's iterator over StandardMetricsReporting(plan): rows, or NOT_READY
            while nothing is ready.
    Returns:
        the row, or None when the plan ended or a stop was requested while waiting
        (``ctx.stop_reason`` says which).
    firstresult: stops at the first non-None result. The core's default (trylast) pulls until
    a row comes and applies ``stop.time_s`` while waiting.
    Runs on: driver, once per iteration (never per env step).
    Implement in: a ``wrapper=True`` implementation (the built-in ``timing`` reporter adds
    ``perf/iteration_ms``); replacing the default is rarely needed.

    Example::

        @flowkit.hookimpl(wrapper=True)
        def flowkit_train_iteration(ctx, results):
            with torch.profiler.record_function("iteration"):
                return (yield)
    """


@hookspec
def flowkit_on_train_result(result: Row, ctx: RunContext) -> None:
    """One iteration's row is ready and may still change: add columns, request a stop
    (``ctx.request_stop(reason)``), inject faults in tests. The built-in ``evaluation``
    reporter (tryfirst) merges its columns first, so every other implementation sees them.

    Args:
        result: the flat metrics of this iteration (mutable).
        ctx: the run context, with ``ctx.workers`` (the WorkerSet).
    Runs on: driver.
    Implement in: early stopping, derived metrics.

    Example::

        @flowkit.hookimpl
        def flowkit_on_train_result(result, ctx):
            if result["episode_return_mean"] > 490:
                ctx.request_stop("solved")
    """


@hookspec
def flowkit_report(result: Row, ctx: RunContext) -> None:
    """The reporting hook: one iteration's final row, to write out. Called after every
    ``flowkit_on_train_result``, in ``run.reporters`` order; the ``checkpoint`` reporter
    (trylast) writes its checkpoint after the others have reported the row.

    Args:
        result: the row (read it; do not change it: every reporter sees the same row).
        ctx: the run context.
    Runs on: driver.
    Implement in: reporters: progress, csv, tensorboard, checkpoint (built-in); MLflow, W&B.

    Example::

        def flowkit_report(self, result):
            mlflow.log_metrics({k: v for k, v in result.items() if isinstance(v, float)},
                               step=result["env_steps_sampled"])
    """


@hookspec
def flowkit_on_checkpoint(path: str, ctx: RunContext) -> None:
    """A checkpoint was written (atomically) to ``path``.

    Args:
        path: the checkpoint folder (``state.pt``, ``config.yaml``).
        ctx: the run context.
    Runs on: driver (called by ``save_checkpoint``).
    Implement in: loggers that upload artifacts.

    Example::

        def flowkit_on_checkpoint(self, path):
            mlflow.log_artifacts(path, "checkpoints/" + os.path.basename(path))
    """


@hookspec
def flowkit_on_train_end(summary: Row, error: Optional[BaseException], ctx: RunContext) -> None:
    """The iteration loop ended: stopped, interrupted, the plan ended, or an exception
    (``error``; the engine re-raises it afterwards and ``flowkit_on_run_end`` is not called).
    The context still holds the workers. The built-in ``evaluation`` reporter (tryfirst) runs
    the final evaluation into ``summary``; ``checkpoint`` then writes the final or crash
    checkpoint; reporters close their outputs (trylast).

    Args:
        summary: a copy of the last row ({} if no iteration ran); mutable: it becomes
            ``result.json`` and ``Result.metrics``.
        error: the exception that ended the run, or None.
        ctx: the run context.
    Runs on: driver.
    Implement in: reporters (close files, end a logger's run, FAILED status on ``error``).

    Example::

        def flowkit_on_train_end(self, error):
            mlflow.end_run("FAILED" if error else "FINISHED")
    """


@hookspec
def flowkit_on_run_end(result: Result, ctx: RunContext) -> None:
    """The run ended normally: workers stopped, ``result.json`` written.

    Args:
        result: the :class:`flowkit.Result` ``flowkit.train`` returns (metrics, history,
            run_dir, checkpoint, stop_reason, config).
        ctx: the run context (workers stopped).
    Runs on: driver.
    Implement in: end-of-run outputs (the built-in ``plot`` reporter), notifications.

    Example::

        def flowkit_on_run_end(self, result):
            print("done:", result.stop_reason)
    """


@hookspec
def flowkit_state_dict() -> Optional[Dict[str, Any]]:
    """Plugin state to store in checkpoints.

    Returns:
        plain data only (tensors, numpy arrays, numbers, strings, None, lists/tuples/dicts of
        those; an object fails the save, naming where it is), or None for none. The manager
        stores it under the plugin's name.
    Runs on: driver (called by ``save_checkpoint``, not through ``pm.hook``).
    Implement in: stateful plugins (curricula, opponent pools).

    Example::

        def flowkit_state_dict(self):
            return {"level": self.level}
    """


@hookspec
def flowkit_load_state_dict(state: Dict[str, Any]) -> None:
    """Restore what :func:`flowkit_state_dict` returned; called only for plugins that saved
    state, with their own part, on resume before the workers start.

    Args:
        state: this plugin's part of the checkpoint.
    Runs on: driver.
    Implement in: the plugins that implement ``flowkit_state_dict``.

    Example::

        def flowkit_load_state_dict(self, state):
            self.level = state["level"]
    """
