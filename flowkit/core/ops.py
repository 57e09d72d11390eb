"""RL operators: the building blocks algorithms compose their dataflow from.

None of them mutates its input: arrays that arrive from Ray are read-only, and a duplicated
stream hands the same batch to several branches.
"""
from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np

from flowkit.config import ConfigError, schedule_horizon
from flowkit.core import batch as sb
from flowkit.core.algorithm import RANDOM, Algorithm
from flowkit.core.flow import NOT_READY, Flow, ParallelFlow, RoundRobinCursor, Sourced, union_tagged
from flowkit.core.learner import Learner
from flowkit.core.policy import RandomPolicy

if TYPE_CHECKING:
    from flowkit.core.context import RunContext


# ---- sources ---------------------------------------------------------------------------------
def ParallelRollouts(ctx: "RunContext", mode: str = "bulk_sync", num_async: Optional[int] = None,
                     prefetch: bool = False) -> Flow:
    """Experiences from the rollout workers of ``ctx.workers``.

    Args:
        mode: ``bulk_sync`` (one MultiAgentBatch per round: every worker's fragment,
            concatenated), ``async`` (one per worker fragment, in completion order, with
            ``ctx.current_actor`` set to the producing worker) or ``async_gradients`` (as
            ``async``, but each worker computes the gradients of the policies whose algorithm
            has this mode on its fragment and sends them instead of its rows:
            :meth:`RolloutWorker.compute_gradients`; one request in flight per worker, the
            next one sent once the item was used, with the weights queued for it: A3C).
        num_async: async mode: sample requests in flight per worker (default
            ``runtime.async_requests_per_worker``).
        prefetch: bulk_sync mode: request the next round before handing this one on.
    Counts ``env_steps_sampled`` and ``agent_steps_sampled`` and records finished episodes
    in ``ctx`` for StandardMetricsReporting. With ``ctx.output`` (``run.output``), that writer
    follows as the next operator: it takes the env's own values out of each batch
    (``meta["raw"]``) and writes the episodes they complete.
    """
    def sample_args(actor):  # weights waiting to travel with this actor's next request
        f = getattr(ctx.workers, "sample_args", None)
        return f(actor) if f is not None else ()
    grads = mode == "async_gradients"
    pids = [p for p, s in ctx.policy_specs.items() if getattr(s, "trainable", True) and s.algo in ctx.algorithms
            and ctx.algorithms[s.algo].get_rollout_mode() == mode] if grads else []
    pf = ParallelFlow(lambda: ctx.workers.actors, "compute_gradients" if grads else "sample",
                      "ParallelGradients" if grads else "ParallelRollouts", ctx,
                      on_failure=lambda a, e: ctx.workers.on_failure(a, e), method_args=(pids,) if grads else (),
                      args_fn=sample_args)

    def account(a, b: sb.MultiAgentBatch) -> sb.MultiAgentBatch:
        ctx.workers.mark_success(a)
        ctx.counters["env_steps_sampled"] += b.env_steps
        ctx.counters["agent_steps_sampled"] += b.agent_steps
        ctx.mark("first_sample")
        ctx.metrics.record_episodes(b.episodes)
        ctx.counters["episodes_total"] += len(b.episodes)
        return b

    def account_round(items: List[Tuple[Any, sb.MultiAgentBatch]]) -> Any:
        return sb.MultiAgentBatch.concat([account(a, b) for a, b in items]) if items else NOT_READY

    if mode == "bulk_sync":
        flow = pf.gather_sync(per_round=True, prefetch=prefetch).for_each(
            account_round, f"ParallelRollouts(bulk_sync{', prefetch' if prefetch else ''})")
    elif mode in ("async", "async_gradients"):  # A3C's: one gradient request in flight per worker
        num_async = 1 if grads else int(ctx.config.runtime.async_requests_per_worker) if num_async is None else num_async
        label = mode if grads else f"async, num_async={num_async}"
        flow = pf.gather_async(num_async=num_async, resubmit_after_use=grads).for_each(
            lambda b: account(ctx.current_actor, b), f"ParallelRollouts({label})")
    else:
        raise ValueError(f"ParallelRollouts: mode must be bulk_sync, async or async_gradients, got {mode!r}")
    if ctx.output is not None:
        ctx.output.wired = True
        flow = flow.for_each(ctx.output, ctx.output.name)
    return flow


