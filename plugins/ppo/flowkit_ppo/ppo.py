"""Proximal Policy Optimization (Schulman et al. 2017, arXiv 1707.06347) as a flowkit plugin.

Math, top to bottom (GAE is computed on the workers by core's ``compute_gae``):
    GAE (Schulman et al. 2016, arXiv 1506.02438, eq. 16):
        delta_t = r_t + gamma * V(s_{t+1}) * (1 - terminated_t) - V(s_t)
        A_t     = delta_t + gamma * lambda * nextnonterminal_t * A_{t+1}
    where V(s_{t+1}) at a truncation or a fragment cut is V(final / next observation), and
    nextnonterminal_t = 0 where the trajectory ends (terminated, truncated) or is cut.
    value_targets = A + V(s).
    Clipped surrogate (eq. 7): L_clip = -E[min(r_t A_t, clip(r_t, 1-eps, 1+eps) A_t)],
        r_t = exp(logp_new - logp_old), logp of the sampled (unclipped) action.
    Value loss: 0.5 * (V - value_targets)^2, optionally clipped around vf_preds.
    Loss = L_clip + vf_coef * L_vf - ent_coef * entropy (+ kl_coeff * KL, adaptive).
With ``normalize_rewards`` the rewards entering GAE are divided by a running std of discounted
returns (core's ``ActorCriticPolicy.normalize_rewards``). Advantages are normalised per minibatch, only for minibatches of >= 2 rows, and only
centred when their std is below 1e-8 (tests/test_ppo.py::test_c07_*).
"""
from __future__ import annotations

from typing import Dict, Tuple

import torch

import flowkit
from flowkit.core import ActorCritic, ActorCriticPolicy, adapt_kl_coeff, clipped_surrogate, loss_stats, standardized
from flowkit.core import batch as sb
from flowkit.core.ops import ConcatBatches, StandardizeFields, SyncWeights, TrainOneStep
from flowkit_ppo import PPO_REF


# ---- the policy ----------------------------------------------------------------------------
class PPOPolicy(ActorCriticPolicy):
    """PPO's actor-critic policy (acting and GAE from :class:`ActorCriticPolicy`). Override
    :meth:`loss` to make a variant."""

    model: ActorCritic
    worker_gae = True  # postprocess_trajectory adds ``advantages`` and ``value_targets`` (GAE)
    train_columns = (sb.OBS, sb.ACTIONS, sb.ACTION_LOGP, sb.VF_PREDS, sb.ADVANTAGES, sb.VALUE_TARGETS,
                     sb.ACTION_DIST_INPUTS, sb.ACTION_MASK, sb.DISCOUNTED_RETURNS)
    state_attrs = ("clip_param", "kl_coeff")  # a schedule and the adaptive KL coefficient (lr: the optimizer's)

    def __init__(self, observation_space, action_space, config, model_config=None, device="cpu",
                 seed=0, inference_only=False):
        super().__init__(observation_space, action_space, config, model_config, device, seed, inference_only)
        self.clip_param, self.kl_coeff = config.clip_param, config.kl_coeff
        self._kl_sum, self._kl_n = 0.0, 0

    # -- learning (driver) --
    def loss(self, batch: Dict[str, torch.Tensor]) -> Tuple[torch.Tensor, Dict[str, float]]:
        cfg = self.config
        mask = batch.get(sb.ACTION_MASK)
        inputs, values = self.model_forward(batch)
        logp, entropy = self.dist.logp_entropy(inputs, batch[sb.ACTIONS], mask, entropy_grad=cfg.ent_coef != 0)
        entropy = entropy.mean()
        ratio = torch.exp(logp - batch[sb.ACTION_LOGP])
        adv = batch[sb.ADVANTAGES]
        if cfg.normalize_advantages == "minibatch" and self.shard_rows is None:  # (a group's: prepare_minibatch)
            adv = standardized(adv)
        clip = self.clip_param
        pg_loss = clipped_surrogate(ratio, adv, clip)
        vt = batch[sb.VALUE_TARGETS]
        vf_err = (values - vt).pow(2)
        if cfg.vf_clip_param is not None:
            old_v = batch[sb.VF_PREDS]
            v_clipped = old_v + torch.clamp(values - old_v, -cfg.vf_clip_param, cfg.vf_clip_param)
            vf_err = torch.max(vf_err, (v_clipped - vt).pow(2))
        vf_loss = 0.5 * vf_err.mean()
        loss = pg_loss + cfg.vf_coef * vf_loss - cfg.ent_coef * entropy
        with torch.set_grad_enabled(self.kl_coeff > 0):  # without the penalty KL is only reported
            kl = self.dist.kl(batch[sb.ACTION_DIST_INPUTS], inputs, mask).mean()
        if self.kl_coeff > 0:
            loss = loss + self.kl_coeff * kl
        st = loss_stats(pg_loss=pg_loss, vf_loss=vf_loss, entropy=entropy, kl=kl,
                        clip_frac=((ratio.detach() - 1.0).abs() > clip).float().mean(), total_loss=loss)
        self._kl_sum, self._kl_n = self._kl_sum + st["kl"], self._kl_n + 1
        return loss, st

    def prepare_minibatch(self, batch):
        """The whole minibatch's advantages standardised (``normalize_advantages=minibatch``)."""
        if self.config.normalize_advantages != "minibatch":
            return batch
        return {**batch, sb.ADVANTAGES: standardized(batch[sb.ADVANTAGES])}

    def on_train_batch_end(self, batch):
        stats = {"lr": self.current_lr(), "clip_param": self.clip_param}
        kl = self._kl_sum / max(self._kl_n, 1)
        self._kl_sum, self._kl_n = 0.0, 0
        if self.config.kl_coeff > 0:  # adaptive KL penalty (Schulman et al. 2017, sec. 4)
            self.kl_coeff = adapt_kl_coeff(self.kl_coeff, kl, self.config.kl_target)
            stats["kl_coeff"] = self.kl_coeff
        self.update_normalizers(batch)
        return stats

    def set_progress(self, frac: float) -> None:
        """Linear schedules: ``frac`` in [0, 1] of ``schedule_env_steps`` done (lr: see Policy)."""
        super().set_progress(frac)
        frac = min(max(frac, 0.0), 1.0)
        if self.config.clip_schedule == "linear":
            self.clip_param = max(self.config.clip_param * (1.0 - frac), 1e-8)


# ---- the algorithm --------------------------------------------------------------------------
class PPO(flowkit.Algorithm, ref=PPO_REF):
    """PPO: bulk-sync rollouts -> ConcatBatches -> TrainOneStep(epochs x minibatches) ->
    SyncWeights(to all workers)."""

    policy_class = PPOPolicy

    def training_flow(self, experiences, ctx, learner):
        cfg = self.config
        flow = experiences.combine(ConcatBatches(cfg.train_batch_size or ctx.workers.round_env_steps))
        if cfg.normalize_advantages == "batch":
            flow = flow.for_each(StandardizeFields([sb.ADVANTAGES]))
        return (flow.for_each(TrainOneStep(ctx, learner, cfg.num_epochs, cfg.minibatch_size))
                    .for_each(SyncWeights(ctx, learner)))

