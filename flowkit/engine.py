"""The engine: set-up and the run loop. The run's outputs are reporters, built-in plugins in
:mod:`flowkit.reporters`; checkpoints are written by :mod:`flowkit.checkpoint`.

The run loop, with every hook in order (D: runs on the driver, W: on a worker; ``[name]``: the
built-in reporter of ``run.reporters`` that implements the hook; tests/test_hooks.py asserts
the exact sequence)::

    pm = plugins: built-ins (flowkit.builtin, flowkit.reporters), entry points,
         plugins=[...], registered objects; check_pending()
    cfg = config                   D flowkit_add_algorithms(), flowkit_add_config_sections()
    validate (run.reporters known) D flowkit_add_algorithms(), flowkit_add_reporters()
    specs                          D flowkit_make_policy_specs(config, env, algorithms)   firstresult
    ctx = make_context(...)          (driver policies, learners, WorkerSet not started)
    reporters registered           D flowkit_add_reporters(); one instance each, in list order
    plan                           D flowkit_build_plan(ctx)                 firstresult, wrappable
    resume: restore                D flowkit_load_state_dict(state)           for each saver
    config.yaml written              (after a restore that worked)
    try:
        workers start              W flowkit_make_env_runner(env, context, config, policies)
        run start                  D flowkit_on_run_start(ctx, run_dir, history)
                                     [progress] [csv] [tensorboard] [checkpoint] open
        loop:
            row                    D flowkit_train_iteration(ctx, results)   firstresult; wrapped
                                     by [timing]; pulls StandardMetricsReporting(plan), while
                                   W   flowkit_on_episode_end(episode, worker)
                                   W   flowkit_on_trajectory(policy_id, batch, episode)  (before GAE)
                                     None: the plan ended, or stop.time_s passed while waiting
            row may change         D flowkit_on_train_result(result, ctx)
                                     [evaluation] first (every evaluation.interval), then users
            row is reported        D flowkit_report(result, ctx)
                                     [progress] [csv] [tensorboard], then [checkpoint] last:
                                     every checkpoint.every_iters save_checkpoint ->
                                   D   flowkit_state_dict(), flowkit_on_checkpoint(path, ctx)
            stop?                    ctx.stop_reason, or stop.* reached
    (SIGINT/SIGTERM/SIGHUP, or the stop.time_s watchdog: the iteration is abandoned, the loop
     ends with stop_reason "interrupted (SIGTERM)"; on those and on errors the counters and the
     iteration go back to the last reported row, so a final checkpoint matches metrics.csv)
    loop ended (or error)          D flowkit_on_train_end(summary, error, ctx)
                                     [progress] closes, [checkpoint] at_end, or "crash" on error ->
                                   D   flowkit_state_dict(), flowkit_on_checkpoint(path, ctx)
                                     [evaluation] final (evaluation.final; not after a signal;
                                     bounded by evaluation.timeout_s, interrupted by signals)
                                     [csv] [tensorboard] close
    error: workers stop, the exception is re-raised; nothing below runs
    workers stop; result.json = summary + stop_reason (also when the final checkpoint failed:
                                     then with `error`, and that error is raised after it)
    run end                        D flowkit_on_run_end(result, ctx)          [plot]
    return Result(metrics=summary, history=rows, run_dir, checkpoint, stop_reason, config)
"""
from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import math
import os
import random
import shlex
import time
import traceback
import warnings
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from flowkit import _ray
from flowkit._dataset_output import make_output
from flowkit._guard import GUARD, Interrupted, lock_run_dir
from flowkit._outputs import write_text
from flowkit._prepare import Prepared, check_config, prepare
from flowkit.checkpoint import config_yaml, find_checkpoint, remove_stale_temp, restore, save_checkpoint  # noqa: F401
from flowkit.config import ConfigError, build_config, plugin_modules_from, section_object, validate_section
from flowkit.core import EnvContext, SpaceError, derive_seed, env_name
from flowkit.core._envs import probe_env
from flowkit.core.context import RunContext, make_context
from flowkit.core.learner import NonFiniteError
from flowkit.core.metrics import Result
from flowkit.core.ops import StandardMetricsReporting
from flowkit.core.workers import kill_prestarted, reuse_freed_memory
from flowkit.hooks import PluginError, get_plugin_manager
from flowkit.hooks.manager import worker_plugin_manager
from flowkit.reporters import policy_metrics, read_metrics  # noqa: F401  (read_metrics: public here too)


