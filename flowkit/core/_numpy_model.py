"""The numpy mirror of a network (:class:`NumpyNet`, run from its layer description) and of
categorical/Gaussian sampling, for acting
on CPU rollout workers (a few rows per call, where torch's per-op dispatch dominates), and
the acting side of every policy that needs no torch: :class:`Acting` (Policy's base),
:class:`ActorCriticActing` (ActorCriticPolicy's) and :class:`NumpyActorCriticPolicy`, the
copy a Ray rollout worker builds instead of an actor-critic policy whose acting is this
mirror (the worker process then never imports torch). This module imports no torch."""
from __future__ import annotations

import functools
import math
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from flowkit.core import batch as sb
from flowkit.core.activations import has_numpy, numpy_function
from flowkit.core.distributions import ActionDist
from flowkit.core.encoders import ObsEncoder, add_batch_axis, batch_len
from flowkit.core.returns import bootstrap_rows, compute_gae, next_values


# ---- the mirror: one layer description, one executor -------------------------------------------
# A layer description is a list of steps ``(dst, src, op, *args)`` over named values ("obs" the
# observation, "x" it after normalisation): ``norm`` (a RunningMeanStd's key, clip), ``dense``
# (weight key, bias key, selection: None / an index / [start, stop] rows, transposed: the key
# holds nn.Linear's [out, in]), ``act`` (an activation name), ``lstm`` / ``gru`` (the layer's
# key, its first column in the recurrent state, hidden units), ``log_std`` (a key, appended).
def layer_steps(model: Any, part: Any, dst: str, src: str) -> Optional[List[Tuple[Any, ...]]]:
    """The steps of ``part`` (a nested ``nn.Sequential`` of ``nn.Linear`` and activation modules
    with a numpy function), read into ``dst`` from ``src``, in the ``state_dict`` names of
    ``model``; None for any other module."""
    from torch import nn

    from flowkit.core.activations import ACTIVATIONS
    names = {id(m): n for n, m in model.named_modules()}
    acts = {a.module: k for k, a in ACTIVATIONS.items() if a.numpy is not None}
    out: List[Tuple[Any, ...]] = []
    for m in part.modules():
        if type(m) is nn.Linear:
            out.append((dst, src if not out else dst, "dense", f"{names[id(m)]}.weight", f"{names[id(m)]}.bias", None, True))
        elif type(m).__name__ in acts and out:
            out.append((dst, dst, "act", acts[type(m).__name__]))
        elif type(m) is not nn.Sequential:
            return None
    return out


def input_steps(model: Any) -> List[Tuple[Any, ...]]:
    """The observation normalisation of ``model`` (its ``obs_rms``), or nothing."""
    rms = getattr(model, "obs_rms", None)
    return [] if rms is None else [("x", "obs", "norm", "obs_rms", float(rms.clip))]


def _twin_steps(twin: Any) -> Optional[List[Tuple[Any, ...]]]:
    act, hidden, steps = twin.act.__name__, twin.hidden, []
    if not has_numpy(act):
        return None
    for half, (dst, w, b) in enumerate((("pi", "wa", "ba"), ("vf", "wb", "bb"))):
        if hidden:
            steps += [(dst, "x", "dense", "twin.w0", "twin.b0", [half * hidden[0], (half + 1) * hidden[0]], True),
                      (dst, dst, "act", act)]
        for i in range(len(hidden) - 1):  # (2, d_in, d_out): already transposed
            steps += [(dst, dst, "dense", f"twin.ws.{i}", f"twin.bs.{i}", half, False), (dst, dst, "act", act)]
        steps.append((dst, dst if hidden else "x", "dense", f"twin.{w}", f"twin.{b}", None, True))
    return steps


