"""Hooks: the golden order of hook calls, custom metrics, plugin loading rules."""
import csv
import os

import pytest
from flowkit_ppo.ppo import PPO, PPOPolicy

import flowkit
import flowkit.testing.recorder
from flowkit.core import Episode, SampleBatch, WorkerSet
from flowkit.hooks import PluginError, get_plugin_manager
from flowkit.testing import local_overrides

# ---- the golden hook order ---------------------------------------------------------------------
# Every hookspec, found by reflection: a new hook is recorded without editing this file, and the
# golden sequences below then fail until they list it.
HOOKS = flowkit.testing.recorder.HOOKS
# Overridable methods recorded through subclasses; per-step ones are recorded as call counts
# (a run of consecutive calls becomes "name xN").
ALGORITHM_METHODS = ["get_rollout_mode", "training_flow", "get_state", "set_state"]
POLICY_METHODS = ["compute_actions", "compute_actions_encoded", "postprocess_trajectory", "prepare_batch",
                  "loss", "on_train_batch_end", "set_progress", "get_weights",
                  "set_weights", "get_state", "set_state"]
PER_STEP = {"RecPolicy.compute_actions_encoded"}
LOG: list = []


def _show(v, run_dir):
    """A stable, short rendering of a hook argument: simple values as they are (paths relative
    to the run folder), result rows by iteration and env steps, other objects by type."""
    if v is None or isinstance(v, (bool, int, float)):
        return repr(v)
    if isinstance(v, str):
        return repr(v.replace(run_dir, "<run>"))
    if isinstance(v, SampleBatch):
        return f"SampleBatch[{len(v)}]"
    if isinstance(v, dict) and "iteration" in v:
        extra = ", eval" if "evaluation_return_mean" in v else ""
        return f"row(iteration={v['iteration']}, env_steps_sampled={v['env_steps_sampled']}{extra})"
    if isinstance(v, (dict, list)):
        return f"{type(v).__name__}[{len(v)}]"
    if isinstance(v, Episode):
        return f"Episode(length={v.length})"
    if isinstance(v, flowkit.Result):
        return f"Result(stop_reason={v.stop_reason!r})"
    return type(v).__name__


class HookRecorder(flowkit.testing.HookRecorder):
    """Records each call with its arguments as a short line in LOG; ``flowkit_state_dict``
    returns a small state so a resume calls ``flowkit_load_state_dict``."""

    def __init__(self):
        super().__init__()
        self.run_dir = "\0"

    def _record(self, name, kwargs):
        def show(k, v):  # the installed algorithms: their number depends on the plugins installed
            return "dict" if k == "algorithms" else _show(v, self.run_dir)
        LOG.append(f"{name}(" + ", ".join(f"{k}={show(k, v)}" for k, v in kwargs.items()) + ")")
        return {"calls": len(LOG)} if name == "flowkit_state_dict" else None


def _recording(base, names, tag):
    def wrap(n):
        f = getattr(base, n)

        def method(self, *a, **k):
            LOG.append(f"{tag}.{n}")
            return f(self, *a, **k)
        return method
    cls = type(tag, (base,), {n: wrap(n) for n in names})
    cls.__module__ = __name__  # picklable (checkpoints hold the policy class)
    return cls


RecPolicy = _recording(PPOPolicy, POLICY_METHODS, "RecPolicy")
RecPPO = _recording(PPO, ALGORITHM_METHODS, "RecPPO")
RecPPO.name, RecPPO.policy_class = "rec_ppo", RecPolicy


class RecPlugin:
    @flowkit.hookimpl
    def flowkit_add_algorithms(self):
        return [RecPPO]


def _compressed(log):
    out = []
    for item in log:
        if item in PER_STEP and out and out[-1].startswith(item + " x"):
            out[-1] = f"{item} x{int(out[-1].rsplit('x', 1)[1]) + 1}"
        else:
            out.append(f"{item} x1" if item in PER_STEP else item)
    return out


