"""DD-PPO (Wijmans, Kadian, Morcos, Lee, Essa, Parikh, Savva, Batra 2020, "DD-PPO: Learning
Near-Perfect PointGoal Navigators from 2.5 Billion Frames", ICLR 2020, arXiv 1911.00357) as a
flowkit algorithm: PPO without a central learner.

One round (the plan's shape; the workers' side is :class:`TrainRound`):
    every worker samples up to ``fragments_per_round`` fragments with its own copy of the
    policy; once ``sync_frac`` of the workers hold a full batch, the others stop after their
    current fragment (the paper's preemption of stragglers, section 4; never below
    ``min_rollout_frac`` of a full batch). Each worker then runs PPO's epochs x minibatches on
    its own batch with PPO's own loss (:meth:`PPOPolicy.loss`; GAE was computed on the worker
    as for ``ppo``), every worker the same number of minibatches (ceil(full batch /
    minibatch_size), smaller ones after preemption). Before each optimizer step the gradients
    are all-reduced over the group (``torch.distributed``: gloo on CPU, NCCL on GPU):
        g = sum_w n_w g_w / sum_w n_w          (n_w: rows of worker w's minibatch)
    the gradient of the mean loss over the union of the workers' minibatches, i.e. a single
    learner's on the concatenated minibatch; global-norm clipping and Adam then run on the same
    numbers everywhere, so from the same start every worker holds the same weights (checked
    by a hash each round). The KL that drives the adaptive penalty is averaged the same way.
The driver learns nothing: it hosts the rendezvous (a ``TCPStore``; the group's keys are
prefixed by a generation, so a group that lost a worker re-forms under fresh keys), sends
each worker a :class:`TrainRound` request through core's ``WorkerRounds``, accounts the round
(:class:`GroupRounds`), and keeps worker 0's policy
state (weights, Adam, schedules) for checkpoints, evaluation and workers that join.
"""
from __future__ import annotations

import contextlib
import datetime
import hashlib
import math
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import torch

import flowkit
from flowkit.config import ConfigError
from flowkit.core import batch as sb
from flowkit.core import derive_seed
from flowkit.core.learner import Learner
from flowkit.core.ops import StandardizeFields, WorkerRounds, record_training
from flowkit_ppo import DDPPO_REF, min_fragments, num_minibatches
from flowkit_ppo.ppo import PPOPolicy

SHARED_STATE = ("weights", "optimizer", "num_updates", "clip_param", "kl_coeff")


# ---- the policy --------------------------------------------------------------------------------
class DDPPOPolicy(PPOPolicy):
    """PPO's policy (its loss unchanged) for learners on the workers: the workers keep the
    torch policy (DD-PPO trains there), and the KL that adapts ``kl_coeff`` is the group's
    mean (``group``, set on a worker's learner copy), so every worker adapts it alike."""

    group: Optional["ProcessGroup"] = None

    def worker_policy_class(self):
        return None  # the workers learn: they keep torch

    def on_train_batch_end(self, batch):
        if self.group is not None and self._kl_n:
            kl = self.group.allreduce_mean(torch.tensor([self._kl_sum / self._kl_n], device=self.device), 1)
            self._kl_sum, self._kl_n = float(kl[0]), 1
        return super().on_train_batch_end(batch)

    def shared_state(self) -> Dict[str, Any]:
        """What every worker of the group holds alike: weights, Adam's state, the update count
        and the schedules' values (not the RNG states: each worker samples its own actions)."""
        st = self.get_state()
        return {k: st[k] for k in SHARED_STATE if k in st}

    def weights_hash(self) -> str:
        """A hash of the flat parameters' bytes (equal on every worker after every update)."""
        return hashlib.blake2b(self._flat.detach().cpu().numpy().tobytes(), digest_size=8).hexdigest()


