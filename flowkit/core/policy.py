"""Policies, observation encoders, networks and action distributions (torch).

Observation encoding by space (``ObsEncoder``):
    Box (1-D or any shape that is not image-like) -> flattened float32;
    Box of shape (H, W, C) or (C, H, W) with C <= 4 -> image (C, H, W) for a small CNN,
    uint8 scaled to [0, 1]; Discrete(n) -> one-hot n; MultiDiscrete(nvec) -> concatenated
    one-hots; MultiBinary(n) -> n floats; Dict / Tuple -> their parts encoded and
    concatenated in the space's key order, with ``action_mask`` taken out and returned as the
    action mask.

Action distributions by space (``ActionDist``): Discrete -> categorical (masked logits),
MultiDiscrete -> independent categoricals, MultiBinary -> independent Bernoullis, Box ->
diagonal Gaussian with a state-independent log-std; the sampled (unbounded) value is what the
loss sees, the env receives it scaled from [-1, 1] to the bounds and then clipped.
"""
from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Sequence, Tuple

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from flowkit.core import batch as sb

ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU, "elu": nn.ELU, "gelu": nn.GELU, "silu": nn.SiLU}
MASK_KEY = "action_mask"


class SpaceError(ValueError):
    """A space flowkit cannot handle, or a value outside its space."""


# ---- observation encoding --------------------------------------------------------------
class ObsEncoder:
    """Turns batched raw observations into ``float32[B, *shape]`` plus an optional
    ``int8[B, n]`` action mask.

    Attributes:
        shape: the encoded shape per observation; ``(D,)`` or ``(C, H, W)`` for images.
        is_image: whether the encoded observation goes through a CNN.
        has_mask: whether observations carry an ``action_mask`` (Dict spaces only).
    """

    def __init__(self, space: gym.Space):
        self.space = space
        self.has_mask = isinstance(space, gym.spaces.Dict) and MASK_KEY in space.spaces
        self.is_image = False
        self._transpose = False
        if isinstance(space, gym.spaces.Box) and len(space.shape) == 3:
            h, w, c = space.shape
            if c <= 4 < min(h, w):
                self.is_image, self._transpose, self.shape = True, True, (c, h, w)
            elif space.shape[0] <= 4 < min(space.shape[1:]):
                self.is_image, self.shape = True, tuple(space.shape)
        if self.is_image:
            self._scale = 1.0 / 255.0 if space.dtype == np.uint8 else 1.0
        else:
            self.shape = (self._flat_size(space),)
        self.fast_box = isinstance(space, gym.spaces.Box) and not self.is_image

    def _flat_size(self, s: gym.Space) -> int:
        if isinstance(s, gym.spaces.Box):
            return int(np.prod(s.shape))
        if isinstance(s, gym.spaces.Discrete):
            return int(s.n)
        if isinstance(s, gym.spaces.MultiDiscrete):
            return int(np.sum(s.nvec))
        if isinstance(s, gym.spaces.MultiBinary):
            return int(np.prod(s.n))
        if isinstance(s, gym.spaces.Dict):
            return sum(self._flat_size(v) for k, v in s.spaces.items() if k != MASK_KEY)
        if isinstance(s, gym.spaces.Tuple):
            return sum(self._flat_size(v) for v in s.spaces)
        raise SpaceError(f"observation space {s} is not supported "
                         "(Box, Discrete, MultiDiscrete, MultiBinary, Dict, Tuple are)")

    def _encode(self, s: gym.Space, x: Any, b: int) -> List[np.ndarray]:
        if isinstance(s, gym.spaces.Box):
            return [np.asarray(x, dtype=np.float32).reshape(b, -1)]
        if isinstance(s, gym.spaces.Discrete):
            out = np.zeros((b, int(s.n)), np.float32)
            out[np.arange(b), np.asarray(x, dtype=np.int64).reshape(b) - int(s.start)] = 1.0
            return [out]
        if isinstance(s, gym.spaces.MultiDiscrete):
            x = np.asarray(x, dtype=np.int64).reshape(b, -1)
            parts = []
            for i, n in enumerate(np.asarray(s.nvec).reshape(-1)):
                o = np.zeros((b, int(n)), np.float32)
                o[np.arange(b), x[:, i]] = 1.0
                parts.append(o)
            return parts
        if isinstance(s, gym.spaces.MultiBinary):
            return [np.asarray(x, dtype=np.float32).reshape(b, -1)]
        if isinstance(s, gym.spaces.Dict):
            parts = []
            for k, v in s.spaces.items():
                if k != MASK_KEY:
                    parts += self._encode(v, x[k], b)
            return parts
        if isinstance(s, gym.spaces.Tuple):
            parts = []
            for i, v in enumerate(s.spaces):
                parts += self._encode(v, x[i], b)
            return parts
        raise SpaceError(f"observation space {s} is not supported")

    def __call__(self, obs: Any, batch_size: int) -> Tuple[np.ndarray, Optional[np.ndarray]]:
        """Encode ``batch_size`` observations (as a vector env returns them)."""
        if self.fast_box:
            return np.asarray(obs, dtype=np.float32).reshape(batch_size, -1), None
        if self.is_image:
            x = np.asarray(obs, dtype=np.float32).reshape(batch_size, *self.space.shape)
            if self._transpose:
                x = x.transpose(0, 3, 1, 2)
            return np.ascontiguousarray(x * self._scale), None
        parts = self._encode(self.space, obs, batch_size)
        enc = parts[0] if len(parts) == 1 else np.concatenate(parts, axis=1)
        mask = None
        if self.has_mask:
            mask = np.asarray(obs[MASK_KEY], dtype=np.int8).reshape(batch_size, -1)
        return enc, mask

    def is_batched(self, obs: Any) -> bool:
        """Whether ``obs`` already has a leading batch axis (for user-facing calls)."""
        s = self.space
        if isinstance(s, gym.spaces.Dict):
            k = next(iter(s.spaces))
            return np.ndim(obs[k]) > len(s.spaces[k].shape or ())
        if isinstance(s, gym.spaces.Tuple):
            return np.ndim(obs[0]) > len(s.spaces[0].shape or ())
        return np.ndim(obs) > len(s.shape or ())


