"""Issue 11, part 2: the out-of-tree examples. The REINFORCE plugin installs into a throwaway
target, appears in `flowkit plugins` and trains; its own tests (check_algorithm) pass; the
callback example adds its metric and log."""
import json
import os
import subprocess
import sys

import pytest

import flowkit
from flowkit.testing import local_overrides

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(REPO, "examples")


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """examples/reinforce pip-installed into a folder: its PYTHONPATH."""
    target = str(tmp_path_factory.mktemp("target"))
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                    "--target", target, os.path.join(EXAMPLES, "reinforce")], check=True, timeout=300,
                   cwd=str(tmp_path_factory.getbasetemp()))
    return os.pathsep.join([target, os.environ.get("PYTHONPATH", "")])


def _flowkit(pythonpath, *args, cwd):
    env = {**os.environ, "PYTHONPATH": pythonpath}
    return subprocess.run([sys.executable, "-m", "flowkit.cli", *args], capture_output=True, text=True,
                          timeout=300, env=env, cwd=cwd)


def test_callback_example_named_in_plugins_needs_its_folder_on_the_path_as_the_readme_says():
    assert "`PYTHONPATH=examples/episode_logger flowkit train" in open(os.path.join(EXAMPLES, "README.md")).read()
    p = _flowkit(os.environ.get("PYTHONPATH", ""), "plugins", "plugins=[flowkit_episode_logger]", cwd=REPO)
    assert p.returncode == 2 and "put the folder holding it on PYTHONPATH" in p.stderr, p.stderr
    path = os.pathsep.join(["examples/episode_logger", os.environ.get("PYTHONPATH", "")])
    p = _flowkit(path, "plugins", "plugins=[flowkit_episode_logger]", cwd=REPO)
    assert "flowkit_episode_logger  [`plugins`]" in p.stdout, p.stderr


@pytest.mark.slow
def test_installed_plugin_is_listed_and_trains(installed, tmp_path):
    p = _flowkit(installed, "plugins", cwd=str(tmp_path))
    assert "reinforce  [flowkit-reinforce 0.1.0]" in p.stdout, p.stdout + p.stderr
    assert "algorithm   reinforce: REINFORCE with a running-mean baseline" in p.stdout
    p = _flowkit(installed, "train", "algo=reinforce", "env.factory=flowkit.testing.envs:match", "stop.env_steps=2000",
                 "reinforce.train_batch_size=64", "runtime.backend=local", "runtime.num_workers=1",
                 f"run.dir={tmp_path / 'run'}", "run.reporters=[checkpoint]", cwd=str(tmp_path))
    assert p.returncode == 0, p.stderr[-2000:]
    assert "stopped: stop.env_steps=2000 reached" in p.stdout and "checkpoint: " in p.stdout


@pytest.mark.slow
def test_the_example_plugins_own_tests_pass(installed, tmp_path):
    """Its tests use flowkit's pytest plugin; one removes the checkpointed baseline and sees
    check_algorithm name it."""
    env = {**os.environ, "PYTHONPATH": installed}
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        os.path.join(EXAMPLES, "reinforce", "tests")], capture_output=True, text=True,
                       timeout=600, env=env, cwd=os.path.join(EXAMPLES, "reinforce"))
    assert p.returncode == 0 and "2 passed" in p.stdout, p.stdout[-3000:]


def test_callback_example_adds_a_metric_and_a_log(run_dir):
    sys.path.insert(0, os.path.join(EXAMPLES, "episode_logger"))
    try:
        res = flowkit.train(local_overrides(run_dir, "env.factory=flowkit.testing.envs:match", "stop.iterations=2",
                                            "plugins=[flowkit_episode_logger]", "runtime.num_workers=1",
                                            "runtime.rollout_fragment_length=16", "ppo.minibatch_size=32"),
                            verbose=False)
    finally:
        sys.path.remove(os.path.join(EXAMPLES, "episode_logger"))
    assert 0 <= res.metrics["custom/reward_per_step"] <= 1
    with open(os.path.join(run_dir, "episodes.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    assert [r["iteration"] for r in rows] == [1, 2] and "custom/reward_per_step" in rows[-1]


def test_plugins_lists_a_plugin_named_in_the_config(tmp_path):
    p = _flowkit(os.pathsep.join([os.path.join(EXAMPLES, "episode_logger"), os.environ.get("PYTHONPATH", "")]),
                 "plugins", "plugins=[flowkit_episode_logger]", cwd=str(tmp_path))
    assert "flowkit_episode_logger  [`plugins`]" in p.stdout, p.stdout + p.stderr
    assert "hooks       flowkit_on_episode_end, flowkit_report" in p.stdout
