"""The numpy mirror of :class:`ActorCritic` and of categorical/Gaussian sampling, for acting
on CPU rollout workers (a few rows per call, where torch's per-op dispatch dominates)."""
from __future__ import annotations

import math
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np
from torch import nn

from flowkit.core._distributions import ActionDist
from flowkit.core._models import _ACT_FN, ActorCritic, TwinMLP

_NP_ACT: Dict[str, Callable[[np.ndarray], np.ndarray]] = {"tanh": np.tanh, "relu": lambda x: np.maximum(x, 0.0, out=x)}


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
    else (gSDE, CNNs, a shared trunk, other activations or action spaces, a subclassed model) and
    the policy keeps its torch path.
    """
    twin: Optional[Tuple[Any, ...]]  # TwinMLP: w0, b0, ws, bs, wa, ba, wb, bb, hidden
    pi: List[Tuple[np.ndarray, np.ndarray]]
    vf: List[Tuple[np.ndarray, np.ndarray]]

    def __init__(self, model: "ActorCritic", activation: str):
        self.model, self.act = model, _NP_ACT[activation]
        self._ptrs: Tuple[int, ...] = ()
        self._bind()

    @classmethod
    def build(cls, model: "ActorCritic", dist: "ActionDist", activation: str) -> Optional["NumpyActorCritic"]:
        if (type(model) is not ActorCritic or dist.kind not in ("cat", "gauss", "gauss_unbounded")
                or model.sde_log_std is not None
                or activation not in _NP_ACT or any(p.device.type != "cpu" for p in model.parameters())):
            return None
        if model.twin is not None:
            if type(model.twin) is not TwinMLP or model.twin.act is not _ACT_FN[activation]:
                return None
        elif model.shared or not all(cls._mlp_layers(s) for s in (model.pi, model.vf)):
            return None
        return cls(model, activation)

    @staticmethod
    def _mlp_layers(seq: nn.Module) -> List[nn.Linear]:
        """The Linear layers of a (nested) Sequential of Linear + Tanh/ReLU, else []."""
        out: List[nn.Linear] = []
        for m in seq.modules():
            if isinstance(m, nn.Sequential):
                continue
            if type(m) is nn.Linear:
                out.append(m)
            elif type(m) not in (nn.Tanh, nn.ReLU):
                return []
        return out

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
            self.pi = [(v(lin.weight).T, v(lin.bias)) for lin in self._mlp_layers(m.pi)]
            self.vf = [(v(lin.weight).T, v(lin.bias)) for lin in self._mlp_layers(m.vf)]
        self._watch = [*m.parameters(), *m.buffers()]
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
        gumbel = -np.log(-np.log(np.clip(rng.random(lp.shape, dtype=np.float32), 1e-20, 1.0))) if explore else 0.0
        a = (lp + gumbel).argmax(-1)
        return a.astype(np.int64), np.take_along_axis(lp, a[:, None], -1)[:, 0].astype(np.float32)
    mean, log_std = inputs[:, :dist.dim], inputs[:, dist.dim:]
    eps = rng.standard_normal(mean.shape, dtype=np.float32) if explore else np.zeros_like(mean)
    a = mean + np.exp(log_std) * eps
    logp = (-0.5 * eps * eps - log_std - np.float32(0.5 * math.log(2 * math.pi))).sum(-1)
    return a.astype(np.float32), logp.astype(np.float32)

