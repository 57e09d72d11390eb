"""What SAC and TD3 share: twin critics over ``[obs, action]``, targets kept as one flat
buffer and moved by Polyak averaging, uniform random acting until the first trained weights,
actor-only weights for the workers, and the replay plan.

Parameter layout (both): ``model.critic`` (a :class:`~flowkit.core.TwinMLP`: Q1 and Q2 in one
batched pass) registered first, then ``model.actor`` (then SAC's ``log_alpha``): every
trainable parameter is a view of the policy's one flat buffer (``Policy.make_optimizer``),
and the target modules' parameters, which come first, mirror its first ``n_target`` entries,
so a Polyak update is one ``lerp_`` (``target <- target + tau * (online - target)``).
"""
from __future__ import annotations

from typing import Any, Dict, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import nn

import flowkit
from flowkit import ConfigError
from flowkit.core import ObsNormPolicy, TargetNetwork, TwinMLP, derive_seed, ops, replay
from flowkit.core import batch as sb
from flowkit.core.target_network import flat_parameters


def twin_critic(obs_dim: int, act_dim: int, model_cfg: Any) -> TwinMLP:
    """Q1, Q2: ``float32[B, obs_dim + act_dim] -> (float32[B, 1], float32[B, 1])``."""
    return TwinMLP(obs_dim + act_dim, list(model_cfg.hidden_sizes), model_cfg.activation, 1, 1, 1.0, 1.0)


class GreedyActor(nn.Module):
    """Encoded observation float32[B, obs_dim] -> greedy action float32[B, k] in [-1, 1]:
    ``tanh`` of the actor's first ``k`` outputs (SAC: the squashed Gaussian's mode
    ``tanh(mean)``, gSDE too; TD3: the deterministic ``mu(s)``), what ``compute_actions(obs,
    explore=False)`` acts with. ``flowkit export`` wraps it (the Box scaling follows); it
    shares the actor's parameters; with ``model.normalize_obs`` the observation is first
    normalised by the policy's running statistics ``obs_rms``, as when acting."""

    def __init__(self, actor: nn.Module, act_dim: int, obs_rms: Optional[nn.Module] = None):
        super().__init__()
        self.actor, self.act_dim, self.obs_rms = actor, int(act_dim), obs_rms

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        if self.obs_rms is not None:
            obs = self.obs_rms(obs)
        return torch.tanh(self.actor(obs)[:, :self.act_dim])


