"""The plain-data encoding of a checkpoint's contents: values and spaces.

:func:`to_plain` turns numpy arrays, numpy scalars and containers of plain values into what
``torch.save`` stores and ``torch.load(weights_only=True)`` reads back (a numpy array as
``{"__ndarray__": tensor}``), :func:`from_plain` undoes it, :func:`digest` hashes plain data
as stored, and :func:`space_to_dict` / :func:`space_from_dict` describe Gymnasium spaces as
plain data (bounded in size before anything is allocated). Nothing here knows of run folders,
policies or :class:`~flowkit.checkpoint.RunFolderError`: reading, writing, finding and
restoring checkpoints is :mod:`flowkit.checkpoint`, which re-exports the public names here
(import them from there). Imports nothing of flowkit.
"""
from __future__ import annotations

import hashlib
from collections import OrderedDict
from typing import Any, Dict, List

import gymnasium as gym
import numpy as np
import torch

_ND = "__ndarray__"
_PLAIN = (int, float, bool, str, type(None))


def to_plain(obj: Any, where: str = "state") -> Any:
    """``obj`` as plain data for ``torch.save``: numpy arrays become ``{"__ndarray__": tensor}``,
    numpy scalars Python numbers, tuples stay tuples.

    Raises:
        TypeError: anything else (a class instance, a set, a space), naming where it is
            (``state['stateful']['x']['buffer'][0]``).
    """
    plain = obj.item() if isinstance(obj, np.generic) else obj  # numpy first: np.float64 is a float
    if type(plain) in _PLAIN:
        return plain
    if isinstance(obj, torch.Tensor):
        return obj.detach()
    if isinstance(obj, np.ndarray):
        if obj.dtype.hasobject or obj.dtype.kind not in "biufc":
            raise TypeError(f"{where}: a numpy array of dtype {obj.dtype} cannot be stored in a checkpoint")
        a = np.ascontiguousarray(obj if obj.dtype.isnative else obj.astype(obj.dtype.newbyteorder("=")))
        a = a.reshape(obj.shape)  # ascontiguousarray makes a 0-d array 1-d
        return {_ND: torch.from_numpy(a if a.flags.writeable else a.copy())}
    if type(obj) in (list, tuple, torch.Size):
        out = [to_plain(v, f"{where}[{i}]") for i, v in enumerate(obj)]
        return out if type(obj) is list else tuple(out)
    if isinstance(obj, dict) and (type(obj) is dict or type(obj).__module__ == "collections"):
        out_d: Dict[Any, Any] = OrderedDict() if type(obj) is OrderedDict else {}
        for k, v in obj.items():
            if type(k) not in _PLAIN or k == _ND:
                raise TypeError(f"{where}: key {k!r} cannot be stored in a checkpoint")
            out_d[k] = to_plain(v, f"{where}[{k!r}]")
        return out_d
    raise TypeError(f"{where} is a {type(obj).__module__}.{type(obj).__qualname__}, not plain data "
                    "(tensors, numpy arrays, numbers, strings, None, lists/tuples/dicts of those): "
                    "get_state must return plain data")


def from_plain(obj: Any) -> Any:
    """The inverse of :func:`to_plain`: ``{"__ndarray__": tensor}`` back to numpy arrays."""
    if isinstance(obj, dict):
        if len(obj) == 1 and _ND in obj:
            return obj[_ND].numpy()
        return type(obj)((k, from_plain(v)) for k, v in obj.items())
    if isinstance(obj, (list, tuple)):
        return type(obj)(from_plain(v) for v in obj)
    return obj


def digest(obj: Any) -> str:
    """sha256 of plain data as stored (tensors by dtype, shape and bytes; numbers and strings
    by repr; containers in order): written with a checkpoint's ``policies`` and checked on
    load, so flipped bytes in a readable archive are found, not trained on or exported."""
    h = hashlib.sha256()

    def walk(o: Any) -> None:
        if isinstance(o, torch.Tensor):
            t = o.detach().cpu().contiguous().reshape(-1)
            h.update(f"T{t.dtype}{tuple(o.shape)}".encode())
            h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
        elif isinstance(o, dict):
            h.update(b"{")
            for k, v in o.items():
                h.update(repr(k).encode())
                walk(v)
            h.update(b"}")
        elif isinstance(o, (list, tuple)):
            h.update(b"[")
            for v in o:
                walk(v)
            h.update(b"]")
        else:
            h.update(repr(o).encode())
    walk(obj)
    return h.hexdigest()


def save_state(state: Dict[str, Any], path: str) -> None:
    """``torch.save`` of ``to_plain(state)`` (raises TypeError before writing anything)."""
    torch.save(to_plain(state), path)


