"""A dataset as the source of a run's experience: :class:`DatasetReader` (the operator that
takes the rollout workers' place in the plan) and :func:`build_plan`.

Reading, per epoch ``e`` (one pass over every row of the dataset), with the generator of
``derive_seed(seed, "offline_reader", e)``: a dataset that fits ``input.shuffle_buffer_size``
is read once (all its episodes, in order) and kept; each epoch hands its rows out in a fresh
permutation, as batches of the algorithm's ``train_batch_size`` rows (the last may be
smaller). A larger dataset is streamed: each epoch takes whole episodes, in the order of a
permutation, until they fill the buffer (``input.shuffle_buffer_size`` rows, or the epoch's
last episodes), reads them, permutes their rows and hands them out as batches (rows that do
not fill a batch wait for the next fill). Each fill (or the kept dataset, each epoch) is
permuted with one gather per column, and the batches are consecutive slices of it (numpy views,
read-only by the operators' contract). Memory: about twice the buffer, whatever the dataset's
size.

The steps come from the dataset's columnar copy (:class:`flowkit.datasets.ColumnStore`,
written next to it on the first read: a one-time pass through Minari's HDF5 storage, whose
one-group-per-episode layout costs about a millisecond per episode), one gather per column and
fill; a dataset whose spaces have no fixed-shape numeric columns, or whose copy cannot be
written, is read through Minari. A fill becomes one :class:`~flowkit.core.SampleBatch` as
rollout workers build them (``obs``/``next_obs`` encoded by the policy's encoder, ``actions`` mapped back from the env's
space to the sampled form, ``rewards``, ``terminateds``, ``truncateds``, ``eps_id``, ``t``,
``action_mask`` where the observation has one); each of its episodes goes through the policy's
``postprocess_trajectory`` (returns-to-go for MARWIL, n-step for CQL on DQN), and the rows keep
the policy's ``train_columns`` (what its loss reads; every column when it declares none).
Measured in ``bench/offline_reader.py``.

Exact resume: the reader's state is ``(epoch, batches handed out in it)``; a restored reader
reads its epoch again from the start and skips that many batches (the same rows, in the same
order, as the run it continues).

``input.num_readers=k``: :class:`ShardedReader`, k such readers (:class:`ReaderShard`, Ray
actors or in-process) over the episodes ``i, i + k, ...``, taken round-robin.
"""
from __future__ import annotations

import collections
import contextlib
import sys
import warnings
from types import SimpleNamespace
from typing import Any, Deque, Dict, Iterator, List, Optional, Tuple

import numpy as np
from omegaconf import OmegaConf

from flowkit.config import ConfigError
from flowkit.core import batch as sb
from flowkit.core import derive_seed
from flowkit.core.flow import Flow, LocalActor, RayActor, get_result
from flowkit.core.workers import PolicySpec
from flowkit.datasets import ColumnStore, ColumnsUnsupported, check_spaces, data_dir, open_dataset, steps_of
from flowkit_offline import OFFLINE_ALGOS


def sampled_actions(dist: Any, actions: np.ndarray) -> np.ndarray:
    """Env actions -> the policy's sampled form (the inverse of ``ActionDist.to_env`` where it
    has one): Discrete minus ``start``; a bounded Box scaled from [low, high] back to [-1, 1]
    (clipped env actions stay inside); other spaces unchanged."""
    a = np.asarray(actions)
    if dist.kind == "cat":
        return a.astype(np.int64).reshape(-1) - dist.start
    if dist.kind == "gauss":
        flat = a.reshape(len(a), -1).astype(np.float32)
        return (2.0 * (flat - dist.low) / (dist.high - dist.low) - 1.0).astype(np.float32)
    if dist.kind == "gauss_unbounded":
        return a.reshape(len(a), -1).astype(np.float32)
    return a


