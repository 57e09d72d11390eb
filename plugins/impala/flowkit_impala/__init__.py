"""flowkit-impala: the IMPALA and APPO algorithm plugin (entry point group ``flowkit``).

This module is the plugin's torch-free declaration (its config sections, their checks and the
algorithms' :class:`flowkit.AlgorithmRef`); the algorithms and their policies (torch) are in
:mod:`flowkit_impala.impala` and :mod:`flowkit_impala.appo`, imported when a run uses them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Optional

import flowkit
from flowkit.config import MAX_BATCH_ROWS, F, LRConfig, config_checks


@dataclass
class IMPALAConfig(LRConfig):
    """impala: asynchronous actor-learner with V-trace (Espeholt et al. 2018)."""
    lr: float = F(5e-4, "Adam learning rate", gt=0)
    adam_eps: float = F(1e-7, "Adam epsilon", gt=0)
    gamma: float = F(0.99, "discount factor", ge=0, le=1)
    clip_rho_threshold: float = F(1.0, "V-trace rho_bar: clip of the importance ratio in delta_t", gt=0)
    clip_c_threshold: float = F(1.0, "V-trace c_bar: clip of the trace-cutting ratio c_t", gt=0)
    clip_pg_rho_threshold: float = F(1.0, "clip of the importance ratio in the policy-gradient advantage", gt=0)
    vtrace_lambda: float = F(1.0, "lambda multiplying c_t (paper's remark 2; 1.0 = plain V-trace)", ge=0, le=1)
    vf_coef: float = F(0.5, "value-loss coefficient", ge=0)
    ent_coef: float = F(0.01, "entropy bonus coefficient", ge=0)
    max_grad_norm: Optional[float] = F(40.0, "clip the gradient norm (null: off)", gt=0)
    train_batch_size: int = F(500, "env steps per train batch (worker fragments are concatenated)", ge=1, le=MAX_BATCH_ROWS)
    num_epochs: int = F(1, "passes of the learner over each train batch", ge=1)
    minibatch_size: Optional[int] = F(None, "rows per SGD step, contiguous slices (null: the whole train batch)", ge=1)
    learner_queue_size: int = F(2, "train batches waiting for the learner thread at most", ge=1)
    broadcast_interval: int = F(1, "batches from one worker between two weight pushes to that worker", ge=1)
    replay_proportion: float = F(0.0, "replayed fragments mixed in per new fragment, on average (0: off)", ge=0)
    replay_buffer_num_slots: int = F(100, "fragments kept for replay (FIFO)", ge=1)
    rollout_mode: str = F("async", "async (learner thread) or bulk_sync (for comparison)",
                          choices=("async", "bulk_sync"))
    log_std_init: float = F(0.0, "initial log-std of the Gaussian (Box actions)", ge=-20, le=20)

    def validate(self, run_config: Any, n: str) -> List[str]:
        """The checks that relate several keys (IMPALA's and APPO's)."""
        mb, tb = self.minibatch_size, self.train_batch_size
        return config_checks([(mb is not None and mb > tb, f"{n}.minibatch_size={mb} must be in [1, "
                                                           f"{n}.train_batch_size={tb}] (or null: the whole train batch)")])


@dataclass
class APPOConfig(IMPALAConfig):
    """appo: asynchronous PPO, IMPALA's sampling and learner with a clipped surrogate over V-trace advantages."""
    clip_param: float = F(0.4, "surrogate clip range epsilon around the ratio pi / pi_target", gt=0)
    target_update_freq: int = F(1, "train batches between two copies of the policy into the target network", ge=1)
    use_kl_loss: bool = F(False, "add the adaptive KL(pi_target || pi) penalty to the loss")
    kl_coeff: float = F(1.0, "initial KL-penalty coefficient (with use_kl_loss; KL is always reported)", ge=0)
    kl_target: float = F(0.01, "target KL for the adaptive penalty", gt=0)
    is_ratio_clip: float = F(2.0, "clip of the ratio pi_target / mu (behaviour) that corrects the surrogate", gt=0)
    normalize_advantages: str = F("none", "standardise the V-trace advantages per minibatch (as PPO's default) or "
                                  "not (RLlib's APPO)", choices=("minibatch", "none"))
    minibatch_mode: str = F("contiguous", "contiguous: slices of the train batch in order, V-trace per slice at the "
                            "current weights (IMPALA's learner); shuffled: V-trace once per train batch with the "
                            "target network, then rows shuffled into minibatches (as PPO's GAE)",
                            choices=("contiguous", "shuffled"))


IMPALA_REF = flowkit.AlgorithmRef("impala", IMPALAConfig, "flowkit_impala.impala:IMPALA", recurrent=True, learner_group=True,
                                  normalize_obs=True)
APPO_REF = flowkit.AlgorithmRef("appo", APPOConfig, "flowkit_impala.appo:APPO", recurrent=True, learner_group=True, normalize_obs=True)


@flowkit.hookimpl
def flowkit_add_algorithms():
    return [IMPALA_REF, APPO_REF]