# ---- the group (worker side) -------------------------------------------------------------------
class ProcessGroup:
    """A worker's membership of the DD-PPO group of one generation: torch.distributed's default
    process group, rendezvous through the driver's TCPStore at ``(host, port)`` under the
    prefix ``ddppo/<generation>/``.

    Args:
        host: the driver's address.
        port: the port of the driver's TCPStore.
        rank: this worker's rank (its index).
        world_size: the number of workers.
        generation: the group's generation (the keys' prefix).
        backend: ``gloo`` or ``nccl``.
        timeout_s: the bound of the rendezvous and of every collective; past it they raise
            RuntimeError and the round is given up.
    """

    def __init__(self, host: str, port: int, rank: int, world_size: int, generation: int, backend: str,
                 timeout_s: float):
        import torch.distributed as dist
        td = datetime.timedelta(seconds=float(timeout_s))
        self.rank, self.world_size, self.generation = int(rank), int(world_size), int(generation)
        self.store = dist.PrefixStore(f"ddppo/{generation}/", dist.TCPStore(host, int(port), None, False, td))
        if dist.is_initialized():
            dist.destroy_process_group()
        dist.init_process_group(backend, store=self.store, rank=self.rank, world_size=self.world_size, timeout=td)
        self.allreduce_s = 0.0

    def allreduce_mean(self, x: torch.Tensor, weight: float) -> torch.Tensor:
        """The ``weight``-weighted mean of ``x`` over the group: ``sum w x / sum w``, one
        all-reduce of ``x`` and ``w`` together."""
        import torch.distributed as dist
        t0 = time.perf_counter()
        buf = torch.cat([x.reshape(-1) * float(weight), x.new_tensor([float(weight)])])
        dist.all_reduce(buf)
        self.allreduce_s += time.perf_counter() - t0
        return (buf[:-1] / buf[-1]).reshape(x.shape)

    def finished(self, round_index: int) -> int:
        """Workers that have sampled their batch of round ``round_index`` so far."""
        return int(self.store.add(f"done/{round_index}", 0))

    def mark_finished(self, round_index: int) -> None:
        self.store.add(f"done/{round_index}", 1)

    def close(self) -> None:
        import torch.distributed as dist
        with contextlib.suppress(Exception):
            if dist.is_initialized():
                dist.destroy_process_group()


def dist_backend(c: Any) -> str:
    """``ddppo.dist_backend``, ``auto`` resolved: nccl if the workers learn on cuda, else gloo."""
    return str(c.dist_backend) if c.dist_backend != "auto" else "nccl" if str(c.worker_device).startswith("cuda") else "gloo"


class _WorkerLearner:
    """What a worker keeps between rounds: its learner copy of the policy (on
    ``ddppo.worker_device``), the core :class:`Learner` over it and its group membership."""

    def __init__(self, worker: Any):
        self.pid, acting = next(iter(worker.policies.items()))
        if not isinstance(acting, DDPPOPolicy):
            raise ConfigError(f"ddppo: rollout worker {worker.index} holds a {type(acting).__name__}, not a DDPPOPolicy")
        dev = str(acting.config.worker_device)
        if dev.startswith("cuda") and not torch.cuda.is_available():
            raise ConfigError(f"ddppo.worker_device={dev!r} but rollout worker {worker.index} sees no CUDA device "
                              "(Ray gives its actors GPUs only when asked, which flowkit's WorkerSet does not yet do)")
        seed = derive_seed(int(worker.config.seed), "ddppo", worker.index, worker.restart_count)
        self.policy: DDPPOPolicy = type(acting)(acting.observation_space, acting.action_space, acting.config,
                                                acting.model_config, dev, seed)
        self.acting, self.config = acting, acting.config
        self.learner = Learner("ddppo", {self.pid: self.policy}, rng=np.random.default_rng(seed))
        self.group: Optional[ProcessGroup] = None

    def join(self, req: "TrainRound", rank: int) -> None:
        """Be in the group of ``req``'s generation (re-form after a loss); none for a world of 1."""
        if req.rendezvous is None or req.world_size <= 1:
            self.leave()
            return
        if self.group is not None and self.group.generation == req.generation:
            return
        self.leave()
        c = self.config
        if dist_backend(c) == "nccl" and str(c.worker_device).startswith("cuda"):
            torch.cuda.set_device(torch.device(str(c.worker_device)))
        self.group = ProcessGroup(*req.rendezvous, rank, req.world_size, req.generation, dist_backend(c),
                                  float(c.collective_timeout_s))
        self.learner.reducer = self.group.allreduce_mean
        self.policy.group = self.group

    def leave(self) -> None:
        if self.group is not None:
            self.group.close()
        self.group, self.learner.reducer, self.policy.group = None, None, None