# ---- set-up ----------------------------------------------------------------------------------
def load_config(user: Any = None, config_file: Union[str, Sequence[str], None] = None, pm: Any = None):
    """Plugin manager and validated config (the ``flowkit train --dry-run`` path).

    Raises:
        ConfigError: any config problem (also an unknown algorithm or unusable env).
    """
    if pm is None:
        pm = get_plugin_manager(plugin_modules_from(user, config_file))
    cfg = build_config(user, config_file, pm.config_sections())
    return pm, cfg


def _probe_env(cfg: DictConfig) -> Any:
    """The run's probe env, checked (:func:`flowkit.core._envs.probe_env`)."""
    ctx = EnvContext(-1, 0, max(1, int(cfg.runtime.num_workers)), 0, derive_seed(int(cfg.seed), "probe"))
    return probe_env(OmegaConf.to_container(cfg.env, resolve=True), ctx, check=True)


def setup(cfg: DictConfig, pm: Any, run_dir: Optional[str] = None, checked: bool = False) -> RunContext:
    """Check the config (:func:`flowkit._prepare.check_config`; ``checked``: :func:`prepare`
    did), decide policies, build the learner and the (unstarted) WorkerSet."""
    if not checked:
        check_config(cfg, pm)
    algos = pm.algorithms()
    env = _probe_env(cfg)
    try:
        specs = pm.hook.flowkit_make_policy_specs(config=cfg, env=env, algorithms=algos)
        output = make_output(cfg, env, specs or {})
    finally:
        with contextlib.suppress(Exception):
            env.close()
    if not specs:
        raise ConfigError(f"no plugin knows how to map the agents of env {env_name(cfg.env)!r} to policies")
    instances: Dict[str, Any] = {}
    warns: List[str] = []
    for pid, spec in specs.items():
        cls = algos.get(spec.algo)
        if cls is None:
            raise ConfigError(f"policy {pid!r}: algorithm {spec.algo!r} is not installed")
        try:
            cls.check_spaces(pid, spec.observation_space, spec.action_space)
        except SpaceError as e:  # a space no encoder or action distribution takes (Text, Graph, Tuple actions)
            raise ConfigError(f"policy {pid!r} ({spec.algo}) cannot be built for the env's spaces: {e}") from None
        section = section_object(cfg, spec.algo, cls.config_class)
        cls.check_model(pid, spec.model_config(cfg), section)
        if spec.algo not in instances:
            warns += validate_section(spec.algo, cfg, section)
            instances[spec.algo] = cls(cfg, section)
    for w in warns:
        warnings.warn(w, stacklevel=2)
    try:
        ctx = make_context(cfg, pm, instances, specs, run_dir, make_pm=worker_plugin_manager)
    except (MemoryError, RuntimeError) as e:  # torch reports a failed allocation as a RuntimeError
        if "allocate" not in str(e):
            raise
        raise ConfigError(f"the networks do not fit in memory (model.hidden_sizes={list(cfg.model.hidden_sizes)}): "
                          f"{str(e).splitlines()[0]}") from None
    ctx.config_warnings = warns
    if output is not None:  # run.output: the operator after the rollouts, checkpointed
        ctx.output = ctx.add_stateful("run/output", output)
    ctx.workers.sample_deadline = GUARD.sample_deadline  # its watchdog interrupts a local sample
    return ctx


