"""SampleBatch and MultiAgentBatch: the one contract between dataflow stages.

A :class:`SampleBatch` is a dict of equally long numpy arrays (columns), one row per
transition. Rows of one trajectory are contiguous and in time order; a trajectory ends where
``terminateds | truncateds`` is set or where ``eps_id`` changes (a fragment cut). A
:class:`MultiAgentBatch` maps policy ids to SampleBatches and carries the number of real env
steps it covers plus the episode summaries that finished while it was sampled. Single-agent
runs are the one-policy case (policy id :data:`DEFAULT_POLICY_ID`).

Operators never mutate a batch they receive (arrays that come back from Ray are read-only):
they build new batches (:meth:`SampleBatch.copy`, :func:`concat_samples`).
"""
from __future__ import annotations

from typing import Any, Dict, Iterable, List, Mapping, Optional

import numpy as np

# ---- column names (the only place they are spelt) -----------------------------------------
OBS = "obs"                      # float32[B, *obs_shape], encoded observation
NEXT_OBS = "next_obs"            # float32[B, *obs_shape], the observation after the action
ACTIONS = "actions"              # the action as sampled (Box: unscaled, unclipped Gaussian draw)
REWARDS = "rewards"              # float32[B]
TERMINATEDS = "terminateds"      # bool[B], the MDP ended (no bootstrap)
TRUNCATEDS = "truncateds"        # bool[B], cut by a time limit (bootstrap from V(next_obs))
ACTION_MASK = "action_mask"      # int8[B, n] legal actions of obs (absent without masks)
NEXT_ACTION_MASK = "next_action_mask"
ACTION_LOGP = "action_logp"      # float32[B], log-prob of ACTIONS under the sampling policy
ACTION_DIST_INPUTS = "action_dist_inputs"  # float32[B, k], logits / (mean, log_std)
VF_PREDS = "vf_preds"            # float32[B], V(obs) at sampling time
ADVANTAGES = "advantages"        # float32[B]
VALUE_TARGETS = "value_targets"  # float32[B]
DISCOUNTED_RETURNS = "discounted_returns"  # float32[B], running gamma-discounted raw reward sum (reward normalisation)
EPS_ID = "eps_id"                # int64[B], unique episode id
AGENT_INDEX = "agent_index"      # int64[B], index of the agent (multi-agent) or sub-env
T = "t"                          # int64[B], step index within the episode
WEIGHTS_VERSION = "weights_version"  # int64[B], learner update count of the sampling weights
N_STEPS = "n_steps"              # int64[B], steps an n-step return covers (reward is discounted sum)
BATCH_INDEXES = "batch_indexes"  # int64[B], replay-buffer slots of replayed rows
PRIO_WEIGHTS = "weights"         # float32[B], importance weights of replayed rows (prioritized replay)
TASK_INDEX = "task_index"        # int64[B], the task of the row in a meta-batch (MAML)
ADAPTATION_STEP = "adaptation_step"  # int64[B], inner adaptation steps taken before the row was sampled (MAML)
STATE_IN = "state_in"            # float32[B, S], a recurrent policy's state before the row's step (per row)
STATE_OUT = "state_out"          # float32[B, S], acting extras only: the state after the step (kept by the
                                 # runner for the next step, never a batch column)
SEQ_LENS = "seq_lens"            # int64[k], prepared batches of recurrent policies: rows of each whole
                                 # sequence, in row order (see sequence_lengths)
SEQ_MASK = "seq_mask"            # bool[B, L], sequence replay (R2D2): each row is one stored sequence of L
                                 # steps (its other columns [B, L, ...] or [B, L + 1, ...]); True at real
                                 # steps, False in the padding after an episode's end

RAW_PREFIX = "raw:"               # run.output: the env's own values, one column per leaf (raw:obs, raw:obs/key,
                                 # raw:next_obs, raw:actions, raw:rewards, raw:terminateds, raw:truncateds); the
                                 # runner takes them out of the batch into MultiAgentBatch.meta["raw"]
                                 # before post-processing

DEFAULT_POLICY_ID = "default"


def trajectory_ends(b: Mapping[str, np.ndarray]):
    """``(ends, terminated)``, bool[L]: where each trajectory piece of ``b`` ends (terminated,
    truncated, an ``eps_id`` change, a gap in the step index ``t`` -- e.g. a replayed fragment
    next to a newer one of the same episode -- or the last row) and which rows terminated.
    A piece that ends without terminating bootstraps from V(next_obs)."""
    term = np.asarray(b[TERMINATEDS], bool)
    ends = term | np.asarray(b[TRUNCATEDS], bool)
    if EPS_ID in b:
        e = np.asarray(b[EPS_ID])
        ends[:-1] |= e[1:] != e[:-1]
    if T in b:
        t = np.asarray(b[T])
        ends[:-1] |= t[1:] != t[:-1] + 1
    if len(ends):
        ends[-1] = True
    return ends, term


def sequence_lengths(b: Mapping[str, np.ndarray], max_seq_len: int) -> np.ndarray:
    """The training sequences of a recurrent policy in ``b``: every trajectory piece (see
    :func:`trajectory_ends`) cut into runs of ``max_seq_len`` rows from its first row (the last
    run shorter). Sequences never cross an episode boundary or a fragment cut, so each starts
    from the state recorded with its first row (``state_in``).

    Returns:
        int64[k], the rows of each sequence in row order (they sum to ``len(b)``).
    """
    if not len(next(iter(b.values()), ())):
        return np.zeros(0, np.int64)
    ends, _ = trajectory_ends(b)
    pieces = np.diff(np.concatenate([[0], np.flatnonzero(ends) + 1]))
    L = int(max_seq_len)
    full, rest = pieces // L, pieces % L
    counts = full + (rest > 0)
    lens = np.full(int(counts.sum()), L, np.int64)
    last = np.cumsum(counts) - 1  # each piece's last sequence: the remainder where there is one
    lens[last[rest > 0]] = rest[rest > 0]
    return lens


