"""A dataset as the source of a run's experience: :class:`DatasetReader` (the operator that
takes the rollout workers' place in the plan) and :func:`build_plan`.

Reading, per epoch ``e`` (one pass over every row of the dataset), with the generator of
``derive_seed(seed, "offline_reader", e)``: a dataset that fits ``input.shuffle_buffer_size``
is read once (all its episodes, in order) and kept; each epoch hands its rows out in a fresh
permutation, as batches of the algorithm's ``train_batch_size`` rows (the last may be
smaller). A larger dataset is streamed: each epoch reads whole episodes, in the order of a
permutation, into the buffer; once it holds ``input.shuffle_buffer_size`` rows (or the
epoch's episodes are all read) its rows are permuted and handed out as batches (rows that do
not fill a batch wait for the next fill). Memory: the buffer plus one episode, whatever the
dataset's size. Minari's HDF5 storage keeps one group per episode: reading costs about a
millisecond per episode on top of the rows, so datasets of many short episodes are slow to
stream (measured in ``bench/offline_reader.py``). Each episode becomes a :class:`~flowkit.core.SampleBatch` as rollout workers
build them (``obs``/``next_obs`` encoded by the policy's encoder, ``actions`` mapped back
from the env's space to the sampled form, ``rewards``, ``terminateds``, ``truncateds``,
``eps_id``, ``t``, ``action_mask`` where the observation has one) and goes through the
policy's ``postprocess_trajectory`` once, when read (returns-to-go for MARWIL).

Exact resume: the reader's state is ``(epoch, batches handed out in it)``; a restored reader
reads its epoch again from the start and skips that many batches (the same rows, in the same
order, as the run it continues).
"""
from __future__ import annotations

from typing import Any, Dict, Iterator, List, Optional

import numpy as np
from omegaconf import OmegaConf

from flowkit.config import ConfigError
from flowkit.core import batch as sb
from flowkit.core import derive_seed
from flowkit.core.flow import Flow
from flowkit.core.workers import WorkerSet
from flowkit.datasets import check_spaces, data_dir, open_dataset
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


