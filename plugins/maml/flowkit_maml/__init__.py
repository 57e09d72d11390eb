"""flowkit-maml: the MAML algorithm plugin (entry point group ``flowkit``).

This module is the plugin's torch-free declaration (the config section, its check and the
algorithm's :class:`flowkit.AlgorithmRef`); the algorithm and its policy (torch) are in
:mod:`flowkit_maml.maml`, imported when a run uses them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Optional

import flowkit
from flowkit.config import F, config_checks


@dataclass
class MAMLConfig:
    """maml: Model-Agnostic Meta-Learning (Finn et al. 2017): inner steps on the workers, a PPO-style meta-update."""
    inner_steps: int = F(1, "inner adaptation steps per task: each samples the task with the policy adapted so "
                            "far, then takes one policy-gradient step (lr inner_lr) on what it sampled", ge=1, le=20)
    inner_lr: float = F(0.1, "step size alpha of the inner steps: theta' = theta - alpha grad L_inner(theta)", gt=0)
    first_order: bool = F(False, "first-order MAML: the meta-gradient treats the inner gradients as constants "
                                 "(no second derivatives through the inner steps)")
    tasks_per_worker: int = F(1, "tasks each worker adapts to per meta step (RLlib: 1); the meta-batch holds "
                                 "runtime.num_workers x tasks_per_worker tasks", ge=1)
    outer_steps: int = F(5, "Adam steps on each meta-batch (RLlib's maml_optimizer_steps); the first is exactly "
                            "on-policy, the ratio of the clipped surrogate corrects the later ones", ge=1)
    lr: float = F(1e-3, "Adam learning rate of the meta-update", gt=0)
    adam_eps: float = F(1e-8, "Adam epsilon", gt=0)
    gamma: float = F(0.99, "discount factor", ge=0, le=1)
    gae_lambda: float = F(1.0, "GAE lambda of the advantages of every adaptation step (RLlib's 1.0)", ge=0, le=1)
    baseline: str = F("value", "the baseline of every adaptation step's advantages: value (the value network, "
                               "as RLlib) or linear (the MAML paper's: a linear fit of the returns on obs, obs^2 and "
                               "t, t^2, t^3, per task and adaptation step, as rllab's LinearFeatureBaseline)",
                      choices=("value", "linear"))
    clip_param: float = F(0.3, "clip range epsilon of the outer (post-adaptation) surrogate", gt=0)
    vf_coef: float = F(0.5, "value-loss coefficient (the value network learns from post-adaptation rows)", ge=0)
    ent_coef: float = F(0.0, "entropy bonus coefficient of the outer loss", ge=0)
    kl_coeff: float = F(0.0005, "KL penalty of the outer loss: KL(sampling policy || adapted policy) on the "
                                "post-adaptation rows (0: reported only)", ge=0)
    max_grad_norm: Optional[float] = F(None, "clip the meta-gradient's global norm (null: off)", gt=0)
    log_std_init: float = F(0.0, "initial log-std of the Gaussian (Box actions)", ge=-20, le=20)

    def validate(self, run_config: Any, n: str) -> List[str]:
        """The env's sub-envs can be given tasks (not the env's own vectorized implementation)."""
        env = run_config.env
        return config_checks([(env.vectorization != "sync" and _native_vector(env), f"env.vectorization="
                               f"{env.vectorization!r}: {env.id} has a vectorized implementation, whose sub-envs {n} "
                               "cannot set tasks on; set env.vectorization=sync")])


def _native_vector(env: Any) -> bool:
    """Whether ``env.id`` (a Gymnasium id, not a factory) registers a vectorized implementation."""
    if not env.id or env.factory:
        return False
    import gymnasium as gym
    try:
        return bool(gym.spec(env.id).vector_entry_point)
    except Exception:
        return False


MAML_REF = flowkit.AlgorithmRef("maml", MAMLConfig, "flowkit_maml.maml:MAML", normalize_obs=True)


@flowkit.hookimpl
def flowkit_add_algorithms():
    return [MAML_REF]