class SampleBatch(dict):
    """A dict of columns ``name -> np.ndarray`` of equal length (the batch size)."""

    def __len__(self) -> int:  # number of rows, not of columns
        for v in self.values():
            return int(v.shape[0])
        return 0

    def copy(self) -> "SampleBatch":
        """A deep copy whose arrays are writable."""
        return SampleBatch({k: np.array(v, copy=True) for k, v in self.items()})

    def slice(self, start: int, end: int) -> "SampleBatch":
        """Rows ``start:end`` (numpy views, not copies)."""
        return SampleBatch({k: v[start:end] for k, v in self.items()})

    def take(self, idx: np.ndarray) -> "SampleBatch":
        """The rows at ``idx`` (int[k] or bool[B]; fancy indexing: copies)."""
        return SampleBatch({k: v[idx] for k, v in self.items()})

    def split_by_episode(self) -> List["SampleBatch"]:
        """Contiguous trajectories, cut where an episode ends or ``eps_id`` changes."""
        n = len(self)
        if n == 0:
            return []
        ends, _ = trajectory_ends(self)
        bounds = [0, *(np.flatnonzero(ends[:-1]) + 1).tolist(), n]
        return [self.slice(a, b) for a, b in zip(bounds[:-1], bounds[1:])]


def concat_samples(batches: Iterable[SampleBatch]) -> SampleBatch:
    """Concatenate SampleBatches row-wise; columns must agree.

    Raises:
        ValueError: if the batches do not share the same column names.
    """
    batches = [b for b in batches if len(b) > 0]
    if not batches:
        return SampleBatch()
    if len(batches) == 1:
        return SampleBatch(batches[0])
    keys = list(batches[0].keys())
    for b in batches[1:]:
        if set(b.keys()) != set(keys):
            raise ValueError(f"concat_samples: columns differ: {sorted(keys)} vs {sorted(b.keys())}")
    return SampleBatch({k: np.concatenate([b[k] for b in batches]) for k in keys})


class MultiAgentBatch:
    """Policy id -> SampleBatch, plus the env steps and finished episodes it covers.

    Attributes:
        policy_batches: ``{policy_id: SampleBatch}``.
        env_steps: real environment transitions sampled (the autoreset step counts none).
        agent_steps: acting-agent transitions (== env_steps for single-agent envs).
        episodes: summaries (dicts) of episodes that ended while this batch was sampled.
        worker_index: the worker that produced it (-1 when merged from several).
    """

    __slots__ = ("policy_batches", "env_steps", "agent_steps", "episodes", "worker_index", "meta")

    def __init__(self, policy_batches: Mapping[str, SampleBatch], env_steps: int,
                 agent_steps: Optional[int] = None, episodes: Optional[list] = None,
                 worker_index: int = -1, meta: Optional[dict] = None):
        self.policy_batches: Dict[str, SampleBatch] = dict(policy_batches)
        self.env_steps = int(env_steps)
        self.agent_steps = int(agent_steps if agent_steps is not None
                               else sum(len(b) for b in self.policy_batches.values()))
        self.episodes = list(episodes or [])
        self.worker_index = worker_index
        self.meta = dict(meta or {})

    def __len__(self) -> int:
        return self.env_steps

    def __getitem__(self, policy_id: str) -> SampleBatch:
        return self.policy_batches[policy_id]

    def select(self, policy_ids: Iterable[str]) -> "MultiAgentBatch":
        """A new batch with only ``policy_ids`` (env_steps kept, agent_steps recounted)."""
        keep = {p: b for p, b in self.policy_batches.items() if p in set(policy_ids)}
        return MultiAgentBatch(keep, self.env_steps, None, self.episodes, self.worker_index, self.meta)

    def to_dict(self) -> Dict[str, Any]:
        """Plain data (columns stay numpy arrays, shared, not copied), e.g. for checkpoints."""
        return {"policy_batches": {p: dict(b) for p, b in self.policy_batches.items()},
                "env_steps": self.env_steps, "agent_steps": self.agent_steps, "episodes": self.episodes,
                "worker_index": self.worker_index, "meta": self.meta}

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> "MultiAgentBatch":
        """The batch :meth:`to_dict` described."""
        pbs = {p: SampleBatch({k: np.asarray(v) for k, v in cols.items()}) for p, cols in d["policy_batches"].items()}
        return MultiAgentBatch(pbs, d["env_steps"], d["agent_steps"], d["episodes"], d["worker_index"], d["meta"])

    def __repr__(self) -> str:
        inner = ", ".join(f"{p}: {len(b)}" for p, b in self.policy_batches.items())
        return f"MultiAgentBatch(env_steps={self.env_steps}, {{{inner}}})"

    @staticmethod
    def concat(batches: List["MultiAgentBatch"]) -> "MultiAgentBatch":
        """Merge batches: per-policy rows concatenated, steps and episodes summed."""
        if len(batches) == 1:
            return batches[0]
        pids = list(dict.fromkeys(p for b in batches for p in b.policy_batches))
        merged = {p: concat_samples(b.policy_batches[p] for b in batches if p in b.policy_batches) for p in pids}
        eps = [e for b in batches for e in b.episodes]
        meta: dict = {}
        for b in batches:
            for k, v in b.meta.items():
                meta.setdefault(k, []).append(v)
        return MultiAgentBatch(merged, sum(b.env_steps for b in batches),
                               sum(b.agent_steps for b in batches), eps, -1, meta)
