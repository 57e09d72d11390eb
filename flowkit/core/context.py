"""The run context: what a plan, its operators and the engine share, as one typed dataclass.

Built by :func:`make_context` (the engine's set-up); plans add their learners
(:meth:`RunContext.add_learner`) and stateful parts (:meth:`RunContext.add_stateful`) to it.
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np
import torch
from omegaconf import DictConfig

from flowkit.config import ConfigError
from flowkit.core.encoders import SpaceError
from flowkit.core.flow import FlowContext
from flowkit.core.learner import Learner, LearnerGroup
from flowkit.core.metrics import Metrics, _means, returns_by_policy
from flowkit.core.policy import Policy
from flowkit.core.workers import PolicySpec, RolloutWorker, WorkerSet, derive_seed


def _snapshot(x: Any) -> Any:
    """``x`` (a state dict) with its torch tensors cloned; other leaves as they are."""
    if isinstance(x, dict):
        return {k: _snapshot(v) for k, v in x.items()}
    if type(x) in (list, tuple):
        return type(x)(_snapshot(v) for v in x)
    return x.detach().clone() if callable(getattr(x, "detach", None)) and callable(getattr(x, "clone", None)) else x


@dataclass(eq=False)
class RunContext(FlowContext):
    """Everything a plan needs.

    Attributes:
        config: the run's validated config.
        pm: the plugin manager.
        algorithms: ``{name: Algorithm}`` instances of the run.
        policy_specs: ``{policy_id: PolicySpec}``.
        policies: ``{policy_id: Policy}``, every driver-side policy (the learners' ones, and
            frozen or random policies that act but are trained by no learner).
        workers: the WorkerSet (actors start on first use).
        learners: ``{group name: Learner}`` added by the plan (:meth:`add_learner`).
        rng: the seeded Generator of minibatch order, shared by the learners.
        stateful: ``{name: object with get_state/set_state}`` reached by checkpoints and
            stopped at shutdown (:meth:`add_stateful`).
        counters: the flow's counters (``env_steps_sampled``, ``env_steps_trained``,
            ``agent_steps_*``, ...; see FlowContext); timers and current_actor likewise.
        metrics: the episode windows, learner stats and extra columns of the result rows
            (:class:`~flowkit.core.metrics.Metrics`).
        run_dir: the run folder; iteration, time_total_s (s), stop_reason (None while
            running), prefetch and config_warnings as named.
        output: see its own docstring (None unless handed in).
        warmup: one check per replay plan (:func:`~flowkit.core.ops.ReplayPlan`), true
            while fewer than its ``learning_starts`` env steps were sampled: while every check
            is true and nothing was trained,
            :func:`~flowkit.core.ops.StandardMetricsReporting` ends iterations on sampled
            batches (the replay warm-up reports and meets ``stop.*``).
    """

    config: DictConfig
    pm: Any
    algorithms: Dict[str, Any]
    policy_specs: Dict[str, PolicySpec]
    policies: Dict[str, Policy]
    workers: WorkerSet
    rng: np.random.Generator
    run_dir: Optional[str] = None
    prefetch: bool = False
    learners: Dict[str, Learner] = field(default_factory=dict)
    stateful: Dict[str, Any] = field(default_factory=dict)
    metrics: Metrics = field(default_factory=Metrics)
    iteration: int = 0
    time_total_s: float = 0.0
    stop_reason: Optional[str] = None
    config_warnings: List[str] = field(default_factory=list)
    warmup: List[Callable[[], bool]] = field(default_factory=list)
    _time_offset: float = 0.0
    _t_start: Optional[float] = None
    t_entry: Optional[float] = None  # when train() was called (perf_counter), for the phase times
    _eval_worker: Optional[RolloutWorker] = None
    output: Any = None
    """``run.output``'s writer (handed in by the engine: an operator with a ``name``, called with
    each sampled MultiAgentBatch, returning it without ``meta["raw"]``; ``wired`` set once a
    plan placed it): :func:`~flowkit.core.ops.ParallelRollouts` puts it right after the
    rollouts. None: the run records nothing."""

    @property
    def policy_ids(self) -> List[str]:
        return list(self.policy_specs)

    @property
    def trainable_policies(self) -> set:
        """Ids of the policies some learner updates."""
        return set().union(*(lr.trainable for lr in self.learners.values()))

    def add_stateful(self, name: str, obj: Any) -> Any:
        """Register an object with ``get_state``/``set_state`` (and optionally ``stop``) so
        checkpoints and shutdown reach it. Returns ``obj``.

        Raises:
            ValueError: another object is registered under ``name``.
        """
        if name in self.stateful and self.stateful[name] is not obj:
            raise ValueError(f"stateful object {name!r} registered twice")
        self.stateful[name] = obj
        return obj

    def add_learner(self, group: str, policy_ids: Sequence[str]) -> Learner:
        """The Learner of ``group`` over ``policy_ids`` (created once, registered as
        ``<group>/learner``). It trains those of them that have an optimizer and whose
        algorithm and spec are trainable."""
        if group in self.learners:
            return self.learners[group]
        pids = list(policy_ids)
        trainable = [p for p in pids if self.policies[p].optimizer is not None
                     and getattr(self.algorithms.get(self.policy_specs[p].algo), "trainable", True)
                     and getattr(self.policy_specs[p], "trainable", True)]
        pols = {p: self.policies[p] for p in pids}
        lc = self.config.learner
        if int(lc.num_learners) > 0:  # a group of learner processes (started on the first update)
            lr: Learner = LearnerGroup(group, pols, trainable, self.rng, {p: self.policy_specs[p] for p in pids},
                                       {p: self.policy_specs[p].model_config(self.config) for p in pids},
                                       int(lc.num_learners), float(lc.num_cpus_per_learner), str(lc.placement_strategy),
                                       str(lc.device), int(lc.num_threads), float(self.config.runtime.start_timeout_s))
        else:
            lr = Learner(group, pols, trainable, self.rng)
        self.learners[group] = lr
        return self.add_stateful(f"{group}/learner", lr)

    def get_weights(self, policy_ids: Optional[Sequence[str]] = None) -> Dict[str, Any]:
        """``{policy_id: weights}`` of the driver policies (default: all)."""
        return self._read(lambda pol: pol.get_weights(), policy_ids)

    def policy_states(self) -> Dict[str, Any]:
        """``{policy_id: Policy.get_state()}`` of every driver policy, its tensors (the optimizer's
        live state) copied under the learner's lock: a learner thread that goes on updating after
        the read changes nothing in it (a checkpoint's digest is of what it saves)."""
        return self._read(lambda pol: _snapshot(pol.get_state()))

    def _read(self, fn: Any, policy_ids: Optional[Sequence[str]] = None) -> Dict[str, Any]:
        """``{policy_id: fn(policy)}``, each learner's policies read under its update lock (never
        half-updated by its thread)."""
        pids = list(self.policies) if policy_ids is None else [p for p in policy_ids if p in self.policies]
        out = {}
        for lr in self.learners.values():
            with lr.lock:
                out.update({p: fn(lr.policies[p]) for p in pids if p in lr.policies})
        return {p: out[p] if p in out else fn(self.policies[p]) for p in pids}

    def _initial_weights(self) -> Dict[str, Any]:
        """The workers' first weights, with the learners' version (no policy-lag spike on resume)."""
        if self.learners:
            self.workers.weights_version = max(lr.num_updates for lr in self.learners.values())
        return self.get_weights(None)

    def _exploration_states(self, worker_index: int) -> Dict[str, Any]:
        """``{policy_id: exploration state}`` for a new worker ``worker_index``: the driver
        policy's :meth:`~flowkit.core.Policy.exploration_state` (restored on resume), as its
        algorithm's :meth:`~flowkit.Algorithm.worker_exploration_state` gives it to that
        worker (Ape-X: the worker's own epsilon); policies with nothing to send left out."""
        out = {}
        for pid, st in self._read(lambda pol: pol.exploration_state()).items():
            algo = self.algorithms.get(self.policy_specs[pid].algo)
            if algo is not None:
                st = algo.worker_exploration_state(pid, st, worker_index, self.workers.num_workers)
            if st:
                out[pid] = st
        return out

    def request_stop(self, reason: str) -> None:
        """Stop the run after the current iteration (from ``flowkit_on_train_result``);
        ``reason`` becomes the run's ``stop_reason``."""
        self.stop_reason = reason

    def make_result(self, dt: float, sampled: int, trained: int, n_items: int) -> Dict[str, Any]:
        """The next iteration's result row (:meth:`Metrics.make_row`)."""
        self.iteration += 1
        self.time_total_s = self.elapsed_s()
        return self.metrics.make_row(self.iteration, self.counters, self.workers.num_restarts, self.policy_ids,
                                     self.timers, self.time_total_s, dt, sampled, trained, n_items)

    def mark(self, phase: str) -> None:
        """Record ``time_<phase>_s`` (seconds since train() was called) when first reached."""
        key = f"time_{phase}_s"  # called for every sampled and trained batch: look up first
        if self.t_entry is not None and key not in self.metrics.extra:
            self.metrics.extra[key] = time.perf_counter() - self.t_entry

    def start_clock(self) -> None:
        self._t_start = time.perf_counter()

    def elapsed_s(self) -> float:
        """Seconds of training so far, a resumed run's earlier time included (0 before :meth:`start_clock`)."""
        return self._time_offset + (time.perf_counter() - self._t_start if self._t_start is not None else 0.0)

    def evaluate(self) -> Dict[str, Any]:
        """Greedy evaluation on the driver over ``evaluation.episodes`` episodes. An evaluation
        that raises (also a signal or a deadline that interrupts it) drops its worker: the next
        one starts with fresh envs."""
        ev = self.config.evaluation
        if self._eval_worker is None:
            self._eval_worker = RolloutWorker(self.config, -1, self.workers.num_workers, self.policy_specs,
                                              pm=self.pm, num_envs=max(1, min(int(ev.episodes), 8)))
        self._eval_worker.set_weights(self.get_weights(None), self.counters["num_updates"])
        self._eval_worker.set_exploration_state(self._exploration_states(-1))  # evaluation.explore=true: as training
        try:
            with self.timers["evaluate"]:
                eps = self._eval_worker.evaluate(int(ev.episodes), bool(ev.explore))
        except BaseException:  # interrupted (a signal, a deadline) or failed mid-episode: built anew next time
            worker, self._eval_worker = self._eval_worker, None
            with contextlib.suppress(Exception):
                worker.stop()
            raise
        rets = [e["return"] for e in eps]
        out = {"evaluation_return_mean": float(np.mean(rets)),
               "evaluation_return_std": float(np.std(rets)),
               "evaluation_len_mean": float(np.mean([e["length"] for e in eps])),
               "evaluation_episodes": len(eps)}
        if len(self.policy_specs) > 1:
            out.update({f"evaluation/{pid}/episode_return_mean": float(np.mean([r for r, _ in rs]))
                        for pid, rs in returns_by_policy(eps).items()})
        out.update({f"evaluation/{k}": v for k, v in _means(eps, "eval_metrics").items()})  # win_rate, ...
        return out

    def shutdown(self) -> None:
        for obj in self.stateful.values():
            stop = getattr(obj, "stop", None)
            if callable(stop):
                with contextlib.suppress(Exception):
                    stop()
        self.workers.stop()
        if self._eval_worker is not None:
            with contextlib.suppress(Exception):
                self._eval_worker.stop()


def make_context(config: DictConfig, pm: Any, algorithms: Dict[str, Any],
                 policy_specs: Dict[str, PolicySpec], run_dir: Optional[str] = None,
                 make_pm: Optional[Any] = None) -> RunContext:
    """The driver-side policies (on ``learner.device``), the unstarted WorkerSet and the
    context holding them (``make_pm``: builds the Ray workers' plugin managers, see
    :class:`WorkerSet`).

    Raises:
        ConfigError: ``learner.device`` is a CUDA device and torch sees none, or a policy's
            algorithm cannot take its spaces (a Tuple action space, a Text observation space:
            the :class:`~flowkit.core.SpaceError` of its encoder or action distribution).
    """
    seed = int(config.seed)
    device = config.learner.device
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"learner.device={device!r} but torch sees no CUDA device")
    policies = {}
    for pid, s in policy_specs.items():
        try:
            policies[pid] = s.policy_class(s.observation_space, s.action_space, s.config, s.model_config(config),
                                           device, derive_seed(seed, "learner", pid))
        except SpaceError as e:  # the env's spaces, not the config's values: before any worker starts
            raise ConfigError(f"policy {pid!r} ({s.algo or s.policy_class.__name__}) cannot be built for the "
                              f"env's spaces: {e}") from None
    rt = config.runtime
    off = all(getattr(a, "off_policy", False) for a in algorithms.values())
    remote = {pid: replace(s, policy_class=c) if (c := policies[pid].worker_policy_class()) else s
              for pid, s in policy_specs.items()} if config.runtime.backend == "ray" else None
    ctx = RunContext(config, pm, algorithms, policy_specs, policies,
                     WorkerSet(config, policy_specs, pm, remote_specs=remote, make_pm=make_pm),
                     np.random.default_rng(derive_seed(seed, "learner")), run_dir,
                     bool(off if rt.prefetch is None else rt.prefetch))
    ctx.workers.weights_fn = ctx._initial_weights
    ctx.workers.exploration_fn = ctx._exploration_states
    return ctx
