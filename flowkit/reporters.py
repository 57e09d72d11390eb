"""The engine's own outputs as built-in plugins on flowkit's reporting hooks.

Each reporter is a small class with a ``name``, contributed by ``flowkit_add_reporters`` and
chosen by ``run.reporters`` (default ``[progress, csv, plot, checkpoint, evaluation]``, set
in flowkit/config.py). The engine builds one instance of each chosen reporter per run and
registers it in the run's plugin manager, in list order (so ``flowkit_report`` reaches them in
that order); a reporter that is not chosen is never registered and sees no hook.

=============  ==================================================================  =========
name           what                                                                 default
=============  ==================================================================  =========
progress       tqdm progress bar on stderr (env steps, return, steps/s, eval)       yes
csv            ``metrics.csv``: one row per iteration; on resume cut back to the    yes
               checkpoint's iteration (torn rows skipped)
plot           ``learning_curve.png`` at the end of the run                         yes
checkpoint     ``checkpoint.every_iters``, ``checkpoint.at_end``, the crash          yes
               checkpoint (``checkpoints/crash``)
evaluation     greedy evaluation every ``evaluation.interval`` iterations and        yes
               ``evaluation.final``, merged into the row before anyone reports it
tensorboard    TensorBoard event files in ``tb/`` (flowkit/loggers.py, as the two     no
               below); the config as hparams
mlflow         an MLflow run (local file store ``mlruns/`` beside the run folder)   no
wandb          a Weights & Biases run, offline, in ``wandb/``                        no
timing         ``perf/iteration_ms`` and ``perf/driver_overhead_ms`` columns from a  no
               wrapper around each iteration
=============  ==================================================================  =========

A user reporter is any class with a ``name`` and ``flowkit_*`` hook methods, contributed by a
plugin's ``flowkit_add_reporters``; list its name in ``run.reporters`` (e.g. in place of
``csv`` to replace the CSV writer). ``result.json`` is not a reporter: it is the engine's own
record of the run (the :class:`flowkit.Result` ``flowkit.train`` returns).
"""
from __future__ import annotations

import contextlib
import csv
import os
import sys
import threading
import time
import warnings
from typing import TYPE_CHECKING, Any, Dict, Iterator, List, Optional, Type

from flowkit.core.flow import NOT_READY
from flowkit.hooks.manager import Reporter, hookimpl
from flowkit.hooks.specs import Row

if TYPE_CHECKING:

    from flowkit.core.context import RunContext
    from flowkit.core.metrics import Result


@hookimpl(trylast=True)
def flowkit_train_iteration(ctx: "RunContext", results: Iterator[Any]) -> Optional[Row]:
    """Pull the plan until it yields a row; None when it ends or ``stop.time_s`` passes while
    waiting (then ``ctx.stop_reason`` says so)."""
    limit = ctx.config.stop.time_s
    for r in results:
        if r is not NOT_READY:
            return r
        if limit is not None and ctx.elapsed_s() >= limit:
            ctx.request_stop(f"stop.time_s={limit} reached")
            return None
    return None


def _number(v: str) -> Any:
    """A metrics.csv cell: an int, a float, or the text as it is."""
    try:
        fv = float(v)
    except ValueError:
        return v
    return int(fv) if fv.is_integer() and "." not in v and "e" not in v.lower() else fv


MAX_METRICS_BYTES = 1 << 30  # a metrics.csv larger than this is not read (a tampered or foreign file)


def read_metrics(path: str) -> List[Row]:
    """Rows of a metrics.csv with numbers parsed; a torn row (too few or too many fields,
    as a killed process may leave at the end) is skipped.

    Raises:
        RunFolderError: the file is over :data:`MAX_METRICS_BYTES`, not UTF-8 text or not CSV
            (one line naming it).
    """
    from flowkit._trust import RunFolderError
    if (size := os.path.getsize(path)) > MAX_METRICS_BYTES:
        raise RunFolderError(f"{path}: {size} bytes, larger than a run's metrics.csv may be ({MAX_METRICS_BYTES})")
    try:
        with open(path, encoding="utf-8") as f:
            return [{k: _number(v) for k, v in r.items() if v not in ("", None)} for r in csv.DictReader(f)
                    if None not in r and None not in r.values()]
    except UnicodeDecodeError as e:
        raise RunFolderError(f"{path}: not a UTF-8 text file (byte {e.start}); not a metrics.csv") from None
    except csv.Error as e:
        raise RunFolderError(f"{path}: not a metrics.csv: {e}") from None


