"""The dataflow substrate: lazy, pull-based streams, local and sharded over actors.

After *RLlib Flow* (Liang, Wu et al., NeurIPS 2021, arXiv 2011.12719), section 4.

- :class:`Flow` is a driver-local stream. Nothing runs until an item is pulled. A stage that
  cannot produce now yields :data:`NOT_READY`; transforms pass it through untouched, unions
  move on to their next branch, and sources that wait on something (actors, queues) block
  briefly before they say not-ready, so a driver whose every branch is waiting sleeps instead
  of spinning.
- :class:`ParallelFlow` is one shard per actor; its transforms run on the actors.
  ``gather_sync()`` yields one item per shard per round (bulk-synchronous);
  ``gather_async(num_async)`` yields items in completion order and records the source actor
  in the context (``zip_with_source_actor`` reads it).
- :class:`FlowContext` is the shared per-plan state: counters, timers, the current source
  actor.

Every stream describes itself (``describe()``, ``to_text()``, ``to_mermaid()``) without
running anything. An exception raised inside an operator keeps its type and message; a note
naming the operator (and the worker for actor-side errors) is attached (PEP 678).
"""
from __future__ import annotations

import collections
import dataclasses
import itertools
import math
import re
import time
from typing import Any, Callable, ContextManager, Deque, Dict, Iterable, Iterator, List, NamedTuple, Optional, Sequence


class Sourced(NamedTuple):
    """An item of an async stream with the actor it came from (a rollout worker, a replay
    shard): made by :meth:`Flow.zip_with_source_actor`; operators that need the actor
    (``SyncWeights(to="source")``, ``UpdatePriorities``) read ``.actor``, the others are
    applied to ``.item`` with ``for_each(op, keep_source=True)``; ``drop_source()`` ends it."""
    actor: Any
    item: Any


class SampleTimeout(TimeoutError):
    """A rollout worker did not answer a sample request within ``runtime.sample_timeout_s``
    (handled like a crashed worker: rebuilt)."""


class _NotReady:
    """Sentinel: "nothing now, ask again later". Never a real item."""

    def __repr__(self) -> str:
        return "NOT_READY"

    def __reduce__(self) -> str:
        return "NOT_READY"  # pickled by name: unpickles (and copies) as this very object


NOT_READY = _NotReady()


class TimerStat:
    """Accumulates wall time of a code region (``with ctx.timers["learn"]: ...``), seconds."""

    __slots__ = ("total_s", "count", "_t0", "last_s")

    def __init__(self):
        self.total_s, self.count, self._t0, self.last_s = 0.0, 0, 0.0, 0.0

    def __enter__(self):
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.last_s = time.perf_counter() - self._t0
        self.total_s += self.last_s
        self.count += 1

    @property
    def mean_s(self) -> float:
        return self.total_s / self.count if self.count else 0.0


@dataclasses.dataclass(eq=False, kw_only=True)
class FlowContext:
    """Shared state of one plan: ``counters`` (env_steps_sampled, env_steps_trained,
    agent_steps_sampled, ...), ``timers`` and the ``current_actor`` of the last item an async
    gather produced."""

    counters: Dict[str, int] = dataclasses.field(default_factory=collections.Counter)
    timers: Dict[str, TimerStat] = dataclasses.field(default_factory=lambda: collections.defaultdict(TimerStat))
    current_actor: Any = None
    info: Dict[str, Any] = dataclasses.field(default_factory=dict)

    def mark(self, phase: str) -> None:
        """A run's phase reached (the engine's RunContext records its time)."""


def _op_name(fn: Any) -> str:
    return getattr(fn, "name", None) or getattr(fn, "__name__", None) or type(fn).__name__


def _annotate(exc: BaseException, where: str) -> None:
    note = f"[flowkit] raised in {where}"
    if note not in getattr(exc, "__notes__", []):
        exc.add_note(note)


