"""Conservative Q-learning (Kumar et al. 2020, "Conservative Q-Learning for Offline
Reinforcement Learning", NeurIPS 2020, arXiv 2006.04779), CQL(H), learning from a dataset
(``input.dataset=PATH``): on DQN's Q-network and TD loss for Discrete actions (``cql_dqn``),
on SAC's squashed-Gaussian actor, twin critics and temperature for Box actions (``cql_sac``).
The TD and actor parts are the base algorithms' own losses (:meth:`flowkit_dqn.dqn.DQNPolicy.loss`,
:meth:`flowkit_sac.sac.SACPolicy.loss`); this module adds the conservative term.

CQL(H) (eq. 4, with the maximum-entropy regulariser R(mu) = H(mu), whose solution makes the
pushed-down term a log-sum-exp over actions), per Q-function:
    gap = mean_t [ log sum_a exp Q(s_t, a) - Q(s_t, a_t) ]        (a_t: the dataset's action)
    loss = base_loss + cql_alpha * gap
It pushes Q down on every action and back up on the dataset's actions: the greedy (or actor's)
action stays where the data supports it.

``cql_dqn`` (Discrete; the form of appendix F): the log-sum-exp is exact over the actions
(illegal ones of an action mask left out); n-step, double-Q TD target of DQN; target network
copied every ``target_network_update_freq`` gradient steps.

``cql_sac`` (Box, actions in [-1, 1]^k): the integral log int exp Q(s, a) da is estimated by
importance sampling (appendix F; the authors' code) from N = ``num_actions`` draws of each of
three proposals, uniform U = U[-1, 1]^k (density 2^-k), pi(.|s_t) and pi(.|s_{t+1}) (actions
and log-densities as constants), each Q(s_t, .) of every twin critic j:
    lse_j(s) = T logsumexp_{i=1..3N} ( (Q_j(s, a_i) - log mu_i(a_i)) / T )
    gap_j = mean_t [ lse_j(s_t) - Q_j(s_t, a_t) ]
    cql_loss = sum_j cql_alpha * gap_j            (added to SAC's critic, actor and temperature losses)
(as in the authors' code, without the constant -log 3N of a mean: a shift of every gap by
log 3N, no change to the gradients). With ``lagrangian`` (CQL-Lagrange, eq. 30) the weight is a
learned alpha' = exp(log alpha') >= 0, starting at ``cql_alpha``:
    cql_loss = sum_j alpha' (gap_j - tau),   lagrange_loss = -alpha' mean_j (gap_j - tau)
(alpha' a constant in the first, the gaps in the second; tau = ``target_action_gap``): alpha'
grows while the gaps exceed tau.

The rest is SAC's (twin critics, squashed-Gaussian actor, temperature tuned to the target
entropy), with two options of the paper's and the authors' code:
    Bellman target, a' ~ pi(.|s_{t+1}): SAC's soft target (``backup_entropy``, the default)
        y = r + gamma (1 - terminated) (min_j Q_targ_j(s', a') - alpha log pi(a'|s')),
    or with ``backup_entropy=false`` the paper's (eq. 3, policy evaluation; the authors'
    ``deterministic_backup``, their default, and CORL's ``backup_entropy=False``)
        y = r + gamma (1 - terminated) min_j Q_targ_j(s', a').
    With the soft target, a narrow dataset (a greedy expert's actions) that keeps the policy's
    entropy below the target drives the learned temperature up and every Q down by about
    alpha (-entropy) / (1 - gamma) (docs/offline.md has what each measured).
    Critic loss J_Q = sum_j 0.5 mean (Q_j(s_t, a_t) - y)^2 (SAC's; the authors' MSE is twice it,
    so their min_q_weight w is cql_alpha = w / 2 here).
    Actor: for the first ``bc_steps`` gradient steps behavioural cloning (the authors'
    ``policy_eval_start``): J_pi = mean (alpha log pi(a~|s_t) + sum_d sg(sigma_d^2) NLL_d), then
    SAC's J_pi = mean (alpha log pi(a~|s_t) - min_j Q_j(s_t, a~)); NLL_d = 0.5 ((u_d - mu_d) /
    sigma_d)^2 + log sigma_d + 0.5 log 2 pi of u = atanh(a_t) (a_t clipped to +-(1 - 1e-6)), sg a
    constant: beta-NLL (Seitzer et al. 2022, beta = 1) in place of the authors' log pi(a_t|s_t),
    whose learned std lets badly fitted rows stop pulling the mean (docs/offline.md: 10x the
    squared error after 2,000 steps on a greedy Pendulum expert's data). The first SAC step
    starts the actor's Adam afresh (moments zero, step count 0): the warm start's second
    moment, small once the actions fit, would make the first steps of the new loss several
    times ``actor_lr`` per weight, all one way, and undo the fit within a few steps. The warm
    start may take its own learning rate (``bc_lr``): a fast fit, then a slow actor that
    follows critics still far from their fixed point (docs/offline.md, greedy expert data).
The actor has its own learning rate (``actor_lr``: one Adam over SAC's flat buffer, split
into critic, actor and temperature segments). Polyak targets every ``target_update_freq``
gradient steps.

Plans: DatasetReader -> TrainOneStep -> UpdateTargetNetwork. Acting: greedy in Q (``cql_dqn``),
tanh of the actor's mean (``cql_sac``) in evaluation.
"""
from __future__ import annotations