# ---- batch transforms ------------------------------------------------------------------------
class ConcatBatches:
    """Accumulate MultiAgentBatches until they hold at least ``min_batch_size`` env steps,
    then emit their concatenation (a combine/flat-map operator)."""

    def __init__(self, min_batch_size: int):
        self.min_batch_size = int(min_batch_size)
        self.name = f"ConcatBatches({self.min_batch_size})"
        self.buf: List[sb.MultiAgentBatch] = []
        self.count = 0

    def __call__(self, b: sb.MultiAgentBatch) -> List[sb.MultiAgentBatch]:
        self.buf.append(b)
        self.count += b.env_steps
        if self.count < self.min_batch_size:
            return []
        out = sb.MultiAgentBatch.concat(self.buf)
        self.buf, self.count = [], 0
        return [out]


class SelectExperiences:
    """Keep only the batches of ``policy_ids`` (a new MultiAgentBatch; the input is not
    changed), of a MultiAgentBatch or of a :class:`Sourced` one (async streams)."""

    def __init__(self, policy_ids: Iterable[str]):
        self.policy_ids = list(policy_ids)
        self.name = f"SelectExperiences({self.policy_ids})"

    def __call__(self, b: Any) -> Any:
        if isinstance(b, Sourced):
            return Sourced(b.actor, b.item.select(self.policy_ids))
        return b.select(self.policy_ids)


def standardize(x: np.ndarray, eps: float = 1e-8) -> np.ndarray:
    """(x - mean) / std; only centred when std < eps; unchanged for fewer than 2 values."""
    x = np.asarray(x, np.float32)
    if x.size < 2:
        return x.copy()
    c, s = x - x.mean(), x.std()
    return c if s < eps else c / s


class StandardizeFields:
    """Standardize columns (e.g. ``advantages``) of every policy batch (copies)."""

    def __init__(self, fields: Sequence[str]):
        self.fields = list(fields)
        self.name = f"StandardizeFields({self.fields})"

    def __call__(self, b: sb.MultiAgentBatch) -> sb.MultiAgentBatch:
        out = {pid: sb.SampleBatch({**pb, **{f: standardize(pb[f]) for f in self.fields if f in pb}})
               for pid, pb in b.policy_batches.items()}
        return sb.MultiAgentBatch(out, b.env_steps, b.agent_steps, b.episodes, b.worker_index, b.meta)


# ---- learning --------------------------------------------------------------------------------
def record_training(ctx: "RunContext", stats: Dict[str, Dict[str, float]], env_steps: int, agent_steps: int,
                    num_updates: int) -> Dict[str, Any]:
    """Count one train step's work into ``ctx`` (driver thread; :class:`TrainOneStep`, and the
    accounting of plans on :func:`WorkerRounds` that train elsewhere): ``env_steps_trained``,
    ``agent_steps_trained`` and ``num_updates`` counters, ``{policy_id: stats}`` into
    ``ctx.metrics.learner_stats``, and the time of the first train step. Returns a train
    operator's output, ``{"stats": stats, "num_updates": num_updates}``."""
    c = ctx.counters
    c["env_steps_trained"] += env_steps
    c["agent_steps_trained"] += agent_steps
    c["num_updates"] += num_updates
    ctx.metrics.learner_stats.update(stats)
    ctx.mark("first_train")
    return {"stats": stats, "num_updates": num_updates}