class Flow:
    """A lazy driver-local stream.

    Args:
        source: a zero-argument callable returning an iterator (called on first pull).
        name: the operator name shown by ``describe()``.
        parents: upstream flows (for the graph description).
        ctx: the shared :class:`FlowContext`.
    """

    def __init__(self, source: Callable[[], Iterator[Any]], name: str,
                 parents: Sequence["Flow"] = (), ctx: Optional[FlowContext] = None):
        self._source = source
        self._it: Optional[Iterator[Any]] = None
        self.name = name
        self.parents = list(parents)
        self.ctx: FlowContext = ctx if ctx is not None else (parents[0].ctx if parents else FlowContext())

    # ---- iteration -----------------------------------------------------------------------
    def __iter__(self):
        return self

    def __next__(self):
        if self._it is None:
            self._it = iter(self._source())
        return next(self._it)

    def take(self, n: int, skip_not_ready: bool = True) -> List[Any]:
        """Pull ``n`` real items (NOT_READY is skipped unless ``skip_not_ready=False``)."""
        items = (x for x in self if x is not NOT_READY) if skip_not_ready else self
        return list(itertools.islice(items, n))

    # ---- combinators ---------------------------------------------------------------------
    def for_each(self, fn: Callable[[Any], Any], name: Optional[str] = None, keep_source: bool = False) -> "Flow":
        """Apply ``fn`` to every item (one output per input, NOT_READY passed through; ``fn``
        may return NOT_READY). ``name``: shown by ``describe()`` (default: ``fn``'s name).
        ``keep_source``: items are :class:`Sourced`; ``fn`` gets ``.item`` and its result
        keeps the actor."""
        if keep_source:
            return self.combine(lambda x: (Sourced(x.actor, fn(x.item)),), (name or _op_name(fn)) + " (with source)")
        return self.combine(lambda x: (fn(x),), name or _op_name(fn))

    def drop_source(self) -> "Flow":
        """:class:`Sourced` items -> their ``item``."""
        return self.for_each(lambda x: x.item, "DropSource")

    def combine(self, fn: Callable[[Any], Iterable[Any]], name: Optional[str] = None) -> "Flow":
        """Flat-map: ``fn(item)`` returns a list of zero or more outputs."""
        name = name or _op_name(fn)

        def gen():
            for x in self:
                if x is NOT_READY:
                    yield x
                    continue
                try:
                    ys = fn(x)
                except Exception as e:
                    _annotate(e, f"operator {name}")
                    raise
                if not ys:
                    yield NOT_READY  # nothing yet: let unions move on
                yield from ys
        return Flow(gen, name, [self], self.ctx)

    def filter(self, pred: Callable[[Any], bool]) -> "Flow":
        """Keep the items for which ``pred(item)`` is true (the others become NOT_READY)."""
        return self.for_each(lambda x: x if pred(x) else NOT_READY, f"filter({_op_name(pred)})")

    def batch(self, n: int) -> "Flow":
        """Group ``n`` consecutive items into a list."""
        def gen():
            buf: List[Any] = []
            for x in self:
                if x is NOT_READY:
                    yield x
                    continue
                buf.append(x)
                if len(buf) >= n:
                    yield buf
                    buf = []
        return Flow(gen, f"batch({n})", [self], self.ctx)

    def flatten(self) -> "Flow":
        """Yield the elements of each (iterable) item; as :meth:`combine`, an empty item
        yields NOT_READY."""
        return self.combine(lambda x: x, "flatten")

    def zip_with_source_actor(self) -> "Flow":
        """Items become :class:`Sourced` ``(actor, item)``, the actor read from the context as
        set by the async gather that produced the item."""
        return self.for_each(lambda x: Sourced(self.ctx.current_actor, x), "zip_with_source_actor")

    def duplicate(self, n: int, max_buffer: int = 4) -> List["Flow"]:
        """``n`` flows that each see every item of this one.

        Buffers are bounded: when a branch lags ``max_buffer`` items behind, the branches
        ahead of it yield NOT_READY (back-pressure) until it catches up.
        """
        bufs: List[Deque[Any]] = [collections.deque() for _ in range(n)]

        def make(i: int):
            def gen():
                while True:
                    if bufs[i]:
                        yield bufs[i].popleft()
                        continue
                    if any(len(b) >= max_buffer for j, b in enumerate(bufs) if j != i):
                        yield NOT_READY
                        continue
                    try:
                        x = next(self)
                    except StopIteration:
                        return
                    if x is not NOT_READY:  # every other branch gets it too
                        for b in bufs[:i] + bufs[i + 1:]:
                            b.append(x)
                    yield x
            return gen
        return [Flow(make(i), f"duplicate[{i}/{n}]", [self], self.ctx) for i in range(n)]

    def union(self, *others: "Flow", deterministic: bool = True,
              weights: Optional[Sequence[float]] = None) -> "Flow":
        """Interleave this flow with ``others``; see :func:`union_tagged` for the order."""
        tagged = union_tagged([self, *others], deterministic=deterministic, weights=weights)
        return tagged.for_each(lambda x: x[1], "union")

    # ---- description ---------------------------------------------------------------------
    def describe(self) -> Dict[str, Any]:
        """The graph up to this flow: ``{"nodes": [(id, name)], "edges": [(from, to)]}``."""
        ids: Dict[int, str] = {}
        nodes: List[tuple] = []
        edges: List[tuple] = []

        def visit(f: "Flow") -> str:
            if id(f) in ids:
                return ids[id(f)]
            nid = f"n{len(ids)}"
            ids[id(f)] = nid
            nodes.append((nid, f.name))
            edges.extend((visit(p), nid) for p in f.parents)
            return nid
        visit(self)
        return {"nodes": nodes, "edges": edges}

    def to_text(self) -> str:
        """An indented tree, sink first, each line ``<- upstream``."""
        lines: List[str] = []
        seen: Dict[int, int] = {}

        def walk(f: "Flow", depth: int):
            if id(f) in seen:
                lines.append("  " * depth + f"<- {f.name} (shared, see above)")
                return
            seen[id(f)] = 1
            lines.append("  " * depth + ("" if depth == 0 else "<- ") + f.name)
            for p in f.parents:
                walk(p, depth + 1)
        walk(self, 0)
        return "\n".join(lines)

    def to_mermaid(self) -> str:
        """The graph as a Mermaid ``flowchart LR`` (sources on the left)."""
        g = self.describe()
        return "\n".join(["flowchart LR", *(f'    {nid}["{name}"]' for nid, name in g["nodes"]),
                          *(f"    {a} --> {b}" for a, b in g["edges"])])

    def __repr__(self) -> str:
        return f"Flow({self.name})"


