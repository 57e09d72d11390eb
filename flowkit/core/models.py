"""Networks: MLPs, the twin policy/value MLP, a small CNN, running observation
normalisation and the :class:`ActorCritic` model of the actor-critic algorithms."""
from __future__ import annotations

import math
from typing import Any, List, Optional, Sequence, Tuple, cast

import numpy as np
import torch
from torch import nn

from flowkit.core.activations import torch_function, torch_module
from flowkit.core.distributions import ActionDist
from flowkit.core.encoders import ObsEncoder

__all__ = ["ActorCritic", "FramesCNN", "ImpalaCNN", "RunningMeanStd", "SmallCNN", "TwinMLP", "acting_layout",
           "build_mlp", "build_trunk", "init_weights", "sde_std"]


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


def sde_std(log_std: torch.Tensor, use_expln: bool = False) -> torch.Tensor:
    """gSDE's std of each exploration-matrix entry from its learned log: ``exp(log_std)``, or
    with ``use_expln`` the paper's expln (Raffin et al. 2021, arXiv 2005.05719, appendix):
    ``exp(x)`` for x <= 0 and ``log(1 + x) + 1`` above, which keeps the std positive and grows
    it only logarithmically. Same shape as ``log_std``."""
    if not use_expln:
        return torch.exp(log_std)
    pos = log_std > 0
    return torch.where(pos, torch.log1p(torch.where(pos, log_std, torch.zeros_like(log_std))) + 1.0,
                       torch.exp(torch.where(pos, torch.zeros_like(log_std), log_std)))


def init_weights(module: nn.Module, model_cfg: Any) -> nn.Module:
    """``model.init`` applied to ``module`` (in place; returned): ``auto`` and ``orthogonal``
    leave the networks as built (:func:`build_mlp` and :class:`TwinMLP`: orthogonal weights with
    gain sqrt(2) for hidden layers and each head's own gain, zero biases, Andrychowicz et al.
    2021, arXiv 2006.05990; a network with an init of its own, DQN's Q-network, keeps it under
    ``auto`` and takes the orthogonal one under ``orthogonal``); ``default`` re-initialises every ``nn.Linear`` and ``nn.Conv2d`` with PyTorch's own
    ``reset_parameters`` (weights and biases ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)); an LSTM's
    or GRU's ~ U(-1/sqrt(hidden), 1/sqrt(hidden))) and every
    :class:`TwinMLP` the same way (:meth:`TwinMLP.reset_default`): SB3's ``ortho_init=False``,
    and what SB3's SAC and TD3 always use. Other parameters (log-stds) keep their values.
    Draws from torch's global generator (seeded by the policy). ``model.init``'s values are
    checked with the config (:class:`flowkit.config.ModelConfig`).
    """
    if str(model_cfg.init) == "default":
        for m in module.modules():
            if isinstance(m, TwinMLP):
                m.reset_default()
            elif isinstance(m, (nn.Linear, nn.Conv2d, nn.RNNBase)):  # RNNBase: LSTM, GRU (model.recurrent)
                m.reset_parameters()
    return module


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

    def reset_default(self) -> None:
        """PyTorch's default init of ``nn.Linear`` for every layer: weights and biases ~
        U(-1/sqrt(fan_in), 1/sqrt(fan_in)), fan_in the layer's input size (``model.init=default``)."""
        layers = ([(self.w0, self.b0)] if self.hidden else []) + list(zip(self.ws, self.bs, strict=True)) + [
            (self.wa, self.ba), (self.wb, self.bb)]
        with torch.no_grad():
            for w, b in layers:
                bound = 1.0 / math.sqrt(w.shape[1]) if w.shape[1] > 0 else 0.0  # (2, d_in, d_out) or (out, in)
                nn.init.uniform_(w, -bound, bound)
                nn.init.uniform_(b, -bound, bound)

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


