"""``flowkit tune``: hyperparameter sweeps on Ray Tune, each trial an ordinary run folder in
the sweep folder (usage: README "Sweeps, seeds and plots", docs/experiments.md).

A ``key=value`` whose value is one of these is searched (:func:`parse_space`); any other is an
override shared by every trial::

    choice(a,b,...)            one of the values          grid: every value; random/optuna: uniform
    range(n) | range(a,b[,s])  ints as Python's range     same as choice over them
    uniform(lo,hi)             a float in [lo, hi]        sampled (grid: num_samples per grid point)
    loguniform(lo,hi)          a float, log-uniform       sampled
    randint(lo,hi)             an int in [lo, hi)         sampled

:func:`main` checks every searched value, fits a trial to the cluster (:func:`plan_resources`),
runs the trials (:func:`run_trial` in Tune's actors, rows reported by :class:`TuneReport`) and
writes the table (``tune_results.csv``). Exit status: 0 every trial ended (stopped early
included), 1 a trial failed or has no result.json, 2 a config or usage error, 128 + N a signal.

Signals (:func:`_stopping_on_signals`): SIGINT, SIGTERM or SIGHUP to the sweep, or to its whole
process group (as Slurm and systemd send them), end it gracefully: Ray Tune stops the trials,
each trial's run writes its final checkpoint and result.json (stop reason ``the sweep was
stopped by SIGTERM``; table status ``stopped by SIGTERM``), and the table is written; the
trials' processes ignore those signals (the sweep stops them). A second signal ends the sweep
at once.
"""
from __future__ import annotations

import contextlib
import csv
import json
import math
import os
import re
import signal
import sys
import threading
import time
import typing
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

from flowkit._prepare import build_tuned, shown_path
from flowkit.config import ConfigError, F, _dotlist, build_config, plugin_modules_from
from flowkit.core import env_name
from flowkit.hooks import get_plugin_manager

STOPPED_EARLY = "stopped early by the Tune scheduler"
SWEEP_STOPPED = "the sweep was stopped by"  # a trial's stop reason after a signal to the sweep: + " SIGTERM"
STOP_FILE = ".stopped_by_signal"  # in the sweep folder: the name of the signal that stopped the sweep
SPEC = re.compile(r"^(choice|range|uniform|loguniform|randint)\((.*)\)$", re.S)


@dataclass
class Dim:
    """One searched key: ``kind`` (choice, uniform, loguniform, randint; range is a choice)
    and its ``args`` (the values, or the bounds)."""
    kind: str
    args: List[Any]


def parse_space(items: Sequence[str]) -> Tuple[List[str], Dict[str, Dim]]:
    """``(plain overrides, {key: Dim})`` of the command's ``key=...`` items.

    Raises:
        ConfigError: a malformed spec (``range(a)`` of a non-int, ``uniform`` without two bounds,
            an empty choice) naming the item.
    """
    plain: List[str] = []
    space: Dict[str, Dim] = {}
    for item in items:
        key, _, raw = item.partition("=")
        m = SPEC.match(raw.strip())
        if not m:
            plain.append(item)
            continue
        kind, args = m[1], _dotlist([f"v=[{m[2]}]"])["v"]  # the values, each read as an override's value
        if not isinstance(args, list):
            raise ConfigError(f"{item!r}: its values are not a list (comma-separated YAML values)")
        if kind == "range":
            if not (1 <= len(args) <= 3 and all(isinstance(a, int) and not isinstance(a, bool) for a in args)):
                raise ConfigError(f"{item!r}: range takes 1 to 3 ints, as Python's range")
            if len(range(*args)) > MAX_TRIALS:
                raise ConfigError(f"{item!r}: {len(range(*args))} values, more than flowkit tune's {MAX_TRIALS} trials")
            kind, args = "choice", list(range(*args))
        if kind == "choice" and not args:
            raise ConfigError(f"{item!r}: an empty choice")
        if kind != "choice" and (len(args) != 2 or not all(isinstance(a, (int, float)) for a in args)
                                 or not args[0] < args[1] or (kind == "loguniform" and args[0] <= 0)):
            raise ConfigError(f"{item!r}: {kind}(lo,hi) takes two numbers, lo < hi" +
                              (", lo > 0" if kind == "loguniform" else ""))
        if key.strip() in space:
            raise ConfigError(f"`{key.strip()}` is searched twice")
        space[key.strip()] = Dim(kind, args)
    return plain, space


