"""The :class:`Policy` base class (owns a network and the math of one algorithm) and
:class:`RandomPolicy`. Encoders, distributions and networks live in the private modules
``_encoders``, ``_distributions`` and ``_models`` (public through :mod:`flowkit.core`)."""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from flowkit.core import batch as sb
from flowkit.core._distributions import ActionDist
from flowkit.core._encoders import ObsEncoder, add_batch_axis, batch_len


class Policy:
    """Base class of every policy: owns the network and the math of one algorithm.

    Lifecycle: built on the driver (learner copy, with optimizer) and on every rollout
    worker (inference copy, ``inference_only=True``). Workers call
    :meth:`compute_actions_encoded` each env step and :meth:`postprocess_trajectory` on each
    finished fragment; the :class:`~flowkit.core.learner.Learner` calls :meth:`prepare_batch`,
    :meth:`loss` per minibatch and :meth:`on_train_batch_end`; weights travel as
    ``{name: np.ndarray}`` (:meth:`get_weights` / :meth:`set_weights`).

    Subclass and override :meth:`loss` (or any other method) to make a variant.

    Args:
        observation_space: the raw observation space of the agents mapped to this policy.
        action_space: their action space.
        config: the algorithm's config section (a dataclass instance, read-only by convention).
        model_config: the ``model.*`` section.
        device: ``"cpu"`` or ``"cuda"`` (the learner's; workers always use cpu).
        seed: seeds this policy's sampling RNG.
        inference_only: build no optimizer (rollout workers).
    """

    def __init__(self, observation_space: gym.Space, action_space: gym.Space, config: Any,
                 model_config: Any = None, device: str = "cpu", seed: int = 0,
                 inference_only: bool = False):
        self.observation_space, self.action_space = observation_space, action_space
        self.config, self.model_config = config, model_config
        self.device = torch.device(device)
        self.encoder = ObsEncoder(observation_space)
        self.dist = ActionDist(action_space)
        self.inference_only = inference_only
        self.generator = torch.Generator().manual_seed(int(seed) % (2 ** 63))
        self.np_random = np.random.default_rng(seed)
        self.model: Optional[nn.Module] = None
        self.optimizer: Optional[FlatAdam] = None
        self.num_updates = 0  # learner updates applied to these weights (policy lag)

    # ---- acting ---------------------------------------------------------------------------
    def compute_actions_encoded(self, obs: np.ndarray, mask: Optional[np.ndarray] = None,
                                explore: bool = True) -> Tuple[np.ndarray, Dict[str, np.ndarray]]:
        """Actions for encoded observations ``float32[B, *shape]``.

        Returns:
            ``(actions, extras)``: actions as sampled (numpy, ``[B]`` or ``[B, k]``) and
            per-row extras to store in the batch (e.g. ``action_logp``, ``vf_preds``).
        Raises:
            ValueError: if a row of ``mask`` allows no action.
        """
        raise NotImplementedError

    def compute_actions(self, obs: Any, explore: bool = False) -> np.ndarray:
        """Env-ready actions for raw observations (one, or a batch with a leading axis).

        Raises:
            ValueError: an observation whose action mask allows nothing.
        """
        batched = self.encoder.is_batched(obs)
        if not batched:
            obs = add_batch_axis(obs)
        enc, mask = self.encoder(obs, batch_len(obs))
        actions, _ = self.compute_actions_encoded(enc, mask, explore)
        env_actions = self.dist.to_env(actions)
        return env_actions if batched else env_actions[0]

    @staticmethod
    def check_mask(mask: Optional[np.ndarray], where: str = "") -> None:
        if mask is not None and mask.shape[0] and not mask.any(axis=1).all():
            rows = np.flatnonzero(~mask.any(axis=1)).tolist()
            raise ValueError(f"action_mask allows no action in rows {rows}{where}: "
                             "an agent asked to act needs at least one legal action")

    # ---- learning ---------------------------------------------------------------------------
    def postprocess_trajectory(self, batch: sb.SampleBatch) -> sb.SampleBatch:
        """Per-trajectory processing on the worker (GAE, n-step). Default: unchanged.

        ``batch`` holds one or more contiguous trajectory pieces (see :mod:`batch`)."""
        return batch

    def prepare_batch(self, batch: sb.SampleBatch) -> Dict[str, torch.Tensor]:
        """Columns as tensors on the learner device (once per train batch)."""
        return {k: to_tensor(v, self.device) for k, v in batch.items()}

    def loss(self, batch: Dict[str, torch.Tensor]) -> Tuple[torch.Tensor, Dict[str, float]]:
        """Return ``(loss, stats)`` for one minibatch of tensors."""
        raise NotImplementedError

    def make_optimizer(self, lr: float, eps: float = 1e-8, module: Optional[nn.Module] = None,
                       sizes: Optional[List[int]] = None) -> "FlatAdam":
        """Adam over all trainable parameters of ``module`` (default ``self.model``), kept in
        one flat buffer: the module's parameters become views into it, so Adam and gradient
        clipping are a handful of tensor ops per step instead of a few per parameter (the
        difference is most of a small MLP's step time on CPU). ``sizes``: the buffer split into
        contiguous segments in parameter order, each an Adam of its own (see :class:`FlatAdam`)."""
        module = module if module is not None else self.model
        assert module is not None, "make_optimizer: the policy has no model"
        self._params, self._flat = flat_parameters(module, self.device)
        return FlatAdam(self._flat, lr, eps, sizes)

    def on_train_batch_end(self, batch: Dict[str, torch.Tensor]) -> Dict[str, float]:
        """Called by the Learner after all epochs on a train batch (schedules, stats)."""
        return {}

    def set_progress(self, frac: float) -> None:
        """Schedules (set by the UpdateSchedules operator): ``frac`` in [0, 1] of the horizon
        done (clipped). With ``<algo>.lr_schedule=linear`` the learning rate becomes
        ``<algo>.lr * (1 - frac)``; other schedules are the algorithm's own."""
        if getattr(self.config, "lr_schedule", "constant") == "linear":
            lr = self.config.lr * (1.0 - min(max(frac, 0.0), 1.0))
            for g in self.optimizer.param_groups if self.optimizer is not None else ():
                g["lr"] = lr

    # ---- weights and state ----------------------------------------------------------------
    def get_weights(self) -> Dict[str, np.ndarray]:
        if self.model is None:
            return {}
        return {k: v.detach().cpu().numpy().copy() for k, v in self.model.state_dict().items()}

    def set_weights(self, weights: Dict[str, np.ndarray]) -> None:
        if self.model is None:
            return
        self.model.load_state_dict({k: torch.as_tensor(np.array(v)) for k, v in weights.items()})

    def get_state(self) -> Dict[str, Any]:
        """Weights, optimizer state, update count and RNG states (for exact resume)."""
        return {"weights": self.get_weights(),
                "optimizer": self.optimizer.state_dict() if self.optimizer is not None else None,
                "num_updates": self.num_updates,
                "generator": self.generator.get_state(),
                "np_random": self.np_random.bit_generator.state}

    def set_state(self, state: Dict[str, Any]) -> None:
        self.set_weights(state["weights"])
        if self.optimizer is not None and state.get("optimizer") is not None:
            self.optimizer.load_state_dict(state["optimizer"])
        self.num_updates = int(state.get("num_updates", 0))
        if state.get("generator") is not None:
            self.generator.set_state(state["generator"])
        if state.get("np_random") is not None:
            self.np_random.bit_generator.state = state["np_random"]


