"""Issue 14, parts 1-2: after training. A newcomer's flow (train CartPole briefly, `flowkit
evaluate` it, watch it on video, `flowkit export` it), exported modules against
``compute_actions(obs, explore=False)`` for each algorithm, and the commands' errors."""
import hashlib
import json
import os
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
from conftest import local_overrides

import flowkit
from flowkit.checkpoint import find_checkpoint
from flowkit.cli import main
from flowkit.evaluation import run_gym_episodes
from flowkit.export import export_policy, input_arrays, run_exported, sample_observations

SMALL = ["runtime.num_workers=1", "runtime.num_envs_per_worker=2", "runtime.rollout_fragment_length=32"]
PPO_SMALL = ["ppo.train_batch_size=64", "ppo.minibatch_size=32", "ppo.num_epochs=2"]


def _files(run_dir):
    """Every file of a run folder with its hash (what `flowkit evaluate` must not change)."""
    out = {}
    for root, _, names in os.walk(run_dir):
        for n in names:
            p = os.path.join(root, n)
            with open(p, "rb") as f:
                out[os.path.relpath(p, run_dir)] = hashlib.sha1(f.read()).hexdigest()
    return out


def _check_export(policy, tmp_path, tag):
    """Both formats give ``compute_actions(obs, explore=False)`` on 200 observations."""
    obs = sample_observations(policy.observation_space, 200)
    want = policy.compute_actions(obs, explore=False)
    for fmt in ("torchscript", "onnx"):
        path = str(tmp_path / f"{tag}.{fmt}")
        assert export_policy(policy, fmt, path)["checked"] == 256  # the file checked itself too
        got = run_exported(path, fmt, input_arrays(policy.observation_space, obs))
        assert got.shape == want.shape and got.dtype == want.dtype, (fmt, got.dtype, want.dtype)
        if np.issubdtype(want.dtype, np.floating):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=fmt)
        else:
            np.testing.assert_array_equal(got, want, err_msg=fmt)
    return want