def build_plan(ctx: RunContext) -> Any:
    """The plan, with reads of undeclared config keys turned into ConfigErrors (C10)."""
    try:
        plan = ctx.pm.hook.flowkit_build_plan(ctx=ctx)
    except (OmegaConfBaseException, AttributeError) as e:
        section = getattr(e, "obj", None)  # an AttributeError: of a section (a dataclass instance)?
        if isinstance(e, AttributeError) and not dataclasses.is_dataclass(section):
            raise
        key = (f"`{e.name}` of {type(section).__name__}" if isinstance(e, AttributeError)
               else f"`{getattr(e, 'full_key', None) or '?'}`")
        raise ConfigError(f"a plugin read config key {key}, which its config schema does not "
                          f"declare ({str(e).splitlines()[0]})") from None
    if plan is None:
        raise ConfigError("no plugin built a plan for this run")
    if ctx.output is not None and not ctx.output.wired:
        raise ConfigError(f"run.output={ctx.config.run.output!r}: the plan of algo={ctx.config.algo} takes no "
                          "sample batches from rollout workers (ParallelRollouts): nothing to record")
    return plan


def describe_plan(user: Any = None, config_file: Union[str, Sequence[str], None] = None) -> Dict[str, str]:
    """``{"text": ..., "mermaid": ...}`` of the plan of a config; starts no actor."""
    pm, cfg = load_config(user, config_file)
    ctx = setup(cfg, pm)
    plan = StandardMetricsReporting(build_plan(ctx), ctx)
    assert not ctx.workers.started
    return {"text": plan.to_text(), "mermaid": plan.to_mermaid()}


# ---- train -------------------------------------------------------------------------------------
def _wait_for_ray(cfg: DictConfig, ctx: RunContext) -> None:
    """Wait for the Ray session started in the background (kept for later runs; ended by
    ``flowkit._ray.stop()`` or at exit); take the signals back from Ray."""
    if cfg.runtime.backend == "ray":
        _ray.wait()
        ctx.workers.prestarted = _ray.take_prestarted()
        if GUARD.active:  # Ray sets its own SIGTERM handler, which would abort the process
            GUARD.install()
    ctx.mark("ray")


_STOPS = (("env_steps", "env_steps_sampled"), ("iterations", "iteration"), ("episode_return_mean",) * 2,
          ("evaluation_return_mean",) * 2, ("time_s", "time_total_s"))  # stop.<key>, the row's column it reads


def _stop_reason(cfg: DictConfig, r: Dict[str, Any]) -> Optional[str]:
    for key, column in _STOPS:
        limit = cfg.stop[key]
        if limit is not None and r.get(column, -math.inf) >= limit:
            return f"stop.{key}={limit} reached"
    return None


NO_STOP = ("flowkit: no stop condition (stop.env_steps, stop.iterations, stop.episode_return_mean, "
           "stop.evaluation_return_mean or stop.time_s): training goes on until interrupted (Ctrl-C saves a checkpoint and stops)")


def summary(res: Result) -> str:
    """The lines ``flowkit train`` and :func:`train` print at the end of a run: run folder,
    stop reason, the last row's main metrics (a multi-agent run's per policy, with the
    evaluation's win rates: :func:`flowkit.reporters.policy_metrics`), the last checkpoint and,
    after a signal, the command that resumes the run."""
    m = res.metrics
    keys = ["iteration", "env_steps_sampled", "episode_return_mean", "evaluation_return_mean", "time_total_s"]
    per = policy_metrics(m)
    if per:  # multi-agent: each policy's figures, not the sum over players (0 in a zero-sum game)
        keys[2:4] = [f"policy/{p}/episode_return_mean" for p in per] + [
            f"evaluation/{p}/{k}" for p in per for k in ("episode_return_mean", "win_rate")]
    shown = [k for k in keys if k in m]
    if "evaluation_return_mean" in m and m.get("episode_return_mean") != m.get("episode_return_mean"):
        shown.remove("episode_return_mean")  # nan: no episode played (an offline run); the evaluation's return
    lines = [f"run folder: {res.run_dir}", f"stopped: {res.stop_reason}",
             "  " + "  ".join(f"{k}={m[k]:.4g}" if isinstance(m.get(k), float) else f"{k}={m.get(k)}" for k in shown)]
    if res.checkpoint:
        lines.append(f"checkpoint: {res.checkpoint}")
        if str(res.stop_reason).startswith("interrupted"):  # a signal: say how to go on
            lines.append(f"resume: flowkit train {shlex.quote(f'resume={res.run_dir}')}")
    return "\n".join(lines)


