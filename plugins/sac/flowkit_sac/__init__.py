"""flowkit-sac: SAC and TD3, off-policy actor-critics for Box actions (entry point group
``flowkit``).

This module is the plugin's torch-free declaration (the config sections, their check and the
algorithms' :class:`flowkit.AlgorithmRef`); the algorithms (torch) are in :mod:`flowkit_sac.sac`
and :mod:`flowkit_sac.td3`, imported when a run uses them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Optional

import flowkit
from flowkit.config import MAX_BATCH_ROWS, F, config_checks


@dataclass
class _ActorCriticConfig:
    """Keys of the twin-critic actor-critic losses (SAC, TD3; also the offline ``cql_sac``)."""
    lr: float = F(1e-3, "Adam learning rate (every network; SAC's temperature too)", gt=0)
    gamma: float = F(0.99, "discount factor", ge=0, le=1)
    tau: float = F(0.005, "Polyak averaging: target <- (1 - tau) * target + tau * online", gt=0, le=1)
    train_batch_size: int = F(256, "replayed transitions per gradient step", gt=0, le=MAX_BATCH_ROWS)
    max_grad_norm: Optional[float] = F(None, "clip the global gradient norm (null: off)", gt=0)


@dataclass
class _OffPolicyConfig(_ActorCriticConfig):
    """Keys shared by SAC and TD3 (twin critics, Polyak targets, replay)."""
    buffer_size: int = F(1_000_000, "replay capacity in transitions (per policy)", gt=0)
    learning_starts: int = F(100, "env steps sampled before the first gradient step; until the first trained "
                                  "weights reach a worker it acts uniformly at random", ge=0)
    training_intensity: Optional[float] = F(None, "transitions trained per transition sampled (null: one "
                                                  "gradient step per env step, i.e. train_batch_size)", gt=0)

    def validate(self, run_config: Any, n: str) -> List[str]:
        """A train batch fits in the buffer."""
        tb, size = self.train_batch_size, self.buffer_size
        return config_checks([(tb > size, f"{n}.train_batch_size={tb} is larger than {n}.buffer_size={size}")])


@dataclass
class SACLossConfig(_ActorCriticConfig):
    """SAC's networks, temperature and loss, without the replay keys: what :class:`SACConfig` and
    variants that learn from elsewhere (``cql_sac``, from a dataset) share."""
    initial_alpha: float = F(1.0, "entropy coefficient alpha at the start", gt=0)
    tune_alpha: bool = F(True, "learn alpha so the policy's entropy tracks target_entropy (else alpha stays fixed)")
    target_entropy: Optional[float] = F(None, "target entropy in nats (null: -dim(A))")
    target_update_freq: int = F(1, "gradient steps between two Polyak updates of the target critics", gt=0)
    use_sde: bool = F(False, "generalized state-dependent exploration (gSDE, Raffin et al. 2021): acting noise "
                             "z(s) . theta, theta redrawn every sde_sample_freq env steps")
    sde_sample_freq: int = F(-1, "gSDE: acting steps between two draws of theta per sub-env (-1: when new "
                                 "weights arrive, i.e. each sampled round)", ge=-1)
    log_std_init: float = F(-3.0, "gSDE: initial log of the std of theta's entries")
    use_expln: bool = F(False, "gSDE: std of theta's entries by expln(log_std) (exp below 0, log1p(x) + 1 above) "
                        "in place of exp (SB3's use_expln)")
    learn_features: bool = F(False, "gSDE: the actor loss trains the last hidden layer through the std too "
                             "(SB3's learn_features; false: detached there)")
    clip_mean: float = F(2.0, "gSDE: clip the pre-tanh mean to [-clip_mean, clip_mean] (SB3's clip_mean, "
                         "against numerical instability; 0: no clip)", ge=0)


@dataclass
class SACConfig(SACLossConfig, _OffPolicyConfig):
    """sac: Soft Actor-Critic with automatic entropy tuning (Box actions)."""


@dataclass
class TD3Config(_OffPolicyConfig):
    """td3: Twin Delayed DDPG (Box actions)."""
    policy_delay: int = F(2, "critic updates per actor and target update", gt=0)
    target_policy_noise: float = F(0.2, "std of the Gaussian noise on the target action (action units, [-1, 1])",
                                   ge=0)
    target_noise_clip: float = F(0.5, "clip of that noise", ge=0)
    exploration_noise: float = F(0.1, "std of the Gaussian noise on the acting action (action units, [-1, 1])",
                                 ge=0)


# Box actions with finite bounds (the bounds checked at set-up: OffPolicyAlgorithm.check_spaces)
SAC_REF = flowkit.AlgorithmRef("sac", SACConfig, "flowkit_sac.sac:SAC", ("Box",), learner_group=True, normalize_obs=True)
TD3_REF = flowkit.AlgorithmRef("td3", TD3Config, "flowkit_sac.td3:TD3", ("Box",), normalize_obs=True)


@flowkit.hookimpl
def flowkit_add_algorithms():
    return [SAC_REF, TD3_REF]