class TrainOneStep:
    """Train ``learner``'s policies on each batch: ``num_epochs`` passes over minibatches of
    ``minibatch_size`` rows (None: the whole batch), shuffled (seeded) or, with
    ``contiguous``, contiguous slices in order (see :class:`Learner`).

    Inline (``flow.for_each(TrainOneStep(...))``): one update per batch in the driver.
    Threaded (``TrainOneStep(...).in_thread(flow)``): the learner trains in its background
    thread; see :meth:`in_thread`.

    Output: the learner's result (``{"batch", "stats": {policy_id: mean stats},
    "num_updates", ...}``). Counts ``env_steps_trained``, ``agent_steps_trained`` and
    ``num_updates``, stores ``ctx.metrics.learner_stats`` and refreshes the ``perf/*`` figures.
    """

    def __init__(self, ctx: "RunContext", learner: Learner, num_epochs: int = 1,
                 minibatch_size: Optional[int] = None, contiguous: bool = False):
        self.ctx, self.learner = ctx, learner
        learner.configure(num_epochs, minibatch_size, contiguous)
        self.perf = PerfMonitor(ctx, learner)
        self.name = f"TrainOneStep({learner.describe()})"

    def record(self, out: Dict[str, Any]) -> Dict[str, Any]:
        """Count a learner result into the context (driver thread only)."""
        record_training(self.ctx, out["stats"], out["env_steps"], out["agent_steps"], out["num_updates"])
        self.perf.update()
        return out

    def __call__(self, b: sb.MultiAgentBatch) -> Dict[str, Any]:
        with self.ctx.timers["learn"]:
            out = self.learner.update(b)
        return self.record(out)

    def in_thread(self, flow: Flow, queue_size: int = 2, wait_s: float = 0.01, result_wait_s: float = 0.005) -> Flow:
        """Train in the learner's thread: one branch puts the batches of ``flow`` into its
        in-queue (at most ``queue_size`` waiting; when full the batch is kept, the branch
        blocks ``wait_s`` s and yields NOT_READY: back-pressure), the other takes its results
        (blocking ``result_wait_s`` s when none is ready); ``Concurrently(async)`` of the two
        yields the results. The thread starts on the first pull; a crash in it is re-raised
        here with its own type and traceback (:meth:`Learner.check_alive`)."""
        ctx, learner = self.ctx, self.learner

        def enqueue():
            learner.start(queue_size)
            for x in flow:
                if x is NOT_READY:
                    learner.check_alive()
                    yield x
                    continue
                while not learner.put(x, wait_s):
                    ctx.counters["learner_queue_full"] += 1
                    yield NOT_READY
                yield x

        def dequeue():
            learner.start(queue_size)
            while True:
                out = learner.get(result_wait_s)
                yield NOT_READY if out is None else self.record(out)
        put = Flow(enqueue, f"{self.name}: to the learner thread (queue {queue_size})", [flow], ctx)
        get = Flow(dequeue, f"{self.name}: results of the learner thread", (), ctx)
        return Concurrently([put, get], mode="async", output_indexes=[1])


class ApplyGradients(TrainOneStep):
    """Apply the gradients a worker computed (items ``(worker, MultiAgentBatch)`` of
    ``ParallelRollouts(mode="async_gradients")``) with :meth:`Learner.apply_gradients`; output
    ``(worker, learner result)``. Counts as :class:`TrainOneStep` does."""

    def __init__(self, ctx: "RunContext", learner: Learner):
        super().__init__(ctx, learner)
        self.name = "ApplyGradients"

    def __call__(self, item: Sourced) -> Sourced:  # type: ignore[override]  # items are (worker, batch)
        with self.ctx.timers["learn"]:
            out = self.learner.apply_gradients(item.item)
        return Sourced(item.actor, self.record(out))


class NoTraining:
    """For policies nobody trains (random, frozen): every batch is one empty train step."""

    name = "NoTraining"

    def __call__(self, b: sb.MultiAgentBatch) -> Dict[str, Any]:
        return {"batch": b, "stats": {}}


class RandomAlgorithm(Algorithm, ref=RANDOM):
    """The built-in ``random`` algorithm: acts uniformly over legal actions, learns nothing."""
    policy_class, off_policy = RandomPolicy, True

    def training_flow(self, experiences: Optional[Flow], ctx: "RunContext", learner: Learner) -> Flow:
        assert experiences is not None  # (it consumes rollouts)
        return experiences.for_each(NoTraining())


