"""R2D2, Recurrent Replay Distributed DQN (Kapturowski et al. 2019, "Recurrent Experience Replay
in Distributed Reinforcement Learning", ICLR), as the DQN plugin's second algorithm (``algo=r2d2``,
keys ``r2d2.*``: DQN's plus the sequence keys): DQN's plan -- replay, prioritized replay, Ape-X
replay shards and per-worker epsilons, target network -- over stored sequences, with a
recurrent Q-network.

Math, top to bottom (a stored sequence of ``L = seq_len`` steps, ``l <= L`` of them real; ``k =
burn_in``; ``eps = value_rescale_eps``):
    Network: ``(q_t, s_{t+1}) = Q(o_t, s_t)``: :class:`~flowkit.core.RecurrentTrunk` (LSTM or GRU of
        ``model.recurrent``, an LSTM when unset; then the MLP ``model.hidden_sizes``) and DQN's
        dueling head ``V + A - mean(A)``.
    Sequences (on the worker, :class:`SequenceCutter`): each episode cut into sequences of ``L``
        steps starting every ``stride`` steps (``seq_stride``, default ``L - k``: the trained parts
        tile the episode), so consecutive ones overlap by ``L - stride``; never across an episode
        boundary. Stored with the state the first step acted from (``s_0 = state_in``), the
        observations ``o_0 .. o_l`` (``o_l``: the observation after the last real step), actions,
        rewards and terminated flags; the last ones of an episode are zero-padded after step
        ``l - 1`` (``seq_mask`` False).
    Burn-in (section 3): the online network is unrolled over ``o_0 .. o_{k-1}`` from ``s_0`` without
        gradient, then over ``o_k .. o_L`` from the state it reached, with gradient; the target
        network over ``o_0 .. o_L`` from ``s_0`` (the stored state). An episode of ``k`` steps or
        fewer, which would leave no step past the burn-in, is one sequence without burn-in
        (``t = 0`` and ``l <= k``): its stored state is the initial state, which is not stale
        (burn-in repairs a state stored by an older network), so its steps are trained.
    Value rescaling (Pohlen et al. 2018, arXiv 1805.11593, Proposition A.2; R2D2 section 2.3):
        h(x)      = sign(x) (sqrt(|x| + 1) - 1) + eps x
        h^-1(x)   = sign(x) (((sqrt(1 + 4 eps (|x| + 1 + eps)) - 1) / (2 eps))^2 - 1)
    n-step double-Q target of each real step ``t`` (the window stops at the last real step):
        m    = min(n, l - t)
        a*   = argmax_a Q_online(o_{t+m}, a)       (legal actions only; Q_target without double_q)
        y_t  = h( sum_{i<m} gamma^i r_{t+i} + gamma^m (1 - terminated_{t+m-1}) h^-1(Q_target(o_{t+m}, a*)) )
    Loss: per sequence, the mean over its trained steps (real, and ``t >= k`` unless a short episode's) of
        ``huber(Q(o_t, a_t) - y_t)``, times its importance weight; the batch mean.
    Priority of a sequence (section 2.3), over its trained steps:
        p = eta max_t |delta_t| + (1 - eta) mean_t |delta_t|,   eta = 0.9
        sampled with P(i) ~ p_i^alpha (alpha 0.9, importance exponent beta 0.6).
    Exploration: epsilon-greedy (DQN's schedule) with a state per sub-env, back to zeros at every
        episode start; Ape-X (``r2d2.num_replay_shards > 0``): per-worker
        ``epsilon_i = base^(1 + alpha i / (N - 1))``.

Dataflow: DQN's (``flowkit plan algo=r2d2``); the workers' batches hold sequences (one row
each), which the replay stores and samples as rows::

    store = rollouts -> StoreToReplayBuffer -> UpdateExploration
    train = Replay -> TrainOneStep -> UpdatePriorities -> UpdateTargetNetwork -> SyncWeights(to all)
    Concurrently([store, train], round_robin, output_indexes=[1],
                 weights=[1, training_intensity * round_env_steps / (train_batch_size * seq_len)])

A replayed batch counts ``train_batch_size * seq_len`` env steps trained.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import nn

from flowkit import ConfigError
from flowkit.core import ObsEncoder, RecurrentStep, RecurrentTrunk, loss_stats
from flowkit.core import batch as sb
from flowkit.core.recurrent import is_recurrent, step
from flowkit_dqn import R2D2_REF, sequence_stride
from flowkit_dqn.dqn import DQN, DQNPolicy, QHeads, bootstrap_q


# ---- value rescaling, targets, priorities -------------------------------------------------------
def value_rescale(x: torch.Tensor, eps: float = 1e-3) -> torch.Tensor:
    """``h(x) = sign(x) (sqrt(|x| + 1) - 1) + eps x`` (Pohlen et al. 2018), elementwise, any shape."""
    return torch.sign(x) * (torch.sqrt(x.abs() + 1.0) - 1.0) + eps * x


def inverse_value_rescale(x: torch.Tensor, eps: float = 1e-3) -> torch.Tensor:
    """``h^-1(x) = sign(x) (((sqrt(1 + 4 eps (|x| + 1 + eps)) - 1) / (2 eps))^2 - 1)``: the exact
    inverse of :func:`value_rescale` (Pohlen et al. 2018, Proposition A.2), elementwise."""
    return torch.sign(x) * (((torch.sqrt(1.0 + 4.0 * eps * (x.abs() + 1.0 + eps)) - 1.0) / (2.0 * eps)) ** 2 - 1.0)


def r2d2_targets(rewards: torch.Tensor, terminateds: torch.Tensor, seq_mask: torch.Tensor, q_boot: torch.Tensor,
                 gamma: float, n: int, eps: Optional[float] = 1e-3) -> torch.Tensor:
    """n-step targets inside stored sequences, rescaled (see the module docstring).

    Args:
        rewards: float32[B, L]. terminateds: bool[B, L] (only a sequence's last real step can be
            set). seq_mask: bool[B, L], True at the ``l`` real steps (a prefix of each row).
        q_boot: float32[B, L + 1], ``Q_target(o_t, a*_t)`` for ``t = 0 .. L`` (``o_l`` the
            observation after the last real step; later columns are not read).
        gamma: discount. n: steps per window (>= 1). eps: of h; None: no rescaling (plain
            ``y = R + gamma^m (1 - terminated) q_boot``).
    Returns:
        float32[B, L]: ``y_t``; columns ``t >= l`` are meaningless (mask them).
    """
    B, L = rewards.shape
    t = torch.arange(L, device=rewards.device)
    length = seq_mask.long().sum(1, keepdim=True)                          # l, [B, 1]
    m = (length - t[None]).clamp(min=0, max=int(n))                         # window lengths, [B, L]
    ret = torch.zeros_like(rewards)
    for i in range(int(n)):
        r_i = rewards[:, (t + i).clamp(max=L - 1)]
        ret = ret + torch.where(m > i, (gamma ** i) * r_i, torch.zeros_like(r_i))
    last = (t[None] + m - 1).clamp(min=0)                                   # the window's last step
    term = terminateds.bool().gather(1, last)
    q_next = q_boot.gather(1, t[None] + m)                                  # index t + m <= l <= L
    if eps is not None:
        q_next = inverse_value_rescale(q_next, eps)
    y = ret + torch.pow(torch.full_like(ret, float(gamma)), m.to(ret.dtype)) * (~term).to(ret.dtype) * q_next
    return value_rescale(y, eps) if eps is not None else y


def sequence_priorities(td: torch.Tensor, mask: torch.Tensor, eta: float = 0.9) -> torch.Tensor:
    """float32[B]: ``eta * max|td| + (1 - eta) * mean|td|`` over the steps where ``mask`` (bool[B, L])
    is set, of ``td`` float32[B, L] (R2D2 section 2.3); 0 for a row without such a step."""
    a = td.abs() * mask
    count = mask.sum(1)
    return eta * a.max(1).values + (1.0 - eta) * a.sum(1) / count.clamp(min=1)


# ---- sequences (worker side) -----------------------------------------------------------------
class SequenceCutter:
    """Cuts a worker's fragments into R2D2's stored sequences, episode by episode, across
    fragments: one row per sequence of ``seq_len`` steps, starting every ``stride`` steps of an
    episode (``stride <= seq_len``); at an episode's end (terminated or truncated) the sequences
    that still hold a step past their ``burn_in`` come out zero-padded; an episode of ``burn_in``
    steps or fewer comes out as one sequence (trained without burn-in). The rows of an episode
    not yet in a full sequence wait for its next fragment (at most ``max_open`` episodes wait;
    the oldest is dropped beyond). A sequence never crosses an episode boundary.

    :meth:`add` takes rows with ``obs``, ``actions``, ``rewards``, ``terminateds``,
    ``truncateds``, ``next_obs``, ``state_in``, ``eps_id`` and ``t`` (``action_mask`` and
    ``next_action_mask`` too when the env has masks; ``agent_index`` separates agents of one
    episode) and returns a SampleBatch of ``k`` sequences:

    - ``obs`` [k, L + 1, *shape] (the obs dtype): ``o_0 .. o_{l-1}``, then at ``l`` the
      observation after the last real step (``next_obs``), zeros after;
    - ``actions`` [k, L, ...], ``rewards`` float32[k, L], ``terminateds`` bool[k, L],
      ``seq_mask`` bool[k, L] (True at the ``l`` real steps), zeros in the padding;
    - ``state_in`` float32[k, S]: the state the first step acted from;
    - ``action_mask`` [k, L + 1, A] (with masks: the last real one from ``next_action_mask``);
    - ``eps_id``, ``t`` int64[k]: the episode and step index of the first step;
    - each ``(column, next column)`` pair of ``carry`` (observation-like columns, e.g. a
      centralized value input and its value after the step): ``column`` [k, L + 1, ...] stacked as
      ``obs`` is (at ``l`` the last real row's ``next column``).
    """

    def __init__(self, seq_len: int, stride: int, burn_in: int, max_open: int = 4096,
                 carry: Sequence[Tuple[str, str]] = ()):
        if not 0 <= int(burn_in) < int(seq_len) or not 0 < int(stride) <= int(seq_len):
            raise ValueError(f"SequenceCutter: need 0 <= burn_in < seq_len and 0 < stride <= seq_len; got "
                             f"seq_len={seq_len}, stride={stride}, burn_in={burn_in}")
        self.L, self.stride, self.burn_in, self.max_open = int(seq_len), int(stride), int(burn_in), int(max_open)
        self.open: "OrderedDict[Tuple[int, int], sb.SampleBatch]" = OrderedDict()
        self.carry = [(str(c), str(nc)) for c, nc in carry]

    def add(self, batch: sb.SampleBatch) -> sb.SampleBatch:
        """The sequences completed by ``batch`` (rows of contiguous trajectory pieces in time
        order, as a runner gives them), see the class docstring.

        Raises:
            ValueError: a column it needs is missing."""
        need = (sb.OBS, sb.ACTIONS, sb.REWARDS, sb.TERMINATEDS, sb.TRUNCATEDS, sb.NEXT_OBS, sb.STATE_IN, sb.EPS_ID, sb.T,
                *(c for pair in self.carry for c in pair))
        if missing := [c for c in need if c not in batch]:
            raise ValueError(f"R2D2 cuts sequences from rows with columns {list(need)}; missing {missing} (a "
                             "runner that keeps a recurrent state per sub-env records state_in)")
        ends, _ = sb.trajectory_ends(batch)
        done = np.asarray(batch[sb.TERMINATEDS], bool) | np.asarray(batch[sb.TRUNCATEDS], bool)
        bounds = np.concatenate([[0], np.flatnonzero(ends) + 1]).tolist()
        seqs: List[Tuple[sb.SampleBatch, int, int]] = []
        for a, b in zip(bounds[:-1], bounds[1:]):
            piece = batch.slice(a, b)
            key = (int(piece[sb.EPS_ID][0]), int(piece[sb.AGENT_INDEX][0]) if sb.AGENT_INDEX in piece else 0)
            prev = self.open.pop(key, None)
            if prev is not None and int(prev[sb.T][-1]) + 1 == int(piece[sb.T][0]):
                piece = sb.concat_samples([prev, piece])
            n, s = len(piece), 0
            while s + self.L <= n:
                seqs.append((piece, s, s + self.L))
                s += self.stride
            if done[b - 1]:
                if s == 0 < n <= self.burn_in and int(piece[sb.T][0]) == 0:  # a short episode, whole
                    seqs.append((piece, 0, n))
                while s + self.burn_in < n:
                    seqs.append((piece, s, n))
                    s += self.stride
            elif s < n:
                self.open[key] = piece.slice(s, n).copy()
                while len(self.open) > self.max_open:
                    self.open.popitem(last=False)
        return self._stack(seqs, batch)

    def _stack(self, seqs: List[Tuple[sb.SampleBatch, int, int]], like: sb.SampleBatch) -> sb.SampleBatch:
        k, L = len(seqs), self.L
        masks = sb.ACTION_MASK in like and sb.NEXT_ACTION_MASK in like
        # observation-like columns [k, L + 1, ...] (at l: the last real row's next one); step columns [k, L, ...]
        pairs = [(sb.OBS, sb.NEXT_OBS), *([(sb.ACTION_MASK, sb.NEXT_ACTION_MASK)] if masks else []), *self.carry]
        steps = {sb.ACTIONS: None, sb.REWARDS: np.float32, sb.TERMINATEDS: bool}

        def zeros(col: str, length: Optional[int], dtype: Any = None) -> np.ndarray:
            v = np.asarray(like[col])
            return np.zeros((k, *(() if length is None else (length,)), *v.shape[1:]), dtype or v.dtype)
        out = {**{c: zeros(c, L + 1) for c, _ in pairs}, **{c: zeros(c, L, dt) for c, dt in steps.items()},
               sb.SEQ_MASK: np.zeros((k, L), bool), sb.STATE_IN: zeros(sb.STATE_IN, None, np.float32),
               sb.EPS_ID: np.zeros(k, np.int64), sb.T: np.zeros(k, np.int64)}
        for i, (p, s, e) in enumerate(seqs):
            ln = e - s
            for col, nxt in pairs:
                out[col][i, :ln], out[col][i, ln] = p[col][s:e], p[nxt][e - 1]
            for col in steps:
                out[col][i, :ln] = p[col][s:e]
            out[sb.SEQ_MASK][i, :ln] = True
            out[sb.STATE_IN][i], out[sb.EPS_ID][i], out[sb.T][i] = p[sb.STATE_IN][s], p[sb.EPS_ID][s], p[sb.T][s]
        return sb.SampleBatch(out)


# ---- the model -----------------------------------------------------------------------------------
class RecurrentQNetwork(QHeads):
    """R2D2's Q-network: a :class:`~flowkit.core.RecurrentTrunk` (``model.recurrent``, an LSTM when
    unset) and DQN's Q head (dueling: V + A - mean(A)), following the recurrent-model contract
    of :mod:`flowkit.core.recurrent`: ``forward(obs float32[N, T, *shape], state float32[N, S],
    resets bool[N, T] or None) -> (q float32[N, T, num_actions], state_out float32[N, S])``.
    Linear layers start from PyTorch's default init (as :class:`~flowkit_dqn.dqn.QNetwork`), the
    recurrent layer orthogonal."""

    def __init__(self, encoder: ObsEncoder, num_actions: int, model_cfg: Any, dueling: bool):
        super().__init__()
        self.trunk = RecurrentTrunk(encoder, model_cfg)
        self.build_heads(self.trunk.out_dim, num_actions, model_cfg.activation, dueling)
        self.default_init(model_cfg)

    def initial_state(self, n: int) -> torch.Tensor:
        return self.trunk.initial_state(n)

    def forward(self, obs: torch.Tensor, state: torch.Tensor,
                resets: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
        z, state_out = self.trunk(obs, state, resets)
        return self.q_from_features(z), state_out


# ---- the policy -------------------------------------------------------------------------------
class R2D2Policy(DQNPolicy):
    """A :class:`~flowkit_dqn.dqn.DQNPolicy` with a recurrent Q-network: acting carries a state per
    row (``compute_actions_encoded(..., state=)``), the workers' postprocessing cuts sequences
    (:class:`SequenceCutter`), and :meth:`loss` is R2D2's (burn-in, rescaled n-step double-Q
    targets). After each ``loss``, ``td_error`` holds each sequence's priority float32[B]
    (:func:`sequence_priorities`), which prioritized replay stores as it is (plus eps)."""

    train_columns: Tuple[str, ...] = (sb.OBS, sb.ACTIONS, sb.REWARDS, sb.TERMINATEDS, sb.SEQ_MASK, sb.STATE_IN,
                                      sb.PRIO_WEIGHTS, sb.ACTION_MASK, sb.T)

    def __init__(self, observation_space, action_space, config, model_config=None, device="cpu",
                 seed=0, inference_only=False):
        super().__init__(observation_space, action_space, config, model_config, device, seed, inference_only)
        self.cutter = self.make_cutter()

    def make_cutter(self) -> SequenceCutter:
        """The workers' :class:`SequenceCutter`: ``seq_len`` steps every ``seq_stride``, ``burn_in``."""
        return SequenceCutter(self.config.seq_len, sequence_stride(self.config), self.config.burn_in)

    def make_model(self) -> nn.Module:
        """A :class:`RecurrentQNetwork`, or the recurrent network of ``model.class``.

        Raises:
            ConfigError: ``model.class`` names a feed-forward network (no ``initial_state``)."""
        model = self.build_model(RecurrentQNetwork(self.encoder, self.num_actions, self.model_config,
                                                   self.config.dueling))
        if not is_recurrent(model):
            raise ConfigError(f"r2d2 trains a recurrent Q-network: model.class={self.model_config.get('class')!r} has "
                              "no initial_state(n) method (the recurrent-model contract, see Policy.build_model)")
        return model

    def q_values(self, obs: np.ndarray) -> np.ndarray:
        raise ValueError("a recurrent Q-network needs a state: use compute_actions_encoded(obs, mask, explore, "
                         "state=...) (start from initial_state(B))")

    # -- acting (worker) --
    @torch.inference_mode()
    def compute_actions_encoded(self, obs, mask=None, explore=True, state=None):
        if state is None:
            raise ValueError("a recurrent policy acts with state= (float32[B, S], from initial_state(B))")
        state = np.ascontiguousarray(state, np.float32)
        q, s_out = step(self.model, torch.from_numpy(obs).to(self.device), torch.from_numpy(state).to(self.device))
        actions = self.epsilon_greedy(q.cpu().numpy(), mask, explore)
        return actions, {sb.STATE_IN: state, sb.STATE_OUT: s_out.cpu().numpy()}

    def postprocess_trajectory(self, batch: sb.SampleBatch) -> sb.SampleBatch:
        """The sequences ``batch`` completes (:class:`SequenceCutter`; rows of unfinished ones wait
        on this worker for the episode's next fragment)."""
        return self.cutter.add(batch)

    def action_model(self) -> nn.Module:
        """One step: ``(obs float32[B, *shape], state float32[B, S]) -> (q float32[B, A], state_out)``."""
        return RecurrentStep(self.model)

    def sequence_columns(self, batch: sb.SampleBatch) -> Dict[str, torch.Tensor]:
        """Nothing: each replayed row is a whole sequence, its ``state_in`` a train column."""
        return {}

    # -- learning (driver) --
    @staticmethod
    def unroll(module: nn.Module, obs: torch.Tensor, state: torch.Tensor, burn_in: int,
               fresh: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Q-values float32[B, T, A] of ``module`` over ``obs`` [B, T, *shape] from ``state``
        [B, S]; the first ``burn_in`` steps without gradient (nor through the state they hand on),
        except in the rows where ``fresh`` bool[B] is set (short episodes: no burn-in)."""
        if burn_in <= 0:
            return module(obs, state)[0]
        if fresh is None or not bool(fresh.any()):
            with torch.no_grad():
                q_burn, s = module(obs[:, :burn_in], state)
        else:  # one unroll with gradient, cut (detached) in the rows that burn in
            q_burn, s = module(obs[:, :burn_in], state)
            q_burn = torch.where(fresh[:, None, None], q_burn, q_burn.detach())
            s = torch.where(fresh.view(-1, *([1] * (s.dim() - 1))), s, s.detach())
        q_rest, _ = module(obs[:, burn_in:], s)
        return torch.cat([q_burn, q_rest], 1)

    def loss(self, batch: Dict[str, torch.Tensor]) -> Tuple[torch.Tensor, Dict[str, float]]:
        cfg = self.config
        assert self.target is not None, "loss runs on the learner's policy"
        obs, state, actions = batch[sb.OBS], batch[sb.STATE_IN], batch[sb.ACTIONS].long()
        L, k = actions.shape[1], int(cfg.burn_in)
        fresh = None if sb.T not in batch else (batch[sb.T] == 0) & (batch[sb.SEQ_MASK].sum(1) <= k)
        # fresh: bool[B], short episodes (no step past the burn-in): trained without burn-in
        q = self.unroll(self.model, obs, state, k, fresh)                             # [B, L + 1, A]
        q_taken = q[:, :L].gather(-1, actions.unsqueeze(-1)).squeeze(-1)             # [B, L]
        with torch.no_grad():
            q_target = self.target.module(obs, state)[0]                             # [B, L + 1, A]
            q_boot = bootstrap_q(q_target, q.detach() if cfg.double_q else q_target,
                                 batch.get(sb.ACTION_MASK))                          # [B, L + 1]
            y = r2d2_targets(batch[sb.REWARDS].float(), batch[sb.TERMINATEDS], batch[sb.SEQ_MASK], q_boot,
                             cfg.gamma, cfg.n_step, cfg.value_rescale_eps if cfg.value_rescaling else None)
        trained = batch[sb.SEQ_MASK].bool() & (torch.arange(L, device=q.device) >= k)[None]
        if fresh is not None:
            trained = trained | (batch[sb.SEQ_MASK].bool() & fresh[:, None])
        per_step = nn.functional.huber_loss(q_taken, y, reduction="none", delta=cfg.huber_delta) * trained
        count = trained.sum(1)
        per_seq = per_step.sum(1) / count.clamp(min=1)
        w = batch.get(sb.PRIO_WEIGHTS)
        loss = (per_seq * w).mean() if w is not None else per_seq.mean()
        with torch.no_grad():
            td = (q_taken - y) * trained
            prio = sequence_priorities(td, trained, cfg.priority_eta)
            self.td_error = prio.cpu().numpy().astype(np.float32)
            n = count.sum().clamp(min=1)
        return loss, loss_stats(loss=loss, mean_q=(q_taken * trained).sum() / n, mean_abs_td_error=td.abs().sum() / n,
                                mean_target=(y * trained).sum() / n, mean_priority=prio.mean())


# ---- the algorithm --------------------------------------------------------------------------
class R2D2(DQN, ref=R2D2_REF):
    """R2D2: DQN's plan (Ape-X with ``r2d2.num_replay_shards > 0``) over stored sequences of a
    recurrent Q-network (:class:`R2D2Policy`)."""

    policy_class = R2D2Policy

    @property
    def train_batch_env_steps(self) -> int:
        """``train_batch_size`` sequences of ``seq_len`` steps."""
        return int(self.config.train_batch_size) * int(self.config.seq_len)
