"""The actor-critic policy base (PPO, IMPALA; A2C, APPO): an :class:`ActorCritic` network,
acting through its numpy mirror on CPU workers (torch otherwise), V(s) for bootstrapping
and GAE postprocessing. A new actor-critic algorithm subclasses it and writes its loss."""
from __future__ import annotations

import functools
from typing import Any, Callable, Optional

import numpy as np
import torch

from flowkit.core._models import ActorCritic
from flowkit.core._numpy_model import ActorCriticActing, NumpyActorCritic, NumpyActorCriticPolicy, numpy_layout
from flowkit.core.policy import Policy

_WORKER_SIDE = ("compute_actions_encoded", "compute_actions", "postprocess_trajectory", "add_gae", "compute_values",
                "_extras", "_act_numpy", "_compute_actions_torch", "make_model", "numpy_model", "set_weights")


class ActorCriticPolicy(ActorCriticActing, Policy):
    """A :class:`Policy` over an :class:`ActorCritic` model.

    Acting (:meth:`compute_actions_encoded`) stores ``action_logp`` per row and, when
    :attr:`store_values` is set, ``vf_preds`` (V(s) at sampling time) and
    ``action_dist_inputs``. :meth:`add_gae` computes advantages on the worker (as
    :meth:`postprocess_trajectory` when :attr:`worker_gae` is set).

    Config fields read: ``lr``, ``adam_eps``, ``log_std_init``, optionally
    ``normalize_observations``; ``gamma`` and ``gae_lambda`` for :meth:`add_gae`.

    Class attributes:
        store_values: acting evaluates the value network and stores ``vf_preds`` and
            ``action_dist_inputs`` (PPO); False acts with the policy network only (IMPALA).
        worker_gae: postprocess with :meth:`add_gae` (PPO); False: batches unchanged.
        twin: evaluate separate policy and value MLPs as one :class:`TwinMLP`.
    """

    store_values = True
    twin = True
    model: ActorCritic

    def __init__(self, observation_space, action_space, config, model_config=None, device="cpu",
                 seed=0, inference_only=False):
        super().__init__(observation_space, action_space, config, model_config, device, seed, inference_only)
        torch.manual_seed(seed)
        self.model = self.make_model().to(self.device)
        self._np_model: Optional[NumpyActorCritic] = None
        self._np_checked = False
        if not inference_only:
            self.optimizer = self.make_optimizer(config.lr, config.adam_eps)

    def make_model(self) -> ActorCritic:
        """The network (override for a custom model; the numpy mirror then steps aside)."""
        return ActorCritic(self.encoder, self.dist, self.model_config,
                           bool(getattr(self.config, "normalize_observations", False)),
                           self.config.log_std_init, twin=self.twin)

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

    def worker_policy_class(self) -> Optional[Callable[..., Any]]:
        """A :class:`NumpyActorCriticPolicy` (torch-free) when this policy acts through its
        numpy mirror with :class:`ActorCriticPolicy`'s own acting, values and postprocessing
        (a subclass that overrides any of them keeps torch on the workers)."""
        cls = type(self)
        mc = self.model_config
        if any(getattr(cls, m) is not getattr(ActorCriticPolicy, m) for m in _WORKER_SIDE) or (
                mc is None or not bool(getattr(mc, "numpy_inference", True))):
            return None
        lay = numpy_layout(self.model, self.dist, str(mc.activation))
        return None if lay is None else functools.partial(
            NumpyActorCriticPolicy, layout=lay, store_values=self.store_values, worker_gae=self.worker_gae,
            weights=self.get_weights())

    # -- acting (worker) --
    def compute_actions_encoded(self, obs, mask=None, explore=True):
        if mask is not None:
            self.check_mask(mask)
        npm = self.numpy_model()
        if npm is not None:  # the same network in numpy (cheaper per call on a few rows)
            return self._act_numpy(npm, obs, mask, explore)
        return self._compute_actions_torch(obs, mask, explore)

    @torch.inference_mode()
    def _compute_actions_torch(self, obs, mask=None, explore=True):
        x = torch.from_numpy(obs)
        inputs, value = self.model(x) if self.store_values else (self.model.policy(x), None)
        m = None if mask is None else torch.from_numpy(mask)
        a, logp = self.dist.sample_logp(inputs, m, explore, self.generator)
        return a.numpy(), self._extras(logp.numpy(), None if value is None else value.numpy(), inputs.numpy())

    @torch.inference_mode()
    def compute_values(self, obs: np.ndarray) -> np.ndarray:
        """V(obs) for encoded observations float32[B, *shape] -> float32[B]."""
        return self.model.value(torch.from_numpy(np.ascontiguousarray(obs, np.float32))).numpy()