def param_space(space: Dict[str, Dim], search: str) -> Dict[str, Any]:
    """Ray Tune's search space: a grid over the choices for ``grid``, else sampled choices."""
    from ray import tune
    out: Dict[str, Any] = {}
    for k, d in space.items():
        if d.kind == "choice":
            out[k] = tune.grid_search(d.args) if search == "grid" else tune.choice(d.args)
        else:
            lo, hi = d.args
            out[k] = {"uniform": tune.uniform, "loguniform": tune.loguniform, "randint": tune.randint}[d.kind](lo, hi)
    return out


def trial_overrides(values: Dict[str, Any]) -> List[str]:
    """A trial's sampled values as ``key=value`` overrides (JSON text: also YAML)."""
    return [f"{k}={json.dumps(v)}" for k, v in values.items()]


def trial_dirname(values: Dict[str, Any], index: int) -> str:
    """``00003-ppo.lr=0.001,seed=2``: the trial's number and values, safe as a folder name."""
    text = ",".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in values.items())
    return f"{index:05d}-" + re.sub(r"[^A-Za-z0-9_.,=+-]", "_", text)[:120]


def trial_stop_reason(sweep_dir: Optional[str]) -> str:
    """Why Tune stopped a trial: ``the sweep was stopped by SIGTERM`` when a signal to the sweep
    did (the sweep writes the signal's name in ``sweep_dir/.stopped_by_signal`` before it asks
    Tune to stop), else :data:`STOPPED_EARLY` (the scheduler's decision)."""
    try:
        with open(os.path.join(sweep_dir or "", STOP_FILE)) as f:
            name = f.read().strip()
    except OSError:
        return STOPPED_EARLY
    return f"{SWEEP_STOPPED} {name}" if re.fullmatch(r"SIG[A-Z]+", name) else STOPPED_EARLY


class TuneReport:
    """A reporter for a trial's run: each row's numbers to Ray Tune (``tune.report``). When Tune
    stops the trial, ``tune.report`` raises SystemExit in the trial's thread: the run then stops
    the flowkit way (checkpoint, result.json) with the reason (:func:`trial_stop_reason`: the
    scheduler, or a signal to the sweep in ``sweep_dir``), while :class:`_FinishRun` keeps the
    trial's actor alive."""

    def __init__(self, sweep_dir: Optional[str] = None):
        self.sweep_dir = sweep_dir

    def flowkit_report(self, result: Dict[str, Any], ctx: Any) -> None:
        from ray import tune
        from ray.train._internal.session import get_session

        from flowkit.loggers import numeric
        try:
            tune.report({k: result[k] for k in numeric(result)})  # ints stay ints (the table, tune_results.csv)
        except SystemExit:
            session = get_session()
            if session is not None:  # Tune's closing report of the function: nobody would read it
                session.pause_reporting()
            ctx.request_stop(trial_stop_reason(self.sweep_dir))


class _FinishRun:
    """Mixed into the trials' Tune trainable: when Tune stops a trial (the scheduler's decision,
    the sweep's end), ``cleanup`` waits up to ``FINISH_S`` for the run to end (final
    checkpoint, result.json, plot); Ray's own cleanup does not wait for the trial's thread, and
    the actor, with that thread, ends right after it. (When the sweep itself ends, Ray 2.x kills
    actors still stopping after 10 s.)"""
    FINISH_S = 120.0

    def setup(self, *args: Any, **kwargs: Any) -> None:
        """In the trial's process (its main thread): SIGINT, SIGTERM and SIGHUP are the sweep's
        to act on (a signal to the sweep's process group reaches the trials too)."""
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                signal.signal(sig, signal.SIG_IGN)
        super().setup(*args, **kwargs)  # type: ignore[misc]

    def cleanup(self) -> None:
        from ray.train._internal.session import get_session
        s = get_session()
        if s is not None and s.training_started:
            s.finish(timeout=self.FINISH_S)  # the thread's blocked tune.report raises SystemExit(0)
        super().cleanup()  # type: ignore[misc]  # FunctionTrainable.cleanup, after this class in the MRO