class SyncWeights:
    """Send ``learner``'s weights (and their version) to rollout workers. Passes items on.

    Args:
        to: ``all`` (every worker, one ``ray.put``) or ``source`` (items are ``(worker,
            item)``: the worker that produced it; a worker never synced, e.g. a restarted
            one, gets them at once).
        every: ``unit``s between two syncs (per worker with ``to=source``; 0: every item).
        unit: ``env_steps`` (trained, ``ctx.counters["env_steps_trained"]``) or ``batches``
            (items seen).
        with_next_sample: no call of its own: the weights ride on the worker's next sample
            request. Weights of a version a worker already has are not sent again.
    """

    def __init__(self, ctx: "RunContext", learner: Learner, to: str = "all", every: int = 0,
                 unit: str = "env_steps", with_next_sample: bool = False):
        if to not in ("all", "source") or unit not in ("env_steps", "batches") or int(every) < 0:
            raise ValueError(f"SyncWeights: to must be all or source, unit env_steps or batches, every "
                             f">= 0; got to={to!r}, unit={unit!r}, every={every}")
        self.ctx, self.learner, self.to, self.every, self.unit = ctx, learner, to, int(every), unit
        self.with_next_sample = bool(with_next_sample)
        # keyed by worker index (-1 with to=all):
        self.last: Dict[int, Tuple[Any, int]] = {}   # -> (actor, units at its last sync)
        self.seen: Dict[int, int] = {}               # -> items seen
        self.sent: Dict[int, Tuple[Any, int]] = {}   # -> (actor, version sent)
        self.name = f"SyncWeights(to={to}" + (f", every={every} {unit}" if every else "") + \
            (", with next sample" if with_next_sample else "") + ")"

    def __call__(self, item: Any) -> Any:
        actor = item.actor if self.to == "source" else None
        i = getattr(actor, "index", -1)
        self.seen[i] = self.seen.get(i, 0) + 1
        now = self.seen[i] if self.unit == "batches" else self.ctx.counters["env_steps_trained"]
        # env-step syncs to a source start with its first item; otherwise `every` units pass first
        first = -self.every if self.to == "source" and self.unit == "env_steps" else 0
        last = self.last.get(i, (actor, first))
        if last[0] is not actor or now - last[1] >= self.every:  # a restarted worker, or due
            self.last[i] = (actor, now)
            self._send(actor)
        return item

    def _send(self, actor: Any) -> None:
        version, w = self.learner.get_weights()
        i = getattr(actor, "index", -1)
        if actor is not None and self.sent.get(i) == (actor, version):
            return  # it has these weights already
        with self.ctx.timers["sync_weights"]:
            self.ctx.workers.sync_weights(w, actors=None if actor is None else [actor], version=version,
                                          with_next_sample=self.with_next_sample)
        if actor is not None:
            self.sent[i] = (actor, version)
            self.ctx.counters["num_weight_pushes"] += 1


class UpdateTargetNetwork:
    """Update the target network (``policy.target.update()``) of each policy trained in a train result whenever its
    gradient-step count ``policy.num_updates`` crosses a multiple of ``freq`` (so the timing
    survives checkpoint/restore: it depends only on ``num_updates``). Passes items on
    (train results, or ``(source, result)``)."""

    def __init__(self, ctx: "RunContext", learner: Learner, freq: int):
        self.ctx, self.learner, self.freq = ctx, learner, int(freq)
        self.name = f"UpdateTargetNetwork(every {self.freq} gradient steps)"

    def __call__(self, item: Any) -> Any:
        for pid, st in (item.item if isinstance(item, Sourced) else item)["stats"].items():
            pol: Any = self.learner.policies[pid]  # a policy with a target network
            now = pol.num_updates
            before = now - int(st.get("num_sgd_steps", 1))
            if now // self.freq > before // self.freq:
                pol.target.update()
                self.ctx.counters["num_target_updates"] += 1
        return item


class UpdatePriorities:
    """Send new priorities (each trained policy's ``td_error``, float32[B], set by its
    ``loss``) for the rows of a replay batch back to where the batch came from: ``buffer``
    for plain train results, or the shard actor of ``(shard, result)`` items (Ape-X).

    Raises:
        ValueError: a trained policy's ``td_error`` is not set (None) or has not one value
            per replayed row (naming the policy).
    """

    def __init__(self, learner: Learner, buffer: Any = None):
        self.learner, self.buffer = learner, buffer
        self.name = "UpdatePriorities"

    def __call__(self, item: Any) -> Any:
        shard, res = item if isinstance(item, Sourced) else (None, item)
        prios = {}
        for pid in res["stats"]:
            pol = self.learner.policies[pid]
            td = getattr(pol, "td_error", None)
            pb = res["batch"].policy_batches[pid]
            if sb.BATCH_INDEXES not in pb:
                continue
            if td is None or np.shape(td) != (len(pb),):
                got = "not set" if td is None else f"of shape {list(np.shape(td))}"
                raise ValueError(f"policy {pid!r}: prioritized replay needs {type(pol).__name__}.loss to set "
                                 f"`self.td_error` (float32[B], one per replayed row: {len(pb)}); it is {got}, "
                                 "so the priorities would never change")
            prios[pid] = (np.asarray(pb[sb.BATCH_INDEXES]), np.asarray(td))
        if prios and shard is not None:
            shard.submit("update_priorities", prios)  # fire and forget; ordered per actor
        elif prios:
            self.buffer.update_priorities(prios)
        return item


