"""Reporters: the engine's outputs as plugins chosen by ``run.reporters``, a user reporter in
place of the CSV writer, the crash checkpoint, wrapper hooks."""
import csv
import json
import os

import numpy as np
import pytest

import flowkit
from flowkit.cli import main
from flowkit.hooks import PluginError

# 1 worker x 1 sub-env x 8 steps per iteration
TINY = ["runtime.backend=local", "env.factory=envs:FixedLenEnv", "runtime.num_workers=1",
        "runtime.num_envs_per_worker=1", "runtime.rollout_fragment_length=8", "ppo.minibatch_size=8",
        "ppo.num_epochs=1"]


class JsonLinesReporter:
    """A user's replacement of the CSV writer: one JSON line per iteration."""
    name = "jsonl"

    def flowkit_on_run_start(self, run_dir, history):
        self.f = open(os.path.join(run_dir, "metrics.jsonl"), "a")

    def flowkit_report(self, result):
        self.f.write(json.dumps({k: v for k, v in result.items() if isinstance(v, (int, float, str))}) + "\n")
        self.f.flush()

    def flowkit_on_train_end(self, error):
        self.f.close()


class JsonLinesPlugin:
    @flowkit.hookimpl
    def flowkit_add_reporters(self):
        return [JsonLinesReporter]


def test_builtin_reporters_off_and_csv_replaced_by_a_user_plugin(run_dir):
    """Acceptance: progress, csv and plot disabled by config, the CSV writer replaced by a
    user's reporter; the run still trains and checkpoints."""
    res = flowkit.train(TINY + [f"run.dir={run_dir}", "run.reporters=[jsonl,checkpoint,evaluation]",
                                "checkpoint.every_iters=2", "stop.iterations=4"], plugins=[JsonLinesPlugin()])
    files = set(os.listdir(run_dir))
    assert "metrics.csv" not in files and "learning_curve.png" not in files
    assert {"metrics.jsonl", "result.json", "config.yaml", "checkpoints"} <= files
    rows = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    assert [r["iteration"] for r in rows] == [1, 2, 3, 4]
    assert [r["env_steps_sampled"] for r in rows] == [8, 16, 24, 32]
    assert rows[-1]["num_updates"] > 0  # it trained
    assert [r["iteration"] for r in res.history] == [1, 2, 3, 4]
    assert sorted(os.listdir(os.path.join(run_dir, "checkpoints"))) == ["iter_000002", "iter_000004"]
    assert res.checkpoint == os.path.join(run_dir, "checkpoints", "iter_000004")
    algo = flowkit.Algorithm.from_checkpoint(res.checkpoint, trust_config=True)
    assert int(algo.compute_actions(np.zeros(1, np.float32))) in (0, 1)


