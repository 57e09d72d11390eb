"""RL operators: the building blocks algorithms compose their dataflow from.

None of them mutates its input: arrays that arrive from Ray are read-only, and a duplicated
stream hands the same batch to several branches.
"""
from __future__ import annotations

import collections
import time
from typing import Any, Dict, Iterable, List, Optional, Sequence

import numpy as np

from flowkit.core import batch as sb
from flowkit.core.flow import NOT_READY, Flow, ParallelFlow, union_tagged


# ---- sources ---------------------------------------------------------------------------------
def ParallelRollouts(ctx: Any, mode: str = "bulk_sync", num_async: Optional[int] = None,
                     prefetch: bool = False) -> Flow:
    """Experiences from the rollout workers of ``ctx.workers``.

    Args:
        mode: ``bulk_sync`` (one MultiAgentBatch per round: every worker's fragment,
            concatenated) or ``async`` (one per worker fragment, in completion order, with
            ``ctx.current_actor`` set to the producing worker).
        num_async: async mode: sample requests in flight per worker (default
            ``runtime.async_requests_per_worker``).
        prefetch: bulk_sync mode: request the next round before handing this one on.
    Counts ``env_steps_sampled`` and ``agent_steps_sampled`` and records finished episodes
    in ``ctx`` for StandardMetricsReporting.
    """
    def sample_args(actor):  # weights waiting to travel with this actor's next request
        f = getattr(ctx.workers, "sample_args", None)
        return f(actor) if f is not None else ()
    pf = ParallelFlow(lambda: ctx.workers.actors, "sample", "ParallelRollouts", ctx,
                      on_failure=lambda a, e: ctx.workers.on_failure(a, e), args_fn=sample_args)

    def account(a, b: sb.MultiAgentBatch) -> sb.MultiAgentBatch:
        ctx.workers.mark_success(a)
        ctx.counters["env_steps_sampled"] += b.env_steps
        ctx.counters["agent_steps_sampled"] += b.agent_steps
        ctx.record_episodes(b.episodes)
        return b

    if mode == "bulk_sync":
        rounds = pf.gather_sync(per_round=True, prefetch=prefetch)

        def gen():
            for items in rounds:
                if not items:
                    yield NOT_READY
                    continue
                with ctx.timers["sample_wait"]:
                    batches = [account(a, b) for a, b in items]
                yield sb.MultiAgentBatch.concat(batches)
        return Flow(gen, f"ParallelRollouts(bulk_sync{', prefetch' if prefetch else ''})", [rounds], ctx)
    if mode == "async":
        if num_async is None:
            num_async = int(ctx.config.runtime.get("async_requests_per_worker", 2))
        if num_async < 1:
            raise ValueError(f"runtime.async_requests_per_worker must be >= 1, got {num_async}")
        src = pf.gather_async(num_async=num_async)

        def agen():
            for b in src:
                if b is NOT_READY:
                    yield b
                    continue
                yield account(ctx.current_actor, b)
        return Flow(agen, f"ParallelRollouts(async, num_async={num_async})", [src], ctx)
    raise ValueError(f"ParallelRollouts: mode must be bulk_sync or async, got {mode!r}")


# ---- batch transforms ------------------------------------------------------------------------
class ConcatBatches:
    """Accumulate MultiAgentBatches until they hold at least ``min_batch_size`` env steps,
    then emit their concatenation (a combine/flat-map operator)."""

    def __init__(self, min_batch_size: int):
        if min_batch_size < 1:
            raise ValueError(f"ConcatBatches: min_batch_size must be >= 1, got {min_batch_size}")
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
    """Keep only the batches of ``policy_ids`` (a new MultiAgentBatch)."""

    def __init__(self, policy_ids: Iterable[str]):
        self.policy_ids = list(policy_ids)
        self.name = f"SelectExperiences({self.policy_ids})"

    def __call__(self, b: sb.MultiAgentBatch) -> sb.MultiAgentBatch:
        return b.select(self.policy_ids)


def standardize(x: np.ndarray, eps: float = 1e-8) -> np.ndarray:
    """(x - mean) / std; only centred when std < eps; unchanged for fewer than 2 values."""
    x = np.asarray(x, np.float32)
    if x.size < 2:
        return x.copy()
    c = x - x.mean()
    s = x.std()
    return c if s < eps else c / s


