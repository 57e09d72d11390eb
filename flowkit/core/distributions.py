"""Action distributions by space (:class:`ActionDist`): Discrete -> categorical (masked
logits), MultiDiscrete -> independent categoricals, MultiBinary -> independent Bernoullis,
Box -> diagonal Gaussian with a state-independent log-std; the sampled (unbounded) value is
what the loss sees, the env receives it scaled from [-1, 1] to the bounds and then clipped.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, List, Optional, Tuple

import gymnasium as gym
import numpy as np

from flowkit.core.encoders import NumpyOps, SpaceError

if TYPE_CHECKING:
    import torch
    from torch import nn
else:  # imported on first use: ActionDist's numpy side (spaces, to_env) serves torch-free rollout workers
    class _Lazy:
        def __init__(self, key: str, name: str):
            self._key, self._name = key, name

        def __getattr__(self, attr: str):  # the module replaces this stand-in on first use
            import importlib
            mod = globals()[self._key] = importlib.import_module(self._name)
            return getattr(mod, attr)
    torch, nn = _Lazy("torch", "torch"), _Lazy("nn", "torch.nn")

__all__ = ["ActionDist"]


class ActionDist:
    """Distribution family for an action space, over the network's ``inputs``
    (float32[B, num_inputs]): logits, or Gaussian ``(mean, log_std)``.

    ``sample``/``logp``/``entropy``/``kl`` work on torch tensors; ``to_env`` maps sampled
    actions (numpy) into the env's space (Box: scale [-1,1] to [low, high], then clip).
    """

    def __init__(self, space: gym.Space):
        self.space = space
        if isinstance(space, gym.spaces.Discrete):
            self.kind, self.num_outputs, self.nvec, self.start = "cat", int(space.n), [int(space.n)], int(space.start)
        elif isinstance(space, gym.spaces.MultiDiscrete):
            self.nvec = [int(n) for n in np.asarray(space.nvec).reshape(-1)]
            self.kind, self.num_outputs = "multicat", int(sum(self.nvec))
        elif isinstance(space, gym.spaces.MultiBinary):
            self.kind, self.num_outputs = "bern", int(np.prod(space.n))
        elif isinstance(space, gym.spaces.Box):
            bounded = np.all(np.isfinite(space.low)) and np.all(np.isfinite(space.high))
            self.kind = "gauss" if bounded else "gauss_unbounded"
            self.dim = self.num_outputs = int(np.prod(space.shape))  # the mean; log_std is a separate parameter
            self.low, self.high = (np.asarray(b, np.float32).reshape(-1) for b in (space.low, space.high))
            self.is_int = np.issubdtype(space.dtype, np.integer)
            self.shape = space.shape
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

    def _parts(self, inputs, mask=None):
        """The logits of each categorical: masked (Discrete) or split (MultiDiscrete)."""
        return [self.masked(inputs, mask)] if self.kind == "cat" else torch.split(inputs, self.nvec, dim=-1)

    def sample(self, inputs: torch.Tensor, mask=None, explore=True, generator=None) -> torch.Tensor:
        if self.kind == "cat":
            logits = self.masked(inputs, mask)
            return (_gumbel(logits, generator) if explore else logits).argmax(-1)
        if self.kind == "multicat":
            return torch.stack([(_gumbel(lg, generator) if explore else lg).argmax(-1)
                                for lg in self._parts(inputs)], -1)
        if self.kind == "bern":
            return (torch.rand(inputs.shape, generator=generator) < torch.sigmoid(inputs) if explore
                    else inputs > 0).to(torch.int64)
        mean, log_std = inputs[..., :self.dim], inputs[..., self.dim:]
        return mean + torch.exp(log_std) * torch.randn(mean.shape, generator=generator) if explore else mean

    def sample_logp(self, inputs, mask=None, explore=True, generator=None) -> Tuple[torch.Tensor, torch.Tensor]:
        """``(actions, logp)``; one log-softmax for categoricals (Gumbel-max sampling)."""
        if self.kind != "cat":
            a = self.sample(inputs, mask, explore, generator)
            return a, self.logp(inputs, a, mask)
        lp = torch.log_softmax(self.masked(inputs, mask), -1)
        a = (_gumbel(lp, generator) if explore else lp).argmax(-1)
        return a, lp.gather(-1, a.unsqueeze(-1)).squeeze(-1)

    def logp(self, inputs, actions, mask=None) -> torch.Tensor:
        if self.kind == "cat":
            lp = torch.log_softmax(self.masked(inputs, mask), -1)
            return lp.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)
        if self.kind == "multicat":
            a = actions.long()
            return _total([torch.log_softmax(lg, -1).gather(-1, a[..., i:i + 1]).squeeze(-1)
                           for i, lg in enumerate(self._parts(inputs))])
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
            return logp, -(p * src.masked_fill(p == 0, 0.0)).sum(-1)
        ent_in = inputs if entropy_grad else inputs.detach()
        return self.logp(inputs, actions, mask), self.entropy(ent_in, mask)

    def entropy(self, inputs, mask=None) -> torch.Tensor:
        if self.kind in ("cat", "multicat"):
            ps = [(lp.exp(), lp) for lp in (torch.log_softmax(lg, -1) for lg in self._parts(inputs, mask))]
            return 0 - _total([(p * lp.masked_fill(p == 0, 0.0)).sum(-1) for p, lp in ps])
        if self.kind == "bern":
            p = torch.sigmoid(inputs)
            return nn.functional.binary_cross_entropy_with_logits(inputs, p, reduction="none").sum(-1)
        log_std = inputs[..., self.dim:]
        return (log_std + 0.5 * math.log(2 * math.pi * math.e)).sum(-1)

    def kl(self, old, new, mask=None) -> torch.Tensor:
        """KL(old || new) per row."""
        if self.kind in ("cat", "multicat"):
            lps = [(torch.log_softmax(a, -1), torch.log_softmax(b, -1))
                   for a, b in zip(self._parts(old, mask), self._parts(new, mask))]
            return _total([(la.exp() * (la - lb)).sum(-1) for la, lb in lps])
        if self.kind == "bern":
            pa, pb = torch.sigmoid(old), torch.sigmoid(new)
            eps = 1e-8
            return (pa * (torch.log(pa + eps) - torch.log(pb + eps))
                    + (1 - pa) * (torch.log(1 - pa + eps) - torch.log(1 - pb + eps))).sum(-1)
        mo, lo = old[..., :self.dim], old[..., self.dim:]
        mn, ln = new[..., :self.dim], new[..., self.dim:]
        return (ln - lo + (torch.exp(2 * lo) + (mo - mn).pow(2)) / (2 * torch.exp(2 * ln)) - 0.5).sum(-1)

    def to_env(self, actions: Any, ops: Any = NumpyOps) -> Any:
        """Sampled actions (batched) -> values inside the env's action space, in ``ops``' array
        operations (numpy on workers; ``flowkit.export.TorchOps`` traces this same code)."""
        if self.kind == "cat":
            return ops.cast(actions, np.int64) + self.start
        if self.kind in ("multicat", "bern"):
            return ops.cast(actions, self.space.dtype)
        a = actions.reshape(actions.shape[0], -1)
        low, high = ops.const(self.low), ops.const(self.high)
        if self.kind == "gauss":
            a = low + (a + 1.0) * 0.5 * (high - low)  # scale first...
        a = ops.clip(a, low, high)                    # ...then clip
        if self.is_int:
            a = ops.rint(a)
        return ops.cast(a, self.space.dtype).reshape(actions.shape[0], *self.shape)


def _gumbel(x: torch.Tensor, generator: Optional[torch.Generator]) -> torch.Tensor:
    """``x`` plus Gumbel noise: its argmax samples softmax(x) (the Gumbel-max trick)."""
    return x - torch.log(-torch.log(torch.rand(x.shape, generator=generator).clamp_(1e-20, 1.0)))


def _total(xs: List[torch.Tensor]) -> torch.Tensor:
    """``xs[0] + xs[1] + ...`` (the per-part sum of multi-categorical log-probs, entropies, KLs)."""
    return sum(xs[1:], xs[0])
