"""Checkpoints are data: writing, finding, restoring and loading them.

A checkpoint is a folder ``<run>/checkpoints/<tag>/`` with two files:

- ``state.pt``: ``torch.save`` of plain data only -- tensors, numbers, strings, bools, None
  and lists, tuples and dicts of those -- read back with ``torch.load(weights_only=True)``,
  so loading a checkpoint never runs anything stored in it (a pickled object is refused
  with a :class:`RunFolderError` naming the file). numpy arrays are stored as a one-key
  dict ``{"__ndarray__": tensor}`` and come back as numpy arrays (:func:`to_plain`,
  :func:`from_plain`); ``get_state``/``set_state`` of policies, algorithms, stateful
  objects and plugins exchange plain data (numpy arrays included) and never objects.
- ``config.yaml``: the run's config with only the sections the run uses
  (:func:`config_yaml`); a missing section is filled with its defaults when loaded.

``state.pt`` (format 2)::

    format: 2
    iteration: int, time_total_s: float, counters: {name: int}
    policy_specs: {policy_id: {algo, algo_module, observation_space, action_space,
                               config, extra}}    # spaces: space_to_dict; config: a dict
    policies: {policy_id: Policy.get_state()}       # weights, optimizer, RNG states
    digests: {policies: sha256 of policies as stored}  # checked on load (digest())
    algorithms: {name: Algorithm.get_state()}
    stateful: {name: obj.get_state(include_replay=...)}  # replay buffers, learner threads
    plugins: {plugin name: flowkit_state_dict()}
    rng: {python, numpy, torch}, learner_rng: numpy bit-generator state
    windows: {episode, len, policy}, restart_counts: [int], num_restarts: int

Classes are named, never stored: a policy by the registered name of the algorithm that
trains it (``ppo``, ``random``), looked up in the plugin registry when loading. A
checkpoint whose algorithm is not registered fails with one line naming it and how to
register it. Callables named in ``config.yaml`` (``plugins=[...]``, ``env.factory``,
``model.class``) are imported only when an installed flowkit plugin provides them or the user
consents (:mod:`flowkit._trust`): installed code is trusted, the run folder is not.

The plain-data encoding of values and spaces (:func:`to_plain`, :func:`from_plain`,
:func:`digest`, :func:`space_to_dict`, :func:`space_from_dict`) is in
:mod:`flowkit._checkpoint_data`, re-exported here.
"""
from __future__ import annotations

import contextlib
import dataclasses
import inspect
import os
import random
import shutil
import tempfile
import warnings
import zipfile
from typing import Any, Dict, List, Mapping, Optional, Tuple

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

# The plain-data encoding of values and spaces lives in flowkit._checkpoint_data; its public
# names are importable from here (and listed in __all__), as before.
from flowkit._checkpoint_data import (  # noqa: F401 - MAX_SPACE_SIZE: re-exported
    MAX_SPACE_SIZE,
    digest,
    from_plain,
    save_state,
    space_from_dict,
    space_to_dict,
    to_plain,
)
from flowkit._trust import RunFolderError, UntrustedConfigError, check_config_callables, read_run_config
from flowkit.config import ConfigError, build_config, used_sections
from flowkit.core import PolicySpec, derive_seed
from flowkit.core.learner import NonFiniteError
from flowkit.hooks import get_plugin_manager
from flowkit.hooks.manager import Algorithms

FORMAT = 2
STATE_FILE = "state.pt"
_HOW_TO_REGISTER = ("register it before loading: install its package (entry-point group `flowkit`), "
                    "name its module in `plugins=[module]`, or call flowkit.register(plugin) in this process")


def _why(e: BaseException) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    found = (ln for ln in lines if "GLOBAL" in ln or ln.startswith("Unsupported"))
    return next(found, lines[-1] if lines else type(e).__name__)


