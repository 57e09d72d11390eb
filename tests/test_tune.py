"""Issue 14, part 5: ``flowkit tune`` on Ray Tune: the search-space grammar, trial resources
that fit the cluster, a 6-trial CartPole sweep on 2 CPUs with its table, and a seeds-only sweep
that ``flowkit plot`` draws as one group."""
import csv
import json
import os

import numpy as np
import pytest
from omegaconf import OmegaConf

import flowkit
from flowkit.cli import main
from flowkit.reporters import read_metrics
from flowkit.tune import STOPPED_EARLY, Dim, _status, parse_space, plan_resources, trial_dirname, trial_stop_reason

pytestmark = pytest.mark.ray
SMALL = ["algo=ppo", "env=CartPole-v1", "--no-tuned", "runtime.backend=local", "runtime.num_workers=1",
         "runtime.num_envs_per_worker=2", "runtime.rollout_fragment_length=32", "ppo.train_batch_size=64",
         "ppo.minibatch_size=32", "ppo.num_epochs=1", "run.reporters=[csv]"]


def test_grammar():
    plain, space = parse_space(["ppo.lr=choice(1e-3,3e-4)", "seed=range(3)", "ppo.clip_param=uniform(0.1,0.3)",
                                "model.hidden_sizes=choice([64,64],[32])", "env=CartPole-v1", "seed2=range(1,7,2)"])
    assert plain == ["env=CartPole-v1"]
    assert space["ppo.lr"] == Dim("choice", [1e-3, 3e-4]) and isinstance(space["ppo.lr"].args[0], float)
    assert space["seed"] == Dim("choice", [0, 1, 2]) and space["seed2"].args == [1, 3, 5]
    assert space["ppo.clip_param"] == Dim("uniform", [0.1, 0.3])
    assert space["model.hidden_sizes"].args == [[64, 64], [32]]
    assert trial_dirname({"ppo.lr": 3e-4, "model.hidden_sizes": [64, 64]}, 7) == \
        "00007-ppo.lr=0.0003,model.hidden_sizes=_64,_64_"
    assert parse_space(["x=choice('a,b', c d)"])[1]["x"].args == ["a,b", "c d"]  # the values read as YAML
    with pytest.raises(flowkit.ConfigError, match=r"^'x=choice\(a,\[b\)': its values are not a list"):
        parse_space(["x=choice(a,[b)"])
    for bad in ["seed=range(1.5)", "x=uniform(1)", "x=loguniform(0,1)", "x=choice()"]:
        with pytest.raises(flowkit.ConfigError, match="x=|seed="):
            parse_space([bad])


def test_usage_errors_are_one_line(tmp_path, capsys, monkeypatch):
    import importlib.util
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda m, *a: None if m == "optuna" else real(m, *a))
    for args, text in [(["seed=1"], "nothing to search"), (["ppo.lrr=choice(1,2)"], "did you mean `ppo.lr`"),
                       (["ppo.lr=choice(1e-3,-1)"], "ppo.lr=-1"),
                       (["search=optuna", "seed=range(2)"], "needs the optuna package")]:
        assert main(["tune", *SMALL, f"run.dir={tmp_path}/s", *args]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and text in err[0], err
    assert not os.path.exists(tmp_path / "s")


def test_flag_values_and_huge_spaces_are_one_line_errors_before_ray(tmp_path, capsys):
    """Issue 28 item 11: these announced "-2 trials" and swept forever, gave tracebacks, hung
    (range(1e8)) or overwrote an earlier sweep's table."""
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "tune_results.csv").write_text("run\n")
    for args, text in [(["num_samples=-1", "seed=range(2)"], "num_samples=-1 must be in [1, 10000]"),
                       (["max_concurrent=0", "seed=range(2)"], "max_concurrent=0 must be in [1, 10000]"),
                       (["grace_period=-5", "seed=range(2)"], "grace_period=-5.0 must be finite and > 0"),
                       (["metric=nope", "seed=range(2)"], "metric='nope' is not a result column"),
                       (["metric=episode_retrun_mean", "seed=range(2)"], "did you mean `episode_return_mean`"),
                       (["seed=range(100000000)"], "100000000 values, more than flowkit tune's 10000 trials"),
                       (["seed=range(200)", "ppo.lr=choice(1e-3,3e-4)", "num_samples=30"],
                        "400 grid points x 30 samples = 12000 trials"),
                       ([f"run.dir={tmp_path}/old", "seed=range(2)"], "holds an earlier sweep")]:
        run_dir = [] if any(x.startswith("run.dir=") for x in args) else [f"run.dir={tmp_path}/s"]
        assert main(["tune", *SMALL, *run_dir, *args]) == 2, args
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and text in err[0], (args, err)
    assert not os.path.exists(tmp_path / "s") and os.listdir(tmp_path / "old") == ["tune_results.csv"]