def flat_parameters(module: nn.Module, device: Any = "cpu",
                    trainable_only: bool = True) -> Tuple[List[nn.Parameter], torch.Tensor]:
    """Move the parameters of ``module`` (those with ``requires_grad`` when ``trainable_only``)
    into one flat buffer, in ``module.parameters()`` order: each becomes a view of it.
    Returns ``(params, flat)``; an op on ``flat`` (an optimizer step, a Polyak average) acts on
    all of them at once."""
    params = [p for p in module.parameters() if p.requires_grad or not trainable_only]
    flat = torch.zeros(sum(p.numel() for p in params), device=device, dtype=params[0].dtype)
    off = 0
    for p in params:
        n = p.numel()
        flat[off:off + n].copy_(p.data.reshape(-1))
        p.data = flat[off:off + n].view_as(p)
        off += n
    return params, flat


class FlatAdam:
    """``torch.optim.Adam`` over one flat parameter buffer: the same functional kernel (bit
    for bit the same updates) and the same ``state_dict`` layout, without the Optimizer
    class, whose construction imports ``torch._dynamo`` (seconds at start-up).

    ``sizes`` splits the buffer into contiguous segments, each its own param group with its
    own Adam state (as several ``torch.optim.Adam``); ``active`` (indexes, None: all) names the
    segments the next :meth:`step` updates (TD3's delayed actor: the critic alone most steps).
    """

    def __init__(self, flat: torch.Tensor, lr: float, eps: float = 1e-8, sizes: Optional[List[int]] = None):
        self.flat = flat
        sizes = [flat.numel()] if sizes is None else [int(n) for n in sizes]
        if sum(sizes) != flat.numel():
            raise ValueError(f"FlatAdam: segment sizes {sizes} do not add up to {flat.numel()}")
        ends = np.cumsum([0, *sizes]).tolist()
        self.segments = [slice(a, b) for a, b in zip(ends[:-1], ends[1:])]
        self.param_groups: List[Dict[str, Any]] = [dict(
            lr=lr, betas=(0.9, 0.999), eps=eps, weight_decay=0, amsgrad=False, maximize=False, foreach=None,
            capturable=False, differentiable=False, fused=None, decoupled_weight_decay=False, params=[i])
            for i in range(len(sizes))]
        self.state: Dict[int, Dict[str, torch.Tensor]] = {}
        self.active: Optional[List[int]] = None

    @torch.no_grad()
    def step(self) -> None:
        from torch.optim.adam import adam
        grad = self.flat.grad
        assert grad is not None
        for i in range(len(self.segments)) if self.active is None else self.active:
            g, seg = self.param_groups[i], self.segments[i]
            p = self.flat[seg]
            if (s := self.state.get(i)) is None:  # not setdefault: its default would be built every step
                s = self.state[i] = {"step": torch.tensor(0.0), "exp_avg": torch.zeros_like(p),
                                     "exp_avg_sq": torch.zeros_like(p)}
            adam([p], [grad[seg]], [s["exp_avg"]], [s["exp_avg_sq"]], [], [s["step"]], amsgrad=False,
                 beta1=g["betas"][0], beta2=g["betas"][1], lr=g["lr"], weight_decay=0, eps=g["eps"], maximize=False)

    def state_dict(self) -> Dict[str, Any]:
        return {"state": dict(self.state), "param_groups": [dict(g) for g in self.param_groups]}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        for g, sg in zip(self.param_groups, state["param_groups"]):
            g.update({k: v for k, v in sg.items() if k != "params"})
        self.state = {int(i): {k: v.detach().clone() if k == "step" else v.detach().to(self.flat).clone()
                               for k, v in st.items()} for i, st in state["state"].items()}


