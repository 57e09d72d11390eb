"""The Learner: one per group of policies trained together, inline or in a background thread.

It owns the group's driver-side policies, the epochs x minibatches update loop, the gradient
step (backward, global-norm clipping, optimizer step on the policy's flat parameter buffer),
an update lock, versioned weights and learner stats. Plans reach it through one training
operator (:class:`flowkit.core.ops.TrainOneStep`) and one weight-sync operator
(:class:`flowkit.core.ops.SyncWeights`).

Thread mode (IMPALA, Espeholt et al. 2018, arXiv 1802.01561, section 3; *RLlib Flow*, Liang,
Wu et al. 2021, arXiv 2011.12719, figure 3): :meth:`Learner.start` runs :meth:`Learner.update`
in a daemon thread fed by a bounded in-queue (:meth:`put` blocks at most ``timeout`` seconds:
back-pressure on the driver) and emptied into an out-queue (:meth:`get`). A crash in the
thread is re-raised in the driver by :meth:`check_alive` with its own type and traceback and
a note naming the learner.

Weights versions: ``num_updates`` counts the SGD steps applied; weights sent to a worker
carry it, the worker stamps it on every batch it samples (``batch.meta["weights_version"]``),
and the **policy lag** of a fragment is ``num_updates`` when training on it starts minus its
weights version.
"""
from __future__ import annotations

import collections
import contextlib
import math
import queue
import threading
import time
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Tuple

import numpy as np
import torch

from flowkit.core import batch as sb
from flowkit.core.policy import Policy, flat_gradient


class NonFiniteError(FloatingPointError):
    """Training produced a non-finite loss term, gradient or weights; raised before the
    optimizer step (the message names the policy, the term and the update)."""


def weights_versions(b: sb.MultiAgentBatch) -> List[int]:
    """The weights version of every worker fragment in ``b`` (``meta["weights_version"]``
    is an int for one fragment and a (nested) list once batches were concatenated)."""
    def flat(v: Any) -> List[int]:
        return [x for y in v for x in flat(y)] if isinstance(v, (list, tuple)) else [] if v is None else [int(v)]
    return flat(b.meta.get("weights_version"))


def sequence_cuts(seq_lens: np.ndarray, rows: int) -> List[int]:
    """The first rows of contiguous chunks of whole sequences (``seq_lens`` int[k], in row order)
    of about ``rows`` rows each: a chunk ends at the first sequence end at or past ``rows`` rows."""
    ends = np.cumsum(seq_lens)
    cuts, start = [0], 0
    for e in ends[:-1].tolist():
        if e - start >= rows:
            cuts.append(e)
            start = e
    return cuts


def sequence_minibatches(tb: Dict[str, torch.Tensor], rows: int, rng: np.random.Generator
                         ) -> Iterator[Dict[str, torch.Tensor]]:
    """One epoch of shuffled minibatches of whole sequences from a prepared batch ``tb`` with
    ``seq_lens`` (a recurrent policy's: :meth:`Policy.sequence_columns`): the sequences in a
    random order, about ``rows`` rows a minibatch (``round(rows * k / B)`` sequences of the
    ``k`` in ``B`` rows, at least one), each minibatch's rows its sequences' rows in order and
    its ``seq_lens`` theirs."""
    lens = tb[sb.SEQ_LENS]
    k, n = len(lens), int(lens.sum())
    per = max(1, int(round(rows * k / max(n, 1))))
    perm = torch.from_numpy(rng.permutation(k)).to(lens.device)
    starts = torch.cumsum(lens, 0) - lens
    plens = lens[perm]
    # rows of the permuted sequences, in order: start of its sequence + offset inside it
    offsets = torch.arange(n, device=lens.device) - torch.repeat_interleave(torch.cumsum(plens, 0) - plens, plens)
    idx = torch.repeat_interleave(starts[perm], plens) + offsets
    shuffled = {key: v[idx] for key, v in tb.items() if key != sb.SEQ_LENS}
    bounds = torch.cumsum(plens, 0).tolist()
    for i in range(0, k, per):
        a = bounds[i - 1] if i else 0
        b = bounds[min(i + per, k) - 1]
        mb = {key: v[a:b] for key, v in shuffled.items()}
        mb[sb.SEQ_LENS] = plens[i:i + per]
        yield mb