import math
from typing import Any, Dict, Sequence, Tuple

import torch
from flowkit_dqn.dqn import DQNPolicy
from flowkit_sac.sac import LOG_STD_MAX, LOG_STD_MIN, SAC, SACPolicy, sac_targets, squashed_gaussian
from torch import nn

import flowkit
from flowkit.core import batch as sb
from flowkit.core import loss_stats
from flowkit.core.ops import TrainOneStep, UpdateTargetNetwork
from flowkit_offline import CQL_DQN_REF, CQL_SAC_REF


class CQLDQNPolicy(DQNPolicy):
    """DQN's Q-network and TD loss plus the CQL(H) term (see the module docstring)."""

    train_columns: Tuple[str, ...] = (*DQNPolicy.train_columns, sb.ACTION_MASK)  # the mask keeps illegal actions out of the log-sum-exp

    def loss(self, batch: Dict[str, torch.Tensor]) -> Tuple[torch.Tensor, Dict[str, float]]:
        td_loss, st = super().loss(batch)
        q = self.model(batch[sb.OBS])
        mask = batch.get(sb.ACTION_MASK)
        if mask is not None:  # illegal actions leave the log-sum-exp
            q = q.masked_fill(mask == 0, float("-inf"))
        q_taken = q.gather(-1, batch[sb.ACTIONS].long().unsqueeze(-1)).squeeze(-1)
        cql_loss = (torch.logsumexp(q, -1) - q_taken).mean()
        loss = td_loss + float(self.config.cql_alpha) * cql_loss
        st.update(td_loss=st.pop("loss"), cql_loss=float(cql_loss.detach()), loss=float(loss.detach()))
        return loss, st



class CQLDQN(flowkit.Algorithm, ref=CQL_DQN_REF):
    """CQL on DQN: DatasetReader (``input.dataset``) -> TrainOneStep -> UpdateTargetNetwork."""

    policy_class, off_policy = CQLDQNPolicy, True

    def training_flow(self, experiences, ctx, learner):
        return (experiences.for_each(TrainOneStep(ctx, learner))
                .for_each(UpdateTargetNetwork(ctx, learner, int(self.config.target_network_update_freq))))


def cql_gap(q_data: torch.Tensor, q_sampled: torch.Tensor, log_mu: torch.Tensor, temperature: float = 1.0
            ) -> torch.Tensor:
    """CQL(H)'s gap per Q-function, the log-sum-exp estimated by importance sampling (module
    docstring): ``mean_t [T logsumexp_i((Q(s_t, a_i) - log mu(a_i)) / T) - Q(s_t, a_t)]``.

    Args:
        q_data: float32[J, B], each Q-function at the dataset's (s_t, a_t).
        q_sampled: float32[J, B, M], at M sampled actions per state.
        log_mu: float32[B, M], the log-density of each sampled action under its proposal.
        temperature: T.
    Returns:
        float32[J].
    """
    lse = temperature * torch.logsumexp((q_sampled - log_mu) / temperature, -1)
    return (lse - q_data).mean(-1)