class UpdateSchedules:
    """Set the schedule progress (``Policy.set_progress``) of ``learner``'s trained policies
    to env steps sampled / ``horizon``. Passes its input through."""

    def __init__(self, ctx: "RunContext", learner: Learner, horizon: int):
        self.ctx, self.learner, self.horizon = ctx, learner, int(horizon)
        self.name = f"UpdateSchedules(horizon={horizon})"

    def __call__(self, item: Any) -> Any:
        frac = self.ctx.counters["env_steps_sampled"] / self.horizon
        for pid in self.learner.trainable:
            self.learner.policies[pid].set_progress(frac)
        return item


def algorithm_flow(algo: Any, experiences: Optional[Flow], ctx: "RunContext", learner: Learner,
                   **flow_args: Any) -> Flow:
    """``algo.training_flow(experiences, ctx, learner, **flow_args)``, preceded by
    :class:`UpdateSchedules` when one of the algorithm's declared schedules (its section's
    ``*_schedule`` keys, see :func:`flowkit.config.schedule_keys`) is ``linear``: plans never
    wire schedules themselves (``experiences`` None, an algorithm that consumes no rollouts: it
    sets its own progress). Called by every plan builder (one algorithm, or one per multi-agent
    group). ``flow_args``: the keyword arguments of a kind of algorithm (``mix``, a
    :class:`~flowkit.core.replay.ReplayMix`: off-policy ones pass it to :func:`ReplayPlan`)."""
    horizon = schedule_horizon(algo.config, algo.run_config)
    if horizon is not None and experiences is not None:
        experiences = experiences.for_each(UpdateSchedules(ctx, learner, horizon))
    return algo.training_flow(experiences, ctx, learner, **flow_args)


def algorithm_plan(ctx: "RunContext", algo: Any, **flow_args: Any) -> Flow:
    """The plan of a run of one algorithm over all policies, with one Learner (named after it):
    rollouts in its rollout mode (async ones with their source actor; none where it consumes
    no rollouts: ``Algorithm.consumes_rollouts``) into :func:`algorithm_flow` (``flow_args``
    passed on)."""
    mode = algo.get_rollout_mode()
    experiences = ParallelRollouts(ctx, mode=mode, prefetch=ctx.prefetch) if algo.consumes_rollouts else None
    if experiences is not None and mode != "bulk_sync":  # async, async_gradients
        experiences = experiences.zip_with_source_actor()
    return algorithm_flow(algo, experiences, ctx, ctx.add_learner(algo.name, ctx.policy_ids), **flow_args)