def load_state(path: str) -> Dict[str, Any]:
    """Read a ``state.pt`` (format 2) with ``torch.load(weights_only=True)``: nothing in the
    file is executed. Numpy arrays come back as numpy arrays.

    Raises:
        RunFolderError: no such file, a corrupt or truncated file, a file that is not plain
            data (an old checkpoint or a pickle payload: refused, never run), or not format 2;
            the message names the file.
    """
    if os.path.isdir(path):
        path = os.path.join(path, STATE_FILE)
    try:  # a torch archive is a zip: one cut short lost its central directory (torch would try it as a pickle)
        with open(path, "rb") as f:
            head = f.read(4)
        if head == b"PK\x03\x04"[:len(head)] and not zipfile.is_zipfile(path):  # empty, or a zip cut short
            raise RunFolderError(f"checkpoint file {path!r} is corrupt or truncated ({os.path.getsize(path)} bytes, "
                                 "not a complete checkpoint archive; nothing in it was run)")
    except OSError:
        pass  # torch.load below names it
    try:
        st = torch.load(path, weights_only=True, map_location="cpu")
    except FileNotFoundError:
        raise RunFolderError(f"checkpoint file {path!r} does not exist", damaged=False) from None
    except RuntimeError as e:  # not a torch zip archive: cut short (a crash mid-copy), or another file
        raise RunFolderError(f"checkpoint file {path!r} is corrupt or truncated (not a complete checkpoint "
                             f"archive; nothing in it was run): {_why(e)}") from None
    except IsADirectoryError:
        raise RunFolderError(f"checkpoint file {path!r} is a folder, not a file") from None
    except Exception as e:
        raise RunFolderError(f"checkpoint file {path!r} was refused: it holds pickled objects, not plain data "
                             f"(a checkpoint written before format {FORMAT}, or not a flowkit checkpoint); "
                             f"nothing in it was run ({_why(e)})") from None
    if not isinstance(st, dict) or st.get("format") != FORMAT:
        got = st.get("format") if isinstance(st, dict) else type(st).__name__
        raise RunFolderError(f"checkpoint file {path!r} is in format {got!r}, not {FORMAT}: checkpoints written "
                             "before flowkit stored plain data cannot be loaded; train again")
    if "policy_specs" in st or "policies" in st or "iteration" in st:  # a run's checkpoint: its layout checked
        check_layout(st, path)
    want = (st.get("digests") or {}).get("policies") if isinstance(st.get("digests"), dict) else None
    if want is not None and digest(st["policies"]) != want:  # (checkpoints written before digests: none)
        raise RunFolderError(f"checkpoint file {path!r} is damaged: its policies do not match the digest written "
                             "with them (flipped bytes?); use an earlier checkpoint")
    return from_plain(st)


def check_layout(st: Dict[str, Any], path: str) -> None:
    """The keys every run checkpoint has, with the right types: ``iteration`` an int >= 0,
    ``counters`` ints, ``policy_specs`` and ``policies`` mappings over the same policy ids,
    each spec naming its algorithm and spaces.

    Raises:
        RunFolderError: the first key missing or of the wrong type (the file named; damaged).
    """
    def bad(what: str) -> RunFolderError:
        return RunFolderError(f"checkpoint file {path!r} is damaged: {what}")
    it = st.get("iteration")
    if type(it) is not int or it < 0:
        raise bad(f"`iteration` is {it!r}, not an int >= 0")
    for key in ("counters", "policy_specs", "policies"):
        if not isinstance(st.get(key), dict):
            raise bad(f"`{key}` is {'missing' if key not in st else type(st[key]).__name__ + ', not a mapping'}")
    if not all(type(v) is int for v in st["counters"].values()):
        raise bad("`counters` holds a value that is not an int")
    if set(st["policy_specs"]) != set(st["policies"]):
        raise bad(f"`policies` ({', '.join(map(str, st['policies'])) or 'none'}) and `policy_specs` "
                  f"({', '.join(map(str, st['policy_specs'])) or 'none'}) name different policies")
    for pid, d in st["policy_specs"].items():
        if not (isinstance(d, dict) and isinstance(d.get("algo"), str) and isinstance(d.get("observation_space"), dict)
                and isinstance(d.get("action_space"), dict)):
            raise bad(f"`policy_specs.{pid}` does not name its algorithm and spaces")
        if not isinstance(st["policies"][pid], dict):
            raise bad(f"`policies.{pid}` is not a mapping")


