"""What a run reports: the figures it gathers between result rows (:class:`Metrics`: episode
windows, learner stats, extra columns), each iteration's result row made from them, and the
:class:`Result` of :func:`flowkit.train`."""
from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Any, Deque, Dict, List, Mapping, Sequence, Tuple

import numpy as np

from flowkit.core import batch as sb
from flowkit.core.flow import TimerStat

EPISODE_WINDOW = 20


def _window() -> Deque[float]:
    return collections.deque(maxlen=EPISODE_WINDOW)


def _mean(xs: Any) -> float:
    return float(np.mean(xs)) if len(xs) else float("nan")


def returns_by_policy(episodes: List[Dict[str, Any]]) -> Dict[str, List[Tuple[float, int]]]:
    """``{policy_id: [(return, episode length), ...]}``: every agent's return in ``episodes``
    (summaries with ``policy_returns``), grouped by the policy the agent played."""
    out: Dict[str, List[Tuple[float, int]]] = collections.defaultdict(list)
    for e in episodes:
        for pid, by_agent in e.get("policy_returns", {}).items():
            out[pid].extend((float(r), int(e["length"])) for r in by_agent.values())
    return dict(out)


def _means(episodes: List[Dict[str, Any]], field: str) -> Dict[str, float]:
    """``{k: mean}`` over the ``episodes``' ``e[field]`` dicts (custom metrics)."""
    vals: Dict[str, List[float]] = collections.defaultdict(list)
    for e in episodes:
        for k, v in e.get(field, {}).items():
            vals[k].append(v)
    return {k: float(np.mean(vs)) for k, vs in vals.items()}


@dataclass(eq=False)
class Metrics:
    """The figures a run gathers between two result rows (:attr:`RunContext.metrics`).

    Attributes:
        episode_window: returns of the last 20 episodes; ``len_window`` their lengths;
            ``policy_windows``: ``{policy_id: returns of its agents in their last 20 episodes}``.
        iter_episodes: this iteration's episode summaries (``custom/*`` columns).
        learner_stats: the latest stats per trained policy (``learner/<id>/<stat>`` columns).
        extra: columns merged into every row (``perf/*``, ``time_<phase>_s``).
    """

    episode_window: Deque[float] = field(default_factory=_window)
    len_window: Deque[float] = field(default_factory=_window)
    policy_windows: Dict[str, Deque[float]] = field(default_factory=lambda: collections.defaultdict(_window))
    iter_episodes: List[Dict[str, Any]] = field(default_factory=list)
    learner_stats: Dict[str, Dict[str, float]] = field(default_factory=dict)
    extra: Dict[str, Any] = field(default_factory=dict)

    def record_episodes(self, episodes: List[Dict[str, Any]]) -> None:
        """Add finished episodes' summaries (``return``, ``length``, ``policy_returns``) to the windows."""
        for e in episodes:
            self.episode_window.append(e["return"])
            self.len_window.append(e["length"])
            for pid, by_agent in e.get("policy_returns", {}).items():
                self.policy_windows[pid].extend(by_agent.values())
            self.iter_episodes.append(e)

    def make_row(self, iteration: int, counters: Mapping[str, int], num_restarts: int, policy_ids: Sequence[str],
                 timers: Mapping[str, TimerStat], time_total_s: float, dt: float, sampled: int, trained: int,
                 n_items: int) -> Dict[str, Any]:
        """The result row of iteration ``iteration`` (the columns: see
        :func:`flowkit.core.ops.StandardMetricsReporting`) from these figures, the run's
        ``counters``, its worker restarts, ``timers`` and ``time_total_s`` (s), and the
        iteration's ``dt`` seconds, env steps ``sampled`` and ``trained`` and ``n_items`` train
        steps; this iteration's episodes are then forgotten."""
        c, nan = counters, float("nan")
        r: Dict[str, Any] = {"iteration": iteration, **{k: int(c[k]) for k in (
            "env_steps_sampled", "env_steps_trained", "agent_steps_sampled", "agent_steps_trained")},
            "episode_return_mean": _mean(self.episode_window), "episode_len_mean": _mean(self.len_window),
            "episodes_this_iter": len(self.iter_episodes), "episodes_total": int(c["episodes_total"]),
            "num_updates": int(c["num_updates"]), "num_worker_restarts": int(num_restarts)}
        r.update({k: int(c[k]) for k in ("dataset_epochs", "dataset_rows_replayed") if k in c})  # offline runs
        if list(policy_ids) != [sb.DEFAULT_POLICY_ID]:  # multi-agent, or a policy not named "default"
            r.update({f"policy/{pid}/episode_return_mean": _mean(self.policy_windows.get(pid, ()))
                      for pid in policy_ids})
        r.update({f"learner/{pid}/{k}": v for pid, st in self.learner_stats.items() for k, v in st.items()})
        r.update({f"custom/{k}": v for k, v in _means(self.iter_episodes, "custom").items()})
        self.iter_episodes = []
        r.update(self.extra)
        r.update(time_total_s=time_total_s, time_this_iter_s=dt, env_steps_per_s=sampled / dt if dt > 0 else nan,
                 env_steps_trained_per_s=trained / dt if dt > 0 else nan)
        r.update({f"perf/{name}_time_ms": 1000.0 * t.mean_s for name, t in timers.items()})
        r["perf/train_steps_this_iter"] = n_items
        return r


class Result:
    """What :func:`flowkit.train` returns.

    Attributes:
        metrics: the last result row, plus the final evaluation if any (``{column: value}``,
            the columns of ``metrics.csv``; also written to ``result.json``).
        history: every row, in order (a resumed run: the rows kept up to its checkpoint, then
            the new ones).
        run_dir: the run folder.
        checkpoint: the last checkpoint folder, or None when none was written.
        stop_reason: why the run stopped, e.g. ``stop.env_steps=100000 reached`` or
            ``interrupted (SIGTERM)``.
        config: the resolved config (an OmegaConf DictConfig).
    """

    def __init__(self, metrics, history, run_dir, checkpoint, stop_reason, config):
        self.metrics, self.history, self.run_dir = metrics, history, run_dir
        self.checkpoint, self.stop_reason, self.config = checkpoint, stop_reason, config

    def __repr__(self) -> str:
        r = self.metrics.get("episode_return_mean")
        return (f"Result(stop_reason={self.stop_reason!r}, env_steps={self.metrics.get('env_steps_sampled')}, "
                f"episode_return_mean={r}, run_dir={self.run_dir!r})")
