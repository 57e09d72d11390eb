"""APPO (asynchronous PPO) as a flowkit plugin: IMPALA's asynchronous sampling and learner
thread (Espeholt et al. 2018, arXiv 1802.01561) trained with PPO's clipped surrogate
(Schulman et al. 2017, arXiv 1707.06347) over V-trace advantages, as RLlib's APPO does.

Three policies meet in one loss: the behaviour policy mu that sampled the batch on a worker
(its log-prob is stored per row, ``action_logp``), a **target network** pi_target (a copy of
the learner's policy, refreshed every ``target_update_freq`` train batches and kept fixed in
between: the "old policy" of PPO) and the current policy pi being trained.

Math, top to bottom, for a trajectory piece x_s, ..., x_{s+n} (per trajectory inside a train
batch, bootstrapping as IMPALA does: see :func:`flowkit.core.vtrace`):
    V-trace (Espeholt et al. 2018, eq. 1) with pi_target as the target policy:
        rho_t   = min(rho_bar, pi_target(a_t|x_t) / mu(a_t|x_t))
        c_t     = lambda * min(c_bar, pi_target(a_t|x_t) / mu(a_t|x_t))
        delta_t = rho_t * (r_t + gamma * V(x_{t+1}) - V(x_t))
        v_s     = V(x_s) + delta_s + gamma * c_s * (v_{s+1} - V(x_{s+1}))
        A_s     = min(rho_pg_bar, pi_target/mu) * (r_s + gamma * v_{s+1} - V(x_s))
    The surrogate's ratio is pi / pi_target, reached from the stored behaviour log-prob with a
    clipped importance weight (RLlib's ``is_ratio``, clipped to [0, is_ratio_clip]):
        r_s = min(is_ratio_clip, mu(a_s|x_s) / pi_target(a_s|x_s)) * pi(a_s|x_s) / mu(a_s|x_s)
    Clipped surrogate (Schulman et al. 2017, eq. 7), A_s standardised over the minibatch first
    with ``normalize_advantages=minibatch`` (``(A - mean) / std``, as PPO; off by default):
        pg_loss = -mean(min(r_s A_s, clip(r_s, 1 - eps, 1 + eps) A_s))      (eps: clip_param)
    vf_loss = 0.5 * mean((v_s - V(x_s))^2), entropy = mean(H(pi(.|x_s))),
    kl      = mean(KL(pi_target(.|x_s) || pi(.|x_s)))
    loss    = pg_loss + vf_coef * vf_loss - ent_coef * entropy  (+ kl_coeff * kl with use_kl_loss;
              kl_coeff adapts after each train batch: x1.5 above 2 kl_target, x0.5 below kl_target/2)
V(x) is the current value network (V-trace's targets are constants of the loss). Box actions:
a diagonal Gaussian over the sampled (unclipped) action, as IMPALA.

Minibatches (``minibatch_mode``): ``contiguous`` (default; RLlib's) cuts the train batch into
slices in row order and runs V-trace in each slice's loss, with the current V and pi_target;
``shuffled`` runs V-trace once per train batch, before the epochs, with the target network's
log-probs and values (the weights at the start of the batch when ``target_update_freq`` is 1),
and trains on rows shuffled into minibatches: PPO's learner (Schulman et al. 2017, algorithm 1)
with V-trace in place of GAE. Each minibatch then mixes many trajectories instead of a few.

What RLlib's APPO (old API stack, ``appo_torch_policy.py``) does and this file does too: V-trace
with the target network's log-probs, the ``is_ratio`` clip at 2, the clipped surrogate without
advantage standardisation (by default), the KL penalty against the target network off by default, the target
updated after a fixed number of train batches. Differences: no V-trace-free mode (RLlib's
``vtrace=False`` falls back to GAE), and the target is a full copy (no Polyak ``tau``).

Plan: IMPALA's (:class:`flowkit_impala.impala.LearnerThreadAlgorithm`): async rollouts -> weights to the
source worker -> [MixInReplay] -> ConcatBatches -> TrainOneStep in the learner thread; the target
update and the KL coefficient live in the policy (:meth:`APPOPolicy.on_train_batch_end`), so they
run in the learner's thread and are saved with its state.
"""
from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import torch