class StandardizeFields:
    """Standardize columns (e.g. ``advantages``) of every policy batch (copies)."""

    def __init__(self, fields: Sequence[str]):
        self.fields = list(fields)
        self.name = f"StandardizeFields({self.fields})"

    def __call__(self, b: sb.MultiAgentBatch) -> sb.MultiAgentBatch:
        out = {}
        for pid, pb in b.policy_batches.items():
            nb = sb.SampleBatch(pb)
            for f in self.fields:
                if f in nb:
                    nb[f] = standardize(nb[f])
            out[pid] = nb
        return sb.MultiAgentBatch(out, b.env_steps, b.agent_steps, b.episodes, b.worker_index, b.meta)


# ---- learning --------------------------------------------------------------------------------
class TrainOneStep:
    """Train each (trainable) policy of a batch: ``num_epochs`` passes over shuffled
    minibatches of ``minibatch_size`` rows (None: the whole batch, one step per epoch).

    Output: ``{"batch": batch, "stats": {policy_id: mean stats}}``. Also stores the stats in
    ``ctx.learner_stats`` and counts ``env_steps_trained``, ``agent_steps_trained`` and
    ``num_updates``. Minibatch order comes from ``ctx.rng`` (seeded).
    """

    def __init__(self, ctx: Any, num_epochs: int = 1, minibatch_size: Optional[int] = None,
                 policy_ids: Optional[Sequence[str]] = None):
        self.ctx, self.num_epochs, self.minibatch_size = ctx, int(num_epochs), minibatch_size
        self.policy_ids = None if policy_ids is None else list(policy_ids)
        self.name = f"TrainOneStep(num_epochs={num_epochs}, minibatch_size={minibatch_size})"

    def __call__(self, b: sb.MultiAgentBatch) -> Dict[str, Any]:
        ctx = self.ctx
        out: Dict[str, Dict[str, float]] = {}
        with ctx.timers["learn"]:
            for pid, pb in b.policy_batches.items():
                if self.policy_ids is not None and pid not in self.policy_ids:
                    continue
                if pid not in ctx.trainable_policies or len(pb) == 0:
                    continue
                out[pid] = self.train_policy(ctx.learner[pid], pb)
                ctx.learner_stats[pid] = out[pid]
        ctx.counters["env_steps_trained"] += b.env_steps
        ctx.counters["agent_steps_trained"] += sum(len(pb) for pid, pb in b.policy_batches.items() if pid in out)
        return {"batch": b, "stats": out}

    def train_policy(self, policy: Any, pb: sb.SampleBatch) -> Dict[str, float]:
        tb = policy.prepare_batch(pb)
        n = len(pb)
        mbs = n if not self.minibatch_size else min(int(self.minibatch_size), n)
        sums: Dict[str, float] = collections.defaultdict(float)
        steps = 0
        for _ in range(self.num_epochs):
            perm = self.ctx.rng.permutation(n) if mbs < n else None
            for start in range(0, n, mbs):
                if perm is None:
                    mb = tb
                else:
                    idx = perm[start:start + mbs]
                    mb = {k: v[idx] for k, v in tb.items()}
                st = policy.learn_on_batch(mb)
                for k, v in st.items():
                    sums[k] += float(v)
                steps += 1
                self.ctx.counters["num_updates"] += 1
        stats = {k: v / max(steps, 1) for k, v in sums.items()}
        stats.update(policy.on_train_batch_end(tb) or {})
        stats["train_batch_size"] = n
        stats["num_sgd_steps"] = steps
        return stats


class BroadcastWeights:
    """Send the learner's weights to every rollout worker (one ``ray.put``), at most once per
    ``every`` env steps trained (0: after every train step). Passes its input through."""

    def __init__(self, ctx: Any, every: int = 0, policy_ids: Optional[Sequence[str]] = None):
        self.ctx, self.every = ctx, int(every)
        self.policy_ids = None if policy_ids is None else list(policy_ids)
        self.last = 0
        self.name = "BroadcastWeights" + (f"(every={every})" if every else "")

    def __call__(self, item: Any) -> Any:
        ctx = self.ctx
        trained = ctx.counters["env_steps_trained"]
        if self.every and trained - self.last < self.every:
            return item
        self.last = trained
        with ctx.timers["broadcast"]:
            ctx.workers.sync_weights(ctx.get_weights(self.policy_ids), version=ctx.counters["num_updates"])
        return item


