"""Hooks: the golden order of hook calls, custom metrics, plugin loading rules."""
import csv
import os

import pluggy
import pytest

import flowkit
from conftest import local_overrides
from flowkit.core import WorkerSet
from flowkit.hooks import PluginError, get_plugin_manager


class Recorder:
    def __init__(self):
        self.calls = []

    @flowkit.hookimpl
    def flowkit_on_run_start(self, ctx):
        self.calls.append("run_start")

    @flowkit.hookimpl
    def flowkit_on_episode_end(self, episode, worker):
        self.calls.append("episode_end")
        episode.custom_metrics["len_x10"] = episode.length * 10

    @flowkit.hookimpl
    def flowkit_on_trajectory(self, policy_id, batch, episode):
        self.calls.append(f"trajectory:{len(batch)}")

    @flowkit.hookimpl
    def flowkit_on_train_result(self, result, ctx):
        self.calls.append("train_result")
        assert isinstance(ctx.workers, WorkerSet)
        result["custom_from_driver"] = 1.0

    @flowkit.hookimpl
    def flowkit_on_checkpoint(self, path, ctx):
        self.calls.append("checkpoint")

    @flowkit.hookimpl
    def flowkit_on_run_end(self, result, ctx):
        self.calls.append("run_end")


def test_golden_hook_order_local(run_dir):
    """One worker, one sub-env, fragments of 8 steps, episodes of exactly 3 steps."""
    rec = Recorder()
    flowkit.register(rec)
    try:
        res = flowkit.train(local_overrides(run_dir, "env.factory=envs:FixedLenEnv", "runtime.num_workers=1",
                                            "runtime.num_envs_per_worker=1", "runtime.rollout_fragment_length=8",
                                            "ppo.minibatch_size=8", "ppo.num_epochs=1", "stop.iterations=2"))
    finally:
        flowkit.unregister(rec)
    assert rec.calls == [
        "run_start",
        "episode_end", "episode_end", "trajectory:3", "trajectory:3", "trajectory:2", "train_result",
        "episode_end", "episode_end", "episode_end",
        "trajectory:1", "trajectory:3", "trajectory:3", "trajectory:1", "train_result",
        "checkpoint", "run_end"]
    rows = list(csv.DictReader(open(os.path.join(res.run_dir, "metrics.csv"))))
    assert [float(r["custom/len_x10"]) for r in rows] == [30.0, 30.0]
    assert [float(r["custom_from_driver"]) for r in rows] == [1.0, 1.0]
    assert [int(r["episodes_this_iter"]) for r in rows] == [2, 3]


class Undecorated:
    def __init__(self):
        self.n = 0

    def flowkit_on_run_start(self, ctx):  # no @hookimpl: still a hook (pytest-style)
        self.n += 1


def test_undecorated_flowkit_methods_count_as_hooks(run_dir):
    u = Undecorated()
    flowkit.register(u)
    try:
        flowkit.train(local_overrides(run_dir, "env=CartPole-v1", "stop.iterations=1", "runtime.num_workers=1",
                                      "runtime.num_envs_per_worker=1", "runtime.rollout_fragment_length=8"))
    finally:
        flowkit.unregister(u)
    assert u.n == 1


class Misspelt:
    def flowkit_on_episode_ends(self, episode, worker):
        pass


def test_misspelt_hook_fails_loudly():
    with pytest.raises(PluginError, match="flowkit_on_episode_ends"):
        get_plugin_manager(extra=[Misspelt()])


class DuplicateName:
    @flowkit.hookimpl
    def flowkit_add_algorithms(self):
        from flowkit_ppo import PPO
        return [type("OtherPPO", (PPO,), {})]  # keeps name "ppo"


def test_duplicate_algorithm_name_names_both_plugins():
    pm = get_plugin_manager(extra=[DuplicateName()])
    with pytest.raises(PluginError, match=r"algorithm 'ppo' is contributed twice: by plugin 'ppo' and by plugin"):
        pm.algorithms()


def test_plugins_from_config_are_loaded_and_bad_ones_named():
    pm, cfg = flowkit.load_config(["plugins=[envs]"])
    assert pm.get_plugin("envs") is not None
    with pytest.raises(PluginError, match="no_such_module_xyz"):
        flowkit.load_config(["plugins=[no_such_module_xyz]"])