def train(config: Any = None, config_file: Union[str, Sequence[str], None] = None, plugins: Sequence[Any] = (),
          verbose: bool = True, trust_config: bool = False, take_over_lock: bool = False) -> Result:
    """Train from a config (or a :class:`Prepared` run) and return a :class:`Result`.

    Args:
        config: dotlist overrides (``["algo=ppo", "env=CartPole-v1"]`` or one string of
            them), a nested dict, or a DictConfig; merged over ``config_file``. Or what
            :func:`prepare` returned (then ``config_file``, ``plugins`` and ``trust_config``
            were its arguments).
        config_file: YAML file(s), merged in order over the defaults.
        plugins: plugin objects for this run only (as :func:`flowkit.register` would add
            them; they reach workers only on the local backend).
        verbose: print what ``flowkit train`` prints: a first line when the config sets no
            stop condition, and at the end (also after Ctrl-C or SIGTERM) the
            :func:`summary` (run folder, stop reason, checkpoint). False: print nothing (the
            ``progress`` reporter is left out too); a config without a stop condition is then
            a UserWarning.
        trust_config: with ``resume=``, allow the callables the run folder's config names
            that no installed flowkit plugin provides (``env.factory``, ``model.class``,
            ``plugins``); without it, each must be given again in ``config`` (a run folder is
            data, see :mod:`flowkit._trust`).
        take_over_lock: take over the run folder's lock when it names a run on another host
            (that run must be gone, e.g. preempted); a lock of this host whose process is gone
            is taken over without it.

    Raises:
        ConfigError: a config problem, before anything starts.
        Exception: the original exception of a failed env/worker (with notes naming the
            worker and operator), after a best-effort checkpoint of what was learned.
    """
    res = _train(config, config_file, plugins, verbose, trust_config, take_over_lock)
    if verbose:
        print("\n" + summary(res), flush=True)
    return res


def _train(config: Any, config_file: Union[str, Sequence[str], None], plugins: Sequence[Any],
           verbose: bool, trust_config: bool = False, take_over_lock: bool = False) -> Result:
    t_entry = time.perf_counter()
    cfg = run_dir = None
    with GUARD.running():
        try:
            with GUARD.held():  # a signal waits until the config is built (see Guard.held)
                p = config if isinstance(config, Prepared) else prepare(config, config_file, plugins, trust_config)
            cfg, pm, run_dir, resume_from, run_rows = p.config, p.pm, p.run_dir, p.resume_from, p.run_rows
            if verbose and resume_from:
                print(f"resuming from {resume_from} (iteration {p.resume_iteration})", flush=True)
            if not verbose:  # no progress bar either
                cfg.run.reporters = [r for r in cfg.run.reporters if r != "progress"]
            if all(cfg.stop[k] is None for k in cfg.stop):  # said also when quiet (SB3's learn needs a budget)
                if verbose:
                    print(NO_STOP, flush=True)
                else:
                    warnings.warn(NO_STOP.removeprefix("flowkit: "), stacklevel=3)
            _ray.start(cfg, prestart=True)  # (the CLI started it before importing torch)
            t_config = time.perf_counter()
            torch.manual_seed(derive_seed(int(cfg.seed), "torch"))
            np.random.seed(derive_seed(int(cfg.seed), "numpy"))
            random.seed(derive_seed(int(cfg.seed), "python"))
            torch.set_num_threads(max(1, int(cfg.learner.num_threads)))
            if cfg.learner.reuse_freed_memory:
                reuse_freed_memory()
            ctx = setup(cfg, pm, run_dir, checked=True)
            ctx.t_entry, ctx.metrics.extra["time_config_s"] = t_entry, t_config - t_entry
            release = lock_run_dir(run_dir, take_over_lock)  # creates run_dir
            remove_stale_temp(run_dir)  # a killed writer's temporary checkpoint files
            try:
                _wait_for_ray(cfg, ctx)
                return _run(ctx, cfg, pm, run_dir, resume_from, run_rows, t_entry)
            finally:
                release()
        except KeyboardInterrupt as e:  # a signal during start-up: nothing to save
            reason = _interrupted(e)
            return Result({"stop_reason": reason}, [], run_dir, None, reason, cfg)
        finally:  # workers prestarted for a run that failed before it waited for Ray: their CPUs back
            kill_prestarted(_ray.take_prestarted())