def check_policy_states(st: Dict[str, Any], path: str) -> None:
    """Every policy's weights in ``st`` (loaded) are finite numeric arrays (NaN or inf weights, as a
    diverged run or flipped bytes leave them, are never evaluated, exported or trained on).

    Raises:
        RunFolderError: naming the file, the policy and the weight (damaged).
    """
    for pid, pst in st["policies"].items():
        for name, w in (pst.get("weights") or {}).items() if isinstance(pst.get("weights"), dict) else ():
            a = np.asarray(w) if isinstance(w, np.ndarray) else None
            if a is None or a.dtype.kind not in "biuf":
                raise RunFolderError(f"checkpoint file {path!r} is damaged: policy {pid!r} weight {name!r} is "
                                     f"{type(w).__name__}, not a numeric array")
            if a.dtype.kind == "f" and not np.isfinite(a).all():
                raise RunFolderError(f"checkpoint file {path!r} is damaged: policy {pid!r} weight {name!r} holds "
                                     f"{int((~np.isfinite(a)).sum())} non-finite values (NaN or inf)")


_SPEC_FIELDS = {f.name for f in dataclasses.fields(PolicySpec)}


def spec_to_dict(spec: PolicySpec, algo_cls: Optional[type] = None) -> Dict[str, Any]:
    """A policy spec as plain data: its algorithm by registered name (``algo_module``, where
    the algorithm class was defined, only for error messages), spaces described, the config
    dataclass as a dict, its own ``model.*`` (or None), and the fields of PolicySpec subclasses (``extra``; ``init_state``,
    weights loaded from another checkpoint, is left out)."""
    conf = spec.config
    if dataclasses.is_dataclass(conf) and not isinstance(conf, type):
        conf = dataclasses.asdict(conf)
    elif isinstance(conf, DictConfig):
        conf = OmegaConf.to_container(conf, resolve=True)
    extra = {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)
             if f.name not in _SPEC_FIELDS and f.name != "init_state"}
    return {"algo": spec.algo, "algo_module": getattr(algo_cls, "__module__", None),
            "observation_space": space_to_dict(spec.observation_space),
            "action_space": space_to_dict(spec.action_space), "config": conf, "extra": extra,
            "model": None if spec.model is None else OmegaConf.to_container(spec.model, resolve=True)}


def missing_algorithm(name: str, path: str, module: Optional[str], registered: Any) -> RunFolderError:
    """The one-line error for a checkpoint naming an algorithm that is not registered."""
    where = f" (it was defined in module `{module}`)" if module else ""
    return RunFolderError(f"checkpoint {path!r} needs algorithm {name!r}{where}, which is not registered "
                          f"here (registered: {', '.join(sorted(registered))}); {_HOW_TO_REGISTER}", damaged=False)


def check_algorithms(state: Dict[str, Any], algorithms: Mapping[str, type], path: str,
                     extra: Tuple[str, ...] = ()) -> None:
    """Raise :func:`missing_algorithm` for the first algorithm of ``state`` (or ``extra``)
    not in ``algorithms``."""
    need = [(d["algo"], d.get("algo_module")) for d in state["policy_specs"].values()]
    for name, module in need + [(n, None) for n in extra]:
        if name not in algorithms:
            raise missing_algorithm(name, path, module, algorithms)


def spec_from_dict(d: Dict[str, Any], algorithms: Mapping[str, type], path: str = "?") -> PolicySpec:
    """The :class:`PolicySpec` of :func:`spec_to_dict`, its policy class that of the registered
    algorithm named ``d["algo"]`` (``extra`` fields are not restored).

    Raises:
        RunFolderError: the algorithm is not registered, or its config no longer fits.
    """
    name = d["algo"]
    cls: Any = algorithms.get(name)
    if cls is None:
        raise missing_algorithm(name, path, d.get("algo_module"), algorithms)
    conf = d.get("config")
    cfg_cls = getattr(cls, "config_class", None)
    if cfg_cls is not None and conf is not None:
        try:
            conf = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(cfg_cls), conf))
        except Exception as e:
            raise RunFolderError(f"checkpoint {path!r}: the {name!r} config it stores does not fit the installed "
                                 f"algorithm: {type(e).__name__}: {str(e).splitlines()[0]}", damaged=False) from None
    model = None
    try:
        if d.get("model") is not None:  # a multi-agent policy's own model.*
            from flowkit.config import ModelConfig
            model = OmegaConf.merge(OmegaConf.structured(ModelConfig), d["model"])
        spaces = [space_from_dict(d[k]) for k in ("observation_space", "action_space")]
    except Exception as e:  # a space gymnasium refuses (negative n, bounds of the wrong shape), a bad model.*
        raise RunFolderError(f"checkpoint {path!r} is damaged: the {name!r} policy spec it stores cannot be built: "
                             f"{type(e).__name__}: {(str(e).splitlines() or [''])[0]}") from None
    return PolicySpec(cls.policy_class, spaces[0], spaces[1], conf, name, model)