def _recorded_run(run_dir, *extra):
    rec, plug = HookRecorder(), RecPlugin()
    rec.run_dir = run_dir
    LOG.clear()
    flowkit.register(plug)
    flowkit.register(rec)
    try:
        res = flowkit.train(local_overrides(run_dir, "algo=rec_ppo", "env.factory=envs:FixedLenEnv",
                                            "runtime.num_workers=1", "runtime.num_envs_per_worker=1",
                                            "runtime.rollout_fragment_length=8", "rec_ppo.minibatch_size=8",
                                            "rec_ppo.num_epochs=1", "evaluation.interval=2",
                                            "evaluation.episodes=1", "checkpoint.every_iters=2", *extra))
    finally:
        flowkit.unregister(rec)
        flowkit.unregister(plug)
    return res, _compressed(LOG)


def test_golden_hook_order_fresh_and_resume(run_dir):
    """One worker, one sub-env, fragments of 8 steps, episodes of exactly 3 steps; every hook
    and the listed methods, in order, for a fresh run of 2 iterations and a resume to 3."""
    res, fresh = _recorded_run(run_dir, "stop.iterations=2")
    assert res.metrics["iteration"] == 2
    if GOLDEN_FRESH != fresh:  # the new sequence, ready to paste once reviewed
        print("\n".join(f"    {c!r}," for c in fresh))
    assert fresh == GOLDEN_FRESH
    res, resumed = _recorded_run(run_dir, f"resume={run_dir}", "stop.iterations=3")
    assert res.metrics["iteration"] == 3
    if GOLDEN_RESUME != resumed:
        print("\n".join(f"    {c!r}," for c in resumed))
    assert resumed == GOLDEN_RESUME
    # every hookspec is exercised by these two runs: a new hook needs a place in them
    assert {c.split("(")[0] for c in fresh + resumed if c.startswith("flowkit_")} == set(HOOKS)


