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
import copy
import math
import queue
import threading
import time
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Tuple

import numpy as np
import torch

from flowkit.core import batch as sb
from flowkit.core.flow import _annotate
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
        shard: ``(rank, world)``: this learner is rank ``rank`` of a group of ``world`` that
            trains on the same train batch (:class:`LearnerGroup`): each minibatch is cut into
            ``world`` contiguous pieces of rows and this learner's loss and gradient are over
            piece ``rank`` (the ``reducer`` makes the row-weighted mean); preparing the batch,
            the minibatch order and ``on_train_batch_end`` are as without a group.

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
                 reducer: Optional[Callable[[torch.Tensor, int], torch.Tensor]] = None,
                 shard: Optional[Tuple[int, int]] = None):
        self.name, self._local = name, dict(policies)  # (LearnerGroup: its driver copies, read without a pull)
        self.shard = shard
        self.trainable = ({p for p, pol in self._local.items() if pol.optimizer is not None}
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
        if num_minibatches is not None and (int(num_minibatches) < 1 or contiguous):
            raise ValueError(f"Learner {self.name}: num_minibatches must be >= 1 and not contiguous, got "
                             f"{num_minibatches} (contiguous={contiguous})")
        self.num_epochs, self.minibatch_size, self.contiguous = int(num_epochs), minibatch_size, bool(contiguous)
        self.num_minibatches = None if num_minibatches is None else int(num_minibatches)

    @property
    def policies(self) -> Dict[str, "Policy"]:
        """``{policy_id: Policy}``: the group's driver-side policies (see the class docstring)."""
        return self._local

    def describe(self) -> str:
        """The update loop in words (shown in plans): ``num_epochs=10, minibatch_size=64``."""
        size = (f"num_minibatches={self.num_minibatches}" if self.num_minibatches is not None else
                f"minibatch_size={self.minibatch_size}" + (", contiguous" if self.contiguous else ""))
        return f"num_epochs={self.num_epochs}, {size}"

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
                if pid not in self.trainable or (out := fn(pid, self._local[pid], x)) is None:
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
        mbs = -(-n // nmb) if nmb is not None else min(int(self.minibatch_size or n), n)
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
                if self.shard is not None:
                    mb = self._piece(pid, policy, policy.prepare_minibatch(mb))
                loss, st = policy.loss(mb)
                self._check_stats(pid, policy, st, steps)  # the stats are floats already: no sync
                g = flat_gradient(policy._params, loss)
                if self.reducer is not None:
                    g = self.reducer(g, len(next(iter(mb.values()))))
                norm = self._apply(pid, policy, g, max_norm, steps)
                for k, v in st.items():
                    sums[k] += v
                if max_norm:
                    sums["grad_norm"] += norm
                steps += 1
        policy.shard_rows = None
        self._check_weights(pid, policy, steps)
        policy.num_updates += steps
        stats = {k: v / max(steps, 1) for k, v in sums.items()}
        stats.update(policy.on_train_batch_end(tb) or {})
        stats.update(train_batch_size=n, num_sgd_steps=steps)
        return stats, steps, n

    def _piece(self, pid: str, policy: "Policy", mb: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
        """This rank's contiguous piece of the minibatch ``mb`` (``shard``), marked on the policy
        (:attr:`Policy.shard_rows`)."""
        assert self.shard is not None
        rank, world = self.shard
        n = len(next(iter(mb.values())))
        a, b = n * rank // world, n * (rank + 1) // world
        if b <= a:
            raise ValueError(f"Learner {self.name}: policy {pid!r}'s minibatch of {n} rows cannot be shared by "
                             f"{world} learners (learner.num_learners): each needs at least one row")
        if bad := next((k for k, v in mb.items() if len(v) != n), None):
            raise ValueError(f"Learner {self.name}: policy {pid!r}'s minibatch column {bad!r} has {len(mb[bad])} "
                             f"values for {n} rows: a learner group needs one per row "
                             f"({type(policy).__name__}.prepare_minibatch)")
        policy.shard_rows = (a, b, n)
        return {k: v[a:b] for k, v in mb.items()}

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
        norm = self._apply(pid, policy, torch.as_tensor(np.array(g), device=policy.device),
                           getattr(policy.config, "max_grad_norm", None))
        self._check_weights(pid, policy, 1)
        policy.num_updates += 1
        return {**st, "grad_norm": norm, "train_batch_size": rows, "num_sgd_steps": 1}, 1, int(rows)

    def _apply(self, pid: str, policy: "Policy", g: torch.Tensor, max_norm: Optional[float], steps: int = 0) -> float:
        """:meth:`apply_gradient`, raising NonFiniteError on a non-finite gradient norm."""
        if not math.isfinite(norm := self.apply_gradient(policy, g, max_norm)):
            raise self._non_finite(pid, policy, f"gradient (norm {norm})", steps)
        return norm

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
                cache = self._weights_cache = (self.num_updates, self._read_weights())
            return cache

    def _read_weights(self) -> Dict[str, Any]:
        return {p: pol.get_weights() for p, pol in self._local.items()}

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
            _annotate(e, f"the learner thread ({self.name}-learner)")
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


# ---- a group of learner processes -----------------------------------------------------------------
def _same(a: Any, b: Any) -> bool:
    """Whether two policy states (nested dicts and lists of tensors, arrays and scalars) are equal."""
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(map(_same, a, b))
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.shape == b.shape and np.array_equal(a, b)
    return not isinstance(b, (torch.Tensor, np.ndarray)) and bool(a == b)


class _GroupMember:
    """One learner process of a :class:`LearnerGroup` (a Ray actor): torch copies of the group's
    policies, kept between updates, and a :class:`Learner` over them that trains on its ``shard``
    of each minibatch and all-reduces the gradient before each optimizer step."""

    def __init__(self, name: str, specs: Dict[str, Any], model_configs: Dict[str, Any], trainable: List[str],
                 device: str, rank: int, world: int, num_threads: int):
        torch.set_num_threads(int(num_threads))
        policies = {p: s.policy_class(s.observation_space, s.action_space, s.config, model_configs[p], device, 0)
                    for p, s in specs.items()}
        self.rank = int(rank)
        self.learner = Learner(name, policies, trainable, shard=(int(rank), int(world)))
        self.saved: Optional[Dict[str, Any]] = None  # the policies' states when the last update began

    def node_id(self) -> str:
        import ray
        return ray.get_runtime_context().get_node_id()

    def join(self, host: str, port: int, generation: int, backend: str, timeout_s: float) -> bool:
        """Join the group's torch.distributed process group (rendezvous at the driver's
        TCPStore ``host:port``, keys under ``<name>/<generation>/``)."""
        import datetime

        import torch.distributed as dist
        td = datetime.timedelta(seconds=float(timeout_s))
        lr = self.learner
        store = dist.PrefixStore(f"{lr.name}/{generation}/", dist.TCPStore(host, int(port), None, False, td))
        if dist.is_initialized():
            dist.destroy_process_group()
        world = lr.shard[1] if lr.shard else 1
        dist.init_process_group(backend, store=store, rank=self.rank, world_size=world, timeout=td)
        lr.reducer = self.allreduce_mean
        return True

    @staticmethod
    def allreduce_mean(g: torch.Tensor, rows: int) -> torch.Tensor:
        """``sum_r rows_r g_r / sum_r rows_r`` over the group: the gradient of the mean loss over
        the whole minibatch (one all-reduce of the flat gradient and the row count together)."""
        import torch.distributed as dist
        buf = torch.cat([g * float(rows), g.new_tensor([float(rows)])])
        dist.all_reduce(buf)
        return buf[:-1] / buf[-1]

    def update(self, b: sb.MultiAgentBatch, changes: Optional[Dict[str, Dict[str, Any]]], rng_state: Dict[str, Any],
               loop: Dict[str, Any]) -> Dict[str, Any]:
        """Train on this rank's share of ``b`` from the minibatch RNG state ``rng_state``, after
        applying ``changes`` (``{policy_id: {key: value}}``, parts of :meth:`Policy.get_state`
        the driver changed); rank 0 also returns the RNG state afterwards."""
        lr = self.learner
        for pid, part in (changes or {}).items():
            pol = lr.policies[pid]
            pol.set_state({**pol.get_state(), **part})
        self.saved = copy.deepcopy({p: pol.get_state() for p, pol in lr.policies.items()})
        lr.rng.bit_generator.state = rng_state
        lr.configure(**loop)
        out = lr.update(b)
        res: Dict[str, Any] = {"stats": out["stats"], "num_updates": out["num_updates"],
                               "td_error": {p: getattr(lr.policies[p], "td_error", None) for p in out["stats"]}}
        if self.rank == 0:
            res["rng"] = lr.rng.bit_generator.state
        return res

    def read(self, what: str) -> Optional[Dict[str, Any]]:
        """``{policy_id: ...}``: ``states`` (:meth:`Policy.get_state`), ``weights``
        (:meth:`Policy.get_weights`), or ``saved`` (the states when the last update began; None
        before any)."""
        if what == "saved":
            return self.saved
        return {p: pol.get_state() if what == "states" else pol.get_weights() for p, pol in self.learner.policies.items()}


class LearnerGroup(Learner):
    """A :class:`Learner` whose updates run on ``num_learners`` learner processes (Ray actors in
    one placement group) behind the same interface: plans do not change.

    The learners keep the policies' whole state (weights, optimizer, target network, scalar
    state, RNGs) between updates. An update sends the train batch (one object in Ray's store)
    and the minibatch RNG state to every learner, and the parts of a driver policy's state that
    the driver changed since the learners last had it (a restored checkpoint, a schedule, a
    target-network update, epsilon: found by comparing its :meth:`Policy.get_state` with the
    one it had when last in step; all of it to a new group). Learner ``r`` of ``N`` runs the same
    epochs x minibatches loop as one learner would, on rows ``[n r / N, n (r + 1) / N)`` of each
    ``n``-row minibatch, and all-reduces the flat gradient before every optimizer step
    (torch.distributed: gloo on CPU, NCCL on CUDA, one all-reduce per step) as the row-weighted
    mean, the gradient of the mean loss over the minibatch: the learners stay equal and the
    group's update is one learner's, up to float summation order (RLlib 2.x's LearnerGroup
    shards the train batch instead, each learner making its own minibatches). Only stats,
    ``td_error`` and the RNG state come back.

    The driver's copies (:attr:`policies`) are brought to rank 0's state when read (checkpoints,
    target updates, schedules, evaluation), once per update at most; :meth:`get_weights` (the
    weights for the rollout workers) takes rank 0's weights alone, once per version. A lost
    learner costs nothing learned: the group takes the state of a surviving learner from before
    the failed update, is rebuilt (new actors, new process group) and retries the update once.

    Stats are the mean of the learners' stats (each over its rows); ``td_error`` (prioritized
    replay) is the learners' pieces in rank order. Recurrent policies are refused.

    Args (beyond :class:`Learner`'s):
        specs: ``{policy_id: PolicySpec}`` the learner processes build their policies from.
        model_configs: ``{policy_id: model.* config}``.
        num_learners: learner processes (``learner.num_learners``), >= 1.
        num_cpus: CPUs each reserves (``learner.num_cpus_per_learner``).
        strategy: the placement group's strategy (``learner.placement_strategy``: PACK, SPREAD,
            STRICT_PACK, STRICT_SPREAD).
        device: ``cpu`` or ``cuda`` (each learner then reserves one GPU).
        num_threads: torch threads of each learner process.
        timeout_s: bound of placing the group, its rendezvous, each update's collectives and
            each read of a learner's state.

    Raises:
        ValueError: a trainable policy is recurrent.
        RuntimeError: the group cannot be placed within ``timeout_s``, it lost a learner twice in
            one update, or it lost every learner (naming the group).
    """

    def __init__(self, name: str, policies: Dict[str, "Policy"], trainable: Optional[Iterable[str]],
                 rng: Optional[np.random.Generator], specs: Dict[str, Any], model_configs: Dict[str, Any],
                 num_learners: int, num_cpus: float = 1.0, strategy: str = "PACK", device: str = "cpu",
                 num_threads: int = 1, timeout_s: float = 300.0):
        super().__init__(name, policies, trainable, rng)
        if rec := [p for p in self.trainable if getattr(self._local[p], "is_recurrent", False)]:
            raise ValueError(f"learner.num_learners={num_learners}: policy {rec[0]!r} is recurrent; a learner "
                             "group trains feed-forward policies only")
        self.specs, self.model_configs = specs, model_configs
        self.num_learners, self.num_cpus, self.strategy = int(num_learners), float(num_cpus), str(strategy)
        self.device, self.num_threads, self.timeout_s = str(device), int(num_threads), float(timeout_s)
        self.actors: List[Any] = []
        self.generation = 0           # process groups formed so far
        self.num_rebuilds = 0         # groups rebuilt after a lost learner
        self.num_pulls = 0            # driver copies brought up to the learners' state
        self.behind = False           # the learners updated past the driver's copies
        self._known: Dict[str, Dict[str, Any]] = {}  # each driver copy's state when last in step with the learners
        self._pg: Any = None
        self._store: Any = None

    @property
    def policies(self) -> Dict[str, "Policy"]:
        """The driver's copies, first brought to the learners' state when they are behind (:meth:`_pull`)."""
        self._pull()
        return self._local

    def describe(self) -> str:
        return f"{super().describe()}, {self.num_learners} learner processes"

    def update(self, b: sb.MultiAgentBatch) -> Dict[str, Any]:
        """As :meth:`Learner.update`, on the group's processes (see the class docstring)."""
        t0 = time.perf_counter()
        with self.lock:
            res = self._remote_update(b)
            self.rng.bit_generator.state = res[0]["rng"]
            self.behind = True
            per_pid = {}
            for p in res[0]["stats"]:
                tds = [r["td_error"].get(p) for r in res]
                if all(td is not None for td in tds):
                    pol: Any = self._local[p]  # a policy with priorities (UpdatePriorities' contract)
                    pol.td_error = np.concatenate(tds)
                stats = {k: float(np.mean([r["stats"][p][k] for r in res])) for k in res[0]["stats"][p]}
                stats["train_batch_size"] = len(b.policy_batches[p])
                per_pid[p] = (stats, int(stats["num_sgd_steps"]), len(b.policy_batches[p]))
            out = self._update(b, per_pid.items(), lambda pid, pol, x: x)
        dt = time.perf_counter() - t0
        self.busy_s += dt - out["learn_time_s"]
        out["learn_time_s"] = dt
        return out

    # ---- the driver's copies -------------------------------------------------------------------
    def _read_weights(self) -> Dict[str, Any]:
        """While the driver's copies are behind, rank 0's weights (:meth:`Learner.get_weights`
        fetches them once per version)."""
        return self._ask("weights") if self.behind else super()._read_weights()

    def _pull(self) -> None:
        """Bring the driver's copies to the learners' state if they are behind."""
        with self.lock:
            if self.behind:
                self._set_local(self._ask("states"))
                self.num_pulls += 1

    def _set_local(self, states: Dict[str, Any]) -> None:
        for p, st in states.items():
            self._local[p].set_state(st)
        self._known = {p: copy.deepcopy(self._local[p].get_state()) for p in states}
        self.behind = False

    def _changes(self) -> Dict[str, Dict[str, Any]]:
        """``{policy_id: {key: value}}``: the parts of each driver copy's state that changed since
        it was last in step with the learners (all of it for a new group)."""
        out = {}
        for p, pol in self._local.items():
            now, known = pol.get_state(), self._known.get(p)
            part = now if known is None else {k: v for k, v in now.items() if k not in known or not _same(v, known[k])}
            if part:
                out[p] = part
                self._known[p] = copy.deepcopy(now)
        return out

    def _ask(self, what: str) -> Dict[str, Any]:
        """:meth:`_GroupMember.read` of the first learner that answers (all hold the same state)."""
        if (got := self._first([a.read.remote(what) for a in self.actors])) is None:
            raise RuntimeError(f"learner group {self.name}: no learner answered within {self.timeout_s:g} s; "
                               "the updates since the last checkpoint are lost (resume from it)")
        return got

    def _first(self, refs: List[Any]) -> Any:
        """The first non-None result of ``refs`` (failed ones skipped), or None after
        ``timeout_s`` without an answer or when all failed."""
        import ray
        with contextlib.suppress(TimeoutError):
            for ref in self._as_finished(refs):
                with contextlib.suppress(ray.exceptions.RayError):
                    if (got := ray.get(ref)) is not None:
                        return got
        return None

    def _as_finished(self, refs: List[Any]) -> Iterator[Any]:
        """``refs`` in the order they finish; TimeoutError after ``timeout_s`` without one."""
        import ray
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1, timeout=self.timeout_s)
            if not done:
                raise TimeoutError(f"{len(pending)} of {len(refs)} learners did not answer within {self.timeout_s:g} s")
            yield done[0]

    def set_state(self, state: Dict[str, Any]) -> None:
        """As :meth:`Learner.set_state`; the driver's copies (restored before it, as policies
        are) go to the learners whole at the next update."""
        with self.lock:
            super().set_state(state)
            self.behind, self._known = False, {}

    # ---- the processes ---------------------------------------------------------------------
    def _remote_update(self, b: sb.MultiAgentBatch) -> List[Dict[str, Any]]:
        """Every learner's result of one update, in rank order; the group rebuilt and the update
        retried once if a learner was lost."""
        import ray
        loop = {"num_epochs": self.num_epochs, "minibatch_size": self.minibatch_size,
                "contiguous": self.contiguous, "num_minibatches": self.num_minibatches}
        for attempt in (0, 1):
            if not self.actors:
                self._start()
            changes = self._changes()
            args = [ray.put(b), ray.put(changes) if changes else None, self.rng.bit_generator.state, loop]
            refs = [a.update.remote(*args) for a in self.actors]
            try:
                return self._gather(refs)
            except ray.exceptions.RayTaskError as e:  # raised in a learner: its own exception
                if not self._lost(refs):
                    self._recover()
                    raise e.cause from None
                err: Exception = e
            except (ray.exceptions.RayActorError, ray.exceptions.ObjectLostError, TimeoutError) as e:
                err = e
            self._recover()
            what = f"learner group {self.name}: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
            if attempt:
                raise RuntimeError(f"{what}; lost again after the group was rebuilt: giving up (the driver "
                                   "holds the state before this update: resume from the checkpoint)") from None
            self.num_rebuilds += 1
            import warnings
            warnings.warn(f"{what}; rebuilding the group and retrying the update", RuntimeWarning, stacklevel=2)
        raise AssertionError("unreachable")

    def _lost(self, refs: List[Any]) -> bool:
        """Whether a learner of this update died (waiting up to 2 s for the others to end)."""
        import ray
        done, _ = ray.wait(refs, num_returns=len(refs), timeout=2.0)
        for r in done:
            try:
                ray.get(r)
            except (ray.exceptions.RayActorError, ray.exceptions.ObjectLostError):
                return True
            except ray.exceptions.RayError:
                pass
        return False

    def _recover(self) -> None:
        """After a failed update: the driver's copies take the state a surviving learner had when
        the update began, and the group is torn down (the next update starts a new one)."""
        saved = self._first([a.read.remote("saved") for a in self.actors])
        self._teardown()
        if saved is not None:
            self._set_local(saved)
        elif self.behind:
            raise RuntimeError(f"learner group {self.name}: every learner was lost; the updates since the last "
                               "checkpoint are lost (resume from it)")
        self._known = {}

    def _gather(self, refs: List[Any]) -> List[Dict[str, Any]]:
        """``ray.get`` of every learner's update, failing at the first learner that fails (the
        others may wait in a collective for it) or after ``timeout_s`` without progress."""
        import ray
        for ref in self._as_finished(refs):
            ray.get(ref)  # raises a failed learner's error now
        return ray.get(refs)

    def _start(self) -> None:
        """Place the group (one bundle per learner), start its actors and form its process group."""
        import datetime

        import ray
        import torch.distributed as dist
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
        cuda = self.device.startswith("cuda")
        bundle = {"CPU": self.num_cpus, **({"GPU": 1.0} if cuda else {})}
        self._pg = placement_group([bundle] * self.num_learners, strategy=self.strategy,
                                   name=f"flowkit-{self.name}-learners-{self.generation}")
        if not ray.wait([self._pg.ready()], timeout=self.timeout_s)[0]:
            self._teardown()
            raise RuntimeError(f"learner group {self.name}: {self.num_learners} x {bundle} ({self.strategy}) could "
                               f"not be placed within {self.timeout_s:g} s; free: {ray.available_resources()}")
        host = ray.util.get_node_ip_address()
        self._store = dist.TCPStore(host, 0, None, True, datetime.timedelta(seconds=self.timeout_s),
                                    wait_for_workers=False)
        cls = ray.remote(max_restarts=0)(_GroupMember)
        specs = {p: self.specs[p] for p in self._local}
        self.actors = [cls.options(num_cpus=self.num_cpus, num_gpus=1 if cuda else 0,
                                   scheduling_strategy=PlacementGroupSchedulingStrategy(self._pg, i),
                                   name=None).remote(self.name, specs, self.model_configs, sorted(self.trainable),
                                                     "cuda" if cuda else "cpu", i, self.num_learners,
                                                     self.num_threads)
                       for i in range(self.num_learners)]
        self._gather([a.join.remote(host, int(self._store.port), self.generation, "nccl" if cuda else "gloo",
                                    self.timeout_s) for a in self.actors])
        self.generation += 1
        self._known = {}  # the new learners get the driver's copies whole

    def node_ids(self) -> List[str]:
        """The Ray node id of each learner process, in rank order (starts the group)."""
        import ray
        with self.lock:
            if not self.actors:
                self._start()
            return ray.get([a.node_id.remote() for a in self.actors])

    def _teardown(self) -> None:
        import ray
        from ray.util.placement_group import remove_placement_group
        actors, self.actors = self.actors, []
        for a in actors:
            with contextlib.suppress(Exception):
                ray.kill(a, no_restart=True)
        if self._pg is not None:
            with contextlib.suppress(Exception):
                remove_placement_group(self._pg)
        self._pg, self._store = None, None

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the thread (if any), bring the driver's copies to the learners' state, then stop
        the learner processes and their placement group."""
        super().stop(timeout_s)
        with contextlib.suppress(Exception):
            self._pull()
        if self.actors or self._pg is not None:
            self._teardown()
