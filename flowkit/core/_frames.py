"""Replay storage that keeps each frame of stacked uint8 observations once (:class:`FrameStorage`).

A DQN transition of game frames (e.g. Atari's) holds ``obs`` and ``next_obs``, each a stack of K=4 84x84
frames: 56 KB as plain columns, though consecutive stacks share K-1 frames and ``next_obs`` is
the next row's ``obs``. As in the DQN paper's implementation (Mnih et al. 2015, "Methods:
training details", the replay memory of single frames) and Stable-Baselines3's
``optimize_memory_usage``, FrameStorage stores each distinct frame once in a ring of frames and
each transition as 2K frame ids; :meth:`FrameStorage.get` rebuilds the stacks from the ids.
About one new frame per transition (7,056 bytes), so a million such transitions take about
7.3 GB instead of 56 GB.

Finding the shared frames needs no knowledge of the wrappers, episodes or n-step windows: every
frame of a new batch is looked up by its CRC-32 among the last ``window`` frames stored, and
a hit is used only when the bytes are equal, so the rebuilt stacks are exactly the stacks added
(a hash collision or a frame not found costs a stored frame, never a wrong one). Frame ids grow
monotonically; id ``g`` sits at slot ``g % frame_capacity``. Before frames are written, the
oldest frame id any live transition (or the lookup window) still needs is computed, and the
frame ring grows (by a sixteenth) where it would otherwise overwrite it: a buffer of observations that share
no frames (not a frame stack) stays correct, only larger.
"""
from __future__ import annotations

import zlib
from typing import Any, Dict, Optional

import numpy as np

from flowkit.core import batch as sb


def is_frame_batch(batch: sb.SampleBatch) -> bool:
    """Whether ``batch`` holds stacked uint8 frames: ``obs`` and ``next_obs`` uint8[n, K, H, W]
    of one shape, with H, W >= 8 (a frame stack, as FrameStackObservation of grayscale frames
    gives)."""
    if sb.OBS not in batch or sb.NEXT_OBS not in batch:
        return False
    o, x = np.asarray(batch[sb.OBS]), np.asarray(batch[sb.NEXT_OBS])
    return (o.dtype == np.uint8 and x.dtype == np.uint8 and o.ndim == 4 and o.shape == x.shape
            and min(o.shape[2:]) >= 8)


def _words(flat: np.ndarray) -> np.ndarray:
    """uint8[m, P] as 8-byte words when P allows (fewer elements to compare)."""
    return flat.view(np.uint64) if flat.shape[1] % 8 == 0 and flat.flags.c_contiguous else flat


