"""``run.output``: the experience a training run samples, written as a Minari dataset (the
format and :class:`~flowkit.datasets.DatasetWriter` of ``flowkit record``, see
:mod:`flowkit.datasets`).

Where the values come from: the Gymnasium runner keeps, with each row it samples, the env's
own values (the observation before encoding, the action after ``to_env``: clipped and scaled
as the env received it, the float64 reward, the env's ``terminated`` / ``truncated``, and
the final observation of a row that ends an episode); it cuts them with the fragment and hands
them out in ``MultiAgentBatch.meta["raw"]`` before post-processing (n-step returns, GAE,
sequences never touch them; :func:`flowkit.core._runner.take_raw`). On the driver,
:class:`OutputWriter` is the operator right after the rollouts
(:func:`~flowkit.core.ops.ParallelRollouts`): it strips ``meta["raw"]`` from each batch and
keeps each episode's pieces until its last one arrives (an episode spans fragments, as R2D2's
sequences do), then writes it whole. Episodes are numbered in the order they end; their reset
seed is not recorded (a training sub-env is seeded once, at its first reset).

Checkpoints and the dataset agree: a checkpoint writes every finished episode first and
records the dataset's episode count; a resumed run cuts the dataset back to that count (the
episodes a run wrote after its last checkpoint, before it was killed, go: the resumed run
samples them anew) and appends. The episodes still running at a checkpoint are not in it (a
resumed run's workers start new episodes). Torch-free.
"""
from __future__ import annotations

import json
import os
from typing import Any, Dict, Optional

import numpy as np

from flowkit import datasets
from flowkit.config import ConfigError
from flowkit.core import batch as sb
from flowkit.datasets import DatasetWriter, check_contents, check_folder, check_spaces, has_dataset, open_dataset

KEY = "run.output"
_OBS, _NEXT = sb.RAW_PREFIX + "obs", sb.RAW_PREFIX + "next_obs"


def check_output(cfg: Any, resuming: bool = False) -> None:
    """The checks of ``run.output`` made before anything starts: the folder is new, empty, or
    holds a dataset that ``run.output_append=true`` (or a resumed run) adds to, and it can be
    written.

    Raises:
        ConfigError: one line naming ``run.output``.
    """
    path = cfg.run.get("output")
    if path:
        check_folder(str(path), KEY)
        if has_dataset(str(path)) and not resuming and not cfg.run.get("output_append"):
            raise ConfigError(f"{KEY}={str(path)!r}: a dataset is already there (run.output_append=true adds to it)")


def make_output(cfg: Any, env: Any, specs: Dict[str, Any]) -> Optional["OutputWriter"]:
    """The :class:`OutputWriter` of ``run.output`` (None when unset), for the run whose probe
    env is ``env`` and whose policies are ``specs``.

    Raises:
        ConfigError: a multi-agent env, or ``run.output_append`` to a dataset of other spaces.
    """
    path = cfg.run.get("output")
    if not path:
        return None
    import gymnasium as gym
    if not isinstance(env, gym.Env) or len(specs) != 1:
        raise ConfigError(f"{KEY}={path!r}: run.output supports single-agent envs (this run has policies "
                          f"{', '.join(specs)})")
    spec = next(iter(specs.values()))
    if cfg.run.get("output_append") and has_dataset(str(path)):
        name = str(cfg.env.id or cfg.env.factory)
        ds = open_dataset(str(path), KEY)
        check_spaces(ds, spec.observation_space, spec.action_space, str(path), name, KEY)
        check_contents(str(path), ds, KEY, columns=False)  # appended to: sound so far
    meta = {"flowkit_run": json.dumps({"algo": str(cfg.algo), "env": str(cfg.env.id or cfg.env.factory),
                                       "seed": int(cfg.seed), "run_dir": str(cfg.run.dir or "")})}
    return OutputWriter(str(path), spec.observation_space, spec.action_space, bool(cfg.run.get("output_append")),
                        getattr(env, "spec", None) if cfg.env.id else None, meta)


def cut_back(path: str, episodes: int) -> None:
    """Remove the episodes after the first ``episodes`` of the dataset at ``path`` (their HDF5
    groups, and the counts of ``metadata.json``).

    Raises:
        ValueError: the dataset holds fewer episodes.
    """
    import h5py
    from minari.dataset.minari_storage import MinariStorage
    d = os.path.join(path, "data")
    if episodes == 0:  # an empty Minari dataset cannot be opened to append to: none at all
        import shutil
        shutil.rmtree(d)
        return
    with h5py.File(os.path.join(d, "main_data.hdf5"), "a") as f:
        total = len(f.keys())
        if total < episodes:
            raise ValueError(f"{KEY}={path!r} holds {total} episodes, fewer than the {episodes} the checkpoint "
                             "recorded (was the dataset replaced?)")
        for i in range(episodes, total):
            del f[f"episode_{i}"]
        steps = sum(int(f[f"episode_{i}"].attrs["total_steps"]) for i in range(episodes))
    if total > episodes:
        MinariStorage.read(os.path.abspath(d)).update_metadata({"total_episodes": int(episodes),
                                                                "total_steps": int(steps)})


