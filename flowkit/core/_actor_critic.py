"""The actor-critic policy base (PPO, IMPALA; A2C, APPO): an :class:`ActorCritic` network,
acting through its numpy mirror on CPU workers (torch otherwise), V(s) for bootstrapping
and GAE postprocessing. A new actor-critic algorithm subclasses it and writes its loss."""
from __future__ import annotations

from typing import Any, Dict, Optional

import numpy as np
import torch

from flowkit.core import batch as sb
from flowkit.core._models import ActorCritic
from flowkit.core._numpy_model import NumpyActorCritic, sample_logp_numpy
from flowkit.core._returns import bootstrap_rows, compute_gae, next_values
from flowkit.core.policy import Policy


class ActorCriticPolicy(Policy):
    """A :class:`Policy` over an :class:`ActorCritic` model.

    Acting (:meth:`compute_actions_encoded`) stores ``action_logp`` per row and, when
    :attr:`store_values` is set, ``vf_preds`` (V(s) at sampling time) and
    ``action_dist_inputs``. :meth:`add_gae` computes advantages on the worker.

    Config fields read: ``lr``, ``adam_eps``, ``log_std_init``, optionally
    ``normalize_observations``; ``gamma`` and ``gae_lambda`` for :meth:`add_gae`.

    Class attributes:
        store_values: acting evaluates the value network and stores ``vf_preds`` and
            ``action_dist_inputs`` (PPO); False acts with the policy network only (IMPALA).
        twin: evaluate separate policy and value MLPs as one :class:`TwinMLP`.
    """

    store_values = True
    twin = True
    model: Any  # an ActorCritic, or the network of model.class

    def __init__(self, observation_space, action_space, config, model_config=None, device="cpu",
                 seed=0, inference_only=False):
        super().__init__(observation_space, action_space, config, model_config, device, seed, inference_only)
        torch.manual_seed(seed)
        self.model = self.make_model().to(self.device)
        self._np_model: Optional[NumpyActorCritic] = None
        self._np_checked = False
        if not inference_only:
            self.optimizer = self.make_optimizer(config.lr, config.adam_eps)

    def make_model(self) -> Any:
        """The network (override for a custom model; the numpy mirror then steps aside)."""
        norm = bool(getattr(self.config, "normalize_observations", False))
        model = self.build_model(ActorCritic(self.encoder, self.dist, self.model_config, norm,
                                             self.config.log_std_init, twin=self.twin))
        if norm and getattr(model, "obs_rms", None) is None:
            from flowkit.config import ConfigError
            raise ConfigError(f"normalize_observations=true needs the model's `obs_rms` (a RunningMeanStd): "
                              f"model.class={self.model_config.get('class')!r} has none")
        return model

    def model_policy(self, x: torch.Tensor) -> torch.Tensor:
        """dist_inputs of the model: its ``policy`` method, else ``forward(x)[0]``."""
        return self.model.policy(x) if hasattr(self.model, "policy") else self.model(x)[0]

    def model_value(self, x: torch.Tensor) -> torch.Tensor:
        """V(x) of the model: its ``value`` method, else ``forward(x)[1]``."""
        return self.model.value(x) if hasattr(self.model, "value") else self.model(x)[1]

    def numpy_model(self) -> Optional[NumpyActorCritic]:
        """The :class:`NumpyActorCritic` mirror of ``self.model`` used for acting on CPU, or
        None (not an MLP actor-critic, ``model.numpy_inference=false``, or not on CPU)."""
        if not self._np_checked:
            self._np_checked = True
            mc = self.model_config
            if (self.device.type == "cpu" and isinstance(self.model, ActorCritic) and mc is not None
                    and bool(getattr(mc, "numpy_inference", True))):
                self._np_model = NumpyActorCritic.build(self.model, self.dist, str(mc.activation))
        return self._np_model

    # -- acting (worker) --
    def _extras(self, logp, value, inputs) -> Dict[str, np.ndarray]:
        if not self.store_values:
            return {sb.ACTION_LOGP: logp}
        return {sb.ACTION_LOGP: logp, sb.VF_PREDS: value, sb.ACTION_DIST_INPUTS: inputs}

    def compute_actions_encoded(self, obs, mask=None, explore=True):
        if mask is not None:
            self.check_mask(mask)
        npm = self.numpy_model()
        if npm is not None:  # the same network in numpy (cheaper per call on a few rows)
            inputs, value = npm.forward(obs, value=self.store_values)
            a, logp = sample_logp_numpy(self.dist, inputs, mask, explore, self.np_random)
            return a, self._extras(logp, value, inputs)
        return self._compute_actions_torch(obs, mask, explore)

    @torch.inference_mode()
    def _compute_actions_torch(self, obs, mask=None, explore=True):
        x = torch.from_numpy(obs)
        inputs, value = self.model(x) if self.store_values else (self.model_policy(x), None)
        m = None if mask is None else torch.from_numpy(mask)
        a, logp = self.dist.sample_logp(inputs, m, explore, self.generator)
        return a.numpy(), self._extras(logp.numpy(), None if value is None else value.numpy(), inputs.numpy())

    @torch.inference_mode()
    def compute_values(self, obs: np.ndarray) -> np.ndarray:
        """V(obs) for encoded observations float32[B, *shape] -> float32[B]."""
        return self.model_value(torch.from_numpy(np.ascontiguousarray(obs, np.float32))).numpy()

    # -- returns --
    def add_gae(self, batch: sb.SampleBatch) -> sb.SampleBatch:
        """A copy of ``batch`` (trajectory pieces with ``vf_preds``) with ``advantages`` and
        ``value_targets`` from :func:`compute_gae`; truncations and cuts bootstrap from
        V(``next_obs``) under the current weights, terminations from 0."""
        out = sb.SampleBatch(batch)
        if len(out) == 0:
            return out
        v = np.asarray(out[sb.VF_PREDS], np.float32)
        cont, boot = bootstrap_rows(out)
        boot_v = self.compute_values(np.asarray(out[sb.NEXT_OBS])[boot]) if len(boot) else None
        adv, vt = compute_gae(np.asarray(out[sb.REWARDS], np.float32), v, next_values(v, cont, boot, boot_v),
                              cont, self.config.gamma, self.config.gae_lambda)
        out[sb.ADVANTAGES], out[sb.VALUE_TARGETS] = adv, vt
        return out