@dataclass
class TrainRound:
    """One worker's round (``RolloutWorker.apply(request)``): join the group of
    ``generation`` (at ``rendezvous``, the driver's TCPStore; None: a world of 1), take
    ``state`` (the group's policy state, when given: the round after the group formed), set
    the schedules to ``progress`` (when given), sample up to ``ddppo.fragments_per_round``
    fragments (after :func:`~flowkit_ppo.min_fragments`, stop once ``sync_frac`` of the workers
    finished theirs), learn on them with gradients all-reduced (PPO's epochs of
    :func:`~flowkit_ppo.num_minibatches` minibatches), and hand the new weights to the worker's
    acting policy. The ``ddppo.*`` keys come from the worker policy's own config section.

    Returns (plain data): ``env_steps``, ``agent_steps``, ``episodes``, ``rows``, ``fragments``,
    ``preempted`` (bool), ``stats`` (the learner's mean stats), ``num_sgd_steps``,
    ``weights_hash``, ``sample_s``, ``learn_s``, ``allreduce_s``, ``worker_index``; worker 0
    also ``state`` (:meth:`DDPPOPolicy.shared_state`). A round given up (a collective failed:
    the group lost a worker) returns ``aborted`` (the error) with the sampling figures.
    """
    rendezvous: Optional[Tuple[str, int]]
    world_size: int
    generation: int
    round_index: int
    state: Optional[Dict[str, Any]]
    progress: Optional[float]

    name = "TrainRound"

    def __call__(self, worker: Any) -> Dict[str, Any]:
        wl = getattr(worker, "_ddppo", None)
        if wl is None:
            wl = worker._ddppo = _WorkerLearner(worker)
        rank = int(worker.index)
        out: Dict[str, Any] = {"worker_index": rank}
        try:
            wl.join(self, rank)
        except RuntimeError as e:
            wl.leave()
            return {**out, "aborted": f"rendezvous of generation {self.generation}: {type(e).__name__}: {e}",
                    "env_steps": 0, "agent_steps": 0, "episodes": []}
        pol, group, c = wl.policy, wl.group, wl.config
        if self.state is not None:
            pol.set_state(self.state)
        wl.learner.configure(int(c.num_epochs), num_minibatches=num_minibatches(c, worker.config))
        if self.progress is not None:
            pol.set_progress(self.progress)
        t0 = time.perf_counter()
        frags, need, most = [], math.ceil(float(c.sync_frac) * self.world_size - 1e-9), int(c.fragments_per_round)
        preempted = False
        for k in range(most):
            frags.append(worker.sample())
            if group is not None and min_fragments(c) <= k + 1 < most and group.finished(self.round_index) >= need:
                preempted = True
                break
        if group is not None:
            group.mark_finished(self.round_index)
        b = sb.MultiAgentBatch.concat(frags)
        b = sb.MultiAgentBatch(b.policy_batches, b.env_steps, b.agent_steps, b.episodes, b.worker_index, {})  # lag 0
        out.update(env_steps=b.env_steps, agent_steps=b.agent_steps, episodes=b.episodes, fragments=len(frags),
                   preempted=preempted, sample_s=time.perf_counter() - t0)
        if c.normalize_advantages == "batch":
            b = StandardizeFields([sb.ADVANTAGES])(b)
        t1, a0 = time.perf_counter(), group.allreduce_s if group is not None else 0.0
        try:
            res = wl.learner.update(b)
        except RuntimeError as e:
            if group is None:
                raise
            wl.leave()  # the group is broken; the next round joins a new one, with the driver's state
            return {**out, "aborted": f"all-reduce of round {self.round_index}: {type(e).__name__}: {e}"}
        wl.acting.set_weights(pol.get_weights())
        rows = sum(len(x) for x in b.policy_batches.values())
        out.update(rows=rows, stats=res["stats"].get(wl.pid, {}), num_sgd_steps=res["num_updates"],
                   weights_hash=pol.weights_hash(), learn_s=time.perf_counter() - t1,
                   allreduce_s=(group.allreduce_s - a0) if group is not None else 0.0)
        if rank == 0:
            out["state"] = pol.shared_state()
        return out