def from_items(items: Iterable[Any], name: str = "from_items", repeat: bool = False,
               ctx: Optional[FlowContext] = None) -> Flow:
    """A flow over a fixed list of items (tests, replay of recorded batches)."""
    items = list(items)
    return Flow(lambda: itertools.cycle(items) if repeat else iter(items), name, (), ctx)


def from_callable(fn: Callable[[], Any], name: str, ctx: Optional[FlowContext] = None) -> Flow:
    """An endless source calling ``fn()`` on each pull (it may return NOT_READY)."""
    return Flow(lambda: (fn() for _ in itertools.count()), name, (), ctx)


class RoundRobinCursor:
    """Where a weighted round-robin union stands (:func:`union_tagged`): the branch whose turn
    it is, the items left in that turn and the fractional credit of each branch. A plan
    registers it with ``ctx.add_stateful`` so a resumed run picks the cycle up where the
    checkpoint left it: an iteration ends inside the train branch's turn (after its first
    train step once enough env steps were sampled; in the replay warm-up, after a store
    turn), and without the cursor a resume would start a fresh cycle and drop that turn's
    remaining train steps (``k - 1`` gradient steps per resume for weights ``[1, k]``)."""

    def __init__(self, num_branches: int):
        self.credit: List[float] = [0.0] * int(num_branches)
        self.turn: Optional[int] = None  # the branch inside its turn; None between turns
        self.left: float = 0.0  # items that turn may still take (math.inf: "*")

    def get_state(self) -> Dict[str, Any]:
        return {"credit": list(self.credit), "turn": self.turn, "left": float(self.left)}

    def set_state(self, state: Dict[str, Any]) -> None:
        credit = [float(c) for c in state["credit"]]
        if len(credit) != len(self.credit):
            raise ValueError(f"round-robin cursor of {len(credit)} branches restored into a union of {len(self.credit)}")
        self.credit, self.turn, self.left = credit, state["turn"], float(state["left"])