class FrameStorage:
    """A ring of ``rest.capacity`` transitions whose ``obs`` / ``next_obs`` are uint8[K, H, W] frame
    stacks, each distinct frame stored once (see the module docstring); the other columns as in
    :class:`~flowkit.core.replay.Storage`. Same interface: ``add`` (returns slot indexes),
    ``get`` (rebuilt stacks), ``get_state`` / ``set_state`` (exact), ``len``.

    Attributes:
        frames: uint8[frame_capacity, H, W], the frame ring (allocated by the first batch).
        refs: int64[capacity, 2, K], the frame ids of each transition's obs and next_obs.
        frames_added: frame ids handed out so far.
    """

    def __init__(self, rest: Any, frame_capacity: Optional[int] = None):
        self.rest = rest  # an empty replay.Storage: every column but obs and next_obs
        self.capacity = self.rest.capacity
        # about one new frame per transition, plus one per episode (its last next_obs)
        self.frame_capacity = int(frame_capacity or self.capacity + self.capacity // 32 + 64)
        self.window = min(65536, self.capacity // 4)  # frames looked back at for sharing
        self.frames = np.zeros((0, 1, 1), np.uint8)
        self.hashes = np.zeros(0, np.uint64)
        self.refs = np.zeros((0, 2, 1), np.int64)
        self.minref = np.zeros(0, np.int64)
        self.frames_added = 0
        self._index: Dict[int, int] = {}  # frame hash -> frame id, for the last `window` ids
        self._indexed_from = 0  # ids below this are out of the index

    # ---- sizes ----------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.rest)

    def nbytes(self) -> int:
        """Bytes of the arrays (frames, ids and the other columns) once the frame ring is full."""
        return int(self.frames.nbytes + self.hashes.nbytes + self.refs.nbytes + self.minref.nbytes
                   + sum(v.nbytes for v in self.rest.cols.values()))

    # ---- frames ---------------------------------------------------------------------------
    def _alloc(self, k: int, h: int, w: int) -> None:
        self.frames = np.zeros((self.frame_capacity, h, w), np.uint8)
        self.hashes = np.zeros(self.frame_capacity, np.uint64)
        self.refs = np.zeros((self.capacity, 2, k), np.int64)
        self.minref = np.zeros(self.capacity, np.int64)

    @staticmethod
    def _hash(flat: np.ndarray) -> np.ndarray:
        """CRC-32 per row of uint8[m, P] (zlib, hardware-accelerated: about 2 us a 84x84 frame;
        a collision only costs a stored frame, see the module docstring)."""
        flat = np.ascontiguousarray(flat)
        return np.fromiter((zlib.crc32(row) for row in flat), np.uint64, len(flat))

    def _oldest_needed(self, overwritten: np.ndarray) -> int:
        """The oldest frame id that live transitions (but those in slots ``overwritten``) and
        the lookup window still need."""
        need = self.frames_added - self.window
        live = self.minref[:self.rest.size]
        if len(live):
            if len(overwritten):
                live = live.copy()
                live[overwritten] = np.iinfo(np.int64).max
            need = min(need, int(live.min()))
        return max(0, need)

    def _grow(self, need_from: int, new_frames: int) -> None:
        """Enlarge the frame ring (by a sixteenth at least) so that ids ``need_from`` onwards
        survive ``new_frames`` more; frames keep their ids."""
        want = self.frames_added + new_frames - need_from
        if want <= self.frame_capacity:
            return
        cap = max(want, self.frame_capacity + self.frame_capacity // 16 + 16)
        frames = np.zeros((cap, *self.frames.shape[1:]), np.uint8)
        hashes = np.zeros(cap, np.uint64)
        ids = np.arange(need_from, self.frames_added)
        frames[ids % cap] = self.frames[ids % self.frame_capacity]
        hashes[ids % cap] = self.hashes[ids % self.frame_capacity]
        self.frames, self.hashes, self.frame_capacity = frames, hashes, cap

    def _unindex_before(self, lo: int) -> None:
        for g in range(self._indexed_from, lo):
            h = int(self.hashes[g % self.frame_capacity])
            if self._index.get(h) == g:
                del self._index[h]
        self._indexed_from = max(self._indexed_from, lo)

    def _store(self, flat: np.ndarray, need_from: int) -> np.ndarray:
        """Frame ids for the frames uint8[m, P] (reusing equal frames of the window), in order;
        ids from ``need_from`` on are never overwritten (the ring grows instead). Equal frames
        within the batch are found at once (np.unique of the hashes, then one comparison of all
        bytes); only the distinct ones are looked up one by one."""
        hashes = self._hash(flat)
        uniq, first, inverse = np.unique(hashes, return_index=True, return_inverse=True)
        inverse = inverse.reshape(-1)
        rep = first[inverse]  # each frame's representative: the first with its hash
        if len(uniq) < len(flat) and not np.array_equal(_words(flat), _words(flat[rep])):
            return self._store_each(flat, hashes, need_from)  # a hash collision inside the batch
        order = np.argsort(first)  # distinct frames in the order they first appear: ids stay in stream order
        ids = np.empty(len(uniq), np.int64)
        ids[order] = self._store_each(flat[first[order]], uniq[order], need_from)
        return ids[inverse]

    def _store_each(self, flat: np.ndarray, hashes: np.ndarray, need_from: int) -> np.ndarray:
        ids = np.empty(len(flat), np.int64)
        frames, fc, index = self.frames.reshape(self.frame_capacity, -1), self.frame_capacity, self._index
        for i in range(len(flat)):
            h = int(hashes[i])
            g = index.get(h)
            if g is not None and g >= self._indexed_from and np.array_equal(frames[g % fc], flat[i]):
                ids[i] = g
                continue
            g = self.frames_added
            if g - need_from >= fc:  # the slot still holds a frame in use
                self._grow(need_from, len(flat) - i)
                frames, fc = self.frames.reshape(self.frame_capacity, -1), self.frame_capacity
            frames[g % fc] = flat[i]
            self.hashes[g % fc] = hashes[i]
            index[h] = g
            ids[i] = g
            self.frames_added += 1
        return ids

    # ---- the storage interface ------------------------------------------------------------------
    def add(self, batch: sb.SampleBatch) -> np.ndarray:
        """Copy the rows of ``batch`` in (its obs and next_obs as frame ids); returns their
        slot indexes int64[n].

        Raises:
            ValueError: obs / next_obs that are not uint8[n, K, H, W] of the stored shape.
        """
        n = len(batch)
        if n == 0:
            return np.zeros(0, np.int64)
        obs, nxt = np.asarray(batch[sb.OBS]), np.asarray(batch[sb.NEXT_OBS])
        if not is_frame_batch(batch):
            raise ValueError(f"frame replay: obs {obs.dtype}{list(obs.shape)} and next_obs {nxt.dtype}"
                             f"{list(nxt.shape)} are not stacks of uint8 frames")
        start = max(0, n - self.capacity)
        obs, nxt, n = obs[start:], nxt[start:], n - start
        k, h, w = obs.shape[1:]
        if not self.frames.size:
            self._alloc(k, h, w)
        elif obs.shape[1:] != (self.refs.shape[2], *self.frames.shape[1:]):
            raise ValueError(f"frame replay: obs of shape {list(obs.shape[1:])} differ from the stored "
                             f"{[self.refs.shape[2], *self.frames.shape[1:]]}")
        slots = (self.rest.next_idx + np.arange(n)) % self.capacity
        overwritten = slots[slots < self.rest.size]
        need_from = self._oldest_needed(overwritten)
        self._unindex_before(max(need_from, self.frames_added - self.window))
        flat = np.concatenate([obs, nxt], 1).reshape(n * 2 * k, h * w)  # row i: obs frames, then next_obs frames
        ids = self._store(flat, need_from).reshape(n, 2, k)
        rest = sb.SampleBatch({c: np.asarray(v)[start:] for c, v in batch.items() if c not in (sb.OBS, sb.NEXT_OBS)})
        got = self.rest.add(rest, n)
        self.refs[got] = ids
        self.minref[got] = ids.reshape(n, -1).min(1)
        return got

    def get(self, idx: np.ndarray) -> sb.SampleBatch:
        """Rows ``idx`` with obs and next_obs rebuilt: uint8[len(idx), K, H, W] each."""
        out = self.rest.get(idx)
        stacks = self.frames[self.refs[idx] % self.frame_capacity]  # [B, 2, K, H, W]
        out[sb.OBS], out[sb.NEXT_OBS] = stacks[:, 0], stacks[:, 1]
        return out

    def get_state(self, include_replay: bool = True) -> Dict[str, Any]:
        """Plain arrays and numbers: the other columns (Storage's state), and with
        ``include_replay`` the ids of the live transitions and the frames from the oldest one
        they use to the newest (frame ids and the ring size kept, so ``get`` after
        :meth:`set_state` returns the same stacks)."""
        st: Dict[str, Any] = {"kind": "frames", "rest": self.rest.get_state(include_replay),
                              "frame_capacity": self.frame_capacity, "frames_added": self.frames_added}
        if include_replay and self.frames.size and self.rest.size:
            lo = int(self.minref[:self.rest.size].min())
            ids = np.arange(lo, self.frames_added)
            st.update(refs=self.refs[:self.rest.size].copy(), frames_from=lo,
                      frames=self.frames[ids % self.frame_capacity].copy())
        return st

    def set_state(self, st: Dict[str, Any]) -> None:
        self.rest.set_state(st["rest"])
        self.frame_capacity, self.frames_added = int(st["frame_capacity"]), int(st["frames_added"])
        self._index, self._indexed_from = {}, self.frames_added  # sharing starts afresh
        if "refs" not in st:
            self.frames = np.zeros((0, 1, 1), np.uint8)
            self.rest.size = self.rest.next_idx = 0
            return
        refs, frames, lo = np.asarray(st["refs"]), np.asarray(st["frames"]), int(st["frames_from"])
        self._alloc(refs.shape[2], *frames.shape[1:])
        ids = np.arange(lo, self.frames_added)
        self.frames[ids % self.frame_capacity] = frames
        self.hashes[ids % self.frame_capacity] = self._hash(frames.reshape(len(frames), -1))
        self.refs[:len(refs)] = refs
        self.minref[:len(refs)] = refs.reshape(len(refs), -1).min(1)
