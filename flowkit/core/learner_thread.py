"""A learner thread on the driver and the operators that connect it to a dataflow.

After IMPALA (Espeholt et al. 2018, arXiv 1802.01561, section 3) and *RLlib Flow* (Liang, Wu
et al. 2021, arXiv 2011.12719, figure 3): rollouts arrive asynchronously, the driver pushes
them into the learner thread's input queue (:func:`Enqueue`), the thread trains on them, and
a second branch of the plan takes its results from the output queue (:func:`Dequeue`).
Updated weights go back only to the workers whose batches were consumed
(:class:`PushWeightsToSource`).

Waiting sources never spin: :func:`Enqueue` on a full queue and :func:`Dequeue` on an empty
one block for ``wait_s`` seconds (``queue.put``/``queue.get`` with a timeout) and then yield
NOT_READY so the other branches of a union get their turn. Both check the thread's liveness:
if the learner thread crashed, its exception is re-raised in the driver with the thread's
original traceback and a note naming the learner thread.

Weights versions: the learner thread counts its SGD updates (``num_updates``); weights sent
to a worker carry that count, the worker stamps it on every batch it samples
(``batch.meta["weights_version"]``), and the **policy lag** of a fragment is
``num_updates (when training on it starts) - weights_version`` (learner updates between the
weights it was sampled with and the weights it trains).
"""
from __future__ import annotations

import collections
import os
import queue
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np

from flowkit.core import batch as sb
from flowkit.core.flow import NOT_READY, Flow


def weights_versions(b: sb.MultiAgentBatch) -> List[int]:
    """The weights version of every worker fragment in ``b`` (``meta["weights_version"]``
    is an int for one fragment and a (nested) list once batches were concatenated)."""
    out: List[int] = []

    def walk(v: Any) -> None:
        if isinstance(v, (list, tuple)):
            for x in v:
                walk(x)
        elif v is not None:
            out.append(int(v))
    walk(b.meta.get("weights_version"))
    return out


