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
from typing import Any, Dict, List, Optional

from flowkit_ppo import PPOConfig
from flowkit_sac import SACConfig, TD3Config

import flowkit
from flowkit.config import MAX_BATCH_ROWS, F, LRConfig, config_checks
from flowkit_multiagent.league import PFSP_WEIGHTINGS


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
                          "variance p(1-p), linear 1-p, uniform", choices=PFSP_WEIGHTINGS)
    self_play: float = F(0.35, "probability that the main policy plays itself in an episode", ge=0, le=1)
    win_rate_decay: float = F(0.99, "factor on the games, wins and draws counted against a member before each "
                                    "new game against it (AlphaStar's payoff decay; 1: plain counts)", gt=0, le=1)
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
class CriticInputKeys:
    """The centralized value input of an algorithm's critic (:mod:`flowkit_multiagent.centralized`):
    a section with these keys gets the ``critic_obs`` / ``next_critic_obs`` columns."""
    critic_input: str = F("auto", "the critic's input: state (the env's global state()), concat_obs (the team's "
                                  "observations), auto (state where the env declares a state_space, else concat_obs)",
                          choices=("auto", "state", "concat_obs"))
    critic_agent_id: bool = F(True, "append the one-hot agent id to the critic's input (agent-specific global state)")
    critic_input_dim: Optional[int] = F(None, "width of the critic's input: filled in at set-up from the env "
                                              "(leave unset; a value given must match)", ge=1)


@dataclass
class TeamKeys:
    """A section whose policies learn from their team: :func:`flowkit_multiagent.specs.assign_teams` fills ``team``."""
    team: Optional[Dict[str, Any]] = F(None, "set up by the multiagent plugin, not by hand: the team whose actions "
                                             "the critic sees or whose Q-values the mixer joins (agents, their "
                                             "policies and indexes, observation and action sizes)")


@dataclass
class MAPPOConfig(CriticInputKeys, PPOConfig):
    """mappo: Multi-Agent PPO (Yu et al. 2022): PPO whose critic sees a centralized value input, actors their own observation."""


@dataclass
class MASACConfig(TeamKeys, CriticInputKeys, SACConfig):
    """masac: multi-agent SAC, per-agent squashed Gaussian actors on their own observation and a
    centralized twin critic Q(centralized value input, every team agent's action) (Box actions)."""


@dataclass
class MATD3Config(TeamKeys, CriticInputKeys, TD3Config):
    """matd3: MADDPG with TD3's twin critics, delayed actor updates and target smoothing (MATD3):
    per-agent deterministic actors on their own observation and a centralized twin critic (Box
    actions)."""