def union_tagged(flows: Sequence[Flow], deterministic: bool = True,
                 weights: Optional[Sequence[float]] = None, cursor: Optional[RoundRobinCursor] = None) -> Flow:
    """Interleave ``flows``, yielding ``(branch_index, item)``.

    Round-robin: in each cycle branch ``i`` is asked for ``weights[i]`` items (fractional
    weights accumulate as credit across cycles; ``"*"`` means "as many as it has ready").
    A branch that answers NOT_READY ends its turn early. ``deterministic=True`` keeps the
    strict cycle order; ``deterministic=False`` (async) starts each cycle at the branch after
    the one that produced last, so no branch is favoured. When a whole cycle produced nothing
    the union yields NOT_READY (its sources have already blocked briefly). The union ends
    when every branch has ended. ``cursor`` (deterministic only): the position in the cycle,
    kept there as the union goes and read when it starts, so a restored cursor continues a
    checkpointed turn (:class:`RoundRobinCursor`).
    """
    flows = list(flows)
    n = len(flows)
    w: List[Any] = list(weights) if weights is not None else [1] * n
    if len(w) != n:
        raise ValueError(f"union: {len(w)} weights for {n} flows")
    if cursor is not None and (not deterministic or len(cursor.credit) != n):
        raise ValueError(f"union: a cursor needs a deterministic round-robin of its {len(cursor.credit)} branches")
    ctx = flows[0].ctx

    def gen():
        c = cursor if cursor is not None else RoundRobinCursor(n)
        alive = [True] * n
        start = 0
        resumed = c.turn  # a checkpointed turn: the first cycle starts inside it
        while any(alive):
            produced = False
            order = list(range(n)) if deterministic else [(start + k) % n for k in range(n)]
            if resumed is not None:
                order, resumed = order[resumed:], None
            for i in order:
                if not alive[i]:
                    continue
                if c.turn != i:  # a new turn: its quota from the weight and the credit
                    quota: float = math.inf  # "*": as many as it has ready
                    if w[i] != "*":
                        c.credit[i] += float(w[i])
                        quota = int(c.credit[i] + 1e-9)
                        c.credit[i] -= quota
                    c.turn, c.left = i, quota
                while c.left > 0:
                    try:
                        x = next(flows[i])
                    except StopIteration:
                        alive[i] = False
                        break
                    if x is NOT_READY:  # the rest of this turn is forfeit
                        break
                    c.left -= 1
                    produced = True
                    start = (i + 1) % n
                    yield (i, x)
                c.turn, c.left = None, 0.0
            if not produced and any(alive):
                yield NOT_READY
    return Flow(gen, "union" + ("" if weights is None else f"(weights={list(w)})"), flows, ctx)


# ---- actors ----------------------------------------------------------------------------
class LocalFuture:
    """A finished result (or error) of a call on a :class:`LocalActor`."""

    __slots__ = ("value", "error")

    def __init__(self, value=None, error: Optional[BaseException] = None):
        self.value, self.error = value, error


class LocalActor:
    """In-process stand-in for a Ray actor: ``submit`` runs the method at once.
    ``timeout_s``: the longest a :class:`ParallelFlow` call may take (None: no limit).
    ``deadline(seconds, what)``: a context manager that interrupts a call running longer with
    :class:`SampleTimeout` (the engine hands in its watchdog's; None: not interrupted)."""

    is_remote = False
    timeout_s: Optional[float] = None
    deadline: Optional[Callable[[float, str], ContextManager[Any]]] = None

    def __init__(self, obj: Any, index: int = 0):
        self.obj, self.index = obj, index

    def submit(self, method: str, *args, **kwargs) -> LocalFuture:
        try:
            return LocalFuture(getattr(self.obj, method)(*args, **kwargs))
        except Exception as e:
            return LocalFuture(error=e)

    def __repr__(self) -> str:
        return f"LocalActor({self.index})"


