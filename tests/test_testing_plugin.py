"""Issue 11, parts 1 and 5: flowkit.testing as a pytest plugin (fixtures, no torch or Ray until
used), its tiny envs, and flowkit.train's printed summary."""
import os
import signal
import subprocess
import sys
import tomllib

import numpy as np
import pytest

import flowkit
from flowkit.engine import NO_STOP
from flowkit.testing import local_overrides

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_flowkit_declares_its_pytest_plugin():
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        eps = tomllib.load(f)["project"]["entry-points"]["pytest11"]
    assert eps == {"flowkit.testing": "flowkit.testing"}


@pytest.mark.slow
def test_the_fixtures_load_without_torch_or_ray(tmp_path):
    (tmp_path / "test_user.py").write_text(
        "import sys\n"
        "def test_tiny_envs(discrete_env, box_env, masked_env, run_dir):\n"
        "    for e in (discrete_env, box_env, masked_env):\n"
        "        env = e.make()\n"
        "        obs, _ = env.reset(seed=0)\n"
        "        assert env.observation_space.contains(obs)\n"
        "    assert 'torch' not in sys.modules and 'ray' not in sys.modules\n")
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "flowkit.testing",
                        str(tmp_path / "test_user.py")], capture_output=True, text=True, timeout=300, cwd=str(tmp_path))
    assert p.returncode == 0 and "1 passed" in p.stdout, p.stdout[-3000:]


@pytest.mark.parametrize("fixture", ["discrete_env", "box_env", "masked_env"])
def test_tiny_envs_are_deterministic_and_solvable(fixture, request):
    tiny = request.getfixturevalue(fixture)

    def play(seed):
        env, out = tiny.make(), []
        obs, _ = env.reset(seed=seed)
        done = False
        while not done:
            x = obs["observation"] if isinstance(obs, dict) else obs
            a = np.asarray(x, np.float32) if fixture == "box_env" else int(x)  # the best action
            obs, r, term, trunc, _ = env.step(a)
            out.append(r)
            done = term or trunc
        return out
    assert play(3) == play(3) and sum(play(3)) >= tiny.solved


def test_turn_game_follows_the_aec_api(turn_game):
    from pettingzoo.test import api_test
    api_test(turn_game.make(), num_cycles=20)


def test_hook_recorder_fixture(hook_recorder, run_dir):
    flowkit.train(local_overrides(run_dir, "env.factory=flowkit.testing.envs:match", "stop.iterations=1",
                                  "runtime.num_workers=1", "runtime.rollout_fragment_length=8"), verbose=False)
    names = hook_recorder.names()
    assert names.index("flowkit_on_run_start") < names.index("flowkit_report") < names.index("flowkit_on_run_end")
    assert "flowkit_on_episode_end" in names  # a worker's hook: seen on the local backend


class _StopAfter:
    def __init__(self, how):
        self.how = how

    def flowkit_on_train_result(self, result, ctx):
        if result["iteration"] == 2:
            if self.how == "signal":
                os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C
            else:
                ctx.request_stop("enough")


@pytest.mark.parametrize("how,reason", [("request", "enough"), ("signal", "interrupted (SIGINT)")])
def test_train_prints_the_summary_and_says_when_nothing_stops_it(how, reason, run_dir, capsys, monkeypatch):
    # a process whose SIGINT is ignored from the start keeps it ignored (flowkit._guard.INHERITED_IGNORED);
    # in the whole suite an earlier test may have left it so when the guard was first imported
    monkeypatch.setattr("flowkit._guard.INHERITED_IGNORED", frozenset())
    signal.signal(signal.SIGINT, signal.default_int_handler)
    res = flowkit.train(local_overrides(run_dir, "env.factory=flowkit.testing.envs:match", "runtime.num_workers=1",
                                        "runtime.rollout_fragment_length=8"), plugins=[_StopAfter(how)])
    out = capsys.readouterr().out.splitlines()
    assert out[0] == NO_STOP and res.stop_reason == reason
    tail = [f"resume: flowkit train resume={run_dir}"] if how == "signal" else []  # how to go on after Ctrl-C
    n = 4 + len(tail)
    assert out[-n:] == [f"run folder: {run_dir}", f"stopped: {reason}", out[-n + 2], f"checkpoint: {res.checkpoint}",
                        *tail]
    assert out[-n + 2].startswith("  iteration=2  env_steps_sampled=")
    flowkit.train(local_overrides(run_dir + "2", "env.factory=flowkit.testing.envs:match", "stop.iterations=1",
                                  "runtime.num_workers=1", "run.reporters=[progress,csv]"), verbose=False)
    quiet = capsys.readouterr()
    assert quiet.out == "" and "step" not in quiet.err  # no summary, no progress bar