# ---- the newcomer flow -----------------------------------------------------------------------------
@pytest.mark.slow
def test_train_evaluate_watch_export_cartpole(run_dir, tmp_path, capsys):
    res = flowkit.train(local_overrides(run_dir, "algo=ppo", "env=CartPole-v1", *SMALL, "stop.env_steps=2048",
                                        "ppo.train_batch_size=256", "ppo.minibatch_size=64"))
    before = _files(run_dir)

    # evaluate: the reported mean is a plain loop over compute_actions(explore=False), episode i seeded 7 + i
    assert main(["evaluate", run_dir, "episodes=5", "seed=7"]) == 0
    out = capsys.readouterr().out
    assert "5 episodes, greedy, seed 7" in out and "return_mean" in out
    assert main(["evaluate", run_dir, "opponents.default=random"]) == 2
    assert "opponents apply to multi-agent runs" in capsys.readouterr().err
    ck = res.checkpoint
    with open(os.path.join(ck, "evaluation.json")) as f:
        report = json.load(f)
    policy = flowkit.Algorithm.from_checkpoint(run_dir).get_policy()
    env = gym.make("CartPole-v1")
    rets, lens = [], []
    for i in range(5):
        obs, _ = env.reset(seed=7 + i)
        ret, n, done = 0.0, 0, False
        while not done:
            obs, r, term, trunc, _ = env.step(policy.compute_actions(obs, explore=False))
            ret, n, done = ret + r, n + 1, term or trunc
        rets.append(ret)
        lens.append(n)
    assert report["returns"] == rets and report["lengths"] == lens and report["seeds"] == [7, 8, 9, 10, 11]
    assert report["episode_return_mean"] == pytest.approx(np.mean(rets), rel=1e-12)
    assert report["episode_return_std"] == pytest.approx(np.std(rets), rel=1e-9)
    assert (report["episode_return_min"], report["episode_return_max"]) == (min(rets), max(rets))
    assert report["iteration"] == res.metrics["iteration"] and not report["explore"]

    # watch: an mp4 of the first episode whose frames read back (one per reset and per step)
    assert main(["evaluate", run_dir, "episodes=2", "seed=7", "render=mp4"]) == 0
    import imageio.v3 as iio
    video = os.path.join(ck, "videos", "episode_000.mp4")
    assert f"video: {video}" in capsys.readouterr().out
    frames = iio.imread(video)
    assert frames.ndim == 4 and frames.shape[0] == lens[0] + 1 and frames.shape[-1] == 3 and frames.std() > 0
    (ep,) = run_gym_episodes(policy, {"id": "CartPole-v1", "max_episode_steps": 6}, 1, seed=7, render="gif",
                             video_dir=str(tmp_path))  # a gif, of a short episode (pillow is slow)
    assert ep["length"] == 6 and 2 <= len(iio.imread(ep["video"])) <= 7  # pillow merges identical frames

    # export: both formats act as the policy does
    for fmt, ext in (("torchscript", "pt"), ("onnx", "onnx")):
        out_path = str(tmp_path / "new" / "dir" / f"cartpole.{ext}")
        assert main(["export", run_dir, f"format={fmt}", f"out={out_path}"]) == 0
        said = capsys.readouterr().out
        assert f"wrote {out_path} ({fmt}, policy 'default'): (obs: float32[B, 4]) -> action: int64[B]" in said
        assert (f"; created the folder {tmp_path / 'new'}\n" in said) == (fmt == "torchscript")  # once
        obs = sample_observations(policy.observation_space, 200)
        np.testing.assert_array_equal(run_exported(out_path, fmt, input_arrays(policy.observation_space, obs)),
                                      policy.compute_actions(obs, explore=False))

    # the run itself was neither locked nor changed: only the evaluation's own files were added
    after = _files(run_dir)
    added = set(after) - set(before)
    assert {k: after[k] for k in before} == before and not os.path.exists(os.path.join(run_dir, ".lock"))
    assert all(k.startswith(os.path.relpath(ck, run_dir)) for k in added), added


# ---- exported modules against compute_actions ------------------------------------------------------
EXPORT_RUNS = {  # every algorithm `flowkit plugins` lists (test_every_listed_algorithm_has_an_export_case)
    "ppo-discrete": ["algo=ppo", "env=CartPole-v1", *PPO_SMALL],
    "ppo-box": ["algo=ppo", "env=Pendulum-v1", "ppo.normalize_observations=true", *PPO_SMALL],
    "dqn-discrete": ["algo=dqn", "env=CartPole-v1", "dqn.learning_starts=32", "dqn.train_batch_size=16"],
    "dqn-dict-mask": ["algo=dqn", "env.factory=dqn_envs:masked_two_state", "dqn.learning_starts=32",
                      "dqn.train_batch_size=8", "model.hidden_sizes=[8]"],
    "impala-discrete": ["algo=impala", "env=CartPole-v1", "impala.rollout_mode=bulk_sync",
                        "impala.train_batch_size=64"],
    "appo-discrete": ["algo=appo", "env=CartPole-v1", "appo.rollout_mode=bulk_sync", "appo.train_batch_size=64"],
    "a2c-discrete": ["algo=a2c", "env=CartPole-v1"],
    "a3c-discrete": ["algo=a3c", "env=CartPole-v1"],
    # issue 27 item 2: SAC and TD3 exported their whole model (no forward: NotImplementedError)
    "sac-box": ["algo=sac", "env=Pendulum-v1", "sac.learning_starts=32", "sac.train_batch_size=16"],
    "sac-gsde": ["algo=sac", "env=Pendulum-v1", "sac.learning_starts=32", "sac.train_batch_size=16",
                 "sac.use_sde=true"],
    "td3-box": ["algo=td3", "env=Pendulum-v1", "td3.learning_starts=32", "td3.train_batch_size=16"],
    "sac-normobs": ["algo=sac", "env=Pendulum-v1", "sac.learning_starts=32", "sac.train_batch_size=16",
                    "model.normalize_obs=true"],  # the statistics inside the exported actor
    "dqn-normobs": ["algo=dqn", "env=CartPole-v1", "dqn.learning_starts=32", "dqn.train_batch_size=16",
                    "model.normalize_obs=true"],  # the statistics in front of the exported Q-network
    "ddppo-discrete": ["algo=ddppo", "env=CartPole-v1", "ddppo.fragments_per_round=1"],
    "maml-box": ["algo=maml", "env=flowkit.testing.envs:PointGoal-v0", "env.kwargs.horizon=16", "maml.outer_steps=1"],
    "random": ["algo=random", "env=CartPole-v1"],  # no network: refused in one line
}