def kept_rows(run_dir: str, iteration: int) -> List[Row]:
    """The rows of ``run_dir/metrics.csv`` up to ``iteration``, each iteration once (the last
    copy wins), torn rows skipped; [] without a metrics.csv. What a resume keeps."""
    path = os.path.join(run_dir, "metrics.csv")
    if not os.path.exists(path):
        return []
    by_iter = {int(r["iteration"]): r for r in read_metrics(path)
               if isinstance(r.get("iteration"), int) and 1 <= r["iteration"] <= iteration}
    return [by_iter[k] for k in sorted(by_iter)]


class CSVReporter(Reporter):
    """``metrics.csv``, one row per iteration; written whole at the start (on resume: the rows
    kept up to the checkpoint, torn rows dropped) and whenever new columns appear."""
    name = "csv"

    def flowkit_on_run_start(self, run_dir: str, history: List[Row]) -> None:
        self.path = os.path.join(run_dir, "metrics.csv")
        self.rows: List[Row] = list(history)
        self.columns: List[str] = list(dict.fromkeys(k for r in self.rows for k in r))
        self._rewrite()

    def _rewrite(self) -> None:
        tmp = self.path + ".tmp"
        with open(tmp, "w", newline="") as f:
            w = csv.DictWriter(f, self.columns)
            w.writeheader()
            w.writerows(self.rows)
        os.replace(tmp, self.path)

    def flowkit_report(self, result: Row) -> None:
        self.rows.append(result)
        new = [k for k in result if k not in self.columns]
        if new or not os.path.exists(self.path):
            self.columns += new
            self._rewrite()
        else:
            with open(self.path, "a", newline="") as f:
                csv.DictWriter(f, self.columns).writerow(result)


def policy_metrics(row: Row) -> Dict[str, Dict[str, float]]:
    """A multi-agent row's per-policy headline figures, ``{policy: {"return": training return
    mean, "eval": greedy evaluation return mean, "win": evaluation win rate}}`` (each where the
    row has it: ``policy/<id>/episode_return_mean``, ``evaluation/<id>/episode_return_mean``,
    ``evaluation/<id>/win_rate``); {} for a single-agent row. What the progress bar and the
    summary show in place of ``episode_return_mean`` and ``evaluation_return_mean``, which sum
    the players' returns (always 0 in a zero-sum game)."""
    out: Dict[str, Dict[str, float]] = {}
    for key, v in row.items():
        parts = key.split("/")
        if len(parts) == 3 and parts[0] == "policy" and parts[2] == "episode_return_mean":
            out.setdefault(parts[1], {})["return"] = v
        elif len(parts) == 3 and parts[0] == "evaluation" and parts[2] in ("episode_return_mean", "win_rate"):
            out.setdefault(parts[1], {})["eval" if parts[2] == "episode_return_mean" else "win"] = v
    return out


class ProgressReporter(Reporter):
    """A tqdm bar on stderr: env steps (of ``stop.env_steps``), return, steps/s, eval (in a
    multi-agent run each policy's, and the evaluation's win rates: :func:`policy_metrics`). A
    resumed run's bar starts at the restored env steps (its rate counts only new ones); the
    total grows to the steps done when the last batch passes ``stop.env_steps``."""
    name = "progress"

    def flowkit_on_run_start(self, ctx: "RunContext") -> None:
        from tqdm.auto import tqdm

        from flowkit.core import env_name
        cfg = ctx.config
        done = int(ctx.counters.get("env_steps_sampled", 0))
        total = None if cfg.stop.env_steps is None else max(int(cfg.stop.env_steps), done)
        algos = "+".join(dict.fromkeys(str(s.algo) for s in ctx.policy_specs.values())) or cfg.algo  # ppo+dqn: mixed
        self.bar = tqdm(total=total, initial=done, desc=f"{algos} {env_name(cfg.env)}", unit="step",
                        dynamic_ncols=True, mininterval=0.5 if sys.stderr.isatty() else 5.0, file=sys.stderr)

    def flowkit_report(self, result: Row) -> None:
        per = policy_metrics(result)
        if per:  # multi-agent: each policy's return (the sum over players is 0 in a zero-sum game)
            post = {"return": ",".join(f"{p}:{m['return']:.2f}" for p, m in per.items() if "return" in m)}
        else:
            ret = result.get("episode_return_mean", float("nan"))  # nan: no episode yet (or none played: offline)
            post = {"return": f"{ret:.1f}"} if ret == ret else {}
        post["steps/s"] = f"{result['env_steps_per_s']:.0f}"
        if "evaluation_return_mean" in result:
            post["eval"] = (",".join(f"{p}:{m['eval']:.2f}" for p, m in per.items() if "eval" in m) if per
                            else f"{result['evaluation_return_mean']:.1f}")
        if any("win" in m for m in per.values()):
            post["win"] = ",".join(f"{p}:{m['win']:.3f}" for p, m in per.items() if "win" in m)
        self.bar.set_postfix(post, refresh=False)
        if self.bar.total is not None and result["env_steps_sampled"] > self.bar.total:
            self.bar.total = result["env_steps_sampled"]
        self.bar.update(result["env_steps_sampled"] - self.bar.n)

    @hookimpl(tryfirst=True)
    def flowkit_on_train_end(self) -> None:  # before the final checkpoint and evaluation: the bar ends there
        if hasattr(self, "bar"):
            self.bar.close()