def test_a_trial_stopped_by_a_signal_to_the_sweep_says_so(tmp_path):
    """Issue 28: after a SIGTERM to `flowkit tune`, every trial's result.json said "stopped early
    by the Tune scheduler". The sweep writes the signal's name in its folder before it asks Tune
    to stop; a trial stopped then says the sweep was stopped by that signal, and so does the table."""
    sweep = str(tmp_path)
    assert trial_stop_reason(sweep) == STOPPED_EARLY  # no signal: the scheduler stopped it
    (tmp_path / ".stopped_by_signal").write_text("SIGTERM")
    assert trial_stop_reason(sweep) == "the sweep was stopped by SIGTERM"
    (tmp_path / ".stopped_by_signal").write_text("rm -rf /")  # not a signal name: ignored
    assert trial_stop_reason(sweep) == STOPPED_EARLY
    for reason, status in [("the sweep was stopped by SIGTERM", "stopped by SIGTERM"),
                           (STOPPED_EARLY, "stopped early"), ("stop.iterations=4 reached", "done")]:
        (tmp_path / "00000-seed=0").mkdir(exist_ok=True)
        (tmp_path / "00000-seed=0" / "result.json").write_text(json.dumps({"stop_reason": reason}))
        assert _status(sweep, "00000-seed=0", None) == status


def test_trial_resources_fit_the_cluster():
    cfg = OmegaConf.create({"runtime": {"backend": "ray", "num_workers": 2, "num_cpus_per_worker": 1.0}})
    pgf, extra, text = plan_resources(cfg, 2.0)  # 1 + 2 x 1 CPUs would never fit on 2
    assert extra == ["runtime.num_cpus_per_worker=0.5"] and sum(b["CPU"] for b in pgf.bundles) == 2.0
    assert "scaled to 0.5" in text
    pgf, extra, _ = plan_resources(cfg, 8.0)
    assert extra == [] and sum(b["CPU"] for b in pgf.bundles) == 3.0
    local = OmegaConf.create({"runtime": {"backend": "local", "num_workers": 2, "num_cpus_per_worker": 1.0}})
    assert plan_resources(local, 2.0)[0] == {"CPU": 1}


