"""``flowkit plot RUN_DIR... [x=env_steps|time] [metric=M] [out=FILE]``: learning curves of
several runs on one PNG, grouped by config.

Runs whose resolved configs (``config.yaml``) differ only in ``seed`` (and in ``run.dir``,
``run.reporters``, ``resume``) form one group: its curve is the mean over the runs (seeds), with
the range (min to max) shaded. Each run's series (``metrics.csv``: ``M`` against
``env_steps_sampled`` or ``time_total_s``, rows without ``M`` left out) is linearly interpolated
onto the group's grid, every x value of its runs; a point averages the runs whose series spans
it (column ``runs``: a run that stopped early, at a threshold or by a sweep's scheduler, leaves
the later points to the others).
Groups are labelled by the config keys that tell them apart: keys every group has whose values
differ (a key in only some groups, such as ``ppo.lr`` beside ``dqn.lr``, tells nothing more than
``algo``), at most :data:`MAX_LABEL_KEYS` of them (``algo`` and the env first), ``+N more`` for the
rest. The mean is drawn solid where every run of the group has data and dotted where only some do
(e.g. past the end of its shortest run: the mean of the runs that go on, as the ``runs`` column
of the CSV says); the console gives each group's figure at the last point all its runs reach. The plotted series are written beside
the PNG as CSV (same name, ``.csv``): ``group``, the x column (``env_steps_sampled`` or
``time_total_s``), ``M_mean, M_std, M_min, M_max`` and ``runs``. A folder without a
metrics.csv stands for the run folders below it (e.g. a ``flowkit tune`` sweep). Torch-free.
"""
from __future__ import annotations

import csv
import os
from dataclasses import dataclass
from typing import Any, Dict, List, Sequence, Tuple

from flowkit.config import F

X_COLUMNS = {"env_steps": "env_steps_sampled", "time": "time_total_s"}
FORMATS = ("png", "pdf", "svg")  # out='s suffix; matplotlib writes each without extra packages
IGNORED = ("seed", "run.dir", "run.reporters", "resume")
MAX_LABEL_KEYS = 3
_FIRST_KEYS = ("algo", "env.id", "env.factory")


def find_runs(paths: Sequence[str]) -> List[str]:
    """Run folders (holding metrics.csv) among ``paths`` and, for a folder that is not a run,
    below it (sorted). Raises FileNotFoundError when a path holds no run."""
    runs: List[str] = []
    for p in paths:
        if os.path.isfile(os.path.join(p, "metrics.csv")):
            runs.append(p)
            continue
        below = sorted(os.path.dirname(os.path.join(d, "metrics.csv")) for d, _, fs in os.walk(p) if "metrics.csv" in fs)
        if not below:
            raise FileNotFoundError(f"{p}: no run folder (metrics.csv) there or below")
        runs += below
    return list(dict.fromkeys(runs))


def run_config(run_dir: str) -> Dict[str, Any]:
    """A run's ``config.yaml`` as ``{dotted key: value}`` ({} when it has none; see
    :func:`flowkit.loggers.hyperparameters`).

    Raises:
        RunFolderError: the file is not plain YAML holding a mapping (a damaged run: exit 1;
            :func:`flowkit.config.read_yaml`).
    """
    from flowkit._trust import RunFolderError
    from flowkit.config import read_yaml
    from flowkit.loggers import hyperparameters
    path = os.path.join(run_dir, "config.yaml")
    # text only: nothing in it is resolved or called
    return hyperparameters(read_yaml(path, RunFolderError)) if os.path.exists(path) else {}


