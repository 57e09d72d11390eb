"""Soft Actor-Critic with automatic entropy tuning (Haarnoja et al. 2018, "Soft Actor-Critic
Algorithms and Applications", arXiv 1812.05905; first version arXiv 1801.01290), twin
critics as in TD3 (Fujimoto et al. 2018), for Box actions.

Math, top to bottom (equation numbers of arXiv 1812.05905; actions live in [-1, 1] and are
scaled to the Box bounds on the way to the env):
    Squashed Gaussian policy (appendix C, eq. 26): u = mu(s) + sigma(s) * eps, eps ~ N(0, I),
        a = tanh(u),  log pi(a|s) = sum_i [log N(u_i; mu_i, sigma_i) - log(1 - tanh(u_i)^2)],
        log(1 - tanh(u)^2) = 2 (log 2 - u - softplus(-2u)) (stable form); log sigma in [-20, 2].
    Soft Bellman target with the min of twin target critics (eq. 3, 5):
        a' ~ pi(.|s'),  y = r + gamma (1 - terminated) (min_j Q_targ_j(s', a') - alpha log pi(a'|s'))
    Critic loss (eq. 5):  J_Q = sum_j 0.5 mean (Q_j(s, a) - y)^2
    Actor loss (eq. 7, reparameterised, min of the twins):
        J_pi = mean (alpha log pi(a~|s) - min_j Q_j(s, a~)),  a~ = tanh(mu + sigma eps)
    Temperature (eq. 18), learned as log alpha:
        J(alpha) = -mean log alpha (log pi(a~|s) + H_target),  H_target = -dim(A) by default
    Targets: Q_targ <- (1 - tau) Q_targ + tau Q every target_update_freq gradient steps.
    gSDE (``use_sde``; Raffin et al. 2021, arXiv 2005.05719, section 3): the actor's last hidden
        features z(s) (as constants) and a learned log-std matrix S [h, k] give the state-dependent
        std sigma_j(s) = sqrt(sum_i z_i(s)^2 exp(2 S_ij)) of the same squashed Gaussian (eq. 5);
        acting uses u = mu(s) + z(s) theta, theta_ij ~ N(0, exp(2 S_ij)) held for
        ``sde_sample_freq`` steps (smooth, state-dependent exploration). As in SB3: ``use_expln``
        takes the std of theta's entries as expln(S) (exp below 0, log1p + 1 above) in place of
        exp(S), ``learn_features`` lets the loss reach z(s) through sigma, ``clip_mean`` clips
        mu(s) to [-clip_mean, clip_mean] (2 by default; 0: not).

One gradient step: the three losses are summed and take one backward pass and one Adam step
over one flat buffer (critics, actor, log alpha). The actor loss reaches the critics through
their input only (critic parameters enter it as constants) and the temperature loss through
log alpha only, so each part gets exactly its own gradient; Adam is elementwise, so this is
three Adams with one learning rate. Unlike implementations that step the critics first, the
actor loss of a step sees the critics from before that step's critic update (as RLlib's SAC).
Acting: a = tanh(u) sampled (explore) or tanh(mu) (greedy); uniform in [-1, 1] until the first
trained weights reach the worker (``learning_starts``).
"""
from __future__ import annotations

import math
from typing import Dict, Optional, Tuple

import torch
from torch import nn

from flowkit.core import batch as sb
from flowkit.core import build_mlp, loss_stats, sde_std
from flowkit_sac import SAC_REF
from flowkit_sac._common import OffPolicyActorCritic, OffPolicyAlgorithm, twin_critic

LOG_STD_MIN, LOG_STD_MAX = -20.0, 2.0
_LOG_2PI, _LOG_2 = math.log(2 * math.pi), math.log(2.0)


