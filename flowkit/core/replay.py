"""Replay buffers and the replay operators (DQN; Ape-X replay shards).

A :class:`ReplayBuffer` is composed from a :class:`Storage` (a ring of preallocated numpy
columns, capacity in transitions) and a sampler that owns its own seeded RNG:
:class:`UniformSampler`, or :class:`PrioritizedSampler` (proportional prioritized replay,
Schaul et al. 2016, arXiv 1511.05952, section 3.3 and eq. 1-2; sum and min segment trees).
:class:`MultiAgentReplayBuffer` holds one ReplayBuffer per policy id and is what the operators
use. Everything here is checkpointable: ``get_state(include_replay=...)`` / ``set_state``
restore the stored rows, the ring position, the priorities and the sampler's RNG exactly.
Stacked uint8 frames (a frame-stacking preset's observations) are stored once each (:mod:`flowkit.core._frames`).

Operators (dataflow, after RLlib Flow, arXiv 2011.12719, figure 6):

- :class:`StoreToReplayBuffer` -- stores each MultiAgentBatch, passes it on.
- :func:`Replay` -- a source of replayed MultiAgentBatches; NOT_READY until
  ``learning_starts`` env steps were sampled and a buffer holds a whole train batch.
  (UpdateTargetNetwork and UpdatePriorities are in :mod:`flowkit.core.ops`.)
- Ape-X (Horgan et al. 2018, arXiv 1803.00933): :class:`ReplayShard` (a Ray actor asking for
  ``num_cpus=0``), :class:`ReplayShards` (the set, started lazily, checkpointable),
  :class:`StoreToReplayShards`, :func:`ReplayFromShards` (``gather_async`` over the shards; its items
  become :class:`~flowkit.core.flow.Sourced` with ``zip_with_source_actor``).
"""
from __future__ import annotations

import contextlib
import time
import warnings
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

import numpy as np

from flowkit.core import batch as sb
from flowkit.core._frames import FrameStorage, is_frame_batch
from flowkit.core.flow import NOT_READY, Flow, LocalActor, ParallelFlow, RayActor, Sourced, get_result

if TYPE_CHECKING:
    from flowkit.core.context import RunContext


# ---- storage ----------------------------------------------------------------------------------
class Storage:
    """A ring buffer of ``capacity`` transitions, one preallocated numpy array per column.

    The columns are fixed by the first batch added; later batches must have the same columns
    (ValueError naming the difference). When full, the oldest rows are overwritten.
    """

    def __init__(self, capacity: int):
        self.capacity = int(capacity)
        self.cols: Dict[str, np.ndarray] = {}  # empty until the first batch
        self.next_idx = self.size = self.num_added = 0

    def __len__(self) -> int:
        return self.size

    def add(self, batch: sb.SampleBatch, rows: Optional[int] = None) -> np.ndarray:
        """Copy the rows of ``batch`` in; returns their slot indexes int64[n]. ``rows``: their
        number where ``batch`` has no columns (a :class:`~flowkit.core._frames.FrameStorage`'s
        transitions of frames alone)."""
        n = len(batch) if rows is None else int(rows)
        if n == 0:
            return np.zeros(0, np.int64)
        if not self.cols:
            self.cols = {k: np.zeros((self.capacity, *np.shape(v)[1:]), np.asarray(v).dtype) for k, v in batch.items()}
        elif set(batch.keys()) != set(self.cols):
            raise ValueError(f"replay buffer: batch columns {sorted(batch.keys())} differ from the "
                             f"stored columns {sorted(self.cols)}")
        start = max(0, n - self.capacity)  # only the newest `capacity` rows survive anyway
        n -= start
        idx = (self.next_idx + np.arange(n)) % self.capacity
        for k, col in self.cols.items():
            col[idx] = np.asarray(batch[k])[start:]
        self.next_idx = int((self.next_idx + n) % self.capacity)
        self.size = min(self.size + n, self.capacity)
        self.num_added += n
        return idx

    def get(self, idx: np.ndarray) -> sb.SampleBatch:
        return sb.SampleBatch({k: v[idx] for k, v in self.cols.items()})

    def get_state(self, include_replay: bool = True) -> Dict[str, Any]:
        st: Dict[str, Any] = {"next_idx": self.next_idx, "size": self.size, "num_added": self.num_added,
                              "capacity": self.capacity, "has_data": include_replay}
        if include_replay and self.cols:
            st["cols"] = {k: v[:self.size].copy() for k, v in self.cols.items()}
        return st

    def set_state(self, st: Dict[str, Any]) -> None:
        if not st.get("has_data", True):
            self.cols, self.next_idx, self.size, self.num_added = {}, 0, 0, int(st["num_added"])
            return
        cols = st.get("cols")
        if cols is not None:
            if int(st["size"]) > self.capacity:
                raise ValueError(f"checkpointed replay buffer holds {st['size']} rows, more than the "
                                 f"capacity {self.capacity}")
            self.cols = {k: np.zeros((self.capacity, *v.shape[1:]), v.dtype) for k, v in cols.items()}
            for k, v in cols.items():
                self.cols[k][:len(v)] = v
        self.next_idx, self.size, self.num_added = int(st["next_idx"]), int(st["size"]), int(st["num_added"])


