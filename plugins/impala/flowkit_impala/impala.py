"""IMPALA (Espeholt et al. 2018, arXiv 1802.01561) as a flowkit plugin: asynchronous
rollouts, a learner thread on the driver, V-trace off-policy correction.

Math, top to bottom (section 4 of the paper). For a trajectory piece x_s, ..., x_{s+n}
sampled with behaviour policy mu and trained with target policy pi:
    rho_t   = min(rho_bar, pi(a_t|x_t) / mu(a_t|x_t))                (clip_rho_threshold)
    c_t     = lambda * min(c_bar, pi(a_t|x_t) / mu(a_t|x_t))         (clip_c_threshold, vtrace_lambda)
    delta_t = rho_t * (r_t + gamma * V(x_{t+1}) - V(x_t))
    v_s     = V(x_s) + sum_{t=s}^{s+n-1} gamma^{t-s} (prod_{i=s}^{t-1} c_i) delta_t      (eq. 1)
computed backwards with the recursion  v_s - V(x_s) = delta_s + gamma c_s (v_{s+1} - V(x_{s+1})).
    policy-gradient advantage  A_s = rho^pg_s * (r_s + gamma * v_{s+1} - V(x_s))
                                 (rho^pg_s clipped at clip_pg_rho_threshold)
Trajectory ends inside a train batch are handled per trajectory: after a termination
V(x_{t+1}) = v_{t+1} = 0; after a truncation (time limit) or a fragment cut,
V(x_{t+1}) = v_{t+1} = V(final / next observation) (bootstrap, no further correction).
Losses (means over the batch):
    pg_loss = -mean(log pi(a_s|x_s) * A_s)      vf_loss = 0.5 * mean((v_s - V(x_s))^2)
    loss    = pg_loss + vf_coef * vf_loss - ent_coef * entropy
Discrete actions: categorical; Box actions: diagonal Gaussian whose log-prob is that of the
sampled (unclipped) action, as for the behaviour log-prob stored by the worker.

Plan (async): rollouts -> SyncWeights(to the source worker, with its next sample request) ->
[MixInReplay] -> ConcatBatches -> TrainOneStep in the learner's thread.
Plan (``impala.rollout_mode=bulk_sync``): rollouts -> [MixInReplay] -> ConcatBatches ->
TrainOneStep in the driver -> SyncWeights(to all).
"""
from __future__ import annotations

import collections
from typing import Any, Deque, Dict, List, Tuple

import numpy as np
import torch

import flowkit
from flowkit.core import ActorCritic, ActorCriticPolicy, derive_seed, loss_stats
from flowkit.core import batch as sb
from flowkit.core.context import RunContext
from flowkit.core.ops import ConcatBatches, SyncWeights, TrainOneStep
from flowkit_impala import IMPALA_REF


