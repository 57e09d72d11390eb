"""flowkit-dqn: the DQN algorithm plugin (entry point group ``flowkit``)."""
import flowkit  # noqa: I001 - wrapped by hand, two lines instead of ruff's one name per line
from flowkit_dqn.dqn import (DQN, DQNConfig, DQNPolicy, QNetwork, apex_epsilon, compute_n_step,
                             compute_q_targets, epsilon_at)

__all__ = ["DQN", "DQNConfig", "DQNPolicy", "QNetwork", "apex_epsilon", "compute_n_step",
           "compute_q_targets", "epsilon_at"]


@flowkit.hookimpl
def flowkit_add_algorithms():
    return [DQN]