class RunningMeanStd(nn.Module):
    """Running mean and variance of encoded observations (Chan et al. parallel update);
    ``normalize(x) = clip((x - mean) / sqrt(var + 1e-8), -clip, clip)``."""

    def __init__(self, shape: Sequence[int], clip: float = 10.0):
        super().__init__()
        self.register_buffer("mean", torch.zeros(shape))
        self.register_buffer("var", torch.ones(shape))
        self.register_buffer("count", torch.tensor(1e-4, dtype=torch.float64))
        self.clip = clip

    @torch.no_grad()
    def update(self, x: torch.Tensor) -> None:
        bm, bv, bc = x.mean(0), x.var(0, unbiased=False), x.shape[0]
        delta, tot = bm - self.mean, self.count + bc
        self.mean += delta * (bc / tot).float()
        m2 = self.var * self.count.float() + bv * bc + delta.pow(2) * (self.count * bc / tot).float()
        self.var.copy_(m2 / tot.float())
        self.count.copy_(tot)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.clamp((x - self.mean) / torch.sqrt(self.var + 1e-8), -self.clip, self.clip)


# ---- networks --------------------------------------------------------------------------
def build_mlp(in_dim: int, hidden: Sequence[int], activation: str, out_dim: Optional[int] = None,
              out_gain: float = 1.0) -> nn.Sequential:
    """Linear layers with orthogonal init (gain sqrt(2) hidden, ``out_gain`` last)."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"model.activation={activation!r} is not one of {sorted(ACTIVATIONS)}")
    layers: List[nn.Module] = []
    d = in_dim
    for h in hidden:
        lin = nn.Linear(d, h)
        nn.init.orthogonal_(lin.weight, math.sqrt(2))
        nn.init.zeros_(lin.bias)
        layers += [lin, ACTIVATIONS[activation]()]
        d = h
    if out_dim is not None:
        lin = nn.Linear(d, out_dim)
        nn.init.orthogonal_(lin.weight, out_gain)
        nn.init.zeros_(lin.bias)
        layers.append(lin)
    return nn.Sequential(*layers)


_ACT_FN = {"tanh": torch.tanh, "relu": torch.relu, "elu": nn.functional.elu,
           "gelu": nn.functional.gelu, "silu": nn.functional.silu}


class TwinMLP(nn.Module):
    """Two MLPs with the same hidden sizes (e.g. policy and value networks) evaluated
    together: the first layers as one matmul over concatenated weights, deeper layers as one
    batched matmul (``torch.baddbmm``), then a linear head each. The same functions as two
    separate ``build_mlp`` networks (orthogonal init, gain sqrt(2) hidden, ``gain_a``/``gain_b``
    heads), with about half the kernel launches: on a CPU most of a small MLP's time is
    per-op overhead.

    ``forward(x: float32[B, in_dim]) -> (float32[B, out_a], float32[B, out_b])``.
    """

    def __init__(self, in_dim: int, hidden: Sequence[int], activation: str, out_a: int, out_b: int,
                 gain_a: float = 0.01, gain_b: float = 1.0):
        super().__init__()
        if activation not in _ACT_FN:
            raise ValueError(f"model.activation={activation!r} is not one of {sorted(_ACT_FN)}")
        self.act = _ACT_FN[activation]
        self.hidden = list(hidden)

        def ortho(rows: int, cols: int, gain: float) -> torch.Tensor:
            w = torch.empty(rows, cols)
            nn.init.orthogonal_(w, gain)
            return w
        g = math.sqrt(2)
        d = in_dim
        if self.hidden:
            h0 = self.hidden[0]
            self.w0 = nn.Parameter(torch.cat([ortho(h0, in_dim, g), ortho(h0, in_dim, g)]))
            self.b0 = nn.Parameter(torch.zeros(2 * h0))
            d = h0
        self.ws = nn.ParameterList()
        self.bs = nn.ParameterList()
        for h in self.hidden[1:]:
            # bmm layout: (2, d_in, d_out), i.e. the transposed nn.Linear weight
            self.ws.append(nn.Parameter(torch.stack([ortho(h, d, g).T, ortho(h, d, g).T]).contiguous()))
            self.bs.append(nn.Parameter(torch.zeros(2, 1, h)))
            d = h
        self.wa, self.ba = nn.Parameter(ortho(out_a, d, gain_a)), nn.Parameter(torch.zeros(out_a))
        self.wb, self.bb = nn.Parameter(ortho(out_b, d, gain_b)), nn.Parameter(torch.zeros(out_b))

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        if not self.hidden:
            return nn.functional.linear(x, self.wa, self.ba), nn.functional.linear(x, self.wb, self.bb)
        h = self.act(nn.functional.linear(x, self.w0, self.b0))
        h = h.view(x.shape[0], 2, self.hidden[0]).transpose(0, 1)
        for i in range(len(self.hidden) - 1):
            h = self.act(torch.baddbmm(self.bs._parameters[str(i)], h, self.ws._parameters[str(i)]))
        return nn.functional.linear(h[0], self.wa, self.ba), nn.functional.linear(h[1], self.wb, self.bb)


class SmallCNN(nn.Module):
    """Conv(32, 8, s4) -> Conv(64, 4, s2) -> Conv(64, 3, s1) -> flatten (Mnih et al. 2015),
    with kernels shrunk for small images."""

    def __init__(self, shape: Sequence[int]):
        super().__init__()
        c, h, w = shape
        big = min(h, w) >= 36
        self.net = nn.Sequential(
            nn.Conv2d(c, 32, 8 if big else 3, 4 if big else 1), nn.ReLU(),
            nn.Conv2d(32, 64, 4 if big else 3, 2 if big else 1), nn.ReLU(),
            nn.Conv2d(64, 64, 3, 1), nn.ReLU(), nn.Flatten())
        with torch.no_grad():
            self.out_dim = int(self.net(torch.zeros(1, c, h, w)).shape[1])

    def forward(self, x):
        return self.net(x)


def build_trunk(encoder: ObsEncoder, hidden: Sequence[int], activation: str) -> Tuple[nn.Module, int]:
    """Encoded observation -> features: CNN (images) then MLP ``hidden``. Returns (module, dim)."""
    mods: List[nn.Module] = []
    d = encoder.shape[0]
    if encoder.is_image:
        cnn = SmallCNN(encoder.shape)
        mods.append(cnn)
        d = cnn.out_dim
    mlp = build_mlp(d, hidden, activation)
    mods.append(mlp)
    return nn.Sequential(*mods), (hidden[-1] if hidden else d)


# ---- action distributions --------------------------------------------------------------
class ActionDist:
    """Distribution family for an action space, over the network's ``inputs``
    (float32[B, num_inputs]): logits, or Gaussian ``(mean, log_std)``.

    ``sample``/``logp``/``entropy``/``kl`` work on torch tensors; ``to_env`` maps sampled
    actions (numpy) into the env's space (Box: scale [-1,1] to [low, high], then clip).
    """

    def __init__(self, space: gym.Space):
        self.space = space
        if isinstance(space, gym.spaces.Discrete):
            self.kind, self.num_outputs, self.nvec = "cat", int(space.n), [int(space.n)]
        elif isinstance(space, gym.spaces.MultiDiscrete):
            self.nvec = [int(n) for n in np.asarray(space.nvec).reshape(-1)]
            self.kind, self.num_outputs = "multicat", int(sum(self.nvec))
        elif isinstance(space, gym.spaces.MultiBinary):
            self.kind, self.num_outputs = "bern", int(np.prod(space.n))
        elif isinstance(space, gym.spaces.Box):
            if not np.all(np.isfinite(space.low)) or not np.all(np.isfinite(space.high)):
                self.kind = "gauss_unbounded"
            else:
                self.kind = "gauss"
            self.dim = int(np.prod(space.shape))
            self.num_outputs = self.dim  # the mean; log_std is a separate parameter
            self.low = np.asarray(space.low, np.float32).reshape(-1)
            self.high = np.asarray(space.high, np.float32).reshape(-1)
            self.is_int = np.issubdtype(space.dtype, np.integer)
        else:
            raise SpaceError(f"action space {space} is not supported "
                             "(Discrete, MultiDiscrete, MultiBinary, Box are)")
        self.is_gauss = self.kind.startswith("gauss")

    # masks apply to Discrete only (PettingZoo's convention)
    @staticmethod
    def masked(logits: torch.Tensor, mask: Optional[torch.Tensor]) -> torch.Tensor:
        if mask is None:
            return logits
        return logits.masked_fill(mask == 0, torch.finfo(logits.dtype).min)

    def _split(self, inputs):
        return torch.split(inputs, self.nvec, dim=-1)

    def sample(self, inputs: torch.Tensor, mask=None, explore=True, generator=None) -> torch.Tensor:
        if self.kind == "cat":
            logits = self.masked(inputs, mask)
            if not explore:
                return logits.argmax(-1)
            u = torch.rand(logits.shape, generator=generator).clamp_(1e-20, 1.0)
            return (logits - torch.log(-torch.log(u))).argmax(-1)  # Gumbel-max
        if self.kind == "multicat":
            outs = []
            for lg in self._split(inputs):
                if explore:
                    u = torch.rand(lg.shape, generator=generator).clamp_(1e-20, 1.0)
                    lg = lg - torch.log(-torch.log(u))
                outs.append(lg.argmax(-1))
            return torch.stack(outs, -1)
        if self.kind == "bern":
            if not explore:
                return (inputs > 0).to(torch.int64)
            return (torch.rand(inputs.shape, generator=generator) < torch.sigmoid(inputs)).to(torch.int64)
        mean, log_std = inputs[..., :self.dim], inputs[..., self.dim:]
        if not explore:
            return mean
        return mean + torch.exp(log_std) * torch.randn(mean.shape, generator=generator)

    def sample_logp(self, inputs, mask=None, explore=True, generator=None) -> Tuple[torch.Tensor, torch.Tensor]:
        """``(actions, logp)``; one log-softmax for categoricals (Gumbel-max sampling)."""
        if self.kind != "cat":
            a = self.sample(inputs, mask, explore, generator)
            return a, self.logp(inputs, a, mask)
        lp = torch.log_softmax(self.masked(inputs, mask), -1)
        if explore:
            u = torch.rand(lp.shape, generator=generator).clamp_(1e-20, 1.0)
            a = (lp - torch.log(-torch.log(u))).argmax(-1)
        else:
            a = lp.argmax(-1)
        return a, lp.gather(-1, a.unsqueeze(-1)).squeeze(-1)

    def logp(self, inputs, actions, mask=None) -> torch.Tensor:
        if self.kind == "cat":
            lp = torch.log_softmax(self.masked(inputs, mask), -1)
            return lp.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)
        if self.kind == "multicat":
            a = actions.long()
            return sum(torch.log_softmax(lg, -1).gather(-1, a[..., i:i + 1]).squeeze(-1)
                       for i, lg in enumerate(self._split(inputs)))
        if self.kind == "bern":
            a = actions.float()
            return -(nn.functional.binary_cross_entropy_with_logits(inputs, a, reduction="none")).sum(-1)
        mean, log_std = inputs[..., :self.dim], inputs[..., self.dim:]
        z = (actions - mean) / torch.exp(log_std)
        return (-0.5 * z.pow(2) - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)

    def logp_entropy(self, inputs, actions, mask=None, entropy_grad: bool = True):
        """``(logp, entropy)`` per row, sharing one log-softmax for categoricals; the entropy
        is detached when ``entropy_grad`` is False (cheaper backward)."""
        if self.kind == "cat":
            lp = torch.log_softmax(self.masked(inputs, mask), -1)
            logp = lp.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)
            src = lp if entropy_grad else lp.detach()
            p = src.exp()
            ent = -(p * src.masked_fill(p == 0, 0.0)).sum(-1)
            return logp, ent
        ent_in = inputs if entropy_grad else inputs.detach()
        return self.logp(inputs, actions, mask), self.entropy(ent_in, mask)

    def entropy(self, inputs, mask=None) -> torch.Tensor:
        if self.kind in ("cat", "multicat"):
            parts = [self.masked(inputs, mask)] if self.kind == "cat" else self._split(inputs)
            ent = 0
            for lg in parts:
                lp = torch.log_softmax(lg, -1)
                p = lp.exp()
                ent = ent - (p * lp.masked_fill(p == 0, 0.0)).sum(-1)
            return ent
        if self.kind == "bern":
            p = torch.sigmoid(inputs)
            return nn.functional.binary_cross_entropy_with_logits(inputs, p, reduction="none").sum(-1)
        log_std = inputs[..., self.dim:]
        return (log_std + 0.5 * math.log(2 * math.pi * math.e)).sum(-1)

    def kl(self, old, new, mask=None) -> torch.Tensor:
        """KL(old || new) per row."""
        if self.kind in ("cat", "multicat"):
            po = [self.masked(old, mask)] if self.kind == "cat" else self._split(old)
            pn = [self.masked(new, mask)] if self.kind == "cat" else self._split(new)
            kl = 0
            for a, b in zip(po, pn):
                la, lb = torch.log_softmax(a, -1), torch.log_softmax(b, -1)
                kl = kl + (la.exp() * (la - lb)).sum(-1)
            return kl
        if self.kind == "bern":
            pa, pb = torch.sigmoid(old), torch.sigmoid(new)
            eps = 1e-8
            return (pa * (torch.log(pa + eps) - torch.log(pb + eps))
                    + (1 - pa) * (torch.log(1 - pa + eps) - torch.log(1 - pb + eps))).sum(-1)
        mo, lo = old[..., :self.dim], old[..., self.dim:]
        mn, ln = new[..., :self.dim], new[..., self.dim:]
        return (ln - lo + (torch.exp(2 * lo) + (mo - mn).pow(2)) / (2 * torch.exp(2 * ln)) - 0.5).sum(-1)

    def to_env(self, actions: np.ndarray) -> np.ndarray:
        """Sampled actions (numpy, batched) -> values inside the env's action space."""
        if self.kind == "cat":
            return actions.astype(np.int64, copy=False) + int(self.space.start)
        if self.kind == "multicat":
            return actions.astype(self.space.dtype, copy=False)
        if self.kind == "bern":
            return actions.astype(self.space.dtype, copy=False)
        a = actions.reshape(actions.shape[0], -1)
        if self.kind == "gauss":
            a = self.low + (a + 1.0) * 0.5 * (self.high - self.low)  # scale first...
        a = np.clip(a, self.low, self.high)                          # ...then clip
        if self.is_int:
            a = np.rint(a)
        return a.astype(self.space.dtype).reshape(actions.shape[0], *self.space.shape)


