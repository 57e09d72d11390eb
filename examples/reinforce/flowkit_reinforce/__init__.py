"""flowkit-reinforce: REINFORCE with a baseline (Williams 1992), an example of an algorithm
plugin kept outside flowkit's tree.

This module is the torch-free part that ``flowkit plugins`` and ``flowkit train --help`` read:
the config section and the algorithm's declaration. The algorithm (torch) is in
:mod:`flowkit_reinforce.reinforce`, imported when a run needs it.
"""
from __future__ import annotations

from dataclasses import dataclass

import flowkit
from flowkit.config import F


@dataclass
class ReinforceConfig:
    """reinforce: REINFORCE with a running-mean baseline (Williams 1992)."""
    lr: float = F(1e-2, "Adam learning rate", gt=0)
    gamma: float = F(0.99, "discount factor of the returns", ge=0, le=1)
    baseline_rate: float = F(0.1, "step size of the running mean of returns used as the baseline", gt=0, le=1)
    train_batch_size: int = F(256, "env steps per policy-gradient step", ge=1)


REINFORCE_REF = flowkit.AlgorithmRef("reinforce", ReinforceConfig, "flowkit_reinforce.reinforce:Reinforce")


@flowkit.hookimpl
def flowkit_add_algorithms():
    return [REINFORCE_REF]
