"""The numpy mirror of :class:`ActorCritic` and of categorical/Gaussian sampling, for acting
on CPU rollout workers (a few rows per call, where torch's per-op dispatch dominates), and
the acting side of every policy that needs no torch: :class:`Acting` (Policy's base),
:class:`ActorCriticActing` (ActorCriticPolicy's) and :class:`NumpyActorCriticPolicy`, the
copy a Ray rollout worker builds instead of an actor-critic policy whose acting is this
mirror (the worker process then never imports torch). This module imports no torch."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from flowkit.core import batch as sb
from flowkit.core.activations import has_numpy, numpy_function
from flowkit.core.distributions import ActionDist
from flowkit.core.encoders import ObsEncoder, add_batch_axis, batch_len
from flowkit.core.returns import bootstrap_rows, compute_gae, next_values

if TYPE_CHECKING:
    from flowkit.core.models import ActorCritic



def numpy_layout(model: "ActorCritic", dist: ActionDist, activation: str) -> Optional[Dict[str, Any]]:
    """The structure of an MLP :class:`ActorCritic` in the names of its ``state_dict`` (plain
    data, picklable), or None when :class:`NumpyActorCritic` cannot mirror it (CNNs, a shared
    trunk, other activations or action spaces, a subclassed model)."""
    from flowkit.core.activations import torch_function
    from flowkit.core.models import ActorCritic, TwinMLP
    if (type(model) is not ActorCritic or dist.kind not in ("cat", "gauss", "gauss_unbounded")
            or not has_numpy(activation) or model.sde_log_std is not None):
        return None
    lay: Dict[str, Any] = {"activation": activation, "log_std": model.log_std is not None,
                           "clip": None if model.obs_rms is None else float(model.obs_rms.clip), "twin": None}
    if model.twin is not None:
        if type(model.twin) is not TwinMLP or model.twin.act is not torch_function(activation):
            return None
        lay["twin"] = list(model.twin.hidden)
        return lay
    if model.shared:
        return None
    for head in ("pi", "vf"):
        lay[head] = linear_names(model, getattr(model, head))
        if not lay[head]:
            return None
    return lay


def linear_names(model: Any, part: Any) -> Optional[List[str]]:
    """The ``state_dict`` prefixes in ``model`` of the ``nn.Linear`` layers of ``part``, a
    (nested) ``nn.Sequential`` of Linear and Tanh/ReLU layers (in order), or None for any
    other module (the layers' activation is the config's ``model.activation``)."""
    from torch import nn
    names = {id(m): n for n, m in model.named_modules()}
    out: List[str] = []
    for m in part.modules():
        if type(m) is nn.Linear:
            out.append(names[id(m)])
        elif type(m) not in (nn.Sequential, nn.Tanh, nn.ReLU):
            return None
    return out


def linear_layers(weights: Mapping[str, np.ndarray], names: List[str]) -> List[Tuple[np.ndarray, np.ndarray]]:
    """``(W.T, b)`` per layer of :func:`linear_names` (views of ``weights``): ``x @ W.T + b``."""
    return [(weights[f"{n}.weight"].T, weights[f"{n}.bias"]) for n in names]


def mlp_forward(x: np.ndarray, layers: Sequence[Tuple[np.ndarray, Optional[np.ndarray]]],
                act: Any) -> np.ndarray:
    """The one numpy MLP executor (actor-critic mirrors, ES and ARS): ``x`` float32[B, in]
    through ``layers`` (``(W.T float32[in, out], b float32[out] or None)`` each, ``x @ W.T +
    b``), ``act`` (a numpy function of :mod:`flowkit.core.activations`) between layers, none
    after the last: float32[B, out]."""
    for i, (w, b) in enumerate(layers):
        x = x @ w if b is None else x @ w + b
        if i < len(layers) - 1:
            x = act(x)
    return x


class NumpyActorCritic:
    """Acting-time mirror of an :class:`ActorCritic` in numpy, for rollout workers on CPU.

    A worker evaluates the network on a few rows per env step (one per sub-env), where each
    torch call costs several microseconds of dispatch; numpy's calls cost about one. This
    computes the same functions (float32 throughout) on ``weights`` (``{state_dict name:
    array}``), or on views of ``model``'s parameters (no copies: weights set with
    ``load_state_dict`` and in-place optimizer steps are seen at once; a parameter whose
    storage moved rebuilds the views).

    Kept by issue 49's measurement (2 Ray workers x 8 CartPole envs, sampling only, mirror on
    and off (``model.numpy_inference=false``) alternating, median of 3, one Ray session, a 2-core
    machine under a load of 15-22): env steps/s 18,361 vs 9,202 for PPO's MLP (2.0x), 9,861 vs
    3,723 for DQN's (2.6x, :class:`~flowkit_dqn.acting.NumpyDQNPolicy`), 6,793 vs 338 for PPO's
    LSTM (:class:`NumpyRecurrentActorCritic`).

    Supported: MLP models (``TwinMLP``, or separate policy/value ``nn.Sequential`` of
    ``nn.Linear`` and Tanh/ReLU), optional running observation normalisation, Discrete
    (with action masks) and Box (Gaussian) actions. :meth:`build` returns None for anything
    else (gSDE, reward normalisation, CNNs, a shared trunk, other activations or action spaces,
    a subclassed model) and the policy keeps its torch path.
    """
    twin: Optional[Tuple[Any, ...]]  # TwinMLP: w0, b0, ws, bs, wa, ba, wb, bb, hidden
    pi: List[Tuple[np.ndarray, np.ndarray]]
    vf: List[Tuple[np.ndarray, np.ndarray]]

    def __init__(self, layout: Dict[str, Any], weights: Optional[Mapping[str, np.ndarray]] = None,
                 model: Optional["ActorCritic"] = None):
        self.layout, self.model, self.act = layout, model, numpy_function(layout["activation"])
        self._watch: List[Any] = []
        self._ptrs: Tuple[int, ...] = ()
        self._bind(weights)

    @classmethod
    def build(cls, model: "ActorCritic", dist: ActionDist, activation: str) -> Optional["NumpyActorCritic"]:
        lay = numpy_layout(model, dist, activation)
        if lay is None or any(p.device.type != "cpu" for p in model.parameters()):
            return None
        return cls(lay, model=model)

    def _bind(self, w: Optional[Mapping[str, np.ndarray]] = None) -> None:
        if w is None:  # views of the model's tensors
            m = self.model
            assert m is not None
            w = {k: t.numpy() for k, t in m.state_dict().items()}
            self._watch = [*m.parameters(), *m.buffers()]
            self._ptrs = tuple(t.data_ptr() for t in self._watch)
        lay = self.layout
        self.rms = None if lay["clip"] is None else (w["obs_rms.mean"], w["obs_rms.var"], lay["clip"])
        self.log_std = w["log_std"] if lay["log_std"] else None
        hidden = lay["twin"]
        if hidden is not None:
            n = max(len(hidden) - 1, 0)
            self.twin = (w["twin.w0"].T if hidden else None, w["twin.b0"] if hidden else None,
                         [w[f"twin.ws.{i}"] for i in range(n)], [w[f"twin.bs.{i}"] for i in range(n)],
                         w["twin.wa"].T, w["twin.ba"], w["twin.wb"].T, w["twin.bb"], hidden)
        else:
            self.twin = None
            self.pi, self.vf = linear_layers(w, lay["pi"]), linear_layers(w, lay["vf"])

    def forward(self, obs: np.ndarray, value: bool = True) -> Tuple[np.ndarray, Optional[np.ndarray]]:
        """obs float32[B, d] -> (dist_inputs float32[B, k], value float32[B] or None)."""
        if self._watch and tuple([t.data_ptr() for t in self._watch]) != self._ptrs:
            self._bind()
        x = obs if obs.dtype == np.float32 and obs.ndim == 2 else np.asarray(obs, np.float32).reshape(len(obs), -1)
        if self.rms is not None:
            mean, var, clip = self.rms
            x = np.clip((x - mean) / np.sqrt(var + np.float32(1e-8)), -clip, clip).astype(np.float32, copy=False)
        if self.twin is not None:
            w0, b0, ws, bs, wa, ba, wb, bb, hidden = self.twin
            if hidden:
                h = self.act(x @ w0 + b0).reshape(x.shape[0], 2, hidden[0]).transpose(1, 0, 2)
                for w, b in zip(ws, bs):
                    h = self.act(np.matmul(h, w) + b)
                ha, hb = h[0], h[1]
            else:
                ha = hb = x
            inputs = ha @ wa + ba
            val = (hb @ wb + bb)[:, 0] if value else None
        else:
            inputs = mlp_forward(x, self.pi, self.act)
            val = mlp_forward(x, self.vf, self.act)[:, 0] if value else None
        if self.log_std is not None:
            inputs = np.concatenate([inputs, np.broadcast_to(self.log_std, inputs.shape)], -1)
        return inputs, val


# ---- recurrent ----------------------------------------------------------------------------------
def numpy_recurrent_layout(model: Any, dist: ActionDist, activation: str) -> Optional[Dict[str, Any]]:
    """The structure of a :class:`~flowkit.core.RecurrentActorCritic` without a CNN, in the
    names of its ``state_dict``, or None when :class:`NumpyRecurrentActorCritic` cannot mirror
    it (a CNN, other activations or action spaces, a subclassed model)."""
    from flowkit.core.recurrent import RecurrentActorCritic
    if (type(model) is not RecurrentActorCritic or dist.kind not in ("cat", "gauss", "gauss_unbounded")
            or not has_numpy(activation)):
        return None
    trunks = []
    for name in ("pi_trunk", "vf_trunk"):
        trunk = getattr(model, name)
        if trunk is None:
            continue
        enc, mlp = linear_names(model, trunk.encoder), linear_names(model, trunk.mlp)
        if enc != [] or mlp is None or trunk.rnn.num_layers != 1 or trunk.rnn.bias is False:  # enc: a CNN
            return None
        trunks.append({"mlp": mlp, "rnn": f"{name}.rnn", "size": int(trunk.state_size)})
    return {"activation": activation, "lstm": bool(model.pi_trunk.is_lstm), "hidden": int(model.pi_trunk.hidden_size),
            "trunks": trunks, "log_std": model.log_std is not None,
            "clip": None if model.obs_rms is None else float(model.obs_rms.clip)}


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (np.tanh(0.5 * x) + 1.0)  # no overflow warnings


class NumpyRecurrentActorCritic:
    """Acting-time mirror of a :class:`~flowkit.core.RecurrentActorCritic` (no CNN; one LSTM or
    GRU layer each, then its MLP) in numpy: one step for ``B`` rows, as :class:`NumpyActorCritic` does
    for feed-forward MLPs (views of the model's parameters, rebound when their storage moves).
    The cells are PyTorch's (gates i, f, g, o for the LSTM; r, z, n for the GRU)."""

    def __init__(self, layout: Dict[str, Any], model: Any):
        self.layout, self.model, self.act = layout, model, numpy_function(layout["activation"])
        self._bind()

    def _bind(self) -> None:
        m, lay = self.model, self.layout
        w = {k: t.numpy() for k, t in m.state_dict().items()}
        self._watch = [*m.parameters(), *m.buffers()]
        self._ptrs = tuple(t.data_ptr() for t in self._watch)
        self.rms = None if lay["clip"] is None else (w["obs_rms.mean"], w["obs_rms.var"], lay["clip"])
        self.log_std = w["log_std"] if lay["log_std"] else None
        self.trunks = [(linear_layers(w, t["mlp"]), w[f"{t['rnn']}.weight_ih_l0"].T, w[f"{t['rnn']}.weight_hh_l0"].T,
                        w[f"{t['rnn']}.bias_ih_l0"], w[f"{t['rnn']}.bias_hh_l0"], t["size"]) for t in lay["trunks"]]
        self.heads = [(w["pi_head.weight"].T, w["pi_head.bias"]), (w["vf_head.weight"].T, w["vf_head.bias"])]

    def _cell(self, x: np.ndarray, s: np.ndarray, wi, wh, bi, bh) -> Tuple[np.ndarray, np.ndarray]:
        h = self.layout["hidden"]
        if self.layout["lstm"]:
            hp, cp = s[:, :h], s[:, h:]
            g = x @ wi + bi + hp @ wh + bh
            c = _sigmoid(g[:, h:2 * h]) * cp + _sigmoid(g[:, :h]) * np.tanh(g[:, 2 * h:3 * h])
            hn = _sigmoid(g[:, 3 * h:]) * np.tanh(c)
            return hn, np.concatenate([hn, c], 1)
        gi, gh = x @ wi + bi, s @ wh + bh
        r, z = _sigmoid(gi[:, :h] + gh[:, :h]), _sigmoid(gi[:, h:2 * h] + gh[:, h:2 * h])
        n = np.tanh(gi[:, 2 * h:] + r * gh[:, 2 * h:])
        hn = (1.0 - z) * n + z * s
        return hn, hn

    def forward(self, obs: np.ndarray, state: np.ndarray) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        """obs float32[B, d], state float32[B, S] -> (dist_inputs float32[B, k], value float32[B],
        state_out float32[B, S])."""
        if tuple(t.data_ptr() for t in self._watch) != self._ptrs:
            self._bind()
        x = np.asarray(obs, np.float32).reshape(len(obs), -1)
        if self.rms is not None:
            mean, var, clip = self.rms
            x = np.clip((x - mean) / np.sqrt(var + np.float32(1e-8)), -clip, clip).astype(np.float32, copy=False)
        feats, states, at = [], [], 0
        for mlp, wi, wh, bi, bh, size in self.trunks:
            f, s = self._cell(x, state[:, at:at + size], wi, wh, bi, bh)
            for w, b in mlp:
                f = self.act(f @ w + b)
            feats.append(f)
            states.append(s)
            at += size
        (wp, bp), (wv, bv) = self.heads
        inputs = feats[0] @ wp + bp
        value = (feats[-1] @ wv + bv)[:, 0]
        if self.log_std is not None:
            inputs = np.concatenate([inputs, np.broadcast_to(self.log_std, inputs.shape)], -1)
        out = states[0] if len(states) == 1 else np.concatenate(states, 1)
        return inputs.astype(np.float32, copy=False), value.astype(np.float32, copy=False), out.astype(np.float32, copy=False)


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
        if state is None:
            actions, _ = self.compute_actions_encoded(enc, mask, explore)
        else:
            st = np.asarray(state, np.float32).reshape(n, -1)
            act: Any = self.compute_actions_encoded  # a recurrent policy's takes state=
            actions, extras = act(enc, mask, explore, state=st)
            state_out = extras[sb.STATE_OUT]
        env_actions = self.dist.to_env(actions)
        if state is None:
            return env_actions if batched else env_actions[0]
        return (env_actions, state_out) if batched else (env_actions[0], state_out[0])

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

    def _act_numpy(self, npm: NumpyActorCritic, obs, mask, explore):
        inputs, value = npm.forward(obs, value=self.store_values)
        a, logp = sample_logp_numpy(self.dist, inputs, mask, explore, self.np_random)
        return a, self._extras(logp, value, inputs)

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


class NumpyActorCriticPolicy(ActorCriticActing):
    """The acting copy of an :class:`~flowkit.core.ActorCriticPolicy` that Ray rollout
    workers build instead of the torch one (see ``ActorCriticPolicy.worker_policy_class``):
    the same acting as that policy's numpy mirror (same RNG stream: ``np.random.default_rng
    (seed)``), GAE's V(``next_obs``) in numpy too, weights ``{state_dict name: float32
    array}``. The worker process imports no torch.

    Args: as :class:`~flowkit.core.Policy`, plus ``layout`` (:func:`numpy_layout`),
    ``store_values``, ``worker_gae`` and the first ``weights``.
    """
    inference_only = True
    optimizer = None

    def __init__(self, observation_space, action_space, config, model_config=None, device="cpu", seed=0,
                 inference_only=True, *, layout: Dict[str, Any], store_values: bool, worker_gae: bool,
                 weights: Mapping[str, np.ndarray]):
        self.observation_space, self.action_space = observation_space, action_space
        self.config, self.model_config, self.device = config, model_config, "cpu"
        self.encoder, self.dist = ObsEncoder(observation_space), ActionDist(action_space)
        self.np_random = np.random.default_rng(seed)
        self.layout, self.store_values, self.worker_gae = layout, store_values, worker_gae
        self.num_updates = 0
        self.set_weights(weights)

    def set_weights(self, weights: Mapping[str, np.ndarray]) -> None:
        self._weights = {k: np.asarray(v) for k, v in weights.items()}
        self.net = NumpyActorCritic(self.layout, self._weights)

    def get_weights(self) -> Dict[str, np.ndarray]:
        return {k: v.copy() for k, v in self._weights.items()}

    def compute_actions_encoded(self, obs, mask=None, explore=True):
        if mask is not None:
            self.check_mask(mask)
        return self._act_numpy(self.net, obs, mask, explore)

    def compute_values(self, obs: np.ndarray) -> np.ndarray:
        value = self.net.forward(np.ascontiguousarray(obs, np.float32))[1]
        assert value is not None
        return value