_NP_ACT = {"tanh": np.tanh, "relu": lambda x: np.maximum(x, 0.0, out=x)}


class NumpyActorCritic:
    """Acting-time mirror of an :class:`ActorCritic` in numpy, for rollout workers on CPU.

    A worker evaluates the network on a few rows per env step (one per sub-env), where each
    torch call costs several microseconds of dispatch; numpy's calls cost about one. This
    computes the same functions (float32 throughout) on views of the model's parameters (no
    copies: weights set with ``load_state_dict`` and in-place optimizer steps are seen at
    once; a parameter whose storage moved rebuilds the views).

    Supported: MLP models (``TwinMLP``, or separate policy/value ``nn.Sequential`` of
    ``nn.Linear`` and Tanh/ReLU), optional running observation normalisation, Discrete
    (with action masks) and Box (Gaussian) actions. :meth:`build` returns None for anything
    else (CNNs, a shared trunk, other activations or action spaces, a subclassed model) and
    the policy keeps its torch path.
    """

    def __init__(self, model: "ActorCritic", activation: str):
        self.model, self.act = model, _NP_ACT[activation]
        self._ptrs: Tuple[int, ...] = ()
        self._bind()

    @classmethod
    def build(cls, model: "ActorCritic", dist: "ActionDist", activation: str) -> Optional["NumpyActorCritic"]:
        if type(model) is not ActorCritic or dist.kind not in ("cat", "gauss", "gauss_unbounded"):
            return None
        if activation not in _NP_ACT or any(p.device.type != "cpu" for p in model.parameters()):
            return None
        if model.twin is not None:
            if type(model.twin) is not TwinMLP or model.twin.act is not _ACT_FN[activation]:
                return None
        elif model.shared or not all(cls._mlp_layers(s) is not None for s in (model.pi, model.vf)):
            return None
        return cls(model, activation)

    @staticmethod
    def _mlp_layers(seq: nn.Module) -> Optional[List[nn.Linear]]:
        """The Linear layers of a (nested) Sequential of Linear + Tanh/ReLU, else None."""
        out: List[nn.Linear] = []
        for m in seq.modules():
            if isinstance(m, nn.Sequential):
                continue
            if type(m) is nn.Linear:
                out.append(m)
            elif type(m) not in (nn.Tanh, nn.ReLU):
                return None
        return out or None

    def _tensors(self) -> List[torch.Tensor]:
        return list(self.model.parameters()) + list(self.model.buffers())

    def _bind(self) -> None:
        m = self.model
        v = lambda t: t.detach().numpy()  # noqa: E731 - a view, not a copy
        self.rms = None if m.obs_rms is None else (v(m.obs_rms.mean), v(m.obs_rms.var), m.obs_rms.clip)
        self.log_std = None if m.log_std is None else v(m.log_std)
        if m.twin is not None:
            t = m.twin
            self.twin = (v(t.w0).T if t.hidden else None, v(t.b0) if t.hidden else None,
                         [v(w) for w in t.ws], [v(b) for b in t.bs],
                         v(t.wa).T, v(t.ba), v(t.wb).T, v(t.bb), t.hidden)
        else:
            self.twin = None
            self.pi = [(v(l.weight).T, v(l.bias)) for l in self._mlp_layers(m.pi)]
            self.vf = [(v(l.weight).T, v(l.bias)) for l in self._mlp_layers(m.vf)]
        self._watch = self._tensors()
        self._ptrs = tuple(t.data_ptr() for t in self._watch)

    def _mlp(self, x: np.ndarray, layers) -> np.ndarray:
        for i, (w, b) in enumerate(layers):
            x = x @ w + b
            if i < len(layers) - 1:
                x = self.act(x)
        return x

    def forward(self, obs: np.ndarray, value: bool = True) -> Tuple[np.ndarray, Optional[np.ndarray]]:
        """obs float32[B, d] -> (dist_inputs float32[B, k], value float32[B] or None)."""
        if tuple([t.data_ptr() for t in self._watch]) != self._ptrs:
            self._bind()
        x = obs if obs.dtype == np.float32 and obs.ndim == 2 else np.asarray(obs, np.float32).reshape(len(obs), -1)
        if self.rms is not None:
            mean, var, clip = self.rms
            x = np.clip((x - mean) / np.sqrt(var + np.float32(1e-8)), -clip, clip).astype(np.float32, copy=False)
        if self.twin is not None:
            w0, b0, ws, bs, wa, ba, wb, bb, hidden = self.twin
            if hidden:
                h = self.act(x @ w0 + b0).reshape(x.shape[0], 2, hidden[0]).transpose(1, 0, 2)
                for w, b in zip(ws, bs):
                    h = self.act(np.matmul(h, w) + b)
                ha, hb = h[0], h[1]
            else:
                ha = hb = x
            inputs = ha @ wa + ba
            val = (hb @ wb + bb)[:, 0] if value else None
        else:
            inputs = self._mlp(x, self.pi)
            val = self._mlp(x, self.vf)[:, 0] if value else None
        if self.log_std is not None:
            inputs = np.concatenate([inputs, np.broadcast_to(self.log_std, inputs.shape)], -1)
        return inputs, val