class LearnerThread(threading.Thread):
    """Trains the learner policies on batches taken from ``inqueue``; puts one result dict per
    train batch into ``outqueue``.

    Args:
        ctx: the RunContext (``ctx.learner``, ``ctx.trainable_policies``, ``ctx.config``).
        train_fn: ``train_fn(policy, SampleBatch) -> stats dict`` (the algorithm's update:
            epochs, minibatches). It runs in this thread while holding ``policy.update_lock``
            when the policy has one, so the driver never reads half-updated weights.
        policy_ids: policies this thread trains (default: every trainable one).
        inqueue_size: train batches waiting at most (back-pressure on the driver).
        outqueue_size: results waiting at most for the Dequeue branch.
        name: thread name (shown in errors).

    Output items (``outqueue``): ``{"env_steps": int, "agent_steps": int, "num_updates": int
    (SGD steps this batch), "stats": {policy_id: stats}, "policy_lag": [int per fragment],
    "learn_time_s": float}``.

    :meth:`step` is the same update, called in the current thread: a bulk-synchronous plan
    drives the same learner without starting the thread.
    """

    def __init__(self, ctx: Any, train_fn: Callable[[Any, sb.SampleBatch], Dict[str, float]],
                 policy_ids: Optional[Sequence[str]] = None, inqueue_size: int = 2,
                 outqueue_size: int = 64, name: str = "LearnerThread"):
        super().__init__(name=name, daemon=True)
        if inqueue_size < 1:
            raise ValueError(f"LearnerThread: inqueue_size must be >= 1, got {inqueue_size}")
        self.ctx, self.train_fn = ctx, train_fn
        self.policy_ids = list(policy_ids) if policy_ids is not None else None
        self.inqueue: "queue.Queue[sb.MultiAgentBatch]" = queue.Queue(maxsize=int(inqueue_size))
        self.outqueue: "queue.Queue[Dict[str, Any]]" = queue.Queue(maxsize=int(outqueue_size))
        self.num_updates = 0              # SGD steps applied (the weights version)
        self.env_steps_trained = 0
        self.busy_s = 0.0                 # seconds spent training (throughput)
        self.error: Optional[BaseException] = None
        self._stop_event = threading.Event()
        self._state_lock = threading.Lock()
        self._weights_cache: Optional[tuple] = None

    # ---- the update (shared by the thread and bulk-sync plans) --------------------------
    def step(self, b: sb.MultiAgentBatch) -> Dict[str, Any]:
        """Train on one train batch; returns the result dict described above."""
        ctx = self.ctx
        t0 = time.perf_counter()
        lag = [self.num_updates - v for v in weights_versions(b)]
        stats: Dict[str, Dict[str, float]] = {}
        n_updates = 0
        agent_steps = 0
        for pid, pb in b.policy_batches.items():
            if self.policy_ids is not None and pid not in self.policy_ids:
                continue
            if pid not in ctx.trainable_policies or len(pb) == 0:
                continue
            pol = ctx.learner[pid]
            before = pol.num_updates
            lock = getattr(pol, "update_lock", None)
            if lock is not None:
                with lock:
                    st = dict(self.train_fn(pol, pb))
            else:
                st = dict(self.train_fn(pol, pb))
            n_updates = max(n_updates, pol.num_updates - before)
            agent_steps += len(pb)
            if lag:
                st["policy_lag_mean"] = float(np.mean(lag))
                st["policy_lag_max"] = float(np.max(lag))
            stats[pid] = st
        dt = time.perf_counter() - t0
        with self._state_lock:
            self.num_updates += n_updates
            self.env_steps_trained += b.env_steps
            self.busy_s += dt
        return {"env_steps": b.env_steps, "agent_steps": agent_steps, "num_updates": n_updates,
                "stats": stats, "policy_lag": lag, "learn_time_s": dt}

    # ---- the thread ------------------------------------------------------------------------
    def ensure_started(self) -> None:
        """Start the thread (once); plans call this on their first pull, so describing a plan
        starts nothing."""
        if not self.is_alive() and self.ident is None:
            self.start()

    def run(self) -> None:
        try:
            while not self._stop_event.is_set():
                try:
                    b = self.inqueue.get(timeout=0.1)
                except queue.Empty:
                    continue
                out = self.step(b)
                while not self._stop_event.is_set():
                    try:
                        self.outqueue.put(out, timeout=0.1)
                        break
                    except queue.Full:
                        continue
        except BaseException as e:  # surfaced in the driver by check_alive()
            self.error = e

    def check_alive(self) -> None:
        """Raise the learner thread's exception (its own type, message and traceback) if it
        crashed; RuntimeError if it stopped otherwise while still in use."""
        if self.error is not None:
            e = self.error
            note = f"[flowkit] raised in the learner thread ({self.name})"
            if note not in getattr(e, "__notes__", []):
                e.add_note(note)
            raise e  # the same object: its traceback from the learner thread is kept
        if self.ident is not None and not self.is_alive() and not self._stop_event.is_set():
            raise RuntimeError(f"the learner thread ({self.name}) is not running")

    def stop(self, timeout_s: float = 5.0) -> None:
        """Ask the thread to finish its current batch and end; wait up to ``timeout_s``."""
        self._stop_event.set()
        if self.ident is not None and self.is_alive() and threading.current_thread() is not self:
            self.join(timeout_s)

    # ---- weights ---------------------------------------------------------------------------
    def get_weights(self) -> tuple:
        """``(version, {policy_id: weights})`` of the trained policies, consistent (taken
        under each policy's ``update_lock``), cached per version. The version is read first,
        so it never exceeds the weights' true update count (policy lag is never understated)."""
        version = self.num_updates
        cache = self._weights_cache
        if cache is not None and cache[0] == version:
            return cache
        pids = self.policy_ids if self.policy_ids is not None else list(self.ctx.learner)
        w = self.ctx.get_weights(pids)
        self._weights_cache = (version, w)
        return self._weights_cache

    # ---- state (checkpoints) -----------------------------------------------------------------
    def get_state(self) -> Dict[str, Any]:
        with self._state_lock:
            return {"num_updates": self.num_updates, "env_steps_trained": self.env_steps_trained}

    def set_state(self, state: Dict[str, Any]) -> None:
        """Restore the update count; the workers' first weights then carry it as their
        version (no policy-lag spike after a resume)."""
        with self._state_lock:
            self.num_updates = int(state.get("num_updates", 0))
            self.env_steps_trained = int(state.get("env_steps_trained", 0))
            self._weights_cache = None
        workers = getattr(self.ctx, "workers", None)
        if workers is not None and hasattr(workers, "weights_version"):
            workers.weights_version = self.num_updates


