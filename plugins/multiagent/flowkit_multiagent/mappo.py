"""Multi-Agent PPO (MAPPO; Yu et al. 2022, "The Surprising Effectiveness of PPO in Cooperative
Multi-Agent Games", NeurIPS Datasets and Benchmarks, arXiv 2103.01955): centralized training
with decentralized execution. IPPO, each agent's critic on its own observation, is ``algo=ppo``.

Math, top to bottom; everything but the critic's input is PPO's (:mod:`flowkit_ppo.ppo`):
    actor   pi(a_t | o_t^i): the agent's own encoded observation o^i (``obs``), nothing else;
            acting, export and evaluation use this network alone.
    critic  V(c_t^i), c^i = [s_t | onehot(i)] (``critic_obs``, float32[D]): s the env's global
            state or the team's observations (:mod:`flowkit_multiagent.centralized`; the paper's
            "agent-specific global state", sec. 4.2), onehot(i) the agent's id.
    GAE     per agent trajectory, on the worker with V = V(c_t^i): A_t = sum_l (gamma lambda)^l
            delta_{t+l}, delta_t = r_t^i + gamma V(c_{t+1}^i) (1 - terminated_t) - V(c_t^i);
            truncations and fragment cuts bootstrap from V(``next_critic_obs``).
    Loss    PPO's clipped surrogate on pi, 0.5 (V(c) - value_targets)^2 (optionally clipped
            around ``vf_preds``), entropy bonus: :meth:`flowkit_ppo.ppo.PPOPolicy.loss` with
            the values of :meth:`MAPPOPolicy.model_forward`.
Networks are separate (the paper's default): actor MLP ``model.hidden_sizes`` over o^i, critic
MLP of the same sizes over c^i; with ``normalize_observations`` each input has its running
mean/std. Shared parameters across agents: map them to one policy (the default mapping) and
set ``multiagent.obs_agent_id=true`` for the actor's agent id.
"""
from __future__ import annotations

from typing import Any, Dict, Tuple

import numpy as np
import torch
from flowkit_ppo.ppo import PPO, PPOPolicy
from torch import nn

from flowkit.config import ConfigError
from flowkit.core import RunningMeanStd, build_mlp, build_trunk, init_weights
from flowkit.core import batch as sb
from flowkit_multiagent.centralized import CRITIC_OBS, NEXT_CRITIC_OBS
from flowkit_multiagent.config import MAPPO_REF


