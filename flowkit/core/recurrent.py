"""Recurrent networks (``model.recurrent``: an LSTM or a GRU on the encoded observation, after
the CNN for images, then the MLP ``model.hidden_sizes``) and the sequence forward every recurrent
policy trains with.

The recurrent-model contract (the built-in networks here, and a ``model.class`` network that
has an ``initial_state`` method; see ``docs/custom_models.md``):

- ``initial_state(n) -> float32[n, S]``: the state of ``n`` rows at an episode start (``S``: the
  state size; an LSTM's ``(h, c)`` are concatenated into one row, ``h`` first);
- ``forward(obs float32[N, L, *shape], state float32[N, S], resets bool[N, L] or None) ->
  (*outputs, state_out float32[N, S])``: ``N`` sequences of ``L`` steps from ``state``; where
  ``resets[n, t]`` is set, row ``n``'s state is ``initial_state`` again before step ``t``
  (an episode start inside a sequence); each output has the leading axes ``[N, L]`` and is
  what the feed-forward network returns per row (``(dist_inputs, value)`` for the
  actor-critics, ``q`` for a Q-network); ``state_out`` is the state after step ``L - 1``.

Rollout workers call it with ``L = 1`` once per env step (one row per sub-env); the learner
calls it through :func:`forward_sequences` on whole sequences (:func:`flowkit.core.batch.sequence_lengths`),
padded to the longest in the minibatch, the padding discarded, so a loss sees the same flat
rows as for a feed-forward network.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence, Tuple

import torch
from torch import nn

from flowkit.core.distributions import ActionDist
from flowkit.core.encoders import ObsEncoder
from flowkit.core.models import RunningMeanStd, _linear, build_mlp, build_trunk

RECURRENT = ("lstm", "gru")


class RecurrentTrunk(nn.Module):
    """The encoded observation (through the CNN for images) into an LSTM or a GRU of
    ``model.recurrent_size`` units, then the MLP ``model.hidden_sizes`` on its output: the
    reusable recurrent core (actor-critics use one or two, a recurrent Q-network one). The
    recurrent layer sees the observation itself, the MLP after it turns memory into features
    (sb3-contrib's MlpLstmPolicy, R2D2's conv -> LSTM -> MLP heads).

    ``forward(x float32[N, L, *shape], state float32[N, S], resets bool[N, L] or None) ->
    (features float32[N, L, out_dim], state_out float32[N, S])``; ``S = 2H`` for an LSTM (``h``
    then ``c``), ``H`` for a GRU; ``out_dim`` the last hidden size (``H`` without hidden layers).
    Recurrent weights orthogonal (gain 1), biases zero (CleanRL's LSTM agents); ``model.init=default``
    gives PyTorch's own init (:func:`~flowkit.core.init_weights`)."""

    def __init__(self, encoder: ObsEncoder, model_cfg: Any):
        super().__init__()
        self.encoder, d = build_trunk(encoder, [], model_cfg.activation)  # the CNN for images, else nothing
        self.hidden_size = h = int(model_cfg.recurrent_size)
        self.is_lstm = str(model_cfg.recurrent or "lstm") == "lstm"
        self.rnn: nn.Module = (nn.LSTM if self.is_lstm else nn.GRU)(d, h, batch_first=True)
        for name, p in self.rnn.named_parameters():
            if name.startswith("weight"):
                nn.init.orthogonal_(p, 1.0)
            else:
                nn.init.zeros_(p)
        hidden = list(model_cfg.hidden_sizes)
        self.mlp = build_mlp(h, hidden, model_cfg.activation)
        self.out_dim = hidden[-1] if hidden else h
        self.state_size = 2 * h if self.is_lstm else h

    def initial_state(self, n: int) -> torch.Tensor:
        return torch.zeros(n, self.state_size)

    def _run(self, f: torch.Tensor, state: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        h = self.hidden_size
        if self.is_lstm:
            out, (hn, cn) = self.rnn(f, (state[:, :h].unsqueeze(0).contiguous(), state[:, h:].unsqueeze(0).contiguous()))
            return out, torch.cat([hn[0], cn[0]], -1)
        out, hn = self.rnn(f, state.unsqueeze(0).contiguous())
        return out, hn[0]

    def forward(self, x: torch.Tensor, state: torch.Tensor,
                resets: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
        n, L = x.shape[0], x.shape[1]
        f = self.encoder(x.reshape(n * L, *x.shape[2:])).reshape(n, L, -1)
        if resets is None:
            out, state = self._run(f, state)
        else:
            keep = (~resets).to(f.dtype)  # the initial state is zeros: a reset multiplies the state by 0
            cuts = [0, *(t for t in range(1, L) if bool(resets[:, t].any())), L]  # one call per reset-free span
            outs = []
            for a, b in zip(cuts[:-1], cuts[1:]):
                o, state = self._run(f[:, a:b], state * keep[:, a:a + 1])
                outs.append(o)
            out = outs[0] if len(outs) == 1 else torch.cat(outs, 1)
        return self.mlp(out), state


class RecurrentActorCritic(nn.Module):
    """The recurrent actor-critic of ``model.recurrent``: a :class:`RecurrentTrunk` each for
    the policy and the value function (sb3-contrib's ``enable_critic_lstm``;
    ``model.shared_value_network``: one for both), then a linear head each (gains 0.01 and 1, as :class:`~flowkit.core.ActorCritic`); optional running
    observation normalisation (``obs_rms``) and return statistics (``ret_rms``); a
    state-independent log-std for Gaussian actions.

    ``forward(obs float32[N, L, *shape], state float32[N, S], resets bool[N, L] or None) ->
    (dist_inputs float32[N, L, k], value float32[N, L], state_out float32[N, S])`` (the state:
    the policy trunk's, then the value trunk's)."""

    def __init__(self, encoder: ObsEncoder, dist: ActionDist, model_cfg: Any, normalize_obs: bool = False,
                 log_std_init: float = 0.0, normalize_rewards: bool = False):
        super().__init__()
        self.obs_rms = RunningMeanStd(encoder.shape) if normalize_obs else None
        self.ret_rms = RunningMeanStd(()) if normalize_rewards else None
        self.shared = bool(model_cfg.shared_value_network)
        self.pi_trunk = RecurrentTrunk(encoder, model_cfg)
        self.vf_trunk = None if self.shared else RecurrentTrunk(encoder, model_cfg)
        h = self.pi_trunk.out_dim
        self.pi_head = _linear(h, dist.num_outputs, 0.01)
        self.vf_head = _linear(h, 1, 1.0)
        self.log_std = nn.Parameter(torch.full((dist.num_outputs,), float(log_std_init))) if dist.is_gauss else None
        self._split = self.pi_trunk.state_size
        self.state_size = self._split + (0 if self.vf_trunk is None else self.vf_trunk.state_size)

    def initial_state(self, n: int) -> torch.Tensor:
        return torch.zeros(n, self.state_size)

    def forward(self, obs: torch.Tensor, state: torch.Tensor,
                resets: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x = self.obs_rms(obs) if self.obs_rms is not None else obs
        z, s_pi = self.pi_trunk(x, state[:, :self._split], resets)
        logits = self.pi_head(z)
        if self.vf_trunk is None:
            value, s_out = self.vf_head(z), s_pi
        else:
            zv, s_vf = self.vf_trunk(x, state[:, self._split:], resets)
            value, s_out = self.vf_head(zv), torch.cat([s_pi, s_vf], -1)
        if self.log_std is not None:
            logits = torch.cat([logits, self.log_std.expand_as(logits)], -1)
        return logits, value.squeeze(-1), s_out


def is_recurrent(model: Any) -> bool:
    """Whether ``model`` follows the recurrent-model contract (it has ``initial_state``)."""
    return callable(getattr(model, "initial_state", None))


def sequence_starts(seq_lens: torch.Tensor) -> torch.Tensor:
    """int64[k]: the first row of each sequence of ``seq_lens`` (int64[k]) in flat row order."""
    return torch.cumsum(seq_lens, 0) - seq_lens


def pad_mask(seq_lens: torch.Tensor) -> torch.Tensor:
    """bool[k, L_max]: True at the real rows of each padded sequence."""
    L = int(seq_lens.max()) if len(seq_lens) else 0
    return torch.arange(L, device=seq_lens.device)[None, :] < seq_lens[:, None]


def pad(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``x[B, ...]`` (flat rows of whole sequences, in order) as ``[k, L_max, ...]``, zeros in
    the padding (``mask``: :func:`pad_mask`)."""
    out = x.new_zeros((*mask.shape, *x.shape[1:]))
    out[mask] = x
    return out


def forward_sequences(module: nn.Module, obs: torch.Tensor, seq_lens: torch.Tensor, state_in: torch.Tensor,
                      resets: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, ...]:
    """A recurrent ``module`` over flat rows of whole sequences: ``obs[B, *shape]`` (each
    sequence's rows contiguous and in time order), ``seq_lens int64[k]`` (summing to B),
    ``state_in float32[B, S]`` (only each sequence's first row is read), ``resets bool[B]``
    (optional: a state reset before that row; ignored at a sequence's first row). The
    sequences are padded to the longest, run in one call, and the padding dropped (a step
    only sees the steps before it, so padding changes no real row): returns the module's
    outputs except the state, as flat rows ``[B, ...]`` in the input's order. A caller that
    needs the final states (burn-in) calls the module on :func:`pad`-ded sequences itself."""
    mask = pad_mask(seq_lens)
    s0 = state_in[sequence_starts(seq_lens)]
    r = None
    if resets is not None:
        r = pad(resets, mask)
        r[:, 0] = False  # a sequence starts from its recorded state
    k, L = mask.shape
    if bool((seq_lens == L).all()):  # every sequence full: a reshape, no padding
        outs = module(obs.reshape(k, L, *obs.shape[1:]), s0, r)
        return tuple(o.reshape(k * L, *o.shape[2:]) for o in outs[:-1])
    outs = module(pad(obs, mask), s0, r)
    return tuple(o[mask] for o in outs[:-1])


def step(module: nn.Module, obs: torch.Tensor, state: torch.Tensor) -> Tuple[Any, ...]:
    """One step of a recurrent ``module`` for ``B`` rows: ``obs[B, *shape]``, ``state[B, S]``
    -> its outputs as ``[B, ...]`` followed by ``state_out[B, S]`` (acting)."""
    outs = module(obs.unsqueeze(1), state, None)
    return (*(o[:, 0] for o in outs[:-1]), outs[-1])


class RecurrentStep(nn.Module):
    """One step of a recurrent network as a module: ``(obs float32[B, *shape], state
    float32[B, S]) -> (first output float32[B, k], state_out float32[B, S])`` -- the
    distribution inputs of an actor-critic, the Q-values of a recurrent Q-network: what
    :meth:`~flowkit.core.Policy.action_model` returns for export."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, obs: torch.Tensor, state: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        outs = step(self.model, obs, state)
        return outs[0], outs[-1]


__all__: Sequence[str] = ("RECURRENT", "RecurrentTrunk", "RecurrentActorCritic", "RecurrentStep", "forward_sequences",
                          "is_recurrent", "pad", "pad_mask", "sequence_starts", "step")