def _run(ctx: RunContext, cfg: DictConfig, pm: Any, run_dir: str, resume_from: Optional[str],
         history: List[Dict[str, Any]], t_entry: float) -> Result:
    last_ckpt = _LastCheckpoint()
    pm.register(last_ckpt)
    register_reporters(pm, cfg)  # before the plan and the restore: they may wrap one, keep state
    plan = build_plan(ctx)
    if resume_from:
        restore(ctx, resume_from)
        last = {**(history[-1] if history else {}), "iteration": ctx.iteration,
                "env_steps_sampled": ctx.counters["env_steps_sampled"]}
        met = _stop_reason(cfg, last)
        if met:  # nothing to train: no new row, checkpoint or result.json
            ctx.shutdown()
            met = met.replace(" reached", " already reached at the checkpoint; nothing trained")
            return Result(last, history, run_dir, resume_from, met, cfg)
    write_text(os.path.join(run_dir, "config.yaml"), config_yaml(cfg, ctx.policy_specs, pm))  # after a restore that worked
    results = iter(StandardMetricsReporting(plan, ctx))
    reason, error, done = _loop(ctx, cfg, pm, results, history, run_dir, t_entry)
    # the final (or crash) checkpoint records the last reported row's counters and iteration,
    # not those of an abandoned one (its weights may include part of its updates)
    ctx.counters.clear()
    ctx.counters.update(done[0])
    ctx.iteration = done[1]
    return _finish(ctx, cfg, pm, run_dir, history, t_entry, reason, error, last_ckpt, resume_from)


def _loop(ctx: RunContext, cfg: DictConfig, pm: Any, results: Any, history: List[Dict[str, Any]], run_dir: str,
          t_entry: float) -> Tuple[Optional[str], Optional[BaseException], Tuple[Dict[str, int], int]]:
    """Start the workers and train until a stop condition, a signal or an error: ``(stop
    reason, error, (counters, iteration) at the end of the last reported iteration)``."""
    reason: Optional[str] = None
    error: Optional[BaseException] = None
    done = (dict(ctx.counters), ctx.iteration)  # at the end of the last completed iteration
    try:
        t0 = time.perf_counter()
        ctx.workers.start()
        ctx.metrics.extra["time_setup_s"] = time.perf_counter() - t0
        ctx.mark("actors")
        pm.hook.flowkit_on_run_start(ctx=ctx, run_dir=run_dir, history=list(history))
        ctx.start_clock()
        # start-up: from train() to the first sample request (config, Ray, actors ready)
        ctx.metrics.extra["time_startup_s"] = (ctx._t_start or t_entry) - t_entry
        limit = cfg.stop.time_s
        if limit is not None:  # whatever the plan waits on, the driver stops it
            GUARD.set_deadline("stop", 1.1 * limit - ctx._time_offset,
                               lambda: Interrupted(f"stop.time_s={limit} reached (iteration abandoned)"))
        while True:
            r = pm.hook.flowkit_train_iteration(ctx=ctx, results=results)
            if r is None:
                reason = ctx.stop_reason
                break
            counters = dict(ctx.counters)
            with GUARD.shielded():  # a signal now waits until the row is reported
                pm.hook.flowkit_on_train_result(result=r, ctx=ctx)
                history.append(r)
                pm.hook.flowkit_report(result=r, ctx=ctx)
            done = (counters, ctx.iteration)
            if GUARD.pending is not None:
                raise GUARD.pending
            reason = ctx.stop_reason or _stop_reason(cfg, r)
            if reason:
                break
    except KeyboardInterrupt as e:  # SIGINT, SIGTERM, SIGHUP, the stop.time_s watchdog
        reason = _interrupted(e)
    except BaseException as e:
        error = e
    return reason, error, done


