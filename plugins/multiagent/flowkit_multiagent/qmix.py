"""Value decomposition: VDN (Sunehag et al. 2018, "Value-Decomposition Networks For Cooperative
Multi-Agent Learning", AAMAS, arXiv 1706.05296) and QMIX (Rashid et al. 2018, "QMIX: Monotonic Value
Function Factorisation for Deep Multi-Agent Reinforcement Learning", ICML, arXiv 1803.11485), as the
algorithms ``vdn`` and ``qmix`` a multi-agent mapping assigns to a team: the agents mapped to one
policy (``multiagent.policies.team.algo=qmix``, ``'multiagent.mapping.agent_*=team'``).

Math, top to bottom (a team of ``n`` agents ``a``; a stored sequence of ``L = seq_len`` steps, ``l``
of them real; ``s_t`` the global state):
    Agent network, shared by the team (decentralised execution: it sees the agent's own
    observation only): ``(Q_a(o^a_t, .), h^a_{t+1}) = Q(o^a_t, h^a_t)``, R2D2's recurrent Q-network
    (:class:`~flowkit_dqn.r2d2.RecurrentQNetwork`: ``model.recurrent`` GRU or LSTM, then
    ``model.hidden_sizes``, then a linear or dueling head).
    Mixer (learner side; the team's value from the agents' chosen Q-values ``q = (q_1 .. q_n)``):
        VDN  (Sunehag et al., eq. 1):   Q_tot(q, s) = sum_a q_a
        QMIX (Rashid et al., sec. 4.1 and fig. 2):
            Q_tot(q, s) = elu(q W_1(s) + b_1(s)) W_2(s) + b_2(s)
            W_1(s) = |hyper_w1(s)| (n x m),  W_2(s) = |hyper_w2(s)| (m x 1),  m = mixing_embed_dim
            b_1(s) = hyper_b1(s) (linear),   b_2(s) = V(s) (two layers, ReLU)
        hyper_w1 and hyper_w2 are one linear layer of ``s`` (``hypernet_layers=1``) or two with a
        ReLU between (``hypernet_layers=2``, ``hypernet_embed`` units, EPyMARL's default). The
        absolute value makes the weights non-negative, so ``dQ_tot / dq_a >= 0`` (eq. 5:
        monotonic in every agent's Q, so each agent's greedy action is the team's).
        ``s_t``: the global state, the multiagent plugin's centralized value input
        (:mod:`flowkit_multiagent.centralized`, ``qmix.critic_input``: the env's ``state()``, or the
        team's encoded observations concatenated), without agent id.
    Team reward: ``r_t = sum_a r^a_t`` (``team_reward=sum``, EPyMARL's) or the mean; with
    ``standardise_rewards`` (EPyMARL's ``standardise_rewards``) the learner uses
    ``(r_t - mu) / sigma``, ``mu`` and ``sigma^2`` the running mean and variance of the team
    rewards of every replayed real step so far (updated with each train batch before its
    targets; a sparse reward of probability ``p`` becomes about ``1 / sqrt(p)``, the steps
    without one about ``-sqrt(p)``).
    Target of each real step ``t`` (double Q, van Hasselt et al. 2016: the action is chosen by the
    online network at the next step ``t+1``, valued by the target network there; legal actions
    only; ``double_q=false``: the target network's own argmax):
        a*_a = argmax_u Q_a(o^a_{t+1}, u)
        y_t  = r_t + gamma (1 - terminated_t) Q_tot^-(Q^-_1(o^1_{t+1}, a*_1) .. Q^-_n(o^n_{t+1}, a*_n), s_{t+1})
        ``o_{t+1}`` of the last real step is the observation after it, so a truncated sequence
        end bootstraps from the final observation's team value; a terminated one does not.
    Loss (Rashid et al., eq. 6): ``sum_{t < l} (Q_tot(q(o_t, u_t), s_t) - y_t)^2 / sum l``, the padded
    steps ``t >= l`` masked out (nothing in the loss, nothing in the gradient).
    Target networks (agent network and mixer, ``Q^-``, ``Q_tot^-``): hard copies every
    ``target_network_update_freq`` gradient steps.
    Exploration: epsilon-greedy per agent (DQN's schedule over env steps sampled); each agent
    keeps its own recurrent state, from zeros at its episode's start.

Sequences: each agent's trajectory is cut on the worker by R2D2's
:class:`~flowkit_dqn.r2d2.SequenceCutter` (sequences of ``seq_len`` steps, no burn-in, no overlap:
a whole episode when ``seq_len`` is the episode limit, zero-padded); the driver joins the team's
sequences of one episode and step (:func:`team_sequences`, by the multiagent plugin's team join
:func:`flowkit_multiagent.centralized.join_team`) into one replay row::

    obs [L + 1, n, *shape], actions [L, n], rewards [L] (team), terminateds [L], seq_mask [L],
    state_in [n, S], action_mask [L + 1, n, A] (with masks), critic_obs [L + 1, D] (QMIX: s_t)

Dataflow (``flowkit plan -c configs/multiagent/qmix_simple_spread.yaml``)::

    store = rollouts -> JoinTeamSequences -> StoreToReplayBuffer -> UpdateExploration
    train = Replay -> TrainOneStep -> UpdateTargetNetwork -> SyncWeights(to all)
    Concurrently([store, train], round_robin, output_indexes=[1],
                 weights=[1, training_intensity * round_env_steps / (train_batch_size * seq_len)])
"""
from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import numpy as np
import torch
from flowkit_dqn.dqn import UpdateExploration, bootstrap_q
from flowkit_dqn.r2d2 import R2D2Policy, RecurrentQNetwork, SequenceCutter
from torch import nn