def config_yaml(cfg: DictConfig, specs: Dict[str, PolicySpec], pm: Any) -> str:
    """The text of a run's or checkpoint's ``config.yaml``: ``cfg`` with the core sections, the
    sections of the algorithms that train or act for a policy, and plugin sections that differ
    from their defaults or whose plugin made the policy specs (``multiagent``); other
    algorithms' sections are left out."""
    algos, plugins = {s.algo for s in specs.values()}, {type(s).__module__.split(".")[0] for s in specs.values()}
    return OmegaConf.to_yaml(OmegaConf.create(used_sections(cfg, algos, pm, plugins)))


def _takes_kw(fn, name: str) -> bool:
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def checkpoint_state(ctx: Any) -> Dict[str, Any]:
    """Everything exact resume needs, as plain data (numpy arrays not yet converted)."""
    include_replay = bool(ctx.config.checkpoint.include_replay)
    registry = ctx.pm.algorithms()
    return {
        "format": FORMAT, "iteration": ctx.iteration, "time_total_s": ctx.time_total_s, "counters": dict(ctx.counters),
        "policy_specs": {pid: spec_to_dict(s, registry.get(s.algo)) for pid, s in ctx.policy_specs.items()},
        "policies": ctx.policy_states(),
        "algorithms": {n: a.get_state() for n, a in ctx.algorithms.items()},
        "stateful": {n: (o.get_state(include_replay=include_replay) if _takes_kw(o.get_state, "include_replay")
                         else o.get_state()) for n, o in ctx.stateful.items() if hasattr(o, "get_state")},
        "plugins": ctx.pm.state_dict(),
        "rng": {"python": random.getstate(), "numpy": np.random.get_state(legacy=False),
                "torch": torch.get_rng_state()}, "learner_rng": ctx.rng.bit_generator.state,
        "windows": {"episode": list(ctx.metrics.episode_window), "len": list(ctx.metrics.len_window),
                    "policy": {k: list(v) for k, v in ctx.metrics.policy_windows.items()}},
        "restart_counts": list(ctx.workers.restart_counts), "num_restarts": ctx.workers.num_restarts,
    }


