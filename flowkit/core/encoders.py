"""Observation encoding by space (:class:`ObsEncoder`).

Box (1-D or any shape that is not image-like) -> flattened float32; Box of shape (H, W, C) or
(C, H, W) with C <= 4 -> image (C, H, W) for a CNN: a uint8 image stays uint8 (1 byte a pixel on
the wire and in replay; the CNN scales it to [0, 1] on the learner's device, see
:class:`~flowkit.core.SmallCNN`), other dtypes become float32;
Discrete(n) -> one-hot n; MultiDiscrete(nvec) -> concatenated one-hots; MultiBinary(n) -> n
floats; Dict / Tuple -> their parts encoded and concatenated in the space's key order, with
``action_mask`` taken out and returned as the action mask.
"""
from __future__ import annotations

from typing import Any, List, Optional, Tuple

import gymnasium as gym
import numpy as np

__all__ = ["MASK_KEY", "NumpyOps", "ObsEncoder", "SpaceError", "add_batch_axis", "batch_len"]

MASK_KEY = "action_mask"


class SpaceError(ValueError):
    """A space flowkit cannot handle, or a value outside its space."""


class NumpyOps:
    """The array operations :meth:`ObsEncoder.encode` and ``ActionDist.to_env`` are written in,
    in numpy (``x``: one raw leaf with a leading batch axis of ``b``); ``flowkit.export.TorchOps``
    has the same in torch ops, so the exported module traces the workers' code."""

    @staticmethod
    def flat(x: Any, b: int) -> np.ndarray:  # -> float32[b, -1]
        return np.asarray(x, dtype=np.float32).reshape(b, -1)

    @staticmethod
    def ints(x: Any, b: int) -> np.ndarray:  # -> int64[b, -1]
        return np.asarray(x, dtype=np.int64).reshape(b, -1)

    @staticmethod
    def one_hot(i: np.ndarray, n: int) -> np.ndarray:  # int64[b] in [0, n) -> float32[b, n]
        out = np.zeros((len(i), n), np.float32)
        out[np.arange(len(i)), i] = 1.0
        return out

    @staticmethod
    def cat(parts: List[np.ndarray]) -> np.ndarray:  # along axis 1
        return np.concatenate(parts, axis=1)

    @staticmethod
    def cast(x: np.ndarray, dtype: Any) -> np.ndarray:  # no copy when x has that dtype
        return x.astype(dtype, copy=False)

    @staticmethod
    def const(a: np.ndarray) -> np.ndarray:  # a constant array, in this namespace's array type
        return a

    clip, rint = staticmethod(np.clip), staticmethod(np.rint)

    @staticmethod
    def image(x: Any, b: int, shape: Tuple[int, ...], transpose: bool, dtype: Any) -> np.ndarray:
        """``dtype[b, C, H, W]`` (contiguous) from ``x[b, *shape]``, (H, W, C) transposed; uint8
        stays uint8 (the network scales it on its device)."""
        x = np.asarray(x, dtype=dtype).reshape(b, *shape)
        return np.ascontiguousarray(x.transpose(0, 3, 1, 2) if transpose else x)