GOLDEN_FRESH = [
    'flowkit_add_env_presets()',
    'flowkit_add_algorithms()',
    'flowkit_add_config_sections()',
    'flowkit_add_reporters()',
    'flowkit_make_policy_specs(config=DictConfig, env=FixedLenEnv, algorithms=dict)',
    'flowkit_add_reporters()',
    'flowkit_build_plan(ctx=RunContext)',
    'RecPPO.get_rollout_mode',
    'RecPPO.training_flow',
    'flowkit_add_algorithms()',
    'flowkit_add_config_sections()',
    'flowkit_make_env_runner(env=SpaceCheck, context=EnvContext, config=DictConfig, policies=dict[1])',
    'RecPolicy.get_weights',
    'RecPolicy.set_weights',
    "flowkit_on_run_start(ctx=RunContext, run_dir='<run>', history=list[0])",
    'flowkit_train_iteration(ctx=RunContext, results=Flow)',
    'RecPolicy.compute_actions_encoded x3',
    'flowkit_on_episode_end(episode=Episode(length=3), worker=RolloutWorker)',
    'RecPolicy.compute_actions_encoded x4',
    'flowkit_on_episode_end(episode=Episode(length=3), worker=RolloutWorker)',
    'RecPolicy.compute_actions_encoded x3',
    "flowkit_on_trajectory(policy_id='default', batch=SampleBatch[3], episode=Episode(length=3))",
    "flowkit_on_trajectory(policy_id='default', batch=SampleBatch[3], episode=Episode(length=3))",
    "flowkit_on_trajectory(policy_id='default', batch=SampleBatch[2], episode=Episode(length=2))",
    'RecPolicy.postprocess_trajectory',
    'RecPolicy.postprocess_trajectory',
    'RecPolicy.postprocess_trajectory',
    'RecPolicy.prepare_batch',
    'RecPolicy.loss',
    'RecPolicy.on_train_batch_end',
    'RecPolicy.get_weights',
    'RecPolicy.set_weights',
    'flowkit_on_train_result(result=row(iteration=1, env_steps_sampled=8), ctx=RunContext)',
    'flowkit_report(result=row(iteration=1, env_steps_sampled=8), ctx=RunContext)',
    'flowkit_train_iteration(ctx=RunContext, results=Flow)',
    'RecPolicy.compute_actions_encoded x1',
    'flowkit_on_episode_end(episode=Episode(length=3), worker=RolloutWorker)',
    'RecPolicy.compute_actions_encoded x4',
    'flowkit_on_episode_end(episode=Episode(length=3), worker=RolloutWorker)',
    'RecPolicy.compute_actions_encoded x4',
    'flowkit_on_episode_end(episode=Episode(length=3), worker=RolloutWorker)',
    'RecPolicy.compute_actions_encoded x2',
    "flowkit_on_trajectory(policy_id='default', batch=SampleBatch[1], episode=Episode(length=3))",
    "flowkit_on_trajectory(policy_id='default', batch=SampleBatch[3], episode=Episode(length=3))",
    "flowkit_on_trajectory(policy_id='default', batch=SampleBatch[3], episode=Episode(length=3))",
    "flowkit_on_trajectory(policy_id='default', batch=SampleBatch[1], episode=Episode(length=1))",
    'RecPolicy.postprocess_trajectory',
    'RecPolicy.postprocess_trajectory',
    'RecPolicy.postprocess_trajectory',
    'RecPolicy.postprocess_trajectory',
    'RecPolicy.prepare_batch',
    'RecPolicy.loss',
    'RecPolicy.on_train_batch_end',
    'RecPolicy.get_weights',
    'RecPolicy.set_weights',
    'flowkit_make_env_runner(env=SpaceCheck, context=EnvContext, config=DictConfig, policies=dict[1])',
    'RecPolicy.get_weights',
    'RecPolicy.set_weights',
    'RecPolicy.compute_actions',
    'RecPolicy.compute_actions_encoded x1',
    'RecPolicy.compute_actions',
    'RecPolicy.compute_actions_encoded x1',
    'RecPolicy.compute_actions',
    'RecPolicy.compute_actions_encoded x1',
    'flowkit_on_train_result(result=row(iteration=2, env_steps_sampled=16, eval), ctx=RunContext)',
    'flowkit_report(result=row(iteration=2, env_steps_sampled=16, eval), ctx=RunContext)',
    'RecPolicy.get_state',
    'RecPolicy.get_weights',
    'RecPPO.get_state',
    'flowkit_state_dict()',
    "flowkit_on_checkpoint(path='<run>/checkpoints/iter_000002', ctx=RunContext)",
    'RecPolicy.get_state',
    'RecPolicy.get_weights',
    'RecPPO.get_state',
    'flowkit_state_dict()',
    "flowkit_on_checkpoint(path='<run>/checkpoints/iter_000002', ctx=RunContext)",
    'flowkit_on_train_end(summary=row(iteration=2, env_steps_sampled=16, eval), error=None, ctx=RunContext)',
    "flowkit_on_run_end(result=Result(stop_reason='stop.iterations=2 reached'), ctx=RunContext)",
]
GOLDEN_RESUME = [
    'flowkit_add_env_presets()',
    'flowkit_add_algorithms()',
    'flowkit_add_config_sections()',
    'flowkit_add_reporters()',
    'flowkit_make_policy_specs(config=DictConfig, env=FixedLenEnv, algorithms=dict)',
    'flowkit_add_reporters()',
    'flowkit_build_plan(ctx=RunContext)',
    'RecPPO.get_rollout_mode',
    'RecPPO.training_flow',
    'RecPolicy.set_state',
    'RecPolicy.set_weights',
    'RecPPO.set_state',
    'flowkit_load_state_dict(state=dict[1])',
    'flowkit_add_algorithms()',
    'flowkit_add_config_sections()',
    'flowkit_make_env_runner(env=SpaceCheck, context=EnvContext, config=DictConfig, policies=dict[1])',
    'RecPolicy.get_weights',
    'RecPolicy.set_weights',
    "flowkit_on_run_start(ctx=RunContext, run_dir='<run>', history=list[2])",
    'flowkit_train_iteration(ctx=RunContext, results=Flow)',
    'RecPolicy.compute_actions_encoded x3',
    'flowkit_on_episode_end(episode=Episode(length=3), worker=RolloutWorker)',
    'RecPolicy.compute_actions_encoded x4',
    'flowkit_on_episode_end(episode=Episode(length=3), worker=RolloutWorker)',
    'RecPolicy.compute_actions_encoded x3',
    "flowkit_on_trajectory(policy_id='default', batch=SampleBatch[3], episode=Episode(length=3))",
    "flowkit_on_trajectory(policy_id='default', batch=SampleBatch[3], episode=Episode(length=3))",
    "flowkit_on_trajectory(policy_id='default', batch=SampleBatch[2], episode=Episode(length=2))",
    'RecPolicy.postprocess_trajectory',
    'RecPolicy.postprocess_trajectory',
    'RecPolicy.postprocess_trajectory',
    'RecPolicy.prepare_batch',
    'RecPolicy.loss',
    'RecPolicy.on_train_batch_end',
    'RecPolicy.get_weights',
    'RecPolicy.set_weights',
    'flowkit_on_train_result(result=row(iteration=3, env_steps_sampled=24), ctx=RunContext)',
    'flowkit_report(result=row(iteration=3, env_steps_sampled=24), ctx=RunContext)',
    'RecPolicy.get_state',
    'RecPolicy.get_weights',
    'RecPPO.get_state',
    'flowkit_state_dict()',
    "flowkit_on_checkpoint(path='<run>/checkpoints/iter_000003', ctx=RunContext)",
    'flowkit_on_train_end(summary=row(iteration=3, env_steps_sampled=24), error=None, ctx=RunContext)',
    "flowkit_on_run_end(result=Result(stop_reason='stop.iterations=3 reached'), ctx=RunContext)",
]