def _finish(ctx: RunContext, cfg: DictConfig, pm: Any, run_dir: str, history: List[Dict[str, Any]], t_entry: float,
            reason: Optional[str], error: Optional[BaseException], last_ckpt: _LastCheckpoint,
            resume_from: Optional[str]) -> Result:
    """The run's end: the end hooks (the final checkpoint), the shutdown and result.json;
    ``error`` raised again."""
    summary = dict(history[-1]) if history else {}
    ckpt_error: Optional[Exception] = None
    ctx.stop_reason = reason  # what the end hooks see (no final evaluation after a signal)
    with GUARD.shielded():  # a second signal does not tear the final checkpoint
        GUARD.set_deadline("stop", None)
        try:
            pm.hook.flowkit_on_train_end(summary=summary, error=error, ctx=ctx)
        except Exception as e:  # the final checkpoint failed (disk full): result.json still written
            ckpt_error = e
        finally:
            _shut_down(ctx, reason)
        if isinstance(error, NonFiniteError):  # the crash checkpoint, if any, passed the finite-weights check
            error.args = (f"{error}; last good checkpoint: {last_ckpt.path or resume_from or 'none'}",)
        if error is not None:
            raise error
        if isinstance(GUARD.pending, Interrupted) and not (reason or "").startswith("interrupted"):
            reason = GUARD.pending.reason  # a signal during the final evaluation
        summary["stop_reason"] = reason or "plan ended"
        summary["time_end_s"] = time.perf_counter() - t_entry
        if ckpt_error is not None:
            summary["error"] = f"{type(ckpt_error).__name__}: {ckpt_error}"
        write_text(os.path.join(run_dir, "result.json"), json.dumps(summary, indent=2, default=float))
        if ckpt_error is not None:
            raise ckpt_error
        result = Result(summary, history, run_dir, last_ckpt.path, summary["stop_reason"], cfg)
        pm.hook.flowkit_on_run_end(result=result, ctx=ctx)
    return result


def _interrupted(e: KeyboardInterrupt) -> str:
    """The stop reason of a signal (``interrupted (SIGTERM)``), its frames cleared: the abandoned
    iteration's (the env runner's among them) form a cycle with the signal handler's frame."""
    traceback.clear_frames(e.__traceback__)
    return getattr(e, "reason", "interrupted (SIGINT)")


def _shut_down(ctx: RunContext, reason: Optional[str]) -> None:
    """Stop the workers and learners; after a signal, also collect what the abandoned iteration
    left in reference cycles (a worker the signal cut short while it was built, tied to its env
    runner; the frames of the interrupt, cleared where it was caught): the CLI's exit collects
    no cycles (``gc.freeze``), and ale-py would list the envs they hold as leaked."""
    ctx.shutdown()
    if str(reason or "").startswith("interrupted"):
        gc.collect()


class _LastCheckpoint:
    """The engine's own listener: the newest checkpoint of the run, for ``Result.checkpoint``."""
    path: Optional[str] = None

    def flowkit_on_checkpoint(self, path: str) -> None:
        self.path = path


def register_reporters(pm: Any, cfg: DictConfig) -> List[Any]:
    """One instance of each reporter in ``run.reporters``, registered so that hooks reach
    them in list order (pluggy calls the last registered first). Returns them."""
    import pluggy
    known = pm.reporters()
    objs = [known[name]() for name in cfg.run.reporters]
    try:
        for name, obj in reversed(list(zip(cfg.run.reporters, objs))):
            pm.register(obj, name=f"reporter:{name}")
        pm.check_pending()
    except pluggy.PluginValidationError as e:
        raise PluginError(f"reporter: {e}") from None
    return objs