class FramesCNN(nn.Module):
    """The base of the image networks: ``self.net``, an ``nn.Sequential`` whose first module is a
    ``nn.Conv2d``, over images ``shape`` (C, H, W); ``out_dim`` its flat output size.

    ``forward(x: uint8[B, C, H, W] or float32[B, C, H, W]) -> float32[B, out_dim]``: uint8
    frames are scaled to [0, 1] here, on the device the network lives on, so that observations
    travel and sit in replay as bytes (the scaling folded into the first convolution's weights:
    ``conv(x / 255, W) = conv(x, W / 255)`` with zero padding, no pass over the frames); float
    images are taken as they are."""

    channels_last_frames = True  # (Policy.prepare_batch lays a train batch's frames out for it once)

    def __init__(self, net: nn.Sequential, shape: Sequence[int]):
        super().__init__()
        self.net = net
        self._rest = tuple(self.net)[1:]  # (a plain tuple: not registered twice)
        with torch.no_grad():
            self.out_dim = int(self.net(torch.zeros(1, *shape)).shape[1])

    def forward(self, x):
        if x.dtype == torch.uint8:
            c = cast(nn.Conv2d, self.net[0])
            if x.device.type == "cpu" or c.weight.is_contiguous(memory_format=torch.channels_last):
                # channels-last convolutions (oneDNN's fast layout on CPU; acting_layout's weights):
                # the bytes reordered here, not the floats inside the conv. Learning on CPU: a
                # Nature CNN's forward and backward at 256 frame stacks 17-22% faster with the
                # weights left as they are (bench/pong_ppo_sb3.py)
                x = x.contiguous(memory_format=torch.channels_last)
            x = nn.functional.conv2d(x.float(), c.weight * (1.0 / 255.0), c.bias, c.stride, c.padding, c.dilation)
            for m in self._rest:
                x = m(x)
            return x
        return self.net(x)


class SmallCNN(FramesCNN):
    """Conv(32, 8, s4) -> Conv(64, 4, s2) -> Conv(64, 3, s1) -> flatten, ReLU after each: the
    Nature CNN of Mnih et al. 2015 (Nature 518, "Methods: model architecture") for images of
    36 pixels or more a side (84x84: 3136 features), with kernels shrunk for smaller images
    (``model.cnn=nature``; inputs as :class:`FramesCNN`)."""

    def __init__(self, shape: Sequence[int]):
        c, h, w = shape
        big = min(h, w) >= 36
        super().__init__(nn.Sequential(
            nn.Conv2d(c, 32, 8 if big else 3, 4 if big else 1), nn.ReLU(),
            nn.Conv2d(32, 64, 4 if big else 3, 2 if big else 1), nn.ReLU(),
            nn.Conv2d(64, 64, 3, 1), nn.ReLU(), nn.Flatten()), shape)


class ResidualBlock(nn.Module):
    """``x + conv(relu(conv(relu(x))))``, two 3x3 convolutions of ``channels`` with padding 1
    (IMPALA's residual block, Espeholt et al. 2018, Figure 3)."""

    def __init__(self, channels: int):
        super().__init__()
        self.conv0 = nn.Conv2d(channels, channels, 3, 1, 1)
        self.conv1 = nn.Conv2d(channels, channels, 3, 1, 1)

    def forward(self, x):
        return x + self.conv1(torch.relu(self.conv0(torch.relu(x))))


class ImpalaCNN(FramesCNN):
    """The "deep" network of IMPALA (Espeholt et al. 2018, arXiv 1802.01561, Figure 3, right)
    without its fully connected layer: 3 stacks of [Conv 3x3 s1 (padding 1) -> MaxPool 3x3 s2
    (padding 1) -> 2 :class:`ResidualBlock`], channels 16, 32, 32, then ReLU and flatten
    (84x84: 32 x 11 x 11 = 3,872 features). The paper's 256-unit ReLU layer is
    ``model.hidden_sizes=[256]`` with ``model.activation=relu`` after it, as the Nature CNN's
    512 (``model.cnn=impala``; inputs as :class:`FramesCNN`). Weights start from PyTorch's
    default init."""

    channels = (16, 32, 32)

    def __init__(self, shape: Sequence[int]):
        layers: List[nn.Module] = []
        c_in = shape[0]
        for c in self.channels:
            layers += [nn.Conv2d(c_in, c, 3, 1, 1), nn.MaxPool2d(3, 2, 1), ResidualBlock(c), ResidualBlock(c)]
            c_in = c
        super().__init__(nn.Sequential(*layers, nn.ReLU(), nn.Flatten()), shape)