class CustomMetrics:
    @flowkit.hookimpl
    def flowkit_on_episode_end(self, episode, worker):
        episode.custom_metrics["len_x10"] = episode.length * 10

    @flowkit.hookimpl
    def flowkit_on_train_result(self, result, ctx):
        assert isinstance(ctx.workers, WorkerSet)
        result["custom_from_driver"] = 1.0


def test_custom_metrics_and_driver_columns(run_dir):
    flowkit.register(c := CustomMetrics())
    try:
        res = flowkit.train(local_overrides(run_dir, "env.factory=envs:FixedLenEnv", "runtime.num_workers=1",
                                            "runtime.num_envs_per_worker=1", "runtime.rollout_fragment_length=8",
                                            "ppo.minibatch_size=8", "ppo.num_epochs=1", "stop.iterations=2"))
    finally:
        flowkit.unregister(c)
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
        from flowkit_ppo.ppo import PPO
        return [type("OtherPPO", (PPO,), {})]  # keeps name "ppo"


def test_duplicate_algorithm_name_names_both_plugins():
    pm = get_plugin_manager(extra=[DuplicateName()])
    with pytest.raises(PluginError, match=r"algorithm 'ppo' is contributed twice: by plugin 'ppo' and by plugin"):
        pm.algorithms()


def test_plugins_from_config_are_loaded_and_bad_ones_named():
    pm, cfg = flowkit.load_config(["plugins=[ckpt_algos]"])
    assert pm.get_plugin("ckpt_algos") is not None
    with pytest.raises(PluginError, match="plugin module 'envs' .* implements no flowkit hook"):
        flowkit.load_config(["plugins=[envs]"])  # importable, but no plugin (issue 28 item 3: os was accepted)
    with pytest.raises(PluginError, match="no_such_module_xyz"):
        flowkit.load_config(["plugins=[no_such_module_xyz]"])


def test_an_installed_plugin_listed_in_plugins_is_loaded_once():
    """Issue 28 rerun: `plugins=[flowkit_ppo]` (already loaded by its entry point as `ppo`) was
    pluggy's ValueError traceback, "Plugin already registered under a different name"."""
    import flowkit_ppo
    pm, cfg = flowkit.load_config(["env=CartPole-v1", "plugins=[flowkit_ppo]"])
    assert pm.get_plugin("ppo") is flowkit_ppo and pm.get_plugin("flowkit_ppo") is None
    assert list(pm.algorithms(load=False)).count("ppo") == 1
