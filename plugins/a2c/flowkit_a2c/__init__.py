"""flowkit-a2c: the A2C and A3C algorithm plugin (entry point group ``flowkit``).

This module is the plugin's torch-free declaration (the config sections and the algorithms'
:class:`flowkit.AlgorithmRef`); the algorithms and their policy (torch) are in
:mod:`flowkit_a2c.a2c`, imported when a run uses them.
"""
from dataclasses import dataclass
from typing import Optional

import flowkit
from flowkit.config import MAX_BATCH_ROWS, F, LRConfig


@dataclass
class _ActorCriticConfig(LRConfig):
    """The keys A2C and A3C share (the loss, the returns, the optimizer)."""
    lr: float = F(7e-4, "learning rate", gt=0)
    optimizer: str = F("rmsprop", "rmsprop (the paper's) or adam", choices=("rmsprop", "adam"))
    optimizer_eps: float = F(1e-5, "epsilon of the optimizer's denominator", gt=0)
    rmsprop_alpha: float = F(0.99, "RMSprop decay of the squared-gradient average", ge=0, lt=1)
    gamma: float = F(0.99, "discount factor", ge=0, le=1)
    returns: str = F("nstep", "nstep: each row's return runs to the end of its fragment and bootstraps there "
                              "(the paper's); gae: GAE with gae_lambda", choices=("nstep", "gae"))
    gae_lambda: float = F(0.95, "GAE lambda (returns=gae; nstep is lambda=1)", ge=0, le=1)
    vf_coef: float = F(0.5, "value-loss coefficient", ge=0)
    ent_coef: float = F(0.01, "entropy bonus coefficient", ge=0)
    max_grad_norm: Optional[float] = F(0.5, "clip the gradient's global norm (null: off)", gt=0)
    normalize_advantages: bool = F(False, "standardise the advantages of each gradient step")
    log_std_init: float = F(0.0, "initial log-std of the Gaussian (Box actions)", ge=-20, le=20)


@dataclass
class A2CConfig(_ActorCriticConfig):
    """a2c: Advantage Actor-Critic, synchronous (one gradient step per train batch)."""
    train_batch_size: Optional[int] = F(None, "env steps per train batch (null: one sampling round)", ge=1, le=MAX_BATCH_ROWS)


@dataclass
class A3CConfig(_ActorCriticConfig):
    """a3c: Asynchronous Advantage Actor-Critic (gradients computed on the workers)."""


A2C_REF = flowkit.AlgorithmRef("a2c", A2CConfig, "flowkit_a2c.a2c:A2C", recurrent=True, normalize_obs=True)
A3C_REF = flowkit.AlgorithmRef("a3c", A3CConfig, "flowkit_a2c.a2c:A3C", recurrent=True, normalize_obs_refusal=(
    "its gradients are computed on the workers and the learner never sees the observations to keep their running "
    "statistics; use a2c (the same loss, synchronous), which keeps them"))


@flowkit.hookimpl
def flowkit_add_algorithms():
    return [A2C_REF, A3C_REF]