def _pyplot() -> Any:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _preload_pyplot() -> None:
    with contextlib.suppress(Exception):
        _pyplot()


def plot_learning_curve(rows: List[Row], path: str, title: str) -> None:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    xs = [r["env_steps_sampled"] for r in rows]
    ax.plot(xs, [r.get("episode_return_mean", float("nan")) for r in rows], label="episode_return_mean (last 20)")
    ev = [(r["env_steps_sampled"], r["evaluation_return_mean"]) for r in rows if "evaluation_return_mean" in r]
    if ev:
        ax.plot(*zip(*ev), "o-", label="evaluation_return_mean")
    for key in sorted({k for r in rows for k in r if k.startswith("policy/") and k.endswith("episode_return_mean")}):
        ax.plot(xs, [r.get(key, float("nan")) for r in rows], label=key)
    ax.set(xlabel="env steps sampled", ylabel="return", title=title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    tmp = path + ".tmp.png"
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    os.replace(tmp, path)


class PlotReporter(Reporter):
    """``learning_curve.png`` from the run's history, once at the end (errors ignored)."""
    name = "plot"

    def __init__(self) -> None:  # matplotlib loads while the rollout workers start (the driver waits then);
        # not a daemon: a run that ends at once (a config error found at set-up) waits for the import
        # instead of tearing the interpreter down under it (an abort, exit 134, in about 1 of 8 such runs)
        threading.Thread(target=_preload_pyplot, name="flowkit-import-pyplot", daemon=False).start()

    def flowkit_on_run_end(self, result: "Result") -> None:
        if not result.history:
            return
        from flowkit.core import env_name
        cfg = result.config
        with contextlib.suppress(Exception):  # a plot never fails a run
            plot_learning_curve(result.history, os.path.join(result.run_dir, "learning_curve.png"),
                                f"{cfg.algo} on {env_name(cfg.env)} (seed {cfg.seed})")


class CheckpointReporter(Reporter):
    """``checkpoint.every_iters`` (after the row is written), ``checkpoint.at_end`` and the
    crash checkpoint; each calls ``save_checkpoint`` (which calls ``flowkit_on_checkpoint``)."""
    name = "checkpoint"

    def flowkit_on_run_start(self, run_dir: str) -> None:
        from flowkit.checkpoint import save_checkpoint  # torch: imported once a run starts
        self.run_dir, self.save = run_dir, save_checkpoint

    @hookimpl(trylast=True)
    def flowkit_report(self, result: Row, ctx: "RunContext") -> None:
        every = int(ctx.config.checkpoint.every_iters)
        if every > 0 and result["iteration"] % every == 0:
            self.save(ctx, self.run_dir)

    @hookimpl(tryfirst=True)  # before the final evaluation, which may hang or be interrupted
    def flowkit_on_train_end(self, ctx: "RunContext", error: Optional[BaseException]) -> None:
        if not hasattr(self, "run_dir"):
            return
        if error is not None:
            with contextlib.suppress(Exception):  # best effort: keep what was learned
                self.save(ctx, self.run_dir, "crash")
        elif bool(ctx.config.checkpoint.at_end) and ctx.iteration > 0:
            self.save(ctx, self.run_dir)


class EvaluationReporter(Reporter):
    """Greedy evaluation (``ctx.evaluate()``) merged into the row: every
    ``evaluation.interval`` iterations (before other ``flowkit_on_train_result`` hooks) and,
    with ``evaluation.final`` (by default, null, in a run without rollout workers: an offline
    run, which plays no episodes of its own), into the run's summary (marked
    ``final_evaluation``), after the final checkpoint is written.

    An evaluation obeys stops: SIGINT/SIGTERM/SIGHUP and the ``stop.time_s`` deadline interrupt
    it (the row is abandoned, the run stops as from any iteration), and one that takes longer
    than ``evaluation.timeout_s`` (default ``runtime.sample_timeout_s``: a stuck env, an episode
    that never ends) is abandoned with a warning: the row goes on without ``evaluation_*``
    columns, the summary gets ``final_evaluation_error``. No final evaluation follows a signal
    (``final_evaluation_error`` says so); a signal during it ends it the same way."""
    name = "evaluation"

    @staticmethod
    def _evaluate(ctx: "RunContext", what: str) -> Row:
        from flowkit._guard import GUARD, EvaluationTimeout
        cfg = ctx.config
        limit = cfg.evaluation.timeout_s or cfg.runtime.sample_timeout_s
        key = "evaluation.timeout_s" if cfg.evaluation.timeout_s else "runtime.sample_timeout_s"
        with GUARD.interruptible(float(limit), lambda: EvaluationTimeout(
                f"the {what} evaluation ({cfg.evaluation.episodes} episodes) did not finish within {key}={limit:g} s: "
                "a stuck env, or an episode that never ends? Abandoned")):
            return ctx.evaluate()

    @hookimpl(tryfirst=True)
    def flowkit_on_train_result(self, result: Row, ctx: "RunContext") -> None:
        from flowkit._guard import EvaluationTimeout
        every = int(ctx.config.evaluation.interval)
        if every > 0 and result["iteration"] % every == 0:
            try:
                result.update(self._evaluate(ctx, f"iteration {result['iteration']}"))
            except EvaluationTimeout as e:
                warnings.warn(str(e), stacklevel=1)

    def flowkit_on_train_end(self, summary: Row, ctx: "RunContext", error: Optional[BaseException]) -> None:
        from flowkit._guard import GUARD, EvaluationTimeout, Interrupted
        final = ctx.config.evaluation.final
        if final is None:  # a run that played no episodes (no rollout workers: offline) shows a return
            final = ctx.workers.started and not ctx.workers.actors
        if error is not None or not final or not summary:
            return
        if str(ctx.stop_reason or "").startswith("interrupted"):
            summary["final_evaluation_error"] = f"not run: {ctx.stop_reason}"
            return
        try:
            summary.update(self._evaluate(ctx, "final"), final_evaluation=True)
        except EvaluationTimeout as e:
            warnings.warn(str(e), stacklevel=1)
            summary["final_evaluation_error"] = str(e)
        except Interrupted as e:  # the run's stop reason and exit status become the signal's
            summary["final_evaluation_error"] = f"not finished: {e.reason}"
            GUARD.pending = e


class TimingReporter(Reporter):
    """Wraps each iteration: ``perf/iteration_ms`` (pulling the plan: sampling and learning)
    and ``perf/driver_overhead_ms`` (the driver's time between two pulls: hooks, reporters,
    evaluation, checkpoints)."""
    name = "timing"
    _end: Optional[float] = None

    @hookimpl(wrapper=True)
    def flowkit_train_iteration(self) -> Any:
        t0 = time.perf_counter()
        r = yield
        if r is not None:
            r["perf/iteration_ms"] = 1000.0 * (time.perf_counter() - t0)
            if self._end is not None:
                r["perf/driver_overhead_ms"] = 1000.0 * (t0 - self._end)
        self._end = time.perf_counter()
        return r


BUILTIN_REPORTERS: List[Type[Reporter]] = [ProgressReporter, CSVReporter, PlotReporter, CheckpointReporter,
                                            EvaluationReporter, TimingReporter]


@hookimpl
def flowkit_add_reporters() -> List[type]:
    from flowkit.loggers import LOGGERS  # tensorboard, mlflow, wandb (flowkit/loggers.py)
    return list(BUILTIN_REPORTERS) + LOGGERS