class RayActor:
    """A Ray actor handle plus its index (``timeout_s`` as for :class:`LocalActor`)."""

    is_remote = True
    timeout_s: Optional[float] = None

    def __init__(self, handle: Any, index: int = 0):
        self.handle, self.index = handle, index

    def submit(self, method: str, *args, **kwargs):
        return getattr(self.handle, method).remote(*args, **kwargs)

    def __repr__(self) -> str:
        return f"RayActor({self.index})"


def get_result(fut: Any, timeout_s: Optional[float] = None) -> Any:
    """The value of a future from :meth:`LocalActor.submit` or :meth:`RayActor.submit`;
    re-raises the actor's exception with its original type (``ray.exceptions.GetTimeoutError``
    after ``timeout_s``)."""
    if isinstance(fut, LocalFuture):
        if fut.error is not None:
            raise fut.error
        return fut.value
    import ray
    try:
        return ray.get(fut, timeout=timeout_s)
    except ray.exceptions.RayTaskError as e:
        cause = e.cause if isinstance(getattr(e, "cause", None), Exception) else None
        if cause is None:
            raise e.as_instanceof_cause() from None
        # the actor's own exception object (exact type, message and notes), plus the
        # remote frames, which its unpickled copy has lost
        lines = re.sub(r"\x1b\[[0-9;]*m", "", str(e)).splitlines()
        last = max((k for k, ln in enumerate(lines) if ln.startswith("  ")), default=-1)
        if last >= 0:
            cause.add_note("[flowkit] remote traceback, " + "\n".join(lines[:last + 1]))
        raise cause from None