@pytest.mark.slow
def test_six_trials_on_two_cpus_with_table(ray_session, tmp_path, capsys):
    sweep = str(tmp_path / "sweep")
    rc = main(["tune", *SMALL, "run.reporters=[csv,checkpoint]", "plugins=[slow_end]", "stop.iterations=4",
               f"run.dir={sweep}", "ppo.lr=choice(1e-3,3e-4)", "seed=range(3)", "grace_period=2"])  # ASHA's rungs: 2, 8
    out = capsys.readouterr().out
    assert rc == 0, out
    first = out.splitlines()[0]
    assert first.startswith("flowkit tune: 6 trials (grid search") and "1 CPU each" in first and "on 2 CPUs" in first
    with open(os.path.join(sweep, "tune_results.csv")) as f:
        rows = list(csv.DictReader(f))
    # ASHA stopped some at iteration 2; one it stops at its budget's row is done (issue 48)
    assert len(rows) == 6 and {r["status"] for r in rows} == {"done", "stopped early"}
    assert {r["iterations"] for r in rows if r["status"] == "stopped early"} == {"2"}
    vals = [float(r["episode_return_mean"]) for r in rows]
    assert vals == sorted(vals, reverse=True)  # best first
    assert {(float(r["ppo.lr"]), int(r["seed"])) for r in rows} == {(lr, s) for lr in (1e-3, 3e-4) for s in range(3)}
    runs = sorted(d for d in os.listdir(sweep) if d[:5].isdigit())
    assert len(runs) == 6 and rows[0]["run"] in runs and rows[0]["run"] in out  # the table names the run folders
    for r in rows:  # a trial stopped early ends as one stopped by its own condition: every file, the reason
        d = os.path.join(sweep, r["run"])
        with open(os.path.join(d, "result.json")) as f:
            res = json.load(f)
        assert res["stop_reason"] == (STOPPED_EARLY if r["status"] == "stopped early" else "stop.iterations=4 reached")
        assert read_metrics(os.path.join(d, "metrics.csv"))[-1]["iteration"] == res["iteration"] == int(r["iterations"])
        assert os.listdir(os.path.join(d, "checkpoints")) == [f"iter_{res['iteration']:06d}"]


@pytest.mark.slow
def test_seeds_only_sweep_then_plot(ray_session, tmp_path, capsys):
    sweep = str(tmp_path / "seeds")
    assert main(["tune", *SMALL, "stop.iterations=3", f"run.dir={sweep}", "seed=range(3)"]) == 0
    out = capsys.readouterr().out
    assert "none early stopping" in out.splitlines()[0]  # a multirun: no seed is stopped early
    with open(os.path.join(sweep, "tune_results.csv")) as f:
        assert [r["status"] for r in csv.DictReader(f)] == ["done"] * 3
    png = str(tmp_path / "seeds.png")
    assert main(["plot", sweep, f"out={png}"]) == 0
    with open(png, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    with open(str(tmp_path / "seeds.csv")) as f:
        rows = list(csv.DictReader(f))
    assert {r["group"] for r in rows} == {"ppo CartPole-v1"} and {r["runs"] for r in rows} == {"3"}  # one group
    # the written series are the seeds' mean, std and range of the trials' metrics.csv, point by point
    per_seed = [{r["env_steps_sampled"]: r["episode_return_mean"] for r in read_metrics(
        os.path.join(sweep, d, "metrics.csv")) if "episode_return_mean" in r} for d in os.listdir(sweep) if d[:5].isdigit()]
    assert len(per_seed) == 3 and [float(r["env_steps_sampled"]) for r in rows] == sorted(per_seed[0]) == [64, 128, 192]
    for r in rows:
        vals = np.array([p[float(r["env_steps_sampled"])] for p in per_seed])
        got = [float(r[f"episode_return_mean_{k}"]) for k in ("mean", "std", "min", "max")]
        assert got == pytest.approx([vals.mean(), vals.std(), vals.min(), vals.max()])
    assert any(float(r["episode_return_mean_max"]) > float(r["episode_return_mean_min"]) for r in rows)  # a spread


@pytest.mark.slow
def test_a_trial_on_the_ray_backend_starts_its_workers_in_its_placement_group(ray_session, tmp_path, capsys):
    # the trial reserves every CPU of the session (1 learner + 2 workers x 0.5): its rollout
    # workers fit only inside the trial's placement group; placed outside it (an explicit
    # scheduling strategy), they waited for CPUs forever and the sweep hung (a newcomer's find)
    sweep = str(tmp_path / "ray")
    small = [a for a in SMALL if not a.startswith(("runtime.backend", "runtime.num_workers"))]
    rc = main(["tune", *small, "runtime.backend=ray", "runtime.num_workers=2", "stop.iterations=2",
               "runtime.start_timeout_s=60", f"run.dir={sweep}", "seed=range(1)"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "1 learner + 2 rollout workers" in out.splitlines()[0]
    with open(os.path.join(sweep, "tune_results.csv")) as f:
        rows = list(csv.DictReader(f))
    assert [r["status"] for r in rows] == ["done"] and int(rows[0]["iterations"]) == 2
