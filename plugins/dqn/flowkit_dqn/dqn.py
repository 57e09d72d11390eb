"""Deep Q-Networks (Mnih et al. 2015, Nature 518) as a flowkit plugin, with double-Q (van
Hasselt et al. 2016, arXiv 1509.06461), dueling heads (Wang et al. 2016, arXiv 1511.06581),
n-step returns, prioritized replay (Schaul et al. 2016) and Ape-X replay shards with
per-worker epsilons (Horgan et al. 2018, arXiv 1803.00933).

Math, top to bottom:
    n-step return (postprocess, on the worker), for a window that stops at the trajectory's
    end (termination, truncation or fragment cut):
        R_t = sum_{k<m} gamma^k r_{t+k},   m = min(n, steps left in the piece)   (n_steps)
        next_obs_t <- next_obs_{t+m-1},  terminated_t <- terminated_{t+m-1}
    Target (with action masks, the max and argmax run over legal actions of next_obs only):
        a*  = argmax_a Q_online(s', a)   (double-Q)   or   argmax_a Q_target(s', a)
        y   = R_t + gamma^m * (1 - terminated_t) * Q_target(s', a*)
    Loss: mean_i w_i * huber(Q(s_t, a_t) - y_i), w_i the importance weights (1 without
        prioritized replay); new priorities |Q(s_t, a_t) - y_i| + eps.
    Dueling: Q(s, a) = V(s) + A(s, a) - mean_a A(s, a).
    Exploration: epsilon-greedy over legal actions; epsilon linear from initial_epsilon to
        final_epsilon over epsilon_timesteps env steps sampled. Ape-X: worker i of N keeps
        epsilon_i = base^(1 + alpha * i / (N - 1)) (base 0.4, alpha 7).

Dataflow (``flowkit plan algo=dqn``)::

    store = rollouts -> StoreToReplayBuffer -> UpdateExploration
    train = Replay -> TrainOneStep -> UpdatePriorities -> UpdateTargetNetwork -> SyncWeights(to all)
    Concurrently([store, train], round_robin, output_indexes=[1],
                 weights=[1, training_intensity * round_env_steps / train_batch_size])

Ape-X (``dqn.num_replay_shards=k``): async rollouts -> StoreToReplayShards -> per-worker
epsilon -> SyncWeights(to source, with the next sample request); ReplayFromShards (gather_async) ->
zip_with_source_actor ->
TrainOneStep -> UpdatePriorities (to the serving shard) -> UpdateTargetNetwork.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Dict, Optional, Tuple

import numpy as np
import torch
from torch import nn

import flowkit
from flowkit.core import (
    ObsEncoder,
    ObsNormPolicy,
    TargetNetwork,
    build_mlp,
    build_trunk,
    derive_seed,
    input_steps,
    layer_steps,
    loss_stats,
    ops,
    replay,
)
from flowkit.core import batch as sb
from flowkit.core.context import RunContext
from flowkit.core.flow import get_result
from flowkit.core.learner import Learner
from flowkit_dqn import DQN_REF
from flowkit_dqn.acting import DQNActing, NumpyDQNPolicy, apex_epsilon, compute_n_step, epsilon_at  # noqa: F401


# ---- targets ----------------------------------------------------------------------------------
def compute_q_targets(rewards: torch.Tensor, terminateds: torch.Tensor, discounts: torch.Tensor,
                      q_next_target: torch.Tensor, q_next_online: Optional[torch.Tensor] = None,
                      next_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """TD targets ``y = r + discount * (1 - terminated) * Q_target(s', a*)``.

    Args:
        rewards: float32[B] (an n-step row: the discounted sum of its rewards).
        terminateds: bool[B], no bootstrap where set.
        discounts: float32[B], ``gamma ** n_steps`` per row.
        q_next_target: float32[B, A], target network at next_obs.
        q_next_online: float32[B, A], online network at next_obs (double-Q picks a* with it);
            None: a* = argmax of the target network (vanilla DQN).
        next_mask: int8[B, A] legal actions at next_obs; a* is taken over legal actions only.
            A row with no legal action (a terminal observation) is treated as unmasked.
    Returns:
        float32[B].
    """
    q_next = bootstrap_q(q_next_target, q_next_online if q_next_online is not None else q_next_target, next_mask)
    return rewards + discounts * (~terminateds.bool()).float() * q_next


def bootstrap_q(q_target: torch.Tensor, q_select: torch.Tensor, mask: Optional[torch.Tensor]) -> torch.Tensor:
    """``Q_target(s, a*)`` with ``a* = argmax_a q_select(s, a)`` over the legal actions of
    ``mask`` (int8 or bool [..., A]; a row with no legal action, a terminal observation or
    padding, is treated as unmasked): double-Q when ``q_select`` is the online network's
    (van Hasselt et al. 2016, eq. 4), vanilla DQN when it is ``q_target``.

    Args:
        q_target, q_select: float32[..., A].
    Returns:
        float32[...].
    """
    if mask is not None:
        legal = mask.bool()
        q_select = q_select.masked_fill(~(legal | ~legal.any(-1, keepdim=True)), float("-inf"))
    return q_target.gather(-1, q_select.argmax(-1, keepdim=True)).squeeze(-1)


# ---- the model ---------------------------------------------------------------------------------
class QHeads(nn.Module):
    """The Q head on features float32[..., d]: a linear ``q_head``, or dueling ``value_head`` and
    ``advantage_head`` combined as V + A - mean(A) (Wang et al. 2016, eq. 9). Shared by
    :class:`QNetwork` and R2D2's recurrent Q-network (:class:`~flowkit_dqn.r2d2.RecurrentQNetwork`)."""

    def build_heads(self, d: int, num_actions: int, act: str, dueling: bool) -> None:
        self.dueling = bool(dueling)
        if self.dueling:
            self.value_head = build_mlp(d, [], act, 1, 1.0)
            self.advantage_head = build_mlp(d, [], act, num_actions, 1.0)
        else:
            self.q_head = build_mlp(d, [], act, num_actions, 1.0)

    def default_init(self, model_cfg: Any) -> None:
        """PyTorch's default (Kaiming-uniform) init for every Linear and Conv2d, as SB3 and
        CleanRL use for DQN: with the orthogonal sqrt(2)-gain init of build_mlp, Q diverged on
        CartPole in our runs (kept only with ``model.init=orthogonal``)."""
        if model_cfg.init != "orthogonal":
            for m in self.modules():
                if isinstance(m, (nn.Linear, nn.Conv2d)):
                    m.reset_parameters()

    def q_from_features(self, h: torch.Tensor) -> torch.Tensor:
        """float32[..., d] -> Q-values float32[..., num_actions]."""
        if not self.dueling:
            return self.q_head(h)
        a = self.advantage_head(h)
        return self.value_head(h) + a - a.mean(-1, keepdim=True)


class QNetwork(QHeads):
    """Encoded observation float32[B, *shape] -> Q-values float32[B, num_actions]; a dueling
    head computes V + A - mean(A). Layers start from PyTorch's default init (orthogonal with
    ``model.init=orthogonal``)."""

    def __init__(self, encoder: ObsEncoder, num_actions: int, model_cfg: Any, dueling: bool):
        super().__init__()
        hidden, act = list(model_cfg.hidden_sizes), model_cfg.activation
        self.trunk, d = build_trunk(encoder, hidden, act, str(model_cfg.cnn))
        self.build_heads(d, num_actions, act, dueling)
        self.default_init(model_cfg)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.q_from_features(self.trunk(obs))


# ---- the policy ---------------------------------------------------------------------------------
_WORKER_SIDE = ("compute_actions_encoded", "compute_actions", "q_values", "epsilon_greedy", "postprocess_trajectory",
                "set_weights")


class DQNPolicy(DQNActing, ObsNormPolicy):
    """Q-network, target network (learner only), epsilon-greedy acting and the TD loss.

    ``epsilon`` is set from outside (the UpdateExploration operator, on the learner and on
    every worker). After each ``loss``, ``td_error`` holds float32[B] for
    prioritized replay. Override :meth:`loss` to make a variant.

    With ``model.normalize_obs`` (flat observations only) the model holds ``obs_rms``
    (:class:`~flowkit.core.ObsNormPolicy`: in the weights the workers get and in checkpoints;
    the loss, and the target network, see normalised observations), and acting, evaluation and
    export (:meth:`action_model`) see ``clip((obs - mean) / sqrt(var + 1e-8), -10, 10)``. The
    Q-network's own ``forward`` takes normalised observations.

    Raises:
        ConfigError: not a Discrete action space; ``model.normalize_obs`` with image observations.
    """

    model: Any  # a QNetwork, or the network of model.class
    train_columns: Tuple[str, ...] = (sb.OBS, sb.ACTIONS, sb.REWARDS, sb.TERMINATEDS, sb.NEXT_OBS, sb.N_STEPS,
                                      sb.PRIO_WEIGHTS, sb.NEXT_ACTION_MASK)
    state_attrs = ("epsilon",)

    def __init__(self, observation_space, action_space, config, model_config=None, device="cpu",
                 seed=0, inference_only=False):
        super().__init__(observation_space, action_space, config, model_config, device, seed, inference_only)
        torch.manual_seed(seed)
        self.num_actions = self.dist.num_outputs
        self.model = self.make_model().to(self.device)
        self.add_obs_rms("DQN")  # buffers, not parameters: the optimizer never sees them
        self.epsilon = float(config.initial_epsilon)
        self.td_error: Optional[np.ndarray] = None
        if not inference_only:
            self.target = TargetNetwork(self.model)  # hard copies (target_network_update_freq)
            self.optimizer = self.make_optimizer(config.lr, config.adam_eps)

    def make_model(self) -> nn.Module:
        """The Q-network (override for another default network): a :class:`QNetwork`, or the
        network of ``model.class``."""
        return self.build_model(QNetwork(self.encoder, self.num_actions, self.model_config, self.config.dueling))

    def q_values(self, obs: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            return self.model(self.norm(torch.from_numpy(obs))).numpy()

    def action_model(self) -> nn.Module:
        """The Q-network, behind the observation normalisation when ``model.normalize_obs``
        (``Sequential(obs_rms, model)``, sharing the policy's modules): encoded observations
        float32[B, *shape] -> Q float32[B, A]."""
        rms = getattr(self.model, "obs_rms", None)
        return self.model if rms is None else nn.Sequential(rms, self.model)

    def worker_policy_class(self) -> Optional[Callable[..., Any]]:
        """A :class:`~flowkit_dqn.acting.NumpyDQNPolicy` (torch-free) for an MLP QNetwork
        acted on with DQNPolicy's own methods (a subclass overriding them keeps torch)."""
        cls, mc = type(self), self.model_config
        if (any(getattr(cls, m) is not getattr(DQNPolicy, m) for m in _WORKER_SIDE) or type(self.model) is not QNetwork
                or not mc.numpy_inference):
            return None
        m = self.model
        trunk = layer_steps(m, m.trunk, "h", "x")
        heads = [layer_steps(m, getattr(m, k), k, "h" if trunk else "x")
                 for k in (("value_head", "advantage_head") if m.dueling else ("q_head",))]
        if trunk is None or not all(heads):
            return None
        lay = input_steps(m) + trunk + [step for head in heads for step in head]  # type: ignore[union-attr]
        return functools.partial(NumpyDQNPolicy, layout=lay, weights=self.get_weights())

    # -- learning (driver) --
    def loss(self, batch: Dict[str, torch.Tensor]) -> Tuple[torch.Tensor, Dict[str, float]]:
        cfg = self.config
        assert self.target is not None, "loss runs on the learner's policy"
        q = self.model(batch[sb.OBS])
        q_taken = q.gather(-1, batch[sb.ACTIONS].long().unsqueeze(-1)).squeeze(-1)
        with torch.no_grad():
            next_obs = batch[sb.NEXT_OBS]
            q_next_target = self.target.module(next_obs)
            q_next_online = self.model(next_obs) if cfg.double_q else None
            discounts = torch.pow(torch.tensor(cfg.gamma), batch[sb.N_STEPS].float())  # gamma^n_steps
            y = compute_q_targets(batch[sb.REWARDS].float(), batch[sb.TERMINATEDS], discounts,
                                  q_next_target, q_next_online, batch.get(sb.NEXT_ACTION_MASK))
        td = q_taken - y
        per_row = nn.functional.huber_loss(q_taken, y, reduction="none", delta=cfg.huber_delta)
        w = batch.get(sb.PRIO_WEIGHTS)
        loss = (per_row * w).mean() if w is not None else per_row.mean()
        self.td_error = td.detach().cpu().numpy()
        return loss, loss_stats(loss=loss, mean_q=q_taken.mean(), mean_abs_td_error=td.abs().mean(), mean_target=y.mean())

    def on_train_batch_end(self, batch):
        assert self.optimizer is not None
        return {"epsilon": self.epsilon, "lr": self.current_lr()}


# ---- operators --------------------------------------------------------------------------------
class UpdateExploration:
    """Set epsilon from env steps sampled on the learner policies and on every worker whose
    value is out of date (fire and forget: a prefetched sample request is not waited for).
    Ape-X: each new worker (also a restarted one) gets its fixed per-worker epsilon once."""

    def __init__(self, ctx: RunContext, learner: Learner, cfg: Any, apex: bool = False):
        self.ctx, self.learner, self.cfg, self.apex = ctx, learner, cfg, apex
        self.policy_ids = list(learner.policies)
        self.sent: Dict[int, float] = {}
        self.name = "UpdateExploration(" + ("per-worker epsilon" if apex else
                                            f"epsilon {cfg.initial_epsilon} -> {cfg.final_epsilon} over "
                                            f"{cfg.epsilon_timesteps} env steps") + ")"

    def __call__(self, item: Any) -> Any:
        cfg = self.cfg
        if self.apex:  # items are (worker, batch): the worker's fixed epsilon, sent once
            actors = [item.actor]
        else:
            e = epsilon_at(cfg, self.ctx.counters["env_steps_sampled"])
            for pid in self.policy_ids:
                self.learner.policies[pid].set_exploration_state({"epsilon": e})
            actors = self.ctx.workers.actors
        for a in actors:
            eps = apex_epsilon(a.index, self.ctx.workers.num_workers, cfg.apex_epsilon_base,
                               cfg.apex_epsilon_alpha) if self.apex else e
            if self.sent.get(id(a)) != eps:
                fut = a.submit("set_exploration_state", {pid: {"epsilon": eps} for pid in self.policy_ids})
                if not a.is_remote:
                    get_result(fut)
                self.sent[id(a)] = eps
        return item


# ---- the algorithm --------------------------------------------------------------------------
class DQN(flowkit.Algorithm, ref=DQN_REF):
    """DQN: store and replay-train branches run concurrently, round-robin with a ratio from
    ``training_intensity``; Ape-X with ``num_replay_shards > 0``."""

    policy_class = DQNPolicy
    off_policy = True

    def get_rollout_mode(self) -> str:
        return "async" if self.config.num_replay_shards > 0 else self.rollout_mode

    def worker_exploration_state(self, policy_id, state, worker_index, num_workers):
        """Ape-X: worker ``worker_index``'s fixed epsilon (:func:`apex_epsilon`); else the
        learner's (the schedule's value at the env steps sampled, restored on resume)."""
        if self.config.num_replay_shards > 0 and "epsilon" in state:
            cfg = self.config
            return {**state, "epsilon": apex_epsilon(worker_index, num_workers, cfg.apex_epsilon_base,
                                                     cfg.apex_epsilon_alpha)}
        return state

    @property
    def train_batch_env_steps(self) -> int:
        """Env steps one replayed train batch counts (``env_steps_trained``): ``train_batch_size``
        transitions (R2D2: sequences of ``seq_len`` steps each)."""
        return int(self.config.train_batch_size)

    def training_flow(self, experiences, ctx, learner, mix=None):
        cfg, rt = self.config, self.run_config.runtime
        apex = cfg.num_replay_shards > 0
        prioritized = bool(apex if cfg.prioritized_replay is None else cfg.prioritized_replay)
        prio = dict(alpha=cfg.prioritized_replay_alpha, beta=cfg.prioritized_replay_beta,
                    eps=cfg.prioritized_replay_eps, seed=derive_seed(int(self.run_config.seed), "replay", self.name))
        buffer = ctx.add_stateful(f"{learner.name}/replay_shards", replay.ReplayShards(
            rt.backend, cfg.num_replay_shards, cfg.buffer_size, cfg.train_batch_size, cfg.learning_starts,
            prioritized, **prio)) if apex else ctx.add_stateful(
            f"{learner.name}/replay_buffer", replay.MultiAgentReplayBuffer(cfg.buffer_size, prioritized, **prio))
        sync_every = cfg.weight_sync_freq * self.train_batch_env_steps
        sync = ops.SyncWeights(ctx, learner, to="source", every=sync_every, with_next_sample=True) if apex else \
            ops.SyncWeights(ctx, learner, every=sync_every)
        # [1, k]: k train steps of train_batch_env_steps per sampled item, so trained/sampled = training_intensity
        round_steps, ti = ctx.workers.round_env_steps // (ctx.workers.num_workers if apex else 1), cfg.training_intensity
        weights = [1, 1] if ti is None else replay.store_train_weights(ti, round_steps, self.train_batch_env_steps)
        return ops.ReplayPlan(ctx, learner, experiences, buffer, cfg.train_batch_size, cfg.learning_starts,
                              cfg.target_network_update_freq, weights,
                              store_ops=[UpdateExploration(ctx, learner, cfg, apex=apex), *([sync] if apex else [])],
                              train_ops=[] if apex else [sync], num_async=cfg.replay_num_async, mix=mix)