def test_every_listed_algorithm_has_an_export_case():
    p = subprocess.run([sys.executable, "-m", "flowkit.cli", "plugins"], capture_output=True, text=True, timeout=120)
    listed = {line.split()[1].rstrip(":") for line in p.stdout.splitlines() if line.startswith("  algorithm ")}
    assert {"ppo", "dqn", "sac", "td3", "random"} <= listed, p.stdout
    covered = {a.split("=", 1)[1] for run in EXPORT_RUNS.values() for a in run if a.startswith("algo=")}
    covered |= {"es", "ars", "bc", "marwil", "cql_dqn", "cql_sac",  # exported in test_es.py and test_offline.py (need datasets)
                "r2d2",  # test_r2d2.py: its recurrent Q-network exported with the state as an input and an output
                # multi-agent games (an agent's own observation in, its action out): test_ctde.py (mappo),
                # test_centralized_critics.py (masac, matd3), test_value_decomposition.py (vdn, qmix)
                "mappo", "masac", "matd3", "vdn", "qmix"}
    assert listed <= covered, f"no export case for {sorted(listed - covered)}"


@pytest.mark.parametrize("name", list(EXPORT_RUNS))
@pytest.mark.slow
def test_export_matches_compute_actions(name, run_dir, tmp_path, capsys, monkeypatch):
    flowkit.train(local_overrides(run_dir, *SMALL, *EXPORT_RUNS[name], "stop.env_steps=128"))
    policy = flowkit.Algorithm.from_checkpoint(run_dir, trust_config=True).get_policy()  # dqn_envs: the tests' own factory
    if name == "random":
        capsys.readouterr()
        assert main(["export", run_dir, "format=onnx", f"out={tmp_path / 'new' / 'r.onnx'}"]) == 2
        err = capsys.readouterr().err.strip()
        assert err == "flowkit export: error: policy 'default': a RandomPolicy has no network to export"
        assert not os.path.exists(tmp_path / "new")
        return
    if name.startswith(("sac", "td3")):  # the greedy action is not the uniform one of the first steps
        assert policy.num_updates > 0
    if name in ("ppo-box", "sac-normobs"):  # the observation normalisation is part of the module, not the identity
        assert policy.model.obs_rms is not None and float(policy.model.obs_rms.count) > 1
    acts = _check_export(policy, tmp_path, name)
    if name == "ppo-discrete":  # a policy that acts otherwise than its network says: refused, no file left
        policy.compute_actions = lambda obs, explore=False: np.zeros(len(obs), np.int64)
        with pytest.raises(ValueError, match=r"differ from compute_actions\(obs, explore=False\) on \d+ of 256"):
            export_policy(policy, "onnx", str(tmp_path / "odd.onnx"))
        assert not os.path.exists(tmp_path / "odd.onnx")
    if name == "dqn-dict-mask":  # masks respected: where only action 0 is legal, 0 is chosen
        obs = sample_observations(policy.observation_space, 200)
        only0 = (obs["action_mask"][:, 0] == 1) & (obs["action_mask"][:, 1] == 0)
        assert only0.any() and (acts[only0] == 0).all()
    if name == "td3-box":  # through the CLI: every failure is one line, exit 2, and leaves no file behind
        _check_cli_export_failures(run_dir, tmp_path, capsys, monkeypatch)