def _recurrent_steps(model: Any) -> Optional[List[Tuple[Any, ...]]]:
    steps: List[Tuple[Any, ...]] = []
    at = 0
    for name in ("pi_trunk", "vf_trunk"):
        if (trunk := getattr(model, name)) is None:
            continue
        mlp = layer_steps(model, trunk.mlp, name, name)
        if layer_steps(model, trunk.encoder, "", "") != [] or mlp is None or trunk.rnn.num_layers != 1 or not trunk.rnn.bias:
            return None  # a CNN encoder, a stacked or bias-free recurrent layer
        steps += [(name, "x", "lstm" if trunk.is_lstm else "gru", f"{name}.rnn", at, trunk.hidden_size), *mlp]
        at += trunk.state_size
    vf = "pi_trunk" if model.vf_trunk is None else "vf_trunk"
    return steps + [("pi", "pi_trunk", "dense", "pi_head.weight", "pi_head.bias", None, True),
                    ("vf", vf, "dense", "vf_head.weight", "vf_head.bias", None, True)]


def numpy_layout(model: Any, dist: ActionDist) -> Optional[List[Tuple[Any, ...]]]:
    """The layer description (plain data, picklable) of an :class:`ActorCritic` (separate MLPs
    or a :class:`TwinMLP`) or a :class:`~flowkit.core.RecurrentActorCritic` without a CNN, with
    outputs ``pi`` (dist_inputs) and ``vf`` (float32[B, 1]); None when :class:`NumpyNet` cannot
    mirror it (CNNs, a shared trunk, gSDE, other activations or action spaces, a subclassed model)."""
    from flowkit.core.models import ActorCritic, TwinMLP
    from flowkit.core.recurrent import RecurrentActorCritic
    if dist.kind not in ("cat", "gauss", "gauss_unbounded") or type(model) not in (ActorCritic, RecurrentActorCritic):
        return None
    if type(model) is RecurrentActorCritic:
        body = _recurrent_steps(model)
    elif model.sde_log_std is not None or model.shared:
        return None
    elif model.twin is not None:
        body = _twin_steps(model.twin) if type(model.twin) is TwinMLP else None
    else:
        pi, vf = layer_steps(model, model.pi, "pi", "x"), layer_steps(model, model.vf, "vf", "x")
        body = None if not pi or not vf else pi + vf
    if body is None:
        return None
    return input_steps(model) + body + ([("pi", "pi", "log_std", "log_std")] if model.log_std is not None else [])


def mlp_forward(x: np.ndarray, layers: Sequence[Tuple[np.ndarray, Optional[np.ndarray]]],
                act: Any) -> np.ndarray:
    """ES's and ARS's numpy MLP (a batch of perturbed weights, no layer description): ``x``
    float32[B, in] through ``layers`` (``(W.T float32[in, out], b float32[out] or None)`` each),
    ``act`` (a numpy function of :mod:`flowkit.core.activations`) between layers, none after the
    last: float32[B, out]."""
    for i, (w, b) in enumerate(layers):
        x = x @ w if b is None else x @ w + b
        if i < len(layers) - 1:
            x = act(x)
    return x


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (np.tanh(0.5 * x) + 1.0)  # no overflow warnings


def _compile(w: Mapping[str, np.ndarray], op: str, args: Sequence[Any]) -> Any:
    """The function of one step on the arrays ``w``: ``x -> y``, a cell ``(x, state) -> (h, s)``."""
    if op == "dense":
        wk, bk, sel, transposed = args
        m, b = w[wk], w[bk]
        if sel is not None:
            m, b = (m[sel], b[sel]) if isinstance(sel, int) else (m[sel[0]:sel[1]], b[sel[0]:sel[1]])
        mt = m.T if transposed else m
        return lambda x: x @ mt + b
    if op == "act":
        return numpy_function(args[0])
    if op == "norm":
        mean, var, clip = w[f"{args[0]}.mean"], w[f"{args[0]}.var"], args[1]  # (views: updates in place are seen)
        return lambda x: np.clip((x - mean) / np.sqrt(var + np.float32(1e-8)), -clip, clip).astype(np.float32, copy=False)
    if op == "log_std":
        log_std = w[args[0]]
        return lambda x: np.concatenate([x, np.broadcast_to(log_std, x.shape)], -1)
    k = args[0]  # lstm / gru
    return functools.partial(_cell, op == "lstm", w[f"{k}.weight_ih_l0"].T, w[f"{k}.weight_hh_l0"].T,
                             w[f"{k}.bias_ih_l0"], w[f"{k}.bias_hh_l0"], *args[1:])