def to_tensor(x: Any, device: Any = "cpu") -> torch.Tensor:
    """A tensor of ``x`` on ``device``; read-only arrays (as Ray returns them) are copied."""
    a = np.asarray(x)
    if not a.flags.writeable:
        a = a.copy()
    return torch.as_tensor(a, device=device)



class RandomPolicy(Policy):
    """Uniform over the legal actions (masks respected); learns nothing."""

    def compute_actions_encoded(self, obs, mask=None, explore=True):
        b = obs.shape[0]
        if self.dist.kind == "cat":
            n = self.dist.num_outputs
            if mask is not None:
                self.check_mask(mask)
                scores = self.np_random.random((b, n)) * mask + mask
                acts = scores.argmax(1)
            else:
                acts = self.np_random.integers(0, n, size=b)
            return acts.astype(np.int64), {}
        if self.dist.kind == "multicat":
            return np.stack([self.np_random.integers(0, n, size=b) for n in self.dist.nvec], 1), {}
        if self.dist.kind == "bern":
            return self.np_random.integers(0, 2, size=(b, self.dist.num_outputs)), {}
        if self.dist.kind == "gauss":
            return self.np_random.uniform(-1, 1, size=(b, self.dist.dim)).astype(np.float32), {}
        return self.np_random.standard_normal((b, self.dist.dim)).astype(np.float32), {}

    def loss(self, batch):
        raise RuntimeError("the random policy does not learn")