# ---- worker rounds ---------------------------------------------------------------------------
def WorkerRounds(ctx: "RunContext", requests: Callable[[int], Sequence[Callable[[Any], Dict[str, Any]]]],
                 name: str) -> Flow:
    """The source of a plan that consumes no rollouts (``Algorithm.consumes_rollouts = False``:
    ES, ARS, DD-PPO, MAML): rounds of work on every rollout worker, bulk-synchronous::

        each round: requests(n) -> worker i runs request i (RolloutWorker.apply) -> account

    Args:
        requests: called once per round with the number of workers ``n``; returns ``n``
            picklable callables, the i-th for ``ctx.workers.actors[i]``. Each is called with
            its RolloutWorker and returns plain data: a dict with at least ``env_steps`` and
            ``agent_steps`` (counted as sampled) and ``episodes`` (``[{"return", "length"}]``:
            recorded as the run's episodes and counted in ``episodes_total``).
        name: the source's name in ``flowkit plan``.

    Output: one list per round, the results of the workers that answered, in worker order; a
    worker that failed is replaced (``ctx.workers.on_failure``) and missing from its round's
    list. A round where none answered is NOT_READY.
    """
    made: Dict[str, Any] = {"round": -1, "done": 0, "requests": {}}

    def args(actor: Any) -> tuple:
        if made["round"] != made["done"]:  # the round's first request: made for the workers of now
            actors = list(ctx.workers.actors)
            made.update(round=made["done"], requests={id(a): r for a, r in zip(actors, requests(len(actors)),
                                                                              strict=True)})
        return (made["requests"][id(actor)],)

    def account(items: List[Tuple[Any, Dict[str, Any]]]) -> Any:
        made["done"] += 1
        if not items:
            return NOT_READY
        c = ctx.counters
        for actor, r in items:
            ctx.workers.mark_success(actor)
            c["env_steps_sampled"] += int(r["env_steps"])
            c["agent_steps_sampled"] += int(r["agent_steps"])
            ctx.metrics.record_episodes(r["episodes"])
            c["episodes_total"] += len(r["episodes"])
        ctx.mark("first_sample")
        return [r for _, r in items]
    rounds = ParallelFlow(lambda: ctx.workers.actors, "apply", name, ctx,
                          on_failure=lambda a, e: ctx.workers.on_failure(a, e), args_fn=args)
    return rounds.gather_sync(per_round=True).for_each(account, "AccountWorkerRounds")


# ---- composition -----------------------------------------------------------------------------
def ReplayPlan(ctx: "RunContext", learner: Learner, experiences: Flow, buffer: Any, batch_size: int,
               learning_starts: int, target_update_freq: int, round_robin_weights: Sequence[float],
               store_ops: Sequence[Any] = (), train_ops: Sequence[Any] = (), num_async: int = 2,
               mix: Optional[Any] = None) -> Flow:
    """The off-policy replay plan of DQN, Ape-X, R2D2, SAC and TD3 (Mnih et al. 2015; Horgan
    et al. 2018 for the shards)::

        store = experiences -> StoreToReplayBuffer(buffer) -> *store_ops
        train = Replay(buffer) -> TrainOneStep -> [UpdatePriorities] -> UpdateTargetNetwork -> *train_ops
        Concurrently([store, train], round_robin, output_indexes=[1], round_robin_weights)

    ``buffer``: a :class:`~flowkit.core.replay.MultiAgentReplayBuffer`, or
    :class:`~flowkit.core.replay.ReplayShards` (Ape-X: StoreToReplayShards; the train branch
    replays from the shards, ``num_async`` requests in flight per shard, keeps each batch's
    shard so new priorities go back to it, and drops it after ``train_ops``).
    UpdatePriorities runs when the buffer is prioritized. ``store_ops`` / ``train_ops``: the
    algorithm's own operators (exploration, weight sync) after each branch.
    ``round_robin_weights``: ``[1, k]``, k train steps per stored item
    (:func:`~flowkit.core.replay.store_train_weights`); where the cycle stands is checkpointed
    (``<learner>/store_train_cycle``), so a resumed run takes the train steps its last
    iteration left in the cycle. ``mix``: a :class:`~flowkit.core.replay.ReplayMix`, a share of
    each replayed batch from a second source (the offline plugin's ``input.mix``: a dataset; the
    local buffer only: ConfigError with shards). ``batch_size`` and ``learning_starts``
    serve the local buffer only (shards replay the batch size and wait for the
    ``learning_starts // num_shards`` env steps they were built with); ``num_async`` serves the
    shards only. The plan adds its warm-up check to ``ctx.warmup`` (true while fewer than
    ``learning_starts`` env steps were sampled), so the warm-up's iterations end on sampled
    batches (:func:`StandardMetricsReporting`)."""
    from flowkit.core import replay
    shards = isinstance(buffer, replay.ReplayShards)
    if shards and mix is not None:
        raise ConfigError(f"{mix.name}: replay shards (Ape-X) do not mix a second source into their batches; "
                          "use one local replay buffer")
    store = experiences.for_each(replay.StoreToReplayShards(buffer) if shards else replay.StoreToReplayBuffer(buffer))
    starts = int(learning_starts)
    ctx.warmup.append(lambda: ctx.counters["env_steps_sampled"] < starts)
    for op in store_ops:
        store = store.for_each(op)
    if shards:
        train = (replay.ReplayFromShards(ctx, buffer, num_async).zip_with_source_actor()
                 .for_each(TrainOneStep(ctx, learner), keep_source=True))
    else:
        train = replay.Replay(ctx, buffer, batch_size, learning_starts,
                              mix=None if mix is None else mix.bind(batch_size)).for_each(TrainOneStep(ctx, learner))
    if buffer.prioritized:
        train = train.for_each(UpdatePriorities(learner, None if shards else buffer))
    train = train.for_each(UpdateTargetNetwork(ctx, learner, target_update_freq))
    for op in train_ops:
        train = train.for_each(op)
    if shards:
        train = train.drop_source()
    cursor = ctx.add_stateful(f"{learner.name}/store_train_cycle", RoundRobinCursor(2))
    return Concurrently([store, train], mode="round_robin", output_indexes=[1], round_robin_weights=round_robin_weights,
                        cursor=cursor)