# ---- samplers ----------------------------------------------------------------------------------
class UniformSampler:
    """Uniform sampling with replacement; importance weights are all 1."""

    prioritized = False

    def __init__(self, capacity: int, seed: int):
        self.rng = np.random.default_rng(seed)

    def on_add(self, idx: np.ndarray) -> None:
        pass

    def sample(self, size: int, n: int) -> Tuple[np.ndarray, np.ndarray]:
        """``n`` slot indexes among the ``size`` filled ones, and weights float32[n]."""
        return self.rng.integers(0, size, size=n), np.ones(n, np.float32)

    def update(self, idx: np.ndarray, td_error: np.ndarray) -> None:
        pass

    def get_state(self, include_replay: bool = True) -> Dict[str, Any]:
        return {"rng": self.rng.bit_generator.state}

    def set_state(self, st: Dict[str, Any]) -> None:
        self.rng.bit_generator.state = st["rng"]


class _SegmentTree:
    """A complete binary tree over ``capacity`` leaves (rounded up to a power of two) whose
    nodes hold ``op`` (np.add or np.minimum) of their children; vectorised updates."""

    def __init__(self, capacity: int, op: Any, neutral: float):
        self.cap = 1 << max(0, int(capacity - 1).bit_length())
        self.op, self.neutral = op, neutral
        self.t = np.full(2 * self.cap, neutral, np.float64)

    def set(self, idx: np.ndarray, values: np.ndarray) -> None:
        pos = np.asarray(idx, np.int64) + self.cap
        self.t[pos] = values
        while len(pos) and pos[0] > 1:  # all leaves are at one depth: climb level by level
            pos = np.unique(pos // 2)
            self.t[pos] = self.op(self.t[2 * pos], self.t[2 * pos + 1])

    def root(self) -> float:
        return float(self.t[1])

    def leaves(self, n: int) -> np.ndarray:
        return self.t[self.cap:self.cap + n]

    def find_prefixsum(self, mass: np.ndarray) -> np.ndarray:
        """For a sum tree: the leaf ``i`` with ``sum(p[:i]) <= mass < sum(p[:i+1])``, per row."""
        idx = np.ones(len(mass), np.int64)
        mass = np.asarray(mass, np.float64).copy()
        while idx[0] < self.cap:
            lv = self.t[2 * idx]
            right = mass >= lv
            mass = np.where(right, mass - lv, mass)
            idx = 2 * idx + right
        return idx - self.cap


class PrioritizedSampler:
    """Proportional prioritized replay (Schaul et al. 2016, arXiv 1511.05952).

    Each slot has priority ``p_i = |td_error_i| + eps`` (new rows get the largest priority
    seen so far, initially 1). Sampling probability (eq. 1): ``P(i) = p_i^alpha / sum_k
    p_k^alpha``, drawn stratified: one draw in each of ``n`` equal slices of the total mass.
    Importance weights (section 3.4): ``w_i = (N * P(i))^-beta / max_j w_j`` with ``N`` the
    filled slots and ``max_j w_j = (N * min_k P(k))^-beta`` over the whole buffer, so weights
    are in (0, 1].
    """

    prioritized = True

    def __init__(self, capacity: int, seed: int, alpha: float = 0.6, beta: float = 0.4, eps: float = 1e-6):
        self.alpha, self.beta, self.eps = float(alpha), float(beta), float(eps)
        self.rng = np.random.default_rng(seed)
        self.sum = _SegmentTree(capacity, np.add, 0.0)
        self.min = _SegmentTree(capacity, np.minimum, np.inf)
        self.max_priority = 1.0

    def _set(self, idx: np.ndarray, priorities: np.ndarray) -> None:
        pa = np.asarray(priorities, np.float64) ** self.alpha
        self.sum.set(idx, pa)
        self.min.set(idx, pa)

    def on_add(self, idx: np.ndarray) -> None:
        self._set(idx, np.full(len(idx), self.max_priority))

    def probabilities(self, size: int) -> np.ndarray:
        """P(i) of the ``size`` filled slots, float64[size] (for tests and inspection)."""
        return self.sum.leaves(size) / self.sum.root()

    def sample(self, size: int, n: int) -> Tuple[np.ndarray, np.ndarray]:
        total = self.sum.root()
        mass = (np.arange(n) + self.rng.random(n)) * (total / n)
        idx = np.minimum(self.sum.find_prefixsum(mass), size - 1)
        p = self.sum.t[idx + self.sum.cap] / total
        p_min = self.min.root() / total
        weights = (p / p_min) ** (-self.beta)  # == (N p)^-beta / (N p_min)^-beta
        return idx, weights.astype(np.float32)

    def update(self, idx: np.ndarray, td_error: np.ndarray) -> None:
        """Set ``p = |td_error| + eps`` for slots ``idx`` (int64[B], float32[B])."""
        p = np.abs(np.asarray(td_error, np.float64)) + self.eps
        self._set(np.asarray(idx, np.int64), p)
        self.max_priority = max(self.max_priority, float(p.max()) if len(p) else 0.0)

    def get_state(self, include_replay: bool = True) -> Dict[str, Any]:
        st = {"rng": self.rng.bit_generator.state, "max_priority": self.max_priority}
        if include_replay:
            st["sum"], st["min"] = self.sum.t.copy(), self.min.t.copy()
        return st

    def set_state(self, st: Dict[str, Any]) -> None:
        self.rng.bit_generator.state = st["rng"]
        self.max_priority = float(st["max_priority"])
        self.sum.t[:], self.min.t[:] = (st["sum"], st["min"]) if "sum" in st else (0.0, np.inf)


# ---- buffers ----------------------------------------------------------------------------------
class ReplayBuffer:
    """Storage + sampler for one policy's transitions.

    ``sample(n)`` returns a SampleBatch of ``n`` rows with the stored columns plus
    ``batch_indexes`` (int64[n], slots, for :meth:`update_priorities`) and ``weights``
    (float32[n], importance weights; 1 for uniform sampling).
    """

    def __init__(self, capacity: int, sampler: Any):
        self.storage: Any = Storage(capacity)
        self.sampler = sampler

    def __len__(self) -> int:
        return len(self.storage)

    def add(self, batch: sb.SampleBatch) -> None:
        """Store the rows of ``batch``; once full, the oldest rows are overwritten (FIFO). The
        first batch decides the storage: stacked uint8 frames go to a
        :class:`~flowkit.core._frames.FrameStorage` (each frame stored once), anything else to
        a :class:`Storage`."""
        if type(self.storage) is Storage and not self.storage.cols and is_frame_batch(batch):
            self.storage = FrameStorage(Storage(self.storage.capacity))
        self.sampler.on_add(self.storage.add(batch))

    def sample(self, n: int) -> sb.SampleBatch:
        """``n`` rows drawn by the sampler (with replacement), see the class docstring.

        Raises:
            ValueError: the buffer is empty.
        """
        if len(self.storage) == 0:
            raise ValueError("cannot sample from an empty replay buffer")
        idx, w = self.sampler.sample(len(self.storage), int(n))
        return sb.SampleBatch({**self.storage.get(idx), sb.BATCH_INDEXES: np.asarray(idx, np.int64),
                               sb.PRIO_WEIGHTS: w})

    def update_priorities(self, idx: np.ndarray, td_error: np.ndarray) -> None:
        """New priorities ``|td_error| + eps`` (float32[B]) for slots ``idx`` (int64[B], the
        ``batch_indexes`` of a sample; rows of index -1 came from elsewhere (a
        :class:`ReplayMix`) and are skipped); a no-op for uniform sampling."""
        idx = np.asarray(idx)
        keep = idx >= 0
        self.sampler.update(idx[keep], np.asarray(td_error)[keep])

    def get_state(self, include_replay: bool = True) -> Dict[str, Any]:
        return {"storage": self.storage.get_state(include_replay), "sampler": self.sampler.get_state(include_replay)}

    def set_state(self, st: Dict[str, Any]) -> None:
        if st["storage"].get("kind") == "frames":
            self.storage = FrameStorage(Storage(self.storage.capacity))
        self.storage.set_state(st["storage"])
        self.sampler.set_state(st["sampler"])


class MultiAgentReplayBuffer:
    """One :class:`ReplayBuffer` per policy id (created on first use), each with its own RNG
    seeded from ``seed`` and the policy id.

    Args:
        capacity: transitions per policy.
        prioritized: proportional prioritized replay instead of uniform.
        alpha: priority exponent of prioritized replay (see :class:`PrioritizedSampler`).
        beta: importance-weight exponent.
        eps: constant added to ``|td_error|`` to make a priority.
        seed: base seed (the run's derived replay seed).
    """

    def __init__(self, capacity: int, prioritized: bool = False, alpha: float = 0.6, beta: float = 0.4,
                 eps: float = 1e-6, seed: int = 0):
        self.capacity, self.prioritized = int(capacity), bool(prioritized)
        self.alpha, self.beta, self.eps, self.seed = alpha, beta, eps, int(seed)
        self.buffers: Dict[str, ReplayBuffer] = {}
        self.num_env_steps_added = 0

    def buffer(self, policy_id: str) -> ReplayBuffer:
        """The buffer of ``policy_id``, created on first use with its own seeded sampler."""
        if policy_id not in self.buffers:
            from flowkit.core._envs import derive_seed
            s = derive_seed(self.seed, "replay", policy_id)
            sampler = (PrioritizedSampler(self.capacity, s, self.alpha, self.beta, self.eps)
                       if self.prioritized else UniformSampler(self.capacity, s))
            self.buffers[policy_id] = ReplayBuffer(self.capacity, sampler)
        return self.buffers[policy_id]

    def add(self, batch: sb.MultiAgentBatch) -> int:
        """Store the rows of ``batch``; returns the env steps added so far."""
        for pid, pb in batch.policy_batches.items():
            if len(pb):
                self.buffer(pid).add(pb)
        self.num_env_steps_added += batch.env_steps
        return self.num_env_steps_added

    def sizes(self) -> Dict[str, int]:
        """Rows stored per policy id."""
        return {pid: len(b) for pid, b in self.buffers.items()}

    def can_sample(self, n: int) -> bool:
        """Whether some policy buffer holds at least ``n`` rows."""
        return any(len(b) >= n for b in self.buffers.values())

    def sample(self, n: int) -> Optional[sb.MultiAgentBatch]:
        """``n`` rows from each policy buffer that holds at least ``n`` (None if none does);
        ``env_steps`` of the result is ``n``, or ``n * L`` when the rows are stored sequences of
        ``L`` steps (a ``seq_mask`` bool[n, L] column: R2D2; padding included)."""
        out = {pid: b.sample(n) for pid, b in self.buffers.items() if len(b) >= n}
        if not out:
            return None
        steps = max(int(np.shape(pb[sb.SEQ_MASK])[1]) if sb.SEQ_MASK in pb else 1 for pb in out.values())
        return sb.MultiAgentBatch(out, env_steps=n * steps)

    def update_priorities(self, prios: Dict[str, Tuple[np.ndarray, np.ndarray]]) -> None:
        """``{policy_id: (batch_indexes int64[B], td_error float32[B])}``."""
        for pid, (idx, td) in prios.items():
            if pid in self.buffers:
                self.buffers[pid].update_priorities(idx, td)

    def get_state(self, include_replay: bool = True) -> Dict[str, Any]:
        return {"buffers": {pid: b.get_state(include_replay) for pid, b in self.buffers.items()},
                "num_env_steps_added": self.num_env_steps_added, "include_replay": include_replay}

    def set_state(self, st: Dict[str, Any]) -> None:
        if not st.get("include_replay", True):
            warnings.warn("this checkpoint holds no replay buffer (checkpoint.include_replay=false): "
                          "replay restarts empty and the sampler RNG and counters are restored", stacklevel=2)
        for pid, bst in st["buffers"].items():
            self.buffer(pid).set_state(bst)
        self.num_env_steps_added = int(st["num_env_steps_added"])


# ---- operators ----------------------------------------------------------------------------------
class StoreToReplayBuffer:
    """Store each MultiAgentBatch (or ``(actor, batch)`` item) in ``buffer``; pass it on."""

    def __init__(self, buffer: MultiAgentReplayBuffer):
        self.buffer = buffer
        self.name = "StoreToReplayBuffer"

    def __call__(self, item: Any) -> Any:
        self.buffer.add(item.item if isinstance(item, Sourced) else item)
        return item


class ReplayMix:
    """Symmetric sampling (Ball, Smith, Kostrikov and Levine 2023, *Efficient Online
    Reinforcement Learning with Offline Data* (RLPD), arXiv 2302.02948, section 4.1): a fixed
    ``fraction`` of the rows of every replayed batch comes from a second source (a dataset),
    the rest from the replay buffer of live experience. An argument of the replay plan
    (:func:`~flowkit.core.ops.ReplayPlan`'s ``mix``, which binds it to its :func:`Replay`); the
    offline plugin's ``input.mix`` passes one to an off-policy algorithm's ``training_flow``.

    Args:
        make_source: ``make_source(k)`` -> an endless iterable of MultiAgentBatches of ``k``
            rows per policy (fewer allowed: the replay buffer makes up the rest), called once,
            when a plan binds the mix (``k = round(fraction * batch_size)``).
        fraction: the share of each replayed batch from the source, in (0, 1).
        name: the source as the plan shows it.
    Attributes:
        rows: ``k`` once bound (None before: no plan replays, e.g. an on-policy algorithm).
    """

    def __init__(self, make_source: Any, fraction: float, name: str):
        self.make_source, self.fraction, self.name = make_source, float(fraction), name
        self.rows: Optional[int] = None
        self._it: Any = None

    def bind(self, batch_size: int) -> "ReplayMix":
        """Start the source for batches of ``batch_size`` replayed rows. Returns self.

        Raises:
            ValueError: bound twice (one replay per mix).
        """
        if self.rows is not None:
            raise ValueError(f"ReplayMix({self.name}): already bound to a replay")
        self.rows = max(1, min(int(batch_size) - 1, int(round(self.fraction * int(batch_size)))))
        self._it = iter(self.make_source(self.rows))
        return self

    def take(self) -> sb.MultiAgentBatch:
        """The source's next batch (``rows`` rows per policy, or fewer)."""
        return next(self._it)

    @staticmethod
    def combine(online: sb.MultiAgentBatch, offline: sb.MultiAgentBatch) -> sb.MultiAgentBatch:
        """Per policy, the replayed rows then the source's, in the columns both have (the
        source's rows get ``batch_indexes`` -1, never updated as priorities, and importance
        weights 1). ``env_steps``: all rows."""
        out = {}
        for pid, on in online.policy_batches.items():
            off = offline.policy_batches.get(pid)
            if off is None or not len(off):
                out[pid] = on
                continue
            n = len(off)
            extra = {sb.BATCH_INDEXES: np.full(n, -1, np.int64), sb.PRIO_WEIGHTS: np.ones(n, np.float32)}
            cols = [k for k in on if k in off or k in extra]
            out[pid] = sb.SampleBatch({k: np.concatenate([on[k], off[k] if k in off else extra[k]]) for k in cols})
        return sb.MultiAgentBatch(out, env_steps=max(len(b) for b in out.values()))


def Replay(ctx: "RunContext", buffer: MultiAgentReplayBuffer, batch_size: int, learning_starts: int,
           wait_s: float = 0.01, mix: Optional[ReplayMix] = None) -> Flow:
    """A source of replayed MultiAgentBatches of ``batch_size`` rows per policy.

    NOT_READY until ``ctx.counters["env_steps_sampled"] >= learning_starts`` and a policy
    buffer holds ``batch_size`` rows. When it is not ready and the buffer has not grown since
    it last said so, it sleeps ``wait_s`` seconds first, so a driver whose every branch is
    waiting does not spin (in a round-robin with the store branch the buffer grows between
    two asks, and it never sleeps).

    ``mix`` (a bound :class:`ReplayMix`): each batch takes the source's next batch (``k``
    rows) and ``batch_size - k`` rows from the buffer; ``dataset_rows_replayed`` counts the
    source's rows.
    """
    def gen():
        last_added = -1
        while True:
            if ctx.counters["env_steps_sampled"] < learning_starts or not buffer.can_sample(batch_size):
                if buffer.num_env_steps_added == last_added:
                    time.sleep(wait_s)
                last_added = buffer.num_env_steps_added
                yield NOT_READY
                continue
            with ctx.timers["replay"]:
                if mix is None:
                    b = buffer.sample(batch_size)
                else:
                    off = mix.take()
                    k = max((len(pb) for pb in off.policy_batches.values()), default=0)
                    b = buffer.sample(batch_size - k)
                    if b is not None:
                        b = mix.combine(b, off)
                        ctx.counters["dataset_rows_replayed"] += k
            yield b
    name = f"Replay(batch_size={batch_size}, learning_starts={learning_starts}"
    if mix is None:
        return Flow(gen, name + ")", (), ctx)
    src = Flow(lambda: iter(()), mix.name, (), ctx)  # shown in the plan; read through the mix
    return Flow(gen, f"{name}, mix={mix.fraction:g} of {mix.rows} rows from the source)", (src,), ctx)


def store_train_weights(training_intensity: float, round_env_steps: int, batch_size: int) -> List[float]:
    """Round-robin weights ``[1, k]`` of a (store, train) pair of branches: ``k`` train steps
    of ``batch_size`` replayed rows per stored round of ``round_env_steps`` env steps, so that
    rows trained / env steps sampled = ``training_intensity`` (fractional ``k`` accumulates)."""
    return [1, float(training_intensity) * int(round_env_steps) / int(batch_size)]


# ---- Ape-X: replay shards ---------------------------------------------------------------------
class ReplayShard(MultiAgentReplayBuffer):
    """One replay shard (an actor): a :class:`MultiAgentReplayBuffer` of ``capacity``
    transitions per policy. ``replay()`` returns ``batch_size`` rows per policy, or None until
    the shard has received ``learning_starts`` env steps and holds a whole batch."""

    def __init__(self, index: int, capacity: int, batch_size: int, learning_starts: int,
                 prioritized: bool, alpha: float, beta: float, eps: float, seed: int):
        super().__init__(capacity, prioritized, alpha, beta, eps, seed)
        self.index, self.batch_size, self.learning_starts = index, int(batch_size), int(learning_starts)

    def replay(self) -> Optional[sb.MultiAgentBatch]:
        if self.num_env_steps_added < self.learning_starts or not self.can_sample(self.batch_size):
            return None
        return self.sample(self.batch_size)

    def ping(self) -> bool:
        return True


class ReplayShards:
    """``num_shards`` :class:`ReplayShard` actors (Ray actors with ``num_cpus=0``, or
    in-process objects on the local backend), started on first use so ``flowkit plan`` starts
    nothing. Each shard gets ``capacity // num_shards`` transitions per policy and
    ``learning_starts // num_shards`` env steps before it serves batches; shard ``i`` seeds its
    sampler from ``derive_seed(seed, "replay_shard", i)``. Checkpointable (register with
    ``ctx.add_stateful``): a state set before the shards start is applied when they do."""

    def __init__(self, backend: str, num_shards: int, capacity: int, batch_size: int, learning_starts: int,
                 prioritized: bool, alpha: float, beta: float, eps: float, seed: int):
        self.backend, self.num_shards, self.prioritized = backend, int(num_shards), bool(prioritized)
        self.kw: Dict[str, Any] = dict(capacity=max(1, int(capacity) // self.num_shards), batch_size=int(batch_size),
                       learning_starts=int(learning_starts) // self.num_shards, prioritized=bool(prioritized),
                       alpha=alpha, beta=beta, eps=eps)
        self.seed = int(seed)
        self._actors: Optional[List[Any]] = None
        self._pending: List[Dict[str, Any]] = []  # shard states set before the shards started
        self.next_shard = 0

    @property
    def actors(self) -> List[Any]:
        return list(self._actors if self._actors is not None else self._start())

    def _start(self) -> List[Any]:
        from flowkit.core._envs import derive_seed
        out: List[Any] = []
        for i in range(self.num_shards):
            args = dict(self.kw, index=i, seed=derive_seed(self.seed, "replay_shard", i))
            if self.backend == "local":
                out.append(LocalActor(ReplayShard(**args), i))
            else:
                import ray
                cls = ray.remote(num_cpus=0, max_restarts=0)(ReplayShard)
                out.append(RayActor(cls.remote(**args), i))
        for a in out:
            get_result(a.submit("ping"))
        self._actors = out
        for a, st in zip(out, self._pending):
            get_result(a.submit("set_state", st))
        self._pending = []
        return out

    def get_state(self, include_replay: bool = True) -> Dict[str, Any]:
        shards = (self._pending if self._actors is None
                  else [get_result(a.submit("get_state", include_replay)) for a in self._actors])
        return {"shards": shards, "next_shard": self.next_shard}

    def set_state(self, st: Dict[str, Any]) -> None:
        if len(st["shards"]) not in (0, self.num_shards):
            raise ValueError(f"checkpoint has {len(st['shards'])} replay shards, this run has "
                             f"{self.num_shards} (dqn.num_replay_shards)")
        self.next_shard = int(st["next_shard"])
        if self._actors is None:
            self._pending = list(st["shards"]) or self._pending  # empty: no shard states saved
        else:
            for a, s in zip(self._actors, st["shards"]):
                get_result(a.submit("set_state", s))

    def stop(self) -> None:
        for a in self._actors or []:
            if a.is_remote:
                import ray
                with contextlib.suppress(Exception):
                    ray.kill(a.handle)
        self._actors = None


class StoreToReplayShards:
    """Send each experience (``(worker, MultiAgentBatch)`` or a batch) to the next shard in
    round-robin order (fire and forget; calls to one actor run in order). Passes items on."""

    def __init__(self, shards: ReplayShards):
        self.shards = shards
        self.name = f"StoreToReplayShards({shards.num_shards})"

    def __call__(self, item: Any) -> Any:
        actors = self.shards.actors
        a = actors[self.shards.next_shard % len(actors)]
        self.shards.next_shard = (self.shards.next_shard + 1) % len(actors)
        fut = a.submit("add", item.item if isinstance(item, Sourced) else item)
        if not a.is_remote:
            get_result(fut)  # surface errors at once on the local backend
        return item


def ReplayFromShards(ctx: "RunContext", shards: ReplayShards, num_async: int = 2) -> Flow:
    """Replayed batches from the shards in completion order (``gather_async``), with
    ``ctx.current_actor`` set to the serving shard (follow with ``zip_with_source_actor``).
    A shard that is not ready yet answers None, which becomes NOT_READY."""
    src = ParallelFlow(lambda: shards.actors, "replay", "ReplayShards", ctx).gather_async(num_async=num_async)
    return src.for_each(lambda x: NOT_READY if x is None else x,
                        f"ReplayFromShards({shards.num_shards} shards, num_async={num_async})")
