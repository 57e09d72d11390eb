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

import contextlib
import hashlib
import json
import mmap
import os
import re
import shutil
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from flowkit.config import MAX_EPISODES, ConfigError, F

FLUSH_STEPS = 10_000  # transitions kept in memory before they are written
MAX_RECORD_STEPS = 10 ** 8  # flowkit record's steps=: twice the 5 x 10^7 transitions of one run of the DQN Replay Dataset
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


def has_dataset(path: str) -> bool:
    """Whether the folder ``path`` holds a dataset (``path/data/metadata.json``)."""
    return os.path.isfile(os.path.join(path, "data", "metadata.json"))


def check_folder(path: str, key: str) -> None:
    """Before any work: ``path`` can be a dataset's folder (new, empty, or holding a dataset).

    Raises:
        ConfigError: a file, under a file, in a folder that cannot be written, or a folder of
            other files (one line naming ``key``).
    """
    from flowkit._outputs import check_output_folder
    check_output_folder(path, f"{key}=")
    if os.path.isdir(path) and os.listdir(path) and not has_dataset(path):
        raise ConfigError(f"{key}={path!r}: the folder holds files but no dataset (give a new or empty folder)")


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
        raise ConfigError(f"{key}={path!r}: the dataset file main_data.hdf5 is damaged or truncated ({type(e).__name__}: "
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
    """Open ``input.dataset`` and check it against the run's env (built once, then closed) and
    every episode against the spaces (:func:`check_contents`): what a run from a dataset checks
    before anything starts (torch, Ray, the run folder). Returns the dataset.

    Raises:
        ConfigError: see :func:`open_dataset`, :func:`check_spaces` and :func:`check_contents`.
    """
    from omegaconf import OmegaConf

    from flowkit.core import EnvContext, env_name
    from flowkit.core._envs import probe_env
    path = str(OmegaConf.select(run_config, key))
    ds = open_dataset(path, key)
    env_cfg: Dict[str, Any] = OmegaConf.to_container(run_config.env, resolve=True)  # type: ignore[assignment]
    env = probe_env(env_cfg, EnvContext(-1, 0, 1, 0, int(run_config.seed)))
    try:
        check_spaces(ds, env.observation_space, env.action_space, path, env_name(env_cfg), key)
    finally:
        env.close()
    check_contents(path, ds, key)
    return ds


# ---- checking episodes against the spaces --------------------------------------------------------
STEP_KEYS = ("rewards", "terminations", "truncations")
SHA_ATTR = "flowkit_sha256"  # on each episode flowkit writes: {HDF5 dataset: the sha256 of its data} as JSON
_CHUNK = 1 << 22  # elements checked at a time: bounded memory on large columns
_REWARD, _FLAG = "reward", "flag"  # the leaf "spaces" of rewards and of terminations / truncations


class BadEpisode(ValueError):
    """An episode whose contents contradict the dataset's spaces or themselves, or whose stored
    data is not what flowkit wrote (its sha256); the message names the episode and the field."""


def leaf_spaces(space: Any, prefix: str, out: Dict[str, Any]) -> Any:
    """The JSON tree of the column names of ``space``'s leaves (``prefix``, ``prefix/key`` for
    a Dict's, ``prefix/i`` for a Tuple's), each leaf space put in ``out`` under its name."""
    from gymnasium import spaces as S
    if isinstance(space, S.Dict):
        return {"dict": [[k, leaf_spaces(s, f"{prefix}/{k}", out)] for k, s in space.spaces.items()]}
    if isinstance(space, S.Tuple):
        return {"tuple": [leaf_spaces(s, f"{prefix}/{i}", out) for i, s in enumerate(space.spaces)]}
    out[prefix] = space
    return prefix


def step_spaces(observation_space: Any, action_space: Any) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """``(trees, spaces)``: the column trees of a dataset's fields and the space of every column
    (rewards: finite numbers; terminations and truncations: flags)."""
    spaces: Dict[str, Any] = {}
    trees = {"observations": leaf_spaces(observation_space, "observations", spaces),
             "actions": leaf_spaces(action_space, "actions", spaces), **{k: k for k in STEP_KEYS}}
    spaces.update({"rewards": _REWARD, "terminations": _FLAG, "truncations": _FLAG})
    return trees, spaces


def _layout(space: Any) -> Optional[Tuple[Tuple[int, ...], str, Optional[Tuple[np.ndarray, np.ndarray]]]]:
    """``(shape of one row, the dtype kinds it may have, (lowest, highest) value of each element
    of a row, flattened, or None: rewards)`` of a leaf stored as a numeric column; None for the
    spaces that are not (Text, Graph, ...: checked row by row)."""
    from gymnasium import spaces as S
    if space is _REWARD:
        return (), "biuf", None
    if space is _FLAG or isinstance(space, S.MultiBinary):
        return tuple(getattr(space, "shape", ())), "biu", (np.zeros(1), np.ones(1))
    if isinstance(space, S.Box):
        return tuple(space.shape), "biuf", (space.low.reshape(-1), space.high.reshape(-1))
    if isinstance(space, S.MultiDiscrete):
        return tuple(space.shape), "iu", (space.start.reshape(-1), (space.start + space.nvec - 1).reshape(-1))
    if isinstance(space, S.Discrete):
        return (), "iu", (np.asarray([space.start]), np.asarray([space.start + space.n - 1]))
    return None


def _space_words(space: Any) -> str:
    """``space`` in short: a Box as ``Box((4,), float32)`` (its bounds are long), others as gymnasium prints them."""
    if space.__class__.__name__ == "Box":
        return f"Box({space.shape}, {space.dtype})"
    return str(space)


def _kind_words(space: Any) -> str:
    if space is _REWARD:
        return "numbers"
    if space is _FLAG:
        return "flags (booleans)"
    return f"{'numbers' if _layout(space)[1] == 'biuf' else 'whole numbers'} of {_space_words(space)}"  # type: ignore[index]


def _leaves(x: Any, tree: Any, name: str, out: Dict[str, Any]) -> None:
    """``x`` (an episode's observations or actions as Minari gives them) split into the leaves
    of ``tree`` (raises ValueError naming the field where the structure differs)."""
    if isinstance(tree, str):
        out[tree] = x
    elif "dict" in tree:
        keys = [k for k, _ in tree["dict"]]
        if not isinstance(x, dict) or sorted(x) != sorted(keys):
            raise ValueError(f"{name} hold {sorted(x) if isinstance(x, dict) else type(x).__name__}, not a dict "
                             f"of the space's keys {keys}")
        for k, sub in tree["dict"]:
            _leaves(x[k], sub, f"{name}/{k}", out)
    else:
        if not isinstance(x, (tuple, list)) or len(x) != len(tree["tuple"]):
            raise ValueError(f"{name} hold a {type(x).__name__}, not a tuple of {len(tree['tuple'])}")
        for i, (v, sub) in enumerate(zip(x, tree["tuple"])):
            _leaves(v, sub, f"{name}/{i}", out)


def _nrows(x: Any) -> int:
    try:
        return len(x)
    except TypeError:  # a scalar
        return 0


def _row_word(name: str) -> str:
    return "observation" if name.startswith("observations") else "step"


def episode_leaves(ep: Dict[str, Any], trees: Dict[str, Any], spaces: Dict[str, Any],
                   steps: Optional[int] = None) -> Dict[str, Any]:
    """The fields of one episode (a dict as Minari's storage gives it) as arrays by column
    name (see :func:`step_spaces`), checked against the layout of their spaces: T >= 1 steps
    (``steps`` when given: the episode's ``total_steps``), T + 1 observations (the reset one
    first) and T of every other field, each row of its space's shape and of a dtype its space
    can hold (``same_kind`` casting: float actions for a Discrete space, strings for a Box are
    refused). Leaves of other spaces (Text, ...) are checked row by row (``space.contains``).

    Raises:
        BadEpisode: naming the episode and the field.
    """
    where = f"episode {ep['id']}"
    n = _nrows(ep["rewards"])
    if n < 1 or (steps is not None and n != steps):
        raise BadEpisode(f"{where}: rewards hold {n} steps" + (f", its total_steps says {steps}" if steps is not None
                                                                 else ", an episode has at least one"))
    raw: Dict[str, Any] = {k: ep[k] for k in STEP_KEYS}
    try:
        for field in ("observations", "actions"):
            _leaves(ep[field], trees[field], field, raw)
    except ValueError as e:
        raise BadEpisode(f"{where}: {e}") from None
    out: Dict[str, Any] = {}
    for name, x in raw.items():
        space, rows = spaces[name], n + 1 if name.startswith("observations") else n
        per = "the reset observation, then one per step" if rows > n else "one per step"
        if _nrows(x) != rows:
            raise BadEpisode(f"{where}: {name} hold {_nrows(x)} rows for its {n} steps ({rows} expected: {per})")
        lay = _layout(space)
        if lay is None:  # a space without a numeric layout: its rows one by one
            for t, row in enumerate(x):
                if not space.contains(row):
                    raise BadEpisode(f"{where}, {_row_word(name)} {t}: {name} {str(row)[:40]!r} is not in {space}")
            out[name] = x
            continue
        a = np.asarray(x)
        if a.dtype.kind not in lay[1] or (lay[1] == "biuf" and space is not _REWARD
                                          and not np.can_cast(a.dtype, space.dtype, "same_kind")):
            raise BadEpisode(f"{where}: {name} are {a.dtype} values, not {_kind_words(space)}")
        if a.shape[1:] != lay[0]:
            raise BadEpisode(f"{where}: {name} of shape {a.shape[1:]} per row, not {lay[0]} ({_kind_words(space)})")
        out[name] = a
    return out


def _first_bad(a: np.ndarray, space: Any) -> Optional[Tuple[int, str]]:
    """The first row of ``a`` (rows of one numeric leaf) holding a value ``space`` does not
    allow (not finite; outside its bounds), with what it is, or None."""
    flat = a.reshape(len(a), -1)
    if a.dtype.kind == "f":
        fin = np.isfinite(flat)
        if not fin.all():
            r = int(np.argmin(fin.all(1)))
            j = int(np.argmin(fin[r]))
            return r, f"{'' if a.ndim == 1 else f'[{j}]'} = {flat[r, j]} is not finite"
    b = _layout(space)[2]  # type: ignore[index]
    if b is None:
        return None
    lo, hi = b
    if a.dtype.kind in "biu":  # a dtype whose every value is inside: nothing to compare
        info = np.iinfo(a.dtype) if a.dtype.kind != "b" else SimpleNamespace(min=0, max=1)
        if (lo <= info.min).all() and (hi >= info.max).all():
            return None
    out = (flat < lo) | (flat > hi)
    rows = out.any(1)
    if not rows.any():
        return None
    r = int(np.argmax(rows))
    j = int(np.argmax(out[r]))
    what = _space_words(space) if not isinstance(space, str) else "a flag (0 or 1)"
    return r, (f"{'' if a.ndim == 1 else f'[{j}]'} = {flat[r, j]:.6g} is outside "
               f"[{lo[j % len(lo)]:.6g}, {hi[j % len(hi)]:.6g}] ({what})")


def check_steps(leaves: Dict[str, np.ndarray], spaces: Dict[str, Any], ids: np.ndarray,
                lengths: np.ndarray) -> None:
    """Check the values of the steps of several episodes, their numeric leaves concatenated
    (``leaves``: column name -> rows, as :class:`ColumnStore` holds them; ``ids`` and
    ``lengths``: the episodes' ids and steps, in the rows' order): observations and actions
    inside their spaces (finite; a Box's bounds, a Discrete's range, ...), rewards finite,
    terminations / truncations flags, set on no step before an episode's last (an episode ends
    at its first terminated or truncated step). Vectorised, ``_CHUNK`` elements at a time.

    Raises:
        BadEpisode: the first bad value, naming its episode, step (or observation) and field.
    """
    step_start = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    for name, a in leaves.items():
        obs = name.startswith("observations")
        starts = step_start + np.arange(len(lengths)) if obs else step_start
        per = max(1, _CHUNK // max(1, int(np.prod(a.shape[1:], dtype=np.int64))))
        for lo in range(0, len(a), per):
            bad = _first_bad(np.asarray(a[lo:lo + per]), spaces[name])
            if bad is not None:
                row = lo + bad[0]
                e = int(np.searchsorted(starts, row, "right")) - 1
                raise BadEpisode(f"episode {int(ids[e])}, {_row_word(name)} {row - int(starts[e])}: {name}{bad[1]}")
    ends = np.flatnonzero(np.asarray(leaves["terminations"], bool) | np.asarray(leaves["truncations"], bool))
    last = np.zeros(int(np.sum(lengths)), bool)
    last[step_start + lengths - 1] = True
    early = ends[~last[ends]]
    if len(early):
        e = int(np.searchsorted(step_start, early[0], "right")) - 1
        flag = "terminated" if leaves["terminations"][early[0]] else "truncated"
        raise BadEpisode(f"episode {int(ids[e])}, step {int(early[0] - step_start[e])}: {flag}, but the episode goes "
                         f"on to {int(lengths[e])} steps (an episode ends at its first terminated or truncated step)")


def _digest(a: Any) -> str:
    """sha256 of an HDF5 dataset's data: its dtype, shape and bytes (strings: their repr)."""
    a = np.asarray(a)
    h = hashlib.sha256(f"{a.dtype.str}{a.shape}".encode())
    h.update(repr(a.tolist()).encode() if a.dtype.kind == "O" else np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def write_checksums(h5: str, episodes: Sequence[int]) -> None:
    """Give each episode of ``episodes`` (ids) of the HDF5 file ``h5`` the sha256 of each of its
    HDF5 datasets, as stored (:func:`_digest`), in its group's ``flowkit_sha256`` attribute:
    a JSON object keyed by the dataset's path in the group (what flowkit's writer does after
    each write)."""
    import h5py
    with h5py.File(h5, "a") as f:
        for i in episodes:
            g = f[f"episode_{i}"]
            names: List[str] = []
            g.visit(names.append)  # every path under the group: its datasets, and a Dict's or Tuple's subgroups
            g.attrs[SHA_ATTR] = json.dumps({n: _digest(g[n][()]) for n in names if isinstance(g[n], h5py.Dataset)})


def verify_checksums(group: Any, ep: Optional[Dict[str, Any]] = None) -> None:
    """Check one episode's HDF5 ``group`` against its ``flowkit_sha256`` (an episode without
    one, as Minari's own writers leave it, is not checked). ``ep``: the episode as Minari
    decoded it; a field whose decoded array is what the file stores is hashed from it (no
    second read), the others (JPEG frames, text) from the file.

    Raises:
        BadEpisode: a dataset whose data differs (names the file, the episode and the field).
    """
    if SHA_ATTR not in group.attrs:
        return
    for name, want in json.loads(group.attrs[SHA_ATTR]).items():
        x: Any = ep
        for part in name.split("/"):  # the decoded value at the dataset's path (Tuple leaves: _index_i)
            x = (x.get(part) if isinstance(x, dict) else x[int(part[7:])]
                 if isinstance(x, tuple) and part.startswith("_index_") else None)
        if (not isinstance(x, np.ndarray) or _digest(x) != want) and _digest(group[name][()]) != want:
            raise BadEpisode(f"main_data.hdf5: episode {group.name.split('_')[-1]}'s {name} are not what flowkit "
                             "wrote (their sha256 differs: the file was changed or damaged since)")


def _read_episodes(ds: Any, ids: Sequence[int], f: Any) -> Iterator[Tuple[Dict[str, Any], Optional[int]]]:
    """``(episode, its total_steps)`` for ``ids`` (in order) through Minari's storage, each
    verified against flowkit's checksums when ``f`` (the open HDF5 file) is given. An episode
    Minari cannot decode (a field missing, of another structure) raises BadEpisode."""
    it = iter(ds.storage.get_episodes(ids))
    for i in ids:
        try:
            ep = next(it)
            g = f[f"episode_{i}"] if f is not None else None
        except Exception as e:
            raise BadEpisode(f"episode {i}: cannot be read ({type(e).__name__}: "
                             f"{(str(e).splitlines() or [''])[0]})") from None
        if g is not None:
            verify_checksums(g, ep)
        yield ep, (int(g.attrs["total_steps"]) if g is not None and "total_steps" in g.attrs else None)


def _h5(ds: Any) -> Any:
    """The dataset's HDF5 file open for reading, or a null context (another storage format)."""
    path = os.path.join(str(ds.storage.data_path), "main_data.hdf5")
    if not os.path.isfile(path):
        return contextlib.nullcontext(None)
    import h5py
    return h5py.File(path, "r")


def check_contents(path: str, ds: Any, key: str = "input.dataset", columns: bool = True) -> None:
    """Check every episode of the dataset ``ds`` (opened from ``path``) against its spaces
    (:func:`episode_leaves`, :func:`check_steps`) and flowkit's checksums, before a run uses it.
    Done on the columnar copy (:func:`build_columns` checks each episode's layout and checksums
    as it writes the copy, once per change of the dataset; the values are checked on the copy
    at every call: a vectorised pass over its columns); a dataset that has none (Text spaces,
    or no room for it), or ``columns=False`` (a dataset about to be appended to), is checked
    episode by episode through Minari.

    Raises:
        ConfigError: one line naming ``key``, the dataset, the episode and the field.
    """
    trees, spaces = step_spaces(ds.observation_space, ds.action_space)
    try:
        try:
            if not columns:
                raise ColumnsUnsupported("not asked for")
            store = ColumnStore.open(path, key)
        except (ColumnsUnsupported, OSError):  # no copy (Text spaces, no room for it): through Minari
            _check_through_minari(ds, trees, spaces)
            return
        why = None
        try:
            check_steps(store.cols, spaces, store.ids, store.lengths)
        except BadEpisode as e:
            why = str(e)  # (its frames hold views of the columns: gone before they are unmapped)
        store.close()
        if why is not None:
            raise BadEpisode(why)
    except BadEpisode as e:
        raise ConfigError(f"{key}={path!r}: {e}") from None
    except OSError as e:  # the HDF5 file cannot be opened
        raise ConfigError(f"{key}={path!r}: the dataset file main_data.hdf5 is damaged or truncated "
                          f"({type(e).__name__}: {(str(e).splitlines() or [''])[0]})") from None


def _check_through_minari(ds: Any, trees: Dict[str, Any], spaces: Dict[str, Any]) -> None:
    """:func:`check_contents` episode by episode through Minari (no columnar copy)."""
    numeric = [k for k, s in spaces.items() if _layout(s) is not None]
    with _h5(ds) as f:
        for ep, steps in _read_episodes(ds, range(int(ds.total_episodes)), f):
            leaves = episode_leaves(ep, trees, spaces, steps)
            check_steps({k: leaves[k] for k in numeric}, spaces, np.asarray([ep["id"]]),
                        np.asarray([len(leaves["rewards"])]))


# ---- the columnar copy ---------------------------------------------------------------------------
COLUMNS_DIR, COLUMNS_VERSION = "flowkit-columns", 2


class ColumnsUnsupported(ValueError):
    """The dataset's spaces have leaves that are not fixed-shape numeric arrays (e.g. Text):
    no columnar copy; read it through Minari."""


def untree(tree: Any, cols: Dict[str, np.ndarray]) -> Any:
    """The observations or actions of ``cols`` (by column name) as the tree of :func:`leaf_spaces`."""
    if isinstance(tree, str):
        return cols[tree]
    if "dict" in tree:
        return {k: untree(v, cols) for k, v in tree["dict"]}
    return tuple(untree(v, cols) for v in tree["tuple"])


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
    for datasets of similar episodes), atomically: a temporary folder renamed. Each episode is
    checked as it is read: its data against flowkit's checksums (:func:`verify_checksums`) and
    its layout against the spaces (:func:`episode_leaves`); a column takes the first episode's
    dtype (a later episode's is cast to it, ``same_kind``).

    Raises:
        ColumnsUnsupported: a space with leaves that are not numeric arrays (Text, Graph, ...).
        BadEpisode: see :func:`episode_leaves` and :func:`verify_checksums`.
    """
    n_eps, n_steps = int(ds.total_episodes), int(ds.total_steps)
    trees, spaces = step_spaces(ds.observation_space, ds.action_space)
    odd = [f"{k}: {s}" for k, s in spaces.items() if _layout(s) is None]
    if odd:
        raise ColumnsUnsupported(", ".join(odd))
    tmp = f"{folder}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    files: Dict[str, Any] = {}
    index: Dict[str, Any] = {"version": COLUMNS_VERSION, "trees": trees, "columns": {}}
    lengths, ids = np.zeros(n_eps, np.int64), np.zeros(n_eps, np.int64)
    try:
        with _h5(ds) as f:
            k = 0
            while k < n_eps:  # about chunk_steps steps at a time, by the mean length so far
                j = min(n_eps, k + (1 if k == 0 else max(1, int(chunk_steps * k / max(1, int(lengths[:k].sum()))))))
                for ep, steps in _read_episodes(ds, range(k, j), f):
                    leaves = episode_leaves(ep, trees, spaces, steps)
                    lengths[k], ids[k] = len(leaves["rewards"]), int(ep["id"])
                    if not files:  # the first episode fixes the columns' dtypes
                        _open_columns(tmp, leaves, n_eps, n_steps, files, index["columns"])
                    for name, a in leaves.items():
                        dt = np.dtype(index["columns"][name]["dtype"])
                        if not np.can_cast(a.dtype, dt, "same_kind"):
                            raise BadEpisode(f"episode {ep['id']}: {name} are {a.dtype} values, the first episode's {dt}")
                        files[name].write(np.ascontiguousarray(a, dt).tobytes())
                    k += 1
        if int(lengths.sum()) != n_steps:
            raise BadEpisode(f"{int(lengths.sum())} steps in the episodes, {n_steps} in metadata.json")
        np.save(os.path.join(tmp, "episodes.npy"), np.stack([ids, lengths]))
    except BaseException:
        for fh in files.values():
            fh.close()
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for fh in files.values():
        fh.close()
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


def _open_columns(tmp: str, leaves: Dict[str, np.ndarray], n_eps: int, n_steps: int, files: Dict[str, Any],
                  columns: Dict[str, Any]) -> None:
    """One ``.npy`` file per column in ``tmp``, its header sized for the whole dataset (an
    observation column holds one row more per episode), dtypes and row shapes of ``leaves``."""
    for i, (name, a) in enumerate(leaves.items()):
        rows = n_steps + n_eps if name.startswith("observations") else n_steps
        fh = files[name] = open(os.path.join(tmp, f"c{i}.npy"), "wb")
        _npy_header(fh, a.dtype, (rows, *a.shape[1:]))
        columns[name] = {"file": f"c{i}.npy", "dtype": a.dtype.str, "shape": list(a.shape[1:])}


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
        return {"observations": untree(trees["observations"], got),
                "next_observations": untree(trees["observations"], nxt),
                "actions": untree(trees["actions"], got), **{k: got[k] for k in STEP_KEYS},
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
    existing one with the same spaces), written in chunks of about ``FLUSH_STEPS`` transitions,
    each episode with the sha256 of its data (:func:`write_checksums`, verified by the reader).
    A write is not cut by a signal (held until it is done, then raised).

    Raises:
        ConfigError: ``path`` holds a dataset (without ``append``), its spaces differ, or the
            folder cannot be created.
    """

    def __init__(self, path: str, observation_space: Any, action_space: Any, append: bool = False,
                 env_spec: Any = None, metadata: Optional[Dict[str, Any]] = None, key: str = "out"):
        minari = _minari(key)
        from minari.dataset.minari_storage import MinariStorage
        self.path, self.key = path, key
        self.created: Optional[str] = None  # the top-most folder this writer made (removed if it writes nothing)
        d = os.path.join(path, "data")
        if os.path.exists(os.path.join(d, "metadata.json")):
            if not append:
                raise ConfigError(f"{key}={path!r}: a dataset is already there (append=true adds to it)")
            ds = open_dataset(path, key)
            check_spaces(ds, observation_space, action_space, path, "recorded", key)
            self.storage = ds.storage
        else:
            top = os.path.abspath(d)
            while not os.path.exists(os.path.dirname(top)) and os.path.dirname(top) != top:
                top = os.path.dirname(top)
            name = os.path.basename(os.path.normpath(path))
            try:
                os.makedirs(d, exist_ok=True)
                self.created = top
                self.storage = MinariStorage.new(os.path.abspath(d), observation_space=observation_space,
                                                 action_space=action_space, env_spec=env_spec, data_format="hdf5")
                self.storage.update_metadata({"dataset_id": name if _ID_RE.match(name) else f"{name}-v0",
                                              "minari_version": str(minari.__version__), **(metadata or {})})
            except OSError as e:
                raise ConfigError(f"{key}={path!r}: cannot create the dataset there ({type(e).__name__}: "
                                  f"{e.strerror or e})") from None
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
        """Write the pending episodes and their checksums (a signal that comes meanwhile is
        raised when they are written)."""
        from flowkit._guard import GUARD
        if self.pending:
            with GUARD.held():
                pending, self.pending, self.pending_steps = self.pending, [], 0  # (before a held signal is raised)
                first = int(self.storage.total_episodes)
                self.storage.update_episodes(pending)
                write_checksums(os.path.join(str(self.storage.data_path), "main_data.hdf5"),
                                range(first, int(self.storage.total_episodes)))

    def close(self) -> Tuple[int, int]:
        """:meth:`flush`; a dataset this writer created that holds no episode is removed (a
        rerun need not delete it). Returns the dataset's episodes and steps."""
        self.flush()
        n, steps = int(self.storage.total_episodes), int(self.storage.total_steps)
        if n == 0 and self.created is not None:
            shutil.rmtree(self.created, ignore_errors=True)
        return n, steps


@dataclass
class RecordArgs:
    """``flowkit record``: roll a saved policy out into a dataset (Minari format; pip install
    'flowkit[offline]'), for input.dataset=PATH. The fields are its ``key=value`` arguments."""
    episodes: Optional[int] = F(None, "record this many whole episodes (default 10 when steps is not given)", ge=1,
                                le=MAX_EPISODES)
    steps: Optional[int] = F(None, "record exactly this many transitions (episodes still running at the end are "
                                   "cut there, their last step flagged truncated)", ge=1, le=MAX_RECORD_STEPS)
    explore: str = F("greedy", "greedy: the policy's greedy action; sample: its sampled action; epsilon: greedy, "
                               "a uniformly random action with probability `epsilon`; random: random actions",
                     choices=("greedy", "sample", "epsilon", "random"))
    epsilon: float = F(0.1, "explore=epsilon: probability of a random action", ge=0, le=1)
    seed: Optional[int] = F(None, "episode i resets with seed + i; seeds the exploration (default: the run's seed)",
                            ge=0, le=2 ** 32 - 1)
    out: Optional[str] = F(None, "the dataset folder (default: RUN_DIR/datasets/<explore>-<N><episodes|steps>-"
                                 "seed<S>-v0)")
    append: bool = F(False, "add the episodes to the dataset already at `out` (same spaces)")
    num_envs: int = F(8, "sub-envs stepped together", ge=1, le=4096)


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

    A signal (SIGINT, SIGTERM, SIGHUP) or an error of the env stops the recording: the episodes
    that ended before it are written (a valid dataset; one this call created and that holds
    none is removed), then it is raised (a signal as :class:`flowkit._guard.Interrupted`, whose
    reason says what the dataset holds).

    Returns:
        ``{"path", "episodes", "steps", "return_mean", "returns"}`` (``returns``: per whole
        episode; cut episodes are left out of the mean).
    Raises:
        ConfigError: a bad argument, ``out`` holds a dataset (without ``append``) or cannot be
            made, or (``append``) the dataset there fails :func:`check_contents`.
    """
    from flowkit._guard import GUARD, Interrupted
    from flowkit.core import EnvContext, run_episodes
    from flowkit.core._envs import probe_env
    if episodes is None and steps is None:
        episodes = 10
    probe = probe_env(env_cfg, EnvContext(-1, 0, 1, 0, seed))
    obs_space, act_space = probe.observation_space, probe.action_space
    env_spec = getattr(probe, "spec", None) if env_cfg.get("id") else None
    probe.close()
    meta = {"flowkit_record": json.dumps({"explore": explore, "epsilon": epsilon, "seed": seed,
                                          "episodes": episodes, "steps": steps, **(metadata or {})})}
    if append and has_dataset(out):  # add to a sound dataset only
        check_contents(out, open_dataset(out, "out"), "out", columns=False)
    writer = DatasetWriter(out, obs_space, act_space, append, env_spec, meta)
    acting = _Explore(policy, act_space, explore, epsilon, seed)
    live: Dict[int, Dict[str, List[Any]]] = {}
    done_returns: List[float] = []
    total = 0

    def on_step(i: int, obs: Any, action: Any, next_obs: Any, r: float, term: bool, trunc: bool, info: Any) -> None:
        nonlocal total
        ep = live.setdefault(i, {"obs": [obs], "actions": [], "rewards": [], "term": [], "trunc": []})
        for k, v in zip(ep, (next_obs, action, float(r), bool(term), bool(trunc))):
            ep[k].append(v)
        total += 1
        if term or trunc:
            e = live.pop(i)
            done_returns.append(float(np.sum(e["rewards"])))
            writer.add(seed + i, e["obs"], e["actions"], e["rewards"], e["term"], e["trunc"])
        if steps is not None and total >= steps:
            raise _Full

    n_eps = episodes if episodes is not None else int(steps or 0)  # an episode has at least one step
    with GUARD.running():
        try:
            try:
                run_episodes(acting, env_cfg, n_eps, seed, False, num_envs, on_step=on_step)
            except _Full:
                for i in sorted(live):  # cut: the last step of each running episode is flagged truncated
                    e = live[i]
                    e["trunc"][-1] = True
                    writer.add(seed + i, e["obs"], e["actions"], e["rewards"], e["term"], e["trunc"])
        except BaseException as stop:  # a signal, the env failing: the episodes that ended are kept
            with GUARD.shielded():
                n, n_steps = writer.close()
            if isinstance(stop, KeyboardInterrupt):
                kept = (f"{out!r} holds {n} episodes, {n_steps} steps (the episodes that ended before it)" if n else
                        f"no episode had ended: nothing written ({out!r} removed)" if writer.created else
                        f"{out!r} is as it was")
                raise Interrupted(f"{getattr(stop, 'reason', None) or 'interrupted (SIGINT)'}; {kept}") from None
            raise
        with GUARD.shielded():
            writer.close()
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
        RunFolderError: no or an unreadable checkpoint at ``path``.
        ConfigError: a multi-agent run, a bad argument, ``out`` already holds a dataset, or
            ``out`` cannot be a folder (a file, under a file, not writable, a folder of other
            files: before any work).
    """
    from omegaconf import OmegaConf

    from flowkit.checkpoint import RunFolderError, find_checkpoint, load_trained
    from flowkit.core import derive_seed
    if episodes is not None and steps is not None:
        raise ConfigError(f"give episodes or steps, not both (episodes={episodes}, steps={steps})")
    if out is not None:
        check_folder(out, "out")
    try:
        ck = find_checkpoint(path)
    except FileNotFoundError as e:
        raise RunFolderError(str(e), damaged=False) from None
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
