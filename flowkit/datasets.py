"""Offline datasets: ``flowkit record`` (a trained policy's episodes written as a dataset) and
the checks and reading behind ``input.dataset`` (the offline plugin's source of experience).

Format: the Farama Foundation's Minari (``pip install 'flowkit[offline]'``: minari with its
HDF5 storage), local only (nothing is downloaded). A dataset is a folder ``PATH`` holding
``PATH/data/metadata.json`` and ``PATH/data/main_data.hdf5``; Minari's own API opens it as
``minari.MinariDataset("PATH/data")``, or as ``minari.load_dataset(NAME)`` with
``MINARI_DATASETS_PATH`` set to the folder above ``PATH`` (``NAME`` = the folder's name, of
Minari's form ``name-vN``). Per episode Minari keeps ``observations`` (T + 1 rows: the reset
observation, then each step's), ``actions``, ``rewards``, ``terminations`` and
``truncations`` (T rows each; the env's flags as the env gave them) and the reset ``seed``.

Recording reuses :func:`flowkit.core.run_episodes` (``flowkit evaluate``'s loop:
batched policy calls over ``num_envs`` sub-envs, episode ``i`` reset with ``seed + i``) and
streams finished episodes to the file every ``FLUSH_STEPS`` transitions (bounded memory).
``episodes=N`` records N whole episodes; ``steps=N`` records exactly N transitions: the
episodes still running when the N-th step is taken are kept, cut there, with their last
``truncations`` flag set (a cut, as a time limit: the learner bootstraps, never treats it as
terminal). Episodes are numbered in the order they end.

Reading fast: Minari's HDF5 storage keeps one group per episode, and reading one costs about a
millisecond of HDF5 bookkeeping (more on a busy machine), whatever its length.
:class:`ColumnStore` is a columnar copy of a dataset's steps (one raw ``.npy`` file per
column: each leaf of the observations and actions, rewards, terminations, truncations; plus
the episodes' ids and lengths), written once next to the dataset (``PATH/flowkit-columns``;
under ``$FLOWKIT_CACHE_DIR`` or ``~/.cache/flowkit/columns`` when the dataset's folder is not
writable) and rebuilt when the dataset changes (``append=true``). Reading the steps of a list
of episodes is then one gather per column (memory-mapped files whose pages are dropped from the
process after each read: memory is what the caller keeps, not the dataset).
"""
from __future__ import annotations

import hashlib
import json
import mmap
import os
import re
import shutil
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from flowkit.config import ConfigError, F

FLUSH_STEPS = 10_000  # transitions kept in memory before they are written
_ID_RE = re.compile(r"^[\w.-]+-v\d+$")


# ---- opening and checking -----------------------------------------------------------------------
def _minari(key: str) -> Any:
    try:
        import minari
    except ImportError:
        raise ConfigError(f"{key}: datasets need minari with HDF5 (pip install 'flowkit[offline]')") from None
    return minari


def data_dir(path: str, key: str = "input.dataset") -> str:
    """The Minari data folder (holding ``metadata.json``) of ``path``: a dataset folder, its
    ``data`` folder, or a Minari dataset id under ``$MINARI_DATASETS_PATH`` (local only).

    Raises:
        ConfigError: nothing of the kind at ``path`` (one line naming ``key``).
    """
    for cand in (os.path.join(path, "data"), path):
        if os.path.isfile(os.path.join(cand, "metadata.json")):
            return cand
    if os.path.exists(path):
        raise ConfigError(f"{key}={path!r}: not a dataset (no data/metadata.json: write one with flowkit record)")
    root = os.environ.get("MINARI_DATASETS_PATH") or os.path.join(os.path.expanduser("~"), ".minari", "datasets")
    local = os.path.join(root, path, "data")
    if not os.path.isabs(path) and os.path.isfile(os.path.join(local, "metadata.json")):
        return local
    raise ConfigError(f"{key}={path!r}: no such dataset (no such folder, nor a local Minari dataset id under {root})")