class OutputWriter:
    """The operator of ``run.output`` (see the module docstring): called with each sampled
    MultiAgentBatch, writes the episodes it completes and returns the batch without
    ``meta["raw"]``. Stateful (a checkpoint writes what is finished and records the count).

    Attributes:
        episodes_dropped: pieces of episodes whose start this writer never saw (a worker's
            episode that began before a resume) or with a gap (a worker rebuilt mid-episode
            starts new episode ids, so this stays 0 in practice).
    """

    wired = False

    def __init__(self, path: str, observation_space: Any, action_space: Any, append: bool = False,
                 env_spec: Any = None, metadata: Optional[Dict[str, Any]] = None):
        self.path, self.observation_space, self.action_space = path, observation_space, action_space
        self.append, self.env_spec, self.metadata = append, env_spec, metadata
        self.name = f"WriteOutput({path})"
        self.writer: Optional[DatasetWriter] = None
        self.pending: Dict[int, Dict[str, Any]] = {}  # eps_id -> the pieces so far
        self.resumed = False
        self.episodes_dropped = 0

    # -- the operator --
    def __call__(self, b: sb.MultiAgentBatch) -> sb.MultiAgentBatch:
        raws = b.meta.get("raw")
        if raws is None:
            raise ValueError(f"{KEY}: a sampled batch without the env's own values (meta['raw']): its env runner "
                             "does not record them (the Gymnasium runner does)")
        for raw in raws if isinstance(raws, list) else [raws]:
            self.add_fragment(raw)
        meta = {k: v for k, v in b.meta.items() if k != "raw"}
        return sb.MultiAgentBatch(b.policy_batches, b.env_steps, b.agent_steps, b.episodes, b.worker_index, meta)

    def add_fragment(self, raw: Dict[str, np.ndarray]) -> None:
        """One fragment's ``meta["raw"]`` (:func:`~flowkit.core._runner.take_raw`): its rows
        appended to their episodes, each episode whose last row is here written."""
        eps, t = np.asarray(raw[sb.EPS_ID]), np.asarray(raw[sb.T])
        n = len(eps)
        if n == 0:
            return
        term = np.asarray(raw[sb.RAW_PREFIX + "terminateds"], bool)
        trunc = np.asarray(raw[sb.RAW_PREFIX + "truncateds"], bool)
        ends = term | trunc
        final_of = {int(r): i for i, r in enumerate(np.flatnonzero(ends))}  # row -> its row of raw:next_obs*
        obs_keys = [k for k in raw if k == _OBS or k.startswith(_OBS + "/")]
        starts = np.flatnonzero(np.r_[True, (eps[1:] != eps[:-1]) | ends[:-1]]).tolist()
        for lo, hi in zip(starts, starts[1:] + [n]):
            e = int(eps[lo])
            ep = self.pending.get(e)
            if ep is None:
                if t[lo] != 0:  # its start was never seen here
                    self.episodes_dropped += 1
                    continue
                ep = self.pending[e] = {"obs": {k: [] for k in obs_keys}, "actions": [], "rewards": [],
                                        "term": [], "trunc": [], "next_t": 0}
            elif t[lo] != ep["next_t"]:  # a gap: the episode cannot be written whole
                del self.pending[e]
                self.episodes_dropped += 1
                continue
            for k in obs_keys:
                ep["obs"][k].append(np.array(raw[k][lo:hi]))
            ep["actions"].append(np.array(raw[sb.RAW_PREFIX + "actions"][lo:hi]))
            ep["rewards"].append(np.array(raw[sb.RAW_PREFIX + "rewards"][lo:hi]))
            ep["term"].append(term[lo:hi].copy())
            ep["trunc"].append(trunc[lo:hi].copy())
            ep["next_t"] = int(t[hi - 1]) + 1
            if ends[hi - 1]:
                i = final_of[hi - 1]
                cols = {k: np.concatenate([*ep["obs"][k], raw[_NEXT + k[len(_OBS):]][i:i + 1]]) for k in obs_keys}
                self._open().add(None, datasets.untree(datasets.leaf_spaces(self.observation_space, _OBS, {}), cols),
                                        np.concatenate(ep["actions"]), np.concatenate(ep["rewards"]),
                                        np.concatenate(ep["term"]), np.concatenate(ep["trunc"]))
                del self.pending[e]

    def _open(self) -> DatasetWriter:
        if self.writer is None:
            self.writer = DatasetWriter(self.path, self.observation_space, self.action_space,
                                        append=self.append or self.resumed, env_spec=self.env_spec,
                                        metadata=self.metadata, key=KEY)
        return self.writer

    def flush(self) -> None:
        if self.writer is not None:
            self.writer.flush()

    stop = flush

    # -- checkpoints --
    def get_state(self) -> Dict[str, Any]:
        """Every finished episode written, then ``{"episodes", "steps"}`` of the dataset."""
        self.flush()
        m: Dict[str, Any] = {}
        if self.writer is not None:
            m = {"total_episodes": self.writer.storage.total_episodes, "total_steps": self.writer.storage.total_steps}
        elif has_dataset(self.path):
            with open(os.path.join(self.path, "data", "metadata.json")) as f:
                m = json.load(f)
        return {"episodes": int(m.get("total_episodes", 0)), "steps": int(m.get("total_steps", 0))}

    def set_state(self, state: Dict[str, Any]) -> None:
        """A resumed run: the dataset cut back to the checkpoint's episodes, appended to from
        then on. Raises ValueError when it holds fewer (replaced, or emptied)."""
        n = int(state["episodes"])
        self.resumed = True
        if has_dataset(self.path):
            cut_back(self.path, n)
        elif n > 0:
            raise ValueError(f"{KEY}={self.path!r}: no dataset there, the checkpoint recorded {n} episodes in it")
