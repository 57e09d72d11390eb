"""Issue 28: evaluation obeys stops and deadlines, signals from the first moment of the CLI,
output paths checked before work starts, Ray start-ups that end."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

import flowkit
from flowkit.checkpoint import load_state
from flowkit.engine import find_checkpoint, read_metrics

HERE = os.path.dirname(os.path.abspath(__file__))
TINY = ["runtime.backend=local", "runtime.num_workers=1", "runtime.num_envs_per_worker=1",
        "runtime.rollout_fragment_length=8", "ppo.minibatch_size=8", "ppo.num_epochs=1",
        "run.reporters=[csv,checkpoint,evaluation]", "evaluation.episodes=2"]
FLOWKIT = [sys.executable, "-m", "flowkit.cli"]
_CHILDREN: list = []


def _env():
    return dict(os.environ, PYTHONUNBUFFERED="1",
                PYTHONPATH=os.pathsep.join([HERE, os.path.dirname(HERE), os.environ.get("PYTHONPATH", "")]))


def _popen(args):
    """``flowkit ARGS`` in a child with SIGINT/SIGHUP at their defaults, killed after the test."""
    def defaults():
        for s in (signal.SIGINT, signal.SIGHUP):
            signal.signal(s, signal.SIG_DFL)
    proc = subprocess.Popen(FLOWKIT + list(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_env(), preexec_fn=defaults)
    _CHILDREN.append(proc)
    return proc


@pytest.fixture(autouse=True)
def _kill_children():
    yield
    while _CHILDREN:
        p = _CHILDREN.pop()
        if p.poll() is None:
            p.kill()
            p.communicate()


def _wait_for(path, proc=None, timeout=60.0):
    end = time.time() + timeout
    while not os.path.exists(path):
        assert time.time() < end and (proc is None or proc.poll() is None), (
            proc.communicate()[1] if proc is not None and proc.poll() is not None else "timed out")
        time.sleep(0.05)


def _resumes(run_dir, iteration):
    res = flowkit.train([f"resume={run_dir}", f"stop.iterations={iteration + 1}", "evaluation.interval=0",
                         "evaluation.final=false"], verbose=False)
    assert res.metrics["iteration"] == iteration + 1


# ---- evaluation obeys stops and deadlines --------------------------------------------------------
@pytest.mark.parametrize("sig,code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_during_a_stuck_evaluation_keeps_a_resumable_run(tmp_path, sig, code):
    """The periodic evaluation of iteration 2 hangs in env.step (60 s): the signal ends it, the
    final checkpoint holds iteration 1 (before: the signal was held until the evaluation ended)."""
    run_dir, marker = str(tmp_path / "run"), tmp_path / "stuck"
    proc = _popen(["train", *TINY, f"run.dir={run_dir}", "env.factory=envs:stuck_eval",
                   f"env.kwargs={{marker: '{marker}'}}", "evaluation.interval=2", "evaluation.final=true",
                   "stop.iterations=100"])
    _wait_for(marker, proc)
    t0 = time.time()
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == code and time.time() - t0 < 15, err
    assert "Traceback" not in err and f"stopped: interrupted ({sig.name})" in out
    summary = json.load(open(os.path.join(run_dir, "result.json")))
    assert summary["stop_reason"] == f"interrupted ({sig.name})" and summary["iteration"] == 1
    assert summary["final_evaluation_error"] == f"not run: interrupted ({sig.name})"
    assert [r["iteration"] for r in read_metrics(os.path.join(run_dir, "metrics.csv"))] == [1]
    assert load_state(find_checkpoint(run_dir))["iteration"] == 1
    _resumes(run_dir, 1)


def test_stop_time_s_ends_a_stuck_periodic_evaluation(run_dir):
    t0 = time.perf_counter()
    res = flowkit.train(TINY + [f"run.dir={run_dir}", "env.factory=envs:stuck_eval", "evaluation.interval=2",
                                "stop.time_s=3", "stop.iterations=100"], verbose=False)
    assert time.perf_counter() - t0 < 25
    assert res.stop_reason == "stop.time_s=3.0 reached (iteration abandoned)" and res.metrics["iteration"] == 1
    assert load_state(find_checkpoint(run_dir))["iteration"] == 1
    _resumes(run_dir, 1)


@pytest.mark.parametrize("mode", ["sleep", "endless"])
def test_a_stuck_evaluation_is_abandoned_after_its_deadline_and_the_final_checkpoint_comes_first(run_dir, mode):
    """Periodic (iteration 2) and final evaluation stuck (a step that sleeps, an episode that never
    ends): each is abandoned after evaluation.timeout_s with a warning, the run ends normally with
    its checkpoint (before: the run hung, and the final checkpoint came after the final evaluation)."""
    t0 = time.perf_counter()
    with pytest.warns(UserWarning, match=r"evaluation \(2 episodes\) did not finish within evaluation.timeout_s=1 s"):
        res = flowkit.train(TINY + [f"run.dir={run_dir}", "env.factory=envs:stuck_eval", f"env.kwargs={{mode: {mode}}}",
                                    "evaluation.interval=2", "evaluation.final=true", "evaluation.timeout_s=1",
                                    "stop.iterations=3"], verbose=False)
    assert time.perf_counter() - t0 < 25
    assert res.stop_reason == "stop.iterations=3 reached" and res.metrics["iteration"] == 3
    assert "evaluation_return_mean" not in res.metrics and "final_evaluation" not in res.metrics
    assert "did not finish within evaluation.timeout_s=1 s" in res.metrics["final_evaluation_error"]
    assert [r["iteration"] for r in res.history] == [1, 2, 3]
    assert not any("evaluation_return_mean" in r for r in res.history)
    assert load_state(find_checkpoint(run_dir))["iteration"] == 3
    assert json.load(open(os.path.join(run_dir, "result.json")))["iteration"] == 3


def test_the_evaluation_deadline_defaults_to_sample_timeout_s_and_a_good_evaluation_is_unchanged(run_dir):
    with pytest.warns(UserWarning, match="within runtime.sample_timeout_s=1 s"):
        res = flowkit.train(TINY + [f"run.dir={run_dir}", "env.factory=envs:stuck_eval", "evaluation.final=true",
                                    "runtime.sample_timeout_s=1", "stop.iterations=1"], verbose=False)
    assert "final_evaluation_error" in res.metrics
    res = flowkit.train(TINY + [f"run.dir={run_dir}-ok", "env.factory=envs:FixedLenEnv", "evaluation.final=true",
                                "evaluation.interval=1", "runtime.sample_timeout_s=1", "stop.iterations=2"], verbose=False)
    assert res.metrics["final_evaluation"] is True and res.metrics["evaluation_return_mean"] == 3.0
    assert all(r["evaluation_return_mean"] == 3.0 for r in res.history)


# ---- signals from the first moment of the CLI ----------------------------------------------------
@pytest.mark.parametrize("launcher", ["module", "script"])
@pytest.mark.parametrize("delay", [0.3, 0.5, 1.0])
def test_a_sigterm_early_in_start_up_exits_143_with_a_message(tmp_path, launcher, delay):
    """Before: the default action (-15, nothing said) up to ~0.25 s in (the CLI took the signals
    only once main() ran), then 143 with nothing said."""
    script = os.path.join(os.path.dirname(sys.executable), "flowkit")
    cmd = FLOWKIT if launcher == "module" else [script]
    proc = subprocess.Popen(cmd + ["train", "env=CartPole-v1", "runtime.backend=local", f"run.dir={tmp_path / 'run'}",
                                   "stop.iterations=1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_env())
    _CHILDREN.append(proc)
    time.sleep(delay)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, (proc.returncode, err)
    assert "interrupted (SIGTERM)" in out + err and "Traceback" not in err, err


# ---- flowkit evaluate: a deadline, and an env that ends the process ------------------------------
@pytest.fixture(scope="module")
def stuck_eval_run(tmp_path_factory):
    """A trained run whose env gets stuck in evaluation as STUCK_EVAL says (see envs.stuck_eval)."""
    run_dir = str(tmp_path_factory.mktemp("stuck_eval") / "run")
    flowkit.train(TINY + [f"run.dir={run_dir}", "env.factory=envs:stuck_eval", "env.kwargs={mode: from_env}",
                          "stop.iterations=1", "runtime.sample_timeout_s=600"], verbose=False)
    return run_dir


@pytest.mark.parametrize("mode,args,message", [
    ("sleep", ["timeout_s=2"], "did not finish within timeout_s=2 s: a stuck env"),
    ("endless", ["timeout_s=2"], "did not finish within timeout_s=2 s: a stuck env"),
    ("exit", [], "env 'envs:stuck_eval' ended the process (os._exit(3)) during the evaluation"),
    ("sys.exit", [], "env 'envs:stuck_eval' tried to end the process (sys.exit(3)) during the evaluation"),
])
def test_evaluate_bounds_a_stuck_env_and_names_an_env_that_exits(stuck_eval_run, mode, args, message):
    """Before: a stuck env or an endless episode hung `flowkit evaluate` without bound (the
    run's 600 s deadline did not apply), and an env's os._exit(3) / sys.exit(3) ended it with
    exit 3 and nothing said."""
    ev = os.path.join(find_checkpoint(stuck_eval_run), "evaluation.json")
    if os.path.exists(ev):
        os.remove(ev)
    t0 = time.time()
    proc = subprocess.run(FLOWKIT + ["evaluate", stuck_eval_run, "episodes=2", *args], capture_output=True,
                          text=True, env=dict(_env(), STUCK_EVAL=mode), timeout=60)
    assert proc.returncode == 1 and time.time() - t0 < 30, (proc.returncode, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and lines[0].startswith("flowkit evaluate: error: "), proc.stderr
    assert not os.path.exists(ev)


def test_evaluate_with_a_deadline_that_is_not_reached_is_unchanged(stuck_eval_run):
    from flowkit.cli import main
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("STUCK_EVAL", "none")
        assert main(["evaluate", stuck_eval_run, "episodes=2", "timeout_s=30"]) == 0
    rep = json.load(open(os.path.join(find_checkpoint(stuck_eval_run), "evaluation.json")))
    assert rep["returns"] == [3.0, 3.0]