MAX_METADATA_BYTES = 16 * 2**20  # a dataset's metadata.json: its spaces serialized, counts, names
_METADATA_TYPES = {"observation_space": str, "action_space": str, "env_spec": str, "dataset_id": str,
                   "total_episodes": int, "total_steps": int, "minari_version": str, "data_format": str}


def open_dataset(path: str, key: str = "input.dataset") -> Any:
    """``path`` as a ``minari.MinariDataset``, checked: readable metadata, at least one
    transition, and an HDF5 file whose episodes are all there (a file cut short by a crash or
    a full disk is caught here, not mid-run).

    Raises:
        ConfigError: missing, not a dataset, unreadable or truncated, or empty (one line).
    """
    d = data_dir(path, key)
    minari = _minari(key)
    meta = os.path.join(d, "metadata.json")
    if (size := os.path.getsize(meta)) > MAX_METADATA_BYTES:  # json.load would hold it all, Minari twice
        raise ConfigError(f"{key}={path!r}: its metadata.json is {size / 2**20:.1f} MiB, over the "
                          f"{MAX_METADATA_BYTES // 2**20} MiB a dataset's metadata (spaces, counts) may take")
    try:  # absolute: Minari's storage sizes its files by a path that a relative folder doubles
        ds = minari.MinariDataset(os.path.abspath(d))
    except Exception as e:
        why = str(e).splitlines()[0] if str(e) else ""
        if isinstance(e, AssertionError):  # Minari asserts the metadata's field types, without words
            why = "metadata.json: " + ", ".join(
                f"`{k}` must be {t.__name__}" for k, t in _METADATA_TYPES.items()
                if k in (m := minari.dataset.minari_storage.MinariStorage.read_raw_metadata(d))
                and not isinstance(m[k], t)) or "its fields are not what Minari writes"
        raise ConfigError(f"{key}={path!r}: not a readable Minari dataset ({type(e).__name__}: {why})") from None
    n_eps, n_steps = int(ds.total_episodes), int(ds.total_steps)
    if n_eps == 0 or n_steps == 0:
        raise ConfigError(f"{key}={path!r}: the dataset is empty ({n_eps} episodes, {n_steps} steps)")
    h5 = os.path.join(d, "main_data.hdf5")
    try:
        expect: Dict[int, int] = {}
        if os.path.isfile(h5):  # every episode's group is there and the step counts add up
            import h5py
            with h5py.File(h5, "r") as f:
                if len(f.keys()) != n_eps:
                    raise ValueError(f"{len(f.keys())} episodes in the file, {n_eps} in metadata.json")
                expect = {i: int(f[f"episode_{i}"].attrs["total_steps"]) for i in range(n_eps)}
            if sum(expect.values()) != n_steps:
                raise ValueError(f"{sum(expect.values())} steps in the file, {n_steps} in metadata.json")
        for ep in ds.storage.get_episodes(sorted({0, n_eps - 1})):  # the first and the last read whole
            n = len(ep["rewards"])
            if n < 1 or n != expect.get(int(ep["id"]), n) or len(ep["terminations"]) != n:
                raise ValueError(f"episode {ep['id']} holds {n} steps, {expect.get(int(ep['id']))} recorded")
    except Exception as e:
        raise ConfigError(f"{key}={path!r}: the dataset file is damaged or truncated ({type(e).__name__}: "
                          f"{str(e).splitlines()[0] if str(e) else ''})") from None
    return ds


def check_spaces(ds: Any, observation_space: Any, action_space: Any, path: str, env: str,
                 key: str = "input.dataset") -> None:
    """Raise ConfigError unless the dataset's spaces are the env's (``gymnasium`` equality)."""
    for what, have, want in (("observation", ds.observation_space, observation_space),
                             ("action", ds.action_space, action_space)):
        if have != want:
            raise ConfigError(f"{key}={path!r}: the dataset's {what} space {have} is not the {what} space "
                              f"{want} of env {env!r}")