# ---- operators ------------------------------------------------------------------------------
def Enqueue(flow: Flow, learner: LearnerThread, wait_s: float = 0.01) -> Flow:
    """Put every item of ``flow`` (train batches) into ``learner.inqueue``.

    When the queue is full the item is kept (never dropped), the operator blocks up to
    ``wait_s`` seconds and then yields NOT_READY; the next pull retries the same item before
    taking a new one from upstream (back-pressure). Yields each batch once it is queued.

    Raises:
        the learner thread's own exception if it crashed (see :meth:`LearnerThread.check_alive`).
    """
    ctx = flow.ctx

    def gen():
        learner.ensure_started()
        for x in flow:
            if x is NOT_READY:
                learner.check_alive()
                yield x
                continue
            while True:
                learner.check_alive()
                try:
                    learner.inqueue.put(x, timeout=wait_s)
                    break
                except queue.Full:
                    ctx.counters["learner_queue_full"] += 1
                    yield NOT_READY
            yield x
    return Flow(gen, "Enqueue(learner inqueue)", [flow], ctx)


def Dequeue(learner: LearnerThread, ctx: Any, wait_s: float = 0.005) -> Flow:
    """The learner thread's results, one per train batch: counts ``env_steps_trained``,
    ``agent_steps_trained`` and ``num_updates``, stores learner stats, and refreshes the
    ``perf/*`` figures (:class:`PerfMonitor`). Blocks up to ``wait_s`` seconds when nothing is
    ready, then yields NOT_READY.

    Raises:
        the learner thread's own exception if it crashed.
    """
    perf = PerfMonitor(ctx, learner)

    def gen():
        learner.ensure_started()
        while True:
            try:
                out = learner.outqueue.get(timeout=wait_s)
            except queue.Empty:
                learner.check_alive()
                yield NOT_READY
                continue
            yield record_learner_result(ctx, out, perf)
    return Flow(gen, "Dequeue(learner outqueue)", (), ctx)


def record_learner_result(ctx: Any, out: Dict[str, Any], perf: Optional["PerfMonitor"] = None
                          ) -> Dict[str, Any]:
    """Count a learner result into ``ctx`` (driver thread only) and return the train step
    item ``{"stats": ..., "env_steps": ..., ...}``."""
    ctx.counters["env_steps_trained"] += out["env_steps"]
    ctx.counters["agent_steps_trained"] += out["agent_steps"]
    ctx.counters["num_updates"] += out["num_updates"]
    for pid, st in out["stats"].items():
        ctx.learner_stats[pid] = st
    if perf is not None:
        perf.update()
    return out


class PushWeightsToSource:
    """On ``(source actor, batch)`` items: every ``broadcast_interval`` batches from one
    worker, send that worker the learner's newest weights (if it does not have them yet),
    with its next sample request (one call, not two).
    Every worker whose fragment is consumed gets its update, not only the last one of a
    train batch. Outputs the batch alone.

    Args:
        ctx: the RunContext (``ctx.workers.sync_weights``).
        learner: where weights and their version come from (``get_weights() -> (version,
            weights)``).
        broadcast_interval: batches of one worker between two pushes to it (>= 1).
    """

    def __init__(self, ctx: Any, learner: Any, broadcast_interval: int = 1):
        if broadcast_interval < 1:
            raise ValueError(f"PushWeightsToSource: broadcast_interval must be >= 1, got {broadcast_interval}")
        self.ctx, self.learner, self.every = ctx, learner, int(broadcast_interval)
        self.counts: Dict[int, int] = collections.defaultdict(int)
        self.sent: Dict[int, tuple] = {}   # worker index -> (actor, version sent)
        self.name = f"PushWeightsToSource(broadcast_interval={self.every})"

    def __call__(self, item: Any) -> sb.MultiAgentBatch:
        actor, b = item
        i = getattr(actor, "index", -1)
        self.counts[i] += 1
        if self.counts[i] >= self.every:
            self.counts[i] = 0
            version, weights = self.learner.get_weights()
            last = self.sent.get(i)
            if last is None or last[0] is not actor or last[1] != version:
                with self.ctx.timers["push_weights"]:
                    self.ctx.workers.sync_weights(weights, actors=[actor], version=version,
                                                  with_next_sample=True)
                self.sent[i] = (actor, version)
                self.ctx.counters["num_weight_pushes"] += 1
        return b