class DatasetReader:
    """Batches of dataset rows for the policies of a run (see the module docstring).

    Args:
        ctx: the run context (counts ``env_steps_sampled`` / ``agent_steps_sampled`` as the
            rows handed out, so ``stop.env_steps`` bounds the rows trained on).
        path: the dataset (``input.dataset``).
        policy_id: the policy the rows are for (its encoder, action distribution and
            ``postprocess_trajectory``).
        batch_size: rows per batch.
        shuffle_buffer_size: rows shuffled together.
        count_sampled: count the rows handed out as ``env_steps_sampled`` (the run's only
            source); False: as ``dataset_rows_read`` (a source mixed into replay, ``input.mix``,
            where sampled env steps are the live workers').
        shard: this reader's index among ``num_shards``: it reads only the episodes at positions
            ``shard, shard + num_shards, ...`` of the dataset, with the generators of
            ``derive_seed(seed, "offline_reader", e, shard)`` (one of the shards of
            :class:`ShardedReader`).
        num_shards: readers sharing the dataset (1: this one reads every episode).
    Raises:
        ConfigError: the dataset is missing, damaged, empty or of other spaces than the policy.
    """

    def __init__(self, ctx: Any, path: str, policy_id: str, batch_size: int, shuffle_buffer_size: int,
                 count_sampled: bool = True, shard: int = 0, num_shards: int = 1):
        self.ctx, self.path, self.policy_id, self.count_sampled = ctx, path, policy_id, count_sampled
        self.policy = ctx.policies[policy_id]
        ds = open_dataset(path)
        env = str(ctx.config.env.id or ctx.config.env.factory)
        check_spaces(ds, self.policy.observation_space, self.policy.action_space, path, env)
        self.storage = ds.storage
        self.num_episodes, self.num_rows = int(ds.total_episodes), int(ds.total_steps)
        self.batch_size, self.buffer_size = int(batch_size), int(shuffle_buffer_size)
        self.seed = int(ctx.config.seed)
        self.shard, self.num_shards = int(shard), int(num_shards)
        self.episodes = np.arange(self.num_episodes)[self.shard::self.num_shards]  # this reader's, in id order
        self.epoch, self.batches = 0, 0  # the state: batches handed out in this epoch
        self._rows: Optional[sb.SampleBatch] = None  # every row, when they fit the shuffle buffer
        self._columns: Any = None  # the ColumnStore (False: the dataset has none), opened on the first read
        part = ""
        if self.num_shards > 1:
            self.num_rows = int(self._lengths()[self.episodes].sum())
            part = f" shard {self.shard}/{self.num_shards}:"
        self.name = (f"DatasetReader({data_dir(path)}:{part} {self.num_rows} rows in {len(self.episodes)} episodes, "
                     f"batch={self.batch_size}, shuffle_buffer={min(self.buffer_size, self.num_rows)})")

    # -- reading --
    def _steps(self, episodes: List[int]) -> Dict[str, Any]:
        """The steps of ``episodes`` (see :meth:`ColumnStore.read`): from the columnar copy,
        written on the first call; through Minari when the dataset cannot have one."""
        if self._columns is None:
            try:
                self._columns = ColumnStore.open(self.path)
            except ColumnsUnsupported:
                self._columns = False
            except OSError as e:  # e.g. no room for the copy: slower, not wrong
                warnings.warn(f"input.dataset={self.path!r}: no columnar copy ({type(e).__name__}: {e}); reading "
                              "it through Minari, episode by episode", stacklevel=2)
                self._columns = False
        if self._columns:
            return self._columns.read(episodes)
        return steps_of(list(self.storage.get_episodes(episodes)))

    def read(self, episodes: List[int]) -> sb.SampleBatch:
        """The rows of ``episodes`` (positions in the dataset's id order), in that order: one
        SampleBatch as rollout workers build it, each episode post-processed by the policy,
        restricted to the policy's ``train_columns``."""
        pol, raw = self.policy, self._steps(episodes)
        n = len(raw["rewards"])
        obs, mask = pol.encoder(raw["observations"], n)
        next_obs, next_mask = pol.encoder(raw["next_observations"], n)
        b = sb.SampleBatch({
            sb.OBS: obs, sb.NEXT_OBS: next_obs, sb.ACTIONS: sampled_actions(pol.dist, raw["actions"]),
            sb.REWARDS: np.asarray(raw["rewards"], np.float32), sb.TERMINATEDS: np.asarray(raw["terminations"], bool),
            sb.TRUNCATEDS: np.asarray(raw["truncations"], bool), sb.EPS_ID: raw["episode_ids"], sb.T: raw["t"]})
        if mask is not None:
            b[sb.ACTION_MASK], b[sb.NEXT_ACTION_MASK] = mask, next_mask
        ends = np.cumsum(raw["lengths"]).tolist()
        parts = [b.slice(lo, hi) for lo, hi in zip([0, *ends[:-1]], ends)]
        done = [pol.postprocess_trajectory(p) for p in parts]  # one episode each (views)
        if any(d is not p for d, p in zip(done, parts, strict=True)):
            b = sb.concat_samples(done)
        keep = pol.train_columns
        return b if keep is None else sb.SampleBatch({k: b[k] for k in keep if k in b})

    # -- the stream --
    def epoch_batches(self, epoch: int) -> Iterator[sb.SampleBatch]:
        """The batches of epoch ``epoch`` (a pure function of the dataset, the seed and ``epoch``)."""
        parts = (epoch,) if self.num_shards == 1 else (epoch, self.shard)
        rng = np.random.default_rng(derive_seed(self.seed, "offline_reader", *parts))
        if self.num_rows <= self.buffer_size:  # the whole dataset fits the buffer: read once, then kept
            if self._rows is None:
                self._rows = self.read(self.episodes.tolist())
            rows = self._rows.take(rng.permutation(self.num_rows))  # shuffled once; batches are views of it
            for i in range(0, self.num_rows, self.batch_size):
                yield rows.slice(i, i + self.batch_size)
            return
        order = self.episodes[rng.permutation(len(self.episodes))]
        lengths = self._lengths()[order]
        rest: Optional[sb.SampleBatch] = None
        k = 0
        while k < len(order):
            held = len(rest) if rest is not None else 0
            j = k + max(1, int(np.searchsorted(np.cumsum(lengths[k:]), self.buffer_size - held)) + 1)
            j = min(j, len(order))  # episodes k..j-1 fill the buffer (the last one may overflow it)
            rows = self.read(order[k:j].tolist())
            rows = rows if rest is None else sb.concat_samples([rest, rows])
            rows, k = rows.take(rng.permutation(len(rows))), j
            # whole batches; after the epoch's last fill, the rows left too
            full = len(rows) // self.batch_size * self.batch_size if k < len(order) else len(rows)
            for i in range(0, full, self.batch_size):
                yield rows.slice(i, i + self.batch_size)
            rest = rows.slice(full, len(rows)) if len(rows) > full else None

    def _lengths(self) -> np.ndarray:
        """int64[E], the steps of each episode in id order (from the columnar copy or Minari's metadata)."""
        if self._columns is None:
            self._steps([])
        if self._columns:
            return self._columns.lengths
        return np.asarray([int(m["total_steps"]) for m in self.storage.get_episode_metadata(range(self.num_episodes))],
                          np.int64)

    def stream(self) -> Iterator[sb.SampleBatch]:
        """The batches of every epoch from the state on (endless), the state kept up to date."""
        while True:
            skip = self.batches
            for i, b in enumerate(self.epoch_batches(self.epoch)):
                if i < skip:  # a restored reader: the batches the run it continues trained on
                    continue
                self.batches = i + 1
                yield b
            self.epoch, self.batches = self.epoch + 1, 0

    def __iter__(self) -> Iterator[sb.MultiAgentBatch]:
        for b in self.stream():
            self.ctx.counters["dataset_epochs"] = self.epoch  # epochs handed out whole
            count_rows(self.ctx, len(b), self.count_sampled)
            yield sb.MultiAgentBatch({self.policy_id: b}, len(b))

    def get_state(self) -> Dict[str, Any]:
        return {"epoch": self.epoch, "batches": self.batches}

    def set_state(self, state: Dict[str, Any]) -> None:
        if "shards" in state:
            raise ConfigError(f"the checkpoint's dataset reader had input.num_readers={len(state['shards'])} shards; "
                              "resume it with the same input.num_readers")
        self.epoch, self.batches = int(state["epoch"]), int(state["batches"])