class CentralizedActorCritic(nn.Module):
    """An actor on the agent's observation and a critic on the centralized value input.

    ``policy(obs float32[B, *shape]) -> dist_inputs float32[B, k]`` (logits, or Gaussian mean
    then log-std); ``value(critic_obs float32[B, D]) -> float32[B]``; ``forward(obs,
    critic_obs)`` gives both.
    """

    def __init__(self, encoder: Any, dist: Any, model_cfg: Any, critic_dim: int, normalize_obs: bool = False,
                 log_std_init: float = 0.0, normalize_rewards: bool = False):
        super().__init__()
        hidden, act = list(model_cfg.hidden_sizes), str(model_cfg.activation)
        trunk, d = build_trunk(encoder, hidden, act, str(model_cfg.cnn))
        self.pi = nn.Sequential(trunk, build_mlp(d, [], act, dist.num_outputs, 0.01))
        self.vf = build_mlp(int(critic_dim), hidden, act, 1, 1.0)
        self.obs_rms = RunningMeanStd(encoder.shape) if normalize_obs else None
        self.critic_rms = RunningMeanStd((int(critic_dim),)) if normalize_obs else None
        self.ret_rms = RunningMeanStd(()) if normalize_rewards else None
        self.log_std = nn.Parameter(torch.full((dist.num_outputs,), float(log_std_init))) if dist.is_gauss else None

    def policy(self, obs: torch.Tensor) -> torch.Tensor:
        """The actor: own encoded observations float32[B, *shape] -> dist_inputs float32[B, k]."""
        x = self.obs_rms(obs) if self.obs_rms is not None else obs
        logits = self.pi(x)
        return logits if self.log_std is None else torch.cat([logits, self.log_std.expand_as(logits)], -1)

    def value(self, critic_obs: torch.Tensor) -> torch.Tensor:
        """The critic: centralized value inputs float32[B, D] -> V float32[B]."""
        x = self.critic_rms(critic_obs) if self.critic_rms is not None else critic_obs
        return self.vf(x).squeeze(-1)

    def forward(self, obs: torch.Tensor, critic_obs: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        return self.policy(obs), self.value(critic_obs)


class MAPPOPolicy(PPOPolicy):
    """PPO's policy with a centralized critic: acts from ``obs`` only (extras ``action_logp``,
    ``action_dist_inputs``); on the worker :meth:`postprocess_trajectory` adds ``vf_preds`` =
    V(``critic_obs``) and GAE; :meth:`model_forward` gives PPO's loss V(``critic_obs``).

    Raises:
        ConfigError: (when built) the section has no ``critic_input_dim``: not a PettingZoo run
            (set-up fills it in from the env).
    """

    model: CentralizedActorCritic  # type: ignore[assignment]
    train_columns = (*PPOPolicy.train_columns, CRITIC_OBS)  # type: ignore[assignment]

    def make_model(self) -> Any:
        from flowkit.config import normalize_obs_on
        dim = self.config.critic_input_dim
        if dim is None:
            raise ConfigError("algo=mappo needs a multi-agent PettingZoo env (env.factory=...): its critic's input "
                              "(mappo.critic_input) comes from the env's agents, and mappo.critic_input_dim is unset")
        model = CentralizedActorCritic(self.encoder, self.dist, self.model_config, int(dim),
                                       normalize_obs_on(self.model_config, self.config, "normalize_observations"),
                                       self.config.log_std_init, bool(self.config.normalize_rewards))
        return init_weights(model, self.model_config).to(self.device)

    # -- acting (worker): the actor alone --
    @torch.inference_mode()
    def compute_actions_encoded(self, obs, mask=None, explore=True, state=None):
        """Actions for encoded own observations float32[B, *shape]: ``(actions, {action_logp
        float32[B], action_dist_inputs float32[B, k]})``; the critic is not evaluated."""
        if mask is not None:
            self.check_mask(mask)
        inputs = self.model.policy(torch.from_numpy(np.ascontiguousarray(obs, self.encoder.dtype)))
        a, logp = self.dist.sample_logp(inputs, None if mask is None else torch.from_numpy(mask), explore,
                                        self.generator)
        return a.numpy(), {sb.ACTION_LOGP: logp.numpy(), sb.ACTION_DIST_INPUTS: inputs.numpy()}

    @torch.inference_mode()
    def compute_values(self, critic_obs: np.ndarray) -> np.ndarray:
        """V(critic_obs) for centralized value inputs float32[B, D] -> float32[B]."""
        return self.model.value(torch.from_numpy(np.ascontiguousarray(critic_obs, np.float32))).numpy()

    def bootstrap_values(self, batch: sb.SampleBatch, rows: np.ndarray) -> np.ndarray:
        """float32[k]: V(``next_critic_obs``) of ``rows`` (truncations and fragment cuts)."""
        return self.compute_values(np.asarray(batch[NEXT_CRITIC_OBS])[rows])

    def postprocess_trajectory(self, batch: sb.SampleBatch) -> sb.SampleBatch:
        """``vf_preds`` = V(``critic_obs``), then GAE (:meth:`add_gae`).

        Raises:
            ValueError: the batch has no ``critic_obs`` (it was not sampled by the multiagent runners).
        """
        if len(batch) and CRITIC_OBS not in batch:
            raise ValueError(f"a MAPPO batch needs the `{CRITIC_OBS}` column (columns: {sorted(batch)}): the "
                             "flowkit-multiagent runners add it to policies whose section has critic_input")
        out = sb.SampleBatch(batch)
        out[sb.VF_PREDS] = self.compute_values(out[CRITIC_OBS]) if len(out) else np.zeros(0, np.float32)
        return self.add_gae(out)

    # -- learning (driver) --
    def model_forward(self, batch: Dict[str, torch.Tensor], module: Any = None) -> Any:
        """``(dist_inputs from obs, V from critic_obs)`` of a prepared minibatch."""
        m = self.model if module is None else module
        return m.policy(batch[sb.OBS]), m.value(batch[CRITIC_OBS])

    @torch.no_grad()
    def update_normalizers(self, batch: Dict[str, torch.Tensor]) -> None:
        """The actor's and the critic's running input statistics (``normalize_observations``)
        and the return statistics (``normalize_rewards``), once per train batch."""
        super().update_normalizers(batch)
        if self.model.critic_rms is not None:
            self.model.critic_rms.update(batch[CRITIC_OBS].float())

    def worker_policy_class(self) -> Any:
        """None: the workers act with this torch policy (the critic runs in postprocessing)."""
        return None


class MAPPO(PPO, ref=MAPPO_REF):
    """MAPPO: PPO's plan (:class:`flowkit_ppo.ppo.PPO`) with :class:`MAPPOPolicy`."""

    policy_class = MAPPOPolicy

    @classmethod
    def check_model(cls, policy_id: str, model_config: Any, section: Any = None) -> None:
        """PPO's checks, and: no ``model.class`` and no ``model.shared_value_network`` (the actor
        and the critic take different inputs)."""
        super().check_model(policy_id, model_config, section)
        for key in ("class", "shared_value_network"):
            if model_config.get(key):
                raise ConfigError(f"policy {policy_id!r}: model.{key}={model_config.get(key)!r} is not supported by "
                                  "mappo (its actor and centralized critic take different inputs); unset it")


__all__ = ["CentralizedActorCritic", "MAPPO", "MAPPOPolicy"]