def sample_logp_numpy(dist: "ActionDist", inputs: np.ndarray, mask: Optional[np.ndarray], explore: bool,
                      rng: np.random.Generator) -> Tuple[np.ndarray, np.ndarray]:
    """:meth:`ActionDist.sample_logp` in numpy for Discrete (Gumbel-max over the log-softmax,
    masked logits set to the float32 minimum) and Gaussian actions.

    Returns ``(actions int64[B] or float32[B, dim], logp float32[B])``."""
    if dist.kind == "cat":
        lg = inputs if mask is None else np.where(mask == 0, np.finfo(np.float32).min, inputs)
        z = lg - lg.max(-1, keepdims=True)
        lp = z - np.log(np.exp(z).sum(-1, keepdims=True))
        if explore:
            u = np.clip(rng.random(lp.shape, dtype=np.float32), 1e-20, 1.0)
            a = (lp - np.log(-np.log(u))).argmax(-1)
        else:
            a = lp.argmax(-1)
        return a.astype(np.int64), np.take_along_axis(lp, a[:, None], -1)[:, 0].astype(np.float32)
    mean, log_std = inputs[:, :dist.dim], inputs[:, dist.dim:]
    eps = rng.standard_normal(mean.shape, dtype=np.float32) if explore else np.zeros_like(mean)
    a = mean + np.exp(log_std) * eps
    logp = (-0.5 * eps * eps - log_std - np.float32(0.5 * math.log(2 * math.pi))).sum(-1)
    return a.astype(np.float32), logp.astype(np.float32)