def _check_cli_export_failures(run_dir, tmp_path, capsys, monkeypatch):
    import torch
    from flowkit_sac.td3 import TD3Policy
    capsys.readouterr()
    keep = tmp_path / "keep.pt"
    keep.write_bytes(b"an earlier export")

    def broken_save(module, path, **kwargs):  # a disk that fills up half way
        with open(path, "wb") as f:
            f.write(b"partial")
        raise OSError(28, "No space left on device\nsecond line")
    with monkeypatch.context() as m:
        m.setattr(torch.jit, "save", broken_save)
        for out in (tmp_path / "new" / "dir" / "p.pt", keep):
            assert main(["export", run_dir, "format=torchscript", f"out={out}"]) == 2
            err = capsys.readouterr().err.strip()
            assert err == ("flowkit export: error: policy 'default': cannot write it as torchscript: OSError: "
                           "[Errno 28] No space left on device"), err
    with monkeypatch.context() as m:  # a policy whose acting is not its actor's: the check refuses the file
        m.setattr(TD3Policy, "compute_actions_encoded",
                  lambda self, obs, mask=None, explore=True: (np.zeros((len(obs), 1), np.float32), {}))
        out = tmp_path / "odd.onnx"
        assert main(["export", run_dir, "format=onnx", f"out={out}"]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "differ from compute_actions" in err and f"{out} not kept" in err
    assert not os.path.exists(tmp_path / "new") and keep.read_bytes() == b"an earlier export"
    assert sorted(os.listdir(tmp_path)) == ["keep.pt", "run"] + sorted(f"td3-box.{f}" for f in ("onnx", "torchscript"))


@pytest.mark.slow
def test_export_one_policy_of_a_multiagent_run_and_evaluate_its_games(run_dir, tmp_path, capsys):
    flowkit.train(local_overrides(run_dir, "env.factory=pettingzoo.classic.tictactoe_v3:env", "runtime.num_workers=1",
                                  "runtime.num_envs_per_worker=4", "runtime.rollout_fragment_length=16",
                                  "stop.iterations=1", "multiagent.policies.learner.algo=ppo",
                                  "multiagent.policies.opponent.algo=random", "multiagent.mapping.player_1=learner",
                                  "multiagent.mapping.player_2=opponent", "multiagent.eval_opponents.opponent=random",
                                  "multiagent.eval_alternate_seats=true", *PPO_SMALL))
    algo = flowkit.Algorithm.from_checkpoint(run_dir)
    _check_export(algo.get_policy("learner"), tmp_path, "tictactoe")  # Dict obs with action_mask
    assert main(["export", run_dir, "format=onnx"]) == 2
    assert capsys.readouterr().err == ("flowkit export: error: the run has several policies (learner, opponent): "
                                       "name one with policy=ID\n")
    assert main(["export", run_dir, "format=onnx", "policy=opponent"]) == 2  # the random one
    assert "no network to export" in capsys.readouterr().err

    assert main(["evaluate", run_dir, "episodes=6", "seed=3"]) == 0
    out = capsys.readouterr().out
    assert "policy/learner" in out and "win_rate" in out
    with open(os.path.join(find_checkpoint(run_dir), "evaluation.json")) as f:
        rep = json.load(f)
    learner = rep["policies"]["learner"]
    assert rep["episodes"] == 6 and learner["win_rate"] + learner["draw_rate"] + learner["loss_rate"] == pytest.approx(1)
    assert main(["evaluate", run_dir, "episodes=6", "seed=3"]) == 0  # reproducible by seed
    with open(os.path.join(find_checkpoint(run_dir), "evaluation.json")) as f:
        assert json.load(f)["returns"] == rep["returns"]
    # a random stand-in for the learner: it is reported as the opponent, not as the learner's score
    capsys.readouterr()
    assert main(["evaluate", run_dir, "episodes=6", "seed=3", "opponents.learner=random"]) == 0
    with open(os.path.join(find_checkpoint(run_dir), "evaluation.json")) as f:
        swapped = json.load(f)
    assert swapped["opponents"] == {"learner": "random"} and "learner" not in swapped["policies"]
    assert (swapped["lengths"], swapped["policies"]["opponent"]) != (rep["lengths"], rep["policies"]["opponent"])
    assert main(["evaluate", run_dir, "opponents.learnr=random"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "opponents.learnr: no policy 'learnr'" in err


# ---- errors: one line, exit 2, torch not imported for what needs no checkpoint ---------------------
CHECK = ("import json, sys\nfrom flowkit.cli import main\nrc = main(sys.argv[1:])\n"
         "print('\\nMODULES ' + json.dumps({'rc': rc, 'torch': 'torch' in sys.modules}))")


@pytest.mark.parametrize("args,rc,text", [
    (["evaluate", "--help"], 0, "render_episodes"),
    (["export", "--help"], 0, "torchscript|onnx"),
    (["evaluate", "/no/such/run"], 2, "no checkpoint at '/no/such/run'"),
    (["evaluate", ".", "episods=3"], 2, "did you mean `episodes`"),
    (["evaluate", ".", "render=avi"], 2, "render='avi' must be 'mp4' or 'gif'"),
    # issue 28 rerun: these ran for the whole timeout (1e9 episodes) or built 10^5 envs
    (["evaluate", ".", "episodes=1e9"], 2, "episodes=1000000000 must be in [1, 100000]"),
    (["evaluate", ".", "num_envs=1e5"], 2, "num_envs=100000 must be in [1, 4096]"),
    (["export", "/no/such/run", "format=onnx"], 2, "no checkpoint at"),
    (["export", ".", "format=tflite"], 2, "format='tflite' must be 'torchscript' or 'onnx'"),
    (["export", "."], 2, "format= is required (format=torchscript or format=onnx)"),
    (["export", ".", "--format", "onnx"], 2, "unrecognised option --format: settings are key=value words, not "
                                             "--options; write format=onnx"),
    (["export", ".", "--formt", "onnx"], 2, "write format=onnx"),
    (["plot", ".", "--out", "p.png"], 2, "write out=p.png"),
    (["tune", "--num-samples", "4", "seed=range(2)"], 2, "write num_samples=4")])
def test_cli_errors_are_one_line_without_torch(args, rc, text):
    p = subprocess.run([sys.executable, "-c", CHECK, *args], capture_output=True, text=True, timeout=120)
    out = json.loads(p.stdout.rsplit("MODULES ", 1)[1])
    assert out == {"rc": rc, "torch": False}, p.stderr[-2000:]
    assert text in p.stdout + p.stderr
    if rc == 2:
        assert len(p.stderr.strip().splitlines()) == 1 and "Traceback" not in p.stderr


def test_a_folder_without_checkpoint_is_one_line(tmp_path, capsys):
    assert main(["evaluate", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no checkpoint at" in err
    # issue 27 item 3: export gave a FileNotFoundError traceback, exit 1
    assert main(["export", str(tmp_path), "format=onnx"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"flowkit export: error: no checkpoint at '{tmp_path}'") and len(err.splitlines()) == 1
    assert os.listdir(tmp_path) == []


def test_the_report_averages_what_the_env_runner_reports_for_each_policy():
    """Issue 49: evaluation.py knows no win rate; a runner's episode summaries carry
    ``eval_metrics`` (``<policy>/<name>``: the multiagent plugin's win/draw/loss, or any other
    plugin's figure) and the report averages them per policy, over the episodes that have them;
    a policy played by a stand-in (``opponents``) is left out."""
    from types import SimpleNamespace

    from omegaconf import OmegaConf

    from flowkit.evaluation import _report, format_table
    eps = [{"return": 1.0, "length": 5, "policy_returns": {"a": {"p0": 1.0}, "b": {"p1": 0.0}, "c": {"p2": 3.0}},
            "eval_metrics": {"a/win_rate": 1.0, "a/loss_rate": 0.0, "b/captures": 2.0}},
           {"return": 2.0, "length": 7, "policy_returns": {"a": {"p0": -1.0}, "b": {"p1": 3.0}, "c": {"p2": 3.0}},
            "eval_metrics": {"a/win_rate": 0.0, "a/loss_rate": 1.0, "c/win_rate": 1.0}}]
    algo = SimpleNamespace(run_config=OmegaConf.create({"algo": "ppo", "env": {"id": None, "factory": "m:env"}}),
                           checkpoint_state={"iteration": 4}, policies={"a": None, "b": None, "c": None, "d": None})
    rep = _report(algo, "ck", eps, False, 7, False, {"c": "random"})
    assert rep["policies"] == {
        "a": {"episode_return_mean": 0.0, "episode_return_std": 1.0, "episode_return_min": -1.0,
              "episode_return_max": 1.0, "episode_len_mean": 6.0, "episode_len_std": 1.0, "episode_len_min": 5.0,
              "episode_len_max": 7.0, "win_rate": 0.5, "loss_rate": 0.5},
        "b": {"episode_return_mean": 1.5, "episode_return_std": 1.5, "episode_return_min": 0.0,
              "episode_return_max": 3.0, "episode_len_mean": 6.0, "episode_len_std": 1.0, "episode_len_min": 5.0,
              "episode_len_max": 7.0, "captures": 2.0}}  # c: the stand-in's; d: no agent played it
    assert (rep["env"], rep["iteration"], rep["opponents"], rep["returns"]) == ("m:env", 4, {"c": "random"}, [1.0, 2.0])
    head, _, row_a, row_b = format_table(rep).splitlines()[1:]
    assert head.split()[-3:] == ["win_rate", "loss_rate", "captures"]
    assert row_a.split()[-2:] == ["0.5", "0.5"] and row_b.split()[-1] == "2"


def test_the_evaluation_table_keeps_six_significant_digits():
    """A newcomer's find: a 26,997-step Breakout game read `2.7e+04`; MuJoCo returns above
    10,000 would have lost their last digits the same way."""
    from flowkit.evaluation import format_table
    rep = {"algo": "dqn", "env": "BreakoutNoFrameskip-v4", "checkpoint": "c", "iteration": 1, "episodes": 1,
           "explore": False, "seed": 0, "episode_return_mean": 12345.67, "episode_return_std": 0.0,
           "episode_return_min": -2.07712, "episode_return_max": 12345.67, "episode_len_mean": 26997.0,
           "episode_len_std": 0.0, "episode_len_min": 26997, "episode_len_max": 26997}
    row = format_table(rep).splitlines()[-1].split()
    assert row == ["episode", "1", "12345.7", "0", "-2.07712", "12345.7", "26997", "0", "26997", "26997"]


@pytest.mark.parametrize("fmt", ["mp4", "gif"])
def test_an_interrupted_evaluation_leaves_no_partial_video(tmp_path, fmt):
    """A newcomer's find (issue 48, item 12): Ctrl-C during `flowkit evaluate ... render=mp4` left
    the partial video under its final name. Frames go to a temporary file, renamed when the
    episode ends; an interrupted one is removed."""
    from flowkit.core.policy import RandomPolicy
    env = gym.make("CartPole-v1")
    policy = RandomPolicy(env.observation_space, env.action_space, None, seed=0)
    with pytest.raises(KeyboardInterrupt):
        run_gym_episodes(policy, {"factory": "envs:interrupted_cartpole", "kwargs": {"at": 5}}, 1, seed=0,
                         render=fmt, video_dir=str(tmp_path))
    assert os.listdir(tmp_path) == []
    (ep,) = run_gym_episodes(policy, {"factory": "envs:interrupted_cartpole", "kwargs": {"at": 10_000}}, 1, seed=0,
                             render=fmt, video_dir=str(tmp_path))
    assert os.listdir(tmp_path) == [f"episode_000.{fmt}"] and ep["video"] == str(tmp_path / f"episode_000.{fmt}")