def group_runs(run_dirs: Sequence[str]) -> List[Tuple[str, List[str]]]:
    """``[(label, run folders)]``: runs with equal configs but for :data:`IGNORED` keys, in
    first-seen order; the label names the keys that differ between groups (or algo and env)."""
    cfgs = {r: {k: v for k, v in run_config(r).items() if k not in IGNORED} for r in run_dirs}
    groups: Dict[Tuple, List[str]] = {}
    for r, c in cfgs.items():
        groups.setdefault(tuple(sorted((k, repr(v)) for k, v in c.items())), []).append(r)
    firsts = [cfgs[rs[0]] for rs in groups.values()]
    shared = set.intersection(*(set(c) for c in firsts)) if firsts else set()
    keys = sorted((k for k in shared if any(c[k] != firsts[0][k] for c in firsts)),
                  key=lambda k: (_FIRST_KEYS.index(k) if k in _FIRST_KEYS else len(_FIRST_KEYS), k))
    if len(groups) > 1 and not keys:  # the groups differ only in keys some of them lack
        keys = sorted({k for c in firsts for k in c} - shared)
    more = len(keys) - MAX_LABEL_KEYS
    keys = keys[:MAX_LABEL_KEYS]
    out = []
    for rs in groups.values():
        c = cfgs[rs[0]]
        label = " ".join(f"{k}={c.get(k)}" for k in keys) + (f" +{more} more" if more > 0 else "") if keys else \
            f"{c.get('algo', '?')} {c.get('env.id') or c.get('env.factory') or ''}".strip()
        out.append((label or os.path.basename(rs[0]), rs))
    return out


def run_series(run_dir: str, x: str, metric: str) -> Tuple[List[float], List[float]]:
    """``(xs, ys)`` of one run's metrics.csv: rows that have both columns, x increasing."""
    from flowkit.reporters import read_metrics
    rows = [r for r in read_metrics(os.path.join(run_dir, "metrics.csv"))
            if isinstance(r.get(x), (int, float)) and isinstance(r.get(metric), (int, float))]
    rows.sort(key=lambda r: r[x])
    return [float(r[x]) for r in rows], [float(r[metric]) for r in rows]


def group_series(run_dirs: Sequence[str], x: str, metric: str) -> List[Dict[str, float]]:
    """The group's points ``{x, mean, std, min, max, runs}`` (see the module's docstring)."""
    import numpy as np
    series = [s for s in (run_series(r, x, metric) for r in run_dirs) if s[0]]
    if not series:
        return []
    points = []
    for g in sorted({v for xs, _ in series for v in xs}):
        c = np.array([np.interp(g, xs, vs) for xs, vs in series if xs[0] <= g <= xs[-1]])
        points.append({"x": g, "mean": float(c.mean()), "std": float(c.std()), "min": float(c.min()),
                       "max": float(c.max()), "runs": len(c)})
    return points