class CQLSACPolicy(SACPolicy):
    """SAC's actor, twin critics and temperature (its :meth:`~flowkit_sac.sac.SACPolicy.loss`) plus
    the CQL(H) term with the importance-sampled log-sum-exp (module docstring); with
    ``lagrangian``, the learned weight ``model.lagrange.log_alpha_prime``."""

    def finish_init(self, target_modules: Sequence[str], segments: Sequence[Sequence[str]] = ()) -> None:
        cfg = self.config
        # after SAC's critic, actor and temperature: the Lagrange multiplier (kept, frozen, without lagrangian)
        self.model.lagrange = nn.ParameterDict({"log_alpha_prime": nn.Parameter(
            torch.tensor(math.log(max(float(cfg.cql_alpha), 1e-8))), requires_grad=bool(cfg.lagrangian))})
        super().finish_init(target_modules, segments=[["critic"], ["actor"], ["temperature", "lagrange"]])
        if self.optimizer is None:  # (inference only)
            return
        if cfg.actor_lr is not None:  # the actor's segment of the one Adam
            self.optimizer.param_groups[1]["lr"] = float(cfg.actor_lr)
        self.actor_adam_restarted = False  # (bc_steps: at the switch to SAC's actor loss)

    @property
    def log_alpha_prime(self) -> torch.Tensor:
        """log alpha', the learned weight of ``lagrangian`` (a scalar parameter)."""
        lagrange: Any = self.model.lagrange
        return lagrange["log_alpha_prime"]

    @property
    def alpha_prime(self) -> float:
        """The conservative term's weight now (``cql_alpha``, or the learned alpha')."""
        return float(self.log_alpha_prime.detach().exp()) if self.config.lagrangian else float(self.config.cql_alpha)

    def sampled_actions(self, obs: torch.Tensor, next_obs: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """The 3N actions per state of the log-sum-exp and their proposals' log-densities, as
        constants: ``(float32[B, 3N, k] in [-1, 1], float32[B, 3N])``; per state N uniform, N from
        pi(.|s), N from pi(.|s')."""
        n, k, b = int(self.config.num_actions), self.act_dim, len(obs)
        with torch.no_grad():
            a_rand = (2.0 * torch.rand(b * n, k, generator=self.generator) - 1.0).to(self.device)
            obs_n, next_n = obs.repeat_interleave(n, 0), next_obs.repeat_interleave(n, 0)
            a_cur, logp_cur = squashed_gaussian(self.model.actor(obs_n), self.noise(obs_n))
            a_next, logp_next = squashed_gaussian(self.model.actor(next_n), self.noise(next_n))
            log_rand = torch.full_like(logp_cur, -k * math.log(2.0))
            a = torch.stack([a_rand.view(b, n, k), a_cur.view(b, n, k), a_next.view(b, n, k)], 1)
            log_mu = torch.stack([log_rand.view(b, n), logp_cur.view(b, n), logp_next.view(b, n)], 1)
        return a.reshape(b, 3 * n, k), log_mu.reshape(b, 3 * n)

    def bc_fit(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """How well the actor fits the dataset's actions, float32[B] (higher is better): minus
        the Gaussian's negative log-likelihood of u_t = atanh(a_t) per dimension, each weighted
        by its variance as a constant (beta-NLL with beta = 1, Seitzer et al. 2022, eq. 7);
        actions clipped to +-(1 - 1e-6) before atanh."""
        mean, log_std = self.model.actor(obs).chunk(2, -1)
        log_std = log_std.clamp(LOG_STD_MIN, LOG_STD_MAX)
        u = torch.atanh(actions.clamp(-1.0 + 1e-6, 1.0 - 1e-6))
        nll = 0.5 * ((u - mean) / log_std.exp()).pow(2) + log_std + 0.5 * math.log(2 * math.pi)
        return -((2.0 * log_std).exp().detach() * nll).sum(-1)

    def sac_terms(self, batch: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
        """SAC's losses (:meth:`flowkit_sac.SACPolicy.loss`) with the backup and the actor of
        CQL (module docstring): ``critic_loss``, ``actor_loss``, ``alpha_loss`` and ``q`` (the
        twin critics at the data, float32[2, B])."""
        cfg, m = self.config, self.model
        obs, next_obs = batch[sb.OBS], batch[sb.NEXT_OBS]
        alpha = m.log_alpha.detach().exp()
        with torch.no_grad():
            a_next, logp_next = squashed_gaussian(m.actor(next_obs), self.noise(next_obs))
            y = sac_targets(batch[sb.REWARDS].float(), batch[sb.TERMINATEDS], cfg.gamma,
                            self.q_values(next_obs, a_next, target=True), logp_next,
                            alpha if cfg.backup_entropy else torch.zeros(()))
        q = self.q_values(obs, batch[sb.ACTIONS].float())
        a_pi, logp = squashed_gaussian(m.actor(obs), self.noise(obs))
        if self.num_updates < int(cfg.bc_steps):  # behavioural cloning of the dataset's actions first
            fit = self.bc_fit(obs, batch[sb.ACTIONS].float())
        else:
            fit = self.q_values(obs, a_pi, detach_params=True).min(0).values
        return {"critic_loss": 0.5 * (q - y).pow(2).mean(-1).sum(), "actor_loss": (alpha * logp - fit).mean(),
                "alpha_loss": -(m.log_alpha * (logp.detach() + self.target_entropy)).mean(), "q": q,
                "alpha": alpha, "entropy": -logp.detach().mean()}

    def loss(self, batch: Dict[str, torch.Tensor]) -> Tuple[torch.Tensor, Dict[str, float]]:
        cfg, obs = self.config, batch[sb.OBS]
        if self.optimizer is not None and int(cfg.bc_steps) > 0:
            warm = self.num_updates < int(cfg.bc_steps)
            self.optimizer.param_groups[1]["lr"] = float(cfg.bc_lr if warm and cfg.bc_lr is not None else
                                                         cfg.actor_lr if cfg.actor_lr is not None else cfg.lr)
            if self.num_updates == int(cfg.bc_steps) and not self.actor_adam_restarted:
                self.optimizer.state.pop(1, None)  # the warm start's moments do not carry into SAC's actor loss
                self.actor_adam_restarted = True
        t = self.sac_terms(batch)
        loss = t["critic_loss"] + t["actor_loss"] + (t["alpha_loss"] if cfg.tune_alpha else 0.0)
        a, log_mu = self.sampled_actions(obs, batch[sb.NEXT_OBS])
        b, m = a.shape[:2]
        q_sampled = self.q_values(obs.repeat_interleave(m, 0), a.reshape(b * m, -1)).view(2, b, m)
        # Q at the data again (not t["q"]): the same gradients summed in the same order as SAC's loss plus this term
        gap = cql_gap(self.q_values(obs, batch[sb.ACTIONS].float()), q_sampled, log_mu, float(cfg.cql_temperature))
        if cfg.lagrangian:
            alpha_prime = self.log_alpha_prime.exp().clamp(max=1e6)
            cql_loss = (alpha_prime.detach() * (gap - cfg.target_action_gap)).sum()
            lagrange = {"lagrange_loss": -(alpha_prime * (gap.detach() - cfg.target_action_gap)).mean()}
        else:
            cql_loss, lagrange = float(cfg.cql_alpha) * gap.sum(), {}
        loss = loss + cql_loss + sum(lagrange.values())
        return loss, loss_stats(critic_loss=t["critic_loss"], actor_loss=t["actor_loss"], alpha_loss=t["alpha_loss"],
                                alpha=t["alpha"], mean_q=t["q"].mean(), entropy=t["entropy"], cql_loss=cql_loss,
                                cql_gap=gap.mean(), cql_q_sampled=q_sampled.mean(), cql_alpha=self.alpha_prime,
                                **lagrange)


class CQLSAC(SAC, ref=CQL_SAC_REF):
    """CQL on SAC: DatasetReader (``input.dataset``) -> TrainOneStep -> UpdateTargetNetwork
    (Polyak, every ``target_update_freq`` gradient steps)."""

    policy_class = CQLSACPolicy

    # (no `mix`, unlike SAC's: CQL learns from the dataset alone, it has no replay to mix into)
    def training_flow(self, experiences, ctx, learner):  # type: ignore[override]
        return (experiences.for_each(TrainOneStep(ctx, learner))
                .for_each(UpdateTargetNetwork(ctx, learner, self.target_update_freq())))