def check_dataset(run_config: Any, key: str = "input.dataset") -> Any:
    """Open ``input.dataset`` and check it against the run's env (built once, then closed):
    what a run from a dataset checks before anything starts. Returns the dataset.

    Raises:
        ConfigError: see :func:`open_dataset` and :func:`check_spaces`.
    """
    from omegaconf import OmegaConf

    from flowkit.core import EnvContext, env_name, make_env
    path = str(OmegaConf.select(run_config, key))
    ds = open_dataset(path, key)
    env_cfg: Dict[str, Any] = OmegaConf.to_container(run_config.env, resolve=True)  # type: ignore[assignment]
    try:
        env = make_env(env_cfg, EnvContext(-1, 0, 1, 0, int(run_config.seed)))
    except Exception as e:
        raise ConfigError(f"env {env_name(env_cfg)!r}: cannot build the env: {type(e).__name__}: {e}") from None
    try:
        check_spaces(ds, env.observation_space, env.action_space, path, env_name(env_cfg), key)
    finally:
        env.close()
    return ds


# ---- the columnar copy ---------------------------------------------------------------------------
COLUMNS_DIR, COLUMNS_VERSION = "flowkit-columns", 1
STEP_KEYS = ("rewards", "terminations", "truncations")


class ColumnsUnsupported(ValueError):
    """The dataset holds something other than fixed-shape numeric arrays (e.g. Text spaces):
    no columnar copy; read it through Minari."""


def _tree(x: Any, prefix: str, leaves: Dict[str, np.ndarray]) -> Any:
    """``x`` (arrays, or dicts / tuples of them) as a JSON tree of column names, its leaves put
    in ``leaves`` under those names."""
    if isinstance(x, dict):
        return {"dict": [[k, _tree(v, f"{prefix}/{k}", leaves)] for k, v in x.items()]}
    if isinstance(x, tuple):
        return {"tuple": [_tree(v, f"{prefix}/{i}", leaves) for i, v in enumerate(x)]}
    a = np.asarray(x)
    if a.dtype.kind not in "biuf" or a.ndim < 1:
        raise ColumnsUnsupported(f"{prefix}: {a.dtype} of shape {a.shape}")
    leaves[prefix] = a
    return prefix


def _untree(tree: Any, cols: Dict[str, np.ndarray]) -> Any:
    if isinstance(tree, str):
        return cols[tree]
    if "dict" in tree:
        return {k: _untree(v, cols) for k, v in tree["dict"]}
    return tuple(_untree(v, cols) for v in tree["tuple"])


def _signature(data: str) -> List[Any]:
    """What changes when a dataset is written to: its data folder's entries with their sizes
    and modification times."""
    return sorted([e.name, e.stat().st_size, e.stat().st_mtime_ns] for e in os.scandir(data))


def _npy_header(f: Any, dtype: np.dtype, shape: Tuple[int, ...]) -> None:
    np.lib.format.write_array_header_2_0(f, {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False,
                                             "shape": shape})


def _valid_columns(folder: str, data: Any) -> bool:
    """Whether ``folder`` holds a columnar copy of the dataset as its data folder ``data`` is now."""
    try:
        with open(os.path.join(folder, "index.json")) as f:
            index = json.load(f)
        return index.get("version") == COLUMNS_VERSION and index.get("signature") == _signature(data)
    except (OSError, ValueError):
        return False


