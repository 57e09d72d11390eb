"""Networks: MLPs, the twin policy/value MLP, a small CNN, running observation
normalisation and the :class:`ActorCritic` model of the actor-critic algorithms."""
from __future__ import annotations

import math
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import nn

from flowkit.core._distributions import ActionDist
from flowkit.core._encoders import ObsEncoder
from flowkit.core.activations import torch_function, torch_module


class RunningMeanStd(nn.Module):
    """Running mean and variance of encoded observations (Chan et al. parallel update);
    ``normalize(x) = clip((x - mean) / sqrt(var + 1e-8), -clip, clip)``."""
    mean: torch.Tensor
    var: torch.Tensor
    count: torch.Tensor

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

    def scale(self, x: np.ndarray) -> np.ndarray:
        """``clip(x / sqrt(var + 1e-8), -clip, clip)`` in numpy, not centred (reward
        normalisation divides rewards by the std of the discounted returns)."""
        return np.clip(x / np.sqrt(self.var.double().cpu().numpy() + 1e-8), -self.clip, self.clip)


def build_mlp(in_dim: int, hidden: Sequence[int], activation: str, out_dim: Optional[int] = None,
              out_gain: float = 1.0) -> nn.Sequential:
    """Linear layers with orthogonal init (gain sqrt(2) hidden, ``out_gain`` last)."""
    torch_module(activation)  # ValueError naming model.activation before any layer is built
    layers: List[nn.Module] = []
    for d, h in zip([in_dim, *hidden], hidden, strict=False):
        layers += [_linear(d, h, math.sqrt(2)), torch_module(activation)]
    if out_dim is not None:
        layers.append(_linear(hidden[-1] if hidden else in_dim, out_dim, out_gain))
    return nn.Sequential(*layers)


def _linear(d_in: int, d_out: int, gain: float) -> nn.Linear:
    lin = nn.Linear(d_in, d_out)
    nn.init.orthogonal_(lin.weight, gain)
    nn.init.zeros_(lin.bias)
    return lin


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
        self.act = torch_function(activation)
        self.hidden = list(hidden)

        def ortho(rows: int, cols: int, gain: float) -> torch.Tensor:
            w = torch.empty(rows, cols)
            nn.init.orthogonal_(w, gain)
            return w
        g, d = math.sqrt(2), in_dim
        if self.hidden:
            h0 = self.hidden[0]
            self.w0 = nn.Parameter(torch.cat([ortho(h0, in_dim, g), ortho(h0, in_dim, g)]))
            self.b0 = nn.Parameter(torch.zeros(2 * h0))
            d = h0
        self.ws, self.bs = nn.ParameterList(), nn.ParameterList()
        for h in self.hidden[1:]:
            # bmm layout: (2, d_in, d_out), i.e. the transposed nn.Linear weight
            self.ws.append(nn.Parameter(torch.stack([ortho(h, d, g).T, ortho(h, d, g).T]).contiguous()))
            self.bs.append(nn.Parameter(torch.zeros(2, 1, h)))
            d = h
        self.wa, self.ba = nn.Parameter(ortho(out_a, d, gain_a)), nn.Parameter(torch.zeros(out_a))
        self.wb, self.bb = nn.Parameter(ortho(out_b, d, gain_b)), nn.Parameter(torch.zeros(out_b))

    def features(self, x: torch.Tensor, detach_params: bool = False) -> Tuple[torch.Tensor, torch.Tensor]:
        """The last hidden layer of each MLP: ``(float32[B, h], float32[B, h])`` (``x`` twice
        without hidden layers). ``detach_params``: see :meth:`forward`."""
        def p(t: Optional[torch.Tensor]) -> torch.Tensor:
            assert t is not None
            return t.detach() if detach_params else t
        if not self.hidden:
            return x, x
        h = self.act(nn.functional.linear(x, p(self.w0), p(self.b0)))
        h = h.view(x.shape[0], 2, self.hidden[0]).transpose(0, 1)
        for i in range(len(self.hidden) - 1):
            h = self.act(torch.baddbmm(p(self.bs._parameters[str(i)]), h, p(self.ws._parameters[str(i)])))
        return h[0], h[1]

    def forward(self, x: torch.Tensor, detach_params: bool = False) -> Tuple[torch.Tensor, torch.Tensor]:
        """``detach_params``: the parameters enter as constants, the gradient reaches ``x`` only
        (SAC's and TD3's actor loss through the critic, without a critic weight gradient)."""
        ha, hb = self.features(x, detach_params)
        if detach_params:
            return (nn.functional.linear(ha, self.wa.detach(), self.ba.detach()),
                    nn.functional.linear(hb, self.wb.detach(), self.bb.detach()))
        return nn.functional.linear(ha, self.wa, self.ba), nn.functional.linear(hb, self.wb, self.bb)


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
    cnn = [SmallCNN(encoder.shape)] if encoder.is_image else []
    d = cnn[0].out_dim if cnn else encoder.shape[0]
    return nn.Sequential(*cnn, build_mlp(d, hidden, activation)), (hidden[-1] if hidden else d)