# ---- the driver's operators --------------------------------------------------------------------
class Rendezvous:
    """The driver's side of the group: a TCPStore server on a free port (started on first use,
    so ``flowkit plan`` starts nothing; closed when the run stops), at this node's address on
    Ray (``127.0.0.1`` in-process)."""

    def __init__(self, timeout_s: float):
        self.timeout_s = float(timeout_s)
        self._store: Any = None
        self.address: Optional[Tuple[str, int]] = None

    def start(self, backend: str) -> Tuple[str, int]:
        if self.address is None:
            import torch.distributed as dist
            host = "127.0.0.1"
            if backend == "ray":
                import ray
                host = ray.util.get_node_ip_address()
            self._store = dist.TCPStore(host, 0, None, True, datetime.timedelta(seconds=self.timeout_s),
                                        wait_for_workers=False)
            self.address = (host, int(self._store.port))
        return self.address

    def stop(self) -> None:
        self._store, self.address = None, None


class GroupRounds:
    """The driver's side of the rounds (:func:`flowkit.core.ops.WorkerRounds` makes them and
    counts the sampled steps and episodes): :meth:`requests` makes each worker's
    :class:`TrainRound`, :meth:`account` turns the round's results into one train result.

    A new generation (the group formed anew, every member sent the driver's policy state)
    starts at the first round, after a worker was replaced, and after a round that some worker
    gave up. :meth:`account` counts every worker's env steps as trained, checks that every
    worker holds the same weights (raises RuntimeError naming the hashes otherwise) and takes
    worker 0's policy state into the driver's policy (checkpoints, evaluation, the state of the
    next group). A round that a worker gave up, or lost a worker, trains nothing: the group
    re-forms (RuntimeError after ``max_aborted_rounds`` such rounds in a row)."""

    name = "AccountRound(weights identical on every worker; worker 0's state kept)"

    def __init__(self, ctx: Any, algo: "DDPPO", learner: Learner, pid: str, rendezvous: Rendezvous):
        self.ctx, self.algo, self.learner, self.pid, self.rendezvous = ctx, algo, learner, pid, rendezvous
        self.policy: Any = learner.policies[pid]  # a DDPPOPolicy
        self.round_index, self.generation, self.aborted_in_a_row = 0, -1, 0
        self._members: Tuple[Any, ...] = ()
        self.last_hashes: List[str] = []

    def requests(self, world: int) -> List[TrainRound]:
        ctx, c = self.ctx, self.algo.config
        members = tuple(ctx.workers.actors)
        state = None
        if len(members) != len(self._members) or any(a is not b for a, b in zip(members, self._members)):
            self.generation += 1
            self._members = members
            with self.learner.lock:
                state = self.policy.shared_state()
        rt = self.algo.run_config.runtime
        horizon = c.schedule_env_steps or self.algo.run_config.stop.env_steps
        full_round = world * int(c.fragments_per_round) * int(rt.num_envs_per_worker) * int(rt.rollout_fragment_length)
        progress = ((ctx.counters["env_steps_sampled"] + full_round) / horizon  # as PPO's: with this round's steps
                    if "linear" in (c.lr_schedule, c.clip_schedule) and horizon else None)
        return [TrainRound(self.rendezvous.start(ctx.workers.backend) if world > 1 else None, world,
                           self.generation, self.round_index, state, progress)] * world

    def account(self, results: List[Dict[str, Any]]) -> Dict[str, Any]:
        ctx, c, max_aborted = self.ctx, self.ctx.counters, int(self.algo.config.max_aborted_rounds)
        self.round_index += 1
        aborted = [r["aborted"] for r in results if "aborted" in r]
        if aborted or len(results) < ctx.workers.num_workers:
            self._members = ()  # a new group next round
            self.aborted_in_a_row += 1
            c["ddppo_aborted_rounds"] += 1
            if self.aborted_in_a_row >= max_aborted:
                raise RuntimeError(f"ddppo: {self.aborted_in_a_row} rounds in a row given up (ddppo.max_aborted_rounds="
                                   f"{max_aborted}): the workers' group could not train together; last: "
                                   f"{'; '.join(aborted) or 'a worker failed and was replaced'}")
            return {"stats": {}, "num_updates": 0}
        self.aborted_in_a_row = 0
        self.last_hashes = [r["weights_hash"] for r in sorted(results, key=lambda r: r["worker_index"])]
        ctx.info["ddppo/weights_hashes"] = list(self.last_hashes)
        if len(set(self.last_hashes)) > 1:
            raise RuntimeError(f"ddppo: the workers' weights differ after round {self.round_index - 1} "
                               f"(hashes by worker: {self.last_hashes}): their updates were not the same")
        rows, steps = [r["rows"] for r in results], int(results[0]["num_sgd_steps"])
        trained = sum(r["env_steps"] for r in results)
        with self.learner.lock:
            self.policy.set_state(next(r["state"] for r in results if r["worker_index"] == 0))
            self.learner.num_updates += steps
            self.learner.env_steps_trained += trained
        stats = {k: float(np.average([r["stats"].get(k, np.nan) for r in results], weights=rows))
                 for k in results[0]["stats"]}
        learn_s = max(r["learn_s"] for r in results)
        stats.update(num_workers=len(results), preempted_workers=sum(r["preempted"] for r in results),
                     rows_min=min(rows), rows_max=max(rows), sample_time_s=max(r["sample_s"] for r in results),
                     learn_time_s=learn_s, allreduce_time_s=max(r["allreduce_s"] for r in results),
                     generation=self.generation, aborted_rounds=int(c["ddppo_aborted_rounds"]))
        ctx.metrics.extra["perf/learner_throughput_env_steps_per_s"] = sum(rows) / max(learn_s, 1e-9)
        return record_training(ctx, {self.pid: stats}, trained, sum(rows), steps)