class ObsEncoder:
    """Turns batched raw observations into ``float32[B, *shape]`` (``uint8[B, C, H, W]`` for
    uint8 images) plus an optional ``int8[B, n]`` action mask.

    Attributes:
        shape: the encoded shape per observation; ``(D,)`` or ``(C, H, W)`` for images.
        dtype: the encoded dtype: uint8 for uint8 images, else float32.
        is_image: whether the encoded observation goes through a CNN.
        has_mask: whether observations carry an ``action_mask`` (Dict spaces only).
    """

    shape: Tuple[int, ...]

    def __init__(self, space: gym.Space):
        self.space = space
        self.has_mask = isinstance(space, gym.spaces.Dict) and MASK_KEY in space.spaces
        self.is_image = self._transpose = False
        if isinstance(space, gym.spaces.Box) and len(space.shape) == 3:
            h, w, c = space.shape
            if c <= 4 < min(h, w):
                self.is_image, self._transpose, self.shape = True, True, (c, h, w)
            elif space.shape[0] <= 4 < min(space.shape[1:]):
                self.is_image, self.shape = True, tuple(space.shape)
        self.dtype: np.dtype = np.dtype(np.uint8 if self.is_image and space.dtype == np.uint8 else np.float32)
        if not self.is_image:
            self.shape = (self._flat_size(space),)
        self.fast_box = isinstance(space, gym.spaces.Box) and not self.is_image

    def _flat_size(self, s: gym.Space) -> int:
        if isinstance(s, (gym.spaces.Box, gym.spaces.MultiBinary, gym.spaces.Discrete, gym.spaces.MultiDiscrete)):
            return gym.spaces.flatdim(s)  # the one-hot width of Discrete / MultiDiscrete
        if isinstance(s, gym.spaces.Dict):
            return sum(self._flat_size(v) for k, v in s.spaces.items() if k != MASK_KEY)
        if isinstance(s, gym.spaces.Tuple):
            return sum(self._flat_size(v) for v in s.spaces)
        raise SpaceError(f"observation space {s} is not supported "
                         "(Box, Discrete, MultiDiscrete, MultiBinary, Dict, Tuple are)")

    def _encode(self, s: gym.Space, x: Any, b: int, ops: Any) -> List[Any]:
        if isinstance(s, (gym.spaces.Box, gym.spaces.MultiBinary)):
            return [ops.flat(x, b)]
        if isinstance(s, gym.spaces.Discrete):
            return [ops.one_hot(ops.ints(x, b)[:, 0] - int(s.start), int(s.n))]
        if isinstance(s, gym.spaces.MultiDiscrete):
            x = ops.ints(x, b)
            return [ops.one_hot(x[:, i], int(n)) for i, n in enumerate(np.asarray(s.nvec).reshape(-1))]
        if isinstance(s, gym.spaces.Dict):
            return [p for k, v in s.spaces.items() if k != MASK_KEY for p in self._encode(v, x[k], b, ops)]
        if isinstance(s, gym.spaces.Tuple):
            return [p for i, v in enumerate(s.spaces) for p in self._encode(v, x[i], b, ops)]
        raise SpaceError(f"observation space {s} is not supported")

    def encode(self, obs: Any, batch_size: int, ops: Any = None) -> Any:
        """``float32[B, *shape]``: ``batch_size`` raw observations encoded (the action mask left
        out), with ``ops``' array operations: :class:`NumpyOps` (default; rollout workers) or
        ``flowkit.export.TorchOps`` (the exported module traces this same code with tensors)."""
        ops = NumpyOps if ops is None else ops
        if self.is_image:
            return ops.image(obs, batch_size, tuple(self.space.shape or ()), self._transpose, self.dtype)
        parts = self._encode(self.space, obs, batch_size, ops)
        return parts[0] if len(parts) == 1 else ops.cat(parts)

    def __call__(self, obs: Any, batch_size: int) -> Tuple[np.ndarray, Optional[np.ndarray]]:
        """Encode ``batch_size`` observations (as a vector env returns them): ``(float32[B,
        *shape], int8[B, n] action mask or None)``."""
        if self.fast_box:
            return np.asarray(obs, dtype=np.float32).reshape(batch_size, -1), None
        enc = self.encode(obs, batch_size)
        return enc, (np.asarray(obs[MASK_KEY], dtype=np.int8).reshape(batch_size, -1) if self.has_mask else None)

    def key_path(self, col: int, s: Optional[gym.Space] = None, path: str = "obs") -> str:
        """The raw observation element behind encoded column ``col`` (``obs['position'][2]``),
        for error messages."""
        s = self.space if s is None else s
        if isinstance(s, (gym.spaces.Dict, gym.spaces.Tuple)):
            items = s.spaces.items() if isinstance(s, gym.spaces.Dict) else enumerate(s.spaces)
            for k, v in items:
                if k != MASK_KEY and col < (n := self._flat_size(v)):
                    return self.key_path(col, v, f"{path}[{k!r}]")
                col -= 0 if k == MASK_KEY else n
        if not s.shape:  # a scalar Box, or one-hots (always finite)
            return path
        idx = [int(i) for i in np.unravel_index(col, self.shape if self.is_image else s.shape)]
        return f"{path}[{', '.join(map(str, idx[1:] + idx[:1] if self._transpose else idx))}]"

    def is_batched(self, obs: Any) -> bool:
        """Whether ``obs`` already has a leading batch axis (for user-facing calls)."""
        s, x = self.space, obs
        if isinstance(s, (gym.spaces.Dict, gym.spaces.Tuple)):  # its first part
            k: Any = next(iter(s.spaces)) if isinstance(s, gym.spaces.Dict) else 0
            s, x = s.spaces[k], obs[k]
        return np.ndim(x) > len(s.shape or ())

    def check_shapes(self, obs: Any, batched: bool, s: Optional[gym.Space] = None, path: str = "obs") -> None:
        """Raises ValueError when a part of ``obs`` (raw, with a leading batch axis; ``batched``:
        the caller gave it) is not shaped ``[B, *part.shape]``, naming the part, both shapes and
        its space (user-facing calls: a wrong shape would fail in numpy or torch, unexplained)."""
        s = self.space if s is None else s
        if isinstance(s, (gym.spaces.Dict, gym.spaces.Tuple)):
            items = s.spaces.items() if isinstance(s, gym.spaces.Dict) else enumerate(s.spaces)
            for k, v in items:
                self.check_shapes(obs[k], batched, v, f"{path}[{k!r}]")
            return
        want, got = tuple(s.shape or ()), tuple(np.shape(obs))
        if got[1:] != want:
            raise ValueError(f"{path} has shape {got if batched else got[1:]}; the observation space {s} takes "
                             f"{want} (one observation) or ({', '.join(['B', *map(str, want)])}) (a batch)")


def add_batch_axis(obs: Any) -> Any:
    """``obs`` (array, or dict / tuple of arrays) with a leading batch axis of 1."""
    if isinstance(obs, dict):
        return {k: add_batch_axis(v) for k, v in obs.items()}
    if isinstance(obs, tuple):
        return tuple(add_batch_axis(v) for v in obs)
    return np.asarray(obs)[None]


def batch_len(obs: Any) -> int:
    if isinstance(obs, dict):
        return batch_len(next(iter(obs.values())))
    if isinstance(obs, tuple):
        return batch_len(obs[0])
    return int(np.shape(obs)[0])