def columns_folder(data: str) -> str:
    """Where the columnar copy of the dataset whose data folder is ``data`` lives: next to it,
    or in the user's cache when that folder is not writable."""
    root = os.path.dirname(os.path.abspath(data))
    if os.access(root, os.W_OK):
        return os.path.join(root, COLUMNS_DIR)
    cache = os.environ.get("FLOWKIT_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "flowkit", "columns")
    return os.path.join(cache, hashlib.sha1(os.path.abspath(data).encode()).hexdigest()[:16])


def build_columns(ds: Any, folder: str, chunk_steps: int = 100_000) -> None:
    """Write the columnar copy of the Minari dataset ``ds`` to ``folder`` (episodes in id order,
    read about ``chunk_steps`` steps at a time, by the mean episode length so far: bounded memory
    for datasets of similar episodes), atomically: a temporary folder renamed.

    Raises:
        ColumnsUnsupported: a leaf that is not a fixed-shape numeric array.
    """
    n_eps, n_steps = int(ds.total_episodes), int(ds.total_steps)
    tmp = f"{folder}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    files: Dict[str, Any] = {}
    index: Dict[str, Any] = {}
    lengths, ids = np.zeros(n_eps, np.int64), np.zeros(n_eps, np.int64)
    try:
        k = 0
        while k < n_eps:  # about chunk_steps steps at a time, by the mean length so far
            j = min(n_eps, k + (1 if k == 0 else max(1, int(chunk_steps * k / max(1, int(lengths[:k].sum()))))))
            for ep in ds.storage.get_episodes(range(k, j)):
                leaves: Dict[str, np.ndarray] = {}
                trees = {"observations": _tree(ep["observations"], "observations", leaves),
                         "actions": _tree(ep["actions"], "actions", leaves),
                         **{key: _tree(np.asarray(ep[key]), key, leaves) for key in STEP_KEYS}}
                n = len(ep["rewards"])
                lengths[k], ids[k] = n, int(ep["id"])
                if not files:  # the first episode fixes the columns
                    index = {"version": COLUMNS_VERSION, "trees": trees, "columns": {}}
                    for i, (name, a) in enumerate(leaves.items()):
                        rows = n_steps + n_eps if name.startswith("observations") else n_steps
                        f = files[name] = open(os.path.join(tmp, f"c{i}.npy"), "wb")
                        _npy_header(f, a.dtype, (rows, *a.shape[1:]))
                        index["columns"][name] = {"file": f"c{i}.npy", "dtype": a.dtype.str, "shape": list(a.shape[1:])}
                for name, a in leaves.items():
                    c = index["columns"].get(name)
                    want = n + 1 if name.startswith("observations") else n
                    if c is None or a.dtype.str != c["dtype"] or list(a.shape[1:]) != c["shape"] or len(a) != want:
                        raise ColumnsUnsupported(f"episode {ep['id']}: {name} {a.dtype}{list(a.shape)} differs from the "
                                                 "first episode's")
                    files[name].write(np.ascontiguousarray(a).tobytes())
                k += 1
        if int(lengths.sum()) != n_steps:
            raise ValueError(f"{int(lengths.sum())} steps read, {n_steps} in metadata.json")
        np.save(os.path.join(tmp, "episodes.npy"), np.stack([ids, lengths]))
    finally:
        for f in files.values():
            f.close()
    index["signature"] = _signature(ds.storage.data_path)
    with open(os.path.join(tmp, "index.json"), "w") as out:
        json.dump(index, out)
    if _valid_columns(folder, ds.storage.data_path):  # another process wrote it meanwhile: keep that one
        shutil.rmtree(tmp, ignore_errors=True)
        return
    old = f"{folder}.old-{os.getpid()}"
    if os.path.exists(folder):
        os.replace(folder, old)
    try:
        os.replace(tmp, folder)
    except OSError:  # another process put its copy there first: keep that one
        shutil.rmtree(tmp, ignore_errors=True)
    shutil.rmtree(old, ignore_errors=True)


class ColumnStore:
    """The columnar copy of a dataset (see the module docstring), open for reading.

    Each column file is memory-mapped (read-only); :meth:`read` gathers the rows of the
    episodes asked for with one numpy ``take`` per column into new arrays, then drops the
    mapping's pages from the process (``MADV_DONTNEED``: they stay in the page cache), so
    memory is what the caller keeps, not the dataset.

    Attributes:
        ids, lengths: int64[E], each episode's Minari id and number of steps, in id order.
    """

    def __init__(self, folder: str):
        with open(os.path.join(folder, "index.json")) as f:
            self.index = json.load(f)
        self.folder = folder
        self.ids, self.lengths = np.load(os.path.join(folder, "episodes.npy"))
        self.step_start = np.concatenate([[0], np.cumsum(self.lengths)[:-1]]).astype(np.int64)
        self.maps: Dict[str, mmap.mmap] = {}
        self.cols: Dict[str, np.ndarray] = {}  # name -> the whole column, a view of its map
        for name, c in self.index["columns"].items():
            with open(os.path.join(folder, c["file"]), "rb") as f:
                np.lib.format.read_magic(f)
                shape, _, dtype = np.lib.format.read_array_header_2_0(f)
                offset = f.tell()
                self.maps[name] = mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            self.cols[name] = np.frombuffer(mm, dtype, int(np.prod(shape, dtype=np.int64)), offset).reshape(shape)

    @classmethod
    def open(cls, path: str, key: str = "input.dataset") -> "ColumnStore":
        """The columnar copy of the dataset at ``path``, written first if there is none or the
        dataset changed since (a one-time read of every episode through Minari).

        Raises:
            ConfigError: see :func:`open_dataset`. ColumnsUnsupported: see :func:`build_columns`.
        """
        data = data_dir(path, key)
        folder = columns_folder(data)
        if not _valid_columns(folder, data):
            build_columns(open_dataset(path, key), folder)
        return cls(folder)

    def close(self) -> None:
        self.cols = {}
        for mm in self.maps.values():
            mm.close()
        self.maps = {}

    def read(self, episodes: Sequence[int]) -> Dict[str, Any]:
        """The steps of ``episodes`` (positions in id order), concatenated in that order:
        ``observations`` and ``next_observations`` (each step's, and the one after it; trees as
        the dataset's), ``actions``, ``rewards``, ``terminations``, ``truncations``,
        ``episode_ids`` int64[n], ``t`` int64[n] (the step's index in its episode) and
        ``lengths`` int64[k]."""
        e = np.asarray(episodes, np.int64)
        lens = self.lengths[e]
        n = int(lens.sum())
        t = np.arange(n, dtype=np.int64) - np.repeat(np.cumsum(lens) - lens, lens)
        rows = np.repeat(self.step_start[e], lens) + t  # each step's row in the step columns
        obs_rows = rows + np.repeat(e, lens)  # an episode holds one observation more than steps
        got, nxt = {}, {}
        for name, col in self.cols.items():
            if name.startswith("observations"):
                got[name], nxt[name] = col.take(obs_rows, 0), col.take(obs_rows + 1, 0)
            else:
                got[name] = col.take(rows, 0)
        for mm in self.maps.values():  # the pages read stay in the page cache, not in this process
            if hasattr(mm, "madvise") and hasattr(mmap, "MADV_DONTNEED"):
                mm.madvise(mmap.MADV_DONTNEED)
        trees = self.index["trees"]
        return {"observations": _untree(trees["observations"], got),
                "next_observations": _untree(trees["observations"], nxt),
                "actions": _untree(trees["actions"], got), **{k: got[k] for k in STEP_KEYS},
                "episode_ids": np.repeat(self.ids[e], lens), "t": t, "lengths": lens}


def steps_of(episodes: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
    """Minari's episode dicts as :meth:`ColumnStore.read` gives their steps (the reading of a
    dataset that has no columnar copy)."""

    def cat(xs: List[Any], lo: int, hi: int) -> Any:
        if isinstance(xs[0], dict):
            return {k: cat([x[k] for x in xs], lo, hi) for k in xs[0]}
        if isinstance(xs[0], tuple):
            return tuple(cat([x[i] for x in xs], lo, hi) for i in range(len(xs[0])))
        return np.concatenate([np.asarray(x)[lo:len(x) + hi] for x in xs])
    lens = np.asarray([len(ep["rewards"]) for ep in episodes], np.int64)
    ends = np.cumsum(lens)
    obs = [ep["observations"] for ep in episodes]
    return {"observations": cat(obs, 0, -1), "next_observations": cat(obs, 1, 0),
            "actions": cat([ep["actions"] for ep in episodes], 0, 0),
            **{k: np.concatenate([np.asarray(ep[k]) for ep in episodes]) for k in STEP_KEYS},
            "episode_ids": np.repeat([int(ep["id"]) for ep in episodes], lens),
            "t": np.arange(int(ends[-1]), dtype=np.int64) - np.repeat(ends - lens, lens), "lengths": lens}


# ---- writing ------------------------------------------------------------------------------------
class DatasetWriter:
    """Episodes appended to a Minari dataset at ``path`` (created, or ``append=True`` to an
    existing one with the same spaces), written in chunks of about ``FLUSH_STEPS`` transitions.

    Raises:
        ConfigError: ``path`` holds a dataset (without ``append``) or its spaces differ.
    """

    def __init__(self, path: str, observation_space: Any, action_space: Any, append: bool = False,
                 env_spec: Any = None, metadata: Optional[Dict[str, Any]] = None, key: str = "out"):
        minari = _minari(key)
        from minari.dataset.minari_storage import MinariStorage
        self.path, self.key = path, key
        d = os.path.join(path, "data")
        if os.path.exists(os.path.join(d, "metadata.json")):
            if not append:
                raise ConfigError(f"{key}={path!r}: a dataset is already there (append=true adds to it)")
            ds = open_dataset(path, key)
            check_spaces(ds, observation_space, action_space, path, "recorded", key)
            self.storage = ds.storage
        else:
            os.makedirs(d, exist_ok=True)
            name = os.path.basename(os.path.normpath(path))
            self.storage = MinariStorage.new(os.path.abspath(d), observation_space=observation_space, action_space=action_space,
                                             env_spec=env_spec, data_format="hdf5")
            self.storage.update_metadata({"dataset_id": name if _ID_RE.match(name) else f"{name}-v0",
                                          "minari_version": str(minari.__version__), **(metadata or {})})
        self.pending: List[Any] = []
        self.pending_steps = 0

    def add(self, seed: Optional[int], obs: Any, actions: Any, rewards: Any, terminations: Any,
            truncations: Any) -> None:
        """One episode: ``obs`` has one row more than the others (the reset observation first);
        ``obs`` and ``actions`` as lists of rows, or stacked (an array, or dicts / tuples of
        them); ``seed``: the reset seed, or None when unknown."""
        from flowkit.core import stack_rows
        obs, actions = (stack_rows(x) if isinstance(x, list) else x for x in (obs, actions))
        from minari.data_collector import EpisodeBuffer
        self.pending.append(EpisodeBuffer(
            seed=seed, observations=obs, actions=actions,
            rewards=np.asarray(rewards, np.float64), terminations=np.asarray(terminations, bool),
            truncations=np.asarray(truncations, bool)))
        self.pending_steps += len(rewards)
        if self.pending_steps >= FLUSH_STEPS:
            self.flush()

    def flush(self) -> None:
        if self.pending:
            self.storage.update_episodes(self.pending)
        self.pending, self.pending_steps = [], 0


@dataclass
class RecordArgs:
    """The ``key=value`` arguments of ``flowkit record``."""
    episodes: Optional[int] = F(None, "record this many whole episodes (default 10 when steps is not given)", ge=1)
    steps: Optional[int] = F(None, "record exactly this many transitions (episodes still running at the end are "
                                   "cut there, their last step flagged truncated)", ge=1)
    explore: str = F("greedy", "greedy: the policy's greedy action; sample: its sampled action; epsilon: greedy, "
                               "a uniformly random action with probability `epsilon`; random: random actions",
                     choices=("greedy", "sample", "epsilon", "random"))
    epsilon: float = F(0.1, "explore=epsilon: probability of a random action", ge=0, le=1)
    seed: Optional[int] = F(None, "episode i resets with seed + i; seeds the exploration (default: the run's seed)",
                            ge=0, le=2 ** 32 - 1)
    out: Optional[str] = F(None, "the dataset folder (default: RUN_DIR/datasets/<explore>-<N><episodes|steps>-"
                                 "seed<S>-v0)")
    append: bool = F(False, "add the episodes to the dataset already at `out` (same spaces)")
    num_envs: int = F(8, "sub-envs stepped together", ge=1)


class _Explore:
    """``policy`` acting as ``explore`` says (see :class:`RecordArgs`); the random draws come
    from ``seed``. Actions are what the env receives."""

    def __init__(self, policy: Any, action_space: Any, mode: str, epsilon: float, seed: int):
        self.policy, self.space, self.mode, self.epsilon = policy, action_space, mode, float(epsilon)
        self.rng = np.random.default_rng(seed)
        self.space.seed(int(self.rng.integers(2 ** 31)))

    def initial_state(self, n: int) -> Any:
        """The policy's recurrent state (None: feed-forward; see ``Acting.initial_state``)."""
        init = getattr(self.policy, "initial_state", None)
        return None if init is None else init(n)

    def compute_actions(self, obs: Any, explore: bool = False, state: Any = None) -> Any:
        from flowkit.core import batch_len
        n = batch_len(obs)
        if state is not None:  # a recurrent policy: its state moves on whatever the env receives
            acts, state = self.policy.compute_actions(obs, explore=self.mode == "sample", state=state)
        elif self.mode != "random":
            acts = self.policy.compute_actions(obs, explore=self.mode == "sample")
        acts = [self.space.sample() for _ in range(n)] if self.mode == "random" else list(acts)
        if self.mode == "epsilon":
            for i in np.flatnonzero(self.rng.random(n) < self.epsilon):
                acts[int(i)] = self.space.sample()
        return acts if state is None else (acts, state)


class _Full(Exception):
    """``steps`` transitions recorded: ends the episode loop."""


def record_episodes(policy: Any, env_cfg: Dict[str, Any], out: str, *, episodes: Optional[int] = None,
                    steps: Optional[int] = None, explore: str = "greedy", epsilon: float = 0.1, seed: int = 0,
                    append: bool = False, num_envs: int = 8, metadata: Optional[Dict[str, Any]] = None
                    ) -> Dict[str, Any]:
    """Roll ``policy`` (anything with ``compute_actions(obs, explore)`` over a batch of raw
    observations, e.g. a :class:`flowkit.Policy` or a scripted one) out in the env of
    ``env_cfg`` (the run config's ``env`` section as a dict) and write the episodes to the
    Minari dataset ``out`` (see the module docstring).

    Returns:
        ``{"path", "episodes", "steps", "return_mean", "returns"}`` (``returns``: per whole
        episode; cut episodes are left out of the mean).
    Raises:
        ConfigError: a bad argument, or ``out`` holds a dataset (without ``append``).
    """
    from flowkit.core import EnvContext, make_env, run_episodes
    if episodes is None and steps is None:
        episodes = 10
    probe = make_env(env_cfg, EnvContext(-1, 0, 1, 0, seed))
    obs_space, act_space = probe.observation_space, probe.action_space
    env_spec = getattr(probe, "spec", None) if env_cfg.get("id") else None
    probe.close()
    meta = {"flowkit_record": json.dumps({"explore": explore, "epsilon": epsilon, "seed": seed,
                                          "episodes": episodes, "steps": steps, **(metadata or {})})}
    writer = DatasetWriter(out, obs_space, act_space, append, env_spec, meta)
    acting = _Explore(policy, act_space, explore, epsilon, seed)
    live: Dict[int, Dict[str, List[Any]]] = {}
    done_returns: List[float] = []
    total = 0

    def on_step(i: int, obs: Any, action: Any, next_obs: Any, r: float, term: bool, trunc: bool, info: Any) -> None:
        nonlocal total
        ep = live.setdefault(i, {"obs": [obs], "actions": [], "rewards": [], "term": [], "trunc": []})
        ep["obs"].append(next_obs)
        ep["actions"].append(action)
        ep["rewards"].append(float(r))
        ep["term"].append(bool(term))
        ep["trunc"].append(bool(trunc))
        total += 1
        if term or trunc:
            e = live.pop(i)
            done_returns.append(float(np.sum(e["rewards"])))
            writer.add(seed + i, e["obs"], e["actions"], e["rewards"], e["term"], e["trunc"])
        if steps is not None and total >= steps:
            raise _Full

    n_eps = episodes if episodes is not None else int(steps or 0)  # an episode has at least one step
    try:
        run_episodes(acting, env_cfg, n_eps, seed, False, num_envs, on_step=on_step)
    except _Full:
        for i in sorted(live):  # cut: the last step of each running episode is flagged truncated
            e = live[i]
            e["trunc"][-1] = True
            writer.add(seed + i, e["obs"], e["actions"], e["rewards"], e["term"], e["trunc"])
    writer.flush()
    return {"path": out, "episodes": int(writer.storage.total_episodes), "steps": int(writer.storage.total_steps),
            "recorded_steps": total, "return_mean": float(np.mean(done_returns)) if done_returns else float("nan"),
            "returns": done_returns}


def record(path: str, episodes: Optional[int] = None, steps: Optional[int] = None, explore: str = "greedy",
           epsilon: float = 0.1, seed: Optional[int] = None, out: Optional[str] = None, append: bool = False,
           num_envs: int = 8, trust_config: bool = False) -> Dict[str, Any]:
    """``flowkit record``: the policy of the checkpoint at ``path`` (a run folder: its newest
    checkpoint; loaded as :func:`flowkit.evaluation.evaluate` loads it, ``trust_config`` as
    there) rolled out into a dataset (:func:`record_episodes`). Single-agent Gymnasium envs.

    Raises:
        CheckpointError: no or an unreadable checkpoint at ``path``.
        ConfigError: a multi-agent run, a bad argument, ``out`` already holds a dataset, or
            ``out`` cannot be a folder (a file, under a file, not writable: before any work).
    """
    from omegaconf import OmegaConf

    from flowkit._outputs import check_output_folder
    from flowkit.checkpoint import CheckpointError, find_checkpoint, load_trained
    from flowkit.core import derive_seed
    if episodes is not None and steps is not None:
        raise ConfigError(f"give episodes or steps, not both (episodes={episodes}, steps={steps})")
    if out is not None:
        check_output_folder(out, "out=")
    try:
        ck = find_checkpoint(path)
    except FileNotFoundError as e:
        raise CheckpointError(str(e)) from None
    algo = load_trained(ck, trust_config=trust_config)
    cfg = algo.run_config
    if len(algo.policies) != 1:
        raise ConfigError(f"flowkit record: single-agent runs only (this run has policies {', '.join(algo.policies)})")
    seed = int(cfg.seed) if seed is None else int(seed)
    pol = algo.get_policy()
    pol.np_random = np.random.default_rng(derive_seed(seed, "record"))
    pol.generator.manual_seed(derive_seed(seed, "record"))
    if out is None:
        n = f"{episodes}episodes" if episodes is not None else f"{steps}steps" if steps is not None else "10episodes"
        run_dir = os.path.dirname(os.path.dirname(ck)) if os.path.basename(os.path.dirname(ck)) == "checkpoints" else ck
        out = os.path.join(run_dir, "datasets", f"{explore}-{n}-seed{seed}-v0")
    env_cfg: Dict[str, Any] = OmegaConf.to_container(cfg.env, resolve=True)  # type: ignore[assignment]
    res = record_episodes(pol, env_cfg, out, episodes=episodes, steps=steps, explore=explore, epsilon=epsilon,
                          seed=seed, append=append, num_envs=num_envs,
                          metadata={"checkpoint": os.path.abspath(ck), "algo": str(cfg.algo)})
    res["checkpoint"] = ck
    return res