def count_rows(ctx: Any, n: int, sampled: bool) -> None:
    """Count ``n`` dataset rows handed out: as ``env_steps_sampled`` / ``agent_steps_sampled`` (the
    run's only source) or as ``dataset_rows_read`` (mixed into replay)."""
    if sampled:
        ctx.counters["env_steps_sampled"] += n
        ctx.counters["agent_steps_sampled"] += n
        ctx.mark("first_sample")
    else:
        ctx.counters["dataset_rows_read"] += n


class ReaderShard:
    """One shard of a :class:`ShardedReader` (a Ray actor, or in-process on the local backend):
    a :class:`DatasetReader` of the episodes ``shard, shard + num_shards, ...`` for an inference
    copy of the policy built from its spec (its encoder, action distribution,
    ``postprocess_trajectory`` and ``train_columns``: those of the offline algorithms depend on
    their config, not on learned weights). An error in the constructor (a bad dataset) is
    raised by :meth:`ping`, with its own type, as a rollout worker's is."""

    def __init__(self, config: Any, spec: PolicySpec, policy_id: str, path: str, batch_size: int,
                 shuffle_buffer_size: int, shard: int, num_shards: int):
        self._init_error: Optional[BaseException] = None
        self._it: Optional[Iterator[sb.SampleBatch]] = None
        try:
            cfg = OmegaConf.create(config)
            if "torch" in sys.modules:
                sys.modules["torch"].set_num_threads(max(1, int(cfg.runtime.torch_threads)))
            pol = spec.policy_class(spec.observation_space, spec.action_space, spec.config, spec.model_config(cfg),
                                    "cpu", derive_seed(int(cfg.seed), "offline_reader_policy", shard),
                                    inference_only=True)
            ctx = SimpleNamespace(policies={policy_id: pol}, config=cfg, counters=collections.Counter(),
                                  mark=lambda _: None)
            self.reader = DatasetReader(ctx, path, policy_id, batch_size, shuffle_buffer_size, shard=shard,
                                        num_shards=num_shards)
        except Exception as e:
            self._init_error = e

    def ping(self) -> str:
        if self._init_error is not None:
            raise self._init_error
        return self.reader.name

    def next_batches(self, n: int) -> List[Tuple[sb.SampleBatch, int, int]]:
        """The next ``n`` batches, each as ``(batch, epoch, batches)``: the batch and the shard's
        state once it is handed out."""
        if self._it is None:
            self._it = self.reader.stream()
        return [(next(self._it), self.reader.epoch, self.reader.batches) for _ in range(n)]

    def set_state(self, state: Dict[str, Any]) -> None:
        self.reader.set_state(state)
        self._it = None


