"""The ``multiagent.*`` config section.

Example (simple_tag: PPO for the adversaries, DQN for the prey)::

    env.factory=mpe2.simple_tag_v3:parallel_env
    multiagent.policies.adversaries.algo=ppo
    multiagent.policies.prey.algo=dqn
    multiagent.policies.prey.config.lr=1e-3          # overrides dqn.lr for this policy only
    multiagent.mapping.adversary_*=adversaries       # agent-id glob -> policy id
    multiagent.mapping.agent_*=prey
    # opponent sampling: in half of the episodes (drawn per episode) the adversaries act at random
    multiagent.policies.random_adversaries.algo=random
    multiagent.mapping.adversary_*={adversaries: 1, random_adversaries: 1}
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Optional

from flowkit_sac import SACConfig, TD3Config

from flowkit.config import F


@dataclass
class PolicyConfig:
    """One policy of a multi-agent run."""
    algo: Optional[str] = F(None, "algorithm that trains this policy (default: `algo`); `random` learns nothing")
    config: Dict[str, Any] = F(help="overrides of that algorithm's section for this policy only "
                                    "(`multiagent.policies.<id>.config.lr=1e-4`)", factory=dict)
    model: Dict[str, Any] = F(help="overrides of model.* for this policy only (`multiagent.policies.<id>.model."
                                   "class=my_pkg.nets:Net`, `...model.hidden_sizes=[32]`)", factory=dict)
    trainable: bool = F(True, "false: the policy acts but is never updated (a frozen opponent)")
    checkpoint: Optional[str] = F(None, "load this policy's weights from a run folder / checkpoint "
                                        "(the policy of the same id, or its only policy)")
    checkpoint_policy: Optional[str] = F(None, "policy id to take from `checkpoint` (default: same id, or its only one)")


@dataclass
class MultiAgentConfig:
    """multiagent: PettingZoo games, agents mapped to policies, one algorithm per policy."""
    policies: Dict[str, PolicyConfig] = F(help="policy id -> its algorithm, config overrides, trainable, "
                                               "checkpoint (empty: every agent shares one policy `shared` "
                                               "trained by `algo`)", factory=dict)
    mapping: Dict[str, Any] = F(help="agent-id glob pattern -> policy id, or {policy id: weight} drawn once "
                                     "per episode (opponent sampling; evaluation uses the first); exact ids "
                                     "first, then patterns in the order given (empty: an agent whose id is a "
                                     "policy id maps to it, else the only policy)", factory=dict)
    round_robin_weights: Dict[str, float] = F(help="train steps per round-robin cycle of each algorithm's "
                                                   "fragment, keyed by algorithm name or policy id (default 1)",
                                              factory=dict, gt=0)
    eval_opponents: Dict[str, str] = F(help="policy id -> fixed opponent in evaluation: `random` or a "
                                            "checkpoint path", factory=dict)
    eval_alternate_seats: bool = F(False, "rotate the seats (agent -> policy) every evaluation episode")
    alternate_seats: bool = F(False, "training: rotate the agent -> policy assignment every episode "
                                     "(turn-based games: each policy plays every seat; agents must share spaces)")



# ---- continuous centralized critics (flowkit_multiagent.centralized_critics) ------------------------
_TEAM_HELP = ("set by the multiagent plugin at set-up, not by hand: the team the centralized critic sees (its "
              "agents in possible_agents order, each agent's policy, encoded observation and action sizes); "
              "null: a team of one (the policy's own agent)")


@dataclass
class MASACConfig(SACConfig):
    """masac: multi-agent SAC, per-agent squashed Gaussian actors on their own observation and a
    centralized twin critic Q(all agents' observations, all agents' actions) (Box actions)."""
    team: Optional[Dict[str, Any]] = F(None, _TEAM_HELP)


@dataclass
class MATD3Config(TD3Config):
    """matd3: MADDPG with TD3's twin critics, delayed actor updates and target smoothing (MATD3):
    per-agent deterministic actors on their own observation and a centralized twin critic (Box
    actions)."""
    team: Optional[Dict[str, Any]] = F(None, _TEAM_HELP)