def Concurrently(flows: Sequence[Flow], mode: str = "round_robin",
                 output_indexes: Optional[Sequence[int]] = None,
                 round_robin_weights: Optional[Sequence[Any]] = None, cursor: Optional[RoundRobinCursor] = None) -> Flow:
    """Run several flows as one: ``round_robin`` (strict order, each branch asked for its
    weight in items per cycle; a not-ready branch ends its turn) or ``async`` (whichever
    branch is ready). Only items of ``output_indexes`` (default: all) are passed on.
    ``cursor`` (round_robin): where the cycle stands, for a plan to checkpoint
    (:class:`~flowkit.core.flow.RoundRobinCursor`)."""
    if mode not in ("round_robin", "async"):
        raise ValueError(f"Concurrently: mode must be round_robin or async, got {mode!r}")
    if round_robin_weights is not None and mode != "round_robin":
        raise ValueError("Concurrently: round_robin_weights need mode=round_robin")
    tagged = union_tagged(flows, deterministic=(mode == "round_robin"), weights=round_robin_weights, cursor=cursor)
    keep = None if output_indexes is None else set(output_indexes)
    name = f"Concurrently({mode}" + (f", output_indexes={sorted(keep)}" if keep is not None else "") + ")"
    return tagged.for_each(lambda x: NOT_READY if keep is not None and x[0] not in keep else x[1], name)


