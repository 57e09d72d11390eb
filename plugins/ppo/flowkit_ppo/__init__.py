"""flowkit-ppo: the PPO algorithm plugin (entry point group ``flowkit``)."""
import flowkit
from flowkit_ppo.ppo import PPO, PPOConfig, PPOPolicy

__all__ = ["PPO", "PPOConfig", "PPOPolicy"]


@flowkit.hookimpl
def flowkit_add_algorithms():
    return [PPO]
