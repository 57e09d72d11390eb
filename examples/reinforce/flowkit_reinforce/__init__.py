"""flowkit-reinforce: REINFORCE with a baseline (Williams 1992), an example of an algorithm
plugin kept outside flowkit's tree.

This module is the torch-free part that ``flowkit plugins`` and ``flowkit train --help`` read:
the config section and the registration. The algorithm (torch) is in
:mod:`flowkit_reinforce.reinforce`, imported when a run needs it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import flowkit
from flowkit.config import F
from flowkit.hooks import lazy_attrs

if TYPE_CHECKING:
    from flowkit_reinforce.reinforce import Reinforce, ReinforcePolicy

__all__ = ["Reinforce", "ReinforceConfig", "ReinforcePolicy"]


@dataclass
class ReinforceConfig:
    """reinforce: REINFORCE with a running-mean baseline (Williams 1992)."""
    lr: float = F(1e-2, "Adam learning rate", gt=0)
    gamma: float = F(0.99, "discount factor of the returns", ge=0, le=1)
    baseline_rate: float = F(0.1, "step size of the running mean of returns used as the baseline", gt=0, le=1)
    train_batch_size: int = F(256, "env steps per policy-gradient step", ge=1)


@flowkit.hookimpl
def flowkit_add_algorithms():
    return [flowkit.AlgorithmRef("reinforce", ReinforceConfig, "flowkit_reinforce.reinforce:Reinforce")]


__getattr__ = lazy_attrs(dict.fromkeys(["Reinforce", "ReinforcePolicy"], "flowkit_reinforce.reinforce"))