def plot_runs(paths: Sequence[str], x: str = "env_steps", metric: str = "episode_return_mean",
              out: str = "plot.png") -> Dict[str, List[Dict[str, float]]]:
    """Plot the runs under ``paths`` (see the module's docstring) to ``out`` (PNG, PDF or SVG, by
    its suffix) and write the series to ``out`` with ``.csv``. Returns ``{group label: points}``.

    Raises:
        ValueError: an unknown ``x``, or no run has ``metric``.
        FileNotFoundError: a path without a run.
        ConfigError: ``out``'s suffix is not one of :data:`FORMATS`, or ``out`` (or the CSV beside
            it) cannot be written there or would replace a run's own file (checked before any
            work; a ValueError).
        OutputError: writing failed (a full disk); the previous files are left as they were.
    """
    if x not in X_COLUMNS:
        raise ValueError(f"x= must be one of {', '.join(X_COLUMNS)}, got {x!r}")
    from flowkit._outputs import check_output, write_atomic
    csv_out, fmt = os.path.splitext(out)[0] + ".csv", os.path.splitext(out)[1].lower().lstrip(".")
    for path in dict.fromkeys((out, csv_out)):  # before any work (ConfigError: a ValueError)
        check_output(path, "out=")
    if fmt not in FORMATS:  # matplotlib would write PNG data under any other name
        from flowkit.config import ConfigError
        raise ConfigError(f"out={out!r}: the image format is taken from the suffix: .png, .pdf or .svg, got "
                          f"{'.' + fmt if fmt else 'none'}")
    xcol = X_COLUMNS[x]
    run_dirs = find_runs(paths)
    result = {label: group_series(rs, xcol, metric) for label, rs in group_runs(run_dirs)}
    result = {k: v for k, v in result.items() if v}
    if not result:
        from flowkit.config import did_you_mean
        from flowkit.reporters import read_metrics
        columns = {c for d in run_dirs for row in read_metrics(os.path.join(d, "metrics.csv")) for c in row}
        alias = {"episode_reward_mean": "episode_return_mean", "timesteps_total": "env_steps_sampled"}  # RLlib's
        hint = f"; did you mean `{alias[metric]}`?" if alias.get(metric) in columns else did_you_mean(metric, columns)
        raise ValueError(f"no run has both the column {metric!r} and {xcol!r} in its metrics.csv{hint}")
    from flowkit.reporters import _pyplot
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    for label, pts in result.items():
        xs = [p["x"] for p in pts]
        n = max(p["runs"] for p in pts)
        full = [p for p in pts if p["runs"] == n]
        (line,) = ax.plot([p["x"] for p in full], [p["mean"] for p in full],
                          label=f"{label} ({n} run{'s' if n > 1 else ''})")
        if len(full) < len(pts):  # where only some of the runs have data: their mean, dotted
            ax.plot(xs, [p["mean"] for p in pts], ":", color=line.get_color())
        ax.fill_between(xs, [p["min"] for p in pts], [p["max"] for p in pts], alpha=0.25)
    ax.set(xlabel=xcol.replace("_", " ") + (" (s)" if x == "time" else ""),
           ylabel=f"{metric} (mean; min-max shaded)")
    if any(p["runs"] < max(q["runs"] for q in pts) for pts in result.values() for p in pts):
        ax.set_title("dotted: where only some of a group's runs have data", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    try:  # each file through a temporary one: a full disk leaves the previous files as they were
        write_atomic(out, lambda tmp: fig.savefig(tmp, dpi=100, format=fmt), mkdirs=True)
    finally:
        plt.close(fig)

    def write_csv(tmp: str) -> None:
        with open(tmp, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["group", xcol, f"{metric}_mean", f"{metric}_std", f"{metric}_min", f"{metric}_max", "runs"])
            for label, pts in result.items():
                w.writerows([label, p["x"], p["mean"], p["std"], p["min"], p["max"], p["runs"]] for p in pts)
    write_atomic(csv_out, write_csv)
    return result


@dataclass
class PlotArgs:
    """``flowkit plot``: learning curves of several runs on one PNG, grouped by config: the seeds'
    mean, their range shaded; the series as CSV beside it. The fields are its ``key=value``
    arguments."""
    x: str = F("env_steps", "x axis", choices=tuple(X_COLUMNS))
    metric: str = F("episode_return_mean", "metrics.csv column")
    out: str = F("plot.png", "image to write, its format by its suffix (.png, .pdf, .svg); the CSV goes beside it")


def main(runs: List[str], a: Dict[str, Any], flags: Dict[str, bool], _: List[str]) -> int:
    """``flowkit plot``: ``runs`` (run folders or folders holding run folders) drawn as
    ``a`` (:class:`PlotArgs`) says, a line per group on stdout. Raises the errors of
    :func:`plot_runs` as the CLI's one-line errors (exit 1: a run's damaged file or an output
    that cannot be written; 2: what was given)."""
    from flowkit.config import ConfigError
    if not runs:
        raise ConfigError("give one or more run folders (RUN_DIR...)")
    try:
        res = plot_runs(runs, a["x"], a["metric"], a["out"])
    except (ValueError, FileNotFoundError) as e:  # a ConfigError (a run's damaged file: exit 1) as it is
        if isinstance(e, ConfigError):
            raise
        raise ConfigError(str(e)) from None
    for label, pts in res.items():
        n = max(p["runs"] for p in pts)
        last = [p for p in pts if p["runs"] == n][-1]  # the last point every run of the group reaches
        on = f"; {pts[-1]['runs']} of them go on to {pts[-1]['x']:.6g}" if pts[-1] is not last else ""
        print(f"{label}: {n} run{'s' if n > 1 else ''}, {a['metric']} {last['mean']:.4g} (min {last['min']:.4g}, "
              f"max {last['max']:.4g}) at {X_COLUMNS[a['x']]}={last['x']:.6g}{on}")
    print(f"wrote {a['out']} and {os.path.splitext(a['out'])[0]}.csv")
    return 0