# ---- the algorithm -----------------------------------------------------------------------------
class DDPPO(flowkit.Algorithm, ref=DDPPO_REF):
    """DD-PPO: every worker samples and learns (PPO's loss), gradients all-reduced over the
    workers; the driver only accounts (see the module docstring). It consumes no rollouts: its
    source is core's ``WorkerRounds``."""

    policy_class = DDPPOPolicy
    consumes_rollouts = False

    def training_flow(self, experiences, ctx, learner):
        pid, c = self.only_policy(ctx, learner), self.config
        rendezvous = ctx.add_stateful(f"{learner.name}/rendezvous", Rendezvous(float(c.collective_timeout_s)))
        group = GroupRounds(ctx, self, learner, pid, rendezvous)
        k, n = num_minibatches(c, self.run_config), max(1, int(self.run_config.runtime.num_workers))
        cut = f"preempted at {c.sync_frac:g} of the workers" if n > 1 else "no preemption"
        reduce = f"gradients all-reduced ({dist_backend(c)})" if n > 1 else "world of 1, no all-reduce"
        return WorkerRounds(ctx, group.requests,
                            f"ParallelTrainRounds({n} workers: sample <= {c.fragments_per_round} fragments, {cut}; "
                            f"PPO loss, num_epochs={c.num_epochs}, num_minibatches={k}, {reduce})"
                            ).for_each(group.account, group.name)