CNNS = {"nature": SmallCNN, "impala": ImpalaCNN}


def acting_layout(module: nn.Module) -> nn.Module:
    """``module`` (in place; returned) with its weights stored for fast CPU inference on small
    batches, the functions unchanged: ``nn.Conv2d`` weights channels-last (oneDNN's direct
    convolutions, about 2x faster than NCHW at a rollout worker's 8 frame stacks) and ``nn.Linear``
    weights stored transposed (``x @ W.T`` then multiplies by a contiguous matrix: about 3x faster
    for the Nature CNN's 3136x512 layer at 8 rows). ``load_state_dict`` copies new weights into
    these layouts, so rollout workers keep them across weight syncs. Not for a learner's module:
    its optimizer keeps the parameters as views of one flat buffer."""
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, nn.Conv2d):
                m.weight.data = m.weight.data.contiguous(memory_format=torch.channels_last)
            elif isinstance(m, nn.Linear):
                m.weight.data = m.weight.data.t().contiguous().t()
    return module


def build_trunk(encoder: ObsEncoder, hidden: Sequence[int], activation: str,
                cnn_name: str = "nature") -> Tuple[nn.Module, int]:
    """Encoded observation -> features: the CNN ``cnn_name`` (images: ``model.cnn``, a key of
    :data:`CNNS`) then MLP ``hidden``. Returns (module, dim).

    Raises:
        ValueError: an unknown ``cnn_name`` for image observations."""
    if encoder.is_image and cnn_name not in CNNS:
        raise ValueError(f"model.cnn={cnn_name!r} is not one of {', '.join(CNNS)}")
    cnn = [CNNS[cnn_name](encoder.shape)] if encoder.is_image else []
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
    that layer's output (detached, as Stable-Baselines3 by default; ``sde_learn_features``: not
    detached, the loss then trains the features through the std too, SB3's ``learn_features``):
    the marginal std of the action ``mean(s) + z(s) @ W`` with W ~ N(0, exp(sde_log_std)^2)
    held between resamples (``sde_expln``: :func:`sde_std`'s expln in place of exp, SB3's
    ``use_expln``).

    ``forward(obs float32[B, *shape]) -> (dist_inputs float32[B, k], value float32[B])``."""

    def __init__(self, encoder: ObsEncoder, dist: ActionDist, model_cfg: Any, normalize_obs: bool = False,
                 log_std_init: float = 0.0, twin: bool = True, normalize_rewards: bool = False,
                 use_sde: bool = False, sde_expln: bool = False, sde_learn_features: bool = False):
        super().__init__()
        self.sde_expln, self.sde_learn_features = bool(sde_expln), bool(sde_learn_features)
        hidden, act = list(model_cfg.hidden_sizes), model_cfg.activation
        cnn = str(model_cfg.cnn)
        self.obs_rms = RunningMeanStd(encoder.shape) if normalize_obs else None
        self.ret_rms = RunningMeanStd(()) if normalize_rewards else None
        self.shared = bool(model_cfg.shared_value_network)
        self.twin: Optional[TwinMLP] = None
        if twin and not self.shared and not encoder.is_image:
            # separate policy and value MLPs, evaluated as one TwinMLP (fewer kernel launches)
            self.twin = TwinMLP(encoder.shape[0], hidden, act, dist.num_outputs, 1, 0.01, 1.0)
            d = hidden[-1] if hidden else encoder.shape[0]
        elif self.shared:
            self.trunk, d = build_trunk(encoder, hidden, act, cnn)
            self.pi_head = build_mlp(d, [], act, dist.num_outputs, 0.01)
            self.vf_head = build_mlp(d, [], act, 1, 1.0)
        else:
            pt, d = build_trunk(encoder, hidden, act, cnn)
            self.pi = nn.Sequential(pt, build_mlp(d, [], act, dist.num_outputs, 0.01))
            vt, d = build_trunk(encoder, hidden, act, cnn)
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
        if self.sde_log_std is not None:  # gSDE: var_j = sum_i z_i^2 std_ij^2
            zf = z if self.sde_learn_features else z.detach()
            var = zf.pow(2) @ sde_std(self.sde_log_std, self.sde_expln).pow(2)
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