class Learner:
    """Trains a group of policies.

    Args:
        name: the group name (registry names of its stateful parts start with it).
        policies: ``{policy_id: Policy}``, the driver-side copies (the workers get their
            weights through :meth:`get_weights`).
        trainable: the ids it updates (default: every policy with an optimizer).
        rng: numpy Generator for the minibatch order (seeded; shared by the run's learners).
        num_epochs: the update loop's passes over each train batch.
        minibatch_size: rows per minibatch (None: the whole batch, one step per epoch).
        contiguous: minibatches are contiguous slices, each prepared on its own
            (trajectories stay in order: IMPALA), instead of shuffled rows of the batch
            prepared once.
        num_minibatches: instead of ``minibatch_size``, split each epoch's shuffled rows into
            exactly this many minibatches (sizes differ by at most one row), whatever the
            batch's size: learners that step together (DD-PPO's, one per worker, batches cut
            short by preemption) take the same number of gradient steps.
        reducer: ``reducer(gradient float32[P], rows) -> gradient``, called between the
            backward pass and the optimizer step of every minibatch (``rows``: its row count;
            clipping and the step use what it returns): DD-PPO's all-reduce, the row-weighted
            mean of the gradients of a group of learners. None: the gradient as it is.

    A recurrent policy's minibatches are whole sequences (:func:`~flowkit.core.batch.sequence_lengths`
    with ``model.max_seq_len``): shuffled sequences (:func:`sequence_minibatches`), or contiguous
    chunks cut at sequence ends (:func:`sequence_cuts`); ``minibatch_size`` stays in rows.

    Result of :meth:`update` (also what the thread puts in its out-queue)::

        {"batch": MultiAgentBatch, "stats": {policy_id: mean stats}, "env_steps": int,
         "agent_steps": int, "num_updates": int (SGD steps of this batch),
         "policy_lag": [int per fragment], "learn_time_s": float}
    """

    def __init__(self, name: str, policies: Dict[str, "Policy"], trainable: Optional[Iterable[str]] = None,
                 rng: Optional[np.random.Generator] = None, num_epochs: int = 1,
                 minibatch_size: Optional[int] = None, contiguous: bool = False,
                 num_minibatches: Optional[int] = None,
                 reducer: Optional[Callable[[torch.Tensor, int], torch.Tensor]] = None):
        self.name, self.policies = name, dict(policies)
        self.trainable = ({p for p, pol in self.policies.items() if pol.optimizer is not None}
                          if trainable is None else set(trainable))
        self.rng = rng if rng is not None else np.random.default_rng(0)
        self.reducer = reducer
        self.configure(num_epochs, minibatch_size, contiguous, num_minibatches)
        self.lock = threading.RLock()     # held while updating; weights and state read under it
        self.num_updates = 0              # SGD steps applied: the weights version
        self.env_steps_trained = 0
        self.busy_s = 0.0                 # seconds spent updating (throughput)
        self.stats: Dict[str, Dict[str, float]] = {}
        self._weights_cache: Optional[Tuple[int, Dict[str, Any]]] = None
        self._thread: Optional[threading.Thread] = None
        self._stop_event = threading.Event()
        self.error: Optional[BaseException] = None
        self.inqueue: "queue.Queue[sb.MultiAgentBatch]" = queue.Queue(maxsize=2)
        self.outqueue: "queue.Queue[Dict[str, Any]]" = queue.Queue(maxsize=64)

    def configure(self, num_epochs: int = 1, minibatch_size: Optional[int] = None, contiguous: bool = False,
                  num_minibatches: Optional[int] = None) -> None:
        """Set the update loop (see the class docstring)."""
        if int(num_epochs) < 1:
            raise ValueError(f"Learner {self.name}: num_epochs must be >= 1, got {num_epochs}")
        if num_minibatches is not None and (int(num_minibatches) < 1 or contiguous):
            raise ValueError(f"Learner {self.name}: num_minibatches must be >= 1 and not contiguous, got "
                             f"{num_minibatches} (contiguous={contiguous})")
        self.num_epochs, self.minibatch_size, self.contiguous = int(num_epochs), minibatch_size, bool(contiguous)
        self.num_minibatches = None if num_minibatches is None else int(num_minibatches)

    def describe(self) -> str:
        """The update loop in words (shown in plans): ``num_epochs=10, minibatch_size=64``."""
        mode = ", contiguous" if self.contiguous else ""
        if self.num_minibatches is not None:
            return f"num_epochs={self.num_epochs}, num_minibatches={self.num_minibatches}"
        return f"num_epochs={self.num_epochs}, minibatch_size={self.minibatch_size}{mode}"

    # ---- the update ------------------------------------------------------------------------
    def update(self, b: sb.MultiAgentBatch) -> Dict[str, Any]:
        """Train every trainable policy of the group on its rows of ``b``."""
        return self._update(b, b.policy_batches.items(), self._train_policy)

    def _update(self, b: sb.MultiAgentBatch, items: Iterable[Tuple[str, Any]], fn: Any) -> Dict[str, Any]:
        """Run ``fn(pid, policy, x) -> (stats, sgd steps, rows) or None`` for each trainable
        ``(pid, x)`` of ``items`` under the update lock; count and time it."""
        t0 = time.perf_counter()
        lag = [self.num_updates - v for v in weights_versions(b)]
        stats: Dict[str, Dict[str, float]] = {}
        steps = agent_steps = 0
        with self.lock:
            for pid, x in items:
                if pid not in self.trainable or (out := fn(pid, self.policies[pid], x)) is None:
                    continue
                st, n, rows = out
                steps, agent_steps = steps + n, agent_steps + rows
                if lag:
                    st.update(policy_lag_mean=float(np.mean(lag)), policy_lag_max=float(np.max(lag)))
                stats[pid] = st
            self.num_updates += steps
            self.env_steps_trained += b.env_steps
            self.stats.update(stats)
        dt = time.perf_counter() - t0
        self.busy_s += dt
        return {"batch": b, "stats": stats, "env_steps": b.env_steps, "agent_steps": agent_steps,
                "num_updates": steps, "policy_lag": lag, "learn_time_s": dt}

    def _train_policy(self, pid: str, policy: "Policy", pb: sb.SampleBatch) -> Optional[Tuple[Dict[str, float], int, int]]:
        n = len(pb)
        if n == 0:
            return None
        nmb = self.num_minibatches
        if nmb is not None and nmb > n:
            raise ValueError(f"Learner {self.name}: policy {pid!r} has {n} rows for {nmb} minibatches")
        mbs = n if not self.minibatch_size else min(int(self.minibatch_size), n)
        if nmb is not None:
            mbs = -(-n // nmb)
        seq_len = policy.max_seq_len if getattr(policy, "is_recurrent", False) else None  # whole sequences
        if self.contiguous:
            cuts = (range(0, n, mbs) if seq_len is None else
                    sequence_cuts(sb.sequence_lengths(pb, seq_len), mbs))
            chunks = [policy.prepare_batch(pb.slice(s, min(s + mbs, n) if seq_len is None else e))
                      for s, e in zip(cuts, [*list(cuts)[1:], n])]
            tb = chunks[-1]
        else:  # shuffled minibatches are made per epoch when mbs < n
            tb = policy.prepare_batch(pb)
            chunks = [tb]
        max_norm = getattr(policy.config, "max_grad_norm", None)
        sums: Dict[str, float] = collections.defaultdict(float)
        steps = 0
        for _ in range(self.num_epochs):
            mbs_iter: Iterable[Dict[str, torch.Tensor]] = chunks
            if not self.contiguous and mbs < n and sb.SEQ_LENS in tb:
                mbs_iter = sequence_minibatches(tb, mbs, self.rng)
            elif not self.contiguous and mbs < n:  # one gather per epoch; minibatches are slices (views) of it
                perm = torch.from_numpy(self.rng.permutation(n)).to(policy.device)
                shuffled = {c: v[perm] for c, v in tb.items()}
                cuts = (np.linspace(0, n, nmb + 1).round().astype(int).tolist() if nmb is not None
                        else list(range(0, n, mbs)) + [n])
                mbs_iter = ({c: v[s:e] for c, v in shuffled.items()} for s, e in zip(cuts[:-1], cuts[1:]))
            for mb in mbs_iter:
                loss, st = policy.loss(mb)
                self._check_stats(pid, policy, st, steps)  # the stats are floats already: no sync
                if self.reducer is None:
                    norm = self.step(policy, loss, max_norm)
                else:
                    g = self.reducer(flat_gradient(policy._params, loss), len(next(iter(mb.values()))))
                    norm = self.apply_gradient(policy, g, max_norm)
                if not math.isfinite(norm):
                    raise self._non_finite(pid, policy, f"gradient (norm {norm})", steps)
                for k, v in st.items():
                    sums[k] += v
                if max_norm:
                    sums["grad_norm"] += norm
                steps += 1
        self._check_weights(pid, policy, steps)
        policy.num_updates += steps
        stats = {k: v / max(steps, 1) for k, v in sums.items()}
        stats.update(policy.on_train_batch_end(tb) or {})
        stats.update(train_batch_size=n, num_sgd_steps=steps)
        return stats, steps, n

    @staticmethod
    def step(policy: "Policy", loss: torch.Tensor, max_grad_norm: Optional[float] = None) -> float:
        """Backward, optional global-norm clipping, optimizer step over the policy's flat
        parameter buffer (:meth:`Policy.make_optimizer`). Returns the pre-clip gradient norm;
        a non-finite one is returned without a step (the weights stay as they were)."""
        return Learner.apply_gradient(policy, flat_gradient(policy._params, loss), max_grad_norm)

    @staticmethod
    def apply_gradient(policy: "Policy", g: torch.Tensor, max_grad_norm: Optional[float] = None) -> float:
        """One optimizer step with the flat gradient ``g`` (float32[P], in the order of the
        policy's flat buffer; clipped in place to global norm ``max_grad_norm``). Returns
        the pre-clip norm; a non-finite one is returned without a step."""
        n = torch.linalg.vector_norm(g)
        if not math.isfinite(norm := float(n)):
            return norm
        if max_grad_norm:
            g.mul_(torch.clamp(max_grad_norm / (n + 1e-6), max=1.0))
        policy._flat.grad = g
        policy.optimizer.step()  # type: ignore[union-attr]  # trainable policies have one
        return norm

    def apply_gradients(self, b: sb.MultiAgentBatch) -> Dict[str, Any]:
        """Apply gradients computed on a rollout worker (A3C, Mnih et al. 2016, algorithm
        S3: the asynchronous update of the shared parameters): ``b.meta["gradients"]`` is
        ``{policy_id: (float32[P] gradient, loss stats, rows)}`` (see
        :meth:`flowkit.core.workers.RolloutWorker.compute_gradients`); each trainable policy
        of the group takes one optimizer step (clipped as in :meth:`step`). Result as
        :meth:`update`.

        Raises:
            NonFiniteError: a non-finite loss term, gradient or resulting weights."""
        return self._update(b, b.meta.get("gradients", {}).items(), self._apply_worker_gradient)

    def _apply_worker_gradient(self, pid: str, policy: "Policy", item: Tuple[Any, Dict[str, float], int]
                               ) -> Tuple[Dict[str, float], int, int]:
        g, st, rows = item
        self._check_stats(pid, policy, st)
        norm = self.apply_gradient(policy, torch.as_tensor(np.array(g), device=policy.device),
                                   getattr(policy.config, "max_grad_norm", None))
        if not math.isfinite(norm):
            raise self._non_finite(pid, policy, f"gradient (norm {norm})")
        self._check_weights(pid, policy, 1)
        policy.num_updates += 1
        return {**st, "grad_norm": norm, "train_batch_size": rows, "num_sgd_steps": 1}, 1, int(rows)

    @staticmethod
    def _non_finite(pid: str, policy: "Policy", what: str, steps: int = 0) -> NonFiniteError:
        return NonFiniteError(f"policy {pid!r}: non-finite {what} at update {policy.num_updates + steps + 1}")

    def _check_stats(self, pid: str, policy: "Policy", st: Dict[str, float], steps: int = 0) -> None:
        if (bad := next((k for k, v in st.items() if not math.isfinite(v)), None)) is not None:
            raise self._non_finite(pid, policy, f"loss term `{bad}` ({st[bad]})", steps)

    def _check_weights(self, pid: str, policy: "Policy", steps: int = 0) -> None:
        flat = policy._flat  # finite gradients, too large a step; a sum is 40x cheaper than isfinite()
        if not math.isfinite(float(flat.sum())) and not bool(torch.isfinite(flat).all()):
            raise self._non_finite(pid, policy, "weights after the optimizer step", steps - 1)

    # ---- weights ---------------------------------------------------------------------------
    def get_weights(self) -> Tuple[int, Dict[str, Any]]:
        """``(version, {policy_id: weights})`` of the group's policies, taken under the update
        lock and cached per version."""
        with self.lock:
            cache = self._weights_cache
            if cache is None or cache[0] != self.num_updates:
                cache = self._weights_cache = (self.num_updates, {p: pol.get_weights()
                                                                  for p, pol in self.policies.items()})
            return cache

    # ---- state (checkpoints) ---------------------------------------------------------------
    def get_state(self) -> Dict[str, Any]:
        """Counters for checkpoints (the policies save their own state)."""
        with self.lock:
            return {"num_updates": self.num_updates, "env_steps_trained": self.env_steps_trained}

    def set_state(self, state: Dict[str, Any]) -> None:
        """Restore what :meth:`get_state` returned."""
        with self.lock:
            self.num_updates = int(state.get("num_updates", 0))
            self.env_steps_trained = int(state.get("env_steps_trained", 0))
            self._weights_cache = None

    # ---- thread mode -----------------------------------------------------------------------
    @property
    def threaded(self) -> bool:
        return self._thread is not None

    def start(self, queue_size: int = 2) -> None:
        """Run :meth:`update` in a daemon thread on batches given to :meth:`put` (at most
        ``queue_size`` waiting). A no-op if the thread is running."""
        if self._thread is not None and self._thread.is_alive():
            return
        if int(queue_size) < 1:
            raise ValueError(f"Learner {self.name}: queue_size must be >= 1, got {queue_size}")
        self.inqueue = queue.Queue(maxsize=int(queue_size))
        self.error = None
        self._stop_event = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"{self.name}-learner", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        stop = self._stop_event
        try:
            while not stop.is_set():
                try:
                    b = self.inqueue.get(timeout=0.1)
                except queue.Empty:
                    continue
                out = self.update(b)
                while not stop.is_set():
                    with contextlib.suppress(queue.Full):
                        self.outqueue.put(out, timeout=0.1)
                        break
        except BaseException as e:  # surfaced in the driver by check_alive()
            self.error = e

    def put(self, b: sb.MultiAgentBatch, timeout: float) -> bool:
        """Queue ``b`` for the thread; False if the queue stayed full for ``timeout`` s."""
        self.check_alive()
        try:
            self.inqueue.put(b, timeout=timeout)
            return True
        except queue.Full:
            return False

    def get(self, timeout: float) -> Optional[Dict[str, Any]]:
        """The next result of the thread, or None after ``timeout`` s."""
        try:
            return self.outqueue.get(timeout=timeout)
        except queue.Empty:
            self.check_alive()
            return None

    def check_alive(self) -> None:
        """Raise the thread's exception (its own type, message and traceback) if it crashed;
        RuntimeError if it stopped otherwise while still in use."""
        if (e := self.error) is not None:
            note = f"[flowkit] raised in the learner thread ({self.name}-learner)"
            if note not in getattr(e, "__notes__", []):
                e.add_note(note)
            raise e  # the same object: its traceback from the learner thread is kept
        t = self._thread
        if t is not None and not t.is_alive() and not self._stop_event.is_set():
            raise RuntimeError(f"the learner thread ({self.name}-learner) is not running")

    def stop(self, timeout_s: float = 5.0) -> None:
        """Ask the thread to finish its current batch and end; wait up to ``timeout_s``."""
        self._stop_event.set()
        t = self._thread
        if t is not None and t.is_alive() and threading.current_thread() is not t:
            t.join(timeout_s)
        self._thread = None
