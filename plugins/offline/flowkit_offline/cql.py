"""Discrete CQL (Kumar et al. 2020, "Conservative Q-Learning for Offline Reinforcement
Learning", NeurIPS 2020, arXiv 2006.04779): CQL(H) on DQN's Q-network and TD loss, learning
from a dataset (``algo=cql_dqn input.dataset=PATH``). Discrete actions.

Math, top to bottom (the TD part is :meth:`flowkit_dqn.DQNPolicy.loss`):
    n-step returns inside each dataset episode (DQN's postprocess, once when it is read);
    TD target (double-Q by default):  y = R_t + gamma^m (1 - terminated_t) Q_target(s', a*)
    td_loss  = mean huber(Q(s_t, a_t) - y)
    The conservative term, CQL(H) (eq. 4, with the maximum-entropy regulariser R(mu) = H(mu),
    whose solution makes the pushed-down term a log-sum-exp; the discrete form of appendix F):
        cql_loss = mean_t [ logsumexp_a Q(s_t, a) - Q(s_t, a_t) ]
    loss = td_loss + cql_alpha * cql_loss
    It pushes Q down on every action and back up on the dataset's actions: the greedy policy
    stays on actions the data supports.

Plan: DatasetReader -> TrainOneStep -> UpdateTargetNetwork(every target_network_update_freq
gradient steps). Acting: greedy in Q (evaluation), epsilon-greedy when sampling.
"""
from __future__ import annotations

from typing import Dict, List, Tuple

import torch
from flowkit_dqn import DQN, DQNPolicy

import flowkit
from flowkit.core import batch as sb
from flowkit.core import to_tensor
from flowkit.core.ops import TrainOneStep, UpdateTargetNetwork
from flowkit_offline import CQLDQNConfig, validate


class CQLDQNPolicy(DQNPolicy):
    """DQN's Q-network and TD loss plus the CQL(H) term (see the module docstring)."""

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

    def prepare_batch(self, batch):
        out = super().prepare_batch(batch)
        if sb.ACTION_MASK in batch:
            out[sb.ACTION_MASK] = to_tensor(batch[sb.ACTION_MASK], self.device)
        return out


class CQLDQN(flowkit.Algorithm):
    """CQL on DQN: DatasetReader (``input.dataset``) -> TrainOneStep -> UpdateTargetNetwork."""

    name = "cql_dqn"
    config_class: type = CQLDQNConfig
    policy_class, rollout_mode, off_policy = CQLDQNPolicy, "bulk_sync", True
    action_spaces = DQN.action_spaces

    @classmethod
    def validate_config(cls, run_config, section) -> List[str]:
        return validate(run_config, section, cls.name)

    def training_flow(self, experiences, ctx, learner):
        return (experiences.for_each(TrainOneStep(ctx, learner))
                .for_each(UpdateTargetNetwork(ctx, learner, int(self.config.target_network_update_freq))))