def save_checkpoint(ctx: Any, run_dir: str, tag: Optional[str] = None) -> str:
    """Write ``checkpoints/<tag>/{state.pt,config.yaml}`` atomically (temp folder, fsync,
    rename) and keep the newest ``checkpoint.keep``. Returns the folder.

    Raises:
        NonFiniteError: a policy's weights are not finite (nothing written).
        TypeError: a ``get_state`` returned something that is not plain data (named).
        OSError: the files could not be written (disk full, permissions): the message names
            the folder; the previous checkpoints are kept and no temp folder is left.
    """
    ck_root = os.path.join(run_dir, "checkpoints")
    os.makedirs(ck_root, exist_ok=True)
    tag = tag or f"iter_{ctx.iteration:06d}"
    final = os.path.join(ck_root, tag)
    state = checkpoint_state(ctx)
    for pid, st in state["policies"].items():  # never NaN weights over good ones
        if not all(np.isfinite(w).all() for w in (st.get("weights") or {}).values()):
            raise NonFiniteError(f"policy {pid!r} has non-finite weights: checkpoint {final!r} not written")
    plain, text = to_plain(state), config_yaml(ctx.config, ctx.policy_specs, ctx.pm)
    plain["digests"] = {"policies": digest(plain["policies"])}
    tmp = tempfile.mkdtemp(prefix=".tmp-", dir=ck_root)
    try:
        torch.save(plain, os.path.join(tmp, STATE_FILE))
        with open(os.path.join(tmp, "config.yaml"), "w") as f:
            f.write(text)
        for name in os.listdir(tmp):
            with open(os.path.join(tmp, name), "rb") as f:
                os.fsync(f.fileno())
    except (OSError, RuntimeError) as e:  # torch reports a full disk as a RuntimeError
        shutil.rmtree(tmp, ignore_errors=True)
        msg = (f"cannot write checkpoint {final!r} ({shutil.disk_usage(ck_root).free} bytes free on that disk; "
               f"earlier checkpoints are kept): {type(e).__name__}: {(str(e).splitlines() or [''])[0]}")
        errno = getattr(e, "errno", None)
        raise (OSError(errno, msg) if errno is not None else OSError(msg)) from e
    if os.path.exists(final):  # same tag again: move the old one aside, then swap
        os.replace(final, os.path.join(tempfile.mkdtemp(prefix=".tmp-old-", dir=ck_root), tag))
    os.replace(tmp, final)
    for stale in os.listdir(ck_root):  # left by a process killed while saving, or moved aside
        if stale.startswith(".tmp-"):
            shutil.rmtree(os.path.join(ck_root, stale), ignore_errors=True)
    keep = int(ctx.config.checkpoint.keep)
    cks = sorted(d for d in os.listdir(ck_root) if d.startswith("iter_") and os.path.isfile(os.path.join(ck_root, d, STATE_FILE)))
    for old_ck in cks[:-keep] if keep > 0 else []:
        if os.path.join(ck_root, old_ck) != final:
            prune_checkpoint(os.path.join(ck_root, old_ck))
    ctx.pm.hook.flowkit_on_checkpoint(path=final, ctx=ctx)
    return final


EVALUATE_OUTPUTS = ("evaluation.json", "videos")  # what `flowkit evaluate` adds to a checkpoint's folder


def prune_checkpoint(folder: str) -> None:
    """Remove a checkpoint that ``checkpoint.keep`` no longer keeps: its own files go, what
    ``flowkit evaluate`` wrote into its folder (:data:`EVALUATE_OUTPUTS`, perhaps by an
    evaluation still running beside the run) stays, and the folder goes once it is empty.
    Without a state file the folder is no checkpoint (:func:`find_checkpoint` skips it)."""
    with contextlib.suppress(OSError):
        for name in sorted(os.listdir(folder), key=lambda n: n != STATE_FILE):  # the state file first
            if name not in EVALUATE_OUTPUTS:
                p = os.path.join(folder, name)
                shutil.rmtree(p, ignore_errors=True) if os.path.isdir(p) else os.remove(p)
        os.rmdir(folder)


def remove_stale_temp(run_dir: str) -> List[str]:
    """Remove what a process killed while writing left in a run folder it held: the
    ``checkpoints/.tmp-*`` folders of :func:`save_checkpoint`, ``metrics.csv.tmp`` and the
    temporary files of :func:`flowkit._outputs.write_atomic` (``.config.yaml.tmp-PID``, ``.result.json.tmp-PID``). Called
    by a run once it holds the folder's lock (so no live writer owns them). Returns what went."""
    ck_root = os.path.join(run_dir, "checkpoints")
    gone = [os.path.join(ck_root, n) for n in (os.listdir(ck_root) if os.path.isdir(ck_root) else [])
            if n.startswith(".tmp-")]
    gone += [os.path.join(run_dir, n) for n in os.listdir(run_dir)
             if n == "metrics.csv.tmp" or n.startswith((".config.yaml.tmp-", ".result.json.tmp-"))]
    for p in gone:
        shutil.rmtree(p, ignore_errors=True) if os.path.isdir(p) else os.remove(p)
    return gone


