"""flowkit-ppo: the PPO algorithm plugin (entry point group ``flowkit``).

This module is the plugin's torch-free metadata (its config section and its registration,
what ``flowkit train --help`` and ``flowkit plugins`` read); the algorithm and its policy
(torch) are imported from :mod:`flowkit_ppo.ppo` on first use.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, List, Optional

import flowkit
from flowkit.config import MAX_BATCH_ROWS, ConfigError, F, check_schedules
from flowkit.hooks import lazy_attrs

if TYPE_CHECKING:
    from flowkit_ppo.ppo import PPO, PPOPolicy

__all__ = ["PPO", "PPOConfig", "PPOPolicy"]


@dataclass
class PPOConfig:
    """ppo: Proximal Policy Optimization (clipped surrogate, GAE)."""
    lr: float = F(3e-4, "Adam learning rate", gt=0)
    lr_schedule: str = F("constant", "constant, or linear (to 0 at schedule_env_steps)", choices=("constant", "linear"))
    gamma: float = F(0.99, "discount factor", ge=0, le=1)
    gae_lambda: float = F(0.95, "GAE lambda", ge=0, le=1)
    clip_param: float = F(0.2, "surrogate clip range epsilon", gt=0)
    clip_schedule: str = F("constant", "constant, or linear (to 0 at schedule_env_steps)", choices=("constant", "linear"))
    schedule_env_steps: Optional[int] = F(None, "horizon of linear schedules, env steps (default stop.env_steps)", gt=0)
    vf_clip_param: Optional[float] = F(None, "clip value updates to +-this around vf_preds (null: off)", gt=0)
    vf_coef: float = F(0.5, "value-loss coefficient", ge=0)
    ent_coef: float = F(0.0, "entropy bonus coefficient", ge=0)
    kl_coeff: float = F(0.0, "initial KL-penalty coefficient (0: no penalty, KL is only reported)", ge=0)
    kl_target: float = F(0.01, "target KL for the adaptive penalty", gt=0)
    num_epochs: int = F(10, "passes over each train batch", ge=1)
    minibatch_size: int = F(64, "rows per SGD minibatch", ge=1)
    train_batch_size: Optional[int] = F(None, "env steps per train batch (null: one sampling round)", ge=1, le=MAX_BATCH_ROWS)
    max_grad_norm: Optional[float] = F(0.5, "clip the gradient norm (null: off)", gt=0)
    normalize_advantages: str = F("minibatch", "advantage standardisation: per minibatch, per train batch "
                                  "or none", choices=("minibatch", "batch", "none"))
    normalize_observations: bool = F(False, "running mean/std observation normalisation")
    normalize_rewards: bool = F(False, "divide rewards by a running std of discounted returns (as SB3's "
                                "VecNormalize norm_reward; clipped to +-10, statistics saved in checkpoints)")
    log_std_init: float = F(0.0, "initial log-std of the Gaussian (Box actions; with use_sde: of each entry of "
                            "gSDE's exploration matrix)", ge=-20, le=20)
    use_sde: bool = F(False, "generalized state-dependent exploration (gSDE, Raffin et al. 2021; Box actions): "
                      "noise z(s) @ W from the policy's last hidden layer z(s), W held between draws")
    sde_sample_freq: int = F(-1, "env steps between two draws of gSDE's exploration matrices "
                             "(-1: once per rollout fragment, when new weights arrive)", ge=-1)
    use_expln: bool = F(False, "gSDE: std of the exploration matrix's entries by expln(log_std) (exp below 0, "
                        "log1p(x) + 1 above: grows slowly) in place of exp (SB3's use_expln)")
    learn_features: bool = F(False, "gSDE: the loss trains the policy's last hidden layer through the std too "
                             "(SB3's learn_features; false: the features are detached there)")
    adam_eps: float = F(1e-5, "Adam epsilon", gt=0)

    def validate(self, run_config: Any, n: str) -> List[str]:
        """The section's cross-field checks (each key's own range is
        declared in :class:`PPOConfig`), torch-free; ``n``: the algorithm's name."""
        s, warns = self, []
        if s.train_batch_size is not None:
            if s.minibatch_size > s.train_batch_size:
                raise ConfigError(f"{n}.minibatch_size={s.minibatch_size} is larger than "
                                  f"{n}.train_batch_size={s.train_batch_size}; make minibatch_size <= train_batch_size")
            rs = round_size(run_config)
            if s.train_batch_size % rs:
                actual = -(-s.train_batch_size // rs) * rs
                warns.append(f"{n}.train_batch_size={s.train_batch_size} is not a multiple of one sampling round "
                             f"(runtime.num_workers x num_envs_per_worker x rollout_fragment_length = {rs}); "
                             f"each train batch will hold {actual} env steps (reported as "
                             f"learner/<policy>/train_batch_size)")
        elif s.minibatch_size > (rs := round_size(run_config)):
            warns.append(f"{n}.minibatch_size={s.minibatch_size} is larger than one sampling round, the train batch "
                         f"when {n}.train_batch_size is null (runtime.num_workers x num_envs_per_worker x "
                         f"rollout_fragment_length = {rs}): each epoch is one step over the whole round")
        if s.sde_sample_freq == 0:
            raise ConfigError(f"{n}.sde_sample_freq=0: use -1 (one draw per rollout fragment) or a number of "
                              "env steps >= 1")
        check_schedules(s, n, ("lr_schedule", "clip_schedule"), run_config)
        return warns


def round_size(run_config: Any) -> int:
    """Env steps of one sampling round: num_workers x num_envs_per_worker x rollout_fragment_length."""
    rt = run_config.runtime
    return max(1, int(rt.num_workers)) * int(rt.num_envs_per_worker) * int(rt.rollout_fragment_length)


@flowkit.hookimpl
def flowkit_add_algorithms():
    return [flowkit.AlgorithmRef("ppo", PPOConfig, "flowkit_ppo.ppo:PPO", recurrent=True)]


__getattr__ = lazy_attrs(dict.fromkeys(__all__, "flowkit_ppo.ppo"))