_SPACE_ARGS = {"Box": ("low", "high", "shape", "dtype"), "Discrete": ("n", "start", "dtype"),
               "MultiDiscrete": ("nvec", "start", "dtype"), "MultiBinary": ("n",)}  # constructor keywords


def _arg_to_plain(v: Any) -> Any:  # a dtype by name, a shape (or MultiBinary's n) as a list, numpy ints as ints
    if isinstance(v, np.dtype):
        return v.name
    return list(v) if isinstance(v, tuple) else v.item() if isinstance(v, np.generic) else v


def _arg_from_plain(name: str, v: Any) -> Any:
    return np.dtype(v) if name == "dtype" else tuple(v) if isinstance(v, list) else v


def space_to_dict(space: gym.Space) -> Dict[str, Any]:
    """A plain description of a Box, Discrete, MultiDiscrete, MultiBinary, Dict or Tuple space
    (nested); Dict keeps its key order.

    Raises:
        TypeError: any other space.
    """
    kind = type(space).__name__
    if kind in _SPACE_ARGS and type(space) is getattr(gym.spaces, kind):
        return {"type": kind, **{a: _arg_to_plain(getattr(space, a)) for a in _SPACE_ARGS[kind]}}
    if type(space) is gym.spaces.Dict:
        return {"type": "Dict", "spaces": [[k, space_to_dict(v)] for k, v in space.spaces.items()]}
    if type(space) is gym.spaces.Tuple:
        return {"type": "Tuple", "spaces": [space_to_dict(v) for v in space.spaces]}
    raise TypeError(f"cannot store a {type(space).__module__}.{type(space).__name__} space in a checkpoint "
                    "(supported: Box, Discrete, MultiDiscrete, MultiBinary, Dict, Tuple)")


MAX_SPACE_SIZE = 2 ** 24  # elements of a space (and of its one-hot encoding) a checkpoint may describe


def _space_size(d: Any, depth: int = 0) -> int:
    """Elements a described space holds (Box, MultiBinary: its shape; Discrete: n, its one-hot
    size; MultiDiscrete: sum(nvec)), from the description alone, before anything is allocated.
    ValueError for a description that is not one."""
    if not isinstance(d, dict) or depth > 16:
        raise ValueError("a space description that is not a mapping (or nested deeper than 16)")
    kind = d.get("type")

    def ints(v: Any, what: str, lo: int) -> List[int]:
        vals = np.asarray(v).ravel().tolist() if isinstance(v, (np.ndarray, list, tuple)) else [v]
        if len(vals) > MAX_SPACE_SIZE or not all(type(x) is int and x >= lo for x in vals):
            raise ValueError(f"{kind} {what} {v if len(vals) < 8 else '[...]'!r}: ints >= {lo} expected")
        return vals
    if kind == "Box":
        return int(np.prod(ints(d.get("shape"), "shape", 0), dtype=object))
    if kind == "Discrete":
        return ints(d.get("n"), "n", 1)[0]
    if kind == "MultiDiscrete":
        return sum(ints(d.get("nvec"), "nvec", 1))
    if kind == "MultiBinary":
        return int(np.prod(ints(d.get("n"), "n", 0), dtype=object))
    if kind in ("Dict", "Tuple") and isinstance(d.get("spaces"), list):
        subs = [v[1] if kind == "Dict" and isinstance(v, (list, tuple)) and len(v) == 2 else v for v in d["spaces"]]
        return sum(_space_size(v, depth + 1) for v in subs)
    raise ValueError(f"unknown space type {kind!r}")


def space_from_dict(d: Dict[str, Any]) -> gym.Space:
    """The space :func:`space_to_dict` described.

    Raises:
        ValueError: an unknown ``type``, a malformed description, or a space of more than
            :data:`MAX_SPACE_SIZE` elements (checked before anything is allocated).
    """
    size = _space_size(d)
    if size > MAX_SPACE_SIZE:
        raise ValueError(f"a {d.get('type')} space of {size} elements (at most {MAX_SPACE_SIZE})")
    return _space(d)


def _space(d: Dict[str, Any]) -> gym.Space:
    kind = d.get("type")
    if kind in _SPACE_ARGS:
        return getattr(gym.spaces, kind)(**{a: _arg_from_plain(a, d[a]) for a in _SPACE_ARGS[kind]})
    if kind == "Dict":
        return gym.spaces.Dict([(k, _space(v)) for k, v in d["spaces"]], sort_keys=False)
    return gym.spaces.Tuple([_space(v) for v in d["spaces"]])