# ---- the policy -----------------------------------------------------------------------------------
class IMPALAPolicy(ActorCriticPolicy):
    """IMPALA's actor-critic with V-trace. Workers only act (and store the behaviour
    log-prob; acting from :class:`ActorCriticPolicy`); all the math runs on the learner (the
    Learner's update lock keeps the driver from reading half-updated weights). Override
    :meth:`loss` to make a variant."""

    store_values = False  # act with the policy network only
    twin = False
    model: ActorCritic

    # -- learning (learner; the Learner runs the epochs over contiguous minibatches) --
    prepare_batch = ActorCriticPolicy.prepare_vtrace_batch

    @torch.no_grad()
    def prepare_minibatch(self, batch: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
        """For a learner group: V-trace over the whole minibatch (``vtrace_vs``, ``vtrace_pg``:
        float32[B]) with the current weights, as :meth:`loss` would compute it, and only the
        columns with one value per row."""
        inputs, values = self.model_forward(batch)
        log_rhos = self.dist.logp(inputs, batch[sb.ACTIONS], batch.get(sb.ACTION_MASK)) - batch[sb.ACTION_LOGP]
        out = {k: v for k, v in batch.items() if k not in ("boot_idx", "boot_obs", "nextnonterminal")}
        out["vtrace_vs"], out["vtrace_pg"] = self.vtrace_targets(batch, log_rhos, values)
        return out

    def loss(self, batch: Dict[str, torch.Tensor]) -> Tuple[torch.Tensor, Dict[str, float]]:
        cfg = self.config
        mask = batch.get(sb.ACTION_MASK)
        inputs, values = self.model_forward(batch)
        logp, entropy = self.dist.logp_entropy(inputs, batch[sb.ACTIONS], mask, entropy_grad=cfg.ent_coef != 0)
        log_rhos = logp.detach() - batch[sb.ACTION_LOGP]
        vs_t, pg_t = ((batch["vtrace_vs"], batch["vtrace_pg"]) if "vtrace_pg" in batch  # prepare_minibatch's
                      else self.vtrace_targets(batch, log_rhos, values.detach()))
        pg_loss = -(logp * pg_t).mean()
        vf_loss = 0.5 * (vs_t - values).pow(2).mean()
        entropy = entropy.mean()
        loss = pg_loss + cfg.vf_coef * vf_loss - cfg.ent_coef * entropy
        rhos = torch.exp(log_rhos.detach())
        return loss, loss_stats(pg_loss=pg_loss, vf_loss=vf_loss, entropy=entropy, total_loss=loss, rho_mean=rhos.mean(),
                                rho_max=rhos.max(), rho_clip_frac=(rhos > cfg.clip_rho_threshold).float().mean())

    def on_train_batch_end(self, batch: Dict[str, torch.Tensor]) -> Dict[str, float]:
        """The learning rate the batch trained at (``impala.lr_schedule``); the observation
        statistics (``model.normalize_obs``) take the batch in."""
        self.update_normalizers(batch)
        return {"lr": self.current_lr()}


# ---- replay mix-in --------------------------------------------------------------------------------
class MixInReplay:
    """Emit each new batch together with ``k`` batches replayed from a FIFO buffer of the last
    ``capacity`` batches; ``k = floor(p) + Bernoulli(p - floor(p))`` with
    ``p = replay_proportion`` (IMPALA's experience replay, paper section 5.3.1). Replayed
    copies carry no episode summaries (they were counted when sampled) and count as trained,
    not sampled, env steps."""

    def __init__(self, ctx: RunContext, replay_proportion: float, capacity: int, seed: int):
        self.ctx, self.p, self.capacity = ctx, float(replay_proportion), int(capacity)
        self.buffer: Deque[sb.MultiAgentBatch] = collections.deque(maxlen=self.capacity)
        self.rng = np.random.default_rng(seed)
        self.name = f"MixInReplay(replay_proportion={self.p}, capacity={self.capacity})"

    def __call__(self, b: sb.MultiAgentBatch) -> List[sb.MultiAgentBatch]:
        out = [b]
        if self.buffer:
            k = int(self.p) + int(self.rng.random() < self.p - int(self.p))
            for i in self.rng.integers(0, len(self.buffer), size=k):
                old = self.buffer[int(i)]
                out.append(sb.MultiAgentBatch(old.policy_batches, old.env_steps, old.agent_steps, [],
                                              old.worker_index, old.meta))
                self.ctx.counters["env_steps_replayed"] += old.env_steps
        self.buffer.append(b)
        return out

    def get_state(self, include_replay: bool = True) -> Dict[str, Any]:
        return {"rng": self.rng.bit_generator.state,
                "buffer": [b.to_dict() for b in self.buffer] if include_replay else None}

    def set_state(self, state: Dict[str, Any]) -> None:
        self.rng.bit_generator.state = state["rng"]
        if state.get("buffer") is not None:
            self.buffer.clear()
            self.buffer.extend(sb.MultiAgentBatch.from_dict(d) for d in state["buffer"])


# ---- the algorithms ---------------------------------------------------------------------------------
class LearnerThreadAlgorithm(flowkit.Algorithm):
    """The plan IMPALA and APPO share (their config keys as :class:`IMPALAConfig`), each with its
    own policy and loss. Async: rollouts -> weights to the source worker -> [MixInReplay] ->
    ConcatBatches -> TrainOneStep in the learner's thread; ``<name>.rollout_mode=bulk_sync``:
    [MixInReplay] -> ConcatBatches -> TrainOneStep in the driver -> SyncWeights(to all)."""

    rollout_mode = "async"
    off_policy = True

    def get_rollout_mode(self) -> str:
        return self.config.rollout_mode

    def contiguous_minibatches(self) -> bool:
        """Whether the Learner cuts a train batch into contiguous slices, each prepared (V-trace
        run) on its own, rather than shuffled rows of the batch prepared once."""
        return True

    def training_flow(self, experiences, ctx, learner):
        cfg = self.config
        is_async = self.get_rollout_mode() == "async"
        if is_async:
            experiences = experiences.for_each(SyncWeights(ctx, learner, to="source", every=cfg.broadcast_interval,
                                                           unit="batches", with_next_sample=True)).drop_source()
        if cfg.replay_proportion > 0:
            experiences = experiences.combine(ctx.add_stateful(f"{learner.name}/replay", MixInReplay(
                ctx, cfg.replay_proportion, cfg.replay_buffer_num_slots,
                derive_seed(int(self.run_config.seed), self.name, "replay"))))
        train = TrainOneStep(ctx, learner, cfg.num_epochs, cfg.minibatch_size, contiguous=self.contiguous_minibatches())
        batches = experiences.combine(ConcatBatches(cfg.train_batch_size))
        if is_async:
            return train.in_thread(batches, cfg.learner_queue_size)
        return batches.for_each(train).for_each(SyncWeights(ctx, learner))


class IMPALA(LearnerThreadAlgorithm, ref=IMPALA_REF):
    """IMPALA: async rollouts -> weights to the producing worker -> train batches -> learner
    thread (V-trace); ``impala.rollout_mode=bulk_sync`` drives the same learner synchronously."""

    policy_class = IMPALAPolicy
