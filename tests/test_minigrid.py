"""Env presets as a hook (issue 49): plugins/minigrid's ``minigrid`` preset beside the built-in
``atari``, the one-line errors of the preset checks, and PPO learning through the preset."""
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("minigrid")
pytest.importorskip("flowkit_minigrid")

import flowkit  # noqa: E402
from flowkit.config import ConfigError  # noqa: E402
from flowkit.core import EnvContext, make_env  # noqa: E402
from flowkit.testing import local_overrides  # noqa: E402

EMPTY = {"id": "MiniGrid-Empty-5x5-v0", "preset": "minigrid"}


def test_the_presets_come_from_the_hook_and_are_listed_by_name():
    pm = flowkit.get_plugin_manager()
    presets = pm.env_presets()
    assert {"atari", "minigrid"} <= set(presets)
    assert pm.owner["atari"] == "atari" and pm.owner["minigrid"] == "minigrid"  # (entry points of plugins/)
    assert presets["minigrid"].module == "flowkit_minigrid.preset" and presets["atari"].module == "flowkit_atari.preset"


@pytest.mark.parametrize("worker_index", [0, -1])  # a rollout worker's env, the evaluation's
def test_the_minigrid_preset_gives_the_7x7_view_as_float32_codes(worker_index):
    flowkit.get_plugin_manager()  # (registers the presets in this process)
    env = make_env(EMPTY, EnvContext(worker_index, 0, 1, 0, 0))
    space = env.observation_space
    assert space.shape == (7, 7, 3) and space.dtype == np.float32
    assert space.high[0, 0].tolist() == [10.0, 5.0, 2.0] and (space.low == 0).all()
    obs, _ = env.reset(seed=0)
    assert obs.dtype == np.float32 and space.contains(obs)
    assert obs[3, 6].tolist() == [1.0, 0.0, 0.0]  # the agent's own cell: empty
    assert obs[3, 5].tolist() == [1.0, 0.0, 0.0] and obs[3, 4].tolist() == [1.0, 0.0, 0.0]  # in front: free cells
    # Empty-5x5: start at (1, 1) facing east, goal at (3, 3): forward, forward, right, forward, forward
    ret, term = 0.0, False
    for a in (2, 2, 1, 2, 2):
        obs, r, term, trunc, _ = env.step(a)
        ret += r
    assert term and ret == pytest.approx(1 - 0.9 * 5 / 100)  # MiniGrid's reward: 1 - 0.9 * steps / max_steps
    env.close()


@pytest.mark.parametrize("extra, words", [
    (("env=MiniGrid-Empty-5x5-v0", "env.preset=minigird"),
     "env.preset='minigird' is not a registered env preset (registered: atari, minigrid)"),
    (("env.preset=minigrid", "env.factory=envs:FixedLenEnv"),
     "env.preset=minigrid needs env.id (a MiniGrid id such as MiniGrid-Empty-5x5-v0), not env.factory"),
    (("env.preset=minigrid", "env=CartPole-v1"), "env.preset=minigrid: env.id='CartPole-v1' is not a MiniGrid env"),
    (("env.preset=atari", "env=ALE/Pong-v5", "env.kwargs.repeat_action_probability=2.0"),
     "env.kwargs.repeat_action_probability=2.0: a probability, in [0, 1]"),
])
def test_preset_errors_are_one_line_before_ray_starts(extra, words, run_dir):
    from flowkit._guard import check_env_id
    from flowkit._prepare import prepare
    with pytest.raises(ConfigError) as e:  # (as the CLI checks: prepare, then the env id before Ray starts)
        run = prepare(local_overrides(run_dir, "algo=ppo", *extra))
        check_env_id(run.config, run.pm)
    assert str(e.value).startswith(words) and "\n" not in str(e.value)


def test_a_minigrid_id_without_the_preset_says_to_give_it(tmp_path):
    # a fresh process, where MiniGrid's ids exist for Gymnasium only once minigrid is imported
    p = subprocess.run([sys.executable, "-m", "flowkit.cli", "train", "algo=ppo", "env=MiniGrid-Empty-5x5-v0",
                        f"run.dir={tmp_path}/run"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and p.stderr == (
        "flowkit: config error: env.id='MiniGrid-Empty-5x5-v0' is a MiniGrid env: give it with env.preset=minigrid "
        "(its 7x7 view as the observation), e.g. `flowkit train algo=ppo env=MiniGrid-Empty-5x5-v0 "
        "env.preset=minigrid`\n")


@pytest.mark.slow
def test_ppo_learns_minigrid_empty_through_the_preset(run_dir):
    """The reward is 1 - 0.9 * steps / max_steps at the goal: 0.955 for the shortest path (5
    steps), about 0.2 for a random policy; 0.9 means about 11 steps an episode on the way."""
    res = flowkit.train(local_overrides(
        run_dir, "algo=ppo", "env=MiniGrid-Empty-5x5-v0", "env.preset=minigrid", "runtime.num_workers=1",
        "runtime.num_envs_per_worker=8", "runtime.rollout_fragment_length=64", "ppo.lr=1e-3", "ppo.num_epochs=4",
        "ppo.minibatch_size=128", "ppo.gamma=0.99", "ppo.ent_coef=0.01", "model.activation=relu",
        "model.hidden_sizes=[64]", "stop.episode_return_mean=0.9", "stop.env_steps=20000", "seed=0"))
    assert res.stop_reason == "stop.episode_return_mean=0.9 reached", res.metrics
    assert res.metrics["env_steps_sampled"] <= 20000  # (seeds 0, 1, 2: 7,168, 5,632, 5,632)
