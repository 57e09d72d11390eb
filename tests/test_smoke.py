"""A tiny end-to-end run on the local backend."""
import flowkit
from flowkit.testing import local_overrides


def test_ppo_local_smoke(run_dir):
    res = flowkit.train(local_overrides(run_dir, "env=CartPole-v1", "stop.iterations=2",
                                        "runtime.num_envs_per_worker=2", "runtime.rollout_fragment_length=16"))
    assert res.metrics["iteration"] == 2
    assert res.metrics["env_steps_sampled"] == 2 * 2 * 2 * 16
    assert res.stop_reason.startswith("stop.iterations")
