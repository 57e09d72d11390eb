"""Issue 14, part 6: tuned configs live at ``configs/<algo>/<env-id>.yaml`` (multi-agent games
under ``configs/multiagent/``), are valid, and ``flowkit train`` without ``-c`` uses the one for
its algo and env, saying so on its first line."""
import glob
import os
import subprocess
import sys

import pytest
import yaml

from flowkit._prepare import tuned_config_path
from flowkit.engine import load_config

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = sorted(glob.glob(os.path.join(REPO, "configs", "*", "*.yaml")))


@pytest.mark.slow
def test_layout_and_every_config_is_valid():
    assert not glob.glob(os.path.join(REPO, "configs", "*.yaml")), "configs/<algo>/<env-id>.yaml only"
    assert len(CONFIGS) >= 8
    for path in CONFIGS:
        algo_dir, name = path.split(os.sep)[-2:]
        _, cfg = load_config([], path)
        if algo_dir != "multiagent" and algo_dir != "apex":  # a `pkg:Id-v0` env id is filed as Id-v0
            assert (cfg.algo, cfg.env.id.rpartition(":")[2]) == (algo_dir, name[:-5]), path
            assert os.path.samefile(tuned_config_path(cfg.algo, cfg.env.id), path)


def test_every_single_agent_config_has_a_target_line():
    """bench/tuned_configs.py checks each single-agent config against its ``# target:`` line on
    seeds 0, 1 and 2; the metric is one the run reports."""
    sys.path.insert(0, os.path.join(REPO, "bench"))
    try:
        import tuned_configs
    finally:
        sys.path.remove(os.path.join(REPO, "bench"))
    found = tuned_configs.targets()
    for path in CONFIGS:
        name = os.path.relpath(path, os.path.join(REPO, "configs"))[:-5]
        if not name.startswith("multiagent/"):
            assert name in found, f"{path}: no '# target: METRIC >= X within N env steps on seeds 0 1 2' line"
            _, metric, _, budget, seeds, _ = found[name]
            assert (metric in ("episode_return_mean", "evaluation_return_mean")
                    or metric.startswith("learner/")) and budget > 0, path  # a learner stat: MAML's adapted return
            assert {0, 1, 2} <= set(seeds), path


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "flowkit.cli", *args], capture_output=True, text=True, timeout=120,
                          cwd=REPO)


def test_train_without_c_uses_the_tuned_config_and_says_so():
    p = _cli("train", "--print-config", "algo=dqn", "env=CartPole-v1", "dqn.num_replay_shards=2")
    assert p.returncode == 0, p.stderr
    first = p.stdout.splitlines()[0]
    assert first.startswith("# tuned config: configs/dqn/CartPole-v1.yaml"), first
    _, tuned = load_config(["dqn.num_replay_shards=2"], os.path.join(REPO, "configs", "dqn", "CartPole-v1.yaml"))
    printed = yaml.safe_load(p.stdout)
    assert printed["dqn"]["training_intensity"] == tuned.dqn.training_intensity
    assert printed["dqn"]["num_replay_shards"] == 2  # overrides still win


@pytest.mark.parametrize("args", [["--no-tuned"], ["-c", os.path.join(REPO, "configs", "ppo", "Pendulum-v1.yaml")],
                                  ["env=MountainCar-v0", "algo=ppo"]])
def test_no_tuned_line_with_c_or_no_tuned_or_no_file(args):
    p = _cli("train", "--print-config", "algo=dqn", "env=CartPole-v1", *args)
    assert p.returncode == 0, p.stderr
    assert "tuned config" not in p.stdout


def test_configs_are_package_data():
    """flowkit/configs links to configs/ and pyproject ships it: a wheel holds the files."""
    assert os.path.samefile(os.path.join(REPO, "flowkit", "configs"), os.path.join(REPO, "configs"))
    with open(os.path.join(REPO, "pyproject.toml")) as f:
        assert 'flowkit = ["configs/**/*.yaml"]' in f.read()


@pytest.mark.slow
def test_a_wheel_install_finds_the_tuned_configs(tmp_path):
    """A non-editable install (a wheel) carries the configs as package data."""
    import shutil
    src = tmp_path / "src"  # a copy: an in-tree build would leave build/ and an egg-info in the checkout
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "flowkit", "configs"):
        copy = shutil.copytree if os.path.isdir(os.path.join(REPO, name)) else shutil.copy
        copy(os.path.join(REPO, name), src / name, **({"symlinks": True, "ignore": shutil.ignore_patterns(
            "__pycache__")} if copy is shutil.copytree else {}))
    pip = [sys.executable, "-m", "pip"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path / "w"), str(src)],
                   check=True, timeout=300, capture_output=True, cwd=tmp_path)
    (wheel,) = glob.glob(str(tmp_path / "w" / "flowkit-*.whl"))
    subprocess.run([*pip, "install", "--no-deps", "-q", "--target", str(tmp_path / "site"), wheel],
                   check=True, timeout=300, capture_output=True)
    code = ("import flowkit, sys; from flowkit._prepare import tuned_config_path as t; "
            "print(flowkit.__file__); print(t('dqn', 'CartPole-v1'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                         env={**os.environ, "PYTHONPATH": str(tmp_path / "site")}).stdout.split()
    assert out[0].startswith(str(tmp_path / "site")) and out[1] == str(tmp_path / "site" / "flowkit" / "configs" /
                                                                           "dqn" / "CartPole-v1.yaml")
    assert not os.path.islink(str(tmp_path / "site" / "flowkit" / "configs"))


def test_a_plugin_ships_its_tuned_configs_in_its_package(tmp_path, monkeypatch):
    """Issue 27 item 5: a plugin's ``<package>/configs/<algo>/<env-id>.yaml``, found through its
    ``flowkit`` entry point, is the tuned config of its algorithm (flowkit's own come first)."""
    import importlib.metadata as md
    pkg = tmp_path / "my_algo_pkg"
    (pkg / "configs" / "my_algo").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "configs" / "my_algo" / "CartPole-v1.yaml").write_text("algo: my_algo\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    eps = md.EntryPoints([*md.entry_points(group="flowkit"),
                          md.EntryPoint(name="my_algo", value="my_algo_pkg", group="flowkit")])
    monkeypatch.setattr("flowkit.core.names.plugin_entry_points", lambda: eps)
    assert tuned_config_path("my_algo", "CartPole-v1") == str(pkg / "configs" / "my_algo" / "CartPole-v1.yaml")
    assert tuned_config_path("my_algo", "Pendulum-v1") is None
    assert os.path.samefile(tuned_config_path("ppo", "CartPole-v1"), os.path.join(REPO, "configs", "ppo",
                                                                                   "CartPole-v1.yaml"))


@pytest.mark.slow
def test_no_shipped_config_warns_about_itself():
    """Issue 48 item 13: configs/ddppo/CartPole-v1.yaml warned that its own minibatch_size (256)
    was larger than a worker's batch (128). A shipped config's set-up warns of nothing (MuJoCo's
    own deprecation note about Gymnasium's model files and DeprecationWarnings, which Python
    hides, aside)."""
    import warnings

    from flowkit.engine import setup
    said = {}
    for path in CONFIGS:
        pm, cfg = load_config([], path)
        if cfg.get("input") is not None and cfg.input.dataset:  # (a dataset the user records first)
            continue
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            setup(cfg, pm).workers.stop()
        said[os.path.relpath(path, REPO)] = [str(w.message) for w in seen if not str(w.message).startswith("MuJoCo:")
                                             and not issubclass(w.category, DeprecationWarning)]  # (hidden by default)
    assert {k: v for k, v in said.items() if v} == {}
