"""Continuous centralized critics: MASAC and MATD3 (MADDPG with TD3's twin critics), centralized
training with decentralized execution for Box actions, on the SAC/TD3 machinery of flowkit-sac.

Sources: MADDPG, Lowe et al. 2017, "Multi-Agent Actor-Critic for Mixed Cooperative-Competitive
Environments", NeurIPS, arXiv 1706.02275 (algorithm 1, eq. 5-6); MATD3, Ackermann et al. 2019,
arXiv 1910.01465 (MADDPG with TD3's clipped double Q, delayed actor updates and target
smoothing); MASAC: the SAC loss (Haarnoja et al. 2018, arXiv 1812.05905, eq. 3, 5, 7, 18) with
that centralized critic, as BenchMARL's ``masac``.

The team (:func:`~flowkit_multiagent.centralized.team_of`): the agents mapped to the policies
of one training group, in ``possible_agents`` order, members ``j = 0..N-1``, member j with
encoded observation o_j (float32[d_j]), action a_j in [-1, 1]^k_j and policy pi_j (several
members may share one policy: parameter sharing, ``multiagent.obs_agent_id`` for ids in o_j).
Per row of agent i:

    x, x'  the centralized value input at the step and after it, ``critic_obs`` /
           ``next_critic_obs`` (:mod:`flowkit_multiagent.centralized`: the env's ``state()`` or
           the team's observations, with ``critic_agent_id`` the one-hot id of agent i)
    A  = [a_1, ..., a_N]      float32[K], K = sum k_j, every member's action at the step
    o' = [o'_1, ..., o'_N]    every member's next observation (its target action's input)

A and o' are joined from the members' rows of the same env step before the replay buffer
(:func:`~flowkit_multiagent.centralized.join_team`). Every policy keeps its own twin critic
(MADDPG's Q_i; one shared by the agents of a shared policy, told apart by the id in x):

    Q_i(x, A) = TwinMLP([x, A])

MATD3 (per row of agent i, actions of the other members as replayed):
    a'_j = clip(mu'_j(o'_j) + clip(eps_j, -c, c), -1, 1)   every member, its own target actor
    y    = r_i + gamma (1 - terminated_i) min_k Q'_ik(x', a'_1..a'_N)
    J_Q  = sum_k mean (Q_ik(x, A) - y)^2
    J_mu = -mean Q_i1(x, A with slot i replaced by mu_i(o_i))    every policy_delay-th step
    (the deterministic policy gradient of eq. 6 flows through agent i's own slot only)
MASAC:
    a'_j ~ pi_j(.|o'_j) (squashed Gaussian),  log pi_i(a'_i|o'_i) the own agent's
    y    = r_i + gamma (1 - terminated_i) (min_k Q'_ik(x', a'_1..a'_N) - alpha log pi_i(a'_i|o'_i))
    J_Q  = sum_k 0.5 mean (Q_ik(x, A) - y)^2
    J_pi = mean (alpha log pi_i(a~_i|o_i) - min_k Q_ik(x, A with slot i replaced by a~_i))
    J(alpha) = -mean log alpha (log pi_i(a~_i|o_i) + H_target)
Targets: Q' (and MATD3's mu') <- (1 - tau) Q' + tau Q (Polyak), as SAC and TD3 do.

Acting and export use the actor alone on the agent's own observation (workers never get a
critic). A team of one (a single-agent env, or ``team`` unset) is SAC or TD3 exactly.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from flowkit_sac.sac import SAC, OffPolicyActorCritic, SACModel, SACPolicy, sac_targets, squashed_gaussian, twin_critic
from flowkit_sac.td3 import TD3, OffPolicyAlgorithm, TD3Model, TD3Policy, smoothed_target_action, td3_targets

from flowkit import ConfigError
from flowkit.core import batch as sb
from flowkit.core import loss_stats
from flowkit_multiagent.centralized import CRITIC_OBS, NEXT_CRITIC_OBS, TEAM_MEMBER, join_team, with_policy_batches
from flowkit_multiagent.config import MASAC_REF, MATD3_REF

TEAM_NEXT_OBS = "team_next_obs"  # float32[B, sum d_j], every member's encoded next observation, team order
TEAM_ACTIONS = "team_actions"    # float32[B, K], every member's action in [-1, 1], team order
TEAM_COLUMNS = (CRITIC_OBS, NEXT_CRITIC_OBS, TEAM_NEXT_OBS, TEAM_ACTIONS, TEAM_MEMBER)


# ---- the team -----------------------------------------------------------------------------------
class Team:
    """Sizes and offsets of a team (the dict :func:`flowkit_multiagent.specs.assign_teams` puts
    in ``<algo>.team``; None: a team of one with ``obs_dim``, ``act_dim``), the critic's input
    width (``critic_obs_dim`` + every member's action) and, on the learner, its members'
    policies (:meth:`bind`)."""

    def __init__(self, team: Optional[Dict[str, Any]], critic_obs_dim: int, obs_dim: int, act_dim: int):
        self.obs_dims = list(team["obs_dims"]) if team else [obs_dim]
        self.act_dims = list(team["act_dims"]) if team else [act_dim]
        self.policy_ids: List[str] = list(team["policies"]) if team else []
        self.obs_offsets = np.cumsum([0, *self.obs_dims]).tolist()
        self.act_offsets = np.cumsum([0, *self.act_dims]).tolist()
        self.critic_in = int(critic_obs_dim) + self.act_offsets[-1]
        self.members: List[Any] = []

    def bind(self, policies: Sequence[Any]) -> None:
        """The policy of each member (learner side: the target actions of MATD3/MASAC use them)."""
        self.members = list(policies)

    def q(self, critic: Any, x: torch.Tensor, actions: torch.Tensor, detach_params: bool = False) -> torch.Tensor:
        """Q1 and Q2 of a centralized twin ``critic`` at ``[x, A]``, float32[2, B]
        (``detach_params``: the critic's parameters enter as constants, the actor loss's way)."""
        q1, q2 = critic(torch.cat([x, actions], -1), detach_params)
        return torch.stack([q1.squeeze(-1), q2.squeeze(-1)])

    def with_own_action(self, actions: torch.Tensor, member: torch.Tensor, own: torch.Tensor) -> torch.Tensor:
        """``A`` float32[B, K] with each row's own slot (member ``member[b]``, k columns)
        replaced by ``own`` float32[B, k]; the gradient reaches ``own`` and nothing else."""
        k = own.shape[-1]
        cols = torch.as_tensor(self.act_offsets[:-1], device=own.device)[member][:, None] + torch.arange(k, device=own.device)
        return actions.detach().scatter(1, cols, own)

    def next_actions(self, next_x: torch.Tensor,
                     act: Callable[[Any, torch.Tensor], Tuple[torch.Tensor, torch.Tensor]]
                     ) -> Tuple[torch.Tensor, torch.Tensor]:
        """Every member's next action from its own policy on its own slice of ``next_x``:
        ``act(member policy, o'_j) -> (a'_j float32[B, k_j], log pi float32[B])``; returns
        ``(A' float32[B, K], log pi float32[B, N])``."""
        out = [act(pol, next_x[:, s:e]) for pol, s, e in zip(self.members, self.obs_offsets[:-1],
                                                              self.obs_offsets[1:], strict=True)]
        return torch.cat([a for a, _ in out], -1), torch.stack([lp for _, lp in out], -1)


def team_rows(policy_batches: Dict[str, sb.SampleBatch], team: Optional[Dict[str, Any]]) -> Dict[str, sb.SampleBatch]:
    """Each policy's rows with every team member's action and next observation at the row's env
    step (:data:`TEAM_ACTIONS`, :data:`TEAM_NEXT_OBS`, :data:`TEAM_MEMBER`:
    :func:`~flowkit_multiagent.centralized.join_team`; a step some member has no row in is
    dropped). ``team`` None: a team of one, the row's own columns, its observations as the
    critic's input. Inputs are not modified."""
    if not team:
        return {pid: sb.SampleBatch({**b, TEAM_ACTIONS: b[sb.ACTIONS], TEAM_NEXT_OBS: b[sb.NEXT_OBS],
                                     TEAM_MEMBER: np.zeros(len(b), np.int64), CRITIC_OBS: b[sb.OBS],
                                     NEXT_CRITIC_OBS: b[sb.NEXT_OBS]})
                for pid, b in policy_batches.items()}
    return join_team(policy_batches, team["agents"], team["agent_indexes"], team["n_agents"],
                     {TEAM_ACTIONS: (sb.ACTIONS, team["act_dims"]), TEAM_NEXT_OBS: (sb.NEXT_OBS, team["obs_dims"])})


# ---- MASAC ------------------------------------------------------------------------------------
class MASACPolicy(SACPolicy):
    """SAC's squashed Gaussian actor on the agent's own observation; the twin critic over the
    team's observations and actions (module docstring)."""

    train_columns: Tuple[str, ...] = (*OffPolicyActorCritic.train_columns, *TEAM_COLUMNS)

    def __init__(self, observation_space, action_space, config, model_config=None, device="cpu",
                 seed=0, inference_only=False):
        OffPolicyActorCritic.__init__(self, observation_space, action_space, config, model_config, device, seed,
                                      inference_only)
        self.team = Team(config.team, config.critic_input_dim or self.obs_dim, self.obs_dim, self.act_dim)
        self.model = SACModel(self.obs_dim, self.act_dim, self.model_config, config)
        self.model.critic = twin_critic(self.team.critic_in, 0, self.model_config)  # stays first
        te = config.target_entropy
        self.target_entropy = float(-self.act_dim if te is None else te)
        self.theta: Optional[torch.Tensor] = None
        self.sde_steps = 0
        self.finish_init(["critic"])

    def loss(self, batch: Dict[str, torch.Tensor]) -> Tuple[torch.Tensor, Dict[str, float]]:
        cfg, m, team = self.config, self.model, self.team
        x, member, actions = batch[CRITIC_OBS], batch[TEAM_MEMBER], batch[TEAM_ACTIONS].float()
        alpha = m.log_alpha.detach().exp()
        assert self.target is not None, "loss runs on the learner's policy"
        with torch.no_grad():
            def sample(pol, o):
                return squashed_gaussian(pol.model.actor(o), torch.randn(o.shape[0], pol.act_dim,
                                                                         generator=self.generator))
            a_next, logp_next = team.next_actions(batch[TEAM_NEXT_OBS], sample)
            own_logp_next = logp_next.gather(1, member[:, None]).squeeze(1)
            y = sac_targets(batch[sb.REWARDS].float(), batch[sb.TERMINATEDS], cfg.gamma,
                            team.q(self.target["critic"], batch[NEXT_CRITIC_OBS], a_next), own_logp_next, alpha)
        q = team.q(m.critic, x, actions)
        critic_loss = 0.5 * (q - y).pow(2).mean(-1).sum()
        a_pi, logp = squashed_gaussian(m.actor(batch[sb.OBS]), self.noise(x))
        q_pi = team.q(m.critic, x, team.with_own_action(actions, member, a_pi), detach_params=True)
        actor_loss = (alpha * logp - q_pi.min(0).values).mean()
        alpha_loss = -(m.log_alpha * (logp.detach() + self.target_entropy)).mean()
        loss = critic_loss + actor_loss + (alpha_loss if cfg.tune_alpha else 0.0)
        return loss, loss_stats(critic_loss=critic_loss, actor_loss=actor_loss, alpha_loss=alpha_loss, alpha=alpha,
                                mean_q=q.mean(), entropy=-logp.mean())


# ---- MATD3 (MADDPG with TD3's twin critics) -----------------------------------------------------
class MATD3Policy(TD3Policy):
    """TD3's deterministic actor on the agent's own observation; the twin critic over the team's
    observations and actions (module docstring)."""

    train_columns: Tuple[str, ...] = (*OffPolicyActorCritic.train_columns, *TEAM_COLUMNS)

    def __init__(self, observation_space, action_space, config, model_config=None, device="cpu",
                 seed=0, inference_only=False):
        OffPolicyActorCritic.__init__(self, observation_space, action_space, config, model_config, device, seed,
                                      inference_only)
        self.team = Team(config.team, config.critic_input_dim or self.obs_dim, self.obs_dim, self.act_dim)
        self.model = TD3Model(self.obs_dim, self.act_dim, self.model_config)
        self.model.critic = twin_critic(self.team.critic_in, 0, self.model_config)  # stays first
        self.finish_init(["critic", "actor"], segments=[["critic"], ["actor"]])

    def loss(self, batch: Dict[str, torch.Tensor]) -> Tuple[torch.Tensor, Dict[str, float]]:
        cfg, m, team = self.config, self.model, self.team
        x, member, actions = batch[CRITIC_OBS], batch[TEAM_MEMBER], batch[TEAM_ACTIONS].float()
        assert self.target is not None, "loss runs on the learner's policy"
        with torch.no_grad():
            def target_action(pol, o):
                eps = cfg.target_policy_noise * torch.randn(o.shape[0], pol.act_dim, generator=self.generator)
                a = smoothed_target_action(torch.tanh(pol.target["actor"](o)), eps, cfg.target_noise_clip)
                return a, torch.zeros(o.shape[0])
            a_next, _ = team.next_actions(batch[TEAM_NEXT_OBS], target_action)
            y = td3_targets(batch[sb.REWARDS].float(), batch[sb.TERMINATEDS], cfg.gamma,
                            team.q(self.target["critic"], batch[NEXT_CRITIC_OBS], a_next))
        q = team.q(m.critic, x, actions)
        critic_loss = (q - y).pow(2).mean(-1).sum()
        policy_step = (self.num_updates + 1) % cfg.policy_delay == 0  # gradient step num_updates + 1
        assert self.optimizer is not None
        self.optimizer.active = None if policy_step else [0]
        if not policy_step:
            return critic_loss, loss_stats(critic_loss=critic_loss, mean_q=q.mean())
        own = torch.tanh(m.actor(batch[sb.OBS]))
        actor_loss = -team.q(m.critic, x, team.with_own_action(actions, member, own), True)[0].mean()
        return critic_loss + actor_loss, loss_stats(critic_loss=critic_loss, mean_q=q.mean(), actor_loss=actor_loss)


# ---- the algorithms: SAC's and TD3's replay plan after the team join ------------------------------
class TeamCritic(OffPolicyAlgorithm):
    """The plan of MASAC and MATD3: bind each policy's team to the learner's policies, then the
    base algorithm's replay plan over the joined rows (:func:`team_rows`):
    ``rollouts -> JoinTeam -> StoreToReplayBuffer ...``."""

    def training_flow(self, experiences, ctx, learner, mix=None):
        pols = learner.policies
        team = next(iter(pols.values())).config.team if pols else None
        for pol in pols.values():
            missing = [p for p in pol.team.policy_ids if p not in pols]
            if missing:
                raise ConfigError(f"{self.name}: the team's policies {missing} are not trained in group "
                                  f"{learner.name!r} (give them the same algorithm and no per-policy overrides)")
            pol.team.bind([pols[p] for p in pol.team.policy_ids] or [pol])
        joined = experiences.for_each(lambda b: with_policy_batches(b, lambda pbs: team_rows(pbs, team)),
                                      f"JoinTeam({', '.join(team['agents']) if team else 'own agent'})")
        return super().training_flow(joined, ctx, learner, mix)


class MASAC(TeamCritic, SAC, ref=MASAC_REF):
    """MASAC: SAC's replay plan over the team-joined rows (``flowkit plan algo=masac``)."""

    policy_class = MASACPolicy


class MATD3(TeamCritic, TD3, ref=MATD3_REF):
    """MATD3: TD3's replay plan over the team-joined rows (``flowkit plan algo=matd3``)."""

    policy_class = MATD3Policy
