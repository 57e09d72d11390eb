"""Issue 14, part 4: ``flowkit plot`` groups runs by config (seeds together), plots the seeds'
mean and range, and writes the plotted series beside the PNG; the series match metrics.csv."""
import csv
import os
import shutil

import numpy as np
import pytest
from conftest import local_overrides

import flowkit
from flowkit.cli import main
from flowkit.plot import plot_runs
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
    assert main(["plot", str(root), f"out={png}"]) == 0
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
    assert main(["plot", str(tmp_path / "nothing"), f"out={tmp_path / 'x.png'}"]) == 2
    assert "no run folder" in capsys.readouterr().err
    assert main(["plot", dirs[(1e-3, 0)], "metric=nope", f"out={tmp_path / 'x.png'}"]) == 2
    assert "no run has both the column 'nope' and 'env_steps_sampled' in its metrics.csv" in capsys.readouterr().err
    assert main(["plot", dirs[(1e-3, 0)], "metric=episode_reward_mean", f"out={tmp_path / 'x.png'}"]) == 2
    assert "did you mean `episode_return_mean`?" in capsys.readouterr().err  # RLlib's name
    assert main(["plot", dirs[(1e-3, 0)], "metric=episode_len_mean_", f"out={tmp_path / 'x.png'}"]) == 2
    assert "did you mean `episode_len_mean`?" in capsys.readouterr().err


def _forged_run(path, cfg, rows):
    """A run folder with ``config.yaml`` (nested from dotted ``cfg``) and ``metrics.csv`` rows
    ``(env_steps_sampled, episode_return_mean)``: no training needed."""
    import yaml
    nested: dict = {}
    for k, v in cfg.items():
        d = nested
        *head, last = k.split(".")
        for h in head:
            d = d.setdefault(h, {})
        d[last] = v
    os.makedirs(path)
    with open(os.path.join(path, "config.yaml"), "w") as f:
        yaml.safe_dump(nested, f)
    with open(os.path.join(path, "metrics.csv"), "w") as f:
        f.write("iteration,env_steps_sampled,episode_return_mean\n")
        f.writelines(f"{i},{x},{y}\n" for i, (x, y) in enumerate(rows))


def test_two_algorithms_labelled_by_shared_keys_and_counts_agree(tmp_path, capsys):
    """Issue 27 item 9: comparing two algorithms labels each curve by the few keys that tell the
    groups apart (not every section key one of them lacks); two seeds are '2 runs' in the console
    and the legend, and the console's figure is at the last point both seeds reach."""
    common = {"env.id": "CartPole-v1", "runtime.num_workers": 2, "stop.env_steps": 1000}
    ppo = {**common, "algo": "ppo", **{f"ppo.k{i}": i for i in range(20)}}
    dqn = {**common, "algo": "dqn", **{f"dqn.k{i}": -i for i in range(20)}}
    _forged_run(str(tmp_path / "p0"), {**ppo, "seed": 0}, [(100, 10.0), (200, 20.0), (300, 30.0)])
    _forged_run(str(tmp_path / "p1"), {**ppo, "seed": 1}, [(100, 12.0), (200, 22.0)])
    _forged_run(str(tmp_path / "d0"), {**dqn, "seed": 0}, [(100, 5.0), (200, 6.0)])
    out = str(tmp_path / "cmp.png")
    assert main(["plot", str(tmp_path / "p0"), str(tmp_path / "p1"), str(tmp_path / "d0"), f"out={out}"]) == 0
    text = capsys.readouterr().out
    assert "algo=ppo: 2 runs, episode_return_mean 21 (min 20, max 22) at env_steps_sampled=200; " \
           "1 of them go on to 300" in text
    assert "algo=dqn: 1 run, episode_return_mean 6 " in text
    # many shared keys that differ: at most three in the label, the rest counted
    _forged_run(str(tmp_path / "w0"), {**ppo, **{f"runtime.x{i}": 0 for i in range(6)}}, [(100, 1.0)])
    _forged_run(str(tmp_path / "w1"), {**ppo, **{f"runtime.x{i}": i + 1 for i in range(6)}}, [(100, 2.0)])
    res = plot_runs([str(tmp_path / "w0"), str(tmp_path / "w1")], out=str(tmp_path / "w.png"))
    assert sorted(res) == ["runtime.x0=0 runtime.x1=0 runtime.x2=0 +3 more",
                           "runtime.x0=1 runtime.x1=2 runtime.x2=3 +3 more"]


@pytest.mark.parametrize("damage,says", [
    (lambda run: open(os.path.join(run, "config.yaml"), "w").write("algo: [ppo\n"), "config.yaml' is not valid YAML: line 2"),
    (lambda run: open(os.path.join(run, "config.yaml"), "w").write("- 1\n"), "config.yaml' must hold a mapping at the top"),
    (lambda run: open(os.path.join(run, "metrics.csv"), "wb").write(b"\x00\xff\xfe\x89PNG" * 64),
     "metrics.csv: not a UTF-8 text file"),
])
def test_a_damaged_run_file_is_exit_1_and_what_was_given_exit_2(tmp_path, capsys, damage, says):
    """Issue 28 rerun: a run's unreadable config.yaml or metrics.csv exited 2, as a bad --metric
    does; a damaged run folder is exit 1 (as for evaluate, export and resume)."""
    run = str(tmp_path / "run")
    _forged_run(run, {"algo": "ppo", "env.id": "CartPole-v1"}, [(64, 1.0), (128, 2.0)])
    damage(run)
    assert main(["plot", run, f"out={tmp_path / 'p.png'}"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and says in err, err
    assert not os.path.exists(tmp_path / "p.png")
