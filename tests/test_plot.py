"""Issue 14, part 4: ``flowkit plot`` groups runs by config (seeds together), plots the seeds'
mean and range, and writes the plotted series beside the PNG; the series match metrics.csv."""
import csv
import os
import shutil

import numpy as np
import pytest
from conftest import local_overrides

import flowkit
from flowkit.plot import main, plot_runs
from flowkit.reporters import read_metrics

SMALL = ["env=CartPole-v1", "runtime.num_workers=1", "runtime.num_envs_per_worker=2", "ppo.minibatch_size=32",
         "runtime.rollout_fragment_length=32", "ppo.train_batch_size=64", "ppo.num_epochs=1"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("plot")
    out = {}
    for lr in (1e-3, 1e-4):
        for seed in (0, 1, 2):
            d = str(root / f"lr{lr}-s{seed}")
            flowkit.train(local_overrides(d, *SMALL, f"seed={seed}", f"ppo.lr={lr}", "stop.iterations=6"))
            out[(lr, seed)] = d
    return root, out


def test_series_are_the_seeds_mean_and_range_of_metrics_csv(runs, tmp_path):
    root, dirs = runs
    png = str(tmp_path / "fig" / "curves.png")
    assert main([str(root), "--out", png]) == 0
    assert os.path.getsize(png) > 0
    with open(str(tmp_path / "fig" / "curves.csv")) as f:
        rows = list(csv.DictReader(f))
    assert {r["group"] for r in rows} == {"ppo.lr=0.001", "ppo.lr=0.0001"}
    for lr in (1e-3, 1e-4):
        mine = [r for r in rows if r["group"] == f"ppo.lr={lr}"]
        per_seed = [{r["env_steps_sampled"]: r["episode_return_mean"] for r in read_metrics(
            os.path.join(dirs[(lr, s)], "metrics.csv")) if "episode_return_mean" in r} for s in (0, 1, 2)]
        xs = sorted(set.intersection(*(set(p) for p in per_seed)))
        assert [float(r["env_steps_sampled"]) for r in mine] == xs  # same x grid for every seed here
        for r, x in zip(mine, xs):
            vals = np.array([p[x] for p in per_seed])
            assert float(r["episode_return_mean_mean"]) == pytest.approx(vals.mean())
            assert float(r["episode_return_mean_min"]) == pytest.approx(vals.min())
            assert float(r["episode_return_mean_max"]) == pytest.approx(vals.max())
            assert float(r["episode_return_mean_std"]) == pytest.approx(vals.std())
            assert r["runs"] == "3"


def test_time_axis_one_group_and_errors(runs, tmp_path, capsys):
    _, dirs = runs
    res = plot_runs([dirs[(1e-3, 0)], dirs[(1e-3, 1)]], x="time", out=str(tmp_path / "t.png"))
    (label, pts), = res.items()
    assert label == "ppo CartPole-v1"
    assert max(p["runs"] for p in pts) == 2 and min(p["runs"] for p in pts) >= 1  # each time grid its own
    short = tmp_path / "short"  # a seed that stopped after 3 rows: the later points average the others
    short.mkdir()
    shutil.copy(os.path.join(dirs[(1e-3, 2)], "config.yaml"), short / "config.yaml")
    with open(os.path.join(dirs[(1e-3, 2)], "metrics.csv")) as f:
        (short / "metrics.csv").write_text("".join(f.readlines()[:4]))
    (pts,) = plot_runs([dirs[(1e-3, 0)], dirs[(1e-3, 1)], str(short)], out=str(tmp_path / "s.png")).values()
    cut = read_metrics(str(short / "metrics.csv"))[-1]["env_steps_sampled"]
    assert [p["runs"] for p in pts] == [3 if p["x"] <= cut else 2 for p in pts] and pts[-1]["x"] > cut
    full = [{r["env_steps_sampled"]: r["episode_return_mean"] for r in read_metrics(
        os.path.join(dirs[(1e-3, s)], "metrics.csv")) if "episode_return_mean" in r} for s in (0, 1)]
    assert pts[-1]["mean"] == pytest.approx((full[0][pts[-1]["x"]] + full[1][pts[-1]["x"]]) / 2)
    assert main([str(tmp_path / "nothing"), "--out", str(tmp_path / "x.png")]) == 2
    assert "no run folder" in capsys.readouterr().err
    assert main([dirs[(1e-3, 0)], "--metric", "nope", "--out", str(tmp_path / "x.png")]) == 2