def StandardMetricsReporting(train_flow: Flow, ctx: "RunContext") -> Flow:
    """Turn a flow of train steps into one flat result dict per iteration.

    An iteration is at least one train step, extended until ``run.min_iter_time_s`` seconds
    and ``run.min_iter_env_steps`` env steps have passed, but not past the ``stop.env_steps``
    budget (it ends at the first train step that reaches it). In the replay warm-up (nothing
    trained yet, and every check of ``ctx.warmup`` true: fewer env steps sampled than each
    replay plan's ``learning_starts``) an iteration ends on a sampled batch instead, without
    train steps, once those thresholds are met; so does the sampled batch that reaches
    ``stop.env_steps`` while nothing has been trained (``learning_starts >= stop.env_steps``
    trains nothing). Columns: iteration,
    env_steps_sampled, env_steps_trained, agent_steps_*, episode_return_mean / episode_len_mean
    (last 20 episodes), episodes_this_iter, episodes_total, policy/<id>/episode_return_mean,
    learner/<id>/<stat>, custom/<name> (mean over this iteration's episodes), num_worker_restarts,
    dataset_epochs and dataset_rows_replayed (runs that read a dataset: ``input.dataset``),
    time_total_s, time_this_iter_s, env_steps_per_s, perf/* timers.
    """
    run, budget, warmup = ctx.config.run, ctx.config.stop.env_steps, ctx.warmup
    min_time_s, min_env_steps = float(run.min_iter_time_s), int(run.min_iter_env_steps)

    def gen():
        t_iter, n_items = time.perf_counter(), 0
        steps_at_iter, trained_at_iter = ctx.counters["env_steps_sampled"], ctx.counters["env_steps_trained"]
        for x in train_flow:
            if x is NOT_READY:  # a sampled batch (or none): in the warm-up it may end the iteration
                if n_items or not warmup or ctx.counters["num_updates"] or \
                        ctx.counters["env_steps_sampled"] == steps_at_iter:
                    yield x
                    continue
            else:
                n_items += 1
            now = time.perf_counter()
            sampled = ctx.counters["env_steps_sampled"]
            short = (now - t_iter) < min_time_s or (sampled - steps_at_iter) < min_env_steps
            if budget is None or sampled < budget:
                if short or (x is NOT_READY and not all(w() for w in warmup)):
                    if x is NOT_READY:
                        yield x
                    continue
            trained = ctx.counters["env_steps_trained"]
            res = ctx.make_result(now - t_iter, sampled - steps_at_iter, trained - trained_at_iter, n_items)
            t_iter, steps_at_iter, trained_at_iter, n_items = now, sampled, trained, 0
            yield res
    return Flow(gen, "StandardMetricsReporting", [train_flow], ctx)


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
    """Sets ``ctx.metrics.extra`` (merged into every result) at most every ``period_s``
    seconds:

    - ``perf/learner_queue_size``: train batches waiting in the learner's in-queue (mean over
      the train steps of the period);
    - ``perf/learner_throughput_env_steps_per_s``: env steps trained per second of the
      learner's busy time (its capacity) and ``perf/learner_busy_frac`` (busy time / wall);
    - ``perf/cpu_util_driver``: CPU seconds of the driver process (all its threads) per wall
      second (1.0 = one core busy);
    - ``perf/cpu_util_workers``: the same, mean over rollout worker processes (Ray workers on
      this machine; absent on the local backend, where workers run in the driver).

    With several learners (multi-agent groups) the learner figures are ``perf/<group>/learner_*``.
    """

    def __init__(self, ctx: "RunContext", learner: Learner, period_s: float = 1.0):
        self.ctx, self.learner, self.period_s = ctx, learner, float(period_s)
        self._t: Optional[float] = None
        self._cpu: Dict[int, Optional[float]] = {}
        self._pids: Optional[List[int]] = None
        self._restarts, self._busy, self._trained = 0, 0.0, 0
        self._qsizes: List[int] = []

    def _sample(self) -> Dict[int, Optional[float]]:
        """CPU seconds of the driver and of the Ray worker processes."""
        ws, me = self.ctx.workers, os.getpid()
        if ws.backend == "ray" and (self._pids is None or self._restarts != ws.num_restarts):
            self._restarts = ws.num_restarts      # a rebuilt worker is a new process
            try:
                self._pids = [int(p) for p in ws.foreach_worker("get_pid")]
            except Exception:
                self._pids = []
        return {p: process_cpu_s(p) for p in [me] + [p for p in self._pids or [] if p != me]}

    def update(self, force: bool = False) -> None:
        """Call once per train step; refreshes the figures every ``period_s`` seconds."""
        now, lr = time.perf_counter(), self.learner
        self._qsizes.append(lr.inqueue.qsize())
        if self._t is None:
            self._t, self._cpu, self._busy, self._trained = now, self._sample(), lr.busy_s, lr.env_steps_trained
            return
        dt = now - self._t
        if dt < self.period_s and not force:
            return
        cpu, m, me = self._sample(), self.ctx.metrics.extra, os.getpid()
        used = {p: (c - c0) / dt for p, c in cpu.items() if c is not None and (c0 := self._cpu.get(p)) is not None}
        if me in used:
            m["perf/cpu_util_driver"] = used.pop(me)
        if used:
            m["perf/cpu_util_workers"] = float(np.mean(list(used.values())))
        busy, trained = lr.busy_s, lr.env_steps_trained
        k = "perf/learner" if len(getattr(self.ctx, "learners", ())) <= 1 else f"perf/{lr.name}/learner"
        if busy > self._busy:
            m[f"{k}_throughput_env_steps_per_s"] = (trained - self._trained) / (busy - self._busy)
        m[f"{k}_busy_frac"] = (busy - self._busy) / dt
        m[f"{k}_queue_size"] = float(np.mean(self._qsizes))  # (this call's size at least)
        self._t, self._cpu, self._busy, self._trained, self._qsizes = now, cpu, busy, trained, []
