"""BC and MARWIL (Wang et al. 2018, "Exponentially Weighted Imitation Learning for Batched
Historical Data", NeurIPS 2018) as a flowkit plugin: one policy, one loss, two config sections.

Math, top to bottom (batches come from a dataset: :mod:`flowkit_offline.reader`):
    Returns-to-go, once per episode when it is read (:meth:`MARWILPolicy.postprocess_trajectory`):
        R_t = r_t + gamma * R_{t+1},   R after the episode's last row = 0
    (the paper's Monte-Carlo return, section 4; an episode cut by a time limit or by
    ``flowkit record steps=N`` is not bootstrapped: the value network changes while the
    dataset is read once, so RLlib's offline MARWIL does the same).
    Advantage against a learned baseline (section 4, "we use ... V_theta as a baseline"):
        A_t = R_t - V(s_t)
        vf_loss = 0.5 * mean(A_t^2)                                (V trained to R)
    The advantage scale c: a moving average of the squared advantage (RLlib's form of the
    paper's normalisation by the advantages' scale):
        c^2 <- c^2 + rate * (mean(A^2) - c^2)      per gradient step, from c^2 = start
    The imitation loss weighted by the exponentiated advantage (eq. 2 / Algorithm 1: the
    policy pi ~ pi_D * exp(beta * A), fitted by weighted maximum likelihood):
        w_t = min(exp(beta * A_t / c), max_weight)                (A_t and c constants)
        pi_loss = -mean(w_t * log pi(a_t | s_t))
        loss = pi_loss + vf_coef * vf_loss
    beta = 0 is behavioural cloning: w_t = 1, pi_loss = -mean(log pi(a_t | s_t)), and no
    value network is trained (``bc``, and ``marwil.beta=0``).

Plan (``flowkit plan algo=marwil input.dataset=...``): DatasetReader (the dataset's rows in
shuffled batches of ``train_batch_size``, in place of the rollout workers) -> TrainOneStep
(one gradient step per batch). Evaluation (``evaluation.interval``, ``flowkit evaluate``)
acts greedily in the env.
"""
from __future__ import annotations

from typing import Dict, Tuple

import numpy as np
import torch

import flowkit
from flowkit.core import ActorCriticPolicy, loss_stats
from flowkit.core import batch as sb
from flowkit.core.ops import TrainOneStep
from flowkit_offline import BC_REF, MARWIL_REF, MARWILConfig

_TRAIN_COLS = (sb.OBS, sb.ACTIONS, sb.VALUE_TARGETS, sb.ACTION_MASK)


def returns_to_go(rewards: np.ndarray, gamma: float) -> np.ndarray:
    """R_t = r_t + gamma * R_{t+1} over one episode (float32[T] -> float32[T]; R_T = 0)."""
    out = np.empty(len(rewards), np.float64)
    acc = 0.0
    for t in range(len(rewards) - 1, -1, -1):
        acc = float(rewards[t]) + gamma * acc
        out[t] = acc
    return out.astype(np.float32)


class MARWILPolicy(ActorCriticPolicy):
    """The actor-critic of BC and MARWIL (acting from :class:`ActorCriticPolicy`); the loss of
    the module docstring. Override :meth:`loss` to make a variant.

    Attributes:
        ma_sqd_adv_norm: c^2, the moving average of the squared advantage (checkpointed).
    """

    train_columns = _TRAIN_COLS
    state_attrs = ("ma_sqd_adv_norm",)

    def __init__(self, observation_space, action_space, config, model_config=None, device="cpu", seed=0,
                 inference_only=False):
        super().__init__(observation_space, action_space, config, model_config, device, seed, inference_only)
        self.beta = float(config.beta) if isinstance(config, MARWILConfig) else 0.0  # bc: MARWIL with beta = 0
        self.ma_sqd_adv_norm = float(config.moving_average_sqd_adv_norm_start) if self.beta else 0.0

    def postprocess_trajectory(self, batch: sb.SampleBatch) -> sb.SampleBatch:
        """One whole episode of the dataset -> with ``value_targets`` = its returns-to-go R_t
        (MARWIL; BC needs none and gets the batch unchanged)."""
        if self.beta == 0.0:
            return batch
        out = sb.SampleBatch(batch)
        out[sb.VALUE_TARGETS] = returns_to_go(np.asarray(batch[sb.REWARDS]), float(self.config.gamma))
        return out

    def loss(self, batch: Dict[str, torch.Tensor]) -> Tuple[torch.Tensor, Dict[str, float]]:
        cfg = self.config
        logp = self.dist.logp(self.model_policy(batch[sb.OBS]), batch[sb.ACTIONS], batch.get(sb.ACTION_MASK))
        if self.beta == 0.0:  # behavioural cloning
            loss = -logp.mean()
            return loss, {"pi_loss": float(loss.detach()), "total_loss": float(loss.detach())}
        values = self.model_value(batch[sb.OBS])
        adv = batch[sb.VALUE_TARGETS] - values                        # A_t = R_t - V(s_t)
        vf_loss = 0.5 * adv.pow(2).mean()
        with torch.no_grad():
            a = adv.detach()
            rate = float(cfg.moving_average_sqd_adv_norm_update_rate)
            self.ma_sqd_adv_norm += rate * (float(a.pow(2).mean()) - self.ma_sqd_adv_norm)   # c^2
            w = torch.exp(self.beta * a / (np.sqrt(self.ma_sqd_adv_norm) + 1e-8))          # exp(beta A / c)
            if cfg.max_weight is not None:
                w = w.clamp(max=float(cfg.max_weight))
        pi_loss = -(w * logp).mean()
        loss = pi_loss + cfg.vf_coef * vf_loss
        return loss, loss_stats(pi_loss=pi_loss, vf_loss=vf_loss, total_loss=loss, weight_mean=w.mean(), nll=-logp.mean(),
                                adv_norm=float(np.sqrt(self.ma_sqd_adv_norm)))


class MARWIL(flowkit.Algorithm, ref=MARWIL_REF):
    """MARWIL: DatasetReader (``input.dataset``) -> TrainOneStep (one gradient step per batch of
    ``train_batch_size`` rows)."""

    policy_class, off_policy = MARWILPolicy, True

    def training_flow(self, experiences, ctx, learner):
        return experiences.for_each(TrainOneStep(ctx, learner))


class BC(MARWIL, ref=BC_REF):
    """BC: behavioural cloning (MARWIL with beta = 0), the same plan."""

