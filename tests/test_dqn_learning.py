"""DQN learns CartPole-v1 (issue 3 acceptance, one seed; all seeds: bench/dqn_cartpole.py).
The config stops on a greedy evaluation of 450 (20 episodes every 5 iterations)."""
import os

import pytest

import flowkit

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
@pytest.mark.ray
def test_dqn_cartpole_seed0_reaches_450_within_100k_env_steps(ray_session, run_dir):
    res = flowkit.train(["seed=0", f"run.dir={run_dir}", "run.reporters=[csv,checkpoint,evaluation]",
                         "checkpoint.at_end=false"],
                        config_file=os.path.join(REPO, "configs", "dqn", "CartPole-v1.yaml"))
    assert res.metrics["env_steps_sampled"] <= 100_000
    assert res.metrics["evaluation_return_mean"] >= 450, res.metrics  # greedy (the config's stop)