@dataclass
class VDNConfig(TeamKeys, LRConfig):
    """vdn: Value-Decomposition Networks (Sunehag et al. 2018): a team's recurrent agent Q-networks, their sum trained on the team reward."""
    ROWS = "team sequences"  # what a replay row is (in messages)
    lr: float = F(5e-4, "Adam learning rate", gt=0)
    adam_eps: float = F(1e-8, "Adam epsilon", gt=0)
    gamma: float = F(0.99, "discount factor", ge=0, le=1)
    double_q: bool = F(True, "double-Q target: each agent's argmax by the online network at the next step, valued "
                             "by the target network")
    dueling: bool = F(False, "dueling heads in the agent network: Q = V + A - mean(A)")
    seq_len: int = F(100, "env steps per stored team sequence (the episode limit: whole episodes, zero-padded; "
                          "longer episodes are cut into sequences that start from the stored recurrent state)",
                     gt=0, le=100_000)
    team_reward: str = F("sum", "the team reward: the sum (EPyMARL's) or the mean of the agents' rewards",
                         choices=("sum", "mean"))
    standardise_rewards: bool = F(False, "learn from (r - mean) / std of the team rewards, running statistics over "
                                         "the replayed real steps (EPyMARL's standardise_rewards)")
    train_batch_size: int = F(32, "replayed team sequences per gradient step", gt=0, le=MAX_BATCH_ROWS)
    buffer_size: int = F(5_000, "replay capacity in team sequences (per policy)", gt=0)
    learning_starts: int = F(1_000, "env steps sampled before the first gradient step", ge=0)
    training_intensity: Optional[float] = F(None, "sequence steps replayed (padding included) per env step sampled "
                                                  "(null: one gradient step per sampling round)", gt=0)
    target_network_update_freq: int = F(200, "gradient steps between target-network (agent network and mixer) "
                                              "updates", gt=0)
    weight_sync_freq: int = F(0, "gradient steps between weight broadcasts to the workers (0: after every step)",
                              ge=0)
    max_grad_norm: Optional[float] = F(10.0, "clip the gradient norm (null: off)", gt=0)
    initial_epsilon: float = F(1.0, "epsilon-greedy: epsilon at the start", ge=0, le=1)
    final_epsilon: float = F(0.05, "epsilon-greedy: epsilon after epsilon_timesteps", ge=0, le=1)
    epsilon_timesteps: int = F(50_000, "env steps sampled over which epsilon decays linearly", ge=0)

    def validate(self, run_config: Any, n: str) -> List[str]:
        """``train_batch_size <= buffer_size``."""
        tb, size = self.train_batch_size, self.buffer_size
        return config_checks([(tb > size, f"{n}.train_batch_size={tb} is larger than {n}.buffer_size={size}")])


@dataclass
class QMIXConfig(CriticInputKeys, VDNConfig):
    """qmix: QMIX (Rashid et al. 2018): a team's recurrent agent Q-networks under a monotonic mixing network of the global state, built by hypernetworks."""
    mixing_embed_dim: int = F(32, "units of the mixing network's hidden layer", gt=0)
    hypernet_layers: int = F(2, "layers of the hypernetworks that make the mixing weights", ge=1, le=2)
    hypernet_embed: int = F(64, "hidden units of two-layer hypernetworks", gt=0)
    critic_agent_id: bool = F(False, "must stay false: the mixer takes one global state per step, the same for "
                                     "every agent (no agent id in it)")

    def validate(self, run_config: Any, n: str) -> List[str]:
        """VDN's checks, and no agent id in the global state."""
        return super().validate(run_config, n) + config_checks([
            (self.critic_agent_id, f"{n}.critic_agent_id=true: the mixer takes one global state per step, the same "
                                   "for every agent of the team; leave it false")])


# the algorithms' declarations (read before torch loads; the classes take them: ``class MAPPO(PPO, ref=MAPPO_REF)``)
MAPPO_REF = flowkit.AlgorithmRef("mappo", MAPPOConfig, "flowkit_multiagent.mappo:MAPPO",
                                 normalize_obs="normalize_observations")
# continuous centralized critics (Box actions; bounds checked at set-up as SAC's and TD3's)
_CC_REFUSAL = "its centralized critic's team observations are not normalised"
MASAC_REF = flowkit.AlgorithmRef("masac", MASACConfig, "flowkit_multiagent.centralized_critics:MASAC", ("Box",),
                                 normalize_obs_refusal=_CC_REFUSAL)
MATD3_REF = flowkit.AlgorithmRef("matd3", MATD3Config, "flowkit_multiagent.centralized_critics:MATD3", ("Box",),
                                 normalize_obs_refusal=_CC_REFUSAL)
_VD_REFUSAL = "its replayed team sequences and stored recurrent states are not normalised"
VDN_REF = flowkit.AlgorithmRef("vdn", VDNConfig, "flowkit_multiagent.qmix:VDN", ("Discrete",), recurrent=True,
                               normalize_obs_refusal=_VD_REFUSAL)
QMIX_REF = flowkit.AlgorithmRef("qmix", QMIXConfig, "flowkit_multiagent.qmix:QMIX", ("Discrete",), recurrent=True,
                                normalize_obs_refusal=_VD_REFUSAL)
