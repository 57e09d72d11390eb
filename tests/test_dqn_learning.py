"""DQN learns CartPole-v1 (issue 3 acceptance, one seed; all seeds: bench/dqn_cartpole.py)."""
import os

import pytest

import flowkit
from conftest import local_overrides

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_dqn_cartpole_seed0_reaches_450_within_100k_env_steps(run_dir):
    res = flowkit.train(local_overrides(run_dir, "seed=0", "checkpoint.at_end=false"),
                        config_file=os.path.join(REPO, "configs", "dqn_cartpole.yaml"))
    assert res.metrics["env_steps_sampled"] <= 100_000 + 256
    assert res.metrics["episode_return_mean"] >= 450, res.metrics