class ActorCritic(nn.Module):
    """Policy and value networks for actor-critic algorithms (PPO, IMPALA): separate MLPs
    (evaluated as one :class:`TwinMLP` when ``twin``), or a shared trunk with
    ``model.shared_value_network``; images go through a CNN trunk; optional running
    observation normalisation; a state-independent log-std for Gaussian actions.

    ``forward(obs float32[B, *shape]) -> (dist_inputs float32[B, k], value float32[B])``."""

    def __init__(self, encoder: ObsEncoder, dist: ActionDist, model_cfg: Any, normalize_obs: bool = False,
                 log_std_init: float = 0.0, twin: bool = True):
        super().__init__()
        hidden, act = list(model_cfg.hidden_sizes), model_cfg.activation
        self.obs_rms = RunningMeanStd(encoder.shape) if normalize_obs else None
        self.shared = bool(model_cfg.shared_value_network)
        self.twin = None
        if twin and not self.shared and not encoder.is_image:
            # separate policy and value MLPs, evaluated as one TwinMLP (fewer kernel launches)
            self.twin = TwinMLP(encoder.shape[0], hidden, act, dist.num_outputs, 1, 0.01, 1.0)
        elif self.shared:
            self.trunk, d = build_trunk(encoder, hidden, act)
            self.pi_head = build_mlp(d, [], act, dist.num_outputs, 0.01)
            self.vf_head = build_mlp(d, [], act, 1, 1.0)
        else:
            pt, d = build_trunk(encoder, hidden, act)
            self.pi = nn.Sequential(pt, build_mlp(d, [], act, dist.num_outputs, 0.01))
            vt, d = build_trunk(encoder, hidden, act)
            self.vf = nn.Sequential(vt, build_mlp(d, [], act, 1, 1.0))
        self.log_std = nn.Parameter(torch.full((dist.num_outputs,), float(log_std_init))) if dist.is_gauss else None

    def _norm(self, obs):
        return self.obs_rms(obs) if self.obs_rms is not None else obs

    def forward(self, obs: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """obs: float32[B, *shape] -> (dist_inputs float32[B, k], value float32[B])."""
        x = self._norm(obs)
        if self.twin is not None:
            logits, value = self.twin(x)
        elif self.shared:
            h = self.trunk(x)
            logits, value = self.pi_head(h), self.vf_head(h)
        else:
            logits, value = self.pi(x), self.vf(x)
        if self.log_std is not None:
            logits = torch.cat([logits, self.log_std.expand_as(logits)], -1)
        return logits, value.squeeze(-1)

    def policy(self, obs: torch.Tensor) -> torch.Tensor:
        """dist_inputs only: float32[B, k] (skips the value network where it is separate)."""
        if self.twin is not None or self.shared:
            return self.forward(obs)[0]
        logits = self.pi(self._norm(obs))
        if self.log_std is not None:
            logits = torch.cat([logits, self.log_std.expand_as(logits)], -1)
        return logits

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        x = self._norm(obs)
        if self.twin is not None:
            return self.twin(x)[1].squeeze(-1)
        return (self.vf_head(self.trunk(x)) if self.shared else self.vf(x)).squeeze(-1)


# ---- the Policy base class -------------------------------------------------------------
class Policy:
    """Base class of every policy: owns the network and the math of one algorithm.

    Lifecycle: built on the driver (learner copy, with optimizer) and on every rollout
    worker (inference copy, ``inference_only=True``). Workers call
    :meth:`compute_actions_encoded` each env step and :meth:`postprocess_trajectory` on each
    finished fragment; the :class:`~flowkit.core.learner.Learner` calls :meth:`prepare_batch`,
    :meth:`loss` per minibatch and :meth:`on_train_batch_end`; weights travel as
    ``{name: np.ndarray}`` (:meth:`get_weights` / :meth:`set_weights`).

    Subclass and override :meth:`loss` (or any other method) to make a variant.

    Args:
        observation_space: the raw observation space of the agents mapped to this policy.
        action_space: their action space.
        config: the algorithm's config section (a dataclass instance, read-only by convention).
        model_config: the ``model.*`` section.
        device: ``"cpu"`` or ``"cuda"`` (the learner's; workers always use cpu).
        seed: seeds this policy's sampling RNG.
        inference_only: build no optimizer (rollout workers).
    """

    def __init__(self, observation_space: gym.Space, action_space: gym.Space, config: Any,
                 model_config: Any = None, device: str = "cpu", seed: int = 0,
                 inference_only: bool = False):
        self.observation_space, self.action_space = observation_space, action_space
        self.config, self.model_config = config, model_config
        self.device = torch.device(device)
        self.encoder = ObsEncoder(observation_space)
        self.dist = ActionDist(action_space)
        self.inference_only = inference_only
        self.generator = torch.Generator().manual_seed(int(seed) % (2 ** 63))
        self.np_random = np.random.default_rng(seed)
        self.model: Optional[nn.Module] = None
        self.optimizer: Optional[torch.optim.Optimizer] = None
        self.num_updates = 0  # learner updates applied to these weights (policy lag)
        self._np_model: Optional[NumpyActorCritic] = None
        self._np_checked = False

    # ---- acting ---------------------------------------------------------------------------
    def compute_actions_encoded(self, obs: np.ndarray, mask: Optional[np.ndarray] = None,
                                explore: bool = True) -> Tuple[np.ndarray, Dict[str, np.ndarray]]:
        """Actions for encoded observations ``float32[B, *shape]``.

        Returns:
            ``(actions, extras)``: actions as sampled (numpy, ``[B]`` or ``[B, k]``) and
            per-row extras to store in the batch (e.g. ``action_logp``, ``vf_preds``).
        Raises:
            ValueError: if a row of ``mask`` allows no action.
        """
        raise NotImplementedError

    def numpy_model(self) -> Optional[NumpyActorCritic]:
        """The :class:`NumpyActorCritic` mirror of ``self.model`` used for acting on CPU, or
        None (not an MLP actor-critic, ``model.numpy_inference=false``, or not on CPU)."""
        if not self._np_checked:
            self._np_checked = True
            mc = self.model_config
            if (self.device.type == "cpu" and isinstance(self.model, ActorCritic) and mc is not None
                    and bool(getattr(mc, "numpy_inference", True))):
                self._np_model = NumpyActorCritic.build(self.model, self.dist, str(mc.activation))
        return self._np_model

    def compute_actions(self, obs: Any, explore: bool = False) -> np.ndarray:
        """Env-ready actions for raw observations (one, or a batch with a leading axis).

        Raises:
            ValueError: an observation whose action mask allows nothing.
        """
        batched = self.encoder.is_batched(obs)
        if not batched:
            obs = _add_batch_axis(obs)
        b = _batch_len(obs)
        enc, mask = self.encoder(obs, b)
        actions, _ = self.compute_actions_encoded(enc, mask, explore)
        env_actions = self.dist.to_env(actions)
        return env_actions if batched else env_actions[0]

    @staticmethod
    def check_mask(mask: Optional[np.ndarray], where: str = "") -> None:
        if mask is not None and mask.shape[0] and not mask.any(axis=1).all():
            rows = np.flatnonzero(~mask.any(axis=1)).tolist()
            raise ValueError(f"action_mask allows no action in rows {rows}{where}: "
                             "an agent asked to act needs at least one legal action")

    # ---- learning ---------------------------------------------------------------------------
    def postprocess_trajectory(self, batch: sb.SampleBatch) -> sb.SampleBatch:
        """Per-trajectory processing on the worker (GAE, n-step). Default: unchanged.

        ``batch`` holds one or more contiguous trajectory pieces (see :mod:`batch`)."""
        return batch

    def prepare_batch(self, batch: sb.SampleBatch) -> Dict[str, torch.Tensor]:
        """Columns as tensors on the learner device (once per train batch)."""
        return {k: to_tensor(v, self.device) for k, v in batch.items()}

    def loss(self, batch: Dict[str, torch.Tensor]) -> Tuple[torch.Tensor, Dict[str, float]]:
        """Return ``(loss, stats)`` for one minibatch of tensors."""
        raise NotImplementedError

    def make_optimizer(self, lr: float, eps: float = 1e-8, module: Optional[nn.Module] = None) -> torch.optim.Optimizer:
        """Adam over all trainable parameters of ``module`` (default ``self.model``), kept in
        one flat buffer: the module's parameters become views into it, so Adam and gradient
        clipping are a handful of tensor ops per step instead of a few per parameter (the
        difference is most of a small MLP's step time on CPU)."""
        module = module if module is not None else self.model
        params = [p for p in module.parameters() if p.requires_grad]
        flat = torch.zeros(sum(p.numel() for p in params), device=self.device, dtype=params[0].dtype)
        off = 0
        for p in params:
            n = p.numel()
            flat[off:off + n].copy_(p.data.reshape(-1))
            p.data = flat[off:off + n].view_as(p)
            off += n
        self._params, self._flat = params, flat
        return torch.optim.Adam([flat], lr=lr, eps=eps)

    def on_train_batch_end(self, batch: Dict[str, torch.Tensor]) -> Dict[str, float]:
        """Called by the Learner after all epochs on a train batch (schedules, stats)."""
        return {}

    def set_progress(self, frac: float) -> None:
        """Schedules (set by the UpdateSchedules operator): ``frac`` in [0, 1] of the horizon
        done (clipped). With ``<algo>.lr_schedule=linear`` the learning rate becomes
        ``<algo>.lr * (1 - frac)``; other schedules are the algorithm's own."""
        if getattr(self.config, "lr_schedule", "constant") == "linear":
            lr = self.config.lr * (1.0 - min(max(frac, 0.0), 1.0))
            for g in self.optimizer.param_groups:
                g["lr"] = lr

    # ---- weights and state ----------------------------------------------------------------
    def get_weights(self) -> Dict[str, np.ndarray]:
        if self.model is None:
            return {}
        return {k: v.detach().cpu().numpy().copy() for k, v in self.model.state_dict().items()}

    def set_weights(self, weights: Dict[str, np.ndarray]) -> None:
        if self.model is None:
            return
        self.model.load_state_dict({k: torch.as_tensor(np.array(v)) for k, v in weights.items()})

    def get_state(self) -> Dict[str, Any]:
        """Weights, optimizer state, update count and RNG states (for exact resume)."""
        return {"weights": self.get_weights(),
                "optimizer": self.optimizer.state_dict() if self.optimizer is not None else None,
                "num_updates": self.num_updates,
                "generator": self.generator.get_state(),
                "np_random": self.np_random.bit_generator.state}

    def set_state(self, state: Dict[str, Any]) -> None:
        self.set_weights(state["weights"])
        if self.optimizer is not None and state.get("optimizer") is not None:
            self.optimizer.load_state_dict(state["optimizer"])
        self.num_updates = int(state.get("num_updates", 0))
        if state.get("generator") is not None:
            self.generator.set_state(state["generator"])
        if state.get("np_random") is not None:
            self.np_random.bit_generator.state = state["np_random"]


def to_tensor(x: Any, device: Any = "cpu") -> torch.Tensor:
    """A tensor of ``x`` on ``device``; read-only arrays (as Ray returns them) are copied."""
    a = np.asarray(x)
    if not a.flags.writeable:
        a = a.copy()
    return torch.as_tensor(a, device=device)


def _add_batch_axis(obs: Any) -> Any:
    if isinstance(obs, dict):
        return {k: _add_batch_axis(v) for k, v in obs.items()}
    if isinstance(obs, tuple):
        return tuple(_add_batch_axis(v) for v in obs)
    return np.asarray(obs)[None]


def _batch_len(obs: Any) -> int:
    if isinstance(obs, dict):
        return _batch_len(next(iter(obs.values())))
    if isinstance(obs, tuple):
        return _batch_len(obs[0])
    return int(np.shape(obs)[0])


class RandomPolicy(Policy):
    """Uniform over the legal actions (masks respected); learns nothing."""

    def compute_actions_encoded(self, obs, mask=None, explore=True):
        b = obs.shape[0]
        if self.dist.kind == "cat":
            n = self.dist.num_outputs
            if mask is not None:
                self.check_mask(mask)
                scores = self.np_random.random((b, n)) * mask + mask
                acts = scores.argmax(1)
            else:
                acts = self.np_random.integers(0, n, size=b)
            return acts.astype(np.int64), {}
        if self.dist.kind == "multicat":
            return np.stack([self.np_random.integers(0, n, size=b) for n in self.dist.nvec], 1), {}
        if self.dist.kind == "bern":
            return self.np_random.integers(0, 2, size=(b, self.dist.num_outputs)), {}
        if self.dist.kind == "gauss":
            return self.np_random.uniform(-1, 1, size=(b, self.dist.dim)).astype(np.float32), {}
        return self.np_random.standard_normal((b, self.dist.dim)).astype(np.float32), {}

    def loss(self, batch):
        raise RuntimeError("the random policy does not learn")