def test_unknown_reporter_is_a_config_error(run_dir, capsys):
    rc = main(["train", "env=CartPole-v1", "runtime.backend=local", f"run.dir={run_dir}",
               "run.reporters=[csv,tensorbord]"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1
    assert "run.reporters" in err[0] and "'tensorbord'" in err[0]
    assert "known: checkpoint, csv, evaluation, mlflow, plot, progress, tensorboard, timing, wandb" in err[0]
    assert not os.path.exists(run_dir)


def test_a_reporter_name_contributed_twice_names_both_plugins():
    class Csv2:
        name = "csv"

    class Dup:
        @flowkit.hookimpl
        def flowkit_add_reporters(self):
            return [Csv2]
    pm = flowkit.get_plugin_manager(extra=[Dup()])
    with pytest.raises(PluginError, match=r"reporter 'csv' is contributed twice: by plugin 'flowkit.reporters'"):
        pm.reporters()


def test_timing_reporter_wraps_iterations(run_dir):
    res = flowkit.train(TINY + [f"run.dir={run_dir}", "stop.iterations=3", "run.reporters=[csv,timing]"])
    assert "checkpoints" not in os.listdir(run_dir) and res.checkpoint is None
    cols = next(csv.reader(open(os.path.join(run_dir, "metrics.csv"))))
    assert "perf/iteration_ms" in cols and "perf/driver_overhead_ms" in cols
    assert all(r["perf/iteration_ms"] > 0 for r in res.history)
    assert "perf/driver_overhead_ms" not in res.history[0]  # no iteration before the first


def test_progress_bar_on_stderr(run_dir, capsys):
    flowkit.train(TINY + [f"run.dir={run_dir}", "stop.iterations=2", "run.reporters=[progress]"])
    err = capsys.readouterr().err
    assert "ppo envs:FixedLenEnv" in err and "return=3.0" in err and "16step" in err
    assert sorted(os.listdir(run_dir)) == ["config.yaml", "result.json"]


def test_progress_bar_of_a_resumed_run_starts_at_the_restored_steps_and_keeps_a_total(capsys):
    from types import SimpleNamespace

    from omegaconf import OmegaConf

    from flowkit.reporters import ProgressReporter
    cfg = OmegaConf.create({"algo": "ppo", "env": {"id": "CartPole-v1"}, "stop": {"env_steps": 1200}})
    rep = ProgressReporter()
    rep.flowkit_on_run_start(SimpleNamespace(config=cfg, counters={"env_steps_sampled": 1000}, policy_specs={}))
    assert (rep.bar.n, rep.bar.initial, rep.bar.total) == (1000, 1000, 1200)  # rate: new steps only
    rep.flowkit_report({"episode_return_mean": 1.0, "env_steps_per_s": 9.0, "env_steps_sampled": 1536})
    assert (rep.bar.n, rep.bar.total) == (1536, 1536)
    rep.flowkit_on_train_end()
    assert "100%" in capsys.readouterr().err
    # no episode yet (or an offline run, which plays none): no return shown, not "return=nan"
    rep = ProgressReporter()
    rep.flowkit_on_run_start(SimpleNamespace(config=cfg, counters={"env_steps_sampled": 0}, policy_specs={}))
    rep.flowkit_report({"episode_return_mean": float("nan"), "env_steps_per_s": 9.0, "env_steps_sampled": 100})
    rep.bar.refresh()
    rep.flowkit_on_train_end()
    err = capsys.readouterr().err
    assert "steps/s=9" in err and "return" not in err, err


class FailAt2:
    def __init__(self):
        self.ended = []

    @flowkit.hookimpl
    def flowkit_on_train_result(self, result):
        if result["iteration"] == 2:
            raise RuntimeError("boom at 2")

    @flowkit.hookimpl
    def flowkit_on_train_end(self, summary, error):
        self.ended.append((summary.get("iteration"), type(error).__name__))

    @flowkit.hookimpl
    def flowkit_on_run_end(self):
        self.ended.append("run_end")


def test_crash_checkpoint_and_train_end_sees_the_error(run_dir):
    f = FailAt2()
    with pytest.raises(RuntimeError, match="boom at 2"):
        flowkit.train(TINY + [f"run.dir={run_dir}", "stop.iterations=5",
                              "run.reporters=[csv,checkpoint]"], plugins=[f])
    assert f.ended == [(1, "RuntimeError")]  # the last complete row; no run end
    assert os.listdir(os.path.join(run_dir, "checkpoints")) == ["crash"]
    assert len(list(csv.DictReader(open(os.path.join(run_dir, "metrics.csv"))))) == 1
    assert not os.path.exists(os.path.join(run_dir, "result.json"))


class PlanWrapper:
    """Wraps whichever plan won flowkit_build_plan (firstresult) and each iteration."""

    def __init__(self):
        self.steps, self.iterations = 0, 0

    @flowkit.hookimpl(wrapper=True)
    def flowkit_build_plan(self, ctx):
        plan = yield

        def count(item):
            self.steps += 1
            return item
        return plan.for_each(count)

    @flowkit.hookimpl(wrapper=True)
    def flowkit_train_iteration(self):
        row = yield
        self.iterations += row is not None
        return row


def test_wrapper_hooks_around_the_plan_and_iterations(run_dir):
    w = PlanWrapper()
    res = flowkit.train(TINY + [f"run.dir={run_dir}", "stop.iterations=3", "run.reporters=[]"], plugins=[w])
    assert (w.steps, w.iterations) == (3, 3) and res.metrics["iteration"] == 3
    assert sorted(os.listdir(run_dir)) == ["config.yaml", "result.json"]


class CountingReporter:
    """Keeps a count across a resume: a reporter is plugin ``reporter:<name>``, so its state
    is checkpointed under that name (a logger would keep its run id this way)."""
    name = "counting"
    seen: list = []

    def __init__(self):
        self.n = 0

    def flowkit_report(self, result):
        self.n += 1
        CountingReporter.seen.append((result["iteration"], self.n))

    def flowkit_state_dict(self):
        return {"n": self.n}

    def flowkit_load_state_dict(self, state):
        self.n = state["n"]


class CountingPlugin:
    @flowkit.hookimpl
    def flowkit_add_reporters(self):
        return [CountingReporter]


def test_reporter_state_survives_a_resume(run_dir):
    CountingReporter.seen = []
    common = TINY + ["run.reporters=[csv,checkpoint,counting]"]
    flowkit.train(common + [f"run.dir={run_dir}", "stop.iterations=2"], plugins=[CountingPlugin()])
    flowkit.train(common + [f"resume={run_dir}", "stop.iterations=3"], plugins=[CountingPlugin()])
    assert CountingReporter.seen == [(1, 1), (2, 2), (3, 3)]


def test_settings_without_their_reporter_warn(run_dir):
    with pytest.warns(UserWarning, match=r"evaluation.interval=2 has no effect: `evaluation` is not in run.reporters"):
        flowkit.train(TINY + [f"run.dir={run_dir}", "stop.iterations=1", "evaluation.interval=2",
                              "run.reporters=[csv]"])