def _rows(obs: Any, lo: int, hi: int) -> Any:
    if isinstance(obs, dict):
        return {k: _rows(v, lo, hi) for k, v in obs.items()}
    if isinstance(obs, tuple):
        return tuple(_rows(v, lo, hi) for v in obs)
    return obs[lo:hi]


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
    Raises:
        ConfigError: the dataset is missing, damaged, empty or of other spaces than the policy.
    """

    def __init__(self, ctx: Any, path: str, policy_id: str, batch_size: int, shuffle_buffer_size: int):
        self.ctx, self.path, self.policy_id = ctx, path, policy_id
        self.policy = ctx.policies[policy_id]
        ds = open_dataset(path)
        env = str(ctx.config.env.id or ctx.config.env.factory)
        check_spaces(ds, self.policy.observation_space, self.policy.action_space, path, env)
        self.storage = ds.storage
        self.num_episodes, self.num_rows = int(ds.total_episodes), int(ds.total_steps)
        self.batch_size, self.buffer_size = int(batch_size), int(shuffle_buffer_size)
        self.seed = int(ctx.config.seed)
        self.epoch, self.batches = 0, 0  # the state: batches handed out in this epoch
        self._rows: Optional[sb.SampleBatch] = None  # every row, when they fit the shuffle buffer
        self.name = (f"DatasetReader({data_dir(path)}: {self.num_rows} rows in {self.num_episodes} episodes, "
                     f"batch={self.batch_size}, shuffle_buffer={min(self.buffer_size, self.num_rows)})")

    # -- one episode as a SampleBatch --
    def episode_batch(self, ep: Dict[str, Any]) -> sb.SampleBatch:
        pol = self.policy
        n = len(ep["rewards"])
        enc, mask = pol.encoder(_rows(ep["observations"], 0, n + 1), n + 1)
        b = sb.SampleBatch({
            sb.OBS: enc[:n], sb.NEXT_OBS: enc[1:],
            sb.ACTIONS: sampled_actions(pol.dist, ep["actions"]),
            sb.REWARDS: np.asarray(ep["rewards"], np.float32),
            sb.TERMINATEDS: np.asarray(ep["terminations"], bool),
            sb.TRUNCATEDS: np.asarray(ep["truncations"], bool),
            sb.EPS_ID: np.full(n, int(ep["id"]), np.int64), sb.T: np.arange(n, dtype=np.int64)})
        if mask is not None:
            b[sb.ACTION_MASK], b[sb.NEXT_ACTION_MASK] = mask[:n], mask[1:]
        return pol.postprocess_trajectory(b)

    # -- the stream --
    def epoch_batches(self, epoch: int) -> Iterator[sb.SampleBatch]:
        """The batches of epoch ``epoch`` (a pure function of the dataset, the seed and ``epoch``)."""
        rng = np.random.default_rng(derive_seed(self.seed, "offline_reader", epoch))
        if self.num_rows <= self.buffer_size:  # the whole dataset fits the buffer: read once, then kept
            if self._rows is None:
                self._rows = sb.concat_samples([self.episode_batch(ep) for ep in
                                                self.storage.get_episodes(range(self.num_episodes))])
            perm = rng.permutation(self.num_rows)
            for i in range(0, self.num_rows, self.batch_size):
                yield self._rows.take(perm[i:i + self.batch_size])
            return
        order = rng.permutation(self.num_episodes).tolist()
        buf: List[sb.SampleBatch] = []
        held = 0
        for k, ep in enumerate(self.storage.get_episodes(order)):
            b = self.episode_batch(ep)
            buf.append(b)
            held += len(b)
            last = k == len(order) - 1
            if held < self.buffer_size and not last:
                continue
            rows = sb.concat_samples(buf)
            perm = rng.permutation(len(rows))
            full = len(rows) // self.batch_size * self.batch_size
            for i in range(0, full, self.batch_size):
                yield rows.take(perm[i:i + self.batch_size])
            rest = perm[full:]
            if last and len(rest):
                yield rows.take(rest)
            buf, held = ([rows.take(rest)], len(rest)) if not last and len(rest) else ([], 0)

    def __iter__(self) -> Iterator[sb.MultiAgentBatch]:
        while True:
            skip = self.batches
            for i, b in enumerate(self.epoch_batches(self.epoch)):
                if i < skip:  # a restored reader: the batches the run it continues trained on
                    continue
                self.batches = i + 1
                self.ctx.counters["env_steps_sampled"] += len(b)
                self.ctx.counters["agent_steps_sampled"] += len(b)
                self.ctx.mark("first_sample")
                yield sb.MultiAgentBatch({self.policy_id: b}, len(b))
            self.epoch, self.batches = self.epoch + 1, 0
            self.ctx.counters["dataset_epochs"] = self.epoch

    def get_state(self) -> Dict[str, Any]:
        return {"epoch": self.epoch, "batches": self.batches}

    def set_state(self, state: Dict[str, Any]) -> None:
        self.epoch, self.batches = int(state["epoch"]), int(state["batches"])


class NoRollouts(WorkerSet):
    """The WorkerSet of a run that learns from a dataset: no rollout workers (workers
    prestarted for the run are stopped). Evaluation builds its own env on the driver."""

    def start(self) -> None:
        self._kill_prestarted()
        self._actors = []


def build_plan(ctx: Any) -> Flow:
    """``DatasetReader -> <algo>.training_flow`` for a run with ``input.dataset`` (one
    single-agent policy trained by ``bc`` or ``marwil``); the rollout workers are replaced by
    :class:`NoRollouts`.

    Raises:
        ConfigError: another algorithm, or several policies.
    """
    cfg = ctx.config
    name = str(cfg.algo)
    if name not in OFFLINE_ALGOS:
        raise ConfigError(f"input.dataset is set but algo={name} learns from rollouts "
                          f"(algorithms that learn from a dataset: {', '.join(OFFLINE_ALGOS)})")
    if len(ctx.policy_specs) != 1:
        raise ConfigError(f"input.dataset: single-agent runs only (policies: {', '.join(ctx.policy_specs)})")
    old = ctx.workers
    ctx.workers = NoRollouts(cfg, ctx.policy_specs, ctx.pm, remote_specs=old.remote_specs)
    ctx.workers.prestarted, old.prestarted = old.prestarted, None
    ctx.workers.weights_fn = old.weights_fn
    algo = ctx.algorithms[name]
    pid = ctx.policy_ids[0]
    inp = OmegaConf.select(cfg, "input")
    reader = ctx.add_stateful("offline/reader", DatasetReader(ctx, str(inp.dataset), pid,
                                                              int(algo.config.train_batch_size),
                                                              int(inp.shuffle_buffer_size)))
    experiences = Flow(lambda: iter(reader), reader.name, [], ctx)
    return algo.training_flow(experiences, ctx, ctx.add_learner(name, ctx.policy_ids))