# ---- performance figures ----------------------------------------------------------------------
_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def process_cpu_s(pid: int) -> Optional[float]:
    """User + system CPU seconds of process ``pid`` (Linux ``/proc``; None elsewhere or when
    the process is not on this machine)."""
    if pid == os.getpid():
        t = os.times()
        return t.user + t.system
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _CLK_TCK
    except (OSError, IndexError, ValueError):
        return None


class PerfMonitor:
    """Sets ``ctx.extra_metrics`` (merged into every result) at most every ``period_s``
    seconds:

    - ``perf/learner_queue_size``: train batches waiting in the learner's inqueue (mean over
      the train steps of the period);
    - ``perf/learner_throughput_env_steps_per_s``: env steps trained per second of the
      learner's busy time (its capacity) and ``perf/learner_busy_frac`` (busy time / wall);
    - ``perf/cpu_util_driver``: CPU seconds of the driver process (all its threads) per wall
      second (1.0 = one core busy);
    - ``perf/cpu_util_workers``: the same, mean over rollout worker processes (Ray workers on
      this machine; absent on the local backend, where workers run in the driver).
    """

    def __init__(self, ctx: Any, learner: Optional[LearnerThread] = None, period_s: float = 1.0):
        self.ctx, self.learner, self.period_s = ctx, learner, float(period_s)
        self._t: Optional[float] = None
        self._cpu: Dict[int, Optional[float]] = {}
        self._pids: Optional[List[int]] = None
        self._restarts = 0
        self._busy = 0.0
        self._trained = 0
        self._qsizes: List[int] = []

    def _worker_pids(self) -> List[int]:
        ws = self.ctx.workers
        if ws.backend != "ray":
            return []
        if self._pids is None or self._restarts != ws.num_restarts:
            self._restarts = ws.num_restarts      # a rebuilt worker is a new process
            try:
                self._pids = [int(p) for p in ws.foreach_worker("get_pid")]
            except Exception:
                self._pids = []
        return self._pids

    def _sample(self) -> Dict[int, Optional[float]]:
        pids = [os.getpid()] + [p for p in self._worker_pids() if p != os.getpid()]
        return {p: process_cpu_s(p) for p in pids}

    def update(self, force: bool = False) -> None:
        """Call once per train step; refreshes the figures every ``period_s`` seconds."""
        now = time.perf_counter()
        if self.learner is not None:
            self._qsizes.append(self.learner.inqueue.qsize())
        if self._t is None:
            self._t, self._cpu = now, self._sample()
            if self.learner is not None:
                self._busy, self._trained = self.learner.busy_s, self.learner.env_steps_trained
            return
        dt = now - self._t
        if dt < self.period_s and not force:
            return
        cpu = self._sample()
        m = self.ctx.extra_metrics
        me = os.getpid()
        if cpu.get(me) is not None and self._cpu.get(me) is not None:
            m["perf/cpu_util_driver"] = (cpu[me] - self._cpu[me]) / dt
        ws = [(cpu[p] - self._cpu[p]) / dt for p in cpu
              if p != me and cpu[p] is not None and self._cpu.get(p) is not None]
        if ws:
            m["perf/cpu_util_workers"] = float(np.mean(ws))
        if self.learner is not None:
            busy, trained = self.learner.busy_s, self.learner.env_steps_trained
            if busy > self._busy:
                m["perf/learner_throughput_env_steps_per_s"] = (trained - self._trained) / (busy - self._busy)
            m["perf/learner_busy_frac"] = (busy - self._busy) / dt
            m["perf/learner_queue_size"] = float(np.mean(self._qsizes)) if self._qsizes else 0.0
            self._qsizes = []
            self._busy, self._trained = busy, trained
        self._t, self._cpu = now, cpu