import flowkit
from flowkit import ConfigError
from flowkit.core import RecurrentStep, RunningMeanStd, derive_seed, loss_stats, ops, replay
from flowkit.core import batch as sb
from flowkit.core.recurrent import is_recurrent
from flowkit_multiagent.centralized import CRITIC_OBS, NEXT_CRITIC_OBS, TEAM_MEMBER, join_team, with_policy_batches
from flowkit_multiagent.config import QMIX_REF, VDN_REF


# ---- mixers (learner side) ----------------------------------------------------------------------
class VDNMixer(nn.Module):
    """``Q_tot(q, s) = sum_a q_a`` (Sunehag et al. 2018, eq. 1): ``q`` float32[..., n], ``s`` unused
    -> float32[...]."""

    def forward(self, q: torch.Tensor, s: Optional[torch.Tensor] = None) -> torch.Tensor:
        return q.sum(-1)


class QMixer(nn.Module):
    """QMIX's monotonic mixing network (Rashid et al. 2018, sec. 4.1, fig. 2): weights and
    biases of a two-layer network over the agents' Q-values made from the global state by
    hypernetworks, the weights through ``abs`` (non-negative), an ELU between.

    ``forward(q float32[..., n], s float32[..., state_dim]) -> Q_tot float32[...]``.

    Init: PyTorch's default, except ``hyper_b1`` and the last layer of ``V`` at zero, so that
    ``Q_tot(0, s) = 0`` at the start for every state (a raw global state, LBF's coordinates 0-7,
    made offsets of 8-17 by the default init where returns are at most 1).

    Args:
        n: agents. state_dim: size of ``s``. embed: ``m``, the mixing layer's width.
        hypernet_layers: 1 (a linear map of ``s``) or 2 (``hypernet_embed`` units, ReLU).
    """

    def __init__(self, n: int, state_dim: int, embed: int = 32, hypernet_layers: int = 2, hypernet_embed: int = 64):
        super().__init__()
        self.n, self.state_dim, self.embed = int(n), int(state_dim), int(embed)

        def hyper(out: int) -> nn.Module:
            if hypernet_layers == 1:
                return nn.Linear(state_dim, out)
            return nn.Sequential(nn.Linear(state_dim, hypernet_embed), nn.ReLU(), nn.Linear(hypernet_embed, out))
        self.hyper_w1, self.hyper_w2 = hyper(self.n * self.embed), hyper(self.embed)
        self.hyper_b1 = nn.Linear(state_dim, self.embed)
        self.hyper_b2 = nn.Sequential(nn.Linear(state_dim, self.embed), nn.ReLU(), nn.Linear(self.embed, 1))  # V(s)
        for p in (*self.hyper_b1.parameters(), *self.hyper_b2[2].parameters()):  # Q_tot(0, s) = 0 at the start
            nn.init.zeros_(p)

    def forward(self, q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        if s.shape[-1] != self.state_dim:
            raise ValueError(f"QMixer: a global state of width {s.shape[-1]}, expected {self.state_dim} (a batch "
                             "without the critic_obs column?)")
        lead, m = q.shape[:-1], self.embed
        q, s = q.reshape(-1, 1, self.n), s.reshape(-1, self.state_dim)
        w1 = self.hyper_w1(s).abs().view(-1, self.n, m)
        hidden = nn.functional.elu(torch.bmm(q, w1) + self.hyper_b1(s).view(-1, 1, m))      # [N, 1, m]
        w2 = self.hyper_w2(s).abs().view(-1, m, 1)
        return (torch.bmm(hidden, w2) + self.hyper_b2(s).view(-1, 1, 1)).view(lead)


class TeamQ(nn.Module):
    """The team's networks: ``agent`` (the recurrent agent network, shared by the team; what
    acting, the workers and export use) and ``mixer`` (learner side), and ``reward_rms``, the
    team reward's running statistics (``standardise_rewards``; None without). ``forward`` and
    ``initial_state`` are the agent network's (the recurrent-model contract of
    :mod:`flowkit.core.recurrent`)."""

    agent: Any  # the recurrent-model contract (initial_state, forward)

    def __init__(self, agent: nn.Module, mixer: nn.Module, standardise_rewards: bool = False):
        super().__init__()
        self.agent, self.mixer = agent, mixer
        self.reward_rms = RunningMeanStd((), clip=float("inf")) if standardise_rewards else None

    def team_rewards(self, rewards: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
        """The rewards the targets use: ``rewards`` float32[B, L] as they are, or standardised
        after adding the real steps (``real`` float32[B, L], 1 at a real step) to ``reward_rms``."""
        if self.reward_rms is None:
            return rewards
        self.reward_rms.update(rewards[real > 0].double())
        return self.reward_rms(rewards.double()).to(rewards.dtype)

    def initial_state(self, n: int) -> torch.Tensor:
        return self.agent.initial_state(n)

    def forward(self, obs: torch.Tensor, state: torch.Tensor, resets: Optional[torch.Tensor] = None):
        return self.agent(obs, state, resets)


# ---- targets --------------------------------------------------------------------------------
def team_targets(rewards: torch.Tensor, terminateds: torch.Tensor, q_next_target: torch.Tensor,
                 q_next_select: torch.Tensor, mixer: nn.Module, state_next: torch.Tensor, gamma: float,
                 next_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``y_t = r_t + gamma (1 - terminated_t) Q_tot^-(Q^-(o_{t+1}, a*), s_{t+1})``, ``a* = argmax
    q_next_select`` per agent over its legal actions (see the module docstring).

    Args:
        rewards: float32[B, L], the team's. terminateds: bool[B, L].
        q_next_target: float32[B, L, n, A], the target agent network at ``o_{t+1}``.
        q_next_select: float32[B, L, n, A], what picks ``a*``: the online network at ``o_{t+1}``
            (double Q) or ``q_next_target`` (no double Q).
        mixer: the target mixer. state_next: float32[B, L, state_dim], ``s_{t+1}``.
        next_mask: int8 or bool[B, L, n, A], legal actions at ``o_{t+1}`` (None: all).
    Returns:
        float32[B, L]; the padded steps' entries are meaningless (mask them).
    """
    q_next = bootstrap_q(q_next_target, q_next_select, next_mask)                    # [B, L, n]
    return rewards + gamma * (~terminateds.bool()).to(rewards.dtype) * mixer(q_next, state_next)


# ---- team sequences (driver side) -------------------------------------------------------------
TEAM_COLUMNS = (sb.OBS, sb.ACTIONS, sb.REWARDS, sb.TERMINATEDS, sb.SEQ_MASK, sb.STATE_IN, sb.ACTION_MASK)


def team_sequences(batch: sb.SampleBatch, team: Dict[str, Any], team_reward: str = "sum",
                   who: str = "") -> sb.SampleBatch:
    """Per-agent sequences (rows of :class:`~flowkit_dqn.r2d2.SequenceCutter` with
    ``agent_index``) -> one row per team sequence, laid out as the module docstring says.

    The agents' sequences of one episode and first step are joined by the multiagent plugin's
    team join (:func:`flowkit_multiagent.centralized.join_team`, members in ``team["agents"]``
    order); per-agent columns get an agent axis after the time axis (their dtypes kept), rewards
    are summed (or averaged) over the team, a step is terminated when an agent's is, the global
    state ``critic_obs`` (the same for every agent) is the first agent's; ``eps_id`` is the
    episode's (``eps_id - agent_index``).

    Args:
        team: the policy's team (``<algo>.team``: ``agents``, ``agent_indexes``, ``n_agents``).

    Raises:
        ValueError: a sequence without all the team's agents, or agents whose sequences end at
            different steps (naming ``who``, the episode and the step): value decomposition needs
            every agent of the team to act at every step of an episode.
    """
    if len(batch) == 0:
        return sb.SampleBatch()
    agents, n = list(team["agents"]), len(team["agents"])
    cols = [c for c in TEAM_COLUMNS if c in batch]
    shapes = {c: np.asarray(batch[c]).shape[1:] for c in cols}
    need = " needs every agent of the team to act at every step of an episode (a PettingZoo Parallel env whose " \
           "agents neither join late nor leave early)"
    try:
        joined = join_team({"team": batch}, agents, team["agent_indexes"], team["n_agents"],
                           {f"team/{c}": (c, [int(np.prod(shapes[c]))] * n) for c in cols}, incomplete="raise")["team"]
    except ValueError as e:
        raise ValueError(f"{who}: the team sequence of {e}; value decomposition{need}") from None
    first = joined.take(np.flatnonzero(joined[TEAM_MEMBER] == 0))
    k = len(first)

    def per_agent(c: str) -> np.ndarray:  # [k, n * prod(shape)] -> [k, L(+1), n, ...] in the column's dtype
        v = first[f"team/{c}"].reshape(k, n, *shapes[c]).astype(np.asarray(batch[c]).dtype)
        return np.moveaxis(v, 1, 2) if v.ndim > 2 and c != sb.STATE_IN else v
    mask = per_agent(sb.SEQ_MASK)                                                        # [k, L, n]
    if (bad := np.flatnonzero((mask != mask[..., :1]).any((1, 2)))).size:
        i = int(bad[0])
        raise ValueError(f"{who}: episode {int(first[sb.EPS_ID][i] // team['n_agents'])}, sequence from step "
                         f"{int(first[sb.T][i])}: agents {agents} with sequences of {mask[i].sum(0).tolist()} steps; "
                         f"value decomposition{need}")
    r = per_agent(sb.REWARDS)
    out = {c: per_agent(c) for c in (sb.OBS, sb.ACTIONS, sb.STATE_IN, sb.ACTION_MASK) if c in cols}
    out.update({sb.REWARDS: (r.sum(-1) if team_reward == "sum" else r.mean(-1)).astype(np.float32),
                sb.TERMINATEDS: np.asarray(per_agent(sb.TERMINATEDS).any(-1)), sb.SEQ_MASK: mask[..., 0],
                sb.EPS_ID: first[sb.EPS_ID] - first[sb.AGENT_INDEX], sb.T: first[sb.T].copy()})
    if CRITIC_OBS in batch:
        out[CRITIC_OBS] = np.asarray(first[CRITIC_OBS])
    return sb.SampleBatch(out)


# ---- the policy -------------------------------------------------------------------------------
class VDNPolicy(R2D2Policy):
    """A team's policy: the shared recurrent agent network and the mixer (:class:`TeamQ`), their
    target copies (learner only), R2D2's epsilon-greedy acting with a recurrent state per agent
    (``compute_actions_encoded(..., state=)``: :class:`TeamQ` acts as its agent network), the
    workers' sequence cutting and the value decomposition loss over team sequences.
    :meth:`make_mixer` is the one difference between VDN and QMIX (:class:`QMIXPolicy`).

    Raises:
        ConfigError: the policy has no team (``team`` is set by the multiagent plugin from the
            agents mapped to the policy: a single-agent env has none), a team whose agents play
            several policies, or ``model.class`` names a feed-forward network.
    """

    train_columns: Tuple[str, ...] = (sb.OBS, sb.ACTIONS, sb.REWARDS, sb.TERMINATEDS, sb.SEQ_MASK, sb.STATE_IN,
                                      sb.ACTION_MASK, CRITIC_OBS)
    ALGO = "vdn"

    def make_cutter(self) -> SequenceCutter:
        """Whole sequences of ``seq_len`` steps, no burn-in, no overlap; QMIX's global state carried."""
        carry = [(CRITIC_OBS, NEXT_CRITIC_OBS)] if getattr(self.config, "critic_input", None) else []
        return SequenceCutter(self.config.seq_len, self.config.seq_len, 0, carry=carry)

    def make_mixer(self) -> nn.Module:
        """The mixer: VDN's sum."""
        return VDNMixer()

    def make_model(self) -> nn.Module:
        team = self.config.team
        if not team:
            raise ConfigError(f"{self.ALGO} trains a team: the agents of a PettingZoo game mapped to one policy "
                              f"({self.ALGO}.team is set from them); this env has no agents to make a team of")
        if len(set(team["policies"])) > 1:
            raise ConfigError(f"{self.ALGO}: the team {list(team['agents'])} plays policies {sorted(set(team['policies']))}; "
                              "value decomposition mixes one policy's agents: map a team to one policy (another team: "
                              f"its own policy with its own config overrides, multiagent.policies.<id>.config)")
        agent = self.build_model(RecurrentQNetwork(self.encoder, self.num_actions, self.model_config,
                                                   self.config.dueling))
        if not is_recurrent(agent):
            raise ConfigError(f"{self.ALGO} trains a recurrent agent network: model.class="
                              f"{self.model_config.get('class')!r} has no initial_state(n) method (see Policy.build_model)")
        return TeamQ(agent, self.make_mixer(), bool(self.config.standardise_rewards))

    def postprocess_trajectory(self, batch: sb.SampleBatch) -> sb.SampleBatch:
        """The sequences of one agent's trajectory piece ``batch`` completes (:class:`SequenceCutter`),
        with its ``agent_index``; the driver joins the team's (:func:`team_sequences`)."""
        if sb.AGENT_INDEX not in batch:
            raise ValueError(f"{self.ALGO} trains the agents of a PettingZoo game: the batch has no `agent_index`")
        out = self.cutter.add(batch)
        out[sb.AGENT_INDEX] = np.full(len(out), int(batch[sb.AGENT_INDEX][0]) if len(batch) else 0, np.int64)
        return out

    def action_model(self) -> nn.Module:
        """The agent network alone, one step: ``(obs float32[B, *shape], state float32[B, S]) -> (q
        float32[B, A], state_out)``: an agent acts from its own observation (decentralised execution)."""
        return RecurrentStep(self.model.agent)

    # -- learning (driver) --
    def team_q(self, module: Any, obs: torch.Tensor, state_in: torch.Tensor) -> torch.Tensor:
        """Q-values float32[B, T, n, A] of ``module``'s agent network over team sequences ``obs``
        [B, T, n, *shape], each agent from its ``state_in`` [B, n, S]."""
        B, T, n = obs.shape[:3]
        flat = obs.transpose(1, 2).reshape(B * n, T, *obs.shape[3:])
        q = module.agent(flat, state_in.reshape(B * n, -1))[0]                    # [B * n, T, A]
        return q.view(B, n, T, -1).transpose(1, 2)

    def team_values(self, batch: Dict[str, torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(Q_tot float32[B, L], y float32[B, L] (no gradient), real float32[B, L])`` of a prepared
        batch of team sequences (the module docstring's math; ``real``: 1 at the real steps)."""
        cfg = self.config
        assert self.target is not None, "team_values runs on the learner's policy"
        target: Any = self.target.module
        obs, state_in, actions = batch[sb.OBS], batch[sb.STATE_IN], batch[sb.ACTIONS].long()
        B, L = actions.shape[:2]
        s = batch[CRITIC_OBS].float() if CRITIC_OBS in batch else obs.new_zeros(B, L + 1, 0)  # s_t [B, L + 1, D]
        q = self.team_q(self.model, obs, state_in)                                 # [B, L + 1, n, A]
        q_taken = q[:, :L].gather(-1, actions.unsqueeze(-1)).squeeze(-1)           # [B, L, n]
        q_tot = self.model.mixer(q_taken, s[:, :L])                                # [B, L]
        real = batch[sb.SEQ_MASK].to(q_tot.dtype)
        with torch.no_grad():
            q_target = self.team_q(target, obs, state_in)              # [B, L + 1, n, A]
            select = q.detach() if cfg.double_q else q_target                      # a* at t + 1: online (double Q)
            mask = batch.get(sb.ACTION_MASK)
            r = self.model.team_rewards(batch[sb.REWARDS].float(), real)           # standardised or as they are
            y = team_targets(r, batch[sb.TERMINATEDS], q_target[:, 1:], select[:, 1:],
                             target.mixer, s[:, 1:], cfg.gamma, None if mask is None else mask[:, 1:])
        return q_tot, y, real

    def loss(self, batch: Dict[str, torch.Tensor]) -> Tuple[torch.Tensor, Dict[str, float]]:
        q_tot, y, real = self.team_values(batch)
        n_real = real.sum().clamp(min=1)
        td = torch.where(real > 0, q_tot - y, torch.zeros_like(y))                 # padding: 0, no gradient
        loss = (td ** 2).sum() / n_real
        return loss, loss_stats(loss=loss, mean_q_tot=(q_tot * real).sum() / n_real,
                                mean_target=(y * real).sum() / n_real, mean_abs_td_error=td.abs().sum() / n_real)


class QMIXPolicy(VDNPolicy):
    """:class:`VDNPolicy` with QMIX's monotonic mixer (:class:`QMixer`)."""

    ALGO = "qmix"

    def make_mixer(self) -> nn.Module:
        """QMIX's mixer over the team's ``n`` agents and the global state (``critic_input_dim``,
        resolved with the team at set-up)."""
        cfg = self.config
        return QMixer(len(cfg.team["agents"]), cfg.critic_input_dim, cfg.mixing_embed_dim, cfg.hypernet_layers,
                      cfg.hypernet_embed)


# ---- the algorithms ------------------------------------------------------------------------------
class VDN(flowkit.Algorithm, ref=VDN_REF):
    """VDN: the replay plan over team sequences (see the module docstring)."""

    policy_class = VDNPolicy
    rollout_mode = "bulk_sync"
    off_policy = True

    @property
    def train_batch_env_steps(self) -> int:
        """``train_batch_size`` team sequences of ``seq_len`` steps."""
        return int(self.config.train_batch_size) * int(self.config.seq_len)

    def training_flow(self, experiences, ctx, learner):
        cfg, ti = self.config, self.config.training_intensity
        buffer = ctx.add_stateful(f"{learner.name}/replay_buffer", replay.MultiAgentReplayBuffer(
            cfg.buffer_size, False, seed=derive_seed(int(self.run_config.seed), "replay", self.name)))
        weights = [1, 1] if ti is None else replay.store_train_weights(ti, ctx.workers.round_env_steps,
                                                                       self.train_batch_env_steps)
        pols = learner.policies

        def join(pbs: Dict[str, sb.SampleBatch]) -> Dict[str, sb.SampleBatch]:  # a new dict, the input unchanged
            return {pid: team_sequences(b, pols[pid].config.team, pols[pid].config.team_reward,
                                        f"{self.name} policy {pid!r}") if pid in pols else b for pid, b in pbs.items()}
        teams = experiences.for_each(lambda b: with_policy_batches(b, join), f"JoinTeamSequences({list(pols)})")
        return ops.ReplayPlan(ctx, learner, teams, buffer, cfg.train_batch_size, cfg.learning_starts,
                              cfg.target_network_update_freq, weights, store_ops=[UpdateExploration(ctx, learner, cfg)],
                              train_ops=[ops.SyncWeights(ctx, learner, every=cfg.weight_sync_freq * self.train_batch_env_steps)])


class QMIX(VDN, ref=QMIX_REF):
    """QMIX: VDN's plan with the monotonic mixer (:class:`QMIXPolicy`)."""

    policy_class = QMIXPolicy