def run_trial(values: Dict[str, Any], base: List[str], files: List[str], sweep_dir: str, extra: List[str]) -> None:
    """One trial (runs in a Ray Tune trial actor): ``flowkit.train`` with the base overrides,
    ``extra`` (resource adjustments) and the trial's values, in ``sweep_dir/<trial>``. Prints
    nothing: the sweep's driver has shown the config's warnings once (``describe_plan``), and
    its table says how each trial ended."""
    import warnings

    from ray import tune

    from flowkit.engine import train
    warnings.filterwarnings("ignore", category=UserWarning, module=r"flowkit(\.|$)")  # this actor's process only
    run_dir = os.path.join(sweep_dir, trial_dirname(values, _index(tune.get_context().get_trial_id())))
    res = train(base + extra + trial_overrides(values) + [f"run.dir={run_dir}"], files or None, plugins=[TuneReport(sweep_dir)],
                verbose=False)  # the sweep's table says it
    if res.stop_reason.startswith("interrupted"):
        raise RuntimeError(f"trial {run_dir}: {res.stop_reason}")


run_trial.__mixins__ = (_FinishRun,)  # type: ignore[attr-defined]  # Ray's wrap_function subclasses these


def _index(trial_id: str) -> int:
    """The trial's number in Tune's id (``5f2c1_00003`` -> 3)."""
    tail = (trial_id or "").rpartition("_")[2]
    return int(tail) if tail.isdigit() else 0


def plan_resources(cfg: Any, cluster_cpus: float) -> Tuple[Any, List[str], str]:
    """``(resources, overrides, text)``: a trial's resources (a dict, or a
    PlacementGroupFactory for the Ray backend), the overrides that make it fit the cluster, and
    the first line's words."""
    from ray import tune
    rt = cfg.runtime
    if rt.backend == "local":
        return {"CPU": 1}, [], "1 CPU each (runtime.backend=local: sampling and learning in the trial)"
    nw, per = max(1, int(rt.num_workers)), float(rt.num_cpus_per_worker)
    extra: List[str] = []
    if 1 + nw * per > cluster_cpus:
        per = max(0.0, (cluster_cpus - 1) / nw)
        extra = [f"runtime.num_cpus_per_worker={per:g}"]
    bundles: List[Dict[str, float]] = [{"CPU": 1.0}] + ([{"CPU": per}] * nw if per > 0 else [])
    pgf = tune.PlacementGroupFactory(bundles)
    note = f" (runtime.num_cpus_per_worker scaled to {per:g} to fit {cluster_cpus:g} CPUs)" if extra else ""
    return pgf, extra, f"{1 + nw * per:g} CPUs each: 1 learner + {nw} rollout workers x {per:g} CPU{note}"