class ShardedReader:
    """``input.num_readers`` = k :class:`ReaderShard` s over one dataset (Ray actors on
    ``runtime.backend=ray``, in-process on the local backend: the same batches), episode ``j``
    read by shard ``j % k``, each with a shuffle buffer of ``shuffle_buffer_size // k`` rows and
    its own generators (``derive_seed(seed, "offline_reader", epoch, shard)``). Batches are taken
    from the shards round-robin in a fixed order (0, 1, ..., k - 1, 0, ...), so a run is
    deterministic; ``in_flight`` requests per shard are kept pending so the shards read while
    the learner trains (``batches_per_call`` batches a request: a Ray call costs about a
    millisecond). Each shard keeps its own epochs (one that holds fewer rows starts its
    next epoch sooner); ``dataset_epochs`` counts the epochs every shard has begun after.
    Started on the first batch (``flowkit plan`` starts nothing).

    State (checkpoints): ``{"shards": [{"epoch", "batches"} handed out, per shard], "next_shard"}``;
    a restored shard reads its epoch again and skips that many batches, as :class:`DatasetReader`.

    Raises:
        ConfigError: see :class:`DatasetReader` (more readers than the dataset has episodes:
            :meth:`flowkit_offline.InputConfig.validate`, before the run).
    """

    def __init__(self, ctx: Any, path: str, policy_id: str, batch_size: int, shuffle_buffer_size: int,
                 num_readers: int, count_sampled: bool = True, in_flight: int = 2, batches_per_call: int = 8):
        self.ctx, self.path, self.policy_id, self.count_sampled = ctx, path, policy_id, count_sampled
        self.num_readers, self.in_flight = int(num_readers), max(1, int(in_flight))
        self.batches_per_call = max(1, int(batches_per_call))
        self.batch_size, self.buffer_size = int(batch_size), max(1, int(shuffle_buffer_size) // self.num_readers)
        self.states = [{"epoch": 0, "batches": 0} for _ in range(self.num_readers)]
        self.next_shard = 0
        self._actors: Optional[List[Any]] = None
        self._futures: List[Deque[Any]] = []
        self._ready: List[Deque[Tuple[sb.SampleBatch, int, int]]] = []  # received, not yet handed out
        self.name = (f"ShardedReader({data_dir(path)}: {self.num_readers} x DatasetReader, batch={self.batch_size}, "
                     f"shuffle_buffer={self.buffer_size} each)")

    def _start(self) -> List[Any]:
        try:  # the columnar copy, written once here rather than by k shards at once
            ColumnStore.open(self.path)
        except (ColumnsUnsupported, OSError):
            pass  # each shard reads through Minari (and warns)
        cfg, k = self.ctx.config, self.num_readers
        args = (OmegaConf.to_container(cfg, resolve=True), self.ctx.policy_specs[self.policy_id], self.policy_id,
                self.path, self.batch_size, self.buffer_size)
        if str(cfg.runtime.backend) != "local":
            import ray
            cls = ray.remote(num_cpus=0, max_restarts=0)(ReaderShard)
            actors: List[Any] = [RayActor(cls.remote(*args, i, k), i) for i in range(k)]
        else:
            actors = [LocalActor(ReaderShard(*args, i, k), i) for i in range(k)]
        self._actors = actors
        for a in actors:
            get_result(a.submit("ping"))
        self._send_states()
        return actors

    def _send_states(self) -> None:
        """The states to the shards, then ``in_flight`` requests to each (calls to one actor run
        in the order sent; batches requested or received before are dropped)."""
        assert self._actors is not None
        for a, st in zip(self._actors, self.states, strict=True):
            get_result(a.submit("set_state", st))
        self._futures = [collections.deque(a.submit("next_batches", self.batches_per_call)
                                           for _ in range(self.in_flight)) for a in self._actors]
        self._ready = [collections.deque() for _ in self._actors]

    def __iter__(self) -> Iterator[sb.MultiAgentBatch]:
        if self._actors is None:
            self._start()
        while True:
            assert self._actors is not None
            i = self.next_shard
            if not self._ready[i]:
                fut = self._futures[i].popleft()
                self._futures[i].append(self._actors[i].submit("next_batches", self.batches_per_call))
                self._ready[i].extend(get_result(fut))
            b, epoch, batches = self._ready[i].popleft()
            self.states[i] = {"epoch": int(epoch), "batches": int(batches)}
            self.next_shard = (i + 1) % self.num_readers
            self.ctx.counters["dataset_epochs"] = min(st["epoch"] for st in self.states)
            count_rows(self.ctx, len(b), self.count_sampled)
            yield sb.MultiAgentBatch({self.policy_id: b}, len(b))

    def get_state(self) -> Dict[str, Any]:
        return {"shards": [dict(st) for st in self.states], "next_shard": self.next_shard}

    def set_state(self, state: Dict[str, Any]) -> None:
        shards = state.get("shards")
        if shards is None or len(shards) != self.num_readers:
            was = 0 if shards is None else len(shards)
            raise ConfigError(f"the checkpoint's dataset reader had input.num_readers={was}, this run has "
                              f"{self.num_readers}; resume it with the same input.num_readers")
        self.states = [{"epoch": int(st["epoch"]), "batches": int(st["batches"])} for st in shards]
        self.next_shard = int(state["next_shard"])
        if self._actors is not None:
            self._send_states()

    def stop(self) -> None:
        for a in self._actors or []:
            if a.is_remote:
                import ray
                with contextlib.suppress(Exception):
                    ray.kill(a.handle)
        self._actors, self._futures, self._ready = None, [], []


def make_reader(ctx: Any, policy_id: str, batch_size: int, count_sampled: bool = True) -> Any:
    """The reader of ``input.dataset``: a :class:`DatasetReader` on the driver
    (``input.num_readers=0``) or a :class:`ShardedReader` of ``input.num_readers`` shards,
    registered for checkpoints as ``offline/reader``."""
    inp, k = ctx.config.input, int(ctx.config.input.num_readers)
    args = (ctx, str(inp.dataset), policy_id, batch_size, int(inp.shuffle_buffer_size))
    reader = ShardedReader(*args, k, count_sampled=count_sampled) if k else DatasetReader(*args, count_sampled)
    return ctx.add_stateful("offline/reader", reader)


def build_plan(ctx: Any) -> Flow:
    """``DatasetReader -> <algo>.training_flow`` for a run with ``input.dataset`` (one
    single-agent policy trained by ``bc``, ``marwil``, ``cql_dqn`` or ``cql_sac``); the run
    starts no rollout workers (``WorkerSet.rollouts``). With ``input.mix`` (another algorithm,
    one that replays): :func:`build_mixed_plan`.

    Raises:
        ConfigError: another algorithm without ``input.mix``, ``input.mix`` with an offline
            algorithm, or several policies.
    """
    cfg = ctx.config
    name = str(cfg.algo)
    mix = OmegaConf.select(cfg, "input.mix")
    if len(ctx.policy_specs) != 1:
        raise ConfigError(f"input.dataset: single-agent runs only (policies: {', '.join(ctx.policy_specs)})")
    if name not in OFFLINE_ALGOS:
        if mix is not None:
            return build_mixed_plan(ctx, float(mix))
        raise ConfigError(f"input.dataset is set but algo={name} learns from rollouts "
                          f"(algorithms that learn from a dataset: {', '.join(OFFLINE_ALGOS)}; off-policy ones that "
                          "replay, e.g. dqn or sac, mix it into their batches with input.mix=0.5)")
    if mix is not None:
        raise ConfigError(f"input.mix={mix}: algo={name} learns from the dataset alone (input.mix mixes a dataset "
                          "into the replayed batches of an off-policy algorithm with live workers: dqn, sac, td3)")
    ctx.workers.rollouts = False
    algo = ctx.algorithms[name]
    pid = ctx.policy_ids[0]
    reader = make_reader(ctx, pid, int(algo.config.train_batch_size))
    experiences = Flow(lambda: iter(reader), reader.name, [], ctx)
    return algo.training_flow(experiences, ctx, ctx.add_learner(name, ctx.policy_ids))


def build_mixed_plan(ctx: Any, mix: float) -> Flow:
    """Online and offline experience (``input.dataset`` with ``input.mix``): the algorithm's own
    plan with live rollout workers (:func:`~flowkit.core.ops.algorithm_plan`), given a
    :class:`~flowkit.core.replay.ReplayMix` of a :class:`DatasetReader` of the dataset as the
    ``mix`` argument of its replay plan: ``input.mix`` of each replayed batch from the dataset
    (RLPD's symmetric sampling). The reader counts its rows as ``dataset_rows_read`` and is
    checkpointed (``offline/reader``).

    Raises:
        ConfigError: the algorithm replays sequences (recurrent: R2D2), or has no replay plan to
            take the mix (its ``training_flow`` has no ``mix`` argument: on-policy algorithms,
            IMPALA).
    """
    import functools
    import inspect

    from flowkit.core.ops import algorithm_plan
    from flowkit.core.replay import ReplayMix
    cfg = ctx.config
    name, pid = str(cfg.algo), ctx.policy_ids[0]
    init = getattr(ctx.policies[pid], "initial_state", None)
    if init is not None and init(1) is not None:
        raise ConfigError(f"input.mix={mix}: algo={name} replays sequences of a recurrent network; a dataset's "
                          "rows mix into the batches of a feed-forward one (dqn, sac, td3)")
    algo, inp = ctx.algorithms[name], cfg.input
    if "mix" not in inspect.signature(algo.training_flow).parameters:
        raise ConfigError(f"input.mix={mix}: algo={name} has no replay buffer to mix the dataset into "
                          "(on-policy; input.mix is for off-policy algorithms that replay: dqn, sac, td3)")
    k, reader = int(inp.num_readers), functools.partial(make_reader, ctx, pid, count_sampled=False)
    return algorithm_plan(ctx, algo, mix=ReplayMix(reader, mix, f"ShardedReader({inp.dataset}: {k} x DatasetReader)"
                                                   if k else f"DatasetReader({inp.dataset})"))