class ActorCritic(nn.Module):
    """Policy and value networks for actor-critic algorithms (PPO, IMPALA): separate MLPs
    (evaluated as one :class:`TwinMLP` when ``twin``), or a shared trunk with
    ``model.shared_value_network``; images go through a CNN trunk; optional running
    observation normalisation; optional running statistics of discounted returns for reward
    normalisation (``ret_rms``: not used by ``forward``, kept here so that they travel with the
    weights to the workers and into checkpoints); a state-independent log-std for Gaussian actions,
    or with ``use_sde`` the state-dependent std of gSDE (Raffin et al. 2021, arXiv 2005.05719):
    a parameter ``sde_log_std`` float32[h, k] (h: the policy's last hidden layer, k: action dims)
    and per row ``std_j(s) = sqrt(sum_i z_i(s)^2 exp(sde_log_std_ij)^2 + 1e-6)`` where ``z(s)`` is
    that layer's output (detached, as Stable-Baselines3 by default): the marginal std of the
    action ``mean(s) + z(s) @ W`` with W ~ N(0, exp(sde_log_std)^2) held between resamples.

    ``forward(obs float32[B, *shape]) -> (dist_inputs float32[B, k], value float32[B])``."""

    def __init__(self, encoder: ObsEncoder, dist: ActionDist, model_cfg: Any, normalize_obs: bool = False,
                 log_std_init: float = 0.0, twin: bool = True, normalize_rewards: bool = False,
                 use_sde: bool = False):
        super().__init__()
        hidden, act = list(model_cfg.hidden_sizes), model_cfg.activation
        self.obs_rms = RunningMeanStd(encoder.shape) if normalize_obs else None
        self.ret_rms = RunningMeanStd(()) if normalize_rewards else None
        self.shared = bool(model_cfg.shared_value_network)
        self.twin: Optional[TwinMLP] = None
        if twin and not self.shared and not encoder.is_image:
            # separate policy and value MLPs, evaluated as one TwinMLP (fewer kernel launches)
            self.twin = TwinMLP(encoder.shape[0], hidden, act, dist.num_outputs, 1, 0.01, 1.0)
            d = hidden[-1] if hidden else encoder.shape[0]
        elif self.shared:
            self.trunk, d = build_trunk(encoder, hidden, act)
            self.pi_head = build_mlp(d, [], act, dist.num_outputs, 0.01)
            self.vf_head = build_mlp(d, [], act, 1, 1.0)
        else:
            pt, d = build_trunk(encoder, hidden, act)
            self.pi = nn.Sequential(pt, build_mlp(d, [], act, dist.num_outputs, 0.01))
            vt, d = build_trunk(encoder, hidden, act)
            self.vf = nn.Sequential(vt, build_mlp(d, [], act, 1, 1.0))
        if use_sde and not dist.is_gauss:
            raise ValueError(f"use_sde needs Box actions, not {dist.space}")
        self.log_std = (nn.Parameter(torch.full((dist.num_outputs,), float(log_std_init)))
                        if dist.is_gauss and not use_sde else None)
        self.sde_log_std = nn.Parameter(torch.full((d, dist.num_outputs), float(log_std_init))) if use_sde else None

    def _norm(self, obs):
        return self.obs_rms(obs) if self.obs_rms is not None else obs

    def forward(self, obs: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """obs: float32[B, *shape] -> (dist_inputs float32[B, k], value float32[B])."""
        inputs, value, _ = self.forward_latent(obs)
        return inputs, value

    def forward_latent(self, obs: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(dist_inputs, value, z)``: :meth:`forward` and the policy's last hidden layer
        z float32[B, h] (gSDE's features)."""
        x = self._norm(obs)
        if self.twin is not None:
            z, hv = self.twin.features(x)
            logits = nn.functional.linear(z, self.twin.wa, self.twin.ba)
            value = nn.functional.linear(hv, self.twin.wb, self.twin.bb)
        elif self.shared:
            z = self.trunk(x)
            logits, value = self.pi_head(z), self.vf_head(z)
        else:
            z = self.pi[0](x)
            logits, value = self.pi[1](z), self.vf(x)
        return self._with_std(logits, z), value.squeeze(-1), z

    def _with_std(self, logits: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        if self.sde_log_std is not None:  # gSDE: var_j = sum_i z_i^2 exp(2 sde_log_std_ij)
            var = z.detach().pow(2) @ torch.exp(2.0 * self.sde_log_std)
            return torch.cat([logits, 0.5 * torch.log(var + 1e-6)], -1)
        return logits if self.log_std is None else torch.cat([logits, self.log_std.expand_as(logits)], -1)

    def policy(self, obs: torch.Tensor) -> torch.Tensor:
        """dist_inputs only: float32[B, k] (skips the value network where it is separate)."""
        if self.twin is not None or self.shared:
            return self.forward(obs)[0]
        z = self.pi[0](self._norm(obs))
        return self._with_std(self.pi[1](z), z)

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        x = self._norm(obs)
        if self.twin is not None:
            return self.twin(x)[1].squeeze(-1)
        return (self.vf_head(self.trunk(x)) if self.shared else self.vf(x)).squeeze(-1)