def _format(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def results_table(rows: List[Dict[str, Any]], cols: List[str]) -> str:
    """The rows as a fixed-width text table with a header."""
    w = {c: max(len(c), *(len(_format(r.get(c, ""))) for r in rows)) for c in cols}
    lines = ["  ".join(c.ljust(w[c]) for c in cols).rstrip()]
    lines += ["  ".join(_format(r.get(c, "")).ljust(w[c]) for c in cols).rstrip() for r in rows]
    return "\n".join(lines)


# the columns of a run's result rows (flowkit.core.context: make_result, evaluate) that Tune can
# rank by; per-policy, learner, custom and perf columns have a `/` in their names
METRICS = ("episode_return_mean", "episode_len_mean", "env_steps_sampled", "env_steps_trained",
           "agent_steps_sampled", "agent_steps_trained", "episodes_this_iter", "episodes_total", "num_updates",
           "num_worker_restarts", "iteration", "time_total_s", "time_this_iter_s", "env_steps_per_s",
           "env_steps_trained_per_s", "evaluation_return_mean", "evaluation_return_std", "evaluation_len_mean")
MAX_TRIALS = 10_000


@dataclass
class TuneArgs:
    """``flowkit tune``: hyperparameter sweeps on Ray Tune; each trial is a flowkit run folder.
    Search space: key=choice(a,b) key=range(3) key=uniform(lo,hi) key=loguniform(lo,hi)
    key=randint(lo,hi); other key=value words are config overrides shared by every trial. The
    fields are its own ``key=value`` arguments."""
    metric: str = F("episode_return_mean", "result column to rank and stop by (one of METRICS, or a column "
                                           "with a '/' such as policy/<id>/episode_return_mean)")
    mode: str = F("max", "rank by the metric's max or min", choices=("max", "min"))
    search: str = F("grid", "grid: every combination of the choices and ranges; random; optuna (pip install "
                            "'flowkit[optuna]')", choices=("grid", "random", "optuna"))
    num_samples: Optional[int] = F(None, "grid: repeats of the grid (default 1); random/optuna: trials (default 10)",
                                   ge=1, le=MAX_TRIALS)
    scheduler: Optional[str] = F(None, "early stopping (default asha; none when only the seed is searched)",
                                 choices=("asha", "none"))
    grace_period: Optional[float] = F(None, "ASHA: env steps (iterations without stop.env_steps) before a trial "
                                            "may be stopped (default a tenth of the budget)", gt=0)
    max_concurrent: Optional[int] = F(None, "trials at once (default: as CPUs allow)", ge=1, le=MAX_TRIALS)


def main(paths: List[str], opts: Dict[str, Any], flags: Dict[str, Any], words: List[str]) -> int:
    """``flowkit tune`` (:func:`flowkit.cli._keyed` parses its words): ``opts`` the
    :class:`TuneArgs`, ``words`` the config's ``key=value`` words, searched or shared; ``flags``:
    ``config`` (``-c FILE``, several) and ``no_tuned``. Returns the exit status (module docstring).

    Raises:
        ConfigError: a ``metric`` that is not a result column, a bad searched value or override.
    """
    if opts["metric"] not in METRICS and "/" not in opts["metric"]:
        import difflib
        close = difflib.get_close_matches(opts["metric"], METRICS, n=1)
        raise ConfigError(f"metric={opts['metric']!r} is not a result column ({', '.join(METRICS[:3])}, ..., or a "
                          f"column with a '/' such as policy/<id>/episode_return_mean)"
                          + (f"; did you mean `{close[0]}`?" if close else ""))
    return _tune(SimpleNamespace(**opts, config_file=flags.get("config"), no_tuned=flags["no_tuned"],
                                 overrides=words + paths))


def _tune(a: SimpleNamespace) -> int:
    plain, space = parse_space(a.overrides)
    a.scheduler = a.scheduler or ("none" if set(space) == {"seed"} else "asha")  # seeds: a multirun, none stops
    if not space:
        raise ConfigError("nothing to search: give at least one key=choice(...), range(...), uniform(...), "
                          "loguniform(...) or randint(...)")
    n_grid = math.prod(len(d.args) for d in space.values() if d.kind == "choice") if a.search == "grid" else 1
    samples = a.num_samples or (1 if a.search == "grid" else 10)
    if n_grid * samples > MAX_TRIALS:
        raise ConfigError(f"{n_grid} grid points x {samples} samples = {n_grid * samples} trials, more than "
                          f"flowkit tune's {MAX_TRIALS}")
    cfg, files, tuned, sweep_dir = _check_sweep(a, plain, space)
    base = [o for o in plain if not o.startswith("run.dir=")]
    tuner = _tuner(a, cfg, space, base, files, sweep_dir, f"{n_grid * samples} trials ({a.search} search"
                   f"{f', {n_grid} grid points x {samples}' if a.search == 'grid' else ''}) of {cfg.algo} on "
                   f"{env_name(cfg.env)}{f', base {shown_path(tuned)}' if tuned else ''}", samples)
    with _stopping_on_signals(sweep_dir) as got:
        grid = tuner.fit()
    status = _report(grid, space, a, sweep_dir)
    if got:
        print(f"flowkit tune: stopped: interrupted ({signal.Signals(got[0]).name})", file=sys.stderr)
        return 128 + got[0]
    return status


def _check_sweep(a: SimpleNamespace, plain: List[str], space: Dict[str, Dim]) -> Tuple[Any, List[str], Optional[str], str]:
    """``(config, config files, tuned config or None, sweep folder)``, every searched value and
    the first trial's plan checked (nothing started)."""
    files = [os.path.abspath(f) for f in a.config_file or []]  # trials may run elsewhere
    pm = get_plugin_manager(plugin_modules_from(plain, files))
    cfg, found, tuned = build_tuned(plain, files, a.no_tuned, pm)
    files = found or []
    for k, d in space.items():  # every searched key and value must make a valid config
        for v in d.args if d.kind == "choice" else d.args[:1]:
            build_config(plain + trial_overrides({k: v}), files, pm.config_sections())
    from flowkit.engine import describe_plan  # the first trial as `flowkit train --dry-run` sees it (env probed)
    describe_plan(plain + trial_overrides({k: d.args[0] for k, d in space.items()}), files)
    if a.search == "optuna":
        import importlib.util
        if importlib.util.find_spec("optuna") is None:
            raise ConfigError("search=optuna needs the optuna package (pip install 'flowkit[optuna]')")
    sweep_dir = os.path.abspath(cfg.run.dir or os.path.join(
        "runs", f"tune-{cfg.algo}-{env_name(cfg.env).replace(':', '_').replace('/', '_')}-"
                f"{time.strftime('%Y%m%d-%H%M%S')}"))
    if os.path.exists(os.path.join(sweep_dir, "tune_results.csv")) or os.path.isdir(os.path.join(sweep_dir, "tune")):
        raise ConfigError(f"run.dir={shown_path(sweep_dir)} holds an earlier sweep (tune_results.csv or tune/); "
                          "give a new run.dir")
    return cfg, files, tuned, sweep_dir


def _tuner(a: SimpleNamespace, cfg: Any, space: Dict[str, Dim], base: List[str], files: List[str],
           sweep_dir: str, what: str, samples: int) -> Any:
    """Ray started, the trials fitted to it (the sweep's first line printed), and Ray Tune's
    ``Tuner`` of the sweep."""
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # Tune's console output off (verbose=0): our table instead
    import ray
    from omegaconf import DictConfig, OmegaConf
    from ray import tune

    from flowkit import _ray
    _ray.start(typing.cast(DictConfig, OmegaConf.merge(cfg, {"runtime": {"backend": "ray"}})))
    _ray.wait()
    cpus = float(ray.cluster_resources().get("CPU", 1))
    resources, extra, res_text = plan_resources(cfg, cpus)
    if "progress" in cfg.run.reporters:  # trials' progress bars would interleave in the sweep's output
        extra.append(f"run.reporters=[{','.join(r for r in cfg.run.reporters if r != 'progress')}]")
    per_trial = resources["CPU"] if isinstance(resources, dict) else sum(b.get("CPU", 0) for b in resources.bundles)
    at_once = max(1, int(cpus // per_trial)) if per_trial else None
    if a.max_concurrent:
        at_once = min(at_once or a.max_concurrent, a.max_concurrent)
    print(f"flowkit tune: {what}; trial resources: {res_text}; up to {at_once} at once on {cpus:g} CPUs; "
          f"{a.scheduler} early stopping on {a.metric} ({a.mode}); run folders in {sweep_dir}", flush=True)
    scheduler = None
    if a.scheduler == "asha":
        from ray.tune.schedulers import ASHAScheduler
        by_steps = cfg.stop.env_steps is not None
        budget = int(cfg.stop.env_steps if by_steps else (cfg.stop.iterations or 1000))
        # max_t past the budget: a trial that reaches its budget ends by its own stop condition
        scheduler = ASHAScheduler(time_attr="env_steps_sampled" if by_steps else "training_iteration",
                                  max_t=4 * budget, grace_period=a.grace_period or max(1, budget // 10))
    search_alg = None
    if a.search == "optuna":
        from ray.tune.search.optuna import OptunaSearch
        search_alg = OptunaSearch()
    trainable = tune.with_resources(tune.with_parameters(run_trial, base=base, files=files, sweep_dir=sweep_dir,
                                                         extra=extra), resources)
    os.makedirs(sweep_dir, exist_ok=True)
    return tune.Tuner(
        trainable, param_space=param_space(space, a.search),
        tune_config=tune.TuneConfig(metric=a.metric, mode=a.mode, num_samples=samples, scheduler=scheduler,
                                    search_alg=search_alg, max_concurrent_trials=a.max_concurrent),
        run_config=tune.RunConfig(name="tune", storage_path=sweep_dir, verbose=0,
                                  failure_config=tune.FailureConfig(fail_fast=False)))


@contextlib.contextmanager
def _stopping_on_signals(sweep_dir: str) -> Iterator[List[int]]:
    """While the sweep runs: the first SIGINT, SIGTERM or SIGHUP (listed in the yielded list)
    asks Ray Tune to end the sweep gracefully, by the SIGUSR1 it always listens to (Tune stops
    the trials: each run ends with its final checkpoint, its reason ``the sweep was stopped by
    SIGTERM``: the signal's name is written first in ``sweep_dir``, :func:`trial_stop_reason`);
    a second one raises KeyboardInterrupt at once. Ray's own SIGINT handler is kept off (it
    would make SIGINT differ from SIGTERM)."""
    got: List[int] = []

    def handle(signum: int, frame: Any) -> None:
        got.append(signum)
        if len(got) > 1:
            raise KeyboardInterrupt
        with contextlib.suppress(OSError):  # the trials' stop reason (a sweep folder that is gone: the scheduler's)
            with open(os.path.join(sweep_dir, STOP_FILE), "w") as f:
                f.write(signal.Signals(signum).name)
        os.kill(os.getpid(), signal.SIGUSR1)

    os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = "1"
    sigs = [s for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP) if signal.getsignal(s) != signal.SIG_IGN]
    prev = {s: signal.signal(s, handle) for s in sigs}
    try:
        yield got
    finally:
        for s, h in prev.items():
            signal.signal(s, h if h is not None else signal.SIG_DFL)


def _status(sweep_dir: str, run: str, error: Any) -> str:
    """``done`` (its own stop condition), ``stopped early`` (by the scheduler), ``stopped by
    SIGTERM`` (a signal to the sweep), ``error``, or ``no result.json`` (the trial's process
    ended before its run did)."""
    if error:
        return "error"
    try:
        with open(os.path.join(sweep_dir, run, "result.json")) as f:
            reason = json.load(f).get("stop_reason", "")
    except (OSError, ValueError):
        return "no result.json"
    if reason.startswith(SWEEP_STOPPED + " "):
        return "stopped by " + reason[len(SWEEP_STOPPED) + 1:]
    return "stopped early" if reason == STOPPED_EARLY else "done"


def _report(grid: Any, space: Dict[str, Dim], a: SimpleNamespace, sweep_dir: str) -> int:
    rows: List[Dict[str, Any]] = []
    for r in grid:
        m = r.metrics or {}
        values = {k: (r.config or {}).get(k) for k in space}
        tid = m.get("trial_id") or (re.findall(r"_([0-9a-f]{5}_\d{5})_", os.path.basename(r.path or "")) or [""])[0]
        run = trial_dirname(values, _index(tid))
        rows.append({"run": run, **values, a.metric: m.get(a.metric, float("nan")),
                     "env_steps_sampled": m.get("env_steps_sampled"), "iterations": m.get("iteration"),
                     "status": _status(sweep_dir, run, r.error)})
    sign = -1.0 if a.mode == "max" else 1.0
    rows.sort(key=lambda r: (not isinstance(r[a.metric], (int, float)) or math.isnan(r[a.metric]),
                             sign * r[a.metric] if isinstance(r[a.metric], (int, float)) else 0.0))
    runs = sorted(d for d in os.listdir(sweep_dir) if re.match(r"\d{5}-", d))
    cols = ["run", *space, a.metric, "env_steps_sampled", "iterations", "status"]
    print(results_table(rows, cols))
    for r in grid:
        if r.error:
            print(f"error in {os.path.basename(r.path or '?')}: {str(r.error).strip().splitlines()[-1][:300]}")
    with open(os.path.join(sweep_dir, "tune_results.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, cols)
        w.writeheader()
        w.writerows(rows)
    print(f"{len(rows)} trials, {len(runs)} run folders in {sweep_dir} (table: tune_results.csv); "
          f"flowkit plot {sweep_dir} draws them")
    return 1 if any(r["status"] not in ("done", "stopped early") for r in rows) else 0
