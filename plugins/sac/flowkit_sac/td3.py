"""Twin Delayed DDPG (Fujimoto, van Hoof and Meger 2018, "Addressing Function Approximation
Error in Actor-Critic Methods", ICML, arXiv 1802.09477), for Box actions.

Math, top to bottom (algorithm 1 of the paper; actions live in [-1, 1] and are scaled to the
Box bounds on the way to the env):
    Deterministic actor: mu(s) = tanh(f(s)). Acting: a = clip(mu(s) + N(0, sigma_explore^2), -1, 1)
        (greedy: mu(s)); uniform in [-1, 1] until the first trained weights reach the worker.
    Target policy smoothing (eq. 14-15):
        a' = clip(mu_targ(s') + clip(eps, -c, c), -1, 1),  eps ~ N(0, sigma_target^2)
    Clipped double-Q target (eq. 10):  y = r + gamma (1 - terminated) min_j Q_targ_j(s', a')
    Critic loss:  J_Q = sum_j mean (Q_j(s, a) - y)^2
    Delayed policy updates (section 5.2): every ``policy_delay``-th gradient step also
        J_mu = -mean Q_1(s, mu(s))   (deterministic policy gradient through Q_1 only)
    and then the targets (critics and actor) move: theta_targ <- (1 - tau) theta_targ + tau theta.

One gradient step is one backward pass over the summed losses and one Adam step over one flat
buffer split in two Adams (critics; actor): the actor loss reaches Q_1 through its input only
(critic parameters enter it as constants), and on the steps without a policy update only the
critics' Adam steps (the actor's moments and step count stay as they were).
"""
from __future__ import annotations

from typing import Dict, Tuple

import torch
from torch import nn

from flowkit.core import batch as sb
from flowkit.core import build_mlp, loss_stats
from flowkit_sac import TD3_REF
from flowkit_sac._common import OffPolicyActorCritic, OffPolicyAlgorithm, twin_critic


def smoothed_target_action(mu_next: torch.Tensor, noise: torch.Tensor, noise_clip: float) -> torch.Tensor:
    """Target policy smoothing: ``clip(mu_targ(s') + clip(noise, -c, c), -1, 1)``, float32[B, k]."""
    return (mu_next + noise.clamp(-noise_clip, noise_clip)).clamp(-1.0, 1.0)


def td3_targets(rewards: torch.Tensor, terminateds: torch.Tensor, gamma: float,
                q_next_target: torch.Tensor) -> torch.Tensor:
    """``y = r + gamma (1 - terminated) min_j Q_targ_j(s', a')``.

    Args:
        rewards: float32[B]. terminateds: bool[B] (truncated rows bootstrap).
        q_next_target: float32[2, B], the twin target critics at (s', smoothed a').
    Returns:
        float32[B].
    """
    return rewards + gamma * (~terminateds.bool()).float() * q_next_target.min(0).values


class TD3Model(nn.Module):
    """``critic``: twin Q over [obs, action]; ``actor``: obs -> pre-tanh action float32[B, k]."""

    def __init__(self, obs_dim: int, act_dim: int, model_cfg):
        super().__init__()
        self.critic = twin_critic(obs_dim, act_dim, model_cfg)
        self.actor = build_mlp(obs_dim, list(model_cfg.hidden_sizes), model_cfg.activation, act_dim, 0.01)


class TD3Policy(OffPolicyActorCritic):
    """Deterministic actor with Gaussian exploration noise, twin critics, delayed actor and
    target updates, target policy smoothing. Override :meth:`loss` to make a variant."""

    model: TD3Model

    def __init__(self, observation_space, action_space, config, model_config=None, device="cpu",
                 seed=0, inference_only=False):
        super().__init__(observation_space, action_space, config, model_config, device, seed, inference_only)
        self.model = TD3Model(self.obs_dim, self.act_dim, self.model_config)
        self.finish_init(["critic", "actor"], segments=[["critic"], ["actor"]])

    def noise(self, like: torch.Tensor, std: float) -> torch.Tensor:
        return (std * torch.randn(like.shape[0], self.act_dim, generator=self.generator)).to(self.device)

    def act(self, obs, explore):
        mu = torch.tanh(self.model.actor(obs))
        return (mu + self.noise(obs, self.config.exploration_noise)).clamp(-1.0, 1.0) if explore else mu

    def loss(self, batch: Dict[str, torch.Tensor]) -> Tuple[torch.Tensor, Dict[str, float]]:
        cfg, m = self.config, self.model
        obs, next_obs = batch[sb.OBS], batch[sb.NEXT_OBS]
        assert self.target is not None, "loss runs on the learner's policy"
        with torch.no_grad():
            a_next = smoothed_target_action(torch.tanh(self.target["actor"](next_obs)),
                                            self.noise(next_obs, cfg.target_policy_noise), cfg.target_noise_clip)
            y = td3_targets(batch[sb.REWARDS].float(), batch[sb.TERMINATEDS], cfg.gamma,
                            self.q_values(next_obs, a_next, target=True))
        q = self.q_values(obs, batch[sb.ACTIONS].float())
        critic_loss = (q - y).pow(2).mean(-1).sum()
        # one Learner step per train batch: this is gradient step num_updates + 1
        policy_step = (self.num_updates + 1) % cfg.policy_delay == 0
        assert self.optimizer is not None
        self.optimizer.active = None if policy_step else [0]
        if not policy_step:
            return critic_loss, loss_stats(critic_loss=critic_loss, mean_q=q.mean())
        actor_loss = -self.q_values(obs, torch.tanh(m.actor(obs)), detach_params=True)[0].mean()
        return critic_loss + actor_loss, loss_stats(critic_loss=critic_loss, mean_q=q.mean(), actor_loss=actor_loss)


class TD3(OffPolicyAlgorithm, ref=TD3_REF):
    """TD3: replay plan of :class:`OffPolicyAlgorithm`; targets move with each delayed actor
    update (every ``policy_delay`` gradient steps)."""

    policy_class, target_update_key = TD3Policy, "policy_delay"