class OffPolicyActorCritic(ObsNormPolicy):
    """Base of :class:`~flowkit_sac.sac.SACPolicy` and :class:`~flowkit_sac.td3.TD3Policy`.

    A subclass builds ``self.model`` (``critic`` first, then ``actor``) and calls
    :meth:`finish_init` with the names of the modules that have targets (and those of each
    segment of the optimizer, for one Adam per segment); it implements
    :meth:`act` and ``loss``. Actions are in [-1, 1] (``float32[B, dim(A)]``), scaled to the
    Box bounds on the way to the env. With ``model.normalize_obs`` acting and the losses see
    normalised observations (:class:`~flowkit.core.ObsNormPolicy`).
    """

    model: Any  # the subclass's model: ``critic`` first, then ``actor``
    train_columns: Tuple[str, ...] = (sb.OBS, sb.ACTIONS, sb.REWARDS, sb.TERMINATEDS, sb.NEXT_OBS)

    def __init__(self, observation_space, action_space, config, model_config=None, device="cpu",
                 seed=0, inference_only=False):
        super().__init__(observation_space, action_space, config, model_config, device, seed, inference_only)
        if self.dist.kind != "gauss" or self.encoder.is_image:
            raise ConfigError(f"{type(self).__name__} needs a bounded Box action space and a flat observation, "
                              f"got {action_space} and {observation_space}")
        torch.manual_seed(seed)
        self.obs_dim, self.act_dim = int(self.encoder.shape[0]), int(self.dist.dim)

    def finish_init(self, target_modules: Sequence[str], segments: Sequence[Sequence[str]] = ()) -> None:
        from flowkit.core.models import init_weights
        init_weights(self.model, self.model_config)  # model.init, before the targets copy the weights
        self.model.to(self.device)
        self.add_obs_rms(type(self).__name__)  # buffers only: outside the flat parameters, inside state_dict
        if self.inference_only:  # the actor alone is synced: one flat array
            _, self.actor_flat = flat_parameters(self.model.actor, self.device, trainable_only=False)
            return
        n = {k: sum(p.numel() for p in m.parameters() if p.requires_grad) for k, m in self.model.named_children()}
        sizes = [size for size in (sum(n[k] for k in seg) for seg in segments) if size]  # (one Adam: none)
        self.optimizer = self.make_optimizer(self.config.lr, sizes=sizes or None)
        self.actor_flat = self._flat[n["critic"]:n["critic"] + n["actor"]]
        online = nn.ModuleDict({n: getattr(self.model, n) for n in target_modules})  # first in the flat buffer
        self.target = TargetNetwork(online, self.config.tau, self._flat[:sum(p.numel() for p in online.parameters())])

    def action_model(self) -> nn.Module:
        """The deterministic actor, :class:`GreedyActor` (see :meth:`Policy.action_model`):
        the greedy action in [-1, 1], which the exported module scales to the Box bounds."""
        return GreedyActor(self.model.actor, self.act_dim, getattr(self.model, "obs_rms", None))

    # -- acting (worker) --
    def act(self, obs: torch.Tensor, explore: bool) -> torch.Tensor:
        """Actions in [-1, 1], float32[B, dim(A)], for encoded observations float32[B, obs_dim]."""
        raise NotImplementedError

    def compute_actions_encoded(self, obs, mask=None, explore=True):
        if explore and self.num_updates == 0:  # no trained weights yet: uniform (learning_starts)
            return self.np_random.uniform(-1, 1, (obs.shape[0], self.act_dim)).astype(np.float32), {}
        with torch.inference_mode():
            return self.act(self.norm(torch.from_numpy(obs)), explore).numpy(), {}

    def q_values(self, obs: torch.Tensor, actions: torch.Tensor, detach_params: bool = False,
                 target: bool = False) -> torch.Tensor:
        """Q1 and Q2 stacked: float32[2, B]."""
        critic = self.target["critic"] if target and self.target is not None else self.model.critic
        q1, q2 = critic(torch.cat([obs, actions], -1), detach_params)
        return torch.stack([q1.squeeze(-1), q2.squeeze(-1)])

    # -- weights and state --
    def get_weights(self) -> Dict[str, np.ndarray]:
        """What a worker needs: the actor as one flat array, and ``num_updates`` (0: it acts at
        random). A full state dict (``get_state()["weights"]``) is accepted too."""
        w = {"actor_flat": self.actor_flat.detach().cpu().numpy().copy(),
             "num_updates": np.asarray(self.num_updates, np.int64)}
        rms = getattr(self.model, "obs_rms", None)
        if rms is not None:  # the observation statistics travel with the actor
            w.update({f"obs_rms.{k}": v.detach().cpu().numpy().copy() for k, v in rms.state_dict().items()})
        return w

    def set_weights(self, weights: Dict[str, np.ndarray]) -> None:
        w = dict(weights)
        if "num_updates" in w:
            self.num_updates = int(w.pop("num_updates"))
            rms = getattr(self.model, "obs_rms", None)
            if rms is not None and "obs_rms.mean" in w:  # a worker's weights (not a full state dict)
                rms.load_state_dict({k: torch.as_tensor(np.array(w.pop(f"obs_rms.{k}"))) for k in rms.state_dict()})
        if "actor_flat" in w:
            with torch.no_grad():
                self.actor_flat.copy_(torch.from_numpy(np.array(w.pop("actor_flat"))))  # Ray's are read-only
        if w:  # a full state dict (checkpoints)
            self.model.load_state_dict({k: torch.as_tensor(np.array(v)) for k, v in w.items()})

    def get_state(self) -> Dict[str, Any]:
        return {**super().get_state(), "weights": {k: v.detach().cpu().numpy().copy()
                                                   for k, v in self.model.state_dict().items()}}


class OffPolicyAlgorithm(flowkit.Algorithm):
    """The replay plan of SAC and TD3 (``flowkit plan algo=sac``)::

        store = rollouts -> StoreToReplayBuffer -> SyncWeights(to all, once per round)
        train = Replay -> TrainOneStep -> UpdateTargetNetwork(Polyak, every k gradient steps)
        Concurrently([store, train], round_robin, output_indexes=[1],
                     weights=[1, training_intensity * round_env_steps / train_batch_size])
    """

    off_policy = True

    @classmethod
    def check_spaces(cls, policy_id, observation_space, action_space) -> None:
        super().check_spaces(policy_id, observation_space, action_space)
        if not (np.isfinite(action_space.low).all() and np.isfinite(action_space.high).all()):
            raise ConfigError(f"policy {policy_id!r}: {cls.name.upper()} needs a Box action space with finite "
                              f"bounds, got {action_space} (for unbounded actions use e.g. ppo)")

    target_update_key = ""  # the section's key: gradient steps between two Polyak updates of the targets

    def target_update_freq(self) -> int:
        return int(getattr(self.config, self.target_update_key))

    def training_flow(self, experiences, ctx, learner, mix=None):
        cfg = self.config
        buffer = ctx.add_stateful(f"{learner.name}/replay_buffer", replay.MultiAgentReplayBuffer(
            cfg.buffer_size, seed=derive_seed(int(self.run_config.seed), "replay", self.name)))
        ti = cfg.training_intensity or cfg.train_batch_size
        return ops.ReplayPlan(ctx, learner, experiences, buffer, cfg.train_batch_size, cfg.learning_starts,
                              self.target_update_freq(),
                              replay.store_train_weights(ti, ctx.workers.round_env_steps, cfg.train_batch_size),
                              store_ops=[ops.SyncWeights(ctx, learner)], mix=mix)