def _cell(lstm: bool, wi, wh, bi, bh, at: int, h: int, x: np.ndarray, state: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """PyTorch's LSTM (gates i, f, g, o; state h then c) or GRU (r, z, n) cell, one step."""
    if lstm:
        hp, cp = state[:, at:at + h], state[:, at + h:at + 2 * h]
        g = x @ wi + bi + hp @ wh + bh
        c = _sigmoid(g[:, h:2 * h]) * cp + _sigmoid(g[:, :h]) * np.tanh(g[:, 2 * h:3 * h])
        hn = _sigmoid(g[:, 3 * h:]) * np.tanh(c)
        return hn, np.concatenate([hn, c], 1)
    s = state[:, at:at + h]
    gi, gh = x @ wi + bi, s @ wh + bh
    r, z = _sigmoid(gi[:, :h] + gh[:, :h]), _sigmoid(gi[:, h:2 * h] + gh[:, h:2 * h])
    n = np.tanh(gi[:, 2 * h:] + r * gh[:, 2 * h:])
    hn = (1.0 - z) * n + z * s
    return hn, hn


class NumpyNet:
    """Acting-time mirror of a network in numpy, run from its layer description (see
    :func:`numpy_layout`, :func:`layer_steps`), for rollout workers on CPU.

    A worker evaluates the network on a few rows per env step (one per sub-env), where each
    torch call costs several microseconds of dispatch; numpy's calls cost about one. This
    computes the same functions (float32 throughout) on ``weights`` (``{state_dict name:
    array}``), or on views of ``model``'s parameters (no copies: weights set with
    ``load_state_dict`` and in-place optimizer steps are seen at once; a parameter whose
    storage moved rebuilds the views).

    Kept by issue 49's measurements (2 Ray workers x 8 CartPole envs, sampling only as
    bench/ppo_cartpole.py part (c), mirror on and off (``model.numpy_inference=false``)
    alternating, one Ray session, a 2-core machine under load), env steps/s on / off:

        network      round 2 (median of 3)     round 3, main (3; DQN: 5)    round 3, this executor (3)
        PPO MLP      18,361 / 9,202 (2.0x)     4,891 / 2,036 (2.4x)         6,100 / 2,032 (3.0x)
        DQN MLP       9,861 / 3,723 (2.6x)    36,942 / 15,233 (2.4x)       11,753 / 6,523 (1.8x)
        PPO LSTM      6,793 / 338 (20x)        2,034 / <811 (>2.5x)         4,505 / 407 (11x)

    (round 3 at a load of 20-46: the ratios, not the rates, compare; an LSTM torch run of 5 s
    that finished no 2,048-step round counts as under the next one's rate). Measured again for
    issue 49 item 4 on 2026-12-07 (``bench/kept_speedups.py``: the same part (c), 8 s, each side
    a fresh process, alternating, median of 3, a load of 18-46): PPO MLP 29,576 / 9,684 env
    steps/s (3.1x): kept.
    """

    def __init__(self, layout: Sequence[Tuple[Any, ...]], weights: Optional[Mapping[str, np.ndarray]] = None,
                 model: Any = None):
        self.layout, self.model = list(layout), model
        self._watch: List[Any] = []
        self._ptrs: Tuple[int, ...] = ()
        self._bind(weights)

    @classmethod
    def build(cls, model: Any, dist: ActionDist) -> Optional["NumpyNet"]:
        """The mirror of an actor-critic ``model`` on CPU (views of its parameters), or None."""
        lay = numpy_layout(model, dist)
        if lay is None or any(p.device.type != "cpu" for p in model.parameters()):
            return None
        return cls(lay, model=model)

    def _bind(self, w: Optional[Mapping[str, np.ndarray]] = None) -> None:
        if w is None:  # views of the model's tensors
            w = {k: t.numpy() for k, t in self.model.state_dict().items()}
            self._watch = [*self.model.parameters(), *self.model.buffers()]
            self._ptrs = tuple(t.data_ptr() for t in self._watch)
        self.steps = [(dst, src, op in ("lstm", "gru"), _compile(w, op, args)) for dst, src, op, *args in self.layout]

    def forward(self, obs: np.ndarray, state: Optional[np.ndarray] = None, skip: Sequence[str] = ()) -> Dict[str, np.ndarray]:
        """obs float32[B, d] (and the recurrent ``state`` float32[B, S]) -> ``{name: float32[B, k]}``
        of every value the description writes (``skip``: values not computed), plus
        ``state_out`` float32[B, S] for a recurrent network."""
        if self._watch and tuple([t.data_ptr() for t in self._watch]) != self._ptrs:
            self._bind()
        x = obs if obs.dtype == np.float32 and obs.ndim == 2 else np.asarray(obs, np.float32).reshape(len(obs), -1)
        out, states = {"obs": x, "x": x}, []
        for dst, src, cell, f in self.steps:
            if dst in skip:
                continue
            if cell:
                assert state is not None, "a recurrent mirror needs state="
                out[dst], s = f(out[src], state)
                states.append(s)
            else:
                out[dst] = f(out[src])
        if states:
            out["state_out"] = states[0] if len(states) == 1 else np.concatenate(states, 1)
        return out


def sample_logp_numpy(dist: "ActionDist", inputs: np.ndarray, mask: Optional[np.ndarray], explore: bool,
                      rng: np.random.Generator) -> Tuple[np.ndarray, np.ndarray]:
    """:meth:`ActionDist.sample_logp` in numpy for Discrete (Gumbel-max over the log-softmax,
    masked logits set to the float32 minimum) and Gaussian actions.

    Returns ``(actions int64[B] or float32[B, dim], logp float32[B])``."""
    if dist.kind == "cat":
        lg = inputs if mask is None else np.where(mask == 0, np.finfo(np.float32).min, inputs)
        z = lg - lg.max(-1, keepdims=True)
        lp = z - np.log(np.exp(z).sum(-1, keepdims=True))
        # (uniforms are < 1: a lower bound is all the clipping they need; plain ufuncs and an
        # index instead of clip / take_along_axis: a few us less per step of a rollout worker)
        gumbel = -np.log(-np.log(np.maximum(rng.random(lp.shape, dtype=np.float32), np.float32(1e-20)))) if explore else 0.0
        a = (lp + gumbel).argmax(-1)
        return a.astype(np.int64), lp[np.arange(len(a)), a].astype(np.float32)
    mean, log_std = inputs[:, :dist.dim], inputs[:, dist.dim:]
    eps = rng.standard_normal(mean.shape, dtype=np.float32) if explore else np.zeros_like(mean)
    a = mean + np.exp(log_std) * eps
    logp = (-0.5 * eps * eps - log_std - np.float32(0.5 * math.log(2 * math.pi))).sum(-1)
    return a.astype(np.float32), logp.astype(np.float32)



def check_mask(mask: Optional[np.ndarray], where: str = "") -> None:
    """Raises ValueError when a row of ``mask`` (int/bool[B, n]) allows no action."""
    if mask is not None and mask.shape[0] and not mask.any(axis=1).all():
        rows = np.flatnonzero(~mask.any(axis=1)).tolist()
        raise ValueError(f"action_mask allows no action in rows {rows}{where}: "
                         "an agent asked to act needs at least one legal action")


class Acting:
    """The torch-free acting side of a policy (the base of :class:`~flowkit.core.Policy`):
    ``encoder``, ``dist`` and :meth:`compute_actions_encoded` make :meth:`compute_actions`."""
    encoder: ObsEncoder
    dist: ActionDist
    check_mask = staticmethod(check_mask)

    def compute_actions_encoded(self, obs: np.ndarray, mask: Optional[np.ndarray] = None,
                                explore: bool = True) -> Tuple[np.ndarray, Dict[str, np.ndarray]]:
        """Actions for encoded observations ``float32[B, *shape]``.

        A recurrent policy (:meth:`initial_state` not None) also takes ``state=float32[B, S]``,
        the rows' recurrent states, and returns two more extras: ``state_in`` (that state, stored
        per row) and ``state_out`` (the state after this step, which the runner keeps for the
        row's next step and removes from the extras). Runners pass ``state`` only to recurrent
        policies.

        Returns:
            ``(actions, extras)``: actions as sampled (numpy, ``[B]`` or ``[B, k]``) and
            per-row extras to store in the batch (e.g. ``action_logp``, ``vf_preds``).
        Raises:
            ValueError: if a row of ``mask`` allows no action.
        """
        raise NotImplementedError

    def initial_state(self, n: int) -> Optional[np.ndarray]:
        """float32[n, S]: the recurrent state of ``n`` rows at an episode start (runners reset
        a row's state to it when its episode starts, in both autoreset modes); None: a
        feed-forward policy (the default)."""
        return None

    def compute_actions(self, obs: Any, explore: bool = False, state: Optional[np.ndarray] = None) -> Any:
        """Env-ready actions for raw observations (one, or a batch with a leading axis).

        A recurrent policy needs ``state`` (float32[B, S], or [S] for one observation; start from
        :meth:`initial_state`) and returns ``(actions, state_out)``: pass ``state_out`` back with
        the next observations of the same episodes.

        Raises:
            ValueError: an observation whose action mask allows nothing; a recurrent policy
                called without ``state`` (or a feed-forward one with it).
        """
        batched = self.encoder.is_batched(obs)
        if not batched:
            obs = add_batch_axis(obs)
        n = batch_len(obs)
        enc, mask = self.encoder(obs, n)
        recurrent = self.initial_state(0) is not None
        if recurrent != (state is not None):
            raise ValueError(f"a recurrent policy needs state= (start from policy.initial_state({n}))" if recurrent
                             else "state= is for recurrent policies; this one is feed-forward")
        act: Any = self.compute_actions_encoded  # a recurrent policy's takes state=
        kw = {} if state is None else {"state": np.asarray(state, np.float32).reshape(n, -1)}
        actions, extras = act(enc, mask, explore, **kw)
        outs = (self.dist.to_env(actions), *([] if state is None else [extras[sb.STATE_OUT]]))
        outs = outs if batched else tuple(o[0] for o in outs)
        return outs[0] if state is None else outs

    def exploration_state(self) -> Dict[str, Any]:
        """What the acting explores with that the weights do not carry and that changes during
        a run (DQN's epsilon), as plain data: the workers get the driver policy's value when
        they start, are rebuilt or the run resumes (:meth:`set_exploration_state`), before
        their first sample. Default: ``{}`` (nothing)."""
        return {}

    def set_exploration_state(self, state: Mapping[str, Any]) -> None:
        """Take what :meth:`exploration_state` returned (on a rollout worker). Default: nothing."""

    def postprocess_trajectory(self, batch: sb.SampleBatch) -> sb.SampleBatch:
        """Per-trajectory processing on the worker (GAE, n-step). Default: unchanged.

        ``batch`` holds one or more contiguous trajectory pieces (see :mod:`batch`)."""
        return batch


class ActorCriticActing(Acting):
    """The acting side of :class:`~flowkit.core.ActorCriticPolicy` (torch-free).

    Class attributes:
        store_values: acting evaluates the value network and stores ``vf_preds`` and
            ``action_dist_inputs`` (PPO); False acts with the policy network only (IMPALA).
        worker_gae: :meth:`postprocess_trajectory` adds GAE advantages (:meth:`add_gae`;
            PPO, A2C); False leaves the batch as it is (IMPALA: V-trace on the learner).
    """
    store_values = True
    worker_gae = False
    config: Any
    np_random: np.random.Generator

    def compute_values(self, obs: np.ndarray) -> np.ndarray:
        """V(obs) for encoded observations float32[B, *shape] -> float32[B]."""
        raise NotImplementedError

    def bootstrap_values(self, batch: sb.SampleBatch, rows: np.ndarray) -> np.ndarray:
        """float32[k]: V(``next_obs``) of the ``rows`` of ``batch`` (those that end a piece without
        terminating); a recurrent policy evaluates it from the state after that row's step."""
        return self.compute_values(np.asarray(batch[sb.NEXT_OBS])[rows])

    def _act_numpy(self, net: NumpyNet, obs, mask, explore, state=None):
        out = net.forward(obs, state, () if self.store_values else ("vf",))
        inputs, value = out["pi"], out["vf"][:, 0] if self.store_values else None
        a, logp = sample_logp_numpy(self.dist, inputs, mask, explore, self.np_random)
        extras = self._extras(logp, value, inputs)
        if state is not None:
            extras.update({sb.STATE_IN: state, sb.STATE_OUT: out["state_out"]})
        return a, extras

    def _extras(self, logp, value, inputs) -> Dict[str, np.ndarray]:
        if not self.store_values:
            return {sb.ACTION_LOGP: logp}
        return {sb.ACTION_LOGP: logp, sb.VF_PREDS: value, sb.ACTION_DIST_INPUTS: inputs}

    def postprocess_trajectory(self, batch: sb.SampleBatch) -> sb.SampleBatch:
        return self.add_gae(batch) if self.worker_gae else batch

    def add_gae(self, batch: sb.SampleBatch, gae_lambda: Optional[float] = None) -> sb.SampleBatch:
        """A copy of ``batch`` (trajectory pieces with ``vf_preds``) with ``advantages`` and
        ``value_targets`` from :func:`compute_gae`; truncations and cuts bootstrap from
        V(``next_obs``) under the current weights, terminations from 0. ``gae_lambda``
        (default ``config.gae_lambda``) = 1 gives n-step returns to the end of each piece."""
        out = sb.SampleBatch(batch)
        if len(out) == 0:
            return out
        v = np.asarray(out[sb.VF_PREDS], np.float32)
        cont, boot = bootstrap_rows(out)
        boot_v = self.bootstrap_values(out, boot) if len(boot) else None
        adv, vt = compute_gae(np.asarray(out[sb.REWARDS], np.float32), v, next_values(v, cont, boot, boot_v),
                              cont, self.config.gamma, self.config.gae_lambda if gae_lambda is None else gae_lambda)
        out[sb.ADVANTAGES], out[sb.VALUE_TARGETS] = adv, vt
        return out


class NumpyPolicy(Acting):
    """The acting copy of a policy that a Ray rollout worker builds instead of the torch one
    (see ``Policy.worker_policy_class``): the network a :class:`NumpyNet` on weights
    ``{state_dict name: float32 array}``, the same RNG stream (``np.random.default_rng(seed)``);
    the worker process imports no torch.

    Args: as :class:`~flowkit.core.Policy`, plus ``layout`` (the network's layer description),
    the first ``weights``, and attributes to set (``attrs``)."""
    inference_only = True
    optimizer = None

    def __init__(self, observation_space, action_space, config, model_config=None, device="cpu", seed=0,
                 inference_only=True, *, layout: List[Tuple[Any, ...]], weights: Mapping[str, np.ndarray], **attrs: Any):
        self.observation_space, self.action_space = observation_space, action_space
        self.config, self.model_config, self.device = config, model_config, "cpu"
        self.encoder, self.dist = ObsEncoder(observation_space), ActionDist(action_space)
        self.np_random = np.random.default_rng(seed)
        self.layout, self.num_updates = layout, 0
        self.__dict__.update(attrs)
        self.set_weights(weights)

    def set_weights(self, weights: Mapping[str, np.ndarray]) -> None:
        self._weights = {k: np.asarray(v) for k, v in weights.items()}
        self.net = NumpyNet(self.layout, self._weights)

    def get_weights(self) -> Dict[str, np.ndarray]:
        return {k: v.copy() for k, v in self._weights.items()}


class NumpyActorCriticPolicy(ActorCriticActing, NumpyPolicy):
    """The :class:`NumpyPolicy` of an :class:`~flowkit.core.ActorCriticPolicy` (see its
    ``worker_policy_class``): its acting, and GAE's V(``next_obs``), in numpy; ``attrs``:
    ``store_values`` and ``worker_gae``."""

    def compute_actions_encoded(self, obs, mask=None, explore=True):
        if mask is not None:
            self.check_mask(mask)
        return self._act_numpy(self.net, obs, mask, explore)

    def compute_values(self, obs: np.ndarray) -> np.ndarray:
        return self.net.forward(np.ascontiguousarray(obs, np.float32), skip=("pi",))["vf"][:, 0]