def find_checkpoint(path: str) -> str:
    """A checkpoint folder from a run folder (its newest readable one by iteration; an
    unreadable one is skipped with a warning naming it), a checkpoint folder or a state.pt.

    Raises:
        FileNotFoundError: no checkpoint at ``path``.
        RunFolderError: no checkpoint of a run folder can be read safely (the newest named).
    """
    if os.path.isfile(path) and path.endswith(STATE_FILE):
        return os.path.dirname(path)
    if os.path.isfile(os.path.join(path, STATE_FILE)):
        return path
    ck_root = os.path.join(path, "checkpoints")
    if os.path.isdir(ck_root):
        cands = sorted(d for d in os.listdir(ck_root)
                       if not d.startswith(".") and os.path.isfile(os.path.join(ck_root, d, STATE_FILE)))
        keys: Dict[str, Tuple[int, bool]] = {}
        errors: List[RunFolderError] = []
        for d in cands:  # "final" and iter_* both count; the newest by iteration inside wins
            try:
                keys[d] = (int(load_state(os.path.join(ck_root, d, STATE_FILE))["iteration"]), d == "final")
            except RunFolderError as e:
                errors.append(e)
        if keys:
            for err in errors:
                warnings.warn(f"skipped an unreadable checkpoint: {err}", stacklevel=2)
            return os.path.join(ck_root, max(keys, key=keys.__getitem__))
        if errors:
            raise errors[-1]
    raise FileNotFoundError(f"no checkpoint at {path!r} (expected a run folder with checkpoints/, "
                            "a checkpoint folder or a state.pt)")