def squashed_gaussian(inputs: torch.Tensor, noise: Optional[torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor]:
    """Sample of a tanh-squashed diagonal Gaussian and its log-density.

    Args:
        inputs: float32[B, 2k], the mean and the log-std (clamped to [-20, 2]).
        noise: float32[B, k] standard normal draws eps; None: the mode, tanh(mean).
    Returns:
        ``(a float32[B, k] in (-1, 1), log pi(a) float32[B])`` (with noise None the log-density
        is that of eps = 0).
    """
    mean, log_std = inputs.chunk(2, -1)
    log_std = log_std.clamp(LOG_STD_MIN, LOG_STD_MAX)
    eps = torch.zeros_like(mean) if noise is None else noise
    u = mean + log_std.exp() * eps
    log_n = -0.5 * eps.pow(2) - log_std - 0.5 * _LOG_2PI
    log_det = 2.0 * (_LOG_2 - u - nn.functional.softplus(-2.0 * u))
    return torch.tanh(u), (log_n - log_det).sum(-1)


def sac_targets(rewards: torch.Tensor, terminateds: torch.Tensor, gamma: float, q_next_target: torch.Tensor,
                logp_next: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
    """Soft Bellman targets ``y = r + gamma (1 - terminated) (min_j Q_targ_j(s', a') - alpha log pi(a'|s'))``.

    Args:
        rewards: float32[B]. terminateds: bool[B] (truncated rows bootstrap).
        q_next_target: float32[2, B], the twin target critics at (s', a'), a' ~ pi(.|s').
        logp_next: float32[B], log pi(a'|s'). alpha: the temperature, a scalar tensor.
    Returns:
        float32[B].
    """
    v_next = q_next_target.min(0).values - alpha * logp_next
    return rewards + gamma * (~terminateds.bool()).float() * v_next


class SDEActor(nn.Module):
    """gSDE actor: obs -> (mean, log sigma(s)) float32[B, 2k] (the input of :func:`squashed_gaussian`),
    and :meth:`explore` for acting with a held noise matrix."""

    def __init__(self, obs_dim: int, act_dim: int, model_cfg, log_std_init: float, use_expln: bool = False,
                 learn_features: bool = False, clip_mean: float = 0.0):
        super().__init__()
        self.use_expln, self.learn_features, self.clip_mean = bool(use_expln), bool(learn_features), float(clip_mean)
        hidden = list(model_cfg.hidden_sizes)
        self.trunk = build_mlp(obs_dim, hidden, model_cfg.activation)
        self.mu = build_mlp(hidden[-1] if hidden else obs_dim, [], model_cfg.activation, act_dim, 0.01)
        self.log_std = nn.Parameter(torch.full((hidden[-1] if hidden else obs_dim, act_dim), float(log_std_init)))

    def mean(self, z: torch.Tensor) -> torch.Tensor:
        """The pre-tanh mean from the features z, clipped to +-``clip_mean`` (0: not)."""
        mu = self.mu(z)
        return mu.clamp(-self.clip_mean, self.clip_mean) if self.clip_mean > 0 else mu

    def std(self) -> torch.Tensor:
        """The std of theta's entries, float32[h, k] (exp, or expln with ``use_expln``)."""
        return sde_std(self.log_std, self.use_expln)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        z = self.trunk(obs)
        zf = z if self.learn_features else z.detach()
        var = zf.pow(2) @ self.std().pow(2)  # sum_i z_i^2 std_ij^2: float32[B, k]
        return torch.cat([self.mean(z), 0.5 * torch.log(var + 1e-12)], -1)

    def explore(self, obs: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
        """Pre-tanh actions mean(s) + z(s) theta, theta float32[B, h, k] (one matrix per row)."""
        z = self.trunk(obs)
        return self.mean(z) + torch.bmm(z.unsqueeze(1), theta).squeeze(1)


class SACModel(nn.Module):
    """``critic``: twin Q over [obs, action]; ``actor``: obs -> (mean, log_std) float32[B, 2k]
    (an :class:`SDEActor` with gSDE); ``temperature.log_alpha``: log of the temperature (trained
    only when it is tuned)."""

    def __init__(self, obs_dim: int, act_dim: int, model_cfg, cfg):
        super().__init__()
        self.critic = twin_critic(obs_dim, act_dim, model_cfg)
        self.actor = (SDEActor(obs_dim, act_dim, model_cfg, cfg.log_std_init, cfg.use_expln, cfg.learn_features,
                               cfg.clip_mean) if cfg.use_sde else
                      build_mlp(obs_dim, list(model_cfg.hidden_sizes), model_cfg.activation, 2 * act_dim, 0.01))
        # a submodule, so log alpha comes after the critic and the actor in the flat buffer
        self.temperature = nn.ParameterDict({"log_alpha": nn.Parameter(torch.tensor(math.log(cfg.initial_alpha)),
                                                                       requires_grad=cfg.tune_alpha)})

    @property
    def log_alpha(self) -> torch.Tensor:
        return self.temperature["log_alpha"]


class SACPolicy(OffPolicyActorCritic):
    """Squashed Gaussian actor, twin critics with Polyak targets, learned temperature.
    Override :meth:`loss` to make a variant."""

    model: SACModel

    def __init__(self, observation_space, action_space, config, model_config=None, device="cpu",
                 seed=0, inference_only=False):
        super().__init__(observation_space, action_space, config, model_config, device, seed, inference_only)
        self.model = SACModel(self.obs_dim, self.act_dim, self.model_config, config)
        te = config.target_entropy
        self.target_entropy = float(-self.act_dim if te is None else te)
        self.theta: Optional[torch.Tensor] = None  # gSDE noise matrices float32[B, h, k]
        self.sde_steps = 0
        self.finish_init(["critic"])

    def noise(self, like: torch.Tensor) -> torch.Tensor:
        return self.randn(like.shape[0], self.act_dim)

    def act(self, obs, explore):
        actor = self.model.actor
        if not (explore and isinstance(actor, SDEActor)):
            return squashed_gaussian(actor(obs), self.noise(obs) if explore else None)[0]
        freq = self.config.sde_sample_freq
        if self.theta is None or len(self.theta) != len(obs) or (freq > 0 and self.sde_steps % freq == 0):
            eps = torch.randn(len(obs), *actor.log_std.shape, generator=self.generator)
            self.theta = actor.std().detach() * eps
        self.sde_steps += 1
        return torch.tanh(actor.explore(obs, self.theta))

    def set_weights(self, weights):
        super().set_weights(weights)
        if self.config.sde_sample_freq == -1:
            self.theta = None

    @property
    def alpha(self) -> float:
        return float(self.model.log_alpha.detach().exp())

    def loss(self, batch: Dict[str, torch.Tensor]) -> Tuple[torch.Tensor, Dict[str, float]]:
        cfg, m = self.config, self.model
        obs, next_obs = batch[sb.OBS], batch[sb.NEXT_OBS]
        alpha = m.log_alpha.detach().exp()
        with torch.no_grad():
            a_next, logp_next = squashed_gaussian(m.actor(next_obs), self.noise(next_obs))
            y = sac_targets(batch[sb.REWARDS].float(), batch[sb.TERMINATEDS], cfg.gamma,
                            self.q_values(next_obs, a_next, target=True), logp_next, alpha)
        q = self.q_values(obs, batch[sb.ACTIONS].float())
        critic_loss = 0.5 * (q - y).pow(2).mean(-1).sum()
        a_pi, logp = squashed_gaussian(m.actor(obs), self.noise(obs))
        actor_loss = (alpha * logp - self.q_values(obs, a_pi, detach_params=True).min(0).values).mean()
        alpha_loss = -(m.log_alpha * (logp.detach() + self.target_entropy)).mean()
        loss = critic_loss + actor_loss + (alpha_loss if cfg.tune_alpha else 0.0)
        return loss, loss_stats(critic_loss=critic_loss, actor_loss=actor_loss, alpha_loss=alpha_loss, alpha=alpha,
                                mean_q=q.mean(), entropy=-logp.mean())


class SAC(OffPolicyAlgorithm, ref=SAC_REF):
    """SAC: replay plan of :class:`OffPolicyAlgorithm`, Polyak targets every
    ``target_update_freq`` gradient steps."""

    policy_class, target_update_key = SACPolicy, "target_update_freq"
