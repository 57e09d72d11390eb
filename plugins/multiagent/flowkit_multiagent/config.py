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

from flowkit_ppo import PPOConfig

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
class LeagueConfig:
    """multiagent.league: a population of past snapshots, PFSP matchmaking and Elo ratings for a
    two-player game (see flowkit_multiagent.league)."""
    main: Optional[str] = F(None, "the main policy (trained); unset: no league")
    opponent: str = F("opponent", "the policy id whose seat the league fills: every mapping rule that targets "
                                  "it draws a member per episode; it stays a member (a fixed one)")
    snapshots: int = F(8, "past snapshots of the main policy kept (policies <main>@1..; the oldest replaced)",
                       ge=1, le=256)
    snapshot_interval: int = F(5, "iterations between two snapshots", ge=1)
    pfsp: str = F("hard", "matchmaking weight f(p) of an opponent beaten with probability p: hard (1-p)^2, "
                          "variance p(1-p), linear 1-p, uniform", choices=("hard", "variance", "linear", "uniform"))
    self_play: float = F(0.35, "probability that the main policy plays itself in an episode", ge=0, le=1)
    elo_k: float = F(16.0, "Elo K-factor (rating points per unit of surprise)", gt=0)
    elo_initial: float = F(1000.0, "Elo rating of every member at the start")


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
    league: LeagueConfig = F(help="a league of snapshots with PFSP matchmaking and Elo ratings (league.main "
                                  "names the main policy)", factory=LeagueConfig)
    share_parameters: bool = F(True, "without policies and mapping: true, every agent shares one policy "
                                     "`shared`; false, each agent gets a policy of its own (id = agent id)")
    obs_agent_id: bool = F(False, "append the one-hot agent id to the observation of every policy that several "
                                  "agents share (its space becomes Dict(..., agent_id=Discrete(n agents)))")


@dataclass
class MAPPOConfig(PPOConfig):
    """mappo: Multi-Agent PPO (Yu et al. 2022): PPO whose critic sees a centralized value input, actors their own observation."""
    critic_input: str = F("auto", "the critic's input: state (the env's global state()), concat_obs (the team's "
                                  "observations), auto (state where the env declares a state_space, else concat_obs)",
                          choices=("auto", "state", "concat_obs"))
    critic_agent_id: bool = F(True, "append the one-hot agent id to the critic's input (agent-specific global state)")
    critic_input_dim: Optional[int] = F(None, "width of the critic's input: filled in at set-up from the env "
                                              "(leave unset; a value given must match)", ge=1)