def restore(ctx: Any, ck_dir: str) -> None:
    """Load a checkpoint into a freshly set-up context (before the workers start).

    Raises:
        RunFolderError: unreadable, a policy trained by another algorithm in this run, or a
            saved state that does not fit (a changed env or model: the mismatch named).
    """
    st = load_state(path := os.path.join(ck_dir, STATE_FILE))
    check_policy_states(st, path)
    if missing := [pid for pid in ctx.policies if pid not in st["policies"]]:
        raise RunFolderError(f"checkpoint file {path!r} is damaged: it holds no state for polic"
                             f"{'ies' if len(missing) > 1 else 'y'} {', '.join(map(repr, missing))} of this run "
                             "(resuming would start it from fresh weights)")
    for pid, d in st["policy_specs"].items():
        if (mine := ctx.policy_specs.get(pid)) is not None and mine.algo != d["algo"]:
            raise RunFolderError(f"checkpoint {path!r}: policy {pid!r} was trained by {d['algo']!r}, "
                                 f"this run uses {mine.algo!r}", damaged=False)
    for key, objs in (("policies", ctx.policies), ("algorithms", ctx.algorithms), ("stateful", ctx.stateful)):
        for n, s in st.get(key, {}).items():
            try:
                objs[n].set_state(s) if n in objs else None
            except (RuntimeError, ValueError, KeyError) as e:  # e.g. load_state_dict's size mismatch
                raise RunFolderError(f"checkpoint {path!r}: the saved state of {n!r} ({key}) does not fit this "
                                     f"run (a changed env, model or algorithm setting?): {_why(e)}", damaged=False) from None
    ctx.pm.load_state_dict(st.get("plugins", {}))
    ctx.counters.update(st["counters"])
    ctx.iteration = int(st["iteration"])
    ctx._time_offset = float(st.get("time_total_s", 0.0))
    py = st["rng"]["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    np.random.set_state(st["rng"]["numpy"])
    torch.set_rng_state(st["rng"]["torch"])
    ctx.rng.bit_generator.state = st["learner_rng"]
    w = st.get("windows", {})
    ctx.metrics.episode_window.extend(w.get("episode", []))
    ctx.metrics.len_window.extend(w.get("len", []))
    for k, v in w.get("policy", {}).items():
        ctx.metrics.policy_windows[k].extend(v)
    rcs, n = list(st.get("restart_counts", [])), ctx.workers.num_workers
    ctx.workers.restart_counts = [rc + 1 for rc in rcs][:n] + [0] * max(0, n - len(rcs))
    ctx.workers.num_restarts = int(st.get("num_restarts", 0))


def resume_config(user: Any, resume: str, pm: Any, trust_config: bool = False) -> Tuple[str, DictConfig, Any, int]:
    """For ``resume=PATH``: ``(checkpoint folder, config, plugin manager, iteration)``; the
    config is the checkpoint's ``config.yaml`` with the user's overrides (``resume`` aside)
    on top, the plugin manager also loads the ``plugins`` that config names -- once the
    user consented to its callables (``trust_config``, or the same keys given in ``user``;
    see :mod:`flowkit._trust`).

    Raises:
        RunFolderError: no or an unreadable checkpoint, or an algorithm it needs is not
            registered.
        RunFolderError: its config.yaml is missing, not plain YAML or holds an interpolation.
        UntrustedConfigError: it names a callable the user did not consent to (nothing imported).
        ConfigError: the overrides change ``env.id``, ``env.factory`` or ``env.preset`` (even
            where the spaces match: HalfCheetah-v5 on a Walker2d-v5 run would mix two envs' curves).
    """
    from flowkit.config import _as_source
    try:
        ck = find_checkpoint(resume)
    except FileNotFoundError as e:
        raise RunFolderError(f"resume: {e}", damaged=False) from None
    st = load_state(os.path.join(ck, STATE_FILE))
    saved = read_run_config(ck)
    check_run_algorithm(ck, saved)
    over, _ = _as_source(user)
    over.pop("resume", None)
    check_config_callables(saved, os.path.join(ck, "config.yaml"), trust_config, over)
    merged: Any = OmegaConf.merge(OmegaConf.create(saved), OmegaConf.create(over))
    for key in ("env.id", "env.factory", "env.preset"):  # a run's rows and checkpoints are one env's
        was, now = OmegaConf.select(OmegaConf.create(saved), key), OmegaConf.select(merged, key)
        if was != now:
            raise ConfigError(f"resume: {key}={now!r} is not the run's {key}={was!r} ({ck}/config.yaml): a run goes "
                              "on with the env it started with (its metrics.csv and checkpoints are that env's); "
                              "train a new run for another env")
    pm.load_modules(merged.get("plugins") or [], f"`plugins` in {ck}/config.yaml")  # installed code
    pm.check_hooks()
    check_algorithms(st, pm.algorithms(), os.path.join(ck, STATE_FILE), (str(merged.algo),))
    cfg = build_config(OmegaConf.to_container(merged, resolve=True), None, pm.config_sections())
    return ck, cfg, pm, int(st["iteration"])


def check_spec_callables(state: Dict[str, Any], path: str, trust: bool = False, allowed: Any = ()) -> None:
    """:func:`~flowkit._trust.check_config_callables` for the ``model`` and ``config`` each
    policy spec of a loaded ``state`` stores (a policy's own ``model.class``)."""
    specs: Dict[str, Any] = state["policy_specs"] if isinstance(state.get("policy_specs"), dict) else {}
    check_config_callables({"policy_specs": {pid: {"model": d.get("model"), "config": d.get("config")}
                                             for pid, d in specs.items() if isinstance(d, dict)}},
                           path, trust, allowed=allowed)


def check_run_algorithm(ck: str, saved: Dict[str, Any]) -> None:
    """A checkpoint folder of a run folder (``<run>/checkpoints/<tag>``) names the run's
    ``algo``: a checkpoint copied in from another run (a DQN one among PPO's) is refused.

    Raises:
        RunFolderError: naming both config files and both algorithms (damaged).
    """
    run_dir = os.path.dirname(os.path.dirname(os.path.abspath(ck)))
    run_cfg = os.path.join(run_dir, "config.yaml")
    if os.path.basename(os.path.dirname(os.path.abspath(ck))) != "checkpoints" or not os.path.isfile(run_cfg):
        return
    theirs = read_run_config(run_cfg).get("algo")
    if theirs is not None and saved.get("algo") is not None and theirs != saved["algo"]:
        raise RunFolderError(f"checkpoint {ck!r} does not belong to its run folder: its config.yaml says "
                             f"algo={saved['algo']!r}, the run's {run_cfg} says algo={theirs!r}")


def check_same_algorithm(st: Dict[str, Any], cfg: Any, path: str) -> None:
    """The algorithm each policy of ``st`` names is the one the run's config gives it
    (``algo``, or ``multiagent.policies.<id>.algo`` where set): a checkpoint of another run
    (a DQN state.pt in a PPO run folder) is refused, never loaded as it.

    Raises:
        RunFolderError: naming the file, the policy and both algorithms (damaged).
    """
    pols = OmegaConf.select(cfg, "multiagent.policies", default=None) or {}
    specs = st["policy_specs"]
    for pid, d in specs.items():
        given = pols.get(pid) if hasattr(pols, "get") else None
        want = given.get("algo") if given is not None and hasattr(given, "get") else None
        if want is None and not pols and len(specs) == 1:
            want = str(cfg.algo)  # a single-agent run
        if want is not None and d["algo"] != want:
            raise RunFolderError(f"checkpoint file {path!r} does not belong to this run: policy {pid!r} was trained "
                                 f"by {d['algo']!r}, the run's config.yaml says {want!r}")


def load_trained(path: str, expected_cls: Optional[type] = None, trust_config: bool = False) -> Any:
    """See :meth:`Algorithm.from_checkpoint`: the algorithm of ``config.yaml`` (or
    ``expected_cls``, which then need not be registered) with every policy of the checkpoint
    rebuilt from its algorithm's registered policy class and restored. Starts no worker.
    The callables its config and policy specs name (``env.factory``, ``model.class``,
    ``plugins``) must come from installed flowkit plugins unless ``trust_config``
    (:mod:`flowkit._trust`); nothing is imported before that check.

    Raises:
        FileNotFoundError: no checkpoint at ``path``.
        RunFolderError: unreadable, or an algorithm it needs is not registered (one line).
        RunFolderError: its config.yaml is missing, not plain YAML or holds an interpolation.
        UntrustedConfigError: a callable named without consent (key and callable named).
    """
    ck = find_checkpoint(path)
    st = load_state(state_path := os.path.join(ck, STATE_FILE))
    saved = read_run_config(ck)
    check_run_algorithm(ck, saved)
    check_config_callables(saved, os.path.join(ck, "config.yaml"), trust_config)
    check_spec_callables(st, state_path, trust_config)
    cfg_yaml: Any = OmegaConf.create(saved)
    pm = get_plugin_manager(list(cfg_yaml.get("plugins") or []))
    exp: Any = expected_cls
    algos: Any = Algorithms({**pm.algorithms(load=False), **({exp.name: exp} if exp is not None else {})})
    sections = pm.config_sections()
    if getattr(exp, "config_class", None) is not None:
        sections.setdefault(exp.name, exp.config_class)
    check_algorithms(st, algos, state_path, () if exp is not None else (str(cfg_yaml.algo),))
    try:
        cfg = build_config(OmegaConf.to_container(cfg_yaml, resolve=True), None, sections)
    except ConfigError as e:  # an unknown key or a wrong type in the folder's file, not in anything the user gave
        raise RunFolderError(f"{os.path.join(ck, 'config.yaml')}: {e}") from None
    check_same_algorithm(st, cfg, state_path)
    check_policy_states(st, state_path)
    algo = (expected_cls or algos[cfg.algo])(cfg)
    for pid, d in st["policy_specs"].items():
        spec = spec_from_dict(d, algos, state_path)
        try:
            algo.policies[pid] = pol = spec.policy_class(spec.observation_space, spec.action_space, spec.config,
                                                         spec.model_config(cfg), "cpu", derive_seed(int(cfg.seed), "learner", pid))
            pol.set_state(st["policies"][pid])
        except (RuntimeError, ValueError, KeyError, TypeError) as e:  # e.g. load_state_dict's size mismatch
            raise RunFolderError(f"checkpoint {state_path!r} is damaged: the saved state of policy {pid!r} does not "
                                 f"fit the network its spec and config.yaml describe: {_why(e)}") from None
    algo.checkpoint_state = st
    return algo


__all__ = ["FORMAT", "RunFolderError", "STATE_FILE", "UntrustedConfigError", "check_algorithms",
           "check_config_callables", "check_spec_callables", "digest", "read_run_config", "config_yaml", "find_checkpoint",
           "from_plain", "load_state", "load_trained", "missing_algorithm", "remove_stale_temp", "restore",
           "resume_config", "save_checkpoint", "save_state", "space_from_dict", "space_to_dict", "spec_from_dict",
           "spec_to_dict", "to_plain"]