from flowkit.core import (
    ActorCritic,
    ActorCriticPolicy,
    TargetNetwork,
    adapt_kl_coeff,
    clipped_surrogate,
    loss_stats,
    standardized,
)
from flowkit.core import batch as sb
from flowkit_impala import APPO_REF
from flowkit_impala.impala import LearnerThreadAlgorithm


class APPOPolicy(ActorCriticPolicy):
    """APPO's actor-critic: workers act with the policy network (storing the behaviour
    log-prob); the learner copy also holds :attr:`target` (a hard-copy
    :class:`~flowkit.core.TargetNetwork`). Override :meth:`loss` to make a variant."""

    store_values = False  # act with the policy network only
    twin = False
    state_attrs = ("kl_coeff", "train_batches")
    model: ActorCritic

    def __init__(self, observation_space, action_space, config, model_config=None, device="cpu",
                 seed=0, inference_only=False):
        super().__init__(observation_space, action_space, config, model_config, device, seed, inference_only)
        self.kl_coeff = float(config.kl_coeff)
        self.train_batches = 0  # train batches learned on (target updates every target_update_freq)
        self._kl_sum, self._kl_n = 0.0, 0
        if not inference_only:
            self.target = TargetNetwork(self.model)  # pi_target <- pi: full copies

    # -- learning (learner; the Learner runs the epochs over the minibatches) --
    def prepare_batch(self, batch: sb.SampleBatch) -> Dict[str, torch.Tensor]:
        """:meth:`ActorCriticPolicy.prepare_vtrace_batch`; with ``minibatch_mode=shuffled`` the
        V-trace targets of the whole train batch too (``vtrace_vs``, ``vtrace_adv``: float32[B])
        and pi_target's distribution inputs (``target_inputs``), every column one per row (the
        values bootstrapped at truncations and cuts are the online network's, as in
        :meth:`~flowkit.core.ActorCriticPolicy.vtrace_targets`)."""
        tb = self.prepare_vtrace_batch(batch)
        if self.config.minibatch_mode != "shuffled":
            return tb
        tb["target_inputs"], _, tb["vtrace_vs"], tb["vtrace_adv"] = self.target_vtrace(tb)
        for k in ("boot_idx", "boot_obs", "nextnonterminal"):  # V-trace's alone, not one per row
            del tb[k]
        return tb

    @torch.no_grad()
    def prepare_minibatch(self, batch: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
        """For a learner group: pi_target's inputs and V-trace over the whole minibatch (as
        :meth:`loss` computes them in ``minibatch_mode=contiguous``; already there in
        ``shuffled``), the advantages standardised over it (``normalize_advantages=minibatch``),
        and only the columns with one value per row."""
        out = {k: v for k, v in batch.items() if k not in ("boot_idx", "boot_obs", "nextnonterminal")}
        if "target_inputs" not in batch:
            out["target_inputs"], _, out["vtrace_vs"], out["vtrace_adv"] = self.target_vtrace(
                batch, self.model_forward(batch)[1])
        if self.config.normalize_advantages == "minibatch":
            out["vtrace_adv"] = standardized(out["vtrace_adv"])
        return out

    @torch.no_grad()
    def target_vtrace(self, batch: Dict[str, torch.Tensor], values: Optional[torch.Tensor] = None
                      ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """V-trace against the target network on a prepared (mini)batch: ``(target_inputs,
        log_rhos, vs, pg_advantages)``, pi_target's distribution inputs float32[L, k],
        ``log pi_target(a|x) - log mu(a|x)`` float32[L] and :meth:`vtrace_targets` float32[L]
        with ``values`` V(x_s) float32[L] (None: pi_target's own values, ``minibatch_mode=shuffled``)."""
        assert self.target is not None, "V-trace against the target network runs on the learner's policy"
        tm: Any = self.target.module
        if values is None:
            target_inputs, values = self.model_forward(batch, tm)
        else:  # the policy head alone where the value network is separate
            target_inputs = (self.model_forward(batch, tm)[0] if self.is_recurrent
                             else tm.policy(batch[sb.OBS]) if hasattr(tm, "policy") else tm(batch[sb.OBS])[0])
        log_rhos = self.dist.logp(target_inputs, batch[sb.ACTIONS], batch.get(sb.ACTION_MASK)) - batch[sb.ACTION_LOGP]
        return (target_inputs, log_rhos, *self.vtrace_targets(batch, log_rhos, values))

    def loss(self, batch: Dict[str, torch.Tensor]) -> Tuple[torch.Tensor, Dict[str, float]]:
        cfg = self.config
        assert self.target is not None, "loss runs on the learner's policy"
        mask, actions = batch.get(sb.ACTION_MASK), batch[sb.ACTIONS]
        inputs, values = self.model_forward(batch)
        logp, entropy = self.dist.logp_entropy(inputs, actions, mask, entropy_grad=cfg.ent_coef != 0)
        behaviour_logp = batch[sb.ACTION_LOGP]
        if "target_inputs" in batch:  # minibatch_mode=shuffled: V-trace ran in prepare_batch
            target_inputs, vs, adv = batch["target_inputs"], batch["vtrace_vs"], batch["vtrace_adv"]
            with torch.no_grad():
                log_rhos = self.dist.logp(target_inputs, actions, mask) - behaviour_logp
        else:
            target_inputs, log_rhos, vs, adv = self.target_vtrace(batch, values.detach())
        is_ratio = torch.clamp(torch.exp(-log_rhos), 0.0, cfg.is_ratio_clip)
        ratio = is_ratio * torch.exp(logp - behaviour_logp)
        standardize = cfg.normalize_advantages == "minibatch" and self.shard_rows is None  # (a group's: prepare_minibatch)
        pg_loss = clipped_surrogate(ratio, standardized(adv) if standardize else adv, cfg.clip_param)
        vf_loss = 0.5 * (vs - values).pow(2).mean()
        entropy = entropy.mean()
        loss = pg_loss + cfg.vf_coef * vf_loss - cfg.ent_coef * entropy
        with torch.set_grad_enabled(cfg.use_kl_loss):  # without the penalty KL is only reported
            kl = self.dist.kl(target_inputs, inputs, mask).mean()
        if cfg.use_kl_loss:
            loss = loss + self.kl_coeff * kl
        st = loss_stats(pg_loss=pg_loss, vf_loss=vf_loss, entropy=entropy, kl=kl, total_loss=loss,
                        clip_frac=((ratio.detach() - 1.0).abs() > cfg.clip_param).float().mean(),
                        is_ratio_mean=is_ratio.mean(), rho_mean=torch.exp(log_rhos.detach()).mean())
        self._kl_sum, self._kl_n = self._kl_sum + st["kl"], self._kl_n + 1
        return loss, st

    def on_train_batch_end(self, batch: Dict[str, torch.Tensor]) -> Dict[str, float]:
        """After all epochs on a train batch: adapt ``kl_coeff`` (with ``use_kl_loss``) and
        refresh the target network every ``target_update_freq`` train batches."""
        cfg = self.config
        kl = self._kl_sum / max(self._kl_n, 1)
        self._kl_sum, self._kl_n = 0.0, 0
        if cfg.use_kl_loss:
            self.kl_coeff = adapt_kl_coeff(self.kl_coeff, kl, cfg.kl_target)
        self.train_batches += 1
        if self.train_batches % cfg.target_update_freq == 0 and self.target is not None:
            self.target.update()
        self.update_normalizers(batch)  # model.normalize_obs
        return {"kl_coeff": self.kl_coeff, "lr": self.current_lr()}


class APPO(LearnerThreadAlgorithm, ref=APPO_REF):
    """APPO: IMPALA's plan (async rollouts -> weights to the producing worker -> train batches
    -> learner thread) with :class:`APPOPolicy`'s clipped-surrogate loss;
    ``appo.rollout_mode=bulk_sync`` drives the same learner synchronously."""

    policy_class = APPOPolicy

    def contiguous_minibatches(self) -> bool:
        return self.config.minibatch_mode == "contiguous"