class ParallelFlow:
    """One shard per actor. ``actors_fn()`` gives the current actors (it may change between
    rounds when workers are restarted); each shard item is ``actor.<method>()`` followed by
    the shard transforms, run on the actor through its ``apply_flow`` method.

    ``on_failure(actor, exc) -> bool`` decides what a failed shard call means: True = handled
    (item dropped, the actor replaced), False = re-raise with a note naming the actor. A call
    not answered within the actor's ``timeout_s`` fails with :class:`SampleTimeout` (on the
    local backend the actor's ``deadline`` interrupts it).
    """

    def __init__(self, actors_fn: Callable[[], List[Any]], method: str, name: str,
                 ctx: Optional[FlowContext] = None,
                 on_failure: Optional[Callable[[Any, BaseException], bool]] = None,
                 transforms: Sequence[Callable] = (), method_args: Sequence[Any] = (),
                 args_fn: Optional[Callable[[Any], tuple]] = None):
        self.actors_fn, self.method, self.name = actors_fn, method, name
        self.args_fn = args_fn  # actor -> extra arguments of its next call (e.g. weights to apply)
        self.ctx = ctx or FlowContext()
        self.on_failure = on_failure
        self.transforms = list(transforms)
        self.method_args = tuple(method_args)

    def for_each(self, fn: Callable) -> "ParallelFlow":
        """Apply ``fn`` on the actor to each shard item (``fn`` must be picklable)."""
        return ParallelFlow(self.actors_fn, self.method, f"{self.name}.for_each({_op_name(fn)})",
                            self.ctx, self.on_failure, self.transforms + [fn], self.method_args, self.args_fn)

    def _submit(self, actor):
        args = self.method_args + (self.args_fn(actor) if self.args_fn is not None else ())
        if self.transforms:
            args, method = (self.method, self.transforms) + args, "apply_flow"
        else:
            method = self.method
        if actor.timeout_s is None or actor.is_remote or actor.deadline is None:
            return actor.submit(method, *args)
        with actor.deadline(actor.timeout_s, f"rollout worker {actor.index}"):
            return actor.submit(method, *args)

    @staticmethod
    def _timeout(actor) -> SampleTimeout:
        return SampleTimeout(f"rollout worker {actor.index} did not answer a sample request within "
                             f"runtime.sample_timeout_s={actor.timeout_s} s")

    def _failed(self, actor, exc: BaseException):
        if self.on_failure is not None and self.on_failure(actor, exc):
            return
        _annotate(exc, f"{self.name} on worker {getattr(actor, 'index', '?')}")
        raise exc

    def gather_sync(self, per_round: bool = False, prefetch: bool = False) -> Flow:
        """Each round: call every actor, wait for all, yield their items in actor order
        (``per_round=True``: one list of ``(actor, item)`` per round). ``prefetch`` submits
        the next round before the current one is handed on (sampling overlaps learning, one
        round stale). The time the driver waits for a round's items is ``ctx.timers["sample_wait"]``
        (``perf/sample_wait_time_ms``: its mean per round)."""
        def gen():
            nxt = None
            def submit_all():
                return [(a, self._submit(a), time.monotonic()) for a in self.actors_fn()]
            while True:
                futs = nxt if nxt is not None else submit_all()
                got = []
                with self.ctx.timers["sample_wait"]:  # the driver blocked on the round's items
                    for a, f, t in futs:
                        try:
                            wait = None if a.timeout_s is None else max(0.0, t + a.timeout_s - time.monotonic())
                            got.append((a, get_result(f, wait)))
                        except Exception as e:
                            self._failed(a, self._timeout(a) if isinstance(e, TimeoutError) and a.is_remote else e)
                nxt = submit_all() if prefetch else None
                if per_round:
                    yield got
                    continue
                for a, x in got:
                    self.ctx.current_actor = a
                    yield x
        return Flow(gen, f"{self.name}.gather_sync" + ("(prefetch)" if prefetch else ""), (), self.ctx)

    def gather_async(self, num_async: int = 1, wait_s: float = 0.05, resubmit_after_use: bool = False) -> Flow:
        """Keep ``num_async`` calls in flight per actor; yield items as they complete and set
        ``ctx.current_actor`` to their source. NOT_READY after ``wait_s`` seconds of nothing.
        An actor's next call goes out before its item is handed on (it never idles), or, with
        ``resubmit_after_use``, when the next item is pulled, i.e. after the consumers are done
        with this one (arguments they queued for that actor, such as weights, go with it)."""
        def gen():
            inflight: Dict[Any, Any] = {}  # future -> actor
            since: Dict[int, float] = {}   # id(actor) -> its last answer, or first request after none

            def refill():
                actors = list(self.actors_fn())
                per = collections.Counter(id(a) for a in inflight.values())
                for a in actors:
                    if not per[id(a)]:
                        since[id(a)] = time.monotonic()
                    for _ in range(num_async - per[id(a)]):
                        inflight[self._submit(a)] = a

            def stuck():  # remote actors silent for longer than their timeout_s
                now = time.monotonic()
                for a in {id(a): a for a in inflight.values()}.values():
                    if a.timeout_s is not None and now - since.get(id(a), now) > a.timeout_s:
                        for f in [f for f, b in inflight.items() if b is a]:
                            del inflight[f]
                        self._failed(a, self._timeout(a))
            while True:
                refill()
                stuck()
                ready: List[Any] = [f for f in inflight if isinstance(f, LocalFuture)]  # (local calls are done)
                if not ready and inflight:  # remote ones: wait up to wait_s for one
                    import ray
                    ready = ray.wait(list(inflight), num_returns=1, timeout=wait_s)[0]
                if not ready:
                    yield NOT_READY
                    continue
                for f in ready:
                    a = inflight.pop(f)
                    since[id(a)] = time.monotonic()
                    try:
                        x = get_result(f)
                    except Exception as e:
                        self._failed(a, e)
                        continue
                    # resubmit before handing the item on, so the actor never idles
                    # while the driver works on it (or after, see resubmit_after_use)
                    if not resubmit_after_use and any(a is b for b in self.actors_fn()):
                        inflight[self._submit(a)] = a
                    self.ctx.current_actor = a
                    yield x
                    if resubmit_after_use and any(a is b for b in self.actors_fn()):
                        inflight[self._submit(a)] = a
        after = ", resubmit after use" if resubmit_after_use else ""
        return Flow(gen, f"{self.name}.gather_async(num_async={num_async}{after})", (), self.ctx)

