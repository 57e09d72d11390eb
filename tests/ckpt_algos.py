"""A plugin module for tests/test_checkpoint.py: a PPO variant that a run names by import
path (``plugins=[ckpt_algos]``), so loading its checkpoint imports this installed module."""
import flowkit
from flowkit_ppo.ppo import PPO


class MyPPO(PPO):
    name = "my_ppo"


@flowkit.hookimpl
def flowkit_add_algorithms():
    return [MyPPO]