class UpdateSchedules:
    """Set the learner policies' schedule progress (``Policy.set_progress``) to env steps
    sampled / ``horizon``: ``policy_ids``, or (None) the policies in each batch. Passes its
    input through."""

    def __init__(self, ctx: Any, horizon: int, policy_ids: Optional[Sequence[str]] = None):
        self.ctx, self.horizon = ctx, int(horizon)
        self.policy_ids = None if policy_ids is None else list(policy_ids)
        self.name = f"UpdateSchedules(horizon={horizon})"

    def __call__(self, item: Any) -> Any:
        frac = self.ctx.counters["env_steps_sampled"] / self.horizon
        for pid in self.policy_ids if self.policy_ids is not None else item.policy_batches:
            pol = self.ctx.learner.get(pid)  # None: not trained here (e.g. a frozen opponent)
            if pol is not None:
                pol.set_progress(frac)
        return item


# ---- composition -----------------------------------------------------------------------------
def Concurrently(flows: Sequence[Flow], mode: str = "round_robin",
                 output_indexes: Optional[Sequence[int]] = None,
                 round_robin_weights: Optional[Sequence[Any]] = None) -> Flow:
    """Run several flows as one: ``round_robin`` (strict order, each branch asked for its
    weight in items per cycle; a not-ready branch ends its turn) or ``async`` (whichever
    branch is ready). Only items of ``output_indexes`` (default: all) are passed on."""
    if mode not in ("round_robin", "async"):
        raise ValueError(f"Concurrently: mode must be round_robin or async, got {mode!r}")
    if round_robin_weights is not None and mode != "round_robin":
        raise ValueError("Concurrently: round_robin_weights need mode=round_robin")
    tagged = union_tagged(flows, deterministic=(mode == "round_robin"), weights=round_robin_weights)
    keep = None if output_indexes is None else set(output_indexes)

    def gen():
        for x in tagged:
            if x is NOT_READY:
                yield x
            elif keep is None or x[0] in keep:
                yield x[1]
            else:
                yield NOT_READY
    name = f"Concurrently({mode}" + (f", output_indexes={sorted(keep)}" if keep is not None else "") + ")"
    return Flow(gen, name, [tagged], flows[0].ctx)


def _mean(xs: List[float]) -> float:
    return float(np.mean(xs)) if xs else float("nan")


def StandardMetricsReporting(train_flow: Flow, ctx: Any) -> Flow:
    """Turn a flow of train steps into one flat result dict per iteration.

    An iteration is at least one train step, extended until ``run.min_iter_time_s`` seconds
    and ``run.min_iter_env_steps`` env steps have passed. Columns: iteration,
    env_steps_sampled, env_steps_trained, agent_steps_*, episode_return_mean / episode_len_mean
    (last 20 episodes), episodes_this_iter, episodes_total, policy/<id>/episode_return_mean,
    learner/<id>/<stat>, custom/<name> (mean over this iteration's episodes), num_worker_restarts,
    time_total_s, time_this_iter_s, env_steps_per_s, perf/* timers.
    """
    run = ctx.config.run

    def gen():
        t_iter = time.perf_counter()
        steps_at_iter = ctx.counters["env_steps_sampled"]
        trained_at_iter = ctx.counters["env_steps_trained"]
        n_items = 0
        for x in train_flow:
            if x is NOT_READY:
                yield x
                continue
            n_items += 1
            now = time.perf_counter()
            sampled = ctx.counters["env_steps_sampled"]
            if (now - t_iter) < float(run.min_iter_time_s) or \
                    (sampled - steps_at_iter) < int(run.min_iter_env_steps):
                continue
            dt = now - t_iter
            res = ctx.make_result(dt, sampled - steps_at_iter,
                                  ctx.counters["env_steps_trained"] - trained_at_iter, n_items)
            t_iter, steps_at_iter, n_items = now, sampled, 0
            trained_at_iter = ctx.counters["env_steps_trained"]
            yield res
    return Flow(gen, "StandardMetricsReporting", [train_flow], ctx)
