"""A run's outputs (run folder, evaluation, stop conditions), the random baseline, the Ray
backend end to end, and model options."""
import json
import os

import numpy as np
import pytest
from gymnasium import spaces

import flowkit
from flowkit.testing import local_overrides


def test_run_folder_contents_and_evaluation(run_dir):
    res = flowkit.train(local_overrides(run_dir, "env=CartPole-v1", "runtime.num_envs_per_worker=2",
                                        "runtime.rollout_fragment_length=32", "stop.iterations=4",
                                        "evaluation.interval=2", "evaluation.episodes=3", "checkpoint.every_iters=2",
                                        "run.reporters=[csv,plot,checkpoint,evaluation]"))
    files = set(os.listdir(run_dir))
    assert {"config.yaml", "metrics.csv", "result.json", "learning_curve.png", "checkpoints"} <= files
    assert sorted(os.listdir(os.path.join(run_dir, "checkpoints"))) == ["iter_000002", "iter_000004"]
    assert not [d for d in os.listdir(os.path.join(run_dir, "checkpoints")) if d.startswith(".tmp")]
    rows = res.history
    assert ["evaluation_return_mean" in r for r in rows] == [False, True, False, True]
    assert all(r["evaluation_episodes"] == 3 for r in rows if "evaluation_episodes" in r)
    summary = json.load(open(os.path.join(run_dir, "result.json")))
    assert summary["stop_reason"] == "stop.iterations=4 reached" and summary["iteration"] == 4
    for key in ("iteration", "env_steps_sampled", "env_steps_trained", "episode_return_mean",
                "episode_len_mean", "time_total_s"):
        assert key in rows[0]


def test_result_json_has_the_start_up_phases_in_order(run_dir):
    flowkit.train(local_overrides(run_dir, "env=CartPole-v1", "runtime.num_envs_per_worker=2",
                                  "runtime.rollout_fragment_length=32", "stop.iterations=2"))
    s = json.load(open(os.path.join(run_dir, "result.json")))
    phases = [s[f"time_{p}_s"] for p in ("config", "ray", "actors", "first_sample", "first_train", "end")]
    assert 0 < phases[0] and phases == sorted(phases), phases  # seconds since train() was called
    assert s["time_first_sample_s"] == pytest.approx(s["time_startup_s"], abs=0.5)


def test_stop_on_env_steps_and_return(run_dir):
    res = flowkit.train(local_overrides(run_dir, "env=CartPole-v1", "runtime.num_envs_per_worker=2",
                                        "runtime.rollout_fragment_length=32", "stop.env_steps=300"))
    assert res.metrics["env_steps_sampled"] == 384 and "stop.env_steps=300" in res.stop_reason
    res = flowkit.train(local_overrides(run_dir + "2", "env=CartPole-v1", "runtime.num_envs_per_worker=2",
                                        "runtime.rollout_fragment_length=32", "stop.episode_return_mean=1"))
    assert res.metrics["iteration"] == 1 and "stop.episode_return_mean" in res.stop_reason


def test_min_iter_settings_do_not_run_past_the_env_steps_budget(run_dir):
    res = flowkit.train(local_overrides(run_dir, "algo=random", "env=CartPole-v1", "runtime.num_envs_per_worker=2",
                                        "runtime.rollout_fragment_length=32", "stop.env_steps=300",
                                        "run.min_iter_env_steps=3000", "run.min_iter_time_s=30"))
    assert res.metrics["iteration"] == 1 and res.metrics["env_steps_sampled"] == 384, res.metrics
    assert "stop.env_steps=300" in res.stop_reason


def test_random_baseline(run_dir):
    res = flowkit.train(local_overrides(run_dir, "algo=random", "env=CartPole-v1", "stop.env_steps=4000",
                                        "runtime.num_envs_per_worker=4", "runtime.rollout_fragment_length=50"))
    assert 12 <= res.metrics["episode_return_mean"] <= 40  # uniform play on CartPole: ~22
    assert res.metrics["env_steps_trained"] == 0


def test_observation_normalisation_and_shared_network_learn(run_dir):
    res = flowkit.train(local_overrides(run_dir, "env=CartPole-v1", "ppo.normalize_observations=true",
                                        "model.shared_value_network=true", "model.activation=relu",
                                        "stop.iterations=3"))
    algo = flowkit.Algorithm.from_checkpoint(run_dir)
    rms = algo.get_policy().model.obs_rms
    assert float(rms.count) > 2000 and np.abs(rms.mean.numpy()).max() < 1.0
    assert np.isfinite(res.metrics["learner/default/total_loss"])


def test_image_observations_go_through_a_cnn():
    from flowkit.config import ModelConfig
    from flowkit_ppo import PPOConfig
    from flowkit_ppo.ppo import PPOPolicy
    from omegaconf import OmegaConf
    pol = PPOPolicy(spaces.Box(0, 255, (40, 40, 3), np.uint8), spaces.Discrete(3), PPOConfig(),
                    OmegaConf.structured(ModelConfig))
    a = pol.compute_actions(np.zeros((5, 40, 40, 3), np.uint8), explore=True)
    assert a.shape == (5,) and set(a.tolist()) <= {0, 1, 2}
    assert any(type(m).__name__ == "SmallCNN" for m in pol.model.modules())


@pytest.mark.usefixtures("ray_session")
@pytest.mark.slow
def test_ray_backend_end_to_end(run_dir):
    res = flowkit.train(["env=CartPole-v1", "runtime.backend=ray", "runtime.num_workers=2",
                         "runtime.num_envs_per_worker=2", "runtime.rollout_fragment_length=64",
                         "stop.iterations=3", f"run.dir={run_dir}", "run.reporters=[csv,plot,checkpoint,evaluation]"])
    assert res.metrics["env_steps_sampled"] == 3 * 2 * 2 * 64
    assert res.metrics["num_worker_restarts"] == 0
    algo = flowkit.Algorithm.from_checkpoint(run_dir)
    act = algo.compute_actions(np.zeros(4, np.float32))
    assert int(act) in (0, 1)
