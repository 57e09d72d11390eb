"""The :class:`Policy` base class (owns a network and the math of one algorithm) and
:class:`RandomPolicy`. Encoders, distributions and networks live in
:mod:`flowkit.core.encoders`, :mod:`~flowkit.core.distributions` and :mod:`~flowkit.core.models`."""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from flowkit.core import batch as sb
from flowkit.core._numpy_model import Acting
from flowkit.core.distributions import ActionDist
from flowkit.core.encoders import ObsEncoder
from flowkit.core.recurrent import forward_sequences, is_recurrent
from flowkit.core.target_network import TargetNetwork, flat_parameters


class Policy(Acting):
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
        model_config: the ``model.*`` section; keys not given (None: all) take the defaults of
            :class:`flowkit.config.ModelConfig` (``self.model_config`` has every key).
        device: ``"cpu"`` or ``"cuda"`` (the learner's; workers always use cpu).
        seed: seeds this policy's sampling RNG.
        inference_only: build no optimizer (rollout workers).

    Attributes:
        train_columns: the columns :meth:`prepare_batch` gives :meth:`loss` (those present);
            None: every column.
        state_attrs: names of scalar attributes (``float``, ``int``) saved by :meth:`get_state`
            and restored, with their type, by :meth:`set_state` (DQN's ``("epsilon",)``).
        target: a :class:`~flowkit.core.TargetNetwork` (learner copies of DQN, APPO, SAC, TD3;
            saved as ``target_weights``; the ``UpdateTargetNetwork`` operator moves it), or None.
    """

    train_columns: Optional[Tuple[str, ...]] = None
    state_attrs: Tuple[str, ...] = ()
    shard_rows: Optional[Tuple[int, int, int]] = None
    """``(start, stop, rows)`` while a learner of a group computes :meth:`loss` on rows
    ``[start, stop)`` of a ``rows``-row minibatch (set by the :class:`~flowkit.core.Learner`);
    None otherwise. :meth:`randn` reads it."""
    _frames_cnn: Optional[bool] = None  # (prepare_batch: the model has a FramesCNN; found on first use)

    def __init__(self, observation_space: gym.Space, action_space: gym.Space, config: Any,
                 model_config: Any = None, device: str = "cpu", seed: int = 0,
                 inference_only: bool = False):
        self.observation_space, self.action_space = observation_space, action_space
        from omegaconf import OmegaConf

        from flowkit.config import ModelConfig
        # every key of the model.* section: ModelConfig's defaults under what is given (None: all)
        given = model_config or {}
        if hasattr(given, "__dict__") and not OmegaConf.is_config(given) and not dataclasses.is_dataclass(given):
            given = vars(given)  # a namespace of model.* keys
        model_config = OmegaConf.merge(OmegaConf.structured(ModelConfig), given)
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
        self.target: Optional[TargetNetwork] = None

    def build_model(self, default: nn.Module) -> nn.Module:
        """``default`` (the policy's own network, initialised as ``model.init`` says:
        :func:`~flowkit.core.init_weights`), or the custom network of ``model.class``.

        The custom-model contract: ``model.class=module:Class`` names a ``torch.nn.Module``
        subclass importable where the run (and a later ``from_checkpoint``) runs; flowkit
        builds it as ``Class(encoder, num_outputs, model_config)`` -- ``encoder`` the
        :class:`~flowkit.core.ObsEncoder` (``encoder.shape``: the encoded observation's shape),
        ``num_outputs`` the last dimension of the default network's first output, and
        ``model_config`` the ``model.*`` section -- and its ``forward(obs float32[B,
        *encoder.shape])`` (``encoder.dtype``: uint8 frames for uint8 images, to be scaled inside) must return what the default network returns, in structure, shape
        and dtype: ``(dist_inputs float32[B, num_outputs], value float32[B])`` for the
        actor-critic policies (PPO, IMPALA), ``q float32[B, num_actions]`` for DQN. Optional
        methods ``policy(obs)`` and ``value(obs)`` (actor-critics) skip the other head;
        ``obs_rms`` (a :class:`~flowkit.core.RunningMeanStd`) enables
        ``normalize_observations``. Checkpoints name the class in their config, never store
        its code.

        A recurrent custom network (one with an ``initial_state`` method) follows the
        recurrent-model contract of :mod:`flowkit.core.recurrent` instead: ``initial_state(n)
        -> float32[n, S]`` and ``forward(obs float32[N, L, *shape], state float32[N, S], resets
        bool[N, L] or None)`` returning the same outputs with the leading axes ``[N, L]``, then
        the state after the last step; the probe runs it on 2 sequences of 3 steps. With
        ``model.recurrent`` set the network must be recurrent.

        Raises:
            ConfigError: the class does not import, is not a Module, cannot be built with
                those arguments, or its outputs on a probe batch differ from the default's.
        """
        from flowkit.config import ConfigError
        from flowkit.core.models import acting_layout, init_weights
        init_weights(default, self.model_config)  # model.init (the custom network's init is its own)
        spec = self.model_config["class"]
        if not spec:
            if self.inference_only and self.device.type == "cpu" and self.encoder.is_image:
                acting_layout(default)  # a rollout worker's CNN: same function, faster on CPU
            return default
        from flowkit.core.names import resolve
        cls = resolve(str(spec), "model.class")
        if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
            raise ConfigError(f"model.class={spec!r} is {cls!r}, not a torch.nn.Module subclass")
        probe = torch.from_numpy(np.zeros((2, *self.encoder.shape), self.encoder.dtype))
        with torch.no_grad():
            want = _probe(default, probe)
        n = int((want[0] if isinstance(want, tuple) else want).shape[-1])
        try:
            model = cls(self.encoder, n, self.model_config)
            with torch.no_grad():
                got = _probe(model, probe)
        except Exception as e:
            call = (f"forward({self.encoder.dtype}[2, 3, {', '.join(map(str, self.encoder.shape))}], initial_state(2), "
                    "None)" if is_recurrent(locals().get("model")) else
                    f"forward({self.encoder.dtype}[2, {', '.join(map(str, self.encoder.shape))}])")
            raise ConfigError(f"model.class={spec!r}: Class(encoder, num_outputs={n}, model_config) then "
                              f"{call} failed: {type(e).__name__}: {e}") from None
        if self.model_config.recurrent and not is_recurrent(model):
            raise ConfigError(f"model.recurrent={self.model_config.recurrent!r} needs a recurrent network: "
                              f"model.class={spec!r} has no initial_state(n) method (see Policy.build_model)")

        def shape(x: Any) -> str:
            if isinstance(x, tuple):
                return "(" + ", ".join(shape(y) for y in x) + ")"
            return f"{str(x.dtype).replace('torch.', '')}{list(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__
        if shape(got) != shape(want):
            raise ConfigError(f"model.class={spec!r}: forward returned {shape(got)} for a batch of 2 observations; "
                              f"{type(self).__name__} expects {shape(want)} (as its default {type(default).__name__})")
        return model.to(self.device)

    # ---- recurrence (model.recurrent, or a model.class network with initial_state) --------------
    @property
    def is_recurrent(self) -> bool:
        """Whether the network is recurrent (follows the contract of :mod:`flowkit.core.recurrent`)."""
        return is_recurrent(self.model)

    @property
    def max_seq_len(self) -> int:
        """Rows per training sequence (``model.max_seq_len``)."""
        return int(self.model_config.max_seq_len)

    def initial_state(self, n: int) -> Optional[np.ndarray]:
        """float32[n, S]: the recurrent state of ``n`` rows at an episode start; None for a
        feed-forward network (see :meth:`Acting.initial_state`)."""
        if not self.is_recurrent:
            return None
        m: Any = self.model
        return m.initial_state(n).detach().cpu().numpy().astype(np.float32, copy=False)

    def model_forward(self, batch: Dict[str, torch.Tensor], module: Optional[nn.Module] = None) -> Any:
        """``module`` (default ``self.model``) on a prepared (mini)batch, as flat rows: a
        feed-forward network on ``obs``; a recurrent one over the batch's whole sequences
        (``seq_lens``, each from its first row's ``state_in``: :func:`forward_sequences`),
        returning what the feed-forward network would (a tuple, or the one output)."""
        m = self.model if module is None else module
        assert m is not None, "model_forward: the policy has no model"
        if not is_recurrent(m):
            return m(batch[sb.OBS])
        outs = forward_sequences(m, batch[sb.OBS], batch[sb.SEQ_LENS], batch[sb.STATE_IN])
        return outs[0] if len(outs) == 1 else outs

    def sequence_columns(self, batch: sb.SampleBatch) -> Dict[str, torch.Tensor]:
        """What a recurrent policy's prepared batch adds to its columns: ``state_in`` (per row)
        and ``seq_lens`` (:func:`~flowkit.core.batch.sequence_lengths` with ``model.max_seq_len``);
        the :class:`~flowkit.core.learner.Learner` cuts minibatches along ``seq_lens``.
        ``{}`` for a feed-forward policy."""
        if not self.is_recurrent:
            return {}
        if sb.STATE_IN not in batch:
            raise ValueError(f"a recurrent policy's batch has no `{sb.STATE_IN}` column (columns: {sorted(batch)}): "
                             "was it sampled by a runner that keeps recurrent state?")
        return {sb.STATE_IN: to_tensor(batch[sb.STATE_IN], self.device),
                sb.SEQ_LENS: torch.as_tensor(sb.sequence_lengths(batch, self.max_seq_len), device=self.device)}

    # ---- acting (compute_actions_encoded, compute_actions, check_mask, postprocess_trajectory:
    # see Acting) ----------------------------------------------------------------------------
    def worker_policy_class(self) -> Optional[Callable[..., Any]]:
        """What Ray rollout workers build instead of ``type(self)`` (called with the same
        arguments): a torch-free acting copy, or None (``type(self)``). Asked on the driver."""
        return None

    def action_model(self) -> Optional[nn.Module]:
        """The network from encoded observations ``float32[B, *shape]`` to the action
        distribution's inputs ``float32[B, k]`` (logits, Q-values, or a Gaussian's mean then
        log-std), observation normalisation included: what ``flowkit export`` wraps with the
        encoding and greedy action selection. Default: ``self.model``; None: nothing to export."""
        return self.model

    # ---- learning ---------------------------------------------------------------------------
    def prepare_batch(self, batch: sb.SampleBatch) -> Dict[str, torch.Tensor]:
        """The :attr:`train_columns` of ``batch`` as tensors on the learner device (once per
        train batch). Frames (``obs`` and ``next_obs`` of 4 dimensions) for a model with a
        :class:`~flowkit.core.FramesCNN` on a CPU learner are laid out channels-last here, once:
        minibatches cut from them stay so, and its convolutions take them without a copy each."""
        keys = batch.keys() if self.train_columns is None else [k for k in self.train_columns if k in batch]
        out = {k: to_tensor(batch[k], self.device) for k in keys}
        if self.device.type == "cpu":
            if self._frames_cnn is None:
                self._frames_cnn = any(getattr(m, "channels_last_frames", False) for m in self.model.modules()) \
                    if isinstance(self.model, nn.Module) else False
            for k in (sb.OBS, sb.NEXT_OBS) if self._frames_cnn else ():
                if k in out and out[k].dim() == 4:
                    out[k] = out[k].contiguous(memory_format=torch.channels_last)
        out.update(self.sequence_columns(batch))
        return out

    def loss(self, batch: Dict[str, torch.Tensor]) -> Tuple[torch.Tensor, Dict[str, float]]:
        """Return ``(loss, stats)`` for one minibatch of tensors."""
        raise NotImplementedError

    def make_optimizer(self, lr: float, eps: float = 1e-8, module: Optional[nn.Module] = None,
                       sizes: Optional[List[int]] = None) -> "FlatAdam":
        """Adam (or RMSprop where the config says ``optimizer: rmsprop``, with its
        ``rmsprop_alpha``) over all trainable parameters of ``module`` (default ``self.model``), kept in
        one flat buffer: the module's parameters become views into it, so Adam and gradient
        clipping are a handful of tensor ops per step instead of a few per parameter (the
        difference is most of a small MLP's step time on CPU). ``sizes``: the buffer split into
        contiguous segments in parameter order, each an Adam of its own (see :class:`FlatAdam`)."""
        module = module if module is not None else self.model
        assert module is not None, "make_optimizer: the policy has no model"
        self._params, self._flat = flat_parameters(module, self.device)
        if getattr(self.config, "optimizer", "adam") == "rmsprop":
            return FlatRMSprop(self._flat, lr, self.config.rmsprop_alpha, eps)
        return FlatAdam(self._flat, lr, eps, sizes)

    def compute_gradients(self, batch: sb.SampleBatch) -> Tuple[np.ndarray, Dict[str, float]]:
        """``(gradient, stats)``: d :meth:`loss` / d parameters on ``batch`` (all its rows, one
        step), float32[P] flat in :meth:`make_optimizer`'s order, and the loss stats. Runs on
        rollout workers in A3C's plan (the Learner applies the gradient)."""
        assert self.model is not None, "compute_gradients: the policy has no model"
        params = getattr(self, "_params", None) or [p for p in self.model.parameters() if p.requires_grad]
        loss, stats = self.loss(self.prepare_batch(batch))
        return flat_gradient(params, loss).cpu().numpy(), stats

    def prepare_minibatch(self, batch: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
        """A learner of a group calls this on the whole minibatch before it takes its rows
        (:attr:`shard_rows`) for :meth:`loss`: the place of a loss's statistics over the
        minibatch (PPO's advantage standardisation), which :meth:`loss` then skips while
        :attr:`shard_rows` is set. Default: the batch as it is."""
        return batch

    def randn(self, rows: int, *shape: int) -> torch.Tensor:
        """Standard normal noise float32[rows, *shape] on :attr:`device` from :attr:`generator`
        (a loss's per-row noise: SAC's reparameterised actions). In a learner group
        (:attr:`shard_rows` set) the whole minibatch's noise is drawn and this learner's rows
        of it returned, so the group draws what one learner would and ends in the same
        generator state."""
        if self.shard_rows is None:
            return torch.randn(rows, *shape, generator=self.generator).to(self.device)
        a, b, n = self.shard_rows
        if b - a != rows:
            raise ValueError(f"randn({rows}) in a learner group's shard of rows [{a}, {b}) of {n}")
        return torch.randn(n, *shape, generator=self.generator)[a:b].to(self.device)

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

    def current_lr(self) -> float:
        """The optimizer's learning rate now (after :meth:`set_progress`); ``config.lr``
        without an optimizer."""
        return float(self.optimizer.param_groups[0]["lr"]) if self.optimizer is not None else float(self.config.lr)

    # ---- weights and state ----------------------------------------------------------------
    def get_weights(self) -> Dict[str, np.ndarray]:
        """``self.model``'s state dict as numpy arrays (copies, on CPU): what travels to the
        workers."""
        if self.model is None:
            return {}
        return {k: v.detach().cpu().numpy().copy() for k, v in self.model.state_dict().items()}

    def set_weights(self, weights: Dict[str, np.ndarray]) -> None:
        """Load what :meth:`get_weights` returned (the arrays are copied)."""
        if self.model is None:
            return
        self.model.load_state_dict({k: torch.as_tensor(np.array(v)) for k, v in weights.items()})

    def get_state(self) -> Dict[str, Any]:
        """Weights, optimizer state, update count, RNG states, the :attr:`state_attrs` and the
        target network's weights (for exact resume)."""
        return {"weights": self.get_weights(),
                "optimizer": self.optimizer.state_dict() if self.optimizer is not None else None,
                "num_updates": self.num_updates,
                "generator": self.generator.get_state(),
                "np_random": self.np_random.bit_generator.state,
                **{k: getattr(self, k) for k in self.state_attrs},
                **({"target_weights": self.target.get_state()} if self.target is not None else {})}

    def set_state(self, state: Dict[str, Any]) -> None:
        """Restore what :meth:`get_state` returned (exact resume: weights, optimizer, update
        count, RNG states)."""
        self.set_weights(state["weights"])
        if self.optimizer is not None and state.get("optimizer") is not None:
            self.optimizer.load_state_dict(state["optimizer"])
        self.num_updates = int(state.get("num_updates", 0))
        if state.get("generator") is not None:
            self.generator.set_state(state["generator"])
        if state.get("np_random") is not None:
            self.np_random.bit_generator.state = state["np_random"]
        for k in self.state_attrs:
            if k in state:
                setattr(self, k, type(getattr(self, k))(state[k]))
        if self.target is not None and state.get("target_weights") is not None:
            self.target.set_state(state["target_weights"])


class ObsNormPolicy(Policy):
    """A :class:`Policy` whose network takes normalised observations (DQN, SAC, TD3; an
    :class:`~flowkit.core.ActorCritic` normalises inside its own ``forward`` instead).

    With ``model.normalize_obs`` (flat observations only), :meth:`add_obs_rms` gives
    ``self.model`` an ``obs_rms``, a :class:`~flowkit.core.RunningMeanStd` over the encoded
    observation (buffers ``obs_rms.mean`` and ``obs_rms.var`` float32[d], ``obs_rms.count``
    float64[]: outside the optimizer's parameters, inside the weights and checkpoints);
    :meth:`norm` applies it when acting; :meth:`prepare_batch` updates it from each train
    batch's ``obs`` (replayed rows: the buffer's distribution), then hands the loss ``obs`` and
    ``next_obs`` normalised: ``clip((obs - mean) / sqrt(var + 1e-8), -10, 10)``.
    """

    model: Any  # the subclass's network

    def add_obs_rms(self, algo: str) -> None:
        """Give ``self.model`` its ``obs_rms`` when ``model.normalize_obs`` is on (call after
        building the model, before copying it to a target network).

        Raises:
            ConfigError: ``model.normalize_obs`` with image observations (naming ``algo``)."""
        if not self.model_config.normalize_obs:
            return
        if self.encoder.is_image:
            from flowkit.config import ConfigError
            raise ConfigError(f"model.normalize_obs=true: {algo} normalises flat observations only, got image "
                              f"observations {self.observation_space} (uint8 frames are scaled to [0, 1] inside the "
                              "CNN); remove model.normalize_obs")
        from flowkit.core.models import RunningMeanStd
        self.model.obs_rms = RunningMeanStd(self.encoder.shape).to(self.device)

    def norm(self, obs: torch.Tensor) -> torch.Tensor:
        """``obs`` float32[B, *shape] normalised by the running statistics (``model.normalize_obs``;
        else as it is)."""
        rms = getattr(self.model, "obs_rms", None)
        return obs if rms is None else rms(obs)

    def prepare_batch(self, batch: sb.SampleBatch) -> Dict[str, torch.Tensor]:
        out = super().prepare_batch(batch)
        rms = getattr(self.model, "obs_rms", None)
        if rms is not None:
            rms.update(out[sb.OBS].float())
            out[sb.OBS], out[sb.NEXT_OBS] = rms(out[sb.OBS].float()), rms(out[sb.NEXT_OBS].float())
        return out


def _probe(model: Any, probe: torch.Tensor) -> Any:
    """A network's outputs on the probe batch ``probe[2, *shape]``, as the feed-forward network
    returns them: a recurrent one runs on 2 sequences of 3 steps, its state dropped and the
    last step's outputs kept (``[2, ...]``)."""
    if not is_recurrent(model):
        return model(probe)
    state = model.initial_state(2)
    if not (isinstance(state, torch.Tensor) and state.ndim == 2 and state.shape[0] == 2):
        raise TypeError(f"initial_state(2) returned {type(state).__name__} "
                        f"{list(state.shape) if isinstance(state, torch.Tensor) else ''}, not a float32[2, S] tensor")
    outs = model(probe[:, None].expand(2, 3, *probe.shape[1:]), state, None)
    if not (isinstance(outs, tuple) and len(outs) >= 2 and isinstance(outs[-1], torch.Tensor)
            and tuple(outs[-1].shape) == tuple(state.shape)):
        raise TypeError("forward(obs, state, resets) must return (*outputs, state_out) with state_out shaped as "
                        f"the state {list(state.shape)}")
    last = tuple(o[:, -1] for o in outs[:-1])
    return last[0] if len(last) == 1 else last


def flat_gradient(params: Sequence[torch.Tensor], loss: torch.Tensor) -> torch.Tensor:
    """``d loss / d params`` as one flat float32[P] tensor, ``params`` in order (zeros for a
    parameter the loss does not reach); their ``.grad`` is reset first."""
    for p in params:
        p.grad = None
    loss.backward()
    return torch.cat([p.grad.reshape(-1) if p.grad is not None
                      else torch.zeros(p.numel(), dtype=p.dtype, device=p.device) for p in params])


class FlatAdam:
    """``torch.optim.Adam`` over one flat parameter buffer: torch's own functional kernel and the
    same ``state_dict`` layout, without the Optimizer class, whose construction imports
    ``torch._dynamo`` (seconds at start-up). On CPU the kernel is the fused one (``fused``:
    one pass over the buffer; bit for bit ``torch.optim.Adam(fused=True)``, within float
    rounding of the single-tensor kernel); elsewhere (``learner.device=cuda``) torch's default
    choice, as before (``fused`` None; not measured here: no GPU).

    ``sizes`` splits the buffer into contiguous segments, each its own param group with its
    own Adam state (as several ``torch.optim.Adam``); ``active`` (indexes, None: all) names the
    segments the next :meth:`step` updates (TD3's delayed actor: the critic alone most steps).

    Why not ``torch.optim.Adam`` over the same flat buffer (issue 22; ``python bench/learner.py
    --optimizers``: PPO Learner steps/s, 2048 rows, 64x64 MLP, 4 epochs, one torch thread,
    alternating, median of 5, torch 2.13 on a shared 2-core CPU; another run of 3 varied by
    +-15%)::

        minibatch   FlatAdam   Adam          Adam foreach   Adam fused
        64          858        882 (1.03x)   782 (0.91x)    838 (0.98x)
        256         656        642 (0.98x)   600 (0.92x)    651 (0.99x)

    The steps are the same speed (within noise); what differs is the first construction:
    ``torch.optim.Adam(...)`` imports ``torch._dynamo``, 1.25-1.40 s (3 fresh processes),
    against 0.001 s for FlatAdam, in every process that learns -- a quarter of a whole
    ``flowkit train`` that solves CartPole in about 5.1 s (README) -- and ``sizes``/``active``
    would need one optimizer per segment.

    Issue 49 (5 fresh processes each, alternating, a 2-core machine under a load of 20-25): the
    first ``torch.optim.Adam(...)`` of a process took 15.4 s median (``fused=True`` 12.9 s),
    ``FlatAdam(...)`` 0.00015 s: kept, as every learning process pays that once. The steps
    (``bench/learner.py --optimizers``, same run, median of 5): minibatch 64, 138 steps/s
    against 124 for ``Adam(fused=True)``; 256, 150 against 86 (noisy at that load). Round 3
    (today's main, load 20-46): the first ``torch.optim.Adam(...)`` 6.5-7.7 s (``fused=True``
    6.1-8.5 s; 3 fresh processes each, alternating), ``FlatAdam(...)`` 0.0002-0.0005 s; steps/s
    at minibatch 64 (median of 3): FlatAdam 265, single-tensor 184, Adam 158, Adam foreach 119,
    Adam fused 128: kept. Issue 49 item 4, 2026-12-07 (``bench/kept_speedups.py``, 3 fresh
    processes each, alternating, a load of 18-46): the first ``torch.optim.Adam(...)`` after
    ``import torch`` and flowkit's policy module 5.1 s median (3.7-6.0), ``FlatAdam(...)``
    0.00016 s; steps/s at minibatch 64 (``bench/learner.py --optimizers``, median of 3, load
    about 35): FlatAdam 156, single-tensor 178, Adam 136, Adam foreach 120, Adam fused 159 (the
    steps equal within the noise; the construction decides): kept.

    The fused kernel (2026-12-06, ``python bench/learner.py --optimizers [--net nature
    --minibatch 32]``, the same machine quiet, one torch thread, median of 5, two runs each):
    FlatAdam's gradient steps/s with the fused kernel against the single-tensor one it used
    before: PPO's 64x64 MLP 699 vs 671 (minibatch 64) and 517 vs 467 (256); DQN's Nature CNN
    on Pong frames (1.69M parameters, minibatch 32) 18.7 vs 15.7 and 16.5 vs 14.5 (1.14-1.19x:
    the single-tensor kernel makes six passes over the buffer, 15% of a step by profile).
    """

    def __init__(self, flat: torch.Tensor, lr: float, eps: float = 1e-8, sizes: Optional[List[int]] = None):
        self.flat = flat
        self.fused: Optional[bool] = True if flat.device.type == "cpu" else None  # (see above)
        sizes = [flat.numel()] if sizes is None else [int(n) for n in sizes]
        if sum(sizes) != flat.numel():
            raise ValueError(f"FlatAdam: segment sizes {sizes} do not add up to {flat.numel()}")
        ends = np.cumsum([0, *sizes]).tolist()
        self.segments = [slice(a, b) for a, b in zip(ends[:-1], ends[1:])]
        self.param_groups: List[Dict[str, Any]] = [dict(
            lr=lr, betas=(0.9, 0.999), eps=eps, weight_decay=0, amsgrad=False, maximize=False, foreach=None,
            capturable=False, differentiable=False, fused=self.fused, decoupled_weight_decay=False, params=[i])
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
                 beta1=g["betas"][0], beta2=g["betas"][1], lr=g["lr"], weight_decay=0, eps=g["eps"], maximize=False,
                 fused=self.fused)

    def state_dict(self) -> Dict[str, Any]:
        return {"state": dict(self.state), "param_groups": [dict(g) for g in self.param_groups]}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        for g, sg in zip(self.param_groups, state["param_groups"]):
            g.update({k: v for k, v in sg.items() if k not in ("params", "fused")})  # (the kernel: this machine's)
        self.state = {int(i): {k: v.detach().clone() if k == "step" else v.detach().to(self.flat).clone()
                               for k, v in st.items()} for i, st in state["state"].items()}


class FlatRMSprop(FlatAdam):
    """``torch.optim.RMSprop`` (no momentum, not centred) over one flat buffer, built like
    :class:`FlatAdam` (same functional kernel, same ``state_dict`` layout; kept for the same
    reason: ``torch.optim.RMSprop`` imports ``torch._dynamo`` when built)::

        v <- alpha * v + (1 - alpha) * g^2;   w <- w - lr * g / (sqrt(v) + eps)
    """

    def __init__(self, flat: torch.Tensor, lr: float, alpha: float = 0.99, eps: float = 1e-8):
        super().__init__(flat, lr, eps)
        self.param_groups = [dict(lr=lr, alpha=alpha, eps=eps, weight_decay=0, momentum=0, centered=False,
                                  capturable=False, foreach=None, maximize=False, differentiable=False, params=[0])]

    @torch.no_grad()
    def step(self) -> None:
        from torch.optim.rmsprop import rmsprop
        g, grad = self.param_groups[0], self.flat.grad
        assert grad is not None
        s = self.state.setdefault(0, {"step": torch.tensor(0.0), "square_avg": torch.zeros_like(self.flat)})
        rmsprop([self.flat], [grad], [s["square_avg"]], [], [], [s["step"]], lr=g["lr"], alpha=g["alpha"],
                eps=g["eps"], weight_decay=0, momentum=0, centered=False)


def to_tensor(x: Any, device: Any = "cpu") -> torch.Tensor:
    """A tensor of ``x`` on ``device``; read-only arrays (as Ray returns them) are copied."""
    a = np.asarray(x)
    if not a.flags.writeable:
        a = a.copy()
    return torch.as_tensor(a, device=device)


def loss_stats(**terms: Any) -> Dict[str, float]:
    """The stats a :meth:`Policy.loss` returns: each term (a 0-d tensor or a number) as a
    float, the tensors detached and read in one device sync (``torch.stack(...).tolist()``)."""
    keys = [k for k, v in terms.items() if isinstance(v, torch.Tensor)]
    out = {k: float(v) for k, v in terms.items() if k not in keys}
    if keys:
        with torch.no_grad():
            out.update(zip(keys, torch.stack([terms[k].detach().float().reshape(()) for k in keys]).tolist()))
    return {k: out[k] for k in terms}


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
