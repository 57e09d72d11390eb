"""Issue 48 (a newcomer's rough edges, fifth session): what a user of RLlib or SB3 expects of
run.dir, tune's search expressions and stops, plot's out=, a quiet run without a stop, the
public inference API with a wrongly shaped observation, and read-only run folders."""
import os
import stat
import types

import numpy as np
import pytest
from conftest import local_overrides

import flowkit
from flowkit.cli import main
from flowkit.config import ConfigError, build_config
from flowkit.tune import TuneReport, parse_space

SMALL = ["env=CartPole-v1", "runtime.num_workers=1", "runtime.num_envs_per_worker=2", "ppo.minibatch_size=32",
         "runtime.rollout_fragment_length=32", "ppo.train_batch_size=64", "ppo.num_epochs=1"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One tiny PPO CartPole run (2 iterations of 64 env steps)."""
    d = str(tmp_path_factory.mktemp("newcomer") / "run")
    flowkit.train(local_overrides(d, *SMALL, "stop.iterations=2"), verbose=False)
    return d


def test_run_dir_expands_home_and_environment_variables(tmp_path, monkeypatch):
    """`run.dir=~/x` made a folder named `~` in the working directory."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("FK_DATA", str(tmp_path / "data"))
    cfg = build_config(["algo=ppo", "env=CartPole-v1", "run.dir=~/runs/x", "run.output=$FK_DATA/d", "resume=~/r"])
    assert (cfg.run.dir, cfg.run.output, cfg.resume) == (f"{tmp_path}/runs/x", f"{tmp_path}/data/d", f"{tmp_path}/r")
    monkeypatch.delenv("FK_NOPE", raising=False)
    with pytest.raises(ConfigError) as e:
        build_config(["algo=ppo", "env=CartPole-v1", "run.dir=$FK_NOPE/x"])
    assert str(e.value) == "run.dir='$FK_NOPE/x': the environment variable FK_NOPE is not set"


def test_a_malformed_search_expression_names_the_key_the_text_and_what_is_expected(capsys):
    """`ppo.lr='choice(1e-3'` was taken as a plain value, and refused as not a float."""
    want = ("`ppo.lr`: 'choice(1e-3' is not a complete search expression: expected choice(...) with its closing ')' "
            "last (choice(a,b,...), range(n), uniform(lo,hi), loguniform(lo,hi), randint(lo,hi))")
    with pytest.raises(ConfigError) as e:
        parse_space(["ppo.lr=choice(1e-3"])
    assert str(e.value) == want
    assert main(["tune", "algo=ppo", "env=CartPole-v1", "ppo.lr=choice(1e-3"]) == 2
    assert capsys.readouterr().err == f"flowkit tune: error: {want}\n"
    with pytest.raises(ConfigError, match=r"^`seed`: 'range \(3' is not a complete search expression: expected range"):
        parse_space(["seed=range (3"])


def test_a_trial_stopped_at_its_own_budget_is_done_not_stopped_early(monkeypatch):
    """Tune's scheduler may stop a trial on the row that meets its own stop condition (a tiny
    budget: the first row passes every rung); the run said "stopped early by the Tune scheduler"."""
    import ray.tune

    def report(metrics):  # Tune's answer when its scheduler stops the trial
        raise SystemExit(0)
    monkeypatch.setattr(ray.tune, "report", report)
    reasons = []
    cfg = build_config(["algo=ppo", "env=CartPole-v1", "stop.env_steps=2000"])
    ctx = types.SimpleNamespace(config=cfg, request_stop=reasons.append)
    TuneReport(None).flowkit_report({"env_steps_sampled": 2048, "iteration": 1}, ctx)
    assert reasons == []  # the run ends by `stop.env_steps=2000 reached`
    TuneReport(None).flowkit_report({"env_steps_sampled": 1024, "iteration": 1}, ctx)
    assert reasons == ["stopped early by the Tune scheduler"]


def test_plot_takes_its_format_from_the_suffix(trained, tmp_path, capsys):
    """`flowkit plot out=x.txt` wrote PNG data into x.txt."""
    assert main(["plot", trained, f"out={tmp_path}/x.txt"]) == 2
    assert capsys.readouterr().err == (f"flowkit plot: error: out='{tmp_path}/x.txt': the image format is taken from "
                                       "the suffix: .png, .pdf or .svg, got .txt\n")
    assert main(["plot", trained, f"out={tmp_path}/x"]) == 2
    assert capsys.readouterr().err.endswith("the suffix: .png, .pdf or .svg, got none\n")
    assert os.listdir(tmp_path) == []
    heads = {"svg": b"<?xml", "pdf": b"%PDF", "png": b"\x89PNG", "PNG": b"\x89PNG"}
    for suffix, head in heads.items():
        assert main(["plot", trained, f"out={tmp_path}/c.{suffix}"]) == 0
        with open(tmp_path / f"c.{suffix}", "rb") as f:
            assert f.read(len(head)) == head, suffix


class _StopAt:
    def __init__(self, n):
        self.n = n

    def flowkit_on_train_result(self, result, ctx):
        if result["iteration"] == self.n:
            ctx.request_stop("enough")


def test_a_quiet_run_without_a_stop_condition_warns(tmp_path, capsys):
    """flowkit.train(verbose=False) with no stop.* key said nothing (verbose=True and the CLI
    print that training goes on until interrupted)."""
    with pytest.warns(UserWarning) as got:
        res = flowkit.train(local_overrides(str(tmp_path / "r"), *SMALL), plugins=[_StopAt(1)], verbose=False)
    assert res.stop_reason == "enough"
    assert [str(w.message) for w in got if "stop condition" in str(w.message)] == [
        "no stop condition (stop.env_steps, stop.iterations, stop.episode_return_mean, stop.evaluation_return_mean "
        "or stop.time_s): training goes on until interrupted (Ctrl-C saves a checkpoint and stops)"]
    assert capsys.readouterr().out == ""


def test_compute_actions_names_the_expected_and_given_shapes(trained):
    """A wrongly shaped observation reached torch: `mat1 and mat2 shapes cannot be multiplied`."""
    algo = flowkit.Algorithm.from_checkpoint(trained)
    space = algo.get_policy().observation_space
    assert algo.compute_actions(np.zeros(4, np.float32)) in (0, 1)
    assert algo.compute_actions(np.zeros((3, 4), np.float32)).shape == (3,)
    for obs, shown in [(np.zeros(3), "(3,)"), (np.zeros((2, 3)), "(2, 3)"), (np.zeros((2, 2, 4)), "(2, 2, 4)")]:
        with pytest.raises(ValueError) as e:
            algo.compute_actions(obs)
        assert str(e.value) == (f"obs has shape {shown}; the observation space {space} takes (4,) (one observation) "
                                "or (B, 4) (a batch)")


def test_evaluate_and_export_of_a_read_only_run_folder(trained, tmp_path, capsys, monkeypatch):
    """A read-only run folder (chmod -w): evaluate refused to run (`the folder ... is not
    writable`), export failed after loading with torch's `open file failed ... Permission denied`.
    Now evaluate prints its table and writes nothing; export without out= is one line before the
    policy loads, and with out= elsewhere it works."""
    import shutil
    ro = str(tmp_path / "ro")
    shutil.copytree(trained, ro)
    for d, _, fs in os.walk(ro):
        for p in [d, *(os.path.join(d, f) for f in fs)]:
            os.chmod(p, os.stat(p).st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    if os.geteuid() == 0:  # root writes anyway: the folder's mode as an unprivileged user sees it
        access = os.access
        monkeypatch.setattr(os, "access", lambda p, m, **kw: access(p, m, **kw) and not (
            m & os.W_OK and os.path.abspath(p).startswith(ro)))
    before = sorted(os.path.join(d, f) for d, _, fs in os.walk(ro) for f in fs)
    ck = os.path.join(ro, "checkpoints", "iter_000002")
    assert main(["evaluate", ro, "episodes=2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == f"evaluation.json not written: the checkpoint's folder {ck} is read-only"
    assert out[-2].split()[:2] == ["episode", "2"]
    assert main(["export", ro, "format=torchscript"]) == 2
    assert capsys.readouterr().err == (f"flowkit export: error: the checkpoint's folder {ck} is read-only: give "
                                       "out=FILE to write the policy elsewhere\n")
    assert sorted(os.path.join(d, f) for d, _, fs in os.walk(ro) for f in fs) == before
    assert main(["export", ro, "format=torchscript", f"out={tmp_path}/p.pt"]) == 0
    assert os.path.getsize(tmp_path / "p.pt") > 0


def test_a_factory_given_as_env_id_is_pointed_to_env_factory(capsys):
    """`env=pkg.mod:parallel_env` (a PettingZoo factory) ended in Gymnasium's `Environment
    `parallel_env` doesn't exist`."""
    assert main(["train", "algo=ppo", "env=flowkit.testing.envs:match", "--dry-run"]) == 2
    assert capsys.readouterr().err == (
        "flowkit: config error: env.id='flowkit.testing.envs:match' names a function, not a Gymnasium id "
        "(pkg:Name-v0): a function that builds the env (a PettingZoo parallel_env, a gymnasium.Env factory) is "
        "given as env.factory=flowkit.testing.envs:match\n")


def test_a_stopped_sweep_gives_no_tuner_restore_advice(tmp_path):
    """Ctrl-C to `flowkit tune`: Ray Tune logged `Resume experiment with: Tuner.restore(...)`, which
    a flowkit user cannot follow; the sweep's own last line says how to continue a trial
    (test_stops: a SIGTERM to a sweep's process group)."""
    import logging

    from flowkit.tune import _stopping_on_signals
    seen = []
    handler = logging.Handler()
    handler.emit = seen.append
    log = logging.getLogger("ray.tune.tune")
    was = log.level, log.disabled  # (Ray, or a logging config of an earlier test, may have raised or disabled it)
    log.setLevel(logging.WARNING)
    log.disabled = False
    log.addHandler(handler)
    msg = ("Experiment has been interrupted, but the most recent state was saved.\n"
           'Resume experiment with: Tuner.restore(path="/x/tune", trainable=...)')
    try:
        with _stopping_on_signals(str(tmp_path)):
            log.warning(msg)
            log.warning("another warning")
        assert [r.getMessage() for r in seen] == ["another warning"]
        log.warning(msg)  # (other users of Ray Tune in the process keep it)
        assert [r.getMessage() for r in seen] == ["another warning", msg]
    finally:
        log.removeHandler(handler)
        log.setLevel(was[0])
        log.disabled = was[1]


@pytest.mark.parametrize("launcher", ["script", "-m flowkit", "-m flowkit.cli"])
def test_ctrl_c_while_the_command_imports_is_one_line(tmp_path, launcher):
    """Ctrl-C in the first 0.1-0.3 s of `flowkit train` was a KeyboardInterrupt traceback: the
    command imports the package (numpy, gymnasium) before flowkit.cli took the signals. The SIGINT
    comes here as the package starts importing flowkit.core (sitecustomize runs before the command)."""
    import signal
    import subprocess
    import sys
    (tmp_path / "sitecustomize.py").write_text(
        "import os, signal, sys\n"
        "class CtrlC:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'flowkit.core':\n"
        "            os.kill(os.getpid(), signal.SIGINT)\n"
        "sys.meta_path.insert(0, CtrlC())\n")
    cmd = ([os.path.join(os.path.dirname(sys.executable), "flowkit")] if launcher == "script" else
           [sys.executable, *launcher.split()])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))}
    p = subprocess.run(cmd + ["train", "--dry-run"], capture_output=True, text=True, timeout=120, env=env,
                       preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # (the suite may ignore it)
    assert (p.returncode, p.stderr) == (130, "flowkit: stopped: interrupted (SIGINT) while starting\n")
